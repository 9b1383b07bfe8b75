//! Cross-epoch read plans.
//!
//! A key's history is the chain of ranges that held it: each was sealed at the
//! moment its successor (a split child or a merge result) was created, and
//! the successor names it as a parent. So the ranges that held a key before
//! range R are exactly R's ancestors whose band contains the key, and since
//! ids grow with creation time, sorting the ancestors by id puts them oldest
//! first. A reader of R drains each ancestor's slice of R's band in that
//! order, then R itself, and sees every key's records once and in order.

use super::keyspace::Band;
use super::state::{MetadataState, NodeId, RangeId, SegmentId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// One segment a slice reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentSpan {
    pub segment: SegmentId,
    pub start_offset: u64,
    /// The exclusive end offset; `None` while the segment is active.
    pub end_offset: Option<u64>,
    pub replicas: Vec<NodeId>,
}

/// A part of the read: one range's records, restricted to `band`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadSlice {
    pub range: RangeId,
    /// The range's band intersected with the band of the range being read.
    /// A reader keeps only records whose key position falls inside it.
    pub band: Band,
    /// Whether the range is sealed (its records are all known).
    pub sealed: bool,
    pub segments: Vec<SegmentSpan>,
}

/// The ordered slices a reader of one range drains: sealed ancestors oldest
/// first, the range itself last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadPlan {
    pub range: RangeId,
    pub slices: Vec<ReadSlice>,
}

impl MetadataState {
    /// The read plan of a range, or `None` if no such range exists.
    pub fn read_plan(&self, range: RangeId) -> Option<ReadPlan> {
        let target = self.ranges.get(&range)?;
        let mut ancestors = BTreeSet::new();
        let mut frontier: Vec<RangeId> = target.parents.clone();
        // Each range is visited once, and the state holds finitely many, so this ends.
        while let Some(id) = frontier.pop() {
            if ancestors.insert(id)
                && let Some(r) = self.ranges.get(&id)
            {
                frontier.extend(r.parents.iter().copied());
            }
        }
        let mut slices = Vec::new();
        for id in ancestors.into_iter().chain(std::iter::once(range)) {
            let Some(r) = self.ranges.get(&id) else {
                continue;
            };
            // A merge's parent is an ancestor of both halves of a later split,
            // but holds keys of only one: skip it for the other.
            let Some(band) = r.band.intersect(&target.band) else {
                continue;
            };
            let segments = r
                .segments
                .iter()
                .filter_map(|s| self.segments.get(s))
                .map(|s| SegmentSpan {
                    segment: s.id,
                    start_offset: s.start_offset,
                    end_offset: s.end_offset(),
                    replicas: s.replicas.clone(),
                })
                .collect();
            slices.push(ReadSlice {
                range: id,
                band,
                sealed: !r.is_active(),
                segments,
            });
        }
        debug_assert!(
            slices.last().is_some_and(|s| s.range == range),
            "read plan must end at its range"
        );
        Some(ReadPlan { range, slices })
    }
}

impl ReadPlan {
    /// The slices that hold a keyspace position, in read order.
    pub fn slices_for(&self, position: u64) -> impl Iterator<Item = &ReadSlice> {
        self.slices
            .iter()
            .filter(move |s| s.band.contains(position))
    }
}

impl SegmentSpan {
    pub fn is_sealed(&self) -> bool {
        self.end_offset.is_some()
    }
}
