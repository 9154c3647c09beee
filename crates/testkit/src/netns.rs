//! Emulated WAN sites for tests and benchmarks: one Linux network namespace per site,
//! each joined by a veth pair to a private "wan" namespace where the `locus-wan`
//! forwarder applies delay, loss and a rate limit between every pair of sites.
//!
//! Everything is driven through iproute2's `ip` (and `ethtool` to turn offloads off,
//! so every frame the forwarder sees is at most one MTU with a complete checksum).
//! The namespaces have no other interface and no route out, so emulated traffic can
//! only ever reach the other sites. All names start with a caller-chosen prefix so a
//! crashed run's leftovers can be removed with [`cleanup_prefix`].

use std::io::{self, BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Prefix of every namespace this module creates by default (`lw` = Locus WAN).
pub const DEFAULT_PREFIX: &str = "lw-";

/// Default MTU of the emulated links: jumbo frames keep the forwarder's per-frame
/// cost low enough to reach 1 Gbit/s on two cores.
pub const DEFAULT_MTU: u32 = 9000;

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// Runs a command to completion; an error carries its stderr.
pub fn run(prog: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| other(format!("cannot run {prog}: {e}")))?;
    if !out.status.success() {
        return Err(other(format!(
            "`{prog} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `args` inside namespace `ns` (`ip netns exec`).
pub fn ns_run(ns: &str, args: &[&str]) -> io::Result<String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run("ip", &all)
}

/// A `Command` that runs `prog` inside namespace `ns`, for callers that need to spawn.
pub fn ns_command(ns: &str, prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(prog);
    c
}

/// Whether this process can create namespaces: root, and `ip netns` works.
pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    (unsafe { libc::geteuid() }) == 0
        && Command::new("ip")
            .args(["netns", "list"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// Whether `ethtool` is installed (needed to turn veth offloads off).
pub fn have_ethtool() -> bool {
    ["/usr/sbin/ethtool", "/sbin/ethtool", "/usr/bin/ethtool"].iter().any(|p| Path::new(p).exists())
}

/// Names of existing namespaces starting with `prefix`.
pub fn list_prefix(prefix: &str) -> io::Result<Vec<String>> {
    let out = run("ip", &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect())
}

/// Kills every process inside `ns` and deletes it; a missing namespace is fine.
pub fn delete_ns(ns: &str) -> io::Result<()> {
    if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill takes plain integers; the pids are the namespace's processes, about to be deleted.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    match run("ip", &["netns", "del", ns]) {
        Ok(_) => Ok(()),
        Err(_) if !list_prefix(ns)?.iter().any(|n| n == ns) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes every namespace whose name starts with `prefix` (and the processes in
/// it): idempotent, so it is safe before a run and after a crash.
pub fn cleanup_prefix(prefix: &str) -> io::Result<()> {
    if prefix.is_empty() {
        return Err(other("refusing to clean up an empty namespace prefix".into()));
    }
    for ns in list_prefix(prefix)? {
        delete_ns(&ns)?;
    }
    Ok(())
}

/// Creates namespace `ns` with loopback up and the sysctls a WAN test needs: TCP
/// buffers that can grow to 64 MiB (1 Gbit/s × 200 ms is 25 MB), no cached TCP
/// metrics between runs, and no IPv6 (no neighbour-discovery chatter).
pub fn create_ns(ns: &str) -> io::Result<()> {
    run("ip", &["netns", "add", ns])?;
    ns_run(ns, &["ip", "link", "set", "lo", "up"])?;
    for kv in [
        "net.ipv4.tcp_rmem=4096 131072 67108864",
        "net.ipv4.tcp_wmem=4096 16384 67108864",
        "net.ipv4.tcp_no_metrics_save=1",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
    ] {
        ns_run(ns, &["sysctl", "-q", "-w", kv])?;
    }
    Ok(())
}

/// Turns off the offloads (checksum, TSO/GSO, GRO) on `dev` in `ns`, so frames cross
/// the forwarder as real, complete, MTU-sized frames.
pub fn disable_offloads(ns: &str, dev: &str) -> io::Result<()> {
    ns_run(ns, &["ethtool", "-K", dev, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]).map(|_| ())
}

/// The settings of an emulated WAN. Delay, loss and rate apply to each direction of
/// every site pair.
#[derive(Clone, Debug)]
pub struct LinkProfile {
    /// One-way delay (RTT is twice this).
    pub delay: Duration,
    /// Random loss in percent, per direction.
    pub loss_pct: f64,
    /// Rate limit per direction in Mbit/s; 0 = as fast as the forwarder goes.
    pub rate_mbit: f64,
    /// Rate-limiter queue in bytes; `None` = 1.5 × BDP.
    pub queue_bytes: Option<u64>,
    /// Seed of the loss PRNG.
    pub seed: u64,
    /// MTU of every veth.
    pub mtu: u32,
    /// Path of the `locus-wan` binary; `None` = [`locus_wan_bin`].
    pub bin: Option<PathBuf>,
}

impl Default for LinkProfile {
    fn default() -> Self {
        LinkProfile {
            delay: Duration::ZERO,
            loss_pct: 0.0,
            rate_mbit: 1000.0,
            queue_bytes: None,
            seed: 1,
            mtu: DEFAULT_MTU,
            bin: None,
        }
    }
}

impl LinkProfile {
    /// The forwarder's `set` arguments for these settings.
    fn set_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("delay_ms={}", self.delay.as_secs_f64() * 1000.0),
            format!("loss_pct={}", self.loss_pct),
            format!("rate_mbit={}", self.rate_mbit),
        ];
        a.push(match self.queue_bytes {
            Some(q) => format!("queue_bytes={q}"),
            None => "queue_bytes=auto".into(),
        });
        a
    }
}

/// Where the `locus-wan` binary is: `$LOCUS_WAN_BIN`, else next to the running test
/// executable's `deps/` directory (cargo's target/<profile>/). Build it first with
/// `cargo build -p testkit --bin locus-wan` when calling from another crate's tests.
pub fn locus_wan_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCUS_WAN_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("locus-wan")
}

/// N site namespaces joined through one forwarder. Site `i` is namespace
/// `{prefix}s{i}` with interface `eth0` at 10.99.0.{i+1}/24; the forwarder runs in
/// `{prefix}wan`. Dropping it kills the forwarder and deletes every namespace.
pub struct WanLink {
    prefix: String,
    sites: Vec<String>,
    wan_ns: String,
    forwarder: Option<Child>,
    control: PathBuf,
    _dir: tempfile::TempDir,
}

impl WanLink {
    /// Creates `n` (2..=200) sites under `prefix` after removing any stale namespaces
    /// with that prefix, and starts the forwarder. The prefix must be unique to the
    /// caller and must not be a prefix of another caller's (stale cleanup deletes
    /// every namespace it starts), e.g. "lwt-echo-" and "lwt-bulk-".
    pub fn start(prefix: &str, n: usize, cfg: &LinkProfile) -> io::Result<WanLink> {
        if !(2..=200).contains(&n) {
            return Err(other(format!("a WAN needs 2..=200 sites, not {n}")));
        }
        if prefix.is_empty() || prefix.len() > 40 {
            return Err(other("namespace prefix must be 1..=40 characters".into()));
        }
        cleanup_prefix(prefix)?;
        let dir = tempfile::Builder::new().prefix("locus-wan").tempdir()?;
        let mut link = WanLink {
            prefix: prefix.to_string(),
            sites: (0..n).map(|i| format!("{prefix}s{i}")).collect(),
            wan_ns: format!("{prefix}wan"),
            forwarder: None,
            control: dir.path().join("control"),
            _dir: dir,
        };
        // On error, `link` is dropped and tears down what was built.
        link.build(cfg)?;
        Ok(link)
    }

    fn build(&mut self, cfg: &LinkProfile) -> io::Result<()> {
        let mtu = cfg.mtu.to_string();
        create_ns(&self.wan_ns)?;
        for (i, site) in self.sites.iter().enumerate() {
            create_ns(site)?;
            let port = format!("s{i}");
            run(
                "ip",
                &[
                    "link",
                    "add",
                    "eth0",
                    "netns",
                    site,
                    "mtu",
                    &mtu,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &port,
                    "netns",
                    &self.wan_ns,
                    "mtu",
                    &mtu,
                ],
            )?;
            let mac = format!("02:6c:77:00:{:02x}:{:02x}", i / 256, i % 256);
            ns_run(site, &["ip", "link", "set", "eth0", "address", &mac])?;
            ns_run(site, &["ip", "addr", "add", &format!("{}/24", Self::addr_of(i)), "dev", "eth0"])?;
            disable_offloads(site, "eth0")?;
            disable_offloads(&self.wan_ns, &port)?;
            ns_run(site, &["ip", "link", "set", "eth0", "up"])?;
            ns_run(&self.wan_ns, &["ip", "link", "set", &port, "up"])?;
        }
        // Static neighbours: no ARP round trip (through the delay) before the first packet.
        for (i, site) in self.sites.iter().enumerate() {
            for j in (0..self.sites.len()).filter(|&j| j != i) {
                let mac = format!("02:6c:77:00:{:02x}:{:02x}", j / 256, j % 256);
                let a = Self::addr_of(j).to_string();
                ns_run(site, &["ip", "neigh", "replace", &a, "lladdr", &mac, "dev", "eth0", "nud", "permanent"])?;
            }
        }
        self.spawn_forwarder(cfg)
    }

    fn spawn_forwarder(&mut self, cfg: &LinkProfile) -> io::Result<()> {
        let bin = cfg.bin.clone().unwrap_or_else(locus_wan_bin);
        if !bin.exists() {
            return Err(other(format!(
                "{} not found: build it with `cargo build -p testkit --bin locus-wan` or set LOCUS_WAN_BIN",
                bin.display()
            )));
        }
        let mut cmd = ns_command(&self.wan_ns, &bin);
        cmd.arg("run");
        for i in 0..self.sites.len() {
            cmd.args(["--port", &format!("s{i}")]);
        }
        cmd.args(["--control"]).arg(&self.control);
        cmd.args(["--seed", &cfg.seed.to_string(), "--max-frame", &(cfg.mtu as usize + 18).to_string()]);
        for a in cfg.set_args() {
            let (k, v) = a.split_once('=').unwrap_or((&a, ""));
            cmd.arg(format!("--{}", k.replace('_', "-"))).arg(v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| other(format!("cannot start {}: {e}", bin.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| other("no forwarder stdout".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("ready") {
                    let _ = tx.send(());
                }
            }
        });
        self.forwarder = Some(child);
        rx.recv_timeout(Duration::from_secs(10)).map_err(|_| other("locus-wan did not become ready within 10 s".into()))
    }

    /// The address of site `i`.
    pub fn addr_of(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, 0, (i % 250 + 1) as u8)
    }

    /// Namespace name of site `i` (for `ip netns exec`).
    pub fn site_ns(&self, i: usize) -> &str {
        &self.sites[i]
    }

    /// Namespace that holds the forwarder.
    pub fn wan_ns(&self) -> &str {
        &self.wan_ns
    }

    /// Path of the forwarder's control socket (for `locus-wan ctl --control PATH`).
    pub fn control_path(&self) -> &Path {
        &self.control
    }

    /// Number of sites.
    pub fn sites(&self) -> usize {
        self.sites.len()
    }

    /// A `Command` running `prog` inside site `i`.
    pub fn command(&self, i: usize, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        ns_command(&self.sites[i], prog)
    }

    /// Runs `f` on a thread that has entered site `i`'s namespace, so sockets it
    /// opens live there (for in-process test clients and servers).
    pub fn in_site<T: Send + 'static>(&self, i: usize, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
        enter_and_run(&self.sites[i], f)
    }

    /// Changes delay/loss/rate/queue for every site pair at run time.
    pub fn set(&self, cfg: &LinkProfile) -> io::Result<String> {
        self.control(&format!("set {}", cfg.set_args().join(" ")))
    }

    /// Changes the settings of one direction only (from site `from` to site `to`).
    pub fn set_pair(&self, from: usize, to: usize, cfg: &LinkProfile) -> io::Result<String> {
        self.control(&format!("set from={from} to={to} {}", cfg.set_args().join(" ")))
    }

    /// The forwarder's counters, one line per direction.
    pub fn stats(&self) -> io::Result<String> {
        self.control("stats")
    }

    /// Sends one control command to the forwarder and returns its reply.
    pub fn control(&self, msg: &str) -> io::Result<String> {
        control_request(&self.control, msg)
    }

    /// Stops the forwarder and deletes the namespaces (also done on drop).
    pub fn teardown(&mut self) -> io::Result<()> {
        if let Some(mut c) = self.forwarder.take() {
            // SAFETY: kill takes plain integers; the pid is our child's, not yet reaped (so not reused).
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        cleanup_prefix(&self.prefix)
    }
}

impl Drop for WanLink {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("WanLink teardown: {e}");
        }
    }
}

/// Sends `msg` to a forwarder's control socket and waits (2 s at most) for the reply.
pub fn control_request(control: &Path, msg: &str) -> io::Result<String> {
    let dir = tempfile::Builder::new().prefix("locus-wan-ctl").tempdir()?;
    let me = dir.path().join("c");
    let sock = UnixDatagram::bind(&me)?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    sock.send_to(msg.as_bytes(), control)?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = sock.recv(&mut buf)?;
    let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
    if let Some(e) = reply.strip_prefix("err") {
        return Err(other(format!("locus-wan: {}", e.trim())));
    }
    Ok(reply)
}

/// Runs `f` on a new thread that first joins namespace `ns` (setns on
/// /var/run/netns/NAME); only that thread changes namespace.
pub fn enter_and_run<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let path = Path::new("/var/run/netns").join(ns);
    let file = std::fs::File::open(&path)?;
    let h = std::thread::spawn(move || -> io::Result<T> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns only reads the descriptor, which `file` keeps open; it changes this thread alone.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(f())
    });
    h.join().map_err(|_| other("namespace thread panicked".into()))?
}
