//! A deposed primary's copy is settled when it returns (issue 36,
//! "Settling"; ADR 0127): three brokers in this process, RF=3.
//!
//! The primary stops with records on its copy that no follower took (here
//! written into its copy while it is down, as a primary killed between its
//! own flush and its followers' answers leaves them); the segment fails
//! over and is sealed on the two others at the acknowledged length. When
//! the old primary starts again, its replica of the metadata has not yet
//! applied that seal, and the range has split since (so it is not among
//! the active ranges reconcile scans for deposed writers). The test checks
//! that no writer starts there for the sealed segment, that its copy is
//! cut back to exactly the recorded seal (the same bytes as the others)
//! within a few reconcile passes, and that no describe shows a copy
//! `over`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use malachi_actors::{Broker, BrokerConfig, BrokerHandle};
use malachi_storage::SegmentStore;
use malachi_wire::messages::{CreateTopicRequest, SplitRangeRequest};

const NODES: [u64; 3] = [1, 2, 3];

fn config(root: &Path, node: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    let mut config = cluster_config(root, node, seeds, &NODES);
    // Probes and reconcile passes every 200 ms: a failover within seconds.
    config.cluster.coordinator_poll_ms = 200;
    config
}

fn data_dir(root: &Path, node: u64) -> PathBuf {
    root.join(format!("node-{node}"))
}

/// The whole frames of a copy's log, and how many.
fn frames(root: &Path, node: u64, segment: u64) -> (Vec<u8>, u64) {
    let path = data_dir(root, node)
        .join("segments")
        .join(format!("{segment:020}.log"));
    let bytes = std::fs::read(path).unwrap_or_default();
    let (mut at, mut n) = (0, 0u64);
    while let Ok((_, len)) = malachi_storage::frame::decode(&bytes[at..]) {
        at += len;
        n += 1;
    }
    (bytes[..at].to_vec(), n)
}

/// Appends `records` records to broker `node`'s copy of `segment` while
/// the broker is down: what a primary wrote and flushed and no follower
/// took before it died.
fn write_past(root: &Path, node: u64, segment: u64, records: u64) {
    let store = malachi_storage::FileStore::open_dir(
        data_dir(root, node).join("segments"),
        malachi_storage::StoreConfig::default(),
    )
    .unwrap();
    let id = malachi_storage::SegmentId(segment);
    // A primary killed mid-write leaves its copy neither fenced nor sealed;
    // this one's orderly stop may have fenced it.
    let log = store.log_path(id);
    for marker in ["fence", "seal"] {
        let _ = std::fs::remove_file(log.with_extension(marker));
    }
    store.open(id).unwrap();
    let batch: Vec<malachi_storage::Record> = (0..records)
        .map(|i| malachi_storage::Record::new(1, format!("k{i}"), format!("never-acked-{i}")))
        .collect();
    store.append(id, &batch).unwrap().wait().unwrap();
    store.close(id).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposed_primary_is_cut_to_the_seal_on_return_and_starts_no_writer_for_it() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let started: [BrokerHandle; 3] =
        start_seeded(|node, seeds| config(root.path(), node, seeds)).await;
    let mut brokers: Vec<Option<BrokerHandle>> = started.into_iter().map(Some).collect();
    let addr = |brokers: &Vec<Option<BrokerHandle>>, node: u64| {
        brokers[(node - 1) as usize].as_ref().unwrap().client_addr()
    };
    let mut admin = TestClient::connect(addr(&brokers, 1)).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: "settle".into(),
                    replication_factor: Some(3),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic was never created"
    );
    let first = segments(&mut admin, "settle").await.unwrap();
    let first = first.last().unwrap().clone();
    assert_eq!(first.replicas.len(), 3);
    let primary = first.replicas[0];
    let acked: Vec<_> = (0..30)
        .map(|i| record(&format!("k{}", i % 4), &format!("a{i}")))
        .collect();
    let mut to_primary = TestClient::connect(addr(&brokers, primary)).await;
    assert!(
        eventually(10_000, async || to_primary
            .produce("settle", &acked)
            .await
            .is_ok())
        .await,
        "the records were never acknowledged"
    );
    drop(to_primary);

    // The primary stops; its segment fails over onto the two others.
    let stopped = brokers[(primary - 1) as usize].take().unwrap();
    stopped.shutdown().await.unwrap();
    let other = *NODES.iter().find(|n| **n != primary).unwrap();
    let mut observer = TestClient::connect(addr(&brokers, other)).await;
    let mut seal = None;
    assert!(
        eventually(30_000, async || {
            let Ok(now) = segments(&mut observer, "settle").await else {
                return false;
            };
            seal = now
                .iter()
                .find(|s| s.id == first.id && s.state == "sealed")
                .and_then(|s| s.length);
            seal.is_some() && now.iter().any(|s| s.state == "active")
        })
        .await,
        "the segment never failed over"
    );
    let seal = seal.unwrap();
    assert_eq!(seal, 30, "the seal covers every acknowledged record");
    // The range splits meanwhile: it is no longer active, so its segments
    // are not among those reconcile scans for deposed writers.
    let ranges = active_ranges(&mut observer, "settle").await;
    assert_eq!(ranges.len(), 1);
    let now = segments(&mut observer, "settle").await.unwrap();
    let serving = now
        .iter()
        .find(|s| s.state == "active")
        .and_then(|s| s.replicas.first().copied())
        .unwrap();
    let mut to_serving = TestClient::connect(addr(&brokers, serving)).await;
    assert!(
        eventually(30_000, async || {
            to_serving
                .call(&SplitRangeRequest {
                    topic: "settle".into(),
                    range_id: ranges[0],
                })
                .await
                .is_ok()
        })
        .await,
        "the range never split"
    );
    // The old primary's copy holds three records no follower took.
    write_past(root.path(), primary, first.id, 3);
    assert_eq!(frames(root.path(), primary, first.id).1, seal + 3);

    // It returns, with a replica that has not applied the seal yet.
    let seeds: Vec<&BrokerHandle> = brokers.iter().flatten().collect();
    let returned = Broker::start(config(root.path(), primary, &seeds))
        .await
        .unwrap();
    brokers[(primary - 1) as usize] = Some(returned);
    let returned = brokers[(primary - 1) as usize].as_ref().unwrap();
    let (reference, _) = frames(root.path(), other, first.id);
    assert!(
        eventually(15_000, async || {
            frames(root.path(), primary, first.id) == (reference.clone(), seal)
        })
        .await,
        "the deposed copy was not cut back to the seal: {} records, the seal {seal}",
        frames(root.path(), primary, first.id).1
    );
    assert!(
        !returned.writer_starts().contains(&first.id),
        "a writer started for the sealed segment {}: {:?}",
        first.id,
        returned.writer_starts()
    );
    // No describe shows a copy past its seal, through any broker.
    for node in NODES {
        let mut client = TestClient::connect(addr(&brokers, node)).await;
        assert!(
            eventually(10_000, async || {
                segments(&mut client, "settle").await.is_ok_and(|all| {
                    all.iter()
                        .filter(|s| s.id == first.id)
                        .all(|s| s.copies.iter().all(|c| c.status != "over"))
                })
            })
            .await,
            "broker {node} describes a copy past its seal"
        );
    }
    for b in brokers.into_iter().flatten() {
        b.shutdown().await.unwrap();
    }
}
