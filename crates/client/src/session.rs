//! The client's `session` worker: heartbeats keep the session (its locks and open
//! files) alive at meta (a heartbeat in a session meta forgot opens a new one, as any
//! request does: `MetaLink::call`), and refresh the node list.

use crate::data::DataPath;
use crate::error::VfsError;
use crate::meta_link::MetaLink;
use proto::meta::{Heartbeat, Revocations};
use std::sync::Arc;
use std::time::Duration;
use util::worker::{Step, Worker, every};

/// Heartbeats at the period meta asked for.
pub(crate) struct SessionKeeper {
    pub meta: Arc<MetaLink>,
    pub data: Arc<DataPath>,
    pub period: Duration,
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
            self.meta.reopened(),
            self.data.cached_bytes()
        )
    }

    async fn work(&mut self) -> Result<Step, VfsError> {
        let session = self.meta.session();
        if let Err(e) = self.meta.call(Heartbeat { session }).await {
            return Err(VfsError::new(e.code, format!("heartbeat: {}", e.context)));
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
