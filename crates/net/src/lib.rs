//! Connections between Locus processes: a multiplexed, pipelined RPC over TCP. Many
//! requests share one connection and are answered in any order, so a caller never
//! waits a round trip per request; a pool of connections spreads large transfers.
//! Either end may ask: a server can push requests to a client on the client's own
//! connection. Every resource a peer can make the other end hold is bounded
//! (`Limits`), and every wait on a peer has a deadline.

mod client;
mod conn;
mod directory;
pub mod pki;
mod server;
mod tls;

pub use client::{PushHandler, RpcClient};
pub use directory::{NodeDirectory, PoolSize};
pub use server::{ConnHandle, Peer, Service, serve, serve_as, serve_with};
pub use tls::{
    PeerIdentity, ROLE_URI_PREFIX, Role, Security, Tls, TlsError, certificate_name, own_identity, parse_role_uri,
    revocation_covers, role_uri, secure, server_config, set_revoked,
};

use proto::error::ErrorCode;
use std::time::Duration;

/// What can go wrong moving a message. A peer that does not answer in time
/// (`Timeout`) is told apart from one that is gone (`Connect`, `Disconnected`).
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The peer refused the connection or cannot be reached.
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    /// The connection broke; the peer may or may not have acted on the request.
    #[error("connection to {addr} lost: {reason}")]
    Disconnected { addr: String, reason: String },
    /// The peer did not complete `what` (connect, send or answer) in time: it is hung
    /// or too slow.
    #[error("{what} to {addr} timed out after {after:?}")]
    Timeout { addr: String, what: &'static str, after: Duration },
    /// The handshake failed or the peer's certificate is not acceptable (wrong CA,
    /// expired, revoked, wrong role, or a peer without TLS).
    #[error("connection to {addr} refused: {reason}")]
    Refused { addr: String, reason: String },
    /// A node id that meta has not told this process about.
    #[error("node {0} is not known to meta")]
    UnknownNode(String),
    /// The peer sent bytes that are not a valid frame or message.
    #[error("malformed frame: {0}")]
    Frame(#[from] proto::frame::FrameError),
}

impl NetError {
    /// The code a caller reports: `TimedOut` for a hung peer, `Unreachable` for a dead
    /// one, `Internal` for a frame that does not decode.
    pub fn code(&self) -> ErrorCode {
        match self {
            NetError::Timeout { .. } => ErrorCode::TimedOut,
            NetError::Connect { .. }
            | NetError::Disconnected { .. }
            | NetError::UnknownNode(_)
            | NetError::Refused { .. } => ErrorCode::Unreachable,
            NetError::Frame(_) => ErrorCode::Internal,
        }
    }
}

/// What one peer, and all peers together, may make a server hold. The defaults suit
/// a production meta or node; tests shorten the times.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections; at the cap, the connection idle the longest is closed for a
    /// new one (or the new one is refused when none is idle).
    pub max_connections: usize,
    /// Requests read but not yet answered, per connection; beyond it the server stops
    /// reading that connection until answers drain (backpressure).
    pub max_in_flight: usize,
    /// Request bytes buffered per connection (at least one largest frame).
    pub conn_buffer_bytes: usize,
    /// Request bytes buffered over all connections (at least one largest frame).
    pub total_buffer_bytes: usize,
    /// A connection with nothing in flight for this long is closed.
    pub idle_timeout: Duration,
    /// A frame whose first byte arrived must be complete within this time (slow peers).
    pub frame_timeout: Duration,
    /// An answer or push must be written within this time, or the connection is
    /// closed (a peer that never reads cannot pile answers up).
    pub send_timeout: Duration,
    /// A new connection must finish its TLS handshake within this time.
    pub handshake_timeout: Duration,
    /// Connections still in their handshake; beyond it new ones are dropped at once
    /// (a flood of silent sockets cannot hold every slot).
    pub max_handshakes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_in_flight: 256,
            conn_buffer_bytes: 128 << 20,
            total_buffer_bytes: 512 << 20,
            idle_timeout: Duration::from_secs(600),
            frame_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            max_handshakes: 1024,
        }
    }
}

/// The largest frame a peer may send: every buffer cap holds at least one.
pub(crate) const MAX_FRAME: usize = proto::frame::MAX_PAYLOAD as usize + proto::frame::MAX_BULK as usize;

static LIMITS: std::sync::OnceLock<Limits> = std::sync::OnceLock::new();

/// Sets the limits `serve` applies in this process; the first call wins (the binary
/// calls it once).
pub fn set_limits(limits: Limits) {
    let _ = LIMITS.set(limits);
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

/// Asks for congestion control `cc` on socket `fd` (a live socket); false if refused.
fn set_congestion(fd: std::os::fd::RawFd, cc: &str) -> bool {
    // SAFETY: fd is a live socket; the option value is a byte string of the given length.
    let r = unsafe {
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, cc.as_ptr().cast(), cc.len() as libc::socklen_t)
    };
    if r != 0 {
        tracing::debug!(congestion = %cc, "congestion control unavailable: {}", std::io::Error::last_os_error());
    }
    r == 0
}

/// Starts the congestion control of a live connection's socket over, when the
/// process asks for one (`restart_congestion`).
pub(crate) fn restart_congestion_control(fd: std::os::fd::RawFd) {
    if let Some(cc) = TRANSPORT.get().and_then(|t| t.congestion.as_deref()) {
        restart_congestion(fd, cc);
    }
}

/// Re-initializes congestion control `cc` on socket `fd`: the kernel ignores a request
/// for the algorithm in use, so the socket passes through `reno` (always built in).
fn restart_congestion(fd: std::os::fd::RawFd, cc: &str) {
    set_congestion(fd, "reno");
    set_congestion(fd, cc);
}

/// Socket options every Locus connection gets.
fn tune(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let _ = stream.set_nodelay(true);
    let Some(t) = TRANSPORT.get() else { return };
    let fd = stream.as_raw_fd();
    if let Some(cc) = &t.congestion {
        set_congestion(fd, cc);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// BBR's bandwidth estimate on socket `fd` (`TCP_CC_INFO`'s `tcp_bbr_info`: bw_lo,
    /// bw_hi, min_rtt, pacing_gain, cwnd_gain, each a u32).
    fn bbr_bandwidth(fd: std::os::fd::RawFd) -> u64 {
        let mut info = [0u32; 5];
        let mut len = size_of_val(&info) as libc::socklen_t;
        // SAFETY: a live socket and a buffer of the stated length.
        let r =
            unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CC_INFO, info.as_mut_ptr().cast(), &mut len) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        (u64::from(info[1]) << 32) | u64::from(info[0])
    }

    /// A restart makes BBR forget the bandwidth it measured (it probes afresh).
    #[tokio::test]
    async fn a_restart_makes_bbr_forget_the_bandwidth_it_measured() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut receiver = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut sender, _) = listener.accept().await.unwrap();
        if !set_congestion(sender.as_raw_fd(), "bbr") {
            eprintln!("SKIPPED: this kernel offers no BBR");
            return;
        }
        let read = tokio::spawn(async move {
            let mut all = vec![0u8; 16 << 20];
            receiver.read_exact(&mut all).await.unwrap();
            receiver
        });
        sender.write_all(&vec![7u8; 16 << 20]).await.unwrap();
        let _receiver = read.await.unwrap();
        // Everything arrived; its last acknowledgements land within moments on loopback,
        // and nothing in flight afterwards gives BBR a new sample.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(bbr_bandwidth(sender.as_raw_fd()) > 0, "BBR measured nothing");
        restart_congestion(sender.as_raw_fd(), "bbr");
        assert_eq!(bbr_bandwidth(sender.as_raw_fd()), 0, "the estimate survived the restart");
    }

    #[tokio::test]
    async fn congestion_control_and_buffers_are_applied() {
        configure(Transport { congestion: Some("reno".into()), buffer_bytes: Some(1 << 20) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        tune(&stream);
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
