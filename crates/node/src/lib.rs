//! The site storage daemon: serves chunks from a local `chunk::ChunkStore` over the
//! data-path protocol (`proto::node`), fetches chunks its site lacks from other sites
//! into a site cache (`site`), and announces itself to meta with a periodic
//! `RegisterNode` heartbeat that also carries its measured round trips to other sites.
//! Every call to meta carries the highest epoch of the primary role the node has seen
//! (`cluster::Epoch`), and the node follows no meta, and honours no capability, of an
//! older one (failover fencing).

mod authz;
mod cluster;
mod metrics;
mod reclaim;
mod repair;
mod replicate;
mod site;

use authz::CapKeyCell;
use cluster::{Epoch, Membership};
use reclaim::Reclaim;
pub use reclaim::ReclaimConfig;
use repair::{RepairWorker, ScrubWorker};
use replicate::{ReplicationWorker, Replicator};
pub use site::WanConfig;
use site::{SiteLink, SiteLinkWorker};

use bytes::Bytes;
use chunk::cache::ChunkCache;
use chunk::{ChunkError, ChunkStore};
use net::{NetError, RpcClient, Service};
use proto::error::{ErrorCode, WireError};
use proto::meta::{Envelope, JoinNode, MetaMessage, RegisterNode, Registered, ReportLag, ReportWorkers, Revocations};
use proto::node::{
    Delete, Get, Has, List, NodeRequest, NodeResult, NodeServer, NodeStats, Ping, Put, ServeNode, Stats, Stored, Verify,
};
use proto::types::{ChunkId, NodeInfo};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use util::single_flight::SingleFlight;
use util::worker::{Step, Worker, Workers, every};

/// Most ids one `List` answers, so a reply stays far below the frame size limit.
pub const MAX_LIST: u32 = 65_536;

/// Bytes of recently read chunks a node keeps in memory (see `NodeService::hot`).
const HOT_BYTES: usize = 128 << 20;

/// How long a call to meta may take before the node gives up on it.
const META_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a node needs to start; built by the binary from its config.
#[derive(Debug)]
pub struct NodeConfig {
    /// Identity, unique within the cluster.
    pub id: String,
    pub site: String,
    pub data_dir: PathBuf,
    pub capacity_bytes: u64,
    /// `host:port` of `locus meta`.
    pub meta_addr: String,
    /// `host:port` clients use to reach this node (may differ from the bind address).
    pub advertise_addr: String,
    /// Interval of the `RegisterNode` heartbeat.
    pub heartbeat: Duration,
    /// Site cache and transfers from other sites.
    pub wan: WanConfig,
    /// When unreferenced chunks are deleted without an operator.
    pub reclaim: ReclaimConfig,
    /// Copies across nodes and sites: timeouts and the repair and scrub rates.
    pub replication: ReplicationConfig,
    /// Where to serve Prometheus metrics (`GET /metrics`), if anywhere.
    pub metrics: Option<TcpListener>,
    /// A join token (`locus node token`) spent to admit this node if meta has not.
    pub join_token: Option<String>,
    /// A key file: chunks (stored and cached) are encrypted at rest with it.
    pub encrypt_key: Option<PathBuf>,
}

/// How a node keeps the copies policies ask for.
#[derive(Debug, Clone)]
pub struct ReplicationConfig {
    /// How long a `sync` or `semi-sync` put waits for its copies at other nodes and
    /// sites before the write fails.
    pub sync_timeout: Duration,
    /// Bytes per second the repair worker may send.
    pub repair_rate: u64,
    /// Pause between the repair worker's scans of the catalogue.
    pub repair_every: Duration,
    /// Bytes per second the scrub worker may re-hash.
    pub scrub_rate: u64,
    /// Pause between complete scrub passes over the store.
    pub scrub_every: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            sync_timeout: Duration::from_secs(10),
            repair_rate: 64 << 20,
            repair_every: Duration::from_secs(10),
            scrub_rate: 16 << 20,
            scrub_every: Duration::from_secs(24 * 3600),
        }
    }
}

/// Why a node could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot open the chunk store: {0}")]
    Store(#[from] ChunkError),
    #[error("meta at {addr} unreachable: {source}")]
    MetaUnreachable { addr: String, source: NetError },
    #[error(
        "meta at {addr} refused node id {id:?}: another node is already registered under that id; give this node a unique id"
    )]
    DuplicateId { addr: String, id: String },
    #[error(
        "meta at {addr} serves cluster {theirs}, but this node belongs to cluster {ours} (recorded in {file}); \
         point the node at its own cluster's meta, or give it a fresh data directory to join this one"
    )]
    WrongCluster { addr: String, ours: String, theirs: String, file: String },
    #[error("meta at {addr} refused to register node {id:?}: {source}")]
    Refused { addr: String, id: String, source: WireError },
    #[error(
        "meta at {addr} serves epoch {theirs} of the primary role, but this node has seen epoch {ours}: that meta \
         lost the primary role (failover); the node does not follow it (point it at a meta of the new primary)"
    )]
    StaleMeta { addr: String, theirs: u64, ours: u64 },
    #[error("internal error: {0}")]
    Internal(String),
}

/// Answers `NodeRequest`s from a chunk store; disk work runs on the blocking pool so
/// slow disks never stall the network tasks.
pub struct NodeService {
    store: Arc<ChunkStore>,
    /// Recently verified whole chunks: the stripes of one chunk that another site
    /// fetches in parallel cost one disk read and one hash, not one each.
    hot: ChunkCache,
    /// Disk reads under way, shared by concurrent requests for the same chunk.
    loading: SingleFlight<ChunkId, Bytes>,
    /// Where chunks this node lacks come from; `None` serves only local chunks.
    site: Option<Arc<SiteLink>>,
    /// The key clients' capabilities are checked with (from meta's registration).
    cap_key: Arc<CapKeyCell>,
    /// The highest epoch of the primary role seen: older capabilities are refused.
    epoch: Arc<Epoch>,
    /// Makes the copies a put's policy asks for; `None` stores only here.
    replicator: Option<Arc<Replicator>>,
}

impl NodeService {
    /// A node that serves only the chunks it stores.
    pub fn new(store: Arc<ChunkStore>) -> Self {
        NodeService::with_site(store, None, None, Arc::default(), Arc::new(Epoch::none()))
    }

    fn with_site(
        store: Arc<ChunkStore>,
        site: Option<Arc<SiteLink>>,
        replicator: Option<Arc<Replicator>>,
        cap_key: Arc<CapKeyCell>,
        epoch: Arc<Epoch>,
    ) -> Self {
        let (hot, loading) = (ChunkCache::new(HOT_BYTES), Default::default());
        NodeService { store, hot, loading, site, replicator, cap_key, epoch }
    }

    /// The receipt a putter shows meta to bind the chunk to a file (`cap::Receipt`),
    /// signed for the certificate name that put it; none without TLS or before meta
    /// handed this node its key.
    fn receipt(
        &self,
        putter: Option<&net::PeerIdentity>,
        id: &ChunkId,
        size: u64,
        nodes: &[String],
        now_ms: i64,
    ) -> Option<proto::cap::Receipt> {
        let (putter, key) = (putter?, self.cap_key.get()?);
        let expires = now_ms + proto::cap::CAP_LIFETIME_MS;
        Some(proto::cap::sign_receipt(&key, &putter.name, id, size, nodes, expires))
    }

    /// A whole stored chunk, verified, read once however many ask at the same time.
    async fn verified(&self, id: ChunkId) -> Result<Bytes, WireError> {
        if let Some(data) = self.hot.get(&id) {
            return Ok(data);
        }
        let data = self.loading.run(id, || async { self.blocking(move |s| s.get(&id, 0, u64::MAX)).await }).await?;
        self.hot.insert(id, data.clone());
        Ok(data)
    }

    /// Bytes `[offset, offset + len)` of a stored chunk (clipped to its end): a slice of
    /// the whole chunk if it is hot, else a part the store reads and checks alone (a
    /// block device's reader wants 4 KiB of a 4 MiB chunk).
    async fn stored_range(&self, id: ChunkId, offset: u64, len: u64) -> Result<Bytes, WireError> {
        let data = match self.hot.get(&id) {
            Some(data) => data,
            None if len <= chunk::PART_MAX => return self.blocking(move |s| s.get(&id, offset, len)).await,
            None => self.verified(id).await?,
        };
        let size = data.len() as u64;
        if offset > size {
            return Err(ChunkError::Range { id, offset, size }.into());
        }
        Ok(data.slice(offset as usize..(offset + len.min(size - offset)) as usize))
    }

    /// Which of `ids` this node holds as replicas. One it holds only in its site cache
    /// is made a replica first: the asker (a node replicating the chunk) wants a copy
    /// here that counts, and the bytes need not travel again.
    async fn has(&self, ids: Vec<ChunkId>) -> Result<Vec<bool>, WireError> {
        let asked = ids.clone();
        let mut held = self.blocking(move |s| s.has(&asked)).await?;
        if let Some(r) = &self.replicator {
            for (id, flag) in ids.into_iter().zip(held.iter_mut()).filter(|(_, held)| !**held) {
                if let Some(data) = r.link.cached_copy(id).await? {
                    r.store_here(id, data).await?;
                    tracing::debug!(chunk = %id, "a cached copy became a replica");
                    *flag = true;
                }
            }
        }
        Ok(held)
    }

    async fn blocking<T, F>(&self, work: F) -> Result<T, WireError>
    where
        T: Send + 'static,
        F: FnOnce(&ChunkStore) -> Result<T, ChunkError> + Send + 'static,
    {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || work(&store)).await {
            Ok(result) => result.map_err(WireError::from),
            Err(e) => {
                tracing::error!(error = %e, "chunk store task failed");
                Err(WireError::new(ErrorCode::Internal, format!("chunk store task failed: {e}")))
            }
        }
    }
}

/// The node's connection to meta: every request carries the highest epoch of the
/// primary role the node has seen, so a meta of an older one learns it lost the role
/// (and refuses, rather than instructing the node).
pub(crate) struct MetaClient {
    rpc: RpcClient,
    epoch: Arc<Epoch>,
}

impl MetaClient {
    /// Asks meta, with the node's epoch.
    pub(crate) async fn ask<M: MetaMessage>(&self, request: M) -> Result<Result<M::Response, WireError>, NetError> {
        self.rpc.ask(Envelope::at_epoch(self.epoch.get(), request)).await
    }
}

/// Asks meta on the node's behalf; a transport failure answers like meta's own refusals
/// (`Io`, "meta unreachable"), so callers handle one error type.
pub(crate) async fn ask_meta<M: MetaMessage>(meta: &MetaClient, msg: M) -> Result<M::Response, WireError> {
    meta.ask(msg).await.map_err(|e| WireError::new(ErrorCode::Io, format!("meta unreachable: {e}")))?
}

/// Test builds only: the `node-corrupt-send` fail point flips a byte of a chunk sent to
/// another node, as a faulty network would (`FAILPOINTS="node-corrupt-send=2*return"`).
fn corrupted_in_transit(data: Bytes) -> Bytes {
    util::failpoint::fail::fail_point!("node-corrupt-send", |_| {
        let mut bad = data.to_vec();
        bad[0] ^= 0x01;
        Bytes::from(bad)
    });
    data
}

impl Service for NodeService {
    type Request = NodeRequest;
    type Reply = NodeResult;

    /// Every request is first authorized on the peer's certificate (`authz`), then
    /// answered by the handler of its type.
    async fn handle(self: Arc<Self>, peer: net::Peer, req: NodeRequest, bulk: Bytes) -> (NodeResult, Bytes) {
        let now_ms = proto::types::Timestamp::now().millis();
        if let Err(e) = authz::authorize(peer.identity(), &req, &self.cap_key, now_ms, self.epoch.get()) {
            tracing::warn!(peer = %peer.addr(), "refused: {e}");
            return (Err(e), Bytes::new());
        }
        // An authorized put or delete of a newer epoch (a capability meta signed, or a
        // peer node that heard of it first) teaches it, so nodes pass a failover's
        // epoch on to each other before their own heartbeats tell them.
        if let Some(theirs) = req.epoch().filter(|&e| e > self.epoch.get())
            && let Err(e) = self.epoch.observe(&format!("a request from {}", peer.addr()), theirs)
        {
            tracing::warn!("cannot keep the newer epoch {theirs} of the primary role: {e}");
        }
        req.dispatch(&*self, &Asked { peer, now_ms }, bulk).await
    }
}

/// What a request's handler knows beside it: who asked, and when.
pub struct Asked {
    peer: net::Peer,
    now_ms: i64,
}

impl NodeServer for NodeService {
    type Context = Asked;
}

impl ServeNode<Put> for NodeService {
    async fn serve(&self, asked: &Asked, req: Put, bulk: Bytes) -> Result<Stored, WireError> {
        let Put { id, replicate, .. } = req;
        match &self.replicator {
            Some(r) => {
                let size = bulk.len() as u64;
                let nodes = r.put(id, bulk, replicate).await?;
                let receipt = self.receipt(asked.peer.identity(), &id, size, &nodes, asked.now_ms);
                Ok(Stored { nodes, receipt })
            }
            None => {
                self.blocking(move |s| s.put(&id, &bulk)).await?;
                Ok(Stored { nodes: Vec::new(), receipt: None })
            }
        }
    }
}

impl ServeNode<Get> for NodeService {
    async fn serve(&self, _: &Asked, req: Get, (): ()) -> Result<Bytes, WireError> {
        let Get { id, offset, len, local_only, .. } = req;
        let local = self.stored_range(id, offset, len).await;
        let answer = match (local, &self.site) {
            // Another node fetching for its site gets this node's cached copy too, but
            // never makes it fetch further.
            (Err(e), Some(site)) if e.code == ErrorCode::NotFound && local_only => {
                site.cached(id, offset, len).await.and_then(|cached| cached.ok_or(e))
            }
            (Err(e), Some(site)) if e.code == ErrorCode::NotFound => site.get(id, offset, len).await,
            (local, _) => local,
        };
        match answer {
            Ok(data) if local_only && !data.is_empty() => Ok(corrupted_in_transit(data)),
            answer => answer,
        }
    }
}

impl ServeNode<Has> for NodeService {
    async fn serve(&self, _: &Asked, req: Has, (): ()) -> Result<Vec<bool>, WireError> {
        self.has(req.ids).await
    }
}

impl ServeNode<List> for NodeService {
    async fn serve(&self, _: &Asked, req: List, (): ()) -> Result<Vec<ChunkId>, WireError> {
        let (after, limit) = (req.after, req.limit.min(MAX_LIST) as usize);
        self.blocking(move |s| s.list(after, limit)).await
    }
}

impl ServeNode<Verify> for NodeService {
    async fn serve(&self, _: &Asked, req: Verify, (): ()) -> Result<Vec<ChunkId>, WireError> {
        self.blocking(move |s| Ok(s.verify(&req.ids))).await
    }
}

impl ServeNode<Delete> for NodeService {
    async fn serve(&self, _: &Asked, req: Delete, (): ()) -> Result<u64, WireError> {
        let min_age = Duration::from_secs(req.min_age_secs);
        self.blocking(move |s| s.delete(&req.ids, min_age)).await
    }
}

impl ServeNode<Stats> for NodeService {
    async fn serve(&self, _: &Asked, _: Stats, (): ()) -> Result<NodeStats, WireError> {
        Ok(self.store.stats())
    }
}

impl ServeNode<Ping> for NodeService {
    async fn serve(&self, _: &Asked, _: Ping, (): ()) -> Result<(), WireError> {
        Ok(())
    }
}

/// Opens a node's chunk store (`DATA_DIR`, sealed with its key if it has one), or with
/// `cache` its site cache (`DATA_DIR/cache`). `locus up` opens the store before `run_on`
/// so that its mount can read the same store in process (`client::LocalNode`).
pub async fn open_store(config: &NodeConfig, cache: bool) -> Result<ChunkStore, NodeError> {
    let key = config.encrypt_key.as_deref().map(chunk::seal::AtRest::from_key_file).transpose()?;
    let (dir, capacity) = match cache {
        false => (config.data_dir.clone(), config.capacity_bytes),
        true => (config.data_dir.join("cache"), config.wan.cache_bytes),
    };
    let opened = tokio::task::spawn_blocking(move || {
        let store = if cache { ChunkStore::open_cache(&dir, capacity) } else { ChunkStore::open(&dir, capacity) }?;
        Ok::<_, ChunkError>(match key {
            Some(key) => store.encrypted(key),
            None => store,
        })
    })
    .await
    .map_err(|e| NodeError::Internal(format!("opening the chunk store panicked: {e}")))??;
    Ok(opened)
}

/// Runs a node until its task is dropped: opens the store, then as `run_on`.
pub async fn run(config: NodeConfig, listener: TcpListener) -> Result<(), NodeError> {
    run_on(Arc::new(open_store(&config, false).await?), config, listener).await
}

/// Runs a node on an opened `store` until its task is dropped: registers with meta
/// (refusing to start if meta is unreachable or refuses), heartbeats, and serves
/// `listener`.
pub async fn run_on(store: Arc<ChunkStore>, mut config: NodeConfig, listener: TcpListener) -> Result<(), NodeError> {
    let cache = open_store(&config, true).await?;

    let epoch = Arc::new(Epoch::load(&config.data_dir)?);
    let rpc = connect_meta(&config).await?;
    let meta = Arc::new(MetaClient { rpc, epoch: epoch.clone() });
    let site =
        Arc::new(SiteLink::open(config.id.clone(), config.site.clone(), config.wan.clone(), meta.clone(), cache)?);
    let membership = Arc::new(Membership::load(&config.data_dir)?);
    let cap_key = Arc::new(CapKeyCell::default());
    wait_for_admission(&meta, &config, &membership, &cap_key, &store, &site).await?;
    tracing::info!(id = %config.id, site = %config.site, addr = %config.advertise_addr,
        meta = %config.meta_addr, "node registered with meta");

    let workers = Arc::new(Workers::default());
    let period = config.heartbeat.max(Duration::from_millis(10));
    workers.spawn(SiteLinkWorker { link: site.clone(), period, reported: 0 });
    let replicator = Arc::new(Replicator::new(
        config.id.clone(),
        config.site.clone(),
        site.clone(),
        store.clone(),
        config.replication.sync_timeout,
    ));
    workers.spawn(ReplicationWorker { replicator: replicator.clone(), made: 0, backoff: Duration::ZERO });
    let rc = config.replication.clone();
    workers.spawn(RepairWorker {
        replicator: replicator.clone(),
        meta: meta.clone(),
        period: rc.repair_every,
        rate: rc.repair_rate,
        after: None,
        repaired: 0,
        repaired_bytes: 0,
        found: 0,
    });
    workers.spawn(ScrubWorker {
        replicator: replicator.clone(),
        period: rc.scrub_every,
        rate: rc.scrub_rate,
        after: None,
        checked: 0,
        replaced: 0,
        passes: 0,
    });
    if let Some(metrics) = config.metrics.take() {
        let (id, site_name) = (config.id.clone(), config.site.clone());
        let parts = metrics::Parts {
            store: store.clone(),
            link: site.clone(),
            replicator: replicator.clone(),
            workers: workers.clone(),
        };
        tokio::spawn(metrics::serve(metrics, id, site_name, parts));
    }
    let reclaim = Reclaim {
        meta: meta.clone(),
        store: store.clone(),
        config: config.reclaim.clone(),
        after: None,
        again_at: None,
        reclaimed: 0,
    };
    workers.spawn(reclaim);
    let report = Arc::downgrade(&workers);
    workers.spawn(Registration {
        replicator: replicator.clone(),
        meta,
        config,
        membership,
        cap_key: cap_key.clone(),
        store: store.clone(),
        site: site.clone(),
        period,
        failing: false,
        workers: report,
    });
    let service = NodeService::with_site(store, Some(site), Some(replicator), cap_key, epoch);
    // Serving never stops by itself (a failing accept is retried); the workers stop
    // when this future is dropped at shutdown.
    match net::serve(listener, Arc::new(service)).await {}
}

/// Waiting for meta: says why once per change of reason, then sleeps a heartbeat.
struct Patience<'a> {
    config: &'a NodeConfig,
    last: String,
}

impl Patience<'_> {
    async fn again(&mut self, why: String) {
        if why != self.last {
            tracing::warn!(meta = %self.config.meta_addr, "{why}; asking again every {:?}", self.config.heartbeat);
            self.last = why;
        }
        tokio::time::sleep(self.config.heartbeat.max(Duration::from_millis(100))).await;
    }
}

/// Connects to meta, waiting while nothing answers at its address (a node may start
/// before its meta, or while meta restarts). A meta that answers but refuses (TLS,
/// identity) is an error.
async fn connect_meta(config: &NodeConfig) -> Result<RpcClient, NodeError> {
    let mut patience = Patience { config, last: String::new() };
    loop {
        match RpcClient::connect(&config.meta_addr, 1, META_TIMEOUT).await {
            Ok(rpc) => return Ok(rpc),
            Err(source @ (NetError::Connect { .. } | NetError::Timeout { .. })) => {
                patience.again(format!("meta unreachable ({source}); waiting for it")).await;
            }
            Err(source) => return Err(NodeError::MetaUnreachable { addr: config.meta_addr.clone(), source }),
        }
    }
}

/// Registers with meta; while meta refuses for want of an operator's admission
/// (`locus node admit`), logs its refusal and asks again every heartbeat. Until then the
/// node serves nothing and meta lists it only as pending, so it gets no chunks. A meta
/// of an older epoch than the node has seen (it lost the primary role) is waited out
/// the same way: it may be restarted at the new primary.
async fn wait_for_admission(
    meta: &MetaClient,
    config: &NodeConfig,
    membership: &Membership,
    cap_key: &CapKeyCell,
    store: &ChunkStore,
    site: &SiteLink,
) -> Result<(), NodeError> {
    let mut patience = Patience { config, last: String::new() };
    let mut token = config.join_token.clone();
    loop {
        match register(meta, config, membership, cap_key, store, site, Vec::new()).await {
            Err(NodeError::Refused { source, .. })
                if source.code == ErrorCode::PermissionDenied
                    && let Some(token) = token.take() =>
            {
                let addr = config.meta_addr.clone();
                match meta.ask(JoinNode { node: config.id.clone(), token }).await {
                    Ok(Ok(())) => tracing::info!(meta = %addr, "admitted by a join token"),
                    Ok(Err(source)) => return Err(NodeError::Refused { addr, id: config.id.clone(), source }),
                    Err(source) => return Err(NodeError::MetaUnreachable { addr, source }),
                }
            }
            Err(NodeError::Refused { source, .. })
                if matches!(source.code, ErrorCode::PermissionDenied | ErrorCode::ReadOnly) =>
            {
                patience.again(format!("meta refuses this node: {}", source.message)).await;
            }
            Err(waiting @ (NodeError::StaleMeta { .. } | NodeError::MetaUnreachable { .. })) => {
                patience.again(waiting.to_string()).await;
            }
            other => return other,
        }
    }
}

/// Sends one `RegisterNode` with current stats and checks (or, the first time, adopts)
/// the cluster meta answers with, and its epoch (a newer one is adopted; an older one
/// is refused, and nothing of that answer is taken).
async fn register(
    meta: &MetaClient,
    config: &NodeConfig,
    membership: &Membership,
    cap_key: &CapKeyCell,
    store: &ChunkStore,
    site: &SiteLink,
    site_rtts: Vec<(String, u64)>,
) -> Result<(), NodeError> {
    let stats = store.stats();
    let node = NodeInfo {
        id: config.id.clone(),
        store_id: store.store_id().to_string(),
        site: config.site.clone(),
        addr: config.advertise_addr.clone(),
        capacity_bytes: stats.capacity_bytes,
        used_bytes: stats.used_bytes,
        chunk_count: stats.chunk_count,
        last_seen_secs: 0,
        site_rtts,
        cache_bytes: site.cache_bytes(),
        drained: false,
    };
    let addr = config.meta_addr.clone();
    match meta.ask(RegisterNode { node, cluster_id: membership.id() }).await {
        Ok(Ok(Registered { cluster_id, cap_key: key, epoch })) => {
            membership.confirm(&addr, &cluster_id)?;
            meta.epoch.observe(&addr, epoch)?;
            cap_key.set(key);
            Ok(())
        }
        Ok(Err(e)) if e.code == ErrorCode::Exists => Err(NodeError::DuplicateId { addr, id: config.id.clone() }),
        Ok(Err(source)) => Err(NodeError::Refused { addr, id: config.id.clone(), source }),
        Err(source) => Err(NodeError::MetaUnreachable { addr, source }),
    }
}

/// The `heartbeat` worker: repeats the registration every period with current stats;
/// failures are recorded and retried at the next period (the client reconnects
/// lazily), never fatal.
struct Registration {
    meta: Arc<MetaClient>,
    config: NodeConfig,
    membership: Arc<Membership>,
    cap_key: Arc<CapKeyCell>,
    store: Arc<ChunkStore>,
    site: Arc<SiteLink>,
    period: Duration,
    failing: bool,
    /// The node's workers (this one among them), reported with every heartbeat.
    workers: std::sync::Weak<Workers>,
    /// Whose owed copies are reported with every heartbeat.
    replicator: Arc<Replicator>,
}

impl Registration {
    /// Sends a report to meta.
    async fn tell_meta<M: proto::meta::MetaMessage>(&self, report: M) -> Result<(), NodeError> {
        let addr = self.config.meta_addr.clone();
        match self.meta.ask(report).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(NodeError::Refused { addr, id: self.config.id.clone(), source }),
            Err(source) => Err(NodeError::MetaUnreachable { addr, source }),
        }
    }
}

impl Worker for Registration {
    type Error = NodeError;

    fn name(&self) -> String {
        "heartbeat".into()
    }

    fn progress(&self) -> String {
        format!("registered with meta at {} (epoch {})", self.config.meta_addr, self.meta.epoch.get())
    }

    async fn work(&mut self) -> Result<Step, NodeError> {
        let rtts = self.site.site_rtts();
        match register(&self.meta, &self.config, &self.membership, &self.cap_key, &self.store, &self.site, rtts).await {
            Ok(()) if self.failing => {
                tracing::info!(meta = %self.config.meta_addr, "heartbeat to meta succeeds again");
                self.failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                self.failing = true;
                return Err(e);
            }
        }
        // The revocation list meta distributes: connections of revoked peers go.
        if let Ok(Ok(list)) = self.meta.ask(Revocations {}).await {
            net::set_revoked(list.entries);
        }
        if let Some(workers) = self.workers.upgrade() {
            let process = format!("node {}", self.config.id);
            let report = ReportWorkers { process, workers: workers.statuses() };
            self.tell_meta(report).await?;
        }
        let lag = ReportLag { node: self.config.id.clone(), lag: self.replicator.lag_report() };
        self.tell_meta(lag).await?;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}
