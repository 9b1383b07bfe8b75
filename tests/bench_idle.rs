//! `malachi bench idle` starts its own brokers, lets them settle with no
//! traffic, and reports each one's CPU and memory as one JSON line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::{BIN, err, out};

#[test]
fn bench_idle_reports_every_brokers_cpu_and_memory() {
    let output = Command::new(BIN)
        .args([
            "bench",
            "idle",
            "--brokers",
            "3",
            "--vnodes",
            "16",
            "--settle",
            "1s",
            "--duration",
            "2s",
            "--json",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", err(&output));
    let rows: Vec<serde_json::Value> = out(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "one line per broker: {rows:?}");
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
    let output = Command::new(BIN)
        .args(["bench", "idle", "--brokers", "0"])
        .output()
        .unwrap();
    let line = common::one_line_failure(&output);
    assert!(
        line.contains("--brokers must be between 1 and 16"),
        "{line}"
    );
}
