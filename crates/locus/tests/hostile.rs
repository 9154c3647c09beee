//! Hostile peers against real `locus` processes: plaintext and garbage where TLS is
//! due, floods of half frames, pipelined requests whose answers are never read, idle
//! and trickling connections (some never starting their handshake), running out of
//! file descriptors, and a storage node stopped (SIGSTOP) under a writing
//! application. Each must leave the service bounded and serving, and the application
//! answered in bounded time. Frame-level attacks come from a peer holding a valid
//! client certificate of the cluster (the worst case: it passes the handshake).

use proto::frame::{self, FrameKind, HEADER_LEN, Header};
use proto::meta::{Create, GetAttr, MetaCall, MetaReply, MetaRequest, MetaResult, NewNode, ReadDir};
use proto::types::ROOT_INODE;
use serde::{Serialize, de::DeserializeOwned};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
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

/// A blocking TLS connection as a client of the cluster.
type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// The rustls configuration of a client certificate `name` of `c`'s CA.
fn client_tls(c: &Cluster, name: &str) -> Arc<rustls::ClientConfig> {
    let flags = c.cert("client", name, "default");
    let tls = net::Tls::load(Path::new(&flags[1]), Path::new(&flags[3]), Path::new(&flags[5])).unwrap();
    tls.client_config()
}

/// Connects to `addr` and completes the TLS handshake.
fn connect(addr: &str, tls: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let sock = TcpStream::connect(addr)?;
    let name = rustls::pki_types::ServerName::try_from("locus.invalid").unwrap();
    let mut conn = rustls::ClientConnection::new(tls.clone(), name).map_err(std::io::Error::other)?;
    let mut sock = sock;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    Ok(rustls::StreamOwned::new(conn, sock))
}

/// One request and its answer on a blocking stream, as any client could send.
fn rpc<Req: Serialize, Resp: DeserializeOwned>(stream: &mut impl ReadWrite, req: &Req) -> Resp {
    stream.write_all(&frame::encode(FrameKind::Request, 1, req, 0).unwrap()).unwrap();
    stream.flush().unwrap();
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).unwrap();
    let header = Header::decode(&head).unwrap();
    let mut payload = vec![0u8; header.payload_len as usize];
    stream.read_exact(&mut payload).unwrap();
    let mut bulk = vec![0u8; header.bulk_len as usize];
    stream.read_exact(&mut bulk).unwrap();
    frame::decode(&payload).unwrap()
}

/// A blocking byte stream, plain or TLS.
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Whether meta answers a fresh authenticated connection within a few seconds.
fn meta_answers(addr: &str, tls: &Arc<rustls::ClientConfig>) -> bool {
    let Ok(mut s) = connect(addr, tls) else { return false };
    s.sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req =
        frame::encode(FrameKind::Request, 1, &MetaCall::from(MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE })), 0)
            .unwrap();
    let mut head = [0u8; HEADER_LEN];
    s.write_all(&req).is_ok() && s.flush().is_ok() && s.read_exact(&mut head).is_ok() && Header::decode(&head).is_ok()
}

/// Waits (bounded) until `check` holds.
fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the server closed `s` (EOF, reset or a TLS close), waiting at most a moment.
fn is_closed(sock: &TcpStream, s: &mut impl Read) -> bool {
    sock.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}

fn raw_closed(s: &TcpStream) -> bool {
    is_closed(s, &mut &*s)
}

fn tls_closed(s: &mut Tls) -> bool {
    let sock = s.sock.try_clone().unwrap();
    is_closed(&sock, s)
}

/// 300 authenticated connections each announce a 16 MiB payload and send none of
/// it. The old reader allocated (and zeroed) the whole payload from the length
/// prefix: 300 x 16 MiB, 1.8 GB; now memory grows only with bytes that actually arrive.
#[test]
fn header_floods_leave_meta_and_node_memory_bounded() {
    let c = Cluster::start(bin(), 1);
    let tls = client_tls(&c, "flooder");
    let targets =
        [("meta", c.meta.child.id(), c.meta.addr.clone()), ("node", c.nodes[0].child.id(), c.nodes[0].addr.clone())];
    for (what, pid, addr) in targets {
        let before = rss_mib(pid);
        let header =
            Header { kind: FrameKind::Request, request_id: 1, payload_len: frame::MAX_PAYLOAD, bulk_len: 0 }.encode();
        let flood: Vec<Tls> = (0..300)
            .map(|_| {
                let mut s = connect(&addr, &tls).unwrap();
                s.write_all(&header).unwrap();
                s.flush().unwrap();
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
    assert!(meta_answers(&c.meta.addr, &tls));
}

/// 200,000 pipelined ReadDir requests (about 10 KB of answer each) whose answers are
/// never read. The old server read and ran every one and queued every answer (GBs);
/// now it stops reading once its in-flight bound is reached.
#[test]
fn pipelined_requests_never_read_keep_meta_memory_bounded() {
    let c = Cluster::start(bin(), 0);
    let tls = client_tls(&c, "pipeliner");
    let mut s = connect(&c.meta.addr, &tls).unwrap();
    for i in 0..100 {
        let create = MetaRequest::Create(Create {
            parent: ROOT_INODE,
            name: format!("entry-with-a-longish-name-{i:04}").into_bytes(),
            node: NewNode::File,
            mode: 0o644,
            umask: 0,
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
    let mut flood = connect(&c.meta.addr, &tls).unwrap();
    flood.sock.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
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
    assert!(meta_answers(&c.meta.addr, &tls), "meta stopped answering others");
}

/// 500 idle connections (half never start their TLS handshake, half finish it and
/// then say nothing) and one that trickles a byte a second are closed within the
/// handshake, idle and frame timeouts, while a client that keeps asking is served
/// throughout. The old server held them all forever.
#[test]
fn idle_and_trickling_connections_are_closed_while_a_client_works() {
    let c =
        Cluster::start_with(bin(), 0, &["--idle-timeout", "2s", "--frame-timeout", "3s", "--handshake-timeout", "2s"]);
    let tls = client_tls(&c, "idler");
    let silent: Vec<TcpStream> = (0..250).map(|_| TcpStream::connect(&c.meta.addr).unwrap()).collect();
    let mut idle: Vec<Tls> = (0..250).map(|_| connect(&c.meta.addr, &tls).unwrap()).collect();
    let mut trickle = connect(&c.meta.addr, &tls).unwrap();
    let mut client = connect(&c.meta.addr, &tls).unwrap();
    client.sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
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
            let _ = trickle.write_all(&header[trickled..trickled + 1]).and_then(|_| trickle.flush());
            trickled += 1;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let still_silent = silent.iter().filter(|s| !raw_closed(s)).count();
    assert_eq!(still_silent, 0, "{still_silent} of 250 connections without a handshake still open after 7 s");
    let still_idle = idle.iter_mut().map(tls_closed).filter(|closed| !closed).count();
    assert_eq!(still_idle, 0, "{still_idle} of 250 idle connections still open after 7 s");
    assert!(tls_closed(&mut trickle), "the trickling connection is still open after 7 s");
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
    let tls = client_tls(&c, "fd-eater");
    limit_fds(c.meta.child.id(), 128);
    limit_fds(c.nodes[0].child.id(), 128);
    let flood: Vec<TcpStream> = [&c.meta.addr, &c.nodes[0].addr]
        .into_iter()
        .flat_map(|addr| (0..200).filter_map(|_| TcpStream::connect(addr).ok()).collect::<Vec<_>>())
        .collect();
    assert!(flood.len() > 300, "only {} connections opened", flood.len());
    // The oldest idle connections (and handshakes) make room for new ones.
    eventually(Duration::from_secs(20), "meta answering during the flood", || meta_answers(&c.meta.addr, &tls));
    drop(flood);
    eventually(Duration::from_secs(10), "meta answering after the flood", || meta_answers(&c.meta.addr, &tls));
    assert!(c.meta.child.try_wait().unwrap().is_none(), "meta exited");
    assert!(c.nodes[0].child.try_wait().unwrap().is_none(), "the node exited");
    let mut node = connect(&c.nodes[0].addr, &tls).unwrap();
    node.sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let pong: proto::node::NodeResult = rpc(&mut node, &proto::node::NodeRequest::Ping(proto::node::Ping {}));
    assert!(pong.is_ok(), "{pong:?}");
    let status = c.locus(&["status", "--meta", &c.meta.addr]);
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
}

/// Every kind of junk at once against live meta and node processes, from plain TCP
/// and from an authenticated TLS client: random garbage, truncated frames, 4 GiB
/// length prefixes, a request whose payload does not decode, plaintext frames, and
/// 1000 idle sockets. Each bad connection is closed on its own; a mount keeps
/// writing and reading byte-exact throughout, and memory stays bounded.
#[test]
fn junk_and_a_thousand_idle_sockets_leave_a_mount_working() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let mnt = c.mount();
    let tls = client_tls(&c, "junk");
    let data = testkit::pattern(5 << 20, 11);
    eventually(Duration::from_secs(15), "a first write through the mount", || {
        std::fs::write(mnt.join("first"), &data).is_ok()
    });
    let targets = [c.meta.addr.clone(), c.nodes[0].addr.clone()];
    let pids = [c.meta.child.id(), c.nodes[0].child.id()];
    let before: Vec<u64> = pids.iter().map(|p| rss_mib(*p)).collect();
    let mut idle = Vec::new();
    for addr in &targets {
        idle.extend((0..500).filter_map(|_| TcpStream::connect(addr).ok()));
    }
    assert!(idle.len() >= 900, "only {} idle sockets opened", idle.len());
    let four_gib = {
        let mut h = Header { kind: FrameKind::Request, request_id: 1, payload_len: 1, bulk_len: 0 }.encode();
        h[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        h
    };
    let truncated = frame::encode(FrameKind::Request, 3, &MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE }), 0)
        .unwrap()[..HEADER_LEN + 1]
        .to_vec();
    // A header announcing 64 bytes of payload that postcard cannot decode.
    let mut undecodable =
        Header { kind: FrameKind::Request, request_id: 4, payload_len: 64, bulk_len: 0 }.encode().to_vec();
    undecodable.extend([0xff; 64]);
    let plaintext =
        frame::encode(FrameKind::Request, 5, &MetaRequest::GetAttr(GetAttr { ino: ROOT_INODE }), 0).unwrap();
    let junk: [(&str, Vec<u8>); 4] = [
        ("garbage", testkit::pattern(4096, 3)),
        ("a 4 GiB length prefix", four_gib.to_vec()),
        ("an undecodable payload", undecodable),
        ("a truncated frame", truncated),
    ];
    for round in 0..3 {
        for addr in &targets {
            // Plain TCP: refused before any frame is read.
            let mut raw = TcpStream::connect(addr).unwrap();
            let _ = raw.write_all(&plaintext);
            raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert!(matches!(raw.read(&mut [0u8; 16]), Ok(0) | Err(_)), "{addr} answered plaintext");
            for (what, bytes) in &junk {
                let mut s = connect(addr, &tls).unwrap();
                let _ = s.write_all(bytes).and_then(|_| s.flush());
                if *what == "a truncated frame" {
                    continue; // closed by the frame timeout; kept open meanwhile
                }
                s.sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut buf = [0u8; 16];
                assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "{addr} kept a connection that sent {what}");
            }
        }
        let name = format!("during-{round}");
        std::fs::write(mnt.join(&name), &data).unwrap();
        assert!(std::fs::read(mnt.join(&name)).unwrap() == data, "{name} read back wrong");
        assert!(std::fs::read(mnt.join("first")).unwrap() == data, "first read back wrong");
    }
    for (i, pid) in pids.iter().enumerate() {
        let now = rss_mib(*pid);
        eprintln!("process {i}: RSS {} MiB before, {now} MiB with {} idle sockets and the junk", before[i], idle.len());
        assert!(now < before[i] + 128, "RSS grew from {} MiB to {now} MiB", before[i]);
    }
    assert!(c.meta.child.try_wait().unwrap().is_none() && c.nodes[0].child.try_wait().unwrap().is_none());
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
