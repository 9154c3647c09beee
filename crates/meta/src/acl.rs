//! POSIX access control lists as Linux keeps them (`system.posix_acl_access` and
//! `system.posix_acl_default`, in the kernel's xattr encoding), with the rules ext4,
//! CephFS and Lustre follow: evaluation (`posix_acl_permission`), the mode that mirrors
//! an access ACL, chmod rewriting it, and a new node inheriting its directory's default
//! ACL. Meta stores an ACL as the xattr row of its name, its entries' ids in global
//! numbering (`identity` maps them at the site boundary), and marks the inode so that a
//! permission check reads it only where one exists (`store::Inode::acls`).

use crate::error::MetaError;
use proto::types::Caller;

/// The name of an inode's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The name of a directory's default ACL (inherited by what is made inside it).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Whether an xattr name is one of the ACLs.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;
/// The id an entry without one carries (`ACL_UNDEFINED_ID`).
const NO_ID: u32 = u32::MAX;
/// Linux caps an ACL at what fits an xattr value; ext4 at 32 entries per block, XFS at
/// thousands. One large enough for any real use, small enough to evaluate in a check.
const MAX_ENTRIES: usize = 1024;

/// Which subject an entry is about, in the order entries are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// The file's owner (mirrors the mode's owner bits).
    UserObj,
    /// A named user.
    User,
    /// The file's group (mirrors the mode's group bits when there is no mask).
    GroupObj,
    /// A named group.
    Group,
    /// The upper bound for named users, the owning group and named groups (mirrors
    /// the mode's group bits).
    Mask,
    /// Everyone else (mirrors the mode's other bits).
    Other,
}

impl Tag {
    fn code(self) -> u16 {
        match self {
            Tag::UserObj => 0x01,
            Tag::User => 0x02,
            Tag::GroupObj => 0x04,
            Tag::Group => 0x08,
            Tag::Mask => 0x10,
            Tag::Other => 0x20,
        }
    }

    fn of(code: u16) -> Option<Tag> {
        Some(match code {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    fn named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

/// One entry: a subject and its read/write/execute bits (`perm::MAY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    /// The uid or gid of a named entry; unused for the others.
    pub id: u32,
    pub perm: u32,
}

/// A valid ACL: exactly one owner, owning-group and other entry, a mask wherever
/// there is a named entry, named ids unique, entries in the kernel's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

fn invalid(why: impl std::fmt::Display) -> MetaError {
    MetaError::InvalidArgument(format!("invalid POSIX ACL: {why}"))
}

impl Acl {
    /// Decodes and validates an xattr value (EINVAL on anything the kernel would refuse).
    pub fn decode(value: &[u8]) -> Result<Acl, MetaError> {
        let (header, body) = value.split_at_checked(HEADER).ok_or_else(|| invalid("shorter than its header"))?;
        let version = u32::from_le_bytes(header.try_into().expect("4-byte header"));
        if version != VERSION {
            return Err(invalid(format_args!("version {version}, expected {VERSION}")));
        }
        if body.len() % ENTRY != 0 {
            return Err(invalid(format_args!("{} bytes of entries, not a multiple of {ENTRY}", body.len())));
        }
        if body.len() / ENTRY > MAX_ENTRIES {
            return Err(invalid(format_args!("{} entries, at most {MAX_ENTRIES}", body.len() / ENTRY)));
        }
        let mut entries = Vec::with_capacity(body.len() / ENTRY);
        for raw in body.chunks_exact(ENTRY) {
            let code = u16::from_le_bytes([raw[0], raw[1]]);
            let perm = u16::from_le_bytes([raw[2], raw[3]]) as u32;
            let id = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
            let tag = Tag::of(code).ok_or_else(|| invalid(format_args!("unknown tag {code:#x}")))?;
            if perm & !7 != 0 {
                return Err(invalid(format_args!("permission bits {perm:#o}")));
            }
            entries.push(Entry { tag, id: if tag.named() { id } else { NO_ID }, perm });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(acl)
    }

    /// The kernel's order and counts (`posix_acl_valid`), and unique named ids.
    fn validate(&self) -> Result<(), MetaError> {
        let e = &self.entries;
        if let Some(w) = e.windows(2).find(|w| (w[0].tag, w[0].id) >= (w[1].tag, w[1].id)) {
            return Err(if w[0].tag == w[1].tag {
                invalid(format_args!("two {:?} entries{}", w[0].tag, id_of(&w[0])))
            } else {
                invalid(format_args!("{:?} entry after {:?}", w[1].tag, w[0].tag))
            });
        }
        for required in [Tag::UserObj, Tag::GroupObj, Tag::Other] {
            if !e.iter().any(|x| x.tag == required) {
                return Err(invalid(format_args!("no {required:?} entry")));
            }
        }
        if e.iter().any(|x| x.tag.named()) && !e.iter().any(|x| x.tag == Tag::Mask) {
            return Err(invalid("named entries without a mask"));
        }
        Ok(())
    }

    /// The kernel's xattr encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + ENTRY * self.entries.len());
        out.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.code().to_le_bytes());
            out.extend_from_slice(&(e.perm as u16).to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// Renumbers the named entries (`uid` for users, `gid` for groups), keeping the order
    /// valid; an id `None` refuses the whole ACL with the error it names.
    pub fn map_ids(
        &mut self,
        mut uid: impl FnMut(u32) -> Result<u32, MetaError>,
        mut gid: impl FnMut(u32) -> Result<u32, MetaError>,
    ) -> Result<(), MetaError> {
        for e in &mut self.entries {
            match e.tag {
                Tag::User => e.id = uid(e.id)?,
                Tag::Group => e.id = gid(e.id)?,
                _ => {}
            }
        }
        self.entries.sort_by_key(|e| (e.tag, e.id));
        self.validate()
    }

    fn perm_of(&self, tag: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// Whether the entries say no more than a mode does (owner, owning group, other):
    /// such an access ACL is kept as the mode alone.
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    /// The permission bits (`0o777`) the mode mirrors: owner, mask (or owning group
    /// without a mask), other (`posix_acl_equiv_mode`).
    pub fn mode_bits(&self) -> u32 {
        let group = self.perm_of(Tag::Mask).or(self.perm_of(Tag::GroupObj)).unwrap_or(0);
        self.perm_of(Tag::UserObj).unwrap_or(0) << 6 | group << 3 | self.perm_of(Tag::Other).unwrap_or(0)
    }

    /// A chmod to `mode` rewrites the entries the mode mirrors (`posix_acl_chmod`).
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => e.perm = (mode >> 6) & 7,
                Tag::Mask => e.perm = (mode >> 3) & 7,
                Tag::GroupObj if !has_mask => e.perm = (mode >> 3) & 7,
                Tag::Other => e.perm = mode & 7,
                _ => {}
            }
        }
    }

    /// A node made with `mode` in a directory with this default ACL: its access ACL
    /// (`None` when the mode says it all) and its mode, each narrowed by the other
    /// (`posix_acl_create_masq`); the umask does not apply.
    pub fn inherit(&self, mode: u32) -> (Option<Acl>, u32) {
        let mut acl = self.clone();
        let mut mode = mode;
        let has_mask = acl.entries.iter().any(|e| e.tag == Tag::Mask);
        for e in &mut acl.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= (mode >> 6) & 7;
                    mode &= !0o700 | e.perm << 6;
                }
                Tag::Other => {
                    e.perm &= mode & 7;
                    mode &= !0o007 | e.perm;
                }
                Tag::Mask | Tag::GroupObj if (e.tag == Tag::Mask) == has_mask => {
                    e.perm &= (mode >> 3) & 7;
                    mode &= !0o070 | e.perm << 3;
                }
                _ => {}
            }
        }
        ((!acl.is_minimal()).then_some(acl), mode)
    }

    /// Whether `c` (neither the owner nor the superuser: the mode answers those) has
    /// every bit of `want` on a file owned by group `owner_gid` (`posix_acl_permission`).
    pub fn permits(&self, c: &Caller, owner_gid: u32, want: u32) -> bool {
        let masked = |perm: u32| perm & self.perm_of(Tag::Mask).unwrap_or(7);
        let mut in_a_group = false;
        for e in &self.entries {
            match e.tag {
                Tag::User if e.id == c.uid => return masked(e.perm) & want == want,
                Tag::GroupObj | Tag::Group if c.in_group(if e.tag == Tag::Group { e.id } else { owner_gid }) => {
                    in_a_group = true;
                    if masked(e.perm) & want == want {
                        return true;
                    }
                }
                Tag::Other => return !in_a_group && e.perm & want == want,
                _ => {}
            }
        }
        false
    }
}

fn id_of(e: &Entry) -> String {
    if e.tag.named() { format!(" for id {}", e.id) } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(Tag, u32, u32)]) -> Acl {
        Acl { entries: entries.iter().map(|&(tag, id, perm)| Entry { tag, id, perm }).collect() }
    }

    fn user(uid: u32, groups: &[u32]) -> Caller {
        Caller { uid, gid: groups.first().copied().unwrap_or(uid), groups: groups.to_vec() }
    }

    const NONE: u32 = NO_ID;

    /// `u::rw-,u:1001:rwx,g::r--,g:50:rw-,m::rw-,o::---`
    fn typical() -> Acl {
        acl(&[
            (Tag::UserObj, NONE, 6),
            (Tag::User, 1001, 7),
            (Tag::GroupObj, NONE, 4),
            (Tag::Group, 50, 6),
            (Tag::Mask, NONE, 6),
            (Tag::Other, NONE, 0),
        ])
    }

    #[test]
    fn the_kernels_encoding_round_trips_and_bad_values_are_einval() {
        let a = typical();
        let bytes = a.encode();
        assert_eq!(bytes.len(), 4 + 6 * 8);
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        assert_eq!(Acl::decode(&bytes).unwrap(), a);
        let refused = |v: &[u8]| matches!(Acl::decode(v), Err(MetaError::InvalidArgument(_)));
        assert!(refused(&[]));
        assert!(refused(&[1, 0, 0, 0]));
        assert!(refused(&bytes[..bytes.len() - 1]));
        let mut wrong_perm = bytes.clone();
        wrong_perm[6] = 8;
        assert!(refused(&wrong_perm));
        let mut wrong_tag = bytes.clone();
        wrong_tag[4] = 0x40;
        assert!(refused(&wrong_tag));
        // Out of order, duplicated, missing a required entry, named without a mask.
        let swapped = acl(&[(Tag::GroupObj, NONE, 4), (Tag::UserObj, NONE, 6), (Tag::Other, NONE, 0)]);
        assert!(refused(&swapped.encode()));
        let twice = acl(&[
            (Tag::UserObj, NONE, 6),
            (Tag::User, 7, 6),
            (Tag::User, 7, 4),
            (Tag::GroupObj, NONE, 4),
            (Tag::Mask, NONE, 6),
            (Tag::Other, NONE, 0),
        ]);
        assert!(refused(&twice.encode()));
        assert!(refused(&acl(&[(Tag::UserObj, NONE, 6), (Tag::Other, NONE, 0)]).encode()));
        let unmasked =
            acl(&[(Tag::UserObj, NONE, 6), (Tag::User, 7, 6), (Tag::GroupObj, NONE, 4), (Tag::Other, NONE, 0)]);
        assert!(refused(&unmasked.encode()));
        // A valid one from the kernel has undefined ids on unnamed entries.
        assert!(
            Acl::decode(&acl(&[(Tag::UserObj, NONE, 7), (Tag::GroupObj, NONE, 5), (Tag::Other, NONE, 0)]).encode())
                .unwrap()
                .is_minimal()
        );
    }

    #[test]
    fn evaluation_follows_posix_acl_permission() {
        let a = typical();
        // A named user gets its entry within the mask: rwx masked to rw-.
        assert!(a.permits(&user(1001, &[]), 100, 4 | 2));
        assert!(!a.permits(&user(1001, &[]), 100, 1));
        // The owning group r--; a named group rw-; a member of both gets the better.
        assert!(a.permits(&user(2000, &[100]), 100, 4));
        assert!(!a.permits(&user(2000, &[100]), 100, 2));
        assert!(a.permits(&user(2000, &[100, 50]), 100, 2));
        // A group member matching no entry's bits is denied, not sent to other.
        let open_other = {
            let mut x = a.clone();
            x.chmod(0o647);
            x
        };
        assert!(!open_other.permits(&user(2000, &[100]), 100, 2));
        assert!(open_other.permits(&user(2001, &[]), 100, 7));
        // Everyone else: other.
        assert!(!a.permits(&user(2001, &[]), 100, 4));
    }

    #[test]
    fn the_mode_mirrors_owner_mask_and_other_and_chmod_writes_them_back() {
        let mut a = typical();
        assert_eq!(a.mode_bits(), 0o660);
        a.chmod(0o751);
        assert_eq!(a.mode_bits(), 0o751);
        assert_eq!(a.perm_of(Tag::GroupObj), Some(4), "with a mask, chmod leaves the owning group's entry");
        let mut plain = acl(&[(Tag::UserObj, NONE, 6), (Tag::GroupObj, NONE, 4), (Tag::Other, NONE, 4)]);
        plain.chmod(0o700);
        assert_eq!(plain.perm_of(Tag::GroupObj), Some(0));
    }

    #[test]
    fn inheritance_narrows_the_default_by_the_mode_and_the_mode_by_the_default() {
        let default = typical();
        let (access, mode) = default.inherit(0o2777);
        let access = access.expect("named entries make an extended ACL");
        assert_eq!(mode, 0o2660, "the mode takes the default's owner, mask and other; setgid stays");
        assert_eq!(access.perm_of(Tag::Mask), Some(6));
        let (access, mode) = default.inherit(0o600);
        assert_eq!(mode, 0o600);
        assert_eq!(access.unwrap().perm_of(Tag::Mask), Some(0));
        let minimal = acl(&[(Tag::UserObj, NONE, 7), (Tag::GroupObj, NONE, 5), (Tag::Other, NONE, 5)]);
        assert_eq!(minimal.inherit(0o666), (None, 0o644));
    }

    #[test]
    fn renumbering_keeps_the_order_and_refuses_unmapped_ids() {
        let mut a = typical();
        a.map_ids(|u| Ok(u + 1_000_000), |g| Ok(g + 5)).unwrap();
        assert!(a.entries.iter().any(|e| e.tag == Tag::User && e.id == 1_001_001));
        assert!(a.entries.iter().any(|e| e.tag == Tag::Group && e.id == 55));
        let err = typical().map_ids(|u| Err(MetaError::InvalidArgument(format!("uid {u}"))), Ok).unwrap_err();
        assert!(err.to_string().contains("uid 1001"), "{err}");
    }
}
