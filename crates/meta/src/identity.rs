//! Identity across sites. Meta stores owners as global ids: a grid principal (an
//! X.509 subject such as `/DC=org/DC=grid/CN=Alice Smith`) has a row in the principal
//! table and the id `PRINCIPAL_BASE + row`; each site maps principals to its own uids
//! and gids with a map file (the grid-mapfile shape of GSI), so Alice, uid 1001 at
//! site a, is uid 5003 at site b. Meta applies the maps itself: it is the one that must
//! refuse, and a client only ever sees and sends its own site's numbers.
//!
//! Map file (one per site, reloaded when it changes):
//! ```text
//! # users: "<principal>" <local name> <uid>
//! "/DC=org/DC=grid/CN=Alice Smith" alice 1001
//! [groups]
//! # groups: "<principal>" <local name> <gid>
//! "/DC=org/DC=grid/OU=Physics" physics 2001
//! # who unmapped identities become (default 65534 65534)
//! nobody 65534 65534
//! ```
//! A site without a map numbers owners with its local ids directly (a single-site
//! cluster needs none); it cannot claim a principal's id.

use crate::acl::Acl;
use crate::error::MetaError;
use proto::types::{Attr, Caller};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// Owner ids at or above this are principals (`PRINCIPAL_BASE + row id`); ids below
/// are the local ids of sites without a map.
pub const PRINCIPAL_BASE: u32 = 1 << 30;
/// The default uid and gid of unmapped identities and squashed roots.
pub const NOBODY: u32 = 65534;

/// One mapping line: a principal, its local account name and number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub principal: String,
    /// The local account name (for people reading logs; the number is what counts).
    pub name: String,
    pub id: u32,
}

/// A site's map file as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapFile {
    pub users: Vec<MapEntry>,
    pub groups: Vec<MapEntry>,
    /// The uid and gid unmapped identities get.
    pub nobody: (u32, u32),
}

/// Parses a map file; an error names the file, the line and what is wrong with it.
pub fn parse_map(path: &Path, text: &str) -> Result<MapFile, MetaError> {
    let mut out = MapFile { users: Vec::new(), groups: Vec::new(), nobody: (NOBODY, NOBODY) };
    let mut in_groups = false;
    for (n, raw) in text.lines().enumerate() {
        let fail = |msg: String| MetaError::IdentityMap { path: path.display().to_string(), line: n + 1, msg };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line {
            "[users]" => in_groups = false,
            "[groups]" => in_groups = true,
            _ if line.starts_with('[') => {
                return Err(fail(format!("unknown section {line} (known: [users], [groups])")));
            }
            _ if line.starts_with("nobody") => {
                let ids: Vec<&str> = line.split_whitespace().skip(1).collect();
                let [uid, gid] = ids[..] else {
                    return Err(fail("expected `nobody UID GID`".into()));
                };
                out.nobody = (number(uid).map_err(&fail)?, number(gid).map_err(&fail)?);
            }
            _ => {
                let entry = entry(line).map_err(&fail)?;
                let list = if in_groups { &mut out.groups } else { &mut out.users };
                if let Some(other) = list.iter().find(|e| e.principal == entry.principal) {
                    return Err(fail(format!("{:?} is already mapped to {}", entry.principal, other.id)));
                }
                if let Some(other) = list.iter().find(|e| e.id == entry.id) {
                    return Err(fail(format!("{} is already the number of {:?}", entry.id, other.principal)));
                }
                list.push(entry);
            }
        }
    }
    Ok(out)
}

fn number(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("0 cannot be mapped: root is squashed or trusted per site (--no-root-squash)".into()),
        Ok(n) if n >= PRINCIPAL_BASE => Err(format!("{n} is in the range of global principal ids")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

/// `"<principal>" <name> <id>`.
fn entry(line: &str) -> Result<MapEntry, String> {
    let rest = line.strip_prefix('"').ok_or("a mapping starts with the quoted principal")?;
    let (principal, rest) = rest.split_once('"').ok_or("the principal's closing quote is missing")?;
    if principal.is_empty() {
        return Err("empty principal".into());
    }
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let [name, id] = fields[..] else {
        return Err(format!("expected a local name and a number after the principal, found {:?}", rest.trim()));
    };
    Ok(MapEntry { principal: principal.to_string(), name: name.to_string(), id: number(id)? })
}

/// One site's map resolved against the principal table: local <-> global numbers.
#[derive(Debug, Default)]
pub struct SiteIds {
    uid_in: HashMap<u32, u32>,
    uid_out: HashMap<u32, u32>,
    gid_in: HashMap<u32, u32>,
    gid_out: HashMap<u32, u32>,
    nobody: (u32, u32),
}

impl SiteIds {
    /// Resolves `file` with `principal`, which gives (creating if needed) the
    /// principal-table row of a name.
    pub fn resolve(
        file: &MapFile,
        mut principal: impl FnMut(&str) -> Result<u32, MetaError>,
    ) -> Result<SiteIds, MetaError> {
        let mut ids = SiteIds { nobody: file.nobody, ..SiteIds::default() };
        for (entries, into, out) in
            [(&file.users, &mut ids.uid_in, &mut ids.uid_out), (&file.groups, &mut ids.gid_in, &mut ids.gid_out)]
        {
            for e in entries {
                let global = PRINCIPAL_BASE + principal(&e.principal)?;
                into.insert(e.id, global);
                out.insert(global, e.id);
            }
        }
        Ok(ids)
    }
}

/// The maps of a site, or none (local ids are global ones).
type Map = Option<Arc<SiteIds>>;

/// Local uid -> global; root stays root (squashing happens before), unmapped is None.
fn uid_in(map: &Map, uid: u32) -> Option<u32> {
    match map {
        _ if uid == 0 => Some(0),
        Some(m) => m.uid_in.get(&uid).copied(),
        None => (uid < PRINCIPAL_BASE).then_some(uid),
    }
}

fn gid_in(map: &Map, gid: u32) -> Option<u32> {
    match map {
        _ if gid == 0 => Some(0),
        Some(m) => m.gid_in.get(&gid).copied(),
        None => (gid < PRINCIPAL_BASE).then_some(gid),
    }
}

fn nobody(map: &Map) -> (u32, u32) {
    map.as_ref().map_or((NOBODY, NOBODY), |m| m.nobody)
}

/// Gives the principal-table rows of names, adding the ones not there yet.
pub type Principals<'a> = dyn FnMut(&[String]) -> Result<Vec<u32>, MetaError> + 'a;

/// Every site's map, the files they come from, and the sites whose root is trusted.
pub struct Identities {
    maps: RwLock<HashMap<String, Arc<SiteIds>>>,
    sources: Vec<(String, PathBuf)>,
    loaded: Mutex<HashMap<String, SystemTime>>,
    no_root_squash: Vec<String>,
}

/// Whom a request acts for, in global numbers, and the site map its answers are
/// translated with.
#[derive(Debug, Clone)]
pub struct Acting {
    pub caller: Caller,
    pub map: Map,
}

impl Acting {
    /// Acting as the superuser with no translation (nodes, meta, tests).
    pub fn root() -> Acting {
        Acting { caller: Caller::ROOT, map: None }
    }

    /// A `chown` target from the caller's site numbering to the global one.
    pub fn owner_in(&self, uid: Option<u32>, gid: Option<u32>) -> Result<(Option<u32>, Option<u32>), MetaError> {
        let unmapped =
            |what: &str, id: u32| MetaError::InvalidArgument(format!("{what} {id} has no principal at this site"));
        let uid = uid.map(|u| uid_in(&self.map, u).ok_or_else(|| unmapped("uid", u))).transpose()?;
        let gid = gid.map(|g| gid_in(&self.map, g).ok_or_else(|| unmapped("gid", g))).transpose()?;
        Ok((uid, gid))
    }

    /// An ACL value's named ids from the caller's site numbering to the global one. A
    /// principal's global id the site does not map passes as it is (`localize_acl`
    /// shows it so), so an ACL read at one site and written back there keeps the
    /// entries meant for other sites' users; a local id without a principal is refused.
    pub fn acl_in(&self, value: &[u8]) -> Result<Vec<u8>, MetaError> {
        if self.map.is_none() || value.is_empty() {
            return Ok(value.to_vec());
        }
        let unmapped = |what: &str, id: u32| {
            MetaError::InvalidArgument(format!("ACL entry for {what} {id}, which has no principal at this site"))
        };
        let mut acl = Acl::decode(value)?;
        acl.map_ids(
            |u| uid_in(&self.map, u).or((u >= PRINCIPAL_BASE).then_some(u)).ok_or_else(|| unmapped("uid", u)),
            |g| gid_in(&self.map, g).or((g >= PRINCIPAL_BASE).then_some(g)).ok_or_else(|| unmapped("gid", g)),
        )?;
        Ok(acl.encode())
    }

    /// Shows an ACL value's named ids in the caller's site numbering; a principal the
    /// site does not map keeps its global id (see `acl_in`).
    pub fn localize_acl(&self, value: &mut Vec<u8>) {
        let Some(m) = &self.map else { return };
        let Ok(mut acl) = Acl::decode(value) else { return };
        let out = |ids: &HashMap<u32, u32>, id: u32| Ok(ids.get(&id).copied().unwrap_or(id));
        if acl.map_ids(|u| out(&m.uid_out, u), |g| out(&m.gid_out, g)).is_ok() {
            *value = acl.encode();
        }
    }

    /// Shows `a`'s owner in the caller's site numbering: a principal the site does not
    /// map shows as its nobody.
    pub fn localize(&self, a: &mut Attr) {
        let Some(m) = &self.map else { return };
        if a.uid != 0 {
            a.uid = m.uid_out.get(&a.uid).copied().unwrap_or(m.nobody.0);
        }
        if a.gid != 0 {
            a.gid = m.gid_out.get(&a.gid).copied().unwrap_or(m.nobody.1);
        }
    }
}

impl Identities {
    /// No maps: every site numbers owners itself, no site's root is trusted.
    pub fn empty() -> Identities {
        Identities {
            maps: RwLock::default(),
            sources: Vec::new(),
            loaded: Mutex::default(),
            no_root_squash: Vec::new(),
        }
    }

    /// Loads every site's map file (`site`, `path`); a bad file is an error naming
    /// its line. `principal` gives the principal-table row of a name (creating it).
    pub fn load(
        sources: Vec<(String, PathBuf)>,
        no_root_squash: Vec<String>,
        principal: &mut Principals<'_>,
    ) -> Result<Identities, MetaError> {
        let ids = Identities { maps: RwLock::default(), sources, loaded: Mutex::default(), no_root_squash };
        ids.reload(principal)?;
        Ok(ids)
    }

    /// Rereads the map files that changed since they were loaded; returns the sites
    /// reloaded. A file that fails to parse keeps its site's previous map.
    pub fn reload(&self, principal: &mut Principals<'_>) -> Result<Vec<String>, MetaError> {
        let mut reloaded = Vec::new();
        for (site, path) in &self.sources {
            let io = |e: std::io::Error| MetaError::Io { what: format!("identity map {}", path.display()), source: e };
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).map_err(io)?;
            if util::sync::lock(&self.loaded).get(site) == Some(&modified) {
                continue;
            }
            let file = parse_map(path, &std::fs::read_to_string(path).map_err(io)?)?;
            let names: Vec<String> = file.users.iter().chain(&file.groups).map(|e| e.principal.clone()).collect();
            let rows: HashMap<String, u32> = names.iter().cloned().zip(principal(&names)?).collect();
            let resolved = SiteIds::resolve(&file, |name| {
                rows.get(name).copied().ok_or_else(|| MetaError::Internal(format!("no principal row for {name:?}")))
            })?;
            util::sync::write(&self.maps).insert(site.clone(), Arc::new(resolved));
            util::sync::lock(&self.loaded).insert(site.clone(), modified);
            tracing::info!(%site, path = %path.display(), users = file.users.len(), groups = file.groups.len(), "identity map loaded");
            reloaded.push(site.clone());
        }
        Ok(reloaded)
    }

    /// The caller a site's unmapped and unproven users act as (its map's `nobody`).
    pub fn nobody(&self, site: &str) -> Caller {
        let map: Map = util::sync::read(&self.maps).get(site).cloned();
        let (uid, gid) = nobody(&map);
        Caller { uid, gid, groups: Vec::new() }
    }

    /// The uid the principal with global id `principal` has at `site` (`None` if the
    /// site's map does not name it, or the site has no map).
    pub fn local_uid(&self, site: &str, principal: u32) -> Option<u32> {
        let maps = util::sync::read(&self.maps);
        maps.get(site)?.uid_out.get(&principal).copied()
    }

    /// Whether any map file is configured (the reload worker runs only then).
    pub fn has_sources(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Whom a request from a peer of `site` acts for. `secure` says the site comes
    /// from a certificate: root is then squashed unless the site is trusted with
    /// `--no-root-squash`. Without TLS the claimed site and root are taken as they
    /// come (the operator disabled authentication). A caller a mapped site does not
    /// map acts as that site's nobody; a site without a map cannot claim a principal.
    pub fn acting(&self, site: Option<&str>, secure: bool, claimed: Option<Caller>) -> Acting {
        let map: Map = site.and_then(|s| util::sync::read(&self.maps).get(s).cloned());
        let mut c = claimed.unwrap_or(Caller::ROOT);
        let (nobody_uid, nobody_gid) = nobody(&map);
        if secure && !site.is_some_and(|s| self.no_root_squash.iter().any(|t| t == s)) {
            if c.uid == 0 {
                c.uid = nobody_uid;
            }
            if c.gid == 0 {
                c.gid = nobody_gid;
            }
            c.groups.retain(|g| *g != 0);
        }
        let caller = Caller {
            uid: uid_in(&map, c.uid).unwrap_or(nobody_uid),
            gid: gid_in(&map, c.gid).unwrap_or(nobody_gid),
            groups: c.groups.iter().filter_map(|g| gid_in(&map, *g)).collect(),
        };
        Acting { caller, map }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MAP: &str = "# site b\n\"/DC=org/DC=grid/CN=Alice Smith\" alice 5003\n\"/CN=Bob\" bob 5004\n\n[groups]\n\"/OU=Physics\" physics 7000\nnobody 99 98\n";

    fn err(text: &str) -> String {
        parse_map(Path::new("b.map"), text).unwrap_err().to_string()
    }

    #[test]
    fn parses_users_groups_and_nobody() {
        let m = parse_map(Path::new("b.map"), MAP).unwrap();
        assert_eq!(
            m.users[0],
            MapEntry { principal: "/DC=org/DC=grid/CN=Alice Smith".into(), name: "alice".into(), id: 5003 }
        );
        assert_eq!(m.users.len(), 2);
        assert_eq!(m.groups[0].id, 7000);
        assert_eq!(m.nobody, (99, 98));
    }

    #[test]
    fn errors_name_the_line() {
        assert!(
            err("\"/CN=A\" a 1\n\"/CN=B b 2\n").starts_with("identity map b.map:2: the principal's closing quote"),
            "{}",
            err("\"/CN=A\" a 1\n\"/CN=B b 2\n")
        );
        assert!(err("\n\n\"/CN=A\" a\n").contains("b.map:3: expected a local name and a number"));
        assert!(err("\"/CN=A\" a x\n").contains("b.map:1: \"x\" is not a number"));
        assert!(err("\"/CN=A\" a 0\n").contains("0 cannot be mapped"));
        assert!(err("\"/CN=A\" a 1\n\"/CN=A\" b 2\n").contains("b.map:2: \"/CN=A\" is already mapped to 1"));
        assert!(err("\"/CN=A\" a 1\n\"/CN=B\" b 1\n").contains("b.map:2: 1 is already the number of \"/CN=A\""));
        assert!(err("[hosts]\n").contains("b.map:1: unknown section [hosts]"));
        assert!(err("nobody 1\n").contains("b.map:1: expected `nobody UID GID`"));
        assert!(err("alice 1001\n").contains("starts with the quoted principal"));
    }

    proptest::proptest! {
        /// Any text, including near-misses of the real shape, parses or is refused
        /// with the file and a line number; it never panics.
        #[test]
        fn any_text_parses_or_names_its_line(text in "(\"/CN=[a-z]{0,3}\"? ?[a-z]{0,3} ?[0-9x-]{0,6}\n|\\[[a-z]{0,7}\\]\n|nobody ?[0-9]{0,6} ?[0-9]{0,6}\n|#.*\n|.{0,12}\n){0,12}") {
            if let Err(e) = parse_map(Path::new("p.map"), &text) {
                proptest::prop_assert!(e.to_string().starts_with("identity map p.map:"), "{e}");
            }
        }
    }

    /// A file owned by `uid` and `gid`.
    pub(crate) fn owned_by(uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 5,
            kind: proto::types::FileKind::File,
            mode: 0o600,
            uid,
            gid,
            size: 0,
            nlink: 1,
            rdev: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            data_version: 0,
        }
    }

    /// Two sites numbering the same principals differently, as meta resolves them:
    /// Alice is 1001 at site a and 5003 at site b.
    pub(crate) fn two_sites(dir: &Path) -> Identities {
        std::fs::write(
            dir.join("a.map"),
            "\"/DC=org/DC=grid/CN=Alice Smith\" alice 1001\n[groups]\n\"/OU=Physics\" physics 300\n",
        )
        .unwrap();
        std::fs::write(dir.join("b.map"), MAP).unwrap();
        let mut table: Vec<String> = Vec::new();
        let mut principal = |names: &[String]| -> Result<Vec<u32>, MetaError> {
            Ok(names
                .iter()
                .map(|n| match table.iter().position(|t| t == n) {
                    Some(i) => i as u32 + 1,
                    None => {
                        table.push(n.clone());
                        table.len() as u32
                    }
                })
                .collect())
        };
        let sources = vec![("a".into(), dir.join("a.map")), ("b".into(), dir.join("b.map"))];
        Identities::load(sources, vec!["a".into()], &mut principal).unwrap()
    }

    /// `u::rw-,u:UID:r--,g::r--,g:GID:r--,m::r--,o::---` in the kernel's encoding.
    fn acl_naming(uid: u32, gid: u32) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, id, perm) in [
            (1u16, u32::MAX, 6u16),
            (2, uid, 4),
            (4, u32::MAX, 4),
            (8, gid, 4),
            (0x10, u32::MAX, 4),
            (0x20, u32::MAX, 0),
        ] {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    #[test]
    fn acl_entries_are_renumbered_at_each_site_and_survive_a_round_trip_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let ids = two_sites(dir.path());
        let at_a = ids.acting(Some("a"), true, Some(Caller::new(1001, 300)));
        let at_b = ids.acting(Some("b"), true, Some(Caller::new(5003, 7000)));
        // Written at b for bob (5004) and physics (7000): stored with global ids.
        let stored = at_b.acl_in(&acl_naming(5004, 7000)).unwrap();
        let bob = at_b.map.as_ref().unwrap().uid_in[&5004];
        let physics = at_b.map.as_ref().unwrap().gid_in[&7000];
        assert_eq!(stored, acl_naming(bob, physics));
        // Read at a, which does not map bob: his global id shows, physics is 300 there.
        let mut shown = stored.clone();
        at_a.localize_acl(&mut shown);
        assert_eq!(shown, acl_naming(bob, 300));
        // Written back at a (getfacl | setfacl): bob's entry is kept.
        assert_eq!(at_a.acl_in(&shown).unwrap(), stored);
        let mut at_b_again = stored.clone();
        at_b.localize_acl(&mut at_b_again);
        assert_eq!(at_b_again, acl_naming(5004, 7000));
        // A local id the site cannot name is refused, with the id in the message.
        let err = at_a.acl_in(&acl_naming(4242, 300)).unwrap_err();
        assert!(matches!(err, MetaError::InvalidArgument(_)) && err.to_string().contains("uid 4242"), "{err}");
    }

    #[test]
    fn a_principal_has_each_sites_number() {
        let dir = tempfile::tempdir().unwrap();
        let ids = two_sites(dir.path());
        let alice_a = ids.acting(Some("a"), true, Some(Caller { uid: 1001, gid: 300, groups: vec![300, 12] }));
        assert!(alice_a.caller.uid >= PRINCIPAL_BASE);
        assert_eq!(alice_a.caller.groups, vec![alice_a.caller.gid], "unmapped groups are dropped");
        let mut attr = owned_by(alice_a.caller.uid, alice_a.caller.gid);
        let at_b = ids.acting(Some("b"), true, Some(Caller::new(5004, 7000)));
        at_b.localize(&mut attr);
        assert_eq!((attr.uid, attr.gid), (5003, 7000), "alice's file shows as alice's uid at site b");
        // Site b's map has no number for a principal only site a knows.
        assert_eq!(at_b.owner_in(Some(5003), None).unwrap().0, Some(alice_a.caller.uid));
        assert!(at_b.owner_in(Some(4242), None).is_err());
        // Unmapped users act as the site's nobody; root is squashed unless trusted.
        assert_eq!(ids.acting(Some("b"), true, Some(Caller::new(4242, 1))).caller.uid, 99);
        assert_eq!(ids.acting(Some("b"), true, Some(Caller::ROOT)).caller.uid, 99);
        assert_eq!(ids.acting(Some("b"), true, None).caller.uid, 99, "a mount asserting root");
        assert_eq!(ids.acting(Some("a"), true, Some(Caller::ROOT)).caller.uid, 0, "--no-root-squash a");
        assert_eq!(ids.acting(Some("b"), false, Some(Caller::ROOT)).caller.uid, 0, "TLS disabled: trusted");
        // A site without a map keeps its numbers but cannot claim a principal's.
        assert_eq!(ids.acting(Some("c"), true, Some(Caller::new(1001, 1))).caller.uid, 1001);
        assert_eq!(ids.acting(Some("c"), true, Some(Caller::new(alice_a.caller.uid, 1))).caller.uid, NOBODY);
    }

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_map() {
        let dir = tempfile::tempdir().unwrap();
        let ids = two_sites(dir.path());
        let mut principal =
            |names: &[String]| -> Result<Vec<u32>, MetaError> { Ok((1..=names.len() as u32).collect()) };
        assert!(ids.reload(&mut principal).unwrap().is_empty(), "nothing changed");
        let path = dir.path().join("b.map");
        std::fs::write(&path, "\"/CN=Carol\" carol 6000\n").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        assert_eq!(ids.reload(&mut principal).unwrap(), vec!["b".to_string()]);
        assert_eq!(ids.acting(Some("b"), true, Some(Caller::new(6000, 1))).caller.uid, PRINCIPAL_BASE + 1);
        std::fs::write(&path, "\"/CN=Carol carol 6000\n").unwrap();
        let later = later + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        assert!(ids.reload(&mut principal).unwrap_err().to_string().contains("b.map:1"));
        assert_eq!(ids.acting(Some("b"), true, Some(Caller::new(6000, 1))).caller.uid, PRINCIPAL_BASE + 1);
    }
}
