//! Commands for people: `status`, `fsck` and `gc`, talking to meta and nodes directly.

use crate::cli::{AdminArgs, GcArgs, LoginArgs, StatusArgs};
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use net::{NodeDirectory, RpcClient};
use proto::meta::*;
use proto::node::{Delete, List, NodeMessage, Stats, Verify};
use proto::types::{ChunkId, NodeInfo};
use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const PAGE: u32 = 1024;

struct Cluster {
    meta: RpcClient,
    nodes: Vec<(NodeInfo, Arc<RpcClient>)>,
    unreachable: Vec<(NodeInfo, String)>,
}

/// A connection to meta at `addr` for an admin command, or an error that names it.
pub(crate) async fn connect_meta(addr: &str, timeout: Duration) -> anyhow::Result<RpcClient> {
    RpcClient::connect(addr, 1, timeout).await.with_context(|| format!("meta at {addr} is unreachable"))
}

impl Cluster {
    async fn connect(meta_addr: &str) -> anyhow::Result<Cluster> {
        let meta = connect_meta(meta_addr, Duration::from_secs(60)).await?;
        let infos = meta_call(&meta, ListNodes {}).await?;
        let directory = NodeDirectory::new(Duration::from_secs(60), Box::new(|_| 1));
        directory.update(infos.clone());
        let mut nodes = Vec::new();
        let mut unreachable = Vec::new();
        for info in infos {
            match directory.client(&info.id).await {
                Ok(c) => nodes.push((info, c)),
                Err(e) => unreachable.push((info, e.to_string())),
            }
        }
        Ok(Cluster { meta, nodes, unreachable })
    }
}

async fn meta_call<M: MetaMessage>(meta: &RpcClient, msg: M) -> anyhow::Result<M::Response> {
    Ok(meta.ask(msg).await??)
}

async fn node_call<M: NodeMessage<Bulk = ()>>(node: &RpcClient, req: M) -> anyhow::Result<M::Response> {
    Ok(node.call_node(req).await??)
}

/// How long `status` waits for a node to tell its figures now.
const LIVE_STATS_WAIT: Duration = Duration::from_secs(1);

/// Each node's figures asked of it now (heartbeats bring them to meta only every few
/// seconds, so a file just written would not show yet); a node that does not answer
/// within `LIVE_STATS_WAIT` is left out.
async fn live_stats(nodes: &[NodeInfo]) -> HashMap<String, proto::node::NodeStats> {
    let directory = Arc::new(NodeDirectory::new(LIVE_STATS_WAIT, Box::new(|_| 1)));
    directory.update(nodes.to_vec());
    let mut asking = tokio::task::JoinSet::new();
    for id in nodes.iter().map(|n| n.id.clone()) {
        let directory = directory.clone();
        asking.spawn(tokio::time::timeout(LIVE_STATS_WAIT, async move {
            let client = directory.client(&id).await.ok()?;
            node_call(&client, Stats {}).await.ok().map(|stats| (id, stats))
        }));
    }
    let mut live = HashMap::new();
    while let Some(answer) = asking.join_next().await {
        if let Ok(Ok(Some((id, stats)))) = answer {
            live.insert(id, stats);
        }
    }
    live
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn utc(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        Err(_) => format!("{ms} ms"),
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Copies owed per policy and site, summed over the nodes that owe them; a lag
/// older than its policy's RPO is a warning.
fn print_lag(lag: &[(String, proto::policy::ReplicationLag)]) {
    let mut by_key: std::collections::BTreeMap<(String, String), (u64, u64, u64, u64)> = Default::default();
    for (_, l) in lag {
        let e = by_key.entry((l.policy.to_string(), l.site.clone())).or_default();
        e.0 += l.chunks;
        e.1 += l.bytes;
        e.2 = e.2.max(l.oldest_secs);
        e.3 = l.policy.rpo_secs;
    }
    println!("\nreplication lag (copies not yet made):");
    if by_key.is_empty() {
        println!("  none");
    }
    for ((policy, site), (chunks, bytes, oldest, rpo)) in by_key {
        println!(
            "  to site {site:<10} {chunks:>8} chunks {:>12}  oldest {oldest:>5}s  rpo {rpo}s  [{policy}]",
            human(bytes)
        );
        if oldest > rpo {
            println!("  warning: RPO breached: copies owed to site {site} are {oldest}s old (rpo {rpo}s) [{policy}]");
        }
    }
}

pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let addr = crate::local::meta_addr(args.admin.meta.as_deref());
    let meta = connect_meta(&addr, Duration::from_secs(30)).await?;
    let s = meta_call(&meta, Status {}).await?;
    if args.audit {
        println!("{:<24} {:<40} {:<22} {:<50} OUTCOME", "WHEN (UTC)", "WHO", "FROM", "WHAT");
        for e in &s.audit {
            println!("{:<24} {:<40} {:<22} {:<50} {}", utc(e.at_ms), e.who, e.from, e.action, e.outcome);
        }
        if s.audit.is_empty() {
            println!("(no administrative action since meta started, or this certificate may not see them)");
        }
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "meta {addr} (cluster {}): {} inodes, {} chunks ({})",
        s.cluster_id,
        s.inodes,
        s.chunks,
        human(s.chunk_bytes)
    );
    for (home, to, n) in &s.forwarding {
        println!("writes to home {home} forwarded to the meta holding it at {to}: {n} since this meta started");
    }
    let homes = meta_call(&meta, ListHomes {}).await?;
    if homes.len() > 1 {
        println!("\nmetadata homes:");
        crate::home::print_homes(&meta, homes).await;
    }
    println!("\nnodes:");
    println!(
        "  {:<16} {:<10} {:<22} {:>12} {:>12} {:>9} {:>12} {:>6}",
        "ID", "SITE", "ADDRESS", "USED", "FREE", "CHUNKS", "SITE CACHE", "SEEN"
    );
    let (mut cap, mut used) = (0, 0);
    let live = live_stats(&s.nodes).await;
    let mut reported = false;
    for n in &s.nodes {
        // What the node says now; else what it said at its last heartbeat (marked).
        let (node_used, chunks, mark) = match live.get(&n.id) {
            Some(l) => (l.used_bytes, l.chunk_count, ' '),
            None => (n.used_bytes, n.chunk_count, '*'),
        };
        reported |= mark == '*';
        cap += n.capacity_bytes;
        used += node_used;
        println!(
            "  {:<16} {:<10} {:<22} {:>12} {:>12} {:>9}{mark}{:>12} {:>5}s",
            n.id,
            n.site,
            n.addr,
            human(node_used),
            human(n.capacity_bytes.saturating_sub(node_used)),
            chunks,
            human(n.cache_bytes),
            n.last_seen_secs
        );
        if n.drained {
            println!("  {:<16} (draining: takes no new chunks; its copies are being made elsewhere)", "");
        }
    }
    println!("  total: {} used of {}", human(used), human(cap));
    if reported {
        println!("  * as of the node's last heartbeat: it did not answer now");
    }
    if !s.pending.is_empty() {
        println!("\npending admission (`locus node admit ID` lets one join):");
        for p in &s.pending {
            let certificate = match &p.certificate {
                Some((name, site)) => format!("certificate {name} of site {site}"),
                None => "no certificate (TLS off)".into(),
            };
            println!("  {:<16} {:<10} {:<22} {certificate}, asked {}s ago", p.id, p.site, p.addr, p.last_seen_secs);
        }
    }
    if !s.site_rtts.is_empty() {
        println!(
            "
round trips between sites (measured by nodes):"
        );
        for (from, to, micros) in &s.site_rtts {
            println!("  {from:<10} -> {to:<10} {:>9.2} ms", *micros as f64 / 1000.0);
        }
    }
    println!("\nreplication policies:");
    // The built-in default applies only where no directory up to the root sets one.
    if !s.policies.iter().any(|(ino, _)| *ino == proto::types::ROOT_INODE) {
        println!("  {:<40} {}", "/ (default)", proto::policy::Policy::default());
    }
    for (ino, p) in &s.policies {
        let path = crate::policy::path_of(&meta, *ino).await.unwrap_or_else(|e| format!("inode {ino} ({e})"));
        println!("  {path:<40} {p}");
    }
    for w in &s.policy_warnings {
        println!("  warning: {w}");
    }
    print_lag(&s.lag);
    println!("\nsessions:");
    for (id, info, idle) in &s.sessions {
        println!("  #{id:<6} site {:<10} {}:{:<8} {:<30} idle {idle}s", info.site, info.host, info.pid, info.purpose);
    }
    println!("\nworkers:");
    println!(
        "  {:<28} {:<16} {:<8} {:>8} {:>7}  PROGRESS / LAST ERROR",
        "PROCESS", "WORKER", "STATE", "STEPS", "ERRORS"
    );
    for (process, workers) in &s.workers {
        for w in workers {
            println!(
                "  {process:<28} {:<16} {:<8} {:>8} {:>7}  {}",
                w.name,
                format!("{:?}", w.state).to_lowercase(),
                w.steps,
                w.errors,
                w.progress
            );
            if let Some((at, error)) = &w.last_error {
                let ago = proto::types::Timestamp::now().secs.saturating_sub(at.secs);
                println!("  {:<28} {:<16} last error {ago}s ago: {error}", "", "");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn fsck(args: AdminArgs) -> anyhow::Result<ExitCode> {
    let cluster = Cluster::connect(&crate::local::meta_addr(args.meta.as_deref())).await?;
    let mut damage: Vec<String> = Vec::new();
    for (n, e) in &cluster.unreachable {
        damage.push(format!("node {} at {} is unreachable: {e}", n.id, n.addr));
    }

    // 1. Every extent must point into a catalogued chunk that is large enough.
    let mut referenced: HashMap<ChunkId, (u64, Vec<String>)> = HashMap::new();
    let mut extents = 0u64;
    let mut after = None;
    let spinner = ProgressBar::new_spinner();
    spinner.set_message("reading extents");
    loop {
        let page = meta_call(&cluster.meta, ListExtents { after, limit: PAGE }).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.0, last.1.file_offset));
        let ids: Vec<ChunkId> = page.iter().map(|(_, e)| e.chunk).filter(|id| !referenced.contains_key(id)).collect();
        if !ids.is_empty() {
            let records = meta_call(&cluster.meta, ChunkLocations { ids, caps: Vec::new() }).await?;
            for r in records {
                // Site-cache copies are evictable at any time: only replicas count.
                let replicas = r.replicas().cloned().collect();
                referenced.insert(r.id, (r.size, replicas));
            }
        }
        for (ino, e) in &page {
            extents += 1;
            match referenced.get(&e.chunk) {
                None => damage
                    .push(format!("inode {ino} offset {}: chunk {} is not in the catalogue", e.file_offset, e.chunk)),
                Some((size, _)) if e.chunk_offset + e.len > *size => damage.push(format!(
                    "inode {ino} offset {}: extent reaches byte {} of chunk {} which has {size}",
                    e.file_offset,
                    e.chunk_offset + e.len,
                    e.chunk
                )),
                _ => {}
            }
        }
        spinner.set_message(format!("{extents} extents read"));
        if (page.len() as u32) < PAGE {
            break;
        }
    }
    spinner.finish_and_clear();

    // 2. Every stored chunk must hash to its id, and every referenced one must exist.
    let total: u64 = cluster.nodes.iter().map(|(n, _)| n.chunk_count).sum();
    let bar = progress(total, "verifying");
    let mut verified = 0u64;
    let mut present: HashSet<(String, ChunkId)> = HashSet::new();
    for (info, node) in &cluster.nodes {
        let mut after = None;
        loop {
            let ids = node_call(node, List { after, limit: 256 }).await?;
            let Some(last) = ids.last().copied() else { break };
            after = Some(last);
            let bad = node_call(node, Verify { ids: ids.clone() }).await?;
            let bad: HashSet<ChunkId> = bad.into_iter().collect();
            for id in &ids {
                if bad.contains(id) {
                    damage
                        .push(format!("node {}: chunk {id} is corrupt (its content does not hash to its id)", info.id));
                } else {
                    present.insert((info.id.clone(), *id));
                }
            }
            verified += ids.len() as u64;
            bar.set_position(verified);
            if ids.len() < 256 {
                break;
            }
        }
    }
    bar.finish_and_clear();
    // Copies the catalogue lists on a reachable node that does not hold them intact: the
    // chunk is short of a copy (degraded) while another is intact, lost (damage) if none is.
    let mut missing = 0u64;
    for (id, (_, nodes)) in &referenced {
        let reachable: Vec<&String> = nodes.iter().filter(|n| cluster.nodes.iter().any(|(i, _)| &i.id == *n)).collect();
        let intact = |n: &&String| present.contains(&((*n).clone(), *id));
        if reachable.is_empty() {
            continue;
        }
        if !reachable.iter().any(intact) {
            damage.push(format!("chunk {id} is referenced but no intact copy is on {nodes:?}"));
            continue;
        }
        for n in reachable.iter().filter(|n| !intact(n)) {
            println!("MISSING COPY: chunk {id} is catalogued on node {n}, which holds no intact copy of it");
            missing += 1;
        }
    }
    println!("fsck: {extents} extents, {} referenced chunks, {verified} stored chunks verified", referenced.len());
    let short = report_under_replicated(&cluster.meta).await? + missing;
    if damage.is_empty() && short == 0 {
        println!("fsck: clean");
        Ok(ExitCode::SUCCESS)
    } else if damage.is_empty() {
        println!("fsck: degraded: nothing is damaged, but {short} chunks have fewer copies than their policy asks for");
        Ok(ExitCode::from(FSCK_DEGRADED))
    } else {
        for d in &damage {
            println!("DAMAGE: {d}");
        }
        println!("fsck: {} problems found", damage.len());
        Ok(ExitCode::FAILURE)
    }
}

/// `locus node drain ID [--undo]`, `locus node admit ID`, `locus node remove ID [--force]`.
pub async fn node_action(action: crate::cli::NodeAction) -> anyhow::Result<ExitCode> {
    use crate::cli::NodeAction as A;
    let addr = crate::local::meta_addr(action.meta());
    let meta = connect_meta(&addr, Duration::from_secs(30)).await?;
    match action {
        A::Drain { id, undo, .. } => {
            meta_call(&meta, DrainNode { node: id.clone(), drained: !undo })
                .await
                .with_context(|| format!("node {id}"))?;
            if undo {
                println!("node {id} takes chunks again");
            } else {
                println!(
                    "node {id} is draining: the repair workers copy its chunks to other nodes; `locus fsck` shows what is left"
                );
            }
        }
        A::Admit { id, .. } => {
            meta_call(&meta, AdmitNode { node: id.clone() }).await.with_context(|| format!("node {id}"))?;
            println!(
                "node {id} is admitted: meta accepts its registrations (a waiting node joins at its next heartbeat)"
            );
        }
        A::Token { ttl, .. } => {
            let t = meta_call(&meta, MakeJoinToken { ttl_secs: ttl.as_secs() }).await?;
            println!("{}", t.token);
            eprintln!(
                "join token valid for {} s, once: `locus node --join-token TOKEN ...` (a node certificate of this \
                 cluster is still required)",
                t.ttl_secs
            );
        }
        A::Remove { id, force, .. } => remove_node(&meta, &id, force).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Drains `id` and waits, showing progress, until no chunk is held by it alone
/// (among live, undrained nodes); then removes it.
async fn remove_node(meta: &RpcClient, id: &str, force: bool) -> anyhow::Result<()> {
    let registered = meta_call(meta, ListNodes {}).await?.iter().any(|n| n.id == id);
    if registered {
        meta_call(meta, DrainNode { node: id.to_string(), drained: true })
            .await
            .with_context(|| format!("node {id}"))?;
    }
    let mut only_here = sole_copies(meta, id).await?;
    if force {
        if only_here > 0 {
            eprintln!(
                "WARNING: --force: node {id} is removed now, with {only_here} chunks of which it holds the only copy; \
                 the files using them become unreadable (`locus fsck` lists them)"
            );
        }
    } else if only_here > 0 {
        println!("node {id} is draining: waiting until the {only_here} chunks only it holds are copied elsewhere");
        let (bar, total) = (progress(only_here, "copied"), only_here);
        while only_here > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            only_here = sole_copies(meta, id).await?;
            bar.set_position(total.saturating_sub(only_here));
            // Without a terminal (scripts, logs) the bar is hidden: print a line instead.
            if bar.is_hidden() {
                println!("node {id}: {only_here} chunks still held only there");
            }
        }
        bar.finish_and_clear();
    }
    meta_call(meta, RemoveNode { node: id.to_string() }).await.with_context(|| format!("node {id}"))?;
    println!(
        "node {id} is removed: meta forgot it and refuses its registrations from now on. Its certificate stays valid \
         for other uses until you revoke it: `locus ca revoke {id}` (then restart meta with the new list, or let it \
         reload --revoked)"
    );
    Ok(())
}

/// How many referenced chunks `id` holds that no other live, undrained node holds a
/// replica of (a site-cache copy elsewhere may be evicted at any time).
async fn sole_copies(meta: &RpcClient, id: &str) -> anyhow::Result<u64> {
    let others: HashSet<String> = meta_call(meta, ListNodes {})
        .await?
        .into_iter()
        .filter(|n| n.id != id && !n.drained && n.last_seen_secs < 60)
        .map(|n| n.id)
        .collect();
    let (mut after, mut count) = (None, 0);
    loop {
        let page = meta_call(meta, ListChunks { after, limit: PAGE }).await?;
        count += page
            .iter()
            .filter(|c| c.refcount > 0 && c.nodes.iter().any(|n| n == id) && !c.replicas().any(|n| others.contains(n)))
            .count() as u64;
        match page.last() {
            Some(last) if page.len() == PAGE as usize => after = Some(last.id),
            _ => return Ok(count),
        }
    }
}

/// fsck's exit code when nothing is damaged but chunks are short of copies (as Ceph's
/// HEALTH_WARN): distinct from 0 (clean) and 1 (damage found, or fsck failed).
const FSCK_DEGRADED: u8 = 3;

/// The third part of fsck: chunks whose live copies fall short of their policy,
/// counted per policy and site (the repair workers restore them; a chunk with no
/// copy at all is damage found above); answers how many.
async fn report_under_replicated(meta: &RpcClient) -> anyhow::Result<u64> {
    let mut per: std::collections::BTreeMap<(String, String), (u64, u64, Vec<ChunkId>)> = Default::default();
    let mut after = None;
    loop {
        let page = meta_call(meta, UnderReplicated { node: None, after, limit: PAGE }).await?;
        for c in page.chunks {
            let sites = if c.sites.is_empty() { "no live replica".to_string() } else { c.sites.join(",") };
            let e = per.entry((c.policy.to_string(), sites)).or_default();
            e.0 += 1;
            e.1 += c.size;
            if e.2.len() < 3 {
                e.2.push(c.id);
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if per.is_empty() {
        println!("fsck: every chunk has the copies its policy asks for");
    }
    let short = per.values().map(|(chunks, _, _)| chunks).sum();
    for ((policy, sites), (chunks, bytes, examples)) in per {
        println!(
            "UNDER-REPLICATED: {chunks} chunks ({}) short at {sites} under [{policy}], e.g. {examples:?}",
            human(bytes)
        );
    }
    Ok(short)
}

/// gc refuses (without `--force`) when more than this share of the stored chunks, and
/// at least `SUSPICIOUS_MIN` of them, are unreferenced: the catalogue looks empty.
const SUSPICIOUS_SHARE: f64 = 0.9;
const SUSPICIOUS_MIN: u64 = 100;

pub async fn gc(args: GcArgs) -> anyhow::Result<ExitCode> {
    let cluster = Cluster::connect(&crate::local::meta_addr(args.meta.as_deref())).await?;
    if !cluster.unreachable.is_empty() {
        bail!(
            "gc needs every node; unreachable: {:?}",
            cluster.unreachable.iter().map(|(n, _)| &n.id).collect::<Vec<_>>()
        );
    }
    // 1. Find the unreferenced chunks of every node, deleting nothing yet.
    let total: u64 = cluster.nodes.iter().map(|(n, _)| n.chunk_count).sum();
    let bar = progress(total, "scanning");
    let mut scanned = 0u64;
    let mut garbage: Vec<Vec<ChunkId>> = Vec::with_capacity(cluster.nodes.len());
    // The oldest epoch of the primary role among meta's answers: every delete states
    // it, so a node that has seen a newer one refuses (meta lost the role meanwhile).
    let mut epoch = u64::MAX;
    for (_, node) in &cluster.nodes {
        let mut found = Vec::new();
        let mut after = None;
        loop {
            let ids = node_call(node, List { after, limit: PAGE }).await?;
            let Some(last) = ids.last().copied() else { break };
            after = Some(last);
            scanned += ids.len() as u64;
            let full_page = ids.len() as u32 == PAGE;
            let unreferenced = meta_call(&cluster.meta, Unreferenced { ids }).await?;
            epoch = epoch.min(unreferenced.epoch);
            found.extend(unreferenced.ids);
            bar.set_position(scanned);
            if !full_page {
                break;
            }
        }
        garbage.push(found);
    }
    bar.finish_and_clear();
    let unreferenced: u64 = garbage.iter().map(|g| g.len() as u64).sum();
    let age = args.min_age.as_secs();
    if args.dry_run {
        for ((info, _), ids) in cluster.nodes.iter().zip(&garbage) {
            for id in ids {
                println!("would delete (if older than {age}s): node {} chunk {id}", info.id);
            }
        }
        println!("gc --dry-run: {scanned} chunks scanned, {unreferenced} unreferenced; nothing deleted");
        return Ok(ExitCode::SUCCESS);
    }
    if !args.force && unreferenced >= SUSPICIOUS_MIN && unreferenced as f64 > SUSPICIOUS_SHARE * scanned as f64 {
        bail!(
            "gc refuses to delete {unreferenced} of the {scanned} chunks stored on the nodes: meta's catalogue \
             references almost none of them, which is what a wrong or newly created metadata database looks \
             like. Check that meta runs on this cluster's database, list the candidates with `locus gc \
             --dry-run`, and only if you really removed nearly everything run `locus gc --force`"
        );
    }
    // 2. Delete them, page by page, and let meta forget what is gone.
    let mut deleted = 0u64;
    for ((info, node), ids) in cluster.nodes.iter().zip(garbage) {
        for page in ids.chunks(PAGE as usize) {
            let req = Delete { ids: page.to_vec(), min_age_secs: age, epoch };
            let n = node_call(node, req)
                .await
                .with_context(|| format!("node {} refused to delete chunks meta found unreferenced", info.id))?;
            deleted += n;
            meta_call(&cluster.meta, ForgetChunks { ids: page.to_vec() }).await?;
        }
    }
    println!("gc: {scanned} chunks scanned, {deleted} unreferenced chunks older than {age}s deleted");
    Ok(ExitCode::SUCCESS)
}

/// `locus login`: asks meta for a login with this process's certificate (the person's
/// own, of role `user`) and leaves it where this host's mounts look (a file named
/// after the uid, the user's own, 0600), replacing an older one atomically.
pub async fn login(args: LoginArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let meta = connect_meta(&args.meta, Duration::from_secs(30)).await?;
    let token = meta_call(&meta, Login { lifetime_secs: args.lifetime.as_secs() }).await?;
    // Who runs this: the owner of this process's own /proc entry.
    let me = std::fs::metadata("/proc/self").context("cannot tell which user runs this")?.uid();
    if me != 0 && me != token.uid {
        bail!(
            "this certificate is {}, uid {} at site {}, and you are uid {me}: log in as that user",
            token.principal,
            token.uid,
            token.site
        );
    }
    let path = args.logins.join(token.uid.to_string());
    let tmp = args.logins.join(format!(".{}.{}", token.uid, std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(format!("{}\n", token.to_text()).as_bytes())?;
        f.sync_all()?;
        if me == 0 {
            std::os::unix::fs::chown(&tmp, Some(token.uid), None)?;
        }
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| {
            format!("cannot leave the login in {} (is a mount running here? its --logins)", args.logins.display())
        });
    }
    println!(
        "logged in as {}: uid {} at site {} until {} UTC ({})",
        token.principal,
        token.uid,
        token.site,
        utc(token.expires_ms),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}
