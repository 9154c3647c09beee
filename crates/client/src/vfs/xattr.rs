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
    /// to meta each time. So is a listing's word that an inode has none at all, for the
    /// names every caller may read (`security.`, `system.`, `trusted.`: meta answers
    /// those with absence whoever asks, so the answer here is the one meta would give);
    /// `user.` ones go to meta, which checks read permission first.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let absent = || VfsError::new(ErrorCode::NoAttribute, "no such extended attribute");
        let readable_by_all = [&b"security."[..], b"system.", b"trusted."].iter().any(|ns| name.starts_with(ns));
        if readable_by_all && self.is_bare(ino) {
            return Err(absent());
        }
        let key = (ino, name.to_vec());
        if lock(&self.absent_xattrs).get(&key).is_some_and(|until| *until > std::time::Instant::now()) {
            return Err(absent());
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
        lock(&self.bare_inodes).remove(&ino);
    }

    /// Whether a listing less than `attr_ttl` ago found `ino` without any extended
    /// attribute (and this client has set none since).
    fn is_bare(&self, ino: InodeId) -> bool {
        lock(&self.bare_inodes).get(&ino).is_some_and(|until| *until > std::time::Instant::now())
    }

    /// Remembers, for `attr_ttl`, the listed inodes that have no extended attribute.
    pub(super) fn remember_bare(&self, entries: &[DirEntry]) {
        let until = std::time::Instant::now() + self.config.attr_ttl;
        let mut bare = lock(&self.bare_inodes);
        if bare.len() > 100_000 {
            bare.clear();
        }
        bare.extend(entries.iter().filter(|e| !e.has_xattrs).map(|e| (e.attr.ino, until)));
    }

    pub async fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta.call(SetXattr { ino, name: name.to_vec(), value: value.to_vec(), mode }).await
    }

    /// The names of an inode's extended attributes: none, without asking meta, for an
    /// inode a listing found bare (`cp -a`, `rsync -X` and `tar --xattrs` ask of every file).
    pub async fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>> {
        if self.is_bare(ino) {
            return Ok(Vec::new());
        }
        self.meta.call(ListXattr { ino }).await
    }

    pub async fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta.call(RemoveXattr { ino, name: name.to_vec() }).await
    }
}
