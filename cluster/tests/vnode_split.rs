//! Vnode split, the ring's own group and ring catch-up: three brokers in one
//! process over loopback TCP, restarted from their directories where a test
//! needs it. Waits poll with deadlines; no sleep is an assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig, plan_coordinators};
use malachi_core::model::{Command, ModelError, Outcome, RingArc};
use malachi_core::ring::{Ring, VnodeId};
use malachi_testkit::wait::wait_until;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

const NODES: [u64; 3] = [1, 2, 3];
const VNODES: u32 = 4;
/// The longest any wait in these tests may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);
/// How often a wait checks.
const POLL: Duration = Duration::from_millis(25);

struct Broker {
    id: u64,
    host: Arc<VnodeHost>,
    server: TransportServer,
}

struct Cluster {
    addrs: Vec<SocketAddr>,
    dirs: Vec<tempfile::TempDir>,
    brokers: Vec<Option<Broker>>,
}

impl Cluster {
    async fn start() -> Cluster {
        let mut listeners = Vec::new();
        for _ in NODES {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let dirs: Vec<_> = NODES.iter().map(|_| tempfile::tempdir().unwrap()).collect();
        let mut cluster = Cluster {
            addrs,
            dirs,
            brokers: Vec::new(),
        };
        for (i, listener) in listeners.into_iter().enumerate() {
            let broker = cluster.open(i, listener).await;
            cluster.brokers.push(Some(broker));
        }
        cluster
    }

    async fn open(&self, i: usize, listener: TcpListener) -> Broker {
        let id = NODES[i];
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            test_cookie(),
        )));
        for (peer, addr) in NODES.iter().zip(&self.addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let mut config = VnodeHostConfig::new(id, NODES.to_vec(), self.dirs[i].path());
        config.vnode_count = VNODES;
        config.group.election_timeout_min_ms = 300;
        config.group.election_timeout_max_ms = 600;
        config.group.heartbeat_interval_ms = 60;
        let host = VnodeHost::open(config, transport).await.unwrap();
        let server =
            TransportServer::start(listener, host.clone(), server_config(id, 64 * 1024 * 1024))
                .unwrap();
        Broker { id, host, server }
    }

    fn broker(&self, i: usize) -> &Broker {
        self.brokers[i].as_ref().expect("broker is running")
    }

    fn running(&self) -> impl Iterator<Item = &Broker> {
        self.brokers.iter().flatten()
    }

    async fn kill(&mut self, i: usize) {
        let broker = self.brokers[i].take().expect("broker is running");
        broker.server.shutdown().await;
        broker.host.shutdown().await;
    }

    async fn restart(&mut self, i: usize) {
        let addr = self.addrs[i];
        let what = format!("{addr} can be bound again");
        let listener = wait_until(&what, WAIT, Duration::from_millis(50), async || {
            TcpListener::bind(addr).await
        })
        .await;
        let broker = self.open(i, listener).await;
        self.brokers[i] = Some(broker);
    }

    async fn stop(mut self) {
        for i in 0..self.brokers.len() {
            if self.brokers[i].is_some() {
                self.kill(i).await;
            }
        }
    }
}

async fn create_through(broker: &Broker, topic: &str) {
    let verdict = broker.host.propose(create(topic)).await.unwrap();
    assert!(
        matches!(verdict, Ok(Outcome::TopicCreated { .. })),
        "{topic}: {verdict:?}"
    );
}

/// Topics named `prefix-i` whose ring position lies in `arc`.
fn topics_in(arc: RingArc, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|t| arc.holds_topic(t))
        .take(count)
        .collect()
}

/// Every topic is described through every running broker.
async fn assert_found_everywhere(cluster: &Cluster, topics: &[String]) {
    for topic in topics {
        for broker in cluster.running() {
            let found = broker.host.describe(topic).await.unwrap();
            assert!(
                found.is_some(),
                "{topic} was acknowledged and is missing through node {}",
                broker.id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_while_topics_are_created_concurrently_keeps_every_acknowledged_creation() {
    let cluster = Cluster::start().await;
    let parent = VnodeId(1);
    let parent_arc = Ring::new(VNODES).unwrap().vnode(parent).unwrap().arc;
    let (lower, upper) = parent_arc.halves().unwrap();
    // Topics on both halves of the vnode before the split.
    let before: Vec<String> = topics_in(lower, "before-low", 6)
        .into_iter()
        .chain(topics_in(upper, "before-up", 6))
        .collect();
    for (i, topic) in before.iter().enumerate() {
        create_through(cluster.broker(i % 3), topic).await;
    }

    // Creators through every broker, half of their topics in the moving half.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(0));
    let mut creators = Vec::new();
    for (b, broker) in cluster.running().enumerate() {
        let host = Arc::clone(&broker.host);
        let (stop, created) = (Arc::clone(&stop), Arc::clone(&created));
        creators.push(tokio::spawn(async move {
            let moving = topics_in(upper, &format!("during-{b}-up"), 1000);
            let staying = topics_in(lower, &format!("during-{b}-low"), 1000);
            let mut acknowledged = Vec::new();
            for (up, low) in moving.into_iter().zip(staying) {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                for topic in [up, low] {
                    let verdict = host.propose(create(&topic)).await;
                    match verdict {
                        Ok(Ok(Outcome::TopicCreated { .. })) => acknowledged.push(topic),
                        // A retry of a creation whose first try committed.
                        Ok(Err(ModelError::TopicExists { .. })) => {}
                        other => panic!("creating {topic} failed: {other:?}"),
                    }
                    created.fetch_add(1, Ordering::AcqRel);
                }
            }
            acknowledged
        }));
    }
    // Let the creators get going, then split while they run.
    let going = cluster.running().count() * 2;
    wait_until(
        "the creators have created a few topics",
        WAIT,
        POLL,
        async || created.load(Ordering::Acquire) >= going,
    )
    .await;
    let (kept, child) = cluster.broker(0).host.split_vnode(parent).await.unwrap();
    assert_eq!(kept, parent);
    assert_eq!(child, VnodeId(VNODES));
    // Keep creating after the split so the new ring is used too.
    let at_split = created.load(Ordering::Acquire);
    wait_until(
        "the creators create more after the split",
        WAIT,
        POLL,
        async || created.load(Ordering::Acquire) >= at_split + going,
    )
    .await;
    stop.store(true, Ordering::Release);
    let mut acknowledged = before.clone();
    for creator in creators {
        acknowledged.extend(creator.await.unwrap());
    }
    let moved = acknowledged.iter().filter(|t| upper.holds_topic(t)).count();
    assert!(
        moved > before.len() / 2,
        "too few creations in the moving half: {moved}"
    );

    // Every host learns the new ring (the creators already hit the new
    // arcs; a host that did not is refused and fetches it).
    for broker in cluster.running() {
        let ring = broker.host.refresh_ring().await.unwrap();
        assert_eq!(ring.version(), 2);
        assert_eq!(ring.vnode(parent).unwrap().arc, lower);
        assert_eq!(ring.vnode(child).unwrap().arc, upper);
    }
    assert_eq!(cluster.broker(1).host.pending_split().await.unwrap(), None);
    assert_found_everywhere(&cluster, &acknowledged).await;

    // Each half holds exactly its topics and refuses the other's.
    let host = &cluster.broker(2).host;
    for topic in &acknowledged {
        let (owner, other) = if upper.holds_topic(topic) {
            (child, parent)
        } else if lower.holds_topic(topic) {
            (parent, child)
        } else {
            continue;
        };
        let refused = host
            .propose_to(
                other,
                Command::SealTopic {
                    topic: topic.clone(),
                    at_ms: 9,
                },
            )
            .await
            .unwrap();
        assert!(
            matches!(refused, Err(ModelError::WrongVnode { .. })),
            "{other} served {topic} of {owner}: {refused:?}"
        );
    }
    let again = host
        .propose_to(parent, create(&topics_in(upper, "late", 1)[0]))
        .await
        .unwrap();
    assert_eq!(
        again,
        Err(ModelError::WrongVnode {
            topic: topics_in(upper, "late", 1)[0].clone(),
            arc: lower
        })
    );
    // A second split of the same vnode is a new split, not a resumption.
    let (_, grandchild) = cluster.broker(1).host.split_vnode(parent).await.unwrap();
    assert_eq!(grandchild, VnodeId(VNODES + 1));
    assert_found_everywhere(&cluster, &acknowledged).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_routed_by_the_pre_split_ring_is_refused_then_lands_on_the_child() {
    let cluster = Cluster::start().await;
    let old_ring = Ring::new(VNODES).unwrap();
    let parent = VnodeId(2);
    let (lower, upper) = old_ring.vnode(parent).unwrap().arc.halves().unwrap();
    // Watches begun before the split, with a slow timer far beyond the
    // test: only events can show them the child's leader.
    let watches: Vec<_> = cluster
        .running()
        .map(|b| b.host.watch_led(600_000))
        .collect();
    let (_, child) = cluster.broker(0).host.split_vnode(parent).await.unwrap();
    let leader_at = wait_until("a watch sees the child's leader", WAIT, POLL, async || {
        watches.iter().position(|w| w.borrow().contains(&child))
    })
    .await;
    // The leader learns the new ring from the split's announcement, and
    // its coordinator manager then starts the child's coordinator.
    let host = Arc::clone(&cluster.broker(leader_at).host);
    wait_until("the child's leader learns the ring", WAIT, POLL, || {
        let host = Arc::clone(&host);
        async move { host.ring().vnode(child).is_some() }
    })
    .await;
    let led = watches[leader_at].borrow().clone();
    let plan = plan_coordinators(Some(&host.ring()), &led, &BTreeSet::new());
    assert!(plan.start.contains(&child), "{plan:?}");

    let topic = topics_in(upper, "stale", 1).remove(0);
    let host = &cluster.broker(1).host;
    // Straight to the parent: refused, nothing applied.
    let refused = host.propose_to(parent, create(&topic)).await.unwrap();
    assert_eq!(
        refused,
        Err(ModelError::WrongVnode {
            topic: topic.clone(),
            arc: lower
        })
    );
    // A broker routing by the ring from before the split sends it to the
    // parent, is refused, re-reads the ring and lands on the child.
    host.set_routing_ring(old_ring.clone());
    let landed = host.propose(create(&topic)).await.unwrap();
    assert!(
        matches!(landed, Ok(Outcome::TopicCreated { .. })),
        "{landed:?}"
    );
    // A stale reader is refused too rather than told "absent".
    cluster.broker(2).host.set_routing_ring(old_ring);
    assert!(
        cluster
            .broker(2)
            .host
            .describe(&topic)
            .await
            .unwrap()
            .is_some()
    );
    // It lives on the child's replicas only.
    for broker in cluster.running() {
        if let Some(g) = broker.host.group(parent) {
            assert!(g.read_local(|s| s.topic(&topic).is_none()));
        }
    }
    let child_group = cluster
        .running()
        .find_map(|b| b.host.group(child))
        .expect("some broker hosts the child");
    wait_until("the child applies the topic", WAIT, POLL, || {
        let g = child_group.clone();
        let topic = topic.clone();
        async move { g.read_local(|s| s.topic(&topic).is_some()) }
    })
    .await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ring_survives_a_restart_of_every_host_and_a_stale_host_catches_up() {
    let mut cluster = Cluster::start().await;
    let parent = VnodeId(0);
    let (lower, upper) = Ring::new(VNODES)
        .unwrap()
        .vnode(parent)
        .unwrap()
        .arc
        .halves()
        .unwrap();
    let mut topics: Vec<String> = topics_in(upper, "early", 4);
    topics.extend(topics_in(lower, "early-low", 2));
    for topic in &topics {
        create_through(cluster.broker(0), topic).await;
    }
    // Node 3 misses the split: its ring stays the first one on disk.
    cluster.kill(2).await;
    let (_, child) = cluster.broker(0).host.split_vnode(parent).await.unwrap();
    let late = topics_in(upper, "late", 4);
    for topic in &late {
        create_through(cluster.broker(1), topic).await;
    }
    topics.extend(late.iter().cloned());

    cluster.restart(2).await;
    // Back with the old ring, it catches up in the background, opens its
    // replica of the child and the child's log reaches it.
    let stale = Arc::clone(&cluster.broker(2).host);
    wait_until("node 3 learns the split ring", WAIT, POLL, || {
        let host = Arc::clone(&stale);
        async move { host.ring().version() == 2 }
    })
    .await;
    wait_until("node 3 replicates the child", WAIT, POLL, || {
        let host = Arc::clone(&stale);
        let late = late.clone();
        async move {
            host.group(child)
                .is_some_and(|g| g.read_local(|s| late.iter().all(|t| s.topic(t).is_some())))
        }
    })
    .await;
    assert_found_everywhere(&cluster, &topics).await;

    // Every host stops and starts again: the ring is durable.
    for i in 0..3 {
        cluster.kill(i).await;
    }
    for i in 0..3 {
        cluster.restart(i).await;
    }
    for broker in cluster.running() {
        // From this broker's own disk, before any fetch.
        let ring = broker.host.ring();
        assert_eq!(ring.version(), 2, "node {}", broker.id);
        assert_eq!(ring.vnode(child).unwrap().arc, upper);
    }
    let record = cluster.broker(1).host.ring_record().await.unwrap();
    assert_eq!(record.ring.version(), 2);
    assert_eq!(record.pending, None);
    assert_found_everywhere(&cluster, &topics).await;
    let owners: BTreeSet<VnodeId> = topics.iter().map(|t| record.ring.owner(t).id).collect();
    assert_eq!(owners, BTreeSet::from([parent, child]));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupted_split_resumes_from_another_host_and_an_uncommitted_one_rolls_back() {
    let cluster = Cluster::start().await;
    let parent = VnodeId(3);
    let (lower, upper) = Ring::new(VNODES)
        .unwrap()
        .vnode(parent)
        .unwrap()
        .arc
        .halves()
        .unwrap();
    let early = topics_in(upper, "early", 3);
    for topic in &early {
        create_through(cluster.broker(0), topic).await;
    }

    // Rollback: a split begun and fenced, then aborted before its commit.
    let host = &cluster.broker(0).host;
    // The ring group creates its ring on first read (`split_vnode` reads
    // it first; this test proposes the steps itself).
    host.ring_record().await.unwrap();
    let begun = host
        .propose_ring(Command::BeginSplit { parent })
        .await
        .unwrap();
    let Ok(Outcome::SplitBegun { split: aborted }) = begun else {
        panic!("{begun:?}")
    };
    let fenced = host
        .propose_to(parent, Command::FenceArc { moving: upper })
        .await
        .unwrap();
    assert_eq!(fenced, Ok(Outcome::ArcFenced));
    let refused = host
        .propose_to(parent, create(&topics_in(upper, "fenced", 1)[0]))
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(ModelError::Moved { .. })),
        "{refused:?}"
    );
    assert!(cluster.broker(1).host.abort_split(parent).await.unwrap());
    // The parent serves its whole arc again.
    let after_abort = topics_in(upper, "after-abort", 2);
    for topic in &after_abort {
        create_through(cluster.broker(2), topic).await;
    }
    assert_eq!(host.ring_record().await.unwrap().ring.version(), 1);

    // Interrupted: begun and fenced by one host (which then "crashed"
    // before seeding), while a client's creation in the moving half waits
    // on `Moved` retries.
    let begun = host
        .propose_ring(Command::BeginSplit { parent })
        .await
        .unwrap();
    let Ok(Outcome::SplitBegun { split }) = begun else {
        panic!("{begun:?}")
    };
    assert_eq!(
        split.child,
        VnodeId(aborted.child.0 + 1),
        "an aborted id is reused"
    );
    host.propose_to(parent, Command::FenceArc { moving: upper })
        .await
        .unwrap()
        .unwrap();
    let waiting_topic = topics_in(upper, "waiting", 1).remove(0);
    let waiting = {
        let host = Arc::clone(&cluster.broker(1).host);
        let topic = waiting_topic.clone();
        tokio::spawn(async move { host.propose(create(&topic)).await })
    };
    // Another host resumes the same split.
    let (kept, child) = cluster.broker(2).host.split_vnode(parent).await.unwrap();
    assert_eq!((kept, child), (parent, split.child));
    let landed = waiting.await.unwrap().unwrap();
    assert!(
        matches!(landed, Ok(Outcome::TopicCreated { .. })),
        "{landed:?}"
    );
    // Resuming a finished split is a new split, never a repeat of this one.
    assert_eq!(cluster.broker(0).host.pending_split().await.unwrap(), None);
    let record = cluster.broker(0).host.ring_record().await.unwrap();
    assert_eq!(record.ring.vnode(child).unwrap().arc, upper);
    assert_eq!(record.ring.vnode(parent).unwrap().arc, lower);
    let mut all = early.clone();
    all.extend(after_abort);
    all.push(waiting_topic);
    assert_found_everywhere(&cluster, &all).await;
    cluster.stop().await;
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
