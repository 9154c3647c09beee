//! Small file-system helpers the store needs: advisory locking, directory fsync,
//! recognising "disk full", and reading the ids stored in one fan-out directory.

use proto::types::ChunkId;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use util::sync::lock;

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

/// Group commit for durability: every caller of `sync` returns once a `syncfs` that
/// began after its call has finished, and one `syncfs` serves everyone waiting. Many
/// chunks written at once then share a journal commit instead of paying one fsync of
/// the file and one of its directory each.
#[derive(Debug)]
pub(crate) struct GroupSync {
    /// Any descriptor on the store's file system.
    fs: File,
    state: std::sync::Mutex<SyncState>,
    finished: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Callers so far.
    requested: u64,
    /// Every caller up to this number is covered by a finished sync.
    covered: u64,
    running: bool,
}

impl GroupSync {
    pub(crate) fn new(dir: &Path) -> io::Result<GroupSync> {
        Ok(GroupSync { fs: File::open(dir)?, state: Default::default(), finished: std::sync::Condvar::new() })
    }

    /// Returns once everything written before this call is on disk.
    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut s = lock(&self.state);
        s.requested += 1;
        let me = s.requested;
        loop {
            if s.covered >= me {
                return Ok(());
            }
            if s.running {
                s = self.finished.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // Lead a sync for everyone who has asked so far.
            s.running = true;
            let target = s.requested;
            drop(s);
            // SAFETY: syncfs only reads the descriptor, which `self.fs` keeps open.
            let rc = unsafe { libc::syncfs(self.fs.as_raw_fd()) };
            let result = if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
            s = lock(&self.state);
            s.running = false;
            if result.is_ok() {
                s.covered = s.covered.max(target);
            }
            self.finished.notify_all();
            // On failure the others retry with a sync of their own.
            result?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_sync_serves_concurrent_callers() {
        let dir = tempfile::tempdir().unwrap();
        let sync = std::sync::Arc::new(GroupSync::new(dir.path()).unwrap());
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let (sync, path) = (sync.clone(), dir.path().join(format!("f{i}")));
                std::thread::spawn(move || {
                    for j in 0..5 {
                        std::fs::write(&path, [j as u8; 100]).unwrap();
                        sync.sync().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = sync.state.lock().unwrap();
        assert_eq!((s.requested, s.covered >= s.requested, s.running), (80, true, false));
    }
}
