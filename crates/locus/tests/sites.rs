//! Several sites in one cluster (real processes on loopback, a node per site): data
//! written at one site is read at another through the reading site's node, which
//! fetches each chunk once, keeps it in its site cache, fails over between copies and
//! never serves a chunk that arrived corrupted.

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::{Cluster, files_under, pattern};

/// Meta, plus one node per named site (node id = site name + "0").
fn sites(names: &[&str], extra: &[(&str, &[&str])]) -> Option<Cluster> {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return None;
    }
    let mut c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 0);
    for site in names {
        let flags = extra.iter().find(|(s, _)| s == site).map_or(&[][..], |(_, f)| f);
        c.add_node_with(&format!("{site}0"), site, flags);
    }
    c.wait_for_nodes(names.len());
    Some(c)
}

fn cache_dir(c: &Cluster, node: &str) -> PathBuf {
    c.node_dir(node).join("cache").join("chunks")
}

#[test]
fn data_written_at_one_site_is_read_at_another_and_crosses_once() {
    let Some(mut c) = sites(&["a", "b"], &[]) else { return };
    let at_a = c.mount_at("a");
    let data = pattern(13 << 20, 1);
    fs::write(at_a.join("f"), &data).unwrap();
    let stored_at_a = files_under(&c.node_dir("a0").join("chunks")).0;
    assert!(stored_at_a >= 4, "site a stores the file's chunks");
    assert_eq!(files_under(&c.node_dir("b0").join("chunks")).0, 0, "writes stay at the writer's site");

    let at_b = c.mount_at("b");
    assert!(fs::read(at_b.join("f")).unwrap() == data, "site b reads what site a wrote");
    // The copies land on disk just behind the reader.
    let deadline = Instant::now() + Duration::from_secs(10);
    while files_under(&cache_dir(&c, "b0")).0 < stored_at_a && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(files_under(&cache_dir(&c, "b0")).0, stored_at_a, "site b cached every chunk once");

    // Site a goes away: a second reader at b is served entirely from b's cache.
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let again = c.mount_at("b");
    assert!(fs::read(again.join("f")).unwrap() == data, "second reader at b served from the site cache");
}

#[test]
fn nodes_measure_round_trips_between_sites_and_export_metrics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port}");
    let Some(c) = sites(&["a", "b"], &[("b", &["--metrics", &metrics])]) else { return };
    let mut conn = std::net::TcpStream::connect(&metrics).unwrap();
    std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("locus_wan_fetched_bytes_total{node=\"b0\",site=\"b\"} 0"), "{text}");
    for worker in ["heartbeat", "site-link", "reclaim"] {
        let steps = format!("locus_worker_steps_total{{node=\"b0\",site=\"b\",worker=\"{worker}\"}}");
        assert!(text.contains(&steps), "no {worker} worker in the metrics:\n{text}");
    }
    let mut c = c;
    let _mount = c.mount_at("b");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status = c.locus(&["status", "--meta", &c.meta.addr]);
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        let rtts = text.contains("a          -> b") && text.contains("b          -> a");
        // Every process reports its workers: meta's own, each node's, the mount's.
        let workers = ["meta ", "node a0 ", "node b0 ", "session-expiry", "site-link", "reclaim", "compaction"]
            .iter()
            .all(|w| text.contains(w));
        if rtts && workers && text.lines().any(|l| l.contains("session ") && l.contains(" compaction ")) {
            return;
        }
        assert!(Instant::now() < deadline, "round trips or workers missing from status:\n{text}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn the_site_cache_evicts_under_its_cap_and_stays_correct() {
    let Some(mut c) = sites(&["a", "b"], &[("b", &["--cache", "9M"])]) else { return };
    let at_a = c.mount_at("a");
    let files: Vec<Vec<u8>> = (0..4).map(|i| pattern(4 << 20, 10 + i)).collect();
    for (i, d) in files.iter().enumerate() {
        fs::write(at_a.join(format!("f{i}")), d).unwrap();
    }
    let at_b = c.mount_at("b");
    for (i, d) in files.iter().enumerate() {
        assert!(fs::read(at_b.join(format!("f{i}"))).unwrap() == *d, "f{i} read at b");
        // The cap is in bytes: a file's data may be in more than one chunk (a writer's
        // flush can cut one short), so the chunk files are not counted. b0 caches what
        // it fetched in the background, after serving it: checked once that settles.
        let deadline = Instant::now() + Duration::from_secs(5);
        while files_under(&cache_dir(&c, "b0")).1 > 9 << 20 {
            assert!(
                Instant::now() < deadline,
                "the cache holds at most its 9 MiB: {:?}",
                files_under(&cache_dir(&c, "b0"))
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The first file was evicted; a fresh reader fetches it again, correctly.
    let fresh = c.mount_at("b");
    assert!(fs::read(fresh.join("f0")).unwrap() == files[0]);
}

#[test]
fn a_corrupted_transfer_is_fetched_again_never_served() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 0);
    c.arm(Some("node-corrupt-send=2*return"));
    c.add_node("a0", "a");
    c.arm(None);
    c.add_node("b0", "b");
    c.wait_for_nodes(2);
    let at_a = c.mount_at("a");
    let data = pattern(3 << 20, 7);
    fs::write(at_a.join("f"), &data).unwrap();
    let at_b = c.mount_at("b");
    assert!(fs::read(at_b.join("f")).unwrap() == data, "the reader gets the right bytes");
    let log = fs::read_to_string(c.path().join("b0.log")).unwrap();
    assert!(log.contains("arrived corrupted"), "the failpoint fired and was caught:\n{log}");
}

#[test]
fn a_dead_copy_fails_over_to_another_or_errs_in_bounded_time() {
    let Some(mut c) = sites(&["a", "b", "c"], &[]) else { return };
    let at_a = c.mount_at("a");
    let data = pattern(24 << 20, 3);
    fs::write(at_a.join("f"), &data).unwrap();
    fs::write(at_a.join("only-at-a"), pattern(1 << 20, 4)).unwrap();
    // Site c reads the file: its node now holds copies too.
    let at_c = c.mount_at("c");
    assert!(fs::read(at_c.join("f")).unwrap() == data);
    std::thread::sleep(Duration::from_secs(3)); // c's node reports its copies at its heartbeat

    // Site a dies while site b starts reading: b fails over to c's copies.
    let at_b = c.mount_at("b");
    let path = at_b.join("f");
    let reader = std::thread::spawn(move || {
        let mut f = File::open(path)?;
        let mut got = Vec::new();
        f.read_to_end(&mut got).map(|_| got)
    });
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let got = reader.join().unwrap().expect("b reads through c's copies");
    assert!(got == data, "never wrong data");

    // A chunk with no live copy anywhere: EIO, and soon.
    let started = Instant::now();
    let err = fs::read(at_b.join("only-at-a")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

/// The chunk ids (hex) of the chunk store directory `dir`.
fn chunk_names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|fan| fs::read_dir(fan.path()).into_iter().flatten().flatten())
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|name| name.len() == 64)
        .collect()
}

#[test]
fn a_cached_copy_serves_the_other_nodes_of_its_site() {
    let Some(mut c) = sites(&["a", "b"], &[]) else { return };
    let at_a = c.mount_at("a");
    let data = pattern(24 << 20, 3);
    fs::write(at_a.join("f"), &data).unwrap();
    let chunks = chunk_names(&c.node_dir("a0").join("chunks"));
    let at_b = c.mount_at("b");
    assert!(fs::read(at_b.join("f")).unwrap() == data);
    let deadline = Instant::now() + Duration::from_secs(10);
    while chunk_names(&cache_dir(&c, "b0")).len() < chunks.len() {
        assert!(Instant::now() < deadline, "b0 did not cache every chunk");
        std::thread::sleep(Duration::from_millis(50));
    }
    // b0's copies reach the catalogue with its next site-link round (2 s).
    std::thread::sleep(Duration::from_secs(3));

    // A second node at b, and site a gone: the chunks placed on b1 come from b0's cache.
    c.add_node("b1", "b");
    c.wait_for_nodes(3);
    let _ = c.nodes[0].child.kill();
    let _ = c.nodes[0].child.wait();
    let fresh = c.mount_at("b");
    assert!(fs::read(fresh.join("f")).unwrap() == data, "read at b without site a");
    let site_b = ["b0".to_string(), "b1".to_string()];
    let on_b1: Vec<&String> = chunks
        .iter()
        .filter(|hex| {
            let id = proto::types::ChunkId::from_hex(hex).unwrap();
            proto::placement::rendezvous(&id, &site_b, 2)[0] == "b1"
        })
        .collect();
    assert!(!on_b1.is_empty(), "some chunk of the file is placed on b1");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let at_b1 = chunk_names(&cache_dir(&c, "b1"));
        if on_b1.iter().all(|id| at_b1.contains(id)) {
            break;
        }
        assert!(Instant::now() < deadline, "b1 did not fetch {on_b1:?} from b0's cache: it holds {at_b1:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
