//! Metadata homes through real processes: `locus meta --home`, `locus home create`, a
//! mount writing in two homes, a rename between SQLite homes refused with EXDEV (so
//! `mv` copies), gc keeping a home's chunks, and the homes known again after a restart;
//! homes held at two sites, each with its own PostgreSQL, each site committing its
//! home's writes locally and forwarding the other's; renames and links between them by
//! two-phase commit, across crashes and cuts.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use testkit::postgres::PgServer;
use testkit::{Cluster, LinkProfile, WanLink, netns, wait_until};

fn text(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_subtree_in_a_home_of_its_own_behaves_as_one_namespace() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let dbs = tempfile::tempdir().unwrap();
    let home = format!("b=sqlite://{}", dbs.path().join("home-b.db").display());
    let mut c = Cluster::start_with(bin(), 1, &["--home", &home]);
    let mnt = c.mount();
    fs::create_dir(mnt.join("top")).unwrap();
    let made = text(&c.locus(&["home", "create", "/proj", "b", "--mode", "775", "--meta", &c.meta.addr]));
    assert!(made.contains("/proj: the root of home b"), "{made}");
    // Refused: a name that exists, an unknown home, a parent that is not there.
    for (path, home) in [("/proj", "b"), ("/other", "nowhere"), ("/missing/x", "b")] {
        let out = c.locus(&["home", "create", path, home, "--meta", &c.meta.addr]);
        assert!(!out.status.success(), "{path} in {home} was accepted");
    }
    // Files in both homes, through one mount.
    let data: Vec<u8> = (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect();
    fs::create_dir_all(mnt.join("proj/run/1")).unwrap();
    fs::write(mnt.join("proj/run/1/out"), &data).unwrap();
    fs::write(mnt.join("top/in"), b"input").unwrap();
    assert_eq!(fs::read(mnt.join("proj/run/1/out")).unwrap(), data);
    let mut names: Vec<_> = fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["proj", "top"]);
    // A rename inside a home works; between homes it is EXDEV, and mv copies instead.
    fs::rename(mnt.join("proj/run/1/out"), mnt.join("proj/out")).unwrap();
    let err = fs::rename(mnt.join("top/in"), mnt.join("proj/in")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    let err = fs::hard_link(mnt.join("top/in"), mnt.join("proj/in")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    let mv = std::process::Command::new("mv").arg(mnt.join("top/in")).arg(mnt.join("proj/in")).status().unwrap();
    assert!(mv.success());
    assert_eq!(fs::read(mnt.join("proj/in")).unwrap(), b"input");
    assert!(!mnt.join("top/in").exists());
    // gc deletes nothing a home references.
    text(&c.locus(&["gc", "--meta", &c.meta.addr]));
    text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
    let list = text(&c.locus(&["home", "list", "--meta", &c.meta.addr]));
    assert!(list.contains("root") && list.contains("/proj"), "{list}");
    // Meta restarted: the home is its database's again; everything reads back.
    c.restart_meta();
    let mnt = c.mount();
    assert_eq!(fs::read(mnt.join("proj/out")).unwrap(), data);
    assert_eq!(fs::read(mnt.join("proj/in")).unwrap(), b"input");
    fs::write(mnt.join("proj/after"), b"later").unwrap();
    assert_eq!(fs::read(mnt.join("proj/after")).unwrap(), b"later");
}

/// Two sites, A and B, joined by the emulator (20 ms RTT), each with a PostgreSQL
/// primary of its own and a hot standby of the other's: the root's database at A's,
/// home b's at B's. Fields drop in order: the servers before the link.
struct TwoSites {
    pg_a: PgServer,
    pg_b: PgServer,
    root_standby: PgServer,
    _home_standby: PgServer,
    root_url: String,
    home_url: String,
    /// B's standby of the root's database, A's of home b's.
    root_at_b: String,
    home_at_a: String,
    wan: LinkProfile,
    link: WanLink,
}

fn two_sites(prefix: &str) -> TwoSites {
    let (a, b) = (0, 1);
    let wan = LinkProfile { delay: Duration::from_millis(10), ..LinkProfile::default() };
    let link = WanLink::start(prefix, 2, &wan)
        .expect("start the WAN emulator (build it first: `cargo build -p testkit --bin locus-wan`)");
    let pg_a = PgServer::start_in(link.site_ns(a), WanLink::addr_of(a));
    let root_url = pg_a.create_database();
    let pg_b = PgServer::start_in(link.site_ns(b), WanLink::addr_of(1));
    let home_url = pg_b.create_database();
    let name = |url: &str| url.rsplit('/').next().unwrap().to_string();
    let root_standby = pg_a.start_standby_in(link.site_ns(b), WanLink::addr_of(1));
    let home_standby = pg_b.start_standby_in(link.site_ns(a), WanLink::addr_of(a));
    let (root_at_b, home_at_a) = (root_standby.url(&name(&root_url)), home_standby.url(&name(&home_url)));
    TwoSites {
        pg_a,
        pg_b,
        root_standby,
        _home_standby: home_standby,
        root_url,
        home_url,
        root_at_b,
        home_at_a,
        wan,
        link,
    }
}

/// A cluster over `TwoSites`: meta A holds home 0 and reads home b at its standby,
/// forwarding b's writes to meta B, which holds home b and does the reverse; both
/// know both sites' servers and metas (`--site-*`), so the home can move. Node a0, b0;
/// `/hb` is home b's junction; a mount at each site.
struct Homed {
    c: Cluster,
    meta_a: String,
    meta_b: String,
    at_a: PathBuf,
    at_b: PathBuf,
    /// Meta B's own flags, to start it again.
    b_args: Vec<String>,
}

/// The flags meta B does not take from meta A's arguments.
const B_OWN_FLAGS: [&str; 11] = [
    "--home",
    "--read-db",
    "--forward-writes-to",
    "--site-db",
    "--site-read-db",
    "--site-meta",
    "--site",
    "--auto-move-after",
    "--auto-move-min-writes",
    "--auto-move-share",
    "--auto-move-hold",
];

fn start_homed(sites: &TwoSites, both: &[&str]) -> Homed {
    let TwoSites { link, root_url, home_url, root_at_b, home_at_a, .. } = sites;
    let meta_b = format!("{}:7079", WanLink::addr_of(1));
    let flag = |site: &str, value: &str| format!("{site}={value}");
    let (home, read, forward) = (flag("b", home_url), flag("b", home_at_a), flag("b", &meta_b));
    let (site_a_db, site_b_db) = (flag("a", root_url), flag("b", home_url));
    let own = [&["--home", &home, "--site-db", &site_a_db, "--site-db", &site_b_db][..], both].concat();
    let a_args = [
        "--read-db",
        &read,
        "--forward-writes-to",
        &forward,
        "--site-read-db",
        &read,
        "--site-meta",
        &forward,
        "--site",
        "a",
        "--db-timeout",
        "10s",
        "--primary-lease-ms",
        "2000",
    ];
    let mut c = Cluster::start_in_sites_on_db(bin(), link, &["a", "b"], Some(root_url), &[&own[..], &a_args].concat());
    let meta_a = c.meta.addr.clone();
    let (b_reads_a, b_meta_a) = (flag("a", root_at_b), flag("a", &meta_a));
    let b_args = [
        "--listen",
        ":7079",
        "--read-db",
        root_at_b,
        "--forward-writes-to",
        &meta_a,
        "--site-read-db",
        &b_reads_a,
        "--site-meta",
        &b_meta_a,
        "--site",
        "b",
    ];
    let b_args: Vec<&str> = [&own[..], &b_args].concat();
    assert_eq!(c.add_meta_at("b", root_url, &B_OWN_FLAGS, &b_args), meta_b);
    c.add_node("a0", "a");
    c.add_node("b0", "b");
    c.wait_for_nodes(2);
    c.set_root_copies(1);
    text(&c.locus(&["home", "create", "/hb", "b", "--mode", "777", "--meta", &meta_b]));
    let at_b = c.mount_through(&meta_b, "b", &[]);
    let at_a = c.mount_through(&meta_a, "a", &[]);
    let b_args = b_args.iter().map(|a| a.to_string()).collect();
    Homed { c, meta_a, meta_b, at_a, at_b, b_args }
}

/// How many writes to `home` the meta at `meta` has forwarded (`locus status`).
fn forwarded(c: &Cluster, meta: &str, home: &str) -> u64 {
    let status = text(&c.locus(&["status", "--meta", meta]));
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("writes to home {home} forwarded to the meta holding it at ")))
        .and_then(|rest| rest.split(": ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the meta at {meta} does not forward home {home}: {status}"))
}

/// Homes at two sites (issue 35, part 2): sites A and B joined by the emulator (20 ms
/// RTT), each with a PostgreSQL primary of its own and a hot standby of the other's.
/// Home 0 (the root's) commits at A's, home b at B's. A's meta holds home 0 and reads
/// home b at its standby, forwarding b's writes to B's meta; B's meta the other way
/// round. Writes at B under /hb (home b) commit at B without crossing the WAN: none of
/// them is forwarded, and each reads back at once. A write at A under /hb is forwarded
/// to B's meta and reads back at once through A's standby (read-your-writes); a write
/// at B in home 0 likewise through A's meta. A fresh mount at A sees B's files once its
/// standby has them; a rename between the homes works. With the WAN cut, B goes on
/// writing its home (its meta's lease is on B's own primary), and A sees those writes
/// once the cut heals; fsck is clean. With B's meta stopped (SIGSTOP), A's write into
/// home b fails (ETIMEDOUT) within the forward's bound while A's writes to home 0 go on. Then B
/// is lost: A's standby of home b is promoted and A's meta, restarted on it, holds
/// home b with every write B made.
#[test]
fn each_site_commits_the_home_it_holds() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let sites = two_sites("lwt-homes-");
    let Homed { mut c, meta_a, meta_b, at_a, at_b, .. } = start_homed(&sites, &[]);
    let (link, wan) = (&sites.link, &sites.wan);

    // B writes its own home: committed at B's primary, nothing forwarded.
    let before = forwarded(&c, &meta_b, "root");
    fs::create_dir(at_b.join("hb/run")).unwrap();
    for i in 0..20 {
        let path = at_b.join(format!("hb/run/f{i}"));
        fs::write(&path, format!("from b {i}")).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("from b {i}"), "f{i} read back at B");
    }
    fs::rename(at_b.join("hb/run/f0"), at_b.join("hb/run/renamed")).unwrap();
    fs::remove_file(at_b.join("hb/run/f1")).unwrap();
    assert!(at_b.join("hb/run/renamed").exists() && !at_b.join("hb/run/f1").exists());
    let crossed = forwarded(&c, &meta_b, "root") - before;
    // Only heartbeats (a few seconds apart) cross: 20 files written one by one would
    // forward 60 writes or more.
    assert!(crossed < 10, "{crossed} of B's writes in its own home were forwarded");

    // A writes into B's home: forwarded to B's meta, read back at once at A.
    let before = forwarded(&c, &meta_a, "b");
    fs::write(at_a.join("hb/from-a"), b"written at a").unwrap();
    assert_eq!(fs::read(at_a.join("hb/from-a")).unwrap(), b"written at a");
    fs::create_dir(at_a.join("hb/dir-a")).unwrap();
    assert!(at_a.join("hb/dir-a").is_dir(), "A's mkdir in home b is seen at once at A");
    assert!(forwarded(&c, &meta_a, "b") - before >= 3, "A's writes to home b went elsewhere");
    // And B in home 0: forwarded to A's meta, read back at once at B.
    fs::create_dir(at_b.join("top-b")).unwrap();
    assert!(at_b.join("top-b").is_dir(), "B's mkdir in home 0 is seen at once at B");

    // A reads B's files once its standby of B's engine has them.
    let fresh_a = c.mount_through(&meta_a, "a", &[]);
    wait_until("B's files at A", Duration::from_secs(20), || fresh_a.join("hb/run/f19").exists());
    assert_eq!(fs::read_to_string(fresh_a.join("hb/run/f7")).unwrap(), "from b 7");
    assert!(!fresh_a.join("hb/run/f1").exists());
    assert_eq!(fs::read(at_b.join("hb/from-a")).unwrap(), b"written at a");

    // A rename between the homes (two-phase commit, `cross_home_renames_...` below).
    fs::rename(at_b.join("hb/run/renamed"), at_b.join("top-b/renamed")).unwrap();
    assert_eq!(fs::read_to_string(at_b.join("top-b/renamed")).unwrap(), "from b 0");

    text(&c.locus(&["fsck", "--meta", &meta_a]));
    // The WAN cut: B goes on writing the home it holds, and A has it all once healed.
    link.set(&LinkProfile { loss_pct: 100.0, ..wan.clone() }).unwrap();
    for i in 0..5 {
        let path = at_b.join(format!("hb/run/cut{i}"));
        fs::write(&path, format!("while cut {i}")).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("while cut {i}"));
    }
    link.set(wan).unwrap();
    wait_until("B's writes during the cut at A", Duration::from_secs(30), || fresh_a.join("hb/run/cut4").exists());
    assert_eq!(fs::read_to_string(fresh_a.join("hb/run/cut2")).unwrap(), "while cut 2");
    text(&c.locus(&["fsck", "--meta", &meta_a]));
    let list = text(&c.locus(&["home", "list", "--meta", &meta_b]));
    assert!(list.contains("/hb"), "{list}");

    // B's meta hangs (SIGSTOP): A's write into home b fails after a bounded wait, and
    // meanwhile A goes on writing its own home; once B's meta runs again, so does b.
    let b_meta = c.other_metas[0].child.id() as i32;
    // SAFETY: kill(2) on a child process this test started.
    assert_eq!(unsafe { libc::kill(b_meta, libc::SIGSTOP) }, 0);
    let stuck_path = at_a.join("hb/while-stopped");
    let stuck = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        (fs::write(&stuck_path, b"x"), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..5 {
        let started = std::time::Instant::now();
        fs::write(at_a.join(format!("top-a-{i}")), b"home 0").unwrap();
        assert!(started.elapsed() < Duration::from_secs(3), "home 0 waited {:?} behind home b", started.elapsed());
    }
    let (result, waited) = stuck.join().unwrap();
    let err = result.expect_err("a write into the home of a stopped meta was acknowledged");
    assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{err}");
    // The forward's bound: the database timeout (10 s here) and a 5 s margin.
    assert!(waited < Duration::from_secs(20), "a write into the home of a stopped meta waited {waited:?}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(b_meta, libc::SIGCONT) }, 0);
    wait_until("home b writable again from A", Duration::from_secs(30), || {
        fs::write(at_a.join("hb/after-stop"), b"y").is_ok()
    });
    assert_eq!(fs::read(at_a.join("hb/after-stop")).unwrap(), b"y");

    // Site B is lost (its meta, node, mount and both its PostgreSQL servers): A's
    // standby of home b, which has everything B wrote (checked above), is promoted and
    // A's meta restarts holding home b there, as failover does for one primary.
    let lost = text(&c.locus(&["home", "list", "--meta", &meta_a]));
    let _ = c.other_metas[0].child.kill();
    let _ = c.other_metas[0].child.wait();
    c.kill_site("b");
    sites.pg_b.crash();
    sites.root_standby.crash();
    let home_at_a = &sites.home_at_a;
    let promoted = text(&c.locus(&["meta", "promote", "--db", home_at_a]));
    assert!(promoted.contains("promoted: epoch"), "{promoted}");
    assert!(promoted.contains("the standby had replayed every commit up to"), "{promoted}");
    for flag in ["--home", "--read-db", "--forward-writes-to"] {
        c.drop_meta_flag(flag);
    }
    c.add_meta_flag("--home", &format!("b={home_at_a}"));
    c.restart_meta();
    // Everything B wrote is there; A writes home b itself, nothing forwarded.
    wait_until("A's meta back", Duration::from_secs(20), || at_a.join("hb/run/cut4").exists());
    for i in 2..20 {
        let len = fs::metadata(at_a.join(format!("hb/run/f{i}"))).unwrap().len();
        assert_eq!(len, format!("from b {i}").len() as u64, "f{i} after the loss of B");
    }
    assert_eq!(fs::read(at_a.join("hb/from-a")).unwrap(), b"written at a");
    fs::write(at_a.join("hb/after-loss"), b"home b at a").unwrap();
    fs::create_dir(at_a.join("hb/after-loss-dir")).unwrap();
    assert_eq!(fs::read(fresh_a.join("hb/after-loss")).unwrap(), b"home b at a");
    let status = text(&c.locus(&["status", "--meta", &meta_a]));
    assert!(!status.contains("writes to home b forwarded"), "{status}");
    let list = text(&c.locus(&["home", "list", "--meta", &meta_a]));
    let b_line = |l: &str| l.lines().find(|l| l.contains(" b ")).unwrap_or_default().to_string();
    assert!(b_line(&list).contains("written by site a, this meta"), "before: {lost}\nafter: {list}");
}

/// Files one writer has had acknowledged (written and fsynced), and its failures.
#[derive(Default)]
struct Written {
    acked: Vec<String>,
    failed: Vec<String>,
}

/// Writes and fsyncs `dir/PREFIX-i` for i = 0, 1, ... until `stop`, each with its own
/// content.
fn keep_writing(dir: PathBuf, prefix: &str, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Written> {
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut out = Written::default();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("{prefix}-{i}");
            match testkit::write_synced(&dir.join(&name), name.as_bytes()) {
                Ok(()) => out.acked.push(name),
                Err(e) => out.failed.push(format!("{name}: {e}")),
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        out
    })
}

/// Moves (issue 35, part 2): home b, held at B, moves to A under writers at both sites
/// and back again, each `locus home move` given to the meta of the site the home
/// leaves (which hands it to the destination's). Writes pause during a move and none
/// fails; every acknowledged file is there afterwards at both sites; after the first
/// move A commits home b itself (nothing forwarded) and B forwards it; a restarted
/// meta places the home as the registry says, not as its flags do; fsck is clean.
/// Moving home 0, to an unknown site or to where the home is already is refused.
#[test]
fn a_home_moves_between_sites_under_writes() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let sites = two_sites("lwt-moves-");
    let Homed { mut c, meta_a, meta_b, at_a, at_b, b_args } = start_homed(&sites, &[]);

    // Refused, changing nothing: the root's home, an unknown site, where it is.
    for (home, to) in [("root", "a"), ("b", "nowhere"), ("b", "b"), ("nohome", "a")] {
        let out = c.locus(&["home", "move", home, "--to", to, "--meta", &meta_a]);
        assert!(!out.status.success(), "moving {home} to {to} was accepted");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writers = [keep_writing(at_a.join("hb"), "a", stop.clone()), keep_writing(at_b.join("hb"), "b", stop.clone())];
    std::thread::sleep(Duration::from_millis(500));
    let moved = text(&c.locus(&["home", "move", "b", "--to", "a", "--meta", &meta_b]));
    assert!(moved.contains("moved from site b to site a"), "{moved}");
    std::thread::sleep(Duration::from_millis(500));
    // A commits home b itself now; B forwards it there.
    let before = forwarded(&c, &meta_b, "b");
    fs::write(at_a.join("hb/at-a-after-move"), b"local now").unwrap();
    fs::write(at_b.join("hb/at-b-after-move"), b"forwarded now").unwrap();
    assert_eq!(fs::read(at_b.join("hb/at-b-after-move")).unwrap(), b"forwarded now");
    assert!(forwarded(&c, &meta_b, "b") > before, "B's write into home b, now at A, was not forwarded");
    let status_a = text(&c.locus(&["status", "--meta", &meta_a]));
    assert!(!status_a.contains("writes to home b forwarded"), "{status_a}");
    let back = text(&c.locus(&["home", "move", "b", "--to", "b", "--meta", &meta_a]));
    assert!(back.contains("moved from site a to site b"), "{back}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written: Vec<Written> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    for w in &written {
        assert!(w.failed.is_empty(), "writes failed across the moves: {:?}", w.failed);
        assert!(w.acked.len() >= 5, "only {} writes", w.acked.len());
    }
    let list = text(&c.locus(&["home", "list", "--meta", &meta_a]));
    assert!(list.contains("moved: site b") && list.contains("moved 2 time(s)"), "{list}");

    // B's meta restarted with its first flags: the registry places home b.
    let _ = c.other_metas[0].child.kill();
    let _ = c.other_metas[0].child.wait();
    c.other_metas.clear();
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    assert_eq!(c.add_meta_at("b", &sites.root_url, &B_OWN_FLAGS, &b_args), meta_b);
    wait_until("B's meta back", Duration::from_secs(30), || fs::write(at_b.join("hb/after-restart"), b"r").is_ok());
    let fresh_a = c.mount_through(&meta_a, "a", &[]);
    wait_until("B's last file at A", Duration::from_secs(30), || fresh_a.join("hb/after-restart").exists());
    for (w, mnt) in written.iter().zip([&at_a, &at_b]) {
        for name in &w.acked {
            for m in [mnt, &fresh_a] {
                let got = fs::read(m.join("hb").join(name)).unwrap_or_else(|e| panic!("{name} lost: {e}"));
                assert_eq!(got, name.as_bytes(), "{name}");
            }
        }
    }
    assert_eq!(fs::read(fresh_a.join("hb/at-a-after-move")).unwrap(), b"local now");
    text(&c.locus(&["fsck", "--meta", &meta_a]));
}

/// Automatic moves (issue 35, part 2): home b, held at B, gets writes from A only; once
/// A has done most of them for a whole window (3 s here), B's meta moves the home to A
/// by itself, under the writes, none of which fails. The move shows in `locus status`
/// with its reason. Then B writes the home alone for longer than the window: the home
/// stays at A (it moved less than the hold ago, and a whole window must pass there
/// first), and A's mover says why. Every acknowledged file is there at both sites.
#[test]
fn a_home_moves_by_itself_to_the_site_writing_it() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let sites = two_sites("lwt-auto-");
    let auto = ["--auto-move-after", "3s", "--auto-move-min-writes", "20", "--auto-move-hold", "1h"];
    let Homed { c, meta_a, meta_b, at_a, at_b, .. } = start_homed(&sites, &auto);
    let held_at = |meta: &str| {
        let list = text(&c.locus(&["home", "list", "--meta", meta]));
        let line = list.lines().find(|l| l.contains(" b ")).unwrap_or_default().to_string();
        (line, list)
    };
    assert!(held_at(&meta_a).0.contains("written by site b, meta"), "{}", held_at(&meta_a).1);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = keep_writing(at_a.join("hb"), "a", stop.clone());
    wait_until("home b moved to A by itself", Duration::from_secs(60), || {
        held_at(&meta_a).0.contains("written by site a, this meta")
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let from_a = writer.join().unwrap();
    assert!(from_a.failed.is_empty(), "writes failed across the move: {:?}", from_a.failed);
    wait_until("the move in B's status", Duration::from_secs(30), || {
        let status = text(&c.locus(&["status", "--meta", &meta_b]));
        status.contains("moved from site b to site a") && status.contains("automatic: site a did")
    });

    // B alone writes the home now, for longer than the window: it stays at A.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = keep_writing(at_b.join("hb"), "b", stop.clone());
    std::thread::sleep(Duration::from_secs(8));
    stop.store(true, Ordering::Relaxed);
    let from_b = writer.join().unwrap();
    assert!(from_b.failed.is_empty(), "{:?}", from_b.failed);
    let (line, list) = held_at(&meta_b);
    assert!(line.contains("written by site a, meta"), "home b flapped back: {list}");
    let status_a = text(&c.locus(&["status", "--meta", &meta_a]));
    assert!(status_a.contains("would go to site b but moved"), "{status_a}");
    for (w, mnt) in [(&from_a, &at_b), (&from_b, &at_a)] {
        assert!(w.acked.len() >= 5, "only {} writes", w.acked.len());
        for name in &w.acked {
            wait_until("a file at the other site", Duration::from_secs(30), || mnt.join("hb").join(name).exists());
            assert_eq!(fs::read(mnt.join("hb").join(name)).unwrap(), name.as_bytes(), "{name}");
        }
    }
}

/// Where each meta places home b, as `locus home list` shows it there: its writer line
/// and any move in progress.
fn placement_of_b(c: &Cluster, meta: &str) -> String {
    let list = text(&c.locus(&["home", "list", "--meta", meta]));
    let mut lines = list.lines().skip_while(|l| !l.contains(" b ")).take_while(|l| !l.contains(" root "));
    let writer = lines.next().unwrap_or_default();
    let site = if writer.contains("written by site a,") { "a" } else { "b" };
    let moving = lines.any(|l| l.trim_start().starts_with("now:"));
    format!("{site}{}", if moving { " (moving)" } else { "" })
}

/// The move drill (issue 35): `LOCUS_DRILL_ROUNDS` rounds (1 by default; 10 from
/// `bench/move-drill.sh`) in which writers at both sites write and fsync files into
/// home b while it moves from B to A and back, the WAN being cut (100 % loss) for 3 s at
/// a different moment of the move back each round. A move may fail across a cut (a
/// clear error); writes may fail while they cannot reach the home (a bounded wait).
/// After each round both metas place the home at the same site, and at the end every
/// acknowledged file reads back at both sites with its content (none lost, none taken
/// by a fenced site and dropped) and fsck is clean. Prints "DRILL" lines for the bench.
#[test]
fn homes_move_back_and_forth_under_writes_and_cuts() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let rounds: u64 = std::env::var("LOCUS_DRILL_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(1);
    let sites = two_sites("lwt-drill-");
    let Homed { c, meta_a, meta_b, at_a, at_b, .. } = start_homed(&sites, &["--db-timeout", "5s"]);
    let (link, wan) = (&sites.link, &sites.wan);
    let settled = |within: Duration| {
        let started = std::time::Instant::now();
        let mut seen = (String::new(), String::new());
        wait_until("both metas place home b alike", within, || {
            seen = (placement_of_b(&c, &meta_a), placement_of_b(&c, &meta_b));
            seen.0 == seen.1 && !seen.0.contains("moving")
        });
        (seen.0, started.elapsed().as_millis())
    };
    let mut all: Vec<(Written, &PathBuf)> = Vec::new();
    for round in 1..=rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let writers = [
            keep_writing(at_a.join("hb"), &format!("a{round}"), stop.clone()),
            keep_writing(at_b.join("hb"), &format!("b{round}"), stop.clone()),
        ];
        std::thread::sleep(Duration::from_millis(300));
        let there = c.locus(&["home", "move", "b", "--to", "a", "--meta", &meta_b]);
        assert!(there.status.success(), "round {round}: the move to A failed: {}", text_or_err(&there));
        std::thread::sleep(Duration::from_millis(300));
        // Back to B, with the WAN cut at a different moment of the move each round.
        let cut_after = Duration::from_millis(137 * round % 1200);
        let mut back = c.locus_command(&["home", "move", "b", "--to", "b", "--meta", &meta_a]);
        let back = std::thread::spawn(move || back.output().expect("run locus"));
        std::thread::sleep(cut_after);
        link.set(&LinkProfile { loss_pct: 100.0, ..wan.clone() }).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        link.set(wan).unwrap();
        let back = back.join().unwrap();
        let (site, settle_ms) = settled(Duration::from_secs(60));
        if site == "a" {
            // The move failed across the cut: the home is still at A; it goes back now.
            let again = c.locus(&["home", "move", "b", "--to", "b", "--meta", &meta_a]);
            assert!(again.status.success(), "round {round}: moving back after the cut failed: {}", text_or_err(&again));
        }
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let [wa, wb] = writers.map(|w| w.join().unwrap());
        // "ok:PAUSE_MS" or the error's last line, one word apart.
        let outcome = if back.status.success() {
            let said = String::from_utf8_lossy(&back.stdout);
            let paused = said.split("writes paused ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("?");
            format!("ok:{paused}")
        } else {
            let said = String::from_utf8_lossy(&back.stderr);
            said.lines().last().unwrap_or("failed").replace(' ', "_")
        };
        println!(
            "DRILL round={round} cut_after_ms={} move_back={outcome} placed_after_cut={site} settled_ms={settle_ms} \
             acked_a={} acked_b={} failed_a={} failed_b={}",
            cut_after.as_millis(),
            wa.acked.len(),
            wb.acked.len(),
            wa.failed.len(),
            wb.failed.len()
        );
        all.push((wa, &at_b));
        all.push((wb, &at_a));
    }
    // Every acknowledged file, at the other site than the one that wrote it, and here.
    let mut lost = Vec::new();
    for (w, other) in &all {
        for name in &w.acked {
            let mine = if *other == &at_a { &at_b } else { &at_a };
            for m in [*other, mine] {
                let path = m.join("hb").join(name);
                let mut got = fs::read(&path);
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while got.is_err() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                    got = fs::read(&path);
                }
                if got.as_deref().ok() != Some(name.as_bytes()) {
                    lost.push(format!("{}: {got:?}", path.display()));
                }
            }
        }
    }
    let acked: usize = all.iter().map(|(w, _)| w.acked.len()).sum();
    let fsck = c.locus(&["fsck", "--meta", &meta_a]);
    println!("DRILL total rounds={rounds} acked={acked} lost={} fsck={}", lost.len(), fsck.status.success());
    assert!(lost.is_empty(), "acknowledged files lost or wrong: {lost:?}");
    assert!(fsck.status.success(), "{}", text_or_err(&fsck));
}

/// Meta B (`c.other_metas[0]`) stopped if it still runs, and started again with its own
/// flags, with the crash points `armed` armed.
fn restart_b(c: &mut Cluster, root_url: &str, b_args: &[String], armed: Option<&str>) {
    for mut old in c.other_metas.drain(..) {
        let _ = old.child.kill();
        let _ = old.child.wait();
    }
    c.arm(armed);
    let args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    c.add_meta_at("b", root_url, &B_OWN_FLAGS, &args);
    c.arm(None);
}

/// A move cut short by a crash at each of its steps (issue 35): home b, moved to A
/// first, under writers at both sites. (1) The destination B dies once A has fenced the
/// home and paused its writes: the move fails, A's watchdog lets its writes go on after
/// 4x the database timeout, the home stays at A, and B restarted forwards to A. (2) B
/// dies right after recording the move: A's watchdog places the home at B by the record
/// and forwards to it; B restarted takes it up. (3) The holder B dies once it has fenced
/// the home for a move to A: the move fails and changes nothing; B restarted holds the
/// home again. (4) After a cut longer than the database timeout, B's lease on home 0
/// is renewed again and B carries out a move. Each time both metas end placing the home
/// alike, and at the end every acknowledged file is there at both sites and fsck is
/// clean.
#[test]
fn a_move_cut_short_by_a_crash_at_any_step_leaves_one_writer() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let sites = two_sites("lwt-mcrash-");
    let Homed { mut c, meta_a, meta_b, at_a, at_b, b_args } = start_homed(&sites, &["--db-timeout", "2s"]);
    let root_url = sites.root_url.clone();
    text(&c.locus(&["home", "move", "b", "--to", "a", "--meta", &meta_b]));
    let stop = Arc::new(AtomicBool::new(false));
    let writers = [keep_writing(at_a.join("hb"), "a", stop.clone()), keep_writing(at_b.join("hb"), "b", stop.clone())];
    let placed_alike = |c: &Cluster, site: &str| {
        wait_until(&format!("both metas place home b at {site}"), Duration::from_secs(60), || {
            [&meta_a, &meta_b].iter().all(|m| placement_of_b(c, m) == site)
        });
    };
    let writes_at = |mnt: &PathBuf, name: &str| {
        wait_until(&format!("a write {name} into home b"), Duration::from_secs(60), || {
            fs::write(mnt.join("hb").join(name), name.as_bytes()).is_ok()
        });
    };

    // (1) The destination dies with the home handed over to it.
    restart_b(&mut c, &root_url, &b_args, Some("move-after-hand-over=return"));
    let out = c.locus(&["home", "move", "b", "--to", "b", "--meta", &meta_a]);
    assert!(!out.status.success(), "a move whose destination died succeeded: {}", text_or_err(&out));
    writes_at(&at_a, "after-crash-1");
    restart_b(&mut c, &root_url, &b_args, None);
    placed_alike(&c, "a");
    writes_at(&at_b, "after-restart-1");

    // (2) The destination dies once the move is recorded.
    restart_b(&mut c, &root_url, &b_args, Some("move-after-record=return"));
    let out = c.locus(&["home", "move", "b", "--to", "b", "--meta", &meta_a]);
    assert!(!out.status.success(), "{}", text_or_err(&out));
    wait_until("A places home b by the record", Duration::from_secs(60), || placement_of_b(&c, &meta_a) == "b");
    restart_b(&mut c, &root_url, &b_args, None);
    placed_alike(&c, "b");
    writes_at(&at_b, "after-restart-2");
    writes_at(&at_a, "after-crash-2");

    // (3) The holder dies with the home fenced for a move away.
    restart_b(&mut c, &root_url, &b_args, Some("hand-over-after-fence=return"));
    let out = c.locus(&["home", "move", "b", "--to", "a", "--meta", &meta_a]);
    assert!(!out.status.success(), "{}", text_or_err(&out));
    restart_b(&mut c, &root_url, &b_args, None);
    placed_alike(&c, "b");
    writes_at(&at_b, "after-restart-3");
    writes_at(&at_a, "after-crash-3");

    // (4) A cut longer than the database timeout, with the home at A: B's lease
    // renewals on A's primary (home 0) are abandoned; once the cut heals they connect
    // again, and B can record a move to itself.
    text(&c.locus(&["home", "move", "b", "--to", "a", "--meta", &meta_b]));
    sites.link.set(&LinkProfile { loss_pct: 100.0, ..sites.wan.clone() }).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    sites.link.set(&sites.wan).unwrap();
    wait_until("a move to B after the cut", Duration::from_secs(60), || {
        c.locus(&["home", "move", "b", "--to", "b", "--meta", &meta_b]).status.success()
    });
    placed_alike(&c, "b");

    stop.store(true, Ordering::Relaxed);
    let written: Vec<Written> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let extra =
        ["after-crash-1", "after-restart-1", "after-restart-2", "after-crash-2", "after-restart-3", "after-crash-3"];
    for mnt in [&at_a, &at_b] {
        let names = written.iter().flat_map(|w| w.acked.iter().map(String::as_str)).chain(extra);
        for name in names {
            let path = mnt.join("hb").join(name);
            wait_until(&format!("{} readable", path.display()), Duration::from_secs(30), || path.exists());
            assert_eq!(fs::read(&path).unwrap(), name.as_bytes(), "{}", path.display());
        }
    }
    assert!(written.iter().all(|w| w.acked.len() >= 5), "too few writes acknowledged");
    text(&c.locus(&["fsck", "--meta", &meta_a]));
}

/// Renames and links between homes held at two sites (issue 35, part 3), by two-phase
/// commit across the homes' PostgreSQL servers. Both ways and both coordinators (the
/// meta holding the source directory's home): a file from home 0 into home b at A and
/// back at B, a hard link, and a directory with its files; each read back at once where
/// it was made and, once the standbys have it, at the other site. Then the coordinator
/// B dies (1) with home 0's part prepared, before deciding: A's recovery rolls the part
/// back after the database timeout, and the file is where it was; (2) right after
/// deciding: A's recovery commits home 0's part, and the file is where it went. (3) A
/// rename whose other home is cut off fails after a bounded wait and changes nothing.
/// Nothing stays prepared at either server; fsck is clean.
#[test]
fn renames_between_homes_are_atomic_across_crashes_and_cuts() {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() || !testkit::postgres::available() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns`, ethtool and PostgreSQL");
        return;
    }
    let sites = two_sites("lwt-xhome-");
    let Homed { mut c, meta_a, meta_b, at_a, at_b, b_args } = start_homed(&sites, &["--db-timeout", "2s"]);
    let root_url = sites.root_url.clone();
    let seen_at = |mnt: &Path, path: &str, there: bool| {
        let p = mnt.join(path);
        wait_until(
            &format!("{} {}", p.display(), if there { "there" } else { "gone" }),
            Duration::from_secs(30),
            || p.exists() == there,
        );
    };

    // A file from home 0 into home b (coordinated by A's meta), and back (by B's).
    fs::create_dir(at_a.join("top")).unwrap();
    fs::write(at_a.join("top/f"), b"one").unwrap();
    fs::rename(at_a.join("top/f"), at_a.join("hb/f")).unwrap();
    assert_eq!(fs::read(at_a.join("hb/f")).unwrap(), b"one");
    assert!(!at_a.join("top/f").exists());
    seen_at(&at_b, "hb/f", true);
    seen_at(&at_b, "top/f", false);
    fs::rename(at_b.join("hb/f"), at_b.join("top/f2")).unwrap();
    assert_eq!(fs::read(at_b.join("top/f2")).unwrap(), b"one");
    assert!(!at_b.join("hb/f").exists());
    // A second name in the other home, and a directory with its files.
    fs::hard_link(at_b.join("top/f2"), at_b.join("hb/link")).unwrap();
    assert_eq!(fs::metadata(at_b.join("hb/link")).unwrap().nlink(), 2);
    fs::create_dir(at_a.join("top/d")).unwrap();
    for i in 0..3 {
        fs::write(at_a.join(format!("top/d/{i}")), format!("in d {i}")).unwrap();
    }
    fs::rename(at_a.join("top/d"), at_a.join("hb/d")).unwrap();
    let mut names: Vec<_> = fs::read_dir(at_a.join("hb/d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["0", "1", "2"]);
    seen_at(&at_b, "hb/d/2", true);
    assert_eq!(fs::read_to_string(at_b.join("hb/d/1")).unwrap(), "in d 1");
    fs::write(at_b.join("hb/d/3"), b"made at b").unwrap();

    // (1) The coordinator dies with the other home's part prepared: rolled back.
    // (Each file is written after B's restart, through A's forwarding to it: the
    // rename then finds the way to B open.)
    restart_b(&mut c, &root_url, &b_args, Some("cross-after-prepare=return"));
    wait_until("a write into home b from A", Duration::from_secs(30), || fs::write(at_a.join("hb/g"), b"g").is_ok());
    let err = fs::rename(at_a.join("hb/g"), at_a.join("top/g")).expect_err("a rename whose coordinator died");
    assert!(err.raw_os_error().is_some(), "{err}");
    restart_b(&mut c, &root_url, &b_args, None);
    let prepared = "SELECT count(*) FROM pg_prepared_xacts";
    let nothing_prepared = || {
        wait_until("nothing left prepared", Duration::from_secs(30), || {
            sites.pg_a.sql("postgres", prepared) == "0" && sites.pg_b.sql("postgres", prepared) == "0"
        })
    };
    nothing_prepared();
    for mnt in [&at_a, &at_b] {
        seen_at(mnt, "hb/g", true);
        seen_at(mnt, "top/g", false);
    }
    // (2) It dies once it has decided: committed.
    restart_b(&mut c, &root_url, &b_args, Some("cross-after-decision=return"));
    wait_until("a write into home b from A", Duration::from_secs(30), || fs::write(at_a.join("hb/h"), b"h").is_ok());
    let err = fs::rename(at_a.join("hb/h"), at_a.join("top/h")).expect_err("a rename whose coordinator died");
    assert!(err.raw_os_error().is_some(), "{err}");
    restart_b(&mut c, &root_url, &b_args, None);
    for mnt in [&at_a, &at_b] {
        seen_at(mnt, "top/h", true);
        seen_at(mnt, "hb/h", false);
    }
    assert_eq!(fs::read(at_b.join("top/h")).unwrap(), b"h");
    // (3) The other home cut off: a bounded wait, an error, nothing changed.
    fs::write(at_a.join("top/x"), b"x").unwrap();
    sites.link.set(&LinkProfile { loss_pct: 100.0, ..sites.wan.clone() }).unwrap();
    let started = std::time::Instant::now();
    let err = fs::rename(at_a.join("top/x"), at_a.join("hb/x")).expect_err("a rename into a home cut off");
    let waited = started.elapsed();
    sites.link.set(&sites.wan).unwrap();
    // Bounded by the database timeout (10 s here) at each of its steps: a read of the
    // other home, its part, the client's patience.
    assert!(waited < Duration::from_secs(60), "a rename into a home cut off waited {waited:?}: {err}");
    std::thread::sleep(Duration::from_secs(3));
    for mnt in [&at_a, &at_b] {
        seen_at(mnt, "top/x", true);
        seen_at(mnt, "hb/x", false);
    }
    fs::rename(at_a.join("top/x"), at_a.join("hb/x")).unwrap();
    seen_at(&at_b, "hb/x", true);

    nothing_prepared();
    // Clean once site B's node is heard of again after the cut (its heartbeats cross).
    for meta in [&meta_a, &meta_b] {
        wait_until("fsck clean", Duration::from_secs(30), || c.locus(&["fsck", "--meta", meta]).status.success());
    }
}

/// A command's output, failed or not.
fn text_or_err(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}
