//! Placement counts only on brokers whose cluster port it reaches (ADR
//! 0155), in plaintext: a broker whose cluster cookie is not the others'
//! is alive in SWIM (unsealed here, so the cookie's key does not keep it
//! out), but every raft and replication dial to it is refused. Of four
//! brokers, the three good ones keep every copy and every primary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::reach::{guarded_workload, ready_good};
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings, SwimSeal};

/// Broker `node_id` of brokers 1 to 4, SWIM unsealed; `cookie` its cluster
/// cookie.
fn config(dir: &Path, node_id: u64, seeds: &[SocketAddr], cookie: &str) -> BrokerConfig {
    let base = three_node_config(dir, node_id, seeds);
    BrokerConfig {
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3, 4],
            ..base.cluster.clone()
        },
        membership: malachi_actors::MembershipSettings {
            cluster_cookie: Some(cookie.to_owned()),
            swim_seal: SwimSeal::Off,
            ..base.membership.clone()
        },
        ..base
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_with_another_cookie_gets_no_copy_and_no_primary() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let mut brokers: Vec<BrokerHandle> = Vec::new();
    for id in 1..=4u64 {
        let seeds: Vec<SocketAddr> = brokers.iter().map(|b| b.client_addr()).collect();
        let cookie = if id == 4 {
            "not-the-cluster-cookie"
        } else {
            "the-cluster-cookie"
        };
        let broker = malachi_actors::Broker::start(config(root.path(), id, &seeds, cookie))
            .await
            .unwrap();
        brokers.push(broker);
    }
    let good = ready_good(&brokers, 3).await;
    guarded_workload(&good, 4, "cut").await;
    // Broker 4's cookie handshakes failed on the good brokers' ports.
    for b in &good {
        let stats = b.cluster_port_stats().unwrap();
        assert!(stats.refused_handshake > 0, "{stats:?}");
    }
}
