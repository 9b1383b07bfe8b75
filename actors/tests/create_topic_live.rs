//! `create_topic` with more copies than brokers are live now (issue 36,
//! ADR 0126): three brokers configured, two running. A replication factor
//! of 3 is refused retriably (`no_quorum` with `retry_after_ms`: the third
//! broker may come), and succeeds once the third broker is live; a factor
//! above the cluster's three brokers stays `invalid_request`, which no wait
//! mends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_actors::{Broker, BrokerHandle};
use malachi_wire::messages::CreateTopicRequest;
use malachi_wire::{ErrorBody, ErrorCode, Message, Operation};

const NODES: [u64; 3] = [1, 2, 3];

/// The code and body of `create_topic name` with `factor` copies.
async fn create(client: &mut TestClient, name: &str, factor: u8) -> (ErrorCode, ErrorBody) {
    let request = CreateTopicRequest {
        name: name.into(),
        replication_factor: Some(factor),
        policy: None,
    };
    client
        .send_raw(
            CreateTopicRequest::API_KEY.code(),
            request.encode().unwrap(),
        )
        .await;
    let frame = client.recv().await.expect("connection closed");
    let body = if frame.error_code == ErrorCode::None {
        ErrorBody::default()
    } else {
        ErrorBody::decode(frame.payload).unwrap()
    };
    (frame.error_code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_factor_above_the_live_brokers_is_retriable_and_above_the_cluster_is_not() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let brokers: [BrokerHandle; 2] =
        start_seeded(|node_id, seeds| cluster_config(root.path(), node_id, seeds, &NODES)).await;
    let mut client = TestClient::connect(brokers[0].client_addr()).await;

    // Two of three brokers live: a retriable refusal that asks for a pause.
    // (Any metadata hiccup while the vnodes elect is retriable too: wait
    // for the placement's own answer.)
    let mut answer = (ErrorCode::None, ErrorBody::default());
    assert!(
        eventually(30_000, async || {
            answer = create(&mut client, "three", 3).await;
            answer.1.message.contains("live brokers")
        })
        .await,
        "no placement refusal: {answer:?}"
    );
    let (code, body) = answer;
    assert_eq!(code, ErrorCode::NoQuorum, "{body:?}");
    assert!(code.retriable());
    assert!(body.retry_after_ms.is_some(), "{body:?}");
    assert!(
        body.message.contains("needs 3 live brokers; 2 are live"),
        "{body:?}"
    );

    // More copies than the cluster has brokers: not retriable.
    let (code, body) = create(&mut client, "four", 4).await;
    assert_eq!(code, ErrorCode::InvalidRequest, "{body:?}");
    assert!(body.message.contains("the cluster has 3"), "{body:?}");

    // The third broker arrives: the same request succeeds.
    let third = Broker::start(cluster_config(
        root.path(),
        3,
        &[&brokers[0], &brokers[1]],
        &NODES,
    ))
    .await
    .unwrap();
    assert!(third.wait_ready(30_000).await);
    let mut last = (ErrorCode::None, ErrorBody::default());
    assert!(
        eventually(30_000, async || {
            last = create(&mut client, "three", 3).await;
            last.0 == ErrorCode::None
        })
        .await,
        "never created once three brokers were live: {last:?}"
    );
}
