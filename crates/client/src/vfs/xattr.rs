//! Extended attributes, with absence remembered for the attribute TTL.

use super::{Result, Vfs};
use crate::error::VfsError;
use proto::error::ErrorCode;
use proto::meta::*;
use proto::types::*;
use std::collections::HashMap;
use std::time::Instant;
use util::sync::lock;

/// What this client learned lately about an inode's extended attributes being absent,
/// each fact trusted until its instant (`attr_ttl` after it was learned) and all of
/// them dropped when this client sets or removes one of the inode's attributes.
#[derive(Default)]
pub(super) struct KnownAbsent {
    /// A listing found the inode without any extended attribute.
    bare_until: Option<Instant>,
    /// Names meta answered with absence.
    names: HashMap<Vec<u8>, Instant>,
}

impl KnownAbsent {
    /// Whether a listing less than `attr_ttl` before `now` found the inode bare.
    fn bare(&self, now: Instant) -> bool {
        self.bare_until.is_some_and(|until| until > now)
    }

    /// Whether `name` is known absent at `now`: meta said so, or a listing found the
    /// inode bare and meta answers this name to every caller.
    fn absent(&self, name: &[u8], now: Instant) -> bool {
        (xattr_readable_by_all(name) && self.bare(now)) || self.names.get(name).is_some_and(|until| *until > now)
    }
}

impl Vfs {
    /// An extended attribute. Absence is remembered for `attr_ttl`: the kernel asks for
    /// `security.capability` before every write, and that must not cost a round trip
    /// to meta each time. So is a listing's word that an inode has none at all, for the
    /// names meta lets every caller read (`xattr_readable_by_all`), where the answer
    /// here is the one meta would give; `user.` ones go to meta, which checks read
    /// permission first.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let absent = || VfsError::new(ErrorCode::NoAttribute, "no such extended attribute");
        let now = Instant::now();
        if lock(&self.absent_xattrs).get(&ino).is_some_and(|k| k.absent(name, now)) {
            return Err(absent());
        }
        match self.meta.call(GetXattr { ino, name: name.to_vec() }).await {
            Ok(b) => Ok(b),
            Err(e) if e.code == ErrorCode::NoAttribute => {
                let until = Instant::now() + self.config.attr_ttl;
                self.learn_absent(|known| {
                    known.entry(ino).or_default().names.insert(name.to_vec(), until);
                });
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn forget_absent_xattrs(&self, ino: InodeId) {
        lock(&self.absent_xattrs).remove(&ino);
    }

    /// Whether a listing less than `attr_ttl` ago found `ino` without any extended
    /// attribute (and this client has set none since).
    fn is_bare(&self, ino: InodeId) -> bool {
        let now = Instant::now();
        lock(&self.absent_xattrs).get(&ino).is_some_and(|k| k.bare(now))
    }

    /// Remembers, for `attr_ttl`, the listed inodes that have no extended attribute.
    pub(super) fn remember_bare(&self, entries: &[DirEntry]) {
        let until = Instant::now() + self.config.attr_ttl;
        self.learn_absent(|known| {
            for e in entries.iter().filter(|e| !e.has_xattrs) {
                known.entry(e.attr.ino).or_default().bare_until = Some(until);
            }
        });
    }

    /// Adds to what is known absent, within a bound on the inodes it covers (all of it
    /// is only ever a shortcut, so forgetting it at once is safe).
    fn learn_absent(&self, learn: impl FnOnce(&mut HashMap<InodeId, KnownAbsent>)) {
        let mut known = lock(&self.absent_xattrs);
        if known.len() > 100_000 {
            known.clear();
        }
        learn(&mut known);
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
