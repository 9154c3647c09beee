//! POSIX permission rules, checked by meta itself on the caller's credentials (after
//! the peer's site mapped them): meta is the authority, the kernel's
//! `default_permissions` on an honest client only a first line. Written after Linux's
//! `generic_permission`, `may_delete`, `setattr_prepare` and `xattr_permission`.

use super::*;
use crate::acl::{self, Acl};

/// Read permission bit of a permission class.
pub const MAY_READ: u32 = 4;
/// Write permission bit of a permission class.
pub const MAY_WRITE: u32 = 2;
/// Execute (search, for directories) permission bit of a permission class.
pub const MAY_EXEC: u32 = 1;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;

/// Whether the caller is the superuser (not squashed by its site).
pub fn is_root(c: &Caller) -> bool {
    c.uid == 0
}

/// Whether the caller owns `a` or is the superuser.
pub fn owns(c: &Caller, a: &Attr) -> bool {
    is_root(c) || c.uid == a.uid
}

fn kind_name(a: &Attr) -> &'static str {
    if a.kind == FileKind::Dir { "directory" } else { "file" }
}

/// The permission bits of `a` that apply to `c` (owner, group or other class).
fn class_bits(c: &Caller, a: &Attr) -> u32 {
    if c.uid == a.uid {
        (a.mode >> 6) & 7
    } else if c.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    }
}

/// The inode's ACL `name` (`acl::ACCESS` or `acl::DEFAULT`), if its marks say it has
/// one (`Inode::acls`); a marked ACL that is missing or does not decode is corruption.
pub fn stored_acl(t: &mut dyn Txn, i: &Inode, name: &[u8]) -> Result<Option<Acl>, MetaError> {
    let (marked, which) = if name == acl::ACCESS { (i.acls.access, "access") } else { (i.acls.default, "default") };
    if !marked {
        return Ok(None);
    }
    let ino = i.attr.ino;
    let value = t
        .get_xattr(ino, name)?
        .ok_or_else(|| MetaError::Corrupt(format!("inode {ino} is marked as having a {which} ACL but has none")))?;
    Acl::decode(&value).map(Some).map_err(|e| MetaError::Corrupt(format!("{which} ACL of inode {ino}: {e}")))
}

/// Whether `c` has every permission in `want` (`MAY_*` bits) on `i`, as Linux's
/// `acl_permission_check` decides: the owner by the owner bits; anyone else by the
/// access ACL where there is one and the mode's group class (its mask) is not empty,
/// otherwise by the group or other bits.
pub fn permits(t: &mut dyn Txn, c: &Caller, i: &Inode, want: u32) -> Result<bool, MetaError> {
    let a = &i.attr;
    if is_root(c) {
        return Ok(true);
    }
    if c.uid != a.uid
        && a.mode & 0o070 != 0
        && let Some(acl) = stored_acl(t, i, acl::ACCESS)?
    {
        return Ok(acl.permits(c, a.gid, want));
    }
    Ok(class_bits(c, a) & want == want)
}

/// Refuses (EACCES) unless `c` has every permission in `want` on `i`.
pub fn check(t: &mut dyn Txn, c: &Caller, i: &Inode, want: u32) -> Result<(), MetaError> {
    if permits(t, c, i, want)? {
        return Ok(());
    }
    let a = &i.attr;
    let what = [(MAY_READ, "read"), (MAY_WRITE, "write"), (MAY_EXEC, "search/execute")]
        .iter()
        .filter(|(bit, _)| want & bit != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join("+");
    Err(MetaError::PermissionDenied(format!(
        "uid {} may not {what} {} {} (mode {:o}{}, owner {}:{})",
        c.uid,
        kind_name(a),
        a.ino,
        a.mode,
        if i.acls.access { " and an ACL" } else { "" },
        a.uid,
        a.gid
    )))
}

/// Refuses (EACCES) a request addressed by inode number unless the caller could reach
/// the inode by a path walk: search permission on every directory from the root down
/// to the one holding it, as the kernel's walk would check. An inode number is no
/// capability (they are small and guessable), so meta walks up the recorded parents
/// (`Inode::parent`, kept pointing at a directory holding a name of the inode); a
/// file with several names is reachable through any of them. An orphan (unlinked,
/// still open) whose directory is gone is left to its mode: only its openers know it.
pub fn check_reach(t: &mut dyn Txn, c: &Caller, i: &Inode) -> Result<(), MetaError> {
    if is_root(c) || i.attr.ino == ROOT_INODE {
        return Ok(());
    }
    let denied = match walk_up(t, c, i.parent) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if i.attr.kind != FileKind::Dir && i.attr.nlink > 1 {
        for parent in t.parents_of(i.attr.ino)? {
            if parent != i.parent && walk_up(t, c, parent).is_ok() {
                return Ok(());
            }
        }
    }
    match denied {
        MetaError::NotFound(_) if i.attr.nlink == 0 => Ok(()),
        MetaError::NotFound(_) => Err(MetaError::Corrupt(format!(
            "inode {} is held by directory {}, which is missing or not a directory",
            i.attr.ino, i.parent
        ))),
        other => Err(other),
    }
}

/// Search permission on `dir` and every directory above it.
fn walk_up(t: &mut dyn Txn, c: &Caller, mut dir: InodeId) -> Result<(), MetaError> {
    for _ in 0..MAX_DEPTH {
        let d = t.get_inode(dir)?.filter(|d| d.attr.kind == FileKind::Dir);
        let d = d.ok_or_else(|| MetaError::NotFound(format!("directory {dir}")))?;
        check(t, c, &d, MAY_EXEC)?;
        if dir == ROOT_INODE {
            return Ok(());
        }
        dir = d.parent;
    }
    Err(MetaError::Corrupt(format!("the parents above directory {dir} do not reach the root")))
}

/// A new name for someone else's file (Linux's `fs.protected_hardlinks`, on by default
/// and applied by the kernel of every honest client): only for a regular file without
/// setuid or setgid-exec bits that the caller may read and write. Otherwise a user
/// could pin a file its owner means to delete, or keep a setuid binary past its fix.
pub fn check_hardlink(t: &mut dyn Txn, c: &Caller, i: &Inode) -> Result<(), MetaError> {
    let a = &i.attr;
    if owns(c, a) {
        return Ok(());
    }
    let privileged = a.mode & S_ISUID != 0 || a.mode & (S_ISGID | 0o010) == S_ISGID | 0o010;
    if a.kind != FileKind::File || privileged || !permits(t, c, i, MAY_READ | MAY_WRITE)? {
        return Err(refuse(
            c,
            a,
            "make a hard link (it may link only its own files, or regular ones it may read and write)",
        ));
    }
    Ok(())
}

/// Removing or replacing `victim` in directory `dir`: write and search on the
/// directory, and in a sticky directory only the owner of either may do it (EPERM).
pub fn check_delete(t: &mut dyn Txn, c: &Caller, d: &Inode, victim: &Attr) -> Result<(), MetaError> {
    check(t, c, d, MAY_WRITE | MAY_EXEC)?;
    let dir = &d.attr;
    if dir.mode & S_ISVTX != 0 && !owns(c, dir) && c.uid != victim.uid {
        return Err(MetaError::NotPermitted(format!(
            "uid {} may not remove inode {} owned by {} from sticky directory {}",
            c.uid, victim.ino, victim.uid, dir.ino
        )));
    }
    Ok(())
}

/// The mode a new node gets: a non-root creator who is not in the group the node
/// gets loses a group-executable setgid bit (as Linux's `mode_strip_sgid`).
pub fn creation_mode(c: &Caller, kind: FileKind, mode: u32, gid: u32) -> u32 {
    if kind != FileKind::Dir && mode & S_ISGID != 0 && mode & 0o010 != 0 && !is_root(c) && !c.in_group(gid) {
        mode & !S_ISGID
    } else {
        mode
    }
}

fn refuse(c: &Caller, a: &Attr, what: &str) -> MetaError {
    MetaError::NotPermitted(format!("uid {} may not {what} of inode {} (owner {}:{})", c.uid, a.ino, a.uid, a.gid))
}

/// Checks a `setattr` and returns the mode to store if `set.mode` is given (with the
/// setgid bit cleared where a non-member sets it). Rules: truncation needs write
/// permission or an open for writing (`open_for_writing`: ftruncate); chown only by root (or to the same owner); chgrp by the owner to one of
/// its groups; chmod by the owner, except that anyone allowed to write may clear the
/// setuid/setgid bits (the kernel does that on a write); explicit times by the owner,
/// "now" by the owner or a writer.
pub fn check_set_attr(
    t: &mut dyn Txn,
    c: &Caller,
    i: &Inode,
    set: &AttrChanges,
    open_for_writing: bool,
) -> Result<Option<u32>, MetaError> {
    let a = &i.attr;
    if set.size.is_some() && !open_for_writing {
        check(t, c, i, MAY_WRITE)?;
    }
    if let Some(uid) = set.uid
        && uid != a.uid
        && !is_root(c)
    {
        return Err(refuse(c, a, &format!("give away ownership to uid {uid}")));
    }
    if let Some(gid) = set.gid
        && !is_root(c)
        && (c.uid != a.uid || (gid != a.gid && !c.in_group(gid)))
    {
        return Err(refuse(c, a, &format!("change the group to {gid}")));
    }
    let mode = match set.mode {
        None => None,
        Some(mode) => {
            let mode = mode & 0o7777;
            let only_clears_ids = mode | (S_ISUID | S_ISGID) == a.mode | (S_ISUID | S_ISGID) && mode & !a.mode == 0;
            let writer_clearing_ids = only_clears_ids && permits(t, c, i, MAY_WRITE)?;
            if !(owns(c, a) || writer_clearing_ids) {
                return Err(refuse(c, a, "change the mode"));
            }
            let gid = set.gid.unwrap_or(a.gid);
            Some(if mode & S_ISGID != 0 && !is_root(c) && !c.in_group(gid) { mode & !S_ISGID } else { mode })
        }
    };
    let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
    if explicit(set.atime) || explicit(set.mtime) {
        if !owns(c, a) {
            return Err(refuse(c, a, "set explicit times"));
        }
    } else if (set.atime.is_some() || set.mtime.is_some()) && !owns(c, a) {
        check(t, c, i, MAY_WRITE)?;
    }
    Ok(mode)
}

/// Refuses an extended attribute access the rules of its namespace forbid
/// (`xattr_rule`), or that needs a permission `c` lacks on `i`.
pub fn check_xattr(t: &mut dyn Txn, c: &Caller, i: &Inode, name: &[u8], write: bool) -> Result<(), MetaError> {
    match xattr_rule(c, &i.attr, name, write)? {
        Some(want) => check(t, c, i, want),
        None => Ok(()),
    }
}

/// Extended attribute namespaces: `trusted.*` is root's alone (hidden from others),
/// `security.*` is written only by root, the ACLs (`system.posix_acl_*`) only by the
/// owner, and `user.*` lives only on files and directories, needs read or write
/// permission (the `MAY_*` bit answered), and on a sticky directory is written only
/// by its owner. Any other namespace is refused (EOPNOTSUPP), as Linux refuses it.
pub fn xattr_rule(c: &Caller, a: &Attr, name: &[u8], write: bool) -> Result<Option<u32>, MetaError> {
    let absent = || MetaError::NoAttribute(show(name));
    if name.starts_with(b"trusted.") {
        return match (is_root(c), write) {
            (true, _) => Ok(None),
            (false, true) => Err(refuse(c, a, "write a trusted.* attribute")),
            (false, false) => Err(absent()),
        };
    }
    if name.starts_with(b"security.") {
        return if write && !is_root(c) { Err(refuse(c, a, "write a security.* attribute")) } else { Ok(None) };
    }
    if name == acl::ACCESS || name == acl::DEFAULT {
        return if write && !owns(c, a) { Err(refuse(c, a, "change the ACL")) } else { Ok(None) };
    }
    if !name.starts_with(b"user.") {
        return Err(MetaError::Unsupported(format!(
            "extended attribute {}: Linux knows only the user., trusted., security. and system.posix_acl_* names",
            show(name)
        )));
    }
    if !matches!(a.kind, FileKind::File | FileKind::Dir) {
        return if write { Err(refuse(c, a, "write a user.* attribute")) } else { Err(absent()) };
    }
    if a.kind == FileKind::Dir && a.mode & S_ISVTX != 0 && write && !owns(c, a) {
        return Err(refuse(c, a, "write a user.* attribute of a sticky directory"));
    }
    Ok(Some(if write { MAY_WRITE } else { MAY_READ }))
}

/// A change of a file's data or ownership drops the privileges its mode grants, as
/// Linux's `file_remove_privs` and `chown` do whatever client asked: the setuid bit,
/// and the setgid bit where it means setgid (group-executable). A write or truncation
/// by the superuser keeps them (`CAP_FSETID`); a chown drops them for anyone.
pub fn drop_privileges(c: &Caller, a: &mut Attr, chown: bool) {
    if a.kind != FileKind::File || (is_root(c) && !chown) {
        return;
    }
    a.mode &= !S_ISUID;
    if a.mode & 0o010 != 0 {
        a.mode &= !S_ISGID;
    }
}

/// Whether a listing of extended attributes shows `name` to `c`.
pub fn xattr_visible(c: &Caller, name: &[u8]) -> bool {
    is_root(c) || !name.starts_with(b"trusted.")
}

/// Changing a file's data: the session has it open for writing (a write through a
/// descriptor outlives a later chmod, as POSIX says), or the caller may reach it and
/// write it now.
pub fn check_data_write(t: &mut dyn Txn, c: &Caller, session: SessionId, i: &Inode) -> Result<(), MetaError> {
    if super::locks::open_for_writing(t, session, i.attr.ino)? {
        return Ok(());
    }
    check_reach(t, c, i)?;
    check(t, c, i, MAY_WRITE)
}

/// Operations only meta's own nodes, and the superuser, may ask for (catalogue
/// maintenance, node registration and reports).
pub fn check_privileged(c: &Caller, what: &str) -> Result<(), MetaError> {
    if is_root(c) {
        return Ok(());
    }
    Err(MetaError::NotPermitted(format!("{what} is reserved to nodes and administrators (uid {} asked)", c.uid)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::types::xattr_readable_by_all;

    /// Clients answer reads of the names `xattr_readable_by_all` picks from a listing
    /// alone, which gives meta's answer only while meta refuses such a read to nobody.
    #[test]
    fn xattr_names_readable_by_all_are_refused_to_nobody() {
        let stranger = Caller { uid: 1234, gid: 1234, groups: Vec::new() };
        let t = Timestamp::default();
        for kind in [FileKind::File, FileKind::Dir, FileKind::Symlink] {
            let a = Attr {
                ino: 7,
                kind,
                mode: 0,
                uid: 1,
                gid: 1,
                size: 0,
                nlink: 1,
                rdev: 0,
                atime: t,
                mtime: t,
                ctime: t,
                data_version: 0,
            };
            for name in [&b"security.selinux"[..], b"system.posix_acl_access", b"trusted.x", b"user.x"] {
                let refused = matches!(
                    xattr_rule(&stranger, &a, name, false),
                    Ok(Some(_)) | Err(MetaError::PermissionDenied(_) | MetaError::NotPermitted(_))
                );
                if xattr_readable_by_all(name) {
                    assert!(!refused, "{} of a {kind:?}", show(name));
                }
            }
            if kind == FileKind::File {
                assert!(matches!(xattr_rule(&stranger, &a, b"user.x", false), Ok(Some(MAY_READ))));
            }
        }
    }
}
