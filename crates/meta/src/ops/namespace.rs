//! Namespace rules: names, directories, links, renames, attributes and xattrs.

use super::*;
use crate::acl::{self, Acl};
use crate::store::AclMarks;
use proto::meta::Create;

/// Loads a directory, adjusts its link count, stamps mtime/ctime and stores it;
/// returns its new attributes.
pub(super) fn touch_dir(t: &mut dyn Txn, ino: InodeId, now: Timestamp, nlink_delta: i64) -> Result<Attr, MetaError> {
    let mut d = inode(t, ino)?;
    d.attr.nlink = (i64::from(d.attr.nlink) + nlink_delta).max(0) as u32;
    d.attr.mtime = now;
    d.attr.ctime = now;
    t.put_inode(&d)?;
    Ok(d.attr)
}

pub(super) fn lookup(t: &mut dyn Txn, c: &Caller, parent: InodeId, name: &[u8]) -> Result<Attr, MetaError> {
    t.prefetch(Prefetch::entry(parent, name))?;
    let p = reach_dir(t, c, parent)?;
    check(t, c, &p, MAY_EXEC)?;
    match name {
        b"." => return Ok(p.attr),
        b".." => return Ok(inode(t, p.parent)?.attr),
        _ => check_name(name)?,
    }
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    Ok(inode(t, ino)?.attr)
}

pub(super) fn read_dir(
    t: &mut dyn Txn,
    c: &Caller,
    ino: InodeId,
    after: u64,
    limit: u32,
) -> Result<Vec<DirEntry>, MetaError> {
    let d = reach_dir(t, c, ino)?;
    check(t, c, &d, MAY_READ)?;
    let rows = t.list_dentries(ino, after, page(limit))?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        match t.get_inode(row.ino)? {
            Some(child) => {
                out.push(DirEntry { name: row.name, attr: child.attr, cookie: row.cookie, has_xattrs: row.has_xattrs })
            }
            None => tracing::warn!(dir = ino, child = row.ino, "directory entry points at a missing inode"),
        }
    }
    Ok(out)
}

/// What `create` made (or found, for a non-exclusive create of an existing file).
pub(crate) struct Created {
    pub attr: Attr,
    /// False when an existing regular file was returned.
    pub created: bool,
    /// The parent directory's attributes after the create.
    pub parent: Attr,
}

/// Makes a node (a non-exclusive create of an existing regular file returns that file).
/// It inherits the directory's default ACL where there is one (a directory keeps it as
/// its own default too), and otherwise gets the mode asked for less the umask.
pub(super) fn create(t: &mut dyn Txn, now: Timestamp, req: Create, caller: &Caller) -> Result<Created, MetaError> {
    let (parent, name) = (req.parent, req.name.clone());
    match new_node(t, now, req, caller)? {
        Fresh::Found(found) => Ok(found),
        Fresh::Made(new) => {
            let parent = enter(t, parent, &name, &new, now)?;
            Ok(Created { attr: new.attr, created: true, parent })
        }
    }
}

/// What `new_node` did: found an existing file a non-exclusive create returns, or made
/// an inode that no entry names yet.
pub(crate) enum Fresh {
    Found(Created),
    Made(Inode),
}

/// The first half of `create`: the checks, and the new inode with its inherited ACLs;
/// `enter` then names it in its directory. A junction runs the halves in two homes
/// (`MetaService::make_junction`).
pub(crate) fn new_node(t: &mut dyn Txn, now: Timestamp, req: Create, caller: &Caller) -> Result<Fresh, MetaError> {
    let Create { parent, name, node, mode, umask, exclusive } = req;
    check_name(&name)?;
    t.prefetch(Prefetch::entry(parent, &name))?;
    let p = reach_dir(t, caller, parent)?;
    check(t, caller, &p, MAY_EXEC)?;
    if let Some(existing) = t.get_dentry(parent, &name)? {
        let e = inode(t, existing)?;
        if !exclusive && e.attr.kind == FileKind::File && node == NewNode::File {
            return Ok(Fresh::Found(Created { attr: e.attr, created: false, parent: p.attr }));
        }
        return Err(MetaError::Exists(show(&name)));
    }
    check(t, caller, &p, MAY_WRITE)?;
    let (kind, rdev, target) = match node {
        NewNode::File => (FileKind::File, 0, Vec::new()),
        NewNode::Dir => (FileKind::Dir, 0, Vec::new()),
        NewNode::Symlink { target } => {
            if target.is_empty() || target.len() > 4096 {
                return Err(MetaError::InvalidArgument(format!("symlink target of {} bytes", target.len())));
            }
            (FileKind::Symlink, 0, target)
        }
        NewNode::Special { kind: FileKind::Dir | FileKind::Symlink, .. } => {
            return Err(MetaError::InvalidArgument("mknod cannot make directories or symlinks".into()));
        }
        NewNode::Special { kind, rdev } => (kind, rdev, Vec::new()),
    };
    let mut mode = mode & 0o7777;
    let gid = if p.attr.mode & 0o2000 != 0 {
        if kind == FileKind::Dir {
            mode |= 0o2000;
        }
        p.attr.gid
    } else {
        caller.gid
    };
    let default_acl = if kind != FileKind::Symlink { perm::stored_acl(t, &p, acl::DEFAULT)? } else { None };
    let (access_acl, mode) = match &default_acl {
        Some(default) => default.inherit(mode),
        None if kind == FileKind::Symlink => (None, mode),
        None => (None, mode & !umask),
    };
    let mode = perm::creation_mode(caller, kind, mode, gid);
    let ino = t.next_id(Counter::Inode)?;
    let is_dir = kind == FileKind::Dir;
    let size = match kind {
        FileKind::Dir => 4096,
        FileKind::Symlink => target.len() as u64,
        _ => 0,
    };
    let new = Inode {
        attr: Attr {
            ino,
            kind,
            mode,
            uid: caller.uid,
            gid,
            size,
            nlink: if is_dir { 2 } else { 1 },
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            data_version: 0,
        },
        parent,
        target,
        acls: AclMarks { access: access_acl.is_some(), default: is_dir && default_acl.is_some() },
    };
    t.put_inode(&new)?;
    if let Some(access) = &access_acl {
        t.set_xattr(ino, acl::ACCESS, &access.encode())?;
    }
    if let (true, Some(default)) = (is_dir, &default_acl) {
        t.set_xattr(ino, acl::DEFAULT, &default.encode())?;
    }
    Ok(Fresh::Made(new))
}

/// The second half of `create`: names `new` `name` in directory `parent` (refused if
/// the name was taken since `new_node` looked); returns the directory's attributes.
pub(crate) fn enter(
    t: &mut dyn Txn,
    parent: InodeId,
    name: &[u8],
    new: &Inode,
    now: Timestamp,
) -> Result<Attr, MetaError> {
    if t.get_dentry(parent, name)?.is_some() {
        return Err(MetaError::Exists(show(name)));
    }
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(parent, name, new.attr.ino, cookie)?;
    touch_dir(t, parent, now, if new.attr.kind == FileKind::Dir { 1 } else { 0 })
}

pub(super) fn link(
    t: &mut dyn Txn,
    c: &Caller,
    now: Timestamp,
    ino: InodeId,
    new_parent: InodeId,
    new_name: &[u8],
) -> Result<Attr, MetaError> {
    check_name(new_name)?;
    let np = reach_dir(t, c, new_parent)?;
    check(t, c, &np, MAY_WRITE | MAY_EXEC)?;
    let mut i = reach(t, c, ino)?;
    if i.attr.kind == FileKind::Dir {
        return Err(MetaError::NotPermitted(format!("hard link to directory inode {ino}")));
    }
    perm::check_hardlink(t, c, &i)?;
    if i.attr.nlink == 0 {
        return Err(MetaError::NotFound(format!("inode {ino} (already unlinked)")));
    }
    if t.get_dentry(new_parent, new_name)?.is_some() {
        return Err(MetaError::Exists(show(new_name)));
    }
    i.attr.nlink = i.attr.nlink.saturating_add(1);
    i.attr.ctime = now;
    t.put_inode(&i)?;
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(new_parent, new_name, ino, cookie)?;
    touch_dir(t, new_parent, now, 0)?;
    Ok(i.attr)
}

/// Drops one link of a non-directory, whose name in directory `from` is gone; returns
/// whether it lives on as an orphan. A file that keeps other names keeps a parent that
/// holds one (`perm::check_reach` walks up from it).
pub(super) fn drop_link(t: &mut dyn Txn, now: Timestamp, mut i: Inode, from: InodeId) -> Result<bool, MetaError> {
    i.attr.nlink = i.attr.nlink.saturating_sub(1);
    i.attr.ctime = now;
    if i.attr.nlink > 0 {
        if i.parent == from
            && let Some(other) = t.parents_of(i.attr.ino)?.into_iter().find(|&p| p != from)
        {
            i.parent = other;
        }
        t.put_inode(&i)?;
        return Ok(false);
    }
    if t.count_opens(i.attr.ino)? > 0 {
        t.put_inode(&i)?;
        return Ok(true);
    }
    destroy(t, i.attr.ino)?;
    Ok(false)
}

pub(super) fn unlink(
    t: &mut dyn Txn,
    c: &Caller,
    now: Timestamp,
    parent: InodeId,
    name: &[u8],
) -> Result<Unlinked, MetaError> {
    check_name(name)?;
    t.prefetch(Prefetch { entry_extents: true, ..Prefetch::entry(parent, name) })?;
    let p = reach_dir(t, c, parent)?;
    check(t, c, &p, MAY_EXEC)?;
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let i = inode(t, ino)?;
    perm::check_delete(t, c, &p, &i.attr)?;
    if i.attr.kind == FileKind::Dir {
        return Err(MetaError::IsDir(show(name)));
    }
    t.delete_dentry(parent, name)?;
    let parent = touch_dir(t, parent, now, 0)?;
    let orphaned = drop_link(t, now, i, parent.ino)?;
    Ok(Unlinked { ino, orphaned, parent })
}

pub(super) fn is_empty_dir(t: &mut dyn Txn, ino: InodeId) -> Result<bool, MetaError> {
    Ok(t.list_dentries(ino, 0, 1)?.is_empty())
}

pub(super) fn rmdir(
    t: &mut dyn Txn,
    c: &Caller,
    now: Timestamp,
    parent: InodeId,
    name: &[u8],
) -> Result<Attr, MetaError> {
    check_name(name)?;
    t.prefetch(Prefetch::entry(parent, name))?;
    let p = reach_dir(t, c, parent)?;
    check(t, c, &p, MAY_EXEC)?;
    let ino = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let i = inode(t, ino)?;
    perm::check_delete(t, c, &p, &i.attr)?;
    if i.attr.kind != FileKind::Dir {
        return Err(MetaError::NotDir(show(name)));
    }
    if !is_empty_dir(t, ino)? {
        return Err(MetaError::NotEmpty(show(name)));
    }
    t.delete_dentry(parent, name)?;
    destroy(t, ino)?;
    touch_dir(t, parent, now, -1)
}

/// Refuses to move directory `moving` under `dest` if `dest` lies inside it.
pub(super) fn ensure_not_within(t: &mut dyn Txn, dest: InodeId, moving: InodeId) -> Result<(), MetaError> {
    let mut cur = dest;
    for _ in 0..MAX_DEPTH {
        if cur == moving {
            return Err(MetaError::InvalidArgument(format!("cannot move directory {moving} into its own subtree")));
        }
        if cur == ROOT_INODE {
            return Ok(());
        }
        cur = inode(t, cur)?.parent;
    }
    Err(MetaError::Corrupt(format!("parent chain of inode {dest} does not reach the root")))
}

/// Points an inode at its new parent directory and stamps its ctime.
pub(super) fn reparent(t: &mut dyn Txn, ino: InodeId, parent: InodeId, now: Timestamp) -> Result<(), MetaError> {
    let mut i = inode(t, ino)?;
    i.parent = parent;
    i.attr.ctime = now;
    t.put_inode(&i)
}

/// Checks that `c` may move `moving` out of (or into) directory `dir` (`other` is the
/// other directory of the rename): write and search on `dir`, the sticky rule, and
/// write on a directory that changes parent (its `..` changes).
fn check_move(t: &mut dyn Txn, c: &Caller, dir: &Inode, other: InodeId, moving: InodeId) -> Result<(), MetaError> {
    let m = inode(t, moving)?;
    perm::check_delete(t, c, dir, &m.attr)?;
    if m.attr.kind == FileKind::Dir && dir.attr.ino != other {
        check(t, c, &m, MAY_WRITE)?;
    }
    Ok(())
}

pub(super) fn rename(
    t: &mut dyn Txn,
    ctx: &Ctx,
    parent: InodeId,
    name: &[u8],
    new_parent: InodeId,
    new_name: &[u8],
    mode: RenameMode,
) -> Result<(), MetaError> {
    let (c, now) = (&ctx.caller, ctx.now);
    check_name(name)?;
    check_name(new_name)?;
    let p = reach_dir(t, c, parent)?;
    let np = reach_dir(t, c, new_parent)?;
    check(t, c, &p, MAY_EXEC)?;
    check(t, c, &np, MAY_WRITE | MAY_EXEC)?;
    let src = t.get_dentry(parent, name)?.ok_or_else(|| MetaError::NotFound(show(name)))?;
    let dst = t.get_dentry(new_parent, new_name)?;
    check_move(t, c, &p, new_parent, src)?;
    if let Some(d) = dst
        && d != src
    {
        if mode == RenameMode::Exchange {
            check_move(t, c, &np, parent, d)?;
        } else {
            let victim = inode(t, d)?.attr;
            perm::check_delete(t, c, &np, &victim)?;
        }
    }
    if parent == new_parent && name == new_name {
        return match mode {
            RenameMode::NoReplace => Err(MetaError::Exists(show(new_name))),
            _ => Ok(()),
        };
    }
    let src_dir = inode(t, src)?.attr.kind == FileKind::Dir;
    if mode == RenameMode::NoReplace && dst.is_some() {
        return Err(MetaError::Exists(show(new_name)));
    }
    if src_dir {
        ensure_not_within(t, new_parent, src)?;
    }
    if mode == RenameMode::Exchange {
        let dst = dst.ok_or_else(|| MetaError::NotFound(show(new_name)))?;
        if dst == src {
            return Ok(());
        }
        let dst_dir = inode(t, dst)?.attr.kind == FileKind::Dir;
        if dst_dir {
            ensure_not_within(t, parent, dst)?;
        }
        t.delete_dentry(parent, name)?;
        t.delete_dentry(new_parent, new_name)?;
        let c1 = t.next_id(Counter::Cookie)?;
        t.put_dentry(parent, name, dst, c1)?;
        let c2 = t.next_id(Counter::Cookie)?;
        t.put_dentry(new_parent, new_name, src, c2)?;
        reparent(t, src, new_parent, now)?;
        reparent(t, dst, parent, now)?;
        let moved = if parent == new_parent { 0 } else { i64::from(src_dir) - i64::from(dst_dir) };
        touch_dir(t, parent, now, -moved)?;
        touch_dir(t, new_parent, now, moved)?;
        return Ok(());
    }
    if let Some(d) = dst {
        if d == src {
            // Two names of one inode: POSIX says do nothing.
            return Ok(());
        }
        let d_inode = inode(t, d)?;
        let dst_dir = d_inode.attr.kind == FileKind::Dir;
        match (src_dir, dst_dir) {
            (true, false) => return Err(MetaError::NotDir(show(new_name))),
            (false, true) => return Err(MetaError::IsDir(show(new_name))),
            (true, true) if !is_empty_dir(t, d)? => {
                return Err(MetaError::NotEmpty(show(new_name)));
            }
            _ => {}
        }
        t.delete_dentry(new_parent, new_name)?;
        if dst_dir {
            destroy(t, d)?;
            touch_dir(t, new_parent, now, -1)?;
        } else {
            drop_link(t, now, d_inode, new_parent)?;
        }
    }
    t.delete_dentry(parent, name)?;
    let cookie = t.next_id(Counter::Cookie)?;
    t.put_dentry(new_parent, new_name, src, cookie)?;
    reparent(t, src, new_parent, now)?;
    let moved = i64::from(src_dir && parent != new_parent);
    touch_dir(t, parent, now, -moved)?;
    touch_dir(t, new_parent, now, moved)?;
    Ok(())
}

pub(super) fn time_of(set: TimeSet, now: Timestamp) -> Timestamp {
    match set {
        TimeSet::Now => now,
        TimeSet::At(ts) => ts,
    }
}

pub(super) fn set_attr(
    t: &mut dyn Txn,
    ctx: &Ctx,
    ino: InodeId,
    set: &AttrChanges,
    session: Option<SessionId>,
) -> Result<Attr, MetaError> {
    let now = ctx.now;
    let mut i = reach(t, &ctx.caller, ino)?;
    let open_for_writing = match session {
        Some(s) => super::locks::open_for_writing(t, s, ino)?,
        None => false,
    };
    let new_mode = perm::check_set_attr(t, &ctx.caller, &i, set, open_for_writing)?;
    if let Some(size) = set.size {
        require_file(&i)?;
        truncate(t, &mut i, size, now)?;
        perm::drop_privileges(&ctx.caller, &mut i.attr, false);
    }
    if set.uid.is_some() || set.gid.is_some() {
        perm::drop_privileges(&ctx.caller, &mut i.attr, true);
    }
    // A mode given with the change is what the caller (the kernel) computed: it wins,
    // and the access ACL's owner, mask and other entries follow it (`posix_acl_chmod`).
    if let Some(mode) = new_mode {
        i.attr.mode = mode;
        if let Some(mut acl) = perm::stored_acl(t, &i, acl::ACCESS)? {
            acl.chmod(mode);
            t.set_xattr(ino, acl::ACCESS, &acl.encode())?;
        }
    }
    if let Some(uid) = set.uid {
        i.attr.uid = uid;
    }
    if let Some(gid) = set.gid {
        i.attr.gid = gid;
    }
    if let Some(a) = set.atime {
        i.attr.atime = time_of(a, now);
    }
    if let Some(m) = set.mtime {
        i.attr.mtime = time_of(m, now);
    }
    i.attr.ctime = now;
    t.put_inode(&i)?;
    Ok(i.attr)
}

pub(super) fn set_xattr(
    t: &mut dyn Txn,
    c: &Caller,
    now: Timestamp,
    ino: InodeId,
    name: &[u8],
    value: &[u8],
    mode: XattrMode,
) -> Result<(), MetaError> {
    check_xattr_name(name)?;
    if value.len() > XATTR_VALUE_MAX {
        return Err(MetaError::InvalidArgument(format!(
            "attribute value of {} bytes exceeds {XATTR_VALUE_MAX}",
            value.len()
        )));
    }
    let mut i = reach(t, c, ino)?;
    check_xattr(t, c, &i, name, true)?;
    let present = t.get_xattr(ino, name)?.is_some();
    match mode {
        XattrMode::Create if present => {
            return Err(MetaError::Exists(format!("extended attribute {}", show(name))));
        }
        XattrMode::Replace if !present => return Err(MetaError::NoAttribute(show(name))),
        _ => {}
    }
    if name == acl::ACCESS || name == acl::DEFAULT {
        set_acl(t, c, &mut i, name, value)?;
    } else {
        t.set_xattr(ino, name, value)?;
    }
    i.attr.ctime = now;
    t.put_inode(&i)
}

/// Sets (an empty value: removes) an ACL, as Linux's `set_posix_acl` does: a default
/// ACL only on a directory; an access ACL also sets the mode's permission bits (owner,
/// mask, other) and, when it says no more than a mode does, is kept as the mode alone;
/// the setgid bit goes when the caller is not in the file's group. `i` is stored by
/// the caller.
fn set_acl(t: &mut dyn Txn, c: &Caller, i: &mut Inode, name: &[u8], value: &[u8]) -> Result<(), MetaError> {
    if i.attr.kind == FileKind::Symlink {
        return Err(MetaError::Unsupported(format!("{} on symlink {}: symlinks have no ACLs", show(name), i.attr.ino)));
    }
    if value.is_empty() {
        return remove_acl(t, i, name).map(|_| ());
    }
    let acl = Acl::decode(value)?;
    if name == acl::DEFAULT {
        if i.attr.kind != FileKind::Dir {
            return Err(MetaError::PermissionDenied(format!(
                "inode {} is not a directory: only directories have a default ACL",
                i.attr.ino
            )));
        }
        i.acls.default = true;
        return t.set_xattr(i.attr.ino, name, &acl.encode());
    }
    i.attr.mode = (i.attr.mode & !0o777) | acl.mode_bits();
    if !perm::is_root(c) && !c.in_group(i.attr.gid) {
        i.attr.mode &= !0o2000;
    }
    if acl.is_minimal() {
        remove_acl(t, i, name)?;
        return Ok(());
    }
    i.acls.access = true;
    t.set_xattr(i.attr.ino, name, &acl.encode())
}

/// Drops an ACL and its mark (the mode stays as it is); whether there was one.
pub(super) fn remove_acl(t: &mut dyn Txn, i: &mut Inode, name: &[u8]) -> Result<bool, MetaError> {
    if name == acl::ACCESS {
        i.acls.access = false;
    } else {
        i.acls.default = false;
    }
    t.delete_xattr(i.attr.ino, name)
}

/// Removes an inode with everything hanging off it, releasing its chunk references.
pub(super) fn destroy(t: &mut dyn Txn, ino: InodeId) -> Result<(), MetaError> {
    punch(t, ino, 0, u64::MAX)?;
    t.delete_all_xattrs(ino)?;
    t.delete_policy(ino)?;
    t.delete_inode(ino)
}
