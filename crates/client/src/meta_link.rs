//! The client's control path: one connection pool to meta, the session it opened there,
//! and typed helpers for the answers the client expects.

use crate::error::VfsError;
use net::RpcClient;
use proto::error::ErrorCode;
use proto::meta::{Hello, MetaMessage, SessionInfo};
use proto::types::SessionId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

type Result<T> = std::result::Result<T, VfsError>;

/// Meta as this client talks to it.
pub(crate) struct MetaLink {
    rpc: RpcClient,
    session: AtomicU64,
    info: SessionInfo,
}

impl MetaLink {
    /// Connects to meta; the session is opened by `hello`.
    pub async fn connect(addr: &str, connections: usize, timeout: Duration, info: SessionInfo) -> Result<MetaLink> {
        let rpc = RpcClient::connect(addr, connections, timeout)
            .await
            .map_err(|e| VfsError::new(ErrorCode::Io, format!("meta unreachable: {e}")))?;
        Ok(MetaLink { rpc, session: AtomicU64::new(0), info })
    }

    /// Opens a (new) session; returns how often meta wants a heartbeat.
    pub async fn hello(&self) -> Result<Duration> {
        let welcome = self.call(Hello { protocol: proto::PROTOCOL_VERSION, session: self.info.clone() }).await?;
        self.session.store(welcome.session, Ordering::Relaxed);
        Ok(Duration::from_millis(welcome.heartbeat_ms.max(100)))
    }

    /// The session meta gave this client.
    pub fn session(&self) -> SessionId {
        self.session.load(Ordering::Relaxed)
    }

    /// Sends one request and returns its typed answer.
    pub async fn call<M: MetaMessage>(&self, msg: M) -> Result<M::Response> {
        Ok(self.rpc.ask(msg).await??)
    }
}
