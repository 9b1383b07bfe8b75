//! The host's long-lived loops and one-shots, which its owner runs and
//! restarts.
//!
//! The liveness prober, the ring sync, the quiescer, the rebalancer and
//! the one-shot ring changes (admission, attributes) are `HostLoop`s:
//! plain futures (`VnodeHost::run_loop`). With
//! `VnodeHostConfig::owner_runs_loops` the host starts none of them: its
//! owner (the broker's `vnodes` actor) runs each as a watched task, is
//! told when one ends and restarts it within a budget, or fails to its
//! supervisor. A loop ends only by a panic (or its host's stop); a
//! one-shot also ends when its work is done, and is then not restarted
//! (`HostLoop::is_one_shot`). Without an owner (tests that open a host
//! alone) `open` spawns them itself, unwatched, as before.
//!
//! The prober's state (`group::liveness::Prober`: what it learned and the
//! watch of the up set) is the host's, not the task's: a restarted prober
//! feeds the same watch, so the quiescer and the rebalancer, and whoever
//! else follows the up set, keep following it.
//!
//! `LoopSignals` ends every loop when the host stops (as the abort of an
//! unwatched loop did), and lets a test make a loop's next pass panic
//! (`VnodeHost::fail_loop`, `testing` feature), as a bug in it would.

use super::VnodeHost;
use crate::group::liveness::Prober;
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;

/// The host's liveness prober, if `config` asks for probing; its settings
/// are checked first, so a host never starts with a prober that cannot
/// judge liveness.
pub(super) fn new_prober(
    config: &super::VnodeHostConfig,
    transport: &Arc<crate::group::TcpTransport>,
) -> Result<Option<Arc<Prober>>, crate::group::GroupError> {
    let Some(settings) = config.liveness else {
        return Ok(None);
    };
    settings
        .validate()
        .map_err(|e| crate::group::GroupError::config(super::ConfigProblem::Liveness(e)))?;
    Ok(Some(Arc::new(Prober::new(
        Arc::clone(transport),
        config.node_id,
        settings,
        Arc::new(crate::clock::SystemClock::new()),
    ))))
}

/// One of the host's long-lived loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostLoop {
    /// Fetches the current ring after the host opens, then parks.
    RingSync,
    /// Quiets idle groups and paces campaigns (ADR 0101); only where peers
    /// are probed for liveness.
    Quiescer,
    /// Moves replicas where the members say they belong (ADR 0104).
    Rebalancer,
    /// Probes the peers and publishes which are up (ADR 0101); only where
    /// liveness is configured.
    Prober,
    /// One-shot: asks the ring's group to admit this broker (a broker that
    /// joined a running cluster, ADR 0104).
    Admission,
    /// One-shot: commits this broker's attributes to the ring (ADR 0121).
    Attributes,
}

impl HostLoop {
    /// Every loop, in start order: the prober before the loops that
    /// follow its up set.
    pub const ALL: [HostLoop; 6] = [
        HostLoop::Prober,
        HostLoop::RingSync,
        HostLoop::Quiescer,
        HostLoop::Rebalancer,
        HostLoop::Admission,
        HostLoop::Attributes,
    ];

    /// The loop's name, as logs, metrics and watched tasks give it.
    pub fn name(self) -> &'static str {
        match self {
            HostLoop::RingSync => "ring_sync",
            HostLoop::Quiescer => "quiescer",
            HostLoop::Rebalancer => "rebalancer",
            HostLoop::Prober => "prober",
            HostLoop::Admission => "admission",
            HostLoop::Attributes => "attributes",
        }
    }

    /// Whether it ends once its work is done: such an end is not restarted
    /// (a panic is).
    pub fn is_one_shot(self) -> bool {
        matches!(self, HostLoop::Admission | HostLoop::Attributes)
    }

    /// The loop named `name`, if one is.
    pub fn named(name: &str) -> Option<HostLoop> {
        HostLoop::ALL.into_iter().find(|l| l.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// What the host tells its loops from outside: that it stopped, and
/// which loops a test armed to panic at their next pass (none, and one
/// atomic load a pass, unless a test arms one).
#[derive(Debug, Default)]
pub(super) struct LoopSignals {
    armed: AtomicU8,
    stopped: AtomicBool,
    /// Wakes the loops waiting on either.
    changed: Notify,
}

impl LoopSignals {
    /// Resolves once `check` holds, re-checked whenever a signal changes.
    async fn until(&self, check: impl Fn(&LoopSignals) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if check(self) {
                return;
            }
            notified.await;
        }
    }

    /// Resolves once `which` is armed (left armed, for `trip`): where a
    /// loop that has done its work (the ring sync) parks.
    pub(super) async fn armed(self: Arc<Self>, which: HostLoop) {
        self.until(|s| s.armed.load(Ordering::Acquire) & which.bit() != 0)
            .await;
    }

    /// Resolves once the host stopped.
    async fn stopped(self: Arc<Self>) {
        self.until(|s| s.stopped.load(Ordering::Acquire)).await;
    }

    /// Ends every loop: the host stopped.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }
}

impl VnodeHost {
    /// The loops this host needs: the prober and the quiescer only where
    /// peers are probed, the admission only for a broker that joined.
    pub fn loops(&self) -> Vec<HostLoop> {
        let probed = self.prober.is_some();
        HostLoop::ALL
            .into_iter()
            .filter(|l| match l {
                HostLoop::Prober | HostLoop::Quiescer => probed,
                HostLoop::Admission => self.config.joined,
                _ => true,
            })
            .collect()
    }

    /// `which`, to be run by the host's owner: it returns when the host
    /// stops (dropped there, mid-pass, as an abort would) or goes, when a
    /// one-shot's work is done, and otherwise only by a panic. Run at most
    /// one of each at a time.
    pub fn run_loop(self: &Arc<Self>, which: HostLoop) -> BoxFuture<'static, ()> {
        let stopped = Arc::clone(&self.signals).stopped();
        let work = self.loop_work(which);
        Box::pin(async move {
            tokio::select! {
                () = work => {}
                () = stopped => {}
            }
        })
    }

    fn loop_work(self: &Arc<Self>, which: HostLoop) -> BoxFuture<'static, ()> {
        let host = Arc::downgrade(self);
        // Quiet followers judge their leader by the nodes that may lead: a
        // broker whose full volume stopped its replicas is up but cannot.
        let leadable = self.prober.as_ref().map(|p| p.subscribe_leadable());
        let up = self.prober.as_ref().map(|p| p.subscribe());
        match which {
            HostLoop::RingSync => Box::pin(VnodeHost::run_ring_sync(host)),
            HostLoop::Quiescer => match leadable {
                Some(leadable) => Box::pin(super::quiet::run_quiescer(
                    host,
                    leadable,
                    self.config.quiet_check_ms.max(1),
                    self.config.balance_leaders,
                )),
                // Never asked for: `loops` names no quiescer here.
                None => Box::pin(std::future::ready(())),
            },
            HostLoop::Rebalancer => Box::pin(super::rebalance::run_rebalancer(
                host,
                up,
                self.config.rebalance_check_ms.max(1),
                self.config.replace_after_ms,
            )),
            HostLoop::Prober => match self.prober.clone() {
                Some(prober) => Box::pin(run_prober(host, prober)),
                None => Box::pin(std::future::ready(())),
            },
            HostLoop::Admission => Box::pin(super::ring_group::run_ring_change(
                host,
                Some(which),
                "admission",
                VnodeHost::admission,
            )),
            HostLoop::Attributes => Box::pin(super::ring_group::run_ring_change(
                host,
                Some(which),
                "attributes",
                VnodeHost::attributes_change,
            )),
        }
    }

    /// Spawns every loop, unwatched, for a host nobody owns
    /// (`owner_runs_loops` off); aborted at shutdown.
    pub(super) fn spawn_loops(self: &Arc<Self>) {
        let tasks: Vec<_> = self
            .loops()
            .into_iter()
            .map(|which| tokio::spawn(self.run_loop(which)))
            .collect();
        self.background.lock().extend(tasks);
    }

    /// Test hook: the next pass of `which` panics, as a bug in it would.
    #[cfg(any(test, feature = "testing"))]
    pub fn fail_loop(&self, which: HostLoop) {
        self.signals.armed.fetch_or(which.bit(), Ordering::AcqRel);
        self.signals.changed.notify_waiters();
    }

    /// Panics, once, if a test armed `which` (`fail_loop`).
    pub(super) fn trip(&self, which: HostLoop) {
        let was = self.signals.armed.fetch_and(!which.bit(), Ordering::AcqRel);
        if was & which.bit() != 0 {
            panic!("{}: a fault armed by a test", which.name());
        }
    }
}

/// Runs `prober`'s rounds for `host` until the host goes; each round first
/// trips a fault a test armed.
async fn run_prober(host: Weak<VnodeHost>, prober: Arc<Prober>) {
    let mut rounds = prober.rounds();
    loop {
        rounds.tick().await;
        match host.upgrade() {
            Some(host) => host.trip(HostLoop::Prober),
            None => return,
        }
        prober.probe_round().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loop_is_found_by_its_name_and_has_a_bit_of_its_own() {
        let mut bits = 0u8;
        for which in HostLoop::ALL {
            assert_eq!(HostLoop::named(which.name()), Some(which));
            assert_eq!(bits & which.bit(), 0, "{which:?} shares a bit");
            bits |= which.bit();
        }
        assert_eq!(HostLoop::named("scrubber"), None);
    }

    #[tokio::test]
    async fn an_armed_loop_and_a_stop_wake_the_loops_waiting_on_them() {
        let signals = Arc::new(LoopSignals::default());
        let armed = tokio::spawn(Arc::clone(&signals).armed(HostLoop::RingSync));
        let stopped = tokio::spawn(Arc::clone(&signals).stopped());
        signals
            .armed
            .fetch_or(HostLoop::Quiescer.bit(), Ordering::AcqRel);
        signals.changed.notify_waiters();
        signals
            .armed
            .fetch_or(HostLoop::RingSync.bit(), Ordering::AcqRel);
        signals.changed.notify_waiters();
        armed.await.unwrap();
        assert!(!stopped.is_finished());
        signals.stop();
        stopped.await.unwrap();
    }
}
