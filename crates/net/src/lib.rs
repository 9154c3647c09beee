//! Connections between Locus processes: a multiplexed, pipelined RPC over TCP. Many
//! requests share one connection and are answered in any order, so a caller never
//! waits a round trip per request; a pool of connections spreads large transfers.

mod client;
mod server;

pub use client::RpcClient;
pub use server::{Service, serve};

/// What can go wrong moving a message.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("connection to {addr} lost: {reason}")]
    Disconnected { addr: String, reason: String },
    #[error("no answer from {addr} within {secs} s")]
    Timeout { addr: String, secs: u64 },
    #[error("malformed frame: {0}")]
    Frame(#[from] proto::frame::FrameError),
}

/// Socket options every Locus connection gets.
fn tune(stream: &tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
}
