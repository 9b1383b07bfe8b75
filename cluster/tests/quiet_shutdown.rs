//! An ordered shutdown is quiet (issue 18, ADR 0100): three brokers in one
//! process on loopback stop one after another, as `malachi dev` stops them,
//! while reads and writes are still in flight through each, and nothing is
//! logged as an error, nor as a warning outside openraft's own (which the
//! broker's default filter hides: they narrate conditions raft rides out).
//!
//! Before, a call into raft still waiting when its group stopped (a
//! linearizable read's heartbeat round) and a heartbeat answer arriving
//! after the core stopped were logged by openraft as ERROR lines.
//!
//! This file is its own test binary: it installs a global subscriber to
//! see the events of every runtime thread.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::create;
use malachi_cluster::group::{
    ClusterCookie, TcpTransport, TcpTransportConfig, TransportServer, TransportServerConfig,
};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_testkit::wait::wait_until;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::Level;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const NODES: [u64; 3] = [1, 2, 3];

/// Every WARN and ERROR event: level, target and fields.
#[derive(Clone, Default)]
struct Loud(Arc<Mutex<Vec<(Level, String, String)>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Loud {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return;
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let target = event.metadata().target().to_owned();
        self.0.lock().unwrap().push((level, target, fields.0));
    }
}

struct Broker {
    host: Arc<VnodeHost>,
    server: TransportServer,
    _dir: tempfile::TempDir,
}

async fn start() -> Vec<Broker> {
    let mut listeners = Vec::new();
    for _ in NODES {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let cookie = ClusterCookie::new("test cookie").unwrap();
    let mut brokers = Vec::new();
    for (listener, id) in listeners.into_iter().zip(NODES) {
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            id,
            cookie.clone(),
        )));
        for (peer, addr) in NODES.iter().zip(&addrs) {
            if *peer != id {
                transport.set_peer(*peer, *addr);
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut config = VnodeHostConfig::new(id, NODES.to_vec(), dir.path());
        config.vnode_count = 16;
        let host = VnodeHost::open(config, transport).await.unwrap();
        let server = TransportServer::start(
            listener,
            host.clone(),
            TransportServerConfig::new(id, cookie.clone()),
        )
        .unwrap();
        brokers.push(Broker {
            host,
            server,
            _dir: dir,
        });
    }
    brokers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn brokers_stopping_one_by_one_under_reads_and_writes_log_no_error() {
    let loud = Loud::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(loud.clone()))
        .unwrap();

    let brokers = start().await;
    let topics: Vec<String> = (0..16).map(|i| format!("orders-{i}")).collect();
    for (i, topic) in topics.iter().enumerate() {
        let host = &brokers[i % brokers.len()].host;
        // The groups elect first: a creation may be refused while they do.
        let what = format!("{topic} is created");
        wait_until(
            &what,
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || matches!(host.propose(create(topic)).await, Ok(Ok(_))),
        )
        .await;
    }
    // What happened while the groups formed is not this test's subject.
    loud.0.lock().unwrap().clear();

    // Linearizable reads and writes through every broker, without pause,
    // until the end: some are in flight whenever a group stops.
    let running = Arc::new(AtomicBool::new(true));
    let mut load = Vec::new();
    for (b, broker) in brokers.iter().enumerate() {
        for worker in 0..8 {
            let host = Arc::clone(&broker.host);
            let running = Arc::clone(&running);
            let topics = topics.clone();
            load.push(tokio::spawn(async move {
                let mut i = worker;
                while running.load(Ordering::Relaxed) && !host.is_stopped() {
                    let topic = &topics[i % topics.len()];
                    let failed = if i % 5 == 0 {
                        !matches!(
                            host.propose(create(&format!("more-{b}-{i}"))).await,
                            Ok(Ok(_))
                        )
                    } else {
                        host.describe(topic).await.is_err()
                    };
                    if failed {
                        // A vnode between leaders: no busy loop meanwhile
                        // (pacing, not synchronisation).
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    i += 8;
                }
            }));
        }
    }
    // Pacing: the load runs for a moment before the shutdown meets it.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // As `malachi dev` does: the last broker first, each in the order the
    // broker's own shutdown uses (the raft server, then the groups).
    for broker in brokers.into_iter().rev() {
        broker.server.shutdown().await;
        tokio::time::timeout(Duration::from_secs(30), broker.host.shutdown())
            .await
            .expect("a host shut down within 30 s");
        // Pacing: the survivors run a moment without it, as under `dev`.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.store(false, Ordering::Relaxed);
    for task in load {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a load task ended within 30 s")
            .unwrap();
    }

    let loud = loud.0.lock().unwrap().clone();
    let shown: Vec<String> = loud
        .iter()
        // openraft's own warnings are filtered by the broker's default log
        // filter; its errors are not.
        .filter(|(level, target, _)| *level == Level::ERROR || !target.starts_with("openraft"))
        .map(|(level, target, fields)| format!("{level} {target}: {fields}"))
        .collect();
    assert!(
        shown.is_empty(),
        "an ordered shutdown logged:\n{}",
        shown.join("\n")
    );
}
