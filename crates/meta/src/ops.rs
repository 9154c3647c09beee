//! The POSIX namespace and data-mapping rules, written once over the `Txn` primitives
//! so that every backend behaves identically: one function per `MetaRequest`.

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

/// Loads a directory, adjusts its link count, stamps mtime/ctime and stores it.
fn touch_dir(t: &mut dyn Txn, ino: InodeId, now: Timestamp, nlink_delta: i64) -> Result<(), MetaError> {
    let mut d = inode(t, ino)?;
    d.attr.nlink = (i64::from(d.attr.nlink) + nlink_delta).max(0) as u32;
    d.attr.mtime = now;
    d.attr.ctime = now;
    t.put_inode(&d)
}

fn lookup(t: &mut dyn Txn, parent: InodeId, name: &[u8]) -> Result<Attr, MetaError> {
    let p = dir(t, parent)?;
    match name {
        b"." => return Ok(p.attr),
        b".." => return Ok(inode(t, p.parent)?.attr),
        _ => check_name(name)?,
    }
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    Ok(inode(t, ino)?.attr)
}

fn read_dir(t: &mut dyn Txn, ino: InodeId, after: u64, limit: u32) -> Result<Vec<DirEntry>, MetaError> {
    dir(t, ino)?;
    let rows = t.list_dentries(ino, after, page(limit))?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        match t.get_inode(row.ino)? {
            Some(child) => out.push(DirEntry { name: row.name, attr: child.attr, cookie: row.cookie }),
            None => tracing::warn!(dir = ino, child = row.ino, "directory entry points at a missing inode"),
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn create(
    t: &mut dyn Txn,
    now: Timestamp,
    parent: InodeId,
    name: &[u8],
    node: NewNode,
    mode: u32,
    caller: &Caller,
    exclusive: bool,
) -> Result<Attr, MetaError> {
    check_name(name)?;
    let p = dir(t, parent)?;
    if let Some(existing) = t.get_dentry(parent, name)? {
        let e = inode(t, existing)?;
        if !exclusive && e.attr.kind == FileKind::File && node == NewNode::File {
            return Ok(e.attr);
        }
        return Err(MetaError::Exists(show(name)));
    }
    let (kind, rdev, target) = match node {
        NewNode::File => (FileKind::File, 0, Vec::new()),
        NewNode::Dir => (FileKind::Dir, 0, Vec::new()),
        NewNode::Symlink { target } => {
            if target.is_empty() || target.len() > 4096 {
                return Err(MetaError::InvalidArgument(format!("symlink target of {} bytes", target.len())));
            }
            (FileKind::Symlink, 0, target)
        }
        NewNode::Special { kind: FileKind::Dir | FileKind::Symlink, .. } => {
            return Err(MetaError::InvalidArgument("mknod cannot make directories or symlinks".into()));
        }
        NewNode::Special { kind, rdev } => (kind, rdev, Vec::new()),
    };
    let mut mode = mode & 0o7777;
    let gid = if p.attr.mode & 0o2000 != 0 {
        if kind == FileKind::Dir {
            mode |= 0o2000;
        }
        p.attr.gid
    } else {
        caller.gid
    };
    let ino = t.next_id(Counter::Inode)?;
    let is_dir = kind == FileKind::Dir;
    let size = match kind {
        FileKind::Dir => 4096,
        FileKind::Symlink => target.len() as u64,
        _ => 0,
    };
    let new = Inode {
        attr: Attr {
            ino,
            kind,
            mode,
            uid: caller.uid,
            gid,
            size,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            data_version: 0,
        },
        parent,
        target,
    };
    t.put_inode(&new)?;
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(parent, name, ino, cookie)?;
    touch_dir(t, parent, now, if is_dir { 1 } else { 0 })?;
    Ok(new.attr)
}

fn link(
    t: &mut dyn Txn,
    now: Timestamp,
    ino: InodeId,
    new_parent: InodeId,
    new_name: &[u8],
) -> Result<Attr, MetaError> {
    check_name(new_name)?;
    dir(t, new_parent)?;
    let mut i = inode(t, ino)?;
    if i.attr.kind == FileKind::Dir {
        return Err(MetaError::NotPermitted(format!("hard link to directory inode {ino}")));
    }
    if i.attr.nlink == 0 {
        return Err(MetaError::NotFound(format!("inode {ino} (already unlinked)")));
    }
    if t.get_dentry(new_parent, new_name)?.is_some() {
        return Err(MetaError::Exists(show(new_name)));
    }
    i.attr.nlink = i.attr.nlink.saturating_add(1);
    i.attr.ctime = now;
    t.put_inode(&i)?;
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(new_parent, new_name, ino, cookie)?;
    touch_dir(t, new_parent, now, 0)?;
    Ok(i.attr)
}

/// Drops one link of a non-directory; returns whether it lives on as an orphan.
fn drop_link(t: &mut dyn Txn, opens: &OpenTable, now: Timestamp, mut i: Inode) -> Result<bool, MetaError> {
    i.attr.nlink = i.attr.nlink.saturating_sub(1);
    i.attr.ctime = now;
    if i.attr.nlink > 0 {
        t.put_inode(&i)?;
        return Ok(false);
    }
    if opens.count(i.attr.ino) > 0 {
        t.put_inode(&i)?;
        return Ok(true);
    }
    destroy(t, i.attr.ino)?;
    Ok(false)
}

/// Removes an inode with everything hanging off it, releasing its chunk references.
fn destroy(t: &mut dyn Txn, ino: InodeId) -> Result<(), MetaError> {
    punch(t, ino, 0, u64::MAX)?;
    t.delete_all_xattrs(ino)?;
    t.delete_inode(ino)
}

/// Reclaims an orphan (no links) that no session has open any more.
pub fn reclaim_if_unused(t: &mut dyn Txn, opens: &OpenTable, ino: InodeId) -> Result<bool, MetaError> {
    match t.get_inode(ino)? {
        Some(i) if i.attr.nlink == 0 && i.attr.kind != FileKind::Dir && opens.count(ino) == 0 => {
            destroy(t, ino)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn unlink(
    t: &mut dyn Txn,
    opens: &OpenTable,
    now: Timestamp,
    parent: InodeId,
    name: &[u8],
) -> Result<(InodeId, bool), MetaError> {
    check_name(name)?;
    dir(t, parent)?;
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let i = inode(t, ino)?;
    if i.attr.kind == FileKind::Dir {
        return Err(MetaError::IsDir(show(name)));
    }
    t.delete_dentry(parent, name)?;
    touch_dir(t, parent, now, 0)?;
    let orphaned = drop_link(t, opens, now, i)?;
    Ok((ino, orphaned))
}

fn is_empty_dir(t: &mut dyn Txn, ino: InodeId) -> Result<bool, MetaError> {
    Ok(t.list_dentries(ino, 0, 1)?.is_empty())
}

fn rmdir(t: &mut dyn Txn, now: Timestamp, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
    check_name(name)?;
    dir(t, parent)?;
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let i = inode(t, ino)?;
    if i.attr.kind != FileKind::Dir {
        return Err(MetaError::NotDir(show(name)));
    }
    if !is_empty_dir(t, ino)? {
        return Err(MetaError::NotEmpty(show(name)));
    }
    t.delete_dentry(parent, name)?;
    destroy(t, ino)?;
    touch_dir(t, parent, now, -1)
}

/// Refuses to move directory `moving` under `dest` if `dest` lies inside it.
fn ensure_not_within(t: &mut dyn Txn, dest: InodeId, moving: InodeId) -> Result<(), MetaError> {
    let mut cur = dest;
    for _ in 0..1_000_000 {
        if cur == moving {
            return Err(MetaError::InvalidArgument(format!("cannot move directory {moving} into its own subtree")));
        }
        if cur == ROOT_INODE {
            return Ok(());
        }
        cur = inode(t, cur)?.parent;
    }
    Err(MetaError::Corrupt(format!("parent chain of inode {dest} does not reach the root")))
}

/// Points an inode at its new parent directory and stamps its ctime.
fn reparent(t: &mut dyn Txn, ino: InodeId, parent: InodeId, now: Timestamp) -> Result<(), MetaError> {
    let mut i = inode(t, ino)?;
    i.parent = parent;
    i.attr.ctime = now;
    t.put_inode(&i)
}

#[allow(clippy::too_many_arguments)]
fn rename(
    t: &mut dyn Txn,
    opens: &OpenTable,
    now: Timestamp,
    parent: InodeId,
    name: &[u8],
    new_parent: InodeId,
    new_name: &[u8],
    mode: RenameMode,
) -> Result<(), MetaError> {
    check_name(name)?;
    check_name(new_name)?;
    dir(t, parent)?;
    dir(t, new_parent)?;
    let src = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let dst = t.get_dentry(new_parent, new_name)?;
    if parent == new_parent && name == new_name {
        return match mode {
            RenameMode::NoReplace => Err(MetaError::Exists(show(new_name))),
            _ => Ok(()),
        };
    }
    let src_dir = inode(t, src)?.attr.kind == FileKind::Dir;
    if mode == RenameMode::NoReplace && dst.is_some() {
        return Err(MetaError::Exists(show(new_name)));
    }
    if src_dir {
        ensure_not_within(t, new_parent, src)?;
    }
    if mode == RenameMode::Exchange {
        let dst = dst.ok_or_else(|| MetaError::NotFound(show(new_name)))?;
        if dst == src {
            return Ok(());
        }
        let dst_dir = inode(t, dst)?.attr.kind == FileKind::Dir;
        if dst_dir {
            ensure_not_within(t, parent, dst)?;
        }
        t.delete_dentry(parent, name)?;
        t.delete_dentry(new_parent, new_name)?;
        let c1 = t.next_id(Counter::Cookie)?;
        t.put_dentry(parent, name, dst, c1)?;
        let c2 = t.next_id(Counter::Cookie)?;
        t.put_dentry(new_parent, new_name, src, c2)?;
        reparent(t, src, new_parent, now)?;
        reparent(t, dst, parent, now)?;
        let moved = if parent == new_parent { 0 } else { i64::from(src_dir) - i64::from(dst_dir) };
        touch_dir(t, parent, now, -moved)?;
        touch_dir(t, new_parent, now, moved)?;
        return Ok(());
    }
    if let Some(d) = dst {
        if d == src {
            // Two names of one inode: POSIX says do nothing.
            return Ok(());
        }
        let d_inode = inode(t, d)?;
        let dst_dir = d_inode.attr.kind == FileKind::Dir;
        match (src_dir, dst_dir) {
            (true, false) => return Err(MetaError::NotDir(show(new_name))),
            (false, true) => return Err(MetaError::IsDir(show(new_name))),
            (true, true) if !is_empty_dir(t, d)? => {
                return Err(MetaError::NotEmpty(show(new_name)));
            }
            _ => {}
        }
        t.delete_dentry(new_parent, new_name)?;
        if dst_dir {
            destroy(t, d)?;
            touch_dir(t, new_parent, now, -1)?;
        } else {
            drop_link(t, opens, now, d_inode)?;
        }
    }
    t.delete_dentry(parent, name)?;
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(new_parent, new_name, src, cookie)?;
    reparent(t, src, new_parent, now)?;
    let moved = i64::from(src_dir && parent != new_parent);
    touch_dir(t, parent, now, -moved)?;
    touch_dir(t, new_parent, now, moved)
}

fn time_of(set: TimeSet, now: Timestamp) -> Timestamp {
    match set {
        TimeSet::Now => now,
        TimeSet::At(ts) => ts,
    }
}

fn set_attr(t: &mut dyn Txn, now: Timestamp, ino: InodeId, set: &SetAttr, _caller: &Caller) -> Result<Attr, MetaError> {
    let mut i = inode(t, ino)?;
    if let Some(size) = set.size {
        require_file(&i)?;
        truncate(t, &mut i, size, now)?;
    }
    if let Some(mode) = set.mode {
        i.attr.mode = mode & 0o7777;
    }
    if let Some(uid) = set.uid {
        i.attr.uid = uid;
    }
    if let Some(gid) = set.gid {
        i.attr.gid = gid;
    }
    if let Some(a) = set.atime {
        i.attr.atime = time_of(a, now);
    }
    if let Some(m) = set.mtime {
        i.attr.mtime = time_of(m, now);
    }
    i.attr.ctime = now;
    t.put_inode(&i)?;
    Ok(i.attr)
}

/// Removes `[start, end)` from a file's extents, keeping the clipped pieces; chunk
/// refcounts follow the number of extent rows that reference each chunk.
fn punch(t: &mut dyn Txn, ino: InodeId, start: u64, end: u64) -> Result<(), MetaError> {
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
fn truncate(t: &mut dyn Txn, i: &mut Inode, size: u64, now: Timestamp) -> Result<(), MetaError> {
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

fn end_of(offset: u64, len: u64) -> Result<u64, MetaError> {
    offset
        .checked_add(len)
        .filter(|e| *e <= MAX_OFFSET)
        .ok_or_else(|| MetaError::InvalidArgument(format!("range {offset}+{len} exceeds the largest file size")))
}

fn commit_write(
    t: &mut dyn Txn,
    now: Timestamp,
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
    i.attr.ctime = now;
    i.attr.data_version += 1;
    t.put_inode(&i)?;
    Ok(i.attr)
}

/// Maps `extents` (later ones win) over whatever the file had there, recording their
/// chunks in the catalogue; refcounts stay equal to the number of extent rows.
fn map_extents(t: &mut dyn Txn, ino: InodeId, extents: &[Extent], chunks: &[StoredChunk]) -> Result<(), MetaError> {
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

/// Replaces fragmented extents by ones with the same bytes, only if nobody changed the
/// file since the compactor read it (`data_version`); content and times stay as they are.
fn compact(
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

fn fallocate(
    t: &mut dyn Txn,
    now: Timestamp,
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
    i.attr.mtime = now;
    i.attr.ctime = now;
    t.put_inode(&i)?;
    Ok(i.attr)
}

fn set_xattr(
    t: &mut dyn Txn,
    now: Timestamp,
    ino: InodeId,
    name: &[u8],
    value: &[u8],
    mode: XattrMode,
) -> Result<(), MetaError> {
    check_xattr_name(name)?;
    if value.len() > XATTR_VALUE_MAX {
        return Err(MetaError::InvalidArgument(format!(
            "attribute value of {} bytes exceeds {XATTR_VALUE_MAX}",
            value.len()
        )));
    }
    let mut i = inode(t, ino)?;
    let present = t.get_xattr(ino, name)?.is_some();
    match mode {
        XattrMode::Create if present => {
            return Err(MetaError::Exists(format!("extended attribute {}", show(name))));
        }
        XattrMode::Replace if !present => return Err(MetaError::NoAttribute(show(name))),
        _ => {}
    }
    t.set_xattr(ino, name, value)?;
    i.attr.ctime = now;
    t.put_inode(&i)
}

fn hello(t: &mut dyn Txn, ctx: &Ctx, protocol: u32, info: SessionInfo) -> Result<MetaReply, MetaError> {
    if protocol != proto::PROTOCOL_VERSION {
        return Err(MetaError::InvalidArgument(format!(
            "client speaks protocol {protocol}, this meta speaks {}; run the same locus version on both",
            proto::PROTOCOL_VERSION
        )));
    }
    let id = t.next_id(Counter::Session)?;
    t.put_session(&SessionRow { id, info, last_seen_ms: ctx.now_ms })?;
    Ok(MetaReply::Welcome { session: id, heartbeat_ms: ctx.heartbeat_ms, cluster_id: ctx.cluster_id.to_string() })
}

/// Ends a session: drops its open records (reclaiming orphans nobody else has open)
/// and its row. Locks live in memory and are dropped by the service.
pub fn end_session(t: &mut dyn Txn, opens: &OpenTable, session: SessionId) -> Result<(), MetaError> {
    for ino in opens.remove_session(session) {
        reclaim_if_unused(t, opens, ino)?;
    }
    t.delete_session(session)
}

/// Ends every session silent since before `cutoff_ms`, returning their ids.
pub fn expire_sessions(t: &mut dyn Txn, opens: &OpenTable, cutoff_ms: i64) -> Result<Vec<SessionId>, MetaError> {
    let mut expired = Vec::new();
    for s in t.list_sessions()? {
        if s.last_seen_ms < cutoff_ms {
            end_session(t, opens, s.id)?;
            expired.push(s.id);
        }
    }
    Ok(expired)
}

/// Reclaims orphans that no session has open: the safety net for a release that
/// raced with the unlink, and for orphans left from before a restart of meta.
pub fn reap_orphans(t: &mut dyn Txn, opens: &OpenTable) -> Result<usize, MetaError> {
    let mut reaped = 0;
    for ino in t.orphans()? {
        if reclaim_if_unused(t, opens, ino)? {
            reaped += 1;
        }
    }
    Ok(reaped)
}

fn register_node(t: &mut dyn Txn, ctx: &Ctx, node: &NodeInfo, cluster_id: Option<&str>) -> Result<(), MetaError> {
    if let Some(theirs) = cluster_id
        && theirs != &*ctx.cluster_id
    {
        return Err(MetaError::WrongCluster(format!(
            "node {} at {} belongs to cluster {theirs}, this meta serves cluster {}; point the node at its own \
             meta (or give it a fresh data directory to join this cluster)",
            node.id, node.addr, ctx.cluster_id
        )));
    }
    if let Some((old, seen)) = t.get_node(&node.id)?
        && old.store_id != node.store_id
        && ctx.now_ms.saturating_sub(seen) < NODE_CLAIM_WINDOW_MS
    {
        return Err(MetaError::Exists(format!(
            "two nodes with different chunk stores claim id {}: {} (seen {} ms ago) and {}; give each node a unique id",
            node.id,
            old.addr,
            ctx.now_ms.saturating_sub(seen),
            node.addr
        )));
    }
    t.put_node(node, ctx.now_ms)
}

fn nodes(t: &mut dyn Txn, ctx: &Ctx) -> Result<Vec<NodeInfo>, MetaError> {
    Ok(t.list_nodes()?
        .into_iter()
        .map(|(mut n, seen)| {
            n.last_seen_secs = secs_since(ctx.now_ms, seen);
            n
        })
        .collect())
}

fn forget_chunk(t: &mut dyn Txn, id: &ChunkId) -> Result<(), MetaError> {
    if let Some(c) = t.get_chunk(id)?
        && c.refcount == 0
    {
        t.delete_chunk(id)?;
    }
    Ok(())
}
