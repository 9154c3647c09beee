//! Verified reads of part of a chunk: the BLAKE3 chaining values of a chunk's aligned
//! blocks (its *outboard*), which merge into the chunk id, let a reader check the few
//! blocks it reads instead of hashing the whole chunk (a 4 KiB read of a 4 MiB chunk
//! read and hashed all 4 MiB). BLAKE3 is a tree hash: every aligned block of a
//! power-of-two size of at least `blake3::CHUNK_LEN` is a subtree of the chunk's tree
//! (the last one may be short), so its chaining value can be computed alone and the
//! values merged pairwise, left-balanced as BLAKE3 does, give the root.

use blake3::hazmat::{ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root};
use proto::types::ChunkId;

/// Bytes per verified block: a 4 KiB read reads and hashes 16 KiB; a 4 MiB chunk's
/// outboard is 8 KiB.
pub const BLOCK: u64 = 16 << 10;

/// The chaining values of a chunk's blocks, in order, for a chunk longer than `BLOCK`
/// (a shorter one is read and hashed whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outboard {
    len: u64,
    blocks: Vec<ChainingValue>,
}

impl Outboard {
    /// The outboard of `data`, or `None` if it is one block or less.
    pub fn of(data: &[u8]) -> Option<Outboard> {
        let len = data.len() as u64;
        if len <= BLOCK {
            return None;
        }
        let blocks = data.chunks(BLOCK as usize).enumerate().map(|(i, b)| block_value(i as u64, b)).collect();
        Some(Outboard { len, blocks })
    }

    /// The chunk id these values merge into.
    pub fn root(&self) -> ChunkId {
        let split = left_subtree_len(self.len);
        let (left, right) = (merge(&self.blocks, 0, split), merge(&self.blocks, split, self.len - split));
        ChunkId(*merge_subtrees_root(&left, &right, Mode::Hash).as_bytes())
    }

    /// The length of the chunk it belongs to.
    pub fn chunk_len(&self) -> u64 {
        self.len
    }

    /// Whether `data`, read from the block boundary `at` on (whole blocks, the last
    /// possibly short at the chunk's end), holds the chunk's bytes there.
    pub fn verify(&self, at: u64, data: &[u8]) -> bool {
        if !at.is_multiple_of(BLOCK) || at + data.len() as u64 > self.len {
            return false;
        }
        let first = at / BLOCK;
        data.chunks(BLOCK as usize).enumerate().all(|(i, block)| {
            let index = first + i as u64;
            let whole = (self.len - index * BLOCK).min(BLOCK);
            block.len() as u64 == whole && block_value(index, block) == self.blocks[index as usize]
        })
    }
}

/// The chaining value of block `index`.
fn block_value(index: u64, block: &[u8]) -> ChainingValue {
    blake3::Hasher::new().set_input_offset(index * BLOCK).update(block).finalize_non_root()
}

/// The chaining value of the subtree of `len` bytes from `start` (a block boundary),
/// split as BLAKE3 splits it: the left part is the largest power of two below `len`.
fn merge(blocks: &[ChainingValue], start: u64, len: u64) -> ChainingValue {
    if len <= BLOCK {
        return blocks[(start / BLOCK) as usize];
    }
    let split = left_subtree_len(len);
    merge_subtrees_non_root(&merge(blocks, start, split), &merge(blocks, start + split, len - split), Mode::Hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 4096) as u8).collect()
    }

    #[test]
    fn values_merge_into_the_chunk_id_at_every_shape() {
        let b = BLOCK as usize;
        for len in [b + 1, b + 1024, b + 1025, 2 * b, 2 * b + 7, 3 * b, 5 * b + 3000, 64 * b, 256 * b, 256 * b - 1] {
            let data = data(len);
            let outboard = Outboard::of(&data).expect("longer than a block");
            assert_eq!(outboard.root(), ChunkId::of(&data), "length {len}");
        }
        assert!(Outboard::of(&data(b)).is_none());
    }

    #[test]
    fn blocks_verify_only_with_their_own_bytes_at_their_own_place() {
        let b = BLOCK as usize;
        let data = data(5 * b + 3000);
        let outboard = Outboard::of(&data).unwrap();
        assert!(outboard.verify(0, &data));
        assert!(outboard.verify(BLOCK, &data[b..3 * b]));
        assert!(outboard.verify(5 * BLOCK, &data[5 * b..]));
        // A flipped bit, a block at another offset, a short block, an unaligned start.
        let mut bad = data[b..2 * b].to_vec();
        bad[100] ^= 1;
        assert!(!outboard.verify(BLOCK, &bad));
        assert!(!outboard.verify(2 * BLOCK, &data[b..2 * b]));
        assert!(!outboard.verify(BLOCK, &data[b..2 * b - 1]));
        assert!(!outboard.verify(5 * BLOCK, &data[5 * b..data.len() - 1]));
        assert!(!outboard.verify(1024, &data[1024..1024 + b]));
        assert!(!outboard.verify(6 * BLOCK, &[]));
    }
}
