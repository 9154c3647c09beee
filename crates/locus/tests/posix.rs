//! POSIX behaviour through a real FUSE mount of a real cluster (meta and two nodes as
//! separate processes): what a Linux local file system would do, errno for errno.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use testkit::Cluster;

fn cluster() -> Option<Cluster> {
    if !testkit::can_mount() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return None;
    }
    Some(Cluster::start(Path::new(env!("CARGO_BIN_EXE_locus")), 2))
}

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (cstr(from), cstr(to));
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    if r == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() }
}

/// setxattr(2) of `name` on `path` with `flags` (`XATTR_CREATE`, ...); 0 or the errno.
fn set_xattr(path: &Path, name: &str, value: &[u8], flags: i32) -> i32 {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    // SAFETY: path and name are NUL-terminated; `value` holds the bytes passed.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap() }
}

/// getxattr(2) of `name` on `path` into a buffer of `len` bytes (at most 256), or the errno.
fn get_xattr(path: &Path, name: &str, len: usize) -> Result<Vec<u8>, i32> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    let mut buf = [0u8; 256];
    // SAFETY: path and name are NUL-terminated; `buf` is writable for `len` <= its size bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), len.min(buf.len())) };
    if r >= 0 { Ok(buf[..r as usize].to_vec()) } else { Err(std::io::Error::last_os_error().raw_os_error().unwrap()) }
}

/// The names listxattr(2) gives for `path`, or the errno.
fn list_xattrs(path: &Path) -> Result<Vec<String>, i32> {
    let p = cstr(path);
    let mut buf = [0u8; 1024];
    // SAFETY: the path is NUL-terminated; `buf` is writable for the length passed.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(buf[..r as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into())
        .collect())
}

/// Runs a shell command as `uid:gid` (no supplementary groups) and returns its exit status code.
fn sh_as(uid: u32, gid: u32, cmd: &str) -> i32 {
    Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into(), "sh".into(), "-c".into()])
        .arg(cmd)
        .status()
        .unwrap()
        .code()
        .unwrap_or(-1)
}

#[test]
fn files_directories_links_and_errors() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();

    // O_CREAT|O_EXCL, O_TRUNC, O_APPEND
    let f = m.join("f");
    fs::write(&f, b"hello world").unwrap();
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(&f)), libc::EEXIST);
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"!").unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"hello world!");
    OpenOptions::new().write(true).truncate(true).open(&f).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);

    // write at any offset; holes read as zeros; truncate up and down
    let mut h = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    h.seek(SeekFrom::Start(1 << 20)).unwrap();
    h.write_all(b"tail").unwrap();
    h.sync_all().unwrap();
    let data = fs::read(&f).unwrap();
    assert_eq!(data.len(), (1 << 20) + 4);
    assert!(data[..1 << 20].iter().all(|b| *b == 0));
    assert_eq!(&data[1 << 20..], b"tail");
    h.set_len(10).unwrap();
    h.set_len(20).unwrap();
    assert_eq!(fs::read(&f).unwrap(), vec![0u8; 20]);
    h.seek(SeekFrom::Start(5)).unwrap();
    h.write_all(b"xy").unwrap();
    drop(h);
    let mut want = vec![0u8; 20];
    want[5..7].copy_from_slice(b"xy");
    assert_eq!(fs::read(&f).unwrap(), want);

    // mkdir / rmdir / ENOTEMPTY / ENOTDIR / EISDIR
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    assert_eq!(errno(fs::create_dir(&d)), libc::EEXIST);
    fs::write(d.join("x"), b"x").unwrap();
    assert_eq!(errno(fs::remove_dir(&d)), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(&f)), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(&d)), libc::EISDIR);
    assert_eq!(errno(fs::read(m.join("missing"))), libc::ENOENT);
    assert_eq!(errno(File::create(f.join("under-a-file"))), libc::ENOTDIR);
    assert_eq!(fs::metadata(&m).unwrap().nlink(), 3, "root has . and d/..");

    // rename: over a file, across directories, NOREPLACE, EXCHANGE, into itself
    fs::write(m.join("r1"), b"one").unwrap();
    fs::write(m.join("r2"), b"two").unwrap();
    fs::rename(m.join("r1"), m.join("r2")).unwrap();
    assert_eq!(fs::read(m.join("r2")).unwrap(), b"one");
    assert!(!m.join("r1").exists());
    fs::rename(m.join("r2"), d.join("r3")).unwrap();
    assert_eq!(fs::read(d.join("r3")).unwrap(), b"one");
    assert_eq!(renameat2(&d.join("r3"), &d.join("x"), libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(renameat2(&d.join("r3"), &d.join("x"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(d.join("x")).unwrap(), b"one");
    assert_eq!(fs::read(d.join("r3")).unwrap(), b"x");
    assert_eq!(errno(fs::rename(&d, d.join("sub"))), libc::EINVAL);
    fs::create_dir(m.join("e")).unwrap();
    fs::rename(&d, m.join("e/d")).unwrap();
    assert_eq!(fs::read(m.join("e/d/x")).unwrap(), b"one");

    // unlink of an open file: still readable until the last close
    let g = m.join("g");
    fs::write(&g, b"still here").unwrap();
    let mut open = File::open(&g).unwrap();
    fs::remove_file(&g).unwrap();
    assert!(!g.exists());
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here");
    assert_eq!(open.metadata().unwrap().nlink(), 0, "fstat of an unlinked open file shows no links");
    drop(open);

    // write(2) moves mtime and ctime, visible through fstat before close.
    let w = m.join("w");
    fs::write(&w, b"x").unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    let mut wf = OpenOptions::new().write(true).open(&w).unwrap();
    wf.set_modified(t).unwrap();
    let before = wf.metadata().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    wf.write_all(b"more").unwrap();
    let after = wf.metadata().unwrap();
    assert!(after.mtime() > before.mtime(), "write did not move mtime");
    assert!((after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()), "write did not move ctime");
    drop(wf);

    // hard links, symlinks, FIFOs
    fs::write(m.join("l1"), b"linked").unwrap();
    fs::hard_link(m.join("l1"), m.join("l2")).unwrap();
    assert_eq!(fs::metadata(m.join("l1")).unwrap().nlink(), 2);
    fs::remove_file(m.join("l1")).unwrap();
    assert_eq!(fs::metadata(m.join("l2")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.join("l2")).unwrap(), b"linked");
    assert_eq!(errno(fs::hard_link(m.join("e"), m.join("dirlink"))), libc::EPERM);
    std::os::unix::fs::symlink("l2", m.join("s")).unwrap();
    assert_eq!(fs::read_link(m.join("s")).unwrap(), Path::new("l2"));
    assert_eq!(fs::read(m.join("s")).unwrap(), b"linked");
    let fifo = cstr(&m.join("fifo"));
    // SAFETY: `fifo` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    assert!(fs::symlink_metadata(m.join("fifo")).unwrap().file_type().is_fifo());

    // chmod / chown / utimens
    fs::set_permissions(m.join("l2"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(m.join("l2")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(m.join("l2"), Some(1000), Some(1000)).unwrap();
    let md = fs::metadata(m.join("l2")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 1000));
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    File::options().write(true).open(m.join("l2")).unwrap().set_modified(t).unwrap();
    assert_eq!(fs::metadata(m.join("l2")).unwrap().mtime(), 1_000_000_000);

    // xattrs
    let l2 = m.join("l2");
    assert_eq!(set_xattr(&l2, "user.color", b"blue", libc::XATTR_CREATE), 0);
    assert_eq!(set_xattr(&l2, "user.color", b"blue", libc::XATTR_CREATE), libc::EEXIST);
    assert_eq!(get_xattr(&l2, "user.color", 256), Ok(b"blue".to_vec()));
    assert_eq!(get_xattr(&l2, "user.color", 2), Err(libc::ERANGE));
    let (p, name) = (cstr(&l2), CString::new("user.color").unwrap());
    // SAFETY: path and name are NUL-terminated strings that outlive the call.
    assert_eq!(unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) }, 0);
    assert_eq!(get_xattr(&l2, "user.color", 256), Err(libc::ENODATA));

    // statfs and fallocate
    // SAFETY: statvfs is a plain C struct for which all zeroes is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and `st` is a valid, writable statvfs.
    assert_eq!(unsafe { libc::statvfs(cstr(&m).as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bfree <= st.f_blocks);
    let fa = OpenOptions::new().create(true).truncate(false).write(true).open(m.join("fa")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: `fa` keeps the descriptor open for the call.
    assert_eq!(unsafe { libc::fallocate(fa.as_raw_fd(), 0, 0, 8192) }, 0);
    assert_eq!(fa.metadata().unwrap().len(), 8192);
}

#[test]
fn permissions_for_other_users() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();
    let ms = m.display();
    // A root-owned 0755 directory refuses writes by others.
    fs::create_dir(m.join("private")).unwrap();
    assert_ne!(sh_as(1000, 1000, &format!("touch {ms}/private/x 2>/dev/null")), 0);
    // A sticky, world-writable directory: users may not delete each other's files.
    fs::create_dir(m.join("tmp")).unwrap();
    fs::set_permissions(m.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(sh_as(1000, 1000, &format!("echo a > {ms}/tmp/a")), 0);
    assert_eq!(fs::metadata(m.join("tmp/a")).unwrap().uid(), 1000);
    assert_ne!(sh_as(1001, 1001, &format!("rm -f {ms}/tmp/a 2>/dev/null")), 0);
    assert!(m.join("tmp/a").exists());
    assert_eq!(sh_as(1000, 1000, &format!("rm {ms}/tmp/a")), 0);
    // Non-owners cannot chmod; non-root cannot give files away.
    assert_eq!(sh_as(1000, 1000, &format!("echo b > {ms}/tmp/b")), 0);
    assert_ne!(sh_as(1001, 1001, &format!("chmod 777 {ms}/tmp/b 2>/dev/null")), 0);
    assert_ne!(sh_as(1000, 1000, &format!("chown 1001 {ms}/tmp/b 2>/dev/null")), 0);
    // Mode bits are enforced on read.
    assert_eq!(sh_as(1000, 1000, &format!("chmod 600 {ms}/tmp/b")), 0);
    assert_ne!(sh_as(1001, 1001, &format!("cat {ms}/tmp/b >/dev/null 2>&1")), 0);
    // setgid directories pass their group (and the bit, to subdirectories) down.
    fs::create_dir(m.join("shared")).unwrap();
    std::os::unix::fs::chown(m.join("shared"), Some(0), Some(2000)).unwrap();
    fs::set_permissions(m.join("shared"), fs::Permissions::from_mode(0o2777)).unwrap();
    assert_eq!(sh_as(1000, 1000, &format!("mkdir {ms}/shared/sub && touch {ms}/shared/file")), 0);
    assert_eq!(fs::metadata(m.join("shared/file")).unwrap().gid(), 2000);
    let sub = fs::metadata(m.join("shared/sub")).unwrap();
    assert_eq!((sub.gid(), sub.mode() & 0o2000), (2000, 0o2000));
}

/// `getfacl`'s lines for `path` (without the comment header).
fn getfacl(path: &Path) -> Vec<String> {
    let out = Command::new("getfacl").args(["--omit-header", "--numeric"]).arg(path).output().unwrap();
    assert!(out.status.success(), "getfacl {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

fn setfacl(args: &str, path: &Path) {
    let out = Command::new("setfacl").args(args.split(' ')).arg(path).output().unwrap();
    assert!(out.status.success(), "setfacl {args} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn acls_set_with_setfacl_mean_what_they_say() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();
    let ms = m.display();
    // A deny for one user denies what the other bits grant; everyone else still reads.
    fs::write(m.join("f"), b"secret").unwrap();
    setfacl("-m u:1001:---", &m.join("f"));
    assert_ne!(sh_as(1001, 1001, &format!("cat {ms}/f >/dev/null 2>&1")), 0);
    assert_eq!(sh_as(1002, 1002, &format!("cat {ms}/f >/dev/null")), 0);
    // A grant: the mode's group class shows the mask, and chmod moves the mask.
    fs::write(m.join("g"), b"").unwrap();
    fs::set_permissions(m.join("g"), fs::Permissions::from_mode(0o600)).unwrap();
    setfacl("-m u:1001:rw", &m.join("g"));
    assert_eq!(fs::metadata(m.join("g")).unwrap().mode() & 0o777, 0o660);
    assert_eq!(sh_as(1001, 1001, &format!("echo hi >> {ms}/g")), 0);
    assert_eq!(fs::read(m.join("g")).unwrap(), b"hi\n");
    assert_ne!(sh_as(1002, 1002, &format!("cat {ms}/g >/dev/null 2>&1")), 0);
    fs::set_permissions(m.join("g"), fs::Permissions::from_mode(0o600)).unwrap();
    let acl = getfacl(&m.join("g"));
    assert!(acl.iter().any(|l| l.starts_with("user:1001:rw-") && l.contains("#effective:---")), "{acl:?}");
    assert!(acl.contains(&"mask::---".to_string()), "{acl:?}");
    assert_ne!(sh_as(1001, 1001, &format!("cat {ms}/g >/dev/null 2>&1")), 0);
    assert_ne!(sh_as(1001, 1001, &format!("setfacl -m u:1001:rwx {ms}/g 2>/dev/null")), 0, "not the owner's");
    // A default ACL is inherited in place of the umask; without one the umask applies.
    fs::create_dir(m.join("d")).unwrap();
    setfacl("-d -m u:1001:rwx", &m.join("d"));
    assert_eq!(sh_as(0, 0, &format!("umask 077 && touch {ms}/d/new && mkdir {ms}/d/sub")), 0);
    assert_eq!(fs::metadata(m.join("d/new")).unwrap().mode() & 0o777, 0o664);
    assert!(getfacl(&m.join("d/new")).iter().any(|l| l.starts_with("user:1001:rwx")));
    assert!(getfacl(&m.join("d/sub")).iter().any(|l| l.starts_with("default:user:1001:rwx")));
    assert_eq!(sh_as(1001, 1001, &format!("echo x > {ms}/d/new")), 0);
    assert_eq!(sh_as(0, 0, &format!("umask 027 && touch {ms}/plain")), 0);
    assert_eq!(fs::metadata(m.join("plain")).unwrap().mode() & 0o777, 0o640);
    // Removing every extended entry leaves a plain mode.
    setfacl("-b", &m.join("g"));
    assert_eq!(get_xattr(&m.join("g"), "system.posix_acl_access", 256), Err(libc::ENODATA));
    assert_eq!(getfacl(&m.join("g")).len(), 3);
}

#[test]
fn large_directory_lists_completely() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();
    let d = m.join("big");
    fs::create_dir(&d).unwrap();
    const N: usize = 100_000;
    for i in 0..N {
        File::create(d.join(format!("f{i:06}"))).unwrap();
    }
    let mut names: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), N);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), N, "no entry listed twice");

    // telldir/seekdir/rewinddir land where they should, across the client's pages of
    // 2,048 entries and its hand-outs of a kernel buffer's worth.
    let path = cstr(&d);
    // SAFETY: the path is NUL-terminated; the stream is closed below and not used after.
    let stream = unsafe { libc::opendir(path.as_ptr()) };
    assert!(!stream.is_null());
    let next = || -> String {
        loop {
            // SAFETY: `stream` is an open directory stream.
            let e = unsafe { libc::readdir(stream) };
            assert!(!e.is_null(), "the listing ended early");
            // SAFETY: readdir returned a valid entry whose name is NUL-terminated.
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned();
            if name != "." && name != ".." {
                return name;
            }
        }
    };
    // SAFETY: `stream` is an open directory stream.
    let tell = || unsafe { libc::telldir(stream) };
    // SAFETY: `stream` is an open directory stream; `at` came from its telldir.
    let seek = |at| unsafe { libc::seekdir(stream, at) };
    let mut first: Vec<String> = (0..1000).map(|_| next()).collect();
    let at_1000 = tell();
    first.extend((0..2000).map(|_| next()));
    let at_3000 = tell();
    let after_3000: Vec<String> = (0..100).map(|_| next()).collect();
    seek(at_1000);
    assert_eq!((0..100).map(|_| next()).collect::<Vec<_>>(), first[1000..1100], "seek back to an earlier page");
    seek(at_3000);
    assert_eq!((0..100).map(|_| next()).collect::<Vec<_>>(), after_3000, "seek forward");
    // SAFETY: `stream` is an open directory stream.
    unsafe { libc::rewinddir(stream) };
    assert_eq!((0..100).map(|_| next()).collect::<Vec<_>>(), first[..100], "rewind");
    // SAFETY: `stream` is open and not used after.
    assert_eq!(unsafe { libc::closedir(stream) }, 0);
}

/// `ls -l` through READDIRPLUS: the attributes a listing hands the kernel, which it keeps
/// instead of looking each name up, are the ones a lookup would have answered, this
/// mount's unflushed writes included; and a listing's word that a file has no extended
/// attribute answers `ls -l`'s questions for them until it is out of date.
#[test]
fn listings_carry_what_lookups_would() {
    let Some(mut c) = cluster() else { return };
    let (m1, m2) = (c.mount(), c.mount());
    let d1 = m1.join("d");
    fs::create_dir(&d1).unwrap();
    fs::write(d1.join("a"), b"hello").unwrap();
    fs::set_permissions(d1.join("a"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::hard_link(d1.join("a"), d1.join("h")).unwrap();
    std::os::unix::fs::symlink("a", d1.join("l")).unwrap();
    fs::create_dir(d1.join("sub")).unwrap();
    File::create(d1.join("grow")).unwrap();

    // This mount has unflushed bytes of `grow` when it lists the directory.
    let d2 = m2.join("d");
    let mut grow = OpenOptions::new().append(true).open(d2.join("grow")).unwrap();
    grow.write_all(b"abc").unwrap();
    let listed = |d: &Path| -> Vec<(String, fs::Metadata)> {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_string().unwrap(), fs::symlink_metadata(e.path()).unwrap())
            })
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let got = listed(&d2);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "grow", "h", "l", "sub"]);
    let (a, grown, h, l, sub) = (&got[0].1, &got[1].1, &got[2].1, &got[3].1, &got[4].1);
    assert!(a.is_file() && a.len() == 5 && a.mode() & 0o7777 == 0o640 && a.nlink() == 2, "{a:?}");
    assert_eq!((h.ino(), h.nlink()), (a.ino(), 2));
    assert!(l.file_type().is_symlink() && l.len() == 1, "{l:?}");
    assert!(sub.is_dir(), "{sub:?}");
    assert_eq!(grown.len(), 3, "this mount's unflushed append");
    assert_eq!(grow.metadata().unwrap().len(), 3);
    drop(grow);
    assert_eq!(get_xattr(&d2.join("grow"), "system.posix_acl_access", 256), Err(libc::ENODATA));
    assert_eq!(list_xattrs(&d2.join("grow")), Ok(Vec::new()));
    // An attribute this mount sets after listing the file is there at once.
    assert_eq!(set_xattr(&d2.join("a"), "trusted.t", b"1", 0), 0);
    assert_eq!(get_xattr(&d2.join("a"), "trusted.t", 256), Ok(b"1".to_vec()));
    assert_eq!(list_xattrs(&d2.join("a")), Ok(vec!["trusted.t".to_string()]));

    // Another mount's changes show once the TTL (1 s) has run out.
    OpenOptions::new().append(true).open(d1.join("a")).unwrap().write_all(b"!").unwrap();
    assert_eq!(set_xattr(&d1.join("sub"), "trusted.t", b"2", 0), 0);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let again = listed(&d2);
    assert_eq!(again[0].1.len(), 6);
    assert_eq!(again[1].1.len(), 3);
    assert_eq!(get_xattr(&d2.join("sub"), "trusted.t", 256), Ok(b"2".to_vec()));
    assert_eq!(list_xattrs(&d2.join("sub")), Ok(vec!["trusted.t".to_string()]));
}

#[test]
fn file_larger_than_a_chunk_round_trips_and_is_striped() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();
    let data: Vec<u8> = (0..(40u32 << 20) / 4).flat_map(|i| i.wrapping_mul(2654435761).to_le_bytes()).collect();
    let mut f = File::create(m.join("big.bin")).unwrap();
    for piece in data.chunks(1 << 20) {
        f.write_all(piece).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    // A small overwrite in the middle, then compare against the model.
    let mut f = OpenOptions::new().write(true).open(m.join("big.bin")).unwrap();
    f.seek(SeekFrom::Start(12_345_678)).unwrap();
    f.write_all(b"OVERWRITE").unwrap();
    drop(f);
    let mut want = data.clone();
    want[12_345_678..12_345_678 + 9].copy_from_slice(b"OVERWRITE");
    assert!(fs::read(m.join("big.bin")).unwrap() == want, "content differs");
    // Both nodes hold some of the chunks.
    for n in ["node0", "node1"] {
        let count = walk_files(&c.node_dir(n).join("chunks"));
        assert!(count > 0, "{n} holds no chunk: no striping");
    }
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}

fn walk_files(dir: &Path) -> usize {
    match fs::read_dir(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => 0,
        Err(e) => panic!("{e}"),
        Ok(entries) => entries
            .map(|e| {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() { walk_files(&e.path()) } else { 1 }
            })
            .sum(),
    }
}

#[test]
fn gc_frees_unreferenced_chunks() {
    let Some(mut c) = cluster() else { return };
    let m = c.mount();
    let data = vec![7u8; 9 << 20];
    fs::write(m.join("doomed"), &data).unwrap();
    fs::write(m.join("kept"), b"keep me").unwrap();
    let before = walk_files(&c.node_dir("node0").join("chunks")) + walk_files(&c.node_dir("node1").join("chunks"));
    fs::remove_file(m.join("doomed")).unwrap();
    let out = c.locus(&["gc", "--meta", &c.meta.addr, "--min-age", "0s"]);
    assert!(out.status.success(), "gc failed: {}", String::from_utf8_lossy(&out.stderr));
    let after = walk_files(&c.node_dir("node0").join("chunks")) + walk_files(&c.node_dir("node1").join("chunks"));
    assert!(after < before, "gc freed nothing ({before} chunks before, {after} after)");
    assert_eq!(fs::read(m.join("kept")).unwrap(), b"keep me");
    let out = c.locus(&["fsck", "--meta", &c.meta.addr]);
    assert!(out.status.success(), "fsck after gc: {}", String::from_utf8_lossy(&out.stdout));
}
