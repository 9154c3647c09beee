//! The POSIX namespace and data-mapping rules, written once over the `Txn` primitives
//! so that every backend behaves identically: requests are classified and dispatched
//! here, and handled in one module per concept.

mod catalogue;
mod data;
mod locks;
mod namespace;
pub mod perm;
mod policy;
mod sessions;

use catalogue::{admit, drain, forget_chunk, join, make_join_token, nodes, register_node, remove};
use data::{commit_write, compact, fallocate, prefetch_data_write, punch, span, truncate};
use locks::{add_open, get_lock, release, release_locks, set_lock};
use namespace::{Created, create, destroy, link, lookup, read_dir, rename, rmdir, set_attr, set_xattr, unlink};
pub(crate) use namespace::{Fresh, enter, new_node};
use perm::{MAY_EXEC, MAY_READ, MAY_WRITE, check, check_data_write, check_privileged, check_xattr};
use policy::{effective_policy, policy_warnings, set_policy, under_replicated};
use sessions::hello;
pub use sessions::{end_session, expire_sessions, reap_orphans, reclaim_if_unused, release_session};

use crate::error::MetaError;
use crate::store::{Counter, Inode, Prefetch, SessionRow, Txn};
use proto::extent::clip;
use proto::meta::{
    AllocateMode, AttrChanges, ChunkCaps, ClusterStatus, FsStats, Garbage, Made, MetaMessage, MetaReply, MetaRequest,
    NewNode, OpenAccess, Opened, Registered, RenameMode, SessionInfo, StoredChunk, TimeSet, Unlinked, UpdateLocations,
    XattrMode,
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
/// Deepest chain of parents any walk up the tree follows (an inherited policy, search
/// permission, a move into one's own subtree): a longer one is a loop in a corrupt
/// database.
const MAX_DEPTH: usize = 100_000;

/// The moment and settings a request runs with.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub now: Timestamp,
    pub now_ms: i64,
    pub heartbeat_ms: u64,
    /// The cluster this database was formatted for.
    pub cluster_id: Arc<str>,
    /// The epoch of the primary role this meta serves (`Store::epoch`).
    pub epoch: u64,
    /// Whom the request acts for, as meta resolved it from the peer and the request:
    /// every permission is checked against it (`perm`); uid 0 is the superuser.
    pub caller: Caller,
    /// The name the peer's certificate proves (`None` without TLS); a session
    /// remembers it as its owner.
    pub certificate: Option<String>,
    /// Whether the peer sees the whole cluster in `Status` (every session and pending
    /// node): anyone but a client certificate, which sees its own sessions only.
    pub oversees: bool,
}

impl Ctx {
    /// The current wall-clock time, read once so a request uses one timestamp.
    pub fn now(heartbeat_ms: u64, cluster_id: Arc<str>, epoch: u64) -> Ctx {
        let now = Timestamp::now();
        Ctx {
            now,
            now_ms: now.secs * 1000 + i64::from(now.nanos / 1_000_000),
            heartbeat_ms,
            cluster_id,
            epoch,
            caller: Caller::ROOT,
            certificate: None,
            oversees: true,
        }
    }

    /// The same moment, acting for `caller`, for a peer whose certificate proved
    /// `certificate` (and that `oversees` the cluster or not).
    pub fn acting_for(self, caller: Caller, certificate: Option<String>, oversees: bool) -> Ctx {
        Ctx { caller, certificate, oversees, ..self }
    }
}

/// Runs `handler` on `msg`; the compiler checks that it answers with the type the
/// request declares (`MetaMessage::Response`).
pub fn serve<M: MetaMessage>(
    msg: M,
    handler: impl FnOnce(M) -> Result<M::Response, MetaError>,
) -> Result<MetaReply, MetaError> {
    handler(msg).map(Into::into)
}

/// Runs a read request (`proto::meta::Access::Read`).
pub fn read(t: &mut dyn Txn, ctx: &Ctx, req: MetaRequest) -> Result<MetaReply, MetaError> {
    use MetaRequest as R;
    match req {
        R::Lookup(m) => serve(m, |m| lookup(t, &ctx.caller, m.parent, &m.name)),
        R::GetAttr(m) => serve(m, |m| Ok(reach(t, &ctx.caller, m.ino)?.attr)),
        R::GetLock(m) => serve(m, |m| {
            reach(t, &ctx.caller, m.lock.ino)?;
            get_lock(t, m.session, &m.lock)
        }),
        R::ReadLink(m) => serve(m, |m| {
            let i = reach(t, &ctx.caller, m.ino)?;
            if i.attr.kind != FileKind::Symlink {
                return Err(MetaError::InvalidArgument(format!("inode {} is not a symlink", m.ino)));
            }
            Ok(i.target)
        }),
        R::ReadDir(m) => serve(m, |m| read_dir(t, &ctx.caller, m.ino, m.after, m.limit)),
        R::GetXattr(m) => serve(m, |m| {
            check_xattr_name(&m.name)?;
            let i = reach(t, &ctx.caller, m.ino)?;
            check_xattr(t, &ctx.caller, &i, &m.name, false)?;
            t.get_xattr(m.ino, &m.name)?.ok_or_else(|| MetaError::NoAttribute(show(&m.name)))
        }),
        R::ListXattr(m) => serve(m, |m| {
            reach(t, &ctx.caller, m.ino)?;
            let mut names = t.list_xattrs(m.ino)?;
            names.retain(|n| perm::xattr_visible(&ctx.caller, n));
            Ok(names)
        }),
        R::StatFs(m) => serve(m, |_| {
            let nodes = t.list_nodes()?;
            Ok(FsStats {
                capacity_bytes: nodes.iter().map(|(n, _)| n.capacity_bytes).sum(),
                used_bytes: nodes.iter().map(|(n, _)| n.used_bytes).sum(),
                inodes: t.count_inodes()?,
            })
        }),
        // Answered like `Open` (attributes and extents), without recording an open.
        R::Extents(m) => serve(m, |m| {
            t.prefetch(Prefetch { extents: Some((m.ino, 0, u64::MAX)), policies: Some(m.ino), ..Prefetch::default() })?;
            let i = reach(t, &ctx.caller, m.ino)?;
            check(t, &ctx.caller, &i, MAY_READ)?;
            let attr = i.attr;
            let policy = effective_policy(t, m.ino)?.policy;
            let extents = t.extents_overlapping(m.ino, 0, u64::MAX)?;
            Ok(Opened { attr, extents, caps: ChunkCaps::default(), policy, parent: None, created: false })
        }),
        R::ListNodes(m) => serve(m, |_| nodes(t, ctx)),
        R::ChunkLocations(m) => serve(m, |m| {
            let mut out = Vec::with_capacity(m.ids.len());
            for id in &m.ids {
                if let Some(c) = t.get_chunk(id)? {
                    out.push(c);
                }
            }
            Ok(out)
        }),
        R::ListChunks(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "listing the chunk catalogue")?;
            t.list_chunks(m.after.as_ref(), page(m.limit))
        }),
        R::ListExtents(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "listing every extent")?;
            t.list_extents(m.after, page(m.limit))
        }),
        R::Unreferenced(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "asking which chunks are unreferenced")?;
            let mut out = Vec::new();
            for id in m.ids {
                match t.get_chunk(&id)? {
                    Some(c) if c.refcount > 0 => {}
                    _ => out.push(id),
                }
            }
            Ok(Garbage { ids: out, epoch: ctx.epoch })
        }),
        R::Status(m) => serve(m, |_| {
            let (chunks, chunk_bytes) = t.chunk_totals()?;
            let sessions = t
                .list_sessions()?
                .into_iter()
                .filter(|s| ctx.oversees || (s.owner.is_some() && s.owner == ctx.certificate))
                .map(|s| (s.id, s.info, secs_since(ctx.now_ms, s.last_seen_ms)))
                .collect();
            let policies = t.list_policies()?;
            Ok(ClusterStatus {
                policy_warnings: policy_warnings(t, &policies)?,
                policies,
                nodes: nodes(t, ctx)?,
                sessions,
                inodes: t.count_inodes()?,
                chunks,
                chunk_bytes,
                site_rtts: t.site_rtts()?,
                // Kept in the service's memory; it fills them in.
                workers: Vec::new(),
                lag: Vec::new(),
                pending: Vec::new(),
                audit: Vec::new(),
                forwarding: Vec::new(),
                cluster_id: ctx.cluster_id.to_string(),
                now_ms: ctx.now_ms,
            })
        }),
        R::GetPolicy(m) => serve(m, |m| {
            reach(t, &ctx.caller, m.ino)?;
            effective_policy(t, m.ino)
        }),
        R::ListPolicies(m) => serve(m, |_| t.list_policies()),
        R::UnderReplicated(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "listing under-replicated chunks")?;
            under_replicated(t, ctx, m.node.as_deref(), m.after, page(m.limit))
        }),
        other => Err(MetaError::Internal(format!("{other:?} is not a read request"))),
    }
}

/// Runs a write request inside the caller's transaction.
pub fn write(t: &mut dyn Txn, ctx: &Ctx, req: MetaRequest) -> Result<MetaReply, MetaError> {
    use MetaRequest as R;
    let now = ctx.now;
    match req {
        R::Hello(m) => serve(m, |m| hello(t, ctx, m.protocol, m.session)),
        R::Heartbeat(m) => serve(m, |m| {
            let mut s = t.get_session(m.session)?.ok_or_else(|| unknown_session(m.session))?;
            s.last_seen_ms = ctx.now_ms;
            t.put_session(&s)
        }),
        R::Goodbye(m) => serve(m, |m| end_session(t, m.session)),
        R::SetAttr(m) => serve(m, |m| set_attr(t, ctx, m.ino, &m.set, m.session)),
        R::Create(m) => serve(m, |m| {
            let c = create(t, now, m, &ctx.caller)?;
            Ok(Made { attr: c.attr, parent: c.parent })
        }),
        R::CreateOpen(m) => serve(m, |m| {
            let c = m.create;
            t.prefetch(Prefetch { session: Some(m.session), ..Prefetch::entry(c.parent, &c.name) })?;
            t.get_session(m.session)?.ok_or_else(|| unknown_session(m.session))?;
            let Created { attr, created, parent } = create(t, now, c, &ctx.caller)?;
            let i = inode(t, attr.ino)?;
            require_file(&i)?;
            if !created {
                check_open(t, &ctx.caller, &i, m.access, false)?;
            }
            // The creator of a new file may write it whatever its mode says.
            add_open(t, m.session, attr.ino, m.access.write || created)?;
            let extents = t.extents_overlapping(attr.ino, 0, u64::MAX)?;
            let policy = effective_policy(t, attr.ino)?.policy;
            Ok(Opened { attr, extents, caps: ChunkCaps::default(), policy, parent: Some(parent), created })
        }),
        R::Link(m) => serve(m, |m| link(t, &ctx.caller, now, m.ino, m.new_parent, &m.new_name)),
        R::Unlink(m) => serve(m, |m| unlink(t, &ctx.caller, now, m.parent, &m.name)),
        R::Rmdir(m) => serve(m, |m| rmdir(t, &ctx.caller, now, m.parent, &m.name)),
        R::Rename(m) => serve(m, |m| rename(t, ctx, m.parent, &m.name, m.new_parent, &m.new_name, m.mode)),
        R::SetXattr(m) => serve(m, |m| set_xattr(t, &ctx.caller, now, m.ino, &m.name, &m.value, m.mode)),
        R::RemoveXattr(m) => serve(m, |m| {
            check_xattr_name(&m.name)?;
            let mut i = reach(t, &ctx.caller, m.ino)?;
            check_xattr(t, &ctx.caller, &i, &m.name, true)?;
            let removed = if m.name == crate::acl::ACCESS || m.name == crate::acl::DEFAULT {
                namespace::remove_acl(t, &mut i, &m.name)?
            } else {
                t.delete_xattr(m.ino, &m.name)?
            };
            if !removed {
                return Err(MetaError::NoAttribute(show(&m.name)));
            }
            i.attr.ctime = now;
            t.put_inode(&i)
        }),
        R::Open(m) => serve(m, |m| {
            t.prefetch(Prefetch {
                session: Some(m.session),
                open: Some((m.session, m.ino)),
                extents: Some((m.ino, 0, u64::MAX)),
                ..Prefetch::default()
            })?;
            t.get_session(m.session)?.ok_or_else(|| unknown_session(m.session))?;
            let mut i = reach(t, &ctx.caller, m.ino)?;
            if m.truncate {
                require_file(&i)?;
            }
            check_open(t, &ctx.caller, &i, m.access, m.truncate)?;
            if m.truncate {
                truncate(t, &mut i, 0, now)?;
                perm::drop_privileges(&ctx.caller, &mut i.attr, false);
                t.put_inode(&i)?;
            }
            add_open(t, m.session, m.ino, m.access.write)?;
            let extents = t.extents_overlapping(m.ino, 0, u64::MAX)?;
            let policy = effective_policy(t, m.ino)?.policy;
            Ok(Opened { attr: i.attr, extents, caps: ChunkCaps::default(), policy, parent: None, created: false })
        }),
        R::Release(m) => serve(m, |m| release(t, m.session, m.ino)),
        R::SetLock(m) => serve(m, |m| {
            reach(t, &ctx.caller, m.lock.ino)?;
            set_lock(t, m.session, &m.lock)
        }),
        R::ReleaseLocks(m) => serve(m, |m| release_locks(t, m.session, m.ino, m.owner)),
        R::CommitWrite(m) => serve(m, |m| {
            prefetch_data_write(t, m.session, m.ino, span(&m.extents))?;
            let i = inode(t, m.ino)?;
            check_data_write(t, &ctx.caller, m.session, &i)?;
            commit_write(t, ctx, m.ino, &m.extents, &m.chunks, m.min_size, m.mtime)
        }),
        R::Fallocate(m) => serve(m, |m| {
            prefetch_data_write(t, m.session, m.ino, Some((m.offset, m.offset.saturating_add(m.len))))?;
            let i = inode(t, m.ino)?;
            check_data_write(t, &ctx.caller, m.session, &i)?;
            fallocate(t, ctx, m.ino, m.offset, m.len, m.mode)
        }),
        R::Compact(m) => serve(m, |m| {
            prefetch_data_write(t, m.session, m.ino, span(&m.extents))?;
            let i = inode(t, m.ino)?;
            check_data_write(t, &ctx.caller, m.session, &i)?;
            compact(t, m.ino, m.data_version, &m.extents, &m.chunks)
        }),
        R::SyncAll(m) => serve(m, |_| t.next_id(Counter::Sync).map(drop)),
        R::RegisterNode(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "registering a node")?;
            register_node(t, ctx, &m.node, m.cluster_id.as_deref())?;
            Ok(Registered { cluster_id: ctx.cluster_id.to_string(), cap_key: None, epoch: ctx.epoch })
        }),
        R::UpdateLocations(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "reporting chunk locations")?;
            // A node not (or no longer) admitted records no copies: `remove` took its locations.
            if t.get_admission(&m.node)? != Some(true) {
                return Err(MetaError::NotAdmitted(m.node));
            }
            update_locations(t, &m, false)
        }),
        R::SetPolicy(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "setting a replication policy")?;
            set_policy(t, m.ino, m.policy)
        }),
        R::DrainNode(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "draining a node")?;
            drain(t, &m.node, m.drained)
        }),
        R::AdmitNode(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "admitting a node")?;
            admit(t, &m.node)
        }),
        R::RemoveNode(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "removing a node")?;
            remove(t, &m.node)
        }),
        R::MakeJoinToken(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "making a join token")?;
            make_join_token(t, ctx, m.ttl_secs)
        }),
        R::JoinNode(m) => serve(m, |m| join(t, ctx, &m.node, &m.token)),
        R::ForgetChunks(m) => serve(m, |m| {
            check_privileged(&ctx.caller, "forgetting chunks")?;
            for id in &m.ids {
                forget_chunk(t, id)?;
            }
            Ok(())
        }),
        other => Err(MetaError::Internal(format!("{other:?} is not a write request"))),
    }
}

/// Opening a file checks read or write permission as `access` says, and write
/// permission for a truncation.
fn check_open(t: &mut dyn Txn, c: &Caller, i: &Inode, access: OpenAccess, truncate: bool) -> Result<(), MetaError> {
    let want = if access.read { MAY_READ } else { 0 } | if access.write || truncate { MAY_WRITE } else { 0 };
    check(t, c, i, want)
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
    MetaError::SessionUnknown(session)
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

/// The inode `ino`, if the caller could reach it by a path walk (`perm::check_reach`):
/// every request that names an inode by number starts here.
fn reach(t: &mut dyn Txn, c: &Caller, ino: InodeId) -> Result<Inode, MetaError> {
    let i = inode(t, ino)?;
    perm::check_reach(t, c, &i)?;
    Ok(i)
}

/// The directory `ino`, if the caller could reach it (`reach`).
fn reach_dir(t: &mut dyn Txn, c: &Caller, ino: InodeId) -> Result<Inode, MetaError> {
    let i = dir(t, ino)?;
    perm::check_reach(t, c, &i)?;
    Ok(i)
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

/// Records a node's report of the copies it gained and lost. `known_only`: only of
/// chunks this engine's catalogue already holds (a metadata home besides the root's,
/// which keeps the rows of the chunks its own files use; the root's takes the rest).
pub(crate) fn update_locations(t: &mut dyn Txn, m: &UpdateLocations, known_only: bool) -> Result<(), MetaError> {
    for chunk in &m.added {
        if known_only && t.get_chunk(&chunk.id)?.is_none() {
            continue;
        }
        // No nodes named: the reporting node's own copy in its site cache, which no
        // policy counts; named nodes hold replicas.
        if chunk.nodes.is_empty() {
            t.add_cached(&chunk.id, chunk.size, &m.node)?;
        } else {
            t.upsert_chunk(chunk)?;
        }
    }
    for id in &m.removed {
        t.remove_location(id, &m.node)?;
    }
    Ok(())
}
