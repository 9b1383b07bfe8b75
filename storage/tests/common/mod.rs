#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
//! Helpers shared by the integration tests.

use std::path::Path;

use malachi_storage::{FileStore, Record, SegmentId, SegmentStore, StoreConfig, StoredRecord};

pub const SEG: SegmentId = SegmentId(7);

/// A config that flushes as soon as possible, with few threads and a small
/// index interval so tiny logs still get index entries.
pub fn config() -> StoreConfig {
    StoreConfig {
        flush_interval_ms: 0,
        sync_threads: 2,
        index_interval_bytes: 128,
        read_chunk_bytes: 512,
        // Flushes of a KiB or more take the direct-I/O path, so these tests
        // cover it and its mix with page-cache writes.
        direct_io_bytes_min: 1024,
        ..StoreConfig::default()
    }
}

pub fn store(dir: &Path) -> FileStore {
    FileStore::open_dir(dir, config()).unwrap()
}

pub fn record(i: u64) -> Record {
    Record {
        timestamp_ms: 1_000 + i,
        key: format!("key-{i}").into_bytes(),
        value: vec![(i % 251) as u8; (i as usize * 7) % 90],
        headers: if i.is_multiple_of(3) {
            vec![("h".to_owned(), i.to_le_bytes().to_vec())]
        } else {
            Vec::new()
        },
    }
}

/// Appends each batch and waits for it, so each batch is one flush.
pub fn append_batches(store: &FileStore, batches: &[Vec<Record>]) {
    for batch in batches {
        store.append(SEG, batch).unwrap().wait().unwrap();
    }
}

pub fn read_all(store: &FileStore, segment: SegmentId) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    loop {
        let next = out.len() as u64;
        let got = store.read(segment, next, 3, 300).unwrap();
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

pub fn frame_len(record: &Record) -> u64 {
    (malachi_storage::frame::FRAME_HEADER_BYTES
        + malachi_storage::frame::payload_len(record).unwrap()) as u64
}
