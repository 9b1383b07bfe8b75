#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A failed write latches the segment as failed (seal on failure).

mod common;

use common::*;
use malachi_storage::{SealPolicy, SealReason, SegmentStore, StorageError};

/// `/dev/full` accepts an open for writing and fails every write with ENOSPC,
/// which stands in for a full or failing volume without a fault-injection seam.
#[cfg(target_os = "linux")]
#[test]
fn a_failed_write_fails_its_waiters_and_latches_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        "/dev/full",
        dir.path().join(format!("{}.log", SEG.file_stem())),
    )
    .unwrap();
    let store = store(dir.path());
    store.open(SEG).unwrap();
    let ticket = store.append(SEG, &[record(0)]).unwrap();
    let error = ticket.wait().unwrap_err();
    assert!(matches!(error, StorageError::Io { .. }));
    // A full volume is told apart from other failures (ADR 0111).
    assert!(error.is_no_space(), "{error}");
    let info = store.info(SEG).unwrap();
    assert!(info.failed);
    assert_eq!(info.length, 0, "a failed flush published a durable length");
    match store.append(SEG, &[record(1)]) {
        Err(e @ StorageError::Failed { .. }) => assert!(e.is_no_space(), "{e}"),
        other => panic!("expected the latched failure, got {other:?}"),
    }
    assert_eq!(
        SealPolicy::default().decide(&info, 0, 0),
        Some(SealReason::Failure)
    );
}
