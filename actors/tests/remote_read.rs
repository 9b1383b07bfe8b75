//! Reading a sealed segment the serving broker holds no copy of (chaos
//! finding F1, ADR 0118): four brokers in two zones, a topic of two copies
//! whose policy first keeps them in zone `a`, then in zone `b`. Small
//! segments roll often, so once the policy moves the topic is served by a
//! broker of zone `b`, which holds no copy of the sealed segments written
//! before. A read from the start through it must still return every
//! record, each key's in the order produced (the older segments' records
//! fetched from their holders over the cluster port), and from the other
//! holder once the first is gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_wire::batch::Record;
use malachi_wire::messages::CreateTopicRequest;

const ZONES: [&str; 4] = ["a", "a", "b", "b"];
const TOPIC: &str = "moved";
const KEYS: usize = 5;
/// Small enough that a few produces roll the segment.
const SEGMENT_BYTES_MAX: u64 = 2048;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        attributes: BTreeMap::from([("zone".to_owned(), ZONES[(node_id - 1) as usize].to_owned())]),
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3, 4],
            ..ClusterSettings::default()
        },
        segment_bytes_max: SEGMENT_BYTES_MAX,
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

/// The primary of `TOPIC`'s active segment, once one is active.
async fn primary(client: &mut TestClient) -> Option<(u64, Vec<u64>)> {
    let segments = segments(client, TOPIC).await.ok()?;
    let active = segments.iter().find(|s| s.state == "active")?;
    Some((*active.replicas.first()?, active.replicas.clone()))
}

/// Produces `records` through the topic's primary, retrying refusals (a
/// roll in progress, a primary moving): a refused produce wrote nothing.
async fn produce(brokers: &[&BrokerHandle], client: &mut TestClient, records: &[Record]) {
    let poll = std::time::Duration::from_millis(50);
    wait_until(
        "a produce is acknowledged",
        std::time::Duration::from_secs(20),
        poll,
        async || {
            let Some((node, _)) = primary(client).await else {
                return false;
            };
            let mut writer = TestClient::connect(addr_of(brokers, node)).await;
            writer.produce(TOPIC, records).await.is_ok()
        },
    )
    .await;
}

fn batch(round: usize, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let key = format!("k{}", i % KEYS);
            record(&key, &format!("{round}-{i}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sealed_segment_with_no_copy_on_the_serving_broker_is_read_from_its_holders() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three, four] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three, &four];
    let mut client = TestClient::connect(one.client_addr()).await;
    put_zone(&brokers, "a").await;
    // Every broker gossips its zone before placement can use it.
    assert!(
        eventually(30_000, async || client
            .call(&CreateTopicRequest {
                name: TOPIC.into(),
                replication_factor: Some(2),
                policy: Some("zoned".into()),
            })
            .await
            .is_ok())
        .await
    );
    let mut produced = Vec::new();
    let in_zone =
        |replicas: &[u64], zone: &str| replicas.iter().all(|n| ZONES[(*n - 1) as usize] == zone);
    let (_, replicas) = primary(&mut client).await.unwrap();
    assert!(in_zone(&replicas, "a"), "{replicas:?}");
    for round in 0..12 {
        let records = batch(round, 10);
        produce(&brokers, &mut client, &records).await;
        produced.extend(records);
    }
    let zone_a: Vec<_> = segments(&mut client, TOPIC)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.state == "sealed")
        .collect();
    assert!(!zone_a.is_empty(), "the segment never rolled");

    // The policy moves to zone b: the next rolls place the segments there.
    put_zone(&brokers, "b").await;
    let mut round = 12;
    loop {
        assert!(round < 200, "no segment was ever placed in zone b");
        let records = batch(round, 10);
        produce(&brokers, &mut client, &records).await;
        produced.extend(records);
        round += 1;
        let (_, replicas) = primary(&mut client).await.unwrap();
        if in_zone(&replicas, "b") {
            break;
        }
    }
    // A last roll, if the last produce started one, settles: the same
    // primary, in zone b, on two checks in a row.
    let mut seen = None;
    let serving = wait_until(
        "the active segment settles in zone b",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(250),
        async || {
            let now = primary(&mut client).await;
            let previous = std::mem::replace(&mut seen, now.clone());
            match now {
                Some((serving, replicas))
                    if previous == Some((serving, replicas.clone())) && in_zone(&replicas, "b") =>
                {
                    Ok(serving)
                }
                other => Err(other),
            }
        },
    )
    .await;
    let mut reader = TestClient::connect(addr_of(&brokers, serving)).await;
    let read = read_from_start(&mut reader, TOPIC, 7)
        .await
        .unwrap_or_else(|e| panic!("the read from the start was refused: {e:?}"));
    assert_eq!(read.len(), produced.len());
    assert_eq!(by_key(&read), by_key(&produced));
    // A subscription from the start reads them too.
    let mut subscriber = TestClient::connect(addr_of(&brokers, serving)).await;
    let pushed = subscribe_from_start(&mut subscriber, TOPIC, produced.len()).await;
    assert_eq!(by_key(&pushed), by_key(&produced));
    drop(subscriber);

    // With broker 1 gone, broker 2 serves every zone-a segment's records.
    drop(client);
    drop(reader);
    one.shutdown().await.unwrap();
    let mut reader = TestClient::connect(addr_of(&[&two, &three, &four], serving)).await;
    let read = read_from_start(&mut reader, TOPIC, 7)
        .await
        .unwrap_or_else(|e| panic!("the read without broker 1 was refused: {e:?}"));
    assert_eq!(by_key(&read), by_key(&produced));
    for broker in [two, three, four] {
        broker.shutdown().await.unwrap();
    }
}

/// The zone policy, through every broker.
async fn put_zone(brokers: &[&BrokerHandle], zone: &str) {
    let addrs = brokers.iter().map(|b| b.client_addr());
    put_placement(addrs, "zoned", &[format!("zone in ({zone})")]).await;
}
