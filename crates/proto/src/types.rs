//! Identifiers and records shared by meta, nodes and clients.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Inode number; `ROOT_INODE` is the namespace root.
pub type InodeId = u64;
/// Inode number of `/`.
pub const ROOT_INODE: InodeId = 1;
/// Meta-assigned identity of a mounted client (or CLI) connection.
pub type SessionId = u64;

/// A chunk's identity is the BLAKE3 hash of its content: integrity check, cache key
/// and dedupe key at once.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    /// The id that `data` must be stored under.
    pub fn of(data: &[u8]) -> Self {
        ChunkId(*blake3::hash(data).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(ChunkId(out))
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", &self.to_hex()[..16])
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Seconds and nanoseconds since the Unix epoch (may be negative, as POSIX allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// Milliseconds since the epoch (capability expiry is counted in these).
    pub fn millis(&self) -> i64 {
        self.secs * 1000 + i64::from(self.nanos / 1_000_000)
    }

    pub fn now() -> Self {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
    }
}

/// File type, as stored in the inode (POSIX `S_IFMT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// Inode attributes as `stat(2)` shows them. `mode` holds only permission bits
/// (`0o7777`: suid, sgid, sticky and rwx); the type is `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: InodeId,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Bumped on every change of the file's content (extents or size); clients use
    /// it to keep their page cache across opens (close-to-open).
    pub data_version: u64,
}

/// Who performs an operation, as the client's kernel reports it: the process's uid,
/// gid and supplementary groups, in the numbering of the client's site.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (without `gid`).
    pub groups: Vec<u32>,
}

impl Caller {
    /// The superuser of the caller's host.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, groups: Vec::new() };

    /// A caller without supplementary groups.
    pub fn new(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: Vec::new() }
    }

    /// Whether `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A byte range of a file mapped onto a byte range of a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub file_offset: u64,
    pub len: u64,
    pub chunk: ChunkId,
    pub chunk_offset: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.file_offset + self.len
    }
}

/// Storage daemon identity, unique within the cluster.
pub type NodeId = String;

/// A node as meta knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// Identity of the node's chunk store, persisted in its data directory: a node
    /// restarted on the same store may take over its id at once; another store may not.
    pub store_id: String,
    pub site: String,
    /// `host:port` the node serves chunks on.
    pub addr: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub chunk_count: u64,
    /// Seconds since the node last reported in.
    pub last_seen_secs: u64,
    /// Round trip this node measured to each other site, in microseconds.
    pub site_rtts: Vec<(String, u64)>,
    /// Bytes this node holds as copies cached for its site (not counted in `used_bytes`).
    pub cache_bytes: u64,
    /// Being emptied (`locus node drain`): it takes no new chunks and its copies do not
    /// count towards a policy, so repair copies them elsewhere. Kept by meta, not
    /// reported by the node.
    pub drained: bool,
}

/// A chunk in the catalogue: its size and where it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRecord {
    pub id: ChunkId,
    pub size: u64,
    pub refcount: u64,
    /// Every node holding a copy, replica or cached: where a reader may fetch it.
    pub nodes: Vec<NodeId>,
    /// Those of `nodes` that hold only a site-cache copy: readable, but evictable at
    /// any time, so no policy, repair or fsck counts them.
    pub cached: Vec<NodeId>,
}

impl ChunkRecord {
    /// The nodes holding a replica (a durable copy a policy counts), in `nodes` order.
    pub fn replicas(&self) -> impl Iterator<Item = &NodeId> {
        self.nodes.iter().filter(|n| !self.cached.contains(n))
    }
}

/// One directory entry as `readdir` returns it; `cookie` resumes the listing after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub attr: Attr,
    pub cookie: u64,
    /// Whether the inode has any extended attribute. `ls -l` asks for two of every file
    /// it lists (`security.selinux`, `system.posix_acl_access`); a client that knows there
    /// are none answers without asking meta, a round trip each at a distant site.
    pub has_xattrs: bool,
}

/// Whether meta answers a read of the extended attribute `name` without a permission
/// check (`trusted.` ones with absence to all but root): for these names a client may
/// answer from a listing's word that the inode has no attribute at all.
pub fn xattr_readable_by_all(name: &[u8]) -> bool {
    [&b"security."[..], b"trusted."].iter().any(|ns| name.starts_with(ns))
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
}

/// What a background worker is doing, as `locus status` and the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Stable name, e.g. `session-expiry` or `compaction`.
    pub name: String,
    pub state: WorkerState,
    /// Work done so far, in the worker's own words ("412 chunks reported").
    pub progress: String,
    /// Steps finished since the process started.
    pub steps: u64,
    /// Steps that failed since the process started.
    pub errors: u64,
    /// The most recent failure and when it happened.
    pub last_error: Option<(Timestamp, String)>,
}

/// Where a worker is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    /// Doing a step of work.
    Busy,
    /// Waiting for work (a timer or a queue).
    Idle,
    /// Finished or shut down; it will not run again.
    Stopped,
}

/// What a certificate says its holder is for: the service it may run or act as. A
/// protocol fact (meta's table of requests says which roles may make each), proven by
/// the peer's certificate (`net::tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// The metadata service.
    Meta,
    /// A storage node.
    Node,
    /// A mount: may call services, never serve or register.
    Client,
    /// An operator's admin commands (status, fsck, gc, node admission): may list and
    /// delete chunks at nodes and admit or remove nodes, never serve or register.
    Admin,
    /// A person's own certificate (a grid user certificate): `locus login` proves its
    /// principal to meta with it and gets a token the person's mount acts with; it
    /// asks nothing else, never serves, never mounts.
    User,
}

impl Role {
    /// The word used in certificates and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Meta => "meta",
            Role::Node => "node",
            Role::Client => "client",
            Role::Admin => "admin",
            Role::User => "user",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "meta" => Ok(Role::Meta),
            "node" => Ok(Role::Node),
            "client" => Ok(Role::Client),
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            other => Err(format!("unknown role {other:?} (meta, node, client, admin or user)")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
