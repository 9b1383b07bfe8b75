//! Topics split and merge themselves by write rate (issue 38 L11, ADR
//! 0143), on three brokers with thresholds small enough for a test:
//!
//! - a topic under sustained load over many keys splits itself at least
//!   once, the split is counted by reason and listed in `topic describe`;
//! - a topic whose load is one key is not split: the hot key is counted
//!   and shown instead, however long the load lasts;
//! - the load goes on until the topic's ranges are written by all three
//!   brokers (a split's children go to two brokers, ADR 0144);
//! - once the load stops, the idle buddies merge back into one range,
//!   though different brokers write them (the idle upper half moves to its
//!   buddy's writer, which merges them);
//! - every acknowledged record reads back once, in per-key order, through
//!   every broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::redirects::produce_following;
use common::topics::create_replicated;
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ReshapeDefaults};
use malachi_wire::batch::Record;
use malachi_wire::messages::TopicReshaping;

const KEYED: &str = "keyed";
const HOT: &str = "hot";
/// Bytes per second above which a range splits: a few produces a second.
const SPLIT_BYTES_PER_SECOND: u64 = 4_000;
/// Records per produce, each one key's, and each value's bytes.
const BATCH_RECORDS: usize = 8;
const VALUE_BYTES: usize = 200;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        reshape: ReshapeDefaults {
            auto_reshape: true,
            split_write_bytes_per_second: SPLIT_BYTES_PER_SECOND,
            split_after_ms: 1_000,
            merge_write_bytes_per_second: 200,
            merge_after_ms: 2_000,
            reshape_interval_ms: 2_000,
            ranges_min: 1,
            ranges_max: 4,
            reshape_check_interval_ms: 200,
            rate_window_ms: 1_000,
        },
        ..cluster_config(dir, node_id, seeds, &[1, 2, 3])
    }
}

/// One produce's records: all of `key`, so a produce is one range's.
fn batch(key: &str, round: usize) -> Vec<Record> {
    let pad = "x".repeat(VALUE_BYTES);
    (0..BATCH_RECORDS)
        .map(|i| record(key, &format!("{round}-{i}-{pad}")))
        .collect()
}

/// The topic's reshaping as all brokers together know it: each answers
/// for the ranges it writes and the reshapes it asked for.
async fn reshaping(brokers: &[&BrokerHandle], topic: &str) -> TopicReshaping {
    let mut all = TopicReshaping::default();
    for broker in brokers {
        let mut client = TestClient::connect(broker.client_addr()).await;
        if let Ok(d) = describe(&mut client, topic).await
            && let Some(r) = d.reshaping
        {
            all.rates.extend(r.rates);
            all.history.extend(r.history);
        }
    }
    all
}

/// The sum over brokers of a labelled metric's lines containing `labels`.
fn metric(brokers: &[&BrokerHandle], name: &str, labels: &str) -> u64 {
    brokers
        .iter()
        .flat_map(|b| {
            b.metrics_text()
                .lines()
                .filter(|l| l.starts_with(name) && l.contains(labels))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .collect::<Vec<_>>()
        })
        .sum()
}

/// The brokers writing the topic's active ranges.
async fn primaries(client: &mut TestClient, topic: &str) -> std::collections::BTreeSet<u64> {
    let Ok(described) = describe(client, topic).await else {
        return Default::default();
    };
    described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| r.segments.last()?.replicas.first().copied())
        .collect()
}

async fn active_count(client: &mut TestClient, topic: &str) -> usize {
    active_ranges(client, topic).await.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_splits_under_load_not_for_one_hot_key_and_merges_back_when_idle() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three];
    let mut client = TestClient::connect(one.client_addr()).await;
    create_replicated(&mut client, KEYED).await;
    create_replicated(&mut client, HOT).await;

    // Sustained load over many keys: the topic splits itself.
    let keys: Vec<String> = (0..32).map(|i| format!("key-{i}")).collect();
    let mut produced = Vec::new();
    let mut round = 0;
    while active_count(&mut client, KEYED).await < 2 {
        assert!(round < 5_000, "the loaded topic never split itself");
        let records = batch(&keys[round % keys.len()], round);
        produce_following(&brokers, KEYED, &records).await;
        produced.extend(records);
        round += 1;
    }
    // The split applied before the reshaper heard back: its count and
    // history follow within the request's answer.
    let counted = eventually(10_000, async || {
        metric(
            &brokers,
            "malachi_auto_reshapes_total",
            "reason=\"write_rate_high\"",
        ) >= 1
            && reshaping(&brokers, KEYED)
                .await
                .history
                .iter()
                .any(|e| e.kind == "split" && e.refused.is_none() && e.children.len() == 2)
    })
    .await;
    assert!(
        counted,
        "the split is counted by reason and in the topic's history"
    );

    // The load goes on until the topic's writes spread over every broker:
    // a split's children go to two brokers (ADR 0144).
    while primaries(&mut client, KEYED).await.len() < 3 {
        assert!(
            round < 20_000,
            "the topic's writes never spread over every broker"
        );
        let records = batch(&keys[round % keys.len()], round);
        produce_following(&brokers, KEYED, &records).await;
        produced.extend(records);
        round += 1;
    }

    // One hot key: counted and shown, never split, however long it lasts.
    let mut hot_produced = Vec::new();
    let mut hot_round = 0;
    while metric(
        &brokers,
        "malachi_range_hot_key_unsplittable_total",
        "topic=\"hot\"",
    ) == 0
    {
        assert!(hot_round < 5_000, "the hot key was never reported");
        let records = batch("the-one-key", hot_round);
        produce_following(&brokers, HOT, &records).await;
        hot_produced.extend(records);
        hot_round += 1;
    }
    let hot_seen = reshaping(&brokers, HOT).await;
    assert!(
        hot_seen.rates.iter().any(|r| r.hot_key_unsplittable),
        "describe shows the hot key: {hot_seen:?}"
    );
    // As long again under the same load: still one range.
    for extra in 0..hot_round {
        let records = batch("the-one-key", hot_round + extra);
        produce_following(&brokers, HOT, &records).await;
        hot_produced.extend(records);
    }
    assert_eq!(
        active_count(&mut client, HOT).await,
        1,
        "a hot key is never split"
    );

    // The load stops: the idle buddies merge back into one range, though
    // two brokers write them (one half moves to the other's writer first,
    // ADR 0144), and each merge is counted.
    let merged = eventually(120_000, async || {
        active_count(&mut client, KEYED).await == 1
            && metric(&brokers, "malachi_auto_reshapes_total", "kind=\"merge\"") >= 1
    })
    .await;
    assert!(merged, "the idle buddies never merged back into one range");

    // Every acknowledged record, once, in per-key order, through every broker.
    for (topic, records) in [(KEYED, &produced), (HOT, &hot_produced)] {
        for broker in brokers {
            let mut reader = common::redirects::reader_at(&brokers, broker, topic).await;
            let read = read_from_start(&mut reader, topic, 64).await.unwrap();
            assert_eq!(
                read.len(),
                records.len(),
                "{topic} through {}",
                broker.node_id()
            );
            assert_eq!(
                by_key(&read),
                by_key(records),
                "{topic} through {}",
                broker.node_id()
            );
        }
    }
    drop(client);
    for broker in [one, two, three] {
        broker.shutdown().await.unwrap();
    }
}
