//! Reshaping a range: a roll (seal at the length the segment actor
//! reports, open the next), a split into two halves, a merge of two
//! buddies. A split or merge freezes the active segments first and names
//! them in its proposal, so a failover that rolled one meanwhile makes the
//! model refuse rather than seal the successor at the frozen seal.

use std::sync::Arc;

use malachi_core::model::{
    Band, Command, MetadataState, ModelError, NodeId, Outcome, Range, RangeId, SealRecord,
    SegmentId,
};
use tracing::{info, warn};

use super::lifecycle::{LOCAL_APPLY_WAIT_MS, start_segment};
use super::{CoordError, CoordinatorState};
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::segment_stop::{segment_name, stop_segment_actor};
use crate::data::segment::{AppendError, SegmentMsg};
use malachi_core::plan::heal::wanted_copies;

/// How many times a split or merge freezes and proposes again when the
/// segment it froze was rolled (a failover) before its proposal applied.
pub(super) const RESHAPE_ATTEMPTS_MAX: u32 = 3;

/// A split's or merge's `segment` fields, written only while
/// `Feature::SplitMergeSegments` is active (ADR 0134); left out (`None`)
/// otherwise, as brokers wrote them before the fields existed.
fn gated(plane: &dyn MetadataPlane, segment: SegmentId) -> Option<SegmentId> {
    match plane.require(malachi_core::model::Feature::SplitMergeSegments) {
        Ok(()) => Some(segment),
        Err(inactive) => {
            warn!(%segment, %inactive, "split or merge proposed without its segment fields");
            None
        }
    }
}

impl CoordinatorState {
    pub(super) async fn roll(
        &self,
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<SegmentId, CoordError> {
        let plane = self.shared.plane()?;
        let (range, copies) = read_owner(plane.as_ref(), &topic, |s| {
            s.segment(segment)
                .map(|found| (found.range, wanted_copies(s, &topic)))
        })
        .unzip();
        let next_replicas = self.successor_replicas(
            &topic,
            self.node(),
            copies.unwrap_or(1),
            segment.0.wrapping_add(1),
        )?;
        let next = match plane
            .propose(Command::RollSegment {
                topic: topic.clone(),
                segment,
                seal,
                next_replicas,
                at_ms: self.shared.clock.now_ms(),
            })
            .await?
        {
            Ok(Outcome::SegmentRolled { next, .. }) => next,
            // A repeated roll (the segment actor restarted mid-roll) is done
            // already, but only if it recorded this very seal: a failover
            // may have sealed the segment elsewhere, at another length, and
            // this copy must then not be sealed at its own.
            Err(ModelError::AlreadyRolled { successor, .. }) => {
                self.same_seal(&topic, segment, seal)?;
                successor
            }
            Ok(other) => return Err(CoordError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(e.into()),
        };
        start_segment(&self.shared, &topic, next).await?;
        if let (Some(range), Some(storage)) = (range, self.shared.data.supervisor.read().clone()) {
            let name = segment_name(&topic, range, segment);
            // Stopping waits for the old actor; do it off the coordinator's
            // mailbox so other metadata changes are not held up.
            tokio::spawn(async move {
                if let Err(e) = storage.terminate_child(&name).await {
                    warn!(segment = %name, error = %e, "cannot stop a rolled segment actor");
                }
            });
        }
        info!(topic = %topic, sealed = segment.0, next = next.0, length = seal.length, "segment rolled");
        Ok(next)
    }

    /// Waits (at most `LOCAL_APPLY_WAIT_MS`) until this broker's replica
    /// knows `segment`: after a split or merge lost a race with a roll
    /// another broker proposed, so its next attempt freezes the successor.
    pub(super) async fn wait_known(
        &self,
        topic: &str,
        segment: SegmentId,
    ) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let known = || read_owner(plane.as_ref(), topic, |s| s.segment(segment).is_some());
        let mut applied = plane.subscribe();
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(LOCAL_APPLY_WAIT_MS);
        while !known() {
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(CoordError::UnknownSegment { segment }),
            }
        }
        Ok(())
    }

    /// Fails if `segment` is recorded sealed at anything but `seal`.
    pub(super) fn same_seal(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let recorded = read_owner(plane.as_ref(), topic, |s| {
            s.segment(segment).and_then(|s| s.seal())
        });
        match recorded {
            Some(recorded) if recorded == seal => Ok(()),
            Some(recorded) => Err(CoordError::Model(ModelError::AlreadySealed {
                segment,
                recorded,
            })),
            None => Err(CoordError::UnknownSegment { segment }),
        }
    }

    /// Fences the active segment of `range` and returns its durable seal.
    ///
    /// A freeze that fails leaves a fenced copy behind, which takes no more
    /// appends: the segment is thawed here, so its actor rolls it (a seal it
    /// finishes once a quorum holds its records) and the range goes on in a
    /// new segment, never frozen for good (`replication.md`: fence only as
    /// the first step of a seal you will finish).
    pub(super) async fn freeze(&self, segment: SegmentId) -> Result<SealRecord, CoordError> {
        let freeze_err = |reason: String| CoordError::Freeze { segment, reason };
        let Some(handle) = self.shared.segment(segment) else {
            return Err(freeze_err("its actor is not running".into()));
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        handle
            .actor
            .actor()
            .send_message(SegmentMsg::Freeze { reply })
            .map_err(|e| freeze_err(e.to_string()))?;
        // Past the quorum wait inside the freeze, so a missing quorum comes
        // back as `no_quorum`, not as a timeout.
        let bound = std::time::Duration::from_millis(
            self.shared
                .config
                .produce_timeout_ms
                .max(self.shared.config.replica_ack_timeout_ms.saturating_mul(2)),
        );
        let failed = match tokio::time::timeout(bound, answer).await {
            Ok(Ok(Ok(seal))) => return Ok(seal),
            Ok(Ok(Err(AppendError::NoQuorum(reason)))) => {
                CoordError::FreezeNoQuorum { segment, reason }
            }
            Ok(Ok(Err(e))) => freeze_err(e.to_string()),
            Ok(Err(_)) => freeze_err("its actor stopped".into()),
            Err(_) => freeze_err("no answer in time".into()),
        };
        warn!(segment = segment.0, error = %failed, "a freeze failed; the segment rolls instead");
        self.thaw(segment);
        Err(failed)
    }

    /// Lets a frozen segment whose split or merge failed roll on its own.
    pub(super) fn thaw(&self, segment: SegmentId) {
        if let Some(handle) = self.shared.segment(segment) {
            // An actor that stopped meanwhile has nothing left to thaw: its
            // successor starts unfrozen.
            let _ = handle.actor.actor().send_message(SegmentMsg::Thaw);
        }
    }

    /// How many copies `segment`'s successors get: as many as the topic's
    /// segments have at most (`wanted_copies`).
    pub(super) fn copies(&self, topic: &str, segment: SegmentId) -> Result<usize, CoordError> {
        let plane = self.shared.plane()?;
        read_owner(plane.as_ref(), topic, |state| {
            state.segment(segment).map(|_| wanted_copies(state, topic))
        })
        .ok_or(CoordError::UnknownSegment { segment })
    }

    /// The broker that writes `segment` (the first of its replicas), from
    /// this broker's replica of the metadata.
    fn primary_of(&self, topic: &str, segment: SegmentId) -> Result<NodeId, CoordError> {
        let plane = self.shared.plane()?;
        read_owner(plane.as_ref(), topic, |state| {
            state
                .segment(segment)
                .and_then(|s| s.replicas.first().copied())
        })
        .ok_or(CoordError::UnknownSegment { segment })
    }

    /// Refuses a split or merge of `range` here when another broker writes
    /// its active `segment`: only that broker's writer can freeze it, and a
    /// `busy` answered here would be retried here until the deadline (ADR
    /// 0141). The client port turns the refusal into a redirect.
    pub(super) fn written_here(
        &self,
        topic: &str,
        range: RangeId,
        segment: SegmentId,
    ) -> Result<(), CoordError> {
        let primary = self.primary_of(topic, segment)?;
        if primary == self.node() {
            return Ok(());
        }
        Err(CoordError::WrittenElsewhere {
            topic: topic.to_owned(),
            range,
            primary,
        })
    }

    pub(super) fn active_segment(
        &self,
        topic: &str,
        range: RangeId,
    ) -> Result<SegmentId, CoordError> {
        let plane = self.shared.plane()?;
        read_owner(plane.as_ref(), topic, |state| {
            active_range(state, topic, range)?
                .last_segment()
                .ok_or_else(|| CoordError::Unexpected(format!("range {range} has no segment")))
        })
    }

    /// After a split or merge: seal the old copies on disk, start the new
    /// segments' actors, stop the old ones.
    pub(super) async fn replace_segments(
        &self,
        topic: &str,
        old: &[(RangeId, SegmentId, SealRecord)],
        new: &[SegmentId],
    ) -> Result<(), CoordError> {
        for &segment in new {
            start_segment(&self.shared, topic, segment).await?;
        }
        let storage = self.shared.data.supervisor.read().clone();
        for &(range, segment, seal) in old {
            let store = Arc::clone(&self.shared.store);
            let id = malachi_storage::SegmentId(segment.0);
            match tokio::task::spawn_blocking(move || store.seal(id, seal.length)).await {
                Ok(Ok(_)) => {}
                // The metadata's seal still clamps reads to `seal.length`;
                // only the copy on disk lacks its marker (recovery reads the
                // length from the metadata again).
                Ok(Err(e)) if e.is_no_space() => info!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "no room for the seal marker; metadata still clamps reads"
                ),
                Ok(Err(e)) => warn!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "cannot write the seal marker; metadata still clamps reads"
                ),
                Err(e) => warn!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "the seal marker task failed; metadata still clamps reads"
                ),
            }
            if let Some(storage) = storage.clone() {
                let name = segment_name(topic, range, segment);
                tokio::spawn(async move { stop_segment_actor(&storage, &name).await });
            }
        }
        Ok(())
    }

    /// Splits `range`: freezes its active segment and records the split
    /// with that segment's seal. The proposal names the frozen segment, so
    /// if a failover rolled it meanwhile the model refuses the split
    /// (`AlreadyRolled`) rather than seal the successor at the frozen
    /// segment's seal (chaos finding F6); the split is then tried again on
    /// the successor, at most `RESHAPE_ATTEMPTS_MAX` times in all.
    pub(super) async fn split(
        &self,
        topic: String,
        range: RangeId,
    ) -> Result<(RangeId, RangeId), CoordError> {
        let mut attempt = 1;
        loop {
            match self.split_once(&topic, range).await {
                Err(CoordError::Model(ModelError::AlreadyRolled { segment, successor }))
                    if attempt < RESHAPE_ATTEMPTS_MAX =>
                {
                    info!(%topic, range = range.0, segment = segment.0, successor = successor.0, attempt, "the frozen segment was rolled under the split; splitting again");
                    self.wait_known(&topic, successor).await?;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub(super) async fn split_once(
        &self,
        topic: &str,
        range: RangeId,
    ) -> Result<(RangeId, RangeId), CoordError> {
        let topic = topic.to_string();
        let segment = self.active_segment(&topic, range)?;
        self.written_here(&topic, range, segment)?;
        let copies = self.copies(&topic, segment)?;
        // The lower child stays here; the upper goes to the least loaded
        // other broker, when there is one: a split moves work (ADR 0144).
        let lower_replicas = self.successor_replicas(&topic, self.node(), copies, segment.0 ^ 1)?;
        let elsewhere = self.primary_for(segment.0 ^ 2, &[self.node()]);
        let upper_replicas = self.successor_replicas(&topic, elsewhere, copies, segment.0 ^ 2)?;
        let seal = self.freeze(segment).await?;
        let plane = self.shared.plane()?;
        let proposed = plane
            .propose(Command::SplitRange {
                topic: topic.clone(),
                range,
                seal,
                lower_replicas,
                upper_replicas,
                at_ms: self.shared.clock.now_ms(),
                segment: gated(plane.as_ref(), segment),
            })
            .await;
        let outcome = match proposed {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                self.thaw(segment);
                return Err(e.into());
            }
            Err(e) => {
                self.thaw(segment);
                return Err(e.into());
            }
        };
        let Outcome::RangeSplit {
            lower,
            upper,
            lower_segment,
            upper_segment,
            ..
        } = outcome
        else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        // The children this replica knows already must tile the parent.
        let bands = read_owner(plane.as_ref(), &topic, |state| {
            Some((
                state.range(range)?.band,
                state.range(lower)?.band,
                state.range(upper)?.band,
            ))
        });
        if let Some((parent, lower_band, upper_band)) = bands {
            assert_tiles(parent, lower_band, upper_band);
        }
        self.replace_segments(
            &topic,
            &[(range, segment, seal)],
            &[lower_segment, upper_segment],
        )
        .await?;
        info!(topic = %topic, range = range.0, lower = lower.0, upper = upper.0, "range split");
        Ok((lower, upper))
    }

    /// Merges `range` with its buddy, as `split` does: the proposal names
    /// both frozen segments, and a merge that lost a race with a roll is
    /// tried again, at most `RESHAPE_ATTEMPTS_MAX` times in all.
    pub(super) async fn merge(
        &self,
        topic: String,
        range: RangeId,
    ) -> Result<(RangeId, RangeId, RangeId), CoordError> {
        let mut attempt = 1;
        loop {
            match self.merge_once(&topic, range).await {
                Err(CoordError::Model(ModelError::AlreadyRolled { segment, successor }))
                    if attempt < RESHAPE_ATTEMPTS_MAX =>
                {
                    info!(%topic, range = range.0, segment = segment.0, successor = successor.0, attempt, "a frozen segment was rolled under the merge; merging again");
                    self.wait_known(&topic, successor).await?;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub(super) async fn merge_once(
        &self,
        topic: &str,
        range: RangeId,
    ) -> Result<(RangeId, RangeId, RangeId), CoordError> {
        let topic = topic.to_string();
        let plane = self.shared.plane()?;
        let (lower, upper) = read_owner(plane.as_ref(), &topic, |state| {
            merge_pair(state, &topic, range)
        })?;
        let lower_segment = self.active_segment(&topic, lower)?;
        let upper_segment = self.active_segment(&topic, upper)?;
        let (lower_primary, upper_primary) = (
            self.primary_of(&topic, lower_segment)?,
            self.primary_of(&topic, upper_segment)?,
        );
        if lower_primary != upper_primary {
            return Err(self
                .gather_halves(&topic, (lower, lower_primary), (upper, upper_primary))
                .await);
        }
        self.written_here(&topic, lower, lower_segment)?;
        let copies = self
            .copies(&topic, lower_segment)?
            .max(self.copies(&topic, upper_segment)?);
        // The successor is placed as a new range is (ADR 0144): on the
        // least loaded live broker, which may be this one. Gathering the
        // halves here was only how the merge could freeze both.
        let seed = lower_segment.0 ^ upper_segment.0;
        let replicas =
            self.successor_replicas(&topic, self.primary_for(seed, &[]), copies, seed)?;
        // Both halves' writers must run here before either is frozen: a
        // freeze that cannot be finished rolls the half it froze, and a
        // merge retried against a buddy written elsewhere rolled the other
        // half once a retry, stalling its writes (the five-broker long run).
        for segment in [lower_segment, upper_segment] {
            if self.shared.segment(segment).is_none() {
                return Err(CoordError::Freeze {
                    segment,
                    reason: "its writer does not run on this broker".into(),
                });
            }
        }
        let lower_seal = self.freeze(lower_segment).await?;
        let upper_seal = match self.freeze(upper_segment).await {
            Ok(seal) => seal,
            Err(e) => {
                self.thaw(lower_segment);
                return Err(e);
            }
        };
        let proposed = plane
            .propose(Command::MergeRanges {
                topic: topic.clone(),
                lower,
                upper,
                lower_seal,
                upper_seal,
                replicas,
                at_ms: self.shared.clock.now_ms(),
                lower_segment: gated(plane.as_ref(), lower_segment),
                upper_segment: gated(plane.as_ref(), upper_segment),
            })
            .await;
        let outcome = match proposed {
            Ok(Ok(outcome)) => outcome,
            failed => {
                self.thaw(lower_segment);
                self.thaw(upper_segment);
                return Err(match failed {
                    Ok(Err(e)) => e.into(),
                    Err(e) => e.into(),
                    Ok(Ok(_)) => CoordError::Unexpected("merge".into()),
                });
            }
        };
        let Outcome::RangesMerged {
            merged, segment, ..
        } = outcome
        else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        self.replace_segments(
            &topic,
            &[
                (lower, lower_segment, lower_seal),
                (upper, upper_segment, upper_seal),
            ],
            &[segment],
        )
        .await?;
        info!(topic = %topic, lower = lower.0, upper = upper.0, merged = merged.0, "ranges merged");
        Ok((lower, upper, merged))
    }
}

/// `range` of `topic`, if it is active; else why not, in the order a client
/// fixes it: the topic, then the range, then its state.
fn active_range<'a>(
    state: &'a MetadataState,
    topic: &str,
    range: RangeId,
) -> Result<&'a Range, ModelError> {
    if state.topic(topic).is_none() {
        return Err(ModelError::NoSuchTopic {
            topic: topic.to_owned(),
        });
    }
    let found = state
        .range(range)
        .filter(|r| r.topic == topic)
        .ok_or_else(|| ModelError::NoSuchRange {
            topic: topic.to_owned(),
            range,
        })?;
    if !found.is_active() {
        return Err(ModelError::RangeNotActive { range });
    }
    Ok(found)
}

/// The two ranges a merge of `range` joins, lower first: `range` and its
/// buddy, both active, whose bands tile their parent band exactly.
pub(super) fn merge_pair(
    state: &MetadataState,
    topic: &str,
    range: RangeId,
) -> Result<(RangeId, RangeId), ModelError> {
    let found = active_range(state, topic, range)?;
    let buddy = found
        .band
        .buddy()
        .and_then(|band| state.active_ranges(topic).find(|r| r.band == band))
        .ok_or(ModelError::NoBuddy { range })?;
    let (lower, upper) = if found.band.start() < buddy.band.start() {
        (found, buddy)
    } else {
        (buddy, found)
    };
    if let Some(parent) = lower.band.parent() {
        assert_tiles(parent, lower.band, upper.band);
    }
    Ok((lower.id, upper.id))
}

/// Asserts that `lower` and `upper` tile `parent` exactly, the shape of
/// every split and merge: `lower` starts where `parent` does, `upper`
/// where `lower` ends, and `upper` ends where `parent` does. A gap would
/// leave keys that no range serves; an overlap would give a key two.
pub(super) fn assert_tiles(parent: Band, lower: Band, upper: Band) {
    assert!(
        lower.start() == parent.start()
            && u128::from(upper.start()) == lower.end_exclusive()
            && upper.end_exclusive() == parent.end_exclusive(),
        "a split's or merge's halves tile the parent band exactly: \
         parent {parent:?}, lower {lower:?}, upper {upper:?}"
    );
}

#[cfg(test)]
mod tests {
    use malachi_core::model::Command;

    use super::*;
    use malachi_core::plan::fixture::create;

    #[test]
    fn a_band_s_halves_tile_it() {
        let (lower, upper) = Band::FULL.halves().unwrap();
        assert_tiles(Band::FULL, lower, upper);
        let (ll, lu) = lower.halves().unwrap();
        assert_tiles(lower, ll, lu);
    }

    #[test]
    #[should_panic(expected = "tile the parent band exactly")]
    fn halves_swapped_do_not_tile_their_parent() {
        let (lower, upper) = Band::FULL.halves().unwrap();
        assert_tiles(Band::FULL, upper, lower);
    }

    #[test]
    #[should_panic(expected = "tile the parent band exactly")]
    fn a_quarter_and_a_half_do_not_tile_the_whole() {
        let (lower, upper) = Band::FULL.halves().unwrap();
        let (quarter, _) = lower.halves().unwrap();
        assert_tiles(Band::FULL, quarter, upper);
    }

    #[test]
    fn a_merge_joins_a_range_with_its_buddy_lower_first() {
        let mut state = MetadataState::new();
        create(&mut state, "t", 1);
        let parent = state.active_ranges("t").next().unwrap().id;
        let segment = state.range(parent).unwrap().last_segment().unwrap();
        state
            .apply(Command::SplitRange {
                topic: "t".into(),
                range: parent,
                seal: SealRecord {
                    length: 0,
                    bytes: 0,
                },
                lower_replicas: vec![NodeId(1)],
                upper_replicas: vec![NodeId(1)],
                at_ms: 2,
                segment: Some(segment),
            })
            .unwrap();
        let mut children: Vec<&Range> = state.active_ranges("t").collect();
        children.sort_by_key(|r| r.band.start());
        let (lower, upper) = (children[0].id, children[1].id);
        assert_eq!(merge_pair(&state, "t", upper), Ok((lower, upper)));
        assert_eq!(merge_pair(&state, "t", lower), Ok((lower, upper)));
        // The unsplit range of another topic has no buddy.
        create(&mut state, "u", 1);
        let whole = state.active_ranges("u").next().unwrap().id;
        assert_eq!(
            merge_pair(&state, "u", whole),
            Err(ModelError::NoBuddy { range: whole })
        );
    }
}
