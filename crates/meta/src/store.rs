//! The backend seam: a transactional store of rows (`MetaStore`, `Txn`) that every
//! database implements once, so the POSIX logic in `ops` is written only once.

use crate::error::MetaError;
use proto::meta::{SessionInfo, StoredChunk};
use proto::types::{Attr, ChunkId, ChunkRecord, Extent, InodeId, NodeInfo, SessionId};
use std::sync::{Arc, Mutex};

/// An inode row: the attributes plus what only meta needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    /// The directory holding (one of) its names; for directories the `..` target,
    /// used to refuse moving a directory into its own subtree.
    pub parent: InodeId,
    /// Symlink target; empty for other kinds.
    pub target: Vec<u8>,
}

/// A session row; `last_seen_ms` is wall-clock milliseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: SessionId,
    pub info: SessionInfo,
    pub last_seen_ms: i64,
}

/// A directory entry row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DentryRow {
    pub name: Vec<u8>,
    pub ino: InodeId,
    pub cookie: u64,
}

/// Counters kept by the store, allocated with `Txn::next_id`.
#[derive(Debug, Clone, Copy)]
pub enum Counter {
    Inode,
    Cookie,
    Session,
    /// Bumped by `Sync` so a durable commit always has something to write.
    Sync,
}

impl Counter {
    /// The counter's row key in the store.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Inode => "next_inode",
            Counter::Cookie => "next_cookie",
            Counter::Session => "next_session",
            Counter::Sync => "syncs",
        }
    }
}

/// Primitive row operations inside one transaction. Nothing here knows POSIX rules.
pub trait Txn {
    /// Increments a counter and returns its new value.
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError>;

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError>;
    /// Inserts or overwrites the row.
    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError>;
    fn delete_inode(&mut self, ino: InodeId) -> Result<(), MetaError>;
    fn count_inodes(&mut self) -> Result<u64, MetaError>;

    fn get_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>, MetaError>;
    fn put_dentry(&mut self, parent: InodeId, name: &[u8], ino: InodeId, cookie: u64) -> Result<(), MetaError>;
    fn delete_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError>;
    /// Entries with cookie > `after`, in cookie order, at most `limit`.
    fn list_dentries(&mut self, parent: InodeId, after: u64, limit: u32) -> Result<Vec<DentryRow>, MetaError>;

    /// Extents of `ino` that intersect `[start, end)`, in offset order.
    fn extents_overlapping(&mut self, ino: InodeId, start: u64, end: u64) -> Result<Vec<Extent>, MetaError>;
    fn insert_extent(&mut self, ino: InodeId, extent: &Extent) -> Result<(), MetaError>;
    fn delete_extent(&mut self, ino: InodeId, file_offset: u64) -> Result<(), MetaError>;
    /// Every extent after `(ino, offset)` (exclusive), ordered by (ino, offset).
    fn list_extents(&mut self, after: Option<(InodeId, u64)>, limit: u32) -> Result<Vec<(InodeId, Extent)>, MetaError>;

    /// Records size and locations (added to known ones); refcount is untouched.
    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError>;
    /// Adds `delta` to a chunk's refcount, creating an empty record if absent.
    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError>;
    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError>;
    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError>;
    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError>;
    /// Forgets that `node` holds a copy of the chunk.
    fn remove_location(&mut self, id: &ChunkId, node: &str) -> Result<(), MetaError>;
    /// Round trips between sites as nodes last reported them: (from, to, micros).
    fn site_rtts(&mut self) -> Result<Vec<(String, String, u64)>, MetaError>;
    /// (number of chunks, total bytes) in the catalogue.
    fn chunk_totals(&mut self) -> Result<(u64, u64), MetaError>;

    fn get_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>, MetaError>;
    fn set_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError>;
    fn list_xattrs(&mut self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError>;
    /// Returns whether the attribute existed.
    fn delete_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool, MetaError>;
    fn delete_all_xattrs(&mut self, ino: InodeId) -> Result<(), MetaError>;

    /// Inodes that have no link left (orphans kept for their openers).
    fn orphans(&mut self) -> Result<Vec<InodeId>, MetaError>;

    fn put_session(&mut self, session: &SessionRow) -> Result<(), MetaError>;
    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError>;
    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError>;
    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError>;

    /// Upserts a node; its `last_seen_secs` is ignored in favour of `last_seen_ms`.
    fn put_node(&mut self, node: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError>;
    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError>;
    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError>;
}

/// One write operation as the store's writer runs it.
pub type WriteOp = Box<dyn FnOnce(&mut dyn Txn) -> Result<(), MetaError> + Send>;
/// Called once a write is committed (or failed), from the store's writer.
pub type WriteDone = Box<dyn FnOnce(Result<(), MetaError>) + Send>;
/// One read operation.
pub type ReadOp<'a> = Box<dyn FnOnce(&mut dyn Txn) -> Result<(), MetaError> + 'a>;

/// A transactional backend. Writes may be group-committed with other writes, but each
/// one is atomic on its own: if it fails, none of its changes survive.
pub trait MetaStore: Send + Sync {
    /// Queues `op` to run in a write transaction and calls `done` once it is committed
    /// (with `durable`: on disk) or has failed. Never blocks, so async callers need no
    /// blocking thread.
    fn submit_write(&self, durable: bool, op: WriteOp, done: WriteDone);
    /// Runs `op` on a consistent snapshot.
    fn read_op(&self, op: ReadOp<'_>) -> Result<(), MetaError>;
}

/// Typed write that calls `done` with `f`'s result once it is committed.
fn submit<R: Send + 'static>(
    store: &dyn MetaStore,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
    done: impl FnOnce(Result<R, MetaError>) + Send + 'static,
) {
    let slot = Arc::new(Mutex::new(None));
    let out = slot.clone();
    let op: WriteOp = Box::new(move |t| {
        let r = f(t)?;
        *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        Ok(())
    });
    store.submit_write(
        durable,
        op,
        Box::new(move |committed| {
            let r = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            done(
                committed
                    .and_then(|()| r.ok_or_else(|| MetaError::Internal("write committed without a result".into()))),
            )
        }),
    );
}

/// Typed write that blocks until committed (for blocking callers and tests).
pub fn write<R: Send + 'static>(
    store: &dyn MetaStore,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    submit(store, durable, f, move |r| {
        let _ = tx.send(r);
    });
    rx.recv().map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// Typed write for async callers. A plain write may commit on the calling thread
/// (it takes tens of microseconds); a durable one waits for an fsync, so it is
/// submitted from the blocking pool.
pub async fn write_async<R: Send + 'static>(
    store: Arc<dyn MetaStore>,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = move |r| {
        let _ = tx.send(r);
    };
    if durable {
        tokio::task::spawn_blocking(move || submit(&*store, durable, f, done));
    } else {
        submit(&*store, durable, f, done);
    }
    rx.await.map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// Typed convenience over `MetaStore::read_op`.
pub fn read<R>(store: &dyn MetaStore, f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError>) -> Result<R, MetaError> {
    let mut slot = None;
    store.read_op(Box::new(|t| {
        slot = Some(f(t)?);
        Ok(())
    }))?;
    slot.ok_or_else(|| MetaError::Internal("read finished without a result".into()))
}
