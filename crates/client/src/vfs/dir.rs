//! Directory listings: a cursor per open directory, filled from meta in large pages
//! and handed out in whatever amount the caller can take.

use super::{DirCursor, DirHandle, Result, Vfs};
use crate::error::VfsError;
use proto::error::ErrorCode;
use proto::meta::*;
use proto::types::*;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use util::sync::lock;

impl Vfs {
    pub async fn opendir(&self, ino: InodeId) -> Result<DirHandle> {
        let attr = self.meta.call(GetAttr { ino }).await?;
        if attr.kind != FileKind::Dir {
            return Err(VfsError::new(ErrorCode::NotDir, format!("opendir of inode {ino}")));
        }
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let cursor = DirCursor { ino, attr, buffered: VecDeque::new(), after: 0, done: false };
        lock(&self.dirs).insert(fh, Arc::new(tokio::sync::Mutex::new(cursor)));
        Ok(fh)
    }

    /// Up to `limit` entries after cookie `after` (0 = from the start), fetched from
    /// meta in large pages and handed out in whatever amount the caller can take, with
    /// the directory's own attributes. Meta sends every entry's attributes with its
    /// name; `with_attrs` asks for them as a lookup would answer (this client's
    /// unflushed size and times of a file it has open), so that the kernel may keep
    /// them (READDIRPLUS) instead of looking up every name it lists. A call after the
    /// last cookie handed out continues the page: a small `limit` costs no refetch.
    pub async fn readdir(
        &self,
        dh: DirHandle,
        after: u64,
        with_attrs: bool,
        limit: usize,
    ) -> Result<(Attr, Vec<DirEntry>)> {
        let cursor = lock(&self.dirs)
            .get(&dh)
            .cloned()
            .ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, "bad directory handle"))?;
        let (dir, mut entries) = self.next_entries(&cursor, after, limit).await?;
        if with_attrs {
            for e in &mut entries {
                e.attr = self.local_view(e.attr.clone()).await;
            }
        }
        Ok((dir, entries))
    }

    /// The directory's attributes and up to `limit` buffered entries after `after`.
    async fn next_entries(
        &self,
        cursor: &tokio::sync::Mutex<DirCursor>,
        after: u64,
        limit: usize,
    ) -> Result<(Attr, Vec<DirEntry>)> {
        let mut c = cursor.lock().await;
        // Cookies grow along a listing: anything but a cookie within the buffered page
        // (or its end) is a seek, answered from a fresh page.
        if after < c.after || c.buffered.back().is_some_and(|e| e.cookie < after) {
            c.buffered.clear();
            c.done = false;
        }
        while c.buffered.front().is_some_and(|e| e.cookie <= after) {
            c.buffered.pop_front();
        }
        c.after = after;
        if !c.done && c.buffered.is_empty() {
            let page = self.meta.call(ReadDir { ino: c.ino, after, limit: 2048 }).await?;
            c.done = page.len() < 2048;
            self.remember_bare(&page);
            c.buffered.extend(page);
        }
        Ok((c.attr.clone(), c.buffered.iter().take(limit).cloned().collect()))
    }

    pub fn releasedir(&self, dh: DirHandle) {
        lock(&self.dirs).remove(&dh);
    }
}
