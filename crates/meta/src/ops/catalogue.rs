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
    match t.get_admission(&node.id)? {
        Some(true) => {}
        Some(false) => return Err(MetaError::Removed(node.id.clone())),
        None => return Err(MetaError::NotAdmitted(node.id.clone())),
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

/// Admits a node id: registered or not yet (an operator may admit a node before it
/// first starts), and also one removed before.
pub(super) fn admit(t: &mut dyn Txn, node: &str) -> Result<(), MetaError> {
    if node.is_empty() {
        return Err(MetaError::InvalidArgument("an empty node id".into()));
    }
    t.set_admission(node, true)
}

/// Removes a node: its row, drained mark and chunk locations go, and its future
/// registrations are refused. The caller (`locus node remove`) first drained it
/// and waited until its chunks were copied elsewhere.
pub(super) fn remove(t: &mut dyn Txn, node: &str) -> Result<(), MetaError> {
    if t.get_node(node)?.is_none() && t.get_admission(node)?.is_none() {
        return Err(MetaError::NotFound(format!("node {node:?}")));
    }
    t.delete_node(node)?;
    t.set_admission(node, false)
}

/// Makes a join token valid for `ttl_secs`: 128 random bits, of which meta keeps
/// only the BLAKE3 hash.
pub(super) fn make_join_token(t: &mut dyn Txn, ctx: &Ctx, ttl_secs: u64) -> Result<proto::meta::JoinToken, MetaError> {
    let token = format!("locus-join-{}", crate::store::values::random_hex()?);
    let expires = ctx.now_ms.saturating_add(i64::try_from(ttl_secs.saturating_mul(1000)).unwrap_or(i64::MAX));
    t.put_join_token(blake3::hash(token.as_bytes()).as_bytes(), expires)?;
    Ok(proto::meta::JoinToken { token, ttl_secs })
}

/// Spends a join token (once, before it expires) to admit a node not yet decided on.
pub(super) fn join(t: &mut dyn Txn, ctx: &Ctx, node: &str, token: &str) -> Result<(), MetaError> {
    match t.get_admission(node)? {
        Some(true) => return Ok(()),
        Some(false) => return Err(MetaError::Removed(node.to_string())),
        None => {}
    }
    match t.take_join_token(blake3::hash(token.as_bytes()).as_bytes())? {
        Some(expires) if expires > ctx.now_ms => admit(t, node),
        _ => Err(MetaError::BadJoinToken(node.to_string())),
    }
}

pub(super) fn forget_chunk(t: &mut dyn Txn, id: &ChunkId) -> Result<(), MetaError> {
    if let Some(c) = t.get_chunk(id)?
        && c.refcount == 0
    {
        t.delete_chunk(id)?;
    }
    Ok(())
}
