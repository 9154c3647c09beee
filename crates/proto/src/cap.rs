//! Chunk capabilities. A node serves or stores a chunk for a client only with a
//! capability meta signed for that operation (and, for reads, that chunk), bound to
//! the client's certificate name and an expiry: a BLAKE3 keyed MAC under a key meta
//! shares with its nodes (handed out on registration). Knowing a chunk's id is then not
//! enough to read it, and a node checks one MAC per request.

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
/// milliseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cap {
    pub expires_ms: i64,
    pub mac: [u8; 32],
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
}

fn mac(key: &CapKey, op: CapOp, holder: &str, chunk: Option<&ChunkId>, expires_ms: i64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"locus chunk capability v1");
    h.update(&[op as u8]);
    h.update(&expires_ms.to_le_bytes());
    h.update(chunk.map_or(&[0u8; 32], |c| &c.0));
    h.update(holder.as_bytes());
    *h.finalize().as_bytes()
}

/// Signs `op` (on `chunk`, for reads) for `holder` until `expires_ms`.
pub fn sign(key: &CapKey, op: CapOp, holder: &str, chunk: Option<&ChunkId>, expires_ms: i64) -> Cap {
    Cap { expires_ms, mac: mac(key, op, holder, chunk, expires_ms) }
}

/// Checks `cap` for `op` on `chunk` by `holder` at `now_ms` (constant-time compare).
pub fn verify(
    key: &CapKey,
    op: CapOp,
    holder: &str,
    chunk: Option<&ChunkId>,
    cap: Option<&Cap>,
    now_ms: i64,
) -> Result<(), CapError> {
    let cap = cap.ok_or(CapError::Missing)?;
    if !blake3::Hash::from(cap.mac).eq(&blake3::Hash::from(mac(key, op, holder, chunk, cap.expires_ms))) {
        return Err(CapError::Forged);
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
        let cap = sign(&key, CapOp::Read, "/CN=host.a", Some(&a), 1000);
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&a), Some(&cap), 999), Ok(()));
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&b), Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(verify(&key, CapOp::Write, "/CN=host.a", Some(&a), Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.b", Some(&a), Some(&cap), 999), Err(CapError::Forged));
        assert_eq!(verify(&[8; 32], CapOp::Read, "/CN=host.a", Some(&a), Some(&cap), 999), Err(CapError::Forged));
        let later = Cap { expires_ms: 5000, ..cap };
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&a), Some(&later), 999), Err(CapError::Forged));
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&a), Some(&cap), 1500), Err(CapError::Expired(500)));
        assert_eq!(verify(&key, CapOp::Read, "/CN=host.a", Some(&a), None, 0), Err(CapError::Missing));
    }
}
