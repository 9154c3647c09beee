//! `NodeService` behind a real `net::serve` on loopback, driven by `net::RpcClient`.

use bytes::Bytes;
use chunk::ChunkStore;
use net::RpcClient;
use node::NodeService;
use proto::error::{ErrorCode, WireError};
use proto::node::{Delete, Get, Has, List, NodeMessage, NodeStats, Put, Stats, Stored, Verify};
use proto::types::ChunkId;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

struct Node {
    client: RpcClient,
    _dir: tempfile::TempDir,
    data: PathBuf,
}

async fn start(capacity: u64) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = Arc::new(ChunkStore::open(&data, capacity).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(net::serve(listener, Arc::new(NodeService::new(store))));
    let client = RpcClient::connect(&addr, 2, Duration::from_secs(10)).await.unwrap();
    Node { client, _dir: dir, data }
}

impl Node {
    async fn call<M: NodeMessage<Bulk = ()>>(&self, req: M) -> Result<M::Response, WireError> {
        self.client.call_node(req).await.unwrap()
    }

    /// Sends `data` as the request's bulk bytes (Put).
    async fn send(&self, id: ChunkId, data: Vec<u8>) -> Result<Stored, WireError> {
        self.send_at(id, data, 0).await
    }

    /// As `send`, stating primary-role `epoch`.
    async fn send_at(&self, id: ChunkId, data: Vec<u8>, epoch: u64) -> Result<Stored, WireError> {
        let put = Put { id, cap: None, epoch, replicate: Default::default() };
        self.client.call_node_bulk(put, Bytes::from(data)).await.unwrap()
    }

    /// A Get, with the bytes that came back as bulk.
    async fn fetch(&self, id: ChunkId, offset: u64, len: u64) -> Result<Vec<u8>, WireError> {
        let got = self.call(Get { id, offset, len, local_only: false, cap: None }).await;
        got.map(|bytes| bytes.to_vec())
    }

    async fn put(&self, data: &[u8]) -> ChunkId {
        let id = ChunkId::of(data);
        assert_eq!(self.send(id, data.to_vec()).await, Ok(ALONE));
        id
    }

    async fn stats(&self) -> NodeStats {
        self.call(Stats {}).await.unwrap()
    }

    fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.data.join("chunks").join(&hex[..2]).join(hex)
    }
}

/// A put's answer from a node that replicates nothing: it alone holds the chunk.
const ALONE: Stored = Stored { nodes: Vec::new(), receipt: None };

fn code<T: std::fmt::Debug>(r: Result<T, WireError>) -> ErrorCode {
    match r {
        Err(WireError { code, .. }) => code,
        Ok(reply) => panic!("expected an error, got {reply:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_has_list_stats() {
    let n = start(1 << 20).await;
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let id = n.put(&data).await;
    // Idempotent.
    n.put(&data).await;

    assert_eq!(n.fetch(id, 0, 1000).await, Ok(data.clone()));
    assert_eq!(n.fetch(id, 100, 10).await, Ok(data[100..110].to_vec()));
    assert_eq!(n.fetch(id, 990, 100).await, Ok(data[990..].to_vec()));
    assert_eq!(n.fetch(id, 1001, 1).await.unwrap_err().code, ErrorCode::InvalidArgument);
    let missing = ChunkId::of(b"missing");
    assert_eq!(
        code(n.call(Get { id: missing, offset: 0, len: 1, local_only: false, cap: None }).await),
        ErrorCode::NotFound
    );

    assert_eq!(code(n.send(missing, b"not it".to_vec()).await), ErrorCode::InvalidArgument);

    assert_eq!(n.call(Has { ids: vec![missing, id] }).await, Ok(vec![false, true]));

    let mut ids = vec![id];
    for i in 0..20u32 {
        ids.push(n.put(&i.to_be_bytes()).await);
    }
    ids.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = n.call(List { after, limit: 6 }).await.expect("list failed");
        if page.is_empty() {
            break;
        }
        after = page.last().copied();
        seen.extend(page);
    }
    assert_eq!(seen, ids);

    let s = n.stats().await;
    assert_eq!((s.capacity_bytes, s.used_bytes, s.chunk_count, s.corrupt_reads), (1 << 20, 1000 + 20 * 4, 21, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_chunk_is_refused_and_connection_stays_usable() {
    let n = start(1 << 20).await;
    let bad = n.put(b"some bytes that will rot").await;
    let good = n.put(b"bytes that stay fine").await;
    let path = n.chunk_path(&bad);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0x80;
    std::fs::write(&path, bytes).unwrap();

    let err = n.call(Get { id: bad, offset: 0, len: 4, local_only: false, cap: None }).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Corrupt);
    assert!(err.message.contains(&bad.to_hex()), "{}", err.message);
    // Same client, same connections: still answering.
    assert_eq!(n.fetch(good, 0, 5).await, Ok(b"bytes".to_vec()));
    assert_eq!(n.stats().await.corrupt_reads, 1);

    let missing = ChunkId::of(b"never stored");
    assert_eq!(n.call(Verify { ids: vec![good, bad, missing] }).await, Ok(vec![bad, missing]));
    // A fresh put of the right bytes repairs it.
    n.put(b"some bytes that will rot").await;
    assert_eq!(n.call(Verify { ids: vec![good, bad] }).await, Ok(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_honours_min_age() {
    let n = start(1 << 20).await;
    let a = n.put(b"chunk a").await;
    let b = n.put(b"chunk b").await;
    let del = |ids: Vec<ChunkId>, min_age_secs| Delete { ids, min_age_secs, epoch: 0 };
    assert_eq!(n.call(del(vec![a, b], 3600)).await, Ok(0));
    assert_eq!(n.call(del(vec![a], 0)).await, Ok(1));
    assert_eq!(n.call(del(vec![a], 0)).await, Ok(0));
    assert_eq!(n.call(Has { ids: vec![a, b] }).await, Ok(vec![false, true]));
    let s = n.stats().await;
    assert_eq!((s.used_bytes, s.chunk_count), (7, 1));
}

/// A put or delete of a newer epoch of the primary role teaches the node (a peer
/// heard of a failover first); from then on puts and deletes of the older epoch are
/// refused with `ReadOnly` and change nothing, while reads still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_epoch_is_passed_on_and_older_work_refused() {
    let n = start(1 << 20).await;
    let put = |data: &[u8], epoch| n.send_at(ChunkId::of(data), data.to_vec(), epoch);
    assert!(put(b"old", 1).await.is_ok());
    assert!(put(b"new", 2).await.is_ok(), "a newer epoch than the node knows is no reason to refuse");
    let refused = put(b"stale", 1).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::ReadOnly, "{refused}");
    assert!(refused.message.contains("acts under epoch 1 of the primary role, but this node has seen epoch 2"));
    let old = ChunkId::of(b"old");
    let delete = |epoch| Delete { ids: vec![old], min_age_secs: 0, epoch };
    assert_eq!(n.call(delete(1)).await.unwrap_err().code, ErrorCode::ReadOnly);
    let has = Has { ids: vec![old, ChunkId::of(b"stale")] };
    assert_eq!(n.call(has.clone()).await, Ok(vec![true, false]), "nothing changed");
    assert_eq!(n.fetch(old, 0, 3).await.unwrap(), b"old", "reads state no epoch");
    assert_eq!(n.call(delete(2)).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_node_answers_no_space() {
    let n = start(64).await;
    n.put(&[1u8; 60]).await;
    let data = vec![2u8; 10];
    let err = n.send(ChunkId::of(&data), data).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::NoSpace);
    assert_eq!(n.stats().await.chunk_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_of_one_chunk_count_once() {
    let n = Arc::new(start(1 << 20).await);
    let data = vec![7u8; 4096];
    let id = ChunkId::of(&data);
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (n, data) = (n.clone(), data.clone());
            tokio::spawn(async move { n.send(id, data).await })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap(), Ok(ALONE));
    }
    let s = n.stats().await;
    assert_eq!((s.used_bytes, s.chunk_count), (4096, 1));
    assert_eq!(std::fs::read_dir(n.data.join("tmp")).unwrap().count(), 0);
}

fn config(data_dir: PathBuf, meta_addr: String) -> node::NodeConfig {
    node::NodeConfig {
        id: "n1".into(),
        site: "s1".into(),
        data_dir,
        capacity_bytes: 1 << 20,
        meta_addr,
        advertise_addr: "127.0.0.1:1".into(),
        heartbeat: Duration::from_secs(1),
        wan: node::WanConfig::default(),
        reclaim: node::ReclaimConfig::default(),
        replication: node::ReplicationConfig::default(),
        metrics: None,
        join_token: None,
        encrypt_key: None,
    }
}

/// A node whose meta is not there (yet) waits for it instead of failing: a node may
/// start before its meta, or while meta restarts (locus's `cluster.rs` checks that it
/// registers once meta is back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_while_meta_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was free a moment ago: nothing listens there.
    let meta_addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = node::run(config(dir.path().join("data"), meta_addr), listener);
    let ended = tokio::time::timeout(Duration::from_secs(1), run).await;
    assert!(ended.is_err(), "the node stopped while its meta was unreachable: {:?}", ended.map(|r| r.err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_fails_clearly_when_the_data_dir_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _held = ChunkStore::open(&data, 1 << 20).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = node::run(config(data, "127.0.0.1:1".into()), listener).await.unwrap_err();
    assert!(matches!(err, node::NodeError::Store(_)), "{err}");
    assert!(err.to_string().contains("in use by another process"), "{err}");
}
