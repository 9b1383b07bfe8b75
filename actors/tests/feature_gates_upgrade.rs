//! The first upgrade onto feature gates is rolling (ADR 0134 §7): three
//! brokers in this process, broker 3 playing a binary from before the
//! feature table (it gossips no `malachi.features` and advertises
//! nothing). While it runs, brokers 1 and 2 write nothing to the ring
//! group's feature table (it stays pristine: no advertisement, no
//! activation), say whom they wait for, refuse an operator's activate and
//! finalize naming it, and serve. Once broker 3 is upgraded (restarted
//! without the flag), every broker advertises and the auto features
//! activate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_core::model::{BASELINE_FEATURES, Feature};
use malachi_wire::ErrorCode;
use malachi_wire::messages::{FeaturesRequest, FeaturesResponse};

const TOPIC: &str = "upgrade";
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// Broker `node_id`; `old`: playing a binary from before feature gates.
fn config(dir: &Path, node_id: u64, seeds: &[SocketAddr], old: bool) -> BrokerConfig {
    let mut config = three_node_config(dir, node_id, seeds);
    config.cluster.plays_pre_feature_gates = old;
    config
}

async fn features(
    addr: SocketAddr,
    request: &FeaturesRequest,
) -> Result<FeaturesResponse, Refused> {
    TestClient::connect(addr).await.call(request).await
}

fn state_of<'a>(response: &'a FeaturesResponse, name: &str) -> Option<&'a str> {
    response
        .features
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.state.as_str())
}

/// Writes `tag`'s records through the active segment's primary until
/// acknowledged, and returns them.
async fn write(brokers: &[Option<BrokerHandle>], tag: &str) -> Vec<malachi_wire::batch::Record> {
    let records = keyed_batch(tag, 8, 4);
    let what = format!("the {tag} records are acknowledged");
    wait_until(&what, WAIT, POLL, async || {
        produce_once(brokers, TOPIC, &records).await.then_some(())
    })
    .await;
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_is_written_to_the_feature_table_until_the_last_old_broker_is_upgraded() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let mut brokers = start_stoppable(3, |node_id, seeds| {
        config(root.path(), node_id, seeds, node_id == 3)
    })
    .await;
    let addr = |brokers: &[Option<BrokerHandle>], node: u64| {
        brokers[(node - 1) as usize].as_ref().unwrap().client_addr()
    };

    // Brokers 1 and 2 find that broker 3 does not read the table.
    for node in [1, 2] {
        let at = addr(&brokers, node);
        let what = format!("broker {node} waits for broker 3");
        wait_until(&what, WAIT, POLL, async || {
            match features(at, &FeaturesRequest::default()).await {
                Ok(r) if r.waiting_for == vec![3] => Ok(r),
                other => Err(other),
            }
        })
        .await;
    }

    // They serve meanwhile: a topic of three copies is written and read.
    create_replicated_topic(addr(&brokers, 1), TOPIC, 3).await;
    let mut sent = write(&brokers, "before").await;

    // Nothing was written to the table: no advertisement, no activation
    // past the baseline, and an operator's changes are refused naming 3.
    for node in [1, 2, 3] {
        let r = features(addr(&brokers, node), &FeaturesRequest::default())
            .await
            .unwrap();
        assert!(r.brokers.is_empty(), "broker {node}: {r:?}");
        assert_eq!(r.cluster_version, 0, "broker {node}: {r:?}");
        let active: Vec<&str> = r
            .features
            .iter()
            .filter(|f| f.state == "active")
            .map(|f| f.name.as_str())
            .collect();
        let mut baseline = BASELINE_FEATURES.to_vec();
        baseline.sort_unstable();
        assert_eq!(active, baseline, "broker {node}: {r:?}");
    }
    let activate = FeaturesRequest {
        activate: Some(Feature::LeaseReleaseGeneration.name().to_owned()),
        finalize: false,
    };
    let finalize = FeaturesRequest {
        activate: None,
        finalize: true,
    };
    for request in [activate, finalize] {
        let refused = features(addr(&brokers, 1), &request).await.unwrap_err();
        assert_eq!(refused.code, ErrorCode::FeatureUnavailable, "{refused:?}");
        assert!(refused.message.contains("[3]"), "{refused:?}");
    }

    // Broker 3 is upgraded: restarted on its data dir without the flag.
    brokers[2].take().unwrap().shutdown().await.unwrap();
    let seeds = [addr(&brokers, 1), addr(&brokers, 2)];
    let upgraded = malachi_actors::Broker::start(config(root.path(), 3, &seeds, false))
        .await
        .unwrap();
    assert!(
        upgraded.wait_ready(30_000).await,
        "broker 3 never came back"
    );
    brokers[2] = Some(upgraded);

    // Every broker advertises, and the auto feature activates.
    let auto = Feature::LeaseReleaseGeneration.name();
    for node in [1, 2, 3] {
        let at = addr(&brokers, node);
        let what = format!("broker {node} sees every broker advertised and {auto} active");
        wait_until(&what, WAIT, POLL, async || {
            match features(at, &FeaturesRequest::default()).await {
                Ok(r)
                    if r.brokers.len() == 3
                        && r.waiting_for.is_empty()
                        && state_of(&r, auto) == Some("active") =>
                {
                    Ok(r)
                }
                other => Err(other),
            }
        })
        .await;
    }

    // And the cluster still serves every record once.
    sent.extend(write(&brokers, "after").await);
    // Through whichever broker writes the topic now (placed by load, ADR
    // 0144, and moved by broker 3's restart).
    let live: Vec<&BrokerHandle> = brokers.iter().flatten().collect();
    let mut reader = common::redirects::reader_at(&live, live[0], TOPIC).await;
    let got = read_all(&mut reader, TOPIC).await;
    assert_eq!(by_key(&got), by_key(&sent));

    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}
