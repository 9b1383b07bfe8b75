//! The control plane's half of a replica-append (api key 100, ADR 0095):
//! the check that this broker holds a follower copy of the segment, by the
//! metadata it knows, before the data plane's ReplicationServer writes it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use malachi_core::model::{NodeId, SegmentId, SegmentState};
use malachi_wire::replication::{ReplicaAppendRequest, ReplicaAppendResponse, ReplicaRefusal};

use crate::control::metadata::read_owner;
use crate::control::shared::Shared;
use crate::data::replication::ReplicationMsg;

/// Answers one replica-append: decoded, checked against the metadata,
/// then written by the ReplicationServer. Every refusal is typed.
pub(crate) async fn serve_replica_append(
    shared: &Arc<Shared>,
    body: Bytes,
) -> ReplicaAppendResponse {
    let request = match ReplicaAppendRequest::decode(body) {
        Ok(request) => request,
        Err(e) => {
            return ReplicaAppendResponse::refused(
                ReplicaRefusal::InvalidRequest,
                0,
                e.to_string(),
            );
        }
    };
    let segment = SegmentId(request.segment);
    match admit(shared, &request).await {
        Ok(Admitted {
            repair_to,
            seal_at_end,
        }) => write(shared, segment, request, repair_to, seal_at_end).await,
        Err(refused) => refused,
    }
}

/// How an admitted append is written: up to `repair_to` when it is a
/// repair, sealed there when `seal_at_end` (only a seal the metadata
/// records is placed on the copy when a repair reaches it; a failover's
/// repair comes before the record).
struct Admitted {
    repair_to: Option<u64>,
    seal_at_end: bool,
}

/// What this broker's metadata says of its copy of the append's segment:
/// whether it is a follower copy, the segment's state and writer epoch.
fn held_copy(shared: &Shared, request: &ReplicaAppendRequest) -> Option<(bool, SegmentState, u64)> {
    let me = NodeId(shared.config.node_id);
    let segment = SegmentId(request.segment);
    shared.plane().ok().and_then(|plane| {
        read_owner(plane.as_ref(), &request.topic, |state| {
            state.segment(segment).map(|s| {
                (
                    s.replicas.iter().skip(1).any(|n| *n == me),
                    s.state,
                    s.epoch,
                )
            })
        })
    })
}

/// The metadata check: whether this broker takes the append, and how.
async fn admit(
    shared: &Arc<Shared>,
    request: &ReplicaAppendRequest,
) -> Result<Admitted, ReplicaAppendResponse> {
    let me = NodeId(shared.config.node_id);
    let segment = SegmentId(request.segment);
    let refuse = |refusal, message: String| ReplicaAppendResponse::refused(refusal, 0, message);
    let mut seal_at_end = true;
    let repair_to = match held_copy(shared, request) {
        // A writer epoch older than the segment's: a deposed or misrouted
        // writer. The metadata is the persistent record of the epoch, so a
        // restart of this broker does not forget it.
        Some((true, _, epoch)) if request.epoch < epoch => {
            return Err(refuse(
                ReplicaRefusal::StaleEpoch,
                format!(
                    "segment {segment} is written at epoch {epoch}; this append carries epoch {}",
                    request.epoch
                ),
            ));
        }
        Some((true, SegmentState::Active, epoch)) if request.epoch > epoch => {
            // An epoch this broker's metadata does not know yet: retriable.
            return Err(refuse(
                ReplicaRefusal::UnknownCopy,
                format!(
                    "segment {segment} is at epoch {epoch} here; this append carries the newer epoch {}",
                    request.epoch
                ),
            ));
        }
        // A coordinator's recovery, before the seal is recorded: only into
        // a copy fenced by an order at least as new (never mixed with a
        // live primary's stream), and never past the length it decided.
        Some((true, SegmentState::Active, _)) => match request.repair {
            Some(repair) => {
                repairable(shared, segment, repair).await?;
                seal_at_end = false;
                Some(repair.to)
            }
            None => None,
        },
        // A sealed segment's copy takes frames only up to its seal: the
        // catch-up of a copy left short (the fence stops appends, not repair).
        Some((true, SegmentState::Sealed { seal, .. }, _)) => {
            if let Some(repair) = request.repair
                && repair.to != seal.length
            {
                return Err(refuse(
                    ReplicaRefusal::Fenced,
                    format!(
                        "segment {segment} is recorded sealed at {}; this repair goes to {}",
                        seal.length, repair.to
                    ),
                ));
            }
            Some(seal.length)
        }
        // A healer building a new copy of a sealed segment here, before
        // `ReplaceReplica` or `AddReplica` names this broker: frames up to
        // the seal only.
        Some((false, SegmentState::Sealed { seal, .. }, _))
            if request.repair.is_some_and(|r| r.to == seal.length) =>
        {
            // A broker at its free-space line takes no new copy, not even
            // the empty file a heal's first request would open (ADR 0127).
            if shared.data.space.is_full() {
                return Err(refuse(
                    ReplicaRefusal::Busy,
                    format!(
                        "broker {}'s data volume is at its free-space line; it takes no new copy of segment {segment}",
                        me.0
                    ),
                ));
            }
            Some(seal.length)
        }
        Some((false, _, _)) | None => {
            return Err(refuse(
                ReplicaRefusal::UnknownCopy,
                format!(
                    "broker {} holds no follower copy of segment {segment} of {}",
                    me.0, request.topic
                ),
            ));
        }
    };
    Ok(Admitted {
        repair_to,
        seal_at_end,
    })
}

/// Hands an admitted append to the ReplicationServer and waits for its
/// answer, each within `replica_ack_timeout_ms`; `busy` when either runs
/// out, so the primary retries.
async fn write(
    shared: &Arc<Shared>,
    segment: SegmentId,
    request: ReplicaAppendRequest,
    repair_to: Option<u64>,
    seal_at_end: bool,
) -> ReplicaAppendResponse {
    let Some(server) = shared.data.replication.server.read().clone() else {
        return ReplicaAppendResponse::refused(
            ReplicaRefusal::Busy,
            0,
            "the replication server is restarting",
        );
    };
    let timeout = Duration::from_millis(shared.config.replica_ack_timeout_ms);
    let (reply, answer) = tokio::sync::oneshot::channel();
    let sent = tokio::time::timeout(
        timeout,
        server.send(|permit| ReplicationMsg::Append {
            permit,
            request,
            repair_to,
            seal_at_end,
            reply,
        }),
    )
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        return ReplicaAppendResponse::refused(
            ReplicaRefusal::Busy,
            0,
            "the replication server is busy",
        );
    }
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(answer)) => with_durable_bytes(shared, segment, answer),
        _ => ReplicaAppendResponse::refused(
            ReplicaRefusal::Busy,
            0,
            "the copy did not answer in time",
        ),
    }
}

/// A written append's answer also tells the copy's bytes, from which the
/// primary reports its lag in bytes (ADR 0098). With appends pipelined
/// (ADR 0099) they may include later appends not yet durable: the lag in
/// bytes is a gauge, never an input to the committed end.
fn with_durable_bytes(
    shared: &Shared,
    segment: SegmentId,
    mut answer: ReplicaAppendResponse,
) -> ReplicaAppendResponse {
    if answer.refused.is_none() {
        answer.durable_bytes = shared
            .store
            .info(malachi_storage::SegmentId(segment.0))
            .ok()
            .map(|info| info.byte_size);
    }
    answer
}

/// Whether a recovery's repair may write into this broker's copy of an
/// active segment: the copy is fenced, by an order no newer than the
/// repair's (a deposed coordinator's repair is refused once its successor
/// fenced the copy).
async fn repairable(
    shared: &Arc<Shared>,
    segment: SegmentId,
    repair: malachi_wire::replication::RepairOrder,
) -> Result<(), ReplicaAppendResponse> {
    use malachi_storage::StorageError;
    let store = Arc::clone(&shared.store);
    let id = malachi_storage::SegmentId(segment.0);
    let order = super::order_epoch::store_order(repair.order);
    let checked = tokio::task::spawn_blocking(move || {
        if let Err(StorageError::NotOpen { .. }) = store.info(id) {
            store.open(id)?;
        }
        let info = store.info(id)?;
        let seen = store.order_epoch(id)?;
        Ok::<_, StorageError>((info.fenced, info.assigned, seen))
    })
    .await;
    match checked {
        Ok(Ok((true, _, seen))) if !order.is_stale_against(seen) => Ok(()),
        Ok(Ok((true, end, seen))) => Err(ReplicaAppendResponse::refused(
            ReplicaRefusal::StaleEpoch,
            end,
            format!("segment {segment} took a newer order ({seen:?}) than this repair's"),
        )),
        Ok(Ok((false, end, _))) => Err(ReplicaAppendResponse::refused(
            ReplicaRefusal::Fenced,
            end,
            format!("segment {segment}: a repair needs a fenced copy"),
        )),
        Ok(Err(e)) => Err(ReplicaAppendResponse::refused(
            ReplicaRefusal::Failed,
            0,
            e.to_string(),
        )),
        Err(e) => Err(ReplicaAppendResponse::refused(
            ReplicaRefusal::Failed,
            0,
            format!("the store task failed: {e}"),
        )),
    }
}
