//! The write path: bytes buffered per file, cut into chunks at chunk boundaries,
//! hashed and stored on the site's nodes in the background (write-behind).

use super::{FileHandle, Result, Vfs};
use crate::file::FileInner;
use bytes::Bytes;
use proto::types::*;
use std::sync::Arc;

impl Vfs {
    pub async fn write(self: &Arc<Self>, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32> {
        let handle = self.handle(fh)?;
        let mut f = handle.file.inner.lock().await;
        f.dirty.insert(offset, data);
        f.attr.size = f.attr.size.max(offset + data.len() as u64);
        // write(2) marks both mtime and ctime for update.
        let now = Timestamp::now();
        f.attr.mtime = now;
        f.attr.ctime = now;
        f.modified = true;
        let flush_all = f.dirty.bytes() > self.config.max_dirty_bytes;
        for pieces in f.dirty.take_packed(self.config.chunk_size, flush_all) {
            self.start_upload(&mut f, pieces).await;
        }
        Ok(data.len() as u32)
    }

    /// Hashes pieces of written data (file offset, bytes) into one chunk, maps each
    /// into the file's view as an extent of it and stores the chunk on a node in the
    /// background.
    pub(super) async fn start_upload(self: &Arc<Self>, f: &mut FileInner, mut pieces: Vec<(u64, Vec<u8>)>) {
        let permit = self.upload_slots.clone().acquire_owned().await.expect("semaphore open");
        let placed: Vec<(u64, u64)> = pieces.iter().map(|(offset, b)| (*offset, b.len() as u64)).collect();
        let bytes = match pieces.len() {
            1 => pieces.pop().expect("one piece").1,
            _ => pieces.into_iter().flat_map(|(_, b)| b).collect(),
        };
        let id = ChunkId::of(&bytes);
        let mut chunk_offset = 0;
        for (file_offset, len) in placed {
            let extent = Extent { file_offset, len, chunk: id, chunk_offset };
            f.extents.insert(extent);
            f.pending.push(extent);
            chunk_offset += len;
        }
        let data = Bytes::from(bytes);
        self.data.begin_upload(id, &data);
        let (vfs, ino) = (self.clone(), f.attr.ino);
        let policy = f.policy.clone();
        // The upload may have to ask meta for a fresh put capability: as this caller.
        let caller = crate::meta_link::current_caller();
        f.uploads.push(tokio::spawn(async move {
            let store = vfs.data.store_chunk(ino, id, &data, &policy);
            let stored = match caller {
                Some(caller) => crate::meta_link::acting_as(caller, store).await,
                None => store.await,
            };
            vfs.data.end_upload(id, stored.is_ok());
            drop(permit);
            stored
        }));
    }
}
