//! Attacks on the transport against real `locus` processes, each refused with a
//! clear message on both sides: a plaintext peer, a certificate of another CA, an
//! expired or revoked certificate, a client certificate acting as a node, a node of
//! one site registering at another, a node certificate claiming another node's id,
//! and an eavesdropper on the wire (SECURITY.md lists them).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::Cluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_locus"))
}

fn run(args: &[String]) -> Output {
    Command::new(bin()).args(args).stdin(Stdio::null()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Waits (bounded) until `file` contains `text`.
fn logged(file: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(file).unwrap_or_default().contains(text) {
            return;
        }
        assert!(Instant::now() < deadline, "{} never said {text:?}", file.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `locus status` against `c` with the given TLS flags.
fn status(c: &Cluster, tls: &[String]) -> Output {
    let mut args = strings(&["status", "--meta", &c.meta.addr]);
    args.extend_from_slice(tls);
    run(&args)
}

#[test]
fn plaintext_strangers_and_expired_certificates_are_refused() {
    let c = Cluster::start(bin(), 1);
    let meta_log = c.path().join("meta.log");
    assert!(status(&c, &c.cert("client", "ok", "default")).status.success(), "a valid client was refused");

    // A peer without TLS.
    let o = status(&c, &strings(&["--insecure-no-tls"]));
    assert!(!o.status.success(), "a plaintext client was answered");
    assert!(stderr(&o).contains("WARNING: running without TLS"), "{}", stderr(&o));
    logged(&meta_log, "refusing a plaintext connection");

    // A certificate of another CA.
    let other = c.path().join("other-ca");
    run(&strings(&["ca", "init", "--dir", other.to_str().unwrap()]));
    let o = run(&strings(&[
        "ca",
        "issue",
        "--dir",
        other.to_str().unwrap(),
        "--role",
        "client",
        "--name",
        "mallory",
        "--site",
        "default",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    let ca = c.tls_dir().join("ca.pem").display().to_string();
    let (cert, key) = (other.join("mallory.pem"), other.join("mallory.key"));
    let o = status(&c, &strings(&["--ca", &ca, "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()]));
    assert!(!o.status.success(), "a certificate of another CA was accepted");
    assert!(stderr(&o).contains("the peer refused this end"), "{}", stderr(&o));
    logged(&meta_log, "TLS handshake refused");
    // The client also refuses a server of another CA.
    let theirs = other.join("ca.pem").display().to_string();
    let o = status(&c, &strings(&["--ca", &theirs, "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()]));
    assert!(!o.status.success() && stderr(&o).contains("TLS handshake failed"), "{}", stderr(&o));

    // A certificate past its validity.
    let o = run(&strings(&[
        "ca",
        "issue",
        "--dir",
        c.tls_dir().to_str().unwrap(),
        "--role",
        "client",
        "--name",
        "old",
        "--site",
        "default",
        "--days",
        "0",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    std::thread::sleep(Duration::from_secs(2));
    let (cert, key) = (c.tls_dir().join("old.pem"), c.tls_dir().join("old.key"));
    let o = status(&c, &strings(&["--ca", &ca, "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()]));
    assert!(!o.status.success(), "an expired certificate was accepted");
    logged(&meta_log, "expired");
}

/// Starts `locus node` with `cert` (role, name, site) claiming `id` at `site`; it must
/// fail, and its error output is returned.
fn refused_node(c: &Cluster, cert: (&str, &str, &str), id: &str, site: &str) -> String {
    let dir = c.path().join(format!("{id}-{}-chunks", cert.1));
    let mut args = strings(&["node", "--listen", "127.0.0.1:0", "--meta", &c.meta.addr, "--id", id, "--site", site]);
    args.extend(strings(&["--data-dir", dir.to_str().unwrap()]));
    args.extend(c.cert(cert.0, cert.1, cert.2));
    let o = run(&args);
    assert!(!o.status.success(), "node {id} at {site} with a {cert:?} certificate registered");
    stderr(&o)
}

#[test]
fn only_a_node_certificate_registers_and_only_as_itself_at_its_site() {
    let c = Cluster::start(bin(), 1);
    let meta_log = c.path().join("meta.log");
    let err = refused_node(&c, ("client", "sneaky", "default"), "sneaky", "default");
    assert!(err.contains("is not a node"), "client posing as a node: {err}");
    let err = refused_node(&c, ("node", "nb", "b"), "nb", "a");
    assert!(err.contains("may not register at site a"), "node of site b posing as site a: {err}");
    let err = refused_node(&c, ("node", "rogue", "default"), "node0", "default");
    assert!(err.contains("may not act as node node0"), "rogue node taking node0's id: {err}");
    logged(&meta_log, "refused:");
    // None of them is listed; node0 still is, with its address.
    let text = String::from_utf8_lossy(&c.locus(&["status", "--meta", &c.meta.addr]).stdout).into_owned();
    assert!(!text.contains("sneaky") && !text.contains(" nb ") && !text.contains("rogue"), "{text}");
    assert!(text.contains(&c.nodes[0].addr), "{text}");
}

#[test]
fn a_revoked_client_is_dropped_by_meta_and_nodes() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let mut c = Cluster::start(bin(), 1);
    let mnt = c.mount_at("default");
    let data = testkit::pattern(3 << 20, 7);
    std::fs::write(mnt.join("before"), &data).unwrap();
    c.revoke(&["client-default"]);
    logged(&c.path().join("meta.log"), "closing the connection of a revoked certificate");
    // Every new connection of the mount is refused: reads and writes fail.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let failed = std::fs::write(mnt.join("after"), &data).is_err();
        if failed {
            break;
        }
        assert!(Instant::now() < deadline, "the revoked mount still writes");
        std::thread::sleep(Duration::from_millis(200));
    }
    logged(&c.path().join("meta.log"), "is revoked");
    // The node learned the list at its heartbeat and drops the mount too.
    logged(&c.path().join("node0.log"), "revoked");
    // Another client is unaffected.
    assert!(c.locus(&["status", "--meta", &c.meta.addr]).status.success());
}

/// Forwards one port to another and keeps every byte that passed either way.
fn recording_proxy(to: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let addr = testkit::relay::relay(to, move |_| {
        let kept = kept.clone();
        Box::new(move |bytes, out| {
            out.write_all(bytes)?;
            kept.lock().unwrap().extend_from_slice(bytes);
            Ok(())
        })
    });
    (addr, seen)
}

#[test]
fn an_eavesdropper_sees_neither_names_nor_data() {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let c = Cluster::start(bin(), 1);
    let (proxy, seen) = recording_proxy(c.meta.addr.clone());
    let mnt = c.path().join("spied");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut args = strings(&["mount", mnt.to_str().unwrap(), "--meta", &proxy, "--site", "default"]);
    args.extend(c.cert("client", "client-default", "default"));
    let mut cmd = Command::new(bin());
    cmd.args(&args);
    let mut mount = testkit::spawn_command(cmd, "locus mounted on", &c.path().join("spied.log"));
    let secret_name = "a-very-secret-file-name-7f3a";
    std::fs::write(mnt.join(secret_name), b"secret contents").unwrap();
    assert!(std::fs::read_dir(&mnt).unwrap().any(|e| e.unwrap().file_name() == secret_name));
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let _ = mount.child.kill();
    let _ = mount.child.wait();
    let wire = seen.lock().unwrap().clone();
    assert!(wire.len() > 1000, "the proxy saw only {} bytes", wire.len());
    let found = wire.windows(secret_name.len()).any(|w| w == secret_name.as_bytes());
    assert!(!found, "the file name crossed the wire in clear");
}

/// What a client certificate may ask a node, over live TLS: no chunk without meta's
/// capability (knowing its hash is not enough), no put without one, and no listing or
/// deleting at all; a node's certificate (replication, repair, site fetches) may.
#[test]
fn a_client_certificate_gets_no_chunk_without_a_capability_and_cannot_administer_a_node() {
    use bytes::Bytes;
    use proto::error::ErrorCode;
    use proto::node::{Delete, Get, Has, List, NodeMessage, Put};
    let c = Cluster::start(bin(), 1);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let connect = |role: &str, name: &str| {
        let f = c.cert(role, name, "default");
        let tls = net::Tls::load(Path::new(&f[1]), Path::new(&f[3]), Path::new(&f[5])).unwrap();
        let connect = net::RpcClient::connect_as(&c.nodes[0].addr, 1, Duration::from_secs(10), Some(tls.into()));
        rt.block_on(connect).unwrap()
    };
    fn ask<M: NodeMessage + Clone>(
        rt: &tokio::runtime::Runtime,
        rpc: &net::RpcClient,
        req: &M,
        bulk: M::Bulk,
    ) -> Result<M::Response, proto::error::WireError> {
        rt.block_on(rpc.send_node(req.clone(), bulk)).unwrap()
    }
    let data = b"a chunk whose hash the thief knows".to_vec();
    let id = proto::types::ChunkId::of(&data);
    let get = Get { id, offset: 0, len: u64::MAX, local_only: true, cap: None };

    let peer = connect("node", "peer");
    let put = Put { id, cap: None, epoch: 1, replicate: Default::default() };
    ask(&rt, &peer, &put, Bytes::from(data.clone())).expect("a node's certificate puts without a capability");
    assert!(ask(&rt, &peer, &get, ()).is_ok(), "a node's certificate gets without a capability");

    let thief = connect("client", "thief");
    // Until the node has meta's key it refuses every client request as Busy.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let e = ask(&rt, &thief, &get, ()).expect_err("a get without a capability was served");
        if e.code != ErrorCode::Busy || Instant::now() > deadline {
            break e;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(refused.code, ErrorCode::PermissionDenied, "{refused}");
    assert_eq!(ask(&rt, &thief, &put, Bytes::from_static(b"forged")).unwrap_err().code, ErrorCode::PermissionDenied);
    let list = List { after: None, limit: 100 };
    assert_eq!(ask(&rt, &thief, &list, ()).unwrap_err().code, ErrorCode::NotPermitted);
    let delete = Delete { ids: vec![id], min_age_secs: 0, epoch: 1 };
    assert_eq!(ask(&rt, &thief, &delete, ()).unwrap_err().code, ErrorCode::NotPermitted);
    // The chunk is still there for those allowed.
    assert_eq!(ask(&rt, &peer, &Has { ids: vec![id] }, ()), Ok(vec![true]));
}

/// `locus ca revoke` takes a name as the certificate has it (grid DNs have capitals):
/// `Mallory` drops Mallory's live connection and refuses her next handshake, and the
/// command says which issued certificate the entry covers; `mallory` covers nothing,
/// and the command warns so, naming the certificate that differs only in case.
#[test]
fn a_revocation_covers_the_name_as_the_certificate_has_it() {
    let c = Cluster::start(bin(), 0);
    let f = c.cert("client", "Mallory", "default");
    let tls: Arc<net::Tls> = net::Tls::load(Path::new(&f[1]), Path::new(&f[3]), Path::new(&f[5])).unwrap().into();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let connect =
        || rt.block_on(net::RpcClient::connect_as(&c.meta.addr, 1, Duration::from_secs(5), Some(tls.clone())));
    let ask = |rpc: &net::RpcClient| rt.block_on(rpc.ask(proto::meta::Envelope::plain(proto::meta::Revocations {})));
    let live = connect().unwrap();
    assert!(ask(&live).unwrap().is_ok());
    let tls_dir = c.tls_dir().display().to_string();
    let wrong_case = run(&strings(&["ca", "revoke", "--dir", &tls_dir, "mallory"]));
    assert!(wrong_case.status.success());
    assert!(stderr(&wrong_case).contains("\"mallory\" matches no certificate issued in"), "{}", stderr(&wrong_case));
    assert!(stderr(&wrong_case).contains("differing only in case: Mallory"), "{}", stderr(&wrong_case));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(ask(&live).unwrap().is_ok(), "a name in another case is another name");
    let revoke = run(&strings(&["ca", "revoke", "--dir", &tls_dir, "Mallory"]));
    assert!(String::from_utf8_lossy(&revoke.stdout).contains("\"Mallory\" covers Mallory.pem"), "{revoke:?}");
    logged(&c.path().join("meta.log"), "closing the connection of a revoked certificate");
    assert!(ask(&live).is_err(), "the live connection was dropped");
    let again = connect().and_then(|rpc| ask(&rpc).map(|_| ()));
    assert!(again.is_err(), "a new handshake is refused");
    logged(&c.path().join("meta.log"), "(serial");
}
