//! Fetching a chunk from another node: placement's guesses first, then the
//! catalogue's holders nearest first; striped over a peer's connections when alone,
//! whole when other fetches are in flight; hashed before it is returned.

use super::SiteLink;
use bytes::Bytes;
use net::RpcClient;
use proto::error::{ErrorCode, WireError};
use proto::meta::ChunkLocations;
use proto::node::Get;
use proto::types::ChunkId;
use std::sync::Arc;
use std::time::Instant;

/// Decrements the count of fetches in flight when a fetch ends, however it ends.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl SiteLink {
    /// A miss's single flight: a fetch of `id` that ended while this reader looked in
    /// the cache left it in memory (so many readers at one site cross the WAN once per
    /// chunk); otherwise it is fetched.
    pub(super) async fn fetch_unless_recent(self: &Arc<Self>, id: ChunkId) -> Result<Bytes, WireError> {
        match self.recent.get(&id) {
            Some(data) => Ok(data),
            None => self.fetch_and_cache(id).await,
        }
    }

    async fn fetch_and_cache(self: &Arc<Self>, id: ChunkId) -> Result<Bytes, WireError> {
        let data = self.fetch_copy(id).await?;
        // Serve at once; the copy lands on disk behind the reader (and is in memory
        // meanwhile, so nobody fetches it twice).
        self.recent.insert(id, data.clone());
        let (me, kept) = (self.clone(), data.clone());
        tokio::spawn(async move { me.keep(id, kept).await });
        Ok(data)
    }

    /// A verified copy of a chunk from the nearest other node that holds one (each
    /// copy tried twice: a corrupt transfer is fetched again, never returned).
    ///
    /// The catalogue is asked at once, but the nodes placement names are asked first,
    /// without waiting for it: a chunk is where its writer's site placed it
    /// (`likely_holders`), so a miss costs one round trip to the holder rather than one
    /// to meta and then one to the holder. Such a guess fetches the chunk whole (its
    /// size is the catalogue's to tell).
    pub(crate) async fn fetch_copy(&self, id: ChunkId) -> Result<Bytes, WireError> {
        let meta = self.meta.clone();
        let catalogue =
            tokio::spawn(
                async move { crate::ask_meta(&meta, ChunkLocations { ids: vec![id], caps: Vec::new() }).await },
            );
        let mut last = WireError::new(ErrorCode::Io, format!("chunk {id}: no copy could be fetched"));
        let mut lacking = Vec::new();
        for (node, client) in self.likely_holders(&id).await {
            match self.fetch_verified(&node, &client, id, None).await {
                Ok(data) => {
                    catalogue.abort();
                    return Ok(data);
                }
                Err(e) if e.code == ErrorCode::NotFound => lacking.push(node),
                Err(e) => last = e,
            }
        }
        let mut records = catalogue
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("catalogue task failed: {e}")))??;
        let Some(record) = records.pop() else {
            return Err(WireError::new(ErrorCode::NotFound, format!("chunk {id} is in no catalogue")));
        };
        let holders: Vec<String> = record.nodes.into_iter().filter(|n| !lacking.contains(n)).collect();
        let candidates = self.nearest(&holders).await;
        if candidates.is_empty() {
            return Err(WireError::new(ErrorCode::NotFound, format!("no other node holds chunk {id}")));
        }
        // Each copy gets two tries: one corrupt transfer is refetched, never served.
        for (node, client) in candidates.into_iter().flat_map(|c| [c.clone(), c]) {
            match self.fetch_verified(&node, &client, id, Some(record.size)).await {
                Ok(data) => return Ok(data),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// One fetch of `id` from `node`, hashed: `size` known stripes a lone fetch.
    async fn fetch_verified(
        &self,
        node: &str,
        client: &Arc<RpcClient>,
        id: ChunkId,
        size: Option<u64>,
    ) -> Result<Bytes, WireError> {
        // The hash runs off the runtime's threads: the connections' reading tasks keep
        // draining their sockets meanwhile (a 2-core node is otherwise late to read and
        // the sender becomes receive-window limited).
        let fetched = match self.fetch_striped(client, id, size).await {
            Ok(data) => tokio::task::spawn_blocking(move || (ChunkId::of(&data) == id, data))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("hash task failed: {e}"))),
            Err(e) => Err(e),
        };
        match fetched {
            Ok((true, data)) => {
                self.stats.fetched_chunks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.stats.fetched_bytes.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Ok(data)
            }
            Ok((false, _)) => {
                self.stats.corrupt_in_transit.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(chunk = %id, %node, "chunk arrived corrupted; fetching it again");
                Err(WireError::new(ErrorCode::Corrupt, format!("chunk {id} from {node} arrived corrupted")))
            }
            Err(e) => {
                if e.code != ErrorCode::NotFound {
                    tracing::warn!(chunk = %id, %node, "fetch failed, trying another copy: {e}");
                }
                Err(e)
            }
        }
    }

    /// Fetches a chunk on the peer's connections: whole when its size is unknown or
    /// the other fetches in flight already give every connection a chunk (a sequential
    /// reader's read-ahead: each connection stays backlogged with whole chunks, one
    /// request each), else cut into as many stripes as there are connections per
    /// fetch in flight.
    async fn fetch_striped(&self, client: &Arc<RpcClient>, id: ChunkId, size: Option<u64>) -> Result<Bytes, WireError> {
        let fetching = self.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let _counted = InFlight(&self.in_flight);
        let started = Instant::now();
        let offsets: Vec<(u64, u64)> = match size {
            Some(size) if size > 0 => {
                let stripes = (client.connections() / fetching).max(1) as u64;
                let stripe = size.div_ceil(stripes).max(self.config.min_stripe).max(1);
                (0..size).step_by(stripe as usize).map(|offset| (offset, stripe)).collect()
            }
            _ => vec![(0, u64::MAX)],
        };
        let parts: Vec<_> = offsets
            .into_iter()
            .map(|(offset, len)| {
                let client = client.clone();
                let req = Get { id, offset, len, local_only: true, cap: None };
                tokio::spawn(async move { client.call_node(req).await })
            })
            .collect();
        let mut received = Vec::with_capacity(parts.len());
        for part in parts {
            let bytes = part
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, format!("fetch task failed: {e}")))?
                .map_err(|e| WireError::new(ErrorCode::Io, e.to_string()))??;
            received.push(bytes);
        }
        // When each fetch of a read's start ended (`LOCUS_LOG=node::site=trace`).
        tracing::trace!(chunk = %id, fetching, stripes = received.len(), ms = started.elapsed().as_millis() as u64, "fetched");
        // A chunk that came whole is handed on as received, without a copy.
        if let [whole] = &received[..] {
            return Ok(whole.clone());
        }
        Ok(Bytes::from(received.concat()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{chunk, link, node};
    use super::*;
    use chunk::ChunkStore;
    use std::time::Duration;

    /// A miss whose flight starts after another reader's fetch of the chunk ended (the
    /// chunk is in memory, not yet on disk) takes that copy and asks nobody: meta here
    /// never answers, so a second fetch would hang past the timeout.
    #[tokio::test]
    async fn a_miss_after_a_finished_fetch_takes_the_copy_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 1 << 20).await;
        let (id, data) = chunk(7, 1000);
        link.recent.insert(id, data.clone());
        let got = tokio::time::timeout(Duration::from_secs(5), link.fetch_unless_recent(id)).await;
        assert_eq!(got.expect("the miss fetched the chunk again").unwrap(), data);
        assert_eq!(link.stats.fetched_chunks.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    /// A chunk that misses here is fetched from where placement puts it at the other
    /// site, without waiting for the catalogue: meta here never answers.
    #[tokio::test]
    async fn a_miss_is_fetched_from_where_placement_puts_it_without_asking_meta() {
        let dir = tempfile::tempdir().unwrap();
        let (link, _) = link(dir.path(), 1 << 20).await;
        let holder = Arc::new(ChunkStore::open(&dir.path().join("a0"), 1 << 30).unwrap());
        let (id, data) = chunk(9, 300_000);
        holder.put(&id, &data).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(net::serve(listener, Arc::new(crate::NodeService::new(holder))));
        link.peers.update([node("a0", "a", &addr)]);
        let got = tokio::time::timeout(Duration::from_secs(3), link.fetch_copy(id)).await;
        assert_eq!(got.expect("the fetch waited for meta").unwrap(), data);
        assert_eq!(link.stats.fetched_chunks.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
