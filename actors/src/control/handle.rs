//! [`ControlHandle`]: the control plane's operations the layers above call
//! (`maintenance`, `serve`, `admin`), behind one opaque handle.
//!
//! Why: a failover records its seal through a coordinator, a heal places a
//! copy by the cluster's policies, a topic describe reads live figures from
//! the copies. Each of those is control-plane work that reads much of the
//! broker context; the layer that asks for it gets these methods, never
//! the context's fields, so what it can reach is the list below.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use malachi_core::model::{
    Command, NodeId, Outcome, RangeId, SealRecord, SegmentId, StoragePolicy,
};
use malachi_core::ring::VnodeId;
use malachi_wire::messages as wire;

use super::coordinator::CoordinatorState;
use super::policies::PolicyError;
use super::removal::SweepOutcome;
use super::replica_order::OrderClient;
use super::requests::CoordError;
use super::shared::Shared;

/// The control plane's operations for the layers above it. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct ControlHandle {
    shared: Arc<Shared>,
}

impl ControlHandle {
    pub(crate) fn of(shared: &Arc<Shared>) -> ControlHandle {
        ControlHandle {
            shared: Arc::clone(shared),
        }
    }

    /// The client of the orders to copies (fence, seal, catch-up, status,
    /// scrub verdicts).
    pub(crate) fn order_client(&self) -> OrderClient {
        OrderClient {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Records a failover's seal and successor through `vnode`'s
    /// coordinator (`CoordinatorState::fail_over`).
    pub(crate) async fn fail_over(
        &self,
        vnode: VnodeId,
        (topic, segment): (&str, SegmentId),
        seal: SealRecord,
        complete: &[u64],
        failed: &BTreeSet<u64>,
    ) -> Result<Option<SegmentId>, CoordError> {
        CoordinatorState::new(Arc::clone(&self.shared), vnode)
            .fail_over(topic, segment, seal, complete, failed)
            .await
    }

    /// The placement constraints of storage policy `policy`, from the
    /// policy cache.
    pub(crate) fn policy_constraints(
        &self,
        policy: Option<&str>,
    ) -> Vec<malachi_core::constraints::Constraint> {
        super::coordinator::policy_constraints(&self.shared, policy)
    }

    /// `nodes` with the attributes membership gossips for them.
    pub(crate) fn brokers_with_attributes(
        &self,
        nodes: &[u64],
    ) -> Vec<malachi_core::constraints::Broker> {
        super::coordinator::brokers_with_attributes(&self.shared, nodes)
    }

    /// One orphan sweep (`removal::sweep_orphans`).
    /// Returns the sweep's own future, not one wrapping it: the sweeper's
    /// handler nests deep enough to reach the compiler's layout depth.
    pub(crate) fn sweep_orphans(&self) -> impl Future<Output = SweepOutcome> + Send + '_ {
        super::removal::sweep_orphans(&self.shared)
    }

    /// The cluster's policies, read linearizably where they are kept.
    pub(crate) fn policies(
        &self,
    ) -> impl Future<Output = Result<BTreeMap<String, StoragePolicy>, PolicyError>> + Send + '_
    {
        super::policies::policies(&self.shared.actors, &self.shared.memory)
    }

    /// Proposes a policy command (put or remove).
    pub(crate) fn propose_policy(
        &self,
        cmd: Command,
    ) -> impl Future<Output = Result<Outcome, PolicyError>> + Send + '_ {
        super::policies::propose(&self.shared.actors, &self.shared.memory, cmd)
    }

    /// Adds the copies' live figures to a topic's description.
    pub(crate) fn add_live_figures<'a>(
        &'a self,
        topic: &'a mut wire::TopicDescription,
        live: bool,
    ) -> impl Future<Output = ()> + Send + 'a {
        super::replica_status::add_live_figures(&self.shared, topic, live)
    }

    /// The topic's write rates and recent automatic reshapes, asked of
    /// the brokers `primaries` names (broker to the ranges it writes),
    /// each at most `timeout_ms` (ADR 0143).
    pub(crate) fn gather_reshaping(
        &self,
        topic: String,
        primaries: BTreeMap<u64, BTreeSet<u64>>,
        timeout_ms: u64,
    ) -> impl Future<Output = Option<wire::TopicReshaping>> + Send + '_ {
        let here = super::describe_rates::RatesHere {
            node_id: self.shared.config.node_id,
            links: &self.shared.links,
            rates: &self.shared.rates,
            clock: self.shared.clock.as_ref(),
        };
        super::describe_rates::gather_reshaping(here, topic, primaries, timeout_ms)
    }

    /// Each broker's load as this broker sees it (ADR 0144).
    pub(crate) fn load_view(&self) -> BTreeMap<u64, malachi_core::load::BrokerLoad> {
        super::coordinator::load_view(&self.shared)
    }

    /// The live brokers that take new copies now (the balancer's targets).
    pub(crate) fn placement_candidates(&self) -> BTreeSet<u64> {
        super::coordinator::placement_candidates(&self.shared)
            .into_iter()
            .map(|c| c.node)
            .collect()
    }

    /// Whether this broker is decommissioned (its segments move away by
    /// the decommission's own rules, not the balancer's).
    pub(crate) fn leaving(&self) -> bool {
        self.shared
            .data
            .leaving
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The active ranges this broker writes, per this broker's replicas
    /// of the metadata, with their active segments.
    pub(crate) fn ranges_written_here(&self) -> Vec<(String, RangeId, SegmentId)> {
        let me = self.shared.config.node_id;
        let mut found = Vec::new();
        let Ok(plane) = self.shared.plane() else {
            return found;
        };
        plane.view_each(&mut |state| {
            for topic in state.topics() {
                for &range in &topic.ranges {
                    let Some(active) = state.range(range).filter(|r| r.is_active()) else {
                        continue;
                    };
                    let Some(segment) = active.last_segment().and_then(|s| state.segment(s)) else {
                        continue;
                    };
                    if segment.seal().is_none() && segment.replicas.first().map(|n| n.0) == Some(me)
                    {
                        found.push((topic.name.clone(), range, segment.id));
                    }
                }
            }
        });
        found
    }

    /// Moves where `range` of `topic` is written to broker `to`, through
    /// the coordinator manager (`CoordinatorMsg::Move`), waiting at most
    /// `timeout_ms`.
    pub(crate) async fn move_range(
        &self,
        topic: String,
        range: RangeId,
        to: NodeId,
        timeout_ms: u64,
    ) -> Result<SegmentId, CoordError> {
        let Some(manager) = self.shared.actors.manager().get() else {
            return Err(CoordError::Supervision(
                malachi_supervision::SupervisionError::NotRunning,
            ));
        };
        let asked = ractor::call_t!(
            manager,
            |reply| super::requests::CoordinatorMsg::Move {
                topic,
                range,
                to,
                reply,
            },
            timeout_ms
        );
        match asked {
            Ok(answer) => answer,
            Err(e) => Err(CoordError::Unexpected(format!(
                "no answer from the coordinator: {e}"
            ))),
        }
    }

    /// Test hook: waits while `BrokerHandle::hold_failovers` holds the
    /// failovers after their fences, counting each one held.
    #[cfg(feature = "testing")]
    pub(crate) async fn hold_failover(&self) {
        use std::sync::atomic::Ordering;
        let hold = &self.shared.failover_hold;
        if !hold.hold.load(Ordering::SeqCst) {
            return;
        }
        hold.held.fetch_add(1, Ordering::SeqCst);
        while hold.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}
