//! Replication policies: which sites must hold a directory's chunks, how many copies
//! each keeps, and when a write is acknowledged (the DRBD protocols C, B and A).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// When `close`/`fsync` return, relative to the copies at other sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicationMode {
    /// Durable (fsynced) at the required copies of every listed site.
    Sync,
    /// Durable at the writer's site and received (not yet synced) at every other site.
    SemiSync,
    /// Durable at the writer's node; the other copies are shipped in the background.
    Async,
}

impl fmt::Display for ReplicationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicationMode::Sync => "sync",
            ReplicationMode::SemiSync => "semi-sync",
            ReplicationMode::Async => "async",
        })
    }
}

impl FromStr for ReplicationMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(ReplicationMode::Sync),
            "semi-sync" => Ok(ReplicationMode::SemiSync),
            "async" => Ok(ReplicationMode::Async),
            other => Err(format!("unknown replication mode {other:?} (sync, semi-sync or async)")),
        }
    }
}

/// A directory's replication policy, inherited by everything below it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// Sites that must hold every chunk; empty means the writer's own site.
    pub sites: Vec<String>,
    /// Copies on distinct nodes inside each of those sites.
    pub copies: u32,
    /// When a write is acknowledged.
    pub mode: ReplicationMode,
    /// Recovery point objective: the lag (seconds) beyond which status warns.
    pub rpo_secs: u64,
}

impl Default for Policy {
    /// What a careful operator would choose for a new cluster: two copies at the
    /// writer's site (one where the site has a single node, which status warns about).
    fn default() -> Self {
        Policy { sites: Vec::new(), copies: 2, mode: ReplicationMode::Sync, rpo_secs: 30 }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sites = if self.sites.is_empty() { "<writer's site>".to_string() } else { self.sites.join(",") };
        write!(f, "sites {sites} copies {} mode {} rpo {}s", self.copies, self.mode, self.rpo_secs)
    }
}

/// A directory's policy as meta resolves it: the policy and the directory that set it
/// (`None`: the cluster default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectivePolicy {
    /// The policy in force.
    pub policy: Policy,
    pub set_on: Option<crate::types::InodeId>,
}

/// What a node must ensure for a chunk it is asked to store, beside its own copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicate {
    /// Sites that must hold the chunk (the receiving node's own site among them makes
    /// it place the extra copies there); empty: store here only.
    pub sites: Vec<String>,
    /// Copies on distinct nodes within each listed site.
    pub copies: u32,
    /// When to answer; `None` (a plain store) answers once this node's copy is durable.
    pub mode: Option<ReplicationMode>,
    /// Answer once the bytes are received, before they are durable (a remote site's
    /// leg of `semi-sync`).
    pub on_receipt: bool,
    /// The policy's recovery point objective, for the lag report of queued copies.
    pub rpo_secs: u64,
}

/// Copies a node still owes one site under one policy (queued, not yet made), as the
/// node reports them with its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationLag {
    /// The policy the copies are owed under.
    pub policy: Policy,
    /// The site that does not hold them yet.
    pub site: String,
    /// Chunks owed and their bytes.
    pub chunks: u64,
    pub bytes: u64,
    /// Age of the oldest copy owed.
    pub oldest_secs: u64,
}

impl ReplicationLag {
    /// The oldest owed copy is older than the policy's RPO.
    pub fn breached(&self) -> bool {
        self.oldest_secs > self.policy.rpo_secs
    }
}

impl Replicate {
    /// The policy this request carries out (for lag reports).
    pub fn policy(&self) -> Policy {
        Policy {
            sites: self.sites.clone(),
            copies: self.copies,
            mode: self.mode.unwrap_or(ReplicationMode::Sync),
            rpo_secs: self.rpo_secs,
        }
    }

    /// What a writer at `site` asks its node to ensure for a file under `policy`.
    pub fn for_writer(policy: &Policy, site: &str) -> Replicate {
        let sites = if policy.sites.is_empty() { vec![site.to_string()] } else { policy.sites.clone() };
        Replicate {
            sites,
            copies: policy.copies.max(1),
            mode: Some(policy.mode),
            on_receipt: false,
            rpo_secs: policy.rpo_secs,
        }
    }
}

/// A node that has not reported for this long holds no copy that counts: repair
/// replaces its copies (five missed heartbeats).
pub const NODE_GONE_SECS: u64 = 10;

/// A chunk whose live copies do not satisfy its file's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortfall {
    /// The chunk and its size.
    pub id: crate::types::ChunkId,
    pub size: u64,
    /// A file that uses the chunk (whose policy applies).
    pub ino: crate::types::InodeId,
    /// That file's policy.
    pub policy: Policy,
    /// Nodes alive that hold a copy.
    pub holders: Vec<String>,
    /// Sites short of copies (for a repairing node: the ones it is to fix).
    pub sites: Vec<String>,
}

/// A page of under-replicated chunks and where the scan goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShortfallPage {
    /// The short chunks found in this page of extents.
    pub chunks: Vec<Shortfall>,
    /// The extent to continue after; `None` when the scan is complete.
    pub next: Option<(crate::types::InodeId, u64)>,
}
