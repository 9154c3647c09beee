//! The control-path protocol: what clients, nodes and the CLI ask of `locus meta`.
//! Meta never carries file data; it hands out extents and chunk locations.

use crate::error::WireError;
use crate::policy::{EffectivePolicy, Policy, ReplicationLag, ShortfallPage};
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
pub struct AttrChanges {
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
    /// The storing node's proof that this client put it (`cap::Receipt`); meta
    /// requires it from a client with a certificate. `None` in nodes' reports.
    pub receipt: Option<crate::cap::Receipt>,
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

/// How a file is opened (`O_RDONLY`, `O_WRONLY`, `O_RDWR`); meta checks the matching
/// permission and remembers a write open, so writes through it outlive a later chmod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OpenAccess {
    pub read: bool,
    pub write: bool,
}

/// A request to meta as it travels: the request and, for a client acting for one of
/// its users, that user's credentials. Meta checks every permission against them (as
/// mapped for the peer's site); `None` is the client host itself (its root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaCall {
    pub caller: Option<Caller>,
    /// The site whose numbering `caller` uses; meta believes it only when TLS is
    /// disabled (otherwise the peer's certificate names the site).
    pub site: Option<String>,
    pub request: MetaRequest,
    /// From a node: the highest epoch of the primary role it has seen. A meta of an
    /// older epoch learns from it that it lost the primary role, refuses the request
    /// and, from then on, every write (failover fencing). Meta believes it only from a
    /// node or meta certificate (or without TLS).
    pub epoch: Option<u64>,
    /// The `caller`'s login (`locus login`), where its mount has one: at a site whose
    /// users must prove themselves, meta acts for a uid only with its token.
    pub token: Option<crate::cap::UserToken>,
}

impl From<MetaRequest> for MetaCall {
    /// A request that acts for no particular user.
    fn from(request: MetaRequest) -> MetaCall {
        MetaCall { caller: None, site: None, request, epoch: None, token: None }
    }
}

/// The longest login meta grants (`Login`): a week, as a grid proxy's usual bound.
pub const MAX_LOGIN_SECS: u64 = 7 * 24 * 3600;

/// A typed request with what travels beside it (the fields of `MetaCall`): a client
/// acting for one of its users sends `Envelope::as_user`, a node `Envelope::at_epoch`.
#[derive(Debug, Clone)]
pub struct Envelope<M> {
    pub caller: Option<Caller>,
    pub site: Option<String>,
    pub epoch: Option<u64>,
    pub token: Option<crate::cap::UserToken>,
    pub request: M,
}

impl<M> Envelope<M> {
    /// On behalf of `caller`, a user numbered as at `site`.
    pub fn as_user(caller: Caller, site: String, request: M) -> Self {
        Envelope { caller: Some(caller), site: Some(site), epoch: None, token: None, request }
    }

    /// For nobody in particular (the client host itself, as a bare request).
    pub fn plain(request: M) -> Self {
        Envelope { caller: None, site: None, epoch: None, token: None, request }
    }

    /// From a node that has seen `epoch` of the primary role (at most).
    pub fn at_epoch(epoch: u64, request: M) -> Self {
        Envelope { caller: None, site: None, epoch: Some(epoch), token: None, request }
    }

    /// With the caller's login (`UserToken`).
    pub fn with_token(self, token: Option<crate::cap::UserToken>) -> Self {
        Envelope { token, ..self }
    }
}

impl<M: MetaMessage> crate::Call for Envelope<M> {
    type Wire = MetaCall;
    type Answer = MetaResult;
    type Output = M::Response;

    fn into_wire(self) -> MetaCall {
        MetaCall {
            caller: self.caller,
            site: self.site,
            request: self.request.into(),
            epoch: self.epoch,
            token: self.token,
        }
    }

    fn output(answer: MetaResult) -> Result<M::Response, WireError> {
        <M as crate::Call>::output(answer)
    }
}

/// What meta asks of a client on the client's own connection (server push).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaPush {
    /// The client's background workers, for `locus status`.
    Workers,
}

/// A client's answer to a `MetaPush`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PushAnswer {
    Workers(Vec<WorkerStatus>),
}

/// A request to meta and the type of its answer, so the compiler checks that a caller
/// gets what the handler returns (the shape of Garage's `Message` with its `Response`).
pub trait MetaMessage: Into<MetaRequest> {
    /// What a successful answer carries.
    type Response: Into<MetaReply> + TryFrom<MetaReply, Error = MetaReply>;
    /// Which request this is (for what a caller decides before sending it).
    const KIND: MetaRequestKind;
    /// The session the request acts in (`None` for requests without one), so that a
    /// caller whose session meta forgot (`ErrorCode::SessionUnknown`) can put the new
    /// one in and send the request again.
    fn session_mut(&mut self) -> Option<&mut SessionId>;
}

impl<M: MetaMessage> crate::Call for M {
    type Wire = MetaCall;
    type Answer = MetaResult;
    type Output = M::Response;

    fn into_wire(self) -> MetaCall {
        MetaCall::from(self.into())
    }

    fn output(answer: MetaResult) -> Result<M::Response, WireError> {
        M::Response::try_from(answer?).map_err(|other| {
            WireError::new(crate::error::ErrorCode::Internal, format!("meta answered with an unexpected {other:?}"))
        })
    }
}

/// How a request touches meta's store: the engine and service schedule it by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A read; `point` when it touches a few rows by key (it may run inline on an
    /// async worker when the backend's reads are local).
    Read { point: bool },
    /// A write; a `durable` one is on disk before it is answered.
    Write { durable: bool },
    /// Answered by the service itself (worker reports kept in its memory, the
    /// revocation list, logins).
    Reports,
}

/// Which capabilities an answer carries (meta checked the permission behind each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grants {
    /// Read capabilities for the chunks of the file's extents.
    pub read: bool,
    /// A put capability for new chunks.
    pub put: bool,
}

/// Whom a request says its peer is, beyond its role: meta holds it against the peer's
/// certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim<'a> {
    None,
    /// A node's own request: the certificate must be this node's (its name is the node
    /// id), and at this site when one is named.
    Node {
        id: &'a str,
        site: Option<&'a str>,
    },
    /// A node's own request that names no node: any node certificate.
    AnyNode,
    /// A session opened at this site: the certificate's site.
    Site(&'a str),
}

/// What meta does with a request, stated once per request in the table below: no
/// other code decides these by matching on requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    pub access: Access,
    /// The certificate roles that may make it (least privilege).
    pub roles: &'static [Role],
    /// Whether it may change any directory's attributes (its entries, times, link
    /// count, mode, owner or xattrs). A client's copy of a directory's attributes from
    /// an answer stays fresh while only requests that cannot are sent
    /// (`client::Vfs::fresh_dir_attr`).
    pub changes_dirs: bool,
    /// Whether it is an administrative action, written to meta's audit log.
    pub audited: bool,
}

/// The one table of requests: each becomes a struct, a variant of `MetaRequest` and a
/// `MetaMessage` with its answer type, and states its facts: `access` (`point_read`,
/// `scan`, `write`, `durable` or `reports`), the `roles` that may make it, whether it
/// `changes_dirs`, and where it is so: whether it is `audited`, the `session` it acts
/// for (`required` or `optional`, its field `session`), the field of `chunks` it binds
/// to a file (each needing a receipt), the capabilities it `grants` (`read`, or
/// `by_access` its `access` field) and its `claim` on the peer's identity.
macro_rules! meta_requests {
    (@access point_read) => { Access::Read { point: true } };
    (@access scan) => { Access::Read { point: false } };
    (@access write) => { Access::Write { durable: false } };
    (@access durable) => { Access::Write { durable: true } };
    (@access reports) => { Access::Reports };
    (@flag) => { false };
    (@flag $b:literal) => { $b };
    (@session $m:ident) => { None };
    (@session $m:ident required) => { Some($m.session) };
    (@session $m:ident optional) => { $m.session };
    (@session_mut $m:ident) => { None };
    (@session_mut $m:ident required) => { Some(&mut $m.session) };
    (@session_mut $m:ident optional) => { $m.session.as_mut() };
    (@chunks $m:ident) => { &[] };
    (@chunks $m:ident $f:ident) => { &$m.$f };
    (@grants $m:ident) => { Grants::default() };
    (@grants $m:ident read) => { Grants { read: true, put: false } };
    (@grants $m:ident by_access) => { Grants { read: $m.access.read, put: $m.access.write } };
    (@claim $m:ident) => { Claim::None };
    (@claim $m:ident any_node) => { Claim::AnyNode };
    (@claim $m:ident node($($id:ident).+)) => { Claim::Node { id: &$m.$($id).+, site: None } };
    (@claim $m:ident node_at($($id:ident).+, $($site:ident).+)) => {
        Claim::Node { id: &$m.$($id).+, site: Some(&$m.$($site).+) }
    };
    (@claim $m:ident site($($site:ident).+)) => { Claim::Site(&$m.$($site).+) };
    ($( $(#[$doc:meta])* $name:ident { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } => $resp:ty {
        access: $access:ident,
        roles: [$($role:ident),*],
        changes_dirs: $dirs:literal
        $(, audited: $audited:literal)?
        $(, session: $session:ident)?
        $(, chunks: $chunks:ident)?
        $(, grants: $grants:ident)?
        $(, claim: $($claim:tt)+)?
    }; )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            pub struct $name { $( $(#[$fdoc])* pub $field: $ty, )* }

            impl MetaMessage for $name {
                type Response = $resp;
                const KIND: MetaRequestKind = MetaRequestKind::$name;
                fn session_mut(&mut self) -> Option<&mut SessionId> {
                    let _m = self;
                    meta_requests!(@session_mut _m $($session)?)
                }
            }
        )*

        request_enum! {
            /// Every request to `locus meta` as it travels. Names (`name`) are single path
            /// components in raw bytes.
            MetaRequest,
            /// Which request a `MetaMessage` is, without its fields.
            MetaRequestKind,
            RequestFacts;
            $( $(#[$doc])* $name, )*
        }

        impl MetaRequestKind {
            /// The request's facts, as the table states them.
            pub fn facts(self) -> &'static RequestFacts {
                use Role::*;
                match self {
                    $( MetaRequestKind::$name => &RequestFacts {
                        access: meta_requests!(@access $access),
                        roles: &[$($role),*],
                        changes_dirs: $dirs,
                        audited: meta_requests!(@flag $($audited)?),
                    }, )*
                }
            }
        }

        impl MetaRequest {
            /// The session a request says it acts for, if it names one. Meta holds it
            /// against the session bound to the connection (see `net::Peer::session`).
            #[allow(unused_variables)]
            pub fn claimed_session(&self) -> Option<SessionId> {
                match self {
                    $( MetaRequest::$name(m) => meta_requests!(@session m $($session)?), )*
                }
            }

            /// The chunks a client asks meta to bind to a file: each needs the storing
            /// node's receipt (`cap::Receipt`), checked by meta before the request runs.
            #[allow(unused_variables)]
            pub fn bound_chunks(&self) -> &[StoredChunk] {
                match self {
                    $( MetaRequest::$name(m) => meta_requests!(@chunks m $($chunks)?), )*
                }
            }

            /// Which capabilities meta adds to the answer.
            #[allow(unused_variables)]
            pub fn grants(&self) -> Grants {
                match self {
                    $( MetaRequest::$name(m) => meta_requests!(@grants m $($grants)?), )*
                }
            }

            /// Whom the request says its peer is (`Claim`).
            #[allow(unused_variables)]
            pub fn claim(&self) -> Claim<'_> {
                match self {
                    $( MetaRequest::$name(m) => meta_requests!(@claim m $($($claim)+)?), )*
                }
            }
        }
    };
}

meta_requests! {
    /// First request on every connection.
    Hello {
        protocol: u32,
        session: SessionInfo,
    } => Welcome { access: write, roles: [Client, Meta], changes_dirs: true, claim: site(session.site) };
    /// Keeps a session (its locks and open files) alive.
    Heartbeat {
        session: SessionId,
    } => () { access: write, roles: [Client, Meta], changes_dirs: false, session: required };
    /// Ends a session, dropping its locks and open-file records.
    Goodbye {
        session: SessionId,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true, session: required };
    /// The attributes of `name` in directory `parent`.
    Lookup {
        parent: InodeId,
        name: Vec<u8>,
    } => Attr { access: point_read, roles: [Client, Admin, Meta], changes_dirs: false };
    /// The attributes of an inode.
    GetAttr {
        ino: InodeId,
    } => Attr { access: point_read, roles: [Client, Admin, Meta], changes_dirs: false };
    /// chmod, chown, truncate, utimens: the fields of `set` that are `Some`.
    SetAttr {
        ino: InodeId,
        set: AttrChanges,
        /// For a change through an open file (ftruncate): the session whose open for
        /// writing allows a truncation without write permission now.
        session: Option<SessionId>,
    } => Attr { access: write, roles: [Client, Meta], changes_dirs: true, session: optional };
    /// mknod/mkdir/symlink/create. With `exclusive` false an existing regular file is
    /// returned instead of `Exists`.
    Create {
        parent: InodeId,
        name: Vec<u8>,
        node: NewNode,
        /// The mode asked for, before the umask.
        mode: u32,
        /// The creator's umask: meta applies it unless the directory has a default ACL,
        /// which then decides instead (as Linux does on a file system with ACLs).
        umask: u32,
        exclusive: bool,
    } => Made { access: write, roles: [Client, Meta], changes_dirs: true };
    /// `Create` of a regular file that also records it as open by `session` (create and
    /// open in one request).
    CreateOpen {
        create: Create,
        session: SessionId,
        /// Checked only when the file already exists (a new file's creator may write it).
        access: OpenAccess,
    } => Opened { access: write, roles: [Client, Meta], changes_dirs: true, session: required, grants: by_access };
    /// A new name for an existing inode (hard link).
    Link {
        ino: InodeId,
        new_parent: InodeId,
        new_name: Vec<u8>,
    } => Attr { access: write, roles: [Client, Meta], changes_dirs: true };
    /// Removes a non-directory name. An inode whose last link goes while a session
    /// has it open lives on as an orphan until `Release`.
    Unlink {
        parent: InodeId,
        name: Vec<u8>,
    } => Unlinked { access: write, roles: [Client, Meta], changes_dirs: true };
    /// Removes an empty directory; answers the parent directory's attributes as the
    /// removal left them (see `Unlinked::parent`).
    Rmdir {
        parent: InodeId,
        name: Vec<u8>,
    } => Attr { access: write, roles: [Client, Meta], changes_dirs: true };
    /// `rename(2)` in any of its modes.
    Rename {
        parent: InodeId,
        name: Vec<u8>,
        new_parent: InodeId,
        new_name: Vec<u8>,
        mode: RenameMode,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true };
    /// A symlink's target.
    ReadLink {
        ino: InodeId,
    } => Vec<u8> { access: point_read, roles: [Client, Meta], changes_dirs: false };
    /// Entries with cookie greater than `after`, in cookie order, at most `limit`.
    ReadDir {
        ino: InodeId,
        after: u64,
        limit: u32,
    } => Vec<DirEntry> { access: scan, roles: [Client, Admin, Meta], changes_dirs: false };
    /// One extended attribute's value.
    GetXattr {
        ino: InodeId,
        name: Vec<u8>,
    } => Vec<u8> { access: point_read, roles: [Client, Meta], changes_dirs: false };
    /// Sets an extended attribute (create or replace as `mode` says).
    SetXattr {
        ino: InodeId,
        name: Vec<u8>,
        value: Vec<u8>,
        mode: XattrMode,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true };
    /// The names of an inode's extended attributes.
    ListXattr {
        ino: InodeId,
    } => Vec<Vec<u8>> { access: point_read, roles: [Client, Meta], changes_dirs: false };
    /// Removes an extended attribute.
    RemoveXattr {
        ino: InodeId,
        name: Vec<u8>,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true };
    /// Capacity, usage and inode count for `statfs(2)`.
    StatFs {} => FsStats { access: scan, roles: [Client, Admin, Meta], changes_dirs: false };
    /// Records that `session` has `ino` open and returns its attributes and extents
    /// (close-to-open: the open sees every close that finished before it).
    Open {
        ino: InodeId,
        session: SessionId,
        truncate: bool,
        access: OpenAccess,
    } => Opened { access: write, roles: [Client, Meta], changes_dirs: true, session: required, grants: by_access };
    /// Drops one open record; reclaims an orphan nobody has open any more.
    Release {
        ino: InodeId,
        session: SessionId,
    } => () { access: write, roles: [Client, Meta], changes_dirs: false, session: required };
    /// Current extents of a file (for readers that hold it open).
    Extents {
        ino: InodeId,
    } => Opened { access: scan, roles: [Client, Meta], changes_dirs: false, grants: read };
    /// Atomically maps the given extents into the file (later ones win), records where
    /// their chunks are stored, and raises the size to at least `min_size`.
    CommitWrite {
        ino: InodeId,
        /// The session that has the file open for writing (or the caller needs write
        /// permission now).
        session: SessionId,
        extents: Vec<Extent>,
        chunks: Vec<StoredChunk>,
        min_size: u64,
        mtime: Timestamp,
    } => Attr { access: durable, roles: [Client, Meta], changes_dirs: true, session: required, chunks: chunks };
    /// `fallocate(2)` in one of the modes Locus supports.
    Fallocate {
        ino: InodeId,
        session: SessionId,
        offset: u64,
        len: u64,
        mode: AllocateMode,
    } => Attr { access: durable, roles: [Client, Meta], changes_dirs: true, session: required };
    /// Swaps fragmented extents for ones holding the same bytes in fewer chunks; refused
    /// (`Stale`) if the file's `data_version` is no longer the one the compactor read.
    Compact {
        ino: InodeId,
        session: SessionId,
        data_version: u64,
        extents: Vec<Extent>,
        chunks: Vec<StoredChunk>,
    } => Attr { access: durable, roles: [Client, Meta], changes_dirs: true, session: required, chunks: chunks };
    /// Makes every change acknowledged so far durable on meta's disk (fsync, fsyncdir).
    SyncAll {} => () { access: durable, roles: [Client, Meta], changes_dirs: true };
    /// F_GETLK: the first conflicting lock, if any.
    GetLock {
        session: SessionId,
        lock: LockRange,
    } => Option<LockRange> { access: point_read, roles: [Client, Meta], changes_dirs: false, session: required };
    /// F_SETLK: `WouldBlock` on conflict (blocking callers retry).
    SetLock {
        session: SessionId,
        lock: LockRange,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true, session: required };
    /// Drops every lock `owner` of `session` holds on `ino` (close).
    ReleaseLocks {
        session: SessionId,
        ino: InodeId,
        owner: u64,
    } => () { access: write, roles: [Client, Meta], changes_dirs: true, session: required };
    /// A node announces itself and its capacity; repeated as its heartbeat. Answered
    /// with `Registered`.
    RegisterNode {
        node: NodeInfo,
        /// The cluster the node belongs to; `None` before its first registration
        /// (it then adopts the id meta answers with).
        cluster_id: Option<String>,
    } => Registered { access: write, roles: [Node, Meta], changes_dirs: true, claim: node_at(node.id, node.site) };
    /// Every registered node with its last report.
    ListNodes {} => Vec<NodeInfo> { access: scan, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// Where these chunks are stored, for readers and fsck.
    ChunkLocations {
        ids: Vec<ChunkId>,
        /// From a client: its read capability for each id, in order; meta answers a
        /// client only about chunks it may read (else whether a chunk exists, its size
        /// and holders would tell anyone whether some file holds known content). Nodes
        /// and tools send none.
        caps: Vec<Option<crate::cap::Cap>>,
    } => Vec<ChunkRecord> { access: scan, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// Catalogue page after `after` (exclusive), for fsck and gc.
    ListChunks {
        after: Option<ChunkId>,
        limit: u32,
    } => Vec<ChunkRecord> { access: scan, roles: [Admin, Meta], changes_dirs: false };
    /// Every extent, paged by (inode, offset), for fsck.
    ListExtents {
        after: Option<(InodeId, u64)>,
        limit: u32,
    } => Vec<(InodeId, Extent)> { access: scan, roles: [Admin, Meta], changes_dirs: false };
    /// Of these chunk ids, the ones no extent references (gc candidates).
    Unreferenced {
        ids: Vec<ChunkId>,
    } => Garbage { access: scan, roles: [Node, Admin, Meta], changes_dirs: false };
    /// Removes catalogue entries of chunks gc deleted; refuses referenced ones.
    ForgetChunks {
        ids: Vec<ChunkId>,
    } => () { access: write, roles: [Node, Admin, Meta], changes_dirs: true, audited: true };
    /// A node now holds (`added`) or no longer holds (`removed`) copies of these chunks
    /// in its site cache, so other sites can find the nearest copy; cached copies are
    /// recorded as such and never count towards a policy, and `removed` takes only a
    /// cached copy (a replica on that node stays). An added chunk that names nodes
    /// reports replicas its replication made on those nodes (turning a cached copy
    /// there into a replica).
    UpdateLocations {
        node: NodeId,
        added: Vec<StoredChunk>,
        removed: Vec<ChunkId>,
    } => () { access: write, roles: [Node, Meta], changes_dirs: true, claim: node(node) };
    /// Everything `locus status` shows.
    Status {} => ClusterStatus { access: scan, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// Sets (`Some`) or clears (`None`) a directory's replication policy; answers the
    /// warnings an operator should see (a site with fewer nodes than copies).
    SetPolicy {
        ino: InodeId,
        policy: Option<Policy>,
    } => Vec<String> { access: write, roles: [Admin, Meta], changes_dirs: true, audited: true };
    /// The policy that applies to an inode: its own, the nearest ancestor's, or the default.
    GetPolicy {
        ino: InodeId,
    } => EffectivePolicy { access: scan, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// Every directory that sets a policy, with its policy.
    ListPolicies {} => Vec<(InodeId, Policy)> { access: scan, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// Drains a node (or stops draining it): it takes no new chunks and its copies stop
    /// counting, so the repair workers copy them to other nodes.
    DrainNode {
        node: NodeId,
        drained: bool,
    } => () { access: write, roles: [Admin, Meta], changes_dirs: true, audited: true };
    /// Chunks whose live copies fall short of their policy, scanning the extents after
    /// `after` (a page of `limit` extents). With `node`, only the chunks that node is
    /// to repair: at each short site the first live holder there, and for a short
    /// site without any copy the first live holder anywhere.
    UnderReplicated {
        node: Option<NodeId>,
        after: Option<(InodeId, u64)>,
        limit: u32,
    } => ShortfallPage { access: scan, roles: [Node, Admin, Meta], changes_dirs: false };
    /// The copies a node still owes other nodes, sent with its heartbeat; meta keeps
    /// the latest report in memory for `locus status`.
    ReportLag {
        node: NodeId,
        lag: Vec<ReplicationLag>,
    } => () { access: reports, roles: [Node, Meta], changes_dirs: true, claim: node(node) };
    /// What a node's background workers are doing, sent with its heartbeat; meta keeps
    /// the latest report in memory for `locus status` (clients are asked instead, by a
    /// `MetaPush::Workers` on their own connection).
    ReportWorkers {
        /// The reporting process as status shows it, e.g. `node n1`.
        process: String,
        workers: Vec<WorkerStatus>,
    } => () { access: reports, roles: [Node, Meta], changes_dirs: true, claim: any_node };
    /// The certificates meta's revocation list names; nodes and clients ask with
    /// every heartbeat and drop connections of the peers it names.
    Revocations {} => RevocationList { access: reports, roles: [Client, Node, Admin, Meta], changes_dirs: false };
    /// A person proves their principal with their own certificate (a `user` one) and
    /// gets a token saying who they are at their site (`locus login`).
    Login {
        /// Asked lifetime; meta grants at most `MAX_LOGIN_SECS`.
        lifetime_secs: u64,
    } => crate::cap::UserToken { access: reports, roles: [User], changes_dirs: false, audited: true };
    /// Admits a node id (`locus node admit`): its registrations are accepted from now
    /// on, also after an earlier `RemoveNode`.
    AdmitNode {
        node: NodeId,
    } => () { access: durable, roles: [Admin], changes_dirs: true, audited: true };
    /// Removes a node (`locus node remove`, after its chunks were copied elsewhere):
    /// deletes its row and its chunk locations and refuses its future registrations.
    RemoveNode {
        node: NodeId,
    } => () { access: durable, roles: [Admin], changes_dirs: true, audited: true };
    /// Makes a single-use join token (`locus node token --ttl 1h`); meta keeps only its
    /// hash, until it is used or expires.
    MakeJoinToken {
        ttl_secs: u64,
    } => JoinToken { access: durable, roles: [Admin], changes_dirs: true, audited: true };
    /// A node not yet admitted spends a join token to admit itself (a removed node
    /// cannot: that takes `locus node admit`).
    JoinNode {
        node: NodeId,
        token: String,
    } => () { access: durable, roles: [Node, Meta], changes_dirs: true, claim: node(node) };
    /// A write that a meta at another site forwards to the meta at the primary's site
    /// (`locus meta --forward-writes-to`): committed there in one round trip instead of
    /// statement by statement across the WAN, and answered with where the commit is in
    /// the primary's log, so that the forwarding meta's clients read their own writes at
    /// its standby. The request travels encoded (`frame::encode_payload`), so that a
    /// forward cannot nest another.
    Forward {
        /// The cluster the forwarding meta serves: a meta of another one (an operator's
        /// wrong address) refuses, rather than writing into its own namespace.
        cluster: String,
        /// Whom the write acts for, as the forwarding meta resolved it.
        caller: Caller,
        /// The name the client's certificate proved (a session remembers its owner).
        certificate: Option<String>,
        /// Whether the client may see the whole cluster (anyone but a client certificate).
        oversees: bool,
        /// The site of the forwarding meta, whose writes count towards moving the
        /// home there (`locus meta --auto-move-after`); empty when it has none.
        site: String,
        /// The `MetaRequest`, encoded.
        request: Vec<u8>,
        /// Where the forwarding meta's own view of each home's engine is (its latest
        /// commit, or one committed for it elsewhere), by home number: the write reads
        /// what the client already saw, e.g. its session just opened at another home's
        /// engine, at no older a position.
        positions: Vec<(u16, u64)>,
    } => Forwarded { access: durable, roles: [Meta], changes_dirs: true };
    /// Makes directory `name` in `parent` the root of metadata home `home` (`locus home
    /// create`): it and everything made below it commit in that home's engine.
    MakeJunction {
        parent: InodeId,
        name: Vec<u8>,
        home: String,
        mode: u32,
    } => Attr { access: durable, roles: [Admin, Meta], changes_dirs: true, audited: true };
    /// Every metadata home: its number, its name and the root of each of its subtrees.
    ListHomes {} => Vec<HomeInfo> { access: scan, roles: [Client, Admin, Meta], changes_dirs: false };
    /// Moves a metadata home to another site (`locus home move NAME --to SITE`): its
    /// writes commit at that site's PostgreSQL primary from then on. Any meta takes
    /// it; the destination site's meta carries it out.
    MoveHome {
        home: String,
        to_site: String,
        /// Why, for the home's record of moves (`None`: an operator asked).
        reason: Option<String>,
    } => HomeMoved { access: durable, roles: [Admin, Meta], changes_dirs: true, audited: true };
    /// A move's first step, from the destination's meta to the meta holding the home,
    /// once the home's new database (at `site`) is made: that meta opens it while the
    /// home's writes go on, to take it up at once at the end, and answers once open.
    PrepareHome {
        cluster: String,
        home: u16,
        site: String,
        database: String,
    } => () { access: durable, roles: [Meta], changes_dirs: false };
    /// A move's second step: the meta holding the home stops committing its writes
    /// (they wait), fences its primary and answers where the fence is in that
    /// primary's log.
    HandOverHome {
        cluster: String,
        home: u16,
    } => HandedOver { access: durable, roles: [Meta], changes_dirs: true };
    /// A move's last step (also after a failed one): the meta that handed the home
    /// over places it as the registry now says and lets its writes go on. `positions`
    /// are the destination's commits (the registry's, the copy's) by home.
    HomeTaken {
        cluster: String,
        home: u16,
        positions: Vec<(u16, u64)>,
    } => () { access: durable, roles: [Meta], changes_dirs: true };
}

/// `MoveHome`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeMoved {
    pub home: String,
    pub from_site: String,
    pub to_site: String,
    /// The home's database at its new site.
    pub database: String,
    /// Rows copied from the old primary's standby at the new site.
    pub rows: u64,
    /// How long the home's writes waited, from the fence to the new primary taking them.
    pub paused_ms: u64,
}

/// `HandOverHome`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedOver {
    /// The fenced primary's new epoch: the home's new primary starts at the next one.
    pub epoch: i64,
    /// Where the fence is in the old primary's log.
    pub position: u64,
}

/// One metadata home as `locus home list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeInfo {
    pub id: u16,
    pub name: String,
    /// Inodes of the junctions whose subtrees the home holds (none for home 0: the root).
    pub junctions: Vec<InodeId>,
    /// Inodes the home's engine holds.
    pub inodes: u64,
    /// The meta the answering meta forwards the home's writes to (`None`: it commits
    /// them itself), so an operator sees which site writes each home.
    pub writer: Option<String>,
    /// Where the home was moved to last (`locus home move`): its site and database,
    /// and how many moves it has made (`None`: never moved; its flags place it).
    pub placement: Option<String>,
    /// The site whose meta commits the home's writes, as the answering meta knows it.
    pub site: Option<String>,
    /// A move of the home in progress, as the answering meta takes part in it.
    pub moving: Option<String>,
    /// The home's latest moves, oldest first.
    pub moves: Vec<MoveRecord>,
    /// The home's writes by the site they came from, over the answering meta's window
    /// for automatic moves (only at the meta that commits them).
    pub recent_writes: Vec<(String, u64)>,
}

/// One past move of a metadata home, as home 0's registry keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// When the move committed, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub from_site: String,
    pub to_site: String,
    /// Rows copied.
    pub rows: u64,
    /// How long the home's writes had waited when the move committed.
    pub paused_ms: u64,
    /// Why: an operator, or what an automatic move saw.
    pub reason: String,
}

/// A join token as `locus node token` prints it once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    pub token: String,
    /// Seconds it stays valid.
    pub ttl_secs: u64,
}

/// Revoked certificate serials (hex) and names, as meta distributes them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationList {
    pub entries: Vec<String>,
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
    /// Directories that set a replication policy.
    pub policies: Vec<(InodeId, Policy)>,
    /// What an operator should act on about replication (too few nodes for a policy).
    pub policy_warnings: Vec<String>,
    /// Copies owed, per reporting node (the latest report of each live node).
    pub lag: Vec<(NodeId, ReplicationLag)>,
    /// Nodes that tried to register without being admitted (kept in meta's memory).
    pub pending: Vec<PendingNode>,
    /// The latest administrative actions, oldest first (empty for a client).
    pub audit: Vec<AuditEntry>,
    /// Where this meta forwards the writes of each home it does not hold (`locus meta
    /// --forward-writes-to`): the home, the meta holding it, and how many writes it has
    /// forwarded there since it started.
    pub forwarding: Vec<(String, String, u64)>,
    /// Meta's wall clock when it answered (milliseconds since the Unix epoch): hosts
    /// compare theirs with it (`locus doctor`), as sessions and leases assume clocks
    /// that agree.
    pub now_ms: i64,
}

/// One administrative action as meta's audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// What the peer's certificate proved (`name (role of site S)`), or that nothing
    /// was (`--insecure-no-tls`).
    pub who: String,
    /// The peer's address.
    pub from: String,
    pub action: String,
    /// `ok`, or the error the peer got.
    pub outcome: String,
}

/// A node that registered without being admitted: what `locus status` shows so an
/// operator can decide on `locus node admit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingNode {
    pub id: NodeId,
    pub site: String,
    /// Where it serves chunks.
    pub addr: String,
    /// Its certificate's name and site (`None` without TLS: nothing proven).
    pub certificate: Option<(String, String)>,
    /// Seconds since its last attempt.
    pub last_seen_secs: u64,
}

/// `statfs` numbers in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
}

/// `Hello`'s answer: the session this client now has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub session: SessionId,
    pub heartbeat_ms: u64,
    /// The cluster this meta serves, created when its database was formatted.
    pub cluster_id: String,
}

/// `RegisterNode`'s answer: the cluster the node now belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub cluster_id: String,
    /// The key meta signs chunk capabilities with, which the node checks them with.
    pub cap_key: Option<crate::cap::CapKey>,
    /// The epoch of the primary role this meta serves (1 on SQLite, which never fails
    /// over; `primary_epoch` on PostgreSQL). The node keeps the highest it has seen
    /// and refuses capabilities and metas of older ones.
    pub epoch: u64,
}

/// `Unreferenced`'s answer: the chunks no extent references, and the epoch of the
/// primary role they were judged under, which every `Delete` of them carries (a node
/// that has seen a newer epoch refuses it: this meta's catalogue may miss files the
/// new primary has).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Garbage {
    pub ids: Vec<ChunkId>,
    pub epoch: u64,
}

/// `Create`'s answer: the node made (or the existing file found) and its parent
/// directory's attributes after the create (see `Unlinked::parent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Made {
    pub attr: Attr,
    pub parent: Attr,
}

/// `Forward`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
    /// The forwarded request's `MetaReply`, encoded.
    pub reply: Vec<u8>,
    /// Where in the primary's log the write was committed (flushed): the forwarding
    /// meta reads at its standby once it has replayed that far.
    pub position: u64,
}

/// `Unlink`'s answer: the inode and whether it lives on as an orphan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlinked {
    pub ino: InodeId,
    pub orphaned: bool,
    /// The parent directory's attributes as the unlink left them (new mtime and
    /// ctime), so a client can answer the kernel's GETATTR of the parent that follows
    /// an unlink without asking again.
    pub parent: Attr,
}

/// A file as an open sees it: attributes and extents at one instant, with the
/// capabilities nodes ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    pub attr: Attr,
    pub extents: Vec<Extent>,
    pub caps: ChunkCaps,
    /// The replication policy the file's chunks are stored under.
    pub policy: Policy,
    /// `CreateOpen`'s answer: the parent directory's attributes as the create left
    /// them, so a client can answer the kernel's GETATTR of the parent that follows a
    /// create without asking again (as `Unlinked::parent`). `None` from `Open`.
    pub parent: Option<Attr>,
    /// `CreateOpen`'s answer: whether this request made the file (false when it found
    /// an existing one, which it opened as `access` says; a new file's creator may
    /// write it whatever its mode).
    pub created: bool,
}

/// Capabilities meta hands out with an open: reading the file's chunks (one per
/// extent, in the order of `extents`, when the caller may read) and putting chunks
/// (when it opened the file for writing).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkCaps {
    pub read: Vec<crate::cap::Cap>,
    pub put: Option<crate::cap::Cap>,
}

reply_enum! {
    /// Successful answers from meta; `MetaMessage::Response` says which one a request gets.
    MetaReply;
    ;
    Welcome(Welcome),
    Registered(Registered),
    Attr(Attr),
    Unlinked(Unlinked),
    Made(Made),
    Bytes(Vec<u8>),
    Names(Vec<Vec<u8>>),
    Entries(Vec<DirEntry>),
    StatFs(FsStats),
    Opened(Opened),
    Lock(Option<LockRange>),
    Nodes(Vec<NodeInfo>),
    Chunks(Vec<ChunkRecord>),
    Extents(Vec<(InodeId, Extent)>),
    Garbage(Garbage),
    Status(ClusterStatus),
    Policy(EffectivePolicy),
    Policies(Vec<(InodeId, Policy)>),
    Warnings(Vec<String>),
    Shortfalls(ShortfallPage),
    Revoked(RevocationList),
    Token(JoinToken),
    Login(crate::cap::UserToken),
    Forwarded(Forwarded),
    Homes(Vec<HomeInfo>),
    HomeMoved(HomeMoved),
    HandedOver(HandedOver),
}

/// The payload of every meta response frame.
pub type MetaResult = Result<MetaReply, WireError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's facts hold together: every request has a role, a person's own
    /// certificate logs in and asks nothing else, an audited request is an action (never
    /// a plain read), and reads change no directory.
    #[test]
    fn the_request_table_is_consistent() {
        assert_eq!(MetaRequestKind::ALL.len(), 58);
        // A forward acts for any user: only a meta certificate may send one.
        assert_eq!(MetaRequestKind::Forward.facts().roles, &[Role::Meta]);
        for kind in MetaRequestKind::ALL {
            let f = kind.facts();
            assert!(!f.roles.is_empty(), "{kind:?} has no role");
            assert_eq!(f.roles.contains(&Role::User), *kind == MetaRequestKind::Login, "{kind:?}");
            assert!(!(f.audited && matches!(f.access, Access::Read { .. })), "{kind:?} is audited but reads");
            assert!(!(f.changes_dirs && matches!(f.access, Access::Read { .. })), "{kind:?} reads but changes dirs");
        }
    }

    #[test]
    fn fields_named_in_the_table_are_the_ones_read() {
        let access = OpenAccess { read: true, write: false };
        let open = MetaRequest::Open(Open { ino: 5, session: 7, truncate: false, access });
        assert_eq!(open.claimed_session(), Some(7));
        assert_eq!(open.grants(), Grants { read: true, put: false });
        let set = AttrChanges::default();
        assert_eq!(MetaRequest::SetAttr(SetAttr { ino: 5, set: set.clone(), session: None }).claimed_session(), None);
        assert_eq!(MetaRequest::SetAttr(SetAttr { ino: 5, set, session: Some(3) }).claimed_session(), Some(3));
        let lag = MetaRequest::ReportLag(ReportLag { node: "n1".into(), lag: Vec::new() });
        assert_eq!(lag.claim(), Claim::Node { id: "n1", site: None });
        assert_eq!(MetaRequest::Extents(Extents { ino: 5 }).grants(), Grants { read: true, put: false });
        assert_eq!(MetaRequest::GetAttr(GetAttr { ino: 5 }).grants(), Grants::default());
    }
}
