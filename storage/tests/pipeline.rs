#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Pipelined flushes: many appenders on one segment, with one and with
//! several flushes of the file in flight.

mod common;

use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use common::*;
use malachi_storage::{FileStore, SegmentStore, StoreConfig};

/// Every frame of the log: (offset, durable_below).
fn trailers(dir: &std::path::Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(dir.join(format!("{}.log", SEG.file_stem()))).unwrap();
    let mut rest = &bytes[..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (view, len) = malachi_storage::frame::decode(rest).unwrap();
        out.push((view.offset, view.durable_below));
        rest = &rest[len..];
    }
    out
}

fn hammer(depth: usize) -> (tempfile::TempDir, Vec<(u64, u64)>) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        flush_pipeline_depth: depth,
        sync_threads: 4,
        ..config()
    };
    let acked = Mutex::new(Vec::new());
    {
        let store = FileStore::open_dir(dir.path(), cfg).unwrap();
        store.open(SEG).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (store, acked) = (&store, &acked);
                s.spawn(move || {
                    for i in 0..40u64 {
                        let batch: Vec<_> = (0..3).map(|j| record(t * 1_000 + i * 3 + j)).collect();
                        let offsets = store.append(SEG, &batch).unwrap().wait().unwrap();
                        acked.lock().unwrap().push((offsets, batch));
                    }
                });
            }
        });
        // Every acknowledged batch reads back at the offsets it was given.
        let stored = read_all(&store, SEG);
        assert_eq!(stored.len(), 8 * 40 * 3);
        for (offsets, batch) in acked.lock().unwrap().iter() {
            let got: Vec<_> = stored[offsets.start as usize..offsets.end as usize]
                .iter()
                .map(|r| r.record.clone())
                .collect();
            assert_eq!(&got, batch);
        }
    }
    let trailers = trailers(dir.path());
    (dir, trailers)
}

fn check_trailers(trailers: &[(u64, u64)]) {
    let mut last = 0;
    for (i, &(offset, durable_below)) in trailers.iter().enumerate() {
        assert_eq!(offset, i as u64);
        assert!(
            durable_below <= offset,
            "frame {offset} claims a durable end past itself"
        );
        assert!(
            durable_below >= last,
            "durable_below went backwards at {offset}"
        );
        last = durable_below;
    }
}

#[test]
fn pipelined_flushes_keep_every_acknowledged_batch_in_order() {
    let (dir, trailers) = hammer(3);
    check_trailers(&trailers);
    // The copy reopens clean: pipelining never looks like damage.
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.length, 8 * 40 * 3);
    assert_eq!(recovery.truncated_bytes, 0);
}

#[test]
fn with_a_depth_of_one_each_flush_starts_at_the_durable_end() {
    let (_dir, trailers) = hammer(1);
    check_trailers(&trailers);
    // Serialized flushes: whenever durable_below moves, it moves to the
    // frame's own offset (the first frame of a flush taken after the
    // previous flush was durable), which is what pre-pipelining files hold.
    let mut last = 0;
    for &(offset, durable_below) in &trailers {
        if durable_below != last {
            assert_eq!(durable_below, offset);
            last = durable_below;
        }
    }
}

#[test]
fn a_pipeline_depth_out_of_bounds_is_refused() {
    for depth in [0, malachi_storage::FLUSH_PIPELINE_DEPTH_MAX + 1] {
        let cfg = StoreConfig {
            flush_pipeline_depth: depth,
            ..config()
        };
        assert!(FileStore::open_dir(tempfile::tempdir().unwrap().path(), cfg).is_err());
    }
}

fn log_len(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join(format!("{}.log", SEG.file_stem())))
        .unwrap()
        .len()
}

fn log_bytes(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join(format!("{}.log", SEG.file_stem()))).unwrap()
}

/// Checks the log holds exactly `len` bytes of frames, followed (only when
/// `padded` is allowed) by under one block of zeros ending on a block.
fn assert_frames_then_padding(dir: &std::path::Path, len: u64, padded: bool, what: &str) {
    let file_len = log_len(dir);
    if file_len == len {
        return;
    }
    assert!(
        padded,
        "{what}: {file_len} bytes on disk for {len} of frames"
    );
    assert_eq!(
        file_len,
        len.next_multiple_of(4096),
        "{what}: padding ends on a block"
    );
    let bytes = log_bytes(dir);
    assert!(
        bytes[len as usize..].iter().all(|&b| b == 0),
        "{what}: padding is zeros"
    );
}

/// Appends batches whose sizes cross block boundaries at every phase, checks
/// the file holds nothing but frames and a direct write's padding while the
/// store runs, and exactly its frames once the store is shut down; reopens,
/// appends again and reads it all.
fn exact_length_across_reopen(direct_io: bool) -> u64 {
    let mut direct_bytes = 0;
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        direct_io,
        // Some flushes go direct and some through the page cache, mixed.
        direct_io_bytes_min: 1500,
        ..config()
    };
    let mut expected = Vec::new();
    let mut len = 0;
    for round in 0..2u64 {
        let store = FileStore::open_dir(dir.path(), cfg.clone()).unwrap();
        let recovery = store.open(SEG).unwrap();
        assert_eq!(recovery.truncated_bytes, 0, "round {round}");
        assert_eq!(recovery.info.length, expected.len() as u64);
        for i in 0..60u64 {
            let n = 1 + (i * 7 + round) % 13;
            let batch: Vec<_> = (0..n)
                .map(|j| record(round * 10_000 + i * 20 + j))
                .collect();
            len += batch.iter().map(frame_len).sum::<u64>();
            store.append(SEG, &batch).unwrap().wait().unwrap();
            expected.extend(batch);
            let what = format!("round {round} batch {i}");
            assert_frames_then_padding(dir.path(), len, direct_io, &what);
        }
        let read: Vec<_> = read_all(&store, SEG)
            .into_iter()
            .map(|r| r.record)
            .collect();
        assert_eq!(read, expected);
        direct_bytes += store.stats().direct_bytes;
        drop(store);
        assert_eq!(
            log_len(dir.path()),
            len,
            "round {round}: trimmed at shutdown"
        );
    }
    direct_bytes
}

#[test]
fn a_crash_that_leaves_padding_loses_nothing_and_reports_no_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        direct_io_bytes_min: 1,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg.clone()).unwrap();
    store.open(SEG).unwrap();
    let batch: Vec<_> = (0..3).map(record).collect();
    let len: u64 = batch.iter().map(frame_len).sum();
    store.append(SEG, &batch).unwrap().wait().unwrap();
    let direct = store.stats().direct_bytes > 0;
    // A crash: the store never shuts down, so nothing trims the padding.
    std::mem::forget(store);
    if direct {
        assert_eq!(log_len(dir.path()), len.next_multiple_of(4096));
    }
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(recovery.info.length, 3);
    assert_eq!(log_len(dir.path()), len);
    let read: Vec<_> = read_all(&store, SEG)
        .into_iter()
        .map(|r| r.record)
        .collect();
    assert_eq!(read, batch);
}

#[test]
fn sealing_and_closing_trim_the_padding() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        direct_io_bytes_min: 1,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let batch: Vec<_> = (0..5).map(record).collect();
    let len: u64 = batch.iter().map(frame_len).sum();
    store.append(SEG, &batch).unwrap().wait().unwrap();
    assert_frames_then_padding(dir.path(), len, true, "before the seal");
    store.seal(SEG, 5).unwrap();
    assert_eq!(log_len(dir.path()), len, "sealed");
    store.close(SEG).unwrap();
    // A verify from outside the store (the segment closed) scans the file to
    // its end and meets only frames.
    let report = store.verify(SEG).unwrap();
    assert!(report.first_bad.is_none(), "{report:?}");
    assert_eq!(report.records, 5);
}

#[test]
fn direct_writes_leave_only_padding_past_the_frames_and_trim_it_at_shutdown() {
    // /tmp may refuse O_DIRECT (tmpfs); where it does not, the blocks went direct.
    let direct_bytes = exact_length_across_reopen(true);
    let probe = tempfile::tempdir().unwrap();
    let tmp_supports_direct = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(probe.path().join("probe"))
        .is_ok();
    assert_eq!(direct_bytes > 0, tmp_supports_direct);
}

#[test]
fn buffered_writes_keep_the_log_exactly_as_long_as_its_frames() {
    assert_eq!(exact_length_across_reopen(false), 0);
}

#[test]
fn a_copy_closed_and_reopened_in_one_store_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        direct_io_bytes_min: 1,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg.clone()).unwrap();
    let mut expected = Vec::new();
    let mut len = 0;
    for round in 0..3u64 {
        store.open(SEG).unwrap();
        let batch: Vec<_> = (0..3).map(|i| record(round * 10 + i)).collect();
        len += batch.iter().map(frame_len).sum::<u64>();
        store.append(SEG, &batch).unwrap().wait().unwrap();
        expected.extend(batch);
        // The close trims the padding of this copy only: the next open's
        // appends, written over the same file, are never cut.
        store.close(SEG).unwrap();
        assert_eq!(log_len(dir.path()), len, "round {round}");
    }
    drop(store);
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    assert_eq!(store.open(SEG).unwrap().truncated_bytes, 0);
    let read: Vec<_> = read_all(&store, SEG)
        .into_iter()
        .map(|r| r.record)
        .collect();
    assert_eq!(read, expected);
}
