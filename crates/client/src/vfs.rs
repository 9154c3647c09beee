//! The `Vfs`: POSIX operations over the control path (meta) and the data path (nodes).
//! Writes are buffered per file, cut into content-addressed chunks, stored on the
//! site's nodes in the background (write-behind) and committed to meta as extents on
//! flush, fsync and close. Reads resolve extents to chunks, served from the in-flight
//! set, the chunk cache or a node, with sequential read-ahead.

use crate::error::VfsError;
use crate::file::{DirtyBuffer, FileInner, FileState};
use bytes::Bytes;
use chunk::cache::ChunkCache;
use net::RpcClient;
use proto::error::ErrorCode;
use proto::extent::{ExtentMap, Segment};
use proto::meta::*;
use proto::node::{NodeReply, NodeRequest, NodeResult};
use proto::placement::rendezvous;
use proto::types::*;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;
use tokio::sync::{OnceCell, Semaphore};

type Result<T> = std::result::Result<T, VfsError>;
/// A whole chunk's bytes, shared by the cache, uploads and readers.
type ChunkData = Bytes;

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
    /// Chunk uploads in flight at once (write-behind window).
    pub upload_window: usize,
    /// Buffered bytes per file before everything buffered is cut into chunks.
    pub max_dirty_bytes: usize,
    pub meta_connections: usize,
    pub node_connections: usize,
    pub timeout: Duration,
    /// How long answers may be reused without asking meta (as the kernel's attribute
    /// cache); used for the absence of extended attributes.
    pub attr_ttl: Duration,
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
            upload_window: 16,
            max_dirty_bytes: 64 << 20,
            meta_connections: 2,
            node_connections: 2,
            timeout: Duration::from_secs(60),
            attr_ttl: Duration::from_secs(1),
        }
    }
}

/// Options of `open(2)` the Vfs acts on (access checks are the adapter's or kernel's).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenOptions {
    pub truncate: bool,
}

/// An open file, as returned by `open`/`create`.
pub type FileHandle = u64;
/// An open directory listing.
pub type DirHandle = u64;

struct Handle {
    file: Arc<FileState>,
    /// End of the previous read: a read starting here is sequential.
    last_read_end: AtomicU64,
    /// Current read-ahead window in chunks (adaptive).
    window: AtomicU64,
    /// File offset up to which read-ahead was already started.
    prefetched_to: AtomicU64,
}

struct DirCursor {
    ino: InodeId,
    buffered: VecDeque<DirEntry>,
    after: u64,
    done: bool,
}

#[derive(Default)]
struct NodeTable {
    /// Ids of this site's live nodes, the input of placement.
    site_nodes: Vec<String>,
    addrs: HashMap<String, String>,
    clients: HashMap<String, Arc<RpcClient>>,
}

/// A mounted view of the Locus namespace.
pub struct Vfs {
    config: ClientConfig,
    meta: RpcClient,
    session: AtomicU64,
    nodes: RwLock<NodeTable>,
    node_connect: tokio::sync::Mutex<()>,
    files: Mutex<HashMap<InodeId, Arc<FileState>>>,
    handles: Mutex<HashMap<FileHandle, Arc<Handle>>>,
    dirs: Mutex<HashMap<DirHandle, Arc<tokio::sync::Mutex<DirCursor>>>>,
    next_handle: AtomicU64,
    cache: ChunkCache,
    /// Chunks being uploaded, readable before they reach a node.
    inflight: Mutex<HashMap<ChunkId, (ChunkData, usize)>>,
    /// Fetches under way, so concurrent misses of one chunk share one transfer.
    fetches: Mutex<HashMap<ChunkId, Arc<OnceCell<ChunkData>>>>,
    upload_slots: Arc<Semaphore>,
    /// `data_version` of each file when this client last had it open; an unchanged
    /// version lets the kernel keep its page cache.
    seen_versions: Mutex<HashMap<InodeId, u64>>,
    /// Extended attributes known to be absent, until when (see `getxattr`).
    absent_xattrs: Mutex<HashMap<(InodeId, Vec<u8>), std::time::Instant>>,
    /// Queue of the background compaction worker.
    compactor: OnceLock<tokio::sync::mpsc::UnboundedSender<InodeId>>,
}

impl Vfs {
    /// Connects to meta, opens a session and learns the site's nodes.
    pub async fn connect(config: ClientConfig) -> Result<Arc<Vfs>> {
        let meta = RpcClient::connect(&config.meta_addr, config.meta_connections, config.timeout)
            .await
            .map_err(|e| VfsError::new(ErrorCode::Io, format!("meta unreachable: {e}")))?;
        let vfs = Arc::new(Vfs {
            upload_slots: Arc::new(Semaphore::new(config.upload_window.max(1))),
            cache: ChunkCache::new(config.cache_bytes),
            config,
            meta,
            session: AtomicU64::new(0),
            nodes: RwLock::new(NodeTable::default()),
            node_connect: tokio::sync::Mutex::new(()),
            files: Mutex::default(),
            handles: Mutex::default(),
            dirs: Mutex::default(),
            next_handle: AtomicU64::new(1),
            inflight: Mutex::default(),
            fetches: Mutex::default(),
            seen_versions: Mutex::default(),
            compactor: OnceLock::new(),
            absent_xattrs: Mutex::default(),
        });
        let _ = vfs.compactor.set(crate::compact::spawn_worker(Arc::downgrade(&vfs)));
        let heartbeat = vfs.hello().await?;
        vfs.refresh_nodes().await?;
        let weak = Arc::downgrade(&vfs);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(heartbeat).await;
                let Some(vfs) = weak.upgrade() else { return };
                vfs.heartbeat().await;
            }
        });
        Ok(vfs)
    }

    async fn hello(&self) -> Result<Duration> {
        let info = SessionInfo {
            site: self.config.site.clone(),
            host: hostname(),
            pid: std::process::id(),
            purpose: self.config.purpose.clone(),
        };
        match self.meta_call(MetaRequest::Hello { protocol: proto::PROTOCOL_VERSION, session: info }).await? {
            MetaReply::Welcome { session, heartbeat_ms, .. } => {
                self.session.store(session, Ordering::Relaxed);
                Ok(Duration::from_millis(heartbeat_ms.max(100)))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn heartbeat(&self) {
        let session = self.session();
        match self.meta_call(MetaRequest::Heartbeat { session }).await {
            Err(e) if e.code == ErrorCode::NotFound => {
                tracing::warn!("session {session} expired at meta; opening a new one (locks were lost)");
                if let Err(e) = self.hello().await {
                    tracing::warn!("cannot reopen session: {e}");
                }
            }
            Err(e) => tracing::warn!("heartbeat failed: {e}"),
            Ok(_) => {}
        }
        if let Err(e) = self.refresh_nodes().await {
            tracing::warn!("cannot refresh the node list: {e}");
        }
    }

    /// Ends the session at meta, dropping its locks (best effort).
    pub async fn shutdown(&self) {
        let _ = self.meta_call(MetaRequest::Goodbye { session: self.session() }).await;
    }

    fn session(&self) -> SessionId {
        self.session.load(Ordering::Relaxed)
    }

    pub(crate) fn chunk_size(&self) -> u64 {
        self.config.chunk_size
    }

    pub(crate) async fn meta_call(&self, req: MetaRequest) -> Result<MetaReply> {
        let res: MetaResult = self.meta.call(&req).await?;
        Ok(res?)
    }

    async fn meta_attr(&self, req: MetaRequest) -> Result<Attr> {
        match self.meta_call(req).await? {
            MetaReply::Attr(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    async fn meta_done(&self, req: MetaRequest) -> Result<()> {
        match self.meta_call(req).await? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn refresh_nodes(&self) -> Result<()> {
        let MetaReply::Nodes(list) = self.meta_call(MetaRequest::ListNodes).await? else {
            return Err(VfsError::new(ErrorCode::Internal, "ListNodes: unexpected reply"));
        };
        let live: Vec<&NodeInfo> = list.iter().filter(|n| n.last_seen_secs < 30).collect();
        let mine: Vec<&NodeInfo> = live.iter().copied().filter(|n| n.site == self.config.site).collect();
        let chosen = if mine.is_empty() { &live } else { &mine };
        let mut table = self.nodes.write().expect("nodes lock");
        table.site_nodes = chosen.iter().map(|n| n.id.clone()).collect();
        table.site_nodes.sort();
        for n in &list {
            if table.addrs.get(&n.id) != Some(&n.addr) {
                table.clients.remove(&n.id);
                table.addrs.insert(n.id.clone(), n.addr.clone());
            }
        }
        Ok(())
    }

    async fn node(&self, id: &str) -> Result<Arc<RpcClient>> {
        if let Some(c) = self.nodes.read().expect("nodes lock").clients.get(id) {
            return Ok(c.clone());
        }
        let _one_at_a_time = self.node_connect.lock().await;
        let addr = {
            let table = self.nodes.read().expect("nodes lock");
            if let Some(c) = table.clients.get(id) {
                return Ok(c.clone());
            }
            table.addrs.get(id).cloned()
        };
        let addr = addr.ok_or_else(|| VfsError::new(ErrorCode::Io, format!("unknown node {id}")))?;
        let client = Arc::new(
            RpcClient::connect(&addr, self.config.node_connections, self.config.timeout)
                .await
                .map_err(|e| VfsError::new(ErrorCode::Io, format!("node {id}: {e}")))?,
        );
        self.nodes.write().expect("nodes lock").clients.insert(id.to_string(), client.clone());
        Ok(client)
    }

    async fn node_call(&self, node: &str, req: &NodeRequest, bulk: Bytes) -> Result<(NodeReply, Bytes)> {
        let (res, bulk): (NodeResult, Bytes) = self.node(node).await?.call_bulk(req, bulk).await?;
        Ok((res?, bulk))
    }

    /// Site nodes in placement order for `chunk`.
    fn placement(&self, chunk: &ChunkId) -> Vec<String> {
        let table = self.nodes.read().expect("nodes lock");
        rendezvous(chunk, &table.site_nodes, table.site_nodes.len()).into_iter().map(String::from).collect()
    }

    // ---- namespace -------------------------------------------------------------

    pub async fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr> {
        let attr = self.meta_attr(MetaRequest::Lookup { parent, name: name.to_vec() }).await?;
        Ok(self.local_view(attr).await)
    }

    /// Attributes, with this client's unflushed size and times if it has the file open.
    pub async fn getattr(&self, ino: InodeId) -> Result<Attr> {
        // Always ask meta: link counts and ctime change under an open file too
        // (link, unlink, rename, chmod through another client).
        let attr = self.meta_attr(MetaRequest::GetAttr { ino }).await?;
        Ok(self.local_view(attr).await)
    }

    /// Overlays what this client wrote but has not committed yet: size, mtime and ctime.
    async fn local_view(&self, attr: Attr) -> Attr {
        match self.open_file(attr.ino) {
            Some(file) => {
                let f = file.inner.lock().await;
                if !f.modified {
                    return attr;
                }
                Attr { size: f.attr.size, mtime: f.attr.mtime, ctime: f.attr.ctime.max(attr.ctime), ..attr }
            }
            None => attr,
        }
    }

    fn open_file(&self, ino: InodeId) -> Option<Arc<FileState>> {
        self.files.lock().expect("files lock").get(&ino).cloned()
    }

    pub async fn setattr(self: &Arc<Self>, ino: InodeId, set: SetAttr, caller: Caller) -> Result<Attr> {
        let Some(file) = self.open_file(ino) else {
            return self.meta_attr(MetaRequest::SetAttr { ino, set, caller }).await;
        };
        // Commit first so pending writes cannot undo a truncate or a time stamp.
        let mut f = file.inner.lock().await;
        self.commit_locked(ino, &mut f).await?;
        let size = set.size;
        let attr = self.meta_attr(MetaRequest::SetAttr { ino, set, caller }).await?;
        if let Some(size) = size {
            f.extents.truncate(size);
        }
        f.attr = attr.clone();
        Ok(attr)
    }

    pub async fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        node: NewNode,
        mode: u32,
        caller: Caller,
        exclusive: bool,
    ) -> Result<Attr> {
        self.meta_attr(MetaRequest::Create {
            parent,
            name: name.to_vec(),
            node,
            mode,
            caller,
            exclusive,
            open_by: None,
        })
        .await
    }

    pub async fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &[u8]) -> Result<Attr> {
        self.meta_attr(MetaRequest::Link { ino, new_parent, new_name: new_name.to_vec() }).await
    }

    pub async fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        match self.meta_call(MetaRequest::Unlink { parent, name: name.to_vec() }).await? {
            MetaReply::Unlinked { ino, .. } => {
                self.seen_versions.lock().expect("versions lock").remove(&ino);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    pub async fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.meta_done(MetaRequest::Rmdir { parent, name: name.to_vec() }).await
    }

    pub async fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        self.meta_done(MetaRequest::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            mode,
        })
        .await
    }

    pub async fn readlink(&self, ino: InodeId) -> Result<Vec<u8>> {
        match self.meta_call(MetaRequest::ReadLink { ino }).await? {
            MetaReply::Bytes(b) => Ok(b),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn opendir(&self, ino: InodeId) -> Result<DirHandle> {
        let attr = self.meta_attr(MetaRequest::GetAttr { ino }).await?;
        if attr.kind != FileKind::Dir {
            return Err(VfsError::new(ErrorCode::NotDir, format!("opendir of inode {ino}")));
        }
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let cursor = DirCursor { ino, buffered: VecDeque::new(), after: 0, done: false };
        self.dirs.lock().expect("dirs lock").insert(fh, Arc::new(tokio::sync::Mutex::new(cursor)));
        Ok(fh)
    }

    /// Next entries after cookie `after` (0 = from the start), fetched from meta in
    /// large pages and handed out in whatever amount the caller can take.
    pub async fn readdir(&self, dh: DirHandle, after: u64) -> Result<Vec<DirEntry>> {
        let cursor = self
            .dirs
            .lock()
            .expect("dirs lock")
            .get(&dh)
            .cloned()
            .ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, "bad directory handle"))?;
        let mut c = cursor.lock().await;
        if after != c.after || c.buffered.is_empty() {
            // A seek, or the buffer ran dry: (re)fill from `after`.
            if after != c.after {
                c.buffered.clear();
                c.done = false;
                c.after = after;
            }
            if !c.done && c.buffered.is_empty() {
                let page = match self.meta_call(MetaRequest::ReadDir { ino: c.ino, after, limit: 2048 }).await? {
                    MetaReply::Entries(e) => e,
                    other => return Err(unexpected(&other)),
                };
                c.done = page.len() < 2048;
                c.buffered.extend(page);
            }
        }
        Ok(c.buffered.iter().cloned().collect())
    }

    /// Tells the cursor how far the caller got, so the next `readdir` continues there.
    pub fn readdir_consumed(&self, dh: DirHandle, last_cookie: u64) {
        if let Some(cursor) = self.dirs.lock().expect("dirs lock").get(&dh).cloned()
            && let Ok(mut c) = cursor.try_lock()
        {
            while c.buffered.front().is_some_and(|e| e.cookie <= last_cookie) {
                c.buffered.pop_front();
            }
            c.after = last_cookie;
        }
    }

    pub fn releasedir(&self, dh: DirHandle) {
        self.dirs.lock().expect("dirs lock").remove(&dh);
    }

    /// An extended attribute. Absence is remembered for `attr_ttl`: the kernel asks for
    /// `security.capability` before every write, and that must not cost a round trip
    /// to meta each time.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>> {
        let key = (ino, name.to_vec());
        if let Some(until) = self.absent_xattrs.lock().expect("xattr lock").get(&key)
            && *until > std::time::Instant::now()
        {
            return Err(VfsError::new(ErrorCode::NoAttribute, "no such extended attribute"));
        }
        match self.meta_call(MetaRequest::GetXattr { ino, name: name.to_vec() }).await {
            Ok(MetaReply::Bytes(b)) => Ok(b),
            Ok(other) => Err(unexpected(&other)),
            Err(e) if e.code == ErrorCode::NoAttribute => {
                let mut absent = self.absent_xattrs.lock().expect("xattr lock");
                if absent.len() > 100_000 {
                    absent.clear();
                }
                absent.insert(key, std::time::Instant::now() + self.config.attr_ttl);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn forget_absent_xattrs(&self, ino: InodeId) {
        self.absent_xattrs.lock().expect("xattr lock").retain(|(i, _), _| *i != ino);
    }

    pub async fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta_done(MetaRequest::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), mode }).await
    }

    pub async fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>> {
        match self.meta_call(MetaRequest::ListXattr { ino }).await? {
            MetaReply::Names(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<()> {
        self.forget_absent_xattrs(ino);
        self.meta_done(MetaRequest::RemoveXattr { ino, name: name.to_vec() }).await
    }

    pub async fn statfs(&self) -> Result<FsStats> {
        match self.meta_call(MetaRequest::StatFs).await? {
            MetaReply::StatFs(s) => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    /// Makes every namespace change so far durable at meta (fsyncdir).
    pub async fn sync_meta(&self) -> Result<()> {
        self.meta_done(MetaRequest::Sync).await
    }

    // ---- open files --------------------------------------------------------------

    /// Opens a file; returns the handle and whether the kernel may keep cached pages
    /// (nobody changed the file since this client last had it open).
    pub async fn open(self: &Arc<Self>, ino: InodeId, opts: OpenOptions) -> Result<(FileHandle, bool)> {
        if let Some(file) = self.open_file(ino) {
            let mut f = file.inner.lock().await;
            if f.opens == 0 {
                // Lost a race with the last release; open afresh below.
                drop(f);
                return Box::pin(self.open(ino, opts)).await;
            }
            if opts.truncate {
                self.commit_locked(ino, &mut f).await?;
                let set = SetAttr { size: Some(0), ..SetAttr::default() };
                let caller = Caller { uid: f.attr.uid, gid: f.attr.gid };
                f.attr = self.meta_attr(MetaRequest::SetAttr { ino, set, caller }).await?;
                f.extents = ExtentMap::default();
            }
            f.opens += 1;
            drop(f);
            return Ok((self.new_handle(file), true));
        }
        let session = self.session();
        match self.meta_call(MetaRequest::Open { ino, session, truncate: opts.truncate }).await? {
            MetaReply::Opened { attr, extents } => Ok(self.adopt(session, attr, extents).await),
            other => Err(unexpected(&other)),
        }
    }

    /// Creates a regular file and opens it in one request.
    pub async fn create_open(
        self: &Arc<Self>,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        caller: Caller,
        exclusive: bool,
        opts: OpenOptions,
    ) -> Result<(Attr, FileHandle)> {
        let session = self.session();
        let req = MetaRequest::Create {
            parent,
            name: name.to_vec(),
            node: NewNode::File,
            mode,
            caller,
            exclusive,
            open_by: Some(session),
        };
        let (attr, extents) = match self.meta_call(req).await? {
            MetaReply::Opened { attr, extents } => (attr, extents),
            other => return Err(unexpected(&other)),
        };
        let (ino, existed) = (attr.ino, attr.size > 0);
        let (fh, _) = self.adopt(session, attr, extents).await;
        if opts.truncate && existed {
            // Someone else created it first and this open truncates.
            let attr = self.setattr(ino, SetAttr { size: Some(0), ..SetAttr::default() }, caller).await?;
            return Ok((attr, fh));
        }
        let attr = self.getattr(ino).await?;
        Ok((attr, fh))
    }

    /// Makes a file that meta has just recorded as open here a local open file (or
    /// joins the one another thread made meanwhile).
    async fn adopt(self: &Arc<Self>, session: SessionId, attr: Attr, extents: Vec<Extent>) -> (FileHandle, bool) {
        let ino = attr.ino;
        let keep_cache = self.seen_versions.lock().expect("versions lock").get(&ino) == Some(&attr.data_version);
        let state = Arc::new(FileState {
            ino,
            inner: tokio::sync::Mutex::new(FileInner {
                attr,
                extents: ExtentMap::from_extents(extents),
                dirty: DirtyBuffer::with_run_capacity(self.config.chunk_size as usize),
                pending: Vec::new(),
                uploads: Vec::new(),
                modified: false,
                opens: 1,
                lock_owners: HashSet::new(),
            }),
        });
        let raced = {
            let mut files = self.files.lock().expect("files lock");
            match files.get(&ino) {
                Some(existing) => Some(existing.clone()),
                None => {
                    files.insert(ino, state.clone());
                    None
                }
            }
        };
        let file = match raced {
            // Another thread opened it meanwhile: share its state, drop our record.
            Some(existing) => {
                existing.inner.lock().await.opens += 1;
                let _ = self.meta_call(MetaRequest::Release { ino, session }).await;
                existing
            }
            None => state,
        };
        (self.new_handle(file), keep_cache)
    }

    fn new_handle(&self, file: Arc<FileState>) -> FileHandle {
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(Handle {
            file,
            last_read_end: AtomicU64::new(u64::MAX),
            window: AtomicU64::new(2),
            prefetched_to: AtomicU64::new(0),
        });
        self.handles.lock().expect("handles lock").insert(fh, handle);
        fh
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>> {
        self.handles
            .lock()
            .expect("handles lock")
            .get(&fh)
            .cloned()
            .ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, format!("bad file handle {fh}")))
    }

    pub async fn write(self: &Arc<Self>, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32> {
        let handle = self.handle(fh)?;
        let mut f = handle.file.inner.lock().await;
        f.dirty.insert(offset, data);
        f.attr.size = f.attr.size.max(offset + data.len() as u64);
        // write(2) marks both mtime and ctime for update.
        let now = Timestamp::now();
        f.attr.mtime = now;
        f.attr.ctime = now;
        f.modified = true;
        let flush_all = f.dirty.bytes() > self.config.max_dirty_bytes;
        for (off, bytes) in f.dirty.take_chunks(self.config.chunk_size, flush_all) {
            self.start_upload(&mut f, off, bytes).await;
        }
        Ok(data.len() as u32)
    }

    /// Hashes a piece of written data into a chunk, maps it into the file's view and
    /// stores it on a node in the background.
    async fn start_upload(self: &Arc<Self>, f: &mut FileInner, offset: u64, bytes: Vec<u8>) {
        let permit = self.upload_slots.clone().acquire_owned().await.expect("semaphore open");
        let id = ChunkId::of(&bytes);
        let extent = Extent { file_offset: offset, len: bytes.len() as u64, chunk: id, chunk_offset: 0 };
        f.extents.insert(extent);
        f.pending.push(extent);
        let data = Bytes::from(bytes);
        {
            let mut inflight = self.inflight.lock().expect("inflight lock");
            inflight.entry(id).or_insert_with(|| (data.clone(), 0)).1 += 1;
        }
        let vfs = self.clone();
        f.uploads.push(tokio::spawn(async move {
            let stored = vfs.store_chunk(id, &data).await;
            if stored.is_ok() {
                vfs.cache.insert(id, data);
            }
            let mut inflight = vfs.inflight.lock().expect("inflight lock");
            if let Some(entry) = inflight.get_mut(&id) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    inflight.remove(&id);
                }
            }
            drop(permit);
            stored
        }));
    }

    /// Stores a chunk on the first node of its placement that accepts it.
    pub(crate) async fn store_chunk(&self, id: ChunkId, data: &Bytes) -> Result<StoredChunk> {
        let mut last = VfsError::new(ErrorCode::Io, "no storage node is registered at this site");
        let mut nodes = self.placement(&id);
        if nodes.is_empty() {
            // Perhaps nodes joined since the last refresh.
            self.refresh_nodes().await?;
            nodes = self.placement(&id);
        }
        for node in nodes {
            match self.node_call(&node, &NodeRequest::Put { id }, data.clone()).await {
                Ok(_) => return Ok(StoredChunk { id, size: data.len() as u64, nodes: vec![node] }),
                Err(e) => {
                    tracing::warn!(chunk = %id, %node, "store failed, trying the next node: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Reads up to `size` bytes at `offset` (fewer at the end of the file).
    pub async fn read(self: &Arc<Self>, fh: FileHandle, offset: u64, size: u32) -> Result<Bytes> {
        let handle = self.handle(fh)?;
        let (segments, end, ahead) = {
            let f = handle.file.inner.lock().await;
            let end = (offset + size as u64).min(f.attr.size);
            if offset >= end {
                return Ok(Bytes::new());
            }
            let sequential = handle.last_read_end.swap(end, Ordering::Relaxed) == offset || offset == 0;
            let ahead = if sequential {
                let cs = self.config.chunk_size;
                let max = self.config.readahead_chunks.min((self.config.cache_bytes as u64 / 2 / cs).max(1));
                if offset / cs != end.saturating_sub(1) / cs || offset.is_multiple_of(cs) {
                    // Crossing into a new chunk: the reader keeps going, widen the window.
                    let w = handle.window.load(Ordering::Relaxed);
                    handle.window.store((w * 2).min(max).max(1), Ordering::Relaxed);
                }
                let target = (end + handle.window.load(Ordering::Relaxed) * cs).min(f.attr.size);
                let from = handle.prefetched_to.fetch_max(target, Ordering::Relaxed).max(end);
                f.extents.segments(from, target.max(from))
            } else {
                handle.window.store(2, Ordering::Relaxed);
                handle.prefetched_to.store(0, Ordering::Relaxed);
                Vec::new()
            };
            (f.extents.segments(offset, end), end, ahead)
        };
        for seg in ahead {
            if let Segment::Data(e) = seg {
                let vfs = self.clone();
                tokio::spawn(async move {
                    let _ = vfs.chunk(e.chunk).await;
                });
            }
        }
        // (file offset, bytes) of every data piece; holes stay zero.
        let mut pieces = Vec::with_capacity(segments.len());
        for seg in segments {
            if let Segment::Data(e) = seg {
                let chunk = self.chunk(e.chunk).await?;
                let from = e.chunk_offset as usize;
                let to = from + e.len as usize;
                if to > chunk.len() {
                    return Err(VfsError::new(ErrorCode::Corrupt, format!("extent beyond end of chunk {}", e.chunk)));
                }
                pieces.push((e.file_offset, chunk.slice(from..to)));
            }
        }
        let f = handle.file.inner.lock().await;
        if let [(at, only)] = &pieces[..]
            && *at == offset
            && only.len() as u64 == end - offset
            && !f.dirty.overlaps(offset, end)
        {
            // The common case: one piece of one chunk, handed out without a copy.
            return Ok(only.clone());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for (at, piece) in &pieces {
            let at = (at - offset) as usize;
            out[at..at + piece.len()].copy_from_slice(piece);
        }
        // Buffered bytes are newer than any extent.
        f.dirty.overlay(offset, &mut out);
        Ok(Bytes::from(out))
    }

    /// A whole chunk: from the upload set, the cache, or a node (one fetch per chunk
    /// however many readers want it), verified against its id.
    pub(crate) async fn chunk(&self, id: ChunkId) -> Result<ChunkData> {
        if let Some((data, _)) = self.inflight.lock().expect("inflight lock").get(&id) {
            return Ok(data.clone());
        }
        if let Some(data) = self.cache.get(&id) {
            return Ok(data);
        }
        let cell = self.fetches.lock().expect("fetches lock").entry(id).or_default().clone();
        let result = cell.get_or_try_init(|| self.fetch_chunk(id)).await.cloned();
        self.fetches.lock().expect("fetches lock").remove(&id);
        result
    }

    async fn fetch_chunk(&self, id: ChunkId) -> Result<ChunkData> {
        let mut candidates = self.placement(&id);
        let mut last = VfsError::new(ErrorCode::Io, format!("chunk {id} is on no reachable node"));
        let mut asked_meta = false;
        let mut i = 0;
        loop {
            if i == candidates.len() {
                if asked_meta {
                    return Err(last);
                }
                asked_meta = true;
                // Addresses may be stale (a node restarted on another port): learn them
                // again, then try the placement once more and every recorded copy.
                self.refresh_nodes().await?;
                candidates = self.placement(&id);
                i = 0;
                if let MetaReply::Chunks(records) =
                    self.meta_call(MetaRequest::ChunkLocations { ids: vec![id] }).await?
                {
                    for node in records.into_iter().flat_map(|r| r.nodes) {
                        if !candidates.contains(&node) {
                            candidates.push(node);
                        }
                    }
                }
                if i == candidates.len() {
                    return Err(last);
                }
            }
            let node = candidates[i].clone();
            i += 1;
            match self
                .node_call(&node, &NodeRequest::Get { id, offset: 0, len: u64::MAX, local_only: false }, Bytes::new())
                .await
            {
                Ok((NodeReply::Data, data)) => {
                    if ChunkId::of(&data) != id {
                        tracing::error!(chunk = %id, %node, "chunk failed its hash check in transit");
                        last = VfsError::new(ErrorCode::Corrupt, format!("chunk {id} from {node} is corrupt"));
                        continue;
                    }
                    self.cache.insert(id, data.clone());
                    return Ok(data);
                }
                Ok((other, _)) => last = VfsError::new(ErrorCode::Internal, format!("Get answered {other:?}")),
                Err(e) => {
                    // A corrupt or missing copy is not an answer: try the next copy.
                    last = e;
                }
            }
        }
    }

    /// Stores and commits everything written through any handle of the file.
    pub async fn flush(self: &Arc<Self>, fh: FileHandle, lock_owner: Option<u64>) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        let committed = self.commit_locked(ino, &mut f).await.map(|_| ());
        if let Some(owner) = lock_owner
            && f.lock_owners.remove(&owner)
        {
            let session = self.session();
            self.meta_done(MetaRequest::ReleaseLocks { session, ino, owner }).await?;
        }
        committed
    }

    /// `flush` plus durability of everything meta acknowledged before.
    pub async fn fsync(self: &Arc<Self>, fh: FileHandle) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        if !self.commit_locked(ino, &mut f).await? {
            self.sync_meta().await?;
        }
        Ok(())
    }

    /// Cuts buffered data into chunks, waits for every upload and commits the pending
    /// extents. Returns whether a commit (itself durable) was sent.
    async fn commit_locked(self: &Arc<Self>, ino: InodeId, f: &mut FileInner) -> Result<bool> {
        for (off, bytes) in f.dirty.take_chunks(self.config.chunk_size, true) {
            self.start_upload(f, off, bytes).await;
        }
        let mut chunks = Vec::new();
        let mut failure = None;
        for upload in std::mem::take(&mut f.uploads) {
            match upload.await {
                Ok(Ok(c)) => chunks.push(c),
                Ok(Err(e)) => failure = Some(e),
                Err(e) => failure = Some(VfsError::new(ErrorCode::Io, format!("upload task failed: {e}"))),
            }
        }
        if let Some(e) = failure {
            // The data is lost: forget the pending extents so reads show what meta has.
            f.pending.clear();
            f.modified = false;
            if let Ok(MetaReply::Opened { attr, extents }) = self.meta_call(MetaRequest::Extents { ino }).await {
                f.attr = attr;
                f.extents = ExtentMap::from_extents(extents);
            }
            return Err(VfsError::new(e.code, format!("writing inode {ino}: {}", e.context)));
        }
        if f.pending.is_empty() && !f.modified {
            return Ok(false);
        }
        let req = MetaRequest::CommitWrite {
            ino,
            extents: std::mem::take(&mut f.pending),
            chunks,
            min_size: f.attr.size,
            mtime: f.attr.mtime,
        };
        f.attr = self.meta_attr(req).await?;
        f.modified = false;
        self.seen_versions.lock().expect("versions lock").insert(ino, f.attr.data_version);
        Ok(true)
    }

    pub async fn release(self: &Arc<Self>, fh: FileHandle) -> Result<()> {
        let handle = self.handles.lock().expect("handles lock").remove(&fh);
        let Some(handle) = handle else {
            return Err(VfsError::new(ErrorCode::InvalidArgument, format!("bad file handle {fh}")));
        };
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        let committed = self.commit_locked(ino, &mut f).await;
        f.opens -= 1;
        if f.opens == 0 {
            self.files.lock().expect("files lock").remove(&ino);
            self.seen_versions.lock().expect("versions lock").insert(ino, f.attr.data_version);
            if crate::compact::is_fragmented(&f.extents, f.attr.size, self.config.chunk_size)
                && let Some(queue) = self.compactor.get()
            {
                let _ = queue.send(ino);
            }
            let session = self.session();
            for owner in f.lock_owners.drain() {
                let _ = self.meta_call(MetaRequest::ReleaseLocks { session, ino, owner }).await;
            }
            drop(f);
            let vfs = self.clone();
            tokio::spawn(async move {
                if let Err(e) = vfs.meta_call(MetaRequest::Release { ino, session }).await {
                    tracing::warn!("release of inode {ino}: {e}");
                }
            });
        }
        committed.map(|_| ())
    }

    pub async fn fallocate(self: &Arc<Self>, fh: FileHandle, offset: u64, len: u64, mode: AllocateMode) -> Result<()> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let mut f = handle.file.inner.lock().await;
        self.commit_locked(ino, &mut f).await?;
        f.attr = self.meta_attr(MetaRequest::Fallocate { ino, offset, len, mode }).await?;
        if matches!(mode, AllocateMode::PunchHole | AllocateMode::ZeroRange) {
            f.extents.punch(offset, offset + len);
        }
        Ok(())
    }

    // ---- locks -----------------------------------------------------------------

    pub async fn getlk(&self, lock: LockRange) -> Result<Option<LockRange>> {
        match self.meta_call(MetaRequest::GetLock { session: self.session(), lock }).await? {
            MetaReply::Lock(l) => Ok(l),
            other => Err(unexpected(&other)),
        }
    }

    /// Sets or clears a byte-range lock; with `wait`, retries until it is granted.
    pub async fn setlk(&self, fh: FileHandle, lock: LockRange, wait: bool) -> Result<()> {
        let handle = self.handle(fh)?;
        if lock.kind != LockKind::Unlock {
            handle.file.inner.lock().await.lock_owners.insert(lock.owner);
        }
        let mut backoff = Duration::from_millis(5);
        loop {
            match self.meta_done(MetaRequest::SetLock { session: self.session(), lock }).await {
                Err(e) if wait && e.code == ErrorCode::WouldBlock => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }
}

fn unexpected(reply: &MetaReply) -> VfsError {
    VfsError::new(ErrorCode::Internal, format!("meta answered with an unexpected {reply:?}"))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}
