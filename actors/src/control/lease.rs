//! A coordinator's lease on its vnode's continuous work (ADR 0082).
//!
//! Raft leadership is a local belief: a deposed leader keeps running its
//! coordinator until it hears a higher term. Work a coordinator does on a
//! timer, without a request that raft would serialize, must not overlap
//! with its successor's, so it runs only while the coordinator holds a
//! lease recorded in its own vnode's group (`Command::AcquireLeaseWaited`), and
//! stops before the lease can pass to another: `LeaseHandle::holds` reads
//! the holder's monotonic clock against a deadline a safety margin before
//! another may take it, which another does only after seeing the lease
//! unrenewed for a whole duration on its own monotonic clock (ADR 0122). Request-driven work (create, delete, roll, split,
//! merge) needs no lease: each of those is one replicated command, which
//! raft orders whoever proposes it.
//!
//! [`CoordinatorLease`] starts the renew loop when a coordinator starts and,
//! on a graceful stop, gives the lease up early so the next leader's
//! coordinator does not wait out the whole duration. The loop runs on a
//! task its owner watches (`spawn_watched`): if it ends (a panic, or a
//! return) the owner is told, fails, and its supervisor restarts it, lease
//! and all, rather than leave it working without a renewed lease.

use std::sync::Arc;

use malachi_cluster::vnodes::VnodeHost;
use malachi_cluster::vnodes::lease::{
    Clock, LeaseConfig, LeaseConfigError, LeaseGroup, LeaseKeeper, LeaseState, LeaseView,
    SystemClock, VnodeLeaseGroup, lease_keeper,
};
use malachi_core::ring::VnodeId;
use parking_lot::Mutex;
use ractor::{ActorRef, Message};
use tracing::debug;

use crate::common::watched::{TaskEnded, Watched, spawn_watched};

/// How often the renew loop republishes the lease state (real time), so a
/// lost lease is noticed within a tick even while a renewal hangs.
const LEASE_TICK_MS: u64 = 200;

/// The watched task's name, and the trip point a test arms to crash it.
pub(crate) const LEASE_KEEPER_TASK: &str = "lease_keeper";

/// Who is told when a lease's renew loop ends, and how.
pub(crate) struct KeeperOwner<M: Message> {
    pub actor: ActorRef<M>,
    pub ended: fn(TaskEnded) -> M,
    /// The broker whose armed test faults the loop trips.
    #[cfg(feature = "testing")]
    pub broker: std::net::SocketAddr,
}

/// The lease a coordinator holds on its vnode's continuous work.
pub(crate) struct CoordinatorLease {
    /// The lease as its keeper counts it; `None` once `stop` took it.
    /// Shared with [`LeaseProbe`]s.
    view: Arc<Mutex<Option<LeaseView>>>,
    /// The renew loop, watched by the owner; aborted when dropped.
    keeper: Option<Watched>,
    group: Arc<dyn LeaseGroup>,
    holder: u64,
}

impl std::fmt::Debug for CoordinatorLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorLease")
            .field("holder", &self.holder)
            .field("state", &self.view.lock().as_ref().map(LeaseView::state))
            .finish_non_exhaustive()
    }
}

impl CoordinatorLease {
    /// Starts renewing the lease on `vnode`'s group, proposed through the
    /// host's router (so it lands on the leader wherever it is); `owner`
    /// is told if the renew loop ends.
    pub(crate) fn start<M: Message>(
        host: Arc<VnodeHost>,
        vnode: VnodeId,
        config: LeaseConfig,
        owner: KeeperOwner<M>,
    ) -> Result<CoordinatorLease, LeaseConfigError> {
        let group: Arc<dyn LeaseGroup> = Arc::new(VnodeLeaseGroup { host, vnode });
        let clock = Arc::new(SystemClock::new());
        CoordinatorLease::start_with(group, clock, config, LEASE_TICK_MS, owner)
    }

    /// `start` over any group and clock (tests drive both).
    pub(crate) fn start_with<M: Message>(
        group: Arc<dyn LeaseGroup>,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
        tick_ms: u64,
        owner: KeeperOwner<M>,
    ) -> Result<CoordinatorLease, LeaseConfigError> {
        let keeper = LeaseKeeper::new(config)?;
        let (view, run) = lease_keeper(keeper, Arc::clone(&group), clock, tick_ms);
        #[cfg(feature = "testing")]
        let run = {
            let broker = owner.broker;
            async move {
                tokio::select! {
                    () = run => {}
                    () = trip_keeper(broker, tick_ms) => {}
                }
            }
        };
        let keeper = spawn_watched(owner.actor, LEASE_KEEPER_TASK, run, owner.ended);
        Ok(CoordinatorLease {
            view: Arc::new(Mutex::new(Some(view))),
            keeper: Some(keeper),
            group,
            holder: config.holder,
        })
    }

    /// Whether continuous work may run now (read from the clock at the call).
    pub(crate) fn holds(&self) -> bool {
        self.view.lock().as_ref().is_some_and(LeaseView::holds)
    }

    /// The lease now.
    pub(crate) fn state(&self) -> LeaseState {
        self.view
            .lock()
            .as_ref()
            .map_or(LeaseState::Waiting, LeaseView::state)
    }

    /// A read-only view of this lease for `/metrics`, which outlives
    /// neither the lease nor its stop.
    pub(crate) fn probe(&self) -> LeaseProbe {
        LeaseProbe(Arc::downgrade(&self.view))
    }

    /// Stops renewing and, once the work has stopped (the caller stops it
    /// first), releases the lease so a successor need not wait it out: by
    /// the generation it was last granted while
    /// `Feature::LeaseReleaseGeneration` is active (F11), the old form
    /// otherwise. Best effort: an unreachable group lets the lease run out
    /// instead.
    pub(crate) async fn stop(mut self) {
        let Some(view) = self.view.lock().take() else {
            return;
        };
        // Ended without telling the owner, which is stopping it.
        if let Some(keeper) = self.keeper.take() {
            keeper.stop().await;
        }
        let named = self.group.release_generation();
        let Some(release) = view.release(named) else {
            return;
        };
        let holder = self.holder;
        match self.group.propose(release).await {
            Ok(Ok(_)) => debug!(holder, named, "lease released"),
            Ok(Err(refused)) => debug!(holder, named, %refused, "lease not released"),
            Err(reason) => debug!(holder, named, %reason, "lease not released"),
        }
    }
}

/// Panics, once, when a test armed the keeper's trip point in `broker`:
/// a crash of the renew loop, which its owner must hear about.
#[cfg(feature = "testing")]
async fn trip_keeper(broker: std::net::SocketAddr, tick_ms: u64) {
    let tick = std::time::Duration::from_millis(tick_ms.max(1));
    loop {
        crate::common::faults::trip(broker, LEASE_KEEPER_TASK);
        tokio::time::sleep(tick).await;
    }
}

/// Whether a coordinator's lease is held, read at the moment of asking
/// (its holder's monotonic clock against its deadline), for
/// `malachi_coordinator_lease_held`: what lets an outside observer (the
/// chaos harness) check that no two brokers hold one vnode's lease at once.
#[derive(Debug, Clone)]
pub(crate) struct LeaseProbe(std::sync::Weak<Mutex<Option<LeaseView>>>);

impl LeaseProbe {
    /// `None` once the lease is gone (its coordinator dropped it).
    pub(crate) fn holds(&self) -> Option<bool> {
        let view = self.0.upgrade()?;
        let held = view.lock().as_ref().is_some_and(LeaseView::holds);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use malachi_cluster::clock::ManualClock;
    use malachi_core::model::{Command, Lease, ModelError, Outcome};
    use parking_lot::Mutex;
    use ractor::{Actor, ActorProcessingErr};
    use tokio::sync::mpsc;

    use super::*;

    /// A group that grants every request while `up`, is unreachable
    /// otherwise, and records releases; its proposals panic once `broken`.
    #[derive(Debug, Default)]
    struct FakeGroup {
        down: AtomicBool,
        broken: AtomicBool,
        /// Whether `Feature::LeaseReleaseGeneration` is active.
        named: bool,
        released: Mutex<Vec<Command>>,
        proposals: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl LeaseGroup for FakeGroup {
        async fn propose(
            &self,
            cmd: Command,
        ) -> Result<Result<Outcome, ModelError>, malachi_cluster::vnodes::RouteError> {
            self.proposals.fetch_add(1, Ordering::SeqCst);
            assert!(!self.broken.load(Ordering::SeqCst), "the group broke");
            if self.down.load(Ordering::SeqCst) {
                return Err(malachi_cluster::vnodes::RouteError::Stopped);
            }
            match cmd {
                Command::AcquireLeaseWaited {
                    holder,
                    duration_ms,
                    at_ms,
                    ..
                } => Ok(Ok(Outcome::LeaseGranted {
                    lease: Lease {
                        holder,
                        epoch: 1,
                        granted_at_ms: at_ms,
                        duration_ms,
                        generation: 1,
                    },
                })),
                release @ (Command::ReleaseLease { .. }
                | Command::ReleaseLeaseGeneration { .. }) => {
                    self.released.lock().push(release);
                    Ok(Ok(Outcome::Unchanged))
                }
                other => Err(malachi_cluster::vnodes::RouteError::Failed {
                    vnode: malachi_core::ring::VnodeId(0),
                    reason: format!("unexpected {other:?}"),
                }),
            }
        }

        fn release_generation(&self) -> bool {
            self.named
        }
    }

    /// Stands for a coordinator: forwards the end of its lease's renew
    /// loop.
    struct Owner;

    #[derive(Debug)]
    struct Ended(TaskEnded);

    impl ractor::Message for Ended {}

    #[ractor::async_trait]
    impl Actor for Owner {
        type Msg = Ended;
        type State = mpsc::UnboundedSender<TaskEnded>;
        type Arguments = mpsc::UnboundedSender<TaskEnded>;

        async fn pre_start(
            &self,
            _myself: ActorRef<Ended>,
            told: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(told)
        }

        async fn handle(
            &self,
            _myself: ActorRef<Ended>,
            Ended(ended): Ended,
            told: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let _ = told.send(ended);
            Ok(())
        }
    }

    /// An owner, and what it is told.
    async fn owner() -> (KeeperOwner<Ended>, mpsc::UnboundedReceiver<TaskEnded>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (actor, _) = Actor::spawn(None, Owner, tx).await.unwrap();
        let owner = KeeperOwner {
            actor,
            ended: Ended,
            #[cfg(feature = "testing")]
            broker: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        (owner, rx)
    }

    fn config() -> LeaseConfig {
        LeaseConfig {
            holder: 7,
            duration_ms: 1_000,
            safety_margin_ms: 200,
            renew_every_ms: 300,
        }
    }

    async fn eventually(what: &str, check: impl Fn() -> bool) {
        for _ in 0..500 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("never: {what}");
    }

    async fn start(
        group: &Arc<FakeGroup>,
        clock: &Arc<ManualClock>,
    ) -> (CoordinatorLease, mpsc::UnboundedReceiver<TaskEnded>) {
        let (owner, told) = owner().await;
        let lease =
            CoordinatorLease::start_with(group.clone(), clock.clone(), config(), 5, owner).unwrap();
        (lease, told)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_stops_when_renewals_stop_reaching_the_group_and_the_lease_is_released_on_stop() {
        let group = Arc::new(FakeGroup::default());
        let clock = Arc::new(ManualClock::new(0));
        let (lease, mut told) = start(&group, &clock).await;
        eventually("the lease is granted", || lease.holds()).await;

        // The group goes out of reach: renewals fail, and the holder's own
        // deadline (granted at 0 + 1000 - margin 200) passes.
        group.down.store(true, Ordering::SeqCst);
        clock.advance_ms(799);
        assert!(lease.holds(), "still inside the holder's window");
        clock.advance_ms(1);
        assert!(!lease.holds(), "work must stop at the holder's deadline");
        assert!(matches!(lease.state(), LeaseState::Lost { epoch: 1 }));

        // Back in reach: the next renewal (due one period after the last
        // failed one) grants it again.
        group.down.store(false, Ordering::SeqCst);
        clock.advance_ms(config().renew_every_ms);
        eventually("the lease is granted again", || lease.holds()).await;
        lease.stop().await;
        // The feature is not active: the old form, which every broker decodes.
        assert_eq!(
            *group.released.lock(),
            vec![Command::ReleaseLease {
                holder: 7,
                epoch: 1
            }]
        );
        // A stop is no crash: the owner is not told.
        assert!(told.try_recv().is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_the_feature_active_the_release_names_its_generation() {
        let group = Arc::new(FakeGroup {
            named: true,
            ..FakeGroup::default()
        });
        let clock = Arc::new(ManualClock::new(0));
        let (lease, _told) = start(&group, &clock).await;
        eventually("the lease is granted", || lease.holds()).await;
        lease.stop().await;
        assert_eq!(
            *group.released.lock(),
            vec![Command::ReleaseLeaseGeneration {
                holder: 7,
                epoch: 1,
                generation: 1
            }]
        );
    }

    /// Issue 37: a renew loop that ends (here a panic) is not left dead
    /// behind a coordinator that goes on counting on it: its owner is told.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_owner_is_told_when_the_renew_loop_panics() {
        let group = Arc::new(FakeGroup::default());
        let clock = Arc::new(ManualClock::new(0));
        let (lease, mut told) = start(&group, &clock).await;
        eventually("the lease is granted", || lease.holds()).await;
        group.broken.store(true, Ordering::SeqCst);
        clock.advance_ms(config().renew_every_ms);
        let ended = tokio::time::timeout(Duration::from_secs(10), told.recv())
            .await
            .expect("the owner was never told")
            .unwrap();
        assert_eq!(ended.task, LEASE_KEEPER_TASK);
        assert!(ended.how.contains("the group broke"), "{ended}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_dropped_without_stop_stops_renewing() {
        let group = Arc::new(FakeGroup::default());
        let clock = Arc::new(ManualClock::new(0));
        let (lease, _told) = start(&group, &clock).await;
        eventually("the lease is granted", || lease.holds()).await;
        drop(lease);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after_drop = group.proposals.load(Ordering::SeqCst);
        // Renewals would be due every period of the simulated clock.
        for _ in 0..5 {
            clock.advance_ms(config().renew_every_ms);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(group.proposals.load(Ordering::SeqCst), after_drop);
    }

    #[test]
    fn a_lease_setting_that_cannot_keep_its_promise_is_refused() {
        let group = Arc::new(FakeGroup::default());
        let bad = LeaseConfig {
            safety_margin_ms: 1_000,
            ..config()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = runtime.block_on(async {
            let (owner, _told) = owner().await;
            CoordinatorLease::start_with(group, Arc::new(ManualClock::new(0)), bad, 5, owner)
                .map(|_| ())
        });
        assert!(matches!(started, Err(LeaseConfigError::Margin { .. })));
    }
}
