//! Bearer tokens (ADR 0152) through in-process brokers: 402
//! `token_authenticate` with each bad token refused by its reason and
//! counted toward the lockout, nothing written; a token whose principal
//! the ACLs deny; an issuer key added through broker 1 accepted by broker
//! 3 within a second; and the admin HTTP port's matrix with `curl` over
//! TLS: no credential, a token without permission, a token with cluster
//! admin and a client certificate's principal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::logins::{self, ADMIN_PASSWORD, ITERATIONS, admin};
use common::*;
use malachi_actors::scram_login::derive_credential;
use malachi_actors::{BrokerConfig, BrokerHandle, ClientAuth, SecuritySettings, TlsSettings};
use malachi_core::auth::token::{MintRequest, TokenAlgorithm, mint};
use malachi_wire::ErrorCode;
use malachi_wire::auth::TokenAuthenticateRequest;
use malachi_wire::auth_admin::{AclEntryText, AddAclRequest, PutUserRequest};
use malachi_wire::messages::*;
use malachi_wire::token_keys::{PutTokenKeyRequest, TokenKeyText};

const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIB3i8a/0zHz5j0J/vzyE0wfpugyLequZ5U8ngjqFqjQb
-----END PRIVATE KEY-----
";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAhfKbHyBGFxlhsTvSzKBzfmLhNyYf7N7HRBxRqKlD3q8=
-----END PUBLIC KEY-----
";
/// Another key: what it signs does not verify under `ED_PUBLIC`.
const OTHER_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIO3yfyaSIwiIyBVgJRAvt7t1iR11g2akPN6T94D/VKh6
-----END PRIVATE KEY-----
";
const SKEW_MS: u64 = 5_000;

fn security(dir: &Path, delay_first_ms: u64) -> SecuritySettings {
    SecuritySettings {
        token_clock_skew_ms: SKEW_MS,
        ..logins::security(dir, delay_first_ms)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A token for `subject` under key `kid`, valid from `from_ms` for
/// `lifetime_ms`.
fn token(private: &str, kid: &str, subject: &str, from_ms: u64, lifetime_ms: u64) -> String {
    mint(
        private.as_bytes(),
        &MintRequest {
            algorithm: TokenAlgorithm::EdDSA,
            kid,
            subject,
            now_ms: from_ms,
            lifetime_ms,
            not_before_ms: Some(from_ms),
            audience: None,
        },
    )
    .unwrap()
}

fn good(subject: &str) -> String {
    token(ED_PRIVATE, "k1", subject, now_ms(), 600_000)
}

async fn add_key(admin: &mut TestClient) {
    let answer = admin
        .call(&PutTokenKeyRequest {
            key: TokenKeyText {
                kid: "k1".into(),
                algorithm: "EdDSA".into(),
                public_key_pem: ED_PUBLIC.into(),
                added_at_ms: 0,
            },
        })
        .await
        .unwrap();
    assert!(answer.changed);
}

/// A token login's refusal: its message and retry delay.
#[derive(Debug)]
struct TokenRefused {
    message: String,
    retry_after_ms: Option<u32>,
}

/// Logs `client` in with `token`: the principal, or the refusal.
async fn token_login(client: &mut TestClient, token: &str) -> Result<String, TokenRefused> {
    use malachi_wire::Message;
    let request = TokenAuthenticateRequest {
        token: token.into(),
    };
    let id = client
        .send_raw(
            malachi_wire::ApiKey::TokenAuthenticate.code(),
            request.encode().unwrap(),
        )
        .await;
    let frame = client.recv().await.unwrap();
    assert_eq!(frame.correlation_id, id);
    if frame.error_code == ErrorCode::None {
        let answer = malachi_wire::auth::TokenAuthenticateResponse::decode(frame.payload).unwrap();
        return Ok(answer.principal);
    }
    assert_eq!(frame.error_code, ErrorCode::Unauthorized);
    let body = malachi_wire::ErrorBody::decode(frame.payload).unwrap();
    Err(TokenRefused {
        message: body.message,
        retry_after_ms: body.retry_after_ms,
    })
}

fn entry(principal: &str, topic: &str, operation: &str, permission: &str) -> AclEntryText {
    AclEntryText {
        principal: principal.into(),
        resource: if topic.is_empty() { "cluster" } else { "topic" }.into(),
        pattern: if topic.is_empty() { "" } else { "literal" }.into(),
        name: topic.into(),
        operation: operation.into(),
        permission: permission.into(),
    }
}

fn b64(json: &str) -> String {
    URL_SAFE_NO_PAD.encode(json)
}

/// The bad tokens, each claiming its own subject (so the lockout one
/// refusal counts does not hide the next one's reason), with the code
/// each is refused with.
fn bad_tokens() -> Vec<(&'static str, String)> {
    let now = now_ms();
    let claims = |sub: &str| b64(&format!(r#"{{"sub":"{sub}","exp":{}}}"#, now / 1000 + 600));
    let signed = good("bad-sig");
    let hs256 = {
        use hmac::{Hmac, Mac};
        let signing = format!(
            "{}.{}",
            b64(r#"{"alg":"HS256","typ":"JWT","kid":"k1"}"#),
            claims("switch")
        );
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(ED_PUBLIC.as_bytes()).unwrap();
        mac.update(signing.as_bytes());
        format!(
            "{signing}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    };
    vec![
        (
            "token-invalid-signature",
            token(OTHER_PRIVATE, "k1", "bad-sig", now, 600_000),
        ),
        (
            "token-invalid-signature",
            // `sub` changed after signing.
            {
                let parts: Vec<&str> = signed.split('.').collect();
                format!("{}.{}.{}", parts[0], claims("tampered"), parts[2])
            },
        ),
        (
            "token-unsigned",
            format!(
                "{}.{}.",
                b64(r#"{"alg":"none","kid":"k1"}"#),
                claims("none")
            ),
        ),
        ("token-algorithm-not-allowed", hs256),
        (
            "token-expired",
            token(ED_PRIVATE, "k1", "expired", now - 3_600_000, 60_000),
        ),
        (
            "token-not-yet-valid",
            token(ED_PRIVATE, "k1", "early", now + 600_000, 600_000),
        ),
        (
            "token-kid-unknown",
            token(ED_PRIVATE, "k9", "unknown-kid", now, 600_000),
        ),
        ("token-malformed", "not-a-jwt".to_owned()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_token_is_refused_by_its_reason_and_nothing_is_written() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 3_000),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    add_key(&mut admin).await;
    admin.create_topic("orders").await;

    for (code, bad) in bad_tokens() {
        let mut client = TestClient::connect(broker.client_addr()).await;
        let refused = token_login(&mut client, &bad).await.unwrap_err();
        assert!(
            refused
                .message
                .starts_with(&format!("authentication failed: {code}:")),
            "{code}: {}",
            refused.message
        );
        // Counted toward the lockout: the first failure's delay.
        assert_eq!(refused.retry_after_ms, Some(3_000), "{code}");
        // Still not logged in: nothing runs, nothing is written.
        let produced = client.produce("orders", &[record("k", code)]).await;
        let refused = produced.unwrap_err();
        assert_eq!(refused.code, ErrorCode::Unauthorized);
        assert!(
            refused.message.contains("log in first"),
            "{}",
            refused.message
        );
    }
    let (fetched, _) = admin.fetch("orders", None, true, 10, 0).await.unwrap();
    assert!(fetched.is_empty(), "{fetched:?}");
    let metrics = broker.metrics_text();
    for (code, _) in bad_tokens() {
        let line = format!("malachi_token_logins_refused_total{{reason=\"{code}\"}}");
        assert!(metrics.contains(&line), "{line} not in the metrics");
    }

    // A failed token for a subject delays that subject's next login from
    // this address, even with a good token: the lockout is shared.
    let mut client = TestClient::connect(broker.client_addr()).await;
    let refused = token_login(&mut client, &good("bad-sig"))
        .await
        .unwrap_err();
    assert!(
        refused.message.contains("try again in"),
        "{}",
        refused.message
    );
    let mut client = TestClient::connect(broker.client_addr()).await;
    let principal = token_login(&mut client, &good("fresh")).await.unwrap();
    assert_eq!(principal, "User:fresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_a_denied_principal_logs_in_and_is_refused() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    add_key(&mut admin).await;
    admin.create_topic("orders").await;
    // mallory is allowed produce and denied it: the deny wins.
    for permission in ["allow", "deny"] {
        admin
            .call(&AddAclRequest {
                entry: entry("User:mallory", "orders", "produce", permission),
            })
            .await
            .unwrap();
    }
    let mut mallory = TestClient::connect(broker.client_addr()).await;
    assert_eq!(
        token_login(&mut mallory, &good("mallory")).await.unwrap(),
        "User:mallory"
    );
    let refused = mallory
        .produce("orders", &[record("k", "v")])
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    assert!(
        refused.message.contains("User:mallory") && refused.message.contains("deny"),
        "{}",
        refused.message
    );
    let deleted = mallory
        .call(&DeleteTopicRequest {
            name: "orders".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(deleted.code, ErrorCode::Unauthorized);
    let (fetched, _) = admin.fetch("orders", None, true, 10, 0).await.unwrap();
    assert!(fetched.is_empty(), "{fetched:?}");
    // Adding a key needs admin on the cluster.
    let put = mallory
        .call(&PutTokenKeyRequest {
            key: TokenKeyText {
                kid: "k2".into(),
                algorithm: "EdDSA".into(),
                public_key_pem: ED_PUBLIC.into(),
                added_at_ms: 0,
            },
        })
        .await
        .unwrap_err();
    assert_eq!(put.code, ErrorCode::Unauthorized);
    assert!(put.message.contains("admin"), "{}", put.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_through_broker_1_is_accepted_by_broker_3_within_a_second() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let security = security(dir.path(), 100);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    // Broker 3 serves logins before the key exists: refused.
    let mut early = TestClient::connect(brokers[2].client_addr()).await;
    let refused = token_login(&mut early, &good("zoe")).await.unwrap_err();
    assert!(
        refused.message.contains("token-kid-unknown"),
        "{}",
        refused.message
    );

    add_key(&mut admin1).await;
    let added = Instant::now();
    let principal = wait_until(
        "broker 3 accepts a token under the new key",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            let mut client = TestClient::connect(brokers[2].client_addr()).await;
            token_login(&mut client, &good("zoe")).await.ok()
        },
    )
    .await;
    let took = added.elapsed();
    eprintln!("broker 3 accepted a token under the key {took:?} after broker 1 added it");
    assert_eq!(principal, "User:zoe");
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// `curl` against the admin port: the status and the body.
fn curl(url: &str, ca: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(ca)
        .args(extra)
        .arg(url)
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_port_takes_a_token_or_a_certificate_and_judges_by_the_acls() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = malachi_testkit::tls::pki(dir.path());
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        tls: TlsSettings {
            cert_path: Some(files.broker_cert.clone()),
            key_path: Some(files.broker_key.clone()),
            client_ca_path: Some(files.ca.clone()),
            client_auth: ClientAuth::Optional,
            handshake_timeout_ms: 2_000,
            reload_check_ms: 100,
            ..TlsSettings::default()
        },
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    // The admin connection speaks TLS; the certificate's CN is `alice`.
    let tls = malachi_wire::tls::ClientTls::from_files(&malachi_wire::tls::ClientTlsFiles {
        ca_path: files.ca.clone(),
        cert_path: None,
        key_path: None,
        server_name: None,
    })
    .unwrap();
    let config = malachi_wire::ClientConfig {
        tls: Some(tls),
        request_timeout_ms: 10_000,
        login: Some(
            malachi_actors::scram_login::ScramLogin::new("admin", ADMIN_PASSWORD.as_bytes())
                .into_login(),
        ),
        ..malachi_wire::ClientConfig::default()
    };
    let addr = broker.client_addr().to_string();
    let admin = wait_until(
        "the bootstrap user logs in over TLS",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            malachi_wire::Client::connect_with([addr.clone()], config.clone())
                .await
                .ok()
        },
    )
    .await;
    admin
        .call(
            None,
            &PutTokenKeyRequest {
                key: TokenKeyText {
                    kid: "k1".into(),
                    algorithm: "EdDSA".into(),
                    public_key_pem: ED_PUBLIC.into(),
                    added_at_ms: 0,
                },
            },
        )
        .await
        .unwrap();
    admin
        .call(
            None,
            &PutUserRequest {
                name: "ops".into(),
                credential: derive_credential(b"pw-ops", Some(ITERATIONS)).unwrap(),
                replace: false,
            },
        )
        .await
        .unwrap();
    // ops administers the cluster (admin does not imply describe: both).
    for (who, operation) in [
        ("User:ops", "admin"),
        ("User:ops", "describe"),
        ("User:alice", "describe"),
    ] {
        admin
            .call(
                None,
                &AddAclRequest {
                    entry: entry(who, "", operation, "allow"),
                },
            )
            .await
            .unwrap();
    }
    let port = broker.admin_addr().port();
    let url = move |path: &str| format!("https://localhost:{port}{path}");
    let ca = files.ca.clone();
    let (cert, key) = (files.client_cert.clone(), files.client_key.clone());
    let (ops, nobody) = (good("ops"), good("nobody"));
    let members = url("/api/members");
    let admit = url("/api/members/9/admit");
    let (ops_later, admit_later) = (ops.clone(), admit.clone());
    let results = tokio::task::spawn_blocking(move || {
        let bearer = |t: &str| format!("Authorization: Bearer {t}");
        let cert_args = [
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ];
        vec![
            ("health", curl(&url("/health"), &ca, &[])),
            ("ready", curl(&url("/ready"), &ca, &[])),
            ("none members", curl(&members, &ca, &[])),
            (
                "none headers",
                curl(&members, &ca, &["-D", "-", "-o", "/dev/null"]),
            ),
            ("none admit", curl(&admit, &ca, &["-X", "POST"])),
            ("none metrics", curl(&url("/metrics"), &ca, &[])),
            ("bad token", curl(&members, &ca, &["-H", &bearer("x.y.z")])),
            (
                "nobody members",
                curl(&members, &ca, &["-H", &bearer(&nobody)]),
            ),
            (
                "nobody admit",
                curl(&admit, &ca, &["-X", "POST", "-H", &bearer(&nobody)]),
            ),
            ("ops members", curl(&members, &ca, &["-H", &bearer(&ops)])),
            (
                "ops tree",
                curl(&url("/api/tree"), &ca, &["-H", &bearer(&ops)]),
            ),
            ("cert members", curl(&members, &ca, &cert_args)),
            (
                "cert admit",
                curl(&admit, &ca, &[&["-X", "POST"][..], &cert_args[..]].concat()),
            ),
        ]
    });
    let results = results.await.unwrap();
    let status = |name: &str| {
        let (status, body) = &results.iter().find(|(n, _)| *n == name).unwrap().1;
        (status.clone(), body.clone())
    };
    assert_eq!(status("health").0, "200");
    assert_eq!(status("ready").0, "200");
    for name in ["none members", "none admit", "none metrics", "bad token"] {
        let (code, body) = status(name);
        assert_eq!(code, "401", "{name}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"], "unauthenticated", "{name}: {body}");
    }
    assert!(status("bad token").1.contains("token-malformed"));
    let headers = status("none headers").1.to_ascii_lowercase();
    assert!(headers.contains("www-authenticate: bearer"), "{headers}");
    for name in ["nobody members", "nobody admit", "cert admit"] {
        let (code, body) = status(name);
        assert_eq!(code, "403", "{name}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["error"], "unauthorized", "{name}: {body}");
        assert_eq!(json["refused"], "cluster_members", "{name}: {body}");
    }
    assert!(status("nobody admit").1.contains("User:nobody"));
    assert!(status("cert admit").1.contains("User:alice"));
    assert_eq!(
        status("ops members").0,
        "200",
        "{}",
        status("ops members").1
    );
    assert_eq!(status("ops tree").0, "200");
    assert_eq!(
        status("cert members").0,
        "200",
        "{}",
        status("cert members").1
    );
    // Admitting an unknown member runs and is refused by the cluster, not
    // by the credential.
    // Nothing was admitted by the refused requests...
    let members_now = async || {
        let listed = admin
            .call(None, &ClusterMembersRequest::default())
            .await
            .unwrap();
        listed.members.iter().any(|m| m.node_id == 9)
    };
    assert!(!members_now().await, "a refused admit wrote");
    // ...and the same request with cluster admin runs.
    let ca = files.ca.clone();
    let (code, body) = tokio::task::spawn_blocking(move || {
        let bearer = format!("Authorization: Bearer {ops_later}");
        curl(&admit_later, &ca, &["-X", "POST", "-H", &bearer])
    })
    .await
    .unwrap();
    assert_eq!(code, "200", "{body}");
    assert!(members_now().await, "the admitted member is listed");
    let refused: f64 = broker
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with("malachi_admin_requests_refused_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 8.0, "{}", broker.metrics_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_logs_in_with_a_token_and_a_refused_one_is_final() {
    use malachi_wire::client::{ClientError, TokenLogin};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    add_key(&mut admin).await;
    admin.create_topic("s").await;
    admin
        .call(&AddAclRequest {
            entry: entry("User:sdk", "s", "produce", "allow"),
        })
        .await
        .unwrap();
    let addr = broker.client_addr().to_string();
    let with = |token: String| malachi_wire::ClientConfig {
        request_timeout_ms: 10_000,
        login: Some(TokenLogin::new(&token).into_login()),
        ..malachi_wire::ClientConfig::default()
    };
    let good_token = good("sdk");
    wait_until(
        "the sdk produces as User:sdk",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            let client =
                malachi_wire::Client::connect_with([addr.clone()], with(good_token.clone()))
                    .await
                    .ok()?;
            let batch =
                malachi_wire::RecordBatch::from_records(&[record("k", "v")], 1 << 20).unwrap();
            client.produce("s", batch).await.ok()
        },
    )
    .await;
    let expired = token(ED_PRIVATE, "k1", "sdk-late", now_ms() - 7_200_000, 60_000);
    let refused = malachi_wire::Client::connect_with([addr], with(expired))
        .await
        .unwrap_err();
    match &refused {
        ClientError::Authentication { reason, .. } => {
            assert!(reason.contains("token-expired"), "{reason}")
        }
        other => panic!("not an authentication error: {other:?}"),
    }
    assert!(!refused.retriable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_authentication_refuses_a_token_clearly() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path().join("data"))).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let refused = token_login(&mut client, &good("alice")).await.unwrap_err();
    assert!(
        refused.message.contains("does not authenticate clients"),
        "{}",
        refused.message
    );
}
