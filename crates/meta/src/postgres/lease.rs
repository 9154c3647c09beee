//! Fencing: this meta's lease on the primary role (`store::WriterLease`), the epoch
//! every commit checks, and `promote`, which makes a standby the primary of a new
//! epoch once the old epoch's leases have run out.

use crate::error::MetaError;
use postgres::types::ToSql;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use util::sync::lock;

use super::conn::{PgConn, connect};
use super::parse;
use crate::store::WriterLease;

/// The SQLSTATE of a commit refused because the epoch changed (class LF: Locus fencing;
/// raised by the schema's `locus_fence`).
pub(super) const FENCED_SQLSTATE: &str = "LF001";

/// This meta's lease on the primary role: while it holds one, its writes are accepted;
/// once it could not renew it for its whole duration (the primary unreachable, or
/// blocked because its synchronous standby at the other site is cut off), every write
/// is refused (EROFS) until a renewal succeeds again. `promote` waits out the leases
/// of the old epoch before the new primary accepts writes, so the two sides never
/// accept writes at the same time.
pub struct PrimaryLease {
    pub(super) holder: String,
    /// The epoch this meta started under; a write under another one is refused.
    pub(super) epoch: i64,
    pub(super) duration: Duration,
    /// When the lease runs out, by this process's monotonic clock: `duration` after the
    /// start of the last renewal that succeeded (so it ends before the database's
    /// `expires_at`, which counts from the renewal's commit).
    pub(super) valid_until: Mutex<Instant>,
    /// A connection of its own: a renewal may block (waiting for a cut-off
    /// synchronous standby) without holding the writer.
    pub(super) conn: Mutex<PgConn>,
}

impl WriterLease for PrimaryLease {
    fn epoch(&self) -> i64 {
        self.epoch
    }

    fn duration(&self) -> Duration {
        self.duration
    }

    /// By a synchronously replicated commit of its row.
    fn renew(&self) -> Result<(), MetaError> {
        let started = Instant::now();
        let ms = self.duration.as_millis() as i64;
        let mut conn = lock(&self.conn);
        // A renewal abandoned in a cut dropped the connection: this one connects again.
        conn.reconnect_if_closed()?;
        let renewed = conn.exec(
            "INSERT INTO primary_leases (holder, epoch, expires_at) \
             SELECT $1, epoch, now() + $2::bigint * interval '1 millisecond' FROM primary_epoch WHERE epoch = $3 \
             ON CONFLICT (holder) DO UPDATE SET epoch = EXCLUDED.epoch, expires_at = EXCLUDED.expires_at",
            &[&self.holder as &(dyn ToSql + Sync), &ms, &self.epoch],
        )?;
        drop(conn);
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

    fn held(&self) -> bool {
        Instant::now() < self.valid_until()
    }
}

impl PrimaryLease {
    /// Until when the lease holds (renewals that succeed move it later).
    pub(super) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    /// Refuses a write once the lease has run out.
    pub(super) fn check(&self) -> Result<(), MetaError> {
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

/// What `promote` did, for the operator.
#[derive(Debug)]
pub struct Promotion {
    /// The server was a standby (else it was already a primary: only the epoch moved).
    pub was_standby: bool,
    /// How long it waited for the old epoch's leases to run out.
    pub waited_for_leases: Duration,
    /// The new epoch: metas of older ones have their writes refused here.
    pub epoch: i64,
    /// A standby's last replayed commit, as its time and log position: commits the
    /// lost primary acknowledged after it (asynchronous replication) are lost.
    pub replayed: Option<(String, String)>,
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
    let replayed = match was_standby {
        false => None,
        true => {
            let row = c.one("SELECT pg_last_xact_replay_timestamp()::text, pg_last_wal_replay_lsn()::text", &[])?;
            let at: Option<String> = row.try_get(0)?;
            at.zip(row.try_get::<_, Option<String>>(1)?)
        }
    };
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
    Ok(Promotion { was_standby, waited_for_leases: started.elapsed(), epoch, replayed })
}
