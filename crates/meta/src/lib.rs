//! The metadata service of Locus: namespace, extents, chunk catalogue, sessions and
//! byte-range locks. POSIX rules live once in `ops` and group commit and the read pool
//! once in `engine`, above the row-level backend traits of `store`; the backends are SQLite
//! (embedded, the default) and PostgreSQL, chosen by URL in `open_store`.

pub mod acl;
mod audit;
pub mod authority;
mod cross;
mod engine;
mod error;
pub mod homes;
mod identity;
mod locks;
mod migrate;
mod moving;
mod ops;
mod postgres;
mod service;
mod sqlite;
mod store;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use engine::{Store, open_store, probe_database};
pub use error::MetaError;
pub use identity::{Acting, Identities, MapFile, NOBODY, PRINCIPAL_BASE, parse_map};
pub use locks::Held;
pub use migrate::migrate;
pub use moving::{AutoMove, SiteConfig};
pub use postgres::{Lost, LostChange, LostKind, Promotion, lost, promote};
pub use service::{DEFAULT_DB_TIMEOUT, HomeConfig, InProcessClient, MetaConfig, MetaService, ROOT_HOME};
pub use store::{
    Backend, Counter, DentryRow, Inode, OpenRow, ReadConn, ReadOp, SessionRow, Txn, WriteConn, WriterLease,
};
