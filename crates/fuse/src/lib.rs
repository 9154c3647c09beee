//! The FUSE adapter: translates kernel requests into `client::Vfs` calls and replies,
//! mapping errors to errno. It holds no cache and no file system logic of its own;
//! each request runs as a task on the client's runtime so that slow requests never
//! hold up the kernel's queue.

use client::{OpenOptions, Vfs, VfsError};
use fuser::{
    AccessFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, MountOption, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, SessionUnmounter, TimeOrNow, WriteFlags,
};
use proto::meta::{
    AllocateMode, AttrChanges, LockKind, LockRange, NewNode, OpenAccess, RenameMode, TimeSet, XattrMode,
};
use proto::types::{Attr, Caller, FileKind, Timestamp};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::runtime::Handle;

/// How the kernel should treat the mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Let users other than the mounter in (permission checks still apply).
    pub allow_other: bool,
    /// How long the kernel may trust names and attributes (NFS-like `actimeo`).
    pub ttl: Duration,
    /// Kernel threads reading requests.
    pub threads: usize,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig { allow_other: true, ttl: Duration::from_secs(1), threads: 2 }
    }
}

struct LocusFs {
    vfs: Arc<Vfs>,
    rt: Handle,
    ttl: Duration,
    notifier: Arc<OnceLock<Notifier>>,
}

/// A live mount; unmount it (or let someone else) and `wait` for the session to end.
pub struct Mounted {
    unmounter: SessionUnmounter,
    session: std::thread::JoinHandle<std::io::Result<()>>,
}

impl Mounted {
    /// Unmounts; fails with EBUSY while a process uses the mount (see [`detach`]).
    pub fn unmount(&mut self) -> std::io::Result<()> {
        self.unmounter.unmount()
    }

    /// Whether the session ended (unmounted here or by someone else).
    pub fn is_finished(&self) -> bool {
        self.session.is_finished()
    }

    /// Waits for the session to end and returns how it ended.
    pub fn wait(self) -> std::io::Result<()> {
        self.session.join().map_err(|_| std::io::Error::other("FUSE session thread panicked"))?
    }
}

/// Detaches the mount at `mountpoint` lazily (MNT_DETACH): it leaves the namespace at
/// once and the kernel lets go of it when its last user does. This is how a busy mount
/// is stopped and how a dead one (its daemon gone: "Transport endpoint is not
/// connected") is cleared. Without root it asks `fusermount3 -u -z`.
pub fn detach(mountpoint: &Path) -> std::io::Result<()> {
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("mount point path contains a NUL byte"))?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EPERM) {
        return Err(err);
    }
    let status = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint).status()?;
    if status.success() { Ok(()) } else { Err(std::io::Error::other(format!("fusermount3 -u -z failed: {status}"))) }
}

/// Read-ahead the kernel is asked for on a Locus mount, in KiB: FUSE requests are at
/// most 1 MiB (`max_pages` 256), and the kernel offers only 128 KiB at init, which
/// holds a no-op FUSE file system to ~1.9 GB/s where 1 MiB allows ~3 GB/s.
pub const READ_AHEAD_KB: u32 = 1024;

/// Raises the read-ahead of the mount at `mountpoint` (its FUSE bdi in sysfs) to
/// `READ_AHEAD_KB`; the kernel ignores a larger `max_readahead` at init. Needs root;
/// the caller decides what a failure means. Stats the mount: call it once the session
/// serves requests.
pub fn raise_read_ahead(mountpoint: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let bdi = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    std::fs::write(bdi, READ_AHEAD_KB.to_string())
}

/// Mounts `vfs` at `mountpoint`; requests run on `rt`.
pub fn mount(vfs: Arc<Vfs>, rt: Handle, mountpoint: &Path, config: &MountConfig) -> std::io::Result<Mounted> {
    let notifier = Arc::new(OnceLock::new());
    let fs = LocusFs { vfs, rt, ttl: config.ttl, notifier: notifier.clone() };
    let mut options = Config::default();
    options.mount_options = vec![
        MountOption::FSName("locus".into()),
        MountOption::Subtype("locus".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    if config.allow_other {
        options.acl = SessionACL::All;
    }
    options.n_threads = Some(config.threads.max(1));
    options.clone_fd = config.threads > 1;
    let mut session = fuser::Session::new(fs, mountpoint, &options)?;
    let _ = notifier.set(session.notifier());
    let unmounter = session.unmount_callable();
    let session = std::thread::Builder::new().name("fuse".into()).spawn(move || session.run())?;
    Ok(Mounted { unmounter, session })
}

/// The errno for a failed `op`. Failures of the system itself (a dead or hung peer,
/// corruption, a broken invariant) are logged as warnings naming the operation; the
/// everyday answers (ENOENT, EEXIST, ...) only at debug level.
fn errno(op: &str, e: &VfsError) -> Errno {
    use proto::error::ErrorCode::*;
    match e.code {
        Io | Corrupt | Internal | TimedOut | Unreachable | NotReplicated | ReadOnly => {
            tracing::warn!(op, code = ?e.code, "{op} failed: {e}")
        }
        _ => tracing::debug!(op, code = ?e.code, "{op}: {e}"),
    }
    Errno::from_i32(e.errno())
}

fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + Duration::from_nanos(t.nanos as u64)
    }
}

/// Undoes fuser's decoding of a time the kernel sent (setattr). fuser 0.18 turns the
/// kernel's `{ sec: -2, nsec: 500_000_000 }` (-1.5 s) into `UNIX_EPOCH - 2.5 s`, i.e. it
/// subtracts the nanoseconds instead of adding them (see its `system_time_from_time`
/// TODO); so before the epoch the whole seconds and the nanoseconds of the distance
/// are exactly the kernel's `-sec` and `nsec`.
fn request_timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            Timestamp { secs: -(d.as_secs() as i64), nanos: d.subsec_nanos() }
        }
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// Who asks: uid and gid from the request, supplementary groups from
/// `/proc/PID/status` (FUSE passes only uid, gid and pid). Meta checks permissions
/// against all three.
fn caller(req: &Request) -> Caller {
    let (uid, gid) = (req.uid(), req.gid());
    let groups = if uid == 0 { Vec::new() } else { groups_of(req.pid()) };
    Caller { uid, gid, groups }
}

/// A process's supplementary groups; none if it is gone (or the kernel itself asks).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    parse_groups(&status)
}

/// The `Groups:` line of a `/proc/PID/status` text.
fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default()
}

/// What `open(2)` flags ask for: access mode and truncation.
fn open_options(flags: i32) -> OpenOptions {
    let mode = flags & libc::O_ACCMODE;
    let access = OpenAccess { read: mode != libc::O_WRONLY, write: mode != libc::O_RDONLY };
    OpenOptions { truncate: flags & libc::O_TRUNC != 0, access }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(request_timestamp(t)),
    }
}

/// The lock a getlk/setlk request describes; an unknown lock type is EINVAL.
fn lock_range(ino: INodeNo, owner: LockOwner, start: u64, end: u64, typ: i32, pid: u32) -> Result<LockRange, Errno> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    Ok(LockRange { ino: ino.0, owner: owner.0, start, end, kind, pid })
}

fn special_node(mode: u32, rdev: u32) -> Result<NewNode, Errno> {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => return Ok(NewNode::File),
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        libc::S_IFDIR => return Ok(NewNode::Dir),
        _ => return Err(Errno::EINVAL),
    };
    Ok(NewNode::Special { kind, rdev })
}

/// The two directory replies, filled by one listing (`LocusFs::list`).
trait Listing: Send + 'static {
    /// Whether entries carry attributes the kernel keeps (READDIRPLUS).
    const WITH_ATTRS: bool;
    /// The most entries a reply of one page (the kernel's usual listing buffer) holds:
    /// what one `Vfs::readdir` call hands over (a larger buffer takes several).
    const BATCH: usize;
    /// Adds an entry; true when the reply is full (the entry did not fit).
    fn push(&mut self, offset: u64, name: &OsStr, attr: &Attr, ttl: &Duration) -> bool;
    fn ok(self);
    fn error(self, e: Errno);
}

/// A `fuse_dirent` takes 24 bytes and the name, padded to 8: at least 32 bytes.
impl Listing for ReplyDirectory {
    const WITH_ATTRS: bool = false;
    const BATCH: usize = 4096 / 32;
    fn push(&mut self, offset: u64, name: &OsStr, attr: &Attr, _ttl: &Duration) -> bool {
        self.add(INodeNo(attr.ino), offset, file_type(attr.kind), name)
    }
    fn ok(self) {
        ReplyDirectory::ok(self)
    }
    fn error(self, e: Errno) {
        ReplyDirectory::error(self, e)
    }
}

/// For "." and ".." the kernel takes neither a name nor attributes (it links only the
/// other entries), so the directory's own attributes serve both.
impl Listing for ReplyDirectoryPlus {
    const WITH_ATTRS: bool = true;
    /// A `fuse_direntplus` is a 128-byte `fuse_entry_out` before the `fuse_dirent`.
    const BATCH: usize = 4096 / 160;
    fn push(&mut self, offset: u64, name: &OsStr, attr: &Attr, ttl: &Duration) -> bool {
        self.add(INodeNo(attr.ino), offset, name, ttl, &file_attr(attr), Generation(0))
    }
    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
    fn error(self, e: Errno) {
        ReplyDirectoryPlus::error(self, e)
    }
}

/// Requests that go to the runtime at once (`LocusFs::run`). A flush, fsync or
/// fallocate may cut, hash and upload buffered writes in its first poll; the others
/// were measured slower when polled first on fuser's thread: `read` 0.69x cold at bs=1M
/// (its answer waits for chunk reads anyway; bench/results/read-ab-polled-first.md),
/// `create` 0.92x and `release` 0.87x of the create rate (the commit then holds fuser's
/// thread; metadata-ab-create-polled-first.md, metadata-ab-release-polled-first.md).
/// A `write` is polled first: it buffers, and hashes a chunk only when the write fills
/// one (1.21x at bs=4k, 1.36x at 64k, 1.16x at 1M: write-ab-polled-first.md).
const ON_THE_RUNTIME: [&str; 6] = ["read", "flush", "release", "fsync", "fallocate", "create"];

impl LocusFs {
    /// Runs `work` and replies with `finish` (or the errno); `op` names the operation
    /// in the error log. Unless `op` is one of `ON_THE_RUNTIME`, `work` is first polled
    /// on fuser's thread, in the runtime's context: a request answered without waiting
    /// (meta in this process reading or committing its local database, an answer the
    /// client holds) is answered there, without the hand-off to the runtime and back (two
    /// thread wake-ups, most of a stat's cost); one that must wait continues on the
    /// runtime.
    fn run<T, F, R>(
        &self,
        req: &Request,
        op: &'static str,
        reply: R,
        work: F,
        finish: impl FnOnce(R, T) + Send + 'static,
    ) where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, VfsError>> + Send + 'static,
        R: ErrorReply + Send + 'static,
    {
        let who = caller(req);
        // One line per kernel request: `LOCUS_LOG=fuse=trace` counts them (bench/meta-profile.sh).
        tracing::trace!(op, "fuse request");
        let mut task = Box::pin(async move {
            match client::acting_as(who, work).await {
                Ok(v) => finish(reply, v),
                Err(e) => reply.fail(errno(op, &e)),
            }
        });
        if !ON_THE_RUNTIME.contains(&op) {
            let _runtime = self.rt.enter();
            // A future may be polled with another waker later: the runtime's, once spawned.
            if task.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_ready() {
                return;
            }
        }
        self.rt.spawn(task);
    }

    /// Fills a directory reply from the open directory `fh` at `offset`. Offsets: 1 is
    /// ".", 2 is "..", and an entry with cookie c sits at c + 2.
    fn list<L: Listing>(&self, req: &Request, fh: FileHandle, offset: u64, mut reply: L) {
        let (vfs, ttl) = (self.vfs.clone(), self.ttl);
        tracing::trace!(op = if L::WITH_ATTRS { "readdirplus" } else { "readdir" }, "fuse request");
        self.rt.spawn(client::acting_as(caller(req), async move {
            let mut after = offset.saturating_sub(2);
            let mut pushed = false;
            loop {
                let (dir, entries) = match vfs.readdir(fh.0, after, L::WITH_ATTRS, L::BATCH).await {
                    Ok(listed) => listed,
                    // What fits already stands; the next call meets the error again.
                    Err(_) if pushed => break,
                    Err(e) => return reply.error(errno("readdir", &e)),
                };
                if !pushed {
                    for (at, name) in [(1, "."), (2, "..")] {
                        if offset < at && reply.push(at, OsStr::new(name), &dir, &ttl) {
                            return reply.ok();
                        }
                    }
                }
                if entries.is_empty() {
                    break;
                }
                for e in entries {
                    if reply.push(e.cookie + 2, OsStr::from_bytes(&e.name), &e.attr, &ttl) {
                        return reply.ok();
                    }
                    after = e.cookie;
                    pushed = true;
                }
            }
            reply.ok()
        }));
    }

    fn entry(
        &self,
        req: &Request,
        op: &'static str,
        reply: ReplyEntry,
        work: impl std::future::Future<Output = Result<Attr, VfsError>> + Send + 'static,
    ) {
        let ttl = self.ttl;
        self.run(req, op, reply, work, move |r, a| r.entry(&ttl, &file_attr(&a), Generation(0)));
    }

    fn empty(
        &self,
        req: &Request,
        op: &'static str,
        reply: ReplyEmpty,
        work: impl std::future::Future<Output = Result<(), VfsError>> + Send + 'static,
    ) {
        self.run(req, op, reply, work, |r, ()| r.ok());
    }
}

/// Replies that can carry an errno.
trait ErrorReply {
    fn fail(self, e: Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => { $(impl ErrorReply for $t { fn fail(self, e: Errno) { self.error(e) } })* };
}
error_reply!(
    ReplyEntry,
    ReplyAttr,
    ReplyEmpty,
    ReplyData,
    ReplyOpen,
    ReplyWrite,
    ReplyCreate,
    ReplyStatfs,
    ReplyXattr,
    ReplyLock,
    ReplyDirectory
);

fn name(n: &OsStr) -> Vec<u8> {
    n.as_bytes().to_vec()
}

impl Filesystem for LocusFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let wanted = InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_BIG_WRITES
            // Listings carry attributes when the kernel will want them (`readdirplus`).
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            // POSIX ACLs: the kernel checks them too (from `getxattr`, cached) and leaves
            // the umask to meta, which applies it only where no default ACL decides.
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.entry(req, "lookup", reply, async move { vfs.lookup(parent.0, &n).await });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let (vfs, ttl) = (self.vfs.clone(), self.ttl);
        // A directory this client just changed: answered on this thread, as `flush`.
        if let Some(attr) = vfs.fresh_dir_attr(ino.0, ttl) {
            tracing::trace!(op = "getattr", inline = true, "fuse request");
            return reply.attr(&ttl, &file_attr(&attr));
        }
        self.run(req, "getattr", reply, async move { vfs.getattr(ino.0).await }, move |r, a| {
            r.attr(&ttl, &file_attr(&a))
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = AttrChanges {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        let (vfs, ttl) = (self.vfs.clone(), self.ttl);
        self.run(req, "setattr", reply, async move { vfs.setattr(ino.0, set, fh.is_some()).await }, move |r, a| {
            r.attr(&ttl, &file_attr(&a))
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let vfs = self.vfs.clone();
        self.run(req, "readlink", reply, async move { vfs.readlink(ino.0).await }, |r, t| r.data(&t));
    }

    fn mknod(&self, req: &Request, parent: INodeNo, n: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let node = match special_node(mode, rdev) {
            Ok(node) => node,
            Err(e) => return reply.error(e),
        };
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.entry(
            req,
            "mknod",
            reply,
            async move { vfs.create(parent.0, &n, node, mode & 0o7777, umask, true).await },
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, n: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.entry(req, "mkdir", reply, async move {
            vfs.create(parent.0, &n, NewNode::Dir, mode & 0o7777, umask, true).await
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.empty(req, "unlink", reply, async move { vfs.unlink(parent.0, &n).await });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.empty(req, "rmdir", reply, async move { vfs.rmdir(parent.0, &n).await });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link: &OsStr, target: &Path, reply: ReplyEntry) {
        let node = NewNode::Symlink { target: target.as_os_str().as_bytes().to_vec() };
        let (vfs, n) = (self.vfs.clone(), name(link));
        self.entry(req, "symlink", reply, async move { vfs.create(parent.0, &n, node, 0o777, 0, true).await });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            RenameMode::Exchange
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            RenameMode::NoReplace
        } else if flags.is_empty() {
            RenameMode::Replace
        } else {
            return reply.error(Errno::EINVAL);
        };
        let (vfs, n, nn) = (self.vfs.clone(), name(n), name(newname));
        self.empty(req, "rename", reply, async move { vfs.rename(parent.0, &n, newparent.0, &nn, mode).await });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (vfs, nn) = (self.vfs.clone(), name(newname));
        self.entry(req, "link", reply, async move { vfs.link(ino.0, newparent.0, &nn).await });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opts = open_options(flags.0);
        let (vfs, notifier) = (self.vfs.clone(), self.notifier.clone());
        self.run(req, "open", reply, async move { vfs.open(ino.0, opts).await }, move |r, (fh, keep)| {
            let flags = if keep {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                // Changed elsewhere since we last saw it: drop the kernel's size too.
                if let Some(n) = notifier.get() {
                    let _ = n.inval_inode(ino, 0, 0);
                }
                FopenFlags::empty()
            };
            r.opened(FileHandle(fh), flags)
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let vfs = self.vfs.clone();
        self.run(req, "read", reply, async move { vfs.read(fh.0, offset, size).await }, |r, d| r.data(&d));
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (vfs, data) = (self.vfs.clone(), data.to_vec());
        self.run(req, "write", reply, async move { vfs.write(fh.0, offset, &data).await }, |r, n| r.written(n));
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        // Every close sends one; most have nothing to commit (see bench/results/metadata-profile.txt).
        if self.vfs.flush_is_noop(fh.0, Some(owner.0)) {
            tracing::trace!(op = "flush", inline = true, "fuse request");
            return reply.ok();
        }
        let vfs = self.vfs.clone();
        self.empty(req, "flush", reply, async move { vfs.flush(fh.0, Some(owner.0)).await });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let vfs = self.vfs.clone();
        self.empty(req, "release", reply, async move { vfs.release(fh.0).await });
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let vfs = self.vfs.clone();
        self.empty(req, "fsync", reply, async move { vfs.fsync(fh.0).await });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let vfs = self.vfs.clone();
        self.run(req, "opendir", reply, async move { vfs.opendir(ino.0).await }, |r, dh| {
            r.opened(FileHandle(dh), FopenFlags::empty())
        });
    }

    fn readdir(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.list(req, fh, offset, reply);
    }

    /// `ls -l` and the like: names with their attributes, which the kernel keeps for
    /// the TTL as if it had looked each one up (one request per page of entries instead
    /// of a LOOKUP per name, each a round trip to meta, across the WAN at a distant site).
    fn readdirplus(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        self.list(req, fh, offset, reply);
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.vfs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let vfs = self.vfs.clone();
        self.empty(req, "fsyncdir", reply, async move { vfs.sync_meta().await });
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let vfs = self.vfs.clone();
        self.run(req, "statfs", reply, async move { vfs.statfs().await }, |r, s| {
            const BLOCK: u64 = 4096;
            let blocks = s.capacity_bytes / BLOCK;
            let free = s.capacity_bytes.saturating_sub(s.used_bytes) / BLOCK;
            r.statfs(blocks, free, free, s.inodes + (1 << 30), 1 << 30, BLOCK as u32, 255, BLOCK as u32)
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let (vfs, n, value) = (self.vfs.clone(), name(n), value.to_vec());
        self.empty(req, "setxattr", reply, async move { vfs.setxattr(ino.0, &n, &value, mode).await });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.run(req, "getxattr", reply, async move { vfs.getxattr(ino.0, &n).await }, move |r, v| sized(r, size, &v));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let vfs = self.vfs.clone();
        self.run(req, "listxattr", reply, async move { vfs.listxattr(ino.0).await }, move |r, names| {
            let mut buf = Vec::new();
            for n in names {
                buf.extend_from_slice(&n);
                buf.push(0);
            }
            sized(r, size, &buf)
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let (vfs, n) = (self.vfs.clone(), name(n));
        self.empty(req, "removexattr", reply, async move { vfs.removexattr(ino.0, &n).await });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions itself (default_permissions).
        reply.ok();
    }

    fn create(&self, req: &Request, parent: INodeNo, n: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let exclusive = flags & libc::O_EXCL != 0;
        let opts = open_options(flags);
        let (vfs, n, ttl) = (self.vfs.clone(), name(n), self.ttl);
        let work = async move { vfs.create_open(parent.0, &n, mode & 0o7777, umask, exclusive, opts).await };
        self.run(req, "create", reply, work, move |r, (attr, fh)| {
            r.created(&ttl, &file_attr(&attr), Generation(0), FileHandle(fh), FopenFlags::empty())
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let lock = match lock_range(ino, owner, start, end, typ, pid) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let vfs = self.vfs.clone();
        self.run(req, "getlk", reply, async move { vfs.getlk(lock).await }, move |r, conflict| match conflict {
            Some(l) => {
                let typ = if l.kind == LockKind::Read { libc::F_RDLCK } else { libc::F_WRLCK };
                r.locked(l.start, l.end, typ, l.pid)
            }
            None => r.locked(start, end, libc::F_UNLCK, 0),
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let lock = match lock_range(ino, owner, start, end, typ, pid) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let vfs = self.vfs.clone();
        self.empty(req, "setlk", reply, async move { vfs.setlk(fh.0, lock, sleep).await });
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mode = match mode {
            0 => AllocateMode::Extend,
            libc::FALLOC_FL_KEEP_SIZE => AllocateMode::KeepSize,
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => AllocateMode::PunchHole,
            libc::FALLOC_FL_ZERO_RANGE => AllocateMode::ZeroRange,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        let vfs = self.vfs.clone();
        self.empty(req, "fallocate", reply, async move { vfs.fallocate(fh.0, offset, length, mode).await });
    }

    /// No ioctl is implemented: ENOTTY is what a file that has none answers, and
    /// programs probe (Python's `open()` asks TCGETS) as a matter of course, so
    /// unlike fuser's default this logs nothing.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}

/// xattr replies: size 0 asks for the length; a too-small buffer is ERANGE.
fn sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32)
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supplementary_groups_come_from_proc_status() {
        let status = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nNSpid:\t5\n";
        assert_eq!(parse_groups(status), vec![4, 24, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(groups_of(std::process::id()), parse_groups(&own));
    }

    #[test]
    fn request_times_before_the_epoch_keep_their_nanoseconds() {
        // What fuser hands us for the kernel's { sec: -2, nsec: 500_000_000 } (-1.5 s).
        let t = UNIX_EPOCH - Duration::new(2, 500_000_000);
        assert_eq!(request_timestamp(t), Timestamp { secs: -2, nanos: 500_000_000 });
        let whole = UNIX_EPOCH - Duration::from_secs(3);
        assert_eq!(request_timestamp(whole), Timestamp { secs: -3, nanos: 0 });
        let after = UNIX_EPOCH + Duration::new(5, 7);
        assert_eq!(request_timestamp(after), Timestamp { secs: 5, nanos: 7 });
    }

    #[test]
    fn reply_times_round_trip_through_system_time() {
        let t = Timestamp { secs: -2, nanos: 500_000_000 };
        assert_eq!(UNIX_EPOCH.duration_since(time(t)).unwrap(), Duration::from_millis(1500));
    }
}
