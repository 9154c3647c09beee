//! The site's window on other sites: a chunk a client asks for that this node does
//! not hold is fetched once from the nearest node that has it — over a pool of
//! long-lived connections sized from the measured round trip, whole chunks pipelined
//! on them while a reader's read-ahead keeps several in flight, a lone chunk split into
//! stripes — verified, kept in the site cache (on disk, capped, least recently used out
//! first) and served from there to every client of the site. Concurrent misses of one
//! chunk share one fetch.
//!
//! `SiteLink` is one object seen from four rooms: `config` (how other sites are
//! reached, the connection count), `cache` (the copies on disk and in memory),
//! `fetch` (from other nodes, in flight) and `peers` (who they are, how far, who
//! likely holds a chunk); this file holds its face and the `site-link` worker.

mod cache;
mod config;
mod fetch;
mod peers;

pub use config::WanConfig;

use bytes::Bytes;
use chunk::cache::{ChunkCache, LruOrder};
use chunk::{ChunkError, ChunkStore};
use net::NodeDirectory;
use proto::error::{ErrorCode, WireError};
use proto::meta::{StoredChunk, UpdateLocations};
use proto::types::{ChunkId, NodeInfo};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use util::single_flight::SingleFlight;
use util::sync::lock;
use util::worker::{Step, Worker, every};

/// Counters shown by `locus status` and the benchmarks.
#[derive(Debug, Default)]
pub struct WanStats {
    pub fetched_chunks: std::sync::atomic::AtomicU64,
    pub fetched_bytes: std::sync::atomic::AtomicU64,
    pub cache_hits: std::sync::atomic::AtomicU64,
    pub corrupt_in_transit: std::sync::atomic::AtomicU64,
}

/// This node's link to the rest of the cluster for chunks it lacks.
pub struct SiteLink {
    me: String,
    site: String,
    config: WanConfig,
    meta: Arc<crate::MetaClient>,
    cache: Arc<ChunkStore>,
    /// Chunks fetched lately, in memory: served while their disk copy is being written
    /// and to the readers that follow right behind.
    recent: ChunkCache,
    lru: Mutex<LruOrder>,
    /// Held while a copy is made room for and written, so that concurrent copies do
    /// not each find the same room and overrun the cap (the later put would fail).
    keeping: tokio::sync::Mutex<()>,
    peers: NodeDirectory,
    /// Smoothed round trip to each node of another site, once measured.
    rtts: RwLock<HashMap<String, Duration>>,
    /// Best round trip per other site, as last measured (reported in the heartbeat).
    site_rtts: Mutex<Vec<(String, u64)>>,
    /// Payload one connection can keep in flight (`flow_window`).
    window: u64,
    /// Connections in use per node of another site (shown by `locus status`).
    pools: Mutex<BTreeMap<String, usize>>,
    /// Chunk fetches under way: with several (a reader's read-ahead) each travels whole
    /// on one connection; a lone one is striped over them all.
    in_flight: std::sync::atomic::AtomicUsize,
    fetches: SingleFlight<ChunkId, Bytes>,
    /// Location changes not yet reported to meta (an empty `nodes` means this node).
    pending: Mutex<(Vec<StoredChunk>, Vec<ChunkId>)>,
    pub stats: WanStats,
    /// Meta lists this node as drained.
    drained: std::sync::atomic::AtomicBool,
}

impl SiteLink {
    /// The highest epoch of the primary role this node has seen, which its puts to
    /// other nodes carry.
    pub(crate) fn epoch(&self) -> u64 {
        self.meta.epoch.get()
    }

    /// Opens the site cache (a chunk store of its own under `cache_dir`).
    pub fn open(
        me: String,
        site: String,
        config: WanConfig,
        meta: Arc<crate::MetaClient>,
        cache: ChunkStore,
    ) -> Result<SiteLink, ChunkError> {
        let mut lru = LruOrder::default();
        let mut after = None;
        loop {
            let page = cache.list(after, 4096)?;
            let Some(last) = page.last().copied() else { break };
            after = Some(last);
            for id in page {
                lru.touch(id);
            }
        }
        let pool_config = config.clone();
        let pool_size: net::PoolSize =
            Box::new(move |n: &NodeInfo| pool_config.connections_for(&n.site).unwrap_or(pool_config.max_connections));
        Ok(SiteLink {
            me,
            site,
            peers: NodeDirectory::new(config.timeout, pool_size),
            config,
            meta,
            cache: Arc::new(cache),
            recent: ChunkCache::new(cache::RECENT_BYTES),
            lru: Mutex::new(lru),
            keeping: tokio::sync::Mutex::new(()),
            rtts: RwLock::default(),
            site_rtts: Mutex::default(),
            window: config::flow_window(),
            pools: Mutex::default(),
            in_flight: Default::default(),
            fetches: SingleFlight::default(),
            pending: Mutex::default(),
            stats: WanStats::default(),
            drained: Default::default(),
        })
    }

    /// The cluster's other nodes as last learned from meta, with connections to them.
    pub(crate) fn peers(&self) -> &NodeDirectory {
        &self.peers
    }

    /// Queues copies made by replication for the next report to meta.
    pub(crate) fn report_copies(&self, id: ChunkId, size: u64, holders: Vec<String>) {
        lock(&self.pending).0.push(StoredChunk { id, size, nodes: holders, receipt: None });
    }

    /// Bytes `[offset, offset + len)` of a chunk this node does not store itself.
    pub async fn get(self: &Arc<Self>, id: ChunkId, offset: u64, len: u64) -> Result<Bytes, WireError> {
        if let Some(data) = self.cached(id, offset, len).await? {
            return Ok(data);
        }
        let fetched = self.fetches.run(id, || self.fetch_unless_recent(id)).await?;
        slice(id, fetched, offset, len)
    }

    /// Reports cached and evicted copies to meta; returns how many changes went.
    async fn report_locations(&self) -> Result<usize, WireError> {
        let (added, removed) = std::mem::take(&mut *lock(&self.pending));
        if added.is_empty() && removed.is_empty() {
            return Ok(0);
        }
        let count = added.len() + removed.len();
        let req = UpdateLocations { node: self.me.clone(), added: added.clone(), removed: removed.clone() };
        let Err(answer) = crate::ask_meta(&self.meta, req).await else { return Ok(count) };
        // Keep them for the next round.
        let mut pending = lock(&self.pending);
        pending.0.extend(added);
        pending.1.extend(removed);
        Err(answer)
    }
}

/// The `site-link` worker: at every heartbeat period it learns the nodes from meta,
/// measures round trips to other sites and reports the site cache's changes.
pub(crate) struct SiteLinkWorker {
    pub link: Arc<SiteLink>,
    pub period: Duration,
    pub reported: u64,
}

impl Worker for SiteLinkWorker {
    type Error = WireError;

    fn name(&self) -> String {
        "site-link".into()
    }

    fn progress(&self) -> String {
        let pools: Vec<String> = lock(&self.link.pools).iter().map(|(node, n)| format!("{node}:{n}")).collect();
        format!(
            "{} peers, connections {}, {} cache changes reported",
            self.link.peers.all().len(),
            if pools.is_empty() { "-".to_string() } else { pools.join(",") },
            self.reported
        )
    }

    async fn work(&mut self) -> Result<Step, WireError> {
        self.link.refresh_peers().await;
        self.link.measure_rtts().await;
        self.reported += self.link.report_locations().await? as u64;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}

/// Bytes `[offset, offset + len)` of a whole chunk, clipped to its end.
fn slice(id: ChunkId, data: Bytes, offset: u64, len: u64) -> Result<Bytes, WireError> {
    let size = data.len() as u64;
    if offset > size {
        return Err(WireError::new(ErrorCode::InvalidArgument, format!("offset {offset} beyond chunk {id}")));
    }
    Ok(data.slice(offset as usize..(offset + len.min(size - offset)) as usize))
}

/// What the rooms' tests share: a site link over a meta that never answers.
#[cfg(test)]
mod testing {
    use super::*;
    use net::RpcClient;

    /// A site link whose cache holds `cache_bytes`, with a meta that is never asked
    /// (a listener that accepts and stays silent), and the node's own store (1 GiB), both
    /// under `dir`.
    pub(super) async fn link(dir: &std::path::Path, cache_bytes: u64) -> (Arc<SiteLink>, Arc<ChunkStore>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rpc = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        let meta = Arc::new(crate::MetaClient { rpc, epoch: Arc::new(crate::cluster::Epoch::none()) });
        let cache = ChunkStore::open_cache(&dir.join("cache"), cache_bytes).unwrap();
        let config = WanConfig { cache_bytes, ..WanConfig::default() };
        let link = SiteLink::open("b0".into(), "b".into(), config, meta, cache).unwrap();
        (Arc::new(link), Arc::new(ChunkStore::open(&dir.join("chunks"), 1 << 30).unwrap()))
    }

    pub(super) fn chunk(seed: u8, len: usize) -> (ChunkId, Bytes) {
        let data = Bytes::from(vec![seed; len]);
        (ChunkId::of(&data), data)
    }

    pub(super) fn node(id: &str, site: &str, addr: &str) -> NodeInfo {
        NodeInfo {
            id: id.into(),
            store_id: String::new(),
            site: site.into(),
            addr: addr.into(),
            capacity_bytes: 0,
            used_bytes: 0,
            chunk_count: 0,
            last_seen_secs: 0,
            site_rtts: Vec::new(),
            cache_bytes: 0,
            drained: false,
        }
    }
}
