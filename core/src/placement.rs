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

/// The brokers that take no new copies as the deciding broker sees them,
/// each set for its own reason. A set names a broker; it never empties a
/// placement (see [`eligible`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Excluded {
    /// Their volume is full (ADR 0111).
    pub full: BTreeSet<u64>,
    /// Decommissioned: their copies are moving off (ADR 0104, 0112).
    pub leaving: BTreeSet<u64>,
    /// Alive in membership, but the deciding broker cannot open a session
    /// with their cluster port (a certificate from another CA, another
    /// cookie, a port cut off; ADR 0155). A copy there would never get a
    /// record, and a primary there could not reach its followers.
    pub unreachable: BTreeSet<u64>,
}

impl Excluded {
    /// Whether any reason names `node`.
    pub fn names(&self, node: u64) -> bool {
        self.full.contains(&node)
            || self.leaving.contains(&node)
            || self.unreachable.contains(&node)
    }
}

/// The brokers new copies may go on, as broker `me` decides: every `live`
/// member (alive in membership) that no reason in `excluded` names, and
/// `me`, unless it is full or leaving and another broker remains. `me`
/// never counts as unreachable to itself. Never empty: with no other
/// broker, `me` takes the copies (a full one then refuses the produce).
/// In node order, each broker once.
pub fn eligible(me: Candidate, live: &[Candidate], excluded: &Excluded) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = live
        .iter()
        .filter(|c| c.node != me.node && !excluded.names(c.node))
        .cloned()
        .collect();
    let me_out = excluded.full.contains(&me.node) || excluded.leaving.contains(&me.node);
    if !me_out || out.is_empty() {
        out.push(me);
    }
    out.sort_by_key(|c| c.node);
    out.dedup_by_key(|c| c.node);
    out
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

    fn nodes(candidates: &[Candidate]) -> Vec<u64> {
        candidates.iter().map(|c| c.node).collect()
    }

    fn set(nodes: &[u64]) -> BTreeSet<u64> {
        nodes.iter().copied().collect()
    }

    #[test]
    fn an_unreachable_broker_gets_no_copy_and_no_primary() {
        let live: Vec<Candidate> = (1..=4).map(|n| c(n, None)).collect();
        let excluded = Excluded {
            unreachable: set(&[4]),
            ..Excluded::default()
        };
        let eligible = eligible(c(1, None), &live, &excluded);
        assert_eq!(nodes(&eligible), [1, 2, 3]);
        for seed in 0..200 {
            for primary in [1, 2, 3] {
                let set = choose_replicas(primary, &eligible, 3, seed).unwrap();
                assert!(!set.contains(&4), "seed {seed}: {set:?}");
            }
        }
        // Too few reachable brokers for the factor: refused, not placed on
        // the unreachable one.
        assert_eq!(
            choose_replicas(1, &eligible, 4, 0),
            Err(PlacementError::TooFewBrokers { factor: 4, live: 3 })
        );
    }

    #[test]
    fn the_deciding_broker_is_never_unreachable_to_itself_and_never_left_alone_with_nothing() {
        let live: Vec<Candidate> = (1..=3).map(|n| c(n, None)).collect();
        // Every peer unreachable (this broker is the one cut off): it
        // places on itself alone, so a factor above one is refused.
        let cut = Excluded {
            unreachable: set(&[1, 2, 3]),
            ..Excluded::default()
        };
        assert_eq!(nodes(&eligible(c(1, None), &live, &cut)), [1]);
        // Not a member of the live view yet (it just started): still placed.
        assert_eq!(
            nodes(&eligible(c(9, None), &live, &Excluded::default())),
            [1, 2, 3, 9]
        );
    }

    #[test]
    fn a_full_or_leaving_broker_places_elsewhere_unless_it_is_alone() {
        let live: Vec<Candidate> = (1..=3).map(|n| c(n, None)).collect();
        let full = Excluded {
            full: set(&[1, 3]),
            ..Excluded::default()
        };
        assert_eq!(nodes(&eligible(c(1, None), &live, &full)), [2]);
        let leaving = Excluded {
            leaving: set(&[1]),
            unreachable: set(&[2]),
            ..Excluded::default()
        };
        assert_eq!(nodes(&eligible(c(1, None), &live, &leaving)), [3]);
        // Alone with every other broker out: the copies stay here.
        let alone = Excluded {
            full: set(&[1]),
            leaving: set(&[2]),
            unreachable: set(&[3]),
        };
        assert_eq!(nodes(&eligible(c(1, None), &live, &alone)), [1]);
        // Each broker once, whatever the view repeats.
        let twice = [c(2, None), c(2, Some("a")), c(1, None)];
        assert_eq!(
            nodes(&eligible(c(1, None), &twice, &Excluded::default())),
            [1, 2]
        );
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
