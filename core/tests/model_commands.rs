//! One behaviour per test for each metadata command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::model::{
    Band, Command, MetadataState, ModelError, NodeId, Outcome, RangeId, RangeState, SealRecord,
    SegmentId, SegmentState, StoragePolicy, TopicState, position,
};

fn nodes(ids: &[u64]) -> Vec<NodeId> {
    ids.iter().copied().map(NodeId).collect()
}

fn seal(length: u64) -> SealRecord {
    SealRecord {
        length,
        bytes: length * 100,
    }
}

fn create(state: &mut MetadataState, topic: &str, ranges: u64) -> (Vec<RangeId>, Vec<SegmentId>) {
    let replicas = (0..ranges).map(|_| nodes(&[1, 2, 3])).collect();
    let cmd = Command::CreateTopic {
        topic: topic.into(),
        initial_ranges: ranges,
        policy: None,
        replicas,
        at_ms: 10,
    };
    match state.apply(cmd).unwrap() {
        Outcome::TopicCreated {
            ranges, segments, ..
        } => (ranges, segments),
        other => panic!("unexpected outcome {other:?}"),
    }
}

fn split(
    state: &mut MetadataState,
    topic: &str,
    range: RangeId,
    length: u64,
) -> Result<Outcome, ModelError> {
    state.apply(Command::SplitRange {
        topic: topic.into(),
        range,
        seal: seal(length),
        lower_replicas: nodes(&[1, 2]),
        upper_replicas: nodes(&[2, 3]),
        at_ms: 20,
        segment: None,
    })
}

fn merge(
    state: &mut MetadataState,
    topic: &str,
    lower: RangeId,
    upper: RangeId,
) -> Result<Outcome, ModelError> {
    state.apply(Command::MergeRanges {
        topic: topic.into(),
        lower,
        upper,
        lower_seal: seal(1),
        upper_seal: seal(2),
        replicas: nodes(&[4]),
        at_ms: 30,
        lower_segment: None,
        upper_segment: None,
    })
}

fn seal_segment(
    state: &mut MetadataState,
    topic: &str,
    segment: SegmentId,
    s: SealRecord,
) -> Result<Outcome, ModelError> {
    state.apply(Command::SealSegment {
        topic: topic.into(),
        segment,
        seal: s,
        at_ms: 40,
    })
}

fn roll(
    state: &mut MetadataState,
    topic: &str,
    segment: SegmentId,
    length: u64,
) -> Result<Outcome, ModelError> {
    state.apply(Command::RollSegment {
        topic: topic.into(),
        segment,
        seal: seal(length),
        next_replicas: nodes(&[1, 2, 3]),
        at_ms: 50,
    })
}

/// Applies a command that must be refused and checks the state did not change.
fn refused(state: &mut MetadataState, cmd: Command) -> ModelError {
    let before = state.snapshot().unwrap();
    let err = state.apply(cmd).unwrap_err();
    assert_eq!(
        state.snapshot().unwrap(),
        before,
        "a refused command changed the state"
    );
    err
}

#[test]
fn creating_a_topic_tiles_the_keyspace_with_equal_ranges() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "orders", 4);
    assert_eq!(ranges.len(), 4);
    assert_eq!(segments.len(), 4);
    let bands: Vec<Band> = state.active_ranges("orders").map(|r| r.band).collect();
    assert_eq!(bands, Band::tiling(4).unwrap());
    for segment in segments {
        let segment = state.segment(segment).unwrap();
        assert_eq!(segment.start_offset, 0);
        assert_eq!(segment.state, SegmentState::Active);
    }
}

#[test]
fn creating_a_topic_with_a_non_power_of_two_count_is_refused() {
    let mut state = MetadataState::new();
    let replicas = vec![nodes(&[1]); 3];
    let cmd = Command::CreateTopic {
        topic: "t".into(),
        initial_ranges: 3,
        policy: None,
        replicas,
        at_ms: 0,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::NotPowerOfTwo { count: 3 }
    );
}

#[test]
fn creating_an_existing_topic_is_refused() {
    let mut state = MetadataState::new();
    create(&mut state, "t", 1);
    let cmd = Command::CreateTopic {
        topic: "t".into(),
        initial_ranges: 1,
        policy: None,
        replicas: vec![nodes(&[1])],
        at_ms: 0,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::TopicExists { topic: "t".into() }
    );
}

#[test]
fn a_replica_set_naming_a_node_twice_is_refused() {
    let mut state = MetadataState::new();
    let cmd = Command::CreateTopic {
        topic: "t".into(),
        initial_ranges: 1,
        policy: None,
        replicas: vec![nodes(&[1, 1])],
        at_ms: 0,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::DuplicateReplica { node: NodeId(1) }
    );
}

#[test]
fn a_topic_name_with_a_slash_is_refused() {
    let mut state = MetadataState::new();
    let cmd = Command::CreateTopic {
        topic: "a/b".into(),
        initial_ranges: 1,
        policy: None,
        replicas: vec![nodes(&[1])],
        at_ms: 0,
    };
    assert!(matches!(
        refused(&mut state, cmd),
        ModelError::InvalidName { .. }
    ));
}

#[test]
fn every_key_routes_to_the_one_active_range_holding_its_position() {
    let mut state = MetadataState::new();
    create(&mut state, "t", 8);
    for key in [&b"alice"[..], b"bob", b"", b"carol"] {
        let range = state.route_key("t", key).unwrap();
        assert!(range.band.contains(position(key)));
        assert_eq!(
            state
                .active_ranges("t")
                .filter(|r| r.band.contains(position(key)))
                .count(),
            1
        );
    }
    assert_eq!(
        state.route_position("t", u64::MAX).unwrap().band.last(),
        u64::MAX
    );
}

#[test]
fn rolling_seals_the_active_segment_and_opens_the_next_at_its_end() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 1);
    let Outcome::SegmentRolled { sealed, next } = roll(&mut state, "t", segments[0], 7).unwrap()
    else {
        panic!()
    };
    assert_eq!(sealed, segments[0]);
    assert_eq!(state.segment(sealed).unwrap().seal(), Some(seal(7)));
    assert_eq!(state.segment(next).unwrap().start_offset, 7);
    assert_eq!(state.range(ranges[0]).unwrap().segments, vec![sealed, next]);
}

#[test]
fn rolling_a_segment_twice_is_refused_as_already_rolled() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    let Outcome::SegmentRolled { next, .. } = roll(&mut state, "t", segments[0], 7).unwrap() else {
        panic!()
    };
    let cmd = Command::RollSegment {
        topic: "t".into(),
        segment: segments[0],
        seal: seal(7),
        next_replicas: nodes(&[1]),
        at_ms: 60,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::AlreadyRolled {
            segment: segments[0],
            successor: next
        }
    );
}

#[test]
fn rolling_after_a_seal_on_failure_at_the_same_length_opens_the_next_segment() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    seal_segment(&mut state, "t", segments[0], seal(5)).unwrap();
    let Outcome::SegmentRolled { next, .. } = roll(&mut state, "t", segments[0], 5).unwrap() else {
        panic!()
    };
    assert_eq!(state.segment(next).unwrap().start_offset, 5);
}

#[test]
fn the_first_recorded_seal_wins_and_a_different_one_is_refused_with_it() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    assert_eq!(
        seal_segment(&mut state, "t", segments[0], seal(5)),
        Ok(Outcome::SegmentSealed {
            segment: segments[0]
        })
    );
    let cmd = Command::SealSegment {
        topic: "t".into(),
        segment: segments[0],
        seal: seal(6),
        at_ms: 41,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::AlreadySealed {
            segment: segments[0],
            recorded: seal(5)
        }
    );
}

#[test]
fn resealing_at_the_recorded_seal_is_idempotent() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    seal_segment(&mut state, "t", segments[0], seal(5)).unwrap();
    let before = state.snapshot().unwrap();
    assert_eq!(
        seal_segment(&mut state, "t", segments[0], seal(5)),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(state.snapshot().unwrap(), before);
}

#[test]
fn splitting_seals_the_parent_and_its_segment_and_opens_two_halves() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 1);
    let Outcome::RangeSplit {
        lower,
        upper,
        lower_segment,
        ..
    } = split(&mut state, "t", ranges[0], 9).unwrap()
    else {
        panic!()
    };
    let parent = state.range(ranges[0]).unwrap();
    assert_eq!(parent.state, RangeState::Sealed { at_ms: 20 });
    assert_eq!(parent.children, vec![lower, upper]);
    assert_eq!(state.segment(segments[0]).unwrap().seal(), Some(seal(9)));
    let (lower_band, upper_band) = Band::FULL.halves().unwrap();
    assert_eq!(state.range(lower).unwrap().band, lower_band);
    assert_eq!(state.range(upper).unwrap().band, upper_band);
    assert_eq!(state.range(upper).unwrap().parents, vec![ranges[0]]);
    assert_eq!(state.segment(lower_segment).unwrap().start_offset, 0);
}

#[test]
fn splitting_a_sealed_range_is_refused() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 1);
    split(&mut state, "t", ranges[0], 1).unwrap();
    let before = state.snapshot().unwrap();
    assert_eq!(
        split(&mut state, "t", ranges[0], 1),
        Err(ModelError::RangeNotActive { range: ranges[0] })
    );
    assert_eq!(state.snapshot().unwrap(), before);
}

#[test]
fn splitting_a_range_whose_segment_was_sealed_at_another_length_is_refused() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 1);
    seal_segment(&mut state, "t", segments[0], seal(3)).unwrap();
    let before = state.snapshot().unwrap();
    assert_eq!(
        split(&mut state, "t", ranges[0], 4),
        Err(ModelError::AlreadySealed {
            segment: segments[0],
            recorded: seal(3)
        })
    );
    assert_eq!(state.snapshot().unwrap(), before);
}

/// Chaos finding F6: a coordinator froze segment 541 (23 records), a
/// failover rolled it to 542 before the split's proposal applied, and the
/// split then sealed 542, which holds nothing, at 541's figures. A split
/// names the segment its seal was computed from and is refused, changing
/// nothing, once that segment is no longer the range's newest.
#[test]
fn a_split_whose_frozen_segment_failed_over_meanwhile_is_refused_and_seals_nothing() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 1);
    let frozen = segments[0];
    // The failover: the frozen segment is sealed at 23 and rolled.
    let Outcome::SegmentRolled { next, .. } = roll(&mut state, "t", frozen, 23).unwrap() else {
        panic!()
    };
    let split_of = |segment| Command::SplitRange {
        topic: "t".into(),
        range: ranges[0],
        seal: seal(23),
        lower_replicas: nodes(&[1, 2]),
        upper_replicas: nodes(&[2, 3]),
        at_ms: 20,
        segment: Some(segment),
    };
    assert_eq!(
        refused(&mut state, split_of(frozen)),
        ModelError::AlreadyRolled {
            segment: frozen,
            successor: next
        }
    );
    assert_eq!(state.segment(next).unwrap().seal(), None);
    assert!(state.range(ranges[0]).unwrap().is_active());
    // A split that froze the successor seals the successor, at its own seal.
    let mut own = split_of(next);
    if let Command::SplitRange { seal: s, .. } = &mut own {
        *s = seal(0);
    }
    state.apply(own).unwrap();
    assert_eq!(state.segment(next).unwrap().seal(), Some(seal(0)));
    assert_eq!(state.segment(frozen).unwrap().seal(), Some(seal(23)));
}

/// F6 for a merge: each half names the segment its seal was computed from.
#[test]
fn a_merge_whose_frozen_segment_failed_over_meanwhile_is_refused_and_seals_nothing() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 2);
    let Outcome::SegmentRolled { next, .. } = roll(&mut state, "t", segments[1], 5).unwrap() else {
        panic!()
    };
    let merge_of = |upper_segment| Command::MergeRanges {
        topic: "t".into(),
        lower: ranges[0],
        upper: ranges[1],
        lower_seal: seal(1),
        upper_seal: seal(5),
        replicas: nodes(&[4]),
        at_ms: 30,
        lower_segment: Some(segments[0]),
        upper_segment: Some(upper_segment),
    };
    assert_eq!(
        refused(&mut state, merge_of(segments[1])),
        ModelError::AlreadyRolled {
            segment: segments[1],
            successor: next
        }
    );
    assert_eq!(state.segment(segments[0]).unwrap().seal(), None);
    assert_eq!(state.segment(next).unwrap().seal(), None);
    // A segment of another range is no segment of this one.
    assert_eq!(
        refused(&mut state, merge_of(segments[0])),
        ModelError::NoSuchSegment {
            topic: "t".into(),
            segment: segments[0]
        }
    );
}

#[test]
fn merging_the_two_halves_of_a_split_opens_the_parent_band_again() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 1);
    let Outcome::RangeSplit { lower, upper, .. } = split(&mut state, "t", ranges[0], 1).unwrap()
    else {
        panic!()
    };
    let Outcome::RangesMerged { merged, .. } = merge(&mut state, "t", lower, upper).unwrap() else {
        panic!()
    };
    let merged = state.range(merged).unwrap();
    assert_eq!(merged.band, Band::FULL);
    assert_eq!(merged.parents, vec![lower, upper]);
    assert!(!state.range(lower).unwrap().is_active());
}

#[test]
fn merging_initial_ranges_that_are_buddy_halves_is_allowed() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 4);
    assert!(matches!(
        merge(&mut state, "t", ranges[2], ranges[3]),
        Ok(Outcome::RangesMerged { .. })
    ));
}

#[test]
fn merging_neighbours_that_are_not_buddies_is_refused() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 4);
    let cmd = Command::MergeRanges {
        topic: "t".into(),
        lower: ranges[1],
        upper: ranges[2],
        lower_seal: seal(1),
        upper_seal: seal(1),
        replicas: nodes(&[1]),
        at_ms: 0,
        lower_segment: None,
        upper_segment: None,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::NotBuddies {
            lower: ranges[1],
            upper: ranges[2]
        }
    );
}

#[test]
fn merging_buddies_given_upper_first_is_refused() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 2);
    let before = state.snapshot().unwrap();
    assert_eq!(
        merge(&mut state, "t", ranges[1], ranges[0]),
        Err(ModelError::NotBuddies {
            lower: ranges[1],
            upper: ranges[0]
        })
    );
    assert_eq!(state.snapshot().unwrap(), before);
}

#[test]
fn merging_ranges_of_different_sizes_is_refused() {
    let mut state = MetadataState::new();
    let (ranges, _) = create(&mut state, "t", 2);
    let Outcome::RangeSplit { upper, .. } = split(&mut state, "t", ranges[1], 1).unwrap() else {
        panic!()
    };
    assert_eq!(
        merge(&mut state, "t", ranges[0], upper),
        Err(ModelError::NotBuddies {
            lower: ranges[0],
            upper
        })
    );
}

#[test]
fn a_sealed_topic_refuses_rolls_splits_and_merges_but_takes_segment_seals() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 2);
    assert_eq!(
        state.apply(Command::SealTopic {
            topic: "t".into(),
            at_ms: 70
        }),
        Ok(Outcome::TopicSealed {
            active_segments: segments.clone()
        })
    );
    assert_eq!(
        state.topic("t").unwrap().state,
        TopicState::Sealed { at_ms: 70 }
    );
    let sealed = ModelError::TopicSealed { topic: "t".into() };
    assert_eq!(split(&mut state, "t", ranges[0], 1), Err(sealed.clone()));
    assert_eq!(
        merge(&mut state, "t", ranges[0], ranges[1]),
        Err(sealed.clone())
    );
    assert_eq!(roll(&mut state, "t", segments[0], 1), Err(sealed));
    assert_eq!(
        seal_segment(&mut state, "t", segments[0], seal(3)),
        Ok(Outcome::SegmentSealed {
            segment: segments[0]
        })
    );
    assert_eq!(
        state.apply(Command::SealTopic {
            topic: "t".into(),
            at_ms: 71
        }),
        Ok(Outcome::Unchanged)
    );
}

#[test]
fn deleting_a_topic_lists_its_segments_and_a_recreation_gets_a_new_incarnation() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 2);
    let first = state.topic("t").unwrap().incarnation;
    let Outcome::TopicDeleted {
        segments: deleted, ..
    } = state
        .apply(Command::DeleteTopic { topic: "t".into() })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(deleted, segments);
    assert!(state.segment(segments[0]).is_none());
    create(&mut state, "t", 1);
    assert!(state.topic("t").unwrap().incarnation > first);
}

#[test]
fn replacing_a_replica_keeps_its_slot_in_the_set() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    let cmd = Command::ReplaceReplica {
        topic: "t".into(),
        segment: segments[0],
        old: NodeId(2),
        new: NodeId(9),
    };
    assert_eq!(
        state.apply(cmd),
        Ok(Outcome::ReplicaReplaced {
            segment: segments[0]
        })
    );
    assert_eq!(
        state.segment(segments[0]).unwrap().replicas,
        nodes(&[1, 9, 3])
    );
}

#[test]
fn replacing_a_node_that_is_not_a_replica_is_refused() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    let cmd = Command::ReplaceReplica {
        topic: "t".into(),
        segment: segments[0],
        old: NodeId(7),
        new: NodeId(9),
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::WrongReplica {
            segment: segments[0],
            node: NodeId(7)
        }
    );
}

#[test]
fn replacing_with_a_node_already_in_the_set_is_refused() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    let cmd = Command::ReplaceReplica {
        topic: "t".into(),
        segment: segments[0],
        old: NodeId(1),
        new: NodeId(3),
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::ReplicaPresent {
            segment: segments[0],
            node: NodeId(3)
        }
    );
}

/// A topic whose one segment failed over onto two brokers, sealed there
/// (chaos finding F1): the sealed segment short of the factor.
fn short_sealed(state: &mut MetadataState) -> SegmentId {
    let (_, segments) = create(state, "t", 1);
    let rolled = state.apply(Command::RollSegment {
        topic: "t".into(),
        segment: segments[0],
        seal: seal(5),
        next_replicas: nodes(&[2, 1]),
        at_ms: 20,
    });
    let Ok(Outcome::SegmentRolled { next, .. }) = rolled else {
        panic!("unexpected outcome {rolled:?}");
    };
    seal_segment(state, "t", next, seal(3)).unwrap();
    next
}

#[test]
fn adding_a_replica_to_a_short_sealed_segment_appends_it_after_the_primary() {
    let mut state = MetadataState::new();
    let segment = short_sealed(&mut state);
    let cmd = Command::AddReplica {
        topic: "t".into(),
        segment,
        new: NodeId(3),
        factor: 3,
    };
    assert_eq!(state.apply(cmd), Ok(Outcome::ReplicaAdded { segment }));
    assert_eq!(state.segment(segment).unwrap().replicas, nodes(&[2, 1, 3]));
}

#[test]
fn adding_a_replica_to_an_active_segment_is_refused() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    let cmd = Command::AddReplica {
        topic: "t".into(),
        segment: segments[0],
        new: NodeId(4),
        factor: 4,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::SegmentNotSealed {
            segment: segments[0]
        }
    );
}

#[test]
fn adding_a_node_that_already_holds_a_copy_is_refused() {
    let mut state = MetadataState::new();
    let segment = short_sealed(&mut state);
    let cmd = Command::AddReplica {
        topic: "t".into(),
        segment,
        new: NodeId(1),
        factor: 3,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::ReplicaPresent {
            segment,
            node: NodeId(1)
        }
    );
}

#[test]
fn adding_a_replica_to_a_segment_at_its_factor_is_refused() {
    let mut state = MetadataState::new();
    let segment = short_sealed(&mut state);
    let add = |node: u64| Command::AddReplica {
        topic: "t".into(),
        segment,
        new: NodeId(node),
        factor: 3,
    };
    assert_eq!(state.apply(add(3)), Ok(Outcome::ReplicaAdded { segment }));
    // A second healer (or a deposed one's late commit) wanting the same
    // factor: refused, so no segment goes past it.
    assert_eq!(
        refused(&mut state, add(4)),
        ModelError::AtFactor { segment, factor: 3 }
    );
    assert_eq!(state.segment(segment).unwrap().replicas, nodes(&[2, 1, 3]));
}

#[test]
fn adding_a_replica_past_the_set_size_limit_is_refused() {
    use malachi_core::model::REPLICA_SET_SIZE_MAX;
    let mut state = MetadataState::new();
    let segment = short_sealed(&mut state);
    let cmd = Command::AddReplica {
        topic: "t".into(),
        segment,
        new: NodeId(3),
        factor: u32::try_from(REPLICA_SET_SIZE_MAX).unwrap() + 1,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::TooManyReplicas {
            count: REPLICA_SET_SIZE_MAX + 1,
            max: REPLICA_SET_SIZE_MAX
        }
    );
}

#[test]
fn adding_node_zero_or_to_an_unknown_segment_is_refused() {
    let mut state = MetadataState::new();
    let segment = short_sealed(&mut state);
    let zero = Command::AddReplica {
        topic: "t".into(),
        segment,
        new: NodeId(0),
        factor: 3,
    };
    assert_eq!(refused(&mut state, zero), ModelError::InvalidNode);
    let unknown = Command::AddReplica {
        topic: "t".into(),
        segment: SegmentId(segment.0 + 100),
        new: NodeId(3),
        factor: 3,
    };
    assert_eq!(
        refused(&mut state, unknown),
        ModelError::NoSuchSegment {
            topic: "t".into(),
            segment: SegmentId(segment.0 + 100)
        }
    );
}

#[test]
fn a_segment_of_another_topic_is_not_found() {
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "a", 1);
    create(&mut state, "b", 1);
    let cmd = Command::SealSegment {
        topic: "b".into(),
        segment: segments[0],
        seal: seal(1),
        at_ms: 0,
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::NoSuchSegment {
            topic: "b".into(),
            segment: segments[0]
        }
    );
}

#[test]
fn policies_are_defined_removed_and_can_be_left_unresolved() {
    let mut state = MetadataState::new();
    let policy = StoragePolicy {
        name: "week".into(),
        retention_age_ms: Some(604_800_000),
        retention_bytes: None,
        placement: vec![],
        reshape: None,
    };
    assert_eq!(
        state.apply(Command::PutPolicy {
            policy: policy.clone()
        }),
        Ok(Outcome::PolicyPut)
    );
    assert_eq!(
        state.apply(Command::PutPolicy { policy }),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(
        state.apply(Command::RemovePolicy {
            name: "week".into()
        }),
        Ok(Outcome::PolicyRemoved)
    );
    let cmd = Command::RemovePolicy {
        name: "week".into(),
    };
    assert_eq!(
        refused(&mut state, cmd),
        ModelError::NoSuchPolicy {
            name: "week".into()
        }
    );
}

#[test]
fn a_snapshot_restores_to_an_equal_state_that_serializes_identically() {
    let mut state = MetadataState::new();
    let (ranges, segments) = create(&mut state, "t", 4);
    roll(&mut state, "t", segments[0], 3).unwrap();
    split(&mut state, "t", ranges[1], 2).unwrap();
    let bytes = state.snapshot().unwrap();
    let restored = MetadataState::restore(&bytes).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.snapshot().unwrap(), bytes);
}

#[test]
fn a_snapshot_of_another_version_is_refused() {
    let mut bytes = MetadataState::new().snapshot().unwrap();
    bytes[0] = bytes[0].wrapping_add(1);
    assert!(MetadataState::restore(&bytes).is_err());
    assert!(MetadataState::restore(&[]).is_err());
}

#[test]
fn a_truncated_snapshot_is_refused() {
    let mut state = MetadataState::new();
    create(&mut state, "t", 2);
    let mut bytes = state.snapshot().unwrap();
    bytes.truncate(bytes.len() / 2);
    assert!(MetadataState::restore(&bytes).is_err());
}

/// A split or merge logged before commands named their frozen segments
/// still decodes (the fields are last and defaulted), and replays as it
/// did: it seals the range's newest segment.
#[test]
fn a_split_logged_before_it_named_its_segment_decodes_and_seals_the_newest() {
    let cmd = Command::SplitRange {
        topic: "t".into(),
        range: RangeId(0),
        seal: seal(2),
        lower_replicas: nodes(&[1]),
        upper_replicas: nodes(&[2]),
        at_ms: 20,
        segment: None,
    };
    // The old encoding: the same array without its last element (a nil).
    let mut old = rmp_serde::to_vec(&cmd).unwrap();
    assert_eq!(
        old.pop(),
        Some(0xc0),
        "the new field is encoded last, as nil"
    );
    let header = old.iter().position(|b| *b == 0x97).unwrap();
    old[header] = 0x96;
    let decoded: Command = rmp_serde::from_slice(&old).unwrap();
    assert_eq!(decoded, cmd);
    let mut state = MetadataState::new();
    let (_, segments) = create(&mut state, "t", 1);
    state.apply(decoded).unwrap();
    assert_eq!(state.segment(segments[0]).unwrap().seal(), Some(seal(2)));
}
