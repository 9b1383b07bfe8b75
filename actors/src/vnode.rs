//! `vnode/0`: the actor that owns this broker's metadata group replica.
//!
//! It opens the plane in `pre_start` (so the coordinator, started after it
//! under the `rest_for_one` metadata supervisor, always finds it open),
//! publishes it to the broker's shared state, and shuts it down on a graceful
//! stop. If it fails, `rest_for_one` restarts the coordinator after it too.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::info;

use crate::config::MetadataBackend;
use crate::metadata::{FilePlane, MetadataPlane, RaftPlane};

/// The single vnode's raft group id.
const VNODE_GROUP_ID: u64 = 0;
use crate::shared::Shared;

pub(crate) struct VnodeActor;

#[derive(Debug)]
pub(crate) enum VnodeMsg {}
impl ractor::Message for VnodeMsg {}

pub(crate) struct VnodeState {
    shared: Arc<Shared>,
    plane: Arc<dyn MetadataPlane>,
}

#[ractor::async_trait]
impl Actor for VnodeActor {
    type Msg = VnodeMsg;
    type State = VnodeState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<VnodeMsg>,
        shared: Arc<Shared>,
    ) -> Result<VnodeState, ActorProcessingErr> {
        // A crashed predecessor left its plane published (post_stop does not
        // run after a failure): stop it before reopening the same files, so
        // two raft nodes never share one log.
        let stale = shared.plane.write().take();
        if let Some(stale) = stale {
            let _ = stale.shutdown().await;
        }
        let dir = shared.config.data_dir.join("metadata");
        let plane: Arc<dyn MetadataPlane> = match shared.config.metadata_backend {
            MetadataBackend::Raft => {
                Arc::new(RaftPlane::open_single(VNODE_GROUP_ID, shared.config.node_id, &dir).await?)
            }
            MetadataBackend::File => {
                Arc::new(tokio::task::block_in_place(|| FilePlane::open(&dir))?)
            }
        };
        *shared.plane.write() = Some(Arc::clone(&plane));
        info!(dir = %dir.display(), "metadata plane open");
        Ok(VnodeState { shared, plane })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<VnodeMsg>,
        state: &mut VnodeState,
    ) -> Result<(), ActorProcessingErr> {
        *state.shared.plane.write() = None;
        state.plane.shutdown().await?;
        Ok(())
    }
}
