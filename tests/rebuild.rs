//! Rebuilding broken copies in place (issue 19, ADR 0110): with three
//! brokers and three copies per segment, a follower's sealed copy
//! corrupted mid-file, and another's deleted, are found by the scrubber and
//! rebuilt byte-identical from an intact copy, on the brokers that hold
//! them, while the brokers keep serving; the third copy's bad index
//! sidecar is rebuilt from its own log (issue 21).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use common::cluster::{Cluster, ClusterNode};
use common::copies::{frames, segment_log};
use common::keyed::*;
use common::{malachi, ok, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};
use serde_json::Value;

const LINES: u64 = 600;
const KEYS: u64 = 12;

/// The first segment of `topic` as `topic describe --json` shows it:
/// (segment id, range id, replicas, state, length).
fn first_segment(broker: &str, topic: &str) -> (u64, u64, Vec<u64>, String, Option<u64>) {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    let mut all = Vec::new();
    for range in described["ranges"].as_array().unwrap() {
        for segment in range["segments"].as_array().unwrap() {
            all.push((
                segment["id"].as_u64().unwrap(),
                range["id"].as_u64().unwrap_or(0),
                segment["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap())
                    .collect::<Vec<u64>>(),
                segment["state"].as_str().unwrap_or("").to_string(),
                segment["length"].as_u64(),
            ));
        }
    }
    all.sort_by_key(|s| s.0);
    all.remove(0)
}

#[test]
fn a_corrupted_and_a_deleted_follower_copy_are_rebuilt_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1u64, 2, 3];
    let mut nodes: Vec<ClusterNode> = ids
        .iter()
        .map(|id| {
            ClusterNode::with_cluster_settings(dir.path(), *id, &ids, "scrub_interval_ms = 1000\n")
        })
        .collect();
    let clients: Vec<String> = nodes.iter().map(|n| n.client.clone()).collect();
    for node in &mut nodes {
        let seeds: Vec<String> = clients
            .iter()
            .filter(|c| **c != node.client)
            .cloned()
            .collect();
        node.start(&seeds);
    }
    let cluster = Cluster { nodes };
    cluster.wait_for_coordinators(16);
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "scrubbed"], ""));
    let lines: String = (0..LINES / 2).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "scrubbed"], &lines));
    // The split seals the first segment, three copies of it.
    let first = first_segment(&b, "scrubbed");
    ok(malachi(
        &b,
        &["topic", "split", "scrubbed", &first.1.to_string()],
        "",
    ));
    let lines: String = (LINES / 2..LINES).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "scrubbed"], &lines));
    let sealed = first_segment(&b, "scrubbed");
    assert_eq!((sealed.0, sealed.3.as_str()), (first.0, "sealed"));
    let seal = sealed.4.unwrap();
    let holders = sealed.2.clone();
    assert_eq!(holders.len(), 3);
    let dir_of = |node: u64| cluster.nodes[(node - 1) as usize].data_dir.clone();
    // Every copy whole first (the third may lag a quorum's acknowledgement).
    for node in &holders {
        let what = format!("broker {node} holds the seal");
        Wait::new(what, Duration::from_secs(30), Duration::from_millis(100))
            .until_blocking(|| frames(&dir_of(*node), first.0).1 >= seal);
    }
    let (expected, count) = frames(&dir_of(holders[0]), first.0);
    assert_eq!(count, seal);

    // Damage at rest: one follower's copy gets a flipped byte mid-file,
    // the other's log is deleted, both under running brokers.
    let (corrupted, deleted) = (holders[1], holders[2]);
    let path = segment_log(&dir_of(corrupted), first.0);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let middle = expected.len() as u64 / 2;
    file.seek(SeekFrom::Start(middle)).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact(&mut byte).unwrap();
    file.seek(SeekFrom::Start(middle)).unwrap();
    file.write_all(&[byte[0] ^ 0x40]).unwrap();
    file.sync_all().unwrap();
    drop(file);
    std::fs::remove_file(segment_log(&dir_of(deleted), first.0)).unwrap();
    // And the third copy's index sidecar gets a flipped byte: the index is
    // derived, so its own broker rebuilds it from the log (issue 21).
    let index = segment_log(&dir_of(holders[0]), first.0).with_extension("idx");
    let index_before = std::fs::read(&index).unwrap();
    assert!(index_before.len() >= 32, "the copy has a sparse index");
    let mut bad = index_before.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x40;
    std::fs::write(&index, &bad).unwrap();

    // Found by the scrubber and rebuilt in place, byte for byte, the
    // replica set unchanged.
    for node in [corrupted, deleted] {
        let what = format!("broker {node}'s copy is rebuilt to the seal {seal} (frames held)");
        Wait::new(what, Duration::from_secs(60), Duration::from_millis(250))
            .context(|| cluster.logs())
            .until_blocking(|| {
                let (bytes, n) = frames(&dir_of(node), first.0);
                if n == seal && bytes == expected {
                    Ok(())
                } else {
                    Err(n)
                }
            });
    }
    assert_eq!(first_segment(&b, "scrubbed").2, holders);
    // The corrupted original was kept aside until the rebuild scrubbed
    // intact, then deleted.
    let aside = dir_of(corrupted)
        .join("segments")
        .join("aside")
        .join(format!("{:020}.log", first.0));
    Wait::new(
        "the broken original aside is deleted",
        Duration::from_secs(30),
        Duration::from_millis(250),
    )
    .context(|| cluster.logs())
    .until_blocking(|| !aside.exists());
    // Describe shows every copy of the sealed segment intact again, as
    // each holder tells it.
    let health = || -> Vec<(u64, String)> {
        let output = ok(malachi(
            &b,
            &["topic", "describe", "scrubbed", "--json"],
            "",
        ));
        let described: Value = serde_json::from_str(&out(&output)).unwrap();
        described["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["segments"].as_array().unwrap().iter())
            .filter(|s| s["id"].as_u64() == Some(first.0))
            .flat_map(|s| s["copies"].as_array().unwrap().iter())
            .map(|c| {
                (
                    c["node"].as_u64().unwrap(),
                    c["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let what = "describe shows the three rebuilt copies intact";
    wait_until_blocking(
        what,
        Duration::from_secs(30),
        Duration::from_millis(250),
        || {
            let shown = health();
            let intact = shown.len() == 3 && shown.iter().all(|(_, status)| status == "intact");
            if intact { Ok(()) } else { Err(shown) }
        },
    );
    Wait::new(
        "the bad index is rebuilt",
        Duration::from_secs(30),
        Duration::from_millis(250),
    )
    .context(|| cluster.logs())
    .until_blocking(|| std::fs::read(&index).unwrap() == index_before);
    let logs = cluster.logs();
    assert!(
        logs.contains("scrub found a bad index sidecar and rebuilt it from the log"),
        "{logs}"
    );
    assert!(logs.contains("scrub found a broken sealed copy"), "{logs}");
    assert!(logs.contains("segment copy rebuilt in place"), "{logs}");

    // Nothing acknowledged was lost, through every broker, and the topic
    // takes writes.
    let more: String = (LINES..LINES + KEYS).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "scrubbed"], &more));
    for broker in &clients {
        let records = consume_all(broker, "scrubbed");
        assert_keyed_sequences(&records, KEYS, LINES + KEYS);
    }
}
