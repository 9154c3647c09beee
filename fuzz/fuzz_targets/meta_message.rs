//! Every message meta reads or a client reads from meta (postcard), from arbitrary
//! bytes: decoding returns an error, never panics or allocates from a length prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::decode;
use proto::meta::{MetaPush, MetaRequest, MetaResult, PushAnswer};

fuzz_target!(|data: &[u8]| {
    let _ = decode::<MetaRequest>(data);
    let _ = decode::<MetaResult>(data);
    let _ = decode::<MetaPush>(data);
    let _ = decode::<PushAnswer>(data);
});
