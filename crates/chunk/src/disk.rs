//! Small file-system helpers the store needs: advisory locking, directory fsync,
//! recognising "disk full", and reading the ids stored in one fan-out directory.

use proto::types::ChunkId;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Takes an exclusive, non-blocking `flock` on `file`. `Ok(false)` means another open
/// file description (another process, or another store in this one) holds it.
pub(crate) fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock only reads the descriptor number; `file` keeps it open for the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) { Ok(false) } else { Err(err) }
}

/// Makes a rename or create inside `dir` durable.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether an OS error means the disk (or the user's quota) is full.
pub(crate) fn is_no_space(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Name of the fan-out directory that holds `id`: its first byte in hex.
pub(crate) fn fan_out_name(id: &ChunkId) -> String {
    format!("{:02x}", id.0[0])
}

/// Chunk files directly in `dir` with their sizes, unsorted. Names that are not a
/// canonical (lower-case, 64-digit) id belonging in this fan-out directory are skipped.
pub(crate) fn chunk_files(dir: &Path) -> io::Result<Vec<(ChunkId, u64)>> {
    let prefix = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(id) = ChunkId::from_hex(name) else {
            continue;
        };
        if id.to_hex() != name || fan_out_name(&id) != prefix {
            continue;
        }
        let meta = match entry.metadata() {
            Ok(m) => m,
            // Deleted between readdir and stat.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_file() {
            out.push((id, meta.len()));
        }
    }
    Ok(out)
}
