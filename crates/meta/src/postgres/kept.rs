//! Rows of the namespace that a meta over PostgreSQL keeps in memory between
//! transactions, so that a lookup or a getattr of something recently read or written
//! costs no round trip to the server (on SQLite such a read is already in-process).
//!
//! Only inodes and entries are kept, and which inodes have no extended attributes
//! (every change of an inode's attributes also changes the inode, its ctime, so that
//! knowledge goes wherever the inode's row goes): the kernel asks for
//! `security.capability` before every write. Read connections answer from them; a write
//! transaction takes rows from them only under a guard that re-reads the same rows at
//! the server ahead of its writes (`PgConn::assume_entry`), so SERIALIZABLE still sees
//! its conflicts. What this meta commits replaces the rows it wrote before the
//! write is answered, so its clients read their own writes. What other metas commit
//! reaches this one through PostgreSQL's LISTEN/NOTIFY, but only while some meta keeps
//! rows: a meta alone on its database notifies nobody and wakes nobody.
//!
//! Who keeps rows is told by an advisory lock (`KEPT_ROWS_LOCK`), not a table, because
//! a table is read in a transaction's snapshot, which may be older than a meta that
//! registered since. The writer's session of every meta that keeps rows holds the lock
//! shared; every writer that changed inodes or entries tries it exclusively in its
//! commit's round trip (`PgConn::commit_gate`). Its own meta's hold never conflicts with
//! it (PostgreSQL never makes a session wait for itself), so the try fails exactly when
//! another meta keeps rows, and only then does the commit notify. A meta that takes the
//! lock cannot get it while a writer holds its exclusive try, so every commit that did
//! not notify it has ended before it keeps anything. Rows are kept and answered only
//! while both the lock is held and the listener is connected; between the writer's
//! session ending on the server and this meta noticing (its next transaction, or the
//! listener's check every second) reads may still answer rows others changed, as the
//! kernel's own attribute cache does for a second.
//!
//! A read stores what it read only if no change was applied since it began (the
//! `generation`), so a read that raced a commit never puts back what the commit
//! replaced.
//!
//! A meta at a site with a hot standby keeps rows too: it reads them at the standby,
//! takes the lock and listens at the primary. A notification (or a commit that never
//! notified, before the lock was taken) may reach it before the standby replays the
//! commit, so a read there could put back what the notification dropped. Each such
//! event therefore raises a `floor`, a WAL position at or past the commit, asked of
//! the primary after the event; rows read at the standby are kept only if it had
//! replayed the floor before the read began (`StandbyReader`), and none while a
//! notification's floor is still being asked (`unsettled`).

use crate::store::Inode;
use proto::types::InodeId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use util::sync::lock;

/// Rows kept before everything is dropped and kept afresh (about 100 MB of inodes).
const MAX_ROWS: usize = 1 << 18;

/// `KEPT_ROWS_LOCK` as PostgreSQL's `pg_locks` shows a bigint key: its high and low halves.
const LOCK_HALVES: (i64, i64) = (KEPT_ROWS_LOCK >> 32, KEPT_ROWS_LOCK & 0xffff_ffff);

/// How often the listener checks that its meta's writer still holds the lock.
const HOLDER_CHECK: Duration = Duration::from_secs(1);

/// Longest payload sent in one notification (PostgreSQL refuses 8000 bytes and more).
const MAX_PAYLOAD: usize = 7000;

/// An entry's key: its directory and its name.
pub(super) type EntryKey = (InodeId, Vec<u8>);

/// What one write transaction changed: each key with its committed row (`None`:
/// deleted, or not known well enough to keep).
#[derive(Default)]
pub(super) struct Written {
    pub(super) inodes: HashMap<InodeId, Option<Inode>>,
    pub(super) entries: HashMap<EntryKey, Option<InodeId>>,
    /// Inodes of `inodes` known to have no extended attributes when committed.
    pub(super) bare: HashSet<InodeId>,
}

impl Written {
    /// No inode or entry was changed: nothing to notify.
    pub(super) fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.entries.is_empty()
    }

    /// Keeps the keys but forgets the rows (an op rolled back to its savepoint: what
    /// it wrote is not what commits, so those keys are only dropped from the cache).
    pub(super) fn distrust(&mut self) {
        self.inodes.values_mut().for_each(|v| *v = None);
        self.entries.values_mut().for_each(|v| *v = None);
        self.bare.clear();
    }

    /// The notifications that name every key: `<sender> i<ino> e<parent>:<hex name> ...`,
    /// split to fit PostgreSQL's payload limit.
    pub(super) fn payloads(&self, sender: &str) -> Vec<String> {
        let keys = self
            .inodes
            .keys()
            .map(|ino| format!("i{ino}"))
            .chain(self.entries.keys().map(|(parent, name)| format!("e{parent}:{}", hex::encode(name))));
        let mut out: Vec<String> = Vec::new();
        for key in keys {
            match out.last_mut() {
                Some(last) if last.len() + 1 + key.len() <= MAX_PAYLOAD => {
                    last.push(' ');
                    last.push_str(&key);
                }
                _ => out.push(format!("{sender} {key}")),
            }
        }
        out
    }
}

#[derive(Default)]
struct Rows {
    inodes: HashMap<InodeId, Inode>,
    entries: HashMap<EntryKey, InodeId>,
    /// Inodes without extended attributes; dropped with any change of the inode.
    bare: HashSet<InodeId>,
}

/// The rows every connection of one meta shares (see the module's comment).
pub(super) struct SharedRows {
    rows: Mutex<Rows>,
    /// Bumped by every change applied.
    generation: AtomicU64,
    /// This meta reads at a hot standby: its listener asks the primary for a floor
    /// after each notification.
    standby: bool,
    /// The WAL position a standby must have replayed for rows read there to be kept.
    floor: AtomicU64,
    /// A notification was applied whose floor is not yet known.
    unsettled: AtomicBool,
    /// The listener is connected.
    listening: AtomicBool,
    /// The backend pid of this meta's writer session while it holds `KEPT_ROWS_LOCK`
    /// (0: not held). Rows are kept and answered only while it is held and the
    /// listener is connected.
    holder: AtomicI32,
    /// This meta's name in notifications (its own are not applied twice).
    me: String,
}

impl SharedRows {
    /// Shared rows for a meta (`standby`: one that reads at a hot standby); it keeps
    /// rows only once its writer holds the lock and `listen` has connected.
    pub(super) fn new(standby: bool) -> Arc<SharedRows> {
        // Only told apart from other metas' names: a clock-derived name will do if
        // /dev/urandom cannot be read.
        let me = crate::store::values::random_hex().unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            format!("{:x}", nanos as u64 ^ u64::from(std::process::id()))
        });
        Arc::new(SharedRows {
            rows: Mutex::default(),
            generation: AtomicU64::new(0),
            standby,
            floor: AtomicU64::new(0),
            unsettled: AtomicBool::new(standby),
            listening: AtomicBool::new(false),
            holder: AtomicI32::new(0),
            me,
        })
    }

    fn live(&self) -> bool {
        self.listening.load(Ordering::Acquire) && self.holder.load(Ordering::Acquire) != 0
    }

    /// The writer should take the lock (it does not hold it).
    pub(super) fn wants_lock(&self) -> bool {
        self.holder.load(Ordering::Acquire) == 0
    }

    /// The writer's session `pid` now holds the lock (0: its session ended, or it never
    /// got it), taken when the primary's WAL was at `at`: commits that did not notify
    /// this meta are behind it. Everything kept is dropped either way.
    pub(super) fn set_holder(&self, pid: i32, at: u64) {
        self.floor.fetch_max(at, Ordering::SeqCst);
        self.reset(|| self.holder.store(pid, Ordering::Release));
    }

    /// How far a standby must have replayed for rows read there to be kept (`None`:
    /// not known yet). Ask it after `generation`: a change applied in between makes
    /// the read keep nothing anyway.
    pub(super) fn floor(&self) -> Option<u64> {
        (!self.unsettled.load(Ordering::SeqCst)).then(|| self.floor.load(Ordering::SeqCst))
    }

    /// The floor of every notification applied so far is `at` (asked of the primary
    /// after them).
    fn settle(&self, at: u64) {
        self.floor.fetch_max(at, Ordering::SeqCst);
        self.unsettled.store(false, Ordering::SeqCst);
    }

    /// This meta's sender name in notifications.
    pub(super) fn me(&self) -> &str {
        &self.me
    }

    /// Where a read begins: pass it to `keep`.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn inode(&self, ino: InodeId) -> Option<Inode> {
        if !self.live() {
            return None;
        }
        lock(&self.rows).inodes.get(&ino).cloned()
    }

    pub(super) fn entry(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        if !self.live() {
            return None;
        }
        lock(&self.rows).entries.get(&(parent, name.to_vec())).copied()
    }

    /// The inode is known to have no extended attributes.
    pub(super) fn bare(&self, ino: InodeId) -> bool {
        self.live() && lock(&self.rows).bare.contains(&ino)
    }

    /// Keeps rows a read found, and the inodes it found `bare` of extended attributes,
    /// unless a change was applied since it began at `generation` (the read may then
    /// hold rows the change replaced).
    pub(super) fn keep<'a>(
        &self,
        generation: u64,
        inodes: impl Iterator<Item = (&'a InodeId, &'a Inode)>,
        entries: impl Iterator<Item = (&'a EntryKey, InodeId)>,
        bare: impl Iterator<Item = InodeId>,
    ) {
        if !self.live() {
            return;
        }
        let mut rows = lock(&self.rows);
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if rows.inodes.len() >= MAX_ROWS || rows.entries.len() >= MAX_ROWS || rows.bare.len() >= MAX_ROWS {
            *rows = Rows::default();
        }
        rows.bare.extend(bare);
        for (ino, inode) in inodes {
            rows.inodes.insert(*ino, inode.clone());
        }
        for (key, ino) in entries {
            rows.entries.insert(key.clone(), ino);
        }
    }

    /// Applies a committed write: its rows replace what was kept, deleted or
    /// distrusted ones are dropped.
    pub(super) fn committed(&self, written: &Written) {
        let mut rows = lock(&self.rows);
        self.generation.fetch_add(1, Ordering::AcqRel);
        let keep = self.live();
        for (ino, inode) in &written.inodes {
            match inode {
                Some(inode) if keep => rows.inodes.insert(*ino, inode.clone()),
                _ => rows.inodes.remove(ino),
            };
            match inode.is_some() && keep && written.bare.contains(ino) {
                true => rows.bare.insert(*ino),
                false => rows.bare.remove(ino),
            };
        }
        for (key, ino) in &written.entries {
            match ino {
                Some(ino) if keep => rows.entries.insert(key.clone(), *ino),
                _ => rows.entries.remove(key),
            };
        }
    }

    /// Drops the keys a write whose outcome is unknown touched.
    pub(super) fn forget(&self, written: &Written) {
        let mut rows = lock(&self.rows);
        self.generation.fetch_add(1, Ordering::AcqRel);
        for ino in written.inodes.keys() {
            rows.inodes.remove(ino);
            rows.bare.remove(ino);
        }
        for key in written.entries.keys() {
            rows.entries.remove(key);
        }
    }

    /// Drops everything kept, and keeps rows read at a standby again only once it has
    /// replayed `position` (another meta committed a write there for this meta).
    pub(super) fn committed_elsewhere(&self, position: u64) {
        self.floor.fetch_max(position, Ordering::SeqCst);
        self.reset(|| {});
    }

    /// Drops everything, changing whether rows are kept with `change` under the rows'
    /// lock (a read that began before keeps nothing: the generation moved).
    fn reset(&self, change: impl FnOnce()) {
        let mut rows = lock(&self.rows);
        self.generation.fetch_add(1, Ordering::AcqRel);
        *rows = Rows::default();
        let was = self.live();
        change();
        match (was, self.live()) {
            (false, true) => tracing::info!("keeping inodes and entries in memory between transactions"),
            (true, false) => tracing::info!(
                listening = self.listening.load(Ordering::Acquire),
                lock_held = self.holder.load(Ordering::Acquire) != 0,
                "no longer keeping inodes and entries in memory"
            ),
            _ => {}
        }
    }

    /// The writer session `pid` was found without the lock (it ended on the server):
    /// nothing is kept until the writer takes it again.
    fn holder_gone(&self, pid: i32) {
        self.reset(|| {
            let _ = self.holder.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Acquire);
        });
    }

    /// The listener connected (or lost its connection). Commits before its LISTEN were
    /// never heard of: at a standby, nothing is kept until their floor is settled.
    fn set_listening(&self, listening: bool) {
        if listening && self.standby {
            self.unsettled.store(true, Ordering::SeqCst);
        }
        self.reset(|| self.listening.store(listening, Ordering::Release));
    }

    /// Applies another meta's notification (see `Written::payloads`); a payload it
    /// cannot read drops everything.
    fn notified(&self, payload: &str) {
        let mut words = payload.split(' ');
        if words.next() == Some(self.me.as_str()) {
            return;
        }
        if self.standby {
            self.unsettled.store(true, Ordering::SeqCst);
        }
        let mut rows = lock(&self.rows);
        self.generation.fetch_add(1, Ordering::AcqRel);
        for word in words {
            let parsed = match word.split_at_checked(1) {
                Some(("i", ino)) => ino.parse().ok().map(|ino: InodeId| {
                    rows.inodes.remove(&ino);
                    rows.bare.remove(&ino);
                }),
                Some(("e", key)) => key.split_once(':').and_then(|(parent, name)| {
                    let parent: InodeId = parent.parse().ok()?;
                    rows.entries.remove(&(parent, hex::decode(name).ok()?));
                    Some(())
                }),
                _ => None,
            };
            if parsed.is_none() {
                tracing::warn!(payload, "unreadable row notification; dropping every kept row");
                *rows = Rows::default();
                return;
            }
        }
    }
}

/// Listens for other metas' changes on `config`'s database for as long as `shared`
/// lives (a thread of its own), and checks every second that its meta's writer session
/// still holds the lock. Rows are kept only while it is connected; when the connection
/// fails it drops every row and connects again a second later.
pub(super) fn listen(config: tokio_postgres::Config, shown: String, shared: &Arc<SharedRows>) {
    use postgres::fallible_iterator::FallibleIterator;
    /// At a standby, asks the primary for the floor of what was heard (its WAL position
    /// now is at or past every commit notified or committed before the LISTEN).
    fn settle(client: &mut postgres::Client, shared: &SharedRows) -> Result<(), postgres::Error> {
        if shared.standby && shared.unsettled.load(Ordering::SeqCst) {
            let at: String = client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])?.get(0);
            shared.settle(super::standby::parse_lsn(&at).unwrap_or(u64::MAX));
        }
        Ok(())
    }
    let weak: Weak<SharedRows> = Arc::downgrade(shared);
    // map-check: not a worker (a blocking thread waiting on a PostgreSQL connection of its
    // own for notifications; it ends when its SharedRows is dropped)
    let spawned = std::thread::Builder::new().name("meta-row-listener".into()).spawn(move || {
        let mut config = postgres::Config::from(config);
        config.application_name("locus-meta-listener");
        let mut failing = false;
        while weak.strong_count() > 0 {
            let listened = (|| -> Result<(), postgres::Error> {
                let mut client = config.connect(postgres::NoTls)?;
                client.batch_execute(&format!("LISTEN {KEPT_ROWS_CHANNEL}"))?;
                {
                    // Anything committed before the LISTEN took effect was never heard of.
                    let Some(shared) = weak.upgrade() else { return Ok(()) };
                    shared.set_listening(true);
                    settle(&mut client, &shared)?;
                }
                if std::mem::take(&mut failing) {
                    tracing::info!(db = %shown, "listening for other metas' changes again; rows are kept again");
                }
                loop {
                    let until = Instant::now() + HOLDER_CHECK;
                    loop {
                        let left = until.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break;
                        }
                        let heard = {
                            let mut notifications = client.notifications();
                            let Some(first) = notifications.timeout_iter(left).next()? else { break };
                            let Some(shared) = weak.upgrade() else { return Ok(()) };
                            shared.notified(first.payload());
                            // Those already here too, so that one floor settles them all.
                            let mut pending = notifications.iter();
                            while let Some(n) = pending.next()? {
                                shared.notified(n.payload());
                            }
                            shared
                        };
                        settle(&mut client, &heard)?;
                    }
                    let Some(shared) = weak.upgrade() else { return Ok(()) };
                    // Also how a closed connection shows, with its reason.
                    let pid = shared.holder.load(Ordering::Acquire);
                    let held: bool = client
                        .query_one(
                            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 \
                             AND classid::bigint = $2 AND objid::bigint = $3 AND objsubid = 1 AND granted)",
                            &[&pid, &LOCK_HALVES.0, &LOCK_HALVES.1],
                        )?
                        .get(0);
                    if pid != 0 && !held {
                        tracing::warn!(db = %shown, pid, "this meta's writer session no longer holds the kept-rows lock; dropping every kept row until it takes it again");
                        shared.holder_gone(pid);
                    }
                }
            })();
            let Some(shared) = weak.upgrade() else { return };
            shared.set_listening(false);
            if let Err(e) = listened {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(db = %shown, error = %e, "cannot listen for other metas' changes; keeping no rows in memory until it can");
                }
                drop(shared);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the row listener ({e}); keeping no rows in memory");
    }
}

/// The advisory lock of metas that keep rows (`sql::kept_rows_lock`).
pub(super) const KEPT_ROWS_LOCK: i64 = kept_rows_lock!();
/// The channel their notifications go out on (`sql::kept_rows_channel`).
pub(super) const KEPT_ROWS_CHANNEL: &str = kept_rows_channel!();

/// The SQLSTATE of a commit refused because a row its transaction took from the rows
/// its meta keeps had changed (raised by `locus_expect`; see `PgConn::assume_entry`).
/// It is a conflict: the transaction runs again, reading from the server.
pub(super) const KEPT_ROW_STALE_SQLSTATE: &str = "LK001";

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared rows as a meta that holds the lock and listens has them.
    fn live() -> Arc<SharedRows> {
        let shared = SharedRows::new(false);
        shared.set_listening(true);
        shared.set_holder(1, 0);
        shared
    }

    fn inode(ino: InodeId) -> Inode {
        let mut row = crate::store::values::root_inode();
        row.attr.ino = ino;
        row
    }

    #[test]
    fn a_read_that_raced_a_change_keeps_nothing() {
        let shared = live();
        let began = shared.generation();
        let mut w = Written::default();
        w.inodes.insert(5, Some(inode(5)));
        shared.committed(&w);
        let stale = inode(6);
        shared.keep(began, [(&6, &stale)].into_iter(), std::iter::empty(), std::iter::empty());
        assert!(shared.inode(6).is_none(), "kept a row read before a change");
        assert_eq!(shared.inode(5).map(|i| i.attr.ino), Some(5), "the committed row is kept");
        shared.keep(shared.generation(), [(&6, &stale)].into_iter(), std::iter::empty(), std::iter::empty());
        assert!(shared.inode(6).is_some());
    }

    #[test]
    fn notifications_name_every_key_and_drop_them_elsewhere() {
        let (here, there) = (live(), live());
        let name = vec![0u8, b' ', 0xff, b':'];
        let mut w = Written::default();
        for ino in 0..2000 {
            w.inodes.insert(ino, None);
        }
        w.entries.insert((7, name.clone()), None);
        let payloads = w.payloads(here.me());
        assert!(payloads.len() > 1 && payloads.iter().all(|p| p.len() < 8000), "split to fit");
        let kept = inode(3);
        let key = (7, name);
        there.keep(there.generation(), [(&3, &kept)].into_iter(), [(&key, 3)].into_iter(), std::iter::empty());
        there.keep(there.generation(), [(&4000, &kept)].into_iter(), std::iter::empty(), std::iter::empty());
        payloads.iter().for_each(|p| there.notified(p));
        assert!(there.inode(3).is_none() && there.entry(7, &key.1).is_none(), "dropped");
        assert!(there.inode(4000).is_some(), "untouched rows stay");
        // Its own notifications change nothing; an unreadable one drops everything.
        payloads.iter().for_each(|p| here.notified(p));
        there.notified("someone i12x");
        assert!(there.inode(4000).is_none());
    }

    #[test]
    fn nothing_is_kept_or_answered_without_both_the_lock_and_the_listener() {
        let shared = SharedRows::new(false);
        let row = inode(9);
        let keep =
            || shared.keep(shared.generation(), [(&9, &row)].into_iter(), std::iter::empty(), std::iter::empty());
        keep();
        shared.set_listening(true);
        keep();
        assert!(shared.inode(9).is_none(), "kept without the lock");
        assert!(shared.wants_lock());
        shared.set_holder(42, 0);
        assert!(!shared.wants_lock());
        assert!(shared.inode(9).is_none(), "taking the lock drops what was kept before");
        keep();
        assert!(shared.inode(9).is_some());
        shared.holder_gone(41);
        assert!(shared.inode(9).is_none() && !shared.wants_lock(), "another session's loss drops rows, not the hold");
        keep();
        shared.holder_gone(42);
        assert!(shared.wants_lock());
        keep();
        assert!(shared.inode(9).is_none());
        shared.set_holder(43, 0);
        keep();
        shared.set_listening(false);
        assert!(shared.inode(9).is_none());
        keep();
        assert!(shared.inode(9).is_none());
    }

    #[test]
    fn at_a_standby_the_floor_is_unknown_from_each_notification_until_settled() {
        let shared = SharedRows::new(true);
        assert_eq!(shared.floor(), None, "nothing heard yet");
        shared.set_listening(true);
        shared.set_holder(1, 3);
        assert_eq!(shared.floor(), None, "commits before the LISTEN are not settled");
        shared.settle(5);
        assert_eq!(shared.floor(), Some(5));
        shared.notified(&format!("{} i1", shared.me()));
        assert_eq!(shared.floor(), Some(5), "its own commits are waited for by position, not floor");
        shared.notified("other i1");
        assert_eq!(shared.floor(), None);
        shared.settle(4);
        assert_eq!(shared.floor(), Some(5), "the floor never goes back");
        shared.set_holder(2, 9);
        assert_eq!(shared.floor(), Some(9), "commits before the lock was taken");
        assert_eq!(SharedRows::new(false).floor(), Some(0), "a meta at the primary needs none");
    }
}
