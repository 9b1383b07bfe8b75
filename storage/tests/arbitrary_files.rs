#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Opening, verifying and reading logs made of arbitrary or mutated bytes.

mod common;

use std::fs;

use common::*;
use malachi_storage::{Record, SegmentStore, StorageError};
use proptest::prelude::*;

fn log_path(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join(format!("{}.log", SEG.file_stem()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_log_of_arbitrary_bytes_opens_or_is_refused_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(log_path(dir.path()), &bytes).unwrap();
        let store = store(dir.path());
        let _ = store.verify(SEG).unwrap();
        match store.open(SEG) {
            Ok(recovery) => {
                // Whatever survived reads back without error.
                let all = read_all(&store, SEG);
                prop_assert_eq!(all.len() as u64, recovery.info.length);
            }
            Err(StorageError::Damaged { .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
        }
    }

    #[test]
    fn a_mutated_log_never_yields_a_wrong_record(
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let written: Vec<Record> = (0..30).map(record).collect();
        {
            let store = store(dir.path());
            store.open(SEG).unwrap();
            append_batches(&store, &[written[..10].to_vec(), written[10..20].to_vec(), written[20..].to_vec()]);
        }
        let mut bytes = fs::read(log_path(dir.path())).unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        fs::write(log_path(dir.path()), &bytes).unwrap();
        let store = store(dir.path());
        let report = store.verify(SEG).unwrap();
        prop_assert!(report.first_bad.is_some(), "a changed byte went unnoticed by verify");
        if let Ok(recovery) = store.open(SEG) {
            // Only a torn-looking last flush may be dropped; what remains is exact.
            prop_assert!(recovery.info.length >= 20);
            for r in read_all(&store, SEG) {
                prop_assert_eq!(&r.record, &written[r.offset as usize]);
            }
        }
    }
}
