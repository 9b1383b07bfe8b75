//! `malachi dev` as a newcomer runs it: three brokers, the banner on
//! stdout, a quiet terminal (no warning or error while the cluster forms,
//! serves and stops on Ctrl-C), the info log in `DATA_DIR/dev.log` (with no
//! warning or error either: every condition of a normal run is expected),
//! and a working topic.
//!
//! `malachi dev` takes the fixed ports 4040-4042 and 8080-8082 its banner
//! names; no other test binds them (the others pick from 20000-32000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, err, malachi, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};

const BANNER_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn dev_starts_three_brokers_with_a_quiet_terminal_and_serves_a_topic() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stderr_path = dir.path().join("stderr");
    let mut dev = Command::new(bin())
        .args(["dev", "--data-dir"])
        .arg(&data)
        .env_remove("RUST_LOG")
        .env_remove("MALACHI_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&stderr_path).unwrap()))
        .spawn()
        .unwrap();
    let rx = common::lines_of(dev.stdout.take().unwrap());
    let deadline = Instant::now() + BANNER_TIMEOUT;
    let mut banner = String::new();
    while !banner.contains("stop with Ctrl-C.") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                banner.push_str(&line);
                banner.push('\n');
            }
            Err(_) => {
                let _ = dev.kill();
                panic!(
                    "no banner within {BANNER_TIMEOUT:?}; stdout:\n{banner}\nstderr:\n{}",
                    std::fs::read_to_string(&stderr_path).unwrap_or_default()
                );
            }
        }
    }
    // What the newcomer reads first, frozen: the ports are dev's fixed
    // ones, the data dir is this test's.
    insta::assert_snapshot!(
        "dev_banner",
        banner.replace(&data.display().to_string(), "[DATA_DIR]")
    );

    // What the banner suggests works, through another broker than the
    // one the topic is created on.
    let broker = "127.0.0.1:4040";
    wait_until_blocking(
        "topic create through dev's second broker",
        READY_TIMEOUT,
        Duration::from_millis(200),
        || {
            let created = malachi(broker, &["topic", "create", "demo"], "");
            if created.status.success() {
                Ok(())
            } else {
                Err(err(&created))
            }
        },
    );
    let produced = malachi(
        "127.0.0.1:4041",
        &["produce", "demo"],
        "k1\thello\nk2\tworld\n",
    );
    assert!(produced.status.success(), "{}", err(&produced));
    let consumed = malachi(
        "127.0.0.1:4042",
        &["consume", "demo", "--from-start", "--max", "2"],
        "",
    );
    assert!(consumed.status.success(), "{}", err(&consumed));
    let records = out(&consumed);
    assert!(
        records.contains("hello") && records.contains("world"),
        "{records}"
    );

    // Everything so far: not one warning or error on the terminal, nor
    // in the info log.
    assert_quiet(
        "the terminal",
        &std::fs::read_to_string(&stderr_path).unwrap(),
    );
    let log = std::fs::read_to_string(data.join("dev.log")).unwrap();
    assert_quiet("dev.log", &log);
    // The info log went to the file.
    assert!(log.contains(" INFO "), "dev.log holds the info log");
    let (terminal_lines, log_lines) = (
        std::fs::read_to_string(&stderr_path)
            .unwrap()
            .lines()
            .count(),
        log.lines().count(),
    );

    // Ctrl-C, right after the traffic: an ordered shutdown, as quiet.
    let _ = Command::new("kill")
        .args(["-INT", &dev.id().to_string()])
        .status();
    let status = Wait::new(
        "dev to stop on SIGINT",
        Duration::from_secs(30),
        Duration::from_millis(100),
    )
    .try_until_blocking(|| dev.try_wait().unwrap());
    let status = match status {
        Ok(status) => status,
        Err(timed_out) => {
            let _ = dev.kill();
            panic!("{timed_out}");
        }
    };
    assert!(status.success(), "dev exited with {status}");
    // The child is gone, so its stdout ends and the reader's channel closes.
    let stopped: Vec<String> = rx.iter().collect();
    assert_eq!(
        stopped,
        [
            "malachi broker: node 3 stopped",
            "malachi broker: node 2 stopped",
            "malachi broker: node 1 stopped"
        ],
        "stdout after the banner"
    );
    let terminal = std::fs::read_to_string(&stderr_path).unwrap();
    let log = std::fs::read_to_string(data.join("dev.log")).unwrap();
    assert_quiet(
        "the terminal at shutdown",
        &terminal
            .lines()
            .skip(terminal_lines)
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let at_shutdown: Vec<&str> = log.lines().skip(log_lines).collect();
    assert_quiet("dev.log at shutdown", &at_shutdown.join("\n"));
    assert!(
        at_shutdown
            .iter()
            .any(|l| l.contains("sigint: shutting down")),
        "dev.log records the shutdown"
    );
}

/// Fails with the lines logged at WARN or ERROR in `text`, if any.
fn assert_quiet(what: &str, text: &str) {
    let loud: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(loud.is_empty(), "{what} got:\n{}", loud.join("\n"));
}
