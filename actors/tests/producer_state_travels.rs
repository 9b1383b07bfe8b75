//! Idempotent-producer state follows a range onto brokers that never held
//! its earlier segments (issue 36, ADR 0124): six brokers in two zones of
//! three, RF=3, a topic whose policy keeps its copies first in zone `a`,
//! then in zone `b`, then in zone `a` again (soft constraints, so a
//! failover with one zone-`b` broker gone still places three copies).
//!
//! - **Roll**: producers write while the topic is in zone `a`; plain
//!   records then roll the range until its active segment is all in zone
//!   `b`, whose primary holds no copy of any earlier segment.
//! - **Failover**: that primary stops; the successor's primary is another
//!   zone-`b` broker (a complete copy of the failed segment) or, when the
//!   stopping broker's writer rolled first, a zone-`a` one: producers last
//!   seen in either zone are checked.
//! - **Split**: back in zone `a`, the range splits: its children's
//!   primaries hold no copy of the zone-`b` segments.
//!
//! Each time, a producer whose last batch is in a segment the new primary
//! holds no copy of retries it (it must be a duplicate, never stored
//! again, nor refused `unknown_producer`) and sends its next sequence
//! (stored; `moved` on a split parent, where a child's stream takes it).
//! Every producer is used in one phase only, so each phase is judged on
//! its own, and every failure is reported together.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterSettings};
use malachi_wire::ErrorCode;
use malachi_wire::batch::Record;
use malachi_wire::messages::*;

const TOPIC: &str = "travels";
const ZONES: [&str; 6] = ["a", "a", "a", "b", "b", "b"];
const EPOCH: u64 = 2;
/// Small enough that a few produces roll the segment.
const SEGMENT_BYTES_MAX: u64 = 2048;

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    BrokerConfig {
        node_id,
        seeds: seeds.iter().map(|b| b.client_addr().to_string()).collect(),
        attributes: BTreeMap::from([("zone".to_owned(), ZONES[(node_id - 1) as usize].to_owned())]),
        cluster: ClusterSettings {
            nodes: (1..=6).collect(),
            coordinator_poll_ms: 200,
            ..ClusterSettings::default()
        },
        segment_bytes_max: SEGMENT_BYTES_MAX,
        ..BrokerConfig::for_tests(dir.join(format!("node-{node_id}")))
    }
}

async fn admin(brokers: &[Option<BrokerHandle>]) -> TestClient {
    TestClient::connect(brokers.iter().flatten().next().unwrap().client_addr()).await
}

/// The active segments of the topic.
async fn active(brokers: &[Option<BrokerHandle>]) -> Vec<SegmentDescription> {
    let mut client = admin(brokers).await;
    segments(&mut client, TOPIC)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.state == "active")
        .collect()
}

fn in_zone(replicas: &[u64], zone: &str) -> bool {
    replicas.iter().all(|n| ZONES[(*n - 1) as usize] == zone)
}

/// Producer `producer`'s batch `sequence`: two records of key `k`, their
/// values naming the batch.
fn batch(producer: u64, sequence: u64) -> Vec<Record> {
    (0..2)
        .map(|i| record("k", &format!("p{producer}-{sequence}-{i}")))
        .collect()
}

/// Sends producer `producer`'s batch `sequence` of stream `range` through
/// every live broker in turn, past retriable refusals (a redirect, a roll,
/// a producer table still being read), until one answers: whether it was
/// a duplicate, or the refusal.
async fn send(
    brokers: &[Option<BrokerHandle>],
    range: u64,
    producer: u64,
    sequence: u64,
) -> Result<bool, Refused> {
    let mut request = produce_request(TOPIC, &batch(producer, sequence));
    request.producer = Some(ProducerBatch {
        producer_id: producer,
        epoch: EPOCH,
        range,
        sequence,
    });
    let what = format!("producer {producer} sequence {sequence} is answered");
    wait_until(&what, Duration::from_secs(90), POLL, async || {
        let mut last = BTreeMap::new();
        for broker in brokers.iter().flatten() {
            let mut client = TestClient::connect(broker.client_addr()).await;
            match client.call(&request).await {
                Ok(answer) => {
                    assert_eq!(answer.records_acknowledged, 2, "{answer:?}");
                    return Ok(Ok(answer.ranges[0].duplicate));
                }
                // `moved` is an answer here: the batch's stream was split.
                Err(refused) if refused.code.retriable() && refused.code != ErrorCode::Moved => {
                    last.insert(broker.node_id(), refused);
                }
                Err(refused) => return Ok(Err(refused)),
            }
        }
        Err(last)
    })
    .await
}

/// How often the retries below look again.
const POLL: Duration = Duration::from_millis(50);

/// Plain records through every live broker in turn until one stores them.
async fn produce_plain(brokers: &[Option<BrokerHandle>], round: usize) {
    let records: Vec<Record> = (0..8)
        .map(|i| {
            record(
                &format!("plain{i}"),
                &format!("{round}-{i}-{}", "x".repeat(100)),
            )
        })
        .collect();
    wait_until(
        "plain records are stored",
        Duration::from_secs(20),
        POLL,
        async || {
            for broker in brokers.iter().flatten() {
                let mut client = TestClient::connect(broker.client_addr()).await;
                if client.produce(TOPIC, &records).await.is_ok() {
                    return true;
                }
            }
            false
        },
    )
    .await;
}

/// What a phase found wrong, all reported at the end.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    /// A batch that must be new: stored, not a duplicate.
    async fn stored(&mut self, brokers: &[Option<BrokerHandle>], phase: &str, at: (u64, u64, u64)) {
        let (range, producer, sequence) = at;
        match send(brokers, range, producer, sequence).await {
            Ok(false) => {}
            Ok(true) => self.0.push(format!(
                "{phase}: producer {producer}'s new sequence {sequence} was taken as a duplicate"
            )),
            Err(r) => self.0.push(format!(
                "{phase}: producer {producer}'s next sequence {sequence} was refused {:?}: {}",
                r.code, r.message
            )),
        }
    }

    /// A retry of a batch stored before: a duplicate, never stored again.
    async fn duplicate(
        &mut self,
        brokers: &[Option<BrokerHandle>],
        phase: &str,
        at: (u64, u64, u64),
    ) {
        let (range, producer, sequence) = at;
        match send(brokers, range, producer, sequence).await {
            Ok(true) => {}
            Ok(false) => self.0.push(format!(
                "{phase}: producer {producer}'s retry of sequence {sequence} was stored twice"
            )),
            Err(r) => self.0.push(format!(
                "{phase}: producer {producer}'s retry of sequence {sequence} was refused {:?}: {}",
                r.code, r.message
            )),
        }
    }

    /// A batch that must be refused with `code`.
    async fn refused(
        &mut self,
        brokers: &[Option<BrokerHandle>],
        phase: &str,
        at: (u64, u64, u64),
        code: ErrorCode,
    ) {
        let (range, producer, sequence) = at;
        match send(brokers, range, producer, sequence).await {
            Err(r) if r.code == code => {}
            other => self.0.push(format!(
                "{phase}: producer {producer}'s sequence {sequence} answered {:?}, not {code:?}",
                other.map_err(|r| (r.code, r.message))
            )),
        }
    }
}

/// A range's band as `[start, end)` in u128 (the top band ends at 2^64).
fn holds_key(range: &RangeDescription, key: &str) -> bool {
    let parse = |text: &str| u128::from_str_radix(text.strip_prefix("0x").unwrap(), 16).unwrap();
    let position = u128::from(malachi_core::model::position(key.as_bytes()));
    parse(&range.band_start) <= position && position < parse(&range.band_end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producer_state_follows_a_roll_a_failover_and_a_split_onto_brokers_without_a_copy() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let started: [BrokerHandle; 6] =
        start_seeded(|node_id, seeds| config(root.path(), node_id, seeds)).await;
    let mut brokers: Vec<Option<BrokerHandle>> = started.into_iter().map(Some).collect();
    put_zone(&brokers, "a").await;
    let mut client = admin(&brokers).await;
    // Every broker gossips its zone before placement can use it.
    assert!(
        eventually(30_000, async || client
            .call(&CreateTopicRequest {
                name: TOPIC.into(),
                replication_factor: Some(3),
                policy: Some("zoned".into()),
            })
            .await
            .is_ok())
        .await
    );
    let range = active_ranges(&mut client, TOPIC).await[0];
    let first = active(&brokers).await;
    assert!(in_zone(&first[0].replicas, "a"), "{first:?}");

    // Zone a: the roll's producers (1, 2) and two of the failover's (3,
    // 4): the failover's new primary holds no copy of these segments if
    // it is a zone-b broker, and none of zone b's if it is not.
    let mut findings = Findings::default();
    for (producer, last) in [(1, 3), (2, 0), (3, 2), (4, 0)] {
        for sequence in 0..=last {
            findings
                .stored(&brokers, "zone a", (range, producer, sequence))
                .await;
        }
    }
    assert!(findings.0.is_empty(), "{:?}", findings.0);

    // Roll: plain records roll the range into zone b.
    put_zone(&brokers, "b").await;
    let mut round = 0;
    while !in_zone(&active(&brokers).await[0].replicas, "b") {
        assert!(round < 200, "no segment was ever placed in zone b");
        produce_plain(&brokers, round).await;
        round += 1;
    }
    // The split's producer (5) and two more of the failover's (6, 7)
    // write in zone b.
    for (producer, last) in [(5, 2), (6, 2), (7, 0)] {
        for sequence in 0..=last {
            findings
                .stored(&brokers, "zone b", (range, producer, sequence))
                .await;
        }
    }
    findings.duplicate(&brokers, "roll", (range, 1, 3)).await;
    findings.stored(&brokers, "roll", (range, 1, 4)).await;
    findings.duplicate(&brokers, "roll", (range, 2, 0)).await;
    // Every seal so far was a live primary's roll: each left its final
    // table as a sidecar, so zone b read those, never a log (ADR 0156).
    let fetches = |from: &str| -> u64 {
        brokers
            .iter()
            .flatten()
            .map(|b| {
                counter(
                    b,
                    &format!("malachi_producer_state_fetches_total{{from=\"{from}\"}}"),
                )
            })
            .sum()
    };
    assert!(
        fetches("sealed_table") >= 1,
        "zone b never read a sealed table"
    );
    assert_eq!(fetches("log"), 0, "zone b read a predecessor's log");

    // Failover: the zone-b primary stops.
    let before = active(&brokers).await.remove(0);
    assert!(in_zone(&before.replicas, "b"), "{before:?}");
    let primary = before.replicas[0];
    brokers[(primary - 1) as usize]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    assert!(
        eventually(60_000, async || active(&brokers)
            .await
            .first()
            .is_some_and(|s| s.id != before.id))
        .await,
        "the segment never failed over"
    );
    findings
        .duplicate(&brokers, "failover", (range, 3, 2))
        .await;
    findings.stored(&brokers, "failover", (range, 3, 3)).await;
    findings
        .duplicate(&brokers, "failover", (range, 4, 0))
        .await;
    findings
        .duplicate(&brokers, "failover", (range, 6, 2))
        .await;
    findings.stored(&brokers, "failover", (range, 6, 3)).await;
    findings
        .duplicate(&brokers, "failover", (range, 7, 0))
        .await;

    // Split: back in zone a, whose brokers hold none of zone b's segments.
    put_zone(&brokers, "a").await;
    let mut client = admin(&brokers).await;
    let children = wait_until(
        "a broker splits the range",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            for broker in brokers.iter().flatten() {
                let mut c = TestClient::connect(broker.client_addr()).await;
                let split = SplitRangeRequest {
                    topic: TOPIC.into(),
                    range_id: range,
                };
                if let Ok(split) = c.call(&split).await {
                    return Some(split.children);
                }
            }
            None
        },
    )
    .await;
    let description = describe(&mut client, TOPIC).await.unwrap();
    let child = description
        .ranges
        .iter()
        .find(|r| children.contains(&r.id) && holds_key(r, "k"))
        .unwrap();
    let first_of_child = &child.segments[0];
    assert!(in_zone(&first_of_child.replicas, "a"), "{first_of_child:?}");
    findings.duplicate(&brokers, "split", (range, 5, 2)).await;
    findings
        .refused(&brokers, "split", (range, 5, 3), ErrorCode::Moved)
        .await;
    findings.stored(&brokers, "split", (child.id, 5, 0)).await;

    assert!(findings.0.is_empty(), "{:#?}", findings.0);
    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}

/// The soft zone policy, through every live broker.
async fn put_zone(brokers: &[Option<BrokerHandle>], zone: &str) {
    let addrs = brokers.iter().flatten().map(|b| b.client_addr());
    put_placement(addrs, "zoned", &[format!("soft: zone in ({zone})")]).await;
}
