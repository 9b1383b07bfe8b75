//! The binary end to end: its exit codes and its results file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::{History, clean};

fn history_file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_malachi-chaos-check"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_clean_history_exits_0_and_writes_the_results() {
    let path = history_file("clean.jsonl", &clean().text());
    let out = path.with_file_name("results").join("clean.json");
    let _ = std::fs::remove_file(&out);
    let output = run(&[
        path.to_str().unwrap(),
        "--min-acked",
        "4",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("verdict: clean"), "{stdout}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(results["verdict"], "clean");
    assert_eq!(results["writes"]["acknowledged"], 4);
    assert_eq!(results["nemesis_events"]["kill"], 1);
}

#[test]
fn an_anomalous_history_exits_1() {
    let mut h = clean();
    h.read("late", "k1", 2).read("late", "k1", 1);
    let path = history_file("anomalous.jsonl", &h.text());
    let output = run(&[path.to_str().unwrap(), "--min-acked", "0"]);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("order_broken"), "{stdout}");
}

#[test]
fn a_vacuous_history_exits_2() {
    let path = history_file("vacuous.jsonl", &clean().text());
    // The default gate asks for 1000 acknowledged writes.
    let output = run(&[path.to_str().unwrap()]);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    assert!(
        stdout.contains("vacuous: 4 writes acknowledged"),
        "{stdout}"
    );
}

#[test]
fn a_malformed_history_a_missing_file_and_a_bad_flag_exit_3() {
    let mut text = History::new().write("k1", 1).text();
    text.push_str("not json\n");
    let path = history_file("malformed.jsonl", &text);
    let output = run(&[path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("line 3: malformed event"), "{stderr}");

    let missing = run(&["/nonexistent/history.jsonl"]);
    assert_eq!(missing.status.code(), Some(3));

    let bad_flag = run(&[path.to_str().unwrap(), "--min-acked", "many"]);
    assert_eq!(bad_flag.status.code(), Some(3));
}

#[test]
fn help_exits_0() {
    assert_eq!(run(&["--help"]).status.code(), Some(0));
}
