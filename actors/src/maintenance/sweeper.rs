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

use crate::control::handle::ControlHandle;
use crate::control::removal::SweepOutcome;

pub(crate) struct SweeperActor;

/// What the sweeper uses: the control plane's sweep and its period.
#[derive(Debug)]
pub(crate) struct SweeperCtx {
    pub control: ControlHandle,
    pub orphan_sweep_ms: u64,
    /// The broker's fault-injection key (its client address).
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

/// The sweeper's timer: the next pass is due.
#[derive(Debug)]
pub(crate) enum SweeperMsg {
    Sweep,
}

impl ractor::Message for SweeperMsg {}

pub(crate) struct SweeperState {
    ctx: Arc<SweeperCtx>,
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
    type Arguments = Arc<SweeperCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<SweeperMsg>,
        ctx: Arc<SweeperCtx>,
    ) -> Result<SweeperState, ActorProcessingErr> {
        let every = Duration::from_millis(ctx.orphan_sweep_ms);
        // One period after the start, then one after each pass ends.
        let next = myself.send_after(every, || SweeperMsg::Sweep);
        Ok(SweeperState { ctx, every, next })
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
                crate::common::faults::trip(state.ctx.fault_key, "sweeper");
                match state.ctx.control.sweep_orphans().await {
                    SweepOutcome::Nothing => {}
                    outcome => debug!(?outcome, "orphan sweep"),
                }
                state.next = myself.send_after(state.every, || SweeperMsg::Sweep);
            }
        }
        Ok(())
    }
}
