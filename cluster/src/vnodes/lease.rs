//! Coordinator leases: a coordinator's continuous work (retention, healing,
//! rebalancing) runs only while it holds the lease of its own group.
//!
//! No wall clock takes part in any decision (ADR 0122, replacing the
//! wall-clock rule of ADR 0082): wall clocks jump and differ between
//! brokers; each broker's monotonic clock only drifts in rate, slightly.
//!
//! - The group (`Command::AcquireLeaseWaited`) counts every grant and renewal in
//!   `Lease::generation`. The holder renews freely; another is refused with
//!   `LeaseHeld { generation, .. }` unless its request names that very
//!   generation in `waited_for`.
//! - The holder counts its lease valid until `sent + duration - margin` on
//!   its monotonic clock, `sent` read *before* it proposed the grant or
//!   renewal the group answered.
//! - A would-be holder that is refused notes the generation and the
//!   monotonic time the *answer arrived* (the holder's renewal may have
//!   been recorded after it sent its own request). It names the generation
//!   in `waited_for` once it has seen it unchanged for a whole `duration`
//!   (the longer of its own and the holder's); a refusal showing another
//!   generation starts the wait again.
//!
//! Why at most one holds: say B's request naming generation `g` is granted.
//! Then no renewal after `g` was recorded, so every grant the old holder H
//! acted on was sent (at `sent`) before `g` was recorded, hence before B
//! received the refusal showing `g`. B proposes a `duration` after that
//! receipt, and holds only after its grant's answer: at least `duration`
//! after H's last `sent`. H stopped at `sent + duration - margin`. The
//! margin covers the two monotonic clocks' rate drift over one duration,
//! nothing else; no two brokers' wall clocks are ever compared. The price:
//! after a holder dies, another takes over a full duration (plus up to a
//! renewal period) after its first refusal, whatever the commands' stamps.
//!
//! Time reaches this logic only through `Clock` (the project's one clock,
//! `crate::clock`), so tests drive it with `ManualClock`. `LeaseKeeper` is
//! the pure decision; `lease_keeper` makes the renew loop that runs it
//! against a `LeaseGroup`, for an owner that watches the task it runs on
//! (a coordinator, ADR 0140); `spawn_lease_keeper` spawns it on its own.

use super::{RouteError, VnodeHost};
use malachi_core::model::{Command, Lease, ModelError, Outcome};
use malachi_core::ring::VnodeId;
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
    /// How long each grant or renewal lasts, counted from before it was
    /// proposed; another must see the lease unrenewed this long (on its
    /// own monotonic clock) before it may take it.
    pub duration_ms: u64,
    /// How much earlier than another may take the lease the holder gives
    /// up: covers the rate drift of two brokers' monotonic clocks over one
    /// duration (wall clocks play no part).
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

/// A generation another holder was seen holding, waited out before the
/// lease may be taken from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wait {
    generation: u64,
    /// How long to see it unchanged: the longer of this holder's duration
    /// and the one the group recorded with it.
    wait_ms: u64,
    /// The monotonic time the answer first showing it arrived.
    since_ms: u64,
}

/// The pure lease logic of one holder.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    config: LeaseConfig,
    /// The epoch last granted and the monotonic time it is valid until.
    held: Option<(u64, u64)>,
    /// The highest generation of the `held` epoch granted to this holder:
    /// what a release names (F11).
    generation: u64,
    /// The other holder's generation being waited out, if refused.
    waiting: Option<Wait>,
}

impl LeaseKeeper {
    pub fn new(config: LeaseConfig) -> Result<LeaseKeeper, LeaseConfigError> {
        let max_ms = malachi_core::model::LEASE_DURATION_MAX_MS;
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
        Ok(LeaseKeeper {
            config,
            held: None,
            generation: 0,
            waiting: None,
        })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The command to propose now, and the monotonic time read before it,
    /// which `on_answer` needs back. It names the generation it waited out
    /// once it saw it unchanged long enough.
    pub fn request(&self, clock: &dyn Clock) -> (Command, u64) {
        let sent_ms = clock.monotonic_ms();
        let waited_for = self
            .waiting
            .filter(|w| sent_ms.saturating_sub(w.since_ms) >= w.wait_ms)
            .map(|w| w.generation);
        let cmd = Command::AcquireLeaseWaited {
            holder: self.config.holder,
            duration_ms: self.config.duration_ms,
            // Display only: the group decides nothing by it.
            at_ms: clock.wall_ms(),
            waited_for,
        };
        (cmd, sent_ms)
    }

    /// Records the group's answer to a request sent at `sent_ms`, received
    /// at `received_ms` (both monotonic). A grant extends the lease from
    /// `sent_ms`; a refusal starts (or goes on with) the wait on the
    /// generation it shows, from `received_ms`, and ends any lease this
    /// holder still counted on. A failed proposal changes nothing: the
    /// lease then simply runs out on this holder's clock.
    pub fn on_answer(
        &mut self,
        answer: &Result<Outcome, ModelError>,
        sent_ms: u64,
        received_ms: u64,
    ) {
        match answer {
            Ok(Outcome::LeaseGranted { lease }) => self.on_grant(lease, sent_ms),
            Err(ModelError::LeaseHeld {
                holder,
                generation,
                duration_ms,
                ..
            }) if *holder != self.config.holder => {
                self.on_refusal(*generation, *duration_ms, received_ms)
            }
            _ => {}
        }
    }

    fn on_refusal(&mut self, generation: u64, duration_ms: u64, received_ms: u64) {
        // Another holds it now: whatever this holder counted on is gone.
        if let Some((epoch, until)) = self.held {
            self.held = Some((epoch, until.min(received_ms)));
        }
        if self.waiting.is_some_and(|w| w.generation == generation) {
            return;
        }
        self.waiting = Some(Wait {
            generation,
            wait_ms: self.config.duration_ms.max(duration_ms),
            since_ms: received_ms,
        });
    }

    fn on_grant(&mut self, lease: &Lease, sent_ms: u64) {
        if lease.holder != self.config.holder {
            return;
        }
        self.waiting = None;
        let valid_until = sent_ms
            .saturating_add(lease.duration_ms)
            .saturating_sub(self.config.safety_margin_ms);
        // A late answer to an older request never shortens a newer grant.
        let (valid_until, generation) = match self.held {
            Some((epoch, until)) if epoch == lease.epoch => (
                until.max(valid_until),
                self.generation.max(lease.generation),
            ),
            _ => (valid_until, lease.generation),
        };
        self.held = Some((lease.epoch, valid_until));
        self.generation = generation;
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

    /// The command giving the lease up early, once the work has stopped:
    /// naming the last generation granted when `named` (the writer gate
    /// of `Feature::LeaseReleaseGeneration` is open), the old form if not.
    pub fn release(&self, named: bool) -> Option<Command> {
        self.held
            .map(|(epoch, _)| release_command(named, self.config.holder, epoch, self.generation))
    }
}

/// A release of `holder`'s grant at `epoch` and `generation`: the form
/// that names the generation when `named`, so the group ignores it once
/// the lease was renewed or granted again after it (chaos finding F11);
/// otherwise `ReleaseLease`, which every broker decodes (ADR 0134).
pub fn release_command(named: bool, holder: u64, epoch: u64, generation: u64) -> Command {
    if named {
        Command::ReleaseLeaseGeneration {
            holder,
            epoch,
            generation,
        }
    } else {
        Command::ReleaseLease { holder, epoch }
    }
}

/// Where a lease is proposed: the coordinator's own group.
#[async_trait::async_trait]
pub trait LeaseGroup: Send + Sync + 'static {
    /// Proposes `cmd`; `Err` when the group could not be reached.
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, RouteError>;

    /// The writer gate of the waited lease request (ADR 0134): `Err` while
    /// `Feature::WaitedLease` is not active, and then nothing is proposed.
    fn waited_lease(&self) -> Result<(), malachi_core::model::FeatureInactive> {
        Ok(())
    }

    /// The writer gate of the release naming a generation (ADR 0134):
    /// `true` only while `Feature::LeaseReleaseGeneration` is active. A
    /// group that cannot say gets the old form, which every broker decodes.
    fn release_generation(&self) -> bool {
        false
    }

    /// A live grant the group records for `holder`, as this broker last
    /// applied it; `None` if it records none (or cannot say).
    fn recorded_grant_of(&self, _holder: u64) -> Option<Lease> {
        None
    }
}

/// A vnode's group, through any broker's router.
#[derive(Debug, Clone)]
pub struct VnodeLeaseGroup {
    pub host: Arc<VnodeHost>,
    pub vnode: VnodeId,
}

#[async_trait::async_trait]
impl LeaseGroup for VnodeLeaseGroup {
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, RouteError> {
        self.host.propose_to(self.vnode, cmd).await
    }

    fn waited_lease(&self) -> Result<(), malachi_core::model::FeatureInactive> {
        self.host.require(malachi_core::model::Feature::WaitedLease)
    }

    fn release_generation(&self) -> bool {
        self.host
            .require(malachi_core::model::Feature::LeaseReleaseGeneration)
            .is_ok()
    }

    fn recorded_grant_of(&self, holder: u64) -> Option<Lease> {
        let lease = self.host.group(self.vnode)?.read_local(|s| s.lease())?;
        (lease.holder == holder && !lease.is_released()).then_some(lease)
    }
}

/// What the owner of a renew loop reads: the lease as its keeper counts
/// it, from the clock at each call.
#[derive(Debug, Clone)]
pub struct LeaseView {
    keeper: Arc<Mutex<LeaseKeeper>>,
    clock: Arc<dyn Clock>,
    state: watch::Receiver<LeaseState>,
}

impl LeaseView {
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

    /// The command giving the lease up early, once the loop has ended (see
    /// `LeaseKeeper::release`).
    pub fn release(&self, named: bool) -> Option<Command> {
        self.keeper.lock().release(named)
    }
}

/// A running renew loop.
#[derive(Debug)]
pub struct LeaseHandle {
    view: LeaseView,
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseHandle {
    /// Whether the work may run now (see `LeaseView::holds`).
    pub fn holds(&self) -> bool {
        self.view.holds()
    }

    /// The lease now, read from the clock at the call.
    pub fn state(&self) -> LeaseState {
        self.view.state()
    }

    /// Changes of the lease state (see `LeaseView::watch`).
    pub fn watch(&self) -> watch::Receiver<LeaseState> {
        self.view.watch()
    }

    /// The command giving the lease up early (see `LeaseKeeper::release`).
    pub fn release(&self, named: bool) -> Option<Command> {
        self.view.release(named)
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

/// Runs `keeper` in a loop on a task of its own (see [`lease_keeper`]).
pub fn spawn_lease_keeper(
    keeper: LeaseKeeper,
    group: Arc<dyn LeaseGroup>,
    clock: Arc<dyn Clock>,
    tick_ms: u64,
) -> LeaseHandle {
    let (view, run) = lease_keeper(keeper, group, clock, tick_ms);
    let stop = Arc::new(Notify::new());
    let task = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::select! {
                () = run => {}
                () = stop.notified() => {}
            }
        })
    };
    LeaseHandle { view, stop, task }
}

/// The renew loop of `keeper`, for its owner to run (on a task it
/// watches, so it hears when the loop ends), and the view of the lease it
/// keeps. The loop renews every `renew_every_ms` (by `clock`) and
/// publishes the lease state at least every `tick_ms` (real time), also
/// while a proposal hangs, so `Lost` is reported on time. It never
/// returns: dropping it (aborting its task) is how it stops, and the
/// lease then runs out on its own unless released.
pub fn lease_keeper(
    keeper: LeaseKeeper,
    group: Arc<dyn LeaseGroup>,
    clock: Arc<dyn Clock>,
    tick_ms: u64,
) -> (
    LeaseView,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let keeper = Arc::new(Mutex::new(keeper));
    let (tx, rx) = watch::channel(LeaseState::Waiting);
    let view = LeaseView {
        keeper: Arc::clone(&keeper),
        clock: Arc::clone(&clock),
        state: rx,
    };
    let run = RenewLoop {
        keeper,
        group,
        clock,
        tx,
        tick: Duration::from_millis(tick_ms.max(1)),
    }
    .run();
    (view, run)
}

/// The renew loop's parts.
struct RenewLoop {
    keeper: Arc<Mutex<LeaseKeeper>>,
    group: Arc<dyn LeaseGroup>,
    clock: Arc<dyn Clock>,
    tx: watch::Sender<LeaseState>,
    tick: Duration,
}

impl RenewLoop {
    fn holder(&self) -> u64 {
        self.keeper.lock().config().holder
    }

    /// Publishes the lease state if it changed.
    fn publish(&self) {
        let now = self.keeper.lock().state(self.clock.monotonic_ms());
        let holder = self.holder();
        self.tx.send_if_modified(|current| {
            let changed = *current != now;
            if changed {
                tracing::info!(holder, ?now, "lease state changed");
            }
            *current = now;
            changed
        });
    }

    async fn run(self) {
        self.release_earlier_grant().await;
        let holder = self.holder();
        let renew_every_ms = self.keeper.lock().config().renew_every_ms;
        let mut next_renew_ms = 0u64;
        loop {
            if self.clock.monotonic_ms() >= next_renew_ms {
                next_renew_ms = match self.group.waited_lease() {
                    Ok(()) => self.renew().await.saturating_add(renew_every_ms),
                    Err(inactive) => {
                        // No fallback: the request before it (`AcquireLease`)
                        // is the wall-clock rule ADR 0122 retired. The lease
                        // runs out and the work pauses until the feature is
                        // active again (ADR 0134).
                        tracing::warn!(holder, %inactive, "lease not renewed: its request is gated");
                        self.clock.monotonic_ms().saturating_add(renew_every_ms)
                    }
                };
            }
            self.publish();
            tokio::time::sleep(self.tick).await;
        }
    }

    /// A grant the group still records for this holder belongs to an
    /// earlier keeper (a stopped coordinator, or this broker before a
    /// restart), whose release may still be on its way: released first,
    /// this keeper's own grant gets a new epoch, and that release, naming
    /// the old one, changes nothing (F11). With the release naming its
    /// generation, a late release is ignored anyway, also when the grant
    /// was not applied here yet.
    async fn release_earlier_grant(&self) {
        let holder = self.holder();
        let Some(lease) = self.group.recorded_grant_of(holder) else {
            return;
        };
        tracing::info!(
            holder,
            epoch = lease.epoch,
            "releasing an earlier keeper's grant before acquiring"
        );
        let named = self.group.release_generation();
        let release = release_command(named, holder, lease.epoch, lease.generation);
        let _ = self.group.propose(release).await;
    }

    /// Proposes one grant or renewal and records the answer; returns the
    /// monotonic time read before it was proposed.
    async fn renew(&self) -> u64 {
        let (cmd, sent_ms) = self.keeper.lock().request(self.clock.as_ref());
        let proposal = self.group.propose(cmd);
        tokio::pin!(proposal);
        let answer = loop {
            tokio::select! {
                answer = &mut proposal => break answer,
                _ = tokio::time::sleep(self.tick) => self.publish(),
            }
        };
        match &answer {
            Ok(verdict) => {
                let received_ms = self.clock.monotonic_ms();
                self.keeper.lock().on_answer(verdict, sent_ms, received_ms)
            }
            Err(reason) => {
                tracing::debug!(holder = self.holder(), %reason, "lease renewal did not reach the group")
            }
        }
        sent_ms
    }
}
