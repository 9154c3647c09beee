//! Statement fragments that several rooms build their SQL from at compile time
//! (`concat!`), as macros: the advisory locks, the channel of kept-row notices, how
//! transactions begin, the writer's session setup, the inode columns and the entry
//! statement. Declared first in `postgres`, so every room may use them.

/// The advisory lock every write transaction of every meta takes shared at its commit,
/// in the statement that checks the epoch (`PgConn::commit_gate`; no round trip of its own); a
/// transaction that kept losing serialization conflicts (`WriteConn::run_alone_next`)
/// takes it exclusively at session level before its BEGIN, so that no other writer
/// commits from its snapshot to its own commit: with nobody committing beside it, it
/// cannot lose a serialization conflict. PostgreSQL queues later shared requests behind
/// a waiting exclusive one, so it waits only for the commits already under way. (A
/// writer waiting at its commit for the lone one while the lone one waits for a row it
/// wrote is a deadlock PostgreSQL detects; the loser retries like any conflict.)
macro_rules! writers_lock {
    () => {
        "7483620001"
    };
}

/// The advisory lock held shared by the writer session of every meta that keeps rows in
/// memory, and tried exclusively by every commit that changed inodes or entries: the
/// try fails exactly when another meta keeps rows, and then the commit notifies
/// `kept_rows_channel` of what it changed (`kept`).
macro_rules! kept_rows_lock {
    () => {
        7483620002
    };
}

/// The channel of those notifications.
macro_rules! kept_rows_channel {
    () => {
        "locus_rows"
    };
}

/// Notifies the payloads in parameter `$n` (a text array) if another meta keeps rows;
/// a column of the statement sent ahead of a COMMIT.
macro_rules! notify_keepers {
    ($n:literal) => {
        concat!(
            "(SELECT count(pg_notify('",
            kept_rows_channel!(),
            "', p)) FROM unnest($",
            $n,
            "::text[]) p WHERE NOT pg_try_advisory_xact_lock(",
            kept_rows_lock!(),
            "))"
        )
    };
}

/// How a write transaction begins: see the module's note on isolation.
macro_rules! begin_write {
    () => {
        "BEGIN ISOLATION LEVEL SERIALIZABLE"
    };
}

/// How a read begins: a consistent snapshot that never conflicts.
macro_rules! begin_read {
    () => {
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    };
}

/// The writer's session setup: `locus_expect`, which fails the transaction with
/// `KEPT_ROW_STALE_SQLSTATE` unless its argument is true. The function lives in the
/// session's own temporary schema, so it needs no change to the database's schema.
macro_rules! writer_setup {
    () => {
        "CREATE FUNCTION pg_temp.locus_expect(ok BOOLEAN) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'locus: a row this meta kept in memory was out of date' USING ERRCODE = 'LK001';
    END IF;
END $$"
    };
}

/// The inode columns in the order `inode_of` reads them.
macro_rules! inode_cols {
    () => {
        "ino, kind, mode, uid, gid, size, nlink, rdev, atime_s, atime_ns, mtime_s, mtime_ns, \
         ctime_s, ctime_ns, data_version, parent, target"
    };
}

/// SQL that is true when the inode row equals the parameters listed (`inode_params`).
macro_rules! inode_is {
    ($params:literal) => {
        concat!("EXISTS (SELECT 1 FROM inodes WHERE (", inode_cols!(), ") = (", $params, "))")
    };
}

/// Directory $1, its entry named $2, that entry's inode (`PgConn::entry_seen` reads the
/// entry from column 17), what `$facts` says about it (columns 35-39) and session $3
/// (from column 40).
macro_rules! entry_sql {
    ($facts:literal) => {
        concat!(
            "SELECT p.ino, p.kind, p.mode, p.uid, p.gid, p.size, p.nlink, p.rdev, p.atime_s, p.atime_ns, \
             p.mtime_s, p.mtime_ns, p.ctime_s, p.ctime_ns, p.data_version, p.parent, p.target, \
             d.ino, c.ino, c.kind, c.mode, c.uid, c.gid, c.size, c.nlink, c.rdev, c.atime_s, c.atime_ns, \
             c.mtime_s, c.mtime_ns, c.ctime_s, c.ctime_ns, c.data_version, c.parent, c.target, ",
            $facts,
            ", s.id, s.site, s.host, s.pid, s.purpose, s.last_seen, s.owner \
             FROM inodes p LEFT JOIN dentries d ON d.parent = p.ino AND d.name = $2 \
             LEFT JOIN inodes c ON c.ino = d.ino LEFT JOIN sessions s ON s.id = $3 WHERE p.ino = $1"
        )
    };
}
