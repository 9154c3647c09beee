//! The backend seam: row operations inside a transaction (`Txn`) and the connections
//! that run them (`WriteConn`, `ReadConn`); a database implements only these, and the
//! shared `engine` and `ops` are written once above them.

use crate::error::MetaError;
use crate::locks::Held;
use proto::meta::{SessionInfo, StoredChunk};
use proto::policy::Policy;
use proto::types::{Attr, ChunkId, ChunkRecord, Extent, InodeId, NodeInfo, SessionId};

pub(crate) mod values;

/// An inode row: the attributes plus what only meta needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub attr: Attr,
    /// The directory holding (one of) its names; for directories the `..` target,
    /// used to refuse moving a directory into its own subtree.
    pub parent: InodeId,
    /// Symlink target; empty for other kinds.
    pub target: Vec<u8>,
    /// Which POSIX ACLs the inode has (kept as xattr rows, see `acl`).
    pub acls: AclMarks,
}

/// Which ACLs an inode has, so that a permission check reads one only where it exists.
/// Stored in the `mode` column above the permission bits (`mode_column`): no schema of
/// either backend has a column for it, and the mode is read with every inode anyway.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AclMarks {
    /// `system.posix_acl_access` is set: checks of non-owners consult it.
    pub access: bool,
    /// `system.posix_acl_default` is set (directories): new nodes inherit it.
    pub default: bool,
}

const ACCESS_ACL_BIT: u32 = 1 << 16;
const DEFAULT_ACL_BIT: u32 = 1 << 17;

impl Inode {
    /// The `mode` column: the permission bits and the ACL marks above them.
    pub fn mode_column(&self) -> i64 {
        let marks =
            if self.acls.access { ACCESS_ACL_BIT } else { 0 } | if self.acls.default { DEFAULT_ACL_BIT } else { 0 };
        i64::from((self.attr.mode & 0o7777) | marks)
    }
}

/// Splits a `mode` column into the permission bits and the ACL marks.
pub fn split_mode_column(column: i64) -> (u32, AclMarks) {
    let column = column as u32;
    (column & 0o7777, AclMarks { access: column & ACCESS_ACL_BIT != 0, default: column & DEFAULT_ACL_BIT != 0 })
}

/// A session row; `last_seen_ms` is wall-clock milliseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id: SessionId,
    pub info: SessionInfo,
    pub last_seen_ms: i64,
    /// The certificate name the session said `Hello` with (`None` without TLS): only
    /// a connection proving that name may act for it, at any meta, after any restart.
    pub owner: Option<String>,
}

/// A directory entry row.
/// One session's opens of one file (a row of `opens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenRow {
    /// How many opens are not yet released.
    pub count: u32,
    /// Whether one of them was opened for writing (permission checked then): the
    /// session may change the file's data whatever its mode says now.
    pub writable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DentryRow {
    pub name: Vec<u8>,
    pub ino: InodeId,
    pub cookie: u64,
    /// Whether the entry's inode has any extended attribute, read with the listing (a
    /// listing tells clients so: see `proto::types::DirEntry::has_xattrs`).
    pub has_xattrs: bool,
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

/// What an op is about to read (`Txn::prefetch`); each part is optional.
#[derive(Clone, Copy, Default)]
pub struct Prefetch<'a> {
    /// Directory `.0`, its entry named `.1`, that entry's inode and its open count.
    pub entry: Option<(InodeId, &'a [u8])>,
    /// Every extent of the inode `entry` names (an unlink, which may destroy it).
    pub entry_extents: bool,
    /// A session's row (`get_session`).
    pub session: Option<SessionId>,
    /// A session's opens of an inode, and the inode (`get_open`).
    pub open: Option<(SessionId, InodeId)>,
    /// The extents of an inode that intersect `[.1, .2)` (`extents_overlapping`):
    /// `(ino, 0, u64::MAX)` for every one, a write's span for those it replaces.
    pub extents: Option<(InodeId, u64, u64)>,
    /// The policies of an inode and all its ancestors, and the ancestors' inodes
    /// (`get_policy` up the chain of parents, as `effective_policy` walks it).
    pub policies: Option<InodeId>,
    /// The op writes data through `open` over the span of `extents`: most likely the
    /// session has the file open once, for writing, and writes at or past its end, so
    /// a backend may take that for granted under a check at the server.
    pub writing: bool,
}

impl<'a> Prefetch<'a> {
    /// Directory `parent`, its entry `name` and what that names.
    pub fn entry(parent: InodeId, name: &'a [u8]) -> Self {
        Prefetch { entry: Some((parent, name)), ..Prefetch::default() }
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
    /// Every directory holding a name of `ino`. A scan of the entries: asked only of a
    /// file with several names whose recorded parent does not let the caller reach it
    /// (`perm::check_reach`).
    fn parents_of(&mut self, ino: InodeId) -> Result<Vec<InodeId>, MetaError>;
    /// A hint of what the op goes on to read: a backend across a network asks for all
    /// of it in one round trip. The answers still come from the getters; by default a
    /// no-op.
    fn prefetch(&mut self, want: Prefetch<'_>) -> Result<(), MetaError> {
        let _ = want;
        Ok(())
    }
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

    /// Records size and replica locations (added to known ones; a cached copy on one
    /// of those nodes becomes a replica); refcount is untouched.
    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError>;
    /// Records that `node` holds a site-cache copy of the chunk (size recorded if the
    /// chunk is new); a replica already recorded on that node stays a replica.
    fn add_cached(&mut self, id: &ChunkId, size: u64, node: &str) -> Result<(), MetaError>;
    /// Adds `delta` to a chunk's refcount, creating an empty record if absent.
    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError>;
    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError>;
    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError>;
    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError>;
    /// Forgets that `node` holds a site-cache copy of the chunk (a replica there stays).
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

    /// Byte-range locks held on `ino`, in no particular order.
    fn locks_on(&mut self, ino: InodeId) -> Result<Vec<Held>, MetaError>;
    /// Replaces every lock held on `ino` with `held`.
    fn put_locks(&mut self, ino: InodeId, held: &[Held]) -> Result<(), MetaError>;
    /// Drops every lock of a session.
    fn delete_session_locks(&mut self, session: SessionId) -> Result<(), MetaError>;

    /// How many times `session` has `ino` open, and whether for writing (default if never).
    fn get_open(&mut self, session: SessionId, ino: InodeId) -> Result<OpenRow, MetaError>;
    /// Records `session`'s opens of `ino` (a count of 0 removes the record).
    fn put_open(&mut self, session: SessionId, ino: InodeId, open: OpenRow) -> Result<(), MetaError>;
    /// Drops one open of `ino` by `session`, if it has one; a backend across a
    /// network may do it without reading the record first.
    fn drop_open(&mut self, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
        drop_open_read(self, session, ino)
    }
    /// Opens of `ino` across all sessions.
    fn count_opens(&mut self, ino: InodeId) -> Result<u64, MetaError>;
    /// Drops every open record of a session, returning the inodes it had open.
    fn delete_session_opens(&mut self, session: SessionId) -> Result<Vec<InodeId>, MetaError>;

    /// Upserts a node; its `last_seen_secs` is ignored in favour of `last_seen_ms`.
    fn put_node(&mut self, node: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError>;
    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError>;
    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError>;

    /// The replication policy a directory sets itself (not inherited), if any.
    fn get_policy(&mut self, ino: InodeId) -> Result<Option<Policy>, MetaError>;
    /// Whether any directory may have a policy: false only where the store knows that
    /// none has, so that `effective_policy` need not walk up the parents.
    fn may_have_policies(&mut self) -> Result<bool, MetaError> {
        Ok(true)
    }
    /// Inserts or overwrites a directory's policy.
    fn put_policy(&mut self, ino: InodeId, policy: &Policy) -> Result<(), MetaError>;
    fn delete_policy(&mut self, ino: InodeId) -> Result<(), MetaError>;
    /// Every directory that sets a policy, in inode order.
    fn list_policies(&mut self) -> Result<Vec<(InodeId, Policy)>, MetaError>;
    /// Marks a node drained (or no longer drained).
    fn set_drained(&mut self, node: &str, drained: bool) -> Result<(), MetaError>;
    /// The ids of drained nodes, sorted.
    fn drained_nodes(&mut self) -> Result<Vec<String>, MetaError>;
    /// Whether a node id may register: `Some(true)` admitted, `Some(false)` removed,
    /// `None` never decided on (pending).
    fn get_admission(&mut self, node: &str) -> Result<Option<bool>, MetaError>;
    /// Admits a node id (`true`) or marks it removed (`false`).
    fn set_admission(&mut self, node: &str, admitted: bool) -> Result<(), MetaError>;
    /// Deletes a node's row, its drained mark and every chunk location it had.
    fn delete_node(&mut self, node: &str) -> Result<(), MetaError>;
    /// Keeps the hash of a join token until `expires_ms`.
    fn put_join_token(&mut self, hash: &[u8; 32], expires_ms: i64) -> Result<(), MetaError>;
    /// Deletes a join token by its hash, answering its expiry if it existed.
    fn take_join_token(&mut self, hash: &[u8; 32]) -> Result<Option<i64>, MetaError>;

    /// The row number of a global principal (a grid identity's name), if known.
    fn principal(&mut self, name: &str) -> Result<Option<u32>, MetaError>;
    /// Adds a principal; returns its row number (1, 2, ...; never reused).
    fn add_principal(&mut self, name: &str) -> Result<u32, MetaError>;
}

/// A backend's one write connection, driven by the shared group commit in `engine`.
/// Between `begin` and `commit` (or `rollback`) `txn` runs row operations inside it.
pub trait WriteConn: Send {
    /// Starts a write transaction; with `durable`, its commit is on disk when it returns.
    fn begin(&mut self, durable: bool) -> Result<(), MetaError>;
    /// Marks a point the transaction can return to (one level; never nested).
    fn savepoint(&mut self) -> Result<(), MetaError>;
    /// Undoes everything since `savepoint` and forgets it.
    fn rollback_to_savepoint(&mut self) -> Result<(), MetaError>;
    /// Keeps everything since `savepoint` and forgets it.
    fn release_savepoint(&mut self) -> Result<(), MetaError>;
    /// Commits the transaction.
    fn commit(&mut self) -> Result<(), MetaError>;
    /// Abandons the transaction (also after a failed `commit`).
    fn rollback(&mut self) -> Result<(), MetaError>;
    /// The row operations, inside the open transaction.
    fn txn(&mut self) -> &mut dyn Txn;
    /// The next transaction runs alone among the database's writers (one that kept
    /// losing serialization conflicts to other metas' writers, so that it wins within
    /// a bounded number of tries). A backend with a single writer has nothing to do.
    fn run_alone_next(&mut self) {}
}

/// One read operation, run on a consistent snapshot. A backend may run it more than
/// once (a first try without a transaction, then again in one): only the last run counts.
pub type ReadOp<'a> = &'a mut dyn FnMut(&mut dyn Txn) -> Result<(), MetaError>;

/// A backend's read connection; the shared read pool gives each one its own thread.
pub trait ReadConn: Send {
    /// Runs `op` on a consistent snapshot.
    fn snapshot(&mut self, op: ReadOp<'_>) -> Result<(), MetaError>;
}

/// What a backend hands to the shared engine: its write connection and its read
/// connections (how many readers run at once is the backend's choice).
pub struct Backend {
    /// The identity the database was formatted with; fixed for its lifetime.
    pub cluster_id: String,
    /// A random secret kept in the database, the same for every meta over it
    /// (capability keys derive from it); it never leaves meta.
    pub cluster_secret: [u8; 32],
    /// The single write connection; the engine serialises and group-commits writes on it.
    pub writer: Box<dyn WriteConn>,
    /// Read connections, lent to one read at a time.
    pub readers: Vec<Box<dyn ReadConn>>,
    /// Reads are local and take microseconds (an embedded database, or a PostgreSQL
    /// server on this machine): a point read may then run inline on an async worker.
    /// A backend whose reads cross a network says `false`, and every read runs off the
    /// runtime's workers.
    pub local_reads: bool,
    /// A plain write commits in microseconds (an embedded database) and may run inline
    /// on an async worker. A server's commit may wait on anything (a synchronous standby,
    /// a lock), so PostgreSQL says `false` and its writes run off the workers.
    pub local_writes: bool,
    /// The writer's lease on the primary role (PostgreSQL with `--lease-ms`), which
    /// the meta service renews.
    pub lease: Option<std::sync::Arc<dyn WriterLease>>,
    /// The epoch of the primary role this meta serves, read when it opened the
    /// database (always 1 for SQLite); told to nodes and put in capabilities.
    pub epoch: u64,
    /// This open formatted the database: the cluster is new (its first settings, such
    /// as `MetaConfig::root_policy`, are made now and never again).
    pub formatted: bool,
    /// Where commits are in the primary's log, for a backend whose metas may read at a
    /// hot standby (PostgreSQL); `None` where every meta reads what it wrote (SQLite).
    pub positions: Option<std::sync::Arc<dyn CommitPositions>>,
    /// Opens a connection for transactions spanning engines (`TwoPhaseConn`): a
    /// backend with prepared transactions (PostgreSQL) has one, SQLite none.
    pub two_phase: Option<TwoPhaseOpener>,
}

/// Opens a `TwoPhaseConn` to a backend's primary.
pub type TwoPhaseOpener = Box<dyn Fn() -> Result<Box<dyn TwoPhaseConn>, MetaError> + Send + Sync>;

/// A connection to a database's primary for one part of a transaction that spans
/// engines (a rename or link between metadata homes, `crate::cross`): its writes are
/// prepared (two-phase commit) and committed or rolled back once the coordinating
/// engine has decided. Behind a trait so that `cross` never names the backend.
pub trait TwoPhaseConn: Send {
    /// Starts a serializable transaction, refused (`MetaError::Fenced`) unless the
    /// database is still at `epoch` (a home that moved or failed over since this meta
    /// opened it); the epoch's row stays locked until the transaction ends, so that a
    /// move's fence waits for a prepared transaction to be decided.
    fn begin(&mut self, epoch: u64) -> Result<(), MetaError>;
    /// The row operations, inside the open transaction.
    fn txn(&mut self) -> &mut dyn Txn;
    /// The notifications, from `sender`, that name the rows the open transaction
    /// wrote, for the metas that keep rows: sent by `commit_prepared_and_notify` or
    /// `notify` once it commits, and kept meanwhile (in the decision) for recovery.
    fn notifications(&self, sender: &str) -> Vec<String>;
    /// Prepares the open transaction under `gid` (PREPARE TRANSACTION): it survives a
    /// crash of anyone, and waits for `finish`.
    fn prepare(&mut self, gid: &str) -> Result<(), MetaError>;
    /// Commits the open transaction; answers where the commit is in the log.
    fn commit(&mut self) -> Result<u64, MetaError>;
    /// Abandons the open transaction, if any.
    fn rollback(&mut self) -> Result<(), MetaError>;
    /// Commits (or rolls back) the prepared transaction `gid`; `false` if no such
    /// transaction is prepared (already finished by someone else).
    fn finish(&mut self, gid: &str, commit: bool) -> Result<bool, MetaError>;
    /// `finish(gid, true)` and `notify(payloads)` in one round trip (a `gid` no longer
    /// prepared fails).
    fn commit_prepared_and_notify(&mut self, gid: &str, payloads: &[String]) -> Result<u64, MetaError>;
    /// Tells the metas that keep rows of this database in memory that the rows named
    /// by `payloads` changed (`kept`'s notifications); answers where the log is now.
    fn notify(&mut self, payloads: &[String]) -> Result<u64, MetaError>;
    /// The prepared transactions of this database whose gid starts with `prefix` and
    /// that were prepared at least `age` ago.
    fn in_doubt(&mut self, prefix: &str, age: std::time::Duration) -> Result<Vec<String>, MetaError>;
}

/// Read-your-writes across metas over one primary: a meta that forwards a write to
/// the meta at the primary's site (`MetaRequest::Forward`) learns where it was
/// committed in the primary's log, and its own reads must not answer from before it.
pub trait CommitPositions: Send + Sync {
    /// The log position of this meta's latest flushed commit (every durable commit
    /// publishes it).
    fn latest(&self) -> u64;
    /// Another meta committed a write for this meta's clients at `position`: reads
    /// wait for it (at a standby), and, if it may have changed inodes or entries
    /// (`namespace`), nothing kept from before is answered.
    fn committed_elsewhere(&self, position: u64, namespace: bool);
}

/// What a writer's lease on the primary role is taken with (PostgreSQL; SQLite has no
/// failover and ignores it).
#[derive(Clone, Debug)]
pub struct LeaseTerms {
    /// Who holds it (one name per meta process).
    pub holder: String,
    /// How long it lasts without a renewal.
    pub duration: std::time::Duration,
    /// The metadata RPO under asynchronous replication: writes are refused once no
    /// standby has confirmed what this primary wrote this long ago, so that a failover
    /// to a standby loses at most this much of acknowledged writing.
    pub rpo: Option<std::time::Duration>,
}

/// A writer's lease on the primary role of its database: while it holds, the backend
/// accepts writes; once a renewal has failed for the lease's whole duration, every
/// write is refused (`MetaError::Fenced`). Behind a trait so that the engine and the
/// service, which hold and renew it, never name the backend that grants it.
pub trait WriterLease: Send + Sync {
    /// The epoch of the primary role the lease belongs to.
    fn epoch(&self) -> i64;
    /// How long the lease lasts.
    fn duration(&self) -> std::time::Duration;
    /// How often the renewal worker renews it: a third of its duration, and a quarter
    /// of the metadata RPO when there is one (each renewal also asks how far the
    /// standbys are).
    fn renew_every(&self) -> std::time::Duration;
    /// Extends the lease (blocking); refused for good once the epoch moved on.
    fn renew(&self) -> Result<(), MetaError>;
    /// Whether writes are accepted now (the last renewal is recent enough).
    fn held(&self) -> bool;
    /// Refuses a write now (`MetaError::Fenced`, saying why): the lease ran out, or
    /// the standbys are further behind than the metadata RPO.
    fn check(&self) -> Result<(), MetaError>;
    /// How far behind the standbys are, as the age of the newest moment up to which a
    /// standby had everything this primary wrote (`None`: no standby has reported).
    fn standby_behind(&self) -> Option<std::time::Duration>;
}

/// `Txn::drop_open` by reading the record and writing it back.
pub fn drop_open_read<T: Txn + ?Sized>(t: &mut T, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
    let o = t.get_open(session, ino)?;
    if o.count > 0 {
        t.put_open(session, ino, OpenRow { count: o.count - 1, ..o })?;
    }
    Ok(())
}
