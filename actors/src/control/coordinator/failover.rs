//! Recording a failover (issue 19, ADR 0106): the failover actor
//! (`maintenance/failover`) has sealed a segment whose primary is gone on
//! its complete copies; the coordinator records that seal and opens the
//! successor on live brokers, led by one of those copies.

use std::collections::BTreeSet;

use malachi_core::model::{Command, ModelError, NodeId, Outcome, SealRecord, SegmentId};
use malachi_core::placement::{Candidate, choose_replicas};
use tracing::{debug, info};

use super::lifecycle::start_segment;
use super::place::placed;
use super::{CoordError, CoordinatorState};
use crate::control::metadata::read_owner;
use crate::control::segment_stop::segment_name;
use malachi_core::plan::heal::wanted_copies;

impl CoordinatorState {
    /// Records a failover's seal (issue 19, ADR 0106): `segment`, whose
    /// primary is gone, sealed at `seal`, which `complete` copies hold, and
    /// its successor opened on live brokers outside `failed`, its primary
    /// one of the complete copies (this broker if it is one: the new
    /// primary rebuilds its producer table from its own copy of the sealed
    /// segment). A segment already rolled at this very seal is done; at
    /// another, it is an error. A sealed topic's segment is only sealed.
    pub(crate) async fn fail_over(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
        complete: &[u64],
        failed: &BTreeSet<u64>,
    ) -> Result<Option<SegmentId>, CoordError> {
        let plane = self.shared.plane()?;
        let copies = read_owner(plane.as_ref(), topic, |s| {
            s.segment(segment).map(|_| wanted_copies(s, topic))
        })
        .ok_or(CoordError::UnknownSegment { segment })?;
        let next_replicas = self.failover_replicas(topic, segment, copies, complete, failed)?;
        let proposed = plane
            .propose(Command::RollSegment {
                topic: topic.to_string(),
                segment,
                seal,
                next_replicas: next_replicas.clone(),
                at_ms: self.shared.clock.now_ms(),
            })
            .await?;
        let next = match proposed {
            Ok(Outcome::SegmentRolled { next, .. }) => next,
            Err(ModelError::AlreadyRolled { successor, .. }) => {
                self.same_seal(topic, segment, seal)?;
                successor
            }
            // No successor where the topic is sealed or the range was split
            // or merged: the segment is sealed, and that is all.
            Err(ModelError::TopicSealed { .. } | ModelError::RangeNotActive { .. }) => {
                match plane
                    .propose(Command::SealSegment {
                        topic: topic.to_string(),
                        segment,
                        seal,
                        at_ms: self.shared.clock.now_ms(),
                    })
                    .await?
                {
                    Ok(_) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(other) => return Err(CoordError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(e.into()),
        };
        self.after_fail_over(topic, segment, next).await?;
        info!(%topic, sealed = segment.0, next = next.0, length = seal.length, replicas = ?next_replicas, "segment failed over");
        Ok(Some(next))
    }

    /// The successor's replica set after a failover: as many copies as the
    /// topic wants (as the live brokers outside `failed` allow), led by a
    /// complete copy (this broker if it is one).
    pub(super) fn failover_replicas(
        &self,
        topic: &str,
        segment: SegmentId,
        copies: usize,
        complete: &[u64],
        failed: &BTreeSet<u64>,
    ) -> Result<Vec<NodeId>, CoordError> {
        // A complete copy whose cluster port this broker reaches leads, if
        // there is one (ADR 0155); else any complete copy, as before: its
        // fence was answered, so it was reached, and a stalled failover
        // would keep the range from taking writes at all.
        let me = self.node().0;
        let avoided: BTreeSet<u64> = failed
            .union(&self.shared.links.unreachable())
            .copied()
            .collect();
        let Some(primary) = crate::data::recovery::successor_primary(complete, &avoided, me)
            .or_else(|| crate::data::recovery::successor_primary(complete, failed, me))
        else {
            return Err(CoordError::Unexpected(format!(
                "segment {segment} has no complete copy to lead its successor"
            )));
        };
        let candidates: Vec<Candidate> = self
            .candidates()
            .into_iter()
            .filter(|c| !failed.contains(&c.node))
            .collect();
        let factor = copies.clamp(1, candidates.len().max(1));
        let seed = segment.0.wrapping_add(1);
        let constraints = self.constraints(self.policy_of(topic).as_deref());
        if constraints.is_empty() {
            let chosen = choose_replicas(primary, &candidates, factor, seed)?;
            Ok(placed(chosen, factor))
        } else {
            // The new primary holds a complete copy: it stays, first.
            self.constrained(&candidates, &[primary], &[], factor, seed, &constraints)
        }
    }

    /// After a failover's roll: a writer of the sealed segment here stops,
    /// and the successor's writer starts if it is led here.
    async fn after_fail_over(
        &self,
        topic: &str,
        segment: SegmentId,
        next: SegmentId,
    ) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let (leads, range) = read_owner(plane.as_ref(), topic, |s| {
            (
                s.segment(next).and_then(|s| s.replicas.first().copied()),
                s.segment(segment).map(|s| s.range),
            )
        });
        // A writer of the sealed segment here (its primary was alive after
        // all, or a follower was gone) stops: its segment is sealed.
        if self.shared.segment(segment).is_some()
            && let (Some(range), Some(storage)) =
                (range, self.shared.data.supervisor.read().clone())
        {
            let name = segment_name(topic, range, segment);
            tokio::spawn(async move {
                if let Err(e) = storage.terminate_child(&name).await {
                    debug!(segment = %name, error = %e, "the sealed segment's writer already stopped");
                }
            });
        }
        if leads == Some(self.node()) {
            start_segment(&self.shared, topic, next).await?;
        }
        Ok(())
    }
}
