#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sparse index is derived data: damaging it changes no read.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use malachi_storage::{FileStore, SegmentStore, StoredRecord};

const N: u64 = 200;

/// Every (from, records_max, bytes_max) read, as a fingerprint of the copy.
fn all_reads(store: &FileStore) -> Vec<Vec<StoredRecord>> {
    let mut out = Vec::new();
    for from in 0..N {
        for (records_max, bytes_max) in [(1, 0), (5, 400), (1000, 1 << 20)] {
            out.push(store.read(SEG, from, records_max, bytes_max).unwrap());
        }
    }
    out
}

fn build(dir: &Path, seal: bool) -> Vec<Vec<StoredRecord>> {
    let store = store(dir);
    store.open(SEG).unwrap();
    let batches: Vec<Vec<_>> = (0..N)
        .collect::<Vec<_>>()
        .chunks(17)
        .map(|c| c.iter().map(|&i| record(i)).collect())
        .collect();
    append_batches(&store, &batches);
    if seal {
        store.seal(SEG, N).unwrap();
    }
    let reads = all_reads(&store);
    assert!(
        fs::metadata(store.index_path(SEG)).unwrap().len() > 0,
        "test log too small to be indexed"
    );
    reads
}

fn reopen_and_read(dir: &Path) -> Vec<Vec<StoredRecord>> {
    let store = store(dir);
    store.open(SEG).unwrap();
    all_reads(&store)
}

fn idx_path(dir: &Path) -> std::path::PathBuf {
    dir.join(format!("{}.idx", SEG.file_stem()))
}

type Damage = Box<dyn Fn(&Path)>;

fn damage_cases() -> Vec<(&'static str, Damage)> {
    vec![
        (
            "deleted",
            Box::new(|d: &Path| fs::remove_file(idx_path(d)).unwrap()),
        ),
        (
            "truncated mid-entry",
            Box::new(|d: &Path| {
                let b = fs::read(idx_path(d)).unwrap();
                fs::write(idx_path(d), &b[..b.len() / 2 + 3]).unwrap();
            }),
        ),
        (
            "random garbage",
            Box::new(|d: &Path| {
                let b: Vec<u8> = (0..4000u32)
                    .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                    .collect();
                fs::write(idx_path(d), b).unwrap();
            }),
        ),
        (
            "positions shifted by a few bytes",
            Box::new(|d: &Path| {
                let mut b = fs::read(idx_path(d)).unwrap();
                for e in b.chunks_exact_mut(16).skip(1) {
                    e[8] = e[8].wrapping_add(5);
                }
                fs::write(idx_path(d), b).unwrap();
            }),
        ),
        (
            "offsets off by one",
            Box::new(|d: &Path| {
                let mut b = fs::read(idx_path(d)).unwrap();
                for e in b.chunks_exact_mut(16).skip(1) {
                    e[0] = e[0].wrapping_add(1);
                }
                fs::write(idx_path(d), b).unwrap();
            }),
        ),
    ]
}

#[test]
fn a_damaged_or_deleted_index_of_a_sealed_copy_changes_no_read() {
    for (name, damage) in damage_cases() {
        let dir = tempfile::tempdir().unwrap();
        let before = build(dir.path(), true);
        damage(dir.path());
        assert_eq!(reopen_and_read(dir.path()), before, "index {name}");
    }
}

#[test]
fn a_damaged_or_deleted_index_of_an_active_copy_changes_no_read_and_is_rebuilt() {
    for (name, damage) in damage_cases() {
        let dir = tempfile::tempdir().unwrap();
        let before = build(dir.path(), false);
        let good = fs::read(idx_path(dir.path())).unwrap();
        damage(dir.path());
        assert_eq!(reopen_and_read(dir.path()), before, "index {name}");
        assert_eq!(
            fs::read(idx_path(dir.path())).unwrap(),
            good,
            "index {name} not rebuilt"
        );
    }
}

#[test]
fn verify_counts_index_entries_that_miss_their_frame_and_rebuild_fixes_them() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), true);
    let mut b = fs::read(idx_path(dir.path())).unwrap();
    b[16 + 8] = b[16 + 8].wrapping_add(3);
    fs::write(idx_path(dir.path()), b).unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let report = store.verify(SEG).unwrap();
    assert!(report.first_bad.is_none());
    assert_eq!(report.index_entries_bad, 1);
    store.rebuild_index(SEG).unwrap();
    assert!(store.verify(SEG).unwrap().is_clean());
}
