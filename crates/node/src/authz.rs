//! Who may ask a node for what. With TLS, the peer's certificate says: meta and other
//! nodes (replication, site caches) may ask anything; an admin certificate (gc, fsck)
//! may list, probe, verify, delete and count chunks, but gets and puts data only with
//! a capability, as a client; a client may only get a chunk with meta's read
//! capability for it and put chunks with meta's write capability, both bound to its
//! certificate name; listing, probing, verifying, deleting and stats are not for
//! clients. A capability signed by
//! a meta of an older epoch of the primary role than the node has seen is refused
//! (`ReadOnly`: that meta lost the primary role). So is, from any peer and with or
//! without TLS, a put or delete that states an older epoch than the node has seen: a
//! node replicating for, or a `gc` judged by, a meta that lost the role. Without TLS
//! (the operator disabled it) every peer is otherwise trusted, as before.

use net::{PeerIdentity, Role};
use proto::cap::{CapError, CapKey, verify};
use proto::error::{ErrorCode, WireError};
use proto::node::{CapCheck, NodeRequest};
use std::sync::RwLock;

/// The capability key meta handed out at the last registration.
#[derive(Default)]
pub struct CapKeyCell(RwLock<Option<CapKey>>);

impl CapKeyCell {
    /// Keeps the key of meta's latest answer (a restarted meta has a new one).
    pub fn set(&self, key: Option<CapKey>) {
        *util::sync::write(&self.0) = key;
    }

    /// The key, once meta handed it out.
    pub fn get(&self) -> Option<CapKey> {
        *util::sync::read(&self.0)
    }
}

/// Allows or refuses `req` from `peer` at `now_ms`, at a node that has seen epoch
/// `seen` of the primary role (one MAC check for a client's get or put, an integer
/// comparison for a put or delete, nothing else on the hot path). Who may make a
/// request, and with which capability, is the request table's (`proto::node`).
pub fn authorize(
    peer: Option<&PeerIdentity>,
    req: &NodeRequest,
    key: &CapKeyCell,
    now_ms: i64,
    seen: u64,
) -> Result<(), WireError> {
    if let Some(peer) = peer.filter(|p| !req.facts().roles.contains(&p.role)) {
        match (peer.role, req.capability()) {
            // A client gets and puts chunks with meta's capability; so does an
            // operator's certificate, which lists, verifies and deletes chunks (fsck,
            // gc) but gets or puts file data only as any user.
            (Role::Client | Role::Admin, Some(check)) => check_capability(peer, check, key, now_ms, seen)?,
            (Role::Client, None) => {
                return Err(WireError::new(
                    ErrorCode::NotPermitted,
                    format!("{} (a client certificate) may not list, probe, verify, delete or count chunks", peer.name),
                ));
            }
            // Another node fetches, probes and stores chunks (site caches, replication,
            // repair), and pings; listing, verifying, deleting and counting a node's
            // chunks is an operator's (fsck, gc) with an admin certificate.
            (Role::Node, _) => {
                return Err(WireError::new(
                    ErrorCode::NotPermitted,
                    format!(
                        "{peer} (a node certificate) may not list, verify, delete or count another node's chunks: that takes an admin certificate"
                    ),
                ));
            }
            // A person's certificate logs in at meta; it has nothing to ask a node.
            (Role::User, _) => {
                return Err(WireError::new(
                    ErrorCode::NotPermitted,
                    format!("{peer} is a user certificate: it logs in at meta (locus login) and asks nodes nothing"),
                ));
            }
            (Role::Admin | Role::Meta, _) => {
                return Err(WireError::new(ErrorCode::NotPermitted, format!("{peer} may not ask {}", req.name())));
            }
        }
    }
    match req.epoch() {
        Some(stated) if stated < seen => Err(WireError::new(
            ErrorCode::ReadOnly,
            format!(
                "{} refused: it acts under epoch {stated} of the primary role, but this node has seen epoch {seen}: \
                 the meta it follows lost the primary role",
                req.name().to_lowercase()
            ),
        )),
        _ => Ok(()),
    }
}

/// A client's (or admin's) get or put: meta's capability for it, bound to the peer's
/// certificate name.
fn check_capability(
    peer: &PeerIdentity,
    check: CapCheck<'_>,
    key: &CapKeyCell,
    now_ms: i64,
    seen: u64,
) -> Result<(), WireError> {
    let CapCheck { op, chunk, cap } = check;
    let Some(key) = key.get() else {
        return Err(WireError::new(ErrorCode::Busy, "this node has no capability key from meta yet"));
    };
    verify(&key, op, &peer.name, chunk, cap, now_ms, seen).map_err(|e| {
        let code = match e {
            CapError::StaleEpoch { .. } => ErrorCode::ReadOnly,
            CapError::Missing | CapError::Expired(_) | CapError::Forged => ErrorCode::PermissionDenied,
        };
        WireError::new(code, format!("{op:?} refused for {}: {e}", peer.name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::cap::{CAP_LIFETIME_MS, CapOp, sign};
    use proto::node::{Delete, Get, Has, List, Put, Stats, Verify};
    use proto::types::ChunkId;

    fn id(name: &str, role: Role) -> PeerIdentity {
        PeerIdentity { name: name.into(), role, site: "a".into() }
    }

    #[test]
    fn clients_need_capabilities_and_may_not_administer() {
        let key = [9u8; 32];
        let cell = CapKeyCell::default();
        let chunk = ChunkId([4; 32]);
        let alice = id("/CN=client.a", Role::Client);
        let get = |cap| NodeRequest::Get(Get { id: chunk, offset: 0, len: u64::MAX, local_only: false, cap });
        let now = 1_000_000;
        let read = sign(&key, CapOp::Read, &alice.name, Some(&chunk), now + CAP_LIFETIME_MS, 1);
        // No key from meta yet: nothing a client asks is served.
        assert_eq!(authorize(Some(&alice), &get(Some(read)), &cell, now, 1).unwrap_err().code, ErrorCode::Busy);
        cell.set(Some(key));
        assert_eq!(authorize(Some(&alice), &get(Some(read)), &cell, now, 1), Ok(()));
        // Knowing the hash is not enough; nor is another host's or an expired capability.
        let code =
            |peer: &PeerIdentity, req: &NodeRequest, at| authorize(Some(peer), req, &cell, at, 1).unwrap_err().code;
        assert_eq!(code(&alice, &get(None), now), ErrorCode::PermissionDenied);
        assert_eq!(code(&id("/CN=client.b", Role::Client), &get(Some(read)), now), ErrorCode::PermissionDenied);
        assert_eq!(code(&alice, &get(Some(read)), now + CAP_LIFETIME_MS + 1), ErrorCode::PermissionDenied);
        let other =
            NodeRequest::Get(Get { id: ChunkId([5; 32]), offset: 0, len: 1, local_only: false, cap: Some(read) });
        assert_eq!(code(&alice, &other, now), ErrorCode::PermissionDenied, "a capability names its chunk");
        // Puts need the write capability, not a read one.
        let put = |cap| NodeRequest::Put(Put { id: chunk, cap, epoch: 1, replicate: Default::default() });
        assert_eq!(code(&alice, &put(Some(read)), now), ErrorCode::PermissionDenied);
        let write = sign(&key, CapOp::Write, &alice.name, None, now + 1, 1);
        assert_eq!(authorize(Some(&alice), &put(Some(write)), &cell, now, 1), Ok(()));
        // Listing, probing, deleting and stats are for nodes and meta only.
        for req in [
            NodeRequest::List(List { after: None, limit: 10 }),
            NodeRequest::Delete(Delete { ids: vec![chunk], min_age_secs: 0, epoch: 1 }),
            NodeRequest::Has(Has { ids: vec![chunk] }),
            NodeRequest::Verify(Verify { ids: vec![chunk] }),
            NodeRequest::Stats(Stats {}),
        ] {
            assert_eq!(code(&alice, &req, now), ErrorCode::NotPermitted, "{req:?}");
            assert_eq!(authorize(Some(&id("admin", Role::Admin)), &req, &cell, now, 1), Ok(()));
            let by_node = authorize(Some(&id("/CN=node.a", Role::Node)), &req, &cell, now, 1);
            let probe = matches!(req, NodeRequest::Has(Has { .. }));
            assert_eq!(
                by_node.map_err(|e| e.code),
                if probe { Ok(()) } else { Err(ErrorCode::NotPermitted) },
                "{req:?}"
            );
        }
        assert_eq!(authorize(Some(&id("/CN=node.b", Role::Node)), &get(None), &cell, now, 1), Ok(()), "replication");
        // An admin certificate administers the store but reads and writes data only
        // with a capability, as a client.
        let admin = id("admin", Role::Admin);
        for req in
            [NodeRequest::List(List { after: None, limit: 10 }), NodeRequest::Verify(Verify { ids: vec![chunk] })]
        {
            assert_eq!(authorize(Some(&admin), &req, &cell, now, 1), Ok(()));
        }
        assert_eq!(code(&admin, &get(None), now), ErrorCode::PermissionDenied);
        assert_eq!(code(&admin, &put(None), now), ErrorCode::PermissionDenied);
        let admin_read = sign(&key, CapOp::Read, &admin.name, Some(&chunk), now + 1, 1);
        assert_eq!(authorize(Some(&admin), &get(Some(admin_read)), &cell, now, 1), Ok(()));
        // TLS disabled by the operator: trusted as before.
        assert_eq!(authorize(None, &get(None), &cell, now, 1), Ok(()));
    }

    /// A node that has seen epoch 2 refuses a client's capabilities of epoch 1 (for
    /// reads and puts) with `ReadOnly`, and serves those of epoch 2; other nodes need
    /// none, whatever the epoch.
    #[test]
    fn capabilities_of_an_older_epoch_are_refused() {
        let key = [9u8; 32];
        let cell = CapKeyCell::default();
        cell.set(Some(key));
        let chunk = ChunkId([4; 32]);
        let alice = id("/CN=client.a", Role::Client);
        let now = 1_000_000;
        let put = |epoch| {
            NodeRequest::Put(Put {
                id: chunk,
                cap: Some(sign(&key, CapOp::Write, &alice.name, None, now + 1, epoch)),
                epoch,
                replicate: Default::default(),
            })
        };
        let get = |epoch| {
            NodeRequest::Get(Get {
                id: chunk,
                offset: 0,
                len: 1,
                local_only: false,
                cap: Some(sign(&key, CapOp::Read, &alice.name, Some(&chunk), now + 1, epoch)),
            })
        };
        for req in [put(1), get(1)] {
            let refused = authorize(Some(&alice), &req, &cell, now, 2).unwrap_err();
            assert_eq!(refused.code, ErrorCode::ReadOnly, "{refused:?}");
            assert!(refused.message.contains("epoch 1, but this node has seen epoch 2"), "{}", refused.message);
        }
        for req in [put(2), get(2)] {
            assert_eq!(authorize(Some(&alice), &req, &cell, now, 2), Ok(()));
        }
        // A client that states a current epoch beside an old capability is still refused.
        let mut dressed_up = put(1);
        if let NodeRequest::Put(Put { epoch, .. }) = &mut dressed_up {
            *epoch = 2;
        }
        assert_eq!(authorize(Some(&alice), &dressed_up, &cell, now, 2).unwrap_err().code, ErrorCode::ReadOnly);
    }

    /// Puts from nodes and deletes from tools (no capability) state the epoch they act
    /// under: a node that has seen a newer one refuses them, with or without TLS; reads
    /// and probes state none and pass.
    #[test]
    fn node_puts_and_deletes_of_an_older_epoch_are_refused() {
        let cell = CapKeyCell::default();
        let chunk = ChunkId([4; 32]);
        let (node, admin) = (id("/CN=node.b", Role::Node), id("admin", Role::Admin));
        let put = |epoch| NodeRequest::Put(Put { id: chunk, cap: None, epoch, replicate: Default::default() });
        let delete = |epoch| NodeRequest::Delete(Delete { ids: vec![chunk], min_age_secs: 0, epoch });
        type Make<'a> = &'a dyn Fn(u64) -> NodeRequest;
        let cases: [(Option<&PeerIdentity>, Make); 4] =
            [(Some(&node), &put), (Some(&admin), &delete), (None, &put), (None, &delete)];
        for (from, req) in cases {
            let refused = authorize(from, &req(1), &cell, 0, 2).unwrap_err();
            assert_eq!(refused.code, ErrorCode::ReadOnly, "{:?}", req(1));
            assert!(refused.message.contains("epoch 1 of the primary role, but this node has seen epoch 2"));
            for epoch in [2, 3] {
                assert_eq!(authorize(from, &req(epoch), &cell, 0, 2), Ok(()), "{:?}", req(epoch));
            }
            let has = NodeRequest::Has(Has { ids: vec![chunk] });
            assert_eq!(authorize(from, &has, &cell, 0, 2), Ok(()));
        }
    }
}
