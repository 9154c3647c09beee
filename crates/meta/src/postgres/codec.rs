//! Rows to values and back: the inode, extent, node and session columns as the
//! statements name them, and the statement texts that read several tables in one go
//! (an entry with its directory, inode and session; the guards a write taken from kept
//! rows sends ahead of itself).

use crate::error::MetaError;
use crate::store::values::{chunk_id, kind_code, kind_of};
use crate::store::{Inode, SessionRow, split_mode_column};
use postgres::Row;
use proto::meta::SessionInfo;
use proto::types::{Attr, Extent, InodeId, NodeInfo, Timestamp};

use super::conn::Owned;

/// The parameters that store `inode` in `inode_cols` order (as `inode_of` reads them).
pub(super) fn inode_params(inode: &Inode) -> Vec<Owned> {
    let a = &inode.attr;
    vec![
        Box::new(a.ino as i64),
        Box::new(kind_code(a.kind)),
        Box::new(inode.mode_column()),
        Box::new(a.uid as i64),
        Box::new(a.gid as i64),
        Box::new(a.size as i64),
        Box::new(a.nlink as i64),
        Box::new(a.rdev as i64),
        Box::new(a.atime.secs),
        Box::new(a.atime.nanos as i64),
        Box::new(a.mtime.secs),
        Box::new(a.mtime.nanos as i64),
        Box::new(a.ctime.secs),
        Box::new(a.ctime.nanos as i64),
        Box::new(a.data_version as i64),
        Box::new(inode.parent as i64),
        Box::new(inode.target.clone()),
    ]
}

/// The inode in `r`'s columns from `at` on (in `inode_cols` order).
pub(super) fn inode_of(r: &Row, at: usize) -> Result<Inode, MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(at + i);
    let ts =
        |s: usize| -> Result<Timestamp, postgres::Error> { Ok(Timestamp { secs: int(s)?, nanos: int(s + 1)? as u32 }) };
    let ino = int(0)? as u64;
    let kind = int(1)?;
    let (mode, acls) = split_mode_column(int(2)?);
    Ok(Inode {
        attr: Attr {
            ino,
            kind: kind_of(kind).ok_or_else(|| MetaError::Corrupt(format!("inode {ino} has kind {kind}")))?,
            mode,
            uid: int(3)? as u32,
            gid: int(4)? as u32,
            size: int(5)? as u64,
            nlink: int(6)? as u32,
            rdev: int(7)? as u32,
            atime: ts(8)?,
            mtime: ts(10)?,
            ctime: ts(12)?,
            data_version: int(14)? as u64,
        },
        parent: int(15)? as u64,
        target: r.try_get(at + 16)?,
        acls,
    })
}

pub(super) fn extent_of(r: &Row) -> Result<(InodeId, Extent), MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v as u64);
    Ok((int(0)?, Extent { file_offset: int(1)?, len: int(2)?, chunk: chunk_id(r.try_get(3)?)?, chunk_offset: int(4)? }))
}

pub(super) fn node_of(r: &Row) -> Result<(NodeInfo, i64), MetaError> {
    let int = |i: usize| r.try_get::<_, i64>(i).map(|v| v as u64);
    Ok((
        NodeInfo {
            id: r.try_get(0)?,
            store_id: r.try_get(1)?,
            site: r.try_get(2)?,
            addr: r.try_get(3)?,
            capacity_bytes: int(4)?,
            used_bytes: int(5)?,
            chunk_count: int(6)?,
            last_seen_secs: 0,
            site_rtts: Vec::new(),
            cache_bytes: int(7)?,
            drained: false,
        },
        r.try_get(8)?,
    ))
}

/// The single row of `sql`'s answer, if any.
pub(super) fn at_most_one(mut rows: Vec<Row>, sql: &str) -> Result<Option<Row>, MetaError> {
    if rows.len() > 1 {
        return Err(MetaError::Corrupt(format!("{} rows where at most one was expected: {sql}", rows.len())));
    }
    Ok(rows.pop())
}

/// For a write (`Prefetch::entry`): the inode's open count, whether it has extents,
/// xattrs and a policy, and whether any policy exists at all.
pub(super) const ENTRY_SQL: &str = entry_sql!(
    "(SELECT COALESCE(SUM(o.count), 0)::BIGINT FROM opens o WHERE o.ino = d.ino), \
     EXISTS (SELECT 1 FROM extents e WHERE e.ino = d.ino), EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino), \
     EXISTS (SELECT 1 FROM policies y WHERE y.ino = d.ino), EXISTS (SELECT 1 FROM policies)"
);
/// For a point read (a lookup): none of those facts (NULL), so no subquery to start.
pub(super) const ENTRY_READ_SQL: &str =
    entry_sql!("NULL::BIGINT, NULL::BOOLEAN, NULL::BOOLEAN, NULL::BOOLEAN, NULL::BOOLEAN");
/// The guard of a write that took directory $1 (columns $1-$17), its entry named $35
/// and that entry's inode ($18-$34) from the kept rows, and assumed what `ENTRY_SQL`
/// would have told: the inode is not open and has no extents, xattrs or policy. Sent
/// ahead of the write's own statements, it fails the transaction unless all of it
/// holds; under SERIALIZABLE what it reads is the transaction's reads, as `ENTRY_SQL`'s
/// would have been.
pub(super) const ENTRY_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    " AND ",
    inode_is!("$18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34"),
    " AND EXISTS (SELECT 1 FROM dentries WHERE parent = $1 AND name = $35 AND ino = $18) \
     AND NOT EXISTS (SELECT 1 FROM opens WHERE ino = $18) AND NOT EXISTS (SELECT 1 FROM extents WHERE ino = $18) \
     AND NOT EXISTS (SELECT 1 FROM xattrs WHERE ino = $18) AND NOT EXISTS (SELECT 1 FROM policies WHERE ino = $18))"
);
/// The guard of a write of data taken from the kept rows (`PgConn::assume_data_write`):
/// inode $1 is the kept row ($1 to $17), session $18 has it open once, for writing, and
/// no extent intersects `[$19, $20)`.
pub(super) const DATA_WRITE_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    " AND EXISTS (SELECT 1 FROM opens WHERE session = $18 AND ino = $1 AND count = 1 AND writable = 1) \
     AND NOT EXISTS (SELECT 1 FROM (SELECT file_offset, len FROM extents WHERE ino = $1 AND file_offset < $19 \
     ORDER BY file_offset DESC LIMIT 1) e WHERE e.file_offset + e.len > $19) \
     AND NOT EXISTS (SELECT 1 FROM extents WHERE ino = $1 AND file_offset >= $19 AND file_offset < $20))"
);
/// The guard of a release that took the inode from the kept rows (`PgConn::drop_open`):
/// inode $1 is the kept row, with links, so the release reclaims nothing.
pub(super) const LINKED_GUARD_SQL: &str = concat!(
    "SELECT pg_temp.locus_expect(",
    inode_is!("$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17"),
    ")"
);
pub(super) const SESSION_SQL: &str =
    "SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions WHERE id = $1";
/// Session $1's opens of inode $2 (count, writable; NULL if none), the inode (from
/// column 2), whether any policy exists (column 19) and the session (from column 20).
pub(super) const OPEN_SQL: &str = "SELECT o.count, o.writable, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, i.rdev, \
     i.atime_s, i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target, \
     EXISTS (SELECT 1 FROM policies), s.id, s.site, s.host, s.pid, s.purpose, s.last_seen, s.owner \
     FROM (SELECT $1::BIGINT AS session, $2::BIGINT AS ino) k \
     LEFT JOIN opens o ON o.session = k.session AND o.ino = k.ino LEFT JOIN inodes i ON i.ino = k.ino \
     LEFT JOIN sessions s ON s.id = k.session";
/// The extents of inode $1 that intersect `[$2, $3)`: extents never overlap, so only
/// the last one starting before $2 can reach into the span, and the ones starting in it.
pub(super) const EXTENTS_SQL: &str = "(SELECT ino, file_offset, len, chunk, chunk_offset FROM extents \
     WHERE ino = $1 AND file_offset < $2 ORDER BY file_offset DESC LIMIT 1) \
     UNION ALL (SELECT ino, file_offset, len, chunk, chunk_offset FROM extents \
     WHERE ino = $1 AND file_offset >= $2 AND file_offset < $3)";
/// Every extent of the inode that entry $2 of directory $1 names, sent with the entry's
/// statement (`Prefetch::entry_extents`): an unlink of a file with data then needs no
/// round trip of its own for them.
pub(super) const ENTRY_EXTENTS_SQL: &str = "SELECT e.ino, e.file_offset, e.len, e.chunk, e.chunk_offset FROM dentries d \
     JOIN extents e ON e.ino = d.ino WHERE d.parent = $1 AND d.name = $2 ORDER BY e.file_offset";
/// Inode $1 and each of its ancestors up to the root ($2): its number, its policy
/// (NULL if none) and, from column 5, its inode.
pub(super) const POLICIES_SQL: &str = "WITH RECURSIVE up (ino, depth) AS (
         SELECT $1::BIGINT, 0
         UNION ALL
         SELECT i.parent, up.depth + 1 FROM up JOIN inodes i ON i.ino = up.ino
         WHERE up.ino <> $2 AND up.depth < 1000)
     SELECT up.ino, p.sites, p.copies, p.mode, p.rpo_secs, i.ino, i.kind, i.mode, i.uid, i.gid, i.size, i.nlink, \
     i.rdev, i.atime_s, i.atime_ns, i.mtime_s, i.mtime_ns, i.ctime_s, i.ctime_ns, i.data_version, i.parent, i.target \
     FROM up LEFT JOIN policies p ON p.ino = up.ino LEFT JOIN inodes i ON i.ino = up.ino";

/// The session in columns `at..at + 7` (`session_cols!`); None if they are NULL.
pub(super) fn session_of(r: &Row, at: usize) -> Result<Option<SessionRow>, MetaError> {
    let Some(id) = r.try_get::<_, Option<i64>>(at)? else { return Ok(None) };
    Ok(Some(SessionRow {
        id: id as u64,
        info: SessionInfo {
            site: r.try_get(at + 1)?,
            host: r.try_get(at + 2)?,
            pid: r.try_get::<_, i64>(at + 3)? as u32,
            purpose: r.try_get(at + 4)?,
        },
        last_seen_ms: r.try_get(at + 5)?,
        owner: r.try_get(at + 6)?,
    }))
}
