//! Hostile peers against real `locus` processes: floods of half frames, pipelined
//! requests whose answers are never read, idle and trickling connections, running out
//! of file descriptors, and a storage node stopped (SIGSTOP) under a writing
//! application. Each must leave the service bounded and serving, and the application
//! answered in bounded time.

use proto::frame::{self, FrameKind, HEADER_LEN, Header};
use proto::meta::{Create, GetAttr, MetaCall, MetaReply, MetaRequest, MetaResult, NewNode, ReadDir};
use proto::types::ROOT_INODE;
use serde::{Serialize, de::DeserializeOwned};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::Cluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS line");
    kb / 1024
}

/// One request and its answer on a plain blocking socket, as any client could send.
fn rpc<Req: Serialize, Resp: DeserializeOwned>(stream: &mut TcpStream, req: &Req) -> Resp {
    stream.write_all(&frame::encode(FrameKind::Request, 1, req, 0).unwrap()).unwrap();
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).unwrap();
    let header = Header::decode(&head).unwrap();
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    let mut bulk = vec![0u8; header.bulk_len as usize];
    stream.read_exact(&mut bulk).unwrap();
    frame::decode(&payload).unwrap()
}

/// Whether meta answers a fresh connection within a few seconds.
fn meta_answers(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else { return false };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req =
        frame::encode(FrameKind::Request, 1, &MetaCall::from(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })), 0)
            .unwrap();
    let mut head = [0u8; HEADER_LEN];
    s.write_all(&req).is_ok() && s.read_exact(&mut head).is_ok() && Header::decode(&head).is_ok()
}

/// Waits (bounded) until `check` holds.
fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the server closed `s` (EOF or reset), waiting at most a moment.
fn is_closed(mut s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

/// 300 connections each announce a 16 MiB payload and send none of it. The old
/// reader allocated (and zeroed) the whole payload from the length prefix: 300 x
/// 16 MiB, 1.8 GB; now memory grows only with bytes that actually arrive.
#[test]
fn header_floods_leave_meta_and_node_memory_bounded() {
    let c = Cluster::start(bin(), 1);
    let targets =
        [("meta", c.meta.child.id(), c.meta.addr.clone()), ("node", c.nodes[0].child.id(), c.nodes[0].addr.clone())];
    for (what, pid, addr) in targets {
        let before = rss_mib(pid);
        let header =
            Header { kind: FrameKind::Request, request_id: 1, payload_len: frame::MAX_PAYLOAD, bulk_len: 0 }.encode();
        let flood: Vec<TcpStream> = (0..300)
            .map(|_| {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.write_all(&header).unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_secs(2));
        let during = rss_mib(pid);
        assert!(during < before + 128, "{what}: RSS {before} MiB -> {during} MiB under the flood");
        drop(flood);
        std::thread::sleep(Duration::from_secs(1));
        let after = rss_mib(pid);
        assert!(after < before + 64, "{what}: RSS {before} MiB -> {after} MiB after the flood");
        eprintln!("{what}: RSS {before} MiB, {during} MiB under 300 half frames, {after} MiB after");
    }
    assert!(meta_answers(&c.meta.addr));
}

/// 200,000 pipelined ReadDir requests (about 10 KB of answer each) whose answers are
/// never read. The old server read and ran every one and queued every answer (GBs);
/// now it stops reading once its in-flight bound is reached.
#[test]
fn pipelined_requests_never_read_keep_meta_memory_bounded() {
    let c = Cluster::start(bin(), 0);
    let mut s = TcpStream::connect(&c.meta.addr).unwrap();
    for i in 0..100 {
        let create = MetaRequest::Create(Create {
            parent: ROOT_INODE,
            name: format!("entry-with-a-longish-name-{i:04}").into_bytes(),
            node: NewNode::File,
            mode: 0o644,
            exclusive: true,
        });
        let made: MetaResult = rpc(&mut s, &MetaCall::from(create));
        assert!(made.is_ok(), "{made:?}");
    }
    let listed: MetaResult =
        rpc(&mut s, &MetaCall::from(MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 5000 })));
    assert!(matches!(listed, Ok(MetaReply::Entries(ref e)) if e.len() == 100), "{listed:?}");

    let pid = c.meta.child.id();
    let before = rss_mib(pid);
    let one = frame::encode(
        FrameKind::Request,
        7,
        &MetaCall::from(MetaRequest::ReadDir(ReadDir { ino: ROOT_INODE, after: 0, limit: 5000 })),
        0,
    )
    .unwrap();
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
    let mut flood = TcpStream::connect(&c.meta.addr).unwrap();
    flood.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut sent, mut peak) = (0usize, before);
    while sent < 200_000 && Instant::now() < deadline {
        match flood.write(&batch) {
            Ok(n) => sent += n / one.len(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("meta closed the flooding connection early: {e}"),
        }
        peak = peak.max(rss_mib(pid));
    }
    std::thread::sleep(Duration::from_secs(1));
    peak = peak.max(rss_mib(pid));
    eprintln!("meta: RSS {before} MiB, peak {peak} MiB with about {sent} requests written and no answer read");
    assert!(peak < before + 192, "meta RSS grew from {before} MiB to {peak} MiB");
    assert!(meta_answers(&c.meta.addr), "meta stopped answering others");
}

/// 500 idle connections and one that trickles a byte a second are closed within the
/// idle and frame timeouts, while a client that keeps asking is served throughout.
/// The old server held them all forever.
#[test]
fn idle_and_trickling_connections_are_closed_while_a_client_works() {
    let c = Cluster::start_with(bin(), 0, &["--idle-timeout", "2s", "--frame-timeout", "3s"]);
    let idle: Vec<TcpStream> = (0..500).map(|_| TcpStream::connect(&c.meta.addr).unwrap()).collect();
    let mut trickle = TcpStream::connect(&c.meta.addr).unwrap();
    let mut client = TcpStream::connect(&c.meta.addr).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let header =
        frame::encode(FrameKind::Request, 1, &MetaCall::from(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })), 0)
            .unwrap();
    let mut trickled = 0;
    while started.elapsed() < Duration::from_secs(7) {
        let attr: MetaResult = rpc(&mut client, &MetaCall::from(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })));
        assert!(matches!(attr, Ok(MetaReply::Attr(_))), "{attr:?}");
        if trickled < header.len() && started.elapsed() >= Duration::from_secs(trickled as u64) {
            // The trickler may already be closed; that is the point.
            let _ = trickle.write_all(&header[trickled..trickled + 1]);
            trickled += 1;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let still_open = idle.iter().filter(|s| !is_closed(s)).count();
    assert_eq!(still_open, 0, "{still_open} of 500 idle connections still open after 7 s");
    assert!(is_closed(&trickle), "the trickling connection is still open after 7 s");
}

/// Sets the file-descriptor limit of a running process.
fn limit_fds(pid: u32, n: u64) {
    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
    // SAFETY: prlimit reads `lim` and writes nothing (null old-limit pointer).
    let r = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// Meta and a node with RLIMIT_NOFILE 128 get 200 connections each. The old accept
/// loop returned on EMFILE: meta stayed up with its port closed for good, the node
/// exited. Now both keep serving, during the flood and after it.
#[test]
fn running_out_of_file_descriptors_does_not_stop_serving() {
    let mut c = Cluster::start(bin(), 1);
    limit_fds(c.meta.child.id(), 128);
    limit_fds(c.nodes[0].child.id(), 128);
    let flood: Vec<TcpStream> = [&c.meta.addr, &c.nodes[0].addr]
        .into_iter()
        .flat_map(|addr| (0..200).filter_map(|_| TcpStream::connect(addr).ok()).collect::<Vec<_>>())
        .collect();
    assert!(flood.len() > 300, "only {} connections opened", flood.len());
    // The oldest idle connections make room for new ones.
    eventually(Duration::from_secs(20), "meta answering during the flood", || meta_answers(&c.meta.addr));
    drop(flood);
    eventually(Duration::from_secs(10), "meta answering after the flood", || meta_answers(&c.meta.addr));
    assert!(c.meta.child.try_wait().unwrap().is_none(), "meta exited");
    assert!(c.nodes[0].child.try_wait().unwrap().is_none(), "the node exited");
    let mut node = TcpStream::connect(&c.nodes[0].addr).unwrap();
    node.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let pong: proto::node::NodeResult = rpc(&mut node, &proto::node::NodeRequest::Ping);
    assert!(pong.is_ok(), "{pong:?}");
    let status = c.locus(&["status", "--meta", &c.meta.addr]);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
}

/// Resumes a stopped process when the test ends, however it ends.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: sends a signal to a child process of this test.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// A node stopped by SIGSTOP while applications write and read through mounts: with
/// `--rpc-timeout 3s` the writer and the reader get an error (EIO or ETIMEDOUT) in
/// bounded time, and a writer killed meanwhile is gone at once. The old client waited for sends without
/// any deadline: dd sat unkillable in D state for as long as the node was stopped.
#[test]
fn a_stopped_node_fails_writers_and_readers_in_bounded_time() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let mnt = c.mount_with("default", &["--rpc-timeout", "3s"]);
    // The mount may learn of the node a moment after it starts.
    eventually(Duration::from_secs(15), "a durable write through the mount", || {
        let mut f = std::fs::File::create(mnt.join("before")).unwrap();
        f.write_all(b"the node works").is_ok() && f.sync_all().is_ok()
    });
    let data: Vec<u8> = (0..(6 << 20)).map(|i: u32| (i % 251) as u8).collect();
    let mut f = std::fs::File::create(mnt.join("data")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // A second mount has none of it cached: its reads must go to the node.
    let reader = c.mount_with("default", &["--rpc-timeout", "3s"]);
    let node = c.nodes[0].child.id();
    // SAFETY: stops a child process of this test; `Resume` continues it.
    unsafe { libc::kill(node as libc::pid_t, libc::SIGSTOP) };
    let _resume = Resume(node);

    let dd = |name: &str| {
        Command::new("dd")
            .args(["if=/dev/zero", &format!("of={}", mnt.join(name).display()), "bs=1M", "count=32", "conv=fsync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let started = Instant::now();
    let mut writer = dd("stuck");
    let status = testkit::exits_within(&mut writer, Duration::from_secs(40), "dd writing to a stopped node");
    let mut err = String::new();
    writer.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "dd succeeded with the only node stopped");
    assert!(err.contains("Input/output error") || err.contains("Connection timed out"), "dd said: {err}");
    eprintln!("dd failed after {:?}: {}", started.elapsed(), err.trim());

    let mut killed = dd("killed");
    std::thread::sleep(Duration::from_secs(1));
    killed.kill().unwrap();
    testkit::exits_within(&mut killed, Duration::from_secs(15), "a SIGKILLed dd");

    let started = Instant::now();
    let mut cat =
        Command::new("cat").arg(reader.join("data")).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let status = testkit::exits_within(&mut cat, Duration::from_secs(40), "cat reading from a stopped node");
    let mut err = String::new();
    cat.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "cat read a file whose only copy is on a stopped node");
    assert!(err.contains("Input/output error") || err.contains("Connection timed out"), "cat said: {err}");
    eprintln!("cat failed after {:?}: {}", started.elapsed(), err.trim());

    drop(_resume);
    assert_eq!(std::fs::read(reader.join("data")).unwrap(), data);
    std::fs::write(mnt.join("after"), &data).unwrap();
    assert_eq!(std::fs::read(mnt.join("after")).unwrap(), data);
}
