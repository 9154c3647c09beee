//! The answering side: each connection reads requests and runs each in its own task,
//! so a slow request never holds up the ones behind it. What a connection may hold is
//! bounded by `Limits`; the accept loop outlives running out of file descriptors.

use crate::conn::{Budget, Conn, Handler, PEAK, ReaderRules, Shared, Work, encode_answer};
use crate::tls::{Secured, Tls};
use crate::{Limits, MAX_FRAME, NetError, PeerIdentity, tune};
use bytes::Bytes;
use proto::frame;
use proto::types::SessionId;
use serde::{Serialize, de::DeserializeOwned};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use util::sync::lock;

/// A request handler: one typed request (plus its bulk bytes, if any) in, one typed
/// answer (plus bulk bytes, usually empty) out, told which peer asks.
pub trait Service: Send + Sync + 'static {
    /// What clients send.
    type Request: DeserializeOwned + Send + 'static;
    /// What the service answers.
    type Reply: Serialize + Send + 'static;
    /// Answers one request from `peer`; runs in its own task.
    fn handle(
        self: Arc<Self>,
        peer: Peer,
        req: Self::Request,
        bulk: Bytes,
    ) -> impl Future<Output = (Self::Reply, Bytes)> + Send;
}

/// Who sent a request: what the connection itself establishes, never what a request
/// claims: the remote address, the connection, the certificate identity the TLS
/// handshake proved, and the session the service bound to this connection when it
/// answered the session's `Hello`.
#[derive(Clone)]
pub struct Peer {
    addr: SocketAddr,
    conn: Arc<Conn>,
    session: Arc<Mutex<Option<SessionId>>>,
}

impl Peer {
    /// What the peer's certificate proves; `None` only when TLS is explicitly
    /// disabled (`--insecure-no-tls`, or an in-process test that installed nothing).
    pub fn identity(&self) -> Option<&PeerIdentity> {
        self.conn.proven.as_ref().map(|p| p.identity.as_ref())
    }

    /// The remote socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This connection's id, unique within the process.
    pub fn conn_id(&self) -> u64 {
        self.conn.id
    }

    /// The session bound to this connection by `set_session`, if any.
    pub fn session(&self) -> Option<SessionId> {
        *lock(&self.session)
    }

    /// Binds `session` to this connection; the service calls it when it answers that
    /// session's `Hello`, so later requests on the connection can be trusted to come
    /// from it. A later `Hello` on the same connection rebinds it.
    pub fn set_session(&self, session: SessionId) {
        *lock(&self.session) = Some(session);
    }

    /// A handle to send requests to this peer on its own connection (server push).
    pub fn handle(&self) -> ConnHandle {
        ConnHandle { conn: self.conn.clone() }
    }
}

/// A connection a service keeps to push requests to the client at the other end;
/// the client answers through its `PushHandler`.
#[derive(Clone)]
pub struct ConnHandle {
    conn: Arc<Conn>,
}

impl ConnHandle {
    /// Sends `req` to the client and waits up to `timeout` for its answer.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, NetError> {
        Ok(self.conn.call_bulk(req, Bytes::new(), timeout).await?.0)
    }

    /// Like `call`, with bulk bytes both ways.
    pub async fn call_bulk<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        req: &Req,
        bulk: Bytes,
        timeout: Duration,
    ) -> Result<(Resp, Bytes), NetError> {
        self.conn.call_bulk(req, bulk, timeout).await
    }

    /// Whether the connection is still open (a closed one never reopens: the client
    /// connects anew and says `Hello` again).
    pub fn is_open(&self) -> bool {
        self.conn.is_alive()
    }

    /// The id of the connection, as `Peer::conn_id`.
    pub fn conn_id(&self) -> u64 {
        self.conn.id
    }
}

/// Runs a `Service` for the requests of one connection.
struct ServiceHandler<S> {
    service: Arc<S>,
    peer: Peer,
}

impl<S: Service> Handler for ServiceHandler<S> {
    fn start(&self, request_id: u64, payload: &[u8], bulk: Bytes) -> Result<Work, NetError> {
        let req: S::Request = frame::decode(payload)?;
        let (service, peer) = (self.service.clone(), self.peer.clone());
        Ok(Box::pin(async move {
            let (reply, bulk) = service.handle(peer, req, bulk).await;
            encode_answer(request_id, &reply, bulk)
        }))
    }
}

/// One open connection as the accept loop sees it.
struct Entry {
    conn: Arc<Conn>,
    in_flight: Arc<Semaphore>,
}

/// State shared by the accept loop and every connection of one listener.
struct Server {
    limits: Limits,
    conns: Mutex<HashMap<u64, Entry>>,
    buffered: Arc<Shared>,
    /// Handshakes in progress, oldest first.
    handshakes: Mutex<std::collections::BTreeMap<u64, tokio::task::AbortHandle>>,
    /// `None`: plain TCP.
    tls: Option<Arc<Tls>>,
}

impl Server {
    /// Closes the connection idle the longest (nothing in flight); false if none is.
    fn close_oldest_idle(&self, conns: &mut HashMap<u64, Entry>) -> bool {
        let max = self.limits.max_in_flight.max(1);
        let oldest = conns
            .values()
            .filter(|e| e.in_flight.available_permits() + 1 >= max)
            .max_by_key(|e| e.conn.idle_ms())
            .map(|e| e.conn.id);
        match oldest.and_then(|id| conns.remove(&id)) {
            Some(e) => {
                tracing::debug!(addr = %e.conn.addr, "closing the connection idle the longest");
                e.conn.close();
                true
            }
            None => false,
        }
    }

    /// Runs the handshake of a new connection, bounded in time and in how many run at
    /// once: at the cap the oldest pending handshake is dropped for the newcomer, so
    /// a flood of silent sockets cannot lock out a peer that completes its handshake
    /// in a round trip. Without TLS the connection is admitted at once.
    fn handshake<S: Service>(self: &Arc<Self>, stream: TcpStream, addr: SocketAddr, service: &Arc<S>) {
        tune(&stream);
        let Some(tls) = self.tls.clone() else {
            return self.admit(crate::tls::plain(stream), addr, service);
        };
        let id = crate::conn::next_conn_id();
        let (server, service) = (self.clone(), service.clone());
        let mut pending = lock(&self.handshakes);
        if pending.len() >= self.limits.max_handshakes.max(1) {
            tracing::debug!(%addr, "too many handshakes in progress: dropping the oldest");
            Self::drop_oldest_handshake(&mut pending);
        }
        let task = tokio::spawn(async move {
            let secured = tokio::time::timeout(server.limits.handshake_timeout, crate::tls::accept(stream, tls)).await;
            lock(&server.handshakes).remove(&id);
            match secured {
                Ok(Ok(secured)) => server.admit(secured, addr, &service),
                Ok(Err(reason)) => tracing::warn!(%addr, "{reason}"),
                Err(_) => tracing::debug!(%addr, "no handshake within {:?}", server.limits.handshake_timeout),
            }
        });
        pending.insert(id, task.abort_handle());
    }

    /// Ends the handshake that has waited the longest; false if none is running.
    fn drop_oldest_handshake(pending: &mut std::collections::BTreeMap<u64, tokio::task::AbortHandle>) -> bool {
        pending.pop_first().map(|(_, task)| task.abort()).is_some()
    }

    fn admit<S: Service>(self: &Arc<Self>, secured: Secured, addr: SocketAddr, service: &Arc<S>) {
        let mut conns = lock(&self.conns);
        if conns.len() >= self.limits.max_connections.max(1) && !self.close_oldest_idle(&mut conns) {
            tracing::debug!(%addr, "refusing a connection: every connection is busy");
            return;
        }
        let Secured { reader, writer, proven, socket } = secured;
        let id = crate::conn::next_conn_id();
        let conn = Conn::new(id, addr.to_string(), proven, writer, socket, self.limits.send_timeout);
        let in_flight = Arc::new(Semaphore::new(self.limits.max_in_flight.max(1)));
        let rules = ReaderRules {
            in_flight: in_flight.clone(),
            in_flight_max: self.limits.max_in_flight.max(1),
            budget: Budget {
                conn: Arc::new(Semaphore::new(self.limits.conn_buffer_bytes.max(MAX_FRAME))),
                global: Some(self.buffered.clone()),
            },
            idle: Some(self.limits.idle_timeout),
            frame: self.limits.frame_timeout,
        };
        let peer = Peer { addr, conn: conn.clone(), session: Arc::default() };
        let handler = Arc::new(ServiceHandler { service: service.clone(), peer });
        conns.insert(id, Entry { conn: conn.clone(), in_flight });
        drop(conns);
        let server = self.clone();
        conn.start_reader(reader, rules, Some(handler), move || {
            lock(&server.conns).remove(&id);
        });
    }
}

/// Gives freed memory back to the system once a peak of buffered request bytes has
/// drained. glibc keeps freed heap memory (and the binary raises its trim threshold
/// so chunk buffers are reused): measured on meta, 64 connections each sending a
/// 16 MiB frame left RSS at 905 MB after they closed, and 1.2 GB after a second
/// round; `malloc_trim` after the drain brings it back to its size before the flood.
async fn trim_after_peaks(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(shared) = shared.upgrade() else { return };
        if shared.in_use() < PEAK / 4 && shared.peaked.swap(false, Ordering::Relaxed) {
            trim();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only returns free pages of the allocator to the system.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// Serves `service` on `listener` with the limits set by `set_limits` (or the
/// defaults). Never returns: a failing accept is logged and retried.
pub async fn serve<S: Service>(listener: TcpListener, service: Arc<S>) -> Infallible {
    serve_with(listener, service, crate::LIMITS.get().cloned().unwrap_or_default()).await
}

/// Serves `service` on `listener` under `limits`; each connection is served
/// concurrently. Running out of file descriptors closes the connection idle the
/// longest and backs off (logged once per episode); this loop never stops by itself.
pub async fn serve_with<S: Service>(listener: TcpListener, service: Arc<S>, limits: Limits) -> Infallible {
    serve_as(listener, service, limits, crate::tls::current()).await
}

/// Like `serve_with`, with a TLS set-up other than the process's (`None`: plain TCP),
/// for tools and tests that play several parts in one process.
pub async fn serve_as<S: Service>(
    listener: TcpListener,
    service: Arc<S>,
    limits: Limits,
    tls: Option<Arc<Tls>>,
) -> Infallible {
    let buffered = Arc::new(Shared::new(limits.total_buffer_bytes.max(MAX_FRAME)));
    // map-check: not a worker (the server's own trim timer; it holds the buffer count
    // weakly and ends with the server, which has no Workers of its own)
    tokio::spawn(trim_after_peaks(Arc::downgrade(&buffered)));
    let server = Arc::new(Server { limits, conns: Mutex::default(), buffered, handshakes: Mutex::default(), tls });
    let mut backoff: Option<Duration> = None;
    let mut warned: Option<std::time::Instant> = None;
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                backoff = None;
                server.handshake(stream, addr, &service);
            }
            Err(e) => {
                // Once per episode, not once per failed accept.
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!("cannot accept a connection ({e}); closing idle connections and retrying");
                    warned = Some(std::time::Instant::now());
                }
                let delay = backoff.map_or(Duration::from_millis(10), |d| (d * 2).min(Duration::from_secs(1)));
                backoff = Some(delay);
                if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                    let mut conns = lock(&server.conns);
                    if !server.close_oldest_idle(&mut conns) {
                        Server::drop_oldest_handshake(&mut lock(&server.handshakes));
                    }
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RpcClient;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Echo;
    impl Service for Echo {
        type Request = (u64, u64);
        type Reply = u64;
        async fn handle(self: Arc<Self>, _peer: Peer, (delay_ms, v): (u64, u64), bulk: Bytes) -> (u64, Bytes) {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            (v * 2, bulk)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_answers_out_of_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let client = Arc::new(RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap());
        let started = std::time::Instant::now();
        // 50 requests each taking 100 ms finish together when pipelined.
        let calls: Vec<_> = (0..50u64)
            .map(|i| {
                let c = client.clone();
                tokio::spawn(async move { c.call::<_, u64>(&(100u64, i)).await.unwrap() })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), 2 * i as u64);
        }
        assert!(started.elapsed() < Duration::from_secs(3), "requests were not pipelined");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_bytes_travel_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let client = RpcClient::connect(&addr, 2, Duration::from_secs(5)).await.unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let (v, back): (u64, Bytes) = client.call_bulk(&(0u64, 4u64), Bytes::from(data.clone())).await.unwrap();
        assert_eq!((v, &back[..]), (8, &data[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn garbage_closes_only_that_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&[0xff; 64]).await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(raw.read(&mut buf).await.unwrap(), 0, "server must close a garbled stream");
        let client = RpcClient::connect(&addr, 2, Duration::from_secs(5)).await.unwrap();
        assert_eq!(client.call::<_, u64>(&(0u64, 21u64)).await.unwrap(), 42);
    }

    /// A service that counts handlers running at once and keeps a handle to the last
    /// connection that registered, for pushes.
    #[derive(Default)]
    struct Probe {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        registered: Mutex<Option<ConnHandle>>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    enum Ask {
        Slow { ms: u64, v: u64 },
        Hello(SessionId),
        WhoAmI,
        Register,
    }

    impl Service for Probe {
        type Request = Ask;
        type Reply = Option<u64>;
        async fn handle(self: Arc<Self>, peer: Peer, req: Ask, _bulk: Bytes) -> (Option<u64>, Bytes) {
            let reply = match req {
                Ask::Slow { ms, v } => {
                    let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                    self.most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    self.running.fetch_sub(1, Ordering::SeqCst);
                    Some(v)
                }
                Ask::Hello(s) => {
                    peer.set_session(s);
                    Some(s)
                }
                Ask::WhoAmI => peer.session(),
                Ask::Register => {
                    *self.registered.lock().unwrap() = Some(peer.handle());
                    Some(peer.conn_id())
                }
            };
            (reply, Bytes::new())
        }
    }

    /// Adds one to what the server pushes, after a pause that makes answers overlap.
    struct AddOne;
    impl crate::PushHandler for AddOne {
        type Request = u64;
        type Reply = u64;
        async fn handle(self: Arc<Self>, v: u64, _bulk: Bytes) -> (u64, Bytes) {
            tokio::time::sleep(Duration::from_millis(v % 7)).await;
            (v + 1, Bytes::new())
        }
    }

    async fn start(service: Arc<Probe>, limits: Limits) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve_with(listener, service, limits));
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_pushes_while_the_client_has_hundreds_of_calls_in_flight() {
        let probe = Arc::new(Probe::default());
        let addr = start(probe.clone(), Limits::default()).await;
        let client =
            Arc::new(RpcClient::connect_with_push(&addr, 1, Duration::from_secs(20), Arc::new(AddOne)).await.unwrap());
        let _: Option<u64> = client.call(&Ask::Register).await.unwrap();
        let handle = probe.registered.lock().unwrap().clone().unwrap();
        let calls: Vec<_> = (0..400u64)
            .map(|v| {
                let c = client.clone();
                tokio::spawn(async move { c.call::<_, Option<u64>>(&Ask::Slow { ms: 200, v }).await.unwrap() })
            })
            .collect();
        let pushes: Vec<_> = (0..400u64)
            .map(|v| {
                let h = handle.clone();
                tokio::spawn(async move { h.call::<_, u64>(&v, Duration::from_secs(20)).await.unwrap() })
            })
            .collect();
        for (v, push) in pushes.into_iter().enumerate() {
            assert_eq!(push.await.unwrap(), v as u64 + 1);
        }
        for (v, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), Some(v as u64));
        }
        assert!(probe.most.load(Ordering::SeqCst) > 100, "the calls were not in flight together");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_without_a_push_handler_drops_the_connection_on_a_push() {
        let probe = Arc::new(Probe::default());
        let addr = start(probe.clone(), Limits::default()).await;
        let client = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        let _: Option<u64> = client.call(&Ask::Register).await.unwrap();
        let handle = probe.registered.lock().unwrap().clone().unwrap();
        let err = handle.call::<_, u64>(&1u64, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, NetError::Disconnected { .. }), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_session_slot_belongs_to_one_connection() {
        let addr = start(Arc::default(), Limits::default()).await;
        let one = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        let other = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(one.call::<_, Option<u64>>(&Ask::WhoAmI).await.unwrap(), None);
        assert_eq!(one.call::<_, Option<u64>>(&Ask::Hello(77)).await.unwrap(), Some(77));
        assert_eq!(one.call::<_, Option<u64>>(&Ask::WhoAmI).await.unwrap(), Some(77));
        assert_eq!(other.call::<_, Option<u64>>(&Ask::WhoAmI).await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_in_flight_per_connection_are_bounded() {
        let probe = Arc::new(Probe::default());
        let limits = Limits { max_in_flight: 8, ..Limits::default() };
        let addr = start(probe.clone(), limits).await;
        let client = Arc::new(RpcClient::connect(&addr, 1, Duration::from_secs(20)).await.unwrap());
        let calls: Vec<_> = (0..64u64)
            .map(|v| {
                let c = client.clone();
                tokio::spawn(async move { c.call::<_, Option<u64>>(&Ask::Slow { ms: 20, v }).await.unwrap() })
            })
            .collect();
        for (v, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), Some(v as u64));
        }
        let most = probe.most.load(Ordering::SeqCst);
        assert!((2..=8).contains(&most), "{most} requests ran at once");
    }

    /// Reads until the server closes `raw`, failing after `within`.
    async fn closed_within(raw: &mut TcpStream, within: Duration) {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(within, async {
            loop {
                match raw.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        read.await.expect("the server kept the connection open");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_and_slow_connections_are_closed_while_busy_ones_are_served() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(300),
            frame_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let addr = start(Arc::default(), limits).await;
        let mut idle = TcpStream::connect(&addr).await.unwrap();
        let mut slow = TcpStream::connect(&addr).await.unwrap();
        // Half a header, then nothing: a started frame that never completes.
        slow.write_all(&[0u8; 10]).await.unwrap();
        let client = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        // A call that outlasts the idle time keeps its connection.
        assert_eq!(client.call::<_, Option<u64>>(&Ask::Slow { ms: 700, v: 5 }).await.unwrap(), Some(5));
        closed_within(&mut idle, Duration::from_secs(3)).await;
        closed_within(&mut slow, Duration::from_secs(3)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_connection_cap_the_oldest_idle_connection_makes_room() {
        let addr = start(Arc::default(), Limits { max_connections: 3, ..Limits::default() }).await;
        let mut oldest = TcpStream::connect(&addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _second = TcpStream::connect(&addr).await.unwrap();
        let _third = TcpStream::connect(&addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let client = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(client.call::<_, Option<u64>>(&Ask::Slow { ms: 0, v: 1 }).await.unwrap(), Some(1));
        closed_within(&mut oldest, Duration::from_secs(3)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_peer_times_out_sends_and_answers() {
        // Accepts and then neither reads nor answers, like a stopped process.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = listener.accept().await.unwrap();
                held.push(s);
            }
        });
        let limit = Duration::from_millis(500);
        let client = RpcClient::connect(&addr, 1, limit).await.unwrap();
        let started = std::time::Instant::now();
        let err = client.call::<_, u64>(&(0u64, 1u64)).await.unwrap_err();
        assert!(matches!(err, NetError::Timeout { what: "answer", .. }), "{err}");
        // 64 MiB cannot fit in socket buffers: the send itself must give up.
        let big = Bytes::from(vec![7u8; 64 << 20]);
        let err = client.call_bulk::<_, u64>(&(0u64, 1u64), big).await.unwrap_err();
        assert!(matches!(err, NetError::Timeout { what: "send", .. }), "{err}");
        assert_eq!(err.code(), proto::error::ErrorCode::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        held.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_connection_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let err = RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.err().unwrap();
        assert_eq!(err.code(), proto::error::ErrorCode::Unreachable, "{err}");
    }
}
