//! The cluster's storage nodes as one process knows them, each with a connection pool
//! opened on first use: the one place clients, nodes and admin tools keep node
//! addresses, so a node that restarts on a new address is reconnected everywhere alike.

use crate::{NetError, Role, RpcClient};
use proto::types::NodeInfo;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use util::single_flight::SingleFlight;
use util::sync::{read, write};

struct Entry {
    info: NodeInfo,
    client: Option<Arc<RpcClient>>,
}

/// How many connections to open to a node, chosen per node (e.g. more across a WAN).
pub type PoolSize = Box<dyn Fn(&NodeInfo) -> usize + Send + Sync>;

/// Known nodes by id, with lazily connected clients.
pub struct NodeDirectory {
    nodes: RwLock<HashMap<String, Entry>>,
    connecting: SingleFlight<String, Arc<RpcClient>>,
    pool_size: PoolSize,
    timeout: Duration,
}

impl NodeDirectory {
    /// An empty directory; `timeout` bounds every call on the clients it opens.
    pub fn new(timeout: Duration, pool_size: PoolSize) -> Self {
        NodeDirectory { nodes: RwLock::default(), connecting: SingleFlight::default(), pool_size, timeout }
    }

    /// Takes in what meta says about the nodes: new nodes are added, known ones updated,
    /// and a node whose address changed is reconnected on next use.
    pub fn update(&self, list: impl IntoIterator<Item = NodeInfo>) {
        let mut nodes = write(&self.nodes);
        for info in list {
            match nodes.get_mut(&info.id) {
                Some(e) if e.info.addr == info.addr => e.info = info,
                _ => {
                    nodes.insert(info.id.clone(), Entry { info, client: None });
                }
            }
        }
    }

    /// What is known about one node.
    pub fn get(&self, id: &str) -> Option<NodeInfo> {
        read(&self.nodes).get(id).map(|e| e.info.clone())
    }

    /// Every known node, in id order.
    pub fn all(&self) -> Vec<NodeInfo> {
        let mut out: Vec<NodeInfo> = read(&self.nodes).values().map(|e| e.info.clone()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The client of node `id`, connecting now if needed (one connect however many
    /// callers ask at once).
    pub async fn client(&self, id: &str) -> Result<Arc<RpcClient>, NetError> {
        let (info, client) = match read(&self.nodes).get(id) {
            Some(e) => (e.info.clone(), e.client.clone()),
            None => return Err(NetError::UnknownNode(id.to_string())),
        };
        if let Some(c) = client {
            return Ok(c);
        }
        let connections = (self.pool_size)(&info);
        let client = self
            .connecting
            .run(id.to_string(), || async {
                let client = RpcClient::connect(&info.addr, connections, self.timeout).await?;
                // With TLS the server must prove to be this node, not any holder of a
                // cluster certificate at that address.
                if let Some(who) = client.server_identity().await
                    && (who.role != Role::Node || who.name != info.id)
                {
                    let reason = format!("it proved to be {who}, not node {}", info.id);
                    tracing::warn!(addr = %info.addr, "{reason}");
                    return Err(NetError::Refused { addr: info.addr.clone(), reason });
                }
                Ok::<_, NetError>(Arc::new(client))
            })
            .await?;
        if let Some(e) = write(&self.nodes).get_mut(id)
            && e.info.addr == info.addr
        {
            e.client = Some(client.clone());
        }
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: &str, addr: &str) -> NodeInfo {
        NodeInfo {
            id: id.into(),
            site: "s".into(),
            addr: addr.into(),
            capacity_bytes: 0,
            used_bytes: 0,
            chunk_count: 0,
            last_seen_secs: 0,
            store_id: String::new(),
            site_rtts: Vec::new(),
            cache_bytes: 0,
            drained: false,
        }
    }

    #[tokio::test]
    async fn connects_lazily_and_reconnects_after_an_address_change() {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, b) = (a.local_addr().unwrap().to_string(), b.local_addr().unwrap().to_string());
        let dir = NodeDirectory::new(Duration::from_secs(5), Box::new(|_| 1));
        assert!(matches!(dir.client("n1").await, Err(NetError::UnknownNode(_))));
        dir.update([info("n1", &a)]);
        let first = dir.client("n1").await.unwrap();
        assert_eq!(first.addr(), a);
        assert!(Arc::ptr_eq(&first, &dir.client("n1").await.unwrap()), "the client is kept");
        dir.update([info("n1", &b)]);
        assert_eq!(dir.client("n1").await.unwrap().addr(), b);
        assert_eq!(dir.all().len(), 1);
    }
}
