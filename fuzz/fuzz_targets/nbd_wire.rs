//! What an NBD client sends before and during transmission (`locus nbd` reads it from
//! anyone who reaches its port): a request header and an INFO/GO option's data from
//! arbitrary bytes. Decoding never panics, and a request that decodes encodes back to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::wire::{InfoRequest, REQUEST_LEN, Request};

fuzz_target!(|data: &[u8]| {
    let _ = InfoRequest::decode(data);
    if let Ok(header) = <[u8; REQUEST_LEN]>::try_from(data.get(..REQUEST_LEN).unwrap_or_default())
        && let Ok(request) = Request::decode(&header)
    {
        assert_eq!(request.encode(), header);
    }
});
