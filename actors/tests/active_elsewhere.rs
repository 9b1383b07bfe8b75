//! Reads range by range (issue 36, ADR 0123): five brokers in three zones,
//! a topic of two copies split in two, whose policy first keeps its copies
//! in zone `a`, then in zone `b`. Only the upper range is written enough to
//! roll, so its active segment moves to zone `b` while the lower range's
//! stays in zone `a`: the topic's active segments have different primaries,
//! and broker 5 (zone `c`) holds no copy of anything. Before the fix, the
//! broker serving a read silently ended the range whose active segment it
//! held no copy of: a reader believed it had caught up, records short.
//! Now a read through every broker, from the start, by fetch and by
//! subscription, returns every acknowledged record, each key's in order,
//! and a tail reader started at any broker sees the records produced after
//! it started, in both ranges.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::redirects::*;
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_wire::ErrorCode;
use malachi_wire::batch::Record;
use malachi_wire::messages::{CreateTopicRequest, SplitRangeRequest};

const ZONES: [&str; 5] = ["a", "a", "b", "b", "c"];
const TOPIC: &str = "spread";
/// Small enough that a few produces roll the segment.
const SEGMENT_BYTES_MAX: u64 = 2048;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        attributes: BTreeMap::from([("zone".to_owned(), ZONES[(node_id - 1) as usize].to_owned())]),
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3, 4, 5],
            ..ClusterSettings::default()
        },
        segment_bytes_max: SEGMENT_BYTES_MAX,
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

/// The active ranges' (id, band start, primary, replicas), in keyspace
/// order.
async fn active(client: &mut TestClient) -> Vec<(u64, String, u64, Vec<u64>)> {
    let Ok(described) = describe(client, TOPIC).await else {
        return Vec::new();
    };
    described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| {
            let segment = r.segments.last()?;
            Some((
                r.id,
                r.band_start.clone(),
                *segment.replicas.first()?,
                segment.replicas.clone(),
            ))
        })
        .collect()
}

fn in_zone(replicas: &[u64], zone: &str) -> bool {
    replicas.iter().all(|n| ZONES[(*n - 1) as usize] == zone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_broker_reads_every_range_when_active_segments_have_different_primaries() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three, four, five] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three, &four, &five];
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
    let (lower, upper) = (keys(false, 4), keys(true, 4));
    let mut produced = batch(&lower, 0, 6);
    produce_following(&brokers, TOPIC, &produced).await;
    // Split the only range, through its primary.
    let whole = active(&mut client).await[0].clone();
    assert!(
        eventually(30_000, async || {
            let mut at = TestClient::connect(addr_of(&brokers, whole.2)).await;
            at.call(&SplitRangeRequest {
                topic: TOPIC.into(),
                range_id: whole.0,
            })
            .await
            .is_ok()
        })
        .await,
        "the split never completed"
    );
    assert!(eventually(30_000, async || active(&mut client).await.len() == 2).await);
    for round in 1..3 {
        let records = batch(&lower, round, 3);
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
    }

    // The policy moves to zone b; only the upper range is written enough
    // to roll, so only its active segment moves there.
    put_zone(&brokers, "b").await;
    let mut round = 10;
    loop {
        assert!(round < 300, "the upper range never rolled into zone b");
        let records = batch(&upper, round, 10);
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
        round += 1;
        let ranges = active(&mut client).await;
        if ranges.len() == 2 && in_zone(&ranges[1].3, "b") {
            break;
        }
    }
    // A last roll, if the last produce started one, settles.
    assert!(
        eventually(10_000, async || {
            let ranges = active(&mut client).await;
            ranges.len() == 2 && in_zone(&ranges[1].3, "b") && in_zone(&ranges[0].3, "a")
        })
        .await
    );
    let ranges = active(&mut client).await;
    assert_ne!(
        ranges[0].2, ranges[1].2,
        "the ranges' active segments have different primaries: {ranges:?}"
    );
    // Records of the upper range sent to the lower range's primary are
    // refused at once, naming the upper range's primary. Before, the broker
    // held them for a writer that never starts there until the produce
    // timed out, and a producer of both ranges stalled (the five-broker
    // long run, issue 36).
    let mut at_lower = TestClient::connect(addr_of(&brokers, ranges[0].2)).await;
    let refused = at_lower
        .produce(TOPIC, &batch(&upper, 98, 2))
        .await
        .expect_err("the lower range's primary does not write the upper range");
    assert_eq!(refused.code, ErrorCode::NotLeader, "{refused:?}");
    assert_eq!(served_by(&refused), Some(ranges[1].2), "{refused:?}");
    // The lower range is written again: its active segment, still in
    // zone a, holds records no zone-b broker has a copy of.
    let records = batch(&lower, 99, 3);
    produce_following(&brokers, TOPIC, &records).await;
    produced.extend(records);

    // A fresh read from the start through every broker returns every
    // record, each key's in the order produced.
    for broker in brokers {
        let mut reader = reader_at(&brokers, broker, TOPIC).await;
        let read = read_from_start(&mut reader, TOPIC, 7)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "the read through broker {} was refused: {e:?}",
                    broker.node_id()
                )
            });
        assert_eq!(
            read.len(),
            produced.len(),
            "the read through broker {} ended short",
            broker.node_id()
        );
        assert_eq!(by_key(&read), by_key(&produced));
    }
    // A subscription through broker 5, which holds no copy of anything.
    let mut subscriber = reader_at(&brokers, &five, TOPIC).await;
    let pushed = subscribe_from_start(&mut subscriber, TOPIC, produced.len()).await;
    assert_eq!(by_key(&pushed), by_key(&produced));
    drop(subscriber);

    // A tail reader started at any broker sees what comes after, in both
    // ranges (its start is each range's end, asked of the holders where
    // the serving broker has no copy).
    let mut tail = reader_at(&brokers, &five, TOPIC).await;
    let (old, cursor) = tail.fetch(TOPIC, None, false, 100, 0).await.unwrap();
    assert!(
        old.is_empty(),
        "a tail reader starts after the records before it"
    );
    let later: Vec<Record> = batch(&lower, 200, 2)
        .into_iter()
        .chain(batch(&upper, 201, 2))
        .collect();
    produce_following(&brokers, TOPIC, &later[..2]).await;
    produce_following(&brokers, TOPIC, &later[2..]).await;
    let mut seen = Vec::new();
    let mut cursor = cursor;
    assert!(
        eventually(20_000, async || {
            let (page, next) = tail
                .fetch(TOPIC, Some(cursor.clone()), false, 100, 200)
                .await
                .unwrap();
            seen.extend(page);
            cursor = next;
            seen.len() >= later.len()
        })
        .await,
        "the tail reader saw {} of {} later records",
        seen.len(),
        later.len()
    );
    assert_eq!(by_key(&seen), by_key(&later));
    drop((client, tail));
    for broker in [one, two, three, four, five] {
        broker.shutdown().await.unwrap();
    }
}

/// The zone policy, through every broker.
async fn put_zone(brokers: &[&BrokerHandle], zone: &str) {
    let addrs = brokers.iter().map(|b| b.client_addr());
    put_placement(addrs, "zoned", &[format!("zone in ({zone})")]).await;
}
