//! Moving where a range is written (issue 38, ADR 0144): the range's
//! active segment is frozen here, at its primary, and rolled to a
//! successor another broker leads. Seal-first, as a split: no record is
//! copied, the successor starts after the seal, and producers follow the
//! redirect the old primary answers with. The balancer moves primaries
//! this way, and a merge of buddies written by two brokers first moves
//! one half to the other's primary.

use malachi_core::model::{Command, ModelError, NodeId, Outcome, RangeId, SegmentId};
use tracing::info;

use super::reshape::RESHAPE_ATTEMPTS_MAX;
use super::{CoordError, CoordinatorState};

impl CoordinatorState {
    /// Moves the writing of `range` to `target`, as [`Self::move_once`];
    /// a move that lost a race with a roll is tried again on the
    /// successor, at most `RESHAPE_ATTEMPTS_MAX` times in all. Returns the
    /// segment `target` now writes.
    pub(super) async fn move_primary(
        &self,
        topic: String,
        range: RangeId,
        target: NodeId,
    ) -> Result<SegmentId, CoordError> {
        let mut attempt = 1;
        loop {
            match self.move_once(&topic, range, target).await {
                Err(CoordError::Model(ModelError::AlreadyRolled { successor, .. }))
                    if attempt < RESHAPE_ATTEMPTS_MAX =>
                {
                    self.wait_known(&topic, successor).await?;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Freezes the active segment of `range` (written here) and records a
    /// roll whose successor `target` leads. The proposal names the frozen
    /// segment, so a roll that raced it is refused (`AlreadyRolled`), not
    /// sealed twice. A move to where the range is written already does
    /// nothing.
    async fn move_once(
        &self,
        topic: &str,
        range: RangeId,
        target: NodeId,
    ) -> Result<SegmentId, CoordError> {
        let segment = self.active_segment(topic, range)?;
        self.written_here(topic, range, segment)?;
        if target == self.node() {
            return Ok(segment);
        }
        if !self.candidates().iter().any(|c| c.node == target.0) {
            return Err(CoordError::MoveTarget { target });
        }
        let copies = self.copies(topic, segment)?;
        let next_replicas =
            self.successor_replicas(topic, target, copies, segment.0.wrapping_add(1))?;
        // A storage policy's constraints may rank the target lower: then
        // the range cannot move there.
        if next_replicas.first() != Some(&target) {
            return Err(CoordError::MoveTarget { target });
        }
        let seal = self.freeze(segment).await?;
        let plane = self.shared.plane()?;
        let proposed = plane
            .propose(Command::RollSegment {
                topic: topic.to_owned(),
                segment,
                seal,
                next_replicas,
                at_ms: self.shared.clock.now_ms(),
            })
            .await;
        let next = match proposed {
            Ok(Ok(Outcome::SegmentRolled { next, .. })) => next,
            failed => {
                self.thaw(segment);
                return Err(match failed {
                    Ok(Err(e)) => e.into(),
                    Err(e) => e.into(),
                    Ok(Ok(other)) => CoordError::Unexpected(format!("{other:?}")),
                });
            }
        };
        self.replace_segments(topic, &[(range, segment, seal)], &[next])
            .await?;
        info!(%topic, range = range.0, sealed = segment.0, next = next.0, to = target.0, length = seal.length, "range moved to another primary");
        Ok(next)
    }

    /// Whether a successor of `topic` may be led here: its placement
    /// (constraints included) puts this broker first.
    fn may_lead(&self, topic: &str) -> bool {
        self.successor_replicas(topic, self.node(), 1, 0)
            .is_ok_and(|replicas| replicas.first() == Some(&self.node()))
    }

    /// A merge of buddies two brokers write, asked of one of them: its half
    /// moves to the other's primary, and the request is sent there
    /// (`WrittenElsewhere`), where both halves are then written. Asked of
    /// neither, the request is sent to the lower half's primary.
    pub(super) async fn gather_halves(
        &self,
        topic: &str,
        (lower, lower_primary): (RangeId, NodeId),
        (upper, upper_primary): (RangeId, NodeId),
    ) -> CoordError {
        debug_assert_ne!(lower_primary, upper_primary, "only split halves gather");
        let (here, there, to) = if lower_primary == self.node() {
            (lower, upper, upper_primary)
        } else if upper_primary == self.node() {
            (upper, lower, lower_primary)
        } else {
            return CoordError::WrittenElsewhere {
                topic: topic.to_owned(),
                range: lower,
                primary: lower_primary,
            };
        };
        match self.move_primary(topic.to_owned(), here, to).await {
            Ok(_) => {}
            // The topic's placement constraints keep this half off the
            // other's primary: if the other half may come here, its
            // primary does the move instead (the request goes there).
            Err(CoordError::MoveTarget { target }) => {
                // The other half's writer takes no copies (down or
                // unreachable, ADR 0155): sending the client there would
                // not complete the merge either.
                if !self.candidates().iter().any(|c| c.node == to.0) {
                    return CoordError::BuddyWriterDown {
                        topic: topic.to_owned(),
                        range: there,
                        primary: to,
                    };
                }
                if !self.may_lead(topic) {
                    return CoordError::MoveTarget { target };
                }
                return CoordError::WrittenElsewhere {
                    topic: topic.to_owned(),
                    range: there,
                    primary: to,
                };
            }
            Err(e) => return e,
        }
        info!(%topic, moved = here.0, buddy = there.0, to = to.0, "merge: both halves now written by one broker");
        CoordError::WrittenElsewhere {
            topic: topic.to_owned(),
            range: there,
            primary: to,
        }
    }
}
