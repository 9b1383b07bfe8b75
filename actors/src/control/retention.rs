//! Retention (issue 21, ADR 0115): a vnode's coordinator, under its lease,
//! expires the oldest sealed segments of the topics whose storage policy
//! bounds their age or size, then has the holders remove the copies.
//!
//! The plan is the model's (`MetadataState::retention_plan`): along each
//! range's epoch chain, oldest first, never an active segment. A topic
//! naming a policy no definition backs keeps all of its data (the seed's
//! late binding), is logged and set in `malachi_topic_policy_unresolved`
//! on every pass, and only `maintenance.unresolved_policy_age_ms`, unset by
//! default, bounds it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use malachi_core::model::{Command, EXPIRE_SEGMENTS_MAX, Outcome, RetentionRule};
use malachi_core::ring::VnodeId;
use tracing::{debug, info, warn};

use super::shared::Shared;

/// A topic whose policy name no definition backs, and that name.
pub(crate) type Unresolved = BTreeSet<(String, String)>;

/// One retention pass over the topics of `vnode` (see the module doc).
/// Returns the topics whose policy is unresolved.
pub(crate) async fn retention_pass(shared: Arc<Shared>, vnode: VnodeId) -> Unresolved {
    let mut unresolved = Unresolved::new();
    let Ok(plane) = shared.plane() else {
        return unresolved;
    };
    let Some(group) = plane.host().and_then(|h| h.group(vnode)) else {
        return unresolved;
    };
    let policies = match super::policies::policies(&shared.actors, &shared.memory).await {
        Ok(policies) => policies,
        Err(e) => {
            debug!(%vnode, error = %e, "retention waits: the policies could not be read");
            return unresolved;
        }
    };
    let now_ms = shared.clock.now_ms();
    let backstop = shared.config.maintenance.unresolved_policy_age_ms;
    // (topic, segments to expire, their holders), from the local replica:
    // the coordinator leads the group, and the command re-checks each step.
    let work = group.read_local(|state| {
        let mut work = Vec::new();
        for topic in state.topics() {
            let Some(name) = &topic.policy else { continue };
            let rule = match policies.get(name) {
                Some(policy) => RetentionRule {
                    age_ms: policy.retention_age_ms,
                    bytes: policy.retention_bytes,
                },
                None => {
                    unresolved.insert((topic.name.clone(), name.clone()));
                    RetentionRule {
                        age_ms: backstop,
                        bytes: None,
                    }
                }
            };
            let plan = state.retention_plan(&topic.name, rule, now_ms, EXPIRE_SEGMENTS_MAX);
            if plan.is_empty() {
                continue;
            }
            let mut holders: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for id in &plan {
                for node in state
                    .segment(*id)
                    .map(|s| s.replicas.clone())
                    .unwrap_or_default()
                {
                    holders.entry(node.0).or_default().push(id.0);
                }
            }
            work.push((topic.name.clone(), plan, holders));
        }
        work
    });
    for (topic, policy) in &unresolved {
        info!(%topic, %policy, "topic names a storage policy no definition backs: it keeps all of its data");
    }
    for (topic, plan, holders) in work {
        let count = plan.len();
        let proposed = plane
            .propose(Command::ExpireSegments {
                topic: topic.clone(),
                segments: plan,
            })
            .await;
        match proposed {
            Ok(Ok(Outcome::SegmentsExpired { segments })) => {
                shared
                    .metrics
                    .segments_expired
                    .increment(segments.len() as u64);
                info!(%topic, expired = count, "retention expired sealed segments");
                let orders = crate::control::replica_order::OrderClient {
                    shared: Arc::clone(&shared),
                };
                super::drop_orders::send_drop_orders(&orders, &topic, holders).await;
            }
            Ok(Ok(other)) => warn!(%topic, outcome = ?other, "retention got an unexpected outcome"),
            Ok(Err(refused)) => {
                debug!(%topic, %refused, "retention refused; the next pass plans again")
            }
            Err(e) => {
                debug!(%topic, error = %e, "retention could not propose; the next pass retries")
            }
        }
    }
    unresolved
}
