//! A rolling move from plaintext to TLS (issue 39, ADR 0162): three
//! brokers that speak plaintext to each other are restarted one at a time
//! with `tls.cluster = "accept"`, then one at a time with `"send"`, then
//! one at a time with `"required"`, a topic of three copies written after
//! every restart. At every moment each pair of brokers talks (raft on the
//! cluster port in both directions, the node fabric), no record
//! acknowledged is lost or reordered within its key, and at the end the
//! cluster port refuses a plaintext broker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle, ClientPortsTls, ClusterTls, TlsSettings};
use malachi_cluster::group::{ClusterCookie, TcpTransport, TcpTransportConfig, TransportError};
use malachi_testkit::tls::{LeafSpec, TestCa, write};
use malachi_wire::batch::Record;

const TOPIC: &str = "rolling";
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// The files of one broker's TLS: its pair and the cluster CA.
struct Pki {
    ca: PathBuf,
    pairs: Vec<(PathBuf, PathBuf)>,
}

fn pki(dir: &Path) -> Pki {
    let ca = TestCa::new("malachi cluster CA");
    let pairs = (1..=3)
        .map(|id| {
            let leaf = ca.leaf(&LeafSpec::node(id));
            (
                write(dir, &format!("node-{id}.pem"), &leaf.cert_pem),
                write(dir, &format!("node-{id}.key"), &leaf.key_pem),
            )
        })
        .collect();
    Pki {
        ca: write(dir, "cluster-ca.pem", &ca.pem),
        pairs,
    }
}

/// Broker `node_id`: plaintext (`mode` `None`), or TLS between brokers in
/// `mode`, its client and admin ports taking TLS and plaintext.
fn config(
    dir: &Path,
    pki: &Pki,
    node_id: u64,
    seeds: &[SocketAddr],
    mode: Option<ClusterTls>,
) -> BrokerConfig {
    let mut config = three_node_config(dir, node_id, seeds);
    if let Some(mode) = mode {
        let pair = &pki.pairs[(node_id - 1) as usize];
        config.tls = TlsSettings {
            cert_path: Some(pair.0.clone()),
            key_path: Some(pair.1.clone()),
            client_ports: ClientPortsTls::Accept,
            cluster: Some(mode),
            cluster_ca_path: Some(pki.ca.clone()),
            handshake_timeout_ms: 2_000,
            ..TlsSettings::default()
        };
    }
    config
}

/// Writes `tag`'s records until a quorum acknowledges them.
async fn write_acknowledged(brokers: &[Option<BrokerHandle>], tag: &str) -> Vec<Record> {
    let records = keyed_batch(tag, 12, 4);
    let what = format!("the {tag} records are acknowledged");
    wait_until(&what, WAIT, POLL, async || {
        produce_once(brokers, TOPIC, &records).await.then_some(())
    })
    .await;
    records
}

/// Connections authenticated on each broker's cluster port, and on its
/// node fabric port, so far; none for a broker that is down.
fn sessions(brokers: &[Option<BrokerHandle>]) -> Vec<(u64, u64)> {
    brokers
        .iter()
        .map(|b| {
            b.as_ref().map_or((0, 0), |b| {
                let cluster = b.cluster_port_stats().map_or(0, |s| s.authenticated);
                let fabric = b.fabric_inbound_counts().map_or(0, |c| c.0);
                (cluster, fabric)
            })
        })
        .collect()
}

/// Waits until broker `restarted` and its peers talk both ways: each peer
/// took a cluster-port connection from it and it took one from each peer
/// (raft runs between every pair); on the fabric the lower id dials, so
/// each higher peer took a session from it and it took one from each
/// lower peer.
async fn wait_talking(brokers: &[Option<BrokerHandle>], restarted: u64, before: &[(u64, u64)]) {
    let what = format!("broker {restarted} and its peers talk both ways");
    wait_until(&what, WAIT, POLL, async || {
        let now = sessions(brokers);
        let lower = restarted - 1;
        let me = now[(restarted - 1) as usize];
        let peers_took = (1..=3u64).filter(|p| *p != restarted).all(|p| {
            let (i, was) = ((p - 1) as usize, before[(p - 1) as usize]);
            now[i].0 > was.0 && (p < restarted || now[i].1 > was.1)
        });
        (me.0 >= 2 && me.1 >= lower && peers_took)
            .then_some(())
            .ok_or(now)
    })
    .await;
}

/// Restarts broker `node_id` on its data in `mode`, and waits until it
/// talks with both peers.
async fn restart(
    brokers: &mut [Option<BrokerHandle>],
    dir: &Path,
    pki: &Pki,
    node_id: u64,
    mode: ClusterTls,
) {
    let index = (node_id - 1) as usize;
    brokers[index].take().unwrap().shutdown().await.unwrap();
    let before = sessions(brokers);
    let seeds: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
    let broker = malachi_actors::Broker::start(config(dir, pki, node_id, &seeds, Some(mode)))
        .await
        .unwrap();
    assert!(
        broker.wait_ready(30_000).await,
        "broker {node_id} never ready"
    );
    brokers[index] = Some(broker);
    wait_talking(brokers, node_id, &before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plaintext_cluster_moves_to_tls_one_broker_at_a_time() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let pki = pki(root.path());
    let mut brokers =
        start_stoppable(3, |id, seeds| config(root.path(), &pki, id, seeds, None)).await;
    let first = brokers[0].as_ref().unwrap().client_addr();
    create_replicated_topic(first, TOPIC, 3).await;
    let mut sent = write_acknowledged(&brokers, "plain").await;

    for mode in [ClusterTls::Accept, ClusterTls::Send, ClusterTls::Required] {
        for node_id in 1..=3 {
            restart(&mut brokers, root.path(), &pki, node_id, mode).await;
            let tag = format!("{}-{node_id}", mode.name());
            sent.extend(write_acknowledged(&brokers, &tag).await);
        }
        if mode == ClusterTls::Accept {
            // Every broker dials plaintext in this step, so each took
            // plaintext peers on its cluster port.
            for broker in brokers.iter().flatten() {
                let name = "malachi_plaintext_accepted_total{port=\"cluster\"}";
                assert!(counter(broker, name) >= 1, "{}", broker.metrics_text());
            }
        }
    }

    // Every acknowledged record once, in order within its key, through a
    // plaintext client (the client ports still take both).
    let live: Vec<&BrokerHandle> = brokers.iter().flatten().collect();
    let mut reader = common::redirects::reader_at(&live, live[0], TOPIC).await;
    let got = read_all(&mut reader, TOPIC).await;
    assert_eq!(by_key(&got), by_key(&sent));

    // Now TLS only between brokers: a plaintext broker with the cookie is
    // refused (it waits, silent, for the cookie handshake's hello, so the
    // port sees no ClientHello and gives up), and none was taken.
    let target = brokers[2].as_ref().unwrap();
    let plain = TcpTransport::new(TcpTransportConfig::new(
        9,
        ClusterCookie::new(malachi_actors::DEV_CLUSTER_COOKIE).unwrap(),
    ));
    plain.set_peer(3, target.raft_addr().unwrap());
    let answer = plain
        .call_raw(3, malachi_cluster::group::PING_API_KEY, 0, &[], 4_000)
        .await;
    assert!(
        matches!(answer, Err(TransportError::Unreachable { .. })),
        "{answer:?}"
    );
    wait_until("the plaintext dial is refused", WAIT, POLL, async || {
        let stats = target.cluster_port_stats().unwrap();
        (stats.refused_tls >= 1).then_some(()).ok_or(stats)
    })
    .await;
    assert_eq!(
        counter(target, "malachi_plaintext_accepted_total{port=\"cluster\"}"),
        0
    );
    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}
