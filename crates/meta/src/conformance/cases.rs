//! The cases of the conformance suite, one public function each; `conformance_tests!`
//! turns each into a `#[test]` for a backend.

use super::Factory;
use crate::service::{MetaConfig, MetaService};
use proto::error::ErrorCode;
use proto::meta::*;
use proto::types::*;
use std::sync::Arc;
use std::time::Duration;

/// The settings every case runs with, over the SQLite file `db_path` (formatted if new).
pub fn test_config(db_path: std::path::PathBuf) -> MetaConfig {
    MetaConfig {
        db_url: db_path.display().to_string(),
        read_db_url: None,
        init: true,
        heartbeat: Duration::from_secs(5),
        session_expiry: Duration::from_secs(30),
        primary_lease: None,
        metadata_rpo: None,
        db_timeout: crate::service::DEFAULT_DB_TIMEOUT,
        audit_log: None,
        root_policy: None,
        forward_writes_to: None,
        homes: Vec::new(),
        sites: Vec::new(),
        site: None,
        auto_move: Default::default(),
    }
}

/// Cases run as the superuser unless they say otherwise (`as_user`).
fn call(s: &Arc<MetaService>, req: MetaRequest) -> MetaResult {
    s.handle_blocking(req)
}

#[track_caller]
fn ok(s: &Arc<MetaService>, req: MetaRequest) -> MetaReply {
    let shown = format!("{req:?}");
    match call(s, req) {
        Ok(r) => r,
        Err(e) => panic!("{shown} failed: {e}"),
    }
}

#[track_caller]
/// Admits node ids, as `locus node admit` does before a node may register.
fn admit(s: &Arc<MetaService>, ids: &[&str]) {
    for id in ids {
        ok(s, MetaRequest::AdmitNode(AdmitNode { node: id.to_string() }));
    }
}

fn err(s: &Arc<MetaService>, req: MetaRequest) -> ErrorCode {
    let shown = format!("{req:?}");
    match call(s, req) {
        Ok(r) => panic!("{shown} succeeded with {r:?}"),
        Err(e) => e.code,
    }
}

#[track_caller]
/// The attributes an answer carries: `Attr`'s, or the node `Made` names.
fn attr(r: MetaReply) -> Attr {
    match r {
        MetaReply::Attr(a) | MetaReply::Made(Made { attr: a, .. }) => a,
        other => panic!("expected Attr or Made, got {other:?}"),
    }
}

fn caller() -> Caller {
    Caller::new(1000, 100)
}

/// Runs `req` for `c` and returns its answer or error code.
fn as_user(s: &Arc<MetaService>, c: &Caller, req: MetaRequest) -> Result<MetaReply, ErrorCode> {
    s.handle_blocking_as(c.clone(), req).map_err(|e| e.code)
}

fn create_req(parent: InodeId, name: &str, node: NewNode, mode: u32) -> MetaRequest {
    MetaRequest::Create(Create { parent, name: name.into(), node, mode, umask: 0, exclusive: true })
}

#[track_caller]
fn mk(s: &Arc<MetaService>, parent: InodeId, name: &str, node: NewNode) -> Attr {
    let mode = if node == NewNode::Dir { 0o755 } else { 0o644 };
    attr(ok(s, create_req(parent, name, node, mode)))
}

#[track_caller]
fn get(s: &Arc<MetaService>, ino: InodeId) -> Attr {
    attr(ok(s, MetaRequest::GetAttr(GetAttr { ino })))
}

#[track_caller]
fn lookup(s: &Arc<MetaService>, parent: InodeId, name: &str) -> Result<Attr, ErrorCode> {
    call(s, MetaRequest::Lookup(Lookup { parent, name: name.into() })).map(attr).map_err(|e| e.code)
}

fn hello(s: &Arc<MetaService>) -> SessionId {
    let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "/mnt".into() };
    match ok(s, MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION, session: info })) {
        MetaReply::Welcome(Welcome { session, heartbeat_ms, .. }) => {
            assert_eq!(heartbeat_ms, 5000);
            session
        }
        other => panic!("expected Welcome, got {other:?}"),
    }
}

fn cid(tag: u8) -> ChunkId {
    ChunkId([tag; 32])
}

fn ext(file_offset: u64, len: u64, tag: u8, chunk_offset: u64) -> Extent {
    Extent { file_offset, len, chunk: cid(tag), chunk_offset }
}

fn commit(s: &Arc<MetaService>, ino: InodeId, extents: Vec<Extent>, min_size: u64) -> Attr {
    let chunks = extents
        .iter()
        .map(|e| StoredChunk { id: e.chunk, size: 1 << 20, nodes: vec!["n1".into()], receipt: None })
        .collect();
    attr(ok(
        s,
        MetaRequest::CommitWrite(CommitWrite {
            session: 0,
            ino,
            extents,
            chunks,
            min_size,
            mtime: Timestamp { secs: 77, nanos: 5 },
        }),
    ))
}

/// Refcount of a chunk, or None if absent from the catalogue.
fn refcount(s: &Arc<MetaService>, tag: u8) -> Option<u64> {
    match ok(s, MetaRequest::ChunkLocations(ChunkLocations { ids: vec![cid(tag)], caps: Vec::new() })) {
        MetaReply::Chunks(c) => c.first().map(|c| c.refcount),
        other => panic!("expected Chunks, got {other:?}"),
    }
}

fn extents(s: &Arc<MetaService>, ino: InodeId) -> Vec<(u64, u64, u8, u64)> {
    match ok(s, MetaRequest::Extents(Extents { ino })) {
        MetaReply::Opened(Opened { attr, extents, .. }) => {
            assert_eq!(attr.ino, ino);
            extents.into_iter().map(|e| (e.file_offset, e.len, e.chunk.0[0], e.chunk_offset)).collect()
        }
        other => panic!("expected Opened, got {other:?}"),
    }
}

/// Conformance case `root_and_create`.
pub fn root_and_create(b: &dyn Factory) {
    let s = b.open();
    let root = get(&s, ROOT_INODE);
    assert_eq!((root.kind, root.mode, root.uid, root.gid, root.nlink), (FileKind::Dir, 0o755, 0, 0, 2));
    let before = root.mtime;
    std::thread::sleep(Duration::from_millis(5));

    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    assert_eq!((f.kind, f.mode, f.uid, f.gid, f.nlink, f.size, f.data_version), (FileKind::File, 0o644, 0, 0, 1, 0, 0));
    assert_eq!(lookup(&s, ROOT_INODE, "f"), Ok(f.clone()));
    assert!(get(&s, ROOT_INODE).mtime > before, "parent mtime must move");
    assert_eq!(err(&s, create_req(ROOT_INODE, "f", NewNode::File, 0o644)), ErrorCode::Exists);
    // Non-exclusive create of an existing regular file returns it.
    let again = attr(ok(
        &s,
        MetaRequest::Create(Create {
            parent: ROOT_INODE,
            name: b"f".to_vec(),
            node: NewNode::File,
            mode: 0o600,
            umask: 0,
            exclusive: false,
        }),
    ));
    assert_eq!(again.ino, f.ino);
    // A create-and-open says whether it made the file (an empty existing one too).
    let session = hello(&s);
    let create_open = |name: &str| {
        let create = Create {
            parent: ROOT_INODE,
            name: name.into(),
            node: NewNode::File,
            mode: 0o644,
            umask: 0,
            exclusive: false,
        };
        match ok(&s, MetaRequest::CreateOpen(CreateOpen { create, session, access: OpenAccess::default() })) {
            MetaReply::Opened(o) => (o.attr.ino, o.created),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(create_open("f"), (f.ino, false), "f exists, empty");
    let (fresh, created) = create_open("fresh");
    assert!(created && fresh != f.ino);
    assert_eq!(create_open("fresh"), (fresh, false));

    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    assert_eq!((d.kind, d.nlink), (FileKind::Dir, 2));
    assert_eq!(get(&s, ROOT_INODE).nlink, 3);
    assert_eq!(
        err(
            &s,
            MetaRequest::Create(Create {
                parent: ROOT_INODE,
                name: b"d".to_vec(),
                node: NewNode::File,
                mode: 0o600,
                umask: 0,
                exclusive: false,
            })
        ),
        ErrorCode::Exists
    );
    assert_eq!(lookup(&s, d.ino, "..").map(|a| a.ino), Ok(ROOT_INODE));
    assert_eq!(lookup(&s, d.ino, ".").map(|a| a.ino), Ok(d.ino));

    let l = mk(&s, d.ino, "link", NewNode::Symlink { target: b"../f".to_vec() });
    assert_eq!((l.kind, l.size), (FileKind::Symlink, 4));
    assert_eq!(ok(&s, MetaRequest::ReadLink(ReadLink { ino: l.ino })), MetaReply::Bytes(b"../f".to_vec()));
    assert_eq!(err(&s, MetaRequest::ReadLink(ReadLink { ino: f.ino })), ErrorCode::InvalidArgument);

    let dev = mk(&s, d.ino, "dev", NewNode::Special { kind: FileKind::CharDevice, rdev: 0x0103 });
    assert_eq!((dev.kind, dev.rdev), (FileKind::CharDevice, 0x0103));
    let fifo = mk(&s, d.ino, "fifo", NewNode::Special { kind: FileKind::Fifo, rdev: 0 });
    assert_eq!(fifo.kind, FileKind::Fifo);

    assert_eq!(lookup(&s, ROOT_INODE, "nope"), Err(ErrorCode::NotFound));
    assert_eq!(lookup(&s, f.ino, "x"), Err(ErrorCode::NotDir));
    assert_eq!(err(&s, create_req(f.ino, "x", NewNode::File, 0o644)), ErrorCode::NotDir);
    assert_eq!(err(&s, create_req(9999, "x", NewNode::File, 0o644)), ErrorCode::NotFound);
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: 9999 })), ErrorCode::NotFound);
}

/// Conformance case `names_are_checked`.
pub fn names_are_checked(b: &dyn Factory) {
    let s = b.open();
    for bad in ["", ".", "..", "a/b"] {
        assert_eq!(err(&s, create_req(ROOT_INODE, bad, NewNode::File, 0o644)), ErrorCode::InvalidArgument, "{bad:?}");
    }
    let long = "x".repeat(256);
    assert_eq!(err(&s, create_req(ROOT_INODE, &long, NewNode::File, 0o644)), ErrorCode::NameTooLong);
    mk(&s, ROOT_INODE, &"y".repeat(255), NewNode::File);
    assert_eq!(lookup(&s, ROOT_INODE, &long), Err(ErrorCode::NameTooLong));
    // Mode keeps only permission bits.
    let f = attr(ok(&s, create_req(ROOT_INODE, "m", NewNode::File, 0o100644)));
    assert_eq!(f.mode, 0o644);
}

/// Conformance case `setgid_inheritance`.
pub fn setgid_inheritance(b: &dyn Factory) {
    let s = b.open();
    let d = mk(&s, ROOT_INODE, "shared", NewNode::Dir);
    ok(
        &s,
        MetaRequest::SetAttr(SetAttr {
            ino: d.ino,
            set: AttrChanges { mode: Some(0o2775), gid: Some(500), ..Default::default() },
            session: None,
        }),
    );
    let f = mk(&s, d.ino, "f", NewNode::File);
    assert_eq!((f.gid, f.mode & 0o2000), (500, 0));
    let sub = mk(&s, d.ino, "sub", NewNode::Dir);
    assert_eq!(sub.gid, 500);
    assert_eq!(sub.mode & 0o2000, 0o2000, "a directory in a setgid directory is setgid too");
    let deeper = mk(&s, sub.ino, "g", NewNode::File);
    assert_eq!(deeper.gid, 500);
    // Without setgid the caller's uid and gid are used.
    let open = attr(ok(&s, create_req(ROOT_INODE, "open", NewNode::Dir, 0o777)));
    let plain = attr(as_user(&s, &caller(), create_req(open.ino, "plain", NewNode::File, 0o644)).unwrap());
    assert_eq!((plain.uid, plain.gid), (1000, 100));
}

/// Conformance case `hard_links`.
pub fn hard_links(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    let a = attr(ok(&s, MetaRequest::Link(Link { ino: f.ino, new_parent: d.ino, new_name: b"g".to_vec() })));
    assert_eq!(a.nlink, 2);
    assert_eq!(lookup(&s, d.ino, "g").map(|a| (a.ino, a.nlink)), Ok((f.ino, 2)));
    assert_eq!(
        err(&s, MetaRequest::Link(Link { ino: f.ino, new_parent: d.ino, new_name: b"g".to_vec() })),
        ErrorCode::Exists
    );
    assert_eq!(
        err(&s, MetaRequest::Link(Link { ino: d.ino, new_parent: ROOT_INODE, new_name: b"dd".to_vec() })),
        ErrorCode::NotPermitted
    );
    assert_eq!(
        err(&s, MetaRequest::Link(Link { ino: f.ino, new_parent: f.ino, new_name: b"x".to_vec() })),
        ErrorCode::NotDir
    );
    assert_eq!(unlinked(&s, ROOT_INODE, "f"), (f.ino, false));
    assert_eq!(get(&s, f.ino).nlink, 1);
    ok(&s, MetaRequest::Unlink(Unlink { parent: d.ino, name: b"g".to_vec() }));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: f.ino })), ErrorCode::NotFound);
}

/// Unlinks `name` in `parent`; checks that the answer carries the parent's attributes
/// as a later GETATTR sees them; returns the inode and whether it became an orphan.
fn unlinked(s: &Arc<MetaService>, parent: InodeId, name: &str) -> (InodeId, bool) {
    match ok(s, MetaRequest::Unlink(Unlink { parent, name: name.into() })) {
        MetaReply::Unlinked(u) => {
            assert_eq!(u.parent, get(s, parent), "the parent's attributes after the unlink");
            (u.ino, u.orphaned)
        }
        other => panic!("expected Unlinked, got {other:?}"),
    }
}

/// Conformance case `unlink_orphan_release`.
pub fn unlink_orphan_release(b: &dyn Factory) {
    let s = b.open();
    let session = hello(&s);
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    ok(&s, MetaRequest::Open(Open { ino: f.ino, session, truncate: false, access: OpenAccess::default() }));
    commit(&s, f.ino, vec![ext(0, 100, 1, 0)], 100);
    assert_eq!(refcount(&s, 1), Some(1));
    assert_eq!(unlinked(&s, ROOT_INODE, "f"), (f.ino, true));
    assert_eq!(lookup(&s, ROOT_INODE, "f"), Err(ErrorCode::NotFound));
    let orphan = get(&s, f.ino);
    assert_eq!((orphan.nlink, orphan.size), (0, 100));
    // An orphan can still be written and read by its opener.
    commit(&s, f.ino, vec![ext(100, 10, 2, 0)], 110);
    assert_eq!(extents(&s, f.ino).len(), 2);
    ok(&s, MetaRequest::Release(Release { ino: f.ino, session }));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: f.ino })), ErrorCode::NotFound);
    assert_eq!(refcount(&s, 1), Some(0));
    assert_eq!(refcount(&s, 2), Some(0));

    // Two opens need two releases.
    let g = mk(&s, ROOT_INODE, "g", NewNode::File);
    ok(&s, MetaRequest::Open(Open { ino: g.ino, session, truncate: false, access: OpenAccess::default() }));
    ok(&s, MetaRequest::Open(Open { ino: g.ino, session, truncate: false, access: OpenAccess::default() }));
    ok(&s, MetaRequest::Unlink(Unlink { parent: ROOT_INODE, name: b"g".to_vec() }));
    ok(&s, MetaRequest::Release(Release { ino: g.ino, session }));
    assert_eq!(get(&s, g.ino).nlink, 0);
    ok(&s, MetaRequest::Release(Release { ino: g.ino, session }));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: g.ino })), ErrorCode::NotFound);

    // CreateOpen records the open in the same request.
    let create_open = |name: &str, exclusive, session| {
        let create =
            Create { parent: ROOT_INODE, name: name.into(), node: NewNode::File, mode: 0o644, umask: 0, exclusive };
        MetaRequest::CreateOpen(CreateOpen { create, session, access: OpenAccess { read: true, write: true } })
    };
    let req = |name: &str, exclusive| create_open(name, exclusive, session);
    let c = match ok(&s, req("c", true)) {
        MetaReply::Opened(Opened { attr, extents, .. }) => {
            assert!(extents.is_empty());
            attr
        }
        other => panic!("expected Opened, got {other:?}"),
    };
    commit(&s, c.ino, vec![ext(0, 10, 7, 0)], 10);
    // A non-exclusive create of an existing file opens it with its extents.
    match ok(&s, req("c", false)) {
        MetaReply::Opened(Opened { attr, extents, .. }) => assert_eq!((attr.ino, extents.len()), (c.ino, 1)),
        other => panic!("expected Opened, got {other:?}"),
    }
    assert_eq!(unlinked(&s, ROOT_INODE, "c"), (c.ino, true));
    assert_eq!(err(&s, create_open("i", true, session + 1000)), ErrorCode::SessionUnknown);
    assert_eq!(lookup(&s, ROOT_INODE, "i"), Err(ErrorCode::NotFound), "a refused create leaves no file");

    // Not open: gone at once, with its xattrs and chunk references.
    let h = mk(&s, ROOT_INODE, "h", NewNode::File);
    commit(&s, h.ino, vec![ext(0, 10, 3, 0), ext(10, 10, 8, 0)], 20);
    ok(
        &s,
        MetaRequest::SetXattr(SetXattr {
            ino: h.ino,
            name: b"user.a".to_vec(),
            value: b"1".to_vec(),
            mode: XattrMode::Any,
        }),
    );
    assert_eq!(unlinked(&s, ROOT_INODE, "h"), (h.ino, false));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: h.ino })), ErrorCode::NotFound);
    assert_eq!((refcount(&s, 3), refcount(&s, 8)), (Some(0), Some(0)));

    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    assert_eq!(err(&s, MetaRequest::Unlink(Unlink { parent: ROOT_INODE, name: b"d".to_vec() })), ErrorCode::IsDir);
    assert_eq!(err(&s, MetaRequest::Unlink(Unlink { parent: ROOT_INODE, name: b"zz".to_vec() })), ErrorCode::NotFound);
    assert_eq!(get(&s, d.ino).nlink, 2);
}

/// Conformance case `rmdir`.
pub fn rmdir(b: &dyn Factory) {
    let s = b.open();
    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    let e = mk(&s, d.ino, "e", NewNode::Dir);
    assert_eq!(get(&s, d.ino).nlink, 3);
    mk(&s, e.ino, "f", NewNode::File);
    assert_eq!(err(&s, MetaRequest::Rmdir(Rmdir { parent: d.ino, name: b"e".to_vec() })), ErrorCode::NotEmpty);
    assert_eq!(err(&s, MetaRequest::Rmdir(Rmdir { parent: e.ino, name: b"f".to_vec() })), ErrorCode::NotDir);
    assert_eq!(err(&s, MetaRequest::Rmdir(Rmdir { parent: d.ino, name: b".".to_vec() })), ErrorCode::InvalidArgument);
    assert_eq!(err(&s, MetaRequest::Rmdir(Rmdir { parent: d.ino, name: b"nope".to_vec() })), ErrorCode::NotFound);
    ok(&s, MetaRequest::Unlink(Unlink { parent: e.ino, name: b"f".to_vec() }));
    ok(&s, MetaRequest::Rmdir(Rmdir { parent: d.ino, name: b"e".to_vec() }));
    assert_eq!(get(&s, d.ino).nlink, 2);
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: e.ino })), ErrorCode::NotFound);
    ok(&s, MetaRequest::Rmdir(Rmdir { parent: ROOT_INODE, name: b"d".to_vec() }));
    assert_eq!(get(&s, ROOT_INODE).nlink, 2);
}

fn rename_req(parent: InodeId, name: &str, new_parent: InodeId, new_name: &str, mode: RenameMode) -> MetaRequest {
    MetaRequest::Rename(Rename { parent, name: name.into(), new_parent, new_name: new_name.into(), mode })
}

/// Conformance case `rename_replace`.
pub fn rename_replace(b: &dyn Factory) {
    let s = b.open();
    let a = mk(&s, ROOT_INODE, "a", NewNode::File);
    let t = mk(&s, ROOT_INODE, "t", NewNode::File);
    commit(&s, t.ino, vec![ext(0, 10, 9, 0)], 10);
    let before = get(&s, a.ino).ctime;
    std::thread::sleep(Duration::from_millis(5));
    ok(&s, rename_req(ROOT_INODE, "a", ROOT_INODE, "t", RenameMode::Replace));
    assert_eq!(lookup(&s, ROOT_INODE, "a"), Err(ErrorCode::NotFound));
    assert_eq!(lookup(&s, ROOT_INODE, "t").map(|x| x.ino), Ok(a.ino));
    assert!(get(&s, a.ino).ctime > before);
    assert_eq!(
        err(&s, MetaRequest::GetAttr(GetAttr { ino: t.ino })),
        ErrorCode::NotFound,
        "the replaced inode is gone"
    );
    assert_eq!(refcount(&s, 9), Some(0));
    // Replaced while open: orphan.
    let session = hello(&s);
    let o = mk(&s, ROOT_INODE, "o", NewNode::File);
    ok(&s, MetaRequest::Open(Open { ino: o.ino, session, truncate: false, access: OpenAccess::default() }));
    ok(&s, rename_req(ROOT_INODE, "t", ROOT_INODE, "o", RenameMode::Replace));
    assert_eq!(get(&s, o.ino).nlink, 0);
    ok(&s, MetaRequest::Release(Release { ino: o.ino, session }));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: o.ino })), ErrorCode::NotFound);
    // Hard links of one inode: a no-op.
    ok(&s, MetaRequest::Link(Link { ino: a.ino, new_parent: ROOT_INODE, new_name: b"a2".to_vec() }));
    ok(&s, rename_req(ROOT_INODE, "o", ROOT_INODE, "a2", RenameMode::Replace));
    assert_eq!(lookup(&s, ROOT_INODE, "o").map(|x| x.ino), Ok(a.ino));
    assert_eq!(get(&s, a.ino).nlink, 2);
    // Same name: no-op.
    ok(&s, rename_req(ROOT_INODE, "o", ROOT_INODE, "o", RenameMode::Replace));
    assert_eq!(err(&s, rename_req(ROOT_INODE, "missing", ROOT_INODE, "x", RenameMode::Replace)), ErrorCode::NotFound);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "o", 9999, "x", RenameMode::Replace)), ErrorCode::NotFound);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "o", a.ino, "x", RenameMode::Replace)), ErrorCode::NotDir);
}

/// Conformance case `rename_noreplace_exchange`.
pub fn rename_noreplace_exchange(b: &dyn Factory) {
    let s = b.open();
    let a = mk(&s, ROOT_INODE, "a", NewNode::File);
    let bb = mk(&s, ROOT_INODE, "b", NewNode::File);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "a", ROOT_INODE, "b", RenameMode::NoReplace)), ErrorCode::Exists);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "a", ROOT_INODE, "a", RenameMode::NoReplace)), ErrorCode::Exists);
    ok(&s, rename_req(ROOT_INODE, "a", ROOT_INODE, "c", RenameMode::NoReplace));
    assert_eq!(lookup(&s, ROOT_INODE, "c").map(|x| x.ino), Ok(a.ino));

    ok(&s, rename_req(ROOT_INODE, "c", ROOT_INODE, "b", RenameMode::Exchange));
    assert_eq!(lookup(&s, ROOT_INODE, "c").map(|x| x.ino), Ok(bb.ino));
    assert_eq!(lookup(&s, ROOT_INODE, "b").map(|x| x.ino), Ok(a.ino));
    assert_eq!(get(&s, a.ino).nlink, 1);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "c", ROOT_INODE, "zz", RenameMode::Exchange)), ErrorCode::NotFound);

    // Exchange a directory and a file across parents: link counts follow the directory.
    let p1 = mk(&s, ROOT_INODE, "p1", NewNode::Dir);
    let p2 = mk(&s, ROOT_INODE, "p2", NewNode::Dir);
    let dir = mk(&s, p1.ino, "dir", NewNode::Dir);
    let file = mk(&s, p2.ino, "file", NewNode::File);
    assert_eq!((get(&s, p1.ino).nlink, get(&s, p2.ino).nlink), (3, 2));
    ok(&s, rename_req(p1.ino, "dir", p2.ino, "file", RenameMode::Exchange));
    assert_eq!(lookup(&s, p1.ino, "dir").map(|x| x.ino), Ok(file.ino));
    assert_eq!(lookup(&s, p2.ino, "file").map(|x| x.ino), Ok(dir.ino));
    assert_eq!((get(&s, p1.ino).nlink, get(&s, p2.ino).nlink), (2, 3));
    assert_eq!(lookup(&s, dir.ino, "..").map(|x| x.ino), Ok(p2.ino));
    // Exchanging a directory into its own subtree is refused.
    let inner = mk(&s, dir.ino, "inner", NewNode::File);
    assert_eq!(err(&s, rename_req(p2.ino, "file", dir.ino, "inner", RenameMode::Exchange)), ErrorCode::InvalidArgument);
    assert_eq!(lookup(&s, dir.ino, "inner").map(|x| x.ino), Ok(inner.ino));
}

/// Conformance case `rename_dirs`.
pub fn rename_dirs(b: &dyn Factory) {
    let s = b.open();
    let a = mk(&s, ROOT_INODE, "a", NewNode::Dir);
    let sub = mk(&s, a.ino, "sub", NewNode::Dir);
    let deep = mk(&s, sub.ino, "deep", NewNode::Dir);
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "a", deep.ino, "x", RenameMode::Replace)), ErrorCode::InvalidArgument);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "a", a.ino, "x", RenameMode::Replace)), ErrorCode::InvalidArgument);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "a", ROOT_INODE, "f", RenameMode::Replace)), ErrorCode::NotDir);
    assert_eq!(err(&s, rename_req(ROOT_INODE, "f", ROOT_INODE, "a", RenameMode::Replace)), ErrorCode::IsDir);
    let full = mk(&s, ROOT_INODE, "full", NewNode::Dir);
    mk(&s, full.ino, "x", NewNode::File);
    assert_eq!(err(&s, rename_req(a.ino, "sub", ROOT_INODE, "full", RenameMode::Replace)), ErrorCode::NotEmpty);

    // Move sub from a to root over an empty dir: a loses a link, root nets zero.
    let empty = mk(&s, ROOT_INODE, "empty", NewNode::Dir);
    let root_links = get(&s, ROOT_INODE).nlink;
    ok(&s, rename_req(a.ino, "sub", ROOT_INODE, "empty", RenameMode::Replace));
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: empty.ino })), ErrorCode::NotFound);
    assert_eq!(get(&s, a.ino).nlink, 2);
    assert_eq!(get(&s, ROOT_INODE).nlink, root_links);
    assert_eq!(lookup(&s, sub.ino, "..").map(|x| x.ino), Ok(ROOT_INODE));
    // Now the former ancestor may move below it.
    ok(&s, rename_req(ROOT_INODE, "a", deep.ino, "a", RenameMode::Replace));
    assert_eq!(get(&s, deep.ino).nlink, 3);
    assert_eq!(get(&s, ROOT_INODE).nlink, root_links - 1);
    // A file moving between directories leaves link counts alone.
    ok(&s, rename_req(ROOT_INODE, "f", deep.ino, "f", RenameMode::Replace));
    assert_eq!(get(&s, deep.ino).nlink, 3);
    assert_eq!(get(&s, f.ino).nlink, 1);
}

/// Conformance case `setattr_truncate`.
pub fn setattr_truncate(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    commit(&s, f.ino, vec![ext(0, 100, 1, 0), ext(100, 100, 2, 0)], 200);
    let v0 = get(&s, f.ino).data_version;
    let set = AttrChanges { size: Some(50), ..Default::default() };
    let a = attr(ok(&s, MetaRequest::SetAttr(SetAttr { ino: f.ino, set, session: None })));
    assert_eq!((a.size, a.data_version), (50, v0 + 1));
    assert_eq!(extents(&s, f.ino), vec![(0, 50, 1, 0)]);
    assert_eq!((refcount(&s, 1), refcount(&s, 2)), (Some(1), Some(0)));
    let set = AttrChanges { size: Some(1 << 30), ..Default::default() };
    let a = attr(ok(&s, MetaRequest::SetAttr(SetAttr { ino: f.ino, set, session: None })));
    assert_eq!(a.size, 1 << 30);
    assert_eq!(extents(&s, f.ino), vec![(0, 50, 1, 0)]);

    let when = Timestamp { secs: 1234, nanos: 56 };
    let set = AttrChanges {
        mode: Some(0o104755),
        uid: Some(7),
        gid: Some(8),
        atime: Some(TimeSet::At(when)),
        mtime: Some(TimeSet::Now),
        ..Default::default()
    };
    let a = attr(ok(&s, MetaRequest::SetAttr(SetAttr { ino: f.ino, set, session: None })));
    assert_eq!((a.mode, a.uid, a.gid, a.atime), (0o4755, 7, 8, when));
    assert!(a.mtime > when && a.ctime >= a.mtime);
    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    let set = AttrChanges { size: Some(0), ..Default::default() };
    assert_eq!(err(&s, MetaRequest::SetAttr(SetAttr { ino: d.ino, set, session: None })), ErrorCode::IsDir);
    assert_eq!(
        err(&s, MetaRequest::SetAttr(SetAttr { ino: 9999, set: AttrChanges::default(), session: None })),
        ErrorCode::NotFound
    );
}

/// Conformance case `commit_write_splits`.
pub fn commit_write_splits(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    let a = commit(&s, f.ino, vec![ext(0, 100, 1, 1000)], 100);
    assert_eq!((a.size, a.data_version, a.mtime), (100, 1, Timestamp { secs: 77, nanos: 5 }));
    // Overwriting the middle splits the old extent in two: two rows reference chunk 1.
    commit(&s, f.ino, vec![ext(40, 10, 2, 0)], 50);
    assert_eq!(extents(&s, f.ino), vec![(0, 40, 1, 1000), (40, 10, 2, 0), (50, 50, 1, 1050)]);
    assert_eq!((refcount(&s, 1), refcount(&s, 2)), (Some(2), Some(1)));
    assert_eq!(get(&s, f.ino).size, 100, "min_size never shrinks a file");
    // Later extents in one commit win; one covering several rows removes them all.
    commit(&s, f.ino, vec![ext(30, 40, 3, 0), ext(60, 50, 4, 0)], 110);
    assert_eq!(extents(&s, f.ino), vec![(0, 30, 1, 1000), (30, 30, 3, 0), (60, 50, 4, 0)]);
    assert_eq!(
        (refcount(&s, 1), refcount(&s, 2), refcount(&s, 3), refcount(&s, 4)),
        (Some(1), Some(0), Some(1), Some(1))
    );
    let a = get(&s, f.ino);
    assert_eq!((a.size, a.data_version), (110, 3));
    // The same chunk used by two files counts both.
    let g = mk(&s, ROOT_INODE, "g", NewNode::File);
    commit(&s, g.ino, vec![ext(0, 10, 4, 0)], 10);
    assert_eq!(refcount(&s, 4), Some(2));
    // Within one commit a later extent splits an earlier one of the same commit.
    let h = mk(&s, ROOT_INODE, "h", NewNode::File);
    commit(&s, h.ino, vec![ext(0, 100, 5, 0), ext(20, 10, 6, 0), ext(90, 20, 7, 0), ext(95, 5, 8, 0)], 110);
    assert_eq!(
        extents(&s, h.ino),
        vec![(0, 20, 5, 0), (20, 10, 6, 0), (30, 60, 5, 30), (90, 5, 7, 0), (95, 5, 8, 0), (100, 10, 7, 10)]
    );
    assert_eq!(
        (refcount(&s, 5), refcount(&s, 6), refcount(&s, 7), refcount(&s, 8)),
        (Some(2), Some(1), Some(2), Some(1))
    );
    let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
    assert_eq!(
        err(
            &s,
            MetaRequest::CommitWrite(CommitWrite {
                session: 0,
                ino: d.ino,
                extents: vec![],
                chunks: vec![],
                min_size: 0,
                mtime: Timestamp::now()
            })
        ),
        ErrorCode::IsDir
    );
    assert_eq!(
        err(
            &s,
            MetaRequest::CommitWrite(CommitWrite {
                session: 0,
                ino: g.ino,
                extents: vec![ext(u64::MAX - 5, 10, 1, 0)],
                chunks: vec![],
                min_size: 0,
                mtime: Timestamp::now()
            })
        ),
        ErrorCode::InvalidArgument
    );
    // A failed request leaves nothing behind.
    assert_eq!(refcount(&s, 4), Some(2));
}

/// Conformance case `compact_checks_the_version`.
pub fn compact_checks_the_version(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    commit(&s, f.ino, vec![ext(0, 10, 1, 0), ext(10, 10, 2, 0), ext(20, 10, 3, 0)], 30);
    let before = get(&s, f.ino);
    let merged = StoredChunk { id: cid(9), size: 30, nodes: vec!["n1".into()], receipt: None };
    let compact = |version| {
        MetaRequest::Compact(Compact {
            session: 0,
            ino: f.ino,
            data_version: version,
            extents: vec![ext(0, 30, 9, 0)],
            chunks: vec![merged.clone()],
        })
    };
    // A stale version changes nothing.
    assert_eq!(err(&s, compact(before.data_version - 1)), ErrorCode::Stale);
    assert_eq!(extents(&s, f.ino).len(), 3);
    let after = attr(ok(&s, compact(before.data_version)));
    assert_eq!(extents(&s, f.ino), vec![(0, 30, 9, 0)]);
    assert_eq!((refcount(&s, 1), refcount(&s, 9)), (Some(0), Some(1)));
    // Same bytes: size, times and version are untouched.
    assert_eq!((after.size, after.mtime, after.data_version), (before.size, before.mtime, before.data_version));
    let beyond = MetaRequest::Compact(Compact {
        session: 0,
        ino: f.ino,
        data_version: before.data_version,
        extents: vec![ext(0, 40, 9, 0)],
        chunks: vec![],
    });
    assert_eq!(err(&s, beyond), ErrorCode::InvalidArgument);
}

/// Conformance case `fallocate`.
pub fn fallocate(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    commit(&s, f.ino, vec![ext(0, 100, 1, 0)], 100);
    let fa = |offset, len, mode| {
        attr(ok(&s, MetaRequest::Fallocate(Fallocate { session: 0, ino: f.ino, offset, len, mode })))
    };
    assert_eq!(fa(0, 50, AllocateMode::Extend).size, 100);
    assert_eq!(fa(100, 50, AllocateMode::Extend).size, 150);
    assert_eq!(fa(0, 500, AllocateMode::KeepSize).size, 150);
    let a = fa(20, 10, AllocateMode::PunchHole);
    assert_eq!(a.size, 150);
    assert_eq!(extents(&s, f.ino), vec![(0, 20, 1, 0), (30, 70, 1, 30)]);
    assert_eq!(refcount(&s, 1), Some(2));
    let a = fa(90, 110, AllocateMode::ZeroRange);
    assert_eq!(a.size, 200);
    assert_eq!(extents(&s, f.ino), vec![(0, 20, 1, 0), (30, 60, 1, 30)]);
    assert_eq!(
        err(
            &s,
            MetaRequest::Fallocate(Fallocate {
                session: 0,
                ino: f.ino,
                offset: u64::MAX,
                len: 2,
                mode: AllocateMode::Extend
            })
        ),
        ErrorCode::InvalidArgument
    );
}

/// Conformance case `open_truncate_and_sync`.
pub fn open_truncate_and_sync(b: &dyn Factory) {
    let s = b.open();
    let session = hello(&s);
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    commit(&s, f.ino, vec![ext(0, 100, 1, 0)], 100);
    match ok(&s, MetaRequest::Open(Open { ino: f.ino, session, truncate: false, access: OpenAccess::default() })) {
        MetaReply::Opened(Opened { attr, extents, .. }) => {
            assert_eq!(attr.size, 100);
            assert_eq!(extents, vec![ext(0, 100, 1, 0)]);
        }
        other => panic!("expected Opened, got {other:?}"),
    }
    match ok(&s, MetaRequest::Open(Open { ino: f.ino, session, truncate: true, access: OpenAccess::default() })) {
        MetaReply::Opened(Opened { attr, extents, .. }) => {
            assert_eq!((attr.size, attr.data_version), (0, 2));
            assert!(extents.is_empty());
        }
        other => panic!("expected Opened, got {other:?}"),
    }
    assert_eq!(refcount(&s, 1), Some(0));
    assert_eq!(
        err(
            &s,
            MetaRequest::Open(Open { ino: f.ino, session: 999_999, truncate: false, access: OpenAccess::default() })
        ),
        ErrorCode::SessionUnknown
    );
    assert_eq!(
        err(&s, MetaRequest::Open(Open { ino: 9999, session, truncate: false, access: OpenAccess::default() })),
        ErrorCode::NotFound
    );
    assert_eq!(ok(&s, MetaRequest::SyncAll(SyncAll {})), MetaReply::Done);
}

/// Conformance case `xattrs`.
pub fn xattrs(b: &dyn Factory) {
    let s = b.open();
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    let set = |name: &str, value: &[u8], mode| {
        MetaRequest::SetXattr(SetXattr { ino: f.ino, name: name.into(), value: value.to_vec(), mode })
    };
    assert_eq!(
        err(&s, MetaRequest::GetXattr(GetXattr { ino: f.ino, name: b"user.a".to_vec() })),
        ErrorCode::NoAttribute
    );
    assert_eq!(err(&s, set("user.a", b"1", XattrMode::Replace)), ErrorCode::NoAttribute);
    let bare = mk(&s, ROOT_INODE, "bare", NewNode::File);
    ok(&s, set("user.a", b"1", XattrMode::Create));
    let listed: Vec<(InodeId, bool)> =
        read_all(&s, ROOT_INODE, 10).iter().map(|e| (e.attr.ino, e.has_xattrs)).collect();
    assert!(listed.contains(&(f.ino, true)) && listed.contains(&(bare.ino, false)), "{listed:?}");
    assert_eq!(err(&s, set("user.a", b"2", XattrMode::Create)), ErrorCode::Exists);
    ok(&s, set("user.a", b"2", XattrMode::Replace));
    ok(&s, set("user.b", b"", XattrMode::Any));
    assert_eq!(
        ok(&s, MetaRequest::GetXattr(GetXattr { ino: f.ino, name: b"user.a".to_vec() })),
        MetaReply::Bytes(b"2".to_vec())
    );
    assert_eq!(
        ok(&s, MetaRequest::GetXattr(GetXattr { ino: f.ino, name: b"user.b".to_vec() })),
        MetaReply::Bytes(vec![])
    );
    assert_eq!(
        ok(&s, MetaRequest::ListXattr(ListXattr { ino: f.ino })),
        MetaReply::Names(vec![b"user.a".to_vec(), b"user.b".to_vec()])
    );
    ok(&s, MetaRequest::RemoveXattr(RemoveXattr { ino: f.ino, name: b"user.a".to_vec() }));
    assert_eq!(
        err(&s, MetaRequest::RemoveXattr(RemoveXattr { ino: f.ino, name: b"user.a".to_vec() })),
        ErrorCode::NoAttribute
    );
    assert_eq!(ok(&s, MetaRequest::ListXattr(ListXattr { ino: f.ino })), MetaReply::Names(vec![b"user.b".to_vec()]));
    assert_eq!(err(&s, set("", b"1", XattrMode::Any)), ErrorCode::InvalidArgument);
    assert_eq!(err(&s, set(&"n".repeat(256), b"1", XattrMode::Any)), ErrorCode::Range);
    ok(
        &s,
        MetaRequest::SetXattr(SetXattr {
            ino: f.ino,
            name: b"user.big".to_vec(),
            value: vec![7; 65536],
            mode: XattrMode::Any,
        }),
    );
    assert_eq!(
        err(
            &s,
            MetaRequest::SetXattr(SetXattr {
                ino: f.ino,
                name: b"user.big".to_vec(),
                value: vec![7; 65537],
                mode: XattrMode::Any
            })
        ),
        ErrorCode::InvalidArgument
    );
    assert_eq!(err(&s, MetaRequest::ListXattr(ListXattr { ino: 9999 })), ErrorCode::NotFound);
}

fn read_all(s: &Arc<MetaService>, dir: InodeId, limit: u32) -> Vec<DirEntry> {
    let mut out: Vec<DirEntry> = Vec::new();
    let mut after = 0;
    loop {
        let page = match ok(s, MetaRequest::ReadDir(ReadDir { ino: dir, after, limit })) {
            MetaReply::Entries(e) => e,
            other => panic!("expected Entries, got {other:?}"),
        };
        assert!(page.len() <= limit as usize);
        let Some(last) = page.last() else { break };
        after = last.cookie;
        out.extend(page);
    }
    out
}

/// Conformance case `readdir_paging`.
pub fn readdir_paging(b: &dyn Factory) {
    let s = b.open();
    let d = mk(&s, ROOT_INODE, "big", NewNode::Dir);
    for i in 0..1000 {
        mk(&s, d.ino, &format!("f{i:04}"), NewNode::File);
    }
    let all = read_all(&s, d.ino, 97);
    assert_eq!(all.len(), 1000);
    assert!(all.windows(2).all(|w| w[0].cookie < w[1].cookie && w[0].cookie > 0));
    let mut names: Vec<_> = all.iter().map(|e| e.name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 1000);
    assert!(all.iter().all(|e| e.attr.kind == FileKind::File && e.attr.nlink == 1));
    assert!(!names.iter().any(|n| n == b"." || n == b".."));
    // Entries removed mid-listing vanish; the others keep their cookies.
    let first = match ok(&s, MetaRequest::ReadDir(ReadDir { ino: d.ino, after: 0, limit: 10 })) {
        MetaReply::Entries(e) => e,
        other => panic!("expected Entries, got {other:?}"),
    };
    ok(&s, MetaRequest::Unlink(Unlink { parent: d.ino, name: all[10].name.clone() }));
    let rest = read_all(&s, d.ino, 500);
    assert_eq!(rest.len(), 999);
    assert_eq!(rest[..10], first[..]);
    assert_eq!(err(&s, MetaRequest::ReadDir(ReadDir { ino: all[0].attr.ino, after: 0, limit: 10 })), ErrorCode::NotDir);
    assert_eq!(read_all(&s, mk(&s, ROOT_INODE, "empty", NewNode::Dir).ino, 10).len(), 0);
}

/// Conformance case `persistence`.
pub fn persistence(b: &dyn Factory) {
    let (f, d) = {
        let s = b.open();
        let d = mk(&s, ROOT_INODE, "d", NewNode::Dir);
        let f = mk(&s, d.ino, "f", NewNode::File);
        commit(&s, f.ino, vec![ext(0, 10, 1, 0)], 10);
        ok(
            &s,
            MetaRequest::SetXattr(SetXattr {
                ino: f.ino,
                name: b"user.k".to_vec(),
                value: b"v".to_vec(),
                mode: XattrMode::Any,
            }),
        );
        (f, d)
    };
    let s = b.open();
    assert_eq!(lookup(&s, ROOT_INODE, "d").map(|a| a.ino), Ok(d.ino));
    let f2 = lookup(&s, d.ino, "f").expect("file survives reopen");
    assert_eq!((f2.ino, f2.size, f2.data_version), (f.ino, 10, 1));
    assert_eq!(extents(&s, f.ino), vec![(0, 10, 1, 0)]);
    assert_eq!(refcount(&s, 1), Some(1));
    assert_eq!(
        ok(&s, MetaRequest::GetXattr(GetXattr { ino: f.ino, name: b"user.k".to_vec() })),
        MetaReply::Bytes(b"v".to_vec())
    );
    let g = mk(&s, d.ino, "g", NewNode::File);
    assert!(g.ino > f.ino, "inode numbers are never reused");
}

fn node(id: &str, addr: &str, capacity: u64, used: u64) -> NodeInfo {
    NodeInfo {
        id: id.into(),
        store_id: format!("store-of-{addr}"),
        site: "s1".into(),
        addr: addr.into(),
        capacity_bytes: capacity,
        used_bytes: used,
        chunk_count: 3,
        last_seen_secs: 99,
        site_rtts: vec![("s2".into(), 50_000)],
        cache_bytes: 0,
        drained: false,
    }
}

/// Conformance case `nodes`.
pub fn nodes(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1", "n2"]);
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 100), cluster_id: None }));
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n2", "10.0.0.2:7000", 2000, 300), cluster_id: None }));
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 150), cluster_id: None }));
    let e = call(
        &s,
        MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.9:7000", 1000, 150), cluster_id: None }),
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Exists);
    assert!(e.message.contains("claim id n1"), "{}", e.message);
    // The same store restarted on a new address takes its id over at once.
    let restarted = NodeInfo { addr: "10.0.0.1:7001".into(), ..node("n1", "10.0.0.1:7000", 1000, 150) };
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: restarted, cluster_id: None }));
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 150), cluster_id: None }));
    match ok(&s, MetaRequest::ListNodes(ListNodes {})) {
        MetaReply::Nodes(n) => {
            assert_eq!(n.len(), 2);
            assert_eq!(
                (n[0].id.as_str(), n[0].addr.as_str(), n[0].used_bytes, n[0].last_seen_secs),
                ("n1", "10.0.0.1:7000", 150, 0)
            );
        }
        other => panic!("expected Nodes, got {other:?}"),
    }
    mk(&s, ROOT_INODE, "f", NewNode::File);
    assert_eq!(
        ok(&s, MetaRequest::StatFs(StatFs {})),
        MetaReply::StatFs(FsStats { capacity_bytes: 3000, used_bytes: 450, inodes: 2 })
    );
}

/// Conformance case `sessions`.
pub fn sessions(b: &dyn Factory) {
    let s = b.open();
    let info = SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "status".into() };
    let e = call(&s, MetaRequest::Hello(Hello { protocol: proto::PROTOCOL_VERSION + 1, session: info })).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("protocol"), "{}", e.message);
    let a = hello(&s);
    let b2 = hello(&s);
    assert_ne!(a, b2);
    ok(&s, MetaRequest::Heartbeat(Heartbeat { session: a }));
    match ok(&s, MetaRequest::Status(Status {})) {
        MetaReply::Status(st) => {
            assert_eq!(st.sessions.len(), 2);
            assert_eq!(st.sessions[0].0, a);
            assert_eq!(st.sessions[0].1.purpose, "/mnt");
            assert_eq!(st.inodes, 1);
        }
        other => panic!("expected Status, got {other:?}"),
    }
    ok(&s, MetaRequest::Goodbye(Goodbye { session: a }));
    assert_eq!(err(&s, MetaRequest::Heartbeat(Heartbeat { session: a })), ErrorCode::SessionUnknown);
    ok(&s, MetaRequest::Heartbeat(Heartbeat { session: b2 }));
}

fn lock(ino: InodeId, owner: u64, start: u64, end: u64, kind: LockKind) -> LockRange {
    LockRange { ino, owner, start, end, kind, pid: 42 }
}

/// Conformance case `session_expiry`.
pub fn session_expiry(b: &dyn Factory) {
    let s = b.open();
    let old = hello(&s);
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    commit(&s, f.ino, vec![ext(0, 10, 5, 0)], 10);
    ok(&s, MetaRequest::Open(Open { ino: f.ino, session: old, truncate: false, access: OpenAccess::default() }));
    ok(&s, MetaRequest::SetLock(SetLock { session: old, lock: lock(f.ino, 1, 0, 99, LockKind::Write) }));
    ok(&s, MetaRequest::Unlink(Unlink { parent: ROOT_INODE, name: b"f".to_vec() }));
    let now_ms = Timestamp::now().secs * 1000;
    // Still fresh: nothing expires.
    assert!(s.expire_sessions_at(now_ms).unwrap().is_empty());
    let young = hello(&s);
    assert_eq!(
        err(&s, MetaRequest::SetLock(SetLock { session: young, lock: lock(f.ino, 1, 50, 60, LockKind::Read) })),
        ErrorCode::WouldBlock
    );
    // 40 s later (expiry is 30 s) both are silent; heartbeat only the young one first.
    let later = now_ms + 40_000;
    let expired = s.expire_sessions_at(later - 20_000).unwrap();
    assert!(expired.is_empty());
    let expired = s.expire_sessions_at(later).unwrap();
    assert!(expired.contains(&old) && expired.contains(&young));
    let fresh = hello(&s);
    // The orphan went with the expired sessions' opens, so there is nothing left to lock.
    let relock = MetaRequest::SetLock(SetLock { session: fresh, lock: lock(f.ino, 1, 0, 99, LockKind::Write) });
    assert_eq!(err(&s, relock), ErrorCode::NotFound);
    assert_eq!(err(&s, MetaRequest::Heartbeat(Heartbeat { session: old })), ErrorCode::SessionUnknown);
    assert_eq!(err(&s, MetaRequest::GetAttr(GetAttr { ino: f.ino })), ErrorCode::NotFound, "the orphan is reclaimed");
    assert_eq!(refcount(&s, 5), Some(0));
}

/// Conformance case `opens_and_locks_survive_a_restart`: open-file records and
/// byte-range locks are rows of the store, so a restart of meta keeps an unlinked but
/// open file and a held lock; the session's end releases both.
pub fn opens_and_locks_survive_a_restart(b: &dyn Factory) {
    let (session, f) = {
        let s = b.open();
        let session = hello(&s);
        let f = mk(&s, ROOT_INODE, "f", NewNode::File);
        commit(&s, f.ino, vec![ext(0, 10, 6, 0)], 10);
        ok(&s, MetaRequest::Open(Open { ino: f.ino, session, truncate: false, access: OpenAccess::default() }));
        ok(&s, MetaRequest::Open(Open { ino: f.ino, session, truncate: false, access: OpenAccess::default() }));
        ok(&s, MetaRequest::SetLock(SetLock { session, lock: lock(f.ino, 1, 0, u64::MAX, LockKind::Write) }));
        ok(&s, MetaRequest::Unlink(Unlink { parent: ROOT_INODE, name: b"f".to_vec() }));
        (session, f)
    };
    // Meta restarts.
    let s = b.open();
    let now_ms = Timestamp::now().secs * 1000;
    s.expire_sessions_at(now_ms).unwrap();
    assert_eq!(get(&s, f.ino).nlink, 0, "the orphan is kept for its opener across the restart");
    let other = hello(&s);
    assert_eq!(
        err(&s, MetaRequest::SetLock(SetLock { session: other, lock: lock(f.ino, 9, 5, 5, LockKind::Read) })),
        ErrorCode::WouldBlock,
        "the lock is still held after the restart"
    );
    match ok(&s, MetaRequest::GetLock(GetLock { session: other, lock: lock(f.ino, 9, 0, 0, LockKind::Read) })) {
        MetaReply::Lock(Some(l)) => assert_eq!((l.start, l.end, l.kind), (0, u64::MAX, LockKind::Write)),
        other => panic!("expected the held lock, got {other:?}"),
    }
    ok(&s, MetaRequest::Release(Release { session, ino: f.ino }));
    assert_eq!(get(&s, f.ino).nlink, 0, "one of two opens remains");
    ok(&s, MetaRequest::Release(Release { session, ino: f.ino }));
    assert_eq!(
        err(&s, MetaRequest::GetAttr(GetAttr { ino: f.ino })),
        ErrorCode::NotFound,
        "the last close reclaims it"
    );
    assert_eq!(refcount(&s, 6), Some(0));
    // The session's expiry drops its lock.
    ok(&s, MetaRequest::Heartbeat(Heartbeat { session: other }));
    let g = mk(&s, ROOT_INODE, "g", NewNode::File);
    ok(&s, MetaRequest::SetLock(SetLock { session, lock: lock(g.ino, 1, 0, 9, LockKind::Write) }));
    let expired = s.expire_sessions_at(now_ms + 31_000).unwrap();
    assert!(expired.contains(&session), "{expired:?}");
    let fresh = hello(&s);
    ok(&s, MetaRequest::SetLock(SetLock { session: fresh, lock: lock(g.ino, 2, 0, 9, LockKind::Write) }));
}

/// Conformance case `locks`.
pub fn locks(b: &dyn Factory) {
    let s = b.open();
    let (a, c) = (hello(&s), hello(&s));
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    ok(&s, MetaRequest::SetLock(SetLock { session: a, lock: lock(f.ino, 1, 0, 9, LockKind::Read) }));
    ok(&s, MetaRequest::SetLock(SetLock { session: c, lock: lock(f.ino, 1, 5, 20, LockKind::Read) }));
    assert_eq!(
        err(&s, MetaRequest::SetLock(SetLock { session: c, lock: lock(f.ino, 1, 0, 0, LockKind::Write) })),
        ErrorCode::WouldBlock
    );
    match ok(&s, MetaRequest::GetLock(GetLock { session: c, lock: lock(f.ino, 1, 0, u64::MAX, LockKind::Write) })) {
        MetaReply::Lock(Some(l)) => {
            assert_eq!((l.start, l.end, l.kind, l.pid), (0, 9, LockKind::Read, 42))
        }
        other => panic!("expected a conflicting lock, got {other:?}"),
    }
    assert_eq!(
        ok(&s, MetaRequest::GetLock(GetLock { session: c, lock: lock(f.ino, 1, 10, 30, LockKind::Write) })),
        MetaReply::Lock(None)
    );
    ok(&s, MetaRequest::ReleaseLocks(ReleaseLocks { session: a, ino: f.ino, owner: 1 }));
    ok(&s, MetaRequest::SetLock(SetLock { session: c, lock: lock(f.ino, 1, 0, 0, LockKind::Write) }));
    ok(&s, MetaRequest::SetLock(SetLock { session: c, lock: lock(f.ino, 1, 0, u64::MAX, LockKind::Unlock) }));
    ok(&s, MetaRequest::SetLock(SetLock { session: a, lock: lock(f.ino, 2, 0, u64::MAX, LockKind::Write) }));
    assert_eq!(
        err(&s, MetaRequest::SetLock(SetLock { session: a, lock: lock(f.ino, 2, 9, 3, LockKind::Write) })),
        ErrorCode::InvalidArgument
    );
    // Goodbye drops the session's locks.
    ok(&s, MetaRequest::Goodbye(Goodbye { session: a }));
    ok(&s, MetaRequest::SetLock(SetLock { session: c, lock: lock(f.ino, 1, 0, 5, LockKind::Write) }));
}

/// Conformance case `chunk_catalogue`.
pub fn chunk_catalogue(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1", "n2", "n3", "b1"]);
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    let g = mk(&s, ROOT_INODE, "g", NewNode::File);
    let chunks = vec![StoredChunk { id: cid(1), size: 100, nodes: vec!["n1".into(), "n2".into()], receipt: None }];
    ok(
        &s,
        MetaRequest::CommitWrite(CommitWrite {
            session: 0,
            ino: f.ino,
            extents: vec![ext(0, 100, 1, 0)],
            chunks,
            min_size: 100,
            mtime: Timestamp::now(),
        }),
    );
    for tag in 2..=6 {
        commit(&s, g.ino, vec![ext(u64::from(tag) * 10, 10, tag, 0)], 0);
    }
    // Locations accumulate across reports.
    let chunks = vec![StoredChunk { id: cid(1), size: 100, nodes: vec!["n3".into()], receipt: None }];
    ok(
        &s,
        MetaRequest::CommitWrite(CommitWrite {
            session: 0,
            ino: f.ino,
            extents: vec![],
            chunks,
            min_size: 0,
            mtime: Timestamp::now(),
        }),
    );
    match ok(&s, MetaRequest::ChunkLocations(ChunkLocations { ids: vec![cid(1), cid(99)], caps: Vec::new() })) {
        MetaReply::Chunks(c) => {
            assert_eq!(c.len(), 1);
            assert_eq!((c[0].size, c[0].refcount), (100, 1));
            assert_eq!(c[0].nodes, vec!["n1".to_string(), "n2".into(), "n3".into()]);
        }
        other => panic!("expected Chunks, got {other:?}"),
    }
    // Site caches report the copies they gain and lose; a cached copy is readable
    // but marked as such, and a cache's removal never takes a replica.
    let locations = |s: &Arc<MetaService>| match ok(
        s,
        MetaRequest::ChunkLocations(ChunkLocations { ids: vec![cid(1)], caps: Vec::new() }),
    ) {
        MetaReply::Chunks(c) => {
            assert_eq!(c[0].refcount, 1, "a cached copy is not a reference");
            (c[0].nodes.clone(), c[0].cached.clone())
        }
        other => panic!("expected Chunks, got {other:?}"),
    };
    // A node's cache gains (`true`) or loses a copy; a node reports a replica on another.
    let cache = |node: &str, gained: bool| {
        let (added, removed) = if gained {
            (vec![StoredChunk { id: cid(1), size: 100, nodes: vec![], receipt: None }], vec![])
        } else {
            (vec![], vec![cid(1)])
        };
        MetaRequest::UpdateLocations(UpdateLocations { node: node.into(), added, removed })
    };
    let replica = |by: &str, on: &str| {
        let added = vec![StoredChunk { id: cid(1), size: 100, nodes: vec![on.into()], receipt: None }];
        MetaRequest::UpdateLocations(UpdateLocations { node: by.into(), added, removed: vec![] })
    };
    ok(&s, cache("b1", true));
    ok(&s, cache("n2", false));
    let names = |v: &[&str]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(locations(&s), (names(&["b1", "n1", "n2", "n3"]), names(&["b1"])), "n2's replica stays");
    // A cache report on a replica's node leaves it a replica.
    ok(&s, cache("n3", true));
    assert_eq!(locations(&s), (names(&["b1", "n1", "n2", "n3"]), names(&["b1"])));
    // Evicted from b1's cache: gone. Cached again, then made a replica there: a later
    // eviction report does not take it.
    ok(&s, cache("b1", false));
    assert_eq!(locations(&s), (names(&["n1", "n2", "n3"]), vec![]));
    ok(&s, cache("b1", true));
    ok(&s, replica("n1", "b1"));
    ok(&s, cache("b1", false));
    assert_eq!(locations(&s), (names(&["b1", "n1", "n2", "n3"]), vec![]), "b1 holds a replica now");
    // Paging the catalogue by id.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = match ok(&s, MetaRequest::ListChunks(ListChunks { after, limit: 2 })) {
            MetaReply::Chunks(c) => c,
            other => panic!("expected Chunks, got {other:?}"),
        };
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        seen.extend(page.iter().map(|c| c.id.0[0]));
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5, 6]);
    // Paging extents by (inode, offset).
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = match ok(&s, MetaRequest::ListExtents(ListExtents { after, limit: 4 })) {
            MetaReply::Extents(e) => e,
            other => panic!("expected Extents, got {other:?}"),
        };
        let Some((ino, e)) = page.last() else { break };
        after = Some((*ino, e.file_offset));
        seen.extend(page.iter().map(|(i, e)| (*i, e.file_offset)));
    }
    assert_eq!(seen, vec![(f.ino, 0), (g.ino, 20), (g.ino, 30), (g.ino, 40), (g.ino, 50), (g.ino, 60)]);
    // Gc: punch chunk 2 out; it and an unknown id are unreferenced, chunk 1 is not.
    ok(
        &s,
        MetaRequest::Fallocate(Fallocate {
            session: 0,
            ino: g.ino,
            offset: 20,
            len: 10,
            mode: AllocateMode::PunchHole,
        }),
    );
    assert_eq!(
        ok(&s, MetaRequest::Unreferenced(Unreferenced { ids: vec![cid(1), cid(2), cid(99)] })),
        MetaReply::Garbage(Garbage { ids: vec![cid(2), cid(99)], epoch: 1 })
    );
    ok(&s, MetaRequest::ForgetChunks(ForgetChunks { ids: vec![cid(1), cid(2)] }));
    assert_eq!(refcount(&s, 2), None);
    assert_eq!(refcount(&s, 1), Some(1), "referenced chunks are never forgotten");
    match ok(&s, MetaRequest::Status(Status {})) {
        MetaReply::Status(st) => assert_eq!((st.chunks, st.chunk_bytes), (5, 100 + 4 * (1 << 20))),
        other => panic!("expected Status, got {other:?}"),
    }
}

/// Conformance case `site_round_trips`.
pub fn site_round_trips(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1", "n9"]);
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 100), cluster_id: None }));
    let mut far = node("n9", "10.0.0.9:7000", 1000, 100);
    far.site = "s2".into();
    far.site_rtts = vec![("s1".into(), 51_000)];
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: far, cluster_id: None }));
    match ok(&s, MetaRequest::Status(Status {})) {
        MetaReply::Status(st) => assert_eq!(
            st.site_rtts,
            vec![("s1".to_string(), "s2".to_string(), 50_000), ("s2".into(), "s1".into(), 51_000)]
        ),
        other => panic!("expected Status, got {other:?}"),
    }
}

/// Conformance case `cluster_identity`.
pub fn cluster_identity(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1"]);
    let id = match ok(
        &s,
        MetaRequest::Hello(Hello {
            protocol: proto::PROTOCOL_VERSION,
            session: SessionInfo { site: "a".into(), host: "h".into(), pid: 1, purpose: "id".into() },
        }),
    ) {
        MetaReply::Welcome(Welcome { cluster_id, .. }) => cluster_id,
        other => panic!("expected Welcome, got {other:?}"),
    };
    assert_eq!(id.len(), 32, "128 random bits in hex: {id}");
    let first =
        MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 100), cluster_id: None });
    assert_eq!(ok(&s, first), MetaReply::Registered(Registered { cluster_id: id.clone(), cap_key: None, epoch: 1 }));
    let again = MetaRequest::RegisterNode(RegisterNode {
        node: node("n1", "10.0.0.1:7000", 1000, 100),
        cluster_id: Some(id.clone()),
    });
    assert_eq!(ok(&s, again), MetaReply::Registered(Registered { cluster_id: id.clone(), cap_key: None, epoch: 1 }));
    let foreign = MetaRequest::RegisterNode(RegisterNode {
        node: node("n2", "10.0.0.2:7000", 1000, 100),
        cluster_id: Some("f".repeat(32)),
    });
    let e = call(&s, foreign).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPermitted);
    assert!(e.message.contains(&"f".repeat(32)) && e.message.contains(&id), "{}", e.message);
    drop(s);
    assert_eq!(b.open().cluster_id(), id, "the id is kept across restarts");
}

/// Conformance case `permissions`: meta refuses, on the caller's credentials, what
/// POSIX refuses, whatever the client's kernel checked.
pub fn permissions(b: &dyn Factory) {
    use ErrorCode::{InvalidArgument, NoAttribute, NotPermitted, PermissionDenied, Unsupported};
    let s = b.open();
    let alice = Caller { uid: 1001, gid: 1001, groups: vec![50] };
    let bob = Caller::new(1002, 1002);
    let chown = |uid: u32, gid: u32| AttrChanges { uid: Some(uid), gid: Some(gid), ..Default::default() };
    let set = |ino, set| MetaRequest::SetAttr(SetAttr { ino, set, session: None });
    let chmod = |ino, mode| set(ino, AttrChanges { mode: Some(mode), ..Default::default() });
    // A 0700 home of alice's with a 0600 secret in it.
    let home = mk(&s, ROOT_INODE, "home", NewNode::Dir);
    ok(&s, set(home.ino, chown(1001, 1001)));
    ok(&s, chmod(home.ino, 0o700));
    let secret = attr(as_user(&s, &alice, create_req(home.ino, "secret", NewNode::File, 0o600)).unwrap());
    assert_eq!((secret.uid, secret.gid), (1001, 1001));
    let lookup_req = |parent, name: &str| MetaRequest::Lookup(Lookup { parent, name: name.into() });
    assert!(as_user(&s, &alice, lookup_req(home.ino, "secret")).is_ok());
    assert_eq!(as_user(&s, &bob, lookup_req(home.ino, "secret")), Err(PermissionDenied), "search in a 0700 dir");
    let list = MetaRequest::ReadDir(ReadDir { ino: home.ino, after: 0, limit: 10 });
    assert_eq!(as_user(&s, &bob, list), Err(PermissionDenied));
    assert_eq!(as_user(&s, &bob, create_req(home.ino, "mine", NewNode::File, 0o644)), Err(PermissionDenied));
    // Knowing the inode number is not enough to read it.
    let session = hello(&s);
    let open = |ino, read, write| {
        MetaRequest::Open(Open { ino, session, truncate: false, access: OpenAccess { read, write } })
    };
    assert_eq!(as_user(&s, &bob, open(secret.ino, true, false)), Err(PermissionDenied));
    assert_eq!(as_user(&s, &bob, MetaRequest::Extents(Extents { ino: secret.ino })), Err(PermissionDenied));
    assert!(as_user(&s, &alice, open(secret.ino, true, false)).is_ok());
    // Nor to write it: a commit needs write permission or an open for writing.
    let write = |ino, session| {
        MetaRequest::CommitWrite(CommitWrite {
            ino,
            session,
            extents: vec![ext(0, 10, 9, 0)],
            chunks: vec![StoredChunk { id: cid(9), size: 10, nodes: vec!["n1".into()], receipt: None }],
            min_size: 10,
            mtime: Timestamp { secs: 1, nanos: 0 },
        })
    };
    assert_eq!(as_user(&s, &bob, write(secret.ino, session)), Err(PermissionDenied));
    let falloc =
        MetaRequest::Fallocate(Fallocate { ino: secret.ino, session, offset: 0, len: 9, mode: AllocateMode::Extend });
    assert_eq!(as_user(&s, &bob, falloc), Err(PermissionDenied));
    let truncate = set(secret.ino, AttrChanges { size: Some(0), ..Default::default() });
    assert_eq!(as_user(&s, &bob, truncate), Err(PermissionDenied));
    // Alice opens it for writing, then makes it read-only: her open still writes.
    assert!(as_user(&s, &alice, open(secret.ino, false, true)).is_ok());
    assert!(as_user(&s, &alice, chmod(secret.ino, 0o400)).is_ok());
    assert!(as_user(&s, &alice, write(secret.ino, session)).is_ok());
    let trunc = |session| {
        let set = AttrChanges { size: Some(3), ..Default::default() };
        MetaRequest::SetAttr(SetAttr { ino: secret.ino, set, session })
    };
    assert!(as_user(&s, &alice, trunc(Some(session))).is_ok(), "ftruncate through her open");
    assert_eq!(as_user(&s, &alice, trunc(None)), Err(PermissionDenied), "truncate by name needs write permission");
    let other = hello(&s);
    assert_eq!(as_user(&s, &alice, write(secret.ino, other)), Err(PermissionDenied), "only that session");
    assert_eq!(as_user(&s, &alice, open(secret.ino, false, true)), Err(PermissionDenied));
    // A new file's creator may write it whatever its mode.
    let create =
        Create { parent: home.ino, name: b"ro".to_vec(), node: NewNode::File, mode: 0o400, umask: 0, exclusive: true };
    let access = OpenAccess { read: false, write: true };
    let ro = match as_user(&s, &alice, MetaRequest::CreateOpen(CreateOpen { create, session: other, access })) {
        Ok(MetaReply::Opened(o)) => o.attr,
        other => panic!("{other:?}"),
    };
    assert!(as_user(&s, &alice, write(ro.ino, other)).is_ok());

    // From here on bob may search alice's home (0711): the file's own rules answer.
    ok(&s, chmod(home.ino, 0o711));
    // chmod and chown belong to the owner (and root).
    assert_eq!(as_user(&s, &bob, chmod(secret.ino, 0o4777)), Err(NotPermitted), "setuid by a stranger");
    assert_eq!(as_user(&s, &bob, set(secret.ino, chown(1002, 1002))), Err(NotPermitted));
    assert_eq!(as_user(&s, &alice, set(secret.ino, chown(1002, 1001))), Err(NotPermitted), "give away");
    assert_eq!(as_user(&s, &alice, set(secret.ino, chown(1001, 77))), Err(NotPermitted), "foreign group");
    let a = attr(as_user(&s, &alice, set(secret.ino, chown(1001, 50))).unwrap());
    assert_eq!(a.gid, 50, "to a supplementary group");
    ok(&s, set(secret.ino, chown(1001, 7)));
    let a = attr(as_user(&s, &alice, chmod(secret.ino, 0o2755)).unwrap());
    assert_eq!(a.mode, 0o755, "setgid dropped for a group alice is not in");
    let a = attr(as_user(&s, &alice, chmod(secret.ino, 0o4755)).unwrap());
    assert_eq!(a.mode, 0o4755);
    // A writer may only clear setuid/setgid (the kernel does that on a write).
    let shared = mk(&s, ROOT_INODE, "shared", NewNode::File);
    ok(&s, set(shared.ino, chown(1001, 1001)));
    ok(&s, chmod(shared.ino, 0o6666));
    assert_eq!(as_user(&s, &bob, chmod(shared.ino, 0o6777)), Err(NotPermitted));
    assert_eq!(attr(as_user(&s, &bob, chmod(shared.ino, 0o0666)).unwrap()).mode, 0o666);
    // Times: explicit ones by the owner only, "now" by any writer.
    let times = |t| set(shared.ino, AttrChanges { atime: Some(t), mtime: Some(t), ..Default::default() });
    assert_eq!(as_user(&s, &bob, times(TimeSet::At(Timestamp { secs: 5, nanos: 0 }))), Err(NotPermitted));
    assert!(as_user(&s, &bob, times(TimeSet::Now)).is_ok());
    ok(&s, chmod(shared.ino, 0o644));
    assert_eq!(as_user(&s, &bob, times(TimeSet::Now)), Err(PermissionDenied));

    // The sticky bit: only the owner of the file or the directory removes or renames.
    let tmp = attr(ok(&s, create_req(ROOT_INODE, "tmp", NewNode::Dir, 0o1777)));
    let f = attr(as_user(&s, &alice, create_req(tmp.ino, "f", NewNode::File, 0o666)).unwrap());
    assert_eq!(f.uid, 1001);
    let unlink = |name: &str| MetaRequest::Unlink(Unlink { parent: tmp.ino, name: name.into() });
    assert_eq!(as_user(&s, &bob, unlink("f")), Err(NotPermitted));
    let rename = rename_req(tmp.ino, "f", tmp.ino, "g", RenameMode::Replace);
    assert_eq!(as_user(&s, &bob, rename), Err(NotPermitted));
    let bobs = attr(as_user(&s, &bob, create_req(tmp.ino, "b", NewNode::File, 0o666)).unwrap());
    let over = rename_req(tmp.ino, "b", tmp.ino, "f", RenameMode::Replace);
    assert_eq!(as_user(&s, &bob, over), Err(NotPermitted), "replacing alice's file");
    assert!(as_user(&s, &bob, unlink("b")).is_ok());
    assert!(as_user(&s, &alice, unlink("f")).is_ok());
    assert_eq!(lookup(&s, tmp.ino, "b"), Err(ErrorCode::NotFound));
    assert_eq!(bobs.uid, 1002);
    // Moving a directory to another parent needs write permission on it (its `..`).
    let d = attr(as_user(&s, &alice, create_req(tmp.ino, "d", NewNode::Dir, 0o555)).unwrap());
    let open_dir = attr(ok(&s, create_req(ROOT_INODE, "pub", NewNode::Dir, 0o777)));
    let away = rename_req(tmp.ino, "d", open_dir.ino, "d", RenameMode::Replace);
    assert_eq!(as_user(&s, &alice, away.clone()), Err(PermissionDenied));
    ok(&s, chmod(d.ino, 0o755));
    assert!(as_user(&s, &alice, away).is_ok());

    // Extended attribute namespaces.
    let setx = |ino, name: &str| {
        MetaRequest::SetXattr(SetXattr { ino, name: name.into(), value: b"v".to_vec(), mode: XattrMode::Any })
    };
    let getx = |ino, name: &str| MetaRequest::GetXattr(GetXattr { ino, name: name.into() });
    assert_eq!(as_user(&s, &bob, setx(shared.ino, "trusted.t")), Err(NotPermitted));
    ok(&s, setx(shared.ino, "trusted.t"));
    assert_eq!(as_user(&s, &bob, getx(shared.ino, "trusted.t")), Err(NoAttribute), "hidden from non-root");
    assert_eq!(as_user(&s, &bob, MetaRequest::ListXattr(ListXattr { ino: shared.ino })), Ok(MetaReply::Names(vec![])));
    assert_eq!(as_user(&s, &alice, setx(shared.ino, "security.x")), Err(NotPermitted));
    // ACLs are the owner's and must be valid (the `acls` case has the rest); unknown
    // namespaces are refused as on Linux.
    assert_eq!(as_user(&s, &bob, setx(shared.ino, "system.posix_acl_access")), Err(NotPermitted));
    assert_eq!(as_user(&s, &alice, setx(shared.ino, "system.posix_acl_access")), Err(InvalidArgument));
    assert_eq!(as_user(&s, &alice, setx(shared.ino, "system.other")), Err(Unsupported));
    assert_eq!(as_user(&s, &alice, setx(shared.ino, "weird.ns")), Err(Unsupported));
    assert_eq!(as_user(&s, &alice, getx(shared.ino, "weird.ns")), Err(Unsupported));
    assert_eq!(as_user(&s, &bob, getx(shared.ino, "system.posix_acl_access")), Err(NoAttribute));
    assert_eq!(as_user(&s, &bob, setx(shared.ino, "user.u")), Err(PermissionDenied));
    assert!(as_user(&s, &alice, setx(shared.ino, "user.u")).is_ok());
    assert!(as_user(&s, &bob, getx(shared.ino, "user.u")).is_ok());
    assert_eq!(as_user(&s, &bob, getx(home.ino, "user.u")), Err(PermissionDenied));
    let rm = MetaRequest::RemoveXattr(RemoveXattr { ino: shared.ino, name: b"user.u".to_vec() });
    assert_eq!(as_user(&s, &bob, rm), Err(PermissionDenied));

    // Catalogue maintenance and node registration are not for users.
    let list = MetaRequest::ListChunks(ListChunks { after: None, limit: 10 });
    assert_eq!(as_user(&s, &bob, list), Err(NotPermitted));
    assert_eq!(as_user(&s, &bob, MetaRequest::ForgetChunks(ForgetChunks { ids: vec![cid(9)] })), Err(NotPermitted));
    let short = MetaRequest::UnderReplicated(UnderReplicated { node: None, after: None, limit: 10 });
    assert_eq!(as_user(&s, &bob, short), Err(NotPermitted));
    let drain = MetaRequest::DrainNode(DrainNode { node: "n1".into(), drained: true });
    assert_eq!(as_user(&s, &bob, drain), Err(NotPermitted));
    let policy = Some(proto::policy::Policy::default());
    assert_eq!(as_user(&s, &bob, MetaRequest::SetPolicy(SetPolicy { ino: home.ino, policy })), Err(NotPermitted));
    let register =
        MetaRequest::RegisterNode(RegisterNode { node: node("rogue", "127.0.0.1:1", 1, 0), cluster_id: None });
    assert_eq!(as_user(&s, &bob, register), Err(NotPermitted));
}

fn policy(sites: &[&str], copies: u32, mode: proto::policy::ReplicationMode) -> proto::policy::Policy {
    proto::policy::Policy { sites: sites.iter().map(|s| s.to_string()).collect(), copies, mode, rpo_secs: 30 }
}

#[track_caller]
fn effective(s: &Arc<MetaService>, ino: InodeId) -> proto::policy::EffectivePolicy {
    match ok(s, MetaRequest::GetPolicy(GetPolicy { ino })) {
        MetaReply::Policy(p) => p,
        other => panic!("expected Policy, got {other:?}"),
    }
}

/// Conformance case `replication_policies`: set, inherit (also by what existed before
/// the policy), override, clear, refuse files and unknown sites, warn about too few
/// nodes, forget a removed directory's policy, survive a restart.
pub fn replication_policies(b: &dyn Factory) {
    use proto::policy::{Policy, ReplicationMode as M};
    let s = b.open();
    admit(&s, &["n1", "n9"]);
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 100), cluster_id: None }));
    let mut far = node("n9", "10.0.0.9:7000", 1000, 100);
    far.site = "s2".into();
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: far, cluster_id: None }));
    let top = mk(&s, ROOT_INODE, "top", NewNode::Dir);
    let old = mk(&s, top.ino, "old", NewNode::File);
    assert_eq!(effective(&s, old.ino), proto::policy::EffectivePolicy { policy: Policy::default(), set_on: None });

    let both = policy(&["s1", "s2", "s1"], 1, M::Sync);
    match ok(&s, MetaRequest::SetPolicy(SetPolicy { ino: top.ino, policy: Some(both) })) {
        MetaReply::Warnings(w) => assert!(w.is_empty(), "{w:?}"),
        other => panic!("expected Warnings, got {other:?}"),
    }
    let stored = policy(&["s1", "s2"], 1, M::Sync);
    assert_eq!(effective(&s, old.ino).policy, stored, "a file created before the policy is under it");
    assert_eq!(effective(&s, old.ino).set_on, Some(top.ino));
    let sub = mk(&s, top.ino, "sub", NewNode::Dir);
    let deep = mk(&s, sub.ino, "f", NewNode::File);
    assert_eq!(effective(&s, deep.ino).policy, stored, "inherited two levels down");
    let session = hello(&s);
    let opened =
        ok(&s, MetaRequest::Open(Open { ino: deep.ino, session, truncate: false, access: OpenAccess::default() }));
    assert!(matches!(opened, MetaReply::Opened(o) if o.policy == stored), "Open carries the policy");
    let create =
        Create { parent: sub.ino, name: "new".into(), node: NewNode::File, mode: 0o644, umask: 0, exclusive: true };
    let access = OpenAccess { read: true, write: true };
    let created = ok(&s, MetaRequest::CreateOpen(CreateOpen { create, session, access }));
    assert!(matches!(created, MetaReply::Opened(o) if o.policy == stored), "CreateOpen carries the inherited policy");
    ok(&s, MetaRequest::Unlink(Unlink { parent: sub.ino, name: b"new".to_vec() }));

    // A nearer policy wins; too many copies is allowed, with a warning.
    let three = policy(&["s2"], 3, M::Async);
    match ok(&s, MetaRequest::SetPolicy(SetPolicy { ino: sub.ino, policy: Some(three.clone()) })) {
        MetaReply::Warnings(w) => assert!(w.len() == 1 && w[0].contains("site s2"), "{w:?}"),
        other => panic!("expected Warnings, got {other:?}"),
    }
    assert_eq!(effective(&s, deep.ino).policy, three);
    match ok(&s, MetaRequest::Status(Status {})) {
        MetaReply::Status(st) => {
            assert_eq!(st.policies.len(), 2);
            assert!(st.policy_warnings.iter().any(|w| w.contains(&format!("inode {}", sub.ino))), "{st:?}");
        }
        other => panic!("expected Status, got {other:?}"),
    }

    assert_eq!(
        err(&s, MetaRequest::SetPolicy(SetPolicy { ino: deep.ino, policy: Some(three.clone()) })),
        ErrorCode::NotDir
    );
    let nowhere = policy(&["mars"], 1, M::Sync);
    assert_eq!(
        err(&s, MetaRequest::SetPolicy(SetPolicy { ino: top.ino, policy: Some(nowhere) })),
        ErrorCode::InvalidArgument
    );
    let none = policy(&["s1"], 0, M::Sync);
    assert_eq!(
        err(&s, MetaRequest::SetPolicy(SetPolicy { ino: top.ino, policy: Some(none) })),
        ErrorCode::InvalidArgument
    );

    // Clearing falls back to the ancestor's; a removed directory's policy goes with it.
    ok(&s, MetaRequest::SetPolicy(SetPolicy { ino: sub.ino, policy: None }));
    assert_eq!(effective(&s, deep.ino).policy, stored);
    ok(&s, MetaRequest::SetPolicy(SetPolicy { ino: sub.ino, policy: Some(three) }));
    ok(&s, MetaRequest::Unlink(Unlink { parent: sub.ino, name: b"f".to_vec() }));
    ok(&s, MetaRequest::Rmdir(Rmdir { parent: top.ino, name: b"sub".to_vec() }));
    drop(s);
    let s = b.open();
    match ok(&s, MetaRequest::ListPolicies(ListPolicies {})) {
        MetaReply::Policies(list) => assert_eq!(list, vec![(top.ino, stored)]),
        other => panic!("expected Policies, got {other:?}"),
    }
}

/// Conformance case `node_drain`: a drained node is listed as such (and survives a
/// restart), undraining clears it, and an unknown node cannot be drained.
pub fn node_drain(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1", "n2"]);
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n1", "10.0.0.1:7000", 1000, 100), cluster_id: None }));
    ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node("n2", "10.0.0.2:7000", 1000, 100), cluster_id: None }));
    let drained = |s: &Arc<MetaService>| match ok(s, MetaRequest::ListNodes(ListNodes {})) {
        MetaReply::Nodes(list) => list.into_iter().filter(|n| n.drained).map(|n| n.id).collect::<Vec<_>>(),
        other => panic!("expected Nodes, got {other:?}"),
    };
    assert!(drained(&s).is_empty());
    ok(&s, MetaRequest::DrainNode(DrainNode { node: "n2".into(), drained: true }));
    ok(&s, MetaRequest::DrainNode(DrainNode { node: "n2".into(), drained: true }));
    assert_eq!(drained(&s), vec!["n2".to_string()]);
    assert_eq!(err(&s, MetaRequest::DrainNode(DrainNode { node: "n9".into(), drained: true })), ErrorCode::NotFound);
    drop(s);
    let s = b.open();
    assert_eq!(drained(&s), vec!["n2".to_string()]);
    ok(&s, MetaRequest::DrainNode(DrainNode { node: "n2".into(), drained: false }));
    assert!(drained(&s).is_empty());
}

#[track_caller]
fn short(s: &Arc<MetaService>, node: Option<&str>) -> Vec<(u8, Vec<String>)> {
    let ask = UnderReplicated { node: node.map(String::from), after: None, limit: 1000 };
    match ok(s, MetaRequest::UnderReplicated(ask)) {
        MetaReply::Shortfalls(page) => {
            assert_eq!(page.next, None);
            page.chunks.into_iter().map(|c| (c.id.0[0], c.sites)).collect()
        }
        other => panic!("expected Shortfalls, got {other:?}"),
    }
}

/// Conformance case `under_replication`: a chunk with fewer live, undrained holders at a
/// site than its policy's copies is listed (for fsck, and for the one node that is to
/// repair it), and no longer once the copies are reported; draining a holder makes it
/// short again.
pub fn under_replication(b: &dyn Factory) {
    let s = b.open();
    admit(&s, &["n1", "n2", "n3"]);
    for (id, addr) in [("n1", "10.0.0.1:7000"), ("n2", "10.0.0.2:7000"), ("n3", "10.0.0.3:7000")] {
        ok(&s, MetaRequest::RegisterNode(RegisterNode { node: node(id, addr, 1000, 100), cluster_id: None }));
    }
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    // `commit` records the chunk on n1 only; the default policy wants two copies at s1.
    commit(&s, f.ino, vec![ext(0, 10, 7, 0)], 10);
    assert_eq!(short(&s, None), vec![(7, vec!["s1".to_string()])]);
    assert_eq!(short(&s, Some("n1")), vec![(7, vec!["s1".to_string()])], "n1 holds it: n1 repairs");
    assert!(short(&s, Some("n2")).is_empty(), "n2 holds nothing to copy from");
    assert!(short(&s, Some("n3")).is_empty());
    // A site-cache copy does not count: it may be evicted at any time.
    let cached = |id: u8| StoredChunk { id: cid(id), size: 1 << 20, nodes: vec![], receipt: None };
    ok(
        &s,
        MetaRequest::UpdateLocations(UpdateLocations { node: "n2".into(), added: vec![cached(7)], removed: vec![] }),
    );
    assert_eq!(short(&s, None), vec![(7, vec!["s1".to_string()])], "n2's cached copy does not count");
    assert_eq!(short(&s, Some("n1")), vec![(7, vec!["s1".to_string()])], "n1, the replica, repairs");
    assert!(short(&s, Some("n2")).is_empty());
    let copy = StoredChunk { id: cid(7), size: 1 << 20, nodes: vec!["n2".into()], receipt: None };
    ok(&s, MetaRequest::UpdateLocations(UpdateLocations { node: "n1".into(), added: vec![copy], removed: vec![] }));
    assert!(short(&s, None).is_empty(), "two copies at s1");
    ok(&s, MetaRequest::DrainNode(DrainNode { node: "n1".into(), drained: true }));
    assert_eq!(short(&s, Some("n2")), vec![(7, vec!["s1".to_string()])], "n2 is now the holder that counts");
    assert!(short(&s, Some("n1")).is_empty() && short(&s, Some("n3")).is_empty());
    // Chunk 8's only replica is on drained n1, a cached copy on n3: n1 repairs it; once
    // n1 is removed, the cached copy is the last one and n3 repairs from it.
    let g = mk(&s, ROOT_INODE, "g", NewNode::File);
    commit(&s, g.ino, vec![ext(0, 10, 8, 0)], 10);
    ok(
        &s,
        MetaRequest::UpdateLocations(UpdateLocations { node: "n3".into(), added: vec![cached(8)], removed: vec![] }),
    );
    let eight = |s: &Arc<MetaService>, node| short(s, node).into_iter().filter(|(id, _)| *id == 8).collect::<Vec<_>>();
    assert_eq!(eight(&s, Some("n1")), vec![(8, vec!["s1".to_string()])], "a drained replica before a cached copy");
    assert!(eight(&s, Some("n3")).is_empty());
    ok(&s, MetaRequest::RemoveNode(RemoveNode { node: "n1".into() }));
    assert_eq!(eight(&s, None), vec![(8, vec![])], "fsck: no live replica");
    assert_eq!(eight(&s, Some("n3")), vec![(8, vec!["s1".to_string()])], "the last, cached, copy is repaired from");
}

/// Conformance case `node_admission`: a node registers only once admitted (until
/// then it is listed as pending); a removed node loses its row and chunk locations,
/// is refused from then on (also after a restart of meta) until admitted again.
pub fn node_admission(b: &dyn Factory) {
    let s = b.open();
    let register = |id: &str, addr: &str| {
        MetaRequest::RegisterNode(RegisterNode { node: node(id, addr, 1000, 100), cluster_id: None })
    };
    let e = call(&s, register("n5", "10.0.0.5:7000")).unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(e.message.contains("run `locus node admit n5`"), "{}", e.message);
    let listed = |s: &Arc<MetaService>| match ok(s, MetaRequest::Status(Status {})) {
        MetaReply::Status(st) => (
            st.nodes.iter().map(|n| n.id.clone()).collect::<Vec<_>>(),
            st.pending.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        ),
        other => panic!("expected Status, got {other:?}"),
    };
    assert_eq!(listed(&s), (vec![], vec!["n5".to_string()]), "n5 is pending, not a node");
    admit(&s, &["n5", "n6"]);
    ok(&s, register("n5", "10.0.0.5:7000"));
    ok(&s, register("n6", "10.0.0.6:7000"));
    assert_eq!(listed(&s), (vec!["n5".to_string(), "n6".into()], vec![]));
    let f = mk(&s, ROOT_INODE, "f", NewNode::File);
    let chunks = vec![StoredChunk { id: cid(3), size: 100, nodes: vec!["n5".into(), "n6".into()], receipt: None }];
    let extents = vec![ext(0, 100, 3, 0)];
    ok(
        &s,
        MetaRequest::CommitWrite(CommitWrite {
            ino: f.ino,
            session: 0,
            extents,
            chunks,
            min_size: 0,
            mtime: Timestamp::now(),
        }),
    );
    ok(&s, MetaRequest::RemoveNode(RemoveNode { node: "n5".into() }));
    assert_eq!(listed(&s), (vec!["n6".to_string()], vec![]));
    match ok(&s, MetaRequest::ChunkLocations(ChunkLocations { ids: vec![cid(3)], caps: Vec::new() })) {
        MetaReply::Chunks(c) => assert_eq!(c[0].nodes, vec!["n6".to_string()], "n5's locations went with it"),
        other => panic!("expected Chunks, got {other:?}"),
    }
    let copy = StoredChunk { id: cid(3), size: 100, nodes: vec![], receipt: None };
    let report =
        MetaRequest::UpdateLocations(UpdateLocations { node: "n5".into(), added: vec![copy], removed: vec![] });
    assert_eq!(err(&s, report), ErrorCode::PermissionDenied, "a removed node records no copies");
    drop(s);
    let s = b.open();
    let e = call(&s, register("n5", "10.0.0.5:7000")).unwrap_err();
    assert_eq!(e.code, ErrorCode::PermissionDenied);
    assert!(e.message.contains("was removed"), "{}", e.message);
    assert_eq!(listed(&s), (vec!["n6".to_string()], vec![]), "a removed node is not pending");
    assert_eq!(err(&s, MetaRequest::RemoveNode(RemoveNode { node: "nobody".into() })), ErrorCode::NotFound);
    admit(&s, &["n5"]);
    ok(&s, register("n5", "10.0.0.5:7000"));
}

/// Conformance case `join_tokens`: a token admits the node that spends it, once; an
/// expired or unknown token admits nobody, and no token brings back a removed node.
pub fn join_tokens(b: &dyn Factory) {
    let s = b.open();
    let token = |s: &Arc<MetaService>, ttl_secs| match ok(s, MetaRequest::MakeJoinToken(MakeJoinToken { ttl_secs })) {
        MetaReply::Token(t) => t.token,
        other => panic!("expected Token, got {other:?}"),
    };
    let join = |node: &str, token: &str| MetaRequest::JoinNode(JoinNode { node: node.into(), token: token.into() });
    let register = |id: &str| {
        MetaRequest::RegisterNode(RegisterNode { node: node(id, "10.0.0.7:7000", 1000, 100), cluster_id: None })
    };
    let t = token(&s, 3600);
    assert!(t.starts_with("locus-join-") && t.len() > 40, "{t}");
    assert_eq!(err(&s, register("n7")), ErrorCode::PermissionDenied);
    ok(&s, join("n7", &t));
    ok(&s, register("n7"));
    assert_eq!(err(&s, join("n8", &t)), ErrorCode::PermissionDenied, "a token is single-use");
    assert_eq!(err(&s, join("n8", "locus-join-made-up")), ErrorCode::PermissionDenied);
    let expired = token(&s, 0);
    assert_eq!(err(&s, join("n8", &expired)), ErrorCode::PermissionDenied, "an expired token");
    let kept = token(&s, 3600);
    drop(s);
    let s = b.open();
    ok(&s, MetaRequest::RemoveNode(RemoveNode { node: "n7".into() }));
    let e = call(&s, join("n7", &kept)).unwrap_err();
    assert!(e.message.contains("was removed"), "a token does not bring back a removed node: {}", e.message);
    ok(&s, join("n8", &kept));
    ok(&s, register("n8"));
}

/// Conformance case `reach_by_inode_number`: a request naming an inode by number is
/// answered only if the caller could reach it by a path walk (search permission on
/// every directory above it, through any of its names), whatever the file's own mode.
pub fn reach_by_inode_number(b: &dyn Factory) {
    use ErrorCode::PermissionDenied;
    let s = b.open();
    let alice = Caller::new(1001, 1001);
    let bob = Caller::new(1002, 1002);
    let set = |ino, set| MetaRequest::SetAttr(SetAttr { ino, set, session: None });
    let chmod = |ino, mode| set(ino, AttrChanges { mode: Some(mode), ..Default::default() });
    ok(&s, chmod(ROOT_INODE, 0o777));
    let home = mk(&s, ROOT_INODE, "home", NewNode::Dir);
    ok(&s, set(home.ino, AttrChanges { uid: Some(1001), gid: Some(1001), ..Default::default() }));
    ok(&s, chmod(home.ino, 0o700));
    // A world-readable file and a symlink in a world-readable directory, below the 0700 home.
    let public = attr(as_user(&s, &alice, create_req(home.ino, "pub", NewNode::Dir, 0o755)).unwrap());
    let f = attr(as_user(&s, &alice, create_req(public.ino, "f", NewNode::File, 0o644)).unwrap());
    let target = NewNode::Symlink { target: b"/secret/plans".to_vec() };
    let l = attr(as_user(&s, &alice, create_req(public.ino, "l", target, 0o777)).unwrap());
    let xattr = MetaRequest::SetXattr(SetXattr {
        ino: f.ino,
        name: b"user.k".to_vec(),
        value: b"v".to_vec(),
        mode: XattrMode::Any,
    });
    as_user(&s, &alice, xattr).unwrap();
    let session = hello(&s);
    let open = MetaRequest::Open(Open {
        ino: f.ino,
        session,
        truncate: false,
        access: OpenAccess { read: true, write: false },
    });
    let by_number = [
        MetaRequest::GetAttr(GetAttr { ino: f.ino }),
        MetaRequest::GetAttr(GetAttr { ino: public.ino }),
        MetaRequest::ReadLink(ReadLink { ino: l.ino }),
        MetaRequest::ListXattr(ListXattr { ino: f.ino }),
        MetaRequest::GetXattr(GetXattr { ino: f.ino, name: b"user.k".to_vec() }),
        MetaRequest::Extents(Extents { ino: f.ino }),
        open.clone(),
        MetaRequest::ReadDir(ReadDir { ino: public.ino, after: 0, limit: 10 }),
        MetaRequest::Lookup(Lookup { parent: public.ino, name: b"f".to_vec() }),
        MetaRequest::GetPolicy(GetPolicy { ino: f.ino }),
    ];
    for req in &by_number {
        assert!(as_user(&s, &alice, req.clone()).is_ok(), "the owner: {req:?}");
        assert_eq!(as_user(&s, &bob, req.clone()).err(), Some(PermissionDenied), "{req:?}");
    }
    let mine = attr(as_user(&s, &bob, create_req(ROOT_INODE, "bobs", NewNode::Dir, 0o755)).unwrap());
    let link = |ino, parent, name: &str| MetaRequest::Link(Link { ino, new_parent: parent, new_name: name.into() });
    assert_eq!(as_user(&s, &bob, link(f.ino, mine.ino, "stolen")).err(), Some(PermissionDenied));
    let create = create_req(public.ino, "x", NewNode::File, 0o644);
    assert_eq!(as_user(&s, &bob, create).err(), Some(PermissionDenied), "a 0777 dir below a 0700 one");
    // Another name in a directory bob can search makes the file reachable to him; when
    // the first name goes, the file keeps a parent that holds a name of it.
    let shared = attr(ok(&s, create_req(ROOT_INODE, "shared", NewNode::Dir, 0o777)));
    as_user(&s, &alice, link(f.ino, shared.ino, "f2")).unwrap();
    assert!(as_user(&s, &bob, MetaRequest::GetAttr(GetAttr { ino: f.ino })).is_ok(), "through shared/f2");
    assert!(as_user(&s, &bob, open.clone()).is_ok());
    as_user(&s, &alice, MetaRequest::Unlink(Unlink { parent: public.ino, name: b"f".to_vec() })).unwrap();
    assert!(as_user(&s, &bob, MetaRequest::GetAttr(GetAttr { ino: f.ino })).is_ok(), "its parent is now shared");
    as_user(&s, &alice, link(f.ino, public.ino, "f")).unwrap();
    as_user(&s, &alice, MetaRequest::Unlink(Unlink { parent: shared.ino, name: b"f2".to_vec() })).unwrap();
    assert_eq!(as_user(&s, &bob, MetaRequest::GetAttr(GetAttr { ino: f.ino })).err(), Some(PermissionDenied));
    // A file bob may neither read nor write cannot be linked even where he can reach it
    // (fs.protected_hardlinks); one he may read and write can.
    let other = attr(as_user(&s, &alice, create_req(shared.ino, "ro", NewNode::File, 0o644)).unwrap());
    assert_eq!(as_user(&s, &bob, link(other.ino, mine.ino, "ro")).err(), Some(ErrorCode::NotPermitted));
    let rw = attr(as_user(&s, &alice, create_req(shared.ino, "rw", NewNode::File, 0o666)).unwrap());
    assert!(as_user(&s, &bob, link(rw.ino, mine.ino, "rw")).is_ok());
    // Root reaches everything.
    assert!(call(&s, MetaRequest::GetAttr(GetAttr { ino: f.ino })).is_ok());
}

/// Conformance case `privileges_drop_on_change`: a write, truncation, fallocate or
/// chown by anyone but root clears setuid, and setgid where it means setgid (group
/// executable), whatever client sent it; root's write keeps them.
pub fn privileges_drop_on_change(b: &dyn Factory) {
    let s = b.open();
    let alice = Caller::new(1001, 1001);
    let set = |ino, set| MetaRequest::SetAttr(SetAttr { ino, set, session: None });
    let mode_of = |ino| get(&s, ino).mode & 0o7777;
    let session = hello(&s);
    let fresh = |name: &str, mode: u32| {
        let f = mk(&s, ROOT_INODE, name, NewNode::File);
        ok(&s, set(f.ino, AttrChanges { uid: Some(1001), gid: Some(1001), ..Default::default() }));
        ok(&s, set(f.ino, AttrChanges { mode: Some(mode), ..Default::default() }));
        f.ino
    };
    let write = |ino, tag| {
        MetaRequest::CommitWrite(CommitWrite {
            ino,
            session,
            extents: vec![ext(0, 10, tag, 0)],
            chunks: vec![StoredChunk { id: cid(tag), size: 10, nodes: vec!["n1".into()], receipt: None }],
            min_size: 10,
            mtime: Timestamp { secs: 1, nanos: 0 },
        })
    };
    let w = fresh("w", 0o6777);
    as_user(&s, &alice, write(w, 1)).unwrap();
    assert_eq!(mode_of(w), 0o777, "a write by the owner drops both");
    let g = fresh("g", 0o2666);
    as_user(&s, &alice, write(g, 2)).unwrap();
    assert_eq!(mode_of(g), 0o2666, "setgid without group-exec is a locking mark, not a privilege");
    let r = fresh("r", 0o6777);
    ok(&s, write(r, 3));
    assert_eq!(mode_of(r), 0o6777, "root's write keeps them");
    let t = fresh("t", 0o4777);
    as_user(&s, &alice, set(t, AttrChanges { size: Some(0), ..Default::default() })).unwrap();
    assert_eq!(mode_of(t), 0o777, "truncate");
    let a = fresh("a", 0o4777);
    let falloc = MetaRequest::Fallocate(Fallocate { ino: a, session, offset: 0, len: 9, mode: AllocateMode::Extend });
    as_user(&s, &alice, falloc).unwrap();
    assert_eq!(mode_of(a), 0o777, "fallocate");
    let o = fresh("o", 0o4777);
    let open =
        MetaRequest::Open(Open { ino: o, session, truncate: true, access: OpenAccess { read: false, write: true } });
    as_user(&s, &alice, open).unwrap();
    assert_eq!(mode_of(o), 0o777, "open with O_TRUNC");
    let c = fresh("c", 0o6755);
    ok(&s, set(c, AttrChanges { uid: Some(1002), ..Default::default() }));
    assert_eq!(mode_of(c), 0o755, "chown, even by root");
}

/// Conformance case `chunk_possession`: an extent names only a chunk the request
/// stored or one the file already holds, and lies within it.
pub fn chunk_possession(b: &dyn Factory) {
    let s = b.open();
    let alice = Caller::new(1001, 1001);
    let session = hello(&s);
    let victim = mk(&s, ROOT_INODE, "victim", NewNode::File);
    commit(&s, victim.ino, vec![ext(0, 100, 7, 0)], 100);
    ok(
        &s,
        MetaRequest::SetAttr(SetAttr {
            ino: ROOT_INODE,
            set: AttrChanges { mode: Some(0o777), ..Default::default() },
            session: None,
        }),
    );
    let mine = attr(as_user(&s, &alice, create_req(ROOT_INODE, "mine", NewNode::File, 0o644)).unwrap());
    let write = |extents, chunks| {
        MetaRequest::CommitWrite(CommitWrite {
            ino: mine.ino,
            session,
            extents,
            chunks,
            min_size: 100,
            mtime: Timestamp { secs: 1, nanos: 0 },
        })
    };
    let stored = |tag, size| StoredChunk { id: cid(tag), size, nodes: vec!["n1".into()], receipt: None };
    assert_eq!(as_user(&s, &alice, write(vec![ext(0, 100, 7, 0)], vec![])).err(), Some(ErrorCode::PermissionDenied));
    assert_eq!(refcount(&s, 7), Some(1), "nothing bound");
    let beyond = write(vec![ext(0, 100, 8, 50)], vec![stored(8, 100)]);
    assert_eq!(as_user(&s, &alice, beyond).err(), Some(ErrorCode::InvalidArgument), "past the chunk's end");
    as_user(&s, &alice, write(vec![ext(0, 100, 8, 0)], vec![stored(8, 100)])).unwrap();
    // A chunk the file holds may be mapped again (elsewhere in it) without a new proof.
    as_user(&s, &alice, write(vec![ext(100, 50, 8, 0)], vec![])).unwrap();
    assert_eq!(refcount(&s, 8), Some(2));
}

/// An ACL value in the kernel's encoding: `(tag, id, perm)` with tags 1 owner, 2 user,
/// 4 owning group, 8 group, 0x10 mask, 0x20 other.
fn acl_value(entries: &[(u16, u32, u16)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, id, perm) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Conformance case `acls`: POSIX ACLs are enforced by meta in every permission check
/// (named users and groups within the mask, a deny that denies, search through a
/// directory's ACL), kept in step with the mode both ways, inherited from a directory's
/// default ACL in place of the umask, and refused when invalid or not the caller's.
pub fn acls(b: &dyn Factory) {
    use ErrorCode::{InvalidArgument, NoAttribute, NotPermitted, PermissionDenied, Unsupported};
    const ANY: u32 = u32::MAX;
    let s = b.open();
    let alice = Caller::new(1001, 1001);
    let bob = Caller::new(1002, 1002);
    let carol = Caller { uid: 1003, gid: 1003, groups: vec![60] };
    let set = |ino, set| MetaRequest::SetAttr(SetAttr { ino, set, session: None });
    let chmod = |ino, mode| set(ino, AttrChanges { mode: Some(mode), ..Default::default() });
    let setacl = |ino, name: &str, value: Vec<u8>| {
        MetaRequest::SetXattr(SetXattr { ino, name: name.into(), value, mode: XattrMode::Any })
    };
    let getx = |ino, name: &str| MetaRequest::GetXattr(GetXattr { ino, name: name.into() });
    let session = hello(&s);
    let open = |ino, read, write| {
        MetaRequest::Open(Open { ino, session, truncate: false, access: OpenAccess { read, write } })
    };
    let home = mk(&s, ROOT_INODE, "home", NewNode::Dir);
    ok(&s, set(home.ino, AttrChanges { uid: Some(1001), gid: Some(1001), ..Default::default() }));
    let f = attr(as_user(&s, &alice, create_req(home.ino, "f", NewNode::File, 0o644)).unwrap());

    // A deny for a named user denies what the mode's other bits grant.
    let deny_bob = acl_value(&[(1, ANY, 6), (2, 1002, 0), (4, ANY, 4), (0x10, ANY, 4), (0x20, ANY, 4)]);
    assert_eq!(as_user(&s, &bob, setacl(f.ino, "system.posix_acl_access", deny_bob.clone())), Err(NotPermitted));
    assert!(as_user(&s, &alice, setacl(f.ino, "system.posix_acl_access", deny_bob.clone())).is_ok());
    assert_eq!(as_user(&s, &bob, open(f.ino, true, false)), Err(PermissionDenied));
    assert!(as_user(&s, &carol, open(f.ino, true, false)).is_ok(), "everyone else: other");
    assert_eq!(as_user(&s, &alice, getx(f.ino, "system.posix_acl_access")), Ok(MetaReply::Bytes(deny_bob)));
    assert_eq!(get(&s, f.ino).mode, 0o644, "owner rw-, mask r--, other r--");

    // A grant for a named user and a named group, within the mask; the mode shows it.
    let grant = acl_value(&[(1, ANY, 6), (2, 1002, 6), (4, ANY, 0), (8, 60, 4), (0x10, ANY, 6), (0x20, ANY, 0)]);
    assert!(as_user(&s, &alice, setacl(f.ino, "system.posix_acl_access", grant)).is_ok());
    assert_eq!(get(&s, f.ino).mode, 0o660);
    assert!(as_user(&s, &bob, open(f.ino, true, true)).is_ok());
    assert!(as_user(&s, &carol, open(f.ino, true, false)).is_ok());
    assert_eq!(as_user(&s, &carol, open(f.ino, false, true)), Err(PermissionDenied), "the group entry is r--");
    assert_eq!(as_user(&s, &Caller::new(1004, 1004), open(f.ino, true, false)), Err(PermissionDenied));
    // chmod rewrites the mask: a group class of --- takes every named grant away.
    assert!(as_user(&s, &alice, chmod(f.ino, 0o600)).is_ok());
    assert_eq!(as_user(&s, &bob, open(f.ino, true, false)), Err(PermissionDenied));
    let Ok(MetaReply::Bytes(now)) = as_user(&s, &alice, getx(f.ino, "system.posix_acl_access")) else { panic!() };
    assert_eq!(now, acl_value(&[(1, ANY, 6), (2, 1002, 6), (4, ANY, 0), (8, 60, 4), (0x10, ANY, 0), (0x20, ANY, 0)]));
    ok(&s, chmod(f.ino, 0o640));
    assert!(as_user(&s, &bob, open(f.ino, true, false)).is_ok(), "the mask r-- gives bob read back");
    assert_eq!(as_user(&s, &bob, open(f.ino, false, true)), Err(PermissionDenied));
    // An ACL that says no more than a mode is kept as the mode alone.
    let minimal = acl_value(&[(1, ANY, 7), (4, ANY, 5), (0x20, ANY, 1)]);
    assert!(as_user(&s, &alice, setacl(f.ino, "system.posix_acl_access", minimal)).is_ok());
    assert_eq!(get(&s, f.ino).mode, 0o751);
    assert_eq!(as_user(&s, &alice, getx(f.ino, "system.posix_acl_access")), Err(NoAttribute));
    assert!(as_user(&s, &bob, open(f.ino, true, false)).is_err(), "back to the mode: other --x");

    // Search permission through a directory's ACL, also for a request by inode number.
    ok(&s, chmod(home.ino, 0o700));
    assert_eq!(as_user(&s, &bob, MetaRequest::GetAttr(GetAttr { ino: f.ino })), Err(PermissionDenied));
    let search = acl_value(&[(1, ANY, 7), (2, 1002, 1), (4, ANY, 0), (0x10, ANY, 1), (0x20, ANY, 0)]);
    assert!(as_user(&s, &alice, setacl(home.ino, "system.posix_acl_access", search)).is_ok());
    assert!(as_user(&s, &bob, MetaRequest::GetAttr(GetAttr { ino: f.ino })).is_ok());
    assert!(as_user(&s, &bob, lookup_as(home.ino, "f")).is_ok());
    assert_eq!(
        as_user(&s, &bob, MetaRequest::ReadDir(ReadDir { ino: home.ino, after: 0, limit: 9 })),
        Err(PermissionDenied)
    );
    assert_eq!(as_user(&s, &carol, lookup_as(home.ino, "f")), Err(PermissionDenied));
    // Removing the access ACL leaves the mode as it was.
    let rm = |ino, name: &str| MetaRequest::RemoveXattr(RemoveXattr { ino, name: name.into() });
    assert!(as_user(&s, &alice, rm(home.ino, "system.posix_acl_access")).is_ok());
    assert_eq!(get(&s, home.ino).mode, 0o710);
    assert_eq!(as_user(&s, &bob, lookup_as(home.ino, "f")), Err(PermissionDenied));
    assert_eq!(as_user(&s, &alice, rm(home.ino, "system.posix_acl_access")), Err(NoAttribute));

    // A default ACL is inherited in place of the umask; a directory keeps it as its own.
    ok(&s, chmod(home.ino, 0o755));
    let default = acl_value(&[(1, ANY, 7), (2, 1002, 7), (4, ANY, 5), (0x10, ANY, 7), (0x20, ANY, 5)]);
    assert_eq!(as_user(&s, &alice, setacl(f.ino, "system.posix_acl_default", default.clone())), Err(PermissionDenied));
    assert!(as_user(&s, &alice, setacl(home.ino, "system.posix_acl_default", default.clone())).is_ok());
    let made = |name: &str, node, mode| {
        let req = Create { parent: home.ino, name: name.into(), node, mode, umask: 0o077, exclusive: true };
        attr(as_user(&s, &alice, MetaRequest::Create(req)).unwrap())
    };
    let g = made("g", NewNode::File, 0o666);
    assert_eq!(g.mode, 0o664, "owner and other from the default, group class from its mask; no umask");
    let Ok(MetaReply::Bytes(inherited)) = as_user(&s, &alice, getx(g.ino, "system.posix_acl_access")) else {
        panic!("g has an access ACL")
    };
    assert_eq!(inherited, acl_value(&[(1, ANY, 6), (2, 1002, 7), (4, ANY, 5), (0x10, ANY, 6), (0x20, ANY, 4)]));
    assert!(as_user(&s, &bob, open(g.ino, true, true)).is_ok(), "bob's rwx within the mask rw-");
    let sub = made("sub", NewNode::Dir, 0o700);
    assert_eq!(sub.mode, 0o700);
    assert_eq!(as_user(&s, &alice, getx(sub.ino, "system.posix_acl_default")), Ok(MetaReply::Bytes(default)));
    let deeper = attr(as_user(&s, &alice, create_req(sub.ino, "h", NewNode::File, 0o640)).unwrap());
    assert_eq!(deeper.mode, 0o640, "inherited two levels down");
    assert!(as_user(&s, &alice, getx(deeper.ino, "system.posix_acl_access")).is_ok());
    let link = made("l", NewNode::Symlink { target: b"g".to_vec() }, 0o777);
    assert_eq!(
        as_user(&s, &alice, getx(link.ino, "system.posix_acl_access")),
        Err(NoAttribute),
        "symlinks inherit none"
    );
    let minimal = acl_value(&[(1, ANY, 7), (4, ANY, 5), (0x20, ANY, 1)]);
    assert_eq!(as_user(&s, &alice, setacl(link.ino, "system.posix_acl_access", minimal)), Err(Unsupported));
    // Without a default ACL the umask applies.
    assert!(as_user(&s, &alice, rm(home.ino, "system.posix_acl_default")).is_ok());
    assert_eq!(made("k", NewNode::File, 0o666).mode, 0o600);

    // Invalid ACLs are EINVAL: no mask with a named entry, out of order, bad bits.
    let bad = [
        acl_value(&[(1, ANY, 6), (2, 1002, 6), (4, ANY, 4), (0x20, ANY, 4)]),
        acl_value(&[(4, ANY, 4), (1, ANY, 6), (0x20, ANY, 4)]),
        acl_value(&[(1, ANY, 8), (4, ANY, 4), (0x20, ANY, 4)]),
        b"not an acl".to_vec(),
    ];
    for value in bad {
        assert_eq!(as_user(&s, &alice, setacl(g.ino, "system.posix_acl_access", value)), Err(InvalidArgument));
    }
    // The ACL outlives a restart (the marks are in the mode column).
    drop(s);
    let s = b.open();
    assert_eq!(as_user(&s, &bob, open(g.ino, false, true)).map(|_| ()), Ok(()));
    assert_eq!(as_user(&s, &carol, open(g.ino, true, false)).map(|_| ()), Ok(()), "other r--");
    assert_eq!(as_user(&s, &carol, open(g.ino, false, true)).map(|_| ()), Err(PermissionDenied));
}

fn lookup_as(parent: InodeId, name: &str) -> MetaRequest {
    MetaRequest::Lookup(Lookup { parent, name: name.into() })
}
