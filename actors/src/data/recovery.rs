//! The decisions of a failover (issue 19, ADR 0106) as pure functions of
//! what the copies answered, shared by the failover actor
//! (`maintenance/failover.rs`), the tests and the model checker
//! (`seal_model.rs`): the model runs these very functions, it is not a
//! second description of them.
//!
//! A segment of N copies acknowledges a record once Q = floor(N/2) + 1
//! copies hold it durably (`quorum.rs`). A coordinator that seals the
//! segment without its primary fences copies (each fence is drained before
//! it answers, so a fenced copy's durable end is final) until N − Q + 1 of
//! them answered. Any Q copies and any N − Q + 1 copies share one, so the
//! largest durable end among the answers covers every acknowledged record:
//! that is the seal. Sealing at a smaller end (the smallest, say) could cut
//! acknowledged records off; the model's seeded bug shows the checker
//! catching exactly that.

use super::quorum::quorum;

/// Fence answers a seal needs: enough copies that every quorum shares one
/// with them (`replication.md`, invariant 3).
pub(crate) fn fence_quorum(copies: usize) -> usize {
    copies - quorum(copies) + 1
}

/// One copy's answer to a fence order. Ordered and hashable so the seal
/// model (`seal_model.rs`) can keep answers in its states and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FenceAnswer {
    pub node: u64,
    /// Records durable on the copy after the fence's drain.
    pub durable_end: u64,
    pub durable_bytes: u64,
    /// A seal the copy already carries (length, bytes): placed only at a
    /// recorded seal (a seal order, or the catch-up of a sealed segment).
    pub sealed: Option<(u64, u64)>,
    /// The copy's disk failed: its records count and can be read, but it
    /// takes no repair and cannot be a complete copy.
    pub failed: bool,
}

/// Complete copies (holding every record up to the seal, sound) a seal
/// may be recorded on: N − Q + 1, as many as the fence answers it was
/// decided on (ADR 0125, the seed's "at two replicas, the one left").
///
/// Every acknowledged record is at or below the seal, so each complete
/// copy holds all of them: one would keep them. The bound asks for as many
/// as the decision needed, so that every copy whose answer counted ends
/// complete (the short ones are repaired from the source first), and the
/// records past the last acknowledgement, which the seal makes readable,
/// rest on N − Q + 1 copies. For odd N that is Q, as before; for even N it
/// is one less (1 of 2, 2 of 4): a segment left with Q − 1 live copies can
/// be sealed and its range write again, where requiring Q stopped it until
/// a lost copy came back (chaos finding F4).
pub(crate) fn seal_copies_needed(copies: usize) -> usize {
    fence_quorum(copies)
}

/// What to do with the answers so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SealDecision {
    /// Too few answers to know every acknowledged record is covered.
    Wait { answered: usize, needed: usize },
    /// Seal at `length` records (`bytes` of log); `source` holds them all.
    Seal {
        length: u64,
        bytes: u64,
        source: u64,
    },
    /// Copies carry seals of different lengths: a broken invariant, never
    /// resolved by picking one.
    Conflict { seals: Vec<(u64, u64)> },
}

/// The seal the answers of a segment of `copies` copies decide.
///
/// A seal a copy already carries is adopted: a copy is sealed only at a
/// seal the metadata recorded (a seal order, a recorded seal's catch-up;
/// ADR 0107), so it is the seal, whoever decided it, and a resumed
/// failover never seals a copy at two lengths. A copy's answer counts once
/// however often it repeats.
pub(crate) fn seal_decision(copies: usize, answers: &[FenceAnswer]) -> SealDecision {
    let mut seen: Vec<&FenceAnswer> = Vec::with_capacity(answers.len());
    for answer in answers {
        if !seen.iter().any(|a| a.node == answer.node) {
            seen.push(answer);
        }
    }
    let mut seals: Vec<(u64, u64)> = seen.iter().filter_map(|a| a.sealed).collect();
    seals.sort_unstable();
    seals.dedup();
    if seals.len() > 1 {
        return SealDecision::Conflict { seals };
    }
    if let Some(&(length, bytes)) = seals.first() {
        let source = seen
            .iter()
            .find(|a| a.sealed.is_some())
            .map_or(0, |a| a.node);
        return SealDecision::Seal {
            length,
            bytes,
            source,
        };
    }
    let needed = fence_quorum(copies);
    if seen.len() < needed {
        return SealDecision::Wait {
            answered: seen.len(),
            needed,
        };
    }
    // The largest end; among copies holding it, a sound one (not failed)
    // first, then the lowest node id, so the choice is deterministic.
    let best = seen
        .iter()
        .max_by(|a, b| {
            a.durable_end
                .cmp(&b.durable_end)
                .then(b.failed.cmp(&a.failed))
                .then(b.node.cmp(&a.node))
        })
        .copied();
    match best {
        Some(best) => SealDecision::Seal {
            length: best.durable_end,
            bytes: best.durable_bytes,
            source: best.node,
        },
        None => SealDecision::Wait {
            answered: 0,
            needed,
        },
    }
}

/// Copies that answered, can take repair, and hold fewer than `length`
/// records: the ones to fill from the source before the seal is recorded.
pub(crate) fn short_copies(answers: &[FenceAnswer], length: u64) -> Vec<u64> {
    let mut short: Vec<u64> = answers
        .iter()
        .filter(|a| !a.failed && a.durable_end < length && a.sealed.is_none())
        .map(|a| a.node)
        .collect();
    short.sort_unstable();
    short.dedup();
    short
}

/// Copies that hold every record up to `length` and are sound: a seal may
/// be recorded once [`seal_copies_needed`] of them exist.
pub(crate) fn complete_copies(answers: &[FenceAnswer], length: u64) -> Vec<u64> {
    let mut complete: Vec<u64> = answers
        .iter()
        .filter(|a| !a.failed && a.durable_end >= length)
        .map(|a| a.node)
        .collect();
    complete.sort_unstable();
    complete.dedup();
    complete
}

/// The successor's primary: `preferred` (the coordinator's broker) when it
/// is complete, else the lowest complete copy, never one on a broker in
/// `failed` (a broker whose full volume failed its writer still answers
/// with a complete copy). Never a short copy: the new primary rebuilds its
/// producer table from its copy of the sealed segment, which must hold
/// every record up to the seal.
pub(crate) fn successor_primary(
    complete: &[u64],
    failed: &std::collections::BTreeSet<u64>,
    preferred: u64,
) -> Option<u64> {
    let fit = |n: &u64| !failed.contains(n);
    if complete.contains(&preferred) && fit(&preferred) {
        return Some(preferred);
    }
    complete.iter().copied().filter(fit).min()
}

/// What a probe (replica-status, no fence) found of one copy of a segment
/// the metadata says is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbedCopy {
    pub node: u64,
    pub fenced: bool,
    pub failed: bool,
    pub sealed: bool,
}

/// Whether an active segment's copies show a failover left unfinished (an
/// orphaned fence: a coordinator fenced copies and lost its leadership
/// before recording the seal, while the primary stayed or came back, so no
/// failover trigger fires again) or a copy latched failed. Either way only
/// the coordinator's rule, a failover at its own order, resolves it; a
/// probe itself never fences. `None` when nothing is stuck, else the
/// brokers whose copy failed (the successor goes elsewhere).
pub(crate) fn stuck_copies(copies: &[ProbedCopy]) -> Option<std::collections::BTreeSet<u64>> {
    // A copy sealed while the metadata still says active is a roll being
    // recorded right now: its seal order follows the commit.
    if copies.iter().any(|c| c.sealed) {
        return None;
    }
    copies
        .iter()
        .any(|c| c.fenced || c.failed)
        .then(|| copies.iter().filter(|c| c.failed).map(|c| c.node).collect())
}

/// The segments to fail over after a probe: stuck now and at the probe
/// before (`previous`), at least a probe interval apart, so a roll or a
/// split's freeze in progress (which fences the primary's copy for a
/// moment) is never taken for an orphan.
pub(crate) fn confirmed_stuck(
    previous: &std::collections::BTreeSet<u64>,
    now: &std::collections::BTreeSet<u64>,
) -> Vec<u64> {
    previous.intersection(now).copied().collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn answer(node: u64, durable_end: u64) -> FenceAnswer {
        FenceAnswer {
            node,
            durable_end,
            durable_bytes: durable_end * 10,
            sealed: None,
            failed: false,
        }
    }

    fn probed(node: u64, fenced: bool, failed: bool, sealed: bool) -> ProbedCopy {
        ProbedCopy {
            node,
            fenced,
            failed,
            sealed,
        }
    }

    #[test]
    fn an_active_segment_with_a_fenced_or_failed_copy_is_stuck_unless_a_copy_is_sealed() {
        let healthy = [
            probed(1, false, false, false),
            probed(2, false, false, false),
        ];
        assert_eq!(stuck_copies(&healthy), None);
        let orphaned = [
            probed(1, false, false, false),
            probed(2, true, false, false),
        ];
        assert_eq!(
            stuck_copies(&orphaned),
            Some(std::collections::BTreeSet::new())
        );
        let failed = [
            probed(1, false, false, false),
            probed(3, false, true, false),
        ];
        assert_eq!(stuck_copies(&failed), Some([3].into()));
        let rolling = [probed(1, true, false, true), probed(2, true, false, false)];
        assert_eq!(stuck_copies(&rolling), None);
    }

    #[test]
    fn only_a_segment_stuck_at_two_probes_in_a_row_is_failed_over() {
        let previous: std::collections::BTreeSet<u64> = [4, 5].into();
        let now: std::collections::BTreeSet<u64> = [5, 6].into();
        assert_eq!(confirmed_stuck(&previous, &now), vec![5]);
        assert!(confirmed_stuck(&std::collections::BTreeSet::new(), &now).is_empty());
    }

    #[test]
    fn a_fence_quorum_meets_every_write_quorum() {
        assert_eq!(fence_quorum(1), 1);
        assert_eq!(fence_quorum(2), 1);
        assert_eq!(fence_quorum(3), 2);
        assert_eq!(fence_quorum(4), 2);
        assert_eq!(fence_quorum(5), 3);
        for n in 1..=9 {
            assert!(fence_quorum(n) + quorum(n) > n, "n = {n}");
        }
    }

    #[test]
    fn a_seal_is_recorded_on_as_many_complete_copies_as_it_was_decided_on() {
        assert_eq!(seal_copies_needed(1), 1);
        // At two copies the one left is enough (it was quorum(2) = 2).
        assert_eq!(seal_copies_needed(2), 1);
        assert_eq!(seal_copies_needed(3), 2);
        assert_eq!(seal_copies_needed(4), 2);
        assert_eq!(seal_copies_needed(5), 3);
        for n in 1..=9 {
            assert_eq!(seal_copies_needed(n), fence_quorum(n), "n = {n}");
            assert!(seal_copies_needed(n) <= quorum(n), "n = {n}");
            assert!(seal_copies_needed(n) >= 1, "n = {n}");
        }
    }

    #[test]
    fn too_few_answers_wait() {
        assert_eq!(
            seal_decision(3, &[answer(2, 5)]),
            SealDecision::Wait {
                answered: 1,
                needed: 2
            }
        );
        // The same copy twice is one answer.
        assert_eq!(
            seal_decision(3, &[answer(2, 5), answer(2, 5)]),
            SealDecision::Wait {
                answered: 1,
                needed: 2
            }
        );
    }

    #[test]
    fn the_seal_is_the_largest_durable_end_and_a_sound_copy_is_its_source() {
        let failed = FenceAnswer {
            failed: true,
            ..answer(1, 9)
        };
        assert_eq!(
            seal_decision(3, &[answer(3, 7), failed, answer(2, 9)]),
            SealDecision::Seal {
                length: 9,
                bytes: 90,
                source: 2
            }
        );
        assert_eq!(
            short_copies(&[answer(3, 7), failed, answer(2, 9)], 9),
            vec![3]
        );
        assert_eq!(
            complete_copies(&[answer(3, 7), failed, answer(2, 9)], 9),
            vec![2]
        );
    }

    #[test]
    fn a_seal_already_on_a_copy_is_adopted_and_two_different_ones_conflict() {
        let sealed = FenceAnswer {
            sealed: Some((6, 60)),
            ..answer(3, 6)
        };
        // Adopted even alone, and even if another copy holds more (an
        // overrun the seal cuts off).
        assert_eq!(
            seal_decision(3, &[sealed]),
            SealDecision::Seal {
                length: 6,
                bytes: 60,
                source: 3
            }
        );
        let other = FenceAnswer {
            sealed: Some((7, 70)),
            ..answer(2, 7)
        };
        assert_eq!(
            seal_decision(3, &[sealed, other]),
            SealDecision::Conflict {
                seals: vec![(6, 60), (7, 70)]
            }
        );
    }

    #[test]
    fn the_successor_primary_is_never_a_short_copy() {
        use std::collections::BTreeSet;
        let none = BTreeSet::new();
        assert_eq!(successor_primary(&[2, 3], &none, 3), Some(3));
        assert_eq!(successor_primary(&[3, 2], &none, 1), Some(2));
        assert_eq!(successor_primary(&[], &none, 1), None);
        // Regression (CI, `full_volume`): a coordinator on the broker whose
        // full volume failed the writer chose itself to lead the successor,
        // and a second failover followed at once.
        let failed = BTreeSet::from([3]);
        assert_eq!(successor_primary(&[2, 3], &failed, 3), Some(2));
        assert_eq!(successor_primary(&[3], &failed, 1), None);
    }

    /// A history of one segment: each copy's durable end, where a record
    /// is acknowledged once a quorum holds it (the primary is copy 0 and
    /// holds everything any follower holds: followers are its prefixes).
    fn histories() -> impl Strategy<Value = (usize, Vec<u64>, Vec<usize>)> {
        prop_oneof![Just(3usize), Just(5usize)].prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec(0u64..20, n),
                Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
            )
        })
    }

    fn probes() -> impl Strategy<Value = Vec<ProbedCopy>> {
        proptest::collection::vec((1u64..6, any::<bool>(), any::<bool>(), any::<bool>()), 0..6)
            .prop_map(|copies| {
                copies
                    .into_iter()
                    .map(|(node, fenced, failed, sealed)| probed(node, fenced, failed, sealed))
                    .collect()
            })
    }

    proptest! {
        /// The probe's plan is a pure function of what it saw: a sealed
        /// copy means a roll is being recorded (never stuck); otherwise a
        /// segment is stuck exactly when a copy is fenced or failed, and
        /// only failed copies' brokers are kept off the successor.
        #[test]
        fn the_probe_plan_follows_the_copies_alone(copies in probes()) {
            let plan = stuck_copies(&copies);
            prop_assert_eq!(&plan, &stuck_copies(&copies), "deterministic");
            if copies.iter().any(|c| c.sealed) {
                prop_assert_eq!(plan, None);
            } else if let Some(failed) = plan {
                prop_assert!(copies.iter().any(|c| c.fenced || c.failed));
                let expected: std::collections::BTreeSet<u64> =
                    copies.iter().filter(|c| c.failed).map(|c| c.node).collect();
                prop_assert_eq!(failed, expected);
            } else {
                prop_assert!(copies.iter().all(|c| !c.fenced && !c.failed));
            }
        }

        /// Confirmation needs both probes, and confirming twice changes
        /// nothing (idempotent).
        #[test]
        fn a_confirmed_orphan_was_stuck_at_both_probes(
            previous in proptest::collection::btree_set(0u64..20, 0..10),
            now in proptest::collection::btree_set(0u64..20, 0..10),
        ) {
            let confirmed = confirmed_stuck(&previous, &now);
            for segment in &confirmed {
                prop_assert!(previous.contains(segment) && now.contains(segment));
            }
            let again: std::collections::BTreeSet<u64> = confirmed.iter().copied().collect();
            prop_assert_eq!(confirmed_stuck(&again, &again), confirmed);
        }

        /// Any N − Q + 1 answers seal at or above every acknowledged end.
        #[test]
        fn any_fence_quorum_covers_every_acknowledged_record((n, mut ends, order) in histories()) {
            // The primary holds at least what every follower holds.
            let top = ends.iter().copied().max().unwrap_or(0);
            ends[0] = top;
            let acked = super::super::quorum::committed_end(&ends);
            let answers: Vec<FenceAnswer> = order
                .iter()
                .take(fence_quorum(n))
                .map(|&copy| answer(copy as u64, ends[copy]))
                .collect();
            match seal_decision(n, &answers) {
                SealDecision::Seal { length, source, .. } => {
                    prop_assert!(length >= acked, "seal {} below acked {}", length, acked);
                    prop_assert_eq!(ends[source as usize], length);
                    let complete = complete_copies(&answers, length);
                    prop_assert!(complete.contains(&source));
                    let short = short_copies(&answers, length);
                    prop_assert!(short.iter().all(|c| !complete.contains(c)));
                }
                other => prop_assert!(false, "no seal from a fence quorum: {:?}", other),
            }
        }
    }
}
