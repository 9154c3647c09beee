//! Prepared transactions (two-phase commit) for operations that span metadata homes
//! (`crate::cross`): a plain connection to a home's primary, without the writer's
//! kept rows, lease or temporary function (PostgreSQL refuses to prepare a transaction
//! that touched the session's temporary schema).

use crate::error::MetaError;
use crate::store::{TwoPhaseConn, TwoPhaseOpener, Txn};
use std::time::Duration;
use tokio_postgres::Config;

use super::conn::{Answer, Last, PgConn, connect};

/// SQLSTATE of "no prepared transaction with that identifier".
const UNDEFINED_OBJECT: &str = "42704";
/// SQLSTATE of "prepared transactions are disabled" (max_prepared_transactions = 0).
const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";

/// One two-phase connection (`TwoPhaseConn`).
pub(super) struct PreparedConn {
    conn: PgConn,
}

/// An opener of two-phase connections to the database of `config` (`Backend::two_phase`).
pub(super) fn opener(config: Config, shown: String, answer_timeout: Duration) -> TwoPhaseOpener {
    Box::new(move || {
        let conn = connect(&config, &shown, Some(answer_timeout))?;
        Ok(Box::new(PreparedConn { conn }) as Box<dyn TwoPhaseConn>)
    })
}

/// Whether `e` came from the server with SQLSTATE `code` (`pg_detail` ends with it).
fn is_sqlstate(e: &MetaError, code: &str) -> bool {
    matches!(e, MetaError::Database { detail, .. } if detail.ends_with(&format!("({code})")))
}

/// Gids are made by `cross` of letters, digits and dashes; anything else is refused
/// rather than quoted into a statement.
fn checked(gid: &str) -> Result<&str, MetaError> {
    match !gid.is_empty() && gid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        true => Ok(gid),
        false => Err(MetaError::InvalidArgument(format!("{gid:?} is not a prepared transaction's name"))),
    }
}

/// Notifies the metas keeping rows of the rows in `$1` and answers where the log is.
const NOTIFY: &str = concat!(
    "SELECT (SELECT count(pg_notify('",
    kept_rows_channel!(),
    "', p)) FROM unnest($1::text[]) p), pg_current_wal_insert_lsn()::text"
);

/// The log position in the second column of `NOTIFY`'s one row.
fn position_of(rows: &[postgres::Row]) -> Result<u64, MetaError> {
    let at: String = rows.first().ok_or_else(|| MetaError::Internal("no WAL position".into()))?.try_get(1)?;
    Ok(super::standby::parse_lsn(&at).unwrap_or(0))
}

impl PreparedConn {
    /// Where the server's log is now (past every commit this connection made).
    fn position(&mut self) -> Result<u64, MetaError> {
        let at: String = self.conn.one("SELECT pg_current_wal_insert_lsn()::text", &[])?.try_get(0)?;
        Ok(super::standby::parse_lsn(&at).unwrap_or(0))
    }
}

impl TwoPhaseConn for PreparedConn {
    fn begin(&mut self, epoch: u64) -> Result<(), MetaError> {
        self.rollback()?;
        // The row operations note what they wrote (`notifications` reads it for this
        // transaction): nothing of an earlier use of the pooled connection may stay.
        self.conn.written = Default::default();
        self.conn.assumed = Default::default();
        // BEGIN goes out with the epoch's check, in its round trip.
        self.conn.begin_pending = Some(begin_write!());
        self.conn.begun = true;
        let now: i64 = self.conn.one("SELECT epoch FROM primary_epoch FOR SHARE", &[])?.try_get(0)?;
        if now as u64 != epoch {
            return Err(MetaError::Fenced(format!(
                "{} is at epoch {now}, this meta opened it at epoch {epoch}: the home moved or failed over since",
                self.conn.shown
            )));
        }
        Ok(())
    }

    fn txn(&mut self) -> &mut dyn Txn {
        &mut self.conn
    }

    fn prepare(&mut self, gid: &str) -> Result<(), MetaError> {
        let prepared = self.conn.batch(&format!("PREPARE TRANSACTION '{}'", checked(gid)?));
        self.conn.begun = false;
        prepared.map_err(|e| match is_sqlstate(&e, OBJECT_NOT_IN_PREREQUISITE_STATE) {
            true => MetaError::CrossHome(format!(
                "{} does not take prepared transactions ({e}): a rename or link between homes needs \
                 max_prepared_transactions > 0 on every home's server (and its standbys)",
                self.conn.shown
            )),
            false => e,
        })
    }

    fn commit(&mut self) -> Result<u64, MetaError> {
        let committed = self.conn.boundary(&["COMMIT"]);
        self.conn.begun = false;
        committed?;
        self.position()
    }

    fn rollback(&mut self) -> Result<(), MetaError> {
        self.conn.reconnect_if_closed()?;
        self.conn.deferred.clear();
        // A BEGIN not sent yet began nothing.
        if std::mem::take(&mut self.conn.begun) && self.conn.begin_pending.take().is_none() {
            self.conn.boundary(&["ROLLBACK"])?;
        }
        Ok(())
    }

    fn finish(&mut self, gid: &str, commit: bool) -> Result<bool, MetaError> {
        self.rollback()?;
        let verb = if commit { "COMMIT PREPARED" } else { "ROLLBACK PREPARED" };
        match self.conn.batch(&format!("{verb} '{}'", checked(gid)?)) {
            Ok(()) => Ok(true),
            Err(e) if is_sqlstate(&e, UNDEFINED_OBJECT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn commit_prepared_and_notify(&mut self, gid: &str, payloads: &[String]) -> Result<u64, MetaError> {
        self.rollback()?;
        let commit = format!("COMMIT PREPARED '{}'", checked(gid)?);
        let st = self.conn.statement(NOTIFY)?;
        let answers = self.conn.pipeline_all(vec![Last::Batch(&commit), Last::Rows(&st, &[&payloads])])?;
        match answers.last() {
            Some(Answer::Rows(rows)) => position_of(rows),
            _ => Err(MetaError::Internal("no WAL position after a notification".into())),
        }
    }

    fn notifications(&self, sender: &str) -> Vec<String> {
        self.conn.written.payloads(sender)
    }

    fn notify(&mut self, payloads: &[String]) -> Result<u64, MetaError> {
        self.rollback()?;
        position_of(&self.conn.query(NOTIFY, &[&payloads])?)
    }

    fn in_doubt(&mut self, prefix: &str, age: Duration) -> Result<Vec<String>, MetaError> {
        self.rollback()?;
        let (prefix, secs) = (format!("{prefix}%"), age.as_secs_f64());
        let rows = self.conn.query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE $1 \
             AND prepared <= now() - make_interval(secs => $2) ORDER BY prepared",
            &[&prefix, &secs],
        )?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }
}
