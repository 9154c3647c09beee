//! Client sessions, and the orphans (unlinked but open inodes) their open records keep.

use super::*;
use proto::meta::Welcome;

/// Reclaims an orphan (no links) that no session has open any more.
pub fn reclaim_if_unused(t: &mut dyn Txn, ino: InodeId) -> Result<bool, MetaError> {
    match t.get_inode(ino)? {
        Some(i) if i.attr.nlink == 0 && i.attr.kind != FileKind::Dir && t.count_opens(ino)? == 0 => {
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
    t.put_session(&SessionRow { id, info, last_seen_ms: ctx.now_ms, owner: ctx.certificate.clone() })?;
    Ok(Welcome { session: id, heartbeat_ms: ctx.heartbeat_ms, cluster_id: ctx.cluster_id.to_string() })
}

/// Ends a session: drops its locks, its open records (reclaiming orphans nobody else
/// has open) and its row.
pub fn end_session(t: &mut dyn Txn, session: SessionId) -> Result<(), MetaError> {
    release_session(t, session)?;
    t.delete_session(session)
}

/// Drops a session's locks and open records (reclaiming orphans nobody else has open)
/// in the transaction's home; a session's row lives in home 0 (`end_session`).
pub fn release_session(t: &mut dyn Txn, session: SessionId) -> Result<(), MetaError> {
    t.delete_session_locks(session)?;
    for ino in t.delete_session_opens(session)? {
        reclaim_if_unused(t, ino)?;
    }
    Ok(())
}

/// Ends every session silent since before `cutoff_ms`, returning their ids.
pub fn expire_sessions(t: &mut dyn Txn, cutoff_ms: i64) -> Result<Vec<SessionId>, MetaError> {
    let mut expired = Vec::new();
    for s in t.list_sessions()? {
        if s.last_seen_ms < cutoff_ms {
            end_session(t, s.id)?;
            expired.push(s.id);
        }
    }
    Ok(expired)
}

/// Reclaims orphans that no session has open: the safety net for an orphan whose
/// last opener's records went without reclaiming it.
pub fn reap_orphans(t: &mut dyn Txn) -> Result<usize, MetaError> {
    let mut reaped = 0;
    for ino in t.orphans()? {
        if reclaim_if_unused(t, ino)? {
            reaped += 1;
        }
    }
    Ok(reaped)
}
