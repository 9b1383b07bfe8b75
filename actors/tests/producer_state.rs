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
        .call(&DescribeTopicRequest {
            name: TOPIC.into(),
            live: false,
        })
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
    let position = u128::from(malachi_core::model::position(key.as_bytes()));
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

/// Everything the topic holds is `sent`, once, each key's records in send order.
async fn assert_stored_per_key(client: &mut TestClient, sent: &[Record]) {
    let fetched = fetch_all(client).await;
    assert_eq!(fetched.len(), sent.len());
    assert_eq!(by_key(&fetched), by_key(sent));
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

/// The log of the only segment copy under `dir` that holds records.
fn only_log(dir: &std::path::Path) -> std::path::PathBuf {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "log")
                && std::fs::metadata(&path).unwrap().len() > 0
            {
                out.push(path);
            }
        }
    }
    let mut logs = Vec::new();
    walk(dir, &mut logs);
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs.remove(0)
}

/// Where each frame of a log ends, in bytes.
fn frame_ends(log: &[u8]) -> Vec<u64> {
    let (mut at, mut ends) = (0usize, Vec::new());
    while at < log.len() {
        let (_, len) = malachi_storage::frame::decode(&log[at..]).unwrap();
        at += len;
        ends.push(at as u64);
    }
    ends
}

/// A crash can stop the one write that carries a batch part way (`kill -9`
/// can: the kernel returns a short write to a dying process; a power loss
/// can persist any of its pages), leaving a prefix of the batch without the
/// last record that carries its tag. The range must not keep that prefix:
/// the table has the batch as not stored, so its retry is stored whole, and
/// the prefix would be there twice. Whether the log ends inside a frame
/// (recovery drops the torn frame) or between two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_a_crash_tore_is_stored_once_by_its_retry() {
    init_tracing();
    let batch = |sequence: u64| -> Vec<Record> {
        let values: Vec<_> = (0..4).map(|i| format!("{sequence}-{i}")).collect();
        records("k", &values)
    };
    for inside_a_frame in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let broker = start(BrokerConfig::for_tests(dir.path())).await;
        let mut client = TestClient::connect(broker.client_addr()).await;
        client.create_topic(TOPIC).await;
        let id = first_range(&mut client).await;
        stored(&mut client, id, 5, 0, &batch(0)).await;
        stored(&mut client, id, 5, 1, &batch(1)).await;
        drop(client);
        broker.shutdown().await.unwrap();

        // The crash: the write of batch 1 stopped after 2 of its 4 records
        // (and, the first time, part way into the 3rd).
        let log = only_log(dir.path());
        let ends = frame_ends(&std::fs::read(&log).unwrap());
        assert_eq!(ends.len(), 8, "two batches of 4");
        let cut = if inside_a_frame {
            ends[5] + (ends[6] - ends[5]) / 2
        } else {
            ends[5]
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&log)
            .unwrap()
            .set_len(cut)
            .unwrap();

        let broker = start(BrokerConfig::for_tests(dir.path())).await;
        let mut client = TestClient::connect(broker.client_addr()).await;
        // Its tag was lost: the retry is stored, and the next batch after it.
        stored(&mut client, id, 5, 1, &batch(1)).await;
        stored(&mut client, id, 5, 2, &batch(2)).await;
        duplicate(&mut client, id, 5, 1, &batch(1)).await;
        let sent = [batch(0), batch(1), batch(2)].concat();
        assert_eq!(
            values(&fetch_all(&mut client).await),
            values(&sent),
            "torn inside a frame: {inside_a_frame}"
        );
        drop(client);
        broker.shutdown().await.unwrap();
    }
}

/// Splits the topic's first range; its children, lower band first.
async fn split(client: &mut TestClient, id: u64) -> (RangeDescription, RangeDescription) {
    let split = client
        .call(&SplitRangeRequest {
            topic: TOPIC.into(),
            range_id: id,
        })
        .await
        .unwrap();
    assert_eq!(split.children.len(), 2);
    let lower = range(client, split.children[0]).await;
    let upper = range(client, split.children[1]).await;
    assert_eq!(lower.state, "active");
    assert_eq!(upper.state, "active");
    (lower, upper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_children_of_a_split_fence_an_older_epoch_and_start_their_own_streams() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let parent = first_range(&mut client).await;

    // Epoch 9 writes to the parent, with keys of both halves.
    let spread = |round: u64| -> Vec<Record> {
        (0..10)
            .map(|i| record(&format!("k{i}"), &format!("p{round}-{i}")))
            .collect()
    };
    let mut sent = Vec::new();
    for sequence in 0..2 {
        stored(&mut client, parent, 9, sequence, &spread(sequence)).await;
        sent.extend(spread(sequence));
    }
    let (lower, upper) = split(&mut client, parent).await;
    let key_lower = key_in(&lower);
    let key_upper = key_in(&upper);

    for (child, key) in [(&lower, &key_lower), (&upper, &key_upper)] {
        let zombie = records(key, &[format!("zombie-{}", child.id)]);
        refused(
            &mut client,
            child.id,
            5,
            0,
            &zombie,
            ErrorCode::ProducerFenced,
        )
        .await;
        // A child's own stream starts at 0; its retry is a duplicate, and
        // its next batch must not skip.
        let first = records(
            key,
            &[format!("c{}-0", child.id), format!("c{}-1", child.id)],
        );
        stored(&mut client, child.id, 9, 0, &first).await;
        sent.extend(first.clone());
        duplicate(&mut client, child.id, 9, 0, &first).await;
        let skip = records(key, &[format!("skip-{}", child.id)]);
        refused(&mut client, child.id, 9, 2, &skip, ErrorCode::SequenceGap).await;
    }
    // The parent's batches are still recognised, and its next one moved.
    duplicate(&mut client, parent, 9, 1, &spread(1)).await;
    refused(&mut client, parent, 9, 2, &spread(2), ErrorCode::Moved).await;
    refused(
        &mut client,
        parent,
        5,
        2,
        &spread(2),
        ErrorCode::ProducerFenced,
    )
    .await;

    assert_stored_per_key(&mut client, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_merged_range_fences_an_older_epoch_and_answers_retries_to_its_parents() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let root = first_range(&mut client).await;
    let (lower, upper) = split(&mut client, root).await;
    let key_lower = key_in(&lower);
    let key_upper = key_in(&upper);
    let batch = |key: &str, name: &str| records(key, &[format!("{name}-a"), format!("{name}-b")]);

    // Epoch 9 writes twice to the lower child, once to the upper.
    let lower_0 = batch(&key_lower, "lower0");
    let lower_1 = batch(&key_lower, "lower1");
    let upper_0 = batch(&key_upper, "upper0");
    stored(&mut client, lower.id, 9, 0, &lower_0).await;
    stored(&mut client, lower.id, 9, 1, &lower_1).await;
    stored(&mut client, upper.id, 9, 0, &upper_0).await;
    let mut sent = [lower_0.clone(), lower_1.clone(), upper_0.clone()].concat();

    let merged = client
        .call(&MergeRangeRequest {
            topic: TOPIC.into(),
            range_id: lower.id,
        })
        .await
        .unwrap();
    assert_eq!(merged.parents, vec![lower.id, upper.id]);
    let merged = merged.range_id;
    assert_eq!(range(&mut client, merged).await.state, "active");

    refused(
        &mut client,
        merged,
        5,
        0,
        &batch(&key_lower, "zombie"),
        ErrorCode::ProducerFenced,
    )
    .await;
    let merged_0 = [batch(&key_lower, "merged0"), batch(&key_upper, "merged0")].concat();
    stored(&mut client, merged, 9, 0, &merged_0).await;
    sent.extend(merged_0.clone());
    duplicate(&mut client, merged, 9, 0, &merged_0).await;
    // Retries addressed to the old children: stored ones are duplicates,
    // ones they never stored are `moved`.
    duplicate(&mut client, lower.id, 9, 0, &lower_0).await;
    duplicate(&mut client, lower.id, 9, 1, &lower_1).await;
    duplicate(&mut client, upper.id, 9, 0, &upper_0).await;
    let never = batch(&key_lower, "never");
    refused(&mut client, lower.id, 9, 2, &never, ErrorCode::Moved).await;
    let never_upper = batch(&key_upper, "never");
    refused(&mut client, upper.id, 9, 1, &never_upper, ErrorCode::Moved).await;
    assert_stored_per_key(&mut client, &sent).await;

    // All of it survives a restart.
    drop(client);
    broker.shutdown().await.unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    refused(
        &mut client,
        merged,
        5,
        1,
        &batch(&key_upper, "zombie"),
        ErrorCode::ProducerFenced,
    )
    .await;
    duplicate(&mut client, merged, 9, 0, &merged_0).await;
    duplicate(&mut client, lower.id, 9, 1, &lower_1).await;
    duplicate(&mut client, upper.id, 9, 0, &upper_0).await;
    refused(&mut client, lower.id, 9, 2, &never, ErrorCode::Moved).await;
    refused(&mut client, upper.id, 9, 1, &never_upper, ErrorCode::Moved).await;
    let merged_1 = batch(&key_upper, "merged1");
    stored(&mut client, merged, 9, 1, &merged_1).await;
    sent.extend(merged_1.clone());
    duplicate(&mut client, merged, 9, 1, &merged_1).await;
    assert_stored_per_key(&mut client, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_produce_across_a_split_answers_once_per_range_in_range_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let root = first_range(&mut client).await;

    // One range: one outcome.
    let before: Vec<_> = (0..10)
        .map(|i| record(&format!("k{i}"), &format!("before-{i}")))
        .collect();
    let answer = client.call(&produce_request(TOPIC, &before)).await.unwrap();
    assert_eq!(answer.records_acknowledged, 10);
    assert_eq!(answer.ranges.len(), 1, "{answer:?}");
    assert_eq!(answer.ranges[0].range, root);
    assert_eq!(answer.ranges[0].records_acknowledged, 10);
    assert_eq!(answer.ranges[0].error_code, 0);

    let (lower, upper) = split(&mut client, root).await;
    let spanning: Vec<_> = (0..50)
        .map(|i| record(&format!("k{i}"), &format!("after-{i}")))
        .collect();
    let expected: Vec<(u64, u32)> = [&lower, &upper]
        .into_iter()
        .map(|r| {
            let count = (0..50).filter(|i| in_band(r, &format!("k{i}"))).count();
            (r.id, count as u32)
        })
        .filter(|(_, count)| *count > 0)
        .collect();
    assert_eq!(expected.len(), 2, "k0..k49 all fell in one half");
    let answer = client
        .call(&produce_request(TOPIC, &spanning))
        .await
        .unwrap();
    assert_eq!(answer.records_acknowledged, 50);
    let outcomes: Vec<(u64, u32)> = answer
        .ranges
        .iter()
        .map(|o| (o.range, o.records_acknowledged))
        .collect();
    let mut in_order = expected.clone();
    in_order.sort_unstable();
    assert_eq!(outcomes, in_order, "{answer:?}");
    for outcome in &answer.ranges {
        assert_eq!(outcome.error_code, 0, "{outcome:?}");
        assert!(!outcome.duplicate, "{outcome:?}");
        assert_eq!(outcome.message, None, "{outcome:?}");
    }
    let total: u32 = answer.ranges.iter().map(|o| o.records_acknowledged).sum();
    assert_eq!(total, answer.records_acknowledged);

    let fetched = fetch_all(&mut client).await;
    let sent = [before, spanning].concat();
    assert_eq!(fetched.len(), sent.len());
    assert_eq!(by_key(&fetched), by_key(&sent));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_producer_pipelines_100k_records_over_two_ranges_in_key_order_exactly_once() {
    const RECORDS: u64 = 100_000;
    const KEYS: u64 = 100;
    const PER_BATCH: u64 = 100;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let root = first_range(&mut client).await;
    let (lower, upper) = split(&mut client, root).await;
    assert!((0..KEYS).any(|k| in_band(&lower, &format!("k{k}"))));
    assert!((0..KEYS).any(|k| in_band(&upper, &format!("k{k}"))));

    let started = std::time::Instant::now();
    let wire = malachi_wire::client::Client::connect([broker.client_addr().to_string()])
        .await
        .unwrap();
    let mut producer = wire.producer(TOPIC, 64);
    for first in (0..RECORDS).step_by(PER_BATCH as usize) {
        let mut builder = BatchBuilder::new(64 << 20);
        for i in first..first + PER_BATCH {
            builder
                .push(&record(&format!("k{}", i % KEYS), &i.to_string()))
                .unwrap();
        }
        producer.send(builder.finish()).await.unwrap();
        assert!(producer.inflight() <= 64);
    }
    assert_eq!(producer.flush().await.unwrap(), RECORDS);
    assert_eq!(producer.acknowledged_ordinals(), vec![(0, RECORDS)]);
    let produced = started.elapsed();

    let fetched = fetch_all(&mut client).await;
    assert_eq!(fetched.len() as u64, RECORDS);
    let grouped = by_key(&fetched);
    assert_eq!(grouped.len() as u64, KEYS);
    for (key, got) in grouped {
        let key = String::from_utf8(key).unwrap();
        let k: u64 = key.strip_prefix('k').unwrap().parse().unwrap();
        let got: Vec<u64> = got
            .iter()
            .map(|v| std::str::from_utf8(v).unwrap().parse().unwrap())
            .collect();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{key} is out of order");
        let expected: Vec<u64> = (k..RECORDS).step_by(KEYS as usize).collect();
        assert_eq!(got, expected, "{key} is not complete exactly once");
    }
    eprintln!(
        "produced {RECORDS} records in {produced:?}, read back in {:?}",
        started.elapsed() - produced
    );
    broker.shutdown().await.unwrap();
}
