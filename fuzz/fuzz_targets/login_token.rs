//! A login file's text (`locus login` leaves it, the mount reads it) from arbitrary
//! bytes: decoding never panics, and a token that decodes encodes back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(token) = proto::cap::UserToken::from_text(&text) {
        assert_eq!(proto::cap::UserToken::from_text(&token.to_text()), Some(token));
    }
});
