//! Splits and merges through any broker (issue 38, ADR 0141): four
//! brokers in two zones, a topic of two copies split in two, whose policy
//! first keeps its copies in zone `a`, then in zone `b`. Only the upper
//! range is written enough to roll, so its active segment moves to zone
//! `b`: the topic's ranges have different primaries. Before the fix, a
//! split of the upper range asked of the lower range's primary passed the
//! topic-level check (that broker writes a range of the topic), found no
//! writer of the upper range there to freeze, and answered `busy` until
//! the client's deadline. Now it answers `not_leader` naming the upper
//! range's primary, the client follows, and the split completes; the
//! split's children merge back through the same broker, and so do the
//! buddies whose halves brokers in two zones write (one half moves to the
//! other's primary first, ADR 0144). Every acknowledged record reads back
//! once, in key order, through every broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::redirects::*;
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};

use malachi_wire::batch::Record;
use malachi_wire::client::{Client, ClientConfig};
use malachi_wire::messages::{CreateTopicRequest, SplitRangeRequest};

const ZONES: [&str; 4] = ["a", "a", "b", "b"];
const TOPIC: &str = "reshaped";
/// Small enough that a few produces roll the segment.
const SEGMENT_BYTES_MAX: u64 = 2048;
/// The client's deadline for one split or merge.
const RESHAPE_DEADLINE_MS: u64 = 20_000;

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

/// An active range: its id, its active segment's primary and replicas.
type Active = (u64, u64, Vec<u64>);

/// The active ranges, in keyspace order.
async fn active(client: &mut TestClient) -> Vec<Active> {
    let Ok(described) = describe(client, TOPIC).await else {
        return Vec::new();
    };
    let mut ranges: Vec<(String, Active)> = described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| {
            let segment = r.segments.last()?;
            let primary = *segment.replicas.first()?;
            Some((
                r.band_start.clone(),
                (r.id, primary, segment.replicas.clone()),
            ))
        })
        .collect();
    ranges.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.0.cmp(&b.0)));
    ranges.into_iter().map(|(_, r)| r).collect()
}

/// Reads the topic from its start through every broker: every record
/// produced, once, each key's in the order produced.
async fn read_back_everywhere(brokers: &[&BrokerHandle], produced: &[Record]) {
    for broker in brokers {
        let mut reader = reader_at(brokers, broker, TOPIC).await;
        let read = read_from_start(&mut reader, TOPIC, 7)
            .await
            .unwrap_or_else(|e| panic!("the read through {} failed: {e:?}", broker.node_id()));
        assert_eq!(
            read.len(),
            produced.len(),
            "the read through broker {} ended short or doubled",
            broker.node_id()
        );
        assert_eq!(by_key(&read), by_key(produced));
    }
}

fn in_zone(replicas: &[u64], zone: &str) -> bool {
    replicas.iter().all(|n| ZONES[(*n - 1) as usize] == zone)
}

/// The real client, bootstrapped from `broker` only, as the CLI's default
/// flags are: whatever it does, it does by following the brokers' hints.
async fn client_at(broker: &BrokerHandle) -> Client {
    let config = ClientConfig {
        request_timeout_ms: RESHAPE_DEADLINE_MS,
        ..ClientConfig::default()
    };
    Client::connect_with([broker.client_addr().to_string()], config)
        .await
        .unwrap()
}

/// Brings the topic to two ranges whose active segments have different
/// primaries, lower in zone a and upper in zone b; returns the records
/// acknowledged on the way.
async fn two_primaries(brokers: &[&BrokerHandle], client: &mut TestClient) -> Vec<Record> {
    put_zone(brokers, "a").await;
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
    let (lower, upper) = (keys(false, 4), keys(true, 4));
    let mut produced = batch(&lower, 0, 6);
    produce_following(brokers, TOPIC, &produced).await;
    let whole = active(client).await[0].clone();
    assert!(
        eventually(30_000, async || {
            let mut at = TestClient::connect(addr_of(brokers, whole.1)).await;
            at.call(&SplitRangeRequest {
                topic: TOPIC.into(),
                range_id: whole.0,
            })
            .await
            .is_ok()
        })
        .await,
        "the split through the primary never completed"
    );
    put_zone(brokers, "b").await;
    let mut round = 10;
    loop {
        assert!(round < 300, "the upper range never rolled into zone b");
        let records = batch(&upper, round, 10);
        produce_following(brokers, TOPIC, &records).await;
        produced.extend(records);
        round += 1;
        let ranges = active(client).await;
        if ranges.len() == 2 && in_zone(&ranges[1].2, "b") {
            break;
        }
    }
    assert!(
        eventually(10_000, async || {
            let ranges = active(client).await;
            ranges.len() == 2 && in_zone(&ranges[1].2, "b") && in_zone(&ranges[0].2, "a")
        })
        .await
    );
    produced
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_or_merge_through_a_broker_that_does_not_write_the_range_completes() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three, four] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three, &four];
    let mut client = TestClient::connect(one.client_addr()).await;
    let mut produced = two_primaries(&brokers, &mut client).await;
    let ranges = active(&mut client).await;
    let (lower, upper) = (ranges[0].clone(), ranges[1].clone());
    assert_ne!(lower.1, upper.1, "different primaries: {ranges:?}");
    let elsewhere = brokers[(lower.1 - 1) as usize];
    let admin = client_at(elsewhere).await;

    // The upper range's split, asked of the lower range's primary.
    let split = admin
        .split_range(TOPIC, upper.0)
        .await
        .unwrap_or_else(|e| panic!("the split through broker {} failed: {e}", lower.1));
    assert_eq!(split.range_id, upper.0);
    assert_eq!(split.children.len(), 2);
    let upper_keys = keys(true, 8);
    for round in 400..403 {
        let records = batch(&upper_keys, round, 8);
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
    }
    read_back_everywhere(&brokers, &produced).await;

    // The children merge back through the same broker that writes
    // neither; whichever brokers write them, one half moves to the other's
    // primary first (ADR 0144).
    let merged = admin
        .merge_range(TOPIC, split.children[0])
        .await
        .unwrap_or_else(|e| panic!("the merge through broker {} failed: {e}", lower.1));
    let mut parents = merged.parents.clone();
    parents.sort_unstable();
    let mut children = split.children.clone();
    children.sort_unstable();
    assert_eq!(parents, children);
    let records = batch(&upper_keys, 500, 8);
    produce_following(&brokers, TOPIC, &records).await;
    produced.extend(records);
    read_back_everywhere(&brokers, &produced).await;

    // The buddies, written by brokers in two zones, merge too: asked of
    // the lower half's primary, it moves its half to the upper's (in zone
    // b, which the policy now names) and the client follows the redirect.
    let ranges = active(&mut client).await;
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_ne!(ranges[0].1, ranges[1].1, "{ranges:?}");
    let whole = admin
        .merge_range(TOPIC, ranges[0].0)
        .await
        .unwrap_or_else(|e| panic!("the merge across primaries failed: {e}"));
    assert_eq!(whole.parents.len(), 2);
    for records in [batch(&keys(false, 4), 600, 8), batch(&upper_keys, 600, 8)] {
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
    }
    read_back_everywhere(&brokers, &produced).await;

    drop((client, admin));
    for broker in [one, two, three, four] {
        broker.shutdown().await.unwrap();
    }
}

/// The zone policy, through every broker.
async fn put_zone(brokers: &[&BrokerHandle], zone: &str) {
    let addrs = brokers.iter().map(|b| b.client_addr());
    put_placement(addrs, "zoned", &[format!("zone in ({zone})")]).await;
}
