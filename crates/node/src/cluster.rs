//! The cluster a node belongs to: adopted from meta at its first registration, kept in
//! `<data dir>/CLUSTER`, and checked against meta at every registration after that, so
//! a node never serves (or lets gc empty) its chunks for another cluster's meta.

use crate::NodeError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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

impl Membership {
    /// Reads the cluster id kept in `data_dir`, if the node has registered before.
    pub(crate) fn load(data_dir: &Path) -> Result<Membership, NodeError> {
        let path = data_dir.join("CLUSTER");
        let id = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("read", &path)(e)),
        };
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
                let tmp = self.path.with_extension("tmp");
                let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
                f.write_all(format!("{theirs}\n").as_bytes()).map_err(io_err("write", &tmp))?;
                f.sync_all().map_err(io_err("sync", &tmp))?;
                std::fs::rename(&tmp, &self.path).map_err(io_err("rename", &tmp))?;
                if let Some(dir) = self.path.parent() {
                    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))?;
                }
                tracing::info!(cluster = theirs, "node joined the cluster");
                *id = Some(theirs.into());
                Ok(())
            }
        }
    }
}
