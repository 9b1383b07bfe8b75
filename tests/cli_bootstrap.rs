//! Bootstrap from several brokers (issue 38): `--broker` and
//! `MALACHI_BROKER` take a list, tried in order; a dead address is skipped,
//! and when every one is dead the command fails at once naming each.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use malachi_testkit::process as common;

use common::{BrokerProcess, bin, err, free_port, ok, one_line_failure, out};
use malachi_testkit::process::cli::wait_output;

/// How long a command may take here: far above a healthy run, far below
/// the default `--timeout-ms` (10 s) a dead address must not wait out.
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

fn dead() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `malachi ARGS` with `stdin`, `MALACHI_BROKER` set to `env` (or unset).
fn run(env: Option<&str>, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut command = Command::new(bin());
    command.args(args).env_remove("RUST_LOG");
    match env {
        Some(list) => command.env("MALACHI_BROKER", list),
        None => command.env_remove("MALACHI_BROKER"),
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    wait_output(child, COMMAND_LIMIT)
}

#[test]
fn a_dead_first_broker_is_skipped_by_the_flag_and_by_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BrokerProcess::start(&dir.path().join("data"));
    let live = broker.client_addr.clone();
    let list = format!("{},{live}", dead());

    let created = ok(run(
        None,
        &["topic", "create", "boot", "--broker", &list],
        "",
    ));
    assert!(
        out(&created).starts_with("created topic boot"),
        "{}",
        out(&created)
    );
    ok(run(
        None,
        &["produce", "boot", "--broker", &list],
        "k1\tone\n",
    ));
    // Repeating the flag is the same list.
    let first = dead();
    let repeated = ["produce", "boot", "--broker", &first, "--broker", &live];
    ok(run(None, &repeated, "k2\ttwo\n"));
    // The environment takes the same list, spaces around commas allowed.
    let env = format!("{} , {live}", dead());
    ok(run(Some(&env), &["produce", "boot"], "k3\tthree\n"));
    let consumed = ok(run(Some(&env), &["consume", "boot", "--from-start"], ""));
    let mut lines: Vec<String> = out(&consumed).lines().map(str::to_owned).collect();
    lines.sort();
    assert_eq!(
        lines,
        ["k1\tone", "k2\ttwo", "k3\tthree"],
        "{}",
        err(&consumed)
    );
}

#[test]
fn every_broker_dead_fails_at_once_naming_each_with_the_hint() {
    let (a, b) = (dead(), dead());
    let list = format!("{a},{b}");
    let started = Instant::now();
    let output = run(None, &["topic", "create", "boot", "--broker", &list], "");
    let elapsed = started.elapsed();
    let line = one_line_failure(&output);
    // Refused connections fail in microseconds: well within the default
    // `--timeout-ms` of 10 s, which a dead address must not wait out.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}: {line}");
    assert!(line.contains(&format!("cannot connect to {a}")), "{line}");
    assert!(line.contains(&format!("cannot connect to {b}")), "{line}");
    assert!(
        line.contains("is one running? start one with `malachi dev`"),
        "{line}"
    );
}

#[test]
fn a_bad_broker_list_is_refused_before_anything_is_sent() {
    let line = one_line_failure(&run(Some(" , "), &["topic", "list"], ""));
    assert!(line.contains("--broker names no address"), "{line}");
    let line = one_line_failure(&run(None, &["topic", "list", "--broker", "a:1,a:1"], ""));
    assert!(line.contains("--broker lists a:1 twice"), "{line}");
}
