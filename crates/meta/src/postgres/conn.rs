//! One connection to the server and how requests go out on it: connecting (with the
//! URL shown without its password), prepared statements, deferred writes, and
//! pipelining, so that the statements of one step cost one round trip.

use crate::error::MetaError;
use postgres::types::ToSql;
use postgres::{Row, SimpleQueryMessage, SimpleQueryRow, Statement};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio_postgres::Config;

use super::codec::at_most_one;
use super::kept::{SharedRows, Written};
use super::lease::PrimaryLease;
use super::seen::Seen;
use super::wire::{Step, Wire, waiting};

/// How long connecting may take before meta gives up with an error.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long asking the server to cancel an abandoned request may take (it is local to
/// the meta that abandons it; past this, the connection is dropped all the same).
pub(super) const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection to the server with its prepared statements.
pub(crate) struct PgConn {
    /// The connection, driven on the calling thread (`wire`).
    pub(super) wire: Option<Wire>,
    /// How to connect again once the server closed the connection (restart, failover,
    /// an administrator's pg_terminate_backend), and the URL without password.
    pub(super) config: Config,
    pub(super) shown: String,
    /// Session settings run again on every new connection (the writer's
    /// `synchronous_commit=off`).
    pub(super) setup: &'static str,
    /// Statements prepared on this connection, by their SQL text.
    pub(super) statements: HashMap<&'static str, Statement>,
    /// A transaction is open (begun, perhaps not yet used). Each transaction ends with
    /// its COMMIT or ROLLBACK and the next BEGIN in one round trip: PostgreSQL takes a
    /// transaction's snapshot only at its first query, so a begun but unused one holds
    /// nothing back (it shows as "idle in transaction").
    pub(super) begun: bool,
    /// The open write transaction must be on disk when its commit returns.
    pub(super) durable: bool,
    /// The writer publishes the WAL position of each commit here: `StandbyReader`s wait
    /// for their standby to replay it, a `Forward` answers it, and a meta forwarding a
    /// write sends it along (what the client saw of this engine).
    pub(super) committed: Option<Arc<AtomicU64>>,
    /// Every commit is flushed before it is answered (the writer of a meta reading
    /// from a hot standby, whose reads wait for their writes' WAL to get there).
    pub(super) flushes_every_commit: bool,
    /// A savepoint was released but the RELEASE not sent yet: it goes with the next
    /// SAVEPOINT (COMMIT and ROLLBACK make it moot), saving a round trip per op.
    pub(super) release_pending: bool,
    /// The writer of a meta holding the primary role's lease: each commit checks the
    /// lease is still held and, in the same transaction, that the epoch is unchanged.
    pub(super) fence: Option<Arc<PrimaryLease>>,
    /// Writes whose answer no op waits for, sent ahead of the next statement that
    /// has one (or the commit) in the same round trip. A failure among them fails
    /// that statement, inside the same op or commit, so errors keep their meaning.
    pub(super) deferred: Vec<Deferred>,
    /// Rows the open transaction has read or written (see `Seen`).
    pub(super) seen: Seen,
    /// A read connection's view of the rows its meta keeps in memory: reads are
    /// answered from them and what a read finds is kept there (`kept`).
    pub(super) cache: Option<Arc<SharedRows>>,
    /// The writer's: what it commits replaces the rows kept there, and is notified
    /// to other metas.
    pub(super) publish: Option<Arc<SharedRows>>,
    /// What the open write transaction changed (with `publish`).
    pub(super) written: Written,
    /// The keys the open write transaction took from the kept rows (`assume_entry`).
    pub(super) assumed: Written,
    /// The open write transaction may take rows from the kept ones (`distrust`).
    pub(super) trust_kept: bool,
    /// A guard failed: write transactions read everything from the server until one
    /// commits, so that the tries of a batch whose file is open, say, stop guessing.
    pub(super) distrust: bool,
    /// When the writer last tried to take the kept-rows lock (`take_kept_rows_lock`).
    pub(super) lock_tried: Option<Instant>,
    /// Since when every try of the kept-rows lock failed, and whether that was logged.
    pub(super) lock_missed: Option<(Instant, bool)>,
    /// Ids taken from a sequence ahead of need, per counter (see `next_id`).
    pub(super) ids: HashMap<&'static str, Vec<i64>>,
    /// A read's first try, outside any transaction (see `ReadConn::snapshot`).
    pub(super) probe: Probe,
    /// A BEGIN to send ahead of the next statement, in the same round trip.
    pub(super) begin_pending: Option<&'static str>,
    /// A request sent through tokio-postgres failed: the server flushes an error at
    /// once and the ReadyForQuery after it may still be on its way, so the next
    /// pipeline also goes through tokio-postgres (which knows to skip it), not by hand.
    pub(super) failed_unread: bool,
    /// How long a request may wait for its answer before it is cancelled and fails
    /// (`--db-timeout`); none for an operator's command (`promote`, `migrate`).
    pub(super) answer_timeout: Option<Duration>,
    /// The next write transaction runs alone among the writers (`run_alone_next`).
    pub(super) alone_next: bool,
    /// This session holds the writers' lock exclusively (see `writers_lock`); the
    /// end of its transaction releases it.
    pub(super) alone: bool,
}

/// Where a read's try without a transaction stands.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
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
pub(super) type Owned = Box<dyn ToSql + Sync + Send>;

/// A deferred write: its SQL, as prepared by tokio-postgres (for its parameters'
/// types), and its parameters.
pub(super) type Deferred = (&'static str, Statement, Vec<Owned>);

/// What the statement at the end of a pipeline asks for.
pub(super) enum Last<'a> {
    Rows(&'a Statement, Params<'a>),
    Count(&'a Statement, Params<'a>),
    Batch(&'a str),
    Simple(&'a str),
    /// One statement without parameters that answers no rows wanted: a transaction
    /// or savepoint boundary.
    Boundary(&'static str),
}

/// Its answer.
pub(super) enum Answer {
    Rows(Vec<Row>),
    Count(u64),
    Simple(Vec<SimpleQueryMessage>),
}

pub(super) type Pending<'a> = Pin<Box<dyn Future<Output = Result<Answer, postgres::Error>> + 'a>>;

/// Polls every future in order until all are done: each request is queued on the
/// connection before the next one's, so all go out together and are answered in order.
pub(super) async fn in_order(mut futures: Vec<Pending<'_>>) -> Vec<Result<Answer, postgres::Error>> {
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

pub(super) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The instant a wait for the server gives up at, asked again after every wake-up
/// (`PgConn::wait_limit`).
pub(super) type WaitLimit = Box<dyn Fn() -> Instant>;

impl PgConn {
    /// The connection; none after a wait was abandoned (`abandon`) until the next
    /// transaction connects again.
    pub(super) fn wire(&mut self) -> Result<&mut Wire, MetaError> {
        let shown = &self.shown;
        self.wire.as_mut().ok_or_else(|| {
            MetaError::Internal(format!("the connection to {shown} was dropped; the next transaction reconnects"))
        })
    }

    pub(super) fn statement(&mut self, sql: &'static str) -> Result<Statement, MetaError> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.prepare_dynamic(sql)?;
        self.statements.insert(sql, st.clone());
        Ok(st)
    }

    /// Sends the deferred writes and then `last` in one round trip and waits for
    /// all their answers; the first failure in order is the result.
    pub(super) fn pipeline(&mut self, last: Last<'_>) -> Result<Answer, MetaError> {
        Ok(self.pipeline_all(vec![last])?.pop().expect("one request, one answer"))
    }

    /// Sends the deferred writes and then every request of `lasts` in one round trip
    /// and waits for all their answers (those of `lasts`, in order); the first failure
    /// in order is the result.
    pub(super) fn pipeline_all(&mut self, lasts: Vec<Last<'_>>) -> Result<Vec<Answer>, MetaError> {
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
    pub(super) fn send_all(&mut self, lasts: Vec<Last<'_>>) -> Result<Vec<Answer>, MetaError> {
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
    pub(super) fn pipeline_by_hand(
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
    pub(super) fn defer(&mut self, sql: &'static str, params: Vec<Owned>) -> Result<(), MetaError> {
        let st = self.statement(sql)?;
        self.deferred.push((sql, st, params));
        Ok(())
    }

    /// Runs every query of `queries` in one round trip; their rows in order.
    pub(super) fn query_all(&mut self, queries: &[(&'static str, Params<'_>)]) -> Result<Vec<Vec<Row>>, MetaError> {
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

    pub(super) fn query(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>, MetaError> {
        let st = self.statement(sql)?;
        match self.pipeline(Last::Rows(&st, params))? {
            Answer::Rows(rows) => Ok(rows),
            _ => unreachable!("a query answers rows"),
        }
    }

    pub(super) fn opt(&mut self, sql: &'static str, params: Params<'_>) -> Result<Option<Row>, MetaError> {
        at_most_one(self.query(sql, params)?, sql)
    }

    pub(super) fn one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, MetaError> {
        self.opt(sql, params)?.ok_or_else(|| MetaError::Corrupt(format!("no row where one was expected: {sql}")))
    }

    pub(super) fn exec(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, MetaError> {
        let st = self.statement(sql)?;
        match self.pipeline(Last::Count(&st, params))? {
            Answer::Count(n) => Ok(n),
            _ => unreachable!("an execute answers a count"),
        }
    }

    /// The first row `sql` (no parameters) answers, by the simple protocol: one round
    /// trip, where a statement's first use on a connection costs two (it is prepared
    /// first), which counts across a WAN for a connection just made.
    pub(super) fn simple_row(&mut self, sql: &str) -> Result<Option<SimpleQueryRow>, MetaError> {
        first_row(self.pipeline(Last::Simple(sql))?)
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
    pub(super) fn boundary(&mut self, statements: &[&'static str]) -> Result<(), MetaError> {
        self.seen = Seen::default();
        self.pipeline_all(statements.iter().map(|sql| Last::Boundary(sql)).collect()).map(drop)
    }
}

/// `url` without its password, for messages.
pub(super) fn shown(config: &Config) -> String {
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
pub(super) fn connect(config: &Config, shown: &str, answer_timeout: Option<Duration>) -> Result<PgConn, MetaError> {
    Ok(PgConn {
        wire: Some(Wire::connect(config, shown)?),
        config: config.clone(),
        shown: shown.into(),
        setup: "",
        committed: None,
        flushes_every_commit: false,
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
pub(super) fn on_this_machine(config: &Config) -> bool {
    config.get_hosts().iter().all(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => {
            name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        tokio_postgres::config::Host::Unix(_) => true,
    })
}

/// The first row of a simple query's answer.
pub(super) fn first_row(answer: Answer) -> Result<Option<SimpleQueryRow>, MetaError> {
    match answer {
        Answer::Simple(messages) => Ok(messages.into_iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })),
        _ => Err(MetaError::Internal("a simple query was answered as another kind".into())),
    }
}
