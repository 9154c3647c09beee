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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run meta (SQLite), one node and a mount in one process; Ctrl-C unmounts and stops.
    Up(UpArgs),
    /// Run the metadata service.
    Meta(MetaArgs),
    /// Run a storage node.
    Node(NodeArgs),
    /// Mount the namespace with FUSE.
    Mount(MountArgs),
    /// Show nodes, capacity, chunks and sessions.
    Status(AdminArgs),
    /// Check every chunk against its id and every extent against the catalogue.
    Fsck(AdminArgs),
    /// Delete chunks that no file references any more.
    Gc(GcArgs),
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
pub struct MetaArgs {
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Metadata database: `sqlite:///path/meta.db` or a bare path to a SQLite file.
    #[arg(long, default_value = "locus-meta.db")]
    pub db: String,
    /// Format a new cluster if the database is missing or empty; without it meta
    /// refuses to start on a database it did not format.
    #[arg(long)]
    pub init: bool,
    /// Seconds a session may stay silent before its locks are dropped.
    #[arg(long, default_value_t = 30)]
    pub session_expiry_secs: u64,
    /// SITE=FILE: the site's identity map (grid-mapfile shape: `"<principal>" name uid`
    /// lines, a `[groups]` section, `nobody UID GID`), reloaded when it changes.
    /// Repeat per site; a site without one numbers owners with its local ids.
    #[arg(long = "identity-map", value_name = "SITE=FILE", value_parser = site_file)]
    pub identity_maps: Vec<(String, PathBuf)>,
    /// Trust root on this site's clients (by default root is squashed to nobody once
    /// TLS proves the site). Repeat per site.
    #[arg(long = "no-root-squash", value_name = "SITE")]
    pub no_root_squash: Vec<String>,
}

/// `SITE=FILE` of `--identity-map`.
fn site_file(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((site, file)) if !site.is_empty() && !file.is_empty() => Ok((site.to_string(), PathBuf::from(file))),
        _ => Err(format!("expected SITE=FILE, got {s:?}")),
    }
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
    /// Chunk store directory.
    #[arg(long)]
    pub data_dir: PathBuf,
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
    /// TCP connections to each node of another site; a chunk travels striped over them.
    #[arg(long, default_value_t = 8)]
    pub wan_connections: usize,
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
}

#[derive(Args, Debug)]
pub struct MountArgs {
    pub mountpoint: PathBuf,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub meta: String,
    #[arg(long, default_value = "default")]
    pub site: String,
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
    /// Chunk uploads in flight at once.
    #[arg(long, default_value_t = 16)]
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

/// Parses the command line, splicing in the config file's table for the command.
pub fn parse() -> anyhow::Result<Cli> {
    let argv: Vec<String> = std::env::args().collect();
    let first = Cli::try_parse_from(&argv).unwrap_or_else(|e| e.exit());
    let Some(path) = &first.config else {
        return Ok(first);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {} is not valid TOML: {e}", path.display()))?;
    let Some(pos) = argv.iter().position(|a| COMMANDS.contains(&a.as_str())) else {
        return Ok(first);
    };
    let mut spliced: Vec<String> = argv[..=pos].to_vec();
    if let Some(section) = table.get(&argv[pos]) {
        let section = section
            .as_table()
            .ok_or_else(|| anyhow::anyhow!("config file {}: [{}] must be a table", path.display(), argv[pos]))?;
        for (key, value) in section {
            let value = match value {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            spliced.push(format!("--{}={value}", key.replace('_', "-")));
        }
    }
    spliced.extend_from_slice(&argv[pos + 1..]);
    Ok(Cli::try_parse_from(&spliced).unwrap_or_else(|e| e.exit()))
}

const COMMANDS: &[&str] = &["up", "meta", "node", "mount", "status", "fsck", "gc"];

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
}
