//! Automatic moves: a home goes to the site that does most of its writes for a while
//! (`locus meta --auto-move-after`, issue 35).
//!
//! The meta that commits a home counts its writes by the site they come from (its own
//! clients', and each forwarding meta's), in buckets of a tenth of the window. Once a
//! whole window has passed since the home came here, another site that did at least
//! `share` of its writes, in at least `SUSTAINED` of the buckets, gets the home: this
//! meta asks that site's meta to move it there. Hysteresis keeps a home from flapping:
//! a full window at the new place before anything counts, a high share, and `hold`
//! between two moves of one home.

use crate::error::MetaError;
use crate::homes::HomeId;
use crate::service::MetaService;
use proto::meta::{MoveHome, MoveRecord};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;
use util::sync::lock;
use util::worker::{Step, Worker};

/// When homes move by themselves.
#[derive(Clone, Debug)]
pub struct AutoMove {
    /// How long one site must do most of a home's writes (zero: homes never move by
    /// themselves).
    pub after: Duration,
    /// The share of the home's writes in that time, in percent, that site must do.
    pub share_percent: u8,
    /// The fewest writes in that time that make a home worth moving.
    pub min_writes: u64,
    /// The least time between two moves of one home, whoever made the first.
    pub hold: Duration,
}

impl Default for AutoMove {
    /// Off; the other settings as `locus meta` defaults them.
    fn default() -> AutoMove {
        AutoMove { after: Duration::ZERO, share_percent: 80, min_writes: 1000, hold: Duration::from_secs(1800) }
    }
}

/// Buckets in one window.
const BUCKETS: usize = 10;
/// Buckets of the window the moving site must have written in: most of the time, not
/// one burst.
const SUSTAINED: usize = 8;

impl AutoMove {
    fn bucket(&self) -> Duration {
        (self.after / BUCKETS as u32).max(Duration::from_millis(100))
    }
}

/// One home's writes by site: the window's full buckets (oldest first) and the one
/// filling now.
#[derive(Default)]
struct Tally {
    full: VecDeque<HashMap<String, u64>>,
    current: HashMap<String, u64>,
}

/// A site that does most of a home's writes.
#[derive(Debug, PartialEq)]
pub(crate) struct Verdict {
    pub site: String,
    pub writes: u64,
    pub total: u64,
}

impl Verdict {
    fn reason(&self, window: Duration) -> String {
        format!(
            "automatic: site {} did {}% of the home's {} writes in {}s",
            self.site,
            self.writes * 100 / self.total.max(1),
            self.total,
            window.as_secs()
        )
    }
}

/// The writes of every home this meta commits, by site, over the window.
#[derive(Default)]
pub(crate) struct Tallies {
    homes: HashMap<HomeId, Tally>,
}

impl Tallies {
    /// Counts one write of `home` from `site`.
    pub fn count(&mut self, home: HomeId, site: &str) {
        let current = &mut self.homes.entry(home).or_default().current;
        match current.get_mut(site) {
            Some(n) => *n += 1,
            None => {
                current.insert(site.to_string(), 1);
            }
        }
    }

    /// Ends the current bucket of every home: the window keeps the last `BUCKETS`.
    fn rotate(&mut self) {
        for tally in self.homes.values_mut() {
            let current = std::mem::take(&mut tally.current);
            tally.full.push_back(current);
            if tally.full.len() > BUCKETS {
                tally.full.pop_front();
            }
        }
    }

    /// Starts home `home`'s count again (it came here, or left).
    pub fn forget(&mut self, home: HomeId) {
        self.homes.remove(&home);
    }

    /// `home`'s writes by site over the window so far, most first.
    pub fn recent(&self, home: HomeId) -> Vec<(String, u64)> {
        let Some(tally) = self.homes.get(&home) else { return Vec::new() };
        let mut sum: HashMap<&str, u64> = HashMap::new();
        for bucket in tally.full.iter().chain([&tally.current]) {
            for (site, n) in bucket {
                *sum.entry(site).or_default() += n;
            }
        }
        let mut out: Vec<(String, u64)> = sum.into_iter().map(|(s, n)| (s.to_string(), n)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// The site other than `own` that should get `home`, by the window's full buckets.
    fn pick(&self, home: HomeId, own: &str, rule: &AutoMove) -> Option<Verdict> {
        let tally = self.homes.get(&home)?;
        if tally.full.len() < BUCKETS {
            return None;
        }
        let mut by_site: HashMap<&str, (u64, usize)> = HashMap::new();
        for bucket in &tally.full {
            for (site, n) in bucket.iter().filter(|(_, n)| **n > 0) {
                let entry = by_site.entry(site).or_default();
                entry.0 += n;
                entry.1 += 1;
            }
        }
        let total: u64 = by_site.values().map(|(n, _)| n).sum();
        if total < rule.min_writes.max(1) {
            return None;
        }
        by_site
            .into_iter()
            .filter(|(site, (n, buckets))| {
                !site.is_empty()
                    && *site != own
                    && n * 100 >= total * u64::from(rule.share_percent)
                    && *buckets >= SUSTAINED
            })
            .max_by_key(|(_, (n, _))| *n)
            .map(|(site, (writes, _))| Verdict { site: site.to_string(), writes, total })
    }
}

/// The `home-mover` worker: at every bucket's end, moves each home held here that
/// another site writes most to that site.
pub(crate) struct HomeMover {
    service: Weak<MetaService>,
    moved: u64,
    /// What the latest look found, for `locus status`.
    seen: String,
}

impl Worker for HomeMover {
    type Error = MetaError;

    fn name(&self) -> String {
        "home-mover".into()
    }

    fn progress(&self) -> String {
        format!("{} homes moved; {}", self.moved, self.seen)
    }

    async fn work(&mut self) -> Result<Step, MetaError> {
        let Some(service) = self.service.upgrade() else { return Ok(Step::Done) };
        let rule = service.moves.auto.clone();
        let own = service.moves.own_site.clone().unwrap_or_default();
        let held: Vec<HomeId> = {
            let opened = lock(&service.opened);
            opened.iter().filter(|(id, o)| **id != 0 && o.forward.is_none()).map(|(id, _)| *id).collect()
        };
        let verdicts: Vec<(HomeId, Verdict)> = {
            let mut tallies = lock(&service.tallies);
            tallies.homes.retain(|id, _| held.contains(id));
            tallies.rotate();
            held.iter().filter_map(|id| Some((*id, tallies.pick(*id, &own, &rule)?))).collect()
        };
        self.seen = format!("watching {} homes held here, {} to move", held.len(), verdicts.len());
        for (id, verdict) in verdicts {
            let name = service.homes().name_of(id)?.to_string();
            let moves = service.move_records(&name).await?;
            if let Some(last) = moves.last() {
                let since =
                    Duration::from_millis((proto::types::Timestamp::now().millis() as u64).saturating_sub(last.at_ms));
                if since < rule.hold {
                    self.seen = format!(
                        "home {name} would go to site {} but moved {}s ago (hold {}s)",
                        verdict.site,
                        since.as_secs(),
                        rule.hold.as_secs()
                    );
                    continue;
                }
            }
            let reason = verdict.reason(rule.after);
            tracing::info!(home = name, to = verdict.site, reason, "moving a home by itself");
            let asked = MoveHome { home: name.clone(), to_site: verdict.site.clone(), reason: Some(reason) };
            // Counting starts again whatever the outcome: a failed move is tried again
            // only after another whole window.
            lock(&service.tallies).forget(id);
            service.move_home(asked, false).await?;
            self.moved += 1;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        let Some(period) = self.service.upgrade().map(|s| s.moves.auto.bucket()) else { return Step::Done };
        util::worker::every(period).await
    }
}

impl super::MoveSetup {
    /// Whether homes held here move by themselves: automatic moves are on, and this
    /// meta knows its site and the others' (else no home moves at all). Writes are
    /// counted, and the `home-mover` runs, only then.
    pub(crate) fn by_themselves(&self) -> bool {
        !self.auto.after.is_zero() && self.own_site.is_some() && !self.sites.is_empty()
    }
}

impl MetaService {
    /// The `home-mover` worker, when homes move by themselves here.
    pub(crate) fn home_mover(self: &Arc<Self>) -> Option<HomeMover> {
        self.moves.by_themselves().then(|| HomeMover { service: Arc::downgrade(self), moved: 0, seen: String::new() })
    }

    /// Home `name`'s past moves, oldest first, from home 0's registry.
    pub(crate) async fn move_records(&self, name: &str) -> Result<Vec<MoveRecord>, MetaError> {
        let (root, name) = (self.root_store().clone(), name.to_string());
        crate::engine::read_async(&root, false, move |t| super::records_in(t, &name)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> AutoMove {
        AutoMove { after: Duration::from_secs(10), share_percent: 80, min_writes: 100, hold: Duration::ZERO }
    }

    /// `buckets` buckets in which site `a` writes `a` and site `b` writes `b`.
    fn tallied(buckets: usize, a: u64, b: u64) -> Tallies {
        let mut t = Tallies::default();
        for _ in 0..buckets {
            for _ in 0..a {
                t.count(1, "a");
            }
            for _ in 0..b {
                t.count(1, "b");
            }
            t.rotate();
        }
        t
    }

    #[test]
    fn a_home_goes_where_most_of_its_writes_come_from_for_a_whole_window() {
        // Held at a; b writes 90 % for a whole window: b gets it.
        let t = tallied(BUCKETS, 2, 18);
        assert_eq!(t.pick(1, "a", &rule()), Some(Verdict { site: "b".into(), writes: 180, total: 200 }));
        assert!(t.recent(1).first().is_some_and(|(s, n)| s == "b" && *n == 180));
        // Not before the window is full, nor for the holder's own site.
        assert_eq!(tallied(BUCKETS - 1, 2, 18).pick(1, "a", &rule()), None);
        assert_eq!(t.pick(1, "b", &rule()), None);
        // Not below the share, nor below the fewest writes worth a move.
        assert_eq!(tallied(BUCKETS, 3, 7).pick(1, "a", &rule()), None);
        assert_eq!(tallied(BUCKETS, 0, 9).pick(1, "a", &rule()), None);
        // Not for one burst: b wrote in 2 buckets only.
        let mut burst = tallied(BUCKETS - 2, 1, 0);
        for _ in 0..2 {
            for _ in 0..500 {
                burst.count(1, "b");
            }
            burst.rotate();
        }
        assert_eq!(burst.pick(1, "a", &rule()), None);
        // A forgotten home counts from nothing again.
        let mut t = t;
        t.forget(1);
        assert_eq!(t.pick(1, "a", &rule()), None);
        assert!(t.recent(1).is_empty());
    }
}
