//! Opening a copy: what recovery finds in its files and what it cuts,
//! quarantines or rebuilds before the copy takes an append.

use super::*;

/// A copy's files, opened for recovery (the log and index created empty
/// when missing).
struct CopyFiles {
    log_path: PathBuf,
    idx_path: PathBuf,
    log: File,
    idx: File,
    /// The log did not exist before this open.
    log_missing: bool,
    /// The log's length as found.
    file_len: u64,
}

impl CopyFiles {
    fn log_err(&self, op: &'static str) -> impl FnOnce(io::Error) -> StorageError + use<> {
        let path = self.log_path.clone();
        move |e| StorageError::io(op, path, e)
    }

    fn write_index(&self, index: &SparseIndex) -> Result<(), StorageError> {
        index
            .write_all(&self.idx)
            .map_err(|e| StorageError::io("write index", &self.idx_path, e))
    }

    fn load_index(&self, interval: u64, limit: u64) -> Result<Option<SparseIndex>, StorageError> {
        SparseIndex::load(&self.idx_path, interval, limit)
            .map_err(|e| StorageError::io("read index", &self.idx_path, e))
    }
}

/// What recovery found in a copy's files, and what it did to them.
struct Found {
    records: u64,
    bytes: u64,
    index: SparseIndex,
    notes: Notes,
}

/// What recovery reports beside the copy's end.
#[derive(Default)]
struct Notes {
    /// Bytes of a torn tail cut from the log.
    truncated_bytes: u64,
    index_rebuilt: bool,
    short_of_seal: bool,
    /// Records the copy should hold and cannot give, and why (ADR 0108).
    lost: Option<(Loss, String)>,
    /// Why the copy takes no more appends: damage found in quarantine.
    failed: Option<String>,
}

impl FileStore {
    /// Opens a copy: reads its markers, recovers its end from its files
    /// (trusting a seal the log reaches, scanning otherwise) and builds
    /// its in-memory state. With `quarantine`, damage in the middle of the
    /// log is recorded as a loss instead of refusing the open.
    pub(super) fn open_segment(
        &self,
        id: SegmentId,
        quarantine: bool,
    ) -> Result<(Segment, Recovery), StorageError> {
        let files = self.open_copy_files(id)?;
        let sealed = marker::read_seal(&self.seal_path(id))?;
        let order = marker::read_fence(&self.fence_path(id))?;
        let fenced = sealed.is_some() || order.is_some();
        let found = match sealed {
            // A sealed copy is immutable: trust its marker and open without
            // a scan. Damage at rest is the scrubber's to find (verify).
            Some(seal) if files.file_len >= seal.byte_size => self.recover_sealed(&files, seal)?,
            _ => self.recover_by_scan(id, &files, sealed, quarantine)?,
        };
        let log_missing = files.log_missing;
        let truncated_bytes = found.notes.truncated_bytes;
        let index_rebuilt = found.notes.index_rebuilt;
        let short_of_seal = found.notes.short_of_seal;
        let segment =
            self.segment_of(id, files, found, sealed, fenced, order.unwrap_or_default())?;
        let info = FileStore::info_of(&segment);
        debug!(
            segment = id.0,
            records = info.length,
            bytes = info.byte_size,
            truncated_bytes,
            "segment opened"
        );
        let recovery = Recovery {
            info,
            truncated_bytes,
            index_rebuilt,
            short_of_seal,
            log_missing,
        };
        Ok((segment, recovery))
    }

    /// Opens (creating when missing) a copy's log and index, with the
    /// store directory synced so a new log's entry is durable before any
    /// append to it is acknowledged.
    fn open_copy_files(&self, id: SegmentId) -> Result<CopyFiles, StorageError> {
        let log_path = self.log_path(id);
        let idx_path = self.index_path(id);
        let log_missing = !log_path
            .try_exists()
            .map_err(|e| StorageError::io("stat log", &log_path, e))?;
        let open = |path: &Path, op: &'static str| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| StorageError::io(op, path, e))
        };
        let log = open(&log_path, "open log")?;
        File::open(&self.shared.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StorageError::io("sync store directory", &self.shared.dir, e))?;
        let idx = open(&idx_path, "open index")?;
        let file_len = log
            .metadata()
            .map_err(|e| StorageError::io("stat log", &log_path, e))?
            .len();
        Ok(CopyFiles {
            log_path,
            idx_path,
            log,
            idx,
            log_missing,
            file_len,
        })
    }

    /// A sealed copy whose log reaches its seal: its end is the seal's; the
    /// index is rebuilt by a scan of the sealed bytes only when missing.
    fn recover_sealed(&self, files: &CopyFiles, seal: SealInfo) -> Result<Found, StorageError> {
        let cfg = &self.shared.config;
        let mut notes = Notes::default();
        let loaded = files.load_index(cfg.index_interval_bytes, seal.byte_size)?;
        let index = match loaded {
            Some(index) if !index.entries().is_empty() || seal.byte_size == 0 => index,
            _ => {
                let report = scan::scan_log(
                    &files.log,
                    seal.byte_size,
                    cfg.index_interval_bytes,
                    cfg.read_chunk_bytes,
                )
                .map_err(files.log_err("scan log"))?;
                files.write_index(&report.index)?;
                notes.index_rebuilt = true;
                report.index
            }
        };
        Ok(Found {
            records: seal.length,
            bytes: seal.byte_size,
            index,
            notes,
        })
    }

    /// A copy without a seal its log reaches: its end is what a scan finds
    /// valid. Damage in the middle refuses the open (or, in quarantine, is
    /// recorded as a loss and cuts nothing); a sealed copy short of its
    /// seal is never cut; an unsealed copy's torn tail is cut.
    fn recover_by_scan(
        &self,
        id: SegmentId,
        files: &CopyFiles,
        sealed: Option<SealInfo>,
        quarantine: bool,
    ) -> Result<Found, StorageError> {
        let cfg = &self.shared.config;
        let report = scan::scan_log(
            &files.log,
            files.file_len,
            cfg.index_interval_bytes,
            cfg.read_chunk_bytes,
        )
        .map_err(files.log_err("scan log"))?;
        // A scan reads no further than the file: a valid prefix past its
        // end would be a scan bug, and cutting to it would grow the log.
        assert!(
            report.valid_bytes <= files.file_len,
            "segment {}: scan claims {} valid bytes of a {}-byte log",
            id.0,
            report.valid_bytes,
            files.file_len
        );
        let mut notes = Notes::default();
        if let (Some(bad), Some(later)) = (report.first_bad, report.later_flush) {
            let (loss, reason) =
                self.damage(id, files, &report, (bad, later), sealed, quarantine)?;
            notes.failed = Some(reason.clone());
            notes.lost = Some((loss, reason));
        } else if let Some(seal) = sealed {
            // Never truncate a sealed copy: a partially readable copy
            // beats a shorter one, and repair comes from a replica.
            warn!(
                segment = id.0,
                records = report.records,
                sealed = seal.length,
                "sealed copy shorter than its seal"
            );
            notes.short_of_seal = true;
            notes.lost = short_of_seal_loss(&report, seal, files.log_missing);
        } else if let Some(bad) = report.first_bad {
            notes.truncated_bytes = cut_torn_tail(id, files, &report, bad)?;
        }
        // A quarantined copy's files are left as they were found.
        let loaded = files.load_index(cfg.index_interval_bytes, u64::MAX)?;
        if notes.failed.is_none() && loaded.as_ref() != Some(&report.index) {
            files.write_index(&report.index)?;
            notes.index_rebuilt = loaded.is_some_and(|l| !l.entries().is_empty())
                || !report.index.entries().is_empty();
        }
        Ok(Found {
            records: report.records,
            bytes: report.valid_bytes,
            index: report.index,
            notes,
        })
    }

    /// Damage in the middle of a log (a bad frame with a later flush after
    /// it): refuses the open, or in quarantine returns the records the copy
    /// can no longer give, from the bad frame to the last valid one after
    /// it, and why. Nothing is cut or rewritten.
    fn damage(
        &self,
        id: SegmentId,
        files: &CopyFiles,
        report: &scan::ScanReport,
        (bad, later): (scan::BadFrame, scan::LaterFrame),
        sealed: Option<SealInfo>,
        quarantine: bool,
    ) -> Result<(Loss, String), StorageError> {
        error!(segment = id.0, position = bad.position, offset = bad.offset, later_position = later.position, reason = %bad.error, quarantine, "segment damaged in the middle; left untouched");
        if !quarantine {
            return Err(StorageError::Damaged {
                segment: id,
                position: bad.position,
                offset: bad.offset,
                reason: bad.error,
                later_position: later.position,
            });
        }
        let last = scan::last_offset_from(
            &files.log,
            later.position,
            files.file_len,
            self.shared.config.read_chunk_bytes,
        )
        .map_err(files.log_err("scan past the damage"))?;
        let to = quarantine_end(bad.offset, later, last, sealed);
        let reason = format!(
            "the copy is damaged at byte {} (offset {}): {}",
            bad.position, bad.offset, bad.error
        );
        let loss = Loss {
            from: report.records,
            to,
        };
        Ok((loss, reason))
    }

    /// The in-memory copy over its recovered files: its writers (one per
    /// pipeline slot), the partial last block a direct write rewrites, and
    /// its state at the recovered end.
    fn segment_of(
        &self,
        id: SegmentId,
        files: CopyFiles,
        found: Found,
        sealed: Option<SealInfo>,
        fenced: bool,
        order: OrderEpoch,
    ) -> Result<Segment, StorageError> {
        let (records, bytes) = (found.records, found.bytes);
        let persisted = found.index.entries().len();
        let (writers, direct) = open_writers(&files.log_path, &self.shared.config)?;
        let tail_block = if direct {
            let base = align_down(bytes);
            let mut tail = vec![0u8; (bytes - base) as usize];
            files
                .log
                .read_exact_at(&mut tail, base)
                .map_err(files.log_err("read the last block"))?;
            tail
        } else {
            Vec::new()
        };
        let state = SegState {
            next_offset: records,
            durable_offset: records,
            durable_bytes: bytes,
            pending: Vec::new(),
            pending_bytes: 0,
            pending_records: 0,
            pending_first_offset: records,
            pending_since: None,
            pending_waiters: Vec::new(),
            written_bytes: bytes,
            tail_block,
            writing: false,
            slots_busy: 0,
            inflight: VecDeque::new(),
            flush_seq: 0,
            failed_from_seq: None,
            ready_queued: false,
            timer_armed: false,
            force_flush: false,
            fenced,
            order,
            sealed,
            failed: found.notes.failed,
            lost: found.notes.lost,
            committed: sealed.map(|seal| seal.length),
            opened_end: records,
            recent: recent::RecentFrames::new(
                Arc::clone(&self.shared.recent_bytes),
                self.shared.config.recent_bytes_max,
            ),
        };
        Ok(Segment {
            id,
            log_path: files.log_path,
            log: files.log,
            writers,
            direct,
            idx: files.idx,
            state: Mutex::new(state),
            idle: Condvar::new(),
            index: Mutex::new(IndexState {
                index: found.index,
                persisted,
            }),
            ordering: Mutex::new(()),
        })
    }
}

/// The loss of a sealed copy whose log holds fewer records than its seal.
fn short_of_seal_loss(
    report: &scan::ScanReport,
    seal: SealInfo,
    log_missing: bool,
) -> Option<(Loss, String)> {
    if report.records >= seal.length {
        return None;
    }
    let loss = Loss {
        from: report.records,
        to: seal.length,
    };
    let reason = if log_missing {
        "the copy's log is missing".to_string()
    } else {
        format!(
            "the copy holds {} of the {} records of its seal",
            report.records, seal.length
        )
    };
    Some((loss, reason))
}

/// Cuts an unsealed log back to its valid prefix: a direct write's zero
/// padding silently, a torn last flush with a warning. Returns the torn
/// bytes cut (0 for padding).
fn cut_torn_tail(
    id: SegmentId,
    files: &CopyFiles,
    report: &scan::ScanReport,
    bad: scan::BadFrame,
) -> Result<u64, StorageError> {
    let mut truncated_bytes = 0;
    if padding_after(&files.log, report.valid_bytes, files.file_len)
        .map_err(files.log_err("read the log's tail"))?
    {
        debug!(
            segment = id.0,
            padding_bytes = files.file_len - report.valid_bytes,
            "dropping a direct write's padding"
        );
    } else {
        truncated_bytes = files.file_len - report.valid_bytes;
        warn!(segment = id.0, position = bad.position, truncated_bytes, reason = %bad.error, "truncating torn tail");
    }
    files
        .log
        .set_len(report.valid_bytes)
        .map_err(files.log_err("truncate log"))?;
    files.log.sync_data().map_err(files.log_err("sync log"))?;
    Ok(truncated_bytes)
}

/// Where a quarantined copy's loss ends: past the last valid frame found
/// after the damage, past the `durable_below` it carries (records below it
/// were acknowledged), and at the seal if the copy has one.
pub(super) fn quarantine_end(
    bad_offset: u64,
    later: scan::LaterFrame,
    last_offset: Option<u64>,
    sealed: Option<SealInfo>,
) -> u64 {
    let seen = last_offset
        .map_or(later.offset, |last| last.max(later.offset))
        .saturating_add(1)
        .max(later.durable_below)
        .max(bad_offset.saturating_add(1));
    sealed.map_or(seen, |seal| seal.length.max(seen))
}

/// Whether the bytes from `valid_bytes` to `file_len` are a direct write's
/// zero padding (see [`direct`]) rather than a torn or damaged tail.
pub(super) fn padding_after(log: &File, valid_bytes: u64, file_len: u64) -> io::Result<bool> {
    let len = file_len.saturating_sub(valid_bytes);
    if len >= BLOCK_BYTES as u64 {
        return Ok(false);
    }
    let mut tail = vec![0u8; len as usize];
    log.read_exact_at(&mut tail, valid_bytes)?;
    Ok(direct::is_padding(&tail, file_len))
}

/// Cuts a direct write's zero padding off the end of the log, so that a
/// file at rest (sealed, closed, or after shutdown) is exactly its frames
/// and a scan of it from outside the store meets no padding.
///
/// Only when nothing is written or pending: the state lock is held across
/// the truncation so no flush can start and write past the cut. When a
/// flush is busy the padding stays; recovery drops it.
pub(super) fn trim_padding(seg: &Segment) -> Result<(), StorageError> {
    if !seg.direct {
        return Ok(());
    }
    let st = seg.state.lock();
    // A failed copy may hold a partial write past its end: that is
    // recovery's to judge, and its descriptor may still report the error.
    if st.writing || st.slots_busy != 0 || st.pending_records != 0 || st.failed.is_some() {
        return Ok(());
    }
    let io = |op: &'static str| move |e| StorageError::io(op, &seg.log_path, e);
    let len = seg.log.metadata().map_err(io("stat log"))?.len();
    // Only padding (under a block past the end) is ours to cut.
    if len > st.written_bytes && len - st.written_bytes < BLOCK_BYTES as u64 {
        seg.log
            .set_len(st.written_bytes)
            .map_err(io("trim the log's padding"))?;
        seg.log.sync_data().map_err(io("sync log"))?;
    }
    drop(st);
    Ok(())
}
