//! Backpressure over ractor's unbounded mailboxes: in-flight credit.
//!
//! ractor mailboxes have no capacity, so an actor on the data path would queue
//! without limit if producers outran it. The broker's rule is that every
//! data-path actor is reached through a [`BoundedRef`], which owns a fixed
//! number of credits (`inflight_max`). A sender takes one credit per message
//! and the credit travels *inside* the message as a [`Permit`]; the credit
//! returns when the permit is dropped, which is when the actor has handled the
//! message (or when the message is dropped unhandled because the actor died).
//! So at most `inflight_max` messages sent through one `BoundedRef` (and its
//! clones) are ever queued or being handled, whatever the producers do.
//!
//! Senders choose how to wait: [`BoundedRef::send`] waits for a credit (the
//! caller slows down: that is the backpressure), [`BoundedRef::try_send`]
//! fails at once with [`SupervisionError::Busy`] (for callers that must shed
//! load and answer "busy" to a client instead), and [`BoundedRef::call`] is a
//! request/response bounded in both credit and time.
//!
//! An actor may keep the permit beyond its handler, for instance until an
//! fsync covering the message completes, to extend the bound over work it
//! hands to another task. Control-plane messages (snapshots, stop) do not need
//! credit and are sent on the plain `ActorRef`.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, Message, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::error::SupervisionError;

/// One in-flight credit. Keep it in the message; dropping it returns the credit.
#[derive(Debug)]
pub struct Permit {
    _permit: OwnedSemaphorePermit,
}

impl Permit {
    /// Return the credit now (same as dropping the permit), for a handler
    /// that is done with the message before its handler ends.
    pub fn release(self) {}
}

/// An [`ActorRef`] with a bound on how many messages it has in flight.
#[derive(Debug)]
pub struct BoundedRef<M: Message> {
    actor: ActorRef<M>,
    credits: Arc<Semaphore>,
    inflight_max: usize,
}

impl<M: Message> Clone for BoundedRef<M> {
    fn clone(&self) -> Self {
        // Clones share the credits: the bound is per actor, not per sender.
        Self {
            actor: self.actor.clone(),
            credits: Arc::clone(&self.credits),
            inflight_max: self.inflight_max,
        }
    }
}

impl<M: Message> BoundedRef<M> {
    /// Bound `actor` to `inflight_max` messages in flight. Create one
    /// `BoundedRef` per actor and clone it to every sender.
    pub fn new(actor: ActorRef<M>, inflight_max: usize) -> Self {
        assert!(inflight_max > 0, "inflight_max must be positive");
        assert!(
            inflight_max <= Semaphore::MAX_PERMITS,
            "inflight_max exceeds the semaphore's limit"
        );
        Self {
            actor,
            credits: Arc::new(Semaphore::new(inflight_max)),
            inflight_max,
        }
    }

    /// The actor behind the bound (for control messages that need no credit).
    pub fn actor(&self) -> &ActorRef<M> {
        &self.actor
    }

    /// The configured bound.
    pub fn inflight_max(&self) -> usize {
        self.inflight_max
    }

    /// Messages currently queued or being handled.
    pub fn inflight(&self) -> usize {
        self.inflight_max - self.credits.available_permits()
    }

    /// Wait for a credit, then send the message `build` makes from it.
    pub async fn send<F>(&self, build: F) -> Result<(), SupervisionError>
    where
        F: FnOnce(Permit) -> M,
    {
        let permit = Arc::clone(&self.credits)
            .acquire_owned()
            .await
            .map_err(|_| SupervisionError::NotRunning)?;
        self.deliver(build(Permit { _permit: permit }))
    }

    /// Send only if a credit is free now; otherwise [`SupervisionError::Busy`].
    pub fn try_send<F>(&self, build: F) -> Result<(), SupervisionError>
    where
        F: FnOnce(Permit) -> M,
    {
        let permit = match Arc::clone(&self.credits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits) => {
                return Err(SupervisionError::Busy {
                    inflight_max: self.inflight_max,
                });
            }
            Err(TryAcquireError::Closed) => return Err(SupervisionError::NotRunning),
        };
        self.deliver(build(Permit { _permit: permit }))
    }

    /// A request/response that waits for a credit and the reply, all within
    /// `timeout_ms`.
    pub async fn call<R, F>(&self, build: F, timeout_ms: u64) -> Result<R, SupervisionError>
    where
        R: Send + 'static,
        F: FnOnce(Permit, RpcReplyPort<R>) -> M,
    {
        let timeout = Duration::from_millis(timeout_ms);
        let deadline = tokio::time::Instant::now() + timeout;
        let permit = tokio::time::timeout_at(deadline, Arc::clone(&self.credits).acquire_owned())
            .await
            .map_err(|_| SupervisionError::Timeout { timeout_ms })?
            .map_err(|_| SupervisionError::NotRunning)?;
        let permit = Permit { _permit: permit };
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            return Err(SupervisionError::Timeout { timeout_ms });
        }
        match self
            .actor
            .call(|reply| build(permit, reply), Some(remaining))
            .await
        {
            Ok(CallResult::Success(answer)) => Ok(answer),
            Ok(CallResult::Timeout) => Err(SupervisionError::Timeout { timeout_ms }),
            Ok(CallResult::SenderError) | Err(_) => Err(SupervisionError::NotRunning),
        }
    }

    fn deliver(&self, message: M) -> Result<(), SupervisionError> {
        // On a send error the message (and so its permit) is dropped, which
        // returns the credit.
        self.actor
            .send_message(message)
            .map_err(|_| SupervisionError::NotRunning)
    }
}
