//! Splits and merges through any broker (issue 38, ADR 0141): four
//! brokers in two zones, a topic of two copies split in two, whose policy
//! first keeps its copies in zone `a`, then in zone `b`. Only the upper
//! range is written enough to roll, so its active segment moves to zone
//! `b`: the topic's ranges have different primaries. Before the fix, a
//! split of the upper range asked of the lower range's primary passed the
//! topic-level check (that broker writes a range of the topic), found no
//! writer of the upper range there to freeze, and answered `busy` until
//! the client's deadline. Now it answers `not_leader` naming the upper
//! range's primary, the client follows, and the split completes; the
//! split's children merge back through the same broker, and so do the
//! buddies whose halves brokers in two zones write (one half moves to the
//! other's primary first, ADR 0144). Every acknowledged record reads back
//! once, in key order, through every broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::redirects::*;
use common::zones::*;
use common::*;
use malachi_actors::BrokerHandle;

use malachi_wire::batch::Record;
use malachi_wire::client::{Client, ClientConfig};

const TOPIC: &str = "reshaped";
/// The client's deadline for one split or merge.
const RESHAPE_DEADLINE_MS: u64 = 20_000;

/// Reads the topic from its start through every broker: every record
/// produced, once, each key's in the order produced.
async fn read_back_everywhere(brokers: &[&BrokerHandle], produced: &[Record]) {
    for broker in brokers {
        let mut reader = reader_at(brokers, broker, TOPIC).await;
        let read = read_from_start(&mut reader, TOPIC, 7)
            .await
            .unwrap_or_else(|e| panic!("the read through {} failed: {e:?}", broker.node_id()));
        assert_eq!(
            read.len(),
            produced.len(),
            "the read through broker {} ended short or doubled",
            broker.node_id()
        );
        assert_eq!(by_key(&read), by_key(produced));
    }
}

/// The real client, bootstrapped from `broker` only, as the CLI's default
/// flags are: whatever it does, it does by following the brokers' hints.
async fn client_at(broker: &BrokerHandle) -> Client {
    let config = ClientConfig {
        request_timeout_ms: RESHAPE_DEADLINE_MS,
        ..ClientConfig::default()
    };
    Client::connect_with([broker.client_addr().to_string()], config)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_or_merge_through_a_broker_that_does_not_write_the_range_completes() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let [one, two, three, four] =
        start_seeded(|node_id, seeds| zoned_config(root.path(), node_id, seeds)).await;
    let brokers = [&one, &two, &three, &four];
    let mut client = TestClient::connect(one.client_addr()).await;
    let mut produced = two_primaries(&brokers, &mut client, TOPIC).await;
    let ranges = active(&mut client, TOPIC).await;
    let (lower, upper) = (ranges[0].clone(), ranges[1].clone());
    assert_ne!(lower.1, upper.1, "different primaries: {ranges:?}");
    let elsewhere = brokers[(lower.1 - 1) as usize];
    let admin = client_at(elsewhere).await;

    // The upper range's split, asked of the lower range's primary.
    let split = admin
        .split_range(TOPIC, upper.0)
        .await
        .unwrap_or_else(|e| panic!("the split through broker {} failed: {e}", lower.1));
    assert_eq!(split.range_id, upper.0);
    assert_eq!(split.children.len(), 2);
    let upper_keys = keys(true, 8);
    for round in 400..403 {
        let records = batch(&upper_keys, round, 8);
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
    }
    read_back_everywhere(&brokers, &produced).await;

    // The children merge back through the same broker that writes
    // neither; whichever brokers write them, one half moves to the other's
    // primary first (ADR 0144).
    let merged = admin
        .merge_range(TOPIC, split.children[0])
        .await
        .unwrap_or_else(|e| panic!("the merge through broker {} failed: {e}", lower.1));
    let mut parents = merged.parents.clone();
    parents.sort_unstable();
    let mut children = split.children.clone();
    children.sort_unstable();
    assert_eq!(parents, children);
    let records = batch(&upper_keys, 500, 8);
    produce_following(&brokers, TOPIC, &records).await;
    produced.extend(records);
    read_back_everywhere(&brokers, &produced).await;

    // The buddies, written by brokers in two zones, merge too: asked of
    // the lower half's primary, it moves its half to the upper's (in zone
    // b, which the policy now names) and the client follows the redirect.
    let ranges = active(&mut client, TOPIC).await;
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_ne!(ranges[0].1, ranges[1].1, "{ranges:?}");
    let whole = admin
        .merge_range(TOPIC, ranges[0].0)
        .await
        .unwrap_or_else(|e| panic!("the merge across primaries failed: {e}"));
    assert_eq!(whole.parents.len(), 2);
    for records in [batch(&keys(false, 4), 600, 8), batch(&upper_keys, 600, 8)] {
        produce_following(&brokers, TOPIC, &records).await;
        produced.extend(records);
    }
    read_back_everywhere(&brokers, &produced).await;

    drop((client, admin));
    for broker in [one, two, three, four] {
        broker.shutdown().await.unwrap();
    }
}
