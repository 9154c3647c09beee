//! The shared engine above every backend: leader/follower group commit of queued
//! writes (each in its own savepoint, durable and normal ones in one queue) and a pool
//! of reader threads, so no store read ever runs on an async worker.

use crate::error::MetaError;
use crate::store::{Backend, ReadConn, Txn, WriteConn};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use util::sync::lock;

/// Most write operations put into one transaction.
const MAX_BATCH: usize = 512;

/// One write operation as the engine runs it.
type WriteOp = Box<dyn FnOnce(&mut dyn Txn) -> Result<(), MetaError> + Send>;
/// Called once a write is committed (or failed), from whichever thread committed it.
type WriteDone = Box<dyn FnOnce(Result<(), MetaError>) + Send>;
/// One read, run by a reader thread on its connection.
type ReadJob = Box<dyn FnOnce(&mut dyn ReadConn) + Send>;

struct Job {
    durable: bool,
    op: WriteOp,
    done: WriteDone,
}

/// A metadata store: a backend's connections under the shared commit and read logic.
pub struct Store {
    cluster_id: String,
    /// Writes waiting for the next transaction.
    queue: Mutex<Vec<Job>>,
    /// The write connection; whoever holds it commits everything queued (group commit).
    writer: Mutex<Box<dyn WriteConn>>,
    /// Reads waiting for a reader thread; `None` once the store shuts down.
    reads: Option<mpsc::Sender<ReadJob>>,
    readers: Vec<JoinHandle<()>>,
}

impl Store {
    /// Starts one reader thread per read connection of `backend`.
    pub fn new(backend: Backend) -> Result<Store, MetaError> {
        if backend.readers.is_empty() {
            return Err(MetaError::Internal("a backend needs at least one read connection".into()));
        }
        let (tx, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut readers = Vec::with_capacity(backend.readers.len());
        for (i, mut conn) in backend.readers.into_iter().enumerate() {
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("meta-read-{i}"))
                .spawn(move || {
                    loop {
                        // The guard is a temporary: released before the job runs.
                        let next = lock(&rx).recv();
                        let Ok(job) = next else { return };
                        let run = std::panic::AssertUnwindSafe(|| job(&mut *conn));
                        if std::panic::catch_unwind(run).is_err() {
                            tracing::error!("a metadata read panicked");
                        }
                    }
                })
                .map_err(|e| MetaError::Internal(format!("cannot start a reader thread: {e}")))?;
            readers.push(thread);
        }
        Ok(Store {
            cluster_id: backend.cluster_id,
            queue: Mutex::new(Vec::new()),
            writer: Mutex::new(backend.writer),
            reads: Some(tx),
            readers,
        })
    }

    /// Queues `op` to run in a write transaction and calls `done` once it is committed
    /// (with `durable`: on disk) or has failed. Leader/follower group commit: the caller
    /// that finds the write connection free commits everything queued, its own write
    /// included, in one transaction; callers that find it busy leave their write to the
    /// current leader. An uncontended write thus runs on the caller's thread.
    fn submit_write(&self, durable: bool, op: WriteOp, done: WriteDone) {
        lock(&self.queue).push(Job { durable, op, done });
        loop {
            let Ok(mut conn) = self.writer.try_lock() else {
                // The leader re-checks the queue after it lets go of the connection.
                return;
            };
            let batch: Vec<Job> = {
                let mut queue = lock(&self.queue);
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            if !batch.is_empty() {
                run_batch(&mut **conn, batch);
            }
            drop(conn);
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }

    /// The cluster this database belongs to, fixed when it was formatted.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    fn submit_read(&self, job: ReadJob) -> Result<(), MetaError> {
        let reads = self.reads.as_ref().ok_or_else(|| MetaError::Internal("the store is shut down".into()))?;
        reads.send(job).map_err(|_| MetaError::Internal("every reader thread has stopped".into()))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Closing the channel stops the readers once they finish what is queued.
        self.reads = None;
        for thread in self.readers.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Opens the metadata store named by `url`: `sqlite:///path/meta.db` or a bare path.
/// Without `init` the database must exist and have been formatted by meta; with it, a
/// missing or empty database is formatted with a new cluster id.
pub fn open_store(url: &str, init: bool) -> Result<Store, MetaError> {
    let unsupported = |reason: String| MetaError::UnsupportedUrl { url: url.into(), reason };
    let path = match url.split_once("://") {
        None => url,
        Some(("sqlite", path)) if !path.is_empty() => path,
        Some(("sqlite", _)) => return Err(unsupported("the URL names no file".into())),
        Some(("postgres" | "postgresql", _)) => {
            return Err(unsupported("the PostgreSQL backend is not built yet".into()));
        }
        Some((scheme, _)) => return Err(unsupported(format!("unknown scheme {scheme:?}"))),
    };
    Store::new(crate::sqlite::open(std::path::Path::new(path), init)?)
}

/// Runs a batch in one transaction, each op inside a savepoint, and answers each op
/// after the single commit.
fn run_batch(conn: &mut dyn WriteConn, batch: Vec<Job>) {
    let durable = batch.iter().any(|j| j.durable);
    let mut replies = Vec::with_capacity(batch.len());
    let outcome = (|| -> Result<(), MetaError> {
        conn.begin(durable)?;
        // A lone write needs no savepoint: its failure rolls back the whole transaction.
        let alone = batch.len() == 1;
        for job in batch {
            if !alone {
                conn.savepoint()?;
            }
            let op = job.op;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(conn.txn())))
                .unwrap_or_else(|_| Err(MetaError::Internal("a metadata operation panicked".into())));
            if alone {
                if result.is_err() {
                    conn.rollback()?;
                    replies.push((job.done, result));
                    return Ok(());
                }
            } else if result.is_err() {
                conn.rollback_to_savepoint()?;
            } else {
                conn.release_savepoint()?;
            }
            replies.push((job.done, result));
        }
        util::crash_point!("meta-before-commit");
        conn.commit()
    })();
    if let Err(e) = outcome {
        tracing::error!(error = %e, "metadata commit failed");
        if let Err(e) = conn.rollback() {
            tracing::warn!(error = %e, "rollback after a failed commit failed");
        }
        let msg = e.to_string();
        for (done, result) in replies {
            done(result.and(Err(MetaError::Internal(format!("commit failed: {msg}")))));
        }
    } else {
        util::crash_point!("meta-after-commit");
        for (done, result) in replies {
            done(result);
        }
    }
}

/// Typed write that calls `done` with `f`'s result once it is committed.
fn submit<R: Send + 'static>(
    store: &Store,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
    done: impl FnOnce(Result<R, MetaError>) + Send + 'static,
) {
    let slot = Arc::new(Mutex::new(None));
    let out = slot.clone();
    let op: WriteOp = Box::new(move |t| {
        let r = f(t)?;
        *lock(&out) = Some(r);
        Ok(())
    });
    store.submit_write(
        durable,
        op,
        Box::new(move |committed| {
            let r = lock(&slot).take();
            done(
                committed
                    .and_then(|()| r.ok_or_else(|| MetaError::Internal("write committed without a result".into()))),
            )
        }),
    );
}

/// Typed write that blocks until committed (for blocking callers).
pub fn write<R: Send + 'static>(
    store: &Store,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = mpsc::sync_channel(1);
    submit(store, durable, f, move |r| {
        let _ = tx.send(r);
    });
    rx.recv().map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// Typed write for async callers. A plain write may commit on the calling thread
/// (it takes tens of microseconds); a durable one waits for an fsync, so it is
/// submitted from the blocking pool.
pub async fn write_async<R: Send + 'static>(
    store: Arc<Store>,
    durable: bool,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = move |r| {
        let _ = tx.send(r);
    };
    if durable {
        tokio::task::spawn_blocking(move || submit(&store, durable, f, done));
    } else {
        submit(&store, durable, f, done);
    }
    rx.await.map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// Typed read on a reader thread, awaited without holding an async worker.
pub async fn read_async<R: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    store.submit_read(Box::new(move |conn| {
        let mut slot = None;
        let ran = conn.snapshot(Box::new(|t| {
            slot = Some(f(t)?);
            Ok(())
        }));
        let result =
            ran.and_then(|()| slot.ok_or_else(|| MetaError::Internal("read finished without a result".into())));
        let _ = tx.send(result);
    }))?;
    rx.await.map_err(|_| MetaError::Internal("the store dropped a read".into()))?
}
