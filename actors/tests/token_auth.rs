//! Bearer tokens (ADR 0152) through in-process brokers: 402
//! `token_authenticate` with each bad token refused by its reason and
//! counted toward the lockout, nothing written; a token whose principal
//! the ACLs deny; an issuer key added through broker 1 accepted by broker
//! 3 within a second; and the admin HTTP port's matrix with `curl` over
//! TLS: no credential, a token without permission, a token with cluster
//! admin and a client certificate's principal; sessions that end at
//! `exp` (ADR 0154) or when their issuer key is removed (ADR 0157).
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
use malachi_wire::token_keys::{DeleteTokenKeyRequest, PutTokenKeyRequest, TokenKeyText};

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
/// `OTHER_PRIVATE`'s public half: a second issuer key, `k2`.
const OTHER_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAzg/R22B20gFC+00VXmhj1yN1V+Ye0yZh45kqeXBmoJQ=
-----END PUBLIC KEY-----
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

/// A request refused because the connection's session ended: its message.
fn session_ended<T: std::fmt::Debug>(answer: Result<T, Refused>, code: &str) -> String {
    let refused = answer.expect_err("the session should have ended");
    assert_eq!(refused.code, ErrorCode::Unauthorized, "{refused:?}");
    assert!(
        refused.message.starts_with(&format!("{code}: ")),
        "{}",
        refused.message
    );
    refused.message
}

/// Whether the broker closed `client`'s connection (after its answers).
async fn closed_by_broker(client: &mut TestClient) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(10), client.next_frame()).await,
        Ok(None)
    )
}

/// The values of `topic`'s records, read from the start.
async fn values(client: &mut TestClient, topic: &str) -> Vec<String> {
    let (records, _) = client.fetch(topic, None, true, 100, 0).await.unwrap();
    records
        .iter()
        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
        .collect()
}

/// Whether the member list names node 9 (admitted).
async fn nine_admitted(admin: &mut TestClient) -> bool {
    admin
        .call(&ClusterMembersRequest::default())
        .await
        .unwrap()
        .members
        .iter()
        .any(|m| m.node_id == 9)
}

fn counted(broker: &BrokerHandle, line_start: &str) -> f64 {
    broker
        .metrics_text()
        .lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_session_ends_at_exp_and_a_fresh_token_logs_in_again() {
    use malachi_wire::Message;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: SecuritySettings {
            token_clock_skew_ms: 0,
            ..logins::security(dir.path(), 100)
        },
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    add_key(&mut admin).await;
    admin.create_topic("brief").await;
    // `brief` is no user of the store: a token's subject is judged by the
    // ACLs alone, and its session ends only at `exp`.
    for operation in ["produce", "consume"] {
        admin
            .call(&AddAclRequest {
                entry: entry("User:brief", "brief", operation, "allow"),
            })
            .await
            .unwrap();
    }
    let issued_ms = now_ms();
    let short = token(ED_PRIVATE, "k1", "brief", issued_ms, 5_000);
    // `exp` is in whole seconds.
    let exp_ms = (issued_ms + 5_000) / 1000 * 1000;
    let (mut a, mut b, mut pushed) = (
        TestClient::connect(broker.client_addr()).await,
        TestClient::connect(broker.client_addr()).await,
        TestClient::connect(broker.client_addr()).await,
    );
    for client in [&mut a, &mut b, &mut pushed] {
        assert_eq!(token_login(client, &short).await.unwrap(), "User:brief");
    }
    // A subscription, accepted before `exp`.
    let subscription = pushed
        .send_raw(
            malachi_wire::ApiKey::Subscribe.code(),
            Message::encode(&SubscribeRequest {
                topic: "brief".into(),
                cursor: None,
                from_start: true,
                credit_records: 1_000,
                credit_bytes: 1 << 20,
            })
            .unwrap(),
        )
        .await;
    let accepted = pushed.recv().await.unwrap();
    assert_eq!(
        (accepted.correlation_id, accepted.error_code),
        (subscription, ErrorCode::None)
    );
    // Before `exp` the session works.
    assert_eq!(
        a.produce("brief", &[record("k", "before")]).await.unwrap(),
        1
    );
    assert!(
        now_ms() < exp_ms,
        "the test ran too slowly to act before exp"
    );

    // After it, the next request is refused and the connection closes.
    let refused = wait_until(
        "a's session ends at the token's exp",
        Duration::from_secs(15),
        Duration::from_millis(50),
        async || a.call(&ListTopicsRequest::default()).await.err(),
    )
    .await;
    let refused_at_ms = now_ms();
    session_ended(Err::<(), _>(refused), "session-expired");
    assert!(
        refused_at_ms > exp_ms,
        "refused at {refused_at_ms}, exp {exp_ms}"
    );
    assert!(closed_by_broker(&mut a).await, "a's connection stays open");
    // The other connection's produce is refused and writes nothing.
    let message = session_ended(
        b.produce("brief", &[record("k", "after")]).await,
        "session-expired",
    );
    assert!(message.contains("log in again"), "{message}");
    assert!(closed_by_broker(&mut b).await, "b's connection stays open");
    // The subscription ends with the same refusal, pushing nothing more.
    let mut frames = Vec::new();
    while let Ok(Some(frame)) =
        tokio::time::timeout(Duration::from_secs(10), pushed.next_frame()).await
    {
        frames.push(frame);
    }
    let last = frames.last().expect("a frame ending the subscription");
    assert_eq!(last.correlation_id, subscription);
    assert_eq!(last.error_code, ErrorCode::Unauthorized);
    let body = malachi_wire::ErrorBody::decode(last.payload.clone()).unwrap();
    assert!(body.message.starts_with("session-expired: "), "{body:?}");
    assert_eq!(values(&mut admin, "brief").await, ["before"]);
    assert_eq!(
        counted(
            &broker,
            "malachi_sessions_ended_total{reason=\"session-expired\"}"
        ),
        3.0
    );

    // A fresh token logs in again, on a new connection.
    let mut again = TestClient::connect(broker.client_addr()).await;
    assert_eq!(
        token_login(&mut again, &good("brief")).await.unwrap(),
        "User:brief"
    );
    assert_eq!(
        again
            .produce("brief", &[record("k", "again")])
            .await
            .unwrap(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_logs_in_again_from_its_token_file_when_the_brokers_clock_ends_the_session() {
    use malachi_actors::{Broker, Clock, ManualClock};
    use malachi_wire::client::{ClientError, TokenLogin};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    // The broker's clock is the test's: it decides when a session ends.
    let clock = std::sync::Arc::new(ManualClock::new(now_ms()));
    let config = BrokerConfig {
        security: SecuritySettings {
            token_clock_skew_ms: 0,
            ..logins::security(dir.path(), 100)
        },
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = Broker::start_with_clock(config, clock.clone())
        .await
        .unwrap();
    assert!(broker.wait_ready(10_000).await);
    // A login tried before the bootstrap user exists fails and delays the
    // next by the broker's clock: move it on at each try.
    let mut admin = wait_until(
        "the bootstrap user logs in",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            clock.jump_wall_ms(1_000);
            let mut client = TestClient::connect(broker.client_addr()).await;
            logins::login(&mut client, "admin", ADMIN_PASSWORD)
                .await
                .ok()
                .map(|()| client)
        },
    )
    .await;
    add_key(&mut admin).await;
    admin.create_topic("renew").await;
    for who in ["User:agent", "User:fixed"] {
        admin
            .call(&AddAclRequest {
                entry: entry(who, "renew", "produce", "allow"),
            })
            .await
            .unwrap();
    }
    let minted = |subject: &str, from_ms: u64| token(ED_PRIVATE, "k1", subject, from_ms, 60_000);
    let file = dir.path().join("agent.jwt");
    std::fs::write(&file, format!("{}\n", minted("agent", clock.wall_ms()))).unwrap();
    let addr = broker.client_addr().to_string();
    let with = |login: malachi_wire::client::Login| malachi_wire::ClientConfig {
        request_timeout_ms: 10_000,
        login: Some(login),
        ..malachi_wire::ClientConfig::default()
    };
    let agent = malachi_wire::Client::connect_with(
        [addr.clone()],
        with(TokenLogin::from_file(&file).into_login()),
    )
    .await
    .unwrap();
    let fixed_token = minted("fixed", clock.wall_ms());
    let fixed = malachi_wire::Client::connect_with(
        [addr],
        with(TokenLogin::new(&fixed_token).into_login()),
    )
    .await
    .unwrap();
    let batch = |value: &str| {
        malachi_wire::RecordBatch::from_records(&[record("k", value)], 1 << 20).unwrap()
    };
    agent.produce("renew", batch("agent-1")).await.unwrap();
    fixed.produce("renew", batch("fixed-1")).await.unwrap();
    let mut raw = TestClient::connect(broker.client_addr()).await;
    token_login(&mut raw, &fixed_token).await.unwrap();

    // The token agent renews the file; then the broker's clock passes
    // both tokens' `exp` (the clients' own clocks do not).
    let later_ms = clock.wall_ms() + 120_000;
    std::fs::write(&file, format!("{}\n", minted("agent", later_ms))).unwrap();
    clock.jump_wall_ms(120_000);
    session_ended(
        raw.call(&ListTopicsRequest::default()).await,
        "session-expired",
    );
    // The SDK's request on its old connection is refused `session-expired`;
    // it sends it again on a new connection, logged in with the renewed file.
    agent.produce("renew", batch("agent-2")).await.unwrap();
    // With a fixed token the new login is refused: final, not retried.
    let refused = fixed.produce("renew", batch("fixed-2")).await.unwrap_err();
    match &refused {
        ClientError::Authentication { reason, .. } => {
            assert!(reason.contains("token-expired"), "{reason}")
        }
        other => panic!("not an authentication error: {other:?}"),
    }
    assert!(!refused.retriable());
    assert_eq!(
        values(&mut admin, "renew").await,
        ["agent-1", "fixed-1", "agent-2"]
    );
    assert_eq!(
        counted(
            &broker,
            "malachi_sessions_ended_total{reason=\"session-expired\"}"
        ),
        3.0
    );
}

/// `curl` against a plaintext admin port, from `from` (a loopback
/// address): the status, the headers and the body.
fn curl_from(url: &str, from: &str, extra: &[&str]) -> (String, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--interface", from, "-D", "-"])
        .args(["-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (rest, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    (
        status.to_owned(),
        headers.to_ascii_lowercase(),
        body.to_owned(),
    )
}

/// The admin port's answer to `token` on `path` of `broker`, from `from`.
async fn admin_call(
    broker: &BrokerHandle,
    path: &str,
    post: bool,
    token: &str,
    from: &'static str,
) -> (String, String, serde_json::Value) {
    let url = format!("http://127.0.0.1:{}{path}", broker.admin_addr().port());
    let bearer = format!("Authorization: Bearer {token}");
    let (status, headers, body) = tokio::task::spawn_blocking(move || {
        let mut extra = vec!["-H", bearer.as_str()];
        if post {
            extra.extend(["-X", "POST"]);
        }
        curl_from(&url, from, &extra)
    })
    .await
    .unwrap();
    let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    (status, headers, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_tokens_on_the_admin_port_raise_the_client_ports_lockout_and_the_reverse() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let security = security(dir.path(), 5_000);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    add_key(&mut admin1).await;
    // Both may administer the cluster: only the lockout stands between
    // their good tokens and an admit.
    for who in ["User:mallory", "User:trudy"] {
        for operation in ["admin", "describe"] {
            admin1
                .call(&AddAclRequest {
                    entry: entry(who, "", operation, "allow"),
                })
                .await
                .unwrap();
        }
    }
    let forged = |subject: &str| token(OTHER_PRIVATE, "k1", subject, now_ms(), 600_000);
    // Every admin port knows the key (its cached view is at most 500 ms
    // old): a forged token is then refused for its signature.
    // (A refusal counts against its subject: each try names another.)
    let mut tries = 0;
    for broker in &brokers {
        wait_until(
            "the admin port accepts a token under the new key",
            Duration::from_secs(5),
            Duration::from_millis(50),
            async || {
                tries += 1;
                let subject = format!("ops{tries}");
                let answer =
                    admin_call(broker, "/api/members", false, &good(&subject), "127.0.0.1").await;
                answer.0 == "403"
            },
        )
        .await;
    }

    // A forged token on broker 2's admin port: 401, counted cluster-wide.
    let (status, headers, json) = admin_call(
        &brokers[1],
        "/api/members",
        false,
        &forged("mallory"),
        "127.0.0.1",
    )
    .await;
    let failed_at = Instant::now();
    assert_eq!(status, "401", "{json}");
    assert!(headers.contains("www-authenticate: bearer"), "{headers}");
    assert_eq!(json["error"], "unauthenticated");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .starts_with("token-invalid-signature"),
        "{json}"
    );
    assert_eq!(json["retry_after_ms"], 5_000, "{json}");
    // The client port of broker 3 delays mallory's next login from this
    // address, even with a good token.
    let mut client = TestClient::connect(brokers[2].client_addr()).await;
    let refused = token_login(&mut client, &good("mallory"))
        .await
        .unwrap_err();
    assert!(
        refused.message.contains("try again in"),
        "{}",
        refused.message
    );
    assert!(refused.retry_after_ms.is_some_and(|ms| ms <= 5_000));
    // So does the admin port of broker 3 (once its cached view, at most
    // 500 ms old, holds the failure): 429 with the delay, nothing run.
    let admit = "/api/members/9/admit";
    wait_until(
        "broker 3's admin port throttles mallory",
        Duration::from_secs(3),
        Duration::from_millis(50),
        async || {
            let answer = admin_call(
                &brokers[2],
                "/api/members",
                false,
                &good("mallory"),
                "127.0.0.1",
            )
            .await;
            answer.0 == "429"
        },
    )
    .await;
    let (status, headers, json) =
        admin_call(&brokers[2], admit, true, &good("mallory"), "127.0.0.1").await;
    assert_eq!(status, "429", "{json}");
    assert!(
        failed_at.elapsed() < Duration::from_secs(4),
        "the test ran too slowly to see the delay"
    );
    assert_eq!(json["error"], "throttled", "{json}");
    assert!(
        json["message"].as_str().unwrap().contains("try again in"),
        "{json}"
    );
    let retry_after_ms = json["retry_after_ms"].as_u64().unwrap();
    assert!(retry_after_ms > 0 && retry_after_ms <= 5_000, "{json}");
    assert!(headers.contains("retry-after: "), "{headers}");
    assert!(!nine_admitted(&mut admin1).await, "a throttled admit ran");
    // Keyed by source too: from another address the same token runs.
    let (status, _, json) = admin_call(
        &brokers[2],
        "/api/members",
        false,
        &good("mallory"),
        "127.0.0.2",
    )
    .await;
    assert_eq!(status, "200", "{json}");

    // The reverse: a forged token on broker 1's client port throttles
    // trudy on broker 2's admin port.
    let mut client = TestClient::connect(brokers[0].client_addr()).await;
    let refused = token_login(&mut client, &forged("trudy"))
        .await
        .unwrap_err();
    assert_eq!(refused.retry_after_ms, Some(5_000));
    wait_until(
        "broker 2's admin port throttles trudy",
        Duration::from_secs(3),
        Duration::from_millis(50),
        async || {
            let answer = admin_call(
                &brokers[1],
                "/api/members",
                false,
                &good("trudy"),
                "127.0.0.1",
            )
            .await;
            answer.0 == "429"
        },
    )
    .await;
    let (status, _, json) = admin_call(&brokers[1], admit, true, &good("trudy"), "127.0.0.1").await;
    assert_eq!(status, "429", "{json}");
    assert!(json["retry_after_ms"].as_u64().is_some(), "{json}");
    assert!(!nine_admitted(&mut admin1).await, "a throttled admit ran");
    // Once the delay passed, the good token runs the admit.
    let (status, _, json) = wait_until(
        "trudy's admit runs after the delay",
        Duration::from_secs(15),
        Duration::from_millis(250),
        async || {
            let answer = admin_call(&brokers[1], admit, true, &good("trudy"), "127.0.0.1").await;
            (answer.0 != "429").then_some(answer)
        },
    )
    .await;
    assert_eq!(status, "200", "{json}");
    let throttled: f64 = brokers
        .iter()
        .map(|b| counted(b, "malachi_admin_requests_refused_total{status=\"429\"}"))
        .sum();
    assert!(throttled >= 2.0, "{throttled}");
}

async fn put_key(admin: &mut TestClient, kid: &str, public_key_pem: &str) {
    let answer = admin
        .call(&PutTokenKeyRequest {
            key: TokenKeyText {
                kid: kid.into(),
                algorithm: "EdDSA".into(),
                public_key_pem: public_key_pem.into(),
                added_at_ms: 0,
            },
        })
        .await
        .unwrap();
    assert!(answer.changed);
}

/// A connection to `broker` logged in with `token` as `principal`.
async fn token_session(broker: &BrokerHandle, token: &str, principal: &str) -> TestClient {
    let mut client = TestClient::connect(broker.client_addr()).await;
    assert_eq!(token_login(&mut client, token).await.unwrap(), principal);
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_issuer_key_ends_its_sessions_on_every_broker_and_no_other_keys() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let security = security(dir.path(), 100);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    put_key(&mut admin1, "k1", ED_PUBLIC).await;
    put_key(&mut admin1, "k2", OTHER_PUBLIC).await;
    admin1
        .call(&CreateTopicRequest {
            name: "t".into(),
            replication_factor: Some(3),
            policy: None,
        })
        .await
        .unwrap();
    for operation in ["produce", "describe"] {
        admin1
            .call(&AddAclRequest {
                entry: entry("User:svc", "t", operation, "allow"),
            })
            .await
            .unwrap();
    }
    // One subject under two keys (a rotation half done): the sessions of
    // k1 end, those of k2 stay, whoever the subject. A superuser's token
    // session is checked too: an issuer key can sign for anyone.
    let k1 = |subject: &str| token(ED_PRIVATE, "k1", subject, now_ms(), 600_000);
    let k2 = |subject: &str| token(OTHER_PRIVATE, "k2", subject, now_ms(), 600_000);
    let mut a = token_session(&brokers[0], &k1("svc"), "User:svc").await;
    let mut b = token_session(&brokers[0], &k1("svc"), "User:svc").await;
    let mut root = token_session(&brokers[0], &k1("admin"), "User:admin").await;
    let mut far = token_session(&brokers[2], &k1("svc"), "User:svc").await;
    let mut kept = token_session(&brokers[0], &k2("svc"), "User:svc").await;
    let mut kept_far = token_session(&brokers[2], &k2("svc"), "User:svc").await;
    for client in [&mut a, &mut b, &mut far, &mut kept, &mut kept_far] {
        assert!(describe(client, "t").await.is_ok());
    }
    assert!(root.call(&ListTopicsRequest::default()).await.is_ok());

    // Removed through broker 2: broker 1 refuses k1's sessions within a
    // second or two (its cached view is at most 500 ms old).
    let mut admin2 = admin(&brokers[1]).await;
    admin2
        .call(&DeleteTokenKeyRequest { kid: "k1".into() })
        .await
        .unwrap();
    let removed = Instant::now();
    let refused = wait_until(
        "broker 1 ends k1's session",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || describe(&mut a, "t").await.err(),
    )
    .await;
    let took = removed.elapsed();
    eprintln!("broker 1 ended a k1 session {took:?} after broker 2 removed the key");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let message = session_ended(Err::<(), _>(refused), "issuer-key-removed");
    assert!(message.contains("\"k1\""), "{message}");
    assert!(closed_by_broker(&mut a).await, "a's connection stays open");
    // The other k1 sessions: a produce refused, writing nothing; the
    // superuser's; the one on broker 3.
    session_ended(
        b.produce("t", &[record("k", "after")]).await,
        "issuer-key-removed",
    );
    assert!(closed_by_broker(&mut b).await, "b's connection stays open");
    session_ended(
        root.call(&ListTopicsRequest::default()).await,
        "issuer-key-removed",
    );
    let refused = wait_until(
        "broker 3 ends k1's session",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || describe(&mut far, "t").await.err(),
    )
    .await;
    session_ended(Err::<(), _>(refused), "issuer-key-removed");
    assert!(read_all(&mut admin1, "t").await.is_empty());

    // k2's sessions go on, on both brokers, and k2 still logs in; k1's
    // tokens no longer do.
    for client in [&mut kept, &mut kept_far] {
        assert!(describe(client, "t").await.is_ok(), "a k2 session ended");
    }
    token_session(&brokers[0], &k2("svc"), "User:svc").await;
    let mut late = TestClient::connect(brokers[0].client_addr()).await;
    let refused = token_login(&mut late, &k1("svc")).await.unwrap_err();
    assert!(
        refused.message.contains("token-kid-unknown"),
        "{}",
        refused.message
    );
    let ended: u64 = brokers
        .iter()
        .map(|b| {
            counter(
                b,
                "malachi_sessions_ended_total{reason=\"issuer-key-removed\"}",
            )
        })
        .sum();
    assert_eq!(ended, 4);
}
