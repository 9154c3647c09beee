//! SQLite's own schema, its version and migrations (`MIGRATIONS`), and formatting a
//! new database; all of it runs in the opening transaction, so a failed upgrade leaves
//! the file as it was.

use super::SqlConn;
use crate::error::MetaError;
use crate::store::values::{new_cluster_id, random_bytes, root_inode};
use crate::store::{Txn, WriteConn};
use rusqlite::Connection;

/// The schema version this binary writes and understands. The SQL is SQLite's
/// dialect of a portable schema: `INTEGER PRIMARY KEY` (the rowid) and `WITHOUT ROWID`
/// clustered tables map to plain `BIGINT` primary keys on PostgreSQL.
pub(super) const SCHEMA_VERSION: i64 = 10;

/// The schema, kept to plain tables and types that PostgreSQL accepts as well
/// (BLOB becomes BYTEA there).
pub(super) const SCHEMA: &str = "
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
CREATE TABLE cluster (id TEXT NOT NULL);
";

/// Open-file records and byte-range locks, kept in the database so that they survive
/// a restart of meta (version 3).
pub(super) const OPENS_AND_LOCKS: &str = "
CREATE TABLE opens (
    session BIGINT NOT NULL, ino BIGINT NOT NULL, count BIGINT NOT NULL, writable BIGINT NOT NULL,
    PRIMARY KEY (session, ino)) WITHOUT ROWID;
CREATE INDEX opens_by_ino ON opens (ino);
CREATE TABLE locks (
    ino BIGINT NOT NULL, session BIGINT NOT NULL, owner BIGINT NOT NULL, range_start BIGINT NOT NULL,
    range_end BIGINT NOT NULL, is_write BIGINT NOT NULL, pid BIGINT NOT NULL);
CREATE INDEX locks_by_ino ON locks (ino);
CREATE INDEX locks_by_session ON locks (session);
";

/// The replication tables: policies (directory inode -> policy; `sites` is a comma
/// list) and the nodes being drained.
pub(super) const REPLICATION_TABLES: &str = "CREATE TABLE policies (
    ino BIGINT PRIMARY KEY, sites TEXT NOT NULL, copies BIGINT NOT NULL, mode TEXT NOT NULL,
    rpo_secs BIGINT NOT NULL) WITHOUT ROWID;
CREATE TABLE drained_nodes (id TEXT PRIMARY KEY) WITHOUT ROWID;";

/// Upgrades from each older schema version to the next one, in order: entry `i`
/// turns version `i + 1` into `i + 2`. Each runs inside the opening transaction.
pub(super) const MIGRATIONS: &[Migration] = &[
    adopt_into_a_cluster,
    persist_opens_and_locks,
    add_replication_policies,
    add_principals,
    add_node_admissions,
    add_cluster_secret,
    add_session_owners,
    mark_cached_copies,
    mark_acls_in_modes,
];

/// One schema upgrade step, run on the writer inside the opening transaction.
pub(super) type Migration = fn(&Connection) -> Result<(), MetaError>;

/// Version 1 -> 2: a database written before clusters had an identity is adopted
/// (it is this cluster's own database, not a foreign one) and given a new cluster id.
pub(super) fn adopt_into_a_cluster(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch("CREATE TABLE cluster (id TEXT NOT NULL)")?;
    conn.execute("INSERT INTO cluster (id) VALUES (?1)", [new_cluster_id()?])?;
    Ok(())
}

/// Version 2 -> 3: open-file records and locks move from meta's memory into tables
/// (empty: whatever a running meta held died with it before this upgrade).
pub(super) fn persist_opens_and_locks(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch(OPENS_AND_LOCKS)?;
    Ok(())
}

/// Version 3 -> 4: directories may carry a replication policy; nodes may be drained.
pub(super) fn add_replication_policies(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch(REPLICATION_TABLES)?;
    Ok(())
}

/// Version 4 -> 5: owners may be global principals (grid identities), numbered by
/// their row in this table (see `identity`).
pub(super) fn add_principals(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch("CREATE TABLE principals (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)")?;
    Ok(())
}

/// Node admission (`locus node admit` / `remove`): a node id registers only once
/// admitted (1); a removed one (0) is refused. Join tokens are kept as BLAKE3 hashes.
pub(super) const ADMISSION_TABLES: &str = "
CREATE TABLE node_admissions (id TEXT PRIMARY KEY, admitted BIGINT NOT NULL) WITHOUT ROWID;
CREATE TABLE join_tokens (hash BLOB PRIMARY KEY, expires BIGINT NOT NULL) WITHOUT ROWID;";

/// Version 5 -> 6: registrations need an operator's admission (or a join token); the
/// nodes a cluster already has are admitted, so an upgrade keeps them serving.
pub(super) fn add_node_admissions(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch(ADMISSION_TABLES)?;
    conn.execute("INSERT INTO node_admissions (id, admitted) SELECT id, 1 FROM nodes", [])?;
    Ok(())
}

/// Version 6 -> 7: a secret every meta over the database shares, so that a capability
/// one meta signs is good at every node whichever meta they registered with.
pub(super) fn add_cluster_secret(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch("ALTER TABLE cluster ADD COLUMN secret BLOB")?;
    conn.execute("UPDATE cluster SET secret = ?1", [random_bytes::<32>()?])?;
    Ok(())
}

/// Version 7 -> 8: a session remembers the certificate it was opened with.
pub(super) fn add_session_owners(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch("ALTER TABLE sessions ADD COLUMN owner TEXT")?;
    Ok(())
}

/// Version 8 -> 9: a chunk location records whether the node holds a replica (0) or
/// only a site-cache copy (1), which no policy counts. Locations recorded before are
/// taken as replicas, as they were counted then.
pub(super) fn mark_cached_copies(conn: &Connection) -> Result<(), MetaError> {
    conn.execute_batch("ALTER TABLE chunk_nodes ADD COLUMN cached BIGINT NOT NULL DEFAULT 0")?;
    Ok(())
}

/// Version 9 -> 10: the `mode` column may carry ACL marks above the permission bits
/// (`store::AclMarks`). No row changes (none has an ACL yet); the version moves so that
/// an older binary, which would read the marks as mode bits and ignore the ACLs,
/// refuses the database.
pub(super) fn mark_acls_in_modes(_conn: &Connection) -> Result<(), MetaError> {
    Ok(())
}

/// The schema version a database records: `None` without a version table (not a
/// Locus database), `Some(None)` when the table has no row.
pub(super) fn recorded_version(conn: &Connection) -> Result<Option<Option<i64>>, MetaError> {
    let tables: i64 =
        conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta_version'", [], |r| {
            r.get(0)
        })?;
    if tables == 0 {
        return Ok(None);
    }
    Ok(Some(conn.query_row("SELECT MAX(version) FROM meta_version", [], |r| r.get(0))?))
}

/// Formats an empty database (`fresh`) or checks and upgrades an existing one, all in
/// one transaction: a failed migration leaves the file as it was. Answers whether it
/// formatted.
pub(super) fn init_schema(w: &mut SqlConn, path: &str, fresh: bool) -> Result<bool, MetaError> {
    w.begin(false)?;
    let r = (|| {
        if fresh {
            return format(w).map(|()| true);
        }
        let Some(found) = recorded_version(&w.conn)? else {
            return Err(MetaError::NotFormatted {
                path: path.into(),
                reason: "is not a Locus metadata database".into(),
            });
        };
        let found = found.ok_or_else(|| MetaError::SchemaUnknown { path: path.into(), found: 0 })?;
        if found > SCHEMA_VERSION {
            return Err(MetaError::SchemaTooNew { path: path.into(), found, supported: SCHEMA_VERSION });
        }
        if found < 1 {
            return Err(MetaError::SchemaUnknown { path: path.into(), found });
        }
        for (from, migrate) in MIGRATIONS.iter().enumerate().skip(found as usize - 1) {
            migrate(&w.conn)?;
            tracing::info!(path, from = from + 1, to = from + 2, "upgraded the metadata schema");
        }
        w.conn.execute("UPDATE meta_version SET version = ?1", [SCHEMA_VERSION])?;
        Ok(false)
    })();
    match r {
        Ok(formatted) => w.commit().map(|()| formatted),
        Err(e) => {
            let _ = w.rollback();
            Err(e)
        }
    }
}

/// Creates the schema, the root directory and a new cluster id.
pub(super) fn format(w: &mut SqlConn) -> Result<(), MetaError> {
    w.conn.execute_batch("CREATE TABLE meta_version (version BIGINT NOT NULL)")?;
    w.conn.execute_batch(SCHEMA)?;
    w.conn.execute_batch(OPENS_AND_LOCKS)?;
    add_replication_policies(&w.conn)?;
    add_principals(&w.conn)?;
    add_node_admissions(&w.conn)?;
    w.conn.execute("INSERT INTO meta_version (version) VALUES (?1)", [SCHEMA_VERSION])?;
    w.conn.execute("INSERT INTO cluster (id) VALUES (?1)", [new_cluster_id()?])?;
    add_cluster_secret(&w.conn)?;
    add_session_owners(&w.conn)?;
    mark_cached_copies(&w.conn)?;
    w.put_inode(&root_inode())
}
