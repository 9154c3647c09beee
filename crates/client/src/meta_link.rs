//! The client's control path: one connection pool to meta (or meta in this process,
//! called directly: `InProcessMeta`), the session it opened there, and typed helpers
//! for the answers the client expects.

use crate::error::VfsError;
use bytes::Bytes;
use net::PushHandler;
use net::RpcClient;
use proto::error::ErrorCode;
use proto::meta::{Envelope, Hello, MetaMessage, MetaPush, MetaRequestKind, PushAnswer, SessionInfo};
use proto::types::{Caller, SessionId};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use util::worker::Workers;

type Result<T> = std::result::Result<T, VfsError>;

tokio::task_local! {
    /// The user the current operation acts for (set by the adapter per request).
    static CALLER: Caller;
}

/// Runs `work` for `caller`: every request it sends to meta carries that user's
/// credentials, which meta checks permissions against. Outside such a scope a
/// request carries none and acts as the client host itself.
pub async fn acting_as<F: Future>(caller: Caller, work: F) -> F::Output {
    CALLER.scope(caller, work).await
}

/// The user the current task acts for, if any.
pub(crate) fn current_caller() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Meta in this client's own process (`locus up`): a request is answered by a call,
/// without the loopback connection, its frames and the two thread wake-ups on either
/// side of it (stats 1.8x, creates 1.4x: bench/results/metadata-ab-in-process.md). `Hello`
/// still goes over the connection, which meta then pushes its requests on.
pub trait InProcessMeta: Send + Sync {
    /// Answers `call` as meta answers one from a connection.
    fn call(&self, call: proto::meta::MetaCall) -> InProcessAnswer<'_>;
}

/// What `InProcessMeta::call` returns.
pub type InProcessAnswer<'a> = std::pin::Pin<Box<dyn Future<Output = proto::meta::MetaResult> + Send + 'a>>;

/// Meta as this client talks to it.
pub(crate) struct MetaLink {
    rpc: RpcClient,
    /// Meta in this process, called instead of sent to (all but `Hello`).
    in_process: Option<Arc<dyn InProcessMeta>>,
    /// How long an answer may take (as `RpcClient`'s for the connection).
    timeout: Duration,
    pushes: Arc<Pushes>,
    session: AtomicU64,
    info: SessionInfo,
    /// This host's users' logins, sent with their requests (`logins`).
    logins: Option<crate::logins::Logins>,
    /// Calls that may change a directory (`RequestFacts::changes_dirs`)
    /// begun plus ended: unchanged between two readings means no such request began or
    /// ended in between (see `call_alone`).
    calls: AtomicU64,
    /// Held while a lost session is replaced (`reopen`): one new session, not one per
    /// request that found the old one gone.
    reopening: tokio::sync::Mutex<()>,
    /// Sessions opened in place of lost ones.
    reopened: AtomicU64,
}

/// Counts a call's end in `MetaLink::calls`, also when it fails or is dropped.
struct Ending<'a>(&'a AtomicU64);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl MetaLink {
    /// Connects to meta; the session is opened by `hello`.
    pub async fn connect(
        addr: &str,
        connections: usize,
        timeout: Duration,
        info: SessionInfo,
        in_process: Option<Arc<dyn InProcessMeta>>,
        logins: Option<std::path::PathBuf>,
    ) -> Result<MetaLink> {
        let pushes = Arc::new(Pushes { workers: OnceLock::new() });
        let rpc = RpcClient::connect_with_push(addr, connections, timeout, pushes.clone())
            .await
            .map_err(|e| VfsError::new(ErrorCode::Io, format!("meta unreachable: {e}")))?;
        let logins = logins.map(crate::logins::Logins::new);
        Ok(MetaLink {
            rpc,
            in_process,
            timeout,
            pushes,
            session: AtomicU64::new(0),
            info,
            logins,
            calls: AtomicU64::new(0),
            reopening: tokio::sync::Mutex::new(()),
            reopened: AtomicU64::new(0),
        })
    }

    /// The workers whose status this client reports when meta asks (`locus status`).
    pub fn report_workers(&self, workers: Weak<Workers>) {
        let _ = self.pushes.workers.set(workers);
    }

    /// Opens a (new) session; returns how often meta wants a heartbeat.
    pub async fn hello(&self) -> Result<Duration> {
        // On the connection, also with meta in this process: it is the one meta's pushes
        // to this session come on.
        let welcome = self.rpc.ask(Hello { protocol: proto::PROTOCOL_VERSION, session: self.info.clone() }).await??;
        self.session.store(welcome.session, Ordering::Relaxed);
        Ok(Duration::from_millis(welcome.heartbeat_ms.max(100)))
    }

    /// The session meta gave this client.
    pub fn session(&self) -> SessionId {
        self.session.load(Ordering::Relaxed)
    }

    /// Sends one request, for the user the current task acts for (`acting_as`), and
    /// returns its typed answer. A request in a session meta no longer knows (it expired
    /// while meta was out of reach, e.g. across a failover) is sent again, once, in a
    /// new session (`reopen`), instead of failing as if its file were missing.
    pub async fn call<M: MetaMessage + Clone>(&self, mut msg: M) -> Result<M::Response> {
        let Some(sent_in) = msg.session_mut().map(|s| *s).filter(|_| M::KIND != MetaRequestKind::Goodbye) else {
            return self.call_once(msg).await;
        };
        let mut again = msg.clone();
        match self.call_once(msg).await {
            Err(e) if e.code == ErrorCode::SessionUnknown => {
                self.reopen(sent_in).await?;
                if let Some(session) = again.session_mut() {
                    *session = self.session();
                }
                self.call_once(again).await
            }
            answer => answer,
        }
    }

    /// Opens a new session in place of `lost`, which meta no longer knows, unless
    /// another request already did.
    async fn reopen(&self, lost: SessionId) -> Result<()> {
        let _one_at_a_time = self.reopening.lock().await;
        if self.session() == lost {
            tracing::warn!(
                "session {lost} is unknown to meta (it expired while meta was out of reach); opening a new one: its \
                 locks and open-file records were lost"
            );
            self.hello().await?;
            self.reopened.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// How many times this client opened a new session in place of a lost one.
    pub fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }

    /// `call` without the second try in a new session.
    async fn call_once<M: MetaMessage>(&self, msg: M) -> Result<M::Response> {
        // One line per round trip: `LOCUS_LOG=client::meta_link=trace` counts them.
        tracing::trace!(request = std::any::type_name::<M>().rsplit("::").next().unwrap_or_default(), "meta call");
        let _ending = M::KIND.facts().changes_dirs.then(|| {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ending(&self.calls)
        });
        let envelope = match current_caller() {
            Some(caller) => {
                let token = self.logins.as_ref().and_then(|l| l.token(caller.uid).filter(|_| caller.uid != 0));
                Envelope::as_user(caller, self.info.site.clone(), msg).with_token(token)
            }
            None => Envelope::plain(msg),
        };
        Ok(match &self.in_process {
            Some(meta) => {
                use proto::Call;
                let answer =
                    tokio::time::timeout(self.timeout, meta.call(envelope.into_wire())).await.map_err(|_| {
                        VfsError::new(
                            ErrorCode::TimedOut,
                            format!("meta (in this process) did not answer within {:?}", self.timeout),
                        )
                    })?;
                Envelope::<M>::output(answer)?
            }
            None => self.rpc.ask(envelope).await??,
        })
    }

    /// `call`, and whether no other request to meta that may change a directory began
    /// or ended while it ran: then its answer reflects every change of a directory this
    /// client has had answered, and stays so while `unchanged_since` the returned mark.
    pub async fn call_alone<M: MetaMessage + Clone>(&self, msg: M) -> Result<(M::Response, Option<u64>)> {
        let own = if M::KIND.facts().changes_dirs { 2 } else { 0 };
        let before = self.calls.load(Ordering::SeqCst);
        let answer = self.call(msg).await?;
        let after = self.calls.load(Ordering::SeqCst);
        Ok((answer, (after == before + own).then_some(after)))
    }

    /// Whether no request to meta that may change a directory began or ended since
    /// `call_alone` returned `mark`.
    pub fn unchanged_since(&self, mark: u64) -> bool {
        self.calls.load(Ordering::SeqCst) == mark
    }
}

/// Answers what meta pushes on this client's connection.
struct Pushes {
    workers: OnceLock<Weak<Workers>>,
}

impl PushHandler for Pushes {
    type Request = MetaPush;
    type Reply = PushAnswer;

    async fn handle(self: Arc<Self>, req: MetaPush, _bulk: Bytes) -> (PushAnswer, Bytes) {
        match req {
            MetaPush::Workers => {
                let workers = self.workers.get().and_then(Weak::upgrade).map(|w| w.statuses()).unwrap_or_default();
                (PushAnswer::Workers(workers), Bytes::new())
            }
        }
    }
}
