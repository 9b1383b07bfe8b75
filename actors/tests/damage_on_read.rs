//! Damage found on read is handled on read (issue 36): three brokers, RF=3,
//! default scrub settings (the scrubber runs daily). One byte is flipped in
//! the middle of the serving broker's copy of a sealed segment while it
//! runs. Before the fix, every read through every broker failed at that
//! record with `unknown_server_error` ("corrupt frame"), not retriable, so
//! consumers exited, although two intact copies existed; nothing logged it
//! and `topic describe` said `intact` until a restart.
//! Now every read through every broker stays whole (the serving broker reads
//! on from another holder at once), the copy is reported `damaged` (describe,
//! `malachi_read_damage_total`), and it is rebuilt from an intact copy at the
//! coordinator's next scrub ask, not the scrubber's next daily pass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::batch::Record;

const TOPIC: &str = "rot";
const KEYS: usize = 5;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        segment_bytes_max: 2048,
        ..cluster_config(dir, node_id, seeds, &[1, 2, 3])
    }
}

fn log_of(root: &Path, node: u64, segment: u64) -> PathBuf {
    root.join(format!("node-{node}"))
        .join("segments")
        .join(format!("{segment:020}.log"))
}

/// The primary of the topic's active segment.
async fn primary(client: &mut TestClient) -> Option<u64> {
    let segments = segments(client, TOPIC).await.ok()?;
    let active = segments.iter().find(|s| s.state == "active")?;
    active.replicas.first().copied()
}

/// How broker `node`'s copy of `segment` stands, as `topic describe`
/// (live) says.
async fn copy_status(client: &mut TestClient, segment: u64, node: u64) -> Option<String> {
    let described = client
        .call(&malachi_wire::messages::DescribeTopicRequest {
            name: TOPIC.into(),
            live: true,
        })
        .await
        .ok()?;
    let described = described
        .topic
        .ranges
        .into_iter()
        .flat_map(|r| r.segments)
        .find(|s| s.id == segment)?;
    let copy = described.copies.iter().find(|c| c.node == node)?;
    Some(copy.status.clone())
}

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_byte_flipped_in_the_serving_copy_is_read_around_reported_and_rebuilt() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three];
    let mut client = TestClient::connect(one.client_addr()).await;
    client.create_topic(TOPIC).await;
    let mut produced = Vec::new();
    let mut round = 0;
    // Enough records for a few sealed segments.
    while segments(&mut client, TOPIC)
        .await
        .unwrap()
        .iter()
        .filter(|s| s.state == "sealed")
        .count()
        < 2
    {
        assert!(round < 200, "the segment never rolled");
        let records: Vec<Record> = (0..10)
            .map(|i| record(&format!("k{}", i % KEYS), &format!("{round}-{i}")))
            .collect();
        let node = primary(&mut client).await.unwrap();
        let mut writer = TestClient::connect(addr_of(&brokers, node)).await;
        if writer.produce(TOPIC, &records).await.is_ok() {
            produced.extend(records);
        }
        round += 1;
    }
    let serving = primary(&mut client).await.unwrap();
    let sealed = segments(&mut client, TOPIC)
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.state == "sealed" && s.replicas.contains(&serving))
        .expect("a sealed segment with a copy on the serving broker");
    let mut reader = TestClient::connect(addr_of(&brokers, serving)).await;
    // Right after the start a broker may not have learned the cursor key
    // yet (`no_quorum`, retriable).
    assert!(
        eventually(30_000, async || read_from_start(&mut reader, TOPIC, 7)
            .await
            .is_ok_and(|read| read.len() == produced.len()))
        .await
    );

    // Rot one byte in the middle of the serving broker's copy.
    let log = log_of(root.path(), serving, sealed.id);
    let bytes = sealed.bytes.unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    let mut byte = [0u8; 1];
    std::fs::File::open(&log)
        .unwrap()
        .read_exact_at(&mut byte, bytes / 2)
        .unwrap();
    file.write_all_at(&[byte[0] ^ 0x5A], bytes / 2).unwrap();
    drop(file);

    // Every read through every broker stays whole, in per-key order.
    for broker in brokers {
        let mut reader = TestClient::connect(broker.client_addr()).await;
        let read = match read_from_start(&mut reader, TOPIC, 7).await {
            // A broker that does not serve the topic sends the client on,
            // as `not_leader` with the server's address.
            Err(refused) if refused.code == malachi_wire::ErrorCode::NotLeader => {
                assert!(
                    refused
                        .message
                        .contains(&format!("served by broker {serving}")),
                    "{refused:?}"
                );
                let mut reader = TestClient::connect(addr_of(&brokers, serving)).await;
                read_from_start(&mut reader, TOPIC, 7).await
            }
            other => other,
        };
        let read = read.unwrap_or_else(|e| {
            panic!(
                "a read (asked of broker {}) failed on the rotted copy: {e:?}",
                broker.node_id()
            )
        });
        assert_eq!(read.len(), produced.len());
        assert_eq!(by_key(&read), by_key(&produced));
    }
    let serving_broker = brokers.iter().find(|b| b.node_id() == serving).unwrap();
    assert!(
        counter(&serving_broker.metrics_text(), "malachi_read_damage_total") >= 1,
        "the damage found on read is counted"
    );
    // Reported damaged at once, not after a daily scrub.
    assert!(
        eventually(10_000, async || copy_status(
            &mut client,
            sealed.id,
            serving
        )
        .await
        .as_deref()
            == Some("damaged"))
        .await,
        "describe never said the copy was damaged: {:?}",
        copy_status(&mut client, sealed.id, serving).await
    );
    // Rebuilt from an intact copy at the coordinator's next scrub ask (at
    // most 30 s apart), and intact again.
    assert!(
        eventually(120_000, async || copy_status(
            &mut client,
            sealed.id,
            serving
        )
        .await
        .as_deref()
            == Some("intact"))
        .await,
        "the damaged copy was never rebuilt: {:?}",
        copy_status(&mut client, sealed.id, serving).await
    );
    let mut reader = TestClient::connect(addr_of(&brokers, serving)).await;
    let read = read_from_start(&mut reader, TOPIC, 7).await.unwrap();
    assert_eq!(by_key(&read), by_key(&produced));
    drop((client, reader));
    for broker in [one, two, three] {
        broker.shutdown().await.unwrap();
    }
}
