//! The client's `session` worker: heartbeats keep the session (its locks and open
//! files) alive at meta, reopen it if meta forgot it, and refresh the node list.

use crate::data::DataPath;
use crate::error::VfsError;
use crate::meta_link::MetaLink;
use proto::error::ErrorCode;
use proto::meta::{Heartbeat, ReportWorkers};
use std::sync::{Arc, Weak};
use std::time::Duration;
use util::worker::{Step, Worker, Workers, every};

/// Heartbeats at the period meta asked for, with the client's worker report.
pub(crate) struct SessionKeeper {
    pub meta: Arc<MetaLink>,
    pub data: Arc<DataPath>,
    pub period: Duration,
    pub reopened: u64,
    /// The client's workers (this one among them), for the report.
    pub workers: Weak<Workers>,
    /// What the client is, for `locus status` (its purpose: a mount point or a verb).
    pub purpose: String,
}

impl Worker for SessionKeeper {
    type Error = VfsError;

    fn name(&self) -> String {
        "session".into()
    }

    fn progress(&self) -> String {
        format!("session {}, reopened {} times", self.meta.session(), self.reopened)
    }

    async fn work(&mut self) -> Result<Step, VfsError> {
        let session = self.meta.session();
        match self.meta.call(Heartbeat { session }).await {
            Err(e) if e.code == ErrorCode::NotFound => {
                tracing::warn!("session {session} expired at meta; opening a new one (locks were lost)");
                self.period = self.meta.hello().await?;
                self.reopened += 1;
            }
            Err(e) => return Err(VfsError::new(e.code, format!("heartbeat: {}", e.context))),
            Ok(_) => {}
        }
        self.data.refresh_nodes().await?;
        if let Some(workers) = self.workers.upgrade() {
            let process = format!("session {} ({})", self.meta.session(), self.purpose);
            self.meta.call(ReportWorkers { process, workers: workers.statuses() }).await?;
        }
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}
