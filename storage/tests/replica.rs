#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A replicated copy: frames shipped verbatim (`read_frames` on the primary,
//! `append_frames` on a follower), the committed end that clamps readers and
//! becomes the primary's `durable_below`, and every refusal of a bad run.

mod common;

use std::fs;

use common::*;
use malachi_storage::{
    FileStore, FrameError, Record, SegmentId, SegmentStore, StorageError, frame,
};
use proptest::prelude::*;

fn log_bytes(dir: &std::path::Path, segment: SegmentId) -> Vec<u8> {
    fs::read(dir.join(format!("{}.log", segment.file_stem()))).unwrap()
}

/// Ships everything durable on `primary` from `from` to `follower`, in runs
/// of at most `bytes_max` bytes.
fn ship(primary: &FileStore, follower: &FileStore, from: u64, bytes_max: usize) -> u64 {
    let mut next = from;
    loop {
        let run = primary.read_frames(SEG, next, bytes_max).unwrap();
        if run.records == 0 {
            return next;
        }
        assert_eq!(run.first, next);
        let ticket = follower.append_frames(SEG, run.first, &run.bytes).unwrap();
        assert_eq!(ticket.wait().unwrap(), next..next + run.records);
        next += run.records;
    }
}

#[test]
fn a_follower_that_writes_the_primarys_frames_holds_the_same_bytes() {
    let (pdir, fdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (primary, follower) = (store(pdir.path()), store(fdir.path()));
    primary.open(SEG).unwrap();
    follower.open(SEG).unwrap();
    primary.set_committed(SEG, 0).unwrap();
    follower.set_committed(SEG, 0).unwrap();
    let records: Vec<Record> = (0..40).map(record).collect();
    append_batches(&primary, &[records[..15].to_vec(), records[15..].to_vec()]);
    // Small runs: every run boundary falls somewhere else than a flush's.
    assert_eq!(ship(&primary, &follower, 0, 200), 40);
    primary.set_committed(SEG, 40).unwrap();
    follower.set_committed(SEG, 40).unwrap();
    let on_follower = read_all(&follower, SEG);
    assert_eq!(on_follower.len(), 40);
    for (got, want) in on_follower.iter().zip(&records) {
        assert_eq!(&got.record, want);
    }
    primary.seal(SEG, 40).unwrap();
    follower.seal(SEG, 40).unwrap();
    drop((primary, follower));
    assert_eq!(log_bytes(pdir.path(), SEG), log_bytes(fdir.path(), SEG));
}

#[test]
fn readers_of_a_replicated_copy_see_only_committed_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    store.set_committed(SEG, 0).unwrap();
    append_batches(&store, &[(0..10).map(record).collect()]);
    let info = store.info(SEG).unwrap();
    assert_eq!(
        (info.length, info.durable, info.committed),
        (0, 10, Some(0))
    );
    assert!(store.read(SEG, 0, 100, 1 << 20).unwrap().is_empty());
    // The primary still ships what is durable but not committed.
    assert_eq!(store.read_frames(SEG, 0, 1 << 20).unwrap().records, 10);
    assert_eq!(store.set_committed(SEG, 6).unwrap(), 6);
    assert_eq!(store.read(SEG, 0, 100, 1 << 20).unwrap().len(), 6);
    // The committed end never goes down.
    assert_eq!(store.set_committed(SEG, 3).unwrap(), 6);
    // A follower may learn a committed end beyond its own durable end.
    assert_eq!(store.set_committed(SEG, 25).unwrap(), 25);
    assert_eq!(store.info(SEG).unwrap().length, 10);
}

#[test]
fn a_primarys_frames_carry_the_committed_end_as_durable_below() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    store.set_committed(SEG, 0).unwrap();
    append_batches(&store, &[(0..5).map(record).collect()]);
    // Durable locally but committed only up to 2 when the next flush is taken.
    store.set_committed(SEG, 2).unwrap();
    append_batches(&store, &[(5..8).map(record).collect()]);
    let run = store.read_frames(SEG, 0, 1 << 20).unwrap();
    let mut at = 0;
    let mut durable_below = Vec::new();
    while at < run.bytes.len() {
        let (view, len) = frame::decode(&run.bytes[at..]).unwrap();
        durable_below.push(view.durable_below);
        at += len;
    }
    assert_eq!(durable_below, [0, 0, 0, 0, 0, 2, 2, 2]);
}

#[test]
fn an_unreplicated_copy_keeps_todays_durable_below_and_readers() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    append_batches(
        &store,
        &[(0..5).map(record).collect(), (5..8).map(record).collect()],
    );
    let info = store.info(SEG).unwrap();
    assert_eq!((info.length, info.durable, info.committed), (8, 8, None));
    let run = store.read_frames(SEG, 5, 1 << 20).unwrap();
    let (view, _) = frame::decode(&run.bytes).unwrap();
    assert_eq!((view.offset, view.durable_below), (5, 5));
}

#[test]
fn read_frames_cuts_at_whole_frames_and_always_returns_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let records: Vec<Record> = (0..12).map(record).collect();
    append_batches(&store, std::slice::from_ref(&records));
    let one = store.read_frames(SEG, 3, 1).unwrap();
    assert_eq!((one.first, one.records), (3, 1));
    assert_eq!(one.bytes.len() as u64, frame_len(&records[3]));
    let budget = (frame_len(&records[4]) + frame_len(&records[5]) + 3) as usize;
    let two = store.read_frames(SEG, 4, budget).unwrap();
    assert_eq!(two.records, 2);
    assert_eq!(store.read_frames(SEG, 12, 1 << 20).unwrap().records, 0);
    assert!(matches!(
        store.read_frames(SEG, 13, 1 << 20),
        Err(StorageError::OffsetOutOfRange { end: 12, .. })
    ));
}

/// A primary with `n` durable records and a follower opened empty.
fn pair(n: u64) -> (tempfile::TempDir, tempfile::TempDir, FileStore, FileStore) {
    let (pdir, fdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (primary, follower) = (store(pdir.path()), store(fdir.path()));
    primary.open(SEG).unwrap();
    follower.open(SEG).unwrap();
    append_batches(&primary, &[(0..n).map(record).collect()]);
    (pdir, fdir, primary, follower)
}

#[test]
fn a_gap_or_an_overlap_is_refused_and_nothing_is_written() {
    let (_p, _f, primary, follower) = pair(10);
    let head = primary.read_frames(SEG, 0, 1 << 20).unwrap();
    let tail = primary.read_frames(SEG, 4, 1 << 20).unwrap();
    // A gap: the follower is empty, the run starts at 4.
    assert!(matches!(
        follower.append_frames(SEG, 4, &tail.bytes),
        Err(StorageError::NotAtEnd {
            first: 4,
            end: 0,
            ..
        })
    ));
    assert_eq!(follower.info(SEG).unwrap().assigned, 0);
    follower
        .append_frames(SEG, 0, &head.bytes)
        .unwrap()
        .wait()
        .unwrap();
    // An overlap: the follower holds 10, the run starts at 4.
    assert!(matches!(
        follower.append_frames(SEG, 4, &tail.bytes),
        Err(StorageError::NotAtEnd {
            first: 4,
            end: 10,
            ..
        })
    ));
    assert_eq!(follower.info(SEG).unwrap().assigned, 10);
}

#[test]
fn a_run_whose_frames_claim_other_offsets_is_refused() {
    let (_p, _f, primary, follower) = pair(10);
    let tail = primary.read_frames(SEG, 4, 1 << 20).unwrap();
    follower
        .append_frames(SEG, 0, &primary.read_frames(SEG, 0, 1).unwrap().bytes)
        .unwrap()
        .wait()
        .unwrap();
    follower
        .append_frames(SEG, 1, &primary.read_frames(SEG, 1, 1).unwrap().bytes)
        .unwrap()
        .wait()
        .unwrap();
    follower
        .append_frames(SEG, 2, &primary.read_frames(SEG, 2, 1).unwrap().bytes)
        .unwrap()
        .wait()
        .unwrap();
    follower
        .append_frames(SEG, 3, &primary.read_frames(SEG, 3, 1).unwrap().bytes)
        .unwrap()
        .wait()
        .unwrap();
    // Frames 4.. presented as if they started at 4: fine. Presented at 4 but
    // beginning with frame 5: refused at its first frame.
    let from_five = primary.read_frames(SEG, 5, 1 << 20).unwrap();
    match follower.append_frames(SEG, 4, &from_five.bytes) {
        Err(StorageError::BadFrames {
            at_byte: 0,
            offset: 4,
            reason:
                FrameError::OffsetMismatch {
                    found: 5,
                    expected: 4,
                },
            ..
        }) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    follower
        .append_frames(SEG, 4, &tail.bytes)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(read_all(&follower, SEG).len(), 10);
}

#[test]
fn a_fenced_or_sealed_copy_refuses_replica_appends() {
    let (_p, _f, primary, follower) = pair(3);
    let run = primary.read_frames(SEG, 0, 1 << 20).unwrap();
    follower.fence(SEG).unwrap();
    assert!(matches!(
        follower.append_frames(SEG, 0, &run.bytes),
        Err(StorageError::Fenced { .. })
    ));
    let (_p2, _f2, primary, follower) = pair(3);
    let run = primary.read_frames(SEG, 0, 1 << 20).unwrap();
    follower.seal(SEG, 0).unwrap();
    assert!(matches!(
        follower.append_frames(SEG, 0, &run.bytes),
        Err(StorageError::Sealed { .. })
    ));
    let unknown = SegmentId(99);
    assert!(matches!(
        follower.append_frames(unknown, 0, &run.bytes),
        Err(StorageError::NotOpen { .. })
    ));
}

#[test]
fn a_replicated_copy_reopens_with_the_frames_it_was_sent() {
    let (pdir, fdir, primary, follower) = pair(20);
    primary.set_committed(SEG, 20).unwrap();
    let run = primary.read_frames(SEG, 0, 1 << 20).unwrap();
    follower
        .append_frames(SEG, 0, &run.bytes)
        .unwrap()
        .wait()
        .unwrap();
    drop(follower);
    let follower = store(fdir.path());
    let recovery = follower.open(SEG).unwrap();
    assert_eq!((recovery.info.length, recovery.truncated_bytes), (20, 0));
    drop((primary, follower));
    assert_eq!(log_bytes(pdir.path(), SEG), log_bytes(fdir.path(), SEG));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any byte changed anywhere in a shipped run is refused, and the
    /// follower holds nothing of it.
    #[test]
    fn a_run_with_any_byte_changed_is_refused_whole(
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let (_p, _f, primary, follower) = pair(6);
        let mut run = primary.read_frames(SEG, 0, 1 << 20).unwrap();
        let i = at.index(run.bytes.len());
        run.bytes[i] ^= xor;
        match follower.append_frames(SEG, 0, &run.bytes) {
            Err(StorageError::BadFrames { .. }) => {}
            other => prop_assert!(false, "a changed byte was accepted: {other:?}"),
        }
        prop_assert_eq!(follower.info(SEG).unwrap().assigned, 0);
    }

    /// Arbitrary bytes never panic the follower and are refused.
    #[test]
    fn arbitrary_bytes_are_refused_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 1..1024),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        store.open(SEG).unwrap();
        prop_assert!(store.append_frames(SEG, 0, &bytes).is_err());
        prop_assert_eq!(store.info(SEG).unwrap().assigned, 0);
    }
}

/// A follower copy left short of its seal (it missed the last records the
/// quorum acknowledged, then the segment was sealed) is fenced, refuses new
/// appends, and takes the primary's frames up to the seal through
/// `repair_frames`, then seals byte-identical to the primary.
#[test]
fn a_fenced_short_copy_is_repaired_up_to_its_seal_and_no_further() {
    let (pdir, fdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (primary, follower) = (store(pdir.path()), store(fdir.path()));
    primary.open(SEG).unwrap();
    follower.open(SEG).unwrap();
    primary.set_committed(SEG, 0).unwrap();
    follower.set_committed(SEG, 0).unwrap();
    let records: Vec<Record> = (0..30).map(record).collect();
    append_batches(&primary, &[records[..20].to_vec(), records[20..].to_vec()]);
    // The follower got the first twenty, then was fenced (a seal it could
    // not make: it is short).
    let run = primary.read_frames(SEG, 0, 1 << 20).unwrap();
    let first_twenty = {
        let mut at = 0;
        for _ in 0..20 {
            at += frame::decode(&run.bytes[at..]).unwrap().1;
        }
        run.bytes[..at].to_vec()
    };
    follower
        .append_frames(SEG, 0, &first_twenty)
        .unwrap()
        .wait()
        .unwrap();
    assert!(matches!(
        follower.seal(SEG, 30),
        Err(StorageError::SealBeyondEnd { stored: 20, .. })
    ));
    assert!(follower.info(SEG).unwrap().fenced);
    let rest = primary.read_frames(SEG, 20, 1 << 20).unwrap();
    assert!(matches!(
        follower.append_frames(SEG, 20, &rest.bytes),
        Err(StorageError::Fenced { .. })
    ));
    // Repair refuses to go past the seal, writing nothing.
    assert!(matches!(
        follower.repair_frames(SEG, 20, &rest.bytes, 25),
        Err(StorageError::PastSeal {
            end: 30,
            seal: 25,
            ..
        })
    ));
    assert_eq!(follower.info(SEG).unwrap().assigned, 20);
    // Up to the seal it is taken, and the copy then seals.
    let ticket = follower.repair_frames(SEG, 20, &rest.bytes, 30).unwrap();
    assert_eq!(ticket.wait().unwrap(), 20..30);
    follower.seal(SEG, 30).unwrap();
    // A sealed copy is whole: repair refuses it.
    assert!(matches!(
        follower.repair_frames(SEG, 30, &[], 30),
        Err(StorageError::Sealed { .. })
    ));
    primary.seal(SEG, 30).unwrap();
    drop((primary, follower));
    assert_eq!(log_bytes(pdir.path(), SEG), log_bytes(fdir.path(), SEG));
}
