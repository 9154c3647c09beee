//! The SQLite backend: one database file in WAL mode with one write connection and a
//! few read connections that read alongside it (the shared `engine` group-commits on
//! the writer and lends the readers to callers). Opening checks the file
//! before anything else: it must be a Locus database (or `init` was asked for), not
//! damaged (`PRAGMA quick_check`), and not in use by another meta (an exclusive lock).

use crate::error::MetaError;
use crate::locks::Held;
use crate::store::values::{PolicyColumns, chunk_id, kind_code, kind_of, off, policy_of, secret_of};
use crate::store::{
    Backend, Counter, DentryRow, Inode, OpenRow, ReadConn, ReadOp, SessionRow, Txn, WriteConn, split_mode_column,
};
use proto::meta::{SessionInfo, StoredChunk};
use proto::policy::Policy;
use proto::types::{Attr, ChunkId, ChunkRecord, Extent, FileKind, InodeId, NodeInfo, SessionId, Timestamp};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, params};
use std::fs::File;
use std::path::{Path, PathBuf};

mod schema;

use schema::init_schema;

/// Read connections; WAL lets them run alongside the writer.
const READERS: usize = 4;

/// The epoch of every SQLite database: one file, one writer, no failover, so it never
/// changes (and equals a new PostgreSQL database's first, so a migrated namespace's
/// nodes keep theirs).
const EPOCH: u64 = 1;

/// Distinct statements the store prepares; the per-connection cache must hold them all
/// or statements are re-parsed on every use.
const STATEMENT_CACHE: usize = 128;

/// One SQLite connection; `Txn` runs on whatever transaction is open on it.
struct SqlConn {
    conn: Connection,
    /// The open write transaction asked for `synchronous=FULL`, to undo at its end.
    durable: bool,
    /// Held by the writer only: the exclusive lock on `<db>.lock`, released on drop
    /// (after the connection, fields drop in order).
    _lock: Option<File>,
}

impl SqlConn {
    fn chunk_record(&self, id: &ChunkId, size: i64, refcount: i64) -> Result<ChunkRecord, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT node, cached FROM chunk_nodes WHERE chunk = ?1 ORDER BY node")?;
        let rows = st
            .query_map([&id.0[..]], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? != 0)))?
            .collect::<Result<Vec<_>, _>>()?;
        let cached = rows.iter().filter(|(_, c)| *c).map(|(n, _)| n.clone()).collect();
        let nodes = rows.into_iter().map(|(n, _)| n).collect();
        Ok(ChunkRecord { id: *id, size: size as u64, refcount: refcount.max(0) as u64, nodes, cached })
    }

    fn run(&self, sql: &str) -> Result<(), MetaError> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    /// Back to `synchronous=NORMAL` after a durable transaction ends.
    fn end_durable(&mut self) {
        if std::mem::take(&mut self.durable)
            && let Err(e) = self.conn.execute_batch("PRAGMA synchronous=NORMAL")
        {
            tracing::warn!(error = %e, "cannot restore synchronous=NORMAL");
        }
    }
}

impl WriteConn for SqlConn {
    fn begin(&mut self, durable: bool) -> Result<(), MetaError> {
        if durable {
            self.durable = true;
            self.conn.execute_batch("PRAGMA synchronous=FULL")?;
        }
        self.run("BEGIN IMMEDIATE")
    }

    fn savepoint(&mut self) -> Result<(), MetaError> {
        self.run("SAVEPOINT op")
    }

    fn rollback_to_savepoint(&mut self) -> Result<(), MetaError> {
        self.run("ROLLBACK TO op")?;
        self.run("RELEASE op")
    }

    fn release_savepoint(&mut self) -> Result<(), MetaError> {
        self.run("RELEASE op")
    }

    fn commit(&mut self) -> Result<(), MetaError> {
        let r = self.run("COMMIT");
        if r.is_ok() {
            self.end_durable();
        }
        r
    }

    fn rollback(&mut self) -> Result<(), MetaError> {
        let r = if self.conn.is_autocommit() { Ok(()) } else { self.run("ROLLBACK") };
        self.end_durable();
        r
    }

    fn txn(&mut self) -> &mut dyn Txn {
        self
    }
}

impl ReadConn for SqlConn {
    fn snapshot(&mut self, op: ReadOp<'_>) -> Result<(), MetaError> {
        self.run("BEGIN DEFERRED")?;
        let r = op(self);
        // A read changes nothing: ending it either way only releases the snapshot.
        let end = self.run(if r.is_ok() { "COMMIT" } else { "ROLLBACK" });
        r.and(end)
    }
}

/// Opens the SQLite database at `path` for the shared engine. Without `init` the file
/// must already hold a Locus database; with it, a missing or empty file is formatted
/// with a new cluster id. An older schema is upgraded in place.
pub fn open(path: &Path, init: bool) -> Result<Backend, MetaError> {
    let shown = path.display().to_string();
    let not_formatted = |reason: &str| MetaError::NotFormatted { path: shown.clone(), reason: reason.into() };
    let exists = path.exists();
    if !exists && !init {
        return Err(not_formatted("does not exist"));
    }
    let lock = take_lock(path)?;
    let flags = if exists { OpenFlags::default() - OpenFlags::SQLITE_OPEN_CREATE } else { OpenFlags::default() };
    let conn = Connection::open_with_flags(path, flags)?;
    check_integrity(&conn, &shown)?;
    let tables: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0))?;
    if tables == 0 && !init {
        return Err(not_formatted("is empty"));
    }
    let mut writer = SqlConn { conn, durable: false, _lock: Some(lock) };
    configure(&writer.conn)?;
    let formatted = init_schema(&mut writer, &shown, tables == 0)?;
    let (cluster_id, secret): (String, Vec<u8>) =
        writer.conn.query_row("SELECT id, secret FROM cluster", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let cluster_secret = secret_of(secret)?;
    let mut readers: Vec<Box<dyn ReadConn>> = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        readers.push(Box::new(SqlConn { conn: open_reader(path)?, durable: false, _lock: None }));
    }
    Ok(Backend {
        formatted,
        cluster_id,
        cluster_secret,
        writer: Box::new(writer),
        readers,
        local_reads: true,
        local_writes: true,
        lease: None,
        epoch: EPOCH,
        positions: None,
        two_phase: None,
    })
}

/// How long opening waits for the lock: a meta that is still shutting down (or a
/// store whose last in-flight write is still returning) lets go within this.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The lock file beside the database (`<db>.lock`), flock'ed for as long as meta runs.
/// A separate file, because closing any descriptor of the database itself would drop
/// SQLite's own POSIX locks on it.
fn take_lock(path: &Path) -> Result<File, MetaError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file =
        File::options().create(true).truncate(false).write(true).open(&lock_path).map_err(|e| MetaError::Io {
            what: format!("cannot open the lock file {}", lock_path.display()),
            source: e,
        })?;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(MetaError::InUse { path: path.display().to_string() });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(MetaError::Io { what: format!("cannot lock {}", lock_path.display()), source: e });
            }
        }
    }
}

/// Refuses a damaged file: `PRAGMA quick_check` must answer exactly "ok".
fn check_integrity(conn: &Connection, path: &str) -> Result<(), MetaError> {
    let damaged = |detail: String| MetaError::Damaged { path: path.into(), detail };
    let rows = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut st| st.query_map([], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>())
        .map_err(|e| damaged(e.to_string()))?;
    if rows != ["ok"] {
        return Err(damaged(rows.into_iter().take(5).collect::<Vec<_>>().join("; ")));
    }
    Ok(())
}

/// A read connection beside the writer (WAL lets it read while the writer commits).
fn open_reader(path: &Path) -> Result<Connection, MetaError> {
    let r = Connection::open(path)?;
    r.execute_batch("PRAGMA busy_timeout=10000; PRAGMA query_only=1; PRAGMA cache_size=-16384;")?;
    r.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    plan_once(&r)?;
    Ok(r)
}

/// Sets up the write connection.
fn configure(conn: &Connection) -> Result<(), MetaError> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    plan_once(conn)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(MetaError::Internal(format!("SQLite refused WAL mode (got {mode})")));
    }
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000; PRAGMA cache_size=-65536;")?;
    Ok(())
}

/// Keeps a cached statement's plan across executions. Otherwise SQLite marks a statement
/// whose plan looked at a bound value (a range in order, such as the extents' `file_offset
/// < ?2 ORDER BY file_offset`; a bound `LIMIT`) to be parsed and planned again whenever a
/// value is bound, which is every execution: extents and listings are read that way, and
/// the planning was 7-9 % of the mount's CPU in a run of creates. Every query here is a
/// primary-key or index walk whose best plan does not depend on the values.
fn plan_once(conn: &Connection) -> Result<(), MetaError> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// The inode columns in `inode_row`'s order; a macro so that the statements can be
/// `concat!`ed at compile time instead of formatted on every call.
macro_rules! inode_cols {
    () => {
        "ino, kind, mode, uid, gid, size, nlink, rdev, atime_s, atime_ns, mtime_s, mtime_ns, \
         ctime_s, ctime_ns, data_version, parent, target"
    };
}

fn inode_row(r: &Row<'_>) -> rusqlite::Result<(Inode, i64)> {
    let ts = |s: usize| -> rusqlite::Result<Timestamp> {
        Ok(Timestamp { secs: r.get(s)?, nanos: r.get::<_, i64>(s + 1)? as u32 })
    };
    let kind: i64 = r.get(1)?;
    let (mode, acls) = split_mode_column(r.get(2)?);
    let inode = Inode {
        attr: Attr {
            ino: r.get::<_, i64>(0)? as u64,
            kind: FileKind::File,
            mode,
            uid: r.get::<_, i64>(3)? as u32,
            gid: r.get::<_, i64>(4)? as u32,
            size: r.get::<_, i64>(5)? as u64,
            nlink: r.get::<_, i64>(6)? as u32,
            rdev: r.get::<_, i64>(7)? as u32,
            atime: ts(8)?,
            mtime: ts(10)?,
            ctime: ts(12)?,
            data_version: r.get::<_, i64>(14)? as u64,
        },
        parent: r.get::<_, i64>(15)? as u64,
        target: r.get(16)?,
        acls,
    };
    Ok((inode, kind))
}

fn extent_row(r: &Row<'_>) -> rusqlite::Result<(i64, i64, i64, Vec<u8>, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn extent_of(row: (i64, i64, i64, Vec<u8>, i64)) -> Result<(InodeId, Extent), MetaError> {
    let (ino, file_offset, len, chunk, chunk_offset) = row;
    Ok((
        ino as u64,
        Extent {
            file_offset: file_offset as u64,
            len: len as u64,
            chunk: chunk_id(chunk)?,
            chunk_offset: chunk_offset as u64,
        },
    ))
}

fn node_row(r: &Row<'_>) -> rusqlite::Result<(NodeInfo, i64)> {
    Ok((
        NodeInfo {
            id: r.get(0)?,
            store_id: r.get(1)?,
            site: r.get(2)?,
            addr: r.get(3)?,
            capacity_bytes: r.get::<_, i64>(4)? as u64,
            used_bytes: r.get::<_, i64>(5)? as u64,
            chunk_count: r.get::<_, i64>(6)? as u64,
            last_seen_secs: 0,
            site_rtts: Vec::new(),
            cache_bytes: r.get::<_, i64>(7)? as u64,
            drained: false,
        },
        r.get(8)?,
    ))
}

fn session_row(r: &Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get::<_, i64>(0)? as u64,
        info: SessionInfo { site: r.get(1)?, host: r.get(2)?, pid: r.get::<_, i64>(3)? as u32, purpose: r.get(4)? },
        last_seen_ms: r.get(5)?,
        owner: r.get(6)?,
    })
}

impl Txn for SqlConn {
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError> {
        let mut st =
            self.conn.prepare_cached("UPDATE counters SET value = value + 1 WHERE name = ?1 RETURNING value")?;
        let v: Option<i64> = st.query_row([counter.name()], |r| r.get(0)).optional()?;
        v.map(|v| v as u64).ok_or_else(|| MetaError::Corrupt(format!("counter {} missing", counter.name())))
    }

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError> {
        let mut st = self.conn.prepare_cached(concat!("SELECT ", inode_cols!(), " FROM inodes WHERE ino = ?1"))?;
        let Some((mut inode, kind)) = st.query_row([ino as i64], inode_row).optional()? else {
            return Ok(None);
        };
        inode.attr.kind = kind_of(kind).ok_or_else(|| MetaError::Corrupt(format!("inode {ino} has kind {kind}")))?;
        Ok(Some(inode))
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let a = &inode.attr;
        let mut st = self.conn.prepare_cached(concat!(
            "INSERT INTO inodes (",
            inode_cols!(),
            ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
             ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, uid = excluded.uid,
             gid = excluded.gid, size = excluded.size, nlink = excluded.nlink, rdev = excluded.rdev,
             atime_s = excluded.atime_s, atime_ns = excluded.atime_ns, mtime_s = excluded.mtime_s,
             mtime_ns = excluded.mtime_ns, ctime_s = excluded.ctime_s, ctime_ns = excluded.ctime_ns,
             data_version = excluded.data_version, parent = excluded.parent, target = excluded.target"
        ))?;
        st.execute(params![
            a.ino as i64,
            kind_code(a.kind),
            inode.mode_column(),
            a.uid as i64,
            a.gid as i64,
            a.size as i64,
            a.nlink as i64,
            a.rdev as i64,
            a.atime.secs,
            a.atime.nanos as i64,
            a.mtime.secs,
            a.mtime.nanos as i64,
            a.ctime.secs,
            a.ctime.nanos as i64,
            a.data_version as i64,
            inode.parent as i64,
            &inode.target,
        ])?;
        Ok(())
    }

    fn delete_inode(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM inodes WHERE ino = ?1")?.execute([ino as i64])?;
        Ok(())
    }

    fn count_inodes(&mut self) -> Result<u64, MetaError> {
        let n: i64 = self.conn.prepare_cached("SELECT COUNT(*) FROM inodes")?.query_row([], |r| r.get(0))?;
        Ok(n as u64)
    }

    fn get_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<Option<InodeId>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT ino FROM dentries WHERE parent = ?1 AND name = ?2")?;
        Ok(st.query_row(params![parent as i64, name], |r| r.get::<_, i64>(0)).optional()?.map(|v| v as u64))
    }

    fn parents_of(&mut self, ino: InodeId) -> Result<Vec<InodeId>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT DISTINCT parent FROM dentries WHERE ino = ?1")?;
        let rows = st.query_map([ino as i64], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|p| p as u64)).collect::<Result<_, _>>()?)
    }

    fn put_dentry(&mut self, parent: InodeId, name: &[u8], ino: InodeId, cookie: u64) -> Result<(), MetaError> {
        let mut st =
            self.conn.prepare_cached("INSERT INTO dentries (parent, name, ino, cookie) VALUES (?1, ?2, ?3, ?4)")?;
        st.execute(params![parent as i64, name, ino as i64, cookie as i64])?;
        Ok(())
    }

    fn delete_dentry(&mut self, parent: InodeId, name: &[u8]) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?;
        st.execute(params![parent as i64, name])?;
        Ok(())
    }

    fn list_dentries(&mut self, parent: InodeId, after: u64, limit: u32) -> Result<Vec<DentryRow>, MetaError> {
        let mut st = self.conn.prepare_cached(
            "SELECT name, ino, cookie, EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.ino) FROM dentries d
             WHERE parent = ?1 AND cookie > ?2 ORDER BY cookie LIMIT ?3",
        )?;
        let rows = st.query_map(params![parent as i64, off(after), limit as i64], |r| {
            Ok(DentryRow {
                name: r.get(0)?,
                ino: r.get::<_, i64>(1)? as u64,
                cookie: r.get::<_, i64>(2)? as u64,
                has_xattrs: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn extents_overlapping(&mut self, ino: InodeId, start: u64, end: u64) -> Result<Vec<Extent>, MetaError> {
        let mut out = Vec::new();
        if start >= end {
            return Ok(out);
        }
        // Extents never overlap, so only the last one starting before `start` can reach into the range.
        let mut before = self.conn.prepare_cached(
            "SELECT ino, file_offset, len, chunk, chunk_offset FROM extents
             WHERE ino = ?1 AND file_offset < ?2 ORDER BY file_offset DESC LIMIT 1",
        )?;
        if let Some(row) = before.query_row(params![ino as i64, off(start)], extent_row).optional()? {
            let (_, e) = extent_of(row)?;
            if e.end() > start {
                out.push(e);
            }
        }
        let mut inside = self.conn.prepare_cached(
            "SELECT ino, file_offset, len, chunk, chunk_offset FROM extents
             WHERE ino = ?1 AND file_offset >= ?2 AND file_offset < ?3 ORDER BY file_offset",
        )?;
        for row in inside.query_map(params![ino as i64, off(start), off(end)], extent_row)? {
            out.push(extent_of(row?)?.1);
        }
        Ok(out)
    }

    fn insert_extent(&mut self, ino: InodeId, e: &Extent) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO extents (ino, file_offset, len, chunk, chunk_offset) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        st.execute(params![ino as i64, off(e.file_offset), e.len as i64, &e.chunk.0[..], e.chunk_offset as i64])?;
        Ok(())
    }

    fn delete_extent(&mut self, ino: InodeId, file_offset: u64) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached("DELETE FROM extents WHERE ino = ?1 AND file_offset = ?2")?;
        st.execute(params![ino as i64, off(file_offset)])?;
        Ok(())
    }

    fn list_extents(&mut self, after: Option<(InodeId, u64)>, limit: u32) -> Result<Vec<(InodeId, Extent)>, MetaError> {
        let (ino, offset) = match after {
            Some((ino, o)) => (ino as i64, off(o)),
            None => (i64::MIN, i64::MIN),
        };
        let mut st = self.conn.prepare_cached(
            "SELECT ino, file_offset, len, chunk, chunk_offset FROM extents
             WHERE ino > ?1 OR (ino = ?1 AND file_offset > ?2) ORDER BY ino, file_offset LIMIT ?3",
        )?;
        let rows = st.query_map(params![ino, offset, limit as i64], extent_row)?;
        let mut out = Vec::new();
        for row in rows {
            out.push(extent_of(row?)?);
        }
        Ok(out)
    }

    fn upsert_chunk(&mut self, chunk: &StoredChunk) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO chunks (id, size, refcount) VALUES (?1, ?2, 0)
             ON CONFLICT (id) DO UPDATE SET size = excluded.size",
        )?;
        st.execute(params![&chunk.id.0[..], chunk.size as i64])?;
        let mut st = self.conn.prepare_cached(
            "INSERT INTO chunk_nodes (chunk, node, cached) VALUES (?1, ?2, 0)
             ON CONFLICT (chunk, node) DO UPDATE SET cached = 0",
        )?;
        for node in &chunk.nodes {
            st.execute(params![&chunk.id.0[..], node])?;
        }
        Ok(())
    }

    fn add_cached(&mut self, id: &ChunkId, size: u64, node: &str) -> Result<(), MetaError> {
        self.conn
            .prepare_cached("INSERT INTO chunks (id, size, refcount) VALUES (?1, ?2, 0) ON CONFLICT (id) DO NOTHING")?
            .execute(params![&id.0[..], size as i64])?;
        self.conn
            .prepare_cached(
                "INSERT INTO chunk_nodes (chunk, node, cached) VALUES (?1, ?2, 1) ON CONFLICT (chunk, node) DO NOTHING",
            )?
            .execute(params![&id.0[..], node])?;
        Ok(())
    }

    fn adjust_refcount(&mut self, id: &ChunkId, delta: i64) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO chunks (id, size, refcount) VALUES (?1, 0, ?2)
             ON CONFLICT (id) DO UPDATE SET refcount = chunks.refcount + excluded.refcount",
        )?;
        st.execute(params![&id.0[..], delta])?;
        Ok(())
    }

    fn get_chunk(&mut self, id: &ChunkId) -> Result<Option<ChunkRecord>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT size, refcount FROM chunks WHERE id = ?1")?;
        let Some((size, refcount)) =
            st.query_row([&id.0[..]], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))).optional()?
        else {
            return Ok(None);
        };
        Ok(Some(self.chunk_record(id, size, refcount)?))
    }

    fn list_chunks(&mut self, after: Option<&ChunkId>, limit: u32) -> Result<Vec<ChunkRecord>, MetaError> {
        let rows: Vec<(Vec<u8>, i64, i64)> = {
            let mut st =
                self.conn.prepare_cached("SELECT id, size, refcount FROM chunks WHERE id > ?1 ORDER BY id LIMIT ?2")?;
            let after: &[u8] = after.map(|a| &a.0[..]).unwrap_or(&[]);
            st.query_map(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (id, size, refcount) in rows {
            out.push(self.chunk_record(&chunk_id(id)?, size, refcount)?);
        }
        Ok(out)
    }

    fn remove_location(&mut self, id: &ChunkId, node: &str) -> Result<(), MetaError> {
        self.conn
            .prepare_cached("DELETE FROM chunk_nodes WHERE chunk = ?1 AND node = ?2 AND cached = 1")?
            .execute(params![&id.0[..], node])?;
        Ok(())
    }

    fn site_rtts(&mut self) -> Result<Vec<(String, String, u64)>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT from_site, to_site, micros FROM site_rtts ORDER BY 1, 2")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? as u64)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_chunk(&mut self, id: &ChunkId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM chunk_nodes WHERE chunk = ?1")?.execute([&id.0[..]])?;
        self.conn.prepare_cached("DELETE FROM chunks WHERE id = ?1")?.execute([&id.0[..]])?;
        Ok(())
    }

    fn chunk_totals(&mut self) -> Result<(u64, u64), MetaError> {
        let mut st = self.conn.prepare_cached("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM chunks")?;
        let (n, bytes): (i64, i64) = st.query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok((n as u64, bytes as u64))
    }

    fn get_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?;
        Ok(st.query_row(params![ino as i64, name], |r| r.get(0)).optional()?)
    }

    fn set_xattr(&mut self, ino: InodeId, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
        )?;
        st.execute(params![ino as i64, name, value])?;
        Ok(())
    }

    fn list_xattrs(&mut self, ino: InodeId) -> Result<Vec<Vec<u8>>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
        Ok(st.query_map([ino as i64], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_xattr(&mut self, ino: InodeId, name: &[u8]) -> Result<bool, MetaError> {
        let mut st = self.conn.prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?;
        Ok(st.execute(params![ino as i64, name])? > 0)
    }

    fn delete_all_xattrs(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?.execute([ino as i64])?;
        Ok(())
    }

    fn orphans(&mut self) -> Result<Vec<InodeId>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT ino FROM inodes WHERE nlink = 0 AND kind <> ?1")?;
        let rows = st.query_map([kind_code(FileKind::Dir)], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_session(&mut self, s: &SessionRow) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO sessions (id, site, host, pid, purpose, last_seen, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (id) DO UPDATE SET site = excluded.site, host = excluded.host, pid = excluded.pid,
             purpose = excluded.purpose, last_seen = excluded.last_seen, owner = excluded.owner",
        )?;
        st.execute(params![
            s.id as i64,
            s.info.site,
            s.info.host,
            s.info.pid as i64,
            s.info.purpose,
            s.last_seen_ms,
            s.owner
        ])?;
        Ok(())
    }

    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions WHERE id = ?1")?;
        Ok(st.query_row([id as i64], session_row).optional()?)
    }

    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, site, host, pid, purpose, last_seen, owner FROM sessions ORDER BY id")?;
        Ok(st.query_map([], session_row)?.collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute([id as i64])?;
        Ok(())
    }

    fn locks_on(&mut self, ino: InodeId) -> Result<Vec<Held>, MetaError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT session, owner, range_start, range_end, is_write, pid FROM locks WHERE ino = ?1")?;
        let rows = st.query_map([ino as i64], |r| {
            Ok(Held {
                session: r.get::<_, i64>(0)? as u64,
                owner: r.get::<_, i64>(1)? as u64,
                start: r.get::<_, i64>(2)? as u64,
                end: r.get::<_, i64>(3)? as u64,
                write: r.get::<_, i64>(4)? != 0,
                pid: r.get::<_, i64>(5)? as u32,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn put_locks(&mut self, ino: InodeId, held: &[Held]) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM locks WHERE ino = ?1")?.execute([ino as i64])?;
        let mut st = self.conn.prepare_cached(
            "INSERT INTO locks (ino, session, owner, range_start, range_end, is_write, pid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        for h in held {
            // u64 values (an owner, an end of u64::MAX) are kept bit for bit in the i64 column.
            st.execute(params![
                ino as i64,
                h.session as i64,
                h.owner as i64,
                h.start as i64,
                h.end as i64,
                i64::from(h.write),
                i64::from(h.pid)
            ])?;
        }
        Ok(())
    }

    fn delete_session_locks(&mut self, session: SessionId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM locks WHERE session = ?1")?.execute([session as i64])?;
        Ok(())
    }

    fn get_open(&mut self, session: SessionId, ino: InodeId) -> Result<OpenRow, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT count, writable FROM opens WHERE session = ?1 AND ino = ?2")?;
        let row: Option<(i64, i64)> =
            st.query_row(params![session as i64, ino as i64], |r| Ok((r.get(0)?, r.get(1)?))).optional()?;
        Ok(row.map_or_else(OpenRow::default, |(count, w)| OpenRow { count: count as u32, writable: w != 0 }))
    }

    fn put_open(&mut self, session: SessionId, ino: InodeId, open: OpenRow) -> Result<(), MetaError> {
        if open.count == 0 {
            let mut st = self.conn.prepare_cached("DELETE FROM opens WHERE session = ?1 AND ino = ?2")?;
            st.execute(params![session as i64, ino as i64])?;
        } else {
            let mut st = self.conn.prepare_cached(
                "INSERT INTO opens (session, ino, count, writable) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (session, ino) DO UPDATE SET count = excluded.count, writable = excluded.writable",
            )?;
            st.execute(params![session as i64, ino as i64, i64::from(open.count), i64::from(open.writable)])?;
        }
        Ok(())
    }

    fn count_opens(&mut self, ino: InodeId) -> Result<u64, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT COALESCE(SUM(count), 0) FROM opens WHERE ino = ?1")?;
        Ok(st.query_row([ino as i64], |r| r.get::<_, i64>(0))? as u64)
    }

    fn delete_session_opens(&mut self, session: SessionId) -> Result<Vec<InodeId>, MetaError> {
        let mut st = self.conn.prepare_cached("DELETE FROM opens WHERE session = ?1 RETURNING ino")?;
        let rows = st.query_map([session as i64], |r| r.get::<_, i64>(0))?;
        Ok(rows.map(|r| r.map(|v| v as u64)).collect::<Result<Vec<_>, _>>()?)
    }

    fn put_node(&mut self, n: &NodeInfo, last_seen_ms: i64) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO nodes (id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (id) DO UPDATE SET store_id = excluded.store_id, site = excluded.site, addr = excluded.addr,
             capacity = excluded.capacity, used = excluded.used, chunk_count = excluded.chunk_count,
             cache_bytes = excluded.cache_bytes, last_seen = excluded.last_seen",
        )?;
        st.execute(params![
            n.id,
            n.store_id,
            n.site,
            n.addr,
            n.capacity_bytes as i64,
            n.used_bytes as i64,
            n.chunk_count as i64,
            n.cache_bytes as i64,
            last_seen_ms
        ])?;
        let mut st = self.conn.prepare_cached(
            "INSERT INTO site_rtts (from_site, to_site, micros) VALUES (?1, ?2, ?3)
             ON CONFLICT (from_site, to_site) DO UPDATE SET micros = excluded.micros",
        )?;
        for (to, micros) in &n.site_rtts {
            st.execute(params![n.site, to, *micros as i64])?;
        }
        Ok(())
    }

    fn get_node(&mut self, id: &str) -> Result<Option<(NodeInfo, i64)>, MetaError> {
        let mut st = self.conn.prepare_cached(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes WHERE id = ?1",
        )?;
        Ok(st.query_row([id], node_row).optional()?)
    }

    fn list_nodes(&mut self) -> Result<Vec<(NodeInfo, i64)>, MetaError> {
        let mut st = self.conn.prepare_cached(
            "SELECT id, store_id, site, addr, capacity, used, chunk_count, cache_bytes, last_seen FROM nodes ORDER BY id",
        )?;
        Ok(st.query_map([], node_row)?.collect::<Result<Vec<_>, _>>()?)
    }

    fn principal(&mut self, name: &str) -> Result<Option<u32>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT id FROM principals WHERE name = ?1")?;
        Ok(st.query_row([name], |r| r.get::<_, i64>(0)).optional()?.map(|id| id as u32))
    }

    fn add_principal(&mut self, name: &str) -> Result<u32, MetaError> {
        let mut st = self.conn.prepare_cached("INSERT INTO principals (name) VALUES (?1)")?;
        st.execute([name])?;
        Ok(self.conn.last_insert_rowid() as u32)
    }

    fn get_policy(&mut self, ino: InodeId) -> Result<Option<Policy>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT sites, copies, mode, rpo_secs FROM policies WHERE ino = ?1")?;
        let row = st.query_row([ino as i64], policy_row).optional()?;
        row.map(policy_of).transpose()
    }

    fn put_policy(&mut self, ino: InodeId, p: &Policy) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO policies (ino, sites, copies, mode, rpo_secs) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (ino) DO UPDATE SET sites = excluded.sites, copies = excluded.copies,
             mode = excluded.mode, rpo_secs = excluded.rpo_secs",
        )?;
        st.execute(params![ino as i64, p.sites.join(","), p.copies as i64, p.mode.to_string(), p.rpo_secs as i64])?;
        Ok(())
    }

    fn delete_policy(&mut self, ino: InodeId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM policies WHERE ino = ?1")?.execute([ino as i64])?;
        Ok(())
    }

    fn list_policies(&mut self) -> Result<Vec<(InodeId, Policy)>, MetaError> {
        let mut st =
            self.conn.prepare_cached("SELECT sites, copies, mode, rpo_secs, ino FROM policies ORDER BY ino")?;
        let rows = st.query_map([], |r| Ok((policy_row(r)?, r.get::<_, i64>(4)? as u64)))?;
        let mut out = Vec::new();
        for row in rows {
            let (p, ino) = row?;
            out.push((ino, policy_of(p)?));
        }
        Ok(out)
    }

    fn set_drained(&mut self, node: &str, drained: bool) -> Result<(), MetaError> {
        let sql = if drained {
            "INSERT INTO drained_nodes (id) VALUES (?1) ON CONFLICT (id) DO NOTHING"
        } else {
            "DELETE FROM drained_nodes WHERE id = ?1"
        };
        self.conn.prepare_cached(sql)?.execute([node])?;
        Ok(())
    }

    fn drained_nodes(&mut self) -> Result<Vec<String>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT id FROM drained_nodes ORDER BY id")?;
        Ok(st.query_map([], |r| r.get(0))?.collect::<Result<Vec<_>, _>>()?)
    }

    fn get_admission(&mut self, node: &str) -> Result<Option<bool>, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT admitted FROM node_admissions WHERE id = ?1")?;
        Ok(st.query_row([node], |r| r.get::<_, i64>(0)).optional()?.map(|a| a != 0))
    }

    fn set_admission(&mut self, node: &str, admitted: bool) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached(
            "INSERT INTO node_admissions (id, admitted) VALUES (?1, ?2)
             ON CONFLICT (id) DO UPDATE SET admitted = excluded.admitted",
        )?;
        st.execute(params![node, i64::from(admitted)])?;
        Ok(())
    }

    fn put_join_token(&mut self, hash: &[u8; 32], expires_ms: i64) -> Result<(), MetaError> {
        let mut st = self.conn.prepare_cached("INSERT INTO join_tokens (hash, expires) VALUES (?1, ?2)")?;
        st.execute(params![&hash[..], expires_ms])?;
        Ok(())
    }

    fn take_join_token(&mut self, hash: &[u8; 32]) -> Result<Option<i64>, MetaError> {
        let mut st = self.conn.prepare_cached("DELETE FROM join_tokens WHERE hash = ?1 RETURNING expires")?;
        Ok(st.query_row([&hash[..]], |r| r.get(0)).optional()?)
    }

    fn delete_node(&mut self, node: &str) -> Result<(), MetaError> {
        for sql in [
            "DELETE FROM nodes WHERE id = ?1",
            "DELETE FROM drained_nodes WHERE id = ?1",
            "DELETE FROM chunk_nodes WHERE node = ?1",
        ] {
            self.conn.prepare_cached(sql)?.execute([node])?;
        }
        Ok(())
    }
}

fn policy_row(r: &Row<'_>) -> rusqlite::Result<PolicyColumns> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

impl From<rusqlite::Error> for MetaError {
    fn from(e: rusqlite::Error) -> Self {
        MetaError::Database { backend: "SQLite", detail: e.to_string() }
    }
}

/// `engine::probe_database` for SQLite: the file opened read-only, its schema's
/// version read; nothing made or changed.
pub(crate) fn probe(path: &std::path::Path) -> Result<String, MetaError> {
    let shown = path.display().to_string();
    if !path.exists() {
        return Err(MetaError::NotFormatted {
            path: shown,
            reason: "no such file (`locus meta --init` makes and formats it)".into(),
        });
    }
    let c = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let Some(version) = schema::recorded_version(&c)? else {
        return Err(MetaError::NotFormatted {
            path: shown,
            reason: "not a Locus database (no meta_version table)".into(),
        });
    };
    Ok(format!("{shown}: SQLite, schema version {} (this binary's: {})", version.unwrap_or(0), schema::SCHEMA_VERSION))
}

#[cfg(test)]
mod tests {
    use super::schema::SCHEMA_VERSION;
    use super::*;
    use crate::conformance::test_config;
    use crate::service::{MetaConfig, MetaService};
    use proto::meta::*;
    use proto::meta::{MetaReply, MetaRequest};
    use proto::types::ROOT_INODE;

    fn temp_db() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        (dir, path)
    }

    /// How often a range statement was parsed and planned again over three executions
    /// with other values, on `conn`.
    fn replans(conn: &Connection) -> i32 {
        let sql =
            "SELECT len FROM extents WHERE ino = ?1 AND file_offset >= ?2 AND file_offset < ?3 ORDER BY file_offset";
        for (start, end) in [(0, i64::MAX), (4096, 8192), (0, 1)] {
            let mut st = conn.prepare_cached(sql).unwrap();
            st.query_map(params![1, start, end], |r| r.get::<_, i64>(0)).unwrap().for_each(drop);
        }
        conn.prepare_cached(sql).unwrap().get_status(rusqlite::StatementStatus::RePrepare)
    }

    #[test]
    fn cached_statements_keep_their_plan() {
        let (_dir, path) = temp_db();
        drop(open(&path, true).unwrap());
        // The control: SQLite's default plans such a statement again on every bind.
        assert!(replans(&Connection::open(&path).unwrap()) > 0, "the control no longer replans");
        let writer = Connection::open(&path).unwrap();
        configure(&writer).unwrap();
        assert_eq!(replans(&writer), 0, "the write connection replans");
        assert_eq!(replans(&open_reader(&path).unwrap()), 0, "a read connection replans");
    }

    #[test]
    fn refuses_a_newer_schema() {
        let (_dir, path) = temp_db();
        drop(open(&path, true).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute("UPDATE meta_version SET version = ?1", [SCHEMA_VERSION + 1]).unwrap();
        }
        let err = open(&path, false).err().expect("a newer schema must be refused");
        assert!(matches!(err, MetaError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1), "{err}");
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn reopen_keeps_the_version_row_and_the_cluster_id() {
        let (_dir, path) = temp_db();
        let first = open(&path, true).unwrap().cluster_id;
        let second = open(&path, false).unwrap().cluster_id;
        assert_eq!(first, second);
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM meta_version", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_missing_or_empty_file_needs_init() {
        let (_dir, path) = temp_db();
        let err = open(&path, false).err().expect("a missing database must be refused");
        assert!(matches!(err, MetaError::NotFormatted { .. }) && err.to_string().contains("--init"), "{err}");
        assert!(!path.exists(), "refusing creates nothing");
        File::create(&path).unwrap();
        let err = open(&path, false).err().expect("an empty database must be refused");
        assert!(err.to_string().contains("is empty") && err.to_string().contains("--init"), "{err}");
        let formatted = open(&path, true).unwrap();
        assert_eq!(formatted.cluster_id.len(), 32);
        drop(formatted);
        let other = temp_db();
        assert_ne!(open(&other.1, true).unwrap().cluster_id, open(&path, false).unwrap().cluster_id);
    }

    #[test]
    fn a_foreign_database_is_refused_even_with_init() {
        let (_dir, path) = temp_db();
        Connection::open(&path).unwrap().execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let err = open(&path, true).err().expect("a foreign database must be refused");
        assert!(err.to_string().contains("not a Locus metadata database"), "{err}");
    }

    #[test]
    fn a_second_opener_is_refused() {
        let (_dir, path) = temp_db();
        let first = open(&path, true).unwrap();
        let err = open(&path, false).err().expect("a second opener must be refused");
        assert!(matches!(err, MetaError::InUse { .. }) && err.to_string().contains("in use"), "{err}");
        drop(first);
        open(&path, false).unwrap();
    }

    #[test]
    fn zeroed_pages_are_refused() {
        let (_dir, path) = temp_db();
        {
            let s = MetaService::open(&test_config(path.clone())).unwrap();
            for i in 0..300 {
                let name = format!("file-with-a-longish-name-{i}").into_bytes();
                let req = MetaRequest::Create(Create {
                    parent: ROOT_INODE,
                    name,
                    node: proto::meta::NewNode::File,
                    mode: 0o644,
                    umask: 0,
                    exclusive: true,
                });
                s.handle_blocking(req).unwrap();
            }
        }
        // Fold the WAL into the file, then zero pages 2..6 (page 1 holds the header).
        Connection::open(&path).unwrap().execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 6 * 4096, "{} bytes", bytes.len());
        bytes[4096..6 * 4096].fill(0);
        std::fs::write(&path, bytes).unwrap();
        let err = open(&path, false).err().expect("a damaged database must be refused");
        assert!(matches!(err, MetaError::Damaged { .. }) && err.to_string().contains("damaged"), "{err}");
    }

    /// Opens the committed schema-1 fixture (see tests/fixtures/README.md): it is
    /// adopted (given a cluster id) in place and reads back whole.
    #[test]
    fn a_version_1_database_is_upgraded_in_place() {
        let (_dir, path) = temp_db();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema-v1.db");
        std::fs::copy(fixture, &path).unwrap();
        let s = MetaService::open(&MetaConfig { init: false, ..test_config(path.clone()) }).unwrap();
        assert_eq!(s.cluster_id().len(), 32);
        let ask = |req| s.handle_blocking(req).unwrap();
        let attr = |r: MetaReply| match r {
            MetaReply::Attr(a) => a,
            other => panic!("expected Attr, got {other:?}"),
        };
        let docs = attr(ask(MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"docs".to_vec() })));
        assert_eq!(docs.kind, FileKind::Dir);
        let a = attr(ask(MetaRequest::Lookup(Lookup { parent: docs.ino, name: b"a.txt".to_vec() })));
        assert_eq!(a.size, 150);
        let MetaReply::Extents(extents) = ask(MetaRequest::ListExtents(ListExtents { after: None, limit: 10 })) else {
            panic!("expected extents")
        };
        let shape: Vec<_> = extents
            .iter()
            .filter(|(ino, _)| *ino == a.ino)
            .map(|(_, e)| (e.file_offset, e.len, e.chunk.0[0], e.chunk_offset))
            .collect();
        assert_eq!(shape, vec![(0, 100, 1, 0), (100, 50, 2, 10)]);
        let colour = ask(MetaRequest::GetXattr(GetXattr { ino: a.ino, name: b"user.colour".to_vec() }));
        assert_eq!(colour, MetaReply::Bytes(b"blue".to_vec()));
        let sub = attr(ask(MetaRequest::Lookup(Lookup { parent: docs.ino, name: b"sub".to_vec() })));
        let b = attr(ask(MetaRequest::Lookup(Lookup { parent: sub.ino, name: b"b.bin".to_vec() })));
        assert_eq!(b.size, 4096);
        let link = attr(ask(MetaRequest::Lookup(Lookup { parent: ROOT_INODE, name: b"link".to_vec() })));
        assert_eq!(ask(MetaRequest::ReadLink(ReadLink { ino: link.ino })), MetaReply::Bytes(b"docs/a.txt".to_vec()));
        let MetaReply::Nodes(nodes) = ask(MetaRequest::ListNodes(ListNodes {})) else { panic!("expected nodes") };
        assert_eq!(nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), ["n1"]);
        // Nodes a cluster had before admission existed are admitted by the upgrade.
        let mut n1 = nodes[0].clone();
        n1.last_seen_secs = 0;
        assert!(matches!(
            s.handle_blocking(MetaRequest::RegisterNode(RegisterNode { node: n1, cluster_id: None })),
            Ok(MetaReply::Registered(_))
        ));
        let MetaReply::Chunks(chunks) = ask(MetaRequest::ListChunks(ListChunks { after: None, limit: 10 })) else {
            panic!("expected chunks")
        };
        assert_eq!(chunks.iter().map(|c| c.refcount).collect::<Vec<_>>(), [1, 1, 1]);
        let located: Vec<usize> = chunks.iter().map(|c| c.replicas().count()).collect();
        assert!(located.iter().all(|n| *n > 0), "locations recorded before the upgrade are replicas: {located:?}");
        let cluster = s.cluster_id().to_string();
        drop(s);
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn.query_row("SELECT version FROM meta_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let kept: String = conn.query_row("SELECT id FROM cluster", [], |r| r.get(0)).unwrap();
        assert_eq!(kept, cluster, "adopted once, kept");
    }
}
