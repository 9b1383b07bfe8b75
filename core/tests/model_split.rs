//! The model's side of a vnode split (fence, seed, narrow), of the ring's
//! group (begin, commit, finish, abort) and of coordinator leases: each
//! command validates before it mutates, refuses with a typed error and is
//! idempotent where a resumed split repeats it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_core::model::{
    Command, MetadataState, ModelError, NodeId, Outcome, RingArc, SealRecord, ring_position,
};
use malachi_core::ring::{Ring, VnodeId};
use proptest::prelude::*;

/// A vnode owning `arc` with the given topics.
fn vnode(arc: RingArc, topics: &[String]) -> MetadataState {
    let mut state = MetadataState::new();
    state.apply(Command::AssignArc { arc, id_base: 0 }).unwrap();
    for t in topics {
        state.apply(create(t)).unwrap();
    }
    state
}

fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("topic-{i}")).collect()
}

#[test]
fn a_fence_refuses_the_moving_half_as_moved_and_serves_the_rest() {
    let topics = names(40);
    let mut state = vnode(RingArc::FULL, &topics);
    let (lower, upper) = RingArc::FULL.halves().unwrap();
    assert_eq!(
        state.apply(Command::FenceArc { moving: upper }),
        Ok(Outcome::ArcFenced)
    );
    // The same fence again is a no-op; another one is refused.
    assert_eq!(
        state.apply(Command::FenceArc { moving: upper }),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(
        state.apply(Command::FenceArc { moving: lower }),
        Err(ModelError::FenceInPlace { fence: upper })
    );
    let before = state.clone();
    for t in &topics {
        let verdict = state.apply(Command::SealTopic {
            topic: t.clone(),
            at_ms: 9,
        });
        if upper.holds_topic(t) {
            assert_eq!(
                verdict,
                Err(ModelError::Moved {
                    topic: t.clone(),
                    arc: upper
                })
            );
            assert!(verdict.unwrap_err().is_misrouted());
            assert_eq!(
                state.topic(t),
                before.topic(t),
                "a refused command changed {t}"
            );
        } else {
            assert!(verdict.is_ok(), "{t}: {verdict:?}");
        }
    }
    // A fence that is not a part of the arc sharing an end is refused.
    let mut fresh = vnode(lower, &[]);
    assert!(matches!(
        fresh.apply(Command::FenceArc { moving: upper }),
        Err(ModelError::FenceOutsideArc { .. })
    ));
    assert!(matches!(
        fresh.apply(Command::FenceArc { moving: lower }),
        Err(ModelError::FenceOutsideArc { .. })
    ));
    // Lifting it rolls the split back.
    assert_eq!(
        state.apply(Command::LiftFence { moving: upper }),
        Ok(Outcome::FenceLifted)
    );
    assert_eq!(
        state.apply(Command::LiftFence { moving: upper }),
        Ok(Outcome::Unchanged)
    );
    let moved = topics.iter().find(|t| upper.holds_topic(t)).unwrap();
    assert!(
        state
            .apply(Command::SealTopic {
                topic: moved.clone(),
                at_ms: 10
            })
            .is_ok()
    );
}

#[test]
fn seed_and_narrow_move_exactly_the_upper_topics_and_repeat_as_no_ops() {
    let topics = names(60);
    let mut parent = vnode(RingArc::FULL, &topics);
    // Reshape one moved topic so ranges, segments and seals travel too.
    let moved = topics
        .iter()
        .find(|t| ring_position(t) >= 1 << 63)
        .unwrap()
        .clone();
    let range = parent.topic(&moved).unwrap().ranges[0];
    parent
        .apply(Command::SplitRange {
            topic: moved.clone(),
            range,
            seal: SealRecord {
                length: 7,
                bytes: 70,
            },
            lower_replicas: vec![NodeId(3)],
            upper_replicas: vec![NodeId(1)],
            at_ms: 6,
            segment: None,
        })
        .unwrap();
    let original = parent.clone();
    let (lower, upper) = RingArc::FULL.halves().unwrap();
    let child_base = VnodeId(1).id_base();
    parent.apply(Command::FenceArc { moving: upper }).unwrap();
    let seed = parent.export_arc(upper, child_base);

    let mut child = MetadataState::new();
    let seed_cmd = Command::SeedVnode {
        seed: Box::new(seed.clone()),
    };
    assert_eq!(child.apply(seed_cmd.clone()), Ok(Outcome::VnodeSeeded));
    assert_eq!(child.apply(seed_cmd.clone()), Ok(Outcome::Unchanged));
    assert_eq!(child.arc(), Some(upper));

    let narrowed = parent.apply(Command::NarrowArc { keep: lower }).unwrap();
    let Outcome::ArcNarrowed { dropped } = narrowed else {
        panic!("{narrowed:?}")
    };
    assert!(dropped.contains(&moved));
    assert_eq!(
        parent.apply(Command::NarrowArc { keep: lower }),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(parent.arc(), Some(lower));
    assert_eq!(parent.fence(), None);

    // Every topic lives on exactly one side, described as before.
    for t in &topics {
        let (here, there) = if upper.holds_topic(t) {
            (&child, &parent)
        } else {
            (&parent, &child)
        };
        assert_eq!(here.describe_topic(t), original.describe_topic(t), "{t}");
        assert_eq!(there.describe_topic(t), None, "{t} is on both sides");
    }
    assert_eq!(
        dropped.len(),
        topics.iter().filter(|t| upper.holds_topic(t)).count()
    );
    parent.check_invariants().unwrap();
    child.check_invariants().unwrap();

    // The child issues ids from its own block and never reuses an incarnation.
    let new = (0..)
        .map(|i| format!("new-{i}"))
        .find(|t| upper.holds_topic(t))
        .unwrap();
    let Ok(Outcome::TopicCreated {
        incarnation,
        ranges,
        segments,
    }) = child.apply(create(&new))
    else {
        panic!("the child refused a topic in its arc")
    };
    assert!(ranges.iter().all(|r| r.0 >= child_base));
    assert!(segments.iter().all(|s| s.0 >= child_base));
    assert!(original.topics().all(|t| t.incarnation.0 < incarnation.0));
    // Each half refuses topics outside its new arc.
    let low_topic = topics.iter().find(|t| lower.holds_topic(t)).unwrap();
    assert!(matches!(
        child.apply(Command::DeleteTopic {
            topic: low_topic.clone()
        }),
        Err(ModelError::WrongVnode { .. })
    ));
    assert!(matches!(
        parent.apply(create(&new)),
        Err(ModelError::WrongVnode { .. })
    ));
    // A seed into a vnode that holds metadata is refused.
    assert!(matches!(
        parent.apply(seed_cmd),
        Err(ModelError::InvalidSeed { .. })
    ));
}

#[test]
fn narrowing_without_a_fence_is_refused() {
    let topics = names(10);
    let mut state = vnode(RingArc::FULL, &topics);
    let (lower, _) = RingArc::FULL.halves().unwrap();
    let before = state.clone();
    assert_eq!(
        state.apply(Command::NarrowArc { keep: lower }),
        Err(ModelError::NotFenced { keep: lower })
    );
    assert_eq!(state, before);
}

#[test]
fn a_seed_with_a_topic_outside_its_arc_is_refused() {
    let topics = names(20);
    let state = vnode(RingArc::FULL, &topics);
    let (lower, upper) = RingArc::FULL.halves().unwrap();
    let mut seed = state.export_arc(upper, 0);
    let foreign = state.export_arc(lower, 0);
    seed.topics.extend(foreign.topics);
    let mut child = MetadataState::new();
    assert!(matches!(
        child.apply(Command::SeedVnode {
            seed: Box::new(seed)
        }),
        Err(ModelError::InvalidSeed { .. })
    ));
    assert_eq!(child, MetadataState::new());
}

#[test]
fn the_ring_group_runs_one_split_at_a_time_and_repeats_each_step_safely() {
    let mut state = MetadataState::new();
    assert_eq!(
        state.apply(Command::BeginSplit { parent: VnodeId(0) }),
        Err(ModelError::NoRing)
    );
    assert_eq!(
        state.apply(Command::InitRing { vnodes: 4 }),
        Ok(Outcome::RingChanged { version: 1 })
    );
    assert_eq!(
        state.apply(Command::InitRing { vnodes: 8 }),
        Ok(Outcome::RingChanged { version: 1 })
    );
    let Ok(Outcome::SplitBegun { split }) = state.apply(Command::BeginSplit { parent: VnodeId(2) })
    else {
        panic!()
    };
    assert_eq!(split.child, VnodeId(4));
    let mut expected = Ring::new(4).unwrap();
    let made = expected.split(VnodeId(2)).unwrap();
    assert_eq!(made.arc, split.upper);
    // Resuming returns the same split; another parent waits.
    assert_eq!(
        state.apply(Command::BeginSplit { parent: VnodeId(2) }),
        Ok(Outcome::SplitBegun { split })
    );
    assert_eq!(
        state.apply(Command::BeginSplit { parent: VnodeId(1) }),
        Err(ModelError::SplitInProgress {
            parent: VnodeId(2),
            child: VnodeId(4)
        })
    );
    // The ring does not change until the commit.
    assert_eq!(state.ring_record().unwrap().ring.version(), 1);
    assert_eq!(
        state.apply(Command::FinishSplit {
            parent: VnodeId(2),
            child: VnodeId(4)
        }),
        Err(ModelError::SplitNotCommitted {
            parent: VnodeId(2),
            child: VnodeId(4)
        })
    );
    assert_eq!(
        state.apply(Command::CommitSplit {
            parent: VnodeId(2),
            child: VnodeId(4)
        }),
        Ok(Outcome::RingChanged { version: 2 })
    );
    assert_eq!(
        state.apply(Command::CommitSplit {
            parent: VnodeId(2),
            child: VnodeId(4)
        }),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(state.ring_record().unwrap().ring, expected);
    assert_eq!(
        state.apply(Command::AbortSplit {
            parent: VnodeId(2),
            child: VnodeId(4)
        }),
        Err(ModelError::SplitCommitted {
            parent: VnodeId(2),
            child: VnodeId(4)
        })
    );
    for _ in 0..2 {
        assert!(
            state
                .apply(Command::FinishSplit {
                    parent: VnodeId(2),
                    child: VnodeId(4)
                })
                .is_ok()
        );
    }
    assert_eq!(state.ring_record().unwrap().pending, None);
    // An uncommitted split can be aborted, and the next takes the same id.
    let Ok(Outcome::SplitBegun { split }) = state.apply(Command::BeginSplit { parent: VnodeId(0) })
    else {
        panic!()
    };
    assert_eq!(
        state.apply(Command::AbortSplit {
            parent: VnodeId(0),
            child: split.child
        }),
        Ok(Outcome::SplitAborted)
    );
    let Ok(Outcome::SplitBegun { split: again }) =
        state.apply(Command::BeginSplit { parent: VnodeId(1) })
    else {
        panic!()
    };
    // An aborted split's id is never reused: its group may exist.
    assert_eq!(again.child, VnodeId(split.child.0 + 1));
    let bytes = state.snapshot().unwrap();
    assert_eq!(MetadataState::restore(&bytes).unwrap(), state);
}

fn acquire(holder: u64, at_ms: u64, waited_for: Option<u64>) -> Command {
    Command::AcquireLeaseWaited {
        holder,
        duration_ms: 1_000,
        at_ms,
        waited_for,
    }
}

/// The generation a refusal reports (what a waiter observes).
fn held_generation(answer: Result<Outcome, ModelError>) -> u64 {
    match answer {
        Err(ModelError::LeaseHeld { generation, .. }) => generation,
        other => panic!("not refused as held: {other:?}"),
    }
}

#[test]
fn another_holder_takes_the_lease_only_after_waiting_out_its_current_generation() {
    let mut state = MetadataState::new();
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(1, 100, None)) else {
        panic!()
    };
    assert_eq!((lease.holder, lease.epoch, lease.generation), (1, 1, 1));
    // The commands' times decide nothing: long past the stamps' expiry,
    // another holder that did not wait is refused, and told what it saw.
    assert_eq!(
        state.apply(acquire(2, 1_000_000, None)),
        Err(ModelError::LeaseHeld {
            holder: 1,
            expires_at_ms: 1_100,
            generation: 1,
            duration_ms: 1_000,
        })
    );
    // A renewal keeps the epoch and raises the generation, even stamped
    // long before the grant (a wall clock that jumped back).
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(1, 5, None)) else {
        panic!()
    };
    assert_eq!((lease.epoch, lease.generation), (1, 2));
    // A wait on a generation the holder has since renewed past is stale.
    assert_eq!(held_generation(state.apply(acquire(2, 0, Some(1)))), 2);
    assert_eq!(held_generation(state.apply(acquire(2, 0, Some(3)))), 2);
    // Waiting out the current one takes it: a new epoch.
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(2, 0, Some(2))) else {
        panic!()
    };
    assert_eq!((lease.holder, lease.epoch, lease.generation), (2, 2, 3));
    // The old holder cannot take it back without waiting in turn.
    assert_eq!(held_generation(state.apply(acquire(1, 9_999_999, None))), 3);
    assert_eq!(held_generation(state.apply(acquire(1, 0, Some(2)))), 3);
    let bytes = state.snapshot().unwrap();
    assert_eq!(MetadataState::restore(&bytes).unwrap(), state);
}

#[test]
fn a_released_lease_passes_on_at_once_and_a_stale_release_does_nothing() {
    let mut state = MetadataState::new();
    state.apply(acquire(1, 100, None)).unwrap();
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(2, 0, Some(1))) else {
        panic!()
    };
    assert_eq!((lease.holder, lease.epoch), (2, 2));
    assert_eq!(
        state.apply(Command::ReleaseLease {
            holder: 1,
            epoch: 2
        }),
        Ok(Outcome::Unchanged)
    );
    assert_eq!(
        state.apply(Command::ReleaseLease {
            holder: 2,
            epoch: 2
        }),
        Ok(Outcome::LeaseReleased)
    );
    // No wait after a release, whatever the times.
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(1, 0, None)) else {
        panic!()
    };
    assert_eq!((lease.holder, lease.epoch), (1, 3));
    // The same holder after a release takes a new epoch too.
    state
        .apply(Command::ReleaseLease {
            holder: 1,
            epoch: 3,
        })
        .unwrap();
    let Ok(Outcome::LeaseGranted { lease }) = state.apply(acquire(1, 0, None)) else {
        panic!()
    };
    assert_eq!((lease.holder, lease.epoch), (1, 4));
    assert!(matches!(
        state.apply(Command::AcquireLeaseWaited {
            holder: 1,
            duration_ms: 0,
            at_ms: 1,
            waited_for: None,
        }),
        Err(ModelError::InvalidLease { .. })
    ));
}

/// Chaos finding F11, the stricter fix: a release naming a generation the
/// lease has since been renewed past (by a later keeper of the same
/// holder, which keeps the epoch) changes nothing.
#[test]
fn a_release_naming_a_generation_renewed_since_does_nothing() {
    let mut state = MetadataState::new();
    let Ok(Outcome::LeaseGranted { lease: first }) = state.apply(acquire(1, 100, None)) else {
        panic!()
    };
    // The same holder renews (a next keeper): same epoch, next generation.
    let Ok(Outcome::LeaseGranted { lease: renewed }) = state.apply(acquire(1, 200, None)) else {
        panic!()
    };
    assert_eq!(renewed.epoch, first.epoch);
    assert_eq!(renewed.generation, first.generation + 1);
    // The earlier keeper's late release names the generation it saw.
    let late = Command::ReleaseLeaseGeneration {
        holder: 1,
        epoch: first.epoch,
        generation: first.generation,
    };
    assert_eq!(state.apply(late), Ok(Outcome::Unchanged));
    assert!(!state.lease().unwrap().is_released());
    // Another holder is still refused.
    assert_eq!(
        held_generation(state.apply(acquire(2, 0, None))),
        renewed.generation
    );
    // Another holder's, or another epoch's, release does nothing either.
    for (holder, epoch) in [(2, renewed.epoch), (1, renewed.epoch + 1)] {
        let other = Command::ReleaseLeaseGeneration {
            holder,
            epoch,
            generation: renewed.generation,
        };
        assert_eq!(state.apply(other), Ok(Outcome::Unchanged));
    }
    // The release naming the current generation frees it.
    let current = Command::ReleaseLeaseGeneration {
        holder: 1,
        epoch: renewed.epoch,
        generation: renewed.generation,
    };
    assert_eq!(state.apply(current), Ok(Outcome::LeaseReleased));
    let released = state.lease().unwrap();
    assert!(released.is_released());
    assert_eq!(
        (released.epoch, released.generation),
        (renewed.epoch, renewed.generation)
    );
    let bytes = state.snapshot().unwrap();
    assert_eq!(MetadataState::restore(&bytes).unwrap(), state);
}

/// Without the feature, the release names no generation: the old rule,
/// which releases whatever grant of that holder and epoch is current.
#[test]
fn a_release_naming_no_generation_keeps_the_old_rule() {
    let mut state = MetadataState::new();
    let Ok(Outcome::LeaseGranted { lease: first }) = state.apply(acquire(1, 100, None)) else {
        panic!()
    };
    state.apply(acquire(1, 200, None)).unwrap();
    let old_form = Command::ReleaseLease {
        holder: 1,
        epoch: first.epoch,
    };
    assert_eq!(state.apply(old_form), Ok(Outcome::LeaseReleased));
    assert!(state.lease().unwrap().is_released());
}

/// Both release forms survive the log's encoding, each as itself.
#[test]
fn both_release_forms_round_trip_through_the_log_encoding() {
    for cmd in [
        Command::ReleaseLease {
            holder: 3,
            epoch: 4,
        },
        Command::ReleaseLeaseGeneration {
            holder: 3,
            epoch: 4,
            generation: 5,
        },
    ] {
        let bytes = rmp_serde::to_vec(&cmd).unwrap();
        let back: Command = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, cmd);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Fence, export, seed and narrow at any vnode split point keep every
    /// topic, described as before, on exactly one side.
    #[test]
    fn a_split_at_any_arc_keeps_every_topic_on_exactly_one_side(
        count in 1usize..40,
        vnodes in 1u32..9,
        pick in 0u32..8,
        seed_salt in 0u64..1000,
    ) {
        let ring = Ring::new(vnodes).unwrap();
        let parent_id = VnodeId(pick % vnodes);
        let arc = ring.vnode(parent_id).unwrap().arc;
        let topics: Vec<String> = (0..)
            .map(|i| format!("t{seed_salt}-{i}"))
            .filter(|t| arc.holds_topic(t))
            .take(count)
            .collect();
        let mut parent = vnode(arc, &topics);
        let original = parent.clone();
        let (lower, upper) = arc.halves().unwrap();
        parent.apply(Command::FenceArc { moving: upper }).unwrap();
        let seed = parent.export_arc(upper, VnodeId(vnodes).id_base());
        let mut child = MetadataState::new();
        child.apply(Command::SeedVnode { seed: Box::new(seed) }).unwrap();
        parent.apply(Command::NarrowArc { keep: lower }).unwrap();
        for t in &topics {
            let on_parent = parent.describe_topic(t);
            let on_child = child.describe_topic(t);
            prop_assert!(on_parent.is_some() != on_child.is_some());
            prop_assert_eq!(on_parent.or(on_child), original.describe_topic(t));
        }
        prop_assert!(parent.check_invariants().is_ok());
        prop_assert!(child.check_invariants().is_ok());
    }
}

// ------------------------------------------- a split among topic commands

/// What a client does, or the split's next step.
#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Seal(usize),
    Delete(usize),
    SplitFirstRange(usize),
    /// Fence, then seed, then commit the ring, then narrow: one step each.
    Advance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..12).prop_map(Op::Create),
        1 => (0usize..12).prop_map(Op::Seal),
        1 => (0usize..12).prop_map(Op::Delete),
        2 => (0usize..12).prop_map(Op::SplitFirstRange),
        1 => Just(Op::Advance),
    ]
}

/// A segment's start, state and sealed length.
type SegmentShape = (u64, String, Option<u64>);
/// A range's band, state and segments.
type RangeShape = (String, String, String, Vec<SegmentShape>);
/// A topic's state and ranges.
type TopicShape = (String, Vec<RangeShape>);

/// A topic's description without its ids and incarnation, which the two
/// halves and a single reference vnode issue from different counters.
fn shape(d: Option<malachi_core::model::TopicDescription>) -> Option<TopicShape> {
    d.map(|d| {
        let ranges = d
            .ranges
            .into_iter()
            .map(|r| {
                let segments = r
                    .segments
                    .into_iter()
                    .map(|s| (s.start_offset, s.state, s.length))
                    .collect();
                (r.band_start, r.band_end, r.state, segments)
            })
            .collect();
        (d.state, ranges)
    })
}

/// The command `op` makes for `topic` against `state` (the first active
/// range is looked up in the state it is sent to).
fn command_for(op: &Op, topic: &str, state: &MetadataState) -> Command {
    match op {
        Op::Create(_) => create(topic),
        Op::Seal(_) => Command::SealTopic {
            topic: topic.to_owned(),
            at_ms: 7,
        },
        Op::Delete(_) => Command::DeleteTopic {
            topic: topic.to_owned(),
        },
        _ => {
            let range = state
                .active_ranges(topic)
                .next()
                .map_or(malachi_core::model::RangeId(u64::MAX), |r| r.id);
            Command::SplitRange {
                topic: topic.to_owned(),
                range,
                seal: SealRecord {
                    length: 3,
                    bytes: 30,
                },
                lower_replicas: vec![NodeId(1)],
                upper_replicas: vec![NodeId(2)],
                at_ms: 8,
                segment: None,
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Topic commands interleaved with a split's steps, routed the way the
    /// router does: every acknowledged command is in exactly the vnode the
    /// ring (once committed) names, shaped as a single vnode that applied
    /// the same acknowledged commands would hold it, and a command refused
    /// as `Moved` changes nothing anywhere.
    #[test]
    fn a_split_among_topic_commands_loses_nothing_acknowledged(ops in proptest::collection::vec(op(), 1..80)) {
        let arc = RingArc::FULL;
        let (lower, upper) = arc.halves().unwrap();
        let names: Vec<String> = topics_in_both(6);
        let mut parent = vnode(arc, &[]);
        let mut child = MetadataState::new();
        let mut reference = MetadataState::new();
        let mut phase = 0u8; // 0 none, 1 fenced, 2 seeded, 3 ring committed, 4 narrowed
        for op in &ops {
            let topic = match op {
                Op::Advance => {
                    match phase {
                        0 => prop_assert_eq!(parent.apply(Command::FenceArc { moving: upper }), Ok(Outcome::ArcFenced)),
                        1 => {
                            let seed = parent.export_arc(upper, 1 << 40);
                            prop_assert_eq!(child.apply(Command::SeedVnode { seed: Box::new(seed) }), Ok(Outcome::VnodeSeeded));
                        }
                        2 => {}
                        3 => {
                            let narrowed = parent.apply(Command::NarrowArc { keep: lower });
                            prop_assert!(narrowed.is_ok(), "{:?}", narrowed);
                        }
                        _ => {}
                    }
                    phase = (phase + 1).min(4);
                    continue;
                }
                Op::Create(i) | Op::Seal(i) | Op::Delete(i) | Op::SplitFirstRange(i) => &names[*i % names.len()],
            };
            let to_child = phase >= 3 && upper.holds_topic(topic);
            let routed = if to_child { &mut child } else { &mut parent };
            let before = routed.clone();
            let cmd = command_for(op, topic, routed);
            let verdict = routed.apply(cmd);
            if let Err(ModelError::Moved { .. }) = verdict {
                prop_assert!((1..3).contains(&phase) && upper.holds_topic(topic));
                prop_assert_eq!(&*routed, &before);
                continue;
            }
            let expected = reference.apply(command_for(op, topic, &reference));
            prop_assert_eq!(verdict.is_ok(), expected.is_ok(), "{:?} on {}: {:?} vs {:?}", op, topic, verdict, expected);
        }
        for topic in &names {
            let owner = if phase >= 3 && upper.holds_topic(topic) { &child } else { &parent };
            prop_assert_eq!(shape(owner.describe_topic(topic)), shape(reference.describe_topic(topic)), "{}", topic);
            if phase >= 4 {
                let other = if upper.holds_topic(topic) { &parent } else { &child };
                prop_assert_eq!(other.describe_topic(topic), None);
            }
        }
        prop_assert!(parent.check_invariants().is_ok());
        prop_assert!(child.check_invariants().is_ok());
    }
}

/// `count` topic names in each half of the ring.
fn topics_in_both(count: usize) -> Vec<String> {
    let (lower, upper) = RingArc::FULL.halves().unwrap();
    let low = (0..)
        .map(|i| format!("p-{i}"))
        .filter(|t| lower.holds_topic(t));
    let up = (0..)
        .map(|i| format!("p-{i}"))
        .filter(|t| upper.holds_topic(t));
    low.take(count / 2)
        .chain(up.take(count - count / 2))
        .collect()
}
