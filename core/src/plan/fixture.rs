//! Metadata states for the planners' and the coordinator's unit tests
//! (the `fixtures` feature shares them with `malachi-actors`' tests).
#![allow(clippy::unwrap_used)]

use crate::model::{Command, MetadataState, NodeId, SealRecord, SegmentId};

pub fn create(state: &mut MetadataState, topic: &str, node: u64) {
    state
        .apply(Command::CreateTopic {
            topic: topic.into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![NodeId(node)]],
            at_ms: 1,
        })
        .unwrap();
}

pub fn create_replicated(state: &mut MetadataState, topic: &str, replicas: &[u64]) {
    state
        .apply(Command::CreateTopic {
            topic: topic.into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![replicas.iter().copied().map(NodeId).collect()],
            at_ms: 1,
        })
        .unwrap();
}

/// Rolls the newest segment of `topic`'s one range onto `next` and
/// returns the segment it sealed.
pub fn roll_onto(state: &mut MetadataState, topic: &str, next: &[u64]) -> SegmentId {
    let segment = state
        .active_ranges(topic)
        .next()
        .unwrap()
        .last_segment()
        .unwrap();
    state
        .apply(Command::RollSegment {
            topic: topic.into(),
            segment,
            seal: SealRecord {
                length: 5,
                bytes: 50,
            },
            next_replicas: next.iter().copied().map(NodeId).collect(),
            at_ms: 1_000,
        })
        .unwrap();
    segment
}
