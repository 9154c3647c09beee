//! Renames and links between metadata homes, atomic by two-phase commit across the
//! homes' engines (issue 35).
//!
//! The meta holding the home of the directory a rename or link changes (where
//! `writing_home` sends it) coordinates. It runs the operation's rules (`ops`, the same
//! code as within a home) in one serializable transaction per home whose rows it
//! touches, each on a connection of its own to that home's primary (`TwoPhaseConn`),
//! reads and writes alike. Each other home it wrote is then prepared (PostgreSQL's
//! PREPARE TRANSACTION, which survives any crash) under the gid
//! `locus-x-<coordinator home>-<txid>-<home>`. The coordinator's own transaction then
//! commits with a *decision row* (`locus.cross.<txid>`, an attribute of inode 0 of
//! its home): that commit is the operation's commit point. Only then are the prepared
//! parts committed, and the decision row deleted.
//!
//! A crash anywhere leaves prepared parts behind; the `cross-home-recovery` worker of
//! the meta holding their home resolves each one older than the database timeout by
//! the decision row at the coordinator's home: committed if it says so, rolled back if
//! it is missing, in which case the worker writes an abort decision first, in a
//! serializable transaction, so that a coordinator that was merely slow can no longer
//! commit (its own decision insert then conflicts). Each prepared part also holds its
//! home's epoch row, so that a move of the home (which bumps it) waits for the part to
//! be decided rather than copy the home without it.
//!
//! SQLite homes have no prepared transactions: between them a rename or link stays
//! EXDEV (`mv` copies). Rows of homes the operation only read are read in their
//! transaction's snapshot and not prepared, as a path walk's reads are not held.

use crate::engine::Store;
use crate::error::MetaError;
use crate::homes::{HomeId, Homes};
use crate::ops::Ctx;
use crate::store::{TwoPhaseConn, Txn};
use proto::meta::{MetaReply, MetaRequest};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use util::sync::lock;

/// What every gid of a prepared part starts with.
const GID_PREFIX: &str = "locus-x-";
/// What every decision row's name starts with.
const DECISION_PREFIX: &str = "locus.cross.";
/// Tries of an operation that lost a serialization conflict.
const MAX_TRIES: u32 = 20;
/// Name of the sender of the kept-row notifications a cross-home commit sends (any
/// name no meta goes by).
const SENDER: &str = "cross-home";
/// How long decision rows whose parts may still be prepared are kept at least.
const DECISION_KEPT: Duration = Duration::from_secs(24 * 3600);

/// One operation spanning homes at a time per meta: two of them locking rows in two
/// engines in opposite orders would wait for each other until the database timeout.
static CROSSING: Mutex<()> = Mutex::new(());

/// The parts of one operation spanning homes, a transaction per home.
pub(crate) struct Cross {
    parts: BTreeMap<HomeId, Part>,
    /// The homes whose rows were written.
    written: BTreeSet<HomeId>,
    /// The home whose chunk catalogue the next refcount change goes to: that of the
    /// extents changed last (`HomesTxn::catalogue`).
    pub(crate) catalogue: HomeId,
}

/// One home's part: its engine and the connection its transaction runs on.
struct Part {
    store: Arc<Store>,
    conn: Box<dyn TwoPhaseConn>,
}

impl Cross {
    fn new(home: HomeId) -> Cross {
        Cross { parts: BTreeMap::new(), written: BTreeSet::new(), catalogue: home }
    }

    /// Home `home`'s part, begun at its first use.
    pub(crate) fn open(&mut self, homes: &Homes, home: HomeId) -> Result<&mut dyn Txn, MetaError> {
        let part = match self.parts.entry(home) {
            Entry::Occupied(part) => part.into_mut(),
            Entry::Vacant(slot) => {
                let store = homes.store(home)?.clone();
                let mut conn = store.two_phase()?;
                if let Err(e) = conn.begin(store.epoch()) {
                    give_back(&store, conn, false);
                    return Err(e);
                }
                slot.insert(Part { store, conn })
            }
        };
        Ok(part.conn.txn())
    }

    /// Home `home`'s part, for a write.
    pub(crate) fn write(&mut self, homes: &Homes, home: HomeId) -> Result<&mut dyn Txn, MetaError> {
        self.written.insert(home);
        self.open(homes, home)
    }

    /// The notifications that name the rows each written home's part wrote.
    fn notifications(&self) -> BTreeMap<HomeId, Vec<String>> {
        let parts = self.parts.iter().filter(|(home, _)| self.written.contains(home));
        parts.map(|(home, part)| (*home, part.conn.notifications(SENDER))).collect()
    }

    fn part(&mut self, home: HomeId) -> Result<&mut Part, MetaError> {
        self.parts.get_mut(&home).ok_or_else(|| MetaError::Internal(format!("no part of home {home} is open")))
    }
}

/// Ends whatever `conn` has open (unless `clean`) and keeps it for the next use.
fn give_back(store: &Store, mut conn: Box<dyn TwoPhaseConn>, clean: bool) {
    if !clean && let Err(e) = conn.rollback() {
        tracing::warn!(error = %e, "ending a cross-home transaction's part failed; dropping its connection");
        return;
    }
    store.give_back_two_phase(conn);
}

/// Whether `req` may change rows of two homes, and is run by `run` when it does: a
/// rename or link between homes, and, once a file or directory lives under a directory
/// of another home than its own (renamed there), an unlink, rmdir or create of an
/// existing name that changes its inode.
pub(crate) fn spans_homes(req: &MetaRequest) -> bool {
    use MetaRequest as R;
    matches!(req, R::Rename(_) | R::Link(_) | R::Unlink(_) | R::Rmdir(_) | R::Create(_) | R::CreateOpen(_))
}

/// Whether `req` is one that spans homes by its nature (not only once a file was
/// renamed between them): a forwarding meta then forgets what it keeps of every home.
pub(crate) fn joins_homes(req: &MetaRequest) -> bool {
    matches!(req, MetaRequest::Rename(_) | MetaRequest::Link(_))
}

/// Runs `req` (a rename or link, `spans_homes`) across homes, coordinated by home
/// `home`, whose engines `homes` gives (asked again after a conflict: a home may have
/// moved). Blocking.
pub(crate) fn run(
    homes: impl Fn() -> Arc<Homes>,
    home: HomeId,
    ctx: &Ctx,
    req: &MetaRequest,
) -> Result<MetaReply, MetaError> {
    let _alone = lock(&CROSSING);
    let mut tries = 0;
    loop {
        let homes = homes();
        let mut cross = Cross::new(home);
        let outcome = attempt(&homes, home, ctx, req, &mut cross);
        for part in std::mem::take(&mut cross.parts).into_values() {
            give_back(&part.store, part.conn, false);
        }
        match outcome {
            Err(e) if e.is_conflict() && tries < MAX_TRIES => {
                tries += 1;
                tracing::debug!(error = %e, tries, "a cross-home operation lost a conflict; running it again");
                std::thread::sleep(Duration::from_millis(5 << tries.min(5)));
            }
            outcome => return outcome,
        }
    }
}

/// One try of `run`: the operation, the parts prepared, the decision, the parts
/// committed.
fn attempt(
    homes: &Homes,
    home: HomeId,
    ctx: &Ctx,
    req: &MetaRequest,
    cross: &mut Cross,
) -> Result<MetaReply, MetaError> {
    let reply = crate::ops::write(&mut homes.cross_txn(home, cross), ctx, req.clone())?;
    let txid = crate::store::values::random_hex()?;
    let others: Vec<HomeId> = cross.written.iter().copied().filter(|h| *h != home).collect();
    let gid = |part: HomeId| format!("{GID_PREFIX}{home}-{txid}-{part}");
    // Before anything ends a part's transaction.
    let notifications = cross.notifications();
    let mut prepared = Vec::new();
    for &part in &others {
        if let Err(e) = cross.part(part)?.conn.prepare(&gid(part)) {
            abort(cross, &prepared, &gid);
            return Err(e);
        }
        prepared.push(part);
    }
    util::crash_point!("cross-after-prepare");
    // The commit point: the decision row, in the coordinator's own transaction.
    let decision = Decision { commit: true, at_ms: ctx.now_ms, parts: others.clone(), notifications };
    let key = decision_key(&txid);
    let own = cross.open(homes, home)?;
    if own.get_xattr(0, &key)?.is_some() {
        abort(cross, &prepared, &gid);
        return Err(MetaError::Conflict(format!("decision {txid} exists already")));
    }
    own.set_xattr(0, &key, decision.encode().as_bytes())?;
    let store = homes.store(home)?.clone();
    // As any commit of this meta's: not once its lease ran out or its standbys are
    // behind the metadata RPO (nothing is changed then).
    if let Some(Err(refused)) = store.primary_lease().map(|l| l.check()) {
        abort(cross, &prepared, &gid);
        return Err(refused);
    }
    match cross.part(home)?.conn.commit() {
        Ok(_) => {}
        Err(e @ (MetaError::Conflict(_) | MetaError::Fenced(_))) => {
            abort(cross, &prepared, &gid);
            return Err(e);
        }
        // Whether the decision committed is unknown: recovery settles the parts.
        Err(e) => return Err(e),
    }
    util::crash_point!("cross-after-decision");
    // Committed: from here on nothing fails the operation; what is left undone
    // (a part's commit, the decision row's deletion) is recovery's.
    let mut finished = true;
    for &part in &others {
        let payloads = decision.of(part);
        let Part { store, conn } = cross.part(part)?;
        let done = conn.commit_prepared_and_notify(&gid(part), payloads);
        match done {
            Ok(position) => store.committed_elsewhere(position, true),
            Err(e) => {
                finished = false;
                tracing::warn!(error = %e, gid = gid(part), "committing a prepared part failed; recovery will");
            }
        }
    }
    let payloads = decision.of(home);
    let Part { store: own_store, conn } = cross.part(home)?;
    let deleted = (|| {
        conn.begin(own_store.epoch())?;
        if finished {
            conn.txn().delete_xattr(0, &key)?;
        }
        conn.commit()?;
        conn.notify(payloads)
    })();
    match deleted {
        Ok(position) => own_store.committed_elsewhere(position, true),
        Err(e) => {
            own_store.committed_elsewhere(0, true);
            tracing::warn!(error = %e, txid, "ending a cross-home operation's decision failed; recovery will")
        }
    }
    Ok(reply)
}

/// Rolls back the parts `prepared` (the decision was not taken).
fn abort(cross: &mut Cross, prepared: &[HomeId], gid: &dyn Fn(HomeId) -> String) {
    for &part in prepared {
        if let Err(e) = cross.part(part).and_then(|p| p.conn.finish(&gid(part), false)) {
            tracing::warn!(error = %e, gid = gid(part), "rolling back a prepared part failed; recovery will");
        }
    }
}

fn decision_key(txid: &str) -> Vec<u8> {
    format!("{DECISION_PREFIX}{txid}").into_bytes()
}

/// A decision row's value: "commit|abort <at_ms> <part,part,...>", then a line
/// "<home> <notification>" for each notification of a part (what recovery sends once
/// it commits the part).
#[derive(Debug, PartialEq)]
struct Decision {
    commit: bool,
    at_ms: i64,
    parts: Vec<HomeId>,
    notifications: BTreeMap<HomeId, Vec<String>>,
}

impl Decision {
    /// The notifications of home `home`'s part.
    fn of(&self, home: HomeId) -> &[String] {
        self.notifications.get(&home).map_or(&[], Vec::as_slice)
    }

    fn encode(&self) -> String {
        let verb = if self.commit { "commit" } else { "abort" };
        let parts: Vec<String> = self.parts.iter().map(HomeId::to_string).collect();
        let mut out = format!("{verb} {} {}", self.at_ms, parts.join(","));
        for (home, notifications) in self.notifications.iter().filter(|(h, _)| self.parts.contains(h)) {
            for notification in notifications {
                out.push_str(&format!("\n{home} {notification}"));
            }
        }
        out
    }

    fn parse(value: &[u8]) -> Option<Decision> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.lines();
        let mut head = lines.next()?.split(' ');
        let commit = match head.next()? {
            "commit" => true,
            "abort" => false,
            _ => return None,
        };
        let at_ms = head.next()?.parse().ok()?;
        let parts = match head.next() {
            None | Some("") => Vec::new(),
            Some(list) => list.split(',').map(|h| h.parse().ok()).collect::<Option<Vec<HomeId>>>()?,
        };
        let mut notifications: BTreeMap<HomeId, Vec<String>> = BTreeMap::new();
        for line in lines {
            let (home, notification) = line.split_once(' ')?;
            notifications.entry(home.parse().ok()?).or_default().push(notification.to_string());
        }
        Some(Decision { commit, at_ms, parts, notifications })
    }
}

/// The coordinator's home and txid of a part's gid.
fn parse_gid(gid: &str) -> Option<(HomeId, &str)> {
    let mut fields = gid.strip_prefix(GID_PREFIX)?.split('-');
    let home = fields.next()?.parse().ok()?;
    let txid = fields.next().filter(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_hexdigit()))?;
    fields.next()?.parse::<HomeId>().ok()?;
    Some((home, txid))
}

/// What one round of recovery did.
#[derive(Default, Debug)]
pub(crate) struct Recovered {
    pub(crate) committed: u64,
    pub(crate) rolled_back: u64,
    pub(crate) decisions_dropped: u64,
}

/// Settles the prepared parts older than `age` in the engines of `held` (the homes
/// this meta writes) by their decisions, and drops decision rows of `held` homes that
/// nothing can need any more. Blocking.
pub(crate) fn recover(homes: &Homes, held: &[HomeId], age: Duration, now_ms: i64) -> Result<Recovered, MetaError> {
    let _alone = lock(&CROSSING);
    let mut done = Recovered::default();
    for &home in held {
        let store = homes.store(home)?.clone();
        if !store.has_two_phase() {
            continue;
        }
        let mut conn = store.two_phase()?;
        let settled = (|| -> Result<(), MetaError> {
            // Its own old decisions first: that transaction also finds a home that moved
            // away just now, which its new holder settles.
            match drop_old_decisions(&store, &mut *conn, now_ms) {
                Err(e @ MetaError::Fenced(_)) => {
                    tracing::debug!(home, error = %e, "not recovering a home that moved");
                    return Ok(());
                }
                dropped => done.decisions_dropped += dropped?,
            }
            for gid in conn.in_doubt(GID_PREFIX, age)? {
                let Some((coordinator, txid)) = parse_gid(&gid) else {
                    tracing::warn!(
                        gid,
                        "a prepared transaction with a gid of Locus's form but not its fields: left alone"
                    );
                    continue;
                };
                let decision = decide(homes, coordinator, txid, now_ms)?;
                if conn.finish(&gid, decision.commit)? {
                    if decision.commit {
                        let payloads = decision.of(home);
                        let position = conn.notify(payloads)?;
                        store.committed_elsewhere(position, true);
                        done.committed += 1;
                    } else {
                        done.rolled_back += 1;
                    }
                    tracing::warn!(gid, commit = decision.commit, "settled a prepared part of a cross-home operation");
                }
            }
            Ok(())
        })();
        give_back(&store, conn, false);
        settled?;
    }
    Ok(done)
}

/// The decision on operation `txid` of home `coordinator`: its row, or, if there is
/// none, an abort decision written now (which a slow coordinator's own commit then
/// conflicts with).
fn decide(homes: &Homes, coordinator: HomeId, txid: &str, now_ms: i64) -> Result<Decision, MetaError> {
    let store = homes.store(coordinator)?.clone();
    let mut conn = store.two_phase()?;
    let key = decision_key(txid);
    let decided = (|| {
        conn.begin(store.epoch())?;
        if let Some(value) = conn.txn().get_xattr(0, &key)? {
            return Decision::parse(&value).ok_or_else(|| {
                MetaError::Corrupt(format!("decision row {txid}: {:?}", String::from_utf8_lossy(&value)))
            });
        }
        let abort = Decision { commit: false, at_ms: now_ms, parts: Vec::new(), notifications: BTreeMap::new() };
        conn.txn().set_xattr(0, &key, abort.encode().as_bytes())?;
        conn.commit()?;
        Ok(abort)
    })();
    give_back(&store, conn, false);
    decided
}

/// Deletes the decision rows of `store`'s home older than `DECISION_KEPT` (a part of
/// them may have been in doubt for a long time, but not that long). Returns how many.
fn drop_old_decisions(store: &Store, conn: &mut dyn TwoPhaseConn, now_ms: i64) -> Result<u64, MetaError> {
    conn.begin(store.epoch())?;
    let t = conn.txn();
    let mut dropped = 0;
    for key in t.list_xattrs(0)?.into_iter().filter(|k| k.starts_with(DECISION_PREFIX.as_bytes())) {
        let old = match t.get_xattr(0, &key)?.as_deref().and_then(Decision::parse) {
            Some(d) => now_ms - d.at_ms > DECISION_KEPT.as_millis() as i64,
            None => false,
        };
        if old {
            t.delete_xattr(0, &key)?;
            dropped += 1;
        }
    }
    match dropped {
        0 => conn.rollback()?,
        _ => drop(conn.commit()?),
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_gids_read_back_as_written() {
        let sent = vec![format!("{SENDER} i5 e7:6162"), format!("{SENDER} i6")];
        let notifications = BTreeMap::from([(2, sent), (0, vec![format!("{SENDER} i1")])]);
        let d = Decision { commit: true, at_ms: 17, parts: vec![2], notifications };
        let back = Decision::parse(d.encode().as_bytes()).unwrap();
        assert_eq!((back.commit, back.at_ms, back.parts.clone()), (true, 17, vec![2]));
        assert_eq!(back.notifications, BTreeMap::from([(2, d.notifications[&2].clone())]), "only the parts'");
        let abort = Decision { commit: false, at_ms: 3, parts: Vec::new(), notifications: BTreeMap::new() };
        assert_eq!(Decision::parse(abort.encode().as_bytes()), Some(abort));
        assert!(Decision::parse(b"maybe 1 2").is_none());
        assert_eq!(parse_gid("locus-x-1-abc123-2"), Some((1, "abc123")));
        for bad in ["locus-x-1-abc", "locus-x--abc-2", "other-1-ab-2", "locus-x-1-xyz-2"] {
            assert_eq!(parse_gid(bad), None, "{bad}");
        }
    }

    use crate::conformance::test_config;
    use crate::service::{HomeConfig, MetaConfig, MetaService};
    use proto::error::ErrorCode;
    use proto::meta::*;
    use proto::types::{Attr, ChunkId, Extent, InodeId, ROOT_INODE, Timestamp};

    /// A meta holding home 0 and home b, each in a database of the shared server.
    fn two_homes() -> (Arc<MetaService>, String, String, (tempfile::TempDir, Arc<testkit::postgres::PgServer>)) {
        let server = testkit::postgres::shared();
        let (root, b) = (server.create_database(), server.create_database());
        let dir = tempfile::tempdir().unwrap();
        let home = HomeConfig { name: "b".into(), db_url: b.clone(), ..HomeConfig::default() };
        let config = MetaConfig { db_url: root.clone(), homes: vec![home], ..test_config(dir.path().join("unused")) };
        (MetaService::open(&config).unwrap(), root, b, (dir, server))
    }

    fn ask(s: &Arc<MetaService>, req: MetaRequest) -> Result<MetaReply, ErrorCode> {
        s.handle_blocking(req).map_err(|e| e.code)
    }

    fn attr(r: Result<MetaReply, ErrorCode>) -> Result<Attr, ErrorCode> {
        match r? {
            MetaReply::Attr(a) | MetaReply::Made(Made { attr: a, .. }) => Ok(a),
            other => panic!("expected attributes, got {other:?}"),
        }
    }

    fn mk(s: &Arc<MetaService>, parent: InodeId, name: &str, node: NewNode) -> Attr {
        let create = Create { parent, name: name.into(), node, mode: 0o755, umask: 0, exclusive: true };
        attr(ask(s, MetaRequest::Create(create))).unwrap()
    }

    fn lookup(s: &Arc<MetaService>, parent: InodeId, name: &str) -> Result<Attr, ErrorCode> {
        attr(ask(s, MetaRequest::Lookup(Lookup { parent, name: name.into() })))
    }

    fn getattr(s: &Arc<MetaService>, ino: InodeId) -> Result<Attr, ErrorCode> {
        attr(ask(s, MetaRequest::GetAttr(GetAttr { ino })))
    }

    fn rename(
        s: &Arc<MetaService>,
        from: (InodeId, &str),
        to: (InodeId, &str),
        mode: RenameMode,
    ) -> Result<(), ErrorCode> {
        let (parent, name, new_parent, new_name) = (from.0, from.1.into(), to.0, to.1.into());
        ask(s, MetaRequest::Rename(Rename { parent, name, new_parent, new_name, mode })).map(drop)
    }

    fn names(s: &Arc<MetaService>, dir: InodeId) -> Vec<String> {
        let (mut out, mut after) = (Vec::new(), 0);
        loop {
            let page = match ask(s, MetaRequest::ReadDir(ReadDir { ino: dir, after, limit: 2 })).unwrap() {
                MetaReply::Entries(e) => e,
                other => panic!("{other:?}"),
            };
            let Some(last) = page.last() else { break };
            after = last.cookie;
            out.extend(page.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()));
        }
        out.sort();
        out
    }

    fn count(url: &str, sql: &str) -> i64 {
        postgres::Client::connect(url, postgres::NoTls).unwrap().query_one(sql, &[]).unwrap().get(0)
    }

    /// Nothing is left prepared in either database, nor a decision row.
    fn settled(root: &str, b: &str) {
        for url in [root, b] {
            let prepared = "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()";
            assert_eq!(count(url, prepared), 0, "{url}");
            assert_eq!(count(url, "SELECT count(*) FROM xattrs WHERE name LIKE 'locus.cross.%'"), 0, "{url}");
        }
    }

    #[test]
    fn renames_and_links_between_homes_change_both_homes_or_neither() {
        let (s, root, b_url, _dir) = two_homes();
        let junction = MakeJunction { parent: ROOT_INODE, name: "b".into(), home: "b".into(), mode: 0o755 };
        let b = attr(ask(&s, MetaRequest::MakeJunction(junction))).unwrap().ino;
        use RenameMode::{Exchange, NoReplace, Replace};
        // A file of home 0 into home b, found there (its entry takes home b's cookies:
        // readdir pages through both), gone here; its inode stays in home 0.
        let top = mk(&s, ROOT_INODE, "top", NewNode::File);
        for name in ["x1", "x2", "x3"] {
            mk(&s, b, name, NewNode::File);
        }
        rename(&s, (ROOT_INODE, "top"), (b, "moved"), Replace).unwrap();
        assert_eq!(lookup(&s, b, "moved").unwrap().ino, top.ino);
        assert_eq!(lookup(&s, ROOT_INODE, "top"), Err(ErrorCode::NotFound));
        assert_eq!(names(&s, b), ["moved", "x1", "x2", "x3"]);
        // Linked back into home 0, then unlinked in home b: reached by its other name.
        ask(&s, MetaRequest::Link(Link { ino: top.ino, new_parent: ROOT_INODE, new_name: "l".into() })).unwrap();
        assert_eq!(getattr(&s, top.ino).unwrap().nlink, 2);
        ask(&s, MetaRequest::Unlink(Unlink { parent: b, name: "moved".into() })).unwrap();
        assert_eq!((lookup(&s, ROOT_INODE, "l").unwrap().ino, getattr(&s, top.ino).unwrap().nlink), (top.ino, 1));
        // A directory: its parent's link counts follow, its ".." too, and what is made
        // in it commits in its own home (0) still.
        let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
        let (root_links, b_links) = (getattr(&s, ROOT_INODE).unwrap().nlink, getattr(&s, b).unwrap().nlink);
        rename(&s, (ROOT_INODE, "d"), (b, "d"), NoReplace).unwrap();
        assert_eq!(getattr(&s, ROOT_INODE).unwrap().nlink, root_links - 1);
        assert_eq!(getattr(&s, b).unwrap().nlink, b_links + 1);
        assert_eq!(lookup(&s, d.ino, "..").unwrap().ino, b);
        assert_eq!(crate::homes::home_of(mk(&s, d.ino, "inner", NewNode::File).ino), 0);
        // Refused ones change nothing: onto a non-empty directory, NOREPLACE onto a name.
        let full = mk(&s, ROOT_INODE, "full", NewNode::Dir);
        mk(&s, full.ino, "f", NewNode::File);
        assert_eq!(rename(&s, (b, "d"), (ROOT_INODE, "full"), Replace), Err(ErrorCode::NotEmpty));
        assert_eq!(rename(&s, (ROOT_INODE, "l"), (b, "x1"), NoReplace), Err(ErrorCode::Exists));
        assert_eq!(names(&s, b), ["d", "x1", "x2", "x3"]);
        // Replacing a file of the other home destroys it, and its data is garbage then
        // (its home's catalogue lost the reference).
        let victim = lookup(&s, b, "x1").unwrap();
        let chunk = ChunkId([9; 32]);
        let commit = CommitWrite {
            session: 0,
            ino: victim.ino,
            extents: vec![Extent { file_offset: 0, len: 10, chunk, chunk_offset: 0 }],
            chunks: vec![StoredChunk { id: chunk, size: 10, nodes: vec!["n1".into()], receipt: None }],
            min_size: 10,
            mtime: Timestamp { secs: 1, nanos: 0 },
        };
        ask(&s, MetaRequest::CommitWrite(commit)).unwrap();
        let garbage = |s: &Arc<MetaService>| match ask(s, MetaRequest::Unreferenced(Unreferenced { ids: vec![chunk] }))
        {
            Ok(MetaReply::Garbage(g)) => !g.ids.is_empty(),
            other => panic!("{other:?}"),
        };
        assert!(!garbage(&s));
        rename(&s, (ROOT_INODE, "l"), (b, "x1"), Replace).unwrap();
        assert_eq!(getattr(&s, victim.ino), Err(ErrorCode::NotFound));
        assert_eq!(lookup(&s, b, "x1").unwrap().ino, top.ino);
        assert!(garbage(&s));
        // An exchange, and the junction itself renamed within home 0 (its inode, in
        // home b, changes too).
        let here = mk(&s, ROOT_INODE, "here", NewNode::File);
        let there = lookup(&s, b, "x2").unwrap();
        rename(&s, (ROOT_INODE, "here"), (b, "x2"), Exchange).unwrap();
        assert_eq!(
            (lookup(&s, ROOT_INODE, "here").unwrap().ino, lookup(&s, b, "x2").unwrap().ino),
            (there.ino, here.ino)
        );
        rename(&s, (ROOT_INODE, "b"), (ROOT_INODE, "b2"), Replace).unwrap();
        assert_eq!(lookup(&s, ROOT_INODE, "b2").unwrap().ino, b);
        // Removing what was renamed into another home changes both homes too.
        ask(&s, MetaRequest::Unlink(Unlink { parent: d.ino, name: "inner".into() })).unwrap();
        ask(&s, MetaRequest::Rmdir(Rmdir { parent: b, name: "d".into() })).unwrap();
        assert_eq!((getattr(&s, d.ino), getattr(&s, b).unwrap().nlink), (Err(ErrorCode::NotFound), b_links));
        // A home's root stays while its home is there, as a mount point does.
        let junction = MakeJunction { parent: ROOT_INODE, name: "e".into(), home: "b".into(), mode: 0o755 };
        let e = attr(ask(&s, MetaRequest::MakeJunction(junction))).unwrap().ino;
        assert_eq!(ask(&s, MetaRequest::Rmdir(Rmdir { parent: ROOT_INODE, name: "e".into() })), Err(ErrorCode::Busy));
        mk(&s, ROOT_INODE, "dd", NewNode::Dir);
        assert_eq!(rename(&s, (ROOT_INODE, "dd"), (ROOT_INODE, "e"), Replace), Err(ErrorCode::Busy));
        assert_eq!(lookup(&s, ROOT_INODE, "e").unwrap().ino, e);
        settled(&root, &b_url);
    }

    #[test]
    fn parts_left_in_doubt_are_settled_by_their_decision() {
        let (s, root, b_url, _dir) = two_homes();
        let prepare = |gid: &str, name: &str| {
            let mut c = postgres::Client::connect(&b_url, postgres::NoTls).unwrap();
            let sql = format!(
                "BEGIN; INSERT INTO xattrs (ino, name, value) VALUES (0, '{name}', 'x'); PREPARE TRANSACTION '{gid}'"
            );
            c.batch_execute(&sql).unwrap();
        };
        // One whose coordinator died before deciding, one after deciding to commit.
        prepare("locus-x-0-aa11-1", "undecided");
        prepare("locus-x-0-bb22-1", "decided");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let decision = Decision { commit: true, at_ms: now, parts: vec![1], notifications: BTreeMap::new() };
        let mut c = postgres::Client::connect(&root, postgres::NoTls).unwrap();
        c.execute(
            "INSERT INTO xattrs (ino, name, value) VALUES (0, 'locus.cross.bb22', $1)",
            &[&decision.encode().into_bytes()],
        )
        .unwrap();
        // Too young to settle, then settled.
        let homes = s.homes();
        let young = recover(&homes, &[0, 1], Duration::from_secs(3600), now).unwrap();
        assert_eq!((young.committed, young.rolled_back), (0, 0));
        let done = recover(&homes, &[0, 1], Duration::ZERO, now).unwrap();
        assert_eq!((done.committed, done.rolled_back), (1, 1));
        let has = |name: &str| count(&b_url, &format!("SELECT count(*) FROM xattrs WHERE name = '{name}'"));
        assert_eq!((has("decided"), has("undecided")), (1, 0));
        // The undecided one has an abort decision now: a coordinator that was only slow
        // finds it and cannot commit.
        let aborted = decide(&homes, 0, "aa11", now).unwrap();
        assert!(!aborted.commit);
        assert_eq!(count(&b_url, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"), 0);
        // Decision rows go once nothing can need them.
        let later = now + DECISION_KEPT.as_millis() as i64 + 1;
        assert_eq!(recover(&homes, &[0, 1], Duration::ZERO, later).unwrap().decisions_dropped, 2);
        settled(&root, &b_url);
    }
}
