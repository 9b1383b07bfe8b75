//! Coordinator leases: a coordinator's continuous work (retention, healing,
//! rebalancing) runs only while it holds the lease of its own group.
//!
//! The group records the lease (`Command::AcquireLease`, judged by the
//! times the commands carry, never a clock of its own): another holder is
//! refused until `granted_at_ms + duration_ms`. The holder, for its part,
//! counts its lease as valid only until `sent + duration - safety_margin`
//! on its own monotonic clock, where `sent` is read *before* it proposed.
//! The grant's `at_ms` is stamped no earlier than `sent`, so the holder
//! stops at least `safety_margin` before the group lets anyone else in,
//! provided the brokers' wall clocks differ by less than the margin. A
//! holder that fails to renew therefore reports `Lost` before the lease can
//! pass (ADR 0082).
//!
//! Time reaches this logic only through `Clock` (the project's one clock,
//! `crate::clock`), so tests drive it with `ManualClock`. `LeaseKeeper` is
//! the pure decision; `spawn_lease_keeper`
//! runs it in a renew loop against a `LeaseGroup`.

use super::VnodeHost;
use crate::model::{Command, Lease, ModelError, Outcome};
use crate::ring::VnodeId;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

pub use crate::clock::{Clock, ManualClock, SystemClock};

/// A holder's lease settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The holder's node id.
    pub holder: u64,
    /// How long each grant lasts in the group's view.
    pub duration_ms: u64,
    /// How much earlier than the group the holder gives up: must exceed
    /// the wall-clock skew between brokers.
    pub safety_margin_ms: u64,
    /// How often the holder renews; below `duration_ms - safety_margin_ms`
    /// so a renewal lands before the holder's own deadline.
    pub renew_every_ms: u64,
}

impl LeaseConfig {
    /// Defaults: a 10 s lease, a 2 s margin, renewed every 2 s.
    pub fn new(holder: u64) -> LeaseConfig {
        LeaseConfig {
            holder,
            duration_ms: 10_000,
            safety_margin_ms: 2_000,
            renew_every_ms: 2_000,
        }
    }
}

/// A lease configuration that cannot keep its promise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseConfigError {
    #[error(
        "the safety margin {margin_ms} ms must be above 0 and below the duration {duration_ms} ms"
    )]
    Margin { margin_ms: u64, duration_ms: u64 },
    #[error(
        "renewing every {renew_every_ms} ms is not below the holder's window of {window_ms} ms"
    )]
    Renewal { renew_every_ms: u64, window_ms: u64 },
    #[error("duration {duration_ms} ms exceeds the longest lease, {max_ms} ms")]
    Duration { duration_ms: u64, max_ms: u64 },
}

/// What a holder may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Not held (never granted, or refused while another holds it).
    Waiting,
    /// Held: the work may run until `valid_until_ms` on this holder's
    /// monotonic clock.
    Held { epoch: u64, valid_until_ms: u64 },
    /// Was held and ran out before a renewal: the work must stop.
    Lost { epoch: u64 },
}

/// The pure lease logic of one holder.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    config: LeaseConfig,
    /// The epoch last granted and the monotonic time it is valid until.
    held: Option<(u64, u64)>,
}

impl LeaseKeeper {
    pub fn new(config: LeaseConfig) -> Result<LeaseKeeper, LeaseConfigError> {
        let max_ms = crate::model::LEASE_DURATION_MAX_MS;
        if config.duration_ms > max_ms {
            return Err(LeaseConfigError::Duration {
                duration_ms: config.duration_ms,
                max_ms,
            });
        }
        if config.safety_margin_ms == 0 || config.safety_margin_ms >= config.duration_ms {
            return Err(LeaseConfigError::Margin {
                margin_ms: config.safety_margin_ms,
                duration_ms: config.duration_ms,
            });
        }
        let window_ms = config.duration_ms - config.safety_margin_ms;
        if config.renew_every_ms == 0 || config.renew_every_ms >= window_ms {
            return Err(LeaseConfigError::Renewal {
                renew_every_ms: config.renew_every_ms,
                window_ms,
            });
        }
        Ok(LeaseKeeper { config, held: None })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The command to propose now, and the monotonic time read before it,
    /// which `on_answer` needs back.
    pub fn request(&self, clock: &dyn Clock) -> (Command, u64) {
        let sent_ms = clock.monotonic_ms();
        let cmd = Command::AcquireLease {
            holder: self.config.holder,
            duration_ms: self.config.duration_ms,
            at_ms: clock.wall_ms(),
        };
        (cmd, sent_ms)
    }

    /// Records the group's answer to a request sent at `sent_ms`. A refusal
    /// or a failed proposal changes nothing: the lease then simply runs out
    /// on this holder's clock.
    pub fn on_answer(&mut self, answer: &Result<Outcome, ModelError>, sent_ms: u64) {
        if let Ok(Outcome::LeaseGranted { lease }) = answer {
            self.on_grant(lease, sent_ms);
        }
    }

    fn on_grant(&mut self, lease: &Lease, sent_ms: u64) {
        if lease.holder != self.config.holder {
            return;
        }
        let valid_until = sent_ms
            .saturating_add(lease.duration_ms)
            .saturating_sub(self.config.safety_margin_ms);
        // A late answer to an older request never shortens a newer grant.
        let valid_until = match self.held {
            Some((epoch, until)) if epoch == lease.epoch => until.max(valid_until),
            _ => valid_until,
        };
        self.held = Some((lease.epoch, valid_until));
    }

    /// The lease as this holder must act on it at `now_ms` (monotonic).
    pub fn state(&self, now_ms: u64) -> LeaseState {
        match self.held {
            Some((epoch, valid_until_ms)) if now_ms < valid_until_ms => LeaseState::Held {
                epoch,
                valid_until_ms,
            },
            Some((epoch, _)) => LeaseState::Lost { epoch },
            None => LeaseState::Waiting,
        }
    }

    /// Whether the work may run at `now_ms`.
    pub fn holds(&self, now_ms: u64) -> bool {
        matches!(self.state(now_ms), LeaseState::Held { .. })
    }

    /// The command giving the lease up early, once the work has stopped.
    pub fn release(&self) -> Option<Command> {
        self.held.map(|(epoch, _)| Command::ReleaseLease {
            holder: self.config.holder,
            epoch,
        })
    }
}

/// Where a lease is proposed: the coordinator's own group.
#[async_trait::async_trait]
pub trait LeaseGroup: Send + Sync + 'static {
    /// Proposes `cmd`; `Err` when the group could not be reached.
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, String>;
}

/// A vnode's group, through any broker's router.
#[derive(Debug, Clone)]
pub struct VnodeLeaseGroup {
    pub host: Arc<VnodeHost>,
    pub vnode: VnodeId,
}

#[async_trait::async_trait]
impl LeaseGroup for VnodeLeaseGroup {
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, String> {
        self.host
            .propose_to(self.vnode, cmd)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A running renew loop.
#[derive(Debug)]
pub struct LeaseHandle {
    keeper: Arc<Mutex<LeaseKeeper>>,
    clock: Arc<dyn Clock>,
    state: watch::Receiver<LeaseState>,
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseHandle {
    /// Whether the work may run now, read from the clock at the call (the
    /// watch may lag by one tick; this never does).
    pub fn holds(&self) -> bool {
        self.keeper.lock().holds(self.clock.monotonic_ms())
    }

    /// The lease now, read from the clock at the call.
    pub fn state(&self) -> LeaseState {
        self.keeper.lock().state(self.clock.monotonic_ms())
    }

    /// Changes of the lease state, published within one tick: a
    /// coordinator stops its work on `Lost` and resumes on `Held`.
    pub fn watch(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Ends the renew loop at once, without waiting for it: for an owner
    /// dropped without a graceful `stop` (a crashed actor). The lease runs
    /// out on its own.
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Stops renewing. The lease runs out on its own; the caller may then
    /// propose `LeaseKeeper::release` to free it early.
    pub async fn stop(self) {
        self.stop.notify_one();
        // The task ends at the notification; a JoinError means it panicked,
        // which the panic hook already reported.
        let _ = self.task.await;
    }
}

/// Runs `keeper` in a loop: renews every `renew_every_ms` (by `clock`),
/// and publishes the lease state at least every `tick_ms` (real time),
/// also while a proposal hangs, so `Lost` is reported on time.
pub fn spawn_lease_keeper(
    keeper: LeaseKeeper,
    group: Arc<dyn LeaseGroup>,
    clock: Arc<dyn Clock>,
    tick_ms: u64,
) -> LeaseHandle {
    let renew_every_ms = keeper.config().renew_every_ms;
    let holder = keeper.config().holder;
    let keeper = Arc::new(Mutex::new(keeper));
    let (tx, rx) = watch::channel(LeaseState::Waiting);
    let stop = Arc::new(Notify::new());
    let tick = Duration::from_millis(tick_ms.max(1));
    let task = {
        let keeper = Arc::clone(&keeper);
        let clock = Arc::clone(&clock);
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let publish = |tx: &watch::Sender<LeaseState>| {
                let now = keeper.lock().state(clock.monotonic_ms());
                tx.send_if_modified(|current| {
                    let changed = *current != now;
                    if changed {
                        tracing::info!(holder, ?now, "lease state changed");
                    }
                    *current = now;
                    changed
                });
            };
            let mut next_renew_ms = 0u64;
            loop {
                if clock.monotonic_ms() >= next_renew_ms {
                    let (cmd, sent_ms) = keeper.lock().request(clock.as_ref());
                    let proposal = group.propose(cmd);
                    tokio::pin!(proposal);
                    let answer = loop {
                        tokio::select! {
                            answer = &mut proposal => break answer,
                            _ = tokio::time::sleep(tick) => publish(&tx),
                            _ = stop.notified() => return,
                        }
                    };
                    match &answer {
                        Ok(verdict) => keeper.lock().on_answer(verdict, sent_ms),
                        Err(reason) => {
                            tracing::debug!(holder, %reason, "lease renewal did not reach the group")
                        }
                    }
                    next_renew_ms = sent_ms.saturating_add(renew_every_ms);
                }
                publish(&tx);
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = stop.notified() => return,
                }
            }
        })
    };
    LeaseHandle {
        keeper,
        clock,
        state: rx,
        stop,
        task,
    }
}
