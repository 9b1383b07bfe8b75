//! `topic describe` shows every range's write rate whichever broker
//! answers (issue 38, ADR 0143): the answering broker asks each range's
//! primary. On three brokers, a topic split into two ranges written by
//! two brokers:
//!
//! - a live describe through each of the three brokers shows a nonzero
//!   rate for both ranges, each from the broker that writes it;
//! - with one primary stopped, a live describe through each other broker
//!   answers within its deadline, and the stopped primary's range has no
//!   rate (absent, not 0).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::redirects::*;
use common::topics::create_replicated;
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, MaintenanceSettings};
use malachi_wire::messages::{DescribeTopicRequest, TopicDescription};

const TOPIC: &str = "rated";
/// How long a live describe may take with a primary gone: its asks are
/// bounded (1.5 s for the live figures, 1 s for the rates, at once), and
/// this leaves room for a slow, shared machine.
const DESCRIBE_DEADLINE: Duration = Duration::from_secs(5);

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        // No balancer: the primaries stay where the split put them.
        maintenance: MaintenanceSettings {
            balance_interval_ms: 0,
            ..MaintenanceSettings::default()
        },
        ..cluster_config(dir, node_id, seeds, &[1, 2, 3])
    }
}

/// A live describe (as `malachi topic describe` asks) through `broker`,
/// refused or answered within [`DESCRIBE_DEADLINE`].
async fn describe_live(broker: &BrokerHandle) -> Option<TopicDescription> {
    let started = Instant::now();
    let asked = async {
        let mut client = TestClient::connect(broker.client_addr()).await;
        client
            .call(&DescribeTopicRequest {
                name: TOPIC.into(),
                live: true,
            })
            .await
    };
    let answer = tokio::time::timeout(DESCRIBE_DEADLINE, asked)
        .await
        .unwrap_or_else(|_| panic!("a describe through {} hung", broker.node_id()));
    assert!(
        started.elapsed() <= DESCRIBE_DEADLINE,
        "a describe through {} took {:?}",
        broker.node_id(),
        started.elapsed()
    );
    answer.ok().map(|d| d.topic)
}

/// Each active range's primary, by range id.
fn primaries_of(described: &TopicDescription) -> BTreeMap<u64, u64> {
    described
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| Some((r.id, *r.segments.last()?.replicas.first()?)))
        .collect()
}

/// Each range's shown rate (bytes per second) and the broker it names.
fn rates_of(described: &TopicDescription) -> BTreeMap<u64, (u64, u64)> {
    described
        .reshaping
        .iter()
        .flat_map(|r| &r.rates)
        .map(|r| (r.range, (r.write_bytes_per_second, r.primary)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn describe_through_any_broker_shows_every_ranges_rate_and_answers_with_a_primary_gone() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three];
    let mut client = TestClient::connect(one.client_addr()).await;
    create_replicated(&mut client, TOPIC).await;
    let (lower, upper) = (keys(false, 6), keys(true, 6));
    produce_following(&brokers, TOPIC, &batch(&lower, 0, 6)).await;
    let whole = *active_ranges(&mut client, TOPIC).await.first().unwrap();
    let admin = malachi_wire::client::Client::connect([one.client_addr().to_string()])
        .await
        .unwrap();
    admin.split_range(TOPIC, whole).await.unwrap();
    let layout = primaries_of(&describe(&mut client, TOPIC).await.unwrap());
    assert_eq!(layout.len(), 2, "{layout:?}");
    let writers: std::collections::BTreeSet<u64> = layout.values().copied().collect();
    assert_eq!(writers.len(), 2, "two brokers write the halves: {layout:?}");

    // Both halves written, each by its own primary: a live describe
    // through every broker shows both rates, each from its writer.
    let mut round = 1;
    for broker in brokers {
        wait_until(
            "a live describe shows every range's rate",
            Duration::from_secs(60),
            Duration::from_millis(50),
            async || {
                for keys in [&lower, &upper] {
                    produce_following(&brokers, TOPIC, &batch(keys, round, 6)).await;
                }
                round += 1;
                let Some(described) = describe_live(broker).await else {
                    return Err(format!("through {}: refused", broker.node_id()));
                };
                let rates = rates_of(&described);
                let every = primaries_of(&described).iter().all(|(range, primary)| {
                    rates
                        .get(range)
                        .is_some_and(|&(bytes, by)| bytes > 0 && by == *primary)
                });
                if every {
                    Ok(())
                } else {
                    Err(format!("through {}: {rates:?}", broker.node_id()))
                }
            },
        )
        .await;
    }

    // The upper half's primary stops: a live describe through either other
    // broker answers in time, and shows no rate for the range it wrote.
    let upper_range = *layout.keys().last().unwrap();
    let gone = layout[&upper_range];
    let mut rest = vec![one, two, three];
    let at = rest.iter().position(|b| b.node_id() == gone).unwrap();
    rest.remove(at).shutdown().await.unwrap();
    for broker in &rest {
        // The metadata plane first (a vnode leader on the stopped broker is
        // replaced by an election, which is not what is timed here).
        let mut client = TestClient::connect(broker.client_addr()).await;
        assert!(
            eventually(60_000, async || describe(&mut client, TOPIC).await.is_ok()).await,
            "the metadata answers through {} again",
            broker.node_id()
        );
        let described = wait_until(
            "a live describe answers with a primary gone",
            Duration::from_secs(60),
            Duration::from_millis(100),
            async || describe_live(broker).await.ok_or("refused"),
        )
        .await;
        let rates = rates_of(&described);
        for (range, primary) in primaries_of(&described) {
            if primary == gone {
                assert!(
                    !rates.contains_key(&range),
                    "through {}: range {range} of the stopped broker shows {rates:?}",
                    broker.node_id()
                );
            }
        }
    }
    drop((client, admin));
    for broker in rest {
        broker.shutdown().await.unwrap();
    }
}
