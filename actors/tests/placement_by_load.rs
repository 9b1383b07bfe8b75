//! Placement by load (issue 38, ADR 0144): a topic's writes spread over
//! the brokers. New primaries go to the least loaded broker, a split's
//! children to two brokers, and the balancer moves primaries onto a broker
//! that joins and off one that is decommissioned, then stays put.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::redirects::*;
use common::*;
use malachi_actors::{Broker, BrokerConfig, BrokerHandle, MaintenanceSettings};
use malachi_wire::batch::Record;
use malachi_wire::messages::{ClusterMembersRequest, CreateTopicRequest, MergeRangeRequest};

/// Balancing decisions a second apart, so a test sees several.
const BALANCE_INTERVAL_MS: u64 = 1_000;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle], balance_ms: u64) -> BrokerConfig {
    BrokerConfig {
        maintenance: MaintenanceSettings {
            balance_interval_ms: balance_ms,
            ..MaintenanceSettings::default()
        },
        ..cluster_config(dir, node_id, seeds, &[1, 2, 3])
    }
}

async fn create(client: &mut TestClient, topic: &str) {
    assert!(
        eventually(30_000, async || client
            .call(&CreateTopicRequest {
                name: topic.into(),
                replication_factor: None,
                policy: None,
            })
            .await
            .is_ok())
        .await,
        "topic {topic} was never created"
    );
}

/// The primary of each active range of `topic`, by range id.
async fn primaries_of(client: &mut TestClient, topic: &str) -> BTreeMap<u64, u64> {
    let Ok(described) = describe(client, topic).await else {
        return BTreeMap::new();
    };
    described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| {
            let segment = r.segments.last()?;
            (segment.state == "active").then_some((r.id, *segment.replicas.first()?))
        })
        .collect()
}

/// Active primaries per broker over `topics` (brokers without any absent).
async fn per_broker(client: &mut TestClient, topics: &[String]) -> BTreeMap<u64, usize> {
    let mut counts = BTreeMap::new();
    for topic in topics {
        for primary in primaries_of(client, topic).await.into_values() {
            *counts.entry(primary).or_insert(0) += 1;
        }
    }
    counts
}

/// Whether `counts` covers `brokers` and its most and least differ by one
/// at most.
fn within_one(counts: &BTreeMap<u64, usize>, brokers: &[u64]) -> bool {
    let each: Vec<usize> = brokers
        .iter()
        .map(|b| counts.get(b).copied().unwrap_or(0))
        .collect();
    let most = each.iter().max().copied().unwrap_or(0);
    let least = each.iter().min().copied().unwrap_or(0);
    counts.keys().all(|b| brokers.contains(b)) && most - least <= 1
}

async fn shutdown(brokers: impl IntoIterator<Item = BrokerHandle>) {
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_topics_created_through_one_broker_spread_their_primaries_within_one() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds, 0)).await;
    let mut client = TestClient::connect(one.client_addr()).await;
    let topics: Vec<String> = (0..10).map(|i| format!("spread-{i}")).collect();
    for topic in &topics {
        create(&mut client, topic).await;
    }
    let counts = per_broker(&mut client, &topics).await;
    assert_eq!(counts.values().sum::<usize>(), 10, "{counts:?}");
    assert!(
        within_one(&counts, &[1, 2, 3]),
        "ten topics through broker 1 put their primaries on every broker within one: {counts:?}"
    );
    // Each is written where it is placed: a produce through broker 1
    // follows the redirect and is acknowledged.
    let brokers = [&one, &two, &three];
    for topic in &topics {
        produce_following(&brokers, topic, &keyed_batch(topic, 4, 2)).await;
    }
    drop(client);
    shutdown([one, two, three]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_splits_children_are_written_by_two_brokers_and_every_record_reads_back() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds, 0)).await;
    let brokers = [&one, &two, &three];
    let topic = "halves";
    let mut client = TestClient::connect(one.client_addr()).await;
    create(&mut client, topic).await;
    let (lower, upper) = (keys(false, 6), keys(true, 6));
    let mut produced: Vec<Record> = Vec::new();
    for round in 0..3 {
        for records in [batch(&lower, round, 6), batch(&upper, round, 6)] {
            produce_following(&brokers, topic, &records).await;
            produced.extend(records);
        }
    }
    let (&whole, &primary) = primaries_of(&mut client, topic)
        .await
        .iter()
        .next()
        .unwrap();
    // The split through a broker that does not write the range: it is
    // redirected there (ADR 0141) and completes.
    let elsewhere = brokers.iter().find(|b| b.node_id() != primary).unwrap();
    let admin = malachi_wire::client::Client::connect([elsewhere.client_addr().to_string()])
        .await
        .unwrap();
    let split = admin.split_range(topic, whole).await.unwrap();
    assert_eq!(split.children.len(), 2);
    let children = primaries_of(&mut client, topic).await;
    assert_eq!(children.len(), 2, "{children:?}");
    let writers: std::collections::BTreeSet<u64> = children.values().copied().collect();
    assert_eq!(
        writers.len(),
        2,
        "the children of a split are written by two brokers: {children:?}"
    );
    assert!(writers.contains(&primary), "one child stays: {children:?}");
    for round in 3..6 {
        for records in [batch(&lower, round, 6), batch(&upper, round, 6)] {
            produce_following(&brokers, topic, &records).await;
            produced.extend(records);
        }
    }
    // The children merge back though two brokers write them: asked of the
    // lower child's writer, that half moves to the upper child's writer,
    // which gathers both, and the client is sent there (ADR 0144 §6).
    let gatherer = children[&split.children[1]];
    assert_ne!(gatherer, primary);
    let mut asked = TestClient::connect(addr_of(&brokers, primary)).await;
    let merge = MergeRangeRequest {
        topic: topic.into(),
        range_id: split.children[0],
    };
    assert!(
        eventually(30_000, async || match asked.call(&merge).await {
            Err(refused) => served_by(&refused) == Some(gatherer),
            Ok(merged) => panic!("merged where neither half was gathered: {merged:?}"),
        })
        .await,
        "the lower half never moved to broker {gatherer}"
    );
    // The merge then runs through any broker, on the gatherer, and its
    // successor is placed by load like a new range: not on the gatherer,
    // which writes both halves while the others write nothing.
    let merged = admin.merge_range(topic, split.children[0]).await.unwrap();
    assert_eq!(merged.parents.len(), 2);
    let successor = primaries_of(&mut client, topic).await;
    assert_eq!(successor.len(), 1, "{successor:?}");
    assert_ne!(
        successor[&merged.range_id], gatherer,
        "a merged successor is placed by load, not left on the broker that gathered the halves"
    );
    for records in [batch(&lower, 9, 6), batch(&upper, 9, 6)] {
        produce_following(&brokers, topic, &records).await;
        produced.extend(records);
    }
    for broker in brokers {
        let mut reader = reader_at(&brokers, broker, topic).await;
        let read = read_from_start(&mut reader, topic, 7).await.unwrap();
        assert_eq!(read.len(), produced.len(), "through {}", broker.node_id());
        assert_eq!(by_key(&read), by_key(&produced));
    }
    drop((client, admin));
    shutdown([one, two, three]).await;
}

/// Waits until `counts` over `topics` satisfies `done`, returning it.
async fn wait_counts(
    client: &mut TestClient,
    topics: &[String],
    what: &str,
    done: impl Fn(&BTreeMap<u64, usize>) -> bool,
) -> BTreeMap<u64, usize> {
    wait_until(
        what,
        Duration::from_secs(120),
        Duration::from_millis(250),
        async || {
            let counts = per_broker(client, topics).await;
            if done(&counts) {
                Ok(counts)
            } else {
                Err(counts)
            }
        },
    )
    .await
}

/// Every topic's primaries, to compare over time.
async fn placement(client: &mut TestClient, topics: &[String]) -> Vec<BTreeMap<u64, u64>> {
    let mut all = Vec::new();
    for topic in topics {
        all.push(primaries_of(client, topic).await);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primaries_move_onto_a_joining_broker_and_off_a_decommissioned_one_then_stay() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds, BALANCE_INTERVAL_MS))
            .await;
    let mut client = TestClient::connect(one.client_addr()).await;
    let topics: Vec<String> = (0..9).map(|i| format!("balanced-{i}")).collect();
    for topic in &topics {
        create(&mut client, topic).await;
    }
    let before = wait_counts(
        &mut client,
        &topics,
        "three brokers share nine primaries",
        |c| within_one(c, &[1, 2, 3]) && c.values().sum::<usize>() == 9,
    )
    .await;
    assert_eq!(before.values().copied().collect::<Vec<_>>(), vec![3, 3, 3]);

    // Broker 4 joins; the balancer moves primaries onto it.
    // A joining broker is given seeds and no node list.
    let mut joining = config(root.path(), 4, &[&two], BALANCE_INTERVAL_MS);
    joining.cluster.nodes = Vec::new();
    let four = Broker::start(joining).await.unwrap();
    assert!(four.wait_ready(60_000).await, "broker 4 never ready");
    let joined = wait_counts(
        &mut client,
        &topics,
        "broker 4 takes its share of primaries",
        |c| within_one(c, &[1, 2, 3, 4]) && c.values().sum::<usize>() == 9,
    )
    .await;
    assert!(joined.get(&4).is_some_and(|n| *n >= 2), "{joined:?}");
    let moves: u64 = [&one, &two, &three]
        .iter()
        .map(|b| counter(b, "malachi_balancer_moves_total"))
        .sum();
    assert!(moves >= 2, "the moves are counted: {moves}");
    // Broker 4 gossips what it writes, and its gauge says the same.
    let shown = joined.get(&4).copied().unwrap_or(0) as u64;
    assert!(
        eventually(10_000, async || counter(&four, "malachi_primaries")
            == shown)
        .await,
        "broker 4's malachi_primaries gauge shows its {shown} primaries"
    );

    // No flapping: the placement stays as it is for many intervals, with
    // writes going on. Seeing that nothing happens takes time: the pauses
    // below are what is observed, not a wait for something.
    let settled = placement(&mut client, &topics).await;
    let brokers = [&one, &two, &three, &four];
    for round in 0..20 {
        for topic in &topics {
            produce_following(
                &brokers,
                topic,
                &keyed_batch(&format!("{topic}-{round}"), 2, 2),
            )
            .await;
        }
        // pacing, not synchronisation: load across several balance passes.
        tokio::time::sleep(Duration::from_millis(BALANCE_INTERVAL_MS / 2)).await;
    }
    assert_eq!(
        placement(&mut client, &topics).await,
        settled,
        "a balanced cluster moves no primary"
    );

    // Broker 4 is decommissioned: its primaries move off it.
    assert!(
        eventually(30_000, async || client
            .call(&ClusterMembersRequest {
                decommission: Some(4),
                admit: None,
            })
            .await
            .is_ok())
        .await
    );
    wait_counts(
        &mut client,
        &topics,
        "broker 4's primaries move off it",
        |c| within_one(c, &[1, 2, 3]) && c.values().sum::<usize>() == 9,
    )
    .await;
    for topic in &topics {
        let mut reader = reader_at(&brokers, &one, topic).await;
        let read = read_from_start(&mut reader, topic, 7).await.unwrap();
        assert_eq!(
            read.len(),
            40,
            "{topic}: every acknowledged record reads back"
        );
    }
    drop(client);
    shutdown([one, two, three, four]).await;
}
