//! A split under a pipelining producer does not stall it (issue 38): the
//! real client keeps a window of batches in flight over the whole keyspace
//! of a one-range topic on three brokers; the range is split by hand in the
//! middle of the load. The producer follows the split at once: its
//! refusals after the split stay few (not a retry loop until a backoff
//! cap), every record is acknowledged, and every acknowledged record reads
//! back once, in per-key order, through every broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use common::redirects::reader_at;
use common::topics::create_replicated;
use common::*;
use malachi_wire::RecordBatch;
use malachi_wire::batch::Record;
use malachi_wire::client::{Client, ClientConfig};

const TOPIC: &str = "split-under-load";
/// Keys spread over the keyspace, and records per batch (one of each key).
const KEYS: usize = 32;
/// Requests the producer keeps in flight.
const WINDOW: usize = 8;
/// Batches acknowledged before the split, and after it.
const BATCHES_BEFORE: u64 = 40;
const BATCHES_AFTER: u64 = 80;
/// The client's deadline for one call, and the producer's delivery timeout.
const DEADLINE_MS: u64 = 30_000;

fn batch(round: u64) -> Vec<Record> {
    (0..KEYS)
        .map(|k| record(&format!("key-{k}"), &format!("{round}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_under_a_pipelining_producer_does_not_stall_it() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| cluster_config(root.path(), node_id, seeds, &[1, 2, 3]))
            .await;
    let brokers = [&one, &two, &three];
    let mut admin = TestClient::connect(one.client_addr()).await;
    create_replicated(&mut admin, TOPIC).await;

    let config = ClientConfig {
        request_timeout_ms: DEADLINE_MS,
        ..ClientConfig::default()
    };
    let client = Client::connect_with([one.client_addr().to_string()], config)
        .await
        .unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut producer = client.producer(TOPIC, WINDOW);
            let mut produced = Vec::new();
            let mut acks: Vec<Instant> = Vec::new();
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let records = batch(round);
                let block = RecordBatch::from_records(&records, 1 << 20).unwrap();
                produced.extend(records);
                round += 1;
                if let Some(ack) = producer.send(block).await.unwrap() {
                    acked.fetch_add(u64::from(ack.records_acknowledged), Ordering::Relaxed);
                    acks.push(Instant::now());
                }
            }
            producer.flush().await.unwrap();
            (produced, acks)
        })
    };
    let per_batch = KEYS as u64;
    let started = eventually(60_000, async || {
        acked.load(Ordering::Relaxed) >= BATCHES_BEFORE * per_batch
    })
    .await;
    assert!(started, "the load never got going");
    let range = active_ranges(&mut admin, TOPIC).await[0];
    let refused_before = client.redirects_followed();
    let split_at = Instant::now();
    let split = client.split_range(TOPIC, range).await.unwrap();
    assert_eq!(split.children.len(), 2);
    let at_split = acked.load(Ordering::Relaxed);
    let after = eventually(60_000, async || {
        acked.load(Ordering::Relaxed) >= at_split + BATCHES_AFTER * per_batch
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let (produced, acks) = load.await.unwrap();
    let gap = acks
        .windows(2)
        .filter(|w| w[1] >= split_at)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let redirects = client.redirects_followed() - refused_before;
    eprintln!(
        "split took {:?}; longest gap between acknowledgements after it {gap:?}; {redirects} redirects",
        split_at.elapsed()
    );
    assert!(after, "the producer stalled after the split");

    for broker in brokers {
        let mut reader = reader_at(&brokers, broker, TOPIC).await;
        let got = read_all(&mut reader, TOPIC).await;
        assert_eq!(
            by_key(&got),
            by_key(&produced),
            "through broker {}",
            broker.node_id()
        );
    }
    drop((client, admin));
    for broker in [one, two, three] {
        broker.shutdown().await.unwrap();
    }
}
