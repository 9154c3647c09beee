//! `locus nbd` against NBD clients nobody here wrote (libnbd's nbdinfo and nbdcopy,
//! qemu-io, e2fsck on what came back), and against a client that breaks the protocol
//! on purpose. Every server is a real process of a real cluster, over TLS unless a test
//! is about plain loopback serving; the cross-site test puts each site in a network
//! namespace joined by the `locus-wan` emulator.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use testkit::netns::{self, LinkProfile, WanLink};
use testkit::{Cluster, Proc, spawn_command};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// Runs an outside tool; it must exist (`.ci/setup` installs qemu-utils and libnbd-bin).
fn tool(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (qemu-utils, libnbd-bin and e2fsprogs are needed): {e}"))
}

/// What a tool that must succeed said (stdout and stderr); `what` names it in a failure.
fn succeeded(out: Output, what: &str) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {text}");
    text
}

fn ok(program: &str, args: &[&str]) -> String {
    succeeded(tool(program, args), &format!("{program} {}", args.join(" ")))
}

/// The `--ca --cert --key` flags of a server at `site` and the directory of its NBD
/// clients' certificates. The server's certificate names the address clients dial (NBD
/// clients check it); the clients' is an ordinary user certificate of the cluster, laid
/// out as libnbd and qemu read it (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`).
fn certificates_at(c: &Cluster, site: &str) -> (Vec<String>, PathBuf) {
    let (tls, user) = (c.tls_dir(), format!("nbd-user-{site}"));
    let server = c.serving_cert("client", &format!("nbd-{site}"), site, &[&c.place(site).1]);
    c.cert("user", &user, site);
    let client_dir = c.path().join(format!("nbd-client-tls-{site}"));
    std::fs::create_dir_all(&client_dir).unwrap();
    let files = [
        ("ca.pem".to_string(), "ca-cert.pem"),
        (format!("{user}.pem"), "client-cert.pem"),
        (format!("{user}.key"), "client-key.pem"),
    ];
    for (from, to) in files {
        std::fs::copy(tls.join(from), client_dir.join(to)).unwrap();
    }
    (server, client_dir)
}

/// A `locus nbd` process, killed when dropped (a failing test leaves none behind).
struct Server(Proc);

impl std::ops::Deref for Server {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// A command run in `site`'s network namespace (as is, at a loopback site).
fn at_site(c: &Cluster, site: &str, program: &Path) -> Command {
    testkit::command_in(c.place(site).0.as_deref(), program)
}

/// Starts `locus nbd` on a port the OS picks; its `addr` is `127.0.0.1:PORT`.
fn start_nbd(c: &Cluster, log: &str, exports: &[&str], extra: &[&str]) -> Server {
    start_nbd_at(c, "default", log, exports, extra)
}

/// Starts `locus nbd` at `site` (in its namespace, on its address) on a port the OS picks.
fn start_nbd_at(c: &Cluster, site: &str, log: &str, exports: &[&str], extra: &[&str]) -> Server {
    let mut cmd = at_site(c, site, bin());
    let listen = format!("{}:0", c.place(site).1);
    cmd.args(["nbd", "--listen", &listen, "--meta", &c.meta.addr, "--cache", "64M", "--site", site]);
    for e in exports {
        cmd.args(["--export", e]);
    }
    if extra.contains(&"--plain") {
        cmd.args(c.cert("client", "nbd-plain", site));
    } else {
        cmd.args(certificates_at(c, site).0);
    }
    cmd.args(extra).env("LOCUS_LOG", "warn,nbd=debug,client=debug");
    let mut proc = spawn_command(cmd, "locus nbd listening on", &c.path().join(log));
    proc.addr = proc.addr.split_whitespace().next().unwrap().to_string();
    Server(proc)
}

fn nbds(c: &Cluster, server: &Server, export: &str) -> String {
    nbds_at(c, "default", server, export)
}

fn nbds_at(c: &Cluster, site: &str, server: &Server, export: &str) -> String {
    format!("nbds://{}/{export}?tls-certificates={}", server.addr, certificates_at(c, site).1.display())
}

/// An ext4 image of `size` with 50 files in it (made from a directory: no loop device);
/// returns its path and the tree it was made from.
fn ext4_image(c: &Cluster, size: &str) -> (String, PathBuf) {
    let tree = c.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for i in 0..50 {
        std::fs::write(tree.join("sub").join(format!("f{i}")), testkit::pattern(10_000 + i * 997, i as u64)).unwrap();
    }
    let image = c.path().join("local.img").display().to_string();
    ok("mkfs.ext4", &["-q", "-F", "-d", tree.to_str().unwrap(), &image, size]);
    (image, tree)
}

/// The image back from a device is the image sent, a clean ext4, and a file in it reads
/// back whole.
fn check_image(back: &Path, image: &str) {
    assert!(std::fs::read(back).unwrap() == std::fs::read(image).unwrap(), "the device differs from the image");
    ok("e2fsck", &["-f", "-n", back.to_str().unwrap()]);
    let file = tool("debugfs", &["-R", "cat /sub/f7", back.to_str().unwrap()]);
    assert!(file.stdout == testkit::pattern(10_000 + 7 * 997, 7), "a file inside the image differs");
}

fn kill(server: Server) {
    drop(server);
}

#[test]
fn an_ext4_image_written_over_tls_survives_a_kill_of_the_server_after_flush() {
    let mut c = Cluster::start(bin(), 2);
    let mnt = c.mount();
    let (image, _) = ext4_image(&c, "64M");
    let image = image.as_str();

    std::fs::create_dir(mnt.join("vm")).unwrap();
    let server = start_nbd(&c, "nbd0.log", &["disk=/vm/disk.img,size=64M"], &[]);
    let info = ok("nbdinfo", &[&nbds(&c, &server, "disk")]);
    assert!(info.contains("export-size: 67108864") && info.contains("can_multi_conn: true"), "{info}");
    // A client that will not start TLS sees nothing.
    let plain = tool("nbdinfo", &[&format!("nbd://{}/disk", server.addr)]);
    assert!(!plain.status.success(), "a plain client was served by a TLS server");

    ok("nbdcopy", &["--flush", image, &nbds(&c, &server, "disk")]);
    // The moment the flush is acknowledged the server dies, as a crash would.
    kill(server);
    // The file is the device, visible through the mount as soon as it is committed.
    assert_eq!(std::fs::metadata(mnt.join("vm/disk.img")).unwrap().len(), 64 << 20);

    // A new server waits out the dead one's lock (its session expires) and serves what
    // was flushed, whole.
    let server = start_nbd(&c, "nbd1.log", &["disk=/vm/disk.img"], &["--lock-wait", "30s"]);
    let back = c.path().join("back.img");
    ok("nbdcopy", &[&nbds(&c, &server, "disk"), back.to_str().unwrap()]);
    check_image(&back, image);
    // qemu's own TLS client (GnuTLS, x509 credentials from the same directory).
    let creds = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", certificates_at(&c, "default").1.display());
    let (host, port) = server.addr.split_once(':').unwrap();
    let opts = format!("driver=nbd,server.type=inet,server.host={host},server.port={port},export=disk,tls-creds=tls0");
    let out = ok(
        "qemu-io",
        &["--object", &creds, "--image-opts", &opts, "-c", "write -P 0x5a 60M 64k", "-c", "read -P 0x5a 60M 64k"],
    );
    assert!(!out.contains("fail"), "{out}");
    kill(server);
}

/// Runs an NBD client tool in `site`'s namespace; it must succeed.
fn ok_at(c: &Cluster, site: &str, program: &str, args: &[&str]) {
    let out = at_site(c, site, Path::new(program)).args(args).stdin(Stdio::null()).output().unwrap();
    succeeded(out, &format!("{program} {} at {site}", args.join(" ")));
}

#[test]
fn a_flushed_device_under_a_sync_policy_is_served_whole_at_the_other_site_after_the_first_is_lost() {
    if !netns::available() || !netns::have_ethtool() || !testkit::can_mount() {
        eprintln!("SKIPPED: needs root, /dev/fuse, `ip netns` and ethtool");
        return;
    }
    // Sites m (meta), a and b, 10 ms apart; one node at a, one at b.
    let profile = LinkProfile { delay: Duration::from_millis(5), ..LinkProfile::default() };
    let link = WanLink::start("lwt-nbd-", 3, &profile)
        .expect("start the WAN emulator (build it first: `cargo build -p testkit --bin locus-wan`)");
    let mut c = Cluster::start_in_sites(bin(), &link, &["m", "a", "b"]);
    c.add_node("a0", "a");
    c.add_node("b0", "b");
    c.wait_for_nodes(2);
    let at_a = c.mount_at("a");
    std::fs::create_dir(at_a.join("vm")).unwrap();
    let set =
        c.locus(&["policy", "set", "/vm", "--sites", "a,b", "--copies", "1", "--mode", "sync", "--meta", &c.meta.addr]);
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let (image, _) = ext4_image(&c, "32M");

    // Written at a through NBD and flushed: under `sync a,b` the FLUSH returns once
    // every chunk is durable at both sites.
    let server = start_nbd_at(&c, "a", "nbd-a.log", &["disk=/vm/disk.img,size=32M"], &[]);
    ok_at(&c, "a", "nbdcopy", &["--flush", &image, &nbds_at(&c, "a", &server, "disk")]);
    // Site a is lost: its server, mount and node killed as a crash would.
    kill(server);
    c.kill_site("a");
    // Site b serves the device (once the dead server's lock expires with its session),
    // whole, from b's own node.
    let server = start_nbd_at(&c, "b", "nbd-b.log", &["disk=/vm/disk.img"], &["--lock-wait", "30s"]);
    let back = c.path().join("back.img");
    ok_at(&c, "b", "nbdcopy", &[&nbds_at(&c, "b", &server, "disk"), back.to_str().unwrap()]);
    check_image(&back, &image);
    kill(server);
}

#[test]
fn qemu_io_patterns_trim_and_zeroes_verify_and_the_lock_keeps_a_second_writer_out() {
    let c = Cluster::start(bin(), 2);
    let server = start_nbd(&c, "nbd0.log", &["disk=/disk.img,size=128M", "ro=/disk.img,ro"], &["--plain", "--shared"]);
    let uri = format!("nbd://{}/disk", server.addr);
    let io = |cmds: &[&str]| {
        let mut args = vec!["-f", "raw"];
        for c in cmds {
            args.extend(["-c", c]);
        }
        args.push(&uri);
        let out = ok("qemu-io", &args);
        assert!(!out.contains("fail") && !out.contains("Pattern verification"), "{out}");
        out
    };
    // Unaligned, overlapping and chunk-crossing writes, then each read back.
    io(&[
        "write -P 0x11 0 1M",
        "write -P 0x22 4095 8193",
        "aio_write -P 0x33 3M 64k",
        "aio_write -P 0x44 5M 4k",
        "aio_flush",
        "write -P 0x55 4194300 8",
        "flush",
    ]);
    io(&[
        "read -P 0x11 0 4095",
        "read -P 0x22 4095 8193",
        "read -P 0x11 12288 1036288",
        "read -P 0x33 3M 64k",
        "read -P 0x44 5M 4k",
        "read -P 0x55 4194300 8",
        "read -P 0 4194308 4k",
    ]);
    // More than the server's chunk cache (64 MiB) written while the file stays open: its
    // own chunks, gone from the cache, are read back from the nodes (with capabilities
    // meta gives for chunks written since the open).
    io(&["write -P 0x77 32M 80M", "flush"]);
    io(&["read -P 0x11 0 4095", "read -P 0x77 32M 1M", "read -P 0x77 111M 1M"]);
    // TRIM and WRITE_ZEROES read back as zeros; FUA writes are acknowledged.
    io(&["discard 3M 32k", "write -z 5M 4k", "write -f -P 0x66 8M 4k"]);
    io(&["read -P 0 3M 32k", "read -P 0x33 3178496 32k", "read -P 0 5M 4k", "read -P 0x66 8M 4k"]);
    // A read-only export refuses writes with EPERM.
    let ro = tool("qemu-io", &["-f", "raw", "-c", "write -P 1 0 4k", &format!("nbd://{}/ro", server.addr)]);
    let text = format!("{}{}", String::from_utf8_lossy(&ro.stdout), String::from_utf8_lossy(&ro.stderr));
    assert!(text.contains("ermission") || text.contains("read-only") || text.contains("read only"), "{text}");
    kill(server);

    // One writer per file: a second server of it (from another host: the lock is held at
    // meta, for every site) waits for the first one's lock and gives up with a clear error.
    let first = start_nbd(&c, "nbd1.log", &["disk=/disk.img"], &["--plain"]);
    let mut second = Command::new(bin());
    second.args(["nbd", "--plain", "--listen", "127.0.0.1:0", "--meta", &c.meta.addr]);
    second.args(["--export", "disk=/disk.img", "--lock-wait", "1s"]).args(c.cert("client", "nbd-second", "default"));
    let out = second.stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("served by another `locus nbd`"), "{stderr}");
    // Plain NBD is refused off loopback, and a device is never shrunk by serving it.
    for (args, expected) in [
        (vec!["--listen", "0.0.0.0:0", "--export", "x=/x,size=1M"], "allowed only on a loopback"),
        (vec!["--listen", "127.0.0.1:0", "--export", "x=/disk.img,size=1M", "--shared"], "never shrinks"),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["nbd", "--plain", "--meta", &c.meta.addr]).args(&args).args(c.cert(
            "client",
            "nbd-second",
            "default",
        ));
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(expected), "{args:?}: {stderr}");
    }
    kill(first);
}

/// A client speaking the protocol by hand.
struct Raw(TcpStream);

impl Raw {
    /// Connects and reads the greeting; sends `client_flags`.
    fn connect(addr: &str, client_flags: u32) -> Raw {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        s.write_all(&client_flags.to_be_bytes()).unwrap();
        Raw(s)
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let mut out = b"IHAVEOPT".to_vec();
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.0.write_all(&out).unwrap();
    }

    /// The next option reply: its type and data.
    fn option_reply(&mut self) -> (u32, Vec<u8>) {
        let mut head = [0u8; 20];
        self.0.read_exact(&mut head).unwrap();
        let kind = u32::from_be_bytes(head[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(head[16..20].try_into().unwrap()) as usize];
        self.0.read_exact(&mut data).unwrap();
        (kind, data)
    }

    fn go(&mut self, name: &str) {
        let mut data = (name.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        self.option(7, &data);
        loop {
            let (kind, _) = self.option_reply();
            match kind {
                3 => continue,
                1 => return,
                other => panic!("GO answered {other:#x}"),
            }
        }
    }

    fn request(&mut self, command: u16, offset: u64, length: u32, data: &[u8]) -> u32 {
        let req = nbd::wire::Request { flags: 0, command: nbd_command(command), cookie: 9, offset, length };
        self.0.write_all(&req.encode()).unwrap();
        self.0.write_all(data).unwrap();
        let mut reply = [0u8; 16];
        self.0.read_exact(&mut reply).unwrap();
        assert_eq!(u64::from_be_bytes(reply[8..16].try_into().unwrap()), 9, "the reply's cookie");
        u32::from_be_bytes(reply[4..8].try_into().unwrap())
    }

    /// Whether the server has closed the connection (reads end, within the timeout).
    fn closed(&mut self) -> bool {
        let mut buf = [0u8; 64];
        matches!(self.0.read(&mut buf), Ok(0) | Err(_))
    }
}

fn nbd_command(t: u16) -> nbd::wire::Command {
    use nbd::wire::Command::*;
    match t {
        0 => Read,
        1 => Write,
        other => Other(other),
    }
}

#[test]
fn a_client_that_breaks_the_protocol_gets_errors_and_the_server_serves_on() {
    let c = Cluster::start(bin(), 2);
    let server = start_nbd(&c, "nbd0.log", &["disk=/disk.img,size=1M"], &["--plain"]);
    let addr = server.addr.as_str();

    // Not the fixed newstyle handshake: closed.
    assert!(Raw::connect(addr, 0).closed());
    // An option longer than any the protocol has: closed before it is read.
    let mut raw = Raw::connect(addr, 3);
    raw.0.write_all(b"IHAVEOPT").unwrap();
    raw.0.write_all(&[0, 0, 0, 7, 0xff, 0xff, 0xff, 0xff]).unwrap();
    assert!(raw.closed());
    // Options the server does not know, unknown exports and malformed INFO get errors,
    // and the haggling goes on.
    let mut raw = Raw::connect(addr, 3);
    raw.option(99, b"");
    assert_eq!(raw.option_reply().0, (1 << 31) | 1, "unknown option: ERR_UNSUP");
    raw.option(7, &[0, 0, 0, 4, b'n', b'o', b'p', b'e', 0, 0]);
    assert_eq!(raw.option_reply().0, (1 << 31) | 6, "unknown export: ERR_UNKNOWN");
    raw.option(6, &[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(raw.option_reply().0, (1 << 31) | 3, "malformed INFO: ERR_INVALID");
    raw.option(3, b"");
    let (kind, data) = raw.option_reply();
    assert_eq!((kind, &data[4..8]), (2, &b"disk"[..]), "LIST names the export");
    assert_eq!(raw.option_reply().0, 1);
    raw.go("disk");
    // Out of range: EINVAL for a read, ENOSPC for a write; unknown commands EINVAL.
    assert_eq!(raw.request(0, (1 << 20) - 10, 11, &[]), 22);
    assert_eq!(raw.request(1, u64::MAX - 2, 4, &[1, 2, 3, 4]), 28);
    assert_eq!(raw.request(42, 0, 0, &[]), 22);
    assert_eq!(raw.request(1, 0, 4, b"good"), 0);
    // A write longer than the largest block, and a request with a wrong magic: closed.
    let req =
        nbd::wire::Request { flags: 0, command: nbd::wire::Command::Write, cookie: 1, offset: 0, length: u32::MAX };
    raw.0.write_all(&req.encode()).unwrap();
    assert!(raw.closed());
    let mut raw = Raw::connect(addr, 3);
    raw.go("disk");
    raw.0.write_all(&[0x55; 28]).unwrap();
    assert!(raw.closed());

    // Through it all the server kept serving, and kept the good write.
    let out = ok("qemu-io", &["-f", "raw", "-c", "read -P 0 4 1020", &format!("nbd://{addr}/disk")]);
    assert!(!out.contains("fail"), "{out}");
    let back = c.path().join("head");
    ok("nbdcopy", &[&format!("nbd://{addr}/disk"), back.to_str().unwrap()]);
    assert_eq!(&std::fs::read(&back).unwrap()[..4], b"good");

    // A write acknowledged but never flushed, its client still connected, when the
    // server is told to stop (SIGTERM): the server makes it durable before it exits.
    let mut raw = Raw::connect(addr, 3);
    raw.go("disk");
    assert_eq!(raw.request(1, 4096, 5, b"later"), 0);
    let mut server = server;
    let pid = server.0.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let stopped = testkit::exits_within(&mut server.0.child, Duration::from_secs(30), "locus nbd");
    assert!(stopped.success(), "locus nbd exited with {stopped}");
    drop(raw);
    let server = start_nbd(&c, "nbd1.log", &["disk=/disk.img"], &["--plain"]);
    ok("nbdcopy", &[&format!("nbd://{}/disk", server.addr), back.to_str().unwrap()]);
    assert_eq!(&std::fs::read(&back).unwrap()[4096..4101], b"later");
    kill(server);
}
