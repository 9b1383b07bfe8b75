//! `malachi produce` as users run it, against a broker process (ADR 0092):
//! with its default flags, reading stdin while the broker is SIGKILLed and
//! restarted, it retries and exits 0 with every line stored exactly once
//! and in per-key order; with a wide window and large batches it keeps
//! per-key order and exactly-once; and a refusal it must not retry (a value
//! over the broker's limit, a topic deleted under it) stops it with a
//! summary that names exactly the lines acknowledged before the refusal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::Write;
use std::process::Output;
use std::time::{Duration, Instant};

use common::keyed::*;
use common::{BrokerProcess, err, free_port, malachi, ok, out};
use malachi_testkit::wait::wait_until_blocking;

/// A broker on fixed addresses, so it can be restarted where clients expect it.
struct Running {
    broker: BrokerProcess,
    data: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start() -> Running {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let client = format!("127.0.0.1:{}", free_port());
        let admin = format!("127.0.0.1:{}", free_port());
        let broker = BrokerProcess::start_on(&data, &client, &admin);
        Running {
            broker,
            data,
            _dir: dir,
        }
    }

    fn addr(&self) -> String {
        self.broker.client_addr.clone()
    }

    fn kill9_and_restart(&mut self, down_for: Duration) {
        self.broker.kill9();
        // Fault timing: the broker stays down while the producer retries.
        std::thread::sleep(down_for);
        let client = self.broker.client_addr.clone();
        let admin = self.broker.admin_addr.clone();
        self.broker = BrokerProcess::start_on(&self.data, &client, &admin);
    }
}

#[test]
fn default_produce_from_stdin_outlasts_a_kill_9_and_stores_every_line_once_in_key_order() {
    const LINES: u64 = 20_000;
    const KEYS: u64 = 50;
    const CHUNK: u64 = 100;
    let mut running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-kill9"], ""));

    let mut child = spawn_malachi(&b, &["produce", "cli-kill9", "--timeout-ms", "30000"]);
    let stdin = child.stdin.take().unwrap();
    let writer = KeyedWriter::spawn(stdin, LINES, CHUNK, Duration::from_millis(10), |j| {
        keyed_line(j, KEYS)
    });
    // Kill twice in the middle of the input.
    let mut at_restarts = Vec::new();
    for fifths in [1, 3] {
        writer.wait_written(LINES * fifths / 5);
        running.kill9_and_restart(Duration::from_millis(300));
        at_restarts.push(writer.written());
    }
    let at_restart = *at_restarts.last().unwrap();
    writer.join().unwrap();
    let output = wait_output(child, Duration::from_secs(60));
    println!("broker restarted with {at_restarts:?} of {LINES} lines written");
    let output = ok(output);
    assert_eq!(
        out(&output),
        format!("{LINES} of {LINES} records acknowledged by cli-kill9\n"),
        "stderr: {}",
        err(&output)
    );
    assert!(
        at_restart < LINES,
        "the last restart came after all input was written"
    );

    let records = consume_all(&b, "cli-kill9");
    assert_keyed_sequences(&records, KEYS, LINES);
}

#[test]
fn a_wide_window_of_large_batches_keeps_key_order_and_stores_each_record_once() {
    const LINES: u64 = 100_000;
    const KEYS: u64 = 100;
    let running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-window"], ""));
    let input: String = (0..LINES)
        .map(|i| format!("{{\"key\":\"k{}\",\"value\":\"{}\"}}\n", i % KEYS, i / KEYS))
        .collect();
    let started = Instant::now();
    let output = ok(malachi(
        &b,
        &[
            "produce",
            "cli-window",
            "--window",
            "64",
            "--batch-records",
            "1000",
            "--json",
        ],
        &input,
    ));
    println!("produced {LINES} records in {:?}", started.elapsed());
    let summary = &json_lines(&out(&output))[0];
    assert_eq!(summary["records_sent"], LINES);
    assert_eq!(summary["records_acknowledged"], LINES);
    assert_eq!(
        summary["acknowledged_lines"],
        serde_json::json!([[1, LINES]])
    );
    assert!(summary.get("error").is_none(), "{summary}");

    let records = consume_all(&b, "cli-window");
    assert_keyed_sequences(&records, KEYS, LINES);
}

/// The value limit of a broker with the default configuration.
const VALUE_BYTES_MAX: usize = 1 << 20;

/// Produces `before` keyed lines, waits until the broker stored them all
/// (so the command line has sent and flushed them: nothing else is in
/// flight), then a line whose value is over the broker's limit and `after`
/// more lines. Returns the command's output.
fn produce_with_an_oversized_line(
    b: &str,
    topic: &str,
    before: u64,
    after: u64,
    json: bool,
) -> Output {
    let mut args = vec!["produce", topic];
    if json {
        args.push("--json");
    }
    let mut child = spawn_malachi(b, &args);
    let mut stdin = child.stdin.take().unwrap();
    let line = |i: u64| {
        if json {
            format!("{{\"key\":\"k{}\",\"value\":\"{}\"}}\n", i % 10, i / 10)
        } else {
            keyed_line(i, 10)
        }
    };
    let head: String = (0..before).map(line).collect();
    stdin.write_all(head.as_bytes()).unwrap();
    stdin.flush().unwrap();
    wait_stored(b, topic, before);
    let big = "x".repeat(VALUE_BYTES_MAX + 1);
    let big_line = if json {
        format!("{{\"key\":\"k0\",\"value\":\"{big}\"}}\n")
    } else {
        format!("k0\t{big}\n")
    };
    let tail: String = (before..before + after).map(line).collect();
    // The command may stop reading once it is refused: a broken pipe is fine.
    let _ = stdin.write_all(big_line.as_bytes());
    let _ = stdin.write_all(tail.as_bytes());
    drop(stdin);
    wait_output(child, Duration::from_secs(30))
}

#[test]
fn a_value_over_the_limit_stops_produce_with_the_lines_acknowledged_before_it() {
    const BEFORE: u64 = 1_234;
    let running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-too-large"], ""));
    let output = produce_with_an_oversized_line(&b, "cli-too-large", BEFORE, 300, true);
    assert!(!output.status.success(), "stdout: {}", out(&output));
    assert_ne!(output.status.code(), Some(2), "{}", err(&output));
    let lines = json_lines(&out(&output));
    assert_eq!(lines.len(), 1, "one summary: {}", out(&output));
    let summary = &lines[0];
    assert_eq!(summary["topic"], "cli-too-large");
    assert_eq!(summary["records_acknowledged"], BEFORE, "{summary}");
    assert_eq!(
        summary["acknowledged_lines"],
        serde_json::json!([[1, BEFORE]]),
        "{summary}"
    );
    let sent = summary["records_sent"].as_u64().unwrap();
    assert!(sent > BEFORE, "the oversized record was sent: {summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(
        error.contains("over the limit") || error.contains("too large"),
        "{error}"
    );
    assert!(
        err(&output).contains(&format!(
            "{BEFORE} of {sent} records were acknowledged before the error"
        )),
        "{}",
        err(&output)
    );
    // What the summary says was acknowledged is what the topic holds.
    let records = consume_all(&b, "cli-too-large");
    assert_eq!(records.len() as u64, BEFORE);
    assert_keyed_sequences(&records, 10, BEFORE);
}

#[test]
fn in_text_mode_a_refusal_says_how_many_records_were_acknowledged() {
    const BEFORE: u64 = 700;
    let running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-too-large-text"], ""));
    let output = produce_with_an_oversized_line(&b, "cli-too-large-text", BEFORE, 50, false);
    assert!(!output.status.success(), "stdout: {}", out(&output));
    assert_ne!(output.status.code(), Some(2), "{}", err(&output));
    assert_eq!(out(&output), "", "nothing on stdout when it fails");
    let stderr = err(&output);
    let counted = stderr
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(&format!("malachi: {BEFORE} of "))?;
            rest.strip_suffix(" records were acknowledged before the error")
        })
        .unwrap_or_else(|| panic!("no acknowledged count line: {stderr}"));
    let sent: u64 = counted.parse().unwrap();
    assert!(sent > BEFORE, "{stderr}");
    assert!(
        stderr.contains("over the limit"),
        "the refusal is named: {stderr}"
    );
    assert_eq!(consume_all(&b, "cli-too-large-text").len() as u64, BEFORE);
}

#[test]
fn a_topic_deleted_mid_way_stops_produce_with_the_lines_acknowledged_before_it() {
    const BEFORE: u64 = 2_500;
    let running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-deleted"], ""));
    let mut child = spawn_malachi(&b, &["produce", "cli-deleted", "--json"]);
    let mut stdin = child.stdin.take().unwrap();
    let line = |i: u64| format!("{{\"key\":\"k{}\",\"value\":\"{}\"}}\n", i % 10, i / 10);
    let head: String = (0..BEFORE).map(line).collect();
    stdin.write_all(head.as_bytes()).unwrap();
    stdin.flush().unwrap();
    wait_stored(&b, "cli-deleted", BEFORE);
    ok(malachi(&b, &["topic", "delete", "cli-deleted"], ""));
    let tail: String = (BEFORE..BEFORE + 1_000).map(line).collect();
    let _ = stdin.write_all(tail.as_bytes());
    drop(stdin);
    let output = wait_output(child, Duration::from_secs(30));
    assert!(!output.status.success(), "stdout: {}", out(&output));
    assert_ne!(output.status.code(), Some(2), "{}", err(&output));
    let lines = json_lines(&out(&output));
    assert_eq!(lines.len(), 1, "one summary: {}", out(&output));
    let summary = &lines[0];
    assert_eq!(summary["records_acknowledged"], BEFORE, "{summary}");
    assert_eq!(
        summary["acknowledged_lines"],
        serde_json::json!([[1, BEFORE]]),
        "{summary}"
    );
    let sent = summary["records_sent"].as_u64().unwrap();
    assert!(sent > BEFORE, "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(
        error.contains("cli-deleted"),
        "the error names the topic: {error}"
    );
    assert!(
        err(&output).contains(&format!(
            "{BEFORE} of {sent} records were acknowledged before the error"
        )),
        "{}",
        err(&output)
    );
}

#[test]
fn a_wide_window_outlasts_a_kill_9_with_many_requests_in_flight() {
    const LINES: u64 = 100_000;
    const KEYS: u64 = 100;
    const CHUNK: u64 = 5_000;
    let mut running = Running::start();
    let b = running.addr();
    ok(malachi(&b, &["topic", "create", "cli-window-kill9"], ""));
    let mut child = spawn_malachi(
        &b,
        &[
            "produce",
            "cli-window-kill9",
            "--window",
            "64",
            "--batch-records",
            "1000",
            "--timeout-ms",
            "30000",
        ],
    );
    let stdin = child.stdin.take().unwrap();
    let writer = KeyedWriter::spawn(stdin, LINES, CHUNK, Duration::from_millis(20), |j| {
        keyed_line(j, KEYS)
    });
    writer.wait_written(LINES / 2);
    running.kill9_and_restart(Duration::from_millis(200));
    let at_restart = writer.written();
    writer.join().unwrap();
    let output = ok(wait_output(child, Duration::from_secs(60)));
    println!("broker restarted with {at_restart} of {LINES} lines written");
    assert_eq!(
        out(&output),
        format!("{LINES} of {LINES} records acknowledged by cli-window-kill9\n"),
        "stderr: {}",
        err(&output)
    );
    let records = consume_all(&b, "cli-window-kill9");
    assert_keyed_sequences(&records, KEYS, LINES);
}

/// Waits until `topic` holds `lines` records (records stored so far as the
/// last observation); more than that fails at once.
fn wait_stored(broker: &str, topic: &str, lines: u64) {
    let what = format!("{lines} records of {topic} are stored");
    wait_until_blocking(
        &what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let stored = consume_all(broker, topic).len() as u64;
            assert!(stored <= lines, "{stored} of {lines} stored");
            if stored == lines { Ok(()) } else { Err(stored) }
        },
    );
}
