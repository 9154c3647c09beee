//! The client's data path: the site's nodes, chunk placement, storing chunks and
//! fetching them (uploads in flight, then the chunk cache, then the store of a node in
//! this process, then a node over the network; one fetch per chunk however many
//! readers want it). Every chunk is verified against its id exactly once on its way
//! here: by the store that read it from disk, by the site node that received it over
//! the WAN, or by this client when the node that answered is not a certificate-proven
//! node of its own site.

use crate::error::VfsError;
use crate::meta_link::MetaLink;
use bytes::Bytes;
use chunk::cache::ChunkCache;
use chunk::{ChunkError, ChunkStore};
use net::{NodeDirectory, Role};
use proto::cap::Cap;
use proto::error::ErrorCode;
use proto::meta::{ChunkLocations, Extents, ListNodes, Open, OpenAccess, Opened, Release, StoredChunk};
use proto::node::{Get, NodeMessage, Put};
use proto::placement::rendezvous;
use proto::policy::{Policy, Replicate};
use proto::types::{ChunkId, InodeId, NodeInfo};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use util::single_flight::SingleFlight;
use util::sync::{lock, read, write};

type Result<T> = std::result::Result<T, VfsError>;
/// A whole chunk's bytes, shared by the cache, uploads and readers.
pub(crate) type ChunkData = Bytes;

/// The storage node running in this client's own process (`locus up`): the client reads
/// its chunk store directly, without loopback TLS and without hashing again (the
/// store verifies every chunk it reads from disk).
#[derive(Debug, Clone)]
pub struct LocalNode {
    /// The node's id, for logs.
    pub id: String,
    /// The node's own (opened, locked) chunk store.
    pub store: Arc<ChunkStore>,
}

/// Chunks and the nodes that hold them, as one client sees them.
pub(crate) struct DataPath {
    meta: Arc<MetaLink>,
    site: String,
    nodes: NodeDirectory,
    /// Ids of this site's live nodes, the input of placement.
    site_nodes: RwLock<Vec<String>>,
    pub cache: ChunkCache,
    /// Chunks being uploaded, readable before they reach a node (with a count of the
    /// uploads that hold each).
    uploading: Mutex<HashMap<ChunkId, (ChunkData, usize)>>,
    fetches: SingleFlight<ChunkId, ChunkData>,
    /// Meta's read capabilities per chunk (a refused one is asked for again with the
    /// extents of the file being read).
    read_caps: Mutex<HashMap<ChunkId, Cap>>,
    /// Meta's latest put capability.
    put_cap: Mutex<Option<Cap>>,
    /// The node in this process, read first when there is one.
    local: Option<LocalNode>,
}

/// Read capabilities kept at most; past that the map starts again (files reopened
/// or read again ask meta for fresh ones).
const MAX_READ_CAPS: usize = 1 << 20;

impl DataPath {
    pub fn new(
        meta: Arc<MetaLink>,
        site: String,
        cache_bytes: usize,
        node_connections: usize,
        timeout: Duration,
        local: Option<LocalNode>,
    ) -> DataPath {
        DataPath {
            meta,
            site,
            nodes: NodeDirectory::new(timeout, Box::new(move |_| node_connections)),
            site_nodes: RwLock::default(),
            cache: ChunkCache::new(cache_bytes),
            uploading: Mutex::default(),
            fetches: SingleFlight::default(),
            read_caps: Mutex::default(),
            put_cap: Mutex::default(),
            local,
        }
    }

    /// Keeps the capabilities meta sent with an open of a file (or its extents).
    pub fn learn_caps(&self, opened: &Opened) {
        if !opened.caps.read.is_empty() {
            let mut caps = lock(&self.read_caps);
            if caps.len() > MAX_READ_CAPS {
                caps.clear();
            }
            for (e, cap) in opened.extents.iter().zip(&opened.caps.read) {
                caps.insert(e.chunk, *cap);
            }
        }
        if let Some(put) = opened.caps.put {
            // The newest epoch's first (a meta restarted at a new primary), then the latest.
            let mut current = lock(&self.put_cap);
            if current.is_none_or(|c| (c.epoch, c.expires_ms) < (put.epoch, put.expires_ms)) {
                *current = Some(put);
            }
        }
    }

    /// Asks meta again for the capabilities a node refused: read ones with the
    /// extents of the file the chunk belongs to, a put one with an open for writing of
    /// `ino` (released at once).
    async fn refresh_caps(&self, ino: InodeId, write: bool) -> Result<()> {
        let opened = if write {
            let session = self.meta.session();
            let access = OpenAccess { read: false, write: true };
            let opened = self.meta.call(Open { ino, session, truncate: false, access }).await?;
            self.meta.call(Release { ino, session }).await?;
            opened
        } else {
            self.meta.call(Extents { ino }).await?
        };
        self.learn_caps(&opened);
        Ok(())
    }

    /// Learns the nodes from meta; this site's live nodes become the placement set
    /// (every live node if the site has none).
    pub async fn refresh_nodes(&self) -> Result<()> {
        let list = self.meta.call(ListNodes {}).await?;
        let live: Vec<&NodeInfo> = list.iter().filter(|n| n.last_seen_secs < 30 && !n.drained).collect();
        let mine: Vec<&NodeInfo> = live.iter().copied().filter(|n| n.site == self.site).collect();
        let chosen = if mine.is_empty() { &live } else { &mine };
        let mut ids: Vec<String> = chosen.iter().map(|n| n.id.clone()).collect();
        ids.sort();
        *write(&self.site_nodes) = ids;
        self.nodes.update(list);
        Ok(())
    }

    async fn node_call<M: NodeMessage>(&self, node: &str, req: M, bulk: M::Bulk) -> Result<M::Response> {
        let client =
            self.nodes.client(node).await.map_err(|e| VfsError::new(ErrorCode::Io, format!("node {node}: {e}")))?;
        Ok(client.send_node(req, bulk).await??)
    }

    /// Site nodes in placement order for `chunk`.
    fn placement(&self, chunk: &ChunkId) -> Vec<String> {
        let nodes = read(&self.site_nodes);
        rendezvous(chunk, &nodes, nodes.len()).into_iter().map(String::from).collect()
    }

    /// Makes `data` readable under `id` while it is being uploaded.
    pub fn begin_upload(&self, id: ChunkId, data: &ChunkData) {
        lock(&self.uploading).entry(id).or_insert_with(|| (data.clone(), 0)).1 += 1;
    }

    /// Ends one upload of `id`; a stored chunk moves to the cache.
    pub fn end_upload(&self, id: ChunkId, stored: bool) {
        let mut uploading = lock(&self.uploading);
        if let Some(entry) = uploading.get_mut(&id) {
            if stored {
                self.cache.insert(id, entry.0.clone());
            }
            entry.1 -= 1;
            if entry.1 == 0 {
                uploading.remove(&id);
            }
        }
    }

    /// Stores a chunk of file `ino` on the first node of its placement that accepts
    /// it (with meta's put capability, asked again once if a node refuses it); that
    /// node makes the other copies `policy` asks for and answers where they all are.
    /// A failed replication (`NotReplicated`) is final: another node of this site
    /// would meet the same unreachable site. So is a capability refused again for its
    /// epoch (`ReadOnly`, EROFS): this client's meta lost the primary role (failover),
    /// and no node may store for it.
    pub async fn store_chunk(&self, ino: InodeId, id: ChunkId, data: &Bytes, policy: &Policy) -> Result<StoredChunk> {
        let replicate = Replicate::for_writer(policy, &self.site);
        let mut last = VfsError::new(ErrorCode::Io, "no storage node is registered at this site");
        let mut nodes = self.placement(&id);
        if nodes.is_empty() {
            // Perhaps nodes joined since the last refresh.
            self.refresh_nodes().await?;
            nodes = self.placement(&id);
        }
        let mut refreshed = false;
        let mut i = 0;
        while i < nodes.len() {
            let node = &nodes[i];
            let cap = *lock(&self.put_cap);
            let epoch = cap.map_or(0, |c| c.epoch);
            let put = Put { id, cap, epoch, replicate: replicate.clone() };
            match self.node_call(node, put, data.clone()).await {
                Ok(stored) => {
                    let receipt = stored.receipt;
                    return Ok(StoredChunk { id, size: data.len() as u64, nodes: stored.holders(node), receipt });
                }
                Err(e) if matches!(e.code, ErrorCode::PermissionDenied | ErrorCode::ReadOnly) && !refreshed => {
                    // Expired, signed by a meta that restarted since, or (ReadOnly) of an
                    // older epoch than the node's: a meta restarted at a new primary
                    // signs a current one.
                    refreshed = true;
                    tracing::debug!(chunk = %id, %node, "put capability refused, asking meta again: {e}");
                    self.refresh_caps(ino, true).await?;
                    continue;
                }
                Err(e) if e.code == ErrorCode::ReadOnly => {
                    tracing::error!(chunk = %id, %node,
                        "the write fails: the node refuses this meta's capability: {}", e.context);
                    return Err(e);
                }
                Err(e) if e.code == ErrorCode::NotReplicated => {
                    tracing::error!(chunk = %id, %node, "the write fails: {e}");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(chunk = %id, %node, "store failed, trying the next node: {e}");
                    last = e;
                }
            }
            i += 1;
        }
        Err(last)
    }

    /// Bytes of whole chunks held in memory (the chunk cache).
    pub fn cached_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Drops a chunk a sequential reader has gone past from the chunk cache: the kernel's
    /// page cache holds what was read, and the chunk's buffer (a pooled one, read from
    /// a store in this process) goes back to be reused instead of new memory being
    /// faulted in and zeroed for every chunk of a long read.
    pub fn forget(&self, id: &ChunkId) {
        self.cache.remove(id);
    }

    /// Chunk `id` of file `ino` (whose extents meta is asked for again when a node
    /// wants a read capability this client lacks: one of its own writes since it
    /// opened the file, say, gone from the cache).
    /// The whole chunk comes from the upload set, the cache, or a node (one fetch per
    /// chunk however many readers want it), verified against its id.
    pub async fn chunk(&self, id: ChunkId, ino: InodeId) -> Result<ChunkData> {
        if let Some(data) = self.held(&id) {
            return Ok(data);
        }
        self.fetches.run(id, || self.fetch_chunk(id, ino, None)).await
    }

    /// Bytes `[offset, offset+len)` of chunk `id` of file `ino` (fewer at its end), for
    /// a reader that jumped there: a slice of the chunk if this client holds it, else
    /// only the blocks holding them, read by the store in this process or a node of this
    /// site, either of which checks them against the chunk's outboard (a 4 KiB read of a
    /// 4 MiB chunk no longer moves and hashes 4 MiB). A node that does not vouch for what
    /// it serves sends the whole chunk, checked and kept here. Not coalesced: readers of
    /// different parts want different bytes.
    pub async fn chunk_part(&self, id: ChunkId, ino: InodeId, offset: u64, len: u64) -> Result<Bytes> {
        match self.held(&id) {
            Some(data) => part_of(&id, &data, offset, len),
            None if len > chunk::PART_MAX => part_of(&id, &self.chunk(id, ino).await?, offset, len),
            None => self.fetch_chunk(id, ino, Some((offset, len))).await,
        }
    }

    /// The chunk from the upload set or the cache.
    fn held(&self, id: &ChunkId) -> Option<ChunkData> {
        if let Some((data, _)) = lock(&self.uploading).get(id) {
            return Some(data.clone());
        }
        self.cache.get(id)
    }

    /// Bytes `[offset, offset+len)` of the chunk from the store of the node in this
    /// process, verified by that store as it reads the file. `None` when there is no such node or it has no good copy: the
    /// network path then tries every copy, as for any other client.
    async fn read_local(&self, id: ChunkId, (offset, len): (u64, u64)) -> Option<ChunkData> {
        let local = self.local.as_ref()?;
        let store = local.store.clone();
        match tokio::task::spawn_blocking(move || store.get(&id, offset, len)).await {
            Ok(Ok(data)) => Some(data),
            Ok(Err(ChunkError::NotFound { .. })) => None,
            Ok(Err(e)) => {
                tracing::warn!(chunk = %id, node = %local.id, "in-process read failed, asking the nodes: {e}");
                None
            }
            Err(e) => {
                tracing::error!(chunk = %id, node = %local.id, "in-process read task failed: {e}");
                None
            }
        }
    }

    /// Whether `node` proved with its certificate (mutual TLS) to be a node of this
    /// client's site. Such a node verified every chunk it serves (read from its disk,
    /// or received across the WAN), so the client does not hash it again; a chunk from
    /// any other node (another site's, or any without TLS) is hashed here.
    async fn vouches(&self, node: &str) -> bool {
        let Ok(client) = self.nodes.client(node).await else { return false };
        client.server_identity().await.is_some_and(|p| p.role == Role::Node && p.site == self.site)
    }

    /// The whole chunk (kept in the cache), or with `part` (offset, length) those bytes
    /// of it (kept only if the whole chunk had to be fetched).
    async fn fetch_chunk(&self, id: ChunkId, ino: InodeId, part: Option<(u64, u64)>) -> Result<ChunkData> {
        if let Some(data) = self.read_local(id, part.unwrap_or((0, u64::MAX))).await {
            if part.is_none() {
                self.cache.insert(id, data.clone());
            }
            return Ok(data);
        }
        let started = std::time::Instant::now();
        let mut candidates = self.placement(&id);
        let mut last = VfsError::new(ErrorCode::Io, format!("chunk {id} is on no reachable node"));
        let mut asked_meta = false;
        let mut refreshed = false;
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
                let cap = lock(&self.read_caps).get(&id).copied();
                let records = self.meta.call(ChunkLocations { ids: vec![id], caps: vec![cap] }).await?;
                for node in records.into_iter().flat_map(|r| r.nodes) {
                    if !candidates.contains(&node) {
                        candidates.push(node);
                    }
                }
                if i == candidates.len() {
                    return Err(last);
                }
            }
            let node = candidates[i].clone();
            i += 1;
            let cap = lock(&self.read_caps).get(&id).copied();
            let vouches = self.vouches(&node).await;
            // Only a node that vouches for what it serves sends a part.
            let (offset, len) = part.filter(|_| vouches).unwrap_or((0, u64::MAX));
            let get = Get { id, offset, len, local_only: false, cap };
            match self.node_call(&node, get, ()).await {
                Ok(data) => {
                    // How a read's start went (`LOCUS_LOG=client::data=trace`).
                    tracing::trace!(chunk = %id, %node, ms = started.elapsed().as_millis() as u64, "fetched");
                    if vouches && part.is_some() {
                        return Ok(data);
                    }
                    if !vouches && ChunkId::of(&data) != id {
                        tracing::error!(chunk = %id, %node, "chunk failed its hash check in transit");
                        last = VfsError::new(ErrorCode::Corrupt, format!("chunk {id} from {node} is corrupt"));
                        continue;
                    }
                    self.cache.insert(id, data.clone());
                    return match part {
                        Some((offset, len)) => part_of(&id, &data, offset, len),
                        None => Ok(data),
                    };
                }
                Err(e) if matches!(e.code, ErrorCode::PermissionDenied | ErrorCode::ReadOnly) && !refreshed => {
                    // Expired, signed by a meta that restarted since, of an older epoch
                    // than the node's, or never had (a chunk this client wrote after it
                    // opened the file): ask again, retry.
                    refreshed = true;
                    tracing::debug!(chunk = %id, %node, "read capability refused, asking meta again: {e}");
                    self.refresh_caps(ino, false).await?;
                    i -= 1;
                }
                Err(e) if e.code == ErrorCode::ReadOnly => {
                    // A read is not refused with EROFS: EIO, with the reason in the log.
                    tracing::error!(chunk = %id, %node, "the node refuses this meta's read capability: {}", e.context);
                    last = VfsError::new(ErrorCode::Io, e.context);
                }
                Err(e) => {
                    // A corrupt or missing copy is not an answer: try the next copy. A chunk
                    // missing on every node is lost data (EIO), not a missing name (ENOENT).
                    last = if e.code == ErrorCode::NotFound { VfsError::new(ErrorCode::Io, e.context) } else { e };
                }
            }
        }
    }
}

/// Bytes `[offset, offset+len)` of chunk `id` (fewer at its end); an offset past its end
/// is an extent that points beyond the chunk.
fn part_of(id: &ChunkId, data: &ChunkData, offset: u64, len: u64) -> Result<Bytes> {
    let size = data.len() as u64;
    if offset > size {
        return Err(VfsError::new(ErrorCode::Corrupt, format!("extent beyond end of chunk {id}")));
    }
    Ok(data.slice(offset as usize..offset.saturating_add(len).min(size) as usize))
}
