//! `malachi bench compare` end to end, without Redis or NATS: the limits and
//! Malachi's own broker (a child process of the binary) with tiny durations,
//! and the one-line skip of a peer that is missing and may not be installed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_malachi");

const FIELDS: [&str; 19] = [
    "system",
    "scenario",
    "durability",
    "fsync",
    "mb_per_s",
    "records_per_s",
    "p50_us",
    "p99_us",
    "p999_us",
    "ratio_to_raw",
    "replication_factor",
    "raw_third_mb_per_s",
    "ratio_to_raw_third",
    "malachi_over_this",
    "ratio_to_peers",
    "plaintext_mb_per_s",
    "ratio_to_plaintext",
    "dropped",
    "version",
];

fn run(args: &[&str], dir: &std::path::Path, path_env: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(["bench", "compare"])
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .env_remove("MALACHI_CONFIG");
    if let Some(path) = path_env {
        command.env("PATH", path);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "bench compare failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

#[test]
fn given_only_malachi_when_compare_runs_quick_with_json_then_every_line_carries_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(
        &[
            "--quick",
            "--only",
            "malachi",
            "--duration",
            "400ms",
            "--json",
            "--dir",
            "data",
            "--results-dir",
            "results",
        ],
        dir.path(),
        None,
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    for row in &rows {
        for field in FIELDS {
            assert!(row.get(field).is_some(), "{field} missing in {row}");
        }
    }
    let find = |system: &str, scenario: &str| {
        rows.iter()
            .find(|r| r["system"] == system && r["scenario"] == scenario)
            .unwrap_or_else(|| panic!("no {system} {scenario} row in\n{stdout}"))
    };
    for n in [1, 16, 64] {
        let scenario = format!("produce-p{n}");
        let malachi = find("malachi", &scenario);
        assert!(malachi["records"].as_u64().unwrap() > 0, "{malachi}");
        assert_eq!(malachi["durability"], "durable");
        assert!(malachi["ratio_to_raw"].as_f64().unwrap() > 0.0, "{malachi}");
        assert!(find("raw-disk", &scenario)["mb_per_s"].as_f64().unwrap() > 0.0);
    }
    let consume = find("malachi", "consume");
    assert!(consume["records"].as_u64().unwrap() > 0, "{consume}");
    assert!(
        find("raw-disk", "fsync-latency")["p50_us"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        find("loopback", "tcp-bandwidth")["mb_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // No peer ran: no peer rows, and no ratio to one.
    assert!(
        rows.iter()
            .all(|r| r["system"] != "redis" && r["system"] != "nats")
    );
    // Only the single broker was asked for: no RF=3 rows either.
    assert!(
        rows.iter()
            .all(|r| r["system"] != "malachi-rf3" && r["system"] != "nats-r3")
    );
    assert!(!stderr.contains("skipped redis"), "{stderr}");

    // The same lines went to the results file, with a chart beside it.
    let results: Vec<_> = std::fs::read_dir(dir.path().join("results"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let json = results
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a .json results file");
    assert_eq!(std::fs::read_to_string(json).unwrap(), stdout);
    let svg = results
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "svg"))
        .expect("an .svg chart");
    assert!(std::fs::read_to_string(svg).unwrap().contains("<svg"));
    // Servers and raw files are removed at the end.
    assert_eq!(
        std::fs::read_dir(dir.path().join("data")).unwrap().count(),
        0
    );
}

#[test]
fn given_only_malachi_rf3_when_compare_runs_then_three_brokers_give_a_row_with_its_raw_third() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(
        &[
            "--only",
            "malachi-rf3",
            "--duration",
            "800ms",
            "--producers",
            "1",
            "--json",
            "--dir",
            "data",
            "--results-dir",
            "results",
        ],
        dir.path(),
        None,
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let rf3: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["system"] == "malachi-rf3")
        .collect();
    assert_eq!(rf3.len(), 1, "{stdout}");
    let rf3 = rf3[0];
    assert_eq!(rf3["scenario"], "produce-p1");
    assert_eq!(rf3["replication_factor"], 3);
    assert!(rf3["records"].as_u64().unwrap() > 0, "{rf3}");
    assert!(rf3["p50_us"].as_u64().unwrap() > 0, "{rf3}");
    assert!(rf3["p99_us"].as_u64().unwrap() > 0, "{rf3}");
    let third = rf3["raw_third_mb_per_s"].as_f64().unwrap();
    let ratio = rf3["ratio_to_raw_third"].as_f64().unwrap();
    assert!(third > 0.0, "{rf3}");
    let mb = rf3["mb_per_s"].as_f64().unwrap();
    assert!((ratio - mb / third).abs() < 1e-9, "{rf3}");
    // The single broker did not run, so nothing compares with it.
    assert!(rows.iter().all(|r| r["system"] != "malachi"), "{stdout}");
    // Three brokers' directories are removed at the end.
    assert_eq!(
        std::fs::read_dir(dir.path().join("data")).unwrap().count(),
        0
    );
}

#[test]
fn given_only_malachi_tls_when_compare_runs_then_tls_rows_carry_their_plaintext_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(
        &[
            "--only",
            "malachi-tls",
            "--duration",
            "800ms",
            "--producers",
            "1",
            "--json",
            "--dir",
            "data",
            "--results-dir",
            "results",
        ],
        dir.path(),
        None,
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let tls: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["system"] == "malachi-tls")
        .collect();
    let scenarios: Vec<&str> = tls
        .iter()
        .map(|r| r["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(scenarios, ["produce-p1", "consume"], "{stdout}");
    for row in tls {
        for field in FIELDS {
            assert!(row.get(field).is_some(), "{field} missing in {row}");
        }
        assert!(row["records"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        let plain = row["plaintext_mb_per_s"].as_f64().unwrap();
        assert!(plain > 0.0, "{row}");
        let ratio = row["ratio_to_plaintext"].as_f64().unwrap();
        let mb = row["mb_per_s"].as_f64().unwrap();
        assert!((ratio - mb / plain).abs() < 1e-9, "{row}");
        assert!(row["version"].as_str().unwrap().contains("SCRAM"), "{row}");
    }
    // Both brokers' directories (and the throwaway CA) are removed at the end.
    assert_eq!(
        std::fs::read_dir(dir.path().join("data")).unwrap().count(),
        0
    );
}

#[test]
fn given_no_redis_and_no_install_when_compare_runs_then_redis_is_skipped_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let output = run(
        &[
            "--only",
            "redis",
            "--no-install",
            "--duration",
            "200ms",
            "--producers",
            "1",
            "--dir",
            "data",
        ],
        dir.path(),
        Some(empty_path.path()),
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let skip: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("skipped redis"))
        .collect();
    assert_eq!(skip.len(), 1, "{stdout}");
    assert!(
        skip[0].contains("redis-server is not installed") && skip[0].contains("--no-install"),
        "{}",
        skip[0]
    );
    // The table still prints, with the limits.
    assert!(stdout.contains("raw-disk"), "{stdout}");
    assert!(
        stdout.contains("target malachi / redis durable"),
        "{stdout}"
    );
}
