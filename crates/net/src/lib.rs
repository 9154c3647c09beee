//! Connections between Locus processes: a multiplexed, pipelined RPC over TCP. Many
//! requests share one connection and are answered in any order, so a caller never
//! waits a round trip per request; a pool of connections spreads large transfers.

mod client;
mod directory;
mod server;

pub use client::RpcClient;
pub use directory::{NodeDirectory, PoolSize};
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
    #[error("node {0} is not known to meta")]
    UnknownNode(String),
    #[error("malformed frame: {0}")]
    Frame(#[from] proto::frame::FrameError),
}

/// Socket settings for every connection of this process.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// TCP congestion control to ask for (e.g. `bbr`, which keeps a long path full
    /// despite random loss); silently kept at the system default when unavailable.
    pub congestion: Option<String>,
    /// Fixed send and receive buffers (bandwidth x RTT); `None` leaves the kernel's
    /// autotuning in charge, bounded by `net.ipv4.tcp_rmem`/`tcp_wmem`.
    pub buffer_bytes: Option<usize>,
}

static TRANSPORT: std::sync::OnceLock<Transport> = std::sync::OnceLock::new();

/// Sets the process's socket settings; the first call wins (the binary calls it once).
pub fn configure(transport: Transport) {
    let _ = TRANSPORT.set(transport);
}

/// Socket options every Locus connection gets.
fn tune(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let _ = stream.set_nodelay(true);
    let Some(t) = TRANSPORT.get() else { return };
    let fd = stream.as_raw_fd();
    if let Some(cc) = &t.congestion {
        // SAFETY: fd is a live socket; the option value is a byte string of the given length.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                cc.as_ptr().cast(),
                cc.len() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!(congestion = %cc, "congestion control unavailable: {}", std::io::Error::last_os_error());
        }
    }
    if let Some(bytes) = t.buffer_bytes {
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: as above, with an int option value.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
}

/// Reads exactly `len` bulk bytes into fresh, uninitialised memory (no zero-fill pass
/// over chunk-sized buffers).
async fn read_bulk<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, len: usize) -> std::io::Result<bytes::Bytes> {
    use tokio::io::AsyncReadExt;
    let mut buf = bytes::BytesMut::with_capacity(len);
    while buf.len() < len {
        let mut limited = (&mut *reader).take((len - buf.len()) as u64);
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn congestion_control_and_buffers_are_applied() {
        configure(Transport { congestion: Some("reno".into()), buffer_bytes: Some(1 << 20) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        tune(&stream);
        use std::os::fd::AsRawFd;
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: a live socket and a buffer of the stated length.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        assert!(name.starts_with(b"reno"), "{:?}", String::from_utf8_lossy(&name));
        let mut buf: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as above.
        unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&mut buf as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert!(buf > 64 << 10, "receive buffer stayed at {buf}");
    }
}
