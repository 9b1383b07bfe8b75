//! Metadata operations per second and their p99 with three brokers on
//! loopback (each vnode replicated on all three, logs fsynced): topic
//! creations, then linearizable describes, each from `CLIENTS` concurrent
//! callers spread over the brokers. Ignored by default; run it with
//! `cargo test --release -p malachi-cluster --test metadata_bench -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{TcpTransport, TcpTransportConfig, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_core::model::{Command, NodeId};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const NODES: [u64; 3] = [1, 2, 3];
const CLIENTS: usize = 32;
const OPS_PER_CLIENT: usize = 50;

async fn start(dir: &std::path::Path) -> Vec<(Arc<VnodeHost>, TransportServer)> {
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut brokers = Vec::new();
    for (listener, id) in listeners.into_iter().zip(NODES) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            test_cookie(),
        )));
        for (peer, addr) in NODES.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let config = VnodeHostConfig::new(id, NODES.to_vec(), dir.join(format!("n{id}")));
        let host = VnodeHost::open(config, transport).await.unwrap();
        let server =
            TransportServer::start(listener, host.clone(), server_config(id, 64 << 20)).unwrap();
        brokers.push((host, server));
    }
    brokers
}

fn summary(what: &str, mut latencies: Vec<Duration>, elapsed: Duration) {
    latencies.sort_unstable();
    let n = latencies.len();
    let p = |q: f64| latencies[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    println!(
        "{what}: {n} ops in {:.2} s = {:.0} ops/s; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        p(0.50).as_secs_f64() * 1e3,
        p(0.99).as_secs_f64() * 1e3,
        latencies[n - 1].as_secs_f64() * 1e3,
    );
}

async fn run(
    brokers: &[(Arc<VnodeHost>, TransportServer)],
    describe: bool,
) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let host = brokers[client % brokers.len()].0.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(OPS_PER_CLIENT);
            for i in 0..OPS_PER_CLIENT {
                let topic = format!("bench-{client}-{i}");
                let at = Instant::now();
                if describe {
                    assert!(host.describe(&topic).await.unwrap().is_some());
                } else {
                    host.propose(Command::CreateTopic {
                        topic,
                        initial_ranges: 1,
                        policy: None,
                        replicas: vec![vec![NodeId(1), NodeId(2), NodeId(3)]],
                        at_ms: 1,
                    })
                    .await
                    .unwrap()
                    .unwrap();
                }
                latencies.push(at.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    (all, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --release -- --ignored --nocapture"]
async fn metadata_operations_per_second_with_three_brokers() {
    let dir = tempfile::tempdir().unwrap();
    let brokers = start(dir.path()).await;
    // Let the 16 vnodes elect leaders before the clock starts.
    for (host, _) in &brokers {
        for group in host.registry().all() {
            group.wait_for_leader(10_000).await.unwrap();
        }
    }
    let (created, elapsed) = run(&brokers, false).await;
    summary("create_topic", created, elapsed);
    let (described, elapsed) = run(&brokers, true).await;
    summary("describe_topic", described, elapsed);
    for (host, server) in brokers {
        server.shutdown().await;
        host.shutdown().await;
    }
}

fn test_cookie() -> malachi_cluster::group::ClusterCookie {
    malachi_cluster::group::ClusterCookie::new("test cookie").unwrap()
}

fn server_config(
    node: u64,
    frame_bytes_max: usize,
) -> malachi_cluster::group::TransportServerConfig {
    let mut config = malachi_cluster::group::TransportServerConfig::new(node, test_cookie());
    config.frame_bytes_max = frame_bytes_max;
    config
}
