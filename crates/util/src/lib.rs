//! Process plumbing shared by every Locus service (meta, node, client): background
//! workers with visible status, single-flight for concurrent misses, the one policy
//! for poisoned locks, and crash points for tests. Nothing here knows about chunks or the network.

pub mod failpoint;
pub mod single_flight;
pub mod sync;
pub mod worker;
