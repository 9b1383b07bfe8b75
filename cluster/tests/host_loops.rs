//! The vnode host's long-lived work under its owner (ADR 0135): a loop
//! that ends is seen to end and runs again when restarted (the liveness
//! prober too, whose up set keeps updating across the restart), a
//! one-shot ends once its work is done, and a replica whose raft stopped
//! fatally is found and reopened from its files, after which its vnode
//! commits again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_cluster::group::{
    ClusterCookie, TcpTransport, TcpTransportConfig, TransportServer, TransportServerConfig,
};
use malachi_cluster::vnodes::{HostLoop, VnodeHost, VnodeHostConfig};
use malachi_core::model::Outcome;
use malachi_testkit::wait::wait_until;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// A lone broker's host: one vnode, so every topic lands on one group.
async fn open_host(dir: &Path, owner_runs_loops: bool) -> Arc<VnodeHost> {
    let cookie = ClusterCookie::new("test cookie").unwrap();
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(1, cookie)));
    let mut config = VnodeHostConfig::new(1, vec![1], dir);
    config.vnode_count = 1;
    config.owner_runs_loops = owner_runs_loops;
    config.group.election_timeout_min_ms = 150;
    config.group.election_timeout_max_ms = 300;
    config.group.heartbeat_interval_ms = 50;
    VnodeHost::open(config, transport).await.unwrap()
}

/// Waits until a creation of `topic` commits.
async fn create_eventually(host: &VnodeHost, topic: &str) {
    wait_until(
        &format!("{topic} created"),
        WAIT,
        POLL,
        async || match Box::pin(host.propose(create(topic))).await {
            Ok(Ok(Outcome::TopicCreated { .. })) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

fn run(host: &Arc<VnodeHost>, which: HostLoop) -> JoinHandle<()> {
    tokio::spawn(host.run_loop(which))
}

/// Fails `which` and waits for its task to end with the test's panic.
async fn fail_and_see_it_end(host: &VnodeHost, which: HostLoop, task: JoinHandle<()>) {
    host.fail_loop(which);
    let ended = tokio::time::timeout(WAIT, task)
        .await
        .unwrap_or_else(|_| panic!("{} did not end after its fault", which.name()));
    let panic = ended.unwrap_err().into_panic();
    let text = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(text.contains(which.name()), "{}: {text}", which.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_loop_run_by_its_owner_ends_on_a_fault_and_runs_again_when_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let host = open_host(dir.path(), true).await;
    // A broker that formed the cluster asks for no admission.
    let expected: Vec<HostLoop> = HostLoop::ALL
        .into_iter()
        .filter(|l| *l != HostLoop::Admission)
        .collect();
    assert_eq!(host.loops(), expected);
    let mut tasks: BTreeMap<HostLoop, JoinHandle<()>> = host
        .loops()
        .into_iter()
        .map(|l| (l, run(&host, l)))
        .collect();
    // The loops the owner runs do the host's work: the quiescer lets the
    // parked groups campaign, and they commit.
    create_eventually(&host, "before").await;
    // A one-shot with nothing to do (no attributes) is done at once, and
    // ends without a panic: its owner does not start it again.
    let attributes = tasks.remove(&HostLoop::Attributes).unwrap();
    tokio::time::timeout(WAIT, attributes)
        .await
        .expect("the attribute publisher never ended")
        .expect("the attribute publisher panicked");
    let continuous: Vec<HostLoop> = host
        .loops()
        .into_iter()
        .filter(|l| !l.is_one_shot())
        .collect();
    for round in 0..2 {
        for which in continuous.iter().copied() {
            let task = tasks.remove(&which).unwrap();
            fail_and_see_it_end(&host, which, task).await;
            // Restarted, as the owner does; the next round trips it again,
            // so it is seen to run its passes (the ring sync, parked after
            // its fetch, is woken to trip).
            tasks.insert(which, run(&host, which));
        }
        create_eventually(&host, &format!("after-{round}")).await;
    }
    for task in tasks.values() {
        assert!(!task.is_finished(), "a loop ended without a fault");
    }
    host.shutdown().await;
    // A stopped host's loops end: the owner sees them end and gives up.
    for (which, task) in tasks {
        tokio::time::timeout(WAIT, task)
            .await
            .unwrap_or_else(|_| panic!("{} outlived its host's stop", which.name()))
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_stopped_fatally_is_found_and_reopened_and_its_vnode_commits_again() {
    let dir = tempfile::tempdir().unwrap();
    let host = open_host(dir.path(), false).await;
    create_eventually(&host, "before").await;
    let vnode = host.ring().owner("during").id;
    let group = host.group(vnode).unwrap();
    let group_id = group.group_id();
    assert!(host.fatal_groups().is_empty());
    group.break_disk_for_tests();
    let during = host.propose(create("during")).await;
    assert!(!matches!(during, Ok(Ok(_))), "{during:?}");
    wait_until("the replica found fatal", WAIT, POLL, async || {
        host.fatal_groups().iter().any(|(g, _)| *g == group_id)
    })
    .await;
    assert!(!group.stopped_by_full_volume());

    assert!(host.reopen_fatal(group_id).await.unwrap());
    let reopened = host.group(vnode).unwrap();
    assert_ne!(reopened.serial(), group.serial(), "not a new replica");
    assert!(host.fatal_groups().is_empty());
    // A running replica is left alone.
    assert!(!host.reopen_fatal(group_id).await.unwrap());
    create_eventually(&host, "after").await;
    // What the replica committed before its disk failed is still there.
    assert!(host.describe("before").await.unwrap().is_some());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_shot_killed_by_a_fault_does_its_work_when_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let cookie = ClusterCookie::new("test cookie").unwrap();
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(1, cookie)));
    let mut config = VnodeHostConfig::new(1, vec![1], dir.path());
    config.vnode_count = 1;
    config.owner_runs_loops = true;
    config.attributes = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
    let host = VnodeHost::open(config, transport).await.unwrap();
    let others: BTreeMap<HostLoop, JoinHandle<()>> = host
        .loops()
        .into_iter()
        .filter(|l| *l != HostLoop::Attributes)
        .map(|l| (l, run(&host, l)))
        .collect();
    // Armed before it runs: its first pass panics, as a bug would.
    host.fail_loop(HostLoop::Attributes);
    let ended = tokio::time::timeout(WAIT, run(&host, HostLoop::Attributes))
        .await
        .expect("the armed attribute publisher did not end");
    assert!(ended.unwrap_err().is_panic());
    assert!(host.ring().attributes_of(1).is_none());
    // Restarted, it commits the attributes and ends: done, not failed.
    tokio::time::timeout(WAIT, run(&host, HostLoop::Attributes))
        .await
        .expect("the attribute publisher never finished")
        .expect("the attribute publisher panicked");
    assert_eq!(
        host.ring()
            .attributes_of(1)
            .and_then(|a| a.get("zone").cloned()),
        Some("a".to_owned())
    );
    host.shutdown().await;
    for task in others.into_values() {
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    }
}

/// Two brokers on real transports: 1 with its loops run by the test (its
/// owner), 2 running its own.
async fn two_brokers() -> Vec<(Arc<VnodeHost>, TransportServer, tempfile::TempDir)> {
    const NODES: [u64; 2] = [1, 2];
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let cookie = ClusterCookie::new("test cookie").unwrap();
    let mut brokers = Vec::new();
    for (listener, id) in listeners.into_iter().zip(NODES) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            cookie.clone(),
        )));
        for (peer, addr) in NODES.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = VnodeHostConfig::new(id, NODES.to_vec(), dir.path());
        config.vnode_count = 2;
        config.owner_runs_loops = id == 1;
        let host = VnodeHost::open(config, transport).await.unwrap();
        let server = TransportServer::start(
            listener,
            host.clone(),
            TransportServerConfig::new(id, cookie.clone()),
        )
        .unwrap();
        brokers.push((host, server, dir));
    }
    brokers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_liveness_prober_killed_and_restarted_keeps_updating_the_same_up_set() {
    let mut brokers = two_brokers().await;
    let (other, other_server, _other_dir) = brokers.pop().unwrap();
    let (host, _server, _dir) = brokers.pop().unwrap();
    assert!(host.loops().contains(&HostLoop::Prober));
    let mut tasks: BTreeMap<HostLoop, JoinHandle<()>> = host
        .loops()
        .into_iter()
        .map(|l| (l, run(&host, l)))
        .collect();
    // Taken before the prober dies: what the quiescer and the rebalancer
    // follow, and what the broker's actors hold.
    let mut up = host.up_watch().unwrap();
    wait_until("broker 2 seen up", WAIT, POLL, async || {
        up.borrow_and_update().contains(&2)
    })
    .await;
    for _ in 0..2 {
        let prober = tasks.remove(&HostLoop::Prober).unwrap();
        fail_and_see_it_end(&host, HostLoop::Prober, prober).await;
        tasks.insert(HostLoop::Prober, run(&host, HostLoop::Prober));
    }
    // The quiescer following the up set did not end with the prober.
    assert!(!tasks[&HostLoop::Quiescer].is_finished());
    // Broker 2 stops answering: the restarted prober says so on the watch
    // taken before it was restarted.
    other.shutdown().await;
    other_server.shutdown().await;
    wait_until("broker 2 seen down", WAIT, POLL, async || {
        !up.borrow_and_update().contains(&2)
    })
    .await;
    assert_eq!(host.up_nodes(), Some([1].into()));
    for which in [HostLoop::Prober, HostLoop::Quiescer, HostLoop::Rebalancer] {
        assert!(!tasks[&which].is_finished(), "{} ended", which.name());
    }
    host.shutdown().await;
    for task in tasks.into_values() {
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    }
}
