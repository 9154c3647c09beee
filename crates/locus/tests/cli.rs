//! The command line refuses bad input with a clear message and a non-zero exit.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use testkit::Cluster;

fn locus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_locus")).args(args).stdin(Stdio::null()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_command_has_help() {
    for cmd in ["up", "meta", "node", "mount", "status", "fsck", "gc", "nbd", "doctor"] {
        let o = locus(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help failed");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("--config"), "{cmd} --help does not offer --config:\n{text}");
    }
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let bash = locus(&["completions", "bash"]);
    assert!(bash.status.success(), "{}", stderr(&bash));
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), &bash.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(script.path()).output().unwrap();
    assert!(check.status.success(), "bash -n: {}", stderr(&check));
    assert!(String::from_utf8_lossy(&bash.stdout).contains("--export"), "the script offers no nbd flags");
    assert!(!locus(&["completions", "tcsh"]).status.success(), "an unknown shell was accepted");

    let dir = tempfile::tempdir().unwrap();
    let man = locus(&["man", dir.path().to_str().unwrap()]);
    assert!(man.status.success(), "{}", stderr(&man));
    for page in ["locus.1", "locus-mount.1", "locus-nbd.1", "locus-ca-issue.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is not a man page:\n{text}");
    }
}

/// deploy/systemd/'s units as systemd reads them: `systemd-analyze verify` finds nothing
/// to say (each with its ExecStart pointed at this build, the mount's for one instance).
#[test]
fn the_systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().replace("@.service", "@mnt-locus.service");
        let text = std::fs::read_to_string(&path).unwrap().replace("/usr/local/bin/locus", env!("CARGO_BIN_EXE_locus"));
        std::fs::write(dir.path().join(&name), text).unwrap();
        names.push(name);
    }
    assert!(names.len() >= 4, "{names:?}");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&names)
        .current_dir(dir.path())
        .output()
        .expect("systemd-analyze (package systemd) is needed");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
}

#[test]
fn unreachable_meta_is_named() {
    // Port 1 on loopback: nothing listens there.
    let o = locus(&["status", "--meta", "127.0.0.1:1", "--insecure-no-tls"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("127.0.0.1:1") && stderr(&o).contains("unreachable"), "{}", stderr(&o));
}

#[test]
fn bad_sizes_and_config_files_are_refused() {
    let o = locus(&["node", "--data-dir", "/tmp/x", "--capacity", "12Q"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown size unit"), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "this is = = not toml").unwrap();
    let o = locus(&["--config", cfg.to_str().unwrap(), "status"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not valid TOML"), "{}", stderr(&o));
}

#[test]
fn config_file_supplies_defaults_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("locus.toml");
    std::fs::write(&cfg, "[status]\nmeta = \"127.0.0.1:2\"\n").unwrap();
    let o = locus(&["--config", cfg.to_str().unwrap(), "status", "--insecure-no-tls"]);
    assert!(stderr(&o).contains("127.0.0.1:2"), "config value not used: {}", stderr(&o));
    let o = locus(&["--config", cfg.to_str().unwrap(), "status", "--meta", "127.0.0.1:3", "--insecure-no-tls"]);
    assert!(stderr(&o).contains("127.0.0.1:3"), "flag did not win: {}", stderr(&o));
}

#[test]
fn mountpoint_missing_or_busy_and_duplicate_node_ids_are_refused() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 1);
    let client = c.cert("client", "client-default", "default");
    let with = |args: &[&str], tls: &[String]| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend_from_slice(tls);
        Command::new(env!("CARGO_BIN_EXE_locus")).args(&all).stdin(Stdio::null()).output().unwrap()
    };
    let o = with(&["mount", "/nonexistent/locus-mnt", "--meta", &c.meta.addr], &client);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let m = c.mount();
    let o = with(&["mount", m.to_str().unwrap(), "--meta", &c.meta.addr], &client);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("busy"), "{}", stderr(&o));
    // Starts a node that must fail, returning its error output.
    let node = |dir: &std::path::Path, id: &str| {
        let args = [
            "node",
            "--listen",
            "127.0.0.1:0",
            "--meta",
            &c.meta.addr,
            "--data-dir",
            dir.to_str().unwrap(),
            "--id",
            id,
        ];
        let o = with(&args, &c.cert("node", id, "default"));
        assert!(!o.status.success(), "node {id} started");
        stderr(&o)
    };
    // A second store claiming node0's id while node0 is alive.
    let err = node(&c.path().join("impostor"), "node0");
    assert!(err.contains("node id \"node0\": another node is already registered"), "{err}");
    // A data directory another node holds.
    assert!(
        stderr(&locus(&["node", "--data-dir", "/tmp/x"])).contains("needs a certificate"),
        "a node without a certificate must be refused"
    );
    let err = node(&c.node_dir("node0"), "node9");
    assert!(err.contains("in use by another process"), "{err}");
}

#[test]
fn unwritable_data_directory_is_named() {
    let o = locus(&["up", "/tmp", "--data-dir", "/proc/locus-cannot-be-here"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/proc/locus-cannot-be-here"), "{}", stderr(&o));
}

/// `mount -t fuse.locus META DIR -o OPTIONS` (and an fstab line) runs
/// `/sbin/mount.fuse.locus`, a link to the binary: it returns once mounted and leaves
/// the mount served in the background until `umount`; a mount that cannot start says
/// why and leaves nothing running; `-f` (a fake mount) does nothing.
#[test]
fn the_mount_helper_mounts_in_the_background_and_says_why_not() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 1);
    let tls = c.cert("client", "client-default", "default");
    let scratch = tempfile::tempdir().unwrap();
    let helper = scratch.path().join("mount.fuse.locus");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_locus"), &helper).unwrap();
    let (mnt, log) = (scratch.path().join("mnt"), scratch.path().join("mount.log"));
    std::fs::create_dir(&mnt).unwrap();
    // As fstab gives them: generic options beside Locus's, the certificates among them.
    let options =
        format!("rw,_netdev,nofail,site=default,log={},ca={},cert={},key={}", log.display(), tls[1], tls[3], tls[5]);
    let helper_run = |meta: &str, extra: &str| {
        let options = format!("{options}{extra}");
        let args = [meta, mnt.to_str().unwrap(), "-o", options.as_str()];
        let started = std::time::Instant::now();
        let out = Command::new(&helper).args(args).stdin(Stdio::null()).output().unwrap();
        (out, started.elapsed())
    };
    let mounted = || std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(mnt.to_str().unwrap());
    let (out, _) = helper_run(&c.meta.addr, "");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && said.contains("locus mounted on"), "{said} {}", stderr(&out));
    assert!(mounted());
    std::fs::write(mnt.join("through-the-helper"), b"fstab").unwrap();
    let other = c.mount();
    assert_eq!(std::fs::read(other.join("through-the-helper")).unwrap(), b"fstab");
    // umount stops it.
    let pid: u32 = said.rsplit("process ").next().unwrap().trim_end_matches([')', '\n']).parse().unwrap();
    let o = Command::new("fusermount3").arg("-u").arg(&mnt).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let gone = std::time::Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(gone.elapsed() < std::time::Duration::from_secs(15), "the mount's process outlived its umount");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(std::fs::read_to_string(&log).unwrap().contains("unmounted"), "its log went to log=");
    // Nothing to mount: said, bounded, nothing left running or mounted.
    let (out, took) = helper_run("127.0.0.1:1", ",rpc_timeout=3s");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cannot reach meta at 127.0.0.1:1"), "{}", stderr(&out));
    assert!(took < std::time::Duration::from_secs(40), "{took:?}");
    assert!(!mounted());
    let (out, _) = helper_run(&c.meta.addr, ",sitte=a");
    assert!(!out.status.success() && stderr(&out).contains("unknown mount option"), "{}", stderr(&out));
    let fake = Command::new(&helper).args([&c.meta.addr, mnt.to_str().unwrap(), "-f"]).output().unwrap();
    assert!(fake.status.success(), "{}", stderr(&fake));
    assert!(!mounted());
}

/// `locus doctor` checks what a host's roles need and says what to fix, its exit code
/// telling all well (0), something to watch (3) and something wrong (1); nothing it
/// checks is changed.
#[test]
fn doctor_says_what_is_wrong_with_a_host_and_how_to_fix_it() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse (the doctor checks FUSE first)");
        return;
    }
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 1);
    let tls = c.cert("client", "doctor", "default");
    let doctor = |extra: &[&str], tls: &[String]| {
        let mut args: Vec<String> = ["doctor", "--timeout", "5s"].iter().map(|s| s.to_string()).collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend_from_slice(tls);
        let o = Command::new(env!("CARGO_BIN_EXE_locus")).args(&args).stdin(Stdio::null()).output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free_addr = free.local_addr().unwrap().to_string();
    drop(free);
    let (code, said) = doctor(&["--meta", &c.meta.addr, "--listen", &free_addr], &tls);
    assert_eq!(code, Some(0), "{said}");
    for line in [
        "ok    FUSE",
        "ok    certificate",
        "doctor (client of site default)",
        "ok    meta",
        "ok    clock",
        "nothing to fix",
    ] {
        assert!(said.contains(line), "{line:?} missing:\n{said}");
    }
    // From a config file alone: the meta a mount of this host uses, reached with the
    // mount's certificate.
    let config = tempfile::NamedTempFile::new().unwrap();
    let toml =
        format!("[mount]\nmeta = {:?}\nca = {:?}\ncert = {:?}\nkey = {:?}\n", c.meta.addr, tls[1], tls[3], tls[5]);
    std::fs::write(config.path(), toml).unwrap();
    let (code, said) = doctor(&["--config", config.path().to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("ok    meta") && said.contains("ok    certificate"), "{said}");
    // A port in use is worth a look; a meta that is not there, a database that is not
    // one and a certificate past its end are wrong, each said with what to do.
    let (code, said) = doctor(&["--listen", &c.meta.addr], &tls);
    assert_eq!(code, Some(3), "{said}");
    assert!(said.contains("WARN  listen") && said.contains("in use"), "{said}");
    let not_a_db = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_a_db.path(), b"not a database").unwrap();
    let (code, said) = doctor(&["--meta", "127.0.0.1:1", "--db", not_a_db.path().to_str().unwrap()], &tls);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("FAIL  meta 127.0.0.1:1: unreachable"), "{said}");
    assert!(said.contains("FAIL  database"), "{said}");
    assert_eq!(std::fs::read(not_a_db.path()).unwrap(), b"not a database", "the doctor changed it");
    let dir = c.tls_dir();
    let issue = Command::new(env!("CARGO_BIN_EXE_locus"))
        .args(["ca", "issue", "--role", "client", "--name", "stale", "--site", "default", "--days", "0", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(issue.status.success(), "{}", stderr(&issue));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let stale: Vec<String> = ["--ca", "ca.pem", "--cert", "stale.pem", "--key", "stale.key"]
        .chunks(2)
        .flat_map(|p| [p[0].to_string(), dir.join(p[1]).display().to_string()])
        .collect();
    let (code, said) = doctor(&[], &stale);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("FAIL  certificate") && said.contains("expired") && said.contains("locus ca issue"),
        "{said}"
    );
}
