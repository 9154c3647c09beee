//! Open files and their handles: open, create-and-open, release. Every handle of one
//! file shares one `FileState`; the last release commits and drops it.

use super::{FileHandle, Handle, OpenOptions, Result, Vfs};
use crate::error::VfsError;
use crate::file::{DirtyBuffer, FileInner, FileState};
use proto::error::ErrorCode;
use proto::extent::ExtentMap;
use proto::meta::*;
use proto::types::*;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use util::sync::lock;

impl Vfs {
    /// Opens a file; returns the handle and whether the kernel may keep cached pages
    /// (nobody changed the file since this client last had it open).
    pub async fn open(self: &Arc<Self>, ino: InodeId, opts: OpenOptions) -> Result<(FileHandle, bool)> {
        if let Some(file) = self.open_file(ino) {
            let mut f = file.inner.lock().await;
            if f.opens == 0 {
                // Lost a race with the last release; open afresh below.
                drop(f);
                return Box::pin(self.open(ino, opts)).await;
            }
            if (opts.access.write && !f.granted.write) || (opts.access.read && !f.granted.read) {
                // First open for writing (or reading) here: meta checks it, records a
                // write open and hands out capabilities (an open it counts, released at
                // once; the write record stays while the session has the file open).
                let session = self.meta.session();
                let opened = self.meta.call(Open { ino, session, truncate: false, access: opts.access }).await?;
                self.data.learn_caps(&opened);
                self.meta.call(Release { ino, session }).await?;
                f.granted.read |= opts.access.read;
                f.granted.write |= opts.access.write;
            }
            if opts.truncate {
                self.commit_locked(ino, &mut f).await?;
                let set = AttrChanges { size: Some(0), ..AttrChanges::default() };
                f.attr = self.meta.call(SetAttr { ino, set, session: Some(self.meta.session()) }).await?;
                f.extents = ExtentMap::default();
            }
            f.opens += 1;
            drop(f);
            return Ok((self.new_handle(file), true));
        }
        let session = self.meta.session();
        let req = Open { ino, session, truncate: opts.truncate, access: opts.access };
        let opened = self.meta.call(req).await?;
        self.data.learn_caps(&opened);
        Ok(self.adopt(session, opened, opts.access).await)
    }

    /// Creates a regular file and opens it in one request.
    pub async fn create_open(
        self: &Arc<Self>,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        umask: u32,
        exclusive: bool,
        opts: OpenOptions,
    ) -> Result<(Attr, FileHandle)> {
        let session = self.meta.session();
        let create = Create { parent, name: name.to_vec(), node: NewNode::File, mode, umask, exclusive };
        let req = CreateOpen { create, session, access: opts.access };
        let sent = std::time::Instant::now();
        let (mut opened, mark) = self.meta.call_alone(req).await?;
        if let Some(parent) = opened.parent.take() {
            self.remember_parent(parent, mark, sent);
        }
        self.data.learn_caps(&opened);
        let (ino, existed) = (opened.attr.ino, !opened.created);
        // Meta lets the creator of a new file write it; an existing one as `access` says.
        let granted = OpenAccess { read: opts.access.read, write: opts.access.write || !existed };
        // Meta read these attributes in the transaction that created (or opened) the file:
        // no second round trip to ask for them again.
        let created = opened.attr.clone();
        let (fh, _) = self.adopt(session, opened, granted).await;
        if opts.truncate && existed {
            // Someone else created it first and this open truncates.
            let attr = self.setattr(ino, AttrChanges { size: Some(0), ..AttrChanges::default() }, true).await?;
            return Ok((attr, fh));
        }
        // A thread of this client that had it open already may hold writes meta has not seen.
        Ok((self.local_view(created).await, fh))
    }

    /// Makes a file that meta has just recorded as open here a local open file (or
    /// joins the one another thread made meanwhile).
    pub(super) async fn adopt(
        self: &Arc<Self>,
        session: SessionId,
        Opened { attr, extents, policy, .. }: Opened,
        granted: OpenAccess,
    ) -> (FileHandle, bool) {
        let ino = attr.ino;
        let keep_cache = lock(&self.seen_versions).get(&ino) == Some(&attr.data_version);
        let state = Arc::new(FileState {
            ino,
            inner: tokio::sync::Mutex::new(FileInner {
                attr,
                extents: ExtentMap::from_extents(extents),
                dirty: DirtyBuffer::with_run_capacity(self.config.chunk_size as usize),
                pending: Vec::new(),
                policy,
                uploads: Vec::new(),
                modified: false,
                opens: 1,
                granted,
                lock_owners: HashSet::new(),
                write_error: None,
            }),
        });
        let raced = {
            let mut files = lock(&self.files);
            match files.get(&ino) {
                Some(existing) => Some(existing.clone()),
                None => {
                    files.insert(ino, state.clone());
                    None
                }
            }
        };
        let file = match raced {
            // Another thread opened it meanwhile: share its state, drop our record.
            Some(existing) => {
                let mut e = existing.inner.lock().await;
                e.opens += 1;
                // Our open's write record stays while the session has the file open.
                e.granted.read |= granted.read;
                e.granted.write |= granted.write;
                drop(e);
                let _ = self.meta.call(Release { ino, session }).await;
                existing
            }
            None => state,
        };
        (self.new_handle(file), keep_cache)
    }

    pub(super) fn new_handle(&self, file: Arc<FileState>) -> FileHandle {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(Handle {
            file,
            last_read_end: AtomicU64::new(0),
            window: AtomicU64::new(2),
            prefetched_to: AtomicU64::new(0),
            quiet_until: AtomicU64::new(0),
        });
        lock(&self.handles).insert(fh, handle);
        fh
    }

    pub(super) fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>> {
        lock(&self.handles)
            .get(&fh)
            .cloned()
            .ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, format!("bad file handle {fh}")))
    }

    pub async fn release(self: &Arc<Self>, fh: FileHandle) -> Result<()> {
        let handle = lock(&self.handles).remove(&fh);
        let Some(handle) = handle else {
            return Err(VfsError::new(ErrorCode::InvalidArgument, format!("bad file handle {fh}")));
        };
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        let committed = self.commit_locked(ino, &mut f).await;
        f.opens -= 1;
        if f.opens == 0 {
            lock(&self.files).remove(&ino);
            lock(&self.seen_versions).insert(ino, f.attr.data_version);
            if crate::compact::is_fragmented(&f.extents, f.attr.size, self.config.chunk_size) {
                let _ = self.compact_queue.send((ino, crate::meta_link::current_caller()));
            }
            let session = self.meta.session();
            for owner in f.lock_owners.drain() {
                let _ = self.meta.call(ReleaseLocks { session, ino, owner }).await;
            }
            drop(f);
            let vfs = self.clone();
            tokio::spawn(async move {
                if let Err(e) = vfs.meta.call(Release { ino, session }).await {
                    tracing::warn!("release of inode {ino}: {e}");
                }
            });
        }
        committed.map(|_| ())
    }
}
