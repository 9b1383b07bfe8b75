//! `maintenance/sweeper`: the orphan sweep (issue 21, ADR 0115), every
//! `maintenance.orphan_sweep_ms`.
//!
//! The decisions are `control::removal`'s: a copy on disk that nothing
//! here uses is put to every vnode of the ring, and removed only if every
//! vnode answered and none lists it. This worker only paces the passes
//! and keeps their outcome for the log. Each pass is a message the actor
//! sends itself after the previous one, so a pass that panics fails the
//! actor and its supervisor restarts the sweeping.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::control::removal::{SweepOutcome, sweep_orphans};
use crate::control::shared::Shared;

pub(crate) struct SweeperActor;

/// The sweeper's timer: the next pass is due.
#[derive(Debug)]
pub(crate) enum SweeperMsg {
    Sweep,
}

impl ractor::Message for SweeperMsg {}

pub(crate) struct SweeperState {
    shared: Arc<Shared>,
    every: Duration,
    /// The timer of the next pass: it holds the actor's cell, so it goes
    /// with the state rather than outliving it by up to a period.
    next: Timer,
}

type Timer = JoinHandle<Result<(), MessagingErr<SweeperMsg>>>;

impl Drop for SweeperState {
    fn drop(&mut self) {
        self.next.abort();
    }
}

#[ractor::async_trait]
impl Actor for SweeperActor {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<SweeperMsg>,
        shared: Arc<Shared>,
    ) -> Result<SweeperState, ActorProcessingErr> {
        let every = Duration::from_millis(shared.config.maintenance.orphan_sweep_ms);
        // One period after the start, then one after each pass ends.
        let next = myself.send_after(every, || SweeperMsg::Sweep);
        Ok(SweeperState {
            shared,
            every,
            next,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SweeperMsg>,
        message: SweeperMsg,
        state: &mut SweeperState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SweeperMsg::Sweep => {
                #[cfg(feature = "testing")]
                crate::common::faults::trip(state.shared.client_addr, "sweeper");
                match sweep_orphans(&state.shared).await {
                    SweepOutcome::Nothing => {}
                    outcome => debug!(?outcome, "orphan sweep"),
                }
                state.next = myself.send_after(state.every, || SweeperMsg::Sweep);
            }
        }
        Ok(())
    }
}
