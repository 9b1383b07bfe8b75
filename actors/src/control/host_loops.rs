//! The vnode host's long-lived work, as the `vnodes` actor keeps it
//! running (ADR 0135).
//!
//! The host's loops (`HostLoop`: the liveness prober, ring sync, quiescer,
//! rebalancer) and one-shots (admission, attributes) run as tasks the
//! actor watches (`common::watched`): when one ends, by a return or a
//! panic, the actor is told and starts it again, each at most
//! `LOOP_RESTARTS_MAX` times within `LOOP_RESTARTS_PERIOD_MS`; past that
//! the actor fails, and its supervisor restarts it, host and all. A
//! one-shot that returned did its work: it is not started again.
//!
//! A replica whose raft stopped fatally (a storage error, a panic in its
//! core) is found every `FATAL_CHECK_MS` and reopened from its files
//! (`VnodeHost::reopen_fatal`), at most `GROUP_REOPENS_MAX` times within
//! `GROUP_REOPENS_PERIOD_MS`; a reopen that fails, or one too many, fails
//! the actor. A replica a full volume stopped is not fatal here: the space
//! worker reopens it once the volume has room (ADR 0111).
//!
//! Generic over the actor's message, so this file names no actor.

use std::collections::BTreeMap;
use std::sync::Arc;

use malachi_cluster::group::GroupError;
use malachi_cluster::vnodes::{HostLoop, VnodeHost};
use malachi_supervision::{Intensity, RestartWindow};
use ractor::{ActorRef, Message};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::common::metrics::BrokerMetrics;
use crate::common::watched::{TaskEnded, Watched, spawn_watched};

/// How many times one of the host's loops may be restarted within
/// `LOOP_RESTARTS_PERIOD_MS` before the actor fails instead.
pub(crate) const LOOP_RESTARTS_MAX: u32 = 5;
/// The window `LOOP_RESTARTS_MAX` counts restarts in.
pub(crate) const LOOP_RESTARTS_PERIOD_MS: u64 = 60_000;
/// How many fatally stopped replicas may be reopened within
/// `GROUP_REOPENS_PERIOD_MS` before the actor fails instead.
pub(crate) const GROUP_REOPENS_MAX: u32 = 8;
/// The window `GROUP_REOPENS_MAX` counts reopens in.
pub(crate) const GROUP_REOPENS_PERIOD_MS: u64 = 60_000;
/// How often the hosted replicas are checked for a fatal stop.
pub(crate) const FATAL_CHECK_MS: u64 = 200;

/// Why the host's work cannot go on here: the actor fails with it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostWorkError {
    /// A watched task that is no host loop ended.
    #[error(transparent)]
    Ended(TaskEnded),
    /// A loop ended with the host stopped underneath it.
    #[error("the {task} loop ended because the vnode host stopped")]
    HostStopped { task: &'static str },
    /// A loop ended too often.
    #[error(
        "a vnode host loop ended more than {LOOP_RESTARTS_MAX} times within {LOOP_RESTARTS_PERIOD_MS} ms; last: {last}"
    )]
    LoopRestartsExceeded { last: TaskEnded },
    /// Replicas stopped fatally too often.
    #[error(
        "more than {GROUP_REOPENS_MAX} raft replicas stopped fatally within {GROUP_REOPENS_PERIOD_MS} ms; last: group {group}: {error}"
    )]
    GroupReopensExceeded { group: u64, error: GroupError },
    /// A fatally stopped replica could not be reopened.
    #[error("group {group} stopped fatally and cannot be reopened: {source}")]
    Reopen {
        group: u64,
        #[source]
        source: GroupError,
    },
}

/// The host's loops, running, and the budgets of their restarts.
pub(crate) struct HostWork<M: Message> {
    host: Arc<VnodeHost>,
    myself: ActorRef<M>,
    ended: fn(TaskEnded) -> M,
    metrics: Arc<BrokerMetrics>,
    /// Each loop's task; aborted when dropped, with the actor's state.
    loops: BTreeMap<HostLoop, Watched>,
    /// Each loop's recent restarts.
    loop_restarts: BTreeMap<HostLoop, RestartWindow>,
    group_reopens: RestartWindow,
}

impl<M: Message> HostWork<M> {
    /// Starts every loop `host` needs, each watched by `myself`, which is
    /// told of its end by `ended` (and passes it to `loop_ended`).
    pub(crate) fn start(
        host: Arc<VnodeHost>,
        myself: ActorRef<M>,
        ended: fn(TaskEnded) -> M,
        metrics: Arc<BrokerMetrics>,
    ) -> HostWork<M> {
        let mut work = HostWork {
            host,
            myself,
            ended,
            metrics,
            loops: BTreeMap::new(),
            loop_restarts: BTreeMap::new(),
            group_reopens: RestartWindow::new(Intensity {
                restarts_max: GROUP_REOPENS_MAX,
                period_ms: GROUP_REOPENS_PERIOD_MS,
            }),
        };
        for which in work.host.loops() {
            work.run(which);
        }
        work
    }

    fn run(&mut self, which: HostLoop) {
        let task = spawn_watched(
            self.myself.clone(),
            which.name(),
            self.host.run_loop(which),
            self.ended,
        );
        // Replacing a finished loop's handle; a running one is never
        // replaced, so no loop runs twice.
        self.loops.insert(which, task);
    }

    /// A watched task ended: a host loop is started again within its
    /// budget; anything else is the actor's failure.
    pub(crate) fn loop_ended(&mut self, ended: TaskEnded) -> Result<(), HostWorkError> {
        let Some(which) = HostLoop::named(ended.task) else {
            return Err(HostWorkError::Ended(ended));
        };
        if self.host.is_stopped() {
            return Err(HostWorkError::HostStopped { task: ended.task });
        }
        if which.is_one_shot() && ended.returned() {
            info!(task = ended.task, "a vnode host one-shot is done");
            self.loops.remove(&which);
            return Ok(());
        }
        let restarts = self.loop_restarts.entry(which).or_insert_with(|| {
            RestartWindow::new(Intensity {
                restarts_max: LOOP_RESTARTS_MAX,
                period_ms: LOOP_RESTARTS_PERIOD_MS,
            })
        });
        if restarts.record(Instant::now()) {
            return Err(HostWorkError::LoopRestartsExceeded { last: ended });
        }
        warn!(task = ended.task, how = %ended.how, restarts = restarts.len(), "a vnode host loop ended; restarting it");
        self.metrics.count_vnode_work_restart(which.name());
        self.run(which);
        Ok(())
    }

    /// Reopens every hosted replica whose raft stopped fatally, within the
    /// budget.
    pub(crate) async fn check_groups(&mut self) -> Result<(), HostWorkError> {
        for (group, error) in self.host.fatal_groups() {
            if self.group_reopens.record(Instant::now()) {
                return Err(HostWorkError::GroupReopensExceeded { group, error });
            }
            match self.host.reopen_fatal(group).await {
                Ok(true) => {
                    info!(group, error = %error, "a fatally stopped raft replica was reopened");
                    self.metrics.count_vnode_work_restart("raft_group");
                }
                Ok(false) => {}
                Err(source) => return Err(HostWorkError::Reopen { group, source }),
            }
        }
        Ok(())
    }
}
