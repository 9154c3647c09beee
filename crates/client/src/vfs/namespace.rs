//! Namespace calls passed through to meta, with this client's unflushed size and
//! times laid over the attributes of files it has open.

use super::{Result, Vfs};
use crate::file::FileState;
use proto::meta::*;
use proto::types::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use util::sync::lock;

/// A directory's attributes as an answer of meta gave them (`Vfs::fresh_dir_attr`).
pub(super) struct FreshAttr {
    attr: Attr,
    /// `MetaLink::call_alone`'s mark for that answer.
    mark: u64,
    /// When the request was sent (the attribute TTL counts from there).
    sent: Instant,
}

impl Vfs {
    pub async fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        let attr = self.meta.call(Lookup { parent, name: name.to_vec() }).await?;
        Ok(self.local_view(attr).await)
    }

    /// Attributes, with this client's unflushed size and times if it has the file open.
    pub async fn getattr(&self, ino: InodeId) -> Result<Attr> {
        // Always ask meta: link counts and ctime change under an open file too
        // (link, unlink, rename, chmod through another client).
        let attr = self.meta.call(GetAttr { ino }).await?;
        Ok(self.local_view(attr).await)
    }

    /// The attributes of directory `ino` as this client's last unlink or create in it
    /// left them, once, if no other request to meta that may change a directory began
    /// or ended since that one's and it was sent less than `ttl` ago: the kernel drops
    /// its cached attributes of the parent on every unlink and create and asks again at
    /// once; had the reply been able to carry them, the kernel would have cached them
    /// for `ttl`. Answered without waiting, so the FUSE adapter answers it on its
    /// reading thread.
    pub fn fresh_dir_attr(&self, ino: InodeId, ttl: Duration) -> Option<Attr> {
        let fresh = lock(&self.changed_parent).take()?;
        (fresh.attr.ino == ino && fresh.sent.elapsed() < ttl && self.meta.unchanged_since(fresh.mark))
            .then_some(fresh.attr)
    }

    /// Keeps directory attributes a changing call (`MetaLink::call_alone`, sent at
    /// `sent`, its mark `mark`) answered, for `fresh_dir_attr`.
    pub(super) fn remember_parent(&self, attr: Attr, mark: Option<u64>, sent: Instant) {
        *lock(&self.changed_parent) = mark.map(|mark| FreshAttr { attr, mark, sent });
    }

    /// Overlays what this client wrote but has not committed yet: size, mtime and ctime.
    pub(super) async fn local_view(&self, attr: Attr) -> Attr {
        match self.open_file(attr.ino) {
            Some(file) => {
                let f = file.inner.lock().await;
                if !f.modified {
                    return attr;
                }
                Attr { size: f.attr.size, mtime: f.attr.mtime, ctime: f.attr.ctime.max(attr.ctime), ..attr }
            }
            None => attr,
        }
    }

    pub(super) fn open_file(&self, ino: InodeId) -> Option<Arc<FileState>> {
        lock(&self.files).get(&ino).cloned()
    }

    /// chmod, chown, truncate, utimens; `through_handle` for a change made through an
    /// open file (ftruncate), which an open for writing allows.
    pub async fn setattr(self: &Arc<Self>, ino: InodeId, set: AttrChanges, through_handle: bool) -> Result<Attr> {
        let session = through_handle.then(|| self.meta.session());
        let Some(file) = self.open_file(ino) else {
            return self.meta.call(SetAttr { ino, set, session }).await;
        };
        // Commit first so pending writes cannot undo a truncate or a time stamp.
        let mut f = file.inner.lock().await;
        self.commit_locked(ino, &mut f).await?;
        let size = set.size;
        let attr = self.meta.call(SetAttr { ino, set, session }).await?;
        if let Some(size) = size {
            f.extents.truncate(size);
        }
        f.attr = attr.clone();
        Ok(attr)
    }

    /// Makes a node: `mode` as asked, before the creator's `umask` (meta applies it
    /// unless the directory's default ACL decides instead).
    pub async fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        node: NewNode,
        mode: u32,
        umask: u32,
        exclusive: bool,
    ) -> Result<Attr> {
        let sent = Instant::now();
        let req = Create { parent, name: name.to_vec(), node, mode, umask, exclusive };
        let (made, mark) = self.meta.call_alone(req).await?;
        self.remember_parent(made.parent, mark, sent);
        Ok(made.attr)
    }

    pub async fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &[u8]) -> Result<Attr> {
        self.meta.call(Link { ino, new_parent, new_name: new_name.to_vec() }).await
    }

    pub async fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        let sent = Instant::now();
        let (Unlinked { ino, parent, .. }, mark) = self.meta.call_alone(Unlink { parent, name: name.to_vec() }).await?;
        lock(&self.seen_versions).remove(&ino);
        self.remember_parent(parent, mark, sent);
        Ok(())
    }

    pub async fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        let sent = Instant::now();
        let (parent, mark) = self.meta.call_alone(Rmdir { parent, name: name.to_vec() }).await?;
        self.remember_parent(parent, mark, sent);
        Ok(())
    }

    pub async fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        self.meta.call(Rename { parent, name: name.to_vec(), new_parent, new_name: new_name.to_vec(), mode }).await
    }

    pub async fn readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        self.meta.call(ReadLink { ino }).await
    }

    pub async fn statfs(&self) -> Result<FsStats> {
        self.meta.call(StatFs {}).await
    }

    /// Makes every namespace change so far durable at meta (fsyncdir).
    pub async fn sync_meta(&self) -> Result<()> {
        self.meta.call(SyncAll {}).await
    }
}
