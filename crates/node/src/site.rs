//! The site's window on other sites: a chunk a client asks for that this node does
//! not hold is fetched once from the nearest node that has it — over a pool of
//! long-lived connections sized from the measured round trip, whole chunks pipelined
//! on them while a reader's read-ahead keeps several in flight, a lone chunk split into
//! stripes — verified, kept in the site cache (on disk, capped, least recently used out
//! first) and served from there to every client of the site. Concurrent misses of one
//! chunk share one fetch.

use bytes::Bytes;
use chunk::cache::{ChunkCache, LruOrder};
use chunk::{ChunkError, ChunkStore};
use net::{NodeDirectory, RpcClient};
use proto::error::{ErrorCode, WireError};
use proto::meta::{ChunkLocations, ListNodes, StoredChunk, UpdateLocations};
use proto::node::{NodeReply, NodeRequest, NodeResult};
use proto::placement::rendezvous;
use proto::types::{ChunkId, NodeInfo};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use util::single_flight::SingleFlight;
use util::sync::{lock, read, write};
use util::worker::{Step, Worker, every};

/// Bytes of recently fetched chunks kept in memory.
const RECENT_BYTES: usize = 256 << 20;

/// How a node reaches other sites.
#[derive(Debug, Clone)]
pub struct WanConfig {
    /// Bytes of chunks cached for this site (copies of other sites' chunks).
    pub cache_bytes: u64,
    /// TCP connections to each node of another site; `None`: chosen per node from its
    /// measured round trip (`auto_connections`).
    pub connections: Option<usize>,
    /// Overrides of `connections` for particular sites (site, connections).
    pub connections_to: Vec<(String, usize)>,
    /// Bytes per second the path to another site should carry: with the round trip
    /// and the kernel's largest TCP window it sizes the automatic connection count.
    pub path_rate: u64,
    /// Bytes per second one connection's receiving task keeps up with (decryption,
    /// framing; ~40 MB/s measured on the 2-core bench machine under load, see
    /// bench/results/wan-read.md): the automatic count never leaves the path to fewer.
    pub connection_rate: u64,
    /// Most connections the automatic count opens to one node.
    pub max_connections: usize,
    /// Smallest stripe a chunk is cut into for a parallel fetch.
    pub min_stripe: u64,
    /// How long one stripe may take before the copy counts as failed.
    pub timeout: Duration,
}

impl Default for WanConfig {
    fn default() -> Self {
        WanConfig {
            cache_bytes: 16 << 30,
            connections: None,
            connections_to: Vec::new(),
            path_rate: 125_000_000,
            connection_rate: 40_000_000,
            max_connections: 16,
            min_stripe: 512 << 10,
            timeout: Duration::from_secs(30),
        }
    }
}

impl WanConfig {
    /// Connections fixed by the operator towards `site`, if any.
    pub fn connections_for(&self, site: &str) -> Option<usize> {
        self.connections_to.iter().find(|(s, _)| s == site).map(|(_, n)| *n).or(self.connections).map(|n| n.max(1))
    }
}

/// Connections that keep a path of `rate` bytes/s and round trip `rtt` full: enough
/// windows of `window` bytes for the bandwidth-delay product, enough connections of
/// `per_connection` bytes/s each for the rate, at least 2 (one loss does not stall
/// the transfer) and at most `max`. Loss does not enter: the connections run BBR
/// (`--tcp-congestion`), whose rate does not fall with random loss, and more flows than
/// this only deepen the bottleneck's queue (8 at line rate overflow a 1 x BDP queue).
pub fn auto_connections(rtt: Duration, rate: u64, window: u64, per_connection: u64, max: usize) -> usize {
    let bdp = rate as f64 * rtt.as_secs_f64();
    let for_window = (bdp / window.max(1) as f64).ceil() as usize;
    let for_rate = rate.div_ceil(per_connection.max(1)) as usize;
    for_window.max(for_rate).clamp(2, max.max(2))
}

/// Payload one TCP connection can keep in flight here: the smaller of the kernel's
/// largest send and receive buffers (`tcp_wmem`/`tcp_rmem` maxima, autotuning's
/// ceiling), half of which holds payload (the rest is the kernel's per-packet overhead).
fn flow_window() -> u64 {
    let max_of = |path: &str| std::fs::read_to_string(path).ok()?.split_whitespace().nth(2)?.parse::<u64>().ok();
    let wmem = max_of("/proc/sys/net/ipv4/tcp_wmem").unwrap_or(4 << 20);
    let rmem = max_of("/proc/sys/net/ipv4/tcp_rmem").unwrap_or(6 << 20);
    wmem.min(rmem) / 2
}

/// Decrements the count of fetches in flight when a fetch ends, however it ends.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

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

fn wire(e: ChunkError) -> WireError {
    e.into()
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
            recent: ChunkCache::new(RECENT_BYTES),
            lru: Mutex::new(lru),
            keeping: tokio::sync::Mutex::new(()),
            rtts: RwLock::default(),
            site_rtts: Mutex::default(),
            window: flow_window(),
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

    /// A replica of `id` is now in this node's store: its site-cache copy, if any,
    /// goes, so the bytes are not held twice (reads find the replica first). No removal
    /// is reported: the replica's report makes the catalogue's row a replica, and a
    /// cached copy's removal never takes a replica's row.
    pub(crate) async fn uncache(&self, id: ChunkId) {
        if !lock(&self.lru).contains(&id) {
            return;
        }
        lock(&self.lru).remove(&id);
        let cache = self.cache.clone();
        match tokio::task::spawn_blocking(move || cache.delete(&[id], Duration::ZERO)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(chunk = %id, "cannot drop the cached copy of a replica: {e}"),
            Err(e) => tracing::warn!(chunk = %id, "cache task failed: {e}"),
        }
    }

    /// This node's whole site-cache copy of `id`, verified, if it has an intact one
    /// (asking the disk only for a chunk the cache lists).
    pub(crate) async fn cached_copy(&self, id: ChunkId) -> Result<Option<Bytes>, WireError> {
        if self.recent.get(&id).is_none() && !lock(&self.lru).contains(&id) {
            return Ok(None);
        }
        self.cached(id, 0, u64::MAX).await
    }

    /// Bytes held in the site cache.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.stats().used_bytes
    }

    /// Bytes `[offset, offset + len)` of a chunk this node does not store itself.
    pub async fn get(self: &Arc<Self>, id: ChunkId, offset: u64, len: u64) -> Result<Bytes, WireError> {
        if let Some(data) = self.cached(id, offset, len).await? {
            return Ok(data);
        }
        let fetched = self.fetches.run(id, || self.fetch_unless_recent(id)).await?;
        slice(id, fetched, offset, len)
    }

    /// Bytes `[offset, offset + len)` of a chunk from this node's site cache alone
    /// (memory, then disk), never fetched: `None` without an intact copy (a corrupt
    /// one is dropped and its removal reported, never served).
    pub async fn cached(&self, id: ChunkId, offset: u64, len: u64) -> Result<Option<Bytes>, WireError> {
        if let Some(data) = self.recent.get(&id) {
            self.stats.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return slice(id, data, offset, len).map(Some);
        }
        let cache = self.cache.clone();
        let cached = tokio::task::spawn_blocking(move || cache.get(&id, offset, len))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("cache task failed: {e}")))?;
        match cached {
            Ok(data) => {
                self.stats.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lock(&self.lru).touch(id);
                Ok(Some(data))
            }
            Err(ChunkError::NotFound { .. }) => Ok(None),
            Err(ChunkError::Corrupt { .. }) => {
                let _ = self.cache.delete(&[id], Duration::ZERO);
                lock(&self.lru).remove(&id);
                lock(&self.pending).1.push(id);
                Ok(None)
            }
            Err(e) => Err(wire(e)),
        }
    }

    /// A miss's single flight: a fetch of `id` that ended while this reader looked in
    /// the cache left it in memory (so many readers at one site cross the WAN once per
    /// chunk); otherwise it is fetched.
    async fn fetch_unless_recent(self: &Arc<Self>, id: ChunkId) -> Result<Bytes, WireError> {
        match self.recent.get(&id) {
            Some(data) => Ok(data),
            None => self.fetch_and_cache(id).await,
        }
    }

    async fn fetch_and_cache(self: &Arc<Self>, id: ChunkId) -> Result<Bytes, WireError> {
        let data = self.fetch_copy(id).await?;
        // Serve at once; the copy lands on disk behind the reader (and is in memory
        // meanwhile, so nobody fetches it twice).
        self.recent.insert(id, data.clone());
        let (me, kept) = (self.clone(), data.clone());
        tokio::spawn(async move { me.keep(id, kept).await });
        Ok(data)
    }

    /// A verified copy of a chunk from the nearest other node that holds one (each
    /// copy tried twice: a corrupt transfer is fetched again, never returned).
    ///
    /// The catalogue is asked at once, but the nodes placement names are asked first,
    /// without waiting for it: a chunk is where its writer's site placed it
    /// (`likely_holders`), so a miss costs one round trip to the holder rather than one
    /// to meta and then one to the holder. Such a guess fetches the chunk whole (its
    /// size is the catalogue's to tell).
    pub(crate) async fn fetch_copy(&self, id: ChunkId) -> Result<Bytes, WireError> {
        let meta = self.meta.clone();
        let catalogue =
            tokio::spawn(
                async move { crate::ask_meta(&meta, ChunkLocations { ids: vec![id], caps: Vec::new() }).await },
            );
        let mut last = WireError::new(ErrorCode::Io, format!("chunk {id}: no copy could be fetched"));
        let mut lacking = Vec::new();
        for (node, client) in self.likely_holders(&id).await {
            match self.fetch_verified(&node, &client, id, None).await {
                Ok(data) => {
                    catalogue.abort();
                    return Ok(data);
                }
                Err(e) if e.code == ErrorCode::NotFound => lacking.push(node),
                Err(e) => last = e,
            }
        }
        let mut records = catalogue
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("catalogue task failed: {e}")))??;
        let Some(record) = records.pop() else {
            return Err(WireError::new(ErrorCode::NotFound, format!("chunk {id} is in no catalogue")));
        };
        let holders: Vec<String> = record.nodes.into_iter().filter(|n| !lacking.contains(n)).collect();
        let candidates = self.nearest(&holders).await;
        if candidates.is_empty() {
            return Err(WireError::new(ErrorCode::NotFound, format!("no other node holds chunk {id}")));
        }
        // Each copy gets two tries: one corrupt transfer is refetched, never served.
        for (node, client) in candidates.into_iter().flat_map(|c| [c.clone(), c]) {
            match self.fetch_verified(&node, &client, id, Some(record.size)).await {
                Ok(data) => return Ok(data),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// One fetch of `id` from `node`, hashed: `size` known stripes a lone fetch.
    async fn fetch_verified(
        &self,
        node: &str,
        client: &Arc<RpcClient>,
        id: ChunkId,
        size: Option<u64>,
    ) -> Result<Bytes, WireError> {
        // The hash runs off the runtime's threads: the connections' reading tasks keep
        // draining their sockets meanwhile (a 2-core node is otherwise late to read and
        // the sender becomes receive-window limited).
        let fetched = match self.fetch_striped(client, id, size).await {
            Ok(data) => tokio::task::spawn_blocking(move || (ChunkId::of(&data) == id, data))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("hash task failed: {e}"))),
            Err(e) => Err(e),
        };
        match fetched {
            Ok((true, data)) => {
                self.stats.fetched_chunks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.stats.fetched_bytes.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Ok(data)
            }
            Ok((false, _)) => {
                self.stats.corrupt_in_transit.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(chunk = %id, %node, "chunk arrived corrupted; fetching it again");
                Err(WireError::new(ErrorCode::Corrupt, format!("chunk {id} from {node} arrived corrupted")))
            }
            Err(e) => {
                if e.code != ErrorCode::NotFound {
                    tracing::warn!(chunk = %id, %node, "fetch failed, trying another copy: {e}");
                }
                Err(e)
            }
        }
    }

    /// Fetches a chunk on the peer's connections: whole when its size is unknown or
    /// the other fetches in flight already give every connection a chunk (a sequential
    /// reader's read-ahead: each connection stays backlogged with whole chunks, one
    /// request each), else cut into as many stripes as there are connections per
    /// fetch in flight.
    async fn fetch_striped(&self, client: &Arc<RpcClient>, id: ChunkId, size: Option<u64>) -> Result<Bytes, WireError> {
        let fetching = self.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let _counted = InFlight(&self.in_flight);
        let started = Instant::now();
        let offsets: Vec<(u64, u64)> = match size {
            Some(size) if size > 0 => {
                let stripes = (client.connections() / fetching).max(1) as u64;
                let stripe = size.div_ceil(stripes).max(self.config.min_stripe).max(1);
                (0..size).step_by(stripe as usize).map(|offset| (offset, stripe)).collect()
            }
            _ => vec![(0, u64::MAX)],
        };
        let parts: Vec<_> = offsets
            .into_iter()
            .map(|(offset, len)| {
                let client = client.clone();
                let req = NodeRequest::Get { id, offset, len, local_only: true, cap: None };
                tokio::spawn(async move { client.call_bulk::<_, NodeResult>(&req, Bytes::new()).await })
            })
            .collect();
        let mut received = Vec::with_capacity(parts.len());
        for part in parts {
            let (reply, bytes) = part
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("fetch task failed: {e}")))?
                .map_err(|e| WireError::new(ErrorCode::Io, e.to_string()))?;
            match reply? {
                NodeReply::Data => received.push(bytes),
                other => return Err(WireError::new(ErrorCode::Internal, format!("Get answered {other:?}"))),
            }
        }
        // When each fetch of a read's start ended (`LOCUS_LOG=node::site=trace`).
        tracing::trace!(chunk = %id, fetching, stripes = received.len(), ms = started.elapsed().as_millis() as u64, "fetched");
        // A chunk that came whole is handed on as received, without a copy.
        if let [whole] = &received[..] {
            return Ok(whole.clone());
        }
        Ok(Bytes::from(received.concat()))
    }

    /// The nodes `placement_guesses` names for `id`, each with a client.
    async fn likely_holders(&self, id: &ChunkId) -> Vec<(String, Arc<RpcClient>)> {
        let guesses = placement_guesses(id, &self.me, &self.site, &self.peers.all(), &read(&self.rtts));
        let mut out = Vec::new();
        for node in guesses {
            if let Ok(client) = self.peers.client(&node).await {
                out.push((node, client));
            }
        }
        out
    }

    /// Stores a fetched chunk in the site cache, evicting the least recently used
    /// copies to stay under the cap.
    async fn keep(&self, id: ChunkId, data: Bytes) {
        let size = data.len() as u64;
        if size > self.config.cache_bytes {
            return;
        }
        let _room = self.keeping.lock().await;
        self.evict_down_to(self.config.cache_bytes - size);
        let cache = self.cache.clone();
        let stored = tokio::task::spawn_blocking(move || cache.put(&id, &data)).await;
        let mut pending = lock(&self.pending);
        match stored {
            Ok(Ok(())) => {
                lock(&self.lru).touch(id);
                pending.0.push(StoredChunk { id, size, nodes: Vec::new(), receipt: None });
            }
            Ok(Err(e)) => tracing::warn!(chunk = %id, "cannot cache a fetched chunk: {e}"),
            Err(e) => tracing::warn!(chunk = %id, "cache task failed: {e}"),
        }
    }

    /// Evicts cached copies, least recently used first, until the cache holds at most
    /// `bytes` (or nothing is left to evict); the evictions are reported to meta.
    fn evict_down_to(&self, bytes: u64) {
        let mut evicted = Vec::new();
        while self.cache.stats().used_bytes > bytes {
            let Some(victim) = lock(&self.lru).pop_oldest() else { break };
            if let Err(e) = self.cache.delete(&[victim], Duration::ZERO) {
                tracing::warn!(chunk = %victim, "cannot evict from the site cache: {e}");
                break;
            }
            evicted.push(victim);
        }
        lock(&self.pending).1.extend(evicted);
    }

    /// The disk this node's store shares with its site cache is full: cached copies
    /// (never replicas) are evicted until `bytes` are freed, if the cache holds that
    /// many; answers whether it did.
    pub(crate) async fn make_room(&self, bytes: u64) -> bool {
        let _room = self.keeping.lock().await;
        let used = self.cache.stats().used_bytes;
        if used < bytes {
            return false;
        }
        self.evict_down_to(used - bytes);
        tracing::warn!(bytes, "the disk is full: evicted cached copies to store a replica");
        true
    }

    /// Nodes other than this one among `holders`, nearest first, with a client each.
    async fn nearest(&self, holders: &[String]) -> Vec<(String, Arc<RpcClient>)> {
        if holders.iter().any(|h| h != &self.me && self.peers.get(h).is_none()) {
            self.refresh_peers().await;
        }
        let mut ranked: Vec<(bool, Duration, String)> = {
            let rtts = read(&self.rtts);
            holders
                .iter()
                .filter(|h| *h != &self.me)
                .filter_map(|h| {
                    let info = self.peers.get(h)?;
                    Some((info.site != self.site, rtts.get(h).copied().unwrap_or(Duration::MAX), h.clone()))
                })
                .collect()
        };
        ranked.sort();
        let mut out = Vec::new();
        for (_, _, node) in ranked {
            match self.peers.client(&node).await {
                Ok(client) => out.push((node, client)),
                Err(e) => tracing::warn!(%node, "cannot reach node: {e}"),
            }
        }
        out
    }

    /// Learns the cluster's nodes from meta (and whether this one is being drained).
    pub async fn refresh_peers(&self) {
        let Ok(Ok(list)) = self.meta.ask(ListNodes {}).await else { return };
        let me = list.iter().find(|n| n.id == self.me).is_some_and(|n| n.drained);
        self.drained.store(me, std::sync::atomic::Ordering::Relaxed);
        self.peers.update(list.into_iter().filter(|n| n.id != self.me));
    }

    /// This node is being drained: its own copies do not count.
    pub(crate) fn drained(&self) -> bool {
        self.drained.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Times a ping to every node of another site and keeps the best round trip per
    /// site for the heartbeat.
    async fn measure_rtts(&self) {
        let others: Vec<NodeInfo> =
            self.peers.all().into_iter().filter(|n| n.site != self.site && n.last_seen_secs < 30).collect();
        let mut best: HashMap<String, u64> = HashMap::new();
        for node in others {
            let Ok(client) = self.peers.client(&node.id).await else { continue };
            let started = Instant::now();
            let answered =
                tokio::time::timeout(Duration::from_secs(5), client.call::<_, NodeResult>(&NodeRequest::Ping)).await;
            if !matches!(answered, Ok(Ok(Ok(_)))) {
                continue;
            }
            let rtt = started.elapsed();
            // Smoothed like TCP's SRTT (7/8 old, 1/8 new).
            let smoothed =
                *write(&self.rtts).entry(node.id.clone()).and_modify(|old| *old = (*old * 7 + rtt) / 8).or_insert(rtt);
            if self.config.connections_for(&node.site).is_none() {
                let c = &self.config;
                let n = auto_connections(smoothed, c.path_rate, self.window, c.connection_rate, c.max_connections);
                client.use_connections(n);
            }
            lock(&self.pools).insert(node.id.clone(), client.connections());
            // Opened now, not by the first read that needs them.
            let (pool, id) = (client.clone(), node.id.clone());
            tokio::spawn(async move {
                if let Err(e) = pool.warm().await {
                    tracing::debug!(node = %id, "cannot open every connection to the node: {e}");
                }
            });
            let micros = rtt.as_micros() as u64;
            best.entry(node.site).and_modify(|b| *b = (*b).min(micros)).or_insert(micros);
        }
        let mut out: Vec<(String, u64)> = best.into_iter().collect();
        out.sort();
        *lock(&self.site_rtts) = out;
    }

    /// The best round trip to each other site, as last measured.
    pub fn site_rtts(&self) -> Vec<(String, u64)> {
        lock(&self.site_rtts).clone()
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

/// Where writers would have put chunk `id`, for a node `me` at `site` that lacks it:
/// at its own site the node after it in placement order (which takes a chunk `me`
/// refused), then at the nearest other site (by the round trips in `rtts`) the
/// first-ranked node, as a writer there places chunks (rendezvous over the site's
/// undrained live nodes).
fn placement_guesses(
    id: &ChunkId,
    me: &str,
    site: &str,
    peers: &[NodeInfo],
    rtts: &HashMap<String, Duration>,
) -> Vec<String> {
    let mut sites: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    sites.entry(site).or_default().push(me.to_string());
    for n in peers.iter().filter(|n| !n.drained && n.last_seen_secs <= proto::policy::NODE_GONE_SECS) {
        sites.entry(&n.site).or_default().push(n.id.clone());
    }
    let here = sites.remove(site).unwrap_or_default();
    let mut guesses: Vec<String> =
        rendezvous(id, &here, 2).into_iter().filter(|n| *n != me).map(String::from).take(1).collect();
    let nearest = sites
        .values()
        .filter_map(|nodes| {
            let first = rendezvous(id, nodes, 1).first()?.to_string();
            Some((nodes.iter().filter_map(|n| rtts.get(n)).min().copied().unwrap_or(Duration::MAX), first))
        })
        .min();
    guesses.extend(nearest.map(|(_, first)| first));
    guesses
}

/// Bytes `[offset, offset + len)` of a whole chunk, clipped to its end.
fn slice(id: ChunkId, data: Bytes, offset: u64, len: u64) -> Result<Bytes, WireError> {
    let size = data.len() as u64;
    if offset > size {
        return Err(WireError::new(ErrorCode::InvalidArgument, format!("offset {offset} beyond chunk {id}")));
    }
    Ok(data.slice(offset as usize..(offset + len.min(size - offset)) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicate::Replicator;

    /// A site link whose cache holds `cache_bytes`, with a meta that is never asked
    /// (a listener that accepts and stays silent), and the node's own store (1 GiB), both
    /// under `dir`.
    async fn link(dir: &std::path::Path, cache_bytes: u64) -> (Arc<SiteLink>, Arc<ChunkStore>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let rpc = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        let meta = Arc::new(crate::MetaClient { rpc, epoch: Arc::new(crate::cluster::Epoch::none()) });
        let cache = ChunkStore::open_cache(&dir.join("cache"), cache_bytes).unwrap();
        let config = WanConfig { cache_bytes, ..WanConfig::default() };
        let link = SiteLink::open("b0".into(), "b".into(), config, meta, cache).unwrap();
        (Arc::new(link), Arc::new(ChunkStore::open(&dir.join("chunks"), 1 << 30).unwrap()))
    }

    fn chunk(seed: u8, len: usize) -> (ChunkId, Bytes) {
        let data = Bytes::from(vec![seed; len]);
        (ChunkId::of(&data), data)
    }

    /// A miss whose flight starts after another reader's fetch of the chunk ended (the
    /// chunk is in memory, not yet on disk) takes that copy and asks nobody: meta here
    /// never answers, so a second fetch would hang past the timeout.
    #[tokio::test]
    async fn a_miss_after_a_finished_fetch_takes_the_copy_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 1 << 20).await;
        let (id, data) = chunk(7, 1000);
        link.recent.insert(id, data.clone());
        let got = tokio::time::timeout(Duration::from_secs(5), link.fetch_unless_recent(id)).await;
        assert_eq!(got.expect("the miss fetched the chunk again").unwrap(), data);
        assert_eq!(link.stats.fetched_chunks.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    fn node(id: &str, site: &str, addr: &str) -> NodeInfo {
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

    /// A chunk that misses here is fetched from where placement puts it at the other
    /// site, without waiting for the catalogue: meta here never answers.
    #[tokio::test]
    async fn a_miss_is_fetched_from_where_placement_puts_it_without_asking_meta() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 1 << 20).await;
        let holder = Arc::new(ChunkStore::open(&dir.path().join("a0"), 1 << 30).unwrap());
        let (id, data) = chunk(9, 300_000);
        holder.put(&id, &data).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(net::serve(listener, Arc::new(crate::NodeService::new(holder))));
        link.peers.update([node("a0", "a", &addr)]);
        let got = tokio::time::timeout(Duration::from_secs(3), link.fetch_copy(id)).await;
        assert_eq!(got.expect("the fetch waited for meta").unwrap(), data);
        assert_eq!(link.stats.fetched_chunks.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn placement_guesses_the_next_node_here_and_the_first_at_the_nearest_site() {
        let id = ChunkId([3; 32]);
        let ms = Duration::from_millis;
        let mut peers = vec![node("a0", "a", ""), node("a1", "a", ""), node("c0", "c", ""), node("b1", "b", "")];
        let rtts: HashMap<String, Duration> =
            [("a0".into(), ms(100)), ("a1".into(), ms(90)), ("c0".into(), ms(20))].into();
        let here: Vec<String> = vec!["b0".into(), "b1".into()];
        let next_here = rendezvous(&id, &here, 2).into_iter().find(|n| *n != "b0").unwrap().to_string();
        let guesses = placement_guesses(&id, "b0", "b", &peers, &rtts);
        assert_eq!(guesses, vec![next_here, "c0".to_string()], "site c is nearer than a");
        // Without c, site a's first-ranked node (over its live, undrained nodes).
        peers.retain(|n| n.id != "c0");
        let a: Vec<String> = vec!["a0".into(), "a1".into()];
        let first_a = rendezvous(&id, &a, 1)[0].to_string();
        assert_eq!(placement_guesses(&id, "b0", "b", &peers, &rtts)[1], first_a);
        for n in peers.iter_mut().filter(|n| n.id == first_a) {
            n.drained = true;
        }
        let other_a = if first_a == "a0" { "a1" } else { "a0" };
        assert_eq!(placement_guesses(&id, "b0", "b", &peers, &rtts)[1], other_a, "a drained node takes no chunks");
        // Alone at its site, with no other site: nothing to guess.
        assert!(placement_guesses(&id, "b0", "b", &[], &rtts).is_empty());
    }

    #[test]
    fn connection_count_covers_the_bandwidth_delay_product_within_bounds() {
        let ms = Duration::from_millis;
        // 1 Gbit/s, 2 MiB of payload per connection, connections as fast as the path.
        let (rate, window, fast) = (125_000_000, 2 << 20, 1 << 40);
        assert_eq!(auto_connections(ms(100), rate, window, fast, 16), 6, "12.5 MB in flight / 2 MiB each");
        assert_eq!(auto_connections(ms(200), rate, window, fast, 16), 12);
        assert_eq!(auto_connections(ms(10), rate, window, fast, 16), 2, "never fewer than 2");
        assert_eq!(auto_connections(Duration::ZERO, rate, window, fast, 16), 2);
        assert_eq!(auto_connections(ms(1000), rate, window, fast, 16), 16, "capped");
        assert_eq!(auto_connections(ms(100), rate, 0, fast, 16), 16, "no window known: the cap");
        // Larger windows need fewer connections, but never fewer than the rate needs.
        assert_eq!(auto_connections(ms(100), rate, 32 << 20, fast, 16), 2);
        assert_eq!(auto_connections(ms(100), rate, 32 << 20, 40_000_000, 16), 4, "125 / 40 MB/s");
        assert_eq!(auto_connections(ms(200), rate, window, 40_000_000, 16), 12, "the window still rules");
        assert_eq!(auto_connections(ms(10), rate, window, 0, 16), 16, "no rate known: the cap");
    }

    #[test]
    fn operator_counts_override_the_automatic_one() {
        let auto = WanConfig::default();
        assert_eq!(auto.connections_for("a"), None);
        let fixed = WanConfig { connections: Some(8), connections_to: vec![("c".into(), 3)], ..WanConfig::default() };
        assert_eq!(fixed.connections_for("a"), Some(8));
        assert_eq!(fixed.connections_for("c"), Some(3));
        let only_c = WanConfig { connections_to: vec![("c".into(), 0)], ..WanConfig::default() };
        assert_eq!(only_c.connections_for("c"), Some(1), "at least one");
        assert_eq!(only_c.connections_for("a"), None);
    }

    #[test]
    fn the_flow_window_comes_from_the_kernel_limits() {
        let w = flow_window();
        assert!((2048..=1 << 31).contains(&w), "{w}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn copies_kept_at_once_evict_to_stay_under_the_cap_and_report_it() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 3 << 20).await;
        let chunks: Vec<(ChunkId, Bytes)> = (0..6).map(|i| chunk(i, 1 << 20)).collect();
        let keeps = chunks.iter().map(|(id, data)| {
            let link = link.clone();
            let (id, data) = (*id, data.clone());
            tokio::spawn(async move { link.keep(id, data).await })
        });
        for k in keeps.collect::<Vec<_>>() {
            k.await.unwrap();
        }
        assert_eq!(link.cache_bytes(), 3 << 20, "full, not over the cap, and no copy refused");
        let (added, removed) = std::mem::take(&mut *lock(&link.pending));
        assert_eq!(added.len(), 6, "every copy was cached once: {added:?}");
        assert!(added.iter().all(|c| c.nodes.is_empty()), "cached copies name no nodes (not replicas)");
        assert_eq!(removed.len(), 3, "three were evicted and reported: {removed:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_stored_here_replaces_the_cached_copy_without_reporting_a_removal() {
        let dir = tempfile::tempdir().unwrap();
        let (link, store) = link(dir.path(), 8 << 20).await;
        let (id, data) = chunk(7, 1 << 20);
        link.keep(id, data.clone()).await;
        assert_eq!(link.cached_copy(id).await.unwrap(), Some(data.clone()));
        lock(&link.pending).0.clear();

        let replicator = Replicator::new("b0".into(), "b".into(), link.clone(), store.clone(), Duration::from_secs(1));
        replicator.store_here(id, data.clone()).await.unwrap();
        assert!(store.has(&[id]).unwrap()[0], "stored as a replica");
        assert_eq!(link.cached_copy(id).await.unwrap(), None, "the cached copy is gone");
        assert_eq!(link.cache_bytes(), 0);
        assert!(lock(&link.pending).1.is_empty(), "no removal reported: the node still holds the chunk");
        // Eviction pressure later never touches the replica.
        for i in 0..10 {
            let (other, bytes) = chunk(100 + i, 1 << 20);
            link.keep(other, bytes).await;
        }
        assert_eq!(store.get(&id, 0, u64::MAX).unwrap(), data.to_vec());
        assert!(!lock(&link.pending).1.contains(&id), "the replica was never evicted");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_evicts_cached_copies_for_a_replica_and_never_replicas() {
        let disk = tempfile::tempdir().unwrap();
        let Some(_mounted) = testkit::scratch::Mount::new(disk.path(), "tmpfs", Some("size=8m")) else {
            eprintln!("SKIPPED: needs root to mount a small tmpfs");
            return;
        };
        // The cache's cap and the store's capacity both exceed the disk.
        let (link, store) = link(disk.path(), 64 << 20).await;
        let cached: Vec<ChunkId> = (0..5)
            .map(|i| chunk(i, 1 << 20))
            .map(|(id, data)| {
                let link = link.clone();
                async move {
                    link.keep(id, data).await;
                    id
                }
            })
            .collect::<futures_util::future::JoinAll<_>>()
            .await;
        assert_eq!(link.cache_bytes(), 5 << 20);
        lock(&link.pending).1.clear();
        let replicator = Replicator::new("b0".into(), "b".into(), link.clone(), store.clone(), Duration::from_secs(1));

        // 4 MiB do not fit beside the 5 MiB cached: cached copies make room.
        let (first, data) = chunk(50, 4 << 20);
        replicator.store_here(first, data).await.unwrap();
        assert!(store.has(&[first]).unwrap()[0]);
        let evicted = lock(&link.pending).1.clone();
        assert!(evicted.len() >= 4 && evicted.iter().all(|id| cached.contains(id)), "{evicted:?}");

        // Then the disk is full of replicas: the next one fails and nothing is evicted.
        let (second, data) = chunk(51, 4 << 20);
        let e = replicator.store_here(second, data).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
        assert!(store.has(&[first]).unwrap()[0], "a replica is never evicted");
    }
}
