//! How both backends store values: the codes and conversions every schema shares (a
//! file kind's code, a chunk id's bytes, an offset's range, a policy's columns), the
//! root directory a new namespace starts with, and the kernel's randomness for ids.
//! A backend reads and writes its own rows; what a value means is decided here once.

use crate::error::MetaError;
use crate::store::{AclMarks, Inode};
use proto::policy::Policy;
use proto::types::{Attr, ChunkId, FileKind, ROOT_INODE, Timestamp};
use std::fs::File;
use std::io::Read;

/// The stored cluster secret, which must be 32 bytes.
pub(crate) fn secret_of(stored: Vec<u8>) -> Result<[u8; 32], MetaError> {
    stored
        .try_into()
        .map_err(|v: Vec<u8>| MetaError::Corrupt(format!("the cluster secret has {} bytes, not 32", v.len())))
}

/// A random cluster id: 128 bits from the kernel, in hex.
pub(crate) fn new_cluster_id() -> Result<String, MetaError> {
    random_hex()
}

/// 128 random bits from the kernel, in hex (cluster ids, join tokens).
pub(crate) fn random_hex() -> Result<String, MetaError> {
    Ok(hex::encode(random_bytes::<16>()?))
}

/// `N` random bytes from the kernel (ids, tokens, the cluster secret).
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], MetaError> {
    let mut bytes = [0u8; N];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| MetaError::Internal(format!("cannot read /dev/urandom: {e}")))?;
    Ok(bytes)
}

/// The root directory of a newly formatted namespace.
pub(crate) fn root_inode() -> Inode {
    let now = Timestamp::now();
    Inode {
        attr: Attr {
            ino: ROOT_INODE,
            kind: FileKind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: 4096,
            nlink: 2,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            data_version: 0,
        },
        parent: ROOT_INODE,
        target: Vec::new(),
        acls: AclMarks::default(),
    }
}

/// Offsets are stored as BIGINT; files never exceed `i64::MAX` (POSIX `off_t`).
pub(crate) fn off(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// A file kind as stored in the `kind` column (the same codes on every backend).
pub(crate) fn kind_code(k: FileKind) -> i64 {
    match k {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

/// The file kind stored as `code`, if it is one.
pub(crate) fn kind_of(code: i64) -> Option<FileKind> {
    Some(match code {
        1 => FileKind::File,
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        _ => return None,
    })
}

/// A chunk id column's bytes back into a `ChunkId` (refused unless 32 bytes long).
pub(crate) fn chunk_id(bytes: Vec<u8>) -> Result<ChunkId, MetaError> {
    let arr: [u8; 32] =
        bytes.try_into().map_err(|b: Vec<u8>| MetaError::Corrupt(format!("chunk id of {} bytes", b.len())))?;
    Ok(ChunkId(arr))
}

/// A policy row's columns as stored: (sites, copies, mode, rpo_secs).
pub(crate) type PolicyColumns = (String, i64, String, i64);

/// A policy row's columns back into a `Policy` (a mode no binary knows is corrupt).
pub(crate) fn policy_of((sites, copies, mode, rpo): PolicyColumns) -> Result<Policy, MetaError> {
    Ok(Policy {
        sites: sites.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
        copies: copies as u32,
        mode: mode.parse().map_err(MetaError::Corrupt)?,
        rpo_secs: rpo as u64,
    })
}
