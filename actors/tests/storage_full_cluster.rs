//! A full volume in a cluster (issue 19, ADR 0111): three brokers in this
//! process, RF=3. When the primary's volume fills, its active segment fails
//! over to brokers with room, producers move on (a produce sent to the
//! full broker is a retriable `not_leader`), nothing acknowledged is lost,
//! and freeing space makes the broker ready again without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use malachi_actors::{Broker, BrokerConfig, BrokerHandle};
use malachi_wire::messages::{CreateTopicRequest, DescribeTopicRequest, SegmentDescription};

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    cluster_config(dir, node_id, seeds, &[1, 2, 3])
}

/// The active segment of the topic's one range.
async fn active_segment(client: &mut TestClient, topic: &str) -> SegmentDescription {
    let described = client
        .call(&DescribeTopicRequest {
            name: topic.into(),
            live: false,
        })
        .await
        .unwrap();
    let range = described
        .topic
        .ranges
        .iter()
        .find(|r| r.state == "active")
        .unwrap();
    range.segments.last().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_primary_fails_over_to_brokers_with_room_and_producers_move_on() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let one = Broker::start(config(root.path(), 1, &[])).await.unwrap();
    let two = Broker::start(config(root.path(), 2, &[&one]))
        .await
        .unwrap();
    let three = Broker::start(config(root.path(), 3, &[&one, &two]))
        .await
        .unwrap();
    let brokers = [one, two, three];
    for b in &brokers {
        assert!(
            b.wait_ready(30_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    let mut admin = TestClient::connect(brokers[0].client_addr()).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: "moving".into(),
                    replication_factor: Some(3),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic was never created"
    );
    let first = active_segment(&mut admin, "moving").await;
    assert_eq!(first.replicas.len(), 3);
    let primary = first.replicas[0];
    let client_of = |node: u64| brokers[(node - 1) as usize].client_addr();
    let mut to_primary = TestClient::connect(client_of(primary)).await;
    let before: Vec<_> = (0..10)
        .map(|i| record(&format!("k{}", i % 3), &format!("a{i}")))
        .collect();
    assert!(
        eventually(10_000, async || to_primary
            .produce("moving", &before)
            .await
            .is_ok())
        .await,
        "the first records were never acknowledged"
    );

    // The primary's volume fills.
    brokers[(primary - 1) as usize].set_free_bytes(Some(0));
    let what = "the full primary's segment moves to brokers with room";
    let moved = wait_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let now = active_segment(&mut admin, "moving").await;
            if now.id != first.id && !now.replicas.contains(&primary) {
                Ok(now)
            } else {
                Err(now)
            }
        },
    )
    .await;
    assert!(!brokers[(primary - 1) as usize].is_ready());
    // A produce sent to the full broker is told to go elsewhere, retriably.
    let refused = to_primary
        .produce("moving", &[record("k0", "refused")])
        .await
        .unwrap_err();
    assert!(
        refused.code.retriable(),
        "{:?}: {}",
        refused.code,
        refused.message
    );

    // Producers move on to the new primary: nothing lost, key order kept.
    let mut to_new = TestClient::connect(client_of(moved.replicas[0])).await;
    let after: Vec<_> = (0..10)
        .map(|i| record(&format!("k{}", i % 3), &format!("b{i}")))
        .collect();
    assert!(
        eventually(10_000, async || to_new
            .produce("moving", &after)
            .await
            .is_ok())
        .await,
        "records were not acknowledged after the failover"
    );
    let got = read_all(&mut to_new, "moving").await;
    let mut sent = before.clone();
    sent.extend(after);
    assert_eq!(by_key(&got), by_key(&sent));

    // Space is freed: the broker is ready again, no restart.
    brokers[(primary - 1) as usize].set_free_bytes(Some(1 << 40));
    assert!(
        eventually(10_000, async || brokers[(primary - 1) as usize].is_ready()).await,
        "the broker never became ready again"
    );
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}
