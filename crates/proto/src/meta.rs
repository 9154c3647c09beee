//! The control-path protocol: what clients, nodes and the CLI ask of `locus meta`.
//! Meta never carries file data; it hands out extents and chunk locations.

use crate::error::WireError;
use crate::types::*;
use serde::{Deserialize, Serialize};

/// Who is connecting, so `locus status` can tell sessions apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub site: String,
    pub host: String,
    pub pid: u32,
    /// Mount point, or a CLI verb such as `status`.
    pub purpose: String,
}

/// How to change a time stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// Fields of `setattr`; `None` leaves a field alone. A `size` truncates or extends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// What kind of node to create, with its type-specific payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NewNode {
    File,
    Dir,
    Symlink {
        target: Vec<u8>,
    },
    /// FIFO, socket or device special file.
    Special {
        kind: FileKind,
        rdev: u32,
    },
}

/// `rename(2)` / `renameat2(2)` flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameMode {
    /// Replace the target if it exists (POSIX rename).
    Replace,
    /// Fail with `Exists` if the target exists (RENAME_NOREPLACE).
    NoReplace,
    /// Swap source and target atomically; both must exist (RENAME_EXCHANGE).
    Exchange,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrMode {
    Any,
    /// XATTR_CREATE: fail with `Exists` if present.
    Create,
    /// XATTR_REPLACE: fail with `NoAttribute` if absent.
    Replace,
}

/// A byte-range lock kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// A byte-range lock request or holder. `end` is inclusive (`u64::MAX` = to EOF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRange {
    pub ino: InodeId,
    /// Lock owner as the kernel names it; unique within a session.
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
    pub pid: u32,
}

/// A chunk a client stored on nodes, reported with the extents that use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredChunk {
    pub id: ChunkId,
    pub size: u64,
    pub nodes: Vec<NodeId>,
}

/// `fallocate(2)` modes Locus supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocateMode {
    /// Extend the size to `offset + len` if smaller (holes read as zeros).
    Extend,
    /// FALLOC_FL_KEEP_SIZE: nothing to reserve in a chunk store; size unchanged.
    KeepSize,
    /// FALLOC_FL_PUNCH_HOLE | KEEP_SIZE: drop the range's extents.
    PunchHole,
    /// FALLOC_FL_ZERO_RANGE: drop the range's extents and extend the size.
    ZeroRange,
}

/// Requests to `locus meta`. Names (`name`) are single path components in raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// First request on every connection.
    Hello {
        protocol: u32,
        session: SessionInfo,
    },
    /// Keeps a session (its locks and open files) alive.
    Heartbeat {
        session: SessionId,
    },
    /// Ends a session, dropping its locks and open-file records.
    Goodbye {
        session: SessionId,
    },

    Lookup {
        parent: InodeId,
        name: Vec<u8>,
    },
    GetAttr {
        ino: InodeId,
    },
    SetAttr {
        ino: InodeId,
        set: SetAttr,
        caller: Caller,
    },
    /// mknod/mkdir/symlink/create. `mode` is final (umask already applied).
    /// With `exclusive` false an existing regular file is returned instead of `Exists`.
    Create {
        parent: InodeId,
        name: Vec<u8>,
        node: NewNode,
        mode: u32,
        caller: Caller,
        exclusive: bool,
        /// Also record the new file as open by this session (create + open in one
        /// request); the answer is then `Opened`.
        open_by: Option<SessionId>,
    },
    Link {
        ino: InodeId,
        new_parent: InodeId,
        new_name: Vec<u8>,
    },
    /// Removes a non-directory name. An inode whose last link goes while a session
    /// has it open lives on as an orphan until `Release`.
    Unlink {
        parent: InodeId,
        name: Vec<u8>,
    },
    Rmdir {
        parent: InodeId,
        name: Vec<u8>,
    },
    Rename {
        parent: InodeId,
        name: Vec<u8>,
        new_parent: InodeId,
        new_name: Vec<u8>,
        mode: RenameMode,
    },
    ReadLink {
        ino: InodeId,
    },
    /// Entries with cookie greater than `after`, in cookie order, at most `limit`.
    ReadDir {
        ino: InodeId,
        after: u64,
        limit: u32,
    },

    GetXattr {
        ino: InodeId,
        name: Vec<u8>,
    },
    SetXattr {
        ino: InodeId,
        name: Vec<u8>,
        value: Vec<u8>,
        mode: XattrMode,
    },
    ListXattr {
        ino: InodeId,
    },
    RemoveXattr {
        ino: InodeId,
        name: Vec<u8>,
    },
    StatFs,

    /// Records that `session` has `ino` open and returns its attributes and extents
    /// (close-to-open: the open sees every close that finished before it).
    Open {
        ino: InodeId,
        session: SessionId,
        truncate: bool,
    },
    /// Drops one open record; reclaims an orphan nobody has open any more.
    Release {
        ino: InodeId,
        session: SessionId,
    },
    /// Current extents of a file (for readers that hold it open).
    Extents {
        ino: InodeId,
    },
    /// Atomically maps the given extents into the file (later ones win), records where
    /// their chunks are stored, and raises the size to at least `min_size`.
    CommitWrite {
        ino: InodeId,
        extents: Vec<Extent>,
        chunks: Vec<StoredChunk>,
        min_size: u64,
        mtime: Timestamp,
    },
    Fallocate {
        ino: InodeId,
        offset: u64,
        len: u64,
        mode: AllocateMode,
    },
    /// Swaps fragmented extents for ones holding the same bytes in fewer chunks; refused
    /// (`Stale`) if the file's `data_version` is no longer the one the compactor read.
    Compact {
        ino: InodeId,
        data_version: u64,
        extents: Vec<Extent>,
        chunks: Vec<StoredChunk>,
    },
    /// Makes every change acknowledged so far durable on meta's disk (fsync, fsyncdir).
    Sync,

    /// F_GETLK: the first conflicting lock, if any.
    GetLock {
        session: SessionId,
        lock: LockRange,
    },
    /// F_SETLK: `WouldBlock` on conflict (blocking callers retry).
    SetLock {
        session: SessionId,
        lock: LockRange,
    },
    /// Drops every lock `owner` of `session` holds on `ino` (close).
    ReleaseLocks {
        session: SessionId,
        ino: InodeId,
        owner: u64,
    },

    /// A node announces itself and its capacity; repeated as its heartbeat. Answered
    /// with `Registered`.
    RegisterNode {
        node: NodeInfo,
        /// The cluster the node belongs to; `None` before its first registration
        /// (it then adopts the id meta answers with).
        cluster_id: Option<String>,
    },
    ListNodes,
    /// Where these chunks are stored, for readers and fsck.
    ChunkLocations {
        ids: Vec<ChunkId>,
    },
    /// Catalogue page after `after` (exclusive), for fsck and gc.
    ListChunks {
        after: Option<ChunkId>,
        limit: u32,
    },
    /// Every extent, paged by (inode, offset), for fsck.
    ListExtents {
        after: Option<(InodeId, u64)>,
        limit: u32,
    },
    /// Of these chunk ids, the ones no extent references (gc candidates).
    Unreferenced {
        ids: Vec<ChunkId>,
    },
    /// Removes catalogue entries of chunks gc deleted; refuses referenced ones.
    ForgetChunks {
        ids: Vec<ChunkId>,
    },
    /// A node now holds (`added`) or no longer holds (`removed`) copies of these chunks
    /// in its site cache, so other sites can find the nearest copy.
    UpdateLocations {
        node: NodeId,
        added: Vec<StoredChunk>,
        removed: Vec<ChunkId>,
    },
    Status,
    /// What a process's background workers are doing, sent with its heartbeat; meta
    /// keeps the latest report in memory for `locus status`.
    ReportWorkers {
        /// The reporting process as status shows it, e.g. `node n1`.
        process: String,
        workers: Vec<WorkerStatus>,
    },
}

/// Aggregate numbers for `locus status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub nodes: Vec<NodeInfo>,
    pub sessions: Vec<(SessionId, SessionInfo, u64)>,
    pub inodes: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    /// Measured round trips between sites: (from, to, microseconds).
    pub site_rtts: Vec<(String, String, u64)>,
    /// Background workers per process (meta's own and the latest reports).
    pub workers: Vec<(String, Vec<WorkerStatus>)>,
    /// The cluster this meta serves.
    pub cluster_id: String,
}

/// `statfs` numbers in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
}

/// Successful answers from meta; which variant answers which request is fixed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    Welcome {
        session: SessionId,
        heartbeat_ms: u64,
        /// The cluster this meta serves, created when its database was formatted.
        cluster_id: String,
    },
    /// RegisterNode: the cluster the node now belongs to.
    Registered {
        cluster_id: String,
    },
    Done,
    Attr(Attr),
    /// Unlink: the inode and whether it lives on as an orphan.
    Unlinked {
        ino: InodeId,
        orphaned: bool,
    },
    Bytes(Vec<u8>),
    Names(Vec<Vec<u8>>),
    Entries(Vec<DirEntry>),
    StatFs(FsStats),
    Opened {
        attr: Attr,
        extents: Vec<Extent>,
    },
    Lock(Option<LockRange>),
    Nodes(Vec<NodeInfo>),
    Chunks(Vec<ChunkRecord>),
    Extents(Vec<(InodeId, Extent)>),
    ChunkIds(Vec<ChunkId>),
    Status(ClusterStatus),
}

/// The payload of every meta response frame.
pub type MetaResult = Result<MetaReply, WireError>;
