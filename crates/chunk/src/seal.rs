//! Encryption at rest: with a site key, every chunk file holds the chunk sealed with
//! XChaCha20-Poly1305 (`MAGIC`, a random 192-bit nonce, ciphertext and tag), the
//! chunk id as associated data, so a file moved under another id or changed by one
//! bit is refused. Chunk ids stay the BLAKE3 hash of the plaintext (dedup, and the
//! client's end-to-end check); see SECURITY.md for what that exposes.

use crate::ChunkError;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use proto::types::ChunkId;
use std::path::Path;

/// What a sealed chunk file starts with (files without it are plaintext chunks
/// written before the store had a key; their hash is still checked).
pub const MAGIC: &[u8; 4] = b"LCX1";
const NONCE: usize = 24;

/// A site's chunk key.
#[derive(Clone)]
pub struct AtRest {
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for AtRest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AtRest(key hidden)")
    }
}

impl AtRest {
    /// Reads a key file: 32 bytes as 64 hex digits (surrounding whitespace ignored).
    pub fn from_key_file(path: &Path) -> Result<AtRest, ChunkError> {
        let bad = |why: String| ChunkError::Key { path: path.to_path_buf(), why };
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let mut key = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut key)
            .map_err(|e| bad(format!("expected 64 hex digits (e.g. `openssl rand -hex 32`): {e}")))?;
        Ok(AtRest::new(&key))
    }

    /// A key from its 32 bytes.
    pub fn new(key: &[u8; 32]) -> AtRest {
        AtRest { cipher: XChaCha20Poly1305::new(Key::from_slice(key)) }
    }

    /// The file contents for chunk `id` holding `plain`.
    pub fn seal(&self, id: &ChunkId, plain: &[u8]) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(&nonce, Payload { msg: plain, aad: &id.0 })
            .expect("XChaCha20-Poly1305 encryption of an in-memory buffer cannot fail");
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The plaintext of chunk `id`'s file, or `None` if it does not open under this key
    /// and id (tampered, moved, or sealed with another key). A file without `MAGIC` is
    /// returned as it is (a plaintext chunk; the caller checks its hash).
    pub fn open(&self, id: &ChunkId, file: Vec<u8>) -> Option<Vec<u8>> {
        let Some(rest) = file.strip_prefix(MAGIC) else { return Some(file) };
        if rest.len() < NONCE {
            return None;
        }
        let (nonce, sealed) = rest.split_at(NONCE);
        self.cipher.decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: &id.0 }).ok()
    }
}
