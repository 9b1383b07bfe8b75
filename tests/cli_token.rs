//! Bearer tokens end to end with the real `malachi` binary and openssl
//! (ADR 0152): an issuer key pair made by `openssl genpkey`, its public
//! key added with `malachi token key add` as the bootstrap superuser, a
//! token minted with `malachi token create`, then used through
//! `--token-file` and `MALACHI_TOKEN_FILE`; the key removed, the same
//! token is one clear, final line, and counts toward the lockout. A
//! following consumer outlives its token's `exp` by logging in again with
//! the renewed token file (ADR 0154).

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
    start_with_skew(dir, 5_000)
}

fn start_with_skew(dir: &Path, skew_ms: u64) -> Broker {
    let admin_pw = dir.join("admin.pw");
    std::fs::write(&admin_pw, "admin-secret\n").unwrap();
    let config = format!(
        "[security]\nauthentication = \"scram\"\nsuperusers = [\"User:admin\"]\nscram_iterations = 4096\nbootstrap_user = \"admin\"\nbootstrap_password_file = {:?}\ntoken_algorithms = [\"EdDSA\"]\ntoken_clock_skew_ms = {skew_ms}\n",
        admin_pw.display().to_string()
    );
    start_with_config(dir, &config, "the token broker")
}

fn run(broker: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(bin());
    command
        .args(args)
        .env("MALACHI_BROKER", broker)
        .env_remove("RUST_LOG")
        .env_remove("MALACHI_USER")
        .env_remove("MALACHI_PASSWORD_FILE")
        .env_remove("MALACHI_TOKEN_FILE");
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

fn openssl(args: &[&str]) {
    let status = Command::new("openssl").args(args).status().unwrap();
    assert!(status.success(), "openssl {args:?}");
}

#[test]
fn a_minted_token_logs_the_cli_in_until_its_key_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path());
    let b = broker.addr.as_str();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (private, public) = (path("issuer.key"), path("issuer.pub"));
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", &private]);
    openssl(&["pkey", "-in", &private, "-pubout", "-out", &public]);
    let admin_pw = path("admin.pw");
    let as_admin = ["--user", "admin", "--password-file", admin_pw.as_str()];

    malachi_testkit::wait::wait_until_blocking(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            run(b, &[&["user", "list"][..], &as_admin[..]].concat(), &[])
                .status
                .success()
        },
    );
    let added = ok(run(
        b,
        &[
            &[
                "token",
                "key",
                "add",
                "--kid",
                "k1",
                "--public-key",
                &public,
            ][..],
            &as_admin[..],
        ]
        .concat(),
        &[],
    ));
    assert_eq!(added, "token key k1 added\n");
    let listed = ok(run(
        b,
        &[&["token", "key", "list", "--json"][..], &as_admin[..]].concat(),
        &[],
    ));
    assert!(
        listed.contains(r#""kid":"k1""#) && listed.contains(r#""algorithm":"EdDSA""#),
        "{listed}"
    );

    // Mint for the superuser, and for a user with no entries.
    for (subject, file) in [("admin", "admin.jwt"), ("nobody", "nobody.jwt")] {
        let token = ok(run(
            b,
            &[
                "token",
                "create",
                "--private-key",
                &private,
                "--kid",
                "k1",
                "--subject",
                subject,
                "--lifetime-ms",
                "600000",
            ],
            &[],
        ));
        assert_eq!(token.trim().split('.').count(), 3, "{token}");
        std::fs::write(path(file), token).unwrap();
    }
    let admin_jwt = path("admin.jwt");
    let created = ok(run(
        b,
        &["topic", "create", "tok", "--token-file", &admin_jwt],
        &[],
    ));
    assert!(created.contains("tok"), "{created}");
    let listed = ok(run(
        b,
        &["topic", "list"],
        &[("MALACHI_TOKEN_FILE", Path::new(&admin_jwt))],
    ));
    assert!(listed.contains("tok"), "{listed}");

    // A principal the ACLs do not allow: logged in, refused, nothing made.
    let nobody_jwt = path("nobody.jwt");
    let line = one_line_failure(&run(
        b,
        &["topic", "create", "nope", "--token-file", &nobody_jwt],
        &[],
    ));
    assert!(
        line.contains("unauthorized") && line.contains("User:nobody"),
        "{line}"
    );

    // The key removed: the same token is refused, clearly and once.
    ok(run(
        b,
        &[
            &["token", "key", "remove", "--kid", "k1"][..],
            &as_admin[..],
        ]
        .concat(),
        &[],
    ));
    let line = one_line_failure(&run(b, &["topic", "list", "--token-file", &admin_jwt], &[]));
    assert!(line.contains("token-kid-unknown"), "{line}");
    // The refused token counted as a failed login of `admin` from this
    // address: its password login waits out the delay too.
    let as_admin_list = [&["topic", "list"][..], &as_admin[..]].concat();
    let line = one_line_failure(&run(b, &as_admin_list, &[]));
    assert!(line.contains("try again in"), "{line}");
    let topics = malachi_testkit::wait::wait_until_blocking(
        "the admin logs in once the delay passed",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || {
            let output = run(b, &as_admin_list, &[]);
            output.status.success().then(|| out(&output))
        },
    );
    assert!(
        topics.contains("tok") && !topics.contains("nope"),
        "{topics}"
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A token for `subject` from `private` under `k1`: the token and its
/// `exp` in milliseconds.
fn mint(b: &str, private: &str, subject: &str, lifetime_ms: u64) -> (String, u64) {
    let minted = ok(run(
        b,
        &[
            "token",
            "create",
            "--private-key",
            private,
            "--kid",
            "k1",
            "--subject",
            subject,
            "--lifetime-ms",
            &lifetime_ms.to_string(),
            "--json",
        ],
        &[],
    ));
    let json: serde_json::Value = serde_json::from_str(minted.trim()).unwrap();
    (
        json["token"].as_str().unwrap().to_owned(),
        json["expires_at_ms"].as_u64().unwrap(),
    )
}

#[test]
fn a_following_consumer_outlives_its_token_by_reading_the_renewed_file() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let broker = start_with_skew(dir.path(), 0);
    let b = broker.addr.as_str();
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (private, public) = (path("issuer.key"), path("issuer.pub"));
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", &private]);
    openssl(&["pkey", "-in", &private, "-pubout", "-out", &public]);
    let admin_pw = path("admin.pw");
    let as_admin = ["--user", "admin", "--password-file", admin_pw.as_str()];
    malachi_testkit::wait::wait_until_blocking(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let add = [
                &[
                    "token",
                    "key",
                    "add",
                    "--kid",
                    "k1",
                    "--public-key",
                    &public,
                ][..],
                &as_admin[..],
            ]
            .concat();
            run(b, &add, &[]).status.success()
        },
    );
    let admin_args = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(as_admin.iter())
            .map(|a| (*a).to_owned())
            .collect()
    };
    let create = admin_args(&["topic", "create", "follow"]);
    ok(run(
        b,
        &create.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    ));
    let produce = |value: &str| {
        let mut child = Command::new(bin())
            .args(admin_args(&["produce", "follow"]))
            .env("MALACHI_BROKER", b)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("k\t{value}\n").as_bytes()).unwrap();
        drop(stdin);
        ok(child.wait_with_output().unwrap());
    };
    produce("one");

    // A consumer on a short token (a few seconds), following.
    let (short, expires_at_ms) = mint(b, &private, "admin", 4_000);
    let file = path("reader.jwt");
    std::fs::write(&file, format!("{short}\n")).unwrap();
    let mut follower = Command::new(bin())
        .args(["consume", "follow", "--from-start", "--follow"])
        .args(["--broker", b, "--token-file", &file])
        .env_remove("RUST_LOG")
        .env_remove("MALACHI_USER")
        .env_remove("MALACHI_PASSWORD_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next = || lines.recv_timeout(Duration::from_secs(30)).ok();
    assert_eq!(next().as_deref(), Some("k\tone"));

    // The token agent renews the file (atomically) before `exp`; once the
    // short token expired, the consumer goes on with the renewed one.
    let (renewed, _) = mint(b, &private, "admin", 600_000);
    let staged = path("reader.jwt.new");
    std::fs::write(&staged, format!("{renewed}\n")).unwrap();
    std::fs::rename(&staged, &file).unwrap();
    assert!(now_ms() < expires_at_ms, "the test ran too slowly");
    malachi_testkit::wait::wait_until_blocking(
        "the consumer's first token expired",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || now_ms() > expires_at_ms + 500,
    );
    produce("two");
    let got = next();
    let _ = follower.kill();
    let output = follower.wait_with_output().unwrap();
    assert_eq!(got.as_deref(), Some("k\ttwo"), "stderr: {}", err(&output));
}
