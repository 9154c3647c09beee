//! The RPC face of meta: dispatches `MetaRequest`s to the store (off the async
//! runtime) or the in-memory lock table, and expires silent sessions in the background.

use crate::error::MetaError;
use crate::locks::LockTable;
use crate::opens::OpenTable;
use crate::ops::{self, Access, Ctx};
use crate::sqlite::SqliteStore;
use crate::store::{self, MetaStore};
use bytes::Bytes;
use proto::meta::{LockKind, MetaReply, MetaRequest, MetaResult};
use proto::types::SessionId;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What `locus meta` needs to run; the binary builds it from its config file.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// The SQLite database file (created on first start).
    pub db_path: PathBuf,
    /// How often clients should heartbeat; told to them in `Welcome`.
    pub heartbeat: Duration,
    /// A session silent for longer loses its locks and open-file records.
    pub session_expiry: Duration,
}

/// The metadata service: one per cluster, shared by every connection.
pub struct MetaService {
    store: Arc<dyn MetaStore>,
    locks: Mutex<LockTable>,
    opens: Arc<OpenTable>,
    heartbeat: Duration,
    session_expiry: Duration,
    /// Orphans are reaped only once every session alive before a restart of meta
    /// (whose open records were in memory) has had time to expire: this many ms
    /// after the service started.
    reap_after_ms: i64,
}

impl MetaService {
    /// Opens (or creates) the SQLite database named in `config`.
    pub fn open_sqlite(config: &MetaConfig) -> Result<Arc<MetaService>, MetaError> {
        let store = SqliteStore::open(&config.db_path)?;
        Ok(Self::with_store(Arc::new(store), config))
    }

    /// A service over any backend (the conformance suite uses this).
    pub(crate) fn with_store(store: Arc<dyn MetaStore>, config: &MetaConfig) -> Arc<MetaService> {
        Arc::new(MetaService {
            store,
            locks: Mutex::new(LockTable::default()),
            opens: Arc::new(OpenTable::default()),
            heartbeat: config.heartbeat,
            session_expiry: config.session_expiry,
            reap_after_ms: Ctx::now(0, Arc::default()).now_ms + config.session_expiry.as_millis() as i64,
        })
    }

    /// Starts the session and orphan reaper on the current tokio runtime; it stops
    /// once the service is dropped.
    pub fn spawn_background(self: &Arc<Self>) {
        let weak: Weak<MetaService> = Arc::downgrade(self);
        let period = (self.session_expiry / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(service) = weak.upgrade() else {
                    return;
                };
                let result = tokio::task::spawn_blocking(move || {
                    let ctx = service.ctx();
                    service.expire_sessions_at(ctx.now_ms)
                })
                .await;
                match result {
                    Ok(Ok(expired)) if !expired.is_empty() => {
                        tracing::info!(?expired, "expired silent sessions")
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "session expiry failed"),
                    Err(e) => tracing::warn!(error = %e, "session expiry task failed"),
                }
            }
        });
    }

    fn ctx(&self) -> Ctx {
        Ctx::now(self.heartbeat.as_millis() as u64, self.opens.clone())
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, LockTable> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every session whose last heartbeat is older than `session_expiry` at
    /// `now_ms`, dropping its locks and open records. Blocking.
    pub(crate) fn expire_sessions_at(&self, now_ms: i64) -> Result<Vec<SessionId>, MetaError> {
        let cutoff = now_ms.saturating_sub(self.session_expiry.as_millis() as i64);
        let opens = self.opens.clone();
        let reap = now_ms >= self.reap_after_ms;
        let expired = store::write(&*self.store, false, move |t| {
            let expired = ops::expire_sessions(t, &opens, cutoff)?;
            if reap {
                ops::reap_orphans(t, &opens)?;
            }
            Ok(expired)
        })?;
        let mut locks = self.locks();
        for s in &expired {
            locks.drop_session(*s);
        }
        Ok(expired)
    }

    /// Answers one request from a blocking context (tests), on a per-thread runtime.
    #[cfg(test)]
    pub(crate) fn handle_blocking(self: &Arc<Self>, req: MetaRequest) -> MetaResult {
        thread_local! {
            static RT: tokio::runtime::Runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("test runtime");
        }
        RT.with(|rt| rt.block_on(self.answer(req))).map_err(Into::into)
    }

    /// Answers one request. Writes are queued to the store's writer and awaited
    /// without holding a thread; point reads run inline (they take microseconds);
    /// reads that may scan run on the blocking pool.
    async fn answer(self: &Arc<Self>, req: MetaRequest) -> Result<MetaReply, MetaError> {
        let ctx = self.ctx();
        match ops::access(&req) {
            Access::Locks => self.lock_request(req),
            Access::Read if is_point_read(&req) => store::read(&*self.store, |t| ops::read(t, &ctx, &req)),
            Access::Read => {
                let service = self.clone();
                tokio::task::spawn_blocking(move || store::read(&*service.store, |t| ops::read(t, &ctx, &req)))
                    .await
                    .map_err(|e| MetaError::Internal(format!("read task failed: {e}")))?
            }
            Access::Open => {
                // Opening and closing are bookkeeping in memory; only a release that
                // leaves an orphan unopened costs a transaction (to reclaim it).
                let reply = store::read(&*self.store, |t| ops::read(t, &ctx, &req))?;
                match req {
                    MetaRequest::Open { ino, session, .. } => self.opens.add(session, ino),
                    MetaRequest::Release { ino, session } => {
                        let orphan = matches!(&reply, MetaReply::Attr(a) if a.nlink == 0);
                        if self.opens.remove(session, ino) && orphan && self.opens.count(ino) == 0 {
                            let opens = self.opens.clone();
                            store::write_async(self.store.clone(), false, move |t| {
                                ops::reclaim_if_unused(t, &opens, ino)
                            })
                            .await?;
                        }
                        return Ok(MetaReply::Done);
                    }
                    _ => {}
                }
                Ok(reply)
            }
            Access::Write { durable } => {
                let goodbye = match req {
                    MetaRequest::Goodbye { session } => Some(session),
                    _ => None,
                };
                let reply = store::write_async(self.store.clone(), durable, move |t| ops::write(t, &ctx, req)).await?;
                if let Some(session) = goodbye {
                    self.locks().drop_session(session);
                }
                Ok(reply)
            }
        }
    }

    fn lock_request(&self, req: MetaRequest) -> Result<MetaReply, MetaError> {
        let valid = |start: u64, end: u64| {
            if start > end {
                Err(MetaError::InvalidArgument(format!("lock range {start}..={end} is empty")))
            } else {
                Ok(())
            }
        };
        match req {
            MetaRequest::GetLock { session, lock } => {
                valid(lock.start, lock.end)?;
                Ok(MetaReply::Lock(self.locks().get(session, &lock)))
            }
            MetaRequest::SetLock { session, lock } => {
                valid(lock.start, lock.end)?;
                self.locks().set(session, &lock).map_err(|held| {
                    let kind = if held.kind == LockKind::Write { "write" } else { "read" };
                    MetaError::WouldBlock(format!(
                        "inode {} bytes {}..={} hold a {kind} lock of pid {}",
                        held.ino, held.start, held.end, held.pid
                    ))
                })?;
                Ok(MetaReply::Done)
            }
            MetaRequest::ReleaseLocks { session, ino, owner } => {
                self.locks().release(session, ino, owner);
                Ok(MetaReply::Done)
            }
            other => Err(MetaError::Internal(format!("{other:?} is not a lock request"))),
        }
    }
}

impl net::Service for MetaService {
    type Request = MetaRequest;
    type Reply = MetaResult;

    /// A session's `Welcome` binds that session to the connection it came on.
    async fn handle(self: Arc<Self>, peer: net::Peer, req: MetaRequest, _bulk: Bytes) -> (MetaResult, Bytes) {
        let result = self.answer(req).await;
        if let Ok(MetaReply::Welcome { session, .. }) = &result {
            peer.set_session(*session);
        }
        (result.map_err(Into::into), Bytes::new())
    }
}

/// Reads that touch a handful of rows, cheap enough to run on the async runtime.
fn is_point_read(req: &MetaRequest) -> bool {
    matches!(
        req,
        MetaRequest::Lookup { .. }
            | MetaRequest::GetAttr { .. }
            | MetaRequest::ReadLink { .. }
            | MetaRequest::GetXattr { .. }
            | MetaRequest::ListXattr { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::test_config;
    use proto::meta::{NewNode, SessionInfo};
    use proto::types::{Attr, Caller, ROOT_INODE};

    fn create(parent: u64, name: String) -> MetaRequest {
        MetaRequest::Create {
            parent,
            name: name.into_bytes(),
            node: NewNode::File,
            mode: 0o644,
            caller: Caller { uid: 1, gid: 1 },
            exclusive: true,
            open_by: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_over_rpc_with_concurrent_creates() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open_sqlite(&test_config(dir.path().join("meta.db"))).unwrap();
        service.spawn_background();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(net::serve(listener, service));
        let client = Arc::new(net::RpcClient::connect(&addr, 2, Duration::from_secs(30)).await.unwrap());

        let info = SessionInfo { site: "s".into(), host: "h".into(), pid: 9, purpose: "test".into() };
        let hello: MetaResult =
            client.call(&MetaRequest::Hello { protocol: proto::PROTOCOL_VERSION, session: info }).await.unwrap();
        assert!(matches!(hello, Ok(MetaReply::Welcome { heartbeat_ms: 5000, .. })), "{hello:?}");

        let made: MetaResult = client.call(&create(ROOT_INODE, "one".into())).await.unwrap();
        let Ok(MetaReply::Attr(one)) = made else { panic!("create failed: {made:?}") };
        let found: MetaResult =
            client.call(&MetaRequest::Lookup { parent: ROOT_INODE, name: b"one".to_vec() }).await.unwrap();
        assert_eq!(found, Ok(MetaReply::Attr(one)));
        let missing: MetaResult =
            client.call(&MetaRequest::Lookup { parent: ROOT_INODE, name: b"two".to_vec() }).await.unwrap();
        assert_eq!(missing.map_err(|e| e.code), Err(proto::error::ErrorCode::NotFound));

        // Many concurrent creates: the writer group-commits them.
        let tasks: Vec<_> = (0..40)
            .map(|t| {
                let client = client.clone();
                tokio::spawn(async move {
                    let mut inos = Vec::new();
                    for i in 0..25 {
                        let r: MetaResult = client.call(&create(ROOT_INODE, format!("t{t}-{i}"))).await.unwrap();
                        match r {
                            Ok(MetaReply::Attr(a)) => inos.push(a.ino),
                            other => panic!("create failed: {other:?}"),
                        }
                    }
                    inos
                })
            })
            .collect();
        let mut inos = Vec::new();
        for t in tasks {
            inos.extend(t.await.unwrap());
        }
        inos.sort();
        inos.dedup();
        assert_eq!(inos.len(), 1000);
        let root: MetaResult = client.call(&MetaRequest::GetAttr { ino: ROOT_INODE }).await.unwrap();
        let Ok(MetaReply::Attr(Attr { nlink: 2, .. })) = root else { panic!("{root:?}") };
        let listed: MetaResult =
            client.call(&MetaRequest::ReadDir { ino: ROOT_INODE, after: 0, limit: 5000 }).await.unwrap();
        let Ok(MetaReply::Entries(entries)) = listed else { panic!("{listed:?}") };
        assert_eq!(entries.len(), 1001);
    }

    /// Reports create throughput with several threads issuing requests at once, as
    /// FUSE worker threads do. Measures only; asserts nothing about speed.
    #[test]
    fn create_throughput_report() {
        let dir = tempfile::tempdir().unwrap();
        let service = MetaService::open_sqlite(&test_config(dir.path().join("meta.db"))).unwrap();
        let threads = 8;
        let per_thread = 500;
        let started = std::time::Instant::now();
        std::thread::scope(|scope| {
            for t in 0..threads {
                let service = &service;
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let r = service.handle_blocking(create(ROOT_INODE, format!("f{t}-{i}")));
                        assert!(r.is_ok(), "{r:?}");
                    }
                });
            }
        });
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "meta: {} creates from {threads} threads in {secs:.2} s = {:.0}/s",
            threads * per_thread,
            f64::from(threads * per_thread) / secs
        );
    }
}
