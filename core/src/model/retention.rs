//! Retention (issue 21, ADR 0115): which sealed segments a topic forgets,
//! and the command that forgets them.
//!
//! A key's history runs along its range's epoch chain: the ancestors'
//! segments oldest first, then the range's own. Retention only ever takes
//! the oldest records of every key, so a segment may go only when it is
//! the first segment its range still lists and every range its range
//! succeeded lists none. Among the segments that may go, the one sealed
//! first goes first. By age, a segment goes once it has been sealed
//! longer than the rule's age; by size, the oldest go while the topic's
//! sealed bytes exceed the rule's bytes. Active segments never go.
//!
//! The plan is a pure function of the state, the rule and the time, so
//! every replica of the coordinator's vnode would compute the same one;
//! `ExpireSegments` re-checks each step when it applies.

use std::collections::{BTreeMap, VecDeque};

use super::command::{ModelError, Outcome};
use super::state::{Expired, MetadataState, RangeId, SegmentId, SegmentState};

/// The most segments one `ExpireSegments` forgets, so one command (and
/// the drop orders after it) stays small.
pub const EXPIRE_SEGMENTS_MAX: usize = 256;

/// A storage policy's retention rule; `None` leaves that bound unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionRule {
    /// A sealed segment goes once sealed this long.
    pub age_ms: Option<u64>,
    /// The oldest sealed segments go while the topic's sealed bytes exceed this.
    pub bytes: Option<u64>,
}

impl RetentionRule {
    /// Whether the rule bounds anything.
    pub fn is_set(&self) -> bool {
        self.age_ms.is_some() || self.bytes.is_some()
    }
}

impl MetadataState {
    /// The segments of `topic` the rule expires at `now_ms`, in the order
    /// `ExpireSegments` takes them (at most `max`). Empty for a topic this
    /// state does not hold or a rule that bounds nothing.
    pub fn retention_plan(
        &self,
        topic: &str,
        rule: RetentionRule,
        now_ms: u64,
        max: usize,
    ) -> Vec<SegmentId> {
        let Some(t) = self.topics.get(topic) else {
            return Vec::new();
        };
        if !rule.is_set() {
            return Vec::new();
        }
        // Each range's remaining segments, front first.
        let mut queues: BTreeMap<RangeId, VecDeque<SegmentId>> = t
            .ranges
            .iter()
            .filter_map(|id| self.ranges.get(id))
            .map(|r| (r.id, r.segments.iter().copied().collect()))
            .collect();
        let mut sealed_bytes: u64 = queues
            .values()
            .flatten()
            .filter_map(|id| self.segments.get(id))
            .filter_map(|s| s.seal())
            .map(|seal| seal.bytes)
            .fold(0, u64::saturating_add);
        let mut plan = Vec::new();
        while plan.len() < max {
            // The segments that may go now: sealed fronts of ranges whose
            // parents are empty, oldest seal first.
            let mut heads: Vec<(u64, SegmentId)> = queues
                .iter()
                .filter(|(range, _)| {
                    self.ranges.get(range).is_some_and(|r| {
                        r.parents
                            .iter()
                            .all(|p| queues.get(p).is_none_or(VecDeque::is_empty))
                    })
                })
                .filter_map(|(_, q)| q.front())
                .filter_map(|id| match self.segments.get(id)?.state {
                    SegmentState::Sealed { at_ms, .. } => Some((at_ms, *id)),
                    SegmentState::Active => None,
                })
                .collect();
            heads.sort_unstable();
            let aged = |at_ms: u64| {
                rule.age_ms
                    .is_some_and(|age| now_ms.saturating_sub(at_ms) >= age)
            };
            let over = rule.bytes.is_some_and(|b| sealed_bytes > b);
            let pick = heads
                .iter()
                .find(|(at, _)| aged(*at))
                .or_else(|| heads.first().filter(|_| over));
            let Some(&(_, id)) = pick else {
                break;
            };
            let Some(segment) = self.segments.get(&id) else {
                break;
            };
            if let Some(q) = queues.get_mut(&segment.range) {
                q.pop_front();
            }
            sealed_bytes = sealed_bytes.saturating_sub(segment.seal().map_or(0, |s| s.bytes));
            plan.push(id);
        }
        plan
    }

    /// Applies `ExpireSegments`: checks every step on a copy first, so a
    /// refusal leaves the state exactly as it was.
    pub(super) fn expire_segments(
        &mut self,
        topic: &str,
        segments: &[SegmentId],
    ) -> Result<Outcome, ModelError> {
        if !self.topics.contains_key(topic) {
            return Err(ModelError::NoSuchTopic {
                topic: topic.to_owned(),
            });
        }
        if segments.len() > EXPIRE_SEGMENTS_MAX {
            return Err(ModelError::NotExpirable {
                segment: segments[EXPIRE_SEGMENTS_MAX],
                reason: format!("more than {EXPIRE_SEGMENTS_MAX} segments in one command"),
            });
        }
        let mut next = self.clone();
        for &id in segments {
            next.expire_one(topic, id)?;
        }
        *self = next;
        Ok(Outcome::SegmentsExpired {
            segments: segments.to_vec(),
        })
    }

    fn expire_one(&mut self, topic: &str, id: SegmentId) -> Result<(), ModelError> {
        let refuse = |reason: &str| ModelError::NotExpirable {
            segment: id,
            reason: reason.to_owned(),
        };
        let segment = self
            .segments
            .get(&id)
            .filter(|s| self.ranges.get(&s.range).is_some_and(|r| r.topic == topic))
            .ok_or_else(|| ModelError::NoSuchSegment {
                topic: topic.to_owned(),
                segment: id,
            })?;
        let Some(end_offset) = segment.end_offset() else {
            return Err(refuse("it is not sealed"));
        };
        let range_id = segment.range;
        let range = self
            .ranges
            .get(&range_id)
            .ok_or_else(|| refuse("its range is gone"))?;
        if range.segments.first() != Some(&id) {
            return Err(refuse("an older segment of its range is still held"));
        }
        if range
            .parents
            .iter()
            .any(|p| self.ranges.get(p).is_some_and(|r| !r.segments.is_empty()))
        {
            return Err(refuse("a range it succeeded still holds segments"));
        }
        if range.is_active() && range.segments.len() == 1 {
            return Err(refuse("it is the last segment of an active range"));
        }
        self.segments.remove(&id);
        if let Some(range) = self.ranges.get_mut(&range_id) {
            range.segments.remove(0);
            range.expired = Some(Expired {
                through: id,
                end_offset,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Command, NodeId, SealRecord};

    const HOUR: u64 = 3_600_000;

    /// One range, with `sealed` segments of 100 bytes each, sealed an
    /// hour apart from `at` 0, and an active one after them.
    fn chain(sealed: u64) -> (MetadataState, Vec<SegmentId>) {
        let mut state = MetadataState::new();
        state
            .apply(Command::CreateTopic {
                topic: "t".into(),
                initial_ranges: 1,
                policy: None,
                replicas: vec![vec![NodeId(1)]],
                at_ms: 0,
            })
            .unwrap();
        let mut ids = vec![state.topic("t").unwrap().ranges[0]]
            .into_iter()
            .filter_map(|r| state.range(r))
            .flat_map(|r| r.segments.clone())
            .collect::<Vec<_>>();
        for n in 0..sealed {
            let current = *ids.last().unwrap();
            let outcome = state
                .apply(Command::RollSegment {
                    topic: "t".into(),
                    segment: current,
                    seal: SealRecord {
                        length: 10,
                        bytes: 100,
                    },
                    next_replicas: vec![NodeId(1)],
                    at_ms: n * HOUR,
                })
                .unwrap();
            let Outcome::SegmentRolled { next, .. } = outcome else {
                panic!("{outcome:?}")
            };
            ids.push(next);
        }
        (state, ids)
    }

    #[test]
    fn by_age_the_segments_sealed_longer_than_the_rule_go_oldest_first() {
        let (state, ids) = chain(4);
        let rule = RetentionRule {
            age_ms: Some(2 * HOUR),
            bytes: None,
        };
        // At 3h: sealed at 0h and 1h are 2h old or more.
        assert_eq!(state.retention_plan("t", rule, 3 * HOUR, 100), ids[..2]);
        // Never the active one, however old.
        assert_eq!(state.retention_plan("t", rule, 100 * HOUR, 100), ids[..4]);
        assert!(state.retention_plan("t", rule, HOUR, 100).is_empty());
        assert_eq!(state.retention_plan("t", rule, 100 * HOUR, 3), ids[..3]);
    }

    #[test]
    fn by_size_the_oldest_go_while_the_sealed_bytes_exceed_the_rule() {
        let (state, ids) = chain(5);
        let rule = RetentionRule {
            age_ms: None,
            bytes: Some(250),
        };
        // 500 sealed bytes; down to 200 takes three.
        assert_eq!(state.retention_plan("t", rule, 0, 100), ids[..3]);
        let none = RetentionRule::default();
        assert!(state.retention_plan("t", none, u64::MAX, 100).is_empty());
    }

    #[test]
    fn expiring_moves_the_ranges_start_and_keeps_the_invariants() {
        let (mut state, ids) = chain(3);
        let plan = vec![ids[0], ids[1]];
        assert_eq!(
            state.apply(Command::ExpireSegments {
                topic: "t".into(),
                segments: plan.clone(),
            }),
            Ok(Outcome::SegmentsExpired { segments: plan })
        );
        state.check_invariants().unwrap();
        let range = state.range(state.segment(ids[2]).unwrap().range).unwrap();
        assert_eq!(range.segments, ids[2..]);
        assert_eq!(
            range.expired,
            Some(Expired {
                through: ids[1],
                end_offset: 20
            })
        );
        // The retained history still reads from its first record.
        let plan = state.read_plan(range.id).unwrap();
        assert_eq!(plan.slices[0].segments[0].start_offset, 20);
        // Encodes and restores.
        let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
        assert_eq!(restored, state);
    }

    #[test]
    fn a_cursor_into_expired_records_is_refused_naming_the_earliest_retained_position() {
        use crate::cursor::{Cursor, InvalidCursor, Position};
        let (mut state, ids) = chain(3);
        let range = state.segment(ids[0]).unwrap().range;
        let incarnation = state.topic("t").unwrap().incarnation.0;
        let at = |segment, offset| Cursor {
            topic: "t".into(),
            incarnation,
            positions: [(range, Position::At { segment, offset })].into(),
        };
        assert_eq!(at(ids[0], 5).validate(&state), Ok(()));
        state
            .apply(Command::ExpireSegments {
                topic: "t".into(),
                segments: vec![ids[0], ids[1]],
            })
            .unwrap();
        assert_eq!(
            at(ids[0], 5).validate(&state),
            Err(InvalidCursor::Expired {
                range,
                earliest_segment: ids[2],
                earliest_offset: 20,
            })
        );
        // A position in a retained segment still reads.
        assert_eq!(at(ids[2], 25).validate(&state), Ok(()));
    }

    #[test]
    fn only_the_front_of_a_chain_may_expire_and_a_refusal_changes_nothing() {
        let (mut state, ids) = chain(3);
        let before = state.clone();
        // Not the front.
        let refused = state.apply(Command::ExpireSegments {
            topic: "t".into(),
            segments: vec![ids[1]],
        });
        assert!(
            matches!(refused, Err(ModelError::NotExpirable { .. })),
            "{refused:?}"
        );
        // The front then an active segment: refused whole.
        let refused = state.apply(Command::ExpireSegments {
            topic: "t".into(),
            segments: vec![ids[0], ids[1], ids[2], ids[3]],
        });
        assert!(
            matches!(refused, Err(ModelError::NotExpirable { .. })),
            "{refused:?}"
        );
        assert_eq!(state, before);
    }

    #[test]
    fn a_split_child_expires_only_after_its_parent_emptied() {
        let (mut state, ids) = chain(1);
        let parent = state.segment(ids[0]).unwrap().range;
        let outcome = state
            .apply(Command::SplitRange {
                topic: "t".into(),
                range: parent,
                seal: SealRecord {
                    length: 10,
                    bytes: 100,
                },
                lower_replicas: vec![NodeId(1)],
                upper_replicas: vec![NodeId(1)],
                at_ms: 2 * HOUR,
                segment: None,
            })
            .unwrap();
        let Outcome::RangeSplit { lower_segment, .. } = outcome else {
            panic!("{outcome:?}")
        };
        let lower = state.segment(lower_segment).unwrap().range;
        let outcome = state
            .apply(Command::RollSegment {
                topic: "t".into(),
                segment: lower_segment,
                seal: SealRecord {
                    length: 5,
                    bytes: 50,
                },
                next_replicas: vec![NodeId(1)],
                at_ms: 3 * HOUR,
            })
            .unwrap();
        assert!(matches!(outcome, Outcome::SegmentRolled { .. }));
        // The child's sealed segment may not go before the parent's two.
        let refused = state.apply(Command::ExpireSegments {
            topic: "t".into(),
            segments: vec![lower_segment],
        });
        assert!(
            matches!(refused, Err(ModelError::NotExpirable { .. })),
            "{refused:?}"
        );
        let rule = RetentionRule {
            age_ms: Some(0),
            bytes: None,
        };
        let plan = state.retention_plan("t", rule, 10 * HOUR, 100);
        assert_eq!(plan, vec![ids[0], ids[1], lower_segment]);
        state
            .apply(Command::ExpireSegments {
                topic: "t".into(),
                segments: plan,
            })
            .unwrap();
        state.check_invariants().unwrap();
        assert!(state.range(parent).unwrap().segments.is_empty());
        assert_eq!(state.range(lower).unwrap().segments.len(), 1);
    }
}
