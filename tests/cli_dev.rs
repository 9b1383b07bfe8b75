//! `malachi dev` as a newcomer runs it: three brokers, the banner on
//! stdout, a quiet terminal (no warning or error while the cluster forms and
//! serves), the info log in `DATA_DIR/dev.log`, and a working topic.
//!
//! `malachi dev` takes the fixed ports 4040-4042 and 8080-8082 its banner
//! names; no other test binds them (the others pick from 20000-32000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, err, malachi, out};

const BANNER_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn dev_starts_three_brokers_with_a_quiet_terminal_and_serves_a_topic() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let stderr_path = dir.path().join("stderr");
    let mut dev = Command::new(BIN)
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
    assert!(
        banner.contains("malachi dev: 3 brokers serving, one cluster"),
        "{banner}"
    );
    assert!(
        banner.contains("3 copies, a produce is acknowledged once 2 hold it"),
        "{banner}"
    );
    assert!(banner.contains("dev.log"), "{banner}");

    // What the banner suggests works, through another broker than the
    // one the topic is created on.
    let broker = "127.0.0.1:4040";
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let created = malachi(broker, &["topic", "create", "demo"], "");
        if created.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "topic create kept failing: {}",
            err(&created)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
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

    // Everything so far: not one warning or error on the terminal.
    let terminal = std::fs::read_to_string(&stderr_path).unwrap();
    let loud: Vec<&str> = terminal
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(loud.is_empty(), "the terminal got:\n{}", loud.join("\n"));
    // The info log went to the file.
    let log = std::fs::read_to_string(data.join("dev.log")).unwrap();
    assert!(log.contains(" INFO "), "dev.log holds the info log");

    let _ = Command::new("kill")
        .args(["-INT", &dev.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = dev.kill();
            panic!("dev did not stop on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
