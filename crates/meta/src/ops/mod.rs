//! The POSIX namespace and data-mapping rules, written once over the `Txn` primitives
//! so that every backend behaves identically: requests are classified and dispatched
//! here, and handled in one module per concept.

mod catalogue;
mod data;
mod namespace;
mod sessions;

use catalogue::{forget_chunk, nodes, register_node};
use data::{commit_write, compact, fallocate, punch, truncate};
use namespace::{create, destroy, link, lookup, read_dir, rename, rmdir, set_attr, set_xattr, unlink};
use sessions::hello;
pub use sessions::{end_session, expire_sessions, reap_orphans, reclaim_if_unused};

use crate::error::MetaError;
use crate::opens::OpenTable;
use crate::store::{Counter, Inode, SessionRow, Txn};
use proto::extent::clip;
use proto::meta::{
    AllocateMode, ClusterStatus, FsStats, MetaReply, MetaRequest, NewNode, RenameMode, SessionInfo, SetAttr,
    StoredChunk, TimeSet, XattrMode,
};
use proto::types::{
    Attr, Caller, ChunkId, DirEntry, Extent, FileKind, InodeId, NodeInfo, ROOT_INODE, SessionId, Timestamp,
};
use std::sync::Arc;

/// Longest name component, as on Linux.
pub const NAME_MAX: usize = 255;
/// Largest extended attribute value (Linux XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;
/// A node id reported from a different address within this window is a conflict.
pub const NODE_CLAIM_WINDOW_MS: i64 = 10_000;
/// Largest page any listing returns.
const MAX_PAGE: u32 = 100_000;
/// Largest file offset the store can hold (POSIX `off_t`).
const MAX_OFFSET: u64 = i64::MAX as u64;

/// The moment and settings a request runs with.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub now: Timestamp,
    pub now_ms: i64,
    pub heartbeat_ms: u64,
    /// Open files per session (in memory, shared with the service).
    pub opens: Arc<OpenTable>,
    /// The cluster this database was formatted for.
    pub cluster_id: Arc<str>,
}

impl Ctx {
    /// The current wall-clock time, read once so a request uses one timestamp.
    pub fn now(heartbeat_ms: u64, opens: Arc<OpenTable>, cluster_id: Arc<str>) -> Ctx {
        let now = Timestamp::now();
        Ctx { now, now_ms: now.secs * 1000 + i64::from(now.nanos / 1_000_000), heartbeat_ms, opens, cluster_id }
    }
}

/// How a request touches the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write {
        durable: bool,
    },
    /// Served from the in-memory lock table.
    Locks,
    /// Kept in the service's memory (worker reports).
    Reports,
    /// Open without truncation and release: a read plus bookkeeping in the
    /// in-memory open table (the service applies it).
    Open,
}

/// Classifies a request; durable writes are on disk before they are answered.
pub fn access(req: &MetaRequest) -> Access {
    use MetaRequest::*;
    match req {
        Lookup { .. }
        | GetAttr { .. }
        | ReadLink { .. }
        | ReadDir { .. }
        | GetXattr { .. }
        | ListXattr { .. }
        | StatFs
        | Extents { .. }
        | ListNodes
        | ChunkLocations { .. }
        | ListChunks { .. }
        | ListExtents { .. }
        | Unreferenced { .. }
        | Status => Access::Read,
        GetLock { .. } | SetLock { .. } | ReleaseLocks { .. } => Access::Locks,
        ReportWorkers { .. } => Access::Reports,
        Open { truncate: false, .. } | Release { .. } => Access::Open,
        CommitWrite { .. } | Compact { .. } | Fallocate { .. } | Sync => Access::Write { durable: true },
        Hello { .. }
        | Heartbeat { .. }
        | Goodbye { .. }
        | SetAttr { .. }
        | Create { .. }
        | Link { .. }
        | Unlink { .. }
        | Rmdir { .. }
        | Rename { .. }
        | SetXattr { .. }
        | RemoveXattr { .. }
        | Open { truncate: true, .. }
        | RegisterNode { .. }
        | UpdateLocations { .. }
        | ForgetChunks { .. } => Access::Write { durable: false },
    }
}

/// Runs a read request.
pub fn read(t: &mut dyn Txn, ctx: &Ctx, req: &MetaRequest) -> Result<MetaReply, MetaError> {
    use MetaRequest as R;
    Ok(match req {
        R::Lookup { parent, name } => MetaReply::Attr(lookup(t, *parent, name)?),
        R::GetAttr { ino } => MetaReply::Attr(inode(t, *ino)?.attr),
        R::Open { ino, session, truncate: false } => {
            t.get_session(*session)?.ok_or_else(|| unknown_session(*session))?;
            let attr = inode(t, *ino)?.attr;
            let extents = t.extents_overlapping(*ino, 0, u64::MAX)?;
            MetaReply::Opened { attr, extents }
        }
        // The service drops the open record; it needs to know whether this is an orphan.
        R::Release { ino, .. } => match t.get_inode(*ino)? {
            Some(i) => MetaReply::Attr(i.attr),
            None => MetaReply::Done,
        },
        R::ReadLink { ino } => {
            let i = inode(t, *ino)?;
            if i.attr.kind != FileKind::Symlink {
                return Err(MetaError::InvalidArgument(format!("inode {ino} is not a symlink")));
            }
            MetaReply::Bytes(i.target)
        }
        R::ReadDir { ino, after, limit } => MetaReply::Entries(read_dir(t, *ino, *after, *limit)?),
        R::GetXattr { ino, name } => {
            check_xattr_name(name)?;
            inode(t, *ino)?;
            let v = t.get_xattr(*ino, name)?.ok_or_else(|| MetaError::NoAttribute(show(name)))?;
            MetaReply::Bytes(v)
        }
        R::ListXattr { ino } => {
            inode(t, *ino)?;
            MetaReply::Names(t.list_xattrs(*ino)?)
        }
        R::StatFs => {
            let nodes = t.list_nodes()?;
            MetaReply::StatFs(FsStats {
                capacity_bytes: nodes.iter().map(|(n, _)| n.capacity_bytes).sum(),
                used_bytes: nodes.iter().map(|(n, _)| n.used_bytes).sum(),
                inodes: t.count_inodes()?,
            })
        }
        // Answered like `Open` (attributes and extents), without recording an open.
        R::Extents { ino } => {
            let attr = inode(t, *ino)?.attr;
            MetaReply::Opened { attr, extents: t.extents_overlapping(*ino, 0, u64::MAX)? }
        }
        R::ListNodes => MetaReply::Nodes(nodes(t, ctx)?),
        R::ChunkLocations { ids } => {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(c) = t.get_chunk(id)? {
                    out.push(c);
                }
            }
            MetaReply::Chunks(out)
        }
        R::ListChunks { after, limit } => MetaReply::Chunks(t.list_chunks(after.as_ref(), page(*limit))?),
        R::ListExtents { after, limit } => MetaReply::Extents(t.list_extents(*after, page(*limit))?),
        R::Unreferenced { ids } => {
            let mut out = Vec::new();
            for id in ids {
                match t.get_chunk(id)? {
                    Some(c) if c.refcount > 0 => {}
                    _ => out.push(*id),
                }
            }
            MetaReply::ChunkIds(out)
        }
        R::Status => {
            let (chunks, chunk_bytes) = t.chunk_totals()?;
            let sessions = t
                .list_sessions()?
                .into_iter()
                .map(|s| (s.id, s.info, secs_since(ctx.now_ms, s.last_seen_ms)))
                .collect();
            MetaReply::Status(ClusterStatus {
                nodes: nodes(t, ctx)?,
                sessions,
                inodes: t.count_inodes()?,
                chunks,
                chunk_bytes,
                site_rtts: t.site_rtts()?,
                // Kept in the service's memory; it fills them in.
                workers: Vec::new(),
                cluster_id: ctx.cluster_id.to_string(),
            })
        }
        other => {
            return Err(MetaError::Internal(format!("{other:?} is not a read request")));
        }
    })
}

/// Runs a write request inside the caller's transaction.
pub fn write(t: &mut dyn Txn, ctx: &Ctx, req: MetaRequest) -> Result<MetaReply, MetaError> {
    use MetaRequest as R;
    let now = ctx.now;
    Ok(match req {
        R::Hello { protocol, session } => hello(t, ctx, protocol, session)?,
        R::Heartbeat { session } => {
            let mut s = t.get_session(session)?.ok_or_else(|| unknown_session(session))?;
            s.last_seen_ms = ctx.now_ms;
            t.put_session(&s)?;
            MetaReply::Done
        }
        R::Goodbye { session } => {
            end_session(t, &ctx.opens, session)?;
            MetaReply::Done
        }
        R::SetAttr { ino, set, caller } => MetaReply::Attr(set_attr(t, now, ino, &set, &caller)?),
        R::Create { parent, name, node, mode, caller, exclusive, open_by } => {
            let attr = create(t, now, parent, &name, node, mode, &caller, exclusive)?;
            match open_by {
                None => MetaReply::Attr(attr),
                Some(session) => {
                    t.get_session(session)?.ok_or_else(|| unknown_session(session))?;
                    require_file(&inode(t, attr.ino)?)?;
                    ctx.opens.add(session, attr.ino);
                    let extents = t.extents_overlapping(attr.ino, 0, u64::MAX)?;
                    MetaReply::Opened { attr, extents }
                }
            }
        }
        R::Link { ino, new_parent, new_name } => MetaReply::Attr(link(t, now, ino, new_parent, &new_name)?),
        R::Unlink { parent, name } => {
            let (ino, orphaned) = unlink(t, &ctx.opens, now, parent, &name)?;
            MetaReply::Unlinked { ino, orphaned }
        }
        R::Rmdir { parent, name } => {
            rmdir(t, now, parent, &name)?;
            MetaReply::Done
        }
        R::Rename { parent, name, new_parent, new_name, mode } => {
            rename(t, &ctx.opens, now, parent, &name, new_parent, &new_name, mode)?;
            MetaReply::Done
        }
        R::SetXattr { ino, name, value, mode } => {
            set_xattr(t, now, ino, &name, &value, mode)?;
            MetaReply::Done
        }
        R::RemoveXattr { ino, name } => {
            check_xattr_name(&name)?;
            let mut i = inode(t, ino)?;
            if !t.delete_xattr(ino, &name)? {
                return Err(MetaError::NoAttribute(show(&name)));
            }
            i.attr.ctime = now;
            t.put_inode(&i)?;
            MetaReply::Done
        }
        R::Open { ino, session, truncate: true } => {
            t.get_session(session)?.ok_or_else(|| unknown_session(session))?;
            let mut i = inode(t, ino)?;
            require_file(&i)?;
            truncate(t, &mut i, 0, now)?;
            t.put_inode(&i)?;
            ctx.opens.add(session, ino);
            let extents = t.extents_overlapping(ino, 0, u64::MAX)?;
            MetaReply::Opened { attr: i.attr, extents }
        }
        R::CommitWrite { ino, extents, chunks, min_size, mtime } => {
            MetaReply::Attr(commit_write(t, now, ino, &extents, &chunks, min_size, mtime)?)
        }
        R::Fallocate { ino, offset, len, mode } => MetaReply::Attr(fallocate(t, now, ino, offset, len, mode)?),
        R::Compact { ino, data_version, extents, chunks } => {
            MetaReply::Attr(compact(t, ino, data_version, &extents, &chunks)?)
        }
        R::Sync => {
            t.next_id(Counter::Sync)?;
            MetaReply::Done
        }
        R::RegisterNode { node, cluster_id } => {
            register_node(t, ctx, &node, cluster_id.as_deref())?;
            MetaReply::Registered { cluster_id: ctx.cluster_id.to_string() }
        }
        R::UpdateLocations { node, added, removed } => {
            for chunk in &added {
                t.upsert_chunk(&StoredChunk { nodes: vec![node.clone()], ..chunk.clone() })?;
            }
            for id in &removed {
                t.remove_location(id, &node)?;
            }
            MetaReply::Done
        }
        R::ForgetChunks { ids } => {
            for id in &ids {
                forget_chunk(t, id)?;
            }
            MetaReply::Done
        }
        other => {
            return Err(MetaError::Internal(format!("{other:?} is not a write request")));
        }
    })
}

fn page(limit: u32) -> u32 {
    limit.clamp(1, MAX_PAGE)
}

fn secs_since(now_ms: i64, then_ms: i64) -> u64 {
    (now_ms.saturating_sub(then_ms).max(0) / 1000) as u64
}

fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

fn unknown_session(session: SessionId) -> MetaError {
    MetaError::NotFound(format!("session {session} (expired or unknown; say Hello again)"))
}

fn check_name(name: &[u8]) -> Result<(), MetaError> {
    if name.len() > NAME_MAX {
        return Err(MetaError::NameTooLong { len: name.len() });
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(MetaError::InvalidArgument(format!("{} is not a valid name", show(name))));
    }
    Ok(())
}

fn check_xattr_name(name: &[u8]) -> Result<(), MetaError> {
    if name.is_empty() {
        return Err(MetaError::InvalidArgument("empty extended attribute name".into()));
    }
    if name.len() > NAME_MAX {
        return Err(MetaError::Range(format!("attribute name of {} bytes exceeds {NAME_MAX}", name.len())));
    }
    Ok(())
}

fn inode(t: &mut dyn Txn, ino: InodeId) -> Result<Inode, MetaError> {
    t.get_inode(ino)?.ok_or_else(|| MetaError::NotFound(format!("inode {ino}")))
}

fn dir(t: &mut dyn Txn, ino: InodeId) -> Result<Inode, MetaError> {
    let i = inode(t, ino)?;
    if i.attr.kind != FileKind::Dir {
        return Err(MetaError::NotDir(format!("inode {ino}")));
    }
    Ok(i)
}

fn require_file(i: &Inode) -> Result<(), MetaError> {
    match i.attr.kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(MetaError::IsDir(format!("inode {}", i.attr.ino))),
        k => Err(MetaError::InvalidArgument(format!("inode {} is a {k:?}, not a regular file", i.attr.ino))),
    }
}
