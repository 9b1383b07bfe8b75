//! `coordinator/<vnode>`: the business logic of one vnode's metadata.
//!
//! The coordinator manager (`manager.rs`) runs one coordinator for each
//! vnode this broker leads, and hands it every request for a topic of that
//! vnode, so the vnode's changes made here are serialized in one place:
//! creating and deleting topics, choosing where a topic's segments live,
//! rolling segments (seal at the durable length the segment actor reports,
//! open the next), split and merge. Its proposals go through the metadata
//! plane, which lands them on the vnode's raft group.
//!
//! Placement, until the data plane replicates (a later issue): a topic's
//! segments live on one broker, the broker that coordinated the request, if
//! it is a voter of the topic's vnode (so it holds the metadata the data path
//! reads locally), else the vnode's first voter. A roll keeps a range on the
//! broker that hosts it. Whichever broker a segment is placed on starts its
//! actor once its replica applies the change (`reconcile`, run by the
//! manager on every applied change). Time comes from the broker's [`Clock`].
//!
//! Continuous work (what a coordinator does on its own timer, not for a
//! request) runs only while the coordinator holds its vnode's lease
//! (`vnode_lease.rs`, ADR 0082): a deposed leader that still believes it
//! leads stops it before the lease can pass to its successor. Today that
//! work is an audit (`stranded_segments`: active segments on brokers that
//! are down). Requests need no lease: each is one replicated command,
//! ordered by raft. Failover is not gated on the lease either (ADR 0106):
//! each upkeep tick, while this broker leads the vnode's group, hands the
//! segments whose primary failed to `maintenance/failover` under the
//! group's raft term, which fences its orders on the copies.
//!
//! The lease is held only while the vnode holds topics (ADR 0101): a vnode
//! with none has no continuous work and opens no segment, and renewing a
//! lease is a raft write every `lease_renew_ms`, the largest idle cost of a
//! quiet cluster. A coordinator takes the lease when it starts (so the
//! group's epoch is at least 1 before any segment opens) and its upkeep
//! gives it up while the vnode holds no topic; a creation on a coordinator
//! that gave it up takes it again first (waiting at most
//! `LEASE_FIRST_WAIT_MS`), and a released lease keeps its epoch.
//!
//! The files, by job: `topics.rs` creates and deletes topics; `place.rs`
//! chooses the brokers a segment's copies go on; `reshape.rs` rolls, splits
//! and merges (`failover.rs` records a failover's roll); `lifecycle.rs`
//! starts segment actors and is their
//! [`Roller`](crate::data::segment::Roller) back here, `ancestry.rs`
//! what each starts its producer table from; `reconcile.rs` makes this
//! broker's actors and copies match the metadata, `settle.rs` says which
//! deposed writers to settle; `upkeep.rs` is the timed work under the
//! lease (`lease_slot.rs`), `orders.rs` its orders to the failover actor
//! and the healer, decided by the pure planners of `malachi_core::plan`
//! (`failed.rs` judges which brokers count as failed).

mod ancestry;
mod failed;
mod failover;
mod lease_slot;
mod lifecycle;
mod moves;
mod orders;
mod place;
mod reconcile;
mod reshape;
mod settle;
mod topics;
mod upkeep;

use std::sync::Arc;

use malachi_core::model::{NodeId, SegmentId};
use malachi_core::ring::VnodeId;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::info;

use self::lease_slot::LeaseSlot;
pub(crate) use self::place::{
    brokers_with_attributes, load_view, placement_candidates, policy_constraints,
};
pub(crate) use self::reconcile::reconcile;
use self::upkeep::spawn_failure_watch;
pub(crate) use super::requests::{CoordError, CoordinatorMsg};
use crate::control::lease::{CoordinatorLease, KeeperOwner};
use crate::control::order_epoch::OrderEpochs;
use crate::control::shared::Shared;
pub(crate) use malachi_core::plan::heal::wanted_copies;

pub(crate) struct CoordinatorActor;

pub(crate) struct CoordinatorState {
    shared: Arc<Shared>,
    vnode: VnodeId,
}

impl CoordinatorState {
    /// The logic of `vnode`'s coordinator, for the actor or for a request the
    /// manager serves on a broker that does not lead the vnode.
    pub(crate) fn new(shared: Arc<Shared>, vnode: VnodeId) -> CoordinatorState {
        CoordinatorState { shared, vnode }
    }

    fn node(&self) -> NodeId {
        NodeId(self.shared.config.node_id)
    }

    /// Answers one request. Unexpected messages are dropped (the manager
    /// handles `Reconcile` and `Replan` itself).
    pub(crate) async fn serve(&self, msg: CoordinatorMsg) {
        match msg {
            CoordinatorMsg::CreateTopic {
                name,
                policy,
                replication_factor,
                reply,
            } => {
                let _ = reply.send(self.create_topic(name, policy, replication_factor).await);
            }
            CoordinatorMsg::DeleteTopic { name, reply } => {
                let _ = reply.send(self.delete_topic(name).await);
            }
            CoordinatorMsg::Roll {
                topic,
                segment,
                seal,
                reply,
            } => {
                let _ = reply.send(self.roll(topic, segment, seal).await);
            }
            CoordinatorMsg::Split {
                topic,
                range,
                reply,
            } => {
                let _ = reply.send(self.split(topic, range).await);
            }
            CoordinatorMsg::Move {
                topic,
                range,
                to,
                reply,
            } => {
                let _ = reply.send(self.move_primary(topic, range, to).await);
            }
            CoordinatorMsg::Merge {
                topic,
                range,
                reply,
            } => {
                let _ = reply.send(self.merge(topic, range).await);
            }
            CoordinatorMsg::Reconcile
            | CoordinatorMsg::Replan
            | CoordinatorMsg::Upkeep
            | CoordinatorMsg::TaskEnded(_) => {}
        }
    }
}

/// A running coordinator: the request logic, and the lease its continuous
/// work runs under.
pub(crate) struct CoordinatorRun {
    logic: CoordinatorState,
    /// This actor: the owner of the lease's renew loop.
    myself: ActorRef<CoordinatorMsg>,
    lease: LeaseSlot,
    /// Whether the last upkeep tick ran, to log only the transitions.
    upkeep_running: bool,
    /// The stranded segments last reported, to warn only on a change.
    stranded: Vec<(String, SegmentId, NodeId)>,
    /// The release of a lease given up, while it may still be in flight. A
    /// new lease waits for it: this holder's renewal keeps the epoch, so a
    /// release landing after the new grant would release the new lease and
    /// leave the vnode without one until the next renewal (seen as creates
    /// of up to 2 s on a vnode whose last topic had just gone).
    releasing: Option<tokio::task::JoinHandle<()>>,
    /// Wakes the upkeep when a broker starts to look failed
    /// (`spawn_failure_watch`); aborted when the coordinator stops.
    failures: Option<tokio::task::JoinHandle<()>>,
    /// Since when each broker has looked failed: gone past
    /// `replace_after_ms`, its copies are healed elsewhere.
    down: malachi_cluster::vnodes::rebalance::DownSince,
    /// When the healer was last asked to poll the scrub verdicts, and the
    /// last segment asked about (ADR 0110).
    scrubbed_at: Option<std::time::Instant>,
    scrub_after: u64,
    /// When the failover actor was last asked to probe this vnode's active
    /// segments for an orphaned fence, and the last segment asked about.
    probed_at: Option<std::time::Instant>,
    probe_after: u64,
    /// When the last retention pass started, the pass while it runs, and
    /// the topics it found naming an unresolved policy (ADR 0115).
    retained_at: Option<std::time::Instant>,
    retention: Option<tokio::task::JoinHandle<super::retention::Unresolved>>,
    unresolved: super::retention::Unresolved,
    /// The epochs this coordinator's orders carried, which never go back.
    orders: OrderEpochs,
}

/// The coordinator, as the owner of its lease's renew loop: told (and so
/// failing, for its supervisor to restart it) if the loop ends.
fn keeper_owner(shared: &Shared, myself: ActorRef<CoordinatorMsg>) -> KeeperOwner<CoordinatorMsg> {
    #[cfg(not(feature = "testing"))]
    let _ = shared;
    KeeperOwner {
        actor: myself,
        ended: CoordinatorMsg::TaskEnded,
        #[cfg(feature = "testing")]
        broker: shared.client_addr,
    }
}

#[ractor::async_trait]
impl Actor for CoordinatorActor {
    type Msg = CoordinatorMsg;
    type State = CoordinatorRun;
    type Arguments = (Arc<Shared>, VnodeId);

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        (shared, vnode): (Arc<Shared>, VnodeId),
    ) -> Result<CoordinatorRun, ActorProcessingErr> {
        // The vnodes actor started before the manager (rest_for_one order).
        let plane = shared.plane()?;
        // Taken at once, as a new coordinator's first act: a group that
        // never granted a lease would open segments at writer epoch 0, which
        // no older epoch precedes (ADR 0097). The upkeep gives it up while
        // the vnode holds no topic, and a released lease keeps its epoch.
        let lease = match plane.host() {
            Some(host) => {
                let lease = CoordinatorLease::start(
                    Arc::clone(host),
                    vnode,
                    shared.config.cluster.lease_config(shared.config.node_id),
                    keeper_owner(&shared, myself.clone()),
                )?;
                shared
                    .memory
                    .lease_probes
                    .lock()
                    .insert(vnode, lease.probe());
                LeaseSlot::Held(lease)
            }
            None => LeaseSlot::Unneeded,
        };
        shared.actors.coordinators().register(vnode, myself.clone());
        // The timer ends with the actor (ractor stops sending to a dead actor).
        let every = std::time::Duration::from_millis(shared.config.cluster.coordinator_poll_ms);
        myself.send_interval(every, || CoordinatorMsg::Upkeep);
        let failures = spawn_failure_watch(&shared, myself.clone());
        info!(%vnode, "coordinator started");
        Ok(CoordinatorRun {
            logic: CoordinatorState::new(shared, vnode),
            myself,
            lease,
            upkeep_running: false,
            stranded: Vec::new(),
            releasing: None,
            failures,
            down: malachi_cluster::vnodes::rebalance::DownSince::default(),
            scrubbed_at: None,
            scrub_after: 0,
            probed_at: None,
            probe_after: 0,
            retained_at: None,
            retention: None,
            unresolved: Default::default(),
            orders: OrderEpochs::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorRun,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Upkeep => state.upkeep().await,
            CoordinatorMsg::TaskEnded(ended) => return Err(ended.into()),
            request @ CoordinatorMsg::CreateTopic { .. } => {
                state.take_lease().await;
                state.logic.serve(request).await
            }
            request => state.logic.serve(request).await,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        state: &mut CoordinatorRun,
    ) -> Result<(), ActorProcessingErr> {
        // A restarted successor may have registered already: remove only
        // this actor's own entry.
        state
            .logic
            .shared
            .actors
            .coordinators()
            .unregister(state.logic.vnode, &myself);
        if let Some(failures) = state.failures.take() {
            failures.abort();
        }
        // A retention pass runs under this coordinator's lease: it stops
        // with it (a proposal it made still commits or not, as any).
        if let Some(retention) = state.retention.take() {
            retention.abort();
        }
        // The upkeep has stopped with the actor: give the lease up so the
        // next leader's coordinator need not wait it out. Off the stop path:
        // the release is a raft round trip that must not hold up a restart.
        if let LeaseSlot::Held(lease) = std::mem::replace(&mut state.lease, LeaseSlot::Idle) {
            tokio::spawn(lease.stop());
        }
        info!(vnode = %state.logic.vnode, "coordinator stopped");
        Ok(())
    }
}
