//! Metadata homes: the namespace partitioned by subtree across engines (issue 35).
//!
//! A home is the subtree below a *junction* directory, down to the next junctions; home
//! 0 is the root's. Each home commits in an engine of its own (a `Store`: its own SQLite
//! file or PostgreSQL database), so writes in different homes never wait for one
//! another, and a home can live where its writers are. Home `h` numbers its inodes from
//! `h << HOME_SHIFT` on: an inode's home is `ino >> HOME_SHIFT`, so requests are routed
//! without a table and inode numbers never change.
//!
//! A request runs in the engine of the home it changes (`writing_home`), through a
//! `HomesTxn`: rows of other homes are read from their engines, and writing one fails
//! with `MetaError::CrossHome`; the service then runs the request again across the
//! homes by two-phase commit (`crate::cross`, where every home's rows are read and
//! written in a transaction of its own), or, between SQLite homes, answers EXDEV. The
//! POSIX rules in `ops` stay written once. Sessions, nodes, admission and principals live in
//! home 0. Each engine keeps the catalogue rows (refcounts, replica locations) of the
//! chunks its own extents use, so a commit stays one transaction; reads of the
//! catalogue merge every engine, so gc deletes only what no home references.

use crate::engine::Store;
use crate::error::MetaError;
use crate::locks::Held;
use crate::store::{Counter, DentryRow, Inode, OpenRow, Prefetch, SessionRow, Txn};
use proto::meta::StoredChunk;
use proto::policy::Policy;
use proto::types::{ChunkId, ChunkRecord, Extent, InodeId, NodeInfo, SessionId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use util::sync::lock;

/// A home's number: home 0 is the root's.
pub type HomeId = u16;

/// Home `h`'s inodes are numbered from `h << HOME_SHIFT`.
pub const HOME_SHIFT: u32 = 48;

/// The home an inode belongs to.
pub fn home_of(ino: InodeId) -> HomeId {
    (ino >> HOME_SHIFT) as HomeId
}

/// The attribute of inode 0 (which no file has) that records, in a home's engine,
/// which home of which cluster it is: "<cluster id> <home id> <name>".
pub(crate) const IDENTITY: &[u8] = b"locus.home";
/// The attribute of inode 0 in home 0's engine that registers a home by name: its id.
pub(crate) fn registry_key(name: &str) -> Vec<u8> {
    format!("locus.home.{name}").into_bytes()
}
/// The attribute of inode 0 in a home's engine that marks a junction being made (its
/// inode, parent and name), until the parent's entry names it (`settle_junctions`).
pub(crate) fn pending_key(ino: InodeId) -> Vec<u8> {
    format!("locus.pending-junction.{ino}").into_bytes()
}

/// One home: its number, name and engine.
#[derive(Clone)]
pub struct Home {
    pub id: HomeId,
    pub name: String,
    pub store: Arc<Store>,
}

/// Every home this meta serves, home 0 first.
pub struct Homes {
    homes: Vec<Home>,
    seen: Arc<Seen>,
}

/// How long a row of another home read for a transaction answers later transactions'
/// reads of it. Every open checks its session, and every create and open finds its
/// file's policy up to the nearest directory that sets one; for a file outside home 0
/// both are reads of home 0's engine (at a standby of it) inside the transaction, and at
/// site B they made creates a third slower than at A. Trusting a row for a second is no
/// laxer than that standby read, which may lag too; a row this meta changes is
/// forgotten at once.
const TRUSTED_FOR: Duration = Duration::from_secs(1);

/// Rows of other homes read lately: home 0's sessions, and policies (or their absence).
#[derive(Default)]
struct Seen {
    sessions: Recent<SessionId, Option<SessionRow>>,
    policies: Recent<InodeId, Option<Policy>>,
}

/// Values read at an instant, each trusted for `TRUSTED_FOR` after it.
struct Recent<K, V>(Mutex<HashMap<K, (Instant, V)>>);

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Recent(Mutex::default())
    }
}

impl<K: std::hash::Hash + Eq, V: Clone> Recent<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        lock(&self.0).get(key).filter(|(at, _)| at.elapsed() < TRUSTED_FOR).map(|(_, v)| v.clone())
    }

    fn keep(&self, key: K, value: V) {
        let mut rows = lock(&self.0);
        if rows.len() >= 10_000 {
            rows.retain(|_, (at, _)| at.elapsed() < TRUSTED_FOR);
        }
        rows.insert(key, (Instant::now(), value));
    }

    fn forget(&self, key: &K) {
        lock(&self.0).remove(key);
    }

    fn clear(&self) {
        lock(&self.0).clear();
    }
}

impl Homes {
    /// A single home: the root's, in `store` (a cluster without junctions).
    pub fn single(store: Arc<Store>) -> Homes {
        Homes { homes: vec![Home { id: 0, name: "root".into(), store }], seen: Default::default() }
    }

    /// Home 0 and the others; ids must be unique.
    pub fn new(mut homes: Vec<Home>) -> Result<Homes, MetaError> {
        homes.sort_by_key(|h| h.id);
        if homes.first().map(|h| h.id) != Some(0) || homes.windows(2).any(|w| w[0].id == w[1].id) {
            return Err(MetaError::Internal("homes need home 0 and unique ids".into()));
        }
        if homes.len() > 1 {
            for home in &homes {
                home.store.reserve_foreign_reader();
            }
        }
        Ok(Homes { homes, seen: Default::default() })
    }

    /// These homes with `home` in place of the one of its number (a home moved; its
    /// engine's foreign reader is reserved by the mover).
    pub(crate) fn replaced(&self, home: Home) -> Homes {
        let homes = self.homes.iter().map(|h| if h.id == home.id { home.clone() } else { h.clone() }).collect();
        Homes { homes, seen: self.seen.clone() }
    }

    /// The name of home `id`.
    pub(crate) fn name_of(&self, id: HomeId) -> Result<&str, MetaError> {
        self.homes
            .iter()
            .find(|h| h.id == id)
            .map(|h| h.name.as_str())
            .ok_or_else(|| MetaError::Internal(format!("inode of home {id}, which this meta does not serve")))
    }

    /// Forgets what was read of session `id` (it ended here).
    pub(crate) fn forget_session(&self, id: SessionId) {
        self.seen.sessions.forget(&id);
    }

    /// Forgets every row of other homes read lately: this meta had a write committed
    /// elsewhere, whose client must see it in what it does next.
    pub(crate) fn forget_seen(&self) {
        self.seen.sessions.clear();
        self.seen.policies.clear();
    }

    /// Home 0's engine: sessions, nodes, admission and principals live there.
    pub fn root(&self) -> &Arc<Store> {
        &self.homes[0].store
    }

    /// Every home, home 0 first.
    pub fn all(&self) -> &[Home] {
        &self.homes
    }

    /// The home named `name`.
    pub fn named(&self, name: &str) -> Option<&Home> {
        self.homes.iter().find(|h| h.name == name)
    }

    /// Home `id`'s engine.
    pub fn store(&self, id: HomeId) -> Result<&Arc<Store>, MetaError> {
        self.homes.iter().find(|h| h.id == id).map(|h| &h.store).ok_or_else(|| {
            MetaError::Internal(format!(
                "inode of home {id}, which this meta does not serve: start it with that home's --home NAME=URL"
            ))
        })
    }

    /// A transaction of home `home`'s engine (`own`), seeing every home.
    pub fn txn<'a>(&'a self, home: HomeId, own: &'a mut dyn Txn) -> HomesTxn<'a> {
        HomesTxn { rows: Rows::One(own), home, homes: self }
    }

    /// A transaction spanning homes (`crate::cross`): every home's rows, read and
    /// written, in that home's part of `cross`; `home` is the coordinating one.
    pub(crate) fn cross_txn<'a>(&'a self, home: HomeId, cross: &'a mut crate::cross::Cross) -> HomesTxn<'a> {
        HomesTxn { rows: Rows::Cross(cross), home, homes: self }
    }
}

/// Where a `HomesTxn` reads and writes rows.
enum Rows<'a> {
    /// In one home's transaction; other homes' rows are read from their engines and
    /// never written (`MetaError::CrossHome`).
    One(&'a mut dyn Txn),
    /// In one transaction per home, decided together (two-phase commit).
    Cross(&'a mut crate::cross::Cross),
}

/// A transaction of one home's engine that reads every home's rows (`homes`).
pub struct HomesTxn<'a> {
    rows: Rows<'a>,
    home: HomeId,
    homes: &'a Homes,
}

/// Cookies handed out by a transaction spanning homes are placeholders from here on:
/// an entry's cookie is taken from its own home's counter when it is written.
const PLACEHOLDER_COOKIE: u64 = 1 << 63;

impl HomesTxn<'_> {
    /// Runs `f` on home `home`'s rows: in this transaction, or a read of its engine.
    fn at<R>(&mut self, home: HomeId, mut f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError>) -> Result<R, MetaError> {
        match &mut self.rows {
            Rows::One(own) if home == self.home => f(&mut **own),
            Rows::One(_) => self.homes.store(home)?.read_foreign(&mut f),
            Rows::Cross(cross) => f(cross.open(self.homes, home)?),
        }
    }

    /// `read` of home `home`'s row: in this transaction when it writes that home,
    /// else from what `recent` remembers of a read less than `TRUSTED_FOR` ago, else
    /// read from its engine and remembered; its absence too when `remembers_absence`
    /// (not a session's: one just begun may not have reached the standby yet).
    fn remembered<K: std::hash::Hash + Eq, T: Clone>(
        &mut self,
        home: HomeId,
        recent: &Recent<K, Option<T>>,
        key: K,
        remembers_absence: bool,
        mut read: impl FnMut(&mut dyn Txn) -> Result<Option<T>, MetaError>,
    ) -> Result<Option<T>, MetaError> {
        if home == self.home || matches!(self.rows, Rows::Cross(_)) {
            return self.at(home, read);
        }
        if let Some(v) = recent.get(&key) {
            return Ok(v);
        }
        let v = self.at(home, &mut read)?;
        if !remembers_absence && v.is_none() {
            return Ok(v);
        }
        recent.keep(key, v.clone());
        Ok(v)
    }

    /// The transaction that writes home `home`'s rows; refused for another home than
    /// this one's outside a transaction spanning homes.
    fn rows_of(&mut self, home: HomeId, what: &str) -> Result<&mut dyn Txn, MetaError> {
        match &mut self.rows {
            Rows::One(own) if home == self.home => Ok(&mut **own),
            Rows::One(_) => Err(MetaError::CrossHome(format!(
                "{what} belongs to home {home}, this operation commits in home {}: an operation changes one \
                 home only",
                self.home
            ))),
            Rows::Cross(cross) => cross.write(self.homes, home),
        }
    }

    /// This home's own transaction.
    fn own(&mut self) -> Result<&mut dyn Txn, MetaError> {
        self.rows_of(self.home, "")
    }

    /// The transaction of inode `ino`'s home, for a change of one of its rows.
    fn of_inode(&mut self, ino: InodeId) -> Result<&mut dyn Txn, MetaError> {
        self.rows_of(home_of(ino), &format!("inode {ino}"))
    }

    /// The transaction of directory `parent`'s home, for a change of its entries.
    fn of_dir(&mut self, parent: InodeId) -> Result<&mut dyn Txn, MetaError> {
        self.rows_of(home_of(parent), &format!("directory {parent}"))
    }

    /// Notes (spanning homes) that the chunk catalogue to change next is that of the
    /// home whose extents are being changed (each home catalogues its own extents').
    fn extents_of(&mut self, ino: InodeId) {
        if let Rows::Cross(cross) = &mut self.rows {
            cross.catalogue = home_of(ino);
        }
    }

    /// The transaction whose chunk catalogue changes: this home's, or (spanning homes)
    /// that of the extents changed last.
    fn catalogue(&mut self) -> Result<&mut dyn Txn, MetaError> {
        let home = match &self.rows {
            Rows::Cross(cross) => cross.catalogue,
            Rows::One(_) => self.home,
        };
        self.rows_of(home, "a chunk's catalogue row")
    }

    /// Runs `f` on every home's rows, home 0 first.
    fn each<R>(&mut self, mut f: impl FnMut(&mut dyn Txn) -> Result<R, MetaError>) -> Result<Vec<R>, MetaError> {
        let ids: Vec<HomeId> = self.homes.all().iter().map(|h| h.id).collect();
        ids.into_iter().map(|h| self.at(h, &mut f)).collect()
    }
}

impl Txn for HomesTxn<'_> {
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError> {
        match counter {
            // Each engine counts from 1; a home's inodes lie in its own range.
            Counter::Inode => Ok((u64::from(self.home) << HOME_SHIFT) | self.own()?.next_id(counter)?),
            Counter::Session => self.rows_of(0, "a session")?.next_id(counter),
            // Spanning homes, an entry's cookie comes from its directory's home (`put_dentry`).
            Counter::Cookie if matches!(self.rows, Rows::Cross(_)) => Ok(PLACEHOLDER_COOKIE),
            Counter::Cookie | Counter::Sync => self.own()?.next_id(counter),
        }
    }

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError> {
        self.at(home_of(ino), |t| t.get_inode(ino))
    }
    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let ino = inode.attr.ino;
        self.of_inode(ino)?.put_inode(inode)
    }
    fn delete_inode(&mut self, ino: InodeId) -> Result<(), MetaError> {
        // A home's root stays, like a mount point, while the home is there.
        if matches!(self.rows, Rows::Cross(_))
            && self.at(home_of(ino), |t| t.get_xattr(0, &junction_key(ino)))?.is_some()
        {
            return Err(MetaError::Busy(format!("directory {ino} is the root of metadata home {}", home_of(ino))));
        }
        self.of_inode(ino)?.delete_inode(ino)
    }
    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        Ok(self.each(|t| t.count_inodes())?.into_iter().sum())
    }

    fn get_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>, MetaError> {
        self.at(home_of(parent), |t| t.get_dentry(parent, name))
    }
    fn parents_of(&mut self, ino: InodeId) -> Result<Vec<InodeId>, MetaError> {
        // A file's names are in its directories' homes: its own, unless a rename or
        // link between homes put one elsewhere (a junction's one name is in its
        // parent's home).
        if self.homes.all().len() == 1 {
            return self.own()?.parents_of(ino);
        }
        let mut all = self.each(|t| t.parents_of(ino))?.concat();
        all.sort_unstable();
        all.dedup();
        Ok(all)
    }
    fn prefetch(&mut self, want: Prefetch<'_>) -> Result<(), MetaError> {
        let own = |ino: InodeId| home_of(ino) == self.home;
        let entry = want.entry.filter(|(parent, _)| own(*parent));
        let open = want.open.filter(|(_, ino)| own(*ino));
        let extents = want.extents.filter(|(ino, _, _)| own(*ino));
        let policies = want.policies.filter(|ino| own(*ino));
        let session = want.session.filter(|_| self.home == 0);
        self.own()?.prefetch(Prefetch { entry, open, extents, policies, session, ..want })
    }
    fn put_dentry(&mut self, parent: InodeId, name: &[u8], ino: InodeId, cookie: u64) -> Result<(), MetaError> {
        let t = self.of_dir(parent)?;
        let cookie = if cookie >= PLACEHOLDER_COOKIE { t.next_id(Counter::Cookie)? } else { cookie };
        t.put_dentry(parent, name, ino, cookie)
    }
    fn delete_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        self.of_dir(parent)?.delete_dentry(parent, name)
    }
    fn list_dentries(&mut self, parent: InodeId, after: u64, limit: u32) -> Result<Vec<DentryRow>, MetaError> {
        self.at(home_of(parent), |t| t.list_dentries(parent, after, limit))
    }

    fn extents_overlapping(&mut self, ino: InodeId, start: u64, end: u64) -> Result<Vec<Extent>, MetaError> {
        self.extents_of(ino);
        self.at(home_of(ino), |t| t.extents_overlapping(ino, start, end))
    }
    fn insert_extent(&mut self, ino: InodeId, extent: &Extent) -> Result<(), MetaError> {
        self.extents_of(ino);
        self.of_inode(ino)?.insert_extent(ino, extent)
    }
    fn delete_extent(&mut self, ino: InodeId, file_offset: u64) -> Result<(), MetaError> {
        self.extents_of(ino);
        self.of_inode(ino)?.delete_extent(ino, file_offset)
    }
    fn list_extents(&mut self, after: Option<(InodeId, u64)>, limit: u32) -> Result<Vec<(InodeId, Extent)>, MetaError> {
        // Homes hold ascending inode ranges: page through them in order.
        let first = after.map_or(0, |(ino, _)| home_of(ino));
        let ids: Vec<HomeId> = self.homes.all().iter().map(|h| h.id).filter(|h| *h >= first).collect();
        let mut out = Vec::new();
        for h in ids {
            let from = after.filter(|(ino, _)| home_of(*ino) == h);
            let want = limit - out.len() as u32;
            out.extend(self.at(h, |t| t.list_extents(from, want))?);
            if out.len() as u32 >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError> {
        self.catalogue()?.upsert_chunk(chunk)
    }
    fn add_cached(&mut self, id: &ChunkId, size: u64, node: &str) -> Result<(), MetaError> {
        self.catalogue()?.add_cached(id, size, node)
    }
    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError> {
        self.catalogue()?.adjust_refcount(id, delta)
    }
    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError> {
        Ok(self.each(|t| t.get_chunk(id))?.into_iter().flatten().reduce(merge_records))
    }
    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError> {
        // Each engine's first `limit` ids after `after` hold the first `limit` of all.
        let mut all: Vec<ChunkRecord> = self.each(|t| t.list_chunks(after, limit))?.into_iter().flatten().collect();
        all.sort_by_key(|r| r.id);
        let mut out: Vec<ChunkRecord> = Vec::new();
        for record in all {
            match out.last_mut() {
                Some(last) if last.id == record.id => *last = merge_records(last.clone(), record),
                _ => out.push(record),
            }
        }
        out.truncate(limit as usize);
        Ok(out)
    }
    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError> {
        self.own()?.delete_chunk(id)
    }
    fn remove_location(&mut self, id: &ChunkId, node: &str) -> Result<(), MetaError> {
        self.own()?.remove_location(id, node)
    }
    fn site_rtts(&mut self) -> Result<Vec<(String, String, u64)>, MetaError> {
        self.at(0, |t| t.site_rtts())
    }
    fn chunk_totals(&mut self) -> Result<(u64, u64), MetaError> {
        // A chunk several homes reference counts once per home.
        Ok(self.each(|t| t.chunk_totals())?.into_iter().fold((0, 0), |(c, b), (c2, b2)| (c + c2, b + b2)))
    }

    fn get_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        self.at(home_of(ino), |t| t.get_xattr(ino, name))
    }
    fn set_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
        self.of_inode(ino)?.set_xattr(ino, name, value)
    }
    fn list_xattrs(&mut self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        self.at(home_of(ino), |t| t.list_xattrs(ino))
    }
    fn delete_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool, MetaError> {
        self.of_inode(ino)?.delete_xattr(ino, name)
    }
    fn delete_all_xattrs(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.of_inode(ino)?.delete_all_xattrs(ino)
    }

    fn orphans(&mut self) -> Result<Vec<InodeId>, MetaError> {
        // Reclaiming one writes its home: each home reaps its own.
        self.own()?.orphans()
    }

    fn put_session(&mut self, session: &SessionRow) -> Result<(), MetaError> {
        self.rows_of(0, "a session")?.put_session(session)
    }
    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError> {
        self.remembered(0, &self.homes.seen.sessions, id, false, |t| t.get_session(id))
    }
    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError> {
        self.at(0, |t| t.list_sessions())
    }
    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError> {
        self.homes.forget_session(id);
        self.rows_of(0, "a session")?.delete_session(id)
    }

    fn locks_on(&mut self, ino: InodeId) -> Result<Vec<Held>, MetaError> {
        self.at(home_of(ino), |t| t.locks_on(ino))
    }
    fn put_locks(&mut self, ino: InodeId, held: &[Held]) -> Result<(), MetaError> {
        self.of_inode(ino)?.put_locks(ino, held)
    }
    fn delete_session_locks(&mut self, session: SessionId) -> Result<(), MetaError> {
        // Each home drops the locks it holds (`MetaService` ends a session in each).
        self.own()?.delete_session_locks(session)
    }

    fn get_open(&mut self, session: SessionId, ino: InodeId) -> Result<OpenRow, MetaError> {
        self.at(home_of(ino), |t| t.get_open(session, ino))
    }
    fn put_open(&mut self, session: SessionId, ino: InodeId, open: OpenRow) -> Result<(), MetaError> {
        self.of_inode(ino)?.put_open(session, ino, open)
    }
    fn drop_open(&mut self, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
        self.of_inode(ino)?.drop_open(session, ino)
    }
    fn count_opens(&mut self, ino: InodeId) -> Result<u64, MetaError> {
        self.at(home_of(ino), |t| t.count_opens(ino))
    }
    fn delete_session_opens(&mut self, session: SessionId) -> Result<Vec<InodeId>, MetaError> {
        self.own()?.delete_session_opens(session)
    }

    fn put_node(&mut self, node: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError> {
        self.rows_of(0, "a node")?.put_node(node, last_seen_ms)
    }
    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError> {
        self.at(0, |t| t.get_node(id))
    }
    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError> {
        self.at(0, |t| t.list_nodes())
    }

    fn get_policy(&mut self, ino: InodeId) -> Result<Option<Policy>, MetaError> {
        self.remembered(home_of(ino), &self.homes.seen.policies, ino, true, |t| t.get_policy(ino))
    }
    fn may_have_policies(&mut self) -> Result<bool, MetaError> {
        Ok(self.each(|t| t.may_have_policies())?.into_iter().any(|may| may))
    }
    fn put_policy(&mut self, ino: InodeId, policy: &Policy) -> Result<(), MetaError> {
        self.homes.seen.policies.forget(&ino);
        self.of_inode(ino)?.put_policy(ino, policy)
    }
    fn delete_policy(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.homes.seen.policies.forget(&ino);
        self.of_inode(ino)?.delete_policy(ino)
    }
    fn list_policies(&mut self) -> Result<Vec<(InodeId, Policy)>, MetaError> {
        Ok(self.each(|t| t.list_policies())?.into_iter().flatten().collect())
    }
    fn set_drained(&mut self, node: &str, drained: bool) -> Result<(), MetaError> {
        self.rows_of(0, "a node")?.set_drained(node, drained)
    }
    fn drained_nodes(&mut self) -> Result<Vec<String>, MetaError> {
        self.at(0, |t| t.drained_nodes())
    }
    fn get_admission(&mut self, node: &str) -> Result<Option<bool>, MetaError> {
        self.at(0, |t| t.get_admission(node))
    }
    fn set_admission(&mut self, node: &str, admitted: bool) -> Result<(), MetaError> {
        self.rows_of(0, "a node")?.set_admission(node, admitted)
    }
    fn delete_node(&mut self, node: &str) -> Result<(), MetaError> {
        // Its locations in other homes' catalogues go when the service runs it there.
        self.own()?.delete_node(node)
    }
    fn put_join_token(&mut self, hash: &[u8; 32], expires_ms: i64) -> Result<(), MetaError> {
        self.rows_of(0, "a join token")?.put_join_token(hash, expires_ms)
    }
    fn take_join_token(&mut self, hash: &[u8; 32]) -> Result<Option<i64>, MetaError> {
        self.rows_of(0, "a join token")?.take_join_token(hash)
    }

    fn principal(&mut self, name: &str) -> Result<Option<u32>, MetaError> {
        self.at(0, |t| t.principal(name))
    }
    fn add_principal(&mut self, name: &str) -> Result<u32, MetaError> {
        self.rows_of(0, "a principal")?.add_principal(name)
    }
}

/// One chunk's catalogue rows of two homes as one: references add up, copies join.
fn merge_records(mut a: ChunkRecord, b: ChunkRecord) -> ChunkRecord {
    let replica = |r: &ChunkRecord, node: &String| r.nodes.contains(node) && !r.cached.contains(node);
    // A copy that either home's rows record as a replica is a replica.
    let cached: Vec<String> =
        a.cached.iter().chain(&b.cached).filter(|n| !replica(&a, n) && !replica(&b, n)).cloned().collect();
    a.refcount += b.refcount;
    for node in b.nodes {
        if !a.nodes.contains(&node) {
            a.nodes.push(node);
        }
    }
    a.cached = Vec::new();
    for node in cached {
        if !a.cached.contains(&node) {
            a.cached.push(node);
        }
    }
    a
}

/// The attribute of inode 0 in a home's engine that lists a junction of the home.
fn junction_key(ino: InodeId) -> Vec<u8> {
    format!("locus.junction.{ino}").into_bytes()
}

/// Reads attribute `name` of inode 0 (the homes' bookkeeping) of `store` as text.
fn note(store: &Store, name: Vec<u8>) -> Result<Option<String>, MetaError> {
    let value = store.read(|t| t.get_xattr(0, &name))?;
    value
        .map(|v| String::from_utf8(v).map_err(|_| MetaError::Corrupt(format!("home note {}", show(&name)))))
        .transpose()
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// Makes the engine `home` (opened from `url`) home `name` of the cluster whose home 0
/// is in `root`, or checks that it is: a database this open formatted becomes the next
/// home; one that is a home of this cluster keeps its number; anything else (another
/// cluster's database, one with files) is refused. Blocking.
pub(crate) fn adopt(root: &Store, home: &Store, name: &str, url: &str) -> Result<HomeId, MetaError> {
    if name.is_empty()
        || name == crate::service::ROOT_HOME
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(MetaError::InvalidArgument(format!(
            "{name:?} is not a home name: letters, digits, - and _ only, and not {:?}",
            crate::service::ROOT_HOME
        )));
    }
    let cluster = root.cluster_id().to_string();
    let registered = note(root, registry_key(name))?
        .map(|id| id.parse::<HomeId>().map_err(|_| MetaError::Corrupt(format!("number of home {name}: {id:?}"))))
        .transpose()?;
    if let Some(identity) = note(home, IDENTITY.to_vec())? {
        let mut parts = identity.splitn(3, ' ');
        let (theirs, id, their_name) = (parts.next(), parts.next().and_then(|i| i.parse().ok()), parts.next());
        if theirs == Some(cluster.as_str()) && their_name == Some(name) && id.is_some() && registered == id {
            return Ok(id.unwrap_or_default());
        }
        return Err(MetaError::WrongCluster(format!(
            "{url} holds metadata home {identity:?} (cluster, number, name), not home {name} of cluster {cluster} \
             (registered there as number {registered:?}): check --home {name}=URL"
        )));
    }
    // New: formatted by this open, or registered before a crash cut the adoption short.
    let empty =
        home.read(|t| Ok(t.count_inodes()? <= 1 && t.list_dentries(proto::types::ROOT_INODE, 0, 1)?.is_empty()))?;
    if !empty || !(home.formatted() || registered.is_some()) {
        return Err(MetaError::WrongCluster(format!(
            "{url} is a metadata database of its own (cluster {}), not a home of cluster {cluster}: a new home \
             starts from an empty database (locus meta --init formats it)",
            home.cluster_id()
        )));
    }
    // A new home, or one whose adoption a crash cut short after it was registered.
    let id = match registered {
        Some(id) => id,
        None => {
            let name = name.to_string();
            crate::engine::write(root, true, move |t| {
                let mut taken: Vec<HomeId> = Vec::new();
                for key in t.list_xattrs(0)?.into_iter().filter(|k| k.starts_with(b"locus.home.")) {
                    if let Some(id) = t.get_xattr(0, &key)?.and_then(|v| String::from_utf8(v).ok()?.parse().ok()) {
                        taken.push(id);
                    }
                }
                let id: HomeId =
                    taken.into_iter().max().unwrap_or(0).checked_add(1).ok_or_else(|| {
                        MetaError::InvalidArgument("a cluster has at most 65,535 metadata homes".into())
                    })?;
                t.set_xattr(0, &registry_key(&name), id.to_string().as_bytes())?;
                Ok(id)
            })?
        }
    };
    let identity = format!("{cluster} {id} {name}");
    crate::engine::write(home, true, move |t| {
        // Its format's root directory is no inode of the cluster (home 0 holds the root).
        t.delete_inode(proto::types::ROOT_INODE)?;
        t.set_xattr(0, IDENTITY, identity.as_bytes())
    })?;
    tracing::info!(home = name, id, url, "a new metadata home");
    Ok(id)
}

/// Settles the junctions a crash left half made (`make_junction`): one that its parent
/// names is kept, any other is deleted. Blocking; run as meta starts.
pub(crate) fn settle_junctions(homes: &Homes) -> Result<(), MetaError> {
    for home in &homes.all()[1..] {
        let pending: Vec<Vec<u8>> = home.store.read(|t| {
            Ok(t.list_xattrs(0)?.into_iter().filter(|k| k.starts_with(b"locus.pending-junction.")).collect())
        })?;
        for key in pending {
            let Some(value) = note(&home.store, key.clone())? else { continue };
            let (ino, parent, name) = parse_pending(&value)
                .ok_or_else(|| MetaError::Corrupt(format!("pending junction {}: {value:?}", show(&key))))?;
            let named = homes.store(home_of(parent))?.read(|t| t.get_dentry(parent, &name))? == Some(ino);
            crate::engine::write(&home.store, true, move |t| finish_junction(t, ino, named))?;
            tracing::warn!(home = home.name, ino, kept = named, "settled a junction a crash left half made");
        }
    }
    Ok(())
}

/// "<ino> <parent> <name in hex>" of a pending junction.
fn pending_value(ino: InodeId, parent: InodeId, name: &[u8]) -> String {
    format!("{ino} {parent} {}", hex::encode(name))
}

fn parse_pending(value: &str) -> Option<(InodeId, InodeId, Vec<u8>)> {
    let mut parts = value.split(' ');
    let (ino, parent, name) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?);
    Some((ino, parent, hex::decode(name).ok()?))
}

/// Ends junction `ino`'s making in its home's engine: kept (its parent names it) or
/// deleted.
fn finish_junction(t: &mut dyn Txn, ino: InodeId, kept: bool) -> Result<(), MetaError> {
    t.delete_xattr(0, &pending_key(ino))?;
    if !kept {
        t.delete_xattr(0, &junction_key(ino))?;
        t.delete_all_xattrs(ino)?;
        t.delete_policy(ino)?;
        t.delete_inode(ino)?;
    }
    Ok(())
}

/// Makes directory `name` in `parent` the root of home `home` (`MakeJunction`), in three
/// commits: the directory's inode in its home, marked pending; its entry in the
/// parent's home (refused if the name was taken meanwhile); the mark cleared (or the
/// inode deleted). A crash between them is settled as meta starts (`settle_junctions`).
pub(crate) async fn make_junction(
    homes: &Arc<Homes>,
    ctx: crate::ops::Ctx,
    m: proto::meta::MakeJunction,
) -> Result<proto::types::Attr, MetaError> {
    use crate::engine::write_async;
    crate::ops::perm::check_privileged(&ctx.caller, "making the root of a metadata home")?;
    let home = homes
        .named(&m.home)
        .ok_or_else(|| {
            let known: Vec<&str> = homes.all().iter().map(|h| h.name.as_str()).collect();
            MetaError::NotFound(format!("metadata home {:?} (this meta serves {})", m.home, known.join(", ")))
        })?
        .id;
    if home == 0 {
        return Err(MetaError::InvalidArgument("the root's home has no junctions: name another home".into()));
    }
    let parent_home = home_of(m.parent);
    let create = proto::meta::Create {
        parent: m.parent,
        name: m.name.clone(),
        node: proto::meta::NewNode::Dir,
        mode: m.mode,
        umask: 0,
        exclusive: true,
    };
    let (h, c) = (homes.clone(), ctx.clone());
    let made = write_async(homes.store(home)?.clone(), true, move |t| {
        let new = match crate::ops::new_node(&mut h.txn(home, t), c.now, create.clone(), &c.caller)? {
            crate::ops::Fresh::Made(new) => new,
            crate::ops::Fresh::Found(found) => return Err(MetaError::Exists(format!("inode {}", found.attr.ino))),
        };
        let ino = new.attr.ino;
        t.set_xattr(0, &pending_key(ino), pending_value(ino, create.parent, &create.name).as_bytes())?;
        t.set_xattr(0, &junction_key(ino), &[])?;
        Ok(new)
    })
    .await?;
    let (h, c, new, name) = (homes.clone(), ctx.clone(), made.clone(), m.name.clone());
    let entered = write_async(homes.store(parent_home)?.clone(), true, move |t| {
        crate::ops::enter(&mut h.txn(parent_home, t), m.parent, &name, &new, c.now)
    })
    .await;
    let (ino, kept) = (made.attr.ino, entered.is_ok());
    write_async(homes.store(home)?.clone(), true, move |t| finish_junction(t, ino, kept)).await?;
    entered?;
    Ok(made.attr)
}

/// Every home with its junctions and inode count (`ListHomes`).
pub(crate) async fn list(homes: &Homes) -> Result<Vec<proto::meta::HomeInfo>, MetaError> {
    let mut out = Vec::new();
    for home in homes.all() {
        let (junctions, inodes) = crate::engine::read_async(&home.store, false, |t| {
            let junctions = t
                .list_xattrs(0)?
                .into_iter()
                .filter_map(|k| k.strip_prefix(b"locus.junction.").and_then(|i| show(i).parse().ok()))
                .collect();
            Ok((junctions, t.count_inodes()?))
        })
        .await?;
        let (id, name) = (home.id, home.name.clone());
        out.push(proto::meta::HomeInfo {
            id,
            name,
            junctions,
            inodes,
            writer: None,
            placement: None,
            site: None,
            moving: None,
            moves: Vec::new(),
            recent_writes: Vec::new(),
        });
    }
    Ok(out)
}

/// The chunks of `added` that no home besides the root's catalogues: a node's report
/// of new copies is recorded in the catalogue of each home that uses the chunk, and in
/// the root's only for the chunks no other home knows (`MetaService::commit`).
pub(crate) async fn root_only(homes: &Homes, mut added: Vec<StoredChunk>) -> Result<Vec<StoredChunk>, MetaError> {
    for home in &homes.all()[1..] {
        let ids: Vec<ChunkId> = added.iter().map(|c| c.id).collect();
        let known = crate::engine::read_async(&home.store, false, move |t| {
            ids.iter().map(|id| Ok(t.get_chunk(id)?.is_some())).collect::<Result<Vec<bool>, MetaError>>()
        })
        .await?;
        let mut known = known.into_iter();
        added.retain(|_| !known.next().unwrap_or(false));
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::cases::test_config;
    use crate::service::{HomeConfig, MetaConfig, MetaService};
    use proto::error::ErrorCode;
    use proto::meta::*;
    use proto::types::{Attr, ROOT_INODE, Timestamp};

    /// Home `name` committing in the database at `db_url`, held by this meta.
    fn held(name: &str, db_url: String) -> HomeConfig {
        HomeConfig { name: name.into(), db_url, ..HomeConfig::default() }
    }

    fn open(dir: &std::path::Path) -> Arc<MetaService> {
        let url = |f: &str| format!("sqlite://{}", dir.join(f).display());
        let config = MetaConfig { homes: vec![held("b", url("home-b.db"))], ..test_config(dir.join("meta.db")) };
        MetaService::open(&config).unwrap()
    }

    #[track_caller]
    fn ok(s: &Arc<MetaService>, req: MetaRequest) -> MetaReply {
        let shown = format!("{req:?}");
        s.handle_blocking(req).unwrap_or_else(|e| panic!("{shown} failed: {e}"))
    }

    fn code(s: &Arc<MetaService>, req: MetaRequest) -> ErrorCode {
        s.handle_blocking(req).expect_err("refused").code
    }

    fn attr(r: MetaReply) -> Attr {
        match r {
            MetaReply::Attr(a) | MetaReply::Made(Made { attr: a, .. }) => a,
            other => panic!("expected attributes, got {other:?}"),
        }
    }

    fn mk(s: &Arc<MetaService>, parent: InodeId, name: &str, node: NewNode) -> Attr {
        let create = Create { parent, name: name.into(), node, mode: 0o755, umask: 0, exclusive: true };
        attr(ok(s, MetaRequest::Create(create)))
    }

    fn junction(s: &Arc<MetaService>, parent: InodeId, name: &str, home: &str) -> Result<Attr, ErrorCode> {
        let m = MakeJunction { parent, name: name.into(), home: home.into(), mode: 0o750 };
        s.handle_blocking(MetaRequest::MakeJunction(m)).map(attr).map_err(|e| e.code)
    }

    fn commit(s: &Arc<MetaService>, ino: InodeId, tag: u8) {
        let chunk = ChunkId([tag; 32]);
        let commit = CommitWrite {
            session: 0,
            ino,
            extents: vec![Extent { file_offset: 0, len: 100, chunk, chunk_offset: 0 }],
            chunks: vec![StoredChunk { id: chunk, size: 100, nodes: vec!["n1".into()], receipt: None }],
            min_size: 100,
            mtime: Timestamp { secs: 1, nanos: 0 },
        };
        ok(s, MetaRequest::CommitWrite(commit));
    }

    fn garbage(s: &Arc<MetaService>, tag: u8) -> bool {
        match ok(s, MetaRequest::Unreferenced(Unreferenced { ids: vec![ChunkId([tag; 32])] })) {
            MetaReply::Garbage(g) => !g.ids.is_empty(),
            other => panic!("expected Garbage, got {other:?}"),
        }
    }

    #[test]
    fn a_junction_s_subtree_commits_in_its_home_and_reads_as_one_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let b = junction(&s, ROOT_INODE, "b", "b").unwrap();
        assert_eq!((home_of(b.ino), b.kind, b.mode & 0o7777, b.nlink), (1, proto::types::FileKind::Dir, 0o750, 2));
        assert_eq!(junction(&s, ROOT_INODE, "b", "b"), Err(ErrorCode::Exists));
        assert_eq!(junction(&s, ROOT_INODE, "c", "nowhere"), Err(ErrorCode::NotFound));
        assert_eq!(junction(&s, ROOT_INODE, "c", ROOT_HOME_NAME), Err(ErrorCode::InvalidArgument));
        // Made below it: numbered in home b; found, listed and read through the root.
        let sub = mk(&s, b.ino, "sub", NewNode::Dir);
        let file = mk(&s, sub.ino, "f", NewNode::File);
        assert_eq!((home_of(sub.ino), home_of(file.ino)), (1, 1));
        let found = attr(ok(&s, MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"b".to_vec() })));
        assert_eq!(found.ino, b.ino);
        let up = attr(ok(&s, MetaRequest::Lookup(Lookup { parent: b.ino, name: b"..".to_vec() })));
        assert_eq!(up.ino, ROOT_INODE);
        match ok(&s, MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 100 })) {
            MetaReply::Entries(e) => assert_eq!(e.iter().map(|e| e.attr.ino).collect::<Vec<_>>(), vec![b.ino]),
            other => panic!("{other:?}"),
        }
        assert_eq!(attr(ok(&s, MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE }))).nlink, 3);
        // Within a home, everything; across homes, EXDEV (mv copies).
        let rename = |parent, name: &str, new_parent, new_name: &str| {
            MetaRequest::Rename(Rename {
                parent,
                name: name.into(),
                new_parent,
                new_name: new_name.into(),
                mode: RenameMode::Replace,
            })
        };
        ok(&s, rename(sub.ino, "f", b.ino, "g"));
        let top = mk(&s, ROOT_INODE, "top", NewNode::File);
        assert_eq!(code(&s, rename(b.ino, "g", ROOT_INODE, "g")), ErrorCode::CrossDevice);
        assert_eq!(code(&s, rename(ROOT_INODE, "top", b.ino, "top")), ErrorCode::CrossDevice);
        let link = |ino, new_parent, name: &str| MetaRequest::Link(Link { ino, new_parent, new_name: name.into() });
        assert_eq!(code(&s, link(top.ino, b.ino, "l")), ErrorCode::CrossDevice);
        ok(&s, link(file.ino, sub.ino, "l"));
        // The junction itself stays where it is: renaming or removing it changes two homes.
        assert_eq!(code(&s, rename(ROOT_INODE, "b", ROOT_INODE, "b2")), ErrorCode::CrossDevice);
        let empty = junction(&s, ROOT_INODE, "e", "b").unwrap();
        assert_eq!(code(&s, MetaRequest::Rmdir(Rmdir { parent: ROOT_INODE, name: b"e".to_vec() })), ErrorCode::Busy);
        assert_eq!(attr(ok(&s, MetaRequest::GetAttr(GetAttr { ino: empty.ino }))).nlink, 2);
        // Data: the chunk only home b references is no garbage, and gc keeps it.
        commit(&s, file.ino, 7);
        assert!(!garbage(&s, 7));
        ok(&s, MetaRequest::ForgetChunks(ForgetChunks { ids: vec![ChunkId([7; 32])] }));
        let located = |s: &Arc<MetaService>| match ok(
            s,
            MetaRequest::ChunkLocations(ChunkLocations { ids: vec![ChunkId([7; 32])], caps: Vec::new() }),
        ) {
            MetaReply::Chunks(c) => (c[0].refcount, c[0].nodes.clone(), c[0].cached.clone()),
            other => panic!("{other:?}"),
        };
        assert_eq!(located(&s), (1, vec!["n1".to_string()], vec![]));
        // A node's reports of the chunk's copies reach home b's catalogue: a cached
        // copy at n2, then gone again; a replica at n3.
        for node in ["n2", "n3"] {
            ok(&s, MetaRequest::AdmitNode(AdmitNode { node: node.into() }));
        }
        let copy = |nodes: Vec<String>| StoredChunk { id: ChunkId([7; 32]), size: 100, nodes, receipt: None };
        let report = |node: &str, added: Vec<StoredChunk>, removed: Vec<ChunkId>| {
            MetaRequest::UpdateLocations(UpdateLocations { node: node.into(), added, removed })
        };
        ok(&s, report("n2", vec![copy(Vec::new())], Vec::new()));
        assert_eq!(located(&s), (1, vec!["n1".to_string(), "n2".into()], vec!["n2".to_string()]));
        ok(&s, report("n2", Vec::new(), vec![ChunkId([7; 32])]));
        ok(&s, report("n3", vec![copy(vec!["n1".into(), "n3".into()])], Vec::new()));
        assert_eq!(located(&s), (1, vec!["n1".to_string(), "n3".into()], vec![]));
        for (parent, name) in [(sub.ino, "l"), (b.ino, "g")] {
            ok(&s, MetaRequest::Unlink(Unlink { parent, name: name.into() }));
        }
        assert!(garbage(&s, 7));
        // Listed by home; inodes counted across homes.
        match ok(&s, MetaRequest::ListHomes(ListHomes {})) {
            MetaReply::Homes(h) => {
                assert_eq!(h.iter().map(|h| (h.id, h.name.as_str())).collect::<Vec<_>>(), [(0, "root"), (1, "b")]);
                assert_eq!((h[1].junctions.clone(), h[1].inodes), (vec![b.ino, empty.ino], 3));
            }
            other => panic!("{other:?}"),
        }
        // Open; a session's end releases its opens in every home.
        let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "t".into() };
        let session = match ok(&s, MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info })) {
            MetaReply::Welcome(w) => w.session,
            other => panic!("{other:?}"),
        };
        let access = OpenAccess { read: true, write: true };
        ok(&s, MetaRequest::Open(Open { ino: sub.ino, session, truncate: false, access }));
        drop(s);
        // Reopened: the home is known again by its database; the junction still there.
        let s = open(dir.path());
        assert_eq!(attr(ok(&s, MetaRequest::GetAttr(GetAttr { ino: b.ino }))).ino, b.ino);
        assert_eq!(mk(&s, b.ino, "after", NewNode::File).ino >> HOME_SHIFT, 1);
    }

    #[test]
    fn a_database_that_is_not_this_home_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        // Home b's database under another name, another cluster's database as a home.
        let other = tempfile::tempdir().unwrap();
        drop(MetaService::open(&test_config(other.path().join("meta.db"))).unwrap());
        let url = |p: std::path::PathBuf| format!("sqlite://{}", p.display());
        for (name, db) in [("c", dir.path().join("home-b.db")), ("c", other.path().join("meta.db"))] {
            let config = MetaConfig { homes: vec![held(name, url(db))], ..test_config(dir.path().join("meta.db")) };
            let e = MetaService::open(&config).err().expect("refused");
            assert!(matches!(e, MetaError::WrongCluster(_)), "{e}");
        }
        let config = MetaConfig {
            homes: vec![held("a b", url(dir.path().join("x.db")))],
            ..test_config(dir.path().join("meta.db"))
        };
        assert!(matches!(MetaService::open(&config), Err(MetaError::InvalidArgument(_))));
    }

    #[test]
    fn a_junction_half_made_is_settled_when_meta_starts() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let b = junction(&s, ROOT_INODE, "b", "b").unwrap();
        drop(s);
        // As if a crash came after the first step of two junctions (one named by its
        // parent, one not): their pending marks are still there.
        let home = crate::engine::open_store(
            &dir.path().join("home-b.db").display().to_string(),
            None,
            false,
            None,
            crate::service::DEFAULT_DB_TIMEOUT,
        )
        .unwrap();
        let orphan = b.ino + 100;
        crate::engine::write(&home, true, move |t| {
            t.set_xattr(0, &pending_key(b.ino), pending_value(b.ino, ROOT_INODE, b"b").as_bytes())?;
            let mut i = t.get_inode(b.ino)?.unwrap();
            i.attr.ino = orphan;
            t.put_inode(&i)?;
            t.set_xattr(0, &junction_key(orphan), &[])?;
            t.set_xattr(0, &pending_key(orphan), pending_value(orphan, ROOT_INODE, b"lost").as_bytes())
        })
        .unwrap();
        drop(home);
        let s = open(dir.path());
        assert_eq!(attr(ok(&s, MetaRequest::GetAttr(GetAttr { ino: b.ino }))).ino, b.ino);
        assert_eq!(code(&s, MetaRequest::GetAttr(GetAttr { ino: orphan })), ErrorCode::NotFound);
        match ok(&s, MetaRequest::ListHomes(ListHomes {})) {
            MetaReply::Homes(h) => assert_eq!(h[1].junctions, vec![b.ino]),
            other => panic!("{other:?}"),
        }
    }

    /// An open in a home other than 0 checks its session and finds its policy in home 0
    /// (rows remembered for a moment: `TRUSTED_FOR`); a policy set at this meta applies
    /// at once, and a session that ends, by goodbye or by expiry, opens nothing more.
    #[test]
    fn home_0_s_sessions_and_policies_changed_here_apply_at_once_in_another_home() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        let b = junction(&s, ROOT_INODE, "b", "b").unwrap();
        let file = mk(&s, b.ino, "f", NewNode::File);
        let hello = || {
            let session = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "t".into() };
            match ok(&s, MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session })) {
                MetaReply::Welcome(w) => w.session,
                other => panic!("{other:?}"),
            }
        };
        let open_file = |session| {
            let access = OpenAccess { read: true, write: false };
            match s.handle_blocking(MetaRequest::Open(Open { ino: file.ino, session, truncate: false, access })) {
                Ok(MetaReply::Opened(o)) => Ok(o.policy),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.code),
            }
        };
        let (left, expired) = (hello(), hello());
        for session in [left, expired] {
            assert_eq!(open_file(session), Ok(Policy::default()));
        }
        // The root's policy, set at this meta, applies to the next open at once.
        let policy = Policy { copies: 1, rpo_secs: 7, ..Policy::default() };
        ok(&s, MetaRequest::SetPolicy(SetPolicy { ino: ROOT_INODE, policy: Some(policy.clone()) }));
        assert_eq!(open_file(left), Ok(policy));
        ok(&s, MetaRequest::Goodbye(Goodbye { session: left }));
        assert_eq!(open_file(left), Err(ErrorCode::SessionUnknown));
        let now = Timestamp::now().millis() + 3_600_000;
        assert!(s.expire_sessions_at(now).unwrap().contains(&expired));
        assert_eq!(open_file(expired), Err(ErrorCode::SessionUnknown));
    }

    const ROOT_HOME_NAME: &str = crate::service::ROOT_HOME;
}
