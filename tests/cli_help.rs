//! The command line's shape, from outside the binary: every form of
//! `/work/shared/design/cli.md` parses, and the help texts are frozen as
//! snapshots (a change to them is a change to a contract users script against).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::process::Command;

use common::{bin, err, one_line_failure, out};

fn help(args: &[&str]) -> String {
    let mut command = Command::new(bin());
    // clap shows an environment variable's value in help when it is set;
    // the snapshot must not depend on the caller's shell.
    for (name, _) in std::env::vars() {
        if name.starts_with("MALACHI_") {
            command.env_remove(name);
        }
    }
    let output = command.args(args).arg("--help").output().unwrap();
    assert!(output.status.success(), "{}", err(&output));
    out(&output)
}

#[test]
fn help_texts_are_stable() {
    let commands: &[&[&str]] = &[
        &[],
        &["broker"],
        &["dev"],
        &["topic"],
        &["topic", "create"],
        &["topic", "describe"],
        &["topic", "split"],
        &["topic", "merge"],
        &["produce"],
        &["consume"],
        &["tree"],
        &["cluster", "status"],
        &["vnode"],
        &["vnode", "split"],
        &["policy"],
        &["policy", "create"],
        &["bench"],
        &["bench", "produce"],
        &["bench", "consume"],
        &["bench", "metadata"],
        &["token", "create"],
        &["token", "key", "add"],
    ];
    for args in commands {
        let name = if args.is_empty() {
            "malachi".to_owned()
        } else {
            format!("malachi_{}", args.join("_"))
        };
        let text = help(args);
        insta::assert_snapshot!(name, text);
    }
}

/// Every client form of cli.md, aimed at a port where nothing listens: a
/// form that parses fails with "cannot reach a broker" (exit 1), a form that
/// does not parse fails with clap's usage error (exit 2).
#[test]
fn every_client_form_of_cli_md_parses() {
    let nowhere = format!("127.0.0.1:{}", common::free_port());
    let forms: &[&[&str]] = &[
        &["topic", "create", "t"],
        &[
            "topic",
            "create",
            "t",
            "--replication-factor",
            "3",
            "--policy",
            "p",
        ],
        &["topic", "list"],
        &["topic", "describe", "t"],
        &["topic", "delete", "t"],
        &["topic", "split", "t", "0"],
        &["topic", "merge", "t", "1"],
        &["produce", "t"],
        &["produce", "t", "--key", "k"],
        &["produce", "t", "--json"],
        &["consume", "t"],
        &["consume", "t", "--cursor", "c", "--max", "3"],
        &["consume", "t", "--from-start", "--max", "3", "--follow"],
        &["tree"],
        &["tree", "--json"],
        &["cluster", "status"],
        &["cluster", "status", "--json"],
        &["cluster", "version"],
        &["cluster", "version", "--json"],
        &["feature", "list"],
        &["feature", "list", "--json"],
        &["feature", "activate", "users"],
        &["feature", "finalize"],
        &["vnode", "list"],
        &["vnode", "list", "--json"],
        &["vnode", "split", "3"],
        &["policy", "list"],
        &["policy", "list", "--json"],
        &["policy", "describe", "week"],
        &["policy", "delete", "week"],
        &[
            "policy",
            "create",
            "week",
            "--retention-age",
            "7d",
            "--retention-bytes",
            "50GiB",
            "--placement",
            "distinct(zone) >= 2",
        ],
        &[
            "bench",
            "metadata",
            "--clients",
            "2",
            "--ops",
            "5",
            "--json",
        ],
        &[
            "bench",
            "produce",
            "--topic",
            "t",
            "--producers",
            "2",
            "--record-size",
            "10",
            "--batch-records",
            "5",
            "--window",
            "2",
            "--duration",
            "1s",
            "--vs-raw",
            "--json",
        ],
        &[
            "bench",
            "consume",
            "--topic",
            "t",
            "--consumers",
            "2",
            "--duration",
            "1s",
            "--json",
        ],
    ];
    for form in forms {
        let output = common::malachi(&nowhere, form, "k\tv\n");
        let line = one_line_failure(&output);
        assert!(
            line.contains("cannot reach a broker"),
            "{form:?} failed otherwise: {line}"
        );
    }
}

#[test]
fn the_broker_forms_of_cli_md_parse() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, "node_id = 3\n").unwrap();
    let output = Command::new(bin())
        .args(["broker", "--config"])
        .arg(&config)
        .args([
            "--node-id",
            "4",
            "--listen",
            "127.0.0.1:4041",
            "--admin-listen",
        ])
        .args([
            "127.0.0.1:8081",
            "--data-dir",
            "d",
            "--seed",
            "10.0.0.1:4040",
        ])
        .args([
            "--seed",
            "10.0.0.2:4040",
            "--attr",
            "zone=a",
            "--attr",
            "rack=1",
            "--check",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", err(&output));
    let dev = Command::new(bin())
        .args(["dev", "--nodes", "1", "--data-dir", "d", "--help"])
        .output()
        .unwrap();
    assert!(dev.status.success(), "{}", err(&dev));
}
