//! Retention by storage policy (issue 21, ADR 0115): by age under a manual
//! clock, by size, and a topic naming a policy nobody defined keeps all of
//! its data until the definition arrives. Expired segments leave the
//! metadata and the disk; a cursor into them gets `cursor_expired`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use malachi_actors::{
    Broker, BrokerConfig, BrokerHandle, ClusterSettings, MaintenanceSettings, ManualClock,
};
use malachi_wire::ErrorCode;
use malachi_wire::messages::{CreateTopicRequest, PolicyDescription, PutPolicyRequest};

const T0: u64 = 1_000_000;
const ROLL_MS: u64 = 60_000;

async fn start(dir: &Path, clock: Arc<ManualClock>) -> BrokerHandle {
    start_with(dir, clock, None).await
}

async fn start_with(dir: &Path, clock: Arc<ManualClock>, backstop_ms: Option<u64>) -> BrokerHandle {
    let config = BrokerConfig {
        segment_age_ms: ROLL_MS,
        cluster: ClusterSettings {
            coordinator_poll_ms: 100,
            ..ClusterSettings::default()
        },
        maintenance: MaintenanceSettings {
            retention_sweep_ms: 100,
            unresolved_policy_age_ms: backstop_ms,
            ..MaintenanceSettings::default()
        },
        ..BrokerConfig::for_tests(dir)
    };
    let broker = Broker::start_with_clock(config, clock).await.unwrap();
    assert!(broker.wait_ready(10_000).await);
    broker
}

async fn put_policy(client: &mut TestClient, name: &str, age_ms: Option<u64>, bytes: Option<u64>) {
    client
        .call(&PutPolicyRequest {
            policy: PolicyDescription {
                name: name.into(),
                retention_age_ms: age_ms,
                retention_bytes: bytes,
                placement: Vec::new(),
                reshape: None,
            },
        })
        .await
        .unwrap();
}

async fn create(client: &mut TestClient, topic: &str, policy: &str) {
    client
        .call(&CreateTopicRequest {
            name: topic.into(),
            replication_factor: None,
            policy: Some(policy.into()),
        })
        .await
        .unwrap();
}

/// Writes `batches` batches of ten records, rolling the segment after each
/// by moving the clock on: `batches` sealed segments and an active one.
async fn sealed_batches(
    client: &mut TestClient,
    clock: &ManualClock,
    topic: &str,
    batches: usize,
) -> Vec<malachi_wire::batch::Record> {
    let mut sent = Vec::new();
    for b in 0..batches {
        let batch: Vec<_> = (0..10)
            .map(|i| record(&format!("k{}", i % 3), &format!("b{b}-{i}")))
            .collect();
        client.produce(topic, &batch).await.unwrap();
        sent.extend(batch);
        clock.advance_ms(ROLL_MS);
        assert!(
            eventually(10_000, async || segments(client, topic)
                .await
                .unwrap()
                .len()
                == b + 2)
            .await,
            "the segment never rolled after batch {b}"
        );
    }
    sent
}

fn log_exists(dir: &Path, segment: u64) -> bool {
    dir.join("segments")
        .join(format!("{segment:020}.log"))
        .exists()
}

fn metric(broker: &BrokerHandle, prefix: &str, labels: &[&str]) -> Option<f64> {
    broker.metrics_text().lines().find_map(|l| {
        (l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
            .then(|| l.rsplit(' ').next()?.parse().ok())
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_segments_older_than_the_policys_age_expire_oldest_first() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let broker = start(dir.path(), clock.clone()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    put_policy(&mut client, "short", Some(150_000), None).await;
    create(&mut client, "aged", "short").await;
    let sent = sealed_batches(&mut client, &clock, "aged", 3).await;
    let before = segments(&mut client, "aged").await.unwrap();
    assert_eq!(before.len(), 4);
    // A cursor into the oldest segment, taken now.
    let (first, old_cursor) = client.fetch("aged", None, true, 1, 0).await.unwrap();
    assert_eq!(first.len(), 1);

    // Sealed at T0+60 s, +120 s and +180 s. At +220 s only the first is
    // 150 s old: it alone expires.
    clock.advance_ms(40_000);
    assert!(
        eventually(10_000, async || segments(&mut client, "aged")
            .await
            .unwrap()
            .len()
            == 3)
        .await,
        "the oldest segment never expired"
    );
    let after = segments(&mut client, "aged").await.unwrap();
    assert_eq!(
        after.iter().map(|s| s.id).collect::<Vec<_>>(),
        before[1..].iter().map(|s| s.id).collect::<Vec<_>>()
    );
    assert!(
        eventually(10_000, async || !log_exists(dir.path(), before[0].id)).await,
        "the expired segment's copy is still on disk"
    );
    assert!(log_exists(dir.path(), before[1].id));
    // Nothing else goes while the clock stands still.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(segments(&mut client, "aged").await.unwrap().len(), 3);

    // Reads from the start see the retained records, in key order.
    let got = read_all(&mut client, "aged").await;
    assert_eq!(by_key(&got), by_key(&sent[10..]));
    // The old cursor is refused as expired, naming where data starts now.
    let refused = client
        .fetch("aged", Some(old_cursor), false, 10, 0)
        .await
        .unwrap_err();
    assert_eq!(
        refused.code,
        ErrorCode::CursorExpired,
        "{}",
        refused.message
    );
    assert!(
        refused
            .message
            .contains(&format!("offset 10 of segment s{}", before[1].id)),
        "{}",
        refused.message
    );
    assert_eq!(
        metric(&broker, "malachi_segments_expired_total", &[]),
        Some(1.0)
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unresolved_policy_keeps_everything_until_a_size_bound_resolves_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let broker = start(dir.path(), clock.clone()).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    create(&mut client, "sized", "small").await;
    let sent = sealed_batches(&mut client, &clock, "sized", 4).await;
    let before = segments(&mut client, "sized").await.unwrap();
    assert_eq!(before.len(), 5);
    assert!(
        !describe(&mut client, "sized")
            .await
            .unwrap()
            .policy_resolved
    );

    // No definition backs "small": every pass names the topic in the
    // metric, and nothing expires, however old.
    clock.advance_ms(10 * 3_600_000);
    assert!(
        eventually(10_000, async || metric(
            &broker,
            "malachi_topic_policy_unresolved",
            &["topic=\"sized\"", "policy=\"small\""]
        ) == Some(1.0))
        .await,
        "the unresolved policy never showed in the metric"
    );
    // An absence (nothing expires), watched for half a second of passes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = segments(&mut client, "sized").await.unwrap();
    assert!(held.len() >= 5, "{held:?}");
    assert_eq!(held[..4], before[..4]);
    assert!(log_exists(dir.path(), before[0].id));

    // "small" is defined with a size bound of one sealed segment and a
    // half: the oldest go until the topic's sealed bytes fit.
    let sealed_bytes: Vec<u64> = held
        .iter()
        .filter(|s| s.state == "sealed")
        .map(|s| s.bytes.unwrap())
        .collect();
    let bound = sealed_bytes[0] + sealed_bytes[0] / 2;
    put_policy(&mut client, "small", None, Some(bound)).await;
    assert!(
        describe(&mut client, "sized")
            .await
            .unwrap()
            .policy_resolved
    );
    assert!(
        eventually(10_000, async || {
            let now = segments(&mut client, "sized").await.unwrap();
            let sealed: u64 = now
                .iter()
                .filter(|s| s.state == "sealed")
                .map(|s| s.bytes.unwrap())
                .sum();
            sealed <= bound && now.first().map(|s| s.id) != Some(before[0].id)
        })
        .await,
        "the size bound was never applied"
    );
    let now = segments(&mut client, "sized").await.unwrap();
    let sealed_now = now.iter().filter(|s| s.state == "sealed").count();
    assert_eq!(sealed_now, 1, "{now:?}");
    // The retained records are the newest, in key order.
    let kept_from = before.iter().position(|s| s.id == now[0].id).unwrap();
    let got = read_all(&mut client, "sized").await;
    assert_eq!(by_key(&got), by_key(&sent[kept_from * 10..]));
    assert!(
        eventually(10_000, async || metric(
            &broker,
            "malachi_topic_policy_unresolved",
            &["topic=\"sized\""]
        ) == Some(0.0))
        .await,
        "the metric still names a resolved policy"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_age_backstop_bounds_a_topic_whose_policy_nobody_defined() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    // Unset by default; set here to 150 s.
    let broker = start_with(dir.path(), clock.clone(), Some(150_000)).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    create(&mut client, "orphaned", "nobody").await;
    let sent = sealed_batches(&mut client, &clock, "orphaned", 3).await;
    let before = segments(&mut client, "orphaned").await.unwrap();
    // Sealed at +60, +120 and +180 s; at +220 s the first is 160 s old.
    clock.advance_ms(40_000);
    assert!(
        eventually(10_000, async || segments(&mut client, "orphaned")
            .await
            .unwrap()
            .len()
            == 3)
        .await,
        "the backstop never expired the oldest segment"
    );
    assert_eq!(
        segments(&mut client, "orphaned").await.unwrap()[0].id,
        before[1].id
    );
    let got = read_all(&mut client, "orphaned").await;
    assert_eq!(by_key(&got), by_key(&sent[10..]));
    // Still unresolved, and named so.
    assert_eq!(
        metric(
            &broker,
            "malachi_topic_policy_unresolved",
            &["topic=\"orphaned\"", "policy=\"nobody\""]
        ),
        Some(1.0)
    );
    broker.shutdown().await.unwrap();
}
