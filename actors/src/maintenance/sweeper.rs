//! `maintenance/sweeper`: the orphan sweep (issue 21, ADR 0115), every
//! `maintenance.orphan_sweep_ms`.
//!
//! The decisions are `control::removal`'s: a copy on disk that nothing
//! here uses is put to every vnode of the ring, and removed only if every
//! vnode answered and none lists it. This worker only paces the passes
//! and keeps their outcome for the log.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::control::removal::{SweepOutcome, sweep_orphans};
use crate::control::shared::Shared;

pub(crate) struct SweeperActor;

/// The sweeper takes no messages: it runs on its own timer.
#[derive(Debug)]
pub(crate) enum SweeperMsg {}

impl ractor::Message for SweeperMsg {}

pub(crate) struct SweeperState {
    task: JoinHandle<()>,
}

#[ractor::async_trait]
impl Actor for SweeperActor {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<SweeperMsg>,
        shared: Arc<Shared>,
    ) -> Result<SweeperState, ActorProcessingErr> {
        Ok(SweeperState {
            task: tokio::spawn(run(shared)),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SweeperMsg>,
        state: &mut SweeperState,
    ) -> Result<(), ActorProcessingErr> {
        state.task.abort();
        Ok(())
    }
}

async fn run(shared: Arc<Shared>) {
    let every = Duration::from_millis(shared.config.maintenance.orphan_sweep_ms);
    loop {
        tokio::time::sleep(every).await;
        #[cfg(feature = "testing")]
        crate::common::faults::trip(shared.client_addr, "sweeper");
        match sweep_orphans(&shared).await {
            SweepOutcome::Nothing => {}
            outcome => debug!(?outcome, "orphan sweep"),
        }
    }
}
