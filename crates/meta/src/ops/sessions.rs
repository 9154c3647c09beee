//! Client sessions, and the orphans (unlinked but open inodes) their open records keep.

use super::*;
use proto::meta::Welcome;

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

pub(super) fn hello(t: &mut dyn Txn, ctx: &Ctx, protocol: u32, info: SessionInfo) -> Result<Welcome, MetaError> {
    if protocol != proto::PROTOCOL_VERSION {
        return Err(MetaError::InvalidArgument(format!(
            "client speaks protocol {protocol}, this meta speaks {}; run the same locus version on both",
            proto::PROTOCOL_VERSION
        )));
    }
    let id = t.next_id(Counter::Session)?;
    t.put_session(&SessionRow { id, info, last_seen_ms: ctx.now_ms })?;
    Ok(Welcome { session: id, heartbeat_ms: ctx.heartbeat_ms, cluster_id: ctx.cluster_id.to_string() })
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
