//! Keyed record sequences through the CLI, as users run it: spawn
//! `malachi` with stdin open, feed keyed lines, read a topic back, and check
//! per-key order and exactly-once.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{BIN, err, malachi, ok, out};

/// `malachi ARGS` with stdin left open for the test to write.
pub fn spawn_malachi(broker: &str, args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("MALACHI_BROKER", broker)
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the child at most `limit`, killing it past that.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "malachi did not exit within {limit:?}; stdout: {} stderr: {}",
                out(&output),
                err(&output)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// Input line `i` (0-based) of a keyed sequence over `keys` keys.
pub fn keyed_line(i: u64, keys: u64) -> String {
    format!("k{}\t{}\n", i % keys, i / keys)
}

/// The whole topic from the start, as (key, value) in log order.
pub fn consume_all(broker: &str, topic: &str) -> Vec<(String, String)> {
    let output = ok(malachi(
        broker,
        &["consume", topic, "--from-start", "--json"],
        "",
    ));
    let lines = json_lines(&out(&output));
    let (last, records) = lines.split_last().expect("at least the cursor line");
    assert!(last["cursor"].is_string(), "the last line is the cursor");
    records
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The records are input lines `0..lines` of a keyed sequence over `keys`
/// keys: under each key, its values 0, 1, 2, ... in order, each once.
pub fn assert_keyed_sequences(records: &[(String, String)], keys: u64, lines: u64) {
    let mut next: HashMap<&str, u64> = HashMap::new();
    for (at, (key, value)) in records.iter().enumerate() {
        let expected = next.entry(key.as_str()).or_default();
        let got: u64 = value.parse().unwrap_or_else(|_| panic!("value {value:?}"));
        assert_eq!(
            got, *expected,
            "record {at}: key {key} has {got} where {expected} comes next (a duplicate, gap or reordering)"
        );
        *expected += 1;
    }
    for k in 0..keys {
        let per_key = lines / keys + u64::from(k < lines % keys);
        let key = format!("k{k}");
        assert_eq!(
            next.get(key.as_str()).copied().unwrap_or(0),
            per_key,
            "records read under {key}"
        );
    }
    assert_eq!(records.len() as u64, lines, "records read in all");
}
