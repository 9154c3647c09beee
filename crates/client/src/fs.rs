//! The path-based API for programs that link Locus instead of mounting it (the Python
//! package is one): `Client` resolves paths and calls the same `Vfs` the FUSE mount
//! uses, so it keeps the mount's consistency (close-to-open, read-your-writes), its
//! security (the process's certificate, the caller's uid and groups, `locus login`
//! tokens) and its site-local data path (site nodes, site cache, policies).
//!
//! Paths are absolute within the namespace (`/a/b`; a relative one counts from the
//! root), never follow symlinks (as `lstat`, `unlink`), and name directories through a
//! cache kept for `ClientConfig::attr_ttl`, as the kernel keeps its dentries for a mount:
//! another client's rename of a directory may go unseen for that long.

use crate::error::VfsError;
use crate::vfs::{ClientConfig, FileHandle, OpenOptions, Vfs};
use bytes::Bytes;
use proto::error::ErrorCode;
use proto::meta::{AllocateMode, AttrChanges, LockKind, LockRange, NewNode, OpenAccess, RenameMode, XattrMode};
use proto::types::{Attr, Caller, FileKind, InodeId, ROOT_INODE};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use util::sync::lock;

type Result<T> = std::result::Result<T, VfsError>;

/// Largest read asked of the `Vfs` at once (a larger one is split).
const MAX_READ: u32 = 8 << 20;

/// Entries asked for per page while listing a directory.
const LIST_PAGE: usize = 4096;

/// Directories remembered by path (beyond it the cache starts afresh).
const MAX_DIRS: usize = 65_536;

/// A connection to a Locus namespace, acting for the calling process's user.
pub struct Client {
    vfs: Arc<Vfs>,
    caller: Caller,
    /// Directories by path (`/a/b`), with when they were looked up.
    dirs: Mutex<HashMap<String, (InodeId, Instant)>>,
}

/// How `Client::open` opens a file (as `open(2)`'s flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    /// Create the file if it does not exist (`O_CREAT`), with `Client::open`'s mode.
    pub create: bool,
    /// With `create`: fail with EEXIST if it exists (`O_EXCL`).
    pub exclusive: bool,
    /// Cut it to 0 bytes (`O_TRUNC`).
    pub truncate: bool,
    /// Every write goes to the end (`O_APPEND`).
    pub append: bool,
}

impl OpenMode {
    /// The mode of a Python-style mode string: `r`, `w`, `a`, `x`, each with an
    /// optional `+` (`b` and `t` are accepted and mean nothing here).
    pub fn parse(mode: &str) -> Result<OpenMode> {
        let bad = || VfsError::new(ErrorCode::InvalidArgument, format!("open mode {mode:?} is not r, w, a or x[+][b]"));
        let plus = mode.contains('+');
        if mode.chars().any(|c| !"rwaxbt+".contains(c)) {
            return Err(bad());
        }
        let base: Vec<char> = mode.chars().filter(|c| "rwax".contains(*c)).collect();
        let rw = |read, write| OpenMode { read: read || plus, write: write || plus, ..OpenMode::default() };
        Ok(match base.as_slice() {
            ['r'] => rw(true, false),
            ['w'] => OpenMode { create: true, truncate: true, ..rw(false, true) },
            ['a'] => OpenMode { create: true, append: true, ..rw(false, true) },
            ['x'] => OpenMode { create: true, exclusive: true, ..rw(false, true) },
            _ => return Err(bad()),
        })
    }
}

/// One directory entry as `Client::list` returns it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub attr: Attr,
}

impl Client {
    /// Connects to meta as `config` says (the process's TLS identity must be installed
    /// first, as for a mount) and acts for the process's own uid, gid and groups.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        let vfs = Vfs::connect(config).await?;
        Ok(Client { vfs, caller: process_caller(), dirs: Mutex::default() })
    }

    /// The `Vfs` underneath, for what the path API does not cover.
    pub fn vfs(&self) -> &Arc<Vfs> {
        &self.vfs
    }

    /// Ends the session (dropping its locks); open files should be closed first.
    pub async fn shutdown(&self) {
        self.vfs.shutdown().await;
    }

    /// Runs `work` for this process's user.
    async fn acting<T>(&self, work: impl Future<Output = Result<T>>) -> Result<T> {
        crate::acting_as(self.caller.clone(), work).await
    }

    /// The attributes of `path` (not following a symlink at its end).
    pub async fn stat(&self, path: &str) -> Result<Attr> {
        self.acting(async {
            match split(path)? {
                None => self.vfs.getattr(ROOT_INODE).await,
                Some((parent, name)) => {
                    let dir = self.dir(&parent).await?;
                    self.vfs.lookup(dir, name.as_bytes()).await
                }
            }
        })
        .await
    }

    /// Every entry of directory `path` but `.` and `..`, with its attributes.
    pub async fn list(&self, path: &str) -> Result<Vec<Entry>> {
        self.acting(async {
            let ino = self.dir(&normalize(path)?).await?;
            let dh = self.vfs.opendir(ino).await?;
            let mut out = Vec::new();
            let mut after = 0;
            let listed = loop {
                match self.vfs.readdir(dh, after, true, LIST_PAGE).await {
                    Err(e) => break Err(e),
                    Ok((_, page)) if page.is_empty() => break Ok(()),
                    Ok((_, page)) => {
                        after = page.last().map_or(after, |e| e.cookie);
                        out.extend(
                            page.into_iter()
                                .filter(|e| e.name != b"." && e.name != b"..")
                                .map(|e| Entry { name: String::from_utf8_lossy(&e.name).into_owned(), attr: e.attr }),
                        );
                    }
                }
            };
            self.vfs.releasedir(dh);
            listed.map(|()| out)
        })
        .await
    }

    /// Makes directory `path` with `mode` (before the process's umask).
    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Attr> {
        self.make(path, NewNode::Dir, mode).await
    }

    /// Makes a symlink at `path` pointing at `target`.
    pub async fn symlink(&self, target: &str, path: &str) -> Result<Attr> {
        self.make(path, NewNode::Symlink { target: target.as_bytes().to_vec() }, 0o777).await
    }

    async fn make(&self, path: &str, node: NewNode, mode: u32) -> Result<Attr> {
        self.acting(async {
            let (parent, name) = must_split(path)?;
            let dir = self.dir(&parent).await?;
            self.vfs.create(dir, name.as_bytes(), node, mode, umask(), true).await
        })
        .await
    }

    /// Where symlink `path` points.
    pub async fn readlink(&self, path: &str) -> Result<String> {
        let attr = self.stat(path).await?;
        let target = self.acting(self.vfs.readlink(attr.ino)).await?;
        Ok(String::from_utf8_lossy(&target).into_owned())
    }

    /// Removes the file, symlink or special file at `path`.
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.acting(async {
            let (parent, name) = must_split(path)?;
            let dir = self.dir(&parent).await?;
            self.vfs.unlink(dir, name.as_bytes()).await
        })
        .await
    }

    /// Removes the empty directory at `path`.
    pub async fn rmdir(&self, path: &str) -> Result<()> {
        let path = normalize(path)?;
        self.acting(async {
            let (parent, name) = must_split(&path)?;
            let dir = self.dir(&parent).await?;
            self.vfs.rmdir(dir, name.as_bytes()).await
        })
        .await?;
        self.forget_under(&path);
        Ok(())
    }

    /// Renames `from` to `to`, replacing a file or empty directory there (`rename(2)`).
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        let from = normalize(from)?;
        self.acting(async {
            let ((from_parent, from_name), (to_parent, to_name)) = (must_split(&from)?, must_split(to)?);
            let (a, b) = (self.dir(&from_parent).await?, self.dir(&to_parent).await?);
            self.vfs.rename(a, from_name.as_bytes(), b, to_name.as_bytes(), RenameMode::Replace).await
        })
        .await?;
        self.forget_under(&from);
        self.forget_under(&normalize(to)?);
        Ok(())
    }

    /// Changes the permission bits of `path`.
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<Attr> {
        self.set(path, AttrChanges { mode: Some(mode), ..AttrChanges::default() }).await
    }

    /// Cuts or extends the file at `path` to `size` bytes.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<Attr> {
        self.set(path, AttrChanges { size: Some(size), ..AttrChanges::default() }).await
    }

    async fn set(&self, path: &str, changes: AttrChanges) -> Result<Attr> {
        let ino = self.stat(path).await?.ino;
        self.acting(self.vfs.setattr(ino, changes, false)).await
    }

    /// One extended attribute of `path`.
    pub async fn getxattr(&self, path: &str, name: &str) -> Result<Vec<u8>> {
        let ino = self.stat(path).await?.ino;
        self.acting(self.vfs.getxattr(ino, name.as_bytes())).await
    }

    /// Sets (creates or replaces) an extended attribute of `path`.
    pub async fn setxattr(&self, path: &str, name: &str, value: &[u8]) -> Result<()> {
        let ino = self.stat(path).await?.ino;
        self.acting(self.vfs.setxattr(ino, name.as_bytes(), value, XattrMode::Any)).await
    }

    /// The names of `path`'s extended attributes.
    pub async fn listxattr(&self, path: &str) -> Result<Vec<String>> {
        let ino = self.stat(path).await?.ino;
        let names = self.acting(self.vfs.listxattr(ino)).await?;
        Ok(names.into_iter().map(|n| String::from_utf8_lossy(&n).into_owned()).collect())
    }

    /// Removes an extended attribute of `path`.
    pub async fn removexattr(&self, path: &str, name: &str) -> Result<()> {
        let ino = self.stat(path).await?.ino;
        self.acting(self.vfs.removexattr(ino, name.as_bytes())).await
    }

    /// Opens the file at `path`; a created file gets `mode` (before the umask).
    pub async fn open(&self, path: &str, how: OpenMode, mode: u32) -> Result<OpenFile> {
        if !how.read && !how.write {
            return Err(VfsError::new(ErrorCode::InvalidArgument, "open for neither reading nor writing"));
        }
        let opts = OpenOptions { truncate: how.truncate, access: OpenAccess { read: how.read, write: how.write } };
        let (attr, fh) = self
            .acting(async {
                let (parent, name) = must_split(path)?;
                let dir = self.dir(&parent).await?;
                if how.create {
                    // An existing file is opened, and truncated under O_TRUNC, by `create_open`.
                    return self.vfs.create_open(dir, name.as_bytes(), mode, umask(), how.exclusive, opts).await;
                }
                let attr = self.vfs.lookup(dir, name.as_bytes()).await?;
                match attr.kind {
                    FileKind::Dir => return Err(VfsError::new(ErrorCode::IsDir, path.to_string())),
                    FileKind::File => {}
                    _ => {
                        return Err(VfsError::new(ErrorCode::InvalidArgument, format!("{path} is not a regular file")));
                    }
                }
                let (fh, _) = self.vfs.open(attr.ino, opts).await?;
                Ok((attr, fh))
            })
            .await?;
        Ok(OpenFile {
            vfs: self.vfs.clone(),
            caller: self.caller.clone(),
            fh: Some(fh),
            ino: attr.ino,
            pos: 0,
            append: how.append,
            access: opts.access,
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// The whole content of the file at `path`.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let mut file = self.open(path, OpenMode { read: true, ..OpenMode::default() }, 0).await?;
        let read = file.read_to_end().await;
        let closed = file.close().await;
        let bytes = read?;
        closed.map(|()| bytes)
    }

    /// Writes `data` as the whole content of the file at `path` (created with 0o644).
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let how = OpenMode { write: true, create: true, truncate: true, ..OpenMode::default() };
        let mut file = self.open(path, how, 0o644).await?;
        let written = file.write(data).await;
        let closed = file.close().await;
        written?;
        closed
    }

    /// The inode of directory `path` (normalized), from the cache while it is fresh.
    async fn dir(&self, path: &str) -> Result<InodeId> {
        if path == "/" {
            return Ok(ROOT_INODE);
        }
        let ttl = self.vfs.attr_ttl();
        if let Some((ino, at)) = lock(&self.dirs).get(path)
            && at.elapsed() < ttl
        {
            return Ok(*ino);
        }
        let (parent, name) = must_split(path)?;
        let parent = Box::pin(self.dir(&parent)).await?;
        let attr = self.vfs.lookup(parent, name.as_bytes()).await?;
        if attr.kind != FileKind::Dir {
            return Err(VfsError::new(ErrorCode::NotDir, path.to_string()));
        }
        let mut dirs = lock(&self.dirs);
        if dirs.len() >= MAX_DIRS {
            dirs.clear();
        }
        dirs.insert(path.to_string(), (attr.ino, Instant::now()));
        Ok(attr.ino)
    }

    /// Drops `path` and everything under it from the directory cache (it moved or went).
    fn forget_under(&self, path: &str) {
        let prefix = format!("{path}/");
        lock(&self.dirs).retain(|p, _| p != path && !p.starts_with(&prefix));
    }
}

/// An open file with a position, as `Client::open` returns it. Writes are buffered
/// and committed by `close` (or `fsync`): close it, or what was written may be lost.
pub struct OpenFile {
    vfs: Arc<Vfs>,
    caller: Caller,
    /// `None` once closed.
    fh: Option<FileHandle>,
    ino: InodeId,
    pos: u64,
    append: bool,
    access: OpenAccess,
    /// Where a file dropped unclosed is released.
    runtime: Option<tokio::runtime::Handle>,
}

impl OpenFile {
    fn handle(&self) -> Result<FileHandle> {
        self.fh.ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, "the file is closed"))
    }

    /// Another open file of the same file, with the same access and a position and
    /// read-ahead of its own: a second stream through the file (one per NBD connection).
    /// Writes buffered through either are the file's, committed by a sync of either.
    pub async fn reopen(&self) -> Result<OpenFile> {
        let opts = OpenOptions { truncate: false, access: self.access };
        let (fh, _) = crate::acting_as(self.caller.clone(), self.vfs.open(self.ino, opts)).await?;
        Ok(OpenFile {
            vfs: self.vfs.clone(),
            caller: self.caller.clone(),
            fh: Some(fh),
            ino: self.ino,
            pos: 0,
            append: self.append,
            access: self.access,
            runtime: tokio::runtime::Handle::try_current().ok(),
        })
    }

    /// Reads up to `len` bytes at the position and moves it past them (empty at the end).
    pub async fn read(&mut self, len: usize) -> Result<Bytes> {
        let bytes = self.read_at(self.pos, len).await?;
        self.pos += bytes.len() as u64;
        Ok(bytes)
    }

    /// Reads up to `len` bytes at `offset`, leaving the position alone.
    pub async fn read_at(&self, offset: u64, len: usize) -> Result<Bytes> {
        let fh = self.handle()?;
        let size = u32::try_from(len).unwrap_or(u32::MAX).min(MAX_READ);
        if len as u64 <= u64::from(size) {
            return crate::acting_as(self.caller.clone(), self.vfs.read(fh, offset, size)).await;
        }
        let mut out = Vec::with_capacity(len.min(1 << 30));
        while out.len() < len {
            let want = (len - out.len()).min(MAX_READ as usize) as u32;
            let part =
                crate::acting_as(self.caller.clone(), self.vfs.read(fh, offset + out.len() as u64, want)).await?;
            if part.is_empty() {
                break;
            }
            out.extend_from_slice(&part);
        }
        Ok(Bytes::from(out))
    }

    /// Everything from the position to the end.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let part = self.read(MAX_READ as usize).await?;
            if part.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&part);
        }
    }

    /// Writes all of `data` at the position (at the end in append mode) and moves the
    /// position past it.
    pub async fn write(&mut self, data: &[u8]) -> Result<usize> {
        if self.append {
            self.pos = self.size().await?;
        }
        let done = self.write_at(self.pos, data).await?;
        self.pos += done as u64;
        Ok(done)
    }

    /// Writes all of `data` at `offset`, leaving the position alone (`pwrite`): tasks
    /// sharing one open file (a block device's queue) write through it at once.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize> {
        let fh = self.handle()?;
        let mut done = 0;
        while done < data.len() {
            let part = &data[done..data.len().min(done + MAX_READ as usize)];
            let at = offset + done as u64;
            let n = crate::acting_as(self.caller.clone(), self.vfs.write(fh, at, part)).await? as usize;
            if n == 0 {
                return Err(VfsError::new(ErrorCode::Io, "a write wrote nothing"));
            }
            done += n;
        }
        Ok(done)
    }

    /// `fallocate(2)`: punches holes, zeroes or extends a range (after committing what
    /// was written, so the range's earlier writes cannot land after it).
    pub async fn allocate(&self, offset: u64, len: u64, mode: AllocateMode) -> Result<()> {
        let fh = self.handle()?;
        crate::acting_as(self.caller.clone(), self.vfs.fallocate(fh, offset, len, mode)).await
    }

    /// Takes a lock on the whole file for this open file (as `fcntl(F_SETLK)` over every
    /// byte: shared for readers, exclusive for a writer), held at meta and so seen at
    /// every site; fails with `WouldBlock` while another holds a conflicting one. A
    /// client that dies loses it when its session expires; `close` lets it go.
    pub async fn lock_whole(&self, exclusive: bool) -> Result<()> {
        let fh = self.handle()?;
        let kind = if exclusive { LockKind::Write } else { LockKind::Read };
        // The lock owner is the handle (unique within the client), which `close` and a
        // drop name when they let the file go.
        let lock = LockRange { ino: self.ino, owner: fh, start: 0, end: u64::MAX, kind, pid: std::process::id() };
        crate::acting_as(self.caller.clone(), self.vfs.setlk(fh, lock, false)).await
    }

    /// Moves the position (`std::io::SeekFrom`); returns the new one.
    pub async fn seek(&mut self, to: std::io::SeekFrom) -> Result<u64> {
        let (base, delta) = match to {
            std::io::SeekFrom::Start(at) => (0, at as i128),
            std::io::SeekFrom::Current(d) => (self.pos, d as i128),
            std::io::SeekFrom::End(d) => (self.size().await?, d as i128),
        };
        let at = base as i128 + delta;
        self.pos = u64::try_from(at)
            .map_err(|_| VfsError::new(ErrorCode::InvalidArgument, format!("seek to {at}, before the start")))?;
        Ok(self.pos)
    }

    /// The position.
    pub fn tell(&self) -> u64 {
        self.pos
    }

    /// The file's size as this client sees it (its own unflushed writes included).
    pub async fn size(&self) -> Result<u64> {
        Ok(crate::acting_as(self.caller.clone(), self.vfs.getattr(self.ino)).await?.size)
    }

    /// The file's attributes.
    pub async fn stat(&self) -> Result<Attr> {
        crate::acting_as(self.caller.clone(), self.vfs.getattr(self.ino)).await
    }

    /// Commits what was written and makes it durable.
    pub async fn fsync(&self) -> Result<()> {
        let fh = self.handle()?;
        crate::acting_as(self.caller.clone(), self.vfs.fsync(fh)).await
    }

    /// Commits what was written (other clients' opens see it from then on) and lets
    /// the file go; a second close does nothing.
    pub async fn close(&mut self) -> Result<()> {
        let Some(fh) = self.fh.take() else { return Ok(()) };
        let vfs = self.vfs.clone();
        crate::acting_as(self.caller.clone(), async move {
            let flushed = vfs.flush(fh, Some(fh)).await;
            let released = vfs.release(fh).await;
            flushed.and(released)
        })
        .await
    }
}

impl Drop for OpenFile {
    /// A file dropped open is closed in the background (its errors only logged).
    fn drop(&mut self) {
        let (Some(fh), Some(runtime)) = (self.fh.take(), self.runtime.take()) else { return };
        let (vfs, caller) = (self.vfs.clone(), self.caller.clone());
        runtime.spawn(crate::acting_as(caller, async move {
            if let Err(e) = vfs.flush(fh, Some(fh)).await.and(vfs.release(fh).await) {
                tracing::warn!("closing a file dropped open failed: {e}");
            }
        }));
    }
}

/// This process's user, as the kernel would report it to a mount.
fn process_caller() -> Caller {
    // SAFETY: getuid, getgid and getgroups only read this process's credentials; the
    // buffer is as long as the count passed.
    let (uid, gid, groups) = unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut()).max(0) as usize;
        let mut groups = vec![0 as libc::gid_t; n];
        let got = libc::getgroups(n as libc::c_int, groups.as_mut_ptr()).max(0) as usize;
        groups.truncate(got);
        (libc::getuid(), libc::getgid(), groups)
    };
    Caller { uid, gid, groups: groups.into_iter().filter(|g| *g != gid).collect() }
}

/// The process's umask, as `/proc/self/status` says it (setting it to read it back
/// would race with other threads' creates); 0o022 where it cannot be read.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:").map(|v| v.trim().to_string())))
        .and_then(|v| u32::from_str_radix(&v, 8).ok())
        .unwrap_or(0o022)
}

/// `path` as `/a/b`: absolute, no empty, `.` or trailing components; `..` is refused
/// (the namespace has no symlink-free meaning for it here).
fn normalize(path: &str) -> Result<String> {
    let mut out = String::new();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return Err(VfsError::new(ErrorCode::InvalidArgument, format!("{path}: `..` is not allowed")));
        }
        out.push('/');
        out.push_str(part);
    }
    Ok(if out.is_empty() { "/".into() } else { out })
}

/// The parent directory and last name of `path` (`None` for the root).
fn split(path: &str) -> Result<Option<(String, String)>> {
    let path = normalize(path)?;
    Ok(path
        .rsplit_once('/')
        .filter(|(_, name)| !name.is_empty())
        .map(|(parent, name)| (if parent.is_empty() { "/".to_string() } else { parent.to_string() }, name.to_string())))
}

/// Like `split`, refusing the root.
fn must_split(path: &str) -> Result<(String, String)> {
    split(path)?.ok_or_else(|| VfsError::new(ErrorCode::InvalidArgument, "the root has no parent"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_and_split() {
        assert_eq!(normalize("a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(normalize("").unwrap(), "/");
        assert!(normalize("/a/../b").is_err());
        assert_eq!(split("/").unwrap(), None);
        assert_eq!(split("/a").unwrap(), Some(("/".into(), "a".into())));
        assert_eq!(split("x/y/z").unwrap(), Some(("/x/y".into(), "z".into())));
        assert!(must_split("/").is_err());
    }

    #[test]
    fn python_modes_map_to_open_flags() {
        let m = |s| OpenMode::parse(s).unwrap();
        assert_eq!(m("rb"), OpenMode { read: true, ..OpenMode::default() });
        assert_eq!(m("w"), OpenMode { write: true, create: true, truncate: true, ..OpenMode::default() });
        assert_eq!(m("a+"), OpenMode { read: true, write: true, create: true, append: true, ..OpenMode::default() });
        assert_eq!(m("xb"), OpenMode { write: true, create: true, exclusive: true, ..OpenMode::default() });
        assert!(OpenMode::parse("rw").is_err() && OpenMode::parse("q").is_err() && OpenMode::parse("").is_err());
    }
}
