//! Identity map files (a site's grid-mapfile) from arbitrary bytes: parsing never
//! panics, and a map that parses names no principal twice in one section.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(map) = meta::parse_map(Path::new("fuzz.map"), &text) {
        for section in [&map.users, &map.groups] {
            let mut seen = std::collections::HashSet::new();
            for entry in section.iter() {
                assert!(seen.insert(entry.principal.as_str()), "{} mapped twice", entry.principal);
            }
        }
    }
});
