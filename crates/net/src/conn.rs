//! One connection, either end: the frame reader (memory charged as bytes arrive,
//! requests in flight bounded, slow frames cut off), the locked frame writer with a
//! deadline, and the table of calls this end is waiting on. Both ends may ask: a
//! client's requests and a server's pushes travel the same way.

use crate::NetError;
use crate::tls::Proven;
use bytes::Bytes;
use proto::frame::{self, FrameKind, HEADER_LEN, Header};
use serde::{Serialize, de::DeserializeOwned};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use util::sync::lock;

/// Answers on their way back: payload and bulk bytes.
type Answer = (Vec<u8>, Bytes);
/// An encoded answer frame and its bulk bytes.
pub(crate) type Encoded = (Vec<u8>, Bytes);
/// The work a request turns into; it ends with the encoded answer.
pub(crate) type Work = Pin<Box<dyn Future<Output = Encoded> + Send>>;

/// Turns request frames that arrive on a connection into answers (the server's
/// `Service`, or a client's push handler), type-erased so one reader serves both.
pub(crate) trait Handler: Send + Sync + 'static {
    /// Decodes the request (an error ends the connection: the stream can no longer
    /// be trusted) and returns the work that answers it with id `request_id`.
    fn start(&self, request_id: u64, payload: &[u8], bulk: Bytes) -> Result<Work, NetError>;
}

/// Encodes an answer, or logs why it cannot be (the caller then times out).
pub(crate) fn encode_answer<T: Serialize>(request_id: u64, reply: &T, bulk: Bytes) -> Encoded {
    match frame::encode(FrameKind::Response, request_id, reply, bulk.len()) {
        Ok(bytes) => (bytes, bulk),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode an answer");
            (Vec::new(), Bytes::new())
        }
    }
}

/// Connection ids, unique in the process across servers and clients.
pub(crate) fn next_conn_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Process-wide milliseconds, for activity stamps that fit an atomic.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Buffered bytes one connection and all connections together may hold; a reader
/// waits for room before reading more (backpressure).
#[derive(Clone)]
pub(crate) struct Budget {
    pub(crate) conn: Arc<Semaphore>,
    pub(crate) global: Option<Arc<Shared>>,
}

/// The byte budget every connection of one server shares.
pub(crate) struct Shared {
    pub(crate) bytes: Semaphore,
    pub(crate) total: usize,
    /// Set when buffered bytes passed `PEAK`: the allocator then holds that much
    /// freed memory once they drain (see `server::trim_after_peaks`).
    pub(crate) peaked: AtomicBool,
}

/// Bulk bytes from which a send after `RESTART_IDLE_MS` of silence restarts the
/// connection's congestion control.
const RESTART_BULK: usize = 1 << 20;
const RESTART_IDLE_MS: u64 = 1000;

/// Large sends under way in this process (`Conn::send_queued`).
static BULK_SENDS: AtomicUsize = AtomicUsize::new(0);

/// Counts one large send in `BULK_SENDS` until dropped.
struct BulkSend;

impl Drop for BulkSend {
    fn drop(&mut self) {
        BULK_SENDS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a failed send waits for the reader to learn why the peer ended the
/// connection (its reset has arrived: the reader's next read answers at once).
const READER_VERDICT: Duration = Duration::from_millis(500);

/// Buffered bytes above which memory is given back to the system once they drain.
pub(crate) const PEAK: usize = 128 << 20;

impl Shared {
    pub(crate) fn new(total: usize) -> Self {
        Shared { bytes: Semaphore::new(total), total, peaked: AtomicBool::new(false) }
    }

    /// Bytes charged now.
    pub(crate) fn in_use(&self) -> usize {
        self.total.saturating_sub(self.bytes.available_permits())
    }
}

/// Bytes charged to a budget; returned when dropped.
#[derive(Default)]
pub(crate) struct Charge {
    conn: Vec<OwnedSemaphorePermit>,
    global: Vec<(Arc<Shared>, usize)>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        for (shared, n) in self.global.drain(..) {
            shared.bytes.add_permits(n);
        }
    }
}

impl Budget {
    async fn charge(&self, bytes: usize, into: &mut Charge) {
        let n = bytes as u32;
        if n == 0 {
            return;
        }
        if let Some(global) = &self.global
            && let Ok(p) = global.bytes.acquire_many(n).await
        {
            // `Charge::drop` gives these permits back.
            p.forget();
            into.global.push((global.clone(), n as usize));
            if global.in_use() > PEAK {
                global.peaked.store(true, Ordering::Relaxed);
            }
        }
        if let Ok(p) = self.conn.clone().acquire_many_owned(n).await {
            into.conn.push(p);
        }
    }
}

/// How a connection's reader behaves; the server and the client differ only here.
pub(crate) struct ReaderRules {
    /// Frames not yet answered at once; reading stops at this bound.
    pub(crate) in_flight: Arc<Semaphore>,
    /// The bound `in_flight` was created with.
    pub(crate) in_flight_max: usize,
    pub(crate) budget: Budget,
    /// A connection with nothing in flight for this long is closed.
    pub(crate) idle: Option<Duration>,
    /// A started frame must be complete within this time.
    pub(crate) frame: Duration,
}

/// Either half of a connection's stream: a TCP socket or a TLS session over one.
pub(crate) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half, as `ReadHalf`.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The shared state of one connection.
pub(crate) struct Conn {
    pub(crate) id: u64,
    /// The peer's address, for messages.
    pub(crate) addr: String,
    /// What the TLS handshake proved about the peer (`None` without TLS).
    pub(crate) proven: Option<Proven>,
    writer: tokio::sync::Mutex<Option<WriteHalf>>,
    /// Calls this end is waiting on; `None` once the connection is dead.
    pending: Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>,
    next_id: AtomicU64,
    send_timeout: Duration,
    last_active_ms: AtomicU64,
    /// Bytes of frames waiting for the writer or being written: how far behind a new
    /// frame on this connection would start.
    queued: AtomicU64,
    closed: AtomicBool,
    /// Set when the connection was closed because the peer stopped taking bytes.
    hung: AtomicBool,
    reader: OnceLock<tokio::task::AbortHandle>,
    /// Why the reader stopped (a TLS alert names a refused certificate), for errors.
    ended: OnceLock<String>,
    /// The TCP socket under `writer` (alive while `writer` holds it).
    socket: std::os::fd::RawFd,
    /// When this end last finished sending (ms, as `now_ms`).
    last_sent_ms: AtomicU64,
    /// Signalled once `ended` is set: a failed send waits briefly for it (`READER_VERDICT`).
    reader_ended: tokio::sync::Notify,
}

impl Conn {
    pub(crate) fn new(
        id: u64,
        addr: String,
        proven: Option<Proven>,
        writer: WriteHalf,
        socket: std::os::fd::RawFd,
        send_timeout: Duration,
    ) -> Arc<Conn> {
        let conn = Arc::new(Conn {
            id,
            addr,
            proven,
            writer: tokio::sync::Mutex::new(Some(writer)),
            pending: Mutex::new(Some(HashMap::new())),
            next_id: AtomicU64::new(1),
            send_timeout,
            last_active_ms: AtomicU64::new(now_ms()),
            queued: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            hung: AtomicBool::new(false),
            reader: OnceLock::new(),
            ended: OnceLock::new(),
            reader_ended: tokio::sync::Notify::new(),
            socket,
            last_sent_ms: AtomicU64::new(now_ms()),
        });
        if let Some(p) = &conn.proven {
            crate::tls::track(&conn, p);
        }
        conn
    }

    pub(crate) fn is_alive(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    /// Bytes a frame sent now would wait behind.
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    pub(crate) fn touch(&self) {
        self.last_active_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Milliseconds since anything was read or written.
    pub(crate) fn idle_ms(&self) -> u64 {
        now_ms().saturating_sub(self.last_active_ms.load(Ordering::Relaxed))
    }

    fn waiting_calls(&self) -> usize {
        lock(&self.pending).as_ref().map_or(0, HashMap::len)
    }

    /// Ends the connection: every waiting call fails, the reader stops, and the
    /// socket closes once the last sender lets go of it.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        lock(&self.pending).take();
        if let Ok(mut w) = self.writer.try_lock() {
            w.take();
        }
        if let Some(r) = self.reader.get() {
            r.abort();
        }
    }

    /// Writes one whole frame; the peer must take some of it every `send_timeout`
    /// (a slow link may take longer in total, a hung peer may not). A failed or late
    /// write leaves half a frame on the stream, so it ends the connection.
    pub(crate) async fn send(&self, frame: &[u8], bulk: &[u8]) -> Result<(), NetError> {
        let len = (frame.len() + bulk.len()) as u64;
        self.queued.fetch_add(len, Ordering::Relaxed);
        let sent = self.send_queued(frame, bulk).await;
        self.queued.fetch_sub(len, Ordering::Relaxed);
        sent
    }

    async fn send_queued(&self, frame: &[u8], bulk: &[u8]) -> Result<(), NetError> {
        // Waiting for the lock is bounded by the holder's own progress deadline.
        let mut guard = self.writer.lock().await;
        // A connection closed while this sender waited lets go of its socket here.
        if !self.is_alive() {
            guard.take();
        }
        let Some(half) = guard.as_mut() else {
            return Err(self.lost("connection closed"));
        };
        // A lone large send after a long silence (no other large send under way in
        // this process): restart the congestion control, so that BBR probes the path
        // afresh (startup) instead of pacing at the share of it that it measured while
        // other connections were busy too. Several at once would overflow the path.
        let _sending = (bulk.len() >= RESTART_BULK).then(|| {
            let others = BULK_SENDS.fetch_add(1, Ordering::Relaxed);
            let silent_ms = now_ms().saturating_sub(self.last_sent_ms.load(Ordering::Relaxed));
            if others == 0 && silent_ms >= RESTART_IDLE_MS {
                crate::restart_congestion_control(self.socket);
            }
            BulkSend
        });
        let mut failure = None;
        let (bulk_head, bulk_tail) = bulk.split_at(bulk.len() / 2);
        for (i, part) in [frame, bulk_head, bulk_tail].into_iter().enumerate() {
            if i == 2 && !part.is_empty() {
                util::crash_point!("net-mid-bulk");
            }
            if let Err(e) = write_progressing(half, part, self.send_timeout).await {
                failure = Some(e);
                break;
            }
        }
        if failure.is_none()
            && let Err(e) = flush_progressing(half, self.send_timeout).await
        {
            failure = Some(e);
        }
        let Some(e) = failure else {
            if !self.is_alive() {
                guard.take();
            }
            self.touch();
            // The moment `touch` just took: one clock read per send.
            self.last_sent_ms.store(self.last_active_ms.load(Ordering::Relaxed), Ordering::Relaxed);
            return Ok(());
        };
        let error = match e {
            None => {
                self.hung.store(true, Ordering::Release);
                NetError::Timeout { addr: self.addr.clone(), what: "send", after: self.send_timeout }
            }
            Some(e) => {
                // The peer's last words (a TLS alert refusing this end's certificate) may
                // still sit unread in the socket: let the reader read them before closing,
                // so the error says why rather than only that the write failed. (A closed
                // connection's reader was stopped: nothing to wait for.)
                let verdict = self.reader_ended.notified();
                if self.ended.get().is_none() && self.is_alive() {
                    let _ = tokio::time::timeout(READER_VERDICT, verdict).await;
                }
                self.lost(&format!("cannot send: {e}"))
            }
        };
        guard.take();
        drop(guard);
        self.close();
        Err(error)
    }

    /// Sends a request and waits up to `timeout` for its answer.
    pub(crate) async fn call_bulk<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        req: &Req,
        bulk: Bytes,
        timeout: Duration,
    ) -> Result<(Resp, Bytes), NetError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bytes = frame::encode(FrameKind::Request, id, req, bulk.len())?;
        let (tx, rx) = oneshot::channel();
        match lock(&self.pending).as_mut() {
            Some(map) => map.insert(id, tx),
            None => return Err(self.lost("connection closed")),
        };
        let forget = || {
            if let Some(map) = lock(&self.pending).as_mut() {
                map.remove(&id);
            }
        };
        if let Err(e) = self.send(&bytes, &bulk).await {
            forget();
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok((payload, bulk))) => Ok((frame::decode(&payload)?, bulk)),
            Ok(Err(_)) => Err(self.lost("the connection closed before the answer came")),
            Err(_) => {
                forget();
                Err(NetError::Timeout { addr: self.addr.clone(), what: "answer", after: timeout })
            }
        }
    }

    /// The error for a call on a dead connection: a timeout if it died of one.
    fn lost(&self, reason: &str) -> NetError {
        if self.hung.load(Ordering::Acquire) {
            return NetError::Timeout { addr: self.addr.clone(), what: "send", after: self.send_timeout };
        }
        let reason = match self.ended.get() {
            Some(why) if why.contains("alert") => format!("{reason}: the peer refused this end ({why})"),
            _ if self.proven.is_none() && crate::tls::insecure() => {
                format!("{reason} (this process runs with --insecure-no-tls: does the peer require TLS?)")
            }
            Some(why) => format!("{reason} ({why})"),
            None => reason.to_string(),
        };
        NetError::Disconnected { addr: self.addr.clone(), reason }
    }

    /// Starts the reader task; it closes the connection when it ends and then runs `ended`.
    pub(crate) fn start_reader(
        self: &Arc<Self>,
        reader: ReadHalf,
        rules: ReaderRules,
        handler: Option<Arc<dyn Handler>>,
        ended: impl FnOnce() + Send + 'static,
    ) {
        let conn = self.clone();
        let task = tokio::spawn(async move {
            let reason = read_loop(&conn, reader, rules, handler).await;
            tracing::debug!(addr = %conn.addr, %reason, "connection closed");
            let _ = conn.ended.set(reason);
            conn.reader_ended.notify_waiters();
            ended();
            crate::tls::untrack(conn.id);
            conn.close();
        });
        let _ = self.reader.set(task.abort_handle());
    }
}

/// Writes all of `buf`, each write making progress within `limit`; `Err(None)` is a
/// peer that took nothing for `limit`.
async fn write_progressing(
    half: &mut WriteHalf,
    mut buf: &[u8],
    limit: Duration,
) -> Result<(), Option<std::io::Error>> {
    use tokio::io::AsyncWriteExt;
    while !buf.is_empty() {
        match tokio::time::timeout(limit, half.write(buf)).await {
            Err(_) => return Err(None),
            Ok(Ok(0)) => return Err(Some(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) => return Err(Some(e)),
        }
    }
    Ok(())
}

/// Pushes out what a TLS session still buffers (a no-op on plain TCP), within `limit`.
async fn flush_progressing(half: &mut WriteHalf, limit: Duration) -> Result<(), Option<std::io::Error>> {
    use tokio::io::AsyncWriteExt;
    match tokio::time::timeout(limit, half.flush()).await {
        Err(_) => Err(None),
        Ok(r) => r.map_err(Some),
    }
}

/// Why a reader stopped.
type Reason = String;

async fn read_loop(
    conn: &Arc<Conn>,
    mut reader: ReadHalf,
    rules: ReaderRules,
    handler: Option<Arc<dyn Handler>>,
) -> Reason {
    loop {
        // Backpressure: no more reading while too many frames wait for an answer.
        let Ok(slot) = rules.in_flight.clone().acquire_owned().await else {
            return "closed".into();
        };
        let mut head = [0u8; HEADER_LEN];
        if let Err(reason) = wait_first_byte(conn, &mut reader, &rules, &mut head[..1]).await {
            return reason;
        }
        let deadline = tokio::time::Instant::now() + rules.frame;
        let body = async {
            reader.read_exact(&mut head[1..]).await.map_err(|e| e.to_string())?;
            let header = Header::decode(&head).map_err(|e| {
                if crate::tls::looks_like_tls(&head) {
                    let reason = "refusing a TLS client: this end runs without TLS (--insecure-no-tls)";
                    tracing::warn!(addr = %conn.addr, "{reason}");
                    return reason.to_string();
                }
                e.to_string()
            })?;
            let mut charge = Charge::default();
            let payload = read_growing(&mut reader, header.payload_len as usize, &rules.budget, &mut charge).await?;
            let bulk = read_growing(&mut reader, header.bulk_len as usize, &rules.budget, &mut charge).await?;
            Ok::<_, Reason>((header, payload, Bytes::from(bulk), charge))
        };
        let (header, payload, bulk, charge) = match tokio::time::timeout_at(deadline, body).await {
            Ok(Ok(frame)) => frame,
            Ok(Err(reason)) => return reason,
            Err(_) => return format!("a frame took longer than {:?} to arrive", rules.frame),
        };
        conn.touch();
        match header.kind {
            FrameKind::Response => {
                let waiter = lock(&conn.pending).as_mut().and_then(|m| m.remove(&header.request_id));
                if let Some(w) = waiter {
                    let _ = w.send((payload, bulk));
                }
            }
            FrameKind::Request => {
                let Some(handler) = &handler else {
                    return "the peer sent a request and this end answers none".into();
                };
                let work = match handler.start(header.request_id, &payload, bulk) {
                    Ok(work) => work,
                    Err(e) => return format!("malformed request: {e}"),
                };
                drop(payload);
                let conn = conn.clone();
                tokio::spawn(async move {
                    let (bytes, bulk) = work.await;
                    // The request's bytes are released before the answer is queued.
                    drop(charge);
                    if !bytes.is_empty()
                        && let Err(e) = conn.send(&bytes, &bulk).await
                    {
                        tracing::debug!(addr = %conn.addr, error = %e, "cannot send an answer");
                    }
                    drop(slot);
                });
            }
        }
    }
}

/// Waits for the first byte of the next frame; a server closes a connection that has
/// had nothing in flight for its idle time.
async fn wait_first_byte(
    conn: &Conn,
    reader: &mut ReadHalf,
    rules: &ReaderRules,
    byte: &mut [u8],
) -> Result<(), Reason> {
    loop {
        let read = reader.read(byte);
        let n = match rules.idle {
            None => read.await,
            Some(idle) => {
                let left = idle.saturating_sub(Duration::from_millis(conn.idle_ms()));
                match tokio::time::timeout(left, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        // The reader holds one slot itself while it waits.
                        let busy =
                            rules.in_flight.available_permits() + 1 < rules.in_flight_max || conn.waiting_calls() > 0;
                        if busy {
                            conn.touch();
                            continue;
                        }
                        return Err(format!("idle for {idle:?}"));
                    }
                }
            }
        };
        return match n {
            Ok(0) => Err("the peer closed the connection".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
    }
}

/// Reads `len` bytes into memory that grows as they arrive (never more than four
/// times what has arrived plus one step: quadrupling keeps the copies of a growing
/// 4 MiB chunk to a third of its size), charging each growth to the budget first.
async fn read_growing(
    reader: &mut ReadHalf,
    len: usize,
    budget: &Budget,
    charge: &mut Charge,
) -> Result<Vec<u8>, Reason> {
    const STEP: usize = 64 << 10;
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            let grow = (len - buf.len()).min((3 * buf.len()).max(STEP));
            budget.charge(grow, charge).await;
            buf.reserve_exact(grow);
        }
        let room = buf.capacity() - buf.len();
        let mut limited = (&mut *reader).take(room as u64);
        if limited.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the peer closed the connection inside a frame".into());
        }
    }
    Ok(buf)
}
