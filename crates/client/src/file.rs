//! Per-file client state: the file as this client sees it — committed extents plus
//! its own pending writes — and the buffer of bytes not yet cut into chunks.

use crate::error::VfsError;
use proto::extent::ExtentMap;
use proto::meta::StoredChunk;
use proto::policy::Policy;
use proto::types::{Attr, Extent, InodeId};
use std::collections::{BTreeMap, HashSet};
use tokio::task::JoinHandle;

/// Written bytes not yet cut into chunks, as non-overlapping runs keyed by offset.
#[derive(Debug, Default)]
pub(crate) struct DirtyBuffer {
    runs: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    /// Capacity a growing run reserves at once (the chunk size), so sequential writes
    /// fill one allocation per chunk instead of reallocating as they go.
    run_capacity: usize,
}

impl DirtyBuffer {
    pub fn with_run_capacity(run_capacity: usize) -> Self {
        DirtyBuffer { run_capacity, ..DirtyBuffer::default() }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Records a write; later writes win over earlier ones where they overlap.
    pub fn insert(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        // Fast path: appending to the run that ends exactly here (sequential writes).
        if let Some((&start, run)) = self.runs.range_mut(..=offset).next_back()
            && start + run.len() as u64 == offset
            && self.runs.range(offset..end).next().is_none()
        {
            let run = self.runs.get_mut(&start).expect("run exists");
            if run.capacity() - run.len() < data.len() {
                run.reserve(data.len().max(self.run_capacity.saturating_sub(run.len())));
            }
            run.extend_from_slice(data);
            self.bytes += data.len();
            return;
        }
        // General case: merge every run touching [offset, end) into one.
        let touching: Vec<u64> =
            self.runs.range(..=end).filter(|(s, r)| **s + r.len() as u64 >= offset).map(|(s, _)| *s).collect();
        let start = touching.first().map_or(offset, |s| (*s).min(offset));
        let mut merged_end = end;
        for s in &touching {
            merged_end = merged_end.max(s + self.runs[s].len() as u64);
        }
        let mut merged = vec![0u8; (merged_end - start) as usize];
        for s in touching {
            let run = self.runs.remove(&s).expect("run exists");
            self.bytes -= run.len();
            let at = (s - start) as usize;
            merged[at..at + run.len()].copy_from_slice(&run);
        }
        let at = (offset - start) as usize;
        merged[at..at + data.len()].copy_from_slice(data);
        self.bytes += merged.len();
        self.runs.insert(start, merged);
    }

    /// Takes the pieces ready to become chunks: every run cut at multiples of
    /// `chunk_size`; incomplete tail pieces only when `all`.
    pub fn take_chunks(&mut self, chunk_size: u64, all: bool) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let starts: Vec<u64> = self.runs.keys().copied().collect();
        for start in starts {
            let mut run = self.runs.remove(&start).expect("run exists");
            self.bytes -= run.len();
            let mut pos = start;
            loop {
                let boundary = (pos / chunk_size + 1) * chunk_size;
                let run_end = pos + run.len() as u64;
                if run_end >= boundary {
                    let rest = run.split_off((boundary - pos) as usize);
                    out.push((pos, std::mem::replace(&mut run, rest)));
                    pos = boundary;
                } else {
                    break;
                }
            }
            if run.is_empty() {
                continue;
            }
            if all {
                out.push((pos, run));
            } else {
                self.bytes += run.len();
                self.runs.insert(pos, run);
            }
        }
        out
    }

    /// `take_chunks`, grouped into the chunks to store: a piece as long as a chunk
    /// alone, and short pieces (scattered small writes) packed in file order into
    /// shared chunks of at most `chunk_size` bytes, each piece an extent of its own into
    /// it. A block device's flush of 64 random 4 KiB writes then stores one 256 KiB
    /// chunk with one request, not 64.
    pub fn take_packed(&mut self, chunk_size: u64, all: bool) -> Vec<Vec<(u64, Vec<u8>)>> {
        let mut out: Vec<Vec<(u64, Vec<u8>)>> = Vec::new();
        let mut pack: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut packed = 0u64;
        for (offset, bytes) in self.take_chunks(chunk_size, all) {
            let len = bytes.len() as u64;
            if len >= chunk_size / 2 {
                out.push(vec![(offset, bytes)]);
                continue;
            }
            if packed + len > chunk_size {
                out.push(std::mem::take(&mut pack));
                packed = 0;
            }
            packed += len;
            pack.push((offset, bytes));
        }
        if !pack.is_empty() {
            out.push(pack);
        }
        out
    }

    /// Whether any buffered byte falls into `[start, end)`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.runs.range(..end).next_back().is_some_and(|(s, run)| s + run.len() as u64 > start)
            || self.runs.range(start..end).next().is_some()
    }

    /// Copies buffered bytes that fall into `[offset, offset + buf.len())` over `buf`.
    pub fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        for (&s, run) in self.runs.range(..end) {
            let run_end = s + run.len() as u64;
            if run_end <= offset {
                continue;
            }
            let from = s.max(offset);
            let to = run_end.min(end);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&run[(from - s) as usize..(to - s) as usize]);
        }
    }
}

/// Everything a client knows about one open file.
pub(crate) struct FileInner {
    pub attr: Attr,
    /// Committed extents overlaid with this client's pending ones.
    pub extents: ExtentMap,
    pub dirty: DirtyBuffer,
    /// Extents stored (or being stored) but not yet committed to meta, in write order.
    pub pending: Vec<Extent>,
    /// The replication policy its chunks are stored under (as of the open).
    pub policy: Policy,
    pub uploads: Vec<JoinHandle<Result<StoredChunk, VfsError>>>,
    /// Size or mtime changed locally since the last commit.
    pub modified: bool,
    pub opens: usize,
    /// What meta allowed this session's opens of the file (see `Vfs::open`): a write
    /// open is recorded there, and reads and puts came with capabilities.
    pub granted: proto::meta::OpenAccess,
    /// Lock owners that took a byte-range lock here; their locks go on close.
    pub lock_owners: HashSet<u64>,
    /// Written data that could not be stored, until an fsync reports it (every flush,
    /// i.e. close, before that reports it too): whichever request met the failure
    /// first (a setattr the kernel's flusher sends, an fallocate, a forked child's
    /// close), the writer learns at its next sync point that data is lost, as Linux
    /// reports writeback errors at fsync and close.
    pub write_error: Option<VfsError>,
}

/// A file open in this client, shared by all its handles.
pub(crate) struct FileState {
    pub ino: InodeId,
    pub inner: tokio::sync::Mutex<FileInner>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The buffer answers like a byte array with the same writes applied, and
        /// cutting it into chunks loses nothing.
        #[test]
        fn dirty_buffer_matches_model(writes in prop::collection::vec((0u64..300, 1usize..90, any::<u8>()), 1..25), cut in 1u64..64) {
            let mut model: Vec<Option<u8>> = vec![None; 400];
            let mut d = DirtyBuffer::default();
            for (off, len, v) in &writes {
                d.insert(*off, &vec![*v; *len]);
                for b in &mut model[*off as usize..*off as usize + len] { *b = Some(*v); }
            }
            prop_assert_eq!(d.bytes(), model.iter().filter(|b| b.is_some()).count());
            for (start, end) in [(0u64, 400u64), (0, 1), (150, 160), (399, 400)] {
                let any = model[start as usize..end as usize].iter().any(|b| b.is_some());
                prop_assert_eq!(d.overlaps(start, end), any, "overlaps({}, {})", start, end);
            }
            let mut buf = vec![0u8; 400];
            d.overlay(0, &mut buf);
            for (i, b) in model.iter().enumerate() { prop_assert_eq!(buf[i], b.unwrap_or(0)); }
            let mut rebuilt = vec![None; 400];
            for (off, data) in d.take_chunks(cut, true) {
                prop_assert!(data.len() as u64 <= cut);
                for (i, b) in data.iter().enumerate() { rebuilt[off as usize + i] = Some(*b); }
            }
            prop_assert_eq!(rebuilt, model);
            prop_assert_eq!(d.bytes(), 0);
        }

        /// Packing loses and duplicates no byte and never makes a chunk longer than one.
        #[test]
        fn packed_pieces_cover_the_writes(
            writes in proptest::collection::vec((0u64..4000, 1usize..300, any::<u8>()), 1..60),
            cut in 64u64..1024,
        ) {
            let mut d = DirtyBuffer::default();
            let mut model = vec![None; 4300];
            for (off, len, v) in &writes {
                d.insert(*off, &vec![*v; *len]);
                for b in &mut model[*off as usize..*off as usize + len] { *b = Some(*v); }
            }
            let mut rebuilt = vec![None; 4300];
            for pack in d.take_packed(cut, true) {
                prop_assert!(!pack.is_empty());
                prop_assert!(pack.iter().map(|(_, b)| b.len() as u64).sum::<u64>() <= cut);
                for (off, data) in pack {
                    for (i, b) in data.iter().enumerate() {
                        prop_assert!(rebuilt[off as usize + i].is_none(), "byte {} twice", off as usize + i);
                        rebuilt[off as usize + i] = Some(*b);
                    }
                }
            }
            prop_assert_eq!(rebuilt, model);
        }
    }
}
