//! The operator's view of the cluster on the client port: the supervision
//! tree (`tree_snapshot`, with `all` every broker's over the node fabric)
//! and `cluster_status` (membership's view of every broker).

use malachi_cluster::group::Reach;
use malachi_wire::messages as wire;

use super::context::MetaCtx;
use super::error::ServeError;
use super::reply::Failure;
use crate::common::convert::tree_to_wire;
use crate::fabric::node::{broker_status, gather_trees};

pub(crate) async fn tree_snapshot(
    meta: &MetaCtx,
    req: wire::TreeSnapshotRequest,
) -> Result<wire::TreeSnapshotResponse, Failure> {
    let Some(root) = meta.actors.root.read().clone() else {
        return Err(ServeError::TreeDown);
    };
    let snapshot = root.snapshot().await.map_err(|e| ServeError::TreeSilent {
        reason: e.to_string(),
    })?;
    // With `all`, every other broker's tree comes over the node fabric; one
    // that cannot answer is listed as unreachable.
    let brokers = match meta.links.fabric() {
        Some(fabric) if req.all => gather_trees(&fabric, &meta.actors.root).await,
        _ => Vec::new(),
    };
    Ok(wire::TreeSnapshotResponse {
        node_id: meta.node_id,
        root: tree_to_wire(&snapshot),
        brokers,
    })
}

pub(crate) fn cluster_status(meta: &MetaCtx) -> wire::ClusterStatusResponse {
    let node_id = meta.node_id;
    let mut brokers = match meta.links.fabric() {
        Some(fabric) => fabric.membership.view().all().map(broker_status).collect(),
        None => vec![wire::BrokerStatus {
            node_id,
            state: wire::BrokerState::Alive,
            client_addr: meta.client_addr.to_string(),
            admin_addr: meta.admin_addr.to_string(),
            ..wire::BrokerStatus::default()
        }],
    };
    // Each broker's cluster port as this one judges it (ADR 0155): what
    // its placement goes by.
    for broker in &mut brokers {
        let reach = if broker.node_id == node_id {
            Reach::Reachable
        } else {
            meta.links.reach_of(broker.node_id)
        };
        broker.cluster_port = reach.label().to_owned();
    }
    wire::ClusterStatusResponse { node_id, brokers }
}
