//! File systems mounted for a test (a small tmpfs to fill, a ramfs that refuses
//! `O_DIRECT`), so tests meet the disks users have without a machine of their own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A file system mounted on a directory the caller owns, unmounted when dropped
/// (drop it before the directory).
pub struct Mount(PathBuf);

impl Mount {
    /// Mounts a `fstype` file system with `options` (e.g. `size=8m`) on `dir`; `None`
    /// where this process may not mount (not root).
    pub fn new(dir: &Path, fstype: &str, options: Option<&str>) -> Option<Mount> {
        let mut mount = Command::new("mount");
        mount.args(["-t", fstype]);
        if let Some(options) = options {
            mount.args(["-o", options]);
        }
        let mounted = mount.arg(fstype).arg(dir).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        mounted.then(|| Mount(dir.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
