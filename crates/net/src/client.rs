//! The calling side: a pool of connections to one peer, each with a writer task and a
//! reader task that routes responses back to their callers by request id.

use crate::{FrameWriter, NetError, tune};
use bytes::Bytes;
use proto::error::WireError;
use proto::frame::{self, FrameKind, HEADER_LEN, Header};
use serde::{Serialize, de::DeserializeOwned};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Answers on their way back: payload and bulk bytes.
type Answer = (Vec<u8>, Bytes);
type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Answer>>>>>;

/// One live connection. `pending` becomes `None` when the connection dies.
struct Conn {
    writer: FrameWriter,
    pending: Pending,
}

impl Conn {
    fn is_alive(&self) -> bool {
        self.pending.lock().expect("pending lock").is_some()
    }
}

/// A pool of pipelined connections to one peer that reconnects lazily after a failure.
pub struct RpcClient {
    addr: String,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next_slot: AtomicUsize,
    next_id: AtomicU64,
    timeout: Duration,
}

impl RpcClient {
    /// A client with `connections` sockets to `addr`; the first is opened now so a
    /// wrong address fails here, the rest on first use.
    pub async fn connect(addr: &str, connections: usize, timeout: Duration) -> Result<Self, NetError> {
        let client = RpcClient {
            addr: addr.to_string(),
            slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            timeout,
        };
        client.conn(0).await?;
        Ok(client)
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Connections in the pool: how many transfers can stream side by side.
    pub fn connections(&self) -> usize {
        self.slots.len()
    }

    async fn conn(&self, slot: usize) -> Result<Arc<Conn>, NetError> {
        let mut guard = self.slots[slot].lock().await;
        if let Some(c) = guard.as_ref()
            && c.is_alive()
        {
            return Ok(c.clone());
        }
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|source| NetError::Connect { addr: self.addr.clone(), source })?;
        tune(&stream);
        let conn = Arc::new(start_conn(stream, self.addr.clone()));
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Sends `req` and waits for its answer. Requests from concurrent callers are
    /// pipelined on the pool's connections.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(&self, req: &Req) -> Result<Resp, NetError> {
        Ok(self.call_bulk(req, Bytes::new()).await?.0)
    }

    /// Sends a typed request and returns its typed answer: the outer error is the
    /// transport's, the inner one the peer's refusal.
    pub async fn ask<C: proto::Call>(&self, req: C) -> Result<Result<C::Output, WireError>, NetError> {
        let answer: C::Answer = self.call(&req.into_wire()).await?;
        Ok(C::output(answer))
    }

    /// Like `call`, with bulk bytes (chunk data) sent after the request and returned
    /// after the answer, never copied through the codec.
    pub async fn call_bulk<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        req: &Req,
        bulk: Bytes,
    ) -> Result<(Resp, Bytes), NetError> {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let conn = self.conn(slot).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bytes = frame::encode(FrameKind::Request, id, req, bulk.len())?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = conn.pending.lock().expect("pending lock");
            match pending.as_mut() {
                Some(map) => map.insert(id, tx),
                None => return Err(self.lost("connection closed")),
            };
        }
        if let Err(e) = conn.writer.send(&bytes, &bulk).await {
            // The stream may hold half a frame now: nobody can use it any more.
            conn.pending.lock().expect("pending lock").take();
            return Err(self.lost(&format!("cannot send: {e}")));
        }
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok((payload, bulk))) => Ok((frame::decode(&payload)?, bulk)),
            Ok(Err(_)) => Err(self.lost("peer closed the connection")),
            Err(_) => {
                if let Some(map) = conn.pending.lock().expect("pending lock").as_mut() {
                    map.remove(&id);
                }
                Err(NetError::Timeout { addr: self.addr.clone(), secs: self.timeout.as_secs() })
            }
        }
    }

    fn lost(&self, reason: &str) -> NetError {
        NetError::Disconnected { addr: self.addr.clone(), reason: reason.to_string() }
    }
}

fn start_conn(stream: TcpStream, addr: String) -> Conn {
    let (mut reader, writer) = stream.into_split();
    let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));

    let routes = pending.clone();
    tokio::spawn(async move {
        let reason = loop {
            let mut head = [0u8; HEADER_LEN];
            if let Err(e) = reader.read_exact(&mut head).await {
                break e.to_string();
            }
            let header = match Header::decode(&head) {
                Ok(h) if h.kind == FrameKind::Response => h,
                Ok(_) => break "peer sent a request on a client connection".to_string(),
                Err(e) => break e.to_string(),
            };
            let mut payload = vec![0u8; header.payload_len as usize];
            if let Err(e) = reader.read_exact(&mut payload).await {
                break e.to_string();
            }
            let bulk = match crate::read_bulk(&mut reader, header.bulk_len as usize).await {
                Ok(b) => b,
                Err(e) => break e.to_string(),
            };
            let waiter = routes.lock().expect("pending lock").as_mut().and_then(|m| m.remove(&header.request_id));
            if let Some(w) = waiter {
                let _ = w.send((payload, bulk));
            }
        };
        tracing::debug!(%addr, %reason, "rpc connection closed");
        // Dropping the senders wakes every waiter with an error.
        routes.lock().expect("pending lock").take();
    });

    Conn { writer: FrameWriter::new(writer), pending }
}
