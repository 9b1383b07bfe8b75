//! TLS between brokers (issue 39, ADR 0151): the cluster port (raft,
//! replica-append, catch-up, orders) and the node fabric speak TLS with a
//! certificate under the cluster CA required both ways. Three brokers
//! replicate and fail over with it on; `openssl s_client` without a
//! client certificate, or with one from another CA, an expired or a
//! self-signed one, is refused; a broker
//! whose certificate another CA signed never joins while the others stay
//! healthy, and gets no copy and no primary though SWIM sees it alive (ADR
//! 0155); a plaintext broker is refused. Each refusal is counted. The
//! cluster CA rotates without a stop (ADR 0164).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::reach::*;
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClusterTls, TlsSettings};
use malachi_cluster::group::{ClusterCookie, TcpTransport, TcpTransportConfig, TransportError};
use malachi_testkit::tls::{LeafSpec, TestCa, write};
use malachi_wire::batch::Record;
use malachi_wire::error::ErrorCode;
use malachi_wire::messages::CreateTopicRequest;
use tokio::io::AsyncWriteExt;

/// A broker certificate (server and client authentication, `localhost`
/// and 127.0.0.1, node `serial` as `malachi:node:<serial>`) from `ca`,
/// written under `dir` as `<name>.pem`/`.key`.
fn node_pair(ca: &TestCa, dir: &Path, name: &str, serial: u64) -> (PathBuf, PathBuf) {
    let leaf = ca.leaf(&LeafSpec::node(serial));
    (
        write(dir, &format!("{name}.pem"), &leaf.cert_pem),
        write(dir, &format!("{name}.key"), &leaf.key_pem),
    )
}

/// Broker `node_id` of brokers 1 to 3, TLS between brokers with `pair`
/// under the CA at `ca_path`; the client port stays plaintext (only the
/// cluster pair is set), so the test client reaches it as it is.
fn tls_config(
    dir: &Path,
    node_id: u64,
    seeds: &[SocketAddr],
    pair: &(PathBuf, PathBuf),
    ca_path: &Path,
) -> BrokerConfig {
    BrokerConfig {
        tls: TlsSettings {
            cluster: Some(ClusterTls::Required),
            cluster_cert_path: Some(pair.0.clone()),
            cluster_key_path: Some(pair.1.clone()),
            cluster_ca_path: Some(ca_path.to_owned()),
            handshake_timeout_ms: 2_000,
            ..TlsSettings::default()
        },
        ..three_node_config(dir, node_id, seeds)
    }
}

/// Three brokers with TLS between them, each with its own certificate.
async fn three_with_tls(dir: &Path) -> (TestCa, PathBuf, Vec<Option<BrokerHandle>>) {
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let pairs: Vec<_> = (1..=3)
        .map(|id| node_pair(&ca, dir, &format!("node-{id}"), id))
        .collect();
    let brokers = start_stoppable(3, |id, seeds| {
        tls_config(dir, id, seeds, &pairs[(id - 1) as usize], &ca_path)
    })
    .await;
    (ca, ca_path, brokers)
}

/// The value of the metric line starting with `prefix` (labels included).
fn metric(broker: &BrokerHandle, prefix: &str) -> u64 {
    broker
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `malachi_cluster_tls_refusals_total` on `port`, inbound, for `reason`.
fn refusals(broker: &BrokerHandle, port: &str, reason: &str) -> u64 {
    refusals_by(broker, port, "inbound", reason)
}

/// `malachi_cluster_tls_refusals_total` on `port`, `direction`, `reason`.
fn refusals_by(broker: &BrokerHandle, port: &str, direction: &str, reason: &str) -> u64 {
    metric(
        broker,
        &format!(
            "malachi_cluster_tls_refusals_total{{port=\"{port}\",direction=\"{direction}\",reason=\"{reason}\"}}"
        ),
    )
}

fn batch(tag: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| record(&format!("k{}", i % 3), &format!("{tag}-{i}")))
        .collect()
}

/// Produces `records` at the active segment's primary until a quorum
/// acknowledges them.
async fn produce_acknowledged(brokers: &[Option<BrokerHandle>], topic: &str, records: &[Record]) {
    assert!(
        eventually(60_000, async || produce_once(brokers, topic, records).await).await,
        "a produce was never acknowledged"
    );
}

/// Every acknowledged value is read back, through the broker that serves
/// the topic now (its active segment's primary).
async fn assert_all_read(brokers: &[Option<BrokerHandle>], topic: &str, sent: &[Record]) {
    let segment = active_segment(brokers, topic).await.unwrap();
    let primary = brokers[(segment.replicas[0] - 1) as usize]
        .as_ref()
        .expect("the primary is live");
    let mut reader = TestClient::connect(primary.client_addr()).await;
    let got: std::collections::BTreeSet<Vec<u8>> = read_all(&mut reader, topic)
        .await
        .into_iter()
        .map(|r| r.value.to_vec())
        .collect();
    for record in sent {
        assert!(
            got.contains(record.value.as_ref()),
            "{:?} was acknowledged and not read back",
            String::from_utf8_lossy(&record.value)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_with_cluster_tls_replicate_a_quorum_and_fail_over() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let (_ca, _ca_path, mut brokers) = three_with_tls(root.path()).await;
    let first = brokers[0].as_ref().unwrap().client_addr();
    create_replicated_topic(first, "secure", 3).await;
    let mut sent = Vec::new();
    for round in 0..5 {
        let records = batch(&format!("before-{round}"), 20);
        produce_acknowledged(&brokers, "secure", &records).await;
        sent.extend(records);
    }
    assert_all_read(&brokers, "secure", &sent).await;
    // Raft, replication and the fabric ran inside TLS sessions, none
    // refused for its certificate or for plaintext (a dial its call's
    // deadline gave up on mid-handshake shows as `closed` at start).
    for broker in brokers.iter().flatten() {
        let stats = broker.cluster_port_stats().unwrap();
        assert!(stats.authenticated > 0, "{stats:?}");
        for port in ["cluster", "fabric"] {
            for reason in ["refused", "plaintext"] {
                assert_eq!(refusals(broker, port, reason), 0, "{port} {reason}");
            }
        }
    }
    // The lower id dials: broker 3's fabric port took sessions from 1 and 2.
    wait_until(
        "broker 3's fabric sessions authenticate",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || match brokers[2].as_ref().unwrap().fabric_inbound_counts() {
            Some((authenticated, _)) if authenticated >= 2 => Ok(()),
            other => Err(other),
        },
    )
    .await;

    // The active segment's primary stops; the others take over, in TLS.
    let segment = active_segment(&brokers, "secure").await.unwrap();
    let primary = segment.replicas[0];
    brokers[(primary - 1) as usize]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    for round in 0..3 {
        let records = batch(&format!("after-{round}"), 20);
        produce_acknowledged(&brokers, "secure", &records).await;
        sent.extend(records);
    }
    let now = active_segment(&brokers, "secure").await.unwrap();
    assert_ne!(now.replicas[0], primary, "{now:?}");
    assert_all_read(&brokers, "secure", &sent).await;
}

/// `openssl s_client` against `addr`: its exit status and output.
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

/// A self-signed certificate and key made by `openssl req -x509`.
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("self.pem"), dir.join("self.key"));
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args([
            "-subj",
            "/CN=self-signed",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl must be installed");
    assert!(status.success());
    (cert, key)
}

async fn s_client_async(addr: SocketAddr, ca: &Path, extra: Vec<String>) -> (bool, String) {
    let ca = ca.to_owned();
    tokio::task::spawn_blocking(move || {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        s_client(addr, &ca, &extra)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn openssl_needs_a_certificate_of_the_cluster_ca_on_the_cluster_port_and_the_fabric() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let pair = node_pair(&ca, dir, "node-1", 1);
    let broker = start(BrokerConfig {
        cluster: malachi_actors::ClusterSettings::default(),
        ..tls_config(dir, 1, &[], &pair, &ca_path)
    })
    .await;
    assert!(broker.wait_ready(30_000).await);
    let other = TestCa::new("another CA");
    let foreign = node_pair(&other, dir, "foreign", 7);
    let expired = {
        let leaf = ca.leaf(&LeafSpec {
            expired: true,
            ..LeafSpec::broker(8)
        });
        (
            write(dir, "expired.pem", &leaf.cert_pem),
            write(dir, "expired.key", &leaf.key_pem),
        )
    };
    let self_signed = self_signed(dir);
    let ports = [
        ("cluster", broker.raft_addr().unwrap()),
        ("fabric", broker.fabric_addr().unwrap()),
    ];
    for (port, addr) in ports {
        // The cluster CA's certificate: the handshake completes.
        let with = |p: &(PathBuf, PathBuf)| {
            vec![
                "-cert".to_owned(),
                p.0.display().to_string(),
                "-key".to_owned(),
                p.1.display().to_string(),
            ]
        };
        let (ok, text) = s_client_async(addr, &ca_path, with(&pair)).await;
        assert!(ok, "{port} {addr} with the cluster's certificate: {text}");
        // No client certificate, and one from another CA, an expired or a
        // self-signed one: refused by the broker during the handshake (TLS
        // 1.2, where the refusal ends the handshake itself, so s_client
        // fails), and counted.
        let before = refusals(&broker, port, "refused");
        let tls12 = || vec!["-tls1_2".to_owned()];
        let (ok, text) = s_client_async(addr, &ca_path, tls12()).await;
        assert!(!ok, "{port} {addr} without a certificate: {text}");
        let bad = [
            ("another CA's", &foreign),
            ("an expired", &expired),
            ("a self-signed", &self_signed),
        ];
        for (what, pair) in bad {
            let mut args = tls12();
            args.extend(with(pair));
            let (ok, text) = s_client_async(addr, &ca_path, args).await;
            assert!(!ok, "{port} {addr} with {what} certificate: {text}");
        }
        // TLS 1.3 too: the broker refuses after the client's Finished.
        let (_, text) = s_client_async(addr, &ca_path, Vec::new()).await;
        wait_until(
            "the refusals are counted",
            Duration::from_secs(10),
            Duration::from_millis(50),
            async || {
                let now = refusals(&broker, port, "refused");
                if now >= before + 5 {
                    Ok(())
                } else {
                    Err((now, text.clone()))
                }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plaintext_dial_to_a_tls_cluster_port_is_refused() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let pair = node_pair(&ca, dir, "node-1", 1);
    let config = BrokerConfig {
        cluster: malachi_actors::ClusterSettings::default(),
        ..tls_config(dir, 1, &[], &pair, &ca_path)
    };
    let cookie = config
        .membership
        .cluster_cookie
        .clone()
        .unwrap_or_else(|| malachi_actors::DEV_CLUSTER_COOKIE.to_owned());
    let broker = start(config).await;
    assert!(broker.wait_ready(30_000).await);
    // A broker without TLS, with the right cookie: no TLS session, so no
    // cookie handshake and no request.
    let plain = TcpTransport::new(TcpTransportConfig::new(
        9,
        ClusterCookie::new(&cookie).unwrap(),
    ));
    plain.set_peer(1, broker.raft_addr().unwrap());
    let answer = plain
        .call_raw(1, malachi_cluster::group::PING_API_KEY, 0, &[], 2_000)
        .await;
    assert!(
        matches!(answer, Err(TransportError::Unreachable { .. })),
        "{answer:?}"
    );
    // Plaintext bytes on the fabric port are refused the same way.
    let mut fabric = tokio::net::TcpStream::connect(broker.fabric_addr().unwrap())
        .await
        .unwrap();
    fabric.write_all(&[0, 0, 0, 0, 0, 0, 0, 8]).await.unwrap();
    wait_until(
        "both plaintext refusals are counted",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            // The cookie handshake's server speaks first: a plaintext broker
            // waits for a challenge that never comes and gives up, so the
            // TLS port sees it close (or time out) without a ClientHello.
            let cluster: u64 = ["plaintext", "closed", "timeout"]
                .iter()
                .map(|reason| refusals(&broker, "cluster", reason))
                .sum();
            let fabric = refusals(&broker, "fabric", "plaintext");
            let stats = broker.cluster_port_stats().unwrap();
            if cluster >= 1 && fabric >= 1 && stats.refused_tls >= 1 {
                Ok(())
            } else {
                Err((cluster, fabric, stats))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_with_another_cas_certificate_never_joins_and_the_others_serve() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let other = TestCa::new("another CA");
    let other_path = write(dir, "other-ca.pem", &other.pem);
    let good: Vec<_> = (1..=2)
        .map(|id| node_pair(&ca, dir, &format!("node-{id}"), id))
        .collect();
    // Broker 3 trusts its own CA and shows its certificate: same cookie,
    // so only TLS keeps it out.
    let rogue = node_pair(&other, dir, "node-3", 3);
    let mut brokers: Vec<BrokerHandle> = Vec::new();
    for id in 1..=3u64 {
        let seeds: Vec<SocketAddr> = brokers.iter().map(|b| b.client_addr()).collect();
        let config = if id == 3 {
            tls_config(dir, id, &seeds, &rogue, &other_path)
        } else {
            tls_config(dir, id, &seeds, &good[(id - 1) as usize], &ca_path)
        };
        brokers.push(malachi_actors::Broker::start(config).await.unwrap());
    }
    for b in &brokers[..2] {
        assert!(
            b.wait_ready(60_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    // SWIM sees broker 3 alive (it has the cookie), but both good brokers
    // find its cluster port refuses them: placement leaves it out (ADR
    // 0155), as it would a dead broker.
    for b in &brokers[..2] {
        wait_unreachable(b, 3).await;
    }
    // So three copies cannot be placed on the two brokers left: refused,
    // retriable, as with a broker down.
    let mut first = TestClient::connect(brokers[0].client_addr()).await;
    let create_three = CreateTopicRequest {
        name: "three-copies".into(),
        replication_factor: Some(3),
        policy: None,
    };
    let mut last = None;
    let refused_for_placement =
        eventually(30_000, async || match first.call(&create_three).await {
            Ok(created) => panic!("three copies placed on two brokers: {created:?}"),
            Err(refused) => {
                let placement = refused.code == ErrorCode::NoQuorum
                    && refused.message.contains("needs 3 live brokers; 2 are live");
                last = Some(refused);
                placement
            }
        })
        .await;
    assert!(refused_for_placement, "{last:?}");
    // Two of three voters: the metadata serves through either good broker,
    // and a topic of two copies goes on the two good brokers.
    let topic = "kept-out".to_owned();
    create_replicated_topic(brokers[0].client_addr(), &topic, 2).await;
    let mut other = TestClient::connect(brokers[1].client_addr()).await;
    let segment = wait_until(
        "the topic is described through broker 2",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || match segments(&mut other, &topic).await {
            Ok(all) => match all.into_iter().find(|s| s.state == "active") {
                Some(active) => Ok(active),
                None => Err(None),
            },
            Err(refused) => Err(Some(refused)),
        },
    )
    .await;
    assert!(!segment.replicas.contains(&3), "{segment:?}");
    let records = batch("good", 10);
    let primary = &brokers[(segment.replicas[0] - 1) as usize];
    let mut writer = TestClient::connect(primary.client_addr()).await;
    let mut last = String::new();
    let acknowledged = eventually(60_000, async || {
        let answer =
            tokio::time::timeout(Duration::from_secs(5), writer.produce(&topic, &records)).await;
        last = format!("{answer:?}");
        answer.is_ok_and(|r| r.is_ok())
    })
    .await;
    assert!(
        acknowledged,
        "{segment:?} never acknowledged a produce: {last}"
    );
    let got = read_all(&mut writer, &topic).await;
    for record in &records {
        assert!(
            got.iter().any(|r| r.value == record.value),
            "{record:?} not read back"
        );
    }
    // Broker 3's connections are refused by both good brokers, on the
    // cluster port and the fabric, and its own refuse theirs.
    wait_until(
        "the rogue broker's connections are refused",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let refused: Vec<u64> = brokers
                .iter()
                .map(|b| refusals(b, "cluster", "refused") + refusals(b, "fabric", "refused"))
                .collect();
            if refused.iter().all(|n| *n > 0) {
                Ok(())
            } else {
                Err(refused)
            }
        },
    )
    .await;
    // Broker 3 never authenticated a connection of the others.
    let rogue_ip_sessions = brokers[2].cluster_port_stats().map(|s| s.authenticated);
    assert_eq!(rogue_ip_sessions.unwrap_or(0), 0, "broker 3 took a session");
    let (authenticated, _) = brokers[2].fabric_inbound_counts().unwrap();
    assert_eq!(authenticated, 0, "broker 3 took a fabric session");
    // Broker 3 knows nothing the cluster wrote: its metadata requests go
    // to the vnode leaders over the cluster port, and TLS refuses them.
    let mut rogue = TestClient::connect(brokers[2].client_addr()).await;
    let described = describe(&mut rogue, &topic).await;
    assert!(
        described.is_err(),
        "broker 3 described {topic}: {described:?}"
    );
}

/// Broker `node_id` of a cluster of brokers 1 to 4, TLS between brokers
/// with `pair` under the CA at `ca_path`.
fn four_config(
    dir: &Path,
    node_id: u64,
    seeds: &[SocketAddr],
    pair: &(PathBuf, PathBuf),
    ca_path: &Path,
) -> BrokerConfig {
    let config = tls_config(dir, node_id, seeds, pair, ca_path);
    BrokerConfig {
        cluster: malachi_actors::ClusterSettings {
            nodes: vec![1, 2, 3, 4],
            ..config.cluster.clone()
        },
        ..config
    }
}

/// Issue 39's gap (ADR 0155): a broker with the cookie (so alive in SWIM)
/// and another CA's certificate is never given a copy or a primary. Four
/// brokers, the fourth a rogue: topics created and split through the
/// three good ones keep every segment off broker 4, and every
/// acknowledged record reads back in each key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_with_another_cas_certificate_gets_no_copy_and_no_primary() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let other = TestCa::new("another CA");
    let other_path = write(dir, "other-ca.pem", &other.pem);
    let mut brokers: Vec<BrokerHandle> = Vec::new();
    for id in 1..=4u64 {
        let seeds: Vec<SocketAddr> = brokers.iter().map(|b| b.client_addr()).collect();
        let config = if id == 4 {
            let rogue = node_pair(&other, dir, "node-4", 4);
            four_config(dir, id, &seeds, &rogue, &other_path)
        } else {
            let pair = node_pair(&ca, dir, &format!("node-{id}"), id);
            four_config(dir, id, &seeds, &pair, &ca_path)
        };
        brokers.push(malachi_actors::Broker::start(config).await.unwrap());
    }
    let good = ready_good(&brokers, 3).await;
    guarded_workload(&good, 4, "guarded").await;
    // Broker 4 took no session from the others all along.
    assert_eq!(
        brokers[3]
            .cluster_port_stats()
            .map_or(0, |s| s.authenticated),
        0
    );
}

/// ADR 0155, the node identity: with `tls.cluster_node_identity =
/// "required"` on every broker, broker 4 shows a certificate of the
/// cluster CA that is for node 2. Each good broker refuses it both ways on
/// the cluster port (as the server dialled, and as a client proving the
/// cookie as node 4) and on the fabric, counts each as `node_identity`,
/// and places nothing on it; the good brokers, each certified as itself,
/// serve as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_for_another_node_is_refused_when_node_identity_is_required() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let ca = TestCa::new("malachi cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &ca.pem);
    let mut brokers: Vec<BrokerHandle> = Vec::new();
    for id in 1..=4u64 {
        let seeds: Vec<SocketAddr> = brokers.iter().map(|b| b.client_addr()).collect();
        // Broker 4's certificate is the right CA's, for node 2.
        let certified = if id == 4 { 2 } else { id };
        let pair = node_pair(&ca, dir, &format!("node-{id}"), certified);
        let mut config = four_config(dir, id, &seeds, &pair, &ca_path);
        config.tls.cluster_node_identity = malachi_actors::NodeIdentity::Required;
        brokers.push(malachi_actors::Broker::start(config).await.unwrap());
    }
    let good = ready_good(&brokers, 3).await;
    guarded_workload(&good, 4, "named").await;
    wait_until(
        "the impostor's connections are refused for their node identity",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let count = |port: &str, direction: &str| -> u64 {
                good.iter()
                    .map(|b| refusals_by(b, port, direction, "node_identity"))
                    .sum()
            };
            let seen = [
                count("cluster", "outbound"),
                count("cluster", "inbound"),
                count("fabric", "outbound"),
            ];
            if seen.iter().all(|n| *n > 0) {
                Ok(())
            } else {
                Err(seen)
            }
        },
    )
    .await;
    // Nothing else was refused among the good brokers.
    for b in &good {
        for port in ["cluster", "fabric"] {
            assert_eq!(refusals(b, port, "refused"), 0, "{port}");
        }
    }
}

/// Writes `text` to `path` as a new file moved into place, as an operator
/// would, so a reload never reads half of it.
fn replace(path: &Path, text: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// `-cert`/`-key` arguments for `s_client`, plus `extra`.
fn showing(pair: &(PathBuf, PathBuf), extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "-cert".to_owned(),
        pair.0.display().to_string(),
        "-key".to_owned(),
        pair.1.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Waits until `s_client` to `addr`, verifying the server against
/// `ca_file` and showing `args`, completes (`ok`) or fails (`!ok`).
async fn wait_s_client(what: &str, addr: SocketAddr, ca_file: &Path, args: Vec<String>, ok: bool) {
    wait_until(
        what,
        Duration::from_secs(30),
        Duration::from_millis(200),
        async || {
            let (done, text) = s_client_async(addr, ca_file, args.clone()).await;
            if done == ok { Ok(()) } else { Err(text) }
        },
    )
    .await;
}

/// The cluster CA rotates without a stop (ADR 0164): the new CA is
/// appended to the bundle, every broker's pair moves to it, the old CA is
/// dropped, and each broker reloads every file within
/// `tls.reload_check_ms`. Then a certificate of the old CA is refused on
/// the cluster port, also when it offers a session it opened while its CA
/// was trusted (no resumption skips the check); one of the new CA is
/// taken; a restarted broker, whose connections are all new and checked
/// under the new CA alone, carries a quorum with a peer; and every
/// acknowledged record reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_ca_rotates_without_a_stop() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let old = TestCa::new("old cluster CA");
    let new = TestCa::new("new cluster CA");
    let ca_path = write(dir, "cluster-ca.pem", &old.pem);
    let both = write(dir, "both-cas.pem", &format!("{}{}", old.pem, new.pem));
    let new_only = write(dir, "new-ca.pem", &new.pem);
    let pairs: Vec<_> = (1..=3)
        .map(|id| node_pair(&old, dir, &format!("node-{id}"), id))
        .collect();
    let config = |id: u64, seeds: &[SocketAddr]| {
        let mut config = tls_config(dir, id, seeds, &pairs[(id - 1) as usize], &ca_path);
        config.tls.reload_check_ms = 100;
        config
    };
    let mut brokers = start_stoppable(3, config).await;
    let cluster_port = |b: &[Option<BrokerHandle>], id: u64| {
        b[(id - 1) as usize].as_ref().unwrap().raft_addr().unwrap()
    };
    create_replicated_topic(brokers[0].as_ref().unwrap().client_addr(), "rotating", 3).await;
    let mut sent = batch("old-ca", 20);
    produce_acknowledged(&brokers, "rotating", &sent).await;
    // Probes: an outsider's certificate of each CA (node 9 and node 8).
    let under_new = node_pair(&new, dir, "probe-new", 9);
    let under_old = node_pair(&old, dir, "probe-old", 8);
    let session = dir.join("old.session");
    let session_arg = session.display().to_string();

    // 1. Both CAs trusted: a certificate of the new CA is taken. The old
    // probe opens a session (TLS 1.2, resumable by id where a broker
    // would resume) while its CA is trusted.
    replace(&ca_path, &format!("{}{}", old.pem, new.pem));
    for id in 1..=3 {
        let args = showing(&under_new, &["-tls1_2"]);
        wait_s_client(
            "the new CA is trusted",
            cluster_port(&brokers, id),
            &both,
            args,
            true,
        )
        .await;
    }
    let args = showing(&under_old, &["-tls1_2", "-sess_out", &session_arg]);
    let (ok, text) = s_client_async(cluster_port(&brokers, 1), &both, args).await;
    assert!(ok, "the old CA is still trusted: {text}");

    // 2. Every broker's pair moves to the new CA (the same paths).
    for id in 1..=3 {
        let leaf = new.leaf(&LeafSpec::node(id));
        replace(&pairs[(id - 1) as usize].1, &leaf.key_pem);
        replace(&pairs[(id - 1) as usize].0, &leaf.cert_pem);
    }
    for id in 1..=3 {
        let args = showing(&under_new, &["-tls1_2"]);
        let what = "the broker shows the new CA's certificate";
        wait_s_client(what, cluster_port(&brokers, id), &new_only, args, true).await;
    }
    let records = batch("moving", 20);
    produce_acknowledged(&brokers, "rotating", &records).await;
    sent.extend(records);

    // 3. The old CA dropped: its certificate is refused, with the session
    // it opened before too; the new CA's is taken.
    replace(&ca_path, &new.pem);
    for id in 1..=3 {
        let args = showing(&under_old, &["-tls1_2"]);
        let what = "the old CA is no longer trusted";
        wait_s_client(what, cluster_port(&brokers, id), &new_only, args, false).await;
    }
    let args = showing(&under_old, &["-tls1_2", "-sess_in", &session_arg]);
    let (ok, text) = s_client_async(cluster_port(&brokers, 1), &new_only, args).await;
    assert!(
        !ok,
        "a session opened under the dropped CA was resumed: {text}"
    );
    let args = showing(&under_new, &["-tls1_2"]);
    let (ok, text) = s_client_async(cluster_port(&brokers, 1), &new_only, args).await;
    assert!(ok, "the new CA's certificate: {text}");

    // Broker 3 restarts: every connection it has is new, checked under the
    // new CA alone both ways. With broker 1 stopped, broker 3 and broker 2
    // are the quorum of every write.
    brokers[2].take().unwrap().shutdown().await.unwrap();
    let seeds: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
    let three = malachi_actors::Broker::start(config(3, &seeds))
        .await
        .unwrap();
    assert!(three.wait_ready(30_000).await, "broker 3 never ready again");
    brokers[2] = Some(three);
    let records = batch("restarted", 20);
    produce_acknowledged(&brokers, "rotating", &records).await;
    sent.extend(records);
    brokers[0].take().unwrap().shutdown().await.unwrap();
    let records = batch("without-1", 20);
    produce_acknowledged(&brokers, "rotating", &records).await;
    sent.extend(records);
    assert_all_read(&brokers, "rotating", &sent).await;
    // Broker 2 ran throughout: it reloaded the bundle twice and its pair.
    let two = brokers[1].as_ref().unwrap();
    let reloaded = metric(two, "malachi_tls_reloads_total{outcome=\"reloaded\"}");
    assert!(reloaded >= 3, "broker 2 reloaded {reloaded} files");
}
