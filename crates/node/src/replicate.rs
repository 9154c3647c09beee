//! Replication across nodes and sites: the node a client stored a chunk on makes the
//! other copies its file's policy asks for — the next-ranked nodes of its own site,
//! and one node of every other listed site, which places that site's copies in turn —
//! over the node-to-node connections (several per remote node, pipelined). A target
//! is asked whether it already has the chunk first, so only missing chunks cross the
//! WAN. `sync` waits for every copy (bounded by `--sync-timeout`), `semi-sync` for the
//! other sites to have received it, `async` for nothing: the `replication` worker
//! ships the rest from the local store, retrying until the copies exist.

use crate::site::SiteLink;
use bytes::Bytes;
use chunk::{ChunkError, ChunkStore};
use futures_util::future::join_all;
use proto::error::{ErrorCode, WireError};
use proto::node::{Has, Put};
use proto::placement::rendezvous;
use proto::policy::ReplicationLag;
use proto::policy::{Replicate, ReplicationMode};
use proto::types::ChunkId;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use util::sync::lock;
use util::worker::{Step, Worker};

/// A node whose last report is older than this is not chosen for a copy (the same
/// age at which meta stops counting its copies).
const LIVE_SECS: u64 = proto::policy::NODE_GONE_SECS;
/// Queued copies made at once.
const BATCH: usize = 16;
/// Longest pause between retries of queued copies that keep failing.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Counters for the metrics and the replication tests.
#[derive(Debug, Default)]
pub struct ReplicationStats {
    /// Chunks and bytes this node sent to other nodes as copies, counted when a copy is
    /// handed to the connection: a copy whose answer came too late (its caller timed
    /// out while TCP was still recovering from a cut) has crossed the WAN all the same,
    /// and the retry then finds it there.
    pub shipped_chunks: AtomicU64,
    pub shipped_bytes: AtomicU64,
    /// Copies not sent because the target already had the chunk.
    pub already_there: AtomicU64,
    /// Replications that failed (a required copy could not be made in time).
    pub failures: AtomicU64,
}

/// Copies still to be made in the background (`async`, and the durable half of a
/// `semi-sync` receipt).
#[derive(Clone)]
struct Job {
    id: ChunkId,
    want: Replicate,
    /// The bytes, when they are not yet in the local store (a `semi-sync` receipt).
    data: Option<Bytes>,
    size: u64,
    since: Instant,
    /// Tells jobs for the same chunk apart.
    seq: u64,
}

impl Job {
    fn new(id: ChunkId, want: Replicate, data: &Bytes, received: bool) -> Job {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let (size, seq) = (data.len() as u64, SEQ.fetch_add(1, Ordering::Relaxed));
        Job { id, want, data: received.then(|| data.clone()), size, since: Instant::now(), seq }
    }

    /// The sites this job still owes a copy to (this node's own when the copy here is
    /// not yet durable or the policy wants more copies here).
    fn owed<'a>(&'a self, here: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.want.sites.iter().filter(move |s| *s != here || self.data.is_some() || self.want.copies > 1)
    }
}

/// One node's replication: the copies it makes, and its queue of copies to make.
pub struct Replicator {
    pub(crate) me: String,
    site: String,
    pub(crate) link: Arc<SiteLink>,
    pub(crate) store: Arc<ChunkStore>,
    sync_timeout: Duration,
    queue: Mutex<VecDeque<Job>>,
    queued: Notify,
    /// When a put last refreshed the node list for lack of nodes.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    /// (policy, site) pairs whose lag breached the RPO at the last report.
    breached: Mutex<HashSet<(String, String)>>,
    /// Counters for the metrics.
    pub stats: ReplicationStats,
}

impl Replicator {
    /// Replication for node `me` at `site`, storing into `store` and reaching other
    /// nodes through `link`'s connections.
    pub fn new(
        me: String,
        site: String,
        link: Arc<SiteLink>,
        store: Arc<ChunkStore>,
        sync_timeout: Duration,
    ) -> Replicator {
        Replicator {
            me,
            site,
            link,
            store,
            sync_timeout,
            queue: Mutex::default(),
            queued: Notify::new(),
            breached: Mutex::default(),
            refreshed: Default::default(),
            stats: ReplicationStats::default(),
        }
    }

    /// Handles a `Put`: stores the chunk here and makes the copies `want` asks for,
    /// answering when the policy's mode says the write may be acknowledged, with every
    /// node known to hold the chunk.
    pub async fn put(&self, id: ChunkId, data: Bytes, want: Replicate) -> Result<Vec<String>, WireError> {
        if want.on_receipt {
            // A remote site's receipt under `semi-sync`: received is enough; the
            // durable copy and this site's others follow in the background.
            self.enqueue(Job::new(id, want, &data, true));
            return Ok(vec![self.me.clone()]);
        }
        if want.mode == Some(ReplicationMode::Async) {
            self.store_here(id, data.clone()).await?;
            self.enqueue(Job::new(id, want, &data, false));
            return Ok(vec![self.me.clone()]);
        }
        // The local copy and the others are made at once: the answer waits for all.
        let here = async {
            self.store_here(id, data.clone()).await?;
            util::crash_point!("replicate-before-copies");
            Ok::<_, WireError>(())
        };
        let (stored, copies) = tokio::join!(here, self.copy_out(id, &data, &want));
        stored?;
        let mut holders = vec![self.me.clone()];
        holders.extend(copies?);
        util::crash_point!("replicate-after-copies");
        Ok(holders)
    }

    /// A stored chunk read whole (verified), off the runtime's threads.
    pub(crate) async fn read_stored(&self, id: ChunkId) -> Result<Result<Bytes, ChunkError>, WireError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.get(&id, 0, u64::MAX))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("chunk store task failed: {e}")))
    }

    /// Stores a replica here (durable; only `reclaim` of an unreferenced chunk removes
    /// it), replacing a site-cache copy of the same chunk. When the disk is full below
    /// the store's capacity, cached copies make room (once); replicas never do, so a
    /// disk full of replicas fails the put with `NoSpace`.
    pub(crate) async fn store_here(&self, id: ChunkId, data: Bytes) -> Result<(), WireError> {
        let put = |data: Bytes| {
            let store = self.store.clone();
            async move {
                tokio::task::spawn_blocking(move || store.put(&id, &data))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, format!("chunk store task failed: {e}")))
            }
        };
        let len = data.len() as u64;
        match put(data.clone()).await? {
            Ok(()) => {}
            Err(ChunkError::NoSpace { .. }) if self.below_capacity(len) && self.link.make_room(len).await => {
                put(data).await?.map_err(WireError::from)?
            }
            Err(e) => return Err(e.into()),
        }
        self.link.uncache(id).await;
        Ok(())
    }

    /// The store has room for `len` more bytes by its capacity (so a `NoSpace` came
    /// from the disk itself).
    fn below_capacity(&self, len: u64) -> bool {
        let s = self.store.stats();
        s.used_bytes + len <= s.capacity_bytes
    }

    /// Makes the copies beyond this node's, within `--sync-timeout`; answers the nodes
    /// that now hold one. Fails (`NotReplicated`) when a listed site got no copy or this
    /// site got fewer than its live nodes allow.
    pub(crate) async fn copy_out(&self, id: ChunkId, data: &Bytes, want: &Replicate) -> Result<Vec<String>, WireError> {
        // A drained node's own copy does not count: it places every copy elsewhere.
        let own_counts = usize::from(!self.link.drained());
        let few = |s: &String| {
            let wanted = if *s == self.site { (want.copies as usize).saturating_sub(own_counts) } else { 1 };
            self.ranked(&id, s).len() < wanted
        };
        if want.sites.iter().any(few) {
            // Nodes may have joined since the last heartbeat: look again, at most once
            // a second (a one-node site always has fewer nodes than copies); puts that
            // arrive meanwhile wait for that look.
            let mut last = self.refreshed.lock().await;
            if last.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
                self.link.refresh_peers().await;
                *last = Some(Instant::now());
            }
        }
        let mut legs = Vec::new();
        if want.sites.contains(&self.site) && want.copies as usize > own_counts {
            let others = self.ranked(&id, &self.site);
            let needed = (want.copies as usize - own_counts).min(others.len());
            legs.push((self.site.clone(), others, needed, Replicate::default()));
        }
        for site in want.sites.iter().filter(|s| **s != self.site) {
            // The remote site's first node places that site's copies.
            let on_receipt = want.mode == Some(ReplicationMode::SemiSync);
            let ask = Replicate { sites: vec![site.clone()], on_receipt, ..want.clone() };
            legs.push((site.clone(), self.ranked(&id, site), 1, ask));
        }
        let run = join_all(legs.iter().map(|(site, nodes, needed, ask)| async move {
            (site, *needed, self.place(id, data, nodes, *needed, ask).await)
        }));
        let outcome = match tokio::time::timeout(self.sync_timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                let sites: Vec<&str> = legs.iter().map(|(s, ..)| s.as_str()).collect();
                tracing::error!(chunk = %id, ?sites, timeout = ?self.sync_timeout,
                    "replication did not complete within the sync timeout; the write fails");
                return Err(WireError::new(
                    ErrorCode::NotReplicated,
                    format!(
                        "chunk {id}: copies at sites {sites:?} not made within the sync timeout of {:?}",
                        self.sync_timeout
                    ),
                ));
            }
        };
        let mut holders = Vec::new();
        for (site, needed, (got, last)) in outcome {
            if got.len() < needed.max(usize::from(*site != self.site)) {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                let why = last.map_or("no live node there".to_string(), |e| e.to_string());
                tracing::error!(chunk = %id, %site, "replication failed; the write fails: {why}");
                return Err(WireError::new(
                    ErrorCode::NotReplicated,
                    format!("chunk {id}: site {site} holds {} of {needed} required copies: {why}", got.len()),
                ));
            }
            holders.extend(got);
        }
        Ok(holders)
    }

    /// Live nodes of `site` other than this one, in placement order for `id`.
    fn ranked(&self, id: &ChunkId, site: &str) -> Vec<String> {
        let ids: Vec<String> = self
            .link
            .peers()
            .all()
            .into_iter()
            .filter(|n| n.site == site && n.id != self.me && !n.drained && n.last_seen_secs < LIVE_SECS)
            .map(|n| n.id)
            .collect();
        rendezvous(id, &ids, ids.len()).into_iter().map(String::from).collect()
    }

    /// Puts the chunk on `needed` of `candidates` (in order, the next one taking a
    /// failed one's place); answers the holders and the last failure.
    async fn place(
        &self,
        id: ChunkId,
        data: &Bytes,
        candidates: &[String],
        needed: usize,
        ask: &Replicate,
    ) -> (Vec<String>, Option<WireError>) {
        let mut holders = Vec::new();
        let mut last = None;
        let mut next = candidates.iter();
        while holders.len() < needed {
            let batch: Vec<&String> = next.by_ref().take(needed - holders.len()).collect();
            if batch.is_empty() {
                break;
            }
            for result in join_all(batch.into_iter().map(|node| self.copy_to(node, id, data, ask))).await {
                match result {
                    Ok(nodes) => holders.extend(nodes),
                    Err(e) => last = Some(e),
                }
            }
        }
        (holders, last)
    }

    /// One copy on `node`: asks first, sends the bytes only if it lacks them.
    async fn copy_to(&self, node: &str, id: ChunkId, data: &Bytes, ask: &Replicate) -> Result<Vec<String>, WireError> {
        let client = self
            .link
            .peers()
            .client(node)
            .await
            .map_err(|e| WireError::new(ErrorCode::Unreachable, format!("node {node}: {e}")))?;
        let transport = |e: net::NetError| WireError::new(ErrorCode::Unreachable, format!("node {node}: {e}"));
        if client.call_node(Has { ids: vec![id] }).await.map_err(transport)?? == [true] {
            self.stats.already_there.fetch_add(1, Ordering::Relaxed);
            return Ok(vec![node.to_string()]);
        }
        // Node to node: this node's certificate is its authority (no capability).
        let put = Put { id, cap: None, epoch: self.link.epoch(), replicate: ask.clone() };
        self.stats.shipped_chunks.fetch_add(1, Ordering::Relaxed);
        self.stats.shipped_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let stored = client.call_node_bulk(put, data.clone()).await.map_err(transport)??;
        Ok(stored.holders(node))
    }

    fn enqueue(&self, job: Job) {
        lock(&self.queue).push_back(job);
        self.queued.notify_one();
    }

    /// Copies queued and not yet made: (chunks, bytes, age of the oldest).
    pub fn lag(&self) -> (u64, u64, Duration) {
        let q = lock(&self.queue);
        let bytes = q.iter().map(|j| j.size).sum();
        (q.len() as u64, bytes, q.front().map_or(Duration::ZERO, |j| j.since.elapsed()))
    }

    /// The copies owed, per policy and site.
    pub fn owed(&self) -> Vec<ReplicationLag> {
        let mut by_key: BTreeMap<(String, String), ReplicationLag> = BTreeMap::new();
        for job in lock(&self.queue).iter() {
            for site in job.owed(&self.site) {
                let policy = job.want.policy();
                let entry = by_key.entry((policy.to_string(), site.clone())).or_insert_with(|| ReplicationLag {
                    policy,
                    site: site.clone(),
                    chunks: 0,
                    bytes: 0,
                    oldest_secs: 0,
                });
                entry.chunks += 1;
                entry.bytes += job.size;
                entry.oldest_secs = entry.oldest_secs.max(job.since.elapsed().as_secs());
            }
        }
        by_key.into_values().collect()
    }

    /// `owed`, for the heartbeat; logs when a policy's RPO is first breached (and when
    /// the lag is back within it).
    pub fn lag_report(&self) -> Vec<ReplicationLag> {
        let report = self.owed();
        let breached: HashSet<(String, String)> =
            report.iter().filter(|l| l.breached()).map(|l| (l.policy.to_string(), l.site.clone())).collect();
        let mut known = lock(&self.breached);
        for l in report.iter().filter(|l| l.breached() && !known.contains(&(l.policy.to_string(), l.site.clone()))) {
            tracing::warn!(site = %l.site, policy = %l.policy, chunks = l.chunks, oldest_secs = l.oldest_secs,
                "replication lag breaches the RPO: the oldest copy owed is older than the policy allows");
        }
        for (policy, site) in known.difference(&breached) {
            tracing::info!(%site, %policy, "replication lag is back within the RPO");
        }
        *known = breached;
        report
    }
}

/// The `replication` worker: makes the queued copies, oldest first; a copy that fails
/// (a site cut off) goes back to the queue and is retried with back-off, so the lag
/// grows during a cut and drains once it heals.
pub(crate) struct ReplicationWorker {
    pub replicator: Arc<Replicator>,
    pub made: u64,
    pub backoff: Duration,
}

impl Worker for ReplicationWorker {
    type Error = WireError;

    fn name(&self) -> String {
        "replication".into()
    }

    fn progress(&self) -> String {
        let (chunks, _, oldest) = self.replicator.lag();
        format!("{} copies made; {chunks} chunks waiting, oldest {}s", self.made, oldest.as_secs())
    }

    async fn work(&mut self) -> Result<Step, WireError> {
        let r = &self.replicator;
        // The oldest jobs, at once (each keeps a connection's pipeline busy); a job
        // stays queued (and counted in the lag) until its copies exist.
        let jobs: Vec<Job> = lock(&r.queue).iter().take(BATCH).cloned().collect();
        if jobs.is_empty() {
            return Ok(Step::Idle);
        }
        let results = join_all(jobs.iter().map(|job| async move {
            let data = match &job.data {
                Some(data) => {
                    r.store_here(job.id, data.clone()).await?;
                    if let Some(queued) = lock(&r.queue).iter_mut().find(|j| j.seq == job.seq) {
                        // Stored here now: a retry reads it from the store.
                        queued.data = None;
                    }
                    data.clone()
                }
                None => r.read_stored(job.id).await?.map_err(WireError::from)?,
            };
            let mut holders = r.copy_out(job.id, &data, &job.want).await?;
            holders.push(r.me.clone());
            Ok::<_, WireError>(holders)
        }))
        .await;
        let mut failure = None;
        for (job, result) in jobs.iter().zip(results) {
            match result {
                Ok(holders) => {
                    lock(&r.queue).retain(|j| j.seq != job.seq);
                    self.made += holders.len() as u64 - 1;
                    r.link.report_copies(job.id, job.size, holders);
                }
                // It keeps its place: the oldest copies go first once the link is back.
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            None => {
                self.backoff = Duration::ZERO;
                Ok(Step::Busy)
            }
            Some(e) => {
                self.backoff = (self.backoff * 2).clamp(Duration::from_millis(200), MAX_BACKOFF);
                Err(e)
            }
        }
    }

    async fn wait_for_work(&mut self) -> Step {
        if lock(&self.replicator.queue).is_empty() {
            self.replicator.queued.notified().await;
        } else {
            tokio::time::sleep(self.backoff).await;
        }
        Step::Busy
    }
}
