//! PostgreSQL's own schema, its version and upgrades (`UPGRADES`), formatting a new
//! database, and what `migrate` needs to fill an empty one.

use crate::error::MetaError;
use crate::store::Txn;
use crate::store::values::{new_cluster_id, random_bytes, root_inode};
use postgres::{SimpleQueryMessage, Statement};

use super::conn::{Answer, Last, Params, PgConn, connect};
use super::parse;
use super::wire::Wire;

/// The version of the schema below that this binary writes: PostgreSQL's own, upgraded
/// by `UPGRADES` (SQLite's schema has its own version and migrations).
pub(super) const SCHEMA_VERSION: i64 = 10;

/// Whether a database has the version table: Locus formatted it (the opening and
/// `probe` ask alike).
pub(super) const HAS_VERSION_TABLE: &str = "SELECT to_regclass('meta_version') IS NOT NULL";
/// The schema version a formatted database records (NULL: no row).
pub(super) const RECORDED_VERSION: &str = "SELECT MAX(version) FROM meta_version";

/// The schema of SQLite's backend in PostgreSQL's types (BIGINT for every integer, BYTEA
/// for blobs), with sequences for the ids.
pub(super) const SCHEMA: &str = "
CREATE TABLE meta_version (version BIGINT NOT NULL);
CREATE TABLE cluster (id TEXT NOT NULL, secret BYTEA);
CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO counters (name, value) VALUES ('syncs', 0);
CREATE SEQUENCE next_inode START WITH 2;
CREATE SEQUENCE next_cookie START WITH 1;
CREATE SEQUENCE next_session START WITH 1;
CREATE TABLE inodes (
    ino BIGINT PRIMARY KEY, kind BIGINT NOT NULL, mode BIGINT NOT NULL,
    uid BIGINT NOT NULL, gid BIGINT NOT NULL, size BIGINT NOT NULL, nlink BIGINT NOT NULL,
    rdev BIGINT NOT NULL, atime_s BIGINT NOT NULL, atime_ns BIGINT NOT NULL,
    mtime_s BIGINT NOT NULL, mtime_ns BIGINT NOT NULL, ctime_s BIGINT NOT NULL,
    ctime_ns BIGINT NOT NULL, data_version BIGINT NOT NULL, parent BIGINT NOT NULL,
    target BYTEA NOT NULL);
CREATE INDEX inodes_orphaned ON inodes (ino) WHERE nlink = 0;
CREATE TABLE dentries (
    parent BIGINT NOT NULL, name BYTEA NOT NULL, ino BIGINT NOT NULL, cookie BIGINT NOT NULL,
    PRIMARY KEY (parent, name));
CREATE UNIQUE INDEX dentries_by_cookie ON dentries (parent, cookie);
CREATE TABLE extents (
    ino BIGINT NOT NULL, file_offset BIGINT NOT NULL, len BIGINT NOT NULL,
    chunk BYTEA NOT NULL, chunk_offset BIGINT NOT NULL, PRIMARY KEY (ino, file_offset));
CREATE TABLE chunks (id BYTEA PRIMARY KEY, size BIGINT NOT NULL, refcount BIGINT NOT NULL);
CREATE TABLE chunk_nodes (
    chunk BYTEA NOT NULL, node TEXT NOT NULL, cached BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (chunk, node));
CREATE TABLE xattrs (
    ino BIGINT NOT NULL, name BYTEA NOT NULL, value BYTEA NOT NULL, PRIMARY KEY (ino, name));
CREATE TABLE sessions (
    id BIGINT PRIMARY KEY, site TEXT NOT NULL, host TEXT NOT NULL, pid BIGINT NOT NULL,
    purpose TEXT NOT NULL, last_seen BIGINT NOT NULL, owner TEXT);
CREATE TABLE nodes (
    id TEXT PRIMARY KEY, store_id TEXT NOT NULL, site TEXT NOT NULL, addr TEXT NOT NULL, capacity BIGINT NOT NULL,
    used BIGINT NOT NULL, chunk_count BIGINT NOT NULL, cache_bytes BIGINT NOT NULL, last_seen BIGINT NOT NULL);
CREATE TABLE site_rtts (
    from_site TEXT NOT NULL, to_site TEXT NOT NULL, micros BIGINT NOT NULL, PRIMARY KEY (from_site, to_site));
CREATE TABLE opens (
    session BIGINT NOT NULL, ino BIGINT NOT NULL, count BIGINT NOT NULL, writable BIGINT NOT NULL,
    PRIMARY KEY (session, ino));
CREATE INDEX opens_by_ino ON opens (ino);
CREATE TABLE locks (
    ino BIGINT NOT NULL, session BIGINT NOT NULL, owner BIGINT NOT NULL, range_start BIGINT NOT NULL,
    range_end BIGINT NOT NULL, is_write BIGINT NOT NULL, pid BIGINT NOT NULL);
CREATE INDEX locks_by_ino ON locks (ino);
CREATE INDEX locks_by_session ON locks (session);
CREATE TABLE policies (
    ino BIGINT PRIMARY KEY, sites TEXT NOT NULL, copies BIGINT NOT NULL, mode TEXT NOT NULL,
    rpo_secs BIGINT NOT NULL);
CREATE TABLE drained_nodes (id TEXT PRIMARY KEY);
CREATE TABLE node_admissions (id TEXT PRIMARY KEY, admitted BIGINT NOT NULL);
CREATE TABLE join_tokens (hash BYTEA PRIMARY KEY, expires BIGINT NOT NULL);
CREATE TABLE primary_epoch (epoch BIGINT NOT NULL);
INSERT INTO primary_epoch (epoch) VALUES (1);
CREATE TABLE primary_leases (holder TEXT PRIMARY KEY, epoch BIGINT NOT NULL, expires_at TIMESTAMPTZ NOT NULL);
CREATE FUNCTION locus_fence(expected BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT epoch FROM primary_epoch) IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'locus: the primary role moved on past epoch %', expected USING ERRCODE = 'LF001';
    END IF;
END $$;
CREATE TABLE principals (id BIGINT PRIMARY KEY, name TEXT NOT NULL UNIQUE);
";

/// The oldest schema version a PostgreSQL database can be upgraded from (the first
/// one PostgreSQL databases were created at).
pub(super) const FIRST_UPGRADABLE: i64 = 9;

/// Upgrades from each version since `FIRST_UPGRADABLE` to the next, in order: entry
/// `i` turns version `FIRST_UPGRADABLE + i` into the next. Each runs inside the
/// opening transaction.
pub(super) const UPGRADES: &[Upgrade] = &[mark_acls_in_modes];

/// One schema upgrade step, run inside the opening transaction.
pub(super) type Upgrade = fn(&mut PgConn) -> Result<(), MetaError>;
const _: () = assert!(FIRST_UPGRADABLE + UPGRADES.len() as i64 == SCHEMA_VERSION);

/// Version 9 -> 10: the `mode` column may carry ACL marks (`store::AclMarks`); as for
/// SQLite, no row changes, the version moves so that older binaries refuse the database.
pub(super) fn mark_acls_in_modes(_: &mut PgConn) -> Result<(), MetaError> {
    Ok(())
}

/// The advisory lock a meta holds (for its session) while it checks, formats or
/// upgrades the schema: a second meta opening the same database meanwhile waits for
/// the first's transaction instead of finding it empty and refusing it (or formatting it
/// a second time).
const SCHEMA_LOCK: i64 = 7483620003;

/// `init_schema_locked` under `SCHEMA_LOCK`, taken before the transaction begins so
/// that its snapshot shows what the previous holder committed.
pub(super) fn init_schema(w: &mut PgConn, shown: &str, init: bool) -> Result<bool, MetaError> {
    w.exec("SELECT pg_advisory_lock($1)", &[&SCHEMA_LOCK])?;
    let done = init_schema_locked(w, shown, init);
    let unlocked = w.exec("SELECT pg_advisory_unlock($1)", &[&SCHEMA_LOCK]);
    let formatted = done?;
    unlocked?;
    Ok(formatted)
}

/// Formats an empty database (with `init`), or checks the schema version of a
/// formatted one and upgrades an older one, in one transaction. Answers whether it
/// formatted.
fn init_schema_locked(w: &mut PgConn, shown: &str, init: bool) -> Result<bool, MetaError> {
    let not_formatted = |reason: &str| MetaError::NotFormatted { path: shown.into(), reason: reason.into() };
    w.batch(begin_write!())?;
    let r = (|| {
        let tables: i64 = w
            .one("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()", &[])?
            .try_get(0)?;
        if tables == 0 {
            if !init {
                return Err(not_formatted("is empty"));
            }
            return format(w).map(|()| true);
        }
        let versioned: bool = w.one(HAS_VERSION_TABLE, &[])?.try_get(0)?;
        if !versioned {
            return Err(not_formatted("is not a Locus metadata database"));
        }
        let found: Option<i64> = w.one(RECORDED_VERSION, &[])?.try_get(0)?;
        let found = found.ok_or_else(|| MetaError::SchemaUnknown { path: shown.into(), found: 0 })?;
        if found > SCHEMA_VERSION {
            return Err(MetaError::SchemaTooNew { path: shown.into(), found, supported: SCHEMA_VERSION });
        }
        if found < FIRST_UPGRADABLE {
            return Err(MetaError::SchemaUnknown { path: shown.into(), found });
        }
        for (from, upgrade) in UPGRADES.iter().enumerate().skip((found - FIRST_UPGRADABLE) as usize) {
            upgrade(w)?;
            let from = FIRST_UPGRADABLE + from as i64;
            tracing::info!(database = shown, from, to = from + 1, "upgraded the metadata schema");
        }
        if found < SCHEMA_VERSION {
            w.exec("UPDATE meta_version SET version = $1", &[&SCHEMA_VERSION])?;
        }
        Ok(false)
    })();
    match r {
        Ok(formatted) => w.batch("COMMIT").map(|()| formatted),
        Err(e) => {
            let _ = w.batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Creates the schema, the root directory and a new cluster id.
pub(super) fn format(w: &mut PgConn) -> Result<(), MetaError> {
    create_tables(w)?;
    w.exec("INSERT INTO cluster (id, secret) VALUES ($1, $2)", &[&new_cluster_id()?, &&random_bytes::<32>()?[..]])?;
    w.put_inode(&root_inode())
}

/// Connects to the database at `url` for `migrate`, which copies only into an empty one.
pub(crate) fn connect_empty(url: &str) -> Result<PgConn, MetaError> {
    let (config, shown) = parse(url)?;
    let mut conn = connect(&config, &shown, None)?;
    let tables: i64 = conn
        .one("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema()", &[])?
        .try_get(0)?;
    if tables > 0 {
        return Err(MetaError::TargetNotEmpty { url: shown, tables: tables as u64 });
    }
    Ok(conn)
}

/// What `migrate` needs beyond the row operations: statements built at run time
/// (one per copied table) and the counters, which are sequences here.
impl PgConn {
    pub(crate) fn prepare_dynamic(&mut self, sql: &str) -> Result<Statement, MetaError> {
        let until = self.wait_limit();
        let Wire { client, driver } = self.wire()?;
        match driver.block_on_until(client.prepare(sql), until.as_deref())? {
            Some(prepared) => {
                // As after a failed request (`failed_unread`).
                self.failed_unread |= prepared.is_err();
                Ok(prepared?)
            }
            None => Err(self.abandon()),
        }
    }

    pub(crate) fn execute_prepared(&mut self, st: &Statement, params: Params<'_>) -> Result<u64, MetaError> {
        match self.pipeline(Last::Count(st, params))? {
            Answer::Count(n) => Ok(n),
            _ => unreachable!("an execute answers a count"),
        }
    }

    /// Rows in `table` (a name taken from the source's catalogue).
    pub(crate) fn count_rows(&mut self, table: &str) -> Result<u64, MetaError> {
        let Answer::Simple(answers) = self.pipeline(Last::Simple(&format!("SELECT COUNT(*) FROM {table}")))? else {
            unreachable!("a simple query answers messages")
        };
        let n = answers
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).and_then(|n| n.parse::<u64>().ok()),
                _ => None,
            })
            .ok_or_else(|| MetaError::Internal(format!("no row count for table {table}")))?;
        Ok(n)
    }

    /// Sets counter `name` (as SQLite names it) so that the next id it gives is `value + 1`.
    pub(crate) fn set_counter(&mut self, name: &str, value: i64) -> Result<(), MetaError> {
        match name {
            "syncs" => self.exec("UPDATE counters SET value = $1 WHERE name = 'syncs'", &[&value])?,
            "next_inode" | "next_cookie" | "next_session" => {
                self.one("SELECT setval($1::text::regclass, $2, false)", &[&name, &(value + 1)])?;
                0
            }
            other => return Err(MetaError::Corrupt(format!("unknown counter {other:?}"))),
        };
        Ok(())
    }
}

/// The tables and the version row, without any namespace (what `migrate` fills).
pub(crate) fn create_tables(w: &mut PgConn) -> Result<(), MetaError> {
    w.batch(SCHEMA)?;
    w.exec("INSERT INTO meta_version (version) VALUES ($1)", &[&SCHEMA_VERSION])?;
    Ok(())
}
