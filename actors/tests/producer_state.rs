//! Idempotent-producer state across a range's life (ADR 0092), against an
//! in-process broker: it survives a roll and a restart, the children of a
//! split and the range of a merge inherit it (an older epoch is fenced, a
//! retry addressed to the old range is a duplicate or `moved`), a plain
//! produce spanning ranges answers once per range, and the Rust producer
//! pipelining 100,000 records keeps every key's order, exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::ErrorCode;
use malachi_wire::batch::{BatchBuilder, Record};
use malachi_wire::messages::*;

const TOPIC: &str = "events";
const PRODUCER: u64 = 7;

async fn describe(client: &mut TestClient) -> TopicDescription {
    client
        .call(&DescribeTopicRequest { name: TOPIC.into() })
        .await
        .unwrap()
        .topic
}

/// The id of the topic's only (or first active) range.
async fn first_range(client: &mut TestClient) -> u64 {
    describe(client)
        .await
        .ranges
        .iter()
        .find(|r| r.state == "active")
        .unwrap()
        .id
}

async fn range(client: &mut TestClient, id: u64) -> RangeDescription {
    describe(client)
        .await
        .ranges
        .into_iter()
        .find(|r| r.id == id)
        .unwrap()
}

/// A range's band as `[start, end)` in u128 (the top band ends at 2^64).
fn band(range: &RangeDescription) -> (u128, u128) {
    let parse = |text: &str| u128::from_str_radix(text.strip_prefix("0x").unwrap(), 16).unwrap();
    (parse(&range.band_start), parse(&range.band_end))
}

fn in_band(range: &RangeDescription, key: &str) -> bool {
    let (start, end) = band(range);
    let position = u128::from(malachi_cluster::model::position(key.as_bytes()));
    start <= position && position < end
}

/// The first of `k0`, `k1`, ... whose position falls in the range's band.
fn key_in(range: &RangeDescription) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|key| in_band(range, key))
        .unwrap()
}

fn records(key: &str, values: &[String]) -> Vec<Record> {
    values.iter().map(|v| record(key, v)).collect()
}

fn tagged(range: u64, epoch: u64, sequence: u64, records: &[Record]) -> ProduceRequest {
    let mut request = produce_request(TOPIC, records);
    request.producer = Some(ProducerBatch {
        producer_id: PRODUCER,
        epoch,
        range,
        sequence,
    });
    request
}

/// Sends a tagged batch that must be stored (not a duplicate).
async fn stored(client: &mut TestClient, range: u64, epoch: u64, sequence: u64, batch: &[Record]) {
    let answer = client
        .call(&tagged(range, epoch, sequence, batch))
        .await
        .unwrap_or_else(|e| panic!("sequence {sequence} to range {range} refused: {e:?}"));
    assert_eq!(answer.records_acknowledged as usize, batch.len());
    assert_eq!(answer.ranges.len(), 1, "{answer:?}");
    assert!(
        !answer.ranges[0].duplicate,
        "sequence {sequence}: {answer:?}"
    );
}

/// Sends a tagged batch that must be answered as a duplicate.
async fn duplicate(
    client: &mut TestClient,
    range: u64,
    epoch: u64,
    sequence: u64,
    batch: &[Record],
) {
    let answer = client
        .call(&tagged(range, epoch, sequence, batch))
        .await
        .unwrap_or_else(|e| panic!("retry of {sequence} to range {range} refused: {e:?}"));
    assert_eq!(answer.records_acknowledged as usize, batch.len());
    assert_eq!(answer.ranges.len(), 1, "{answer:?}");
    assert!(
        answer.ranges[0].duplicate,
        "retry of {sequence}: {answer:?}"
    );
}

/// Sends a tagged batch that must be refused with `code`.
async fn refused(
    client: &mut TestClient,
    range: u64,
    epoch: u64,
    sequence: u64,
    batch: &[Record],
    code: ErrorCode,
) {
    let refusal = client
        .call(&tagged(range, epoch, sequence, batch))
        .await
        .expect_err("a batch that must be refused was stored");
    assert_eq!(
        refusal.code, code,
        "epoch {epoch} sequence {sequence} to range {range}: {}",
        refusal.message
    );
}

/// Every record of the topic, from the start, page by page.
async fn fetch_all(client: &mut TestClient) -> Vec<Record> {
    let (mut all, mut cursor) = client.fetch(TOPIC, None, true, 10_000, 0).await.unwrap();
    loop {
        let (page, next) = client
            .fetch(TOPIC, Some(cursor), false, 10_000, 0)
            .await
            .unwrap();
        cursor = next;
        if page.is_empty() {
            break;
        }
        all.extend(page);
    }
    for r in &all {
        assert!(
            r.headers.iter().all(|h| !h.name.starts_with("malachi.")),
            "a consumer saw the broker's header"
        );
    }
    all
}

fn values(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_state_survives_a_roll_and_a_restart() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = || BrokerConfig {
        segment_bytes_max: 4 * 1024,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let id = first_range(&mut client).await;

    // Batches of 4 records of ~220 bytes: a 4 KiB segment rolls every few.
    let pad = "x".repeat(200);
    let batch = |sequence: u64| -> Vec<Record> {
        let values: Vec<_> = (0..4).map(|i| format!("{sequence}-{i}-{pad}")).collect();
        records("k", &values)
    };
    let mut sent = Vec::new();
    let mut next = 0;
    loop {
        stored(&mut client, id, 5, next, &batch(next)).await;
        sent.extend(batch(next));
        next += 1;
        let segments = range(&mut client, id).await.segments.len();
        if segments >= 3 && next >= 10 {
            break;
        }
        assert!(next < 500, "the range never rolled: {segments} segments");
    }
    let last = next - 1;

    // A retry from before the roll and one of the last batch are duplicates,
    // the next sequence is stored, a gap is refused.
    duplicate(&mut client, id, 5, 0, &batch(0)).await;
    duplicate(&mut client, id, 5, 1, &batch(1)).await;
    duplicate(&mut client, id, 5, last, &batch(last)).await;
    stored(&mut client, id, 5, next, &batch(next)).await;
    sent.extend(batch(next));
    next += 1;
    refused(
        &mut client,
        id,
        5,
        next + 1,
        &batch(next + 1),
        ErrorCode::SequenceGap,
    )
    .await;
    assert_eq!(values(&fetch_all(&mut client).await), values(&sent));

    // The same after a restart.
    drop(client);
    broker.shutdown().await.unwrap();
    let broker = start(config()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    assert!(range(&mut client, id).await.segments.len() >= 3);
    duplicate(&mut client, id, 5, 0, &batch(0)).await;
    duplicate(&mut client, id, 5, last, &batch(last)).await;
    duplicate(&mut client, id, 5, next - 1, &batch(next - 1)).await;
    refused(
        &mut client,
        id,
        5,
        next + 1,
        &batch(next + 1),
        ErrorCode::SequenceGap,
    )
    .await;
    stored(&mut client, id, 5, next, &batch(next)).await;
    sent.extend(batch(next));
    next += 1;
    duplicate(&mut client, id, 5, next - 1, &batch(next - 1)).await;
    // An older epoch is fenced, whatever segment last saw the producer.
    refused(
        &mut client,
        id,
        4,
        next,
        &batch(next),
        ErrorCode::ProducerFenced,
    )
    .await;
    let fetched = fetch_all(&mut client).await;
    assert_eq!(fetched.len(), sent.len());
    assert_eq!(values(&fetched), values(&sent));
    broker.shutdown().await.unwrap();
}
