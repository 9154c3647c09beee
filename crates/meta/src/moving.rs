//! Moving a metadata home to another site (`locus home move NAME --to SITE`, issue 35).
//!
//! A home is one PostgreSQL database; a site runs one PostgreSQL server (its primary)
//! and a hot standby of every other site's. A move makes a new database for the home
//! on the destination's primary, then pauses the home's writes at both metas, fences
//! the old primary (its epoch bumped: no meta commits there any more), copies the rows
//! from the destination's own standby of the old primary once that has replayed the
//! fence (so they cross no WAN at that point), records the new placement in home 0's
//! registry, and lets the writes go on at the new primary. The standbys of the
//! destination's server at every other site have the new database by replication.
//!
//! The registry record is the commit point: a meta that starts, or that was left
//! fenced by a move that failed half way, places the home as the registry says
//! (`reconcile`), so a lost message costs a pause, never two writers.

mod auto;

pub use auto::AutoMove;
pub(crate) use auto::Tallies;

use crate::engine::{self, Store};
use crate::error::MetaError;
use crate::homes::{Home, HomeId};
use crate::postgres::moving as pg;
use crate::service::{Forwarding, MetaService, Placed};
use proto::meta::{HandOverHome, HandedOver, HomeMoved, HomeTaken, MoveHome, MoveRecord, PrepareHome};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use util::sync::lock;
use util::worker::{Step, Worker};

/// How this meta reaches one site's PostgreSQL server and meta (`locus meta
/// --site-db`, `--site-read-db`, `--site-meta`): a home placed at that site is the
/// database of that name on its server.
#[derive(Clone, Debug, Default)]
pub struct SiteConfig {
    pub name: String,
    /// The site's primary server, as this meta writes to it (any database of it).
    pub db_url: Option<String>,
    /// This site's hot standby of that server (any database of it).
    pub read_db_url: Option<String>,
    /// The site's meta (`host:port`), which commits the homes held there.
    pub meta: Option<String>,
}

/// Where a moved home lives, as home 0's registry records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub site: String,
    pub database: String,
    pub moves: u64,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "site {}, database {}, moved {} time(s)", self.site, self.database, self.moves)
    }
}

/// The attribute of inode 0 in home 0's engine that records where home `name` was
/// moved to: "SITE DATABASE MOVES".
fn placement_key(name: &str) -> Vec<u8> {
    format!("locus.home-at.{name}").into_bytes()
}

impl Placement {
    fn parse(name: &str, value: &[u8]) -> Result<Placement, MetaError> {
        let text = String::from_utf8_lossy(value);
        let mut parts = text.split(' ');
        match (parts.next(), parts.next(), parts.next().and_then(|m| m.parse().ok()), parts.next()) {
            (Some(site), Some(database), Some(moves), None) => {
                Ok(Placement { site: site.into(), database: database.into(), moves })
            }
            _ => Err(MetaError::Corrupt(format!("placement of home {name}: {text:?}"))),
        }
    }

    fn encode(&self) -> Vec<u8> {
        format!("{} {} {}", self.site, self.database, self.moves).into_bytes()
    }

    /// The database name the next move makes: the home's first name and the move's
    /// number (never one used before, so a leftover of a failed move is the only one
    /// ever dropped and made again).
    fn next_database(&self) -> String {
        let base = match self.database.rsplit_once("_m") {
            Some((base, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => base,
            _ => &self.database,
        };
        format!("{base}_m{}", self.moves + 1)
    }
}

/// Home `name`'s placement in the registry (`None`: never moved). Blocking.
pub(crate) fn registered(root: &Store, name: &str) -> Result<Option<Placement>, MetaError> {
    root.read(|t| registered_in(t, name))
}

/// `registered`, in a transaction of home 0's engine.
pub(crate) fn registered_in(t: &mut dyn crate::store::Txn, name: &str) -> Result<Option<Placement>, MetaError> {
    t.get_xattr(0, &placement_key(name))?.map(|v| Placement::parse(name, &v)).transpose()
}

/// The attribute of inode 0 in home 0's engine that keeps home `name`'s latest moves,
/// one a line: "AT_MS FROM TO ROWS PAUSED_MS REASON".
fn records_key(name: &str) -> Vec<u8> {
    format!("locus.home-moves.{name}").into_bytes()
}

/// Moves a home's record keeps.
const RECORDS_KEPT: usize = 16;

/// Home `name`'s past moves, oldest first, in a transaction of home 0's engine.
pub(crate) fn records_in(t: &mut dyn crate::store::Txn, name: &str) -> Result<Vec<MoveRecord>, MetaError> {
    let Some(value) = t.get_xattr(0, &records_key(name))? else { return Ok(Vec::new()) };
    let text = String::from_utf8_lossy(&value);
    text.lines()
        .map(|line| {
            let mut f = line.splitn(6, ' ');
            let mut next = || f.next().unwrap_or_default().to_string();
            let (at_ms, from_site, to_site, rows, paused_ms, reason) = (next(), next(), next(), next(), next(), next());
            match (at_ms.parse(), rows.parse(), paused_ms.parse()) {
                (Ok(at_ms), Ok(rows), Ok(paused_ms)) if !to_site.is_empty() => {
                    Ok(MoveRecord { at_ms, from_site, to_site, rows, paused_ms, reason })
                }
                _ => Err(MetaError::Corrupt(format!("record of home {name}'s moves: {line:?}"))),
            }
        })
        .collect()
}

/// Adds `record` to home `name`'s moves (the oldest beyond `RECORDS_KEPT` go), unless it
/// is the latest already.
fn add_record(t: &mut dyn crate::store::Txn, name: &str, record: &MoveRecord) -> Result<(), MetaError> {
    let mut records = records_in(t, name)?;
    // Written again after a refusal whose commit may have landed: once.
    if records.last() != Some(record) {
        records.push(record.clone());
    }
    let keep = records.len().saturating_sub(RECORDS_KEPT);
    let text: Vec<String> = records[keep..]
        .iter()
        .map(|r| {
            let reason = r.reason.replace('\n', " ");
            format!("{} {} {} {} {} {reason}", r.at_ms, r.from_site, r.to_site, r.rows, r.paused_ms)
        })
        .collect();
    t.set_xattr(0, &records_key(name), text.join("\n").as_bytes())
}

/// How one home's engine was opened here: where it is, and the URLs and forwarding
/// that reach it.
#[derive(Clone, Debug)]
pub(crate) struct Opened {
    pub placement: Placement,
    pub writer: String,
    pub read: Option<String>,
    pub forward: Option<String>,
}

/// A home's engine at its next place, opened before the move pauses its writes.
pub(crate) type Opening = (Opened, Store);

/// A home this meta handed over to a mover: its writes wait at the closed gate, and its
/// engine at the new place is open already (`PrepareHome`).
pub(crate) struct HandedOverHome {
    gate: tokio::sync::OwnedRwLockWriteGuard<()>,
    ready: Option<Opening>,
    since: Instant,
}

/// The move this meta is carrying out, for `locus status`.
#[derive(Clone, Debug)]
pub(crate) struct MoveInProgress {
    home: HomeId,
    from: String,
    to: String,
    step: &'static str,
    since: Instant,
}

/// Clears the record of the move in progress when the move ends, however it ends.
struct Progress<'a>(&'a std::sync::Mutex<Option<MoveInProgress>>);

impl Progress<'_> {
    fn step(&self, step: &'static str) {
        if let Some(m) = lock(self.0).as_mut() {
            m.step = step;
        }
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        lock(self.0).take();
    }
}

/// What moves need of the configuration: the sites, this meta's own site (from its
/// certificate), and how engines are opened.
pub(crate) struct MoveSetup {
    pub sites: Vec<SiteConfig>,
    pub own_site: Option<String>,
    pub lease: Option<crate::store::LeaseTerms>,
    pub db_timeout: Duration,
    pub auto: AutoMove,
}

impl MoveSetup {
    fn own_site(&self) -> Result<&str, MetaError> {
        self.own_site.as_deref().ok_or_else(|| {
            MetaError::Unsupported("moving homes needs the meta's site: give it --site or a certificate".into())
        })
    }

    fn site(&self, name: &str) -> Result<&SiteConfig, MetaError> {
        self.sites.iter().find(|s| s.name == name).ok_or_else(|| {
            MetaError::InvalidArgument(format!(
                "site {name} is not configured at this meta: give it --site-db {name}=URL (and, for another \
                 site than its own, --site-read-db {name}=URL and --site-meta {name}=HOST:PORT)"
            ))
        })
    }

    /// The site whose meta is at `addr` (a home's forwarding address).
    pub(crate) fn site_of_meta(&self, addr: &str) -> Option<&str> {
        self.sites.iter().find(|s| s.meta.as_deref() == Some(addr)).map(|s| s.name.as_str())
    }

    /// How a home opened from its flags is placed: at this meta's site when it commits
    /// the home's writes, else at the site of the meta it forwards them to.
    pub(crate) fn flagged(&self, writer: &str, read: Option<&str>, forward: Option<&str>) -> Opened {
        let site = match forward {
            None => self.own_site.clone(),
            Some(addr) => self.site_of_meta(addr).map(String::from),
        };
        let database = pg::database_of(writer).unwrap_or(writer).to_string();
        Opened {
            placement: Placement { site: site.unwrap_or_else(|| "?".into()), database, moves: 0 },
            writer: writer.into(),
            read: read.map(String::from),
            forward: forward.map(String::from),
        }
    }

    /// The URLs and forwarding of a home placed at `p`, as this meta reaches it.
    pub(crate) fn placed(&self, name: &str, p: &Placement) -> Result<Opened, MetaError> {
        let own = self.own_site()?;
        let site = self.site(&p.site)?;
        let missing = |flag: &str| {
            MetaError::InvalidArgument(format!(
                "home {name} lives at site {} ({p}), which this meta has no {flag} {} for",
                p.site, p.site
            ))
        };
        let writer = pg::with_database(site.db_url.as_deref().ok_or_else(|| missing("--site-db"))?, &p.database)?;
        let (read, forward) = if p.site == own {
            (None, None)
        } else {
            let read = site.read_db_url.as_deref().map(|u| pg::with_database(u, &p.database)).transpose()?;
            (read, Some(site.meta.clone().ok_or_else(|| missing("--site-meta"))?))
        };
        Ok(Opened { placement: p.clone(), writer, read, forward })
    }

    /// Opening the engine `o` names, to run where blocking is allowed.
    pub(crate) fn opener(&self, o: Opened) -> impl FnOnce() -> Result<Store, MetaError> + Send + 'static {
        let (lease, timeout) = (self.lease.clone(), self.db_timeout);
        move || engine::open_store(&o.writer, o.read.as_deref(), false, lease, timeout)
    }
}

impl MetaService {
    /// `MoveHome`: carried out by the destination site's meta (`relayed` there once
    /// from any other).
    pub(crate) async fn move_home(self: &Arc<Self>, m: MoveHome, relayed: bool) -> Result<HomeMoved, MetaError> {
        let setup = &self.moves;
        let own = setup.own_site()?.to_string();
        if m.to_site != own && relayed {
            return Err(MetaError::InvalidArgument(format!(
                "a move to site {} reached the meta of site {own}: check --site-meta {}",
                m.to_site, m.to_site
            )));
        }
        if m.to_site != own {
            let addr = setup.site(&m.to_site)?.meta.clone().ok_or_else(|| {
                MetaError::InvalidArgument(format!("no --site-meta {}=HOST:PORT at this meta", m.to_site))
            })?;
            let link = self.meta_link(&addr).await?;
            return ask_on(&link, &addr, m, setup.db_timeout * 4).await;
        }
        let homes = self.homes();
        let id = homes
            .named(&m.home)
            .map(|h| h.id)
            .ok_or_else(|| MetaError::InvalidArgument(format!("no metadata home named {:?}", m.home)))?;
        if id == 0 {
            return Err(MetaError::Unsupported(
                "the root's home does not move (sessions, nodes and the registry live there)".into(),
            ));
        }
        let Ok(_one_move) = self.moving_now.clone().try_lock_owned() else {
            return Err(MetaError::Busy("another home move is in progress at this meta".into()));
        };
        let current = lock(&self.opened)
            .get(&id)
            .cloned()
            .ok_or_else(|| MetaError::Internal(format!("home {} has no record of how it was opened", m.home)))?;
        let Some(holder) = current.forward.clone() else {
            return Err(MetaError::InvalidArgument(format!("home {} is at site {own} already", m.home)));
        };
        if !current.writer.starts_with("postgres") {
            return Err(MetaError::Unsupported("only a home on PostgreSQL moves".into()));
        }
        let from = setup.site(&current.placement.site)?;
        let source = from.read_db_url.as_deref().ok_or_else(|| {
            MetaError::InvalidArgument(format!("no --site-read-db {}=URL (this site's standby of it)", from.name))
        })?;
        let source = pg::with_database(source, &current.placement.database)?;
        let server = setup.site(&own)?.db_url.clone().ok_or_else(|| {
            MetaError::InvalidArgument(format!("no --site-db {own}=URL (this site's primary) at this meta"))
        })?;
        let wanted = Placement {
            site: own.clone(),
            database: current.placement.next_database(),
            moves: current.placement.moves + 1,
        };
        let timeout = setup.db_timeout;
        // The move ends in a write of home 0's registry: not begun while this meta
        // could not make it (its lease there lapsed in a cut, and is being renewed).
        self.lease_of_root(timeout).await?;
        let started = Instant::now();
        *lock(&self.moving) = Some(MoveInProgress {
            home: id,
            from: current.placement.site.clone(),
            to: own.clone(),
            step: "making its database at the destination",
            since: started,
        });
        let progress = Progress(&self.moving);
        // The new database, before anything pauses, and meanwhile the one link to the
        // holder for every step.
        let (database, server2, source2) = (wanted.database.clone(), server.clone(), source.clone());
        let (made, link) = tokio::join!(
            blocking(move || pg::create_database(&server2, &database, &source2, timeout)),
            self.meta_link(&holder)
        );
        let ((target, took_spare), link) = (made?, link?);
        if took_spare {
            // Made again once this move is over (the worker waits for it).
            self.spare_taken.notify_one();
        }
        let created_ms = started.elapsed().as_millis() as u64;
        let cluster = self.cluster_id().to_string();
        // The holder opens the new database while the home's writes go on (a failure
        // there only costs the pause its opening at the end).
        let prepare =
            PrepareHome { cluster: cluster.clone(), home: id, site: own.clone(), database: wanted.database.clone() };
        progress.step("the holder opens the new database");
        if let Err(e) = ask_on(&link, &holder, prepare, timeout).await {
            tracing::warn!(home = m.home, error = %e, "the holder could not prepare the home's new engine");
        }
        // Writes of the home wait here, and then at the holder, until the move ends.
        progress.step("writes paused: the holder hands the home over");
        let gate = self.close_gate(id).await?;
        let paused = Instant::now();
        let prepared_ms = (paused - started).as_millis() as u64;
        let hand_over = HandOverHome { cluster: cluster.clone(), home: id };
        let handed: HandedOver = match ask_on(&link, &holder, hand_over, timeout * 2).await {
            Ok(h) => h,
            Err(e) => {
                drop(gate);
                let (database, server) = (wanted.database.clone(), server.clone());
                let _ = blocking(move || pg::drop_database(&server, &database, timeout)).await;
                return Err(e);
            }
        };
        let handed_ms = paused.elapsed().as_millis() as u64;
        util::crash_point!("move-after-hand-over");
        progress.step("writes paused: copying the home's rows");
        let placed = async {
            let (source, target) = (source.clone(), target.clone());
            let (rows, copied_at) = blocking(move || pg::copy_home(&source, handed.position, &target, timeout)).await?;
            tracing::debug!(home = m.home, rows, after_ms = paused.elapsed().as_millis() as u64, "home copied");
            progress.step("writes paused: recording the home's new place");
            let (name, key, value) = (m.home.clone(), placement_key(&m.home), wanted.encode());
            let record = MoveRecord {
                at_ms: proto::types::Timestamp::now().millis() as u64,
                from_site: current.placement.site.clone(),
                to_site: own.clone(),
                rows,
                paused_ms: paused.elapsed().as_millis() as u64,
                reason: m.reason.clone().unwrap_or_else(|| "an operator's `locus home move`".into()),
            };
            let record = move |t: &mut dyn crate::store::Txn| {
                add_record(t, &name, &record)?;
                t.set_xattr(0, &key, &value)
            };
            // A lease refused at begin or before COMMIT committed nothing: once it is
            // renewed, the record is written again.
            match engine::write_async(self.root_store().clone(), true, record.clone()).await {
                Err(MetaError::Fenced(why)) => {
                    tracing::warn!(home = m.home, why, "recording the move waits for this meta's lease on home 0");
                    self.lease_of_root(timeout).await?;
                    engine::write_async(self.root_store().clone(), true, record).await?;
                }
                written => written?,
            }
            util::crash_point!("move-after-record");
            Ok::<_, MetaError>((rows, copied_at, self.root_store().commit_position()))
        }
        .await;
        // Whatever happened, the holder places the home as the registry now says.
        let positions = match &placed {
            Ok((_, copied_at, registry_at)) => vec![(0, *registry_at), (id, *copied_at)],
            Err(_) => vec![],
        };
        let (rows, _, _) = match placed {
            Ok(done) => done,
            Err(e) => {
                let _ = ask_on(&link, &holder, HomeTaken { cluster, home: id, positions }, timeout).await;
                // A registry record whose commit's outcome is unknown may have landed:
                // this meta too places the home as the registry says.
                if let Err(placing) = self.reconcile(id, false, None, None).await {
                    tracing::error!(home = m.home, error = %placing, "placing the home after a failed move failed");
                }
                drop(gate);
                return Err(e);
            }
        };
        let copied_ms = paused.elapsed().as_millis() as u64;
        progress.step("writes paused: both metas take the home up");
        // Both metas place the home at once; the old holder's writes of it go on once it
        // has, and the move's pause ends then.
        let (placed_here, told) = tokio::join!(
            async {
                let placed = self.reconcile(id, false, None, None).await;
                drop(gate);
                placed
            },
            ask_on(&link, &holder, HomeTaken { cluster, home: id, positions }, timeout * 2)
        );
        let paused_ms = paused.elapsed().as_millis() as u64;
        if let Err(e) = told {
            tracing::warn!(home = m.home, error = %e, "the old holder was not told of the move; it finds out from the registry");
        }
        placed_here?;
        tracing::info!(
            home = m.home,
            from = current.placement.site,
            to = own,
            rows,
            fenced_epoch = handed.epoch,
            took_spare,
            created_ms,
            prepared_ms,
            handed_ms,
            copied_ms,
            paused_ms,
            "home moved"
        );
        Ok(HomeMoved {
            home: m.home,
            from_site: current.placement.site,
            to_site: own,
            database: wanted.database,
            rows,
            paused_ms,
        })
    }

    /// `PrepareHome`, at the meta holding the home: opens its engine at the place the
    /// move takes it to (across the WAN, a couple of dozen round trips) while the home's
    /// writes still go on, and answers once it is open.
    /// The engine is kept only for the move that asked, and only for a while: a mover
    /// that stopped waiting for it (a slow WAN) hands the home over without it, and an
    /// engine nobody takes would hold a lease on the new database and show a move in
    /// progress for good.
    pub(crate) async fn prepare_home(self: &Arc<Self>, m: PrepareHome) -> Result<(), MetaError> {
        let current = self.held(&m.cluster, m.home)?;
        let to = Placement { site: m.site, database: m.database, moves: current.placement.moves + 1 };
        let opened = self.moves.placed(self.homes().name_of(m.home)?, &to)?;
        let store = blocking(self.moves.opener(opened.clone())).await?;
        let since = Instant::now();
        {
            // Under `preparing`'s lock, as `hand_over` takes it: no hand-over between
            // the check and the insert.
            let mut preparing = lock(&self.preparing);
            let unchanged = lock(&self.opened).get(&m.home).is_some_and(|o| o.placement == current.placement);
            if !unchanged || lock(&self.handed_over).contains_key(&m.home) {
                drop(preparing);
                close(store).await;
                return Err(MetaError::Busy(format!(
                    "home {} was handed over or moved while its new engine opened: the move went on without it",
                    m.home
                )));
            }
            preparing.insert(m.home, (since, (opened, store)));
        }
        let me = Arc::downgrade(self);
        let unused_after = self.moves.db_timeout * 4;
        tokio::spawn(async move {
            tokio::time::sleep(unused_after).await;
            let Some(me) = me.upgrade() else { return };
            let stale = {
                let mut preparing = lock(&me.preparing);
                match preparing.get(&m.home) {
                    Some((at, _)) if *at == since => preparing.remove(&m.home),
                    _ => None,
                }
            };
            if let Some((_, (_, store))) = stale {
                tracing::warn!(home = m.home, "no move took the engine opened for it: closed");
                close(store).await;
            }
        });
        Ok(())
    }

    /// How home `home`, which a meta of `cluster` asks this one to hand over, was
    /// opened here; refused unless this meta holds it.
    fn held(&self, cluster: &str, home: HomeId) -> Result<Opened, MetaError> {
        self.check_cluster(cluster)?;
        let current = lock(&self.opened).get(&home).cloned();
        current
            .filter(|o| o.forward.is_none())
            .ok_or_else(|| MetaError::InvalidArgument(format!("this meta does not hold home {home}")))
    }

    /// `HandOverHome`, at the meta holding the home: its writes wait from now on, and
    /// its primary is fenced. The writes go on once the mover says `HomeTaken`, or by
    /// themselves after a bound if it never does (placed as the registry says then).
    pub(crate) async fn hand_over(self: &Arc<Self>, m: HandOverHome) -> Result<HandedOver, MetaError> {
        let current = self.held(&m.cluster, m.home)?;
        let gate = self.close_gate(m.home).await?;
        let (url, timeout) = (current.writer.clone(), self.moves.db_timeout);
        let (epoch, position) = blocking(move || pg::fence(&url, timeout)).await?;
        util::crash_point!("hand-over-after-fence");
        let since = Instant::now();
        {
            // `prepare_home` checks for a hand-over under this lock.
            let mut preparing = lock(&self.preparing);
            let ready = preparing.remove(&m.home).map(|(_, opening)| opening);
            lock(&self.handed_over).insert(m.home, HandedOverHome { gate, ready, since });
        }
        let me = Arc::downgrade(self);
        // The watchdog of this hand-over only (a later one of the same home has its own).
        tokio::spawn(async move {
            tokio::time::sleep(timeout * 4).await;
            if let Some(me) = me.upgrade()
                && let Err(e) = me.settle(m.home, Vec::new(), Some(since)).await
            {
                tracing::error!(home = m.home, error = %e, "placing a handed-over home by the registry failed");
            }
        });
        Ok(HandedOver { epoch, position })
    }

    /// `HomeTaken`: the move ended (or failed); place the home as the registry says.
    pub(crate) async fn home_taken(self: &Arc<Self>, m: HomeTaken) -> Result<(), MetaError> {
        self.check_cluster(&m.cluster)?;
        self.settle(m.home, m.positions, None).await
    }

    /// Places a handed-over home as the registry says (reopened even where it was: its
    /// epoch moved on) and lets its writes go on: they would only meet the fenced
    /// engine before, so a failure is tried again for a while first. `watched`: only
    /// the hand-over that began then (a watchdog's, whose move may have ended long
    /// ago); else whichever is in progress, and with none (a watchdog settled it
    /// already) the home is still placed as the registry says.
    async fn settle(
        &self,
        home: HomeId,
        positions: Vec<(u16, u64)>,
        watched: Option<Instant>,
    ) -> Result<(), MetaError> {
        let handed = {
            let mut handed = lock(&self.handed_over);
            match handed.get(&home) {
                Some(h) if watched.is_none_or(|since| h.since == since) => handed.remove(&home),
                _ => None,
            }
        };
        let (gate, mut ready, reopen) = match handed {
            Some(HandedOverHome { gate, ready, .. }) => (Some(gate), ready, true),
            None if watched.is_some() => return Ok(()),
            None => (None, None, false),
        };
        // The registry's commit, which this meta's reads of home 0 must see.
        let homes = self.homes();
        for (h, position) in positions.iter().filter(|(h, _)| *h != home) {
            if let Ok(store) = homes.store(*h) {
                store.committed_elsewhere(*position, true);
            }
        }
        // The copy's, which the home's new engine must see before it is read.
        let copied = positions.iter().find(|(h, _)| *h == home).map(|(_, p)| *p);
        let until = Instant::now() + self.moves.db_timeout * 2;
        let placed = loop {
            match self.reconcile(home, reopen, copied, ready.take()).await {
                Err(e) if Instant::now() < until => {
                    tracing::warn!(home, error = %e, "placing a handed-over home failed; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                placed => break placed,
            }
        };
        drop(gate);
        placed
    }

    /// Places home `id` as the registry says, if that is not where it is (or always,
    /// with `reopen`): opens its engine there (or takes `ready`, opened before for the
    /// same place), reading no older than `copied` (where the move's copy committed),
    /// and swaps it in. A move away from this site drops the old database once nothing
    /// uses it.
    pub(crate) async fn reconcile(
        &self,
        id: HomeId,
        reopen: bool,
        copied: Option<u64>,
        ready: Option<Opening>,
    ) -> Result<(), MetaError> {
        let name = self.homes().name_of(id)?.to_string();
        let current = lock(&self.opened)
            .get(&id)
            .cloned()
            .ok_or_else(|| MetaError::Internal(format!("home {name} has no record of how it was opened")))?;
        let root = self.root_store().clone();
        let name2 = name.clone();
        let registered = blocking(move || registered(&root, &name2)).await?;
        let wanted = match registered {
            Some(p) if p != current.placement => self.moves.placed(&name, &p)?,
            _ if reopen => current.clone(),
            _ => return Ok(()),
        };
        let ready = ready.filter(|(o, _)| o.placement == wanted.placement).map(|(_, store)| store);
        let (writer, root, home_name) = (wanted.writer.clone(), self.root_store().clone(), name.clone());
        let open = self.moves.opener(wanted.clone());
        let store = blocking(move || {
            let (store, opened_here) = match ready {
                Some(store) => (store, false),
                None => (open()?, true),
            };
            if let Some(position) = copied {
                store.committed_elsewhere(position, true);
            }
            // The same home of this cluster, as its identity says. An engine opened for
            // this move is at the database its mover made for this home of this cluster:
            // reading the identity would only wait for the copied rows to reach this
            // site's standby, and keep the move's pause going meanwhile.
            if opened_here {
                crate::homes::adopt(&root, &store, &home_name, &writer)?;
            }
            Ok(store)
        })
        .await?;
        store.reserve_foreign_reader();
        let store = Arc::new(store);
        {
            let mut placed = util::sync::write(&self.placed);
            let mut forwarding = placed.forwarding.clone();
            match &wanted.forward {
                Some(addr) => forwarding.insert(id, Arc::new(Forwarding::new(addr, self.moves.db_timeout))),
                None => forwarding.remove(&id),
            };
            let homes = placed.homes.replaced(Home { id, name: name.clone(), store });
            *placed = Arc::new(Placed { homes: Arc::new(homes), forwarding });
        }
        lock(&self.opened).insert(id, wanted.clone());
        // Writes count towards moving it again from its new place only.
        lock(&self.tallies).forget(id);
        tracing::info!(home = name, placement = %wanted.placement, "home placed");
        let own = self.moves.own_site.as_deref();
        if current.placement.site.as_str() != wanted.placement.site && Some(current.placement.site.as_str()) == own {
            // Moved away from here: in-flight reads of the old engine end first.
            let (url, database, timeout) = (current.writer, current.placement.database, self.moves.db_timeout);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let dropped = blocking(move || pg::drop_database(&url, &database, timeout)).await;
                if let Err(e) = dropped {
                    tracing::warn!(error = %e, "dropping a moved home's old database failed; drop it by hand");
                }
            });
        }
        Ok(())
    }

    /// Waits, up to `timeout`, until this meta's lease on home 0's engine (where moves
    /// are recorded) is held.
    async fn lease_of_root(&self, timeout: Duration) -> Result<(), MetaError> {
        let Some(lease) = self.root_store().primary_lease() else { return Ok(()) };
        let until = Instant::now() + timeout;
        while !lease.held() {
            if Instant::now() >= until {
                return Err(MetaError::Fenced(format!(
                    "this meta's lease on home 0's primary, where moves are recorded, has not been renewed for \
                     {timeout:?}: move the home once that primary is reachable again"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// What this meta is doing about a move of home `id` now, if anything.
    pub(crate) fn move_step(&self, id: HomeId) -> Option<String> {
        if let Some(m) = lock(&self.moving).as_ref().filter(|m| m.home == id) {
            let secs = m.since.elapsed().as_secs_f64();
            return Some(format!("moving from site {} to site {}: {} ({secs:.1}s in)", m.from, m.to, m.step));
        }
        if let Some(h) = lock(&self.handed_over).get(&id) {
            let secs = h.since.elapsed().as_secs_f64();
            return Some(format!("handed over to a move {secs:.1}s ago: its writes wait here until it ends"));
        }
        lock(&self.preparing)
            .get(&id)
            .map(|(_, (o, _))| format!("opening its database at site {} for a move", o.placement.site))
    }

    /// Counts one write of home `id` from `site` towards moving it there (nothing
    /// unless homes move by themselves here).
    pub(crate) fn tally(&self, id: HomeId, site: &str) {
        if id != 0 && self.moves.by_themselves() {
            lock(&self.tallies).count(id, site);
        }
    }

    /// Closes home `id`'s gate: returns once no write of it is running here, and holds
    /// new ones until dropped.
    async fn close_gate(&self, id: HomeId) -> Result<tokio::sync::OwnedRwLockWriteGuard<()>, MetaError> {
        let gate = self.gates.get(&id).cloned().ok_or_else(|| MetaError::Internal(format!("no gate for home {id}")))?;
        let timeout = self.moves.db_timeout;
        tokio::time::timeout(timeout, gate.write_owned())
            .await
            .map_err(|_| MetaError::TimedOut { db: format!("the writes of home {id}"), after: timeout })
    }

    /// Waits at home `id`'s gate (a move of it in progress) before a write of it runs.
    pub(crate) async fn pass_gate(
        &self,
        id: HomeId,
    ) -> Result<Option<tokio::sync::OwnedRwLockReadGuard<()>>, MetaError> {
        let Some(gate) = self.gates.get(&id).cloned() else { return Ok(None) };
        let timeout = self.moves.db_timeout;
        match tokio::time::timeout(timeout, gate.read_owned()).await {
            Ok(passed) => Ok(Some(passed)),
            Err(_) => Err(MetaError::TimedOut { db: format!("home {id}, moving"), after: timeout }),
        }
    }

    fn check_cluster(&self, cluster: &str) -> Result<(), MetaError> {
        if cluster != self.cluster_id() {
            return Err(MetaError::WrongCluster(format!(
                "a meta of cluster {cluster} asked the meta of cluster {} about a home: check --site-meta",
                self.cluster_id()
            )));
        }
        Ok(())
    }
}

impl MetaService {
    /// This meta's link to the meta at `addr`, kept from one move to the next: a new one
    /// costs the TCP and TLS handshakes, two round trips across the WAN. Each ask on it
    /// is bounded by its caller (`ask_on`); it reconnects by itself after a failure.
    async fn meta_link(&self, addr: &str) -> Result<Arc<net::RpcClient>, MetaError> {
        if let Some(link) = lock(&self.meta_links).get(addr) {
            return Ok(link.clone());
        }
        // Not connected under the lock: a peer that does not answer holds up no other.
        let link = connect_meta(addr, self.moves.db_timeout).await?;
        Ok(self.keep_link(addr, link))
    }

    /// Keeps `link` as the link to `addr`, unless one was kept meanwhile.
    fn keep_link(&self, addr: &str, link: net::RpcClient) -> Arc<net::RpcClient> {
        lock(&self.meta_links).entry(addr.to_string()).or_insert_with(|| Arc::new(link)).clone()
    }

    /// The `meta-links` worker, when this meta knows other sites' metas.
    pub(crate) fn meta_linker(self: &Arc<Self>) -> Option<MetaLinks> {
        let own = self.moves.own_site.as_deref();
        let addrs: Vec<String> =
            self.moves.sites.iter().filter(|s| Some(s.name.as_str()) != own).filter_map(|s| s.meta.clone()).collect();
        (!addrs.is_empty()).then(|| MetaLinks { service: Arc::downgrade(self), timeout: self.moves.db_timeout, addrs })
    }
}

/// The `meta-links` worker: opens this meta's links to the other sites' metas
/// (`meta_link`) ahead of the first move, trying again until each is open (the metas of
/// a grid start one after another); done once all are.
pub(crate) struct MetaLinks {
    service: Weak<MetaService>,
    timeout: Duration,
    /// The metas not linked yet.
    addrs: Vec<String>,
}

impl Worker for MetaLinks {
    type Error = MetaError;

    fn name(&self) -> String {
        "meta-links".into()
    }

    fn progress(&self) -> String {
        match self.addrs.len() {
            0 => "every other site's meta linked".into(),
            n => format!("{n} other site meta(s) not reached yet: {}", self.addrs.join(", ")),
        }
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let mut left = Vec::new();
        for addr in std::mem::take(&mut self.addrs) {
            match connect_meta(&addr, self.timeout).await {
                Ok(link) => match self.service.upgrade() {
                    Some(me) => drop(me.keep_link(&addr, link)),
                    None => return Ok(Step::Done),
                },
                Err(_) => left.push(addr),
            }
        }
        self.addrs = left;
        Ok(if self.addrs.is_empty() { Step::Done } else { Step::Idle })
    }

    async fn wait_for_work(&mut self) -> Step {
        util::worker::every(Duration::from_secs(2)).await
    }
}

/// A link to the meta at `addr`, each connect, send and answer bounded by a move's
/// longest step.
async fn connect_meta(addr: &str, db_timeout: Duration) -> Result<net::RpcClient, MetaError> {
    net::RpcClient::connect(addr, 1, db_timeout * 4).await.map_err(|e| MetaError::unreachable(addr, &e))
}

/// Asks `req` on `link` (to the meta at `addr`), answered within `timeout`.
async fn ask_on<C: proto::Call>(
    link: &net::RpcClient,
    addr: &str,
    req: C,
    timeout: Duration,
) -> Result<C::Output, MetaError> {
    match tokio::time::timeout(timeout, link.ask(req)).await {
        Ok(answer) => answer.map_err(|e| MetaError::unreachable(addr, &e))?.map_err(MetaError::Remote),
        Err(_) => Err(MetaError::Unreachable {
            peer: addr.to_string(),
            detail: format!("no answer within {timeout:?}"),
            timed_out: true,
        }),
    }
}

/// The `spare-database` worker, at a meta that knows its own site's PostgreSQL server:
/// keeps a spare database made there ahead of the next move into this site
/// (`pg::make_spare`), made again once a move took it, after that move.
pub(crate) struct SpareDatabase {
    service: Weak<MetaService>,
    server: String,
    made: u64,
}

impl Worker for SpareDatabase {
    type Error = MetaError;

    fn name(&self) -> String {
        "spare-database".into()
    }

    fn progress(&self) -> String {
        format!("{} spare database(s) made ahead of moves into this site", self.made)
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        // Not beside a move: its new database and the holder's standby come first.
        drop(service.moving_now.lock().await);
        let (server, timeout) = (self.server.clone(), service.moves.db_timeout);
        if blocking(move || pg::make_spare(&server, timeout)).await? {
            self.made += 1;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        let Some(taken) = self.service.upgrade().map(|s| s.spare_taken.clone()) else { return Step::Done };
        tokio::select! {
            () = taken.notified() => Step::Idle,
            step = util::worker::every(SPARE_CHECKED_EVERY) => step,
        }
    }
}

/// How often the `spare-database` worker looks for the spare without being told a move
/// took it (another meta of the site may have).
const SPARE_CHECKED_EVERY: Duration = Duration::from_secs(30);

impl MetaService {
    /// The `spare-database` worker, when this meta could be a move's destination: it
    /// knows its site, and its site's server is PostgreSQL.
    pub(crate) fn spare_maker(self: &Arc<Self>) -> Option<SpareDatabase> {
        let server = self.moves.site(self.moves.own_site.as_deref()?).ok()?.db_url.clone()?;
        server.starts_with("postgres").then(|| SpareDatabase { service: Arc::downgrade(self), server, made: 0 })
    }
}

/// Drops an engine where blocking is allowed (closing its connections waits on them).
async fn close(store: Store) {
    if let Err(e) = blocking(move || {
        drop(store);
        Ok(())
    })
    .await
    {
        tracing::warn!(error = %e, "closing an engine failed");
    }
}

/// Runs blocking work (database connections) off the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MetaError> + Send + 'static,
) -> Result<T, MetaError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| MetaError::Internal(format!("blocking task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_round_trip_and_name_each_move_anew() {
        let p = Placement { site: "a".into(), database: "hb".into(), moves: 0 };
        assert_eq!(Placement::parse("b", &p.encode()).unwrap(), p);
        assert_eq!(p.next_database(), "hb_m1");
        let moved = Placement { site: "b".into(), database: "hb_m1".into(), moves: 1 };
        assert_eq!(moved.next_database(), "hb_m2");
        let odd = Placement { site: "b".into(), database: "x_mine".into(), moves: 3 };
        assert_eq!(odd.next_database(), "x_mine_m4");
        assert!(Placement::parse("b", b"a hb").is_err());
        assert!(Placement::parse("b", b"a hb x").is_err());
    }
}
