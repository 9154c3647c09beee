//! The `reclaim` worker: once the chunk store is fuller than its high-water mark, it
//! deletes chunks that no file references and that nobody has written for a grace
//! period — chunks of writes that never committed (a failed close, a crashed client)
//! and of deleted files — so a full store recovers without an operator running `gc`.
//! A put refreshes a chunk's age, so a write in flight (or a dedupe hit on an old
//! chunk) is never reclaimed under it; meta refuses to forget referenced chunks.

use chunk::ChunkStore;
use proto::error::{ErrorCode, WireError};
use proto::meta::{ForgetChunks, Unreferenced};
use std::sync::Arc;
use std::time::{Duration, Instant};
use util::worker::{Step, Worker, every};

/// Chunk ids asked about per round trip to meta.
const PAGE: usize = 1024;

/// When and what to reclaim.
#[derive(Debug, Clone)]
pub struct ReclaimConfig {
    /// Fraction of capacity above which reclaiming starts (0.0 reclaims always).
    pub high_water: f64,
    /// Unreferenced chunks younger than this are kept (writes in flight).
    pub grace: Duration,
    /// How often the store's fill level is looked at.
    pub period: Duration,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig { high_water: 0.9, grace: Duration::from_secs(300), period: Duration::from_secs(2) }
    }
}

/// Walks the store page by page while it is above the high-water mark.
pub(crate) struct Reclaim {
    pub meta: Arc<crate::MetaClient>,
    pub store: Arc<ChunkStore>,
    pub config: ReclaimConfig,
    /// Where the current pass stands (`None`: at the start).
    pub after: Option<proto::types::ChunkId>,
    /// A pass found unreferenced chunks still inside their grace period: look again
    /// once it is over, whatever the fill level (they are a failed write's leftovers).
    pub again_at: Option<Instant>,
    pub reclaimed: u64,
}

impl Reclaim {
    fn above_high_water(&self) -> bool {
        let s = self.store.stats();
        s.used_bytes as f64 > s.capacity_bytes as f64 * self.config.high_water
    }
}

impl Worker for Reclaim {
    type Error = WireError;

    fn name(&self) -> String {
        "reclaim".into()
    }

    fn progress(&self) -> String {
        format!("{} unreferenced chunks reclaimed", self.reclaimed)
    }

    async fn work(&mut self) -> Result<Step, WireError> {
        if self.after.is_none() {
            let due = self.again_at.is_some_and(|t| Instant::now() >= t);
            if !due && !self.above_high_water() {
                return Ok(Step::Idle);
            }
            self.again_at = None;
        }
        let (store, after) = (self.store.clone(), self.after);
        let ids = tokio::task::spawn_blocking(move || store.list(after, PAGE))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("list task failed: {e}")))??;
        let Some(last) = ids.last().copied() else {
            self.after = None;
            return Ok(Step::Idle);
        };
        self.after = if ids.len() == PAGE { Some(last) } else { None };
        let garbage = crate::ask_meta(&self.meta, Unreferenced { ids }).await?.ids;
        if !garbage.is_empty() {
            let (store, ids, grace) = (self.store.clone(), garbage.clone(), self.config.grace);
            let deleted = tokio::task::spawn_blocking(move || store.delete(&ids, grace))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("delete task failed: {e}")))??;
            if deleted > 0 {
                tracing::info!(deleted, "reclaimed unreferenced chunks");
            }
            if deleted < garbage.len() as u64 && self.again_at.is_none() {
                self.again_at = Some(Instant::now() + self.config.grace);
            }
            self.reclaimed += deleted;
            crate::ask_meta(&self.meta, ForgetChunks { ids: garbage }).await?;
        }
        Ok(if self.after.is_some() { Step::Busy } else { Step::Idle })
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.config.period).await
    }
}
