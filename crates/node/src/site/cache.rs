//! The site cache: copies of other sites' chunks on this node's disk (capped, least
//! recently used out first, through `chunk::cache::LruOrder`) and, while they are
//! written, in memory; every change is queued for the report to meta.

use super::SiteLink;
use super::slice;
use bytes::Bytes;
use chunk::ChunkError;
use proto::error::{ErrorCode, WireError};
use proto::meta::StoredChunk;
use proto::types::ChunkId;
use std::time::Duration;
use util::sync::lock;

/// Bytes of recently fetched chunks kept in memory.
pub(super) const RECENT_BYTES: usize = 256 << 20;

fn wire(e: ChunkError) -> WireError {
    e.into()
}

impl SiteLink {
    /// A replica of `id` is now in this node's store: its site-cache copy, if any,
    /// goes, so the bytes are not held twice (reads find the replica first). No removal
    /// is reported: the replica's report makes the catalogue's row a replica, and a
    /// cached copy's removal never takes a replica's row.
    pub(crate) async fn uncache(&self, id: ChunkId) {
        if !lock(&self.lru).contains(&id) {
            return;
        }
        lock(&self.lru).remove(&id);
        let cache = self.cache.clone();
        match tokio::task::spawn_blocking(move || cache.delete(&[id], Duration::ZERO)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(chunk = %id, "cannot drop the cached copy of a replica: {e}"),
            Err(e) => tracing::warn!(chunk = %id, "cache task failed: {e}"),
        }
    }

    /// This node's whole site-cache copy of `id`, verified, if it has an intact one
    /// (asking the disk only for a chunk the cache lists).
    pub(crate) async fn cached_copy(&self, id: ChunkId) -> Result<Option<Bytes>, WireError> {
        if self.recent.get(&id).is_none() && !lock(&self.lru).contains(&id) {
            return Ok(None);
        }
        self.cached(id, 0, u64::MAX).await
    }

    /// Bytes held in the site cache.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.stats().used_bytes
    }

    /// Bytes `[offset, offset + len)` of a chunk from this node's site cache alone
    /// (memory, then disk), never fetched: `None` without an intact copy (a corrupt
    /// one is dropped and its removal reported, never served).
    pub async fn cached(&self, id: ChunkId, offset: u64, len: u64) -> Result<Option<Bytes>, WireError> {
        if let Some(data) = self.recent.get(&id) {
            self.stats.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return slice(id, data, offset, len).map(Some);
        }
        let cache = self.cache.clone();
        let cached = tokio::task::spawn_blocking(move || cache.get(&id, offset, len))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("cache task failed: {e}")))?;
        match cached {
            Ok(data) => {
                self.stats.cache_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                lock(&self.lru).touch(id);
                Ok(Some(data))
            }
            Err(ChunkError::NotFound { .. }) => Ok(None),
            Err(ChunkError::Corrupt { .. }) => {
                let _ = self.cache.delete(&[id], Duration::ZERO);
                lock(&self.lru).remove(&id);
                lock(&self.pending).1.push(id);
                Ok(None)
            }
            Err(e) => Err(wire(e)),
        }
    }

    /// Stores a fetched chunk in the site cache, evicting the least recently used
    /// copies to stay under the cap.
    pub(super) async fn keep(&self, id: ChunkId, data: Bytes) {
        let size = data.len() as u64;
        if size > self.config.cache_bytes {
            return;
        }
        let _room = self.keeping.lock().await;
        self.evict_down_to(self.config.cache_bytes - size);
        let cache = self.cache.clone();
        let stored = tokio::task::spawn_blocking(move || cache.put(&id, &data)).await;
        let mut pending = lock(&self.pending);
        match stored {
            Ok(Ok(())) => {
                lock(&self.lru).touch(id);
                pending.0.push(StoredChunk { id, size, nodes: Vec::new(), receipt: None });
            }
            Ok(Err(e)) => tracing::warn!(chunk = %id, "cannot cache a fetched chunk: {e}"),
            Err(e) => tracing::warn!(chunk = %id, "cache task failed: {e}"),
        }
    }

    /// Evicts cached copies, least recently used first, until the cache holds at most
    /// `bytes` (or nothing is left to evict); the evictions are reported to meta.
    fn evict_down_to(&self, bytes: u64) {
        let mut evicted = Vec::new();
        while self.cache.stats().used_bytes > bytes {
            let Some(victim) = lock(&self.lru).pop_oldest() else { break };
            if let Err(e) = self.cache.delete(&[victim], Duration::ZERO) {
                tracing::warn!(chunk = %victim, "cannot evict from the site cache: {e}");
                break;
            }
            evicted.push(victim);
        }
        lock(&self.pending).1.extend(evicted);
    }

    /// The disk this node's store shares with its site cache is full: cached copies
    /// (never replicas) are evicted until `bytes` are freed, if the cache holds that
    /// many; answers whether it did.
    pub(crate) async fn make_room(&self, bytes: u64) -> bool {
        let _room = self.keeping.lock().await;
        let used = self.cache.stats().used_bytes;
        if used < bytes {
            return false;
        }
        self.evict_down_to(used - bytes);
        tracing::warn!(bytes, "the disk is full: evicted cached copies to store a replica");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{chunk, link};
    use super::*;
    use crate::replicate::Replicator;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn copies_kept_at_once_evict_to_stay_under_the_cap_and_report_it() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 3 << 20).await;
        let chunks: Vec<(ChunkId, Bytes)> = (0..6).map(|i| chunk(i, 1 << 20)).collect();
        let keeps = chunks.iter().map(|(id, data)| {
            let link = link.clone();
            let (id, data) = (*id, data.clone());
            tokio::spawn(async move { link.keep(id, data).await })
        });
        for k in keeps.collect::<Vec<_>>() {
            k.await.unwrap();
        }
        assert_eq!(link.cache_bytes(), 3 << 20, "full, not over the cap, and no copy refused");
        let (added, removed) = std::mem::take(&mut *lock(&link.pending));
        assert_eq!(added.len(), 6, "every copy was cached once: {added:?}");
        assert!(added.iter().all(|c| c.nodes.is_empty()), "cached copies name no nodes (not replicas)");
        assert_eq!(removed.len(), 3, "three were evicted and reported: {removed:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_stored_here_replaces_the_cached_copy_without_reporting_a_removal() {
        let dir = tempfile::tempdir().unwrap();
        let (link, store) = link(dir.path(), 8 << 20).await;
        let (id, data) = chunk(7, 1 << 20);
        link.keep(id, data.clone()).await;
        assert_eq!(link.cached_copy(id).await.unwrap(), Some(data.clone()));
        lock(&link.pending).0.clear();

        let replicator = Replicator::new("b0".into(), "b".into(), link.clone(), store.clone(), Duration::from_secs(1));
        replicator.store_here(id, data.clone()).await.unwrap();
        assert!(store.has(&[id]).unwrap()[0], "stored as a replica");
        assert_eq!(link.cached_copy(id).await.unwrap(), None, "the cached copy is gone");
        assert_eq!(link.cache_bytes(), 0);
        assert!(lock(&link.pending).1.is_empty(), "no removal reported: the node still holds the chunk");
        // Eviction pressure later never touches the replica.
        for i in 0..10 {
            let (other, bytes) = chunk(100 + i, 1 << 20);
            link.keep(other, bytes).await;
        }
        assert_eq!(store.get(&id, 0, u64::MAX).unwrap(), data.to_vec());
        assert!(!lock(&link.pending).1.contains(&id), "the replica was never evicted");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_disk_evicts_cached_copies_for_a_replica_and_never_replicas() {
        let disk = tempfile::tempdir().unwrap();
        let Some(_mounted) = testkit::scratch::Mount::new(disk.path(), "tmpfs", Some("size=8m")) else {
            eprintln!("SKIPPED: needs root to mount a small tmpfs");
            return;
        };
        // The cache's cap and the store's capacity both exceed the disk.
        let (link, store) = link(disk.path(), 64 << 20).await;
        let cached: Vec<ChunkId> = (0..5)
            .map(|i| chunk(i, 1 << 20))
            .map(|(id, data)| {
                let link = link.clone();
                async move {
                    link.keep(id, data).await;
                    id
                }
            })
            .collect::<futures_util::future::JoinAll<_>>()
            .await;
        assert_eq!(link.cache_bytes(), 5 << 20);
        lock(&link.pending).1.clear();
        let replicator = Replicator::new("b0".into(), "b".into(), link.clone(), store.clone(), Duration::from_secs(1));

        // 4 MiB do not fit beside the 5 MiB cached: cached copies make room.
        let (first, data) = chunk(50, 4 << 20);
        replicator.store_here(first, data).await.unwrap();
        assert!(store.has(&[first]).unwrap()[0]);
        let evicted = lock(&link.pending).1.clone();
        assert!(evicted.len() >= 4 && evicted.iter().all(|id| cached.contains(id)), "{evicted:?}");

        // Then the disk is full of replicas: the next one fails and nothing is evicted.
        let (second, data) = chunk(51, 4 << 20);
        let e = replicator.store_here(second, data).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
        assert!(store.has(&[first]).unwrap()[0], "a replica is never evicted");
    }
}
