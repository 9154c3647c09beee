//! The client's control path: one connection pool to meta, the session it opened there,
//! and typed helpers for the answers the client expects.

use crate::error::VfsError;
use net::RpcClient;
use proto::error::ErrorCode;
use proto::meta::{MetaReply, MetaRequest, MetaResult, SessionInfo};
use proto::types::{Attr, SessionId};
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
        let req = MetaRequest::Hello { protocol: proto::PROTOCOL_VERSION, session: self.info.clone() };
        match self.call(req).await? {
            MetaReply::Welcome { session, heartbeat_ms, .. } => {
                self.session.store(session, Ordering::Relaxed);
                Ok(Duration::from_millis(heartbeat_ms.max(100)))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// The session meta gave this client.
    pub fn session(&self) -> SessionId {
        self.session.load(Ordering::Relaxed)
    }

    pub async fn call(&self, req: MetaRequest) -> Result<MetaReply> {
        let res: MetaResult = self.rpc.call(&req).await?;
        Ok(res?)
    }

    /// A request answered with attributes.
    pub async fn attr(&self, req: MetaRequest) -> Result<Attr> {
        match self.call(req).await? {
            MetaReply::Attr(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    /// A request answered with `Done`.
    pub async fn done(&self, req: MetaRequest) -> Result<()> {
        match self.call(req).await? {
            MetaReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

/// Meta answered with a variant the request does not call for.
pub(crate) fn unexpected(reply: &MetaReply) -> VfsError {
    VfsError::new(ErrorCode::Internal, format!("meta answered with an unexpected {reply:?}"))
}
