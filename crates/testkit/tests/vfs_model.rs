//! The client `Vfs` against a reference model, through a real meta (SQLite or
//! PostgreSQL) and a real node, in-process over loopback TCP; and a few focused tests
//! of the read and write paths that share their set-up.
//!
//! # The model test (`vfs_model_sqlite`, `vfs_model_postgres`)
//!
//! Two clients (two `Vfs`, each with its own session) run random ops on a handful of
//! names in a directory of their own: open (creating a missing name), close, write,
//! read, fsync, truncate (shrinking and growing), fallocate (every mode the `Vfs`
//! supports: extend, keep-size, punch-hole, zero-range), rename (replacing or exchanging
//! an existing name) and unlink (of files still open). The model is plain byte vectors.
//! It catches what users fear losing:
//! - every written byte depends on its file offset and its write (`pattern`), and every
//!   read is compared byte for byte: a byte put one place off, a chunk boundary cut
//!   wrong or stale data from an older write all show;
//! - close-to-open consistency between the clients: an open sees exactly what was last
//!   closed, fsynced, truncated or fallocated by anyone — not a later write still
//!   buffered in the other client; a handle open while the other client commits may
//!   read its old view or the new one, nothing else;
//! - an unlinked (or renamed-over) file stays readable and writable through its open
//!   handles while its name is gone for both clients;
//! - at the end, with everything closed, both clients see exactly the model's names
//!   and bytes.
//!
//! Writes by a client are only made to a file whose content it knows exactly and that
//! the other client has no unflushed writes to: what two concurrent writers leave is not
//! something the model (or POSIX) pins down. Ops that do not apply (a handle that is
//! not there) are skipped, the same way in every run, so any list of ops is a valid case
//! and shrinks well.
//!
//! Default: `LOCUS_MODEL_CASES` (200) cases of up to `LOCUS_MODEL_OPS` (80) ops per
//! backend, about a minute for the whole file in a debug build. A nightly-size run:
//!
//! ```text
//! LOCUS_MODEL_CASES=5000 LOCUS_MODEL_OPS=200 cargo test --release -p testkit --test vfs_model vfs_model_
//! ```
//!
//! A failure is shrunk, then printed as a `LOCUS_MODEL_REPLAY='c0 open f0; ...'` line:
//! set that variable to run exactly that case (once, against the backend of the test
//! selected; `LOCUS_MODEL_TRACE=1` prints every op as it runs), or paste the string into
//! a `replay(Backend::..., "...")` test like `vfs_model_replays_known_cases`. proptest
//! also keeps the failing seed in `vfs_model.proptest-regressions` and tries it first.

use client::{ClientConfig, OpenOptions, Vfs};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestError, TestRunner};
use proto::error::ErrorCode;
use proto::meta::{AllocateMode, AttrChanges, NewNode, OpenAccess, RenameMode};
use proto::types::{InodeId, ROOT_INODE};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

/// Names the ops use (`f0`..): few, so that renames and unlinks meet open files.
const FILES: usize = 4;
/// Handles one client keeps open at most (`h0`.. pick among them, modulo their number).
const MAX_HANDLES: usize = 5;
/// The model clients' chunk size: small, so that files of tens of KiB span several
/// chunks and writes cross chunk boundaries.
const CHUNK: u64 = 16 << 10;
/// Longest an op may take before the case fails as hung.
const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// One step of a case. `c` is the client (0 or 1); `h` picks one of that client's open
/// handles (modulo their number, in the order opened); `file` a name, `f0`...
#[derive(Clone, PartialEq, Eq)]
enum Op {
    Open { c: usize, file: usize },
    Close { c: usize, h: usize },
    Write { c: usize, h: usize, offset: u64, len: u64, seed: u32 },
    Read { c: usize, h: usize, offset: u64, len: u64 },
    Fsync { c: usize, h: usize },
    Truncate { c: usize, h: usize, size: u64 },
    Fallocate { c: usize, h: usize, offset: u64, len: u64, mode: AllocateMode },
    Rename { c: usize, from: usize, to: usize, exchange: bool },
    Unlink { c: usize, file: usize },
}

const MODES: [(AllocateMode, &str); 4] = [
    (AllocateMode::Extend, "extend"),
    (AllocateMode::KeepSize, "keep-size"),
    (AllocateMode::PunchHole, "punch-hole"),
    (AllocateMode::ZeroRange, "zero-range"),
];

/// The replay text of an op: `c0 write h1 16380+9 s7`, ...
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Open { c, file } => write!(f, "c{c} open f{file}"),
            Op::Close { c, h } => write!(f, "c{c} close h{h}"),
            Op::Write { c, h, offset, len, seed } => write!(f, "c{c} write h{h} {offset}+{len} s{seed}"),
            Op::Read { c, h, offset, len } => write!(f, "c{c} read h{h} {offset}+{len}"),
            Op::Fsync { c, h } => write!(f, "c{c} fsync h{h}"),
            Op::Truncate { c, h, size } => write!(f, "c{c} truncate h{h} {size}"),
            Op::Fallocate { c, h, offset, len, mode } => {
                let name = MODES.iter().find(|(m, _)| m == mode).map_or("?", |(_, n)| n);
                write!(f, "c{c} fallocate h{h} {offset}+{len} {name}")
            }
            Op::Rename { c, from, to, exchange } => {
                write!(f, "c{c} {} f{from} f{to}", if *exchange { "exchange" } else { "rename" })
            }
            Op::Unlink { c, file } => write!(f, "c{c} unlink f{file}"),
        }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(s: &str) -> Result<Op, String> {
        let bad = || format!("not an op: {s:?}");
        let num = |word: &str, prefix: &str| -> Result<u64, String> {
            word.strip_prefix(prefix).and_then(|n| n.parse().ok()).ok_or_else(bad)
        };
        let below = |word: &str, prefix: &str, limit: usize| -> Result<usize, String> {
            let n = num(word, prefix)? as usize;
            if n < limit { Ok(n) } else { Err(bad()) }
        };
        let range = |word: &str| -> Result<(u64, u64), String> {
            let (offset, len) = word.split_once('+').ok_or_else(bad)?;
            Ok((num(offset, "")?, num(len, "")?))
        };
        let words: Vec<&str> = s.split_whitespace().collect();
        let (Some(client), Some(verb)) = (words.first(), words.get(1)) else { return Err(bad()) };
        let c = below(client, "c", 2)?;
        let h = |word: &str| below(word, "h", MAX_HANDLES);
        let file = |word: &str| below(word, "f", FILES);
        Ok(match (*verb, &words[2..]) {
            ("open", [f]) => Op::Open { c, file: file(f)? },
            ("close", [hh]) => Op::Close { c, h: h(hh)? },
            ("write", [hh, r, seed]) => {
                let (offset, len) = range(r)?;
                Op::Write { c, h: h(hh)?, offset, len, seed: num(seed, "s")?.try_into().map_err(|_| bad())? }
            }
            ("read", [hh, r]) => {
                let (offset, len) = range(r)?;
                Op::Read { c, h: h(hh)?, offset, len }
            }
            ("fsync", [hh]) => Op::Fsync { c, h: h(hh)? },
            ("truncate", [hh, size]) => Op::Truncate { c, h: h(hh)?, size: num(size, "")? },
            ("fallocate", [hh, r, mode]) => {
                let (offset, len) = range(r)?;
                let mode = MODES.iter().find(|(_, n)| n == mode).ok_or_else(bad)?.0;
                Op::Fallocate { c, h: h(hh)?, offset, len, mode }
            }
            ("rename" | "exchange", [from, to]) => {
                Op::Rename { c, from: file(from)?, to: file(to)?, exchange: *verb == "exchange" }
            }
            ("unlink", [f]) => Op::Unlink { c, file: file(f)? },
            _ => return Err(bad()),
        })
    }
}

/// A case: its ops, shown (by proptest too, and in its persistence file) as the line
/// that replays it.
#[derive(Clone)]
struct Ops(Vec<Op>);

impl fmt::Debug for Ops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.0.iter().map(Op::to_string).collect();
        write!(f, "LOCUS_MODEL_REPLAY='{}'", text.join("; "))
    }
}

impl FromStr for Ops {
    type Err = String;

    fn from_str(s: &str) -> Result<Ops, String> {
        let s = s.trim().trim_start_matches("LOCUS_MODEL_REPLAY=").trim_matches('\'');
        s.split(';').map(str::trim).filter(|op| !op.is_empty()).map(str::parse).collect::<Result<_, _>>().map(Ops)
    }
}

/// Offsets (and sizes) anywhere in the first five chunks, or right at a chunk boundary
/// (a few bytes either side), where off-by-one errors live.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![0..5 * CHUNK, (0..6u64, 0..9u64).prop_map(|(k, d)| (k * CHUNK + d).saturating_sub(4))]
}

/// Lengths: a few bytes, or up to three chunks.
fn length() -> impl Strategy<Value = u64> {
    prop_oneof![1..64u64, 1..3 * CHUNK]
}

fn op() -> impl Strategy<Value = Op> {
    let (c, h, file) = (0..2usize, 0..MAX_HANDLES, 0..FILES);
    let mode = prop::sample::select(MODES.map(|(m, _)| m).to_vec());
    prop_oneof![
        5 => (c.clone(), file.clone()).prop_map(|(c, file)| Op::Open { c, file }),
        2 => (c.clone(), h.clone()).prop_map(|(c, h)| Op::Close { c, h }),
        6 => (c.clone(), h.clone(), offset(), length(), any::<u32>())
            .prop_map(|(c, h, offset, len, seed)| Op::Write { c, h, offset, len, seed }),
        6 => (c.clone(), h.clone(), offset(), length()).prop_map(|(c, h, offset, len)| Op::Read { c, h, offset, len }),
        1 => (c.clone(), h.clone()).prop_map(|(c, h)| Op::Fsync { c, h }),
        1 => (c.clone(), h.clone(), offset()).prop_map(|(c, h, size)| Op::Truncate { c, h, size }),
        1 => (c.clone(), h, offset(), length(), mode)
            .prop_map(|(c, h, offset, len, mode)| Op::Fallocate { c, h, offset, len, mode }),
        1 => (c.clone(), file.clone(), file.clone(), any::<bool>())
            .prop_map(|(c, from, to, exchange)| Op::Rename { c, from, to, exchange }),
        1 => (c, file).prop_map(|(c, file)| Op::Unlink { c, file }),
    ]
}

/// The byte a write with `seed` puts at file offset `at`: differs from its neighbours,
/// from the same write's bytes elsewhere and from other writes' bytes at the same
/// offset (splitmix64 of both).
fn pattern_byte(seed: u32, at: u64) -> u8 {
    let mut x = at ^ (u64::from(seed) << 40) ^ 0x9E37_79B9_7F4A_7C15;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u8
}

fn pattern(seed: u32, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len).map(|at| pattern_byte(seed, at)).collect()
}

/// A file of the model.
struct File {
    ino: InodeId,
    /// What an open now sees: the content as last committed (close, fsync, truncate,
    /// fallocate) by either client.
    committed: Vec<u8>,
    /// What each client's handles of the file read: empty while it has none open; one
    /// content when it knows exactly; several when the other client committed since
    /// this one opened (close-to-open: it may read its old view or the newer one).
    views: [Vec<Vec<u8>>; 2],
    /// The client holding writes not yet committed.
    dirty: Option<usize>,
}

impl File {
    /// Whether client `c` may change the file: it knows the content exactly and the other
    /// client holds no uncommitted writes.
    fn writable_by(&self, c: usize) -> bool {
        self.views[c].len() == 1 && self.dirty.is_none_or(|d| d == c)
    }

    /// The content client `c` sees (it may change the file).
    fn view(&mut self, c: usize) -> &mut Vec<u8> {
        &mut self.views[c][0]
    }

    /// Client `c` committed: its view is what an open sees; the other client's handles
    /// may see it too.
    fn commit(&mut self, c: usize) {
        if self.dirty.take_if(|d| *d == c).is_none() {
            return;
        }
        self.committed = self.views[c][0].clone();
        let other = &mut self.views[1 - c];
        if !other.is_empty() && !other.contains(&self.committed) {
            other.push(self.committed.clone());
        }
    }
}

/// The model: files, which name holds which, each client's open handles.
#[derive(Default)]
struct Model {
    files: Vec<File>,
    names: [Option<usize>; FILES],
    /// Per client: (file, handle) in the order opened.
    handles: [Vec<(usize, u64)>; 2],
}

impl Model {
    /// The handle `h` picks of client `c`'s: its index in `handles[c]`.
    fn pick(&self, c: usize, h: usize) -> Option<usize> {
        let open = self.handles[c].len();
        (open > 0).then(|| h % open)
    }
}

fn name(file: usize) -> Vec<u8> {
    format!("f{file}").into_bytes()
}

fn read_write() -> OpenOptions {
    OpenOptions { truncate: false, access: OpenAccess { read: true, write: true } }
}

/// `model[offset..offset + len]`, cut at its end.
fn slice(model: &[u8], offset: u64, len: u64) -> &[u8] {
    let from = (offset as usize).min(model.len());
    let to = (offset.saturating_add(len) as usize).min(model.len());
    &model[from..to]
}

/// Where `got` first differs from `want` (which starts at file offset `offset`).
fn difference(got: &[u8], want: &[u8], offset: u64) -> String {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => format!(
            "first difference at file offset {}: got {:#04x}, want {:#04x} ({} bytes read, {} wanted)",
            offset + i as u64,
            got[i],
            want[i],
            got.len(),
            want.len()
        ),
        None => format!("{} bytes read, {} wanted", got.len(), want.len()),
    }
}

/// Fails with `why` unless `ok`.
fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// A case's two clients and its directory.
struct Clients {
    vfs: [Arc<Vfs>; 2],
    dir: InodeId,
}

impl Clients {
    /// Runs `op` on the clients and the model; `Ok(false)` when it does not apply.
    async fn apply(&self, m: &mut Model, op: &Op) -> Result<bool, String> {
        let fail = |e: client::VfsError| e.to_string();
        match *op {
            Op::Open { c, file } => {
                if m.handles[c].len() >= MAX_HANDLES {
                    return Ok(false);
                }
                let vfs = &self.vfs[c];
                match m.names[file] {
                    Some(id) => {
                        let attr = vfs.lookup(self.dir, &name(file)).await.map_err(fail)?;
                        let f = &mut m.files[id];
                        ensure(attr.ino == f.ino, || format!("f{file} is inode {}, not {}", attr.ino, f.ino))?;
                        let sizes: Vec<u64> = match f.views[c].as_slice() {
                            [] => vec![f.committed.len() as u64],
                            views => views.iter().map(|v| v.len() as u64).collect(),
                        };
                        ensure(sizes.contains(&attr.size), || {
                            format!("f{file} has size {}, not {sizes:?}", attr.size)
                        })?;
                        let (fh, _) = vfs.open(f.ino, read_write()).await.map_err(fail)?;
                        if f.views[c].is_empty() {
                            f.views[c] = vec![f.committed.clone()];
                        }
                        m.handles[c].push((id, fh));
                    }
                    None => {
                        match vfs.lookup(self.dir, &name(file)).await {
                            Err(e) if e.code == ErrorCode::NotFound => {}
                            Err(e) => return Err(e.to_string()),
                            Ok(attr) => return Err(format!("f{file} is gone, yet found as inode {}", attr.ino)),
                        }
                        let (attr, fh) =
                            vfs.create_open(self.dir, &name(file), 0o644, 0, true, read_write()).await.map_err(fail)?;
                        ensure(attr.size == 0, || format!("new f{file} has size {}", attr.size))?;
                        let mut views: [Vec<Vec<u8>>; 2] = Default::default();
                        views[c].push(Vec::new());
                        m.files.push(File { ino: attr.ino, committed: Vec::new(), views, dirty: None });
                        m.names[file] = Some(m.files.len() - 1);
                        m.handles[c].push((m.files.len() - 1, fh));
                    }
                }
            }
            Op::Close { c, h } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, fh) = m.handles[c].remove(i);
                self.vfs[c].release(fh).await.map_err(fail)?;
                let f = &mut m.files[id];
                f.commit(c);
                if !m.handles[c].iter().any(|(other, _)| *other == id) {
                    f.views[c].clear();
                }
            }
            Op::Write { c, h, offset, len, seed } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, fh) = m.handles[c][i];
                let f = &mut m.files[id];
                if !f.writable_by(c) {
                    return Ok(false);
                }
                let data = pattern(seed, offset, len);
                let written = self.vfs[c].write(fh, offset, &data).await.map_err(fail)?;
                ensure(u64::from(written) == len, || format!("wrote {written} of {len} bytes"))?;
                let view = f.view(c);
                let end = (offset + len) as usize;
                if view.len() < end {
                    view.resize(end, 0);
                }
                view[offset as usize..end].copy_from_slice(&data);
                f.dirty = Some(c);
            }
            Op::Read { c, h, offset, len } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, fh) = m.handles[c][i];
                let got = self.vfs[c].read(fh, offset, len as u32).await.map_err(fail)?;
                let views = &m.files[id].views[c];
                if !views.iter().any(|v| got == slice(v, offset, len)) {
                    let seen = if views.len() > 1 { " (against its old view)" } else { "" };
                    return Err(format!(
                        "read differs{seen}: {}",
                        difference(&got, slice(&views[0], offset, len), offset)
                    ));
                }
            }
            Op::Fsync { c, h } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, fh) = m.handles[c][i];
                self.vfs[c].fsync(fh).await.map_err(fail)?;
                m.files[id].commit(c);
            }
            Op::Truncate { c, h, size } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, _) = m.handles[c][i];
                let f = &mut m.files[id];
                if !f.writable_by(c) {
                    return Ok(false);
                }
                let set = AttrChanges { size: Some(size), ..AttrChanges::default() };
                let attr = self.vfs[c].setattr(f.ino, set, true).await.map_err(fail)?;
                ensure(attr.size == size, || format!("truncated to {size}, size is {}", attr.size))?;
                f.view(c).resize(size as usize, 0);
                f.dirty = Some(c);
                f.commit(c);
            }
            Op::Fallocate { c, h, offset, len, mode } => {
                let Some(i) = m.pick(c, h) else { return Ok(false) };
                let (id, fh) = m.handles[c][i];
                let f = &mut m.files[id];
                if !f.writable_by(c) {
                    return Ok(false);
                }
                self.vfs[c].fallocate(fh, offset, len, mode).await.map_err(fail)?;
                let view = f.view(c);
                let end = (offset + len) as usize;
                let grow = matches!(mode, AllocateMode::Extend | AllocateMode::ZeroRange);
                if grow && view.len() < end {
                    view.resize(end, 0);
                }
                if matches!(mode, AllocateMode::PunchHole | AllocateMode::ZeroRange) {
                    let to = end.min(view.len());
                    let from = (offset as usize).min(to);
                    view[from..to].fill(0);
                }
                f.dirty = Some(c);
                f.commit(c);
            }
            Op::Rename { c, from, to, exchange } => {
                let Some(moved) = m.names[from].filter(|_| from != to) else { return Ok(false) };
                if exchange && m.names[to].is_none() {
                    return Ok(false);
                }
                let mode = if exchange { RenameMode::Exchange } else { RenameMode::Replace };
                self.vfs[c].rename(self.dir, &name(from), self.dir, &name(to), mode).await.map_err(fail)?;
                m.names[from] = if exchange { m.names[to] } else { None };
                m.names[to] = Some(moved);
            }
            Op::Unlink { c, file } => {
                let unlinked = self.vfs[c].unlink(self.dir, &name(file)).await;
                match (m.names[file].take(), unlinked) {
                    (Some(_), Ok(())) => {}
                    (None, Err(e)) if e.code == ErrorCode::NotFound => {}
                    (None, Ok(())) => return Err(format!("unlinked f{file}, which is not there")),
                    (_, Err(e)) => return Err(e.to_string()),
                }
            }
        }
        Ok(true)
    }

    /// Closes every handle, then checks through both clients that exactly the model's
    /// names hold exactly the model's bytes.
    async fn check_closed(&self, m: &mut Model) -> Result<(), String> {
        let fail = |e: client::VfsError| e.to_string();
        for c in 0..2 {
            for (id, fh) in std::mem::take(&mut m.handles[c]) {
                self.vfs[c].release(fh).await.map_err(fail)?;
                m.files[id].commit(c);
            }
        }
        for (c, vfs) in self.vfs.iter().enumerate() {
            let dh = vfs.opendir(self.dir).await.map_err(fail)?;
            let listed = vfs.readdir(dh, 0, false, 1000).await.map_err(fail);
            vfs.releasedir(dh);
            let mut listed: Vec<Vec<u8>> = listed?.1.into_iter().map(|e| e.name).filter(|n| n[0] != b'.').collect();
            listed.sort();
            let want: Vec<Vec<u8>> = (0..FILES).filter(|f| m.names[*f].is_some()).map(name).collect();
            ensure(listed == want, || format!("client {c} lists {listed:?}, not {want:?}"))?;
            for (file, id) in m.names.iter().enumerate() {
                let Some(id) = *id else { continue };
                let want = &m.files[id].committed;
                let attr = vfs.lookup(self.dir, &name(file)).await.map_err(fail)?;
                ensure(attr.size == want.len() as u64, || {
                    format!("after closing, client {c} sees f{file} of size {}, not {}", attr.size, want.len())
                })?;
                let (fh, _) = vfs.open(attr.ino, read_write()).await.map_err(fail)?;
                let got = vfs.read(fh, 0, want.len() as u32 + 10).await.map_err(fail);
                vfs.release(fh).await.map_err(fail)?;
                let got = got?;
                ensure(got == want[..], || {
                    format!("after closing, client {c} reads f{file}: {}", difference(&got, want, 0))
                })?;
            }
        }
        Ok(())
    }
}

/// The metadata store a model test runs against.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

/// `LOCUS_MODEL_<var>` as a number, or `default`.
fn setting(var: &str, default: u32) -> u32 {
    let var = format!("LOCUS_MODEL_{var}");
    std::env::var(&var).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{var}={v:?} is not a number")))
}

/// Runs `ops` as one case: two new clients in a new directory.
async fn run_case(env: &Env, ops: &[Op]) -> Result<(), String> {
    let trace = std::env::var_os("LOCUS_MODEL_TRACE").is_some();
    let config = ClientConfig {
        meta_addr: env.meta_addr.clone(),
        chunk_size: CHUNK,
        max_dirty_bytes: 4 * CHUNK as usize,
        // A cache of a few chunks: reads go back to the node, not just to memory.
        cache_bytes: 8 * CHUNK as usize,
        ..ClientConfig::default()
    };
    let vfs = [connect_with(config.clone()).await, connect_with(config).await];
    let case = env.cases.fetch_add(1, Ordering::Relaxed);
    let dir = vfs[0].create(ROOT_INODE, format!("case{case}").as_bytes(), NewNode::Dir, 0o755, 0, true).await;
    let clients = Clients { dir: dir.map_err(|e| e.to_string())?.ino, vfs };
    let mut model = Model::default();
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        let t0 = std::time::Instant::now();
        let applied = match tokio::time::timeout(OP_TIMEOUT, clients.apply(&mut model, op)).await {
            Ok(applied) => applied,
            Err(_) => Err(format!("no answer in {OP_TIMEOUT:?}")),
        };
        if trace {
            let outcome = applied.as_ref().map_or("failed", |a| if *a { "ok" } else { "skipped" });
            eprintln!("{i:3} {op}: {outcome} ({:?})", t0.elapsed());
        }
        if let Err(e) = applied {
            result = Err(format!("op {i} ({op}): {e}"));
            break;
        }
    }
    if result.is_ok() {
        result = match tokio::time::timeout(OP_TIMEOUT * 4, clients.check_closed(&mut model)).await {
            Ok(checked) => checked.map_err(|e| format!("after the last op: {e}")),
            Err(_) => Err("closing and checking hung".into()),
        };
    }
    for vfs in &clients.vfs {
        vfs.shutdown().await;
    }
    result
}

/// The model test on `backend`: `LOCUS_MODEL_REPLAY`'s case, or random cases.
fn model_test(backend: Backend) {
    let env = Env::start(backend);
    if let Ok(text) = std::env::var("LOCUS_MODEL_REPLAY") {
        return replay_on(&env, &text);
    }
    let config = Config {
        cases: setting("CASES", 200),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..Config::default()
    };
    let max_ops = setting("OPS", 80) as usize;
    // Each client opens a file first: ops on handles have something to work on.
    let first = (0..FILES, 0..FILES).prop_map(|(a, b)| vec![Op::Open { c: 0, file: a }, Op::Open { c: 1, file: b }]);
    let cases = (first, prop::collection::vec(op(), 1..=max_ops.saturating_sub(2).max(1)))
        .prop_map(|(first, ops)| Ops([first, ops].concat()));
    let result = TestRunner::new(config)
        .run(&cases, |Ops(ops)| env.rt.block_on(run_case(&env, &ops)).map_err(TestCaseError::fail));
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => panic!(
            "the Vfs on {backend:?} differs from the model: {why}\nreplay the {} ops with\n  {ops:?} cargo test -p \
             testkit --test vfs_model vfs_model_{}",
            ops.0.len(),
            format!("{backend:?}").to_lowercase()
        ),
        Err(TestError::Abort(why)) => panic!("the model test on {backend:?} gave up: {why}"),
    }
}

fn replay_on(env: &Env, text: &str) {
    let Ops(ops) = text.parse().unwrap_or_else(|e| panic!("LOCUS_MODEL_REPLAY: {e}"));
    if let Err(e) = env.rt.block_on(run_case(env, &ops)) {
        panic!("replayed case fails on {:?}: {e}", env.backend);
    }
}

/// Runs the case `text` (as printed by a failure) once on `backend`.
fn replay(backend: Backend, text: &str) {
    replay_on(&Env::start(backend), text);
}

#[test]
fn vfs_model_sqlite() {
    model_test(Backend::Sqlite);
}

#[test]
fn vfs_model_postgres() {
    model_test(Backend::Postgres);
}

/// Cases the model test once failed on, kept as they were printed.
#[test]
fn vfs_model_replays_known_cases() {
    // A read across the end of a write that spans chunks (the old model's only
    // recorded failure), under a second client's open handle.
    replay(
        Backend::Sqlite,
        "c0 open f0; c1 open f0; c0 write h0 161599+135746 s1; c0 read h0 191460+70685; c0 close h0",
    );
}

/// A meta (over `backend`) and a node, on loopback, for as long as it lives.
struct Env {
    // Dropped first: meta and node stop before their database and files go.
    rt: tokio::runtime::Runtime,
    meta_addr: String,
    backend: Backend,
    /// Directories made by model cases so far (`case0`, ...).
    cases: AtomicU64,
    _dir: tempfile::TempDir,
    _postgres: Option<testkit::postgres::PgServer>,
}

/// The environment of the focused tests below: one meta (SQLite) and one node for all of
/// them, each test in files of its own.
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| Env::start(Backend::Sqlite))
}

impl Env {
    fn start(backend: Backend) -> Env {
        // Meta, node and clients share this process and so one certificate: the
        // node's (its name is the node id meta checks at registration).
        static TLS: Once = Once::new();
        TLS.call_once(|| {
            let ca = net::pki::Ca::create("vfs model").unwrap();
            let cert = ca.issue(net::Role::Node, "n0", "default", 1).unwrap();
            let tls = net::Tls::from_pem(ca.cert_pem().as_bytes(), cert.cert_pem.as_bytes(), cert.key_pem.as_bytes());
            net::secure(net::Security::Tls(Arc::new(tls.unwrap())));
        });
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (postgres, db_url) = match backend {
            Backend::Sqlite => (None, dir.path().join("meta.db").display().to_string()),
            Backend::Postgres => {
                let server = testkit::postgres::PgServer::start();
                let url = server.create_database();
                (Some(server), url)
            }
        };
        let meta_addr = rt.block_on(async {
            let config = meta::MetaConfig {
                db_url,
                read_db_url: None,
                init: true,
                heartbeat: Duration::from_secs(2),
                session_expiry: Duration::from_secs(30),
                primary_lease: None,
                metadata_rpo: None,
                db_timeout: meta::DEFAULT_DB_TIMEOUT,
                audit_log: None,
                root_policy: None,
                forward_writes_to: None,
                homes: Vec::new(),
                sites: Vec::new(),
                site: None,
                auto_move: Default::default(),
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
        Env { rt, meta_addr, backend, cases: AtomicU64::new(0), _dir: dir, _postgres: postgres }
    }
}

/// A client of the focused tests: 64 KiB chunks, so that a few hundred KiB span many
/// chunks and extents.
async fn connect(meta_addr: &str) -> Arc<Vfs> {
    let config = ClientConfig {
        meta_addr: meta_addr.into(),
        chunk_size: 64 << 10,
        max_dirty_bytes: 256 << 10,
        ..ClientConfig::default()
    };
    connect_with(config).await
}

/// A client, once the node has registered with meta.
async fn connect_with(config: ClientConfig) -> Arc<Vfs> {
    for _ in 0..100 {
        let vfs = Vfs::connect(config.clone()).await.unwrap();
        if vfs.statfs().await.unwrap().capacity_bytes > 0 {
            return vfs;
        }
        vfs.shutdown().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the node never registered");
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

/// A request in a session meta forgot (it expired while the client was out of reach, as
/// across a failover) is sent again in a new session, instead of failing as if the file
/// were missing (ENOENT, before).
#[test]
fn a_session_meta_forgot_is_replaced_by_the_next_request() {
    let env = env();
    env.rt.block_on(async {
        let purpose = "a forgotten session";
        let config =
            ClientConfig { meta_addr: env.meta_addr.clone(), purpose: purpose.into(), ..ClientConfig::default() };
        let vfs = connect_with(config).await;
        let attr = vfs.create(ROOT_INODE, b"forgotten-session", NewNode::File, 0o644, 0, true).await.unwrap();
        let meta = net::RpcClient::connect(&env.meta_addr, 1, Duration::from_secs(10)).await.unwrap();
        let before = sessions_for(&meta, purpose).await;
        assert_eq!(before.len(), 1, "{before:?}");
        meta.ask(proto::meta::Goodbye { session: before[0] }).await.unwrap().unwrap();

        let (fh, _) = vfs.open(attr.ino, read_write()).await.expect("an open in a forgotten session");
        vfs.write(fh, 0, b"written in the new session").await.unwrap();
        vfs.fsync(fh).await.unwrap();
        vfs.release(fh).await.unwrap();
        let after = sessions_for(&meta, purpose).await;
        assert!(after.len() == 1 && after != before, "one new session: {before:?} then {after:?}");
        vfs.shutdown().await;
    });
}

/// The sessions meta has for clients of `purpose`.
async fn sessions_for(meta: &net::RpcClient, purpose: &str) -> Vec<u64> {
    let status = meta.ask(proto::meta::Status {}).await.unwrap().unwrap();
    status.sessions.into_iter().filter(|(_, info, _)| info.purpose == purpose).map(|(id, ..)| id).collect()
}
