//! Self-healing (issue 19, ADR 0106): with four brokers and three copies
//! per segment, a broker gone for longer than `replace_after_ms` has its
//! sealed segments' copies re-created on the fourth broker, byte for byte,
//! and the active segments it followed roll onto a full replica set. With
//! three, a segment a failover placed on the two brokers it reached gets
//! its third copy once the third broker returns (chaos finding F1, ADR
//! 0117).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterNode};
use common::copies::frames;
use common::keyed::*;
use common::{malachi, ok, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};
use serde_json::Value;

const LINES: u64 = 600;
const KEYS: u64 = 12;

/// One segment: (segment id, range id, replicas, state, length).
type Described = (u64, u64, Vec<u64>, String, Option<u64>);

/// Every segment of `topic`, as `topic describe --json` shows it.
fn segments(broker: &str, topic: &str) -> Vec<Described> {
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
                    .collect(),
                segment["state"].as_str().unwrap_or("").to_string(),
                segment["length"].as_u64(),
            ));
        }
    }
    all
}

#[test]
fn with_four_brokers_a_dead_brokers_copies_are_re_created_on_the_fourth() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [1u64, 2, 3, 4];
    let mut nodes: Vec<ClusterNode> = ids
        .iter()
        .map(|id| {
            ClusterNode::with_cluster_settings(dir.path(), *id, &ids, "replace_after_ms = 5000\n")
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
    let mut cluster = Cluster { nodes };
    cluster.wait_for_coordinators(16);
    let b = clients[0].clone();
    ok(malachi(&b, &["topic", "create", "healing"], ""));
    let lines: String = (0..LINES / 2).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "healing"], &lines));
    // The split seals the first segment (three copies); the rest goes to
    // the two halves.
    let first = segments(&b, "healing")[0].clone();
    ok(malachi(
        &b,
        &["topic", "split", "healing", &first.1.to_string()],
        "",
    ));
    let lines: String = (LINES / 2..LINES).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&b, &["produce", "healing"], &lines));
    let sealed = segments(&b, "healing")
        .into_iter()
        .find(|s| s.0 == first.0)
        .unwrap();
    assert_eq!(sealed.3, "sealed");
    let seal = sealed.4.unwrap();
    assert_eq!(sealed.2.len(), 3);
    // A follower of the sealed segment dies for good.
    let victim = sealed.2[2];
    let spare = *ids.iter().find(|n| !sealed.2.contains(n)).unwrap();
    // Its copy is whole before the kill (a quorum acknowledged it; the
    // third copy may lag a moment).
    let victim_dir = cluster.nodes[(victim - 1) as usize].data_dir.clone();
    Wait::new(
        "the victim holds the sealed segment",
        Duration::from_secs(30),
        Duration::from_millis(100),
    )
    .until_blocking(|| frames(&victim_dir, first.0).1 >= seal);
    cluster.nodes[(victim - 1) as usize].kill9();
    let killed = Instant::now();
    let asked = clients[(spare - 1) as usize].clone();

    // Healed: the sealed segment's copy moves to the spare broker, in the
    // victim's place, and it is the survivors' byte for byte.
    let healed_onto = Wait::new(
        "the sealed segment no longer names the dead broker",
        Duration::from_secs(90),
        Duration::from_millis(250),
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let now = segments(&asked, "healing");
        let s = now.iter().find(|s| s.0 == first.0).unwrap();
        if s.2.contains(&victim) {
            Err(now.clone())
        } else {
            Ok(s.2.clone())
        }
    });
    assert!(
        healed_onto.contains(&spare),
        "healed onto {healed_onto:?}, not the spare {spare}"
    );
    println!("healed {:?} after the kill", killed.elapsed());
    let survivor = *sealed.2.iter().find(|n| **n != victim).unwrap();
    let (expected, count) = frames(&cluster.nodes[(survivor - 1) as usize].data_dir, first.0);
    assert_eq!(count, seal);
    let (healed, healed_count) = frames(&cluster.nodes[(spare - 1) as usize].data_dir, first.0);
    assert_eq!(
        healed_count, seal,
        "the new copy holds {healed_count} frames"
    );
    assert_eq!(healed, expected, "the new copy differs from a survivor's");

    // The active segments the victim held a copy of rolled onto full
    // replica sets of live brokers.
    Wait::new(
        "no active segment is on the dead broker or short of copies",
        Duration::from_secs(60),
        Duration::from_millis(250),
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let stale: Vec<_> = segments(&asked, "healing")
            .into_iter()
            .filter(|s| s.3 != "sealed" && (s.2.contains(&victim) || s.2.len() < 3))
            .collect();
        if stale.is_empty() { Ok(()) } else { Err(stale) }
    });

    // Nothing acknowledged was lost: every record once, in key order,
    // through every live broker, and the range takes writes.
    let more: String = (LINES..LINES + KEYS).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&asked, &["produce", "healing"], &more));
    for (i, broker) in clients.iter().enumerate() {
        if i as u64 + 1 == victim {
            continue;
        }
        let records = consume_all(broker, "healing");
        assert_keyed_sequences(&records, KEYS, LINES + KEYS);
    }
    assert!(cluster.logs().contains("segment copy healed"));
}

/// Regression for chaos finding F1: a failover on three brokers places the
/// successor on the two it can reach; once the third returns the short
/// segment rolls onto a full set (sealed with two copies) and the healer
/// adds the third copy, so every sealed segment ends at the topic's factor
/// with byte-identical copies, and every broker reads every record.
#[test]
fn with_three_brokers_a_segment_a_failover_left_on_two_gets_its_third_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let topic = "short";
    ok(malachi(&clients[0], &["topic", "create", topic], ""));
    let lines: String = (0..LINES / 2).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&clients[0], &["produce", topic], &lines));
    let first = segments(&clients[0], topic);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].2.len(), 3, "the default replication factor is 3");
    let victim = first[0].2[0];
    let survivor = clients[(first[0].2[1] - 1) as usize].clone();
    cluster.nodes[(victim - 1) as usize].kill9();

    // The failover seals the first segment and opens its successor on the
    // two live brokers.
    let successor = Wait::new(
        "a failover",
        Duration::from_secs(60),
        Duration::from_millis(200),
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let now = segments(&survivor, topic);
        let next = now.iter().find(|s| s.0 != first[0].0 && s.3 != "sealed");
        next.cloned().ok_or(now)
    });
    assert_eq!(
        successor.2.len(),
        2,
        "the successor of a failover: {successor:?}"
    );
    assert!(!successor.2.contains(&victim), "{successor:?}");
    let lines: String = (LINES / 2..LINES).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&survivor, &["produce", topic], &lines));

    // The victim returns: the short active segment rolls onto a full set
    // (`RESTORE_AFTER_MS` after it opened), sealed with two copies, and
    // the healer adds the third.
    let node = &mut cluster.nodes[(victim - 1) as usize];
    let seeds = node.seeds_among(&clients);
    node.start(&seeds);
    let returned = Instant::now();
    let sealed = Wait::new(
        "the successor is sealed and every sealed segment has three copies",
        Duration::from_secs(120),
        Duration::from_millis(250),
    )
    .context(|| cluster.logs())
    .until_blocking(|| {
        let now = segments(&survivor, topic);
        let sealed: Vec<Described> = now.iter().filter(|s| s.3 == "sealed").cloned().collect();
        let done =
            sealed.iter().any(|s| s.0 == successor.0) && sealed.iter().all(|s| s.2.len() == 3);
        if done { Ok(sealed) } else { Err(now) }
    });
    println!(
        "every sealed segment at three copies {:?} after the return",
        returned.elapsed()
    );
    let added = sealed.iter().find(|s| s.0 == successor.0).unwrap();
    // Appended after the two it had, so its primary and order are kept.
    assert_eq!(&added.2[..2], &successor.2[..], "{added:?}");
    assert_eq!(added.2[2], victim, "{added:?}");

    // Every copy of every sealed segment holds exactly the seal, byte for
    // byte the same (the returned broker's copy of the first segment is
    // cut back to its seal first).
    for segment in &sealed {
        let seal = segment.4.expect("a sealed segment has a length");
        let what = format!(
            "the copies of segment {} are alike at the seal {seal} (frames held)",
            segment.0
        );
        wait_until_blocking(
            &what,
            Duration::from_secs(30),
            Duration::from_millis(200),
            || {
                let copies: Vec<(Vec<u8>, u64)> = segment
                    .2
                    .iter()
                    .map(|n| frames(&cluster.nodes[(*n - 1) as usize].data_dir, segment.0))
                    .collect();
                if copies.iter().all(|c| c.1 == seal && c.0 == copies[0].0) {
                    Ok(())
                } else {
                    Err(copies.iter().map(|c| c.1).collect::<Vec<_>>())
                }
            },
        );
    }

    // Nothing acknowledged was lost: every record once, in key order,
    // through every broker, and the range takes writes.
    let more: String = (LINES..LINES + KEYS).map(|i| keyed_line(i, KEYS)).collect();
    ok(malachi(&survivor, &["produce", topic], &more));
    for broker in &clients {
        let records = consume_all(broker, topic);
        assert_keyed_sequences(&records, KEYS, LINES + KEYS);
    }
    assert!(cluster.logs().contains("segment copy added"));
}
