//! Real Locus clusters for tests: `locus meta`, `locus node` and `locus mount` as
//! separate processes on loopback (or, with `Cluster::start_in_sites`, each in the
//! network namespace of its site on a `WanLink`), with their state in a temporary directory. Every
//! cluster has its own CA (`locus ca init`) and every process its own certificate
//! (`locus ca issue`), so every test runs over mutual TLS. Every wait is bounded;
//! everything is killed and unmounted on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A role process and the address it announced.
pub struct Proc {
    /// The running process.
    pub child: Child,
    /// What it announced on stdout after the ready prefix (its address, for roles).
    pub addr: String,
    args: Vec<String>,
    /// The network namespace it runs in (`None`: the test's own, loopback).
    ns: Option<String>,
}

/// A cluster of real processes sharing one temporary directory.
pub struct Cluster {
    bin: PathBuf,
    /// Every process's state and logs (`meta.log`, `node0.log`, `mount0.log`, ...).
    pub dir: tempfile::TempDir,
    /// The metadata service.
    pub meta: Proc,
    /// The storage nodes, in start order.
    pub nodes: Vec<Proc>,
    /// Mount points and their `locus mount` processes.
    pub mounts: Vec<(PathBuf, Proc)>,
    /// Further `locus meta` processes over the same database (PostgreSQL), one per
    /// site, from `add_meta`.
    pub other_metas: Vec<Proc>,
    /// Fail points armed in the processes started until the next `arm` or `restart`.
    failpoints: Option<String>,
    /// Site name -> (namespace, address) when processes run in WAN site namespaces.
    sites_ns: Vec<(String, String, String)>,
}

/// `args` without each flag of `dropped` and the value after it.
fn without_flags(args: &[String], dropped: &[&str]) -> Vec<String> {
    let mut kept = Vec::with_capacity(args.len());
    let mut skip = false;
    for a in args {
        if std::mem::take(&mut skip) {
            continue;
        }
        if dropped.contains(&a.as_str()) {
            skip = true;
            continue;
        }
        kept.push(a.clone());
    }
    kept
}

/// Starts `bin` with `args` and waits (bounded) for a stdout line starting with
/// `prefix`; returns the rest of that line.
/// `failpoints` arms crash points in the new process (see `util::failpoint`).
/// `ns` is the network namespace to start it in (`None`: this process's own).
fn spawn_and_wait(
    bin: &Path,
    ns: Option<&str>,
    args: &[String],
    prefix: &str,
    log: &Path,
    failpoints: Option<&str>,
) -> Proc {
    let mut cmd = command_in(ns, bin);
    cmd.args(args).env("LOCUS_LOG", "warn,meta=info,node=info,locus=info");
    if let Some(armed) = failpoints {
        cmd.env("FAILPOINTS", armed);
    }
    let proc = spawn_command(cmd, prefix, log);
    Proc { args: args.to_vec(), ns: ns.map(String::from), ..proc }
}

/// A command running `bin` in network namespace `ns`. `nsenter --net` (not `ip netns
/// exec`, which also unshares the mount namespace) so a FUSE mount stays visible to
/// the test, and it execs `bin` in place, so the child's pid is `bin`'s own. Tests use
/// it for processes of their own at a site (`Cluster::place` names the namespace).
pub fn command_in(ns: Option<&str>, bin: &Path) -> Command {
    match ns {
        None => Command::new(bin),
        Some(ns) => {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net=/run/netns/{ns}")).arg(bin);
            cmd
        }
    }
}

/// Starts `cmd` (its stderr appended to `log`) and waits (bounded) for a stdout line
/// starting with `prefix`; the rest of that line is the returned `Proc`'s `addr`.
pub fn spawn_command(mut cmd: Command, prefix: &str, log: &Path) -> Proc {
    let stderr = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open log file");
    let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", cmd.get_program().to_string_lossy()));
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
        Ok(addr) => Proc { child, addr, args, ns: None },
        Err(_) => {
            let _ = child.kill();
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("`locus {}` did not start within 30 s; its log:\n{log}", args.join(" "));
        }
    }
}

/// Runs a command that must succeed.
fn run_ok(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().expect("run locus");
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The sites tests mount at, whose root meta trusts by default (`--no-root-squash`).
const TRUSTED_SITES: &[&str] = &["default", "a", "b", "c"];

/// Issues (once) a certificate of the CA in `tls`, naming `hosts` (`--host`) if any,
/// and returns its `--ca --cert --key` flags.
fn issue(bin: &Path, tls: &Path, role: &str, name: &str, site: &str, hosts: &[&str]) -> Vec<String> {
    let (cert, key) = (tls.join(format!("{name}.pem")), tls.join(format!("{name}.key")));
    if !cert.exists() {
        let mut cmd = Command::new(bin);
        cmd.args(["ca", "issue", "--role", role, "--name", name, "--site", site, "--dir"]).arg(tls);
        run_ok(cmd.args(hosts.iter().flat_map(|h| ["--host", h])));
    }
    let flag = |f: &str, p: &Path| [f.to_string(), p.display().to_string()];
    [flag("--ca", &tls.join("ca.pem")), flag("--cert", &cert), flag("--key", &key)].concat()
}

/// Waits (bounded) until `done` holds, polling every 100 ms; panics naming `what`.
pub fn wait_until(what: &str, within: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} did not happen within {within:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A free TCP port on 127.0.0.1 (for tests that must pass fixed ports; the OS picks it).
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address").to_string()
}

impl Cluster {
    /// Meta plus `nodes` storage nodes, all on 127.0.0.1 with ports picked by the OS.
    pub fn start(bin: &Path, nodes: usize) -> Cluster {
        Self::launch(bin, nodes, None, &[], None, Vec::new())
    }

    /// Meta alone, in the namespace of `sites[0]`; site `sites[i]` is site `i` of
    /// `link`, and every node and mount of a site (`add_node`, `mount_at`) runs in its
    /// namespace, so traffic between sites crosses the emulated WAN.
    pub fn start_in_sites(bin: &Path, link: &WanLink, sites: &[&str]) -> Cluster {
        Self::start_in_sites_on_db(bin, link, sites, None, &[])
    }

    /// Like `start_in_sites`, with meta over the database at `db_url` (`None`: a SQLite
    /// file) and extra `locus meta` flags.
    pub fn start_in_sites_on_db(
        bin: &Path,
        link: &WanLink,
        sites: &[&str],
        db_url: Option<&str>,
        meta_extra: &[&str],
    ) -> Cluster {
        assert!(sites.len() <= link.sites(), "{} sites on a WAN of {}", sites.len(), link.sites());
        let placed = sites
            .iter()
            .enumerate()
            .map(|(i, s)| (s.to_string(), link.site_ns(i).to_string(), WanLink::addr_of(i).to_string()))
            .collect();
        Self::launch(bin, 0, db_url, meta_extra, None, placed)
    }

    /// Like `start`, with meta over the database at `db_url` (e.g. an empty database of
    /// a `postgres::PgServer`, which meta formats) instead of a SQLite file.
    pub fn start_on_db(bin: &Path, nodes: usize, db_url: &str) -> Cluster {
        Self::launch(bin, nodes, Some(db_url), &[], None, Vec::new())
    }

    /// Like `start_on_db`, with extra `locus meta` flags (e.g. `--read-db`).
    pub fn start_on_db_with(bin: &Path, nodes: usize, db_url: &str, meta_extra: &[&str]) -> Cluster {
        Self::launch(bin, nodes, Some(db_url), meta_extra, None, Vec::new())
    }

    /// Removes `flag` and its value from meta's arguments (from its next start).
    pub fn drop_meta_flag(&mut self, flag: &str) {
        self.meta.args = without_flags(&self.meta.args, &[flag]);
    }

    /// Adds `flag` with `value` to meta's arguments (from its next start).
    pub fn add_meta_flag(&mut self, flag: &str, value: &str) {
        self.meta.args.extend([flag.to_string(), value.to_string()]);
    }

    /// Points meta at another database from its next `restart` on (e.g. one that
    /// `locus meta migrate` filled).
    pub fn use_meta_db(&mut self, db_url: &str) {
        let args = &mut self.meta.args;
        if let Some(i) = args.iter().position(|a| a == "--db") {
            args[i + 1] = db_url.to_string();
        }
    }

    /// Like `start`, with extra `locus meta` flags (short timeouts, ...).
    pub fn start_with(bin: &Path, nodes: usize, meta_extra: &[&str]) -> Cluster {
        Self::launch(bin, nodes, None, meta_extra, None, Vec::new())
    }

    /// Like `start`, with crash points armed in meta and every node (`FAILPOINTS`
    /// syntax, e.g. `chunk-before-rename=3*off->return`); `restart` disarms them.
    pub fn start_armed(bin: &Path, nodes: usize, failpoints: Option<&str>) -> Cluster {
        Self::launch(bin, nodes, None, &[], failpoints, Vec::new())
    }

    fn launch(
        bin: &Path,
        nodes: usize,
        db_url: Option<&str>,
        meta_extra: &[&str],
        failpoints: Option<&str>,
        sites_ns: Vec<(String, String, String)>,
    ) -> Cluster {
        let meta_ns = sites_ns.first().map(|(_, ns, ip)| (ns.clone(), ip.clone()));
        let dir = tempfile::Builder::new().prefix("locus-test-").tempdir().expect("temp dir");
        let db = dir.path().join("meta.db");
        let db = db_url.map_or_else(|| db.display().to_string(), String::from);
        let args = vec![
            "meta".into(),
            "--listen".into(),
            format!("{}:0", meta_ns.as_ref().map_or("127.0.0.1", |(_, ip)| ip)),
            "--db".into(),
            db,
            "--init".into(),
            "--session-expiry-secs".into(),
            "6".into(),
        ];
        let tls = dir.path().join("tls");
        run_ok(Command::new(bin).args(["ca", "init", "--dir"]).arg(&tls));
        // Admin commands (gc, fsck, node admit) use the admin role.
        issue(bin, &tls, "admin", "admin", "default", &[]);
        // Tests run as root on the client hosts of their sites and expect to act as
        // root, unless a test sets `--no-root-squash` itself (to see squashing).
        let trusted = if meta_extra.contains(&"--no-root-squash") { &[][..] } else { TRUSTED_SITES };
        let args: Vec<String> = args
            .into_iter()
            .chain(issue(bin, &tls, "meta", "meta", "default", &[]))
            .chain(["--revoked".to_string(), tls.join("revoked").display().to_string()])
            .chain(trusted.iter().flat_map(|site| ["--no-root-squash".to_string(), site.to_string()]))
            .chain(meta_extra.iter().map(|s| s.to_string()))
            .collect();
        let ns = meta_ns.as_ref().map(|(ns, _)| ns.as_str());
        let meta = spawn_and_wait(bin, ns, &args, "locus meta listening on", &dir.path().join("meta.log"), failpoints);
        let failpoints = failpoints.map(String::from);
        let mut cluster = Cluster {
            bin: bin.to_path_buf(),
            dir,
            meta,
            nodes: Vec::new(),
            mounts: Vec::new(),
            other_metas: Vec::new(),
            failpoints,
            sites_ns,
        };
        for i in 0..nodes {
            cluster.add_node(&format!("node{i}"), "default");
        }
        cluster.wait_for_nodes(nodes);
        if nodes == 1 {
            // One node holds one copy (as under `locus up`): the default's two would
            // leave every chunk short, and fsck would call the cluster degraded.
            cluster.set_root_copies(1);
        }
        cluster
    }

    /// Sets the root's policy to `copies` copies at the writer's site.
    pub fn set_root_copies(&self, copies: u32) {
        let copies = copies.to_string();
        let out = self.locus(&["policy", "set", "/", "--copies", &copies, "--meta", &self.meta.addr]);
        assert!(out.status.success(), "policy set / --copies {copies}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Arms fail points (`FAILPOINTS` syntax) in the processes this cluster starts from
    /// now on, until disarmed with `None` or a `restart`.
    pub fn arm(&mut self, failpoints: Option<&str>) {
        self.failpoints = failpoints.map(String::from);
    }

    /// The cluster's temporary directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Data directory of node `id`.
    pub fn node_dir(&self, id: &str) -> PathBuf {
        self.path().join(format!("{id}-chunks"))
    }

    /// Starts one more node, `id`, at `site`.
    pub fn add_node(&mut self, id: &str, site: &str) {
        self.add_node_with(id, site, &[]);
    }

    /// Starts a node with extra `locus node` flags (cache size, metrics, ...), admitted
    /// first (`locus node admit`).
    pub fn add_node_with(&mut self, id: &str, site: &str, extra: &[&str]) {
        self.admit(id);
        self.start_node(id, site, extra);
    }

    /// Admits node `id` (`locus node admit`), panicking with its output if that fails.
    pub fn admit(&self, id: &str) {
        let out = self.locus(&["node", "admit", id, "--meta", &self.meta.addr]);
        assert!(out.status.success(), "locus node admit {id}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Starts a node that nobody admitted (with extra flags such as `--join-token`):
    /// without a token it waits, listed as pending, until `admit`.
    pub fn add_pending_node(&mut self, id: &str, site: &str, extra: &[&str]) {
        self.start_node(id, site, extra);
    }

    /// Kills node `i` and starts it again with the same arguments and store (it need
    /// not register: a removed node is refused and keeps asking).
    pub fn restart_node(&mut self, i: usize) {
        let _ = self.nodes[i].child.kill();
        let _ = self.nodes[i].child.wait();
        let args = self.nodes[i].args.clone();
        let id = args.iter().position(|a| a == "--id").map(|i| args[i + 1].clone()).unwrap_or_default();
        let (log, ns) = (self.path().join(format!("{id}.log")), self.nodes[i].ns.clone());
        self.nodes[i] = spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus node listening on", &log, None);
    }

    /// Starts `locus node` as `id` and waits until it listens.
    fn start_node(&mut self, id: &str, site: &str, extra: &[&str]) {
        let (ns, ip) = self.place(site);
        let mut args: Vec<String> = vec![
            "node".into(),
            "--listen".into(),
            format!("{ip}:0"),
            "--meta".into(),
            self.meta.addr.clone(),
            "--data-dir".into(),
            self.node_dir(id).display().to_string(),
            "--id".into(),
            id.into(),
            "--site".into(),
            site.into(),
        ];
        args.extend(self.cert("node", id, site));
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.path().join(format!("{id}.log"));
        let armed = self.failpoints.as_deref();
        self.nodes.push(spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus node listening on", &log, armed));
    }

    /// The namespace (`None`: loopback) and listen address of processes at `site`
    /// (for a test that starts a process of its own there, under `nsenter --net`).
    pub fn place(&self, site: &str) -> (Option<String>, String) {
        match self.sites_ns.iter().find(|(s, _, _)| s == site) {
            Some((_, ns, ip)) => (Some(ns.clone()), ip.clone()),
            None => (None, "127.0.0.1".into()),
        }
    }

    /// Waits until meta lists `n` nodes at the addresses they listen on now (bounded):
    /// a node prints its address before it registers, and a restarted node's old
    /// registration (its previous port) must not count.
    pub fn wait_for_nodes(&self, n: usize) {
        // The newest process of each node id is the one that counts.
        let mut current: Vec<(&str, &str)> = Vec::new();
        for p in self.nodes.iter().rev() {
            let id = p.args.iter().position(|a| a == "--id").map_or("", |i| p.args[i + 1].as_str());
            if !current.iter().any(|(seen, _)| *seen == id) {
                current.push((id, p.addr.as_str()));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.locus(&["status", "--meta", &self.meta.addr]);
            // Node rows are the indented lines of the `nodes:` table.
            let text = String::from_utf8_lossy(&out.stdout);
            let listed = text
                .lines()
                .skip_while(|l| !l.starts_with("nodes:"))
                .take_while(|l| !l.starts_with("sessions:") && !l.starts_with("pending admission"))
                .filter(|l| l.starts_with("  ") && current.iter().any(|(_, addr)| l.contains(&format!(" {addr}"))))
                .count();
            if out.status.success() && listed >= n {
                return;
            }
            assert!(Instant::now() < deadline, "only {listed} of {n} nodes registered within 20 s:\n{text}");
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

    /// Starts another `locus meta` over the same database on a new port (the database
    /// must be one several metas can share: PostgreSQL) and returns its address.
    pub fn add_meta(&mut self) -> String {
        self.add_meta_without(&[])
    }

    /// Like `add_meta`, without the flags `dropped` (and their values) of the first
    /// meta's arguments (a site's meta without the other site's `--read-db`).
    pub fn add_meta_without(&mut self, dropped: &[&str]) -> String {
        let ns = self.meta.ns.clone();
        self.spawn_meta(ns, "127.0.0.1", without_flags(&self.meta.args, dropped))
    }

    /// Like `add_meta_without`, with the new meta at `site` (in its namespace, on its
    /// address), its `--db` at `db_url` (e.g. the PostgreSQL server of that site) and
    /// `extra` flags.
    pub fn add_meta_at(&mut self, site: &str, db_url: &str, dropped: &[&str], extra: &[&str]) -> String {
        let (ns, ip) = self.place(site);
        // `--listen :PORT` in `extra` chooses the port (a site's namespace is the
        // test's own: nothing else listens there).
        let dropped = [dropped, if extra.contains(&"--listen") { &["--listen"] } else { &[] }].concat();
        let mut args = without_flags(&self.meta.args, &dropped);
        if let Some(i) = args.iter().position(|a| a == "--db") {
            args[i + 1] = db_url.to_string();
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        self.spawn_meta(ns, &ip, args)
    }

    /// Starts one more `locus meta` with `args` in `ns`, listening on `ip`: on a free
    /// port, or the one a `--listen :PORT` names.
    fn spawn_meta(&mut self, ns: Option<String>, ip: &str, mut args: Vec<String>) -> String {
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            let port = args[i + 1].strip_prefix(':').unwrap_or("0").to_string();
            args[i + 1] = format!("{ip}:{port}");
        }
        let log = self.path().join(format!("meta{}.log", self.other_metas.len() + 1));
        let armed = self.failpoints.as_deref();
        let proc = spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus meta listening on", &log, armed);
        let addr = proc.addr.clone();
        self.other_metas.push(proc);
        addr
    }

    /// Mounts the namespace as a client of `site` with extra `locus mount` flags.
    pub fn mount_with(&mut self, site: &str, extra: &[&str]) -> PathBuf {
        let meta = self.meta.addr.clone();
        self.mount_through(&meta, site, extra)
    }

    /// Mounts the namespace through the meta at `meta` (see `add_meta`).
    pub fn mount_through(&mut self, meta: &str, site: &str, extra: &[&str]) -> PathBuf {
        let n = self.mounts.len();
        let mountpoint = self.path().join(format!("mnt{n}"));
        std::fs::create_dir_all(&mountpoint).expect("create mount point");
        let mut args: Vec<String> = vec![
            "mount".into(),
            mountpoint.display().to_string(),
            "--meta".into(),
            meta.into(),
            "--cache".into(),
            "64M".into(),
            "--site".into(),
            site.into(),
        ];
        args.extend(self.cert("client", &format!("client-{site}"), site));
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.path().join(format!("mount{n}.log"));
        let ns = self.place(site).0;
        let armed = self.failpoints.as_deref();
        let proc = spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus mounted on", &log, armed);
        self.mounts.push((mountpoint.clone(), proc));
        mountpoint
    }

    /// Runs a `locus` command to completion (bounded by its own timeouts), with an
    /// admin client certificate of the cluster (`LOCUS_CA`, `LOCUS_CERT`, `LOCUS_KEY`).
    pub fn locus(&self, args: &[&str]) -> std::process::Output {
        self.locus_command(args).output().expect("run locus")
    }

    /// `locus` as `Cluster::locus` runs it, to start in the background.
    pub fn locus_command(&self, args: &[&str]) -> Command {
        let tls = self.tls_dir();
        let mut cmd = command_in(self.meta.ns.as_deref(), &self.bin);
        for (var, ext) in [("LOCUS_CERT", "pem"), ("LOCUS_KEY", "key")] {
            cmd.env(var, tls.join(format!("admin.{ext}")));
        }
        cmd.env("LOCUS_CA", tls.join("ca.pem")).args(args).stdin(Stdio::null());
        cmd
    }

    /// The cluster's CA directory (`ca.pem`, `ca.key`, and each process's NAME.pem/.key).
    pub fn tls_dir(&self) -> PathBuf {
        self.path().join("tls")
    }

    /// Revokes certificates (serials or names) with `locus ca revoke`; meta rereads
    /// the list within a second and nodes and clients learn it at their next heartbeat.
    pub fn revoke(&self, entries: &[&str]) {
        let tls = self.tls_dir();
        run_ok(Command::new(&self.bin).args(["ca", "revoke", "--dir"]).arg(&tls).args(entries));
    }

    /// The `--ca --cert --key` flags of a certificate for `name` with `role` at
    /// `site`, issued by the cluster's CA on first use.
    pub fn cert(&self, role: &str, name: &str, site: &str) -> Vec<String> {
        issue(&self.bin, &self.tls_dir(), role, name, site, &[])
    }

    /// `cert` for a holder that serves clients checking host names (`locus ca issue
    /// --host`): `hosts` are the names or addresses they dial.
    pub fn serving_cert(&self, role: &str, name: &str, site: &str, hosts: &[&str]) -> Vec<String> {
        issue(&self.bin, &self.tls_dir(), role, name, site, hosts)
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

    /// SIGKILLs every node and mount of `site` (not meta), as the loss of the site
    /// would; its dead mounts are cleared.
    pub fn kill_site(&mut self, site: &str) {
        let at = |p: &Proc| p.args.windows(2).any(|w| w[0] == "--site" && w[1] == site);
        for (m, p) in self.mounts.iter_mut().filter(|(_, p)| at(p)) {
            let _ = p.child.kill();
            let _ = p.child.wait();
            lazy_unmount(m);
        }
        for p in self.nodes.iter_mut().filter(|p| at(p)) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Kills meta alone (SIGKILL, as a crash) and starts it again on the same port
    /// with the same arguments; nodes and mounts keep running and reconnect.
    pub fn restart_meta(&mut self) {
        let _ = self.meta.child.kill();
        let _ = self.meta.child.wait();
        let mut args = self.meta.args.clone();
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            args[i + 1] = self.meta.addr.clone();
        }
        let (ns, log) = (self.meta.ns.clone(), self.path().join("meta.log"));
        self.meta = spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus meta listening on", &log, None);
    }

    /// Starts meta and every node again with their old arguments and state; node
    /// addresses are re-announced (ports may change).
    pub fn restart(&mut self) {
        self.failpoints = None;
        let meta_args = self.meta.args.clone();
        // Same port as before, so that restarted nodes and mounts find meta.
        let mut args = meta_args.clone();
        if let Some(i) = args.iter().position(|a| a == "--listen") {
            args[i + 1] = self.meta.addr.clone();
        }
        let (ns, log) = (self.meta.ns.clone(), self.path().join("meta.log"));
        self.meta = spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus meta listening on", &log, None);
        let node_args: Vec<(Vec<String>, Option<String>)> =
            self.nodes.iter().map(|p| (p.args.clone(), p.ns.clone())).collect();
        self.nodes.clear();
        for (mut args, ns) in node_args {
            if let Some(i) = args.iter().position(|a| a == "--meta") {
                args[i + 1] = self.meta.addr.clone();
            }
            let id = args.iter().position(|a| a == "--id").map(|i| args[i + 1].clone()).unwrap_or_default();
            let log = self.path().join(format!("{id}.log"));
            self.nodes.push(spawn_and_wait(&self.bin, ns.as_deref(), &args, "locus node listening on", &log, None));
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

impl Cluster {
    /// Prints the last lines of every process log: what a failing test needs to say.
    fn print_log_tails(&self) {
        let Ok(entries) = std::fs::read_dir(self.path()) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(30)..];
                eprintln!("---- last lines of {} ----\n{}", path.display(), tail.join("\n"));
            }
        }
    }
}

fn lazy_unmount(m: &Path) {
    let _ = Command::new("umount").arg("-l").arg(m).stderr(Stdio::null()).status();
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_log_tails();
        }
        while !self.mounts.is_empty() {
            self.unmount(0);
        }
        let _ = self.meta.child.kill();
        let _ = self.meta.child.wait();
        for p in self.nodes.iter_mut().chain(&mut self.other_metas) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// Creates `path` with `data` and fsyncs it, in a process of its own: a test binary
/// runs tests in threads, and every process another test spawns inherits this one's
/// open files until its exec closes them, and each such close is a FUSE flush that
/// commits a partly written file (cutting it into chunks at an arbitrary point). The
/// errno of a failed create, write, fsync or close comes back as the error.
pub fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    const WRITER: &str = r#"
import os, sys
try:
    data = sys.stdin.buffer.read()
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
except OSError as e:
    sys.exit(e.errno or 1)
"#;
    let mut child = Command::new("python3").args(["-c", WRITER]).arg(path).stdin(Stdio::piped()).spawn()?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let fed = stdin.write_all(data);
    drop(stdin);
    let status = child.wait()?;
    fed?;
    match status.code() {
        Some(0) => Ok(()),
        Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        None => Err(std::io::Error::other(format!("the writer of {} was killed: {status}", path.display()))),
    }
}

/// Pseudo-random bytes (xorshift), so no two chunks are alike and nothing dedupes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Files under `dir`, recursively, and their total size (0, 0 for a missing directory):
/// how tests count the chunks and bytes a store holds.
pub fn files_under(dir: &Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return (0, 0) };
    entries.fold((0, 0), |(n, bytes), e| {
        let e = e.expect("read a directory entry");
        if e.file_type().expect("file type").is_dir() {
            let (m, b) = files_under(&e.path());
            (n + m, bytes + b)
        } else {
            (n + 1, bytes + e.metadata().expect("file metadata").len())
        }
    })
}

/// Waits up to `within` for `child` to exit; kills it and fails the test otherwise.
pub fn exits_within(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child process") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether this process may mount FUSE file systems (tests skip loudly otherwise).
pub fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    Path::new("/dev/fuse").exists() && unsafe { libc::geteuid() } == 0
}

pub mod netns;
pub mod postgres;
pub mod relay;
pub mod scratch;
pub mod wan;

pub use netns::{LinkProfile, WanLink};
