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
//! coordinator does not wait out the whole duration.

use std::sync::Arc;

use malachi_cluster::vnodes::VnodeHost;
use malachi_cluster::vnodes::lease::{
    Clock, LeaseConfig, LeaseConfigError, LeaseGroup, LeaseHandle, LeaseKeeper, LeaseState,
    SystemClock, VnodeLeaseGroup, spawn_lease_keeper,
};
use malachi_core::model::Command;
use malachi_core::ring::VnodeId;
use parking_lot::Mutex;
use tracing::debug;

/// How often the renew loop republishes the lease state (real time), so a
/// lost lease is noticed within a tick even while a renewal hangs.
const LEASE_TICK_MS: u64 = 200;

/// The lease a coordinator holds on its vnode's continuous work.
pub(crate) struct CoordinatorLease {
    /// `None` once `stop` took it. Shared with [`LeaseProbe`]s.
    handle: Arc<Mutex<Option<LeaseHandle>>>,
    group: Arc<dyn LeaseGroup>,
    holder: u64,
}

impl std::fmt::Debug for CoordinatorLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorLease")
            .field("holder", &self.holder)
            .field(
                "state",
                &self.handle.lock().as_ref().map(LeaseHandle::state),
            )
            .finish_non_exhaustive()
    }
}

impl CoordinatorLease {
    /// Starts renewing the lease on `vnode`'s group, proposed through the
    /// host's router (so it lands on the leader wherever it is).
    pub(crate) fn start(
        host: Arc<VnodeHost>,
        vnode: VnodeId,
        config: LeaseConfig,
    ) -> Result<CoordinatorLease, LeaseConfigError> {
        let group: Arc<dyn LeaseGroup> = Arc::new(VnodeLeaseGroup { host, vnode });
        CoordinatorLease::start_with(group, Arc::new(SystemClock::new()), config, LEASE_TICK_MS)
    }

    /// `start` over any group and clock (tests drive both).
    pub(crate) fn start_with(
        group: Arc<dyn LeaseGroup>,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
        tick_ms: u64,
    ) -> Result<CoordinatorLease, LeaseConfigError> {
        let keeper = LeaseKeeper::new(config)?;
        let handle = spawn_lease_keeper(keeper, Arc::clone(&group), clock, tick_ms);
        Ok(CoordinatorLease {
            handle: Arc::new(Mutex::new(Some(handle))),
            group,
            holder: config.holder,
        })
    }

    /// Whether continuous work may run now (read from the clock at the call).
    pub(crate) fn holds(&self) -> bool {
        self.handle.lock().as_ref().is_some_and(LeaseHandle::holds)
    }

    /// The lease now.
    pub(crate) fn state(&self) -> LeaseState {
        self.handle
            .lock()
            .as_ref()
            .map_or(LeaseState::Waiting, LeaseHandle::state)
    }

    /// A read-only view of this lease for `/metrics`, which outlives
    /// neither the lease nor its stop.
    pub(crate) fn probe(&self) -> LeaseProbe {
        LeaseProbe(Arc::downgrade(&self.handle))
    }

    /// Stops renewing and, once the work has stopped (the caller stops it
    /// first), releases the lease so a successor need not wait it out.
    /// Best effort: an unreachable group lets the lease run out instead.
    pub(crate) async fn stop(self) {
        let Some(handle) = self.handle.lock().take() else {
            return;
        };
        let epoch = match handle.state() {
            LeaseState::Held { epoch, .. } | LeaseState::Lost { epoch } => Some(epoch),
            LeaseState::Waiting => None,
        };
        handle.stop().await;
        if let Some(epoch) = epoch {
            let release = Command::ReleaseLease {
                holder: self.holder,
                epoch,
            };
            match self.group.propose(release).await {
                Ok(Ok(_)) => debug!(holder = self.holder, epoch, "lease released"),
                Ok(Err(refused)) => {
                    debug!(holder = self.holder, epoch, %refused, "lease not released")
                }
                Err(reason) => debug!(holder = self.holder, epoch, %reason, "lease not released"),
            }
        }
    }
}

impl Drop for CoordinatorLease {
    /// A coordinator that crashed (no graceful `stop`) must not leave its
    /// renew loop running: its restarted successor starts its own.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.lock().as_ref() {
            handle.abort();
        }
    }
}

/// Whether a coordinator's lease is held, read at the moment of asking
/// (its holder's monotonic clock against its deadline), for
/// `malachi_coordinator_lease_held`: what lets an outside observer (the
/// chaos harness) check that no two brokers hold one vnode's lease at once.
#[derive(Debug, Clone)]
pub(crate) struct LeaseProbe(std::sync::Weak<Mutex<Option<LeaseHandle>>>);

impl LeaseProbe {
    /// `None` once the lease is gone (its coordinator dropped it).
    pub(crate) fn holds(&self) -> Option<bool> {
        let handle = self.0.upgrade()?;
        let held = handle.lock().as_ref().is_some_and(LeaseHandle::holds);
        Some(held)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use malachi_cluster::clock::ManualClock;
    use malachi_core::model::{Lease, ModelError, Outcome};
    use parking_lot::Mutex;

    use super::*;

    /// A group that grants every request while `up`, is unreachable
    /// otherwise, and records releases.
    #[derive(Debug, Default)]
    struct FakeGroup {
        down: AtomicBool,
        released: Mutex<Vec<u64>>,
        proposals: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl LeaseGroup for FakeGroup {
        async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, String> {
            self.proposals.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err("unreachable".into());
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
                Command::ReleaseLease { epoch, .. } => {
                    self.released.lock().push(epoch);
                    Ok(Ok(Outcome::Unchanged))
                }
                other => Err(format!("unexpected {other:?}")),
            }
        }
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_stops_when_renewals_stop_reaching_the_group_and_the_lease_is_released_on_stop() {
        let group = Arc::new(FakeGroup::default());
        let clock = Arc::new(ManualClock::new(0));
        let lease =
            CoordinatorLease::start_with(group.clone(), clock.clone(), config(), 5).unwrap();
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
        assert_eq!(*group.released.lock(), vec![1]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_dropped_without_stop_stops_renewing() {
        let group = Arc::new(FakeGroup::default());
        let clock = Arc::new(ManualClock::new(0));
        let lease =
            CoordinatorLease::start_with(group.clone(), clock.clone(), config(), 5).unwrap();
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
            CoordinatorLease::start_with(group, Arc::new(ManualClock::new(0)), bad, 5).map(|_| ())
        });
        assert!(matches!(started, Err(LeaseConfigError::Margin { .. })));
    }
}
