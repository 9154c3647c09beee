//! Client errors carry an OS-neutral code that adapters map to errno, plus context.

use proto::error::{ErrorCode, WireError};

/// An error from a file system call, with the code adapters turn into errno.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{context}: {code:?}")]
pub struct VfsError {
    pub code: ErrorCode,
    pub context: String,
}

impl VfsError {
    pub fn new(code: ErrorCode, context: impl Into<String>) -> Self {
        VfsError { code, context: context.into() }
    }

    /// The Linux errno for this error.
    pub fn errno(&self) -> i32 {
        use ErrorCode::*;
        match self.code {
            NotFound => libc::ENOENT,
            Exists => libc::EEXIST,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            NotEmpty => libc::ENOTEMPTY,
            PermissionDenied => libc::EACCES,
            NotPermitted => libc::EPERM,
            InvalidArgument => libc::EINVAL,
            NameTooLong => libc::ENAMETOOLONG,
            NoSpace => libc::ENOSPC,
            Io | Corrupt | Internal | Unreachable | NotReplicated | SessionUnknown => libc::EIO,
            Stale => libc::ESTALE,
            WouldBlock => libc::EAGAIN,
            NoAttribute => libc::ENODATA,
            Range => libc::ERANGE,
            CrossDevice => libc::EXDEV,
            Busy => libc::EBUSY,
            Unsupported => libc::EOPNOTSUPP,
            TooManyLinks => libc::EMLINK,
            ReadOnly => libc::EROFS,
            TimedOut => libc::ETIMEDOUT,
        }
    }
}

impl From<WireError> for VfsError {
    fn from(e: WireError) -> Self {
        VfsError { code: e.code, context: e.message }
    }
}

/// A hung peer is `TimedOut` (ETIMEDOUT, as an NFS `softerr` mount reports it), a
/// dead or unreachable one `Unreachable` (EIO): the caller can tell "try again later"
/// from "gone".
impl From<net::NetError> for VfsError {
    fn from(e: net::NetError) -> Self {
        VfsError { code: e.code(), context: e.to_string() }
    }
}
