//! The read path: extents resolved to chunks, adaptive sequential read-ahead, and
//! buffered bytes laid over what the chunks hold.

use super::{FileHandle, Result, Vfs};
use crate::error::VfsError;
use bytes::Bytes;
use proto::error::ErrorCode;
use proto::extent::Segment;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Vfs {
    /// Reads up to `size` bytes at `offset` (fewer at the end of the file).
    pub async fn read(self: &Arc<Self>, fh: FileHandle, offset: u64, size: u32) -> Result<Bytes> {
        let handle = self.handle(fh)?;
        let ino = handle.file.ino;
        let (segments, end, ahead, sequential) = {
            let f = handle.file.inner.lock().await;
            let end = (offset + size as u64).min(f.attr.size);
            if offset >= end {
                return Ok(Bytes::new());
            }
            let cs = self.config.chunk_size;
            // The kernel's asynchronous read-ahead hands several reads over at once and
            // they may arrive out of order: a read within a chunk of the furthest one so
            // far continues the stream (an exact match would reset the window to two
            // chunks at every reordering and starve a distant site's pipeline).
            let last = handle.last_read_end.load(Ordering::Relaxed);
            let sequential = offset == 0 || offset.abs_diff(last) <= cs;
            if sequential {
                handle.last_read_end.fetch_max(end, Ordering::Relaxed);
            } else {
                // A jump: nothing ahead until the reader has gone past the chunk after
                // the one it jumped into. The kernel splits one large read into requests
                // that look sequential and reads ahead of it on its own (into the next
                // chunk): a random reader of whole chunks would otherwise fetch chunks it
                // never reads.
                handle.last_read_end.store(end, Ordering::Relaxed);
                handle.window.store(1, Ordering::Relaxed);
                handle.prefetched_to.store(0, Ordering::Relaxed);
                handle.quiet_until.store((offset / cs + 2) * cs, Ordering::Relaxed);
            }
            let ahead = if sequential && end > handle.quiet_until.load(Ordering::Relaxed) {
                let max = self.config.readahead_chunks.min((self.config.cache_bytes as u64 / 2 / cs).max(1));
                let target = |window: u64| (end + window * cs).min(f.attr.size);
                if offset / cs != end.saturating_sub(1) / cs || offset.is_multiple_of(cs) {
                    // Crossing into a new chunk: the reader keeps going, widen the window.
                    let w = (handle.window.load(Ordering::Relaxed) * 2).min(max).max(1);
                    handle.window.store(w, Ordering::Relaxed);
                    // Drop behind: the chunk two before this one is done with (the kernel's
                    // reads of it ended long ago), unless the window needs it again.
                    if let Some(done) = (offset / cs).checked_sub(2) {
                        let chunks = |from: u64, to: u64| {
                            f.extents.segments(from, to).into_iter().filter_map(|s| match s {
                                Segment::Data(e) => Some(e.chunk),
                                Segment::Hole { .. } => None,
                            })
                        };
                        let wanted: Vec<_> = chunks(done * cs + cs, target(w)).collect();
                        for id in chunks(done * cs, done * cs + cs).filter(|id| !wanted.contains(id)) {
                            self.data.forget(&id);
                        }
                    }
                }
                let target = target(handle.window.load(Ordering::Relaxed));
                let from = handle.prefetched_to.fetch_max(target, Ordering::Relaxed).max(end);
                f.extents.segments(from, target.max(from))
            } else {
                Vec::new()
            };
            (f.extents.segments(offset, end), end, ahead, sequential)
        };
        for seg in ahead {
            if let Segment::Data(e) = seg {
                let (vfs, handle) = (self.clone(), handle.clone());
                tokio::spawn(async move {
                    // A fetch that starts late (a busy runtime) after the reader went past
                    // its chunk would only bring back what drop-behind let go.
                    let passed = e.file_offset + e.len + vfs.config.chunk_size;
                    if handle.last_read_end.load(Ordering::Relaxed) <= passed {
                        let _ = vfs.data.chunk(e.chunk, ino).await;
                    }
                });
            }
        }
        // (file offset, bytes) of every data piece; holes stay zero.
        let mut pieces = Vec::with_capacity(segments.len());
        for seg in segments {
            if let Segment::Data(e) = seg {
                // A reader that jumped here reads only the blocks it needs, unless the
                // chunk is at hand; a sequential one fetches whole chunks for what follows.
                let piece = if sequential {
                    let chunk = self.data.chunk(e.chunk, ino).await?;
                    let from = (e.chunk_offset as usize).min(chunk.len());
                    chunk.slice(from..(from + e.len as usize).min(chunk.len()))
                } else {
                    self.data.chunk_part(e.chunk, ino, e.chunk_offset, e.len).await?
                };
                if piece.len() as u64 != e.len {
                    return Err(VfsError::new(ErrorCode::Corrupt, format!("extent beyond end of chunk {}", e.chunk)));
                }
                pieces.push((e.file_offset, piece));
            }
        }
        let f = handle.file.inner.lock().await;
        if let [(at, only)] = &pieces[..]
            && *at == offset
            && only.len() as u64 == end - offset
            && !f.dirty.overlaps(offset, end)
        {
            // The common case: one piece of one chunk, handed out without a copy.
            return Ok(only.clone());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for (at, piece) in &pieces {
            let at = (at - offset) as usize;
            out[at..at + piece.len()].copy_from_slice(piece);
        }
        // Buffered bytes are newer than any extent.
        f.dirty.overlay(offset, &mut out);
        Ok(Bytes::from(out))
    }
}
