//! The `Vfs`: POSIX operations over the control path (meta) and the data path (nodes).
//! Writes are buffered per file, cut into content-addressed chunks, stored on the
//! site's nodes in the background (write-behind) and committed to meta as extents on
//! flush, fsync and close. Reads resolve extents to chunks with sequential read-ahead.
//!
//! One submodule per concern: `namespace`, `dir` (listings), `xattr`, `open` (open files
//! and handles), `write` (write-behind), `read` (read-ahead), `commit` (flush, fsync,
//! fallocate), `locks`. The session and node list are kept fresh by the `session`
//! worker, fragmented files are rewritten by the `compaction` worker.

mod commit;
mod dir;
mod locks;
mod namespace;
mod open;
mod read;
mod write;
mod xattr;

use crate::compact::Compactor;
use crate::data::{DataPath, LocalNode};
use crate::error::VfsError;
use crate::file::FileState;
use crate::meta_link::MetaLink;
use crate::session::SessionKeeper;
use proto::meta::{Goodbye, SessionInfo};
use proto::types::{Attr, DirEntry, InodeId, WorkerStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use util::worker::Workers;

type Result<T> = std::result::Result<T, VfsError>;

/// Meta in this client's process, as a `ClientConfig` holds it.
#[derive(Clone)]
pub struct InProcessMetaHandle(pub Arc<dyn crate::meta_link::InProcessMeta>);

impl std::fmt::Debug for InProcessMetaHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessMeta")
    }
}

/// Tunables of a client; every field has a measured default.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub meta_addr: String,
    pub site: String,
    /// What this session is, for `locus status` (a mount point or a CLI verb).
    pub purpose: String,
    /// Largest chunk cut from written data; also the alignment of chunk boundaries.
    pub chunk_size: u64,
    /// Bytes of whole chunks kept in memory.
    pub cache_bytes: usize,
    /// Most chunks fetched ahead of a sequential reader; the window starts at two and
    /// doubles while the reader stays sequential (bounded by half the cache).
    pub readahead_chunks: u64,
    /// Chunk uploads in flight at once (write-behind window). A `sync` write to a
    /// distant site holds each chunk for two round trips plus its transfer, so the window
    /// must cover the link's rate times that (32 × 4 MiB: 1 Gbit/s at 100 ms RTT).
    pub upload_window: usize,
    /// Buffered bytes per file before everything buffered is cut into chunks.
    pub max_dirty_bytes: usize,
    pub meta_connections: usize,
    pub node_connections: usize,
    pub timeout: Duration,
    /// How long answers may be reused without asking meta (as the kernel's attribute
    /// cache); used for the absence of extended attributes.
    pub attr_ttl: Duration,
    /// The storage node in this process (`locus up`), whose store is read directly.
    pub local_node: Option<LocalNode>,
    /// Meta in this process (`locus up`), called directly.
    pub in_process_meta: Option<InProcessMetaHandle>,
    /// Where this host's users leave their logins (`locus login`), one file per uid;
    /// `None`: requests carry no login.
    pub logins: Option<std::path::PathBuf>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            meta_addr: "127.0.0.1:7070".into(),
            site: "default".into(),
            purpose: "client".into(),
            chunk_size: 4 << 20,
            cache_bytes: 512 << 20,
            readahead_chunks: 32,
            upload_window: 32,
            max_dirty_bytes: 64 << 20,
            meta_connections: 2,
            node_connections: 2,
            timeout: Duration::from_secs(60),
            attr_ttl: Duration::from_secs(1),
            local_node: None,
            in_process_meta: None,
            logins: None,
        }
    }
}

/// Options of `open(2)` the Vfs acts on; meta checks the access they ask for.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    pub truncate: bool,
    /// Opened for reading and/or writing (`O_ACCMODE`).
    pub access: proto::meta::OpenAccess,
}

/// An open file, as returned by `open`/`create`.
pub type FileHandle = u64;
/// An open directory listing.
pub type DirHandle = u64;

/// One open of a file, with the read pattern seen through it.
struct Handle {
    file: Arc<FileState>,
    /// End of the furthest read of the stream so far (0 before the first): a read
    /// within a chunk of it continues the stream.
    last_read_end: AtomicU64,
    /// Current read-ahead window in chunks (adaptive).
    window: AtomicU64,
    /// File offset up to which read-ahead was already started.
    prefetched_to: AtomicU64,
    /// After a jump, the file offset a read must go past before read-ahead starts.
    quiet_until: AtomicU64,
}

/// Where an open directory listing stands.
struct DirCursor {
    ino: InodeId,
    /// The directory's attributes as `opendir` found them: what a listing's "." and
    /// ".." entries carry (the kernel takes names and attributes from the others only).
    attr: Attr,
    buffered: VecDeque<DirEntry>,
    after: u64,
    done: bool,
}

/// A mounted view of the Locus namespace.
pub struct Vfs {
    config: ClientConfig,
    meta: Arc<MetaLink>,
    data: Arc<DataPath>,
    files: Mutex<HashMap<InodeId, Arc<FileState>>>,
    handles: Mutex<HashMap<FileHandle, Arc<Handle>>>,
    dirs: Mutex<HashMap<DirHandle, Arc<tokio::sync::Mutex<DirCursor>>>>,
    next_handle: AtomicU64,
    upload_slots: Arc<Semaphore>,
    /// `data_version` of each file when this client last had it open; an unchanged
    /// version lets the kernel keep its page cache.
    seen_versions: Mutex<HashMap<InodeId, u64>>,
    /// Extended attributes known to be absent, per inode (see `getxattr`).
    absent_xattrs: Mutex<HashMap<InodeId, xattr::KnownAbsent>>,
    /// The parent directory's attributes from the last unlink's or create's answer,
    /// for the kernel's GETATTR of that directory that follows (see `fresh_dir_attr`).
    changed_parent: Mutex<Option<namespace::FreshAttr>>,
    /// Files found fragmented on close, for the compaction worker.
    compact_queue: mpsc::UnboundedSender<(InodeId, Option<proto::types::Caller>)>,
    workers: Arc<Workers>,
}

impl Vfs {
    /// Connects to meta, opens a session, learns the site's nodes and starts the
    /// client's workers.
    pub async fn connect(config: ClientConfig) -> Result<Arc<Vfs>> {
        let info = SessionInfo {
            site: config.site.clone(),
            host: hostname(),
            pid: std::process::id(),
            purpose: config.purpose.clone(),
        };
        let in_process = config.in_process_meta.clone().map(|h| h.0);
        let meta = Arc::new(
            MetaLink::connect(
                &config.meta_addr,
                config.meta_connections,
                config.timeout,
                info,
                in_process,
                config.logins.clone(),
            )
            .await?,
        );
        let period = meta.hello().await?;
        let data = Arc::new(DataPath::new(
            meta.clone(),
            config.site.clone(),
            config.cache_bytes,
            config.node_connections,
            config.timeout,
            config.local_node.clone(),
        ));
        data.refresh_nodes().await?;
        let workers = Arc::new(Workers::default());
        workers.spawn(SessionKeeper { meta: meta.clone(), data: data.clone(), period });
        meta.report_workers(Arc::downgrade(&workers));
        let (compactor, compact_queue) = Compactor::new(meta.clone(), data.clone(), config.chunk_size);
        workers.spawn(compactor);
        Ok(Arc::new(Vfs {
            upload_slots: Arc::new(Semaphore::new(config.upload_window.max(1))),
            config,
            meta,
            data,
            files: Mutex::default(),
            handles: Mutex::default(),
            dirs: Mutex::default(),
            next_handle: AtomicU64::new(1),
            seen_versions: Mutex::default(),
            absent_xattrs: Mutex::default(),
            changed_parent: Mutex::default(),
            compact_queue,
            workers,
        }))
    }

    /// How long answers may be reused without asking meta (`ClientConfig::attr_ttl`).
    pub fn attr_ttl(&self) -> Duration {
        self.config.attr_ttl
    }

    /// Stops the workers and ends the session at meta, dropping its locks (best effort).
    pub async fn shutdown(&self) {
        self.workers.stop(Duration::from_secs(5)).await;
        let _ = self.meta.call(Goodbye { session: self.meta.session() }).await;
    }

    /// What the client's background workers are doing.
    pub fn workers(&self) -> Vec<WorkerStatus> {
        self.workers.statuses()
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}
