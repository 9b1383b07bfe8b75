//! Idempotent-producer state survives a failover (chaos finding F2, ADR
//! 0119): three brokers in this process, RF=3, small segments.
//!
//! A producer writes until its range rolls, and another until it rolls
//! again, so the first producer's last batch is in a sealed segment before
//! the failing one, whose sidecar only the primary holds. The primary stops and the segment fails
//! over to a broker that only followed both segments. The first producer's
//! retry of its last acknowledged batch must be answered as a duplicate
//! (not refused `unknown_producer`, which makes a client start a new epoch
//! and store the batch again), its next sequence must be stored, and every
//! record must be read back once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::ErrorCode;
use malachi_wire::batch::Record;
use malachi_wire::messages::*;

const TOPIC: &str = "ids";
const X: u64 = 7;
const Y: u64 = 8;
const EPOCH: u64 = 3;

fn config(dir: &Path, node_id: u64, seeds: &[SocketAddr]) -> BrokerConfig {
    BrokerConfig {
        // Batches of ~900 bytes: a 4 KiB segment rolls every few.
        segment_bytes_max: 4 * 1024,
        ..three_node_config(dir, node_id, seeds)
    }
}

/// Producer `producer`'s batch `sequence`: four records of key `k`.
fn batch(producer: u64, sequence: u64) -> Vec<Record> {
    let pad = "x".repeat(200);
    (0..4)
        .map(|i| record("k", &format!("p{producer}-{sequence}-{i}-{pad}")))
        .collect()
}

fn tagged(range: u64, producer: u64, sequence: u64) -> ProduceRequest {
    let mut request = produce_request(TOPIC, &batch(producer, sequence));
    request.producer = Some(ProducerBatch {
        producer_id: producer,
        epoch: EPOCH,
        range,
        sequence,
    });
    request
}

/// The broker leading the range's active segment, and that segment.
async fn active(client: &mut TestClient) -> Option<(u64, SegmentDescription)> {
    let all = segments(client, TOPIC).await.ok()?;
    let last = all.into_iter().find(|s| s.state == "active")?;
    Some((last.replicas[0], last))
}

/// Sends producer `producer`'s batch `sequence` to whichever live broker
/// leads the range, through failovers and redirects, until an answer that
/// is not retriable: whether it was a duplicate, or the refusal.
async fn send(
    brokers: &[Option<BrokerHandle>],
    range: u64,
    producer: u64,
    sequence: u64,
) -> Result<bool, Refused> {
    let live: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
    let what = format!("producer {producer} sequence {sequence} is answered");
    let poll = Duration::from_millis(100);
    wait_until(&what, Duration::from_secs(60), poll, async || {
        let mut admin = TestClient::connect(live[0]).await;
        let Some((primary, _)) = active(&mut admin).await else {
            return Err(None);
        };
        let Some(broker) = brokers[(primary - 1) as usize].as_ref() else {
            return Err(None);
        };
        let mut client = TestClient::connect(broker.client_addr()).await;
        match client.call(&tagged(range, producer, sequence)).await {
            Ok(answer) => {
                assert_eq!(answer.records_acknowledged, 4, "{answer:?}");
                Ok(Ok(answer.ranges[0].duplicate))
            }
            Err(refused) if refused.code.retriable() => Err(Some(refused)),
            Err(refused) => Ok(Err(refused)),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_a_failover_is_a_duplicate_for_a_producer_last_seen_rolls_ago() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let mut brokers =
        start_stoppable(3, |node_id, seeds| config(root.path(), node_id, seeds)).await;
    let mut admin = TestClient::connect(brokers[0].as_ref().unwrap().client_addr()).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: TOPIC.into(),
                    replication_factor: Some(3),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic was never created"
    );
    let ranges = active_ranges(&mut admin, TOPIC).await;
    assert_eq!(ranges.len(), 1, "{ranges:?}");
    let range = ranges[0];

    // X writes until the range has rolled, then Y until it rolls again:
    // X's last batch is in a sealed segment before the active one's
    // predecessor at the latest (a batch sent while the range rolls is
    // stored in the next segment).
    let (_, first) = active(&mut admin).await.unwrap();
    let mut sent: Vec<Record> = Vec::new();
    let mut next = 0;
    loop {
        let duplicate = send(&brokers, range, X, next).await.unwrap();
        assert!(!duplicate, "sequence {next} was new");
        sent.extend(batch(X, next));
        next += 1;
        let (_, now) = active(&mut admin).await.unwrap();
        if now.id != first.id {
            break;
        }
        assert!(next < 200, "the range never rolled");
    }
    let last = next - 1;
    let (_, second) = active(&mut admin).await.unwrap();
    let mut y_next = 0;
    loop {
        assert!(!send(&brokers, range, Y, y_next).await.unwrap());
        sent.extend(batch(Y, y_next));
        y_next += 1;
        let (_, now) = active(&mut admin).await.unwrap();
        if now.id != second.id {
            break;
        }
        assert!(y_next < 200, "the range never rolled again");
    }

    // The primary stops; a follower of every segment takes over.
    let (primary, before) = active(&mut admin).await.unwrap();
    let stopped = brokers[(primary - 1) as usize].take().unwrap();
    stopped.shutdown().await.unwrap();
    let mut admin =
        TestClient::connect(brokers.iter().flatten().next().unwrap().client_addr()).await;
    let what = "the segment fails over";
    let leader = wait_until(
        what,
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || match active(&mut admin).await {
            Some((leader, now)) if now.id != before.id => Ok(leader),
            other => Err(other),
        },
    )
    .await;
    assert_ne!(leader, primary);

    // X's retry of its last acknowledged batch is a duplicate, its next
    // sequence is stored; Y goes on too.
    match send(&brokers, range, X, last).await {
        Ok(duplicate) => assert!(duplicate, "the retry of sequence {last} was stored again"),
        Err(refused) => panic!(
            "the retry of sequence {last} was refused ({:?}: {}): the producer was forgotten",
            refused.code, refused.message
        ),
    }
    let refused = send(&brokers, range, X, next + 1).await.err();
    assert_eq!(
        refused.map(|r| r.code),
        Some(ErrorCode::SequenceGap),
        "a gap after the failover"
    );
    assert!(!send(&brokers, range, X, next).await.unwrap());
    sent.extend(batch(X, next));
    assert!(!send(&brokers, range, Y, y_next).await.unwrap());
    sent.extend(batch(Y, y_next));

    // Every record once, in send order.
    let mut reader = TestClient::connect(
        brokers[(leader - 1) as usize]
            .as_ref()
            .unwrap()
            .client_addr(),
    )
    .await;
    let got = read_all(&mut reader, TOPIC).await;
    let values =
        |records: &[Record]| -> Vec<Vec<u8>> { records.iter().map(|r| r.value.to_vec()).collect() };
    assert_eq!(values(&got), values(&sent));

    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}
