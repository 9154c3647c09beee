//! The switch: learns source MACs, pushes each frame into the pipeline of its
//! direction, releases due frames, and runs the single-threaded poll loop.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;

use testkit::wan::{Pipeline, Verdict};

use crate::args::RunArgs;
use crate::control::{self, Setting};
use crate::ffi::{self, Port};

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
/// Most learned MAC addresses.
const MAX_MACS: usize = 4096;

/// The switch state: ports, one pipeline per direction, counters.
pub struct Forwarder {
    /// The switch's interfaces.
    pub ports: Vec<Port>,
    /// pipes[i * n + j]: frames from port i to port j (i != j; the diagonal is unused).
    pub pipes: Vec<Option<Pipeline>>,
    /// The setting of each direction, indexed as `pipes`.
    pub settings: Vec<Setting>,
    /// Learned source MACs → port.
    macs: Vec<([u8; 6], usize)>,
    /// Frames larger than the largest frame, dropped.
    pub oversize: u64,
    /// Frames the kernel refused to send.
    pub send_errors: u64,
}

impl Forwarder {
    /// A switch over `ports`, every direction starting with `setting`.
    pub fn new(ports: Vec<Port>, setting: Setting, seed: u64, max_frame: usize) -> Forwarder {
        let n = ports.len();
        let pipes = (0..n * n)
            .map(|k| {
                let seed = seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                (k / n != k % n).then(|| Pipeline::new(setting.impairment(), seed, max_frame))
            })
            .collect();
        Forwarder { ports, pipes, settings: vec![setting; n * n], macs: vec![], oversize: 0, send_errors: 0 }
    }

    /// Number of ports.
    pub fn n(&self) -> usize {
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
        } else if self.macs.len() < MAX_MACS && src[0] & 1 == 0 {
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
            let port = &self.ports[k % n];
            while let Some(f) = p.pop_due(now) {
                if !port.send(f) {
                    self.send_errors += 1;
                }
            }
            if let Some(d) = p.next_due() {
                next = Some(next.map_or(d, |x| x.min(d)));
            }
        }
        next
    }

    /// Reads up to `BATCH` frames from port `i` and forwards them.
    fn receive(&mut self, i: usize, scratch: &mut [u8]) {
        for _ in 0..BATCH {
            let Some(len) = self.ports[i].recv(scratch) else { break };
            if len > scratch.len() {
                self.oversize += 1;
                continue;
            }
            self.forward(i, &scratch[..len], ffi::now_ns());
        }
    }
}

/// `locus-wan run`: forwards until SIGTERM/SIGINT/SIGHUP, then prints its counters.
pub fn run(args: RunArgs) -> io::Result<()> {
    let wait_mask = ffi::install_signals()?;
    ffi::set_fine_timer_slack();
    let ports = args.ports.iter().map(|p| Port::open(p)).collect::<io::Result<Vec<_>>>()?;
    let n = ports.len();
    let max_frame = args.max_frame as usize;
    let mut fw = Forwarder::new(ports, args.impairment.setting(), args.seed, max_frame);
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
    let mut scratch = vec![0u8; max_frame.max(2048)];
    let mut ctl_buf = vec![0u8; 4096];
    println!("ready ports={}", args.ports.join(","));
    while !ffi::stopping() {
        let now = ffi::now_ns();
        let next = fw.release(now);
        let waiting: usize = fw.pipes.iter().flatten().map(Pipeline::len).sum();
        let early = if waiting <= SPARSE_FRAMES { EARLY_NS } else { 0 };
        let wait = next.map_or(IDLE_NS, |d| d.saturating_sub(ffi::now_ns()).min(IDLE_NS));
        // Within the early window: poll without sleeping (bounded by the due time).
        if ffi::wait(&mut fds, wait.saturating_sub(early), &wait_mask)? == 0 {
            continue;
        }
        for (i, pfd) in fds.iter().take(n).enumerate() {
            if pfd.revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                return Err(io::Error::other(format!("port {} failed", fw.ports[i].name)));
            }
            if pfd.revents & libc::POLLIN != 0 {
                fw.receive(i, &mut scratch);
            }
        }
        if let Some(c) = &control
            && fds[n].revents & libc::POLLIN != 0
        {
            for _ in 0..16 {
                let Ok((len, from)) = c.recv_from(&mut ctl_buf) else { break };
                let reply = control::answer(&mut fw, &String::from_utf8_lossy(&ctl_buf[..len]));
                if let Some(p) = from.as_pathname() {
                    let _ = c.send_to(reply.as_bytes(), p);
                }
            }
        }
    }
    eprint!("locus-wan: stopping; {}", control::answer(&mut fw, "stats"));
    if let Some(path) = &args.control {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}
