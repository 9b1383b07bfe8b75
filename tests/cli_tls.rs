//! The `malachi` CLI over TLS (ADR 0149) against a three-broker cluster
//! whose client ports speak TLS: it creates, produces and consumes with
//! `--tls-ca` (and `MALACHI_TLS_CA`); without TLS it gets the broker's
//! clear "speaks TLS only" refusal, and with TLS against a plaintext
//! broker a clear TLS error, never "frame too large". In a rolling move's
//! step (ADR 0162) it is served with and without TLS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use malachi_testkit::process::cluster::Cluster;
use malachi_testkit::process::{BrokerProcess, bin, err, out};
use malachi_testkit::tls::pki;

/// `malachi ARGS` with `stdin`, the bootstrap list `brokers`, and `env`.
fn malachi(brokers: &str, args: &[&str], env: &[(&str, &Path)], stdin: &str) -> Output {
    use std::io::Write;
    let mut command = Command::new(bin());
    command
        .args(args)
        .env("MALACHI_BROKER", brokers)
        .env_remove("RUST_LOG")
        .env_remove("MALACHI_TLS_CA")
        .env_remove("MALACHI_TLS_CERT")
        .env_remove("MALACHI_TLS_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let written = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

/// A `[tls]` table with `files`' broker pair and CA (brokers speak mutual
/// TLS to each other too, ADR 0151), and `extra` lines.
fn tls_table(files: &malachi_testkit::tls::PkiFiles, extra: &str) -> String {
    format!(
        "\n[tls]\ncert_path = \"{}\"\nkey_path = \"{}\"\ncluster_ca_path = \"{}\"\n{extra}",
        files.broker_cert.display(),
        files.broker_key.display(),
        files.ca.display()
    )
}

/// Produces three records to `topic` through `brokers` with `args`, and
/// checks all three were acknowledged.
fn produce_three(brokers: &str, topic: &str, args: &[&str], logs: &dyn Fn() -> String) {
    let mut all = vec!["produce", topic, "--timeout-ms", "30000"];
    all.extend_from_slice(args);
    let produced = malachi(brokers, &all, &[], "k1\tone\nk2\ttwo\nk1\tthree\n");
    succeeded(&produced, logs);
    assert!(
        out(&produced).starts_with("3 of 3 records acknowledged"),
        "{}",
        out(&produced)
    );
}

/// Creates `topic` over TLS; elections may still run, so the create
/// retries within its deadline.
fn create_with_tls(brokers: &str, topic: &str, ca: &str, logs: &dyn Fn() -> String) {
    let args = [
        "topic",
        "create",
        topic,
        "--tls-ca",
        ca,
        "--timeout-ms",
        "60000",
    ];
    succeeded(&malachi(brokers, &args, &[], ""), logs);
}

/// Reads `produce_three`'s records back from `broker`, TLS from the
/// environment (`MALACHI_TLS_CA`).
fn consume_three_with_env_tls(broker: &str, topic: &str, ca: &Path, logs: &dyn Fn() -> String) {
    let args = [
        "consume",
        topic,
        "--from-start",
        "--max",
        "3",
        "--timeout-ms",
        "30000",
    ];
    let consumed = malachi(broker, &args, &[("MALACHI_TLS_CA", ca)], "");
    succeeded(&consumed, logs);
    assert_eq!(out(&consumed), "k1\tone\nk2\ttwo\nk1\tthree\n");
}

fn succeeded(output: &Output, logs: &dyn Fn() -> String) {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}\nlogs:\n{}",
        out(output),
        err(output),
        logs()
    );
}

#[test]
fn the_cli_produces_and_consumes_over_tls_and_plaintext_is_told_apart() {
    let root = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(root.path());
    let cluster = Cluster::three_with(root.path(), &tls_table(&files, ""));
    let logs = || cluster.logs();
    let all = cluster.clients().join(",");
    let ca = files.ca.to_str().unwrap();
    // Elections may still run: the create retries within its deadline.
    create_with_tls(&all, "secure", ca, &logs);
    produce_three(&cluster.clients()[0], "secure", &["--tls-ca", ca], &logs);
    // From another broker, TLS from the environment.
    consume_three_with_env_tls(&cluster.clients()[2], "secure", &files.ca, &logs);
    // Without TLS: the broker's refusal, in one line.
    let plain = malachi(&cluster.clients()[1], &["topic", "list"], &[], "");
    assert!(!plain.status.success());
    assert!(err(&plain).contains("speaks TLS only"), "{}", err(&plain));
    assert_eq!(err(&plain).trim_end().lines().count(), 1, "{}", err(&plain));
}

#[test]
fn the_cli_with_tls_against_a_plaintext_broker_says_so() {
    let root = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(root.path());
    let broker = BrokerProcess::start(&root.path().join("data"));
    let ca = files.ca.to_str().unwrap();
    let output = malachi(
        &broker.client_addr,
        &["topic", "list", "--tls-ca", ca],
        &[],
        "",
    );
    assert!(!output.status.success());
    let text = err(&output);
    assert!(text.contains("plaintext"), "{text}");
    assert!(!text.contains("too large"), "{text}");
}

/// The middle of a rolling move to TLS (ADR 0162), from a TOML config:
/// brokers on `tls.cluster = "send"` replicate over TLS while taking
/// plaintext, and `tls.client_ports = "accept"` serves the CLI with and
/// without `--tls-ca`.
#[test]
fn a_cluster_in_a_rolling_moves_step_serves_the_cli_with_and_without_tls() {
    let root = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(root.path());
    let steps = "cluster = \"send\"\nclient_ports = \"accept\"\n";
    let cluster = Cluster::three_with(root.path(), &tls_table(&files, steps));
    let logs = || cluster.logs();
    let all = cluster.clients().join(",");
    let ca = files.ca.to_str().unwrap();
    create_with_tls(&all, "moving", ca, &logs);
    // Plaintext, as clients not moved yet.
    produce_three(&all, "moving", &[], &logs);
    consume_three_with_env_tls(&cluster.clients()[2], "moving", &files.ca, &logs);
}
