//! Pure planners of the control plane: what a coordinator asks the
//! failover actor and the healer to do, decided from the metadata alone
//! (`heal.rs`: what to fail over and what to heal; `probes.rs`: which
//! copies each poll looks at). The coordinator gathers the inputs and
//! sends the results; these functions neither read a clock nor do I/O.

use std::collections::BTreeSet;

use crate::model::SegmentId;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixture;
pub mod heal;
pub mod probes;
pub mod reshape;

/// One segment to fail over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub topic: String,
    pub segment: SegmentId,
    /// The brokers found failed (the primary, at least): the successor
    /// goes elsewhere.
    pub failed: BTreeSet<u64>,
}

/// An active replicated segment whose copies a coordinator wants probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub topic: String,
    pub segment: SegmentId,
    pub replicas: Vec<u64>,
}

/// One sealed segment copy to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealCandidate {
    pub topic: String,
    pub segment: SegmentId,
    /// Which copy, and where it goes.
    pub kind: HealKind,
    /// Every broker gone for longer than `replace_after_ms`: no new copy
    /// goes there.
    pub gone: BTreeSet<u64>,
}

/// What a heal does to a sealed segment's replica set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealKind {
    /// The copy on `lost`, a broker gone for longer than
    /// `replace_after_ms`, is re-created on a live broker holding none,
    /// which takes `lost`'s place in the set (`ReplaceReplica`).
    Replace { lost: u64 },
    /// The copy on `holder`, a live broker, is broken: rebuilt there from
    /// an intact copy, the replica set unchanged (ADR 0110).
    Rebuild { holder: u64 },
    /// The segment has fewer copies than its topic's factor (a failover
    /// placed it on the brokers it could reach): a new copy on a live
    /// broker holding none joins the end of the set (`AddReplica`, ADR
    /// 0117).
    Add,
}

impl HealKind {
    /// The broker whose copy the heal stands in for or rebuilds; `None`
    /// for an added copy.
    pub fn holder(self) -> Option<u64> {
        match self {
            HealKind::Replace { lost } => Some(lost),
            HealKind::Rebuild { holder } => Some(holder),
            HealKind::Add => None,
        }
    }

    /// The word logs and metrics name the heal by.
    pub fn name(self) -> &'static str {
        match self {
            HealKind::Replace { .. } => "replace",
            HealKind::Rebuild { .. } => "rebuild",
            HealKind::Add => "add",
        }
    }
}

/// A sealed segment whose copies a coordinator wants scrubbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubTarget {
    pub topic: String,
    pub segment: SegmentId,
    pub seal: crate::model::SealRecord,
    pub replicas: Vec<u64>,
}
