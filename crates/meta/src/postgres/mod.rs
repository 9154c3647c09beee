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
//! Each connection is driven on the thread that waits for it (`wire`), so it may be
//! used from anywhere, meta's async workers included: a server on this machine gets
//! its point reads run inline there (`Backend::local_reads`); writes, and every read
//! of a server elsewhere, run off the workers.

#[macro_use]
mod sql;
mod codec;
mod conn;
mod kept;
mod lease;
mod lost;
pub mod moving;
mod prepared;
mod rows;
mod schema;
mod seen;
mod standby;
#[cfg(test)]
mod tests;
mod txn;
mod wire;

pub use lease::{Promotion, promote};
pub use lost::{Lost, LostChange, LostKind, lost};
pub(crate) use schema::{connect_empty, create_tables};

use crate::error::MetaError;
use crate::store::values::secret_of;
use crate::store::{Backend, CommitPositions, LeaseTerms, ReadConn};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_postgres::Config;

use crate::store::WriterLease;
use conn::{CONNECT_TIMEOUT, Last, PgConn, connect, on_this_machine, shown};
use kept::{KEPT_ROW_STALE_SQLSTATE, SharedRows};
use lease::{FENCED_SQLSTATE, PrimaryLease, StandbyWatch};
use schema::{SCHEMA_VERSION, init_schema};
use standby::StandbyReader;

/// Read connections: each read holds one for its round trips to the server.
const READERS: usize = 8;

/// The writer's setup when its meta reads from the primary: commits are also
/// acknowledged before their WAL is flushed (see `WriteConn::commit`).
const WRITER_SETUP_ASYNC: &str = concat!("SET synchronous_commit TO off;\n", writer_setup!());

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

/// `engine::probe_database` for PostgreSQL: connects (bounded by `timeout`), reads
/// the server's version and the schema's, and changes nothing.
pub(crate) fn probe(url: &str, timeout: Duration) -> Result<String, MetaError> {
    let (mut config, shown) = parse(url)?;
    config.connect_timeout(timeout).options(format!("-c statement_timeout={}", timeout.as_millis()));
    let mut c = postgres::Config::from(config)
        .connect(postgres::NoTls)
        .map_err(|e| MetaError::Connect { url: shown.clone(), detail: e.to_string() })?;
    let server: String = c.query_one("SELECT current_setting('server_version')", &[])?.get(0);
    let formatted: bool = c.query_one(schema::HAS_VERSION_TABLE, &[])?.get(0);
    let schema = if formatted {
        let version: Option<i64> = c.query_one(schema::RECORDED_VERSION, &[])?.get(0);
        format!("schema version {} (this binary's: {})", version.unwrap_or(0), schema::SCHEMA_VERSION)
    } else {
        "not formatted by Locus (`locus meta --init` formats an empty database)".into()
    };
    Ok(format!("{shown}: PostgreSQL {server}, {schema}"))
}

/// Opens the PostgreSQL database at `url` for the shared engine. Without `init` the
/// database must already hold a Locus namespace; with it, an empty database (no
/// tables) is formatted with a new cluster id. A database holding anything else is
/// refused either way. With `standby` (a hot standby of `url`'s server, at this
/// site), reads go there once it has replayed this meta's latest commit.
/// With `lease`, the writer holds a lease on the primary role (`PrimaryLease`), taken
/// here and renewed by the meta's `primary-lease` worker. Every request waits at most
/// `answer_timeout` for the server's answer.
pub fn open(
    url: &str,
    standby: Option<&str>,
    init: bool,
    lease: Option<LeaseTerms>,
    answer_timeout: Duration,
) -> Result<Backend, MetaError> {
    let (config, shown) = parse(url)?;
    let timeout = Some(answer_timeout);
    let standby = standby.map(parse).transpose()?;
    // Every other connection is made while the writer checks the schema: across a WAN
    // (a meta opening a home that moved) each costs round trips of its own.
    let (writer, others) = std::thread::scope(|s| {
        let others = s.spawn(|| {
            let lease_conn = lease.as_ref().map(|_| connect(&config, &shown, timeout)).transpose()?;
            let readers = connect_each(|| {
                let standby =
                    standby.as_ref().map(|(c, shown)| connect_replica(c, shown, answer_timeout)).transpose()?;
                Ok((standby, connect(&config, &shown, timeout)?))
            })?;
            Ok::<_, MetaError>((lease_conn, readers))
        });
        let writer = (|| {
            let mut writer = connect(&config, &shown, timeout)?;
            // A database formatted at this version needs nothing more than its cluster
            // row: one round trip. A statement's failure (no such table) is found again,
            // and explained, by the careful path; a server that does not answer is not
            // waited for twice.
            let known = match cluster_row(&mut writer) {
                Ok(row) => row.filter(|row| row.version == SCHEMA_VERSION),
                Err(MetaError::Database { .. }) => None,
                Err(e) => return Err(e),
            };
            let (formatted, ClusterRow { id: cluster_id, secret: cluster_secret, epoch, .. }) = match known {
                Some(row) => (false, row),
                None => {
                    let formatted = init_schema(&mut writer, &shown, init)?;
                    let missing = || MetaError::Corrupt("the database has no cluster row, secret or epoch".into());
                    (formatted, cluster_row(&mut writer)?.ok_or_else(missing)?)
                }
            };
            Ok::<_, MetaError>((writer, formatted, cluster_id, cluster_secret, epoch))
        })();
        let others =
            others.join().unwrap_or_else(|_| Err(MetaError::Internal("connecting to PostgreSQL panicked".into())));
        (writer, others)
    });
    let (mut writer, formatted, cluster_id, cluster_secret, epoch) = writer?;
    let (lease_conn, connected) = others?;
    let lease = match (lease, lease_conn) {
        (Some(LeaseTerms { holder, duration, rpo }), Some(conn)) => {
            let lease = Arc::new(PrimaryLease {
                holder,
                epoch,
                duration,
                valid_until: Mutex::new(Instant::now()),
                conn: Mutex::new(conn),
                rpo,
                standbys: Mutex::new(StandbyWatch::new(Instant::now())),
            });
            Some(lease)
        }
        _ => None,
    };
    let mut readers: Vec<Box<dyn ReadConn>> = Vec::with_capacity(READERS);
    // Every writer notifies the metas that keep rows of what it commits. The writer
    // takes the lock (at the primary) below and, while another meta's commit holds
    // it, again with a later write transaction; the listener listens at the primary.
    let shared = SharedRows::new(standby.is_some());
    writer.publish = Some(shared.clone());
    // Commits are flushed before they are answered where reads go to a standby: WAL
    // reaches the standby only once flushed, and an unflushed commit would keep its
    // writer's reads waiting.
    if standby.is_some() {
        writer.setup = writer_setup!();
        writer.flushes_every_commit = true;
    } else {
        writer.setup = WRITER_SETUP_ASYNC;
    }
    // The rest on the writer, in two round trips, while the lease is renewed on its own
    // connection: across a WAN (a meta opening a home that moved) each costs one.
    let (opened_at, renewed) = std::thread::scope(|s| {
        let renewing = lease.as_ref().map(|lease| s.spawn(|| lease.renew()));
        // Reads at a standby see no less than this open did at the primary (a database
        // it just formatted, above all: its tables may not have reached the standby yet).
        let opened_at = (|| {
            let mut asked = vec![Last::Batch(writer.setup)];
            if standby.is_some() {
                asked.push(Last::Simple("SELECT pg_current_wal_flush_lsn()::text"));
            }
            let mut answers = writer.pipeline_all(asked)?;
            if standby.is_none() {
                return Ok::<_, MetaError>(0);
            }
            let at = conn::first_row(answers.pop().expect("two requests, two answers"))?;
            Ok(at.and_then(|r| r.get(0).and_then(standby::parse_lsn)).unwrap_or(0))
        })();
        let renewed = renewing.map_or(Ok(()), |r| {
            r.join().unwrap_or_else(|_| Err(MetaError::Internal("renewing the lease panicked".into())))
        });
        (opened_at, renewed)
    });
    renewed?;
    // Only now: the writer's requests wait no longer than a lease that holds.
    writer.fence = lease.clone();
    if let Some(lease) = &lease {
        tracing::info!(epoch, duration = ?lease.duration, rpo = ?lease.rpo, "holding a lease on the primary role");
    }
    let opened_at = opened_at?;
    let committed = Arc::new(AtomicU64::new(opened_at));
    writer.committed = Some(committed.clone());
    let positions = Arc::new(Positions { committed: committed.clone(), rows: shared.clone() });
    let kept = |mut conn: PgConn| {
        conn.cache = Some(shared.clone());
        conn
    };
    for (standby_conn, primary) in connected {
        match standby_conn {
            None => readers.push(Box::new(kept(primary))),
            Some(standby_conn) => readers.push(Box::new(StandbyReader {
                standby: kept(standby_conn),
                // Keeps nothing: rows newer than the standby's would mix with its
                // older ones in later reads there.
                primary,
                committed: committed.clone(),
                replayed: 0,
            })),
        }
    }
    kept::listen(config.clone(), shown.clone(), &shared);
    writer.take_kept_rows_lock()?;
    Ok(Backend {
        formatted,
        cluster_id,
        cluster_secret,
        writer: Box::new(writer),
        readers,
        local_reads: standby.is_none() && on_this_machine(&config),
        local_writes: false,
        lease: lease.map(|l| l as Arc<dyn WriterLease>),
        epoch: epoch as u64,
        positions: Some(positions),
        two_phase: Some(prepared::opener(config, shown, answer_timeout)),
    })
}

/// Connects to a hot standby, waiting (up to `answer_timeout`) for a database that
/// its primary has just made (a home's next place in a move) to be replayed there.
fn connect_replica(config: &Config, shown: &str, answer_timeout: Duration) -> Result<PgConn, MetaError> {
    let until = Instant::now() + answer_timeout;
    loop {
        match connect(config, shown, Some(answer_timeout)) {
            Err(MetaError::Connect { detail, .. }) if detail.contains("(3D000)") && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            connected => return connected,
        }
    }
}

/// What opening a database reads before anything else.
struct ClusterRow {
    /// The schema's version.
    version: i64,
    id: String,
    secret: [u8; 32],
    /// The primary's epoch.
    epoch: i64,
}

/// The opening's first read, in one round trip; `None` when a row is missing.
fn cluster_row(w: &mut PgConn) -> Result<Option<ClusterRow>, MetaError> {
    let Some(row) = w.simple_row(concat!(
        "SELECT COALESCE((SELECT MAX(version) FROM meta_version), 0), c.id, encode(c.secret, 'hex'), e.epoch ",
        "FROM cluster c, primary_epoch e"
    ))?
    else {
        return Ok(None);
    };
    let (Some(version), Some(id), Some(secret), Some(epoch)) = (row.get(0), row.get(1), row.get(2), row.get(3)) else {
        return Ok(None);
    };
    let secret =
        hex::decode(secret).map_err(|e| MetaError::Corrupt(format!("the cluster secret does not decode: {e}")))?;
    let number = |text: &str| text.parse::<i64>().map_err(|e| MetaError::Corrupt(format!("{text:?}: {e}")));
    Ok(Some(ClusterRow {
        version: number(version)?,
        id: id.to_string(),
        secret: secret_of(secret)?,
        epoch: number(epoch)?,
    }))
}

/// `READERS` connections made at once, one thread each: a primary across the WAN costs
/// every connection a few round trips, and a meta that opens a moved home's engine
/// holds that home's writes meanwhile.
fn connect_each<T: Send>(connect: impl Fn() -> Result<T, MetaError> + Sync) -> Result<Vec<T>, MetaError> {
    std::thread::scope(|s| {
        let connecting: Vec<_> = (0..READERS).map(|_| s.spawn(&connect)).collect();
        connecting
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|_| Err(MetaError::Internal("connecting to PostgreSQL panicked".into()))))
            .collect()
    })
}

/// This meta's place in the primary's log (`store::CommitPositions`): what its writer
/// published, raised by writes other metas committed for it.
struct Positions {
    committed: Arc<AtomicU64>,
    rows: Arc<SharedRows>,
}

impl CommitPositions for Positions {
    fn latest(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    fn committed_elsewhere(&self, position: u64, namespace: bool) {
        // In this order: a read that finds the rows dropped also finds the position.
        self.committed.fetch_max(position, Ordering::AcqRel);
        if namespace {
            self.rows.committed_elsewhere(position);
        }
    }
}

/// A PostgreSQL error with the server's message (its `Display` alone says "db error").
fn pg_detail(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// What a PostgreSQL error with SQLSTATE `code` means beyond a failure: its
/// serialization failure and deadlock (40001, 40P01), and a unique violation (23505,
/// which a concurrent insert of the same key raises instead of 40001 when the
/// transaction had not read the key), are conflicts to retry, as is a kept row found
/// stale (LK001); a commit's epoch check (LF001) is fencing.
fn from_sqlstate(code: &str, detail: String) -> MetaError {
    match code {
        "40001" | "40P01" | "23505" | KEPT_ROW_STALE_SQLSTATE => MetaError::Conflict(detail),
        FENCED_SQLSTATE => MetaError::Fenced(detail),
        _ => MetaError::Database { backend: "PostgreSQL", detail },
    }
}

impl From<postgres::Error> for MetaError {
    fn from(e: postgres::Error) -> Self {
        from_sqlstate(e.code().map_or("", |c| c.code()), pg_detail(&e))
    }
}

impl From<wire::ServerError> for MetaError {
    fn from(e: wire::ServerError) -> Self {
        from_sqlstate(&e.code, e.to_string())
    }
}
