//! The client's data path: the site's nodes, chunk placement, storing chunks and
//! fetching them (uploads in flight, then the chunk cache, then a node, one fetch per
//! chunk however many readers want it, every fetched chunk verified against its id).

use crate::error::VfsError;
use crate::meta_link::MetaLink;
use bytes::Bytes;
use chunk::cache::ChunkCache;
use net::NodeDirectory;
use proto::error::ErrorCode;
use proto::meta::{ChunkLocations, ListNodes, StoredChunk};
use proto::node::{NodeReply, NodeRequest, NodeResult};
use proto::placement::rendezvous;
use proto::policy::{Policy, Replicate};
use proto::types::{ChunkId, NodeInfo};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use util::single_flight::SingleFlight;
use util::sync::{lock, read, write};

type Result<T> = std::result::Result<T, VfsError>;
/// A whole chunk's bytes, shared by the cache, uploads and readers.
pub(crate) type ChunkData = Bytes;

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
}

impl DataPath {
    pub fn new(
        meta: Arc<MetaLink>,
        site: String,
        cache_bytes: usize,
        node_connections: usize,
        timeout: Duration,
    ) -> DataPath {
        DataPath {
            meta,
            site,
            nodes: NodeDirectory::new(timeout, Box::new(move |_| node_connections)),
            site_nodes: RwLock::default(),
            cache: ChunkCache::new(cache_bytes),
            uploading: Mutex::default(),
            fetches: SingleFlight::default(),
        }
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

    async fn node_call(&self, node: &str, req: &NodeRequest, bulk: Bytes) -> Result<(NodeReply, Bytes)> {
        let client =
            self.nodes.client(node).await.map_err(|e| VfsError::new(ErrorCode::Io, format!("node {node}: {e}")))?;
        let (res, bulk): (NodeResult, Bytes) = client.call_bulk(req, bulk).await?;
        Ok((res?, bulk))
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

    /// Stores a chunk on the first node of its placement that accepts it; that node
    /// makes the other copies `policy` asks for and answers where they all are. A
    /// failed replication (`NotReplicated`) is final: another node of this site would
    /// meet the same unreachable site.
    pub async fn store_chunk(&self, id: ChunkId, data: &Bytes, policy: &Policy) -> Result<StoredChunk> {
        let put = NodeRequest::Put { id, replicate: Replicate::for_writer(policy, &self.site) };
        let mut last = VfsError::new(ErrorCode::Io, "no storage node is registered at this site");
        let mut nodes = self.placement(&id);
        if nodes.is_empty() {
            // Perhaps nodes joined since the last refresh.
            self.refresh_nodes().await?;
            nodes = self.placement(&id);
        }
        for node in nodes {
            match self.node_call(&node, &put, data.clone()).await {
                Ok((NodeReply::Stored(nodes), _)) if !nodes.is_empty() => {
                    return Ok(StoredChunk { id, size: data.len() as u64, nodes });
                }
                Ok(_) => return Ok(StoredChunk { id, size: data.len() as u64, nodes: vec![node] }),
                Err(e) if e.code == ErrorCode::NotReplicated => {
                    tracing::error!(chunk = %id, %node, "the write fails: {e}");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(chunk = %id, %node, "store failed, trying the next node: {e}");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// A whole chunk: from the upload set, the cache, or a node (one fetch per chunk
    /// however many readers want it), verified against its id.
    pub async fn chunk(&self, id: ChunkId) -> Result<ChunkData> {
        if let Some((data, _)) = lock(&self.uploading).get(&id) {
            return Ok(data.clone());
        }
        if let Some(data) = self.cache.get(&id) {
            return Ok(data);
        }
        self.fetches.run(id, || self.fetch_chunk(id)).await
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
                let records = self.meta.call(ChunkLocations { ids: vec![id] }).await?;
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
            let get = NodeRequest::Get { id, offset: 0, len: u64::MAX, local_only: false };
            match self.node_call(&node, &get, Bytes::new()).await {
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
                    // A corrupt or missing copy is not an answer: try the next copy. A chunk
                    // missing on every node is lost data (EIO), not a missing name (ENOENT).
                    last = if e.code == ErrorCode::NotFound { VfsError::new(ErrorCode::Io, e.context) } else { e };
                }
            }
        }
    }
}
