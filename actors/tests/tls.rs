//! TLS on the client port and the admin port (issue 39, ADR 0149), with
//! real clients: the SDK, rustls' own client, `openssl s_client` and
//! `curl`. Plaintext on a TLS port and TLS on a plaintext port each get a
//! clear error; bad certificates are refused; mTLS `required` refuses a
//! client without a certificate; a changed certificate is served to new
//! connections while old ones keep working; the SDK negotiates
//! AES-256-GCM and clients offering only another suite connect (ADR 0157).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use malachi_actors::{
    Authentication, BrokerConfig, BrokerHandle, ClientAuth, SecuritySettings, TlsSettings,
};
use malachi_testkit::tls::{LeafSpec, PkiFiles, TestCa, pki, write};
use malachi_testkit::wait::wait_until;
use malachi_wire::tls::{ClientTls, ClientTlsFiles};
use malachi_wire::{Client, ClientConfig, ClientError, ErrorCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A broker serving TLS with `files`' broker pair.
fn tls_config(dir: &Path, files: &PkiFiles, client_auth: ClientAuth) -> BrokerConfig {
    BrokerConfig {
        tls: TlsSettings {
            cert_path: Some(files.broker_cert.clone()),
            key_path: Some(files.broker_key.clone()),
            client_ca_path: (client_auth != ClientAuth::None).then(|| files.ca.clone()),
            client_auth,
            handshake_timeout_ms: 2_000,
            reload_check_ms: 100,
            // A lone broker: no peers to speak TLS to.
            cluster: Some(malachi_actors::ClusterTls::Off),
            ..TlsSettings::default()
        },
        ..BrokerConfig::for_tests(dir.join("data"))
    }
}

fn client_tls(ca: &Path, pair: Option<(&Path, &Path)>) -> ClientTls {
    ClientTls::from_files(&ClientTlsFiles {
        ca_path: ca.to_owned(),
        cert_path: pair.map(|p| p.0.to_owned()),
        key_path: pair.map(|p| p.1.to_owned()),
        server_name: None,
    })
    .unwrap()
}

/// An SDK client of `addr`, with `tls`, that fails fast.
async fn sdk(addr: SocketAddr, tls: Option<ClientTls>) -> Result<Client, ClientError> {
    let config = ClientConfig {
        tls,
        request_timeout_ms: 5_000,
        connect_timeout_ms: 5_000,
        retries_max: 0,
        discover_on_connect: false,
        ..ClientConfig::default()
    };
    let client = Client::connect_with([addr.to_string()], config).await?;
    client.api_versions().await?;
    Ok(client)
}

/// A rustls handshake with `addr` through the SDK's config.
async fn handshake(
    addr: SocketAddr,
    tls: &ClientTls,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = tls.server_name_for(&addr.to_string()).unwrap();
    tls.connector().connect(name, tcp).await
}

/// The leaf certificate `addr` presents to a new connection.
async fn presented(addr: SocketAddr, tls: &ClientTls) -> Vec<u8> {
    let stream = handshake(addr, tls).await.unwrap();
    let certs = stream.get_ref().1.peer_certificates().unwrap();
    certs[0].as_ref().to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

fn metric(broker: &BrokerHandle, name: &str) -> u64 {
    counter(broker, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_sdk_client_produces_over_tls_with_aws_lc_rs() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let tls = client_tls(&files.ca, None);
    // The provider in use: only aws-lc-rs offers the hybrid ML-KEM group,
    // and a rustls client of the same provider negotiates it.
    let stream = handshake(broker.client_addr(), &tls).await.unwrap();
    let group = stream.get_ref().1.negotiated_key_exchange_group().unwrap();
    assert_eq!(group.name(), rustls::NamedGroup::X25519MLKEM768);
    drop(stream);
    let client = sdk(broker.client_addr(), Some(tls)).await.unwrap();
    client.create_topic("tls", None, None).await.unwrap();
    let produced = client
        .produce(
            "tls",
            produce_request("tls", &[record("k", "over tls")]).records,
        )
        .await
        .unwrap();
    assert_eq!(produced.records_acknowledged, 1);
    let topics = client.list_topics().await.unwrap();
    assert!(topics.topics.iter().any(|t| t.name == "tls"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plaintext_client_on_a_tls_port_is_told_and_counted() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let error = sdk(broker.client_addr(), None).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::Unauthorized), "{error}");
    assert!(error.to_string().contains("speaks TLS only"), "{error}");
    let name = "malachi_tls_handshake_failures_total{reason=\"plaintext\"}";
    assert!(metric(&broker, name) >= 1, "{}", broker.metrics_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_client_on_a_plaintext_port_is_closed_not_framed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(BrokerConfig::for_tests(dir.path().join("data"))).await;
    let error = sdk(broker.client_addr(), Some(client_tls(&files.ca, None)))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Tls { .. }), "{error}");
    assert!(error.to_string().contains("plaintext"), "{error}");
    assert!(!error.to_string().contains("too large"), "{error}");
    // The broker says which, and answers the ClientHello with no frame.
    let mut tcp = TcpStream::connect(broker.client_addr()).await.unwrap();
    tcp.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0])
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .unwrap()
        .ok();
    assert!(answer.is_empty(), "{answer:?}");
    assert!(metric(&broker, "malachi_tls_clients_on_plaintext_total") >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_certificate_and_one_from_another_ca_are_refused_by_the_client() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    // Signed by another CA than the one the client trusts.
    let other = TestCa::new("another CA");
    let other_dir = tempfile::tempdir().unwrap();
    let other_ca = write(other_dir.path(), "other.pem", &other.pem);
    let error = sdk(broker.client_addr(), Some(client_tls(&other_ca, None)))
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Tls { .. }), "{error}");
    assert!(error.to_string().contains("UnknownIssuer"), "{error}");
    // Expired: the broker's pair replaced by an expired one of the right CA.
    let expired = ca.leaf(&LeafSpec {
        expired: true,
        ..LeafSpec::broker(3)
    });
    write(dir.path(), "broker.pem", &expired.cert_pem);
    write(dir.path(), "broker.key", &expired.key_pem);
    let addr = broker.client_addr();
    let error = wait_until(
        "the expired certificate is served and refused",
        Duration::from_secs(20),
        Duration::from_millis(50),
        // A fresh config each time: one that connected before would resume
        // its session, which presents no certificate.
        async || match sdk(addr, Some(client_tls(&files.ca, None))).await {
            Err(e) if e.to_string().contains("certificate expired") => Ok(e),
            Err(e) => Err(e.to_string()),
            Ok(_) => Err("served".to_owned()),
        },
    )
    .await;
    assert!(matches!(error, ClientError::Tls { .. }), "{error}");
    wait_until(
        "the refusals are counted",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            metric(
                &broker,
                "malachi_tls_handshake_failures_total{reason=\"refused\"}",
            ) >= 2
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mtls_required_refuses_a_client_without_a_certificate() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::Required)).await;
    let without = sdk(broker.client_addr(), Some(client_tls(&files.ca, None))).await;
    assert!(
        without.is_err(),
        "a client without a certificate was served"
    );
    let pair = (files.client_cert.as_path(), files.client_key.as_path());
    let with = sdk(
        broker.client_addr(),
        Some(client_tls(&files.ca, Some(pair))),
    )
    .await;
    with.unwrap()
        .create_topic("mtls", None, None)
        .await
        .unwrap();
    // A client certificate from another CA is refused too.
    let other = TestCa::new("another CA");
    let leaf = other.leaf(&LeafSpec::client("mallory", 9));
    let cert = write(dir.path(), "mallory.pem", &leaf.cert_pem);
    let key = write(dir.path(), "mallory.key", &leaf.key_pem);
    let foreign = sdk(
        broker.client_addr(),
        Some(client_tls(&files.ca, Some((&cert, &key)))),
    )
    .await;
    assert!(
        foreign.is_err(),
        "a client certificate of another CA was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_certificate_logs_in_as_its_common_name_and_acls_judge_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (ca, files) = pki(dir.path());
    let config = BrokerConfig {
        security: SecuritySettings {
            authentication: Authentication::Scram,
            // The pki's client certificate names `alice` in its CN.
            superusers: vec!["User:alice".into()],
            ..SecuritySettings::default()
        },
        ..tls_config(dir.path(), &files, ClientAuth::Required)
    };
    let broker = start(config).await;
    let pair = (files.client_cert.as_path(), files.client_key.as_path());
    let alice = sdk(
        broker.client_addr(),
        Some(client_tls(&files.ca, Some(pair))),
    )
    .await
    .unwrap();
    // No SCRAM exchange: the certificate made the connection `alice`.
    alice.create_topic("by-cert", None, None).await.unwrap();
    // `bob`, of the same CA, is authenticated too, but nothing allows him.
    let leaf = ca.leaf(&LeafSpec::client("bob", 11));
    let cert = write(dir.path(), "bob.pem", &leaf.cert_pem);
    let key = write(dir.path(), "bob.key", &leaf.key_pem);
    let bob = sdk(
        broker.client_addr(),
        Some(client_tls(&files.ca, Some((&cert, &key)))),
    )
    .await
    .unwrap();
    let refused = bob.create_topic("bobs", None, None).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Unauthorized), "{refused}");
    assert!(refused.to_string().contains("User:bob"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_changed_certificate_reaches_new_connections_and_a_bad_one_is_kept_out() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let tls = client_tls(&files.ca, None);
    let old = sdk(broker.client_addr(), Some(tls.clone())).await.unwrap();
    old.create_topic("reload", None, None).await.unwrap();
    let before = presented(broker.client_addr(), &tls).await;
    // A new pair, serial 7, written over the old files.
    let next = ca.leaf(&LeafSpec::broker(7));
    write(dir.path(), "broker.pem", &next.cert_pem);
    write(dir.path(), "broker.key", &next.key_pem);
    let want = der_of(&next.cert_pem);
    assert_ne!(before, want);
    let addr = broker.client_addr();
    wait_until(
        "a new connection sees the new certificate",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || presented(addr, &client_tls(&files.ca, None)).await == want,
    )
    .await;
    assert!(metric(&broker, "malachi_tls_reloads_total{outcome=\"reloaded\"}") >= 1);
    // The connection opened before the change still works.
    let batch = produce_request("reload", &[record("k", "v")]).records;
    let produced = old.produce("reload", batch).await.unwrap();
    assert_eq!(produced.records_acknowledged, 1);
    // A key that does not match the certificate is kept out: the pair of
    // serial 7 keeps serving.
    let stray = ca.leaf(&LeafSpec::broker(8));
    write(dir.path(), "broker.key", &stray.key_pem);
    wait_until(
        "the bad pair is tried and counted",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            let _ = presented(addr, &client_tls(&files.ca, None)).await;
            metric(&broker, "malachi_tls_reloads_total{outcome=\"failed\"}") >= 1
        },
    )
    .await;
    assert_eq!(presented(addr, &client_tls(&files.ca, None)).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_connection_on_a_tls_port_meets_the_handshake_deadline() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let mut tcp = TcpStream::connect(broker.client_addr()).await.unwrap();
    let mut sink = [0u8; 64];
    // handshake_timeout_ms is 2 s: the close comes well within 15.
    let read = tokio::time::timeout(Duration::from_secs(15), tcp.read(&mut sink)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    wait_until(
        "the timeout is counted",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            metric(
                &broker,
                "malachi_tls_handshake_failures_total{reason=\"timeout\"}",
            ) >= 1
        },
    )
    .await;
}

/// `openssl s_client` against `addr`, verifying against `ca`: its exit
/// status and output. Missing openssl fails the test (CI installs it).
fn s_client(addr: SocketAddr, ca: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(ca)
        .args(["-verify_return_error", "-brief"])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl must be installed (Debian's openssl package; .ci/run installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openssl_verifies_the_client_port_and_the_admin_port() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    for addr in [broker.client_addr(), broker.admin_addr()] {
        let ca = files.ca.clone();
        let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &ca, &[]))
            .await
            .unwrap();
        assert!(ok, "{addr}: {text}");
        assert!(text.contains("Verification: OK"), "{addr}: {text}");
    }
    // Another CA: openssl refuses to go on.
    let other = TestCa::new("another CA");
    let other_ca: PathBuf = write(dir.path(), "other.pem", &other.pem);
    let addr = broker.client_addr();
    let (ok, text) = tokio::task::spawn_blocking(move || s_client(addr, &other_ca, &[]))
        .await
        .unwrap();
    assert!(!ok, "{text}");
}

/// A rustls handshake with `addr` from a client that offers only `suite`.
async fn handshake_offering(
    addr: SocketAddr,
    ca: &Path,
    suite: rustls::SupportedCipherSuite,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    use malachi_wire::tls::{load_roots, provider};
    let mut provider = std::sync::Arc::unwrap_or_clone(provider());
    provider.cipher_suites = vec![suite];
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(load_roots(ca, "TLS CA file").unwrap())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(addr.ip().to_string()).unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
}

/// ADR 0157: the SDK and the broker negotiate rustls' first TLS 1.3
/// suite, AES-256-GCM (AES-128-GCM first was measured and not kept); a
/// client that offers only AES-128-GCM or ChaCha20-Poly1305, or only
/// AES-256-GCM, connects, with rustls or openssl.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdk_negotiates_aes_256_gcm_and_a_client_offering_one_other_suite_connects() {
    use rustls::CipherSuite;
    use rustls::crypto::aws_lc_rs::cipher_suite as suites;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let addr = broker.client_addr();
    let stream = handshake(addr, &client_tls(&files.ca, None)).await.unwrap();
    let negotiated = stream.get_ref().1.negotiated_cipher_suite().unwrap();
    assert_eq!(negotiated.suite(), CipherSuite::TLS13_AES_256_GCM_SHA384);
    drop(stream);
    for suite in [
        suites::TLS13_AES_256_GCM_SHA384,
        suites::TLS13_CHACHA20_POLY1305_SHA256,
        suites::TLS13_AES_128_GCM_SHA256,
    ] {
        let stream = handshake_offering(addr, &files.ca, suite).await.unwrap();
        let negotiated = stream.get_ref().1.negotiated_cipher_suite().unwrap();
        assert_eq!(negotiated.suite(), suite.suite());
    }
    for suite in [
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_AES_128_GCM_SHA256",
    ] {
        let ca = files.ca.clone();
        let (ok, text) = tokio::task::spawn_blocking(move || {
            s_client(addr, &ca, &["-tls1_3", "-ciphersuites", suite])
        })
        .await
        .unwrap();
        assert!(ok, "{suite}: {text}");
        assert!(text.contains(&format!("Ciphersuite: {suite}")), "{text}");
    }
    // The SDK works over it end to end.
    let client = sdk(addr, Some(client_tls(&files.ca, None))).await.unwrap();
    client.list_topics().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curl_reads_ready_over_tls_and_plain_http_gets_nothing() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let broker = start(tls_config(dir.path(), &files, ClientAuth::None)).await;
    let url = format!("https://localhost:{}/ready", broker.admin_addr().port());
    assert_eq!(curl_status(url, files.ca.clone()).await, "200");
    // Plain HTTP on the TLS admin port gets no HTTP answer.
    let mut tcp = TcpStream::connect(broker.admin_addr()).await.unwrap();
    tcp.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut answer)).await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tls_client_gone_while_waiting_for_budget_is_noticed_before_its_deadline() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let frame = 64 << 10;
    let broker = start(BrokerConfig {
        frame_bytes_max: frame,
        connection_request_bytes_max: frame,
        request_bytes_budget: frame,
        address_request_bytes_max: frame,
        // Only the peer's close can end the waiting connection in time.
        frame_read_timeout_ms: 120_000,
        ..tls_config(dir.path(), &files, ClientAuth::None)
    })
    .await;
    let tls = client_tls(&files.ca, None);
    // A holds nearly the whole budget with a partial frame.
    let mut a = handshake(broker.client_addr(), &tls).await.unwrap();
    a.write_all(&(60u32 << 10).to_be_bytes()).await.unwrap();
    a.write_all(&vec![0u8; 58 << 10]).await.unwrap();
    a.flush().await.unwrap();
    wait_until(
        "A's partial frame holds the budget",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || counter(&broker, "malachi_request_bytes_in_use") >= 56 << 10,
    )
    .await;
    // B starts a frame and must wait for budget; then it goes away.
    let mut b = handshake(broker.client_addr(), &client_tls(&files.ca, None))
        .await
        .unwrap();
    b.write_all(&[0, 0, 16, 0, 0, 0, 0, 0]).await.unwrap();
    b.flush().await.unwrap();
    wait_until(
        "both connections are up",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || broker.connections() == 2,
    )
    .await;
    drop(b);
    wait_until(
        "B's close is noticed while it waits for budget",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || broker.connections() == 1,
    )
    .await;
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_file_that_does_not_load_stops_the_start_naming_it() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let missing = PkiFiles {
        broker_cert: dir.path().join("absent.pem"),
        ..files.clone()
    };
    let error = malachi_actors::Broker::start(tls_config(dir.path(), &missing, ClientAuth::None))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("tls.cert_path") && error.contains("absent.pem"),
        "{error}"
    );
    // A key that is not PEM.
    let garbage = write(dir.path(), "garbage.key", "not a key");
    let bad_key = PkiFiles {
        broker_key: garbage,
        ..files
    };
    let error = malachi_actors::Broker::start(tls_config(dir.path(), &bad_key, ClientAuth::None))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("tls.key_path"), "{error}");
}

/// `curl` for `url`'s status code, with `ca` when it is https.
async fn curl_status(url: String, ca: PathBuf) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
            ])
            .arg(ca)
            .arg(url)
            .output()
            .expect("curl must be installed")
    })
    .await
    .unwrap();
    let code = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!code.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    code
}

/// `tls.client_ports = "accept"` (ADR 0162), the step that lets clients
/// move to TLS one by one: the client port serves the SDK with and
/// without TLS, the admin port answers `curl` over https and plain http,
/// a plaintext client that waits past the handshake deadline before its
/// first request is still served, and each plaintext client is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_ports_that_accept_both_serve_tls_and_plaintext_clients() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (_ca, files) = pki(dir.path());
    let mut config = tls_config(dir.path(), &files, ClientAuth::None);
    config.tls.client_ports = malachi_actors::ClientPortsTls::Accept;
    let broker = start(config).await;
    let addr = broker.client_addr();
    // Opened now, its first request sent after the TLS deadline (2 s).
    let mut late = TestClient::connect(addr).await;

    let secure = sdk(addr, Some(client_tls(&files.ca, None))).await.unwrap();
    secure.create_topic("both", None, None).await.unwrap();
    let plain = sdk(addr, None).await.unwrap();
    for (client, value) in [(&secure, "over tls"), (&plain, "in plaintext")] {
        let batch = produce_request("both", &[record("k", value)]).records;
        let produced = client.produce("both", batch).await.unwrap();
        assert_eq!(produced.records_acknowledged, 1, "{value}");
    }
    assert!(counter(&broker, "malachi_plaintext_accepted_total{port=\"client\"}") >= 1);
    assert_eq!(
        metric(
            &broker,
            "malachi_tls_handshake_failures_total{reason=\"plaintext\"}"
        ),
        0
    );

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let listed: malachi_wire::messages::ListTopicsResponse = late
        .call(&malachi_wire::messages::ListTopicsRequest {})
        .await
        .unwrap();
    assert!(listed.topics.iter().any(|t| t.name == "both"), "{listed:?}");

    let port = broker.admin_addr().port();
    let https = curl_status(format!("https://localhost:{port}/ready"), files.ca.clone()).await;
    let http = curl_status(format!("http://127.0.0.1:{port}/ready"), files.ca.clone()).await;
    assert_eq!((https.as_str(), http.as_str()), ("200", "200"));
    assert!(counter(&broker, "malachi_plaintext_accepted_total{port=\"admin\"}") >= 1);
}

/// The client CA rotates without a restart (ADR 0164): the bundle at
/// `tls.client_ca_path` gains a new CA, whose clients are then served,
/// and loses the old one, whose clients are then refused, also when they
/// offer a session opened while their CA was trusted (the client port
/// resumes no session when it checks certificates).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_ca_bundle_reloads_and_a_dropped_cas_session_is_not_resumed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let (ca, files) = pki(dir.path());
    // What clients verify the broker against (the broker's CA stays).
    let server_ca = write(dir.path(), "server-ca.pem", &ca.pem);
    let broker = start(tls_config(dir.path(), &files, ClientAuth::Required)).await;
    let addr = broker.client_addr();
    let new = TestCa::new("new client CA");
    let leaf = new.leaf(&LeafSpec::client("bob", 11));
    let bob = (
        write(dir.path(), "bob.pem", &leaf.cert_pem),
        write(dir.path(), "bob.key", &leaf.key_pem),
    );
    let bob_tls = || client_tls(&server_ca, Some((bob.0.as_path(), bob.1.as_path())));
    let session = dir.path().join("alice.session").display().to_string();
    let alice = |extra: &[&str]| {
        let mut args = vec![
            "-cert",
            files.client_cert.to_str().unwrap(),
            "-key",
            files.client_key.to_str().unwrap(),
            "-tls1_2",
        ];
        args.extend_from_slice(extra);
        s_client(addr, &server_ca, &args)
    };
    let (ok, text) = alice(&["-sess_out", &session]);
    assert!(ok, "alice, under the client CA: {text}");
    assert!(
        sdk(addr, Some(bob_tls())).await.is_err(),
        "bob before his CA"
    );

    let replace = |text: &str| {
        let staged = dir.path().join("ca.staged");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &files.ca).unwrap();
    };
    replace(&format!("{}{}", ca.pem, new.pem));
    wait_until(
        "bob's CA is trusted",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || sdk(addr, Some(bob_tls())).await.map(|_| ()),
    )
    .await;
    assert!(alice(&[]).0, "alice while both CAs are trusted");

    replace(&new.pem);
    wait_until(
        "alice's CA is dropped",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || match alice(&[]) {
            (false, _) => Ok(()),
            (true, text) => Err(text),
        },
    )
    .await;
    let (ok, text) = alice(&["-sess_in", &session]);
    assert!(!ok, "alice resumed a session of a dropped CA: {text}");
    sdk(addr, Some(bob_tls()))
        .await
        .unwrap()
        .create_topic("rotated", None, None)
        .await
        .unwrap();
    assert!(metric(&broker, "malachi_tls_reloads_total{outcome=\"reloaded\"}") >= 2);
}
