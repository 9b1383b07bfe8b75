//! Vnodes on a hash ring, replicated over the TCP raft transport: three
//! brokers in one process on loopback, any of which answers any request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_core::model::{ModelError, Outcome, RingArc};
use malachi_core::ring::{Ring, VnodeId};
use malachi_testkit::wait::wait_until;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How often the waits below look again.
const POLL: Duration = Duration::from_millis(20);

const NODES: [u64; 3] = [1, 2, 3];

struct Broker {
    id: u64,
    host: Arc<VnodeHost>,
    server: TransportServer,
    _dir: tempfile::TempDir,
}

async fn start(vnode_count: u32) -> Vec<Broker> {
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut brokers = Vec::new();
    for (listener, id) in listeners.into_iter().zip(NODES) {
        brokers.push(open_broker(id, listener, &addrs, vnode_count).await);
    }
    brokers
}

async fn open_broker(
    id: u64,
    listener: TcpListener,
    addrs: &[std::net::SocketAddr],
    vnode_count: u32,
) -> Broker {
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
        id,
        test_cookie(),
    )));
    for (peer, addr) in NODES.iter().zip(addrs) {
        if *peer != id {
            transport.set_peer(*peer, *addr);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = VnodeHostConfig::new(id, NODES.to_vec(), dir.path());
    config.vnode_count = vnode_count;
    config.group.election_timeout_min_ms = 300;
    config.group.election_timeout_max_ms = 600;
    config.group.heartbeat_interval_ms = 60;
    let host = VnodeHost::open(config, transport).await.unwrap();
    let server =
        TransportServer::start(listener, host.clone(), server_config(id, 64 * 1024 * 1024))
            .unwrap();
    Broker {
        id,
        host,
        server,
        _dir: dir,
    }
}

/// ADR 0105: a replica without a quorum of its voters up does not
/// campaign (thousands of groups campaigning against peers still starting
/// were an election storm), and campaigns once a quorum is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_without_a_quorum_up_do_not_campaign_and_elect_once_one_is() {
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut listeners = listeners.into_iter();
    let first = open_broker(1, listeners.next().unwrap(), &addrs, 16).await;
    // Alone: its peers' ports accept but nobody answers a probe. An
    // absence (no campaign), watched for 1.5 s.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let groups = first.host.registry().all();
    assert_eq!(groups.len(), 17, "16 vnodes and the ring's group");
    for group in &groups {
        assert!(
            group.is_parked(),
            "group {} campaigns alone",
            group.group_id()
        );
        assert!(!group.is_leader());
    }
    // A second broker makes a quorum for every group: all elect.
    let second = open_broker(2, listeners.next().unwrap(), &addrs, 16).await;
    wait_until(
        "every group elects, none parked, with a quorum up",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            let leaderless: Vec<u64> = first
                .host
                .registry()
                .all()
                .iter()
                .filter(|g| g.leader_term().0.is_none() || g.is_parked())
                .map(|g| g.group_id())
                .collect();
            if leaderless.is_empty() {
                Ok(())
            } else {
                Err(leaderless)
            }
        },
    )
    .await;
    kill(first).await;
    kill(second).await;
}

async fn kill(broker: Broker) {
    broker.server.shutdown().await;
    broker.host.shutdown().await;
}

async fn create_through(broker: &Broker, topic: &str) {
    let verdict = broker.host.propose(create(topic)).await.unwrap();
    assert!(
        matches!(verdict, Ok(Outcome::TopicCreated { .. })),
        "{topic}: {verdict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topics_created_through_any_broker_are_described_identically_through_every_other() {
    let brokers = start(16).await;
    let topics: Vec<String> = (0..12).map(|i| format!("orders-{i}")).collect();
    for (i, topic) in topics.iter().enumerate() {
        create_through(&brokers[i % brokers.len()], topic).await;
    }
    let ring = brokers[0].host.ring();
    let owners: std::collections::BTreeSet<_> = topics.iter().map(|t| ring.owner(t).id).collect();
    assert!(owners.len() > 1, "the topics should span several vnodes");
    let mut segment_ids = std::collections::BTreeSet::new();
    for topic in &topics {
        let mut seen = Vec::new();
        for broker in &brokers {
            let description = broker.host.describe(topic).await.unwrap();
            assert!(
                description.is_some(),
                "{topic} is missing through node {}",
                broker.id
            );
            seen.push(description);
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{topic}: {seen:?}");
        for range in &seen[0].as_ref().unwrap().ranges {
            for segment in &range.segments {
                // Segment ids name files on disk: unique across vnodes.
                assert!(
                    segment_ids.insert(segment.id),
                    "segment id {} reused",
                    segment.id
                );
            }
        }
    }
    // A creation through one broker is refused through another: one truth.
    let again = brokers[2].host.propose(create(&topics[0])).await.unwrap();
    assert!(
        matches!(again, Err(ModelError::TopicExists { .. })),
        "{again:?}"
    );
    for broker in brokers {
        kill(broker).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vnode_leader_killed_gives_way_and_nothing_acknowledged_is_lost() {
    let mut brokers = start(8).await;
    let before: Vec<String> = (0..8).map(|i| format!("before-{i}")).collect();
    for (i, topic) in before.iter().enumerate() {
        create_through(&brokers[i % 3], topic).await;
    }
    // Kill the broker leading the vnode of the first topic.
    let vnode = brokers[0].host.ring().owner(&before[0]).id;
    let leader = brokers
        .iter()
        .position(|b| b.host.led().contains(&vnode))
        .expect("the vnode has a leader");
    let dead = brokers.remove(leader);
    let dead_id = dead.id;
    kill(dead).await;

    // Metadata operations resume through the survivors, on that vnode too.
    let after: Vec<String> = (0..8).map(|i| format!("after-{i}")).collect();
    for (i, topic) in after.iter().enumerate() {
        create_through(&brokers[i % 2], topic).await;
    }
    let same_vnode = (0..)
        .map(|i| format!("same-vnode-{i}"))
        .find(|t| brokers[0].host.ring().owner(t).id == vnode)
        .unwrap();
    create_through(&brokers[1], &same_vnode).await;
    let new_leader = brokers
        .iter()
        .find(|b| b.host.led().contains(&vnode))
        .map(|b| b.id);
    assert!(new_leader.is_some_and(|id| id != dead_id), "{new_leader:?}");

    for topic in before.iter().chain(&after).chain([&same_vnode]) {
        for broker in &brokers {
            assert!(
                broker.host.describe(topic).await.unwrap().is_some(),
                "{topic} was acknowledged and is lost through node {}",
                broker.id
            );
        }
    }
    for broker in brokers {
        kill(broker).await;
    }
}

/// Waits until every group hosted by `brokers` is quiet (ADR 0101).
async fn wait_all_quiet(brokers: &[Broker]) {
    let what = "every hosted group is quiet (quiet, hosted)";
    let (deadline, poll) = (Duration::from_secs(20), Duration::from_millis(50));
    wait_until(what, deadline, poll, async || {
        let quiet: Vec<(usize, usize)> = brokers
            .iter()
            .map(|b| (b.host.quiet_groups(), b.host.registry().all().len()))
            .collect();
        if quiet.iter().all(|(q, all)| q == all) {
            Ok(())
        } else {
            Err(quiet)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_groups_go_quiet_send_nothing_and_still_take_writes_and_elect() {
    let mut brokers = start(16).await;
    create_through(&brokers[0], "warm-up").await;
    wait_all_quiet(&brokers).await;

    // Quiet: no raft message at all crosses the transport, only the
    // brokers' liveness probes. Ticking, 16 groups with a 60 ms heartbeat
    // would send hundreds a second.
    let before: Vec<_> = brokers.iter().map(|b| b.server.stats()).collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (broker, before) in brokers.iter().zip(&before) {
        let after = broker.server.stats();
        let requests = after.requests_served - before.requests_served;
        assert!(
            requests <= 5,
            "node {} served {requests} raft requests in 1.5 s while quiet",
            broker.id
        );
        assert!(
            after.pings_served > before.pings_served,
            "node {} was never probed",
            broker.id
        );
    }

    // A quiet leader's quorum lease has lapsed: a write through every
    // broker still lands (the leader renews it with one heartbeat round).
    let quiet_writes: Vec<String> = (0..6).map(|i| format!("quiet-{i}")).collect();
    for (i, topic) in quiet_writes.iter().enumerate() {
        create_through(&brokers[i % 3], topic).await;
    }
    wait_all_quiet(&brokers).await;

    // The broker leading the most vnodes goes away; its groups' followers
    // learn it from liveness alone (no heartbeat is missed: none was sent),
    // wake, and elect among themselves.
    let victim = (0..brokers.len())
        .max_by_key(|i| brokers[*i].host.led().len())
        .unwrap();
    let orphaned = brokers[victim].host.led();
    assert!(!orphaned.is_empty());
    let dead = brokers.remove(victim);
    let dead_id = dead.id;
    kill(dead).await;
    for vnode in &orphaned {
        let what = format!("{vnode}, led by the dead node {dead_id}, gets a new leader");
        let leader = wait_until(&what, Duration::from_secs(20), POLL, async || {
            brokers.iter().find(|b| b.host.led().contains(vnode))
        })
        .await;
        assert_ne!(leader.id, dead_id);
    }
    // Everything acknowledged survives, and writes go on through survivors.
    create_through(&brokers[0], "after-the-loss").await;
    for topic in quiet_writes.iter().chain([&"warm-up".to_owned()]) {
        for broker in &brokers {
            assert!(
                broker.host.describe(topic).await.unwrap().is_some(),
                "{topic} was acknowledged and is lost through node {}",
                broker.id
            );
        }
    }
    // The survivors go quiet again, with the dead voter still down.
    wait_all_quiet(&brokers).await;
    for broker in brokers {
        kill(broker).await;
    }
}

/// A topic that a 4-vnode ring gives to vnode 1 and a 2-vnode ring to vnode 0.
fn topic_moved_between_rings() -> String {
    let (old, new) = (Ring::new(2).unwrap(), Ring::new(4).unwrap());
    (0..)
        .map(|i| format!("moved-{i}"))
        .find(|t| old.owner(t).id == VnodeId(0) && new.owner(t).id == VnodeId(1))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_routed_to_the_wrong_vnode_is_refused_then_lands_on_the_right_one() {
    let brokers = start(4).await;
    let topic = topic_moved_between_rings();
    let host = &brokers[1].host;

    // Sent straight to vnode 0, the vnode itself refuses: its arc does not
    // hold the topic, and nothing is applied.
    let refused = host.propose_to(VnodeId(0), create(&topic)).await.unwrap();
    let arc0 = host.ring().vnode(VnodeId(0)).unwrap().arc;
    assert_eq!(
        refused,
        Err(ModelError::WrongVnode {
            topic: topic.clone(),
            arc: arc0
        })
    );
    assert_eq!(arc0, RingArc::new(0, 1 << 62).unwrap());

    // A broker routing by a stale ring (2 vnodes) sends it to vnode 0 too;
    // the refusal makes it re-read the ring and the command lands on vnode 1.
    host.set_routing_ring(Ring::new(2).unwrap());
    let landed = host.propose(create(&topic)).await.unwrap();
    assert!(
        matches!(landed, Ok(Outcome::TopicCreated { .. })),
        "{landed:?}"
    );
    for broker in &brokers {
        assert!(broker.host.describe(&topic).await.unwrap().is_some());
    }
    // It lives on vnode 1's replicas only.
    let mut holders = 0;
    for broker in &brokers {
        if let Some(g) = broker.host.group(VnodeId(0)) {
            assert!(g.read_local(|s| s.topic(&topic).is_none()));
        }
        if let Some(g) = broker.host.group(VnodeId(1)) {
            let mut applied = g.subscribe();
            tokio::time::timeout(Duration::from_secs(10), async {
                while g.read_local(|s| s.topic(&topic).is_none()) {
                    applied.changed().await.unwrap();
                }
            })
            .await
            .unwrap();
            holders += 1;
        }
    }
    assert_eq!(holders, 3);
    for broker in brokers {
        kill(broker).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_led_vnodes_watch_follows_leadership_and_drives_the_coordinator_plan() {
    use malachi_cluster::vnodes::plan_coordinators;
    use std::collections::BTreeSet;
    let mut brokers = start(4).await;
    // A slow timer far beyond the test: only leadership events can drive it.
    let mut watches: Vec<_> = brokers.iter().map(|b| b.host.watch_led(60_000)).collect();
    // Every vnode gets exactly one leader, and the watches show it. That
    // snapshot is the set of coordinators each broker runs.
    let running: Vec<BTreeSet<VnodeId>> = wait_until(
        "the watches show one leader per vnode",
        Duration::from_secs(15),
        POLL,
        async || {
            let led: Vec<BTreeSet<VnodeId>> = watches.iter().map(|w| w.borrow().clone()).collect();
            let total: usize = led.iter().map(|s| s.len()).sum();
            let union: BTreeSet<_> = led.iter().flatten().copied().collect();
            if total == 4 && union.len() == 4 {
                Ok(led)
            } else {
                Err(led)
            }
        },
    )
    .await;
    let dead_at = running.iter().position(|s| !s.is_empty()).unwrap();
    let orphaned = running[dead_at].clone();
    let dead = brokers.remove(dead_at);
    watches.remove(dead_at);
    let mut survivors_running: Vec<BTreeSet<VnodeId>> = running
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != dead_at)
        .map(|(_, s)| s)
        .collect();
    kill(dead).await;

    // The survivors take over the dead broker's vnodes through events alone,
    // and their plans start exactly the coordinators they gained.
    let ring = brokers[0].host.ring();
    for vnode in &orphaned {
        let at = wait_until(
            "a survivor takes over the vnode",
            Duration::from_secs(15),
            POLL,
            async || watches.iter().position(|w| w.borrow().contains(vnode)),
        )
        .await;
        let led = watches[at].borrow().clone();
        // The plan brings the survivor's coordinators to exactly what it
        // leads: it starts the vnode it took over and nothing else is off.
        let plan = plan_coordinators(Some(&ring), &led, &survivors_running[at]);
        let mut after = survivors_running[at].clone();
        after.retain(|v| !plan.stop.contains(v));
        after.extend(plan.start.iter().copied());
        assert_eq!(after, led, "{plan:?}");
        assert!(after.contains(vnode));
        assert!(plan_coordinators(Some(&ring), &led, &after).is_empty());
        survivors_running[at] = after;
    }
    for broker in brokers {
        kill(broker).await;
    }
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
