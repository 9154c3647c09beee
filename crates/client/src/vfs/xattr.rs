//! Extended attributes, with absence remembered for the attribute TTL.

use super::{Result, Vfs};
use crate::error::VfsError;
use proto::error::ErrorCode;
use proto::meta::*;
use proto::types::*;
use util::sync::lock;

impl Vfs {
    /// An extended attribute. Absence is remembered for `attr_ttl`: the kernel asks for
    /// `security.capability` before every write, and that must not cost a round trip
    /// to meta each time.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let key = (ino, name.to_vec());
        if let Some(until) = lock(&self.absent_xattrs).get(&key)
            && *until > std::time::Instant::now()
        {
            return Err(VfsError::new(ErrorCode::NoAttribute, "no such extended attribute"));
        }
        match self.meta.call(GetXattr { ino, name: name.to_vec() }).await {
            Ok(b) => Ok(b),
            Err(e) if e.code == ErrorCode::NoAttribute => {
                let mut absent = lock(&self.absent_xattrs);
                if absent.len() > 100_000 {
                    absent.clear();
                }
                absent.insert(key, std::time::Instant::now() + self.config.attr_ttl);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn forget_absent_xattrs(&self, ino: InodeId) {
        lock(&self.absent_xattrs).retain(|(i, _), _| *i != ino);
    }

    pub async fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta.call(SetXattr { ino, name: name.to_vec(), value: value.to_vec(), mode }).await
    }

    pub async fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>> {
        self.meta.call(ListXattr { ino }).await
    }

    pub async fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta.call(RemoveXattr { ino, name: name.to_vec() }).await
    }
}
