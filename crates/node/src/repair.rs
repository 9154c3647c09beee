//! Keeping the copies a policy asks for, without an operator: the `repair` worker
//! asks meta for the chunks this node is to repair (live copies short of their
//! policy after a node was lost or drained) and makes the missing copies, nearest
//! first (its own site, then others), at a bounded rate; the `scrub` worker re-hashes
//! every stored chunk at a bounded rate and replaces a corrupt copy with a verified
//! one fetched from another holder.

use crate::replicate::Replicator;
use chunk::ChunkError;
use proto::error::{ErrorCode, WireError};
use proto::meta::UnderReplicated;
use proto::policy::{Replicate, ReplicationMode, Shortfall};
use proto::types::{ChunkId, InodeId};
use std::sync::Arc;
use std::time::{Duration, Instant};
use util::worker::{Step, Worker, every};

/// Extents meta scans per repair request.
const REPAIR_PAGE: u32 = 1024;
/// Chunks the scrub re-hashes per step.
const SCRUB_PAGE: usize = 16;

/// Sleeps as long as moving `bytes` since `started` takes at `rate` bytes per second.
async fn pace(started: Instant, bytes: u64, rate: u64) {
    let due = Duration::from_secs_f64(bytes as f64 / rate.max(1) as f64);
    if let Some(wait) = due.checked_sub(started.elapsed()) {
        tokio::time::sleep(wait).await;
    }
}

/// The `repair` worker.
pub(crate) struct RepairWorker {
    pub replicator: Arc<Replicator>,
    pub meta: Arc<crate::MetaClient>,
    /// Pause between complete scans.
    pub period: Duration,
    /// Bytes per second it may send.
    pub rate: u64,
    pub after: Option<(InodeId, u64)>,
    pub repaired: u64,
    pub repaired_bytes: u64,
    /// Chunks found short in the current scan.
    pub found: u64,
}

impl RepairWorker {
    async fn repair(&self, item: &Shortfall) -> Result<u64, WireError> {
        let r = &self.replicator;
        let data = match r.read_stored(item.id).await? {
            Ok(data) => data,
            // Meta asks a node with only a site-cache copy when no replica is left: that
            // copy becomes a replica here before it is copied out.
            Err(ChunkError::NotFound { .. }) => match r.link.cached_copy(item.id).await? {
                Some(data) => {
                    r.store_here(item.id, data.clone()).await?;
                    tracing::warn!(chunk = %item.id, "no replica left: this node's cached copy becomes one");
                    data
                }
                None => return Err(WireError::new(ErrorCode::NotFound, format!("chunk {} is not here", item.id))),
            },
            // A corrupt copy: the scrub replaces it; another holder's scan will repair
            // the chunk, or this one's next.
            Err(e) => return Err(WireError::from(e)),
        };
        let want = Replicate {
            sites: item.sites.clone(),
            copies: item.policy.copies,
            mode: Some(ReplicationMode::Sync),
            on_receipt: false,
            rpo_secs: item.policy.rpo_secs,
        };
        let mut holders = r.copy_out(item.id, &data, &want).await?;
        holders.push(r.me.clone());
        tracing::info!(chunk = %item.id, sites = ?item.sites, ?holders, "repaired a chunk's copies");
        r.link.report_copies(item.id, item.size, holders);
        Ok(data.len() as u64)
    }
}

impl Worker for RepairWorker {
    type Error = WireError;

    fn name(&self) -> String {
        "repair".into()
    }

    fn progress(&self) -> String {
        format!("{} chunks ({} bytes) repaired; {} short in this scan", self.repaired, self.repaired_bytes, self.found)
    }

    async fn work(&mut self) -> Result<Step, WireError> {
        let ask = UnderReplicated { node: Some(self.replicator.me.clone()), after: self.after, limit: REPAIR_PAGE };
        let page = crate::ask_meta(&self.meta, ask).await?;
        let started = Instant::now();
        let (mut sent, mut last) = (0, None);
        for item in &page.chunks {
            self.found += 1;
            match self.repair(item).await {
                Ok(bytes) => {
                    self.repaired += 1;
                    self.repaired_bytes += bytes;
                    sent += bytes;
                    pace(started, sent, self.rate).await;
                }
                Err(e) => {
                    tracing::warn!(chunk = %item.id, "cannot repair now: {e}");
                    last = Some(e);
                }
            }
        }
        self.after = page.next;
        if self.after.is_some() {
            return Ok(Step::Busy);
        }
        self.found = 0;
        last.map_or(Ok(Step::Idle), Err)
    }

    async fn wait_for_work(&mut self) -> Step {
        every(self.period).await
    }
}

/// The `scrub` worker.
pub(crate) struct ScrubWorker {
    pub replicator: Arc<Replicator>,
    /// Pause between complete passes.
    pub period: Duration,
    /// Bytes per second it may re-hash.
    pub rate: u64,
    pub after: Option<ChunkId>,
    pub checked: u64,
    pub replaced: u64,
    pub passes: u64,
}

impl ScrubWorker {
    /// Replaces a corrupt stored copy with a verified one from another holder.
    async fn replace(&mut self, id: ChunkId) -> Result<(), WireError> {
        let r = &self.replicator;
        let good = r.link.fetch_copy(id).await?;
        r.store_here(id, good).await?;
        self.replaced += 1;
        tracing::warn!(chunk = %id, "scrub replaced a corrupt copy with a verified one from another node");
        Ok(())
    }
}

impl Worker for ScrubWorker {
    type Error = WireError;

    fn name(&self) -> String {
        "scrub".into()
    }

    fn progress(&self) -> String {
        format!("{} passes, {} chunks checked, {} corrupt copies replaced", self.passes, self.checked, self.replaced)
    }

    async fn work(&mut self) -> Result<Step, WireError> {
        let (store, after) = (self.replicator.store.clone(), self.after);
        let ids = tokio::task::spawn_blocking(move || store.list(after, SCRUB_PAGE))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("chunk store task failed: {e}")))?
            .map_err(WireError::from)?;
        let Some(last) = ids.last().copied() else {
            self.after = None;
            self.passes += 1;
            return Ok(Step::Idle);
        };
        self.after = Some(last);
        let started = Instant::now();
        let mut hashed = 0;
        let mut failure = None;
        for id in ids {
            match self.replicator.read_stored(id).await? {
                Ok(data) => hashed += data.len() as u64,
                Err(ChunkError::Corrupt { .. }) => {
                    if let Err(e) = self.replace(id).await {
                        tracing::error!(chunk = %id, "scrub found a corrupt copy and cannot replace it yet: {e}");
                        failure = Some(e);
                    }
                }
                // Deleted meanwhile (gc, reclaim).
                Err(ChunkError::NotFound { .. }) => {}
                Err(e) => failure = Some(WireError::from(e)),
            }
            self.checked += 1;
            pace(started, hashed, self.rate).await;
        }
        failure.map_or(Ok(Step::Busy), Err)
    }

    async fn wait_for_work(&mut self) -> Step {
        if self.after.is_some() {
            // In the middle of a pass after a failed step: go on shortly.
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Step::Busy;
        }
        every(self.period).await
    }
}
