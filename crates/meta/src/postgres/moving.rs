//! Moving a metadata home to another site's PostgreSQL server (`locus home move`): the
//! home's primary is fenced (its epoch bumped, so every meta's commit there is refused
//! from then on), and its rows are copied, from the destination site's hot standby of
//! it once that has replayed the fence, into a new database on the destination's
//! primary, in one transaction that also sets the next epoch. Physical standbys
//! replicate whole servers: every other site's standby of the destination's server has
//! the new database without anyone asking.

use super::parse;
use super::schema::{SCHEMA, SCHEMA_VERSION};
use super::standby::parse_lsn;
use crate::error::MetaError;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// The sequences ids come from (`SCHEMA`), carried over with their positions.
const SEQUENCES: [&str; 3] = ["next_inode", "next_cookie", "next_session"];

/// A plain client of `url` whose statements give up after `timeout`.
fn client(url: &str, timeout: Duration) -> Result<postgres::Client, MetaError> {
    let (config, shown) = parse(url)?;
    let mut config = postgres::Config::from(config);
    config.application_name("locus-meta-move").options(&format!("-c statement_timeout={}", timeout.as_millis()));
    config.connect(postgres::NoTls).map_err(|e| MetaError::Connect { url: shown, detail: e.to_string() })
}

/// `url` naming database `database` of the same server instead of its own.
pub fn with_database(url: &str, database: &str) -> Result<String, MetaError> {
    let bad = || MetaError::UnsupportedUrl { url: url.into(), reason: "no postgres://HOST/DATABASE form".into() };
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (rest, query) = rest.split_once('?').map_or((rest, None), |(r, q)| (r, Some(q)));
    let host = rest.split_once('/').map_or(rest, |(host, _)| host);
    Ok(format!("{scheme}://{host}/{database}{}", query.map(|q| format!("?{q}")).unwrap_or_default()))
}

/// The database a `postgres://` URL names.
pub fn database_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    rest.split_once('/').map(|(_, db)| db).filter(|db| !db.is_empty())
}

/// Fences the primary at `url`: bumps its epoch (metas holding the old one have their
/// commits refused there) and drops its leases. Returns the new epoch and where its
/// commit is in the primary's log.
pub fn fence(url: &str, timeout: Duration) -> Result<(i64, u64), MetaError> {
    let mut c = client(url, timeout)?;
    let mut t = c.transaction()?;
    let epoch: i64 = t.query_one("UPDATE primary_epoch SET epoch = epoch + 1 RETURNING epoch", &[])?.get(0);
    t.execute("DELETE FROM primary_leases", &[])?;
    t.commit()?;
    let at: String = c.query_one("SELECT pg_current_wal_flush_lsn()::text", &[])?.get(0);
    Ok((epoch, lsn(&at)?))
}

fn lsn(text: &str) -> Result<u64, MetaError> {
    parse_lsn(text).ok_or_else(|| MetaError::Internal(format!("not a WAL position: {text:?}")))
}

/// The server's own `postgres` database, where databases are made and dropped (any
/// home's may be gone: moved away and dropped).
const MAINTENANCE: &str = "postgres";

/// The tables a new database has from `create_database` on, which the copy leaves
/// alone: metas open it (its identity, version and epoch) and take leases in it while
/// the rows are copied.
const MADE_WITH_THE_DATABASE: [&str; 4] = ["cluster", "meta_version", "primary_epoch", "primary_leases"];

/// The database a destination's server keeps made ahead of the next move (schema and
/// version, no cluster row, no namespace): a move's new database is then a rename, and
/// every site's standby of the server has had it for long. CREATE DATABASE copies its
/// template through the log, megabytes that a holder 100 ms away waited a second or
/// more to replay before it could open the new database. Named with the schema's
/// version, so a meta of another version never takes it.
fn spare_name() -> String {
    format!("locus_spare_v{SCHEMA_VERSION}")
}

/// Makes the spare database on the server of `server_url` (a URL of any database there)
/// unless it is there already; true when it made one. Made under another name and
/// renamed once complete, so a move never takes a half-made one; metas sharing the
/// server take turns (an advisory lock held by the maintenance connection).
pub fn make_spare(server_url: &str, timeout: Duration) -> Result<bool, MetaError> {
    let (spare, making) = (spare_name(), format!("{}_making", spare_name()));
    let mut c = client(&with_database(server_url, MAINTENANCE)?, timeout)?;
    c.execute("SELECT pg_advisory_lock(hashtext($1))", &[&spare])?;
    drop_older_spares(&mut c)?;
    if c.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&spare])?.is_some() {
        return Ok(false);
    }
    c.batch_execute(&format!("DROP DATABASE IF EXISTS \"{making}\" WITH (FORCE)"))?;
    // Through the log: STRATEGY = FILE_COPY would send less, but in a bench run with it
    // a move right after hung until its client gave up (30 s), not understood yet.
    // Its client closed: a database is renamed only with nobody connected to it.
    drop(create_with_schema(&mut c, server_url, &making, timeout)?);
    c.batch_execute(&format!("ALTER DATABASE \"{making}\" RENAME TO \"{spare}\""))?;
    Ok(true)
}

/// The error of making `database`, saying what to grant when meta's role may not make
/// databases (a role made without CREATEDB: the move fails before it changes anything).
fn creating(database: &str) -> impl FnOnce(postgres::Error) -> MetaError + '_ {
    move |e| match e.code() {
        Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => MetaError::PermissionDenied(format!(
            "cannot make database {database} ({}): a home moved into a site lives in a database of its \
             own on that site's PostgreSQL server, which meta's role must be allowed to make \
             (ALTER ROLE <role> CREATEDB)",
            super::pg_detail(&e)
        )),
        _ => e.into(),
    }
}

/// Drops the spares (and half-made ones) of schema versions older than this meta's,
/// left on the server by the metas an upgrade replaced: no meta of this version can take
/// them, and each holds a database's worth of space at every site. One whose maker still
/// runs (it holds that version's advisory lock) is left to it; newer versions' belong
/// to newer metas.
fn drop_older_spares(maintenance: &mut postgres::Client) -> Result<(), MetaError> {
    let rows = maintenance.query(
        "SELECT datname::text, substring(datname FROM '^locus_spare_v([0-9]+)')::int \
         FROM pg_database WHERE datname ~ '^locus_spare_v[0-9]+(_making)?$'",
        &[],
    )?;
    for row in rows {
        let (database, version): (String, i32) = (row.get(0), row.get(1));
        let theirs = format!("locus_spare_v{version}");
        if i64::from(version) >= SCHEMA_VERSION {
            continue;
        }
        let free: bool = maintenance.query_one("SELECT pg_try_advisory_lock(hashtext($1))", &[&theirs])?.get(0);
        if free {
            maintenance.batch_execute(&format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"))?;
            maintenance.execute("SELECT pg_advisory_unlock(hashtext($1))", &[&theirs])?;
        }
    }
    Ok(())
}

/// Creates database `database` through `maintenance`, a client of the server of
/// `server_url`, with the schema and its version and nothing else. Returns the client
/// of the new database that made its schema.
fn create_with_schema(
    maintenance: &mut postgres::Client,
    server_url: &str,
    database: &str,
    timeout: Duration,
) -> Result<postgres::Client, MetaError> {
    maintenance.batch_execute(&format!("CREATE DATABASE \"{database}\"")).map_err(creating(database))?;
    let mut d = client(&with_database(server_url, database)?, timeout)?;
    d.batch_execute(SCHEMA)?;
    d.execute("INSERT INTO meta_version (version) VALUES ($1)", &[&SCHEMA_VERSION])?;
    Ok(d)
}

/// Makes database `database` on the server of `server_url` (a URL of any database
/// there), with the schema and the cluster row of the home at `source_url`, and no
/// namespace; one left by a move that failed half way is dropped first. The server's
/// spare database becomes it when there is one (`make_spare`). Returns its URL and
/// whether the spare was taken.
pub fn create_database(
    server_url: &str,
    database: &str,
    source_url: &str,
    timeout: Duration,
) -> Result<(String, bool), MetaError> {
    check_name(database)?;
    let cluster = client(source_url, timeout)?.query_one("SELECT id, secret FROM cluster", &[])?;
    let (id, secret): (String, Option<Vec<u8>>) = (cluster.get(0), cluster.get(1));
    let mut c = client(&with_database(server_url, MAINTENANCE)?, timeout)?;
    c.batch_execute(&format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"))?;
    // No spare (none made yet, or another meta's move took it) or one in use: made here.
    let took = c.batch_execute(&format!("ALTER DATABASE \"{}\" RENAME TO \"{database}\"", spare_name())).is_ok();
    let url = with_database(server_url, database)?;
    let mut d = if took { client(&url, timeout)? } else { create_with_schema(&mut c, server_url, database, timeout)? };
    d.execute("INSERT INTO cluster (id, secret) VALUES ($1, $2)", &[&id, &secret])?;
    Ok((url, took))
}

/// Drops database `database` of the server of `server_url` (the home moved away).
pub fn drop_database(server_url: &str, database: &str, timeout: Duration) -> Result<(), MetaError> {
    check_name(database)?;
    client(&with_database(server_url, MAINTENANCE)?, timeout)?
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"))?;
    Ok(())
}

/// Database names moves make are quoted into statements: letters, digits and `_` only.
fn check_name(database: &str) -> Result<(), MetaError> {
    if database.is_empty() || !database.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(MetaError::InvalidArgument(format!(
            "{database:?}: a moving home's database is named with letters, digits and _ only"
        )));
    }
    Ok(())
}

/// Copies the namespace of the home at `source_url` (a hot standby, read once it has
/// replayed `after`, or the primary itself) into `target_url` (made by
/// `create_database`), in one transaction. Returns the rows copied and where the commit
/// is in the target's log.
pub fn copy_home(source_url: &str, after: u64, target_url: &str, timeout: Duration) -> Result<(u64, u64), MetaError> {
    let mut src = client(source_url, timeout)?;
    let deadline = Instant::now() + timeout;
    loop {
        let at: String =
            src.query_one("SELECT COALESCE(pg_last_wal_replay_lsn(), pg_current_wal_flush_lsn())::text", &[])?.get(0);
        if lsn(&at)? >= after {
            break;
        }
        if Instant::now() > deadline {
            return Err(MetaError::TimedOut { db: source_url.into(), after: timeout });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut src =
        src.build_transaction().isolation_level(postgres::IsolationLevel::RepeatableRead).read_only(true).start()?;
    let tables: Vec<String> = src
        .query("SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1", &[])?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|t| !MADE_WITH_THE_DATABASE.contains(&t.as_str()))
        .collect();
    let mut dst = client(target_url, timeout)?;
    let mut t = dst.transaction()?;
    t.batch_execute(&format!("TRUNCATE {}", tables.join(", ")))?;
    let mut rows = 0;
    let mut data = Vec::new();
    for table in &tables {
        data.clear();
        let copy_failed =
            |e: std::io::Error| MetaError::Database { backend: "postgres", detail: format!("{table}: {e}") };
        src.copy_out(&format!("COPY {table} TO STDOUT (FORMAT binary)"))?
            .read_to_end(&mut data)
            .map_err(copy_failed)?;
        let mut into = t.copy_in(&format!("COPY {table} FROM STDIN (FORMAT binary)"))?;
        into.write_all(&data).map_err(copy_failed)?;
        rows += into.finish()?;
    }
    for sequence in SEQUENCES {
        let row = src.query_one(&format!("SELECT last_value, is_called FROM {sequence}"), &[])?;
        let (value, called): (i64, bool) = (row.get(0), row.get(1));
        t.query_one("SELECT setval($1::text::regclass, $2, $3)", &[&sequence, &value, &called])?;
    }
    t.commit()?;
    src.commit()?;
    let at: String = dst.query_one("SELECT pg_current_wal_flush_lsn()::text", &[])?.get(0);
    Ok((rows, lsn(&at)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_another_database_of_the_same_server() {
        let url = "postgres://locus@10.0.0.1:5432/home_b?connect_timeout=5";
        assert_eq!(
            with_database(url, "home_b_m1").unwrap(),
            "postgres://locus@10.0.0.1:5432/home_b_m1?connect_timeout=5"
        );
        assert_eq!(with_database("postgres://h:1", "x").unwrap(), "postgres://h:1/x");
        assert_eq!(database_of(url), Some("home_b"));
        assert_eq!(database_of("postgres://h:1/"), None);
        assert!(with_database("not a url", "x").is_err());
        assert!(check_name("a;DROP").is_err() && check_name("").is_err() && check_name("hb_m2").is_ok());
    }
}
