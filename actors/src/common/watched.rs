//! A task an actor depends on, watched by that actor.
//!
//! ractor supervises actors, not the tasks they spawn: a loop spawned in
//! `pre_start` that panics or returns leaves its actor, and so the tree,
//! saying "running" while the work has stopped. [`spawn_watched`] runs
//! such a loop so that its end, whatever ended it, comes back to the
//! actor as a message; the actor fails on it and its supervisor restarts
//! it, loop and all. The returned [`Watched`] aborts the task when
//! dropped, which is when the actor's state is dropped: after a stop, a
//! failure or a kill alike (ractor runs `post_stop` only after a stop).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use ractor::{ActorRef, Message};
use tokio::task::JoinHandle;

/// How a watched task ended: the error its actor fails with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {task} task {how}")]
pub(crate) struct TaskEnded {
    /// The task's name, as its actor gave it.
    pub task: &'static str,
    /// "ended" (it returned), or "panicked: <message>".
    pub how: String,
}

/// How a task that returned ended (`TaskEnded::how`).
const RETURNED: &str = "ended";

impl TaskEnded {
    /// Whether the task returned, rather than panicked.
    pub(crate) fn returned(&self) -> bool {
        self.how == RETURNED
    }
}

/// A watched task; aborted when dropped.
#[derive(Debug)]
pub(crate) struct Watched(JoinHandle<()>);

impl Watched {
    /// Ends the task without telling its actor (its owner is the one
    /// stopping it), and waits until it is gone.
    pub(crate) async fn stop(mut self) {
        self.0.abort();
        // Aborted, or ended before the abort: gone either way.
        let _ = (&mut self.0).await;
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Spawns `work` as `task`; when it returns or panics, `ended` builds the
/// message that tells `actor` so.
pub(crate) fn spawn_watched<M, F>(
    actor: ActorRef<M>,
    task: &'static str,
    work: F,
    ended: fn(TaskEnded) -> M,
) -> Watched
where
    M: Message,
    F: Future<Output = ()> + Send + 'static,
{
    Watched(tokio::spawn(async move {
        let how = match AssertUnwindSafe(work).catch_unwind().await {
            Ok(()) => RETURNED.to_owned(),
            Err(panic) => format!("panicked: {}", panic_text(panic.as_ref())),
        };
        // The actor may be gone already (it is what dropped us, or is
        // stopping); then nobody needs to know.
        let _ = actor.send_message(ended(TaskEnded { task, how }));
    }))
}

/// The message of a panic's payload, when it has one.
pub(crate) fn panic_text(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    struct Watcher;

    #[derive(Debug)]
    enum Msg {
        Ended(TaskEnded),
    }

    impl ractor::Message for Msg {}

    #[ractor::async_trait]
    impl Actor for Watcher {
        type Msg = Msg;
        type State = Watched;
        type Arguments = bool;

        async fn pre_start(
            &self,
            myself: ActorRef<Msg>,
            panics: bool,
        ) -> Result<Watched, ActorProcessingErr> {
            Ok(spawn_watched(
                myself,
                "work",
                async move {
                    assert!(!panics, "the work broke");
                },
                Msg::Ended,
            ))
        }

        async fn handle(
            &self,
            _myself: ActorRef<Msg>,
            Msg::Ended(ended): Msg,
            _state: &mut Watched,
        ) -> Result<(), ActorProcessingErr> {
            Err(Box::new(ended))
        }
    }

    /// Records the failure of its child.
    struct Parent;

    #[ractor::async_trait]
    impl Actor for Parent {
        type Msg = ();
        type State = Option<tokio::sync::oneshot::Sender<String>>;
        type Arguments = tokio::sync::oneshot::Sender<String>;

        async fn pre_start(
            &self,
            _myself: ActorRef<()>,
            failed: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(Some(failed))
        }

        async fn handle_supervisor_evt(
            &self,
            _myself: ActorRef<()>,
            event: ractor::SupervisionEvent,
            failed: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            if let ractor::SupervisionEvent::ActorFailed(_, error) = event
                && let Some(failed) = failed.take()
            {
                let _ = failed.send(error.to_string());
            }
            Ok(())
        }
    }

    /// How a watcher whose work panics (or returns) fails.
    async fn failure_of(panics: bool) -> String {
        let (failed, failure) = tokio::sync::oneshot::channel();
        let (parent, _) = Actor::spawn(None, Parent, failed).await.unwrap();
        Actor::spawn_linked(None, Watcher, panics, parent.get_cell())
            .await
            .unwrap();
        let failure = failure.await.unwrap();
        parent.stop(None);
        failure
    }

    #[tokio::test]
    async fn a_watched_task_that_panics_fails_its_actor() {
        let exit = failure_of(true).await;
        assert!(
            exit.contains("the work task panicked: the work broke"),
            "{exit}"
        );
    }

    #[tokio::test]
    async fn a_watched_task_that_returns_fails_its_actor() {
        let exit = failure_of(false).await;
        assert!(exit.contains("the work task ended"), "{exit}");
    }
}
