//! A byte-bounded LRU of whole chunks. Chunks are immutable, so a cached chunk never
//! goes stale: no invalidation, only eviction.

use bytes::Bytes;
use proto::types::ChunkId;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use util::sync::lock;

/// Whole chunks by id, evicting the least recently used beyond `capacity` bytes.
#[derive(Debug)]
pub struct ChunkCache {
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    by_id: HashMap<ChunkId, (Bytes, u64)>,
    by_tick: BTreeMap<u64, ChunkId>,
    tick: u64,
    bytes: usize,
}

impl ChunkCache {
    pub fn new(capacity: usize) -> Self {
        ChunkCache { capacity, inner: Mutex::new(Lru::default()) }
    }

    pub fn get(&self, id: &ChunkId) -> Option<Bytes> {
        let mut lru = lock(&self.inner);
        lru.tick += 1;
        let tick = lru.tick;
        let (data, old) = lru.by_id.get_mut(id).map(|(d, t)| (d.clone(), std::mem::replace(t, tick)))?;
        lru.by_tick.remove(&old);
        lru.by_tick.insert(tick, *id);
        Some(data)
    }

    /// Bytes of the chunks held.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }

    /// Drops `id` (a chunk its reader is done with), freeing its bytes at once.
    pub fn remove(&self, id: &ChunkId) {
        let mut lru = lock(&self.inner);
        if let Some((data, tick)) = lru.by_id.remove(id) {
            lru.bytes -= data.len();
            lru.by_tick.remove(&tick);
        }
    }

    pub fn insert(&self, id: ChunkId, data: Bytes) {
        if data.len() > self.capacity {
            return;
        }
        let mut lru = lock(&self.inner);
        lru.tick += 1;
        let tick = lru.tick;
        let len = data.len();
        if let Some((old, old_tick)) = lru.by_id.insert(id, (data, tick)) {
            lru.bytes -= old.len();
            lru.by_tick.remove(&old_tick);
        }
        lru.by_tick.insert(tick, id);
        lru.bytes += len;
        while lru.bytes > self.capacity {
            let Some((_, victim)) = lru.by_tick.pop_first() else { break };
            if let Some((d, _)) = lru.by_id.remove(&victim) {
                lru.bytes -= d.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_chunk_frees_its_bytes() {
        let c = ChunkCache::new(10);
        let (a, b) = (ChunkId([1; 32]), ChunkId([2; 32]));
        c.insert(a, Bytes::from_static(b"123456"));
        c.remove(&a);
        c.remove(&a);
        assert!(c.get(&a).is_none());
        assert_eq!(c.bytes(), 0);
        c.insert(b, Bytes::from_static(b"1234567890"));
        assert!(c.get(&b).is_some(), "the removed chunk's bytes no longer count");
    }

    #[test]
    fn evicts_least_recently_used_beyond_capacity() {
        let c = ChunkCache::new(10);
        let id = |n| ChunkId([n; 32]);
        c.insert(id(1), Bytes::from(vec![0; 4]));
        c.insert(id(2), Bytes::from(vec![0; 4]));
        assert!(c.get(&id(1)).is_some());
        c.insert(id(3), Bytes::from(vec![0; 4]));
        assert!(c.get(&id(2)).is_none(), "2 was least recently used");
        assert!(c.get(&id(1)).is_some() && c.get(&id(3)).is_some());
    }
}
