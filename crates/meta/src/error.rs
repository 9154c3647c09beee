//! Errors of the metadata service, each carrying the context an operator or a client
//! needs, and their mapping onto the wire's OS-neutral `ErrorCode`.

use proto::error::{ErrorCode, WireError};

/// Everything meta can fail with; converted to a `WireError` at the RPC boundary.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} is not a directory")]
    NotDir(String),
    #[error("{0} is a directory")]
    IsDir(String),
    #[error("directory {0} is not empty")]
    NotEmpty(String),
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("name of {len} bytes is longer than the 255-byte limit")]
    NameTooLong { len: usize },
    #[error("no extended attribute {0}")]
    NoAttribute(String),
    #[error("extended attribute name or value too large: {0}")]
    Range(String),
    #[error("lock conflict: {0}")]
    WouldBlock(String),
    #[error("stale: {0}")]
    Stale(String),
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A backend's own failure, mapped by the backend (`sqlite`, `postgres`) with the
    /// detail its driver gives; conflicts, fencing and timeouts map to their own variants.
    #[error("{backend} metadata database error: {detail}")]
    Database { backend: &'static str, detail: String },
    #[error("serialization conflict: {0}")]
    Conflict(String),
    #[error("cannot connect to the metadata database {url}: {detail}")]
    Connect { url: String, detail: String },
    #[error(
        "metadata database {path} has schema version {found}, newer than the {supported} this \
         binary understands; run a newer locus"
    )]
    SchemaTooNew { path: String, found: i64, supported: i64 },
    #[error("metadata database {path} has unknown schema version {found}")]
    SchemaUnknown { path: String, found: i64 },
    #[error(
        "metadata database {path} {reason}: meta serves only a database it formatted. If this \
         is a new cluster, start meta with --init (`locus meta --init`; `locus up` does it for a \
         new data directory); otherwise check the --db path"
    )]
    NotFormatted { path: String, reason: String },
    #[error(
        "metadata database {path} is in use by another locus meta (it holds {path}.lock); \
         stop that one first"
    )]
    InUse { path: String },
    #[error(
        "metadata database {path} is damaged (integrity check: {detail}); meta refuses to serve \
         it: restore it from a backup"
    )]
    Damaged { path: String, detail: String },
    #[error(
        "PostgreSQL database {url} is not empty ({tables} tables): migrate copies only into an empty \
         database (create a new one with createdb)"
    )]
    TargetNotEmpty { url: String, tables: u64 },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error(
        "cannot open metadata database {url:?}: {reason}; supported: sqlite:///path/to/meta.db, \
         a bare path, or postgres://user@host:port/database"
    )]
    UnsupportedUrl { url: String, reason: String },
    #[error("{0}")]
    WrongCluster(String),
    /// A node registered under an id no operator admitted (it is listed as pending).
    #[error("node {0} is not admitted; run `locus node admit {0}` on the cluster")]
    NotAdmitted(String),
    /// A node registered under an id `locus node remove` removed.
    #[error(
        "node {0} was removed from the cluster (`locus node remove`); its registrations are refused \
         until an operator runs `locus node admit {0}` again"
    )]
    Removed(String),
    /// A join token that was never made, is used up or expired.
    #[error(
        "node {0} offered a join token meta does not know (used already, expired, or never made); make a new \
         one with `locus node token --ttl 1h`, or run `locus node admit {0}` on the cluster"
    )]
    BadJoinToken(String),
    /// The database did not answer a request in time (a stopped or overloaded server,
    /// a dead link): the caller gets ETIMEDOUT after a bounded wait, not a hang.
    #[error(
        "the PostgreSQL metadata database {db} did not answer within {after:?}: the request was cancelled \
         (a write's outcome is unknown; see --db-timeout)"
    )]
    TimedOut { db: String, after: std::time::Duration },
    /// This meta lost the primary role (its lease ran out, or the epoch moved on):
    /// it refuses writes so that none is accepted the new primary does not have.
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("session {0} is unknown (expired or never opened): say Hello again")]
    SessionUnknown(proto::types::SessionId),
    #[error("identity map {path}:{line}: {msg}")]
    IdentityMap { path: String, line: usize, msg: String },
    /// The meta a write was forwarded to refused it; its error as it said it.
    #[error("{}", .0.message)]
    Remote(proto::error::WireError),
    /// Another site's meta (a home's holder, which this meta forwards the home's writes
    /// to, or the other side of a move) could not be reached or did not answer in time
    /// (`timed_out`: ETIMEDOUT rather than EIO; a forwarded write's outcome is unknown).
    #[error("the meta of another site at {peer} did not answer (is it running, is the WAN up?): {detail}")]
    Unreachable { peer: String, detail: String, timed_out: bool },
    #[error("corrupt metadata row: {0}")]
    Corrupt(String),
    /// An operation would change rows of two metadata homes (a rename or link between
    /// them): refused like a rename across file systems.
    #[error("across metadata homes: {0}")]
    CrossHome(String),
    #[error("busy: {0}")]
    Busy(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl MetaError {
    /// The wire code a client maps to errno.
    pub fn code(&self) -> ErrorCode {
        match self {
            MetaError::NotFound(_) => ErrorCode::NotFound,
            MetaError::Exists(_) => ErrorCode::Exists,
            MetaError::NotDir(_) => ErrorCode::NotDir,
            MetaError::IsDir(_) => ErrorCode::IsDir,
            MetaError::NotEmpty(_) => ErrorCode::NotEmpty,
            MetaError::NotPermitted(_) => ErrorCode::NotPermitted,
            MetaError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            MetaError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            MetaError::NameTooLong { .. } => ErrorCode::NameTooLong,
            MetaError::NoAttribute(_) => ErrorCode::NoAttribute,
            MetaError::Range(_) => ErrorCode::Range,
            MetaError::WouldBlock(_) => ErrorCode::WouldBlock,
            MetaError::Stale(_) => ErrorCode::Stale,
            MetaError::Unsupported(_) => ErrorCode::Unsupported,
            MetaError::Database { .. } | MetaError::Conflict(_) | MetaError::Connect { .. } | MetaError::Io { .. } => {
                ErrorCode::Io
            }
            MetaError::NotFormatted { .. }
            | MetaError::InUse { .. }
            | MetaError::TargetNotEmpty { .. }
            | MetaError::Damaged { .. }
            | MetaError::UnsupportedUrl { .. } => ErrorCode::Internal,
            MetaError::WrongCluster(_) => ErrorCode::NotPermitted,
            MetaError::NotAdmitted(_) | MetaError::Removed(_) | MetaError::BadJoinToken(_) => {
                ErrorCode::PermissionDenied
            }
            MetaError::IdentityMap { .. } => ErrorCode::InvalidArgument,
            MetaError::SchemaTooNew { .. } | MetaError::SchemaUnknown { .. } => ErrorCode::Unsupported,
            MetaError::Corrupt(_) => ErrorCode::Corrupt,
            MetaError::CrossHome(_) => ErrorCode::CrossDevice,
            MetaError::Busy(_) => ErrorCode::Busy,
            MetaError::Fenced(_) => ErrorCode::ReadOnly,
            MetaError::SessionUnknown(_) => ErrorCode::SessionUnknown,
            MetaError::TimedOut { .. } => ErrorCode::TimedOut,
            MetaError::Internal(_) => ErrorCode::Internal,
            MetaError::Remote(e) => e.code,
            MetaError::Unreachable { timed_out: true, .. } => ErrorCode::TimedOut,
            MetaError::Unreachable { .. } => ErrorCode::Unreachable,
        }
    }
}

impl MetaError {
    /// The meta at `peer` (another site's) failed us with `e`.
    pub(crate) fn unreachable(peer: &str, e: &net::NetError) -> MetaError {
        let timed_out = matches!(e, net::NetError::Timeout { .. });
        MetaError::Unreachable { peer: peer.to_string(), detail: e.to_string(), timed_out }
    }

    /// A serialization conflict: the transaction is worth running again whole.
    pub fn is_conflict(&self) -> bool {
        matches!(self, MetaError::Conflict(_))
    }
}

impl From<MetaError> for WireError {
    fn from(e: MetaError) -> Self {
        WireError::new(e.code(), e.to_string())
    }
}
