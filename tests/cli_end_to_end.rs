//! The command line end to end against a broker process: create a topic,
//! produce from stdin, consume from the start and resume with the printed
//! cursor, describe the topic, show the tree; in text and in `--json`.
//! Errors (missing topic, bad cursor, unreachable broker) print one line on
//! stderr and exit non-zero. Each test runs its own broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use common::{BrokerProcess, err, malachi, ok, one_line_failure, out};
use malachi_testkit::wait::wait_until_blocking;
use serde_json::Value;

/// A broker of its own for each test, stopped when the test ends (a
/// shared one in a static would outlive the test process's last test).
struct Running {
    broker: BrokerProcess,
    _dir: tempfile::TempDir,
}

impl Running {
    fn addr(&self) -> &str {
        &self.broker.client_addr
    }
}

fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"));
    Running { broker, _dir: dir }
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn cursor_of(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("cursor: "))
        .unwrap_or_else(|| panic!("no cursor line in {stderr:?}"))
        .to_owned()
}

#[test]
fn text_mode_creates_produces_consumes_and_resumes_with_the_printed_cursor() {
    let running = start();
    let b = running.addr();
    let created = ok(malachi(b, &["topic", "create", "e2e-text"], ""));
    assert!(
        out(&created).starts_with("created topic e2e-text"),
        "{}",
        out(&created)
    );

    let produced = ok(malachi(
        b,
        &["produce", "e2e-text"],
        "k1\tone\nk2\ttwo\nk1\tthree\nk3\tfour\n",
    ));
    assert!(
        out(&produced).starts_with("4 of 4 records acknowledged"),
        "{}",
        out(&produced)
    );

    let first = ok(malachi(
        b,
        &["consume", "e2e-text", "--from-start", "--max", "2"],
        "",
    ));
    assert_eq!(out(&first), "k1\tone\nk2\ttwo\n");
    let cursor = cursor_of(&err(&first));

    let rest = ok(malachi(
        b,
        &["consume", "e2e-text", "--cursor", &cursor],
        "",
    ));
    assert_eq!(out(&rest), "k1\tthree\nk3\tfour\n");

    // The cursor after the end resumes with nothing new, then with what comes next.
    let end = cursor_of(&err(&rest));
    let none = ok(malachi(b, &["consume", "e2e-text", "--cursor", &end], ""));
    assert_eq!(out(&none), "");
    ok(malachi(
        b,
        &["produce", "e2e-text", "--key", "k9"],
        "five\n",
    ));
    let next = ok(malachi(b, &["consume", "e2e-text", "--cursor", &end], ""));
    assert_eq!(out(&next), "k9\tfive\n");
}

#[test]
fn json_mode_round_trips_text_binary_and_headers_and_ends_with_the_cursor() {
    let running = start();
    let b = running.addr();
    let created = ok(malachi(b, &["topic", "create", "e2e-json", "--json"], ""));
    assert_eq!(json_lines(&out(&created))[0]["created"], "e2e-json");

    let input = concat!(
        r#"{"key":"k1","value":"one","headers":{"h":"x"}}"#,
        "\n",
        r#"{"key_b64":"AP8=","value_b64":"/w=="}"#,
        "\n",
        r#"{"key":"k1","value":"three"}"#,
        "\n"
    );
    let produced = ok(malachi(b, &["produce", "e2e-json", "--json"], input));
    let summary = &json_lines(&out(&produced))[0];
    assert_eq!(summary["records_acknowledged"], 3);
    assert_eq!(summary["records_sent"], 3);

    let first = ok(malachi(
        b,
        &[
            "consume",
            "e2e-json",
            "--from-start",
            "--max",
            "2",
            "--json",
        ],
        "",
    ));
    let lines = json_lines(&out(&first));
    assert_eq!(lines.len(), 3, "two records then the cursor");
    assert_eq!(lines[0]["key"], "k1");
    assert_eq!(lines[0]["value"], "one");
    assert_eq!(lines[0]["headers"]["h"], "x");
    assert_eq!(lines[1]["key_b64"], "AP8=");
    assert_eq!(lines[1]["value_b64"], "/w==");
    let cursor = lines[2]["cursor"].as_str().unwrap().to_owned();
    assert_eq!(err(&first), "", "nothing on stderr in json mode");

    let rest = ok(malachi(
        b,
        &["consume", "e2e-json", "--cursor", &cursor, "--json"],
        "",
    ));
    let lines = json_lines(&out(&rest));
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["value"], "three");
    assert!(lines[1]["cursor"].is_string());
}

#[test]
fn describe_shows_the_ranges_and_segments_in_text_and_json() {
    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-describe"], ""));
    ok(malachi(b, &["produce", "e2e-describe"], "a\t1\n"));

    let text = out(&ok(malachi(b, &["topic", "describe", "e2e-describe"], "")));
    // created_at_ms and the measured rates change from run to run.
    let stable: String = text
        .lines()
        .map(|l| {
            if let Some(at) = l.find(" created_at_ms ") {
                format!("{} created_at_ms [redacted]", &l[..at])
            } else if let Some(at) = l.find(" bytes_per_second ") {
                format!("{} bytes_per_second [redacted]", &l[..at])
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!(stable);

    let json = out(&ok(malachi(
        b,
        &["topic", "describe", "e2e-describe", "--json"],
        "",
    )));
    let value: Value = serde_json::from_str(json.trim()).unwrap();
    insta::assert_json_snapshot!(value, {
        ".created_at_ms" => "[created_at_ms]",
        ".ranges[].created_at_ms" => "[created_at_ms]",
        ".ranges[].segments[].created_at_ms" => "[created_at_ms]",
        ".ranges[].segments[].epoch" => "[epoch]",
        ".reshaping.rates[].write_bytes_per_second" => "[measured]",
        ".reshaping.rates[].write_records_per_second" => "[measured]",
    });

    let list = out(&ok(malachi(b, &["topic", "list", "--json"], "")));
    assert!(
        json_lines(&list)
            .iter()
            .any(|t| t["name"] == "e2e-describe"),
        "{list}"
    );
}

#[test]
fn tree_shows_the_live_supervision_tree_in_text_and_json() {
    let running = start();
    let b = running.addr();
    let text = out(&ok(malachi(b, &["tree"], "")));
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("broker one_for_one (node 1)"), "{text}");
    for name in ["storage", "metadata", "listener", "acceptor", "admin_http"] {
        assert!(
            text.lines().any(|l| l.contains(&format!("── {name} "))),
            "{name} missing from:\n{text}"
        );
    }
    assert!(text.contains("restarts="), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("restarts in total: "),
        "{text}"
    );

    let json = out(&ok(malachi(b, &["tree", "--json"], "")));
    let value: Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["node_id"], 1);
    assert_eq!(value["root"]["name"], "broker");
    let children = value["root"]["children"].as_array().unwrap();
    assert!(children.iter().all(|c| c["restarts"].is_u64()), "{json}");
}

#[test]
fn cluster_status_lists_this_broker_in_text_and_json() {
    let running = start();
    let b = running.addr();
    let text = out(&ok(malachi(b, &["cluster", "status"], "")));
    assert!(text.contains(b), "{text}");
    let json = out(&ok(malachi(b, &["cluster", "status", "--json"], "")));
    let lines = json_lines(&json);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["node_id"], 1);
    assert_eq!(lines[0]["client_addr"], b);
}

#[test]
fn consuming_a_missing_topic_fails_with_one_line() {
    let line = one_line_failure(&malachi(
        start().addr(),
        &["consume", "no-such-topic", "--from-start"],
        "",
    ));
    assert!(line.contains("topic_not_found"), "{line}");
}

#[test]
fn describing_a_missing_topic_fails_with_one_line() {
    let line = one_line_failure(&malachi(
        start().addr(),
        &["topic", "describe", "no-such-topic"],
        "",
    ));
    assert!(line.contains("topic_not_found"), "{line}");
}

#[test]
fn a_bad_cursor_fails_with_one_line() {
    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-cursor"], ""));
    let line = one_line_failure(&malachi(
        b,
        &["consume", "e2e-cursor", "--cursor", "not-a-cursor"],
        "",
    ));
    assert!(line.contains("invalid_cursor"), "{line}");
}

#[test]
fn creating_a_topic_twice_fails_with_one_line() {
    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-twice"], ""));
    let line = one_line_failure(&malachi(b, &["topic", "create", "e2e-twice"], ""));
    assert!(line.contains("topic_exists"), "{line}");
}

#[test]
fn a_malformed_input_line_fails_naming_its_line_number() {
    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-input"], ""));
    let line = one_line_failure(&malachi(
        b,
        &["produce", "e2e-input"],
        "k\tv\nno tab here\n",
    ));
    assert!(line.contains("stdin line 2"), "{line}");
}

#[test]
fn an_unreachable_broker_fails_with_one_line_that_says_what_to_do() {
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    let line = one_line_failure(&malachi(&nowhere, &["topic", "list"], ""));
    assert!(line.contains(&nowhere), "{line}");
    assert!(line.contains("malachi dev"), "{line}");
}

#[test]
fn consumer_groups_say_they_are_not_implemented_yet() {
    let line = one_line_failure(&malachi(
        start().addr(),
        &["consume", "x", "--group", "g"],
        "",
    ));
    assert!(
        line.contains("consumer groups are not implemented yet"),
        "{line}"
    );
}

#[test]
fn follow_prints_new_records_as_they_come_and_the_cursor_on_ctrl_c() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-follow"], ""));
    let mut follower = Command::new(common::bin())
        .args([
            "consume",
            "e2e-follow",
            "--from-start",
            "--follow",
            "--broker",
            b,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    ok(malachi(b, &["produce", "e2e-follow"], "k\tlive\n"));
    assert_eq!(lines.next().unwrap().unwrap(), "k\tlive");

    let pid = libc::pid_t::try_from(follower.id()).unwrap();
    // SAFETY: kill(2) takes plain integers and touches no memory of ours;
    // the pid is our own child, not yet reaped.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(rc, 0);
    let output = follower.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", err(&output));
    let cursor = cursor_of(&err(&output));

    ok(malachi(b, &["produce", "e2e-follow"], "k\tafter\n"));
    let resumed = ok(malachi(
        b,
        &["consume", "e2e-follow", "--cursor", &cursor],
        "",
    ));
    assert_eq!(out(&resumed), "k\tafter\n");
}

#[test]
fn split_then_merge_changes_the_ranges_describe_shows_and_keeps_every_record() {
    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-split"], ""));
    ok(malachi(b, &["produce", "e2e-split"], "a\t1\nb\t2\n"));

    let split = out(&ok(malachi(
        b,
        &["topic", "split", "e2e-split", "0", "--json"],
        "",
    )));
    let split = &json_lines(&split)[0];
    assert_eq!(split["range_id"], 0);
    let children: Vec<u64> = split["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(children.len(), 2);

    ok(malachi(b, &["produce", "e2e-split"], "a\t3\nb\t4\n"));
    let described = out(&ok(malachi(
        b,
        &["topic", "describe", "e2e-split", "--json"],
        "",
    )));
    let ranges = json_lines(&described)[0]["ranges"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(ranges.len(), 3, "{described}");

    let child = children[0].to_string();
    let merged = out(&ok(malachi(
        b,
        &["topic", "merge", "e2e-split", &child, "--json"],
        "",
    )));
    let merged = &json_lines(&merged)[0];
    let mut parents: Vec<u64> = merged["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    parents.sort_unstable();
    assert_eq!(parents, children);

    let consumed = out(&ok(malachi(
        b,
        &["consume", "e2e-split", "--from-start"],
        "",
    )));
    let mut per_key: Vec<&str> = consumed.lines().filter(|l| l.starts_with("a\t")).collect();
    assert_eq!(
        per_key,
        vec!["a\t1", "a\t3"],
        "per-key order across the split"
    );
    per_key = consumed.lines().filter(|l| l.starts_with("b\t")).collect();
    assert_eq!(
        per_key,
        vec!["b\t2", "b\t4"],
        "per-key order across the split"
    );
}

#[test]
fn produce_sends_a_line_as_soon_as_it_is_typed_not_only_at_the_end_of_stdin() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    let running = start();
    let b = running.addr();
    ok(malachi(b, &["topic", "create", "e2e-typed"], ""));
    let mut producer = Command::new(common::bin())
        .args(["produce", "e2e-typed", "--broker", b])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = producer.stdin.take().unwrap();
    stdin.write_all(b"k\ttyped\n").unwrap();
    stdin.flush().unwrap();
    wait_until_blocking(
        "the typed line sent while stdin stays open",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let seen = out(&ok(malachi(
                b,
                &["consume", "e2e-typed", "--from-start"],
                "",
            )));
            if seen == "k\ttyped\n" {
                Ok(())
            } else {
                Err(seen)
            }
        },
    );
    drop(stdin);
    let output = producer.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", err(&output));
    assert!(
        out(&output).starts_with("1 of 1 records acknowledged"),
        "{}",
        out(&output)
    );
}

#[test]
fn policies_are_created_listed_described_resolved_and_deleted() {
    let running = start();
    let b = running.addr();
    // A topic may name a policy before it exists: it keeps all its data.
    ok(malachi(
        b,
        &["topic", "create", "e2e-kept", "--policy", "week"],
        "",
    ));
    let before = json_lines(&out(&ok(malachi(
        b,
        &["topic", "describe", "e2e-kept", "--json"],
        "",
    ))));
    assert_eq!(before[0]["policy_resolved"], false);

    let created = ok(malachi(
        b,
        &[
            "policy",
            "create",
            "week",
            "--retention-age",
            "7d",
            "--retention-bytes",
            "10GiB",
        ],
        "",
    ));
    assert_eq!(out(&created), "policy week defined\n");
    let listed = out(&ok(malachi(b, &["policy", "list"], "")));
    assert_eq!(
        listed,
        "week  retention_age=7d  retention_bytes=10737418240  placement=-\n"
    );
    let described = json_lines(&out(&ok(malachi(
        b,
        &["policy", "describe", "week", "--json"],
        "",
    ))));
    assert_eq!(described[0]["retention_age_ms"], 604_800_000u64);
    assert_eq!(described[0]["retention_bytes"], 10_737_418_240u64);
    let after = json_lines(&out(&ok(malachi(
        b,
        &["topic", "describe", "e2e-kept", "--json"],
        "",
    ))));
    assert_eq!(after[0]["policy_resolved"], true);

    let deleted = ok(malachi(b, &["policy", "delete", "week"], ""));
    assert_eq!(out(&deleted), "deleted policy week\n");
    assert_eq!(
        out(&ok(malachi(b, &["policy", "list"], ""))),
        "no policies\n"
    );
    // Describing or deleting a policy that does not exist is one line
    // naming the typed error.
    for form in [
        &["policy", "describe", "week"][..],
        &["policy", "delete", "week"],
    ] {
        let line = one_line_failure(&malachi(b, form, ""));
        assert!(line.contains("policy_not_found"), "{form:?}: {line}");
    }
    // A zero bound is refused before it reaches the broker.
    let refused = malachi(
        b,
        &["policy", "create", "none", "--retention-age", "0s"],
        "",
    );
    assert_eq!(refused.status.code(), Some(2));
}
