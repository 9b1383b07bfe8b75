#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Seal and fence.

mod common;

use common::*;
use malachi_storage::{SegmentStore, StorageError};

fn filled(dir: &std::path::Path, n: u64) -> malachi_storage::FileStore {
    let store = store(dir);
    store.open(SEG).unwrap();
    append_batches(&store, &[(0..n).map(record).collect()]);
    store
}

#[test]
fn a_sealed_segment_refuses_appends_and_keeps_its_length_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = filled(dir.path(), 5);
        let seal = store.seal(SEG, 5).unwrap();
        assert_eq!(seal.length, 5);
        assert!(matches!(
            store.append(SEG, &[record(9)]),
            Err(StorageError::Sealed { length: 5, .. })
        ));
    }
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.sealed.map(|s| s.length), Some(5));
    assert!(recovery.info.fenced);
    assert!(matches!(
        store.append(SEG, &[record(9)]),
        Err(StorageError::Sealed { .. })
    ));
    assert_eq!(read_all(&store, SEG).len(), 5);
}

#[test]
fn sealing_below_the_stored_length_clamps_reads_and_keeps_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path(), 8);
    let bytes_before = store.info(SEG).unwrap().byte_size;
    let seal = store.seal(SEG, 3).unwrap();
    let three: u64 = (0..3).map(|i| frame_len(&record(i))).sum();
    assert_eq!(seal.byte_size, three);
    assert_eq!(read_all(&store, SEG).len(), 3);
    assert!(matches!(
        store.read(SEG, 4, 1, 100),
        Err(StorageError::OffsetOutOfRange { end: 3, .. })
    ));
    let info = store.info(SEG).unwrap();
    assert_eq!((info.length, info.byte_size), (3, three));
    assert_eq!(
        std::fs::metadata(store.log_path(SEG)).unwrap().len(),
        bytes_before
    );
    drop(store);
    let store = common::store(dir.path());
    assert_eq!(store.open(SEG).unwrap().info.length, 3);
    assert_eq!(read_all(&store, SEG).len(), 3);
}

#[test]
fn sealing_beyond_the_stored_length_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path(), 2);
    assert!(matches!(
        store.seal(SEG, 3),
        Err(StorageError::SealBeyondEnd {
            requested: 3,
            stored: 2,
            ..
        })
    ));
}

#[test]
fn sealing_twice_is_idempotent_at_the_same_length_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path(), 4);
    let first = store.seal(SEG, 4).unwrap();
    assert_eq!(store.seal(SEG, 4).unwrap(), first);
    assert!(matches!(
        store.seal(SEG, 2),
        Err(StorageError::AlreadySealed { existing: 4, .. })
    ));
}

#[test]
fn seal_waits_for_appends_already_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = malachi_storage::StoreConfig {
        flush_interval_ms: 60_000,
        ..config()
    };
    let store = malachi_storage::FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let ticket = store.append(SEG, &[record(0), record(1)]).unwrap();
    store.seal(SEG, 2).unwrap();
    assert!(ticket.is_complete());
    assert_eq!(ticket.wait().unwrap(), 0..2);
}

#[test]
fn a_fence_refuses_appends_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = filled(dir.path(), 2);
        store.fence(SEG).unwrap();
        assert!(matches!(
            store.append(SEG, &[record(5)]),
            Err(StorageError::Fenced { .. })
        ));
        assert_eq!(read_all(&store, SEG).len(), 2);
    }
    let store = store(dir.path());
    assert!(store.open(SEG).unwrap().info.fenced);
    assert!(matches!(
        store.append(SEG, &[record(5)]),
        Err(StorageError::Fenced { .. })
    ));
}

fn order(group: u64, term: u64) -> malachi_storage::OrderEpoch {
    malachi_storage::OrderEpoch { group, term }
}

#[test]
fn a_fence_order_reports_everything_queued_before_it_as_durable_and_refuses_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    // Queued and not waited for: the fence's drain must cover it.
    let tickets: Vec<_> = (0..4)
        .map(|i| store.append(SEG, &[record(i)]).unwrap())
        .collect();
    let fenced = store.fence_order(SEG, order(1, 5)).unwrap();
    assert_eq!(fenced.durable, 4, "the drain makes queued appends durable");
    assert_eq!(fenced.durable_bytes, store.info(SEG).unwrap().byte_size);
    assert_eq!(fenced.order, order(1, 5));
    assert!(!fenced.failed);
    assert!(fenced.sealed.is_none());
    for ticket in tickets {
        ticket.wait().unwrap();
    }
    assert!(matches!(
        store.append(SEG, &[record(9)]),
        Err(StorageError::Fenced { .. })
    ));
    // Idempotent: the same order again answers the same.
    assert_eq!(store.fence_order(SEG, order(1, 5)).unwrap(), fenced);
}

#[test]
fn an_older_order_of_the_same_group_is_refused_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = filled(dir.path(), 3);
        store.fence_order(SEG, order(1, 7)).unwrap();
        assert!(matches!(
            store.fence_order(SEG, order(1, 6)),
            Err(StorageError::StaleOrder { .. })
        ));
    }
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert!(recovery.info.fenced);
    assert_eq!(store.order_epoch(SEG).unwrap(), order(1, 7));
    match store.fence_order(SEG, order(1, 6)) {
        Err(StorageError::StaleOrder { seen, order: o, .. }) => {
            assert_eq!((seen, o), (order(1, 7), order(1, 6)));
        }
        other => panic!("expected StaleOrder, got {other:?}"),
    }
    // A newer term is taken and remembered; another group's order is
    // taken whatever its term (a vnode split moved the topic).
    assert_eq!(
        store.fence_order(SEG, order(1, 8)).unwrap().order,
        order(1, 8)
    );
    assert_eq!(
        store.fence_order(SEG, order(2, 1)).unwrap().order,
        order(2, 1)
    );
    drop(store);
    let store = common::store(dir.path());
    store.open(SEG).unwrap();
    assert_eq!(store.order_epoch(SEG).unwrap(), order(2, 1));
}

#[test]
fn a_plain_fence_marker_reads_as_the_default_order_epoch() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = filled(dir.path(), 2);
        store.fence(SEG).unwrap();
    }
    let store = store(dir.path());
    store.open(SEG).unwrap();
    assert_eq!(store.order_epoch(SEG).unwrap(), order(0, 0));
    let fenced = store.fence_order(SEG, order(4, 2)).unwrap();
    assert_eq!((fenced.durable, fenced.order), (2, order(4, 2)));
}

#[test]
fn a_fence_order_on_a_sealed_copy_reports_the_seal() {
    let dir = tempfile::tempdir().unwrap();
    let store = filled(dir.path(), 6);
    let seal = store.seal(SEG, 4).unwrap();
    let fenced = store.fence_order(SEG, order(1, 1)).unwrap();
    assert_eq!(fenced.sealed, Some(seal));
    assert_eq!(fenced.durable, 6, "the durable end is not clamped");
}

#[test]
fn a_copy_sealed_below_its_end_is_cut_to_exactly_its_seal_and_stays_cut() {
    let dir = tempfile::tempdir().unwrap();
    let three: u64 = (0..3).map(|i| frame_len(&record(i))).sum();
    {
        let store = filled(dir.path(), 8);
        assert!(matches!(
            store.cut_to_seal(SEG),
            Err(StorageError::NotTruncatable { .. })
        ));
        let seal = store.seal(SEG, 3).unwrap();
        assert_eq!(seal.byte_size, three);
        let cut = store.cut_to_seal(SEG).unwrap();
        assert!(cut > 0);
        assert_eq!(std::fs::metadata(store.log_path(SEG)).unwrap().len(), three);
        assert_eq!(read_all(&store, SEG).len(), 3);
        // Idempotent.
        assert_eq!(store.cut_to_seal(SEG).unwrap(), 0);
        let info = store.info(SEG).unwrap();
        assert_eq!((info.length, info.durable, info.byte_size), (3, 3, three));
    }
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.length, 3);
    assert!(!recovery.short_of_seal);
    assert_eq!(std::fs::metadata(store.log_path(SEG)).unwrap().len(), three);
    let values: Vec<u64> = read_all(&store, SEG).iter().map(|r| r.offset).collect();
    assert_eq!(values, vec![0, 1, 2]);
}
