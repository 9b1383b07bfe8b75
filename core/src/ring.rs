//! The hash ring: which vnode owns a topic's metadata.
//!
//! The ring is a set of vnodes whose arcs tile the u64 ring; a topic belongs
//! to the vnode whose arc holds `ring_position(name)` (`xxh3_64` of the
//! name). A fresh ring of `n` vnodes gives vnode `i` the arc
//! `[i * 2^64 / n, (i + 1) * 2^64 / n)`, so every broker that builds a ring
//! from the same count places every topic identically, without talking to
//! anyone. A split halves one vnode's arc: the parent keeps the lower half, a
//! new vnode takes the upper half. Every change bumps `version`, so a broker
//! can tell which of two rings is newer (a later change will keep the ring in
//! a raft group of its own and spread its version by gossip).
//!
//! Vnode `v`'s metadata lives in raft group `v` (`VnodeEntry::group_id`); the
//! ring's own group has the id `RING_GROUP_ID`, outside the vnodes' ids.

use crate::model::{RING_END, RingArc, ring_position};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The vnode count of a fresh ring unless configured otherwise.
pub const VNODES_DEFAULT: u32 = 16;
/// The most vnodes a ring may hold, counting those made by splits.
pub const VNODES_MAX: u32 = 4096;
/// The raft group id of the ring itself.
pub const RING_GROUP_ID: u64 = 1 << 32;
/// Each vnode issues range and segment ids from its own block of
/// `2^ID_BLOCK_BITS` ids.
pub const ID_BLOCK_BITS: u32 = 40;
/// How routing errors name the ring's own group, which is no vnode.
pub const RING_VNODE: VnodeId = VnodeId(u32::MAX);
/// The version byte in front of an encoded ring.
pub const RING_FORMAT_VERSION: u8 = 1;

/// A vnode's id; also its raft group id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VnodeId(pub u32);

impl VnodeId {
    /// The raft group holding this vnode's metadata.
    pub fn group_id(self) -> u64 {
        u64::from(self.0)
    }

    /// The first range and segment id this vnode issues: each vnode has a
    /// block of 2^40 ids, so ids are unique across the ring (vnode 0's block
    /// starts at 0, which keeps a lone broker's ids as they were).
    pub fn id_base(self) -> u64 {
        u64::from(self.0) << ID_BLOCK_BITS
    }
}

impl fmt::Display for VnodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vnode/{}", self.0)
    }
}

/// One vnode on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnodeEntry {
    pub id: VnodeId,
    pub arc: RingArc,
}

/// Why a ring cannot be built, changed or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("a ring needs between 1 and {max} vnodes, not {count}")]
    VnodeCount { count: u32, max: u32 },
    #[error("{vnode} is not on the ring")]
    NoSuchVnode { vnode: VnodeId },
    #[error("{vnode} holds a single position and cannot split")]
    ArcTooSmall { vnode: VnodeId },
    #[error("{vnode} was issued already")]
    Issued { vnode: VnodeId },
    #[error("the ring is full: {max} vnodes")]
    Full { max: u32 },
    #[error("ring encoding: {reason}")]
    Codec { reason: String },
    #[error("the ring's arcs do not tile the ring: {reason}")]
    NotTiled { reason: String },
}

/// The ring: versioned, serializable, the same on every broker that holds
/// the same version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "RingRepr")]
pub struct Ring {
    version: u64,
    /// Vnodes by arc start: ordered, so lookup is a floor search.
    by_start: BTreeMap<u64, VnodeEntry>,
    next_vnode: u32,
    /// The cluster's brokers once one joined or was decommissioned (ADR
    /// 0104); empty while the cluster is the one it was formed with, whose
    /// nodes every broker knows from its configuration.
    #[serde(default)]
    members: BTreeMap<u64, MemberState>,
    /// What places vnode replicas (ADR 0121).
    #[serde(default)]
    placement: RingPlacement,
}

/// The inputs of vnode placement the ring carries (ADR 0121).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct RingPlacement {
    /// Each broker's attributes as it last committed them: what vnode
    /// placement constraints read, the same on every broker holding this
    /// version (gossiped attributes may differ for a while).
    attributes: BTreeMap<u64, BTreeMap<String, String>>,
    /// The placement constraints of vnode replicas: those of the storage
    /// policy named [`VNODES_POLICY`]. Empty: rendezvous hashing alone.
    vnode_placement: Vec<String>,
}

impl RingPlacement {
    fn is_empty(&self) -> bool {
        self.attributes.is_empty() && self.vnode_placement.is_empty()
    }
}

/// How a ring is encoded. The encoding is positional (MessagePack arrays),
/// so optional fields are left out only from the end: `members` is written
/// when it or anything after it is non-empty, and a ring that never used
/// the later fields encodes exactly as before them.
#[derive(Serialize)]
struct RingRepr {
    version: u64,
    by_start: BTreeMap<u64, VnodeEntry>,
    next_vnode: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    members: Option<BTreeMap<u64, MemberState>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<RingPlacement>,
}

impl From<Ring> for RingRepr {
    fn from(ring: Ring) -> RingRepr {
        let placement = (!ring.placement.is_empty()).then_some(ring.placement);
        let members = (placement.is_some() || !ring.members.is_empty()).then_some(ring.members);
        RingRepr {
            version: ring.version,
            by_start: ring.by_start,
            next_vnode: ring.next_vnode,
            members,
            placement,
        }
    }
}

/// The storage policy whose placement constraints place vnode replicas
/// (ADR 0121); its retention rule, if any, applies to topics bound to it
/// like any policy's.
pub const VNODES_POLICY: &str = "vnodes";
/// Attributes one member may commit to the ring (a gossiped identity
/// carries as many).
pub const MEMBER_ATTRIBUTES_MAX: usize = 32;
/// Longest attribute key or value a member may commit, in bytes.
pub const MEMBER_ATTRIBUTE_BYTES_MAX: usize = 128;

/// What a broker of the cluster is doing (ADR 0104).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MemberState {
    /// Hosts vnode replicas and takes new ones.
    Active,
    /// Decommissioned: its vnode replicas move to the active brokers, and
    /// it takes no new ones. Admitting it again makes it active.
    Decommissioned,
}

impl MemberState {
    /// How the state reads in status output.
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Active => "active",
            MemberState::Decommissioned => "decommissioned",
        }
    }
}

impl Ring {
    /// A fresh ring of `count` vnodes with equal arcs, at version 1.
    pub fn new(count: u32) -> Result<Ring, RingError> {
        if count == 0 || count > VNODES_MAX {
            return Err(RingError::VnodeCount {
                count,
                max: VNODES_MAX,
            });
        }
        let n = u128::from(count);
        let mut by_start = BTreeMap::new();
        for i in 0..count {
            let i = u128::from(i);
            // Both bounds are below 2^64 except the last end, which is 2^64.
            let start = (i * RING_END / n) as u64;
            let end = (i + 1) * RING_END / n;
            let id = VnodeId(i as u32);
            by_start.insert(
                start,
                VnodeEntry {
                    id,
                    arc: RingArc { start, end },
                },
            );
        }
        Ok(Ring {
            version: 1,
            by_start,
            next_vnode: count,
            members: BTreeMap::new(),
            placement: RingPlacement::default(),
        })
    }

    /// The cluster's brokers and their states; empty while the cluster is
    /// the one it was formed with (see [`Ring::members_or`]).
    pub fn members(&self) -> &BTreeMap<u64, MemberState> {
        &self.members
    }

    /// The brokers of the cluster: the ring's members once any joined or
    /// was decommissioned, else `formed` (the nodes the cluster was
    /// formed with, all active).
    pub fn members_or(&self, formed: &[u64]) -> BTreeMap<u64, MemberState> {
        if self.members.is_empty() {
            formed.iter().map(|n| (*n, MemberState::Active)).collect()
        } else {
            self.members.clone()
        }
    }

    /// Whether the cluster's brokers are still the ones it was formed with.
    pub fn formed_members(&self) -> bool {
        self.members.is_empty()
    }

    /// Sets `node`'s state, first listing `formed` as active members if the
    /// ring lists none yet. Bumps the version if anything changed, and
    /// returns whether it did.
    pub fn set_member(&mut self, formed: &[u64], node: u64, state: MemberState) -> bool {
        let mut members = self.members_or(formed);
        if members.get(&node) == Some(&state) {
            return false;
        }
        members.insert(node, state);
        self.members = members;
        self.version += 1;
        true
    }

    /// The attributes `node` committed, if it did.
    pub fn attributes_of(&self, node: u64) -> Option<&BTreeMap<String, String>> {
        self.placement.attributes.get(&node)
    }

    /// Records `node`'s attributes. Bumps the version if they changed, and
    /// returns whether they did.
    pub fn set_attributes(&mut self, node: u64, attributes: BTreeMap<String, String>) -> bool {
        if self.placement.attributes.get(&node) == Some(&attributes) {
            return false;
        }
        self.placement.attributes.insert(node, attributes);
        self.version += 1;
        true
    }

    /// The placement constraints of vnode replicas (empty: none).
    pub fn vnode_placement(&self) -> &[String] {
        &self.placement.vnode_placement
    }

    /// Sets the placement constraints of vnode replicas. Bumps the version
    /// if they changed, and returns whether they did.
    pub fn set_vnode_placement(&mut self, constraints: Vec<String>) -> bool {
        if self.placement.vnode_placement == constraints {
            return false;
        }
        self.placement.vnode_placement = constraints;
        self.version += 1;
        true
    }

    /// Bumped by every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// How many vnodes the ring holds.
    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Never true: a ring holds at least one vnode.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Every vnode in ring order.
    pub fn vnodes(&self) -> impl Iterator<Item = &VnodeEntry> {
        self.by_start.values()
    }

    /// One vnode by id.
    pub fn vnode(&self, id: VnodeId) -> Option<&VnodeEntry> {
        self.by_start.values().find(|v| v.id == id)
    }

    /// The vnode owning a ring position.
    pub fn owner_of_position(&self, position: u64) -> &VnodeEntry {
        // The arcs tile the ring from 0 (checked on construction and
        // decode), so a floor entry always exists; the fallback is the
        // first vnode rather than a panic.
        self.by_start
            .range(..=position)
            .next_back()
            .or_else(|| self.by_start.iter().next())
            .map(|(_, v)| v)
            .unwrap_or(&FALLBACK)
    }

    /// The vnode owning a topic's metadata.
    pub fn owner(&self, topic: &str) -> &VnodeEntry {
        self.owner_of_position(ring_position(topic))
    }

    /// Splits `vnode`: it keeps the lower half of its arc, a new vnode
    /// (returned) takes the upper half. Bumps the version.
    pub fn split(&mut self, vnode: VnodeId) -> Result<VnodeEntry, RingError> {
        self.split_into(vnode, VnodeId(self.next_vnode))
    }

    /// The id the next split gives its new vnode.
    pub fn next_vnode_id(&self) -> VnodeId {
        VnodeId(self.next_vnode)
    }

    /// Splits `vnode` giving the upper half to `child`, an id never issued
    /// (at least `next_vnode_id`): ids skipped by an aborted split are never
    /// reused, because a group may already exist under them. Bumps the
    /// version.
    pub fn split_into(&mut self, vnode: VnodeId, child: VnodeId) -> Result<VnodeEntry, RingError> {
        let entry = *self.vnode(vnode).ok_or(RingError::NoSuchVnode { vnode })?;
        if child.0 >= VNODES_MAX || self.by_start.len() as u32 >= VNODES_MAX {
            return Err(RingError::Full { max: VNODES_MAX });
        }
        if child.0 < self.next_vnode {
            return Err(RingError::Issued { vnode: child });
        }
        let (lower, upper) = entry.arc.halves().ok_or(RingError::ArcTooSmall { vnode })?;
        let new = VnodeEntry {
            id: child,
            arc: upper,
        };
        self.next_vnode = child.0 + 1;
        self.by_start.insert(
            lower.start,
            VnodeEntry {
                id: vnode,
                arc: lower,
            },
        );
        self.by_start.insert(upper.start, new);
        self.version += 1;
        Ok(new)
    }

    /// The encoded ring: a format version byte, then rmp-serde.
    pub fn encode(&self) -> Result<Vec<u8>, RingError> {
        let mut out = vec![RING_FORMAT_VERSION];
        rmp_serde::encode::write(&mut out, self).map_err(|e| RingError::Codec {
            reason: e.to_string(),
        })?;
        Ok(out)
    }

    /// A ring from `encode`'s bytes, checked to tile the ring.
    pub fn decode(bytes: &[u8]) -> Result<Ring, RingError> {
        let codec = |reason: String| RingError::Codec { reason };
        let (&version, body) = bytes.split_first().ok_or(codec("empty".to_owned()))?;
        if version != RING_FORMAT_VERSION {
            return Err(codec(format!("format version {version}")));
        }
        let ring: Ring = rmp_serde::from_slice(body).map_err(|e| codec(e.to_string()))?;
        ring.check()?;
        Ok(ring)
    }

    /// Checks that the arcs tile the ring exactly and ids are unique.
    pub fn check(&self) -> Result<(), RingError> {
        let not_tiled = |reason: String| Err(RingError::NotTiled { reason });
        let mut expected_start: u128 = 0;
        let mut ids = std::collections::BTreeSet::new();
        for (start, entry) in &self.by_start {
            if entry.arc.start != *start || u128::from(*start) != expected_start {
                return not_tiled(format!("gap or overlap at {start:#x}"));
            }
            if RingArc::new(entry.arc.start, entry.arc.end).is_none() {
                return not_tiled(format!("empty arc at {start:#x}"));
            }
            if !ids.insert(entry.id) || entry.id.0 >= self.next_vnode {
                return not_tiled(format!("{} is duplicated or unissued", entry.id));
            }
            expected_start = entry.arc.end;
        }
        if expected_start != RING_END {
            return not_tiled("the arcs end before the top of the ring".to_owned());
        }
        if self.members.contains_key(&0) {
            return Err(RingError::Codec {
                reason: "node id 0 among the members".to_owned(),
            });
        }
        Ok(())
    }
}

static FALLBACK: VnodeEntry = VnodeEntry {
    id: VnodeId(0),
    arc: RingArc::FULL,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_ring_tiles_the_whole_ring() {
        for count in [1, 2, 3, 7, 16, 255, 256, 4096] {
            let ring = Ring::new(count).unwrap();
            ring.check().unwrap();
            assert_eq!(ring.len(), count as usize);
        }
        assert!(Ring::new(0).is_err());
        assert!(Ring::new(4097).is_err());
    }

    #[test]
    fn the_ends_of_the_ring_belong_to_the_first_and_last_vnodes() {
        let ring = Ring::new(16).unwrap();
        assert_eq!(ring.owner_of_position(0).id, VnodeId(0));
        assert_eq!(ring.owner_of_position(u64::MAX).id, VnodeId(15));
        assert_eq!(ring.owner_of_position(1 << 60).id, VnodeId(1));
        assert_eq!(ring.owner_of_position((1 << 60) - 1).id, VnodeId(0));
    }

    #[test]
    fn a_split_gives_the_upper_half_to_a_new_vnode() {
        let mut ring = Ring::new(2).unwrap();
        let new = ring.split(VnodeId(1)).unwrap();
        assert_eq!(new.id, VnodeId(2));
        assert_eq!(new.arc.start, 3 << 62);
        assert_eq!(ring.version(), 2);
        assert_eq!(ring.vnode(VnodeId(1)).unwrap().arc.end, 3 << 62);
        ring.check().unwrap();
        assert_eq!(ring.owner_of_position(u64::MAX).id, VnodeId(2));
    }

    #[test]
    fn members_start_as_the_formed_nodes_and_each_change_bumps_the_version() {
        let mut ring = Ring::new(4).unwrap();
        let unchanged = ring.encode().unwrap();
        assert!(ring.formed_members());
        assert_eq!(
            ring.members_or(&[1, 2]),
            BTreeMap::from([(1, MemberState::Active), (2, MemberState::Active)])
        );
        assert!(ring.set_member(&[1, 2], 3, MemberState::Active));
        assert_eq!(ring.version(), 2);
        assert!(
            !ring.set_member(&[1, 2], 3, MemberState::Active),
            "idempotent"
        );
        assert_eq!(ring.version(), 2);
        assert!(ring.set_member(&[9], 1, MemberState::Decommissioned));
        assert_eq!(
            ring.members_or(&[9]),
            BTreeMap::from([
                (1, MemberState::Decommissioned),
                (2, MemberState::Active),
                (3, MemberState::Active)
            ]),
            "the formed nodes are listed once, by the first change"
        );
        assert_eq!(Ring::decode(&ring.encode().unwrap()).unwrap(), ring);
        // A ring whose members never changed encodes as before members existed.
        let old: Ring = Ring::decode(&unchanged).unwrap();
        assert!(old.formed_members());
        assert_eq!(old.encode().unwrap(), unchanged);
    }

    #[test]
    fn a_damaged_encoding_is_refused() {
        let ring = Ring::new(4).unwrap();
        let bytes = ring.encode().unwrap();
        assert_eq!(Ring::decode(&bytes).unwrap(), ring);
        assert!(Ring::decode(&[]).is_err());
        assert!(Ring::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut gap = ring.clone();
        gap.by_start.remove(&(1 << 62));
        assert!(matches!(
            Ring::decode(&gap.encode().unwrap()),
            Err(RingError::NotTiled { .. })
        ));
    }
}
