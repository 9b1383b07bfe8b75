//! Where a segment's copies go: the live brokers with room that are not
//! leaving, the replica set chosen among them (by zone, or by a storage
//! policy's placement constraints, ADR 0116), and the primary.

use std::collections::BTreeSet;

use std::collections::BTreeMap;

use malachi_core::load::{BrokerLoad, LOAD_ATTRIBUTE, rank_primaries};
use malachi_core::model::NodeId;
use malachi_core::placement::{Candidate, Excluded, choose_replicas, eligible};
use tracing::{debug, info, warn};

use super::{CoordError, CoordinatorState};
use crate::control::metadata::read_owner;
use crate::control::shared::Shared;

impl CoordinatorState {
    /// The primary of a new active segment (a topic's first, a split's
    /// moved child): the live candidate with the fewest primaries and the
    /// lowest write rate, ties broken by the rendezvous hash of `seed`
    /// (ADR 0144), other than `exclude` when another exists. This broker
    /// when it is the only candidate.
    pub(super) fn primary_for(&self, seed: u64, exclude: &[NodeId]) -> NodeId {
        let candidates: Vec<u64> = self.candidates().iter().map(|c| c.node).collect();
        let others: Vec<u64> = candidates
            .iter()
            .copied()
            .filter(|n| !exclude.contains(&NodeId(*n)))
            .collect();
        let pool = if others.is_empty() {
            &candidates
        } else {
            &others
        };
        let loads = load_view(&self.shared);
        let ranked = rank_primaries(pool, &loads, seed);
        debug!(vnode = %self.vnode, seed, ?ranked, ?loads, "primary by load");
        ranked.first().copied().map_or(self.node(), NodeId)
    }

    /// The brokers of the cluster that take segment copies, live or not:
    /// the ring's active members (the configured nodes until the ring
    /// records members).
    pub(super) fn active_members(&self) -> usize {
        let configured = self.shared.config.cluster_nodes().len();
        let Ok(plane) = self.shared.plane() else {
            return configured;
        };
        let Some(host) = plane.host() else {
            return configured;
        };
        host.members()
            .values()
            .filter(|state| **state == malachi_core::ring::MemberState::Active)
            .count()
            .max(1)
    }

    /// The live brokers segments may be placed on, with their zones.
    pub(super) fn candidates(&self) -> Vec<Candidate> {
        placement_candidates(&self.shared)
    }

    /// The replica set of a new segment with `factor` copies, its primary
    /// this vnode's placement; `seed` spreads the followers. A storage
    /// policy with placement constraints (`policy`) chooses the set over
    /// the brokers' attributes instead (ADR 0116), its primary then the
    /// preferred first copy.
    pub(super) fn replicas(
        &self,
        policy: Option<&str>,
        primary: NodeId,
        factor: usize,
        seed: u64,
    ) -> Result<Vec<NodeId>, CoordError> {
        let candidates = self.candidates();
        let primary = primary_with_room(primary.0, &candidates, seed);
        let constraints = self.constraints(policy);
        if !constraints.is_empty() {
            return self.constrained(&candidates, &[], &[primary], factor, seed, &constraints);
        }
        let chosen = choose_replicas(primary, &candidates, factor, seed)?;
        Ok(placed(chosen, factor))
    }

    /// A successor's replica set: as many copies as `previous` had, or as
    /// the live brokers allow (at least the primary's), primary `primary`.
    pub(super) fn successor_replicas(
        &self,
        topic: &str,
        primary: NodeId,
        previous: usize,
        seed: u64,
    ) -> Result<Vec<NodeId>, CoordError> {
        let live = self.candidates().len();
        let policy = self.policy_of(topic);
        self.replicas(
            policy.as_deref(),
            primary,
            previous.clamp(1, live.max(1)),
            seed,
        )
    }

    /// The policy name `topic` points at, from this broker's replica.
    pub(super) fn policy_of(&self, topic: &str) -> Option<String> {
        let plane = self.shared.plane().ok()?;
        read_owner(plane.as_ref(), topic, |s| {
            s.topic(topic).and_then(|t| t.policy.clone())
        })
    }

    pub(super) fn constraints(
        &self,
        policy: Option<&str>,
    ) -> Vec<malachi_core::constraints::Constraint> {
        policy_constraints(&self.shared, policy)
    }

    /// A replica set chosen by placement constraints over the candidates'
    /// gossiped attributes (ADR 0116).
    pub(super) fn constrained(
        &self,
        candidates: &[Candidate],
        fixed: &[u64],
        preferred: &[u64],
        factor: usize,
        seed: u64,
        constraints: &[malachi_core::constraints::Constraint],
    ) -> Result<Vec<NodeId>, CoordError> {
        let nodes: Vec<u64> = candidates.iter().map(|c| c.node).collect();
        let brokers = brokers_with_attributes(&self.shared, &nodes);
        let found = malachi_core::constraints::place(
            fixed,
            preferred,
            &brokers,
            factor,
            seed,
            constraints,
        )?;
        if !found.relaxed.is_empty() {
            info!(vnode = %self.vnode, relaxed = ?found.relaxed, nodes = ?found.nodes, "no replica set meets these soft placement constraints; placed without them");
        }
        Ok(placed(found.nodes, factor))
    }
}

/// The live brokers segments may be placed on, with their zones: those
/// membership calls alive, less the full, the leaving and those whose
/// cluster port this broker cannot reach (`malachi_core::placement::eligible`).
pub(crate) fn placement_candidates(shared: &Shared) -> Vec<Candidate> {
    let me = shared.config.node_id;
    let attribute = &shared.config.placement_attribute;
    let mut excluded = Excluded::default();
    let live: Vec<Candidate> = match shared.fabric() {
        Some(fabric) => fabric
            .membership
            .view()
            .live()
            .map(|m| {
                // A broker whose volume is full takes no new copies (ADR
                // 0111); this one knows its own state first-hand, below.
                if m.node_id != me && !crate::common::volume::has_room(&m.attributes) {
                    excluded.full.insert(m.node_id);
                }
                Candidate {
                    node: m.node_id,
                    zone: m.attributes.get(attribute).cloned(),
                }
            })
            .collect(),
        None => Vec::new(),
    };
    if shared.data.space.is_full() {
        excluded.full.insert(me);
    }
    // A decommissioned broker takes no new copies (ADR 0104), this one
    // included when another can (it still leads vnodes while their
    // replicas move, and must place their segments elsewhere).
    if let Ok(plane) = shared.plane()
        && let Some(host) = plane.host()
    {
        excluded.leaving = host
            .members()
            .into_iter()
            .filter(|(_, state)| *state == malachi_core::ring::MemberState::Decommissioned)
            .map(|(node, _)| node)
            .collect();
    }
    // Alive in SWIM is not enough: a copy on a broker whose cluster port
    // refuses this one (another CA's certificate, another cookie) would
    // never get a record (ADR 0155).
    excluded.unreachable = shared.links.unreachable();
    let this = Candidate {
        node: me,
        zone: shared.config.attributes.get(attribute).cloned(),
    };
    let candidates = eligible(this, &live, &excluded);
    if !excluded.unreachable.is_empty() {
        debug!(unreachable = ?excluded.unreachable, candidates = ?candidates, "placement leaves out brokers whose cluster port is unreachable");
    }
    candidates
}

/// Each broker's load as this broker sees it (ADR 0144): what it gossips
/// (`malachi.load`), its primaries raised to what this broker's replicas
/// of the metadata count already (gossip lags a placement by a poll; the
/// replicas see it at once), and this broker's own primaries first-hand.
pub(crate) fn load_view(shared: &Shared) -> BTreeMap<u64, BrokerLoad> {
    let mut loads: BTreeMap<u64, BrokerLoad> = BTreeMap::new();
    if let Some(fabric) = shared.fabric() {
        for member in fabric.membership.view().live() {
            let Some(text) = member.attributes.get(LOAD_ATTRIBUTE) else {
                continue;
            };
            match BrokerLoad::from_attribute(text) {
                Ok(load) => {
                    loads.insert(member.node_id, load);
                }
                Err(e) => {
                    debug!(node = member.node_id, error = %e, "a broker's load does not parse; counted idle")
                }
            }
        }
    }
    if let Ok(plane) = shared.plane() {
        let mut counted: BTreeMap<u64, u64> = BTreeMap::new();
        plane.view_each(&mut |state| {
            for (node, count) in state.primaries() {
                *counted.entry(node).or_insert(0) += count;
            }
        });
        for (node, count) in counted {
            let load = loads.entry(node).or_default();
            load.primaries = load.primaries.max(count);
        }
    }
    let me = loads.entry(shared.config.node_id).or_default();
    me.primaries = me.primaries.max(shared.data.segments.lock().len() as u64);
    loads
}

/// The placement constraints of the policy `policy` names, as this broker
/// last read the cluster's policies (ADR 0116); none for no policy or an
/// unresolved name (such a topic places as one without a policy).
pub(crate) fn policy_constraints(
    shared: &Shared,
    policy: Option<&str>,
) -> Vec<malachi_core::constraints::Constraint> {
    let Some(name) = policy else {
        return Vec::new();
    };
    let texts = shared
        .memory
        .policy_cache
        .read()
        .get(name)
        .map(|p| p.placement.clone())
        .unwrap_or_default();
    match malachi_core::constraints::parse_all(&texts) {
        Ok(constraints) => constraints,
        Err(e) => {
            // `put_policy` refuses what does not parse: a policy from an
            // older broker, say. Placed as without constraints.
            warn!(policy = name, error = %e, "a policy's placement constraint does not parse; ignored");
            Vec::new()
        }
    }
}

/// `nodes` with their gossiped attributes (this broker's own from its
/// configuration), for constrained placement.
pub(crate) fn brokers_with_attributes(
    shared: &Shared,
    nodes: &[u64],
) -> Vec<malachi_core::constraints::Broker> {
    let gossiped: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, String>> =
        match shared.fabric() {
            Some(fabric) => fabric
                .membership
                .view()
                .live()
                .map(|m| (m.node_id, m.attributes.clone()))
                .collect(),
            None => std::collections::BTreeMap::new(),
        };
    let me = shared.config.node_id;
    nodes
        .iter()
        .map(|&node| malachi_core::constraints::Broker {
            node,
            attributes: if node == me {
                shared.config.attributes.clone()
            } else {
                gossiped.get(&node).cloned().unwrap_or_default()
            },
        })
        .collect()
}

/// The primary of a new segment: `wanted` if it may take copies, else the
/// candidate `seed` picks (a full broker's vnodes place their segments on
/// brokers with room, ADR 0111).
pub(crate) fn primary_with_room(
    wanted: u64,
    candidates: &[malachi_core::placement::Candidate],
    seed: u64,
) -> u64 {
    if candidates.is_empty() || candidates.iter().any(|c| c.node == wanted) {
        return wanted;
    }
    let mut nodes: Vec<u64> = candidates.iter().map(|c| c.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let at = usize::try_from(seed % nodes.len() as u64).unwrap_or(0);
    nodes[at]
}

/// A replica set as placed: `nodes`, checked to be `factor` distinct
/// brokers, the size the placement was asked for. A broker listed twice
/// would count its one copy twice toward a quorum; a short set would
/// commit on fewer copies than the topic was promised.
pub(super) fn placed(nodes: Vec<u64>, factor: usize) -> Vec<NodeId> {
    assert_eq!(
        nodes.len(),
        factor,
        "a replica set is placed at the wanted size: {nodes:?}"
    );
    let distinct: BTreeSet<u64> = nodes.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        nodes.len(),
        "a replica set's brokers are distinct: {nodes:?}"
    );
    nodes.into_iter().map(NodeId).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placed_set_of_distinct_brokers_at_the_factor_keeps_its_order() {
        assert_eq!(
            placed(vec![3, 1, 2], 3),
            vec![NodeId(3), NodeId(1), NodeId(2)]
        );
    }

    #[test]
    #[should_panic(expected = "a replica set's brokers are distinct")]
    fn a_placed_set_naming_a_broker_twice_panics() {
        placed(vec![1, 2, 1], 3);
    }

    #[test]
    #[should_panic(expected = "a replica set is placed at the wanted size")]
    fn a_placed_set_short_of_the_factor_panics() {
        placed(vec![1, 2], 3);
    }
}
