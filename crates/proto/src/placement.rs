//! Where a chunk lives within a site: rendezvous (highest-random-weight) hashing over
//! the site's nodes, so any client computes the same stripe without asking meta, and
//! adding a node moves only the chunks that now rank it first.

use crate::types::ChunkId;

/// The `copies` nodes that should hold `chunk`, best first. Deterministic in its inputs
/// and independent of the order of `nodes`.
pub fn rendezvous<'a>(chunk: &ChunkId, nodes: &'a [String], copies: usize) -> Vec<&'a str> {
    let mut scored: Vec<(u64, &str)> = nodes
        .iter()
        .map(|n| {
            let mut h = blake3::Hasher::new();
            h.update(&chunk.0);
            h.update(n.as_bytes());
            let score = u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap());
            (score, n.as_str())
        })
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().take(copies).map(|(_, n)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Laws: order-independent; never more copies than nodes; no node twice;
        /// removing a node that was not chosen changes nothing.
        #[test]
        fn rendezvous_laws(seed in any::<[u8; 32]>(), n in 1usize..8, copies in 1usize..4) {
            let nodes: Vec<String> = (0..n).map(|i| format!("node-{i}")).collect();
            let mut reversed = nodes.clone();
            reversed.reverse();
            let id = ChunkId(seed);
            let a = rendezvous(&id, &nodes, copies);
            prop_assert_eq!(&a, &rendezvous(&id, &reversed, copies));
            prop_assert_eq!(a.len(), copies.min(n));
            let mut dedup = a.clone(); dedup.sort(); dedup.dedup();
            prop_assert_eq!(dedup.len(), a.len());
            if let Some(unchosen) = nodes.iter().find(|x| !a.contains(&x.as_str())) {
                let fewer: Vec<String> = nodes.iter().filter(|x| *x != unchosen).cloned().collect();
                prop_assert_eq!(a, rendezvous(&id, &fewer, copies));
            }
        }
    }
}
