//! Authorization against real processes: meta refuses, on its own, what a user may not
//! do however the request is sent (a modified client speaking the wire protocol), and
//! owners are global principals shown in each site's numbering, with the caller's site
//! proved by its client certificate (and root of a client host squashed unless meta
//! trusts the site).

use proto::error::ErrorCode;
use proto::meta::*;
use proto::types::{Caller, ROOT_INODE};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use testkit::Cluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

/// Runs `sh -c script` as `uid:gid` (no supplementary groups); returns stdout or
/// panics with stderr.
fn as_user(uid: u32, gid: u32, script: &str) -> String {
    let out = Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string(), "--clear-groups", "sh", "-c", script])
        .output()
        .expect("run setpriv");
    assert!(out.status.success(), "{script} as {uid}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client speaking the wire protocol directly, claiming to be `caller`.
struct Raw {
    rt: tokio::runtime::Runtime,
    rpc: net::RpcClient,
}

impl Raw {
    /// Connects to `c`'s meta with a client certificate of site `default`.
    fn connect(c: &Cluster) -> Raw {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let f = c.cert("client", "attacker", "default");
        let tls = net::Tls::load(Path::new(&f[1]), Path::new(&f[3]), Path::new(&f[5])).unwrap();
        let connect = net::RpcClient::connect_as(&c.meta.addr, 1, Duration::from_secs(10), Some(tls.into()));
        let rpc = rt.block_on(connect).unwrap();
        Raw { rt, rpc }
    }

    fn ask<M: MetaMessage>(&self, caller: &Caller, req: M) -> Result<M::Response, ErrorCode> {
        let req = Envelope::as_user(caller.clone(), "default".into(), req);
        self.rt.block_on(self.rpc.ask(req)).unwrap().map_err(|e| e.code)
    }
}

/// The first rows of the attack table: a user of another uid, speaking the protocol
/// from a script, cannot read, list, create in or chmod what POSIX denies it, even
/// knowing the inode numbers (the kernel of an honest client is not what stops it).
#[test]
fn meta_refuses_what_the_caller_may_not_do_whatever_the_client() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let m = c.mount();
    std::fs::create_dir(m.join("home")).unwrap();
    std::fs::set_permissions(m.join("home"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let home = m.join("home").display().to_string();
    as_user(
        1001,
        1001,
        &format!("mkdir -m 700 {home}/alice && printf secret > {home}/alice/f && chmod 600 {home}/alice/f"),
    );
    let dir = std::fs::metadata(m.join("home/alice")).unwrap();
    let file = std::fs::metadata(m.join("home/alice/f")).unwrap();
    assert_eq!((file.uid(), file.mode() & 0o7777), (1001, 0o600));

    let raw = Raw::connect(&c);
    let nobody = Caller::new(65534, 65534);
    let alice = Caller::new(1001, 1001);
    let lookup = || Lookup { parent: dir.ino(), name: b"f".to_vec() };
    assert_eq!(raw.ask(&alice, lookup()).map(|a| a.ino), Ok(file.ino()));
    assert_eq!(raw.ask(&nobody, lookup()).err(), Some(ErrorCode::PermissionDenied));
    assert_eq!(
        raw.ask(&nobody, ReadDir { ino: dir.ino(), after: 0, limit: 10 }).err(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(raw.ask(&nobody, Extents { ino: file.ino() }).err(), Some(ErrorCode::PermissionDenied));
    let create = Create { parent: dir.ino(), name: b"x".to_vec(), node: NewNode::File, mode: 0o644, exclusive: true };
    assert_eq!(raw.ask(&nobody, create).err(), Some(ErrorCode::PermissionDenied));
    let setuid = AttrChanges { mode: Some(0o4777), uid: Some(65534), ..Default::default() };
    assert_eq!(
        raw.ask(&nobody, SetAttr { ino: file.ino(), set: setuid, session: None }).err(),
        Some(ErrorCode::NotPermitted)
    );
    let forget = ForgetChunks { ids: Vec::new() };
    assert_eq!(raw.ask(&nobody, forget).err(), Some(ErrorCode::NotPermitted));
    let session = raw.rt.block_on(raw.rpc.ask(Hello {
        protocol: proto::PROTOCOL_VERSION,
        session: SessionInfo { site: "default".into(), host: "attacker".into(), pid: 1, purpose: "attack".into() },
    }));
    let session = session.unwrap().unwrap().session;
    let commit = CommitWrite {
        ino: file.ino(),
        session,
        extents: Vec::new(),
        chunks: Vec::new(),
        min_size: 1 << 20,
        mtime: proto::types::Timestamp::now(),
    };
    assert_eq!(raw.ask(&nobody, commit).err(), Some(ErrorCode::PermissionDenied));
    let open = Open { ino: file.ino(), session, truncate: false, access: OpenAccess { read: true, write: false } };
    assert_eq!(raw.ask(&nobody, open).err(), Some(ErrorCode::PermissionDenied));
    // Nothing changed, and the owner still reads it through the mount.
    assert_eq!(as_user(1001, 1001, &format!("cat {home}/alice/f")), "secret");
    assert_eq!(std::fs::metadata(m.join("home/alice/f")).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(raw.ask(&Caller::ROOT, GetAttr { ino: ROOT_INODE }).map(|a| a.ino), Ok(ROOT_INODE));
}

/// Identity across sites: meta stores Alice as a principal; site a numbers her 1001,
/// site b 5003, so a file she creates at a shows as hers at b, and what b does not
/// map shows as b's nobody.
#[test]
fn a_file_created_at_site_a_shows_its_owners_uid_at_site_b() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let maps = tempfile::tempdir().unwrap();
    let (a, b) = (maps.path().join("a.map"), maps.path().join("b.map"));
    std::fs::write(
        &a,
        "\"/DC=org/DC=grid/CN=Alice Smith\" alice 1001\n\"/CN=Bob\" bob 1002\n[groups]\n\"/OU=Physics\" physics 300\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "\"/DC=org/DC=grid/CN=Alice Smith\" alice 5003\n[groups]\n\"/OU=Physics\" phys 7000\nnobody 65000 65000\n",
    )
    .unwrap();
    let flags = [
        "--identity-map".to_string(),
        format!("a={}", a.display()),
        "--identity-map".to_string(),
        format!("b={}", b.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut c = Cluster::start_with(bin(), 0, &flags);
    c.add_node("a0", "a");
    c.add_node("b0", "b");
    c.wait_for_nodes(2);
    let at_a = c.mount_at("a");
    let at_b = c.mount_at("b");
    std::fs::create_dir(at_a.join("pub")).unwrap();
    std::fs::set_permissions(at_a.join("pub"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    as_user(1001, 300, &format!("echo hi > {}/pub/alice", at_a.display()));
    as_user(1002, 300, &format!("echo hi > {}/pub/bob", at_a.display()));
    let alice_a = std::fs::metadata(at_a.join("pub/alice")).unwrap();
    assert_eq!((alice_a.uid(), alice_a.gid()), (1001, 300));
    let alice_b = std::fs::metadata(at_b.join("pub/alice")).unwrap();
    assert_eq!((alice_b.uid(), alice_b.gid()), (5003, 7000), "alice's file is alice's at site b");
    let bob_b = std::fs::metadata(at_b.join("pub/bob")).unwrap();
    assert_eq!(bob_b.uid(), 65000, "bob has no number at site b: its nobody");
    assert_eq!(std::fs::metadata(at_b.join("pub")).unwrap().uid(), 0, "root stays root");
    // Alice at b is alice: she may write her file; a user b does not map may not.
    as_user(5003, 7000, &format!("echo again >> {}/pub/alice", at_b.display()));
    let denied = Command::new("setpriv")
        .args(["--reuid", "4444", "--regid", "4444", "--clear-groups", "sh", "-c"])
        .arg(format!("echo no >> {}/pub/alice", at_b.display()))
        .output()
        .unwrap();
    assert!(!denied.status.success());
    assert_eq!(std::fs::read_to_string(at_a.join("pub/alice")).unwrap(), "hi\nagain\n");
    // chown at b to b's numbers lands on the same principal.
    std::fs::write(at_b.join("pub/given"), "x").unwrap();
    std::os::unix::fs::chown(at_b.join("pub/given"), Some(5003), Some(7000)).unwrap();
    let given = std::fs::metadata(at_a.join("pub/given")).unwrap();
    assert_eq!((given.uid(), given.gid()), (1001, 300));
    let unmapped = std::os::unix::fs::chown(at_b.join("pub/given"), Some(4444), None).unwrap_err();
    assert_eq!(unmapped.raw_os_error(), Some(22), "EINVAL: {unmapped}");
}

/// Encryption at rest: a node with `--encrypt-key` keeps no plaintext in its chunk
/// files, serves the data back whole, and refuses a chunk file changed on its disk.
#[test]
fn an_encrypting_node_keeps_no_plaintext_on_disk_and_refuses_tampering() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("site.key");
    std::fs::write(&key, format!("{}\n", "5a".repeat(32))).unwrap();
    let mut c = Cluster::start(bin(), 0);
    c.add_node_with("enc0", "default", &["--encrypt-key", &key.display().to_string()]);
    c.wait_for_nodes(1);
    let m = c.mount();
    let data: Vec<u8> = b"TOP SECRET payroll line\n".iter().copied().cycle().take(3 << 20).collect();
    std::fs::write(m.join("payroll"), &data).unwrap();
    let chunks = c.node_dir("enc0").join("chunks");
    let mut files = Vec::new();
    let mut dirs = vec![chunks];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { dirs.push(p) } else { files.push(p) }
        }
    }
    assert!(!files.is_empty(), "the node stored the file's chunks");
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(!bytes.windows(10).any(|w| w == b"TOP SECRET"), "plaintext in {}", f.display());
    }
    // A second mount (no client cache) reads it back through the node's decryption.
    let again = c.mount();
    assert!(std::fs::read(again.join("payroll")).unwrap() == data);
    // One bit changed on the node's disk: the node's re-check (fsck) refuses the chunk.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&files[0], bytes).unwrap();
    let fsck = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(!fsck.status.success(), "fsck must report the tampered chunk: {}", String::from_utf8_lossy(&fsck.stdout));
}

/// With TLS, root of a client host is squashed: a mount of a site meta does not trust
/// (`--no-root-squash` names another) acts as nobody, so it may not create in root's
/// directories, what it creates is nobody's, and it may not give it to root.
#[test]
fn root_of_a_client_host_is_squashed() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start_with(bin(), 1, &["--no-root-squash", "trusted"]);
    let trusted = c.mount_at("trusted");
    let squashed = c.mount();
    std::fs::create_dir(trusted.join("pub")).unwrap();
    std::fs::set_permissions(trusted.join("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(std::fs::metadata(trusted.join("pub")).unwrap().uid(), 0, "the trusted site's root is root");
    let refused = std::fs::create_dir(squashed.join("mine")).unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(13), "EACCES in root's 0755 directory: {refused}");
    std::fs::write(squashed.join("pub/f"), "x").unwrap();
    let f = std::fs::metadata(squashed.join("pub/f")).unwrap();
    assert_eq!((f.uid(), f.gid()), (65534, 65534), "created as nobody");
    let chown = std::os::unix::fs::chown(squashed.join("pub/f"), Some(0), Some(0)).unwrap_err();
    assert_eq!(chown.raw_os_error(), Some(1), "EPERM: {chown}");
    assert!(squashed.join("pub/f").exists());
}
