//! `locus-wan`: the WAN emulator's forwarder. It joins N interfaces (the router-side
//! ends of the sites' veth pairs, inside a private "wan" namespace) as a learning
//! Ethernet switch and passes every frame from port i to port j through its own
//! `testkit::wan::Pipeline` (loss, bounded queue, rate, one-way delay), so each
//! direction of each site pair is an independently impaired link.
//!
//! Why AF_PACKET raw sockets and not TUN: the sites stay plain veth-connected
//! namespaces with ordinary addresses in one subnet (ARP, MTU and TCP behave as on a
//! real LAN segment with a long wire), the forwarder needs no routing or address
//! setup of its own, and one `recv`/`send` pair moves a whole frame with no extra
//! header. TUN would need two routed subnets, per-site routes and a device per site
//! for the same result. Offloads are turned off on the veths (see `testkit::netns`),
//! so every frame is at most one MTU and carries a finished checksum; jumbo frames
//! (MTU 9000) keep the frame rate, and so the syscall rate, low enough for 1 Gbit/s
//! on one core.
//!
//! One thread does everything: `ppoll` on the ports and the control socket with a
//! timeout set to the earliest due frame (nanosecond resolution, 1 µs timer slack),
//! at most `BATCH` frames read per port per wake-up, then every due frame sent. No
//! allocation per frame: frames are copied from one scratch buffer into each
//! pipeline's preallocated ring. SIGTERM/SIGINT are blocked except inside `ppoll`,
//! so a stop request is never lost, and the loop exits within one wake-up.
//!
//! Only frames between the given ports are ever forwarded; the wan namespace has no
//! other interface, so emulated traffic cannot reach any other address.
//!
//! Usage:
//!   locus-wan run --port IF --port IF [--port IF...] [--delay-ms F] [--loss-pct F]
//!                 [--rate-mbit F (0 = unlimited)] [--queue-bytes N|auto] [--seed N]
//!                 [--max-frame N] [--control PATH]
//!   locus-wan ctl --control PATH set [from=I] [to=J] [delay_ms=F] [loss_pct=F]
//!                 [rate_mbit=F] [queue_bytes=N|auto]
//!   locus-wan ctl --control PATH stats
//!   locus-wan up --prefix P --sites N [--delay-ms F] [--loss-pct F] [--rate-mbit F]
//!                [--queue-bytes N|auto] [--seed N] [--mtu N]
//!       builds N site namespaces P s0..P s{N-1} through a forwarder (as
//!       `testkit::WanLink` does), prints `ready control=PATH`, and tears everything
//!       down on SIGTERM/SIGINT: for shell scripts and benchmarks.
//!   locus-wan down --prefix P
//!       deletes every namespace starting with P (idempotent crash cleanup).

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use testkit::wan::{Impairment, Pipeline, Verdict};

const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const SO_RCVBUFFORCE: libc::c_int = 33;
const SO_SNDBUFFORCE: libc::c_int = 32;
/// Frames read from one port per wake-up, so one busy port cannot starve releases.
const BATCH: usize = 64;
/// Longest sleep when nothing is due.
const IDLE_NS: u64 = 500_000_000;
/// A VM's vCPU wakes from an idle sleep a few hundred µs late. When few frames wait
/// (sparse traffic such as ping or RPCs, where that lateness would show in the RTT),
/// the loop wakes this much early and polls without sleeping until the frame is due.
/// Under bulk traffic the loop is busy anyway and sleeps normally, sparing the CPU.
const EARLY_NS: u64 = 400_000;
const SPARSE_FRAMES: usize = 32;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Settings of one direction plus whether its queue follows 1.5 × BDP.
#[derive(Clone, Copy)]
struct Setting {
    delay_ms: f64,
    loss_pct: f64,
    rate_mbit: f64,
    queue: Option<u64>,
}

impl Setting {
    fn impairment(&self) -> Impairment {
        let mut imp = Impairment::new(Duration::from_secs_f64(self.delay_ms / 1000.0), self.loss_pct, self.rate_mbit);
        if let Some(q) = self.queue {
            imp.queue_bytes = q;
        }
        imp
    }

    /// Applies `key=value` pairs (other keys are the caller's).
    fn apply(&mut self, key: &str, val: &str) -> Result<bool, String> {
        let num =
            |v: &str| v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or(format!("bad {key}: {v}"));
        match key {
            "delay_ms" | "delay-ms" => self.delay_ms = num(val)?.min(60_000.0),
            "loss_pct" | "loss-pct" => self.loss_pct = num(val)?.min(100.0),
            "rate_mbit" | "rate-mbit" => self.rate_mbit = num(val)?.min(1_000_000.0),
            "queue_bytes" | "queue-bytes" => {
                self.queue =
                    if val == "auto" { None } else { Some(val.parse().map_err(|_| format!("bad {key}: {val}"))?) }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

struct Port {
    name: String,
    fd: libc::c_int,
}

impl Drop for Port {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

fn setsockopt_int(fd: libc::c_int, level: libc::c_int, opt: libc::c_int, val: libc::c_int) -> io::Result<()> {
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &val as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// An AF_PACKET socket bound to `name`, seeing every frame the interface receives but
/// none it sends.
fn open_port(name: &str) -> io::Result<Port> {
    let cname = CString::new(name).map_err(|_| io::Error::other("bad interface name"))?;
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(io::Error::other(format!("no interface {name}")));
    }
    let proto = (libc::ETH_P_ALL as u16).to_be();
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as libc::c_int) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let port = Port { name: name.to_string(), fd };
    setsockopt_int(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)?;
    setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, 8 << 20)?;
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex as i32;
    let r = unsafe {
        libc::bind(
            fd,
            &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // Frames that arrived before the bind may belong to no port: drain them.
    let mut scratch = [0u8; 256];
    while unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), scratch.len(), libc::MSG_DONTWAIT) } > 0 {}
    Ok(port)
}

struct Args {
    ports: Vec<String>,
    setting: Setting,
    seed: u64,
    max_frame: usize,
    control: Option<PathBuf>,
}

fn parse_run(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        ports: vec![],
        setting: Setting { delay_ms: 0.0, loss_pct: 0.0, rate_mbit: 1000.0, queue: None },
        seed: 1,
        max_frame: 9018,
        control: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let val = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port" => a.ports.push(val.clone()),
            "--seed" => a.seed = val.parse().map_err(|_| format!("bad seed {val}"))?,
            "--max-frame" => {
                a.max_frame =
                    val.parse().ok().filter(|n| (64..=65536).contains(n)).ok_or(format!("bad max frame {val}"))?
            }
            "--control" => a.control = Some(PathBuf::from(val)),
            f => {
                if !a.setting.apply(f.trim_start_matches("--"), val)? {
                    return Err(format!("unknown flag {f}"));
                }
            }
        }
    }
    if a.ports.len() < 2 {
        return Err("need at least two --port".into());
    }
    Ok(a)
}

struct Forwarder {
    ports: Vec<Port>,
    /// pipes[i * n + j]: frames from port i to port j (i != j; the diagonal is unused).
    pipes: Vec<Option<Pipeline>>,
    settings: Vec<Setting>,
    /// Learned source MACs → port.
    macs: Vec<([u8; 6], usize)>,
    oversize: u64,
    send_errors: u64,
}

impl Forwarder {
    fn n(&self) -> usize {
        self.ports.len()
    }

    fn forward(&mut self, from: usize, frame: &[u8], now: u64) {
        if frame.len() < 14 {
            return;
        }
        let mut src = [0u8; 6];
        src.copy_from_slice(&frame[6..12]);
        if let Some(e) = self.macs.iter_mut().find(|(m, _)| *m == src) {
            e.1 = from;
        } else if self.macs.len() < 4096 && src[0] & 1 == 0 {
            self.macs.push((src, from));
        }
        let dst = &frame[0..6];
        let n = self.n();
        let known = if dst[0] & 1 == 0 { self.macs.iter().find(|(m, _)| m == dst).map(|e| e.1) } else { None };
        match known {
            Some(to) if to == from => {}
            Some(to) => self.push(from, to, frame, now),
            None => {
                for to in (0..n).filter(|&t| t != from) {
                    self.push(from, to, frame, now);
                }
            }
        }
    }

    fn push(&mut self, from: usize, to: usize, frame: &[u8], now: u64) {
        let n = self.n();
        if let Some(p) = self.pipes[from * n + to].as_mut()
            && p.push(now, frame) == Verdict::Invalid
        {
            self.oversize += 1;
        }
    }

    /// Sends every due frame; returns the earliest remaining due time.
    fn release(&mut self, now: u64) -> Option<u64> {
        let n = self.n();
        let mut next: Option<u64> = None;
        for (k, p) in self.pipes.iter_mut().enumerate() {
            let Some(p) = p.as_mut() else { continue };
            let fd = self.ports[k % n].fd;
            while let Some(f) = p.pop_due(now) {
                let r = unsafe { libc::send(fd, f.as_ptr().cast(), f.len(), libc::MSG_DONTWAIT) };
                if r < 0 {
                    self.send_errors += 1;
                }
            }
            if let Some(d) = p.next_due() {
                next = Some(next.map_or(d, |x| x.min(d)));
            }
        }
        next
    }

    fn control(&mut self, msg: &str) -> String {
        let mut words = msg.split_whitespace();
        match words.next() {
            Some("set") => {
                let (mut from, mut to) = (None, None);
                let mut kv = vec![];
                for w in words {
                    let Some((k, v)) = w.split_once('=') else { return format!("err bad word {w}") };
                    match k {
                        "from" => match v.parse::<usize>() {
                            Ok(i) if i < self.n() => from = Some(i),
                            _ => return format!("err bad from {v}"),
                        },
                        "to" => match v.parse::<usize>() {
                            Ok(i) if i < self.n() => to = Some(i),
                            _ => return format!("err bad to {v}"),
                        },
                        _ => kv.push((k, v)),
                    }
                }
                let n = self.n();
                for i in 0..n {
                    for j in 0..n {
                        if i == j || from.is_some_and(|f| f != i) || to.is_some_and(|t| t != j) {
                            continue;
                        }
                        let mut s = self.settings[i * n + j];
                        for (k, v) in &kv {
                            match s.apply(k, v) {
                                Ok(true) => {}
                                Ok(false) => return format!("err unknown key {k}"),
                                Err(e) => return format!("err {e}"),
                            }
                        }
                        self.settings[i * n + j] = s;
                        if let Some(p) = self.pipes[i * n + j].as_mut() {
                            p.set_config(s.impairment());
                        }
                    }
                }
                "ok".into()
            }
            Some("stats") => {
                let n = self.n();
                let mut out = format!("ok oversize={} send_errors={}\n", self.oversize, self.send_errors);
                for (k, p) in self.pipes.iter().enumerate() {
                    let Some(p) = p else { continue };
                    let (s, c) = (p.stats(), p.config());
                    out.push_str(&format!(
                        "{}->{} received={} released={} released_bytes={} lost={} queue_drops={} overflow_drops={} \
                         waiting={} delay_ns={} loss={} rate_bps={} queue_bytes={}\n",
                        self.ports[k / n].name,
                        self.ports[k % n].name,
                        s.received,
                        s.released,
                        s.released_bytes,
                        s.lost,
                        s.queue_drops,
                        s.overflow_drops,
                        p.len(),
                        c.delay_ns,
                        c.loss,
                        c.rate_bps,
                        c.queue_bytes
                    ));
                }
                out
            }
            _ => "err commands: set KEY=VALUE..., stats".into(),
        }
    }
}

fn install_signals() -> io::Result<libc::sigset_t> {
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut block, s);
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(s, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Inside ppoll, the original mask minus our signals' block applies.
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigdelset(&mut old, s);
        }
        Ok(old)
    }
}

fn run(args: Args) -> io::Result<()> {
    let wait_mask = install_signals()?;
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
    let ports = args.ports.iter().map(|p| open_port(p)).collect::<io::Result<Vec<_>>>()?;
    let n = ports.len();
    let mut pipes = Vec::with_capacity(n * n);
    for k in 0..n * n {
        let seed = args.seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        pipes.push((k / n != k % n).then(|| Pipeline::new(args.setting.impairment(), seed, args.max_frame)));
    }
    let mut fw =
        Forwarder { ports, pipes, settings: vec![args.setting; n * n], macs: vec![], oversize: 0, send_errors: 0 };
    let control = match &args.control {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            let s = UnixDatagram::bind(path)?;
            s.set_nonblocking(true)?;
            Some(s)
        }
        None => None,
    };
    let mut fds: Vec<libc::pollfd> =
        fw.ports.iter().map(|p| libc::pollfd { fd: p.fd, events: libc::POLLIN, revents: 0 }).collect();
    if let Some(c) = &control {
        fds.push(libc::pollfd { fd: c.as_raw_fd(), events: libc::POLLIN, revents: 0 });
    }
    let mut scratch = vec![0u8; args.max_frame.max(2048)];
    let mut ctl_buf = vec![0u8; 4096];
    println!("ready ports={}", args.ports.join(","));
    while !STOP.load(Ordering::SeqCst) {
        let now = now_ns();
        let next = fw.release(now);
        let waiting: usize = fw.pipes.iter().flatten().map(Pipeline::len).sum();
        let early = if waiting <= SPARSE_FRAMES { EARLY_NS } else { 0 };
        let wait = next.map_or(IDLE_NS, |d| d.saturating_sub(now_ns()).min(IDLE_NS));
        // Within the early window: poll without sleeping (bounded by the due time).
        let wait = wait.saturating_sub(early);
        let ts = libc::timespec { tv_sec: (wait / 1_000_000_000) as i64, tv_nsec: (wait % 1_000_000_000) as i64 };
        for f in fds.iter_mut() {
            f.revents = 0;
        }
        let r = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, &wait_mask) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for (i, pfd) in fds.iter().take(n).enumerate() {
            if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                return Err(io::Error::other(format!("port {} failed", fw.ports[i].name)));
            }
            if pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            for _ in 0..BATCH {
                let r = unsafe {
                    libc::recv(
                        fw.ports[i].fd,
                        scratch.as_mut_ptr().cast(),
                        scratch.len(),
                        libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    )
                };
                if r < 0 {
                    break;
                }
                let len = r as usize;
                if len > scratch.len() {
                    fw.oversize += 1;
                    continue;
                }
                fw.forward(i, &scratch[..len], now_ns());
            }
        }
        if let Some(c) = &control
            && fds[n].revents & libc::POLLIN != 0
        {
            for _ in 0..16 {
                let Ok((len, from)) = c.recv_from(&mut ctl_buf) else { break };
                let reply = fw.control(&String::from_utf8_lossy(&ctl_buf[..len]));
                if let Some(p) = from.as_pathname() {
                    let _ = c.send_to(reply.as_bytes(), p);
                }
            }
        }
    }
    eprint!("locus-wan: stopping; {}", fw.control("stats"));
    if let Some(path) = &args.control {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// `up`: a `WanLink` that lives until a signal.
fn up(args: &[String]) -> Result<(), String> {
    let mut prefix = None;
    let mut sites = 2usize;
    let mut cfg = testkit::netns::WanConfig { bin: std::env::current_exe().ok(), ..Default::default() };
    let mut setting = Setting { delay_ms: 0.0, loss_pct: 0.0, rate_mbit: 1000.0, queue: None };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let val = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--prefix" => prefix = Some(val.clone()),
            "--sites" => sites = val.parse().map_err(|_| format!("bad sites {val}"))?,
            "--seed" => cfg.seed = val.parse().map_err(|_| format!("bad seed {val}"))?,
            "--mtu" => {
                cfg.mtu = val.parse().ok().filter(|m| (576..=65000).contains(m)).ok_or(format!("bad mtu {val}"))?
            }
            f => {
                if !setting.apply(f.trim_start_matches("--"), val)? {
                    return Err(format!("unknown flag {f}"));
                }
            }
        }
    }
    cfg.delay = Duration::from_secs_f64(setting.delay_ms / 1000.0);
    cfg.loss_pct = setting.loss_pct;
    cfg.rate_mbit = setting.rate_mbit;
    cfg.queue_bytes = setting.queue;
    let prefix = prefix.ok_or("--prefix is required")?;
    let wait_mask = install_signals().map_err(|e| e.to_string())?;
    let mut link = testkit::WanLink::start(&prefix, sites, &cfg).map_err(|e| e.to_string())?;
    println!("ready control={}", link.control_path().display());
    let ts = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
    while !STOP.load(Ordering::SeqCst) {
        // Sleep with the stop signals unblocked (as in the forwarder's loop).
        unsafe { libc::ppoll(std::ptr::null_mut(), 0, &ts, &wait_mask) };
    }
    link.teardown().map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => match parse_run(&args[1..]) {
            Ok(a) => run(a).map_err(|e| e.to_string()),
            Err(e) => Err(e),
        },
        Some("ctl") if args.len() >= 4 && args[1] == "--control" => {
            testkit::netns::control_request(std::path::Path::new(&args[2]), &args[3..].join(" "))
                .map(|reply| print!("{reply}"))
                .map_err(|e| e.to_string())
        }
        Some("up") => up(&args[1..]),
        Some("down") if args.len() == 3 && args[1] == "--prefix" => {
            testkit::netns::cleanup_prefix(&args[2]).map_err(|e| e.to_string())
        }
        _ => Err("usage: locus-wan run --port IF --port IF [...] | locus-wan ctl --control PATH set|stats ... | \
                  locus-wan up --prefix P [--sites N ...] | locus-wan down --prefix P"
            .into()),
    };
    if let Err(e) = result {
        eprintln!("locus-wan: {e}");
        std::process::exit(1);
    }
}
