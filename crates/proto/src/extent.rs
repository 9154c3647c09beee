//! The extent algebra shared by meta (persisted extents) and clients (their view of a
//! file being written): writing a range replaces whatever the range covered, keeping
//! the pieces of old extents that stick out on either side.

use crate::types::Extent;
use std::collections::BTreeMap;

/// The parts of `old` that lie outside `[start, end)`: zero, one or two pieces.
pub fn clip(old: &Extent, start: u64, end: u64) -> Vec<Extent> {
    let mut kept = Vec::with_capacity(2);
    if old.file_offset < start {
        let len = (start - old.file_offset).min(old.len);
        kept.push(Extent { len, ..*old });
    }
    if old.end() > end {
        let from = end.max(old.file_offset);
        kept.push(Extent {
            file_offset: from,
            len: old.end() - from,
            chunk: old.chunk,
            chunk_offset: old.chunk_offset + (from - old.file_offset),
        });
    }
    kept
}

/// A piece of a file range: either bytes of a chunk or a hole that reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    Data(Extent),
    Hole { file_offset: u64, len: u64 },
}

/// Non-overlapping extents of one file, keyed by file offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentMap {
    by_offset: BTreeMap<u64, Extent>,
}

impl ExtentMap {
    pub fn from_extents(extents: impl IntoIterator<Item = Extent>) -> Self {
        let mut map = ExtentMap::default();
        for e in extents {
            map.insert(e);
        }
        map
    }

    pub fn len(&self) -> usize {
        self.by_offset.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_offset.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Extent> {
        self.by_offset.values()
    }

    /// Extents that intersect `[start, end)`.
    pub fn overlapping(&self, start: u64, end: u64) -> Vec<Extent> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        if let Some((_, e)) = self.by_offset.range(..start).next_back()
            && e.end() > start
        {
            out.push(*e);
        }
        out.extend(self.by_offset.range(start..end).map(|(_, e)| *e));
        out
    }

    /// Removes everything in `[start, end)`, returning the extents that were touched.
    pub fn punch(&mut self, start: u64, end: u64) -> Vec<Extent> {
        let touched = self.overlapping(start, end);
        for old in &touched {
            self.by_offset.remove(&old.file_offset);
            for piece in clip(old, start, end) {
                self.by_offset.insert(piece.file_offset, piece);
            }
        }
        touched
    }

    /// Maps `new`'s range onto its chunk, replacing what was there.
    pub fn insert(&mut self, new: Extent) {
        if new.len == 0 {
            return;
        }
        self.punch(new.file_offset, new.end());
        self.by_offset.insert(new.file_offset, new);
    }

    /// Drops everything at or beyond `size`.
    pub fn truncate(&mut self, size: u64) {
        self.punch(size, u64::MAX);
    }

    /// Splits `[start, end)` into data pieces and holes, in order.
    pub fn segments(&self, start: u64, end: u64) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut pos = start;
        for e in self.overlapping(start, end) {
            if e.file_offset > pos {
                out.push(Segment::Hole { file_offset: pos, len: e.file_offset - pos });
                pos = e.file_offset;
            }
            let piece_end = e.end().min(end);
            out.push(Segment::Data(Extent {
                file_offset: pos,
                len: piece_end - pos,
                chunk: e.chunk,
                chunk_offset: e.chunk_offset + (pos - e.file_offset),
            }));
            pos = piece_end;
        }
        if pos < end {
            out.push(Segment::Hole { file_offset: pos, len: end - pos });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ChunkId;
    use proptest::prelude::*;

    fn ext(off: u64, len: u64, tag: u8) -> Extent {
        Extent { file_offset: off, len, chunk: ChunkId([tag; 32]), chunk_offset: off }
    }

    #[test]
    fn overwrite_in_the_middle_keeps_both_sides() {
        let mut m = ExtentMap::from_extents([ext(0, 100, 1)]);
        m.insert(Extent { file_offset: 40, len: 10, chunk: ChunkId([2; 32]), chunk_offset: 0 });
        let v: Vec<_> = m.iter().copied().collect();
        assert_eq!(v.len(), 3);
        assert_eq!((v[0].file_offset, v[0].len), (0, 40));
        assert_eq!((v[1].file_offset, v[1].len, v[1].chunk.0[0]), (40, 10, 2));
        assert_eq!((v[2].file_offset, v[2].len, v[2].chunk_offset), (50, 50, 50));
    }

    #[test]
    fn segments_report_holes() {
        let m = ExtentMap::from_extents([ext(10, 10, 1)]);
        let s = m.segments(0, 30);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], Segment::Hole { file_offset: 0, len: 10 });
        assert_eq!(s[2], Segment::Hole { file_offset: 20, len: 10 });
    }

    proptest! {
        /// Law: an extent map answers every byte exactly like a byte array that had the
        /// same writes applied.
        #[test]
        fn map_matches_byte_model(writes in prop::collection::vec((0u64..200, 1u64..60, 1u8..255), 1..30), cut in 0u64..260) {
            let mut model = vec![0u8; 300];
            let mut m = ExtentMap::default();
            for (off, len, tag) in &writes {
                for b in &mut model[*off as usize..(*off + *len) as usize] { *b = *tag; }
                // chunk_offset = 1000 - off checks offset arithmetic in clip.
                m.insert(Extent { file_offset: *off, len: *len, chunk: ChunkId([*tag; 32]), chunk_offset: 1000 });
            }
            m.truncate(cut);
            for b in &mut model[cut as usize..] { *b = 0; }
            let mut seen = vec![0u8; 300];
            for s in m.segments(0, 300) {
                if let Segment::Data(e) = s {
                    prop_assert!(e.chunk_offset >= 1000);
                    for b in &mut seen[e.file_offset as usize..e.end() as usize] { *b = e.chunk.0[0]; }
                }
            }
            prop_assert_eq!(seen, model);
            let mut last_end = 0;
            for e in m.iter() { prop_assert!(e.file_offset >= last_end && e.len > 0); last_end = e.end(); }
        }
    }
}
