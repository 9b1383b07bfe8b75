//! The text `malachi topic describe` prints and the JSON `--json` prints, pinned.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::model::{
    Command, MetadataState, NodeId, RangeId, SealRecord, SegmentId, StoragePolicy,
};

fn nodes(ids: &[u64]) -> Vec<NodeId> {
    ids.iter().copied().map(NodeId).collect()
}

/// A topic created with four ranges, then a roll, a split and a merge of two buddies.
fn representative_state() -> MetadataState {
    let mut state = MetadataState::new();
    let commands = vec![
        Command::PutPolicy {
            policy: StoragePolicy {
                name: "week".into(),
                retention_age_ms: Some(604_800_000),
                retention_bytes: None,
                placement: vec!["rack != same".into()],
                reshape: None,
            },
        },
        Command::CreateTopic {
            topic: "orders".into(),
            initial_ranges: 4,
            policy: Some("week".into()),
            replicas: vec![
                nodes(&[1, 2, 3]),
                nodes(&[2, 3, 4]),
                nodes(&[3, 4, 1]),
                nodes(&[4, 1, 2]),
            ],
            at_ms: 1_000,
        },
        Command::RollSegment {
            topic: "orders".into(),
            segment: SegmentId(0),
            seal: SealRecord {
                length: 120,
                bytes: 61_440,
            },
            next_replicas: nodes(&[1, 2, 3]),
            at_ms: 2_000,
        },
        Command::SplitRange {
            topic: "orders".into(),
            range: RangeId(1),
            seal: SealRecord {
                length: 80,
                bytes: 40_960,
            },
            lower_replicas: nodes(&[2, 3, 4]),
            upper_replicas: nodes(&[3, 4, 1]),
            at_ms: 3_000,
            segment: None,
        },
        Command::MergeRanges {
            topic: "orders".into(),
            lower: RangeId(2),
            upper: RangeId(3),
            lower_seal: SealRecord {
                length: 10,
                bytes: 5_120,
            },
            upper_seal: SealRecord {
                length: 0,
                bytes: 0,
            },
            replicas: nodes(&[4, 1, 2]),
            at_ms: 4_000,
            lower_segment: None,
            upper_segment: None,
        },
    ];
    for command in commands {
        state.apply(command).unwrap();
    }
    state
}

#[test]
fn describe_prints_ranges_bands_lineage_and_segments() {
    let description = representative_state().describe_topic("orders").unwrap();
    insta::assert_snapshot!(description.to_string());
}

#[test]
fn describe_json_keeps_stable_field_names() {
    let description = representative_state().describe_topic("orders").unwrap();
    insta::assert_json_snapshot!(description);
}

#[test]
fn describe_marks_an_unresolved_policy_name() {
    let mut state = MetadataState::new();
    state
        .apply(Command::CreateTopic {
            topic: "t".into(),
            initial_ranges: 1,
            policy: Some("gone".into()),
            replicas: vec![nodes(&[1])],
            at_ms: 0,
        })
        .unwrap();
    let description = state.describe_topic("t").unwrap();
    assert!(!description.policy_resolved);
    assert!(
        description
            .to_string()
            .contains("gone (unresolved: holds all data)")
    );
}

#[test]
fn describing_an_unknown_topic_gives_nothing() {
    assert!(MetadataState::new().describe_topic("nope").is_none());
}
