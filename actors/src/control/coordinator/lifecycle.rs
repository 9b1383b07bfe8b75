//! Segment actors' lives as the coordinator sees them: started on a
//! segment's primary once the metadata places it there, each given a
//! [`CoordinatorRoller`] to ask for its roll and report a refusal through.
//! Stopping them is `segment_stop.rs`.

use std::sync::Arc;

use malachi_core::model::{MetadataState, ModelError, NodeId, RangeId, SealRecord, SegmentId};
use malachi_supervision::{ChildSpec, Restart, SupervisionError};
use tracing::debug;

use super::ancestry::ancestry;
use super::{CoordError, CoordinatorMsg};
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::segment_stop::segment_name;
use crate::control::shared::Shared;
use crate::data::ancestors::Ancestry;
use crate::data::segment::{RollError, Roller, SegmentActor, SegmentArgs};

/// How long starting a segment waits for this broker's replica to apply the
/// command that created the segment (proposed through another broker).
pub(super) const LOCAL_APPLY_WAIT_MS: u64 = 2_000;

/// Starts the actor of an active segment under `storage` (a no-op if it runs).
pub(crate) async fn start_segment(
    shared: &Arc<Shared>,
    topic: &str,
    segment: SegmentId,
) -> Result<(), CoordError> {
    start_segment_within(shared, topic, segment, LOCAL_APPLY_WAIT_MS).await
}

/// `start_segment`, waiting at most `apply_wait_ms` for the local replica to
/// know the segment.
pub(super) async fn start_segment_within(
    shared: &Arc<Shared>,
    topic: &str,
    segment: SegmentId,
    apply_wait_ms: u64,
) -> Result<(), CoordError> {
    let plane = shared.plane()?;
    let found = placed_segment(plane.as_ref(), topic, segment, apply_wait_ms).await;
    let Some((range, start_offset, created_at_ms, ancestry, replicas, epoch)) = found else {
        return Err(CoordError::UnknownSegment { segment });
    };
    // The writer runs on the segment's primary only (its reconciliation
    // starts it there): a successor or a new topic placed on another
    // broker (this one full or leaving) gets none here.
    if replicas.first().map(|n| n.0) != Some(shared.config.node_id) {
        debug!(%topic, segment = segment.0, primary = ?replicas.first(), "the segment is led elsewhere; no writer here");
        return Ok(());
    }
    let Some(storage) = shared.data.supervisor.read().clone() else {
        return Err(CoordError::Supervision(SupervisionError::NotRunning));
    };
    let args = SegmentArgs {
        storage: Arc::clone(&shared.data),
        roller: Arc::new(CoordinatorRoller {
            shared: Arc::clone(shared),
        }),
        topic: topic.to_string(),
        range,
        segment,
        start_offset,
        created_at_ms,
        ancestry,
        replicas,
        epoch,
        holders: Arc::new(crate::control::replica_order::OrderClient {
            shared: Arc::clone(shared),
        }),
    };
    let spec = ChildSpec::worker(
        segment_name(topic, range, segment),
        || SegmentActor,
        move || args.clone(),
    )
    // Transient: a segment actor stopped after its roll stays stopped; one
    // that crashed is restarted and reopens its copy.
    .restart(Restart::Transient);
    match storage.start_child(spec).await {
        Ok(_) | Err(SupervisionError::DuplicateChild { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What a segment's actor starts from: its range, start offset, creation
/// time, ancestry, replicas and writer epoch.
type Placed = (RangeId, u64, u64, Ancestry, Vec<NodeId>, u64);

/// What this broker's replica records of `segment`, waiting at most
/// `apply_wait_ms` for it to apply the command that created it.
async fn placed_segment(
    plane: &dyn MetadataPlane,
    topic: &str,
    segment: SegmentId,
    apply_wait_ms: u64,
) -> Option<Placed> {
    let lookup = || {
        read_owner(plane, topic, |state: &MetadataState| {
            state.segment(segment).map(|s| {
                (
                    s.range,
                    s.start_offset,
                    s.created_at_ms,
                    ancestry(state, s.range, segment),
                    s.replicas.clone(),
                    s.epoch,
                )
            })
        })
    };
    // A command proposed through another broker's leader is applied here a
    // moment later: wait (bounded) for this replica to catch up.
    let mut applied = plane.subscribe();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(apply_wait_ms);
    let mut found = lookup();
    while found.is_none()
        && tokio::time::timeout_at(deadline, applied.changed())
            .await
            .is_ok_and(|changed| changed.is_ok())
    {
        found = lookup();
    }
    found
}

/// The [`Roller`] the control plane gives each segment actor: a roll goes
/// to the coordinator manager, which hands it to the coordinator of the
/// topic's vnode, within `produce_timeout_ms`.
#[derive(Debug)]
pub(crate) struct CoordinatorRoller {
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl Roller for CoordinatorRoller {
    async fn roll(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<SegmentId, RollError> {
        let Some(coordinator) = self.shared.actors.manager().get() else {
            return Err(RollError::Transient(
                "the coordinator manager is not running".into(),
            ));
        };
        let answer = ractor::call_t!(
            coordinator,
            |reply| CoordinatorMsg::Roll {
                topic: topic.to_string(),
                segment,
                seal,
                reply
            },
            self.shared.config.produce_timeout_ms
        );
        match answer {
            Ok(Ok(next)) => Ok(next),
            Ok(Err(e)) => Err(roll_refusal(&e)),
            Err(e) => Err(RollError::Transient(format!("roll request failed: {e}"))),
        }
    }

    fn settle(&self, topic: &str, _range: RangeId, segment: SegmentId) {
        let first = self
            .shared
            .memory
            .refused
            .lock()
            .insert(segment, topic.to_string())
            .is_none();
        // Reconcile settles it; it runs on every applied change and on the
        // slow timer anyway, so only the first report asks for a pass now.
        if first && let Some(manager) = self.shared.actors.manager().get() {
            let _ = manager.send_message(CoordinatorMsg::Reconcile);
        }
    }
}

/// Whether a coordinator's refusal of a roll is for good: the one place a
/// `CoordError` becomes a [`RollError`] (chaos finding F7).
///
/// For good: the metadata has the segment sealed without this writer
/// (`RangeNotActive`: its range was split or merged away, which seals its
/// last segment; `AlreadySealed`: a failover sealed it at another length),
/// its topic sealed, or the segment or its topic gone. Anything else may
/// pass on a later attempt: a timeout, a missing quorum, a ring being
/// re-read (`is_misrouted`), a lease, and `UnknownSegment`, which the roll
/// answers when this broker's replica has not applied what the leader
/// committed yet (a failover's seal, the successor), so the writer of a
/// segment sealed elsewhere while this broker was cut off is settled by
/// `reconcile` once its replica catches up.
pub(crate) fn roll_refusal(e: &CoordError) -> RollError {
    let reason = format!("roll refused: {e}");
    match e {
        CoordError::Model(
            ModelError::RangeNotActive { .. }
            | ModelError::AlreadySealed { .. }
            | ModelError::AlreadyRolled { .. }
            | ModelError::TopicSealed { .. }
            | ModelError::NoSuchTopic { .. }
            | ModelError::NoSuchRange { .. }
            | ModelError::NoSuchSegment { .. },
        ) => RollError::Permanent(reason),
        _ => RollError::Transient(reason),
    }
}

#[cfg(test)]
mod tests {
    use malachi_core::model::SealRecord;

    use super::*;

    #[test]
    fn only_refusals_the_metadata_will_repeat_are_for_good() {
        let segment = SegmentId(4);
        let permanent = [
            ModelError::AlreadySealed {
                segment,
                recorded: SealRecord {
                    length: 1,
                    bytes: 1,
                },
            },
            ModelError::NoSuchTopic { topic: "t".into() },
        ];
        for e in permanent {
            assert!(matches!(
                roll_refusal(&CoordError::Model(e)),
                RollError::Permanent(_)
            ));
        }
        // A lagging replica, a timeout, a stale ring: asked again.
        let transient = [
            CoordError::UnknownSegment { segment },
            CoordError::Unexpected("timeout".into()),
            CoordError::Model(ModelError::WrongVnode {
                topic: "t".into(),
                arc: malachi_core::model::RingArc::FULL,
            }),
        ];
        for e in transient {
            assert!(matches!(roll_refusal(&e), RollError::Transient(_)), "{e}");
        }
    }
}
