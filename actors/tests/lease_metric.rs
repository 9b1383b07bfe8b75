//! `malachi_coordinator_lease_held{vnode}`: what lets an outside observer
//! (the chaos harness, `chaos/run`'s lease watch) check that the
//! coordinator leases hold. Three brokers, one topic at RF=3: each vnode's
//! lease shows held on exactly one broker, read at the scrape; once that
//! broker stops, another takes it over and the gauge follows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::messages::CreateTopicRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle]) -> BrokerConfig {
    cluster_config(dir, node_id, seeds, &[1, 2, 3])
}

async fn metrics(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// The vnodes whose lease the scraped text says is held.
fn held(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("malachi_coordinator_lease_held{vnode=\""))
        .filter_map(|rest| rest.split_once("\"} "))
        .filter(|(_, value)| value.trim() == "1")
        .map(|(vnode, _)| vnode.to_owned())
        .collect()
}

/// vnode -> the brokers whose scrape says they hold its lease.
async fn holders(brokers: &[&BrokerHandle]) -> BTreeMap<String, Vec<u64>> {
    let mut out = BTreeMap::<String, Vec<u64>>::new();
    for b in brokers {
        for vnode in held(&metrics(b.admin_addr()).await) {
            out.entry(vnode).or_default().push(b.node_id());
        }
    }
    out
}

#[test]
fn the_scraped_gauge_reads_only_lease_lines_set_to_one() {
    let text = "malachi_coordinator_lease_held{vnode=\"3\"} 1\n\
                malachi_coordinator_lease_held{vnode=\"4\"} 0\n\
                malachi_copies{health=\"intact\"} 1\n";
    assert_eq!(held(text), BTreeSet::from(["3".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_vnode_lease_shows_held_on_one_broker_and_moves_when_it_stops() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let [b1, b2, b3] = start_seeded::<3>(|id, seeds| config(dir.path(), id, seeds)).await;
    let mut client = TestClient::connect(b1.client_addr()).await;
    client
        .call(&CreateTopicRequest {
            name: "leases".into(),
            replication_factor: Some(3),
            policy: None,
        })
        .await
        .unwrap();

    // Some vnode's lease shows held, and never on two brokers at once.
    let all = [&b1, &b2, &b3];
    let mut seen = BTreeMap::new();
    assert!(
        eventually(30_000, async || {
            seen = holders(&all).await;
            !seen.is_empty()
        })
        .await,
        "no broker shows a lease held"
    );
    for _ in 0..10 {
        let now = holders(&all).await;
        for (vnode, brokers) in &now {
            assert_eq!(
                brokers.len(),
                1,
                "vnode {vnode}'s lease held by {brokers:?}"
            );
        }
        seen = now;
        // Sampling an invariant over two seconds, not waiting on a change.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // The broker holding a lease stops: another broker takes it over.
    let (vnode, brokers) = seen.iter().next().map(|(v, b)| (v.clone(), b[0])).unwrap();
    let (stopping, rest): (Vec<BrokerHandle>, Vec<BrokerHandle>) = [b1, b2, b3]
        .into_iter()
        .partition(|b| b.node_id() == brokers);
    for b in stopping {
        b.shutdown().await.unwrap();
    }
    let rest: Vec<&BrokerHandle> = rest.iter().collect();
    let mut last = BTreeMap::new();
    assert!(
        eventually(60_000, async || {
            last = holders(&rest).await;
            last.get(&vnode).is_some_and(|b| b.len() == 1)
        })
        .await,
        "vnode {vnode}'s lease never moved off broker {brokers}: {last:?}"
    );
    for brokers in holders(&rest).await.values() {
        assert_eq!(brokers.len(), 1, "a lease held twice: {brokers:?}");
    }
}
