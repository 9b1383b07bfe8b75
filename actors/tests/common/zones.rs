//! Four brokers in two zones whose topic's two ranges are written in
//! different zones: the setup `reshape_elsewhere` and `client_routes`
//! share. A topic of two copies under the placement policy `zoned` (its
//! copies first in zone `a`) is split through its primary; the policy then
//! names zone `b`, and only the upper range is written until it rolls into
//! zone `b`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_testkit::inproc::*;
use malachi_testkit::wait::eventually;
use malachi_wire::batch::Record;
use malachi_wire::messages::{CreateTopicRequest, SplitRangeRequest};

use super::redirects::{batch, keys, produce_following};

/// Broker `n`'s zone is `ZONES[n - 1]`.
pub const ZONES: [&str; 4] = ["a", "a", "b", "b"];
/// Small enough that a few produces roll the segment.
pub const SEGMENT_BYTES_MAX: u64 = 2048;

/// Broker `node_id` of the four, in its zone.
pub fn zoned_config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        attributes: BTreeMap::from([("zone".to_owned(), ZONES[(node_id - 1) as usize].to_owned())]),
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3, 4],
            ..ClusterSettings::default()
        },
        segment_bytes_max: SEGMENT_BYTES_MAX,
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

/// An active range: its id, its active segment's primary and replicas.
pub type Active = (u64, u64, Vec<u64>);

/// `topic`'s active ranges as `client`'s broker describes them, in
/// keyspace order.
pub async fn active(client: &mut TestClient, topic: &str) -> Vec<Active> {
    let Ok(described) = describe(client, topic).await else {
        return Vec::new();
    };
    let mut ranges: Vec<(String, Active)> = described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| {
            let segment = r.segments.last()?;
            let primary = *segment.replicas.first()?;
            Some((
                r.band_start.clone(),
                (r.id, primary, segment.replicas.clone()),
            ))
        })
        .collect();
    ranges.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then(a.0.cmp(&b.0)));
    ranges.into_iter().map(|(_, r)| r).collect()
}

/// Whether every copy of `replicas` is in `zone`.
pub fn in_zone(replicas: &[u64], zone: &str) -> bool {
    replicas.iter().all(|n| ZONES[(*n - 1) as usize] == zone)
}

/// The placement policy `zoned` as `rule`, through every broker.
pub async fn put_zones(brokers: &[&BrokerHandle], rule: &str) {
    let addrs = brokers.iter().map(|b| b.client_addr());
    put_placement(addrs, "zoned", &[rule.to_owned()]).await;
}

/// Brings `topic` to two ranges whose active segments have different
/// primaries, lower in zone a and upper in zone b; returns the records
/// acknowledged on the way.
pub async fn two_primaries(
    brokers: &[&BrokerHandle],
    client: &mut TestClient,
    topic: &str,
) -> Vec<Record> {
    put_zones(brokers, "zone in (a)").await;
    assert!(
        eventually(30_000, async || client
            .call(&CreateTopicRequest {
                name: topic.into(),
                replication_factor: Some(2),
                policy: Some("zoned".into()),
            })
            .await
            .is_ok())
        .await
    );
    let (lower, upper) = (keys(false, 4), keys(true, 4));
    let mut produced = batch(&lower, 0, 6);
    produce_following(brokers, topic, &produced).await;
    let whole = active(client, topic).await[0].clone();
    assert!(
        eventually(30_000, async || {
            let mut at = TestClient::connect(addr_of(brokers, whole.1)).await;
            at.call(&SplitRangeRequest {
                topic: topic.into(),
                range_id: whole.0,
            })
            .await
            .is_ok()
        })
        .await,
        "the split through the primary never completed"
    );
    put_zones(brokers, "zone in (b)").await;
    for round in 10.. {
        assert!(round < 300, "the upper range never rolled into zone b");
        let records = batch(&upper, round, 10);
        produce_following(brokers, topic, &records).await;
        produced.extend(records);
        let ranges = active(client, topic).await;
        if ranges.len() == 2 && in_zone(&ranges[1].2, "b") {
            break;
        }
    }
    assert!(
        eventually(10_000, async || {
            let ranges = active(client, topic).await;
            ranges.len() == 2 && in_zone(&ranges[1].2, "b") && in_zone(&ranges[0].2, "a")
        })
        .await
    );
    produced
}
