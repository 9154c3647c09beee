//! The backend against a real PostgreSQL server (`testkit::postgres`): schema
//! versions, conflicts, fencing, standby reads, kept rows and timeouts.

use crate::error::MetaError;
use crate::store::Txn;
use crate::store::values::kind_code;
use proto::types::{Attr, ChunkId, Extent, FileKind, InodeId, ROOT_INODE, Timestamp};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::conn::{CANCEL_TIMEOUT, PgConn, connect};
use super::kept::{KEPT_ROWS_CHANNEL, KEPT_ROWS_LOCK};
use super::lease::promote;
use super::schema::{FIRST_UPGRADABLE, SCHEMA_VERSION};
use super::{READERS, open, parse};
use crate::store::WriterLease;

use crate::conformance::test_config;
use crate::service::{DEFAULT_DB_TIMEOUT, MetaConfig, MetaService};
use proto::error::ErrorCode;
use proto::meta::{Create, Made, MetaReply, MetaRequest, NewNode, ReadDir};
use testkit::postgres::PgServer;

fn raw(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect")
}

#[test]
fn an_empty_or_foreign_database_is_refused_with_a_reason() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("an empty database must be refused");
    assert!(matches!(err, MetaError::NotFormatted { .. }), "{err}");
    assert!(err.to_string().contains("is empty") && err.to_string().contains("--init"), "{err}");
    let foreign = server.create_database();
    raw(&foreign).batch_execute("CREATE TABLE t (x INTEGER)").unwrap();
    let err = open(&foreign, None, true, None, DEFAULT_DB_TIMEOUT).err().expect("a foreign database must be refused");
    assert!(err.to_string().contains("not a Locus metadata database"), "{err}");
    let missing = server.url("no_such_database");
    let err = open(&missing, None, true, None, DEFAULT_DB_TIMEOUT).err().expect("a missing database must be refused");
    assert!(matches!(err, MetaError::Connect { .. }) && err.to_string().contains("no_such_database"), "{err}");
    let err = open("postgres://locus:secret@127.0.0.1:1/x", None, true, None, DEFAULT_DB_TIMEOUT)
        .err()
        .expect("nothing listens on port 1");
    assert!(!err.to_string().contains("secret"), "the password is never shown: {err}");
}

/// Metas started together on a new, empty database: one formats it and the others
/// wait for it and open what it made (before, another found it half made, or formatted
/// it a second time, and refused to start).
#[test]
fn metas_starting_together_on_an_empty_database_format_it_once() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let opening: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                open(&url, None, true, None, DEFAULT_DB_TIMEOUT).map(|b| (b.cluster_id, b.formatted))
            })
        })
        .collect();
    let opened: Vec<(String, bool)> =
        opening.into_iter().map(|t| t.join().unwrap().unwrap_or_else(|e| panic!("a meta refused: {e}"))).collect();
    assert_eq!(opened.iter().filter(|(_, formatted)| *formatted).count(), 1, "{opened:?}");
    assert!(opened.iter().all(|(id, _)| *id == opened[0].0), "one cluster: {opened:?}");
}

#[test]
fn reopen_keeps_the_cluster_id_and_a_newer_schema_is_refused() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let first = open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id;
    assert_eq!(first.len(), 32);
    assert_eq!(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id, first);
    raw(&url).execute("UPDATE meta_version SET version = $1", &[&(SCHEMA_VERSION + 1)]).unwrap();
    let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("a newer schema must be refused");
    assert!(matches!(err, MetaError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1), "{err}");
}

#[test]
fn an_older_schema_is_upgraded_and_one_before_postgresql_is_refused() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let first = open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id;
    raw(&url).execute("UPDATE meta_version SET version = $1", &[&FIRST_UPGRADABLE]).unwrap();
    assert_eq!(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id, first);
    let version: i64 = raw(&url).query_one("SELECT version FROM meta_version", &[]).unwrap().get(0);
    assert_eq!(version, SCHEMA_VERSION);
    raw(&url).execute("UPDATE meta_version SET version = $1", &[&(FIRST_UPGRADABLE - 1)]).unwrap();
    let err = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).err().expect("no upgrade from before PostgreSQL");
    assert!(matches!(err, MetaError::SchemaUnknown { found, .. } if found == FIRST_UPGRADABLE - 1), "{err}");
}

/// A 0644 file `name` in the root.
fn new_file(name: &str) -> Create {
    Create { parent: ROOT_INODE, name: name.into(), node: NewNode::File, mode: 0o644, umask: 0, exclusive: true }
}

fn create(s: &Arc<MetaService>, name: &str) -> Result<MetaReply, ErrorCode> {
    s.handle_blocking(MetaRequest::Create(new_file(name))).map_err(|e| e.code)
}

/// The server closes every connection of meta (as a restart or an administrator
/// would): each pooled connection fails at most one request, then connects again.
#[test]
fn connections_closed_by_the_server_are_opened_again() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let meta = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
    create(&meta, "a").unwrap();
    let killed: i64 = raw(&url)
        .query_one(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
             AND application_name <> 'locus-meta-listener'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(killed, 1 + READERS as i64, "the writer and every reader");
    let lookup =
        || meta.handle_blocking(MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: b"a".to_vec() }));
    let failed = (0..3 * READERS).filter(|_| lookup().is_err()).count();
    assert!(failed <= READERS, "{failed} lookups failed");
    assert!(lookup().is_ok(), "reads work again");
    let write = (0..2).map(|i| create(&meta, &format!("b{i}"))).collect::<Vec<_>>();
    assert!(write[1].is_ok(), "writes work again after at most one failure: {write:?}");
}

/// A primary holding a formatted Locus database and a streaming standby of it: the
/// two servers, the primary's URL and the standby's URL of the same database.
fn formatted_with_standby() -> (PgServer, String, PgServer, String) {
    let primary = PgServer::start();
    let url = primary.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let standby = primary.start_standby();
    let standby_url = standby.url(url.rsplit('/').next().unwrap());
    (primary, url, standby, standby_url)
}

/// A meta at a second site writes to the primary and reads from a hot standby:
/// every read after a write sees it (read-your-writes), and the reads are served
/// by the standby.
#[test]
fn reads_at_a_standby_see_this_metas_writes() {
    let (_primary, url, _standby, read_url) = formatted_with_standby();
    let url_of_primary = url.clone();
    let config = MetaConfig { db_url: url, read_db_url: Some(read_url.clone()), ..test_config(Default::default()) };
    let meta = MetaService::open(&config).unwrap();
    for i in 0..50 {
        let name = format!("f{i}");
        let MetaReply::Made(Made { attr: made, .. }) = create(&meta, &name).unwrap() else { panic!("expected Made") };
        let req = MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into_bytes() });
        assert_eq!(meta.handle_blocking(req).unwrap(), MetaReply::Attr(made), "read-your-writes");
    }
    let mut at_standby = raw(&read_url);
    let readers: i64 = at_standby
        .query_one("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'locus-meta'", &[])
        .unwrap()
        .get(0);
    assert_eq!(readers, READERS as i64, "the read connections are at the standby");
    // With replay paused, a row removed behind meta's back on the primary is
    // still found: the read was served by the standby.
    at_standby.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
    raw(&url_of_primary).batch_execute("DELETE FROM dentries WHERE name = 'f0'::bytea").unwrap();
    let lookup = |name: &str| {
        meta.handle_blocking(MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into() }))
    };
    assert!(lookup("f0").is_ok(), "the paused standby answers");
    // A write the paused standby cannot replay: its writer's next read goes to the primary.
    create(&meta, "late").unwrap();
    assert!(lookup("late").is_ok(), "read-your-writes while the standby lags");
    at_standby.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
}

/// Waits until the standby at `standby_url` has replayed everything committed at
/// the primary at `url` so far.
fn replayed(url: &str, standby_url: &str) {
    let lsn: String = raw(url).query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).unwrap().get(0);
    let mut standby = raw(standby_url);
    soon("the standby's replay", || {
        standby.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn]).unwrap().get(0)
    });
}

/// A meta at a standby keeps what it reads there (a change made in SQL behind every
/// meta's back stays unseen), but never puts back what another meta's notification
/// dropped while the standby had not yet replayed that meta's commit.
#[test]
fn a_meta_at_a_standby_keeps_rows_but_not_what_a_notification_dropped() {
    let (_primary, url, standby, standby_url) = formatted_with_standby();
    let at_a = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
    let config =
        MetaConfig { db_url: url.clone(), read_db_url: Some(standby_url.clone()), ..test_config(Default::default()) };
    let at_b = MetaService::open(&config).unwrap();
    listening(&url, 2);
    create(&at_a, "kept").unwrap();
    create(&at_a, "gone").unwrap();
    replayed(&url, &standby_url);
    lookup(&at_b, "kept").unwrap();
    lookup(&at_b, "gone").unwrap();
    raw(&url).execute("DELETE FROM dentries WHERE name = 'kept'::bytea", &[]).unwrap();
    replayed(&url, &standby_url);
    assert!(lookup(&at_b, "kept").is_ok(), "B answers the row it read at the standby from memory");

    let mut at_standby = raw(&standby_url);
    at_standby.batch_execute("SELECT pg_wal_replay_pause()").unwrap();
    let unlink = MetaRequest::Unlink(proto::meta::Unlink { parent: ROOT_INODE, name: b"gone".to_vec() });
    at_a.handle_blocking(unlink).unwrap();
    // The notification reaches B at once; the paused standby still has the entry,
    // which B may answer (replication lag) but must not keep.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        assert!(lookup(&at_b, "gone").is_ok(), "the paused standby still has it");
    }
    at_standby.batch_execute("SELECT pg_wal_replay_resume()").unwrap();
    replayed(&url, &standby_url);
    assert_eq!(lookup(&at_b, "gone"), Err(ErrorCode::NotFound), "B kept a row the notification had dropped");
    drop(standby);
}

/// A meta at a standby's site racing a meta at the primary to create the same names:
/// exactly one create of each wins, and B's conflicts (which fail its COMMIT, sent
/// through tokio-postgres to learn its WAL position) never break a connection.
#[test]
fn a_meta_at_a_standby_loses_races_without_losing_its_connections() {
    let (_primary, url, _standby, standby_url) = formatted_with_standby();
    let at_a = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
    let config = MetaConfig { db_url: url.clone(), read_db_url: Some(standby_url), ..test_config(Default::default()) };
    let at_b = MetaService::open(&config).unwrap();
    let started: String = raw(&url).query_one("SELECT now()::text", &[]).unwrap().get(0);
    race_to_create(&[&at_a, &at_b], 40);
    let reconnected: i64 = raw(&url)
        .query_one(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = 'locus-meta' \
             AND backend_start > $1::text::timestamptz",
            &[&started],
        )
        .unwrap()
        .get(0);
    assert_eq!(reconnected, 0, "a meta connected again during the race");
}

/// A proxy on 127.0.0.1 to `upstream` (`testkit::relay`), which passes the server's
/// messages on whole but holds back what follows an ErrorResponse for `pause`, as a
/// WAN may deliver the ReadyForQuery after an error in a later read; its port.
fn proxy_pausing_after_errors(upstream: (String, u16), pause: Duration) -> u16 {
    use std::io::Write;
    use testkit::relay::{Direction, forward, relay};
    let addr = relay(format!("{}:{}", upstream.0, upstream.1), move |direction| {
        if direction == Direction::Up {
            return forward();
        }
        let mut held = Vec::new();
        Box::new(move |bytes, out| {
            held.extend_from_slice(bytes);
            // Every whole message (a type byte, then a length that counts itself).
            while held.len() >= 5 {
                let len = 1 + u32::from_be_bytes(held[1..5].try_into().unwrap()) as usize;
                if held.len() < len {
                    break;
                }
                let message: Vec<u8> = held.drain(..len).collect();
                out.write_all(&message)?;
                if message[0] == b'E' {
                    std::thread::sleep(pause);
                }
            }
            Ok(())
        })
    });
    addr.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the relay's port")
}

/// After a request (or a prepare) sent through tokio-postgres fails, the server's ReadyForQuery
/// may arrive in a later read than its error: the next pipeline must not be sent
/// by hand, whose reader would take that ReadyForQuery for its own answer, fail
/// ("fewer answers than statements") and drop the connection (and with it a
/// meta's kept rows), as a meta at a standby's site did behind a 50 ms WAN.
#[test]
fn the_pipeline_after_a_failed_request_skips_its_late_ready_for_query() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let (config, _) = parse(&url).unwrap();
    let upstream = match (&config.get_hosts()[0], config.get_ports()[0]) {
        (tokio_postgres::config::Host::Tcp(host), port) => (host.clone(), port),
        other => panic!("the test server listens on TCP: {other:?}"),
    };
    let port = proxy_pausing_after_errors(upstream.clone(), Duration::from_millis(300));
    let proxied = url.replace(&format!(":{}/", upstream.1), &format!(":{port}/"));
    let (config, shown) = parse(&proxied).unwrap();
    let mut conn = connect(&config, &shown, Some(Duration::from_secs(10))).unwrap();
    // BEGIN and COMMIT are boundaries, which go by hand when they can.
    let begin_and_commit = |conn: &mut PgConn, after: &str| {
        conn.boundary(&["BEGIN"]).unwrap_or_else(|e| panic!("the first pipeline after {after}: {e:?}"));
        conn.boundary(&["COMMIT"]).unwrap_or_else(|e| panic!("a pipeline by hand after {after}: {e:?}"));
    };
    let err = conn.query("SELECT 1 / $1::INTEGER", &[&0i32]).expect_err("a division by zero");
    assert!(err.to_string().contains("division by zero"), "{err}");
    begin_and_commit(&mut conn, "a failed statement");
    let err = conn.query("SELECT no_such_column", &[]).expect_err("an unknown column");
    assert!(err.to_string().contains("no_such_column"), "{err}");
    begin_and_commit(&mut conn, "a failed prepare");
    let row = conn.one("SELECT 40 + $1::INTEGER", &[&2i32]).expect("a query after them");
    assert_eq!(row.get::<_, i32>(0), 42);
}

/// One thread per meta of `metas` creates `f0`..`f{names}` in the root, all at
/// once: each name is created exactly once, every other try answers EEXIST.
fn race_to_create(metas: &[&Arc<MetaService>], names: usize) {
    let barrier = std::sync::Barrier::new(metas.len());
    let outcomes: Vec<Vec<Result<MetaReply, ErrorCode>>> = std::thread::scope(|scope| {
        let runs: Vec<_> = metas
            .iter()
            .map(|meta| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    (0..names).map(|n| create(meta, &format!("f{n}"))).collect::<Vec<_>>()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for n in 0..names {
        let won = outcomes.iter().filter(|o| o[n].is_ok()).count();
        let exists = outcomes.iter().filter(|o| o[n] == Err(ErrorCode::Exists)).count();
        let all = outcomes.iter().map(|o| &o[n]).collect::<Vec<_>>();
        assert_eq!((won, exists), (1, metas.len() - 1), "name f{n}: {all:?}");
    }
}

/// Two metas over one database, each creating the same names at the same time:
/// SERIALIZABLE plus whole-transaction retry lets exactly one create of each name
/// win; the other sees the winner's entry and answers EEXIST.
#[test]
fn two_metas_racing_to_create_one_name_exactly_one_wins() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let config = MetaConfig { db_url: url, ..test_config(Default::default()) };
    let metas = [MetaService::open(&config).unwrap(), MetaService::open(&config).unwrap()];
    const NAMES: usize = 60;
    race_to_create(&[&metas[0], &metas[1], &metas[0], &metas[1]], NAMES);
    let MetaReply::Entries(entries) =
        metas[1].handle_blocking(MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 1000 })).unwrap()
    else {
        panic!("expected entries")
    };
    assert_eq!(entries.len(), NAMES, "no entry lost or duplicated");
}

/// Waits until every meta over `url` listens for the others' changes (each keeps
/// rows only from then on).
fn listening(url: &str, metas: i64) {
    for _ in 0..500 {
        let n: i64 = raw(url)
            .query_one(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()
                 AND application_name = 'locus-meta-listener'
                 AND (query LIKE 'LISTEN%' OR query LIKE '%pg_locks%' OR query LIKE '%wal_insert_lsn%')",
                &[],
            )
            .unwrap()
            .get(0);
        if n == metas {
            // The listener marks itself listening right after its LISTEN returns.
            std::thread::sleep(Duration::from_millis(50));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the metas never listened for each other's changes");
}

/// `N` metas over a new database of the shared server, each keeping rows, and the
/// database's URL (the server lives as long as the first).
fn keeping_metas<const N: usize>() -> (Arc<PgServer>, [Arc<MetaService>; N], String) {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    let config = MetaConfig { db_url: url.clone(), ..test_config(Default::default()) };
    let metas = std::array::from_fn(|_| MetaService::open(&config).unwrap());
    listening(&url, N as i64);
    (server, metas, url)
}

fn getattr(s: &Arc<MetaService>, ino: InodeId) -> Result<Attr, ErrorCode> {
    let reply = s.handle_blocking(MetaRequest::GetAttr(proto::meta::GetAttr { ino })).map_err(|e| e.code)?;
    Ok(Attr::try_from(reply).expect("an Attr"))
}

fn lookup(s: &Arc<MetaService>, name: &str) -> Result<Attr, ErrorCode> {
    let req = MetaRequest::Lookup(proto::meta::Lookup { parent: ROOT_INODE, name: name.into() });
    Ok(Attr::try_from(s.handle_blocking(req).map_err(|e| e.code)?).expect("an Attr"))
}

/// Polls `f` until it holds, for at most 5 s.
fn soon(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "{what} did not happen within 5 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A meta answers reads of rows it read or wrote from memory (a change made behind
/// every meta's back, in SQL, stays unseen), reads its own writes at once, and drops
/// what another meta changes as soon as that meta's notification arrives; when its
/// listener's connection is cut it drops everything it kept.
#[test]
fn kept_rows_follow_every_metas_writes() {
    let (_server, [one, two], url) = keeping_metas();
    let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
    raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
    assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o644, "the creating meta kept f's row");
    assert_eq!(getattr(&two, f.ino).unwrap().mode & 0o777, 0o600, "the other read it from the server");
    assert_eq!(lookup(&two, "f").unwrap().mode & 0o777, 0o600);

    // A chmod through the first: it reads it at once, the second once notified.
    let set = proto::meta::AttrChanges { mode: Some(0o640), ..Default::default() };
    one.handle_blocking(MetaRequest::SetAttr(proto::meta::SetAttr { ino: f.ino, set, session: None })).unwrap();
    assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o640);
    soon("the chmod reaching the other meta", || getattr(&two, f.ino).unwrap().mode & 0o777 == 0o640);
    assert_eq!(lookup(&two, "f").unwrap().mode & 0o777, 0o640);

    // An unlink through the second: the first stops finding the name.
    assert_eq!(lookup(&one, "f").unwrap().ino, f.ino);
    two.handle_blocking(MetaRequest::Unlink(proto::meta::Unlink { parent: ROOT_INODE, name: b"f".to_vec() })).unwrap();
    assert_eq!(lookup(&two, "f"), Err(ErrorCode::NotFound), "the unlinking meta at once");
    soon("the unlink reaching the other meta", || lookup(&one, "f") == Err(ErrorCode::NotFound));

    // Cut the listeners: every kept row goes, so a change behind their backs shows.
    let Ok(MetaReply::Made(Made { attr: g, .. })) = create(&one, "g") else { panic!("create g") };
    assert_eq!(getattr(&one, g.ino).unwrap().mode & 0o777, 0o644);
    raw(&url)
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()
             AND application_name = 'locus-meta-listener'",
            &[],
        )
        .unwrap();
    raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(g.ino as i64)]).unwrap();
    soon("the first meta dropping its rows", || getattr(&one, g.ino).unwrap().mode & 0o777 == 0o600);
    listening(&url, 2);
    assert_eq!(getattr(&one, g.ino).unwrap().mode & 0o777, 0o600);
}

/// Which inodes have no extended attributes is kept with their rows (the kernel asks
/// for `security.capability` before each write): a meta that created a file, or
/// found it bare, answers from memory (an xattr added in SQL behind its back stays
/// unseen), sees its own setxattr at once and another meta's once notified.
#[test]
fn knowledge_of_no_xattrs_follows_every_metas_writes() {
    let (_server, [one, two], url) = keeping_metas();
    let get = |s: &Arc<MetaService>, ino: InodeId| {
        let req = MetaRequest::GetXattr(proto::meta::GetXattr { ino, name: b"user.a".to_vec() });
        s.handle_blocking(req).map(|r| Vec::<u8>::try_from(r).expect("bytes")).map_err(|e| e.code)
    };
    let list = |s: &Arc<MetaService>, ino: InodeId| {
        let req = MetaRequest::ListXattr(proto::meta::ListXattr { ino });
        Vec::<Vec<u8>>::try_from(s.handle_blocking(req).unwrap()).expect("names")
    };
    let set = |s: &Arc<MetaService>, ino: InodeId, value: &[u8]| {
        let (name, value, mode) = (b"user.a".to_vec(), value.to_vec(), proto::meta::XattrMode::Any);
        s.handle_blocking(MetaRequest::SetXattr(proto::meta::SetXattr { ino, name, value, mode })).unwrap();
    };
    let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
    let Ok(MetaReply::Made(Made { attr: g, .. })) = create(&one, "g") else { panic!("create g") };
    raw(&url)
        .execute("INSERT INTO xattrs (ino, name, value) VALUES ($1, 'user.a', 'sql')", &[&(f.ino as i64)])
        .unwrap();
    assert_eq!(get(&one, f.ino), Err(ErrorCode::NoAttribute), "the creating meta knows f has none");
    assert!(list(&one, f.ino).is_empty());
    assert_eq!(get(&two, f.ino).unwrap(), b"sql", "the other asks the server");

    // A setxattr through the first: it reads it at once, the second once notified.
    assert_eq!(get(&two, g.ino), Err(ErrorCode::NoAttribute));
    assert!(list(&two, g.ino).is_empty(), "the second found g bare");
    set(&one, g.ino, b"one");
    assert_eq!(get(&one, g.ino).unwrap(), b"one");
    soon("the setxattr reaching the other meta", || get(&two, g.ino) == Ok(b"one".to_vec()));
    assert_eq!(list(&two, g.ino), vec![b"user.a".to_vec()]);

    // And through the second, on the file the first believes bare.
    set(&two, f.ino, b"two");
    soon("the setxattr reaching the first meta", || get(&one, f.ino) == Ok(b"two".to_vec()));
}

/// An unlink takes the directory, the entry and the file from the rows its meta
/// keeps, and its guard catches every way the server's rows may differ (each
/// changed here in SQL behind the meta's back): the unlink then runs again reading
/// from the server, and does what those rows ask for.
#[test]
fn a_write_from_kept_rows_is_checked_at_the_server() {
    let (_server, [one], url) = keeping_metas();
    let mut sql = raw(&url);
    let made = |name: &str| {
        let Ok(MetaReply::Made(Made { attr, .. })) = create(&one, name) else { panic!("create {name}") };
        attr.ino as i64
    };
    let unlink = |name: &str| {
        let req = proto::meta::Unlink { parent: ROOT_INODE, name: name.as_bytes().to_vec() };
        one.handle_blocking(MetaRequest::Unlink(req)).map(drop).map_err(|e| e.code)
    };
    let count =
        |sql: &mut postgres::Client, query: &str, ino: i64| -> i64 { sql.query_one(query, &[&ino]).unwrap().get(0) };
    let (plain, open, xattr, policy, linked, became_dir) =
        (made("plain"), made("open"), made("xattr"), made("policy"), made("linked"), made("became-dir"));
    sql.execute("INSERT INTO opens (session, ino, count, writable) VALUES (7, $1, 1, 0)", &[&open]).unwrap();
    sql.execute("INSERT INTO xattrs (ino, name, value) VALUES ($1, 'user.a', 'v')", &[&xattr]).unwrap();
    sql.execute("INSERT INTO policies (ino, sites, copies, mode, rpo_secs) VALUES ($1, 'a', 1, 'sync', 0)", &[&policy])
        .unwrap();
    sql.execute("UPDATE inodes SET nlink = 2 WHERE ino = $1", &[&linked]).unwrap();
    sql.execute("UPDATE inodes SET kind = $2, mode = 16877 WHERE ino = $1", &[&became_dir, &kind_code(FileKind::Dir)])
        .unwrap();
    assert_eq!(getattr(&one, became_dir as u64).unwrap().kind, FileKind::File, "the kept row answers");

    for name in ["plain", "open", "xattr", "policy", "linked"] {
        unlink(name).unwrap_or_else(|e| panic!("unlink {name}: {e:?}"));
        assert_eq!(lookup(&one, name), Err(ErrorCode::NotFound));
    }
    let entries = sql.query_one("SELECT COUNT(*) FROM dentries WHERE parent = $1", &[&(ROOT_INODE as i64)]);
    assert_eq!(entries.unwrap().get::<_, i64>(0), 1, "only became-dir is left");
    let inode = "SELECT COUNT(*) FROM inodes WHERE ino = $1";
    assert_eq!(count(&mut sql, inode, plain), 0, "an unlinked file with no other link is gone");
    assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM inodes WHERE ino = $1 AND nlink = 0", open), 1, "kept open");
    assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM xattrs WHERE ino = $1", xattr), 0, "its xattrs went too");
    assert_eq!(count(&mut sql, inode, xattr), 0);
    assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM policies WHERE ino = $1", policy), 0, "its policy went too");
    assert_eq!(count(&mut sql, "SELECT COUNT(*) FROM inodes WHERE ino = $1 AND nlink = 1", linked), 1);

    // The server's row is a directory: the unlink is refused, and the rows its
    // guard found out of date are no longer kept (a later read asks the server).
    assert_eq!(unlink("became-dir"), Err(ErrorCode::IsDir));
    assert_eq!(getattr(&one, became_dir as u64).unwrap().kind, FileKind::Dir, "the stale row was dropped");
}

/// A write of data at a file's end and a release take the inode from the rows
/// their meta keeps and assume the session's one open for writing and no extent
/// in the span; their guards catch every way the server's rows may differ (each
/// changed here in SQL behind the meta's back), and the op then does what those
/// rows ask for.
#[test]
fn data_writes_and_releases_from_kept_rows_are_checked_at_the_server() {
    use proto::meta::{CommitWrite, CreateOpen, Hello, OpenAccess, Release, SessionInfo, StoredChunk, Welcome};
    let (_server, [one], url) = keeping_metas();
    let mut sql = raw(&url);
    let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "/mnt".into() };
    let hello = MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info });
    let Ok(MetaReply::Welcome(Welcome { session, .. })) = one.handle_blocking(hello) else { panic!("hello") };
    let open_new = |name: &str| {
        let create = new_file(name);
        let access = OpenAccess { read: true, write: true };
        let Ok(MetaReply::Opened(o)) =
            one.handle_blocking(MetaRequest::CreateOpen(CreateOpen { create, session, access }))
        else {
            panic!("create {name}")
        };
        o.attr.ino
    };
    let chunk = |tag: u8| ChunkId([tag; 32]);
    let write = |ino: InodeId, file_offset: u64, len: u64, tag: u8| {
        let extents = vec![Extent { file_offset, len, chunk: chunk(tag), chunk_offset: 0 }];
        let chunks = vec![StoredChunk { id: chunk(tag), size: 1 << 20, nodes: vec!["n0".into()], receipt: None }];
        let req = CommitWrite { session, ino, extents, chunks, min_size: file_offset + len, mtime: Timestamp::now() };
        Attr::try_from(one.handle_blocking(MetaRequest::CommitWrite(req)).unwrap()).unwrap()
    };
    let release = |ino: InodeId| one.handle_blocking(MetaRequest::Release(Release { ino, session })).unwrap();
    let extents = |sql: &mut postgres::Client, ino: InodeId| -> Vec<(i64, i64, Vec<u8>)> {
        let rows = sql
            .query("SELECT file_offset, len, chunk FROM extents WHERE ino = $1 ORDER BY file_offset", &[&(ino as i64)]);
        rows.unwrap().iter().map(|r| (r.get(0), r.get(1), r.get::<_, Vec<u8>>(2)[..1].to_vec())).collect()
    };
    let opens = |sql: &mut postgres::Client, ino: InodeId| -> Option<i64> {
        let row = sql
            .query_opt("SELECT count FROM opens WHERE session = $1 AND ino = $2", &[&(session as i64), &(ino as i64)]);
        row.unwrap().map(|r| r.get(0))
    };

    // As the server's rows say: a first write and an append, then the release.
    let plain = open_new("plain");
    write(plain, 0, 10, 1);
    assert_eq!(write(plain, 10, 5, 2).size, 15);
    assert_eq!(extents(&mut sql, plain), vec![(0, 10, vec![1]), (10, 5, vec![2])]);
    release(plain);
    assert_eq!(opens(&mut sql, plain), None, "released");

    // The session has it open twice: the write goes on, and a release counts one down.
    let twice = open_new("twice");
    sql.execute("UPDATE opens SET count = 2 WHERE ino = $1", &[&(twice as i64)]).unwrap();
    write(twice, 0, 10, 3);
    release(twice);
    assert_eq!(opens(&mut sql, twice), Some(1), "one open left");

    // An extent the kept rows know nothing of lies in the span: the write replaces it.
    let hidden = open_new("hidden");
    sql.execute(
        "INSERT INTO extents (ino, file_offset, len, chunk, chunk_offset) VALUES ($1, 5, 10, $2, 0)",
        &[&(hidden as i64), &chunk(9).0.to_vec()],
    )
    .unwrap();
    sql.execute("INSERT INTO chunks (id, size, refcount) VALUES ($1, 1048576, 1)", &[&chunk(9).0.to_vec()]).unwrap();
    write(hidden, 0, 10, 4);
    assert_eq!(extents(&mut sql, hidden), vec![(0, 10, vec![4]), (10, 5, vec![9])], "the hidden extent was clipped");

    // The file grew behind the meta's back: the write keeps the server's size.
    let grown = open_new("grown");
    sql.execute("UPDATE inodes SET size = 100 WHERE ino = $1", &[&(grown as i64)]).unwrap();
    assert_eq!(write(grown, 0, 10, 5).size, 100);

    // Unlinked behind the meta's back and open only here: the release reclaims it.
    let orphan = open_new("orphan");
    sql.execute("UPDATE inodes SET nlink = 0 WHERE ino = $1", &[&(orphan as i64)]).unwrap();
    sql.execute("DELETE FROM dentries WHERE ino = $1", &[&(orphan as i64)]).unwrap();
    release(orphan);
    let left: i64 = sql.query_one("SELECT COUNT(*) FROM inodes WHERE ino = $1", &[&(orphan as i64)]).unwrap().get(0);
    assert_eq!(left, 0, "the orphan was reclaimed");
}

/// A stopped server (SIGSTOP, as a hung machine would be) costs each request a
/// bounded wait and a clear error (ETIMEDOUT), a write and a read alike, and meta
/// carries on once the server does.
#[test]
fn a_stopped_server_fails_each_request_in_bounded_time() {
    let server = PgServer::start();
    let url = server.create_database();
    let db_timeout = Duration::from_secs(1);
    let config = MetaConfig { db_url: url, db_timeout, ..test_config(Default::default()) };
    let one = MetaService::open(&config).unwrap();
    create(&one, "before").unwrap();

    server.pause();
    let timed = |what: &str, f: &dyn Fn() -> Result<(), ErrorCode>| {
        let started = Instant::now();
        let outcome = f();
        let took = started.elapsed();
        // The timeout, then at most CANCEL_TIMEOUT asking the server to cancel.
        assert!(took < db_timeout + CANCEL_TIMEOUT + Duration::from_secs(2), "{what} took {took:?}");
        outcome
    };
    let write = timed("a create", &|| create(&one, "during").map(drop));
    let read = timed("a lookup", &|| lookup(&one, "absent").map(drop));
    server.resume();
    assert_eq!(write, Err(ErrorCode::TimedOut));
    assert_eq!(read, Err(ErrorCode::TimedOut));

    create(&one, "after").unwrap();
    assert_eq!(lookup(&one, "absent"), Err(ErrorCode::NotFound));
    assert!(lookup(&one, "before").is_ok());
}

/// Sessions holding the kept-rows lock (one per meta that keeps rows).
fn keepers(url: &str) -> i64 {
    raw(url)
        .query_one(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock' \
             AND (classid::bigint << 32) + objid::bigint = $1 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&KEPT_ROWS_LOCK],
        )
        .unwrap()
        .get(0)
}

/// Notifications `client` (listening) received within `within`.
fn heard(client: &mut postgres::Client, within: Duration) -> Vec<String> {
    let mut notifications = client.notifications();
    let mut it = notifications.timeout_iter(within);
    let mut out = Vec::new();
    while let Some(n) = postgres::fallible_iterator::FallibleIterator::next(&mut it).unwrap() {
        out.push(n.payload().to_string());
    }
    out
}

/// A meta alone on its database notifies nobody; it starts to once another meta
/// keeps rows, and stops when that one is gone. A meta whose writer cannot take the
/// lock (a commit of another holds its exclusive try) keeps nothing until it can.
#[test]
fn only_metas_that_keep_rows_are_notified() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let mut eavesdropper = raw(&url);
    eavesdropper.batch_execute(&format!("LISTEN {KEPT_ROWS_CHANNEL}")).unwrap();

    // A commit under way holds the exclusive try: the meta opening now keeps nothing.
    let mut committing = raw(&url);
    committing.batch_execute("BEGIN").unwrap();
    let tried: bool = committing.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&KEPT_ROWS_LOCK]).unwrap().get(0);
    assert!(tried);
    let config = MetaConfig { db_url: url.clone(), ..test_config(Default::default()) };
    let one = MetaService::open(&config).unwrap();
    listening(&url, 1);
    assert_eq!(keepers(&url), 0, "taken while a commit held the try");
    let Ok(MetaReply::Made(Made { attr: f, .. })) = create(&one, "f") else { panic!("create f") };
    raw(&url).execute("UPDATE inodes SET mode = 384 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
    assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600, "kept a row without the lock");

    // Once that commit ends, a write a second later takes the lock; rows are kept.
    committing.batch_execute("COMMIT").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    create(&one, "g").unwrap();
    assert_eq!(keepers(&url), 1);
    assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600);
    raw(&url).execute("UPDATE inodes SET mode = 420 WHERE ino = $1", &[&(f.ino as i64)]).unwrap();
    assert_eq!(getattr(&one, f.ino).unwrap().mode & 0o777, 0o600, "the kept row answers");
    // (Creating f notified: the commit under way held the lock, as another meta's would.)
    heard(&mut eavesdropper, Duration::from_millis(100));
    create(&one, "g2").unwrap();
    assert_eq!(heard(&mut eavesdropper, Duration::from_millis(300)), Vec::<String>::new(), "alone, yet notified");

    // A second meta keeps rows: the first's commits now name what they changed.
    let two = MetaService::open(&config).unwrap();
    listening(&url, 2);
    assert_eq!(keepers(&url), 2);
    create(&one, "h").unwrap();
    let payloads = heard(&mut eavesdropper, Duration::from_millis(500));
    let h = format!("e{ROOT_INODE}:{}", hex::encode(b"h"));
    assert!(payloads.iter().any(|p| p.split(' ').any(|w| w == h)), "{payloads:?} names no {h}");

    // Gone again: nobody is notified.
    drop(two);
    soon("the second meta's lock going with it", || keepers(&url) == 1);
    create(&one, "i").unwrap();
    assert_eq!(heard(&mut eavesdropper, Duration::from_millis(300)), Vec::<String>::new());
}

/// A meta over `url` holding a lease of `duration` (not renewed: no workers run).
fn with_lease(url: &str, duration: Duration) -> (Arc<MetaService>, Arc<dyn WriterLease>) {
    let backend = open(url, None, false, Some(lease_terms(duration, None)), DEFAULT_DB_TIMEOUT).unwrap();
    let lease = backend.lease.clone().unwrap();
    let store = Arc::new(crate::engine::Store::new(backend).unwrap());
    (MetaService::with_store(store, &test_config(Default::default())), lease)
}

/// A write under an epoch the database has moved past is refused (EROFS) by the
/// check inside its own transaction, even while the lease is held; nothing of it
/// is committed.
#[test]
fn a_write_under_an_old_epoch_is_refused() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let (meta, lease) = with_lease(&url, Duration::from_secs(60));
    create(&meta, "before").unwrap();
    raw(&url).batch_execute("UPDATE primary_epoch SET epoch = epoch + 1").unwrap();
    assert_eq!(create(&meta, "after"), Err(ErrorCode::ReadOnly));
    assert_eq!(create(&meta, "after"), Err(ErrorCode::ReadOnly), "and stays refused");
    let names: i64 =
        raw(&url).query_one("SELECT COUNT(*) FROM dentries WHERE name = 'after'::bytea", &[]).unwrap().get(0);
    assert_eq!(names, 0, "the refused write left nothing behind");
    assert!(matches!(lease.renew(), Err(MetaError::Fenced(_))), "the lease cannot be renewed either");
}

/// Without renewals (no background worker here) the lease runs out and writes are
/// refused with EROFS; a renewal lets them in again.
#[test]
fn writes_are_refused_once_the_lease_runs_out() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let (meta, lease) = with_lease(&url, Duration::from_millis(400));
    create(&meta, "held").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(create(&meta, "late"), Err(ErrorCode::ReadOnly));
    lease.renew().unwrap();
    create(&meta, "renewed").unwrap();
}

/// Two metas' writers over one database, both updating the root directory: one
/// with short transactions back to back, the other with transactions that span
/// several round trips (sleeps between statements stand in for a 30 ms WAN). The
/// slow one loses every snapshot race, yet each of its writes commits (its third
/// try runs alone), and the fast one keeps going too.
#[test]
fn a_slow_writer_beside_a_busy_one_commits_every_write() {
    let server = testkit::postgres::shared();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let store = || crate::engine::Store::new(open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap()).unwrap();
    let (busy, slow) = (store(), store());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let touch_root = |t: &mut dyn Txn| -> Result<(), MetaError> {
        let mut root = t.get_inode(ROOT_INODE)?.expect("the root exists");
        root.attr.mtime.secs += 1;
        t.put_inode(&root)
    };
    let (busy_writes, slow_results) = std::thread::scope(|s| {
        let busy_run = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                crate::engine::write(&busy, false, touch_root).expect("the busy writer's write");
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let results: Vec<_> = (0..8u64)
            .map(|i| {
                crate::engine::write(&slow, false, move |t| {
                    let root = t.get_inode(ROOT_INODE)?;
                    std::thread::sleep(Duration::from_millis(30));
                    t.put_dentry(ROOT_INODE, format!("slow{i}").as_bytes(), 2_000_000 + i, 2_000_000 + i)?;
                    std::thread::sleep(Duration::from_millis(30));
                    t.put_inode(&root.expect("the root exists"))
                })
            })
            .collect();
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        assert!(took < Duration::from_secs(20), "the slow writer took {took:?}");
        (busy_run.join().unwrap(), results)
    });
    assert!(slow_results.iter().all(Result::is_ok), "{slow_results:?}");
    assert!(busy_writes > 8, "the busy writer made progress too: {busy_writes}");
    let slow_names: i64 =
        raw(&url).query_one("SELECT COUNT(*) FROM dentries WHERE name::text LIKE '%736c6f77%'", &[]).unwrap().get(0);
    assert_eq!(slow_names, 8, "every slow write committed once");
}

/// A durable commit waiting for a synchronous standby that never answers (a cut-off
/// site) is abandoned once the lease runs out: the write and the one queued behind
/// it are answered EROFS within the lease plus a bound, not left waiting; once the
/// standby requirement is lifted and the lease renewed, the writer reconnects.
#[test]
fn a_commit_stuck_on_a_lost_standby_is_answered_erofs_when_the_lease_ends() {
    let server = PgServer::start();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let lease_for = Duration::from_millis(1500);
    let backend = open(&url, None, false, Some(lease_terms(lease_for, None)), DEFAULT_DB_TIMEOUT).unwrap();
    let lease = backend.lease.clone().unwrap();
    let store = crate::engine::Store::new(backend).unwrap();
    put_entry(&store, false, "before").unwrap();
    let standby_names = |to: &str| {
        let mut admin = raw(&server.admin_url());
        admin.batch_execute(&format!("ALTER SYSTEM SET synchronous_standby_names = '{to}'")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    };
    standby_names("lost");
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let (stuck, queued) = std::thread::scope(|s| {
        let stuck = s.spawn(|| put_entry(&store, true, "stuck"));
        std::thread::sleep(Duration::from_millis(100));
        let queued = s.spawn(|| put_entry(&store, false, "queued"));
        (stuck.join().unwrap(), queued.join().unwrap())
    });
    let took = started.elapsed();
    assert_eq!(stuck, Err(ErrorCode::ReadOnly), "the stuck commit is not acknowledged");
    assert_eq!(queued, Err(ErrorCode::ReadOnly), "the write queued behind it is refused");
    assert!(took < lease_for + Duration::from_secs(3), "answered in {took:?}");
    standby_names("");
    std::thread::sleep(Duration::from_millis(200));
    lease.renew().unwrap();
    put_entry(&store, true, "after").unwrap();
}

/// Under asynchronous replication with a metadata RPO, a primary whose standby stops
/// confirming (paused, as a hung site would be) refuses writes once the RPO has
/// passed since the standby last had everything: what it acknowledged after the
/// pause, all that a failover to that standby could lose, spans no more than the RPO.
/// Writes are accepted again once the standby catches up.
#[test]
fn writes_are_refused_once_the_standby_is_further_behind_than_the_metadata_rpo() {
    let server = PgServer::start();
    let standby = server.start_standby();
    let url = server.create_database();
    drop(open(&url, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let rpo = Duration::from_millis(1500);
    let terms = lease_terms(Duration::from_secs(10), Some(rpo));
    let backend = open(&url, None, false, Some(terms), DEFAULT_DB_TIMEOUT).unwrap();
    let lease = backend.lease.clone().unwrap();
    assert_eq!(lease.renew_every(), rpo / 4, "renewed often enough to watch the RPO");
    let store = crate::engine::Store::new(backend).unwrap();
    // Renewals as meta's worker makes them, each also asking how far the standby is.
    let mut renewed = Instant::now();
    let mut written = 0u64;
    let mut write = || {
        if renewed.elapsed() >= lease.renew_every() {
            lease.renew().unwrap();
            renewed = Instant::now();
        }
        written += 1;
        let ino = 3_000_000 + written;
        crate::engine::write(&store, false, move |t| t.put_dentry(ROOT_INODE, format!("e{ino}").as_bytes(), ino, ino))
            .map_err(|e| e.code())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if lease.standby_behind().is_some_and(|behind| behind < rpo / 2) {
            break;
        }
        assert!(Instant::now() < deadline, "the standby never reported: {:?}", lease.standby_behind());
        write().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    standby.pause();
    let paused = Instant::now();
    let mut last_acknowledged = paused;
    let refused = std::iter::repeat(()).find_map(|()| {
        let since = paused.elapsed();
        assert!(since < rpo + Duration::from_secs(5), "writes still accepted {since:?} after the pause");
        std::thread::sleep(Duration::from_millis(50));
        match write() {
            Ok(()) => {
                last_acknowledged = Instant::now();
                None
            }
            Err(code) => Some(code),
        }
    });
    assert_eq!(refused, Some(ErrorCode::ReadOnly));
    let at_risk = last_acknowledged - paused;
    assert!(at_risk <= rpo + Duration::from_millis(300), "acknowledged for {at_risk:?} past the pause");
    assert!(at_risk + lease.renew_every() + Duration::from_millis(500) >= rpo, "refused early, after {at_risk:?}");
    standby.resume();
    let resumed = Instant::now();
    while write().is_err() {
        assert!(resumed.elapsed() < Duration::from_secs(20), "writes still refused after the standby caught up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lease_terms(duration: Duration, rpo: Option<Duration>) -> crate::store::LeaseTerms {
    crate::store::LeaseTerms { holder: "test".into(), duration, rpo }
}

/// Writes an entry of the root in a transaction of its own (`durable`: as an
/// fsync's commit).
fn put_entry(store: &crate::engine::Store, durable: bool, name: &str) -> Result<(), ErrorCode> {
    let name = name.as_bytes().to_vec();
    let ino = 1_000_000 + name.len() as u64 * 1000 + u64::from(name[0]);
    crate::engine::write(store, durable, move |t| t.put_dentry(ROOT_INODE, &name, ino, ino)).map_err(|e| e.code())
}

/// A failover from an asynchronous standby that stopped before the primary's last
/// write: once the old primary's server is back, `lost` names that write (the file
/// made, and the root's entry for it) from the failover point `promote` recorded, and
/// nothing the standby had.
#[test]
fn lost_lists_what_the_old_primary_acknowledged_past_the_failover_point() {
    let (primary, url, standby, standby_url) = formatted_with_standby();
    let old = MetaService::open(&MetaConfig { db_url: url.clone(), ..test_config(Default::default()) }).unwrap();
    create(&old, "kept").unwrap();
    replayed(&url, &standby_url);
    // The standby stops receiving (as behind a cut), and the write after it is on the
    // primary's disk before the crash.
    standby.sql("postgres", "ALTER SYSTEM SET primary_conninfo = ''");
    standby.sql("postgres", "SELECT pg_reload_conf()");
    let deadline = Instant::now() + Duration::from_secs(30);
    while standby.sql("postgres", "SELECT COUNT(*) FROM pg_stat_wal_receiver") != "0" {
        assert!(Instant::now() < deadline, "the standby's WAL receiver did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    create(&old, "lost").unwrap();
    primary.sql("postgres", "CHECKPOINT");
    drop(old);
    primary.crash();
    promote(&standby_url).unwrap();
    primary.restart();
    let found = crate::postgres::lost(&url, &standby_url, None).unwrap();
    let said: Vec<String> = found.changes.iter().map(|c| format!("{} {}", c.path, c.what)).collect();
    let made = crate::postgres::LostChange { path: "/lost".into(), what: crate::postgres::LostKind::OnlyAtOld };
    assert!(found.changes.contains(&made), "{said:?}");
    let entries = crate::postgres::LostKind::Entries { only_at_old: vec!["lost".into()], only_at_new: Vec::new() };
    assert!(found.changes.contains(&crate::postgres::LostChange { path: "/".into(), what: entries }), "{said:?}");
    assert!(found.changes.iter().all(|c| c.path != "/kept"), "{said:?}");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert!((now_ms - 60_000..=now_ms).contains(&found.since_ms), "the failover point {}", found.since_ms);
    // A database no promotion wrote a failover point into.
    let refused = crate::postgres::lost(&url, &url, None).unwrap_err().to_string();
    assert!(refused.contains("no failover point"), "{refused}");
    // A database of another cluster.
    let server = testkit::postgres::shared();
    let other = server.create_database();
    drop(open(&other, None, true, None, DEFAULT_DB_TIMEOUT).unwrap());
    let refused = crate::postgres::lost(&url, &other, None).unwrap_err().to_string();
    assert!(refused.contains("holds cluster"), "{refused}");
}

/// `promote` on a hot standby: promotes it, waits out the primary's lease, bumps
/// the epoch; a meta over the promoted server writes, and every committed entry
/// is there.
#[test]
fn promote_makes_the_standby_a_primary_of_a_new_epoch() {
    let (primary, url, _standby, standby_url) = formatted_with_standby();
    let (old, _lease) = with_lease(&url, Duration::from_millis(1500));
    for i in 0..10 {
        create(&old, &format!("f{i}")).unwrap();
    }
    // Let the standby catch up (no synchronous standby configured in this test).
    replayed(&url, &standby_url);
    drop(primary);
    let done = promote(&standby_url).unwrap();
    assert!(done.was_standby);
    assert_eq!(done.epoch, 2);
    assert!(done.waited_for_leases <= Duration::from_millis(1600), "{done:?}");
    let (new, _lease) = with_lease(&standby_url, Duration::from_secs(10));
    for i in 0..10 {
        assert_eq!(create(&new, &format!("f{i}")), Err(ErrorCode::Exists), "f{i} survived the failover");
    }
    create(&new, "after").unwrap();
    let again = promote(&standby_url).unwrap();
    assert!(!again.was_standby && again.epoch == 3, "{again:?}");
    assert_eq!(create(&new, "fenced"), Err(ErrorCode::ReadOnly), "a meta of epoch 2 is fenced at epoch 3");
}

/// A move's new database is the server's spare when one was made ahead (a rename, not
/// a CREATE DATABASE the standbys must replay), made by one of the metas making it at
/// once, complete and with the home's cluster; without a spare it is made as before.
/// Older schema versions' spares (an upgrade's leftovers) go; a newer version's stays.
#[test]
fn a_move_takes_the_spare_database_made_ahead_and_makes_one_without() {
    use super::moving::{create_database, make_spare};
    let server = PgServer::start();
    let source = server.create_database();
    let cluster = open(&source, None, true, None, DEFAULT_DB_TIMEOUT).unwrap().cluster_id;
    let (older, half_made, newer) = (
        format!("locus_spare_v{}", SCHEMA_VERSION - 1),
        format!("locus_spare_v{}_making", SCHEMA_VERSION - 2),
        format!("locus_spare_v{}", SCHEMA_VERSION + 1),
    );
    for database in [&older, &half_made, &newer] {
        server.sql("postgres", &format!("CREATE DATABASE \"{database}\""));
    }
    let spares = || {
        let ours = format!("locus_spare_v{SCHEMA_VERSION}");
        server.sql("postgres", &format!("SELECT count(*) FROM pg_database WHERE datname = '{ours}'"))
    };
    let makers: Vec<_> = (0..3)
        .map(|_| {
            let url = source.clone();
            std::thread::spawn(move || make_spare(&url, DEFAULT_DB_TIMEOUT).unwrap())
        })
        .collect();
    let made: Vec<bool> = makers.into_iter().map(|m| m.join().unwrap()).collect();
    assert_eq!(made.iter().filter(|m| **m).count(), 1, "one maker makes it, the others find it: {made:?}");
    assert_eq!(spares(), "1");
    let left = format!(
        "SELECT string_agg(datname, ',') FROM pg_database WHERE datname IN ('{older}', '{half_made}', '{newer}')"
    );
    assert_eq!(server.sql("postgres", &left), newer, "older versions' spares dropped, a newer one's kept");
    for (database, spare) in [("hb_m1", true), ("hb_m2", false)] {
        let (url, took) = create_database(&source, database, &source, DEFAULT_DB_TIMEOUT).unwrap();
        assert_eq!(took, spare, "{database}");
        assert_eq!(spares(), "0");
        let opened = open(&url, None, false, None, DEFAULT_DB_TIMEOUT).unwrap();
        assert_eq!(opened.cluster_id, cluster, "{database} belongs to the home's cluster");
        assert!(!opened.formatted, "{database} came with its schema");
    }
}

/// A role that may not make databases cannot receive a home: the move's first step fails
/// with what to grant, and leaves no database behind.
#[test]
fn a_role_without_createdb_is_told_what_to_grant() {
    use super::moving::{create_database, make_spare};
    let server = PgServer::start();
    let source = server.create_database();
    open(&source, None, true, None, DEFAULT_DB_TIMEOUT).unwrap();
    server.sql("postgres", "CREATE ROLE mover LOGIN NOCREATEDB");
    let as_mover = source.replacen("://locus@", "://mover@", 1);
    assert_ne!(as_mover, source);
    for made in [
        make_spare(&as_mover, DEFAULT_DB_TIMEOUT).map(|_| ()),
        create_database(&as_mover, "hb_m", &source, DEFAULT_DB_TIMEOUT).map(|_| ()),
    ] {
        match made {
            Err(MetaError::PermissionDenied(m)) => assert!(m.contains("CREATEDB"), "{m}"),
            other => panic!("expected PermissionDenied naming CREATEDB, got {other:?}"),
        }
    }
    let left = server
        .sql("postgres", "SELECT count(*) FROM pg_database WHERE datname LIKE 'locus_spare%' OR datname = 'hb_m'");
    assert_eq!(left, "0");
}

/// `probe_database` (`locus doctor`) says what a database is and changes nothing: an
/// empty one stays empty.
#[test]
fn a_probe_says_what_a_database_is_without_changing_it() {
    let server = PgServer::start();
    let (formatted, empty) = (server.create_database(), server.create_database());
    open(&formatted, None, true, None, DEFAULT_DB_TIMEOUT).unwrap();
    let said = crate::probe_database(&formatted, Duration::from_secs(5)).unwrap();
    assert!(said.contains("PostgreSQL") && said.contains(&format!("schema version {SCHEMA_VERSION}")), "{said}");
    let said = crate::probe_database(&empty, Duration::from_secs(5)).unwrap();
    assert!(said.contains("not formatted"), "{said}");
    let tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'";
    assert_eq!(server.sql(empty.rsplit('/').next().unwrap(), tables), "0");
    let refused = crate::probe_database("postgres://locus@127.0.0.1:1/x", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(refused, MetaError::Connect { .. }), "{refused}");
}
