//! Making writes visible and durable: flush, fsync, fallocate, and the commit of
//! pending extents to meta that they share.

use super::{FileHandle, Result, Vfs};
use crate::error::VfsError;
use crate::file::FileInner;
use proto::error::ErrorCode;
use proto::extent::ExtentMap;
use proto::meta::*;
use proto::types::*;
use std::sync::Arc;
use util::sync::lock;

impl Vfs {
    /// Stores and commits everything written through any handle of the file.
    pub async fn flush(self: &Arc<Self>, fh: FileHandle, lock_owner: Option<u64>) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        let committed = self.commit_reporting(ino, &mut f, false).await.map(|_| ());
        if let Some(owner) = lock_owner
            && f.lock_owners.remove(&owner)
        {
            let session = self.meta.session();
            self.meta.call(ReleaseLocks { session, ino, owner }).await?;
        }
        committed
    }

    /// Whether a `flush` of `fh` would do nothing (no buffered, uploading or pending
    /// writes, no POSIX locks of `lock_owner` to drop), so that the caller may answer it on
    /// its own thread: the hop to the runtime and back is most of a FUSE request's cost.
    /// `false` when unsure (the file is busy, the handle unknown): call `flush`.
    pub fn flush_is_noop(&self, fh: FileHandle, lock_owner: Option<u64>) -> bool {
        let Ok(handle) = self.handle(fh) else { return false };
        let Ok(f) = handle.file.inner.try_lock() else { return false };
        f.dirty.bytes() == 0
            && f.uploads.is_empty()
            && f.pending.is_empty()
            && !f.modified
            && f.write_error.is_none()
            && lock_owner.is_none_or(|owner| !f.lock_owners.contains(&owner))
    }

    /// `flush` plus durability of everything meta acknowledged before.
    pub async fn fsync(self: &Arc<Self>, fh: FileHandle) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        if !self.commit_reporting(ino, &mut f, true).await? {
            self.sync_meta().await?;
        }
        Ok(())
    }

    /// `commit_locked` at a sync point (fsync, flush): also reports a write failure
    /// another request met first (`FileInner::write_error`). An fsync reports it once
    /// (`consume`); a flush reports it and leaves it for the fsync: the flush may be
    /// another process's close of a shared descriptor (a child's exec closes the
    /// parent's open files), and the writer's own fsync must still fail, as Linux's
    /// close does not clear a writeback error that fsync has not reported.
    async fn commit_reporting(self: &Arc<Self>, ino: InodeId, f: &mut FileInner, consume: bool) -> Result<bool> {
        let committed = self.commit_locked(ino, f).await;
        let unreported = if consume { f.write_error.take() } else { f.write_error.clone() };
        let committed = committed?;
        unreported.map_or(Ok(committed), Err)
    }

    /// Cuts buffered data into chunks, waits for every upload and commits the pending
    /// extents. Returns whether a commit (itself durable) was sent. A failed upload is
    /// also kept for the next sync point (`FileInner::write_error`).
    pub(super) async fn commit_locked(self: &Arc<Self>, ino: InodeId, f: &mut FileInner) -> Result<bool> {
        for pieces in f.dirty.take_packed(self.config.chunk_size, true) {
            self.start_upload(f, pieces).await;
        }
        let mut chunks = Vec::new();
        let mut failure = None;
        for upload in std::mem::take(&mut f.uploads) {
            match upload.await {
                Ok(Ok(c)) => chunks.push(c),
                Ok(Err(e)) => failure = Some(e),
                Err(e) => failure = Some(VfsError::new(ErrorCode::Io, format!("upload task failed: {e}"))),
            }
        }
        if let Some(e) = failure {
            // The data is lost: forget the pending extents so reads show what meta has.
            f.pending.clear();
            f.modified = false;
            if let Ok(opened) = self.meta.call(Extents { ino }).await {
                self.data.learn_caps(&opened);
                let Opened { attr, extents, .. } = opened;
                f.attr = attr;
                f.extents = ExtentMap::from_extents(extents);
            }
            let e = VfsError::new(e.code, format!("writing inode {ino}: {}", e.context));
            f.write_error = Some(e.clone());
            return Err(e);
        }
        if f.pending.is_empty() && !f.modified {
            return Ok(false);
        }
        let req = CommitWrite {
            ino,
            session: self.meta.session(),
            extents: std::mem::take(&mut f.pending),
            chunks,
            min_size: f.attr.size,
            mtime: f.attr.mtime,
        };
        f.attr = self.meta.call(req).await?;
        f.modified = false;
        lock(&self.seen_versions).insert(ino, f.attr.data_version);
        Ok(true)
    }

    pub async fn fallocate(self: &Arc<Self>, fh: FileHandle, offset: u64, len: u64, mode: AllocateMode) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        self.commit_locked(ino, &mut f).await?;
        f.attr = self.meta.call(Fallocate { ino, session: self.meta.session(), offset, len, mode }).await?;
        if matches!(mode, AllocateMode::PunchHole | AllocateMode::ZeroRange) {
            f.extents.punch(offset, offset + len);
        }
        Ok(())
    }
}
