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
//! Modules: `ffi` (raw sockets, signals, ppoll), `args` (the clap command line),
//! `forwarder` (the switch and its loop), `control` (run-time `set`/`stats`).
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

mod args;
mod control;
mod ffi;
mod forwarder;

use std::time::Duration;

use args::{Command, UpArgs};

/// `up`: a `WanLink` that lives until a signal.
fn up(args: UpArgs) -> Result<(), String> {
    let setting = args.impairment.setting();
    let profile = testkit::LinkProfile {
        delay: Duration::from_secs_f64(setting.delay_ms / 1000.0),
        loss_pct: setting.loss_pct,
        rate_mbit: setting.rate_mbit,
        queue_bytes: setting.queue,
        seed: args.seed,
        mtu: args.mtu,
        bin: std::env::current_exe().ok(),
    };
    let wait_mask = ffi::install_signals().map_err(|e| e.to_string())?;
    let mut link = testkit::WanLink::start(&args.prefix, args.sites, &profile).map_err(|e| e.to_string())?;
    println!("ready control={}", link.control_path().display());
    while !ffi::stopping() {
        // Sleep with the stop signals unblocked (as in the forwarder's loop).
        ffi::wait(&mut [], 200_000_000, &wait_mask).map_err(|e| e.to_string())?;
    }
    link.teardown().map_err(|e| e.to_string())
}

fn main() {
    let result = match args::parse().command {
        Command::Run(a) => forwarder::run(a).map_err(|e| e.to_string()),
        Command::Ctl { control, request } => testkit::netns::control_request(&control, &request.join(" "))
            .map(|reply| print!("{reply}"))
            .map_err(|e| e.to_string()),
        Command::Up(a) => up(a),
        Command::Down { prefix } => testkit::netns::cleanup_prefix(&prefix).map_err(|e| e.to_string()),
    };
    if let Err(e) = result {
        eprintln!("locus-wan: {e}");
        std::process::exit(1);
    }
}
