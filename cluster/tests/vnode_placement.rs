//! Vnode replicas placed by constraints (ADR 0121): four hosts in one
//! process on loopback, in zones a, a, b and c. Each commits its zone to
//! the ring; once the `vnodes` policy asks for three distinct zones, every
//! group's voters (the ring's own included) move to span them, and
//! deleting the policy returns them to rendezvous hashing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::rebalance::target_voters;
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_core::model::{Command, StoragePolicy};
use malachi_core::ring::{RING_VNODE, VNODES_POLICY, VnodeId};
use malachi_testkit::wait::wait_until;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const NODES: [u64; 4] = [1, 2, 3, 4];
const ZONES: [&str; 4] = ["a", "a", "b", "c"];
const VNODES: u32 = 8;

struct Broker {
    host: Arc<VnodeHost>,
    _server: TransportServer,
    _dir: tempfile::TempDir,
}

fn cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

async fn start(id: u64, listener: TcpListener, addrs: &BTreeMap<u64, SocketAddr>) -> Broker {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(id, cookie())));
    for (peer, addr) in addrs {
        if *peer != id {
            transport.set_peer(*peer, *addr);
        }
    }
    let mut config = VnodeHostConfig::new(id, NODES.to_vec(), dir.path());
    config.vnode_count = VNODES;
    config.group.election_timeout_min_ms = 300;
    config.group.election_timeout_max_ms = 600;
    config.group.heartbeat_interval_ms = 60;
    config.rebalance_check_ms = 100;
    config.membership_step_timeout_ms = 10_000;
    config.attributes = BTreeMap::from([("zone".to_owned(), zone(id).to_owned())]);
    let host = VnodeHost::open(config, transport).await.unwrap();
    let server = TransportServer::start(
        listener,
        host.clone(),
        malachi_cluster::group::TransportServerConfig::new(id, cookie()),
    )
    .unwrap();
    Broker {
        host,
        _server: server,
        _dir: dir,
    }
}

fn zone(node: u64) -> &'static str {
    ZONES[(node - 1) as usize]
}

fn groups() -> impl Iterator<Item = VnodeId> {
    (0..VNODES).map(VnodeId).chain([RING_VNODE])
}

/// Waits until every group's voters, as its leader reports them, are
/// `want(vnode)` and no change is under way.
async fn wait_voters(via: &Broker, want: impl Fn(VnodeId) -> BTreeSet<u64>, what: &str) {
    let what = format!("every group's voters are placed {what}");
    let (deadline, poll) = (Duration::from_secs(120), Duration::from_millis(200));
    wait_until(&what, deadline, poll, async || {
        let mut off = Vec::new();
        for (vnode, membership) in via.host.memberships().await {
            match membership {
                Ok(m) => {
                    let voters: BTreeSet<u64> = m.voters.iter().copied().collect();
                    if voters != want(vnode) || m.joint {
                        off.push(format!("{vnode}: {m:?}, want {:?}", want(vnode)));
                    }
                }
                Err(e) => off.push(format!("{vnode}: {e}")),
            }
        }
        if off.is_empty() { Ok(()) } else { Err(off) }
    })
    .await;
}

fn policy(placement: &[&str]) -> Command {
    Command::PutPolicy {
        policy: StoragePolicy {
            name: VNODES_POLICY.to_owned(),
            retention_age_ms: None,
            retention_bytes: None,
            placement: placement.iter().map(|c| (*c).to_owned()).collect(),
            reshape: None,
        },
    }
}

/// Proposes a ring command through `via` and spreads the new ring, as the
/// broker's policy path does.
async fn propose(via: &Broker, cmd: Command) {
    let verdict = via.host.propose_ring(cmd).await.unwrap();
    assert!(verdict.is_ok(), "{verdict:?}");
    let ring = via.host.refresh_ring().await.unwrap();
    via.host.announce_ring(ring.version()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vnode_replicas_follow_the_vnodes_policys_constraints() {
    let mut listeners = BTreeMap::new();
    for id in NODES {
        listeners.insert(id, TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: BTreeMap<u64, SocketAddr> = listeners
        .iter()
        .map(|(id, l)| (*id, l.local_addr().unwrap()))
        .collect();
    let mut brokers = Vec::new();
    for id in NODES {
        brokers.push(start(id, listeners.remove(&id).unwrap(), &addrs).await);
    }
    let hashed = |v: VnodeId| target_voters(v, &NODES, 3);
    // The hash alone leaves some group in two zones, or the test shows nothing.
    assert!(
        groups().any(|v| {
            let zones: BTreeSet<&str> = hashed(v).iter().map(|n| zone(*n)).collect();
            zones.len() < 3
        }),
        "every hashed set spans three zones already"
    );
    wait_voters(&brokers[0], hashed, "formed").await;

    // Every broker commits its zone to the ring.
    let (deadline, poll) = (Duration::from_secs(60), Duration::from_millis(100));
    wait_until(
        "every broker's zone is committed",
        deadline,
        poll,
        async || {
            let ring = brokers[0].host.refresh_ring().await.unwrap();
            let committed: Vec<Option<String>> = NODES
                .iter()
                .map(|n| ring.attributes_of(*n).and_then(|a| a.get("zone").cloned()))
                .collect();
            let all = committed
                .iter()
                .zip(NODES)
                .all(|(z, n)| z.as_deref() == Some(zone(n)));
            if all { Ok(()) } else { Err(committed) }
        },
    )
    .await;

    propose(&brokers[1], policy(&["distinct(zone) >= 3"])).await;
    // The announcement is fetched in the background: read the ring here.
    let ring = brokers[0].host.refresh_ring().await.unwrap();
    assert_eq!(ring.vnode_placement(), ["distinct(zone) >= 3"]);
    let spans_three = |v: VnodeId| {
        let placed = brokers[0].host.target_voters(v);
        placed.into_iter().collect::<BTreeSet<u64>>()
    };
    for v in groups() {
        let zones: BTreeSet<&str> = spans_three(v).iter().map(|n| zone(*n)).collect();
        assert_eq!(zones.len(), 3, "{v}: {:?}", spans_three(v));
    }
    wait_voters(&brokers[0], spans_three, "under distinct(zone) >= 3").await;
    // Every broker computes the same target from its own ring copy.
    for (i, b) in brokers.iter().enumerate().skip(1) {
        let what = format!("broker {}'s ring catches up", i + 1);
        wait_until(
            &what,
            Duration::from_secs(30),
            Duration::from_millis(100),
            async || groups().all(|v| b.host.target_voters(v) == brokers[0].host.target_voters(v)),
        )
        .await;
    }

    // Without the policy, back to hashing.
    propose(
        &brokers[2],
        Command::RemovePolicy {
            name: VNODES_POLICY.to_owned(),
        },
    )
    .await;
    wait_voters(&brokers[0], hashed, "policy deleted").await;
    for b in brokers {
        b.host.shutdown().await;
    }
}
