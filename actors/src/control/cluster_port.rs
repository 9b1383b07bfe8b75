//! The cluster port's dispatcher: what a request to this broker's raft
//! port (a `TransportServer`, started by the `vnodes` actor) is routed to.
//!
//! One job: read a request's api key ([`route`]), hand its body to the one
//! handler that serves it, and give back the encoded answer. The port
//! carries:
//! - raft and the forwarded metadata requests, served by the `VnodeHost`
//!   (the forwarded topic list, key 212, through its broker api);
//! - replica-appends (key 100) for this broker's follower copies (ADR
//!   0095), and the repair appends that ride them;
//! - the coordinator's orders (catch-up 101, seal 102, fence 103, drop
//!   copies 104; ADR 0106, 0115): catch-up carries frames and lives here,
//!   the other three travel over the node fabric and use this port as
//!   their fallback (ADR 0133);
//! - replica-status (key 105, ADR 0098), the fallback of its fabric path.
//!
//! A refusal is an [`RpcError`]; the transport maps it to its wire code
//! (`RpcError::code`, the cluster port's one mapping, as
//! `serve/error.rs` is the client port's). Each request served is counted
//! by api key (`shared::PortCounts`), so a test can tell which path an order
//! took.

use std::sync::Arc;

use bytes::Bytes;
use malachi_cluster::group::{RpcError, RpcService};
use malachi_cluster::vnodes::VnodeHost;
use malachi_cluster::vnodes::broker_api::FORWARD_LIST_API_KEY;
use malachi_wire::replica_order::{
    CATCH_UP_API_KEY, DROP_COPIES_API_KEY, FENCE_API_KEY, SEAL_API_KEY,
};
use malachi_wire::replica_status::REPLICA_STATUS_API_KEY;
use malachi_wire::replication::REPLICA_APPEND_API_KEY;

use crate::control::shared::Shared;

/// Where a cluster-port request goes, by its api key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The forwarded topic list (key 212), from the host's broker api.
    ForwardList,
    /// Replica-status (key 105): this broker's copies, read only.
    ReplicaStatus,
    /// A coordinator's order (keys 101 to 104).
    Order,
    /// A replica-append (key 100), a primary's frames or a repair.
    ReplicaAppend,
    /// Raft and the other forwarded requests: the vnode host's.
    Host,
}

/// The route of a request with `api_key`.
pub(crate) fn route(api_key: u16) -> Route {
    match api_key {
        FORWARD_LIST_API_KEY => Route::ForwardList,
        REPLICA_STATUS_API_KEY => Route::ReplicaStatus,
        CATCH_UP_API_KEY | SEAL_API_KEY | FENCE_API_KEY | DROP_COPIES_API_KEY => Route::Order,
        REPLICA_APPEND_API_KEY => Route::ReplicaAppend,
        _ => Route::Host,
    }
}

/// The cluster port's service: the vnode host for raft and forwarding, the
/// broker for replication, orders and status.
#[derive(Debug)]
pub(crate) struct ClusterPort {
    host: Arc<VnodeHost>,
    shared: Arc<Shared>,
}

impl ClusterPort {
    pub(crate) fn new(host: Arc<VnodeHost>, shared: Arc<Shared>) -> ClusterPort {
        ClusterPort { host, shared }
    }
}

#[async_trait::async_trait]
impl RpcService for ClusterPort {
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError> {
        if let Some(raft) = self.shared.links.raft.get() {
            raft.port_counts.count(api_key);
        }
        match route(api_key) {
            Route::ForwardList => self.host.serve_list(group_id).await,
            Route::ReplicaStatus => {
                super::replica_status::serve_replica_status(&self.shared, &body)
            }
            Route::Order => super::replica_order::serve_order(&self.shared, api_key, body)
                .await
                .unwrap_or(Err(RpcError::NotForwarded { api_key })),
            Route::ReplicaAppend => {
                let answer = super::replica::serve_replica_append(&self.shared, body).await;
                answer
                    .encode()
                    .map(|b| b.to_vec())
                    .map_err(|e| RpcError::Encode {
                        what: "replica_append_response",
                        source: Arc::new(e),
                    })
            }
            Route::Host => self.host.serve(api_key, group_id, body).await,
        }
    }

    /// A full volume cannot take raft log writes: while the space guard
    /// holds it full (a poll found it under the line, or a raft write got
    /// ENOSPC), peers elect other leaders for the groups this broker led,
    /// so metadata changes through the brokers with room go on.
    fn unfit_to_lead(&self) -> bool {
        self.shared.data.space.is_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_the_broker_serves_has_its_route_and_the_rest_go_to_the_host() {
        assert_eq!(route(FORWARD_LIST_API_KEY), Route::ForwardList);
        assert_eq!(route(REPLICA_STATUS_API_KEY), Route::ReplicaStatus);
        assert_eq!(route(REPLICA_APPEND_API_KEY), Route::ReplicaAppend);
        for key in [
            CATCH_UP_API_KEY,
            SEAL_API_KEY,
            FENCE_API_KEY,
            DROP_COPIES_API_KEY,
        ] {
            assert_eq!(route(key), Route::Order, "key {key}");
        }
        for key in [
            200,
            malachi_cluster::group::FORWARD_PROPOSE_API_KEY,
            malachi_cluster::group::PING_API_KEY,
        ] {
            assert_eq!(route(key), Route::Host, "key {key}");
        }
    }

    #[test]
    fn counts_are_kept_per_key() {
        let counts = crate::control::shared::PortCounts::default();
        counts.count(105);
        counts.count(105);
        counts.count(100);
        assert_eq!(counts.served(105), 2);
        assert_eq!(counts.served(100), 1);
        assert_eq!(counts.served(102), 0);
    }
}
