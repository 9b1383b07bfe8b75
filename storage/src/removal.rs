//! Removing a copy's files for good (issue 21, ADR 0115), crash-safely.
//!
//! A copy is removed only once the metadata no longer lists its segment
//! (a deleted topic, a segment retention dropped, an orphan). The broker
//! decides that; this module only makes the removal whole across a crash:
//! it first writes a `<stem>.drop` marker and syncs the directory, then
//! removes the copy's files (log, index, seal, fence, producer sidecar and
//! any copy set aside), syncs the directory again, and removes the marker
//! last. `FileStore::open_dir` finishes every removal a marker names, so a
//! broker killed mid-removal finishes it when it starts again, before any
//! copy opens.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::StorageError;
use crate::file_store::FileStore;
use crate::store::{SegmentId, SegmentStore};

/// The extensions of a copy's own files in the store directory.
const COPY_EXTENSIONS: [&str; 5] = ["log", "idx", "seal", "fence", "producers"];
/// The extension of a removal's intent marker.
const DROP_EXTENSION: &str = "drop";

impl FileStore {
    /// Path of the marker that a removal of `segment`'s copy is under way.
    pub fn drop_path(&self, segment: SegmentId) -> PathBuf {
        self.dir()
            .join(format!("{}.{DROP_EXTENSION}", segment.file_stem()))
    }

    /// Removes every file of `segment`'s copy, crash-safely (see the module
    /// doc). Closes the copy first if it is open. Returns the bytes freed,
    /// or `None` for a copy that has no files (not an error). Removals run
    /// one at a time: of two removals of a copy at once, one removes it.
    pub fn remove_copy(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        let _one_at_a_time = self.removals_lock();
        match self.close(segment) {
            Ok(()) | Err(StorageError::NotOpen { .. }) => {}
            Err(e) => return Err(e),
        }
        let files = self.copy_files(segment);
        if files.is_empty() && !self.drop_path(segment).exists() {
            return Ok(None);
        }
        let marker = self.drop_path(segment);
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&marker)
            .and_then(|f| f.sync_all())
            .map_err(|e| StorageError::io("write a removal marker", &marker, e))?;
        sync_dir(self.dir())?;
        self.finish_removal(segment).map(Some)
    }

    /// Removes the files of `segment`'s copy under an existing marker, then
    /// the marker.
    fn finish_removal(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let mut freed = 0;
        let aside = self.aside_dir();
        let mut aside_touched = false;
        for path in self.copy_files(segment) {
            freed += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove a copy's file", &path, e)),
            }
            aside_touched |= path.starts_with(&aside);
        }
        sync_dir(self.dir())?;
        if aside_touched {
            sync_dir(&aside)?;
        }
        let marker = self.drop_path(segment);
        match std::fs::remove_file(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io("remove a removal marker", &marker, e)),
        }
        sync_dir(self.dir())?;
        Ok(freed)
    }

    /// Finishes every removal a marker names (a broker stopped mid-way).
    /// Returns the segments whose removal it finished. Called by
    /// `open_dir` before any copy opens.
    pub(crate) fn finish_removals(&self) -> Result<Vec<SegmentId>, StorageError> {
        let pending = self.stems_with(|ext| ext == DROP_EXTENSION)?;
        for &segment in &pending {
            let freed = self.finish_removal(segment)?;
            tracing::info!(
                segment = segment.0,
                freed_bytes = freed,
                "finished a removal a restart interrupted"
            );
        }
        Ok(pending)
    }

    /// Deletes the temporary files of writes a crash cut short (a marker's
    /// `<id>.<ext>.<n>.tmp`, an index's `<id>.idx.tmp`): before any copy
    /// opens, no write runs, so every one of them is a leftover. Only a
    /// store's own names (`<20 digits>.….tmp`) are touched. Returns how
    /// many it deleted.
    pub(crate) fn sweep_temporary_files(&self) -> Result<usize, StorageError> {
        let dir = self.dir();
        let entries =
            std::fs::read_dir(dir).map_err(|e| StorageError::io("list the store", dir, e))?;
        let mut swept = 0;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io("list the store", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let ours = name.split_once('.').is_some_and(|(stem, rest)| {
                stem.len() == 20 && stem.parse::<u64>().is_ok() && rest.ends_with("tmp")
            });
            if !ours {
                continue;
            }
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => swept += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove a temporary file", &path, e)),
            }
        }
        if swept > 0 {
            sync_dir(dir)?;
            tracing::info!(swept, "removed temporary files a crash left");
        }
        Ok(swept)
    }

    /// The segments with any file of a copy in this store (open or not,
    /// sealed or not, set aside or not), in id order. What the orphan
    /// sweeper checks against the metadata.
    pub fn local_copies(&self) -> Result<Vec<SegmentId>, StorageError> {
        let mut out = self.stems_with(|ext| COPY_EXTENSIONS.contains(&ext))?;
        out.extend(self.aside_segments());
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// When any file of `segment`'s copy last changed (the newest
    /// modification time among them); `None` when it has no file or the
    /// filesystem keeps no times.
    pub fn copy_modified(&self, segment: SegmentId) -> Option<std::time::SystemTime> {
        self.copy_files(segment)
            .iter()
            .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .max()
    }

    /// The files of `segment`'s copy that exist, aside copies included.
    fn copy_files(&self, segment: SegmentId) -> Vec<PathBuf> {
        let stem = segment.file_stem();
        let aside = self.aside_dir();
        COPY_EXTENSIONS
            .iter()
            .map(|ext| self.dir().join(format!("{stem}.{ext}")))
            .chain(
                ["log", "idx", "seal"]
                    .iter()
                    .map(|ext| aside.join(format!("{stem}.{ext}"))),
            )
            .filter(|p| p.exists())
            .collect()
    }

    /// The segment ids of the store directory's files whose extension
    /// `wanted` accepts, in id order. Names that are not `<20 digits>.<ext>`
    /// are not a store's and are left alone.
    fn stems_with(&self, wanted: impl Fn(&str) -> bool) -> Result<Vec<SegmentId>, StorageError> {
        let dir = self.dir();
        let entries =
            std::fs::read_dir(dir).map_err(|e| StorageError::io("list the store", dir, e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io("list the store", dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((stem, ext)) = name.split_once('.') else {
                continue;
            };
            if stem.len() != 20 || !wanted(ext) {
                continue;
            }
            if let Ok(id) = stem.parse::<u64>() {
                out.push(SegmentId(id));
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io("sync store directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use crate::store::StoreConfig;

    fn store(dir: &Path) -> FileStore {
        FileStore::open_dir(dir, StoreConfig::default()).unwrap()
    }

    fn write_copy(store: &FileStore, id: SegmentId, records: u64, seal: bool) {
        store.open(id).unwrap();
        for n in 0..records {
            let value = format!("value-{n}");
            store
                .append(id, &[Record::new(0, b"k".to_vec(), value.into_bytes())])
                .unwrap()
                .wait()
                .unwrap();
        }
        if seal {
            store.seal(id, records).unwrap();
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "aside")
            .collect();
        out.sort();
        out
    }

    #[test]
    fn removing_a_copy_removes_every_file_and_frees_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        write_copy(&store, SegmentId(7), 20, true);
        write_copy(&store, SegmentId(8), 3, false);
        std::fs::write(store.producers_path(SegmentId(7)), b"sidecar").unwrap();
        assert_eq!(
            store.local_copies().unwrap(),
            vec![SegmentId(7), SegmentId(8)]
        );

        let freed = store.remove_copy(SegmentId(7)).unwrap();
        assert!(freed > Some(0), "a copy of 20 records frees bytes");
        assert_eq!(store.local_copies().unwrap(), vec![SegmentId(8)]);
        assert!(
            names(dir.path())
                .iter()
                .all(|n| !n.starts_with(&SegmentId(7).file_stem())),
            "{:?}",
            names(dir.path())
        );
        // The other copy still reads.
        assert_eq!(store.info(SegmentId(8)).unwrap().durable, 3);
        // Removing again, or a copy never held, is a no-op.
        assert_eq!(store.remove_copy(SegmentId(7)).unwrap(), None);
        assert_eq!(store.remove_copy(SegmentId(99)).unwrap(), None);
    }

    /// A crash between a marker's temporary write and its rename leaves
    /// the temporary file: the next open deletes it, and only it.
    #[test]
    fn an_open_sweeps_the_temporary_files_a_crash_left() {
        let dir = tempfile::tempdir().unwrap();
        let stem = SegmentId(5).file_stem();
        {
            let store = store(dir.path());
            write_copy(&store, SegmentId(5), 3, true);
        }
        let leftovers = [format!("{stem}.seal.7.tmp"), format!("{stem}.idx.tmp")];
        for name in &leftovers {
            std::fs::write(dir.path().join(name), b"torn").unwrap();
        }
        std::fs::write(dir.path().join("notes.tmp"), b"not the store's").unwrap();
        let store = store(dir.path());
        let left = names(dir.path());
        for name in &leftovers {
            assert!(!left.contains(name), "{name} is still there: {left:?}");
        }
        assert!(left.contains(&"notes.tmp".to_string()), "{left:?}");
        assert_eq!(store.local_copies().unwrap(), vec![SegmentId(5)]);
    }

    /// Regression (`topic_delete`, counted 4 removals of 3 copies): two
    /// removals of one copy at once (a drop order and the orphan sweep)
    /// both removed it and both reported it. Exactly one reports it now.
    #[test]
    fn of_removals_of_one_copy_at_once_exactly_one_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        for round in 0..20u64 {
            let segment = SegmentId(100 + round);
            write_copy(&store, segment, 5, true);
            let removed: Vec<Option<u64>> = std::thread::scope(|scope| {
                let racers: Vec<_> = (0..4)
                    .map(|_| scope.spawn(|| store.remove_copy(segment).unwrap()))
                    .collect();
                racers.into_iter().map(|r| r.join().unwrap()).collect()
            });
            assert_eq!(
                removed.iter().filter(|r| r.is_some()).count(),
                1,
                "round {round}: {removed:?}"
            );
        }
    }

    #[test]
    fn a_copy_set_aside_is_removed_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        write_copy(&store, SegmentId(3), 5, true);
        assert!(store.set_aside(SegmentId(3)).unwrap());
        assert_eq!(store.local_copies().unwrap(), vec![SegmentId(3)]);
        store.remove_copy(SegmentId(3)).unwrap();
        assert!(!store.is_aside(SegmentId(3)));
        assert!(store.local_copies().unwrap().is_empty());
    }

    #[test]
    fn a_removal_cut_short_by_a_crash_finishes_when_the_store_opens() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = store(dir.path());
            write_copy(&store, SegmentId(4), 10, true);
            write_copy(&store, SegmentId(5), 10, true);
            store.close(SegmentId(4)).unwrap();
            // The crash: the marker is durable, one file is gone, the rest
            // are not.
            std::fs::write(store.drop_path(SegmentId(4)), b"").unwrap();
            std::fs::remove_file(store.index_path(SegmentId(4))).unwrap();
        }
        let store = store(dir.path());
        assert_eq!(store.local_copies().unwrap(), vec![SegmentId(5)]);
        assert!(!store.drop_path(SegmentId(4)).exists());
        assert!(!store.log_path(SegmentId(4)).exists());
        assert_eq!(store.open(SegmentId(5)).unwrap().info.durable, 10);
    }

    #[test]
    fn a_bad_index_of_a_closed_or_open_copy_is_repaired_from_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open_dir(
            dir.path(),
            StoreConfig {
                index_interval_bytes: 64,
                ..StoreConfig::default()
            },
        )
        .unwrap();
        write_copy(&store, SegmentId(6), 200, true);
        let before = std::fs::read(store.index_path(SegmentId(6))).unwrap();
        assert!(before.len() > 32, "the copy has a sparse index");
        for open in [false, true] {
            if !open {
                store.close(SegmentId(6)).unwrap();
            } else {
                store.open(SegmentId(6)).unwrap();
            }
            // Flip a byte in the middle of the index.
            let mut bad = before.clone();
            let at = bad.len() / 2;
            bad[at] ^= 0x5a;
            std::fs::write(store.index_path(SegmentId(6)), &bad).unwrap();
            assert!(store.verify(SegmentId(6)).unwrap().index_entries_bad > 0);
            store.repair_index(SegmentId(6)).unwrap();
            assert_eq!(store.verify(SegmentId(6)).unwrap().index_entries_bad, 0);
            assert_eq!(
                std::fs::read(store.index_path(SegmentId(6))).unwrap(),
                before
            );
        }
        // The records still read, from the middle.
        store.open(SegmentId(6)).ok();
        let mut seen = Vec::new();
        store
            .read_with(SegmentId(6), 150, 10, 1 << 20, &mut |view| {
                seen.push(view.offset);
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(seen, (150..160).collect::<Vec<_>>());
        // A missing index is written again.
        store.close(SegmentId(6)).unwrap();
        std::fs::remove_file(store.index_path(SegmentId(6))).unwrap();
        store.repair_index(SegmentId(6)).unwrap();
        assert_eq!(
            std::fs::read(store.index_path(SegmentId(6))).unwrap(),
            before
        );
    }

    #[test]
    fn foreign_names_in_the_store_directory_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        std::fs::write(dir.path().join("12.log"), b"x").unwrap();
        assert!(store.local_copies().unwrap().is_empty());
        std::fs::write(dir.path().join("00000000000000000012.drop"), b"").unwrap();
        drop(store);
        let _store = FileStore::open_dir(dir.path(), StoreConfig::default()).unwrap();
        assert!(dir.path().join("notes.txt").exists());
        assert!(dir.path().join("12.log").exists());
    }
}
