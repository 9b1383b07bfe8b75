//! Users and ACLs end to end with the real `malachi` binary (ADR 0150): a
//! broker with `security.authentication = "scram"` and a bootstrap
//! superuser; the CLI creates a user, which is refused until granted,
//! then produces and consumes as it (credentials by flags and by
//! environment); a wrong password is one clear, final line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use common::{bin, err, one_line_failure, out};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

#[path = "support/configured_broker.rs"]
mod configured_broker;

use configured_broker::{Broker, start_with_config};

fn start(dir: &Path) -> Broker {
    let admin_pw = dir.join("admin.pw");
    std::fs::write(&admin_pw, "admin-secret\n").unwrap();
    let config = format!(
        "[security]\nauthentication = \"scram\"\nsuperusers = [\"User:admin\"]\nscram_iterations = 4096\nbootstrap_user = \"admin\"\nbootstrap_password_file = {:?}\n",
        admin_pw.display().to_string()
    );
    start_with_config(dir, &config, "the secure broker")
}

/// `malachi ARGS` against `broker` with `stdin`, and `env` set.
fn run(broker: &str, args: &[&str], env: &[(&str, &Path)], stdin: &str) -> Output {
    use std::io::Write;
    let mut command = Command::new(bin());
    command
        .args(args)
        .env("MALACHI_BROKER", broker)
        .env_remove("RUST_LOG")
        .env_remove("MALACHI_USER")
        .env_remove("MALACHI_PASSWORD_FILE");
    for (name, value) in env {
        command.env(name, value);
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

fn ok(output: Output) -> String {
    assert!(output.status.success(), "stderr: {}", err(&output));
    out(&output)
}

#[test]
fn a_user_is_created_granted_and_produces_and_consumes_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let b = broker.addr.as_str();
    let admin_pw = dir.path().join("admin.pw");
    let admin_pw_text = admin_pw.display().to_string();
    let as_admin = ["--user", "admin", "--password-file", admin_pw_text.as_str()];
    let alice_pw = dir.path().join("alice.pw");
    std::fs::write(&alice_pw, "alice-secret\n").unwrap();
    let wrong_pw = dir.path().join("wrong.pw");
    std::fs::write(&wrong_pw, "not-it\n").unwrap();

    // Without a login, nothing but the login is served.
    let line = one_line_failure(&run(b, &["topic", "list"], &[], ""));
    assert!(
        line.contains("unauthorized") && line.contains("log in"),
        "{line}"
    );

    // The broker creates its bootstrap superuser in the background.
    malachi_testkit::wait::wait_until_blocking(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            run(b, &[&["user", "list"][..], &as_admin[..]].concat(), &[], "")
                .status
                .success()
        },
    );
    let alice_pw_text = alice_pw.display().to_string();
    let created = ok(run(
        b,
        &[
            &[
                "user",
                "create",
                "alice",
                "--new-password-file",
                alice_pw_text.as_str(),
            ][..],
            &["--iterations", "4096"][..],
            &as_admin[..],
        ]
        .concat(),
        &[],
        "",
    ));
    assert_eq!(created, "user alice created\n");
    ok(run(
        b,
        &[&["topic", "create", "orders"][..], &as_admin[..]].concat(),
        &[],
        "",
    ));
    let listed = ok(run(
        b,
        &[&["user", "list"][..], &as_admin[..]].concat(),
        &[],
        "",
    ));
    assert!(listed.contains("alice  iterations=4096"), "{listed}");

    // alice, by environment: refused until granted.
    let alice_env = [
        ("MALACHI_USER", Path::new("alice")),
        ("MALACHI_PASSWORD_FILE", alice_pw.as_path()),
    ];
    let refused = run(b, &["produce", "orders"], &alice_env, "k1\thello\n");
    assert!(!refused.status.success());
    let stderr = err(&refused);
    assert!(
        stderr.contains("0 of 1 records were acknowledged")
            && stderr.contains("unauthorized: User:alice may not describe topic `orders`"),
        "{stderr}"
    );
    for operation in ["produce", "consume"] {
        let added = ok(run(
            b,
            &[
                &[
                    "acl",
                    "add",
                    "--principal",
                    "User:alice",
                    "--topic",
                    "orders",
                ][..],
                &["--operation", operation][..],
                &as_admin[..],
            ]
            .concat(),
            &[],
            "",
        ));
        assert_eq!(
            added,
            format!("added allow User:alice {operation} topic orders\n")
        );
    }
    let acls = ok(run(
        b,
        &[&["acl", "list"][..], &as_admin[..]].concat(),
        &[],
        "",
    ));
    insta::assert_snapshot!("acl_list_after_grants", acls);

    // Granted: the next command sees the entries (a fresh login reads them).
    malachi_testkit::wait::wait_until_blocking(
        "alice may produce",
        Duration::from_secs(5),
        Duration::from_millis(100),
        || {
            run(b, &["produce", "orders"], &alice_env, "k1\thello\n")
                .status
                .success()
        },
    );
    let consumed = ok(run(
        b,
        &[
            "consume",
            "orders",
            "--from-start",
            "--user",
            "alice",
            "--password-file",
            alice_pw_text.as_str(),
            "--json",
        ],
        &[],
        "",
    ));
    assert!(consumed.contains("\"value\":\"hello\""), "{consumed}");

    // A wrong password: one final line naming the refusal.
    let wrong_text = wrong_pw.display().to_string();
    let line = one_line_failure(&run(
        b,
        &[
            "topic",
            "list",
            "--user",
            "alice",
            "--password-file",
            wrong_text.as_str(),
        ],
        &[],
        "",
    ));
    assert!(
        line.contains("authentication") && line.contains("invalid-proof"),
        "{line}"
    );
}
