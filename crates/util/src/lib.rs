//! Process plumbing shared by every Locus service (meta, node, client): background
//! workers with visible status, single-flight for concurrent misses, and the one
//! policy for poisoned locks. Nothing here knows about files, chunks or the network.

pub mod single_flight;
pub mod sync;
pub mod worker;
