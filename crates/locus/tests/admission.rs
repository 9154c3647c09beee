//! Node membership against real processes: a node with a valid node certificate of
//! the cluster stays pending (listed by `locus status`, given no chunks) until an
//! operator runs `locus node admit`; `locus node remove` drains it, waits until its
//! chunks have copies elsewhere, removes it, and its later registrations are refused.
//! A join token (`locus node token`) admits the one node that spends it first.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::{Cluster, pattern};

const BIN: &str = env!("CARGO_BIN_EXE_locus");

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The chunk ids (hex file names) in a node's store.
fn chunks_on(c: &Cluster, node: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Ok(fans) = fs::read_dir(c.node_dir(node).join("chunks")) else { return out };
    for fan in fans.flatten().filter(|f| f.path().is_dir()) {
        for f in fs::read_dir(fan.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.len() == 64 {
                out.insert(name);
            }
        }
    }
    out
}

fn status(c: &Cluster) -> String {
    text(&c.locus(&["status", "--meta", &c.meta.addr]))
}

/// Whether `locus status` lists `id` in its table of nodes.
fn listed(status: &str, id: &str) -> bool {
    let mut table = status.lines().skip_while(|l| !l.starts_with("nodes:")).take_while(|l| !l.contains("total:"));
    table.any(|l| l.split_whitespace().next() == Some(id))
}

/// Waits (bounded) until `what` holds, polling.
fn eventually(what: &str, secs: u64, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_node_joins_only_once_admitted_and_a_removed_node_cannot_return() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let fast: &[&str] = &["--repair-every", "1s"];
    let mut c = Cluster::start(Path::new(BIN), 0);
    c.add_node_with("n0", "a", fast);
    c.add_node_with("n1", "a", fast);
    c.wait_for_nodes(2);

    // A node with a valid certificate that nobody admitted waits, listed as pending.
    c.add_pending_node("n2", "a", &[]);
    let log = c.path().join("n2.log");
    eventually("the pending node logs its refusal", 10, || {
        fs::read_to_string(&log).unwrap_or_default().contains("node n2 is not admitted; run `locus node admit n2`")
    });
    let s = status(&c);
    let pending = s.split("pending admission").nth(1).unwrap_or_else(|| panic!("no pending section: {s}"));
    assert!(pending.contains("n2") && pending.contains("certificate n2 of site a"), "{s}");
    let m = c.mount_at("a");
    let data = pattern(24 << 20, 1);
    testkit::write_synced(&m.join("f"), &data).unwrap();
    assert!(chunks_on(&c, "n2").is_empty(), "a pending node got chunks");

    // Its own node certificate cannot admit it.
    let mut own = vec!["node".to_string(), "admit".into(), "n2".into(), "--meta".into(), c.meta.addr.clone()];
    own.extend(c.cert("node", "n2", "a"));
    let out = std::process::Command::new(BIN).args(&own).output().unwrap();
    assert!(!out.status.success(), "a node admitted itself");
    assert!(text(&out).contains("may not ask AdmitNode: that takes a certificate of role admin"), "{}", text(&out));

    // Admitted, it joins at its next heartbeat and takes writes.
    let out = c.locus(&["node", "admit", "n2", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_for_nodes(3);
    assert!(!status(&c).contains("pending admission"), "{}", status(&c));
    let fresh = c.mount_at("a");
    let more = pattern(48 << 20, 2);
    testkit::write_synced(&fresh.join("g"), &more).unwrap();
    let held = chunks_on(&c, "n2");
    assert!(!held.is_empty(), "the admitted node took no chunks");

    // Removal drains it, waits for its chunks to be copied, then forgets it.
    let out = c.locus(&["node", "remove", "n2", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("locus ca revoke n2"), "{}", text(&out));
    let elsewhere: BTreeSet<String> = chunks_on(&c, "n0").union(&chunks_on(&c, "n1")).cloned().collect();
    assert!(held.is_subset(&elsewhere), "remove returned before every chunk of n2 was copied elsewhere");
    let s = status(&c);
    assert!(!listed(&s, "n2") && !s.contains("node n2 "), "{s}");

    // Started again, it is refused (and not pending); the data reads whole without it.
    c.restart_node(2);
    eventually("the removed node logs its refusal", 10, || {
        fs::read_to_string(&log).unwrap_or_default().contains("node n2 was removed from the cluster")
    });
    let s = status(&c);
    assert!(!listed(&s, "n2") && !s.contains("pending admission"), "{s}");
    let _ = c.nodes[2].child.kill();
    let _ = c.nodes[2].child.wait();
    let last = c.mount_at("a");
    assert!(fs::read(last.join("f")).unwrap() == data, "f reads whole without n2");
    assert!(fs::read(last.join("g")).unwrap() == more, "g reads whole without n2");
}

#[test]
fn a_join_token_admits_one_node_once() {
    let mut c = Cluster::start(Path::new(BIN), 1);
    let out = c.locus(&["node", "token", "--ttl", "1h", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("locus-join-"), "{}", text(&out));
    c.add_pending_node("t1", "default", &["--join-token", &token]);
    c.wait_for_nodes(2);
    // The same token again: refused, and the node stops with the reason.
    c.add_pending_node("t2", "default", &["--join-token", &token]);
    let exit = c.nodes[2].child.wait().unwrap();
    assert!(!exit.success(), "a second node joined with a spent token");
    let log = fs::read_to_string(c.path().join("t2.log")).unwrap();
    assert!(log.contains("node t2 offered a join token meta does not know"), "{log}");
    let s = status(&c);
    assert!(listed(&s, "t1") && !listed(&s, "t2"), "{s}");
}
