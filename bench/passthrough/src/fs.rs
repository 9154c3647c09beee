//! The passthrough file system: each request becomes the same system call on the backing
//! directory. Inode numbers are the backing inode numbers (the backing root is inode 1); file
//! handles are raw backing file descriptors, read and written with pread/pwrite.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::Metadata;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One directory entry as listed at opendir: inode, type, name.
type DirEntry = (u64, FileType, OsString);

pub struct Passthrough {
    root: PathBuf,
    /// Backing inode number of `root`, reported as FUSE inode 1.
    root_ino: u64,
    ttl: Duration,
    /// FUSE inode -> backing path, filled by lookup/create/mkdir.
    paths: Mutex<HashMap<u64, PathBuf>>,
    /// Directory handle -> snapshot taken at opendir.
    dirs: Mutex<HashMap<u64, Vec<DirEntry>>>,
    next_dir: AtomicU64,
}

type Result<T> = std::result::Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn last_errno() -> Errno {
    errno(io::Error::last_os_error())
}

/// Turns a libc return value into a result.
fn check(ret: libc::c_int) -> Result<libc::c_int> {
    if ret < 0 { Err(last_errno()) } else { Ok(ret) }
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nanos as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nanos as u64)
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(TimeOrNow::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos().into() }
        }
    }
}

fn fstat(fd: libc::c_int) -> Result<Metadata> {
    // Going through /proc keeps the std Metadata type without an extra path lookup race.
    std::fs::metadata(format!("/proc/self/fd/{fd}")).map_err(errno)
}

thread_local! {
    /// Read buffer reused across requests on each FUSE thread.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Passthrough {
    pub fn new(root: PathBuf, ttl: Duration) -> io::Result<Self> {
        let root_ino = std::fs::metadata(&root)?.ino();
        let paths = Mutex::new(HashMap::from([(1, root.clone())]));
        Ok(Passthrough { root, root_ino, ttl, paths, dirs: Mutex::new(HashMap::new()), next_dir: AtomicU64::new(1) })
    }

    fn fuse_ino(&self, backing: u64) -> u64 {
        if backing == self.root_ino { 1 } else { backing }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf> {
        self.paths.lock().expect("paths lock").get(&ino.0).cloned().ok_or(Errno::ESTALE)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    fn attr(&self, m: &Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.fuse_ino(m.ino())),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: time(m.ctime(), m.ctime_nsec()),
            kind: kind(m.mode()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            // Same block size hint as Locus reports.
            blksize: 1 << 20,
            flags: 0,
        }
    }

    /// Records `path` under its inode number and returns its attributes.
    fn remember(&self, path: PathBuf, m: &Metadata) -> FileAttr {
        let attr = self.attr(m);
        self.paths.lock().expect("paths lock").insert(attr.ino.0, path);
        attr
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr> {
        let path = self.child(parent, name)?;
        let m = std::fs::symlink_metadata(&path).map_err(errno)?;
        Ok(self.remember(path, &m))
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr> {
        let path = self.path(ino)?;
        let c = cpath(&path)?;
        if let Some(mode) = mode {
            // SAFETY: `c` is a valid NUL-terminated path.
            check(unsafe { libc::chmod(c.as_ptr(), (mode & 0o7777) as libc::mode_t) })?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid).map_err(errno)?;
        }
        if let Some(size) = size {
            let size = libc::off_t::try_from(size).map_err(|_| Errno::EFBIG)?;
            // SAFETY: the handle is a descriptor we opened, and `c` is a valid path.
            check(match fh {
                // SAFETY: the handle is a descriptor this file system opened and still holds.
                Some(fh) => unsafe { libc::ftruncate(fh.0 as libc::c_int, size) },
                // SAFETY: `c` is a NUL-terminated path that outlives the call.
                None => unsafe { libc::truncate(c.as_ptr(), size) },
            })?;
        }
        if atime.is_some() || mtime.is_some() {
            let times = [timespec(atime), timespec(mtime)];
            // SAFETY: `c` is a valid path and `times` holds two timespecs.
            check(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
        }
        let m = std::fs::symlink_metadata(&path).map_err(errno)?;
        Ok(self.attr(&m))
    }

    fn do_create(&self, parent: INodeNo, name: &OsStr, mode: u32, flags: i32) -> Result<(FileAttr, u64)> {
        let path = self.child(parent, name)?;
        let c = cpath(&path)?;
        let flags = flags | libc::O_CREAT | libc::O_CLOEXEC;
        // SAFETY: `c` is a valid path; the mode argument is read because O_CREAT is set.
        let fd = check(unsafe { libc::open(c.as_ptr(), flags, (mode & 0o7777) as libc::c_uint) })?;
        match fstat(fd) {
            Ok(m) => Ok((self.remember(path, &m), fd as u64)),
            Err(e) => {
                // SAFETY: `fd` was opened above and is not used afterwards.
                unsafe { libc::close(fd) };
                Err(e)
            }
        }
    }

    fn do_open(&self, ino: INodeNo, flags: OpenFlags) -> Result<u64> {
        let c = cpath(&self.path(ino)?)?;
        let flags = (flags.0 & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY)) | libc::O_CLOEXEC;
        // SAFETY: `c` is a valid path; no O_CREAT, so no mode argument is needed.
        Ok(check(unsafe { libc::open(c.as_ptr(), flags) })? as u64)
    }

    fn do_mkdir(&self, parent: INodeNo, name: &OsStr, mode: u32) -> Result<FileAttr> {
        let path = self.child(parent, name)?;
        let c = cpath(&path)?;
        // SAFETY: `c` is a valid path.
        check(unsafe { libc::mkdir(c.as_ptr(), (mode & 0o7777) as libc::mode_t) })?;
        let m = std::fs::symlink_metadata(&path).map_err(errno)?;
        Ok(self.remember(path, &m))
    }

    fn do_opendir(&self, ino: INodeNo) -> Result<u64> {
        let path = self.path(ino)?;
        let mut entries = vec![(ino.0, FileType::Directory, ".".into()), (ino.0, FileType::Directory, "..".into())];
        for e in std::fs::read_dir(&path).map_err(errno)? {
            let e = e.map_err(errno)?;
            let t = e.file_type().map_err(errno)?;
            let t = if t.is_dir() {
                FileType::Directory
            } else if t.is_symlink() {
                FileType::Symlink
            } else {
                FileType::RegularFile
            };
            entries.push((self.fuse_ino(std::os::unix::fs::DirEntryExt::ino(&e)), t, e.file_name()));
        }
        let dh = self.next_dir.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().expect("dirs lock").insert(dh, entries);
        Ok(dh)
    }

    fn do_read(&self, fd: libc::c_int, offset: u64, size: u32, reply: ReplyData) {
        READ_BUF.with_borrow_mut(|buf| {
            buf.resize(size as usize, 0);
            let mut done = 0;
            while done < buf.len() {
                let at = (offset + done as u64) as libc::off_t;
                let rest = &mut buf[done..];
                // SAFETY: `rest` is a writable buffer of the given length.
                let n = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), at) };
                match n {
                    0 => break,
                    n if n > 0 => done += n as usize,
                    _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                    _ => return reply.error(last_errno()),
                }
            }
            reply.data(&buf[..done])
        })
    }

    fn do_write(&self, fd: libc::c_int, offset: u64, data: &[u8]) -> Result<u32> {
        let mut done = 0;
        while done < data.len() {
            let rest = &data[done..];
            let at = (offset + done as u64) as libc::off_t;
            // SAFETY: `rest` is a readable buffer of the given length.
            let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast(), rest.len(), at) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(last_errno());
            }
            done += n as usize;
        }
        Ok(done as u32)
    }

    fn do_statfs(&self) -> Result<libc::statvfs> {
        let c = cpath(&self.root)?;
        // SAFETY: statvfs is plain data, filled in by the call.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid path and `s` a writable statvfs.
        check(unsafe { libc::statvfs(c.as_ptr(), &mut s) })?;
        Ok(s)
    }
}

fn entry(reply: ReplyEntry, ttl: Duration, r: Result<FileAttr>) {
    match r {
        Ok(a) => reply.entry(&ttl, &a, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn path_call(path: Result<PathBuf>, f: unsafe extern "C" fn(*const libc::c_char) -> libc::c_int) -> Result<()> {
    let c = cpath(&path?)?;
    // SAFETY: `c` is a valid NUL-terminated path, as `f` (unlink or rmdir) expects.
    check(unsafe { f(c.as_ptr()) }).map(|_| ())
}

impl Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // The same negotiation as Locus's mount, minus POSIX locks (not implemented here).
        let _ = config.set_max_write(1 << 20);
        let wanted = InitFlags::FUSE_ATOMIC_O_TRUNC | InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_BIG_WRITES;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.ttl, self.do_lookup(parent, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = match fh {
            Some(fh) => fstat(fh.0 as libc::c_int),
            None => self.path(ino).and_then(|p| std::fs::symlink_metadata(p).map_err(errno)),
        };
        match m {
            Ok(m) => reply.attr(&self.ttl, &self.attr(&m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
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
        match self.do_setattr(ino, mode, uid, gid, size, atime, mtime, fh) {
            Ok(a) => reply.attr(&self.ttl, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        entry(reply, self.ttl, self.do_mkdir(parent, name, mode));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, path_call(self.child(parent, name), libc::unlink));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, path_call(self.child(parent, name), libc::rmdir));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // Keep the kernel page cache across opens: this daemon is the backing directory's only
        // writer while mounted (Locus keeps it too while a file is unchanged).
        match self.do_open(ino, flags) {
            Ok(fd) => reply.opened(FileHandle(fd), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.do_read(fh.0 as libc::c_int, offset, size, reply);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.do_write(fh.0 as libc::c_int, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _owner: LockOwner, reply: ReplyEmpty) {
        // Writes went straight to the backing file; nothing is buffered here.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // SAFETY: the handle is a descriptor opened by open/create and released exactly once.
        empty(reply, check(unsafe { libc::close(fh.0 as libc::c_int) }).map(|_| ()));
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let fd = fh.0 as libc::c_int;
        // SAFETY: the handle is a descriptor opened by open/create.
        let r = unsafe { if datasync { libc::fdatasync(fd) } else { libc::fsync(fd) } };
        empty(reply, check(r).map(|_| ()));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.do_opendir(ino) {
            Ok(dh) => reply.opened(FileHandle(dh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    /// Entry i of the opendir snapshot has offset i + 1.
    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let dirs = self.dirs.lock().expect("dirs lock");
        let Some(entries) = dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.do_statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.do_create(parent, name, mode, flags) {
            Ok((attr, fh)) => reply.created(&self.ttl, &attr, Generation(0), FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}
