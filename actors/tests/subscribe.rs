//! Subscriptions push records within credit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::messages::{SubscribeCreditRequest, SubscribePush, SubscribeRequest};
use malachi_wire::{ErrorCode, Message};

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
async fn a_subscription_pushes_within_its_credit_then_live_records_then_ends_on_cancel() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut producer = TestClient::connect(broker.client_addr()).await;
    producer.create_topic("feed").await;
    let first: Vec<_> = (0..12)
        .map(|i| record(&format!("k{}", i % 2), &i.to_string()))
        .collect();
    producer.produce("feed", &first).await.unwrap();

    let mut consumer = TestClient::connect(broker.client_addr()).await;
    let request = SubscribeRequest {
        topic: "feed".into(),
        cursor: None,
        from_start: true,
        credit_records: 5,
        credit_bytes: 1 << 20,
    };
    let id = consumer.send_raw(12, request.encode().unwrap()).await;
    let accepted = next_push(&mut consumer, id).await;
    assert_eq!(accepted.sequence, 0);
    assert!(accepted.records.is_empty());
    let push = next_push(&mut consumer, id).await;
    assert_eq!(push.sequence, 1);
    assert_eq!(push.records.count(), 5);
    // Out of credit: nothing more arrives.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), consumer.next_frame())
            .await
            .is_err()
    );

    let grant = SubscribeCreditRequest {
        subscription_id: id,
        credit_records: 100,
        credit_bytes: 1 << 20,
        acked_sequence: Some(1),
        cancel: false,
    };
    consumer.send_raw(13, grant.encode().unwrap()).await;
    let mut got = push.records.records();
    while got.len() < first.len() {
        got.extend(next_push(&mut consumer, id).await.records.records());
    }
    assert_eq!(by_key(&got), by_key(&first));

    // Live: a new record is pushed without asking.
    producer
        .produce("feed", &[record("k0", "live")])
        .await
        .unwrap();
    let live = next_push(&mut consumer, id).await;
    assert_eq!(&live.records.records()[0].value[..], b"live");

    let cancel = SubscribeCreditRequest {
        subscription_id: id,
        credit_records: 0,
        credit_bytes: 0,
        acked_sequence: None,
        cancel: true,
    };
    consumer.send_raw(13, cancel.encode().unwrap()).await;
    let last = next_push(&mut consumer, id).await;
    assert!(last.last);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credit_for_an_unknown_subscription_is_subscription_not_found() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let refused = client
        .call(&SubscribeCreditRequest {
            subscription_id: 77,
            credit_records: 1,
            credit_bytes: 1,
            acked_sequence: None,
            cancel: false,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::SubscriptionNotFound);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subscription_to_a_missing_topic_is_refused_on_its_id() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let request = SubscribeRequest {
        topic: "nope".into(),
        cursor: None,
        from_start: true,
        credit_records: 5,
        credit_bytes: 1024,
    };
    let id = client.send_raw(12, request.encode().unwrap()).await;
    let frame = client.recv().await.unwrap();
    assert_eq!(frame.correlation_id, id);
    assert_eq!(frame.error_code, ErrorCode::TopicNotFound);
    broker.shutdown().await.unwrap();
}
