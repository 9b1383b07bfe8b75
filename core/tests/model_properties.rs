//! Stateful property tests of the metadata state machine.
//!
//! Random command sequences run against the real `MetadataState` and against
//! a small reference model written independently (plain u128 band arithmetic,
//! per-topic lists in creation order). After every step the test checks the
//! outcome against the reference and the log model's invariants against the
//! real state: tiling, routing, immutable seals, contiguous offsets, buddy-only
//! merges and read plans that cover each key's history exactly once, oldest first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_core::model::{
    Band, Command, Incarnation, MetadataState, ModelError, NodeId, Outcome, RangeId, SealRecord,
    SegmentId,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const TOPICS: [&str; 2] = ["alpha", "beta"];
const SPACE: u128 = 1u128 << 64;

// ---------------------------------------------------------------- reference

#[derive(Debug, Clone)]
struct RefSegment {
    id: u64,
    start: u64,
    seal: Option<SealRecord>,
    replicas: Vec<u64>,
}

#[derive(Debug, Clone)]
struct RefRange {
    id: u64,
    start: u128,
    size: u128,
    active: bool,
    segments: Vec<RefSegment>,
}

impl RefRange {
    fn contains(&self, p: u64) -> bool {
        let p = u128::from(p);
        p >= self.start && p < self.start + self.size
    }
}

#[derive(Debug, Clone)]
struct RefTopic {
    incarnation: u64,
    sealed: bool,
    /// Every range in creation order.
    ranges: Vec<RefRange>,
}

#[derive(Debug, Clone, Default)]
struct Reference {
    topics: BTreeMap<String, RefTopic>,
    next_incarnation: u64,
    next_range: u64,
    next_segment: u64,
}

/// What the reference expects a command to do.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Ok(Outcome),
    Err(ModelError),
}

impl Reference {
    fn find_segment(&self, topic: &str, id: u64) -> Option<(usize, usize)> {
        let t = self.topics.get(topic)?;
        for (ri, r) in t.ranges.iter().enumerate() {
            for (si, s) in r.segments.iter().enumerate() {
                if s.id == id {
                    return Some((ri, si));
                }
            }
        }
        None
    }

    fn find_range(&self, topic: &str, id: u64) -> Option<usize> {
        self.topics
            .get(topic)?
            .ranges
            .iter()
            .position(|r| r.id == id)
    }

    /// Predicts the result of `cmd` and, if it succeeds, applies it.
    fn step(&mut self, cmd: &Command) -> Expect {
        match self.predict(cmd) {
            Ok(outcome) => {
                self.apply(cmd, &outcome);
                Expect::Ok(outcome)
            }
            Err(e) => Expect::Err(e),
        }
    }

    fn seal_conflict(seg: &RefSegment, seal: SealRecord) -> Result<(), ModelError> {
        match seg.seal {
            Some(recorded) if recorded != seal => Err(ModelError::AlreadySealed {
                segment: SegmentId(seg.id),
                recorded,
            }),
            _ => Ok(()),
        }
    }

    fn live_topic(&self, topic: &str) -> Result<&RefTopic, ModelError> {
        let t = self
            .topics
            .get(topic)
            .ok_or_else(|| ModelError::NoSuchTopic {
                topic: topic.into(),
            })?;
        if t.sealed {
            return Err(ModelError::TopicSealed {
                topic: topic.into(),
            });
        }
        Ok(t)
    }

    fn active_range(&self, topic: &str, id: RangeId) -> Result<&RefRange, ModelError> {
        let ri = self
            .find_range(topic, id.0)
            .ok_or_else(|| ModelError::NoSuchRange {
                topic: topic.into(),
                range: id,
            })?;
        let r = &self.topics[topic].ranges[ri];
        if !r.active {
            return Err(ModelError::RangeNotActive { range: id });
        }
        Ok(r)
    }

    fn predict(&self, cmd: &Command) -> Result<Outcome, ModelError> {
        match cmd {
            Command::CreateTopic {
                topic,
                initial_ranges,
                ..
            } => {
                if self.topics.contains_key(topic) {
                    return Err(ModelError::TopicExists {
                        topic: topic.clone(),
                    });
                }
                if *initial_ranges == 0 || initial_ranges & (initial_ranges - 1) != 0 {
                    return Err(ModelError::NotPowerOfTwo {
                        count: *initial_ranges,
                    });
                }
                Ok(Outcome::TopicCreated {
                    incarnation: Incarnation(self.next_incarnation),
                    ranges: (0..*initial_ranges)
                        .map(|i| RangeId(self.next_range + i))
                        .collect(),
                    segments: (0..*initial_ranges)
                        .map(|i| SegmentId(self.next_segment + i))
                        .collect(),
                })
            }
            Command::SealTopic { topic, .. } => {
                let t = self
                    .topics
                    .get(topic)
                    .ok_or_else(|| ModelError::NoSuchTopic {
                        topic: topic.clone(),
                    })?;
                if t.sealed {
                    return Ok(Outcome::Unchanged);
                }
                let mut active_segments: Vec<SegmentId> = t
                    .ranges
                    .iter()
                    .filter(|r| r.active)
                    .flat_map(|r| r.segments.iter().filter(|s| s.seal.is_none()))
                    .map(|s| SegmentId(s.id))
                    .collect();
                active_segments.sort();
                Ok(Outcome::TopicSealed { active_segments })
            }
            Command::DeleteTopic { topic } => {
                let t = self
                    .topics
                    .get(topic)
                    .ok_or_else(|| ModelError::NoSuchTopic {
                        topic: topic.clone(),
                    })?;
                let mut segments: Vec<SegmentId> = t
                    .ranges
                    .iter()
                    .flat_map(|r| r.segments.iter().map(|s| SegmentId(s.id)))
                    .collect();
                segments.sort();
                Ok(Outcome::TopicDeleted {
                    incarnation: Incarnation(t.incarnation),
                    segments,
                })
            }
            Command::RollSegment {
                topic,
                segment,
                seal,
                ..
            } => {
                let t = self.live_topic(topic)?;
                let (ri, si) = self.find_segment(topic, segment.0).ok_or_else(|| {
                    ModelError::NoSuchSegment {
                        topic: topic.clone(),
                        segment: *segment,
                    }
                })?;
                let r = &t.ranges[ri];
                if !r.active {
                    return Err(ModelError::RangeNotActive {
                        range: RangeId(r.id),
                    });
                }
                if let Some(next) = r.segments.get(si + 1) {
                    return Err(ModelError::AlreadyRolled {
                        segment: *segment,
                        successor: SegmentId(next.id),
                    });
                }
                Self::seal_conflict(&r.segments[si], *seal)?;
                Ok(Outcome::SegmentRolled {
                    sealed: *segment,
                    next: SegmentId(self.next_segment),
                })
            }
            Command::SealSegment {
                topic,
                segment,
                seal,
                ..
            } => {
                let t = self
                    .topics
                    .get(topic)
                    .ok_or_else(|| ModelError::NoSuchTopic {
                        topic: topic.clone(),
                    })?;
                let (ri, si) = self.find_segment(topic, segment.0).ok_or_else(|| {
                    ModelError::NoSuchSegment {
                        topic: topic.clone(),
                        segment: *segment,
                    }
                })?;
                let s = &t.ranges[ri].segments[si];
                Self::seal_conflict(s, *seal)?;
                Ok(if s.seal.is_some() {
                    Outcome::Unchanged
                } else {
                    Outcome::SegmentSealed { segment: *segment }
                })
            }
            Command::SplitRange {
                topic, range, seal, ..
            } => {
                self.live_topic(topic)?;
                let r = self.active_range(topic, *range)?;
                Self::seal_conflict(r.segments.last().unwrap(), *seal)?;
                Ok(Outcome::RangeSplit {
                    parent: *range,
                    lower: RangeId(self.next_range),
                    upper: RangeId(self.next_range + 1),
                    lower_segment: SegmentId(self.next_segment),
                    upper_segment: SegmentId(self.next_segment + 1),
                })
            }
            Command::MergeRanges {
                topic,
                lower,
                upper,
                lower_seal,
                upper_seal,
                ..
            } => {
                self.live_topic(topic)?;
                let lo = self.active_range(topic, *lower)?;
                let up = self.active_range(topic, *upper)?;
                let buddies = lo.size == up.size
                    && lo.start % (2 * lo.size) == 0
                    && up.start == lo.start + lo.size;
                if !buddies {
                    return Err(ModelError::NotBuddies {
                        lower: *lower,
                        upper: *upper,
                    });
                }
                Self::seal_conflict(lo.segments.last().unwrap(), *lower_seal)?;
                Self::seal_conflict(up.segments.last().unwrap(), *upper_seal)?;
                Ok(Outcome::RangesMerged {
                    lower: *lower,
                    upper: *upper,
                    merged: RangeId(self.next_range),
                    segment: SegmentId(self.next_segment),
                })
            }
            Command::ReplaceReplica {
                topic,
                segment,
                old,
                new,
            } => {
                let t = self
                    .topics
                    .get(topic)
                    .ok_or_else(|| ModelError::NoSuchTopic {
                        topic: topic.clone(),
                    })?;
                let (ri, si) = self.find_segment(topic, segment.0).ok_or_else(|| {
                    ModelError::NoSuchSegment {
                        topic: topic.clone(),
                        segment: *segment,
                    }
                })?;
                let s = &t.ranges[ri].segments[si];
                if !s.replicas.contains(&old.0) {
                    return Err(ModelError::WrongReplica {
                        segment: *segment,
                        node: *old,
                    });
                }
                if s.replicas.contains(&new.0) {
                    return Err(ModelError::ReplicaPresent {
                        segment: *segment,
                        node: *new,
                    });
                }
                Ok(Outcome::ReplicaReplaced { segment: *segment })
            }
            Command::AddReplica {
                topic,
                segment,
                new,
                factor,
            } => {
                let t = self
                    .topics
                    .get(topic)
                    .ok_or_else(|| ModelError::NoSuchTopic {
                        topic: topic.clone(),
                    })?;
                let (ri, si) = self.find_segment(topic, segment.0).ok_or_else(|| {
                    ModelError::NoSuchSegment {
                        topic: topic.clone(),
                        segment: *segment,
                    }
                })?;
                let s = &t.ranges[ri].segments[si];
                if s.seal.is_none() {
                    return Err(ModelError::SegmentNotSealed { segment: *segment });
                }
                if s.replicas.contains(&new.0) {
                    return Err(ModelError::ReplicaPresent {
                        segment: *segment,
                        node: *new,
                    });
                }
                if s.replicas.len() >= *factor as usize {
                    return Err(ModelError::AtFactor {
                        segment: *segment,
                        factor: *factor,
                    });
                }
                Ok(Outcome::ReplicaAdded { segment: *segment })
            }
            _ => unreachable!("not generated"),
        }
    }

    fn new_range(&mut self, start: u128, size: u128, replicas: &[NodeId]) -> RefRange {
        let range = RefRange {
            id: self.next_range,
            start,
            size,
            active: true,
            segments: vec![RefSegment {
                id: self.next_segment,
                start: 0,
                seal: None,
                replicas: replicas.iter().map(|n| n.0).collect(),
            }],
        };
        self.next_range += 1;
        self.next_segment += 1;
        range
    }

    fn seal_last(&mut self, topic: &str, range: RangeId, seal: SealRecord) -> u64 {
        let ri = self.find_range(topic, range.0).unwrap();
        let r = &mut self.topics.get_mut(topic).unwrap().ranges[ri];
        r.active = false;
        let last = r.segments.last_mut().unwrap();
        last.seal.get_or_insert(seal);
        last.start + seal.length
    }

    fn apply(&mut self, cmd: &Command, outcome: &Outcome) {
        match cmd {
            Command::CreateTopic {
                topic,
                initial_ranges,
                replicas,
                ..
            } => {
                let size = SPACE / u128::from(*initial_ranges);
                let incarnation = self.next_incarnation;
                self.next_incarnation += 1;
                let ranges = (0..*initial_ranges)
                    .map(|i| self.new_range(u128::from(i) * size, size, &replicas[i as usize]))
                    .collect();
                self.topics.insert(
                    topic.clone(),
                    RefTopic {
                        incarnation,
                        sealed: false,
                        ranges,
                    },
                );
            }
            Command::SealTopic { topic, .. } => self.topics.get_mut(topic).unwrap().sealed = true,
            Command::DeleteTopic { topic } => {
                self.topics.remove(topic);
            }
            Command::RollSegment {
                topic,
                segment,
                seal,
                next_replicas,
                ..
            } => {
                let (ri, si) = self.find_segment(topic, segment.0).unwrap();
                let id = self.next_segment;
                self.next_segment += 1;
                let r = &mut self.topics.get_mut(topic).unwrap().ranges[ri];
                let s = &mut r.segments[si];
                s.seal.get_or_insert(*seal);
                let start = s.start + seal.length;
                r.segments.push(RefSegment {
                    id,
                    start,
                    seal: None,
                    replicas: next_replicas.iter().map(|n| n.0).collect(),
                });
            }
            Command::SealSegment {
                topic,
                segment,
                seal,
                ..
            } => {
                let (ri, si) = self.find_segment(topic, segment.0).unwrap();
                self.topics.get_mut(topic).unwrap().ranges[ri].segments[si]
                    .seal
                    .get_or_insert(*seal);
            }
            Command::SplitRange {
                topic,
                range,
                seal,
                lower_replicas,
                upper_replicas,
                ..
            } => {
                self.seal_last(topic, *range, *seal);
                let ri = self.find_range(topic, range.0).unwrap();
                let (start, size) = {
                    let r = &self.topics[topic].ranges[ri];
                    (r.start, r.size / 2)
                };
                let lower = self.new_range(start, size, lower_replicas);
                let upper = self.new_range(start + size, size, upper_replicas);
                let t = self.topics.get_mut(topic).unwrap();
                t.ranges.push(lower);
                t.ranges.push(upper);
            }
            Command::MergeRanges {
                topic,
                lower,
                upper,
                lower_seal,
                upper_seal,
                replicas,
                ..
            } => {
                self.seal_last(topic, *lower, *lower_seal);
                self.seal_last(topic, *upper, *upper_seal);
                let ri = self.find_range(topic, lower.0).unwrap();
                let (start, size) = {
                    let r = &self.topics[topic].ranges[ri];
                    (r.start, r.size * 2)
                };
                let merged = self.new_range(start, size, replicas);
                self.topics.get_mut(topic).unwrap().ranges.push(merged);
            }
            Command::ReplaceReplica {
                topic,
                segment,
                old,
                new,
            } => {
                let (ri, si) = self.find_segment(topic, segment.0).unwrap();
                let s = &mut self.topics.get_mut(topic).unwrap().ranges[ri].segments[si];
                for n in &mut s.replicas {
                    if *n == old.0 {
                        *n = new.0;
                    }
                }
            }
            Command::AddReplica {
                topic,
                segment,
                new,
                ..
            } => {
                let (ri, si) = self.find_segment(topic, segment.0).unwrap();
                let s = &mut self.topics.get_mut(topic).unwrap().ranges[ri].segments[si];
                s.replicas.push(new.0);
            }
            _ => {}
        }
        let _ = outcome;
    }

    /// The ids of the ranges that held `position` in `topic`, up to and including `upto`, oldest first.
    fn history(&self, topic: &str, position: u64, upto: u64) -> Vec<u64> {
        self.topics[topic]
            .ranges
            .iter()
            .filter(|r| r.id <= upto && r.contains(position))
            .map(|r| r.id)
            .collect()
    }
}

// ---------------------------------------------------------------- generated operations

/// An abstract operation; `pick` values are resolved against the reference
/// state at the time they run, so most operations hit existing ids.
#[derive(Debug, Clone)]
enum Op {
    Create {
        topic: usize,
        count: u64,
        rf: u64,
    },
    SealTopic {
        topic: usize,
    },
    Delete {
        topic: usize,
    },
    Roll {
        topic: usize,
        target: Target,
        length: u64,
        jitter: u64,
    },
    Seal {
        topic: usize,
        target: Target,
        length: u64,
        jitter: u64,
        reuse: bool,
    },
    Split {
        topic: usize,
        target: Target,
        length: u64,
    },
    Merge {
        topic: usize,
        pick: usize,
        buddy: bool,
        lengths: (u64, u64),
    },
    Replace {
        topic: usize,
        target: Target,
        old: usize,
        new: u64,
    },
    Add {
        topic: usize,
        target: Target,
        new: u64,
        factor: u32,
    },
}

/// How an operation chooses the id it acts on.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// An active range or its newest segment: the common, valid path.
    Live(usize),
    /// Any range or segment the topic ever had (sealed ones included).
    Any(usize),
    /// An id taken from anywhere, likely another topic's or unissued.
    Bogus(u64),
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        6 => any::<usize>().prop_map(Target::Live),
        3 => any::<usize>().prop_map(Target::Any),
        1 => (0u64..40).prop_map(Target::Bogus),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let topic = 0..TOPICS.len();
    prop_oneof![
        3 => (topic.clone(), prop::sample::select(vec![0u64, 1, 2, 3, 4, 8]), 1u64..4)
            .prop_map(|(topic, count, rf)| Op::Create { topic, count, rf }),
        1 => topic.clone().prop_map(|topic| Op::SealTopic { topic }),
        1 => topic.clone().prop_map(|topic| Op::Delete { topic }),
        5 => (topic.clone(), target(), 0u64..5, 0u64..2)
            .prop_map(|(topic, target, length, jitter)| Op::Roll { topic, target, length, jitter }),
        3 => (topic.clone(), target(), 0u64..5, 0u64..2, any::<bool>())
            .prop_map(|(topic, target, length, jitter, reuse)| Op::Seal { topic, target, length, jitter, reuse }),
        5 => (topic.clone(), target(), 0u64..5).prop_map(|(topic, target, length)| Op::Split { topic, target, length }),
        5 => (topic.clone(), any::<usize>(), prop::bool::weighted(0.8), (0u64..5, 0u64..5))
            .prop_map(|(topic, pick, buddy, lengths)| Op::Merge { topic, pick, buddy, lengths }),
        2 => (topic.clone(), target(), any::<usize>(), 1u64..7)
            .prop_map(|(topic, target, old, new)| Op::Replace { topic, target, old, new }),
        2 => (topic, target(), 1u64..7, 1u32..6)
            .prop_map(|(topic, target, new, factor)| Op::Add { topic, target, new, factor }),
    ]
}

fn nodes(ids: impl IntoIterator<Item = u64>) -> Vec<NodeId> {
    ids.into_iter().map(NodeId).collect()
}

fn seal(length: u64, jitter: u64) -> SealRecord {
    SealRecord {
        length,
        bytes: length * 10 + jitter,
    }
}

/// Turns an abstract operation into a concrete command against the reference state.
fn resolve(reference: &Reference, op: &Op, at_ms: u64) -> Command {
    let name = |i: usize| TOPICS[i].to_owned();
    let ranges = |t: usize, active_only: bool| -> Vec<RefRange> {
        reference
            .topics
            .get(TOPICS[t])
            .map(|topic| {
                topic
                    .ranges
                    .iter()
                    .filter(|r| !active_only || r.active)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let segment_of = |t: usize, target: Target| -> (SegmentId, Option<RefSegment>) {
        let chosen = match target {
            Target::Live(i) => {
                let live: Vec<RefSegment> = ranges(t, true)
                    .iter()
                    .map(|r| r.segments.last().unwrap().clone())
                    .collect();
                live.get(i % live.len().max(1)).cloned()
            }
            Target::Any(i) => {
                let all: Vec<RefSegment> = ranges(t, false)
                    .iter()
                    .flat_map(|r| r.segments.clone())
                    .collect();
                all.get(i % all.len().max(1)).cloned()
            }
            Target::Bogus(id) => return (SegmentId(id), None),
        };
        match chosen {
            Some(s) => (SegmentId(s.id), Some(s)),
            None => (SegmentId(u64::MAX), None),
        }
    };
    let range_of = |t: usize, target: Target| -> RangeId {
        let pool = match target {
            Target::Live(i) => (ranges(t, true), i),
            Target::Any(i) => (ranges(t, false), i),
            Target::Bogus(id) => return RangeId(id),
        };
        pool.0
            .get(pool.1 % pool.0.len().max(1))
            .map(|r| RangeId(r.id))
            .unwrap_or(RangeId(u64::MAX))
    };
    match *op {
        Op::Create { topic, count, rf } => Command::CreateTopic {
            topic: name(topic),
            initial_ranges: count,
            policy: None,
            replicas: (0..count)
                .map(|i| nodes((0..rf).map(|k| 1 + (i + k) % 5)))
                .collect(),
            at_ms,
        },
        Op::SealTopic { topic } => Command::SealTopic {
            topic: name(topic),
            at_ms,
        },
        Op::Delete { topic } => Command::DeleteTopic { topic: name(topic) },
        Op::Roll {
            topic,
            target,
            length,
            jitter,
        } => {
            let (segment, found) = segment_of(topic, target);
            // Sometimes reuse the recorded seal, the "sealed on failure, then rolled" path.
            let seal = found
                .and_then(|s| s.seal)
                .filter(|_| jitter == 0)
                .unwrap_or(seal(length, jitter));
            Command::RollSegment {
                topic: name(topic),
                segment,
                seal,
                next_replicas: nodes([1, 2, 3]),
                at_ms,
            }
        }
        Op::Seal {
            topic,
            target,
            length,
            jitter,
            reuse,
        } => {
            let (segment, found) = segment_of(topic, target);
            let seal = found
                .and_then(|s| s.seal)
                .filter(|_| reuse)
                .unwrap_or(seal(length, jitter));
            Command::SealSegment {
                topic: name(topic),
                segment,
                seal,
                at_ms,
            }
        }
        Op::Split {
            topic,
            target,
            length,
        } => Command::SplitRange {
            topic: name(topic),
            range: range_of(topic, target),
            seal: seal(length, 0),
            lower_replicas: nodes([1, 2]),
            upper_replicas: nodes([3, 4]),
            at_ms,
            segment: None,
        },
        Op::Merge {
            topic,
            pick,
            buddy,
            lengths,
        } => {
            let live = ranges(topic, true);
            let (lower, upper) = if live.is_empty() {
                (RangeId(u64::MAX), RangeId(u64::MAX - 1))
            } else {
                let a = &live[pick % live.len()];
                let partner = if buddy {
                    let buddy_start = a.start ^ a.size;
                    live.iter()
                        .find(|r| r.start == buddy_start && r.size == a.size)
                } else {
                    None
                };
                let b = partner.unwrap_or(&live[(pick + 1) % live.len()]);
                if a.start <= b.start {
                    (RangeId(a.id), RangeId(b.id))
                } else {
                    (RangeId(b.id), RangeId(a.id))
                }
            };
            Command::MergeRanges {
                topic: name(topic),
                lower,
                upper,
                lower_seal: seal(lengths.0, 0),
                upper_seal: seal(lengths.1, 0),
                replicas: nodes([5]),
                at_ms,
                lower_segment: None,
                upper_segment: None,
            }
        }
        Op::Replace {
            topic,
            target,
            old,
            new,
        } => {
            let (segment, found) = segment_of(topic, target);
            let old = found
                .map(|s| s.replicas[old % s.replicas.len()])
                .unwrap_or(9);
            Command::ReplaceReplica {
                topic: name(topic),
                segment,
                old: NodeId(old),
                new: NodeId(new),
            }
        }
        Op::Add {
            topic,
            target,
            new,
            factor,
        } => Command::AddReplica {
            topic: name(topic),
            segment: segment_of(topic, target).0,
            new: NodeId(new),
            factor,
        },
    }
}

// ---------------------------------------------------------------- invariants

/// Positions worth probing in a topic: every active band's edges and middle,
/// the ends of the keyspace, and a few fixed keys' positions.
fn probe_positions(state: &MetadataState, topic: &str) -> Vec<u64> {
    let mut positions = vec![0, u64::MAX, 1 << 63, malachi_core::model::position(b"k1")];
    for topic in state.topic(topic).iter() {
        for id in &topic.ranges {
            let band = state.range(*id).unwrap().band;
            positions.extend([
                band.start(),
                band.last(),
                (band.start() / 2) + (band.last() / 2),
            ]);
        }
    }
    positions.sort_unstable();
    positions.dedup();
    positions
}

/// Everything the log model promises, checked against the real state and the reference.
fn check_step(
    state: &MetadataState,
    reference: &Reference,
    seals_seen: &mut BTreeMap<SegmentId, SealRecord>,
) -> Result<(), TestCaseError> {
    state
        .check_invariants()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;

    let names: Vec<&str> = state.topics().map(|t| t.name.as_str()).collect();
    let ref_names: Vec<&str> = reference.topics.keys().map(String::as_str).collect();
    prop_assert_eq!(names, ref_names);

    for topic in state.topics() {
        let name = topic.name.as_str();
        let r = &reference.topics[name];
        prop_assert_eq!(topic.incarnation, Incarnation(r.incarnation));

        // The active ranges tile the keyspace: sorted by start, each begins where the last ended.
        let mut expected_start: u128 = 0;
        for range in state.active_ranges(name) {
            prop_assert_eq!(
                u128::from(range.band.start()),
                expected_start,
                "gap or overlap in {}",
                name
            );
            expected_start = range.band.end_exclusive();
        }
        prop_assert_eq!(expected_start, SPACE, "tiling of {} stops short", name);

        // The same active bands as the reference.
        let mut ref_active: Vec<(u128, u128)> = r
            .ranges
            .iter()
            .filter(|x| x.active)
            .map(|x| (x.start, x.start + x.size))
            .collect();
        ref_active.sort_unstable();
        let active: Vec<(u128, u128)> = state
            .active_ranges(name)
            .map(|x| (u128::from(x.band.start()), x.band.end_exclusive()))
            .collect();
        prop_assert_eq!(active, ref_active);

        let positions = probe_positions(state, name);
        for &p in &positions {
            // Every position maps to exactly one active range, and routing finds it.
            let holders: Vec<RangeId> = state
                .active_ranges(name)
                .filter(|x| x.band.contains(p))
                .map(|x| x.id)
                .collect();
            prop_assert_eq!(
                holders.len(),
                1,
                "position {:#x} of {} held by {:?}",
                p,
                name,
                holders
            );
            prop_assert_eq!(
                state.route_position(name, p).map(|x| x.id),
                Some(holders[0])
            );
        }

        for ref_range in &r.ranges {
            let range = state.range(RangeId(ref_range.id)).unwrap();
            prop_assert_eq!(range.is_active(), ref_range.active);

            // Segment offsets are contiguous, starting at zero; seals match the reference.
            let mut next = 0u64;
            prop_assert_eq!(range.segments.len(), ref_range.segments.len());
            for (id, ref_segment) in range.segments.iter().zip(&ref_range.segments) {
                let segment = state.segment(*id).unwrap();
                prop_assert_eq!(segment.id.0, ref_segment.id);
                prop_assert_eq!(segment.start_offset, next);
                prop_assert_eq!(segment.start_offset, ref_segment.start);
                prop_assert_eq!(segment.seal(), ref_segment.seal);
                let replicas: Vec<u64> = segment.replicas.iter().map(|n| n.0).collect();
                prop_assert_eq!(&replicas, &ref_segment.replicas);
                if let Some(end) = segment.end_offset() {
                    next = end;
                }
            }

            // Only buddies merge: a range with two parents is their union, lower half first.
            if range.parents.len() == 2 {
                let lower = state.range(range.parents[0]).unwrap().band;
                let upper = state.range(range.parents[1]).unwrap().band;
                prop_assert_eq!(range.band.halves(), Some((lower, upper)));
            }

            // The read plan covers each position's history exactly once, oldest first.
            let plan = state.read_plan(range.id).unwrap();
            prop_assert_eq!(plan.slices.last().map(|s| s.range), Some(range.id));
            prop_assert!(
                plan.slices.windows(2).all(|w| w[0].range < w[1].range),
                "read plan not oldest first"
            );
            for slice in &plan.slices {
                prop_assert!(
                    range.band.covers(&slice.band),
                    "slice {} leaves the band of {}",
                    slice.range,
                    range.id
                );
                prop_assert_eq!(slice.sealed, slice.range != range.id || !range.is_active());
            }
            for &p in positions.iter().filter(|p| range.band.contains(**p)) {
                let read: Vec<u64> = plan.slices_for(p).map(|s| s.range.0).collect();
                prop_assert_eq!(
                    read,
                    reference.history(name, p, range.id.0),
                    "history of {:#x} via {}",
                    p,
                    range.id
                );
            }
        }
    }

    // A recorded seal never changes and never disappears while its segment exists.
    seals_seen.retain(|id, _| state.segment(*id).is_some());
    for (id, recorded) in seals_seen.iter() {
        prop_assert_eq!(
            state.segment(*id).unwrap().seal(),
            Some(*recorded),
            "seal of {} changed",
            id
        );
    }
    for topic in state.topics() {
        for range_id in &topic.ranges {
            for id in &state.range(*range_id).unwrap().segments {
                if let Some(seal) = state.segment(*id).unwrap().seal() {
                    seals_seen.entry(*id).or_insert(seal);
                }
            }
        }
    }
    Ok(())
}

/// Runs a sequence, checking every step; returns the concrete commands applied.
fn run(ops: &[Op]) -> Result<(MetadataState, Vec<Command>), TestCaseError> {
    let mut state = MetadataState::new();
    let mut reference = Reference::default();
    let mut seals_seen = BTreeMap::new();
    let mut commands = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let cmd = resolve(&reference, op, 1_000 + i as u64);
        let before = state.snapshot().unwrap();
        let expected = reference.step(&cmd);
        let actual = state.apply(cmd.clone());
        match (&expected, &actual) {
            (Expect::Ok(e), Ok(a)) => prop_assert_eq!(e, a, "outcome of {:?}", cmd),
            (Expect::Err(e), Err(a)) => {
                prop_assert_eq!(e, a, "refusal of {:?}", cmd);
                prop_assert_eq!(
                    &state.snapshot().unwrap(),
                    &before,
                    "refused {:?} changed the state",
                    cmd
                );
            }
            _ => prop_assert!(
                false,
                "step {} {:?}: expected {:?}, got {:?}",
                i,
                cmd,
                expected,
                actual
            ),
        }
        if matches!(actual, Ok(Outcome::Unchanged)) {
            prop_assert_eq!(
                &state.snapshot().unwrap(),
                &before,
                "idempotent {:?} changed the state",
                cmd
            );
        }
        check_step(&state, &reference, &mut seals_seen)?;
        commands.push(cmd);
    }
    Ok((state, commands))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn random_command_sequences_keep_every_log_model_invariant(ops in prop::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }

    #[test]
    fn two_replicas_fed_the_same_commands_serialize_to_the_same_bytes(ops in prop::collection::vec(op(), 1..40)) {
        let (first, commands) = run(&ops)?;
        let mut second = MetadataState::new();
        for cmd in &commands {
            // Results are compared through the state; a refusal refuses on both.
            let _ = second.apply(cmd.clone());
        }
        prop_assert_eq!(first.snapshot().unwrap(), second.snapshot().unwrap());
        let restored = MetadataState::restore(&first.snapshot().unwrap()).unwrap();
        prop_assert_eq!(restored.snapshot().unwrap(), first.snapshot().unwrap());
    }
}

/// The stateful test must actually reach the interesting paths, or it passes vacuously.
#[test]
fn the_generator_reaches_splits_merges_rolls_and_refusals() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..64 {
        let ops = prop::collection::vec(op(), 40)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let mut state = MetadataState::new();
        let mut reference = Reference::default();
        for (i, op) in ops.iter().enumerate() {
            let cmd = resolve(&reference, op, i as u64);
            reference.step(&cmd);
            let kind = match state.apply(cmd) {
                Ok(Outcome::RangeSplit { .. }) => "split",
                Ok(Outcome::RangesMerged { .. }) => "merge",
                Ok(Outcome::SegmentRolled { .. }) => "roll",
                Ok(Outcome::SegmentSealed { .. }) => "seal",
                Ok(Outcome::Unchanged) => "unchanged",
                Err(ModelError::AlreadySealed { .. }) => "already_sealed",
                Err(ModelError::NotBuddies { .. }) => "not_buddies",
                Err(_) => "other_refusal",
                Ok(_) => "other",
            };
            *seen.entry(kind).or_default() += 1;
        }
    }
    for kind in [
        "split",
        "merge",
        "roll",
        "seal",
        "unchanged",
        "already_sealed",
        "not_buddies",
        "other_refusal",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= 5,
            "{kind} reached only {:?} times: {seen:?}",
            seen.get(kind)
        );
    }
}

#[test]
fn a_split_child_reads_its_parent_slice_before_its_own_records() {
    let mut state = MetadataState::new();
    state
        .apply(Command::CreateTopic {
            topic: "t".into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![nodes([1])],
            at_ms: 0,
        })
        .unwrap();
    let split = state
        .apply(Command::SplitRange {
            topic: "t".into(),
            range: RangeId(0),
            seal: seal(4, 0),
            lower_replicas: nodes([1]),
            upper_replicas: nodes([2]),
            at_ms: 1,
            segment: None,
        })
        .unwrap();
    let Outcome::RangeSplit { upper, .. } = split else {
        panic!("{split:?}")
    };
    let plan = state.read_plan(upper).unwrap();
    let (_, upper_band) = Band::FULL.halves().unwrap();
    let slices: Vec<(RangeId, Band, bool)> = plan
        .slices
        .iter()
        .map(|s| (s.range, s.band, s.sealed))
        .collect();
    assert_eq!(
        slices,
        vec![(RangeId(0), upper_band, true), (upper, upper_band, false)]
    );
    assert_eq!(plan.slices[0].segments[0].end_offset, Some(4));
}
