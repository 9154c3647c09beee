//! The shared engine above every backend: leader/follower group commit of queued
//! writes (each in its own savepoint, durable and normal ones in one queue) and a pool
//! of read connections. An async caller's read runs on its own thread (no hand-off to
//! another thread and back, which cost 40% of the stat rate when reads went to reader
//! threads): inline for a point read on a local backend, otherwise in
//! `block_in_place`, while the runtime moves that worker's other tasks elsewhere.

use crate::error::MetaError;
use crate::store::{Backend, ReadConn, TwoPhaseConn, TwoPhaseOpener, Txn, WriteConn};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;
use util::sync::{lock, try_lock, wait};

/// Most write operations put into one transaction.
const MAX_BATCH: usize = 512;

/// Times a batch runs again after the backend reported a serialization conflict
/// (another transaction, e.g. another meta's, touched the same rows).
const MAX_RETRIES: u32 = 50;

/// Conflicts after which a batch's next try runs alone among the database's writers
/// (`WriteConn::run_alone_next`): a batch whose transaction spans several round trips
/// (a meta across a WAN from its primary) would otherwise keep losing, as the SSI
/// pivot, to short transactions of another meta.
const ALONE_AFTER: u32 = 2;

/// One write operation as the engine runs it; it may run more than once, as a batch
/// that hit a serialization conflict is run again whole.
type WriteOp = Box<dyn FnMut(&mut dyn Txn) -> Result<(), MetaError> + Send>;
/// Called once a write is committed (or failed), from whichever thread committed it.
type WriteDone = Box<dyn FnOnce(Result<(), MetaError>) + Send>;

struct Job {
    durable: bool,
    op: WriteOp,
    done: WriteDone,
}

/// A metadata store: a backend's connections under the shared commit and read logic.
pub struct Store {
    cluster_id: String,
    /// The database's shared secret (`Backend::cluster_secret`).
    cluster_secret: [u8; 32],
    /// Writes waiting for the next transaction.
    queue: Mutex<Vec<Job>>,
    /// The write connection; whoever holds it commits everything queued (group commit).
    writer: Mutex<Box<dyn WriteConn>>,
    /// Read connections not in use; a reader waits on `returned` when all are taken.
    readers: Mutex<Vec<Box<dyn ReadConn>>>,
    returned: Condvar,
    /// A read connection kept for `read_foreign` (`reserve_foreign_reader`).
    foreign: Mutex<Option<Box<dyn ReadConn>>>,
    local_reads: bool,
    local_writes: bool,
    lease: Option<Arc<dyn crate::store::WriterLease>>,
    /// The epoch of the primary role this meta serves (`Backend::epoch`).
    epoch: u64,
    /// The newest epoch a node reported when it is newer than `epoch` (else 0): this
    /// meta lost the primary role and refuses every write from then on.
    superseded: AtomicU64,
    /// Opening formatted the database (`Backend::formatted`).
    formatted: bool,
    positions: Option<Arc<dyn crate::store::CommitPositions>>,
    /// Opens two-phase connections (`Backend::two_phase`), and the one kept between uses.
    two_phase: Option<TwoPhaseOpener>,
    two_phase_idle: Mutex<Option<Box<dyn TwoPhaseConn>>>,
}

impl Store {
    /// Takes over `backend`'s connections.
    pub fn new(backend: Backend) -> Result<Store, MetaError> {
        if backend.readers.is_empty() {
            return Err(MetaError::Internal("a backend needs at least one read connection".into()));
        }
        Ok(Store {
            cluster_id: backend.cluster_id,
            cluster_secret: backend.cluster_secret,
            queue: Mutex::new(Vec::new()),
            writer: Mutex::new(backend.writer),
            readers: Mutex::new(backend.readers),
            returned: Condvar::new(),
            foreign: Mutex::new(None),
            local_reads: backend.local_reads,
            local_writes: backend.local_writes,
            lease: backend.lease,
            epoch: backend.epoch,
            superseded: AtomicU64::new(0),
            formatted: backend.formatted,
            positions: backend.positions,
            two_phase: backend.two_phase,
            two_phase_idle: Mutex::new(None),
        })
    }

    /// Whether this engine can take part in a transaction spanning engines.
    pub fn has_two_phase(&self) -> bool {
        self.two_phase.is_some()
    }

    /// A connection for one part of a transaction spanning engines (`TwoPhaseConn`):
    /// the one kept from an earlier use, or a new one. Give it back with
    /// `give_back_two_phase` once its transaction is over.
    pub fn two_phase(&self) -> Result<Box<dyn TwoPhaseConn>, MetaError> {
        if let Some(conn) = lock(&self.two_phase_idle).take() {
            return Ok(conn);
        }
        match &self.two_phase {
            Some(open) => open(),
            None => Err(MetaError::CrossHome(
                "this home's engine is SQLite, which has no prepared transactions: a rename or link between \
                 homes needs every home on PostgreSQL"
                    .into(),
            )),
        }
    }

    /// Keeps `conn` (its transaction over) for the next `two_phase`.
    pub fn give_back_two_phase(&self, conn: Box<dyn TwoPhaseConn>) {
        *lock(&self.two_phase_idle) = Some(conn);
    }

    /// Where this meta's latest durable commit is in the primary's log (0 for a
    /// backend without one), to answer a `Forward` with.
    pub fn commit_position(&self) -> u64 {
        self.positions.as_ref().map_or(0, |p| p.latest())
    }

    /// Another meta committed a write for this meta's clients at `position` in the
    /// primary's log, which may have changed inodes or entries (`namespace`): see
    /// `CommitPositions::committed_elsewhere`.
    pub fn committed_elsewhere(&self, position: u64, namespace: bool) {
        if let Some(positions) = &self.positions {
            positions.committed_elsewhere(position, namespace);
        }
    }

    /// Runs `f` on a consistent snapshot, on the calling thread, with a free read
    /// connection (waiting for one if all are in use). Blocking. `f` may run more than
    /// once (see `ReadOp`).
    pub fn read<R>(&self, f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError>) -> Result<R, MetaError> {
        let mut conn = {
            let mut free = lock(&self.readers);
            loop {
                if let Some(conn) = free.pop() {
                    break conn;
                }
                free = wait(&self.returned, free);
            }
        };
        let result = read_on(&mut *conn, f);
        lock(&self.readers).push(conn);
        self.returned.notify_one();
        result
    }

    /// Takes one read connection out of the pool for `read_foreign` (when it has more
    /// than one).
    pub fn reserve_foreign_reader(&self) {
        let mut free = lock(&self.readers);
        if free.len() > 1 {
            *lock(&self.foreign) = free.pop();
        }
    }

    /// A read for an operation running in another engine (`homes`): on the reserved
    /// connection, so that two engines' operations waiting for each other's pools can
    /// never deadlock (a foreign read waits for nothing but this connection). `f` reads
    /// rows of this engine only.
    pub fn read_foreign<R>(&self, f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError>) -> Result<R, MetaError> {
        let mut reserved = lock(&self.foreign);
        match reserved.as_mut() {
            Some(conn) => read_on(&mut **conn, f),
            None => {
                drop(reserved);
                self.read(f)
            }
        }
    }

    /// Queues `op` to run in a write transaction and calls `done` once it is committed
    /// (with `durable`: on disk) or has failed. Leader/follower group commit: the caller
    /// that finds the write connection free commits everything queued, its own write
    /// included, in one transaction; callers that find it busy leave their write to the
    /// current leader. An uncontended write thus runs on the caller's thread.
    fn submit_write(&self, durable: bool, op: WriteOp, done: WriteDone) {
        lock(&self.queue).push(Job { durable, op, done });
        loop {
            let Some(mut conn) = try_lock(&self.writer) else {
                // The leader re-checks the queue after it lets go of the connection.
                return;
            };
            let batch: Vec<Job> = {
                let mut queue = lock(&self.queue);
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            // A meta that learned it lost the primary role commits nothing more.
            if self.fenced().is_err() {
                batch.into_iter().for_each(|job| (job.done)(self.fenced()));
            } else if !batch.is_empty() {
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

    /// The secret every meta over this database shares (capability keys derive from it).
    pub fn cluster_secret(&self) -> &[u8; 32] {
        &self.cluster_secret
    }

    /// The writer's lease on the primary role, if it holds one (to be renewed).
    pub fn primary_lease(&self) -> Option<Arc<dyn crate::store::WriterLease>> {
        self.lease.clone()
    }

    /// Whether opening formatted the database: the cluster is new.
    pub fn formatted(&self) -> bool {
        self.formatted
    }

    /// The epoch of the primary role this meta serves (fixed when it opened the
    /// database: a meta of an older epoch stays at it until restarted).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Takes the epoch a node has seen: a newer one than this meta's means the
    /// primary role moved on (failover) without this meta, which then refuses the
    /// node's request and every write from now on (`MetaError::Fenced`, EROFS).
    pub fn check_node_epoch(&self, node_epoch: u64) -> Result<(), MetaError> {
        if node_epoch <= self.epoch {
            return Ok(());
        }
        if self.superseded.fetch_max(node_epoch, Ordering::Relaxed) < node_epoch {
            tracing::error!(
                epoch = self.epoch,
                newer = node_epoch,
                "a node has seen a newer epoch of the primary role: this meta lost the primary role; refusing writes"
            );
        }
        self.fenced()
    }

    /// Refuses once a node reported a newer epoch than this meta's.
    fn fenced(&self) -> Result<(), MetaError> {
        match self.superseded.load(Ordering::Relaxed) {
            newer if newer > self.epoch => Err(MetaError::Fenced(format!(
                "this meta serves epoch {} of the primary role, but a node has seen epoch {newer}: the primary \
                 role moved on (failover); restart this meta with --db at the new primary",
                self.epoch
            ))),
            _ => Ok(()),
        }
    }
}

/// Opens the metadata store named by `url`: `sqlite:///path/meta.db`, a bare path, or
/// `postgres://user@host:port/database`. Without `init` the database must exist and
/// have been formatted by meta; with it, a missing or empty database is formatted with
/// a new cluster id.
/// `standby` (PostgreSQL only) names a hot standby of `url` to read from.
/// `lease` makes a PostgreSQL writer hold a lease on the primary role (SQLite has no
/// failover and ignores it).
/// `answer_timeout` (PostgreSQL only) bounds every wait for the server's answer.
pub fn open_store(
    url: &str,
    standby: Option<&str>,
    init: bool,
    lease: Option<crate::store::LeaseTerms>,
    answer_timeout: Duration,
) -> Result<Store, MetaError> {
    let path = match located(url)? {
        Located::Postgres => return Store::new(crate::postgres::open(url, standby, init, lease, answer_timeout)?),
        Located::Sqlite(path) => path,
    };
    if standby.is_some() {
        return Err(MetaError::UnsupportedUrl {
            url: url.into(),
            reason: "a standby to read from needs a PostgreSQL database".into(),
        });
    }
    Store::new(crate::sqlite::open(path, init)?)
}

/// Which backend a database URL names.
pub(crate) enum Located<'a> {
    /// A SQLite file (`sqlite://PATH`, or a bare path).
    Sqlite(&'a std::path::Path),
    /// A PostgreSQL database (`postgres://...`).
    Postgres,
}

/// The backend of `url`, refusing a scheme or form no backend takes.
pub(crate) fn located(url: &str) -> Result<Located<'_>, MetaError> {
    let unsupported = |reason: String| MetaError::UnsupportedUrl { url: url.into(), reason };
    match url.split_once("://") {
        None => Ok(Located::Sqlite(std::path::Path::new(url))),
        Some(("sqlite", path)) if !path.is_empty() => Ok(Located::Sqlite(std::path::Path::new(path))),
        Some(("sqlite", _)) => Err(unsupported("the URL names no file".into())),
        Some(("postgres" | "postgresql", _)) => Ok(Located::Postgres),
        Some((scheme, _)) => Err(unsupported(format!("unknown scheme {scheme:?}"))),
    }
}

/// Says what the database at `url` is, without changing it (`locus doctor`): its
/// server, and whether Locus formatted it and at which schema version; an error says
/// why it cannot be reached or read.
pub fn probe_database(url: &str, timeout: Duration) -> Result<String, MetaError> {
    match located(url)? {
        Located::Postgres => crate::postgres::probe(url, timeout),
        Located::Sqlite(path) => crate::sqlite::probe(path),
    }
}

/// Runs `f` on a consistent snapshot of `conn` (see `Store::read`).
fn read_on<R>(
    conn: &mut dyn ReadConn,
    mut f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError>,
) -> Result<R, MetaError> {
    let mut slot = None;
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        conn.snapshot(&mut |t| {
            slot = None;
            slot = Some(f(t)?);
            Ok(())
        })
    }));
    match ran {
        Ok(ran) => ran.and_then(|()| slot.ok_or_else(|| MetaError::Internal("read finished without a result".into()))),
        Err(_) => Err(MetaError::Internal("a metadata read panicked".into())),
    }
}

/// Runs a batch in one transaction, each op inside a savepoint, and answers each op
/// after the single commit. A serialization conflict (reported by a backend with
/// concurrent writers) anywhere in the batch rolls it back and runs it again whole,
/// after a short randomised pause, up to `MAX_RETRIES` times; from the `ALONE_AFTER`th
/// conflict on, each try runs alone among the writers (and thus does not conflict).
fn run_batch(conn: &mut dyn WriteConn, mut batch: Vec<Job>) {
    let mut attempt = 0;
    let outcome = loop {
        match try_batch(conn, &mut batch) {
            Err(e) if e.is_conflict() && attempt < MAX_RETRIES => {
                if let Err(e) = conn.rollback() {
                    tracing::warn!(error = %e, "rollback after a serialization conflict failed");
                }
                attempt += 1;
                if attempt >= ALONE_AFTER {
                    conn.run_alone_next();
                } else {
                    std::thread::sleep(backoff(attempt));
                }
            }
            outcome => break outcome,
        }
    };
    match outcome {
        Ok(results) => {
            util::crash_point!("meta-after-commit");
            for (job, result) in batch.into_iter().zip(results) {
                (job.done)(result);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, attempt, "metadata commit failed");
            if let Err(e) = conn.rollback() {
                tracing::warn!(error = %e, "rollback after a failed commit failed");
            }
            // Fencing (EROFS at the client) and a database that did not answer
            // (ETIMEDOUT) keep their kind; any other failure is internal.
            let answer = || match &e {
                MetaError::Fenced(why) => MetaError::Fenced(why.clone()),
                MetaError::TimedOut { db, after } => MetaError::TimedOut { db: db.clone(), after: *after },
                e => MetaError::Internal(format!("commit failed: {e}")),
            };
            for job in batch {
                (job.done)(Err(answer()));
            }
        }
    }
}

/// One attempt at a batch: each op's result, in order, once committed.
fn try_batch(conn: &mut dyn WriteConn, batch: &mut [Job]) -> Result<Vec<Result<(), MetaError>>, MetaError> {
    let mut results = Vec::with_capacity(batch.len());
    conn.begin(batch.iter().any(|j| j.durable))?;
    // A lone write needs no savepoint: its failure rolls back the whole transaction.
    let alone = batch.len() == 1;
    for job in batch.iter_mut() {
        if !alone {
            conn.savepoint()?;
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.op)(conn.txn())))
            .unwrap_or_else(|_| Err(MetaError::Internal("a metadata operation panicked".into())));
        match result {
            Err(e) if e.is_conflict() => return Err(e),
            Err(e) if alone => {
                conn.rollback()?;
                return Ok(vec![Err(e)]);
            }
            Err(e) => {
                conn.rollback_to_savepoint()?;
                results.push(Err(e));
            }
            Ok(()) => {
                if !alone {
                    conn.release_savepoint()?;
                }
                results.push(Ok(()));
            }
        }
    }
    util::crash_point!("meta-before-commit");
    conn.commit()?;
    Ok(results)
}

/// The pause before retry `attempt`: random within a window that doubles up to 64 ms,
/// so two writers that collided do not collide again in lockstep.
fn backoff(attempt: u32) -> std::time::Duration {
    let window_us = 1000u64 << attempt.min(6);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    std::time::Duration::from_micros(u64::from(seed) % window_us)
}

/// Typed write that calls `done` with `f`'s result once it is committed.
fn submit<R: Send + 'static>(
    store: &Store,
    durable: bool,
    mut f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
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
    f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    let (tx, rx) = mpsc::sync_channel(1);
    submit(store, durable, f, move |r| {
        let _ = tx.send(r);
    });
    rx.recv().map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// Typed write for async callers. A plain write on a local backend may commit on the
/// calling thread (it takes tens of microseconds); a durable one waits for an fsync, so
/// it is submitted from the blocking pool. A server's write (PostgreSQL) runs in
/// `block_in_place` on the caller's thread: it waits for round trips anyway, and
/// handing it to the blocking pool and its answer back cost two more thread wake-ups
/// per write (measured: 31 against 26 context switches of meta per create).
pub async fn write_async<R: Send + 'static>(
    store: Arc<Store>,
    durable: bool,
    f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if !store.local_writes
        && matches!(Handle::try_current().map(|h| h.runtime_flavor()), Ok(RuntimeFlavor::MultiThread))
    {
        return tokio::task::block_in_place(|| write(&store, durable, f));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = move |r| {
        let _ = tx.send(r);
    };
    if durable || !store.local_writes {
        tokio::task::spawn_blocking(move || submit(&store, durable, f, done));
    } else {
        submit(&store, durable, f, done);
    }
    rx.await.map_err(|_| MetaError::Internal("the store dropped a write".into()))?
}

/// A read for async callers. A point read (a few rows by key) on a backend with local
/// reads runs inline: it takes microseconds, less than moving the worker's other tasks
/// away would (measured: `block_in_place` for every read cost 15 % of the create rate).
/// Every other read runs in `block_in_place` on the caller's thread while the runtime
/// moves this worker's other tasks elsewhere; on a current-thread runtime (tests),
/// where nothing else could run anyway, inline.
pub async fn read_async<R: Send + 'static>(
    store: &Store,
    point: bool,
    f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError> + Send + 'static,
) -> Result<R, MetaError> {
    if point && store.local_reads {
        return store.read(f);
    }
    blocking_here(|| store.read(f))
}

/// Runs blocking `f` on the caller's thread: in `block_in_place` on a multi-threaded
/// runtime (its other tasks move elsewhere meanwhile), inline anywhere else (a
/// current-thread runtime of tests, where nothing else could run anyway).
pub(crate) fn blocking_here<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
