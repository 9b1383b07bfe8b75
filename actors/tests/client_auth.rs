//! Authenticated clients and ACLs on the client port (ADR 0150), through
//! in-process brokers and the frame-level test client: the SCRAM login
//! (api keys 400, 401), the one authorization table over every operation,
//! user and ACL administration (403 to 409), the lockout counted in the
//! ring's group across brokers, and the refusals a client sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::logins::*;
use common::*;
use malachi_actors::scram_login::derive_credential;
use malachi_actors::{BrokerConfig, BrokerHandle, SecuritySettings};
use malachi_core::auth::scram_client::ScramClient;
use malachi_wire::ErrorCode;
use malachi_wire::auth::{SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest};
use malachi_wire::auth_admin::{AclEntryText, AddAclRequest, PutUserRequest};
use malachi_wire::messages::*;

async fn create_user(admin: &mut TestClient, name: &str, password: &str) {
    admin
        .call(&PutUserRequest {
            name: name.into(),
            credential: derive_credential(password.as_bytes(), Some(ITERATIONS)).unwrap(),
            replace: false,
        })
        .await
        .unwrap();
}

fn entry(principal: &str, topic: Option<&str>, operation: &str, permission: &str) -> AclEntryText {
    AclEntryText {
        principal: principal.into(),
        resource: if topic.is_some() { "topic" } else { "cluster" }.into(),
        pattern: if topic.is_some() { "literal" } else { "" }.into(),
        name: topic.unwrap_or_default().into(),
        operation: operation.into(),
        permission: permission.into(),
    }
}

async fn grant(admin: &mut TestClient, entry: AclEntryText) {
    admin.call(&AddAclRequest { entry }).await.unwrap();
}

fn unauthorized<T: std::fmt::Debug>(answer: Result<T, Refused>, what: &str) -> String {
    let refused = answer.expect_err(what);
    assert_eq!(refused.code, ErrorCode::Unauthorized, "{what}: {refused:?}");
    refused.message
}

/// Every operation of the matrix, refused for `client` (logged in as
/// `who`); none of them writes.
async fn all_refused(client: &mut TestClient, who: &str) {
    let produced = client.produce("orders", &[record("k", who)]).await;
    let message = unauthorized(produced, "produce");
    assert!(
        message.contains(&format!("User:{who}"))
            && message.contains("produce")
            && message.contains("orders"),
        "{message}"
    );
    unauthorized(client.fetch("orders", None, true, 10, 0).await, "fetch");
    let created = client
        .call(&CreateTopicRequest {
            name: format!("new-{who}"),
            replication_factor: None,
            policy: None,
        })
        .await;
    unauthorized(created, "create");
    let deleted = client
        .call(&DeleteTopicRequest {
            name: "orders".into(),
        })
        .await;
    unauthorized(deleted, "delete");
    unauthorized(describe(client, "orders").await, "describe");
    let split = client
        .call(&SplitRangeRequest {
            topic: "orders".into(),
            range_id: 0,
        })
        .await;
    unauthorized(split, "split");
    unauthorized(
        client.call(&VnodeSplitRequest { vnode: 0 }).await,
        "vnode split",
    );
    let policy = client
        .call(&PutPolicyRequest {
            policy: PolicyDescription {
                name: format!("p-{who}"),
                ..PolicyDescription::default()
            },
        })
        .await;
    unauthorized(policy, "put policy");
    let admit = client
        .call(&ClusterMembersRequest {
            admit: Some(1),
            decommission: None,
        })
        .await;
    unauthorized(admit, "admit");
    let listed = client.call(&ListTopicsRequest::default()).await.unwrap();
    assert!(listed.topics.is_empty(), "{who} sees {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_by_allowed_denied_and_unlisted_principals() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    admin.create_topic("orders").await;
    admin.create_topic("orders2").await;
    for (user, password) in [("alice", "pw-a"), ("bob", "pw-b"), ("carol", "pw-c")] {
        create_user(&mut admin, user, password).await;
    }
    // alice and bob are allowed everything on `orders`; bob is also denied
    // all of it, and a deny beats an allow. carol has no entry.
    for user in ["alice", "bob"] {
        for op in ["produce", "consume", "delete", "alter"] {
            grant(
                &mut admin,
                entry(&format!("User:{user}"), Some("orders"), op, "allow"),
            )
            .await;
        }
    }
    for op in [
        "produce", "consume", "delete", "alter", "describe", "create",
    ] {
        grant(&mut admin, entry("User:bob", Some("orders"), op, "deny")).await;
    }

    // Before a login, only the login is served.
    let mut anonymous = TestClient::connect(broker.client_addr()).await;
    let refused = unauthorized(
        anonymous.produce("orders", &[record("k", "v")]).await,
        "anonymous",
    );
    assert!(refused.contains("log in first"), "{refused}");

    let mut bob = TestClient::connect(broker.client_addr()).await;
    login(&mut bob, "bob", "pw-b").await.unwrap();
    all_refused(&mut bob, "bob").await;
    let mut carol = TestClient::connect(broker.client_addr()).await;
    login(&mut carol, "carol", "pw-c").await.unwrap();
    all_refused(&mut carol, "carol").await;

    // Nothing of theirs was written: read back as the superuser.
    let (records, _) = admin.fetch("orders", None, true, 100, 0).await.unwrap();
    assert!(records.is_empty(), "{records:?}");
    for name in ["new-bob", "new-carol"] {
        let found = describe(&mut admin, name).await;
        assert_eq!(found.unwrap_err().code, ErrorCode::TopicNotFound);
    }
    assert!(describe(&mut admin, "orders").await.is_ok());

    // alice may, on `orders` only: not on `orders2`, which shares its prefix.
    let mut alice = TestClient::connect(broker.client_addr()).await;
    login(&mut alice, "alice", "pw-a").await.unwrap();
    assert_eq!(
        alice
            .produce("orders", &[record("k", "alice")])
            .await
            .unwrap(),
        1
    );
    let (records, _) = alice.fetch("orders", None, true, 10, 0).await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(describe(&mut alice, "orders").await.is_ok());
    let listed = alice.call(&ListTopicsRequest::default()).await.unwrap();
    let names: Vec<_> = listed.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["orders"]);
    unauthorized(
        alice.produce("orders2", &[record("k", "v")]).await,
        "orders2",
    );
    unauthorized(
        alice.call(&VnodeSplitRequest { vnode: 0 }).await,
        "alice vnode split",
    );
    let (records, _) = admin.fetch("orders2", None, true, 10, 0).await.unwrap();
    assert!(records.is_empty());

    // The superuser bypasses the entries; every refusal was counted.
    let policy = admin
        .call(&PutPolicyRequest {
            policy: PolicyDescription {
                name: "week".into(),
                retention_age_ms: Some(7 * 86_400_000),
                ..PolicyDescription::default()
            },
        })
        .await;
    assert!(policy.is_ok(), "{policy:?}");
    assert!(counter(&broker, "malachi_requests_unauthorized_total") >= 21);
}

/// Logs in with `password` and answers the final refusal's message and
/// retry delay, and the server-first message's shape (salt, count).
async fn failed_login(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
) -> (String, Option<u32>, String) {
    let mut client = TestClient::connect(addr).await;
    client
        .call(&SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        })
        .await
        .unwrap();
    let (first, message) = ScramClient::start(user, "a-client-nonce-0123456789").unwrap();
    let server_first = client
        .call(&SaslAuthenticateRequest {
            auth_bytes: message,
        })
        .await
        .unwrap();
    let shape: Vec<String> = server_first
        .auth_bytes
        .split(',')
        .skip(1)
        .map(|part| format!("{}{}", &part[..2], part.len()))
        .collect();
    let (_, message) = first
        .receive(&server_first.auth_bytes, password.as_bytes())
        .unwrap();
    let frame_id = client
        .send_raw(
            malachi_wire::ApiKey::SaslAuthenticate.code(),
            malachi_wire::Message::encode(&SaslAuthenticateRequest {
                auth_bytes: message,
            })
            .unwrap(),
        )
        .await;
    let frame = client.recv().await.unwrap();
    assert_eq!(frame.correlation_id, frame_id);
    assert_eq!(frame.error_code, ErrorCode::Unauthorized);
    let body = <malachi_wire::ErrorBody as malachi_wire::Message>::decode(frame.payload).unwrap();
    (body.message, body.retry_after_ms, shape.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_users_wrong_passwords_and_replays_are_refused_alike() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    create_user(&mut admin, "known", "right").await;

    // A wrong password and an unknown user: the same answer, shaped alike.
    let known = failed_login(broker.client_addr(), "known", "wrong").await;
    let unknown = failed_login(broker.client_addr(), "nobody", "wrong").await;
    assert_eq!(known.0, "authentication failed: e=invalid-proof");
    assert_eq!(known.0, unknown.0);
    assert_eq!(known.1, unknown.1);
    assert_eq!(known.1, Some(100), "the first failure's delay");
    assert_eq!(known.2, unknown.2, "salt and count look alike");

    // A recorded client-final replayed on a new exchange (even with the
    // same client nonce) fails on the server's fresh nonce.
    let mut first_conn = TestClient::connect(broker.client_addr()).await;
    first_conn
        .call(&SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        })
        .await
        .unwrap();
    let nonce = "a-reused-client-nonce-0123";
    let (first, client_first) = ScramClient::start("admin", nonce).unwrap();
    let server_first = first_conn
        .call(&SaslAuthenticateRequest {
            auth_bytes: client_first.clone(),
        })
        .await
        .unwrap();
    let (_, client_final) = first
        .receive(&server_first.auth_bytes, ADMIN_PASSWORD.as_bytes())
        .unwrap();
    first_conn
        .call(&SaslAuthenticateRequest {
            auth_bytes: client_final.clone(),
        })
        .await
        .unwrap();
    // The exchange is consumed: the final again on the same connection is refused.
    let again = first_conn
        .call(&SaslAuthenticateRequest {
            auth_bytes: client_final.clone(),
        })
        .await;
    unauthorized(again, "a second final on one connection");
    let mut replay = TestClient::connect(broker.client_addr()).await;
    replay
        .call(&SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        })
        .await
        .unwrap();
    let server_first_again = replay
        .call(&SaslAuthenticateRequest {
            auth_bytes: client_first,
        })
        .await
        .unwrap();
    assert_ne!(server_first_again.auth_bytes, server_first.auth_bytes);
    let replayed = replay
        .call(&SaslAuthenticateRequest {
            auth_bytes: client_final,
        })
        .await;
    let message = unauthorized(replayed, "a replayed final");
    assert!(message.contains("invalid-proof"), "{message}");
    unauthorized(
        replay.call(&ListTopicsRequest::default()).await,
        "after a replay",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_and_lockout_hold_on_every_broker() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let security = security(dir.path(), 3_000);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    create_user(&mut admin1, "dave", "pw-d").await;
    create_user(&mut admin1, "eve", "pw-e").await;
    create_replicated_topic_as(&mut admin1, "t").await;

    // An entry added through broker 1 is enforced by broker 3 within a second.
    let mut dave = TestClient::connect(brokers[2].client_addr()).await;
    login(&mut dave, "dave", "pw-d").await.unwrap();
    unauthorized(describe(&mut dave, "t").await, "before the grant");
    grant(
        &mut admin1,
        entry("User:dave", Some("t"), "describe", "allow"),
    )
    .await;
    let granted = Instant::now();
    wait_until(
        "broker 3 enforces the new entry",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || describe(&mut dave, "t").await.is_ok(),
    )
    .await;
    let took = granted.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // A failure on broker 1 delays eve's next login on broker 2 too, even
    // with the right password; once the delay passed, it logs in.
    let (message, retry, _) = failed_login(brokers[0].client_addr(), "eve", "wrong").await;
    assert!(message.contains("invalid-proof"), "{message}");
    assert_eq!(retry, Some(3_000));
    let failed_at = Instant::now();
    let mut eve = TestClient::connect(brokers[1].client_addr()).await;
    let refused = login(&mut eve, "eve", "pw-e").await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    assert!(
        refused.message.contains("try again in"),
        "{}",
        refused.message
    );
    assert!(
        failed_at.elapsed() < Duration::from_secs(3),
        "the test ran too slowly to see the delay"
    );
    wait_until(
        "eve logs in on broker 2 after the delay",
        Duration::from_secs(10),
        Duration::from_millis(200),
        async || {
            let mut eve = TestClient::connect(brokers[1].client_addr()).await;
            login(&mut eve, "eve", "pw-e").await.is_ok()
        },
    )
    .await;
    assert!(failed_at.elapsed() >= Duration::from_millis(2_500));
}

async fn create_replicated_topic_as(admin: &mut TestClient, name: &str) {
    admin
        .call(&CreateTopicRequest {
            name: name.into(),
            replication_factor: Some(3),
            policy: None,
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_logs_in_on_connect_and_a_refused_login_is_final() {
    use malachi_actors::scram_login::ScramLogin;
    use malachi_wire::client::{ClientConfig, ClientError};
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;
    create_user(&mut admin, "sdk", "pw-s").await;
    admin.create_topic("s").await;
    for op in ["produce", "consume"] {
        grant(&mut admin, entry("User:sdk", Some("s"), op, "allow")).await;
    }
    let addr = broker.client_addr().to_string();
    let with = |password: &str| ClientConfig {
        request_timeout_ms: 10_000,
        login: Some(ScramLogin::new("sdk", password.as_bytes()).into_login()),
        ..ClientConfig::default()
    };
    let client = wait_until(
        "the entries reach the cache",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            let client = malachi_wire::Client::connect_with([addr.clone()], with("pw-s"))
                .await
                .unwrap();
            let batch =
                malachi_wire::RecordBatch::from_records(&[record("k", "from-sdk")], 1 << 20)
                    .unwrap();
            let produced = client.produce("s", batch).await;
            produced.ok().map(|_| client)
        },
    )
    .await;
    let fetched = client
        .fetch(&FetchRequest {
            topic: "s".into(),
            cursor: None,
            from_start: true,
            records_max: 10,
            bytes_max: 1 << 20,
            wait_ms: 0,
        })
        .await
        .unwrap();
    assert_eq!(fetched.records.records().len(), 1);

    // A wrong password: the connect fails with the typed, final error.
    let refused = malachi_wire::Client::connect_with([addr.clone()], with("wrong"))
        .await
        .unwrap_err();
    match &refused {
        ClientError::Authentication { reason, .. } => {
            assert!(reason.contains("invalid-proof"), "{reason}")
        }
        other => panic!("not an authentication error: {other:?}"),
    }
    assert!(!refused.retriable());
    assert_eq!(refused.code(), Some(ErrorCode::Unauthorized));
}

/// A connection must log in within `admission_timeout_ms` of its accept
/// (issue 39): one that sends only `api_versions`, and one that sends
/// nothing, are closed and counted; a logged-in one that then goes quiet
/// for longer is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_that_do_not_log_in_in_time_are_closed_and_logged_in_ones_stay() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        security: security(dir.path(), 100),
        admission_timeout_ms: 1_500,
        ..BrokerConfig::for_tests(dir.path().join("data"))
    };
    let broker = start(config).await;
    let mut admin = admin(&broker).await;

    let mut greeted = TestClient::connect(broker.client_addr()).await;
    // A whole frame, answered, but no login.
    let _ = greeted.call(&ApiVersionsRequest::default()).await;
    let silent = TestClient::connect(broker.client_addr()).await;
    let counted = eventually(30_000, async || {
        counter(&broker, "malachi_connections_admission_timed_out_total") >= 2
    })
    .await;
    assert!(
        counted,
        "admission closes: {}",
        counter(&broker, "malachi_connections_admission_timed_out_total")
    );
    assert!(
        greeted.recv().await.is_none(),
        "the connection that never logged in is closed"
    );
    drop(silent);

    // The superuser's connection logged in and has been quiet since, past
    // the deadline: still served.
    admin.create_topic("after-the-deadline").await;
}

/// One login attempt as a guesser makes it: refused at the client-first
/// message while a delay holds (not counted), or a proof checked and
/// refused (counted), with the answer's `retry_after_ms`.
#[derive(Debug, PartialEq)]
enum Attempt {
    Delayed {
        retry_ms: Option<u32>,
        message: String,
    },
    Failed {
        retry_ms: Option<u32>,
    },
    LoggedIn,
}

async fn attempt(addr: std::net::SocketAddr, user: &str, password: &str) -> Attempt {
    use malachi_wire::Message;
    let mut client = TestClient::connect(addr).await;
    client
        .call(&SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        })
        .await
        .unwrap();
    let (first, message) = ScramClient::start(user, "a-client-nonce-0123456789").unwrap();
    let key = malachi_wire::ApiKey::SaslAuthenticate.code();
    let error = |payload| <malachi_wire::ErrorBody as Message>::decode(payload).unwrap();
    client
        .send_raw(
            key,
            SaslAuthenticateRequest {
                auth_bytes: message,
            }
            .encode()
            .unwrap(),
        )
        .await;
    let frame = client.recv().await.unwrap();
    if frame.error_code == ErrorCode::Unauthorized {
        let body = error(frame.payload);
        return Attempt::Delayed {
            retry_ms: body.retry_after_ms,
            message: body.message,
        };
    }
    assert_eq!(frame.error_code, ErrorCode::None, "client-first answered");
    let server_first = SaslAuthenticateResponse::decode(frame.payload).unwrap();
    let (_, message) = first
        .receive(&server_first.auth_bytes, password.as_bytes())
        .unwrap();
    client
        .send_raw(
            key,
            SaslAuthenticateRequest {
                auth_bytes: message,
            }
            .encode()
            .unwrap(),
        )
        .await;
    let frame = client.recv().await.unwrap();
    if frame.error_code == ErrorCode::None {
        return Attempt::LoggedIn;
    }
    assert_eq!(frame.error_code, ErrorCode::Unauthorized, "a wrong proof");
    Attempt::Failed {
        retry_ms: error(frame.payload).retry_after_ms,
    }
}

/// Brute force against one user through all three brokers, at the
/// default lockout policy: each counted failure doubles the delay (1 s,
/// 2 s, 4 s, 8 s), whichever broker it was made on, and every other broker
/// refuses the next attempt until the delay passed. The delays are read
/// from the answers; the wall-clock gaps are printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lockout_delay_doubles_across_brokers() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    // The default policy: 1 s first, doubling, 60 s at most.
    let security = security(
        dir.path(),
        SecuritySettings::default().lockout_delay_first_ms,
    );
    assert_eq!(security.lockout_delay_first_ms, 1_000);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    create_user(&mut admin1, "mallory", "the-right-one").await;

    let mut delays = Vec::new();
    let mut gaps = Vec::new();
    let mut last_counted: Option<Instant> = None;
    for (round, expected) in [1_000u32, 2_000, 4_000, 8_000].into_iter().enumerate() {
        // Guess on the next broker until one guess is counted; while the
        // previous delay holds, each is refused without counting.
        let broker = &brokers[round % 3];
        let mut refused = 0u32;
        let counted = wait_until(
            "a guess is counted once the delay passed",
            Duration::from_secs(20),
            Duration::from_millis(50),
            async || match attempt(broker.client_addr(), "mallory", "a-guess").await {
                Attempt::Failed { retry_ms } => Some(retry_ms),
                Attempt::LoggedIn => panic!("a wrong password logged in"),
                Attempt::Delayed { retry_ms, message } => {
                    assert!(message.contains("try again in"), "{message}");
                    assert!(retry_ms.is_some_and(|ms| ms > 0), "{message}");
                    refused += 1;
                    None
                }
            },
        )
        .await;
        let counted_at = Instant::now();
        if let Some(previous) = last_counted {
            gaps.push((counted_at - previous, refused));
        }
        last_counted = Some(counted_at);
        assert_eq!(counted, Some(expected), "round {round}");
        delays.push(expected);
        // Every broker refuses even the right password while the delay
        // holds (checked only in its first half: a slow machine must not
        // see the delay pass).
        for (i, other) in brokers.iter().enumerate() {
            if counted_at.elapsed() >= Duration::from_millis(u64::from(expected) / 2) {
                break;
            }
            match attempt(other.client_addr(), "mallory", "the-right-one").await {
                Attempt::Delayed { retry_ms, message } => {
                    assert!(retry_ms.is_some_and(|ms| ms <= expected), "{message}");
                    assert!(message.contains("try again in"), "{message}");
                }
                other => panic!(
                    "broker {}: a login during the delay was checked: {other:?}",
                    i + 1
                ),
            }
        }
    }
    eprintln!(
        "lockout delays from the answers (ms): {delays:?}; wall-clock gap before each counted guess and guesses refused meanwhile: {gaps:?}"
    );
}

/// A request refused because the connection's session ended with `code`.
fn ended_with<T: std::fmt::Debug>(answer: Result<T, Refused>, code: &str) -> String {
    let message = unauthorized(answer, code);
    assert!(message.starts_with(&format!("{code}: ")), "{message}");
    message
}

/// Whether the broker closed `client`'s connection (after its answers).
async fn closed_by_broker(client: &mut TestClient) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(10), client.next_frame()).await,
        Ok(None)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_repassworded_users_sessions_end_on_every_broker() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let security = security(dir.path(), 100);
    let brokers: [BrokerHandle; 3] = start_seeded(|node_id, seeds| BrokerConfig {
        security: security.clone(),
        ..cluster_config(dir.path(), node_id, seeds, &[1, 2, 3])
    })
    .await;
    let mut admin1 = admin(&brokers[0]).await;
    create_replicated_topic_as(&mut admin1, "t").await;
    for (user, password) in [("frank", "pw-f"), ("grace", "pw-g")] {
        create_user(&mut admin1, user, password).await;
        for op in ["produce", "describe"] {
            grant(
                &mut admin1,
                entry(&format!("User:{user}"), Some("t"), op, "allow"),
            )
            .await;
        }
    }
    // Two of frank's connections on broker 3, both working.
    let (mut f1, mut f2) = (
        TestClient::connect(brokers[2].client_addr()).await,
        TestClient::connect(brokers[2].client_addr()).await,
    );
    for f in [&mut f1, &mut f2] {
        login(f, "frank", "pw-f").await.unwrap();
        assert!(describe(f, "t").await.is_ok());
    }

    // Deleted through broker 1: broker 3 refuses frank's next request
    // within a second or two (its cached view is at most 500 ms old).
    admin1
        .call(&malachi_wire::auth_admin::DeleteUserRequest {
            name: "frank".into(),
        })
        .await
        .unwrap();
    let deleted = Instant::now();
    let refused = wait_until(
        "broker 3 ends frank's session",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || describe(&mut f1, "t").await.err(),
    )
    .await;
    let took = deleted.elapsed();
    eprintln!("broker 3 refused the deleted user {took:?} after broker 1 deleted it");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let message = ended_with(Err::<(), _>(refused), "principal-removed");
    assert!(message.contains("frank"), "{message}");
    assert!(closed_by_broker(&mut f1).await, "f1 stays open");
    // The other connection's produce is refused and writes nothing.
    ended_with(
        f2.produce("t", &[record("k", "frank")]).await,
        "principal-removed",
    );
    assert!(closed_by_broker(&mut f2).await, "f2 stays open");
    let records = read_all(&mut admin1, "t").await;
    assert!(records.is_empty(), "{records:?}");

    // grace changes her password through broker 3: that connection goes
    // on, her session on broker 2 ends within a second or two.
    let (mut g2, mut g3) = (
        TestClient::connect(brokers[1].client_addr()).await,
        TestClient::connect(brokers[2].client_addr()).await,
    );
    login(&mut g2, "grace", "pw-g").await.unwrap();
    login(&mut g3, "grace", "pw-g").await.unwrap();
    g3.call(&PutUserRequest {
        name: "grace".into(),
        credential: derive_credential(b"pw-g2", Some(ITERATIONS)).unwrap(),
        replace: true,
    })
    .await
    .unwrap();
    let changed = Instant::now();
    let refused = wait_until(
        "broker 2 ends grace's old session",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || describe(&mut g2, "t").await.err(),
    )
    .await;
    assert!(changed.elapsed() < Duration::from_secs(2));
    ended_with(Err::<(), _>(refused), "credential-changed");
    assert!(
        describe(&mut g3, "t").await.is_ok(),
        "the changing session ended"
    );
    let mut again = TestClient::connect(brokers[1].client_addr()).await;
    login(&mut again, "grace", "pw-g2").await.unwrap();
    assert!(describe(&mut again, "t").await.is_ok());
    let ended: u64 = brokers
        .iter()
        .map(|b| {
            counter(
                b,
                "malachi_sessions_ended_total{reason=\"principal-removed\"}",
            ) + counter(
                b,
                "malachi_sessions_ended_total{reason=\"credential-changed\"}",
            )
        })
        .sum();
    assert_eq!(ended, 3);
}
