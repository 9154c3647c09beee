//! Cluster behaviour across processes: close-to-open consistency and byte-range locks
//! between two mounts, crash recovery after kill -9 of every process, and corrupt
//! chunks on a node's disk.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::Cluster;

fn cluster(nodes: usize) -> Option<Cluster> {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return None;
    }
    Some(Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), nodes))
}

/// Deterministic content for file `i`: sizes from a few bytes to several chunks.
fn content(i: u64) -> Vec<u8> {
    let len = [3usize, 100_000, 4 << 20, (5 << 20) + 17][(i % 4) as usize];
    (0..len).map(|j| (j as u64).wrapping_mul(31).wrapping_add(i * 7919) as u8).collect()
}

fn set_lock(f: &File, kind: i32, wait: bool) -> i32 {
    // SAFETY: flock is a plain C struct for which all zeroes is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    let cmd = if wait { libc::F_SETLKW } else { libc::F_SETLK };
    // SAFETY: `fl` is a valid flock that outlives the call; `f` keeps the descriptor open.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &fl) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

#[test]
fn close_to_open_between_two_mounts() {
    let Some(mut c) = cluster(1) else { return };
    let a = c.mount();
    let b = c.mount();
    fs::write(a.join("f"), b"version one").unwrap();
    assert_eq!(fs::read(b.join("f")).unwrap(), b"version one");
    // B caches f's size; A makes it longer; B's next open must see all of it.
    fs::write(a.join("f"), b"version two, which is longer").unwrap();
    assert_eq!(fs::read(b.join("f")).unwrap(), b"version two, which is longer");
    let mut app = OpenOptions::new().append(true).open(b.join("f")).unwrap();
    app.write_all(b" +B").unwrap();
    drop(app);
    assert_eq!(fs::read(a.join("f")).unwrap(), b"version two, which is longer +B");
    // Names created on one mount are visible on the other.
    fs::create_dir(a.join("dir")).unwrap();
    fs::write(a.join("dir/new"), b"x").unwrap();
    assert_eq!(fs::read(b.join("dir/new")).unwrap(), b"x");
}

#[test]
fn byte_range_locks_between_mounts() {
    let Some(mut c) = cluster(1) else { return };
    let a = c.mount();
    let b = c.mount();
    fs::write(a.join("lockfile"), b"data").unwrap();
    let fa = OpenOptions::new().read(true).write(true).open(a.join("lockfile")).unwrap();
    let fb = OpenOptions::new().read(true).write(true).open(b.join("lockfile")).unwrap();
    assert_eq!(set_lock(&fa, libc::F_WRLCK, false), 0);
    assert_eq!(set_lock(&fb, libc::F_WRLCK, false), libc::EAGAIN);
    assert_eq!(set_lock(&fb, libc::F_RDLCK, false), libc::EAGAIN);
    // F_GETLK on B reports A's lock.
    // SAFETY: flock is a plain C struct for which all zeroes is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    // SAFETY: `fl` is a valid, writable flock; `fb` keeps the descriptor open.
    assert_eq!(unsafe { libc::fcntl(fb.as_raw_fd(), libc::F_GETLK, &mut fl) }, 0);
    assert_eq!(fl.l_type as i32, libc::F_WRLCK);
    // A blocked F_SETLKW on B is granted once A unlocks.
    let waiter = std::thread::spawn(move || {
        let r = set_lock(&fb, libc::F_WRLCK, true);
        (r, fb)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "F_SETLKW returned while the lock was held");
    assert_eq!(set_lock(&fa, libc::F_UNLCK, false), 0);
    let (r, fb) = waiter.join().unwrap();
    assert_eq!(r, 0);
    assert_eq!(set_lock(&fa, libc::F_RDLCK, false), libc::EAGAIN);
    // Closing the file drops the lock.
    drop(fb);
    assert_eq!(set_lock(&fa, libc::F_RDLCK, false), 0);
}

#[test]
fn locks_of_a_dead_mount_expire() {
    let Some(mut c) = cluster(1) else { return };
    let a = c.mount();
    let b = c.mount();
    fs::write(a.join("lockfile"), b"data").unwrap();
    let fa = OpenOptions::new().write(true).open(a.join("lockfile")).unwrap();
    assert_eq!(set_lock(&fa, libc::F_WRLCK, false), 0);
    // The mount holding the lock dies without a word.
    let _ = c.mounts[0].1.child.kill();
    let fb = OpenOptions::new().write(true).open(b.join("lockfile")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while set_lock(&fb, libc::F_WRLCK, false) != 0 {
        assert!(Instant::now() < deadline, "lock of a dead session was never released");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(fa);
}

#[test]
fn every_fsynced_byte_survives_kill_9_of_every_process() {
    let Some(mut c) = cluster(2) else { return };
    let m = c.mount();
    fs::create_dir(m.join("w")).unwrap();
    let journal: PathBuf = c.path().join("fsynced.txt");
    let (dir, log) = (m.join("w"), journal.clone());
    let writer = std::thread::spawn(move || {
        let mut done = File::create(&log).unwrap();
        for i in 0..10_000u64 {
            let write = || -> std::io::Result<()> {
                let mut f = File::create(dir.join(format!("f{i}")))?;
                f.write_all(&content(i))?;
                f.sync_all()
            };
            if write().is_err() {
                return i;
            }
            // Only after fsync returned does the file count as acknowledged.
            writeln!(done, "{i}").unwrap();
            done.sync_all().unwrap();
        }
        10_000
    });
    std::thread::sleep(Duration::from_secs(4));
    c.kill_all();
    let attempted = writer.join().unwrap();
    let acked: Vec<u64> = fs::read_to_string(&journal).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert!(acked.len() >= 4, "workload too slow to test anything: {} files acknowledged", acked.len());
    assert!(attempted < 10_000, "the workload finished before the crash");

    c.restart();
    let m = c.mount();
    for i in &acked {
        let got = fs::read(m.join(format!("w/f{i}"))).unwrap_or_else(|e| panic!("fsynced file f{i} lost: {e}"));
        assert!(got == content(*i), "fsynced file f{i} has wrong content ({} bytes)", got.len());
    }
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "fsck after crash: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_corrupt_chunk_is_never_served() {
    let Some(mut c) = cluster(1) else { return };
    let m = c.mount();
    fs::write(m.join("victim"), b"precious bytes that will rot on disk").unwrap();
    let chunk = only_file(&c.node_dir("node0").join("chunks"));
    fs::write(m.join("bystander"), b"unaffected").unwrap();
    let mut bytes = fs::read(&chunk).unwrap();
    bytes[3] ^= 0x40;
    fs::write(&chunk, bytes).unwrap();

    // A fresh mount has no cached copy: it must get EIO, not rotten bytes.
    let fresh = c.mount();
    let mut buf = Vec::new();
    let err = File::open(fresh.join("victim")).unwrap().read_to_end(&mut buf).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(fs::read(fresh.join("bystander")).unwrap(), b"unaffected");
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert_eq!(out.status.code(), Some(1), "fsck must fail on a corrupt chunk");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("corrupt"), "fsck report does not name the damage: {report}");
}

/// A copy missing with another intact: fsck says degraded and exits 3, neither clean
/// (0) nor damaged (1), as Ceph's HEALTH_WARN.
#[test]
fn fsck_calls_a_missing_copy_degraded() {
    let Some(mut c) = cluster(2) else { return };
    fs::write(c.mount().join("two copies"), b"held by both nodes").unwrap();
    fs::remove_file(only_file(&c.node_dir("node1").join("chunks"))).unwrap();
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{report}");
    assert!(report.contains("MISSING COPY") && report.contains("fsck: degraded"), "{report}");
}

fn only_file(dir: &Path) -> PathBuf {
    let mut found = Vec::new();
    for sub in fs::read_dir(dir).unwrap() {
        for f in fs::read_dir(sub.unwrap().path()).unwrap() {
            found.push(f.unwrap().path());
        }
    }
    assert_eq!(found.len(), 1, "expected exactly one chunk, found {found:?}");
    found.pop().unwrap()
}

/// `locus status` asks every mount for its workers on the mount's own connection to meta
/// (server push); the mount answers while a writer keeps that connection busy.
#[test]
fn meta_pushes_to_a_busy_mount_and_the_mount_answers() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let Some(mut c) = cluster(1) else { return };
    let m = c.mount();
    let (stop, written) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, written, dir) = (stop.clone(), written.clone(), m.clone());
        std::thread::spawn(move || {
            for i in 0..20_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                fs::write(dir.join(format!("f{i}")), content(i % 2)).unwrap();
                written.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = written.load(Ordering::Relaxed);
    for round in 0..20 {
        std::thread::sleep(Duration::from_millis(50));
        let out = c.locus(&["status", "--meta", &c.meta.addr]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mount_rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("session ")).collect();
        for worker in [" session ", " compaction "] {
            assert!(
                mount_rows.iter().any(|l| l.contains(worker)),
                "round {round}: the mount did not report its{worker}worker:\n{text}"
            );
        }
    }
    let during = written.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(during > 5, "the mount was not under load while meta pushed ({during} files written)");
}

/// A node started while its meta is down waits for it and registers once it is back
/// (it exited at once with "meta ... unreachable", before: issue 38).
#[test]
fn a_node_started_before_its_meta_waits_for_it() {
    let Some(mut c) = cluster(0) else { return };
    c.admit("node0");
    let _ = c.meta.child.kill();
    let _ = c.meta.child.wait();
    c.add_pending_node("node0", "default", &[]);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let node = &mut c.nodes[0].child;
    assert!(node.try_wait().unwrap().is_none(), "the node exited while its meta was down");
    c.restart_meta();
    c.wait_for_nodes(1);
}
