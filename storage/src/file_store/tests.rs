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

/// ADR 0161: a primary's runs come from the frames its flushes kept,
/// byte for byte as the log holds them, and from the log once the copy is
/// sealed.
#[test]
fn frames_a_flush_wrote_are_served_from_memory_exactly_as_the_log_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open_dir(
        dir.path(),
        StoreConfig {
            flush_interval_ms: 0,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let seg = SegmentId(1);
    store.open(seg).unwrap();
    assert_eq!(
        store.append(seg, &records(5)).unwrap().wait().unwrap(),
        0..5
    );
    assert_eq!(
        store.append(seg, &records(4)).unwrap().wait().unwrap(),
        5..9
    );
    let kept = store.read_frames(seg, 2, 1 << 20).unwrap();
    assert_eq!((kept.first, kept.records), (2, 7));
    assert_eq!(
        store.stats().frames_from_memory_bytes,
        kept.bytes.len() as u64,
        "served from memory"
    );
    let log = std::fs::read(store.log_path(seg)).unwrap();
    let end = store.info(seg).unwrap().byte_size as usize;
    assert_eq!(kept.bytes[..], log[end - kept.bytes.len()..end]);
    let (mut at, mut offset) = (0, 2);
    while at < kept.bytes.len() {
        let (view, len) = crate::frame::decode(&kept.bytes[at..]).unwrap();
        assert_eq!(view.offset, offset);
        (at, offset) = (at + len, offset + 1);
    }
    assert_eq!(offset, 9);
    // A bound cuts the run at a frame, as a read of the log does.
    let one = store.read_frames(seg, 2, 10).unwrap();
    assert_eq!(one.records, 1);
    store.seal(seg, 9).unwrap();
    let served = store.stats().frames_from_memory_bytes;
    let sealed = store.read_frames(seg, 2, 1 << 20).unwrap();
    assert_eq!(sealed, kept, "the log gives the same run");
    assert_eq!(
        store.stats().frames_from_memory_bytes,
        served,
        "read from the log"
    );
}
