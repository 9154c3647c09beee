//! The data-path protocol: clients and tools talk to `locus node` directly for bytes.

use crate::cap::Cap;
use crate::error::WireError;
use crate::policy::Replicate;
use crate::types::ChunkId;
use serde::{Deserialize, Serialize};

/// Requests to a storage node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRequest {
    /// Stores a chunk sent as the frame's bulk bytes; the node recomputes the id and
    /// refuses a mismatch. Idempotent.
    Put {
        id: ChunkId,
        /// Meta's write capability for a client (nodes and meta need none).
        cap: Option<Cap>,
        /// The epoch of the primary role a node or tool writes under (the highest it
        /// has seen); a client's capability carries its own, which counts instead. A
        /// node that has seen a newer one refuses (`ReadOnly`): the sender follows a
        /// meta that lost the primary role.
        epoch: u64,
        /// Copies the node must ensure before (or, for `async`, after) answering.
        replicate: Replicate,
    },
    /// Bytes `[offset, offset+len)` of a chunk (clipped to its end), verified against its
    /// id before serving; answered with `Data` and the bytes as bulk.
    Get {
        id: ChunkId,
        offset: u64,
        len: u64,
        /// Serve only what this node holds (stored or in its site cache): set by a node
        /// fetching for its site, so a miss never turns into a chain of fetches between
        /// sites.
        local_only: bool,
        /// Meta's read capability for this chunk, for a client.
        cap: Option<Cap>,
    },
    /// Which of these chunks the node holds as replicas (one flag per id, in order);
    /// a node holding one only in its site cache makes it a replica first, so a
    /// replicating node need not send it.
    Has {
        ids: Vec<ChunkId>,
    },
    /// Page of stored chunk ids after `after`, for gc and fsck.
    List {
        after: Option<ChunkId>,
        limit: u32,
    },
    /// Re-hashes the listed chunks on disk; answers the ones that are corrupt or missing.
    Verify {
        ids: Vec<ChunkId>,
    },
    /// Deletes chunks last written more than `min_age_secs` ago; answers how many went.
    Delete {
        ids: Vec<ChunkId>,
        min_age_secs: u64,
        /// The epoch of the primary role of the meta that found them unreferenced
        /// (`Garbage`): a node that has seen a newer one refuses (`ReadOnly`), so a meta
        /// that lost the primary role, whose catalogue misses the new primary's files,
        /// never has their chunks deleted.
        epoch: u64,
    },
    Stats,
    /// Answered at once; nodes time it to measure the round trip between sites.
    Ping,
}

/// Disk usage and health counters of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub chunk_count: u64,
    pub corrupt_reads: u64,
}

impl NodeRequest {
    /// The epoch of the primary role a request that stores or deletes acts under: a
    /// capability's if it has one (signed by meta), else the stated one (`None` for
    /// reads and probes, which change nothing).
    pub fn epoch(&self) -> Option<u64> {
        match self {
            NodeRequest::Put { cap: Some(cap), .. } => Some(cap.epoch),
            NodeRequest::Put { epoch, .. } | NodeRequest::Delete { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }
}

/// Successful answers from a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeReply {
    Done,
    /// The requested bytes follow as the frame's bulk.
    Data,
    Flags(Vec<bool>),
    Ids(Vec<ChunkId>),
    Count(u64),
    Stats(NodeStats),
    /// `Put`'s answer: the nodes now holding the chunk (durably, or received for a
    /// `semi-sync` remote site), for the catalogue, and the node's receipt for the
    /// putter to show meta (`None` to a peer without a certificate, or before the node
    /// has meta's key).
    Stored {
        nodes: Vec<String>,
        receipt: Option<crate::cap::Receipt>,
    },
}

/// The payload of every node response frame.
pub type NodeResult = Result<NodeReply, WireError>;
