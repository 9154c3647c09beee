//! The node directory and the chunk catalogue.

use super::*;

pub(super) fn register_node(
    t: &mut dyn Txn,
    ctx: &Ctx,
    node: &NodeInfo,
    cluster_id: Option<&str>,
) -> Result<(), MetaError> {
    if let Some(theirs) = cluster_id
        && theirs != &*ctx.cluster_id
    {
        return Err(MetaError::WrongCluster(format!(
            "node {} at {} belongs to cluster {theirs}, this meta serves cluster {}; point the node at its own \
             meta (or give it a fresh data directory to join this cluster)",
            node.id, node.addr, ctx.cluster_id
        )));
    }
    if let Some((old, seen)) = t.get_node(&node.id)?
        && old.store_id != node.store_id
        && ctx.now_ms.saturating_sub(seen) < NODE_CLAIM_WINDOW_MS
    {
        return Err(MetaError::Exists(format!(
            "two nodes with different chunk stores claim id {}: {} (seen {} ms ago) and {}; give each node a unique id",
            node.id,
            old.addr,
            ctx.now_ms.saturating_sub(seen),
            node.addr
        )));
    }
    t.put_node(node, ctx.now_ms)
}

pub(super) fn nodes(t: &mut dyn Txn, ctx: &Ctx) -> Result<Vec<NodeInfo>, MetaError> {
    let drained = t.drained_nodes()?;
    Ok(t.list_nodes()?
        .into_iter()
        .map(|(mut n, seen)| {
            n.last_seen_secs = secs_since(ctx.now_ms, seen);
            n.drained = drained.contains(&n.id);
            n
        })
        .collect())
}

/// Marks a registered node drained or not.
pub(super) fn drain(t: &mut dyn Txn, node: &str, drained: bool) -> Result<(), MetaError> {
    if t.get_node(node)?.is_none() {
        return Err(MetaError::NotFound(format!("node {node:?} is not registered")));
    }
    t.set_drained(node, drained)
}

pub(super) fn forget_chunk(t: &mut dyn Txn, id: &ChunkId) -> Result<(), MetaError> {
    if let Some(c) = t.get_chunk(id)?
        && c.refcount == 0
    {
        t.delete_chunk(id)?;
    }
    Ok(())
}
