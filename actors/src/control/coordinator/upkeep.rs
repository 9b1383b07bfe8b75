//! The coordinator's timed work, each tick: the lease taken or given up,
//! the orders (`orders.rs`), then, under the lease, a retention pass and
//! the report of stranded segments. A watch on membership wakes it early
//! when a broker starts to look failed.

use std::collections::BTreeSet;
use std::sync::Arc;

use malachi_core::model::{NodeId, SegmentId};
use ractor::ActorRef;
use tracing::{info, warn};

use super::lease_slot::LeaseSlot;
use super::{CoordinatorMsg, CoordinatorRun};
use crate::control::shared::Shared;
use malachi_core::plan::heal::stranded_segments;

impl CoordinatorRun {
    /// The continuous work, run only while the lease holds; a coordinator
    /// that lost its lease (or never got it: a deposed leader, a successor
    /// waiting out its predecessor's lease) skips it. A vnode without
    /// topics has none, and holds no lease.
    pub(super) async fn upkeep(&mut self) {
        let Ok(plane) = self.logic.shared.plane() else {
            return;
        };
        let group = plane.host().and_then(|h| h.group(self.logic.vnode));
        if let Some(group) = &group {
            let has_topics = group.read_local(|state| state.topics().next().is_some());
            match (&self.lease, has_topics) {
                (LeaseSlot::Idle, true) => self.take_lease().await,
                (LeaseSlot::Held(_), false) => self.drop_lease(),
                _ => {}
            }
            if !has_topics {
                return;
            }
            self.request_failovers(group);
        }
        let allowed = match &self.lease {
            LeaseSlot::Unneeded => true,
            LeaseSlot::Idle => false,
            LeaseSlot::Held(lease) => lease.holds(),
        };
        if allowed != self.upkeep_running {
            let state = match &self.lease {
                LeaseSlot::Held(lease) => Some(lease.state()),
                _ => None,
            };
            info!(vnode = %self.logic.vnode, running = allowed, lease = ?state, "coordinator upkeep");
            self.upkeep_running = allowed;
        }
        if !allowed {
            return;
        }
        self.retention().await;
        let (Some(fabric), Some(group)) = (self.logic.shared.fabric(), group) else {
            return;
        };
        let live: BTreeSet<u64> = fabric.membership.view().live().map(|m| m.node_id).collect();
        let stranded = group.read_local(|state| {
            stranded_segments(state, &live)
                .into_iter()
                .map(|(topic, segment, node)| {
                    let copies = state.segment(segment).map_or(1, |s| s.replicas.len());
                    (topic, segment, node, copies)
                })
                .collect::<Vec<_>>()
        });
        let now: Vec<(String, SegmentId, NodeId)> = stranded
            .iter()
            .map(|(t, s, n, _)| (t.clone(), *s, *n))
            .collect();
        if now != self.stranded {
            for (topic, segment, node, copies) in &stranded {
                if *copies > 1 {
                    // Expected: the failover (or, for a follower gone past
                    // replace_after_ms, the roll) moves it; a broker's stop
                    // in an ordered shutdown looks the same.
                    info!(vnode = %self.logic.vnode, topic = %topic, segment = segment.0, node = node.0, copies, "active segment has a copy on a broker that is down");
                } else {
                    // Its only copy: no failover can serve it.
                    warn!(vnode = %self.logic.vnode, topic = %topic, segment = segment.0, node = node.0, "active segment's only copy is on a broker that is down");
                }
            }
            self.stranded = now;
        }
    }

    /// Starts a retention pass every `maintenance.retention_sweep_ms`, on
    /// a task (its proposals and drop orders would hold the mailbox), one
    /// at a time; a finished pass's unresolved topics set the gauge.
    pub(super) async fn retention(&mut self) {
        if let Some(task) = &self.retention {
            if !task.is_finished() {
                return;
            }
            if let Some(task) = self.retention.take()
                && let Ok(unresolved) = task.await
            {
                let metrics = &self.logic.shared.metrics;
                for (topic, policy) in self.unresolved.difference(&unresolved) {
                    metrics.policy_unresolved(topic, policy, false);
                }
                for (topic, policy) in &unresolved {
                    metrics.policy_unresolved(topic, policy, true);
                }
                self.unresolved = unresolved;
            }
        }
        let every = std::time::Duration::from_millis(
            self.logic.shared.config.maintenance.retention_sweep_ms,
        );
        if self.retained_at.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.retained_at = Some(std::time::Instant::now());
        let shared = Arc::clone(&self.logic.shared);
        let vnode = self.logic.vnode;
        self.retention = Some(tokio::spawn(crate::control::retention::retention_pass(
            shared, vnode,
        )));
    }
}

/// Wakes `myself`'s upkeep as soon as the brokers SWIM does not call alive,
/// or the liveness prober's up set, change: a failover then starts within
/// moments of its primary looking failed, not at the next tick (up to
/// `coordinator_poll_ms` later).
pub(super) fn spawn_failure_watch(
    shared: &Arc<Shared>,
    myself: ActorRef<CoordinatorMsg>,
) -> Option<tokio::task::JoinHandle<()>> {
    use malachi_membership::{MemberState, MembershipView};
    let fabric = shared.fabric()?;
    let mut view = fabric.membership.watch();
    let mut up = shared
        .plane()
        .ok()
        .and_then(|plane| plane.host().and_then(|h| h.up_watch()));
    let not_alive = |view: &MembershipView| -> BTreeSet<u64> {
        view.all()
            .filter(|m| m.state != MemberState::Alive)
            .map(|m| m.node_id)
            .collect()
    };
    Some(tokio::spawn(async move {
        let mut last = (
            not_alive(&view.borrow_and_update()),
            up.as_mut().map(|u| u.borrow_and_update().clone()),
        );
        loop {
            let up_changed = async {
                match up.as_mut() {
                    Some(up) => up.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = view.changed() => if changed.is_err() { return },
                alive = up_changed => if !alive { up = None; },
            }
            let now = (
                not_alive(&view.borrow_and_update()),
                up.as_mut().map(|u| u.borrow_and_update().clone()),
            );
            if now != last {
                last = now;
                if myself.send_message(CoordinatorMsg::Upkeep).is_err() {
                    return;
                }
            }
        }
    }))
}
