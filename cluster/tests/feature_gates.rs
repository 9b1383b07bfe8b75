//! Versions and feature gates across brokers (ADR 0134): three hosts in one
//! process on loopback, broker 3 playing an older binary that lacks the
//! feature `zeta`. The feature becomes available (and can be activated)
//! only once every broker advertises it; a downgrade before finalize
//! deactivates it; after finalize a broker lacking it is refused at start,
//! with an error naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_core::model::{Feature, FeatureState, FeatureTable, ModelError, Outcome};
use malachi_testkit::wait::wait_until;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

const FORMED: [u64; 3] = [1, 2, 3];
const ZETA: &str = "zeta";

struct Broker {
    host: Arc<VnodeHost>,
    server: TransportServer,
    dir: tempfile::TempDir,
}

fn cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

/// Opens broker `id`, advertising the baseline plus `zeta` if `with_zeta`.
async fn open(
    id: u64,
    addrs: &BTreeMap<u64, SocketAddr>,
    dir: &tempfile::TempDir,
    with_zeta: bool,
) -> Result<Arc<VnodeHost>, malachi_cluster::group::GroupError> {
    let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(id, cookie())));
    for (peer, addr) in addrs {
        if *peer != id {
            transport.set_peer(*peer, *addr);
        }
    }
    let mut config = VnodeHostConfig::new(id, FORMED.to_vec(), dir.path());
    config.vnode_count = 2;
    config.group.election_timeout_min_ms = 300;
    config.group.election_timeout_max_ms = 600;
    config.group.heartbeat_interval_ms = 60;
    if with_zeta {
        config.supported_features.push(ZETA.to_owned());
    }
    VnodeHost::open(config, transport).await
}

async fn start(
    id: u64,
    addrs: &BTreeMap<u64, SocketAddr>,
    dir: tempfile::TempDir,
    with_zeta: bool,
) -> Broker {
    let listener = TcpListener::bind(addrs[&id]).await.unwrap();
    let host = open(id, addrs, &dir, with_zeta).await.unwrap();
    let server = TransportServer::start(
        listener,
        host.clone(),
        malachi_cluster::group::TransportServerConfig::new(id, cookie()),
    )
    .unwrap();
    Broker { host, server, dir }
}

async fn stop(broker: Broker) -> tempfile::TempDir {
    broker.server.shutdown().await;
    broker.host.shutdown().await;
    broker.dir
}

/// Waits until the ring group's table, read through `via`, meets `done`.
async fn wait_table(
    via: &VnodeHost,
    what: &str,
    done: impl Fn(&FeatureTable) -> bool,
) -> FeatureTable {
    wait_until(what, Duration::from_secs(30), POLL, async || {
        match via.feature_table().await {
            Ok(table) if done(&table) => Ok(table),
            Ok(table) => Err(format!("{table:?}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(50);

fn zeta(table: &FeatureTable) -> FeatureState {
    table.state_of(ZETA, &BTreeSet::new())
}

/// Whether broker `node`'s advertisement lists `zeta` as `with`.
fn advertised(table: &FeatureTable, node: u64, with: bool) -> bool {
    table
        .members()
        .get(&node)
        .is_some_and(|a| a.supported.contains(ZETA) == with)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_feature_activates_once_every_broker_has_it_and_after_finalize_a_broker_lacking_it_is_refused()
 {
    let mut addrs = BTreeMap::new();
    for id in FORMED {
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, probe.local_addr().unwrap());
    }
    let mut brokers = Vec::new();
    for id in FORMED {
        brokers.push(start(id, &addrs, tempfile::tempdir().unwrap(), id != 3).await);
    }
    let one = Arc::clone(&brokers[0].host);

    // Everyone advertised: the baseline is active (auto-activated, one
    // proposal per feature, so waited for: checking right after the third
    // advertisement found `reshape_policy` still available), zeta is not
    // available while broker 3 lacks it, and activating it is refused
    // naming 3.
    let table = wait_table(&one, "three advertisements and the baseline active", |t| {
        t.members().len() == 3
            && malachi_core::model::SUPPORTED_FEATURES
                .iter()
                .all(|f| t.require(*f).is_ok())
    })
    .await;
    for feature in malachi_core::model::SUPPORTED_FEATURES {
        assert_eq!(table.require(feature), Ok(()), "{feature}");
    }
    assert_eq!(zeta(&table), FeatureState::Unavailable);
    assert_eq!(
        one.activate_feature(ZETA).await.unwrap(),
        Err(ModelError::FeatureUnavailable {
            feature: ZETA.to_owned(),
            missing: vec![3],
        })
    );

    // Broker 3 upgraded: zeta is available, and activates.
    let dir = stop(brokers.pop().unwrap()).await;
    brokers.push(start(3, &addrs, dir, true).await);
    wait_table(&one, "broker 3 advertising zeta", |t| {
        advertised(t, 3, true)
    })
    .await;
    assert_eq!(
        zeta(&one.feature_table().await.unwrap()),
        FeatureState::Available
    );
    assert_eq!(
        one.activate_feature(ZETA).await.unwrap(),
        Ok(Outcome::FeatureActivated {
            feature: ZETA.to_owned()
        })
    );
    assert_eq!(zeta(&one.features()), FeatureState::Active);

    // A downgrade before finalize is allowed: zeta drops back.
    let dir = stop(brokers.pop().unwrap()).await;
    brokers.push(start(3, &addrs, dir, false).await);
    let table = wait_table(&one, "broker 3 downgraded", |t| advertised(t, 3, false)).await;
    assert_eq!(zeta(&table), FeatureState::Unavailable);

    // Upgraded again, activated again, finalized.
    let dir = stop(brokers.pop().unwrap()).await;
    brokers.push(start(3, &addrs, dir, true).await);
    wait_table(&one, "broker 3 upgraded again", |t| advertised(t, 3, true)).await;
    one.activate_feature(ZETA).await.unwrap().unwrap();
    let finalized = one.finalize_features().await.unwrap().unwrap();
    assert!(
        matches!(&finalized, Outcome::FeaturesFinalized { features, version: 1 } if features.iter().any(|f| f == ZETA)),
        "{finalized:?}"
    );
    assert_eq!(zeta(&one.features()), FeatureState::Finalized);
    assert_eq!(one.require(Feature::SplitMergeSegments), Ok(()));

    // Broker 3 on the old binary again: refused at start, naming zeta.
    let three = brokers.pop().unwrap();
    // It has learned of the finalize (and kept it in its data dir).
    wait_until(
        "broker 3 applies the finalize",
        Duration::from_secs(30),
        POLL,
        async || zeta(&three.host.features()) == FeatureState::Finalized,
    )
    .await;
    let dir = stop(three).await;
    let refused = match open(3, &addrs, &dir, false).await {
        Ok(_) => panic!("a broker lacking a finalized feature started"),
        Err(e) => e.to_string(),
    };
    assert!(
        refused.contains(ZETA) && refused.contains("finalized"),
        "{refused}"
    );
    // An upgraded binary starts again.
    brokers.push(start(3, &addrs, dir, true).await);
    wait_table(&one, "broker 3 back", |t| advertised(t, 3, true)).await;
    for b in brokers {
        stop(b).await;
    }
}
