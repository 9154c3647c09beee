//! Every message a node reads or a client reads from a node (postcard), from
//! arbitrary bytes: decoding returns an error, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::frame::decode;
use proto::node::{NodeRequest, NodeResult};

fuzz_target!(|data: &[u8]| {
    let _ = decode::<NodeRequest>(data);
    let _ = decode::<NodeResult>(data);
});
