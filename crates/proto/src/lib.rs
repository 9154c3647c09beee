//! Every type that crosses a process boundary (wire) or is persisted (disk), and the
//! frame codec that carries them. Nothing here does I/O, so every other crate can
//! share these definitions and the decoders can be fuzzed in isolation.

pub mod error;
pub mod extent;
pub mod frame;
pub mod meta;
pub mod node;
pub mod placement;
pub mod types;

/// Version of the RPC protocol; meta refuses a `Hello` that names any other version
/// (an exact match: there are no compatible minor versions yet).
pub const PROTOCOL_VERSION: u32 = 1;
