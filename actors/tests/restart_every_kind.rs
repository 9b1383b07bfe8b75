//! Every kind of actor in the broker's tree is restarted after a crash,
//! under a running producer (issue 37): its supervisor restarts it (the
//! tree shows its restart count go up and a new instance running), the
//! broker keeps acknowledging records through it, and every acknowledged
//! record reads back once, in key order.
//!
//! A crash is one of two things. Most kinds are killed by their tree name
//! (`BrokerHandle::kill_actor`): the actor ends at once, abnormally, as a
//! panic in its handler would end it. The kinds whose work runs in a loop
//! of their own (the scrubber, the space poll, the orphan sweeper, the
//! node fabric's dial loop, the client port's accept loop, the admin
//! port's server, a coordinator's lease keeper) are crashed in that work
//! too
//! (`BrokerHandle::fail_work`): a panic in a loop the actor does not watch
//! is the failure the tree would not see, and these tests are how it is
//! seen.
//!
//! Kinds that only have work in a cluster (replication, failover, healing,
//! SWIM and the node fabric) run on three brokers in this process, RF 3;
//! the others on one broker.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_supervision::{ChildSnapshot, ChildStatus, RenderOptions, render_tree};
use malachi_wire::batch::BatchBuilder;
use malachi_wire::client::{Client, ConsumeOptions, StartAt};
use malachi_wire::messages::CreateTopicRequest;

const TOPIC: &str = "steady";
const KEYS: u64 = 3;
/// Records acknowledged before the crash, and again after the restart
/// (the broker is seen to keep serving, not just to have served).
const ACKS_BETWEEN: u64 = 20;
/// How long a restart and the acknowledgements after it may take: a
/// debug build on a shared machine, three brokers, with slack.
const RESTART_WAIT_MS: u64 = 30_000;

/// How a kind is crashed.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// The actor at the kind's path is killed.
    Kill,
    /// The next pass of the named worker's own loop panics.
    Work(&'static str),
}

#[derive(Debug, Clone, Copy)]
struct Kind {
    /// Where it sits in the tree, from the root's children down.
    path: &'static [&'static str],
    crash: Crash,
    /// Three brokers rather than one.
    cluster: bool,
}

fn config(dir: &Path, node_id: u64, seeds: &[&BrokerHandle], cluster: bool) -> BrokerConfig {
    let base = if cluster {
        cluster_config(dir, node_id, seeds, &[1, 2, 3])
    } else {
        BrokerConfig::for_tests(dir.join("single"))
    };
    let mut config = base;
    config.cluster.coordinator_poll_ms = 200;
    // The sweeper's shortest pace, so a crash of its pass comes soon.
    config.maintenance.orphan_sweep_ms = 1_000;
    config
}

/// The child at `path`, as `broker`'s tree shows it now.
async fn child_at(broker: &BrokerHandle, path: &[&str]) -> Option<ChildSnapshot> {
    let tree = broker.tree_snapshot().await.ok()?;
    tree.descendant(path).cloned()
}

/// The producer: one record a request, keys round robin, the value its
/// ordinal; idempotent, so a retry through the crash is not written twice.
struct Running {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<u64>,
}

fn produce(client: Client) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let (stopping, counting) = (Arc::clone(&stop), Arc::clone(&acked));
    let task = tokio::spawn(async move {
        let mut producer = client.producer(TOPIC, 4);
        let mut ordinal: u64 = 0;
        while !stopping.load(Ordering::SeqCst) {
            let mut batch = BatchBuilder::new(1 << 20);
            batch
                .push(&record(
                    &format!("k{}", ordinal % KEYS),
                    &ordinal.to_string(),
                ))
                .unwrap();
            producer
                .send(batch.finish())
                .await
                .expect("a produce failed");
            ordinal += 1;
            counting.store(producer.records_acknowledged(), Ordering::SeqCst);
        }
        let acked = producer.flush().await.expect("the last produces failed");
        assert_eq!(acked, ordinal, "not every record sent was acknowledged");
        assert_eq!(producer.acknowledged_ordinals(), vec![(0, ordinal)]);
        acked
    });
    Running { stop, acked, task }
}

impl Running {
    /// Whether `records` were acknowledged in time; false at once if the
    /// producer failed (its panic says why).
    async fn acknowledged_at_least(&self, records: u64) -> bool {
        eventually(RESTART_WAIT_MS, async || {
            self.task.is_finished() || self.acked.load(Ordering::SeqCst) >= records
        })
        .await;
        !self.task.is_finished() && self.acked.load(Ordering::SeqCst) >= records
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Every record of the topic from the start must be the `sent` ordinals,
/// each once, and each key's in the order they were sent.
async fn check_read_back(client: &Client, sent: u64) {
    let mut consumer = client.consume(TOPIC, StartAt::Start, ConsumeOptions::default());
    let mut ordinals: Vec<u64> = Vec::new();
    while let Some(item) = consumer.next().await {
        let record = item.unwrap().record;
        let ordinal: u64 = std::str::from_utf8(&record.value).unwrap().parse().unwrap();
        assert_eq!(
            record.key.as_ref(),
            format!("k{}", ordinal % KEYS).as_bytes()
        );
        ordinals.push(ordinal);
    }
    for key in 0..KEYS {
        let of_key: Vec<u64> = ordinals
            .iter()
            .copied()
            .filter(|o| o % KEYS == key)
            .collect();
        let expected: Vec<u64> = (key..sent).step_by(KEYS as usize).collect();
        assert_eq!(
            of_key, expected,
            "key k{key} does not read back each acknowledged record once, in order"
        );
    }
}

async fn create_topic(broker: &BrokerHandle, replicas: u8) {
    let mut client = TestClient::connect(broker.client_addr()).await;
    let created = eventually(30_000, async || {
        client
            .call(&CreateTopicRequest {
                name: TOPIC.into(),
                replication_factor: Some(replicas),
                policy: None,
            })
            .await
            .is_ok()
    })
    .await;
    assert!(created, "the topic was never created");
}

async fn start_brokers(dir: &Path, cluster: bool) -> Vec<BrokerHandle> {
    if cluster {
        start_seeded::<3>(|node_id, seeds| config(dir, node_id, seeds, true))
            .await
            .into()
    } else {
        vec![start(config(dir, 1, &[], false)).await]
    }
}

/// Crashes `kind` on the first broker under a running producer and checks
/// the restart, the service after it, and the records.
async fn crash_and_restart(name: &str, kind: Kind) {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let brokers = start_brokers(dir.path(), kind.cluster).await;
    create_topic(&brokers[0], if kind.cluster { 3 } else { 1 }).await;
    let addrs: Vec<String> = brokers
        .iter()
        .map(|b| b.client_addr().to_string())
        .collect();
    let client = Client::connect(addrs).await.unwrap();
    let producer = produce(client.clone());
    assert!(
        producer.acknowledged_at_least(ACKS_BETWEEN).await,
        "{name}: nothing was acknowledged before the crash"
    );

    let victim = &brokers[0];
    let before = child_at(victim, kind.path)
        .await
        .unwrap_or_else(|| panic!("{name}: no {:?} in the tree", kind.path));
    assert_eq!(before.status, ChildStatus::Running, "{name}: {before:?}");
    match kind.crash {
        Crash::Kill => victim.kill_actor(kind.path).await.unwrap(),
        Crash::Work(worker) => {
            victim.fail_work(worker);
            wake(victim, worker).await;
        }
    }
    let restarted = eventually(RESTART_WAIT_MS, async || {
        child_at(victim, kind.path).await.is_some_and(|now| {
            now.restarts > before.restarts
                && now.status == ChildStatus::Running
                && now.actor_id != before.actor_id
        })
    })
    .await;
    if !restarted {
        let tree = victim.tree_snapshot().await.unwrap();
        panic!(
            "{name} was not restarted after its crash; the tree:\n{}",
            render_tree(&tree, RenderOptions::FULL)
        );
    }

    let at_restart = producer.acked.load(Ordering::SeqCst);
    assert!(
        producer
            .acknowledged_at_least(at_restart + ACKS_BETWEEN)
            .await,
        "{name}: the broker acknowledged nothing after the restart"
    );
    let sent = producer.finish().await;
    check_read_back(&client, sent).await;
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}

/// Wakes a loop that waits for a connection, so its armed fault trips:
/// the accept loops (`acceptor`, `admin_http`) get one connection.
async fn wake(victim: &BrokerHandle, worker: &str) {
    let port = match worker {
        "acceptor" => victim.client_addr(),
        "admin_http" => victim.admin_addr(),
        _ => return,
    };
    // The connection is dropped at once; the accept is what trips.
    let _ = tokio::net::TcpStream::connect(port).await;
}

macro_rules! restart_tests {
    ($($test:ident: $path:expr, $crash:expr, $cluster:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            let kind = Kind { path: $path, crash: $crash, cluster: $cluster };
            crash_and_restart(stringify!($test), kind).await;
        }
    )*};
}

restart_tests! {
    replication: &["storage", "replication"], Crash::Kill, true;
    coordinator: &["metadata", "coordinator_manager", "coordinator/0"], Crash::Kill, false;
    manager_watcher: &["metadata", "coordinator_manager", "manager"], Crash::Work("leadership_watcher"), false;
    coordinator_lease_keeper: &["metadata", "coordinator_manager", "coordinator/0"], Crash::Work("lease_keeper"), false;
    vnodes: &["metadata", "vnodes"], Crash::Kill, false;
    orders: &["metadata", "orders"], Crash::Kill, true;
    failover: &["maintenance", "failover"], Crash::Kill, true;
    healer: &["maintenance", "healer"], Crash::Kill, true;
    scrubber: &["maintenance", "scrubber"], Crash::Work("scrubber"), false;
    space: &["maintenance", "space"], Crash::Work("space"), false;
    sweeper: &["maintenance", "sweeper"], Crash::Work("sweeper"), false;
    swim: &["membership", "swim"], Crash::Kill, true;
    node: &["membership", "node"], Crash::Work("node"), true;
    acceptor: &["listener", "acceptor"], Crash::Kill, false;
    acceptor_loop: &["listener", "acceptor"], Crash::Work("acceptor"), false;
    admin_http: &["admin_http"], Crash::Kill, false;
    admin_http_loop: &["admin_http"], Crash::Work("admin_http"), false;
}
