//! The `vnodes` actor keeps its host's work running (ADR 0135): a host
//! loop (liveness prober, ring sync, quiescer, rebalancer) that dies is
//! restarted by the actor, the broker serving throughout, and a one-shot
//! that finished is not; loops that keep dying fail the
//! actor, which its supervisor restarts; and a raft replica whose disk
//! failed is reopened from its files, after which its vnode commits.
//! Each restart shows in `malachi_vnode_work_restarts_total{work}`, an
//! actor restart in `malachi tree`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_supervision::{ChildSnapshot, ChildStatus};
use malachi_wire::messages::CreateTopicRequest;

const VNODES: &[&str] = &["metadata", "vnodes"];
const WAIT_MS: u64 = 30_000;
/// `host_loops::LOOP_RESTARTS_MAX`: restarts of one loop the budget allows.
const LOOP_RESTARTS_MAX: u64 = 5;

async fn start_one(dir: &Path) -> BrokerHandle {
    start(BrokerConfig::for_tests(dir.join("single"))).await
}

fn restarts_of(broker: &BrokerHandle, work: &str) -> u64 {
    counter(
        broker,
        &format!("malachi_vnode_work_restarts_total{{work=\"{work}\"}}"),
    )
}

async fn vnodes_actor(broker: &BrokerHandle) -> ChildSnapshot {
    let tree = broker.tree_snapshot().await.unwrap();
    tree.descendant(VNODES).cloned().expect("no vnodes actor")
}

/// Creates `topic` through `broker`, retrying while the plane recovers.
async fn create_eventually(broker: &BrokerHandle, topic: &str) {
    let mut client = TestClient::connect(broker.client_addr()).await;
    let created = eventually(WAIT_MS, async || {
        let request = CreateTopicRequest {
            name: topic.into(),
            replication_factor: None,
            policy: None,
        };
        Box::pin(client.call(&request)).await.is_ok()
    })
    .await;
    assert!(created, "{topic} was never created");
}

/// Fails `work`'s next pass and waits until the actor restarted it.
async fn fail_and_await_restart(broker: &BrokerHandle, work: &str) {
    let before = restarts_of(broker, work);
    broker.fail_work(work);
    wait_until(
        &format!("{work} restarted"),
        std::time::Duration::from_millis(WAIT_MS),
        std::time::Duration::from_millis(20),
        async || restarts_of(broker, work) > before,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_host_loop_killed_is_restarted_by_the_vnodes_actor_and_the_broker_keeps_serving() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start_one(dir.path()).await;
    create_eventually(&broker, "before").await;
    let actor = vnodes_actor(&broker).await;
    // The attribute publisher, a one-shot, finished (nothing to commit) and
    // was not started again.
    assert_eq!(restarts_of(&broker, "attributes"), 0);
    for work in ["prober", "ring_sync", "quiescer", "rebalancer"] {
        fail_and_await_restart(&broker, work).await;
        create_eventually(&broker, &format!("after-{work}")).await;
        // Killed again: the restarted loop runs its passes.
        fail_and_await_restart(&broker, work).await;
        assert_eq!(restarts_of(&broker, work), 2, "{work}");
    }
    // The loops were restarted in place: the actor was not.
    let now = vnodes_actor(&broker).await;
    assert_eq!(now.restarts, actor.restarts);
    assert_eq!(now.actor_id, actor.actor_id);
    create_eventually(&broker, "after-all").await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_loops_that_keep_ending_fail_the_vnodes_actor_and_the_tree_restarts_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start_one(dir.path()).await;
    create_eventually(&broker, "before").await;
    let actor = vnodes_actor(&broker).await;
    for _ in 0..LOOP_RESTARTS_MAX {
        fail_and_await_restart(&broker, "quiescer").await;
    }
    // One more end within the window is past the budget.
    broker.fail_work("quiescer");
    wait_until(
        "the vnodes actor restarted by its supervisor",
        std::time::Duration::from_millis(WAIT_MS),
        std::time::Duration::from_millis(20),
        async || {
            let now = vnodes_actor(&broker).await;
            now.restarts > actor.restarts
                && now.status == ChildStatus::Running
                && now.actor_id != actor.actor_id
        },
    )
    .await;
    let now = vnodes_actor(&broker).await;
    let reason = now.last_exit_reason.unwrap_or_default();
    assert!(reason.contains("loop ended more than"), "{reason}");
    assert_eq!(restarts_of(&broker, "quiescer"), LOOP_RESTARTS_MAX);
    create_eventually(&broker, "after").await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_raft_group_stopped_fatally_is_reopened_and_its_vnode_still_commits() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start_one(dir.path()).await;
    create_eventually(&broker, "before").await;
    let actor = vnodes_actor(&broker).await;
    assert_eq!(restarts_of(&broker, "raft_group"), 0);
    broker
        .break_vnode_disk("through-the-reopened-group")
        .expect("no replica of the topic's vnode here");
    // The create's write fails the replica; it is found, reopened, and a
    // retry commits through the new replica.
    create_eventually(&broker, "through-the-reopened-group").await;
    wait_until(
        "the reopen counted",
        std::time::Duration::from_millis(WAIT_MS),
        std::time::Duration::from_millis(20),
        async || restarts_of(&broker, "raft_group") >= 1,
    )
    .await;
    // Reopened by the actor, which kept running.
    let now = vnodes_actor(&broker).await;
    assert_eq!(now.actor_id, actor.actor_id);
    assert_eq!(now.restarts, actor.restarts);
    let mut client = TestClient::connect(broker.client_addr()).await;
    describe(&mut client, "before").await.unwrap();
    describe(&mut client, "through-the-reopened-group")
        .await
        .unwrap();
    broker.shutdown().await.unwrap();
}
