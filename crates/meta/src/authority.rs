//! Whom a request acts for: meta resolves it from what the connection proved (the
//! peer's certificate identity) and what the request claims (the caller's uid, gid
//! and groups), so every permission check in `ops::perm` runs on something meta
//! decided, not on what a client asserted.

use net::{PeerIdentity, Role};
use proto::types::Caller;

/// The uid and gid a squashed superuser becomes.
pub const NOBODY: u32 = 65534;

/// The caller a request from `peer` acts as:
/// - no identity (TLS explicitly disabled by the operator): the claimed caller, or
///   the superuser when none is claimed — today's trust-the-client mode;
/// - meta or node certificate: the superuser (nodes act for the cluster, not users);
/// - client certificate: the claimed caller, with root squashed to nobody (a request
///   with no caller is the client host's root, squashed alike).
pub fn resolve(peer: Option<&PeerIdentity>, claimed: Option<Caller>) -> Caller {
    match peer {
        None => claimed.unwrap_or(Caller::ROOT),
        Some(id) => match id.role {
            Role::Meta | Role::Node => Caller::ROOT,
            Role::Client => squash(claimed.unwrap_or(Caller::ROOT)),
        },
    }
}

/// Root squash: uid 0 and gid 0 (also among the groups) become nobody.
fn squash(mut c: Caller) -> Caller {
    if c.uid == 0 {
        c.uid = NOBODY;
    }
    if c.gid == 0 {
        c.gid = NOBODY;
    }
    c.groups.retain(|g| *g != 0);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(role: Role) -> PeerIdentity {
        PeerIdentity { name: "/CN=host.a".into(), role, site: "a".into() }
    }

    #[test]
    fn insecure_mode_trusts_the_claim_and_identities_squash_root() {
        let alice = Caller { uid: 1001, gid: 100, groups: vec![0, 7] };
        assert_eq!(resolve(None, Some(alice.clone())), alice);
        assert_eq!(resolve(None, None), Caller::ROOT);
        assert_eq!(resolve(Some(&id(Role::Node)), Some(alice.clone())), Caller::ROOT);
        assert_eq!(resolve(Some(&id(Role::Client)), Some(alice)), Caller { uid: 1001, gid: 100, groups: vec![7] });
        let nobody = Caller { uid: NOBODY, gid: NOBODY, groups: vec![] };
        assert_eq!(resolve(Some(&id(Role::Client)), Some(Caller::ROOT)), nobody);
        assert_eq!(resolve(Some(&id(Role::Client)), None), nobody, "a mount asserting root is squashed");
    }
}
