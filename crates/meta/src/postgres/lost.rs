//! What a failover from an asynchronous standby lost: the old primary's database (its
//! server started again once its site is back; its epoch is fenced, so nothing more
//! commits there) against the promoted one, from the last commit the standby had
//! replayed when it was promoted (`promote` records it in the promoted database).
//! Both held the same rows at that commit: an inode the old primary changed since, or
//! a directory whose entries it changed since, that differs at the promoted database is
//! a change acknowledged to someone and lost by the failover.

use crate::error::MetaError;
use crate::store::values::kind_code;
use proto::types::{FileKind, ROOT_INODE};
use std::collections::{BTreeMap, BTreeSet};

use super::conn::{PgConn, connect};
use super::parse;

/// The name of the counter `promote` keeps the promoted standby's last replayed commit
/// in (ms since the Unix epoch), per epoch.
pub(super) fn replayed_counter(epoch: i64) -> String {
    format!("replayed-ms-epoch-{epoch}")
}

/// Changes of the clock between meta (inode times) and PostgreSQL (commit times)
/// allowed for: rows changed this long before the failover point are compared too
/// (unchanged ones compare equal and are not reported).
const CLOCK_MARGIN_MS: i64 = 2_000;

/// What `lost` found.
#[derive(Debug)]
pub struct Lost {
    /// The failover point: the last commit the promoted standby had replayed, in ms
    /// since the Unix epoch.
    pub since_ms: i64,
    /// Every change of the old primary since then that the promoted database lacks.
    pub changes: Vec<LostChange>,
}

/// One change acknowledged at the old primary and missing at the promoted database.
#[derive(Debug, PartialEq, Eq)]
pub struct LostChange {
    /// The path the file or directory had at the old primary.
    pub path: String,
    pub what: LostKind,
}

/// How a change was lost.
#[derive(Debug, PartialEq, Eq)]
pub enum LostKind {
    /// The inode exists only at the old primary: made there after the failover point
    /// (or removed at the promoted database since).
    OnlyAtOld,
    /// Its attributes (size, mode, owner, times, links) differ: changed at the old
    /// primary after the failover point (or at both).
    Changed,
    /// The directory's entries differ: names only at the old primary, and names only at
    /// the promoted database (removed at the old one, or made at the new one since).
    Entries { only_at_old: Vec<String>, only_at_new: Vec<String> },
}

impl std::fmt::Display for LostKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostKind::OnlyAtOld => write!(f, "only at the old primary"),
            LostKind::Changed => write!(f, "attributes changed at the old primary"),
            LostKind::Entries { only_at_old, only_at_new } => {
                write!(f, "entries differ: only at the old primary [{}]", only_at_old.join(", "))?;
                write!(f, ", only at the new one [{}]", only_at_new.join(", "))
            }
        }
    }
}

/// The columns compared per inode (all but atime, which reads change), the inode
/// number first.
macro_rules! inode_columns {
    () => {
        "SELECT ino, kind, mode, uid, gid, size, nlink, rdev, mtime_s, mtime_ns, ctime_s, ctime_ns FROM inodes "
    };
}

/// Compares the old primary's database at `old_url` with the promoted one at
/// `new_url` from the failover point `since_ms` (by default, what `promote` recorded).
pub fn lost(old_url: &str, new_url: &str, since_ms: Option<i64>) -> Result<Lost, MetaError> {
    let mut old = open(old_url)?;
    let mut new = open(new_url)?;
    // A database of another cluster (a careless operator's wrong URL) would differ
    // everywhere: refused, not listed.
    let cluster_of =
        |conn: &mut PgConn| -> Result<String, MetaError> { Ok(conn.one("SELECT id FROM cluster", &[])?.try_get(0)?) };
    let (old_cluster, new_cluster) = (cluster_of(&mut old)?, cluster_of(&mut new)?);
    if old_cluster != new_cluster {
        return Err(MetaError::InvalidArgument(format!(
            "{old_url} holds cluster {old_cluster} and {new_url} cluster {new_cluster}: not a primary and the \
             standby promoted in its place"
        )));
    }
    let since_ms = match since_ms {
        Some(ms) => ms,
        None => {
            let epoch: i64 = new.one("SELECT epoch FROM primary_epoch", &[])?.try_get(0)?;
            let rows = new.query("SELECT value FROM counters WHERE name = $1", &[&replayed_counter(epoch)])?;
            match rows.first() {
                Some(row) => row.try_get(0)?,
                None => {
                    return Err(MetaError::InvalidArgument(format!(
                        "{new_url} holds no failover point for its epoch {epoch} (it was not promoted from a \
                         standby by `locus meta promote`): give the time of the standby's last replayed commit"
                    )));
                }
            }
        }
    };
    let from = since_ms - CLOCK_MARGIN_MS;
    let changed_since = |conn: &mut PgConn| -> Result<BTreeMap<i64, Vec<i64>>, MetaError> {
        let sql = concat!(
            inode_columns!(),
            "WHERE ctime_s * 1000 + ctime_ns / 1000000 >= $1 OR mtime_s * 1000 + mtime_ns / 1000000 >= $1"
        );
        rows_by_ino(conn.query(sql, &[&from])?)
    };
    let at_old = changed_since(&mut old)?;
    let inos: Vec<i64> = at_old.keys().copied().collect();
    let at_new = rows_by_ino(new.query(concat!(inode_columns!(), "WHERE ino = ANY($1)"), &[&inos])?)?;
    let directory = kind_code(FileKind::Dir);
    let mut changes = Vec::new();
    for (ino, row) in &at_old {
        let what = match at_new.get(ino) {
            None => Some(LostKind::OnlyAtOld),
            Some(other) if other != row => Some(LostKind::Changed),
            Some(_) => None,
        };
        let mut found: Vec<LostKind> = what.into_iter().collect();
        if row[0] == directory && at_new.contains_key(ino) {
            let (names_old, names_new) = (names(&mut old, *ino)?, names(&mut new, *ino)?);
            let only_at_old: Vec<String> = names_old.difference(&names_new).cloned().collect();
            let only_at_new: Vec<String> = names_new.difference(&names_old).cloned().collect();
            if !only_at_old.is_empty() || !only_at_new.is_empty() {
                found.push(LostKind::Entries { only_at_old, only_at_new });
            }
        }
        if !found.is_empty() {
            let path = path_of(&mut old, *ino)?;
            changes.extend(found.into_iter().map(|what| LostChange { path: path.clone(), what }));
        }
    }
    Ok(Lost { since_ms, changes })
}

fn open(url: &str) -> Result<PgConn, MetaError> {
    let (config, shown) = parse(url)?;
    connect(&config, &shown, None)
}

/// Each row's columns after the first, by its first (the inode number).
fn rows_by_ino(rows: Vec<postgres::Row>) -> Result<BTreeMap<i64, Vec<i64>>, MetaError> {
    let mut out = BTreeMap::new();
    for row in rows {
        let values = (1..row.len()).map(|i| row.try_get(i)).collect::<Result<Vec<i64>, _>>()?;
        out.insert(row.try_get(0)?, values);
    }
    Ok(out)
}

/// The names in directory `dir`, shown as text.
fn names(conn: &mut PgConn, dir: i64) -> Result<BTreeSet<String>, MetaError> {
    let rows = conn.query("SELECT name FROM dentries WHERE parent = $1", &[&dir])?;
    rows.iter().map(|r| Ok(String::from_utf8_lossy(&r.try_get::<_, Vec<u8>>(0)?).into_owned())).collect()
}

/// A path of inode `ino` (one of its names, for a file with several), or where the
/// walk up stopped.
fn path_of(conn: &mut PgConn, ino: i64) -> Result<String, MetaError> {
    let mut parts = Vec::new();
    let mut at = ino;
    while at != ROOT_INODE as i64 && parts.len() < 4096 {
        let rows = conn.query("SELECT parent, name FROM dentries WHERE ino = $1 LIMIT 1", &[&at])?;
        let Some(row) = rows.first() else {
            parts.push(format!("<inode {at}, no name>"));
            break;
        };
        parts.push(String::from_utf8_lossy(&row.try_get::<_, Vec<u8>>(1)?).into_owned());
        at = row.try_get(0)?;
    }
    parts.reverse();
    Ok(format!("/{}", parts.join("/")))
}
