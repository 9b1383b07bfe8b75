#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Crash simulation and damage detection on real files in a tempdir.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use malachi_storage::{FileStore, FrameError, Record, SegmentStore, StorageError};

/// Writes `batches` (one flush each) and returns the log bytes and the
/// start position of every frame.
fn write_log(dir: &Path, batches: &[Vec<Record>]) -> (Vec<u8>, Vec<u64>) {
    {
        let store = store(dir);
        store.open(SEG).unwrap();
        append_batches(&store, batches);
    }
    let bytes = fs::read(dir.join(format!("{}.log", SEG.file_stem()))).unwrap();
    let mut starts = Vec::new();
    let mut pos = 0;
    for r in batches.iter().flatten() {
        starts.push(pos);
        pos += frame_len(r);
    }
    assert_eq!(pos, bytes.len() as u64);
    (bytes, starts)
}

fn install_log(dir: &Path, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(format!("{}.log", SEG.file_stem())), bytes).unwrap();
}

fn batches() -> Vec<Vec<Record>> {
    vec![
        (0..4).map(record).collect(),
        (4..9).map(record).collect(),
        (9..12).map(record).collect(),
    ]
}

#[test]
fn cutting_the_log_anywhere_in_its_last_frames_keeps_exactly_the_complete_frames() {
    let src = tempfile::tempdir().unwrap();
    let (bytes, starts) = write_log(src.path(), &batches());
    let all: Vec<Record> = batches().concat();
    // Every byte offset from the start of the third-to-last frame to the end.
    let from = starts[starts.len() - 3];
    for cut in from..=bytes.len() as u64 {
        let dir = tempfile::tempdir().unwrap();
        install_log(dir.path(), &bytes[..cut as usize]);
        let store = store(dir.path());
        let recovery = store.open(SEG).unwrap();
        let complete = starts.iter().filter(|&&s| s < cut).count() as u64
            - u64::from(!starts.contains(&cut) && cut != bytes.len() as u64);
        assert_eq!(recovery.info.length, complete, "cut at byte {cut}");
        let valid_end = starts
            .get(complete as usize)
            .copied()
            .unwrap_or(bytes.len() as u64);
        assert_eq!(
            recovery.truncated_bytes,
            cut - valid_end,
            "cut at byte {cut}"
        );
        let read: Vec<Record> = read_all(&store, SEG)
            .into_iter()
            .map(|r| r.record)
            .collect();
        assert_eq!(read, all[..complete as usize], "cut at byte {cut}");
        // The truncated copy takes appends again at the next offset.
        let ticket = store.append(SEG, &[record(99)]).unwrap();
        assert_eq!(ticket.wait().unwrap(), complete..complete + 1);
    }
}

#[test]
fn a_torn_last_flush_with_later_frames_of_the_same_flush_is_truncated() {
    // Pages of one unsynced write may reach the disk out of order: a hole in
    // the last flush followed by valid frames of that same flush is torn.
    let src = tempfile::tempdir().unwrap();
    let (mut bytes, starts) = write_log(src.path(), &batches());
    let hole = starts[9] as usize; // first frame of the last flush
    let hole_end = starts[10] as usize;
    bytes[hole..hole_end].fill(0);
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.length, 9);
    assert_eq!(recovery.truncated_bytes, bytes.len() as u64 - starts[9]);
}

#[test]
fn a_bad_frame_followed_by_a_later_flush_is_damage_and_the_bytes_are_left_alone() {
    let src = tempfile::tempdir().unwrap();
    let (mut bytes, starts) = write_log(src.path(), &batches());
    let victim = starts[5] as usize + 20;
    bytes[victim] ^= 0x10;
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    match store.open(SEG) {
        Err(StorageError::Damaged {
            position,
            offset,
            reason,
            later_position,
            ..
        }) => {
            assert_eq!(position, starts[5]);
            assert_eq!(offset, 5);
            assert!(matches!(reason, FrameError::BadCrc { .. }));
            assert_eq!(later_position, starts[9]);
        }
        other => panic!("expected damage, got {other:?}"),
    }
    let after = fs::read(dir.path().join(format!("{}.log", SEG.file_stem()))).unwrap();
    assert_eq!(after, bytes, "recovery modified a damaged copy");
}

#[test]
fn a_flipped_bit_in_the_middle_is_found_by_verify() {
    let src = tempfile::tempdir().unwrap();
    let (mut bytes, starts) = write_log(src.path(), &batches());
    bytes[starts[2] as usize + 30] ^= 0x01;
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    let report = store.verify(SEG).unwrap();
    let bad = report.first_bad.expect("verify missed the flip");
    assert_eq!((bad.position, bad.offset), (starts[2], 2));
    assert_eq!(report.records, 2);
    assert_eq!(report.valid_after.map(|f| f.position), Some(starts[3]));
    assert!(report.later_flush.is_some());
    assert!(!report.is_clean());
}

#[test]
fn a_flipped_bit_in_a_sealed_copy_is_a_typed_error_on_read_not_a_short_read() {
    let dir = tempfile::tempdir().unwrap();
    let log_path;
    let starts: Vec<u64>;
    {
        let store = store(dir.path());
        store.open(SEG).unwrap();
        append_batches(&store, &batches());
        store.seal(SEG, 12).unwrap();
        log_path = store.log_path(SEG);
        let mut pos = 0;
        starts = batches()
            .concat()
            .iter()
            .map(|r| {
                let s = pos;
                pos += frame_len(r);
                s
            })
            .collect();
    }
    let mut bytes = fs::read(&log_path).unwrap();
    bytes[starts[6] as usize + 25] ^= 0x80;
    fs::write(&log_path, &bytes).unwrap();
    let store = store(dir.path());
    // A sealed copy opens from its marker; the damage surfaces on read.
    store.open(SEG).unwrap();
    assert_eq!(store.read(SEG, 0, 6, 1 << 20).unwrap().len(), 6);
    match store.read(SEG, 4, 100, 1 << 20) {
        Err(StorageError::Corrupt {
            position, offset, ..
        }) => assert_eq!((position, offset), (starts[6], 6)),
        other => panic!("expected a corrupt-frame error, got {other:?}"),
    }
    assert!(matches!(
        store.read(SEG, 6, 1, 1 << 20),
        Err(StorageError::Corrupt { offset: 6, .. })
    ));
    let report = store.verify(SEG).unwrap();
    assert_eq!(report.first_bad.map(|b| b.offset), Some(6));
}

#[test]
fn zeros_after_the_last_frame_are_a_torn_tail() {
    let src = tempfile::tempdir().unwrap();
    let (mut bytes, _) = write_log(src.path(), &batches());
    let len = bytes.len();
    bytes.extend(std::iter::repeat_n(0u8, 8192));
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.length, 12);
    assert_eq!(recovery.truncated_bytes, 8192);
    assert_eq!(fs::metadata(store.log_path(SEG)).unwrap().len(), len as u64);
}

#[test]
fn a_sealed_copy_shorter_than_its_seal_opens_with_what_it_holds_and_is_not_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let log_path;
    {
        let store = store(dir.path());
        store.open(SEG).unwrap();
        append_batches(&store, &batches());
        store.seal(SEG, 12).unwrap();
        log_path = store.log_path(SEG);
    }
    let bytes = fs::read(&log_path).unwrap();
    let cut = bytes.len() - 5;
    fs::write(&log_path, &bytes[..cut]).unwrap();
    let store = FileStore::open_dir(dir.path(), config()).unwrap();
    let recovery = store.open(SEG).unwrap();
    assert!(recovery.short_of_seal);
    assert_eq!(recovery.info.length, 11);
    assert_eq!(fs::metadata(&log_path).unwrap().len(), cut as u64);
}

/// Encodes `records` from `first` on as one flush taken when the log was
/// durable below `durable_below`.
fn encode_flush(buf: &mut Vec<u8>, first: u64, durable_below: u64, records: &[Record]) {
    for (i, r) in records.iter().enumerate() {
        malachi_storage::frame::encode(buf, first + i as u64, durable_below, r);
    }
}

#[test]
fn a_hole_in_a_flush_followed_by_a_pipelined_flush_is_torn() {
    // Flush 3 was written while flush 2 still waited for its fdatasync
    // (both carry durable_below 4): a crash may persist flush 3's pages and
    // not flush 2's, and neither was acknowledged, so this is a torn tail.
    let all: Vec<Record> = (0..12).map(record).collect();
    let mut bytes = Vec::new();
    encode_flush(&mut bytes, 0, 0, &all[0..4]);
    let second = bytes.len();
    encode_flush(&mut bytes, 4, 4, &all[4..9]);
    encode_flush(&mut bytes, 9, 4, &all[9..12]);
    let hole = second + frame_len(&all[4]) as usize;
    bytes[hole..hole + 40].fill(0);
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.info.length, 5);
    assert_eq!(recovery.truncated_bytes, (bytes.len() - hole) as u64);
    let read: Vec<Record> = read_all(&store, SEG)
        .into_iter()
        .map(|r| r.record)
        .collect();
    assert_eq!(read, all[..5]);
}

#[test]
fn a_hole_followed_by_a_flush_written_after_it_was_durable_is_damage() {
    // The same log, but flush 3 was taken once flush 2 was durable
    // (durable_below 9): flush 2's bytes may have been acknowledged.
    let all: Vec<Record> = (0..12).map(record).collect();
    let mut bytes = Vec::new();
    encode_flush(&mut bytes, 0, 0, &all[0..4]);
    let second = bytes.len();
    encode_flush(&mut bytes, 4, 4, &all[4..9]);
    encode_flush(&mut bytes, 9, 9, &all[9..12]);
    let hole = second + frame_len(&all[4]) as usize;
    bytes[hole..hole + 40].fill(0);
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), &bytes);
    let store = store(dir.path());
    assert!(matches!(
        store.open(SEG),
        Err(StorageError::Damaged { offset: 5, .. })
    ));
}

/// Opens `log` as the segment's file and returns (records, truncated bytes,
/// file length after recovery).
fn recover(log: &[u8]) -> (u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    install_log(dir.path(), log);
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    let len = fs::metadata(dir.path().join(format!("{}.log", SEG.file_stem())))
        .unwrap()
        .len();
    (recovery.info.length, recovery.truncated_bytes, len)
}

#[test]
fn zeros_to_the_next_block_are_padding_and_other_tails_are_torn() {
    const BLOCK: u64 = 4096;
    let src = tempfile::tempdir().unwrap();
    let (bytes, starts) = write_log(src.path(), &batches());
    let log_end = bytes.len() as u64;
    let ends: Vec<u64> = starts.iter().skip(1).copied().chain([log_end]).collect();
    for (i, &end) in ends.iter().enumerate() {
        let records = i as u64 + 1;
        let frames = &bytes[..end as usize];
        let padded = end.next_multiple_of(BLOCK);
        let with_zeros = |total: u64| {
            let mut log = frames.to_vec();
            log.resize(total as usize, 0);
            log
        };
        // A direct write's padding: dropped without a report.
        assert_eq!(recover(&with_zeros(padded)), (records, 0, end), "end {end}");
        // Zeros that stop short of a block were not written as padding.
        if padded - end > 1 {
            let cut = padded - 1;
            assert_eq!(
                recover(&with_zeros(cut)),
                (records, cut - end, end),
                "end {end}"
            );
        }
        // A whole block or more of zeros is more than padding.
        let long = padded + BLOCK;
        assert_eq!(
            recover(&with_zeros(long)),
            (records, long - end, end),
            "end {end}"
        );
        // Padding with a byte that is not zero is a torn tail.
        if padded > end {
            let mut log = with_zeros(padded);
            log[padded as usize - 1] = 1;
            assert_eq!(recover(&log), (records, padded - end, end), "end {end}");
        }
    }
}

/// `truncate_tail` cuts a copy just opened back to a record count (how the
/// broker drops the prefix of a batch a crash tore): reads, the next append
/// (a direct write over the cut block), the index sidecar and a later
/// recovery all see the shorter log. It refuses past the end and once
/// anything was appended.
#[test]
fn a_copy_just_opened_can_be_cut_back_to_a_record_count() {
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<Record> = (0..40).map(record).collect();
    let later: Vec<Record> = (100..120).map(record).collect();
    {
        let store = store(dir.path());
        store.open(SEG).unwrap();
        append_batches(&store, &[all[..30].to_vec(), all[30..].to_vec()]);
    }
    {
        let store = store(dir.path());
        store.open(SEG).unwrap();
        assert!(matches!(
            store.truncate_tail(SEG, 41),
            Err(StorageError::NotTruncatable { .. })
        ));
        assert_eq!(store.truncate_tail(SEG, 40).unwrap().length, 40);
        let info = store.truncate_tail(SEG, 33).unwrap();
        assert_eq!((info.length, info.assigned), (33, 33));
        let read: Vec<Record> = read_all(&store, SEG)
            .into_iter()
            .map(|r| r.record)
            .collect();
        assert_eq!(read, all[..33]);
        let ticket = store.append(SEG, &later).unwrap();
        assert_eq!(ticket.wait().unwrap(), 33..53);
        assert!(matches!(
            store.truncate_tail(SEG, 30),
            Err(StorageError::NotTruncatable { .. })
        ));
    }
    let store = store(dir.path());
    let recovery = store.open(SEG).unwrap();
    assert_eq!(recovery.truncated_bytes, 0);
    assert!(!recovery.index_rebuilt, "the sidecar was cut with the log");
    let read: Vec<Record> = read_all(&store, SEG)
        .into_iter()
        .map(|r| r.record)
        .collect();
    assert_eq!(read, [&all[..33], &later[..]].concat());
    assert!(store.verify(SEG).unwrap().is_clean());
}
