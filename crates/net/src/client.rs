//! The calling side: a pool of connections to one peer. Each call writes its own
//! frame under the connection's lock (no writer task to wake) and a reader task per
//! connection routes answers back to their callers by request id, and runs the
//! requests the server pushes through the client's `PushHandler`, if it has one.

use crate::conn::{Budget, Conn, Handler, ReaderRules, Work, encode_answer};
use crate::tls::Tls;
use crate::{MAX_FRAME, NetError, PeerIdentity, tune};
use bytes::Bytes;
use proto::error::WireError;
use proto::frame;
use proto::node::{Bulk, NodeMessage, NodeRequest, NodeResult};
use serde::{Serialize, de::DeserializeOwned};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Pushed requests a client answers at once per connection; the server's pushes
/// wait (backpressure) beyond it.
const PUSH_IN_FLIGHT: usize = 64;

/// Answers the requests a server pushes on a client's connections (leases,
/// invalidations, progress).
pub trait PushHandler: Send + Sync + 'static {
    /// What the server pushes.
    type Request: DeserializeOwned + Send + 'static;
    /// What the client answers.
    type Reply: Serialize + Send + 'static;
    /// Answers one pushed request; runs in its own task, beside the client's calls.
    fn handle(self: Arc<Self>, req: Self::Request, bulk: Bytes) -> impl Future<Output = (Self::Reply, Bytes)> + Send;
}

/// A `PushHandler` behind the connection's type-erased handler.
struct Push<H>(Arc<H>);

impl<H: PushHandler> Handler for Push<H> {
    fn start(&self, request_id: u64, payload: &[u8], bulk: Bytes) -> Result<Work, NetError> {
        let req: H::Request = frame::decode(payload)?;
        let handler = self.0.clone();
        Ok(Box::pin(async move {
            let (reply, bulk) = handler.handle(req, bulk).await;
            encode_answer(request_id, &reply, bulk)
        }))
    }
}

/// A pool of pipelined connections to one peer that reconnects lazily after a failure.
/// Every connect, send and wait for an answer is bounded by the client's timeout.
pub struct RpcClient {
    addr: String,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next_slot: AtomicUsize,
    /// Slots requests are spread over (the first ones); the rest stay unopened.
    active: AtomicUsize,
    timeout: Duration,
    push: Option<Arc<dyn Handler>>,
    /// `None`: plain TCP.
    tls: Option<Arc<Tls>>,
}

impl RpcClient {
    /// A client with `connections` sockets to `addr`; the first is opened now so a
    /// wrong address fails here, the rest on first use. `timeout` bounds each connect,
    /// send and wait for an answer.
    pub async fn connect(addr: &str, connections: usize, timeout: Duration) -> Result<Self, NetError> {
        Self::open(addr, connections, timeout, None, crate::tls::current()).await
    }

    /// Like `connect`, with a TLS set-up other than the process's (`None`: plain
    /// TCP), for tools and tests that play several parts in one process.
    pub async fn connect_as(
        addr: &str,
        connections: usize,
        timeout: Duration,
        tls: Option<Arc<Tls>>,
    ) -> Result<Self, NetError> {
        Self::open(addr, connections, timeout, None, tls).await
    }

    /// Like `connect`, and every connection answers the server's pushes with `push`.
    pub async fn connect_with_push<H: PushHandler>(
        addr: &str,
        connections: usize,
        timeout: Duration,
        push: Arc<H>,
    ) -> Result<Self, NetError> {
        Self::open(addr, connections, timeout, Some(Arc::new(Push(push))), crate::tls::current()).await
    }

    async fn open(
        addr: &str,
        connections: usize,
        timeout: Duration,
        push: Option<Arc<dyn Handler>>,
        tls: Option<Arc<Tls>>,
    ) -> Result<Self, NetError> {
        let client = RpcClient {
            addr: addr.to_string(),
            slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            active: AtomicUsize::new(connections.max(1)),
            timeout,
            push,
            tls,
        };
        client.conn(0).await?;
        Ok(client)
    }

    /// The peer's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// What the server's certificate proved, from the most recent connection (`None`
    /// without TLS or before any connection).
    pub async fn server_identity(&self) -> Option<PeerIdentity> {
        for slot in &self.slots {
            if let Some(c) = slot.lock().await.as_ref()
                && let Some(p) = &c.proven
            {
                return Some(p.identity.as_ref().clone());
            }
        }
        None
    }

    /// Connections in use: how many transfers can stream side by side.
    pub fn connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Spreads requests over the first `n` connections only (1 to the pool's size), so
    /// a caller that learns the path (its round trip) can size the pool to it; a
    /// connection left out finishes what it carries and is reopened only if used again.
    pub fn use_connections(&self, n: usize) {
        self.active.store(n.clamp(1, self.slots.len()), Ordering::Relaxed);
    }

    /// Opens every connection in use that is not open yet, all at once, so that the
    /// first transfers over a long path do not each wait for TCP and TLS handshakes
    /// (three round trips: 0.6 s at 200 ms).
    pub async fn warm(self: &Arc<Self>) -> Result<(), NetError> {
        let opening: Vec<_> = (0..self.connections())
            .map(|slot| {
                let me = self.clone();
                tokio::spawn(async move { me.conn(slot).await.map(drop) })
            })
            .collect();
        let mut first_error = Ok(());
        for opened in opening {
            if let Ok(Err(e)) = opened.await
                && first_error.is_ok()
            {
                first_error = Err(e);
            }
        }
        first_error
    }

    async fn conn(&self, slot: usize) -> Result<Arc<Conn>, NetError> {
        let mut guard = self.slots[slot].lock().await;
        if let Some(c) = guard.as_ref()
            && c.is_alive()
        {
            return Ok(c.clone());
        }
        let stream = match tokio::time::timeout(self.timeout, TcpStream::connect(&self.addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(NetError::Connect { addr: self.addr.clone(), source }),
            Err(_) => return Err(NetError::Timeout { addr: self.addr.clone(), what: "connect", after: self.timeout }),
        };
        tune(&stream);
        let secured = match tokio::time::timeout(self.timeout, crate::tls::connect(stream, self.tls.clone())).await {
            Ok(Ok(s)) => s,
            Ok(Err(reason)) => {
                tracing::warn!(addr = %self.addr, "{reason}");
                return Err(NetError::Refused { addr: self.addr.clone(), reason });
            }
            Err(_) => {
                return Err(NetError::Timeout { addr: self.addr.clone(), what: "handshake", after: self.timeout });
            }
        };
        let id = crate::conn::next_conn_id();
        let conn = Conn::new(id, self.addr.clone(), secured.proven, secured.writer, secured.socket, self.timeout);
        let reader = secured.reader;
        let rules = ReaderRules {
            in_flight: Arc::new(Semaphore::new(PUSH_IN_FLIGHT)),
            in_flight_max: PUSH_IN_FLIGHT,
            budget: Budget { conn: Arc::new(Semaphore::new(2 * MAX_FRAME)), global: None },
            idle: None,
            frame: self.timeout,
        };
        conn.start_reader(reader, rules, self.push.clone(), || {});
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Sends `req` and waits for its answer. Requests from concurrent callers are
    /// pipelined on the pool's connections.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(&self, req: &Req) -> Result<Resp, NetError> {
        Ok(self.call_bulk(req, Bytes::new()).await?.0)
    }

    /// Sends a typed request and returns its typed answer: the outer error is the
    /// transport's, the inner one the peer's refusal.
    pub async fn ask<C: proto::Call>(&self, req: C) -> Result<Result<C::Output, WireError>, NetError> {
        let answer: C::Answer = self.call(&req.into_wire()).await?;
        Ok(C::output(answer))
    }

    /// Sends a node request that carries no bulk bytes and returns its typed answer
    /// (a `Get`'s is the chunk's bytes): the outer error is the transport's, the inner
    /// one the node's refusal or an answer of another kind.
    pub async fn call_node<M: NodeMessage<Bulk = ()>>(
        &self,
        req: M,
    ) -> Result<Result<M::Response, WireError>, NetError> {
        self.send_node(req, ()).await
    }

    /// Like `call_node`, for a request that carries bulk bytes (a `Put`'s chunk).
    pub async fn call_node_bulk<M: NodeMessage<Bulk = Bytes>>(
        &self,
        req: M,
        bulk: Bytes,
    ) -> Result<Result<M::Response, WireError>, NetError> {
        self.send_node(req, bulk).await
    }

    /// Either of the two, for callers generic over the request (bulk `()` for one that
    /// carries none).
    pub async fn send_node<M: NodeMessage>(
        &self,
        req: M,
        bulk: M::Bulk,
    ) -> Result<Result<M::Response, WireError>, NetError> {
        let req: NodeRequest = req.into();
        let (answer, bulk): (NodeResult, Bytes) = self.call_bulk(&req, bulk.into_bytes()).await?;
        Ok(M::response(answer, bulk))
    }

    /// Like `call`, with bulk bytes (chunk data) sent after the request and returned
    /// after the answer, never copied through the codec.
    pub async fn call_bulk<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        req: &Req,
        bulk: Bytes,
    ) -> Result<(Resp, Bytes), NetError> {
        let conn = self.conn(self.pick_slot()).await?;
        conn.call_bulk(req, bulk, self.timeout).await
    }

    /// The next slot in turn, unless its connection is busy sending and another live
    /// one has fewer bytes waiting: a small request (a `Has`) then does not wait behind
    /// a chunk's bulk bytes, and chunks spread over the idle connections of a distant
    /// peer instead of queueing two deep on one. A slot not yet connected is taken in
    /// its turn (it connects).
    fn pick_slot(&self) -> usize {
        let n = self.active.load(Ordering::Relaxed);
        let turn = self.next_slot.fetch_add(1, Ordering::Relaxed) % n;
        let queued = |i: usize| {
            let slot = self.slots[i].try_lock().ok()?;
            slot.as_ref().filter(|c| c.is_alive()).map(|c| c.queued())
        };
        match queued(turn) {
            None | Some(0) => turn,
            Some(busy) => {
                (0..n).filter_map(|i| Some((queued(i)?, i))).min().filter(|&(q, _)| q < busy).map_or(turn, |(_, i)| i)
            }
        }
    }
}

impl Drop for RpcClient {
    /// The readers hold their connections; closing them here ends their tasks.
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(c) = slot.get_mut().take() {
                c.close();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_spread_over_the_connections_in_use_only() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let client = RpcClient::connect_as(&addr, 8, Duration::from_secs(30), None).await.unwrap();
        assert_eq!(client.connections(), 8);
        client.use_connections(3);
        assert_eq!(client.connections(), 3);
        let picked: std::collections::BTreeSet<usize> = (0..12).map(|_| client.pick_slot()).collect();
        assert_eq!(picked, [0, 1, 2].into(), "only the first three slots");
        client.use_connections(100);
        assert_eq!(client.connections(), 8, "never more than the pool holds");
        client.use_connections(0);
        assert_eq!(client.connections(), 1, "never fewer than one");
    }

    /// A send that fails on the peer's reset says why the peer ended the connection,
    /// even when its last bytes (here a TLS record sent to this plain end) were still
    /// unread: on this runtime's one thread the reader cannot run before the send.
    #[tokio::test]
    async fn a_failed_send_says_why_the_peer_ended_the_connection() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let client = RpcClient::connect_as(&addr, 1, Duration::from_secs(30), None).await.unwrap();
        let conn = client.conn(0).await.unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        // Bytes the peer never reads make its close a reset.
        conn.send(b"never read", b"").await.unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut record = [0u8; proto::frame::HEADER_LEN];
        record[..3].copy_from_slice(&[0x16, 0x03, 0x01]);
        peer.write_all(&record).unwrap();
        drop(peer);
        std::thread::sleep(Duration::from_millis(100));
        let err = conn.send(b"too late", b"").await.unwrap_err().to_string();
        assert!(err.contains("cannot send") && err.contains("refusing a TLS client"), "{err}");
    }

    #[tokio::test]
    async fn small_requests_avoid_a_connection_busy_sending_bulk() {
        // A peer that accepts and never reads: a large send stays stuck in its socket.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let held = std::thread::spawn(move || (0..2).map(|_| listener.accept().unwrap().0).collect::<Vec<_>>());
        let client = Arc::new(RpcClient::connect_as(&addr, 2, Duration::from_secs(30), None).await.unwrap());
        client.conn(1).await.unwrap();
        // Both idle: slots are taken in turn.
        assert_eq!([client.pick_slot(), client.pick_slot()], [0, 1]);
        let stuck = client.clone();
        let bulk = tokio::spawn(async move {
            let _ = stuck.call_bulk::<_, ()>(&(), Bytes::from(vec![0u8; proto::frame::MAX_BULK as usize])).await;
        });
        let busy = client.conn(0).await.unwrap();
        for _ in 0..500 {
            if busy.queued() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(busy.queued() > 0, "the bulk send never started");
        // Every pick now avoids the busy connection, whoever's turn it is.
        for _ in 0..4 {
            assert_eq!(client.pick_slot(), 1);
        }
        bulk.abort();
        drop(held.join().unwrap());
    }
}
