//! Replication across sites (real processes). The cross-site tests put each site in
//! its own network namespace joined by the `locus-wan` emulator (20 ms RTT): a `sync`
//! write survives kill -9 of every process of the writing site, also with a process
//! killed at each fail point of the replication path (over a WAN losing 0.5 % of the
//! packets each way, meta at a site of its own); with the WAN cut (100 % loss) a `sync`
//! write fails with EIO within the sync timeout, and an `async` write keeps going and,
//! once the cut heals, ships exactly the missing chunks. Repair, scrub, drain and the
//! site-cache tests stay on loopback (sites named per node).

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::netns::{self, LinkProfile, WanLink};
use testkit::{Cluster, files_under, pattern, write_synced};

const BIN: &str = env!("CARGO_BIN_EXE_locus");

/// Meta plus the given nodes (id, site, extra flags).
fn cluster(nodes: &[(&str, &str, &[&str])]) -> Option<Cluster> {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return None;
    }
    let mut c = Cluster::start(Path::new(BIN), 0);
    for (id, site, flags) in nodes {
        c.add_node_with(id, site, flags);
    }
    c.wait_for_nodes(nodes.len());
    Some(c)
}

fn policy(c: &Cluster, args: &[&str]) -> std::process::Output {
    let mut all = vec!["policy"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--meta", &c.meta.addr]);
    c.locus(&all)
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn chunks_of(c: &Cluster, node: &str) -> usize {
    files_under(&c.node_dir(node).join("chunks")).0
}

fn metric(addr: &str, name: &str) -> u64 {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics:\n{body}"))
}

#[test]
fn policies_are_set_inherited_listed_and_checked() {
    let Some(mut c) = cluster(&[("a0", "a", &[]), ("a1", "a", &[]), ("b0", "b", &[])]) else { return };
    let m = c.mount_at("a");
    fs::create_dir_all(m.join("p/sub")).unwrap();
    fs::write(m.join("p/f"), b"x").unwrap();

    let set = policy(&c, &["set", "/p", "--sites", "a,b", "--copies", "2", "--mode", "sync", "--rpo", "20s"]);
    assert!(set.status.success(), "{}", text(&set));
    assert!(text(&set).contains("warning") && text(&set).contains("site b"), "b has one node:\n{}", text(&set));
    let get = policy(&c, &["get", "/p/sub"]);
    assert!(get.status.success(), "{}", text(&get));
    assert!(text(&get).contains("sites a,b copies 2 mode sync rpo 20s (inherited from /p)"), "{}", text(&get));
    let file = policy(&c, &["get", "/p/f"]);
    assert!(text(&file).contains("inherited from /p"), "{}", text(&file));
    let root = policy(&c, &["get", "/"]);
    assert!(text(&root).contains("cluster default"), "{}", text(&root));

    let on_file = policy(&c, &["set", "/p/f", "--sites", "a"]);
    assert!(!on_file.status.success() && text(&on_file).contains("directory"), "{}", text(&on_file));
    let unknown = policy(&c, &["set", "/p", "--sites", "a,mars"]);
    assert!(!unknown.status.success() && text(&unknown).contains("unknown site \"mars\""), "{}", text(&unknown));

    let list = policy(&c, &["list"]);
    assert!(text(&list).lines().any(|l| l.starts_with("/p ") && l.contains("sites a,b")), "{}", text(&list));
    let status = c.locus(&["status", "--meta", &c.meta.addr]);
    let shown = text(&status);
    assert!(shown.contains("replication policies:") && shown.contains("/p "), "{shown}");
    assert!(shown.contains("warning:") && shown.contains("site b"), "{shown}");

    let clear = policy(&c, &["set", "/p", "--clear"]);
    assert!(clear.status.success(), "{}", text(&clear));
    assert!(text(&policy(&c, &["get", "/p/sub"])).contains("cluster default"));
}

/// One-way delay of the emulated WAN (20 ms RTT).
const WAN_DELAY: Duration = Duration::from_millis(10);
/// Loss each way of the WAN in the crash tests: TCP retransmits on every path.
const LOSSY: f64 = 0.5;

/// `sites` as network namespaces joined by the `locus-wan` emulator set to `profile`,
/// meta alone started at `sites[0]`. `None` (skipped) when the kernel or tools lack
/// network namespaces.
fn wan_sites(prefix: &str, sites: &[&str], profile: &LinkProfile) -> Option<(WanLink, Cluster)> {
    if !testkit::can_mount() || !netns::available() || !netns::have_ethtool() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns` and ethtool");
        return None;
    }
    let link = WanLink::start(prefix, sites.len(), profile)
        .expect("start the WAN emulator (build it first: `cargo build -p testkit --bin locus-wan`)");
    let c = Cluster::start_in_sites(Path::new(BIN), &link, sites);
    Some((link, c))
}

/// Sites a and b over the emulated WAN (20 ms RTT, no loss), meta at a, and the given
/// nodes (id, site, extra flags) each in its site's namespace.
fn wan_cluster(prefix: &str, nodes: &[(&str, &str, &[&str])]) -> Option<(WanLink, Cluster)> {
    let (link, mut c) = wan_sites(prefix, &["a", "b"], &wan(0.0))?;
    for (id, site, flags) in nodes {
        c.add_node_with(id, site, flags);
    }
    c.wait_for_nodes(nodes.len());
    Some((link, c))
}

#[test]
fn a_sync_write_survives_the_loss_of_every_process_of_the_writing_site() {
    let Some((_link, mut c)) = wan_sites("lwt-rkill-", &["m", "a", "b"], &wan(LOSSY)) else { return };
    for (id, site) in [("a0", "a"), ("b0", "b"), ("b1", "b")] {
        c.add_node(id, site);
    }
    c.wait_for_nodes(3);
    let at_a = c.mount_at("a");
    fs::create_dir(at_a.join("d")).unwrap();
    let set = policy(&c, &["set", "/d", "--sites", "a,b", "--copies", "2", "--mode", "sync"]);
    assert!(set.status.success(), "{}", text(&set));
    let data = pattern(10 << 20, 21);
    write_synced(&at_a.join("d/f"), &data).unwrap();
    // One copy at a (one node), two at b.
    let ids =
        |node: &str| chunk_files(&c, node).into_iter().map(|(id, _)| id).collect::<std::collections::BTreeSet<_>>();
    let stored = ids("a0");
    assert!(stored.len() >= 3, "{stored:?}");
    assert!(ids("b0") == stored && ids("b1") == stored, "both nodes of b hold every chunk");

    // kill -9 every process of site a (meta is at site m).
    c.kill_site("a");
    let at_b = c.mount_at("b");
    assert!(fs::read(at_b.join("d/f")).unwrap() == data, "every fsynced byte is readable at b");

    // Once a0 counts as gone, fsck reports every chunk short at site a.
    std::thread::sleep(Duration::from_secs(proto::policy::NODE_GONE_SECS + 1));
    let fsck = text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
    let short = format!("UNDER-REPLICATED: {} chunks (10.0 MiB) short at a under [sites a,b copies 2", stored.len());
    assert!(fsck.contains(&short), "{fsck}");
}

/// The WAN's settings with `loss_pct` % loss each way (100: the sites are cut apart).
fn wan(loss_pct: f64) -> LinkProfile {
    LinkProfile { delay: WAN_DELAY, loss_pct, ..LinkProfile::default() }
}

/// Bytes the emulator has delivered from site `from` to site `to`.
fn wan_bytes(link: &WanLink, from: usize, to: usize) -> u64 {
    let stats = link.stats().expect("WAN emulator stats");
    let line = stats.lines().find(|l| l.starts_with(&format!("s{from}->s{to} "))).unwrap_or_else(|| panic!("{stats}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("released_bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no released_bytes in {line}"))
}

#[test]
fn sync_and_semi_sync_writes_across_a_cut_wan_fail_with_eio_in_bounded_time() {
    let timeout: &[&str] = &["--sync-timeout", "3s"];
    let Some((link, mut c)) = wan_cluster("lwt-rsync-", &[("a0", "a", timeout), ("b0", "b", &[])]) else { return };
    let at_a = c.mount_at("a");
    for (i, mode) in ["sync", "semi-sync"].into_iter().enumerate() {
        let dir = at_a.join(mode);
        fs::create_dir(&dir).unwrap();
        let set = policy(&c, &["set", &format!("/{mode}"), "--sites", "a,b", "--copies", "1", "--mode", mode]);
        assert!(set.status.success(), "{}", text(&set));
        let seed = 10 * i as u64;
        write_synced(&dir.join("before"), &pattern(1 << 20, seed + 1)).unwrap();
        // semi-sync: b has received it; its durable copy follows at once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while chunks_of(&c, "b0") < 2 * i + 1 {
            assert!(Instant::now() < deadline, "{mode}: b never stored the chunk");
            std::thread::sleep(Duration::from_millis(50));
        }

        link.set(&wan(100.0)).unwrap();
        let started = Instant::now();
        let err = write_synced(&dir.join("during"), &pattern(1 << 20, seed + 2)).unwrap_err();
        let took = started.elapsed();
        link.set(&wan(0.0)).unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{mode}: {err}");
        assert!(took < Duration::from_secs(10), "{mode}: fsync took {took:?} with a 3 s sync timeout");
        let log = fs::read_to_string(c.path().join("a0.log")).unwrap();
        assert!(log.contains("did not complete within the sync timeout"), "{log}");

        // Once the cut heals, writes succeed again.
        let started = Instant::now();
        write_synced(&dir.join("after"), &pattern(1 << 20, seed + 3)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "{mode}: took {:?} after healing", started.elapsed());
    }
}

#[test]
fn an_async_write_goes_on_while_the_wan_is_cut_and_ships_only_what_it_missed() {
    let metrics = format!("{}:9101", WanLink::addr_of(0));
    let flags: &[&str] = &["--sync-timeout", "2s", "--metrics", &metrics];
    let Some((link, mut c)) = wan_cluster("lwt-rasync-", &[("a0", "a", flags), ("b0", "b", &[])]) else { return };
    let metric = |name: &str| {
        let (addr, name) = (metrics.clone(), name.to_string());
        netns::enter_and_run(link.site_ns(0), move || metric(&addr, &name)).unwrap()
    };
    let at_a = c.mount_at("a");
    fs::create_dir(at_a.join("d")).unwrap();
    let set = policy(&c, &["set", "/d", "--sites", "a,b", "--copies", "1", "--mode", "async", "--rpo", "1s"]);
    assert!(set.status.success(), "{}", text(&set));
    let shipped = |c: &Cluster| (metric("locus_replication_shipped_bytes_total"), chunks_of(c, "b0"));
    let drained = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric("locus_replication_lag_chunks") > 0 {
            assert!(Instant::now() < deadline, "{what}: the replication queue did not drain");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    write_synced(&at_a.join("d/before"), &pattern(3 << 20, 4)).unwrap();
    drained("before the cut");
    let (bytes_before, at_b_before) = shipped(&c);
    assert_eq!((bytes_before, at_b_before), (3 << 20, 1));

    link.set(&wan(100.0)).unwrap();
    let started = Instant::now();
    let during: Vec<Vec<u8>> = (0..3).map(|i| pattern(2 << 20, 10 + i)).collect();
    for (i, d) in during.iter().enumerate() {
        write_synced(&at_a.join(format!("d/during{i}")), d).unwrap();
    }
    // Rewriting bytes b already has ships nothing.
    write_synced(&at_a.join("d/again"), &pattern(3 << 20, 4)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "async writes do not wait for b");
    std::thread::sleep(Duration::from_secs(1));
    assert!(metric("locus_replication_lag_chunks") >= 3, "the lag grows during the cut");
    assert!(metric("locus_replication_lag_oldest_seconds") >= 1);
    // Status shows the lag per policy and site, and the breach of the 1 s RPO.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let shown = text(&c.locus(&["status", "--meta", &c.meta.addr]));
        let lag = shown.lines().any(|l| l.contains("to site b") && l.contains(" chunks") && l.contains("rpo 1s"));
        if lag && shown.contains("warning: RPO breached") {
            break;
        }
        assert!(Instant::now() < deadline, "no lag or breach in status:\n{shown}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let log = fs::read_to_string(c.path().join("a0.log")).unwrap();
    assert!(log.contains("replication lag breaches the RPO"), "{log}");
    assert_eq!(chunks_of(&c, "b0"), 1, "nothing crossed the cut");

    let wan_before = wan_bytes(&link, 0, 1);
    link.set(&wan(0.0)).unwrap();
    drained("after the cut");
    let (bytes_after, at_b_after) = shipped(&c);
    let crossed = wan_bytes(&link, 0, 1) - wan_before;
    assert_eq!(bytes_after - bytes_before, 6 << 20, "exactly the chunks written during the cut were shipped");
    // The emulator saw those bytes cross, plus framing, TLS and the nodes' small talk.
    assert!(
        (6 << 20..(6 << 20) * 21 / 20 + (256 << 10)).contains(&crossed),
        "{crossed} bytes crossed A->B after healing for 6 MiB of chunks"
    );
    assert_eq!(at_b_after, 4, "b holds every chunk");
    let at_b = c.mount_at("b");
    for (i, d) in during.iter().enumerate() {
        assert!(fs::read(at_b.join(format!("d/during{i}"))).unwrap() == *d);
    }
}

/// Every chunk file of a node's store: (id in hex, path).
fn chunk_files(c: &Cluster, node: &str) -> Vec<(String, std::path::PathBuf)> {
    files_of_store(&c.node_dir(node))
}

/// Every chunk file of a node's site cache: (id in hex, path).
fn cached_files(c: &Cluster, node: &str) -> Vec<(String, std::path::PathBuf)> {
    files_of_store(&c.node_dir(node).join("cache"))
}

/// Every chunk file of the chunk store in `dir`: (id in hex, path).
fn files_of_store(dir: &Path) -> Vec<(String, std::path::PathBuf)> {
    let mut out = Vec::new();
    let Ok(fans) = fs::read_dir(dir.join("chunks")) else { return out };
    for fan in fans.flatten().filter(|f| f.path().is_dir()) {
        for f in fs::read_dir(fan.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.len() == 64 {
                out.push((name, f.path()));
            }
        }
    }
    out
}

#[test]
fn repair_restores_copies_after_a_node_is_lost_and_scrub_replaces_a_corrupt_copy() {
    let fast: &[&str] = &["--repair-every", "1s", "--scrub-every", "1s"];
    let Some(mut c) = cluster(&[("n0", "a", fast), ("n1", "a", fast), ("n2", "a", fast)]) else { return };
    let m = c.mount_at("a");
    let data = pattern(20 << 20, 5);
    write_synced(&m.join("f"), &data).unwrap();
    let copies = |c: &Cluster, nodes: &[&str]| {
        let mut per_chunk: std::collections::HashMap<String, usize> = Default::default();
        for n in nodes {
            for (id, _) in chunk_files(c, n) {
                *per_chunk.entry(id).or_default() += 1;
            }
        }
        per_chunk
    };
    let all = copies(&c, &["n0", "n1", "n2"]);
    assert!(all.len() >= 5, "at least five chunks: {all:?}");
    assert!(all.values().all(|n| *n == 2), "the default policy keeps two copies at a three-node site: {all:?}");

    // Lose the node holding the most copies.
    let victim = (0..3).max_by_key(|i| chunk_files(&c, &format!("n{i}")).len()).unwrap();
    let _ = c.nodes[victim].child.kill();
    let _ = c.nodes[victim].child.wait();
    let alive: Vec<String> = (0..3).filter(|i| *i != victim).map(|i| format!("n{i}")).collect();
    let alive: Vec<&str> = alive.iter().map(String::as_str).collect();
    let started = Instant::now();
    loop {
        let now = copies(&c, &alive);
        if now.len() == all.len() && now.values().all(|n| *n == 2) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(40), "repair did not restore two copies: {now:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The new copies reach the catalogue with the repairing node's next heartbeat.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let fsck = text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
        if fsck.contains("every chunk has the copies its policy asks for") {
            break;
        }
        assert!(Instant::now() < deadline, "{fsck}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = text(&c.locus(&["status", "--meta", &c.meta.addr]));
    assert!(status.lines().any(|l| l.contains(" repair ") && l.contains("repaired")), "{status}");

    // Flip a byte of one copy: reads never see it, and scrub puts a good copy back.
    let (id, path) = chunk_files(&c, alive[0]).into_iter().next().unwrap();
    let good = fs::read(&path).unwrap();
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0x40;
    fs::write(&path, &bad).unwrap();
    let fresh = c.mount_at("a");
    assert!(fs::read(fresh.join("f")).unwrap() == data, "a corrupt copy is never returned");
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = c.path().join(format!("{}.log", alive[0]));
    // The copy is replaced first, then the replacement logged.
    while fs::read(&path).unwrap() != good
        || !fs::read_to_string(&log).unwrap().contains("scrub replaced a corrupt copy")
    {
        assert!(Instant::now() < deadline, "scrub did not replace the corrupt copy of {id}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_drained_node_is_emptied_into_the_others_and_can_then_be_removed() {
    let fast: &[&str] = &["--repair-every", "1s"];
    let Some(mut c) = cluster(&[("n0", "a", fast), ("n1", "a", fast), ("n2", "a", fast)]) else { return };
    let m = c.mount_at("a");
    let data = pattern(20 << 20, 6);
    write_synced(&m.join("f"), &data).unwrap();
    let chunks = ["n0", "n1", "n2"].iter().flat_map(|n| chunk_files(&c, n)).map(|(id, _)| id);
    let chunks: std::collections::BTreeSet<String> = chunks.collect();
    let victim = (0..3).max_by_key(|i| chunk_files(&c, &format!("n{i}")).len()).unwrap();
    let id = format!("n{victim}");
    let out = c.locus(&["node", "drain", &id, "--meta", &c.meta.addr]);
    assert!(out.status.success(), "{}", text(&out));
    let status = text(&c.locus(&["status", "--meta", &c.meta.addr]));
    assert!(status.contains("draining"), "{status}");
    let unknown = c.locus(&["node", "drain", "nobody", "--meta", &c.meta.addr]);
    assert!(!unknown.status.success() && text(&unknown).contains("not registered"), "{}", text(&unknown));

    let others: Vec<String> = (0..3).filter(|i| *i != victim).map(|i| format!("n{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let mut per_chunk: std::collections::HashMap<String, usize> = Default::default();
        for n in &others {
            for (chunk, _) in chunk_files(&c, n) {
                *per_chunk.entry(chunk).or_default() += 1;
            }
        }
        if per_chunk.len() == chunks.len() && per_chunk.values().all(|n| *n == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "the drained node's chunks were not copied: {per_chunk:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // New writes avoid the drained node.
    let before = chunk_files(&c, &id).len();
    write_synced(&m.join("g"), &pattern(8 << 20, 7)).unwrap();
    assert_eq!(chunk_files(&c, &id).len(), before, "a drained node takes no new chunks");

    let _ = c.nodes[victim].child.kill();
    let _ = c.nodes[victim].child.wait();
    let fresh = c.mount_at("a");
    assert!(fs::read(fresh.join("f")).unwrap() == data, "everything is readable without the drained node");
}

#[test]
fn reads_fail_over_to_another_copy_when_a_node_dies() {
    let Some(mut c) = cluster(&[("n0", "a", &[]), ("n1", "a", &[])]) else { return };
    let m = c.mount_at("a");
    let data = pattern(12 << 20, 8);
    write_synced(&m.join("f"), &data).unwrap();
    // Two nodes at the site: the default policy put a copy of every chunk on each.
    assert_eq!(chunk_files(&c, "n0").len(), chunk_files(&c, "n1").len());
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let fresh = c.mount_at("a");
    let started = Instant::now();
    assert!(fs::read(fresh.join("f")).unwrap() == data, "read from the surviving copies");
    assert!(started.elapsed() < Duration::from_secs(10), "failover took {:?}", started.elapsed());
}

/// Writes and fsyncs files into `dir` until one fails; returns the acknowledged ones.
fn write_until_failure(dir: &Path, limit: u64) -> Vec<(u64, Vec<u8>)> {
    let mut acked = Vec::new();
    for i in 0..limit {
        let data = pattern([1000, 300_000, (5 << 20) + 17][(i % 3) as usize], 100 + i);
        if write_synced(&dir.join(format!("f{i}")), &data).is_err() {
            return acked;
        }
        acked.push((i, data));
    }
    acked
}

/// Kills `victim` (a0 at the writing site, or b0 at the other) at the `after + 1`-th
/// pass of `point` while a `sync` a,b directory is written at a (sites over a lossy
/// WAN, meta at a site of its own); then every process of site a is killed, and every
/// fsynced file must be readable at b, byte-exact.
fn sync_survives_a_crash_at(prefix: &str, point: &str, after: u32, victim: &str) {
    let Some((_link, mut c)) = wan_sites(prefix, &["m", "a", "b"], &wan(LOSSY)) else { return };
    for (id, site) in [("a0", "a"), ("b0", "b")] {
        c.arm((id == victim).then(|| format!("{point}={after}*off->return")).as_deref());
        c.add_node(id, site);
    }
    c.arm(None);
    c.wait_for_nodes(2);
    let at_a = c.mount_at("a");
    fs::create_dir(at_a.join("d")).unwrap();
    assert!(policy(&c, &["set", "/d", "--sites", "a,b", "--copies", "1", "--mode", "sync"]).status.success());
    let acked = write_until_failure(&at_a.join("d"), 30);
    let i = if victim == "a0" { 0 } else { 1 };
    let died = Instant::now();
    while !matches!(c.nodes[i].child.try_wait(), Ok(Some(_))) {
        assert!(died.elapsed() < Duration::from_secs(10), "{point} never fired in {victim}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Everything back up without fail points (b0 must serve), then site a gone again.
    c.kill_all();
    c.restart();
    c.kill_site("a");
    let at_b = c.mount_at("b");
    for (i, data) in &acked {
        let got = fs::read(at_b.join(format!("d/f{i}"))).unwrap_or_else(|e| panic!("f{i}: {e}"));
        let first = got.iter().zip(data).position(|(a, b)| a != b);
        assert!(
            got == *data,
            "f{i} differs at b after {victim} crashed at {point}: {} bytes read, {} written, first difference at {first:?}",
            got.len(),
            data.len()
        );
    }
}

#[test]
fn sync_loses_nothing_when_the_writing_node_dies_with_its_copies_in_flight() {
    sync_survives_a_crash_at("lwt-rcrash1-", "replicate-before-copies", 4, "a0");
}

#[test]
fn sync_loses_nothing_when_the_writing_node_dies_after_its_copies() {
    sync_survives_a_crash_at("lwt-rcrash2-", "replicate-after-copies", 4, "a0");
}

#[test]
fn sync_loses_nothing_when_the_remote_node_dies_storing_a_copy() {
    sync_survives_a_crash_at("lwt-rcrash3-", "chunk-before-rename", 4, "b0");
}

#[test]
fn sync_loses_nothing_when_the_remote_node_dies_before_its_site_copies() {
    sync_survives_a_crash_at("lwt-rcrash4-", "replicate-before-copies", 4, "b0");
}

/// Changes to `node`'s site cache its `site-link` worker has reported to meta, as
/// `locus status` shows them (the count moves only once meta has them).
fn cache_changes_reported(c: &Cluster, node: &str) -> u64 {
    let status = text(&c.locus(&["status", "--meta", &c.meta.addr]));
    status
        .lines()
        .find(|l| l.contains(&format!("node {node} ")) && l.contains(" site-link "))
        .and_then(|l| l.split(" cache changes reported").next())
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits (bounded) until `node` has reported at least `at_least()` cache changes
/// (asked again each time: what is expected may settle while the node works).
fn wait_for_cache_reports(c: &Cluster, node: &str, at_least: impl Fn() -> u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cache_changes_reported(c, node) < at_least() {
        let (have, want) = (cache_changes_reported(c, node), at_least());
        assert!(Instant::now() < deadline, "{node} reported {have} cache changes, not {want}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn ids(files: Vec<(String, std::path::PathBuf)>) -> std::collections::BTreeSet<String> {
    files.into_iter().map(|(id, _)| id).collect()
}

#[test]
fn a_cached_copy_is_no_replica_until_repair_pins_it_and_a_replica_outlives_the_cache() {
    let metrics = testkit::free_addr();
    let fast: &[&str] = &["--repair-every", "1s", "--metrics", &metrics];
    let small_cache: &[&str] = &["--repair-every", "1s", "--cache", "12M"];
    let Some(mut c) = cluster(&[("a0", "a", fast), ("b0", "b", small_cache)]) else { return };
    let at_a = c.mount_at("a");
    for d in ["d", "e"] {
        fs::create_dir(at_a.join(d)).unwrap();
        let set = policy(&c, &["set", &format!("/{d}"), "--sites", "a", "--copies", "1", "--mode", "sync"]);
        assert!(set.status.success(), "{}", text(&set));
    }
    let data = pattern(8 << 20, 31);
    write_synced(&at_a.join("d/f"), &data).unwrap();
    let f_chunks = ids(chunk_files(&c, "a0"));
    assert!(f_chunks.len() >= 2, "{f_chunks:?}");

    // A reader at b: b0 fetches the chunks into its site cache and reports them.
    let at_b = c.mount_at("b");
    assert!(fs::read(at_b.join("d/f")).unwrap() == data);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ids(cached_files(&c, "b0")).is_superset(&f_chunks) {
        assert!(Instant::now() < deadline, "b0 did not cache the chunks it served");
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_for_cache_reports(&c, "b0", || f_chunks.len() as u64);
    assert!(chunk_files(&c, "b0").is_empty(), "a cached copy is not stored as a replica");
    let fsck = text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
    assert!(fsck.contains("every chunk has the copies its policy asks for"), "{fsck}");

    // Now the policy wants a copy at b: the cached copies there do not count, so the
    // repair worker makes replicas at b0, which b0 makes from its cached copies (they
    // replace them) without the bytes crossing again.
    let set = policy(&c, &["set", "/d", "--sites", "a,b", "--copies", "1", "--mode", "sync"]);
    assert!(set.status.success(), "{}", text(&set));
    // b0 stores the replica, then drops the cached copy, then answers a0, which counts
    // it: three steps, so the test waits for the last of them before it checks.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let replicas = ids(chunk_files(&c, "b0")).is_superset(&f_chunks);
        let uncached = ids(cached_files(&c, "b0")).is_disjoint(&f_chunks);
        let counted = metric(&metrics, "locus_replication_already_there_total") >= f_chunks.len() as u64;
        if replicas && uncached && counted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "repair made no replica at b0 from its cached copies (replicas there: {replicas}, \
             cached copies gone: {uncached}, counted by a0: {counted})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(metric(&metrics, "locus_replication_shipped_bytes_total"), 0, "no chunk was sent again");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let fsck = text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
        if fsck.contains("every chunk has the copies its policy asks for") {
            break;
        }
        assert!(Instant::now() < deadline, "{fsck}");
        std::thread::sleep(Duration::from_millis(300));
    }

    // Cache pressure at b: 24 MiB of a site-a file read through b0's 12 MiB cache.
    let reported = cache_changes_reported(&c, "b0");
    let other = pattern(24 << 20, 32);
    write_synced(&at_a.join("e/g"), &other).unwrap();
    let g_chunks: std::collections::BTreeSet<String> =
        ids(chunk_files(&c, "a0")).difference(&f_chunks).cloned().collect();
    assert!(fs::read(at_b.join("e/g")).unwrap() == other);
    let kept = || ids(cached_files(&c, "b0")).intersection(&g_chunks).count();
    let deadline = Instant::now() + Duration::from_secs(10);
    while kept() == g_chunks.len() || files_under(&c.node_dir("b0").join("cache/chunks")).1 > 12 << 20 {
        assert!(
            Instant::now() < deadline,
            "b0's cache never evicted ({} of {} chunks of g kept)",
            kept(),
            g_chunks.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every chunk of g is cached once and those gone were evicted: two changes per
    // chunk of g, less one per chunk kept (copies still being written count as
    // evicted until they land, which only asks for more).
    wait_for_cache_reports(&c, "b0", || reported + (2 * g_chunks.len() - kept()) as u64);
    assert!(ids(chunk_files(&c, "b0")).is_superset(&f_chunks), "the cache evicted a replica");
    let fsck = text(&c.locus(&["fsck", "--meta", &c.meta.addr]));
    assert!(fsck.contains("every chunk has the copies its policy asks for"), "{fsck}");

    // Site a gone (kill -9): f is read at b from b0's replicas.
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let fresh = c.mount_at("b");
    assert!(fs::read(fresh.join("d/f")).unwrap() == data, "b0's replicas serve f without site a");
}

#[test]
fn copies_an_async_queue_owed_are_made_by_repair_after_the_node_is_killed() {
    let flags: &[&str] = &["--sync-timeout", "2s", "--repair-every", "1s"];
    let Some((link, mut c)) = wan_cluster("lwt-rrestart-", &[("a0", "a", flags), ("b0", "b", &[])]) else { return };
    let at_a = c.mount_at("a");
    fs::create_dir(at_a.join("d")).unwrap();
    let set = policy(&c, &["set", "/d", "--sites", "a,b", "--copies", "1", "--mode", "async"]);
    assert!(set.status.success(), "{}", text(&set));
    link.set(&wan(100.0)).unwrap();
    let written: Vec<Vec<u8>> = (0..3).map(|i| pattern(2 << 20, 40 + i)).collect();
    for (i, d) in written.iter().enumerate() {
        write_synced(&at_a.join(format!("d/f{i}")), d).unwrap();
    }
    let owed = ids(chunk_files(&c, "a0"));
    assert_eq!(owed.len(), 3, "{owed:?}");
    assert!(chunk_files(&c, "b0").is_empty(), "nothing crossed the cut");
    // kill -9 a0 with its queue of owed copies (in memory), and start it again.
    c.restart_node(0);
    c.wait_for_nodes(2);
    link.set(&wan(0.0)).unwrap();
    let started = Instant::now();
    while !ids(chunk_files(&c, "b0")).is_superset(&owed) {
        assert!(started.elapsed() < Duration::from_secs(30), "the copies owed before the restart were never made");
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = fs::read_to_string(c.path().join("a0.log")).unwrap();
    assert!(log.contains("repaired a chunk's copies"), "repair, not the lost queue, made them:\n{log}");
    let at_b = c.mount_at("b");
    for (i, d) in written.iter().enumerate() {
        assert!(fs::read(at_b.join(format!("d/f{i}"))).unwrap() == *d);
    }
}

#[test]
fn sync_loses_nothing_when_the_writing_node_dies_storing_its_own_copy() {
    sync_survives_a_crash_at("lwt-rcrash5-", "chunk-before-rename", 4, "a0");
}

#[test]
fn sync_loses_nothing_when_the_remote_node_dies_before_syncing_a_copy() {
    sync_survives_a_crash_at("lwt-rcrash6-", "chunk-before-sync", 4, "b0");
}

#[test]
fn sync_loses_nothing_when_the_remote_node_dies_after_its_site_copies() {
    sync_survives_a_crash_at("lwt-rcrash7-", "replicate-after-copies", 4, "b0");
}
