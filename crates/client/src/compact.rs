//! Background compaction: files fragmented by many small overwrites are rewritten into
//! whole chunks, so reads touch few chunks and the small ones can be collected. Runs as
//! the client's `compaction` worker. A compaction is committed only if nobody changed
//! the file meanwhile (meta checks `data_version`).

use crate::data::DataPath;
use crate::error::VfsError;
use crate::meta_link::MetaLink;
use proto::error::ErrorCode;
use proto::extent::{ExtentMap, Segment};
use proto::meta::{Compact, Extents, Opened, StoredChunk};
use proto::types::{Caller, ChunkId, Extent, InodeId};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use util::worker::{Step, Worker};

/// Whether a file has many more extents than its size needs.
pub(crate) fn is_fragmented(extents: &ExtentMap, size: u64, chunk_size: u64) -> bool {
    let ideal = size.div_ceil(chunk_size).max(1) as usize;
    extents.len() > 16 && extents.len() > 4 * ideal
}

/// Runs of contiguous data (no holes) inside one chunk-aligned window that consist of
/// more than one extent: the pieces worth rewriting. Holes stay holes.
pub(crate) fn runs_to_rewrite(extents: &ExtentMap, size: u64, chunk_size: u64) -> Vec<(u64, Vec<Extent>)> {
    let mut out = Vec::new();
    let mut window = 0;
    while window < size {
        let end = (window + chunk_size).min(size);
        let mut run: Vec<Extent> = Vec::new();
        for seg in extents.segments(window, end).into_iter().chain([Segment::Hole { file_offset: end, len: 0 }]) {
            match seg {
                Segment::Data(e) if run.last().is_none_or(|l| l.end() == e.file_offset) => run.push(e),
                Segment::Data(e) => {
                    if run.len() > 1 {
                        out.push((run[0].file_offset, std::mem::take(&mut run)));
                    }
                    run = vec![e];
                }
                Segment::Hole { .. } => {
                    if run.len() > 1 {
                        out.push((run[0].file_offset, std::mem::take(&mut run)));
                    }
                    run.clear();
                }
            }
        }
        window = end;
    }
    out
}

/// The compaction worker: takes inodes from a queue (files found fragmented on close)
/// and rewrites them one per step.
pub(crate) struct Compactor {
    meta: Arc<MetaLink>,
    data: Arc<DataPath>,
    chunk_size: u64,
    queue: mpsc::UnboundedReceiver<(InodeId, Option<Caller>)>,
    /// Files to compact, each for the user who last closed it (its writer).
    waiting: BTreeMap<InodeId, Option<Caller>>,
    compacted: u64,
}

impl Compactor {
    /// The worker and the sender that queues inodes for it.
    pub fn new(
        meta: Arc<MetaLink>,
        data: Arc<DataPath>,
        chunk_size: u64,
    ) -> (Self, mpsc::UnboundedSender<(InodeId, Option<Caller>)>) {
        let (tx, queue) = mpsc::unbounded_channel();
        (Compactor { meta, data, chunk_size, queue, waiting: BTreeMap::new(), compacted: 0 }, tx)
    }
}

impl Worker for Compactor {
    type Error = VfsError;

    fn name(&self) -> String {
        "compaction".into()
    }

    fn progress(&self) -> String {
        format!("{} files compacted, {} queued", self.compacted, self.waiting.len())
    }

    async fn work(&mut self) -> Result<Step, VfsError> {
        while let Ok((ino, caller)) = self.queue.try_recv() {
            self.waiting.insert(ino, caller);
        }
        let Some((ino, caller)) = self.waiting.pop_first() else { return Ok(Step::Idle) };
        let work = compact(&self.meta, &self.data, self.chunk_size, ino);
        let done = match caller {
            Some(caller) => crate::meta_link::acting_as(caller, work).await,
            None => work.await,
        };
        match done {
            Ok(0) => {}
            Ok(runs) => {
                self.compacted += 1;
                tracing::debug!(ino, runs, "compacted");
            }
            // Changed or deleted meanwhile, or the user who closed it may not rewrite
            // it (meta checks write permission): nothing to do.
            Err(e) if matches!(e.code, ErrorCode::Stale | ErrorCode::NotFound | ErrorCode::PermissionDenied) => {}
            Err(e) => return Err(VfsError::new(e.code, format!("compacting inode {ino}: {}", e.context))),
        }
        Ok(if self.waiting.is_empty() { Step::Idle } else { Step::Busy })
    }

    async fn wait_for_work(&mut self) -> Step {
        match self.queue.recv().await {
            Some((ino, caller)) => {
                self.waiting.insert(ino, caller);
                Step::Busy
            }
            None => Step::Done,
        }
    }
}

/// Rewrites the fragmented runs of one file; returns how many runs were merged.
pub(crate) async fn compact(
    meta: &MetaLink,
    data: &DataPath,
    chunk_size: u64,
    ino: InodeId,
) -> Result<usize, VfsError> {
    let opened = meta.call(Extents { ino }).await?;
    data.learn_caps(&opened);
    let Opened { attr, extents, policy, .. } = opened;
    let extents = ExtentMap::from_extents(extents);
    if !is_fragmented(&extents, attr.size, chunk_size) {
        return Ok(0);
    }
    let runs = runs_to_rewrite(&extents, attr.size, chunk_size);
    let mut new_extents = Vec::new();
    let mut chunks: Vec<StoredChunk> = Vec::new();
    for (start, pieces) in &runs {
        let mut bytes = Vec::new();
        for e in pieces {
            let chunk = data.chunk(e.chunk, ino).await?;
            let from = e.chunk_offset as usize;
            let piece = chunk.get(from..from + e.len as usize).ok_or_else(|| {
                VfsError::new(ErrorCode::Corrupt, format!("extent of inode {ino} beyond the end of chunk {}", e.chunk))
            })?;
            bytes.extend_from_slice(piece);
        }
        let id = ChunkId::of(&bytes);
        let bytes = bytes::Bytes::from(bytes);
        chunks.push(data.store_chunk(ino, id, &bytes, &policy).await?);
        new_extents.push(Extent { file_offset: *start, len: bytes.len() as u64, chunk: id, chunk_offset: 0 });
    }
    let req = Compact { ino, session: meta.session(), data_version: attr.data_version, extents: new_extents, chunks };
    meta.call(req).await?;
    Ok(runs.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(off: u64, len: u64, tag: u8) -> Extent {
        Extent { file_offset: off, len, chunk: ChunkId([tag; 32]), chunk_offset: 0 }
    }

    #[test]
    fn runs_stop_at_holes_and_window_edges() {
        // window 0..100: [0,10) [10,20) hole [30,40) ; window 100..200: [100,150) [150,200)
        let m = ExtentMap::from_extents([e(0, 10, 1), e(10, 10, 2), e(30, 10, 3), e(90, 20, 4), e(110, 90, 5)]);
        let runs = runs_to_rewrite(&m, 200, 100);
        let starts: Vec<(u64, usize)> = runs.iter().map(|(s, p)| (*s, p.len())).collect();
        // [90,110) crosses the window edge, so it is split: [90,100) stays alone in window 0.
        assert_eq!(starts, vec![(0, 2), (100, 2)]);
    }

    #[test]
    fn fragmentation_threshold() {
        let many = ExtentMap::from_extents((0..40).map(|i| e(i * 10, 10, i as u8)));
        assert!(is_fragmented(&many, 400, 4 << 20));
        let few = ExtentMap::from_extents((0..4).map(|i| e(i * 10, 10, i as u8)));
        assert!(!is_fragmented(&few, 40, 4 << 20));
    }
}
