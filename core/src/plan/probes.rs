//! Which copies the coordinator has looked at on each poll: sealed ones for
//! their scrub verdicts (ADR 0110), active replicated ones for an orphaned
//! fence. Each poll takes a bounded batch and goes on where the last one
//! stopped. Pure.

use std::collections::BTreeSet;

use crate::model::{MetadataState, SegmentId, SegmentState};

/// Sealed segments one scrub poll asks about at most; the next poll goes
/// on after the last one asked.
pub const SCRUB_TARGETS_MAX: usize = 1_024;

/// How often a coordinator asks for the scrub verdicts of its sealed
/// copies: a quarter of `scrub_interval_ms`, between 1 and 30 s.
pub fn scrub_poll_ms(scrub_interval_ms: u64) -> u64 {
    (scrub_interval_ms / 4).clamp(1_000, 30_000)
}

/// Up to `max` sealed segments of `state`, in id order from just after
/// `after` (wrapping to the start), each with its recorded seal and its
/// holders, and the id to go on after next time.
pub fn scrub_targets(
    state: &MetadataState,
    after: u64,
    max: usize,
) -> (Vec<super::ScrubTarget>, u64) {
    let mut sealed: Vec<super::ScrubTarget> = Vec::new();
    for topic in state.topics() {
        for range in topic.ranges.iter().filter_map(|id| state.range(*id)) {
            for segment in range.segments.iter().filter_map(|id| state.segment(*id)) {
                if let Some(seal) = segment.seal() {
                    sealed.push(super::ScrubTarget {
                        topic: topic.name.clone(),
                        segment: segment.id,
                        seal,
                        replicas: segment.replicas.iter().map(|n| n.0).collect(),
                    });
                }
            }
        }
    }
    sealed.sort_by_key(|t| t.segment.0);
    let start = sealed.partition_point(|t| t.segment.0 <= after);
    let mut out: Vec<_> = sealed[start..].iter().take(max).cloned().collect();
    if out.len() < max {
        let more = max - out.len();
        out.extend(sealed[..start].iter().take(more).cloned());
    }
    let next = out.last().map_or(0, |t| t.segment.0);
    (out, next)
}

/// Active segments probed per probe at most; the next probe goes on after
/// the last one asked.
pub const PROBE_TARGETS_MAX: usize = 1_024;

/// How often a coordinator has the copies of its active replicated
/// segments probed for an orphaned fence or a copy latched failed: five
/// upkeep ticks, between 1 and 30 s. A segment is failed over only when
/// stuck at two probes in a row, so a roll in progress (a second or less)
/// is never taken for one.
pub fn fence_probe_ms(coordinator_poll_ms: u64) -> u64 {
    coordinator_poll_ms.saturating_mul(5).clamp(1_000, 30_000)
}

/// Up to `max` active replicated segments of `state` (the newest of each
/// active range), in id order from just after `after`, wrapping; those in
/// `skip` (failing over already) are left out. Also the id to go on after.
pub fn probe_targets(
    state: &MetadataState,
    skip: &BTreeSet<SegmentId>,
    after: u64,
    max: usize,
) -> (Vec<super::ProbeTarget>, u64) {
    let mut active: Vec<super::ProbeTarget> = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active
                || segment.replicas.len() < 2
                || skip.contains(&segment.id)
            {
                continue;
            }
            active.push(super::ProbeTarget {
                topic: topic.name.clone(),
                segment: segment.id,
                replicas: segment.replicas.iter().map(|n| n.0).collect(),
            });
        }
    }
    active.sort_by_key(|t| t.segment.0);
    let start = active.partition_point(|t| t.segment.0 <= after);
    let mut out: Vec<_> = active[start..].iter().take(max).cloned().collect();
    if out.len() < max {
        let more = max - out.len();
        out.extend(active[..start].iter().take(more).cloned());
    }
    let next = out.last().map_or(0, |t| t.segment.0);
    (out, next)
}
