//! The SQLite backend: one database file in WAL mode, one write connection that
//! group-commits queued write operations (each inside its own SAVEPOINT, the caller
//! that finds it free committing for everyone queued), and a small pool of read
//! connections that read concurrently with the writer.

use crate::error::MetaError;
use crate::store::{Counter, DentryRow, Inode, MetaStore, ReadOp, SessionRow, Txn, WriteDone, WriteOp};
use proto::meta::{SessionInfo, StoredChunk};
use proto::types::{Attr, ChunkId, ChunkRecord, Extent, FileKind, InodeId, NodeInfo, ROOT_INODE, SessionId, Timestamp};
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The schema version this binary writes and understands. The SQL is SQLite's
/// dialect of a portable schema: `INTEGER PRIMARY KEY` (the rowid) and `WITHOUT ROWID`
/// clustered tables map to plain `BIGINT` primary keys on PostgreSQL.
pub const SCHEMA_VERSION: i64 = 1;

/// Most write operations the writer puts into one transaction.
const MAX_BATCH: usize = 512;
/// Read connections; WAL lets them run alongside the writer.
const READERS: usize = 4;

/// The schema, kept to plain tables and types that PostgreSQL accepts as well
/// (BLOB becomes BYTEA there).
const SCHEMA: &str = "
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL) WITHOUT ROWID;
CREATE TABLE inodes (
    ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
    uid BIGINT NOT NULL, gid BIGINT NOT NULL, size BIGINT NOT NULL, nlink BIGINT NOT NULL,
    rdev BIGINT NOT NULL, atime_s BIGINT NOT NULL, atime_ns INTEGER NOT NULL,
    mtime_s BIGINT NOT NULL, mtime_ns INTEGER NOT NULL, ctime_s BIGINT NOT NULL,
    ctime_ns INTEGER NOT NULL, data_version BIGINT NOT NULL, parent BIGINT NOT NULL,
    target BLOB NOT NULL);
CREATE INDEX inodes_orphaned ON inodes (ino) WHERE nlink = 0;
CREATE TABLE dentries (
    parent BIGINT NOT NULL, name BLOB NOT NULL, ino BIGINT NOT NULL, cookie BIGINT NOT NULL,
    PRIMARY KEY (parent, name)) WITHOUT ROWID;
CREATE UNIQUE INDEX dentries_by_cookie ON dentries (parent, cookie);
CREATE TABLE extents (
    ino BIGINT NOT NULL, file_offset BIGINT NOT NULL, len BIGINT NOT NULL,
    chunk BLOB NOT NULL, chunk_offset BIGINT NOT NULL, PRIMARY KEY (ino, file_offset)) WITHOUT ROWID;
CREATE TABLE chunks (id BLOB PRIMARY KEY, size BIGINT NOT NULL, refcount BIGINT NOT NULL) WITHOUT ROWID;
CREATE TABLE chunk_nodes (chunk BLOB NOT NULL, node TEXT NOT NULL, PRIMARY KEY (chunk, node)) WITHOUT ROWID;
CREATE TABLE xattrs (
    ino BIGINT NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ino, name)) WITHOUT ROWID;
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY, site TEXT NOT NULL, host TEXT NOT NULL, pid BIGINT NOT NULL,
    purpose TEXT NOT NULL, last_seen BIGINT NOT NULL);
CREATE TABLE nodes (
    id TEXT PRIMARY KEY, store_id TEXT NOT NULL, site TEXT NOT NULL, addr TEXT NOT NULL, capacity BIGINT NOT NULL,
    used BIGINT NOT NULL, chunk_count BIGINT NOT NULL, cache_bytes BIGINT NOT NULL, last_seen BIGINT NOT NULL)
    WITHOUT ROWID;
CREATE TABLE site_rtts (
    from_site TEXT NOT NULL, to_site TEXT NOT NULL, micros BIGINT NOT NULL, PRIMARY KEY (from_site, to_site))
    WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('next_inode', 1), ('next_cookie', 0), ('next_session', 0), ('syncs', 0);
";

struct Job {
    durable: bool,
    op: WriteOp,
    done: WriteDone,
}

/// A `MetaStore` in one SQLite file.
pub struct SqliteStore {
    /// Writes waiting for the next transaction.
    queue: Mutex<Vec<Job>>,
    /// The write connection; whoever holds it commits everything queued (group commit).
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Distinct statements the store prepares; the per-connection cache must hold them all
/// or statements are re-parsed on every use.
const STATEMENT_CACHE: usize = 128;

fn configure(conn: &Connection) -> Result<(), MetaError> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(MetaError::Internal(format!("SQLite refused WAL mode (got {mode})")));
    }
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000; PRAGMA cache_size=-65536;")?;
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if absent) the database at `path`, checking its schema version.
    pub fn open(path: &Path) -> Result<SqliteStore, MetaError> {
        let shown = path.display().to_string();
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        init_schema(&mut conn, &shown)?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let r = Connection::open(path)?;
            r.execute_batch("PRAGMA busy_timeout=10000; PRAGMA query_only=1; PRAGMA cache_size=-16384;")?;
            r.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            readers.push(Mutex::new(r));
        }
        Ok(SqliteStore {
            queue: Mutex::new(Vec::new()),
            writer: Mutex::new(conn),
            readers,
            next_reader: AtomicUsize::new(0),
        })
    }
}

fn init_schema(conn: &mut Connection, path: &str) -> Result<(), MetaError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS meta_version (version BIGINT NOT NULL)")?;
    let found: Option<i64> = tx.query_row("SELECT MAX(version) FROM meta_version", [], |r| r.get(0))?;
    match found {
        None => {
            tx.execute_batch(SCHEMA)?;
            tx.execute("INSERT INTO meta_version (version) VALUES (?1)", [SCHEMA_VERSION])?;
            let now = Timestamp::now();
            let root = Inode {
                attr: Attr {
                    ino: ROOT_INODE,
                    kind: FileKind::Dir,
                    mode: 0o755,
                    uid: 0,
                    gid: 0,
                    size: 4096,
                    nlink: 2,
                    rdev: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    data_version: 0,
                },
                parent: ROOT_INODE,
                target: Vec::new(),
            };
            SqlTxn { conn: &tx }.put_inode(&root)?;
        }
        Some(v) if v == SCHEMA_VERSION => {}
        Some(v) if v > SCHEMA_VERSION => {
            return Err(MetaError::SchemaTooNew { path: path.into(), found: v, supported: SCHEMA_VERSION });
        }
        Some(v) => {
            return Err(MetaError::SchemaUnknown { path: path.into(), found: v });
        }
    }
    tx.commit()?;
    Ok(())
}

/// Runs a batch in one transaction, each op inside a savepoint, and answers each op
/// after the single commit.
fn run_batch(conn: &Connection, batch: Vec<Job>) {
    let durable = batch.iter().any(|j| j.durable);
    let mut replies = Vec::with_capacity(batch.len());
    let outcome = (|| -> Result<(), MetaError> {
        if durable {
            conn.execute_batch("PRAGMA synchronous=FULL")?;
        }
        let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut st| st.execute([])).map(drop);
        run("BEGIN IMMEDIATE")?;
        // A lone write needs no savepoint: its failure rolls back the whole transaction.
        let alone = batch.len() == 1;
        for job in batch {
            if !alone {
                run("SAVEPOINT op")?;
            }
            let op = job.op;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(&mut SqlTxn { conn })))
                .unwrap_or_else(|_| Err(MetaError::Internal("a metadata operation panicked".into())));
            if alone {
                if result.is_err() {
                    run("ROLLBACK")?;
                    replies.push((job.done, result));
                    return Ok(());
                }
            } else {
                if result.is_err() {
                    run("ROLLBACK TO op")?;
                }
                run("RELEASE op")?;
            }
            replies.push((job.done, result));
        }
        run("COMMIT")?;
        Ok(())
    })();
    if let Err(e) = outcome {
        tracing::error!(error = %e, "metadata commit failed");
        let _ = conn.execute_batch("ROLLBACK");
        let msg = e.to_string();
        for (done, result) in replies {
            done(result.and(Err(MetaError::Internal(format!("commit failed: {msg}")))));
        }
    } else {
        for (done, result) in replies {
            done(result);
        }
    }
    if durable && let Err(e) = conn.execute_batch("PRAGMA synchronous=NORMAL") {
        tracing::warn!(error = %e, "cannot restore synchronous=NORMAL");
    }
}

impl MetaStore for SqliteStore {
    /// Leader/follower group commit: the caller that finds the write connection free
    /// commits everything queued, its own write included, in one transaction; callers
    /// that find it busy leave their write for the current leader. An uncontended
    /// write thus runs on the caller's thread with no hand-off.
    fn submit_write(&self, durable: bool, op: WriteOp, done: WriteDone) {
        lock(&self.queue).push(Job { durable, op, done });
        loop {
            let Ok(conn) = self.writer.try_lock() else {
                // The leader re-checks the queue after it lets go of the connection.
                return;
            };
            let batch: Vec<Job> = {
                let mut queue = lock(&self.queue);
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            if !batch.is_empty() {
                run_batch(&conn, batch);
            }
            drop(conn);
            if lock(&self.queue).is_empty() {
                return;
            }
        }
    }

    fn read_op(&self, op: ReadOp<'_>) -> Result<(), MetaError> {
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        let mut guard = None;
        for i in 0..self.readers.len() {
            if let Ok(g) = self.readers[(start + i) % self.readers.len()].try_lock() {
                guard = Some(g);
                break;
            }
        }
        let conn = match guard {
            Some(g) => g,
            None => self.readers[start % self.readers.len()].lock().unwrap_or_else(|e| e.into_inner()),
        };
        let tx = rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Deferred)?;
        op(&mut SqlTxn { conn: &tx })?;
        tx.commit()?;
        Ok(())
    }
}

/// `Txn` over one SQLite connection with an open transaction.
struct SqlTxn<'a> {
    conn: &'a Connection,
}

/// Offsets are stored as BIGINT; files never exceed `i64::MAX` (POSIX `off_t`).
fn off(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

fn kind_code(k: FileKind) -> i64 {
    match k {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

fn kind_of(code: i64) -> Option<FileKind> {
    Some(match code {
        1 => FileKind::File,
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        _ => return None,
    })
}

fn chunk_id(bytes: Vec<u8>) -> Result<ChunkId, MetaError> {
    let arr: [u8; 32] =
        bytes.try_into().map_err(|b: Vec<u8>| MetaError::Corrupt(format!("chunk id of {} bytes", b.len())))?;
    Ok(ChunkId(arr))
}

const INODE_COLS: &str = "ino, kind, mode, uid, gid, size, nlink, rdev, atime_s, atime_ns, mtime_s, mtime_ns, \
                          ctime_s, ctime_ns, data_version, parent, target";

fn inode_row(r: &Row<'_>) -> rusqlite::Result<(Inode, i64)> {
    let ts = |s: usize| -> rusqlite::Result<Timestamp> {
        Ok(Timestamp { secs: r.get(s)?, nanos: r.get::<_, i64>(s + 1)? as u32 })
    };
    let kind: i64 = r.get(1)?;
    let inode = Inode {
        attr: Attr {
            ino: r.get::<_, i64>(0)? as u64,
            kind: FileKind::File,
            mode: r.get::<_, i64>(2)? as u32,
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
        },
        r.get(8)?,
    ))
}

fn session_row(r: &Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        id: r.get::<_, i64>(0)? as u64,
        info: SessionInfo { site: r.get(1)?, host: r.get(2)?, pid: r.get::<_, i64>(3)? as u32, purpose: r.get(4)? },
        last_seen_ms: r.get(5)?,
    })
}

impl SqlTxn<'_> {
    fn chunk_record(&self, id: &ChunkId, size: i64, refcount: i64) -> Result<ChunkRecord, MetaError> {
        let mut st = self.conn.prepare_cached("SELECT node FROM chunk_nodes WHERE chunk = ?1 ORDER BY node")?;
        let nodes = st.query_map([&id.0[..]], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
        Ok(ChunkRecord { id: *id, size: size as u64, refcount: refcount.max(0) as u64, nodes })
    }
}

impl Txn for SqlTxn<'_> {
    fn next_id(&mut self, counter: Counter) -> Result<u64, MetaError> {
        let mut st =
            self.conn.prepare_cached("UPDATE counters SET value = value + 1 WHERE name = ?1 RETURNING value")?;
        let v: Option<i64> = st.query_row([counter.name()], |r| r.get(0)).optional()?;
        v.map(|v| v as u64).ok_or_else(|| MetaError::Corrupt(format!("counter {} missing", counter.name())))
    }

    fn get_inode(&mut self, ino: InodeId) -> Result<Option<Inode>, MetaError> {
        let mut st = self.conn.prepare_cached(&format!("SELECT {INODE_COLS} FROM inodes WHERE ino = ?1"))?;
        let Some((mut inode, kind)) = st.query_row([ino as i64], inode_row).optional()? else {
            return Ok(None);
        };
        inode.attr.kind = kind_of(kind).ok_or_else(|| MetaError::Corrupt(format!("inode {ino} has kind {kind}")))?;
        Ok(Some(inode))
    }

    fn put_inode(&mut self, inode: &Inode) -> Result<(), MetaError> {
        let a = &inode.attr;
        let mut st = self.conn.prepare_cached(&format!(
            "INSERT INTO inodes ({INODE_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)
             ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, uid = excluded.uid,
             gid = excluded.gid, size = excluded.size, nlink = excluded.nlink, rdev = excluded.rdev,
             atime_s = excluded.atime_s, atime_ns = excluded.atime_ns, mtime_s = excluded.mtime_s,
             mtime_ns = excluded.mtime_ns, ctime_s = excluded.ctime_s, ctime_ns = excluded.ctime_ns,
             data_version = excluded.data_version, parent = excluded.parent, target = excluded.target"
        ))?;
        st.execute(params![
            a.ino as i64,
            kind_code(a.kind),
            a.mode as i64,
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
            "SELECT name, ino, cookie FROM dentries WHERE parent = ?1 AND cookie > ?2 ORDER BY cookie LIMIT ?3",
        )?;
        let rows = st.query_map(params![parent as i64, off(after), limit as i64], |r| {
            Ok(DentryRow { name: r.get(0)?, ino: r.get::<_, i64>(1)? as u64, cookie: r.get::<_, i64>(2)? as u64 })
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
            "INSERT INTO chunk_nodes (chunk, node) VALUES (?1, ?2) ON CONFLICT (chunk, node) DO NOTHING",
        )?;
        for node in &chunk.nodes {
            st.execute(params![&chunk.id.0[..], node])?;
        }
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
            .prepare_cached("DELETE FROM chunk_nodes WHERE chunk = ?1 AND node = ?2")?
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
            "INSERT INTO sessions (id, site, host, pid, purpose, last_seen) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET site = excluded.site, host = excluded.host, pid = excluded.pid,
             purpose = excluded.purpose, last_seen = excluded.last_seen",
        )?;
        st.execute(params![s.id as i64, s.info.site, s.info.host, s.info.pid as i64, s.info.purpose, s.last_seen_ms])?;
        Ok(())
    }

    fn get_session(&mut self, id: SessionId) -> Result<Option<SessionRow>, MetaError> {
        let mut st =
            self.conn.prepare_cached("SELECT id, site, host, pid, purpose, last_seen FROM sessions WHERE id = ?1")?;
        Ok(st.query_row([id as i64], session_row).optional()?)
    }

    fn list_sessions(&mut self) -> Result<Vec<SessionRow>, MetaError> {
        let mut st =
            self.conn.prepare_cached("SELECT id, site, host, pid, purpose, last_seen FROM sessions ORDER BY id")?;
        Ok(st.query_map([], session_row)?.collect::<Result<Vec<_>, _>>()?)
    }

    fn delete_session(&mut self, id: SessionId) -> Result<(), MetaError> {
        self.conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute([id as i64])?;
        Ok(())
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        drop(SqliteStore::open(&path).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute("UPDATE meta_version SET version = ?1", [SCHEMA_VERSION + 1]).unwrap();
        }
        let err = SqliteStore::open(&path).err().expect("a newer schema must be refused");
        assert!(matches!(err, MetaError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1), "{err}");
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn reopen_keeps_the_version_row_single() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db");
        drop(SqliteStore::open(&path).unwrap());
        drop(SqliteStore::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM meta_version", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }
}
