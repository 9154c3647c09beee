//! A transaction's life on the writer and on readers: begin, savepoints, commit
//! (behind the epoch check and the writers' lock), rollback, abandoning a wait that
//! ran out, reconnecting; and a read's try without a transaction.

use crate::error::MetaError;
use crate::store::{ReadConn, ReadOp, Txn, WriteConn, WriterLease};
use std::time::{Duration, Instant};

use super::conn::{CANCEL_TIMEOUT, Owned, PgConn, Probe, WaitLimit};
use super::kept::{KEPT_ROWS_LOCK, Written};
use super::seen::Seen;
use super::standby::parse_lsn;
use super::wire::Wire;

impl PgConn {
    /// Opens a transaction unless the last one's end already did.
    /// A transaction starting on a connection the server has closed connects again
    /// first: the request that found it broken failed, the next ones work.
    pub(super) fn ensure_begun(&mut self, begin: &'static str) -> Result<(), MetaError> {
        self.reconnect_if_closed()?;
        if !self.begun {
            self.boundary(&[begin])?;
            self.begun = true;
        }
        Ok(())
    }

    pub(super) fn reconnect_if_closed(&mut self) -> Result<(), MetaError> {
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
    pub(super) fn end(&mut self, end: &[&'static str]) -> Result<(), MetaError> {
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
    pub(super) fn wait_limit(&self) -> Option<WaitLimit> {
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
    pub(super) fn abandon(&mut self) -> MetaError {
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
    pub(super) fn commit_gate(&mut self) -> Result<(), MetaError> {
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
    pub(super) fn take_kept_rows_lock(&mut self) -> Result<(), MetaError> {
        let Some(publish) = self.publish.clone() else { return Ok(()) };
        if !publish.wants_lock() || self.lock_tried.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return Ok(());
        }
        self.lock_tried = Some(Instant::now());
        // The WAL position is asked after the lock is taken: every commit that did not
        // notify this meta (it ended before the lock was granted) is behind it.
        let row = self.simple_row(concat!(
            "SELECT pg_try_advisory_lock_shared(",
            kept_rows_lock!(),
            "), pg_backend_pid(), pg_current_wal_insert_lsn()::text"
        ))?;
        let text = |i: usize| row.as_ref().and_then(|r| r.get(i));
        if text(0) == Some("t") {
            if self.lock_missed.take().is_some_and(|(_, logged)| logged) {
                tracing::info!("took the kept-rows lock at last");
            }
            let pid = text(1).and_then(|p| p.parse().ok());
            let pid =
                pid.ok_or_else(|| MetaError::Internal("the kept-rows lock's answer has no backend pid".into()))?;
            publish.set_holder(pid, text(2).and_then(parse_lsn).unwrap_or(u64::MAX));
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
    pub(super) fn session_lost(&mut self) {
        if let Some(publish) = &self.publish {
            publish.set_holder(0, 0);
        }
        self.lock_tried = None;
        self.lock_missed = None;
    }
}

/// How long every try of the kept-rows lock may fail before it is logged (another
/// meta's commit holds it for an instant; anything longer is someone else).
pub(super) const LOCK_MISSED_WARNING: Duration = Duration::from_secs(10);

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
    /// durable one turns it on for its own commit, which also flushes every earlier one,
    /// and publishes where the commit is in the log (`committed`).
    /// What the transaction changed is notified to other metas in the commit's round
    /// trip, and replaces the rows this meta keeps once the commit is answered (or is
    /// dropped from them if the commit's outcome is unknown).
    fn commit(&mut self) -> Result<(), MetaError> {
        if let Err(refused) = self.commit_gate() {
            self.written = Written::default();
            return Err(refused);
        }
        let durable = std::mem::take(&mut self.durable);
        let committed = match self.committed.clone() {
            // Where the commit is in the log goes to whoever waits for it: this meta's
            // reads at a standby, and the metas it forwards writes to (`Forward`).
            Some(committed) => self.commit_reporting_lsn(&committed, durable, self.flushes_every_commit),
            None => self.end(&["COMMIT", begin_write!()]),
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
    pub(super) fn snapshot_since(&mut self, began: Option<u64>, op: ReadOp<'_>) -> Result<(), MetaError> {
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
