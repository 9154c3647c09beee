//! Nothing durable lives only in meta's memory: byte-range locks and open-file records
//! survive a restart of meta (SIGKILL, then the same database), on SQLite and on
//! PostgreSQL, with real processes and FUSE mounts.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;
use testkit::Cluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// fcntl F_SETLK of the whole file: 0 or the errno.
fn try_lock(f: &File, kind: i32) -> i32 {
    // SAFETY: flock is a plain C struct for which all zeroes is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: `fl` is a valid flock that outlives the call; `f` keeps the descriptor open.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

fn locks_and_opens_survive_a_meta_restart(mut c: Cluster) {
    let a = c.mount();
    let b = c.mount();
    fs::write(a.join("locked"), b"shared").unwrap();
    let doomed = testkit::pattern(300_000, 9);
    fs::write(a.join("doomed"), &doomed).unwrap();
    let held = OpenOptions::new().read(true).write(true).open(a.join("locked")).unwrap();
    assert_eq!(try_lock(&held, libc::F_WRLCK), 0);
    let mut keep = File::open(a.join("doomed")).unwrap();
    fs::remove_file(b.join("doomed")).unwrap();

    c.restart_meta();
    // Past the session expiry (6 s) and a reaper pass: an orphan whose open record
    // lived only in memory would be gone by now.
    std::thread::sleep(Duration::from_secs(8));
    let contender = OpenOptions::new().read(true).write(true).open(b.join("locked")).unwrap();
    assert_eq!(try_lock(&contender, libc::F_WRLCK), libc::EAGAIN, "the lock is held across the restart");
    let attr = keep.metadata().expect("the unlinked but open file is still there");
    assert_eq!(attr.len(), doomed.len() as u64);
    let mut got = Vec::new();
    keep.read_to_end(&mut got).unwrap();
    assert!(got == doomed, "the unlinked but open file reads back whole");

    drop(held);
    // close(2) released a's lock; b may take it now (retry: the release travels on).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while try_lock(&contender, libc::F_WRLCK) != 0 {
        assert!(std::time::Instant::now() < deadline, "the lock was never released");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(keep);
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn sqlite_locks_and_opens_survive_a_meta_restart() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    locks_and_opens_survive_a_meta_restart(Cluster::start(bin(), 1));
}

#[test]
fn postgres_locks_and_opens_survive_a_meta_restart() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let server = testkit::postgres::PgServer::start();
    locks_and_opens_survive_a_meta_restart(Cluster::start_on_db(bin(), 1, &server.create_database()));
}
