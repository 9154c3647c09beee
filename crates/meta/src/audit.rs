//! The audit log: every administrative action (admitting, removing or draining a node,
//! a join token, a replication policy, chunks forgotten by gc or reclaim) with who
//! asked (the certificate's name, role and site), from where, when and how it ended.
//! Kept in meta's memory for `locus status --audit` and, when configured, appended to a
//! file one line per action (tab-separated: unix time in milliseconds, who, from where,
//! what, outcome) so that it outlives a restart.

use crate::error::MetaError;
use proto::meta::{AuditEntry, MetaRequest};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use util::sync::lock;

/// How many entries `locus status --audit` shows (the file keeps them all).
const RECENT: usize = 256;

/// Where audited actions go.
pub struct AuditLog {
    file: Option<(PathBuf, Mutex<std::fs::File>)>,
    recent: Mutex<VecDeque<AuditEntry>>,
}

impl AuditLog {
    /// A log kept in memory only.
    pub fn in_memory() -> AuditLog {
        AuditLog { file: None, recent: Mutex::new(VecDeque::new()) }
    }

    /// A log kept in memory, and appended to `path` if given (created 0600 if new).
    pub fn open(path: Option<&Path>) -> Result<AuditLog, MetaError> {
        let Some(p) = path else { return Ok(AuditLog::in_memory()) };
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(p)
            .map_err(|source| MetaError::Io { what: format!("opening the audit log {}", p.display()), source })?;
        let file = Some((p.to_path_buf(), Mutex::new(f)));
        Ok(AuditLog { file, ..AuditLog::in_memory() })
    }

    /// Records one action. A failure to write the file is logged, not returned: the
    /// action itself already happened.
    pub fn record(&self, entry: AuditEntry) {
        tracing::info!(who = %entry.who, from = %entry.from, outcome = %entry.outcome, "audit: {}", entry.action);
        if let Some((path, file)) = &self.file {
            let line = format!(
                "{}\t{}\t{}\t{}\t{}\n",
                entry.at_ms,
                clean(&entry.who),
                clean(&entry.from),
                clean(&entry.action),
                clean(&entry.outcome)
            );
            let mut f = lock(file);
            if let Err(e) = f.write_all(line.as_bytes()).and_then(|()| f.sync_data()) {
                tracing::error!("cannot append to the audit log {}: {e}", path.display());
            }
        }
        let mut recent = lock(&self.recent);
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(entry);
    }

    /// The latest entries, oldest first.
    pub fn recent(&self) -> Vec<AuditEntry> {
        lock(&self.recent).iter().cloned().collect()
    }
}

/// One line per entry: tabs and line breaks in a field become spaces.
fn clean(field: &str) -> String {
    field.replace(['\t', '\n', '\r'], " ")
}

/// What an audited request does, in a line; `None` for requests the request table
/// does not mark `audited`.
pub fn action(req: &MetaRequest) -> Option<String> {
    use MetaRequest as R;
    if !req.facts().audited {
        return None;
    }
    Some(match req {
        R::AdmitNode(m) => format!("admit node {}", m.node),
        R::RemoveNode(m) => format!("remove node {}", m.node),
        R::MakeJoinToken(m) => format!("make a join token valid {} s", m.ttl_secs),
        R::DrainNode(m) => format!("{} node {}", if m.drained { "drain" } else { "undrain" }, m.node),
        R::SetPolicy(m) => match &m.policy {
            Some(p) => format!("set the replication policy of inode {} to {p:?}", m.ino),
            None => format!("remove the replication policy of inode {}", m.ino),
        },
        R::ForgetChunks(m) => format!("forget {} unreferenced chunks", m.ids.len()),
        R::Login(m) => format!("log in for {} s", m.lifetime_secs.min(proto::meta::MAX_LOGIN_SECS)),
        // An audited request without wording of its own: its name.
        other => other.name().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_go_to_memory_and_file_one_line_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(Some(&path)).unwrap();
        for i in 0..RECENT + 3 {
            log.record(AuditEntry {
                at_ms: i as i64,
                who: "ad\tmin".into(),
                from: "127.0.0.1:1".into(),
                action: format!("admit node n{i}\n"),
                outcome: "ok".into(),
            });
        }
        let recent = log.recent();
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0].at_ms, 3, "the oldest went first");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), RECENT + 3);
        assert_eq!(text.lines().next().unwrap(), "0\tad min\t127.0.0.1:1\tadmit node n0 \tok");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
