//! The produce and consume paths end to end, in process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::ErrorCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn produce_then_fetch_from_start_and_resume_by_cursor_keeps_per_key_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("orders").await;

    let mut sent = Vec::new();
    for batch in 0..10 {
        let records: Vec<_> = (0..20)
            .map(|i| record(&format!("key-{}", i % 7), &format!("v{batch}-{i}")))
            .collect();
        assert_eq!(client.produce("orders", &records).await.unwrap(), 20);
        sent.extend(records);
    }

    // Read in small pages, each resuming from the previous cursor.
    let (mut got, mut cursor) = client.fetch("orders", None, true, 30, 0).await.unwrap();
    assert_eq!(got.len(), 30);
    loop {
        let (page, next) = client
            .fetch("orders", Some(cursor.clone()), false, 30, 0)
            .await
            .unwrap();
        cursor = next;
        if page.is_empty() {
            break;
        }
        got.extend(page);
    }
    assert_eq!(got.len(), sent.len());
    assert_eq!(by_key(&got), by_key(&sent));

    // The last cursor sees exactly what is produced after it.
    client
        .produce("orders", &[record("late", "1")])
        .await
        .unwrap();
    let (page, _) = client
        .fetch("orders", Some(cursor), false, 100, 0)
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(&page[0].value[..], b"1");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_broker_on_the_same_data_dir_keeps_topics_records_and_cursors() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let incarnation = client.create_topic("events").await;
    let records: Vec<_> = (0..50)
        .map(|i| record(&format!("k{}", i % 5), &i.to_string()))
        .collect();
    client.produce("events", &records).await.unwrap();
    let (first, cursor) = client.fetch("events", None, true, 10, 0).await.unwrap();
    assert_eq!(first.len(), 10);
    drop(client);
    broker.shutdown().await.unwrap();

    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let topics = client
        .call(&malachi_wire::messages::ListTopicsRequest {})
        .await
        .unwrap();
    assert_eq!(topics.topics.len(), 1);
    assert_eq!(topics.topics[0].incarnation, incarnation);
    // The old cursor is still genuine (the secret persisted) and resumes.
    let (rest, _) = client
        .fetch("events", Some(cursor), false, 1000, 0)
        .await
        .unwrap();
    let mut all = first;
    all.extend(rest);
    assert_eq!(by_key(&all), by_key(&records));
    // And the topic still takes writes.
    client
        .produce("events", &[record("k0", "after")])
        .await
        .unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn segments_roll_by_size_and_a_reader_crosses_them_in_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        segment_bytes_max: 4 * 1024,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("big").await;
    let value = "x".repeat(200);
    let mut sent = Vec::new();
    for batch in 0..40 {
        let records: Vec<_> = (0..5)
            .map(|i| record(&format!("key-{}", i % 3), &format!("{batch}-{i}-{value}")))
            .collect();
        client.produce("big", &records).await.unwrap();
        sent.extend(records);
    }
    let described = client
        .call(&malachi_wire::messages::DescribeTopicRequest {
            name: "big".into(),
            live: false,
        })
        .await
        .unwrap();
    let segments = &described.topic.ranges[0].segments;
    assert!(
        segments.len() >= 5,
        "expected several segments, got {}",
        segments.len()
    );
    assert!(
        segments[..segments.len() - 1]
            .iter()
            .all(|s| s.state == "sealed")
    );
    let sealed_total: u64 = segments.iter().filter_map(|s| s.length).sum();
    assert!(sealed_total > 0);

    let (got, _) = client.fetch("big", None, true, 100_000, 0).await.unwrap();
    assert_eq!(got.len(), sent.len());
    assert_eq!(by_key(&got), by_key(&sent));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn segments_roll_by_age() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        segment_age_ms: 50,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("aging").await;
    client.produce("aging", &[record("a", "1")]).await.unwrap();
    let rolled = eventually(5_000, async || {
        let d = client
            .call(&malachi_wire::messages::DescribeTopicRequest {
                name: "aging".into(),
                live: false,
            })
            .await
            .unwrap();
        d.topic.ranges[0].segments.len() >= 2
    })
    .await;
    assert!(rolled, "the segment never rolled by age");
    client.produce("aging", &[record("a", "2")]).await.unwrap();
    let (got, _) = client.fetch("aging", None, true, 10, 0).await.unwrap();
    let values: Vec<_> = got.iter().map(|r| r.value.to_vec()).collect();
    assert_eq!(values, vec![b"1".to_vec(), b"2".to_vec()]);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_poll_wakes_when_a_record_is_produced() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut consumer = TestClient::connect(broker.client_addr()).await;
    consumer.create_topic("live").await;
    let (empty, tail) = consumer.fetch("live", None, false, 10, 0).await.unwrap();
    assert!(empty.is_empty());

    let started = std::time::Instant::now();
    let poll = tokio::spawn(async move {
        let got = consumer
            .fetch("live", Some(tail), false, 10, 10_000)
            .await
            .unwrap();
        (got, started.elapsed())
    });
    // Pacing, not synchronisation: the produce comes 200 ms into the poll,
    // the gap the assertions below measure.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut producer = TestClient::connect(broker.client_addr()).await;
    producer
        .produce("live", &[record("k", "hello")])
        .await
        .unwrap();
    let ((records, _), elapsed) = poll.await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(&records[0].value[..], b"hello");
    assert!(
        elapsed < Duration::from_secs(5),
        "woke only after {elapsed:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(150),
        "answered before the produce: {elapsed:?}"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_poll_with_nothing_new_answers_empty_after_its_wait() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("quiet").await;
    let started = std::time::Instant::now();
    let (records, _) = client.fetch("quiet", None, false, 10, 300).await.unwrap();
    assert!(records.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(250));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_pipelined_produces_on_one_connection_are_all_acknowledged() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("pipe").await;
    let request = produce_request("pipe", &[record("k", "v")]);
    use malachi_wire::Message;
    let payload = request.encode().unwrap();
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..200 {
        ids.insert(client.send_raw(10, payload.clone()).await);
    }
    for _ in 0..200 {
        let frame = client.recv().await.unwrap();
        assert_eq!(frame.error_code, ErrorCode::None);
        assert!(ids.remove(&frame.correlation_id));
    }
    let (got, _) = client.fetch("pipe", None, true, 1000, 0).await.unwrap();
    assert_eq!(got.len(), 200);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_topic_refuses_produce_and_its_old_cursor() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("gone").await;
    client.produce("gone", &[record("k", "v")]).await.unwrap();
    let (_, cursor) = client.fetch("gone", None, true, 10, 0).await.unwrap();
    client
        .call(&malachi_wire::messages::DeleteTopicRequest {
            name: "gone".into(),
        })
        .await
        .unwrap();
    let refused = client
        .produce("gone", &[record("k", "v")])
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::TopicNotFound);
    client.create_topic("gone").await;
    let refused = client
        .fetch("gone", Some(cursor), false, 10, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::InvalidCursor);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_then_a_merge_keep_every_record_readable_in_key_order() {
    use malachi_wire::messages::{DescribeTopicRequest, MergeRangeRequest, SplitRangeRequest};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("reshaped").await;
    let batch = |round: usize| -> Vec<_> {
        (0..40)
            .map(|i| record(&format!("key-{}", i % 9), &format!("{round}-{i}")))
            .collect()
    };
    let mut sent = batch(0);
    client.produce("reshaped", &sent).await.unwrap();
    let (first, cursor) = client.fetch("reshaped", None, true, 15, 0).await.unwrap();

    let root = client
        .call(&DescribeTopicRequest {
            name: "reshaped".into(),
            live: false,
        })
        .await
        .unwrap()
        .topic
        .ranges[0]
        .id;
    let split = client
        .call(&SplitRangeRequest {
            topic: "reshaped".into(),
            range_id: root,
        })
        .await
        .unwrap();
    assert_eq!(split.children.len(), 2);
    let more = batch(1);
    client.produce("reshaped", &more).await.unwrap();
    sent.extend(more);

    // A cursor from before the split resumes across it.
    let (rest, _) = client
        .fetch("reshaped", Some(cursor), false, 10_000, 0)
        .await
        .unwrap();
    let mut resumed = first;
    resumed.extend(rest);
    assert_eq!(by_key(&resumed), by_key(&sent));

    let merged = client
        .call(&MergeRangeRequest {
            topic: "reshaped".into(),
            range_id: split.children[0],
        })
        .await
        .unwrap();
    assert_eq!(merged.parents, split.children);
    let more = batch(2);
    client.produce("reshaped", &more).await.unwrap();
    sent.extend(more);
    let (all, _) = client
        .fetch("reshaped", None, true, 10_000, 0)
        .await
        .unwrap();
    assert_eq!(by_key(&all), by_key(&sent));

    let tree = broker.tree_snapshot().await.unwrap();
    let storage = tree.child("storage").unwrap().supervisor.as_ref().unwrap();
    let live: Vec<_> = storage
        .children
        .iter()
        .filter(|c| c.name.starts_with("segment/reshaped/"))
        .collect();
    assert_eq!(
        live.len(),
        1,
        "only the merged range's segment stays open: {live:?}"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merging_a_range_without_an_active_buddy_is_not_buddies() {
    use malachi_wire::messages::{DescribeTopicRequest, MergeRangeRequest};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("single").await;
    let root = client
        .call(&DescribeTopicRequest {
            name: "single".into(),
            live: false,
        })
        .await
        .unwrap()
        .topic
        .ranges[0]
        .id;
    let refused = client
        .call(&MergeRangeRequest {
            topic: "single".into(),
            range_id: root,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::NotBuddies);
    client
        .produce("single", &[record("k", "still writable")])
        .await
        .unwrap();
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_rolls_by_age_only_when_the_brokers_clock_says_so() {
    use malachi_actors::{Broker, ManualClock};
    use malachi_wire::messages::DescribeTopicRequest;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(ManualClock::new(1_000_000));
    let config = BrokerConfig {
        segment_age_ms: 60_000,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = Broker::start_with_clock(config, clock.clone())
        .await
        .unwrap();
    assert!(broker.wait_ready(10_000).await);
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("clocked").await;
    client
        .produce("clocked", &[record("a", "1")])
        .await
        .unwrap();
    let segments = async |client: &mut TestClient| {
        client
            .call(&DescribeTopicRequest {
                name: "clocked".into(),
                live: false,
            })
            .await
            .unwrap()
            .topic
            .ranges[0]
            .segments
            .len()
    };
    // Real time passes, the broker's clock does not: no roll.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(segments(&mut client).await, 1);
    clock.advance_ms(60_000);
    assert!(eventually(5_000, async || segments(&mut client).await == 2).await);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_status_and_api_versions_describe_this_single_broker() {
    use malachi_wire::messages::{ApiVersionsRequest, BrokerState, ClusterStatusRequest};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        node_id: 7,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let status = client.call(&ClusterStatusRequest {}).await.unwrap();
    assert_eq!(status.node_id, 7);
    assert_eq!(status.brokers.len(), 1);
    let me = &status.brokers[0];
    assert_eq!(me.state, BrokerState::Alive);
    assert_eq!(me.client_addr, broker.client_addr().to_string());
    assert_eq!(me.admin_addr, broker.admin_addr().to_string());
    // Membership reports the broker as it gossips itself: a real incarnation,
    // and, once its coordinator manager publishes them, the vnodes it leads
    // (a lone broker leads its one vnode).
    assert!(me.incarnation > 0);
    let what = "the broker reports it leads vnode 0 (vnodes_led)";
    wait_until(
        what,
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let status = client.call(&ClusterStatusRequest {}).await.unwrap();
            let led = status.brokers[0].vnodes_led.clone();
            if led == [0] { Ok(()) } else { Err(led) }
        },
    )
    .await;
    let versions = client
        .call(&ApiVersionsRequest {
            client_name: "test".into(),
            versions: Vec::new(),
        })
        .await
        .unwrap();
    assert_eq!(versions.node_id, 7);
    assert!(versions.versions.iter().any(|v| v.api_key == 10));
    broker.shutdown().await.unwrap();
}
