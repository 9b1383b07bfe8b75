//! The broker's configuration from outside: one TOML file, `MALACHI_*`
//! environment variables, then flags, each overriding the one before;
//! everything validated before start, a bad config exiting non-zero with one
//! clear line. `malachi broker --check` prints the layered result.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::path::Path;
use std::process::{Command, Output};

use common::{bin, err, one_line_failure, out};

fn check(config: Option<&Path>, env: &[(&str, &str)], flags: &[&str]) -> Output {
    let mut command = Command::new(bin());
    command.arg("broker");
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    for var in [
        "MALACHI_NODE_ID",
        "MALACHI_LISTEN",
        "MALACHI_ADMIN_LISTEN",
        "MALACHI_DATA_DIR",
        "MALACHI_CONFIG",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied()).args(flags).arg("--check");
    command.output().unwrap()
}

fn value(toml_text: &str, key: &str) -> String {
    let table: toml::Table = toml::from_str(toml_text).unwrap();
    table[key].to_string()
}

#[test]
fn the_file_then_the_environment_then_flags_take_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        "node_id = 3\nlisten_addr = \"127.0.0.1:5001\"\nadmin_addr = \"127.0.0.1:5002\"\ndata_dir = \"from-file\"\nsegment_bytes_max = 1048576\n",
    )
    .unwrap();
    let output = check(
        Some(&config),
        &[
            ("MALACHI_LISTEN", "127.0.0.1:6001"),
            ("MALACHI_DATA_DIR", "from-env"),
        ],
        &["--data-dir", "from-flag"],
    );
    assert!(output.status.success(), "{}", err(&output));
    let text = out(&output);
    assert_eq!(value(&text, "node_id"), "3", "file");
    assert_eq!(value(&text, "segment_bytes_max"), "1048576", "file");
    assert_eq!(value(&text, "admin_addr"), "\"127.0.0.1:5002\"", "file");
    assert_eq!(
        value(&text, "listen_addr"),
        "\"127.0.0.1:6001\"",
        "env over file"
    );
    assert_eq!(value(&text, "data_dir"), "\"from-flag\"", "flag over env");
}

#[test]
fn without_configuration_the_defaults_of_cli_md_apply() {
    let output = check(None, &[], &[]);
    assert!(output.status.success(), "{}", err(&output));
    let text = out(&output);
    assert_eq!(value(&text, "listen_addr"), "\"127.0.0.1:4040\"");
    assert_eq!(value(&text, "admin_addr"), "\"127.0.0.1:8080\"");
    assert_eq!(value(&text, "data_dir"), "\"malachi-data\"");
}

#[test]
fn an_unknown_key_in_the_file_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, "lisen_addr = \"127.0.0.1:1\"\n").unwrap();
    let line = one_line_failure(&check(Some(&config), &[], &[]));
    assert!(line.contains("invalid configuration"), "{line}");
    assert!(line.contains("lisen_addr"), "{line}");
}

#[test]
fn a_missing_config_file_is_refused_with_its_path() {
    let line = one_line_failure(&check(
        Some(Path::new("/nonexistent/broker.toml")),
        &[],
        &[],
    ));
    assert!(line.contains("/nonexistent/broker.toml"), "{line}");
}

#[test]
fn a_zero_node_id_from_the_environment_is_refused() {
    let line = one_line_failure(&check(None, &[("MALACHI_NODE_ID", "0")], &[]));
    assert!(line.contains("node_id"), "{line}");
}

#[test]
fn a_listen_address_without_a_port_is_refused() {
    let line = one_line_failure(&check(None, &[], &["--listen", "localhost"]));
    assert!(line.contains("host:port"), "{line}");
}

#[test]
fn a_malformed_attribute_is_refused() {
    let line = one_line_failure(&check(None, &[], &["--attr", "zone"]));
    assert!(line.contains("KEY=VALUE"), "{line}");
}

#[test]
fn a_broker_that_cannot_bind_its_port_exits_non_zero_with_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let admin = format!("127.0.0.1:{}", common::free_port());
    let output = Command::new(bin())
        .args([
            "broker",
            "--listen",
            &addr,
            "--admin-listen",
            &admin,
            "--data-dir",
        ])
        .arg(dir.path())
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let line = one_line_failure(&output);
    assert!(line.contains(&addr), "{line}");
}

#[test]
fn a_broker_refuses_a_data_dir_another_node_created_and_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let start = |node: &str| {
        let mut command = Command::new(bin());
        for var in ["MALACHI_NODE_ID", "MALACHI_DATA_DIR", "MALACHI_CONFIG"] {
            command.env_remove(var);
        }
        command
            .args(["broker", "--node-id", node, "--data-dir"])
            .arg(&data)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .output()
            .unwrap()
    };
    // Node 2 created it (its first start records the id) ...
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("NODE"), "node_id = 2\n").unwrap();
    // ... so node 1 is refused before it opens anything.
    let line = one_line_failure(&start("1"));
    assert!(line.contains("belongs to node 2, not node 1"), "{line}");
    assert!(!data.join("segments").exists(), "nothing was opened");
}
