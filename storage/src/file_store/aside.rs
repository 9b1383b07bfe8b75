//! Copies set aside for a rebuild (ADR 0110) and index repairs.

use super::*;

impl FileStore {
    /// Where copies set aside for a rebuild keep their files (ADR 0110).
    pub fn aside_dir(&self) -> PathBuf {
        self.shared.dir.join("aside")
    }

    /// Sets a broken copy aside so it can be rebuilt from another copy
    /// (ADR 0110): closes it if open and moves its log, index and seal
    /// marker into [`aside_dir`](Self::aside_dir), durably, so that the
    /// next `open` starts an empty copy. The fence marker stays: the
    /// newest order epoch the copy took is never forgotten.
    ///
    /// The first copy set aside is kept (the broken bytes, for forensics,
    /// until [`discard_aside`](Self::discard_aside)): a later set-aside of
    /// the same segment, a rebuild that did not finish, is deleted instead.
    /// Returns whether anything was moved.
    pub fn set_aside(&self, segment: SegmentId) -> Result<bool, StorageError> {
        match self.close(segment) {
            Ok(()) | Err(StorageError::NotOpen { .. }) => {}
            Err(e) => return Err(e),
        }
        let aside = self.aside_dir();
        std::fs::create_dir_all(&aside)
            .map_err(|e| StorageError::io("create the aside directory", &aside, e))?;
        let kept = self.aside_files(segment).next().is_some();
        let mut moved = false;
        for from in [
            self.log_path(segment),
            self.index_path(segment),
            self.seal_path(segment),
        ] {
            let exists = from
                .try_exists()
                .map_err(|e| StorageError::io("stat", &from, e))?;
            if !exists {
                continue;
            }
            if kept {
                std::fs::remove_file(&from)
                    .map_err(|e| StorageError::io("remove a partial rebuild", &from, e))?;
            } else {
                let name = from.file_name().map(PathBuf::from).unwrap_or_default();
                let to = aside.join(name);
                std::fs::rename(&from, &to)
                    .map_err(|e| StorageError::io("set a copy aside", &from, e))?;
                moved = true;
            }
        }
        for dir in [&self.shared.dir, &aside] {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| StorageError::io("sync store directory", dir, e))?;
        }
        Ok(moved)
    }

    /// The files of `segment`'s copy set aside, if any.
    pub(super) fn aside_files(&self, segment: SegmentId) -> impl Iterator<Item = PathBuf> + use<> {
        let aside = self.aside_dir();
        ["log", "idx", "seal"]
            .map(|ext| aside.join(format!("{}.{ext}", segment.file_stem())))
            .into_iter()
            .filter(|p| p.exists())
    }

    /// Whether a copy of `segment` is set aside.
    pub fn is_aside(&self, segment: SegmentId) -> bool {
        self.aside_files(segment).next().is_some()
    }

    /// Deletes the copy of `segment` set aside, once its rebuild is whole.
    /// Returns the bytes freed.
    pub fn discard_aside(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let mut freed = 0;
        for path in self.aside_files(segment) {
            freed += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&path)
                .map_err(|e| StorageError::io("discard a copy set aside", &path, e))?;
        }
        Ok(freed)
    }

    /// The segments with a copy set aside, by id.
    pub fn aside_segments(&self) -> Vec<SegmentId> {
        let Ok(entries) = std::fs::read_dir(self.aside_dir()) else {
            return Vec::new();
        };
        let mut out: Vec<SegmentId> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name();
                let stem = name.to_str()?.split('.').next()?.to_string();
                stem.parse::<u64>().ok().map(SegmentId)
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Rewrites `segment`'s sidecar index from its log: the scrubber's
    /// repair of an index that disagrees with the log or is gone (issue
    /// 21). An open copy's is rebuilt in place ([`rebuild_index`](Self::rebuild_index));
    /// a closed copy's log is scanned read-only and the index written to a
    /// temporary file, synced and renamed over the sidecar, so a crash
    /// leaves the old index or the new one, never half of one. The index is
    /// derived data: the log is never touched.
    pub fn repair_index(&self, segment: SegmentId) -> Result<(), StorageError> {
        match self.rebuild_index(segment) {
            Err(StorageError::NotOpen { .. }) => {}
            other => return other,
        }
        let cfg = &self.shared.config;
        let log_path = self.log_path(segment);
        let log = File::open(&log_path).map_err(|e| StorageError::io("open log", &log_path, e))?;
        let end = log
            .metadata()
            .map_err(|e| StorageError::io("stat log", &log_path, e))?
            .len();
        let report = scan::scan_log(&log, end, cfg.index_interval_bytes, cfg.read_chunk_bytes)
            .map_err(|e| StorageError::io("scan log", &log_path, e))?;
        let idx_path = self.index_path(segment);
        let tmp = idx_path.with_extension("idx.tmp");
        let written = File::create(&tmp).and_then(|f| {
            report.index.write_all(&f)?;
            f.sync_all()
        });
        written.map_err(|e| StorageError::io("write index", &tmp, e))?;
        std::fs::rename(&tmp, &idx_path)
            .map_err(|e| StorageError::io("replace index", &idx_path, e))?;
        File::open(&self.shared.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StorageError::io("sync store directory", &self.shared.dir, e))
    }

    /// Rebuilds the sidecar index of an open segment from its log.
    pub fn rebuild_index(&self, segment: SegmentId) -> Result<(), StorageError> {
        let seg = self.segment(segment)?;
        let end = seg.state.lock().durable_bytes;
        let cfg = &self.shared.config;
        let report = scan::scan_log(
            &seg.log,
            end,
            cfg.index_interval_bytes,
            cfg.read_chunk_bytes,
        )
        .map_err(|e| StorageError::io("scan log", &seg.log_path, e))?;
        let mut idx = seg.index.lock();
        // Only the flusher appends entries, and it holds this lock to do so.
        let mut rebuilt = report.index;
        for entry in idx.index.entries().iter().filter(|e| e.position >= end) {
            rebuilt.observe(entry.offset, entry.position);
        }
        rebuilt
            .write_all(&seg.idx)
            .map_err(|e| StorageError::io("write index", self.index_path(segment), e))?;
        idx.persisted = rebuilt.entries().len();
        idx.index = rebuilt;
        Ok(())
    }
}
