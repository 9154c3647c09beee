//! Fencing: this meta's lease on the primary role (`store::WriterLease`), the epoch
//! every commit checks, and `promote`, which makes a standby the primary of a new
//! epoch once the old epoch's leases have run out.

use crate::error::MetaError;
use postgres::types::ToSql;
use std::collections::VecDeque;
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
    /// The metadata RPO (`LeaseTerms::rpo`): writes are refused once the standbys are
    /// further behind.
    pub(super) rpo: Option<Duration>,
    /// How far the standbys are, as each renewal saw it.
    pub(super) standbys: Mutex<StandbyWatch>,
}

/// How far this primary's standbys are behind it, in time: each renewal notes the
/// primary's WAL insert position (every commit acknowledged before the renewal began
/// lies at or before it) and the furthest position a standby has flushed; the moment
/// of the newest noted position a standby has flushed is the moment up to which a
/// failover to it would lose nothing.
#[derive(Debug)]
pub(super) struct StandbyWatch {
    /// Positions not yet flushed by any standby, oldest first, with when they were noted.
    pending: VecDeque<(Instant, i64)>,
    /// Up to when a standby had everything (at first, when the lease was taken: the
    /// RPO then counts from there).
    confirmed: Instant,
    /// Whether any standby has reported.
    seen: bool,
}

/// Positions kept while no standby flushes them (a renewal a second for 3 hours):
/// dropping the oldest only makes `confirmed` later, never earlier than the truth.
const PENDING_KEPT: usize = 10_000;

impl StandbyWatch {
    pub(super) fn new(now: Instant) -> StandbyWatch {
        StandbyWatch { pending: VecDeque::new(), confirmed: now, seen: false }
    }

    /// Notes that at `at` the primary had written up to `inserted`, and that a standby
    /// has flushed up to `flushed` (`None`: no standby streams).
    pub(super) fn note(&mut self, at: Instant, inserted: i64, flushed: Option<i64>) {
        self.pending.push_back((at, inserted));
        if self.pending.len() > PENDING_KEPT {
            self.pending.pop_front();
        }
        let Some(flushed) = flushed else { return };
        self.seen = true;
        while let Some(&(noted, position)) = self.pending.front()
            && position <= flushed
        {
            self.confirmed = self.confirmed.max(noted);
            self.pending.pop_front();
        }
    }

    /// Up to when a standby had everything this primary wrote.
    pub(super) fn confirmed(&self) -> Instant {
        self.confirmed
    }
}

impl WriterLease for PrimaryLease {
    fn epoch(&self) -> i64 {
        self.epoch
    }

    fn duration(&self) -> Duration {
        self.duration
    }

    fn renew_every(&self) -> Duration {
        let every = self.duration / 3;
        self.rpo.map_or(every, |rpo| every.min(rpo / 4))
    }

    /// By a synchronously replicated commit of its row; the same statement notes how
    /// far the standbys are.
    fn renew(&self) -> Result<(), MetaError> {
        let started = Instant::now();
        let ms = self.duration.as_millis() as i64;
        let mut conn = lock(&self.conn);
        // A renewal abandoned in a cut dropped the connection: this one connects again.
        conn.reconnect_if_closed()?;
        // `flush_lsn` is NULL unless the role may see it (superuser or pg_monitor).
        let row = conn.one(
            "WITH renewed AS (INSERT INTO primary_leases (holder, epoch, expires_at) \
             SELECT $1, epoch, now() + $2::bigint * interval '1 millisecond' FROM primary_epoch WHERE epoch = $3 \
             ON CONFLICT (holder) DO UPDATE SET epoch = EXCLUDED.epoch, expires_at = EXCLUDED.expires_at \
             RETURNING 1) \
             SELECT (SELECT COUNT(*) FROM renewed), (pg_current_wal_insert_lsn() - '0/0')::bigint, \
             (SELECT MAX(flush_lsn - '0/0') FROM pg_stat_replication WHERE state = 'streaming')::bigint",
            &[&self.holder as &(dyn ToSql + Sync), &ms, &self.epoch],
        )?;
        drop(conn);
        let (renewed, inserted, flushed): (i64, i64, Option<i64>) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        lock(&self.standbys).note(started, inserted, flushed);
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

    /// Refused once the lease has run out, or once the standbys are further behind
    /// than the metadata RPO.
    fn check(&self) -> Result<(), MetaError> {
        let now = Instant::now();
        let until = *lock(&self.valid_until);
        if now >= until {
            tracing::error!(holder = %self.holder, epoch = self.epoch, "lease on the primary role expired: refusing writes");
            return Err(MetaError::Fenced(format!(
                "this meta's lease on the primary role (epoch {}) ran out {:?} ago without a renewal: the primary \
                 or its synchronous standby is unreachable; writes are refused until a renewal succeeds",
                self.epoch,
                now - until
            )));
        }
        let Some(rpo) = self.rpo else { return Ok(()) };
        let behind = now.saturating_duration_since(lock(&self.standbys).confirmed());
        if behind <= rpo {
            return Ok(());
        }
        tracing::error!(holder = %self.holder, ?behind, ?rpo, "standbys behind the metadata RPO: refusing writes");
        Err(MetaError::Fenced(format!(
            "no standby has confirmed what this primary wrote in the last {behind:.1?}, more than the metadata \
             RPO ({rpo:?}): writes are refused, so that a failover cannot lose more, until a standby catches up \
             (or meta restarts without --metadata-rpo); a role that may not read pg_stat_replication \
             (superuser or pg_monitor) sees no standby at all"
        )))
    }

    fn standby_behind(&self) -> Option<Duration> {
        let standbys = lock(&self.standbys);
        standbys.seen.then(|| standbys.confirmed().elapsed())
    }
}

impl PrimaryLease {
    /// Until when the lease holds (renewals that succeed move it later).
    pub(super) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
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
    let (replayed, replayed_ms) = match was_standby {
        false => (None, None),
        true => {
            let row = c.one(
                "SELECT pg_last_xact_replay_timestamp()::text, pg_last_wal_replay_lsn()::text, \
                 (EXTRACT(EPOCH FROM pg_last_xact_replay_timestamp()) * 1000)::bigint",
                &[],
            )?;
            let at: Option<String> = row.try_get(0)?;
            (at.zip(row.try_get::<_, Option<String>>(1)?), row.try_get::<_, Option<i64>>(2)?)
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
    // The failover point, for `locus meta lost` once the old primary is back.
    if let Some(ms) = replayed_ms {
        c.exec(
            "INSERT INTO counters (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            &[&super::lost::replayed_counter(epoch), &ms],
        )?;
    }
    Ok(Promotion { was_standby, waited_for_leases: started.elapsed(), epoch, replayed })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The standbys are up to date to the newest noted position they have flushed,
    /// never further; positions no standby reports move nothing.
    #[test]
    fn a_standby_confirms_the_moments_whose_positions_it_has_flushed() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut watch = StandbyWatch::new(t0);
        watch.note(at(10), 100, None);
        assert_eq!((watch.confirmed(), watch.seen), (t0, false), "no standby: nothing confirmed");
        watch.note(at(20), 200, Some(150));
        assert_eq!(watch.confirmed(), at(10), "100 flushed, 200 not yet");
        watch.note(at(30), 300, Some(199));
        assert_eq!(watch.confirmed(), at(10));
        watch.note(at(40), 300, Some(300));
        assert_eq!((watch.confirmed(), watch.pending.len()), (at(40), 0));
        for i in 0..PENDING_KEPT as u64 + 5 {
            watch.note(at(50 + i), 400 + i as i64, Some(300));
        }
        assert_eq!((watch.confirmed(), watch.pending.len()), (at(40), PENDING_KEPT), "bounded while none flushes");
    }
}
