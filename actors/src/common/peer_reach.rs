//! Where this broker's judgement of its peers' cluster ports is shown (ADR
//! 0155): `malachi_peer_cluster_port_reachable{peer}` and a log line at
//! each change. The judgement itself is `malachi_cluster::group::reach`,
//! fed by both transports' dials.

use std::sync::{Arc, OnceLock};

use malachi_cluster::group::{Reach, ReachChange, ReachObserver};
use tracing::{info, warn};

use crate::common::metrics::BrokerMetrics;

/// Sets the gauge and logs each change of a peer's judgement.
#[derive(Debug, Default)]
pub(crate) struct ReachLog {
    node_id: u64,
    metrics: OnceLock<Arc<BrokerMetrics>>,
}

impl ReachLog {
    pub(crate) fn new(node_id: u64) -> ReachLog {
        ReachLog {
            node_id,
            metrics: OnceLock::new(),
        }
    }

    /// Where the gauge is set, once the broker's metrics exist; `judged`
    /// is what was judged before (set now).
    pub(crate) fn count_into(
        &self,
        metrics: &Arc<BrokerMetrics>,
        judged: &std::collections::BTreeMap<u64, Reach>,
    ) {
        for (peer, reach) in judged {
            if *reach != Reach::Unknown {
                metrics.peer_cluster_port_reachable(*peer, *reach != Reach::Unreachable);
            }
        }
        let _ = self.metrics.set(Arc::clone(metrics));
    }
}

impl ReachObserver for ReachLog {
    /// A peer that refuses us (another CA, another cookie) is a fault to
    /// warn of; one whose dials only failed for the bound is down or
    /// restarting, which membership and raft report already, so an ordered
    /// shutdown stays quiet.
    fn changed(&self, change: ReachChange) {
        let ReachChange {
            peer,
            before,
            now,
            refused,
        } = change;
        if let Some(metrics) = self.metrics.get() {
            metrics.peer_cluster_port_reachable(peer, now != Reach::Unreachable);
        }
        let node = self.node_id;
        let left_out =
            "a peer's cluster port cannot be reached: no new copies, primaries or moves go to it";
        match now {
            Reach::Unreachable if refused => {
                warn!(node, peer, before = before.label(), refused, "{left_out}")
            }
            Reach::Unreachable => info!(node, peer, before = before.label(), refused, "{left_out}"),
            _ if before == Reach::Unreachable => info!(
                node,
                peer,
                now = now.label(),
                "a peer's cluster port is reached again: placement counts on it"
            ),
            _ => {}
        }
    }
}
