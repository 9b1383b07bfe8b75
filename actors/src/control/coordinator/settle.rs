//! Which writers running here are deposed (their segment was sealed
//! without them, by a failover or a split or merge) and must be stopped
//! and their copies settled at the recorded seal. Pure: `reconcile.rs`
//! reads the metadata and does the stopping and settling.

use std::collections::{BTreeMap, BTreeSet};

use malachi_core::model::{MetadataState, NodeId, RangeId, SegmentId, SegmentState};

/// A writer to stop and settle: its topic, range, segment and recorded
/// seal length.
pub(super) type Deposed = (String, RangeId, SegmentId, u64);

/// What reconcile knows of this broker before it reads the metadata.
#[derive(Debug)]
pub(super) struct Here {
    pub node: NodeId,
    /// The writers running here.
    pub running: Vec<SegmentId>,
    /// The deposed writers' copies settled already.
    pub settled: BTreeSet<SegmentId>,
    /// The writers whose roll was refused for good, with their topics.
    pub refused: BTreeMap<SegmentId, String>,
    /// The follower copies open here and not sealed yet.
    pub followed: Vec<SegmentId>,
}

/// What reconcile found over the views of every replica this broker holds.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// The running writers some view still lists (the rest are orphans).
    pub known: BTreeSet<SegmentId>,
    /// The active segments led here: each wants a writer.
    pub wanted: Vec<(String, SegmentId)>,
    /// The followed copies the metadata records sealed, at that length.
    pub to_seal: Vec<(SegmentId, u64)>,
    /// Writers of segments sealed without them (a failover while this
    /// broker was cut off): stopped, their copies sealed at the record.
    pub deposed: Vec<Deposed>,
}

impl Scan {
    /// Adds what one replica's view says.
    pub(super) fn view(&mut self, state: &MetadataState, here: &Here) {
        let running = &here.running;
        self.known
            .extend(running.iter().filter(|id| state.segment(**id).is_some()));
        self.deposed.extend(recently_deposed(state, here));
        let found = refused_sealed(state, &here.refused, running)
            .into_iter()
            .chain(sealed_writers(state, running, here.node));
        for found in found {
            if !self.deposed.iter().any(|d| d.2 == found.2) {
                self.deposed.push(found);
            }
        }
        self.wanted.extend(led_here(state, here.node));
        for &id in &here.followed {
            if let Some(seal) = state.segment(id).and_then(|s| s.seal()) {
                self.to_seal.push((id, seal.length));
            }
        }
    }
}

/// The deposed writers among the last few segments of each active range:
/// sealed, continued by a successor led elsewhere, and running here or
/// written here and not settled yet.
fn recently_deposed(state: &MetadataState, here: &Here) -> Vec<Deposed> {
    let node = here.node;
    let mut deposed = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            // The last few segments: a deposed writer's segment is the
            // one before the newest, or a little older if the range
            // rolled again since.
            let recent = &range.segments[range.segments.len().saturating_sub(4)..];
            for pair in recent.windows(2) {
                let (id, next) = (pair[0], pair[1]);
                let Some(segment) = state.segment(id) else {
                    continue;
                };
                let wrote_it = segment.replicas.first() == Some(&node);
                if !here.running.contains(&id) && (!wrote_it || here.settled.contains(&id)) {
                    continue;
                }
                let led_elsewhere = state
                    .segment(next)
                    .and_then(|s| s.replicas.first())
                    .is_some_and(|primary| *primary != node);
                if let Some(seal) = segment.seal()
                    && led_elsewhere
                {
                    deposed.push((topic.name.clone(), range.id, id, seal.length));
                }
            }
        }
    }
    deposed
}

/// The newest segment of each active range, if active and led by `node`:
/// the writer runs on the primary only; followers' copies are written by
/// the ReplicationServer.
fn led_here(state: &MetadataState, node: NodeId) -> Vec<(String, SegmentId)> {
    let mut wanted = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            let Some(id) = range.last_segment() else {
                continue;
            };
            if let Some(segment) = state.segment(id)
                && segment.state == SegmentState::Active
                && segment.replicas.first() == Some(&node)
            {
                wanted.push((topic.name.clone(), id));
            }
        }
    }
    wanted
}

/// The writers running here (`running`) whose roll the metadata refused for
/// good (`refused`, with their topics) and that `state` records sealed:
/// each with its range and recorded seal length, to stop and settle as a
/// deposed writer. Their range may be split or merged away, so not active
/// and not among the ranges `reconcile` scans for deposed writers (chaos
/// finding F7). A segment not sealed in this view is left for a later pass
/// (this replica is behind); one unknown to every view is an orphan.
pub(super) fn refused_sealed(
    state: &MetadataState,
    refused: &BTreeMap<SegmentId, String>,
    running: &[SegmentId],
) -> Vec<Deposed> {
    refused
        .iter()
        .filter(|(id, _)| running.contains(id))
        .filter_map(|(&id, topic)| {
            let segment = state.segment(id)?;
            let range = state.range(segment.range)?;
            let seal = segment.seal()?;
            (range.topic == *topic).then(|| (topic.clone(), range.id, id, seal.length))
        })
        .collect()
}

/// The writers running here (`running`) of segments `state` records sealed
/// and continued by a successor led by another broker (a failover sealed
/// them while this broker was down or cut off): each with its topic, range
/// and recorded seal length, to stop and settle as a deposed writer, however
/// many segments the range rolled since (issue 36: a deposed writer's copy
/// stayed past its seal for minutes when its segment was no longer among
/// the range's last few). A segment whose successor is led here is this
/// writer's own roll, which stops it itself.
pub(super) fn sealed_writers(
    state: &MetadataState,
    running: &[SegmentId],
    node: NodeId,
) -> Vec<Deposed> {
    running
        .iter()
        .filter_map(|&id| {
            let segment = state.segment(id)?;
            let seal = segment.seal()?;
            let range = state.range(segment.range)?;
            let at = range.segments.iter().position(|s| *s == id)?;
            let next = state.segment(*range.segments.get(at + 1)?)?;
            (next.replicas.first() != Some(&node))
                .then(|| (range.topic.clone(), range.id, id, seal.length))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use malachi_core::model::{Command, ModelError, SealRecord};

    use super::*;
    use crate::control::coordinator::CoordError;
    use crate::control::coordinator::lifecycle::roll_refusal;
    use crate::data::segment::RollError;
    use malachi_core::plan::fixture::create;

    /// Chaos finding F7: the writer of a segment whose range was split
    /// away had its roll refused (`RangeNotActive`) for good, and nothing
    /// settled it: reconcile looked for deposed writers in active ranges
    /// only. A refused writer is found in any range, at the recorded seal.
    #[test]
    fn a_refused_writer_of_a_split_range_is_settled_at_the_recorded_seal() {
        let mut state = MetadataState::new();
        create(&mut state, "t", 1);
        let range = state.active_ranges("t").next().unwrap().id;
        let frozen = state.range(range).unwrap().last_segment().unwrap();
        let seal = SealRecord {
            length: 7,
            bytes: 70,
        };
        state
            .apply(Command::SplitRange {
                topic: "t".into(),
                range,
                seal,
                lower_replicas: vec![NodeId(1)],
                upper_replicas: vec![NodeId(1)],
                at_ms: 2,
                segment: Some(frozen),
            })
            .unwrap();
        assert!(!state.range(range).unwrap().is_active());
        // The refusal is for good, so the writer is handed over.
        assert!(matches!(
            roll_refusal(&CoordError::Model(ModelError::RangeNotActive { range })),
            RollError::Permanent(_)
        ));
        let refused: BTreeMap<SegmentId, String> = [(frozen, "t".to_string())].into();
        assert_eq!(
            refused_sealed(&state, &refused, &[frozen]),
            vec![("t".to_string(), range, frozen, 7)]
        );
        // Not a writer running here, or another topic's segment: nothing.
        assert!(refused_sealed(&state, &refused, &[]).is_empty());
        let other: BTreeMap<SegmentId, String> = [(frozen, "u".to_string())].into();
        assert!(refused_sealed(&state, &other, &[frozen]).is_empty());
        // A segment still active in this view (the replica is behind) waits.
        let child = state.active_ranges("t").next().unwrap();
        let active = child.last_segment().unwrap();
        let waiting: BTreeMap<SegmentId, String> = [(active, "t".to_string())].into();
        assert!(refused_sealed(&state, &waiting, &[active]).is_empty());
    }
}
