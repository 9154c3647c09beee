//! Small file-system helpers the store needs: advisory locking, directory fsync,
//! recognising "disk full", reading the ids stored in one fan-out directory, and
//! writing a new file's bulk past the page cache through reused aligned buffers
//! (`write_new_file`), and reading a whole file into reused buffers (`read_file`).

use bytes::Bytes;
use proto::types::ChunkId;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;
use util::sync::{lock, wait};

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

/// What `O_DIRECT` asks of buffer addresses, file offsets and lengths (a multiple of
/// every common logical block size: 512 and 4096 bytes).
const DIRECT_ALIGN: usize = 4096;
/// Bytes one direct write carries (one pooled aligned buffer).
const DIRECT_PIECE: usize = 2 << 20;
/// Files shorter than this are written through the page cache: a direct write's wait
/// for the device is not worth saving a copy of a few pages.
pub(crate) const DIRECT_MIN: usize = 64 << 10;
/// Aligned buffers kept for reuse: a fresh buffer costs page faults on first touch,
/// which is what writing past the page cache is there to avoid.
const DIRECT_POOL: usize = 8;

/// Spare buffers for direct writes, each `DIRECT_PIECE + DIRECT_ALIGN` bytes long.
static BUFFERS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Creates `path` (which must not exist) holding `data`. Its block-aligned bulk is
/// written with `O_DIRECT` through a reused aligned buffer and the rest (the last
/// partial block, or a small file) through the page cache. Writing into the page
/// cache touches a freshly allocated page per 4 KiB, which costs far more CPU than the
/// copy itself (measured: 1.6 s of system time per GiB buffered, 0.06 s direct; see
/// bench/results/replication-profile.txt). That holds for a site cache's copies too,
/// although they may be read again soon: a read-through of another site's file
/// halved its site node's CPU with them written direct (bench/results/cache-direct-ab.md),
/// and a later read finds them on the disk at the disk's speed. The caller's sync, if
/// any, makes the file durable. A file system that refuses `O_DIRECT` gets a buffered write.
pub(crate) fn write_new_file(path: &Path, data: &[u8]) -> io::Result<()> {
    let aligned = data.len() / DIRECT_ALIGN * DIRECT_ALIGN;
    if data.len() < DIRECT_MIN {
        return OpenOptions::new().write(true).create_new(true).open(path)?.write_all(data);
    }
    let file = match OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => f,
        // Refused: created or not, the file is ours (the name is unique) and gets a
        // buffered write.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            return OpenOptions::new().write(true).create(true).truncate(true).open(path)?.write_all(data);
        }
        Err(e) => return Err(e),
    };
    let mut buf = lock(&BUFFERS).pop().unwrap_or_else(|| vec![0u8; DIRECT_PIECE + DIRECT_ALIGN]);
    let start = buf.as_ptr().align_offset(DIRECT_ALIGN);
    let mut done = 0;
    let result = (|| {
        while done < aligned {
            let n = (aligned - done).min(DIRECT_PIECE);
            let piece = &mut buf[start..start + n];
            piece.copy_from_slice(&data[done..done + n]);
            match file.write_all_at(piece, done as u64) {
                Ok(()) => done += n,
                // Alignment stricter than ours: the rest goes through the page cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
                Err(e) => return Err(e),
            }
        }
        if done < data.len() {
            stop_direct(&file)?;
            file.write_all_at(&data[done..], done as u64)?;
        }
        Ok(())
    })();
    let mut pool = lock(&BUFFERS);
    if pool.len() < DIRECT_POOL {
        pool.push(buf);
    }
    result
}

/// Aligned read buffers kept for reuse (see `read_file`); 16 whole 4 MiB chunks.
const READ_POOL: usize = 16;

/// Spare buffers for whole-file reads, of any length (one is reused for a file that
/// needs at least half of it).
static READ_BUFFERS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A file's bytes inside a pooled buffer, shared as `Bytes` without a copy; the buffer
/// goes back to the pool when the last `Bytes` pointing into it is dropped.
struct ReadBuffer {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for ReadBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl Drop for ReadBuffer {
    fn drop(&mut self) {
        let mut pool = lock(&READ_BUFFERS);
        if pool.len() < READ_POOL {
            pool.push(std::mem::take(&mut self.buf));
        }
    }
}

/// Transparent huge page size: read buffers start at such a boundary.
const HUGE_PAGE: usize = 2 << 20;

/// A pooled buffer with `need` bytes from a 2 MiB boundary on (and at most twice as
/// many in all), or a new one asked to be backed by huge pages: its first touch then
/// costs one fault per 2 MiB, not one per 4 KiB (measured: the faults of fresh 4 KiB
/// pages took a fifth of the cold read's CPU).
fn read_buffer(need: usize) -> Vec<u8> {
    let len = need + HUGE_PAGE;
    let mut pool = lock(&READ_BUFFERS);
    if let Some(i) = pool.iter().position(|b| b.len() >= len && b.len() <= 2 * len) {
        return pool.swap_remove(i);
    }
    drop(pool);
    let mut buf = vec![0u8; len];
    let at = buf.as_ptr().align_offset(HUGE_PAGE);
    // SAFETY: madvise only advises the kernel about pages inside `buf`, which this
    // function owns; the range [at, at + need) lies within its `len` bytes.
    unsafe { libc::madvise(buf.as_mut_ptr().add(at).cast(), need, libc::MADV_HUGEPAGE) };
    buf
}

/// The whole file at `path`, or `None` if there is none. A file of `DIRECT_MIN` bytes
/// or more is read with `O_DIRECT` (whole blocks; through the page cache where the file
/// system refuses it) into a reused buffer on huge pages and shared as `Bytes` without a
/// copy. Filling fresh page-cache pages cost more than the device's read: cold reads
/// 1.06-1.34x at bs=1M, 0.90-1.19x at 64k (bench/results/read-direct-ab.md). The
/// kernel flushes the file's dirty pages (a buffered tail) before a direct read.
pub(crate) fn read_file(path: &Path) -> io::Result<Option<Bytes>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len() as usize;
    if len < DIRECT_MIN {
        let mut data = Vec::with_capacity(len);
        file.read_to_end(&mut data)?;
        return Ok(Some(Bytes::from(data)));
    }
    // Direct reads ask for whole blocks: the last one reads short at the end of the file.
    let whole = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let mut buf = read_buffer(whole);
    let start = buf.as_ptr().align_offset(HUGE_PAGE);
    let mut direct = start_direct(&file).is_ok();
    let mut done = 0;
    while done < len {
        let end = if direct { whole } else { len };
        match file.read_at(&mut buf[start + done..start + end], done as u64) {
            // Shorter than its length said: the hash check will refuse it.
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Alignment stricter than ours: the rest goes through the page cache.
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                stop_direct(&file)?;
                direct = false;
            }
            Err(e) => return Err(e),
        }
        if direct && done % DIRECT_ALIGN != 0 && done < len {
            stop_direct(&file)?;
            direct = false;
        }
    }
    let done = done.min(len);
    Ok(Some(Bytes::from_owner(ReadBuffer { buf, start, len: done })))
}

/// Tells the kernel that `file` is read at random: a read of part of a chunk then
/// reads from disk only the blocks asked for, not a read-ahead window after them.
pub(crate) fn read_at_random(file: &File) {
    // SAFETY: posix_fadvise only advises the kernel about the open descriptor `file`
    // keeps alive; advice that fails changes nothing.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
}

/// Turns `O_DIRECT` off for an open file: later reads and writes go through the page cache.
fn stop_direct(file: &File) -> io::Result<()> {
    set_direct(file, false)
}

/// Turns `O_DIRECT` on for an open file (refused by a file system without it).
fn start_direct(file: &File) -> io::Result<()> {
    set_direct(file, true)
}

/// Sets or clears an open file's `O_DIRECT` status flag.
pub(crate) fn set_direct(file: &File, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL only reads the descriptor's flags; `file` keeps it open.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on { flags | libc::O_DIRECT } else { flags & !libc::O_DIRECT };
    // SAFETY: F_SETFL only changes the descriptor's status flags; `file` keeps it open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
                s = wait(&self.finished, s);
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

    #[test]
    fn files_hold_exactly_their_bytes_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        // Around every boundary: small, one block short of and past the direct minimum,
        // aligned, a partial last block, and several pieces with a tail.
        let sizes = [0, 1, 4095, DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + 1, 3 * DIRECT_PIECE + 4097, 2 * DIRECT_PIECE];
        for (i, len) in sizes.into_iter().enumerate() {
            let padded: Vec<u8> = (0..=len).map(|j| (j * 7 + j / 4096 + i) as u8).collect();
            // An unaligned start, as bytes received from the network have.
            let data = &padded[1..];
            let path = dir.path().join(format!("f{i}"));
            write_new_file(&path, data).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), data, "{len} bytes");
            // Read back twice: the second read reuses the first's buffer.
            for _ in 0..2 {
                let got = read_file(&path).unwrap().unwrap();
                assert_eq!(got, data, "{len} bytes");
            }
            // The name must be new.
            assert!(write_new_file(&path, data).is_err());
        }
        assert!(lock(&BUFFERS).len() <= DIRECT_POOL);
        assert!(read_file(&dir.path().join("absent")).unwrap().is_none());
        assert!(!lock(&READ_BUFFERS).is_empty() && lock(&READ_BUFFERS).len() <= READ_POOL);
    }
}
