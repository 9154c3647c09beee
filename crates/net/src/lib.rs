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

/// Writes queued frames (header and payload, then bulk) until the queue closes or the
/// socket fails; frames queued together go out in one flush.
async fn write_frames(
    writer: tokio::net::tcp::OwnedWriteHalf,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<(Vec<u8>, bytes::Bytes)>,
) {
    use tokio::io::AsyncWriteExt;
    let mut writer = tokio::io::BufWriter::with_capacity(256 << 10, writer);
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        while let Some((frame, bulk)) = next {
            if writer.write_all(&frame).await.is_err() || writer.write_all(&bulk).await.is_err() {
                return;
            }
            next = queue.try_recv().ok();
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
}
