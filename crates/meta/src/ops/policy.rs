//! Replication policies: set on a directory, resolved for any inode by walking up to
//! the nearest directory that sets one (so a policy set on an existing tree applies to
//! the files already in it), checked against the sites that have nodes.

use super::*;
use proto::policy::{EffectivePolicy, NODE_GONE_SECS, Policy, Shortfall, ShortfallPage};
use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};

/// Most copies a policy may ask for within one site.
const MAX_COPIES: u32 = 16;

/// Sets or clears a directory's policy; answers warnings about sites with fewer nodes
/// than the policy's copies.
pub(super) fn set_policy(t: &mut dyn Txn, ino: InodeId, policy: Option<Policy>) -> Result<Vec<String>, MetaError> {
    let i = inode(t, ino)?;
    if i.attr.kind != FileKind::Dir {
        return Err(MetaError::NotDir(format!(
            "inode {ino} is a {:?}: a replication policy is set on a directory and inherited by what it holds",
            i.attr.kind
        )));
    }
    let Some(mut policy) = policy else {
        t.delete_policy(ino)?;
        return Ok(Vec::new());
    };
    if policy.copies == 0 || policy.copies > MAX_COPIES {
        return Err(MetaError::InvalidArgument(format!("copies must be 1 to {MAX_COPIES}, not {}", policy.copies)));
    }
    let mut seen = Vec::new();
    policy.sites.retain(|s| {
        let new = !seen.contains(s);
        seen.push(s.clone());
        new
    });
    let per_site = nodes_per_site(t)?;
    for site in &policy.sites {
        if !per_site.contains_key(site) {
            let known: Vec<&str> = per_site.keys().map(String::as_str).collect();
            return Err(MetaError::InvalidArgument(format!(
                "unknown site {site:?}: no node has registered there (sites with nodes: {})",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )));
        }
    }
    t.put_policy(ino, &policy)?;
    Ok(too_few_nodes(&policy, &per_site, &format!("inode {ino}")))
}

/// The policy that applies to `ino`: its own (directories), its nearest ancestor's,
/// or the cluster default.
pub(super) fn effective_policy(t: &mut dyn Txn, ino: InodeId) -> Result<EffectivePolicy, MetaError> {
    let i = inode(t, ino)?;
    if !t.may_have_policies()? {
        return Ok(EffectivePolicy { policy: Policy::default(), set_on: None });
    }
    let mut cur = if i.attr.kind == FileKind::Dir { ino } else { i.parent };
    for _ in 0..MAX_DEPTH {
        if let Some(policy) = t.get_policy(cur)? {
            return Ok(EffectivePolicy { policy, set_on: Some(cur) });
        }
        if cur == ROOT_INODE {
            return Ok(EffectivePolicy { policy: Policy::default(), set_on: None });
        }
        cur = inode(t, cur)?.parent;
    }
    Err(MetaError::Corrupt(format!("parent chain of inode {ino} does not reach the root")))
}

/// Warnings for `locus status`: every policy (and the default, unless the root sets
/// its own and so the default applies nowhere) whose copies exceed the nodes of a site
/// it covers.
pub(super) fn policy_warnings(t: &mut dyn Txn, policies: &[(InodeId, Policy)]) -> Result<Vec<String>, MetaError> {
    let per_site = nodes_per_site(t)?;
    let mut out = Vec::new();
    if !policies.iter().any(|(ino, _)| *ino == ROOT_INODE) {
        out = too_few_nodes(&Policy::default(), &per_site, "the default policy");
    }
    for (ino, p) in policies {
        out.extend(too_few_nodes(p, &per_site, &format!("the policy of inode {ino}")));
    }
    Ok(out)
}

fn nodes_per_site(t: &mut dyn Txn) -> Result<BTreeMap<String, u32>, MetaError> {
    let mut per_site = BTreeMap::new();
    for (n, _) in t.list_nodes()? {
        *per_site.entry(n.site).or_insert(0) += 1;
    }
    Ok(per_site)
}

/// One warning per site of `policy` (every site with nodes when it names none) that
/// has fewer nodes than its copies.
fn too_few_nodes(policy: &Policy, per_site: &BTreeMap<String, u32>, whose: &str) -> Vec<String> {
    let sites: Vec<&String> =
        if policy.sites.is_empty() { per_site.keys().collect() } else { policy.sites.iter().collect() };
    sites
        .into_iter()
        .filter_map(|site| {
            let have = per_site.get(site).copied().unwrap_or(0);
            (have < policy.copies).then(|| {
                format!(
                    "{whose} wants {} copies at site {site}, which has {have} node{}: its chunks there stay \
                     under-replicated until nodes join",
                    policy.copies,
                    if have == 1 { "" } else { "s" }
                )
            })
        })
        .collect()
}

/// A page of chunks whose live copies fall short of their policy (see
/// `proto::meta::UnderReplicated`). A site needs as many live holders of a replica as
/// the policy's copies, or as it has live nodes if fewer; site-cache copies do not
/// count (they are evictable), but repair may start from one when no replica is left. The default policy (no sites named)
/// wants its copies at the repairing node's site; asked without a node (fsck), it is
/// satisfied when any site holding the chunk has them.
pub(super) fn under_replicated(
    t: &mut dyn Txn,
    ctx: &Ctx,
    node: Option<&str>,
    after: Option<(InodeId, u64)>,
    limit: u32,
) -> Result<ShortfallPage, MetaError> {
    let extents = t.list_extents(after, limit)?;
    let next = if extents.len() as u32 == limit { extents.last().map(|(i, e)| (*i, e.file_offset)) } else { None };
    let gone_ms = NODE_GONE_SECS as i64 * 1000;
    let drained = t.drained_nodes()?;
    let mut site_of: HashMap<String, String> = HashMap::new();
    // Live nodes whose copies count, and live drained ones (sources for repair only).
    let (mut live, mut leaving): (HashSet<String>, HashSet<String>) = Default::default();
    let mut live_per_site: HashMap<String, u32> = HashMap::new();
    for (n, seen) in t.list_nodes()? {
        if ctx.now_ms.saturating_sub(seen) < gone_ms {
            if drained.contains(&n.id) {
                leaving.insert(n.id.clone());
            } else {
                live.insert(n.id.clone());
                *live_per_site.entry(n.site.clone()).or_insert(0) += 1;
            }
        }
        site_of.insert(n.id, n.site);
    }
    let mut policies: HashMap<InodeId, Policy> = HashMap::new();
    let mut seen = HashSet::new();
    let mut chunks = Vec::new();
    for (ino, e) in extents {
        if !seen.insert(e.chunk) {
            continue;
        }
        let Some(record) = t.get_chunk(&e.chunk)? else { continue };
        let policy = match policies.get(&ino) {
            Some(p) => p.clone(),
            None => {
                let p = effective_policy(t, ino)?.policy;
                policies.insert(ino, p.clone());
                p
            }
        };
        // Only replicas count: a site-cache copy may be evicted at any time.
        let mut holders: Vec<String> = record.replicas().filter(|n| live.contains(*n)).cloned().collect();
        holders.sort();
        // Who may copy: holders that count first, then drained ones, then live nodes
        // with only a cached copy (the last copies left; repair pins them).
        let mut sources = holders.clone();
        let mut drained_holders: Vec<String> = record.replicas().filter(|n| leaving.contains(*n)).cloned().collect();
        drained_holders.sort();
        sources.extend(drained_holders);
        let mut caching: Vec<String> = record.cached.iter().filter(|n| live.contains(*n)).cloned().collect();
        caching.sort();
        sources.extend(caching);
        let held_at = |site: &str| holders.iter().filter(|h| site_of.get(*h).is_some_and(|s| s == site)).count();
        let short = |site: &String| {
            let want = policy.copies.min(live_per_site.get(site).copied().unwrap_or(0)).max(1) as usize;
            held_at(site) < want
        };
        let sites: Vec<String> = match node {
            Some(me) => {
                let my_site = site_of.get(me).cloned().unwrap_or_default();
                let required = if policy.sites.is_empty() { vec![my_site] } else { policy.sites.clone() };
                required
                    .into_iter()
                    .filter(|s| short(s))
                    .filter(|s| {
                        // At a site holding copies, its first live holder repairs it; a
                        // site without any is repaired by the first live holder overall.
                        let first_there = holders.iter().find(|h| site_of.get(*h) == Some(s));
                        first_there.or(sources.first()).is_some_and(|h| h == me)
                    })
                    .collect()
            }
            None if policy.sites.is_empty() => {
                let mut held: Vec<String> = holders.iter().filter_map(|h| site_of.get(h).cloned()).collect();
                held.sort();
                held.dedup();
                if held.iter().any(|s| !short(s)) { Vec::new() } else { held }
            }
            None => policy.sites.iter().filter(|s| short(s)).cloned().collect(),
        };
        // Without a node asking, a chunk with no live copy at all is reported too.
        if !sites.is_empty() || (node.is_none() && holders.is_empty()) {
            chunks.push(Shortfall { id: e.chunk, size: record.size, ino, policy, holders, sites });
        }
    }
    Ok(ShortfallPage { chunks, next })
}
