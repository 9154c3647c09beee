//! Framing of RPC messages on a byte stream. A frame is a fixed 24-byte header —
//! payload length, kind, request id, bulk length — then a postcard-encoded payload,
//! then optional bulk bytes (chunk data) that are never copied through the codec.
//! Request ids let many requests share one connection, answered in any order.

use serde::{Serialize, de::DeserializeOwned};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 24;
/// Largest payload accepted; a bigger length is a protocol error, never an allocation.
pub const MAX_PAYLOAD: u32 = 16 << 20;
/// Largest bulk section accepted (a chunk and then some).
pub const MAX_BULK: u32 = 64 << 20;
const MAGIC: u8 = 0x4c; // 'L'

/// Whether a frame asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Response,
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub request_id: u64,
    pub payload_len: u32,
    pub bulk_len: u32,
}

/// Malformed bytes from a peer.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {0:#x}: the peer does not speak the Locus protocol")]
    BadMagic(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("frame payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLarge(u32),
    #[error("frame bulk of {0} bytes exceeds the {MAX_BULK}-byte limit")]
    BulkTooLarge(u32),
    #[error("undecodable payload: {0}")]
    Payload(#[from] postcard::Error),
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&self.payload_len.to_be_bytes());
        h[4] = MAGIC;
        h[5] = match self.kind {
            FrameKind::Request => 0,
            FrameKind::Response => 1,
        };
        h[8..16].copy_from_slice(&self.request_id.to_be_bytes());
        h[16..20].copy_from_slice(&self.bulk_len.to_be_bytes());
        h
    }

    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let payload_len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        if h[4] != MAGIC {
            return Err(FrameError::BadMagic(h[4]));
        }
        let kind = match h[5] {
            0 => FrameKind::Request,
            1 => FrameKind::Response,
            k => return Err(FrameError::BadKind(k)),
        };
        if payload_len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(payload_len));
        }
        let bulk_len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
        if bulk_len > MAX_BULK {
            return Err(FrameError::BulkTooLarge(bulk_len));
        }
        let request_id = u64::from_be_bytes(h[8..16].try_into().expect("8 bytes"));
        Ok(Header { kind, request_id, payload_len, bulk_len })
    }
}

/// Header and payload of one message, ready to write; `bulk_len` bytes follow it.
pub fn encode<T: Serialize>(kind: FrameKind, request_id: u64, msg: &T, bulk_len: usize) -> Result<Vec<u8>, FrameError> {
    let bulk_len = u32::try_from(bulk_len).ok().filter(|l| *l <= MAX_BULK).ok_or(FrameError::BulkTooLarge(u32::MAX))?;
    let mut out = vec![0u8; HEADER_LEN];
    let mut out = postcard::to_extend(msg, std::mem::take(&mut out))?;
    let payload_len = (out.len() - HEADER_LEN) as u32;
    if payload_len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(payload_len));
    }
    out[..HEADER_LEN].copy_from_slice(&Header { kind, request_id, payload_len, bulk_len }.encode());
    Ok(out)
}

/// A message encoded alone, to travel inside another (meta's `Forward`); `decode`
/// reads it back.
pub fn encode_payload<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let out = postcard::to_stdvec(msg)?;
    let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    Ok(out)
}

/// Decodes a payload; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(payload)?;
    if !rest.is_empty() {
        return Err(FrameError::Payload(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::MetaRequest;
    use crate::node::NodeRequest;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let req = MetaRequest::GetAttr(crate::meta::GetAttr { ino: 7 });
        let bytes = encode(FrameKind::Request, 42, &req, 0).unwrap();
        let h = Header::decode(bytes[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.request_id, 42);
        assert_eq!(h.payload_len as usize, bytes.len() - HEADER_LEN);
        let back: MetaRequest = decode(&bytes[HEADER_LEN..]).unwrap();
        assert_eq!(format!("{back:?}"), format!("{req:?}"));
    }

    fn sample_messages() -> Vec<Vec<u8>> {
        use crate::meta::*;
        use crate::types::*;
        let ext = Extent { file_offset: 5, len: 9, chunk: ChunkId([3; 32]), chunk_offset: 1 };
        let reqs = [
            MetaRequest::Create(Create {
                parent: 1,
                name: b"name".to_vec(),
                node: NewNode::Symlink { target: b"t".to_vec() },
                mode: 0o755,
                umask: 0,
                exclusive: true,
            }),
            MetaRequest::CommitWrite(CommitWrite {
                ino: 9,
                session: 3,
                extents: vec![ext, ext],
                chunks: vec![StoredChunk { id: ChunkId([1; 32]), size: 10, nodes: vec!["n".into()], receipt: None }],
                min_size: 14,
                mtime: Timestamp::now(),
            }),
            MetaRequest::SetLock(SetLock {
                session: 4,
                lock: LockRange { ino: 1, owner: 2, start: 0, end: u64::MAX, kind: LockKind::Write, pid: 7 },
            }),
        ];
        let mut out: Vec<Vec<u8>> = reqs.iter().map(|r| encode(FrameKind::Request, 1, r, 0).unwrap()).collect();
        let put = NodeRequest::Put(crate::node::Put {
            id: ChunkId([2; 32]),
            cap: None,
            epoch: 1,
            replicate: Default::default(),
        });
        out.push(encode(FrameKind::Request, 2, &put, 100).unwrap());
        out
    }

    proptest! {
        /// Valid frames with bytes flipped, dropped or cut short decode to an error or
        /// to some message, never a panic.
        #[test]
        fn mutated_frames_never_panic(which in 0usize..4, flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8), cut in any::<usize>()) {
            let mut bytes = sample_messages().swap_remove(which);
            for (at, x) in flips {
                let i = at % bytes.len();
                bytes[i] ^= x;
            }
            let cut = HEADER_LEN + cut % (bytes.len() - HEADER_LEN + 1);
            let head: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
            let _ = Header::decode(&head);
            let payload = &bytes[HEADER_LEN..cut];
            let _ = decode::<MetaRequest>(payload);
            let _ = decode::<NodeRequest>(payload);
        }

        /// Decoders return errors on arbitrary bytes, never panic.
        #[test]
        fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            if bytes.len() >= HEADER_LEN {
                let _ = Header::decode(bytes[..HEADER_LEN].try_into().unwrap());
            }
            let _ = decode::<MetaRequest>(&bytes);
            let _ = decode::<NodeRequest>(&bytes);
            let _ = decode::<crate::meta::MetaResult>(&bytes);
            let _ = decode::<crate::node::NodeResult>(&bytes);
        }
    }
}
