//! Metadata groups replicated over the TCP raft transport: three nodes in
//! one process on loopback, three groups each, one connection per node pair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{
    GroupConfig, GroupError, GroupRegistry, MetadataGroup, TcpTransport, TcpTransportConfig,
    TransportServer,
};
use malachi_core::model::{Command, NodeId};
use malachi_testkit::wait::wait_until;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const GROUPS: [u64; 3] = [0, 1, 2];
const VOTERS: [u64; 3] = [1, 2, 3];

struct Node {
    id: u64,
    registry: Arc<GroupRegistry>,
    server: TransportServer,
    _dir: tempfile::TempDir,
}

fn config(group: u64, node: u64, dir: &std::path::Path) -> GroupConfig {
    let mut config = GroupConfig::new(group, node, dir.join(format!("g{group}")));
    config.election_timeout_min_ms = 300;
    config.election_timeout_max_ms = 600;
    config.heartbeat_interval_ms = 60;
    config.request_timeout_ms = 5_000;
    config
}

async fn start_cluster() -> Vec<Node> {
    let mut listeners = Vec::new();
    for _ in VOTERS {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut nodes = Vec::new();
    for (listener, id) in listeners.into_iter().zip(VOTERS) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            test_cookie(),
        )));
        for (peer, addr) in VOTERS.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let registry = Arc::new(GroupRegistry::new());
        let server = TransportServer::start(
            listener,
            registry.clone(),
            server_config(id, 64 * 1024 * 1024),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for group in GROUPS {
            let g = MetadataGroup::open(config(group, id, dir.path()), transport.clone())
                .await
                .unwrap();
            registry.insert(g);
        }
        nodes.push(Node {
            id,
            registry,
            server,
            _dir: dir,
        });
    }
    for node in &nodes {
        for group in node.registry.all() {
            group.initialize(&VOTERS).await.unwrap();
        }
    }
    nodes
}

fn create(topic: &str) -> Command {
    Command::CreateTopic {
        topic: topic.to_owned(),
        initial_ranges: 1,
        policy: None,
        replicas: vec![vec![NodeId(1)]],
        at_ms: 1,
    }
}

/// How often the waits below look again.
const POLL: Duration = Duration::from_millis(50);

/// The group's leader among `nodes`, waiting for one to emerge.
async fn leader_of(nodes: &[Node], group: u64) -> MetadataGroup {
    let what = format!("group {group} elects a leader");
    wait_until(&what, Duration::from_secs(10), POLL, async || {
        nodes
            .iter()
            .find_map(|node| node.registry.get(group).filter(|g| g.is_leader()))
    })
    .await
}

/// Proposes through whichever node leads now, retrying across elections.
async fn propose_until_acknowledged(nodes: &[Node], group: u64, topic: &str) {
    let what = format!("{topic} is acknowledged");
    wait_until(&what, Duration::from_secs(30), POLL, async || {
        let leader = leader_of(nodes, group).await;
        match leader.propose(create(topic)).await {
            Ok(verdict) => {
                verdict.unwrap();
                Ok(())
            }
            Err(
                retry @ (GroupError::NotLeader { .. }
                | GroupError::Timeout
                | GroupError::Discarded { .. }),
            ) => Err(retry),
            Err(other) => panic!("propose {topic}: {other}"),
        }
    })
    .await
}

async fn kill(node: Node) {
    node.server.shutdown().await;
    for group in node.registry.all() {
        group.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_groups_elect_replicate_and_survive_the_loss_of_a_leader() {
    let mut nodes = start_cluster().await;
    for group in GROUPS {
        propose_until_acknowledged(&nodes, group, &format!("before-{group}")).await;
    }
    // Every replica applies what the leader acknowledged.
    for group in GROUPS {
        for node in &nodes {
            let g = node.registry.get(group).unwrap();
            let mut applied = g.subscribe();
            tokio::time::timeout(Duration::from_secs(10), async {
                while !g.read_local(|s| s.topic(&format!("before-{group}")).is_some()) {
                    applied.changed().await.unwrap();
                }
            })
            .await
            .expect("a follower never applied the acknowledged entry");
        }
    }

    // Kill the node that leads group 0.
    let old_leader = leader_of(&nodes, 0).await.status().node_id;
    let position = nodes.iter().position(|n| n.id == old_leader).unwrap();
    kill(nodes.remove(position)).await;

    for group in GROUPS {
        propose_until_acknowledged(&nodes, group, &format!("after-{group}")).await;
        let leader = leader_of(&nodes, group).await;
        assert_ne!(
            (group, leader.status().node_id),
            (0, old_leader),
            "the dead node cannot lead"
        );
        // Nothing acknowledged before the loss is lost, on a linearizable read.
        let (before, after) = leader
            .read(move |s| {
                (
                    s.topic(&format!("before-{group}")).is_some(),
                    s.topic(&format!("after-{group}")).is_some(),
                )
            })
            .await
            .unwrap();
        assert!(
            before && after,
            "group {group}: before={before} after={after}"
        );
    }
    for node in nodes {
        kill(node).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_dead_peer_fails_fast_as_unreachable_and_backs_off() {
    use malachi_cluster::group::{GroupTransport, RaftRpcKind, TransportError, UnreachableCause};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let transport = TcpTransport::new(TcpTransportConfig::new(1, test_cookie()));
    transport.set_peer(2, addr);
    let first = transport
        .call(0, 2, RaftRpcKind::Vote, vec![], 1_000)
        .await
        .unwrap_err();
    assert!(
        matches!(first, TransportError::Unreachable { target: 2, .. }),
        "{first:?}"
    );
    // Within the backoff the transport does not even try to connect.
    let second = transport
        .call(0, 2, RaftRpcKind::Vote, vec![], 1_000)
        .await
        .unwrap_err();
    match second {
        TransportError::Unreachable { cause, .. } => {
            assert!(matches!(cause, UnreachableCause::BackingOff), "{cause}")
        }
        other => panic!("{other:?}"),
    }
    // An unknown peer is unreachable too.
    assert!(matches!(
        transport.call(0, 9, RaftRpcKind::Vote, vec![], 100).await,
        Err(TransportError::Unreachable { target: 9, .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_group_not_hosted_is_refused_remotely() {
    use malachi_cluster::group::{GroupTransport, RaftRpcKind, TransportError};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = TransportServer::start(
        listener,
        Arc::new(GroupRegistry::new()),
        server_config(2, 1 << 20),
    )
    .unwrap();
    let transport = TcpTransport::new(TcpTransportConfig::new(1, test_cookie()));
    transport.set_peer(2, addr);
    let err = transport
        .call(7, 2, RaftRpcKind::AppendEntries, vec![1, 2, 3], 2_000)
        .await
        .unwrap_err();
    match err {
        TransportError::Remote {
            code, peer_message, ..
        } => {
            assert_eq!(code, malachi_wire::error::ErrorCode::NotLeader);
            assert!(peer_message.contains("group 7"), "{peer_message}");
        }
        other => panic!("{other:?}"),
    }
    // The connection stays usable after a refusal.
    assert!(matches!(
        transport.call(8, 2, RaftRpcKind::Vote, vec![], 2_000).await,
        Err(TransportError::Remote { .. })
    ));
    server.shutdown().await;
}

/// Answers after a pause, counting how many requests it serves at once.
#[derive(Debug, Default)]
struct SlowEcho {
    now: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl malachi_cluster::group::RpcService for SlowEcho {
    async fn serve(
        &self,
        _api_key: u16,
        group_id: u64,
        body: bytes::Bytes,
    ) -> Result<Vec<u8>, malachi_cluster::group::RpcError> {
        use std::sync::atomic::Ordering;
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        // pacing, not synchronisation: a slow server, so calls overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        let mut answer = group_id.to_be_bytes().to_vec();
        answer.extend_from_slice(&body);
        Ok(answer)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_on_one_connection_stay_within_the_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Arc::new(SlowEcho::default());
    let server =
        TransportServer::start(listener, service.clone(), server_config(2, 1 << 20)).unwrap();
    let mut config = TcpTransportConfig::new(1, test_cookie());
    config.inflight_max = 3;
    let transport = Arc::new(TcpTransport::new(config));
    transport.set_peer(2, addr);
    let mut calls = Vec::new();
    for i in 0u64..24 {
        let transport = transport.clone();
        calls.push(tokio::spawn(async move {
            let answer = transport
                .call_raw(2, 201, i, &i.to_le_bytes(), 10_000)
                .await
                .unwrap();
            // Answers are matched to their calls by correlation id.
            assert_eq!(&answer[..8], &i.to_be_bytes());
            assert_eq!(&answer[8..], &i.to_le_bytes());
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
    let peak = service.peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(peak <= 3, "{peak} requests were in flight at once");
    assert!(
        peak >= 2,
        "calls were not multiplexed on the connection: {peak}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reached_again_after_the_backoff() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = TransportServer::start(
        listener,
        Arc::new(SlowEcho::default()),
        server_config(2, 1 << 20),
    )
    .unwrap();
    let transport = TcpTransport::new(TcpTransportConfig::new(1, test_cookie()));
    transport.set_peer(2, addr);
    transport.call_raw(2, 201, 1, b"up", 5_000).await.unwrap();

    // The peer dies: calls fail (as network or unreachable errors, never hang).
    server.shutdown().await;
    let down = transport.call_raw(2, 201, 1, b"down", 5_000).await;
    assert!(down.is_err(), "{down:?}");

    // It comes back on the same address: a later call reconnects.
    let listener = TcpListener::bind(addr).await.unwrap();
    let server = TransportServer::start(
        listener,
        Arc::new(SlowEcho::default()),
        server_config(2, 1 << 20),
    )
    .unwrap();
    let back = wait_until(
        "the transport reconnects",
        Duration::from_secs(10),
        Duration::from_millis(25),
        async || transport.call_raw(2, 201, 1, b"back", 1_000).await,
    )
    .await;
    assert_eq!(&back[8..], b"back");
    server.shutdown().await;
}

fn test_cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

fn server_config(
    node: u64,
    frame_bytes_max: usize,
) -> malachi_cluster::group::TransportServerConfig {
    let mut config = malachi_cluster::group::TransportServerConfig::new(node, test_cookie());
    config.frame_bytes_max = frame_bytes_max;
    config
}
