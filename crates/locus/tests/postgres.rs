//! Meta over PostgreSQL with real processes: a server the test starts itself
//! (`testkit::postgres`), `locus meta --db postgres://...`, FUSE mounts through it,
//! restarts, and `locus meta migrate` from a SQLite namespace.

use std::fs;
use std::path::Path;
use testkit::postgres::PgServer;
use testkit::{Cluster, LinkProfile, WanLink, netns, wait_until};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// Files of several shapes: empty, small, several chunks.
fn write_tree(m: &Path) -> Vec<(String, Vec<u8>)> {
    fs::create_dir_all(m.join("d/sub")).unwrap();
    let files: Vec<(String, Vec<u8>)> = [0usize, 11, 100_000, (9 << 20) + 5]
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("d/sub/f{i}"), testkit::pattern(len, i as u64)))
        .collect();
    for (name, data) in &files {
        fs::write(m.join(name), data).unwrap();
    }
    fs::rename(m.join("d/sub/f1"), m.join("d/moved")).unwrap();
    std::os::unix::fs::symlink("sub/f2", m.join("d/link")).unwrap();
    files.into_iter().map(|(n, d)| if n == "d/sub/f1" { ("d/moved".into(), d) } else { (n, d) }).collect()
}

fn check_tree(m: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        assert!(fs::read(m.join(name)).unwrap() == *data, "{name} differs");
    }
    assert_eq!(fs::read(m.join("d/link")).unwrap(), files[2].1);
    let mut names: Vec<String> =
        fs::read_dir(m.join("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["link", "moved", "sub"]);
}

fn fsck_clean(c: &Cluster) {
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn meta_on_postgres_serves_mounts_across_a_restart() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let server = PgServer::start();
    let mut c = Cluster::start_on_db(bin(), 2, &server.create_database());
    let a = c.mount();
    let b = c.mount();
    let files = write_tree(&a);
    check_tree(&b, &files);
    c.kill_all();
    c.restart();
    let m = c.mount();
    check_tree(&m, &files);
    fs::remove_file(m.join("d/moved")).unwrap();
    assert!(!m.join("d/moved").exists());
    fsck_clean(&c);
}

#[test]
fn migrate_moves_a_sqlite_namespace_to_postgres() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let server = PgServer::start();
    let mut c = Cluster::start(bin(), 1);
    let m = c.mount();
    let files = write_tree(&m);
    c.kill_all();
    let sqlite = format!("sqlite://{}", c.path().join("meta.db").display());
    let target = server.create_database();
    let out = c.locus(&["meta", "migrate", "--from", &sqlite, "--to", &target]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "migrate: {said}");
    assert!(said.contains("inodes: 8 rows") && said.contains("dentries: 7 rows"), "{said}");
    let again = c.locus(&["meta", "migrate", "--from", &sqlite, "--to", &target]);
    assert!(!again.status.success(), "a second migrate into the same database must be refused");
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"), "{}", String::from_utf8_lossy(&again.stderr));
    c.use_meta_db(&target);
    c.restart();
    let m = c.mount();
    check_tree(&m, &files);
    fs::write(m.join("d/new"), b"written after the move").unwrap();
    assert_eq!(fs::read(m.join("d/new")).unwrap(), b"written after the move");
    fsck_clean(&c);
}

/// Two metas over one PostgreSQL database, two mounts through each, all racing in one
/// directory: every exclusive create of a name has exactly one winner (the others get
/// EEXIST), every rename of a file has exactly one winner (the others ENOENT), no entry
/// is lost or duplicated, and fsck is clean.
#[test]
fn two_metas_over_one_database_serialise_conflicting_operations() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    const NAMES: usize = 100;
    const MOVES: usize = 50;
    let server = PgServer::start();
    let mut c = Cluster::start_on_db(bin(), 1, &server.create_database());
    let second = c.add_meta();
    let first = c.meta.addr.clone();
    let mounts: Vec<_> =
        [&first, &second, &first, &second].iter().map(|meta| c.mount_through(meta, "default", &[])).collect();
    fs::create_dir(mounts[0].join("d")).unwrap();
    for i in 0..MOVES {
        fs::write(mounts[0].join(format!("d/m{i}")), format!("move {i}")).unwrap();
    }
    let barrier = std::sync::Barrier::new(mounts.len());
    let outcomes: Vec<(Vec<bool>, Vec<bool>)> = std::thread::scope(|s| {
        let runs: Vec<_> = mounts
            .iter()
            .enumerate()
            .map(|(t, m)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let created: Vec<bool> = (0..NAMES)
                        .map(|i| {
                            match fs::OpenOptions::new().write(true).create_new(true).open(m.join(format!("d/c{i}"))) {
                                Ok(_) => true,
                                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                                Err(e) => panic!("create c{i} through mount {t}: {e}"),
                            }
                        })
                        .collect();
                    let moved: Vec<bool> = (0..MOVES)
                        .map(|i| match fs::rename(m.join(format!("d/m{i}")), m.join(format!("d/t{t}_{i}"))) {
                            Ok(()) => true,
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                            Err(e) => panic!("rename m{i} through mount {t}: {e}"),
                        })
                        .collect();
                    (created, moved)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for i in 0..NAMES {
        assert_eq!(outcomes.iter().filter(|o| o.0[i]).count(), 1, "c{i} must have exactly one creator");
    }
    let mut expected: Vec<String> = (0..NAMES).map(|i| format!("c{i}")).collect();
    for i in 0..MOVES {
        let winners: Vec<usize> = (0..mounts.len()).filter(|&t| outcomes[t].1[i]).collect();
        assert_eq!(winners.len(), 1, "m{i} must be renamed exactly once: {winners:?}");
        expected.push(format!("t{}_{i}", winners[0]));
    }
    expected.sort();
    // Past the kernel's entry and attribute caches (1 s), every mount lists the same.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    for m in &mounts {
        let mut names: Vec<String> =
            fs::read_dir(m.join("d")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, expected, "listing through {}", m.display());
    }
    for i in 0..MOVES {
        let winner = expected.iter().find(|n| n.ends_with(&format!("_{i}")) && n.starts_with('t')).unwrap();
        assert_eq!(fs::read(mounts[3].join("d").join(winner)).unwrap(), format!("move {i}").as_bytes());
    }
    fsck_clean(&c);
}

/// A PostgreSQL server with a database of its own, and a hot standby of the server.
fn primary_and_standby_database() -> (PgServer, String, PgServer) {
    let primary = PgServer::start();
    let url = primary.create_database();
    let standby = primary.start_standby();
    (primary, url, standby)
}

/// `locus meta --read-db`: meta reads from a hot standby of its primary; a mount
/// writes and reads back at once (read-your-writes), and fsck is clean.
#[test]
fn meta_reading_from_a_hot_standby_serves_a_mount() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let (_primary, url, standby) = primary_and_standby_database();
    let read_url = standby.url(url.rsplit('/').next().unwrap());
    let mut c = Cluster::start_on_db_with(bin(), 1, &url, &["--read-db", &read_url]);
    let m = c.mount();
    let files = write_tree(&m);
    check_tree(&m, &files);
    for i in 0..20 {
        fs::write(m.join(format!("d/n{i}")), format!("{i}")).unwrap();
        assert_eq!(fs::read(m.join(format!("d/n{i}"))).unwrap(), format!("{i}").as_bytes());
    }
    fsck_clean(&c);
}

/// `locus meta --metadata-rpo`: with an asynchronous standby that stops confirming
/// (paused, as a hung site), creates through a mount fail with EROFS once the RPO has
/// passed, so that a failover to it would lose at most that much; `locus status`
/// shows how far behind the standby is; once it resumes, writes are accepted again.
/// A careless operator's `--metadata-rpo` on SQLite is refused with a clear message.
#[test]
fn writes_stop_at_the_metadata_rpo_while_the_standby_is_behind() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let (_primary, url, standby) = primary_and_standby_database();
    let mut c = Cluster::start_on_db_with(bin(), 1, &url, &["--metadata-rpo", "2s"]);
    let m = c.mount();
    fs::write(m.join("before"), b"before").unwrap();
    let status = || String::from_utf8_lossy(&c.locus(&["status", "--meta", &c.meta.addr]).stdout).into_owned();
    wait_until("status shows the standby", std::time::Duration::from_secs(30), || status().contains("s behind"));
    standby.pause();
    let paused = std::time::Instant::now();
    let refused = (0..).find_map(|i| {
        assert!(paused.elapsed() < std::time::Duration::from_secs(15), "creates still accepted after the RPO");
        std::thread::sleep(std::time::Duration::from_millis(100));
        fs::write(m.join(format!("during{i}")), b"x").err()
    });
    let refused = refused.unwrap();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    assert!(paused.elapsed() >= std::time::Duration::from_millis(1500), "refused before the RPO passed");
    standby.resume();
    wait_until("writes accepted once the standby caught up", std::time::Duration::from_secs(30), || {
        fs::write(m.join("after"), b"after").is_ok()
    });
    assert_eq!(fs::read(m.join("before")).unwrap(), b"before");

    let out = std::process::Command::new(bin())
        .args(["meta", "--db", "sqlite:///nonexistent/meta.db", "--metadata-rpo", "5s", "--insecure-no-tls"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--metadata-rpo") && said.contains("PostgreSQL"), "{said}");
}

/// A meta told to stop while a write waits on a hung database (every process of the
/// server stopped) exits within seconds, not after the write's --db-timeout (30 s): an
/// operator replacing it, or a failover waiting for it, is not held up.
#[test]
fn meta_stops_promptly_while_its_database_hangs() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let server = PgServer::start();
    let mut c = Cluster::start_on_db(bin(), 1, &server.create_database());
    let m = c.mount();
    fs::write(m.join("before"), b"written before the hang").unwrap();
    server.pause();
    let mut waiting = std::process::Command::new("touch").arg(m.join("during")).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on a child process this test started.
    assert_eq!(unsafe { libc::kill(c.meta.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    let stopping = std::time::Instant::now();
    testkit::exits_within(&mut c.meta.child, std::time::Duration::from_secs(10), "meta with a hung database");
    println!("meta exited {:?} after SIGTERM", stopping.elapsed());
    server.resume();
    let _ = waiting.kill();
    let _ = waiting.wait();
}

/// One attempted write of the drill's workload: file name, when it ended
/// (CLOCK_MONOTONIC, ns), its data once acknowledged or the errno it failed with.
type Attempt = (String, u64, Result<Vec<u8>, i32>);

/// The 64 KiB the workload writes into file `name` (its name repeated: every file
/// differs, so nothing dedupes).
fn drill_data(name: &str) -> Vec<u8> {
    format!("{name};").into_bytes().into_iter().cycle().take(64 << 10).collect()
}

/// One site's workload, a process of its own (the test process must hold no file of
/// a mount: a process it spawns closes its copies at exec, and a FUSE close waits for
/// an answer that a cut-off meta may never give): files `{site}{i}` written and
/// fsynced one after another in a directory, each reported with the time its fsync
/// and close returned (acknowledged) or the errno it failed with.
const WORKLOAD: &str = r#"
import os, sys, time
d, site = sys.argv[1], sys.argv[2]
i = 0
while True:
    name = f"{site}{i}"
    data = (f"{name};".encode() * 65536)[:65536]
    try:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        print(name, time.monotonic_ns(), "ok", flush=True)
    except OSError as e:
        print(name, time.monotonic_ns(), e.errno or -1, flush=True)
        time.sleep(0.05)
    i += 1
"#;

/// Starts the workload of `site` writing into `dir`.
fn start_workload(dir: &Path, site: &str) -> std::process::Child {
    std::process::Command::new("python3")
        .args(["-c", WORKLOAD])
        .arg(dir)
        .arg(site)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the python3 workload")
}

/// Kills a workload (a write it has not reported is not acknowledged) and returns
/// what it reported.
fn finish_workload(mut child: std::process::Child) -> Vec<Attempt> {
    let _ = child.kill();
    let out = child.wait_with_output().expect("collect the workload's report");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (name, at, outcome) = (f.next()?, f.next()?.parse().ok()?, f.next()?);
            let result = if outcome == "ok" { Ok(drill_data(name)) } else { Err(outcome.parse().unwrap_or(-1)) };
            Some((name.to_string(), at, result))
        })
        .collect()
}

/// Creates `path` from a process of its own (see `WORKLOAD`): `Ok(Ok)` if it was
/// created, `Ok(Err(errno))` if refused, and the process, killed, if no answer came
/// `within` (a process killed inside a request the mount's daemon is serving exits only
/// once that request ends: reap it after ending the mount).
fn probe_create(path: &Path, within: std::time::Duration) -> Result<Result<(), i32>, std::process::Child> {
    let script = "import sys\ntry:\n    open(sys.argv[1], 'wb').close()\n    print('ok')\nexcept OSError as e:\n    print(e.errno or -1)\n";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let deadline = std::time::Instant::now() + within;
    while child.try_wait().expect("wait for the probe").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err(child);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("the probe's answer");
    Ok(match String::from_utf8_lossy(&out.stdout).trim() {
        "ok" => Ok(()),
        errno => Err(errno.parse().unwrap_or(-1)),
    })
}

/// Now on CLOCK_MONOTONIC in ns (the workload's clock: Python's `time.monotonic_ns`).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given, which lives on this frame.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The WAN of the namespace drill: 20 ms RTT, `loss_pct` % loss each way (100: cut).
fn drill_wan(loss_pct: f64) -> LinkProfile {
    LinkProfile { delay: std::time::Duration::from_millis(10), loss_pct, ..LinkProfile::default() }
}

/// Two sites joined by the emulator (`drill_wan`): a PostgreSQL primary with a fresh
/// database at WAN site `a`, an asynchronous hot standby of it at site `b`.
struct Sites {
    link: WanLink,
    primary: PgServer,
    url: String,
    standby: PgServer,
    standby_url: String,
}

fn primary_and_standby(prefix: &str, a: usize, b: usize) -> Sites {
    let link = WanLink::start(prefix, 2, &drill_wan(0.0))
        .expect("start the WAN emulator (build it first: `cargo build -p testkit --bin locus-wan`)");
    let primary = PgServer::start_in(link.site_ns(a), WanLink::addr_of(a));
    let url = primary.create_database();
    let db_name = url.rsplit('/').next().unwrap().to_string();
    let standby = primary.start_standby_in(link.site_ns(b), WanLink::addr_of(b));
    let standby_url = standby.url(&db_name);
    Sites { link, primary, url, standby, standby_url }
}

/// The failover drill (issue 9, part 5) on real processes in network namespaces: sites
/// A and B joined by the `locus-wan` emulator (20 ms RTT). A: the primary PostgreSQL,
/// a meta over it, node a0, a mount; B: a synchronous streaming standby, a meta reading
/// from it (`--read-db`, writes to A's primary), node b0, a mount. `/w` has a sync a,b
/// policy and both sites write and fsync there. A is cut off completely (100 % loss
/// both ways at the emulator) with every process of A still running; `locus meta
/// promote` makes B's standby the primary of epoch 2, B's meta restarts on it and `/w`
/// is set to site b alone. Every acknowledged file must be readable byte-exact at B;
/// A's meta, still running over its still-running primary, must refuse writes once its
/// lease has run out (none acknowledged after that; a fresh write there gets EROFS
/// within a bound, even when A's writer was stuck in a commit waiting for B); B's
/// writes through A's primary must have been acknowledged before the cut too;
/// once the cut heals, A rejoins (its database discarded, a meta at A over B's primary,
/// node a0 re-registering with its chunks) and fsck must be clean. Prints the figures
/// (`bench/failover.sh` writes them to bench/results/failover.md).
#[test]
fn failover_across_a_cut_wan_loses_no_acknowledged_write() {
    use std::time::Duration;
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns` and ethtool");
        return;
    }
    const LEASE_MS: u64 = 2000;
    // Site B is WAN site 0 (the cluster's first meta, which keeps its port across the
    // failover, runs there), site A is WAN site 1.
    let (b, a) = (0, 1);
    let Sites { link, primary, url, standby: _standby, standby_url } = primary_and_standby("lwt-pgfail-", a, b);
    primary.sql("postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'");
    primary.sql("postgres", "SELECT pg_reload_conf()");
    let lease = LEASE_MS.to_string();
    let meta_flags = ["--read-db", standby_url.as_str(), "--primary-lease-ms", lease.as_str()];
    let mut c = Cluster::start_in_sites_on_db(bin(), &link, &["b", "a"], Some(&url), &meta_flags);
    let meta_b = c.meta.addr.clone();
    let meta_a = c.add_meta_at("a", &url, &["--read-db"], &[]);
    let sync_timeout: &[&str] = &["--sync-timeout", "3s"];
    c.add_node_with("a0", "a", sync_timeout);
    c.add_node_with("b0", "b", sync_timeout);
    c.wait_for_nodes(2);
    let at_a = c.mount_through(&meta_a, "a", &[]);
    let probe_a = c.mount_through(&meta_a, "a", &[]);
    let at_b = c.mount_through(&meta_b, "b", &[]);
    fs::create_dir(at_b.join("w")).unwrap();
    let policy = |c: &Cluster, sites: &str| {
        let out = c.locus(&["policy", "set", "/w", "--sites", sites, "--mode", "sync", "--meta", &meta_b]);
        assert!(out.status.success(), "policy set: {}", String::from_utf8_lossy(&out.stderr));
    };
    policy(&c, "a,b");
    let sync_state = primary.sql("postgres", "SELECT sync_state FROM pg_stat_replication");
    assert_eq!(sync_state, "sync", "B's standby is synchronous");

    let (work_a, work_b) = (start_workload(&at_a.join("w"), "a"), start_workload(&at_b.join("w"), "b"));
    std::thread::sleep(Duration::from_secs(6));
    // The cut: nothing crosses between A and B from here on; A's processes run on.
    link.set(&drill_wan(100.0)).unwrap();
    let cut = monotonic_ns();
    let since_cut = || Duration::from_nanos(monotonic_ns() - cut);
    // The procedure at B.
    let out = c.locus(&["meta", "promote", "--db", &standby_url]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("promoted: epoch 2"), "promote: {said}");
    c.use_meta_db(&standby_url);
    c.drop_meta_flag("--read-db");
    c.restart_meta();
    policy(&c, "b");
    let back = since_cut();
    // A keeps trying past the end of its lease; then a fresh write at A (through
    // another mount, so that a write of the workload blocked in a commit cannot hide it).
    std::thread::sleep(Duration::from_millis(LEASE_MS + 3000).saturating_sub(since_cut()));
    let probe_started = since_cut();
    let mut probe = probe_create(&probe_a.join("w/probe"), Duration::from_secs(5));
    let probe_answered = since_cut();
    // End A's mounts first: a killed process closes its files, and a close through a
    // mount whose meta's writer is stuck in a commit waiting for B would wait out the
    // client's RPC timeout.
    let ending = std::time::Instant::now();
    for (_, mount) in &mut c.mounts[..2] {
        let _ = mount.child.kill();
        let _ = mount.child.wait();
    }
    if let Err(unanswered) = &mut probe {
        let _ = unanswered.wait();
    }
    let probe = probe.ok();
    let (ops_a, ops_b) = (finish_workload(work_a), finish_workload(work_b));
    let ending_ms = ending.elapsed().as_millis();

    let acked = |ops: &[Attempt]| -> Vec<(String, Vec<u8>)> {
        ops.iter().filter_map(|(n, _, r)| r.as_ref().ok().map(|d| (n.clone(), d.clone()))).collect()
    };
    let lease_end = cut + LEASE_MS * 1_000_000;
    let accepted_at_a = |after: u64| ops_a.iter().filter(|(_, t, r)| *t > after && r.is_ok()).count();
    let first_b_after_cut =
        ops_b.iter().find(|(_, t, r)| *t > cut && r.is_ok()).map(|(_, t, _)| Duration::from_nanos(t - cut));
    let mut all = acked(&ops_a);
    all.extend(acked(&ops_b));
    std::thread::sleep(Duration::from_millis(1500));
    let lost: Vec<&String> =
        all.iter().filter(|(n, d)| fs::read(at_b.join("w").join(n)).ok().as_ref() != Some(d)).map(|(n, _)| n).collect();
    let meta_a_log = fs::read_to_string(c.path().join("meta1.log")).unwrap_or_default();

    // A rejoins once the cut heals: its old database discarded (never a primary again),
    // its old meta replaced by one over B's primary, node a0 (never stopped) back in touch.
    let primary_log = fs::read_to_string(primary.path().join("server.log")).unwrap_or_default();
    // Serialization failures at A's primary: B's meta's transactions take several WAN
    // round trips each and lose SSI conflicts (as the pivot) to A's short ones.
    let conflicts = primary_log.matches("could not serialize access").count();
    // (An immediate stop: a fast one waits for its WAL sender to a standby it cannot reach.)
    let rejoin = std::time::Instant::now();
    primary.crash();
    drop(primary);
    let _ = c.other_metas[0].child.kill();
    let _ = c.other_metas[0].child.wait();
    link.set(&drill_wan(0.0)).unwrap();
    c.add_meta_at("a", &standby_url, &["--read-db"], &[]);
    c.wait_for_nodes(2);
    policy(&c, "a,b");
    let fsck = c.locus(&["fsck", "--meta", &meta_b]);
    let rejoin_ms = rejoin.elapsed().as_millis();
    let fsck_text = String::from_utf8_lossy(&fsck.stdout).into_owned() + &String::from_utf8_lossy(&fsck.stderr);

    println!(
        "FAILOVER setting network namespaces A and B joined by locus-wan (20 ms RTT), cut by 100 % loss both ways"
    );
    println!("FAILOVER lease_ms {LEASE_MS}");
    let before_cut = |ops: &[Attempt]| ops.iter().filter(|(_, t, r)| *t <= cut && r.is_ok()).count();
    println!("FAILOVER acknowledged_before_cut a={} b={}", before_cut(&ops_a), before_cut(&ops_b));
    println!("FAILOVER serialization_failures_at_a_primary {conflicts}");
    println!("FAILOVER procedure_done_ms {}", back.as_millis());
    println!("FAILOVER b_accepts_writes_again_ms {}", first_b_after_cut.map_or(-1, |d| d.as_millis() as i64));
    println!("FAILOVER acknowledged_ops_lost {}", lost.len());
    println!("FAILOVER writes_accepted_at_a_after_cut {}", accepted_at_a(cut));
    println!("FAILOVER writes_accepted_at_a_after_lease {}", accepted_at_a(lease_end));
    let probe_said = match probe {
        Some(Err(libc::EROFS)) => "refused (EROFS)".to_string(),
        Some(Err(errno)) => format!("failed (errno {errno})"),
        Some(Ok(())) => "ACCEPTED".to_string(),
        None => "no answer within 5 s".to_string(),
    };
    println!("FAILOVER write_at_a_after_lease {probe_said}");
    println!("FAILOVER write_at_a_started_after_cut_ms {}", probe_started.as_millis());
    println!("FAILOVER write_at_a_answered_after_cut_ms {}", probe_answered.as_millis());
    println!("FAILOVER end_workloads_ms {ending_ms}");
    println!("FAILOVER rejoin_and_fsck_ms {rejoin_ms}");
    // Copies owed to A are still being made right after the rejoin: degraded (exit 3)
    // is expected there; damage (exit 1) never is.
    let fsck_word = match fsck.status.code() {
        Some(0) => "clean",
        Some(3) => "degraded",
        _ => "DAMAGED",
    };
    println!("FAILOVER fsck_after_rejoin {fsck_word}");
    assert!(before_cut(&ops_a) > 0, "A wrote before the cut");
    assert!(before_cut(&ops_b) > 0, "B wrote before the cut ({conflicts} serialization failures at A's primary)");
    assert!(lost.is_empty(), "acknowledged files lost or different at B: {lost:?}");
    assert_eq!(accepted_at_a(lease_end), 0, "A accepted writes after its lease ended");
    // Refused with EROFS, also when A's writer was stuck in a commit waiting for B's
    // standby (a write in flight at the cut): abandoned once the lease ran out.
    assert_eq!(probe, Some(Err(libc::EROFS)), "a fresh write at A after its lease: {meta_a_log}");
    assert!(
        probe_answered < Duration::from_millis(LEASE_MS + 3000 + 5000),
        "answered {probe_answered:?} after the cut"
    );
    assert!(meta_a_log.contains("lease on the primary role"), "{meta_a_log}");
    assert!(first_b_after_cut.is_some(), "B never accepted a write again");
    assert_ne!(fsck_word, "DAMAGED", "fsck after A rejoined: {fsck_text}");
}

/// Fencing at the nodes (issue 9, part 5): a meta of an older epoch cannot get a node
/// to work for it once the node has seen a newer one. Site A's meta holds a long lease
/// on the primary (600 s, renewed there: the lease alone would let it write for ten
/// minutes) while the standby, cut off from the primary's stream, is promoted to
/// epoch 2 and B's meta restarts on it; node n0 learns epoch 2 from its heartbeat to
/// B's meta and keeps it in its data directory. A's mount then writes: A's meta
/// accepts the create, but n0 refuses its epoch-1 put capability, the fsync fails
/// with EROFS and n0 stores nothing. A `locus gc` judged by A's meta, whose catalogue
/// lacks the file B's mount writes next, would delete that file's chunk: n0 refuses
/// the deletes, which state epoch 1, and the file reads back whole. Restarted against
/// A's meta, n0 tells it epoch 2 with its registration: A's meta learns it lost the
/// primary role and refuses every write (EROFS), while n0 waits for a meta of the new
/// primary.
#[test]
fn nodes_refuse_work_for_a_meta_of_an_older_epoch() {
    use std::io::Write;
    use std::process::Command;
    use std::time::Duration;
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let primary = PgServer::start();
    let url = primary.create_database();
    let db_name = url.rsplit('/').next().unwrap().to_string();
    let standby = primary.start_standby();
    let standby_url = standby.url(&db_name);
    // B's meta (the cluster's first; it keeps its port across the failover) holds no
    // lease, so `promote` has none to wait out.
    let mut c = Cluster::start_on_db_with(bin(), 0, &url, &["--primary-lease-ms", "0"]);
    c.add_node("n0", "a");
    c.wait_for_nodes(1);
    let epoch_file = c.node_dir("n0").join("EPOCH");
    let epoch_seen = || fs::read_to_string(&epoch_file).map(|t| t.trim().to_string()).unwrap_or_default();
    wait_until("n0 noting epoch 1", Duration::from_secs(20), || epoch_seen() == "1");

    // The standby stops streaming from the primary (as a cut between the sites would),
    // so A's lease, taken next, exists at the primary only.
    standby.sql("postgres", "ALTER SYSTEM SET primary_conninfo = ''");
    standby.sql("postgres", "SELECT pg_reload_conf()");
    wait_until("the standby stopping its stream", Duration::from_secs(20), || {
        primary.sql("postgres", "SELECT count(*) FROM pg_stat_replication") == "0"
    });
    let log_a = c.path().join("meta-a.log");
    let mut meta_a = Command::new(bin());
    meta_a
        .args(["meta", "--listen", "127.0.0.1:0", "--db", &url, "--primary-lease-ms", "600000"])
        .args(["--no-root-squash", "a"])
        .args(c.cert("meta", "meta-a", "a"))
        .env("LOCUS_LOG", "warn,meta=info,locus=info");
    c.other_metas.push(testkit::spawn_command(meta_a, "locus meta listening on", &log_a));
    let meta_a = c.other_metas[0].addr.clone();
    let at_a = c.mount_through(&meta_a, "a", &[]);
    let write_in = |dir: &std::path::Path, name: &str| {
        fs::File::create(dir.join(name)).and_then(|mut f| {
            f.write_all(&testkit::pattern(256 << 10, name.len() as u64))?;
            f.sync_all()
        })
    };
    let write = |name: &str| write_in(&at_a, name);
    write("before").expect("A writes while nothing has failed over");

    let out = c.locus(&["meta", "promote", "--db", &standby_url]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("promoted: epoch 2"), "promote: {said}");
    c.use_meta_db(&standby_url);
    c.restart_meta();
    wait_until("n0 learning epoch 2 from B's meta", Duration::from_secs(20), || epoch_seen() == "2");

    // A's meta, within its lease, lets its mount write; the node refuses the work.
    let chunks_before = testkit::files_under(&c.node_dir("n0"));
    let refused = write("after").expect_err("a write for the meta of epoch 1 was acknowledged");
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    assert!(at_a.join("after").exists(), "A's meta itself still accepted the create: its lease holds");
    assert_eq!(testkit::files_under(&c.node_dir("n0")), chunks_before, "n0 stored nothing for A");
    let mount_log = fs::read_to_string(c.path().join("mount0.log")).unwrap_or_default();
    assert!(
        mount_log.contains("the node refuses this meta's capability")
            && mount_log.contains("signed by a meta of epoch 1, but this node has seen epoch 2"),
        "the mount says why: {mount_log}"
    );

    // A gc judged by A's meta finds the chunk of a file only the new primary knows
    // unreferenced; n0 refuses to delete it.
    let at_b = c.mount_with("a", &[]);
    write_in(&at_b, "at-b").expect("B's mount writes through the new primary");
    let chunks_with_b = testkit::files_under(&c.node_dir("n0"));
    assert_ne!(chunks_with_b, chunks_before, "n0 stored B's file");
    let out = c.locus(&["gc", "--meta", &meta_a, "--min-age", "0s", "--force"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "gc through the meta of epoch 1 succeeded: {said}");
    assert!(
        said.contains("refused to delete")
            && said.contains("acts under epoch 1 of the primary role, but this node has seen epoch 2"),
        "gc says why: {said}"
    );
    assert_eq!(testkit::files_under(&c.node_dir("n0")), chunks_with_b, "n0 deleted nothing");
    assert_eq!(fs::read(at_b.join("at-b")).unwrap(), testkit::pattern(256 << 10, 4), "B's file reads back whole");

    // n0, restarted against A's meta, remembers epoch 2 and tells it: A's meta refuses
    // writes from then on.
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let dir = c.node_dir("n0").display().to_string();
    let mut n0 = Command::new(bin());
    n0.args(["node", "--listen", "127.0.0.1:0", "--meta", &meta_a, "--data-dir", &dir, "--id", "n0", "--site", "a"])
        .args(c.cert("node", "n0", "a"))
        .env("LOCUS_LOG", "warn,node=info,locus=info");
    c.nodes[0] = testkit::spawn_command(n0, "locus node listening on", &c.path().join("n0-at-a.log"));
    wait_until("A's meta learning it lost the primary role", Duration::from_secs(20), || {
        fs::read_to_string(&log_a).unwrap_or_default().contains("a node has seen a newer epoch of the primary role")
    });
    let fenced = fs::create_dir(at_a.join("fenced")).expect_err("a fenced meta accepted a mkdir");
    assert_eq!(fenced.raw_os_error(), Some(libc::EROFS), "{fenced}");
    let node_log = fs::read_to_string(c.path().join("n0-at-a.log")).unwrap_or_default();
    assert!(node_log.contains("meta refuses this node"), "n0 waits for a meta of the new primary: {node_log}");
    assert_eq!(epoch_seen(), "2");
}

/// Forwarded writes (issue 35, part 4): sites A and B joined by the emulator (20 ms
/// RTT); A holds the primary and a meta over it, B an asynchronous hot standby and a
/// meta reading from it that forwards every write to A's meta
/// (`--forward-writes-to`). A mount at B creates, writes, renames, links, chmods and
/// removes, and reads each change back at once through B's standby (read-your-writes);
/// errors come back as A's meta said them (EEXIST, ENOTEMPTY); `locus status` at B
/// counts the forwarded writes; a fresh mount at A sees the same tree. With A's meta
/// stopped, a write at B fails with EIO after a bounded wait while stat and listing go
/// on; once A's meta is back, writes at B work again.
#[test]
fn a_meta_away_from_the_primary_forwards_its_writes() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::time::{Duration, Instant};
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns` and ethtool");
        return;
    }
    let (a, b) = (0, 1);
    let Sites { link, primary: _primary, url, standby: _standby, standby_url } = primary_and_standby("lwt-fwd-", a, b);
    let mut c = Cluster::start_in_sites_on_db(bin(), &link, &["a", "b"], Some(&url), &[]);
    let meta_a = c.meta.addr.clone();
    let flags = ["--read-db", &standby_url, "--forward-writes-to", &meta_a, "--db-timeout", "5s"];
    let meta_b = c.add_meta_at("b", &url, &[], &flags);
    c.add_node("a0", "a");
    c.add_node("b0", "b");
    c.wait_for_nodes(2);
    c.set_root_copies(1);
    let at_b = c.mount_through(&meta_b, "b", &[]);

    // Each change read back at once, through B's meta and its standby.
    let d = at_b.join("d");
    fs::create_dir(&d).unwrap();
    let mut expected: Vec<String> = Vec::new();
    for i in 0..12 {
        let name = format!("f{i}");
        fs::write(d.join(&name), format!("content {i}")).unwrap();
        assert_eq!(fs::read_to_string(d.join(&name)).unwrap(), format!("content {i}"), "{name} read back");
        expected.push(name);
    }
    fs::rename(d.join("f0"), d.join("renamed")).unwrap();
    assert!(!d.join("f0").exists() && d.join("renamed").exists(), "the rename is seen at once");
    expected[0] = "renamed".into();
    fs::hard_link(d.join("f1"), d.join("link")).unwrap();
    assert_eq!(fs::metadata(d.join("f1")).unwrap().nlink(), 2, "the link count is seen at once");
    expected.push("link".into());
    fs::set_permissions(d.join("f2"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(d.join("f2")).unwrap().permissions().mode() & 0o777, 0o600, "the chmod is seen");
    fs::remove_file(d.join("f3")).unwrap();
    assert!(!d.join("f3").exists(), "the unlink is seen at once");
    expected.retain(|n| n != "f3");
    expected.sort();
    let listed = |dir: &Path| {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    assert_eq!(listed(&d), expected);
    // Refusals come back as A's meta gave them.
    let exists = fs::OpenOptions::new().write(true).create_new(true).open(d.join("f4")).unwrap_err();
    assert_eq!(exists.raw_os_error(), Some(libc::EEXIST), "{exists}");
    let not_empty = fs::remove_dir(&d).unwrap_err();
    assert_eq!(not_empty.raw_os_error(), Some(libc::ENOTEMPTY), "{not_empty}");

    let status = c.locus(&["status", "--meta", &meta_b]);
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    let forwarded: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("writes to home root forwarded to the meta holding it at {meta_a}: ")))
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("status at B does not show forwarding: {text}"));
    assert!(forwarded >= 20, "only {forwarded} writes forwarded: {text}");

    // A sees B's tree.
    let at_a = c.mount_through(&meta_a, "a", &[]);
    assert_eq!(listed(&at_a.join("d")), expected);
    assert_eq!(fs::read_to_string(at_a.join("d/renamed")).unwrap(), "content 0");

    // A's meta stopped: writes at B fail within a bound, reads go on.
    let _ = c.meta.child.kill();
    let _ = c.meta.child.wait();
    let started = Instant::now();
    let refused = fs::create_dir(d.join("while-a-is-down")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EIO), "{refused}");
    assert!(started.elapsed() < Duration::from_secs(30), "the refusal took {:?}", started.elapsed());
    // Opening a file records it (a write); looking goes on.
    assert_eq!(fs::metadata(d.join("f5")).unwrap().len(), 9, "stat goes on at B");
    assert_eq!(listed(&d), expected, "listing goes on at B");
    c.restart_meta();
    wait_until("a write at B after A's meta restarted", Duration::from_secs(20), || {
        fs::create_dir(d.join("after-restart")).is_ok()
    });
    assert!(d.join("after-restart").is_dir());
}
