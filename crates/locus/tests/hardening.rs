//! The small things users hit, on real processes and real mounts: Ctrl-C on a busy
//! `locus up`, a dead mount left behind, `locus status` finding `locus up` without
//! flags, quiet ioctls, EIO for a chunk lost on every node, and `locus up`'s in-process
//! reads of its node's store (right bytes, never a corrupt chunk).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use testkit::{Cluster, Proc};

const BIN: &str = env!("CARGO_BIN_EXE_locus");

fn can_mount() -> bool {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return false;
    }
    true
}

/// A `locus up` environment: its own HOME (where the per-user record goes), data
/// directory, mount point and ports picked at run time.
struct UpEnv {
    dir: tempfile::TempDir,
    meta: String,
    node: String,
}

impl UpEnv {
    fn new() -> UpEnv {
        let dir = tempfile::Builder::new().prefix("locus-up-").tempdir().expect("temp dir");
        fs::create_dir_all(dir.path().join("home")).unwrap();
        fs::create_dir_all(dir.path().join("mnt")).unwrap();
        let meta = testkit::free_addr();
        let node = std::iter::repeat_with(testkit::free_addr).find(|a| *a != meta).unwrap();
        UpEnv { dir, meta, node }
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("up.log")
    }

    /// `locus` with this environment's HOME.
    fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("HOME", self.dir.path().join("home")).env_remove("XDG_STATE_HOME");
        cmd
    }

    /// Starts `locus up` and waits until it has mounted.
    fn up(&self) -> Proc {
        let _ = fs::remove_file(self.log());
        let mut cmd = self.command();
        cmd.arg("up").arg(self.mnt()).arg("--data-dir").arg(self.dir.path().join("data"));
        cmd.args(["--meta-listen", &self.meta, "--node-listen", &self.node]);
        testkit::spawn_command(cmd, "locus mounted on", &self.log())
    }

    fn log_text(&self) -> String {
        fs::read_to_string(self.log()).unwrap_or_default()
    }
}

impl Drop for UpEnv {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.mnt()).stderr(Stdio::null()).status();
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill takes plain integers; the pid is our child's, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

fn stat_errno(path: &Path) -> Option<i32> {
    fs::metadata(path).err().and_then(|e| e.raw_os_error())
}

fn mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts.lines().any(|l| l.split(' ').nth(4) == Some(&*path.to_string_lossy()))
}

#[test]
fn ctrl_c_on_a_busy_up_detaches_lazily_and_exits_non_zero() {
    if !can_mount() {
        return;
    }
    let env = UpEnv::new();
    let mut up = env.up();
    // A shell sitting in the mount.
    let mut sitter = Command::new("sleep").arg("60").current_dir(env.mnt()).spawn().unwrap();
    signal(&up.child, libc::SIGINT);
    let status = testkit::exits_within(&mut up.child, Duration::from_secs(20), "locus up");
    let _ = sitter.kill();
    let _ = sitter.wait();
    let log = env.log_text();
    assert!(!status.success(), "exit status {status} after a lazy unmount; log:\n{log}");
    assert!(log.contains("busy") && log.contains("detached it lazily"), "{log}");
    assert_eq!(log.matches("detached it lazily").count(), 1, "error printed more than once:\n{log}");
    assert!(!mounted(&env.mnt()), "{} is still mounted", env.mnt().display());
}

#[test]
fn up_restarts_over_a_dead_mount_and_status_finds_it_without_flags() {
    if !can_mount() {
        return;
    }
    let env = UpEnv::new();
    let mut up = env.up();
    fs::write(env.mnt().join("kept"), b"before the crash").unwrap();
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    assert_eq!(stat_errno(&env.mnt()), Some(libc::ENOTCONN), "killing `locus up` did not leave a dead mount");

    let mut up = env.up();
    assert!(env.log_text().contains("cleared a dead mount"), "{}", env.log_text());
    assert_eq!(fs::read(env.mnt().join("kept")).unwrap(), b"before the crash");

    // A file just written shows in the node's row at once (asked of the node, not
    // waiting for its next heartbeat to meta).
    fs::write(env.mnt().join("fresh"), b"one more chunk").unwrap();
    // No --meta: the address comes from the record `locus up` left in HOME.
    let out = env.command().arg("status").env_remove("LOCUS_LOG").stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("meta {}", env.meta)), "{stdout}");
    let row: Vec<&str> =
        stdout.lines().find(|l| l.starts_with("  local ")).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row.get(7), Some(&"2"), "the node holds two chunks, now: {stdout}");
    // A command a person reads prints its answer, not the service's log lines.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("INFO"), "status logged beside its answer: {stderr}");

    signal(&up.child, libc::SIGINT);
    let status = testkit::exits_within(&mut up.child, Duration::from_secs(20), "locus up");
    assert!(status.success(), "clean stop failed: {status}; log:\n{}", env.log_text());
    let record = env.dir.path().join("home/.local/state/locus/local-cluster.toml");
    assert!(!record.exists(), "{} outlived `locus up`", record.display());
}

/// `locus up`'s mount reads its node's chunk store in process (no node, no TLS in
/// between): a fresh process reads the right bytes, and a chunk file that rotted on disk
/// is EIO, never served.
#[test]
fn up_reads_its_store_in_process_and_never_serves_a_corrupt_chunk() {
    if !can_mount() {
        return;
    }
    let env = UpEnv::new();
    let mut up = env.up();
    // Large enough for the pooled-buffer path, not a multiple of a block; and a small file.
    let big: Vec<u8> = (0..(5u32 << 20) + 1234).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(env.mnt().join("big"), &big).unwrap();
    fs::write(env.mnt().join("victim"), b"precious bytes that will rot on disk").unwrap();
    signal(&up.child, libc::SIGINT);
    assert!(testkit::exits_within(&mut up.child, Duration::from_secs(20), "locus up").success());

    let store = env.dir.path().join("data/chunks/chunks");
    let mut small = Vec::new();
    for fan in fs::read_dir(&store).unwrap() {
        for f in fs::read_dir(fan.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            if fs::metadata(&path).unwrap().len() < 100 {
                small.push(path);
            }
        }
    }
    assert_eq!(small.len(), 1, "one small chunk: {small:?}");
    let mut rotten = fs::read(&small[0]).unwrap();
    rotten[3] ^= 0x40;
    fs::write(&small[0], rotten).unwrap();

    // A new process: nothing cached in memory, every chunk comes from the store.
    let mut up = env.up();
    assert!(fs::read(env.mnt().join("big")).unwrap() == big, "the big file read back wrong");
    let err = fs::read(env.mnt().join("victim")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    signal(&up.child, libc::SIGINT);
    testkit::exits_within(&mut up.child, Duration::from_secs(20), "locus up");
}

#[test]
fn a_taken_port_names_its_flag() {
    let env = UpEnv::new();
    // Held from the start (a port found free and released could be taken by any process
    // before the test binds it again); meta's port is the OS's pick, so it cannot clash.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let node = taken.local_addr().unwrap().to_string();
    let mut cmd = env.command();
    cmd.arg("up").arg(env.mnt()).arg("--data-dir").arg(env.dir.path().join("data"));
    let out = cmd.args(["--meta-listen", "127.0.0.1:0", "--node-listen", &node]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&node) && stderr.contains("--node-listen"), "{stderr}");
    assert_eq!(stderr.matches("cannot listen").count(), 1, "error printed more than once:\n{stderr}");
}

#[test]
fn unimplemented_ioctl_is_enotty_and_not_logged() {
    if !can_mount() {
        return;
    }
    let mut c = Cluster::start(Path::new(BIN), 1);
    let m = c.mount();
    let f = File::create(m.join("f")).unwrap();
    let mut termios = [0u8; 64];
    for _ in 0..20 {
        // SAFETY: TCGETS writes a termios (60 bytes) into the 64-byte buffer; `f` keeps
        // the descriptor open.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
        assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENOTTY)));
    }
    drop(f);
    let log = fs::read_to_string(c.path().join("mount0.log")).unwrap();
    assert!(!log.contains("ioctl"), "ioctl logged:\n{log}");
}

#[test]
fn a_chunk_lost_on_every_node_reads_as_eio() {
    if !can_mount() {
        return;
    }
    let mut c = Cluster::start(Path::new(BIN), 1);
    let m = c.mount();
    let mut f = File::create(m.join("f")).unwrap();
    f.write_all(&[7u8; 100_000]).unwrap();
    if let Err(e) = f.sync_all() {
        let log = |name: &str| fs::read_to_string(c.path().join(name)).unwrap_or_default();
        panic!(
            "fsync: {e}\nmount log:\n{}\nnode log:\n{}\nmeta log:\n{}",
            log("mount0.log"),
            log("node0.log"),
            log("meta.log")
        );
    }
    drop(f);
    c.kill_all();
    let mut removed = 0;
    for fan in fs::read_dir(c.node_dir("node0").join("chunks")).unwrap() {
        for chunk in fs::read_dir(fan.unwrap().path()).unwrap() {
            fs::remove_file(chunk.unwrap().path()).unwrap();
            removed += 1;
        }
    }
    let tree = Command::new("find").arg(c.node_dir("node0")).output().unwrap();
    assert!(removed > 0, "no chunk files found to remove:\n{}", String::from_utf8_lossy(&tree.stdout));
    c.restart();
    let m = c.mount();
    let mut buf = Vec::new();
    let err = File::open(m.join("f")).unwrap().read_to_end(&mut buf).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The name is still there: only the data is lost.
    assert_eq!(fs::metadata(m.join("f")).unwrap().len(), 100_000);
}
