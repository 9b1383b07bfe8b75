//! The producer routes from the topic's range map (ADR 0142), against
//! in-process fake brokers: a bootstrap broker that writes no range of
//! topic "two" and describes it (range 1 written by broker A, range 2 by
//! broker B) and lists the cluster's brokers; A and B acknowledge their own
//! range's parts and refuse the other's with a `not_leader` hint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use malachi_testkit::fake::{fake_broker, ok, refusal};
use malachi_wire::messages::*;
use malachi_wire::{
    ApiKey, Client, ClientConfig, ErrorBody, ErrorCode, Message, Record, RecordBatch, RequestFrame,
    ResponseFrame,
};

/// Node ids: A writes range 1 (the lower half), B range 2 (the upper).
const NODE_A: u64 = 1;
const NODE_B: u64 = 2;
const NODE_BOOT: u64 = 3;
/// How long a `busy` refusal asks the producer to wait: long enough that
/// whatever the producer sends meanwhile is sent during the wait.
const BUSY_RETRY_AFTER_MS: u32 = 1_000;

/// The three fakes' addresses, known once all are listening.
#[derive(Default)]
struct Addrs {
    a: OnceLock<String>,
    b: OnceLock<String>,
    boot: OnceLock<String>,
}

impl Addrs {
    fn of_range(&self, range: u64) -> String {
        let addr = if range == 1 { &self.a } else { &self.b };
        addr.get().cloned().unwrap_or_default()
    }
}

/// What the fakes saw.
#[derive(Default)]
struct Seen {
    /// Produce parts each primary stored, by range: their sequences in the
    /// order stored.
    acked: Mutex<Vec<(u64, u64)>>,
    /// Parts that reached a broker that does not write their range.
    misrouted: AtomicUsize,
    /// Produce parts that reached A and B (acknowledged or not).
    at_a: AtomicUsize,
    at_b: AtomicUsize,
    /// The sequences of the parts refused `busy`.
    busy: Mutex<Vec<u64>>,
    /// Woken whenever a part reaches A or B.
    arrived: tokio::sync::Notify,
}

fn two_range_topic() -> DescribeTopicResponse {
    let range = |id: u64, start: &str, end: &str, primary: u64| RangeDescription {
        id,
        band_start: start.into(),
        band_end: end.into(),
        state: "active".into(),
        segments: vec![SegmentDescription {
            id: id + 10,
            replicas: vec![primary, NODE_BOOT],
            state: "active".into(),
            ..SegmentDescription::default()
        }],
        ..RangeDescription::default()
    };
    DescribeTopicResponse {
        topic: TopicDescription {
            name: "two".into(),
            ranges: vec![
                range(1, "0x0000000000000000", "0x8000000000000000", NODE_A),
                range(2, "0x8000000000000000", "0x10000000000000000", NODE_B),
            ],
            ..TopicDescription::default()
        },
    }
}

fn cluster(addrs: &Addrs) -> ClusterStatusResponse {
    let broker = |node_id: u64, addr: &OnceLock<String>| BrokerStatus {
        node_id,
        client_addr: addr.get().cloned().unwrap_or_default(),
        ..BrokerStatus::default()
    };
    ClusterStatusResponse {
        node_id: NODE_BOOT,
        brokers: vec![
            broker(NODE_A, &addrs.a),
            broker(NODE_B, &addrs.b),
            broker(NODE_BOOT, &addrs.boot),
        ],
    }
}

/// How a primary answers a part of its own range: at once, after the other
/// primary has received a part (so only parallel sends are answered), or
/// `busy` until the other primary has acknowledged `n` parts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    AtOnce,
    AfterTheOther,
    BusyUntilTheOtherAcked(usize),
}

/// One fake broker; `writes` is the range it writes (none for the
/// bootstrap broker).
async fn broker(writes: Option<u64>, answer: Answer, addrs: Arc<Addrs>, seen: Arc<Seen>) -> String {
    fake_broker(Arc::new(move |frame, tx| {
        let (addrs, seen) = (addrs.clone(), seen.clone());
        async move {
            let reply = handle(&frame, writes, answer, &addrs, &seen).await;
            if let Some(reply) = reply {
                let _ = tx.send(reply).await;
            }
        }
        .boxed()
    }))
    .await
}

async fn handle(
    frame: &RequestFrame,
    writes: Option<u64>,
    answer: Answer,
    addrs: &Addrs,
    seen: &Seen,
) -> Option<ResponseFrame> {
    let id = frame.correlation_id;
    if frame.api_key == ApiKey::DescribeTopic.code() {
        return Some(ok(id, &two_range_topic()));
    }
    if frame.api_key == ApiKey::ClusterStatus.code() {
        return Some(ok(id, &cluster(addrs)));
    }
    assert_eq!(frame.api_key, ApiKey::Produce.code());
    let request = ProduceRequest::decode(frame.payload.clone()).unwrap();
    let tag = request.producer.unwrap();
    let (mine, other) = match writes {
        Some(1) => (&seen.at_a, &seen.at_b),
        _ => (&seen.at_b, &seen.at_a),
    };
    if writes != Some(tag.range) {
        seen.misrouted.fetch_add(1, Ordering::SeqCst);
        let body = ErrorBody {
            message: format!(
                "range {} of topic two is written by another broker",
                tag.range
            ),
            leader_hint: Some(addrs.of_range(tag.range)),
            retry_after_ms: None,
            ranges: None,
        };
        return Some(refusal(id, ErrorCode::NotLeader, body));
    }
    mine.fetch_add(1, Ordering::SeqCst);
    seen.arrived.notify_waiters();
    match answer {
        Answer::AtOnce => {}
        Answer::AfterTheOther => {
            let arrived = async {
                loop {
                    let woken = seen.arrived.notified();
                    if other.load(Ordering::SeqCst) >= 1 {
                        return;
                    }
                    woken.await;
                }
            };
            // Never answered if the other part is not sent meanwhile.
            tokio::time::timeout(Duration::from_secs(5), arrived)
                .await
                .ok()?;
        }
        Answer::BusyUntilTheOtherAcked(n) => {
            let other_acked = seen
                .acked
                .lock()
                .unwrap()
                .iter()
                .filter(|(range, _)| *range != tag.range)
                .count();
            if other_acked < n {
                seen.busy.lock().unwrap().push(tag.sequence);
                let body = ErrorBody {
                    message: "busy".into(),
                    leader_hint: None,
                    retry_after_ms: Some(BUSY_RETRY_AFTER_MS),
                    ranges: None,
                };
                return Some(refusal(id, ErrorCode::Busy, body));
            }
        }
    }
    // As a range does (ADR 0092): the next sequence is stored, one already
    // stored is a duplicate, one ahead of the next is a gap.
    let mut acked = seen.acked.lock().unwrap();
    let next = acked.iter().filter(|(r, _)| *r == tag.range).count() as u64;
    if tag.sequence > next {
        let body = ErrorBody {
            message: format!("sequence {} ahead of {next}", tag.sequence),
            leader_hint: None,
            retry_after_ms: Some(1),
            ranges: None,
        };
        return Some(refusal(id, ErrorCode::SequenceGap, body));
    }
    if tag.sequence == next {
        acked.push((tag.range, tag.sequence));
    }
    let response = ProduceResponse {
        records_acknowledged: request.records.count(),
        ranges: Vec::new(),
    };
    Some(ok(id, &response))
}

/// The three fakes, and a client bootstrapped from the one that writes
/// nothing, which learns the cluster's brokers as the real client does.
async fn cluster_of(a: Answer, b: Answer) -> (Client, Arc<Seen>) {
    let addrs = Arc::new(Addrs::default());
    let seen = Arc::new(Seen::default());
    let a = broker(Some(1), a, addrs.clone(), seen.clone()).await;
    let b = broker(Some(2), b, addrs.clone(), seen.clone()).await;
    let boot = broker(None, Answer::AtOnce, addrs.clone(), seen.clone()).await;
    addrs.a.set(a).unwrap();
    addrs.b.set(b).unwrap();
    addrs.boot.set(boot.clone()).unwrap();
    let config = ClientConfig {
        request_timeout_ms: 5_000,
        backoff_initial_ms: 1,
        backoff_max_ms: u64::from(BUSY_RETRY_AFTER_MS),
        discover_on_connect: true,
        ..ClientConfig::default()
    };
    (Client::connect_with([boot], config).await.unwrap(), seen)
}

/// Keys of the lower (`upper == false`) or upper half of the keyspace.
fn key_in(upper: bool, n: usize) -> String {
    (0u64..)
        .map(|i| format!("key-{i}"))
        .filter(|k| (xxhash_rust::xxh3::xxh3_64(k.as_bytes()) >= 1 << 63) == upper)
        .nth(n)
        .unwrap()
}

fn batch(records: &[Record]) -> RecordBatch {
    RecordBatch::from_records(records, 1 << 20).unwrap()
}

/// Each range's stored sequences, in the order stored: 0, 1, 2, ... with
/// none missing or twice (the fakes store only the next one, so this
/// checks the count; the order is the fakes' rule).
fn assert_in_sequence(seen: &Seen) {
    for range in [1, 2] {
        let sequences: Vec<u64> = seen
            .acked
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| *r == range)
            .map(|(_, s)| *s)
            .collect();
        let expected: Vec<u64> = (0..sequences.len() as u64).collect();
        assert_eq!(sequences, expected, "range {range}'s parts in order");
    }
}

#[tokio::test]
async fn the_first_batch_goes_straight_to_each_ranges_primary() {
    let (client, seen) = cluster_of(Answer::AtOnce, Answer::AtOnce).await;
    let mut producer = client.producer("two", 4);
    producer.set_delivery_timeout(Duration::from_secs(10));

    let batches = 30;
    for i in 0..batches {
        let records = [
            Record::new(key_in(false, i % 5), format!("v{i}")),
            Record::new(key_in(true, i % 5), format!("v{i}")),
        ];
        producer.send(batch(&records)).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), 2 * batches as u64);

    assert_eq!(
        seen.misrouted.load(Ordering::SeqCst),
        0,
        "no part misrouted"
    );
    assert_eq!(client.redirects_followed(), 0, "no redirect followed");
    assert_eq!(seen.acked.lock().unwrap().len(), 2 * batches);
    assert_in_sequence(&seen);
}

/// A batch over both ranges is two requests, to two brokers; each broker
/// answers only once the other has received its request, so they are in
/// flight together or never answered.
#[tokio::test]
async fn parts_for_different_primaries_are_in_flight_together() {
    let (client, seen) = cluster_of(Answer::AfterTheOther, Answer::AfterTheOther).await;
    let mut producer = client.producer("two", 2);
    producer.set_delivery_timeout(Duration::from_secs(10));

    let records = [
        Record::new(key_in(false, 0), "lower"),
        Record::new(key_in(true, 0), "upper"),
    ];
    producer.send(batch(&records)).await.unwrap();
    assert_eq!(producer.flush().await.unwrap(), 2);
    assert_eq!(client.redirects_followed(), 0);
    assert_in_sequence(&seen);
}

/// A range whose primary answers `busy` holds back that range's later
/// parts only: the other range's parts go on to their primary during the
/// backoff. Batches alternate between the ranges, the window is 4: range
/// 1's first part is refused (range 2 has fewer than 3 parts acknowledged
/// then), and its next attempt, a backoff later, finds range 2's third
/// part acknowledged. Before, the part that backed off stopped every part
/// behind it for the backoff, so range 2 was still at two when range 1's
/// first part was sent again, and it was refused again.
#[tokio::test]
async fn a_range_that_backs_off_does_not_hold_up_the_others() {
    let (client, seen) = cluster_of(Answer::BusyUntilTheOtherAcked(3), Answer::AtOnce).await;
    let mut producer = client.producer("two", 4);
    producer.set_delivery_timeout(Duration::from_secs(10));

    let batches = 30;
    for i in 0..batches {
        let record = Record::new(key_in(i % 2 == 1, i / 2), format!("v{i}"));
        producer.send(batch(&[record])).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), batches as u64);
    assert_eq!(seen.misrouted.load(Ordering::SeqCst), 0);
    let first_refused = seen
        .busy
        .lock()
        .unwrap()
        .iter()
        .filter(|s| **s == 0)
        .count();
    assert_eq!(first_refused, 1, "range 1's first part refused once");
    assert_in_sequence(&seen);
}
