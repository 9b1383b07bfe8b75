//! Supervision at work, seen through the command line: after a segment
//! actor fails and its supervisor restarts it, `malachi tree` shows the
//! restart count and the exit reason, in text and in JSON.
//!
//! The binary has no fault-injection hook (production builds must not), so
//! the broker runs in this test's process with `malachi-actors`' `testing`
//! feature, and the real `malachi` binary asks it for its tree.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::time::Duration;

use bytes::Bytes;
use common::{malachi, ok, out};
use malachi_actors::{Broker, BrokerConfig};
use malachi_testkit::wait::wait_until;
use malachi_wire::{Client, Record, RecordBatch};
use serde_json::Value;

fn find<'a>(node: &'a Value, name: &str) -> Option<&'a Value> {
    for child in node["children"].as_array()? {
        if child["name"].as_str().is_some_and(|n| n.starts_with(name)) {
            return Some(child);
        }
        if let Some(found) = child.get("supervisor").and_then(|s| find(s, name)) {
            return Some(found);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malachi_tree_shows_a_restarted_segment_actor_with_its_count_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(BrokerConfig::for_tests(dir.path()))
        .await
        .unwrap();
    let addr = broker.client_addr().to_string();
    let client = Client::connect([addr.clone()]).await.unwrap();
    client.create_topic("orders", None, None).await.unwrap();
    let record = Record::new(Bytes::from_static(b"k"), Bytes::from_static(b"v"));
    client
        .produce(
            "orders",
            RecordBatch::from_records([&record], 1 << 20).unwrap(),
        )
        .await
        .unwrap();

    let tree_json = |addr: String| async move {
        tokio::task::spawn_blocking(move || {
            let output = ok(malachi(&addr, &["tree", "--json"], ""));
            serde_json::from_str::<Value>(out(&output).trim()).unwrap()
        })
        .await
        .unwrap()
    };
    let before = tree_json(addr.clone()).await;
    let segment = find(&before["root"], "segment/orders/").expect("a segment actor");
    assert_eq!(segment["restarts"], 0);
    let name = segment["name"].as_str().unwrap().to_owned();

    broker.poison_segment(&name).await.unwrap();
    let what = "the tree shows the segment restarted once and running";
    let after = wait_until(
        what,
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let tree = tree_json(addr.clone()).await;
            let restarted = find(&tree["root"], &name)
                .is_some_and(|s| s["restarts"] == 1 && s["status"] == "running");
            if restarted { Ok(tree) } else { Err(tree) }
        },
    )
    .await;
    let segment = find(&after["root"], &name).unwrap();
    assert_eq!(segment["status"], "running");
    assert!(segment["last_exit_reason"].is_string(), "{segment}");

    let text_addr = addr.clone();
    let text = tokio::task::spawn_blocking(move || out(&ok(malachi(&text_addr, &["tree"], ""))))
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
    assert!(line.contains("restarts=1"), "{line}");
    assert!(line.contains("last_exit="), "{line}");
    assert!(text.contains("restarts in total: 1"), "{text}");
    broker.shutdown().await.unwrap();
}
