//! Frame headers from arbitrary bytes: decoding never panics, and a header that
//! decodes survives encoding and decoding again (reserved bytes are ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::{HEADER_LEN, Header};

fuzz_target!(|data: &[u8]| {
    if let Ok(head) = <[u8; HEADER_LEN]>::try_from(data.get(..HEADER_LEN).unwrap_or(&[])) {
        if let Ok(h) = Header::decode(&head) {
            let again = Header::decode(&h.encode()).expect("an encoded header decodes");
            assert_eq!(again, h);
        }
    }
});
