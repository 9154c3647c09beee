//! The RPC face of meta: dispatches `MetaRequest`s to the store (off the async
//! runtime) or the in-memory lock table, and expires silent sessions in the background.

use crate::error::MetaError;
use crate::locks::LockTable;
use crate::ops::{self, Access, Ctx};
use crate::sqlite::SqliteStore;
use crate::store::{self, MetaStore};
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
    heartbeat: Duration,
    session_expiry: Duration,
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
            heartbeat: config.heartbeat,
            session_expiry: config.session_expiry,
        })
    }

    /// Starts the session reaper on the current tokio runtime; it stops once the
    /// service is dropped.
    pub fn spawn_background(self: &Arc<Self>) {
        let weak: Weak<MetaService> = Arc::downgrade(self);
        let period = (self.session_expiry / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(service) = weak.upgrade() else { return };
                let result = tokio::task::spawn_blocking(move || {
                    let ctx = service.ctx();
                    service.expire_sessions_at(ctx.now_ms)
                })
                .await;
                match result {
                    Ok(Ok(expired)) if !expired.is_empty() => tracing::info!(?expired, "expired silent sessions"),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "session expiry failed"),
                    Err(e) => tracing::warn!(error = %e, "session expiry task failed"),
                }
            }
        });
    }

    fn ctx(&self) -> Ctx {
        Ctx::now(self.heartbeat.as_millis() as u64)
    }

    fn locks(&self) -> std::sync::MutexGuard<'_, LockTable> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends every session whose last heartbeat is older than `session_expiry` at
    /// `now_ms`, dropping its locks and open records. Blocking.
    pub(crate) fn expire_sessions_at(&self, now_ms: i64) -> Result<Vec<SessionId>, MetaError> {
        let cutoff = now_ms.saturating_sub(self.session_expiry.as_millis() as i64);
        let expired = store::write(&*self.store, false, move |t| ops::expire_sessions(t, cutoff))?;
        let mut locks = self.locks();
        for s in &expired {
            locks.drop_session(*s);
        }
        Ok(expired)
    }

    /// Answers one request; blocks on the store, so call it off the async runtime.
    pub(crate) fn handle_blocking(&self, req: MetaRequest) -> MetaResult {
        self.dispatch(req).map_err(Into::into)
    }

    fn dispatch(&self, req: MetaRequest) -> Result<MetaReply, MetaError> {
        let ctx = self.ctx();
        match ops::access(&req) {
            Access::Read => store::read(&*self.store, |t| ops::read(t, ctx, &req)),
            Access::Locks => self.lock_request(req),
            Access::Write { durable } => {
                let goodbye = match req {
                    MetaRequest::Goodbye { session } => Some(session),
                    _ => None,
                };
                let reply = store::write(&*self.store, durable, move |t| ops::write(t, ctx, req))?;
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

    async fn handle(self: Arc<Self>, req: MetaRequest) -> MetaResult {
        if ops::access(&req) == Access::Locks {
            return self.handle_blocking(req);
        }
        match tokio::task::spawn_blocking(move || self.handle_blocking(req)).await {
            Ok(reply) => reply,
            Err(e) => Err(MetaError::Internal(format!("request task failed: {e}")).into()),
        }
    }
}
