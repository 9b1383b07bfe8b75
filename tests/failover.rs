//! Failover (issue 19, ADR 0106): a segment's primary SIGKILLed under
//! pipelined producers is sealed without it at a length that covers every
//! acknowledged record, and the range goes on in a successor on the live
//! brokers. The CLI is run with its default flags, as users run it: the
//! producers pipeline, retry, and give up after the default 10 s delivery
//! timeout, so the failover must finish well inside that.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::copies::{frames, segment_log};
use common::keyed::*;
use common::{err, malachi, ok, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};
use serde_json::Value;

const PRODUCERS: u64 = 4;
const LINES: u64 = 24_000;
const KEYS: u64 = 16;
const CHUNK: u64 = 400;

/// One segment of `topic describe --json`.
#[derive(Debug, Clone)]
struct Described {
    id: u64,
    range: u64,
    replicas: Vec<u64>,
    state: String,
    length: Option<u64>,
}

fn describe(broker: &str, topic: &str) -> Vec<Described> {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    let mut segments = Vec::new();
    for range in described["ranges"].as_array().unwrap() {
        for segment in range["segments"].as_array().unwrap() {
            segments.push(Described {
                id: segment["id"].as_u64().unwrap(),
                range: range["id"].as_u64().unwrap_or(0),
                replicas: segment["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap())
                    .collect(),
                state: segment["state"].as_str().unwrap_or("").to_string(),
                length: segment["length"].as_u64(),
            });
        }
    }
    segments
}

/// Producer `p`'s line `i`: its own keys, so each producer's per-key
/// sequences can be checked apart.
fn line(p: u64, i: u64) -> String {
    format!("p{p}k{}\t{}\n", i % KEYS, i / KEYS)
}

/// Every producer's records: per key 0, 1, 2, ... in order, each once,
/// `LINES` per producer; probe records are left out.
fn assert_every_producer_exactly_once(records: &[(String, String)], through: &str) {
    let mut next: HashMap<&str, u64> = HashMap::new();
    let mut per_producer: HashMap<String, u64> = HashMap::new();
    for (at, (key, value)) in records.iter().enumerate() {
        if key.starts_with("probe") {
            continue;
        }
        let expected = next.entry(key.as_str()).or_default();
        let got: u64 = value.parse().unwrap_or_else(|_| panic!("value {value:?}"));
        assert_eq!(
            got, *expected,
            "through {through}, record {at}: key {key} has {got} where {expected} comes next (a duplicate, gap or reordering)"
        );
        *expected += 1;
        let producer = key.split('k').next().unwrap_or("").to_string();
        *per_producer.entry(producer).or_default() += 1;
    }
    for p in 0..PRODUCERS {
        assert_eq!(
            per_producer.get(&format!("p{p}")).copied().unwrap_or(0),
            LINES,
            "through {through}: records of producer {p}"
        );
    }
}

#[test]
fn the_primary_sigkilled_under_four_producers_fails_over_and_every_acked_record_is_read_once_in_key_order()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    ok(malachi(&clients[0], &["topic", "create", "failover"], ""));
    let first = describe(&clients[0], "failover");
    assert_eq!(first.len(), 1);
    let old = first[0].clone();
    assert_eq!(old.replicas.len(), 3, "the default replication factor is 3");
    let primary = old.replicas[0];
    // The producers bootstrap through brokers that stay up.
    let survivors: Vec<String> = clients
        .iter()
        .enumerate()
        .filter(|(i, _)| *i as u64 + 1 != primary)
        .map(|(_, c)| c.clone())
        .collect();

    let mut children = Vec::new();
    let mut writers = Vec::new();
    for p in 0..PRODUCERS {
        let broker = &survivors[(p as usize) % survivors.len()];
        // Default flags: pipelined, retried, 10 s delivery timeout.
        let mut child = spawn_malachi(broker, &["produce", "failover"]);
        let stdin = child.stdin.take().unwrap();
        let pace = Duration::from_millis(40);
        writers.push(KeyedWriter::spawn(stdin, LINES, CHUNK, pace, move |j| {
            line(p, j)
        }));
        children.push(child);
    }
    for writer in &writers {
        writer.wait_written(LINES / 3);
    }
    cluster.nodes[(primary - 1) as usize].kill9();
    let killed = Instant::now();

    // How long until a produce is acknowledged again: a one-record produce
    // every 100 ms, each given one second.
    let probing = Arc::new(AtomicBool::new(true));
    let probe = {
        let broker = survivors[0].clone();
        let probing = Arc::clone(&probing);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while probing.load(Ordering::Relaxed) {
                let answer = malachi(
                    &broker,
                    &["produce", "failover", "--timeout-ms", "1000"],
                    &format!("probe\t{n}\n"),
                );
                if answer.status.success() {
                    return Some(killed.elapsed());
                }
                n += 1;
                // pacing, not synchronisation: a probe every 100 ms measures the recovery time.
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
    };

    // A produce that stopped is reported below, with its stderr.
    for writer in writers {
        let _ = writer.join();
    }
    let mut outputs = Vec::new();
    for child in children {
        outputs.push(wait_output(child, Duration::from_secs(300)));
    }
    probing.store(false, Ordering::Relaxed);
    let first_ack = probe.join().unwrap();
    for (p, output) in outputs.iter().enumerate() {
        assert!(
            output.status.success(),
            "producer {p} failed: {}\n{}",
            err(output),
            cluster
                .logs()
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("failover"))
                .take(60)
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert_eq!(
            out(output),
            format!("{LINES} of {LINES} records acknowledged by failover\n"),
            "producer {p}: {}",
            err(output)
        );
    }
    let failed_over_after = cluster
        .logs()
        .lines()
        .any(|l| l.contains("segment failed over"));
    assert!(
        failed_over_after,
        "no broker logged the failover\n{}",
        cluster.logs()
    );
    println!(
        "primary {primary} killed; first acknowledged produce after {:?}",
        first_ack
    );
    assert!(
        first_ack.is_some(),
        "no produce was acknowledged after the kill"
    );

    // The metadata: the old segment sealed, its successor on the range
    // led by a copy of it, with no copy on the dead broker.
    let now = describe(&survivors[0], "failover");
    let sealed = now.iter().find(|s| s.id == old.id).unwrap().clone();
    assert_eq!(sealed.state, "sealed", "{now:?}");
    let seal = sealed.length.expect("a sealed segment has a length");
    let successor = now
        .iter()
        .find(|s| s.range == old.range && s.id > old.id)
        .unwrap_or_else(|| panic!("no successor of segment {}: {now:?}", old.id))
        .clone();
    assert!(
        !successor.replicas.contains(&primary),
        "the successor has a copy on the dead broker: {successor:?}"
    );
    assert!(
        old.replicas.contains(&successor.replicas[0]),
        "the successor's primary held no copy of the sealed segment: {successor:?}"
    );

    // Every record acknowledged is read once, in key order, through every
    // live broker.
    for broker in &survivors {
        let records = consume_all(broker, "failover");
        assert_every_producer_exactly_once(&records, broker);
    }

    // The surviving copies of the sealed segment agree byte for byte and
    // neither holds a frame past the seal.
    let copies: Vec<(u64, (Vec<u8>, u64))> = old
        .replicas
        .iter()
        .filter(|n| **n != primary)
        .map(|n| {
            (
                *n,
                frames(&cluster.nodes[(*n - 1) as usize].data_dir, old.id),
            )
        })
        .collect();
    for (node, (_, count)) in &copies {
        assert_eq!(
            *count, seal,
            "copy on broker {node} holds {count} frames; the seal is {seal}"
        );
    }
    assert_eq!(copies[0].1.0, copies[1].1.0, "the surviving copies differ");

    // The old primary returns: it runs no writer for the sealed segment,
    // and reads through it are still exactly once (its copy is clamped at
    // the seal, whatever it held past it).
    let (_, held_at_kill) = frames(&cluster.nodes[(primary - 1) as usize].data_dir, old.id);
    println!("the dead primary's copy held {held_at_kill} frames; the seal is {seal}");
    let node = &mut cluster.nodes[(primary - 1) as usize];
    let seeds = node.seeds_among(&clients);
    node.start(&seeds);
    let returned = clients[(primary - 1) as usize].clone();
    let what = format!(
        "the returned primary reads all {} records (records read)",
        PRODUCERS * LINES
    );
    let records = wait_until_blocking(
        &what,
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let records = consume_all(&returned, "failover");
            let ours = records
                .iter()
                .filter(|(k, _)| !k.starts_with("probe"))
                .count() as u64;
            if ours == PRODUCERS * LINES {
                Ok(records)
            } else {
                Err(ours)
            }
        },
    );
    assert_every_producer_exactly_once(&records, &returned);
    // Its copy of the sealed segment is settled: cut back to exactly the
    // seal, byte for byte the survivors' (whatever it held past the seal,
    // never acknowledged, is gone).
    let old_primary_dir = cluster.nodes[(primary - 1) as usize].data_dir.clone();
    let what = format!(
        "the returned primary's copy is the seal's {seal} frames ({} bytes), as (frames, bytes on disk)",
        copies[0].1.0.len()
    );
    Wait::new(what, Duration::from_secs(30), Duration::from_millis(200))
        .context(|| cluster.nodes[(primary - 1) as usize].log())
        .until_blocking(|| {
            let (bytes, count) = frames(&old_primary_dir, old.id);
            let on_disk = std::fs::metadata(segment_log(&old_primary_dir, old.id))
                .map(|m| m.len())
                .unwrap_or(0);
            if count == seal && bytes == copies[0].1.0 && on_disk == bytes.len() as u64 {
                Ok(())
            } else {
                Err((count, on_disk))
            }
        });

    // It may start that writer from its replica's stale view at first; it
    // stops it once the replica has applied the seal.
    let writer = format!("/{} ", old.id);
    Wait::new(
        "the returned primary runs no writer of the sealed segment",
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .context(|| cluster.nodes[(primary - 1) as usize].log())
    .until_blocking(|| {
        let tree = out(&ok(malachi(&returned, &["tree"], "")));
        let writing = tree
            .lines()
            .any(|l| l.contains("segment/") && l.contains(&writer));
        if writing { Err(tree) } else { Ok(()) }
    });
}
