//! An ACL value (`system.posix_acl_*`, set by any file's owner over the wire) from
//! arbitrary bytes: decoding never panics, and an ACL that decodes encodes back to
//! itself and stays valid after renumbering its ids.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meta::acl::Acl;

fuzz_target!(|data: &[u8]| {
    if let Ok(acl) = Acl::decode(data) {
        assert_eq!(Acl::decode(&acl.encode()).ok().as_ref(), Some(&acl));
        let mut renumbered = acl.clone();
        if renumbered.map_ids(|u| Ok(u.wrapping_mul(7)), |g| Ok(g ^ 1)).is_ok() {
            assert!(Acl::decode(&renumbered.encode()).is_ok());
        }
    }
});
