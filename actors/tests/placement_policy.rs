//! Placement constraints of storage policies (issue 21, ADR 0116): four
//! brokers in three zones. A topic whose policy asks for three distinct
//! zones gets one copy per zone on every segment, rolls included; a hard
//! constraint no set can meet refuses the topic, naming it; a soft one is
//! relaxed; a constraint that does not parse is refused at `put_policy`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_wire::ErrorCode;
use malachi_wire::messages::{
    CreateTopicRequest, PolicyDescription, PutPolicyRequest, VnodeListRequest,
};

const ZONES: [&str; 4] = ["a", "a", "b", "c"];

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        attributes: BTreeMap::from([("zone".to_owned(), ZONES[(node_id - 1) as usize].to_owned())]),
        cluster: ClusterSettings {
            nodes: vec![1, 2, 3, 4],
            ..ClusterSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

async fn put(client: &mut TestClient, name: &str, placement: &[&str]) -> Result<(), Refused> {
    client
        .call(&PutPolicyRequest {
            policy: PolicyDescription {
                name: name.into(),
                placement: placement.iter().map(|s| (*s).to_owned()).collect(),
                ..PolicyDescription::default()
            },
        })
        .await
        .map(|_| ())
}

async fn create(client: &mut TestClient, topic: &str, policy: &str) -> Result<(), Refused> {
    client
        .call(&CreateTopicRequest {
            name: topic.into(),
            replication_factor: Some(3),
            policy: Some(policy.into()),
        })
        .await
        .map(|_| ())
}

fn zones_of(replicas: &[u64]) -> BTreeSet<&'static str> {
    replicas.iter().map(|n| ZONES[(*n - 1) as usize]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policys_placement_constraints_choose_every_segments_copies() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let brokers: [BrokerHandle; 4] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let mut client = TestClient::connect(brokers[0].client_addr()).await;
    // Every broker gossips its zone before placement can use it.
    assert!(
        eventually(30_000, async || put(
            &mut client,
            "spread",
            &["distinct(zone) >= 3"]
        )
        .await
        .is_ok())
        .await
    );
    // The zones come from membership: wait until a topic is placed over
    // three zones, then every later segment must be too.
    for t in 0..6 {
        let topic = format!("spread-{t}");
        assert!(
            eventually(30_000, async || create(&mut client, &topic, "spread")
                .await
                .is_ok())
            .await,
            "{topic} was never created"
        );
        let replicas = segments(&mut client, &topic).await.unwrap()[0]
            .replicas
            .clone();
        assert_eq!(
            zones_of(&replicas).len(),
            3,
            "{topic} placed on {replicas:?}"
        );
    }
    // Rolls and splits place by the policy too.
    let range = active_ranges(&mut client, "spread-0").await[0];
    let mut to_primary = None;
    for b in &brokers {
        let mut c = TestClient::connect(b.client_addr()).await;
        if c.call(&malachi_wire::messages::SplitRangeRequest {
            topic: "spread-0".into(),
            range_id: range,
        })
        .await
        .is_ok()
        {
            to_primary = Some(c);
            break;
        }
    }
    let mut to_primary = to_primary.expect("no broker split the range");
    for segment in segments(&mut to_primary, "spread-0").await.unwrap() {
        assert_eq!(zones_of(&segment.replicas).len(), 3, "{segment:?}");
    }

    // A hard constraint no set of three meets refuses the topic, naming it.
    put(&mut client, "impossible", &["distinct(zone) >= 4"])
        .await
        .unwrap();
    let refused = create(&mut client, "nowhere", "impossible")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code,
        ErrorCode::InvalidRequest,
        "{}",
        refused.message
    );
    assert!(
        refused.message.contains("distinct(zone) >= 4"),
        "{}",
        refused.message
    );
    // The same as a preference is relaxed: the topic gets three zones.
    put(&mut client, "hopeful", &["soft: distinct(zone) >= 4"])
        .await
        .unwrap();
    create(&mut client, "somewhere", "hopeful").await.unwrap();
    let replicas = segments(&mut client, "somewhere").await.unwrap()[0]
        .replicas
        .clone();
    assert_eq!(replicas.len(), 3);
    assert_eq!(zones_of(&replicas).len(), 3);
    // A filter keeps copies in the zones it names.
    put(&mut client, "only-a-b", &["zone in (a, b)"])
        .await
        .unwrap();
    create(&mut client, "west", "only-a-b").await.unwrap();
    let replicas = segments(&mut client, "west").await.unwrap()[0]
        .replicas
        .clone();
    let mut nodes = replicas.clone();
    nodes.sort_unstable();
    assert_eq!(nodes, vec![1, 2, 3]);
    // A constraint that does not parse never reaches the metadata.
    let bad = put(&mut client, "garbled", &["spread(zone)"])
        .await
        .unwrap_err();
    assert_eq!(bad.code, ErrorCode::InvalidRequest);
    assert!(bad.message.contains("spread(zone)"), "{}", bad.message);
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}

/// ADR 0121: the `vnodes` policy places the metadata plane's replicas
/// too. Each broker commits its zone to the ring; once the policy asks
/// for three zones, every vnode's group spans them, as `vnode_list`
/// reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_vnodes_policy_spreads_every_vnodes_replicas_over_the_zones() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let brokers: [BrokerHandle; 4] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let mut client = TestClient::connect(brokers[0].client_addr()).await;
    let spans = async |client: &mut TestClient| -> Option<Vec<(u32, Vec<u64>)>> {
        let list = client.call(&VnodeListRequest {}).await.ok()?;
        Some(
            list.vnodes
                .into_iter()
                .map(|v| (v.id, v.replicas))
                .collect(),
        )
    };
    let before = spans(&mut client).await.unwrap();
    assert!(
        before.iter().any(|(_, r)| zones_of(r).len() < 3),
        "rendezvous hashing already spans three zones everywhere: {before:?}"
    );
    assert!(
        eventually(30_000, async || put(
            &mut client,
            "vnodes",
            &["distinct(zone) >= 3"]
        )
        .await
        .is_ok())
        .await
    );
    let mut last = Vec::new();
    let placed = eventually(90_000, async || match spans(&mut client).await {
        Some(list) => {
            let done = list
                .iter()
                .all(|(_, r)| r.len() == 3 && zones_of(r).len() == 3);
            last = list;
            done
        }
        None => false,
    })
    .await;
    assert!(placed, "vnodes not spread over three zones: {last:?}");
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}
