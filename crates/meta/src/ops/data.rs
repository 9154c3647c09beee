//! File data mapping: extents, committed writes, compaction, truncation and fallocate.

use super::*;

/// Removes `[start, end)` from a file's extents, keeping the clipped pieces; chunk
/// refcounts follow the number of extent rows that reference each chunk.
pub(super) fn punch(t: &mut dyn Txn, ino: InodeId, start: u64, end: u64) -> Result<(), MetaError> {
    for old in t.extents_overlapping(ino, start, end)? {
        t.delete_extent(ino, old.file_offset)?;
        t.adjust_refcount(&old.chunk, -1)?;
        for piece in clip(&old, start, end) {
            t.insert_extent(ino, &piece)?;
            t.adjust_refcount(&piece.chunk, 1)?;
        }
    }
    Ok(())
}

/// Sets a file's size, dropping data beyond it; the caller stores the inode.
pub(super) fn truncate(t: &mut dyn Txn, i: &mut Inode, size: u64, now: Timestamp) -> Result<(), MetaError> {
    if size > MAX_OFFSET {
        return Err(MetaError::InvalidArgument(format!("size {size} exceeds the largest file size")));
    }
    punch(t, i.attr.ino, size, u64::MAX)?;
    i.attr.size = size;
    i.attr.data_version += 1;
    i.attr.mtime = now;
    i.attr.ctime = now;
    Ok(())
}

pub(super) fn end_of(offset: u64, len: u64) -> Result<u64, MetaError> {
    offset
        .checked_add(len)
        .filter(|e| *e <= MAX_OFFSET)
        .ok_or_else(|| MetaError::InvalidArgument(format!("range {offset}+{len} exceeds the largest file size")))
}

/// Asks at once for what a write of `ino`'s data over `span` reads: the inode, the
/// session's open of it (`check_data_write`) and the extents it replaces (`punch`).
pub(super) fn prefetch_data_write(
    t: &mut dyn Txn,
    session: SessionId,
    ino: InodeId,
    span: Option<(u64, u64)>,
) -> Result<(), MetaError> {
    let extents = span.map(|(start, end)| (ino, start, end));
    t.prefetch(Prefetch { open: Some((session, ino)), extents, writing: true, ..Prefetch::default() })
}

/// From the first byte to the end of `extents` (none if they hold no byte).
pub(super) fn span(extents: &[Extent]) -> Option<(u64, u64)> {
    let written = extents.iter().filter(|e| e.len > 0);
    let start = written.clone().map(|e| e.file_offset).min()?;
    let end = written.map(|e| e.file_offset.saturating_add(e.len)).max()?;
    Some((start, end))
}

pub(super) fn commit_write(
    t: &mut dyn Txn,
    ctx: &Ctx,
    ino: InodeId,
    extents: &[Extent],
    chunks: &[StoredChunk],
    min_size: u64,
    mtime: Timestamp,
) -> Result<Attr, MetaError> {
    let mut i = inode(t, ino)?;
    require_file(&i)?;
    if min_size > MAX_OFFSET {
        return Err(MetaError::InvalidArgument(format!("size {min_size} exceeds the largest file size")));
    }
    map_extents(t, ino, extents, chunks)?;
    i.attr.size = i.attr.size.max(min_size);
    i.attr.mtime = mtime;
    i.attr.ctime = ctx.now;
    i.attr.data_version += 1;
    perm::drop_privileges(&ctx.caller, &mut i.attr, false);
    t.put_inode(&i)?;
    Ok(i.attr)
}

/// Maps `extents` (later ones win) over whatever the file had there, recording their
/// chunks in the catalogue; refcounts stay equal to the number of extent rows.
pub(super) fn map_extents(
    t: &mut dyn Txn,
    ino: InodeId,
    extents: &[Extent],
    chunks: &[StoredChunk],
) -> Result<(), MetaError> {
    check_possession(t, ino, extents, chunks)?;
    for c in chunks {
        t.upsert_chunk(c)?;
    }
    for e in extents {
        let end = end_of(e.file_offset, e.len)?;
        if e.len == 0 {
            continue;
        }
        punch(t, ino, e.file_offset, end)?;
        t.insert_extent(ino, e)?;
        t.adjust_refcount(&e.chunk, 1)?;
    }
    Ok(())
}

/// An extent may name only a chunk the request stored (listed in `chunks`, with the
/// node's receipt the service checked, and lying within it) or one the file already
/// holds: knowing another file's chunk id is no way to read it.
fn check_possession(
    t: &mut dyn Txn,
    ino: InodeId,
    extents: &[Extent],
    chunks: &[StoredChunk],
) -> Result<(), MetaError> {
    let listed: std::collections::HashMap<&ChunkId, u64> = chunks.iter().map(|c| (&c.id, c.size)).collect();
    let mut unlisted = Vec::new();
    for e in extents {
        end_of(e.file_offset, e.len)?;
    }
    for e in extents.iter().filter(|e| e.len > 0) {
        match listed.get(&e.chunk) {
            Some(&size) if e.chunk_offset.checked_add(e.len).is_none_or(|end| end > size) => {
                return Err(MetaError::InvalidArgument(format!(
                    "extent at {} of inode {ino} reaches beyond the {size} bytes of chunk {}",
                    e.file_offset, e.chunk
                )));
            }
            Some(_) => {}
            None => unlisted.push(e.chunk),
        }
    }
    if unlisted.is_empty() {
        return Ok(());
    }
    let held: std::collections::HashSet<ChunkId> =
        t.extents_overlapping(ino, 0, u64::MAX)?.into_iter().map(|e| e.chunk).collect();
    match unlisted.iter().find(|c| !held.contains(c)) {
        Some(c) => Err(MetaError::PermissionDenied(format!(
            "chunk {c} is neither stored by this request (with a node's receipt) nor part of inode {ino}"
        ))),
        None => Ok(()),
    }
}

/// Replaces fragmented extents by ones with the same bytes, only if nobody changed the
/// file since the compactor read it (`data_version`); content and times stay as they are.
pub(super) fn compact(
    t: &mut dyn Txn,
    ino: InodeId,
    data_version: u64,
    extents: &[Extent],
    chunks: &[StoredChunk],
) -> Result<Attr, MetaError> {
    let i = inode(t, ino)?;
    require_file(&i)?;
    if i.attr.data_version != data_version {
        return Err(MetaError::Stale(format!(
            "inode {ino} changed (version {} -> {}) while it was being compacted",
            data_version, i.attr.data_version
        )));
    }
    if extents.iter().any(|e| e.end() > i.attr.size) {
        return Err(MetaError::InvalidArgument(format!("compaction of inode {ino} reaches beyond its size")));
    }
    map_extents(t, ino, extents, chunks)?;
    Ok(i.attr)
}

pub(super) fn fallocate(
    t: &mut dyn Txn,
    ctx: &Ctx,
    ino: InodeId,
    offset: u64,
    len: u64,
    mode: AllocateMode,
) -> Result<Attr, MetaError> {
    let mut i = inode(t, ino)?;
    require_file(&i)?;
    let end = end_of(offset, len)?;
    match mode {
        AllocateMode::KeepSize => return Ok(i.attr),
        AllocateMode::Extend => i.attr.size = i.attr.size.max(end),
        AllocateMode::PunchHole => punch(t, ino, offset, end)?,
        AllocateMode::ZeroRange => {
            punch(t, ino, offset, end)?;
            i.attr.size = i.attr.size.max(end);
        }
    }
    i.attr.data_version += 1;
    i.attr.mtime = ctx.now;
    i.attr.ctime = ctx.now;
    perm::drop_privileges(&ctx.caller, &mut i.attr, false);
    t.put_inode(&i)?;
    Ok(i.attr)
}
