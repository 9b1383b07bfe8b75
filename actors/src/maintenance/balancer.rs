//! `maintenance/balancer`: this broker's load, told to the others, and the
//! balancing of primaries (issue 38, ADR 0144).
//!
//! Every `LOAD_POLL_MS` the worker measures what this broker writes (its
//! active primaries, and the producer bytes per second it stored,
//! smoothed over about a minute) and gossips it as the `malachi.load`
//! membership attribute when it changed enough to matter, so every
//! coordinator places new primaries on the least loaded brokers.
//!
//! Every `maintenance.balance_interval_ms` (0: never) it asks the pure
//! `malachi_core::load::plan_shed` whether this broker is the most loaded
//! and two or more primaries above the least loaded; if so it moves one of
//! its ranges there (`CoordinatorMsg::Move`: seal-first, no data copied).
//! Only the most loaded broker acts and only one move per interval, so the
//! brokers converge to within one of the mean and do not flap. Each tick
//! is a message the actor sends itself, so a tick that panics fails the
//! actor and its supervisor restarts the work (ADR 0130).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use malachi_core::load::{BrokerLoad, LOAD_ATTRIBUTE, plan_shed, rendezvous};
use malachi_core::model::{NodeId, RangeId};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::control::handle::ControlHandle;
use crate::control::shared::ClusterLinks;
use crate::data::storage::Storage;

/// How often the load is measured and, when it changed, gossiped.
pub(crate) const LOAD_POLL_MS: u64 = 1_000;
/// The smoothing of the write rate: each poll moves it by 1/this of the
/// way to the last poll's rate (about a minute's memory at one poll a
/// second).
const WRITE_RATE_SMOOTHING_POLLS: u64 = 30;
/// Polls between two gossips of the load at least: each gossip is a new
/// membership incarnation, so a load that changes every poll is told at
/// this pace (placement counts fresh primaries from the metadata anyway).
const GOSSIP_POLLS_MIN: u64 = 5;
/// How long one move may take before the balancer gives up on it.
const MOVE_TIMEOUT_MS: u64 = 10_000;

pub(crate) struct BalancerActor;

/// What the balancer reads: the data plane (primaries, bytes stored),
/// membership (to gossip the load) and the control plane (the cluster's
/// loads, the ranges written here, the move).
#[derive(Debug)]
pub(crate) struct BalancerCtx {
    pub node_id: u64,
    pub data: Arc<Storage>,
    pub links: Arc<ClusterLinks>,
    pub control: ControlHandle,
    pub balance_interval_ms: u64,
}

#[derive(Debug)]
pub(crate) enum BalancerMsg {
    Poll,
}

impl ractor::Message for BalancerMsg {}

pub(crate) struct BalancerState {
    ctx: Arc<BalancerCtx>,
    /// Bytes stored at the last poll, and the smoothed rate.
    bytes_seen: u64,
    write_bytes_per_second: u64,
    /// Polls since the load was last gossiped.
    polls_since_gossip: u64,
    /// Polls until the next balancing decision.
    polls_to_balance: u64,
    /// The move in flight, off the actor's mailbox: a move waits for a
    /// freeze and a commit (seconds), and polls and a shutdown must not
    /// wait behind it. At most one at a time.
    moving: Option<tokio::task::JoinHandle<()>>,
}

#[ractor::async_trait]
impl Actor for BalancerActor {
    type Msg = BalancerMsg;
    type State = BalancerState;
    type Arguments = Arc<BalancerCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<BalancerMsg>,
        ctx: Arc<BalancerCtx>,
    ) -> Result<BalancerState, ActorProcessingErr> {
        myself.send_message(BalancerMsg::Poll)?;
        let bytes_seen = ctx.data.bytes_stored.load(Ordering::Relaxed);
        let polls_to_balance = polls_per_balance(ctx.balance_interval_ms);
        Ok(BalancerState {
            ctx,
            bytes_seen,
            write_bytes_per_second: 0,
            polls_since_gossip: GOSSIP_POLLS_MIN,
            polls_to_balance,
            moving: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<BalancerMsg>,
        state: &mut BalancerState,
    ) -> Result<(), ActorProcessingErr> {
        // The coordinator finishes or abandons a move on its own; only the
        // wait for its answer is dropped.
        if let Some(moving) = state.moving.take() {
            moving.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<BalancerMsg>,
        message: BalancerMsg,
        state: &mut BalancerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            BalancerMsg::Poll => {
                let load = state.measure();
                state.gossip(load);
                state.balance();
                myself.send_after(Duration::from_millis(LOAD_POLL_MS), || BalancerMsg::Poll);
            }
        }
        Ok(())
    }
}

/// Polls between two balancing decisions; 0 never decides.
fn polls_per_balance(balance_interval_ms: u64) -> u64 {
    balance_interval_ms.div_ceil(LOAD_POLL_MS)
}

/// The smoothed rate after one poll that saw `rate`.
fn smoothed(previous: u64, rate: u64) -> u64 {
    let step = rate.abs_diff(previous) / WRITE_RATE_SMOOTHING_POLLS;
    // Rounded away from the old value, so a steady rate is reached.
    let step = step.max(u64::from(rate != previous));
    if rate > previous {
        previous + step
    } else {
        previous - step
    }
}

impl BalancerState {
    /// This broker's load now: its running writers and its smoothed rate.
    fn measure(&mut self) -> BrokerLoad {
        let stored = self.ctx.data.bytes_stored.load(Ordering::Relaxed);
        let per_poll = stored.saturating_sub(self.bytes_seen);
        self.bytes_seen = stored;
        let rate = per_poll.saturating_mul(1_000) / LOAD_POLL_MS;
        self.write_bytes_per_second = smoothed(self.write_bytes_per_second, rate);
        let load = BrokerLoad {
            primaries: self.ctx.data.segments.lock().len() as u64,
            write_bytes_per_second: self.write_bytes_per_second,
            free_gib: self.ctx.data.space.reckoned_free_bytes().map(|b| b >> 30),
        };
        let metrics = &self.ctx.data.metrics;
        metrics.primaries.set(load.primaries as f64);
        metrics
            .write_bytes_per_second
            .set(load.write_bytes_per_second as f64);
        load
    }

    /// Gossips `load` when it differs enough from what the others saw, or
    /// when another writer of this broker's attributes dropped it.
    fn gossip(&mut self, load: BrokerLoad) {
        self.polls_since_gossip = self.polls_since_gossip.saturating_add(1);
        let Some(fabric) = self.ctx.links.fabric() else {
            return;
        };
        let mut attributes = fabric.membership.local().attributes;
        let shown = attributes
            .get(LOAD_ATTRIBUTE)
            .and_then(|text| BrokerLoad::from_attribute(text).ok());
        // No attribute reads as idle: an idle broker that never wrote says
        // nothing (no incarnation churn at start).
        let changed = match shown {
            Some(shown) => load.differs_from(shown),
            None => !load.is_idle(),
        };
        if !changed || self.polls_since_gossip < GOSSIP_POLLS_MIN {
            return;
        }
        attributes.insert(LOAD_ATTRIBUTE.to_owned(), load.to_attribute());
        match fabric.membership.set_local_attributes(attributes) {
            Ok(()) => self.polls_since_gossip = 0,
            Err(e) => warn!(error = %e, "cannot gossip this broker's load"),
        }
    }

    /// Once per balance interval: moves one range to the least loaded
    /// broker if `plan_shed` says this broker should. A decommissioned
    /// broker does not balance: its active segments move by the
    /// decommission's own rules (ADR 0112), and no broker moves a range
    /// onto it (it is no placement candidate).
    fn balance(&mut self) {
        if self.ctx.balance_interval_ms == 0 {
            return;
        }
        self.polls_to_balance = self.polls_to_balance.saturating_sub(1);
        if self.polls_to_balance > 0 {
            return;
        }
        self.polls_to_balance = polls_per_balance(self.ctx.balance_interval_ms);
        if self.ctx.control.leaving() || self.moving.as_ref().is_some_and(|m| !m.is_finished()) {
            return;
        }
        let me = self.ctx.node_id;
        let candidates = self.ctx.control.placement_candidates();
        let mut loads: BTreeMap<u64, BrokerLoad> = self
            .ctx
            .control
            .load_view()
            .into_iter()
            .filter(|(node, _)| candidates.contains(node))
            .collect();
        // A candidate that gossips no load and writes nothing the metadata
        // shows is idle (a broker that just joined or came back).
        for &node in &candidates {
            loads.entry(node).or_default();
        }
        let Some(shed) = plan_shed(me, &loads) else {
            return;
        };
        debug_assert_eq!(shed.from, me, "a broker sheds only its own primaries");
        // Which range: the rendezvous order of (target, range), so moves to
        // one broker spread over topics rather than drain one.
        let ranges = self.ctx.control.ranges_written_here();
        let Some((topic, range, _)) = ranges
            .into_iter()
            .min_by_key(|(_, range, _)| rendezvous(shed.to, range.0))
        else {
            return;
        };
        info!(%topic, range = range.0, from = me, to = shed.to, ?loads, "balancer: moving a range's primary to the least loaded broker");
        let ctx = Arc::clone(&self.ctx);
        self.moving = Some(tokio::spawn(move_range(ctx, topic, range, shed.to)));
    }
}

/// One move, through the coordinator; counted when it happened.
async fn move_range(ctx: Arc<BalancerCtx>, topic: String, range: RangeId, to: u64) {
    let moved = ctx
        .control
        .move_range(topic.clone(), range, NodeId(to), MOVE_TIMEOUT_MS)
        .await;
    match moved {
        Ok(next) => {
            ctx.data.metrics.balancer_moves.increment(1);
            debug!(%topic, range = range.0, next = next.0, "balancer: moved");
        }
        Err(e) => {
            info!(%topic, range = range.0, to, error = %e, "balancer: the move did not happen; the next interval decides again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smoothed_rate_reaches_a_steady_rate_and_decays_to_zero() {
        let mut rate = 0;
        for _ in 0..600 {
            rate = smoothed(rate, 3_000_000);
        }
        assert!(rate > 2_900_000 && rate <= 3_000_000, "{rate}");
        for _ in 0..2_000 {
            rate = smoothed(rate, 0);
        }
        assert_eq!(rate, 0);
    }

    #[test]
    fn a_zero_interval_never_balances() {
        assert_eq!(polls_per_balance(0), 0);
        assert_eq!(polls_per_balance(10_000), 10);
        assert_eq!(polls_per_balance(1_500), 2);
    }
}
