//! Chunk capabilities. A node serves or stores a chunk for a client only with a
//! capability meta signed for that operation (and, for reads, that chunk), bound to
//! the client's certificate name and an expiry: a BLAKE3 keyed MAC under a key meta
//! shares with its nodes (handed out on registration). Knowing a chunk's id is then not
//! enough to read it, and a node checks one MAC per request. The MAC also covers the
//! epoch of the primary role the signing meta serves (failover fencing): a node that
//! has seen a newer epoch refuses capabilities of older ones.

use crate::types::ChunkId;
use serde::{Deserialize, Serialize};

/// The secret meta and its nodes share.
pub type CapKey = [u8; 32];

/// How long a capability stays valid; a client asks meta again after that.
pub const CAP_LIFETIME_MS: i64 = 10 * 60 * 1000;

/// What a capability allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CapOp {
    /// Get one chunk.
    Read,
    /// Put chunks (content-addressed: a put can only add the bytes its id names).
    Write,
}

/// Proof that meta allowed its holder an operation until `expires_ms` (wall-clock
/// milliseconds since the Unix epoch), signed by a meta of primary-role `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cap {
    pub expires_ms: i64,
    pub mac: [u8; 32],
    /// The epoch of the primary role the signing meta served (covered by `mac`).
    pub epoch: u64,
}

/// Why a node refused a capability.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    #[error("no capability for this chunk operation (ask meta: open the file again)")]
    Missing,
    #[error("the capability expired {0} ms ago (ask meta again)")]
    Expired(i64),
    #[error("the capability was not signed by this cluster's meta for this operation, chunk and holder")]
    Forged,
    /// Signed by a meta of an older epoch than this node has seen: that meta lost the
    /// primary role (failover), and nothing it allows is done any more.
    #[error(
        "the capability was signed by a meta of epoch {cap}, but this node has seen epoch {seen}: that meta lost \
         the primary role (failover) and may not have writes done on its behalf; use a meta of the new primary"
    )]
    StaleEpoch { cap: u64, seen: u64 },
}

/// A node's signed word that `holder` stored a chunk of this size, now held by these
/// nodes (`NodeReply::Stored`): meta binds a chunk to a file only with such a proof
/// of possession (or when the file already holds the chunk), so knowing a chunk's
/// hash gets nobody a read capability for it, and the catalogue takes sizes and
/// holders from nodes, never from a client's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub expires_ms: i64,
    pub mac: [u8; 32],
}

/// Why meta refused a chunk a client named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("no node's receipt for it (a client binds only chunks it stored itself or its file already holds)")]
    Missing,
    #[error("its receipt expired {0} ms ago (store the chunk again)")]
    Expired(i64),
    #[error("its receipt was not signed by a node of this cluster for this chunk, size, holders and holder")]
    Forged,
}

fn receipt_mac(key: &CapKey, holder: &str, chunk: &ChunkId, size: u64, nodes: &[String], expires_ms: i64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"locus chunk receipt v1");
    h.update(&chunk.0);
    h.update(&size.to_le_bytes());
    h.update(&expires_ms.to_le_bytes());
    h.update(&(nodes.len() as u64).to_le_bytes());
    for n in nodes {
        h.update(&(n.len() as u64).to_le_bytes());
        h.update(n.as_bytes());
    }
    h.update(holder.as_bytes());
    *h.finalize().as_bytes()
}

/// A node signs that `holder` stored `chunk` (`size` bytes, held by `nodes`), good
/// until `expires_ms`.
pub fn sign_receipt(
    key: &CapKey,
    holder: &str,
    chunk: &ChunkId,
    size: u64,
    nodes: &[String],
    expires_ms: i64,
) -> Receipt {
    Receipt { expires_ms, mac: receipt_mac(key, holder, chunk, size, nodes, expires_ms) }
}

/// Meta checks a receipt a client presents for `chunk` (constant-time compare).
pub fn verify_receipt(
    key: &CapKey,
    holder: &str,
    chunk: &ChunkId,
    size: u64,
    nodes: &[String],
    receipt: Option<&Receipt>,
    now_ms: i64,
) -> Result<(), ReceiptError> {
    let r = receipt.ok_or(ReceiptError::Missing)?;
    let expected = receipt_mac(key, holder, chunk, size, nodes, r.expires_ms);
    if !blake3::Hash::from(r.mac).eq(&blake3::Hash::from(expected)) {
        return Err(ReceiptError::Forged);
    }
    if r.expires_ms < now_ms {
        return Err(ReceiptError::Expired(now_ms - r.expires_ms));
    }
    Ok(())
}

/// Proof that a person logged in with their own certificate (`locus login`): meta
/// signed that `principal` is `uid` at `site` until `expires_ms`. A mount of that site
/// sends it with every request it makes for `uid`; at a site whose users must prove
/// themselves (`locus meta --user-auth SITE`), meta acts for a uid only with its
/// token, so a stolen host key reaches only the users logged in on that host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserToken {
    pub principal: String,
    pub site: String,
    pub uid: u32,
    pub expires_ms: i64,
    pub mac: [u8; 32],
}

/// Why meta did not take a user token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token expired {0} ms ago (run locus login again)")]
    Expired(i64),
    #[error("the token was not signed by this cluster's meta for this principal, site and uid")]
    Forged,
}

fn token_mac(key: &CapKey, principal: &str, site: &str, uid: u32, expires_ms: i64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"locus user token v1");
    h.update(&uid.to_le_bytes());
    h.update(&expires_ms.to_le_bytes());
    h.update(&(site.len() as u64).to_le_bytes());
    h.update(site.as_bytes());
    h.update(principal.as_bytes());
    *h.finalize().as_bytes()
}

impl UserToken {
    /// Meta signs that `principal` is `uid` at `site` until `expires_ms`.
    pub fn sign(key: &CapKey, principal: &str, site: &str, uid: u32, expires_ms: i64) -> UserToken {
        UserToken {
            principal: principal.into(),
            site: site.into(),
            uid,
            expires_ms,
            mac: token_mac(key, principal, site, uid, expires_ms),
        }
    }

    /// The token as one line of text, for the file `locus login` leaves for the mount.
    pub fn to_text(&self) -> String {
        hex::encode(postcard::to_stdvec(self).unwrap_or_default())
    }

    /// A token read back from `to_text`'s line; `None` for anything else.
    pub fn from_text(text: &str) -> Option<UserToken> {
        postcard::from_bytes(&hex::decode(text.trim()).ok()?).ok()
    }

    /// Checks the token's MAC (constant-time) and expiry at `now_ms`.
    pub fn verify(&self, key: &CapKey, now_ms: i64) -> Result<(), TokenError> {
        let expected = token_mac(key, &self.principal, &self.site, self.uid, self.expires_ms);
        if !blake3::Hash::from(self.mac).eq(&blake3::Hash::from(expected)) {
            return Err(TokenError::Forged);
        }
        if self.expires_ms < now_ms {
            return Err(TokenError::Expired(now_ms - self.expires_ms));
        }
        Ok(())
    }
}

fn mac(key: &CapKey, op: CapOp, holder: &str, chunk: Option<&ChunkId>, expires_ms: i64, epoch: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"locus chunk capability v2");
    h.update(&[op as u8]);
    h.update(&expires_ms.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(chunk.map_or(&[0u8; 32], |c| &c.0));
    h.update(holder.as_bytes());
    *h.finalize().as_bytes()
}

/// Signs `op` (on `chunk`, for reads) for `holder` until `expires_ms`, by a meta of
/// primary-role `epoch`.
pub fn sign(key: &CapKey, op: CapOp, holder: &str, chunk: Option<&ChunkId>, expires_ms: i64, epoch: u64) -> Cap {
    Cap { expires_ms, mac: mac(key, op, holder, chunk, expires_ms, epoch), epoch }
}

/// Checks `cap` for `op` on `chunk` by `holder` at `now_ms` (constant-time compare),
/// at a node that has seen primary-role epoch `seen`: the MAC first (so an altered
/// epoch is a forgery), then the epoch, then the expiry.
pub fn verify(
    key: &CapKey,
    op: CapOp,
    holder: &str,
    chunk: Option<&ChunkId>,
    cap: Option<&Cap>,
    now_ms: i64,
    seen: u64,
) -> Result<(), CapError> {
    let cap = cap.ok_or(CapError::Missing)?;
    let expected = mac(key, op, holder, chunk, cap.expires_ms, cap.epoch);
    if !blake3::Hash::from(cap.mac).eq(&blake3::Hash::from(expected)) {
        return Err(CapError::Forged);
    }
    if cap.epoch < seen {
        return Err(CapError::StaleEpoch { cap: cap.epoch, seen });
    }
    if cap.expires_ms < now_ms {
        return Err(CapError::Expired(now_ms - cap.expires_ms));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capability_holds_only_for_its_operation_chunk_holder_and_time() {
        let key = [7u8; 32];
        let (a, b) = (ChunkId([1; 32]), ChunkId([2; 32]));
        let cap = sign(&key, CapOp::Read, "/CN=host.a", Some(&a), 1000, 1);
        let check = |op, holder, chunk, cap: Option<&Cap>, now| verify(&key, op, holder, Some(chunk), cap, now, 1);
        assert_eq!(check(CapOp::Read, "/CN=host.a", &a, Some(&cap), 999), Ok(()));
        assert_eq!(check(CapOp::Read, "/CN=host.a", &b, Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(check(CapOp::Write, "/CN=host.a", &a, Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(check(CapOp::Read, "/CN=host.b", &a, Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(verify(&[8; 32], CapOp::Read, "/CN=host.a", Some(&a), Some(&cap), 999, 1), Err(CapError::Forged));
        let later = Cap { expires_ms: 5000, ..cap };
        assert_eq!(check(CapOp::Read, "/CN=host.a", &a, Some(&later), 999), Err(CapError::Forged));
        assert_eq!(check(CapOp::Read, "/CN=host.a", &a, Some(&cap), 1500), Err(CapError::Expired(500)));
        assert_eq!(check(CapOp::Read, "/CN=host.a", &a, None, 0), Err(CapError::Missing));
    }

    /// A receipt proves exactly what the node signed: another chunk, size, holder
    /// set or holder (the attacks: a known hash of another user's chunk, a
    /// victim's chunk given another size or a ghost holder) breaks it.
    #[test]
    fn a_receipt_holds_only_for_its_chunk_size_holders_and_holder() {
        let key = [5u8; 32];
        let (a, b) = (ChunkId([1; 32]), ChunkId([2; 32]));
        let nodes = vec!["n1".to_string()];
        let r = sign_receipt(&key, "/CN=host.a", &a, 100, &nodes, 1000);
        let check = |holder, chunk, size, nodes: &[String], r: Option<&Receipt>, now| {
            verify_receipt(&key, holder, chunk, size, nodes, r, now)
        };
        assert_eq!(check("/CN=host.a", &a, 100, &nodes, Some(&r), 999), Ok(()));
        assert_eq!(check("/CN=host.a", &b, 100, &nodes, Some(&r), 999), Err(ReceiptError::Forged));
        assert_eq!(check("/CN=host.a", &a, 1, &nodes, Some(&r), 999), Err(ReceiptError::Forged));
        let ghost = vec!["n1".to_string(), "ghost".to_string()];
        assert_eq!(check("/CN=host.a", &a, 100, &ghost, Some(&r), 999), Err(ReceiptError::Forged));
        assert_eq!(check("/CN=host.b", &a, 100, &nodes, Some(&r), 999), Err(ReceiptError::Forged));
        assert_eq!(check("/CN=host.a", &a, 100, &nodes, Some(&r), 1500), Err(ReceiptError::Expired(500)));
        assert_eq!(check("/CN=host.a", &a, 100, &nodes, None, 0), Err(ReceiptError::Missing));
        let later = Receipt { expires_ms: 5000, ..r };
        assert_eq!(check("/CN=host.a", &a, 100, &nodes, Some(&later), 999), Err(ReceiptError::Forged));
    }

    /// A token holds only for its principal, site, uid and lifetime.
    #[test]
    fn a_user_token_holds_only_for_its_principal_site_uid_and_time() {
        let key = [3u8; 32];
        let t = UserToken::sign(&key, "/CN=Alice", "a", 1001, 1000);
        assert_eq!(t.verify(&key, 999), Ok(()));
        assert_eq!(t.verify(&key, 1500), Err(TokenError::Expired(500)));
        assert_eq!(t.verify(&[4; 32], 999), Err(TokenError::Forged));
        assert_eq!(UserToken::from_text(&format!("{}\n", t.to_text())), Some(t.clone()));
        assert_eq!(UserToken::from_text("not hex"), None);
        assert_eq!(UserToken::from_text("00ff"), None);
        for forged in [
            UserToken { uid: 0, ..t.clone() },
            UserToken { site: "b".into(), ..t.clone() },
            UserToken { principal: "/CN=Bob".into(), ..t.clone() },
            UserToken { expires_ms: 9999, ..t.clone() },
        ] {
            assert_eq!(forged.verify(&key, 999), Err(TokenError::Forged), "{forged:?}");
        }
    }

    /// A node that has seen epoch 2 refuses a capability of epoch 1 (its meta lost the
    /// primary role); one of epoch 2 or later passes; an epoch altered to get past the
    /// check breaks the MAC.
    #[test]
    fn a_capability_of_an_older_epoch_is_refused_and_its_epoch_cannot_be_altered() {
        let key = [7u8; 32];
        let put = |epoch| sign(&key, CapOp::Write, "/CN=host.a", None, 1000, epoch);
        let check = |cap: &Cap, seen| verify(&key, CapOp::Write, "/CN=host.a", None, Some(cap), 999, seen);
        assert_eq!(check(&put(1), 1), Ok(()));
        assert_eq!(check(&put(1), 2), Err(CapError::StaleEpoch { cap: 1, seen: 2 }));
        assert_eq!(check(&put(2), 2), Ok(()));
        assert_eq!(check(&put(3), 2), Ok(()), "a newer epoch than the node knows is no reason to refuse");
        let forged = Cap { epoch: 2, ..put(1) };
        assert_eq!(check(&forged, 2), Err(CapError::Forged));
        // Stale and forged at once: the forgery is what the node reports.
        let forged_old = Cap { epoch: 0, ..put(1) };
        assert_eq!(check(&forged_old, 2), Err(CapError::Forged));
    }
}
