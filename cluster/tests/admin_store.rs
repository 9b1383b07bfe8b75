//! The admin stores in the ring's raft group (ADR 0148), across three
//! brokers in one process on loopback: a user and an ACL entry added
//! through one broker are seen through another's cache within a second,
//! survive the ring group's leader being killed, and the commands are not
//! proposed while a broker lacking `admin_store` holds the feature back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{AdminStoreError, AuthViewCache, VnodeHost, VnodeHostConfig};
use malachi_core::auth::acl::{
    AclEntry, NamePattern, Operation, Permission, Principal, PrincipalPattern, ResourcePattern,
};
use malachi_core::auth::scram::StoredCredential;
use malachi_core::model::{Command, Feature, Outcome};
use malachi_testkit::wait::wait_until;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const NODES: [u64; 3] = [1, 2, 3];

struct Broker {
    host: Arc<VnodeHost>,
    server: TransportServer,
    _dir: tempfile::TempDir,
}

fn cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

/// Three brokers; broker 3 lacks `admin_store` unless `all_support`.
async fn start(all_support: bool) -> Vec<Broker> {
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut brokers = Vec::new();
    for (listener, id) in listeners.into_iter().zip(NODES) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(id, cookie())));
        for (peer, addr) in NODES.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = VnodeHostConfig::new(id, NODES.to_vec(), dir.path());
        config.vnode_count = 2;
        config.group.election_timeout_min_ms = 300;
        config.group.election_timeout_max_ms = 600;
        config.group.heartbeat_interval_ms = 60;
        if !all_support && id == 3 {
            config
                .supported_features
                .retain(|f| f != Feature::AdminStore.name());
        }
        let host = VnodeHost::open(config, transport).await.unwrap();
        let server = TransportServer::start(
            listener,
            host.clone(),
            malachi_cluster::group::TransportServerConfig::new(id, cookie()),
        )
        .unwrap();
        brokers.push(Broker {
            host,
            server,
            _dir: dir,
        });
    }
    brokers
}

async fn kill(broker: Broker) {
    broker.server.shutdown().await;
    broker.host.shutdown().await;
}

fn put_alice() -> Command {
    Command::PutUser {
        name: "alice".into(),
        credential: StoredCredential::from_salted(&[7; 32], &[9; 16], 4096),
        replace: false,
        at_ms: 1_700_000_000_000,
    }
}

fn alice_may_consume(topic: &str) -> AclEntry {
    AclEntry {
        principal: PrincipalPattern::User(Principal::user("alice")),
        resource: ResourcePattern::Topic(NamePattern::Literal(topic.to_owned())),
        operation: Operation::Consume,
        permission: Permission::Allow,
    }
}

/// Waits until every broker of `brokers` reads `admin_store` as active.
async fn wait_active(brokers: &[Broker]) {
    for broker in brokers {
        wait_until(
            "admin_store active",
            Duration::from_secs(30),
            Duration::from_millis(50),
            async || {
                broker.host.feature_table().await.is_ok()
                    && broker.host.require(Feature::AdminStore).is_ok()
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_added_through_one_broker_is_seen_on_another_within_a_second_and_survives_a_leader_kill()
 {
    let mut brokers = start(true).await;
    wait_active(&brokers).await;
    let cache = AuthViewCache::new(Duration::from_millis(500));
    // Broker 3's cache holds the empty view before the change.
    let before = cache.get(&brokers[2].host).await.unwrap();
    assert!(before.users.is_empty());

    let put = brokers[0].host.propose_admin(put_alice()).await.unwrap();
    assert_eq!(put, Ok(Outcome::UserPut { created: true }));
    let acknowledged = Instant::now();
    let view = wait_until(
        "alice on broker 3",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            let view = cache.get(&brokers[2].host).await.ok()?;
            view.users.contains_key("alice").then_some(view)
        },
    )
    .await;
    let seen_after = acknowledged.elapsed();
    assert!(
        seen_after < Duration::from_secs(1),
        "seen after {seen_after:?}"
    );
    assert_eq!(
        view.credential("alice"),
        Some(&StoredCredential::from_salted(&[7; 32], &[9; 16], 4096))
    );
    // The same creation again, through another broker: a no-op.
    let again = brokers[1].host.propose_admin(put_alice()).await.unwrap();
    assert_eq!(again, Ok(Outcome::Unchanged));

    // Kill the ring group's leader: the store survives, and takes changes.
    let leader = wait_until(
        "a ring group leader",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            brokers
                .iter()
                .position(|b| b.host.ring_group().is_some_and(|g| g.is_leader()))
        },
    )
    .await;
    kill(brokers.remove(leader)).await;
    let entry = alice_may_consume("orders");
    let added = wait_until(
        "an ACL entry added after the leader kill",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            brokers[0]
                .host
                .propose_admin(Command::AddAcl {
                    entry: entry.clone(),
                })
                .await
                .ok()
        },
    )
    .await;
    assert!(
        matches!(added, Ok(Outcome::AclAdded | Outcome::Unchanged)),
        "{added:?}"
    );
    for broker in &brokers {
        let view = broker.host.auth_view().await.unwrap();
        assert!(view.users.contains_key("alice"));
        assert_eq!(view.acls, vec![entry.clone()]);
    }
    for broker in brokers {
        kill(broker).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_commands_are_not_proposed_while_a_broker_lacks_the_feature() {
    let brokers = start(false).await;
    // Every broker advertised: the feature stays unavailable (broker 3
    // lacks it), so nothing is proposed and the view is not asked for.
    wait_until(
        "three advertisements",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            brokers[0]
                .host
                .feature_table()
                .await
                .is_ok_and(|t| t.members().len() == 3)
        },
    )
    .await;
    let refused = brokers[0].host.propose_admin(put_alice()).await;
    assert!(
        matches!(refused, Err(AdminStoreError::Inactive(_))),
        "{refused:?}"
    );
    assert!(matches!(
        brokers[1].host.auth_view().await,
        Err(AdminStoreError::Inactive(_))
    ));
    // Not an admin command: refused whatever the feature.
    assert!(matches!(
        brokers[0]
            .host
            .propose_admin(Command::InitRing { vnodes: 2 })
            .await,
        Err(AdminStoreError::NotAdmin(_))
    ));
    for broker in brokers {
        kill(broker).await;
    }
}
