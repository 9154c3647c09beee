//! The answering side: each connection reads requests and runs each in its own task,
//! so a slow request never holds up the ones behind it.

use crate::{FrameWriter, tune};
use bytes::Bytes;
use proto::frame::{self, FrameKind, HEADER_LEN, Header};
use serde::{Serialize, de::DeserializeOwned};
use std::future::Future;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A request handler: one typed request (plus its bulk bytes, if any) in, one typed
/// answer (plus bulk bytes, usually empty) out.
pub trait Service: Send + Sync + 'static {
    type Request: DeserializeOwned + Send + 'static;
    type Reply: Serialize + Send + 'static;
    fn handle(self: Arc<Self>, req: Self::Request, bulk: Bytes) -> impl Future<Output = (Self::Reply, Bytes)> + Send;
}

/// Accepts connections until the listener fails; each is served concurrently.
pub async fn serve<S: Service>(listener: TcpListener, service: Arc<S>) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        tune(&stream);
        let service = service.clone();
        tokio::spawn(async move {
            if let Err(reason) = serve_conn(stream, service).await {
                tracing::debug!(%peer, %reason, "connection ended");
            }
        });
    }
}

async fn serve_conn<S: Service>(stream: TcpStream, service: Arc<S>) -> Result<(), String> {
    let (mut reader, writer) = stream.into_split();
    let writer = FrameWriter::new(writer);
    loop {
        let mut head = [0u8; HEADER_LEN];
        reader.read_exact(&mut head).await.map_err(|e| e.to_string())?;
        let header = Header::decode(&head).map_err(|e| e.to_string())?;
        if header.kind != FrameKind::Request {
            return Err("client sent a response frame".into());
        }
        let mut payload = vec![0u8; header.payload_len as usize];
        reader.read_exact(&mut payload).await.map_err(|e| e.to_string())?;
        let bulk = crate::read_bulk(&mut reader, header.bulk_len as usize).await.map_err(|e| e.to_string())?;
        // A malformed request ends the connection: the stream can no longer be trusted.
        let req: S::Request = frame::decode(&payload).map_err(|e| format!("malformed request: {e}"))?;
        let service = service.clone();
        let writer = writer.clone();
        tokio::spawn(async move {
            let (reply, bulk) = service.handle(req, bulk).await;
            match frame::encode(FrameKind::Response, header.request_id, &reply, bulk.len()) {
                Ok(bytes) => {
                    if let Err(e) = writer.send(&bytes, &bulk).await {
                        tracing::debug!(error = %e, "cannot send a reply");
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot encode reply"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RpcClient;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    struct Echo;
    impl Service for Echo {
        type Request = (u64, u64);
        type Reply = u64;
        async fn handle(self: Arc<Self>, (delay_ms, v): (u64, u64), bulk: Bytes) -> (u64, Bytes) {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            (v * 2, bulk)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_answers_out_of_order() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let client = Arc::new(RpcClient::connect(&addr, 1, Duration::from_secs(5)).await.unwrap());
        let started = std::time::Instant::now();
        // 50 requests each taking 100 ms finish together when pipelined.
        let calls: Vec<_> = (0..50u64)
            .map(|i| {
                let c = client.clone();
                tokio::spawn(async move { c.call::<_, u64>(&(100u64, i)).await.unwrap() })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), 2 * i as u64);
        }
        assert!(started.elapsed() < Duration::from_secs(3), "requests were not pipelined");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_bytes_travel_both_ways() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let client = RpcClient::connect(&addr, 2, Duration::from_secs(5)).await.unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let (v, back): (u64, Bytes) = client.call_bulk(&(0u64, 4u64), Bytes::from(data.clone())).await.unwrap();
        assert_eq!((v, &back[..]), (8, &data[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn garbage_closes_only_that_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&[0xff; 64]).await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(raw.read(&mut buf).await.unwrap(), 0, "server must close a garbled stream");
        let client = RpcClient::connect(&addr, 2, Duration::from_secs(5)).await.unwrap();
        assert_eq!(client.call::<_, u64>(&(0u64, 21u64)).await.unwrap(), 42);
    }
}
