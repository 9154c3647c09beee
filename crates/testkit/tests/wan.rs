//! End-to-end check of the WAN emulator: two site namespaces through `locus-wan`,
//! a TCP echo round trip that must show the configured delay, and a bulk transfer
//! that must arrive intact. Needs root, `ip netns` and `ethtool`; skips otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use testkit::netns::{self, LinkProfile, WanLink};

fn usable() -> bool {
    if !netns::available() {
        println!("SKIPPED: needs root and `ip netns`");
        return false;
    }
    if !netns::have_ethtool() {
        println!("SKIPPED: needs ethtool (apt-get install ethtool)");
        return false;
    }
    true
}

fn config(delay_ms: u64) -> LinkProfile {
    LinkProfile {
        delay: Duration::from_millis(delay_ms),
        bin: Some(PathBuf::from(env!("CARGO_BIN_EXE_locus-wan"))),
        ..LinkProfile::default()
    }
}

/// Starts a one-connection server in site 1 that runs `serve` on the accepted stream.
fn server(link: &WanLink, serve: fn(TcpStream)) -> std::thread::JoinHandle<()> {
    let addr = SocketAddr::from((WanLink::addr_of(1), 7000));
    let listener = link.in_site(1, move || TcpListener::bind(addr)).expect("enter site 1").expect("bind in site 1");
    std::thread::spawn(move || {
        listener.set_nonblocking(false).expect("blocking");
        if let Ok((s, _)) = listener.accept() {
            s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
            serve(s);
        }
    })
}

fn connect(link: &WanLink) -> TcpStream {
    let addr = SocketAddr::from((WanLink::addr_of(1), 7000));
    let s = link
        .in_site(0, move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("enter site 0")
        .expect("connect across the WAN");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

#[test]
fn echo_round_trip_shows_the_delay() {
    if !usable() {
        return;
    }
    let link = WanLink::start("lwt-echo-", 2, &config(20)).expect("start WAN");
    let srv = server(&link, |mut s| {
        let _ = s.set_nodelay(true);
        let mut b = [0u8; 64];
        while let Ok(n) = s.read(&mut b) {
            if n == 0 || s.write_all(&b[..n]).is_err() {
                break;
            }
        }
    });
    let mut c = connect(&link);
    let mut best = Duration::MAX;
    for i in 0..5u8 {
        let t = Instant::now();
        c.write_all(&[i; 16]).expect("send");
        let mut b = [0u8; 16];
        c.read_exact(&mut b).expect("echo");
        assert_eq!(b, [i; 16]);
        best = best.min(t.elapsed());
    }
    drop(c);
    srv.join().expect("server");
    println!("echo RTT at 20 ms one-way: {best:?}");
    assert!(best >= Duration::from_millis(40), "round trip {best:?} shorter than 2 × 20 ms");
    assert!(best < Duration::from_millis(60), "round trip {best:?} too long");
}

#[test]
fn bulk_transfer_arrives_intact() {
    if !usable() {
        return;
    }
    const LEN: usize = 16 << 20;
    let pattern = |i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    let link = WanLink::start("lwt-bulk-", 2, &config(0)).expect("start WAN");
    let srv = server(&link, |mut s| {
        let mut got = Vec::with_capacity(16 << 20);
        s.read_to_end(&mut got).expect("receive");
        let ok = got.len() == 16 << 20
            && got.iter().enumerate().all(|(i, b)| *b == (i.wrapping_mul(2_654_435_761) >> 13) as u8);
        let _ = s.write_all(&[ok as u8]);
    });
    let mut c = connect(&link);
    let data: Vec<u8> = (0..LEN).map(pattern).collect();
    let t = Instant::now();
    c.write_all(&data).expect("send");
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut verdict = [0u8; 1];
    c.read_exact(&mut verdict).expect("verdict");
    println!("16 MiB through the emulator in {:?}", t.elapsed());
    srv.join().expect("server");
    assert_eq!(verdict[0], 1, "data corrupted or truncated");
    let stats = link.stats().expect("stats");
    assert!(stats.starts_with("ok"), "{stats}");
}
