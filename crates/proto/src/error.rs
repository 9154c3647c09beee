//! The error every RPC may answer with: an OS-neutral code plus a human message.

use serde::{Deserialize, Serialize};

/// Failure kinds a file system user can act on; the client maps them to errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    PermissionDenied,
    NotPermitted,
    InvalidArgument,
    NameTooLong,
    NoSpace,
    Io,
    /// A chunk failed its hash check; it is never served.
    Corrupt,
    Stale,
    WouldBlock,
    /// Missing extended attribute (ENODATA).
    NoAttribute,
    /// A value does not fit the caller's buffer (ERANGE).
    Range,
    CrossDevice,
    Busy,
    Unsupported,
    TooManyLinks,
    /// Protocol misuse or an invariant broken on the server.
    Internal,
    // New codes go last: the wire carries a variant's index.
    /// A peer did not answer in time: it is hung, overloaded or behind a dead link
    /// (ETIMEDOUT).
    TimedOut,
    /// A peer refused the connection or the connection broke (EIO).
    Unreachable,
    /// The copies a replication policy requires could not be made in time (a listed
    /// site unreachable); the write is not acknowledged (EIO).
    NotReplicated,
    /// The metadata service lost the primary role (failover fencing): writes are
    /// refused there (EROFS).
    ReadOnly,
    /// The session a request names is unknown to meta (it expired while the client
    /// could not reach meta, e.g. across a failover): the client opens a new one and
    /// sends the request again. Not `NotFound`, which the kernel would show as ENOENT
    /// for a file that exists.
    SessionUnknown,
}

/// The error half of every RPC reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}
