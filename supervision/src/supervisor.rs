//! The supervisor actor and its typed handle.
//!
//! ractor links a child to its parent and delivers `SupervisionEvent`s; it has
//! no restart policy. This module adds one. The supervisor keeps its own child
//! table (name, spec, current instance, restart bookkeeping) in start order and
//! reacts to three inputs:
//!
//! - a supervision event for a child it knows (by actor id): decide from the
//!   child's restart type whether to restart, charge the restart to the
//!   intensity window, stop the siblings the strategy names (reverse start
//!   order), and schedule the group's restart after the child's backoff;
//! - a `RestartDue` timer message: start, in start order, every child whose
//!   backoff has elapsed; a failed start (ractor reports a failing `pre_start`
//!   as a spawn error, not as an event) goes through the same path as a crash;
//! - a request from a [`SupervisorRef`]: start or terminate a dynamic child,
//!   look a child up, or take a snapshot.
//!
//! Events about actor ids that are no longer in the table are stale (a sibling
//! the supervisor stopped itself for a group restart, a child it terminated on
//! request) and are ignored; that is how "stopping for restart" children are
//! kept from counting as new failures.

use std::collections::HashSet;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::rpc::CallResult;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RactorErr, RpcReplyPort,
    SupervisionEvent,
};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::error::SupervisionError;
use crate::intensity::RestartWindow;
use crate::snapshot::{ChildSnapshot, ChildStatus, SupervisorSnapshot};
use crate::spec::{
    Backoff, ChildKind, ChildSpec, Intensity, Restart, SNAPSHOT_TIMEOUT_MS_DEFAULT, Strategy,
    SupervisorArgs,
};

/// The stop reason a supervisor gives the children it stops. ractor reports it
/// back as a normal `ActorTerminated`.
pub const SHUTDOWN_REASON: &str = "shutdown";

/// The exit reason ractor gives an actor that was killed (signal or task
/// cancellation); the supervisor treats it as abnormal, as OTP treats `kill`.
const KILLED_REASONS: [&str; 2] = ["killed", "actor_task_cancelled"];

/// How long the supervisor waits for a killed child to finish dying.
const KILL_WAIT_MS: u64 = 1_000;

/// Default bound on a [`SupervisorRef`] request (start_child may run a child's
/// whole `pre_start`, so it is generous).
pub const CALL_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The OTP-style supervisor. The struct is empty: all state is built in
/// `pre_start` from [`SupervisorArgs`], so a restarted supervisor starts clean.
#[derive(Debug, Clone, Copy, Default)]
pub struct Supervisor;

/// A message to a [`Supervisor`]. Built only through [`SupervisorRef`], so the
/// internal timer message cannot be forged by callers.
pub struct SupervisorMsg(pub(crate) Request);

impl fmt::Debug for SupervisorMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match &self.0 {
            Request::StartChild(spec, _) => return write!(f, "StartChild({})", spec.name),
            Request::TerminateChild(name, _) => return write!(f, "TerminateChild({name})"),
            Request::LookupChild(name, _) => return write!(f, "LookupChild({name})"),
            Request::Snapshot { .. } => "Snapshot",
            Request::RestartDue => "RestartDue",
        };
        f.write_str(name)
    }
}

// The `cluster` feature removes ractor's blanket impl; supervisor messages are
// local only (a ChildSpec holds a closure), so the default non-serializable
// impl is the right one.
impl ractor::Message for SupervisorMsg {}

pub(crate) enum Request {
    StartChild(ChildSpec, RpcReplyPort<Result<ActorCell, SupervisionError>>),
    TerminateChild(String, RpcReplyPort<Result<(), SupervisionError>>),
    LookupChild(String, RpcReplyPort<Option<ActorCell>>),
    Snapshot {
        timeout_ms: u64,
        reply: RpcReplyPort<SupervisorSnapshot>,
    },
    RestartDue,
}

/// What the current instance of a child is doing.
#[derive(Debug)]
enum Run {
    Running { cell: ActorCell, since: Instant },
    Restarting { due: Instant },
    Stopped,
}

#[derive(Debug)]
struct Child {
    spec: ChildSpec,
    /// Started through `start_child` rather than listed in the args. Dynamic
    /// children are forgotten once they end for good, so connections and
    /// segments that come and go do not accumulate in the table.
    dynamic: bool,
    run: Run,
    restarts: u32,
    /// Failures since the child last stayed up for `backoff.reset_after_ms`.
    consecutive_failures: u32,
    last_exit_reason: Option<String>,
}

impl Child {
    fn new(spec: ChildSpec, dynamic: bool, run: Run) -> Self {
        Self {
            spec,
            dynamic,
            run,
            restarts: 0,
            consecutive_failures: 0,
            last_exit_reason: None,
        }
    }

    fn cell(&self) -> Option<&ActorCell> {
        match &self.run {
            Run::Running { cell, .. } => Some(cell),
            _ => None,
        }
    }
}

/// The supervisor's state: its policy and its child table in start order.
#[derive(Debug)]
pub struct SupervisorState {
    name: String,
    strategy: Strategy,
    intensity: Intensity,
    backoff: Backoff,
    window: RestartWindow,
    children: Vec<Child>,
    started_at: Instant,
}

#[ractor::async_trait]
impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.validate()?;
        let now = Instant::now();
        let mut state = SupervisorState {
            name: args.name,
            strategy: args.strategy,
            intensity: args.intensity,
            backoff: args.backoff,
            window: RestartWindow::new(args.intensity),
            children: args
                .children
                .into_iter()
                .map(|spec| Child::new(spec, false, Run::Restarting { due: now }))
                .collect(),
            started_at: now,
        };
        // Initial start is the restart path with every child due now: a child
        // whose pre_start fails is retried with backoff under the intensity
        // rules, and only an exceeded intensity fails this supervisor's start.
        state.start_due_children(&myself).await?;
        info!(supervisor = %state.name, strategy = %state.strategy, children = state.children.len(), "supervisor started");
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.stop_all_children().await;
        info!(supervisor = %state.name, "supervisor stopped");
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message.0 {
            Request::StartChild(spec, reply) => {
                let result = state.start_dynamic(&myself, spec).await;
                let _ = reply.send(result);
            }
            Request::TerminateChild(name, reply) => {
                let result = state.terminate(&name).await;
                let _ = reply.send(result);
            }
            Request::LookupChild(name, reply) => {
                let cell = state
                    .children
                    .iter()
                    .find(|c| c.spec.name == name)
                    .and_then(|c| c.cell().cloned());
                let _ = reply.send(cell);
            }
            Request::Snapshot { timeout_ms, reply } => state.snapshot(&myself, timeout_ms, reply),
            Request::RestartDue => state.start_due_children(&myself).await?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorStarted(cell) => {
                debug!(supervisor = %state.name, actor_id = %cell.get_id(), "child running");
            }
            SupervisionEvent::ActorTerminated(cell, _state, reason) => {
                let abnormal = reason
                    .as_deref()
                    .is_some_and(|r| KILLED_REASONS.contains(&r));
                let reason = reason.unwrap_or_else(|| "normal".to_string());
                state
                    .on_child_exit(&myself, cell.get_id(), reason, abnormal)
                    .await?;
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                state
                    .on_child_exit(&myself, cell.get_id(), err.to_string(), true)
                    .await?;
            }
            // Process groups and remote pid lifecycles are not supervision
            // in our sense; actors that subscribe to them handle them.
            _ => {}
        }
        Ok(())
    }
}

impl SupervisorState {
    fn index_of_running(&self, id: ActorId) -> Option<usize> {
        self.children
            .iter()
            .position(|c| c.cell().is_some_and(|cell| cell.get_id() == id))
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.children.iter().position(|c| c.spec.name == name)
    }

    async fn on_child_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        id: ActorId,
        reason: String,
        abnormal: bool,
    ) -> Result<(), SupervisionError> {
        let Some(idx) = self.index_of_running(id) else {
            debug!(supervisor = %self.name, actor_id = %id, "ignoring exit of an actor no longer supervised");
            return Ok(());
        };
        let child = &mut self.children[idx];
        let ran_for = match &child.run {
            Run::Running { since, .. } => since.elapsed(),
            _ => Duration::ZERO,
        };
        let name = child.spec.name.clone();
        child.last_exit_reason = Some(reason.clone());
        if !child.spec.restart.should_restart(abnormal) {
            info!(supervisor = %self.name, child = %name, reason = %reason, restart = child.spec.restart.as_str(), "child exited, not restarting");
            if child.dynamic || child.spec.restart == Restart::Temporary {
                self.children.remove(idx);
            } else {
                child.run = Run::Stopped;
            }
            return Ok(());
        }
        warn!(supervisor = %self.name, child = %name, reason = %reason, abnormal, "child exited, restarting");
        self.schedule_restart(myself, idx, Some(ran_for)).await?;
        Ok(())
    }

    /// Charge a restart of child `idx` to the intensity window, stop the
    /// siblings its strategy restarts with it, and schedule them all after
    /// the child's backoff. Returns the names of the group now waiting for
    /// restart, or the escalation error (after stopping every child).
    async fn schedule_restart(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        idx: usize,
        ran_for: Option<Duration>,
    ) -> Result<Vec<String>, SupervisionError> {
        let now = Instant::now();
        if self.window.record(now) {
            error!(supervisor = %self.name, child = %self.children[idx].spec.name, restarts_max = self.intensity.restarts_max, period_ms = self.intensity.period_ms, "restart intensity exceeded, escalating");
            self.stop_all_children().await;
            return Err(SupervisionError::IntensityExceeded {
                name: self.name.clone(),
                restarts_max: self.intensity.restarts_max,
                period_ms: self.intensity.period_ms,
            });
        }

        let reset_after = Duration::from_millis(self.backoff.reset_after_ms);
        let failed = &mut self.children[idx];
        if ran_for.is_some_and(|d| d >= reset_after) {
            failed.consecutive_failures = 0;
        }
        let delay = self.backoff.delay(failed.consecutive_failures);
        failed.consecutive_failures = failed.consecutive_failures.saturating_add(1);
        let failed_name = failed.spec.name.clone();
        let due = now + delay;

        let group = self.strategy.restart_group(idx, self.children.len());
        let mut scheduled = Vec::with_capacity(group.len());
        // Siblings go down in reverse start order, so a child never outlives
        // the children it was started after (and may depend on).
        for j in group.clone().rev() {
            if j == idx {
                continue;
            }
            let sibling = &mut self.children[j];
            if let Run::Running { cell, .. } = &sibling.run {
                let cell = cell.clone();
                let timeout_ms = sibling.spec.shutdown_timeout_ms;
                sibling.last_exit_reason =
                    Some(format!("{SHUTDOWN_REASON} (restart of {failed_name})"));
                debug!(supervisor = %self.name, child = %sibling.spec.name, failed = %failed_name, "stopping sibling for restart");
                stop_child(&cell, timeout_ms, &sibling.spec.name).await;
                if sibling.spec.restart == Restart::Temporary {
                    // Temporary children are never restarted; they leave the
                    // table (below) rather than wait for a restart.
                    sibling.run = Run::Stopped;
                } else {
                    sibling.run = Run::Restarting { due };
                    sibling.restarts = sibling.restarts.saturating_add(1);
                    scheduled.push(sibling.spec.name.clone());
                }
            } else if matches!(sibling.run, Run::Restarting { .. }) {
                // Already waiting: align it with the group so start order holds.
                sibling.run = Run::Restarting { due };
                scheduled.push(sibling.spec.name.clone());
            }
        }
        let failed = &mut self.children[idx];
        failed.run = Run::Restarting { due };
        failed.restarts = failed.restarts.saturating_add(1);
        scheduled.push(failed_name.clone());
        self.children
            .retain(|c| !(c.spec.restart == Restart::Temporary && matches!(c.run, Run::Stopped)));

        info!(supervisor = %self.name, child = %failed_name, delay_ms = delay.as_millis() as u64, strategy = %self.strategy, "restart scheduled");
        let _timer = myself.send_after(delay, || SupervisorMsg(Request::RestartDue));
        Ok(scheduled)
    }

    /// Start, in start order, every child whose restart is due. A child whose
    /// start fails is rescheduled (with its group) and skipped for the rest of
    /// this pass, so one pass never retries without backoff.
    async fn start_due_children(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
    ) -> Result<(), SupervisionError> {
        let now = Instant::now();
        let mut deferred: HashSet<String> = HashSet::new();
        let mut i = 0;
        while i < self.children.len() {
            let child = &self.children[i];
            let is_due = matches!(child.run, Run::Restarting { due } if due <= now)
                && !deferred.contains(&child.spec.name);
            if !is_due {
                i += 1;
                continue;
            }
            let spec = child.spec.clone();
            match start_instance(myself, &spec).await {
                Ok(cell) => {
                    debug!(supervisor = %self.name, child = %spec.name, actor_id = %cell.get_id(), "child started");
                    self.children[i].run = Run::Running {
                        cell,
                        since: Instant::now(),
                    };
                    i += 1;
                }
                Err(reason) => {
                    warn!(supervisor = %self.name, child = %spec.name, reason = %reason, "child failed to start");
                    self.children[i].last_exit_reason = Some(reason);
                    if spec.restart == Restart::Temporary {
                        self.children.remove(i);
                        continue;
                    }
                    let scheduled = self.schedule_restart(myself, i, None).await?;
                    deferred.extend(scheduled);
                    // The restart may have removed temporary siblings and
                    // shifted positions: rescan; deferred children are skipped.
                    i = 0;
                }
            }
        }
        Ok(())
    }

    async fn start_dynamic(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        spec: ChildSpec,
    ) -> Result<ActorCell, SupervisionError> {
        spec.validate()?;
        if self.index_of(&spec.name).is_some() {
            return Err(SupervisionError::DuplicateChild { name: spec.name });
        }
        match start_instance(myself, &spec).await {
            Ok(cell) => {
                info!(supervisor = %self.name, child = %spec.name, actor_id = %cell.get_id(), "dynamic child started");
                let run = Run::Running {
                    cell: cell.clone(),
                    since: Instant::now(),
                };
                self.children.push(Child::new(spec, true, run));
                Ok(cell)
            }
            Err(reason) => Err(SupervisionError::StartFailed {
                name: spec.name,
                reason,
            }),
        }
    }

    async fn terminate(&mut self, name: &str) -> Result<(), SupervisionError> {
        let Some(idx) = self.index_of(name) else {
            return Err(SupervisionError::NoSuchChild {
                name: name.to_string(),
            });
        };
        // Remove first: the exit event that follows refers to an id no longer
        // in the table and is ignored, so a terminated child is not restarted.
        let child = self.children.remove(idx);
        if let Some(cell) = child.cell() {
            stop_child(cell, child.spec.shutdown_timeout_ms, name).await;
        }
        info!(supervisor = %self.name, child = %name, "child terminated");
        Ok(())
    }

    /// Stop every running child in reverse start order, each within its
    /// shutdown timeout, killing those that overrun it.
    async fn stop_all_children(&mut self) {
        for child in self.children.iter_mut().rev() {
            if let Run::Running { cell, .. } = &child.run {
                let cell = cell.clone();
                stop_child(&cell, child.spec.shutdown_timeout_ms, &child.spec.name).await;
                child.last_exit_reason = Some(SHUTDOWN_REASON.to_string());
            }
            child.run = Run::Stopped;
        }
    }

    /// Answer a snapshot without blocking the supervisor: the table is copied
    /// now, and nested supervisors are asked concurrently from a task, each
    /// within a bound. One that does not answer shows as unresponsive.
    fn snapshot(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        timeout_ms: u64,
        reply: RpcReplyPort<SupervisorSnapshot>,
    ) {
        let now = Instant::now();
        let mut children = Vec::with_capacity(self.children.len());
        let mut nested: Vec<(usize, ActorRef<SupervisorMsg>)> = Vec::new();
        for (i, child) in self.children.iter().enumerate() {
            let (status, actor_id, uptime_ms) = match &child.run {
                Run::Running { cell, since } => {
                    if child.spec.kind == ChildKind::Supervisor {
                        nested.push((i, ActorRef::from(cell.clone())));
                    }
                    (
                        ChildStatus::Running,
                        Some(cell.get_id().to_string()),
                        millis(now.saturating_duration_since(*since)),
                    )
                }
                Run::Restarting { .. } => (ChildStatus::Restarting, None, 0),
                Run::Stopped => (ChildStatus::Stopped, None, 0),
            };
            children.push(ChildSnapshot {
                name: child.spec.name.clone(),
                actor_id,
                kind: child.spec.kind,
                restart: child.spec.restart,
                status,
                restarts: child.restarts,
                last_exit_reason: child.last_exit_reason.clone(),
                uptime_ms,
                supervisor: None,
            });
        }
        let mut snapshot = SupervisorSnapshot {
            name: self.name.clone(),
            actor_id: myself.get_id().to_string(),
            strategy: self.strategy,
            uptime_ms: millis(now.saturating_duration_since(self.started_at)),
            children,
        };
        if nested.is_empty() {
            let _ = reply.send(snapshot);
            return;
        }
        // Each level gives its children half of its own budget, so a slow
        // grandchild shows as unresponsive one level down instead of making
        // the whole child look unresponsive.
        let nested_timeout_ms = (timeout_ms / 2).max(1);
        tokio::spawn(async move {
            let mut asks = JoinSet::new();
            for (i, actor) in nested {
                asks.spawn(async move {
                    let answer = actor
                        .call(
                            |reply| {
                                SupervisorMsg(Request::Snapshot {
                                    timeout_ms: nested_timeout_ms,
                                    reply,
                                })
                            },
                            Some(Duration::from_millis(timeout_ms)),
                        )
                        .await;
                    (i, answer)
                });
            }
            while let Some(joined) = asks.join_next().await {
                let Ok((i, answer)) = joined else { continue };
                match answer {
                    Ok(CallResult::Success(nested)) => {
                        snapshot.children[i].supervisor = Some(nested)
                    }
                    _ => snapshot.children[i].status = ChildStatus::Unresponsive,
                }
            }
            let _ = reply.send(snapshot);
        });
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Run a child's factory, turning a spawn error, a panicking factory, or a
/// mis-declared kind into a start failure (never a supervisor crash).
async fn start_instance(
    myself: &ActorRef<SupervisorMsg>,
    spec: &ChildSpec,
) -> Result<ActorCell, String> {
    let start = spec.start.clone();
    let supervisor = myself.get_cell();
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| start(supervisor))) {
        Ok(future) => future,
        Err(_) => return Err("start failed: child factory panicked".to_string()),
    };
    // The factory's future runs on its own task so that a panic in it (user
    // code) surfaces as a JoinError here instead of unwinding the supervisor.
    let cell = match tokio::spawn(future).await {
        Ok(Ok(cell)) => cell,
        Ok(Err(err)) => return Err(format!("start failed: {err}")),
        Err(err) => return Err(format!("start failed: child factory task ended: {err}")),
    };
    if spec.kind == ChildKind::Supervisor
        && cell.is_message_type_of::<SupervisorMsg>() == Some(false)
    {
        stop_child(&cell, spec.shutdown_timeout_ms, &spec.name).await;
        return Err(
            "start failed: declared as a supervisor but does not accept supervisor messages"
                .to_string(),
        );
    }
    Ok(cell)
}

/// Stop one child gracefully within `timeout_ms`, then kill it. Returns once
/// the child is gone (or the kill wait itself timed out, which is logged).
async fn stop_child(cell: &ActorCell, timeout_ms: u64, name: &str) {
    let timeout = Duration::from_millis(timeout_ms);
    let kill_wait = Some(Duration::from_millis(KILL_WAIT_MS));
    match cell
        .stop_and_wait(Some(SHUTDOWN_REASON.to_string()), Some(timeout))
        .await
    {
        Ok(()) => {}
        Err(RactorErr::Timeout) => {
            warn!(child = %name, timeout_ms, "child did not stop in time, killing it");
            if cell.kill_and_wait(kill_wait).await.is_err() {
                error!(child = %name, "killed child did not finish dying in time");
            }
        }
        Err(_) => {
            // The stop channel is closed: the child is already on its way out.
            if cell.wait(Some(timeout)).await.is_err() {
                warn!(child = %name, timeout_ms, "exiting child did not finish in time, killing it");
                if cell.kill_and_wait(kill_wait).await.is_err() {
                    error!(child = %name, "killed child did not finish dying in time");
                }
            }
        }
    }
}

/// A typed handle on a running [`Supervisor`].
#[derive(Debug, Clone)]
pub struct SupervisorRef {
    actor: ActorRef<SupervisorMsg>,
    call_timeout_ms: u64,
}

impl SupervisorRef {
    /// Spawn a root supervisor (no parent). Its children are started before
    /// this returns.
    pub async fn spawn(args: SupervisorArgs) -> Result<(Self, JoinHandle<()>), SupervisionError> {
        let name = args.name.clone();
        let (actor, join) = Supervisor::spawn(None, Supervisor, args)
            .await
            .map_err(|err| SupervisionError::SpawnFailed {
                name,
                reason: err.to_string(),
            })?;
        Ok((Self::from_actor(actor), join))
    }

    /// Spawn a supervisor linked to `parent` (any actor), which will receive
    /// its supervision events, including the failure when it escalates.
    pub async fn spawn_linked(
        args: SupervisorArgs,
        parent: ActorCell,
    ) -> Result<(Self, JoinHandle<()>), SupervisionError> {
        let name = args.name.clone();
        let (actor, join) = Supervisor::spawn_linked(None, Supervisor, args, parent)
            .await
            .map_err(|err| SupervisionError::SpawnFailed {
                name,
                reason: err.to_string(),
            })?;
        Ok((Self::from_actor(actor), join))
    }

    /// Wrap an existing supervisor actor.
    pub fn from_actor(actor: ActorRef<SupervisorMsg>) -> Self {
        Self {
            actor,
            call_timeout_ms: CALL_TIMEOUT_MS_DEFAULT,
        }
    }

    /// Bound every request made through this handle.
    pub fn with_call_timeout_ms(mut self, call_timeout_ms: u64) -> Self {
        assert!(call_timeout_ms > 0, "a call timeout must be positive");
        self.call_timeout_ms = call_timeout_ms;
        self
    }

    /// The underlying actor.
    pub fn actor(&self) -> &ActorRef<SupervisorMsg> {
        &self.actor
    }

    /// The underlying cell (to link other actors to this supervisor).
    pub fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }

    async fn call<R, F>(&self, build: F) -> Result<R, SupervisionError>
    where
        R: Send + 'static,
        F: FnOnce(RpcReplyPort<R>) -> Request,
    {
        let timeout = Duration::from_millis(self.call_timeout_ms);
        match self
            .actor
            .call(|reply| SupervisorMsg(build(reply)), Some(timeout))
            .await
        {
            Ok(CallResult::Success(answer)) => Ok(answer),
            Ok(CallResult::Timeout) => Err(SupervisionError::Timeout {
                timeout_ms: self.call_timeout_ms,
            }),
            Ok(CallResult::SenderError) | Err(_) => Err(SupervisionError::NotRunning),
        }
    }

    /// Start a dynamic child now. A failing start is returned to the caller
    /// (and the child is not added); it does not count against the intensity.
    pub async fn start_child(&self, spec: ChildSpec) -> Result<ActorCell, SupervisionError> {
        self.call(|reply| Request::StartChild(spec, reply)).await?
    }

    /// Stop a child (within its shutdown timeout, then kill) and forget it.
    pub async fn terminate_child(&self, name: &str) -> Result<(), SupervisionError> {
        let name = name.to_string();
        self.call(|reply| Request::TerminateChild(name, reply))
            .await?
    }

    /// The running instance of a child, if any.
    pub async fn child(&self, name: &str) -> Result<Option<ActorCell>, SupervisionError> {
        let name = name.to_string();
        self.call(|reply| Request::LookupChild(name, reply)).await
    }

    /// A recursive snapshot of this supervisor's subtree.
    pub async fn snapshot(&self) -> Result<SupervisorSnapshot, SupervisionError> {
        let timeout_ms = SNAPSHOT_TIMEOUT_MS_DEFAULT.min(self.call_timeout_ms);
        self.call(|reply| Request::Snapshot { timeout_ms, reply })
            .await
    }

    /// Ordered shutdown: children stop in reverse start order, each within
    /// its timeout, then the supervisor exits. Waits at most `timeout_ms`.
    pub async fn stop(&self, timeout_ms: u64) -> Result<(), SupervisionError> {
        match self
            .actor
            .stop_and_wait(None, Some(Duration::from_millis(timeout_ms)))
            .await
        {
            Ok(()) => Ok(()),
            Err(RactorErr::Timeout) => Err(SupervisionError::Timeout { timeout_ms }),
            Err(_) => Err(SupervisionError::NotRunning),
        }
    }
}
