use super::*;
use crate::record::Record;
use std::sync::mpsc;

/// A store whose syncs of flush `held` wait until the returned sender
/// is dropped or sent to; `started` hears of every sync as it begins.
fn store_holding_sync(
    dir: &Path,
    depth: usize,
    held: u64,
) -> (FileStore, mpsc::Sender<()>, mpsc::Receiver<u64>) {
    let store = FileStore::open_dir(
        dir,
        StoreConfig {
            flush_interval_ms: 0,
            flush_pipeline_depth: depth,
            sync_threads: 4,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let (started_tx, started_rx) = mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    *store.shared.sync_hook.lock() = Some(SyncHook(Arc::new(move |_, seq| {
        let _ = started_tx.lock().send(seq);
        if seq == held {
            let _ = release_rx.lock().recv();
        }
    })));
    (store, release_tx, started_rx)
}

fn records(n: u64) -> Vec<Record> {
    (0..n)
        .map(|i| Record::new(i, i.to_le_bytes(), vec![7u8; 100]))
        .collect()
}

#[test]
fn a_flush_is_written_and_synced_while_the_previous_one_is_still_syncing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, release, started) = store_holding_sync(dir.path(), 2, 0);
    let seg = SegmentId(1);
    store.open(seg).unwrap();
    let first = store.append(seg, &records(3)).unwrap();
    assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(0));
    // Flush 0 is held in its sync: flush 1 must still be written and
    // reach its own sync, in the other pipeline slot.
    let second = store.append(seg, &records(2)).unwrap();
    assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(1));
    assert_eq!(store.stats().flushes_overlapped, 1);
    // Published in order: the second is not acked before the first.
    std::thread::sleep(Duration::from_millis(20));
    assert!(!second.is_complete() && !first.is_complete());
    assert_eq!(store.info(seg).unwrap().length, 0);
    release.send(()).unwrap();
    assert_eq!(first.wait().unwrap(), 0..3);
    assert_eq!(second.wait().unwrap(), 3..5);
    let stats = store.stats();
    assert_eq!((stats.flushes, stats.flushed_records), (2, 5));
    assert_eq!(store.info(seg).unwrap().length, 5);
}

#[test]
fn without_pipelining_no_flush_starts_while_one_is_syncing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, release, started) = store_holding_sync(dir.path(), 1, 0);
    let seg = SegmentId(1);
    store.open(seg).unwrap();
    let first = store.append(seg, &records(3)).unwrap();
    assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(0));
    let second = store.append(seg, &records(2)).unwrap();
    assert!(started.recv_timeout(Duration::from_millis(200)).is_err());
    release.send(()).unwrap();
    assert_eq!(first.wait().unwrap(), 0..3);
    assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(1));
    assert_eq!(second.wait().unwrap(), 3..5);
    assert_eq!(store.stats().flushes_overlapped, 0);
}
