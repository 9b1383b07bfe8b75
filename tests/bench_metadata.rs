//! `malachi bench metadata` end to end: a real cluster of three broker
//! processes sharing 16 vnodes, a tiny run spread over all three brokers,
//! and the clear one-line failures of bad input. The full benchmark is run
//! by hand on an idle machine (`docs/benchmarks.md`); these runs are seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::collections::BTreeSet;

use common::cluster::Cluster;
use common::{err, malachi, ok, one_line_failure, out};
use serde_json::Value;

const FIELDS: [&str; 16] = [
    "system",
    "scenario",
    "phase",
    "clients",
    "brokers",
    "prefix",
    "seconds",
    "ops",
    "ops_per_s",
    "records",
    "records_per_s",
    "mb_per_s",
    "p50_us",
    "p99_us",
    "p999_us",
    "errors",
];

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn topics(broker: &str) -> BTreeSet<String> {
    let listed = ok(malachi(broker, &["topic", "list", "--json"], ""));
    json_lines(&out(&listed))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn given_three_brokers_when_bench_metadata_runs_then_every_phase_succeeds_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::three_ready(dir.path());
    let brokers = cluster.clients().join(",");

    let run = malachi(
        &cluster.nodes[0].client,
        &[
            "bench",
            "metadata",
            "--broker",
            &brokers,
            "--ops",
            "5",
            "--clients",
            "2",
            "--json",
        ],
        "",
    );
    assert!(
        run.status.success(),
        "bench metadata failed: {}\n{}",
        err(&run),
        cluster.logs()
    );
    let lines = json_lines(&out(&run));
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["create", "describe", "delete"], "{lines:?}");
    for line in &lines {
        for field in FIELDS {
            assert!(line.get(field).is_some(), "{field} missing in {line}");
        }
        let phase = line["phase"].as_str().unwrap();
        assert_eq!(
            line["scenario"],
            format!("metadata {phase} clients=2 brokers=3").as_str()
        );
        // 2 clients x 5 operations, every one of them acknowledged.
        assert_eq!(line["ops"], 10, "{line}");
        assert_eq!(line["errors"], 0, "{line}\n{}", err(&run));
        assert!(line["ops_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert_eq!(line["records_per_s"], line["ops_per_s"]);
        let (p50, p99, p999) = (
            line["p50_us"].as_u64().unwrap(),
            line["p99_us"].as_u64().unwrap(),
            line["p999_us"].as_u64().unwrap(),
        );
        assert!(0 < p50 && p50 <= p99 && p99 <= p999, "{line}");
    }

    // The delete phase removed every topic of the run, as every broker sees it.
    let prefix = lines[0]["prefix"].as_str().unwrap();
    assert!(prefix.starts_with("mbench-"), "{prefix}");
    for broker in cluster.clients() {
        let left: Vec<String> = topics(&broker)
            .into_iter()
            .filter(|t| t.starts_with(prefix))
            .collect();
        assert!(left.is_empty(), "left behind via {broker}: {left:?}");
    }

    // Without cleanup there is no delete phase and the topics stay, under
    // the prefix asked for; text mode names them first.
    let kept = ok(malachi(
        &cluster.nodes[1].client,
        &[
            "bench",
            "metadata",
            "--ops",
            "2",
            "--clients",
            "1",
            "--prefix",
            "kept",
            "--cleanup=false",
        ],
        "",
    ));
    let text = out(&kept);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "topics kept-cC-I, kept (--cleanup=false)");
    for (line, phase) in lines[1..].iter().zip(["create", "describe"]) {
        let scenario = format!("metadata {phase} clients=1 brokers=1");
        assert!(
            line.starts_with("malachi") && line.contains(&scenario),
            "{text}"
        );
        assert!(
            line.contains(" ops/s ") && line.ends_with("errors 0"),
            "{text}"
        );
    }
    let listed = topics(&cluster.nodes[2].client);
    assert!(
        listed.contains("kept-c0-0") && listed.contains("kept-c0-1"),
        "{listed:?}"
    );
}

#[test]
fn an_unreachable_broker_or_zero_clients_fail_with_one_clear_line() {
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    let unreachable = malachi(&nowhere, &["bench", "metadata", "--ops", "1"], "");
    let line = one_line_failure(&unreachable);
    assert!(line.contains("cannot reach a broker"), "{line}");
    assert!(line.contains(&nowhere), "{line}");

    let zero = malachi(&nowhere, &["bench", "metadata", "--clients", "0"], "");
    let line = one_line_failure(&zero);
    assert!(line.contains("--clients must be 1 to"), "{line}");
}
