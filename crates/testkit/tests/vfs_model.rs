//! The client `Vfs` against a reference model: random writes, truncates, renames,
//! reopens and reads through a real meta and a real node (in-process, over loopback
//! TCP), compared byte for byte with plain in-memory byte vectors — through the
//! writing client and through a second client that opens the files afterwards.

use client::{ClientConfig, OpenOptions, Vfs};
use proptest::prelude::*;
use proto::meta::{AttrChanges, NewNode};
use proto::types::ROOT_INODE;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const FILES: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Write { file: usize, offset: u64, len: usize, byte: u8 },
    Truncate { file: usize, size: u64 },
    Rename { from: usize, to: usize },
    Reopen { file: usize },
    Read { file: usize, offset: u64, len: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..FILES, 0u64..400_000, 1usize..150_000, any::<u8>()).prop_map(|(file, offset, len, byte)| Op::Write { file, offset, len, byte }),
        1 => (0..FILES, 0u64..500_000).prop_map(|(file, size)| Op::Truncate { file, size }),
        1 => (0..FILES, 0..FILES).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (0..FILES).prop_map(|file| Op::Reopen { file }),
        2 => (0..FILES, 0u64..600_000, 1u32..200_000).prop_map(|(file, offset, len)| Op::Read { file, offset, len }),
    ]
}

struct Env {
    rt: tokio::runtime::Runtime,
    meta_addr: String,
    _dir: tempfile::TempDir,
}

/// One meta and one node for every case; each case works in its own directory.
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Meta, node and clients share this process and so one certificate: the
        // node's (its name is the node id meta checks at registration).
        let ca = net::pki::Ca::create("vfs model").unwrap();
        let cert = ca.issue(net::Role::Node, "n0", "default", 1).unwrap();
        let tls = net::Tls::from_pem(ca.cert_pem().as_bytes(), cert.cert_pem.as_bytes(), cert.key_pem.as_bytes());
        net::secure(net::Security::Tls(std::sync::Arc::new(tls.unwrap())));
        let meta_addr = rt.block_on(async {
            let config = meta::MetaConfig {
                db_url: dir.path().join("meta.db").display().to_string(),
                read_db_url: None,
                init: true,
                heartbeat: Duration::from_secs(2),
                session_expiry: Duration::from_secs(30),
                primary_lease: None,
                db_timeout: meta::DEFAULT_DB_TIMEOUT,
                audit_log: None,
                root_policy: None,
            };
            let service = meta::MetaService::open(&config).unwrap();
            // The clients are this process's own mount (its node certificate asking
            // as a client, as under `locus up`): their root is root.
            service.configure_identities(Vec::new(), vec!["default".into()]).unwrap();
            service.admit_nodes(&["n0".to_string()]).await.unwrap();
            service.spawn_background();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let meta_addr = listener.local_addr().unwrap().to_string();
            tokio::spawn(net::serve(listener, service));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let node = node::NodeConfig {
                id: "n0".into(),
                site: "default".into(),
                data_dir: dir.path().join("chunks"),
                capacity_bytes: 1 << 34,
                meta_addr: meta_addr.clone(),
                advertise_addr: listener.local_addr().unwrap().to_string(),
                heartbeat: Duration::from_secs(1),
                wan: node::WanConfig::default(),
                reclaim: node::ReclaimConfig::default(),
                replication: node::ReplicationConfig::default(),
                metrics: None,
                join_token: None,
                encrypt_key: None,
            };
            tokio::spawn(node::run(node, listener));
            meta_addr
        });
        Env { rt, meta_addr, _dir: dir }
    })
}

async fn connect(meta_addr: &str) -> Arc<Vfs> {
    // Small chunks so that a few hundred KiB span many chunks and extents.
    let config = ClientConfig {
        meta_addr: meta_addr.into(),
        chunk_size: 64 << 10,
        max_dirty_bytes: 256 << 10,
        ..ClientConfig::default()
    };
    for _ in 0..100 {
        let vfs = Vfs::connect(config.clone()).await.unwrap();
        if vfs.statfs().await.unwrap().capacity_bytes > 0 {
            return vfs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the node never registered");
}

async fn run_case(case: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let env = env();
    let vfs = connect(&env.meta_addr).await;
    let dir = vfs.create(ROOT_INODE, format!("case{case}").as_bytes(), NewNode::Dir, 0o755, 0, true).await.unwrap();
    let name = |i: usize| format!("file{i}").into_bytes();
    let mut model: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut handles: HashMap<usize, u64> = HashMap::new();
    for i in 0..FILES {
        let attr = vfs.create(dir.ino, &name(i), NewNode::File, 0o644, 0, true).await.unwrap();
        handles.insert(i, vfs.open(attr.ino, OpenOptions::default()).await.unwrap().0);
        model.insert(i, Vec::new());
    }
    for op in ops {
        match op {
            Op::Write { file, offset, len, byte } => {
                vfs.write(handles[&file], offset, &vec![byte; len]).await.unwrap();
                let m = model.get_mut(&file).unwrap();
                let end = offset as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[offset as usize..end].fill(byte);
            }
            Op::Truncate { file, size } => {
                let ino = vfs.lookup(dir.ino, &name(file)).await.unwrap().ino;
                vfs.setattr(ino, AttrChanges { size: Some(size), ..AttrChanges::default() }, false).await.unwrap();
                model.get_mut(&file).unwrap().resize(size as usize, 0);
            }
            Op::Rename { from, to } if from != to => {
                vfs.rename(dir.ino, &name(from), dir.ino, &name(to), proto::meta::RenameMode::Exchange).await.unwrap();
                let (a, b) = (model.remove(&from).unwrap(), model.remove(&to).unwrap());
                model.insert(from, b);
                model.insert(to, a);
                let (ha, hb) = (handles[&from], handles[&to]);
                handles.insert(from, hb);
                handles.insert(to, ha);
            }
            Op::Rename { .. } => {}
            Op::Reopen { file } => {
                vfs.release(handles[&file]).await.unwrap();
                let ino = vfs.lookup(dir.ino, &name(file)).await.unwrap().ino;
                handles.insert(file, vfs.open(ino, OpenOptions::default()).await.unwrap().0);
            }
            Op::Read { file, offset, len } => {
                let got = vfs.read(handles[&file], offset, len).await.unwrap();
                let m = &model[&file];
                let from = (offset as usize).min(m.len());
                let to = (offset as usize + len as usize).min(m.len());
                prop_assert!(got == m[from..to], "read of file{file} at {offset}+{len} differs");
            }
        }
    }
    for (i, fh) in handles {
        vfs.release(fh).await.unwrap();
        let _ = i;
    }
    // A second client sees exactly what the first closed.
    let other = connect(&env.meta_addr).await;
    for (i, want) in &model {
        let ino = other.lookup(dir.ino, &name(*i)).await.unwrap();
        prop_assert_eq!(ino.size, want.len() as u64);
        let (fh, _) = other.open(ino.ino, OpenOptions::default()).await.unwrap();
        let got = other.read(fh, 0, want.len() as u32 + 10).await.unwrap();
        prop_assert!(got == want, "file{i} differs for a second client");
        other.release(fh).await.unwrap();
    }
    vfs.shutdown().await;
    other.shutdown().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn vfs_matches_reference_model(ops in prop::collection::vec(op(), 1..40)) {
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        env().rt.block_on(run_case(case, ops))?;
    }
}

#[test]
fn fragmented_files_are_compacted_in_the_background() {
    let env = env();
    env.rt.block_on(async {
        let vfs = connect(&env.meta_addr).await;
        let (attr, fh) = new_file(&vfs, b"fragmented").await;
        let mut model = vec![1u8; 256 << 10];
        vfs.write(fh, 0, &model).await.unwrap();
        vfs.fsync(fh).await.unwrap();
        // 100 small overwrites, each committed on its own: 100+ extents.
        for i in 0..100u64 {
            let at = (i * 2459) % (250 << 10);
            vfs.write(fh, at, &[i as u8; 7]).await.unwrap();
            model[at as usize..at as usize + 7].fill(i as u8);
            vfs.fsync(fh).await.unwrap();
        }
        let meta = net::RpcClient::connect(&env.meta_addr, 1, Duration::from_secs(10)).await.unwrap();
        let before = extent_count(&meta, attr.ino).await;
        assert!(before > 100, "expected a fragmented file, got {before} extents");
        vfs.release(fh).await.unwrap();
        let mut after = before;
        for _ in 0..100 {
            after = extent_count(&meta, attr.ino).await;
            if after < 16 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(after < 16, "compaction left {after} of {before} extents");
        let (fh, _) = vfs.open(attr.ino, OpenOptions::default()).await.unwrap();
        assert!(vfs.read(fh, 0, model.len() as u32).await.unwrap() == model, "compaction changed the content");
        vfs.release(fh).await.unwrap();
    });
}

/// A sequential reader lets go of the chunks it has gone past (the kernel's page cache
/// holds what it read): a long read keeps a few chunks in memory, not the whole file,
/// and a chunk the file holds again further on stays for then.
#[test]
fn a_sequential_reader_lets_go_of_the_chunks_behind_it() {
    let env = env();
    env.rt.block_on(async {
        let chunk = 64 << 10;
        // 64 chunks, each of its own bytes but the 40th, a copy of the 1st.
        let mut model = Vec::with_capacity(64 * chunk);
        for i in 0..64u8 {
            model.extend(std::iter::repeat_n(if i == 39 { 0 } else { i }, chunk));
        }
        let (reader, fh) = written_then_opened(b"streamed", &model).await;
        for at in (0..model.len()).step_by(chunk / 2) {
            let got = reader.read(fh, at as u64, (chunk / 2) as u32).await.unwrap();
            assert!(got == model[at..at + chunk / 2], "bytes at {at}");
        }
        reader.release(fh).await.unwrap();
        let held = chunk_bytes_held(&reader).await;
        assert!(held <= 3 * chunk, "{held} bytes of a {} byte file held after reading it through", model.len());
    });
}

/// A reader that jumps fetches nothing ahead until it has gone past the chunk after the
/// one it jumped into: a read of a whole chunk at a random offset arrives as several
/// requests that look sequential (the kernel splits it) followed by the kernel's own
/// read-ahead into the next chunk, and must not bring further chunks along. A reader
/// that goes on streams again.
#[test]
fn a_jump_fetches_nothing_ahead_until_the_reader_goes_on() {
    let env = env();
    env.rt.block_on(async {
        let chunk = 64 << 10;
        let model: Vec<u8> = (0..32 * chunk).map(|i| (i / chunk) as u8 ^ (i % 251) as u8).collect();
        let (reader, fh) = written_then_opened(b"jumped", &model).await;
        let model = &model;
        let read = |at: usize, len: usize| {
            let reader = reader.clone();
            async move {
                let got = reader.read(fh, at as u64, len as u32).await.unwrap();
                assert!(got == model[at..at + len], "bytes at {at}");
            }
        };
        // Three whole chunks far apart, each as four requests and the kernel's read-ahead
        // into the next chunk.
        for first in [5, 17, 11] {
            for quarter in 0..5 {
                read(first * chunk + quarter * chunk / 4, chunk / 4).await;
            }
        }
        // Any read-ahead would have been started by now; let it land.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = chunk_bytes_held(&reader).await;
        assert_eq!(held, 6 * chunk, "bytes of chunks held after reading three and a bit of the next ones");

        // Going on into chunk 13 starts the stream: 14 and 15 come ahead (and 11 goes).
        read(13 * chunk, chunk).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = chunk_bytes_held(&reader).await;
        assert!(held >= 8 * chunk, "{held} bytes held: the stream fetched nothing ahead of chunk 13");
        reader.release(fh).await.unwrap();
    });
}

/// A new file `name` holding `model`, written by one client, open in another (whose
/// chunk cache holds none of it).
async fn written_then_opened(name: &[u8], model: &[u8]) -> (Arc<Vfs>, u64) {
    let env = env();
    let writer = connect(&env.meta_addr).await;
    let (attr, fh) = new_file(&writer, name).await;
    writer.write(fh, 0, model).await.unwrap();
    writer.release(fh).await.unwrap();
    let reader = connect(&env.meta_addr).await;
    let (fh, _) = reader.open(attr.ino, OpenOptions::default()).await.unwrap();
    (reader, fh)
}

/// Bytes of chunks `vfs` keeps in memory, as its session worker reports them at its next
/// heartbeat (every 2 s here).
async fn chunk_bytes_held(vfs: &Arc<Vfs>) -> usize {
    let session = || vfs.workers().into_iter().find(|w| w.name == "session").unwrap();
    let read_at = session().steps;
    let mut status = session();
    for _ in 0..100 {
        if status.steps > read_at {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = session();
    }
    assert!(status.steps > read_at, "no heartbeat in 10 s");
    let held = status.progress.split(", ").find_map(|p| p.strip_suffix(" bytes of chunks in memory"));
    held.expect("the session's progress shows the chunk cache").parse().unwrap()
}

/// A new file in the root directory, open.
async fn new_file(vfs: &Arc<Vfs>, name: &[u8]) -> (proto::types::Attr, u64) {
    let attr = vfs.create(ROOT_INODE, name, NewNode::File, 0o644, 0, true).await.unwrap();
    let (fh, _) = vfs.open(attr.ino, OpenOptions::default()).await.unwrap();
    (attr, fh)
}

async fn extent_count(meta: &net::RpcClient, ino: u64) -> usize {
    meta.ask(proto::meta::Extents { ino }).await.unwrap().unwrap().extents.len()
}

/// The attributes of a directory this client's create, mkdir, unlink or rmdir just changed are known
/// without asking meta (for the kernel's GETATTR of the parent that follows), equal to
/// meta's, once; a close in between leaves them fresh, another change makes them stale.
#[test]
fn a_directory_just_changed_is_answered_from_the_change() {
    let env = env();
    env.rt.block_on(async {
        let vfs = connect(&env.meta_addr).await;
        let dir = vfs.create(ROOT_INODE, b"fresh-parent", NewNode::Dir, 0o755, 0, true).await.unwrap();
        let ttl = Duration::from_secs(30);
        let (_, fh) = vfs.create_open(dir.ino, b"a", 0o644, 0, true, OpenOptions::default()).await.unwrap();
        // The close's Release to meta runs in the background meanwhile.
        vfs.release(fh).await.unwrap();
        // Heartbeats and the revocation list go to meta meanwhile too (every 2 s here).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let fresh = vfs.fresh_dir_attr(dir.ino, ttl).expect("the create's answer, after a close");
        assert_eq!(fresh, vfs.getattr(dir.ino).await.unwrap());
        assert!(fresh.mtime > dir.mtime, "the create's new mtime");
        assert_eq!(vfs.fresh_dir_attr(dir.ino, ttl), None, "answered once");

        vfs.create_open(dir.ino, b"b", 0o644, 0, true, OpenOptions::default()).await.unwrap();
        vfs.setattr(dir.ino, AttrChanges { mode: Some(0o700), ..AttrChanges::default() }, false).await.unwrap();
        assert_eq!(vfs.fresh_dir_attr(dir.ino, ttl), None, "a chmod of the directory came after the create");

        vfs.unlink(dir.ino, b"a").await.unwrap();
        assert_eq!(vfs.fresh_dir_attr(ROOT_INODE, ttl), None, "another directory");
        vfs.unlink(dir.ino, b"b").await.unwrap();
        let fresh = vfs.fresh_dir_attr(dir.ino, ttl).expect("the unlink's answer");
        assert_eq!(fresh, vfs.getattr(dir.ino).await.unwrap());
        assert_eq!(fresh.mode & 0o7777, 0o700);

        vfs.create(dir.ino, b"sub", NewNode::Dir, 0o755, 0, true).await.unwrap();
        let fresh = vfs.fresh_dir_attr(dir.ino, ttl).expect("the mkdir's answer");
        assert_eq!((fresh.nlink, &fresh), (3, &vfs.getattr(dir.ino).await.unwrap()));
        vfs.rmdir(dir.ino, b"sub").await.unwrap();
        let fresh = vfs.fresh_dir_attr(dir.ino, ttl).expect("the rmdir's answer");
        assert_eq!((fresh.nlink, &fresh), (2, &vfs.getattr(dir.ino).await.unwrap()));
    });
}
