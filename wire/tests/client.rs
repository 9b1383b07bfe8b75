//! The client against in-process fake brokers (`malachi_testkit::fake`):
//! tokio listeners in the test that speak the server side of the codec.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, SinkExt, StreamExt};
use malachi_testkit::fake::{fake_broker, ok, refusal};
use malachi_testkit::wait::wait_until;
use malachi_wire::client::{ConsumeOptions, StartAt};
use malachi_wire::messages::*;
use malachi_wire::{
    ApiKey, Client, ClientConfig, ClientError, ErrorBody, ErrorCode, Message, Record, RecordBatch,
    RequestFrame, ResponseFrame, ServerCodec,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

fn batch_of(count: usize) -> RecordBatch {
    let records: Vec<Record> = (0..count)
        .map(|i| Record::new(format!("k{i}"), format!("v{i}")))
        .collect();
    RecordBatch::from_records(&records, 1 << 20).unwrap()
}

fn produce_of(frame: &RequestFrame) -> ProduceRequest {
    assert_eq!(frame.api_key, ApiKey::Produce.code());
    ProduceRequest::decode(frame.payload.clone()).unwrap()
}

/// Fast retries; no `cluster_status` on connect (most fakes below answer
/// one operation only).
fn quick_config() -> ClientConfig {
    ClientConfig {
        request_timeout_ms: 2_000,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        discover_on_connect: false,
        ..ClientConfig::default()
    }
}

#[tokio::test]
async fn responses_out_of_order_are_matched_to_their_own_requests() {
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = answered.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let log = log.clone();
        async move {
            let count = produce_of(&frame).records.count();
            // Bigger batches answer sooner: the reverse of the send order.
            tokio::time::sleep(Duration::from_millis(u64::from(6 - count) * 40)).await;
            log.lock().unwrap().push(count);
            let ack = ProduceResponse {
                records_acknowledged: count,
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();

    let calls = (1..=5).map(|count| {
        let client = client.clone();
        async move { (count, client.produce("t", batch_of(count)).await) }
    });
    for (count, result) in futures::future::join_all(calls).await {
        assert_eq!(result.unwrap().records_acknowledged as usize, count);
    }
    assert_eq!(*answered.lock().unwrap(), vec![5, 4, 3, 2, 1]);
}

#[tokio::test]
async fn a_busy_refusal_is_retried_after_a_backoff_and_then_succeeds() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let attempt = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let response = if attempt == 0 {
                let body = ErrorBody {
                    message: "overloaded".into(),
                    leader_hint: None,
                    retry_after_ms: Some(2),
                    ranges: None,
                };
                refusal(frame.correlation_id, ErrorCode::Busy, body)
            } else {
                let count = produce_of(&frame).records.count();
                ok(
                    frame.correlation_id,
                    &ProduceResponse {
                        records_acknowledged: count,
                        ranges: Vec::new(),
                    },
                )
            };
            tx.send(response).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();

    let ack = client.produce("t", batch_of(3)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 3);
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_not_leader_hint_is_followed_to_the_other_broker() {
    let leader_seen = Arc::new(AtomicUsize::new(0));
    let counter = leader_seen.clone();
    let leader = fake_broker(Arc::new(move |frame, tx| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let count = produce_of(&frame).records.count();
            let ack = ProduceResponse {
                records_acknowledged: count,
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let hint = leader.clone();
    let follower_seen = Arc::new(AtomicUsize::new(0));
    let follower_counter = follower_seen.clone();
    let follower = fake_broker(Arc::new(move |frame, tx| {
        follower_counter.fetch_add(1, Ordering::SeqCst);
        let hint = hint.clone();
        async move {
            let body = ErrorBody {
                message: "not the leader".into(),
                leader_hint: Some(hint),
                retry_after_ms: None,
                ranges: None,
            };
            tx.send(refusal(frame.correlation_id, ErrorCode::NotLeader, body))
                .await
                .unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([follower], quick_config())
        .await
        .unwrap();

    let ack = client.produce("t", batch_of(2)).await.unwrap();
    assert_eq!(ack.records_acknowledged, 2);
    // The hint is remembered for the topic: the next produce goes straight there.
    client.produce("t", batch_of(1)).await.unwrap();

    assert_eq!(follower_seen.load(Ordering::SeqCst), 1);
    assert_eq!(leader_seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_non_retriable_refusal_is_returned_at_once_with_its_code() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = ErrorBody {
                message: "no such topic".into(),
                ..ErrorBody::default()
            };
            tx.send(refusal(
                frame.correlation_id,
                ErrorCode::TopicNotFound,
                body,
            ))
            .await
            .unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();

    let error = client.describe_topic("missing").await.unwrap_err();

    assert_eq!(error.code(), Some(ErrorCode::TopicNotFound));
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retries_stop_at_retries_max() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        // Only the produce attempts count (the client also asks this
        // broker, the only one it knows, for the cluster's others).
        if frame.api_key == ApiKey::Produce.code() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        refuse_no_quorum(frame, tx)
    }))
    .await;
    let config = ClientConfig {
        retries_max: 3,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();

    let error = client.produce("t", batch_of(1)).await.unwrap_err();

    assert_eq!(error.code(), Some(ErrorCode::NoQuorum));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        4,
        "one attempt and three retries"
    );
}

#[tokio::test]
async fn a_request_without_a_timely_answer_fails_with_a_typed_timeout_and_is_not_retried() {
    let addr = fake_broker(Arc::new(move |frame, tx| {
        async move {
            // Answer long after the client gave up.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ack = ProduceResponse {
                records_acknowledged: 99,
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let config = ClientConfig {
        request_timeout_ms: 100,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();

    let started = std::time::Instant::now();
    let error = client.produce("t", batch_of(1)).await.unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Timeout {
                api: "produce",
                timeout_ms: 100
            }
        ),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(190),
        "the timeout was retried"
    );
}

#[tokio::test]
async fn a_late_answer_after_a_timeout_does_not_disturb_the_same_connection() {
    let late_sent = Arc::new(AtomicUsize::new(0));
    let sent = late_sent.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let sent = sent.clone();
        async move {
            let produce = frame.api_key == ApiKey::Produce.code();
            // Fault timing: the produce is answered after the client's
            // 100 ms timeout.
            let delay = if produce { 250 } else { 10 };
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let response = if produce {
                ok(
                    frame.correlation_id,
                    &ProduceResponse {
                        records_acknowledged: 1,
                        ranges: Vec::new(),
                    },
                )
            } else {
                ok(frame.correlation_id, &ListTopicsResponse::default())
            };
            tx.send(response).await.unwrap();
            if produce {
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }
        .boxed()
    }))
    .await;
    let config = ClientConfig {
        request_timeout_ms: 100,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();

    assert!(matches!(
        client.produce("t", batch_of(1)).await,
        Err(ClientError::Timeout { .. })
    ));
    // Once the late answer is on its way, use the connection: it arrives
    // before the next answer on the same stream, and must be dropped.
    wait_until(
        "the fake broker sent the late answer",
        Duration::from_secs(5),
        Duration::from_millis(5),
        async || late_sent.load(Ordering::SeqCst) == 1,
    )
    .await;
    let listed = client.list_topics().await.unwrap();
    assert!(listed.topics.is_empty());
}

#[tokio::test]
async fn the_window_bounds_requests_in_flight_at_the_broker() {
    let inflight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (now, high) = (inflight.clone(), peak.clone());
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let (now, high) = (now.clone(), high.clone());
        async move {
            let current = now.fetch_add(1, Ordering::SeqCst) + 1;
            high.fetch_max(current, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            let ack = ProduceResponse {
                records_acknowledged: produce_of(&frame).records.count(),
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let config = ClientConfig {
        inflight_requests_max: 3,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();

    let calls = (0..12).map(|_| {
        let client = client.clone();
        async move { client.produce("t", batch_of(1)).await }
    });
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }

    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 3,
        "{peak} requests were in flight with a window of 3"
    );
    assert!(peak >= 2, "requests were not pipelined (peak {peak})");
}

#[tokio::test]
async fn the_producer_keeps_its_window_full_and_counts_acknowledgements() {
    let addr = fake_broker(Arc::new(move |frame, tx| {
        async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let ack = ProduceResponse {
                records_acknowledged: produce_of(&frame).records.count(),
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 4);

    for _ in 0..10 {
        producer.send(batch_of(10)).await.unwrap();
        assert!(producer.inflight() <= 4);
    }
    assert_eq!(producer.flush().await.unwrap(), 100);
}

#[tokio::test]
async fn a_sent_batch_reaches_the_broker_without_waiting_for_its_ack() {
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<u32>();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let seen_tx = seen_tx.clone();
        async move {
            let count = produce_of(&frame).records.count();
            seen_tx.send(count).unwrap();
            let ack = ProduceResponse {
                records_acknowledged: count,
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 4);

    assert_eq!(producer.send(batch_of(3)).await.unwrap(), None);
    // The caller now waits on something else (stdin, say), not on the
    // producer: the request must reach the broker all the same.
    let received = tokio::time::timeout(Duration::from_secs(2), seen.recv())
        .await
        .expect("the broker never received the sent batch");
    assert_eq!(received, Some(3));

    let ack = tokio::time::timeout(Duration::from_secs(2), producer.next_ack())
        .await
        .expect("the ack never arrived")
        .unwrap()
        .expect("one request was in flight");
    assert_eq!(ack.records_acknowledged, 3);
    assert_eq!(producer.records_acknowledged(), 3);
    assert_eq!(producer.inflight(), 0);
}

#[tokio::test]
async fn the_producer_never_has_more_than_its_window_at_the_broker() {
    let inflight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (now, high) = (inflight.clone(), peak.clone());
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let (now, high) = (now.clone(), high.clone());
        async move {
            let current = now.fetch_add(1, Ordering::SeqCst) + 1;
            high.fetch_max(current, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            let ack = ProduceResponse {
                records_acknowledged: produce_of(&frame).records.count(),
                ranges: Vec::new(),
            };
            tx.send(ok(frame.correlation_id, &ack)).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 2);

    for _ in 0..8 {
        producer.send(batch_of(1)).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), 8);

    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 2,
        "{peak} requests were in flight with a window of 2"
    );
    assert_eq!(peak, 2, "the producer did not keep its window full");
}

/// Refuses every request `no_quorum` (retriable).
fn refuse_no_quorum(
    frame: RequestFrame,
    tx: mpsc::Sender<ResponseFrame>,
) -> BoxFuture<'static, ()> {
    async move {
        tx.send(refusal(
            frame.correlation_id,
            ErrorCode::NoQuorum,
            ErrorBody::default(),
        ))
        .await
        .unwrap();
    }
    .boxed()
}

/// A fake topic of five records served two per fetch; cursors name the next index.
fn serve_five_records(
    frame: RequestFrame,
    tx: mpsc::Sender<ResponseFrame>,
) -> BoxFuture<'static, ()> {
    async move {
        let fetch = FetchRequest::decode(frame.payload.clone()).unwrap();
        let from = match (&fetch.cursor, fetch.from_start) {
            (Some(cursor), _) => cursor.trim_start_matches('c').parse::<usize>().unwrap(),
            (None, true) => 0,
            (None, false) => 5,
        };
        let to = (from + 2).min(5).min(from + fetch.records_max as usize);
        let records: Vec<Record> = (from..to)
            .map(|i| Record::new(format!("k{i}"), format!("v{i}")))
            .collect();
        let response = FetchResponse {
            next_cursor: format!("c{to}"),
            records: RecordBatch::from_records(&records, 1 << 20).unwrap(),
        };
        tx.send(ok(frame.correlation_id, &response)).await.unwrap();
    }
    .boxed()
}

#[tokio::test]
async fn consuming_from_the_start_reads_every_record_and_ends_with_the_resume_cursor() {
    let addr = fake_broker(Arc::new(serve_five_records)).await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut consumer = client.consume("t", StartAt::Start, ConsumeOptions::default());

    let mut values = Vec::new();
    while let Some(item) = consumer.next().await {
        values.push(item.unwrap().record.value);
    }

    assert_eq!(values.len(), 5);
    assert_eq!(values[4], Bytes::from("v4"));
    assert_eq!(consumer.cursor(), Some("c5"));
}

#[tokio::test]
async fn a_consumer_with_a_total_max_stops_exactly_and_its_cursor_resumes_after_it() {
    let addr = fake_broker(Arc::new(serve_five_records)).await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let options = ConsumeOptions {
        records_total_max: Some(3),
        ..ConsumeOptions::default()
    };
    let first: Vec<_> = client
        .consume("t", StartAt::Start, options)
        .into_stream()
        .collect()
        .await;
    assert_eq!(first.len(), 3);
    let cursor = first[2].as_ref().unwrap().cursor_after.clone().unwrap();
    assert_eq!(cursor, "c3");

    let rest: Vec<_> = client
        .consume("t", StartAt::Cursor(cursor), ConsumeOptions::default())
        .into_stream()
        .map(|item| item.unwrap().record.key)
        .collect()
        .await;
    assert_eq!(rest, vec![Bytes::from("k3"), Bytes::from("k4")]);
}

#[tokio::test]
async fn a_subscription_receives_pushes_takes_credit_and_ends_after_cancel() {
    let addr = fake_broker(Arc::new(move |frame, tx| {
        async move {
            let id = frame.correlation_id;
            if frame.api_key == ApiKey::Subscribe.code() {
                let accepted = SubscribePush {
                    sequence: 0,
                    next_cursor: "s0".into(),
                    ..SubscribePush::default()
                };
                tx.send(ok(id, &accepted)).await.unwrap();
                let push = SubscribePush {
                    sequence: 1,
                    next_cursor: "s2".into(),
                    last: false,
                    records: batch_of(2),
                };
                tx.send(ok(id, &push)).await.unwrap();
            } else {
                let credit = SubscribeCreditRequest::decode(frame.payload.clone()).unwrap();
                let answer = SubscribeCreditResponse {
                    credit_records: credit.credit_records,
                    credit_bytes: credit.credit_bytes,
                };
                tx.send(ok(id, &answer)).await.unwrap();
                if credit.cancel {
                    let last = SubscribePush {
                        sequence: 2,
                        next_cursor: "s2".into(),
                        last: true,
                        ..SubscribePush::default()
                    };
                    tx.send(ok(credit.subscription_id, &last)).await.unwrap();
                }
            }
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut subscription = client
        .subscribe("t", StartAt::Start, 10, 4096)
        .await
        .unwrap();
    assert_eq!(subscription.cursor(), "s0");

    let batch = subscription.next().await.unwrap().unwrap();
    assert_eq!((batch.sequence, batch.records.count()), (1, 2));
    let granted = subscription.grant(2, 100, Some(1)).await.unwrap();
    assert_eq!(granted.credit_records, 2);

    subscription.cancel().await.unwrap();
    assert!(subscription.next().await.is_none());
    assert_eq!(subscription.cursor(), "s2");
}

#[tokio::test]
async fn an_unreachable_first_address_falls_through_to_the_next() {
    let addr = fake_broker(Arc::new(|frame, tx| {
        async move {
            tx.send(ok(frame.correlation_id, &ListTopicsResponse::default()))
                .await
                .unwrap();
        }
        .boxed()
    }))
    .await;
    // Port 9 (discard) on loopback is closed on test machines.
    let client = Client::connect_with(["127.0.0.1:9".to_owned(), addr], quick_config())
        .await
        .unwrap();
    assert!(client.list_topics().await.unwrap().topics.is_empty());
}

#[tokio::test]
async fn a_connection_the_broker_drops_is_reopened_and_the_request_retried() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let produces = Arc::new(AtomicUsize::new(0));
    let seen = produces.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let (read_half, write_half) = socket.into_split();
                let mut requests = FramedRead::new(read_half, ServerCodec::default());
                let mut responses = FramedWrite::new(write_half, ServerCodec::default());
                while let Some(Ok(frame)) = requests.next().await {
                    let id = frame.correlation_id;
                    let response = if frame.api_key == ApiKey::ApiVersions.code() {
                        ok(
                            id,
                            &ApiVersionsResponse {
                                node_id: 1,
                                versions: ApiVersion::supported(),
                            },
                        )
                    } else if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        // The first produce: vanish without answering.
                        return;
                    } else {
                        ok(
                            id,
                            &ProduceResponse {
                                records_acknowledged: produce_of(&frame).records.count(),
                                ranges: Vec::new(),
                            },
                        )
                    };
                    responses.send(response).await.unwrap();
                }
            });
        }
    });
    let client = Client::connect_with([addr], quick_config()).await.unwrap();

    let ack = client.produce("t", batch_of(2)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 2);
    assert_eq!(produces.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_key_the_broker_shares_no_version_with_is_refused_without_sending() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let others = Arc::new(AtomicUsize::new(0));
    let seen = others.clone();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let (read_half, write_half) = socket.into_split();
        let mut requests = FramedRead::new(read_half, ServerCodec::default());
        let mut responses = FramedWrite::new(write_half, ServerCodec::default());
        while let Some(Ok(frame)) = requests.next().await {
            if frame.api_key != ApiKey::ApiVersions.code() {
                seen.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            // An old broker: every key but tree_snapshot.
            let versions = ApiVersion::supported()
                .into_iter()
                .filter(|v| v.api_key != ApiKey::TreeSnapshot.code())
                .collect();
            let answer = ApiVersionsResponse {
                node_id: 1,
                versions,
            };
            responses
                .send(ok(frame.correlation_id, &answer))
                .await
                .unwrap();
        }
    });
    let client = Client::connect_with([addr], quick_config()).await.unwrap();

    let error = client.tree_snapshot().await.unwrap_err();

    assert!(
        matches!(
            error,
            ClientError::Unsupported {
                api: "tree_snapshot",
                ..
            }
        ),
        "{error:?}"
    );
    // An absence (nothing reaches the broker), watched for 20 ms: there is
    // no condition to wait on.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(others.load(Ordering::SeqCst), 0, "the request was sent");
}

#[tokio::test]
async fn dropping_an_open_subscription_asks_the_broker_to_cancel_it() {
    let (cancelled_tx, mut cancelled) = mpsc::channel::<u32>(1);
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let cancelled_tx = cancelled_tx.clone();
        async move {
            if frame.api_key == ApiKey::Subscribe.code() {
                let accepted = SubscribePush {
                    next_cursor: "s0".into(),
                    ..SubscribePush::default()
                };
                tx.send(ok(frame.correlation_id, &accepted)).await.unwrap();
            } else {
                let credit = SubscribeCreditRequest::decode(frame.payload.clone()).unwrap();
                assert!(credit.cancel);
                cancelled_tx.send(credit.subscription_id).await.unwrap();
            }
        }
        .boxed()
    }))
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let subscription = client
        .subscribe("t", StartAt::Tail, 10, 4096)
        .await
        .unwrap();
    let id = subscription.id();

    drop(subscription);

    let cancelled = tokio::time::timeout(Duration::from_secs(2), cancelled.recv())
        .await
        .unwrap();
    assert_eq!(cancelled, Some(id));
}

/// A broker at its connection limit answers a new socket with one `busy`
/// frame on the reserved correlation id 0 and closes it. Regression: the
/// client ignored that frame and reported "connection closed", so the CLI
/// never said the broker was busy.
#[tokio::test]
async fn a_goodbye_frame_on_correlation_id_zero_is_reported_as_the_brokers_refusal() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let refused = Arc::new(AtomicUsize::new(0));
    let counter = refused.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut out = FramedWrite::new(socket, ServerCodec::default());
            let body = ErrorBody {
                message: "too many connections".into(),
                leader_hint: None,
                retry_after_ms: Some(1),
                ranges: None,
            };
            let _ = out.send(refusal(0, ErrorCode::Busy, body)).await;
            // Dropping `out` closes the socket after the frame.
        }
    });

    let error = Client::connect_with([addr], quick_config())
        .await
        .expect_err("every connection is refused");

    assert_eq!(error.code(), Some(ErrorCode::Busy), "{error}");
    assert!(error.retriable());
    assert!(
        error.to_string().contains("too many connections"),
        "{error}"
    );
    assert!(refused.load(Ordering::SeqCst) >= 1);
}

/// The sequences a fake broker saw, in arrival order, and an answer rule.
/// The answer to a produce: acknowledged whole, or refused with `code`
/// (retry after 1 ms).
fn produce_answer(
    correlation_id: u32,
    request: &ProduceRequest,
    code: Option<ErrorCode>,
) -> ResponseFrame {
    match code {
        None => ok(
            correlation_id,
            &ProduceResponse {
                records_acknowledged: request.records.count(),
                ranges: Vec::new(),
            },
        ),
        Some(code) => refusal(
            correlation_id,
            code,
            ErrorBody {
                message: "refused".into(),
                leader_hint: None,
                retry_after_ms: Some(1),
                ranges: None,
            },
        ),
    }
}

async fn recording_broker(
    answer: impl Fn(u64, usize) -> Option<ErrorCode> + Send + Sync + 'static,
) -> (String, Arc<std::sync::Mutex<Vec<u64>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let answer = Arc::new(answer);
    let log = seen.clone();
    // Arrival order is recorded before any task runs: the handler is
    // called in frame order, so it records synchronously.
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let request = produce_of(&frame);
        let producer = request.producer.expect("the producer tags every request");
        let attempt = {
            let mut seen = log.lock().unwrap();
            seen.push(producer.sequence);
            seen.iter().filter(|s| **s == producer.sequence).count()
        };
        let refusal_code = answer(producer.sequence, attempt);
        async move {
            let frame = produce_answer(frame.correlation_id, &request, refusal_code);
            tx.send(frame).await.unwrap();
        }
        .boxed()
    }))
    .await;
    (addr, seen)
}

#[tokio::test]
async fn the_producer_writes_a_ranges_sequences_in_send_order_whatever_its_window() {
    let (addr, seen) = recording_broker(|_, _| None).await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 64);
    for _ in 0..500 {
        producer.send(batch_of(2)).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), 1000);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, (0..500).collect::<Vec<u64>>());
    assert_eq!(producer.acknowledged_ordinals(), vec![(0, 1000)]);
}

#[tokio::test]
async fn a_busy_batch_is_resent_with_its_sequence_and_a_gap_behind_it_after_it() {
    // Sequence 3 is refused busy once; 4 and 5, pipelined behind it, get
    // sequence_gap on their first try (as a broker that did not store 3
    // answers). Every batch is then resent with its own sequence, in order.
    let (addr, seen) = recording_broker(|sequence, attempt| match (sequence, attempt) {
        (3, 1) => Some(ErrorCode::Busy),
        (4 | 5, 1) => Some(ErrorCode::SequenceGap),
        _ => None,
    })
    .await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 8);
    for _ in 0..8 {
        producer.send(batch_of(1)).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), 8);
    let seen = seen.lock().unwrap().clone();
    let resent: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|s| (3..=5).contains(s))
        .collect();
    assert_eq!(resent, vec![3, 4, 5, 3, 4, 5], "arrivals: {seen:?}");
}

#[tokio::test]
async fn a_fenced_producer_stops_and_says_how_much_was_acknowledged() {
    let (addr, _seen) =
        recording_broker(|sequence, _| (sequence >= 2).then_some(ErrorCode::ProducerFenced)).await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 1);
    let mut failed = None;
    for _ in 0..5 {
        if let Err(e) = producer.send(batch_of(1)).await {
            failed = Some(e);
            break;
        }
    }
    let error = match failed {
        Some(e) => e,
        None => producer.flush().await.unwrap_err(),
    };
    assert!(error.to_string().contains("producer_fenced"), "{error}");
    assert_eq!(producer.records_acknowledged(), 2);
    assert_eq!(producer.acknowledged_ordinals(), vec![(0, 2)]);
}

#[tokio::test]
async fn a_consumer_retries_a_fetch_refused_as_retriable_until_the_broker_serves_it() {
    // Regression: a broker that has not yet learned the cluster's cursor key
    // answers a fetch `no_quorum` (retriable) for a moment after a start;
    // `malachi consume` gave up on it at once, beyond the client's few quick
    // retries.
    let refusals = Arc::new(AtomicUsize::new(0));
    let counter = refusals.clone();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        if counter.fetch_add(1, Ordering::SeqCst) < 8 {
            refuse_no_quorum(frame, tx)
        } else {
            serve_five_records(frame, tx)
        }
    }))
    .await;
    let config = ClientConfig {
        retries_max: 1,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();
    let mut consumer = client.consume("t", StartAt::Start, ConsumeOptions::default());
    let mut values = Vec::new();
    while let Some(item) = consumer.next().await {
        values.push(item.unwrap().record.value);
    }
    assert_eq!(values.len(), 5, "every record, once the broker served");
    assert!(refusals.load(Ordering::SeqCst) > 8);
}

#[tokio::test]
async fn a_consumer_gives_up_on_a_retriable_refusal_after_its_retry_budget() {
    let addr = fake_broker(Arc::new(refuse_no_quorum)).await;
    let client = Client::connect_with([addr], quick_config()).await.unwrap();
    let options = ConsumeOptions {
        retry_ms_max: 300,
        ..ConsumeOptions::default()
    };
    let mut consumer = client.consume("t", StartAt::Start, options);
    let error = consumer.next().await.unwrap().unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::NoQuorum));
    assert!(consumer.next().await.is_none(), "it ends after the error");
}

/// Regression (chaos finding F2, seed 2718): a batch whose first attempt
/// got no answer (stored, for all the producer knows) was sent again under
/// the new epoch an `unknown_producer` of a later batch started, and the
/// range stored it twice. Now the session ends instead of sending it under
/// another epoch, and says why.
#[tokio::test]
async fn a_batch_with_an_unknown_outcome_is_never_sent_again_under_a_new_epoch() {
    // (epoch, sequence, first record's value) of every arrival.
    type Arrivals = Arc<std::sync::Mutex<Vec<(u64, u64, Vec<u8>)>>>;
    let seen: Arrivals = Arc::default();
    let log = seen.clone();
    let first_epoch: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
    let addr = fake_broker(Arc::new(move |frame, tx| {
        let request = produce_of(&frame);
        let producer = request.producer.expect("the producer tags every request");
        let value = request
            .records
            .records()
            .first()
            .map(|r| r.value.to_vec())
            .unwrap_or_default();
        let attempt = {
            let mut seen = log.lock().unwrap();
            seen.push((producer.epoch, producer.sequence, value));
            seen.iter()
                .filter(|(e, s, _)| *e == producer.epoch && *s == producer.sequence)
                .count()
        };
        let epoch0 = *first_epoch.lock().unwrap().get_or_insert(producer.epoch);
        // The first batch is stored but its answer is lost; the second is
        // refused as if the range had lost the producer (a failover); the
        // range then knows only the newer epoch.
        let answer = match (producer.epoch == epoch0, producer.sequence, attempt) {
            (true, 0, 1) => None,
            (true, 1, _) => Some(Some(ErrorCode::UnknownProducer)),
            (true, _, _) => Some(Some(ErrorCode::ProducerFenced)),
            (false, _, _) => Some(None),
        };
        async move {
            let Some(code) = answer else {
                // No answer: the client's request times out.
                return;
            };
            let frame = produce_answer(frame.correlation_id, &request, code);
            tx.send(frame).await.unwrap();
        }
        .boxed()
    }))
    .await;
    let config = ClientConfig {
        request_timeout_ms: 300,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();
    let mut producer = client.producer("t", 4);
    producer.set_delivery_timeout(Duration::from_secs(10));
    let mut result = Ok(());
    for n in 0..2 {
        let batch =
            RecordBatch::from_records(&[Record::new("k", format!("batch-{n}"))], 1 << 20).unwrap();
        if let Err(e) = producer.send(batch).await {
            result = Err(e);
            break;
        }
    }
    let error = match result {
        Err(e) => e,
        Ok(()) => producer.flush().await.unwrap_err(),
    };
    assert!(error.to_string().contains("unknown outcome"), "{error}");
    let seen = seen.lock().unwrap().clone();
    let epoch0 = seen[0].0;
    let first_value = seen[0].2.clone();
    assert!(
        !seen
            .iter()
            .any(|(epoch, _, value)| *epoch != epoch0 && *value == first_value),
        "the first batch went out again under a new epoch: {seen:?}"
    );
}

// ------------------------------------------- moving off an isolated primary

/// A fake broker that acknowledges every produce and counts them.
async fn acking_broker(count: Arc<AtomicUsize>) -> String {
    fake_broker(Arc::new(move |frame, tx| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            let request = produce_of(&frame);
            let frame = produce_answer(frame.correlation_id, &request, None);
            tx.send(frame).await.unwrap();
        }
        .boxed()
    }))
    .await
}

/// A fake old primary cut off from its followers: every produce is
/// refused `no_quorum` (retriable, no hint), as an isolated primary
/// answers; `cluster_status` lists `others` as the cluster's brokers.
async fn isolated_primary(produces: Arc<AtomicUsize>, others: Vec<String>) -> String {
    fake_broker(Arc::new(move |frame, tx| {
        let others = others.clone();
        let produces = produces.clone();
        async move {
            if frame.api_key == ApiKey::ClusterStatus.code() {
                let status = ClusterStatusResponse {
                    node_id: 1,
                    brokers: others
                        .iter()
                        .enumerate()
                        .map(|(i, addr)| BrokerStatus {
                            node_id: i as u64 + 2,
                            client_addr: addr.clone(),
                            ..BrokerStatus::default()
                        })
                        .collect(),
                };
                tx.send(ok(frame.correlation_id, &status)).await.unwrap();
                return;
            }
            produces.fetch_add(1, Ordering::SeqCst);
            refuse_no_quorum(frame, tx).await;
        }
        .boxed()
    }))
    .await
}

/// Regression (issue 36): an isolated primary answers `no_quorum`, and the
/// client retried there, waiting out the whole partition although the
/// cluster had failed the segment over. It now asks the next broker it
/// knows, which serves the topic.
#[tokio::test]
async fn a_call_refused_no_quorum_goes_to_the_next_known_broker() {
    let old_seen = Arc::new(AtomicUsize::new(0));
    let old = isolated_primary(old_seen.clone(), Vec::new()).await;
    let new_seen = Arc::new(AtomicUsize::new(0));
    let new = acking_broker(new_seen.clone()).await;
    let client = Client::connect_with([old, new], quick_config())
        .await
        .unwrap();

    let ack = client.produce("t", batch_of(2)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 2);
    assert_eq!(
        old_seen.load(Ordering::SeqCst),
        1,
        "one attempt at the old primary"
    );
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
    // The topic now goes to the broker that served it.
    client.produce("t", batch_of(1)).await.unwrap();
    assert_eq!(old_seen.load(Ordering::SeqCst), 1);
    assert_eq!(new_seen.load(Ordering::SeqCst), 2);
}

/// A client given only the old primary's address learns the others from
/// its `cluster_status` and moves there.
#[tokio::test]
async fn a_client_that_knows_only_the_isolated_primary_learns_the_other_brokers() {
    let new_seen = Arc::new(AtomicUsize::new(0));
    let new = acking_broker(new_seen.clone()).await;
    let old_seen = Arc::new(AtomicUsize::new(0));
    let old = isolated_primary(old_seen.clone(), vec![new]).await;
    let client = Client::connect_with([old], quick_config()).await.unwrap();

    let ack = client.produce("t", batch_of(3)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 3);
    assert_eq!(old_seen.load(Ordering::SeqCst), 1);
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
}

/// A loopback address nothing listens on: a port the OS just handed out
/// and took back.
fn dead_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    addr
}

/// Bootstrap from several brokers: a dead first address is skipped, and the
/// broker that answers tells the client of the others at once, so a call it
/// cannot serve goes to a broker that was never in the bootstrap list.
#[tokio::test]
async fn a_client_bootstrapped_past_a_dead_broker_learns_the_others_on_connect() {
    let new_seen = Arc::new(AtomicUsize::new(0));
    let new = acking_broker(new_seen.clone()).await;
    let old_seen = Arc::new(AtomicUsize::new(0));
    let old = isolated_primary(old_seen.clone(), vec![new]).await;
    let dead = dead_addr();
    let config = ClientConfig {
        discover_on_connect: true,
        ..quick_config()
    };
    let client = Client::connect_with([dead, old], config).await.unwrap();

    let ack = client.produce("t", batch_of(3)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 3);
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
}

/// Every bootstrap address dead: the error names each one, and comes as
/// soon as they have all refused, not at the deadline.
#[tokio::test]
async fn a_bootstrap_list_of_dead_brokers_fails_at_once_naming_each() {
    let dead: Vec<String> = (0..2).map(|_| dead_addr()).collect();
    let config = ClientConfig {
        request_timeout_ms: 30_000,
        ..quick_config()
    };
    let started = std::time::Instant::now();
    let error = Client::connect_with(dead.clone(), config)
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    assert!(matches!(error, ClientError::Unreachable { ref tried } if tried.len() == 2));
    let text = error.to_string();
    for addr in &dead {
        assert!(text.contains(addr.as_str()), "{text}");
    }
}

/// The idempotent producer moves too, keeping its sequences: the batch
/// refused `no_quorum` by the old primary is stored once, at the new one.
#[tokio::test]
async fn the_producer_moves_off_a_primary_that_answers_no_quorum() {
    let new_seen = Arc::new(AtomicUsize::new(0));
    let new = acking_broker(new_seen.clone()).await;
    let old_seen = Arc::new(AtomicUsize::new(0));
    let old = isolated_primary(old_seen.clone(), vec![new]).await;
    let client = Client::connect_with([old], quick_config()).await.unwrap();
    let mut producer = client.producer("t", 4);

    for _ in 0..5 {
        producer.send(batch_of(2)).await.unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), 10);
    assert!(old_seen.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        new_seen.load(Ordering::SeqCst),
        5,
        "each batch once at the new primary"
    );
}

/// A producer whose answers stop coming (a primary cut off from this client
/// alone) asks another broker rather than waiting on the silent one.
#[tokio::test]
async fn the_producer_moves_off_a_primary_that_does_not_answer() {
    let silent_seen = Arc::new(AtomicUsize::new(0));
    let silent = silent_broker(silent_seen.clone()).await;
    let new_seen = Arc::new(AtomicUsize::new(0));
    let new = acking_broker(new_seen.clone()).await;
    let config = ClientConfig {
        request_timeout_ms: 200,
        ..quick_config()
    };
    let client = Client::connect_with([silent, new], config).await.unwrap();
    let mut producer = client.producer("t", 1);
    producer.set_delivery_timeout(Duration::from_secs(10));

    producer.send(batch_of(2)).await.unwrap();
    assert_eq!(producer.flush().await.unwrap(), 2);
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1);
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
}

/// Issue 36: a call that timed out at a paused primary (its connection
/// open, nothing answered) left the topic routed there, so every later
/// call waited out the whole pause (11.6 s in each trial of `malachi bench
/// failover --fault pause`). The timed-out call is still not retried, but
/// the next one goes to another broker the client knows.
#[tokio::test]
async fn after_a_timeout_the_next_call_goes_to_another_broker() {
    let silent_seen = Arc::new(AtomicUsize::new(0));
    let silent = silent_broker(silent_seen.clone()).await;
    let other_seen = Arc::new(AtomicUsize::new(0));
    let other = acking_broker(other_seen.clone()).await;
    let config = ClientConfig {
        request_timeout_ms: 200,
        ..quick_config()
    };
    let client = Client::connect_with([silent, other], config).await.unwrap();

    let error = client.produce("t", batch_of(1)).await.unwrap_err();
    assert!(matches!(error, ClientError::Timeout { .. }), "{error:?}");
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1, "not retried");
    client.produce("t", batch_of(1)).await.unwrap();
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1);
    assert_eq!(other_seen.load(Ordering::SeqCst), 1);
}

/// A fake survivor of a paused primary: its first `stale` produces are
/// refused `not_leader` naming `old` (the failover is not recorded yet),
/// the rest name `new`.
async fn survivor_hinting(
    seen: Arc<AtomicUsize>,
    stale: usize,
    old: String,
    new: String,
) -> String {
    fake_broker(Arc::new(move |frame, tx| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        let hint = if n < stale { old.clone() } else { new.clone() };
        async move {
            let body = ErrorBody {
                message: "not the leader".into(),
                leader_hint: Some(hint),
                retry_after_ms: None,
                ranges: None,
            };
            tx.send(refusal(frame.correlation_id, ErrorCode::NotLeader, body))
                .await
                .unwrap();
        }
        .boxed()
    }))
    .await
}

/// A fake paused primary: it accepts connections, answers `api_versions`
/// (the fake does) and nothing else.
async fn silent_broker(seen: Arc<AtomicUsize>) -> String {
    fake_broker(Arc::new(move |_frame, _tx| {
        seen.fetch_add(1, Ordering::SeqCst);
        futures::future::pending().boxed()
    }))
    .await
}

/// A paused primary, a survivor that names it twice before it names the
/// new primary, and the new primary; a client bootstrapped at the paused
/// one. The counters: the paused one's, the survivor's, the new one's.
async fn after_a_pause(request_timeout_ms: u64) -> (Client, [Arc<AtomicUsize>; 3]) {
    let seen = [(); 3].map(|_| Arc::new(AtomicUsize::new(0)));
    let silent = silent_broker(seen[0].clone()).await;
    let new = acking_broker(seen[2].clone()).await;
    let survivor = survivor_hinting(seen[1].clone(), 2, silent.clone(), new).await;
    let config = ClientConfig {
        request_timeout_ms,
        ..quick_config()
    };
    let client = Client::connect_with([silent, survivor], config)
        .await
        .unwrap();
    (client, seen)
}

/// Regression (issue 36, ADR 0128): after a timeout at a paused primary the
/// next call went to another broker, which named the paused one until its
/// failover was recorded; the client followed that hint at once and waited
/// out a second timeout (first acknowledgement after a pause at p50 2.1 s).
/// A hint naming a broker that just timed out is now answered by asking the
/// hinting broker again, until it names the new primary.
#[tokio::test]
async fn a_hint_back_to_a_broker_that_just_timed_out_is_not_followed() {
    let (client, [silent_seen, survivor_seen, new_seen]) = after_a_pause(600).await;

    let error = client.produce("t", batch_of(1)).await.unwrap_err();
    assert!(matches!(error, ClientError::Timeout { .. }), "{error:?}");
    let ack = client.produce("t", batch_of(1)).await.unwrap();

    assert_eq!(ack.records_acknowledged, 1);
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1, "not asked again");
    assert_eq!(
        survivor_seen.load(Ordering::SeqCst),
        3,
        "asked until it named the new one"
    );
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
}

/// The same for the pipelined producer: its batch, timed out at the paused
/// primary, goes to a survivor and waits there for the new primary's name.
#[tokio::test]
async fn the_producer_does_not_follow_a_hint_back_to_a_broker_that_just_timed_out() {
    let (client, [silent_seen, survivor_seen, new_seen]) = after_a_pause(200).await;
    let mut producer = client.producer("t", 1);
    producer.set_delivery_timeout(Duration::from_secs(10));

    producer.send(batch_of(2)).await.unwrap();
    assert_eq!(producer.flush().await.unwrap(), 2);
    assert_eq!(silent_seen.load(Ordering::SeqCst), 1, "not asked again");
    assert_eq!(survivor_seen.load(Ordering::SeqCst), 3);
    assert_eq!(new_seen.load(Ordering::SeqCst), 1);
}

/// The description of topic "two": two ranges, 1 (the lower half of the
/// keyspace) and 2 (the upper).
fn two_range_topic() -> DescribeTopicResponse {
    let range = |id: u64, start: &str, end: &str| RangeDescription {
        id,
        band_start: start.into(),
        band_end: end.into(),
        state: "active".into(),
        ..RangeDescription::default()
    };
    DescribeTopicResponse {
        topic: TopicDescription {
            name: "two".into(),
            ranges: vec![
                range(1, "0x0000000000000000", "0x8000000000000000"),
                range(2, "0x8000000000000000", "0x10000000000000000"),
            ],
            ..TopicDescription::default()
        },
    }
}

/// A fake primary of range `mine` of topic "two": it acknowledges that
/// range's parts and refuses the other's `not_leader` naming `other`
/// (read once `other` is known), counting each.
async fn range_primary(
    mine: u64,
    other: Arc<std::sync::Mutex<String>>,
    acked: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> String {
    fake_broker(Arc::new(move |frame, tx| {
        let other = other.lock().unwrap().clone();
        let (acked, refused) = (acked.clone(), refused.clone());
        async move {
            if frame.api_key == ApiKey::DescribeTopic.code() {
                tx.send(ok(frame.correlation_id, &two_range_topic()))
                    .await
                    .unwrap();
                return;
            }
            let request = produce_of(&frame);
            let range = request.producer.as_ref().map(|p| p.range).unwrap();
            if range == mine {
                acked.fetch_add(1, Ordering::SeqCst);
                let answer = produce_answer(frame.correlation_id, &request, None);
                tx.send(answer).await.unwrap();
                return;
            }
            refused.fetch_add(1, Ordering::SeqCst);
            let body = ErrorBody {
                message: format!("range {range} of topic two is written by another broker"),
                leader_hint: Some(other),
                retry_after_ms: None,
                ranges: None,
            };
            tx.send(refusal(frame.correlation_id, ErrorCode::NotLeader, body))
                .await
                .unwrap();
        }
        .boxed()
    }))
    .await
}

/// Regression (issue 36, the five-broker long run): the producer routed a
/// whole topic to one broker, so when its ranges had different primaries
/// every hint about one range moved the other's parts too, and the
/// producer bounced between the two brokers. Routes are now per range:
/// each broker refuses the other's range once, then never sees it again.
#[tokio::test]
async fn the_producer_routes_each_range_to_its_own_primary() {
    let (a_addr, b_addr) = (
        Arc::new(std::sync::Mutex::new(String::new())),
        Arc::new(std::sync::Mutex::new(String::new())),
    );
    let (a_acked, a_refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b_acked, b_refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = range_primary(1, b_addr.clone(), a_acked.clone(), a_refused.clone()).await;
    let b = range_primary(2, a_addr.clone(), b_acked.clone(), b_refused.clone()).await;
    *a_addr.lock().unwrap() = a.clone();
    *b_addr.lock().unwrap() = b.clone();
    let client = Client::connect_with([a, b], quick_config()).await.unwrap();
    let mut producer = client.producer("two", 4);
    producer.set_delivery_timeout(Duration::from_secs(10));

    // Keys spread over both halves of the keyspace, one record a batch.
    let batches = 40;
    for i in 0..batches {
        let record = Record::new(format!("key-{i}"), format!("v{i}"));
        producer
            .send(RecordBatch::from_records([&record], 1 << 20).unwrap())
            .await
            .unwrap();
    }
    assert_eq!(producer.flush().await.unwrap(), batches as u64);

    let (lower, upper) = (
        a_acked.load(Ordering::SeqCst),
        b_acked.load(Ordering::SeqCst),
    );
    assert_eq!(lower + upper, batches, "each batch acknowledged once");
    assert!(
        lower > 0 && upper > 0,
        "both ranges written: {lower} and {upper}"
    );
    let bounced = a_refused.load(Ordering::SeqCst) + b_refused.load(Ordering::SeqCst);
    assert!(
        bounced <= 4,
        "parts sent to the other range's primary {bounced} times"
    );
}

// ------------------------------------------------------------- deadlines

/// Regression (issue 36): a call retried a retriable refusal `retries_max`
/// times whatever its timeout, so a command with `--timeout-ms 20000` ran
/// for a minute. Retries now stop at the call's deadline, and the error
/// names what the call was waiting for.
#[tokio::test]
async fn a_calls_retries_stop_at_its_deadline_and_name_the_part_it_waited_for() {
    let addr = fake_broker(Arc::new(refuse_no_quorum)).await;
    let config = ClientConfig {
        request_timeout_ms: 300,
        retries_max: 100_000,
        backoff_initial_ms: 5,
        backoff_max_ms: 5,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();

    let started = std::time::Instant::now();
    let error = client.produce("t", batch_of(1)).await.unwrap_err();
    let took = started.elapsed();

    assert!(
        took >= Duration::from_millis(250),
        "gave up early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1_300),
        "the deadline was not kept: {took:?}"
    );
    assert!(
        matches!(
            error,
            ClientError::Deadline {
                api: "produce",
                timeout_ms: 300,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(ErrorCode::NoQuorum));
    assert!(!error.retriable());
    let text = error.to_string();
    assert!(text.contains("a quorum"), "{text}");
    assert!(text.contains("within the deadline of 300ms"), "{text}");
}

/// Regression (issue 36): the producer's lookup of the topic's layout was
/// a call of its own, retried past the producer's delivery timeout. It now
/// ends with the delivery timeout, and the failure says it was the lookup.
#[tokio::test]
async fn the_producers_metadata_lookup_is_bounded_by_its_delivery_timeout_and_named() {
    let addr = fake_broker(Arc::new(|frame, tx| {
        async move {
            assert_eq!(frame.api_key, ApiKey::DescribeTopic.code());
            tx.send(refusal(
                frame.correlation_id,
                ErrorCode::Busy,
                ErrorBody {
                    message: "vnode 3 has no leader".into(),
                    retry_after_ms: Some(1),
                    ..ErrorBody::default()
                },
            ))
            .await
            .unwrap();
        }
        .boxed()
    }))
    .await;
    let config = ClientConfig {
        request_timeout_ms: 300,
        retries_max: 100_000,
        backoff_initial_ms: 5,
        backoff_max_ms: 5,
        ..quick_config()
    };
    let client = Client::connect_with([addr], config).await.unwrap();
    // A topic the fake does not describe itself: every lookup is refused.
    let mut producer = client.producer("u", 1);

    let started = std::time::Instant::now();
    let result = async {
        producer.send(batch_of(1)).await?;
        producer.flush().await
    }
    .await;
    let took = started.elapsed();

    let error = result.unwrap_err();
    assert!(
        took < Duration::from_millis(1_300),
        "the deadline was not kept: {took:?}"
    );
    let text = error.to_string();
    assert!(text.contains("the metadata lookup of topic u"), "{text}");
    assert!(text.contains("vnode 3 has no leader"), "{text}");
}
