//! Supervision at work: failed actors are restarted (or, for temporary
//! connections, removed) by the tree, the snapshot shows it, and other
//! producers carry on unaffected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_supervision::{ChildStatus, SupervisorSnapshot};
use malachi_wire::messages::TreeSnapshotRequest;

fn segment_child(snapshot: &SupervisorSnapshot) -> (String, u32, Option<String>) {
    let storage = snapshot
        .child("storage")
        .unwrap()
        .supervisor
        .as_ref()
        .unwrap();
    let child = storage
        .children
        .iter()
        .find(|c| c.name.starts_with("segment/orders/"))
        .expect("a segment actor for orders");
    (child.name.clone(), child.restarts, child.actor_id.clone())
}

/// A producer on its own connection that produces `n` records to `topic`
/// one request at a time and returns how many were acknowledged.
fn producer(
    broker: &BrokerHandle,
    topic: &'static str,
    n: usize,
) -> tokio::task::JoinHandle<usize> {
    let addr = broker.client_addr();
    tokio::spawn(async move {
        let mut client = TestClient::connect(addr).await;
        let mut acked = 0;
        for i in 0..n {
            let r = client
                .produce(topic, &[record(&format!("p{}", i % 3), &i.to_string())])
                .await;
            assert!(r.is_ok(), "produce {i} failed: {r:?}");
            acked += 1;
        }
        acked
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_segment_actor_is_restarted_and_producers_carry_on() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("orders").await;
    client.create_topic("other").await;
    client
        .produce("orders", &[record("a", "before")])
        .await
        .unwrap();

    let (name, restarts, id_before) = segment_child(&broker.tree_snapshot().await.unwrap());
    assert_eq!(restarts, 0);
    let others = producer(&broker, "other", 200);
    let same = producer(&broker, "orders", 200);
    broker.poison_segment(&name).await.unwrap();

    let restarted = eventually(5_000, async || {
        let (_, restarts, id) = segment_child(&broker.tree_snapshot().await.unwrap());
        restarts == 1 && id != id_before
    })
    .await;
    assert!(restarted, "the segment actor was not restarted");
    assert_eq!(others.await.unwrap(), 200);
    // Producers of the failed segment's own topic retried through the restart.
    assert_eq!(same.await.unwrap(), 200);
    let (got, _) = client.fetch("orders", None, true, 10_000, 0).await.unwrap();
    assert_eq!(got.len(), 201);

    // The wire's tree op shows the same count.
    let tree = client.call(&TreeSnapshotRequest::default()).await.unwrap();
    let storage = tree
        .root
        .children
        .iter()
        .find(|c| c.name == "storage")
        .unwrap();
    let seg = storage
        .supervisor
        .as_ref()
        .unwrap()
        .children
        .iter()
        .find(|c| c.name == name)
        .unwrap();
    assert_eq!(seg.restarts, 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_connection_actor_is_removed_and_other_clients_carry_on() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut victim = TestClient::connect(broker.client_addr()).await;
    victim.create_topic("orders").await;
    let others = producer(&broker, "orders", 200);
    let peer = victim.local_addr();
    broker.poison_connection(peer).await.unwrap();
    // Its socket is closed by the failure ...
    assert!(victim.recv().await.is_none());
    // ... and, being temporary, it leaves the tree instead of restarting.
    let gone = eventually(5_000, async || {
        let tree = broker.tree_snapshot().await.unwrap();
        let listener = tree.child("listener").unwrap().supervisor.as_ref().unwrap();
        listener.child(&format!("connection/{peer}")).is_none()
    })
    .await;
    assert!(gone);
    assert_eq!(others.await.unwrap(), 200);
    // The client reconnects and is served.
    let mut again = TestClient::connect(broker.client_addr()).await;
    let (got, _) = again.fetch("orders", None, true, 10_000, 0).await.unwrap();
    assert_eq!(got.len(), 200);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_acceptor_is_restarted_and_new_clients_connect() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("orders").await;
    broker.poison_acceptor().await.unwrap();
    let restarted = eventually(5_000, async || {
        let tree = broker.tree_snapshot().await.unwrap();
        let listener = tree.child("listener").unwrap().supervisor.as_ref().unwrap();
        let acceptor = listener.child("acceptor").unwrap();
        acceptor.restarts == 1 && acceptor.status == ChildStatus::Running
    })
    .await;
    assert!(restarted);
    // The established connection was not disturbed, and new ones are accepted.
    client.produce("orders", &[record("k", "v")]).await.unwrap();
    let mut fresh = TestClient::connect(broker.client_addr()).await;
    let (got, _) = fresh.fetch("orders", None, true, 10, 0).await.unwrap();
    assert_eq!(got.len(), 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_tree_has_the_documented_shape() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("orders").await;
    let tree = broker.tree_snapshot().await.unwrap();
    assert_eq!(tree.name, "broker");
    let names: Vec<_> = tree.children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "storage",
            "metadata",
            "membership",
            "maintenance",
            "listener",
            "admin_http"
        ]
    );
    // Failover and healing, so far (the scrubber, retention and the
    // orphan sweeper go there next).
    let maintenance = tree
        .child("maintenance")
        .unwrap()
        .supervisor
        .as_ref()
        .unwrap();
    assert_eq!(
        maintenance.strategy,
        malachi_supervision::Strategy::OneForOne
    );
    let workers: Vec<_> = maintenance
        .children
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        workers,
        [
            "failover", "healer", "scrubber", "space", "balancer", "sweeper", "reshaper"
        ]
    );
    for child in ["swim", "node_server", "node"] {
        assert!(tree.descendant(&["membership", child]).is_some(), "{child}");
    }
    assert!(tree.descendant(&["metadata", "vnodes"]).is_some());
    // Last under metadata: its restart restarts nothing else (ADR 0133).
    let metadata = tree.child("metadata").unwrap().supervisor.as_ref().unwrap();
    assert_eq!(
        metadata.children.last().map(|c| c.name.as_str()),
        Some("orders")
    );
    // The ReplicationServer starts before any segment actor.
    let storage = tree.child("storage").unwrap().supervisor.as_ref().unwrap();
    assert_eq!(
        storage.children.first().map(|c| c.name.as_str()),
        Some("replication")
    );
    assert!(
        tree.descendant(&["metadata", "coordinator_manager", "manager"])
            .is_some()
    );
    assert!(
        tree.descendant(&["metadata", "coordinator_manager", "coordinator/0"])
            .is_some()
    );
    let (name, _, _) = segment_child(&tree);
    assert!(name.starts_with("segment/orders/"), "{name}");
    let listener = tree.child("listener").unwrap().supervisor.as_ref().unwrap();
    assert!(
        listener
            .children
            .iter()
            .any(|c| c.name.starts_with("connection/"))
    );
    broker.shutdown().await.unwrap();
}
