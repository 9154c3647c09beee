//! Every type that crosses a process boundary (wire) or is persisted (disk), and the
//! frame codec that carries them. Nothing here does I/O, so every other crate can
//! share these definitions and the decoders can be fuzzed in isolation.

pub mod cap;
pub mod error;
pub mod extent;
pub mod frame;
pub mod meta;
pub mod node;
pub mod placement;
pub mod policy;
pub mod types;

/// Version of the RPC protocol; meta refuses a `Hello` that names any other version
/// (an exact match: there are no compatible minor versions yet).
pub const PROTOCOL_VERSION: u32 = 9;

/// A typed request: the wire form it travels in and what its caller gets back, so a
/// transport can offer one typed `ask` for every protocol.
pub trait Call {
    /// The request as it travels (a protocol's request enum).
    type Wire: serde::Serialize;
    /// The answer as it travels.
    type Answer: serde::de::DeserializeOwned;
    /// What the caller gets from a successful answer.
    type Output;
    fn into_wire(self) -> Self::Wire;
    /// Unpacks the answer; a refusal or an answer of the wrong kind is an error.
    fn output(answer: Self::Answer) -> Result<Self::Output, error::WireError>;
}
