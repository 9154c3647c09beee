//! A real PostgreSQL server for tests: `initdb` into a temporary directory, then the
//! server on a free loopback port (its socket in that directory), stopped on drop; or
//! inside a WAN site's network namespace on that site's address (`start_in`).
//! PostgreSQL refuses to run as root, so under root both run as the `postgres` system
//! user (through `runuser`), owning the directory. Binaries come from PATH or
//! Debian's /usr/lib/postgresql/<version>/bin.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The superuser `initdb` creates; the URLs handed out connect as it (trust auth on
/// loopback, or on the sites' network in a namespace).
const SUPERUSER: &str = "locus";

/// A running PostgreSQL server; `pg_ctl stop` on drop.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// The port it listens on.
    pub port: u16,
    /// The address it listens on (127.0.0.1, or its site's address).
    host: Ipv4Addr,
    /// The network namespace it runs in (`None`: the test's own).
    ns: Option<String>,
    /// Run the server's tools as the `postgres` user (we are root).
    as_postgres: bool,
    databases: AtomicU32,
}

/// The directory holding `initdb`, `pg_ctl`, `createdb` and `postgres`: where the
/// `initdb` on PATH really is (a symlink leads to the whole set), then the newest of
/// Debian's versioned directories.
fn bin_dir() -> Option<PathBuf> {
    let has_all =
        |d: &Path| ["initdb", "pg_ctl", "createdb", "pg_basebackup", "postgres"].iter().all(|t| d.join(t).is_file());
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .filter_map(|d| Some(std::fs::canonicalize(d.join("initdb")).ok()?.parent()?.to_path_buf()))
        .find(|d| has_all(d));
    if let Some(dir) = on_path {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| has_all(bin))
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Whether PostgreSQL's server binaries are installed here (tests that need a server
/// fail with a clear message when they are not; `.ci/run` installs them).
pub fn available() -> bool {
    bin_dir().is_some()
}

fn am_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The numeric uid and gid of the `postgres` system user.
fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, "postgres"]).output().expect("run id");
        assert!(out.status.success(), "no `postgres` system user (install Debian's postgresql package)");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("numeric id")
    };
    (id("-u"), id("-g"))
}

impl PgServer {
    /// Formats a cluster into a new temporary directory and starts a server on a free
    /// loopback port; waits (bounded by pg_ctl's 60 s) until it accepts connections.
    /// Durability is off (`fsync=off`): a test server's data dies with the test.
    pub fn start() -> PgServer {
        Self::start_at(None, Ipv4Addr::LOCALHOST)
    }

    /// Like `start`, inside network namespace `ns` (a `WanLink` site's) listening on
    /// `addr` (that site's address); it trusts connections and replication from the
    /// sites' /24 network, which reaches nothing else.
    pub fn start_in(ns: &str, addr: Ipv4Addr) -> PgServer {
        Self::start_at(Some(ns), addr)
    }

    fn start_at(ns: Option<&str>, host: Ipv4Addr) -> PgServer {
        let bin = bin_dir().expect(
            "PostgreSQL server binaries not found on PATH or in /usr/lib/postgresql/*/bin: install Debian's \
             postgresql package (.ci/run does)",
        );
        let server = Self::new_dir("locus-pg", bin, ns, host);
        let data = server.data_dir();
        server.run("initdb", &["-D", &data, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C", "-N"]);
        if ns.is_some() {
            let [a, b, c, _] = host.octets();
            let hba = Path::new(&data).join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
            text += &format!("host all all {a}.{b}.{c}.0/24 trust\nhost replication all {a}.{b}.{c}.0/24 trust\n");
            std::fs::write(&hba, text).expect("write pg_hba.conf");
        }
        server.launch();
        server
    }

    /// A server not yet formatted: its directory (owned by `postgres` under root) and a
    /// free port on `host` (in `ns`).
    fn new_dir(prefix: &str, bin: PathBuf, ns: Option<&str>, host: Ipv4Addr) -> PgServer {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().expect("tempdir");
        let as_postgres = am_root();
        if as_postgres {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the server's directory");
        }
        let free = move || std::net::TcpListener::bind((host, 0)).expect("bind").local_addr().expect("addr").port();
        let port = match ns {
            None => free(),
            Some(ns) => crate::netns::enter_and_run(ns, free).expect("enter the server's namespace"),
        };
        PgServer { dir, bin, port, host, ns: ns.map(String::from), as_postgres, databases: AtomicU32::new(0) }
    }

    /// Starts the server of the formatted data directory (bounded by pg_ctl's 60 s).
    fn launch(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses={} -c fsync=off -c full_page_writes=off \
             -c max_connections=400 -c shared_buffers=32MB -c max_prepared_transactions=64",
            self.port,
            self.dir.path().display(),
            self.host
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.run("pg_ctl", &["start", "-w", "-t", "60", "-D", &self.data_dir(), "-l", &log, "-o", &options]);
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// One of the server's tools, run as `postgres` under root, in the server's
    /// directory (not one `postgres` may be unable to enter) and network namespace.
    fn tool(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(ns) = &self.ns {
            argv.extend(["nsenter".into(), format!("--net=/run/netns/{ns}").into()]);
        }
        if self.as_postgres {
            argv.extend(["runuser", "-u", "postgres", "--"].map(Into::into));
        }
        argv.push(program.into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.current_dir(self.dir.path());
        cmd
    }

    /// Runs one of the server's tools to completion; panics with its output if it fails.
    fn run(&self, tool: &str, args: &[&str]) {
        let out = self.tool(tool).args(args).output().expect("run a PostgreSQL tool");
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}\nserver log: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    /// The URL of the maintenance database `postgres`.
    pub fn admin_url(&self) -> String {
        self.url("postgres")
    }

    /// The URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://{SUPERUSER}@{}:{}/{name}", self.host, self.port)
    }

    /// Creates a new, empty database and returns its URL.
    pub fn create_database(&self) -> String {
        let name = format!("t{}", self.databases.fetch_add(1, Ordering::Relaxed));
        self.run("createdb", &["-h", &self.host.to_string(), "-p", &self.port.to_string(), "-U", SUPERUSER, &name]);
        self.url(&name)
    }

    /// Starts a hot standby of this server (streaming replication from a base backup,
    /// on a free port of its own); read-only, it serves the same databases by name
    /// (`url`) as they replay.
    pub fn start_standby(&self) -> PgServer {
        self.standby_at(None, Ipv4Addr::LOCALHOST)
    }

    /// Like `start_standby`, inside network namespace `ns` on `addr` (another site of
    /// the primary's `WanLink`): the base backup and the stream cross the WAN.
    pub fn start_standby_in(&self, ns: &str, addr: Ipv4Addr) -> PgServer {
        self.standby_at(Some(ns), addr)
    }

    fn standby_at(&self, ns: Option<&str>, host: Ipv4Addr) -> PgServer {
        let standby = Self::new_dir("locus-pg-standby", self.bin.clone(), ns, host);
        let data = standby.data_dir();
        let (primary_host, primary_port) = (self.host.to_string(), self.port.to_string());
        standby.run(
            "pg_basebackup",
            &[
                "-h",
                &primary_host,
                "-p",
                &primary_port,
                "-U",
                SUPERUSER,
                "-D",
                &data,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        );
        standby.launch();
        standby
    }

    /// Runs `sql` in database `db` with psql and returns its unaligned output.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let (host, port) = (self.host.to_string(), self.port.to_string());
        let out = self
            .tool("psql")
            .args(["-h", &host, "-p", &port, "-U", SUPERUSER, "-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops the server as a crash would (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, nothing more sent to its standbys).
    pub fn crash(&self) {
        self.run("pg_ctl", &["stop", "-w", "-t", "30", "-m", "immediate", "-D", &self.data_dir()]);
    }

    /// Starts the server again after `crash`, on its data as the crash left it (a lost
    /// site's primary back after a failover).
    pub fn restart(&self) {
        self.launch();
    }

    /// The server's directory (its log is `server.log` there).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Stops every process of the server (SIGSTOP), as a hung machine would: the
    /// kernel still takes connections and data, nothing answers. `resume` undoes it.
    pub fn pause(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// Sends `signal` to the postmaster (its pid is the first line of postmaster.pid)
    /// and to each of its children.
    fn signal_all(&self, signal: libc::c_int) {
        let pid_file = Path::new(&self.data_dir()).join("postmaster.pid");
        let Some(postmaster) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
        else {
            return;
        };
        let children = std::fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // The fields after the command's closing parenthesis: state, then ppid.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<i32>().ok()?;
            (ppid == postmaster).then_some(pid)
        });
        for pid in std::iter::once(postmaster).chain(children.collect::<Vec<_>>()) {
            // SAFETY: kill has no memory preconditions; a pid that has gone meanwhile
            // only makes it fail, which is ignored.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // A test that failed while the server was paused must not leave it so.
        self.resume();
        let data = self.data_dir();
        let stop = |mode: &str| {
            self.tool("pg_ctl")
                .args(["stop", "-w", "-t", "30", "-m", mode, "-D", &data])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !stop("fast") {
            stop("immediate");
        }
    }
}

/// One server shared by every test of a process that runs at the same time; it stops
/// when the last holder lets go (a later test starts a new one).
pub fn shared() -> Arc<PgServer> {
    static SERVER: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());
    let mut slot = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = slot.upgrade() {
        return server;
    }
    let server = Arc::new(PgServer::start());
    *slot = Arc::downgrade(&server);
    server
}
