//! The record `locus up` leaves of the local cluster it runs (meta, node, mount
//! point), in its data directory and in a per-user file, so that `status`, `fsck` and
//! `gc` find it without `--meta`.

use crate::cli::TlsArgs;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// Where `status`, `fsck` and `gc` look when no `--meta` is given and no local
/// cluster is recorded: `locus meta`'s and `locus up`'s default address.
pub const DEFAULT_META: &str = "127.0.0.1:7070";

/// File name of the record, in the data directory and in the per-user state directory.
const RECORD: &str = "local-cluster.toml";

/// The addresses of a running `locus up`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LocalCluster {
    /// Meta's address.
    pub meta: String,
    /// The embedded node's address.
    pub node: String,
    /// Where the namespace is mounted.
    pub mountpoint: PathBuf,
    /// Process id of the `locus up` that wrote the record.
    pub pid: u32,
    /// The CA and certificates `locus up` made (`DATA_DIR/tls`), for admin commands.
    #[serde(default)]
    pub tls: Option<PathBuf>,
}

/// The per-user record: `$XDG_STATE_HOME/locus/`, else `~/.local/state/locus/`.
pub fn user_record() -> Option<PathBuf> {
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(&std::env::var_os("HOME")?).join(".local/state"),
    };
    Some(state.join("locus").join(RECORD))
}

impl LocalCluster {
    /// Writes the record into `data_dir` and the per-user location.
    pub fn save(&self, data_dir: &Path) -> anyhow::Result<()> {
        let text = toml::to_string(self).context("cannot encode the local cluster record")?;
        let mut paths = vec![data_dir.join(RECORD)];
        paths.extend(user_record());
        for path in paths {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::write(&path, &text).with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(())
    }

    /// Removes the records this process wrote (a newer `locus up` may own the
    /// per-user one: that one is left alone).
    pub fn remove(&self, data_dir: &Path) {
        let mut paths = vec![data_dir.join(RECORD)];
        paths.extend(user_record());
        for path in paths {
            if read(&path).is_some_and(|r| r.pid == self.pid) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn read(path: &Path) -> Option<LocalCluster> {
    toml::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The meta address for an admin command: the flag (or config file) if given, else
/// the local cluster recorded by `locus up`, else [`DEFAULT_META`].
pub fn meta_addr(flag: Option<&str>) -> String {
    if let Some(addr) = flag {
        return addr.to_string();
    }
    user_record().and_then(|p| read(&p)).map_or_else(|| DEFAULT_META.to_string(), |r| r.meta)
}

/// The TLS set-up of an admin command: its flags if it has any, else the admin
/// certificate of the `locus up` cluster it talks to (recorded beside its address).
pub fn admin_tls(args: TlsArgs, meta_flag: Option<&str>) -> TlsArgs {
    if args.insecure_no_tls || args.ca.is_some() || args.cert.is_some() || args.key.is_some() {
        return args;
    }
    let record = user_record().and_then(|p| read(&p));
    match record {
        Some(LocalCluster { tls: Some(dir), meta, .. }) if meta_flag.is_none_or(|m| m == meta) => {
            crate::pki::LocalPki { dir }.admin()
        }
        _ => args,
    }
}
