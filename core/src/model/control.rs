//! The control records a group keeps beside its topics: a split's fence and
//! seed, a coordinator's lease, and (in the ring's own group) the ring.
//!
//! A vnode split moves the upper half of a vnode's arc into a new group in
//! four replicated steps, each idempotent so an interrupted split resumes by
//! repeating them (ADR 0082):
//! 1. `FenceArc` in the old group: topic commands and reads in the moving
//!    half are refused with `ModelError::Moved` (retriable) from then on, so
//!    that half's metadata stops changing.
//! 2. `SeedVnode` in the new group: exactly the moved topics, their ranges
//!    and segments, exported from the fenced old group.
//! 3. `CommitSplit` in the ring group: the ring now names the new vnode.
//! 4. `NarrowArc` in the old group: it drops the moved topics and keeps the
//!    lower half only.
//!
//! A lease (`AcquireLease`) is judged by no clock at all (ADR 0122): the
//! machine counts grants and renewals (`Lease::generation`), and another
//! holder takes the lease only by naming the generation it saw unchanged
//! for a whole duration on its own monotonic clock. The times the commands
//! carry are recorded for display only. The holder measures its own
//! deadline from before it proposed (see `vnodes::lease`).

use super::arc::RingArc;
use super::command::{ModelError, Outcome};
use super::features::FeatureTable;
use super::state::{MetadataState, Range, RangeId, Segment, SegmentId, StoragePolicy, Topic};
use crate::ring::{
    MEMBER_ATTRIBUTE_BYTES_MAX, MEMBER_ATTRIBUTES_MAX, Ring, VNODES_POLICY, VnodeId,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The longest lease a group grants: a holder that vanishes blocks the work
/// for at most this long.
pub const LEASE_DURATION_MAX_MS: u64 = 10 * 60 * 1000;

/// The metadata a split moves into a new vnode: the topics whose ring
/// position lies in `arc`, with every range and segment they hold, and the
/// counters the new vnode continues from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnodeSeed {
    /// The new vnode's arc.
    pub arc: RingArc,
    /// The start of the new vnode's id block.
    pub id_base: u64,
    /// The old vnode's incarnation counter, so a topic re-created in the new
    /// vnode never reuses an incarnation a cursor may still name.
    pub next_incarnation: u64,
    pub topics: Vec<Topic>,
    pub ranges: Vec<Range>,
    pub segments: Vec<Segment>,
    /// Policy definitions travel with the topics that may point at them.
    pub policies: Vec<StoragePolicy>,
}

/// A coordinator's lease on its group's continuous work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holder's node id.
    pub holder: u64,
    /// Raised whenever the lease passes to a holder afresh (another holder,
    /// or any holder after a release): a fencing token for the work done
    /// under it.
    pub epoch: u64,
    /// The `at_ms` of the command that granted or last renewed it: the
    /// proposer's wall clock, for display only (ADR 0122).
    pub granted_at_ms: u64,
    /// How long the holder counts each grant or renewal valid for (on its
    /// monotonic clock), and so how long another must see `generation`
    /// unchanged before it may take the lease; 0 once released.
    pub duration_ms: u64,
    /// Raised by every grant and renewal: what another holder waits out.
    /// Last, with a default, so leases recorded before it decode (as 0).
    #[serde(default)]
    pub generation: u64,
}

impl Lease {
    /// When the lease runs out by the wall-clock stamps of the commands:
    /// informational only, since wall clocks may jump or differ between
    /// brokers; no decision reads it (ADR 0122).
    pub fn expires_at_ms(&self) -> u64 {
        self.granted_at_ms.saturating_add(self.duration_ms)
    }

    /// Whether its holder gave it up (`ReleaseLease`): anyone may take it.
    pub fn is_released(&self) -> bool {
        self.duration_ms == 0
    }
}

/// A split the ring group has begun and not yet finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSplit {
    pub parent: VnodeId,
    pub child: VnodeId,
    /// The arc the parent keeps.
    pub lower: RingArc,
    /// The arc the child takes.
    pub upper: RingArc,
    /// Whether the ring already names the child (`CommitSplit` applied).
    pub committed: bool,
}

/// The ring group's record: the ring and the one split in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingRecord {
    pub ring: Ring,
    pub pending: Option<PendingSplit>,
    /// The lowest vnode id the next split may give its child: past every id
    /// a split ever began with, so an aborted split's id (whose group may
    /// exist with a stale seed) is never reused.
    #[serde(default)]
    pub next_child: u32,
    /// The cluster's versions and feature states (ADR 0134). Last, with a
    /// default, and left out while nothing changed it, so a ring record
    /// from before it encodes and decodes as before.
    #[serde(default, skip_serializing_if = "FeatureTable::is_pristine")]
    pub features: FeatureTable,
}

fn ring_error(e: crate::ring::RingError) -> ModelError {
    ModelError::RingRefused {
        reason: e.to_string(),
    }
}

impl MetadataState {
    /// The part of the arc being moved out by a split, if one is fenced.
    pub fn fence(&self) -> Option<RingArc> {
        self.fence
    }

    /// The lease on this group's coordinator work, if one was ever granted.
    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// The ring and its pending split, in the ring's own group.
    pub fn ring_record(&self) -> Option<&RingRecord> {
        self.ring.as_ref()
    }

    /// Whether a topic may be read or changed here: `Err(WrongVnode)`
    /// outside the arc, `Err(Moved)` inside a fenced part of it.
    pub fn check_topic_route(&self, topic: &str) -> Result<(), ModelError> {
        if let Some(arc) = self.arc
            && !arc.holds_topic(topic)
        {
            return Err(ModelError::WrongVnode {
                topic: topic.to_owned(),
                arc,
            });
        }
        if let Some(fence) = self.fence
            && fence.holds_topic(topic)
        {
            return Err(ModelError::Moved {
                topic: topic.to_owned(),
                arc: fence,
            });
        }
        Ok(())
    }

    /// The seed of a new vnode taking `arc`: every topic here whose ring
    /// position lies in it, with its ranges and segments.
    pub fn export_arc(&self, arc: RingArc, id_base: u64) -> VnodeSeed {
        let topics: Vec<Topic> = self
            .topics
            .values()
            .filter(|t| arc.holds_topic(&t.name))
            .cloned()
            .collect();
        let ranges: Vec<Range> = topics
            .iter()
            .flat_map(|t| t.ranges.iter())
            .filter_map(|id| self.ranges.get(id))
            .cloned()
            .collect();
        let segments: Vec<Segment> = ranges
            .iter()
            .flat_map(|r| r.segments.iter())
            .filter_map(|id| self.segments.get(id))
            .cloned()
            .collect();
        VnodeSeed {
            arc,
            id_base,
            next_incarnation: self.next_incarnation,
            topics,
            ranges,
            segments,
            policies: self.policies.values().cloned().collect(),
        }
    }

    pub(super) fn fence_arc(&mut self, moving: RingArc) -> Result<Outcome, ModelError> {
        let Some(arc) = self.arc else {
            return Err(ModelError::FenceOutsideArc { moving, arc: None });
        };
        // The part kept must stay one arc: the moving part shares an end
        // with the vnode's arc and leaves something behind.
        let shares_an_end = moving.start == arc.start || moving.end == arc.end;
        if !arc.covers(&moving) || moving == arc || !shares_an_end {
            return Err(ModelError::FenceOutsideArc {
                moving,
                arc: Some(arc),
            });
        }
        match self.fence {
            Some(fence) if fence == moving => Ok(Outcome::Unchanged),
            Some(fence) => Err(ModelError::FenceInPlace { fence }),
            None => {
                self.fence = Some(moving);
                Ok(Outcome::ArcFenced)
            }
        }
    }

    pub(super) fn lift_fence(&mut self, moving: RingArc) -> Result<Outcome, ModelError> {
        match self.fence {
            Some(fence) if fence == moving => {
                self.fence = None;
                Ok(Outcome::FenceLifted)
            }
            Some(fence) => Err(ModelError::FenceInPlace { fence }),
            None => Ok(Outcome::Unchanged),
        }
    }

    pub(super) fn narrow_arc(&mut self, keep: RingArc) -> Result<Outcome, ModelError> {
        if self.arc == Some(keep) && self.fence.is_none() {
            return Ok(Outcome::Unchanged);
        }
        let (Some(arc), Some(fence)) = (self.arc, self.fence) else {
            return Err(ModelError::NotFenced { keep });
        };
        // `keep` and the fence must tile the arc exactly.
        let tiles = if fence.end == arc.end {
            keep.start == arc.start && keep.end == u128::from(fence.start)
        } else {
            keep.start == u64::try_from(fence.end).unwrap_or(u64::MAX)
                && keep.end == arc.end
                && fence.start == arc.start
        };
        if !tiles {
            return Err(ModelError::NotFenced { keep });
        }
        let dropped: Vec<String> = self
            .topics
            .keys()
            .filter(|name| fence.holds_topic(name))
            .cloned()
            .collect();
        for name in &dropped {
            if let Some(topic) = self.topics.remove(name) {
                for range_id in &topic.ranges {
                    if let Some(range) = self.ranges.remove(range_id) {
                        for segment in &range.segments {
                            self.segments.remove(segment);
                        }
                    }
                }
            }
        }
        self.arc = Some(keep);
        self.fence = None;
        Ok(Outcome::ArcNarrowed { dropped })
    }

    pub(super) fn seed_vnode(&mut self, seed: VnodeSeed) -> Result<Outcome, ModelError> {
        if self.arc == Some(seed.arc) {
            // Seeded already (a resumed split repeats this step).
            return Ok(Outcome::Unchanged);
        }
        if self.arc.is_some() || !self.topics.is_empty() || !self.ranges.is_empty() {
            return Err(ModelError::InvalidSeed {
                reason: "the vnode already holds metadata".to_owned(),
            });
        }
        let invalid = |reason: String| Err(ModelError::InvalidSeed { reason });
        let mut candidate = MetadataState {
            policies: self.policies.clone(),
            ..MetadataState::default()
        };
        for topic in seed.topics {
            if !seed.arc.holds_topic(&topic.name) {
                return invalid(format!("topic {} lies outside the seed's arc", topic.name));
            }
            candidate.topics.insert(topic.name.clone(), topic);
        }
        let mut ranges: BTreeMap<RangeId, Range> = BTreeMap::new();
        for range in seed.ranges {
            ranges.insert(range.id, range);
        }
        let mut segments: BTreeMap<SegmentId, Segment> = BTreeMap::new();
        for segment in seed.segments {
            segments.insert(segment.id, segment);
        }
        let next_range = ranges.keys().last().map_or(0, |id| id.0.saturating_add(1));
        let next_segment = segments
            .keys()
            .last()
            .map_or(0, |id| id.0.saturating_add(1));
        let next_incarnation = candidate
            .topics
            .values()
            .map(|t| t.incarnation.0.saturating_add(1))
            .max()
            .unwrap_or(0)
            .max(seed.next_incarnation);
        candidate.ranges = ranges;
        candidate.segments = segments;
        for policy in seed.policies {
            candidate.policies.insert(policy.name.clone(), policy);
        }
        candidate.next_range_id = next_range.max(seed.id_base);
        candidate.next_segment_id = next_segment.max(seed.id_base);
        candidate.next_incarnation = next_incarnation;
        candidate.arc = Some(seed.arc);
        candidate.lease = self.lease;
        if let Err(violation) = candidate.check_invariants() {
            return invalid(violation.to_string());
        }
        *self = candidate;
        Ok(Outcome::VnodeSeeded)
    }

    /// Grants or renews the lease (ADR 0122). Free (never granted, or
    /// released): granted afresh. Held by `holder`: renewed, same epoch.
    /// Held by another: granted afresh only if `waited_for` names the
    /// current generation, which the proposer saw unchanged for a whole
    /// `duration_ms` on its own monotonic clock; refused otherwise, with
    /// that generation so it can start waiting. `at_ms` decides nothing.
    pub(super) fn acquire_lease(
        &mut self,
        holder: u64,
        duration_ms: u64,
        at_ms: u64,
        waited_for: Option<u64>,
    ) -> Result<Outcome, ModelError> {
        if duration_ms == 0 || duration_ms > LEASE_DURATION_MAX_MS {
            return Err(ModelError::InvalidLease {
                duration_ms,
                max_ms: LEASE_DURATION_MAX_MS,
            });
        }
        let generation = self
            .lease
            .map_or(0, |current| current.generation)
            .saturating_add(1);
        let epoch = match self.lease {
            None => 1,
            Some(current) if current.is_released() => current.epoch.saturating_add(1),
            Some(current) if current.holder == holder => current.epoch,
            Some(current) if waited_for == Some(current.generation) => {
                current.epoch.saturating_add(1)
            }
            Some(current) => {
                return Err(ModelError::LeaseHeld {
                    holder: current.holder,
                    expires_at_ms: current.expires_at_ms(),
                    generation: current.generation,
                    duration_ms: current.duration_ms,
                });
            }
        };
        let lease = Lease {
            holder,
            epoch,
            granted_at_ms: at_ms,
            duration_ms,
            generation,
        };
        self.lease = Some(lease);
        Ok(Outcome::LeaseGranted { lease })
    }

    /// `AcquireLease`, the rule before ADR 0122, kept so a log replays to
    /// the state it was applied to (a replica restored from an older
    /// snapshot and one replaying the log agree): judged by the commands'
    /// wall-clock stamps. The generation is left alone while the group has
    /// never seen an `AcquireLeaseWaited` (it is 0 in every snapshot of
    /// those days) and raised after, so a waiter sees such a renewal too.
    pub(super) fn acquire_lease_stamped(
        &mut self,
        holder: u64,
        duration_ms: u64,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        if duration_ms == 0 || duration_ms > LEASE_DURATION_MAX_MS {
            return Err(ModelError::InvalidLease {
                duration_ms,
                max_ms: LEASE_DURATION_MAX_MS,
            });
        }
        let generation = match self.lease {
            Some(current) if current.generation > 0 => current.generation.saturating_add(1),
            _ => 0,
        };
        let lease = match self.lease {
            // A renewal of a live lease keeps its epoch; the grant time
            // never moves back even if the holder's wall clock did.
            Some(current) if current.holder == holder && at_ms < current.expires_at_ms() => Lease {
                holder,
                epoch: current.epoch,
                granted_at_ms: current.granted_at_ms.max(at_ms),
                duration_ms,
                generation,
            },
            Some(current) if at_ms < current.expires_at_ms() => {
                return Err(ModelError::LeaseHeld {
                    holder: current.holder,
                    expires_at_ms: current.expires_at_ms(),
                    generation: current.generation,
                    duration_ms: current.duration_ms,
                });
            }
            Some(current) => Lease {
                holder,
                epoch: current.epoch.saturating_add(1),
                granted_at_ms: at_ms.max(current.expires_at_ms()),
                duration_ms,
                generation,
            },
            None => Lease {
                holder,
                epoch: 1,
                granted_at_ms: at_ms,
                duration_ms,
                generation,
            },
        };
        self.lease = Some(lease);
        Ok(Outcome::LeaseGranted { lease })
    }

    /// Frees the lease if `holder` holds `epoch` and, when the release
    /// names one, still at `generation`: a release naming an older
    /// generation (the lease renewed or granted again since) changes
    /// nothing (F11). Without a generation, `ReleaseLease`'s rule.
    pub(super) fn release_lease(
        &mut self,
        holder: u64,
        epoch: u64,
        generation: Option<u64>,
    ) -> Result<Outcome, ModelError> {
        match self.lease {
            Some(lease)
                if lease.holder == holder
                    && lease.epoch == epoch
                    && generation.is_none_or(|g| g == lease.generation) =>
            {
                // Free at once, keeping the epoch so the next grant raises
                // it, and the generation so it keeps counting up.
                self.lease = Some(Lease {
                    duration_ms: 0,
                    ..lease
                });
                Ok(Outcome::LeaseReleased)
            }
            _ => Ok(Outcome::Unchanged),
        }
    }

    pub(super) fn init_ring(&mut self, vnodes: u32) -> Result<Outcome, ModelError> {
        if let Some(record) = &self.ring {
            return Ok(Outcome::RingChanged {
                version: record.ring.version(),
            });
        }
        let ring = Ring::new(vnodes).map_err(ring_error)?;
        let version = ring.version();
        let next_child = ring.next_vnode_id().0;
        self.ring = Some(RingRecord {
            ring,
            pending: None,
            next_child,
            features: FeatureTable::default(),
        });
        // A `vnodes` policy put before the ring existed places it too.
        self.sync_vnode_placement();
        let version = self.ring.as_ref().map_or(version, |r| r.ring.version());
        Ok(Outcome::RingChanged { version })
    }

    /// Copies the placement constraints of the policy named
    /// [`VNODES_POLICY`] into the ring (ADR 0121), so every broker's
    /// rebalancer reads them with the ring it already holds. No ring yet:
    /// nothing to do (`init_ring` calls this again).
    pub(super) fn sync_vnode_placement(&mut self) {
        let constraints = self
            .policies
            .get(VNODES_POLICY)
            .map(|p| p.placement.clone())
            .unwrap_or_default();
        if let Some(record) = self.ring.as_mut() {
            record.ring.set_vnode_placement(constraints);
        }
    }

    /// Records `node`'s attributes in the ring (ADR 0121), bounded like
    /// a gossiped identity's.
    pub(super) fn set_member_attributes(
        &mut self,
        node: u64,
        attributes: BTreeMap<String, String>,
    ) -> Result<Outcome, ModelError> {
        if node == 0 {
            return Err(ModelError::InvalidNode);
        }
        let invalid = |reason: String| ModelError::InvalidAttributes { node, reason };
        if attributes.len() > MEMBER_ATTRIBUTES_MAX {
            return Err(invalid(format!(
                "{} attributes, at most {MEMBER_ATTRIBUTES_MAX}",
                attributes.len()
            )));
        }
        if let Some((key, _)) = attributes.iter().find(|(k, v)| {
            k.is_empty()
                || k.len() > MEMBER_ATTRIBUTE_BYTES_MAX
                || v.len() > MEMBER_ATTRIBUTE_BYTES_MAX
        }) {
            return Err(invalid(format!(
                "key {key:?}: keys are 1 to {MEMBER_ATTRIBUTE_BYTES_MAX} bytes, values at most {MEMBER_ATTRIBUTE_BYTES_MAX}"
            )));
        }
        let record = self.ring_mut()?;
        record.ring.set_attributes(node, attributes);
        Ok(Outcome::RingChanged {
            version: record.ring.version(),
        })
    }

    pub(super) fn admit_node(&mut self, node: u64, formed: &[u64]) -> Result<Outcome, ModelError> {
        if node == 0 {
            return Err(ModelError::InvalidNode);
        }
        let record = self.ring_mut()?;
        record
            .ring
            .set_member(formed, node, crate::ring::MemberState::Active);
        Ok(Outcome::RingChanged {
            version: record.ring.version(),
        })
    }

    pub(super) fn decommission_node(
        &mut self,
        node: u64,
        formed: &[u64],
        replicas: u32,
    ) -> Result<Outcome, ModelError> {
        use crate::ring::MemberState;
        let record = self.ring_mut()?;
        let members = record.ring.members_or(formed);
        match members.get(&node) {
            None => return Err(ModelError::NotAMember { node }),
            Some(MemberState::Decommissioned) => {
                return Ok(Outcome::RingChanged {
                    version: record.ring.version(),
                });
            }
            Some(MemberState::Active) => {}
        }
        let active = members
            .values()
            .filter(|s| **s == MemberState::Active)
            .count();
        let needed = (replicas.max(1) as usize).min(active);
        let remaining = active - 1;
        if remaining < needed || remaining == 0 {
            return Err(ModelError::TooFewMembers {
                node,
                remaining,
                needed: needed.max(1),
            });
        }
        record
            .ring
            .set_member(formed, node, MemberState::Decommissioned);
        Ok(Outcome::RingChanged {
            version: record.ring.version(),
        })
    }

    fn ring_mut(&mut self) -> Result<&mut RingRecord, ModelError> {
        self.ring.as_mut().ok_or(ModelError::NoRing)
    }

    pub(super) fn begin_split(&mut self, parent: VnodeId) -> Result<Outcome, ModelError> {
        let record = self.ring_mut()?;
        if let Some(pending) = record.pending {
            if pending.parent == parent {
                return Ok(Outcome::SplitBegun { split: pending });
            }
            return Err(ModelError::SplitInProgress {
                parent: pending.parent,
                child: pending.child,
            });
        }
        // Split a copy to learn the child's id and arcs, and to check the
        // split is possible; the ring changes only at `CommitSplit`.
        let mut trial = record.ring.clone();
        let child = VnodeId(record.next_child.max(trial.next_vnode_id().0));
        let upper = trial.split_into(parent, child).map_err(ring_error)?;
        let lower = trial
            .vnode(parent)
            .map(|v| v.arc)
            .ok_or(ModelError::RingRefused {
                reason: format!("{parent} vanished from a split ring"),
            })?;
        let split = PendingSplit {
            parent,
            child: upper.id,
            lower,
            upper: upper.arc,
            committed: false,
        };
        record.pending = Some(split);
        record.next_child = child.0.saturating_add(1);
        Ok(Outcome::SplitBegun { split })
    }

    fn pending_matching(
        &mut self,
        parent: VnodeId,
        child: VnodeId,
    ) -> Result<Option<&mut PendingSplit>, ModelError> {
        let record = self.ring_mut()?;
        match &mut record.pending {
            None => Ok(None),
            Some(p) if p.parent == parent && p.child == child => Ok(Some(p)),
            Some(_) => Err(ModelError::NoSuchSplit { parent, child }),
        }
    }

    pub(super) fn commit_split(
        &mut self,
        parent: VnodeId,
        child: VnodeId,
    ) -> Result<Outcome, ModelError> {
        let Some(pending) = self.pending_matching(parent, child)?.copied() else {
            return Err(ModelError::NoSuchSplit { parent, child });
        };
        let record = self.ring_mut()?;
        if pending.committed {
            return Ok(Outcome::Unchanged);
        }
        let mut ring = record.ring.clone();
        let made = ring.split_into(parent, child).map_err(ring_error)?;
        if made.id != child || made.arc != pending.upper {
            return Err(ModelError::RingRefused {
                reason: format!("the ring would give {} {}, not {child}", made.id, made.arc),
            });
        }
        let version = ring.version();
        record.ring = ring;
        record.pending = Some(PendingSplit {
            committed: true,
            ..pending
        });
        Ok(Outcome::RingChanged { version })
    }

    pub(super) fn finish_split(
        &mut self,
        parent: VnodeId,
        child: VnodeId,
    ) -> Result<Outcome, ModelError> {
        match self.pending_matching(parent, child)?.copied() {
            None => Ok(Outcome::Unchanged),
            Some(p) if !p.committed => Err(ModelError::SplitNotCommitted { parent, child }),
            Some(_) => {
                self.ring_mut()?.pending = None;
                Ok(Outcome::SplitFinished)
            }
        }
    }

    pub(super) fn abort_split(
        &mut self,
        parent: VnodeId,
        child: VnodeId,
    ) -> Result<Outcome, ModelError> {
        match self.pending_matching(parent, child)?.copied() {
            None => Ok(Outcome::Unchanged),
            Some(p) if p.committed => Err(ModelError::SplitCommitted { parent, child }),
            Some(_) => {
                self.ring_mut()?.pending = None;
                Ok(Outcome::SplitAborted)
            }
        }
    }
}
