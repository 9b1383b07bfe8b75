//! The crate's error type.

/// Everything that can go wrong when configuring, starting or talking to a
/// supervisor. Messages are lowercase and carry the names an operator needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SupervisionError {
    /// The supervisor or child specification is not usable.
    #[error("invalid supervisor spec: {reason}")]
    InvalidSpec {
        /// What is wrong with it.
        reason: String,
    },
    /// A child with this name already exists under this supervisor.
    #[error("child {name} already exists")]
    DuplicateChild {
        /// The duplicated name.
        name: String,
    },
    /// No child with this name exists under this supervisor.
    #[error("no child named {name}")]
    NoSuchChild {
        /// The name that was asked for.
        name: String,
    },
    /// A child's factory or `pre_start` failed.
    #[error("child {name} failed to start: {reason}")]
    StartFailed {
        /// The child's name.
        name: String,
        /// The spawn error, as text.
        reason: String,
    },
    /// Too many restarts within the intensity period: the supervisor gave up
    /// and failed to its own parent.
    #[error(
        "supervisor {name} exceeded its restart intensity ({restarts_max} restarts in {period_ms} ms)"
    )]
    IntensityExceeded {
        /// The supervisor's name.
        name: String,
        /// The configured restart budget.
        restarts_max: u32,
        /// The configured window, in milliseconds.
        period_ms: u64,
    },
    /// The supervisor actor itself could not be spawned.
    #[error("supervisor {name} failed to start: {reason}")]
    SpawnFailed {
        /// The supervisor's name.
        name: String,
        /// The spawn error, as text.
        reason: String,
    },
    /// The actor did not answer (or stop) in time.
    #[error("no answer within {timeout_ms} ms")]
    Timeout {
        /// The bound that was exceeded.
        timeout_ms: u64,
    },
    /// The actor (supervisor or bounded worker) is not running.
    #[error("actor is not running")]
    NotRunning,
    /// A [`crate::BoundedRef`] has all its credits in flight.
    #[error("busy: {inflight_max} messages already in flight")]
    Busy {
        /// The configured bound.
        inflight_max: usize,
    },
}
