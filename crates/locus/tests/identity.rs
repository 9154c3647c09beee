//! A cluster has an identity, and meta, nodes and gc refuse what is not theirs: a
//! database meta did not format, a damaged or already-used one, a node of another
//! cluster, a gc that would empty the nodes. Real processes, no FUSE needed.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use testkit::Cluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// Runs `locus args` to completion (commands expected to fail exit at once).
fn locus(args: &[&str]) -> Output {
    Command::new(bin()).args(args).stdin(Stdio::null()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Starts `locus meta` on `db` and asserts it refuses, returning its error output.
fn refused_meta(db: &str) -> String {
    // Refusals of the database, not of certificates: no TLS needed to reach them.
    let o = locus(&["meta", "--listen", "127.0.0.1:0", "--db", db, "--insecure-no-tls"]);
    assert!(!o.status.success(), "meta started on {db}");
    stderr(&o)
}

#[test]
fn meta_refuses_a_database_it_did_not_format() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("wrong/path/meta.db");
    let err = refused_meta(missing.to_str().unwrap());
    assert!(err.contains("does not exist") && err.contains("--init"), "{err}");
    assert!(!missing.exists());

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let err = refused_meta(&format!("sqlite://{}", empty.display()));
    assert!(err.contains("is empty") && err.contains("--init"), "{err}");
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "refusing leaves the file alone");

    let err = refused_meta("postgres://locus:secret@127.0.0.1:1/locus");
    assert!(err.contains("cannot connect") && err.contains("postgres://locus@127.0.0.1:1/locus"), "{err}");
    assert!(!err.contains("secret"), "the password is never shown: {err}");
    let err = refused_meta("mysql://db.example/locus");
    assert!(err.contains("unknown scheme") && err.contains("sqlite://"), "{err}");
}

#[test]
fn a_second_meta_on_the_same_database_is_refused() {
    let c = Cluster::start(bin(), 0);
    let db = c.path().join("meta.db");
    let err = refused_meta(db.to_str().unwrap());
    assert!(err.contains("in use by another locus meta"), "{err}");
}

#[test]
fn a_damaged_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("meta.db");
    {
        let config = meta::MetaConfig {
            db_url: db.display().to_string(),
            read_db_url: None,
            init: true,
            heartbeat: std::time::Duration::from_secs(2),
            session_expiry: std::time::Duration::from_secs(30),
            primary_lease: None,
            metadata_rpo: None,
            db_timeout: meta::DEFAULT_DB_TIMEOUT,
            audit_log: None,
            root_policy: None,
            forward_writes_to: None,
            homes: Vec::new(),
            sites: Vec::new(),
            site: None,
            auto_move: Default::default(),
        };
        // A new database already has a page per table and index.
        drop(meta::MetaService::open(&config).unwrap());
        // Closing the last connection folds the WAL into the file.
    }
    assert!(!dir.path().join("meta.db-wal").exists(), "the WAL was not checkpointed");
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() >= 8 * 4096, "{} bytes", bytes.len());
    // Four zeroed pages after the header page.
    bytes[4096..5 * 4096].fill(0);
    std::fs::write(&db, bytes).unwrap();
    let err = refused_meta(db.to_str().unwrap());
    assert!(err.contains("is damaged") && err.contains("restore it from a backup"), "{err}");
}

/// The cluster id a node recorded in `data_dir`. It writes it right after meta
/// accepted it, so wait for that (bounded).
fn recorded_cluster(data_dir: &Path) -> String {
    let file = data_dir.join("CLUSTER");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(id) = std::fs::read_to_string(&file) {
            return id.trim().to_string();
        }
        assert!(std::time::Instant::now() < deadline, "{} was never written", file.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_node_of_another_cluster_is_refused() {
    let mut a = Cluster::start(bin(), 2);
    let ids = [recorded_cluster(&a.node_dir("node0")), recorded_cluster(&a.node_dir("node1"))];
    assert_eq!(ids[0], ids[1], "both nodes joined the one cluster");
    let status = String::from_utf8_lossy(&a.locus(&["status", "--meta", &a.meta.addr]).stdout).into_owned();
    assert!(status.contains(&format!("(cluster {})", ids[0])), "{status}");
    assert!(ids[0].len() == 32 && ids[0].chars().all(|c| c.is_ascii_hexdigit()), "{}", ids[0]);

    // Cluster A stops; its node's data directory is pointed at cluster B's meta.
    a.kill_all();
    let b = Cluster::start(bin(), 0);
    let stray = a.node_dir("node0");
    let mut args: Vec<String> = [
        "node",
        "--listen",
        "127.0.0.1:0",
        "--meta",
        &b.meta.addr,
        "--data-dir",
        stray.to_str().unwrap(),
        "--id",
        "stray",
    ]
    .map(String::from)
    .into();
    // A valid node certificate of cluster B: the cluster id still tells them apart.
    args.extend(b.cert("node", "stray", "default"));
    let o = Command::new(bin()).args(&args).stdin(Stdio::null()).output().unwrap();
    assert!(!o.status.success(), "a node of cluster A registered with cluster B");
    let err = stderr(&o);
    assert!(err.contains(&format!("belongs to cluster {}", ids[0])), "{err}");
}

#[test]
fn gc_refuses_to_empty_the_nodes_and_dry_run_deletes_nothing() {
    let c = Cluster::start(bin(), 1);
    // 120 chunks on the node that the catalogue knows nothing about.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // A node's certificate: clients may not put without meta's capability.
        let f = c.cert("node", "putter", "default");
        let tls = net::Tls::load(Path::new(&f[1]), Path::new(&f[3]), Path::new(&f[5])).unwrap();
        let timeout = std::time::Duration::from_secs(10);
        let node = net::RpcClient::connect_as(&c.nodes[0].addr, 1, timeout, Some(tls.into())).await.unwrap();
        for i in 0..120u32 {
            let data = format!("stray chunk {i}").into_bytes();
            let id = proto::types::ChunkId::of(&data);
            let req = proto::node::Put { id, cap: None, epoch: 1, replicate: Default::default() };
            node.call_node_bulk(req, bytes::Bytes::from(data)).await.unwrap().unwrap();
        }
    });
    let stored = || std::fs::read_dir(c.node_dir("node0").join("chunks")).unwrap().count();
    let before = stored();

    let o = c.locus(&["gc", "--meta", &c.meta.addr, "--min-age", "0s"]);
    assert!(!o.status.success(), "gc deleted from nodes full of unreferenced chunks");
    let err = stderr(&o);
    assert!(err.contains("refuses to delete 120 of the 120") && err.contains("--force"), "{err}");
    assert!(err.contains("--dry-run"), "{err}");
    assert_eq!(stored(), before);

    let o = c.locus(&["gc", "--meta", &c.meta.addr, "--min-age", "0s", "--dry-run"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.lines().filter(|l| l.starts_with("would delete")).count(), 120, "{out}");
    assert!(out.contains("nothing deleted"), "{out}");
    assert_eq!(stored(), before);

    let o = c.locus(&["gc", "--meta", &c.meta.addr, "--min-age", "0s", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("120 unreferenced chunks older than 0s deleted"), "{out}");
}

#[test]
fn up_refuses_a_data_directory_that_lost_its_database() {
    let dir = tempfile::tempdir().unwrap();
    let (data, mnt) = (dir.path().join("data"), dir.path().join("mnt"));
    std::fs::create_dir_all(data.join("chunks")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let (mnt_arg, data_arg) = (mnt.to_str().unwrap(), data.to_str().unwrap());
    let any = "127.0.0.1:0";
    let o = locus(&["up", mnt_arg, "--data-dir", data_arg, "--meta-listen", any, "--node-listen", any]);
    assert!(!o.status.success(), "up started a new namespace next to old chunks");
    let err = stderr(&o);
    assert!(err.contains("meta.db does not exist") && err.contains("--init"), "{err}");
    assert!(!data.join("meta.db").exists());
}

/// A scratch directory for `locus up` and its `data` and `mnt` paths, or `None` (the
/// test is skipped) without root and /dev/fuse.
fn up_scratch() -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (data, mnt) = (dir.path().join("data"), dir.path().join("mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    Some((dir, data, mnt))
}

/// Runs `locus up` until it has mounted (bounded), returning the child and the address
/// its meta listens on. Its ports are picked by the OS at bind: a port found free
/// beforehand can be taken by another test's connection before `up` binds it.
fn up(mnt: &Path, data: &Path) -> (std::process::Child, String) {
    use std::io::{BufRead, Read};
    let mut child = Command::new(bin())
        .args(["up", mnt.to_str().unwrap(), "--data-dir", data.to_str().unwrap()])
        .args(["--meta-listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut meta = None;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("locus: meta ") {
                meta = rest.split(',').next().map(str::to_string);
            }
            if line.starts_with("locus mounted on") {
                let _ = tx.send(meta.take());
            }
        }
    });
    match rx.recv_timeout(std::time::Duration::from_secs(30)) {
        Ok(Some(meta)) => {
            // Drained so that a chatty child never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            (child, meta)
        }
        outcome => {
            let _ = child.kill();
            let mut said = String::new();
            let _ = stderr.read_to_string(&mut said);
            panic!("locus up did not mount within 30 s (or did not say its meta address: {outcome:?}): {said}");
        }
    }
}

/// Stops `locus up` as Ctrl-C would and waits for it (bounded by its own unmount).
fn stop(mut child: std::process::Child, mnt: &Path) {
    // SAFETY: kill only sends a signal to the pid of a child we spawned and still own.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    child.wait().unwrap();
    let _ = Command::new("umount").arg("-l").arg(mnt).stderr(Stdio::null()).status();
}

#[test]
fn up_formats_a_new_data_directory_once_and_reuses_it() {
    let Some((_dir, data, mnt)) = up_scratch() else { return };
    let (first, _) = up(&mnt, &data);
    std::fs::write(mnt.join("kept"), b"still here").unwrap();
    let cluster = recorded_cluster(&data.join("chunks"));
    stop(first, &mnt);
    let (second, _) = up(&mnt, &data);
    let content = std::fs::read(mnt.join("kept"));
    stop(second, &mnt);
    assert_eq!(content.unwrap(), b"still here", "the second start used the same namespace");
    assert_eq!(recorded_cluster(&data.join("chunks")), cluster);
}

/// `locus up`'s mount calls meta in its own process: the namespace works through it
/// (a file written, renamed, read back after the kernel's caches ran out, removed) and
/// meta still reaches the mount's session on its connection (`locus status` lists the
/// mount's workers, which meta asks for with a push).
#[test]
fn up_serves_the_mount_through_meta_in_its_process() {
    let Some((_dir, data, mnt)) = up_scratch() else { return };
    let (child, meta) = up(&mnt, &data);
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/a"), b"through meta in this process").unwrap();
    std::fs::rename(mnt.join("d/a"), mnt.join("d/b")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1200)); // the 1 s entry and attribute TTL
    let read = std::fs::read(mnt.join("d/b"));
    let names: Vec<_> = std::fs::read_dir(mnt.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    let status = Command::new(bin())
        .args(["status", "--meta", &meta])
        .env("LOCUS_CA", data.join("tls/ca.pem"))
        .env("LOCUS_CERT", data.join("tls/admin.pem"))
        .env("LOCUS_KEY", data.join("tls/admin.key"))
        .output()
        .unwrap();
    std::fs::remove_file(mnt.join("d/b")).unwrap();
    let gone = std::fs::metadata(mnt.join("d/b")).map(|_| ()).unwrap_err().kind();
    stop(child, &mnt);
    assert_eq!(read.unwrap(), b"through meta in this process");
    assert_eq!(names, ["b"]);
    assert_eq!(gone, std::io::ErrorKind::NotFound);
    let text = String::from_utf8_lossy(&status.stdout);
    let mount_rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("session ")).collect();
    assert!(
        mount_rows.iter().any(|l| l.contains(" compaction ")),
        "the mount did not report its workers: {text}{}",
        String::from_utf8_lossy(&status.stderr)
    );
}
