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

/// The sending half of a connection, shared by every task that sends on it. A sender
/// writes its own frame under a lock instead of handing it to a writer task: one task
/// wake-up less per message, which is most of the cost of a small request.
#[derive(Clone)]
struct FrameWriter {
    half: std::sync::Arc<tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>>,
}

impl FrameWriter {
    fn new(half: tokio::net::tcp::OwnedWriteHalf) -> Self {
        FrameWriter { half: std::sync::Arc::new(tokio::sync::Mutex::new(half)) }
    }

    /// Writes header and payload, then the bulk bytes, as one uninterrupted frame.
    async fn send(&self, frame: &[u8], bulk: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut half = self.half.lock().await;
        half.write_all(frame).await?;
        if !bulk.is_empty() {
            half.write_all(bulk).await?;
        }
        Ok(())
    }
}
