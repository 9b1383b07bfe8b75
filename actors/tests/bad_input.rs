//! Bad input: each case is answered with a typed error (or a bounded
//! refusal to read), while the broker keeps serving everyone else and loses
//! nothing that was acknowledged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::ErrorCode;
use malachi_wire::messages::FetchRequest;
use malachi_wire::{Message, batch::Record};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A broker with one topic holding `sent`, acknowledged.
async fn broker_with_data(config: BrokerConfig) -> (BrokerHandle, Vec<Record>) {
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    let sent: Vec<_> = (0..30)
        .map(|i| record(&format!("k{}", i % 4), &i.to_string()))
        .collect();
    client.produce("t", &sent).await.unwrap();
    (broker, sent)
}

/// Another client can still produce and read everything back.
async fn assert_serving_and_intact(broker: &BrokerHandle, sent: &[Record]) {
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.produce("t", &[record("after", "x")]).await.unwrap();
    let (got, _) = client.fetch("t", None, true, 10_000, 0).await.unwrap();
    let mut expected = sent.to_vec();
    expected.push(record("after", "x"));
    assert_eq!(by_key(&got), by_key(&expected));
}

async fn read_all_frames(client: &mut TestClient) -> Vec<malachi_wire::ResponseFrame> {
    let mut frames = Vec::new();
    while let Some(frame) = client.recv().await {
        frames.push(frame);
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_bytes_get_a_typed_error_and_the_connection_closes() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    // Deterministic noise (xorshift64); its first word declares a frame far
    // over the limit, as most random words do.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = BytesMut::new();
    for _ in 0..512 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        noise.put_u64(state);
    }
    client.framed.get_mut().write_all(&noise).await.unwrap();
    let frames = read_all_frames(&mut client).await;
    assert_eq!(frames.len(), 1, "one error, then the connection closes");
    assert!(
        matches!(
            frames[0].error_code,
            ErrorCode::FrameTooLarge | ErrorCode::InvalidRequest
        ),
        "{:?}",
        frames[0].error_code
    );
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frame_declaring_two_gib_is_refused_before_allocation_and_closed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let mut header = BytesMut::new();
    header.put_u32(2 << 30);
    header.put_u16(10);
    header.put_u32(1);
    client.framed.get_mut().write_all(&header).await.unwrap();
    let frames = read_all_frames(&mut client).await;
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].error_code, ErrorCode::FrameTooLarge);
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_api_key_is_unsupported_and_the_connection_stays_open() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let id = client.send_raw(9_999, Bytes::new()).await;
    let frame = client.recv().await.unwrap();
    assert_eq!(frame.correlation_id, id);
    assert_eq!(frame.error_code, ErrorCode::UnsupportedApi);
    // Same connection, next request served.
    let (got, _) = client.fetch("t", None, true, 1000, 0).await.unwrap();
    assert_eq!(got.len(), sent.len());
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_payload_is_invalid_request_and_the_connection_stays_open() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client
        .send_raw(11, Bytes::from_static(b"\xc1\xc1\xc1"))
        .await;
    let frame = client.recv().await.unwrap();
    assert_eq!(frame.error_code, ErrorCode::InvalidRequest);
    client
        .produce("t", &[record("same-conn", "ok")])
        .await
        .unwrap();
    broker.shutdown().await.unwrap();
    drop(sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forged_cursor_is_invalid_cursor() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let (_, genuine) = client.fetch("t", None, true, 5, 0).await.unwrap();
    // Flip one character of a genuine cursor: the tag no longer verifies.
    let mut forged = genuine.into_bytes();
    let last = forged.len() - 5;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let refused = client
        .fetch("t", Some(forged), false, 5, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidCursor);
    let refused = client
        .fetch("t", Some("not-a-cursor".into()), false, 5, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidCursor);
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_produce_to_a_missing_topic_is_topic_not_found() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let refused = client
        .produce("nope", &[record("k", "v")])
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::TopicNotFound);
    let refused = client.fetch("nope", None, true, 5, 0).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::TopicNotFound);
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_key_is_invalid_request_and_nothing_of_its_batch_is_written() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let refused = client
        .produce("t", &[record("good", "1"), record("", "2")])
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidRequest);
    assert!(refused.message.contains("empty key"), "{}", refused.message);
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_value_over_the_limit_is_invalid_request() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        record_value_bytes_max: 1024,
        ..BrokerConfig::for_tests(dir.path())
    };
    let (broker, sent) = broker_with_data(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let big = "v".repeat(1025);
    let refused = client.produce("t", &[record("k", &big)]).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidRequest);
    assert!(refused.message.contains("1025"), "{}", refused.message);
    client
        .produce("t", &[record("k", &"v".repeat(1024))])
        .await
        .unwrap();
    broker.shutdown().await.unwrap();
    drop(sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_mid_frame_is_cleaned_up() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (broker, sent) = broker_with_data(BrokerConfig::for_tests(dir.path())).await;
    let request = produce_request("t", &[record("half", "written")]);
    let payload = request.encode().unwrap();
    let mut frame = BytesMut::new();
    frame.put_u32((6 + payload.len()) as u32);
    frame.put_u16(10);
    frame.put_u32(1);
    frame.put_slice(&payload[..payload.len() / 2]);
    {
        let mut stream = TcpStream::connect(broker.client_addr()).await.unwrap();
        stream.write_all(&frame).await.unwrap();
        stream.flush().await.unwrap();
        // Fault timing: the half frame is read before the socket closes.
        tokio::time::sleep(Duration::from_millis(50)).await;
    } // dropped: the socket closes mid-frame
    assert!(eventually(5_000, async || broker.connections() == 0).await);
    // The half-sent record was never acknowledged and is not there.
    assert_serving_and_intact(&broker, &sent).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_never_reads_cannot_grow_the_brokers_queues_past_their_bound() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let inflight_max = 8;
    let config = BrokerConfig {
        connection_inflight_max: inflight_max,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    let value = "z".repeat(64 << 10);
    let sent: Vec<_> = (0..16).map(|i| record(&format!("k{i}"), &value)).collect();
    client.produce("t", &sent).await.unwrap();

    // Each fetch answer is about 1 MiB; the client asks for thousands and
    // reads none, so the socket, then the broker's queue, must fill.
    let request = FetchRequest {
        topic: "t".into(),
        cursor: None,
        from_start: true,
        records_max: 1000,
        bytes_max: 1 << 20,
        wait_ms: 0,
    }
    .encode()
    .unwrap();
    let mut greedy = TestClient::connect(broker.client_addr()).await;
    let requests_max = 1_000_000;
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&written);
    let flood = tokio::spawn(async move {
        for _ in 0..requests_max {
            greedy.send_raw(11, request.clone()).await;
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        greedy
    });
    assert!(
        eventually(10_000, async || broker.requests_inflight() == inflight_max).await,
        "the queue never filled: {} in flight",
        broker.requests_inflight()
    );
    // Sampling the bound over 400 ms, not waiting on a change.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(broker.requests_inflight() <= inflight_max);
    }
    assert_eq!(broker.connection_inflight_peak(), inflight_max);
    // The client's writes stall: the broker has stopped reading from it.
    let stalled = eventually(10_000, async || {
        let before = written.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        written.load(std::sync::atomic::Ordering::SeqCst) == before
    })
    .await;
    assert!(
        stalled,
        "the broker kept reading from a client that never reads"
    );
    assert!(written.load(std::sync::atomic::Ordering::SeqCst) < requests_max);
    assert!(broker.requests_inflight() <= inflight_max);

    // Everyone else is served meanwhile.
    let mut other = TestClient::connect(broker.client_addr()).await;
    other.produce("t", &[record("other", "ok")]).await.unwrap();
    let (got, _) = other.fetch("t", None, true, 1, 0).await.unwrap();
    assert_eq!(got.len(), 1);

    flood.abort();
    let _ = flood.await;
    assert!(
        eventually(5_000, async || broker.connections() <= 2).await,
        "{} connections remain",
        broker.connections()
    );
    broker.shutdown().await.unwrap();
}
