//! The broker on the in-memory segment store (ADR 0131): the store is a
//! factory's choice, and the data path, replication and recovery work the
//! same on it as on files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::*;
use malachi_actors::{Broker, BrokerConfig, BrokerHandle, StoreFactory, SystemClock};
use malachi_storage::{MemoryStore, SegmentId, SegmentStore, StoreConfig};
use malachi_wire::batch::Record;

const TOPIC: &str = "mem";

fn memory_store(seed: u64) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(StoreConfig::default(), seed).unwrap())
}

async fn start_on(config: BrokerConfig, store: &Arc<MemoryStore>) -> BrokerHandle {
    let factory = StoreFactory::shared(Arc::clone(store) as Arc<dyn SegmentStore>);
    Broker::start_with_store(config, Arc::new(SystemClock), factory)
        .await
        .unwrap()
}

/// No log file was written under the broker's data dir: the records are
/// in the memory store.
fn no_log_files(dir: &Path) -> bool {
    let segments = dir.join("segments");
    std::fs::read_dir(&segments).map_or(true, |entries| {
        entries
            .flatten()
            .all(|e| e.path().extension().is_none_or(|ext| ext != "log"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_on_the_memory_store_reads_back_every_acknowledged_record_in_key_order() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let store = memory_store(1);
    let broker = start_on(BrokerConfig::for_tests(dir.path()), &store).await;
    assert!(broker.wait_ready(10_000).await, "broker never ready");
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic(TOPIC).await;
    let mut sent = Vec::new();
    for n in 0..8 {
        let records = keyed_batch(&format!("b{n}"), 25, 5);
        assert_eq!(client.produce(TOPIC, &records).await.unwrap(), 25);
        sent.extend(records);
    }
    let got = read_all(&mut client, TOPIC).await;
    assert_eq!(got.len(), sent.len());
    assert_eq!(by_key(&got), by_key(&sent));
    assert!(!store.local_copies().unwrap().is_empty());
    assert!(no_log_files(dir.path()));
    broker.shutdown().await.unwrap();
}

/// Three brokers, each on its own memory store, RF=3. A follower's store
/// holds its syncs while records are acknowledged by the two others, then
/// crashes (its unsynced appends lost, perhaps one torn); the follower
/// restarts on what the crash left. No acknowledged record is lost, and
/// the topic keeps taking writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_whose_memory_store_crashes_loses_no_acknowledged_record() {
    init_tracing();
    let root = tempfile::tempdir().unwrap();
    let stores: Vec<Arc<MemoryStore>> = (1..=3).map(memory_store).collect();
    let mut brokers: Vec<Option<BrokerHandle>> = Vec::new();
    for node_id in 1..=3u64 {
        let seeds: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
        let config = three_node_config(root.path(), node_id, &seeds);
        brokers.push(Some(start_on(config, &stores[node_id as usize - 1]).await));
    }
    for b in brokers.iter().flatten() {
        assert!(
            b.wait_ready(30_000).await,
            "broker {} never ready",
            b.node_id()
        );
    }
    create_replicated_topic(brokers[0].as_ref().unwrap().client_addr(), TOPIC, 3).await;
    let mut sent = Vec::new();
    let first = keyed_batch("a", 30, 5);
    assert!(eventually(10_000, async || produce_once(&brokers, TOPIC, &first).await).await);
    sent.extend(first);

    // The follower's disk stops syncing; the two others acknowledge.
    let segment = active_segment(&brokers, TOPIC).await.unwrap();
    assert_eq!(segment.replicas.len(), 3, "{segment:?}");
    let follower = segment.replicas[2];
    let store = &stores[follower as usize - 1];
    let id = SegmentId(segment.id);
    store.hold_syncs();
    let second = keyed_batch("b", 30, 5);
    assert!(
        eventually(10_000, async || produce_once(&brokers, TOPIC, &second)
            .await)
        .await
    );
    sent.extend(second);
    assert!(
        eventually(10_000, async || store.written(id).len() as u64
            > store.synced_bytes(id))
        .await,
        "the follower never wrote the held records"
    );

    // A power cut on the follower, then a restart on what it left.
    let crashed = store.crash();
    assert!(crashed.contains_key(&id), "{crashed:?}");
    brokers[follower as usize - 1]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let live: Vec<SocketAddr> = brokers.iter().flatten().map(|b| b.client_addr()).collect();
    let config = three_node_config(root.path(), follower, &live);
    let back = start_on(config, store).await;
    assert!(
        back.wait_ready(30_000).await,
        "the follower never came back"
    );
    brokers[follower as usize - 1] = Some(back);

    let third = keyed_batch("c", 30, 5);
    assert!(eventually(15_000, async || produce_once(&brokers, TOPIC, &third).await).await);
    sent.extend(third);
    let now = active_segment(&brokers, TOPIC).await.unwrap();
    let primary = brokers[(now.replicas[0] - 1) as usize].as_ref().unwrap();
    let mut reader = TestClient::connect(primary.client_addr()).await;
    let got = read_all(&mut reader, TOPIC).await;
    let values =
        |records: &[Record]| -> Vec<Vec<u8>> { records.iter().map(|r| r.value.to_vec()).collect() };
    assert_eq!(values(&got), values(&sent));
    for broker in brokers.into_iter().flatten() {
        broker.shutdown().await.unwrap();
    }
}
