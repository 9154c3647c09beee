//! The PostgreSQL backend: one write connection and a few read connections to a
//! PostgreSQL database (the shared `engine` group-commits on the writer and lends the
//! readers to callers), each with its own cache of prepared statements.
//!
//! Isolation: writes run SERIALIZABLE, reads REPEATABLE READ READ ONLY (a snapshot;
//! a read of one statement runs it alone, which is a snapshot too).
//! The POSIX rules in `ops` were written for a single writer that sees a serial
//! history (SQLite); SERIALIZABLE keeps that true when several metas write to one
//! database, without adding row locks to every op: a create racing an rmdir, two
//! creates of one name, or two renames through one directory all end with one
//! transaction failing with a serialization conflict (40001), which the engine runs
//! again whole (`MetaError::Conflict`). REPEATABLE READ with explicit `FOR UPDATE`
//! locks would need every read-then-write in `ops` to lock, and would still miss
//! predicates (an empty-directory check against a concurrent insert). Ids come from
//! sequences, so two metas never contend on a counter row.
//!
//! Each connection is driven on the thread that waits for it (`pgwire`), so it may be
//! used from anywhere, meta's async workers included: a server on this machine gets
//! its point reads run inline there (`Backend::local_reads`); writes, and every read
//! of a server elsewhere, run off the workers.

use crate::error::MetaError;
use crate::locks::Held;
use crate::pgwire::{Step, Wire, waiting};
use crate::shared_rows::{SharedRows, Written};
use crate::sqlite::{
    SCHEMA_VERSION, chunk_id, kind_code, kind_of, new_cluster_id, off, policy_of, random_bytes, root_inode, secret_of,
};
use crate::store::{
    Backend, Counter, DentryRow, Inode, OpenRow, Prefetch, ReadConn, ReadOp, SessionRow, Txn, WriteConn,
    drop_open_read, split_mode_column,
};
use postgres::types::ToSql;
use postgres::{Row, SimpleQueryMessage, Statement};
use proto::meta::{SessionInfo, StoredChunk};
use proto::policy::Policy;
use proto::types::{Attr, ChunkId, ChunkRecord, Extent, FileKind, InodeId, NodeInfo, ROOT_INODE, SessionId, Timestamp};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio_postgres::Config;
use util::sync::lock;

/// Read connections: each read holds one for its round trips to the server.
const READERS: usize = 8;

/// How long connecting may take before meta gives up with an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The advisory lock every write transaction of every meta takes shared at its commit,
/// in the statement that checks the epoch (`PgConn::commit_gate`; no round trip of its own); a
/// transaction that kept losing serialization conflicts (`WriteConn::run_alone_next`)
/// takes it exclusively at session level before its BEGIN, so that no other writer
/// commits from its snapshot to its own commit: with nobody committing beside it, it
/// cannot lose a serialization conflict. PostgreSQL queues later shared requests behind
/// a waiting exclusive one, so it waits only for the commits already under way. (A
/// writer waiting at its commit for the lone one while the lone one waits for a row it
/// wrote is a deadlock PostgreSQL detects; the loser retries like any conflict.)
macro_rules! writers_lock {
    () => {
        "7483620001"
    };
}

/// The advisory lock held shared by the writer session of every meta that keeps rows in
/// memory, and tried exclusively by every commit that changed inodes or entries: the
/// try fails exactly when another meta keeps rows, and then the commit notifies
/// `kept_rows_channel` of what it changed (`shared_rows`).
macro_rules! kept_rows_lock {
    () => {
        7483620002
    };
}
pub(crate) const KEPT_ROWS_LOCK: i64 = kept_rows_lock!();

/// The channel of those notifications.
macro_rules! kept_rows_channel {
    () => {
        "locus_rows"
    };
}
pub(crate) const KEPT_ROWS_CHANNEL: &str = kept_rows_channel!();

/// Notifies the payloads in parameter `$n` (a text array) if another meta keeps rows;
/// a column of the statement sent ahead of a COMMIT.
macro_rules! notify_keepers {
    ($n:literal) => {
        concat!(
            "(SELECT count(pg_notify('",
            kept_rows_channel!(),
            "', p)) FROM unnest($",
            $n,
            "::text[]) p WHERE NOT pg_try_advisory_xact_lock(",
            kept_rows_lock!(),
            "))"
        )
    };
}

/// How long asking the server to cancel an abandoned request may take (it is local to
/// the meta that abandons it; past this, the connection is dropped all the same).
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// The schema of `sqlite.rs` in PostgreSQL's types (BIGINT for every integer, BYTEA
/// for blobs), with sequences for the ids.
pub(crate) const SCHEMA: &str = "
CREATE TABLE meta_version (version BIGINT NOT NULL);
CREATE TABLE cluster (id TEXT NOT NULL, secret BYTEA);
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO counters (name, value) VALUES ('syncs', 0);
CREATE SEQUENCE next_inode START WITH 2;
CREATE SEQUENCE next_cookie START WITH 1;
CREATE SEQUENCE next_session START WITH 1;
CREATE TABLE inodes (
    ino BIGINT PRIMARY KEY, kind BIGINT NOT NULL, mode BIGINT NOT NULL,
    uid BIGINT NOT NULL, gid BIGINT NOT NULL, size BIGINT NOT NULL, nlink BIGINT NOT NULL,
    rdev BIGINT NOT NULL, atime_s BIGINT NOT NULL, atime_ns BIGINT NOT NULL,
    mtime_s BIGINT NOT NULL, mtime_ns BIGINT NOT NULL, ctime_s BIGINT NOT NULL,
    ctime_ns BIGINT NOT NULL, data_version BIGINT NOT NULL, parent BIGINT NOT NULL,
    target BYTEA NOT NULL);
CREATE INDEX inodes_orphaned ON inodes (ino) WHERE nlink = 0;
CREATE TABLE dentries (
    parent BIGINT NOT NULL, name BYTEA NOT NULL, ino BIGINT NOT NULL, cookie BIGINT NOT NULL,
    PRIMARY KEY (parent, name));
CREATE UNIQUE INDEX dentries_by_cookie ON dentries (parent, cookie);
CREATE TABLE extents (
    ino BIGINT NOT NULL, file_offset BIGINT NOT NULL, len BIGINT NOT NULL,
    chunk BYTEA NOT NULL, chunk_offset BIGINT NOT NULL, PRIMARY KEY (ino, file_offset));
CREATE TABLE chunks (id BYTEA PRIMARY KEY, size BIGINT NOT NULL, refcount BIGINT NOT NULL);
CREATE TABLE chunk_nodes (
    chunk BYTEA NOT NULL, node TEXT NOT NULL, cached BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (chunk, node));
CREATE TABLE xattrs (
    ino BIGINT NOT NULL, name BYTEA NOT NULL, value BYTEA NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE sessions (
    id BIGINT PRIMARY KEY, site TEXT NOT NULL, host TEXT NOT NULL, pid BIGINT NOT NULL,
    purpose TEXT NOT NULL, last_seen BIGINT NOT NULL, owner TEXT);
CREATE TABLE nodes (
    id TEXT PRIMARY KEY, store_id TEXT NOT NULL, site TEXT NOT NULL, addr TEXT NOT NULL, capacity BIGINT NOT NULL,
    used BIGINT NOT NULL, chunk_count BIGINT NOT NULL, cache_bytes BIGINT NOT NULL, last_seen BIGINT NOT NULL);
CREATE TABLE site_rtts (
    from_site TEXT NOT NULL, to_site TEXT NOT NULL, micros BIGINT NOT NULL, PRIMARY KEY (from_site, to_site));
CREATE TABLE opens (
    session BIGINT NOT NULL, ino BIGINT NOT NULL, count BIGINT NOT NULL, writable BIGINT NOT NULL,
    PRIMARY KEY (session, ino));
CREATE INDEX opens_by_ino ON opens (ino);
CREATE TABLE locks (
    ino BIGINT NOT NULL, session BIGINT NOT NULL, owner BIGINT NOT NULL, range_start BIGINT NOT NULL,
    range_end BIGINT NOT NULL, is_write BIGINT NOT NULL, pid BIGINT NOT NULL);
CREATE INDEX locks_by_ino ON locks (ino);
CREATE INDEX locks_by_session ON locks (session);
CREATE TABLE policies (
    ino BIGINT PRIMARY KEY, sites TEXT NOT NULL, copies BIGINT NOT NULL, mode TEXT NOT NULL,
    rpo_secs BIGINT NOT NULL);
CREATE TABLE drained_nodes (id TEXT PRIMARY KEY);
CREATE TABLE node_admissions (id TEXT PRIMARY KEY, admitted BIGINT NOT NULL);
CREATE TABLE join_tokens (hash BYTEA PRIMARY KEY, expires BIGINT NOT NULL);
CREATE TABLE primary_epoch (epoch BIGINT NOT NULL);
INSERT INTO primary_epoch (epoch) VALUES (1);
CREATE TABLE primary_leases (holder TEXT PRIMARY KEY, epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL);
CREATE FUNCTION locus_fence(expected BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT epoch FROM primary_epoch) IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'locus: the primary role moved on past epoch %', expected USING ERRCODE = 'LF001';
    END IF;
END $$;
CREATE TABLE principals (id BIGINT PRIMARY KEY, name TEXT NOT NULL UNIQUE);
";

/// One connection to the server with its prepared statements.
pub(crate) struct PgConn {
    /// The connection, driven on the calling thread (`pgwire`).
    wire: Option<Wire>,
    /// How to connect again once the server closed the connection (restart, failover,
    /// an administrator's pg_terminate_backend), and the URL without password.
    config: Config,
    shown: String,
    /// Session settings run again on every new connection (the writer's
    /// `synchronous_commit=off`).
    setup: &'static str,
    /// Statements prepared on this connection, by their SQL text.
    statements: HashMap<&'static str, Statement>,
    /// A transaction is open (begun, perhaps not yet used). Each transaction ends with
    /// its COMMIT or ROLLBACK and the next BEGIN in one round trip: PostgreSQL takes a
    /// transaction's snapshot only at its first query, so a begun but unused one holds
    /// nothing back (it shows as "idle in transaction").
    begun: bool,
    /// The open write transaction must be on disk when its commit returns.
    durable: bool,
    /// The writer of a meta that reads from a hot standby publishes each commit's
    /// WAL position here (`StandbyReader` waits for the standby to replay it).
    committed: Option<Arc<AtomicU64>>,
    /// A savepoint was released but the RELEASE not sent yet: it goes with the next
    /// SAVEPOINT (COMMIT and ROLLBACK make it moot), saving a round trip per op.
    release_pending: bool,
    /// The writer of a meta holding the primary role's lease: each commit checks the
    /// lease is still held and, in the same transaction, that the epoch is unchanged.
    fence: Option<Arc<PrimaryLease>>,
    /// Writes whose answer no op waits for, sent ahead of the next statement that
    /// has one (or the commit) in the same round trip. A failure among them fails
    /// that statement, inside the same op or commit, so errors keep their meaning.
    deferred: Vec<Deferred>,
    /// Rows the open transaction has read or written (see `Seen`).
    seen: Seen,
    /// A read connection's view of the rows its meta keeps in memory: reads are
    /// answered from them and what a read finds is kept there (`shared_rows`).
    cache: Option<Arc<SharedRows>>,
    /// The writer's: what it commits replaces the rows kept there, and is notified
    /// to other metas.
    publish: Option<Arc<SharedRows>>,
    /// What the open write transaction changed (with `publish`).
    written: Written,
    /// The keys the open write transaction took from the kept rows (`assume_entry`).
    assumed: Written,
    /// The open write transaction may take rows from the kept ones (`distrust`).
    trust_kept: bool,
    /// A guard failed: write transactions read everything from the server until one
    /// commits, so that the tries of a batch whose file is open, say, stop guessing.
    distrust: bool,
    /// When the writer last tried to take the kept-rows lock (`take_kept_rows_lock`).
    lock_tried: Option<Instant>,
    /// Since when every try of the kept-rows lock failed, and whether that was logged.
    lock_missed: Option<(Instant, bool)>,
    /// Ids taken from a sequence ahead of need, per counter (see `next_id`).
    ids: HashMap<&'static str, Vec<i64>>,
    /// A read's first try, outside any transaction (see `ReadConn::snapshot`).
    probe: Probe,
    /// A BEGIN to send ahead of the next statement, in the same round trip.
    begin_pending: Option<&'static str>,
    /// A request sent through tokio-postgres failed: the server flushes an error at
    /// once and the ReadyForQuery after it may still be on its way, so the next
    /// pipeline also goes through tokio-postgres (which knows to skip it), not by hand.
    failed_unread: bool,
    /// How long a request may wait for its answer before it is cancelled and fails
    /// (`--db-timeout`); none for an operator's command (`promote`, `migrate`).
    answer_timeout: Option<Duration>,
    /// The next write transaction runs alone among the writers (`run_alone_next`).
    alone_next: bool,
    /// This session holds the writers' lock exclusively (see `writers_lock`); the
    /// end of its transaction releases it.
    alone: bool,
}

/// Where a read's try without a transaction stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// Not trying: statements run in the open transaction, if any.
    Off,
    /// Trying: the next statement runs alone (its own snapshot).
    Ready,
    /// The one statement ran.
    Used,
    /// The read wanted a second statement: it must run again in a snapshot.
    Overflowed,
}

/// A parameter of a deferred write, owned until the write is sent.
type Owned = Box<dyn ToSql + Sync + Send>;

/// A deferred write: its SQL, as prepared by tokio-postgres (for its parameters'
/// types), and its parameters.
type Deferred = (&'static str, Statement, Vec<Owned>);

/// Rows as the open transaction sees them, so that an op reading a row twice (a
/// directory checked, then stamped; a new inode read back) asks the server once. A
/// snapshot (REPEATABLE READ or SERIALIZABLE) shows a transaction the same rows until
/// it writes them itself, and its writes go through here too; everything is
/// forgotten at every transaction or savepoint boundary.
#[derive(Default)]
struct Seen {
    inodes: HashMap<InodeId, Option<Inode>>,
    dentries: HashMap<(InodeId, Vec<u8>), Option<InodeId>>,
    policies: HashMap<InodeId, Option<Policy>>,
    /// Opens of an inode across all sessions.
    open_counts: HashMap<InodeId, u64>,
    /// One session's opens of an inode.
    opens: HashMap<(SessionId, InodeId), OpenRow>,
    sessions: HashMap<SessionId, Option<SessionRow>>,
    /// Extents of an inode, known for a span of it (see `KnownExtents`).
    extents: HashMap<InodeId, KnownExtents>,
    /// No directory has a policy (read so along with an entry or an open): every
    /// policy lookup answers none without asking.
    no_policies: bool,
    /// Inodes known to have no extended attributes (read so with their entry, or new):
    /// deleting them all is then nothing to send.
    no_xattrs: HashSet<InodeId>,
    /// Inodes known to have no extents: read so with their entry, or numbered in this
    /// transaction from this meta's own block of ids, so no other row can name them
    /// yet (such an inode also starts with no opens and no policy in the maps above).
    no_extents: HashSet<InodeId>,
}

/// Every extent of an inode that intersects `[start, end)`, as the open transaction
/// sees them: kept so as the transaction inserts and deletes extents, so that a write
/// of several extents over one span reads them once.
struct KnownExtents {
    start: u64,
    end: u64,
    /// In offset order.
    extents: Vec<Extent>,
}

impl KnownExtents {
    /// The known extents that intersect `[start, end)`, if the span is known.
    fn within(&self, start: u64, end: u64) -> Option<Vec<Extent>> {
        (self.start <= start && end <= self.end).then(|| {
            let intersects = |e: &&Extent| e.file_offset < end && e.end() > start;
            self.extents.iter().filter(intersects).cloned().collect()
        })
    }
}

/// What the statement at the end of a pipeline asks for.
enum Last<'a> {
    Rows(&'a Statement, Params<'a>),
    Count(&'a Statement, Params<'a>),
    Batch(&'a str),
    Simple(&'a str),
    /// One statement without parameters that answers no rows wanted: a transaction
    /// or savepoint boundary.
    Boundary(&'static str),
}

/// Its answer.
enum Answer {
    Rows(Vec<Row>),
    Count(u64),
    Simple(Vec<SimpleQueryMessage>),
}

type Pending<'a> = Pin<Box<dyn Future<Output = Result<Answer, postgres::Error>> + 'a>>;

/// Polls every future in order until all are done: each request is queued on the
/// connection before the next one's, so all go out together and are answered in order.
async fn in_order(mut futures: Vec<Pending<'_>>) -> Vec<Result<Answer, postgres::Error>> {
    let mut out: Vec<Option<Result<Answer, postgres::Error>>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(r) => *slot = Some(r),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// How a write transaction begins: see the module's note on isolation.
macro_rules! begin_write {
    () => {
        "BEGIN ISOLATION LEVEL SERIALIZABLE"
    };
}

/// How a read begins: a consistent snapshot that never conflicts.
macro_rules! begin_read {
    () => {
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    };
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The instant a wait for the server gives up at, asked again after every wake-up
/// (`PgConn::wait_limit`).
type WaitLimit = Box<dyn Fn() -> Instant>;

impl PgConn {
    /// The connection; none after a wait was abandoned (`abandon`) until the next
    /// transaction connects again.
    fn wire(&mut self) -> Result<&mut Wire, MetaError> {
        let shown = &self.shown;
        self.wire.as_mut().ok_or_else(|| {
            MetaError::Internal(format!("the connection to {shown} was dropped; the next transaction reconnects"))
        })
    }

    fn statement(&mut self, sql: &'static str) -> Result<Statement, MetaError> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.prepare_dynamic(sql)?;
        self.statements.insert(sql, st.clone());
        Ok(st)
    }

    /// Sends the deferred writes and then `last` in one round trip and waits for
    /// all their answers; the first failure in order is the result.
    fn pipeline(&mut self, last: Last<'_>) -> Result<Answer, MetaError> {
        Ok(self.pipeline_all(vec![last])?.pop().expect("one request, one answer"))
    }

    /// Sends the deferred writes and then every request of `lasts` in one round trip
    /// and waits for all their answers (those of `lasts`, in order); the first failure
    /// in order is the result.
    fn pipeline_all(&mut self, lasts: Vec<Last<'_>>) -> Result<Vec<Answer>, MetaError> {
        let answered = self.send_all(lasts);
        if let Err(e) = &answered
            && e.is_conflict()
            && !self.assumed.is_empty()
        {
            // Perhaps a guard failed: the rows assumed are dropped, and the next tries
            // read everything from the server until one commits (a guard may also fail
            // on a fact the kept rows do not hold, such as an open, as a next one would).
            tracing::debug!(error = %e, "a transaction that took rows from memory failed: the next tries read them");
            self.distrust = true;
            if let Some(publish) = &self.publish {
                publish.forget(&std::mem::take(&mut self.assumed));
            }
        }
        answered
    }

    /// `pipeline_all`'s work.
    fn send_all(&mut self, lasts: Vec<Last<'_>>) -> Result<Vec<Answer>, MetaError> {
        match self.probe {
            Probe::Off => {}
            // Several statements are several snapshots: a read needing them runs in one.
            Probe::Ready if lasts.len() == 1 => self.probe = Probe::Used,
            Probe::Ready | Probe::Used | Probe::Overflowed => {
                self.probe = Probe::Overflowed;
                return Err(MetaError::Internal("a read of several statements runs again in a snapshot".into()));
            }
        }
        let deferred = std::mem::take(&mut self.deferred);
        tracing::trace!(target: "meta::postgres::wire", deferred = deferred.len(), "round trip");
        let until = self.wait_limit();
        if self.begin_pending.is_none() && !self.failed_unread && lasts.iter().all(|l| matches!(l, Last::Boundary(_))) {
            return self.pipeline_by_hand(&deferred, lasts, until);
        }
        let begin = self.begin_pending.take();
        let Wire { client, driver } = self.wire()?;
        let client = &*client;
        let begin = begin.map(|sql| -> Pending<'_> {
            Box::pin(async move { client.batch_execute(sql).await.map(|()| Answer::Count(0)) })
        });
        let mut requests: Vec<Pending<'_>> = begin
            .into_iter()
            .chain(deferred.iter().map(|(_, st, params)| -> Pending<'_> {
                let params = params.iter().map(|p| &**p as &(dyn ToSql + Sync));
                Box::pin(async move { client.execute_raw(st, params).await.map(Answer::Count) })
            }))
            .collect();
        let asked = lasts.len();
        requests.extend(lasts.into_iter().map(|last| -> Pending<'_> {
            match last {
                Last::Rows(st, params) => Box::pin(async move { client.query(st, params).await.map(Answer::Rows) }),
                Last::Count(st, params) => Box::pin(async move { client.execute(st, params).await.map(Answer::Count) }),
                Last::Batch(sql) | Last::Boundary(sql) => {
                    Box::pin(async move { client.batch_execute(sql).await.map(|()| Answer::Count(0)) })
                }
                Last::Simple(sql) => Box::pin(async move { client.simple_query(sql).await.map(Answer::Simple) }),
            }
        }));
        let Some(mut answers) = driver.block_on_until(in_order(requests), until.as_deref())? else {
            return Err(self.abandon());
        };
        self.failed_unread = answers.iter().any(Result::is_err);
        let lasts = answers.split_off(answers.len() - asked);
        answers.into_iter().try_for_each(|a| a.map(drop))?;
        Ok(lasts.into_iter().collect::<Result<Vec<_>, _>>()?)
    }

    /// As `pipeline_all` for writes that answer counts only (a commit: the deferred
    /// writes, the commit gate, COMMIT and the next BEGIN), all answered in one flush
    /// (`Driver::send_prepared`).
    fn pipeline_by_hand(
        &mut self,
        deferred: &[Deferred],
        lasts: Vec<Last<'_>>,
        until: Option<WaitLimit>,
    ) -> Result<Vec<Answer>, MetaError> {
        let written = deferred.iter().map(|(sql, st, params)| Step {
            sql,
            types: st.params(),
            params: params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect(),
        });
        let boundaries = lasts.iter().map(|last| match last {
            Last::Boundary(sql) => Step { sql, types: &[], params: Vec::new() },
            _ => unreachable!("only boundaries go by hand"),
        });
        let steps: Vec<Step<'_>> = written.chain(boundaries).collect();
        let Wire { driver, .. } = self.wire()?;
        let sent = driver.send_prepared(&steps, until.as_deref());
        let Some(answered) = sent.map_err(waiting)? else {
            return Err(self.abandon());
        };
        let mut counts = answered?;
        Ok(counts.split_off(counts.len() - lasts.len()).into_iter().map(Answer::Count).collect())
    }

    /// Queues a write whose answer nothing waits for (see `deferred`).
    fn defer(&mut self, sql: &'static str, params: Vec<Owned>) -> Result<(), MetaError> {
        let st = self.statement(sql)?;
        self.deferred.push((sql, st, params));
        Ok(())
    }

    /// Runs every query of `queries` in one round trip; their rows in order.
    fn query_all(&mut self, queries: &[(&'static str, Params<'_>)]) -> Result<Vec<Vec<Row>>, MetaError> {
        let statements = queries.iter().map(|(sql, _)| self.statement(sql)).collect::<Result<Vec<_>, _>>()?;
        let lasts = statements.iter().zip(queries).map(|(st, (_, params))| Last::Rows(st, params)).collect();
        self.pipeline_all(lasts)?
            .into_iter()
            .map(|a| match a {
                Answer::Rows(rows) => Ok(rows),
                _ => unreachable!("a query answers rows"),
            })
            .collect()
    }

    fn query(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>, MetaError> {
        let st = self.statement(sql)?;
        match self.pipeline(Last::Rows(&st, params))? {
            Answer::Rows(rows) => Ok(rows),
            _ => unreachable!("a query answers rows"),
        }
    }

    fn opt(&mut self, sql: &'static str, params: Params<'_>) -> Result<Option<Row>, MetaError> {
        at_most_one(self.query(sql, params)?, sql)
    }

    fn one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, MetaError> {
        self.opt(sql, params)?.ok_or_else(|| MetaError::Corrupt(format!("no row where one was expected: {sql}")))
    }

    fn exec(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, MetaError> {
        let st = self.statement(sql)?;
        match self.pipeline(Last::Count(&st, params))? {
            Answer::Count(n) => Ok(n),
            _ => unreachable!("an execute answers a count"),
        }
    }

    /// Runs statements without parameters in one round trip (after the deferred
    /// writes). Every transaction or savepoint boundary goes through here, so it
    /// forgets the rows seen.
    pub(crate) fn batch(&mut self, sql: &str) -> Result<(), MetaError> {
        self.seen = Seen::default();
        self.pipeline(Last::Batch(sql)).map(drop)
    }

    /// As `batch` for a write transaction's boundaries, one statement each, answered
    /// with the deferred writes in one flush (`pipeline_by_hand`).
    fn boundary(&mut self, statements: &[&'static str]) -> Result<(), MetaError> {
        self.seen = Seen::default();
        self.pipeline_all(statements.iter().map(|sql| Last::Boundary(sql)).collect()).map(drop)
    }

    /// Records what a row read for entry (`parent`, `name`) holds from column `at`
    /// on: the entry's inode number (NULL: no such entry), the inode's columns, its
    /// open count and whether it has extents, xattrs and a policy; answers the inode
    /// number.
    fn entry_seen(
        &mut self,
        parent: InodeId,
        name: &[u8],
        row: Option<&Row>,
        at: usize,
    ) -> Result<Option<InodeId>, MetaError> {
        let ino = match row {
            Some(row) => row.try_get::<_, Option<i64>>(at)?.map(|v| v as u64),
            None => None,
        };
        self.seen.dentries.insert((parent, name.to_vec()), ino);
        if let (Some(row), Some(ino)) = (row, ino) {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(ino) {
                let inode = match row.try_get::<_, Option<i64>>(at + 1)? {
                    Some(_) => Some(inode_of(row, at + 1)?),
                    None => None,
                };
                slot.insert(inode);
            }
            // NULL: the statement did not ask (`ENTRY_READ_SQL`).
            if let Some(opens) = row.try_get::<_, Option<i64>>(at + 18)? {
                self.seen.open_counts.entry(ino).or_insert(opens as u64);
            }
            let absent = |i: usize| row.try_get::<_, Option<bool>>(at + i).map(|v| v == Some(false));
            if absent(19)? {
                self.seen.no_extents.insert(ino);
            }
            if absent(20)? {
                self.seen.no_xattrs.insert(ino);
            }
            if absent(21)? {
                self.seen.policies.entry(ino).or_insert(None);
            }
        }
        Ok(ino)
    }

    /// A write transaction's look-up of entry (`parent`, `name`), taken from the rows
    /// its meta keeps instead of the server when they hold the directory, the entry
    /// and its inode, an empty non-directory that this transaction has not written:
    /// what an unlink of a file just created, listed or looked up needs. It is assumed
    /// not open and without extents, xattrs or policy, and `ENTRY_GUARD_SQL`, queued
    /// ahead of the transaction's writes, checks all of it at the server. So the write
    /// needs no round trip before its commit; if the guard fails, the transaction runs
    /// again reading from the server (`pipeline_all`).
    fn assume_entry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        let Some(kept) = self.publish.clone().filter(|_| self.trust_kept) else { return Ok(()) };
        let key = (parent, name.to_vec());
        if self.seen.dentries.contains_key(&key) || self.written.entries.contains_key(&key) {
            return Ok(());
        }
        let Some((dir, file)) =
            self.kept_untouched(parent).zip(kept.entry(parent, name).and_then(|ino| self.kept_untouched(ino)))
        else {
            return Ok(());
        };
        let ino = file.attr.ino;
        if dir.attr.kind != FileKind::Dir || file.attr.kind == FileKind::Dir || file.attr.size != 0 {
            return Ok(());
        }
        let mut params = inode_params(&dir);
        params.extend(inode_params(&file));
        params.push(Box::new(name.to_vec()));
        self.defer(ENTRY_GUARD_SQL, params)?;
        self.assume_inode(dir);
        self.assume_inode(file);
        self.assumed.entries.insert(key.clone(), None);
        self.seen.dentries.insert(key, Some(ino));
        self.seen.open_counts.insert(ino, 0);
        self.seen.no_extents.insert(ino);
        self.seen.no_xattrs.insert(ino);
        self.seen.policies.insert(ino, None);
        Ok(())
    }

    /// Inode `ino` as the writer's meta keeps it, if write transactions may take rows
    /// from there (`trust_kept`) and this one has neither read nor written it.
    fn kept_untouched(&self, ino: InodeId) -> Option<Inode> {
        let kept = self.publish.as_ref().filter(|_| self.trust_kept)?;
        if self.seen.inodes.contains_key(&ino) || self.written.inodes.contains_key(&ino) {
            return None;
        }
        kept.inode(ino)
    }

    /// Takes `inode` from the kept rows as this transaction's view of it (a guard
    /// queued ahead checks it at the server); dropped from them if the guard fails.
    fn assume_inode(&mut self, inode: Inode) {
        self.assumed.inodes.insert(inode.attr.ino, None);
        self.seen.inodes.insert(inode.attr.ino, Some(inode));
    }

    /// A write of data (`Prefetch::writing`) over `[start, end)` of inode `ino` through
    /// `session`'s open, taken from the kept rows instead of the server when they hold
    /// the inode, a file no longer than `start` (an append, or the first write of a new
    /// file): the session is assumed to have it open once, for writing, and no extent to
    /// intersect the span, and `DATA_WRITE_GUARD_SQL` checks that and the inode at the
    /// server, as `assume_entry`'s guard does.
    fn assume_data_write(&mut self, session: SessionId, ino: InodeId, start: u64, end: u64) -> Result<(), MetaError> {
        if self.seen.opens.contains_key(&(session, ino)) || self.seen.extents.contains_key(&ino) {
            return Ok(());
        }
        let Some(file) = self.kept_untouched(ino) else { return Ok(()) };
        if file.attr.kind != FileKind::File || file.attr.size > start {
            return Ok(());
        }
        let mut params = inode_params(&file);
        params.extend::<[Owned; 3]>([Box::new(session as i64), Box::new(off(start)), Box::new(off(end))]);
        self.defer(DATA_WRITE_GUARD_SQL, params)?;
        self.assume_inode(file);
        self.seen.opens.insert((session, ino), OpenRow { count: 1, writable: true });
        self.seen.extents.insert(ino, KnownExtents { start, end, extents: Vec::new() });
        Ok(())
    }

    /// Records whether any policy exists, as column `at` of `row` says (NULL: not asked).
    fn policies_exist_seen(&mut self, row: &Row, at: usize) -> Result<(), MetaError> {
        if row.try_get::<_, Option<bool>>(at)? == Some(false) {
            self.seen.no_policies = true;
        }
        Ok(())
    }

    fn chunk_record(&mut self, id: &ChunkId, size: i64, refcount: i64) -> Result<ChunkRecord, MetaError> {
        let rows = self.query("SELECT node, cached FROM chunk_nodes WHERE chunk = $1 ORDER BY node", &[&&id.0[..]])?;
        let (mut nodes, mut cached) = (Vec::with_capacity(rows.len()), Vec::new());
        for row in &rows {
            let node: String = row.try_get(0)?;
            if row.try_get::<_, i64>(1)? != 0 {
                cached.push(node.clone());
            }
            nodes.push(node);
        }
        Ok(ChunkRecord { id: *id, size: size as u64, refcount: refcount.max(0) as u64, nodes, cached })
    }
}

impl PgConn {
    /// Opens a transaction unless the last one's end already did.
    /// A transaction starting on a connection the server has closed connects again
    /// first: the request that found it broken failed, the next ones work.
    fn ensure_begun(&mut self, begin: &'static str) -> Result<(), MetaError> {
        self.reconnect_if_closed()?;
        if !self.begun {
            self.boundary(&[begin])?;
            self.begun = true;
        }
        Ok(())
    }

    fn reconnect_if_closed(&mut self) -> Result<(), MetaError> {
        if self.wire.as_ref().is_none_or(Wire::is_closed) {
            tracing::warn!(db = %self.shown, "the PostgreSQL connection was closed; connecting again");
            self.session_lost();
            self.wire = Some(Wire::connect(&self.config, &self.shown)?);
            self.statements.clear();
            self.deferred.clear();
            self.begun = false;
            self.begin_pending = None;
            self.failed_unread = false;
            self.release_pending = false;
            self.alone = false;
            self.batch(self.setup)?;
        }
        Ok(())
    }

    /// Ends the open transaction with `end` (COMMIT or ROLLBACK, with the next BEGIN
    /// in the same round trip). A failed end leaves no transaction open.
    fn end(&mut self, end: &[&'static str]) -> Result<(), MetaError> {
        self.begun = false;
        self.release_pending = false;
        if self.wire.is_none() {
            // Abandoned: the server ended the transaction with the connection.
            return Ok(());
        }
        if self.alone {
            // Released after the end, in the same round trip; the next BEGIN cannot
            // ride along after a query, so it goes with the next transaction's start.
            let end = end.strip_suffix(&[begin_write!()]).unwrap_or(end);
            self.boundary(&[end, &[concat!("SELECT pg_advisory_unlock(", writers_lock!(), ")")]].concat())?;
            self.alone = false;
            return Ok(());
        }
        self.boundary(end)?;
        self.begun = true;
        Ok(())
    }

    /// When a wait for the server gives up (`abandon`): once the lease runs out (it
    /// moves later as renewals succeed) or `answer_timeout` from now, whichever is
    /// first; none without either.
    fn wait_limit(&self) -> Option<WaitLimit> {
        let lease = self.fence.clone();
        let limit = self.answer_timeout.map(|t| Instant::now() + t);
        match (lease, limit) {
            (None, None) => None,
            (None, Some(limit)) => Some(Box::new(move || limit)),
            (Some(lease), None) => Some(Box::new(move || lease.valid_until())),
            (Some(lease), Some(limit)) => Some(Box::new(move || lease.valid_until().min(limit))),
        }
    }

    /// Gives up a request that waited past `wait_limit`: asks the server to cancel it,
    /// drops the connection, and answers why. The next transaction connects again.
    /// If the lease ran out (a COMMIT waiting for a cut-off synchronous standby's
    /// flush, or a statement waiting behind one), that is a refusal: a cancelled COMMIT
    /// stays committed locally, in a database the failover discards, and is never
    /// acknowledged; writes are refused while the lease stays lapsed. Otherwise the
    /// server did not answer in `answer_timeout` (stopped, overloaded, or behind a dead
    /// link): the request fails, and a write's outcome is unknown, as after any timeout.
    fn abandon(&mut self) -> MetaError {
        if let Some(wire) = self.wire.take()
            && let Err(e) = wire.cancel(&self.config, CANCEL_TIMEOUT)
        {
            tracing::warn!(db = %self.shown, error = %e, "could not cancel the abandoned request; dropping its connection");
        }
        self.session_lost();
        self.statements.clear();
        self.deferred.clear();
        self.begun = false;
        self.failed_unread = false;
        self.release_pending = false;
        self.alone = false;
        self.seen = Seen::default();
        if let Some(publish) = &self.publish {
            publish.forget(&std::mem::take(&mut self.written));
        }
        let lapsed = self.fence.as_ref().is_some_and(|l| Instant::now() >= l.valid_until());
        if let (false, Some(after)) = (lapsed, self.answer_timeout) {
            tracing::error!(db = %self.shown, ?after, "the database did not answer in time: request cancelled");
            return MetaError::TimedOut { db: self.shown.clone(), after };
        }
        let epoch = self.fence.as_ref().map_or(0, |l| l.epoch);
        tracing::error!(db = %self.shown, epoch, "lease on the primary role ran out while waiting for the server: request abandoned, not acknowledged");
        MetaError::Fenced(format!(
            "this meta's lease on the primary role (epoch {epoch}) ran out while it waited for {} (a commit \
             waiting for its synchronous standby, or a request behind one): the request was cancelled and is \
             not acknowledged; writes are refused until a renewal succeeds",
            self.shown
        ))
    }

    /// Queues what runs before this writer's COMMIT, in its round trip, as one prepared
    /// statement: the writers' lock in shared mode unless this one runs alone
    /// (`writers_lock`), the epoch check (none without a lease), and the notification of
    /// what the transaction changed to the metas that keep rows (`notify_keepers`; none
    /// if it changed no inode or entry); refuses at once if the lease has run out.
    fn commit_gate(&mut self) -> Result<(), MetaError> {
        let epoch = match &self.fence {
            Some(lease) => {
                lease.check()?;
                Some(lease.epoch)
            }
            None => None,
        };
        let payloads = match &self.publish {
            Some(publish) if !self.written.is_empty() => Some(self.written.payloads(publish.me())),
            _ => None,
        };
        macro_rules! shared {
            () => {
                concat!("pg_advisory_xact_lock_shared(", writers_lock!(), ")")
            };
        }
        // Prepared (parsed and planned once per connection), sent ahead of the COMMIT.
        let (sql, params): (&'static str, Vec<Owned>) = match (self.alone, epoch, payloads) {
            (true, None, None) => return Ok(()),
            (true, Some(e), None) => ("SELECT locus_fence($1)", vec![Box::new(e)]),
            (false, None, None) => (concat!("SELECT ", shared!()), Vec::new()),
            (false, Some(e), None) => (concat!("SELECT ", shared!(), ", locus_fence($1)"), vec![Box::new(e)]),
            (true, None, Some(p)) => (concat!("SELECT ", notify_keepers!(1)), vec![Box::new(p)]),
            (true, Some(e), Some(p)) => {
                (concat!("SELECT locus_fence($1), ", notify_keepers!(2)), vec![Box::new(e), Box::new(p)])
            }
            (false, None, Some(p)) => (concat!("SELECT ", shared!(), ", ", notify_keepers!(1)), vec![Box::new(p)]),
            (false, Some(e), Some(p)) => (
                concat!("SELECT ", shared!(), ", locus_fence($1), ", notify_keepers!(2)),
                vec![Box::new(e), Box::new(p)],
            ),
        };
        self.defer(sql, params)
    }

    /// Takes the kept-rows lock for this writer's session if its meta keeps rows and
    /// does not hold it yet (at most once a second: the try fails while another meta's
    /// commit holds its exclusive try). Runs as the open transaction's first statement.
    fn take_kept_rows_lock(&mut self) -> Result<(), MetaError> {
        let Some(publish) = self.publish.clone() else { return Ok(()) };
        if !publish.wants_lock() || self.lock_tried.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return Ok(());
        }
        self.lock_tried = Some(Instant::now());
        // The WAL position is asked after the lock is taken: every commit that did not
        // notify this meta (it ended before the lock was granted) is behind it.
        let row = self.one(
            concat!(
                "SELECT pg_try_advisory_lock_shared(",
                kept_rows_lock!(),
                "), pg_backend_pid(), pg_current_wal_insert_lsn()::text"
            ),
            &[],
        )?;
        if row.try_get(0)? {
            if self.lock_missed.take().is_some_and(|(_, logged)| logged) {
                tracing::info!("took the kept-rows lock at last");
            }
            let at: String = row.try_get(2)?;
            publish.set_holder(row.try_get(1)?, parse_lsn(&at).unwrap_or(u64::MAX));
        } else {
            let (since, logged) = self.lock_missed.get_or_insert((Instant::now(), false));
            if !*logged && since.elapsed() >= LOCK_MISSED_WARNING {
                *logged = true;
                tracing::warn!(
                    "the kept-rows lock has been out of reach for {:?}, so lookups and getattrs all go to the \
                     server: another meta's commit holds it only for an instant; a session outside Locus \
                     holding advisory lock {KEPT_ROWS_LOCK} (see pg_locks) would explain it",
                    since.elapsed()
                );
            }
        }
        Ok(())
    }

    /// This connection's session ended (or is about to): a writer's kept-rows lock
    /// went with it.
    fn session_lost(&mut self) {
        if let Some(publish) = &self.publish {
            publish.set_holder(0, 0);
        }
        self.lock_tried = None;
        self.lock_missed = None;
    }
}

/// How long every try of the kept-rows lock may fail before it is logged (another
/// meta's commit holds it for an instant; anything longer is someone else).
const LOCK_MISSED_WARNING: Duration = Duration::from_secs(10);

/// The SQLSTATE of a commit refused because the epoch changed (class LF: Locus fencing;
/// raised by the schema's `locus_fence`).
pub(crate) const FENCED_SQLSTATE: &str = "LF001";

/// The SQLSTATE of a commit refused because a row its transaction took from the rows
/// its meta keeps had changed (raised by `locus_expect`; see `PgConn::assume_entry`).
/// It is a conflict: the transaction runs again, reading from the server.
pub(crate) const KEPT_ROW_STALE_SQLSTATE: &str = "LK001";

/// The writer's session setup: `locus_expect`, which fails the transaction with
/// `KEPT_ROW_STALE_SQLSTATE` unless its argument is true. The function lives in the
/// session's own temporary schema, so it needs no change to the database's schema.
macro_rules! writer_setup {
    () => {
        "CREATE FUNCTION pg_temp.locus_expect(ok BOOLEAN) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'locus: a row this meta kept in memory was out of date' USING ERRCODE = 'LK001';
    END IF;
END $$"
    };
}

/// The writer's setup when its meta reads from the primary: commits are also
/// acknowledged before their WAL is flushed (see `WriteConn::commit`).
const WRITER_SETUP_ASYNC: &str = concat!("SET synchronous_commit TO off;\n", writer_setup!());

/// This meta's lease on the primary role: while it holds one, its writes are accepted;
/// once it could not renew it for its whole duration (the primary unreachable, or
/// blocked because its synchronous standby at the other site is cut off), every write
/// is refused (EROFS) until a renewal succeeds again. `promote` waits out the leases
/// of the old epoch before the new primary accepts writes, so the two sides never
/// accept writes at the same time.
pub struct PrimaryLease {
    holder: String,
    /// The epoch this meta started under; a write under another one is refused.
    epoch: i64,
    duration: Duration,
    /// When the lease runs out, by this process's monotonic clock: `duration` after the
    /// start of the last renewal that succeeded (so it ends before the database's
    /// `expires_at`, which counts from the renewal's commit).
    valid_until: Mutex<Instant>,
    /// A connection of its own: a renewal may block (waiting for a cut-off
    /// synchronous standby) without holding the writer.
    conn: Mutex<PgConn>,
}

impl PrimaryLease {
    /// The epoch this lease belongs to.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// How long the lease lasts; the renewal worker runs at a third of it.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// Extends the lease by a synchronously replicated commit of its row (blocking);
    /// refused for good once the epoch moved on.
    pub fn renew(&self) -> Result<(), MetaError> {
        let started = Instant::now();
        let ms = self.duration.as_millis() as i64;
        let renewed = lock(&self.conn).exec(
            "INSERT INTO primary_leases (holder, epoch, expires_at) \
             SELECT $1, epoch, now() + $2::bigint * interval '1 millisecond' FROM primary_epoch WHERE epoch = $3 \
             ON CONFLICT (holder) DO UPDATE SET epoch = EXCLUDED.epoch, expires_at = EXCLUDED.expires_at",
            &[&self.holder as &(dyn ToSql + Sync), &ms, &self.epoch],
        )?;
        if renewed == 0 {
            return Err(MetaError::Fenced(format!(
                "the primary role moved on past epoch {}: this meta no longer accepts writes (restart it \
                 with --db at the new primary)",
                self.epoch
            )));
        }
        let mut until = lock(&self.valid_until);
        *until = (*until).max(started + self.duration);
        Ok(())
    }

    /// Until when the lease holds (renewals that succeed move it later).
    fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    /// Refuses a write once the lease has run out.
    fn check(&self) -> Result<(), MetaError> {
        let until = *lock(&self.valid_until);
        if Instant::now() < until {
            return Ok(());
        }
        tracing::error!(holder = %self.holder, epoch = self.epoch, "lease on the primary role expired: refusing writes");
        Err(MetaError::Fenced(format!(
            "this meta's lease on the primary role (epoch {}) ran out {:?} ago without a renewal: the primary \
             or its synchronous standby is unreachable; writes are refused until a renewal succeeds",
            self.epoch,
            Instant::now() - until
        )))
    }
}

impl WriteConn for PgConn {
    /// A meta whose lease ran out refuses at once, before trying an unreachable server.
    fn begin(&mut self, durable: bool) -> Result<(), MetaError> {
        // Whatever an earlier transaction that never reached its commit wrote is not
        // this one's to publish.
        self.written = Written::default();
        self.assumed = Written::default();
        self.trust_kept = !self.distrust;
        if let Some(lease) = &self.fence {
            lease.check()?;
        }
        self.durable = durable;
        if std::mem::take(&mut self.alone_next) {
            self.reconnect_if_closed()?;
            // The begun but unused transaction ends first: its snapshot must be
            // taken only once this session holds the lock.
            let lock = concat!("SELECT pg_advisory_lock(", writers_lock!(), ")");
            let end: &[&'static str] = if std::mem::take(&mut self.begun) { &["ROLLBACK", lock] } else { &[lock] };
            self.alone = true;
            self.boundary(end)?;
            self.ensure_begun(begin_write!())?;
        } else {
            self.ensure_begun(begin_write!())?;
        }
        self.take_kept_rows_lock()
    }

    fn savepoint(&mut self) -> Result<(), MetaError> {
        if std::mem::take(&mut self.release_pending) {
            self.boundary(&["RELEASE SAVEPOINT op", "SAVEPOINT op"])
        } else {
            self.boundary(&["SAVEPOINT op"])
        }
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), MetaError> {
        self.written.distrust();
        self.boundary(&["ROLLBACK TO SAVEPOINT op", "RELEASE SAVEPOINT op"])
    }

    fn release_savepoint(&mut self) -> Result<(), MetaError> {
        self.release_pending = true;
        Ok(())
    }

    /// The writer's session commits with `synchronous_commit=off` (set in `open`): a
    /// plain write is acknowledged before its WAL record is flushed (as SQLite's
    /// synchronous=NORMAL), lost only if the server's machine fails, never torn. A
    /// durable one turns it on for its own commit, which also flushes every earlier one.
    /// What the transaction changed is notified to other metas in the commit's round
    /// trip, and replaces the rows this meta keeps once the commit is answered (or is
    /// dropped from them if the commit's outcome is unknown).
    fn commit(&mut self) -> Result<(), MetaError> {
        if let Err(refused) = self.commit_gate() {
            self.written = Written::default();
            return Err(refused);
        }
        let committed = if let Some(committed) = self.committed.clone() {
            self.durable = false;
            self.commit_reporting_lsn(&committed)
        } else {
            let end: &[&'static str] = if std::mem::take(&mut self.durable) {
                &["SET LOCAL synchronous_commit TO on", "COMMIT", begin_write!()]
            } else {
                &["COMMIT", begin_write!()]
            };
            self.end(end)
        };
        if let Some(publish) = &self.publish {
            let written = std::mem::take(&mut self.written);
            match &committed {
                Ok(()) => {
                    self.distrust = false;
                    publish.committed(&written)
                }
                Err(_) => publish.forget(&written),
            }
        }
        committed
    }

    fn rollback(&mut self) -> Result<(), MetaError> {
        self.durable = false;
        self.written = Written::default();
        self.end(&["ROLLBACK", begin_write!()])
    }

    fn txn(&mut self) -> &mut dyn Txn {
        self
    }

    fn run_alone_next(&mut self) {
        self.alone_next = true;
    }
}

impl PgConn {
    /// Commits like `WriteConn::commit` and publishes the commit's WAL position (an
    /// upper bound: the flushed position right after it, as far as a standby can get) to
    /// `committed`.
    /// The next BEGIN cannot ride along (after the SELECT, it would find a query already
    /// run in its implicit transaction), so it goes with the next transaction's first
    /// statements (`begin_pending`) instead of costing a round trip of its own, across
    /// the WAN from a standby's site.
    fn commit_reporting_lsn(&mut self, committed: &AtomicU64) -> Result<(), MetaError> {
        self.begun = false;
        self.release_pending = false;
        self.seen = Seen::default();
        let unlock = if self.alone { concat!("; SELECT pg_advisory_unlock(", writers_lock!(), ")") } else { "" };
        let Answer::Simple(answers) =
            self.pipeline(Last::Simple(&format!("COMMIT; SELECT pg_current_wal_flush_lsn()::text{unlock}")))?
        else {
            unreachable!("a simple query answers messages")
        };
        self.alone = false;
        let lsn = answers.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(parse_lsn),
            _ => None,
        });
        committed.fetch_max(
            lsn.ok_or_else(|| MetaError::Internal("no WAL position after a commit".into()))?,
            Ordering::AcqRel,
        );
        self.begin_pending = Some(begin_write!());
        self.begun = true;
        Ok(())
    }
}

impl PgConn {
    /// The inode is known to have no extended attributes, in this transaction or in
    /// the rows its meta keeps.
    fn bare(&self, ino: InodeId) -> bool {
        self.seen.no_xattrs.contains(&ino) || self.cache.as_ref().is_some_and(|c| c.bare(ino))
    }

    /// Keeps the inodes and entries a read found in its meta's memory (read
    /// connections only; see `SharedRows::keep` for `began`).
    fn keep_seen(&self, began: Option<u64>) {
        if let (Some(cache), Some(began)) = (&self.cache, began) {
            cache.keep(
                began,
                self.seen.inodes.iter().filter_map(|(ino, row)| Some((ino, row.as_ref()?))),
                self.seen.dentries.iter().filter_map(|(key, ino)| Some((key, (*ino)?))),
                self.seen.no_xattrs.iter().copied(),
            );
        }
    }
}

/// A WAL position as PostgreSQL prints it (`16/B374D848`).
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(u64::from_str_radix(hi, 16).ok()? << 32 | u64::from_str_radix(lo, 16).ok()?)
}

impl ReadConn for PgConn {
    /// A read is first tried outside any transaction: if it needs one statement (a
    /// lookup, a getattr: `prefetch_entry` and the row cache make most reads one), that
    /// statement is its own snapshot and the read costs one round trip. If it asks for
    /// a second one, that try is dropped and the read runs again in a REPEATABLE READ
    /// snapshot, its BEGIN sent with its first statement.
    fn snapshot(&mut self, op: ReadOp<'_>) -> Result<(), MetaError> {
        self.reconnect_if_closed()?;
        let began = self.cache.as_ref().map(|c| c.generation());
        self.snapshot_since(began, op)
    }
}

impl PgConn {
    /// `ReadConn::snapshot`, keeping what it read only if no change was applied to the
    /// kept rows since `began` (`None`: keeping nothing).
    fn snapshot_since(&mut self, began: Option<u64>, op: ReadOp<'_>) -> Result<(), MetaError> {
        self.seen = Seen::default();
        self.probe = Probe::Ready;
        let tried = op(self);
        let overflowed = self.probe == Probe::Overflowed;
        self.probe = Probe::Off;
        if !overflowed && tried.is_ok() {
            self.keep_seen(began);
        }
        self.seen = Seen::default();
        if !overflowed {
            return tried;
        }
        self.begin_pending = Some(begin_read!());
        let r = op(self);
        if r.is_ok() {
            self.keep_seen(began);
        }
        // Nothing sent yet (the op failed before its first statement): nothing to end.
        if self.begin_pending.take().is_some() {
            return r;
        }
        let end = self.batch(if r.is_ok() { "COMMIT" } else { "ROLLBACK" });
        r.and(end)
    }
}

/// How long a read at a hot standby waits for it to replay this meta's latest commit
/// before it reads from the primary instead.
const STANDBY_WAIT: Duration = Duration::from_millis(50);

/// A read connection at a site with a hot standby: reads there once the standby has
/// replayed this meta's latest commit (read-your-writes for every client of this
/// meta), else, after `STANDBY_WAIT`, from the primary. What it reads at the standby
/// is kept only if the standby had replayed the kept rows' floor (`shared_rows`).
struct StandbyReader {
    standby: PgConn,
    primary: PgConn,
    /// The WAL position of this meta's latest commit, published by its writer.
    committed: Arc<AtomicU64>,
    /// How far the standby had replayed when last asked over this connection: a read
    /// needing no more than that asks nothing first (replay only moves forward while
    /// the connection lives; a restarted standby may start behind, so a new connection
    /// starts from 0).
    replayed: u64,
}

impl ReadConn for StandbyReader {
    fn snapshot(&mut self, op: ReadOp<'_>) -> Result<(), MetaError> {
        // In this order: a commit publishes its position before it changes the kept
        // rows, and a notification makes the floor unknown before it does.
        let began = self.standby.cache.as_ref().map(|c| c.generation());
        let needed = self.committed.load(Ordering::Acquire);
        let floor = self.standby.cache.as_ref().and_then(|c| c.floor());
        let deadline = std::time::Instant::now() + STANDBY_WAIT;
        let mut asked = false;
        loop {
            if self.standby.wire.as_ref().is_none_or(Wire::is_closed) {
                self.replayed = 0;
                self.standby.reconnect_if_closed()?;
            }
            let kept = floor.is_some_and(|floor| self.replayed >= floor);
            // Asked once more for the floor alone, never waited for.
            if self.replayed >= needed && (kept || asked || floor.is_none()) {
                // The snapshot the read takes holds at least everything replayed by then.
                return self.standby.snapshot_since(began.filter(|_| kept), op);
            }
            // Asked outside any transaction. NULL: not a standby at all.
            let replayed: Option<String> =
                self.standby.one("SELECT pg_last_wal_replay_lsn()::text", &[])?.try_get(0)?;
            self.replayed = replayed.as_deref().map_or(Some(u64::MAX), parse_lsn).unwrap_or(0).max(self.replayed);
            asked = true;
            if self.replayed >= needed {
                continue;
            }
            if std::time::Instant::now() >= deadline {
                return self.primary.snapshot(op);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// `url` without its password, for messages.
fn shown(config: &Config) -> String {
    let host = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    format!("postgres://{user}{host}:{port}/{}", config.get_dbname().or(config.get_user()).unwrap_or(""))
}

/// Connects one client; its requests wait at most `answer_timeout` for their answer.
fn connect(config: &Config, shown: &str, answer_timeout: Option<Duration>) -> Result<PgConn, MetaError> {
    Ok(PgConn {
        wire: Some(Wire::connect(config, shown)?),
        config: config.clone(),
        shown: shown.into(),
        setup: "",
        committed: None,
        statements: HashMap::new(),
        begun: false,
        durable: false,
        release_pending: false,
        fence: None,
        deferred: Vec::new(),
        seen: Seen::default(),
        cache: None,
        publish: None,
        written: Written::default(),
        assumed: Written::default(),
        trust_kept: false,
        distrust: false,
        lock_tried: None,
        lock_missed: None,
        ids: HashMap::new(),
        probe: Probe::Off,
        begin_pending: None,
        failed_unread: false,
        answer_timeout,
        alone_next: false,
        alone: false,
    })
}

/// Whether every host of `config` is this machine (a loopback address, `localhost`,
/// or a Unix socket): its point reads answer in tens of microseconds and may run
/// inline on meta's async workers (`Backend::local_reads`).
fn on_this_machine(config: &Config) -> bool {
    config.get_hosts().iter().all(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => {
            name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        tokio_postgres::config::Host::Unix(_) => true,
    })
}

/// Parses a `postgres://` URL and connects one client, for `open` and `migrate`.
fn parse(url: &str) -> Result<(Config, String), MetaError> {
    let mut config: Config = url.parse().map_err(|e: postgres::Error| MetaError::UnsupportedUrl {
        url: url.into(),
        reason: format!("not a PostgreSQL connection URL: {e}"),
    })?;
    config.connect_timeout(CONNECT_TIMEOUT).application_name("locus-meta");
    let shown = shown(&config);
    Ok((config, shown))
}

/// Opens the PostgreSQL database at `url` for the shared engine. Without `init` the
/// database must already hold a Locus namespace; with it, an empty database (no
/// tables) is formatted with a new cluster id. A database holding anything else is
/// refused either way. With `standby` (a hot standby of `url`'s server, at this
/// site), reads go there once it has replayed this meta's latest commit.
/// With `lease` (a holder name and duration), the writer holds a lease on the
/// primary role (`PrimaryLease`), taken here and renewed by the meta's `primary-lease`
/// worker. Every request waits at most `answer_timeout` for the server's answer.
pub fn open(
    url: &str,
    standby: Option<&str>,
    init: bool,
    lease: Option<(String, Duration)>,
    answer_timeout: Duration,
) -> Result<Backend, MetaError> {
    let (config, shown) = parse(url)?;
    let timeout = Some(answer_timeout);
    let mut writer = connect(&config, &shown, timeout)?;
    init_schema(&mut writer, &shown, init)?;
    let row = writer.one("SELECT id, secret FROM cluster", &[])?;
    let (cluster_id, cluster_secret): (String, [u8; 32]) = (row.try_get(0)?, secret_of(row.try_get(1)?)?);
    let epoch: i64 = writer.one("SELECT epoch FROM primary_epoch", &[])?.try_get(0)?;
    let lease = match lease {
        None => None,
        Some((holder, duration)) => {
            let lease = Arc::new(PrimaryLease {
                holder,
                epoch,
                duration,
                valid_until: Mutex::new(Instant::now()),
                conn: Mutex::new(connect(&config, &shown, timeout)?),
            });
            lease.renew()?;
            tracing::info!(epoch, ?duration, "holding a lease on the primary role");
            writer.fence = Some(lease.clone());
            Some(lease)
        }
    };
    let mut readers: Vec<Box<dyn ReadConn>> = Vec::with_capacity(READERS);
    // Every writer notifies the metas that keep rows of what it commits. The writer
    // takes the lock (at the primary) below and, while another meta's commit holds
    // it, again with a later write transaction; the listener listens at the primary.
    let shared = SharedRows::new(standby.is_some());
    writer.publish = Some(shared.clone());
    let kept = |mut conn: PgConn| {
        conn.cache = Some(shared.clone());
        conn
    };
    match standby {
        None => {
            writer.setup = WRITER_SETUP_ASYNC;
            for _ in 0..READERS {
                readers.push(Box::new(kept(connect(&config, &shown, timeout)?)));
            }
        }
        // Commits are flushed before they are answered: WAL reaches the standby only
        // once flushed, and an unflushed commit would keep its writer's reads waiting.
        Some(standby_url) => {
            writer.setup = writer_setup!();
            let committed = Arc::new(AtomicU64::new(0));
            writer.committed = Some(committed.clone());
            let (standby_config, standby_shown) = parse(standby_url)?;
            for _ in 0..READERS {
                readers.push(Box::new(StandbyReader {
                    standby: kept(connect(&standby_config, &standby_shown, timeout)?),
                    // Keeps nothing: rows newer than the standby's would mix with its
                    // older ones in later reads there.
                    primary: connect(&config, &shown, timeout)?,
                    committed: committed.clone(),
                    replayed: 0,
                }));
            }
        }
    }
    writer.batch(writer.setup)?;
    crate::shared_rows::listen(config.clone(), shown.clone(), &shared);
    writer.take_kept_rows_lock()?;
    Ok(Backend {
        cluster_id,
        cluster_secret,
        writer: Box::new(writer),
        readers,
        local_reads: standby.is_none() && on_this_machine(&config),
        local_writes: false,
        lease,
        epoch: epoch as u64,
    })
}

/// What `promote` did, for the operator.
#[derive(Debug)]
pub struct Promotion {
    /// The server was a standby (else it was already a primary: only the epoch moved).
    pub was_standby: bool,
    /// How long it waited for the old epoch's leases to run out.
    pub waited_for_leases: Duration,
    /// The new epoch: metas of older ones have their writes refused here.
    pub epoch: i64,
}

/// Makes the database at `url` the primary of a new epoch: promotes the server if it
/// is a hot standby (`pg_promote`), drops its synchronous standby setting (the old
/// primary's site is gone), waits until every lease of the old epoch it replicated
/// has run out by its clock (the old side has then stopped accepting writes, given
/// clocks within a few ms), and bumps `primary_epoch`. Run it only once the old
/// primary's site is lost or fenced; metas then restart with `--db` at this server.
pub fn promote(url: &str) -> Result<Promotion, MetaError> {
    let (config, shown) = parse(url)?;
    let mut c = connect(&config, &shown, None)?;
    let was_standby: bool = c.one("SELECT pg_is_in_recovery()", &[])?.try_get(0)?;
    if was_standby {
        let done: bool = c.one("SELECT pg_promote(true, 60)", &[])?.try_get(0)?;
        if !done {
            return Err(MetaError::Internal(format!("{shown} did not finish its promotion within 60 s")));
        }
    }
    let sync_names: String = c.one("SELECT current_setting('synchronous_standby_names')", &[])?.try_get(0)?;
    if !sync_names.is_empty() {
        c.batch("ALTER SYSTEM RESET synchronous_standby_names")?;
        c.batch("SELECT pg_reload_conf()")?;
    }
    let started = Instant::now();
    let remaining_ms: f64 = c
        .one(
            "SELECT COALESCE(EXTRACT(EPOCH FROM MAX(expires_at) - now()) * 1000, 0)::float8 FROM primary_leases \
             WHERE epoch = (SELECT epoch FROM primary_epoch)",
            &[],
        )?
        .try_get(0)?;
    if remaining_ms > 0.0 {
        tracing::info!(remaining_ms, "waiting for the old epoch's leases to run out");
        std::thread::sleep(Duration::from_secs_f64(remaining_ms / 1000.0));
    }
    let epoch: i64 = c.one("UPDATE primary_epoch SET epoch = epoch + 1 RETURNING epoch", &[])?.try_get(0)?;
    c.exec("DELETE FROM primary_leases WHERE epoch < $1", &[&epoch])?;
    Ok(Promotion { was_standby, waited_for_leases: started.elapsed(), epoch })
}

/// The oldest schema version a PostgreSQL database can be upgraded from (the first
/// one PostgreSQL databases were created at).
const FIRST_UPGRADABLE: i64 = 9;

/// Upgrades from each version since `FIRST_UPGRADABLE` to the next, in order: entry
/// `i` turns version `FIRST_UPGRADABLE + i` into the next. Each runs inside the
/// opening transaction.
const UPGRADES: &[Upgrade] = &[mark_acls_in_modes];

/// One schema upgrade step, run inside the opening transaction.
type Upgrade = fn(&mut PgConn) -> Result<(), MetaError>;
const _: () = assert!(FIRST_UPGRADABLE + UPGRADES.len() as i64 == SCHEMA_VERSION);

/// Version 9 -> 10: the `mode` column may carry ACL marks (`store::AclMarks`); as for
/// SQLite, no row changes, the version moves so that older binaries refuse the database.
fn mark_acls_in_modes(_: &mut PgConn) -> Result<(), MetaError> {
    Ok(())
}

/// Formats an empty database (with `init`), or checks the schema version of a
/// formatted one and upgrades an older one, in one transaction.
fn init_schema(w: &mut PgConn, shown: &str, init: bool) -> Result<(), MetaError> {
    let not_formatted = |reason: &str| MetaError::NotFormatted { path: shown.into(), reason: reason.into() };
    w.batch(begin_write!())?;
    let r = (|| {
        let tables: i64 = w
            .one("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()", &[])?
            .try_get(0)?;
        if tables == 0 {
            if !init {
                return Err(not_formatted("is empty"));
            }
            return format(w);
        }
        let versioned: bool = w.one("SELECT to_regclass('meta_version') IS NOT NULL", &[])?.try_get(0)?;
        if !versioned {
            return Err(not_formatted("is not a Locus metadata database"));
        }
        let found: Option<i64> = w.one("SELECT MAX(version) FROM meta_version", &[])?.try_get(0)?;
        let found = found.ok_or_else(|| MetaError::SchemaUnknown { path: shown.into(), found: 0 })?;
        if found > SCHEMA_VERSION {
            return Err(MetaError::SchemaTooNew { path: shown.into(), found, supported: SCHEMA_VERSION });
        }
        if found < FIRST_UPGRADABLE {
            return Err(MetaError::SchemaUnknown { path: shown.into(), found });
        }
        for (from, upgrade) in UPGRADES.iter().enumerate().skip((found - FIRST_UPGRADABLE) as usize) {
            upgrade(w)?;
            let from = FIRST_UPGRADABLE + from as i64;
            tracing::info!(database = shown, from, to = from + 1, "upgraded the metadata schema");
        }
        if found < SCHEMA_VERSION {
            w.exec("UPDATE meta_version SET version = $1", &[&SCHEMA_VERSION])?;
        }
        Ok(())
    })();
    match r {
        Ok(()) => w.batch("COMMIT"),
        Err(e) => {
            let _ = w.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Creates the schema, the root directory and a new cluster id.
fn format(w: &mut PgConn) -> Result<(), MetaError> {
    create_tables(w)?;
    w.exec("INSERT INTO cluster (id, secret) VALUES ($1, $2)", &[&new_cluster_id()?, &&random_bytes::<32>()?[..]])?;
    w.put_inode(&root_inode())
}

/// Connects to the database at `url` for `migrate`, which copies only into an empty one.
pub(crate) fn connect_empty(url: &str) -> Result<PgConn, MetaError> {
    let (config, shown) = parse(url)?;
    let mut conn = connect(&config, &shown, None)?;
    let tables: i64 = conn
        .one("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()", &[])?
        .try_get(0)?;
    if tables > 0 {
        return Err(MetaError::TargetNotEmpty { url: shown, tables: tables as u64 });
    }
    Ok(conn)
}

/// What `migrate` needs beyond the row operations: statements built at run time
/// (one per copied table) and the counters, which are sequences here.
impl PgConn {
    pub(crate) fn prepare_dynamic(&mut self, sql: &str) -> Result<Statement, MetaError> {
        let until = self.wait_limit();
        let Wire { client, driver } = self.wire()?;
        match driver.block_on_until(client.prepare(sql), until.as_deref())? {
            Some(prepared) => {
                // As after a failed request (`failed_unread`).
                self.failed_unread |= prepared.is_err();
                Ok(prepared?)
            }
            None => Err(self.abandon()),
        }
    }

    pub(crate) fn execute_prepared(&mut self, st: &Statement, params: Params<'_>) -> Result<u64, MetaError> {
        match self.pipeline(Last::Count(st, params))? {
            Answer::Count(n) => Ok(n),
            _ => unreachable!("an execute answers a count"),
        }
    }

    /// Rows in `table` (a name taken from the source's catalogue).
    pub(crate) fn count_rows(&mut self, table: &str) -> Result<u64, MetaError> {
        let Answer::Simple(answers) = self.pipeline(Last::Simple(&format!("SELECT COUNT(*) FROM {table}")))? else {
            unreachable!("a simple query answers messages")
        };
        let n = answers
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).and_then(|n| n.parse::<u64>().ok()),
                _ => None,
            })
            .ok_or_else(|| MetaError::Internal(format!("no row count for table {table}")))?;
        Ok(n)
    }

    /// Sets counter `name` (as SQLite names it) so that the next id it gives is `value + 1`.
    pub(crate) fn set_counter(&mut self, name: &str, value: i64) -> Result<(), MetaError> {
        match name {
            "syncs" => self.exec("UPDATE counters SET value = $1 WHERE name = 'syncs'", &[&value])?,
            "next_inode" | "next_cookie" | "next_session" => {
                self.one("SELECT setval($1::text::regclass, $2, false)", &[&name, &(value + 1)])?;
                0
            }
            other => return Err(MetaError::Corrupt(format!("unknown counter {other:?}"))),
        };
        Ok(())
    }
}

/// The tables and the version row, without any namespace (what `migrate` fills).
pub(crate) fn create_tables(w: &mut PgConn) -> Result<(), MetaError> {
    w.batch(SCHEMA)?;
    w.exec("INSERT INTO meta_version (version) VALUES ($1)", &[&SCHEMA_VERSION])?;
    Ok(())
}

/// The inode columns in the order `inode_of` reads them.
macro_rules! inode_cols {
    () => {
        "ino, kind, mode, uid, gid, size, nlink, rdev, atime_s, atime_ns, mtime_s, mtime_ns, \
         ctime_s, ctime_ns, data_version, parent, target"
    };
}

/// SQL that is true when the inode row equals the parameters listed (`inode_params`).
macro_rules! inode_is {
    ($params:literal) => {
        concat!("EXISTS (SELECT 1 FROM inodes WHERE (", inode_cols!(), ") = (", $params, "))")
    };
}

/// The parameters that store `inode` in `inode_cols` order (as `inode_of` reads them).
fn inode_params(inode: &Inode) -> Vec<Owned> {
    let a = &inode.attr;
    vec![
        Box::new(a.ino as i64),
        Box::new(kind_code(a.kind)),
        Box::new(inode.mode_column()),
        Box::new(a.uid as i64),
        Box::new(a.gid as i64),
        Box::new(a.size as i64),
        Box::new(a.nlink as i64),
        Box::new(a.rdev as i64),
        Box::new(a.atime.secs),
        Box::new(a.atime.nanos as i64),
        Box::new(a.mtime.secs),
        Box::new(a.mtime.nanos as i64),
        Box::new(a.ctime.secs),
        Box::new(a.ctime.nanos as i64),
        Box::new(a.data_version as i64),
        Box::new(inode.parent as i64),
        Box::new(inode.target.clone()),
    ]
}

/// The inode in `r`'s columns from `at` on (in `inode_cols` order).
fn inode_of(r: &Row, at: usize) -> Result<Inode, MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(at + i);
    let ts =
        |s: usize| -> Result<Timestamp, postgres::Error> { Ok(Timestamp { secs: int(s)?, nanos: int(s + 1)? as u32 }) };
    let ino = int(0)? as u64;
    let kind = int(1)?;
    let (mode, acls) = split_mode_column(int(2)?);
    Ok(Inode {
        attr: Attr {
            ino,
            kind: kind_of(kind).ok_or_else(|| MetaError::Corrupt(format!("inode {ino} has kind {kind}")))?,
            mode,
            uid: int(3)? as u32,
            gid: int(4)? as u32,
            size: int(5)? as u64,
            nlink: int(6)? as u32,
            rdev: int(7)? as u32,
            atime: ts(8)?,
            mtime: ts(10)?,
            ctime: ts(12)?,
            data_version: int(14)? as u64,
        },
        parent: int(15)? as u64,
        target: r.try_get(at + 16)?,
        acls,
    })
}

fn extent_of(r: &Row) -> Result<(InodeId, Extent), MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v as u64);
    Ok((int(0)?, Extent { file_offset: int(1)?, len: int(2)?, chunk: chunk_id(r.try_get(3)?)?, chunk_offset: int(4)? }))
}

fn node_of(r: &Row) -> Result<(NodeInfo, i64), MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v as u64);
    Ok((
        NodeInfo {
            id: r.try_get(0)?,
            store_id: r.try_get(1)?,
            site: r.try_get(2)?,
            addr: r.try_get(3)?,
            capacity_bytes: int(4)?,
            used_bytes: int(5)?,
            chunk_count: int(6)?,
            last_seen_secs: 0,
            site_rtts: Vec::new(),
            cache_bytes: int(7)?,
            drained: false,
        },
        r.try_get(8)?,
    ))
}

/// The single row of `sql`'s answer, if any.
fn at_most_one(mut rows: Vec<Row>, sql: &str) -> Result<Option<Row>, MetaError> {
    if rows.len() > 1 {
        return Err(MetaError::Corrupt(format!("{} rows where at most one was expected: {sql}", rows.len())));
    }
    Ok(rows.pop())
}

/// Directory $1, its entry named $2, that entry's inode (`PgConn::entry_seen` reads the
/// entry from column 17), what `$facts` says about it (columns 35-39) and session $3
/// (from column 40).
macro_rules! entry_sql {
    ($facts:literal) => {
        concat!(
            "SELECT p.ino, p.kind, p.mode, p.uid, p.gid, p.size, p.nlink, p.rdev, p.atime_s, p.atime_ns, \
             p.mtime_s, p.mtime_ns, p.ctime_s, p.ctime_ns, p.data_version, p.parent, p.target, \
             d.ino, c.ino, c.kind, c.mode, c.uid, c.gid, c.size, c.nlink, c.rdev, c.atime_s, c.atime_ns, \
             c.mtime_s, c.mtime_ns, c.ctime_s, c.ctime_ns, c.data_version, c.parent, c.target, ",
            $facts,
            ", s.id, s.site, s.host, s.pid, s.purpose, s.last_seen, s.owner \
             FROM inodes p LEFT JOIN dentries d ON d.parent = p.ino AND d.name = $2 \
             LEFT JOIN inodes c ON c.ino = d.ino LEFT JOIN sessions s ON s.id = $3 WHERE p.ino = $1"
        )
    };
}
/// For a write (`Prefetch::entry`): the inode's open count, whether it has extents,
/// xattrs and a policy, and whether any policy exists at all.
const ENTRY_SQL: &str = entry_sql!(
    "(SELECT COALESCE(SUM(o.count), 0)::BIGINT FROM opens o WHERE o.ino = d.ino), \
     EXISTS (SELECT 1 FROM extents e WHERE e.ino = d.ino), EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), \
     EXISTS (SELECT 1 FROM policies y WHERE y.ino = d.ino), EXISTS (SELECT 1 FROM policies)"
);
/// For a point read (a lookup): none of those facts (NULL), so no subquery to start.
const ENTRY_READ_SQL: &str = entry_sql!("NULL::BIGINT, NULL::BOOLEAN, NULL::BOOLEAN, NULL::BOOLEAN, NULL::BOOLEAN");
/// The guard of a write that took directory $1 (columns $1-$17), its entry named $35
/// and that entry's inode ($18-$34) from the kept rows, and assumed what `ENTRY_SQL`
/// would have told: the inode is not open and has no extents, xattrs or policy. Sent
/// ahead of the write's own statements, it fails the transaction unless all of it
/// holds; under SERIALIZABLE what it reads is the transaction's reads, as `ENTRY_SQL`'s
/// would have been.
const ENTRY_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    " AND ",
    inode_is!("$18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34"),
    " AND EXISTS (SELECT 1 FROM dentries WHERE parent = $1 AND name = $35 AND ino = $18) \
     AND NOT EXISTS (SELECT 1 FROM opens WHERE ino = $18) AND NOT EXISTS (SELECT 1 FROM extents WHERE ino = $18) \
     AND NOT EXISTS (SELECT 1 FROM xattrs WHERE ino = $18) AND NOT EXISTS (SELECT 1 FROM policies WHERE ino = $18))"
);
/// The guard of a write of data taken from the kept rows (`PgConn::assume_data_write`):
/// inode $1 is the kept row ($1 to $17), session $18 has it open once, for writing, and
/// no extent intersects `[$19, $20)`.
const DATA_WRITE_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    " AND EXISTS (SELECT 1 FROM opens WHERE session = $18 AND ino = $1 AND count = 1 AND writable = 1) \
     AND NOT EXISTS (SELECT 1 FROM (SELECT file_offset, len FROM extents WHERE ino = $1 AND file_offset < $19 \
     ORDER BY file_offset DESC LIMIT 1) e WHERE e.file_offset + e.len > $19) \
     AND NOT EXISTS (SELECT 1 FROM extents WHERE ino = $1 AND file_offset >= $19 AND file_offset < $20))"
);
/// The guard of a release that took the inode from the kept rows (`PgConn::drop_open`):
/// inode $1 is the kept row, with links, so the release reclaims nothing.
const LINKED_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    ")"
);
const SESSION_SQL: &str = "SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions WHERE id = $1";
/// Session $1's opens of inode $2 (count, writable; NULL if none), the inode (from
/// column 2), whether any policy exists (column 19) and the session (from column 20).
const OPEN_SQL: &str = "SELECT o.count, o.writable, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, i.rdev, \
     i.atime_s, i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target, \
     EXISTS (SELECT 1 FROM policies), s.id, s.site, s.host, s.pid, s.purpose, s.last_seen, s.owner \
     FROM (SELECT $1::BIGINT AS session, $2::BIGINT AS ino) k \
     LEFT JOIN opens o ON o.session = k.session AND o.ino = k.ino LEFT JOIN inodes i ON i.ino = k.ino \
     LEFT JOIN sessions s ON s.id = k.session";
/// The extents of inode $1 that intersect `[$2, $3)`: extents never overlap, so only
/// the last one starting before $2 can reach into the span, and the ones starting in it.
const EXTENTS_SQL: &str = "(SELECT ino, file_offset, len, chunk, chunk_offset FROM extents \
     WHERE ino = $1 AND file_offset < $2 ORDER BY file_offset DESC LIMIT 1) \
     UNION ALL (SELECT ino, file_offset, len, chunk, chunk_offset FROM extents \
     WHERE ino = $1 AND file_offset >= $2 AND file_offset < $3)";
/// Every extent of the inode that entry $2 of directory $1 names, sent with the entry's
/// statement (`Prefetch::entry_extents`): an unlink of a file with data then needs no
/// round trip of its own for them.
const ENTRY_EXTENTS_SQL: &str = "SELECT e.ino, e.file_offset, e.len, e.chunk, e.chunk_offset FROM dentries d \
     JOIN extents e ON e.ino = d.ino WHERE d.parent = $1 AND d.name = $2 ORDER BY e.file_offset";
/// Inode $1 and each of its ancestors up to the root ($2): its number, its policy
/// (NULL if none) and, from column 5, its inode.
const POLICIES_SQL: &str = "WITH RECURSIVE up (ino, depth) AS (
         SELECT $1::BIGINT, 0
         UNION ALL
         SELECT i.parent, up.depth + 1 FROM up JOIN inodes i ON i.ino = up.ino
         WHERE up.ino <> $2 AND up.depth < 1000)
     SELECT up.ino, p.sites, p.copies, p.mode, p.rpo_secs, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, \
     i.rdev, i.atime_s, i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target \
     FROM up LEFT JOIN policies p ON p.ino = up.ino LEFT JOIN inodes i ON i.ino = up.ino";

/// The session in columns `at..at + 7` (`session_cols!`); None if they are NULL.
fn session_of(r: &Row, at: usize) -> Result<Option<SessionRow>, MetaError> {
    let Some(id) = r.try_get::<_, Option<i64>>(at)? else { return Ok(None) };
    Ok(Some(SessionRow {
        id: id as u64,
        info: SessionInfo {
            site: r.try_get(at + 1)?,
            host: r.try_get(at + 2)?,
            pid: r.try_get::<_, i64>(at + 3)? as u32,
            purpose: r.try_get(at + 4)?,
        },
        last_seen_ms: r.try_get(at + 5)?,
        owner: r.try_get(at + 6)?,
    }))
}

impl Txn for PgConn {
    /// Ids come from sequences ID_BLOCK at a time, kept by this connection: a
    /// sequence is outside transactions anyway (a rolled-back id is never given
    /// again), and metas over one database each hold their own block.
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError> {
        let sql = match counter {
            Counter::Inode => "SELECT nextval('next_inode') FROM generate_series(1, 64) ORDER BY 1 DESC",
            Counter::Cookie => "SELECT nextval('next_cookie') FROM generate_series(1, 64) ORDER BY 1 DESC",
            Counter::Session => "SELECT nextval('next_session') FROM generate_series(1, 64) ORDER BY 1 DESC",
            // A row write, so a durable commit has a WAL record to flush.
            Counter::Sync => {
                let v: i64 = self
                    .opt("UPDATE counters SET value = value + 1 WHERE name = 'syncs' RETURNING value", &[])?
                    .ok_or_else(|| MetaError::Corrupt(format!("counter {} missing", counter.name())))?
                    .try_get(0)?;
                return Ok(v as u64);
            }
        };
        let block = match self.ids.get_mut(sql) {
            Some(block) if !block.is_empty() => block,
            _ => {
                let fetched = self.query(sql, &[])?.iter().map(|r| r.try_get(0)).collect::<Result<Vec<i64>, _>>()?;
                self.ids.insert(sql, fetched);
                self.ids.get_mut(sql).expect("just inserted")
            }
        };
        let id = block.pop().ok_or_else(|| MetaError::Corrupt(format!("sequence {} gave no id", counter.name())))?;
        if matches!(counter, Counter::Inode) {
            let ino = id as u64;
            self.seen.no_extents.insert(ino);
            self.seen.no_xattrs.insert(ino);
            self.seen.open_counts.insert(ino, 0);
            self.seen.policies.insert(ino, None);
        }
        Ok(id as u64)
    }

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError> {
        if let Some(seen) = self.seen.inodes.get(&ino) {
            return Ok(seen.clone());
        }
        if let Some(kept) = self.cache.as_ref().and_then(|c| c.inode(ino)) {
            self.seen.inodes.insert(ino, Some(kept.clone()));
            return Ok(Some(kept));
        }
        let found = self
            .opt(concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino = $1"), &[&(ino as i64)])?
            .map(|r| inode_of(&r, 0))
            .transpose()?;
        self.seen.inodes.insert(ino, found.clone());
        Ok(found)
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let a = &inode.attr;
        let params = inode_params(inode);
        self.defer(
            concat!(
                "INSERT INTO inodes (",
                inode_cols!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
                 ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, uid = excluded.uid,
                 gid = excluded.gid, size = excluded.size, nlink = excluded.nlink, rdev = excluded.rdev,
                 atime_s = excluded.atime_s, atime_ns = excluded.atime_ns, mtime_s = excluded.mtime_s,
                 mtime_ns = excluded.mtime_ns, ctime_s = excluded.ctime_s, ctime_ns = excluded.ctime_ns,
                 data_version = excluded.data_version, parent = excluded.parent, target = excluded.target"
            ),
            params,
        )?;
        self.seen.inodes.insert(a.ino, Some(inode.clone()));
        if self.publish.is_some() {
            self.written.inodes.insert(a.ino, Some(inode.clone()));
            match self.seen.no_xattrs.contains(&a.ino) {
                true => self.written.bare.insert(a.ino),
                false => self.written.bare.remove(&a.ino),
            };
        }
        Ok(())
    }

    fn delete_inode(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.defer("DELETE FROM inodes WHERE ino = $1", vec![Box::new(ino as i64)])?;
        self.seen.inodes.insert(ino, None);
        if self.publish.is_some() {
            self.written.inodes.insert(ino, None);
        }
        Ok(())
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(self.one("SELECT COUNT(*) FROM inodes", &[])?.try_get::<_, i64>(0)? as u64)
    }

    /// Reads the entry's inode, how often it is open and whether it has extents in
    /// the same round trip: every op that looks a name up goes on to its inode, and an
    /// unlink to its opens and extents (answered from `seen`).
    fn get_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>, MetaError> {
        if let Some(&seen) = self.seen.dentries.get(&(parent, name.to_vec())) {
            return Ok(seen);
        }
        if let Some(ino) = self.cache.as_ref().and_then(|c| c.entry(parent, name)) {
            self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
            return Ok(Some(ino));
        }
        let row = self.opt(
            "SELECT d.ino, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, i.rdev, i.atime_s, \
             i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target, \
             (SELECT COALESCE(SUM(o.count), 0)::BIGINT FROM opens o WHERE o.ino = d.ino), \
             EXISTS (SELECT 1 FROM extents e WHERE e.ino = d.ino), \
             EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), EXISTS (SELECT 1 FROM policies y WHERE y.ino = d.ino) \
             FROM dentries d LEFT JOIN inodes i ON i.ino = d.ino WHERE d.parent = $1 AND d.name = $2",
            &[&(parent as i64), &name],
        )?;
        self.entry_seen(parent, name, row.as_ref(), 0)
    }

    /// Asks for everything `want` names that this transaction has not seen yet, in
    /// one round trip.
    fn prefetch(&mut self, want: Prefetch<'_>) -> Result<(), MetaError> {
        if let Some((parent, name)) = want.entry {
            self.assume_entry(parent, name)?;
        }
        if let (true, Some((session, ino)), Some((_, start, end))) = (want.writing, want.open, want.extents) {
            self.assume_data_write(session, ino, start, end)?;
        }
        // A read finds the directory and its entry in memory if its meta keeps them:
        // nothing to ask for then (the rest comes from the kept rows or the server).
        if let (Some(cache), Some((parent, name))) = (&self.cache, want.entry)
            && !self.seen.inodes.contains_key(&parent)
            && let Some(dir) = cache.inode(parent)
        {
            self.seen.inodes.insert(parent, Some(dir));
            if let Some(ino) = cache.entry(parent, name) {
                self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
            }
        }
        let seen = &self.seen;
        let entry = want.entry.filter(|&(parent, name)| {
            !seen.inodes.contains_key(&parent) && !seen.dentries.contains_key(&(parent, name.to_vec()))
        });
        let session = want.session.filter(|id| !seen.sessions.contains_key(id));
        let open = want.open.filter(|key| !seen.opens.contains_key(key) && seen.open_counts.get(&key.1) != Some(&0));
        let extents = want.extents.filter(|(ino, start, end)| {
            !seen.no_extents.contains(ino) && seen.extents.get(ino).is_none_or(|k| k.within(*start, *end).is_none())
        });
        let policies = want.policies.filter(|ino| !seen.no_policies && !seen.policies.contains_key(ino));

        // The entry's or the open's statement brings the session along.
        let session_along = session.filter(|&s| entry.is_some() || open.is_some_and(|(o, _)| o == s));
        let session = session.filter(|_| session_along.is_none());
        let (parent, name) = entry.map_or((0, &[][..]), |(p, n)| (p as i64, n));
        let entry_session = session_along.map_or(0, |s| s as i64);
        let session_id = session.map_or(0, |s| s as i64);
        let (open_session, open_ino) = open.map_or((0, 0), |(s, i)| (s as i64, i as i64));
        let (extents_ino, extents_start, extents_end) =
            extents.map_or((0, 0, 0), |(ino, start, end)| (ino as i64, off(start), off(end)));
        let policies_ino = policies.map_or(0, |i| i as i64);
        let root = ROOT_INODE as i64;
        let entry_params: [&(dyn ToSql + Sync); 3] = [&parent, &name, &entry_session];
        // A point read's one statement (a lookup) needs none of the facts for a write.
        let entry_sql = if self.probe == Probe::Ready { ENTRY_READ_SQL } else { ENTRY_SQL };
        let session_params: [&(dyn ToSql + Sync); 1] = [&session_id];
        let open_params: [&(dyn ToSql + Sync); 2] = [&open_session, &open_ino];
        let extents_params: [&(dyn ToSql + Sync); 3] = [&extents_ino, &extents_start, &extents_end];
        let policies_params: [&(dyn ToSql + Sync); 2] = [&policies_ino, &root];
        let entry_extents = entry.filter(|_| want.entry_extents && self.probe == Probe::Off);
        let queries: Vec<(&'static str, Params<'_>)> = [
            entry.map(|_| (entry_sql, &entry_params[..])),
            entry_extents.map(|_| (ENTRY_EXTENTS_SQL, &entry_params[..2])),
            session.map(|_| (SESSION_SQL, &session_params[..])),
            open.map(|_| (OPEN_SQL, &open_params[..])),
            extents.map(|_| (EXTENTS_SQL, &extents_params[..])),
            policies.map(|_| (POLICIES_SQL, &policies_params[..])),
        ]
        .into_iter()
        .flatten()
        .collect();
        if queries.is_empty() {
            return Ok(());
        }
        let mut answers = self.query_all(&queries)?.into_iter();
        let mut next = || answers.next().expect("one answer per query");

        if let Some((parent, name)) = entry {
            match at_most_one(next(), entry_sql)? {
                None => {
                    self.seen.inodes.insert(parent, None);
                }
                Some(row) => {
                    self.seen.inodes.insert(parent, Some(inode_of(&row, 0)?));
                    self.entry_seen(parent, name, Some(&row), 17)?;
                    self.policies_exist_seen(&row, 39)?;
                    if let Some(id) = session_along {
                        self.seen.sessions.insert(id, session_of(&row, 40)?);
                    }
                }
            }
        }
        if let Some((parent, name)) = entry_extents {
            let rows = next();
            if let Some(Some(ino)) = self.seen.dentries.get(&(parent, name.to_vec())).copied()
                && !rows.is_empty()
            {
                let extents = rows.iter().map(|r| extent_of(r).map(|(_, e)| e)).collect::<Result<Vec<_>, _>>()?;
                self.seen.extents.insert(ino, KnownExtents { start: 0, end: u64::MAX, extents });
            }
        }
        if let Some(id) = session {
            let row = at_most_one(next(), SESSION_SQL)?;
            let session = match row {
                Some(r) => session_of(&r, 0)?,
                None => None,
            };
            self.seen.sessions.insert(id, session);
        }
        if let Some((session, ino)) = open {
            let row = at_most_one(next(), OPEN_SQL)?
                .ok_or_else(|| MetaError::Corrupt(format!("no row where one was expected: {OPEN_SQL}")))?;
            if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(ino) {
                let inode = match row.try_get::<_, Option<i64>>(2)? {
                    Some(_) => Some(inode_of(&row, 2)?),
                    None => None,
                };
                slot.insert(inode);
            }
            let o = match row.try_get::<_, Option<i64>>(0)? {
                Some(count) => OpenRow { count: count as u32, writable: row.try_get::<_, i64>(1)? != 0 },
                None => OpenRow::default(),
            };
            self.seen.opens.insert((session, ino), o);
            self.policies_exist_seen(&row, 19)?;
            self.seen.sessions.insert(session, session_of(&row, 20)?);
        }
        if let Some((ino, start, end)) = extents {
            let mut found = next().iter().map(|r| extent_of(r).map(|(_, e)| e)).collect::<Result<Vec<_>, _>>()?;
            if found.is_empty() && start == 0 && off(end) == i64::MAX {
                self.seen.no_extents.insert(ino);
            }
            found.retain(|e| e.end() > start);
            found.sort_by_key(|e| e.file_offset);
            self.seen.extents.insert(ino, KnownExtents { start, end, extents: found });
        }
        if let Some(ino) = policies {
            for r in &next() {
                let at = r.try_get::<_, i64>(0)? as u64;
                let policy = match r.try_get::<_, Option<String>>(1)? {
                    Some(sites) => Some(policy_of((sites, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?))?),
                    None => None,
                };
                self.seen.policies.entry(at).or_insert(policy);
                if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(at) {
                    let inode = match r.try_get::<_, Option<i64>>(5)? {
                        Some(_) => Some(inode_of(r, 5)?),
                        None => None,
                    };
                    slot.insert(inode);
                }
            }
            self.seen.policies.entry(ino).or_insert(None);
        }
        Ok(())
    }

    fn put_dentry(&mut self, parent: InodeId, name: &[u8], ino: InodeId, cookie: u64) -> Result<(), MetaError> {
        self.seen.dentries.insert((parent, name.to_vec()), Some(ino));
        if self.publish.is_some() {
            self.written.entries.insert((parent, name.to_vec()), Some(ino));
        }
        self.defer(
            "INSERT INTO dentries (parent, name, ino, cookie) VALUES ($1, $2, $3, $4)",
            vec![Box::new(parent as i64), Box::new(name.to_vec()), Box::new(ino as i64), Box::new(cookie as i64)],
        )
    }

    fn delete_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        self.seen.dentries.insert((parent, name.to_vec()), None);
        if self.publish.is_some() {
            self.written.entries.insert((parent, name.to_vec()), None);
        }
        self.defer(
            "DELETE FROM dentries WHERE parent = $1 AND name = $2",
            vec![Box::new(parent as i64), Box::new(name.to_vec())],
        )
    }

    /// Reads each entry's inode, and whether it has extended attributes, in the same
    /// statement: a listing's `get_inode`s, and the kernel's lookups and
    /// `security.capability` asks after it, then cost no round trip of their own.
    fn list_dentries(&mut self, parent: InodeId, after: u64, limit: u32) -> Result<Vec<DentryRow>, MetaError> {
        let rows = self.query(
            concat!(
                "SELECT d.name, d.ino, d.cookie, NOT EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), i.* \
                 FROM dentries d LEFT JOIN LATERAL (SELECT ",
                inode_cols!(),
                " FROM inodes WHERE inodes.ino = d.ino) i ON true \
                 WHERE d.parent = $1 AND d.cookie > $2 ORDER BY d.cookie LIMIT $3"
            ),
            &[&(parent as i64), &off(after), &i64::from(limit)],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let bare: bool = r.try_get(3)?;
            let row = DentryRow {
                name: r.try_get(0)?,
                ino: r.try_get::<_, i64>(1)? as u64,
                cookie: r.try_get::<_, i64>(2)? as u64,
                has_xattrs: !bare,
            };
            // What this transaction wrote itself is known already.
            if r.try_get::<_, Option<i64>>(4)?.is_some() && !self.seen.inodes.contains_key(&row.ino) {
                self.seen.inodes.insert(row.ino, Some(inode_of(r, 4)?));
                if bare {
                    self.seen.no_xattrs.insert(row.ino);
                }
            }
            self.seen.dentries.entry((parent, row.name.clone())).or_insert(Some(row.ino));
            out.push(row);
        }
        Ok(out)
    }

    fn extents_overlapping(&mut self, ino: InodeId, start: u64, end: u64) -> Result<Vec<Extent>, MetaError> {
        if start >= end || self.seen.no_extents.contains(&ino) {
            return Ok(Vec::new());
        }
        self.prefetch(Prefetch { extents: Some((ino, start, end)), ..Prefetch::default() })?;
        let known = self.seen.extents.get(&ino).and_then(|k| k.within(start, end));
        known.ok_or_else(|| MetaError::Internal(format!("the extents of inode {ino} were read but not kept")))
    }

    fn insert_extent(&mut self, ino: InodeId, e: &Extent) -> Result<(), MetaError> {
        self.seen.no_extents.remove(&ino);
        if let Some(known) = self.seen.extents.get_mut(&ino) {
            let at = known.extents.partition_point(|k| k.file_offset < e.file_offset);
            known.extents.insert(at, *e);
        }
        self.defer(
            "INSERT INTO extents (ino, file_offset, len, chunk, chunk_offset) VALUES ($1, $2, $3, $4, $5)",
            vec![
                Box::new(ino as i64),
                Box::new(off(e.file_offset)),
                Box::new(e.len as i64),
                Box::new(e.chunk.0.to_vec()),
                Box::new(e.chunk_offset as i64),
            ],
        )
    }

    fn delete_extent(&mut self, ino: InodeId, file_offset: u64) -> Result<(), MetaError> {
        if let Some(known) = self.seen.extents.get_mut(&ino) {
            known.extents.retain(|k| k.file_offset != file_offset);
        }
        self.defer(
            "DELETE FROM extents WHERE ino = $1 AND file_offset = $2",
            vec![Box::new(ino as i64), Box::new(off(file_offset))],
        )
    }

    fn list_extents(&mut self, after: Option<(InodeId, u64)>, limit: u32) -> Result<Vec<(InodeId, Extent)>, MetaError> {
        let (ino, offset) = match after {
            Some((ino, o)) => (ino as i64, off(o)),
            None => (i64::MIN, i64::MIN),
        };
        let rows = self.query(
            "SELECT ino, file_offset, len, chunk, chunk_offset FROM extents
             WHERE ino > $1 OR (ino = $1 AND file_offset > $2) ORDER BY ino, file_offset LIMIT $3",
            &[&ino, &offset, &i64::from(limit)],
        )?;
        rows.iter().map(extent_of).collect()
    }

    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, $2, 0)
             ON CONFLICT (id) DO UPDATE SET size = excluded.size",
            vec![Box::new(chunk.id.0.to_vec()), Box::new(chunk.size as i64)],
        )?;
        for node in &chunk.nodes {
            self.defer(
                "INSERT INTO chunk_nodes (chunk, node, cached) VALUES ($1, $2, 0)
                 ON CONFLICT (chunk, node) DO UPDATE SET cached = 0",
                vec![Box::new(chunk.id.0.to_vec()), Box::new(node.clone())],
            )?;
        }
        Ok(())
    }

    fn add_cached(&mut self, id: &ChunkId, size: u64, node: &str) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING",
            vec![Box::new(id.0.to_vec()), Box::new(size as i64)],
        )?;
        self.defer(
            "INSERT INTO chunk_nodes (chunk, node, cached) VALUES ($1, $2, 1) ON CONFLICT (chunk, node) DO NOTHING",
            vec![Box::new(id.0.to_vec()), Box::new(node.to_string())],
        )
    }

    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError> {
        self.defer(
            "INSERT INTO chunks (id, size, refcount) VALUES ($1, 0, $2)
             ON CONFLICT (id) DO UPDATE SET refcount = chunks.refcount + excluded.refcount",
            vec![Box::new(id.0.to_vec()), Box::new(delta)],
        )
    }

    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError> {
        let Some(row) = self.opt("SELECT size, refcount FROM chunks WHERE id = $1", &[&&id.0[..]])? else {
            return Ok(None);
        };
        let (size, refcount) = (row.try_get(0)?, row.try_get(1)?);
        Ok(Some(self.chunk_record(id, size, refcount)?))
    }

    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError> {
        let after: &[u8] = after.map(|a| &a.0[..]).unwrap_or(&[]);
        let rows = self.query(
            "SELECT id, size, refcount FROM chunks WHERE id > $1 ORDER BY id LIMIT $2",
            &[&after, &i64::from(limit)],
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id = chunk_id(row.try_get(0)?)?;
            out.push(self.chunk_record(&id, row.try_get(1)?, row.try_get(2)?)?);
        }
        Ok(out)
    }

    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError> {
        self.defer("DELETE FROM chunk_nodes WHERE chunk = $1", vec![Box::new(id.0.to_vec())])?;
        self.defer("DELETE FROM chunks WHERE id = $1", vec![Box::new(id.0.to_vec())])
    }

    fn remove_location(&mut self, id: &ChunkId, node: &str) -> Result<(), MetaError> {
        self.defer(
            "DELETE FROM chunk_nodes WHERE chunk = $1 AND node = $2 AND cached = 1",
            vec![Box::new(id.0.to_vec()), Box::new(node.to_string())],
        )
    }

    fn site_rtts(&mut self) -> Result<Vec<(String, String, u64)>, MetaError> {
        let rows = self.query("SELECT from_site, to_site, micros FROM site_rtts ORDER BY 1, 2", &[])?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get::<_, i64>(2)? as u64))).collect()
    }

    fn parents_of(&mut self, ino: InodeId) -> Result<Vec<InodeId>, MetaError> {
        let rows = self.query("SELECT DISTINCT parent FROM dentries WHERE ino = $1", &[&(ino as i64)])?;
        rows.iter().map(|r| Ok(r.try_get::<_, i64>(0)? as u64)).collect()
    }

    fn chunk_totals(&mut self) -> Result<(u64, u64), MetaError> {
        let row = self.one("SELECT COUNT(*), COALESCE(SUM(size), 0)::BIGINT FROM chunks", &[])?;
        Ok((row.try_get::<_, i64>(0)? as u64, row.try_get::<_, i64>(1)? as u64))
    }

    /// A read answers from what its meta keeps when that says the inode has none, and
    /// learns whether it has any at all when it asks (`SharedRows::bare`).
    fn get_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        if self.bare(ino) {
            return Ok(None);
        }
        let row = self.one(
            "SELECT (SELECT value FROM xattrs WHERE ino = $1 AND name = $2), EXISTS (SELECT 1 FROM xattrs WHERE ino = $1)",
            &[&(ino as i64), &name],
        )?;
        if !row.try_get::<_, bool>(1)? {
            self.seen.no_xattrs.insert(ino);
        }
        Ok(row.try_get(0)?)
    }

    fn set_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
        self.seen.no_xattrs.remove(&ino);
        self.written.bare.remove(&ino);
        self.defer(
            "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            vec![Box::new(ino as i64), Box::new(name.to_vec()), Box::new(value.to_vec())],
        )
    }

    fn list_xattrs(&mut self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        if self.bare(ino) {
            return Ok(Vec::new());
        }
        let rows = self.query("SELECT name FROM xattrs WHERE ino = $1 ORDER BY name", &[&(ino as i64)])?;
        if rows.is_empty() {
            self.seen.no_xattrs.insert(ino);
        }
        Ok(rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool, MetaError> {
        Ok(self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? > 0)
    }

    fn delete_all_xattrs(&mut self, ino: InodeId) -> Result<(), MetaError> {
        if !self.seen.no_xattrs.insert(ino) {
            return Ok(());
        }
        self.defer("DELETE FROM xattrs WHERE ino = $1", vec![Box::new(ino as i64)])
    }

    fn orphans(&mut self) -> Result<Vec<InodeId>, MetaError> {
        let rows = self.query("SELECT ino FROM inodes WHERE nlink = 0 AND kind <> $1", &[&kind_code(FileKind::Dir)])?;
        Ok(rows.iter().map(|r| r.try_get::<_, i64>(0).map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_session(&mut self, s: &SessionRow) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO sessions (id, site, host, pid, purpose, last_seen, owner) VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET site = excluded.site, host = excluded.host, pid = excluded.pid,
             purpose = excluded.purpose, last_seen = excluded.last_seen, owner = excluded.owner",
            &[
                &(s.id as i64),
                &s.info.site,
                &s.info.host,
                &i64::from(s.info.pid),
                &s.info.purpose,
                &s.last_seen_ms,
                &s.owner,
            ],
        )?;
        self.seen.sessions.insert(s.id, Some(s.clone()));
        Ok(())
    }

    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError> {
        self.prefetch(Prefetch { session: Some(id), ..Prefetch::default() })?;
        Ok(self.seen.sessions.get(&id).cloned().flatten())
    }

    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError> {
        let rows =
            self.query("SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions ORDER BY id", &[])?;
        rows.iter()
            .map(|r| session_of(r, 0)?.ok_or_else(|| MetaError::Corrupt("a session without id".into())))
            .collect()
    }

    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError> {
        self.exec("DELETE FROM sessions WHERE id = $1", &[&(id as i64)])?;
        self.seen.sessions.insert(id, None);
        Ok(())
    }

    fn locks_on(&mut self, ino: InodeId) -> Result<Vec<Held>, MetaError> {
        let rows = self.query(
            "SELECT session, owner, range_start, range_end, is_write, pid FROM locks WHERE ino = $1",
            &[&(ino as i64)],
        )?;
        rows.iter()
            .map(|r| {
                let int = |i: usize| r.try_get::<_, i64>(i);
                Ok(Held {
                    session: int(0)? as u64,
                    owner: int(1)? as u64,
                    start: int(2)? as u64,
                    end: int(3)? as u64,
                    write: int(4)? != 0,
                    pid: int(5)? as u32,
                })
            })
            .collect()
    }

    fn put_locks(&mut self, ino: InodeId, held: &[Held]) -> Result<(), MetaError> {
        self.exec("DELETE FROM locks WHERE ino = $1", &[&(ino as i64)])?;
        for h in held {
            // u64 values (an owner, an end of u64::MAX) are kept bit for bit in the BIGINT column.
            self.exec(
                "INSERT INTO locks (ino, session, owner, range_start, range_end, is_write, pid)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &(ino as i64),
                    &(h.session as i64),
                    &(h.owner as i64),
                    &(h.start as i64),
                    &(h.end as i64),
                    &i64::from(h.write),
                    &i64::from(h.pid),
                ],
            )?;
        }
        Ok(())
    }

    fn delete_session_locks(&mut self, session: SessionId) -> Result<(), MetaError> {
        self.exec("DELETE FROM locks WHERE session = $1", &[&(session as i64)])?;
        Ok(())
    }

    /// Reads the inode in the same round trip (a release goes on to check it).
    fn get_open(&mut self, session: SessionId, ino: InodeId) -> Result<OpenRow, MetaError> {
        if self.seen.open_counts.get(&ino) == Some(&0) {
            return Ok(OpenRow::default());
        }
        self.prefetch(Prefetch { open: Some((session, ino)), ..Prefetch::default() })?;
        Ok(self.seen.opens.get(&(session, ino)).copied().unwrap_or_default())
    }

    /// Without reading the record when the kept rows hold the inode with links (the
    /// release then reclaims nothing; `LINKED_GUARD_SQL` checks it at the server): the
    /// record is counted down at the server.
    fn drop_open(&mut self, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
        let linked = self.kept_untouched(ino).filter(|i| i.attr.nlink > 0 || i.attr.kind == FileKind::Dir);
        let (Some(inode), false) = (linked, self.seen.opens.contains_key(&(session, ino))) else {
            return drop_open_read(self, session, ino);
        };
        self.defer(LINKED_GUARD_SQL, inode_params(&inode))?;
        self.assume_inode(inode);
        self.seen.open_counts.remove(&ino);
        // One statement: its two parts see the same snapshot, so a record is either
        // deleted (its last open) or counted down, never both.
        self.defer(
            "WITH last AS (DELETE FROM opens WHERE session = $1 AND ino = $2 AND count <= 1)
             UPDATE opens SET count = count - 1 WHERE session = $1 AND ino = $2 AND count > 1",
            vec![Box::new(session as i64), Box::new(ino as i64)],
        )
    }

    fn put_open(&mut self, session: SessionId, ino: InodeId, open: OpenRow) -> Result<(), MetaError> {
        self.seen.open_counts.remove(&ino);
        self.seen.opens.insert((session, ino), open);
        if open.count == 0 {
            self.defer(
                "DELETE FROM opens WHERE session = $1 AND ino = $2",
                vec![Box::new(session as i64), Box::new(ino as i64)],
            )
        } else {
            self.defer(
                "INSERT INTO opens (session, ino, count, writable) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session, ino) DO UPDATE SET count = excluded.count, writable = excluded.writable",
                vec![
                    Box::new(session as i64),
                    Box::new(ino as i64),
                    Box::new(i64::from(open.count)),
                    Box::new(i64::from(open.writable)),
                ],
            )
        }
    }

    fn count_opens(&mut self, ino: InodeId) -> Result<u64, MetaError> {
        if let Some(&n) = self.seen.open_counts.get(&ino) {
            return Ok(n);
        }
        let row = self.one("SELECT COALESCE(SUM(count), 0)::BIGINT FROM opens WHERE ino = $1", &[&(ino as i64)])?;
        let n = row.try_get::<_, i64>(0)? as u64;
        self.seen.open_counts.insert(ino, n);
        Ok(n)
    }

    fn delete_session_opens(&mut self, session: SessionId) -> Result<Vec<InodeId>, MetaError> {
        self.seen.open_counts.clear();
        self.seen.opens.clear();
        let rows = self.query("DELETE FROM opens WHERE session = $1 RETURNING ino", &[&(session as i64)])?;
        Ok(rows.iter().map(|r| r.try_get::<_, i64>(0).map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_node(&mut self, n: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO nodes (id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (id) DO UPDATE SET store_id = excluded.store_id, site = excluded.site, addr = excluded.addr,
             capacity = excluded.capacity, used = excluded.used, chunk_count = excluded.chunk_count,
             cache_bytes = excluded.cache_bytes, last_seen = excluded.last_seen",
            &[
                &n.id,
                &n.store_id,
                &n.site,
                &n.addr,
                &(n.capacity_bytes as i64),
                &(n.used_bytes as i64),
                &(n.chunk_count as i64),
                &(n.cache_bytes as i64),
                &last_seen_ms,
            ],
        )?;
        for (to, micros) in &n.site_rtts {
            self.exec(
                "INSERT INTO site_rtts (from_site, to_site, micros) VALUES ($1, $2, $3)
                 ON CONFLICT (from_site, to_site) DO UPDATE SET micros = excluded.micros",
                &[&n.site, to, &(*micros as i64)],
            )?;
        }
        Ok(())
    }

    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError> {
        self.opt(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes WHERE id = $1",
            &[&id],
        )?
        .map(|r| node_of(&r))
        .transpose()
    }

    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError> {
        let rows = self.query(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes ORDER BY id",
            &[],
        )?;
        rows.iter().map(node_of).collect()
    }

    /// The policy is looked for up the chain of parents (`effective_policy`): the
    /// ancestors' policies and inodes come along in the same round trip.
    fn get_policy(&mut self, ino: InodeId) -> Result<Option<Policy>, MetaError> {
        if self.seen.no_policies {
            return Ok(None);
        }
        self.prefetch(Prefetch { policies: Some(ino), ..Prefetch::default() })?;
        Ok(self.seen.policies.get(&ino).cloned().flatten())
    }

    fn may_have_policies(&mut self) -> Result<bool, MetaError> {
        Ok(!self.seen.no_policies)
    }

    fn put_policy(&mut self, ino: InodeId, p: &Policy) -> Result<(), MetaError> {
        self.seen.no_policies = false;
        self.defer(
            "INSERT INTO policies (ino, sites, copies, mode, rpo_secs) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (ino) DO UPDATE SET sites = excluded.sites, copies = excluded.copies,
             mode = excluded.mode, rpo_secs = excluded.rpo_secs",
            vec![
                Box::new(ino as i64),
                Box::new(p.sites.join(",")),
                Box::new(p.copies as i64),
                Box::new(p.mode.to_string()),
                Box::new(p.rpo_secs as i64),
            ],
        )?;
        self.seen.policies.insert(ino, Some(p.clone()));
        Ok(())
    }

    fn delete_policy(&mut self, ino: InodeId) -> Result<(), MetaError> {
        if self.seen.policies.insert(ino, None) != Some(None) {
            self.defer("DELETE FROM policies WHERE ino = $1", vec![Box::new(ino as i64)])?;
        }
        Ok(())
    }

    fn list_policies(&mut self) -> Result<Vec<(InodeId, Policy)>, MetaError> {
        let rows = self.query("SELECT sites, copies, mode, rpo_secs, ino FROM policies ORDER BY ino", &[])?;
        rows.iter()
            .map(|r| {
                let policy = policy_of((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))?;
                Ok((r.try_get::<_, i64>(4)? as u64, policy))
            })
            .collect()
    }

    fn set_drained(&mut self, node: &str, drained: bool) -> Result<(), MetaError> {
        if drained {
            self.exec("INSERT INTO drained_nodes (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", &[&node])?;
        } else {
            self.exec("DELETE FROM drained_nodes WHERE id = $1", &[&node])?;
        }
        Ok(())
    }

    fn drained_nodes(&mut self) -> Result<Vec<String>, MetaError> {
        let rows = self.query("SELECT id FROM drained_nodes ORDER BY id", &[])?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    fn get_admission(&mut self, node: &str) -> Result<Option<bool>, MetaError> {
        let rows = self.query("SELECT admitted FROM node_admissions WHERE id = $1", &[&node])?;
        rows.first().map(|r| Ok(r.try_get::<_, i64>(0)? != 0)).transpose()
    }

    fn set_admission(&mut self, node: &str, admitted: bool) -> Result<(), MetaError> {
        self.exec(
            "INSERT INTO node_admissions (id, admitted) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET admitted = excluded.admitted",
            &[&node, &i64::from(admitted)],
        )?;
        Ok(())
    }

    fn put_join_token(&mut self, hash: &[u8; 32], expires_ms: i64) -> Result<(), MetaError> {
        self.exec("INSERT INTO join_tokens (hash, expires) VALUES ($1, $2)", &[&&hash[..], &expires_ms])?;
        Ok(())
    }

    fn take_join_token(&mut self, hash: &[u8; 32]) -> Result<Option<i64>, MetaError> {
        let rows = self.query("DELETE FROM join_tokens WHERE hash = $1 RETURNING expires", &[&&hash[..]])?;
        rows.first().map(|r| Ok(r.try_get::<_, i64>(0)?)).transpose()
    }

    fn delete_node(&mut self, node: &str) -> Result<(), MetaError> {
        self.exec("DELETE FROM nodes WHERE id = $1", &[&node])?;
        self.exec("DELETE FROM drained_nodes WHERE id = $1", &[&node])?;
        self.exec("DELETE FROM chunk_nodes WHERE node = $1", &[&node])?;
        Ok(())
    }

    fn principal(&mut self, name: &str) -> Result<Option<u32>, MetaError> {
        let row = self.opt("SELECT id FROM principals WHERE name = $1", &[&name])?;
        Ok(row.map(|r| r.try_get::<_, i64>(0)).transpose()?.map(|id| id as u32))
    }

    fn add_principal(&mut self, name: &str) -> Result<u32, MetaError> {
        // Numbered like SQLite's rowid (principals are never deleted, so never reused),
        // which keeps the numbers of a migrated database.
        let row = self.one(
            "INSERT INTO principals (id, name) SELECT COALESCE(MAX(id), 0) + 1, $1 FROM principals RETURNING id",
            &[&name],
        )?;
        Ok(row.try_get::<_, i64>(0)? as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::test_config;
    use crate::service::{DEFAULT_DB_TIMEOUT, MetaConfig, MetaService};
    use proto::error::ErrorCode;
    use proto::meta::{Create, Made, MetaReply, MetaRequest, NewNode, ReadDir};
    use proto::types::ROOT_INODE;
    use std::sync::Arc;
    use testkit::postgres::PgServer;

    fn raw(url: &str) -> postgres::Client {
        postgres::Client::connect(url, postgres::NoTls).expect("connect")
    }

    #[test]
    fn an_empty_or_foreign_database_is_refused_with_a_reason() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("an empty database must be refused");
        assert!(matches!(err, MetaError::NotFormatted { .. }), "{err}");
        assert!(err.to_string().contains("is empty") && err.to_string().contains("--init"), "{err}");
        let foreign = server.create_database();
        raw(&foreign).batch_execute("CREATE TABLE t (x INTEGER)").unwrap();
        let err =
            open(&foreign, None, true, None, DEFAULT_DB_TIMEOUT).err().expect("a foreign database must be refused");
        assert!(err.to_string().contains("not a Locus metadata database"), "{err}");
        let missing = server.url("no_such_database");
        let err =
            open(&missing, None, true, None, DEFAULT_DB_TIMEOUT).err().expect("a missing database must be refused");
        assert!(matches!(err, MetaError::Connect { .. }) && err.to_string().contains("no_such_database"), "{err}");
        let err = open("postgres://locus:secret@127.0.0.1:1/x", None, true, None, DEFAULT_DB_TIMEOUT)
            .err()
            .expect("nothing listens on port 1");
        assert!(!err.to_string().contains("secret"), "the password is never shown: {err}");
    }

    #[test]
    fn reopen_keeps_the_cluster_id_and_a_newer_schema_is_refused() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let first = open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id;
        assert_eq!(first.len(), 32);
        assert_eq!(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id, first);
        raw(&url).execute("UPDATE meta_version SET version = $1", &[&(SCHEMA_VERSION + 1)]).unwrap();
        let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("a newer schema must be refused");
        assert!(matches!(err, MetaError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1), "{err}");
    }

    #[test]
    fn an_older_schema_is_upgraded_and_one_before_postgresql_is_refused() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let first = open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id;
        raw(&url).execute("UPDATE meta_version SET version = $1", &[&FIRST_UPGRADABLE]).unwrap();
        assert_eq!(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id, first);
        let version: i64 = raw(&url).query_one("SELECT version FROM meta_version", &[]).unwrap().get(0);
        assert_eq!(version, SCHEMA_VERSION);
        raw(&url).execute("UPDATE meta_version SET version = $1", &[&(FIRST_UPGRADABLE - 1)]).unwrap();
        let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("no upgrade from before PostgreSQL");
        assert!(matches!(err, MetaError::SchemaUnknown { found, .. } if found == FIRST_UPGRADABLE - 1), "{err}");
    }

    /// A 0644 file `name` in the root.
    fn new_file(name: &str) -> Create {
        Create { parent: ROOT_INODE, name: name.into(), node: NewNode::File, mode: 0o644, umask: 0, exclusive: true }
    }

    fn create(s: &Arc<MetaService>, name: &str) -> Result<MetaReply, ErrorCode> {
        s.handle_blocking(MetaRequest::Create(new_file(name))).map_err(|e| e.code)
    }

    /// The server closes every connection of meta (as a restart or an administrator
    /// would): each pooled connection fails at most one request, then connects again.
    #[test]
    fn connections_closed_by_the_server_are_opened_again() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let meta = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
        create(&meta, "a").unwrap();
        let killed: i64 = raw(&url)
            .query_one(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND application_name <> 'locus-meta-listener'",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(killed, 1 + READERS as i64, "the writer and every reader");
        let lookup = || {
            meta.handle_blocking(MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: b"a".to_vec() }))
        };
        let failed = (0..3 * READERS).filter(|_| lookup().is_err()).count();
        assert!(failed <= READERS, "{failed} lookups failed");
        assert!(lookup().is_ok(), "reads work again");
        let write = (0..2).map(|i| create(&meta, &format!("b{i}"))).collect::<Vec<_>>();
        assert!(write[1].is_ok(), "writes work again after at most one failure: {write:?}");
    }

    /// A primary holding a formatted Locus database and a streaming standby of it: the
    /// two servers, the primary's URL and the standby's URL of the same database.
    fn formatted_with_standby() -> (PgServer, String, PgServer, String) {
        let primary = PgServer::start();
        let url = primary.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let standby = primary.start_standby();
        let standby_url = standby.url(url.rsplit('/').next().unwrap());
        (primary, url, standby, standby_url)
    }

    /// A meta at a second site writes to the primary and reads from a hot standby:
    /// every read after a write sees it (read-your-writes), and the reads are served
    /// by the standby.
    #[test]
    fn reads_at_a_standby_see_this_metas_writes() {
        let (_primary, url, _standby, read_url) = formatted_with_standby();
        let url_of_primary = url.clone();
        let config = MetaConfig { db_url: url, read_db_url: Some(read_url.clone()), ..test_config(Default::default()) };
        let meta = MetaService::open(&config).unwrap();
        for i in 0..50 {
            let name = format!("f{i}");
            let MetaReply::Made(Made { attr: made, .. }) = create(&meta, &name).unwrap() else {
                panic!("expected Made")
            };
            let req = MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into_bytes() });
            assert_eq!(meta.handle_blocking(req).unwrap(), MetaReply::Attr(made), "read-your-writes");
        }
        let mut at_standby = raw(&read_url);
        let readers: i64 = at_standby
            .query_one("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'locus-meta'", &[])
            .unwrap()
            .get(0);
        assert_eq!(readers, READERS as i64, "the read connections are at the standby");
        // With replay paused, a row removed behind meta's back on the primary is
        // still found: the read was served by the standby.
        at_standby.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
        raw(&url_of_primary).batch_execute("DELETE FROM dentries WHERE name = 'f0'::bytea").unwrap();
        let lookup = |name: &str| {
            meta.handle_blocking(MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into() }))
        };
        assert!(lookup("f0").is_ok(), "the paused standby answers");
        // A write the paused standby cannot replay: its writer's next read goes to the primary.
        create(&meta, "late").unwrap();
        assert!(lookup("late").is_ok(), "read-your-writes while the standby lags");
        at_standby.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
    }

    /// Waits until the standby at `standby_url` has replayed everything committed at
    /// the primary at `url` so far.
    fn replayed(url: &str, standby_url: &str) {
        let lsn: String = raw(url).query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0);
        let mut standby = raw(standby_url);
        soon("the standby's replay", || {
            standby.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn]).unwrap().get(0)
        });
    }

    /// A meta at a standby keeps what it reads there (a change made in SQL behind every
    /// meta's back stays unseen), but never puts back what another meta's notification
    /// dropped while the standby had not yet replayed that meta's commit.
    #[test]
    fn a_meta_at_a_standby_keeps_rows_but_not_what_a_notification_dropped() {
        let (_primary, url, standby, standby_url) = formatted_with_standby();
        let at_a = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
        let config = MetaConfig {
            db_url: url.clone(),
            read_db_url: Some(standby_url.clone()),
            ..test_config(Default::default())
        };
        let at_b = MetaService::open(&config).unwrap();
        listening(&url, 2);
        create(&at_a, "kept").unwrap();
        create(&at_a, "gone").unwrap();
        replayed(&url, &standby_url);
        lookup(&at_b, "kept").unwrap();
        lookup(&at_b, "gone").unwrap();
        raw(&url).execute("DELETE FROM dentries WHERE name = 'kept'::bytea", &[]).unwrap();
        replayed(&url, &standby_url);
        assert!(lookup(&at_b, "kept").is_ok(), "B answers the row it read at the standby from memory");

        let mut at_standby = raw(&standby_url);
        at_standby.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
        let unlink = MetaRequest::Unlink(proto::meta::Unlink { parent: ROOT_INODE, name: b"gone".to_vec() });
        at_a.handle_blocking(unlink).unwrap();
        // The notification reaches B at once; the paused standby still has the entry,
        // which B may answer (replication lag) but must not keep.
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..3 {
            assert!(lookup(&at_b, "gone").is_ok(), "the paused standby still has it");
        }
        at_standby.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
        replayed(&url, &standby_url);
        assert_eq!(lookup(&at_b, "gone"), Err(ErrorCode::NotFound), "B kept a row the notification had dropped");
        drop(standby);
    }

    /// A meta at a standby's site racing a meta at the primary to create the same names:
    /// exactly one create of each wins, and B's conflicts (which fail its COMMIT, sent
    /// through tokio-postgres to learn its WAL position) never break a connection.
    #[test]
    fn a_meta_at_a_standby_loses_races_without_losing_its_connections() {
        let (_primary, url, _standby, standby_url) = formatted_with_standby();
        let at_a = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
        let config =
            MetaConfig { db_url: url.clone(), read_db_url: Some(standby_url), ..test_config(Default::default()) };
        let at_b = MetaService::open(&config).unwrap();
        let started: String = raw(&url).query_one("SELECT now()::text", &[]).unwrap().get(0);
        race_to_create(&[&at_a, &at_b], 40);
        let reconnected: i64 = raw(&url)
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'locus-meta' \
                 AND backend_start > $1::text::timestamptz",
                &[&started],
            )
            .unwrap()
            .get(0);
        assert_eq!(reconnected, 0, "a meta connected again during the race");
    }

    /// A proxy on 127.0.0.1 to `upstream` (`testkit::relay`), which passes the server's
    /// messages on whole but holds back what follows an ErrorResponse for `pause`, as a
    /// WAN may deliver the ReadyForQuery after an error in a later read; its port.
    fn proxy_pausing_after_errors(upstream: (String, u16), pause: Duration) -> u16 {
        use std::io::Write;
        use testkit::relay::{Direction, forward, relay};
        let addr = relay(format!("{}:{}", upstream.0, upstream.1), move |direction| {
            if direction == Direction::Up {
                return forward();
            }
            let mut held = Vec::new();
            Box::new(move |bytes, out| {
                held.extend_from_slice(bytes);
                // Every whole message (a type byte, then a length that counts itself).
                while held.len() >= 5 {
                    let len = 1 + u32::from_be_bytes(held[1..5].try_into().unwrap()) as usize;
                    if held.len() < len {
                        break;
                    }
                    let message: Vec<u8> = held.drain(..len).collect();
                    out.write_all(&message)?;
                    if message[0] == b'E' {
                        std::thread::sleep(pause);
                    }
                }
                Ok(())
            })
        });
        addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the relay's port")
    }

    /// After a request (or a prepare) sent through tokio-postgres fails, the server's ReadyForQuery
    /// may arrive in a later read than its error: the next pipeline must not be sent
    /// by hand, whose reader would take that ReadyForQuery for its own answer, fail
    /// ("fewer answers than statements") and drop the connection (and with it a
    /// meta's kept rows), as a meta at a standby's site did behind a 50 ms WAN.
    #[test]
    fn the_pipeline_after_a_failed_request_skips_its_late_ready_for_query() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let (config, _) = parse(&url).unwrap();
        let upstream = match (&config.get_hosts()[0], config.get_ports()[0]) {
            (tokio_postgres::config::Host::Tcp(host), port) => (host.clone(), port),
            other => panic!("the test server listens on TCP: {other:?}"),
        };
        let port = proxy_pausing_after_errors(upstream.clone(), Duration::from_millis(300));
        let proxied = url.replace(&format!(":{}/", upstream.1), &format!(":{port}/"));
        let (config, shown) = parse(&proxied).unwrap();
        let mut conn = connect(&config, &shown, Some(Duration::from_secs(10))).unwrap();
        // BEGIN and COMMIT are boundaries, which go by hand when they can.
        let begin_and_commit = |conn: &mut PgConn, after: &str| {
            conn.boundary(&["BEGIN"]).unwrap_or_else(|e| panic!("the first pipeline after {after}: {e:?}"));
            conn.boundary(&["COMMIT"]).unwrap_or_else(|e| panic!("a pipeline by hand after {after}: {e:?}"));
        };
        let err = conn.query("SELECT 1 / $1::INTEGER", &[&0i32]).expect_err("a division by zero");
        assert!(err.to_string().contains("division by zero"), "{err}");
        begin_and_commit(&mut conn, "a failed statement");
        let err = conn.query("SELECT no_such_column", &[]).expect_err("an unknown column");
        assert!(err.to_string().contains("no_such_column"), "{err}");
        begin_and_commit(&mut conn, "a failed prepare");
        let row = conn.one("SELECT 40 + $1::INTEGER", &[&2i32]).expect("a query after them");
        assert_eq!(row.get::<_, i32>(0), 42);
    }

    /// One thread per meta of `metas` creates `f0`..`f{names}` in the root, all at
    /// once: each name is created exactly once, every other try answers EEXIST.
    fn race_to_create(metas: &[&Arc<MetaService>], names: usize) {
        let barrier = std::sync::Barrier::new(metas.len());
        let outcomes: Vec<Vec<Result<MetaReply, ErrorCode>>> = std::thread::scope(|scope| {
            let runs: Vec<_> = metas
                .iter()
                .map(|meta| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        (0..names).map(|n| create(meta, &format!("f{n}"))).collect::<Vec<_>>()
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for n in 0..names {
            let won = outcomes.iter().filter(|o| o[n].is_ok()).count();
            let exists = outcomes.iter().filter(|o| o[n] == Err(ErrorCode::Exists)).count();
            let all = outcomes.iter().map(|o| &o[n]).collect::<Vec<_>>();
            assert_eq!((won, exists), (1, metas.len() - 1), "name f{n}: {all:?}");
        }
    }

    /// Two metas over one database, each creating the same names at the same time:
    /// SERIALIZABLE plus whole-transaction retry lets exactly one create of each name
    /// win; the other sees the winner's entry and answers EEXIST.
    #[test]
    fn two_metas_racing_to_create_one_name_exactly_one_wins() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let config = MetaConfig { db_url: url, ..test_config(Default::default()) };
        let metas = [MetaService::open(&config).unwrap(), MetaService::open(&config).unwrap()];
        const NAMES: usize = 60;
        race_to_create(&[&metas[0], &metas[1], &metas[0], &metas[1]], NAMES);
        let MetaReply::Entries(entries) =
            metas[1].handle_blocking(MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 1000 })).unwrap()
        else {
            panic!("expected entries")
        };
        assert_eq!(entries.len(), NAMES, "no entry lost or duplicated");
    }

    /// Waits until every meta over `url` listens for the others' changes (each keeps
    /// rows only from then on).
    fn listening(url: &str, metas: i64) {
        for _ in 0..500 {
            let n: i64 = raw(url)
                .query_one(
                    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
                     AND application_name = 'locus-meta-listener'
                     AND (query LIKE 'LISTEN%' OR query LIKE '%pg_locks%' OR query LIKE '%wal_insert_lsn%')",
                    &[],
                )
                .unwrap()
                .get(0);
            if n == metas {
                // The listener marks itself listening right after its LISTEN returns.
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the metas never listened for each other's changes");
    }

    /// `N` metas over a new database of the shared server, each keeping rows, and the
    /// database's URL (the server lives as long as the first).
    fn keeping_metas<const N: usize>() -> (Arc<PgServer>, [Arc<MetaService>; N], String) {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        let config = MetaConfig { db_url: url.clone(), ..test_config(Default::default()) };
        let metas = std::array::from_fn(|_| MetaService::open(&config).unwrap());
        listening(&url, N as i64);
        (server, metas, url)
    }

    fn getattr(s: &Arc<MetaService>, ino: InodeId) -> Result<Attr, ErrorCode> {
        let reply = s.handle_blocking(MetaRequest::GetAttr(proto::meta::GetAttr { ino })).map_err(|e| e.code)?;
        Ok(Attr::try_from(reply).expect("an Attr"))
    }

    fn lookup(s: &Arc<MetaService>, name: &str) -> Result<Attr, ErrorCode> {
        let req = MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into() });
        Ok(Attr::try_from(s.handle_blocking(req).map_err(|e| e.code)?).expect("an Attr"))
    }

    /// Polls `f` until it holds, for at most 5 s.
    fn soon(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "{what} did not happen within 5 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A meta answers reads of rows it read or wrote from memory (a change made behind
    /// every meta's back, in SQL, stays unseen), reads its own writes at once, and drops
    /// what another meta changes as soon as that meta's notification arrives; when its
    /// listener's connection is cut it drops everything it kept.
    #[test]
    fn kept_rows_follow_every_metas_writes() {
        let (_server, [one, two], url) = keeping_metas();
        let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
        raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
        assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o644, "the creating meta kept f's row");
        assert_eq!(getattr(&two, f.ino).unwrap().mode & 0o777, 0o600, "the other read it from the server");
        assert_eq!(lookup(&two, "f").unwrap().mode & 0o777, 0o600);

        // A chmod through the first: it reads it at once, the second once notified.
        let set = proto::meta::AttrChanges { mode: Some(0o640), ..Default::default() };
        one.handle_blocking(MetaRequest::SetAttr(proto::meta::SetAttr { ino: f.ino, set, session: None })).unwrap();
        assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o640);
        soon("the chmod reaching the other meta", || getattr(&two, f.ino).unwrap().mode & 0o777 == 0o640);
        assert_eq!(lookup(&two, "f").unwrap().mode & 0o777, 0o640);

        // An unlink through the second: the first stops finding the name.
        assert_eq!(lookup(&one, "f").unwrap().ino, f.ino);
        two.handle_blocking(MetaRequest::Unlink(proto::meta::Unlink { parent: ROOT_INODE, name: b"f".to_vec() }))
            .unwrap();
        assert_eq!(lookup(&two, "f"), Err(ErrorCode::NotFound), "the unlinking meta at once");
        soon("the unlink reaching the other meta", || lookup(&one, "f") == Err(ErrorCode::NotFound));

        // Cut the listeners: every kept row goes, so a change behind their backs shows.
        let Ok(MetaReply::Made(Made { attr: g, .. })) = create(&one, "g") else { panic!("create g") };
        assert_eq!(getattr(&one, g.ino).unwrap().mode & 0o777, 0o644);
        raw(&url)
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()
                 AND application_name = 'locus-meta-listener'",
                &[],
            )
            .unwrap();
        raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(g.ino as i64)]).unwrap();
        soon("the first meta dropping its rows", || getattr(&one, g.ino).unwrap().mode & 0o777 == 0o600);
        listening(&url, 2);
        assert_eq!(getattr(&one, g.ino).unwrap().mode & 0o777, 0o600);
    }

    /// Which inodes have no extended attributes is kept with their rows (the kernel asks
    /// for `security.capability` before each write): a meta that created a file, or
    /// found it bare, answers from memory (an xattr added in SQL behind its back stays
    /// unseen), sees its own setxattr at once and another meta's once notified.
    #[test]
    fn knowledge_of_no_xattrs_follows_every_metas_writes() {
        let (_server, [one, two], url) = keeping_metas();
        let get = |s: &Arc<MetaService>, ino: InodeId| {
            let req = MetaRequest::GetXattr(proto::meta::GetXattr { ino, name: b"user.a".to_vec() });
            s.handle_blocking(req).map(|r| Vec::<u8>::try_from(r).expect("bytes")).map_err(|e| e.code)
        };
        let list = |s: &Arc<MetaService>, ino: InodeId| {
            let req = MetaRequest::ListXattr(proto::meta::ListXattr { ino });
            Vec::<Vec<u8>>::try_from(s.handle_blocking(req).unwrap()).expect("names")
        };
        let set = |s: &Arc<MetaService>, ino: InodeId, value: &[u8]| {
            let (name, value, mode) = (b"user.a".to_vec(), value.to_vec(), proto::meta::XattrMode::Any);
            s.handle_blocking(MetaRequest::SetXattr(proto::meta::SetXattr { ino, name, value, mode })).unwrap();
        };
        let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
        let Ok(MetaReply::Made(Made { attr: g, .. })) = create(&one, "g") else { panic!("create g") };
        raw(&url)
            .execute("INSERT INTO xattrs (ino, name, value) VALUES ($1, 'user.a', 'sql')", &[&(f.ino as i64)])
            .unwrap();
        assert_eq!(get(&one, f.ino), Err(ErrorCode::NoAttribute), "the creating meta knows f has none");
        assert!(list(&one, f.ino).is_empty());
        assert_eq!(get(&two, f.ino).unwrap(), b"sql", "the other asks the server");

        // A setxattr through the first: it reads it at once, the second once notified.
        assert_eq!(get(&two, g.ino), Err(ErrorCode::NoAttribute));
        assert!(list(&two, g.ino).is_empty(), "the second found g bare");
        set(&one, g.ino, b"one");
        assert_eq!(get(&one, g.ino).unwrap(), b"one");
        soon("the setxattr reaching the other meta", || get(&two, g.ino) == Ok(b"one".to_vec()));
        assert_eq!(list(&two, g.ino), vec![b"user.a".to_vec()]);

        // And through the second, on the file the first believes bare.
        set(&two, f.ino, b"two");
        soon("the setxattr reaching the first meta", || get(&one, f.ino) == Ok(b"two".to_vec()));
    }

    /// An unlink takes the directory, the entry and the file from the rows its meta
    /// keeps, and its guard catches every way the server's rows may differ (each
    /// changed here in SQL behind the meta's back): the unlink then runs again reading
    /// from the server, and does what those rows ask for.
    #[test]
    fn a_write_from_kept_rows_is_checked_at_the_server() {
        let (_server, [one], url) = keeping_metas();
        let mut sql = raw(&url);
        let made = |name: &str| {
            let Ok(MetaReply::Made(Made { attr, .. })) = create(&one, name) else { panic!("create {name}") };
            attr.ino as i64
        };
        let unlink = |name: &str| {
            let req = proto::meta::Unlink { parent: ROOT_INODE, name: name.as_bytes().to_vec() };
            one.handle_blocking(MetaRequest::Unlink(req)).map(drop).map_err(|e| e.code)
        };
        let count = |sql: &mut postgres::Client, query: &str, ino: i64| -> i64 {
            sql.query_one(query, &[&ino]).unwrap().get(0)
        };
        let (plain, open, xattr, policy, linked, became_dir) =
            (made("plain"), made("open"), made("xattr"), made("policy"), made("linked"), made("became-dir"));
        sql.execute("INSERT INTO opens (session, ino, count, writable) VALUES (7, $1, 1, 0)", &[&open]).unwrap();
        sql.execute("INSERT INTO xattrs (ino, name, value) VALUES ($1, 'user.a', 'v')", &[&xattr]).unwrap();
        sql.execute(
            "INSERT INTO policies (ino, sites, copies, mode, rpo_secs) VALUES ($1, 'a', 1, 'sync', 0)",
            &[&policy],
        )
        .unwrap();
        sql.execute("UPDATE inodes SET nlink = 2 WHERE ino = $1", &[&linked]).unwrap();
        sql.execute(
            "UPDATE inodes SET kind = $2, mode = 16877 WHERE ino = $1",
            &[&became_dir, &kind_code(FileKind::Dir)],
        )
        .unwrap();
        assert_eq!(getattr(&one, became_dir as u64).unwrap().kind, FileKind::File, "the kept row answers");

        for name in ["plain", "open", "xattr", "policy", "linked"] {
            unlink(name).unwrap_or_else(|e| panic!("unlink {name}: {e:?}"));
            assert_eq!(lookup(&one, name), Err(ErrorCode::NotFound));
        }
        let entries = sql.query_one("SELECT COUNT(*) FROM dentries WHERE parent = $1", &[&(ROOT_INODE as i64)]);
        assert_eq!(entries.unwrap().get::<_, i64>(0), 1, "only became-dir is left");
        let inode = "SELECT COUNT(*) FROM inodes WHERE ino = $1";
        assert_eq!(count(&mut sql, inode, plain), 0, "an unlinked file with no other link is gone");
        assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM inodes WHERE ino = $1 AND nlink = 0", open), 1, "kept open");
        assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM xattrs WHERE ino = $1", xattr), 0, "its xattrs went too");
        assert_eq!(count(&mut sql, inode, xattr), 0);
        assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM policies WHERE ino = $1", policy), 0, "its policy went too");
        assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM inodes WHERE ino = $1 AND nlink = 1", linked), 1);

        // The server's row is a directory: the unlink is refused, and the rows its
        // guard found out of date are no longer kept (a later read asks the server).
        assert_eq!(unlink("became-dir"), Err(ErrorCode::IsDir));
        assert_eq!(getattr(&one, became_dir as u64).unwrap().kind, FileKind::Dir, "the stale row was dropped");
    }

    /// A write of data at a file's end and a release take the inode from the rows
    /// their meta keeps and assume the session's one open for writing and no extent
    /// in the span; their guards catch every way the server's rows may differ (each
    /// changed here in SQL behind the meta's back), and the op then does what those
    /// rows ask for.
    #[test]
    fn data_writes_and_releases_from_kept_rows_are_checked_at_the_server() {
        use proto::meta::{CommitWrite, CreateOpen, Hello, OpenAccess, Release, SessionInfo, StoredChunk, Welcome};
        let (_server, [one], url) = keeping_metas();
        let mut sql = raw(&url);
        let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "/mnt".into() };
        let hello = MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info });
        let Ok(MetaReply::Welcome(Welcome { session, .. })) = one.handle_blocking(hello) else { panic!("hello") };
        let open_new = |name: &str| {
            let create = new_file(name);
            let access = OpenAccess { read: true, write: true };
            let Ok(MetaReply::Opened(o)) =
                one.handle_blocking(MetaRequest::CreateOpen(CreateOpen { create, session, access }))
            else {
                panic!("create {name}")
            };
            o.attr.ino
        };
        let chunk = |tag: u8| ChunkId([tag; 32]);
        let write = |ino: InodeId, file_offset: u64, len: u64, tag: u8| {
            let extents = vec![Extent { file_offset, len, chunk: chunk(tag), chunk_offset: 0 }];
            let chunks = vec![StoredChunk { id: chunk(tag), size: 1 << 20, nodes: vec!["n0".into()], receipt: None }];
            let req =
                CommitWrite { session, ino, extents, chunks, min_size: file_offset + len, mtime: Timestamp::now() };
            Attr::try_from(one.handle_blocking(MetaRequest::CommitWrite(req)).unwrap()).unwrap()
        };
        let release = |ino: InodeId| one.handle_blocking(MetaRequest::Release(Release { ino, session })).unwrap();
        let extents = |sql: &mut postgres::Client, ino: InodeId| -> Vec<(i64, i64, Vec<u8>)> {
            let rows = sql.query(
                "SELECT file_offset, len, chunk FROM extents WHERE ino = $1 ORDER BY file_offset",
                &[&(ino as i64)],
            );
            rows.unwrap().iter().map(|r| (r.get(0), r.get(1), r.get::<_, Vec<u8>>(2)[..1].to_vec())).collect()
        };
        let opens = |sql: &mut postgres::Client, ino: InodeId| -> Option<i64> {
            let row = sql.query_opt(
                "SELECT count FROM opens WHERE session = $1 AND ino = $2",
                &[&(session as i64), &(ino as i64)],
            );
            row.unwrap().map(|r| r.get(0))
        };

        // As the server's rows say: a first write and an append, then the release.
        let plain = open_new("plain");
        write(plain, 0, 10, 1);
        assert_eq!(write(plain, 10, 5, 2).size, 15);
        assert_eq!(extents(&mut sql, plain), vec![(0, 10, vec![1]), (10, 5, vec![2])]);
        release(plain);
        assert_eq!(opens(&mut sql, plain), None, "released");

        // The session has it open twice: the write goes on, and a release counts one down.
        let twice = open_new("twice");
        sql.execute("UPDATE opens SET count = 2 WHERE ino = $1", &[&(twice as i64)]).unwrap();
        write(twice, 0, 10, 3);
        release(twice);
        assert_eq!(opens(&mut sql, twice), Some(1), "one open left");

        // An extent the kept rows know nothing of lies in the span: the write replaces it.
        let hidden = open_new("hidden");
        sql.execute(
            "INSERT INTO extents (ino, file_offset, len, chunk, chunk_offset) VALUES ($1, 5, 10, $2, 0)",
            &[&(hidden as i64), &chunk(9).0.to_vec()],
        )
        .unwrap();
        sql.execute("INSERT INTO chunks (id, size, refcount) VALUES ($1, 1048576, 1)", &[&chunk(9).0.to_vec()])
            .unwrap();
        write(hidden, 0, 10, 4);
        assert_eq!(
            extents(&mut sql, hidden),
            vec![(0, 10, vec![4]), (10, 5, vec![9])],
            "the hidden extent was clipped"
        );

        // The file grew behind the meta's back: the write keeps the server's size.
        let grown = open_new("grown");
        sql.execute("UPDATE inodes SET size = 100 WHERE ino = $1", &[&(grown as i64)]).unwrap();
        assert_eq!(write(grown, 0, 10, 5).size, 100);

        // Unlinked behind the meta's back and open only here: the release reclaims it.
        let orphan = open_new("orphan");
        sql.execute("UPDATE inodes SET nlink = 0 WHERE ino = $1", &[&(orphan as i64)]).unwrap();
        sql.execute("DELETE FROM dentries WHERE ino = $1", &[&(orphan as i64)]).unwrap();
        release(orphan);
        let left: i64 =
            sql.query_one("SELECT COUNT(*) FROM inodes WHERE ino = $1", &[&(orphan as i64)]).unwrap().get(0);
        assert_eq!(left, 0, "the orphan was reclaimed");
    }

    /// A stopped server (SIGSTOP, as a hung machine would be) costs each request a
    /// bounded wait and a clear error (ETIMEDOUT), a write and a read alike, and meta
    /// carries on once the server does.
    #[test]
    fn a_stopped_server_fails_each_request_in_bounded_time() {
        let server = PgServer::start();
        let url = server.create_database();
        let db_timeout = Duration::from_secs(1);
        let config = MetaConfig { db_url: url, db_timeout, ..test_config(Default::default()) };
        let one = MetaService::open(&config).unwrap();
        create(&one, "before").unwrap();

        server.pause();
        let timed = |what: &str, f: &dyn Fn() -> Result<(), ErrorCode>| {
            let started = Instant::now();
            let outcome = f();
            let took = started.elapsed();
            // The timeout, then at most CANCEL_TIMEOUT asking the server to cancel.
            assert!(took < db_timeout + CANCEL_TIMEOUT + Duration::from_secs(2), "{what} took {took:?}");
            outcome
        };
        let write = timed("a create", &|| create(&one, "during").map(drop));
        let read = timed("a lookup", &|| lookup(&one, "absent").map(drop));
        server.resume();
        assert_eq!(write, Err(ErrorCode::TimedOut));
        assert_eq!(read, Err(ErrorCode::TimedOut));

        create(&one, "after").unwrap();
        assert_eq!(lookup(&one, "absent"), Err(ErrorCode::NotFound));
        assert!(lookup(&one, "before").is_ok());
    }

    /// Sessions holding the kept-rows lock (one per meta that keeps rows).
    fn keepers(url: &str) -> i64 {
        raw(url)
            .query_one(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock' \
                 AND (classid::bigint << 32) + objid::bigint = $1 \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&KEPT_ROWS_LOCK],
            )
            .unwrap()
            .get(0)
    }

    /// Notifications `client` (listening) received within `within`.
    fn heard(client: &mut postgres::Client, within: Duration) -> Vec<String> {
        let mut notifications = client.notifications();
        let mut it = notifications.timeout_iter(within);
        let mut out = Vec::new();
        while let Some(n) = postgres::fallible_iterator::FallibleIterator::next(&mut it).unwrap() {
            out.push(n.payload().to_string());
        }
        out
    }

    /// A meta alone on its database notifies nobody; it starts to once another meta
    /// keeps rows, and stops when that one is gone. A meta whose writer cannot take the
    /// lock (a commit of another holds its exclusive try) keeps nothing until it can.
    #[test]
    fn only_metas_that_keep_rows_are_notified() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let mut eavesdropper = raw(&url);
        eavesdropper.batch_execute(&format!("LISTEN {KEPT_ROWS_CHANNEL}")).unwrap();

        // A commit under way holds the exclusive try: the meta opening now keeps nothing.
        let mut committing = raw(&url);
        committing.batch_execute("BEGIN").unwrap();
        let tried: bool =
            committing.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&KEPT_ROWS_LOCK]).unwrap().get(0);
        assert!(tried);
        let config = MetaConfig { db_url: url.clone(), ..test_config(Default::default()) };
        let one = MetaService::open(&config).unwrap();
        listening(&url, 1);
        assert_eq!(keepers(&url), 0, "taken while a commit held the try");
        let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
        raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
        assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600, "kept a row without the lock");

        // Once that commit ends, a write a second later takes the lock; rows are kept.
        committing.batch_execute("COMMIT").unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        create(&one, "g").unwrap();
        assert_eq!(keepers(&url), 1);
        assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600);
        raw(&url).execute("UPDATE inodes SET mode = 420 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
        assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600, "the kept row answers");
        // (Creating f notified: the commit under way held the lock, as another meta's would.)
        heard(&mut eavesdropper, Duration::from_millis(100));
        create(&one, "g2").unwrap();
        assert_eq!(heard(&mut eavesdropper, Duration::from_millis(300)), Vec::<String>::new(), "alone, yet notified");

        // A second meta keeps rows: the first's commits now name what they changed.
        let two = MetaService::open(&config).unwrap();
        listening(&url, 2);
        assert_eq!(keepers(&url), 2);
        create(&one, "h").unwrap();
        let payloads = heard(&mut eavesdropper, Duration::from_millis(500));
        let h = format!("e{ROOT_INODE}:{}", hex::encode(b"h"));
        assert!(payloads.iter().any(|p| p.split(' ').any(|w| w == h)), "{payloads:?} names no {h}");

        // Gone again: nobody is notified.
        drop(two);
        soon("the second meta's lock going with it", || keepers(&url) == 1);
        create(&one, "i").unwrap();
        assert_eq!(heard(&mut eavesdropper, Duration::from_millis(300)), Vec::<String>::new());
    }

    /// A meta over `url` holding a lease of `duration` (not renewed: no workers run).
    fn with_lease(url: &str, duration: Duration) -> (Arc<MetaService>, Arc<PrimaryLease>) {
        let backend = open(url, None, false, Some(("test".into(), duration)), DEFAULT_DB_TIMEOUT).unwrap();
        let lease = backend.lease.clone().unwrap();
        let store = Arc::new(crate::engine::Store::new(backend).unwrap());
        (MetaService::with_store(store, &test_config(Default::default())), lease)
    }

    /// A write under an epoch the database has moved past is refused (EROFS) by the
    /// check inside its own transaction, even while the lease is held; nothing of it
    /// is committed.
    #[test]
    fn a_write_under_an_old_epoch_is_refused() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let (meta, lease) = with_lease(&url, Duration::from_secs(60));
        create(&meta, "before").unwrap();
        raw(&url).batch_execute("UPDATE primary_epoch SET epoch = epoch + 1").unwrap();
        assert_eq!(create(&meta, "after"), Err(ErrorCode::ReadOnly));
        assert_eq!(create(&meta, "after"), Err(ErrorCode::ReadOnly), "and stays refused");
        let names: i64 =
            raw(&url).query_one("SELECT COUNT(*) FROM dentries WHERE name = 'after'::bytea", &[]).unwrap().get(0);
        assert_eq!(names, 0, "the refused write left nothing behind");
        assert!(matches!(lease.renew(), Err(MetaError::Fenced(_))), "the lease cannot be renewed either");
    }

    /// Without renewals (no background worker here) the lease runs out and writes are
    /// refused with EROFS; a renewal lets them in again.
    #[test]
    fn writes_are_refused_once_the_lease_runs_out() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let (meta, lease) = with_lease(&url, Duration::from_millis(400));
        create(&meta, "held").unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(create(&meta, "late"), Err(ErrorCode::ReadOnly));
        lease.renew().unwrap();
        create(&meta, "renewed").unwrap();
    }

    /// Two metas' writers over one database, both updating the root directory: one
    /// with short transactions back to back, the other with transactions that span
    /// several round trips (sleeps between statements stand in for a 30 ms WAN). The
    /// slow one loses every snapshot race, yet each of its writes commits (its third
    /// try runs alone), and the fast one keeps going too.
    #[test]
    fn a_slow_writer_beside_a_busy_one_commits_every_write() {
        let server = testkit::postgres::shared();
        let url = server.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let store = || crate::engine::Store::new(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap()).unwrap();
        let (busy, slow) = (store(), store());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let touch_root = |t: &mut dyn Txn| -> Result<(), MetaError> {
            let mut root = t.get_inode(ROOT_INODE)?.expect("the root exists");
            root.attr.mtime.secs += 1;
            t.put_inode(&root)
        };
        let (busy_writes, slow_results) = std::thread::scope(|s| {
            let busy_run = s.spawn(|| {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    crate::engine::write(&busy, false, touch_root).expect("the busy writer's write");
                    n += 1;
                }
                n
            });
            std::thread::sleep(Duration::from_millis(100));
            let started = Instant::now();
            let results: Vec<_> = (0..8u64)
                .map(|i| {
                    crate::engine::write(&slow, false, move |t| {
                        let root = t.get_inode(ROOT_INODE)?;
                        std::thread::sleep(Duration::from_millis(30));
                        t.put_dentry(ROOT_INODE, format!("slow{i}").as_bytes(), 2_000_000 + i, 2_000_000 + i)?;
                        std::thread::sleep(Duration::from_millis(30));
                        t.put_inode(&root.expect("the root exists"))
                    })
                })
                .collect();
            let took = started.elapsed();
            stop.store(true, Ordering::Relaxed);
            assert!(took < Duration::from_secs(20), "the slow writer took {took:?}");
            (busy_run.join().unwrap(), results)
        });
        assert!(slow_results.iter().all(Result::is_ok), "{slow_results:?}");
        assert!(busy_writes > 8, "the busy writer made progress too: {busy_writes}");
        let slow_names: i64 = raw(&url)
            .query_one("SELECT COUNT(*) FROM dentries WHERE name::text LIKE '%736c6f77%'", &[])
            .unwrap()
            .get(0);
        assert_eq!(slow_names, 8, "every slow write committed once");
    }

    /// A durable commit waiting for a synchronous standby that never answers (a cut-off
    /// site) is abandoned once the lease runs out: the write and the one queued behind
    /// it are answered EROFS within the lease plus a bound, not left waiting; once the
    /// standby requirement is lifted and the lease renewed, the writer reconnects.
    #[test]
    fn a_commit_stuck_on_a_lost_standby_is_answered_erofs_when_the_lease_ends() {
        let server = PgServer::start();
        let url = server.create_database();
        drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
        let lease_for = Duration::from_millis(1500);
        let backend = open(&url, None, false, Some(("test".into(), lease_for)), DEFAULT_DB_TIMEOUT).unwrap();
        let lease = backend.lease.clone().unwrap();
        let store = crate::engine::Store::new(backend).unwrap();
        put_entry(&store, false, "before").unwrap();
        let standby_names = |to: &str| {
            let mut admin = raw(&server.admin_url());
            admin.batch_execute(&format!("ALTER SYSTEM SET synchronous_standby_names = '{to}'")).unwrap();
            admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        };
        standby_names("lost");
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let (stuck, queued) = std::thread::scope(|s| {
            let stuck = s.spawn(|| put_entry(&store, true, "stuck"));
            std::thread::sleep(Duration::from_millis(100));
            let queued = s.spawn(|| put_entry(&store, false, "queued"));
            (stuck.join().unwrap(), queued.join().unwrap())
        });
        let took = started.elapsed();
        assert_eq!(stuck, Err(ErrorCode::ReadOnly), "the stuck commit is not acknowledged");
        assert_eq!(queued, Err(ErrorCode::ReadOnly), "the write queued behind it is refused");
        assert!(took < lease_for + Duration::from_secs(3), "answered in {took:?}");
        standby_names("");
        std::thread::sleep(Duration::from_millis(200));
        lease.renew().unwrap();
        put_entry(&store, true, "after").unwrap();
    }

    /// Writes an entry of the root in a transaction of its own (`durable`: as an
    /// fsync's commit).
    fn put_entry(store: &crate::engine::Store, durable: bool, name: &str) -> Result<(), ErrorCode> {
        let name = name.as_bytes().to_vec();
        let ino = 1_000_000 + name.len() as u64 * 1000 + u64::from(name[0]);
        crate::engine::write(store, durable, move |t| t.put_dentry(ROOT_INODE, &name, ino, ino)).map_err(|e| e.code())
    }

    /// `promote` on a hot standby: promotes it, waits out the primary's lease, bumps
    /// the epoch; a meta over the promoted server writes, and every committed entry
    /// is there.
    #[test]
    fn promote_makes_the_standby_a_primary_of_a_new_epoch() {
        let (primary, url, _standby, standby_url) = formatted_with_standby();
        let (old, _lease) = with_lease(&url, Duration::from_millis(1500));
        for i in 0..10 {
            create(&old, &format!("f{i}")).unwrap();
        }
        // Let the standby catch up (no synchronous standby configured in this test).
        replayed(&url, &standby_url);
        drop(primary);
        let done = promote(&standby_url).unwrap();
        assert!(done.was_standby);
        assert_eq!(done.epoch, 2);
        assert!(done.waited_for_leases <= Duration::from_millis(1600), "{done:?}");
        let (new, _lease) = with_lease(&standby_url, Duration::from_secs(10));
        for i in 0..10 {
            assert_eq!(create(&new, &format!("f{i}")), Err(ErrorCode::Exists), "f{i} survived the failover");
        }
        create(&new, "after").unwrap();
        let again = promote(&standby_url).unwrap();
        assert!(!again.was_standby && again.epoch == 3, "{again:?}");
        assert_eq!(create(&new, "fenced"), Err(ErrorCode::ReadOnly), "a meta of epoch 2 is fenced at epoch 3");
    }
}
