//! A full data volume (issue 19, ADR 0111): producers get `storage_full`
//! at once, never a timeout; no segment rolls; `/ready` says not ready;
//! and once space is freed the broker takes records again without a
//! restart, nothing acknowledged lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::ErrorCode;
use malachi_wire::messages::DescribeTopicRequest;

async fn segment_count(client: &mut TestClient, topic: &str) -> usize {
    let described = client
        .call(&DescribeTopicRequest {
            name: topic.into(),
            live: false,
        })
        .await
        .unwrap();
    described
        .topic
        .ranges
        .iter()
        .map(|r| r.segments.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_volume_refuses_records_at_once_and_recovers_without_a_restart() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig::for_tests(dir.path());
    config.store.min_free_bytes = 64 << 20;
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("full").await;
    let before: Vec<_> = (0..10)
        .map(|i| record(&format!("k{}", i % 3), &format!("a{i}")))
        .collect();
    assert_eq!(client.produce("full", &before).await.unwrap(), 10);
    let segments = segment_count(&mut client, "full").await;

    // The volume drops below the line: refused at once, typed.
    broker.set_free_bytes(Some(1 << 20));
    assert!(
        eventually(10_000, async || !broker.is_ready()).await,
        "a full broker still says it is ready"
    );
    for i in 0..20 {
        let refused = client
            .produce("full", &[record("k0", &format!("refused{i}"))])
            .await
            .unwrap_err();
        assert_eq!(refused.code, ErrorCode::StorageFull, "{}", refused.message);
        assert!(
            refused.message.contains("min_free_bytes"),
            "{}",
            refused.message
        );
    }
    assert!(!ErrorCode::StorageFull.retriable());
    // No roll storm: the range keeps its one segment.
    assert_eq!(segment_count(&mut client, "full").await, segments);
    let metrics = broker.metrics_text();
    assert!(metrics.contains("malachi_storage_full 1"), "{metrics}");

    // Space is freed: records are taken again, no restart.
    broker.set_free_bytes(Some(1 << 40));
    assert!(
        eventually(10_000, async || broker.is_ready()).await,
        "the broker never became ready again"
    );
    let after: Vec<_> = (0..10)
        .map(|i| record(&format!("k{}", i % 3), &format!("b{i}")))
        .collect();
    assert_eq!(client.produce("full", &after).await.unwrap(), 10);
    assert_eq!(segment_count(&mut client, "full").await, segments);

    // Everything acknowledged, in key order; nothing refused was stored.
    let (got, _) = client.fetch("full", None, true, 100, 0).await.unwrap();
    let mut sent = before.clone();
    sent.extend(after);
    assert_eq!(by_key(&got), by_key(&sent));
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_started_on_a_full_volume_is_not_ready_and_refuses_records() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig::for_tests(dir.path());
    // More than any volume here has free.
    config.store.min_free_bytes = u64::MAX / 2;
    let broker = malachi_actors::Broker::start(config).await.unwrap();
    let mut client = TestClient::connect(broker.client_addr()).await;
    assert!(
        eventually(10_000, async || {
            matches!(
                client
                    .call(&malachi_wire::messages::CreateTopicRequest {
                        name: "t".into(),
                        replication_factor: None,
                        policy: None,
                    })
                    .await,
                Ok(_)
                    | Err(Refused {
                        code: ErrorCode::TopicExists,
                        ..
                    })
            )
        })
        .await
    );
    assert!(
        eventually(10_000, async || {
            matches!(
                client.produce("t", &[record("k", "v")]).await,
                Err(Refused {
                    code: ErrorCode::StorageFull,
                    ..
                })
            )
        })
        .await,
        "a broker on a full volume took a record"
    );
    assert!(!broker.is_ready());
    broker.shutdown().await.unwrap();
}

/// A write that meets `ENOSPC` (here every segment log is `/dev/full`,
/// though the volume's free space looks fine) trips the guard at once: the
/// producer gets `storage_full`, and the failed segment rolls once, not
/// once per retry.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enospc_on_a_write_refuses_records_and_rolls_at_most_once() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let segments_dir = dir.path().join("segments");
    std::fs::create_dir_all(&segments_dir).unwrap();
    for id in 0..256u64 {
        std::os::unix::fs::symlink("/dev/full", segments_dir.join(format!("{id:020}.log")))
            .unwrap();
    }
    let mut config = BrokerConfig::for_tests(dir.path());
    config.store.min_free_bytes = 0;
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("nospace").await;
    let first = client
        .produce("nospace", &[record("k", "v0")])
        .await
        .unwrap_err();
    assert_eq!(first.code, ErrorCode::StorageFull, "{}", first.message);
    assert!(!broker.is_ready());
    // Producers retrying for a while: refused at once, every time.
    for i in 1..50 {
        let refused = client
            .produce("nospace", &[record("k", &format!("v{i}"))])
            .await
            .unwrap_err();
        assert_eq!(refused.code, ErrorCode::StorageFull, "{}", refused.message);
    }
    // One roll at most: the failed segment, and its successor untouched.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let segments = segment_count(&mut client, "nospace").await;
    assert!(segments <= 2, "{segments} segments: a roll storm");
    broker.shutdown().await.unwrap();
}
