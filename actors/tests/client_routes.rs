//! The client goes straight to each range's primary (issue 38, ADR
//! 0142): four brokers in two zones, a topic of two copies split in two
//! whose lower range is written in zone `a` and upper range in zone `b`
//! (set up as `reshape_elsewhere` does: the zone policy moves, and only the
//! upper range is written until it rolls into zone `b`). The real client,
//! bootstrapped from a broker that writes neither range, produces keyed
//! records over both ranges: every record is acknowledged, the first batch
//! follows no redirect and the whole run at most `REDIRECTS_MAX` (not one
//! per batch), and every acknowledged record reads back once, in key order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::redirects::*;
use common::zones::*;
use common::*;
use malachi_actors::BrokerHandle;
use malachi_wire::RecordBatch;
use malachi_wire::batch::Record;
use malachi_wire::client::{Client, ClientConfig};

const TOPIC: &str = "routed";
/// The client's deadline for one call, and the producer's delivery timeout.
const DEADLINE_MS: u64 = 20_000;
/// Batches the real client produces, each over both ranges.
const BATCHES: usize = 40;
/// Keys per range in each batch.
const KEYS_PER_RANGE: usize = 4;
/// Redirects the whole run may follow: a few (a roll racing a part), never
/// one per batch.
const REDIRECTS_MAX: u64 = 2;

/// The real client, bootstrapped from `broker` only.
async fn client_at(broker: &BrokerHandle) -> Client {
    let config = ClientConfig {
        request_timeout_ms: DEADLINE_MS,
        ..ClientConfig::default()
    };
    Client::connect_with([broker.client_addr().to_string()], config)
        .await
        .unwrap()
}

/// Batch `round`: `KEYS_PER_RANGE` keys of each range, values naming the round.
fn keyed_over_both(round: usize) -> Vec<Record> {
    let (lower, upper) = (keys(false, KEYS_PER_RANGE), keys(true, KEYS_PER_RANGE));
    lower
        .iter()
        .chain(&upper)
        .map(|key| record(key, &format!("routed-{round}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_producer_writes_each_range_at_its_primary_without_a_redirect_per_batch() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three, four] =
        start_seeded(|node_id, seeds| zoned_config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three, &four];
    let mut admin = TestClient::connect(one.client_addr()).await;
    let mut produced = two_primaries(&brokers, &mut admin, TOPIC).await;
    // Both zones allowed from here: a roll keeps its range's primary.
    put_zones(&brokers, "zone in (a, b)").await;
    let ranges = active(&mut admin, TOPIC).await;
    let primaries = [ranges[0].1, ranges[1].1];
    assert!(
        ranges.len() == 2 && primaries[0] != primaries[1],
        "two ranges, two primaries: {ranges:?}"
    );
    // Bootstrapped from a broker that writes neither range, once its
    // replica of the metadata names both primaries.
    let elsewhere = *brokers
        .iter()
        .find(|b| !primaries.contains(&b.node_id()))
        .unwrap();
    let mut there = TestClient::connect(elsewhere.client_addr()).await;
    wait_until(
        "the bootstrap broker's range map",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let seen = active(&mut there, TOPIC).await;
            (seen == ranges).then_some(()).ok_or(seen)
        },
    )
    .await;
    let client = client_at(elsewhere).await;
    let mut producer = client.producer(TOPIC, 8);
    producer.set_delivery_timeout(Duration::from_millis(DEADLINE_MS));

    for round in 0..BATCHES {
        let records = keyed_over_both(round);
        let block = RecordBatch::from_records(&records, 1 << 20).unwrap();
        producer.send(block).await.unwrap();
        produced.extend(records);
        if round == 0 {
            producer.flush().await.unwrap();
            assert_eq!(
                client.redirects_followed(),
                0,
                "the first batch went straight to both primaries"
            );
        }
    }
    let acknowledged = producer.flush().await.unwrap();
    assert_eq!(acknowledged, (BATCHES * 2 * KEYS_PER_RANGE) as u64);
    let redirects = client.redirects_followed();
    assert!(
        redirects <= REDIRECTS_MAX,
        "{redirects} redirects followed for {BATCHES} batches over two ranges"
    );

    let mut reader = reader_at(&brokers, &one, TOPIC).await;
    let read = read_from_start(&mut reader, TOPIC, 7).await.unwrap();
    assert_eq!(read.len(), produced.len(), "every record once");
    assert_eq!(by_key(&read), by_key(&produced), "each key's in order");

    drop((client, admin, there, reader));
    for broker in [one, two, three, four] {
        broker.shutdown().await.unwrap();
    }
}
