//! The coordinator's orders over the node fabric (ractor_cluster, ADR
//! 0133): three brokers in this process, RF=3.
//!
//! A failover's fences and seals reach the surviving copies as remote
//! actor calls, served by each broker's `metadata/orders` actor; sending a
//! fence or a seal again (as a call lost with its session is) changes
//! nothing; the cluster port still serves the moved keys (the fallback when
//! a peer has no fabric session). The test prints the latency of a seal
//! order over each path (the ADR's measurement).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_wire::messages::*;
use malachi_wire::replica_order::{
    FenceRequest, FenceResponse, OrderEpoch, SEAL_API_KEY, SealRequest, SealResponse,
};
use malachi_wire::replica_status::{
    REPLICA_STATUS_API_KEY, ReplicaStatusRequest, ReplicaStatusResponse,
};

const TOPIC: &str = "orders";
/// Seal orders timed per path.
const LATENCY_SAMPLES: usize = 200;

fn config(dir: &Path, node_id: u64, seeds: &[SocketAddr]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|a| a.to_string()).collect(),
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3],
            coordinator_poll_ms: 200,
            ..ClusterSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

async fn topic_segments(brokers: &[Option<BrokerHandle>]) -> Vec<SegmentDescription> {
    for broker in brokers.iter().flatten() {
        let mut client = TestClient::connect(broker.client_addr()).await;
        if let Ok(all) = segments(&mut client, TOPIC).await {
            return all;
        }
    }
    Vec::new()
}

/// Whether every live broker answers a replica-status probe from every
/// other over the fabric: the sessions and process groups are up.
async fn fabric_meshed(brokers: &[Option<BrokerHandle>]) -> bool {
    let probe = ReplicaStatusRequest::default().encode().unwrap().to_vec();
    for from in brokers.iter().flatten() {
        for to in brokers.iter().flatten() {
            if from.node_id() == to.node_id() {
                continue;
            }
            let answer = from
                .order_over_fabric(to.node_id(), "replica_status", probe.clone(), 1_000)
                .await;
            match answer {
                Ok(bytes) => assert!(ReplicaStatusResponse::decode(&bytes).is_ok()),
                Err(_) => return false,
            }
        }
    }
    true
}

fn served(brokers: &[Option<BrokerHandle>], order: &str) -> u64 {
    brokers
        .iter()
        .flatten()
        .map(|b| b.fabric_orders_served().get(order).copied().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_fences_and_seals_over_the_node_fabric_and_repeats_are_harmless() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let mut brokers =
        start_stoppable(3, |node_id, seeds| config(root.path(), node_id, seeds)).await;
    create_replicated_topic(brokers[0].as_ref().unwrap().client_addr(), TOPIC, 3).await;
    let records: Vec<_> = (0..20).map(|i| record("k", &format!("v{i}"))).collect();
    let before = {
        let mut found = None;
        assert!(
            eventually(10_000, async || {
                found = topic_segments(&brokers).await.into_iter().next();
                found.is_some()
            })
            .await
        );
        found.unwrap()
    };
    let primary = brokers[(before.replicas[0] - 1) as usize].as_ref().unwrap();
    let mut client = TestClient::connect(primary.client_addr()).await;
    assert!(client.produce(TOPIC, &records).await.is_ok());
    drop(client);
    assert!(
        eventually(20_000, async || fabric_meshed(&brokers).await).await,
        "the node fabric never connected every pair"
    );
    let (fences, seals) = (served(&brokers, "fence"), served(&brokers, "seal"));

    // 1. The primary stops: the failover fences the survivors and seals
    // them, over the fabric. (With several brokers in one process, a
    // broker's departure makes ractor_cluster drop the other sessions'
    // proxies until the order servers announce their groups again, ADR
    // 0133: the orders wait for them, ORDER_SESSION_WAIT_MS.)
    let lost = before.replicas[0];
    brokers[(lost - 1) as usize]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let mut sealed = None;
    assert!(
        eventually(30_000, async || {
            sealed = topic_segments(&brokers)
                .await
                .into_iter()
                .find(|s| s.id == before.id && s.state == "sealed");
            sealed.is_some()
        })
        .await,
        "the failover never sealed the lost primary's segment"
    );
    let sealed = sealed.unwrap();
    assert!(
        served(&brokers, "fence") > fences,
        "no fence crossed the fabric"
    );
    // The seal orders follow the seal's record, which describe shows.
    assert!(
        eventually(10_000, async || served(&brokers, "seal") > seals).await,
        "no seal crossed the fabric"
    );

    // 2. The same fence and seal again, twice each, as a retry after a
    // lost session sends them: the same answers, and the copy unchanged.
    let live: Vec<&BrokerHandle> = brokers.iter().flatten().collect();
    let (asker, holder) = (live[0], live[1].node_id());
    let order = OrderEpoch::new(999, 1);
    let fence = FenceRequest {
        topic: TOPIC.into(),
        segment: sealed.id,
        order,
    };
    let fence = fence.encode().unwrap().to_vec();
    let seal = SealRequest {
        topic: TOPIC.into(),
        segment: sealed.id,
        order,
        length: sealed.length.unwrap(),
    };
    let seal = seal.encode().unwrap().to_vec();
    let mut fenced = Vec::new();
    let mut seals_seen = Vec::new();
    for _ in 0..2 {
        let answer = asker
            .order_over_fabric(holder, "fence", fence.clone(), 2_000)
            .await
            .unwrap();
        fenced.push(FenceResponse::decode(&answer).unwrap());
        let answer = asker
            .order_over_fabric(holder, "seal", seal.clone(), 2_000)
            .await
            .unwrap();
        seals_seen.push(SealResponse::decode(&answer).unwrap());
    }
    assert_eq!(fenced[0], fenced[1]);
    assert_eq!(seals_seen[0], seals_seen[1]);
    assert!(seals_seen[0].refused.is_none(), "{:?}", seals_seen[0]);
    assert_eq!(
        seals_seen[0].sealed.as_ref().map(|s| s.length),
        sealed.length
    );
    assert_eq!(
        fenced[0].sealed.as_ref().map(|s| s.length),
        sealed.length,
        "{:?}",
        fenced[0]
    );

    // 3. The cluster port still serves the key (the fallback), with the
    // same answer.
    let by_port = asker
        .call_cluster_port(holder, SEAL_API_KEY, &seal, 2_000)
        .await
        .unwrap();
    assert_eq!(SealResponse::decode(&by_port).unwrap(), seals_seen[0]);

    // 4. The ADR's measurement: one seal order's round trip on each path.
    let fabric = time(LATENCY_SAMPLES, async || {
        asker
            .order_over_fabric(holder, "seal", seal.clone(), 2_000)
            .await
            .is_ok()
    })
    .await;
    let port = time(LATENCY_SAMPLES, async || {
        asker
            .call_cluster_port(holder, SEAL_API_KEY, &seal, 2_000)
            .await
            .is_ok()
    })
    .await;
    eprintln!("seal order over the node fabric: {fabric}");
    eprintln!("seal order over the cluster port: {port}");

    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}

/// A live `topic describe` asks the copies' brokers for replica status
/// over the node fabric (ADR 0133), not on the cluster port: the port's
/// key 105 serves nothing while describes run, and every copy answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_describe_asks_replica_status_over_the_node_fabric() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let brokers = start_stoppable(3, |node_id, seeds| config(root.path(), node_id, seeds)).await;
    create_replicated_topic(brokers[0].as_ref().unwrap().client_addr(), TOPIC, 3).await;
    let mut active = None;
    assert!(
        eventually(10_000, async || {
            active = topic_segments(&brokers).await.into_iter().next();
            active.is_some()
        })
        .await
    );
    let active = active.unwrap();
    let primary = brokers[(active.replicas[0] - 1) as usize].as_ref().unwrap();
    let mut client = TestClient::connect(primary.client_addr()).await;
    let records: Vec<_> = (0..5).map(|i| record("k", &format!("v{i}"))).collect();
    assert!(client.produce(TOPIC, &records).await.is_ok());
    assert!(
        eventually(20_000, async || fabric_meshed(&brokers).await).await,
        "the node fabric never connected every pair"
    );

    let port_served = |brokers: &[Option<BrokerHandle>]| -> u64 {
        brokers
            .iter()
            .flatten()
            .map(|b| b.cluster_port_served(REPLICA_STATUS_API_KEY))
            .sum()
    };
    let (by_port, by_fabric) = (port_served(&brokers), served(&brokers, "replica_status"));
    const DESCRIBES: usize = 5;
    for _ in 0..DESCRIBES {
        let described = client
            .call(&DescribeTopicRequest {
                name: TOPIC.into(),
                live: true,
            })
            .await
            .unwrap()
            .topic;
        let segment = described
            .ranges
            .iter()
            .flat_map(|r| &r.segments)
            .find(|s| s.id == active.id)
            .unwrap();
        let statuses: Vec<&str> = segment.copies.iter().map(|c| c.status.as_str()).collect();
        assert_eq!(statuses, ["live"; 3], "{segment:?}");
        assert!(
            segment.committed_end >= Some(records.len() as u64),
            "{segment:?}"
        );
    }
    // Each describe asked the two other holders; coordinators' probes
    // may add more, over the fabric too.
    assert!(
        served(&brokers, "replica_status") >= by_fabric + 2 * DESCRIBES as u64,
        "the describes' replica-status asks did not cross the fabric"
    );
    assert_eq!(
        port_served(&brokers),
        by_port,
        "a replica-status ask went on the cluster port"
    );

    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}

/// The actor guide's example (`fabric/greeter.rs`): an actor on each
/// broker that answers its peers over the node fabric.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guides_greeter_answers_its_peer_over_the_node_fabric() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let brokers = start_stoppable(2, |node_id, seeds| BrokerConfig {
        cluster: ClusterSettings {
            nodes: vec![1, 2],
            ..ClusterSettings::default()
        },
        ..config(root.path(), node_id, seeds)
    })
    .await;
    let (one, two) = (brokers[0].as_ref().unwrap(), brokers[1].as_ref().unwrap());
    one.start_greeter().await.unwrap();
    two.start_greeter().await.unwrap();
    assert!(
        eventually(20_000, async || one.greet(2).await.ok().as_deref()
            == Some("hello 1 from 2"))
        .await,
        "{:?}",
        one.greet(2).await
    );
    // Each direction's session learns the other's greeter on its own.
    assert!(
        eventually(20_000, async || two.greet(1).await.ok().as_deref()
            == Some("hello 2 from 1"))
        .await,
        "{:?}",
        two.greet(1).await
    );
    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}

/// Runs `call` `samples` times, one after another; its p50, p99 and max.
async fn time(samples: usize, mut call: impl AsyncFnMut() -> bool) -> String {
    let mut took = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        assert!(call().await);
        took.push(start.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    let us = |d: Duration| d.as_micros();
    format!(
        "p50 {} us, p99 {} us, max {} us ({samples} calls)",
        us(at(0.5)),
        us(at(0.99)),
        us(at(1.0))
    )
}
