//! A decommissioned broker's unreplicated topic moves off it (issue 18,
//! ADR 0112): four brokers in this process, a topic with one copy whose
//! primary is decommissioned. Its active segment rolls onto a broker that
//! stays, its sealed copy is re-created there, and every record reads back
//! in key order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use malachi_actors::{Broker, BrokerConfig, BrokerHandle};
use malachi_wire::messages::{ClusterMembersRequest, CreateTopicRequest};

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    cluster_config(dir, node_id, seeds, &[1, 2, 3, 4])
}

/// Every record of `topic` from the start, following the segments across
/// brokers: a read refused `not_leader` (the segment's copies are on
/// another broker) goes on with the same cursor at the next broker.
async fn read_all_following(
    addrs: &[std::net::SocketAddr],
    topic: &str,
) -> Vec<malachi_wire::batch::Record> {
    let mut at = 0;
    let mut client = TestClient::connect(addrs[at]).await;
    let mut got = Vec::new();
    let mut cursor: Option<String> = None;
    let mut refusals = 0;
    loop {
        match client
            .fetch(topic, cursor.clone(), cursor.is_none(), 100, 0)
            .await
        {
            Ok((page, next)) => {
                refusals = 0;
                let done = page.is_empty();
                got.extend(page);
                cursor = Some(next);
                if done {
                    return got;
                }
            }
            Err(refused) => {
                assert_eq!(
                    refused.code,
                    malachi_wire::ErrorCode::NotLeader,
                    "{}",
                    refused.message
                );
                refusals += 1;
                assert!(
                    refusals <= addrs.len(),
                    "no broker serves the read: {}",
                    refused.message
                );
                at = (at + 1) % addrs.len();
                client = TestClient::connect(addrs[at]).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decommissioned_brokers_unreplicated_topic_moves_to_a_broker_that_stays() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let one = Broker::start(config(root.path(), 1, &[])).await.unwrap();
    let two = Broker::start(config(root.path(), 2, &[&one]))
        .await
        .unwrap();
    let three = Broker::start(config(root.path(), 3, &[&one, &two]))
        .await
        .unwrap();
    let four = Broker::start(config(root.path(), 4, &[&one, &two, &three]))
        .await
        .unwrap();
    let brokers = [one, two, three, four];
    for b in &brokers {
        assert!(
            b.wait_ready(30_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    let client_of = |node: u64| brokers[(node - 1) as usize].client_addr();
    let mut admin = TestClient::connect(client_of(1)).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: "solo".into(),
                    replication_factor: Some(1),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic was never created"
    );
    let first = segments(&mut admin, "solo")
        .await
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(first.replicas.len(), 1);
    let leaving = first.replicas[0];
    let before: Vec<_> = (0..20)
        .map(|i| record(&format!("k{}", i % 3), &format!("a{i}")))
        .collect();
    let mut to_primary = TestClient::connect(client_of(leaving)).await;
    assert!(
        eventually(10_000, async || to_primary
            .produce("solo", &before)
            .await
            .is_ok())
        .await,
        "the first records were never acknowledged"
    );

    // Decommission the topic's only holder through another broker.
    let other = if leaving == 1 { 2 } else { 1 };
    let mut to_other = TestClient::connect(client_of(other)).await;
    assert!(
        eventually(30_000, async || to_other
            .call(&ClusterMembersRequest {
                decommission: Some(leaving),
                admit: None,
            })
            .await
            .is_ok())
        .await,
        "the decommission was never taken"
    );

    // Its active segment rolls onto a broker that stays, and its sealed
    // copy is re-created there: no segment names it any more.
    let what = format!("broker {leaving}'s unreplicated topic moves off it");
    let moved = wait_until(
        &what,
        Duration::from_secs(90),
        Duration::from_millis(100),
        async || {
            let now = segments(&mut to_other, "solo").await.unwrap();
            if now.len() > 1 && now.iter().all(|s| !s.replicas.contains(&leaving)) {
                Ok(now)
            } else {
                Err(now)
            }
        },
    )
    .await;
    let active = moved.last().unwrap();
    assert_eq!(active.state, "active");
    assert_ne!(active.replicas, vec![leaving]);

    // Producers go on through the new primary; everything reads back in
    // key order.
    let after: Vec<_> = (0..20)
        .map(|i| record(&format!("k{}", i % 3), &format!("b{i}")))
        .collect();
    let mut to_new = TestClient::connect(client_of(active.replicas[0])).await;
    assert!(
        eventually(20_000, async || to_new
            .produce("solo", &after)
            .await
            .is_ok())
        .await,
        "records were not acknowledged after the move"
    );
    let addrs: Vec<_> = brokers
        .iter()
        .filter(|b| b.node_id() != leaving)
        .map(|b| b.client_addr())
        .collect();
    let got = read_all_following(&addrs, "solo").await;
    let mut sent = before.clone();
    sent.extend(after);
    assert_eq!(by_key(&got), by_key(&sent));
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}
