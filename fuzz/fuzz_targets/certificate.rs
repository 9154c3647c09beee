//! What a peer's certificate proves, from arbitrary DER, and the role URI
//! (`locus:ROLE/SITE`) from arbitrary text: errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = net::PeerIdentity::from_der(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = net::parse_role_uri(text);
    }
});
