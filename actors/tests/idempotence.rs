//! Idempotent producers against an in-process broker (ADR 0092): a retry
//! is answered with the original acknowledgement and stored once, a gap and
//! a zombie are refused with nothing written, and the state survives a
//! restart and a split.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::ErrorCode;
use malachi_wire::messages::*;

const TOPIC: &str = "events";

/// The id of the topic's only (or first active) range.
async fn first_range(client: &mut TestClient) -> u64 {
    active_ranges(client, TOPIC).await[0]
}

fn tagged(range: u64, epoch: u64, sequence: u64, values: &[&str]) -> ProduceRequest {
    let records: Vec<_> = values.iter().map(|v| record("k", v)).collect();
    let mut request = produce_request(TOPIC, &records);
    request.producer = Some(ProducerBatch {
        producer_id: 7,
        epoch,
        range,
        sequence,
    });
    request
}

async fn stored_values(client: &mut TestClient) -> Vec<String> {
    let (records, _) = client.fetch(TOPIC, None, true, 10_000, 0).await.unwrap();
    records
        .iter()
        .map(|r| {
            assert!(
                r.headers.iter().all(|h| !h.name.starts_with("malachi.")),
                "a consumer saw the broker's header"
            );
            String::from_utf8(r.value.to_vec()).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_is_acknowledged_once_a_gap_and_a_zombie_are_refused_and_a_restart_forgets_nothing()
{
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let range = first_range(&mut client).await;

    // Sequence 0, then its retry: the same acknowledgement, marked duplicate.
    let first = client
        .call(&tagged(range, 5, 0, &["a", "b"]))
        .await
        .unwrap();
    assert_eq!(first.records_acknowledged, 2);
    assert!(!first.ranges[0].duplicate);
    let retry = client
        .call(&tagged(range, 5, 0, &["a", "b"]))
        .await
        .unwrap();
    assert_eq!(retry.records_acknowledged, 2);
    assert!(retry.ranges[0].duplicate);
    // A gap is refused, and so is a new epoch not starting at 0.
    let gap = client.call(&tagged(range, 5, 2, &["x"])).await.unwrap_err();
    assert_eq!(gap.code, ErrorCode::SequenceGap, "{}", gap.message);
    let unknown = client.call(&tagged(range, 6, 3, &["x"])).await.unwrap_err();
    assert_eq!(
        unknown.code,
        ErrorCode::UnknownProducer,
        "{}",
        unknown.message
    );
    // A reserved header is refused.
    let mut reserved = tagged(range, 5, 1, &["x"]);
    let forged = vec![record("k", "x").with_header("malachi.x", "1")];
    reserved.records = produce_request(TOPIC, &forged).records;
    let refused = client.call(&reserved).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidRequest);
    assert_eq!(stored_values(&mut client).await, vec!["a", "b"]);

    // The state survives a restart: the retry is still a duplicate, the
    // next sequence is taken.
    broker.shutdown().await.unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let retry = client
        .call(&tagged(range, 5, 0, &["a", "b"]))
        .await
        .unwrap();
    assert!(retry.ranges[0].duplicate);
    let next = client.call(&tagged(range, 5, 1, &["c"])).await.unwrap();
    assert!(!next.ranges[0].duplicate);

    // A newer session fences the older one.
    client.call(&tagged(range, 9, 0, &["d"])).await.unwrap();
    let zombie = client
        .call(&tagged(range, 5, 2, &["zombie"]))
        .await
        .unwrap_err();
    assert_eq!(zombie.code, ErrorCode::ProducerFenced, "{}", zombie.message);
    assert_eq!(stored_values(&mut client).await, vec!["a", "b", "c", "d"]);

    // After a split, a retry addressed to the parent is a duplicate, a
    // batch the parent never stored is `moved`, and nothing is written.
    client
        .call(&SplitRangeRequest {
            topic: TOPIC.into(),
            range_id: range,
        })
        .await
        .unwrap();
    let retry = client.call(&tagged(range, 9, 0, &["d"])).await.unwrap();
    assert!(retry.ranges[0].duplicate);
    let moved = client.call(&tagged(range, 9, 1, &["e"])).await.unwrap_err();
    assert_eq!(moved.code, ErrorCode::Moved, "{}", moved.message);
    assert_eq!(stored_values(&mut client).await, vec!["a", "b", "c", "d"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_single_record_produces_of_one_key_are_stored_in_send_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    // 20 trials of 50 plain requests written back to back before any answer
    // is read: the broker stores them in arrival order.
    let mut expected = Vec::new();
    for trial in 0..20 {
        let mut ids = Vec::new();
        for i in 0..50 {
            let value = format!("{trial}-{i}");
            let request = produce_request(TOPIC, &[record("k", &value)]);
            let payload = malachi_wire::Message::encode(&request).unwrap();
            ids.push(
                client
                    .send_raw(malachi_wire::ApiKey::Produce.code(), payload)
                    .await,
            );
            expected.push(value);
        }
        for _ in &ids {
            let frame = client.recv().await.unwrap();
            assert_eq!(frame.error_code, ErrorCode::None);
        }
    }
    assert_eq!(stored_values(&mut client).await, expected);
    broker.shutdown().await.unwrap();
}
