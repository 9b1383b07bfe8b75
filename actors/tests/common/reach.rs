//! Whether a peer's cluster port is reached, as a broker shows it (ADR
//! 0155): its gauge and its `cluster status`, and a split that follows
//! the range's writer. Shared by `cluster_tls` and `cluster_port_reach`.
#![allow(dead_code)]

use std::time::Duration;

use malachi_actors::BrokerHandle;
use std::collections::BTreeMap;

use malachi_testkit::inproc::{
    TestClient, active_ranges, addr_of, by_key, create_replicated_topic, read_from_start, segments,
};
use malachi_testkit::wait::wait_until;
use malachi_wire::batch::Record;
use malachi_wire::messages::{ClusterStatusRequest, SplitRangeRequest};

/// `malachi_peer_cluster_port_reachable{peer}` on `broker`: `None` while
/// `broker` has not judged `peer` (never dialled).
pub fn reach_gauge(broker: &BrokerHandle, peer: u64) -> Option<u64> {
    let prefix = format!("malachi_peer_cluster_port_reachable{{peer=\"{peer}\"}}");
    broker
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// `peer`'s `cluster_port` in `broker`'s cluster status.
pub async fn cluster_port_of(broker: &BrokerHandle, peer: u64) -> String {
    let mut client = TestClient::connect(broker.client_addr()).await;
    match client.call(&ClusterStatusRequest {}).await {
        Ok(status) => status
            .brokers
            .into_iter()
            .find(|b| b.node_id == peer)
            .map(|b| b.cluster_port)
            .unwrap_or_default(),
        Err(refused) => format!("{refused:?}"),
    }
}

/// Waits until `broker` judges `peer`'s cluster port unreachable, by its
/// gauge and its cluster status.
pub async fn wait_unreachable(broker: &BrokerHandle, peer: u64) {
    wait_until(
        "a broker judges a peer's cluster port unreachable",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let gauge = reach_gauge(broker, peer);
            let status = cluster_port_of(broker, peer).await;
            if gauge == Some(0) && status == "unreachable" {
                Ok(())
            } else {
                Err((broker.node_id(), peer, gauge, status))
            }
        },
    )
    .await;
}

/// Splits `topic`'s one active range through `brokers`, following the
/// redirect to the broker that writes it (ADR 0141); its children.
pub async fn split_following(brokers: &[&BrokerHandle], topic: &str) -> Vec<u64> {
    let mut client = TestClient::connect(brokers[0].client_addr()).await;
    let ranges = active_ranges(&mut client, topic).await;
    assert_eq!(ranges.len(), 1, "{topic}: {ranges:?}");
    let mut node = brokers[0].node_id();
    wait_until(
        "a split is made",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let mut at = TestClient::connect(addr_of(brokers, node)).await;
            let split = SplitRangeRequest {
                topic: topic.into(),
                range_id: ranges[0],
            };
            match at.call(&split).await {
                Ok(done) => Ok(done.children),
                Err(refused) => {
                    // A redirect names the range's writer: one outside
                    // `brokers` (left out of placement) fails `addr_of`.
                    if let Some(next) = super::redirects::served_by(&refused) {
                        node = next;
                    }
                    Err(refused)
                }
            }
        },
    )
    .await
}

/// The workload of ADR 0155's tests: `good` brokers and one, `bad`, alive
/// in membership whose cluster port refuses them. Once each good broker
/// judges `bad` unreachable (and the others reachable), six topics of
/// three copies are created through the good brokers in turn, written,
/// split through another, written again. No segment, active or sealed,
/// names `bad`, and every acknowledged record reads back once, each key's
/// in order.
pub async fn guarded_workload(good: &[&BrokerHandle], bad: u64, prefix: &str) {
    // Each good broker has dialled `bad` and judged it unreachable, and
    // counts on the others.
    for b in good {
        wait_unreachable(b, bad).await;
        let others = good
            .iter()
            .map(|p| p.node_id())
            .filter(|p| *p != b.node_id());
        for peer in others {
            wait_until(
                "a good peer's cluster port is reachable",
                Duration::from_secs(30),
                Duration::from_millis(100),
                async || match (reach_gauge(b, peer), cluster_port_of(b, peer).await) {
                    (Some(1), status) if status == "reachable" => Ok(()),
                    other => Err(other),
                },
            )
            .await;
        }
    }
    // Topics of three copies through each good broker in turn, written,
    // split through another, written again.
    let topics: Vec<String> = (0..6).map(|i| format!("{prefix}-{i}")).collect();
    let mut client = TestClient::connect(good[0].client_addr()).await;
    for (i, topic) in topics.iter().enumerate() {
        create_replicated_topic(good[i % good.len()].client_addr(), topic, 3).await;
        let placed = segments(&mut client, topic).await.unwrap();
        assert!(
            placed.iter().all(|s| !s.replicas.contains(&bad)),
            "{topic} placed on broker {bad}: {placed:?}"
        );
    }
    let (lower, upper) = (
        super::redirects::keys(false, 3),
        super::redirects::keys(true, 3),
    );
    let mut produced: BTreeMap<&str, Vec<Record>> = BTreeMap::new();
    for round in 0..4 {
        for (i, topic) in topics.iter().enumerate() {
            if round == 2 {
                let rotated: Vec<&BrokerHandle> = (0..good.len())
                    .map(|k| good[(i + k + 1) % good.len()])
                    .collect();
                let children = split_following(&rotated, topic).await;
                assert_eq!(children.len(), 2, "{topic}");
            }
            for keys in [&lower, &upper] {
                let records = super::redirects::batch(keys, round, 3);
                super::redirects::produce_following(good, topic, &records).await;
                produced.entry(topic.as_str()).or_default().extend(records);
            }
        }
    }
    // No segment, active or sealed, of any topic names `bad`: not as a
    // copy, not as the primary (the first copy).
    for topic in &topics {
        let all = segments(&mut client, topic).await.unwrap();
        assert!(
            all.len() >= 3,
            "{topic}: the parent and two children: {all:?}"
        );
        for segment in &all {
            assert_eq!(segment.replicas.len(), 3, "{topic}: {segment:?}");
            assert!(!segment.replicas.contains(&bad), "{topic}: {segment:?}");
        }
    }
    // Every acknowledged record reads back once, each key's in order.
    for topic in &topics {
        let mut reader = super::redirects::reader_at(good, good[0], topic).await;
        let read = read_from_start(&mut reader, topic, 7).await.unwrap();
        let sent = &produced[topic.as_str()];
        assert_eq!(read.len(), sent.len(), "{topic}");
        assert_eq!(by_key(&read), by_key(sent), "{topic}");
    }
}

/// The first `count` of `brokers` (the good ones), once each is ready.
pub async fn ready_good(brokers: &[BrokerHandle], count: usize) -> Vec<&BrokerHandle> {
    let good: Vec<&BrokerHandle> = brokers[..count].iter().collect();
    for b in &good {
        assert!(
            b.wait_ready(60_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    good
}
