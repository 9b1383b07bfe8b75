//! Brokers joining and leaving a running cluster (ADR 0104): four hosts in
//! one process on loopback. The fourth joins three that formed the
//! cluster, takes its share of the vnode replicas while metadata requests
//! keep flowing, and is then decommissioned again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_core::model::Outcome;
use malachi_core::ring::{MemberState, RING_VNODE, VnodeId};
use malachi_testkit::wait::wait_until;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

const FORMED: [u64; 3] = [1, 2, 3];
const VNODES: u32 = 8;

struct Broker {
    id: u64,
    host: Arc<VnodeHost>,
    server: TransportServer,
    _dir: tempfile::TempDir,
}

fn test_cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

async fn start(
    id: u64,
    listener: TcpListener,
    addrs: &BTreeMap<u64, SocketAddr>,
    joined: bool,
) -> Broker {
    start_in(
        id,
        listener,
        addrs,
        joined,
        tempfile::tempdir().unwrap(),
        &FORMED,
        u64::MAX,
    )
    .await
}

async fn start_in(
    id: u64,
    listener: TcpListener,
    addrs: &BTreeMap<u64, SocketAddr>,
    joined: bool,
    dir: tempfile::TempDir,
    formed: &[u64],
    replace_after_ms: u64,
) -> Broker {
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
        id,
        test_cookie(),
    )));
    for (peer, addr) in addrs {
        if *peer != id {
            transport.set_peer(*peer, *addr);
        }
    }
    let mut config = VnodeHostConfig::new(id, formed.to_vec(), dir.path());
    config.joined = joined;
    config.replace_after_ms = replace_after_ms;
    config.vnode_count = VNODES;
    config.group.election_timeout_min_ms = 300;
    config.group.election_timeout_max_ms = 600;
    config.group.heartbeat_interval_ms = 60;
    config.rebalance_check_ms = 100;
    config.membership_step_timeout_ms = 10_000;
    let host = VnodeHost::open(config, transport).await.unwrap();
    let server = TransportServer::start(
        listener,
        host.clone(),
        malachi_cluster::group::TransportServerConfig::new(id, test_cookie()),
    )
    .unwrap();
    Broker {
        id,
        host,
        server,
        _dir: dir,
    }
}

/// The topics created so far, for which vnodes hold segments (`create`
/// places every segment on brokers 1 and 2).
type Created = Arc<parking_lot::Mutex<Vec<String>>>;

/// The brokers holding segment copies of `vnode`'s topics: they keep a
/// replica of its group, a learner at least (ADR 0104).
fn holders(via: &Broker, created: &Created, vnode: VnodeId) -> BTreeSet<u64> {
    let ring = via.host.ring();
    let has_topics = created.lock().iter().any(|t| ring.owner(t).id == vnode);
    if has_topics {
        [1, 2].into()
    } else {
        BTreeSet::new()
    }
}

/// Waits until every group's leader reports `want(vnode)` as its voters,
/// and the holders of its segment copies that are no voters as learners.
async fn wait_placed(
    via: &Broker,
    created: &Created,
    want: impl Fn(VnodeId) -> BTreeSet<u64>,
    what: &str,
) {
    let what = format!("every group is placed {what}");
    let (deadline, poll) = (Duration::from_secs(90), Duration::from_millis(200));
    wait_until(&what, deadline, poll, async || {
        let memberships = via.host.memberships().await;
        let mut off = Vec::new();
        for (vnode, membership) in &memberships {
            match membership {
                Ok(m) => {
                    let voters: BTreeSet<u64> = m.voters.iter().copied().collect();
                    let learners: BTreeSet<u64> = m.learners.iter().copied().collect();
                    let wanted = want(*vnode);
                    let holders: BTreeSet<u64> = holders(via, created, *vnode)
                        .difference(&wanted)
                        .copied()
                        .collect();
                    if voters != wanted || learners != holders || m.joint {
                        off.push(format!("{vnode}: {m:?}, holders {holders:?}"));
                    }
                }
                Err(e) => off.push(format!("{vnode}: {e}")),
            }
        }
        if off.is_empty() { Ok(()) } else { Err(off) }
    })
    .await;
}

/// Waits until each broker hosts exactly the groups it votes in or holds
/// segment copies of.
async fn wait_hosting(brokers: &[Broker], created: &Created, eligible: &[u64], what: &str) {
    let what = format!("each broker hosts its share of the groups {what} (broker, hosted, share)");
    let (deadline, poll) = (Duration::from_secs(60), Duration::from_millis(100));
    wait_until(&what, deadline, poll, async || {
        let share = |id: u64| {
            (0..VNODES)
                .map(VnodeId)
                .chain([RING_VNODE])
                .filter(|v| {
                    target(*v, eligible).contains(&id)
                        || holders(&brokers[0], created, *v).contains(&id)
                })
                .count()
        };
        let off: Vec<(u64, usize, usize)> = brokers
            .iter()
            .map(|b| (b.id, b.host.registry().all().len(), share(b.id)))
            .filter(|(_, hosted, share)| hosted != share)
            .collect();
        if off.is_empty() { Ok(()) } else { Err(off) }
    })
    .await;
}

fn target(vnode: VnodeId, eligible: &[u64]) -> BTreeSet<u64> {
    malachi_cluster::vnodes::rebalance::target_voters(vnode, eligible, 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_joins_under_traffic_takes_its_share_and_is_decommissioned_again() {
    if std::env::var_os("MALACHI_TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
    let mut listeners = BTreeMap::new();
    for id in [1, 2, 3, 4] {
        listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: BTreeMap<u64, SocketAddr> = listeners
        .iter()
        .map(|(id, l)| (*id, l.local_addr().unwrap()))
        .collect();
    let mut brokers = Vec::new();
    for id in FORMED {
        let listener = listeners.remove(&id).unwrap();
        brokers.push(start(id, listener, &addrs, false).await);
    }
    let created: Created = Arc::default();
    for n in 0..10 {
        let topic = format!("before-{n}");
        let verdict = brokers[0].host.propose(create(&topic)).await.unwrap();
        assert!(
            matches!(verdict, Ok(Outcome::TopicCreated { .. })),
            "{verdict:?}"
        );
        created.lock().push(topic);
    }

    // Metadata traffic through broker 2 all along: every create must land,
    // within the router's own bounded retries.
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let traffic = {
        let host = Arc::clone(&brokers[1].host);
        let stop = Arc::clone(&stop);
        let count = Arc::clone(&count);
        let created = Arc::clone(&created);
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) {
                let topic = format!("during-{n}");
                // Listed first: a holder is expected a moment early, never late.
                created.lock().push(topic.clone());
                match host.propose(create(&topic)).await {
                    Ok(Ok(Outcome::TopicCreated { .. })) => {
                        count.fetch_add(1, Ordering::AcqRel);
                    }
                    other => failures.push(format!("{topic}: {other:?}")),
                }
                n += 1;
                // pacing, not synchronisation: a create every 20 ms.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            failures
        })
    };

    // Broker 4 joins: it knows only the formation's nodes and asks to be
    // admitted; the leaders move its share of the replicas to it.
    let listener = listeners.remove(&4).unwrap();
    brokers.push(start(4, listener, &addrs, true).await);
    let four = [1u64, 2, 3, 4];
    wait_placed(
        &brokers[0],
        &created,
        |v| target(v, &four),
        "after the join",
    )
    .await;
    let members = brokers[0].host.members();
    assert_eq!(members.get(&4), Some(&MemberState::Active));
    // Each broker hosts exactly its share: broker 4 every group it should
    // vote in, the others none they left but for their segment copies
    // (closes travel after the change).
    assert!((0..VNODES).any(|v| target(VnodeId(v), &four).contains(&4)));
    wait_hosting(&brokers, &created, &four, "after the join").await;

    // Broker 4 answers for every topic.
    for n in 0..10 {
        let topic = format!("before-{n}");
        assert!(
            brokers[3].host.describe(&topic).await.unwrap().is_some(),
            "{topic}"
        );
    }

    // Decommission broker 1 (through broker 4): everything moves off it.
    let version = brokers[3].host.decommission(1).await.unwrap().unwrap();
    assert!(version > 1);
    let rest = [2u64, 3, 4];
    wait_placed(
        &brokers[1],
        &created,
        |v| target(v, &rest),
        "after decommissioning 1",
    )
    .await;
    // Broker 1 votes nowhere; it keeps learner replicas of the vnodes
    // whose segment copies it holds, and nothing else.
    wait_hosting(&brokers, &created, &rest, "after decommissioning 1").await;
    for group in brokers[0].host.registry().all() {
        assert!(!group.membership().voters.contains(&1) || group.membership().voters.is_empty());
    }

    stop.store(true, Ordering::Release);
    let failures = traffic.await.unwrap();
    assert!(failures.is_empty(), "requests failed: {failures:#?}");
    assert!(count.load(Ordering::Acquire) > 0);

    // A decommission that would leave fewer brokers than replicas is refused.
    let refused = brokers[1].host.decommission(2).await.unwrap().unwrap_err();
    assert!(refused.to_string().contains("fewer than"), "{refused}");

    // Broker 1 stops; the cluster carries on without it.
    let one = brokers.remove(0);
    one.server.shutdown().await;
    one.host.shutdown().await;
    for n in 0..10 {
        let topic = format!("after-{n}");
        let verdict = brokers[0].host.propose(create(&topic)).await.unwrap();
        assert!(
            matches!(verdict, Ok(Outcome::TopicCreated { .. })),
            "{verdict:?}"
        );
        assert!(brokers[2].host.describe(&topic).await.unwrap().is_some());
    }
    for b in brokers {
        b.server.shutdown().await;
        b.host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_dead_past_replace_after_is_replaced_and_takes_its_share_back_on_return() {
    const ALL: [u64; 4] = [1, 2, 3, 4];
    let mut listeners = BTreeMap::new();
    for id in ALL {
        listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: BTreeMap<u64, SocketAddr> = listeners
        .iter()
        .map(|(id, l)| (*id, l.local_addr().unwrap()))
        .collect();
    let mut brokers = Vec::new();
    for id in ALL {
        let listener = listeners.remove(&id).unwrap();
        let dir = tempfile::tempdir().unwrap();
        brokers.push(start_in(id, listener, &addrs, false, dir, &ALL, 1_500).await);
    }
    let created: Created = Arc::default();
    for n in 0..8 {
        let topic = format!("t-{n}");
        let verdict = brokers[0].host.propose(create(&topic)).await.unwrap();
        assert!(
            matches!(verdict, Ok(Outcome::TopicCreated { .. })),
            "{verdict:?}"
        );
        created.lock().push(topic);
    }
    wait_placed(&brokers[0], &created, |v| target(v, &ALL), "as formed").await;

    // Broker 4 dies; 1.5 s later its replicas are replaced on 1, 2 and 3.
    let four = brokers.pop().unwrap();
    four.server.shutdown().await;
    four.host.shutdown().await;
    let dir = four._dir;
    wait_placed(
        &brokers[0],
        &created,
        |v| target(v, &[1, 2, 3]),
        "after broker 4 died",
    )
    .await;
    for n in 0..8 {
        assert!(
            brokers[2]
                .host
                .describe(&format!("t-{n}"))
                .await
                .unwrap()
                .is_some()
        );
    }

    // It returns on its data dir: the replicas it was removed from close
    // (nobody told it while it was down), and it takes its share back.
    let listener = TcpListener::bind(addrs[&4]).await.unwrap();
    brokers.push(start_in(4, listener, &addrs, false, dir, &ALL, 1_500).await);
    wait_placed(
        &brokers[0],
        &created,
        |v| target(v, &ALL),
        "after broker 4 returned",
    )
    .await;
    wait_hosting(&brokers, &created, &ALL, "after broker 4 returned").await;
    for n in 0..8 {
        assert!(
            brokers[3]
                .host
                .describe(&format!("t-{n}"))
                .await
                .unwrap()
                .is_some()
        );
    }
    for b in brokers {
        b.server.shutdown().await;
        b.host.shutdown().await;
    }
}
