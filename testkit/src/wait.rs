//! Waiting on a condition, the one way the tests synchronise with a broker,
//! a cluster or an actor: poll a check until it holds or a deadline passes,
//! then fail naming what was awaited and what was last seen.
//!
//! A check answers with anything that is an [`Outcome`]: `bool`,
//! `Option<T>` (done with `Some`), or `Result<T, E>` (done with `Ok`; the
//! last `Err` is what the failure shows). Async and blocking flavours share
//! the loop's rules: the check runs at once, then every `poll`, and once
//! more at the deadline, so a condition that holds at the last moment is
//! not missed.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// What a check answers: done with a value, or not yet with what it saw.
pub trait Outcome {
    /// What a wait that succeeded returns.
    type Value;
    /// `Ok(value)` when the awaited condition holds; otherwise what was
    /// observed, for the failure message.
    fn into_result(self) -> Result<Self::Value, String>;
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".to_owned())
        }
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.ok_or_else(|| "None".to_owned())
    }
}

impl<T, E: Debug> Outcome for Result<T, E> {
    type Value = T;
    fn into_result(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// A wait that timed out: what it waited for, how long, and the last
/// observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// The deadline it was given.
    pub deadline: Duration,
    /// What the last check saw.
    pub last: String,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting until {}; last observed: {}",
            self.deadline, self.what, self.last
        )
    }
}

/// A wait on a condition, with its bounds and an optional context for the
/// failure message (a cluster's logs, say), gathered only on failure.
pub struct Wait<'a> {
    what: String,
    deadline: Duration,
    poll: Duration,
    context: Option<Box<dyn Fn() -> String + 'a>>,
}

impl Debug for Wait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("what", &self.what)
            .field("deadline", &self.deadline)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

impl<'a> Wait<'a> {
    /// A wait until `what`, for at most `deadline`, checking every `poll`.
    pub fn new(what: impl Into<String>, deadline: Duration, poll: Duration) -> Wait<'a> {
        Wait {
            what: what.into(),
            deadline,
            poll,
            context: None,
        }
    }

    /// Appends `context()` to the failure message (called only on failure).
    pub fn context(mut self, context: impl Fn() -> String + 'a) -> Wait<'a> {
        self.context = Some(Box::new(context));
        self
    }

    /// Polls `check` (async) until it holds; panics past the deadline.
    pub async fn until<O: Outcome>(self, check: impl AsyncFnMut() -> O) -> O::Value {
        match self.try_until(check).await {
            Ok(value) => value,
            Err(timed_out) => self.fail(&timed_out),
        }
    }

    /// Polls `check` (blocking the thread between checks) until it holds;
    /// panics past the deadline.
    pub fn until_blocking<O: Outcome>(self, check: impl FnMut() -> O) -> O::Value {
        match self.try_until_blocking(check) {
            Ok(value) => value,
            Err(timed_out) => self.fail(&timed_out),
        }
    }

    /// `until`, returning the timeout instead of panicking.
    pub async fn try_until<O: Outcome>(
        &self,
        mut check: impl AsyncFnMut() -> O,
    ) -> Result<O::Value, TimedOut> {
        let deadline = tokio::time::Instant::now() + self.deadline;
        loop {
            let last = match check().await.into_result() {
                Ok(value) => return Ok(value),
                Err(last) => last,
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(self.timed_out(last));
            }
            tokio::time::sleep(self.poll.min(deadline - now)).await;
        }
    }

    /// `until_blocking`, returning the timeout instead of panicking.
    pub fn try_until_blocking<O: Outcome>(
        &self,
        mut check: impl FnMut() -> O,
    ) -> Result<O::Value, TimedOut> {
        let deadline = Instant::now() + self.deadline;
        loop {
            let last = match check().into_result() {
                Ok(value) => return Ok(value),
                Err(last) => last,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timed_out(last));
            }
            std::thread::sleep(self.poll.min(deadline - now));
        }
    }

    fn timed_out(&self, last: String) -> TimedOut {
        TimedOut {
            what: self.what.clone(),
            deadline: self.deadline,
            last,
        }
    }

    fn fail(&self, timed_out: &TimedOut) -> ! {
        match &self.context {
            Some(context) => panic!("{timed_out}\n{}", context()),
            None => panic!("{timed_out}"),
        }
    }
}

/// Polls `check` every `poll` until it holds and returns its value; past
/// `deadline`, panics naming `what` and the last observation.
pub async fn wait_until<O: Outcome>(
    what: &str,
    deadline: Duration,
    poll: Duration,
    check: impl AsyncFnMut() -> O,
) -> O::Value {
    Wait::new(what, deadline, poll).until(check).await
}

/// The blocking flavour of [`wait_until`], for tests without a runtime
/// (process-level tests polling a CLI or a file).
pub fn wait_until_blocking<O: Outcome>(
    what: &str,
    deadline: Duration,
    poll: Duration,
    check: impl FnMut() -> O,
) -> O::Value {
    Wait::new(what, deadline, poll).until_blocking(check)
}

/// How often [`eventually`] checks.
pub const EVENTUALLY_POLL: Duration = Duration::from_millis(10);

/// Whether `check` holds within `timeout_ms`, polled every 10 ms: the
/// non-panicking flavour, for a test that asserts with its own message or
/// looks at more than the condition once the wait is over.
pub async fn eventually(timeout_ms: u64, check: impl AsyncFnMut() -> bool) -> bool {
    Wait::new("", Duration::from_millis(timeout_ms), EVENTUALLY_POLL)
        .try_until(check)
        .await
        .is_ok()
}

/// The blocking flavour of [`eventually`], polled every `poll`.
pub fn eventually_blocking(timeout: Duration, poll: Duration, check: impl FnMut() -> bool) -> bool {
    Wait::new("", timeout, poll)
        .try_until_blocking(check)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn a_wait_returns_the_value_once_the_check_holds() {
        let mut polls = 0;
        let got = wait_until("the third poll", Duration::from_secs(5), POLL, async || {
            polls += 1;
            if polls == 3 { Ok(polls) } else { Err(polls) }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test]
    async fn a_timed_out_wait_names_what_it_awaited_and_the_last_value_seen() {
        let mut polls = 0;
        let timed_out = Wait::new("the answer is 42", Duration::from_millis(30), POLL)
            .try_until(async || {
                polls += 1;
                if polls > 1_000_000 {
                    Ok(())
                } else {
                    Err(polls)
                }
            })
            .await
            .unwrap_err();
        let message = timed_out.to_string();
        assert!(
            message.contains("waiting until the answer is 42"),
            "{message}"
        );
        assert!(
            message.ends_with(&format!("last observed: {polls}")),
            "{message}"
        );
    }

    #[test]
    fn a_blocking_wait_panics_with_its_context_past_the_deadline() {
        let panic = std::panic::catch_unwind(|| {
            Wait::new("never", Duration::from_millis(20), POLL)
                .context(|| "the brokers' logs".to_owned())
                .until_blocking(|| None::<u8>)
        })
        .unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("waiting until never; last observed: None"),
            "{message}"
        );
        assert!(message.ends_with("the brokers' logs"), "{message}");
    }

    #[test]
    fn eventually_answers_whether_the_check_held_in_time() {
        let start = Instant::now();
        let late = start + Duration::from_millis(20);
        assert!(eventually_blocking(
            Duration::from_secs(5),
            POLL,
            || Instant::now() > late
        ));
        assert!(!eventually_blocking(
            Duration::from_millis(20),
            POLL,
            || false
        ));
    }
}
