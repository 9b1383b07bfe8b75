//! A coordinator's data-plane orders (issue 19, ADR 0106): fence (api key
//! 103), catch-up (101) and seal (102), both halves. Fence, seal, drop
//! copies and replica status travel over the node fabric (ractor_cluster,
//! ADR 0133; served by `order_server.rs`), and on the cluster port when the
//! fabric has no session to the peer; catch-up carries frames and stays on
//! the cluster port.
//!
//! The serving half answers for the copies this broker holds, each order
//! checked against the metadata this broker knows (it must hold a copy of
//! the segment) and against the newest order epoch the copy has taken
//! (`SegmentStore::fence_order`, remembered in the fence marker across
//! restarts), so a deposed coordinator cannot act on a copy its successor
//! reached. The asking half ([`OrderClient`]) is what the failover actor
//! uses; an order to this broker itself is served without the network, by
//! the same functions. Repair writes travel as replica-appends carrying a
//! `RepairOrder` (`replica.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_cluster::group::RpcError;
use malachi_core::model::{NodeId, SegmentId, SegmentState};
use malachi_storage::{SegmentStore, StorageError};
use malachi_wire::replica_order::{
    CATCH_UP_API_KEY, CATCH_UP_BYTES_MAX, CatchUpRequest, CatchUpResponse, DROP_COPIES_API_KEY,
    DropCopiesRequest, DropCopiesResponse, FENCE_API_KEY, FenceRequest, FenceResponse, OrderEpoch,
    OrderRefusal, SEAL_API_KEY, SealRequest, SealResponse, SealedAt,
};
use malachi_wire::replication::{
    REPLICA_APPEND_API_KEY, ReplicaAppendRequest, ReplicaAppendResponse,
};
use tracing::debug;

use crate::control::metadata::read_owner;
use crate::control::order_epoch::{store_order, wire_order};
use crate::control::order_error::OrderError;
use crate::control::shared::Shared;
use crate::data::ancestors::{HolderReadError, HolderReads};
use crate::fabric::node::Fabric;
use crate::fabric::remote::RemoteError;

/// How long one order waits for its answer (a fence waits for the copy's
/// drain, an fsync at most).
pub(crate) const ORDER_TIMEOUT_MS: u64 = 2_000;

/// How long an order to a live peer with no fabric proxy waits for one
/// before it takes the cluster port: longer than the order server's
/// re-announcement of its group (`order_server::ORDERS_REJOIN_MS`), well
/// within [`ORDER_TIMEOUT_MS`]. An order to a peer membership does not
/// call live takes the cluster port at once.
pub(crate) const ORDER_SESSION_WAIT_MS: u64 = 600;

/// The node-fabric behaviour that serves orders (`order_server.rs`): its
/// actor is in the process group `orders/<node_id>@<fabric addr>`.
pub(crate) const ORDERS_BEHAVIOUR: &str = "orders";

/// The orders that travel over the node fabric (ADR 0133), by their name
/// there and their cluster-port api key (still served, the fallback).
/// Catch-up (101) and replica-append (100) carry frames and stay on the
/// cluster port.
const FABRIC_ORDERS: [(&str, u16); 4] = [
    ("fence", FENCE_API_KEY),
    ("seal", SEAL_API_KEY),
    ("drop_copies", DROP_COPIES_API_KEY),
    (
        "replica_status",
        malachi_wire::replica_status::REPLICA_STATUS_API_KEY,
    ),
];

/// The cluster-port api key of the fabric order named `variant`.
pub(crate) fn api_key_of(variant: &str) -> Option<u16> {
    FABRIC_ORDERS
        .iter()
        .find(|(name, _)| *name == variant)
        .map(|(_, key)| *key)
}

/// The fabric name of the order with cluster-port api key `api_key`, if it
/// travels over the fabric.
pub(crate) fn variant_of(api_key: u16) -> Option<&'static str> {
    FABRIC_ORDERS
        .iter()
        .find(|(_, key)| *key == api_key)
        .map(|(name, _)| *name)
}

/// What the metadata this broker knows says of its copy of `segment`.
enum Held {
    /// This broker holds a copy; the segment's state.
    Yes(SegmentState),
    No,
}

fn held(shared: &Shared, topic: &str, segment: SegmentId) -> Held {
    let me = NodeId(shared.config.node_id);
    let found = shared.plane().ok().and_then(|plane| {
        read_owner(plane.as_ref(), topic, |state| {
            state
                .segment(segment)
                .map(|s| (s.replicas.contains(&me), s.state))
        })
    });
    match found {
        Some((true, state)) => Held::Yes(state),
        _ => Held::No,
    }
}

/// Runs a blocking store call off the async workers, opening the copy
/// first if this broker has not opened it since it started.
async fn on_copy<T: Send + 'static>(
    shared: &Arc<Shared>,
    segment: SegmentId,
    call: impl FnOnce(&dyn SegmentStore, malachi_storage::SegmentId) -> Result<T, StorageError>
    + Send
    + 'static,
) -> Result<T, StorageError> {
    let store = Arc::clone(&shared.store);
    let id = malachi_storage::SegmentId(segment.0);
    tokio::task::spawn_blocking(move || {
        if let Err(StorageError::NotOpen { .. }) = store.info(id) {
            store.open(id)?;
        }
        call(store.as_ref(), id)
    })
    .await
    .unwrap_or_else(|e| {
        Err(StorageError::Failed {
            segment: id,
            reason: format!("the store task failed: {e}"),
        })
    })
}

/// Answers a fence order: the copy takes no more appends from its primary,
/// and says how far it is durable once nothing queued is in flight.
pub(crate) async fn serve_fence(shared: &Arc<Shared>, body: &[u8]) -> FenceResponse {
    let request = match FenceRequest::decode(body) {
        Ok(request) => request,
        Err(e) => {
            return FenceResponse::refused(
                OrderRefusal::InvalidRequest,
                OrderEpoch::default(),
                e.to_string(),
            );
        }
    };
    let segment = SegmentId(request.segment);
    if let Held::No = held(shared, &request.topic, segment) {
        return FenceResponse::refused(
            OrderRefusal::UnknownCopy,
            request.order,
            format!(
                "broker {} holds no copy of segment {segment} of {}",
                shared.config.node_id, request.topic
            ),
        );
    }
    let order = store_order(request.order);
    match on_copy(shared, segment, move |store, id| {
        store.fence_order(id, order)
    })
    .await
    {
        Ok(info) => {
            let mut answer =
                FenceResponse::fenced(info.durable, info.durable_bytes, wire_order(info.order));
            if let Some(seal) = info.sealed {
                answer = answer.with_seal(SealedAt {
                    length: seal.length,
                    bytes: seal.byte_size,
                });
            }
            if info.failed {
                // Its records count (and can be read): the answer carries
                // its ends, marked failed so nothing repairs it.
                answer.refused = Some(OrderRefusal::Failed);
                answer.message = format!("segment {segment}: the copy's disk failed");
            }
            debug!(
                segment = segment.0,
                durable = info.durable,
                ?order,
                "copy fenced by order"
            );
            answer
        }
        Err(StorageError::StaleOrder { seen, .. }) => FenceResponse::refused(
            OrderRefusal::StaleOrder,
            wire_order(seen),
            format!("segment {segment} took a newer order ({seen:?})"),
        ),
        Err(e) => FenceResponse::refused(OrderRefusal::Failed, request.order, e.to_string()),
    }
}

/// Answers a catch-up: the copy's durable frames from `from`, verbatim
/// (clamped to its seal), at most `bytes_max` bytes. It only reads, so it
/// is not order-gated: besides coordinators' recoveries and the healer, a
/// broker serving a fetch reads the sealed segments it holds no copy of
/// with it (ADR 0118).
pub(crate) async fn serve_catch_up(shared: &Arc<Shared>, body: &[u8]) -> CatchUpResponse {
    let request = match CatchUpRequest::decode(body) {
        Ok(request) => request,
        Err(e) => return CatchUpResponse::refused(OrderRefusal::InvalidRequest, 0, e.to_string()),
    };
    let segment = SegmentId(request.segment);
    if let Held::No = held(shared, &request.topic, segment) {
        return CatchUpResponse::refused(
            OrderRefusal::UnknownCopy,
            0,
            format!(
                "broker {} holds no copy of segment {segment}",
                shared.config.node_id
            ),
        );
    }
    let (from, bytes_max) = (
        request.from,
        usize::try_from(request.bytes_max.min(CATCH_UP_BYTES_MAX)).unwrap_or(1 << 20),
    );
    let read = on_copy(shared, segment, move |store, id| {
        let info = store.info(id)?;
        let run = store.read_frames(id, from, bytes_max)?;
        Ok((info, run))
    })
    .await;
    match read {
        // The readable end is taken before the frames are read: it only
        // grows, so every record below it is among the frames' records or
        // before them (ADR 0123).
        Ok((info, run)) => CatchUpResponse::frames(run.first, info.durable, Bytes::from(run.bytes))
            .with_readable_end(info.length),
        Err(e @ StorageError::OffsetOutOfRange { end, .. }) => {
            CatchUpResponse::refused(OrderRefusal::Short, end, e.to_string())
        }
        Err(e) => CatchUpResponse::refused(OrderRefusal::Failed, 0, e.to_string()),
    }
}

/// Answers a seal order: only at the seal the metadata records (a copy is
/// never sealed at a length the metadata does not hold), idempotent.
pub(crate) async fn serve_seal(shared: &Arc<Shared>, body: &[u8]) -> SealResponse {
    let request = match SealRequest::decode(body) {
        Ok(request) => request,
        Err(e) => return SealResponse::refused(OrderRefusal::InvalidRequest, 0, e.to_string()),
    };
    let segment = SegmentId(request.segment);
    let recorded = match held(shared, &request.topic, segment) {
        Held::No => {
            return SealResponse::refused(
                OrderRefusal::UnknownCopy,
                0,
                format!(
                    "broker {} holds no copy of segment {segment}",
                    shared.config.node_id
                ),
            );
        }
        Held::Yes(SegmentState::Sealed { seal, .. }) => seal,
        // The seal is recorded and not applied here yet: retriable.
        Held::Yes(SegmentState::Active) => {
            return SealResponse::refused(
                OrderRefusal::Busy,
                0,
                format!("segment {segment} is not sealed in this broker's metadata yet"),
            );
        }
    };
    if recorded.length != request.length {
        return SealResponse::refused(
            OrderRefusal::SealMismatch,
            0,
            format!(
                "segment {segment} is recorded sealed at {}, not {}",
                recorded.length, request.length
            ),
        );
    }
    let order = store_order(request.order);
    let length = request.length;
    let sealed = on_copy(shared, segment, move |store, id| {
        let seen = store.order_epoch(id)?;
        if order.is_stale_against(seen) {
            return Err(StorageError::StaleOrder {
                segment: id,
                seen,
                order,
            });
        }
        let info = store.info(id)?;
        if info.durable < length && info.sealed.is_none() {
            return Err(StorageError::SealBeyondEnd {
                segment: id,
                requested: length,
                stored: info.durable,
            });
        }
        store.seal(id, length).map(|seal| (info.durable, seal))
    })
    .await;
    match sealed {
        Ok((durable, seal)) => {
            shared.data.replication.followed.lock().remove(&segment);
            SealResponse::sealed(
                durable,
                SealedAt {
                    length: seal.length,
                    bytes: seal.byte_size,
                },
            )
        }
        Err(e @ StorageError::SealBeyondEnd { stored, .. }) => {
            SealResponse::refused(OrderRefusal::Short, stored, e.to_string())
        }
        Err(e @ StorageError::AlreadySealed { .. }) => {
            SealResponse::refused(OrderRefusal::SealMismatch, 0, e.to_string())
        }
        Err(e @ StorageError::StaleOrder { .. }) => {
            SealResponse::refused(OrderRefusal::StaleOrder, 0, e.to_string())
        }
        Err(e) => SealResponse::refused(OrderRefusal::Failed, 0, e.to_string()),
    }
}

/// Routes the order keys of the cluster port (`cluster_port.rs`).
pub(crate) async fn serve_order(
    shared: &Arc<Shared>,
    api_key: u16,
    body: Bytes,
) -> Option<Result<Vec<u8>, RpcError>> {
    let encoded = match api_key {
        FENCE_API_KEY => serve_fence(shared, &body).await.encode(),
        CATCH_UP_API_KEY => serve_catch_up(shared, &body).await.encode(),
        SEAL_API_KEY => serve_seal(shared, &body).await.encode(),
        // Boxed: its future (a vnode query, actor stops, file removals)
        // would otherwise be laid out inside every caller of the router.
        DROP_COPIES_API_KEY => Box::pin(super::removal::serve_drop_copies(shared, &body))
            .await
            .encode(),
        _ => return None,
    };
    Some(encoded.map(|b| b.to_vec()).map_err(|e| RpcError::Encode {
        what: "replica_order_response",
        source: std::sync::Arc::new(e),
    }))
}

/// The asking half: sends orders to the brokers holding copies, this one
/// included (served locally, by the same functions).
#[derive(Clone)]
pub(crate) struct OrderClient {
    pub shared: Arc<Shared>,
}

/// A segment reads an ancestor it holds no whole copy of from a holder
/// with the catch-up read (ADR 0124): it only reads, so it carries no
/// order, as a remote read does (ADR 0118); each call within
/// `ORDER_TIMEOUT_MS`.
#[async_trait::async_trait]
impl HolderReads for OrderClient {
    async fn read(
        &self,
        topic: &str,
        segment: SegmentId,
        holder: NodeId,
        from: u64,
        bytes_max: u64,
    ) -> Result<(u64, Bytes), HolderReadError> {
        let request = CatchUpRequest {
            topic: topic.to_string(),
            segment: segment.0,
            order: OrderEpoch::default(),
            from,
            bytes_max,
        };
        let answer = self
            .catch_up(holder.0, &request)
            .await
            .map_err(|e| HolderReadError::Call(Box::new(e)))?;
        if let Some(refusal) = answer.refused {
            return Err(HolderReadError::Refused {
                node: holder.0,
                refusal,
                message: answer.message,
            });
        }
        Ok((answer.first_offset, answer.frames))
    }

    /// Asked with replica-status (ADR 0156), which a broker that predates
    /// the ask answers without tables.
    async fn sealed_table(
        &self,
        _topic: &str,
        segment: SegmentId,
        holder: NodeId,
        length: u64,
    ) -> Result<Option<Vec<u8>>, HolderReadError> {
        use malachi_wire::replica_status::{
            REPLICA_STATUS_API_KEY, ReplicaStatusRequest, ReplicaStatusResponse, ScrubSeal,
        };
        let body = ReplicaStatusRequest {
            producer_tables: vec![ScrubSeal {
                segment: segment.0,
                length,
                bytes: 0,
            }],
            ..ReplicaStatusRequest::default()
        }
        .encode()
        .map_err(|e| HolderReadError::Call(Box::new(e)))?;
        let answer = self
            .call(holder.0, REPLICA_STATUS_API_KEY, body)
            .await
            .map_err(|e| HolderReadError::Call(Box::new(e)))?;
        let answer = ReplicaStatusResponse::decode(&answer)
            .map_err(|e| HolderReadError::Call(Box::new(e)))?;
        Ok(answer
            .producer_tables
            .into_iter()
            .find(|t| t.segment == segment.0 && !t.sidecar.is_empty())
            .map(|t| t.sidecar))
    }

    fn live(&self, holder: NodeId) -> bool {
        !super::placement::is_dead(&self.shared, holder)
    }
}

impl OrderClient {
    async fn call(&self, node: u64, api_key: u16, body: Bytes) -> Result<Bytes, OrderError> {
        if node == self.shared.config.node_id {
            let answer = match api_key {
                REPLICA_APPEND_API_KEY => super::replica::serve_replica_append(&self.shared, body)
                    .await
                    .encode()
                    .map_err(|source| OrderError::Encode {
                        what: "replica_append_response",
                        source,
                    }),
                _ => match serve_order(&self.shared, api_key, body).await {
                    Some(Ok(bytes)) => Ok(Bytes::from(bytes)),
                    Some(Err(e)) => Err(OrderError::Local(e)),
                    None => Err(OrderError::NoLocalOrder { api_key }),
                },
            };
            return answer;
        }
        let deadline = Instant::now() + Duration::from_millis(ORDER_TIMEOUT_MS);
        if let Some(answer) = self.over_fabric(node, api_key, &body).await {
            return answer;
        }
        let Some(raft) = self.shared.links.raft.get() else {
            return Err(OrderError::NoClusterPort);
        };
        let left_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        raft.transport
            .call_raw(node, api_key, 0, &body, left_ms.max(1))
            .await
            .map_err(OrderError::Port)
    }

    /// Sends an order that travels over the node fabric there, within
    /// [`ORDER_TIMEOUT_MS`]; `None` when the fabric did not carry it and
    /// the cluster port should ([`over_fabric`]).
    async fn over_fabric(
        &self,
        node: u64,
        api_key: u16,
        body: &Bytes,
    ) -> Option<Result<Bytes, OrderError>> {
        let variant = variant_of(api_key)?;
        let fabric = self.shared.fabric()?;
        let timeout = Duration::from_millis(ORDER_TIMEOUT_MS);
        let sent = over_fabric(&fabric, node, variant, body.to_vec(), timeout).await?;
        Some(sent.map(Bytes::from).map_err(OrderError::Fabric))
    }

    pub(crate) async fn fence(
        &self,
        node: u64,
        request: &FenceRequest,
    ) -> Result<FenceResponse, OrderError> {
        let body = request.encode().map_err(encode("fence_request"))?;
        let answer = self.call(node, FENCE_API_KEY, body).await?;
        FenceResponse::decode(&answer).map_err(decode(node, "fence_response"))
    }

    pub(crate) async fn catch_up(
        &self,
        node: u64,
        request: &CatchUpRequest,
    ) -> Result<CatchUpResponse, OrderError> {
        let body = request.encode().map_err(encode("catch_up_request"))?;
        let answer = self.call(node, CATCH_UP_API_KEY, body).await?;
        CatchUpResponse::decode(answer).map_err(decode(node, "catch_up_response"))
    }

    pub(crate) async fn seal(
        &self,
        node: u64,
        request: &SealRequest,
    ) -> Result<SealResponse, OrderError> {
        let body = request.encode().map_err(encode("seal_request"))?;
        let answer = self.call(node, SEAL_API_KEY, body).await?;
        SealResponse::decode(&answer).map_err(decode(node, "seal_response"))
    }

    /// What `node` says of its copy of `segment` (replica-status, 105).
    pub(crate) async fn status(
        &self,
        node: u64,
        segment: SegmentId,
    ) -> Result<malachi_wire::replica_status::CopyStatus, OrderError> {
        self.statuses(node, &[segment.0])
            .await?
            .pop()
            .ok_or(OrderError::Silent { node, segment })
    }

    /// What `node` says of its copies of `segments` (at most
    /// `REPLICA_STATUS_SEGMENTS_MAX`), in their order. A probe: it opens
    /// and fences nothing.
    pub(crate) async fn statuses(
        &self,
        node: u64,
        segments: &[u64],
    ) -> Result<Vec<malachi_wire::replica_status::CopyStatus>, OrderError> {
        use malachi_wire::replica_status::{
            REPLICA_STATUS_API_KEY, ReplicaStatusRequest, ReplicaStatusResponse,
        };
        let copies = if node == self.shared.config.node_id {
            crate::data::status::copy_status(&self.shared.data, segments)
        } else {
            let body = ReplicaStatusRequest {
                segments: segments.to_vec(),
                ..ReplicaStatusRequest::default()
            }
            .encode()
            .map_err(encode("replica_status_request"))?;
            let answer = self.call(node, REPLICA_STATUS_API_KEY, body).await?;
            ReplicaStatusResponse::decode(&answer)
                .map_err(decode(node, "replica_status_response"))?
                .copies
        };
        if copies.len() != segments.len()
            || copies.iter().zip(segments).any(|(c, s)| c.segment != *s)
        {
            return Err(OrderError::Mismatch {
                node,
                what: "copy statuses",
                answered: copies.len(),
                asked: segments.len(),
                of: "segments",
            });
        }
        Ok(copies)
    }

    /// The scrub verdicts of `node`'s copies of `seals` (ADR 0110), in
    /// their order.
    pub(crate) async fn scrub(
        &self,
        node: u64,
        seals: &[malachi_wire::replica_status::ScrubSeal],
    ) -> Result<Vec<malachi_wire::replica_status::ScrubVerdict>, OrderError> {
        use malachi_wire::replica_status::{
            REPLICA_STATUS_API_KEY, ReplicaStatusRequest, ReplicaStatusResponse,
        };
        let verdicts = if node == self.shared.config.node_id {
            crate::data::scrub::verdicts(&self.shared.data, seals)
        } else {
            let body = ReplicaStatusRequest {
                segments: Vec::new(),
                scrub: seals.to_vec(),
                ..ReplicaStatusRequest::default()
            }
            .encode()
            .map_err(encode("replica_status_request"))?;
            let answer = self.call(node, REPLICA_STATUS_API_KEY, body).await?;
            ReplicaStatusResponse::decode(&answer)
                .map_err(decode(node, "replica_status_response"))?
                .scrub
        };
        if verdicts.len() != seals.len()
            || verdicts
                .iter()
                .zip(seals)
                .any(|(v, s)| v.segment != s.segment)
        {
            return Err(OrderError::Mismatch {
                node,
                what: "scrub verdicts",
                answered: verdicts.len(),
                asked: seals.len(),
                of: "copies",
            });
        }
        Ok(verdicts)
    }

    /// A drop order to `node` (api key 106, ADR 0115).
    pub(crate) async fn drop_copies(
        &self,
        node: u64,
        request: &DropCopiesRequest,
    ) -> Result<DropCopiesResponse, OrderError> {
        let body = request.encode().map_err(encode("drop_copies_request"))?;
        let answer = self.call(node, DROP_COPIES_API_KEY, body).await?;
        DropCopiesResponse::decode(&answer).map_err(decode(node, "drop_copies_response"))
    }

    pub(crate) async fn repair(
        &self,
        node: u64,
        request: &ReplicaAppendRequest,
    ) -> Result<ReplicaAppendResponse, OrderError> {
        let body = request.encode().map_err(encode("replica_append_request"))?;
        let answer = self.call(node, REPLICA_APPEND_API_KEY, body).await?;
        ReplicaAppendResponse::decode(&answer).map_err(decode(node, "replica_append_response"))
    }
}

/// The error of a request `what` that did not encode.
fn encode(what: &'static str) -> impl FnOnce(malachi_wire::WireError) -> OrderError {
    move |source| OrderError::Encode { what, source }
}

/// The error of broker `node`'s answer `what` that did not decode.
fn decode(node: u64, what: &'static str) -> impl FnOnce(malachi_wire::WireError) -> OrderError {
    move |source| OrderError::Decode { node, what, source }
}

/// Sends the fabric order `variant` (with its encoded `body`) to broker
/// `node`'s order server over the node fabric, within `timeout`; `None`
/// when the fabric did not carry it (no proxy of the peer's order server,
/// or the call lost with its session) and the cluster port should: every
/// fabric order is idempotent, so both carrying it is harmless (ADR 0133).
/// A peer membership calls live is waited for up to
/// [`ORDER_SESSION_WAIT_MS`] (within `timeout`); another is not.
pub(crate) async fn over_fabric(
    fabric: &Fabric,
    node: u64,
    variant: &'static str,
    body: Vec<u8>,
    timeout: Duration,
) -> Option<Result<Vec<u8>, RemoteError>> {
    debug_assert!(
        api_key_of(variant).is_some(),
        "{variant} is no fabric order"
    );
    let (to, live) = fabric.peer(node);
    let session_wait = Duration::from_millis(if live { ORDER_SESSION_WAIT_MS } else { 0 });
    let sent = fabric
        .calls
        .call(ORDERS_BEHAVIOUR, to, variant, body, timeout, session_wait);
    match sent.await {
        Ok(answer) => Some(Ok(answer)),
        Err(error) if error.is_unreachable() => {
            fabric.calls.count_bypassed();
            debug!(node, variant, %error, "order sent on the cluster port instead");
            None
        }
        Err(error) => Some(Err(error)),
    }
}

impl std::fmt::Debug for OrderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderClient")
            .field("node", &self.shared.config.node_id)
            .finish()
    }
}
