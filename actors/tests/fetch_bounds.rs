//! No read bound stalls a reader (issue 16): a record larger than a fetch's
//! `bytes_max` or a subscription's byte credit comes alone, and one too
//! large for any response frame is a typed error, never an empty answer
//! after the whole long poll.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::messages::{
    FetchRequest, SubscribeCreditRequest, SubscribePush, SubscribeRequest,
};
use malachi_wire::{ErrorCode, Message};

const BYTES_MAX: u32 = 1024;
const BIG_VALUE_BYTES: usize = 64 << 10;
/// The long poll each fetch asks for: far longer than any answer with a
/// record available should take.
const WAIT_MS: u32 = 20_000;

fn small_big_small() -> Vec<malachi_wire::batch::Record> {
    vec![
        record("k", "first"),
        record("k", &"b".repeat(BIG_VALUE_BYTES)),
        record("k", "third"),
    ]
}

async fn fetch_page(
    client: &mut TestClient,
    cursor: Option<String>,
    wait_ms: u32,
) -> Result<(Vec<malachi_wire::batch::Record>, String), Refused> {
    let response = client
        .call(&FetchRequest {
            topic: "bounds".into(),
            from_start: cursor.is_none(),
            cursor,
            records_max: 100,
            bytes_max: BYTES_MAX,
            wait_ms,
        })
        .await?;
    Ok((response.records.records(), response.next_cursor))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fetch_whose_first_record_is_over_bytes_max_returns_it_alone_and_moves_on() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("bounds").await;
    let sent = small_big_small();
    for one in &sent {
        client
            .produce("bounds", std::slice::from_ref(one))
            .await
            .unwrap();
    }

    let mut cursor = None;
    let mut got = Vec::new();
    for expected in &sent {
        let asked = Instant::now();
        let (page, next) = fetch_page(&mut client, cursor.clone(), WAIT_MS)
            .await
            .unwrap();
        assert_eq!(page.len(), 1, "each fetch returns exactly the next record");
        assert_eq!(page[0].value, expected.value);
        assert!(
            asked.elapsed() < Duration::from_millis(u64::from(WAIT_MS) / 2),
            "a fetch with a record available waited {:?}",
            asked.elapsed()
        );
        assert_ne!(Some(&next), cursor.as_ref(), "the cursor must move");
        cursor = Some(next);
        got.extend(page);
    }
    assert_eq!(got.len(), 3);

    // At the end: an empty answer that keeps the cursor.
    let (page, next) = fetch_page(&mut client, cursor.clone(), 0).await.unwrap();
    assert!(page.is_empty());
    assert_eq!(Some(next), cursor);
    broker.shutdown().await.unwrap();
}

async fn next_push(client: &mut TestClient, id: u32) -> SubscribePush {
    loop {
        let frame = client.recv().await.expect("connection closed");
        if frame.correlation_id == id {
            assert_eq!(frame.error_code, ErrorCode::None);
            return SubscribePush::decode(frame.payload).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subscription_pushes_a_record_over_its_byte_credit_alone_and_goes_on() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut producer = TestClient::connect(broker.client_addr()).await;
    producer.create_topic("bounds").await;
    for one in &small_big_small() {
        producer
            .produce("bounds", std::slice::from_ref(one))
            .await
            .unwrap();
    }

    let mut consumer = TestClient::connect(broker.client_addr()).await;
    let request = SubscribeRequest {
        topic: "bounds".into(),
        cursor: None,
        from_start: true,
        credit_records: 100,
        credit_bytes: BYTES_MAX,
    };
    let id = consumer.send_raw(12, request.encode().unwrap()).await;
    assert!(next_push(&mut consumer, id).await.records.is_empty());
    // The small record fits the credit; the big one does not fit what is
    // left, so it comes in a push of its own, which spends the credit.
    let first = next_push(&mut consumer, id).await.records.records();
    assert_eq!(first.len(), 1);
    assert_eq!(&first[0].value[..], b"first");
    let big = next_push(&mut consumer, id).await.records.records();
    assert_eq!(big.len(), 1);
    assert_eq!(big[0].value.len(), BIG_VALUE_BYTES);

    let grant = SubscribeCreditRequest {
        subscription_id: id,
        credit_records: 100,
        credit_bytes: BYTES_MAX,
        acked_sequence: Some(2),
        cancel: false,
    };
    consumer.send_raw(13, grant.encode().unwrap()).await;
    let third = next_push(&mut consumer, id).await.records.records();
    assert_eq!(third.len(), 1);
    assert_eq!(&third[0].value[..], b"third");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_too_large_for_a_response_frame_is_frame_too_large_at_once() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    // A produce frame carries this record (its control map is small); a
    // fetch frame, which keeps room for a cursor, cannot.
    let frame_bytes_max = 64 << 10;
    let config = BrokerConfig {
        frame_bytes_max,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("bounds").await;
    let near_limit = record("k", &"x".repeat(frame_bytes_max - 256));
    client
        .produce("bounds", &[record("k", "before")])
        .await
        .unwrap();
    client.produce("bounds", &[near_limit]).await.unwrap();

    let (page, cursor) = fetch_page(&mut client, None, WAIT_MS).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(&page[0].value[..], b"before");
    let asked = Instant::now();
    let refused = fetch_page(&mut client, Some(cursor), WAIT_MS)
        .await
        .unwrap_err();
    assert_eq!(
        refused.code,
        ErrorCode::FrameTooLarge,
        "{}",
        refused.message
    );
    assert!(
        asked.elapsed() < Duration::from_millis(u64::from(WAIT_MS) / 2),
        "the refusal waited {:?}",
        asked.elapsed()
    );
    broker.shutdown().await.unwrap();
}
