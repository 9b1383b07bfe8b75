//! What an operator sees of quorum replication (issue 17), across three
//! broker processes with RF=3: `topic describe` shows each segment's
//! replicas, primary, committed end and every copy's durable end, even with
//! a broker down (ADR 0098); a primary's `/metrics` shows each follower's
//! lag in bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{malachi, ok, out};
use malachi_testkit::wait::Wait;
use serde_json::Value;

/// How long the copies may take to settle once the records are acknowledged.
const SETTLE: Duration = Duration::from_secs(60);

fn describe_json(broker: &str, topic: &str) -> Value {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    serde_json::from_str(&out(&output)).unwrap()
}

/// The topic's only segment (a fresh topic has one range and one segment).
fn only_segment(described: &Value) -> Value {
    let ranges = described["ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 1, "{described}");
    let segments = ranges[0]["segments"].as_array().unwrap();
    assert_eq!(segments.len(), 1, "{described}");
    segments[0].clone()
}

fn replicas(segment: &Value) -> Vec<u64> {
    segment["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

/// `(node, status, durable_end)` of each copy, in replica order.
fn copies(segment: &Value) -> Vec<(u64, String, Option<u64>)> {
    segment["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["node"].as_u64().unwrap(),
                c["status"].as_str().unwrap().to_owned(),
                c["durable_end"].as_u64(),
            )
        })
        .collect()
}

fn lines(n: u64) -> String {
    (0..n).map(|i| format!("k{}\tv{i}\n", i % 7)).collect()
}

/// The whole `/metrics` text of a broker's admin port.
fn metrics(admin: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(admin) else {
        return String::new();
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// The value of `name{follower="node"}` in a metrics text.
fn follower_gauge(text: &str, name: &str, node: u64) -> Option<f64> {
    let prefix = format!("{name}{{follower=\"{node}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

#[test]
fn describe_shows_the_primary_the_committed_end_and_each_copy_and_a_dead_follower_as_unreachable() {
    const RECORDS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    ok(malachi(&clients[0], &["topic", "create", "described"], ""));
    ok(malachi(
        &clients[0],
        &["produce", "described", "--timeout-ms", "60000"],
        &lines(RECORDS),
    ));

    // Every broker answers a describe; the figures settle once both
    // followers hold every record (a quorum acknowledged them already).
    let what = format!("the copies settle at {RECORDS}");
    let (segment, replica_set) = Wait::new(what, SETTLE, Duration::from_millis(200))
        .context(|| cluster.logs())
        .until_blocking(|| {
            let segment = only_segment(&describe_json(&clients[1], "described"));
            let replica_set = replicas(&segment);
            let settled = segment["committed_end"].as_u64() == Some(RECORDS)
                && copies(&segment)
                    .iter()
                    .all(|(_, status, end)| status == "live" && *end == Some(RECORDS));
            if settled {
                Ok((segment, replica_set))
            } else {
                Err(segment)
            }
        });
    assert_eq!(replica_set.len(), 3, "RF=3 by default: {segment}");
    assert_eq!(
        segment["primary"].as_u64(),
        Some(replica_set[0]),
        "the primary is the first replica: {segment}"
    );
    let nodes: Vec<u64> = copies(&segment).iter().map(|c| c.0).collect();
    assert_eq!(nodes, replica_set, "one copy per replica, in replica order");
    // Every broker tells the same figures.
    for broker in &clients {
        let other = only_segment(&describe_json(broker, "described"));
        assert_eq!(other["committed_end"].as_u64(), Some(RECORDS), "{other}");
        assert_eq!(other["primary"], segment["primary"], "{other}");
    }
    // The text form shows them too.
    let text = out(&ok(malachi(
        &clients[2],
        &["topic", "describe", "described"],
        "",
    )));
    assert!(
        text.contains(&format!(
            "primary {} committed_end {RECORDS}",
            replica_set[0]
        )),
        "{text}"
    );
    for node in &replica_set {
        assert!(
            text.contains(&format!("    copy {node} live durable_end {RECORDS}")),
            "{text}"
        );
    }

    // A follower dies: describe still answers, at once, and shows its copy
    // unreachable while the others keep their figures.
    let dead = replica_set[2];
    cluster.nodes[(dead - 1) as usize].kill9();
    let asked = clients
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != dead)
        .map(|(_, c)| c.clone())
        .unwrap();
    let started = Instant::now();
    let segment = only_segment(&describe_json(&asked, "described"));
    let took = started.elapsed();
    assert_eq!(
        segment["committed_end"].as_u64(),
        Some(RECORDS),
        "{segment}"
    );
    for (node, status, end) in copies(&segment) {
        if node == dead {
            assert_eq!(status, "unreachable", "{segment}");
            assert_eq!(end, None, "an unreachable copy's end is unknown");
        } else {
            assert_eq!((status.as_str(), end), ("live", Some(RECORDS)), "{segment}");
        }
    }
    // One replica-status bound (1.5 s) and the CLI's own start, with a wide
    // margin for a loaded machine: never the CLI's timeout.
    assert!(took < Duration::from_secs(10), "describe took {took:?}");
    let text = out(&ok(malachi(
        &asked,
        &["topic", "describe", "described"],
        "",
    )));
    assert!(
        text.contains(&format!("    copy {dead} unreachable durable_end unknown")),
        "{text}"
    );
}

#[test]
fn a_primary_shows_each_followers_lag_in_bytes_on_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    ok(malachi(&clients[0], &["topic", "create", "lagging"], ""));
    ok(malachi(
        &clients[0],
        &["produce", "lagging", "--timeout-ms", "60000"],
        &lines(200),
    ));
    let segment = only_segment(&describe_json(&clients[0], "lagging"));
    let replica_set = replicas(&segment);
    let primary = &cluster.nodes[(replica_set[0] - 1) as usize];
    // Once the followers caught up, the primary's last answer from each
    // shows them zero bytes behind (the copies hold the same frames).
    let text = Wait::new(
        format!("zero lag in bytes for followers {:?}", &replica_set[1..]),
        SETTLE,
        Duration::from_millis(200),
    )
    .until_blocking(|| {
        let text = metrics(&primary.admin);
        let lags: Vec<Option<f64>> = replica_set[1..]
            .iter()
            .map(|&f| follower_gauge(&text, "malachi_replica_lag_bytes", f))
            .collect();
        if lags.iter().all(|lag| *lag == Some(0.0)) {
            return Ok(text);
        }
        let replica_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("malachi_replica"))
            .collect();
        Err(format!("{lags:?}\n{}", replica_lines.join("\n")))
    });
    for &follower in &replica_set[1..] {
        assert!(
            follower_gauge(&text, "malachi_replica_lag_records", follower).is_some(),
            "the lag in records is there too:\n{text}"
        );
    }
}
