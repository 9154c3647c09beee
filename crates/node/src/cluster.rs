//! The cluster a node belongs to: adopted from meta at its first registration, kept in
//! `<data dir>/CLUSTER`, and checked against meta at every registration after that, so
//! a node never serves (or lets gc empty) its chunks for another cluster's meta. Also
//! the highest epoch of the primary role the node has seen (`<data dir>/EPOCH`), so a
//! meta that lost the primary role cannot have the node work for it, after a restart
//! of the node too.

use crate::NodeError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use util::sync::lock;

/// The node's cluster id, once it has one.
pub(crate) struct Membership {
    path: PathBuf,
    id: Mutex<Option<String>>,
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> NodeError {
    let what = format!("cannot {what} {}", path.display());
    move |e| NodeError::Internal(format!("{what}: {e}"))
}

/// The trimmed text of `path`, `None` if it does not exist.
fn read_text(path: &Path) -> Result<Option<String>, NodeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Replaces `path` with `line` durably: a temporary file, synced, renamed over it,
/// and the directory synced, so a crash leaves the old or the new text, never less.
fn write_durably(path: &Path, line: &str) -> Result<(), NodeError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(format!("{line}\n").as_bytes()).map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("sync", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))?;
    }
    Ok(())
}

impl Membership {
    /// Reads the cluster id kept in `data_dir`, if the node has registered before.
    pub(crate) fn load(data_dir: &Path) -> Result<Membership, NodeError> {
        let path = data_dir.join("CLUSTER");
        let id = read_text(&path)?;
        Ok(Membership { path, id: Mutex::new(id) })
    }

    /// The id to present to meta; `None` before the first registration.
    pub(crate) fn id(&self) -> Option<String> {
        lock(&self.id).clone()
    }

    /// Takes meta's answer: adopts (and durably stores) the id at the first
    /// registration, and refuses a meta of another cluster afterwards.
    pub(crate) fn confirm(&self, meta_addr: &str, theirs: &str) -> Result<(), NodeError> {
        let mut id = lock(&self.id);
        match id.as_deref() {
            Some(ours) if ours == theirs => Ok(()),
            Some(ours) => Err(NodeError::WrongCluster {
                addr: meta_addr.into(),
                ours: ours.into(),
                theirs: theirs.into(),
                file: self.path.display().to_string(),
            }),
            None => {
                write_durably(&self.path, theirs)?;
                tracing::info!(cluster = theirs, "node joined the cluster");
                *id = Some(theirs.into());
                Ok(())
            }
        }
    }
}

/// The highest epoch of the primary role this node has seen from a meta (0 before
/// the first registration). Capabilities of older epochs are refused (`authz`), metas
/// of older epochs are not followed, and every call to meta carries it.
pub struct Epoch {
    /// Where it is kept (`None`: a node without a meta, which never learns one).
    path: Option<PathBuf>,
    seen: AtomicU64,
    /// Serialises raising it, so the file never goes back to a lower epoch.
    raising: Mutex<()>,
}

impl Epoch {
    /// Reads the epoch kept in `data_dir` (0 if none was ever seen).
    pub(crate) fn load(data_dir: &Path) -> Result<Epoch, NodeError> {
        let path = data_dir.join("EPOCH");
        let seen = match read_text(&path)? {
            None => 0,
            Some(text) => text
                .parse()
                .map_err(|e| NodeError::Internal(format!("{} holds {text:?}, not an epoch: {e}", path.display())))?,
        };
        Ok(Epoch { path: Some(path), seen: AtomicU64::new(seen), raising: Mutex::new(()) })
    }

    /// A node that serves only its own chunks and talks to no meta (`NodeService::new`).
    pub(crate) fn none() -> Epoch {
        Epoch { path: None, seen: AtomicU64::new(0), raising: Mutex::new(()) }
    }

    /// The highest epoch seen.
    pub(crate) fn get(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// Takes the epoch `source` serves or acts under (meta at an address, or an
    /// authorized request): a newer one is adopted (on disk before it counts, so a
    /// restart does not forget it); an older one means that meta lost the primary
    /// role, and the node refuses to follow it.
    pub(crate) fn observe(&self, source: &str, theirs: u64) -> Result<(), NodeError> {
        let ours = self.get();
        if theirs < ours {
            return Err(NodeError::StaleMeta { addr: source.into(), theirs, ours });
        }
        if theirs > ours {
            let _raising = lock(&self.raising);
            if theirs > self.get() {
                if let Some(path) = &self.path {
                    write_durably(path, &theirs.to_string())?;
                }
                self.seen.store(theirs, Ordering::Release);
                tracing::info!(
                    epoch = theirs,
                    previous = ours,
                    from = source,
                    "learned a newer epoch of the primary role: capabilities of older ones are refused from now on"
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The epoch only rises, a meta of an older one is refused, and a restart of the
    /// node (loading the data directory again) remembers it.
    #[test]
    fn the_epoch_rises_refuses_older_metas_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let epoch = Epoch::load(dir.path()).unwrap();
        assert_eq!(epoch.get(), 0);
        epoch.observe("meta-a", 1).unwrap();
        epoch.observe("meta-b", 2).unwrap();
        assert_eq!(epoch.get(), 2);
        let refused = epoch.observe("meta-a", 1).unwrap_err();
        assert!(matches!(refused, NodeError::StaleMeta { theirs: 1, ours: 2, .. }), "{refused}");
        assert!(refused.to_string().contains("meta-a"), "{refused}");
        assert_eq!(epoch.get(), 2);
        drop(epoch);
        let restarted = Epoch::load(dir.path()).unwrap();
        assert_eq!(restarted.get(), 2, "the epoch is kept in the data directory");
        assert!(restarted.observe("meta-a", 1).is_err());
        std::fs::write(dir.path().join("EPOCH"), "two\n").unwrap();
        assert!(Epoch::load(dir.path()).is_err(), "a damaged file is an error, not epoch 0");
    }
}
