//! Whom a request acts for: meta resolves it from what the connection proved (the
//! peer's certificate identity: role and site) and what the request claims (the
//! caller's uid, gid and groups in its site's numbering), through the site's identity
//! map, so every permission check in `ops::perm` runs on something meta decided.

use crate::identity::{Acting, Identities};
use net::{PeerIdentity, Role};
use proto::types::Caller;

/// The caller a request from `peer` acts as:
/// - meta, node or admin certificate: the superuser, whatever caller it names: such a
///   certificate is never a user (nodes act for the cluster, admins administer; which
///   requests each may make at all is `service::permitted_roles`);
/// - client certificate: the claimed caller of the certificate's site, mapped by that
///   site's map, root squashed unless the site is trusted (`--no-root-squash`); a
///   request with no caller is the client host's root, squashed alike;
/// - no identity (TLS explicitly disabled by the operator): the claimed caller and
///   site are believed (still mapped), and root is root — trust-the-client mode.
pub fn resolve(ids: &Identities, peer: Option<&PeerIdentity>, site: Option<&str>, claimed: Option<Caller>) -> Acting {
    match peer {
        Some(PeerIdentity { role: Role::Meta | Role::Node | Role::Admin, .. }) => Acting::root(),
        Some(id) => ids.acting(Some(&id.site), true, claimed),
        None => ids.acting(site, false, claimed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::NOBODY;

    fn id(role: Role) -> PeerIdentity {
        PeerIdentity { name: "/CN=host.a".into(), role, site: "a".into() }
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
