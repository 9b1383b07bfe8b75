//! Where a segment's producer table starts from (ADR 0119): the segments
//! before it, each with its seal and holders, read from the metadata. Pure:
//! the coordinator hands the result to the segment actor it starts.

use std::collections::BTreeMap;

use malachi_core::model::{MetadataState, RangeId, SegmentId, SegmentState};

use crate::data::ancestors::{
    ANCESTRY_DEPTH_MAX, ANCESTRY_SEGMENTS_MAX, Ancestor, Ancestry, Sealed,
};

/// The segments whose producer state `segment` of `range` starts from: the
/// range's previous segment, or for a range's first segment the last
/// segments of the ranges it succeeded (a split's parent, a merge's two).
fn predecessors(
    state: &MetadataState,
    range: RangeId,
    segment: SegmentId,
) -> Vec<(SegmentId, RangeId)> {
    let Some(found) = state.range(range) else {
        return Vec::new();
    };
    match found.segments.iter().position(|s| *s == segment) {
        Some(i) if i > 0 => vec![(found.segments[i - 1], range)],
        _ => found
            .parents
            .iter()
            .filter_map(|parent| {
                state
                    .range(*parent)
                    .and_then(|p| p.last_segment())
                    .map(|s| (s, *parent))
            })
            .collect(),
    }
}

/// The producer-state ancestry of `segment` of `range` (ADR 0119): its
/// predecessors, theirs, and so on, each with its range, seal and own
/// predecessors, up to `ANCESTRY_DEPTH_MAX` generations and
/// `ANCESTRY_SEGMENTS_MAX` segments, so a broker that never held a
/// sidecar of them (it followed them, and a failover made it the primary)
/// rebuilds the table their primaries held.
pub(crate) fn ancestry(state: &MetadataState, range: RangeId, segment: SegmentId) -> Ancestry {
    let direct = predecessors(state, range, segment);
    let mut ancestry = Ancestry {
        direct: direct.iter().map(|(s, _)| *s).collect(),
        segments: BTreeMap::new(),
    };
    let mut generation = direct;
    for _ in 0..ANCESTRY_DEPTH_MAX {
        let mut next = Vec::new();
        for (ancestor, ancestor_range) in generation {
            if ancestry.segments.len() >= ANCESTRY_SEGMENTS_MAX {
                return ancestry;
            }
            if ancestry.segments.contains_key(&ancestor) {
                continue;
            }
            let Some(found) = state.segment(ancestor) else {
                continue;
            };
            let sealed = match found.state {
                SegmentState::Sealed { seal, at_ms } => Some(Sealed {
                    at_ms,
                    length: seal.length,
                }),
                SegmentState::Active => None,
            };
            let before = predecessors(state, ancestor_range, ancestor);
            ancestry.segments.insert(
                ancestor,
                Ancestor {
                    range: ancestor_range,
                    sealed,
                    predecessors: before.iter().map(|(s, _)| *s).collect(),
                    holders: found.replicas.clone(),
                },
            );
            next.extend(before);
        }
        if next.is_empty() {
            break;
        }
        generation = next;
    }
    ancestry
}

#[cfg(test)]
mod tests {
    use malachi_core::model::{Command, NodeId, SealRecord};

    use super::*;
    use malachi_core::plan::fixture::create_replicated;

    #[test]
    fn the_ancestry_lists_each_roll_with_its_seal_back_to_the_depth_bound() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let range = state.active_ranges("t").next().unwrap().id;
        let rolls = ANCESTRY_DEPTH_MAX as u64 + 5;
        for i in 0..rolls {
            let segment = state.range(range).unwrap().last_segment().unwrap();
            state
                .apply(Command::RollSegment {
                    topic: "t".into(),
                    segment,
                    seal: SealRecord {
                        length: i,
                        bytes: 0,
                    },
                    next_replicas: vec![NodeId(1), NodeId(2), NodeId(3)],
                    at_ms: 10 + i,
                })
                .unwrap();
        }
        let segments = state.range(range).unwrap().segments.clone();
        let n = segments.len();
        let found = ancestry(&state, range, segments[n - 1]);
        assert_eq!(found.direct, vec![segments[n - 2]]);
        assert_eq!(found.segments.len(), ANCESTRY_DEPTH_MAX);
        let newest = &found.segments[&segments[n - 2]];
        assert_eq!(newest.range, range);
        assert_eq!(
            newest.sealed,
            Some(Sealed {
                at_ms: 10 + rolls - 1,
                length: rolls - 1,
            })
        );
        assert_eq!(newest.predecessors, vec![segments[n - 3]]);
        // The oldest listed names its predecessor, which is past the bound.
        let oldest = n - 1 - ANCESTRY_DEPTH_MAX;
        assert_eq!(
            found.segments[&segments[oldest]].predecessors,
            vec![segments[oldest - 1]]
        );
        assert!(!found.segments.contains_key(&segments[oldest - 1]));
        // A topic's first segment descends from nothing.
        assert_eq!(ancestry(&state, range, segments[0]), Ancestry::default());
    }
}
