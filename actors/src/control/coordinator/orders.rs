//! The coordinator's orders to the maintenance actors: the segments to fail
//! over to the failover actor, the sealed ones to heal and the scrub polls
//! to the healer, the fence probes, each under the coordinator's order
//! epoch (its group's id and raft term, ADR 0106).

use std::collections::BTreeSet;
use std::sync::Arc;

use malachi_cluster::group::MetadataGroup;
use malachi_core::model::SegmentId;
use malachi_core::ring::MemberState;
use malachi_membership::MembershipView;
use malachi_wire::replica_order::OrderEpoch;

use super::CoordinatorRun;
use super::failed::primary_failed;
use crate::control::requests::{Candidate, FailoverMsg, HealCandidate, HealMsg};
use crate::control::shared::Shared;
use malachi_core::plan::heal::{RESTORE_AFTER_MS, Restore, failover_candidates, heal_candidates};
use malachi_core::plan::probes::{
    PROBE_TARGETS_MAX, SCRUB_TARGETS_MAX, fence_probe_ms, probe_targets, scrub_poll_ms,
    scrub_targets,
};

/// Who looks failed, gone, full or leaving, as this broker sees it now.
#[derive(Debug, Default)]
struct Faults {
    /// Failed for a failover (`primary_failed`); never this broker.
    failed: BTreeSet<u64>,
    /// Failed for longer than `replace_after_ms`: their copies are healed
    /// elsewhere.
    gone: BTreeSet<u64>,
    /// Their volume is full (ADR 0111): failed over like a failed broker,
    /// its followed segments roll; its sealed copies stay (they are read,
    /// not written), so it is not `gone`.
    full: BTreeSet<u64>,
    /// Decommissioned (issue 18, ADR 0112): its active segments roll off it
    /// as a failed broker's do, and its sealed copies are re-created
    /// elsewhere as a gone broker's are, read from it while it still runs.
    leaving: BTreeSet<u64>,
}

impl Faults {
    fn failed_or_full(&self, node: u64) -> bool {
        self.failed.contains(&node) || self.full.contains(&node) || self.leaving.contains(&node)
    }

    fn gone_or_full(&self, node: u64) -> bool {
        self.gone.contains(&node) || self.full.contains(&node) || self.leaving.contains(&node)
    }

    /// The brokers whose sealed copies are re-created elsewhere.
    fn moving(&self) -> BTreeSet<u64> {
        self.gone.union(&self.leaving).copied().collect()
    }
}

impl CoordinatorRun {
    /// Hands the failover actor the segments whose primary failed, under
    /// this coordinator's order epoch (its group's id and the raft term it
    /// leads in). Not gated on the lease (ADR 0106): a failover's orders
    /// are fenced by that epoch on the copies, and its seal is a raft
    /// command, so a deposed leader's overlap cannot do harm, and waiting
    /// out a dead coordinator's lease would add seconds to every failover.
    pub(super) fn request_failovers(&mut self, group: &MetadataGroup) {
        let shared = Arc::clone(&self.logic.shared);
        let (leader, term) = group.leader_term();
        if leader != Some(shared.config.node_id) {
            return;
        }
        let Some(fabric) = shared.fabric() else {
            return;
        };
        let faults = self.faults(&shared, &fabric.membership.view());
        // The brokers that may take a new copy: live, with room, not
        // leaving. A short sealed segment is healed only onto one of them.
        let placeable: BTreeSet<u64> = self
            .logic
            .candidates()
            .iter()
            .map(|c| c.node)
            .filter(|n| !faults.failed_or_full(*n) && !faults.gone.contains(n))
            .collect();
        let restore = Restore {
            placeable: placeable.len(),
            now_ms: shared.clock.now_ms(),
            after_ms: RESTORE_AFTER_MS,
        };
        let failed_or_full = |node: u64| faults.failed_or_full(node);
        let gone_or_full = |node: u64| faults.gone_or_full(node);
        let (candidates, heals) = group.read_local(|state| {
            (
                failover_candidates(state, &failed_or_full, &gone_or_full, &restore),
                heal_candidates(state, &faults.moving(), &placeable),
            )
        });
        let order = self.orders.next(OrderEpoch {
            group: group.group_id(),
            term,
        });
        self.ensure(&shared, order, &candidates, heals);
        self.probe(&shared, group, order, &candidates);
        self.poll_scrub(&shared, group, order);
    }

    /// Who looks failed, gone, full or leaving now; a broker failed for
    /// longer than `replace_after_ms` is gone.
    fn faults(&mut self, shared: &Shared, view: &MembershipView) -> Faults {
        let me = shared.config.node_id;
        let up = shared
            .plane()
            .ok()
            .and_then(|plane| plane.host().and_then(|h| h.up_nodes()));
        let failed = |node: u64| {
            node != me
                && primary_failed(
                    view.get(node).map(|m| m.state),
                    up.as_ref().map(|u| u.contains(&node)),
                )
        };
        let members: Vec<u64> = view.all().map(|m| m.node_id).collect();
        let up_now: BTreeSet<u64> = members.iter().copied().filter(|n| !failed(*n)).collect();
        let gone = self.down.observe(
            me,
            members.iter().copied(),
            &up_now,
            std::time::Instant::now(),
            std::time::Duration::from_millis(shared.config.cluster.replace_after_ms),
        );
        let full: BTreeSet<u64> = view
            .all()
            .filter(|m| !crate::common::volume::has_room(&m.attributes))
            .map(|m| m.node_id)
            .chain(shared.data.space.is_full().then_some(me))
            .collect();
        let leaving: BTreeSet<u64> = shared
            .plane()
            .ok()
            .and_then(|plane| plane.host().map(|host| host.members()))
            .map(|members| {
                members
                    .into_iter()
                    .filter(|(_, s)| *s == MemberState::Decommissioned)
                    .map(|(node, _)| node)
                    .collect()
            })
            .unwrap_or_default();
        Faults {
            failed: members.into_iter().filter(|n| failed(*n)).collect(),
            gone,
            full,
            leaving,
        }
    }

    /// Hands the failover actor its candidates and the healer its heals.
    fn ensure(
        &self,
        shared: &Shared,
        order: OrderEpoch,
        candidates: &[Candidate],
        heals: Vec<HealCandidate>,
    ) {
        // Neither running (restarting) is fine: the next pass hands them
        // the same candidates again.
        if !candidates.is_empty() {
            shared.actors.failover().tell(FailoverMsg::Ensure {
                vnode: self.logic.vnode,
                order,
                candidates: candidates.to_vec(),
            });
        }
        if !heals.is_empty() {
            shared.actors.healer().tell(HealMsg::Ensure {
                vnode: self.logic.vnode,
                order,
                candidates: heals,
            });
        }
    }

    /// Every `fence_probe_ms`, has the failover actor probe the next batch
    /// of active replicated segments (not those failing over already).
    fn probe(
        &mut self,
        shared: &Shared,
        group: &MetadataGroup,
        order: OrderEpoch,
        candidates: &[Candidate],
    ) {
        let probe_every = std::time::Duration::from_millis(fence_probe_ms(
            shared.config.cluster.coordinator_poll_ms,
        ));
        if self.probed_at.is_none_or(|at| at.elapsed() >= probe_every)
            && let Some(failover) = shared.actors.failover().get()
        {
            self.probed_at = Some(std::time::Instant::now());
            let skip: BTreeSet<SegmentId> = candidates.iter().map(|c| c.segment).collect();
            let (targets, next) = group.read_local(|state| {
                probe_targets(state, &skip, self.probe_after, PROBE_TARGETS_MAX)
            });
            self.probe_after = next;
            if !targets.is_empty() {
                let _ = failover.send_message(FailoverMsg::Probe {
                    vnode: self.logic.vnode,
                    order,
                    targets,
                });
            }
        }
    }

    /// Every `scrub_poll_ms`, has the healer ask for the scrub verdicts of
    /// the next batch of sealed copies (ADR 0110).
    fn poll_scrub(&mut self, shared: &Shared, group: &MetadataGroup, order: OrderEpoch) {
        let poll = std::time::Duration::from_millis(scrub_poll_ms(
            shared.config.cluster.scrub_interval_ms,
        ));
        if self.scrubbed_at.is_none_or(|at| at.elapsed() >= poll)
            && let Some(healer) = shared.actors.healer().get()
        {
            self.scrubbed_at = Some(std::time::Instant::now());
            let (targets, next) =
                group.read_local(|state| scrub_targets(state, self.scrub_after, SCRUB_TARGETS_MAX));
            self.scrub_after = next;
            if !targets.is_empty() {
                let _ = healer.send_message(HealMsg::Scrub {
                    vnode: self.logic.vnode,
                    order,
                    targets,
                });
            }
        }
    }
}
