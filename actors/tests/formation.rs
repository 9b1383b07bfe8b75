//! A broker finds its cluster and refuses the wrong one (ADR 0102): a data
//! dir of another cluster, and cluster settings that differ from the
//! running cluster's, stop a start with an error naming the difference.
//! Brokers run in this process on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use malachi_actors::{Broker, BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_testkit::wait::wait_until;

fn config(dir: &Path, node_id: u64, nodes: &[u64], seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        cluster: ClusterSettings {
            nodes: nodes.to_vec(),
            ..ClusterSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

fn record(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("metadata/cluster-settings")).unwrap_or_default()
}

/// Waits until every broker's data dir records the same cluster id, and
/// returns it.
async fn common_cluster_id(dirs: &[PathBuf]) -> String {
    let what = "the brokers record one common cluster id";
    wait_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let ids: Vec<Option<String>> = dirs
                .iter()
                .map(|d| {
                    record(d)
                        .lines()
                        .find_map(|l| l.strip_prefix("cluster_id=").map(str::to_owned))
                })
                .collect();
            match ids.first() {
                Some(Some(first)) if ids.iter().all(|id| id.as_ref() == Some(first)) => {
                    Ok(first.clone())
                }
                _ => Err(ids),
            }
        },
    )
    .await
}

/// The error a start with `config` is refused with.
async fn refusal(config: BrokerConfig) -> String {
    Broker::start(config)
        .await
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

/// Two brokers of a fixed node list [1, 2]; node 2 seeds from node 1.
async fn pair(root: &Path) -> (BrokerHandle, BrokerHandle, String) {
    let one = Broker::start(config(root, 1, &[1, 2], &[])).await.unwrap();
    let two = Broker::start(config(root, 2, &[1, 2], &[&one]))
        .await
        .unwrap();
    let id = common_cluster_id(&[root.join("node-1"), root.join("node-2")]).await;
    (one, two, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_dir_of_another_cluster_is_refused_and_names_both_clusters() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (b1, b2, b_id) = pair(b.path()).await;
    b2.shutdown().await.unwrap();
    b1.shutdown().await.unwrap();
    let (a1, a2, a_id) = pair(a.path()).await;
    assert_ne!(a_id, b_id, "two clusters drew the same id");
    a2.shutdown().await.unwrap();

    // Node 2 of cluster A restarted on node 2's data dir of cluster B.
    let mut foreign = config(a.path(), 2, &[1, 2], &[&a1]);
    foreign.data_dir = b.path().join("node-2");
    let message = refusal(foreign).await;
    assert!(message.contains("another cluster"), "{message}");
    assert!(message.contains(&a_id), "{message}");
    assert!(message.contains(&b_id), "{message}");

    // Its own data dir still starts, and nothing of B leaked into A.
    let back = Broker::start(config(a.path(), 2, &[1, 2], &[&a1]))
        .await
        .unwrap();
    assert!(record(&a.path().join("node-2")).contains(&a_id));
    back.shutdown().await.unwrap();
    a1.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_whose_settings_differ_from_the_running_clusters_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let one = Broker::start(config(root.path(), 1, &[1, 2, 3], &[]))
        .await
        .unwrap();
    let two = Broker::start(config(root.path(), 2, &[1, 2, 3], &[&one]))
        .await
        .unwrap();

    let mut more_vnodes = config(root.path(), 3, &[1, 2, 3], &[&one, &two]);
    more_vnodes.cluster.vnodes = Some(32);
    let message = refusal(more_vnodes).await;
    assert!(message.contains("vnodes=32"), "{message}");
    assert!(message.contains("vnodes=16"), "{message}");

    let mut fewer_replicas = config(root.path(), 3, &[1, 2, 3], &[&one, &two]);
    fewer_replicas.cluster.replicas_per_vnode = 1;
    let message = refusal(fewer_replicas).await;
    assert!(message.contains("replicas_per_vnode=1"), "{message}");

    let other_nodes = config(root.path(), 3, &[1, 2, 3, 4], &[&one, &two]);
    let message = refusal(other_nodes).await;
    assert!(message.contains("[1, 2, 3, 4]"), "{message}");

    // None of the refused starts wrote a record: the right settings start.
    let three = Broker::start(config(root.path(), 3, &[1, 2, 3], &[&one, &two]))
        .await
        .unwrap();
    three.shutdown().await.unwrap();
    two.shutdown().await.unwrap();
    one.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_bootstrapped_from_seeds_share_metadata_and_restart_from_their_record() {
    let root = tempfile::tempdir().unwrap();
    // Fixed client ports, so each broker can name the others as seeds
    // before any of them is up.
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let configs: Vec<BrokerConfig> = (0..3)
        .map(|i| {
            let mut c = config(root.path(), i as u64 + 1, &[], &[]);
            c.listen_addr = std::net::SocketAddr::from(([127, 0, 0, 1], ports[i]));
            c.seeds = (0..3)
                .filter(|j| *j != i)
                .map(|j| format!("127.0.0.1:{}", ports[j]))
                .collect();
            c.cluster.bootstrap_expect = Some(3);
            c
        })
        .collect();
    let [c1, c2, c3]: [BrokerConfig; 3] = configs.clone().try_into().unwrap();
    let (b1, b2, b3) = tokio::join!(Broker::start(c1), Broker::start(c2), Broker::start(c3));
    let brokers = [b1.unwrap(), b2.unwrap(), b3.unwrap()];
    let dirs: Vec<PathBuf> = configs.iter().map(|c| c.data_dir.clone()).collect();
    let id = common_cluster_id(&dirs).await;
    for dir in &dirs {
        assert!(
            record(dir).starts_with("nodes=1,2,3 vnodes=16 replicas_per_vnode=3\n"),
            "{}",
            record(dir)
        );
    }
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
    // A restart without --bootstrap-expect keeps the recorded cluster: it
    // starts at once, alone, and waits for nobody.
    let mut again = configs[1].clone();
    again.cluster.bootstrap_expect = None;
    let two = tokio::time::timeout(Duration::from_secs(20), Broker::start(again))
        .await
        .expect("a recorded cluster does not wait for a bootstrap")
        .unwrap();
    assert!(record(&dirs[1]).contains(&id));
    two.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joined_broker_that_lost_its_data_dir_is_refused_under_its_old_id() {
    let root = tempfile::tempdir().unwrap();
    let (one, two, _) = pair(root.path()).await;
    // Node 3 joins with seeds alone (ADR 0104).
    let joiner = config(root.path(), 3, &[], &[&one, &two]);
    let three = Broker::start(joiner.clone()).await.unwrap();
    // Once the ring lists it, the running members gossip it.
    let what = "the running members gossip node 3 as a member";
    wait_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            [&one, &two].iter().all(|b| {
                b.membership()
                    .local()
                    .attributes
                    .get(malachi_core::formation::ATTR_MEMBERS)
                    .is_some_and(|m| m.split('+').any(|n| n == "3"))
            })
        },
    )
    .await;
    three.shutdown().await.unwrap();
    // Its data dir is lost; the same id with an empty one is refused: its
    // raft votes and logs are gone, and it must not vote again.
    std::fs::remove_dir_all(&joiner.data_dir).unwrap();
    let refused = refusal(joiner.clone()).await;
    assert!(
        refused.contains("lists node 3 as a member") && refused.contains("new node id"),
        "{refused}"
    );
    assert!(
        !joiner.data_dir.join("metadata/cluster-settings").exists(),
        "a refused start records no cluster"
    );
    // A new id joins the same cluster.
    let four = Broker::start(config(root.path(), 4, &[], &[&one, &two]))
        .await
        .unwrap();
    for broker in [four, two, one] {
        broker.shutdown().await.unwrap();
    }
}
