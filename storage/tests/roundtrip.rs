#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Append, reopen and read back.

mod common;

use common::*;
use malachi_storage::{FileStore, Record, SegmentId, SegmentStore, StorageError, StoreConfig};
use proptest::prelude::*;

fn arb_record() -> impl Strategy<Value = Record> {
    (
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..20),
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(
            ("[a-z]{0,6}", proptest::collection::vec(any::<u8>(), 0..10)),
            0..3,
        ),
    )
        .prop_map(|(timestamp_ms, key, value, headers)| Record {
            timestamp_ms,
            key,
            value,
            headers,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_batches_survive_a_reopen_in_order_with_contiguous_offsets(
        batches in proptest::collection::vec(proptest::collection::vec(arb_record(), 0..12), 1..8),
        records_max in 1usize..20,
        bytes_max in 0usize..2000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut next = 0u64;
        {
            let store = store(dir.path());
            store.open(SEG).unwrap();
            for batch in &batches {
                let ticket = store.append(SEG, batch).unwrap();
                prop_assert_eq!(ticket.offsets(), next..next + batch.len() as u64);
                next += batch.len() as u64;
                ticket.wait().unwrap();
            }
        }
        let store = store(dir.path());
        let recovery = store.open(SEG).unwrap();
        prop_assert_eq!(recovery.truncated_bytes, 0);
        prop_assert_eq!(recovery.info.length, next);
        let expected: Vec<Record> = batches.concat();
        let mut got = Vec::new();
        loop {
            let from = got.len() as u64;
            let page = store.read(SEG, from, records_max, bytes_max).unwrap();
            if page.is_empty() {
                break;
            }
            for (i, r) in page.iter().enumerate() {
                prop_assert_eq!(r.offset, from + i as u64);
            }
            got.extend(page.into_iter().map(|r| r.record));
        }
        prop_assert_eq!(got, expected);
    }
}

#[test]
fn concurrent_appenders_get_disjoint_contiguous_offsets_and_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let threads = 8;
    let per_thread = 50;
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                for i in 0..per_thread {
                    let r = record(t * 1000 + i);
                    store.append(SEG, &[r]).unwrap().wait().unwrap();
                }
            });
        }
    });
    let all = read_all(&store, SEG);
    assert_eq!(all.len() as u64, threads * per_thread);
    assert!(all.iter().enumerate().all(|(i, r)| r.offset == i as u64));
    let stats = store.stats();
    assert_eq!(stats.flushed_records, threads * per_thread);
    assert!(stats.flushes <= threads * per_thread);
}

#[test]
fn a_ticket_is_a_future_that_resolves_after_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let ticket = store.append(SEG, &[record(1), record(2)]).unwrap();
    assert_eq!(block_on(ticket).unwrap(), 0..2);
    assert_eq!(store.info(SEG).unwrap().length, 2);
}

#[test]
fn with_a_long_interval_an_append_waits_for_the_record_trigger_or_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        flush_interval_ms: 60_000,
        flush_records_max: 4,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let lone = store.append(SEG, &[record(0)]).unwrap();
    // An absence (no flush before a trigger), watched for 100 ms.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!lone.is_complete(), "flushed before any trigger fired");
    assert_eq!(
        store.read(SEG, 0, 10, 10_000).unwrap().len(),
        0,
        "a read saw an unacknowledged record"
    );
    let batch = store
        .append(SEG, &[record(1), record(2), record(3)])
        .unwrap();
    batch.wait().unwrap();
    assert!(lone.is_complete());
    let tail = store.append(SEG, &[record(4)]).unwrap();
    store.sync(SEG).unwrap().wait().unwrap();
    assert!(tail.is_complete());
    assert_eq!(store.info(SEG).unwrap().length, 5);
}

#[test]
fn the_time_trigger_flushes_a_lone_append() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        flush_interval_ms: 20,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let started = std::time::Instant::now();
    store.append(SEG, &[record(0)]).unwrap().wait().unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(20));
}

#[test]
fn an_oversized_record_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        record_bytes_max: 1000,
        pending_bytes_max: 4000,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let big = Record::new(0, "k", vec![0u8; 2000]);
    assert!(matches!(
        store.append(SEG, &[big]),
        Err(StorageError::RecordTooLarge { .. })
    ));
    assert_eq!(store.info(SEG).unwrap().assigned, 0);
}

#[test]
fn pending_bytes_beyond_the_limit_get_busy() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        flush_interval_ms: 60_000,
        record_bytes_max: 1000,
        pending_bytes_max: 2500,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    store.open(SEG).unwrap();
    let r = Record::new(0, "k", vec![0u8; 900]);
    let _a = store.append(SEG, &std::slice::from_ref(&r)).unwrap();
    let _b = store.append(SEG, &std::slice::from_ref(&r)).unwrap();
    assert!(matches!(
        store.append(SEG, &[r]),
        Err(StorageError::Busy { .. })
    ));
}

#[test]
fn reading_past_the_end_is_a_typed_error_and_at_the_end_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    append_batches(&store, &[vec![record(0)]]);
    assert!(store.read(SEG, 1, 10, 100).unwrap().is_empty());
    assert!(matches!(
        store.read(SEG, 2, 10, 100),
        Err(StorageError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn the_byte_budget_returns_at_least_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    append_batches(&store, &[vec![record(10), record(11), record(12)]]);
    assert_eq!(store.read(SEG, 0, 10, 1).unwrap().len(), 1);
    assert_eq!(store.read(SEG, 0, 1, 0).unwrap().len(), 1);
    assert_eq!(store.read(SEG, 1, 1, 0).unwrap()[0].offset, 1);
    let two = frame_len(&record(10)) + frame_len(&record(11));
    assert_eq!(store.read(SEG, 0, 10, two as usize).unwrap().len(), 2);
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn appends_from_many_threads_coalesce_into_one_write_and_sync_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        flush_interval_ms: 60_000,
        flush_records_max: 40,
        ..config()
    };
    let store = FileStore::open_dir(dir.path(), cfg).unwrap();
    let segments = [SegmentId(1), SegmentId(2), SegmentId(3)];
    for s in segments {
        store.open(s).unwrap();
    }
    // Four threads per segment, ten records each: the fortieth record of a
    // segment fires its record trigger, so each file gets exactly one flush.
    std::thread::scope(|scope| {
        for s in segments {
            for t in 0..4u64 {
                let store = &store;
                scope.spawn(move || {
                    let batch: Vec<Record> = (0..10).map(|i| record(t * 10 + i)).collect();
                    store.append(s, &batch).unwrap().wait().unwrap();
                });
            }
        }
    });
    let stats = store.stats();
    assert_eq!(stats.flushed_records, 120);
    assert_eq!(stats.flushes, 3);
    for s in segments {
        assert_eq!(read_all(&store, s).len(), 40);
    }
}

#[test]
fn read_with_lends_the_same_records_as_read_and_stops_where_the_visitor_breaks() {
    use std::ops::ControlFlow;
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let batch: Vec<Record> = (0..50).map(record).collect();
    store.append(SEG, &batch).unwrap().wait().unwrap();

    let mut lent = Vec::new();
    let taken = store
        .read_with(SEG, 7, 30, usize::MAX, &mut |view| {
            lent.push((view.offset, view.to_record()));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(taken, 30);
    let read: Vec<(u64, Record)> = store
        .read(SEG, 7, 30, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|r| (r.offset, r.record))
        .collect();
    assert_eq!(lent, read);

    // A refused record is not counted, and nothing after it is lent.
    let mut seen = Vec::new();
    let taken = store
        .read_with(SEG, 0, 50, usize::MAX, &mut |view| {
            seen.push(view.offset);
            if view.offset == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(taken, 4);
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);
}

/// A caller's own record type, borrowing its parts from one buffer.
struct Borrowed<'a> {
    timestamp_ms: u64,
    key: &'a [u8],
    value: &'a [u8],
    headers: Vec<(&'a str, &'a [u8])>,
}

impl malachi_storage::RecordParts for Borrowed<'_> {
    fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    fn key(&self) -> &[u8] {
        self.key
    }
    fn value(&self) -> &[u8] {
        self.value
    }
    fn header_count(&self) -> usize {
        self.headers.len()
    }
    fn header(&self, i: usize) -> (&str, &[u8]) {
        self.headers[i]
    }
}

#[test]
fn records_lent_by_any_type_are_stored_like_owned_records() {
    let owned: Vec<Record> = (0..20).map(record).collect();
    let lent: Vec<Borrowed<'_>> = owned
        .iter()
        .map(|r| Borrowed {
            timestamp_ms: r.timestamp_ms,
            key: &r.key,
            value: &r.value,
            headers: r
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_slice()))
                .collect(),
        })
        .collect();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (store(a.path()), store(b.path()));
    sa.open(SEG).unwrap();
    sb.open(SEG).unwrap();
    sa.append(SEG, &owned).unwrap().wait().unwrap();
    sb.append(SEG, &lent).unwrap().wait().unwrap();
    assert_eq!(read_all(&sa, SEG), read_all(&sb, SEG));
    drop((sa, sb));
    let log = |d: &tempfile::TempDir| {
        std::fs::read(d.path().join(format!("{}.log", SEG.file_stem()))).unwrap()
    };
    assert_eq!(
        log(&a),
        log(&b),
        "the same records framed to different bytes"
    );
}
