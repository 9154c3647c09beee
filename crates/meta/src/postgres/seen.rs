//! The row cache of a transaction: rows as the open transaction sees them (`Seen`,
//! `KnownExtents`), and rows taken from what this meta keeps across transactions, each
//! guarded by a statement that fails the commit if the row changed meanwhile.

use crate::error::MetaError;
use crate::store::values::off;
use crate::store::{Inode, OpenRow, SessionRow};
use postgres::Row;
use proto::policy::Policy;
use proto::types::{ChunkId, ChunkRecord, Extent, FileKind, InodeId, SessionId};
use std::collections::{HashMap, HashSet};

use super::codec::{DATA_WRITE_GUARD_SQL, ENTRY_GUARD_SQL, inode_of, inode_params};
use super::conn::{Owned, PgConn};

/// Rows as the open transaction sees them, so that an op reading a row twice (a
/// directory checked, then stamped; a new inode read back) asks the server once. A
/// snapshot (REPEATABLE READ or SERIALIZABLE) shows a transaction the same rows until
/// it writes them itself, and its writes go through here too; everything is
/// forgotten at every transaction or savepoint boundary.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) inodes: HashMap<InodeId, Option<Inode>>,
    pub(super) dentries: HashMap<(InodeId, Vec<u8>), Option<InodeId>>,
    pub(super) policies: HashMap<InodeId, Option<Policy>>,
    /// Opens of an inode across all sessions.
    pub(super) open_counts: HashMap<InodeId, u64>,
    /// One session's opens of an inode.
    pub(super) opens: HashMap<(SessionId, InodeId), OpenRow>,
    pub(super) sessions: HashMap<SessionId, Option<SessionRow>>,
    /// Extents of an inode, known for a span of it (see `KnownExtents`).
    pub(super) extents: HashMap<InodeId, KnownExtents>,
    /// No directory has a policy (read so along with an entry or an open): every
    /// policy lookup answers none without asking.
    pub(super) no_policies: bool,
    /// Inodes known to have no extended attributes (read so with their entry, or new):
    /// deleting them all is then nothing to send.
    pub(super) no_xattrs: HashSet<InodeId>,
    /// Inodes known to have no extents: read so with their entry, or numbered in this
    /// transaction from this meta's own block of ids, so no other row can name them
    /// yet (such an inode also starts with no opens and no policy in the maps above).
    pub(super) no_extents: HashSet<InodeId>,
}

/// Every extent of an inode that intersects `[start, end)`, as the open transaction
/// sees them: kept so as the transaction inserts and deletes extents, so that a write
/// of several extents over one span reads them once.
pub(super) struct KnownExtents {
    pub(super) start: u64,
    pub(super) end: u64,
    /// In offset order.
    pub(super) extents: Vec<Extent>,
}

impl KnownExtents {
    /// The known extents that intersect `[start, end)`, if the span is known.
    pub(super) fn within(&self, start: u64, end: u64) -> Option<Vec<Extent>> {
        (self.start <= start && end <= self.end).then(|| {
            let intersects = |e: &&Extent| e.file_offset < end && e.end() > start;
            self.extents.iter().filter(intersects).cloned().collect()
        })
    }
}

impl PgConn {
    /// Records what a row read for entry (`parent`, `name`) holds from column `at`
    /// on: the entry's inode number (NULL: no such entry), the inode's columns, its
    /// open count and whether it has extents, xattrs and a policy; answers the inode
    /// number.
    pub(super) fn entry_seen(
        &mut self,
        parent: InodeId,
        name: &[u8],
        row: Option<&Row>,
        at: usize,
    ) -> Result<Option<InodeId>, MetaError> {
        let ino = match row {
            Some(row) => row.try_get::<_, Option<i64>>(at)?.map(|v| v as u64),
            None => None,
        };
        self.seen.dentries.insert((parent, name.to_vec()), ino);
        if let (Some(row), Some(ino)) = (row, ino) {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.seen.inodes.entry(ino) {
                let inode = match row.try_get::<_, Option<i64>>(at + 1)? {
                    Some(_) => Some(inode_of(row, at + 1)?),
                    None => None,
                };
                slot.insert(inode);
            }
            // NULL: the statement did not ask (`ENTRY_READ_SQL`).
            if let Some(opens) = row.try_get::<_, Option<i64>>(at + 18)? {
                self.seen.open_counts.entry(ino).or_insert(opens as u64);
            }
            let absent = |i: usize| row.try_get::<_, Option<bool>>(at + i).map(|v| v == Some(false));
            if absent(19)? {
                self.seen.no_extents.insert(ino);
            }
            if absent(20)? {
                self.seen.no_xattrs.insert(ino);
            }
            if absent(21)? {
                self.seen.policies.entry(ino).or_insert(None);
            }
        }
        Ok(ino)
    }

    /// A write transaction's look-up of entry (`parent`, `name`), taken from the rows
    /// its meta keeps instead of the server when they hold the directory, the entry
    /// and its inode, an empty non-directory that this transaction has not written:
    /// what an unlink of a file just created, listed or looked up needs. It is assumed
    /// not open and without extents, xattrs or policy, and `ENTRY_GUARD_SQL`, queued
    /// ahead of the transaction's writes, checks all of it at the server. So the write
    /// needs no round trip before its commit; if the guard fails, the transaction runs
    /// again reading from the server (`pipeline_all`).
    pub(super) fn assume_entry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        let Some(kept) = self.publish.clone().filter(|_| self.trust_kept) else { return Ok(()) };
        let key = (parent, name.to_vec());
        if self.seen.dentries.contains_key(&key) || self.written.entries.contains_key(&key) {
            return Ok(());
        }
        let Some((dir, file)) =
            self.kept_untouched(parent).zip(kept.entry(parent, name).and_then(|ino| self.kept_untouched(ino)))
        else {
            return Ok(());
        };
        let ino = file.attr.ino;
        if dir.attr.kind != FileKind::Dir || file.attr.kind == FileKind::Dir || file.attr.size != 0 {
            return Ok(());
        }
        let mut params = inode_params(&dir);
        params.extend(inode_params(&file));
        params.push(Box::new(name.to_vec()));
        self.defer(ENTRY_GUARD_SQL, params)?;
        self.assume_inode(dir);
        self.assume_inode(file);
        self.assumed.entries.insert(key.clone(), None);
        self.seen.dentries.insert(key, Some(ino));
        self.seen.open_counts.insert(ino, 0);
        self.seen.no_extents.insert(ino);
        self.seen.no_xattrs.insert(ino);
        self.seen.policies.insert(ino, None);
        Ok(())
    }

    /// Inode `ino` as the writer's meta keeps it, if write transactions may take rows
    /// from there (`trust_kept`) and this one has neither read nor written it.
    pub(super) fn kept_untouched(&self, ino: InodeId) -> Option<Inode> {
        let kept = self.publish.as_ref().filter(|_| self.trust_kept)?;
        if self.seen.inodes.contains_key(&ino) || self.written.inodes.contains_key(&ino) {
            return None;
        }
        kept.inode(ino)
    }

    /// Takes `inode` from the kept rows as this transaction's view of it (a guard
    /// queued ahead checks it at the server); dropped from them if the guard fails.
    pub(super) fn assume_inode(&mut self, inode: Inode) {
        self.assumed.inodes.insert(inode.attr.ino, None);
        self.seen.inodes.insert(inode.attr.ino, Some(inode));
    }

    /// A write of data (`Prefetch::writing`) over `[start, end)` of inode `ino` through
    /// `session`'s open, taken from the kept rows instead of the server when they hold
    /// the inode, a file no longer than `start` (an append, or the first write of a new
    /// file): the session is assumed to have it open once, for writing, and no extent to
    /// intersect the span, and `DATA_WRITE_GUARD_SQL` checks that and the inode at the
    /// server, as `assume_entry`'s guard does.
    pub(super) fn assume_data_write(
        &mut self,
        session: SessionId,
        ino: InodeId,
        start: u64,
        end: u64,
    ) -> Result<(), MetaError> {
        if self.seen.opens.contains_key(&(session, ino)) || self.seen.extents.contains_key(&ino) {
            return Ok(());
        }
        let Some(file) = self.kept_untouched(ino) else { return Ok(()) };
        if file.attr.kind != FileKind::File || file.attr.size > start {
            return Ok(());
        }
        let mut params = inode_params(&file);
        params.extend::<[Owned; 3]>([Box::new(session as i64), Box::new(off(start)), Box::new(off(end))]);
        self.defer(DATA_WRITE_GUARD_SQL, params)?;
        self.assume_inode(file);
        self.seen.opens.insert((session, ino), OpenRow { count: 1, writable: true });
        self.seen.extents.insert(ino, KnownExtents { start, end, extents: Vec::new() });
        Ok(())
    }

    /// Records whether any policy exists, as column `at` of `row` says (NULL: not asked).
    pub(super) fn policies_exist_seen(&mut self, row: &Row, at: usize) -> Result<(), MetaError> {
        if row.try_get::<_, Option<bool>>(at)? == Some(false) {
            self.seen.no_policies = true;
        }
        Ok(())
    }

    pub(super) fn chunk_record(&mut self, id: &ChunkId, size: i64, refcount: i64) -> Result<ChunkRecord, MetaError> {
        let rows = self.query("SELECT node, cached FROM chunk_nodes WHERE chunk = $1 ORDER BY node", &[&&id.0[..]])?;
        let (mut nodes, mut cached) = (Vec::with_capacity(rows.len()), Vec::new());
        for row in &rows {
            let node: String = row.try_get(0)?;
            if row.try_get::<_, i64>(1)? != 0 {
                cached.push(node.clone());
            }
            nodes.push(node);
        }
        Ok(ChunkRecord { id: *id, size: size as u64, refcount: refcount.max(0) as u64, nodes, cached })
    }
}

impl PgConn {
    /// The inode is known to have no extended attributes, in this transaction or in
    /// the rows its meta keeps.
    pub(super) fn bare(&self, ino: InodeId) -> bool {
        self.seen.no_xattrs.contains(&ino) || self.cache.as_ref().is_some_and(|c| c.bare(ino))
    }

    /// Keeps the inodes and entries a read found in its meta's memory (read
    /// connections only; see `SharedRows::keep` for `began`).
    pub(super) fn keep_seen(&self, began: Option<u64>) {
        if let (Some(cache), Some(began)) = (&self.cache, began) {
            cache.keep(
                began,
                self.seen.inodes.iter().filter_map(|(ino, row)| Some((ino, row.as_ref()?))),
                self.seen.dentries.iter().filter_map(|(key, ino)| Some((key, (*ino)?))),
                self.seen.no_xattrs.iter().copied(),
            );
        }
    }
}
