//! Authorization against real processes: meta refuses, on its own, what a user may not
//! do however the request is sent (a modified client speaking the wire protocol), and
//! owners are global principals shown in each site's numbering, with the caller's site
//! proved by its client certificate (and root of a client host squashed unless meta
//! trusts the site).

use proto::cap::Receipt;
use proto::error::ErrorCode;
use proto::meta::*;
use proto::node::{Get, List, NodeMessage, Put, Stored};
use proto::policy::Replicate;
use proto::types::{Caller, ChunkId, Extent, ROOT_INODE, SessionId, Timestamp};
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

/// Makes `home` under mount `m`, writable by every user (as root, through the mount);
/// returns its path for the users' shell commands.
fn shared_home(m: &Path) -> String {
    std::fs::create_dir(m.join("home")).unwrap();
    std::fs::set_permissions(m.join("home"), std::fs::Permissions::from_mode(0o777)).unwrap();
    m.join("home").display().to_string()
}

/// A client speaking the wire protocol directly, claiming to be `caller`.
struct Raw {
    rt: tokio::runtime::Runtime,
    rpc: net::RpcClient,
}

impl Raw {
    /// Connects to `c`'s meta with a client certificate of site `default`.
    fn connect(c: &Cluster) -> Raw {
        Raw::connect_as(c, "client", "attacker", &c.meta.addr)
    }

    /// Connects to `addr` (meta or a node) with a certificate of `role` named `name`.
    fn connect_as(c: &Cluster, role: &str, name: &str, addr: &str) -> Raw {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let f = c.cert(role, name, "default");
        let tls = net::Tls::load(Path::new(&f[1]), Path::new(&f[3]), Path::new(&f[5])).unwrap();
        let rpc = rt.block_on(net::RpcClient::connect_as(addr, 1, Duration::from_secs(10), Some(tls.into()))).unwrap();
        Raw { rt, rpc }
    }

    fn ask<M: MetaMessage>(&self, caller: &Caller, req: M) -> Result<M::Response, ErrorCode> {
        self.ask_why(caller, req).map_err(|e| e.code)
    }

    /// The answer, or the whole error the attacker sees.
    fn ask_why<M: MetaMessage>(&self, caller: &Caller, req: M) -> Result<M::Response, proto::error::WireError> {
        let req = Envelope::as_user(caller.clone(), "default".into(), req);
        self.rt.block_on(self.rpc.ask(req)).unwrap()
    }

    /// A request to a node, with its bulk bytes (`()` for none).
    fn node<M: NodeMessage>(&self, req: M, bulk: M::Bulk) -> Result<M::Response, proto::error::WireError> {
        self.rt.block_on(self.rpc.send_node(req, bulk)).unwrap()
    }

    fn hello(&self) -> SessionId {
        let info = SessionInfo { site: "default".into(), host: "attacker".into(), pid: 1, purpose: "attack".into() };
        let hello = Hello { protocol: proto::PROTOCOL_VERSION, session: info };
        self.rt.block_on(self.rpc.ask(hello)).unwrap().unwrap().session
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
    let home = shared_home(&m);
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
    let create =
        Create { parent: dir.ino(), name: b"x".to_vec(), node: NewNode::File, mode: 0o644, umask: 0, exclusive: true };
    assert_eq!(raw.ask(&nobody, create).err(), Some(ErrorCode::PermissionDenied));
    // Below alice's 0700 directory the file is out of reach: refused before its own rules.
    let setuid = AttrChanges { mode: Some(0o4777), uid: Some(65534), ..Default::default() };
    assert_eq!(
        raw.ask(&nobody, SetAttr { ino: file.ino(), set: setuid, session: None }).err(),
        Some(ErrorCode::PermissionDenied)
    );
    let forget = ForgetChunks { ids: Vec::new() };
    assert_eq!(raw.ask(&nobody, forget).err(), Some(ErrorCode::NotPermitted));
    let session = raw.hello();
    let commit = CommitWrite {
        ino: file.ino(),
        session,
        extents: Vec::new(),
        chunks: Vec::new(),
        min_size: 1 << 20,
        mtime: Timestamp::now(),
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
    // An ACL's entries are renumbered as owners are: alice grants bob and physics at a;
    // b shows physics by its own number and bob (whom b does not map) by his global one.
    // Another mount shows a change once its attributes' TTL has run out.
    let getfacl_until = |path: &Path, want: &str| {
        let show = || as_user(0, 0, &format!("getfacl --omit-header --numeric {}", path.display()));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let shown = show();
            if shown.contains(want) || std::time::Instant::now() > deadline {
                return shown;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    as_user(1001, 300, &format!("setfacl -m u:1002:r,g:300:rw {}/pub/alice", at_a.display()));
    let shown_b = getfacl_until(&at_b.join("pub/alice"), "group:7000:rw-");
    assert!(shown_b.contains("group:7000:rw-"), "{shown_b}");
    let bob_global = shown_b.lines().find_map(|l| l.strip_prefix("user:")?.strip_suffix(":r--")?.parse::<u32>().ok());
    assert!(bob_global.is_some_and(|id| id >= meta::PRINCIPAL_BASE), "{shown_b}");
    // Alice edits it at b: bob's entry survives the round trip through b's numbering,
    // and the change is seen at a.
    as_user(5003, 7000, &format!("setfacl -m g:7000:r {}/pub/alice", at_b.display()));
    let shown_a = getfacl_until(&at_a.join("pub/alice"), "group:300:r--");
    assert!(shown_a.contains("user:1002:r--") && shown_a.contains("group:300:r--"), "{shown_a}");
    let refused = Command::new("setpriv")
        .args(["--reuid", "5003", "--regid", "7000", "--clear-groups", "setfacl", "-m", "u:4444:r"])
        .arg(at_b.join("pub/alice"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("Invalid argument"), "{refused:?}");
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

/// The issue's attacks with one valid client certificate, speaking the protocol from a
/// program (not through a kernel): reading another user's file by its chunk's hash or
/// by inode number below a directory it may not search, poisoning the chunk catalogue,
/// pinning someone's file with a hard link, keeping a setuid bit through a write. Each
/// is refused with the message it shows; the honest path (put, receipt, commit, read)
/// still works from the same program, and nothing the victim has changes.
#[test]
fn one_valid_client_certificate_reaches_nothing_it_may_not() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let m = c.mount();
    let home = shared_home(&m);
    as_user(
        1001,
        1001,
        &format!(
            "cd {home} && mkdir -m 700 alice && printf secret > alice/f && chmod 600 alice/f && \
             mkdir -m 755 alice/pub && printf public > alice/pub/g && ln -s /plans/for/monday alice/pub/l && \
             printf run > setuid && chmod 4777 setuid && printf run > setuid2 && chmod 4777 setuid2"
        ),
    );
    let ino = |p: &str| std::fs::metadata(m.join(p)).unwrap().ino();
    let (f, g, l) = (
        ino("home/alice/f"),
        ino("home/alice/pub/g"),
        std::fs::symlink_metadata(m.join("home/alice/pub/l")).unwrap().ino(),
    );
    let raw = Raw::connect(&c);
    let mallory = Caller::new(2000, 2000);
    as_user(2000, 2000, &format!("mkdir {home}/mallory"));
    let mine = ino("home/mallory");

    // By inode number, below alice's 0700 directory: nothing, not even attributes.
    let session = raw.hello();
    let read = OpenAccess { read: true, write: false };
    assert_eq!(
        raw.ask(&mallory, Open { ino: g, session, truncate: false, access: read }).err(),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(raw.ask(&mallory, Extents { ino: g }).err(), Some(ErrorCode::PermissionDenied));
    for ino in [f, g, ino("home/alice/pub")] {
        let refused = raw.ask_why(&mallory, GetAttr { ino }).unwrap_err();
        assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused}");
        assert!(refused.message.contains("may not search/execute directory"), "{refused}");
    }
    assert_eq!(raw.ask(&mallory, ReadLink { ino: l }).err(), Some(ErrorCode::PermissionDenied));
    assert_eq!(raw.ask(&mallory, ListXattr { ino: g }).err(), Some(ErrorCode::PermissionDenied));
    let link = Link { ino: f, new_parent: mine, new_name: b"pinned".to_vec() };
    assert_eq!(raw.ask(&mallory, link).err(), Some(ErrorCode::PermissionDenied));
    assert_eq!(std::fs::metadata(m.join("home/alice/f")).unwrap().nlink(), 1);

    // By chunk hash: the hash of alice's secret, bound to mallory's own file.
    let victim = ChunkId::of(b"secret");
    let create =
        Create { parent: mine, name: b"x".to_vec(), node: NewNode::File, mode: 0o644, umask: 0, exclusive: true };
    let rw = OpenAccess { read: true, write: true };
    let opened = raw.ask(&mallory, CreateOpen { create, session, access: rw }).unwrap();
    let x = opened.attr.ino;
    let extent = |chunk, len| Extent { file_offset: 0, len, chunk, chunk_offset: 0 };
    let commit = |chunks: Vec<StoredChunk>, chunk, len| CommitWrite {
        ino: x,
        session,
        extents: vec![extent(chunk, len)],
        chunks,
        min_size: len,
        mtime: Timestamp::now(),
    };
    let claim = |size, nodes: Vec<&str>, receipt| StoredChunk {
        id: victim,
        size,
        nodes: nodes.into_iter().map(String::from).collect(),
        receipt,
    };
    let refused = raw.ask_why(&mallory, commit(vec![], victim, 6)).unwrap_err();
    assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused}");
    assert!(refused.message.contains("neither stored by this request"), "{refused}");
    let refused = raw.ask_why(&mallory, commit(vec![claim(6, vec!["node0"], None)], victim, 6)).unwrap_err();
    assert!(refused.message.contains("no node's receipt for it"), "{refused}");
    let forged = Receipt { expires_ms: Timestamp::now().millis() + 60_000, mac: [7; 32] };
    let refused = raw.ask_why(&mallory, commit(vec![claim(6, vec!["node0"], Some(forged))], victim, 6)).unwrap_err();
    assert!(refused.message.contains("not signed by a node of this cluster"), "{refused}");
    // The catalogue keeps what the nodes said: another size and a ghost holder are refused.
    let poison = commit(vec![claim(1, vec!["node0", "ghost"], Some(forged))], victim, 1);
    assert_eq!(raw.ask(&mallory, poison).err(), Some(ErrorCode::PermissionDenied));
    let admin = Raw::connect_as(&c, "admin", "admin", &c.meta.addr);
    let record = admin.ask(&mallory, ChunkLocations { ids: vec![victim], caps: Vec::new() }).unwrap();
    assert_eq!((record[0].size, record[0].nodes.clone()), (6, vec!["node0".to_string()]));
    // Nor does the catalogue tell mallory whether the chunk exists (a confirmation
    // oracle for known content): without a read capability, an unknown chunk's answer.
    assert_eq!(raw.ask(&mallory, ChunkLocations { ids: vec![victim], caps: vec![None] }), Ok(Vec::new()));
    assert!(raw.ask(&mallory, Extents { ino: x }).unwrap().extents.is_empty(), "nothing was bound");

    // The honest path from the same program: a put with meta's capability earns the
    // node's receipt, which binds the chunk; reading it back takes the read capability.
    let node = Raw::connect_as(&c, "client", "attacker", &c.nodes[0].addr);
    let mine_data = b"mallory's own bytes".to_vec();
    let own = ChunkId::of(&mine_data);
    let put =
        Put { id: own, cap: opened.caps.put, epoch: 0, replicate: Replicate::for_writer(&opened.policy, "default") };
    let stored = node.node(put, bytes::Bytes::from(mine_data.clone()));
    let Ok(Stored { nodes, receipt: Some(receipt) }) = stored else { panic!("{stored:?}") };
    // A receipt is bound to what the node stored: not transferable to the victim's chunk.
    let stolen = StoredChunk { id: victim, size: 6, nodes: nodes.clone(), receipt: Some(receipt) };
    assert_eq!(raw.ask(&mallory, commit(vec![stolen], victim, 6)).err(), Some(ErrorCode::PermissionDenied));
    let honest = StoredChunk { id: own, size: mine_data.len() as u64, nodes, receipt: Some(receipt) };
    raw.ask(&mallory, commit(vec![honest], own, mine_data.len() as u64)).unwrap();
    let again = raw.ask(&mallory, Open { ino: x, session, truncate: false, access: read }).unwrap();
    let get = |id, cap| Get { id, offset: 0, len: u64::MAX, local_only: false, cap };
    let got = node.node(get(own, again.caps.read.first().copied()), ());
    assert_eq!(got.map(|bytes| bytes.to_vec()), Ok(mine_data));
    // Its read capability is for its own chunk, not alice's, at the node and at meta.
    let got = node.node(get(victim, again.caps.read.first().copied()), ());
    assert_eq!(got.unwrap_err().code, ErrorCode::PermissionDenied);
    let cap = again.caps.read.first().copied();
    let located = raw.ask(&mallory, ChunkLocations { ids: vec![own, victim], caps: vec![cap, cap] }).unwrap();
    assert_eq!(located.iter().map(|r| r.id).collect::<Vec<_>>(), vec![own]);

    // setuid: a write and a truncate by a non-owner clear it, whatever client sent them.
    let suid = ino("home/setuid");
    let w = raw.ask(&mallory, Open { ino: suid, session, truncate: false, access: rw }).unwrap();
    let data = b"rewritten".to_vec();
    let id = ChunkId::of(&data);
    let put = Put { id, cap: w.caps.put, epoch: 0, replicate: Replicate::for_writer(&w.policy, "default") };
    let Ok(Stored { nodes, receipt }) = node.node(put, bytes::Bytes::from(data.clone())) else { panic!("put refused") };
    let chunk = StoredChunk { id, size: data.len() as u64, nodes, receipt };
    let write = CommitWrite {
        ino: suid,
        session,
        extents: vec![Extent { file_offset: 0, len: data.len() as u64, chunk: id, chunk_offset: 0 }],
        chunks: vec![chunk],
        min_size: data.len() as u64,
        mtime: Timestamp::now(),
    };
    assert_eq!(raw.ask(&mallory, write).unwrap().mode & 0o7777, 0o777);
    let truncate = AttrChanges { size: Some(0), ..Default::default() };
    let t = raw.ask(&mallory, SetAttr { ino: ino("home/setuid2"), set: truncate, session: None }).unwrap();
    assert_eq!(t.mode & 0o7777, 0o777);

    // The victim lost nothing.
    assert_eq!(as_user(1001, 1001, &format!("cat {home}/alice/f")), "secret");
    assert_eq!(std::fs::read(m.join("home/mallory/x")).unwrap(), b"mallory's own bytes");
}

/// Least privilege: a node certificate is never a user at meta, an admin certificate
/// administers but reads no data without a capability, a plain client sees only its
/// own sessions, and every administrative action lands in the audit log.
#[test]
fn certificates_do_only_their_roles_work_and_admin_actions_are_audited() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let m = c.mount();
    std::fs::write(m.join("secret"), "s3cret").unwrap();
    std::fs::set_permissions(m.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let secret = std::fs::metadata(m.join("secret")).unwrap().ino();
    let nobody = Caller::new(65534, 65534);

    let as_node = Raw::connect_as(&c, "node", "node0", &c.meta.addr);
    let refused = as_node.ask_why(&nobody, Extents { ino: secret }).unwrap_err();
    assert_eq!(refused.code, ErrorCode::NotPermitted, "{refused}");
    assert!(refused.message.contains("may not ask Extents: that takes a certificate of role client"), "{refused}");
    let admin = Raw::connect_as(&c, "admin", "admin", &c.meta.addr);
    assert_eq!(admin.ask(&nobody, Extents { ino: secret }).err(), Some(ErrorCode::NotPermitted));
    let s = admin.ask(&nobody, Status {}).unwrap();
    assert!(!s.sessions.is_empty(), "an admin sees every session");
    // A move's steps are a meta's alone; a meta of another cluster is refused, and one
    // of this cluster can neither hand over nor prepare a home this meta does not hold.
    let foreign = HandOverHome { cluster: "another".into(), home: 1 };
    assert_eq!(admin.ask(&nobody, foreign.clone()).err(), Some(ErrorCode::NotPermitted));
    let as_meta = Raw::connect_as(&c, "meta", "meta-b", &c.meta.addr);
    let refused = as_meta.ask_why(&nobody, foreign).unwrap_err();
    assert!(refused.message.contains("cluster another"), "{refused}");
    let cluster = s.cluster_id.clone();
    let refused = as_meta.ask_why(&nobody, HandOverHome { cluster: cluster.clone(), home: 0 }).unwrap_err();
    assert!(refused.message.contains("does not hold home 0"), "{refused}");
    let prepare = PrepareHome { cluster, home: 1, site: "b".into(), database: "postgres".into() };
    let refused = as_meta.ask_why(&nobody, prepare).unwrap_err();
    assert!(refused.message.contains("does not hold home 1"), "{refused}");
    // At the node: an admin lists and verifies, but gets no data without a capability.
    let chunk = ChunkId::of(b"s3cret");
    let at_node = Raw::connect_as(&c, "admin", "admin", &c.nodes[0].addr);
    let list = at_node.node(List { after: None, limit: 10 }, ());
    assert!(matches!(list, Ok(ids) if ids.contains(&chunk)));
    let get = Get { id: chunk, offset: 0, len: u64::MAX, local_only: false, cap: None };
    assert_eq!(at_node.node(get, ()).unwrap_err().code, ErrorCode::PermissionDenied);

    // A plain client sees its own sessions only, no pending nodes, no audit.
    let client = Raw::connect(&c);
    let own = client.hello();
    // Asked on another connection of the same certificate: meta asks a session's own
    // connection for its workers' report, which this raw client does not answer.
    let client = Raw::connect(&c);
    let s = client.ask(&nobody, Status {}).unwrap();
    assert_eq!(s.sessions.iter().map(|(id, ..)| *id).collect::<Vec<_>>(), vec![own]);
    assert!(s.audit.is_empty());
    // An admin action, and one refused to a client, are both in the audit log.
    let out = c.locus(&["node", "admit", "n9", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(client.ask(&nobody, AdmitNode { node: "n8".into() }).err(), Some(ErrorCode::NotPermitted));
    let out = c.locus(&["status", "--audit", "--meta", &c.meta.addr]);
    let shown = String::from_utf8_lossy(&out.stdout);
    let admitted = shown.lines().find(|l| l.contains("admit node n9")).unwrap_or_else(|| panic!("{shown}"));
    assert!(admitted.contains("admin (admin of site default)") && admitted.trim_end().ends_with("ok"), "{admitted}");
    let refused = shown.lines().find(|l| l.contains("admit node n8")).unwrap_or_else(|| panic!("{shown}"));
    assert!(refused.contains("attacker (client of site default)") && refused.contains("refused"), "{refused}");
    // Unknown extended attribute namespaces are refused through the mount too.
    let setfattr = Command::new("setfattr").args(["-n", "weird.ns", "-v", "x"]).arg(m.join("secret")).output().unwrap();
    assert!(String::from_utf8_lossy(&setfattr.stderr).contains("Operation not supported"), "{setfattr:?}");
    // An ACL the owner sets through the mount is what meta enforces on a wire client;
    // the client may read it but not set or remove it.
    let session = client.hello();
    let read = OpenAccess { read: true, write: false };
    let open = || client.ask(&nobody, Open { ino: secret, session, truncate: false, access: read }).map(|_| ());
    assert_eq!(open(), Err(ErrorCode::PermissionDenied));
    let setfacl = |entry: &str| {
        let out = Command::new("setfacl").args(["-m", entry]).arg(m.join("secret")).output().unwrap();
        assert!(out.status.success(), "setfacl -m {entry}: {out:?}");
    };
    setfacl("u:65534:r");
    assert_eq!(open(), Ok(()));
    let name = b"system.posix_acl_access".to_vec();
    let value = client.ask(&nobody, GetXattr { ino: secret, name: name.clone() }).unwrap();
    let set = SetXattr { ino: secret, name: name.clone(), value, mode: XattrMode::Any };
    assert_eq!(client.ask(&nobody, set).err(), Some(ErrorCode::NotPermitted));
    assert_eq!(client.ask(&nobody, RemoveXattr { ino: secret, name }).err(), Some(ErrorCode::NotPermitted));
    setfacl("u:65534:---");
    assert_eq!(open(), Err(ErrorCode::PermissionDenied));
}

/// Users who prove who they are (`--user-auth`): at such a site a host's word for a
/// uid counts only with that user's login, made by the user with their own certificate
/// (`locus login`) and left for the mount. Before it, Alice's requests act as nobody;
/// after it, as Alice. A program holding the host's certificate reaches Alice's files
/// only with the login found on that host, and a user certificate asks nothing else.
#[test]
fn at_a_site_of_logins_a_host_acts_only_for_the_users_logged_in_there() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let maps = tempfile::tempdir().unwrap();
    let map = maps.path().join("default.map");
    std::fs::write(&map, "\"Alice Smith\" alice 1001\n").unwrap();
    let map_flag = format!("default={}", map.display());
    let flags = ["--identity-map", &map_flag, "--user-auth", "default", "--no-root-squash", "default"];
    let mut c = Cluster::start_with(bin(), 1, &flags);
    let logins = maps.path().join("logins");
    let m = c.mount_with("default", &["--logins", &logins.display().to_string()]);
    assert_eq!(std::fs::metadata(&logins).unwrap().permissions().mode() & 0o7777, 0o1777, "made for its users");
    let home = shared_home(&m);

    // No login: the host's claim of uid 1001 is not believed.
    as_user(1001, 1001, &format!("mkdir {home}/before"));
    assert_eq!(std::fs::metadata(m.join("home/before")).unwrap().uid(), 65534, "acted as nobody");

    // Alice logs in with her own certificate (she can read her key; nobody else can).
    let user = c.cert("user", "Alice Smith", "default");
    let own = maps.path().join("alice");
    std::fs::create_dir(&own).unwrap();
    for (flag, file) in [(3, "alice.pem"), (5, "alice.key")] {
        std::fs::copy(&user[flag], own.join(file)).unwrap();
        std::os::unix::fs::chown(own.join(file), Some(1001), Some(1001)).unwrap();
    }
    std::os::unix::fs::chown(&own, Some(1001), Some(1001)).unwrap();
    let login = format!(
        "{} login --meta {} --ca {} --cert {}/alice.pem --key {}/alice.key --logins {} --lifetime 1h",
        bin().display(),
        c.meta.addr,
        user[1],
        own.display(),
        own.display(),
        logins.display()
    );
    let said = as_user(1001, 1001, &login);
    assert!(said.contains("logged in as Alice Smith: uid 1001 at site default"), "{said}");
    let file = logins.join("1001");
    assert_eq!(std::fs::metadata(&file).unwrap().uid(), 1001);
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    // Bob with a copy of Alice's key cannot leave her login as his uid.
    for file in ["alice.pem", "alice.key", ""] {
        std::os::unix::fs::chown(own.join(file), Some(1002), Some(1002)).unwrap();
    }
    let other = Command::new("setpriv")
        .args(["--reuid", "1002", "--regid", "1002", "--clear-groups", "sh", "-c", &login])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&other.stderr).contains("you are uid 1002: log in as that user"), "{other:?}");

    // Logged in: the same host now acts as Alice for uid 1001.
    as_user(1001, 1001, &format!("mkdir -m 700 {home}/alice && printf secret > {home}/alice/f"));
    let f = std::fs::metadata(m.join("home/alice/f")).unwrap();
    assert_eq!(f.uid(), 1001);

    // A program with a host certificate of the site but not Alice's login is nobody;
    // with the login found on this host, it is Alice (what a stolen host key exposes:
    // the users logged in there).
    let raw = Raw::connect(&c);
    let alice = Caller::new(1001, 1001);
    let refused = raw.ask_why(&alice, GetAttr { ino: f.ino() }).unwrap_err();
    assert!(refused.message.contains("uid 65534 may not search/execute directory"), "{refused}");
    let token = proto::cap::UserToken::from_text(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let with_login =
        Envelope::as_user(alice.clone(), "default".into(), GetAttr { ino: f.ino() }).with_token(Some(token));
    assert!(raw.rt.block_on(raw.rpc.ask(with_login)).unwrap().is_ok());

    // A user certificate only logs in; a principal the site's map does not name cannot.
    let as_user_cert = Raw::connect_as(&c, "user", "Alice Smith", &c.meta.addr);
    assert_eq!(as_user_cert.ask(&alice, GetAttr { ino: f.ino() }).err(), Some(ErrorCode::NotPermitted));
    let stranger = Raw::connect_as(&c, "user", "Eve", &c.meta.addr);
    let refused = stranger.ask_why(&alice, Login { lifetime_secs: 60 }).unwrap_err();
    assert!(refused.message.contains("Eve has no account at site default"), "{refused}");
}
