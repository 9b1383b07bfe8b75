//! The operator's view of the cluster on the client port: the supervision
//! tree (`tree_snapshot`, with `all` every broker's over the node fabric)
//! and `cluster_status` (membership's view of every broker).

use std::sync::Arc;

use malachi_wire::messages as wire;

use super::error::ServeError;
use super::reply::Failure;
use crate::common::convert::tree_to_wire;
use crate::control::shared::Shared;
use crate::fabric::node::{broker_status, gather_trees};

pub(crate) async fn tree_snapshot(
    shared: &Arc<Shared>,
    req: wire::TreeSnapshotRequest,
) -> Result<wire::TreeSnapshotResponse, Failure> {
    let Some(root) = shared.actors.root.read().clone() else {
        return Err(ServeError::TreeDown);
    };
    let snapshot = root.snapshot().await.map_err(|e| ServeError::TreeSilent {
        reason: e.to_string(),
    })?;
    // With `all`, every other broker's tree comes over the node fabric; one
    // that cannot answer is listed as unreachable.
    let brokers = match shared.fabric() {
        Some(fabric) if req.all => gather_trees(&fabric, &shared.actors.root).await,
        _ => Vec::new(),
    };
    Ok(wire::TreeSnapshotResponse {
        node_id: shared.config.node_id,
        root: tree_to_wire(&snapshot),
        brokers,
    })
}

pub(crate) fn cluster_status(shared: &Arc<Shared>) -> wire::ClusterStatusResponse {
    let node_id = shared.config.node_id;
    let brokers = match shared.fabric() {
        Some(fabric) => fabric.membership.view().all().map(broker_status).collect(),
        None => vec![wire::BrokerStatus {
            node_id,
            state: wire::BrokerState::Alive,
            client_addr: shared.client_addr.to_string(),
            admin_addr: shared.admin_addr.to_string(),
            ..wire::BrokerStatus::default()
        }],
    };
    wire::ClusterStatusResponse { node_id, brokers }
}
