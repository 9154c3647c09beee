//! A byte-bounded LRU of whole chunks. Chunks are immutable, so a cached chunk never
//! goes stale: no invalidation, only eviction.

use bytes::Bytes;
use proto::types::ChunkId;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use util::sync::lock;

/// The order in which chunks were last used, oldest first: the one LRU of Locus, for
/// the chunks this cache holds in memory and the copies a node's site cache holds on
/// disk (`node::site`).
#[derive(Debug, Default)]
pub struct LruOrder {
    tick: u64,
    by_id: HashMap<ChunkId, u64>,
    by_tick: BTreeMap<u64, ChunkId>,
}

impl LruOrder {
    /// Marks `id` used now (adding it if it is new).
    pub fn touch(&mut self, id: ChunkId) {
        self.tick += 1;
        if let Some(old) = self.by_id.insert(id, self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, id);
    }

    /// Forgets `id`; whether it was there.
    pub fn remove(&mut self, id: &ChunkId) -> bool {
        let Some(tick) = self.by_id.remove(id) else { return false };
        self.by_tick.remove(&tick);
        true
    }

    pub fn contains(&self, id: &ChunkId) -> bool {
        self.by_id.contains_key(id)
    }

    /// Takes out the least recently used chunk.
    pub fn pop_oldest(&mut self) -> Option<ChunkId> {
        let (_, id) = self.by_tick.pop_first()?;
        self.by_id.remove(&id);
        Some(id)
    }
}

/// Whole chunks by id, evicting the least recently used beyond `capacity` bytes.
#[derive(Debug)]
pub struct ChunkCache {
    capacity: usize,
    inner: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    chunks: HashMap<ChunkId, Bytes>,
    order: LruOrder,
    bytes: usize,
}

impl ChunkCache {
    pub fn new(capacity: usize) -> Self {
        ChunkCache { capacity, inner: Mutex::new(Held::default()) }
    }

    pub fn get(&self, id: &ChunkId) -> Option<Bytes> {
        let mut held = lock(&self.inner);
        let data = held.chunks.get(id)?.clone();
        held.order.touch(*id);
        Some(data)
    }

    /// Bytes of the chunks held.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }

    /// Drops `id` (a chunk its reader is done with), freeing its bytes at once.
    pub fn remove(&self, id: &ChunkId) {
        let mut held = lock(&self.inner);
        if let Some(data) = held.chunks.remove(id) {
            held.bytes -= data.len();
            held.order.remove(id);
        }
    }

    pub fn insert(&self, id: ChunkId, data: Bytes) {
        if data.len() > self.capacity {
            return;
        }
        let mut held = lock(&self.inner);
        let len = data.len();
        if let Some(old) = held.chunks.insert(id, data) {
            held.bytes -= old.len();
        }
        held.order.touch(id);
        held.bytes += len;
        while held.bytes > self.capacity {
            let Some(victim) = held.order.pop_oldest() else { break };
            if let Some(d) = held.chunks.remove(&victim) {
                held.bytes -= d.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_gives_back_the_least_recently_used_first() {
        let (a, b, c) = (ChunkId([1; 32]), ChunkId([2; 32]), ChunkId([3; 32]));
        let mut order = LruOrder::default();
        for id in [a, b, c] {
            order.touch(id);
        }
        order.touch(a);
        assert!(order.remove(&b) && !order.remove(&b));
        assert!(order.contains(&c) && !order.contains(&b));
        assert_eq!((order.pop_oldest(), order.pop_oldest(), order.pop_oldest()), (Some(c), Some(a), None));
    }

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
