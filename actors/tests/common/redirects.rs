//! Producing and reading a topic whose ranges different brokers write:
//! keys of one half of the keyspace, and a client that follows the
//! `not_leader` redirects a broker answers with, as the real client does.
//! Shared by `active_elsewhere` and `reshape_elsewhere`.
#![allow(dead_code)]

use std::time::Duration;

use malachi_actors::BrokerHandle;
use malachi_core::model::position;
use malachi_testkit::inproc::{Refused, TestClient, addr_of, record};
use malachi_testkit::wait::wait_until;
use malachi_wire::batch::Record;

/// Keys of the lower (`upper == false`) or upper half of the keyspace.
pub fn keys(upper: bool, n: usize) -> Vec<String> {
    (0u64..)
        .map(|i| format!("key-{i}"))
        .filter(|k| (position(k.as_bytes()) >= 1 << 63) == upper)
        .take(n)
        .collect()
}

/// `n` records over `keys` in turn, their values naming the round.
pub fn batch(keys: &[String], round: usize, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| record(&keys[i % keys.len()], &format!("{round}-{i}")))
        .collect()
}

/// The broker a `not_leader` refusal sends the client to, as its message
/// names it ("topic t is served by broker 2, not broker 1"); the client
/// follows the hint with that broker's address.
pub fn served_by(refused: &Refused) -> Option<u64> {
    let rest = ["is served by broker ", "is written by broker "]
        .iter()
        .find_map(|said| refused.message.split(said).nth(1))?;
    rest.split(',').next()?.trim().parse().ok()
}

/// Produces `records` through any broker, one record at a time, following
/// redirects and retrying refusals (a roll in progress, a primary moving).
///
/// One record a request, because a request is judged range by range: a
/// batch spanning two ranges that two brokers write (a split's children,
/// ADR 0144) is acknowledged in part by either, and resending it whole
/// wrote the acknowledged part again, for ever (the "rolling livelock" of
/// ADR 0144's free-space finding was this helper, not the broker). A
/// refused one-record produce wrote nothing; sent in order, each key's
/// records stay in order.
pub async fn produce_following(brokers: &[&BrokerHandle], topic: &str, records: &[Record]) {
    for record in records {
        produce_one_following(brokers, topic, std::slice::from_ref(record)).await;
    }
}

async fn produce_one_following(brokers: &[&BrokerHandle], topic: &str, records: &[Record]) {
    let mut attempt = 0;
    let poll = Duration::from_millis(50);
    wait_until(
        "a produce is acknowledged",
        Duration::from_secs(40),
        poll,
        async || {
            let mut node = brokers[attempt % brokers.len()].node_id();
            attempt += 1;
            let mut last = None;
            for _ in 0..3 {
                let mut writer = TestClient::connect(addr_of(brokers, node)).await;
                match writer.produce(topic, records).await {
                    Ok(_) => return Ok(()),
                    Err(refused) => {
                        let next = served_by(&refused);
                        last = Some(refused);
                        match next {
                            Some(next) => node = next,
                            None => break,
                        }
                    }
                }
            }
            Err(last)
        },
    )
    .await;
}

/// Follows `not_leader` redirects from `broker` to whoever serves the
/// topic's reads, as the client does.
pub async fn reader_at(
    brokers: &[&BrokerHandle],
    broker: &BrokerHandle,
    topic: &str,
) -> TestClient {
    let poll = Duration::from_millis(100);
    wait_until(
        "a broker serves the topic's reads",
        Duration::from_secs(10),
        poll,
        async || {
            let mut node = broker.node_id();
            let mut last = None;
            // A redirect is followed at once, a few hops at most.
            for _ in 0..3 {
                let mut client = TestClient::connect(addr_of(brokers, node)).await;
                match client.fetch(topic, None, true, 1, 0).await {
                    Ok(_) => return Ok(client),
                    Err(refused) => {
                        let next = served_by(&refused);
                        last = Some(refused);
                        match next {
                            Some(next) => node = next,
                            None => break,
                        }
                    }
                }
            }
            Err(last)
        },
    )
    .await
}
