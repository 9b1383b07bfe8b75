//! What a supervisor supervises: its strategy, its restart limits, and one
//! [`ChildSpec`] per child.
//!
//! Everything here is plain data except the child factory, which is a closure
//! so that every (re)start builds a fresh actor from fresh arguments. A
//! restarted child must never inherit state from its crashed predecessor: its
//! state is built again in `pre_start`, exactly like the first time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, SpawnErr};
use serde::{Deserialize, Serialize};

use crate::error::SupervisionError;

/// Which children a supervisor restarts when one of them exits and must be
/// restarted (OTP restart strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Restart only the child that exited. Use when children are independent.
    OneForOne,
    /// Stop every other child (reverse start order) and restart all of them
    /// (start order). Use when children only make sense together.
    OneForAll,
    /// Stop the children started after the one that exited (reverse start
    /// order) and restart it and them (start order). Use when later children
    /// depend on earlier ones.
    RestForOne,
}

impl Strategy {
    /// The snake_case name used in snapshots and in the rendered tree.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::OneForOne => "one_for_one",
            Strategy::OneForAll => "one_for_all",
            Strategy::RestForOne => "rest_for_one",
        }
    }

    /// The positions (in start order) that must be restarted when the child at
    /// `failed` must be restarted, among `count` children.
    pub fn restart_group(self, failed: usize, count: usize) -> std::ops::Range<usize> {
        assert!(failed < count, "failed child index out of range");
        match self {
            Strategy::OneForOne => failed..failed + 1,
            Strategy::OneForAll => 0..count,
            Strategy::RestForOne => failed..count,
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a child that exited is restarted (OTP restart types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    /// Always restarted, whatever the exit reason.
    Permanent,
    /// Restarted only after an abnormal exit (a failure, a panic, or a kill).
    Transient,
    /// Never restarted; removed from the supervisor when it exits.
    Temporary,
}

impl Restart {
    /// Whether a child with this restart type is restarted after an exit.
    pub fn should_restart(self, abnormal: bool) -> bool {
        match self {
            Restart::Permanent => true,
            Restart::Transient => abnormal,
            Restart::Temporary => false,
        }
    }

    /// The snake_case name used in snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Permanent => "permanent",
            Restart::Transient => "transient",
            Restart::Temporary => "temporary",
        }
    }
}

/// Whether a child is itself a supervisor (and so answers snapshots) or a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    /// A leaf actor doing work.
    Worker,
    /// A nested [`crate::Supervisor`].
    Supervisor,
}

impl ChildKind {
    /// The snake_case name used in snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            ChildKind::Worker => "worker",
            ChildKind::Supervisor => "supervisor",
        }
    }
}

/// Restart intensity: more than `restarts_max` restarts within `period_ms`
/// makes the supervisor stop all its children and fail to its own parent, so a
/// crash loop escalates up the tree instead of spinning in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intensity {
    /// How many restarts the window tolerates. Zero means the first restart
    /// already escalates.
    pub restarts_max: u32,
    /// The sliding window, in milliseconds.
    pub period_ms: u64,
}

impl Intensity {
    /// OTP's default: at most 3 restarts in 5 seconds.
    pub const DEFAULT: Intensity = Intensity {
        restarts_max: 3,
        period_ms: 5_000,
    };
}

impl Default for Intensity {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Restart backoff: the n-th consecutive restart of a child waits
/// `delay_initial_ms * multiplier^(n-1)`, capped at `delay_max_ms`. A child
/// that stayed up for `reset_after_ms` starts again from `delay_initial_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Delay before the first restart, in milliseconds (zero restarts at once).
    pub delay_initial_ms: u64,
    /// Upper bound of any restart delay, in milliseconds.
    pub delay_max_ms: u64,
    /// Growth factor between consecutive restarts (1 keeps the delay constant).
    pub multiplier: u32,
    /// Uptime after which a child's consecutive-failure count is forgotten.
    pub reset_after_ms: u64,
}

impl Backoff {
    /// 10 ms doubling up to 1 s, forgotten after 10 s of uptime.
    pub const DEFAULT: Backoff = Backoff {
        delay_initial_ms: 10,
        delay_max_ms: 1_000,
        multiplier: 2,
        reset_after_ms: 10_000,
    };

    /// No delay at all: restarts happen as soon as the supervisor handles the exit.
    pub const NONE: Backoff = Backoff {
        delay_initial_ms: 0,
        delay_max_ms: 0,
        multiplier: 1,
        reset_after_ms: 0,
    };

    /// The delay before restart number `consecutive + 1` of a child that has
    /// already failed `consecutive` times in a row. Never exceeds `delay_max_ms`.
    pub fn delay(&self, consecutive: u32) -> Duration {
        let mut delay_ms = self.delay_initial_ms;
        // The loop runs at most ~64 times: a delay that cannot grow (zero, or
        // a multiplier of one) stops it at once, and a growing one reaches the
        // cap (or saturates) within 64 doublings.
        if delay_ms > 0 && self.multiplier > 1 {
            for _ in 0..consecutive {
                if delay_ms >= self.delay_max_ms {
                    break;
                }
                delay_ms = delay_ms.saturating_mul(u64::from(self.multiplier));
            }
        }
        let delay_ms = delay_ms.min(self.delay_max_ms);
        debug_assert!(delay_ms <= self.delay_max_ms);
        Duration::from_millis(delay_ms)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The future a child factory returns: the started child's cell, or the spawn
/// error (which is how ractor reports a failing `pre_start`).
pub type StartFuture = Pin<Box<dyn Future<Output = Result<ActorCell, SpawnErr>> + Send>>;

/// A child factory. It receives the supervisor's cell and must spawn the child
/// *linked* to it (`spawn_linked`), unnamed in ractor's global registry.
pub type StartFn = Arc<dyn Fn(ActorCell) -> StartFuture + Send + Sync>;

/// Default time a worker gets to stop before it is killed.
pub const WORKER_SHUTDOWN_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Default time a nested supervisor gets to stop its own subtree before it is killed.
pub const SUPERVISOR_SHUTDOWN_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// How to start one child, and how to treat it when it exits.
#[derive(Clone)]
pub struct ChildSpec {
    /// Unique among the supervisor's children; human-readable, shown in the tree.
    pub name: String,
    /// When the child is restarted.
    pub restart: Restart,
    /// Worker or nested supervisor.
    pub kind: ChildKind,
    /// How long a graceful stop may take before the child is killed.
    pub shutdown_timeout_ms: u64,
    /// Builds and spawns a fresh instance, linked to the given supervisor.
    pub start: StartFn,
}

impl fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("name", &self.name)
            .field("restart", &self.restart)
            .field("kind", &self.kind)
            .field("shutdown_timeout_ms", &self.shutdown_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl ChildSpec {
    /// A permanent worker started by an arbitrary factory.
    pub fn from_fn<F>(name: impl Into<String>, start: F) -> Self
    where
        F: Fn(ActorCell) -> StartFuture + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            restart: Restart::Permanent,
            kind: ChildKind::Worker,
            shutdown_timeout_ms: WORKER_SHUTDOWN_TIMEOUT_MS_DEFAULT,
            start: Arc::new(start),
        }
    }

    /// A permanent worker: each start builds a new handler with `make_actor`
    /// and new arguments with `make_args`, then spawns it linked and unnamed.
    pub fn worker<A, FA, FArgs>(name: impl Into<String>, make_actor: FA, make_args: FArgs) -> Self
    where
        A: Actor,
        FA: Fn() -> A + Send + Sync + 'static,
        FArgs: Fn() -> A::Arguments + Send + Sync + 'static,
    {
        let make_actor = Arc::new(make_actor);
        let make_args = Arc::new(make_args);
        Self::from_fn(name, move |supervisor: ActorCell| {
            let actor = make_actor();
            let args = make_args();
            Box::pin(async move {
                // Unnamed on purpose: ractor's registry is process-global, and
                // many trees with the same child names must coexist.
                let (actor_ref, _join) = A::spawn_linked(None, actor, args, supervisor).await?;
                Ok(actor_ref.get_cell())
            })
        })
    }

    /// A nested supervisor built from `args` (cloned for every start, so a
    /// restarted supervisor starts its children from their specs again).
    pub fn supervisor(args: crate::SupervisorArgs) -> Self {
        let name = args.name.clone();
        let mut spec = Self::from_fn(name, move |supervisor: ActorCell| {
            let args = args.clone();
            Box::pin(async move {
                let (actor_ref, _join) =
                    crate::Supervisor::spawn_linked(None, crate::Supervisor, args, supervisor)
                        .await?;
                Ok(actor_ref.get_cell())
            })
        });
        spec.kind = ChildKind::Supervisor;
        spec.shutdown_timeout_ms = SUPERVISOR_SHUTDOWN_TIMEOUT_MS_DEFAULT;
        spec
    }

    /// Set the restart type.
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// Set the graceful shutdown timeout.
    pub fn shutdown_timeout_ms(mut self, shutdown_timeout_ms: u64) -> Self {
        self.shutdown_timeout_ms = shutdown_timeout_ms;
        self
    }

    /// Declare the kind explicitly (for a nested supervisor started through
    /// [`ChildSpec::from_fn`]).
    pub fn kind(mut self, kind: ChildKind) -> Self {
        self.kind = kind;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), SupervisionError> {
        if self.name.is_empty() {
            return Err(SupervisionError::InvalidSpec {
                reason: "child name is empty".to_string(),
            });
        }
        if self.shutdown_timeout_ms == 0 {
            return Err(SupervisionError::InvalidSpec {
                reason: format!("child {} has a zero shutdown timeout", self.name),
            });
        }
        Ok(())
    }
}

/// Default bound on how long a supervisor waits for a nested supervisor's snapshot.
pub const SNAPSHOT_TIMEOUT_MS_DEFAULT: u64 = 1_000;

/// Everything a [`crate::Supervisor`] needs to start.
#[derive(Debug, Clone)]
pub struct SupervisorArgs {
    /// The supervisor's human-readable name (also its name in its parent's tree).
    pub name: String,
    /// Which children are restarted together.
    pub strategy: Strategy,
    /// Restart intensity, beyond which the supervisor escalates.
    pub intensity: Intensity,
    /// Delay between a child's exit and its restart.
    pub backoff: Backoff,
    /// Static children, in start order.
    pub children: Vec<ChildSpec>,
}

impl SupervisorArgs {
    /// A supervisor with OTP's default intensity and the default backoff.
    pub fn new(name: impl Into<String>, strategy: Strategy) -> Self {
        Self {
            name: name.into(),
            strategy,
            intensity: Intensity::DEFAULT,
            backoff: Backoff::DEFAULT,
            children: Vec::new(),
        }
    }

    /// Add a static child (started after the ones added before it).
    pub fn child(mut self, spec: ChildSpec) -> Self {
        self.children.push(spec);
        self
    }

    /// Set the restart intensity.
    pub fn intensity(mut self, intensity: Intensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Set the restart backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), SupervisionError> {
        if self.name.is_empty() {
            return Err(SupervisionError::InvalidSpec {
                reason: "supervisor name is empty".to_string(),
            });
        }
        if self.intensity.period_ms == 0 {
            return Err(SupervisionError::InvalidSpec {
                reason: format!("supervisor {} has a zero intensity period", self.name),
            });
        }
        if self.backoff.delay_initial_ms > self.backoff.delay_max_ms {
            return Err(SupervisionError::InvalidSpec {
                reason: format!(
                    "supervisor {} has an initial backoff above its maximum",
                    self.name
                ),
            });
        }
        if self.backoff.multiplier == 0 {
            return Err(SupervisionError::InvalidSpec {
                reason: format!("supervisor {} has a zero backoff multiplier", self.name),
            });
        }
        for (i, spec) in self.children.iter().enumerate() {
            spec.validate()?;
            if self.children[..i]
                .iter()
                .any(|other| other.name == spec.name)
            {
                return Err(SupervisionError::DuplicateChild {
                    name: spec.name.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_initial_and_stops_at_max() {
        let backoff = Backoff {
            delay_initial_ms: 10,
            delay_max_ms: 75,
            multiplier: 2,
            reset_after_ms: 1_000,
        };
        let delays: Vec<u64> = (0..6)
            .map(|n| backoff.delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, vec![10, 20, 40, 75, 75, 75]);
    }

    #[test]
    fn backoff_with_huge_attempt_count_stays_bounded() {
        let backoff = Backoff::DEFAULT;
        assert_eq!(backoff.delay(u32::MAX), Duration::from_millis(1_000));
    }

    #[test]
    fn backoff_multiplier_one_keeps_delay_constant() {
        let backoff = Backoff {
            delay_initial_ms: 7,
            delay_max_ms: 100,
            multiplier: 1,
            reset_after_ms: 0,
        };
        assert_eq!(backoff.delay(5), Duration::from_millis(7));
    }

    #[test]
    fn restart_groups_follow_the_otp_strategies() {
        assert_eq!(Strategy::OneForOne.restart_group(1, 4), 1..2);
        assert_eq!(Strategy::OneForAll.restart_group(1, 4), 0..4);
        assert_eq!(Strategy::RestForOne.restart_group(1, 4), 1..4);
    }

    #[test]
    fn restart_types_decide_on_exit_kind() {
        assert!(Restart::Permanent.should_restart(false));
        assert!(Restart::Permanent.should_restart(true));
        assert!(!Restart::Transient.should_restart(false));
        assert!(Restart::Transient.should_restart(true));
        assert!(!Restart::Temporary.should_restart(true));
    }

    #[test]
    fn duplicate_child_names_are_rejected() {
        let spec = || {
            ChildSpec::from_fn("a", |_| {
                Box::pin(async { Err(SpawnErr::ActorAlreadyStarted) })
            })
        };
        let args = SupervisorArgs::new("s", Strategy::OneForOne)
            .child(spec())
            .child(spec());
        assert!(matches!(
            args.validate(),
            Err(SupervisionError::DuplicateChild { name }) if name == "a"
        ));
    }
}
