//! The coordinator changes in the middle of a failover (issue 19, ADR
//! 0113): three brokers in this process, RF=3.
//!
//! The primary stops; the vnode's new coordinator fences the two other
//! copies and is held there (a test hook) before it decides the seal. The
//! primary comes back, so nothing looks failed any more, and the holding
//! coordinator stops: its failover dies with it, and the copies it fenced
//! would stay fenced for good (the seed's OrphanedFence). The next
//! coordinator finds them by probing (never by fencing) and finishes the
//! failover at its own order. The test checks that the failover finished
//! once, that every copy, the returning ones included, ends at exactly the
//! recorded seal with the same bytes, and that every acknowledged record
//! is read back once in key order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use malachi_actors::{Broker, BrokerHandle};
use malachi_wire::messages::CreateTopicRequest;

fn data_dir(root: &Path, node: u64) -> PathBuf {
    root.join(format!("node-{node}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_whose_coordinator_changes_midway_finishes_once_at_one_seal() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let mut brokers = start_stoppable(3, |node_id, seeds| {
        three_node_config(root.path(), node_id, seeds)
    })
    .await;
    let addr = |brokers: &Vec<Option<BrokerHandle>>, node: u64| {
        brokers[(node - 1) as usize]
            .as_ref()
            .map(|b| b.client_addr())
            .unwrap()
    };
    let mut admin = TestClient::connect(addr(&brokers, 1)).await;
    assert!(
        eventually(30_000, async || {
            admin
                .call(&CreateTopicRequest {
                    name: "orphan".into(),
                    replication_factor: Some(3),
                    policy: None,
                })
                .await
                .is_ok()
        })
        .await,
        "the topic was never created"
    );
    let first = segments(&mut admin, "orphan").await.unwrap();
    let first = first.last().unwrap().clone();
    assert_eq!(first.replicas.len(), 3);
    let primary = first.replicas[0];
    let before: Vec<_> = (0..30)
        .map(|i| record(&format!("k{}", i % 4), &format!("a{i}")))
        .collect();
    let mut to_primary = TestClient::connect(addr(&brokers, primary)).await;
    assert!(
        eventually(10_000, async || to_primary
            .produce("orphan", &before)
            .await
            .is_ok())
        .await,
        "the first records were never acknowledged"
    );
    drop(to_primary);

    // Every failover holds after its fences from now on.
    for b in brokers.iter().flatten() {
        b.hold_failovers(true);
    }
    // The primary stops: a coordinator on another broker fences the two
    // other copies and holds.
    let stopped = brokers[(primary - 1) as usize].take().unwrap();
    stopped.shutdown().await.unwrap();
    let holder = wait_until(
        "a coordinator starts the failover",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            brokers
                .iter()
                .flatten()
                .find(|b| b.failovers_held() > 0)
                .map(|b| b.node_id())
        },
    )
    .await;
    assert_ne!(holder, primary);
    let other = [1, 2, 3]
        .into_iter()
        .find(|n| *n != primary && *n != holder)
        .unwrap();
    brokers[(other - 1) as usize]
        .as_ref()
        .unwrap()
        .hold_failovers(false);

    // The primary comes back (nothing looks failed now), and the holding
    // coordinator stops with its failover unfinished.
    let back = Broker::start(three_node_config(
        root.path(),
        primary,
        &[addr(&brokers, other)],
    ))
    .await
    .unwrap();
    assert!(back.wait_ready(30_000).await, "the primary never came back");
    brokers[(primary - 1) as usize] = Some(back);
    let deposed = brokers[(holder - 1) as usize].take().unwrap();
    deposed.shutdown().await.unwrap();

    // The next coordinator finds the orphaned fence and finishes.
    let mut to_other = TestClient::connect(addr(&brokers, other)).await;
    let (sealed, next) = wait_until(
        "the orphaned fence is resolved",
        Duration::from_secs(60),
        Duration::from_millis(100),
        async || {
            let now = segments(&mut to_other, "orphan").await.ok()?;
            let s = now
                .iter()
                .find(|s| s.id == first.id && s.state == "sealed")?;
            let last = now.last().filter(|last| last.id != first.id)?;
            Some((s.clone(), last.clone()))
        },
    )
    .await;
    let length = sealed.length.unwrap();
    assert!(
        length >= before.len() as u64,
        "the seal ({length}) drops acknowledged records"
    );

    // Producers go on in the successor.
    let after: Vec<_> = (0..30)
        .map(|i| record(&format!("k{}", i % 4), &format!("b{i}")))
        .collect();
    let mut to_next = TestClient::connect(addr(&brokers, next.replicas[0])).await;
    assert!(
        eventually(20_000, async || to_next
            .produce("orphan", &after)
            .await
            .is_ok())
        .await,
        "records were not acknowledged after the failover"
    );

    // The failover finished once. Counted before the third broker is
    // back: from then the successor, on two copies, rolls onto three
    // within about a second (ADR 0125), and that roll is a failover too.
    let finished: u64 = brokers
        .iter()
        .flatten()
        .map(|b| counter(b, "malachi_failovers_total"))
        .sum();
    assert_eq!(finished, 1, "the failover finished {finished} times");

    // The deposed coordinator's broker comes back too.
    let returned = Broker::start(three_node_config(
        root.path(),
        holder,
        &[addr(&brokers, other)],
    ))
    .await
    .unwrap();
    assert!(returned.wait_ready(30_000).await);
    brokers[(holder - 1) as usize] = Some(returned);

    // Every copy ends at exactly the recorded seal, with the same bytes: no
    // copy was sealed or cut at another length.
    let settled = eventually(30_000, async || {
        let copies: Vec<(Vec<u8>, u64)> = [1, 2, 3]
            .into_iter()
            .map(|n| copies::frames(&data_dir(root.path(), n), first.id))
            .collect();
        copies
            .iter()
            .all(|(bytes, n)| *n == length && *bytes == copies[0].0)
    })
    .await;
    let counts: Vec<u64> = [1, 2, 3]
        .into_iter()
        .map(|n| copies::frames(&data_dir(root.path(), n), first.id).1)
        .collect();
    assert!(
        settled,
        "copies of the sealed segment are {counts:?} frames, the seal {length}"
    );

    // Every acknowledged record once, in key order.
    let got = read_all(&mut to_next, "orphan").await;
    let mut sent = before.clone();
    sent.extend(after);
    assert_eq!(by_key(&got), by_key(&sent));

    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}
