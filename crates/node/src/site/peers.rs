//! The other nodes: learned from meta, their round trips measured (sizing the
//! connection pools to them), ranked nearest first, and which of them placement says
//! holds a chunk.

use super::SiteLink;
use super::config::auto_connections;
use net::RpcClient;
use proto::meta::ListNodes;
use proto::node::Ping;
use proto::placement::rendezvous;
use proto::types::{ChunkId, NodeInfo};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use util::sync::{lock, read, write};

impl SiteLink {
    /// The nodes `placement_guesses` names for `id`, each with a client.
    pub(super) async fn likely_holders(&self, id: &ChunkId) -> Vec<(String, Arc<RpcClient>)> {
        let guesses = placement_guesses(id, &self.me, &self.site, &self.peers.all(), &read(&self.rtts));
        let mut out = Vec::new();
        for node in guesses {
            if let Ok(client) = self.peers.client(&node).await {
                out.push((node, client));
            }
        }
        out
    }

    /// Nodes other than this one among `holders`, nearest first, with a client each.
    pub(super) async fn nearest(&self, holders: &[String]) -> Vec<(String, Arc<RpcClient>)> {
        if holders.iter().any(|h| h != &self.me && self.peers.get(h).is_none()) {
            self.refresh_peers().await;
        }
        let mut ranked: Vec<(bool, Duration, String)> = {
            let rtts = read(&self.rtts);
            holders
                .iter()
                .filter(|h| *h != &self.me)
                .filter_map(|h| {
                    let info = self.peers.get(h)?;
                    Some((info.site != self.site, rtts.get(h).copied().unwrap_or(Duration::MAX), h.clone()))
                })
                .collect()
        };
        ranked.sort();
        let mut out = Vec::new();
        for (_, _, node) in ranked {
            match self.peers.client(&node).await {
                Ok(client) => out.push((node, client)),
                Err(e) => tracing::warn!(%node, "cannot reach node: {e}"),
            }
        }
        out
    }

    /// Learns the cluster's nodes from meta (and whether this one is being drained).
    pub async fn refresh_peers(&self) {
        let Ok(Ok(list)) = self.meta.ask(ListNodes {}).await else { return };
        let me = list.iter().find(|n| n.id == self.me).is_some_and(|n| n.drained);
        self.drained.store(me, std::sync::atomic::Ordering::Relaxed);
        self.peers.update(list.into_iter().filter(|n| n.id != self.me));
    }

    /// This node is being drained: its own copies do not count.
    pub(crate) fn drained(&self) -> bool {
        self.drained.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Times a ping to every node of another site and keeps the best round trip per
    /// site for the heartbeat.
    pub(super) async fn measure_rtts(&self) {
        let others: Vec<NodeInfo> =
            self.peers.all().into_iter().filter(|n| n.site != self.site && n.last_seen_secs < 30).collect();
        let mut best: HashMap<String, u64> = HashMap::new();
        for node in others {
            let Ok(client) = self.peers.client(&node.id).await else { continue };
            let started = Instant::now();
            let answered = tokio::time::timeout(Duration::from_secs(5), client.call_node(Ping {})).await;
            if !matches!(answered, Ok(Ok(Ok(_)))) {
                continue;
            }
            let rtt = started.elapsed();
            // Smoothed like TCP's SRTT (7/8 old, 1/8 new).
            let smoothed =
                *write(&self.rtts).entry(node.id.clone()).and_modify(|old| *old = (*old * 7 + rtt) / 8).or_insert(rtt);
            if self.config.connections_for(&node.site).is_none() {
                let c = &self.config;
                let n = auto_connections(smoothed, c.path_rate, self.window, c.connection_rate, c.max_connections);
                client.use_connections(n);
            }
            lock(&self.pools).insert(node.id.clone(), client.connections());
            // Opened now, not by the first read that needs them.
            let (pool, id) = (client.clone(), node.id.clone());
            tokio::spawn(async move {
                if let Err(e) = pool.warm().await {
                    tracing::debug!(node = %id, "cannot open every connection to the node: {e}");
                }
            });
            let micros = rtt.as_micros() as u64;
            best.entry(node.site).and_modify(|b| *b = (*b).min(micros)).or_insert(micros);
        }
        let mut out: Vec<(String, u64)> = best.into_iter().collect();
        out.sort();
        *lock(&self.site_rtts) = out;
    }

    /// The best round trip to each other site, as last measured.
    pub fn site_rtts(&self) -> Vec<(String, u64)> {
        lock(&self.site_rtts).clone()
    }
}

/// Where writers would have put chunk `id`, for a node `me` at `site` that lacks it:
/// at its own site the node after it in placement order (which takes a chunk `me`
/// refused), then at the nearest other site (by the round trips in `rtts`) the
/// first-ranked node, as a writer there places chunks (rendezvous over the site's
/// undrained live nodes).
fn placement_guesses(
    id: &ChunkId,
    me: &str,
    site: &str,
    peers: &[NodeInfo],
    rtts: &HashMap<String, Duration>,
) -> Vec<String> {
    let mut sites: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    sites.entry(site).or_default().push(me.to_string());
    for n in peers.iter().filter(|n| !n.drained && n.last_seen_secs <= proto::policy::NODE_GONE_SECS) {
        sites.entry(&n.site).or_default().push(n.id.clone());
    }
    let here = sites.remove(site).unwrap_or_default();
    let mut guesses: Vec<String> =
        rendezvous(id, &here, 2).into_iter().filter(|n| *n != me).map(String::from).take(1).collect();
    let nearest = sites
        .values()
        .filter_map(|nodes| {
            let first = rendezvous(id, nodes, 1).first()?.to_string();
            Some((nodes.iter().filter_map(|n| rtts.get(n)).min().copied().unwrap_or(Duration::MAX), first))
        })
        .min();
    guesses.extend(nearest.map(|(_, first)| first));
    guesses
}

#[cfg(test)]
mod tests {
    use super::super::testing::node;
    use super::*;

    #[test]
    fn placement_guesses_the_next_node_here_and_the_first_at_the_nearest_site() {
        let id = ChunkId([3; 32]);
        let ms = Duration::from_millis;
        let mut peers = vec![node("a0", "a", ""), node("a1", "a", ""), node("c0", "c", ""), node("b1", "b", "")];
        let rtts: HashMap<String, Duration> =
            [("a0".into(), ms(100)), ("a1".into(), ms(90)), ("c0".into(), ms(20))].into();
        let here: Vec<String> = vec!["b0".into(), "b1".into()];
        let next_here = rendezvous(&id, &here, 2).into_iter().find(|n| *n != "b0").unwrap().to_string();
        let guesses = placement_guesses(&id, "b0", "b", &peers, &rtts);
        assert_eq!(guesses, vec![next_here, "c0".to_string()], "site c is nearer than a");
        // Without c, site a's first-ranked node (over its live, undrained nodes).
        peers.retain(|n| n.id != "c0");
        let a: Vec<String> = vec!["a0".into(), "a1".into()];
        let first_a = rendezvous(&id, &a, 1)[0].to_string();
        assert_eq!(placement_guesses(&id, "b0", "b", &peers, &rtts)[1], first_a);
        for n in peers.iter_mut().filter(|n| n.id == first_a) {
            n.drained = true;
        }
        let other_a = if first_a == "a0" { "a1" } else { "a0" };
        assert_eq!(placement_guesses(&id, "b0", "b", &peers, &rtts)[1], other_a, "a drained node takes no chunks");
        // Alone at its site, with no other site: nothing to guess.
        assert!(placement_guesses(&id, "b0", "b", &[], &rtts).is_empty());
    }
}
