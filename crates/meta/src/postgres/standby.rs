//! Reads at a hot standby: the WAL position of this meta's latest commit, and a read
//! connection that reads at the standby once it has replayed it (read-your-writes), or
//! at the primary after `STANDBY_WAIT`.

use crate::error::MetaError;
use crate::store::{ReadConn, ReadOp};
use postgres::SimpleQueryMessage;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::conn::{Answer, Last, PgConn};
use super::seen::Seen;
use super::wire::Wire;

impl PgConn {
    /// Commits like `WriteConn::commit` (`durable`: flushed, with `synchronous_commit`
    /// on for this commit unless the session has it on already, `flushed`) and
    /// publishes the commit's WAL position to `committed`: an upper bound, the flushed
    /// position right after a flushed commit (as far as a standby can get), the
    /// inserted one after another (a standby gets there once the WAL writer flushed it,
    /// within `wal_writer_delay`).
    /// The next BEGIN cannot ride along (after the SELECT, it would find a query already
    /// run in its implicit transaction), so it goes with the next transaction's first
    /// statements (`begin_pending`) instead of costing a round trip of its own, across
    /// the WAN from a standby's site.
    pub(super) fn commit_reporting_lsn(
        &mut self,
        committed: &AtomicU64,
        durable: bool,
        flushed: bool,
    ) -> Result<(), MetaError> {
        self.begun = false;
        self.release_pending = false;
        self.seen = Seen::default();
        let unlock = if self.alone { concat!("; SELECT pg_advisory_unlock(", writers_lock!(), ")") } else { "" };
        let (flush, position) = match (durable, flushed) {
            (_, true) => ("", "flush"),
            (true, false) => ("SET LOCAL synchronous_commit TO on; ", "flush"),
            (false, false) => ("", "insert"),
        };
        let Answer::Simple(answers) = self
            .pipeline(Last::Simple(&format!("{flush}COMMIT; SELECT pg_current_wal_{position}_lsn()::text{unlock}")))?
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

/// A WAL position as PostgreSQL prints it (`16/B374D848`).
pub(super) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(u64::from_str_radix(hi, 16).ok()? << 32 | u64::from_str_radix(lo, 16).ok()?)
}

/// How long a read at a hot standby waits for it to replay this meta's latest commit
/// before it reads from the primary instead.
pub(super) const STANDBY_WAIT: Duration = Duration::from_millis(50);

/// A read connection at a site with a hot standby: reads there once the standby has
/// replayed this meta's latest commit (read-your-writes for every client of this
/// meta), else, after `STANDBY_WAIT`, from the primary. What it reads at the standby
/// is kept only if the standby had replayed the kept rows' floor (`kept`).
pub(super) struct StandbyReader {
    pub(super) standby: PgConn,
    pub(super) primary: PgConn,
    /// The WAL position of this meta's latest commit, published by its writer.
    pub(super) committed: Arc<AtomicU64>,
    /// How far the standby had replayed when last asked over this connection: a read
    /// needing no more than that asks nothing first (replay only moves forward while
    /// the connection lives; a restarted standby may start behind, so a new connection
    /// starts from 0).
    pub(super) replayed: u64,
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
