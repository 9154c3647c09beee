//! Command-line surface. Every option can also come from a TOML config file
//! (`--config FILE`, one table per command); flags on the command line win.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Locus: one POSIX namespace for every site of a grid.
#[derive(Parser, Debug)]
#[command(name = "locus", version, args_override_self = true)]
pub struct Cli {
    /// TOML file with defaults, e.g. `[node]\nsite = "a"`; command-line flags win.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// TCP congestion control for every connection (bbr keeps long, lossy paths full).
    #[arg(long, global = true, default_value = "bbr")]
    pub tcp_congestion: String,
    /// Fixed socket buffers, e.g. 32M (about bandwidth x RTT); default: kernel autotuning.
    #[arg(long, global = true, value_parser = parse_size)]
    pub socket_buffer: Option<u64>,
    /// A server closes a connection with nothing in flight for this long, e.g. 10m.
    #[arg(long, global = true, default_value = "10m", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// A server closes a connection whose started frame is not complete within this.
    #[arg(long, global = true, default_value = "60s", value_parser = parse_duration)]
    pub frame_timeout: std::time::Duration,
    /// A server drops a new connection that has not completed its TLS handshake
    /// within this.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: std::time::Duration,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once per process: a boxed variant would only make every match on it clumsier.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run meta (SQLite), one node and a mount in one process; Ctrl-C unmounts and stops.
    Up(UpArgs),
    /// Run the metadata service.
    Meta(MetaArgs),
    /// Run a storage node.
    Node(Box<NodeArgs>),
    /// Mount the namespace with FUSE.
    Mount(MountArgs),
    /// Show nodes, capacity, chunks and sessions.
    Status(StatusArgs),
    /// Check this host for what its Locus roles need (FUSE, certificates, listen
    /// ports, databases, meta's reachability, the clock against meta's) and say what
    /// to fix; with --config, everything its tables name. Exits 0 when all is well, 1
    /// when something is wrong, 3 when something only needs watching.
    Doctor(DoctorArgs),
    /// Check every chunk against its id and every extent against the catalogue. Exits 0
    /// when clean, 1 when something is damaged (or fsck failed), 3 when nothing is
    /// damaged but chunks have fewer copies than their policy asks for (degraded).
    Fsck(AdminArgs),
    /// Delete chunks that no file references any more.
    Gc(GcArgs),
    /// Replication policies of directories (which sites hold the data, how many copies,
    /// when a write is acknowledged).
    Policy(PolicyArgs),
    /// Metadata homes: subtrees whose metadata commits in an engine of their own
    /// (`locus meta --home NAME=URL`).
    Home(HomeArgs),
    /// The cluster's certificate authority: make it, issue certificates, revoke them.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Prove who you are with your own (user) certificate, so that this host's mount
    /// acts for you at a site whose users must log in (`locus meta --user-auth`).
    Login(LoginArgs),
    /// Measure creates, stats, unlinks and a sequential read through the client
    /// library (no mount), as a program that links Locus sees them.
    Bench(BenchArgs),
    /// Serve files of the namespace as network block devices (NBD), over TLS with the
    /// process's certificate.
    Nbd(NbdArgs),
    /// Print the completion script of SHELL (bash, zsh, fish, elvish, powershell), e.g.
    /// `locus completions bash > /etc/bash_completion.d/locus`.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages of locus and each of its commands (locus.1, locus-mount.1, ...)
    /// into DIR, made from these same definitions.
    Man {
        /// Where to write them, e.g. /usr/local/share/man/man1.
        dir: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct NbdArgs {
    /// Where NBD clients connect (10809 is NBD's port).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// NAME=PATH[,size=SIZE][,ro]: serves the file PATH of the namespace as export NAME
    /// (repeatable); `size=` creates the file or grows it to SIZE, `ro` serves it
    /// read-only.
    #[arg(long = "export", required = true, value_parser = parse_export, value_name = "NAME=PATH[,size=SIZE][,ro]")]
    pub exports: Vec<ExportSpec>,
    /// Serve plain NBD, without TLS: anybody who reaches the port reads and writes the
    /// exports, so it is refused unless --listen is a loopback address.
    #[arg(long)]
    pub plain: bool,
    /// Let other servers, at this site or another, serve the same files at once. By
    /// default each export holds a lock on its file (shared when read-only) that every
    /// other `locus nbd` sees and waits for: two writers would corrupt the file system
    /// inside the device.
    #[arg(long)]
    pub shared: bool,
    /// Longest wait for an export's lock (a server killed moments ago holds it until
    /// its session expires), e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub lock_wait: std::time::Duration,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    #[arg(long, default_value = "default")]
    pub site: String,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

/// One `--export` of `locus nbd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    /// A path in the namespace.
    pub path: String,
    /// Create the file, or grow it, to this many bytes.
    pub size: Option<u64>,
    pub read_only: bool,
}

/// `NAME=PATH[,size=SIZE][,ro]`.
pub fn parse_export(s: &str) -> Result<ExportSpec, String> {
    let (name, rest) = s.split_once('=').ok_or_else(|| format!("{s:?} is not NAME=PATH[,size=SIZE][,ro]"))?;
    let mut parts = rest.split(',');
    let path = parts.next().unwrap_or_default().to_string();
    if name.is_empty() || name.len() > 4096 || path.is_empty() {
        return Err(format!("{s:?}: an export needs a name (at most 4096 bytes) and a path"));
    }
    let mut spec = ExportSpec { name: name.to_string(), path, size: None, read_only: false };
    for option in parts {
        match option.split_once('=') {
            Some(("size", size)) => spec.size = Some(parse_size(size)?).filter(|n| *n > 0),
            None if option == "ro" => spec.read_only = true,
            _ => return Err(format!("{s:?}: unknown export option {option:?} (size=SIZE or ro)")),
        }
    }
    if spec.size.is_some() && spec.read_only {
        return Err(format!("{s:?}: size= makes or grows the file, which a read-only export cannot"));
    }
    Ok(spec)
}

#[derive(Args, Debug, Default)]
pub struct DoctorArgs {
    /// A meta to reach (repeatable): it must accept this host's certificate and its
    /// clock agree with this host's.
    #[arg(long)]
    pub meta: Vec<String>,
    /// An address a role of this host listens on (repeatable): it must be free.
    #[arg(long)]
    pub listen: Vec<String>,
    /// A database meta uses (repeatable; a PostgreSQL URL or a SQLite file): reachable
    /// and formatted by Locus. Nothing is changed.
    #[arg(long)]
    pub db: Vec<String>,
    /// Longest wait for each meta.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Meta's address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    #[arg(long, default_value = "default")]
    pub site: String,
    /// Empty files created, stated and unlinked, in a new directory of the root.
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Operations in flight at once (tasks sharing one client).
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Also read this file from start to end (a path in the namespace), in 8 MiB reads.
    #[arg(long)]
    pub read: Option<String>,
}

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// Meta's address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    /// How long the login lasts, e.g. 12h (meta grants at most a week).
    #[arg(long, default_value = "12h", value_parser = parse_duration)]
    pub lifetime: std::time::Duration,
    /// Where this host's mounts find logins (their `--logins`).
    #[arg(long, default_value = DEFAULT_LOGINS)]
    pub logins: PathBuf,
}

/// Where mounts look for their users' logins and `locus login` leaves them.
pub const DEFAULT_LOGINS: &str = "/run/locus/logins";

/// How this process proves itself and checks its peers (mutual TLS 1.3).
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// The CA certificate(s) every peer's certificate must chain to (PEM): `ca.pem`
    /// of `locus ca init`, or an existing CA of the grid.
    #[arg(long, global = true, env = "LOCUS_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// This process's certificate (PEM), from `locus ca issue` or the site's CA.
    #[arg(long, global = true, env = "LOCUS_CERT", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The private key of --cert (PEM).
    #[arg(long, global = true, env = "LOCUS_KEY", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Run without TLS: anybody who can reach a port can read, change and delete
    /// every file. Only for closed test networks.
    #[arg(long, global = true, env = "LOCUS_INSECURE_NO_TLS")]
    pub insecure_no_tls: bool,
}

#[derive(Subcommand, Debug)]
pub enum CaCommand {
    /// Create a new CA (`ca.pem`, `ca.key`) in --dir.
    Init {
        /// Where the CA lives.
        #[arg(long, default_value = "locus-ca")]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "Locus cluster CA")]
        name: String,
    },
    /// Issue a certificate for one meta, node, client host or operator (admin); writes NAME.pem and
    /// NAME.key into --out (default: the CA directory).
    Issue(IssueArgs),
    /// Add certificate serials (hex) or names to the revocation list meta
    /// distributes (`DIR/revoked`, read by `locus meta --revoked`).
    Revoke {
        /// Where the CA lives.
        #[arg(long, default_value = "locus-ca")]
        dir: PathBuf,
        /// Serials or names to revoke.
        #[arg(required = true)]
        entries: Vec<String>,
    },
}

#[derive(Args, Debug)]
pub struct IssueArgs {
    /// Where the CA lives (`ca.pem`, `ca.key`).
    #[arg(long, default_value = "locus-ca")]
    pub dir: PathBuf,
    /// Bring your own CA: its certificate (PEM) instead of DIR/ca.pem.
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// Bring your own CA: its private key (PEM) instead of DIR/ca.key.
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// meta, node, client or admin.
    #[arg(long)]
    pub role: net::Role,
    /// The holder's name (CN): a node's id, a host name, a principal.
    #[arg(long)]
    pub name: String,
    /// The site the holder belongs to.
    #[arg(long)]
    pub site: String,
    /// Days the certificate is valid (0: it expires now, for tests of expiry).
    #[arg(long, default_value_t = 365)]
    pub days: u64,
    /// A DNS name or IP address the holder serves at (repeatable): lets it serve
    /// clients that check host names, such as `locus nbd`'s.
    #[arg(long = "host", value_name = "NAME")]
    pub hosts: Vec<String>,
    /// Where to write NAME.pem and NAME.key [default: --dir].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
    #[arg(long, global = true)]
    pub meta: Option<String>,
    #[command(subcommand)]
    pub command: PolicyCommand,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Sets the policy of a directory (a path in the namespace, e.g. /projects/x);
    /// everything below it follows it unless it sets its own.
    Set {
        path: String,
        /// Sites that must hold every chunk, e.g. a,b [default: the writer's site].
        #[arg(long, value_delimiter = ',')]
        sites: Vec<String>,
        /// Copies on distinct nodes inside each listed site.
        #[arg(long, default_value_t = 2)]
        copies: u32,
        /// sync (durable at every copy), semi-sync (durable here, received at the
        /// other sites) or async (durable here, shipped in the background).
        #[arg(long, default_value = "sync")]
        mode: proto::policy::ReplicationMode,
        /// Most lag accepted before status warns, e.g. 30s.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        rpo: std::time::Duration,
        /// Removes the directory's own policy (it inherits its parent's again).
        #[arg(long, conflicts_with_all = ["sites", "mode"])]
        clear: bool,
    },
    /// Shows the policy that applies to a path and where it comes from.
    Get { path: String },
    /// Lists every directory that sets a policy.
    List,
}

#[derive(Args, Debug)]
pub struct HomeArgs {
    /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
    #[arg(long, global = true)]
    pub meta: Option<String>,
    #[command(subcommand)]
    pub command: HomeCommand,
}

#[derive(Subcommand, Debug)]
pub enum HomeCommand {
    /// Makes a new directory (a path in the namespace, e.g. /projects/x) the root of
    /// home HOME: it and everything made below it commit in that home's engine. A
    /// rename or hard link between homes fails with EXDEV (programs such as mv copy).
    Create {
        path: String,
        home: String,
        /// The directory's permission bits, in octal.
        #[arg(long, default_value = "755", value_parser = parse_mode)]
        mode: u32,
    },
    /// Lists the homes, their junctions and how many inodes each holds.
    List,
    /// Moves home HOME to site SITE: its writes commit at that site's PostgreSQL
    /// primary from then on (they pause while its rows are copied there from SITE's
    /// standby of the old primary). Every meta needs --site-db, --site-read-db and
    /// --site-meta for both sites.
    Move {
        home: String,
        #[arg(long = "to", value_name = "SITE")]
        to_site: String,
    },
}

/// SITE=VALUE of `locus meta --site-db`, `--site-read-db` and `--site-meta`.
fn parse_site(text: &str) -> Result<(String, String), String> {
    match parse_for_home(text)? {
        (Some(site), value) if !value.is_empty() => Ok((site, value)),
        _ => Err(format!("{text:?} is not SITE=VALUE, e.g. b=postgres://locus@10.0.2.1/locus")),
    }
}

/// NAME=URL of `locus meta --home`.
fn parse_home(text: &str) -> Result<(String, String), String> {
    match parse_for_home(text)? {
        (Some(name), url) => Ok((name, url)),
        _ => Err(format!("{text:?} is not NAME=URL, e.g. b=sqlite:///var/lib/locus/home-b.db")),
    }
}

/// `[NAME=]VALUE` of `locus meta --read-db` and `--forward-writes-to`: for the
/// metadata home NAME, or without it for the root's. A name is letters, digits, - and
/// _, so the = of a URL's query (`?sslmode=disable`) is no name's.
fn parse_for_home(text: &str) -> Result<(Option<String>, String), String> {
    let named = text.split_once('=').filter(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    });
    match named {
        Some((_, "")) => Err(format!("{text:?} names a home but no value after its =")),
        Some((name, value)) => Ok((Some(name.to_string()), value.to_string())),
        None if text.is_empty() => Err("an empty value".into()),
        None => Ok((None, text.to_string())),
    }
}

/// A mode in octal, e.g. 755.
fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{text:?} is not a mode in octal, e.g. 755"))
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// State directory: meta.db and the chunk store live here.
    #[arg(long, default_value = "~/.local/share/locus")]
    pub data_dir: String,
    /// Capacity offered by the embedded node, e.g. 10G.
    #[arg(long, default_value = "100G", value_parser = parse_size)]
    pub capacity: u64,
    /// Address meta listens on; `status`, `fsck` and `gc` find it without flags.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta_listen: String,
    /// Address the embedded storage node listens on.
    #[arg(long, default_value = "127.0.0.1:7101")]
    pub node_listen: String,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MetaArgs {
    /// Instead of serving: an administrative action on a metadata database.
    #[command(subcommand)]
    pub action: Option<MetaAction>,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Metadata database: `sqlite:///path/meta.db`, a bare path to a SQLite file, or
    /// `postgres://user@host:port/database` (an existing database, empty for --init).
    #[arg(long, default_value = "locus-meta.db")]
    pub db: String,
    /// Format a new cluster if the database is missing or empty; without it meta
    /// refuses to start on a database it did not format.
    #[arg(long)]
    pub init: bool,
    /// A PostgreSQL hot standby of --db at this site to read from: reads go there once
    /// it has replayed this meta's latest commit (else, after 50 ms, to the primary).
    /// NAME=URL: a standby of the database of home NAME (--home), likewise.
    #[arg(long, value_name = "[NAME=]URL", value_parser = parse_for_home)]
    pub read_db: Vec<(Option<String>, String)>,
    /// With --read-db, at a site away from the primary: the address of the meta at
    /// the primary's site (`host:port`). Every write is forwarded to it as one request,
    /// one round trip across the WAN instead of several statements against the primary,
    /// and is read back here at the standby once it has replayed the commit.
    /// NAME=HOST:PORT: the meta at the site holding home NAME (--home), which commits
    /// that home's writes (each site holds the homes its own writes go to).
    #[arg(long, requires = "read_db", value_name = "[NAME=]HOST:PORT", value_parser = parse_for_home)]
    pub forward_writes_to: Vec<(Option<String>, String)>,
    /// A metadata home besides the root's, NAME=URL (repeatable): a database of its own
    /// (sqlite:///path or postgres://...) that commits the subtrees `locus home create`
    /// gives it. An empty database (with --init) becomes a new home.
    #[arg(long = "home", value_name = "NAME=URL", value_parser = parse_home)]
    pub homes: Vec<(String, String)>,
    #[command(flatten)]
    pub sites: Box<SiteArgs>,
    /// Seconds a session may stay silent before its locks are dropped.
    #[arg(long, default_value_t = 30)]
    pub session_expiry_secs: u64,
    /// PostgreSQL: milliseconds of this meta's lease on the primary role; once it
    /// cannot be renewed for that long (primary or its synchronous standby cut off),
    /// writes are refused with EROFS. `locus meta promote` waits this long at most.
    /// 0: no lease (no fencing).
    #[arg(long, default_value_t = 10_000)]
    pub primary_lease_ms: u64,
    /// PostgreSQL, asynchronous replication: the metadata RPO, e.g. 10s. Writes are
    /// refused (EROFS) once no standby has confirmed what the primary wrote this long
    /// ago, so that a failover loses at most this much; they resume when a standby
    /// catches up. Needs a lease, and a role that may read pg_stat_replication
    /// (superuser or pg_monitor). Unset: writes never wait for the standbys.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub metadata_rpo: Option<std::time::Duration>,
    /// PostgreSQL: longest wait for the database's answer to one request; a stopped,
    /// overloaded or unreachable server then fails the operation (ETIMEDOUT) instead of
    /// holding it (and every operation queued behind it), e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub db_timeout: std::time::Duration,
    /// SITE=FILE: the site's identity map (grid-mapfile shape: `"<principal>" name uid`
    /// lines, a `[groups]` section, `nobody UID GID`), reloaded when it changes.
    /// Repeat per site; a site without one numbers owners with its local ids.
    #[arg(long = "identity-map", value_name = "SITE=FILE", value_parser = site_file)]
    pub identity_maps: Vec<(String, PathBuf)>,
    /// Trust root on this site's clients (by default root is squashed to nobody once
    /// TLS proves the site). Repeat per site.
    #[arg(long = "no-root-squash", value_name = "SITE")]
    pub no_root_squash: Vec<String>,
    /// Revocation list (`locus ca revoke` writes `CA_DIR/revoked`): one serial or
    /// name a line, reread when it changes, sent to every node and client.
    #[arg(long, value_name = "FILE")]
    pub revoked: Option<PathBuf>,
    /// Admits this node id at start, as `locus node admit` would (repeat for more).
    #[arg(long = "admit-node", value_name = "ID")]
    pub admit_nodes: Vec<String>,
    /// Appends every administrative action (who, what, when, from where) to this file;
    /// `locus status --audit` shows the latest either way.
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Clients of this site act for a user only with that user's login (`locus login`
    /// with the user's own certificate), not on the host's word (repeat for more sites).
    #[arg(long = "user-auth", value_name = "SITE")]
    pub user_auth: Vec<String>,
    /// Limits the uids (and gids) a client host may claim at all, e.g.
    /// `host7=1000-1999:100,200` (by the host certificate's name; repeat for more).
    #[arg(long = "host-ids", value_name = "HOST=UIDS[:GIDS]", value_parser = host_ids)]
    pub host_ids: Vec<(String, meta::authority::HostIds)>,
}

/// Where each site's PostgreSQL server and meta are, for moving metadata homes.
#[derive(Args, Debug)]
pub struct SiteArgs {
    /// The site this meta serves, which commits the homes placed there (default: its
    /// certificate's).
    #[arg(long)]
    pub site: Option<String>,
    /// For moving homes (`locus home move`): SITE=URL, the PostgreSQL primary server of
    /// SITE as this meta writes to it (any database of it; a home placed at SITE is the
    /// database of its own name there). Repeat per site, this meta's own included.
    #[arg(long = "site-db", value_name = "SITE=URL", value_parser = parse_site)]
    pub site_dbs: Vec<(String, String)>,
    /// For moving homes: SITE=URL, this site's hot standby of SITE's server (any
    /// database of it), to read the homes placed at SITE from.
    #[arg(long = "site-read-db", value_name = "SITE=URL", value_parser = parse_site)]
    pub site_read_dbs: Vec<(String, String)>,
    /// For moving homes: SITE=HOST:PORT, the meta of SITE, which commits the homes
    /// placed there.
    #[arg(long = "site-meta", value_name = "SITE=HOST:PORT", value_parser = parse_site)]
    pub site_metas: Vec<(String, String)>,
    /// A home this meta holds moves by itself to the site that does most of its writes
    /// for this long, e.g. 10m (0: only `locus home move` moves homes).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub auto_move_after: std::time::Duration,
    /// The share of the home's writes, in percent, that site must do in that time.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(51..=100))]
    pub auto_move_share: u8,
    /// The fewest writes of the home in that time that make it worth moving.
    #[arg(long, default_value_t = 1000)]
    pub auto_move_min_writes: u64,
    /// The least time between two moves of one home, however made, e.g. 30m.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub auto_move_hold: std::time::Duration,
}

/// `HOST=UIDS[:GIDS]` of `--host-ids`.
fn host_ids(s: &str) -> Result<(String, meta::authority::HostIds), String> {
    let (host, ids) = s.split_once('=').ok_or_else(|| format!("expected HOST=UIDS[:GIDS], got {s:?}"))?;
    Ok((host.to_string(), meta::authority::HostIds::parse(ids)?))
}

/// `SITE=FILE` of `--identity-map`.
fn site_file(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((site, file)) if !site.is_empty() && !file.is_empty() => Ok((site.to_string(), PathBuf::from(file))),
        _ => Err(format!("expected SITE=FILE, got {s:?}")),
    }
}

/// Administrative actions of `locus meta` on a database no meta is serving.
#[derive(Subcommand, Debug)]
pub enum MetaAction {
    /// Copy a whole namespace (and its cluster id) from a SQLite database into an empty
    /// PostgreSQL database, in one transaction, and check every table's row count.
    Migrate(MigrateArgs),
    /// Failover: make a PostgreSQL hot standby the primary of a new epoch (promote it,
    /// wait out the old epoch's leases, bump the epoch); then restart the metas with
    /// --db at it. Run it only once the old primary's site is lost or fenced.
    Promote(PromoteArgs),
    /// After a failover from an asynchronous standby: list what the lost primary had
    /// acknowledged past the standby's last replayed commit (the old primary's server
    /// started again, read only; the promoted database names that point). Exits 3
    /// when something was lost.
    Lost(LostArgs),
}

#[derive(Args, Debug)]
pub struct LostArgs {
    /// The old primary's database: `postgres://user@host:port/database`.
    #[arg(long)]
    pub old: String,
    /// The promoted database.
    #[arg(long)]
    pub new: String,
    /// The failover point in ms since the Unix epoch, for a database not promoted by
    /// `locus meta promote` (which records it).
    #[arg(long, value_name = "MS")]
    pub since_ms: Option<i64>,
}

#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// The standby's database: `postgres://user@host:port/database`.
    #[arg(long)]
    pub db: String,
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The SQLite database: `sqlite:///path/meta.db` or a bare path (meta stopped).
    #[arg(long)]
    pub from: String,
    /// The PostgreSQL database, which must be empty: `postgres://user@host:port/database`.
    #[arg(long)]
    pub to: String,
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub listen: String,
    /// Address clients use to reach this node (defaults to the listen address).
    #[arg(long)]
    pub advertise: Option<String>,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    /// Chunk store directory (required to run a node).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Unique node id (defaults to the listen address).
    #[arg(long)]
    pub id: Option<String>,
    #[arg(long, default_value = "default")]
    pub site: String,
    #[arg(long, default_value = "100G", value_parser = parse_size)]
    pub capacity: u64,
    /// Disk for copies of other sites' chunks cached at this site, e.g. 50G.
    #[arg(long, default_value = "16G", value_parser = parse_size)]
    pub cache: u64,
    /// TCP connections to each node of another site (an override: by default the count
    /// is chosen from the measured round trip, --wan-rate and the kernel's TCP windows).
    #[arg(long)]
    pub wan_connections: Option<usize>,
    /// Bytes per second a path to another site should carry, e.g. 125M (1 Gbit/s): sizes
    /// the automatic connection count.
    #[arg(long, default_value = "125M", value_parser = parse_size)]
    pub wan_rate: u64,
    /// Connections towards one site, overriding --wan-connections, e.g. `b=16`; repeatable.
    #[arg(long, value_parser = parse_site_count)]
    pub wan_connections_to: Vec<(String, usize)>,
    /// Serve Prometheus metrics on this address (`GET /metrics`).
    #[arg(long)]
    pub metrics: Option<String>,
    /// Reclaim unreferenced chunks (of failed writes and deleted files) once the store
    /// is fuller than this percentage of its capacity.
    #[arg(long, default_value_t = 90.0)]
    pub reclaim_above: f64,
    /// Unreferenced chunks written more recently than this are kept (writes in flight).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub reclaim_grace: std::time::Duration,
    /// Encrypt chunks at rest with the key in FILE (64 hex digits, e.g. from
    /// `openssl rand -hex 32`; keep it off the node's data disk). Chunk ids stay the
    /// hash of the plaintext (see SECURITY.md).
    #[arg(long, value_name = "FILE")]
    pub encrypt_key: Option<PathBuf>,
    /// How long a sync or semi-sync write waits for its copies at other nodes and sites
    /// before it fails (EIO at fsync/close), e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub sync_timeout: std::time::Duration,
    /// Bytes per second the repair worker may send to restore missing copies, e.g. 64M.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub repair_rate: u64,
    /// Pause between the repair worker's scans for under-replicated chunks.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub repair_every: std::time::Duration,
    /// Bytes per second the scrub worker may re-hash, e.g. 16M.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    pub scrub_rate: u64,
    /// Pause between complete scrub passes over the store, e.g. 24h.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub scrub_every: std::time::Duration,
    /// A join token (`locus node token`) that admits this node if no operator ran
    /// `locus node admit` for it; spent once.
    #[arg(long, env = "LOCUS_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// Instead of running a node, act on one.
    #[command(subcommand)]
    pub action: Option<NodeAction>,
}

#[derive(Subcommand, Debug)]
pub enum NodeAction {
    /// Empties a node before it is removed: it takes no new chunks, and the repair
    /// workers copy its chunks to other nodes (progress: `locus fsck`, `locus status`).
    Drain {
        /// The node's id.
        id: String,
        /// Stop draining: the node takes chunks again.
        #[arg(long)]
        undo: bool,
        /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
        #[arg(long)]
        meta: Option<String>,
    },
    /// Lets a node join: meta accepts its registrations from now on (a node not yet
    /// admitted waits, listed by `locus status` as pending admission).
    Admit {
        /// The node's id (its certificate's name).
        id: String,
        /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
        #[arg(long)]
        meta: Option<String>,
    },
    /// Makes a single-use join token: `locus node --join-token TOKEN` then joins without
    /// `locus node admit` (meta keeps only its hash).
    Token {
        /// How long it stays valid, e.g. 1h.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        ttl: std::time::Duration,
        /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
        #[arg(long)]
        meta: Option<String>,
    },
    /// Drains a node, waits until every chunk it holds has a copy on another node,
    /// then removes it: meta forgets it and refuses its registrations from then on.
    Remove {
        /// The node's id.
        id: String,
        /// Remove it now, without waiting for its chunks to be copied: chunks only it
        /// holds are lost.
        #[arg(long)]
        force: bool,
        /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
        #[arg(long)]
        meta: Option<String>,
    },
}

impl NodeAction {
    /// The `--meta` flag of the action.
    pub fn meta(&self) -> Option<&str> {
        match self {
            NodeAction::Drain { meta, .. }
            | NodeAction::Admit { meta, .. }
            | NodeAction::Token { meta, .. }
            | NodeAction::Remove { meta, .. } => meta.as_deref(),
        }
    }
}

#[derive(Args, Debug)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    #[arg(long, default_value = "default")]
    pub site: String,
    /// Where this host's users leave their logins (`locus login`): a file per uid,
    /// sent with that user's requests (made sticky and world-writable if new).
    #[arg(long, default_value = DEFAULT_LOGINS)]
    pub logins: PathBuf,
    /// Return once mounted, leaving the mount served by a process of its own (what
    /// mount(8) expects of `mount -t fuse.locus` and fstab; `umount` stops it).
    #[arg(long)]
    pub background: bool,
    /// With --background: where the mount's log goes (appended); without one it is
    /// discarded.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Started by --background: lets go of the starter's output once mounted.
    #[arg(long, hide = true)]
    pub detached: bool,
    #[command(flatten)]
    pub tuning: ClientTuning,
}

/// Client knobs shared by `up` and `mount`.
#[derive(Args, Debug, Clone)]
pub struct ClientTuning {
    /// Size of chunks cut from written data, e.g. 4M.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub chunk_size: u64,
    /// Memory for cached chunks, e.g. 512M.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub cache: u64,
    /// Most chunks read ahead of a sequential reader (the window grows to it). 32 x 4 MiB
    /// keeps a 1 Gbit/s path full up to ~100 ms (bench/results/wan-seeds-readahead32.md).
    #[arg(long, default_value_t = 32)]
    pub readahead_chunks: u64,
    /// Chunk uploads in flight at once (32 × 4 MiB covers 1 Gbit/s to a `sync` site 100 ms away).
    #[arg(long, default_value_t = 32)]
    pub upload_window: usize,
    /// Seconds the kernel may cache names and attributes.
    #[arg(long, default_value_t = 1.0)]
    pub attr_ttl: f64,
    /// Longest wait for meta or a node (each connect, send, answer); a hung peer
    /// fails the operation (ETIMEDOUT) after it, e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub rpc_timeout: std::time::Duration,
}

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
    #[arg(long)]
    pub meta: Option<String>,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Show only the audit log: the latest administrative actions (who, what, when,
    /// from where; `locus meta --audit-log FILE` keeps them all).
    #[arg(long)]
    pub audit: bool,
}

#[derive(Args, Debug)]
pub struct GcArgs {
    /// Meta's address [default: the cluster `locus up` runs, else 127.0.0.1:7070].
    #[arg(long)]
    pub meta: Option<String>,
    /// Only chunks stored longer ago than this are deleted (protects writes in flight).
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub min_age: std::time::Duration,
    /// Show what would be deleted, delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete even when nearly every stored chunk is unreferenced (which is what a
    /// wrong or new metadata database looks like, so gc refuses that by default).
    #[arg(long)]
    pub force: bool,
}

/// `10G`, `512M`, `4k` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_lowercase();
            let mult: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use k, M, G or T)")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size such as 10G"))?;
    if n < 0.0 {
        return Err(format!("{s:?}: a size cannot be negative"));
    }
    Ok((n * mult as f64) as u64)
}

/// `SITE=N`.
pub fn parse_site_count(s: &str) -> Result<(String, usize), String> {
    let (site, n) = s.split_once('=').ok_or_else(|| format!("{s:?} is not SITE=N"))?;
    let n: usize = n.parse().map_err(|_| format!("{s:?}: {n:?} is not a number of connections"))?;
    if site.is_empty() || n == 0 {
        return Err(format!("{s:?}: need a site name and at least one connection"));
    }
    Ok((site.to_string(), n))
}

/// `90s`, `15m`, `2h` or plain seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('s') => (&s[..s.len() - 1], 1),
        Some('m') => (&s[..s.len() - 1], 60),
        Some('h') => (&s[..s.len() - 1], 3600),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration such as 15m"))?;
    Ok(std::time::Duration::from_secs(n * mult))
}

/// Parses the command line (as mount(8)'s helper, the `locus mount` it stands for;
/// `None`: nothing to do), splicing in the config file's table for the command.
/// Returns the arguments parsed too (before the splice).
pub fn parse() -> anyhow::Result<Option<(Cli, Vec<String>)>> {
    let argv = match crate::mount_helper::invocation(std::env::args().collect()) {
        Ok(crate::mount_helper::Invocation::Run(argv)) => argv,
        Ok(crate::mount_helper::Invocation::Nothing) => return Ok(None),
        Err(e) => anyhow::bail!("{e}"),
    };
    parse_from(&argv).map(|cli| Some((cli, argv)))
}

/// The command line `argv` with its config file's flags (`--config`) spliced in.
fn parse_from(argv: &[String]) -> anyhow::Result<Cli> {
    let first = Cli::try_parse_from(argv).unwrap_or_else(|e| e.exit());
    let Some(path) = &first.config else {
        return Ok(first);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
    let Some(pos) = argv.iter().position(|a| COMMANDS.contains(&a.as_str())) else {
        return Ok(first);
    };
    let flags = config_flags(&text, &argv[pos]).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
    let mut spliced: Vec<String> = argv[..=pos].to_vec();
    spliced.extend(flags);
    spliced.extend_from_slice(&argv[pos + 1..]);
    Ok(Cli::try_parse_from(&spliced).unwrap_or_else(|e| e.exit()))
}

/// The flags a config file's table for `command` stands for (`key = value` becomes
/// `--key=value`, `_` in keys read as `-`; `key = true` the bare flag, `false` nothing;
/// an array one flag per item, for flags given more than once); command-line flags given
/// after them win. Any text is either decoded or refused with the reason, never a panic.
pub fn config_flags(text: &str, command: &str) -> Result<Vec<String>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("not valid TOML: {e}"))?;
    let Some(section) = table.get(command) else {
        return Ok(Vec::new());
    };
    let section = section.as_table().ok_or_else(|| format!("[{command}] must be a table"))?;
    let scalar = |value: &toml::Value| match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Ok(section
        .iter()
        .flat_map(|(key, value)| {
            let flag = format!("--{}", key.replace('_', "-"));
            match value {
                toml::Value::Boolean(true) => vec![flag],
                toml::Value::Boolean(false) => Vec::new(),
                toml::Value::Array(items) => items.iter().map(|item| format!("{flag}={}", scalar(item))).collect(),
                other => vec![format!("{flag}={}", scalar(other))],
            }
        })
        .collect())
}

const COMMANDS: &[&str] = &["up", "meta", "node", "mount", "status", "fsck", "gc", "bench", "nbd", "doctor"];

/// `locus completions SHELL`: the script, written to stdout.
pub fn completions(shell: clap_complete::Shell) {
    let mut cli = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cli, "locus", &mut std::io::stdout());
}

/// `locus man DIR`: a page per command, named as `man` finds them (`locus-ca-issue.1`).
pub fn man_pages(dir: &std::path::Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let cli = <Cli as clap::CommandFactory>::command();
    clap_mangen::generate_to(cli, dir)?;
    Ok(std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "1"))
        .count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("5X").is_err());
        assert!(parse_size("-1G").is_err());
        assert_eq!(parse_duration("15m"), Ok(std::time::Duration::from_secs(900)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_site_count("b=16"), Ok(("b".to_string(), 16)));
        assert!(parse_site_count("b=0").is_err() && parse_site_count("16").is_err());
    }

    #[test]
    fn exports() {
        let spec = parse_export("vm1=/disks/vm1.img,size=10G").unwrap();
        assert_eq!(
            spec,
            ExportSpec { name: "vm1".into(), path: "/disks/vm1.img".into(), size: Some(10 << 30), read_only: false }
        );
        assert!(parse_export("vm1=/a,ro").unwrap().read_only);
        for bad in ["vm1", "=/a", "vm1=", "vm1=/a,size=5X", "vm1=/a,rw", "vm1=/a,ro,size=1G"] {
            assert!(parse_export(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_config_table_becomes_flags() {
        let text = "[node]\nsite = \"b\"\ncache_bytes = 1024\n[mount]\nsite = \"a\"\n";
        let mut flags = config_flags(text, "node").unwrap();
        flags.sort();
        assert_eq!(flags, ["--cache-bytes=1024", "--site=b"]);
        assert_eq!(config_flags(text, "meta"), Ok(vec![]));
        let text = "[meta]\ninit = true\ninsecure_no_tls = false\nno_root_squash = [\"a\", \"b\"]\n";
        assert_eq!(config_flags(text, "meta").unwrap(), ["--init", "--no-root-squash=a", "--no-root-squash=b"]);
        assert!(config_flags("node = 3", "node").unwrap_err().contains("[node] must be a table"));
        assert!(config_flags("[node\n", "node").unwrap_err().starts_with("not valid TOML"));
    }

    /// The example configuration of two sites (deploy/two-sites/) holds only flags the
    /// commands have, with values they accept.
    #[test]
    fn the_two_site_example_configuration_parses() {
        for (file, text) in [
            ("a.toml", include_str!("../../../deploy/two-sites/a.toml")),
            ("b.toml", include_str!("../../../deploy/two-sites/b.toml")),
        ] {
            let tables: toml::Table = toml::from_str(text).unwrap();
            assert!(tables.contains_key("node") && tables.contains_key("mount"), "{file} has no [node] or [mount]");
            for command in tables.keys() {
                let mut argv = vec!["locus".to_string(), command.clone()];
                argv.extend(config_flags(text, command).unwrap());
                if command == "mount" {
                    argv.push("/mnt/locus".into());
                }
                if let Err(e) = Cli::try_parse_from(&argv) {
                    panic!("{file} [{command}]: {e}");
                }
            }
        }
    }

    proptest::proptest! {
        /// Config files are decoded by the `toml` crate (fuzzed upstream); what Locus adds
        /// is the table-to-flags splice, which any text either passes or is refused by
        /// with a reason, never a panic (the binary crate cannot be a cargo-fuzz target).
        #[test]
        fn any_config_text_is_decoded_or_refused(text in "(\\[[a-z]{0,5}\\]\n|[a-z_]{0,6} ?= ?(\"[^\"\n]{0,6}\"|[0-9]{0,4}|true|\\[1, ?2\\]|\\{a=1\\})?\n|.{0,10}\n){0,10}") {
            for command in ["node", "meta", "mount"] {
                if let Ok(flags) = config_flags(&text, command) {
                    for flag in flags {
                        proptest::prop_assert!(flag.starts_with("--"), "{flag}");
                    }
                }
            }
        }
    }
}
