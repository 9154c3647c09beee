//! The site storage daemon: serves chunks from a local `chunk::ChunkStore` over the
//! data-path protocol (`proto::node`) and announces itself to meta with a periodic
//! `RegisterNode` heartbeat.

use bytes::Bytes;
use chunk::{ChunkError, ChunkStore};
use net::{NetError, RpcClient, Service};
use proto::error::{ErrorCode, WireError};
use proto::meta::{MetaRequest, MetaResult};
use proto::node::{NodeReply, NodeRequest, NodeResult};
use proto::types::NodeInfo;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Most ids one `List` answers, so a reply stays far below the frame size limit.
pub const MAX_LIST: u32 = 65_536;

/// How long a call to meta may take before the node gives up on it.
const META_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a node needs to start; built by the binary from its config.
#[derive(Debug, Clone)]
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
    #[error("meta at {addr} refused to register node {id:?}: {source}")]
    Refused { addr: String, id: String, source: WireError },
    #[error("serving chunks stopped: {0}")]
    Serve(#[source] std::io::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Answers `NodeRequest`s from a chunk store; disk work runs on the blocking pool so
/// slow disks never stall the network tasks.
pub struct NodeService {
    store: Arc<ChunkStore>,
}

impl NodeService {
    pub fn new(store: Arc<ChunkStore>) -> Self {
        NodeService { store }
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

impl Service for NodeService {
    type Request = NodeRequest;
    type Reply = NodeResult;

    async fn handle(self: Arc<Self>, req: NodeRequest, bulk: Bytes) -> (NodeResult, Bytes) {
        let reply = match req {
            NodeRequest::Put { id } => self.blocking(move |s| s.put(&id, &bulk)).await.map(|()| NodeReply::Done),
            NodeRequest::Get { id, offset, len } => {
                return match self.blocking(move |s| s.get(&id, offset, len)).await {
                    Ok(data) => (Ok(NodeReply::Data), Bytes::from(data)),
                    Err(e) => (Err(e), Bytes::new()),
                };
            }
            NodeRequest::Has { ids } => self.blocking(move |s| s.has(&ids)).await.map(NodeReply::Flags),
            NodeRequest::List { after, limit } => {
                let limit = limit.min(MAX_LIST) as usize;
                self.blocking(move |s| s.list(after, limit)).await.map(NodeReply::Ids)
            }
            NodeRequest::Verify { ids } => self.blocking(move |s| Ok(s.verify(&ids))).await.map(NodeReply::Ids),
            NodeRequest::Delete { ids, min_age_secs } => {
                let min_age = Duration::from_secs(min_age_secs);
                self.blocking(move |s| s.delete(&ids, min_age)).await.map(NodeReply::Count)
            }
            NodeRequest::Stats => Ok(NodeReply::Stats(self.store.stats())),
        };
        (reply, Bytes::new())
    }
}

/// Runs a node until serving fails: opens the store, registers with meta (refusing
/// to start if meta is unreachable or refuses), heartbeats, and serves `listener`.
pub async fn run(config: NodeConfig, listener: TcpListener) -> Result<(), NodeError> {
    let (dir, capacity) = (config.data_dir.clone(), config.capacity_bytes);
    let store = tokio::task::spawn_blocking(move || ChunkStore::open(&dir, capacity))
        .await
        .map_err(|e| NodeError::Internal(format!("opening the chunk store panicked: {e}")))??;
    let store = Arc::new(store);

    let meta = RpcClient::connect(&config.meta_addr, 1, META_TIMEOUT)
        .await
        .map_err(|source| NodeError::MetaUnreachable { addr: config.meta_addr.clone(), source })?;
    register(&meta, &config, &store).await?;
    tracing::info!(id = %config.id, site = %config.site, addr = %config.advertise_addr,
        meta = %config.meta_addr, "node registered with meta");

    let heartbeat = tokio::spawn(heartbeat_loop(meta, config.clone(), store.clone()));
    let served = net::serve(listener, Arc::new(NodeService::new(store))).await;
    heartbeat.abort();
    served.map_err(NodeError::Serve)
}

/// Sends one `RegisterNode` with current stats.
async fn register(meta: &RpcClient, config: &NodeConfig, store: &ChunkStore) -> Result<(), NodeError> {
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
    };
    let addr = config.meta_addr.clone();
    match meta.call::<_, MetaResult>(&MetaRequest::RegisterNode { node }).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.code == ErrorCode::Exists => Err(NodeError::DuplicateId { addr, id: config.id.clone() }),
        Ok(Err(source)) => Err(NodeError::Refused { addr, id: config.id.clone(), source }),
        Err(source) => Err(NodeError::MetaUnreachable { addr, source }),
    }
}

/// Repeats the registration every `config.heartbeat`; failures are logged and retried
/// at the next tick (the client reconnects lazily), never fatal.
async fn heartbeat_loop(meta: RpcClient, config: NodeConfig, store: Arc<ChunkStore>) {
    let mut ticks = tokio::time::interval(config.heartbeat.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // The first tick is immediate; we just registered.
    let mut failing = false;
    loop {
        ticks.tick().await;
        match register(&meta, &config, &store).await {
            Ok(()) if failing => {
                tracing::info!(meta = %config.meta_addr, "heartbeat to meta succeeds again");
                failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat to meta failed; will retry");
                failing = true;
            }
        }
    }
}
