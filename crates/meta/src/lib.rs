//! The metadata service of Locus: namespace, extents, chunk catalogue, sessions and
//! byte-range locks. POSIX rules live once in `ops` above the small `MetaStore`
//! backend trait; SQLite is the first backend.

mod error;
mod locks;
mod opens;
mod ops;
mod service;
mod sqlite;
mod store;

#[cfg(test)]
mod conformance;

pub use error::MetaError;
pub use service::{MetaConfig, MetaService};
