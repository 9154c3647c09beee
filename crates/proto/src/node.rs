//! The data-path protocol: clients and tools talk to `locus node` directly for bytes.
//!
//! What each request is, is stated once, in the `node_requests!` table: its reply
//! type, whether bulk bytes travel with it or come back, who may make it without a
//! capability, the capability a client needs and the epoch it acts under. A caller
//! gets the reply type of its request (`NodeMessage::Response`, through
//! `net::RpcClient::call_node`), and a node answers each request through the handler
//! of its type (`ServeNode`, `NodeRequest::dispatch`).

use crate::cap::{Cap, CapOp};
use crate::error::{ErrorCode, WireError};
use crate::policy::Replicate;
use crate::types::{ChunkId, Role};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// Disk usage and health counters of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub chunk_count: u64,
    pub corrupt_reads: u64,
}

/// `Put`'s answer: the nodes now holding the chunk (durably, or received for a
/// `semi-sync` remote site), for the catalogue, and the node's receipt for the putter
/// to show meta (`None` to a peer without a certificate, or before the node has meta's
/// key). No nodes: the node that answered stored it alone (it replicates nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub nodes: Vec<String>,
    pub receipt: Option<crate::cap::Receipt>,
}

impl Stored {
    /// The holders to record, `answered` (the node put to) when it named none.
    pub fn holders(self, answered: &str) -> Vec<String> {
        if self.nodes.is_empty() { vec![answered.to_string()] } else { self.nodes }
    }
}

/// Bulk bytes beside a request: `Bytes` for one that carries a chunk, `()` for one
/// that carries none, so a request cannot be sent without the bytes it needs.
pub trait Bulk: Send + 'static {
    fn into_bytes(self) -> Bytes;
    /// A request that carries none ignores what arrived (as nodes always have).
    fn from_bytes(bytes: Bytes) -> Self;
}

impl Bulk for () {
    fn into_bytes(self) -> Bytes {
        Bytes::new()
    }

    fn from_bytes(_: Bytes) {}
}

impl Bulk for Bytes {
    fn into_bytes(self) -> Bytes {
        self
    }

    fn from_bytes(bytes: Bytes) -> Bytes {
        bytes
    }
}

/// A typed node request: its reply type and its bulk bytes, from the table.
pub trait NodeMessage: Into<NodeRequest> + Send + 'static {
    /// What a successful answer gives the caller (a `Get`'s is the bytes, which travel
    /// as the reply's bulk).
    type Response: Send + 'static;
    /// What travels beside the request as bulk.
    type Bulk: Bulk;
    const KIND: NodeRequestKind;
    /// The answer as it travels: the reply and its bulk bytes.
    fn answer(response: Self::Response) -> (NodeReply, Bytes);
    /// The caller's side of `answer`: a refusal, or an answer of another kind, is an
    /// error.
    fn response(answer: NodeResult, bulk: Bytes) -> Result<Self::Response, WireError>;
}

/// What a node serves; `ServeNode` is implemented once per request type.
pub trait NodeServer: Send + Sync {
    /// What a handler knows beyond the request (the peer, the time).
    type Context: Sync;
}

/// A node's handler of one request type: it must answer with the table's reply type.
pub trait ServeNode<M: NodeMessage>: NodeServer {
    fn serve(
        &self,
        cx: &Self::Context,
        req: M,
        bulk: M::Bulk,
    ) -> impl Future<Output = Result<M::Response, WireError>> + Send;
}

/// What the table says of one kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    /// Certificate roles that may make it without a capability.
    pub roles: &'static [Role],
    /// The capability of meta's a client (or an admin) needs to make it; `None`: they
    /// may not unless their role is listed.
    pub cap: Option<CapOp>,
    /// The request carries bulk bytes (a chunk).
    pub sends_bulk: bool,
    /// The answer carries bulk bytes (a chunk's).
    pub returns_bulk: bool,
}

/// The capability check a request asks of a node: the operation, the chunk it names
/// (none for a put: content-addressed, it adds only the bytes its id names) and the
/// capability it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapCheck<'a> {
    pub op: CapOp,
    pub chunk: Option<&'a ChunkId>,
    pub cap: Option<&'a Cap>,
}

/// The one table of node requests: each becomes a struct, a variant of `NodeRequest`
/// and a `NodeMessage` with its answer type, and states its facts: the `roles` that may
/// make it without a capability, whether it `sends` or `returns` bulk bytes, the `cap`
/// a client (or admin) needs for it (`read` of its `id`, or `write`), and the `epoch`
/// it acts under (`stated`: its field `epoch`; `cap_or_stated`: its capability's, else
/// that field).
macro_rules! node_requests {
    (@flag) => { false };
    (@flag bulk) => { true };
    (@bulk) => { () };
    (@bulk bulk) => { Bytes };
    (@answer $r:ident) => { ($r.into(), Bytes::new()) };
    (@answer $r:ident bulk) => { (NodeReply::Data, $r) };
    (@response $t:ty, $reply:ident, $bulk:ident) => {
        <$t>::try_from($reply).map_err(|other| unexpected(Self::KIND, &other))
    };
    (@response $t:ty, $reply:ident, $bulk:ident bulk) => {
        match $reply {
            NodeReply::Data => Ok($bulk),
            other => Err(unexpected(Self::KIND, &other)),
        }
    };
    (@capop) => { None };
    (@capop read) => { Some(CapOp::Read) };
    (@capop write) => { Some(CapOp::Write) };
    (@cap $m:ident) => { None };
    (@cap $m:ident read) => { Some(CapCheck { op: CapOp::Read, chunk: Some(&$m.id), cap: $m.cap.as_ref() }) };
    (@cap $m:ident write) => { Some(CapCheck { op: CapOp::Write, chunk: None, cap: $m.cap.as_ref() }) };
    (@epoch $m:ident) => { None };
    (@epoch $m:ident stated) => { Some($m.epoch) };
    (@epoch $m:ident cap_or_stated) => { Some($m.cap.as_ref().map_or($m.epoch, |c| c.epoch)) };
    ($( $(#[$doc:meta])* $name:ident { $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)? } => $resp:ty {
        roles: [$($role:ident),*]
        $(, sends: $sends:ident)?
        $(, returns: $returns:ident)?
        $(, cap: $cap:ident)?
        $(, epoch: $epoch:ident)?
    }; )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            pub struct $name { $( $(#[$fdoc])* pub $field: $ty, )* }

            impl NodeMessage for $name {
                type Response = $resp;
                type Bulk = node_requests!(@bulk $($sends)?);
                const KIND: NodeRequestKind = NodeRequestKind::$name;

                fn answer(response: $resp) -> (NodeReply, Bytes) {
                    node_requests!(@answer response $($returns)?)
                }

                #[allow(unused_variables)]
                fn response(answer: NodeResult, bulk: Bytes) -> Result<$resp, WireError> {
                    let reply = answer?;
                    node_requests!(@response $resp, reply, bulk $($returns)?)
                }
            }
        )*

        request_enum! {
            /// Requests to a storage node.
            NodeRequest,
            /// Which request a `NodeMessage` is, without its fields.
            NodeRequestKind,
            NodeFacts;
            $( $(#[$doc])* $name, )*
        }

        impl NodeRequestKind {
            /// The request's facts, as the table states them.
            pub fn facts(self) -> &'static NodeFacts {
                use Role::*;
                match self {
                    $( NodeRequestKind::$name => &NodeFacts {
                        roles: &[$($role),*],
                        cap: node_requests!(@capop $($cap)?),
                        sends_bulk: node_requests!(@flag $($sends)?),
                        returns_bulk: node_requests!(@flag $($returns)?),
                    }, )*
                }
            }
        }

        impl NodeRequest {
            /// The capability check a client's (or admin's) request needs, if it may
            /// be made with one.
            #[allow(unused_variables)]
            pub fn capability(&self) -> Option<CapCheck<'_>> {
                match self {
                    $( NodeRequest::$name(m) => node_requests!(@cap m $($cap)?), )*
                }
            }

            /// The epoch of the primary role a request that stores or deletes acts
            /// under: a capability's if it has one (signed by meta), else the stated
            /// one (`None` for reads and probes, which change nothing).
            #[allow(unused_variables)]
            pub fn epoch(&self) -> Option<u64> {
                match self {
                    $( NodeRequest::$name(m) => node_requests!(@epoch m $($epoch)?), )*
                }
            }

            /// Answers the request with `server`'s handler of its type, as a response
            /// frame's payload and bulk.
            pub async fn dispatch<S>(self, server: &S, cx: &S::Context, bulk: Bytes) -> (NodeResult, Bytes)
            where
                S: NodeServer $( + ServeNode<$name> )*,
            {
                match self {
                    $( NodeRequest::$name(m) => {
                        let bulk = <<$name as NodeMessage>::Bulk as Bulk>::from_bytes(bulk);
                        match <S as ServeNode<$name>>::serve(server, cx, m, bulk).await {
                            Ok(response) => {
                                let (reply, bulk) = <$name as NodeMessage>::answer(response);
                                (Ok(reply), bulk)
                            }
                            Err(e) => (Err(e), Bytes::new()),
                        }
                    } )*
                }
            }
        }
    };
}

fn unexpected(kind: NodeRequestKind, other: &NodeReply) -> WireError {
    WireError::new(ErrorCode::Internal, format!("{kind:?} answered {other:?}"))
}

node_requests! {
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
    } => Stored { roles: [Node, Meta], sends: bulk, cap: write, epoch: cap_or_stated };
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
    } => Bytes { roles: [Node, Meta], returns: bulk, cap: read };
    /// Which of these chunks the node holds as replicas (one flag per id, in order);
    /// a node holding one only in its site cache makes it a replica first, so a
    /// replicating node need not send it.
    Has {
        ids: Vec<ChunkId>,
    } => Vec<bool> { roles: [Node, Admin, Meta] };
    /// Page of stored chunk ids after `after`, for gc and fsck.
    List {
        after: Option<ChunkId>,
        limit: u32,
    } => Vec<ChunkId> { roles: [Admin, Meta] };
    /// Re-hashes the listed chunks on disk; answers the ones that are corrupt or missing.
    Verify {
        ids: Vec<ChunkId>,
    } => Vec<ChunkId> { roles: [Admin, Meta] };
    /// Deletes chunks last written more than `min_age_secs` ago; answers how many went.
    Delete {
        ids: Vec<ChunkId>,
        min_age_secs: u64,
        /// The epoch of the primary role of the meta that found them unreferenced
        /// (`Garbage`): a node that has seen a newer one refuses (`ReadOnly`), so a meta
        /// that lost the primary role, whose catalogue misses the new primary's files,
        /// never has their chunks deleted.
        epoch: u64,
    } => u64 { roles: [Admin, Meta], epoch: stated };
    Stats {} => NodeStats { roles: [Admin, Meta] };
    /// Answered at once; nodes time it to measure the round trip between sites.
    Ping {} => () { roles: [Client, Node, Admin, Meta] };
}

reply_enum! {
    /// Successful answers from a node; `NodeMessage::Response` says which one a
    /// request gets.
    NodeReply;
    /// The requested bytes follow as the frame's bulk.
    Data,;
    Flags(Vec<bool>),
    Ids(Vec<ChunkId>),
    Count(u64),
    Stats(NodeStats),
    Stored(Stored),
}

/// The payload of every node response frame.
pub type NodeResult = Result<NodeReply, WireError>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::decode;
    use postcard::to_allocvec;

    #[test]
    fn the_request_table_is_consistent() {
        assert_eq!(NodeRequestKind::ALL.len(), 8);
        for kind in NodeRequestKind::ALL {
            let f = kind.facts();
            assert!(f.roles.contains(&Role::Meta), "{kind:?}: meta may ask a node anything");
            assert!(!f.roles.contains(&Role::User), "{kind:?}: a user certificate asks nodes nothing");
            // A client or an admin either may make the request or needs a capability for it.
            assert!(!(f.cap.is_some() && f.roles.contains(&Role::Client)), "{kind:?}");
            assert!(f.cap.is_some() || f.roles.contains(&Role::Admin) || *kind == NodeRequestKind::Has, "{kind:?}");
        }
        assert!(NodeRequestKind::Put.facts().sends_bulk && !NodeRequestKind::Put.facts().returns_bulk);
        assert!(NodeRequestKind::Get.facts().returns_bulk && !NodeRequestKind::Get.facts().sends_bulk);
    }

    #[test]
    fn epochs_and_capabilities_come_from_the_fields_the_table_names() {
        let cap = Cap { expires_ms: 1, mac: [0; 32], epoch: 9 };
        let put = |cap| NodeRequest::Put(Put { id: ChunkId([1; 32]), cap, epoch: 4, replicate: Default::default() });
        assert_eq!(put(None).epoch(), Some(4));
        assert_eq!(put(Some(cap)).epoch(), Some(9), "a capability's epoch counts instead");
        assert_eq!(NodeRequest::Delete(Delete { ids: vec![], min_age_secs: 0, epoch: 3 }).epoch(), Some(3));
        let get = Get { id: ChunkId([2; 32]), offset: 0, len: 1, local_only: false, cap: Some(cap) };
        assert_eq!(NodeRequest::Get(get.clone()).epoch(), None);
        let check = CapCheck { op: CapOp::Read, chunk: Some(&get.id), cap: Some(&cap) };
        assert_eq!(NodeRequest::Get(get.clone()).capability(), Some(check));
        assert_eq!(put(None).capability(), Some(CapCheck { op: CapOp::Write, chunk: None, cap: None }));
        assert_eq!(NodeRequest::Ping(Ping {}).capability(), None);
    }

    /// The typed requests and replies travel as the enums of struct variants before
    /// them did (mirrored here), and the committed fuzz corpus decodes as it did.
    #[test]
    fn the_wire_form_is_unchanged() {
        #[derive(Serialize)]
        enum Before {
            Put { id: ChunkId, cap: Option<Cap>, epoch: u64, replicate: Replicate },
            Get { id: ChunkId, offset: u64, len: u64, local_only: bool, cap: Option<Cap> },
            Has { ids: Vec<ChunkId> },
            List { after: Option<ChunkId>, limit: u32 },
            Verify { ids: Vec<ChunkId> },
            Delete { ids: Vec<ChunkId>, min_age_secs: u64, epoch: u64 },
            Stats,
            Ping,
        }
        #[derive(Serialize)]
        enum ReplyBefore {
            Stored { nodes: Vec<String>, receipt: Option<crate::cap::Receipt> },
        }
        let (id, cap) = (ChunkId([2; 32]), Some(Cap { expires_ms: 5, mac: [7; 32], epoch: 3 }));
        let ids = vec![id, ChunkId([4; 32])];
        let replicate = Replicate::default();
        let pairs = [
            (
                Before::Put { id, cap, epoch: 1, replicate: replicate.clone() },
                Put { id, cap, epoch: 1, replicate }.into(),
            ),
            (
                Before::Get { id, offset: 1, len: 2, local_only: true, cap },
                Get { id, offset: 1, len: 2, local_only: true, cap }.into(),
            ),
            (Before::Has { ids: ids.clone() }, Has { ids: ids.clone() }.into()),
            (Before::List { after: Some(id), limit: 9 }, List { after: Some(id), limit: 9 }.into()),
            (Before::Verify { ids: ids.clone() }, Verify { ids: ids.clone() }.into()),
            (
                Before::Delete { ids: ids.clone(), min_age_secs: 6, epoch: 2 },
                Delete { ids, min_age_secs: 6, epoch: 2 }.into(),
            ),
            (Before::Stats, Stats {}.into()),
            (Before::Ping, Ping {}.into()),
        ];
        for (before, now) in pairs {
            let now: NodeRequest = now;
            assert_eq!(to_allocvec(&before).unwrap(), to_allocvec(&now).unwrap(), "{now:?}");
        }
        let receipt = Some(crate::cap::Receipt { expires_ms: 8, mac: [1; 32] });
        let before = ReplyBefore::Stored { nodes: vec!["n".into()], receipt };
        let now = NodeReply::Stored(Stored { nodes: vec!["n".into()], receipt });
        // `Stored` was and is the seventh reply.
        assert_eq!([&[6u8][..], &to_allocvec(&before).unwrap()[1..]].concat(), to_allocvec(&now).unwrap());

        let corpus = |name: &str| {
            std::fs::read(format!("{}/../../fuzz/corpus/node_message/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
        };
        assert_eq!(decode::<NodeRequest>(&corpus("ping")).unwrap(), NodeRequest::Ping(Ping {}));
        assert_eq!(decode::<NodeRequest>(&corpus("stats")).unwrap(), NodeRequest::Stats(Stats {}));
        assert!(decode::<NodeRequest>(&corpus("put")).is_err(), "a put of an older form, cut short");
    }

    #[test]
    fn a_reply_of_another_kind_is_an_error_and_data_brings_the_bulk() {
        let data = Bytes::from_static(b"chunk");
        assert_eq!(Get::response(Ok(NodeReply::Data), data.clone()).unwrap(), data);
        assert_eq!(Get::response(Ok(NodeReply::Done), data.clone()).unwrap_err().code, ErrorCode::Internal);
        assert_eq!(Has::response(Ok(NodeReply::Flags(vec![true])), Bytes::new()).unwrap(), vec![true]);
        assert_eq!(Delete::response(Ok(NodeReply::Ids(vec![])), Bytes::new()).unwrap_err().code, ErrorCode::Internal);
        let refused = WireError::new(ErrorCode::NotFound, "gone");
        assert_eq!(Ping::response(Err(refused.clone()), Bytes::new()).unwrap_err(), refused);
        assert_eq!(Get::answer(data.clone()), (NodeReply::Data, data));
        assert_eq!(Ping::answer(()), (NodeReply::Done, Bytes::new()));
    }
}
