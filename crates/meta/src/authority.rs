//! Whom a request acts for: meta resolves it from what the connection proved (the
//! peer's certificate identity: role and site) and what the request claims (the
//! caller's uid, gid and groups in its site's numbering), through the site's identity
//! map, so every permission check in `ops::perm` runs on something meta decided.

use crate::identity::{Acting, Identities};
use net::{PeerIdentity, Role};
use proto::cap::{CapKey, UserToken};
use proto::types::Caller;
use std::collections::HashMap;
use std::ops::RangeInclusive;

/// The caller a request from `peer` acts as:
/// - meta, node or admin certificate: the superuser, whatever caller it names: such a
///   certificate is never a user (nodes act for the cluster, admins administer; which
///   requests each may make at all is the request table's `RequestFacts::roles`, `proto::meta`);
/// - client certificate: the claimed caller of the certificate's site, mapped by that
///   site's map, root squashed unless the site is trusted (`--no-root-squash`); a
///   request with no caller is the client host's root, squashed alike;
/// - no identity (TLS explicitly disabled by the operator): the claimed caller and
///   site are believed (still mapped), and root is root — trust-the-client mode.
/// - user certificate: nobody (it only logs in, `Login`, which needs no caller).
pub fn resolve(ids: &Identities, peer: Option<&PeerIdentity>, site: Option<&str>, claimed: Option<Caller>) -> Acting {
    match peer {
        Some(PeerIdentity { role: Role::Meta | Role::Node | Role::Admin, .. }) => Acting::root(),
        Some(PeerIdentity { role: Role::User, site, .. }) => ids.acting(Some(site), true, Some(ids.nobody(site))),
        Some(id) => ids.acting(Some(&id.site), true, claimed),
        None => ids.acting(site, false, claimed),
    }
}

/// How much a client host is believed about its users (`locus meta --user-auth`,
/// `--host-ids`). By default a client certificate acts for any uid of its site (NFS's
/// AUTH_SYS trust, with root squashed): one stolen host key is every user of the
/// site. A site named in `token_sites` makes its hosts prove each user with the
/// user's own login (`UserToken`, from `locus login` with a user certificate), so a
/// stolen host key reaches only the users logged in on that host; `host_ids` limits
/// which uids and gids a host may claim at all (Lustre's nodemap).
#[derive(Debug, Default, Clone)]
pub struct UserAuth {
    pub token_sites: Vec<String>,
    pub host_ids: HashMap<String, HostIds>,
}

/// The ids one host certificate may claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIds {
    pub uids: Vec<RangeInclusive<u32>>,
    /// Empty: any gid.
    pub gids: Vec<RangeInclusive<u32>>,
}

impl HostIds {
    /// `UIDS[:GIDS]`, each a comma-separated list of ids and `FIRST-LAST` ranges.
    pub fn parse(text: &str) -> Result<HostIds, String> {
        let ranges = |list: &str| -> Result<Vec<RangeInclusive<u32>>, String> {
            list.split(',')
                .map(|r| {
                    let id = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("{s:?} is not a uid or gid"));
                    match r.split_once('-') {
                        Some((a, b)) if id(a)? <= id(b)? => Ok(id(a)?..=id(b)?),
                        Some(_) => Err(format!("range {r:?} ends before it starts")),
                        None => Ok(id(r)?..=id(r)?),
                    }
                })
                .collect()
        };
        let (uids, gids) = text.split_once(':').unwrap_or((text, ""));
        Ok(HostIds { uids: ranges(uids)?, gids: if gids.is_empty() { Vec::new() } else { ranges(gids)? } })
    }
}

impl UserAuth {
    /// What a client host may claim: the caller it names, or nobody when its site
    /// requires logins and `token` does not prove that uid at that site (or its
    /// `host_ids` do not allow the uid); groups the host may not claim are dropped. Root
    /// and the host's own requests (no caller) pass unchanged: root squashing decides.
    pub fn admit(
        &self,
        ids: &Identities,
        peer: Option<&PeerIdentity>,
        claimed: Option<Caller>,
        token: Option<&UserToken>,
        key: &CapKey,
        now_ms: i64,
    ) -> Option<Caller> {
        let host = match peer {
            Some(p) if p.role == Role::Client => p,
            _ => return claimed,
        };
        let mut c = claimed?;
        if c.uid == 0 {
            return Some(c);
        }
        let nobody = || {
            tracing::debug!(peer = %host, uid = c.uid, "acts as nobody: the host may not claim this user");
            Some(ids.nobody(&host.site))
        };
        if let Some(allowed) = self.host_ids.get(&host.name) {
            if !allowed.uids.iter().any(|r| r.contains(&c.uid)) {
                return nobody();
            }
            if !allowed.gids.is_empty() {
                let ok = |g: &u32| *g == 0 || allowed.gids.iter().any(|r| r.contains(g));
                if !ok(&c.gid) {
                    c.gid = ids.nobody(&host.site).gid;
                }
                c.groups.retain(ok);
            }
        }
        if self.token_sites.contains(&host.site) {
            let proven = token.is_some_and(|t| t.site == host.site && t.uid == c.uid && t.verify(key, now_ms).is_ok());
            if !proven {
                return nobody();
            }
        }
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NOBODY;

    fn id(role: Role) -> PeerIdentity {
        PeerIdentity { name: "/CN=host.a".into(), role, site: "a".into() }
    }

    /// A site that requires logins acts for a uid only with its token (this site, this
    /// uid, signed, current); a host limited by `host_ids` claims only its ranges.
    #[test]
    fn logins_and_host_ranges_bound_what_a_host_may_claim() {
        let ids = Identities::load(Vec::new(), Vec::new(), &mut |_| Ok(Vec::new())).unwrap();
        let key = [1u8; 32];
        let host = id(Role::Client);
        let alice = Caller { uid: 1001, gid: 100, groups: vec![7, 300] };
        let nobody = Some(Caller { uid: NOBODY, gid: NOBODY, groups: vec![] });
        let mut auth = UserAuth::default();
        let admit = |auth: &UserAuth, token: Option<&UserToken>, c: Caller| {
            auth.admit(&ids, Some(&host), Some(c), token, &key, 1000)
        };
        assert_eq!(admit(&auth, None, alice.clone()), Some(alice.clone()), "host trust by default");
        auth.token_sites.push("a".into());
        assert_eq!(admit(&auth, None, alice.clone()), nobody, "no login");
        let token = UserToken::sign(&key, "/CN=Alice", "a", 1001, 5000);
        assert_eq!(admit(&auth, Some(&token), alice.clone()), Some(alice.clone()));
        let bob = Caller::new(1002, 100);
        assert_eq!(admit(&auth, Some(&token), bob), nobody, "alice's token is not bob's");
        let expired = UserToken::sign(&key, "/CN=Alice", "a", 1001, 999);
        assert_eq!(admit(&auth, Some(&expired), alice.clone()), nobody);
        let elsewhere = UserToken::sign(&key, "/CN=Alice", "b", 1001, 5000);
        assert_eq!(admit(&auth, Some(&elsewhere), alice.clone()), nobody, "another site's login");
        let forged = UserToken { mac: [0; 32], ..token.clone() };
        assert_eq!(admit(&auth, Some(&forged), alice.clone()), nobody);
        assert_eq!(admit(&auth, None, Caller::ROOT), Some(Caller::ROOT), "root is left to squashing");
        // Nodes and admins are not users; their claims are not looked at here.
        assert_eq!(auth.admit(&ids, Some(&id(Role::Node)), Some(alice.clone()), None, &key, 1000), Some(alice.clone()));
        // A host limited to uids 1000-1999 and gids 100, 300.
        auth.token_sites.clear();
        auth.host_ids.insert(host.name.clone(), HostIds::parse("1000-1999:100,300").unwrap());
        let admitted = admit(&auth, None, alice.clone()).unwrap();
        assert_eq!((admitted.gid, admitted.groups), (100, vec![300]), "group 7 is not this host's to claim");
        assert_eq!(admit(&auth, None, Caller::new(5000, 100)), nobody);
        assert!(HostIds::parse("10-1").is_err() && HostIds::parse("x").is_err());
        assert_eq!(HostIds::parse("5").unwrap(), HostIds { uids: vec![5..=5], gids: vec![] });
    }

    #[test]
    fn insecure_mode_trusts_the_claim_and_identities_squash_root() {
        let ids = Identities::load(Vec::new(), Vec::new(), &mut |_| Ok(Vec::new())).unwrap();
        let alice = Caller { uid: 1001, gid: 100, groups: vec![0, 7] };
        assert_eq!(resolve(&ids, None, Some("a"), Some(alice.clone())).caller, alice);
        assert_eq!(resolve(&ids, None, None, None).caller, Caller::ROOT);
        assert_eq!(resolve(&ids, Some(&id(Role::Node)), None, None).caller, Caller::ROOT);
        // A node or admin certificate is never a user: a caller it names is ignored.
        assert_eq!(resolve(&ids, Some(&id(Role::Node)), None, Some(alice.clone())).caller, Caller::ROOT);
        assert_eq!(resolve(&ids, Some(&id(Role::Admin)), None, Some(alice.clone())).caller, Caller::ROOT);
        let squashed = resolve(&ids, Some(&id(Role::Client)), Some("b"), Some(alice)).caller;
        assert_eq!(squashed, Caller { uid: 1001, gid: 100, groups: vec![7] });
        let nobody = Caller { uid: NOBODY, gid: NOBODY, groups: vec![] };
        assert_eq!(resolve(&ids, Some(&id(Role::Client)), None, Some(Caller::ROOT)).caller, nobody);
        assert_eq!(resolve(&ids, Some(&id(Role::Client)), None, None).caller, nobody, "a mount asserting root");
    }
}
