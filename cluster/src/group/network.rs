//! The seam between a metadata group and the transport that carries its raft
//! messages to peers.
//!
//! A transport moves opaque bytes: the group encodes each raft request with
//! rmp-serde, the transport delivers it with the group id to the target
//! node, and the target hands it to `MetadataGroup::handle_rpc`, whose bytes
//! travel back. This keeps openraft's message types out of every other crate,
//! and lets one transport multiplex many groups (vnodes) by `group_id`.
//! A single-voter group never sends anything; `UnreachableTransport` is its
//! default.

use super::handshake::HandshakeError;
use super::types::{SnapshotBytes, TypeConfig, Vote};
use malachi_wire::error::ErrorCode;
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetworkFactory, RaftNetworkV2};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Which raft message a request body holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaftRpcKind {
    AppendEntries,
    Vote,
    PreVote,
    FullSnapshot,
    /// A leader asks a voter to take over (leader balancing, ADR 0101).
    TransferLeader,
}

impl RaftRpcKind {
    /// A stable tag for framing on the wire.
    pub fn tag(self) -> u8 {
        match self {
            RaftRpcKind::AppendEntries => 1,
            RaftRpcKind::Vote => 2,
            RaftRpcKind::PreVote => 3,
            RaftRpcKind::FullSnapshot => 4,
            RaftRpcKind::TransferLeader => 5,
        }
    }

    /// The kind a wire tag names, if any.
    pub fn from_tag(tag: u8) -> Option<RaftRpcKind> {
        match tag {
            1 => Some(RaftRpcKind::AppendEntries),
            2 => Some(RaftRpcKind::Vote),
            3 => Some(RaftRpcKind::PreVote),
            4 => Some(RaftRpcKind::FullSnapshot),
            5 => Some(RaftRpcKind::TransferLeader),
            _ => None,
        }
    }
}

/// Why a transport could not deliver a request or bring back its answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The target cannot be reached now; raft backs off and retries.
    #[error("node {target} is unreachable: {cause}")]
    Unreachable {
        target: u64,
        #[source]
        cause: UnreachableCause,
    },
    /// The request may or may not have arrived.
    #[error("network error to node {target}: {fault}")]
    Network {
        target: u64,
        #[source]
        fault: NetworkFault,
    },
    /// The target received the request and refused it (for example its
    /// group is stopped): `code` is the refusal's wire code and
    /// `peer_message` the text the peer sent with it.
    #[error("node {target} refused the request: {code}: {peer_message}")]
    Remote {
        target: u64,
        code: ErrorCode,
        peer_message: String,
    },
}

/// Why no connection to a peer could carry a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UnreachableCause {
    #[error("this group has no transport")]
    NoTransport,
    #[error("this node's group is shutting down")]
    ShuttingDown,
    #[error("no address known")]
    NoAddress,
    #[error("backing off after a failed connect")]
    BackingOff,
    #[error("{0}")]
    Connect(#[source] Arc<std::io::Error>),
    #[error("connect timed out")]
    ConnectTimedOut,
    /// The server closed the connection during the handshake, which is how
    /// a server answers a proof made with another cookie.
    #[error("the server closed the handshake (a different cluster cookie?): {0}")]
    HandshakeClosed(#[source] Arc<HandshakeError>),
    #[error("handshake failed: {0}")]
    Handshake(#[source] Arc<HandshakeError>),
    #[error("handshake timed out")]
    HandshakeTimedOut,
    /// The TLS handshake failed (ADR 0151): the peer's certificate is not
    /// the cluster CA's, it refused ours, or it speaks plaintext.
    #[error("tls handshake {reason}: {detail}")]
    Tls {
        reason: &'static str,
        detail: String,
    },
    /// The peer's group is not running (an in-memory test transport).
    #[error("down")]
    Down,
}

/// What went wrong after a connection took a request: it may have arrived.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetworkFault {
    #[error("encode: {0}")]
    Encode(#[source] Arc<rmp_serde::encode::Error>),
    #[error("decode: {0}")]
    Decode(#[source] Arc<rmp_serde::decode::Error>),
    #[error("no free slot on the connection in time")]
    NoSlot,
    #[error("connection closed")]
    Closed,
    #[error("connection closed before the request was sent")]
    ClosedBeforeSent,
    #[error("connection closed while waiting for the answer")]
    ClosedAwaitingAnswer,
    #[error("no answer within {timeout_ms} ms")]
    NoAnswer { timeout_ms: u64 },
    /// An in-memory test transport cut the request short.
    #[error("{0}")]
    Injected(&'static str),
}

/// Carries a group's raft messages to peers. A later wire-framed transport
/// implements this; the group id lets one connection serve many groups.
#[async_trait::async_trait]
pub trait GroupTransport: Send + Sync + std::fmt::Debug + 'static {
    /// Sends `body` to `target`'s group `group_id` and returns the answer's
    /// bytes, giving up after `timeout_ms`.
    async fn call(
        &self,
        group_id: u64,
        target: u64,
        kind: RaftRpcKind,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, TransportError>;
}

/// The transport of a group with no peers: every call is unreachable.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnreachableTransport;

#[async_trait::async_trait]
impl GroupTransport for UnreachableTransport {
    async fn call(
        &self,
        _group_id: u64,
        target: u64,
        _kind: RaftRpcKind,
        _body: Vec<u8>,
        _timeout_ms: u64,
    ) -> Result<Vec<u8>, TransportError> {
        Err(TransportError::Unreachable {
            target,
            cause: UnreachableCause::NoTransport,
        })
    }
}

/// The snapshot message on the wire: the leader's vote, meta and the bytes.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct FullSnapshotRequest {
    pub(crate) vote: Vote,
    pub(crate) meta: super::types::SnapshotMeta,
    pub(crate) data: SnapshotBytes,
}

#[derive(Debug, Clone)]
pub(crate) struct NetworkFactory {
    pub(crate) group_id: u64,
    pub(crate) transport: Arc<dyn GroupTransport>,
    /// Cancelled when the group starts to shut down (`MetadataGroup::shutdown`).
    pub(crate) stopping: CancellationToken,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Peer {
        Peer {
            group_id: self.group_id,
            target,
            transport: self.transport.clone(),
            stopping: self.stopping.clone(),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Peer {
    group_id: u64,
    target: u64,
    transport: Arc<dyn GroupTransport>,
    stopping: CancellationToken,
}

fn to_rpc_error(err: TransportError) -> RPCError<TypeConfig> {
    match err {
        TransportError::Unreachable { .. } | TransportError::Remote { .. } => {
            RPCError::Unreachable(Unreachable::new(&err))
        }
        TransportError::Network { .. } => RPCError::Network(NetworkError::new(&err)),
    }
}

/// The shortest wait for a raft answer. openraft asks for an append's
/// answer within one heartbeat interval (100 ms): a follower slowed by its
/// disk or a CPU quota that answers in 150 ms then times out every time,
/// the leader backs off (200 ms) and sends the same entries again, so the
/// slow follower does the same work over and over and applies committed
/// entries seconds late (a split child placed on it started 7 s after the
/// split, ADR 0158). Waiting this long instead costs a dead peer's
/// detection nothing: membership and the election timeout judge that.
pub const RAFT_RPC_TIMEOUT_MS_MIN: u64 = 1_000;

/// How long one raft call waits: what openraft asks, at least
/// [`RAFT_RPC_TIMEOUT_MS_MIN`].
fn rpc_timeout_ms(option: &RPCOption) -> u64 {
    u64::try_from(option.hard_ttl().as_millis())
        .unwrap_or(u64::MAX)
        .max(RAFT_RPC_TIMEOUT_MS_MIN)
}

impl Peer {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: RaftRpcKind,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, TransportError> {
        let network = |fault: NetworkFault| TransportError::Network {
            target: self.target,
            fault,
        };
        let body =
            rmp_serde::to_vec(request).map_err(|e| network(NetworkFault::Encode(Arc::new(e))))?;
        let timeout_ms = rpc_timeout_ms(option);
        // Once the group is stopping, no answer goes back to raft: its core
        // is about to stop, and an answer that reached a heartbeat worker
        // after that is logged by openraft as an error ("failed to send
        // HeartbeatProgress to RaftCore"). A call that fails here is one
        // openraft rides out (a warning its default filter hides), and it
        // never reaches the transport, so the peer's health is not charged
        // for this node's own shutdown. `biased`: the stop is checked first
        // on every poll.
        let answer = tokio::select! {
            biased;
            () = self.stopping.cancelled() => {
                return Err(TransportError::Unreachable {
                    target: self.target,
                    cause: UnreachableCause::ShuttingDown,
                });
            }
            answer = self.transport.call(self.group_id, self.target, kind, body, timeout_ms) => answer?,
        };
        rmp_serde::from_slice(&answer).map_err(|e| network(NetworkFault::Decode(Arc::new(e))))
    }
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotBytes;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::AppendEntries, &rpc, &option)
            .await
            .map_err(to_rpc_error)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::Vote, &rpc, &option)
            .await
            .map_err(to_rpc_error)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::PreVote, &rpc, &option)
            .await
            .map_err(to_rpc_error)
    }

    async fn transfer_leader(
        &mut self,
        rpc: openraft::raft::TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<openraft::raft::TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::TransferLeader, &rpc, &option)
            .await
            .map_err(to_rpc_error)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: super::types::Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let request = FullSnapshotRequest {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot,
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            answer = self.call(RaftRpcKind::FullSnapshot, &request, &option) => match answer {
                Ok(response) => Ok(response),
                Err(err @ TransportError::Network { .. }) => Err(StreamingError::Network(NetworkError::new(&err))),
                Err(err) => Err(StreamingError::Unreachable(Unreachable::new(&err))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_raft_call_waits_at_least_the_floor_and_longer_when_asked() {
        let heartbeat = RPCOption::new(Duration::from_millis(100));
        assert_eq!(rpc_timeout_ms(&heartbeat), RAFT_RPC_TIMEOUT_MS_MIN);
        let snapshot = RPCOption::new(Duration::from_secs(30));
        assert_eq!(rpc_timeout_ms(&snapshot), 30_000);
    }
}
