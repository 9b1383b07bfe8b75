//! A topic's description: the data `malachi topic describe` prints, as plain
//! text through `Display` and as JSON through serde (`--json`).

use super::state::{MetadataState, RangeState, SegmentState, TopicState};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicDescription {
    pub name: String,
    pub incarnation: u64,
    /// `active` or `sealed`.
    pub state: String,
    pub sealed_at_ms: Option<u64>,
    pub policy: Option<String>,
    /// Whether a definition backs the policy name; an unresolved name holds data.
    pub policy_resolved: bool,
    pub created_at_ms: u64,
    pub ranges: Vec<RangeDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeDescription {
    pub id: u64,
    /// The band as hex strings, because JSON numbers cannot carry 2^64 exactly.
    pub band_start: String,
    pub band_end: String,
    pub state: String,
    pub sealed_at_ms: Option<u64>,
    pub parents: Vec<u64>,
    pub children: Vec<u64>,
    pub created_at_ms: u64,
    pub segments: Vec<SegmentDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescription {
    pub id: u64,
    pub start_offset: u64,
    pub replicas: Vec<u64>,
    pub state: String,
    pub length: Option<u64>,
    pub bytes: Option<u64>,
    pub created_at_ms: u64,
    pub sealed_at_ms: Option<u64>,
    /// The segment's writer epoch (ADR 0097).
    #[serde(default)]
    pub epoch: u64,
}

impl MetadataState {
    /// The description of a topic, ranges in id (creation) order.
    pub fn describe_topic(&self, name: &str) -> Option<TopicDescription> {
        let topic = self.topics.get(name)?;
        let ranges = topic
            .ranges
            .iter()
            .filter_map(|id| self.ranges.get(id))
            .map(|range| {
                let segments = range
                    .segments
                    .iter()
                    .filter_map(|id| self.segments.get(id))
                    .map(|segment| {
                        let (state, seal, sealed_at_ms) = match segment.state {
                            SegmentState::Active => ("active", None, None),
                            SegmentState::Sealed { seal, at_ms } => {
                                ("sealed", Some(seal), Some(at_ms))
                            }
                        };
                        SegmentDescription {
                            id: segment.id.0,
                            start_offset: segment.start_offset,
                            replicas: segment.replicas.iter().map(|n| n.0).collect(),
                            state: state.to_owned(),
                            length: seal.map(|s| s.length),
                            bytes: seal.map(|s| s.bytes),
                            created_at_ms: segment.created_at_ms,
                            sealed_at_ms,
                            epoch: segment.epoch,
                        }
                    })
                    .collect();
                let (state, sealed_at_ms) = match range.state {
                    RangeState::Active => ("active", None),
                    RangeState::Sealed { at_ms } => ("sealed", Some(at_ms)),
                };
                RangeDescription {
                    id: range.id.0,
                    band_start: format!("{:#018x}", range.band.start()),
                    band_end: format!("{:#018x}", range.band.end_exclusive()),
                    state: state.to_owned(),
                    sealed_at_ms,
                    parents: range.parents.iter().map(|r| r.0).collect(),
                    children: range.children.iter().map(|r| r.0).collect(),
                    created_at_ms: range.created_at_ms,
                    segments,
                }
            })
            .collect();
        let (state, sealed_at_ms) = match topic.state {
            TopicState::Active => ("active", None),
            TopicState::Sealed { at_ms } => ("sealed", Some(at_ms)),
        };
        Some(TopicDescription {
            name: topic.name.clone(),
            incarnation: topic.incarnation.0,
            state: state.to_owned(),
            sealed_at_ms,
            policy: topic.policy.clone(),
            policy_resolved: topic
                .policy
                .as_ref()
                .is_some_and(|p| self.policies.contains_key(p)),
            created_at_ms: topic.created_at_ms,
            ranges,
        })
    }
}

fn ids(prefix: char, ids: &[u64]) -> String {
    if ids.is_empty() {
        return "-".to_owned();
    }
    ids.iter()
        .map(|id| format!("{prefix}{id}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn at(at_ms: Option<u64>) -> String {
    at_ms.map(|ms| format!(" at {ms}ms")).unwrap_or_default()
}

impl fmt::Display for TopicDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = match (&self.policy, self.policy_resolved) {
            (None, _) => "(cluster defaults)".to_owned(),
            (Some(name), true) => name.clone(),
            (Some(name), false) => format!("{name} (unresolved: holds all data)"),
        };
        let active = self.ranges.iter().filter(|r| r.state == "active").count();
        writeln!(
            f,
            "topic {}  incarnation {}  {}{}",
            self.name,
            self.incarnation,
            self.state,
            at(self.sealed_at_ms)
        )?;
        writeln!(f, "policy {policy}  created at {}ms", self.created_at_ms)?;
        writeln!(f, "ranges: {} ({} active)", self.ranges.len(), active)?;
        for range in &self.ranges {
            writeln!(
                f,
                "  r{:<4} [{}, {})  {}{}  parents {}  children {}",
                range.id,
                range.band_start,
                range.band_end,
                range.state,
                at(range.sealed_at_ms),
                ids('r', &range.parents),
                ids('r', &range.children),
            )?;
            for segment in &range.segments {
                let extent = match (segment.length, segment.bytes) {
                    (Some(length), Some(bytes)) => format!(
                        "offsets [{}, {})  length {length}  bytes {bytes}",
                        segment.start_offset,
                        segment.start_offset.saturating_add(length)
                    ),
                    _ => format!("offsets [{}, ..)", segment.start_offset),
                };
                writeln!(
                    f,
                    "      s{:<4} {}{}  {}  replicas {}",
                    segment.id,
                    segment.state,
                    at(segment.sealed_at_ms),
                    extent,
                    ids('n', &segment.replicas),
                )?;
            }
        }
        Ok(())
    }
}
