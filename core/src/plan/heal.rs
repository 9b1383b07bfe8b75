//! What to heal, decided from the metadata and who looks failed: the
//! active segments to fail over or roll onto a full set
//! (`failover_candidates`), the sealed ones to give a new copy
//! (`heal_candidates`), and the active ones stranded on a down broker.
//! Pure: `orders.rs` gathers the inputs and hands the results on.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{MetadataState, NodeId, SegmentId, SegmentState};

/// The active segments of `state` placed on a broker outside `live` (dead
/// by membership, or never a member): their records are unavailable until
/// that broker returns. What the coordinator's upkeep reports today; healing
/// (moving them) needs data-plane replication.
pub fn stranded_segments(
    state: &MetadataState,
    live: &BTreeSet<u64>,
) -> Vec<(String, SegmentId, NodeId)> {
    let mut stranded = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active {
                continue;
            }
            for node in &segment.replicas {
                if !live.contains(&node.0) {
                    stranded.push((topic.name.clone(), segment.id, *node));
                }
            }
        }
    }
    stranded
}

/// The segments to fail over: the newest segment of each active range,
/// still active, with more than one copy, whose primary `failed` says is
/// gone (an unreplicated segment has no other copy to go on from).
pub fn failover_candidates(
    state: &MetadataState,
    failed: &dyn Fn(u64) -> bool,
    gone: &dyn Fn(u64) -> bool,
    restore: &Restore,
) -> Vec<super::Candidate> {
    let mut out = Vec::new();
    for topic in state.topics() {
        let wanted = wanted_copies(state, &topic.name);
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active {
                continue;
            }
            let Some(primary) = segment.replicas.first() else {
                continue;
            };
            // An active segment with fewer copies than the topic's others
            // (a failover left it short of brokers), whose primary is
            // sound, rolls onto a full set once the live brokers can hold
            // one: NorthGuard's way, segments are cheap. Not before it is
            // `restore.after_ms` old, so a broker that comes and goes
            // costs a roll at most that often.
            let short = segment.replicas.len() < wanted
                && restore.placeable >= wanted
                && !failed(primary.0)
                && restore.now_ms.saturating_sub(segment.created_at_ms) >= restore.after_ms;
            if segment.replicas.len() < 2 && !short {
                continue;
            }
            // The primary failed, or a follower has been gone past
            // `replace_after_ms`: sealing and rolling onto a full replica
            // set restores full replication of the active tail.
            let follower_gone = segment.replicas.iter().skip(1).any(|n| gone(n.0));
            if !failed(primary.0) && !follower_gone && !short {
                continue;
            }
            out.push(super::Candidate {
                topic: topic.name.clone(),
                segment: segment.id,
                failed: segment
                    .replicas
                    .iter()
                    .map(|n| n.0)
                    .filter(|n| failed(*n) || gone(*n))
                    .collect(),
            });
        }
    }
    out
}

/// When an active segment short of copies rolls onto a full set
/// (`failover_candidates`).
#[derive(Debug, Clone, Copy)]
pub struct Restore {
    /// Live brokers that may take a new copy (not failed, full or leaving).
    pub placeable: usize,
    pub now_ms: u64,
    /// The least age of a short segment that rolls.
    pub after_ms: u64,
}

/// How long a short active segment lives before it rolls onto a full set:
/// a bound on how often a broker that comes and goes makes a range roll,
/// not a wait for anything. At 10 s, a successor left on two copies by a
/// failover kept them for 10 s after the third broker was back, and
/// losing one more copy then stopped writes (chaos F4); now the factor
/// comes back within about a second of the broker's return (ADR 0125).
pub const RESTORE_AFTER_MS: u64 = 1_000;

/// The copies a segment of `topic` should have: the most any of its
/// segments has (the metadata keeps no factor of its own; a failover onto
/// fewer live brokers leaves the earlier segments, healed, at the factor).
pub fn wanted_copies(state: &MetadataState, topic: &str) -> usize {
    state
        .topic(topic)
        .map(|t| {
            t.ranges
                .iter()
                .filter_map(|id| state.range(*id))
                .flat_map(|r| r.segments.iter().filter_map(|id| state.segment(*id)))
                .map(|s| s.replicas.len())
                .max()
                .unwrap_or(1)
        })
        .unwrap_or(1)
        .max(1)
}

/// Heals asked for per upkeep tick at most; the rest wait for later ticks.
const HEAL_CANDIDATES_MAX: usize = 64;

/// The sealed segments the healer should give a new copy, at most
/// [`HEAL_CANDIDATES_MAX`]:
///
/// - first, those with a copy on a broker `gone` (down for longer than
///   `replace_after_ms`, or leaving): the copy is re-created elsewhere
///   (`HealKind::Replace`);
/// - then those with fewer copies than their topic's factor
///   (`wanted_copies`), which a failover placed on the brokers it could
///   reach: a copy is added (`HealKind::Add`, ADR 0117), but only while a
///   `placeable` broker (live, with room, not leaving) holds none, so a
///   cluster still short of brokers asks for nothing the healer cannot do.
///
/// Replacements come first: a copy on a gone broker is a copy lost, a
/// short segment's copies are all there.
pub fn heal_candidates(
    state: &MetadataState,
    gone: &BTreeSet<u64>,
    placeable: &BTreeSet<u64>,
) -> Vec<super::HealCandidate> {
    use super::{HealCandidate, HealKind};
    let mut out = Vec::new();
    let sealed = || {
        state.topics().flat_map(move |topic| {
            topic
                .ranges
                .iter()
                .filter_map(|id| state.range(*id))
                .flat_map(|range| range.segments.iter().filter_map(|id| state.segment(*id)))
                .filter(|segment| segment.seal().is_some())
                .map(move |segment| (topic, segment))
        })
    };
    if !gone.is_empty() {
        for (topic, segment) in sealed() {
            if let Some(lost) = segment.replicas.iter().find(|n| gone.contains(&n.0)) {
                out.push(HealCandidate {
                    topic: topic.name.clone(),
                    segment: segment.id,
                    kind: HealKind::Replace { lost: lost.0 },
                    gone: gone.clone(),
                });
                if out.len() >= HEAL_CANDIDATES_MAX {
                    return out;
                }
            }
        }
    }
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for (topic, segment) in sealed() {
        let factor = *wanted
            .entry(topic.name.as_str())
            .or_insert_with(|| wanted_copies(state, &topic.name));
        let short = segment.replicas.len() < factor;
        // A copy on a gone broker is replaced first (above); the set is
        // judged short again once that is done.
        let losing = segment.replicas.iter().any(|n| gone.contains(&n.0));
        let room = placeable
            .iter()
            .any(|n| !segment.replicas.iter().any(|r| r.0 == *n));
        if short && !losing && room {
            out.push(HealCandidate {
                topic: topic.name.clone(),
                segment: segment.id,
                kind: HealKind::Add,
                gone: gone.clone(),
            });
            if out.len() >= HEAL_CANDIDATES_MAX {
                return out;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::model::{Command, NodeId, SealRecord};

    use super::*;
    use crate::plan::HealKind;
    use crate::plan::fixture::{create, create_replicated, roll_onto};

    const NO_RESTORE: Restore = Restore {
        placeable: 0,
        now_ms: 0,
        after_ms: u64::MAX,
    };

    #[test]
    fn a_segment_left_short_of_copies_rolls_onto_a_full_set_once_brokers_can_hold_one() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let first = state
            .active_ranges("t")
            .next()
            .unwrap()
            .last_segment()
            .unwrap();
        // A failover left the successor on two brokers.
        state
            .apply(Command::RollSegment {
                topic: "t".into(),
                segment: first,
                seal: SealRecord {
                    length: 5,
                    bytes: 50,
                },
                next_replicas: vec![NodeId(2), NodeId(3)],
                at_ms: 1_000,
            })
            .unwrap();
        assert_eq!(wanted_copies(&state, "t"), 3);
        let nobody = |_: u64| false;
        let restore = |placeable: usize, now_ms: u64| Restore {
            placeable,
            now_ms,
            after_ms: RESTORE_AFTER_MS,
        };
        // Two brokers can hold copies: nothing to gain.
        assert!(failover_candidates(&state, &nobody, &nobody, &restore(2, 60_000)).is_empty());
        // Three can, but the segment is younger than the bound: not yet.
        assert!(failover_candidates(&state, &nobody, &nobody, &restore(3, 1_500)).is_empty());
        // A second after its start it rolls (ADR 0125; it was 10 s).
        assert_eq!(
            failover_candidates(&state, &nobody, &nobody, &restore(3, 2_000)).len(),
            1
        );
        // Three can and it is old enough: it rolls, nobody failed.
        let found = failover_candidates(&state, &nobody, &nobody, &restore(3, 60_000));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].failed.is_empty());
        // Its primary failed: the failover's own rule applies instead.
        let two = |node: u64| node == 2;
        let found = failover_candidates(&state, &two, &nobody, &restore(3, 60_000));
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // An unreplicated topic never wants more.
        create_replicated(&mut state, "one", &[1]);
        assert_eq!(wanted_copies(&state, "one"), 1);
    }

    #[test]
    fn only_the_newest_active_replicated_segment_of_a_failed_primary_fails_over() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "led-by-two", &[2, 1, 3]);
        create_replicated(&mut state, "led-by-one", &[1, 2, 3]);
        create_replicated(&mut state, "alone-on-two", &[2]);
        let failed = |node: u64| node == 2;
        let none = |_: u64| false;
        let found = failover_candidates(&state, &failed, &none, &NO_RESTORE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].topic, "led-by-two");
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // Once rolled, the sealed segment is not a candidate; its successor
        // (led by 1) is not either.
        let segment = found[0].segment;
        state
            .apply(Command::RollSegment {
                topic: "led-by-two".into(),
                segment,
                seal: SealRecord {
                    length: 0,
                    bytes: 0,
                },
                next_replicas: vec![NodeId(1), NodeId(3)],
                at_ms: 2,
            })
            .unwrap();
        assert!(failover_candidates(&state, &failed, &none, &NO_RESTORE).is_empty());
        let nobody = |_: u64| false;
        assert!(failover_candidates(&state, &nobody, &none, &NO_RESTORE).is_empty());
        // A follower gone past the bound: "led-by-one" (1, 2, 3) rolls onto
        // a full set, with 2 among the failed.
        let gone_two = |node: u64| node == 2;
        let found = failover_candidates(&state, &nobody, &gone_two, &NO_RESTORE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].topic, "led-by-one");
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // The sealed segment of "led-by-two" held a copy on 2: healed.
        let heals = heal_candidates(&state, &BTreeSet::from([2]), &BTreeSet::new());
        assert_eq!(heals.len(), 1, "{heals:?}");
        assert_eq!(
            (heals[0].segment, heals[0].kind),
            (segment, HealKind::Replace { lost: 2 })
        );
        assert!(heal_candidates(&state, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }

    fn kinds(heals: &[crate::plan::HealCandidate]) -> Vec<(SegmentId, HealKind)> {
        heals.iter().map(|h| (h.segment, h.kind)).collect()
    }

    #[test]
    fn a_sealed_segment_a_failover_left_short_gets_a_copy_added_regression_f1() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        // A failover placed the successor on the two brokers it reached;
        // later the short segment rolled onto a full set (`Restore`).
        let full = roll_onto(&mut state, "t", &[2, 1]);
        let short = roll_onto(&mut state, "t", &[1, 2, 3]);
        let everyone = BTreeSet::from([1, 2, 3]);
        let heals = heal_candidates(&state, &BTreeSet::new(), &everyone);
        // The short sealed segment, not the sealed one at the factor nor
        // the active one.
        assert_eq!(kinds(&heals), vec![(short, HealKind::Add)]);
        assert_ne!(short, full);
        assert_eq!(heals[0].topic, "t");
    }

    #[test]
    fn a_short_sealed_segment_waits_for_a_broker_that_can_take_a_copy() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        roll_onto(&mut state, "t", &[2, 1]);
        roll_onto(&mut state, "t", &[1, 2, 3]);
        // Broker 3 is down, full or leaving: the holders are all there is.
        let holders = BTreeSet::from([1, 2]);
        assert!(heal_candidates(&state, &BTreeSet::new(), &holders).is_empty());
        assert!(heal_candidates(&state, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn an_active_segment_short_of_the_factor_is_not_a_heal_candidate() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let full = roll_onto(&mut state, "t", &[2, 1]);
        // The active [2, 1] is the failover's (`Restore` rolls it); the
        // sealed one holds its three copies.
        let everyone = BTreeSet::from([1, 2, 3, 4]);
        assert!(heal_candidates(&state, &BTreeSet::new(), &everyone).is_empty());
        assert_eq!(state.segment(full).unwrap().replicas.len(), 3);
    }

    #[test]
    fn a_copy_on_a_gone_broker_is_replaced_before_any_copy_is_added() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let full = roll_onto(&mut state, "t", &[2, 1]);
        let short = roll_onto(&mut state, "t", &[1, 2, 3]);
        let gone = BTreeSet::from([1]);
        // Both sealed segments hold a copy on gone broker 1: each replaced,
        // the short one not added to until that is done.
        let heals = heal_candidates(&state, &gone, &BTreeSet::from([2, 3, 4]));
        assert_eq!(
            kinds(&heals),
            vec![
                (full, HealKind::Replace { lost: 1 }),
                (short, HealKind::Replace { lost: 1 })
            ]
        );
        // A gone broker holding no copy of the short one: it is added to.
        let gone = BTreeSet::from([3]);
        let heals = heal_candidates(&state, &gone, &BTreeSet::from([1, 2, 4]));
        assert_eq!(
            kinds(&heals),
            vec![
                (full, HealKind::Replace { lost: 3 }),
                (short, HealKind::Add)
            ]
        );
    }

    #[test]
    fn heal_candidates_stop_at_their_bound() {
        let mut state = MetadataState::new();
        for t in 0..HEAL_CANDIDATES_MAX + 5 {
            let topic = format!("t{t}");
            create_replicated(&mut state, &topic, &[1, 2, 3]);
            roll_onto(&mut state, &topic, &[2, 1]);
            roll_onto(&mut state, &topic, &[1, 2, 3]);
        }
        let heals = heal_candidates(&state, &BTreeSet::new(), &BTreeSet::from([1, 2, 3]));
        assert_eq!(heals.len(), HEAL_CANDIDATES_MAX);
        assert!(heals.iter().all(|h| h.kind == HealKind::Add));
    }

    #[test]
    fn segments_on_brokers_outside_the_live_set_are_stranded() {
        let mut state = MetadataState::new();
        create(&mut state, "on-one", 1);
        create(&mut state, "on-two", 2);
        let live: BTreeSet<u64> = [1, 3].into();
        let stranded = stranded_segments(&state, &live);
        assert_eq!(stranded.len(), 1);
        assert_eq!(stranded[0].0, "on-two");
        assert_eq!(stranded[0].2, NodeId(2));
        let everyone: BTreeSet<u64> = [1, 2].into();
        assert!(stranded_segments(&state, &everyone).is_empty());
    }
}
