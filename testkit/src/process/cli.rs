//! The CLI as users run it: spawn `malachi` with stdin open (for a
//! [`crate::keyed::KeyedWriter`] to feed), wait for it to exit, and read a
//! topic back as (key, value) pairs for the per-key order checker.

use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;

use super::{err, malachi, ok, out};
use crate::wait::Wait;

pub use super::spawn_malachi;

/// Waits for the child at most `limit`, killing it past that.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let exited = Wait::new("malachi exits", limit, Duration::from_millis(20))
        .try_until_blocking(|| child.try_wait().unwrap().ok_or("running"));
    if let Err(timed_out) = exited {
        let _ = child.kill();
        let output = child.wait_with_output().unwrap();
        panic!(
            "{timed_out}; stdout: {} stderr: {}",
            out(&output),
            err(&output)
        );
    }
    child.wait_with_output().unwrap()
}

pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
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
