//! Replication policies: set on a directory, resolved for any inode by walking up to
//! the nearest directory that sets one (so a policy set on an existing tree applies to
//! the files already in it), checked against the sites that have nodes.

use super::*;
use proto::policy::{EffectivePolicy, Policy};
use std::collections::BTreeMap;

/// Most copies a policy may ask for within one site.
const MAX_COPIES: u32 = 16;
/// Deepest directory chain walked when resolving a policy.
const MAX_DEPTH: usize = 100_000;

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
    Ok(under_replicated(&policy, &per_site, &format!("inode {ino}")))
}

/// The policy that applies to `ino`: its own (directories), its nearest ancestor's,
/// or the cluster default.
pub(super) fn effective_policy(t: &mut dyn Txn, ino: InodeId) -> Result<EffectivePolicy, MetaError> {
    let i = inode(t, ino)?;
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

/// Warnings for `locus status`: every policy (and the default) whose copies exceed
/// the nodes of a site it covers.
pub(super) fn policy_warnings(t: &mut dyn Txn, policies: &[(InodeId, Policy)]) -> Result<Vec<String>, MetaError> {
    let per_site = nodes_per_site(t)?;
    let mut out = under_replicated(&Policy::default(), &per_site, "the default policy");
    for (ino, p) in policies {
        out.extend(under_replicated(p, &per_site, &format!("the policy of inode {ino}")));
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
fn under_replicated(policy: &Policy, per_site: &BTreeMap<String, u32>, whose: &str) -> Vec<String> {
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
