//! The client config file with the real `malachi` binary (issue 39):
//! against one broker with TLS on its client port and SCRAM logins, the
//! CA, user and password file come from `--client-config`, from
//! `MALACHI_CLIENT_CONFIG` and from `~/.config/malachi/client.toml`; a
//! flag beats its environment variable, which beats the file; a bad file
//! is one line naming the file and the key.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use malachi_testkit::process::{bin, err, one_line_failure, out};
use malachi_testkit::tls::pki;

#[path = "support/configured_broker.rs"]
mod configured_broker;

use configured_broker::{Broker, start_with_config};

/// A broker whose client port speaks TLS only and takes SCRAM logins,
/// `admin` its superuser (password in `dir/admin.pw`); the CA in `dir`.
/// The lockout's delay is 1 ms: the test's one wrong password must not
/// delay the logins after it.
fn start(dir: &Path) -> (Broker, std::path::PathBuf) {
    let (_ca, files) = pki(dir);
    std::fs::write(dir.join("admin.pw"), "admin-secret\n").unwrap();
    let config = format!(
        "[tls]\ncert_path = {:?}\nkey_path = {:?}\ncluster = \"off\"\n\n[security]\nauthentication = \"scram\"\nsuperusers = [\"User:admin\"]\nscram_iterations = 4096\nbootstrap_user = \"admin\"\nbootstrap_password_file = {:?}\nlockout_delay_first_ms = 1\nlockout_delay_max_ms = 1\n",
        files.broker_cert.display().to_string(),
        files.broker_key.display().to_string(),
        dir.join("admin.pw").display().to_string(),
    );
    let broker = start_with_config(dir, &config, "the TLS broker");
    (broker, files.ca)
}

/// `malachi ARGS` against `broker` with `env` set, none of the test's own
/// `MALACHI_*` and no home directory of its own unless `env` gives one.
fn run(broker: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(bin());
    command
        .args(args)
        .env("MALACHI_BROKER", broker)
        .env_remove("RUST_LOG")
        .env("HOME", "/nonexistent")
        .env_remove("XDG_CONFIG_HOME");
    for key in [
        "MALACHI_TLS_CA",
        "MALACHI_TLS_CERT",
        "MALACHI_TLS_KEY",
        "MALACHI_USER",
        "MALACHI_PASSWORD_FILE",
        "MALACHI_CLIENT_CONFIG",
    ] {
        command.env_remove(key);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn ok(output: Output) -> String {
    assert!(output.status.success(), "stderr: {}", err(&output));
    out(&output)
}

#[test]
fn the_cli_reads_its_credentials_from_the_client_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, ca) = start(dir.path());
    let b = broker.addr.as_str();
    std::fs::write(dir.path().join("wrong.pw"), "not-it\n").unwrap();
    // Relative paths are read from the file's directory.
    let file = dir.path().join("client.toml");
    std::fs::write(
        &file,
        "tls_ca = \"ca.pem\"\nuser = \"admin\"\npassword_file = \"admin.pw\"\n",
    )
    .unwrap();
    assert!(ca.starts_with(dir.path()) && ca.ends_with("ca.pem"));
    let file_text = file.display().to_string();

    // --client-config: the broker creates its superuser in the background.
    malachi_testkit::wait::wait_until_blocking(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            run(
                b,
                &[
                    "topic",
                    "create",
                    "configured",
                    "--client-config",
                    &file_text,
                ],
                &[],
            )
            .status
            .success()
        },
    );
    // MALACHI_CLIENT_CONFIG.
    let listed = ok(run(
        b,
        &["topic", "list"],
        &[("MALACHI_CLIENT_CONFIG", file.as_path())],
    ));
    assert!(listed.contains("configured"), "{listed}");
    // The default file, under XDG_CONFIG_HOME.
    let xdg = dir.path().join("xdg");
    std::fs::create_dir_all(xdg.join("malachi")).unwrap();
    std::fs::write(
        xdg.join("malachi").join("client.toml"),
        format!(
            "tls_ca = {:?}\nuser = \"admin\"\npassword_file = {:?}\n",
            ca.display().to_string(),
            dir.path().join("admin.pw").display().to_string()
        ),
    )
    .unwrap();
    let listed = ok(run(
        b,
        &["topic", "list"],
        &[("XDG_CONFIG_HOME", xdg.as_path())],
    ));
    assert!(listed.contains("configured"), "{listed}");

    // Precedence: a flag beats its environment variable, which beats the
    // file (here the file's password is the wrong one).
    let wrong_file = dir.path().join("wrong.toml");
    std::fs::write(
        &wrong_file,
        "tls_ca = \"ca.pem\"\nuser = \"admin\"\npassword_file = \"wrong.pw\"\n",
    )
    .unwrap();
    let wrong_text = wrong_file.display().to_string();
    let line = one_line_failure(&run(
        b,
        &["topic", "list", "--client-config", &wrong_text],
        &[],
    ));
    assert!(line.contains("invalid-proof"), "{line}");
    let right_pw = dir.path().join("admin.pw");
    let wrong_pw = dir.path().join("wrong.pw");
    let by_env = run(
        b,
        &["topic", "list", "--client-config", &wrong_text],
        &[("MALACHI_PASSWORD_FILE", right_pw.as_path())],
    );
    assert!(ok(by_env).contains("configured"));
    let right_text = right_pw.display().to_string();
    let by_flag = run(
        b,
        &[
            "topic",
            "list",
            "--client-config",
            &wrong_text,
            "--password-file",
            &right_text,
        ],
        &[("MALACHI_PASSWORD_FILE", wrong_pw.as_path())],
    );
    assert!(ok(by_flag).contains("configured"));
}

#[test]
fn a_bad_client_config_file_is_one_line_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client.toml");
    let text = file.display().to_string();
    // No broker is needed: the file is read before anything connects.
    let b = "127.0.0.1:1";
    let cases = [
        (
            "tls_ca = \"ca.pem\"\npasword_file = \"pw\"\n",
            "pasword_file",
        ),
        ("user = 7\n", "user"),
        ("tls_cert = \"c.pem\"\n", "tls_key"),
        ("password_file = \"pw\"\n", "password_file"),
        // A token and a user are two logins.
        ("token_file = \"t.jwt\"\nuser = \"alice\"\n", "token_file"),
    ];
    for (body, key) in cases {
        std::fs::write(&file, body).unwrap();
        let line = one_line_failure(&run(b, &["topic", "list", "--client-config", &text], &[]));
        assert!(
            line.contains(&format!("client config {text}: {key}:")),
            "{body:?}: {line}"
        );
    }
    std::fs::write(&file, "user = \"admin\"\n[[broken\n").unwrap();
    let line = one_line_failure(&run(b, &["topic", "list", "--client-config", &text], &[]));
    assert!(line.contains(&format!("client config {text}")), "{line}");
    // A file named but missing is an error; the default one may be absent.
    let missing = dir.path().join("missing.toml");
    let line = one_line_failure(&run(
        b,
        &["topic", "list"],
        &[("MALACHI_CLIENT_CONFIG", missing.as_path())],
    ));
    assert!(
        line.contains(&format!(
            "client config {}: cannot read it",
            missing.display()
        )),
        "{line}"
    );
    let unreachable = one_line_failure(&run(b, &["topic", "list", "--timeout-ms", "500"], &[]));
    assert!(
        unreachable.contains("cannot reach a broker"),
        "{unreachable}"
    );
}
