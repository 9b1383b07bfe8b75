//! The metadata state: topics, ranges, segments and storage policies.
//!
//! Everything here is ordered (`BTreeMap`, `Vec` in creation order) and every
//! id comes from a counter inside the state, so two replicas that applied the
//! same commands hold equal values and serialize to the same bytes.

use super::arc::RingArc;
use super::keyspace::{Band, position};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The version of the serialized snapshot layout. Bumped whenever a field of
/// the state changes shape, so a replica refuses a snapshot it cannot read
/// instead of misreading it.
pub const SNAPSHOT_VERSION: u8 = 1;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A range id, unique across all topics and never reused. Ids grow with
    /// creation time, so ordering by id is a topological order of the epoch chain.
    RangeId,
    "r"
);
id_type!(
    /// A segment id, unique across all topics and never reused.
    SegmentId,
    "s"
);
id_type!(
    /// A broker's node id as it appears in a replica set.
    NodeId,
    "n"
);
id_type!(
    /// Which life of a topic name this is: deleting and re-creating a topic
    /// gives it a new incarnation, so cursors of the old one are refused.
    Incarnation,
    "i"
);

/// Whether a topic accepts writes and reshaping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopicState {
    Active,
    /// Refuses rolls, splits and merges; its active segments are then sealed
    /// one by one with `SealSegment` at the lengths the data plane reports.
    Sealed {
        at_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub name: String,
    pub incarnation: Incarnation,
    /// The storage policy this topic points at. A name no definition backs is
    /// legal and means "hold the data" (see the architecture's placement section).
    pub policy: Option<String>,
    pub state: TopicState,
    pub created_at_ms: u64,
    /// Every range the topic ever had, in creation (= id) order.
    pub ranges: Vec<RangeId>,
    /// The routing index: band start of each active range to its id.
    pub active_by_start: BTreeMap<u64, RangeId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RangeState {
    /// Takes writes (if its topic is active); exactly one active range holds each position.
    Active,
    /// Succeeded by a split or a merge; its records are read as history.
    Sealed { at_ms: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub id: RangeId,
    pub topic: String,
    pub band: Band,
    pub state: RangeState,
    /// The ranges this one succeeded: one for a split child, two for a merge,
    /// none for an initial range.
    pub parents: Vec<RangeId>,
    /// The ranges that succeeded this one, set when it is sealed.
    pub children: Vec<RangeId>,
    /// The range's segments in offset order; all but the last are sealed.
    /// Retention removes them from the front (ADR 0115): a sealed range
    /// whose every segment expired lists none.
    pub segments: Vec<SegmentId>,
    pub created_at_ms: u64,
    /// What retention has removed from the front of `segments`: the last
    /// segment it removed and the offset the retained records start at.
    /// Last, with a default and left out while absent, so states from
    /// before retention encode and decode as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired: Option<Expired>,
}

/// The front of a range retention removed (ADR 0115).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expired {
    /// The newest segment removed: every segment of the range up to it is gone.
    pub through: SegmentId,
    /// The range's first retained offset (the end of `through`).
    pub end_offset: u64,
}

impl Range {
    pub fn is_active(&self) -> bool {
        matches!(self.state, RangeState::Active)
    }

    /// The range's newest segment. Every range is created with one, so this
    /// exists for every range the state holds (checked by `check_invariants`).
    pub fn last_segment(&self) -> Option<SegmentId> {
        self.segments.last().copied()
    }
}

/// The length and size a segment was sealed at: immutable once recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRecord {
    /// The number of records (offsets) in the segment.
    pub length: u64,
    /// The segment's size on disk, which the integrity pass compares copies against.
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentState {
    Active,
    Sealed { seal: SealRecord, at_ms: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub id: SegmentId,
    pub range: RangeId,
    /// The first offset of this segment within its range's offset space.
    pub start_offset: u64,
    /// The replica set, in the order placement chose it.
    pub replicas: Vec<NodeId>,
    pub state: SegmentState,
    pub created_at_ms: u64,
    /// The writer epoch: the coordinator lease epoch under which the
    /// segment was opened. Its primary sends it with every replica-append
    /// and a follower refuses an older one (`stale_epoch`). Fixed for the
    /// segment's life (a segment never changes writer; ADR 0097). Last,
    /// with a default, so snapshots from before epochs still decode.
    #[serde(default)]
    pub epoch: u64,
}

impl Segment {
    pub fn seal(&self) -> Option<SealRecord> {
        match self.state {
            SegmentState::Active => None,
            SegmentState::Sealed { seal, .. } => Some(seal),
        }
    }

    /// The exclusive end offset, known once sealed.
    pub fn end_offset(&self) -> Option<u64> {
        self.seal()
            .and_then(|seal| self.start_offset.checked_add(seal.length))
    }
}

/// A storage policy definition: a name, a retention rule and placement constraints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoragePolicy {
    pub name: String,
    pub retention_age_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    /// Placement constraint expressions over broker attributes, kept opaque
    /// here; placement parses and evaluates them.
    pub placement: Vec<String>,
    /// Automatic reshaping's settings for the policy's topics (ADR 0143);
    /// `None` keeps the brokers' defaults. Last, with a default and left
    /// out while absent, so a policy without it encodes exactly as before
    /// and older brokers read it; a policy with it is proposed only while
    /// `Feature::ReshapePolicy` is active (ADR 0134).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshape: Option<ReshapePolicy>,
}

/// A storage policy's overrides of the brokers' reshaping defaults (ADR
/// 0143): each `None` keeps the broker's value. Encoded as a whole, in
/// this field order; a new field needs a feature of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReshapePolicy {
    /// The per-topic switch: `Some(false)` keeps the topic's ranges as
    /// they are (a Kafka-style fixed partitioning).
    pub auto_reshape: Option<bool>,
    pub split_write_bytes_per_second: Option<u64>,
    pub split_after_ms: Option<u64>,
    pub merge_write_bytes_per_second: Option<u64>,
    pub merge_after_ms: Option<u64>,
    pub reshape_interval_ms: Option<u64>,
    pub ranges_min: Option<u32>,
    pub ranges_max: Option<u32>,
}

impl ReshapePolicy {
    /// Whether it overrides nothing (then it is left out of the policy).
    pub fn is_empty(&self) -> bool {
        *self == ReshapePolicy::default()
    }
}

/// The whole metadata state of one vnode. Encoded through [`StateRepr`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MetadataState {
    pub(crate) topics: BTreeMap<String, Topic>,
    pub(crate) ranges: BTreeMap<RangeId, Range>,
    pub(crate) segments: BTreeMap<SegmentId, Segment>,
    pub(crate) policies: BTreeMap<String, StoragePolicy>,
    pub(crate) next_incarnation: u64,
    pub(crate) next_range_id: u64,
    pub(crate) next_segment_id: u64,
    /// The arc of the ring this vnode owns; `None` (a group that was never
    /// assigned one, such as a lone broker's group 0) owns the whole ring.
    /// Last, with a default, so snapshots from before arcs still decode.
    #[serde(default)]
    pub(crate) arc: Option<RingArc>,
    /// The part of `arc` a split is moving out (ADR 0082).
    #[serde(default)]
    pub(crate) fence: Option<RingArc>,
    /// The coordinator lease of this group.
    #[serde(default)]
    pub(crate) lease: Option<super::control::Lease>,
    /// The ring, in the ring's own group only.
    #[serde(default)]
    pub(crate) ring: Option<super::control::RingRecord>,
    /// The cluster's cursor keys, in the ring's own group only (ADR 0096).
    /// Left out of the encoding while absent, so a state without keys
    /// encodes exactly as before they existed.
    #[serde(default)]
    pub(crate) cursor_keys: Option<super::cursor_keys::CursorKeyRing>,
    /// Users, ACL entries and the lockout table, in the ring's own group
    /// only (ADR 0148). Last, with a default, and left out while absent.
    #[serde(default)]
    pub(crate) admin: Option<super::admin_store::AdminStore>,
}

/// How the state is encoded. The encoding is positional (MessagePack
/// arrays), so optional fields are left out only from the end:
/// `cursor_keys` is written (nil if absent) when it or `admin` is present,
/// and a state that never held them encodes exactly as before them.
#[derive(Serialize)]
struct StateRepr<'a> {
    topics: &'a BTreeMap<String, Topic>,
    ranges: &'a BTreeMap<RangeId, Range>,
    segments: &'a BTreeMap<SegmentId, Segment>,
    policies: &'a BTreeMap<String, StoragePolicy>,
    next_incarnation: u64,
    next_range_id: u64,
    next_segment_id: u64,
    arc: &'a Option<RingArc>,
    fence: &'a Option<RingArc>,
    lease: &'a Option<super::control::Lease>,
    ring: &'a Option<super::control::RingRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor_keys: Option<&'a Option<super::cursor_keys::CursorKeyRing>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<&'a super::admin_store::AdminStore>,
}

impl Serialize for MetadataState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let admin = self.admin.as_ref();
        let cursor_keys =
            (self.cursor_keys.is_some() || admin.is_some()).then_some(&self.cursor_keys);
        StateRepr {
            topics: &self.topics,
            ranges: &self.ranges,
            segments: &self.segments,
            policies: &self.policies,
            next_incarnation: self.next_incarnation,
            next_range_id: self.next_range_id,
            next_segment_id: self.next_segment_id,
            arc: &self.arc,
            fence: &self.fence,
            lease: &self.lease,
            ring: &self.ring,
            cursor_keys,
            admin,
        }
        .serialize(serializer)
    }
}

/// Why a snapshot cannot be taken or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is empty")]
    Empty,
    #[error("snapshot version {found} is not the supported version {supported}")]
    Version { found: u8, supported: u8 },
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("snapshot does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("snapshot decodes to an inconsistent state: {0}")]
    Inconsistent(#[from] InvariantViolation),
}

/// A broken structural invariant of the state. Seeing one means a bug in the
/// machine or a corrupt snapshot, never a bad command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($fmt)+)));
        }
    };
}

impl MetadataState {
    pub fn new() -> MetadataState {
        MetadataState::default()
    }

    /// The ring arc this vnode owns, if one was assigned.
    pub fn arc(&self) -> Option<RingArc> {
        self.arc
    }

    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.get(name)
    }

    pub fn topics(&self) -> impl Iterator<Item = &Topic> {
        self.topics.values()
    }

    pub fn range(&self, id: RangeId) -> Option<&Range> {
        self.ranges.get(&id)
    }

    pub fn segment(&self, id: SegmentId) -> Option<&Segment> {
        self.segments.get(&id)
    }

    /// Active segments per primary (the first of each replica set): what
    /// each broker writes of this group's topics (placement by load, ADR 0144).
    pub fn primaries(&self) -> BTreeMap<u64, u64> {
        let mut counts = BTreeMap::new();
        for segment in self.segments.values() {
            if let (SegmentState::Active, Some(primary)) = (segment.state, segment.replicas.first())
            {
                *counts.entry(primary.0).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Every broker holding a copy of one of this group's segments: each
    /// needs the group's metadata on its own disk to serve them, so the
    /// group keeps it as a learner at least (ADR 0104).
    pub fn copy_holders(&self) -> std::collections::BTreeSet<u64> {
        self.segments
            .values()
            .flat_map(|s| s.replicas.iter().map(|n| n.0))
            .collect()
    }

    pub fn policy(&self, name: &str) -> Option<&StoragePolicy> {
        self.policies.get(name)
    }

    /// Every storage policy this group holds, by name. The cluster's
    /// policies live in the ring's group (ADR 0115).
    pub fn policies(&self) -> &BTreeMap<String, StoragePolicy> {
        &self.policies
    }

    /// The active ranges of a topic in keyspace order.
    pub fn active_ranges<'a>(&'a self, topic: &str) -> impl Iterator<Item = &'a Range> + 'a {
        self.topics
            .get(topic)
            .into_iter()
            .flat_map(|t| t.active_by_start.values())
            .filter_map(|id| self.ranges.get(id))
    }

    /// The active range that holds a keyspace position.
    pub fn route_position(&self, topic: &str, position: u64) -> Option<&Range> {
        let topic = self.topics.get(topic)?;
        let (_, id) = topic.active_by_start.range(..=position).next_back()?;
        let range = self.ranges.get(id)?;
        range.band.contains(position).then_some(range)
    }

    /// The active range a key is written to: the one holding `xxh3_64(key)`.
    pub fn route_key(&self, topic: &str, key: &[u8]) -> Option<&Range> {
        self.route_position(topic, position(key))
    }

    /// The segments of a topic that are not sealed yet, in id order: the
    /// newest segment of each active range whose write head is still open.
    pub fn unsealed_segments(&self, topic: &str) -> Vec<SegmentId> {
        let mut ids: Vec<SegmentId> = self
            .active_ranges(topic)
            .filter_map(|r| r.last_segment())
            .filter(|id| self.segments.get(id).is_some_and(|s| s.seal().is_none()))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The serialized state: a version byte, then the rmp-serde body.
    /// Equal states give equal bytes, which is what raft snapshots need.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let mut out = vec![SNAPSHOT_VERSION];
        rmp_serde::encode::write(&mut out, self)?;
        Ok(out)
    }

    /// The state a snapshot holds, checked against every structural invariant
    /// before it is handed out.
    pub fn restore(bytes: &[u8]) -> Result<MetadataState, SnapshotError> {
        let (&version, body) = bytes.split_first().ok_or(SnapshotError::Empty)?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version {
                found: version,
                supported: SNAPSHOT_VERSION,
            });
        }
        let state: MetadataState = rmp_serde::from_slice(body)?;
        state.check_invariants()?;
        Ok(state)
    }

    /// Checks every structural invariant of the state. Cost is linear in the
    /// size of the state, so the machine calls it in debug builds after each
    /// command and on every restore.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        if let Some(fence) = self.fence {
            ensure!(
                self.arc
                    .is_some_and(|arc| arc.covers(&fence) && arc != fence),
                "fence {fence} is not a part of the vnode's arc"
            );
        }
        if let Some(record) = &self.ring {
            ensure!(
                record.ring.check().is_ok(),
                "the ring's arcs do not tile the ring"
            );
        }
        if let Some(keys) = &self.cursor_keys {
            ensure!(
                keys.is_well_formed(),
                "the cursor keys are empty, too many, out of id order or of a bad length"
            );
        }
        if let Some(admin) = &self.admin {
            ensure!(
                admin.is_well_formed(),
                "the admin stores hold a bad name, credential or entry, or too many"
            );
        }
        for (name, topic) in &self.topics {
            ensure!(
                self.arc.is_none_or(|arc| arc.holds_topic(name)),
                "topic {name} lies outside the vnode's arc"
            );
            ensure!(
                &topic.name == name,
                "topic {name} is filed under another name"
            );
            ensure!(
                topic.incarnation.0 < self.next_incarnation,
                "topic {name} has an unissued incarnation"
            );
            self.check_topic_tiling(topic)?;
            let mut previous: Option<RangeId> = None;
            for id in &topic.ranges {
                ensure!(
                    previous.is_none_or(|p| p < *id),
                    "topic {name} ranges are not in id order"
                );
                previous = Some(*id);
                let range = self.ranges.get(id);
                ensure!(
                    range.is_some_and(|r| &r.topic == name),
                    "topic {name} lists foreign range {id}"
                );
            }
        }
        for (id, range) in &self.ranges {
            ensure!(range.id == *id, "range {id} is filed under another id");
            ensure!(id.0 < self.next_range_id, "range {id} has an unissued id");
            let topic = self.topics.get(&range.topic);
            ensure!(
                topic.is_some_and(|t| t.ranges.contains(id)),
                "range {id} has no topic listing it"
            );
            for parent in &range.parents {
                ensure!(
                    parent < id,
                    "range {id} has a parent {parent} younger than itself"
                );
                let p = self.ranges.get(parent);
                ensure!(
                    p.is_some_and(|p| p.children.contains(id)),
                    "range {id} parent {parent} does not list it"
                );
            }
            for child in &range.children {
                ensure!(
                    child > id,
                    "range {id} has a child {child} older than itself"
                );
            }
            // A range is sealed only by a split or a merge, which name its successors.
            ensure!(
                range.is_active() == range.children.is_empty(),
                "range {id} is sealed without successors or active with some"
            );
            self.check_lineage(range)?;
            self.check_range_segments(range)?;
        }
        for (id, segment) in &self.segments {
            ensure!(segment.id == *id, "segment {id} is filed under another id");
            ensure!(
                id.0 < self.next_segment_id,
                "segment {id} has an unissued id"
            );
            let range = self.ranges.get(&segment.range);
            ensure!(
                range.is_some_and(|r| r.segments.contains(id)),
                "segment {id} has no range listing it"
            );
            ensure!(!segment.replicas.is_empty(), "segment {id} has no replicas");
            let distinct: BTreeSet<_> = segment.replicas.iter().collect();
            ensure!(
                distinct.len() == segment.replicas.len(),
                "segment {id} repeats a replica"
            );
        }
        Ok(())
    }

    fn check_topic_tiling(&self, topic: &Topic) -> Result<(), InvariantViolation> {
        let name = &topic.name;
        let mut expected_start: u128 = 0;
        for (start, id) in &topic.active_by_start {
            let range = self.ranges.get(id);
            ensure!(
                range
                    .is_some_and(|r| r.is_active() && r.band.start() == *start && &r.topic == name),
                "topic {name} routing index names {id} at {start:#x} wrongly"
            );
            let band = range.map(|r| r.band).unwrap_or(Band::FULL);
            ensure!(
                u128::from(*start) == expected_start,
                "topic {name} active ranges leave a gap or overlap at {start:#x}"
            );
            expected_start = band.end_exclusive();
        }
        ensure!(
            expected_start == 1u128 << 64,
            "topic {name} active ranges do not reach the end of the keyspace"
        );
        let active = topic
            .ranges
            .iter()
            .filter(|id| self.ranges.get(id).is_some_and(|r| r.is_active()))
            .count();
        ensure!(
            active == topic.active_by_start.len(),
            "topic {name} has active ranges missing from routing"
        );
        Ok(())
    }

    /// A split child is a half of its one parent; a merge result is the union
    /// of its two parents, lower half first; an initial range has no parent.
    fn check_lineage(&self, range: &Range) -> Result<(), InvariantViolation> {
        let id = range.id;
        let bands: Vec<Band> = range
            .parents
            .iter()
            .filter_map(|p| self.ranges.get(p))
            .map(|p| p.band)
            .collect();
        ensure!(
            bands.len() == range.parents.len(),
            "range {id} names a missing parent"
        );
        match bands.as_slice() {
            [] => {}
            [parent] => {
                let halves = parent.halves();
                ensure!(
                    halves.is_some_and(|(lower, upper)| lower == range.band || upper == range.band),
                    "split child {id} is not a half of its parent"
                );
            }
            [lower, upper] => {
                ensure!(
                    range.band.halves() == Some((*lower, *upper)),
                    "merged range {id} is not the union of two buddies"
                );
            }
            _ => {
                return Err(InvariantViolation(format!(
                    "range {id} has more than two parents"
                )));
            }
        }
        Ok(())
    }

    fn check_range_segments(&self, range: &Range) -> Result<(), InvariantViolation> {
        let id = range.id;
        ensure!(
            !range.segments.is_empty() || (range.expired.is_some() && !range.is_active()),
            "range {id} has no segment"
        );
        let mut next_offset = Some(range.expired.map_or(0, |e| e.end_offset));
        for (i, segment_id) in range.segments.iter().enumerate() {
            let segment = self.segments.get(segment_id);
            let Some(segment) = segment else {
                return Err(InvariantViolation(format!(
                    "range {id} lists missing segment {segment_id}"
                )));
            };
            ensure!(
                segment.range == id,
                "segment {segment_id} is listed by range {id} but names another"
            );
            ensure!(
                Some(segment.start_offset) == next_offset,
                "range {id} segment {segment_id} is not contiguous"
            );
            let last = i + 1 == range.segments.len();
            ensure!(
                last || segment.seal().is_some(),
                "range {id} has an active segment {segment_id} before its last"
            );
            ensure!(
                range.is_active() || segment.seal().is_some(),
                "sealed range {id} has an active segment"
            );
            next_offset = segment.end_offset();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Command;

    fn two_range_state() -> MetadataState {
        let mut state = MetadataState::new();
        let replicas = vec![vec![NodeId(1)], vec![NodeId(2)]];
        let cmd = Command::CreateTopic {
            topic: "t".into(),
            initial_ranges: 2,
            policy: None,
            replicas,
            at_ms: 0,
        };
        state.apply(cmd).unwrap();
        state
    }

    #[test]
    fn a_snapshot_whose_active_ranges_leave_a_gap_is_refused() {
        let mut state = two_range_state();
        let topic = state.topics.get_mut("t").unwrap();
        let (_, id) = topic.active_by_start.pop_last().unwrap();
        state.ranges.get_mut(&id).unwrap().state = RangeState::Sealed { at_ms: 1 };
        let bytes = state.snapshot().unwrap();
        assert!(matches!(
            MetadataState::restore(&bytes),
            Err(SnapshotError::Inconsistent(_))
        ));
    }

    #[test]
    fn a_snapshot_with_a_gap_in_segment_offsets_is_refused() {
        let mut state = two_range_state();
        let segment = state.segments.values_mut().next().unwrap();
        segment.start_offset = 5;
        let bytes = state.snapshot().unwrap();
        assert!(matches!(
            MetadataState::restore(&bytes),
            Err(SnapshotError::Inconsistent(_))
        ));
    }

    #[test]
    fn a_snapshot_whose_merged_range_is_not_the_union_of_its_parents_is_refused() {
        let mut state = two_range_state();
        let cmd = Command::MergeRanges {
            topic: "t".into(),
            lower: RangeId(0),
            upper: RangeId(1),
            lower_seal: SealRecord {
                length: 0,
                bytes: 0,
            },
            upper_seal: SealRecord {
                length: 0,
                bytes: 0,
            },
            replicas: vec![NodeId(1)],
            at_ms: 1,
            lower_segment: None,
            upper_segment: None,
        };
        state.apply(cmd).unwrap();
        state.ranges.get_mut(&RangeId(2)).unwrap().parents.reverse();
        let bytes = state.snapshot().unwrap();
        assert!(matches!(
            MetadataState::restore(&bytes),
            Err(SnapshotError::Inconsistent(_))
        ));
    }

    #[test]
    fn a_snapshot_with_an_unissued_id_is_refused() {
        let mut state = two_range_state();
        state.next_segment_id = 0;
        let bytes = state.snapshot().unwrap();
        assert!(matches!(
            MetadataState::restore(&bytes),
            Err(SnapshotError::Inconsistent(_))
        ));
    }

    #[test]
    fn a_segment_stored_before_writer_epochs_decodes_at_epoch_zero() {
        // A segment as snapshots and raft entries held it before epochs:
        // the same fields, positionally, without the last.
        #[derive(Serialize)]
        struct Before {
            id: SegmentId,
            range: RangeId,
            start_offset: u64,
            replicas: Vec<NodeId>,
            state: SegmentState,
            created_at_ms: u64,
        }
        let before = Before {
            id: SegmentId(7),
            range: RangeId(2),
            start_offset: 10,
            replicas: vec![NodeId(1), NodeId(2)],
            state: SegmentState::Active,
            created_at_ms: 5,
        };
        let bytes = rmp_serde::to_vec(&before).unwrap();
        let segment: Segment = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(segment.epoch, 0);
        assert_eq!(segment.id, SegmentId(7));
        assert_eq!(segment.replicas, vec![NodeId(1), NodeId(2)]);
    }

    #[test]
    fn a_lease_an_acquire_lease_and_a_refusal_from_before_generations_decode() {
        use crate::model::command::{Command, ModelError, Outcome};
        use crate::model::control::Lease;
        // The shapes before ADR 0122, encoded positionally as they were.
        #[derive(Serialize)]
        struct OldLease {
            holder: u64,
            epoch: u64,
            granted_at_ms: u64,
            duration_ms: u64,
        }
        #[derive(Serialize)]
        enum OldCommand {
            AcquireLease {
                holder: u64,
                duration_ms: u64,
                at_ms: u64,
            },
        }
        #[derive(Serialize)]
        enum OldError {
            LeaseHeld { holder: u64, expires_at_ms: u64 },
        }
        let bytes = rmp_serde::to_vec(&OldLease {
            holder: 3,
            epoch: 4,
            granted_at_ms: 5,
            duration_ms: 6,
        })
        .unwrap();
        let lease: Lease = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            lease,
            Lease {
                holder: 3,
                epoch: 4,
                granted_at_ms: 5,
                duration_ms: 6,
                generation: 0,
            }
        );
        let old = OldCommand::AcquireLease {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 7,
        };
        let bytes = rmp_serde::to_vec(&old).unwrap();
        let cmd: Command = rmp_serde::from_slice(&bytes).unwrap();
        let stamped = Command::AcquireLease {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 7,
        };
        assert_eq!(cmd, stamped);
        assert_eq!(rmp_serde::to_vec(&stamped).unwrap(), bytes);
        let waited = Command::AcquireLeaseWaited {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 7,
            waited_for: Some(9),
        };
        let bytes = rmp_serde::to_vec(&waited).unwrap();
        assert_eq!(rmp_serde::from_slice::<Command>(&bytes).unwrap(), waited);
        let bytes = rmp_serde::to_vec(&OldError::LeaseHeld {
            holder: 3,
            expires_at_ms: 8,
        })
        .unwrap();
        assert_eq!(
            rmp_serde::from_slice::<ModelError>(&bytes).unwrap(),
            ModelError::LeaseHeld {
                holder: 3,
                expires_at_ms: 8,
                generation: 0,
                duration_ms: 0,
            }
        );
        // A state holding an old lease restores; an old-format request
        // replays by the rule it was applied under (the wall-clock stamps:
        // another holder gets in once the stamps pass the expiry) and
        // leaves the generation at 0, as in the snapshots of those days.
        let state = MetadataState {
            lease: Some(lease),
            ..MetadataState::default()
        };
        let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
        let mut replayed = restored.clone();
        let Ok(Outcome::LeaseGranted { lease: renewed }) = replayed.apply(Command::AcquireLease {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 8,
        }) else {
            panic!("an old-format renewal is granted")
        };
        assert_eq!(
            (renewed.epoch, renewed.generation, renewed.granted_at_ms),
            (4, 0, 8)
        );
        let Ok(Outcome::LeaseGranted { lease: taken }) = replayed.apply(Command::AcquireLease {
            holder: 5,
            duration_ms: 10_000,
            at_ms: 10_008,
        }) else {
            panic!("an old-format takeover past the stamps' expiry is granted")
        };
        assert_eq!((taken.holder, taken.epoch, taken.generation), (5, 5, 0));
        // The new request on the same restored lease counts generations
        // from there, and another holder must wait for one.
        let mut state = restored;
        let Ok(Outcome::LeaseGranted { lease }) = state.apply(Command::AcquireLeaseWaited {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 9,
            waited_for: None,
        }) else {
            panic!("a renewal is granted")
        };
        assert_eq!((lease.epoch, lease.generation), (4, 1));
        assert!(matches!(
            state.apply(Command::AcquireLeaseWaited {
                holder: 5,
                duration_ms: 10_000,
                at_ms: 1 << 40,
                waited_for: None,
            }),
            Err(ModelError::LeaseHeld { generation: 1, .. })
        ));
        // An old-format request after that raises the generation too.
        let Ok(Outcome::LeaseGranted { lease }) = state.apply(Command::AcquireLease {
            holder: 3,
            duration_ms: 10_000,
            at_ms: 10,
        }) else {
            panic!("an old-format renewal is granted")
        };
        assert_eq!(lease.generation, 2);
    }

    #[test]
    fn segments_opened_under_a_lease_carry_its_epoch() {
        use crate::model::command::Command;
        let mut state = MetadataState::default();
        state
            .apply(Command::AcquireLeaseWaited {
                holder: 1,
                duration_ms: 1_000,
                at_ms: 1,
                waited_for: None,
            })
            .unwrap();
        let epoch = state.lease.map(|l| l.epoch).unwrap();
        assert!(epoch > 0, "a granted lease has an epoch");
        state
            .apply(Command::CreateTopic {
                topic: "t".into(),
                initial_ranges: 1,
                policy: None,
                replicas: vec![vec![NodeId(1), NodeId(2), NodeId(3)]],
                at_ms: 2,
            })
            .unwrap();
        assert!(state.segments.values().all(|s| s.epoch == epoch));
    }
}
