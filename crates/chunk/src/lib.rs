//! Content-addressed chunk store on local disk. Every chunk is a file named by its
//! BLAKE3 id; writes land in `tmp/` and are renamed into place after fsync, and every
//! read is checked (a whole chunk re-hashed, a part of one against the chunk's
//! `outboard`) so a corrupt chunk is never served.
//!
//! Layout of a data directory:
//!
//! ```text
//! FORMAT                  "locus-chunk-store 1"
//! STORE_ID                random identity of this store (32 hex digits)
//! LOCK                    flock'ed by the process that owns the directory
//! tmp/                    writes in flight; emptied at open
//! chunks/xx/<64-hex-id>   xx = first byte of the id
//! ```
//!
//! The API is synchronous `std::fs`; async callers run it in `spawn_blocking`.

pub mod cache;
mod outboard;
pub mod seal;

mod disk;

use bytes::Bytes;
use outboard::Outboard;
use proto::error::{ErrorCode, WireError};
use proto::node::NodeStats;
use proto::types::ChunkId;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use util::sync::lock;

/// The format this build writes and understands, as stored in `FORMAT`.
const FORMAT_VERSION: u32 = 1;
const FORMAT_MAGIC: &str = "locus-chunk-store";

/// Everything the chunk store can fail with, each carrying the chunk or path involved.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk {id} not found")]
    NotFound { id: ChunkId },
    #[error("chunk {id} at {} failed its hash check; it is not served", path.display())]
    Corrupt { id: ChunkId, path: PathBuf },
    #[error("no space for chunk {id} ({len} bytes): {detail}")]
    NoSpace { id: ChunkId, len: u64, detail: String },
    #[error("data does not match chunk id {claimed}: it hashes to {actual}")]
    IdMismatch { claimed: ChunkId, actual: ChunkId },
    #[error("offset {offset} is beyond the end of chunk {id} ({size} bytes)")]
    Range { id: ChunkId, offset: u64, size: u64 },
    #[error("data directory {} is in use by another process (it holds {}); stop it or choose another directory", dir.display(), dir.join("LOCK").display())]
    InUse { dir: PathBuf },
    #[error("data directory {} is not writable: {source}; check its ownership, permissions and mount options", dir.display())]
    NotWritable { dir: PathBuf, source: io::Error },
    #[error("{}: {problem}", path.display())]
    Format { path: PathBuf, problem: String },
    #[error("cannot {action} {}: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: io::Error },
    #[error("encryption key file {}: {why}", path.display())]
    Key { path: PathBuf, why: String },
}

impl From<ChunkError> for WireError {
    fn from(e: ChunkError) -> Self {
        let code = match &e {
            ChunkError::NotFound { .. } => ErrorCode::NotFound,
            ChunkError::Corrupt { .. } => ErrorCode::Corrupt,
            ChunkError::NoSpace { .. } => ErrorCode::NoSpace,
            ChunkError::IdMismatch { .. } | ChunkError::Range { .. } => ErrorCode::InvalidArgument,
            ChunkError::InUse { .. }
            | ChunkError::NotWritable { .. }
            | ChunkError::Format { .. }
            | ChunkError::Key { .. }
            | ChunkError::Io { .. } => ErrorCode::Io,
        };
        WireError::new(code, e.to_string())
    }
}

/// Builds the `map_err` closure for an I/O step on `path`.
fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ChunkError + 'a {
    move |source| ChunkError::Io { action, path: path.to_path_buf(), source }
}

/// Bytes and files on disk, plus bytes promised to writes in flight.
#[derive(Debug, Default)]
struct Usage {
    used: u64,
    count: u64,
    reserved: u64,
}

/// An open data directory. Holding it holds the directory's `LOCK`; dropping it
/// releases the lock. All methods take `&self` and are safe to call concurrently.
#[derive(Debug)]
pub struct ChunkStore {
    dir: PathBuf,
    chunks: PathBuf,
    tmp: PathBuf,
    capacity: u64,
    /// Serialises the steps that change what is in `chunks/` with the usage counters.
    usage: Mutex<Usage>,
    corrupt_reads: AtomicU64,
    tmp_seq: AtomicU64,
    store_id: String,
    /// Shared syncs that make puts durable; `None` for a cache.
    durable: Option<disk::GroupSync>,
    /// The site's key: chunk files are sealed with it (`seal`).
    at_rest: Option<seal::AtRest>,
    /// Outboards of the chunks last written or read in part, for reads of part of a
    /// chunk (`get`).
    outboards: Mutex<Outboards>,
    _lock: File,
}

/// The most outboards a store keeps (8 KiB each for 4 MiB chunks: 32 MiB, covering
/// 16 GiB of chunks read at random).
const OUTBOARDS_KEPT: usize = 4096;

/// A read of at most this many bytes of a longer chunk reads and checks only the blocks
/// it needs (`outboard`) once the chunk's outboard is known.
pub const PART_MAX: u64 = 1 << 20;

/// Outboards by chunk id, the least recently used dropped beyond `OUTBOARDS_KEPT`. An
/// id names its content, so a kept outboard is never stale.
#[derive(Debug, Default)]
struct Outboards {
    by_id: HashMap<ChunkId, Arc<Outboard>>,
    order: cache::LruOrder,
}

impl Outboards {
    fn get(&mut self, id: &ChunkId) -> Option<Arc<Outboard>> {
        let found = self.by_id.get(id)?.clone();
        self.order.touch(*id);
        Some(found)
    }

    fn insert(&mut self, id: ChunkId, outboard: Outboard) {
        self.by_id.insert(id, Arc::new(outboard));
        self.order.touch(id);
        while self.by_id.len() > OUTBOARDS_KEPT {
            let Some(old) = self.order.pop_oldest() else { break };
            self.by_id.remove(&old);
        }
    }
}

/// A chunk file as read from disk.
enum Stored {
    Missing,
    Intact(Bytes),
    /// Fails its hash check, or does not open under the store's key.
    Corrupt,
}

impl ChunkStore {
    /// Opens (creating if absent) the store in `dir`, holding at most `capacity_bytes`
    /// of chunks. Fails if another process has it open, if it is not writable, or if
    /// it was written by an unknown or newer format.
    pub fn open(dir: &Path, capacity_bytes: u64) -> Result<ChunkStore, ChunkError> {
        Self::open_with(dir, capacity_bytes, true)
    }

    /// Opens a store whose puts are not synced to disk: a cache of chunks that live
    /// elsewhere, where a copy lost in a crash is fetched again (and a torn one fails
    /// its hash check like any corrupt chunk).
    pub fn open_cache(dir: &Path, capacity_bytes: u64) -> Result<ChunkStore, ChunkError> {
        Self::open_with(dir, capacity_bytes, false)
    }

    fn open_with(dir: &Path, capacity_bytes: u64, durable: bool) -> Result<ChunkStore, ChunkError> {
        fs::create_dir_all(dir).map_err(io_err("create data directory", dir))?;
        let lock_path = dir.join("LOCK");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|source| ChunkError::NotWritable { dir: dir.to_path_buf(), source })?;
        if !disk::try_lock_exclusive(&lock).map_err(io_err("lock", &lock_path))? {
            return Err(ChunkError::InUse { dir: dir.to_path_buf() });
        }
        check_or_write_format(dir)?;

        let chunks = dir.join("chunks");
        let tmp = dir.join("tmp");
        fs::create_dir_all(&chunks).map_err(io_err("create", &chunks))?;
        fs::create_dir_all(&tmp).map_err(io_err("create", &tmp))?;
        clean_tmp(&tmp)?;
        probe_writable(dir, &tmp)?;
        let store_id = read_or_create_store_id(dir)?;
        let usage = scan(&chunks)?;
        if usage.used > capacity_bytes {
            tracing::warn!(dir = %dir.display(), used = usage.used, capacity = capacity_bytes,
                "chunk store holds more than its capacity; new writes will be refused");
        }
        tracing::info!(dir = %dir.display(), chunks = usage.count, used = usage.used, "chunk store opened");
        Ok(ChunkStore {
            dir: dir.to_path_buf(),
            chunks,
            tmp,
            capacity: capacity_bytes,
            usage: Mutex::new(usage),
            corrupt_reads: AtomicU64::new(0),
            tmp_seq: AtomicU64::new(0),
            store_id,
            durable: if durable { Some(disk::GroupSync::new(dir).map_err(io_err("open", dir))?) } else { None },
            at_rest: None,
            outboards: Mutex::default(),
            _lock: lock,
        })
    }

    /// Seals every chunk written from now on with `key` (encryption at rest); chunks
    /// already stored in plaintext stay readable (their hash is checked as always).
    pub fn encrypted(mut self, key: seal::AtRest) -> ChunkStore {
        self.at_rest = Some(key);
        self
    }

    /// Reads chunk `id`'s file: its plaintext if it opens under the key and hashes to
    /// `id`.
    /// With `keep_outboard` (a read of part of a plaintext chunk), its outboard is
    /// computed as the check and kept for the next such read.
    fn read_stored(&self, id: &ChunkId, path: &Path, keep_outboard: bool) -> io::Result<Stored> {
        let Some(file) = disk::read_file(path)? else { return Ok(Stored::Missing) };
        let plain = match &self.at_rest {
            Some(key) => key.open(id, file.to_vec()).map(Bytes::from),
            None => Some(file),
        };
        Ok(match plain {
            Some(data) if self.check(id, &data, keep_outboard) => Stored::Intact(data),
            _ => Stored::Corrupt,
        })
    }

    /// Whether `data` hashes to `id`; with `keep_outboard`, through its outboard, which
    /// is then kept (at the cost of one hash, the same as the plain check's).
    fn check(&self, id: &ChunkId, data: &[u8], keep_outboard: bool) -> bool {
        match Outboard::of(data).filter(|_| keep_outboard && self.at_rest.is_none()) {
            Some(outboard) if outboard.root() == *id => {
                lock(&self.outboards).insert(*id, outboard);
                true
            }
            Some(_) => false,
            None => ChunkId::of(data) == *id,
        }
    }

    /// Stores `data` as chunk `id` durably. Refuses data that does not hash to `id`.
    /// Idempotent: an intact copy already present is kept (its mtime is refreshed so
    /// a concurrent gc treats it as freshly written); a corrupt one is replaced.
    pub fn put(&self, id: &ChunkId, data: &[u8]) -> Result<(), ChunkError> {
        // The check keeps the outboard: chunks just written are the likeliest to be
        // read in part (a block device's blocks).
        if !self.check(id, data, true) {
            return Err(ChunkError::IdMismatch { claimed: *id, actual: ChunkId::of(data) });
        }
        let path = self.path_of(id);
        if self.touch_if_intact(id, &path)? {
            return Ok(());
        }
        let mut reserved = self.reserve(id, data.len() as u64)?;
        let result = self.write_new(id, data, &path, &mut reserved);
        // Whatever `write_new` did not turn into usage is given back.
        self.lock_usage().reserved -= reserved;
        result
    }

    /// Bytes `[offset, offset+len)` of chunk `id`, checked against its id: the whole
    /// chunk, or for a part of at most `PART_MAX` bytes of a plaintext chunk whose
    /// outboard is known only the blocks holding the part. `len` is clipped at the end
    /// of the chunk; an `offset` past the end is a `Range` error.
    pub fn get(&self, id: &ChunkId, offset: u64, len: u64) -> Result<Bytes, ChunkError> {
        let path = self.path_of(id);
        let part = len <= PART_MAX && self.at_rest.is_none();
        let known = if part { lock(&self.outboards).get(id) } else { None };
        if let Some(outboard) = known {
            return self.get_part(id, &path, &outboard, offset, len);
        }
        let data = match self.read_stored(id, &path, part).map_err(io_err("read chunk", &path))? {
            Stored::Intact(d) => d,
            Stored::Missing => return Err(ChunkError::NotFound { id: *id }),
            Stored::Corrupt => return Err(self.corrupt(id, path)),
        };
        let size = data.len() as u64;
        if offset > size {
            return Err(ChunkError::Range { id: *id, offset, size });
        }
        let end = offset.saturating_add(len).min(size);
        Ok(data.slice(offset as usize..end as usize))
    }

    /// Reads the blocks of `id` holding `[offset, offset+len)` and checks them against
    /// its outboard.
    fn get_part(
        &self,
        id: &ChunkId,
        path: &Path,
        outboard: &Outboard,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, ChunkError> {
        let size = outboard.chunk_len();
        if offset > size {
            return Err(ChunkError::Range { id: *id, offset, size });
        }
        let end = offset.saturating_add(len).min(size);
        let from = offset / outboard::BLOCK * outboard::BLOCK;
        let to = (end.div_ceil(outboard::BLOCK) * outboard::BLOCK).min(size);
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ChunkError::NotFound { id: *id }),
            Err(e) => return Err(io_err("open chunk", path)(e)),
        };
        let mut blocks = vec![0u8; (to - from) as usize];
        disk::read_at_random(&file);
        match file.read_exact_at(&mut blocks, from) {
            Ok(()) => {}
            // Shorter than the chunk: truncated on disk.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(self.corrupt(id, path.to_path_buf())),
            Err(e) => return Err(io_err("read chunk", path)(e)),
        }
        if !outboard.verify(from, &blocks) {
            return Err(self.corrupt(id, path.to_path_buf()));
        }
        Ok(Bytes::from(blocks).slice((offset - from) as usize..(end - from) as usize))
    }

    /// Counts and logs a read that found `id` corrupt at `path`.
    fn corrupt(&self, id: &ChunkId, path: PathBuf) -> ChunkError {
        self.corrupt_reads.fetch_add(1, Ordering::Relaxed);
        tracing::error!(chunk = %id, path = %path.display(), "chunk failed its hash check; refusing to serve it");
        ChunkError::Corrupt { id: *id, path }
    }

    /// One flag per id, in order: whether a file for it is present (not re-hashed).
    pub fn has(&self, ids: &[ChunkId]) -> Result<Vec<bool>, ChunkError> {
        ids.iter()
            .map(|id| {
                let path = self.path_of(id);
                path.try_exists().map_err(io_err("stat", &path))
            })
            .collect()
    }

    /// Up to `limit` stored ids greater than `after`, in ascending order, so callers
    /// can page through the store.
    pub fn list(&self, after: Option<ChunkId>, limit: usize) -> Result<Vec<ChunkId>, ChunkError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let first = after.map_or(0, |a| a.0[0]);
        for byte in first..=u8::MAX {
            let fan = self.chunks.join(format!("{byte:02x}"));
            let mut ids = match disk::chunk_files(&fan) {
                Ok(files) => files.into_iter().map(|(id, _)| id).collect::<Vec<_>>(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("list", &fan)(e)),
            };
            ids.sort_unstable();
            for id in ids.into_iter().filter(|id| after.is_none_or(|a| *id > a)) {
                out.push(id);
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    /// Re-hashes the listed chunks from disk; answers those that are missing, corrupt
    /// or unreadable. Does not count towards `corrupt_reads` (nothing was served).
    pub fn verify(&self, ids: &[ChunkId]) -> Vec<ChunkId> {
        ids.iter()
            .filter(|id| {
                let path = self.path_of(id);
                match self.read_stored(id, &path, false) {
                    Ok(Stored::Intact(_)) => false,
                    Ok(Stored::Corrupt) => {
                        tracing::error!(chunk = %id, path = %path.display(), "verify: chunk failed its hash check");
                        true
                    }
                    Ok(Stored::Missing) => true,
                    Err(e) => {
                        tracing::error!(chunk = %id, path = %path.display(), error = %e, "verify: cannot read chunk");
                        true
                    }
                }
            })
            .copied()
            .collect()
    }

    /// Deletes those of `ids` whose file was last written at least `min_age` ago and
    /// answers how many went. The age check keeps gc from deleting a chunk that a
    /// writer has just (re-)stored but not yet committed to meta.
    pub fn delete(&self, ids: &[ChunkId], min_age: Duration) -> Result<u64, ChunkError> {
        let now = SystemTime::now();
        let mut deleted = 0;
        let mut touched_dirs = Vec::new();
        for id in ids {
            let path = self.path_of(id);
            let mut usage = self.lock_usage();
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("stat", &path)(e)),
            };
            let mtime = meta.modified().map_err(io_err("read mtime of", &path))?;
            // A mtime in the future counts as age zero.
            let age = now.duration_since(mtime).unwrap_or_default();
            if age < min_age {
                continue;
            }
            fs::remove_file(&path).map_err(io_err("delete", &path))?;
            usage.used = usage.used.saturating_sub(meta.len());
            usage.count = usage.count.saturating_sub(1);
            drop(usage);
            deleted += 1;
            if let Some(parent) = path.parent()
                && !touched_dirs.iter().any(|d: &PathBuf| d == parent)
            {
                touched_dirs.push(parent.to_path_buf());
            }
        }
        for dir in &touched_dirs {
            disk::fsync_dir(dir).map_err(io_err("fsync", dir))?;
        }
        Ok(deleted)
    }

    /// Capacity, usage and the number of corrupt chunks refused since open.
    pub fn stats(&self) -> NodeStats {
        let usage = self.lock_usage();
        NodeStats {
            capacity_bytes: self.capacity,
            used_bytes: usage.used,
            chunk_count: usage.count,
            corrupt_reads: self.corrupt_reads.load(Ordering::Relaxed),
        }
    }

    /// The data directory this store was opened on.
    fn sync(&self) -> io::Result<()> {
        self.durable.as_ref().map_or(Ok(()), |d| d.sync())
    }

    /// Random identity of this store, stable across restarts.
    pub fn store_id(&self) -> &str {
        &self.store_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, id: &ChunkId) -> PathBuf {
        self.chunks.join(disk::fan_out_name(id)).join(id.to_hex())
    }

    fn lock_usage(&self) -> std::sync::MutexGuard<'_, Usage> {
        // The counters stay consistent even if a holder panicked: keep going.
        lock(&self.usage)
    }

    /// True if an intact copy of `id` is stored; its mtime is then set to now.
    fn touch_if_intact(&self, id: &ChunkId, path: &Path) -> Result<bool, ChunkError> {
        match self.read_stored(id, path, false).map_err(io_err("read chunk", path))? {
            Stored::Intact(_) => {}
            Stored::Missing => return Ok(false),
            Stored::Corrupt => {
                tracing::warn!(chunk = %id, path = %path.display(), "stored chunk is corrupt; replacing it");
                return Ok(false);
            }
        }
        // Under the usage lock so a concurrent delete sees either the old or new mtime
        // together with the file, never deletes it after we decided to keep it.
        let _usage = self.lock_usage();
        let file = match OpenOptions::new().write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err("open chunk", path)(e)),
        };
        file.set_modified(SystemTime::now()).map_err(io_err("set mtime of", path))?;
        Ok(true)
    }

    /// Counts `len` bytes against the capacity for a put in flight; returns them.
    fn reserve(&self, id: &ChunkId, len: u64) -> Result<u64, ChunkError> {
        let mut usage = self.lock_usage();
        let would_use = usage.used.saturating_add(usage.reserved).saturating_add(len);
        if would_use > self.capacity {
            return Err(ChunkError::NoSpace {
                id: *id,
                len,
                detail: format!(
                    "store at {} would exceed its capacity of {} bytes ({} used, {} being written)",
                    self.dir.display(),
                    self.capacity,
                    usage.used,
                    usage.reserved
                ),
            });
        }
        usage.reserved += len;
        Ok(len)
    }

    /// Writes a temp file, fsyncs it, renames it into place and fsyncs the directory.
    /// On failure the temp file is removed, so nothing half-written stays behind. The
    /// reservation becomes usage at the rename, in the same step (so a chunk is never
    /// counted twice while the final sync runs); `reserved` is left at zero then.
    fn write_new(&self, id: &ChunkId, data: &[u8], path: &Path, reserved: &mut u64) -> Result<(), ChunkError> {
        let sealed;
        let data = match &self.at_rest {
            Some(key) => {
                sealed = key.seal(id, data);
                &sealed[..]
            }
            None => data,
        };
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.tmp.join(format!("{}.{}.{seq}", id.to_hex(), std::process::id()));
        let len = data.len() as u64;
        let no_space = |e: &io::Error| ChunkError::NoSpace {
            id: *id,
            len,
            detail: format!("the disk holding {} is full: {e}", self.dir.display()),
        };
        let written = (|| {
            // The bulk skips the page cache (see `disk::write_new_file`).
            disk::write_new_file(&tmp, data)?;
            util::crash_point!("chunk-before-sync");
            // The temp file is durable before it gets its name (shared with other puts).
            self.sync()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(if disk::is_no_space(&e) { no_space(&e) } else { io_err("write", &tmp)(e) });
        }

        let fan = path.parent().unwrap_or(&self.chunks);
        match fs::create_dir(fan) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(if disk::is_no_space(&e) { no_space(&e) } else { io_err("create", fan)(e) });
            }
        };
        {
            let mut usage = self.lock_usage();
            let replaced = match fs::symlink_metadata(path) {
                Ok(m) => Some(m.len()),
                Err(_) => None,
            };
            util::crash_point!("chunk-before-rename");
            if let Err(e) = fs::rename(&tmp, path) {
                drop(usage);
                let _ = fs::remove_file(&tmp);
                return Err(io_err("rename into place", path)(e));
            }
            match replaced {
                Some(old) => usage.used = usage.used.saturating_sub(old) + len,
                None => {
                    usage.used += len;
                    usage.count += 1;
                }
            }
            usage.reserved -= std::mem::take(reserved);
        }
        // The rename (and a new fan-out directory) is durable before the put returns.
        self.sync().map_err(io_err("sync", fan))
    }
}

/// Checks `FORMAT`, or writes it into a fresh (empty apart from `LOCK`) directory.
/// The store's random identity, created once and kept in `dir/STORE_ID`.
fn read_or_create_store_id(dir: &Path) -> Result<String, ChunkError> {
    let path = dir.join("STORE_ID");
    match fs::read_to_string(&path) {
        Ok(text) if text.trim().len() == 32 && text.trim().bytes().all(|b| b.is_ascii_hexdigit()) => {
            return Ok(text.trim().to_string());
        }
        Ok(_) => {
            return Err(ChunkError::Format { path, problem: "STORE_ID is not 32 hex digits".into() });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("read", &path)(e)),
    }
    let mut random = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(io_err("read", Path::new("/dev/urandom")))?;
    let id = hex::encode(random);
    write_small_file(dir, "STORE_ID", &id)?;
    Ok(id)
}

/// Writes `dir/name` with one line of `text`, durably and atomically (temp file,
/// fsync, rename, fsync of the directory).
fn write_small_file(dir: &Path, name: &str, text: &str) -> Result<(), ChunkError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        writeln!(f, "{text}")?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(name))?;
        disk::fsync_dir(dir)
    };
    write().map_err(|source| ChunkError::NotWritable { dir: dir.to_path_buf(), source })
}

fn check_or_write_format(dir: &Path) -> Result<(), ChunkError> {
    let path = dir.join("FORMAT");
    match fs::read_to_string(&path) {
        Ok(text) => return parse_format(&path, &text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("read", &path)(e)),
    }
    let mut entries = fs::read_dir(dir).map_err(io_err("list", dir))?;
    let foreign = entries.any(|e| e.map_or(true, |e| e.file_name() != "LOCK" && e.file_name() != "FORMAT.tmp"));
    if foreign {
        return Err(ChunkError::Format {
            path,
            problem: format!(
                "missing, and {} is not empty; refusing to turn an unknown directory into a chunk store",
                dir.display()
            ),
        });
    }
    write_small_file(dir, "FORMAT", &format!("{FORMAT_MAGIC} {FORMAT_VERSION}"))
}

fn parse_format(path: &Path, text: &str) -> Result<(), ChunkError> {
    let bad = |problem: String| ChunkError::Format { path: path.to_path_buf(), problem };
    let mut words = text.split_whitespace();
    if words.next() != Some(FORMAT_MAGIC) {
        return Err(bad(format!("not a Locus chunk store (expected \"{FORMAT_MAGIC} {FORMAT_VERSION}\")")));
    }
    let version: u32 =
        words.next().and_then(|v| v.parse().ok()).ok_or_else(|| bad("unreadable format version".to_string()))?;
    if version > FORMAT_VERSION {
        return Err(bad(format!(
            "written by a newer Locus (format {version}); this build understands format {FORMAT_VERSION}: upgrade it"
        )));
    }
    if version != FORMAT_VERSION {
        return Err(bad(format!("unknown format version {version}")));
    }
    Ok(())
}

/// Removes whatever writes in flight left behind when the previous owner stopped.
fn clean_tmp(tmp: &Path) -> Result<(), ChunkError> {
    let mut removed = 0u64;
    for entry in fs::read_dir(tmp).map_err(io_err("list", tmp))? {
        let entry = entry.map_err(io_err("list", tmp))?;
        let path = entry.path();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let result = if is_dir { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        result.map_err(io_err("remove leftover", &path))?;
        removed += 1;
    }
    if removed > 0 {
        tracing::info!(dir = %tmp.display(), removed, "removed leftover temporary files");
    }
    Ok(())
}

/// Fails early, naming the directory, if chunks could not be written.
fn probe_writable(dir: &Path, tmp: &Path) -> Result<(), ChunkError> {
    let probe = tmp.join(format!("probe.{}", std::process::id()));
    let result = fs::write(&probe, b"probe").and_then(|()| fs::remove_file(&probe));
    result.map_err(|source| ChunkError::NotWritable { dir: dir.to_path_buf(), source })
}

/// Counts the chunk files and their bytes.
fn scan(chunks: &Path) -> Result<Usage, ChunkError> {
    let mut usage = Usage::default();
    for entry in fs::read_dir(chunks).map_err(io_err("list", chunks))? {
        let entry = entry.map_err(io_err("list", chunks))?;
        let path = entry.path();
        if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        for (_, len) in disk::chunk_files(&path).map_err(io_err("list", &path))? {
            usage.used += len;
            usage.count += 1;
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests;
