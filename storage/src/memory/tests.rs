use proptest::prelude::*;

use super::*;
use crate::frame::FrameError;
use crate::record::Record;
use crate::store::{OrderEpoch, SegmentStore};

const SEG: SegmentId = SegmentId(7);

fn store(seed: u64) -> MemoryStore {
    MemoryStore::new(StoreConfig::default(), seed).unwrap()
}

fn batch(first: u64, n: u64, value_bytes: usize) -> Vec<Record> {
    (first..first + n)
        .map(|i| Record::new(i, format!("k{i}"), vec![b'v'; value_bytes]))
        .collect()
}

fn read_all(store: &MemoryStore) -> Vec<Record> {
    store
        .read(SEG, 0, usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|r| r.record)
        .collect()
}

#[test]
fn an_unheld_append_is_synced_and_its_ticket_complete_at_once() {
    let store = store(1);
    store.open(SEG).unwrap();
    let ticket = store.append(SEG, &batch(0, 3, 4)).unwrap();
    assert!(ticket.is_complete());
    assert_eq!(ticket.wait().unwrap(), 0..3);
    assert_eq!(store.synced_bytes(SEG), store.written(SEG).len() as u64);
    assert_eq!(read_all(&store), batch(0, 3, 4));
}

#[test]
fn a_held_append_is_unreadable_until_its_sync_is_released() {
    let store = store(1);
    store.open(SEG).unwrap();
    store.hold_syncs();
    let ticket = store.append(SEG, &batch(0, 2, 4)).unwrap();
    assert!(!ticket.is_complete());
    assert_eq!(store.info(SEG).unwrap().length, 0);
    store.release_syncs();
    assert_eq!(ticket.wait().unwrap(), 0..2);
    assert_eq!(read_all(&store).len(), 2);
}

#[test]
fn a_crash_fails_waiting_tickets_and_recovery_drops_the_torn_frame() {
    // Some seed tears; the test looks for one, so it checks a real tear.
    let (store, report) = (0..64)
        .find_map(|seed| {
            let store = store(seed);
            store.open(SEG).unwrap();
            store.append(SEG, &batch(0, 2, 8)).unwrap().wait().unwrap();
            store.hold_syncs();
            let ticket = store.append(SEG, &batch(2, 3, 8)).unwrap();
            let report = store.crash().remove(&SEG)?;
            assert!(matches!(ticket.wait(), Err(StorageError::ShuttingDown)));
            (report.torn_bytes > 0).then_some((store, report))
        })
        .expect("some seed tears the write");
    let written = store.written(SEG);
    let synced = report.synced_bytes as usize;
    assert_eq!(written.len(), synced + report.torn_bytes as usize);
    // The tear cuts a frame: the decoder refuses it for its length or CRC.
    let torn = crate::memory::copy::scan(&written);
    assert!(matches!(
        torn.first_bad.map(|b| b.error),
        Some(FrameError::Incomplete { .. } | FrameError::BadCrc { .. })
    ));
    let recovery = store.open(SEG).unwrap();
    assert!(recovery.truncated_bytes > 0);
    assert!(recovery.info.length >= 2);
    assert_eq!(&read_all(&store)[..2], &batch(0, 2, 8)[..]);
}

#[test]
fn the_same_seed_tears_the_same_bytes() {
    let run = |seed| {
        let store = store(seed);
        store.open(SEG).unwrap();
        store.hold_syncs();
        let _unacknowledged = store.append(SEG, &batch(0, 5, 16)).unwrap();
        (store.crash(), store.written(SEG))
    };
    for seed in 0..16 {
        assert_eq!(run(seed), run(seed));
    }
}

#[test]
fn seal_fence_and_orders_behave_as_on_a_file_store() {
    let store = store(3);
    store.open(SEG).unwrap();
    store.append(SEG, &batch(0, 4, 4)).unwrap().wait().unwrap();
    let order = OrderEpoch { group: 1, term: 5 };
    let fence = store.fence_order(SEG, order).unwrap();
    assert_eq!((fence.durable, fence.order), (4, order));
    assert!(matches!(
        store.append(SEG, &batch(4, 1, 4)),
        Err(StorageError::Fenced { .. })
    ));
    assert!(matches!(
        store.fence_order(SEG, OrderEpoch { group: 1, term: 4 }),
        Err(StorageError::StaleOrder { .. })
    ));
    let seal = store.seal(SEG, 3).unwrap();
    assert_eq!(read_all(&store).len(), 3);
    assert!(store.has_seal_marker(SEG));
    store.close(SEG).unwrap();
    // The seal and the order outlive a crash; the overrun is cut to the seal.
    store.crash();
    assert_eq!(store.open(SEG).unwrap().info.sealed, Some(seal));
    assert_eq!(store.order_epoch(SEG).unwrap(), order);
    assert!(store.cut_to_seal(SEG).unwrap() > 0);
    assert_eq!(store.copy_bytes(SEG).unwrap(), Some(seal.byte_size));
}

#[test]
fn frames_replicate_between_memory_and_file_stores() {
    let dir = tempfile::tempdir().unwrap();
    let file = crate::FileStore::open_dir(dir.path(), StoreConfig::default()).unwrap();
    let memory = store(4);
    memory.open(SEG).unwrap();
    file.open(SEG).unwrap();
    memory
        .append(SEG, &batch(0, 5, 32))
        .unwrap()
        .wait()
        .unwrap();
    let run = memory.read_frames(SEG, 0, 1 << 20).unwrap();
    assert_eq!(run.records, 5);
    file.append_frames(SEG, 0, &run.bytes)
        .unwrap()
        .wait()
        .unwrap();
    let back = file.read_frames(SEG, 2, 1 << 20).unwrap();
    memory.close(SEG).unwrap();
    memory.remove_copy(SEG).unwrap();
    memory.open(SEG).unwrap();
    assert!(matches!(
        memory.append_frames(SEG, 2, &back.bytes),
        Err(StorageError::NotAtEnd { .. })
    ));
    memory
        .append_frames(SEG, 0, &run.bytes)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(read_all(&memory), batch(0, 5, 32));
}

#[test]
fn a_copy_set_aside_opens_empty_and_is_discarded_once() {
    let store = store(5);
    store.open(SEG).unwrap();
    store.append(SEG, &batch(0, 2, 4)).unwrap().wait().unwrap();
    store.write_sidecar(SEG, b"producers").unwrap();
    assert!(store.set_aside(SEG).unwrap());
    assert!(store.is_aside(SEG) && !store.has_copy(SEG));
    assert_eq!(store.open(SEG).unwrap().info.length, 0);
    assert!(store.discard_aside(SEG).unwrap() > 0);
    assert_eq!(store.local_copies().unwrap(), vec![SEG]);
    assert_eq!(
        store.read_sidecar(SEG).unwrap().as_deref(),
        Some(&b"producers"[..])
    );
    assert!(store.remove_copy(SEG).unwrap() > Some(0));
    assert!(store.local_copies().unwrap().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// After a crash every synced byte is there, nothing written after the
    /// last sync survives but a torn prefix of the first unsynced write, and
    /// recovery reads back exactly the synced records, then perhaps whole
    /// frames of that write, never a torn one.
    #[test]
    fn a_crash_keeps_every_synced_byte_and_at_most_a_torn_prefix(
        seed in any::<u64>(),
        synced_batches in prop::collection::vec(1u64..4, 0..4),
        unsynced_batches in prop::collection::vec(1u64..4, 0..4),
        value_bytes in 0usize..64,
    ) {
        let store = store(seed);
        store.open(SEG).unwrap();
        let mut next = 0;
        for n in &synced_batches {
            store.append(SEG, &batch(next, *n, value_bytes)).unwrap().wait().unwrap();
            next += n;
        }
        let acknowledged = next;
        let synced = store.written(SEG);
        store.hold_syncs();
        let mut tickets = Vec::new();
        for n in &unsynced_batches {
            tickets.push(store.append(SEG, &batch(next, *n, value_bytes)).unwrap());
            next += n;
        }
        let written = store.written(SEG);
        let first_write_end = unsynced_batches.first().map_or(synced.len(), |&n| {
            synced.len() + batch(acknowledged, n, value_bytes)
                .iter()
                .map(|r| frame::FRAME_HEADER_BYTES + frame::payload_len(r).unwrap())
                .sum::<usize>()
        });
        let report = store.crash().remove(&SEG);
        let after = store.written(SEG);
        prop_assert_eq!(&after[..synced.len()], &synced[..]);
        prop_assert!(after.len() < first_write_end || after.len() == synced.len());
        prop_assert_eq!(&after[..], &written[..after.len()]);
        let torn = report.map_or(0, |r| r.torn_bytes as usize);
        prop_assert_eq!(after.len(), synced.len() + torn);
        if torn > 0 {
            let scan = crate::memory::copy::scan(&after);
            prop_assert!(scan.first_bad.is_some(), "the torn frame decodes");
        }
        for ticket in tickets {
            prop_assert!(ticket.wait().is_err());
        }
        store.open(SEG).unwrap();
        let records = read_all(&store);
        prop_assert!(records.len() as u64 >= acknowledged);
        prop_assert_eq!(&records[..], &batch(0, records.len() as u64, value_bytes)[..]);
        prop_assert_eq!(store.written(SEG).len(), store.info(SEG).unwrap().byte_size as usize);
    }
}
