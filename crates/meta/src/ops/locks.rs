//! fcntl byte-range locks and open-file records as rows of the store, so that both
//! survive a restart of meta and every meta over one database sees the same ones.

use super::*;
use crate::locks::{apply, conflict};
use crate::store::OpenRow;
use proto::meta::{LockKind, LockRange};

fn valid(req: &LockRange) -> Result<(), MetaError> {
    if req.start > req.end {
        return Err(MetaError::InvalidArgument(format!("lock range {}..={} is empty", req.start, req.end)));
    }
    Ok(())
}

/// F_GETLK: the first lock conflicting with `req`.
pub(super) fn get_lock(t: &mut dyn Txn, session: SessionId, req: &LockRange) -> Result<Option<LockRange>, MetaError> {
    valid(req)?;
    let held = t.locks_on(req.ino)?;
    Ok(conflict(&held, session, req).map(|h| h.as_range(req.ino)))
}

/// F_SETLK: takes, converts or releases a range; a conflict is `WouldBlock` naming the holder.
pub(super) fn set_lock(t: &mut dyn Txn, session: SessionId, req: &LockRange) -> Result<(), MetaError> {
    valid(req)?;
    let mut held = t.locks_on(req.ino)?;
    if let Some(h) = conflict(&held, session, req) {
        let kind = if h.write { "write" } else { "read" };
        return Err(MetaError::WouldBlock(format!(
            "inode {} bytes {}..={} hold a {kind} lock of pid {}",
            req.ino, h.start, h.end, h.pid
        )));
    }
    if req.kind == LockKind::Unlock && held.is_empty() {
        return Ok(());
    }
    apply(&mut held, session, req);
    t.put_locks(req.ino, &held)
}

/// Drops every lock `owner` of `session` holds on `ino` (close(2)).
pub(super) fn release_locks(t: &mut dyn Txn, session: SessionId, ino: InodeId, owner: u64) -> Result<(), MetaError> {
    let mut held = t.locks_on(ino)?;
    let before = held.len();
    held.retain(|h| !(h.session == session && h.owner == owner));
    if held.len() != before {
        t.put_locks(ino, &held)?;
    }
    Ok(())
}

/// Records one more open of `ino` by `session`; `write` when opened for writing.
pub(super) fn add_open(t: &mut dyn Txn, session: SessionId, ino: InodeId, write: bool) -> Result<(), MetaError> {
    let o = t.get_open(session, ino)?;
    t.put_open(session, ino, OpenRow { count: o.count.saturating_add(1), writable: o.writable || write })
}

/// Whether `session` has `ino` open for writing.
pub(crate) fn open_for_writing(t: &mut dyn Txn, session: SessionId, ino: InodeId) -> Result<bool, MetaError> {
    let o = t.get_open(session, ino)?;
    Ok(o.count > 0 && o.writable)
}

/// Drops one open of `ino` by `session` (if it had one) and reclaims the inode if it
/// was an orphan nobody has open any more.
pub(super) fn release(t: &mut dyn Txn, session: SessionId, ino: InodeId) -> Result<(), MetaError> {
    t.drop_open(session, ino)?;
    reclaim_if_unused(t, ino)?;
    Ok(())
}
