//! The operator's view of the ring and its vnode split, on the client port
//! (api keys 22 `vnode_list` and 23 `vnode_split`, beside `tree_snapshot`
//! and `cluster_status`).
//!
//! Any broker answers both. `vnode_list` reports the ring this broker
//! routes by, so asking every broker shows whether the cluster agrees on
//! it; each vnode's leader is this broker's replica's view, else the
//! leadership its holder gossips. `vnode_split` runs
//! `VnodeHost::split_vnode` here: every step of a split is a replicated
//! command or a read routed to its group's leader, so the broker asked
//! need not host the vnode. The split runs on a task of its own, so a
//! client that gives up (or a closed connection) does not leave it half
//! done; asking again resumes it (ADR 0082).

use std::sync::Arc;

use malachi_cluster::vnodes::lease::Clock as _;
use malachi_cluster::vnodes::{VnodeHost, rebalance};
use malachi_core::model::RingArc;
use malachi_core::ring::{MemberState, Ring, VnodeId};
use malachi_wire::messages as wire;
use tracing::{info, warn};

use super::context::MetaCtx;
use super::error::ServeError;
use super::reply::Failure;

/// The wire form of an arc: its first and last position, inclusive, so the
/// top arc (ending at 2^64) fits in a u64.
fn arc_bounds(arc: RingArc) -> (u64, u64) {
    let last = arc.end.saturating_sub(1).min(u128::from(u64::MAX)) as u64;
    (arc.start, last)
}

/// One vnode as this broker knows it.
fn vnode_info(meta: &MetaCtx, host: &VnodeHost, vnode: VnodeId, arc: RingArc) -> wire::VnodeInfo {
    let (arc_start, arc_last) = arc_bounds(arc);
    let (mut leader, mut term) = (None, 0);
    let mut lease_holder = None;
    if let Some(group) = host.group(vnode) {
        let status = group.status();
        (leader, term) = (status.leader, status.term);
        // An informational view only: a grant that has run out by the
        // wall-clock stamps the commands carry, read against this broker's
        // wall clock, is not reported as held. Wall clocks jump and differ
        // between brokers, so this may be wrong for a while; no safety
        // decision reads it (the group and the holders judge the lease on
        // monotonic time only, ADR 0122).
        let now_ms = malachi_cluster::vnodes::lease::SystemClock::new().wall_ms();
        lease_holder = group.read_local(|s| {
            s.lease()
                .filter(|l| l.expires_at_ms() > now_ms)
                .map(|l| l.holder)
        });
    }
    if leader.is_none()
        && let Some(fabric) = meta.links.fabric()
    {
        // No replica here: the broker that gossips the highest term for it.
        let view = fabric.membership.view();
        let gossiped = view
            .all()
            .flat_map(|m| {
                m.vnodes_led
                    .iter()
                    .filter(|l| l.vnode == vnode.0)
                    .map(|l| (l.term, m.node_id))
            })
            .max();
        if let Some((gossiped_term, node)) = gossiped {
            (leader, term) = (Some(node), gossiped_term);
        }
    }
    wire::VnodeInfo {
        id: vnode.0,
        arc_start,
        arc_last,
        leader,
        term,
        replicas: host.voters(vnode),
        lease_holder,
    }
}

/// The ring this broker routes by, with each vnode's leader.
pub(crate) fn vnode_list(meta: &MetaCtx) -> Result<wire::VnodeListResponse, Failure> {
    let node_id = meta.node_id;
    let plane = meta.plane().map_err(ServeError::Metadata)?;
    let Some(host) = plane.host() else {
        // The file plane: one vnode, the whole ring, led here.
        let whole = Ring::new(1).map_err(|e| ServeError::Internal {
            what: "build the one-vnode ring",
            reason: e.to_string(),
        })?;
        let vnodes = whole
            .vnodes()
            .map(|v| {
                let (arc_start, arc_last) = arc_bounds(v.arc);
                wire::VnodeInfo {
                    id: v.id.0,
                    arc_start,
                    arc_last,
                    leader: Some(node_id),
                    term: 0,
                    replicas: vec![node_id],
                    lease_holder: None,
                }
            })
            .collect();
        return Ok(wire::VnodeListResponse {
            node_id,
            ring_version: whole.version(),
            vnodes,
        });
    };
    let ring = host.ring();
    Ok(wire::VnodeListResponse {
        node_id,
        ring_version: ring.version(),
        vnodes: ring
            .vnodes()
            .map(|v| vnode_info(meta, host, v.id, v.arc))
            .collect(),
    })
}

/// The cluster's members and where their vnode replicas are, after the
/// decommission or admission the request asks for (ADR 0104).
pub(crate) async fn cluster_members(
    meta: &MetaCtx,
    request: wire::ClusterMembersRequest,
) -> Result<wire::ClusterMembersResponse, Failure> {
    use std::collections::{BTreeMap, BTreeSet};
    let plane = meta.plane().map_err(ServeError::Metadata)?;
    let Some(host) = plane.host().cloned() else {
        return Err(ServeError::SingleVnode);
    };
    let change = match (request.decommission, request.admit) {
        (Some(node), _) => {
            info!(node, by = meta.node_id, "decommission requested");
            Some(host.decommission(node).await)
        }
        (None, Some(node)) => {
            info!(node, by = meta.node_id, "admission requested");
            Some(host.admit(node).await)
        }
        (None, None) => None,
    };
    match change {
        Some(change) => {
            change
                .map_err(ServeError::from)?
                .map_err(ServeError::MemberRefused)?;
        }
        // A listing reads the ring's group, not this broker's copy.
        None => {
            host.refresh_ring().await.map_err(ServeError::from)?;
        }
    }
    let ring = host.ring();
    let members = host.members();
    let replicas_per_vnode = host.replicas_per_vnode();
    let eligible = rebalance::eligible(&members, &BTreeSet::new(), replicas_per_vnode);
    let mut replicas: BTreeMap<u64, u32> = BTreeMap::new();
    let mut learners: BTreeMap<u64, u32> = BTreeMap::new();
    let (mut groups, mut moving, mut unreachable) = (0u32, 0u32, 0u32);
    for (vnode, membership) in host.memberships().await {
        groups += 1;
        let Ok(m) = membership else {
            unreachable += 1;
            continue;
        };
        for node in &m.voters {
            *replicas.entry(*node).or_default() += 1;
        }
        for node in &m.learners {
            *learners.entry(*node).or_default() += 1;
        }
        let voters: BTreeSet<u64> = m.voters.iter().copied().collect();
        // Constraints no eligible set meets leave a group where it is.
        let target = rebalance::placed_voters(vnode, &eligible, replicas_per_vnode, &ring)
            .unwrap_or_else(|_| voters.clone());
        if voters != target || m.joint {
            moving += 1;
        }
    }
    let mut nodes: BTreeSet<u64> = members.keys().copied().collect();
    nodes.extend(replicas.keys().copied());
    nodes.extend(learners.keys().copied());
    Ok(wire::ClusterMembersResponse {
        node_id: meta.node_id,
        ring_version: ring.version(),
        members: nodes
            .into_iter()
            .map(|node| wire::MemberInfo {
                node_id: node,
                state: match members.get(&node) {
                    Some(MemberState::Active) => wire::MemberState::Active,
                    // A replica's holder the ring does not list is leaving.
                    _ => wire::MemberState::Decommissioned,
                },
                vnode_replicas: replicas.get(&node).copied().unwrap_or(0),
                vnode_learners: learners.get(&node).copied().unwrap_or(0),
            })
            .collect(),
        groups,
        groups_moving: moving,
        groups_unreachable: unreachable,
    })
}

/// Splits `vnode` and answers with the two halves.
pub(crate) async fn vnode_split(
    meta: &MetaCtx,
    vnode: u32,
) -> Result<wire::VnodeSplitResponse, Failure> {
    let plane = meta.plane().map_err(ServeError::Metadata)?;
    let Some(host) = plane.host().cloned() else {
        return Err(ServeError::SingleVnode);
    };
    let parent = VnodeId(vnode);
    // The ring's group, not this broker's copy, says which vnodes exist and
    // whether another split is under way: refuse those before any step.
    let record = host.ring_record().await.map_err(ServeError::from)?;
    if record.ring.vnode(parent).is_none() {
        return Err(ServeError::VnodeNotFound {
            vnode,
            ring_version: record.ring.version(),
        });
    }
    if let Some(pending) = record.pending.filter(|p| p.parent != parent) {
        return Err(ServeError::OtherSplitInProgress {
            parent: pending.parent,
            child: pending.child,
        });
    }
    info!(%parent, node = meta.node_id, "vnode split requested");
    let split_host = Arc::clone(&host);
    // On a task: the split finishes even if the requester goes away.
    let split = tokio::spawn(async move { split_host.split_vnode(parent).await });
    let (parent, child) = match split.await {
        Ok(Ok(halves)) => halves,
        Ok(Err(e)) => {
            warn!(%parent, error = %e, "vnode split stopped");
            return Err(ServeError::from(e));
        }
        Err(e) => {
            return Err(ServeError::SplitTask {
                reason: e.to_string(),
            });
        }
    };
    let ring = host.ring();
    let info_of = |id: VnodeId| {
        ring.vnode(id)
            .map(|v| vnode_info(meta, &host, id, v.arc))
            .ok_or_else(|| ServeError::SplitRingLacks {
                vnode: id,
                ring_version: ring.version(),
            })
    };
    Ok(wire::VnodeSplitResponse {
        ring_version: ring.version(),
        parent: info_of(parent)?,
        child: info_of(child)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_cluster::vnodes::{RouteError, SplitError};
    use malachi_core::model::{ModelError, RING_END};
    use malachi_wire::ErrorCode;

    #[test]
    fn the_top_arc_reports_its_last_position_within_a_u64() {
        let top = RingArc {
            start: 1 << 63,
            end: RING_END,
        };
        assert_eq!(arc_bounds(top), (1 << 63, u64::MAX));
        let bottom = RingArc {
            start: 0,
            end: 1 << 63,
        };
        assert_eq!(arc_bounds(bottom), (0, (1 << 63) - 1));
    }

    #[test]
    fn a_split_refused_for_another_split_is_split_in_progress() {
        let refused = SplitError::Refused {
            step: "begin",
            error: ModelError::SplitInProgress {
                parent: VnodeId(1),
                child: VnodeId(4),
            },
        };
        assert_eq!(ServeError::from(refused).code(), ErrorCode::SplitInProgress);
        let unreachable = SplitError::Route {
            step: "commit",
            source: RouteError::Unavailable {
                vnode: VnodeId(1),
                attempts: 3,
                last: "down".into(),
            },
        };
        let code = ServeError::from(unreachable).code();
        assert_eq!(code, ErrorCode::NoQuorum);
        assert!(code.retriable());
    }

    #[test]
    fn a_split_step_with_an_unknown_outcome_is_outcome_unknown_but_finish_is_not_retriable() {
        let unknown = RouteError::OutcomeUnknown {
            vnode: VnodeId(1),
            reason: "the proposal timed out".into(),
        };
        let commit = SplitError::Route {
            step: "commit",
            source: unknown.clone(),
        };
        assert_eq!(ServeError::from(commit).code(), ErrorCode::OutcomeUnknown);
        // Retrying an applied `FinishSplit` would begin a second split.
        let finish = ServeError::from(SplitError::Route {
            step: "finish",
            source: unknown,
        });
        assert_eq!(finish.code(), ErrorCode::UnknownServerError);
        assert!(finish.to_string().contains("malachi vnode list"));
    }
}
