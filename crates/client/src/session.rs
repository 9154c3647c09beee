//! The client's `session` worker: heartbeats keep the session (its locks and open
//! files) alive at meta, reopen it if meta forgot it, and refresh the node list.

use crate::data::DataPath;
use crate::error::VfsError;
use crate::meta_link::MetaLink;
use proto::error::ErrorCode;
use proto::meta::{Heartbeat, Revocations};
use std::sync::Arc;
use std::time::Duration;
use util::worker::{Step, Worker, every};

/// Heartbeats at the period meta asked for.
pub(crate) struct SessionKeeper {
    pub meta: Arc<MetaLink>,
    pub data: Arc<DataPath>,
    pub period: Duration,
    pub reopened: u64,
}

impl Worker for SessionKeeper {
    type Error = VfsError;

    fn name(&self) -> String {
        "session".into()
    }

    fn progress(&self) -> String {
        format!(
            "session {}, reopened {} times, {} bytes of chunks in memory",
            self.meta.session(),
            self.reopened,
            self.data.cached_bytes()
        )
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
        // The revocation list meta distributes: connections of revoked peers go.
        if let Ok(list) = self.meta.call(Revocations {}).await {
            net::set_revoked(list.entries);
        }
        self.data.refresh_nodes().await?;
        Ok(Step::Idle)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}
