//! `malachi bench idle` starts its own brokers, lets them settle with no
//! traffic, and reports each one's CPU and memory as one JSON line; with
//! `--kill-leader` it SIGKILLs the busiest leader and times the failover.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::process::Command;

use common::{bin, err, out};

#[test]
fn bench_idle_reports_every_brokers_cpu_and_memory() {
    let output = Command::new(bin())
        .args([
            "bench",
            "idle",
            "--brokers",
            "3",
            "--vnodes",
            "16",
            "--settle",
            "3s",
            "--duration",
            "2s",
            "--json",
            "--kill-leader",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", err(&output));
    let rows: Vec<serde_json::Value> = out(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        4,
        "one line per broker, then the failover: {rows:?}"
    );
    let (failover, rows) = rows.split_last().unwrap();
    // The broker leading the most vnodes was SIGKILLed with its groups
    // quiet (ADR 0101): every vnode it led has a survivor leading it.
    let led = failover["vnodes_led"].as_u64().unwrap();
    assert!(led >= 1, "{failover}");
    assert_eq!(failover["recovered"].as_u64(), Some(led), "{failover}");
    assert!(failover["p99_ms"].as_f64().unwrap() > 0.0, "{failover}");
    assert!((1..=3).contains(&failover["killed"].as_u64().unwrap()));
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["node"], i as u64 + 1);
        assert_eq!(row["brokers"], 3);
        assert_eq!(row["vnodes"], 16);
        let cpu = row["cpu_percent"].as_f64().unwrap();
        assert!(cpu.is_finite() && cpu >= 0.0, "{row}");
        // A broker's process holds at least a few MiB resident.
        assert!(row["rss_mib"].as_f64().unwrap() > 1.0, "{row}");
        assert!(row["seconds"].as_f64().unwrap() >= 2.0, "{row}");
    }
}

#[test]
fn bench_idle_refuses_zero_brokers_or_vnodes_with_one_line() {
    let output = Command::new(bin())
        .args(["bench", "idle", "--brokers", "0"])
        .output()
        .unwrap();
    let line = common::one_line_failure(&output);
    assert!(
        line.contains("--brokers must be between 1 and 16"),
        "{line}"
    );
}

#[test]
fn bench_idle_refuses_an_unknown_cluster_setting_before_starting_brokers() {
    let output = Command::new(bin())
        .args(["bench", "idle", "--cluster-set", "no_such_setting=1"])
        .output()
        .unwrap();
    let line = common::one_line_failure(&output);
    assert!(line.contains("--cluster-set"), "{line}");
    assert!(line.contains("no_such_setting"), "{line}");
}
