//! Meta over PostgreSQL with real processes: a server the test starts itself
//! (`testkit::postgres`), `locus meta --db postgres://...`, FUSE mounts through it,
//! restarts, and `locus meta migrate` from a SQLite namespace.

use std::fs;
use std::path::Path;
use testkit::Cluster;
use testkit::postgres::PgServer;

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

/// `locus meta --read-db`: meta reads from a hot standby of its primary; a mount
/// writes and reads back at once (read-your-writes), and fsck is clean.
#[test]
fn meta_reading_from_a_hot_standby_serves_a_mount() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let primary = PgServer::start();
    let url = primary.create_database();
    let standby = primary.start_standby();
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
