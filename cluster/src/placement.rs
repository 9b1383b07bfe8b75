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
