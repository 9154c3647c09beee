//! Background compaction: files fragmented by many small overwrites are rewritten into
//! whole chunks, so reads touch few chunks and the small ones can be collected. Runs as
//! one worker task per client; it stops when the `Vfs` is dropped. A compaction is
//! committed only if nobody changed the file meanwhile (meta checks `data_version`).

use crate::error::VfsError;
use crate::vfs::Vfs;
use proto::error::ErrorCode;
use proto::extent::{ExtentMap, Segment};
use proto::meta::{MetaReply, MetaRequest, StoredChunk};
use proto::types::{ChunkId, Extent, InodeId};
use std::collections::HashSet;
use std::sync::{Arc, Weak};
use tokio::sync::mpsc;

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

/// Starts the worker; the sender queues inodes to look at.
pub(crate) fn spawn_worker(vfs: Weak<Vfs>) -> mpsc::UnboundedSender<InodeId> {
    let (tx, mut rx) = mpsc::unbounded_channel::<InodeId>();
    tokio::spawn(async move {
        let mut seen = HashSet::new();
        while let Some(ino) = rx.recv().await {
            seen.insert(ino);
            while let Ok(more) = rx.try_recv() {
                seen.insert(more);
            }
            for ino in seen.drain() {
                let Some(vfs) = vfs.upgrade() else { return };
                match compact(&vfs, ino).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(ino, runs = n, "compacted"),
                    Err(e) if matches!(e.code, ErrorCode::Stale | ErrorCode::NotFound) => {}
                    Err(e) => tracing::warn!(ino, "compaction failed: {e}"),
                }
            }
        }
    });
    tx
}

/// Rewrites the fragmented runs of one file; returns how many runs were merged.
pub(crate) async fn compact(vfs: &Arc<Vfs>, ino: InodeId) -> Result<usize, VfsError> {
    let (attr, extents) = match vfs.meta_call(MetaRequest::Extents { ino }).await? {
        MetaReply::Opened { attr, extents } => (attr, ExtentMap::from_extents(extents)),
        other => return Err(VfsError::new(ErrorCode::Internal, format!("Extents answered {other:?}"))),
    };
    let chunk_size = vfs.chunk_size();
    if !is_fragmented(&extents, attr.size, chunk_size) {
        return Ok(0);
    }
    let runs = runs_to_rewrite(&extents, attr.size, chunk_size);
    let mut new_extents = Vec::new();
    let mut chunks: Vec<StoredChunk> = Vec::new();
    for (start, pieces) in &runs {
        let mut bytes = Vec::new();
        for e in pieces {
            let chunk = vfs.chunk(e.chunk).await?;
            let from = e.chunk_offset as usize;
            let piece = chunk.get(from..from + e.len as usize).ok_or_else(|| {
                VfsError::new(ErrorCode::Corrupt, format!("extent of inode {ino} beyond the end of chunk {}", e.chunk))
            })?;
            bytes.extend_from_slice(piece);
        }
        let id = ChunkId::of(&bytes);
        let data = bytes::Bytes::from(bytes);
        chunks.push(vfs.store_chunk(id, &data).await?);
        new_extents.push(Extent { file_offset: *start, len: data.len() as u64, chunk: id, chunk_offset: 0 });
    }
    let req = MetaRequest::Compact { ino, data_version: attr.data_version, extents: new_extents, chunks };
    vfs.meta_call(req).await?;
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
