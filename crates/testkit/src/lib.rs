//! Real Locus clusters for tests: `locus meta`, `locus node` and `locus mount` as
//! separate processes on loopback, with their state in a temporary directory. Every
//! wait is bounded; everything is killed and unmounted on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A role process and the address it announced.
pub struct Proc {
    pub child: Child,
    pub addr: String,
    args: Vec<String>,
}

/// A cluster of real processes sharing one temporary directory.
pub struct Cluster {
    bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub meta: Proc,
    pub nodes: Vec<Proc>,
    pub mounts: Vec<(PathBuf, Proc)>,
}

/// Starts `bin` with `args` and waits (bounded) for a stdout line starting with
/// `prefix`; returns the rest of that line.
fn spawn_and_wait(bin: &Path, args: &[String], prefix: &str, log: &Path) -> Proc {
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open log file");
    let mut child = Command::new(bin)
        .args(args)
        .env("LOCUS_LOG", "warn,meta=info,node=info,locus=info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut announced = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !announced && let Some(rest) = line.strip_prefix(&prefix) {
                announced = true;
                let _ = tx.send(rest.trim().to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(addr) => Proc { child, addr, args: args.to_vec() },
        Err(_) => {
            let _ = child.kill();
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("`locus {}` did not start within 30 s; its log:\n{log}", args.join(" "));
        }
    }
}

impl Cluster {
    /// Meta plus `nodes` storage nodes, all on 127.0.0.1 with ports picked by the OS.
    pub fn start(bin: &Path, nodes: usize) -> Cluster {
        Self::start_with(bin, nodes, &[])
    }

    /// Like `start`, with extra `locus meta` flags (short timeouts, ...).
    pub fn start_with(bin: &Path, nodes: usize, meta_extra: &[&str]) -> Cluster {
        let dir = tempfile::Builder::new().prefix("locus-test-").tempdir().expect("temp dir");
        let db = dir.path().join("meta.db");
        let args = vec![
            "meta".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--db".into(),
            db.display().to_string(),
            "--session-expiry-secs".into(),
            "6".into(),
        ];
        let args: Vec<String> = args.into_iter().chain(meta_extra.iter().map(|s| s.to_string())).collect();
        let meta = spawn_and_wait(bin, &args, "locus meta listening on", &dir.path().join("meta.log"));
        let mut cluster = Cluster { bin: bin.to_path_buf(), dir, meta, nodes: Vec::new(), mounts: Vec::new() };
        for i in 0..nodes {
            cluster.add_node(&format!("node{i}"), "default");
        }
        cluster.wait_for_nodes(nodes);
        cluster
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn node_dir(&self, id: &str) -> PathBuf {
        self.path().join(format!("{id}-chunks"))
    }

    pub fn add_node(&mut self, id: &str, site: &str) {
        self.add_node_with(id, site, &[]);
    }

    /// Starts a node with extra `locus node` flags (cache size, failpoints, ...).
    pub fn add_node_with(&mut self, id: &str, site: &str, extra: &[&str]) {
        let mut args: Vec<String> = vec![
            "node".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--meta".into(),
            self.meta.addr.clone(),
            "--data-dir".into(),
            self.node_dir(id).display().to_string(),
            "--id".into(),
            id.into(),
            "--site".into(),
            site.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.path().join(format!("{id}.log"));
        self.nodes.push(spawn_and_wait(&self.bin, &args, "locus node listening on", &log));
    }

    /// Waits until meta lists `n` nodes (bounded).
    pub fn wait_for_nodes(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.locus(&["status", "--meta", &self.meta.addr]);
            let listed = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(" 127.0.0.1:")).count();
            if out.status.success() && listed >= n {
                return;
            }
            assert!(Instant::now() < deadline, "only {listed} of {n} nodes registered within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Mounts the namespace at a new directory and returns it.
    pub fn mount(&mut self) -> PathBuf {
        self.mount_at("default")
    }

    /// Mounts the namespace as a client of `site`.
    pub fn mount_at(&mut self, site: &str) -> PathBuf {
        self.mount_with(site, &[])
    }

    /// Mounts the namespace as a client of `site` with extra `locus mount` flags.
    pub fn mount_with(&mut self, site: &str, extra: &[&str]) -> PathBuf {
        let n = self.mounts.len();
        let mountpoint = self.path().join(format!("mnt{n}"));
        std::fs::create_dir_all(&mountpoint).expect("create mount point");
        let mut args: Vec<String> = vec![
            "mount".into(),
            mountpoint.display().to_string(),
            "--meta".into(),
            self.meta.addr.clone(),
            "--cache".into(),
            "64M".into(),
            "--site".into(),
            site.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.path().join(format!("mount{n}.log"));
        let proc = spawn_and_wait(&self.bin, &args, "locus mounted on", &log);
        self.mounts.push((mountpoint.clone(), proc));
        mountpoint
    }

    /// Runs a `locus` command to completion (bounded by its own timeouts).
    pub fn locus(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin).args(args).stdin(Stdio::null()).output().expect("run locus")
    }

    /// SIGKILLs every process at once, as a crash would, and clears dead mounts.
    pub fn kill_all(&mut self) {
        for (_, p) in &mut self.mounts {
            let _ = p.child.kill();
        }
        let _ = self.meta.child.kill();
        for p in &mut self.nodes {
            let _ = p.child.kill();
        }
        for (m, p) in &mut self.mounts {
            let _ = p.child.wait();
            lazy_unmount(m);
        }
        let _ = self.meta.child.wait();
        for p in &mut self.nodes {
            let _ = p.child.wait();
        }
        self.mounts.clear();
    }

    /// Starts meta and every node again with their old arguments and state; node
    /// addresses are re-announced (ports may change).
    pub fn restart(&mut self) {
        let meta_args = self.meta.args.clone();
        // Same port as before, so that restarted nodes and mounts find meta.
        let mut args = meta_args.clone();
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            args[i + 1] = self.meta.addr.clone();
        }
        self.meta = spawn_and_wait(&self.bin, &args, "locus meta listening on", &self.path().join("meta.log"));
        let node_args: Vec<Vec<String>> = self.nodes.iter().map(|p| p.args.clone()).collect();
        self.nodes.clear();
        for mut args in node_args {
            if let Some(i) = args.iter().position(|a| a == "--meta") {
                args[i + 1] = self.meta.addr.clone();
            }
            let id = args.iter().position(|a| a == "--id").map(|i| args[i + 1].clone()).unwrap_or_default();
            let log = self.path().join(format!("{id}.log"));
            self.nodes.push(spawn_and_wait(&self.bin, &args, "locus node listening on", &log));
        }
        self.wait_for_nodes(self.nodes.len());
    }

    /// Unmounts mount `i` the way a user would and waits for its process to exit.
    pub fn unmount(&mut self, i: usize) {
        let (m, mut p) = self.mounts.remove(i);
        let status = Command::new("fusermount3").arg("-u").arg(&m).status();
        if !matches!(status, Ok(s) if s.success()) {
            lazy_unmount(&m);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = p.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
}

fn lazy_unmount(m: &Path) {
    let _ = Command::new("umount").arg("-l").arg(m).stderr(Stdio::null()).status();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        while !self.mounts.is_empty() {
            self.unmount(0);
        }
        let _ = self.meta.child.kill();
        let _ = self.meta.child.wait();
        for p in &mut self.nodes {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// Whether this process may mount FUSE file systems (tests skip loudly otherwise).
pub fn can_mount() -> bool {
    Path::new("/dev/fuse").exists() && unsafe { libc::geteuid() } == 0
}

pub mod netns;
pub mod wan;

pub use netns::{WanConfig, WanLink};
