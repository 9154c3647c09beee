//! The conformance suite every metadata backend must pass: each case drives a
//! `MetaService` over the backend through `MetaRequest`s and checks POSIX results,
//! error codes and exact chunk refcounts. `conformance_tests!` makes one `#[test]`
//! per case, so that a single case runs alone (`cargo test -p meta conformance::postgres_cases::rmdir`)
//! and a backend outside this crate runs the same suite (feature `conformance`).

pub mod cases;

pub use cases::test_config;

use crate::service::MetaService;
use std::sync::Arc;

/// A backend under test. `open` starts a service over the same underlying database
/// each time it is called (cases reopen it to check persistence and restarts).
pub trait Factory {
    /// A service over the database, as if meta had (re)started.
    fn open(&self) -> Arc<MetaService>;
}

/// Expands to one `#[test]` per conformance case, each calling `$fresh()` for a new
/// `Factory` (over an empty database). Use it in a module of its own:
/// `mod conformance { meta::conformance_tests!(crate::my_backend::fresh); }`.
#[macro_export]
macro_rules! conformance_tests {
    ($fresh:path) => {
        $crate::conformance_tests!(@cases $fresh;
            root_and_create, names_are_checked, setgid_inheritance, hard_links, unlink_orphan_release,
            rmdir, rename_replace, rename_noreplace_exchange, rename_dirs, setattr_truncate,
            commit_write_splits, compact_checks_the_version, fallocate, open_truncate_and_sync, xattrs,
            readdir_paging, persistence, nodes, cluster_identity, sessions, session_expiry,
            opens_and_locks_survive_a_restart, locks, chunk_catalogue, site_round_trips, replication_policies,
            node_drain, under_replication, node_admission, join_tokens, permissions, reach_by_inode_number,
            privileges_drop_on_change, chunk_possession, acls);
    };
    (@cases $fresh:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let factory = $fresh();
                $crate::conformance::cases::$case(&factory);
            }
        )*
    };
}

// Both built-in backends run every case: `cargo test -p meta conformance` runs
// `sqlite_cases::*` and `postgres_cases::*`.

/// The SQLite backend on a real file in a temporary directory.
#[cfg(test)]
pub struct SqliteFactory {
    dir: tempfile::TempDir,
}

#[cfg(test)]
impl Factory for SqliteFactory {
    fn open(&self) -> Arc<MetaService> {
        MetaService::open(&test_config(self.dir.path().join("meta.db"))).expect("open sqlite")
    }
}

/// A factory over a new, empty SQLite database.
#[cfg(test)]
fn sqlite() -> SqliteFactory {
    SqliteFactory { dir: tempfile::tempdir().expect("tempdir") }
}

#[cfg(test)]
mod sqlite_cases {
    crate::conformance_tests!(super::sqlite);
}

/// A database of its own on the PostgreSQL server the tests share (started by
/// `testkit::postgres`, stopped after the last test using it).
#[cfg(test)]
pub struct PostgresFactory {
    url: String,
    _server: Arc<testkit::postgres::PgServer>,
}

#[cfg(test)]
impl Factory for PostgresFactory {
    fn open(&self) -> Arc<MetaService> {
        let config = crate::service::MetaConfig { db_url: self.url.clone(), ..test_config(Default::default()) };
        MetaService::open(&config).expect("open postgres")
    }
}

/// A factory over a new, empty PostgreSQL database.
#[cfg(test)]
fn postgres() -> PostgresFactory {
    let server = testkit::postgres::shared();
    PostgresFactory { url: server.create_database(), _server: server }
}

#[cfg(test)]
mod postgres_cases {
    crate::conformance_tests!(super::postgres);
}
