//! `malachi dev --secure` end to end with the CLI (issue 39): a throwaway
//! CA, TLS and SCRAM logins on loopback, mutual TLS between its three
//! brokers, and a banner that says how to connect. What it prints works: with the environment it names, a topic
//! is created, written and read; without TLS, or without a login, the
//! CLI gets one clear line and nothing is done; the client certificate it
//! made logs in too.
//!
//! `malachi dev` takes the fixed ports 4040-4042 and 8080-8082: this
//! binary runs one dev at a time, as `cli_dev` does (cargo runs test
//! binaries one after another).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use malachi_testkit::process::{bin, err, lines_of, out};
use malachi_testkit::wait::{Wait, wait_until_blocking};

const BANNER_TIMEOUT: Duration = Duration::from_secs(60);

/// The CLI against dev's broker with `env` set (and nothing inherited of
/// the test's own `MALACHI_*`).
fn cli(env: &[(&str, &Path)], args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut command = Command::new(bin());
    command.args(args).args(["--broker", "127.0.0.1:4040"]);
    for key in [
        "MALACHI_TLS_CA",
        "MALACHI_TLS_CERT",
        "MALACHI_TLS_KEY",
        "MALACHI_USER",
        "MALACHI_PASSWORD_FILE",
        "MALACHI_BROKER",
    ] {
        command.env_remove(key);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

#[test]
fn dev_secure_serves_tls_and_logins_as_its_banner_says() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut dev = Command::new(bin())
        // Three brokers: a topic's three copies travel between them over
        // mutual TLS (ADR 0151), with the certificate `--secure` made.
        .args(["dev", "--secure", "--nodes", "3", "--data-dir"])
        .arg(&data)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = lines_of(dev.stdout.take().unwrap());
    let deadline = Instant::now() + BANNER_TIMEOUT;
    let mut banner = String::new();
    while !banner.contains("MALACHI_TLS_KEY") {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = dev.kill();
            panic!("no secure banner within {BANNER_TIMEOUT:?}:\n{banner}");
        };
        banner.push_str(&line);
        banner.push('\n');
    }
    assert!(
        banner.contains("admin on https://"),
        "the admin port speaks TLS, and the banner says so:\n{banner}"
    );
    let secure = data.join("secure");
    for file in ["ca.pem", "admin.pw"] {
        assert!(
            banner.contains(&secure.join(file).display().to_string()),
            "the banner names {file}:\n{banner}"
        );
    }
    let (ca, pw) = (secure.join("ca.pem"), secure.join("admin.pw"));
    let user = Path::new("admin");
    let full: [(&str, &Path); 3] = [
        ("MALACHI_TLS_CA", &ca),
        ("MALACHI_USER", user),
        ("MALACHI_PASSWORD_FILE", &pw),
    ];
    wait_until_blocking(
        "topic create with the banner's environment",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let created = cli(&full, &["topic", "create", "safe"], "");
            if created.status.success() {
                Ok(())
            } else {
                Err(err(&created))
            }
        },
    );
    let produced = cli(&full, &["produce", "safe"], "k1\thello\nk2\tworld\n");
    assert!(produced.status.success(), "{}", err(&produced));
    let consumed = cli(
        &full,
        &["consume", "safe", "--from-start", "--max", "2"],
        "",
    );
    assert!(consumed.status.success(), "{}", err(&consumed));
    assert!(out(&consumed).contains("hello") && out(&consumed).contains("world"));

    // Without TLS: one line, refused.
    let plain = cli(&full[1..], &["topic", "list"], "");
    assert!(!plain.status.success());
    assert!(err(&plain).contains("speaks TLS only"), "{}", err(&plain));
    // TLS without a login: refused, and nothing is created.
    let anonymous = cli(&full[..1], &["topic", "create", "sneaky"], "");
    assert!(!anonymous.status.success());
    assert!(
        err(&anonymous).contains("unauthorized"),
        "{}",
        err(&anonymous)
    );
    let listed = cli(&full, &["topic", "list"], "");
    assert!(out(&listed).contains("safe") && !out(&listed).contains("sneaky"));
    // The client certificate dev made logs in as `admin` without a password.
    let (cert, key) = (secure.join("admin.pem"), secure.join("admin.key"));
    let by_cert = cli(
        &[
            ("MALACHI_TLS_CA", &ca),
            ("MALACHI_TLS_CERT", &cert),
            ("MALACHI_TLS_KEY", &key),
        ],
        &["topic", "list"],
        "",
    );
    assert!(by_cert.status.success(), "{}", err(&by_cert));
    assert!(out(&by_cert).contains("safe"));

    let _ = Command::new("kill")
        .args(["-INT", &dev.id().to_string()])
        .status();
    let status = Wait::new(
        "dev to stop on SIGINT",
        Duration::from_secs(30),
        Duration::from_millis(100),
    )
    .try_until_blocking(|| dev.try_wait().unwrap());
    match status {
        Ok(status) => assert!(status.success(), "dev exited with {status}"),
        Err(timed_out) => {
            let _ = dev.kill();
            panic!("{timed_out}");
        }
    }
}
