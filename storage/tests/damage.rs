#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Damaged and missing copies are quarantined and report what they lost
//! (ADR 0108): never a failed open that takes the caller down, never a
//! silent short read.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use malachi_storage::{Loss, Record, SegmentStore, StorageError};

fn batches() -> Vec<Vec<Record>> {
    vec![
        (0..4).map(record).collect(),
        (4..9).map(record).collect(),
        (9..12).map(record).collect(),
    ]
}

/// Writes the batches (one flush each) and returns the log bytes and the
/// start of every frame.
fn write_log(dir: &Path) -> (Vec<u8>, Vec<u64>) {
    {
        let store = store(dir);
        store.open(SEG).unwrap();
        append_batches(&store, &batches());
    }
    let bytes = fs::read(dir.join(format!("{}.log", SEG.file_stem()))).unwrap();
    let mut starts = Vec::new();
    let mut pos = 0;
    for r in batches().iter().flatten() {
        starts.push(pos);
        pos += frame_len(r);
    }
    (bytes, starts)
}

#[test]
fn a_damaged_copy_opens_in_quarantine_with_its_prefix_readable_and_the_rest_reported_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bytes, starts) = write_log(dir.path());
    bytes[starts[5] as usize + 20] ^= 0x10;
    let log_path = dir.path().join(format!("{}.log", SEG.file_stem()));
    fs::write(&log_path, &bytes).unwrap();
    let idx_before = fs::read(dir.path().join(format!("{}.idx", SEG.file_stem()))).unwrap();

    let store = store(dir.path());
    assert!(matches!(store.open(SEG), Err(StorageError::Damaged { .. })));
    let recovery = store.open_quarantined(SEG).unwrap();
    let info = recovery.info;
    assert!(info.failed);
    assert_eq!(info.length, 5);
    assert_eq!(info.lost, Some(Loss { from: 5, to: 12 }));

    // The intact prefix reads back, then a typed loss, never a short read.
    let prefix: Vec<u64> = store
        .read(SEG, 0, 100, 1 << 20)
        .unwrap()
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(prefix, vec![0, 1, 2, 3, 4]);
    for from in [5, 7, 11] {
        match store.read(SEG, from, 100, 1 << 20) {
            Err(StorageError::Lost {
                from: 5, to: 12, ..
            }) => {}
            other => panic!("a read from {from} should be lost, got {other:?}"),
        }
    }
    assert!(matches!(
        store.read(SEG, 12, 100, 1 << 20),
        Err(StorageError::OffsetOutOfRange { .. })
    ));
    // It takes no append, and nothing on disk changed.
    assert!(matches!(
        store.append(SEG, &[record(99)]),
        Err(StorageError::Failed { .. })
    ));
    drop(store);
    assert_eq!(fs::read(&log_path).unwrap(), bytes);
    assert_eq!(
        fs::read(dir.path().join(format!("{}.idx", SEG.file_stem()))).unwrap(),
        idx_before
    );
}

#[test]
fn a_clean_copy_opens_in_quarantine_as_it_would_anyway() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path());
    let store = store(dir.path());
    let info = store.open_quarantined(SEG).unwrap().info;
    assert!(!info.failed);
    assert_eq!((info.length, info.lost), (12, None));
}

#[test]
fn a_sealed_copy_whose_log_was_deleted_reports_its_records_lost() {
    let dir = tempfile::tempdir().unwrap();
    let log_path;
    {
        let store = store(dir.path());
        store.open(SEG).unwrap();
        append_batches(&store, &batches());
        store.seal(SEG, 12).unwrap();
        log_path = store.log_path(SEG);
    }
    fs::remove_file(&log_path).unwrap();
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert!(recovery.log_missing && recovery.short_of_seal);
    assert_eq!(recovery.info.lost, Some(Loss { from: 0, to: 12 }));
    match store.read(SEG, 0, 100, 1 << 20) {
        Err(StorageError::Lost {
            from: 0,
            to: 12,
            reason,
            ..
        }) => assert!(reason.contains("missing"), "{reason}"),
        other => panic!("expected a loss, got {other:?}"),
    }
}

#[test]
fn a_copy_shorter_than_the_seal_the_metadata_recorded_reports_the_difference_lost() {
    // No seal marker on the copy (the marker is written after the metadata
    // commits the seal): only the metadata's seal tells what is missing.
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path());
    let store = store(dir.path());
    store.open(SEG).unwrap();
    assert_eq!(store.check_seal(SEG, 12).unwrap(), None);
    assert_eq!(store.read(SEG, 12, 10, 1 << 20).unwrap().len(), 0);
    assert_eq!(
        store.check_seal(SEG, 15).unwrap(),
        Some(Loss { from: 12, to: 15 })
    );
    assert_eq!(store.read(SEG, 0, 100, 1 << 20).unwrap().len(), 12);
    assert!(matches!(
        store.read(SEG, 12, 10, 1 << 20),
        Err(StorageError::Lost {
            from: 12,
            to: 15,
            ..
        })
    ));
    assert_eq!(
        store.info(SEG).unwrap().lost,
        Some(Loss { from: 12, to: 15 })
    );
}

/// A broken copy is set aside and rebuilt from an intact one, byte for
/// byte; the broken bytes stay aside until discarded (ADR 0110).
#[test]
fn a_damaged_copy_set_aside_is_rebuilt_byte_identical_from_an_intact_copy() {
    let good_dir = tempfile::tempdir().unwrap();
    let (good_bytes, starts) = write_log(good_dir.path());
    let good = store(good_dir.path());
    good.open(SEG).unwrap();
    good.seal(SEG, 12).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut broken = good_bytes.clone();
    broken[starts[5] as usize + 20] ^= 0x10;
    let log_path = dir.path().join(format!("{}.log", SEG.file_stem()));
    write_log(dir.path());
    fs::write(&log_path, &broken).unwrap();
    let store = store(dir.path());
    assert!(store.open_quarantined(SEG).unwrap().info.failed);

    assert!(store.set_aside(SEG).unwrap());
    assert!(store.is_aside(SEG));
    assert_eq!(store.aside_segments(), vec![SEG]);
    assert!(!log_path.exists());
    let fresh = store.open(SEG).unwrap();
    assert!(fresh.log_missing);
    assert_eq!((fresh.info.length, fresh.info.failed), (0, false));

    // Half a rebuild, then set aside again: the first (broken) copy is the
    // one kept aside, the partial rebuild is dropped.
    let run = good.read_frames(SEG, 0, 1).unwrap();
    store
        .repair_frames(SEG, 0, &run.bytes, 12)
        .unwrap()
        .wait()
        .unwrap();
    assert!(!store.set_aside(SEG).unwrap());
    let aside_log = store.aside_dir().join(format!("{}.log", SEG.file_stem()));
    assert_eq!(fs::read(&aside_log).unwrap(), broken);

    // The whole rebuild.
    store.open(SEG).unwrap();
    let mut at = 0;
    while at < 12 {
        let run = good.read_frames(SEG, at, 100).unwrap();
        at = store
            .repair_frames(SEG, at, &run.bytes, 12)
            .unwrap()
            .wait()
            .unwrap()
            .end;
    }
    store.seal(SEG, 12).unwrap();
    assert!(store.verify(SEG).unwrap().is_clean());
    drop(store);
    assert_eq!(fs::read(&log_path).unwrap(), good_bytes);
    let store = common::store(dir.path());
    assert!(store.discard_aside(SEG).unwrap() >= broken.len() as u64);
    assert!(!store.is_aside(SEG));
    assert!(store.aside_segments().is_empty());
}
