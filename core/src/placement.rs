//! What a broker's coordinator manager must change: the pure decision, so
//! it is tested as a function, apart from the actors that carry it out.
//!
//! A broker runs a coordinator for exactly the vnodes that (a) the ring it
//! holds lists and (b) raft says this broker leads. Both sources are read
//! on every leadership event and on a slow timer, so a vnode gained after
//! start (a rebalance, a split) starts its coordinator without a restart.
//! A ring the broker cannot read leaves running coordinators alone:
//! stopping them all is worse than waiting for the next read.

use crate::ring::{Ring, VnodeId};
use std::collections::BTreeSet;

/// The coordinators to start and to stop, in vnode order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordinatorPlan {
    pub start: Vec<VnodeId>,
    pub stop: Vec<VnodeId>,
}

impl CoordinatorPlan {
    /// Whether nothing needs to change.
    pub fn is_empty(&self) -> bool {
        self.start.is_empty() && self.stop.is_empty()
    }
}

/// The change that brings `running` to the vnodes both in `ring` and in
/// `led`. With no readable ring (`None`) nothing changes.
pub fn plan_coordinators(
    ring: Option<&Ring>,
    led: &BTreeSet<VnodeId>,
    running: &BTreeSet<VnodeId>,
) -> CoordinatorPlan {
    let Some(ring) = ring else {
        return CoordinatorPlan::default();
    };
    let wanted: BTreeSet<VnodeId> = ring
        .vnodes()
        .map(|v| v.id)
        .filter(|id| led.contains(id))
        .collect();
    CoordinatorPlan {
        start: wanted.difference(running).copied().collect(),
        stop: running.difference(&wanted).copied().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u32]) -> BTreeSet<VnodeId> {
        ids.iter().map(|i| VnodeId(*i)).collect()
    }

    #[test]
    fn coordinators_follow_leadership_within_the_ring() {
        let ring = Ring::new(4).unwrap();
        let plan = plan_coordinators(Some(&ring), &set(&[0, 2]), &set(&[2, 3]));
        assert_eq!(plan.start, vec![VnodeId(0)]);
        assert_eq!(plan.stop, vec![VnodeId(3)]);
        // A led vnode the ring does not list gets no coordinator.
        let plan = plan_coordinators(Some(&ring), &set(&[9]), &set(&[]));
        assert!(plan.is_empty());
        // Applying the plan reaches a fixed point.
        let plan = plan_coordinators(Some(&ring), &set(&[0, 2]), &set(&[0, 2]));
        assert!(plan.is_empty());
    }

    #[test]
    fn an_unreadable_ring_leaves_running_coordinators_alone() {
        let plan = plan_coordinators(None, &set(&[]), &set(&[1, 2]));
        assert!(plan.is_empty());
    }
}

/// A broker segments may be placed on: its node id and its value of the
/// placement attribute (`zone` by default), if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub node: u64,
    pub zone: Option<String>,
}

/// Why no replica set could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("a replication factor of {factor} needs {factor} live brokers; {live} are live")]
    TooFewBrokers { factor: usize, live: usize },
    #[error("the replication factor must be at least 1")]
    ZeroFactor,
}

/// The replica set of a new segment: `primary` first, then `factor - 1`
/// other candidates. Followers are spread over zones: a candidate in a zone
/// the set does not hold yet is taken before one in a zone it holds (a
/// broker with no zone counts as a zone of its own). Among equals the order
/// is rendezvous hashing of `(seed, node)`, so segments with different
/// seeds spread their followers evenly and the choice is deterministic.
pub fn choose_replicas(
    primary: u64,
    candidates: &[Candidate],
    factor: usize,
    seed: u64,
) -> Result<Vec<u64>, PlacementError> {
    if factor == 0 {
        return Err(PlacementError::ZeroFactor);
    }
    let mut others: Vec<&Candidate> = candidates.iter().filter(|c| c.node != primary).collect();
    others.sort_by_key(|c| c.node);
    others.dedup_by_key(|c| c.node);
    let live = others.len() + 1;
    if live < factor {
        return Err(PlacementError::TooFewBrokers { factor, live });
    }
    let score = |node: u64| {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..].copy_from_slice(&node.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&bytes)
    };
    others.sort_by_key(|c| (score(c.node), c.node));
    let zone_of = |c: &Candidate| {
        c.zone
            .clone()
            .unwrap_or_else(|| format!("\0node-{}", c.node))
    };
    let mut zones: BTreeSet<String> = BTreeSet::new();
    if let Some(p) = candidates.iter().find(|c| c.node == primary) {
        zones.insert(zone_of(p));
    }
    let mut chosen = vec![primary];
    while chosen.len() < factor {
        let pick = others
            .iter()
            .position(|c| !zones.contains(&zone_of(c)))
            .unwrap_or(0);
        let c = others.remove(pick);
        zones.insert(zone_of(c));
        chosen.push(c.node);
    }
    Ok(chosen)
}

#[cfg(test)]
mod replica_tests {
    use super::*;

    fn c(node: u64, zone: Option<&str>) -> Candidate {
        Candidate {
            node,
            zone: zone.map(str::to_owned),
        }
    }

    #[test]
    fn the_primary_comes_first_and_copies_are_distinct() {
        let all = [c(1, None), c(2, None), c(3, None), c(4, None)];
        for seed in 0..50 {
            let set = choose_replicas(2, &all, 3, seed).unwrap();
            assert_eq!(set[0], 2);
            let distinct: BTreeSet<_> = set.iter().collect();
            assert_eq!(distinct.len(), 3);
        }
    }

    #[test]
    fn followers_spread_over_zones_before_repeating_one() {
        let all = [
            c(1, Some("a")),
            c(2, Some("a")),
            c(3, Some("a")),
            c(4, Some("b")),
            c(5, Some("c")),
        ];
        for seed in 0..50 {
            let mut set = choose_replicas(1, &all, 3, seed).unwrap();
            set.sort_unstable();
            assert_eq!(set, [1, 4, 5], "one copy per zone");
        }
    }

    #[test]
    fn seeds_spread_followers_over_brokers() {
        let all: Vec<Candidate> = (1..=6).map(|n| c(n, None)).collect();
        let mut counts = [0u32; 7];
        for seed in 0..600 {
            for node in &choose_replicas(1, &all, 3, seed).unwrap()[1..] {
                counts[*node as usize] += 1;
            }
        }
        // 1,200 follower copies over five brokers: each near 240.
        for &n in &counts[2..] {
            assert!((150..=330).contains(&n), "{counts:?}");
        }
    }

    #[test]
    fn too_few_brokers_or_a_zero_factor_is_refused() {
        let all = [c(1, None), c(2, None)];
        assert_eq!(
            choose_replicas(1, &all, 3, 0),
            Err(PlacementError::TooFewBrokers { factor: 3, live: 2 })
        );
        assert_eq!(
            choose_replicas(1, &all, 0, 0),
            Err(PlacementError::ZeroFactor)
        );
        assert_eq!(choose_replicas(1, &all, 1, 0), Ok(vec![1]));
    }
}
