//! The file-backed `SegmentStore` and its group commit.
//!
//! # Life of an append
//! 1. The caller's thread encodes the batch into frames outside any lock,
//!    leaving offsets and CRCs zero.
//! 2. Under the segment's lock the batch gets its offsets (so offset order is
//!    enqueue order) and the encoded batch is queued on the segment, without
//!    copying it; the caller gets an [`AppendTicket`].
//! 3. When a trigger fires (records, bytes, or time; with
//!    `flush_interval_ms == 0`, as soon as the file is not already syncing)
//!    the segment is queued for a sync thread.
//! 4. A sync thread takes every pending batch, fills in offsets,
//!    `durable_below` and CRCs, writes them with one vectored write and
//!    one `fdatasync`, then publishes the new durable end and completes the
//!    tickets. Different files are flushed by different threads in
//!    parallel, because the disk rewards parallel syncs.
//!    With `flush_interval_ms == 0` a caller blocked in `AppendTicket::wait`
//!    on an idle segment runs that flush on its own thread instead.
//!
//! # Pipelined flushes
//! One file may have up to `flush_pipeline_depth` flushes in flight: once a
//! flush's write returns, the next flush may write while the earlier one
//! waits in `fdatasync`, so the page-cache copy of one overlaps the disk
//! time of the other. Writes stay serialized (one writer at a time, in
//! offset order); durability is published strictly in flush order, so a
//! flush whose sync returns early waits for the earlier ones.
//!
//! Each pipeline slot syncs through its own open file description. Linux
//! reports a writeback error once per open file description (errseq), so
//! two concurrent `fdatasync` calls on one descriptor race for the report
//! and the loser returns success for pages that were lost. With one
//! description per slot, and a slot never used by two flushes at once,
//! every `fdatasync` sees every error raised since that slot's previous one.
//!
//! A failed write or sync latches the segment as failed: fsync errors cannot
//! be retried safely, so the copy takes no more appends and must be sealed by
//! the layer above (seal on failure).

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::{debug, error, warn};

use crate::direct::{self, AlignedBuf, BLOCK_BYTES};
use crate::error::StorageError;
use crate::frame::{self, FrameError, FrameView};
use crate::index::{IndexEntry, SparseIndex};
use crate::marker;
use crate::record::RecordBatch;
use crate::scan::{self, FrameReader, Next};
use crate::store::{
    FenceInfo, FrameRun, Loss, OrderEpoch, Recovery, SealInfo, SegmentId, SegmentInfo,
    SegmentStore, StoreConfig, VerifyReport,
};
use crate::ticket::{AppendTicket, Completion};

/// Flush and I/O counters, for the benchmark and for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub flushes: u64,
    pub flushed_bytes: u64,
    pub flushed_records: u64,
    /// Bytes written with `O_DIRECT`: whole blocks, including the rewritten
    /// head of the partial block and the zero padding after it.
    pub direct_bytes: u64,
    /// Flushes whose write began while an earlier flush of the same file
    /// was still in its `fdatasync`: the work pipelining saves.
    pub flushes_overlapped: u64,
}

/// A directory of segment copies with group commit over a pool of sync threads.
#[derive(Debug)]
pub struct FileStore {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    config: StoreConfig,
    segments: Mutex<HashMap<SegmentId, Arc<Segment>>>,
    sched: Mutex<Scheduler>,
    sched_cv: Condvar,
    stats: Mutex<StoreStats>,
    /// Aligned buffers for direct writes, reused so that a flush does not
    /// fault in fresh pages (bounded by `direct::POOLED_BUFFERS_MAX`).
    buffers: Mutex<Vec<AlignedBuf>>,
    /// Called with a flush's sequence number just before its `fdatasync`,
    /// so a test can hold a sync and watch what the pipeline does meanwhile.
    #[cfg(test)]
    sync_hook: Mutex<Option<SyncHook>>,
    /// Held through each copy removal, so two removals of one copy at
    /// once remove (and report) it once.
    removals: Mutex<()>,
}

#[cfg(test)]
#[derive(Clone)]
struct SyncHook(Arc<dyn Fn(SegmentId, u64) + Send + Sync>);

#[cfg(test)]
impl std::fmt::Debug for SyncHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncHook")
    }
}

#[derive(Debug, Default)]
struct Scheduler {
    ready: VecDeque<Arc<Segment>>,
    timers: BinaryHeap<TimerEntry>,
    seq: u64,
    shutdown: bool,
}

#[derive(Debug)]
struct TimerEntry {
    deadline: Instant,
    seq: u64,
    segment: Arc<Segment>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for TimerEntry {
    // Reversed so the BinaryHeap (a max-heap) pops the earliest deadline.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.deadline, other.seq).cmp(&(self.deadline, self.seq))
    }
}

#[derive(Debug)]
struct Segment {
    id: SegmentId,
    log_path: PathBuf,
    /// For reads, scans and recovery.
    log: File,
    /// One open file description per pipeline slot, for writes and syncs
    /// (opened with `O_DIRECT` when `direct` is set).
    writers: Vec<File>,
    /// Whether flushes write whole blocks with `O_DIRECT`.
    direct: bool,
    idx: File,
    state: Mutex<SegState>,
    /// Signalled whenever a flush finishes.
    idle: Condvar,
    index: Mutex<IndexState>,
    /// Serializes a copy's coordinator orders (`fence_order`).
    ordering: Mutex<()>,
}

#[derive(Debug)]
struct IndexState {
    index: SparseIndex,
    /// Entries already written to the sidecar.
    persisted: usize,
}

#[derive(Debug)]
struct SegState {
    /// Next offset to assign (durable + in flight + pending).
    next_offset: u64,
    durable_offset: u64,
    durable_bytes: u64,
    /// Encoded batches waiting for a flush, in offset order.
    pending: Vec<Batch>,
    pending_bytes: usize,
    pending_records: usize,
    pending_first_offset: u64,
    pending_since: Option<Instant>,
    pending_waiters: Vec<Arc<Completion>>,
    /// Bytes handed to writes so far: where the next flush writes.
    written_bytes: u64,
    /// With direct writes: the bytes of the partial block that ends at
    /// `written_bytes` (under one block), which the next flush rewrites.
    tail_block: Vec<u8>,
    /// A flush is writing (writes are never concurrent).
    writing: bool,
    /// Pipeline slots whose flush has not returned from `fdatasync` yet.
    slots_busy: u32,
    /// Flushes taken and not yet published, in flush (and offset) order.
    inflight: VecDeque<InFlight>,
    flush_seq: u64,
    /// The first flush that failed: it and every later flush fail.
    failed_from_seq: Option<u64>,
    ready_queued: bool,
    timer_armed: bool,
    /// Set by sync, seal and close: flush now regardless of triggers.
    force_flush: bool,
    fenced: bool,
    /// The newest coordinator's order epoch taken (kept in the fence
    /// marker; the default before any).
    order: OrderEpoch,
    sealed: Option<SealInfo>,
    failed: Option<String>,
    /// Records the copy should hold and cannot give, and why (ADR 0108).
    lost: Option<(Loss, String)>,
    /// The end recovery found when the copy was opened (or a cut left):
    /// `truncate_tail` cuts only a copy that took no append since.
    opened_end: u64,
    /// Set for a replicated copy (`set_committed`): the highest offset durable
    /// on a quorum, as the primary last said. Readers see no record at or
    /// above it, and a primary's flushes carry it as `durable_below`.
    committed: Option<u64>,
}

/// A flush between being taken and being published.
#[derive(Debug)]
struct InFlight {
    seq: u64,
    first: u64,
    records: u64,
    position: u64,
    bytes: u64,
    waiters: Vec<Arc<Completion>>,
    /// Set when the flush's write failed or its `fdatasync` returned.
    outcome: Option<Result<(), StorageError>>,
}

/// One append's frames, encoded by the appender's thread.
#[derive(Debug)]
struct Batch {
    bytes: Vec<u8>,
    /// Start of each frame in `bytes`.
    starts: Vec<usize>,
    /// Checksum state over each frame's body, computed by the appender.
    /// Empty for a replica's batch: its frames arrived finished and are
    /// written as they are.
    body_crcs: Vec<crc32fast::Hasher>,
}

impl Batch {
    /// Frames written verbatim (a replica append): trailer and CRC are the
    /// primary's.
    fn is_verbatim(&self) -> bool {
        self.body_crcs.is_empty()
    }
}

enum Wake {
    Nothing,
    Ready,
    Timer(Instant),
}

impl FileStore {
    /// Opens a store over `dir` (created if absent) and starts its sync threads.
    pub fn open_dir(dir: impl Into<PathBuf>, config: StoreConfig) -> Result<Self, StorageError> {
        config.validate()?;
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .map_err(|e| StorageError::io("create store directory", &dir, e))?;
        let shared = Arc::new(Shared {
            dir,
            config,
            segments: Mutex::new(HashMap::new()),
            sched: Mutex::new(Scheduler::default()),
            sched_cv: Condvar::new(),
            stats: Mutex::new(StoreStats::default()),
            #[cfg(test)]
            sync_hook: Mutex::new(None),
            buffers: Mutex::new(Vec::new()),
            removals: Mutex::new(()),
        });
        let mut workers = Vec::with_capacity(shared.config.sync_threads);
        for n in 0..shared.config.sync_threads {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("malachi-sync-{n}"))
                .spawn(move || sync_worker(&shared))
                .map_err(|e| StorageError::io("spawn sync thread", "", e))?;
            workers.push(handle);
        }
        let store = FileStore { shared, workers };
        // A removal a crash cut short finishes before any copy opens, and
        // the temporary files of marker writes it cut short go.
        store.finish_removals()?;
        store.sweep_temporary_files()?;
        Ok(store)
    }

    /// One copy removal at a time (`removal.rs`).
    pub(crate) fn removals_lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.shared.removals.lock()
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        *self.shared.stats.lock()
    }

    /// Path of a segment's log file.
    pub fn log_path(&self, segment: SegmentId) -> PathBuf {
        self.shared.dir.join(format!("{}.log", segment.file_stem()))
    }

    /// Path of a segment's producer-state sidecar. The store never reads
    /// or writes it: the broker keeps its idempotent producers' state there
    /// (ADR 0092), beside the files it describes.
    pub fn producers_path(&self, segment: SegmentId) -> PathBuf {
        self.shared
            .dir
            .join(format!("{}.producers", segment.file_stem()))
    }

    /// Path of a segment's sparse index sidecar.
    pub fn index_path(&self, segment: SegmentId) -> PathBuf {
        self.shared.dir.join(format!("{}.idx", segment.file_stem()))
    }

    /// Path of a segment's seal marker (present once the copy is sealed).
    pub fn seal_path(&self, segment: SegmentId) -> PathBuf {
        self.shared
            .dir
            .join(format!("{}.seal", segment.file_stem()))
    }

    pub(crate) fn fence_path(&self, segment: SegmentId) -> PathBuf {
        self.shared
            .dir
            .join(format!("{}.fence", segment.file_stem()))
    }

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
    fn aside_files(&self, segment: SegmentId) -> impl Iterator<Item = PathBuf> + use<> {
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

    /// With `flush_interval_ms == 0`, a caller that blocks in `wait()` on a
    /// segment with no flush in flight runs the flush itself: that saves two
    /// thread hand-offs on the latency path. The sync threads still get the
    /// segment queued, so an awaited (async) ticket is flushed the same way.
    fn with_help(&self, ticket: AppendTicket, seg: &Arc<Segment>) -> AppendTicket {
        if self.shared.config.flush_interval_ms != 0 {
            return ticket;
        }
        let shared = Arc::clone(&self.shared);
        let seg = Arc::clone(seg);
        ticket.with_help(Box::new(move || flush(&shared, &seg, FlushSource::Helper)))
    }

    fn segment(&self, segment: SegmentId) -> Result<Arc<Segment>, StorageError> {
        self.shared
            .segments
            .lock()
            .get(&segment)
            .cloned()
            .ok_or(StorageError::NotOpen { segment })
    }

    fn info_of(seg: &Segment) -> SegmentInfo {
        let st = seg.state.lock();
        let (length, byte_size) = readable_end(&st);
        SegmentInfo {
            segment: seg.id,
            length,
            byte_size,
            durable: stored_end(&st).0,
            committed: st.committed,
            assigned: st.next_offset,
            stored_bytes: st.durable_bytes.max(st.sealed.map_or(0, |s| s.byte_size)),
            sealed: st.sealed,
            fenced: st.fenced,
            failed: st.failed.is_some(),
            lost: st.lost.as_ref().map(|(loss, _)| *loss),
        }
    }

    /// Forces a flush of everything pending and waits until none is in flight.
    fn drain(&self, seg: &Arc<Segment>) {
        let wake = {
            let mut st = seg.state.lock();
            st.force_flush = true;
            decide(&self.shared.config, &mut st, Instant::now())
        };
        self.shared.wake(seg, wake);
        let mut st = seg.state.lock();
        while !st.inflight.is_empty() || (st.pending_records > 0 && st.failed.is_none()) {
            seg.idle.wait(&mut st);
        }
    }

    fn open_segment(
        &self,
        id: SegmentId,
        quarantine: bool,
    ) -> Result<(Segment, Recovery), StorageError> {
        let cfg = &self.shared.config;
        let log_path = self.log_path(id);
        let idx_path = self.index_path(id);
        let log_missing = !log_path
            .try_exists()
            .map_err(|e| StorageError::io("stat log", &log_path, e))?;
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&log_path)
            .map_err(|e| StorageError::io("open log", &log_path, e))?;
        // The directory entry of a new log must be durable before any append
        // to it is acknowledged.
        File::open(&self.shared.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StorageError::io("sync store directory", &self.shared.dir, e))?;
        let idx = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&idx_path)
            .map_err(|e| StorageError::io("open index", &idx_path, e))?;
        let file_len = log
            .metadata()
            .map_err(|e| StorageError::io("stat log", &log_path, e))?
            .len();
        let sealed = marker::read_seal(&self.seal_path(id))?;
        let order = marker::read_fence(&self.fence_path(id))?;
        let fenced = sealed.is_some() || order.is_some();
        let order = order.unwrap_or_default();
        let mut truncated_bytes = 0;
        let mut short_of_seal = false;
        let mut lost: Option<(Loss, String)> = None;
        let mut failed: Option<String> = None;
        let mut index_rebuilt = false;
        let io_err = |op: &'static str| {
            let path = log_path.clone();
            move |e| StorageError::io(op, path, e)
        };
        let (records, bytes, index) = match sealed {
            Some(seal) if file_len >= seal.byte_size => {
                // A sealed copy is immutable: trust its marker and open without
                // a scan. Damage at rest is the scrubber's to find (verify).
                let loaded = SparseIndex::load(&idx_path, cfg.index_interval_bytes, seal.byte_size)
                    .map_err(|e| StorageError::io("read index", &idx_path, e))?;
                let index = match loaded {
                    Some(index) if !index.entries().is_empty() || seal.byte_size == 0 => index,
                    _ => {
                        let report = scan::scan_log(
                            &log,
                            seal.byte_size,
                            cfg.index_interval_bytes,
                            cfg.read_chunk_bytes,
                        )
                        .map_err(io_err("scan log"))?;
                        report
                            .index
                            .write_all(&idx)
                            .map_err(|e| StorageError::io("write index", &idx_path, e))?;
                        index_rebuilt = true;
                        report.index
                    }
                };
                (seal.length, seal.byte_size, index)
            }
            _ => {
                let report = scan::scan_log(
                    &log,
                    file_len,
                    cfg.index_interval_bytes,
                    cfg.read_chunk_bytes,
                )
                .map_err(io_err("scan log"))?;
                let damaged = match (report.first_bad, report.later_flush) {
                    (Some(bad), Some(later)) => Some((bad, later)),
                    _ => None,
                };
                if let Some((bad, later)) = damaged {
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
                    // Quarantine: nothing is cut or rewritten. The records
                    // from the bad frame to the last valid one after it are
                    // what the copy can no longer give.
                    let last = scan::last_offset_from(
                        &log,
                        later.position,
                        file_len,
                        cfg.read_chunk_bytes,
                    )
                    .map_err(io_err("scan past the damage"))?;
                    let to = quarantine_end(bad.offset, later, last, sealed);
                    let reason = format!(
                        "the copy is damaged at byte {} (offset {}): {}",
                        bad.position, bad.offset, bad.error
                    );
                    failed = Some(reason.clone());
                    lost = Some((
                        Loss {
                            from: report.records,
                            to,
                        },
                        reason,
                    ));
                } else if let Some(seal) = sealed {
                    // Never truncate a sealed copy: a partially readable copy
                    // beats a shorter one, and repair comes from a replica.
                    warn!(
                        segment = id.0,
                        records = report.records,
                        sealed = seal.length,
                        "sealed copy shorter than its seal"
                    );
                    short_of_seal = true;
                    if report.records < seal.length {
                        lost = Some((
                            Loss {
                                from: report.records,
                                to: seal.length,
                            },
                            if log_missing {
                                "the copy's log is missing".to_string()
                            } else {
                                format!(
                                    "the copy holds {} of the {} records of its seal",
                                    report.records, seal.length
                                )
                            },
                        ));
                    }
                } else if let Some(bad) = report.first_bad {
                    if padding_after(&log, report.valid_bytes, file_len)
                        .map_err(io_err("read the log's tail"))?
                    {
                        debug!(
                            segment = id.0,
                            padding_bytes = file_len - report.valid_bytes,
                            "dropping a direct write's padding"
                        );
                    } else {
                        truncated_bytes = file_len - report.valid_bytes;
                        warn!(segment = id.0, position = bad.position, truncated_bytes, reason = %bad.error, "truncating torn tail");
                    }
                    log.set_len(report.valid_bytes)
                        .map_err(io_err("truncate log"))?;
                    log.sync_data().map_err(io_err("sync log"))?;
                }
                let loaded = SparseIndex::load(&idx_path, cfg.index_interval_bytes, u64::MAX)
                    .map_err(|e| StorageError::io("read index", &idx_path, e))?;
                // A quarantined copy's files are left as they were found.
                if failed.is_none() && loaded.as_ref() != Some(&report.index) {
                    report
                        .index
                        .write_all(&idx)
                        .map_err(|e| StorageError::io("write index", &idx_path, e))?;
                    index_rebuilt = loaded.is_some_and(|l| !l.entries().is_empty())
                        || !report.index.entries().is_empty();
                }
                (report.records, report.valid_bytes, report.index)
            }
        };
        let persisted = index.entries().len();
        let (writers, direct) = open_writers(&log_path, cfg)?;
        let tail_block = if direct {
            let base = align_down(bytes);
            let mut tail = vec![0u8; (bytes - base) as usize];
            log.read_exact_at(&mut tail, base)
                .map_err(io_err("read the last block"))?;
            tail
        } else {
            Vec::new()
        };
        let segment = Segment {
            id,
            log_path: self.log_path(id),
            log,
            writers,
            direct,
            idx,
            state: Mutex::new(SegState {
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
                failed,
                lost,
                committed: sealed.map(|seal| seal.length),
                opened_end: records,
            }),
            idle: Condvar::new(),
            index: Mutex::new(IndexState { index, persisted }),
            ordering: Mutex::new(()),
        };
        let info = FileStore::info_of(&segment);
        debug!(
            segment = id.0,
            records = info.length,
            bytes = info.byte_size,
            truncated_bytes,
            "segment opened"
        );
        Ok((
            segment,
            Recovery {
                info,
                truncated_bytes,
                index_rebuilt,
                short_of_seal,
                log_missing,
            },
        ))
    }

    /// Reads from the frame the index points at, falling back to a scan from
    /// byte zero when the hint disagrees with the log, so a wrong index never
    /// yields a wrong read. Hands each frame from `from` on to `visit` and
    /// returns the position of `from` and how many frames `visit` took.
    fn read_range(
        &self,
        seg: &Segment,
        from: u64,
        end: (u64, u64),
        budget: ReadBudget,
        visit: &mut dyn FnMut(&FrameView<'_>, u64, usize) -> ControlFlow<()>,
    ) -> Result<(u64, usize), StorageError> {
        let hint = seg.index.lock().index.floor(from).unwrap_or(IndexEntry {
            offset: 0,
            position: 0,
        });
        let chunk = self.shared.config.read_chunk_bytes;
        let mut taken = 0usize;
        let first = read_from(seg, hint, from, end, budget, chunk, &mut |view, at, len| {
            let flow = visit(view, at, len);
            taken += usize::from(flow.is_continue());
            flow
        });
        let result = match first {
            // Damage after a frame was handed out is real: the scan had
            // already found a valid frame with the offset the hint claimed.
            Err(ReadAnomaly::Bad { .. }) if hint.position != 0 && taken == 0 => {
                debug!(
                    segment = seg.id.0,
                    from, "index hint disagreed with the log; rescanning"
                );
                let start = IndexEntry {
                    offset: 0,
                    position: 0,
                };
                read_from(seg, start, from, end, budget, chunk, visit)
            }
            other => other,
        };
        result.map_err(|anomaly| match anomaly {
            ReadAnomaly::Io(e) => StorageError::io("read log", &seg.log_path, e),
            ReadAnomaly::Bad {
                position,
                offset,
                error,
            } => StorageError::Corrupt {
                segment: seg.id,
                position,
                offset,
                reason: error,
            },
        })
    }

    fn verify_file(
        &self,
        id: SegmentId,
        log: &File,
        end: u64,
    ) -> Result<VerifyReport, StorageError> {
        let cfg = &self.shared.config;
        let log_path = self.log_path(id);
        let report = scan::scan_log(log, end, cfg.index_interval_bytes, cfg.read_chunk_bytes)
            .map_err(|e| StorageError::io("scan log", &log_path, e))?;
        let idx_path = self.index_path(id);
        let sidecar = SparseIndex::load(&idx_path, cfg.index_interval_bytes, u64::MAX)
            .map_err(|e| StorageError::io("read index", &idx_path, e))?;
        let raw_len = std::fs::metadata(&idx_path).map(|m| m.len()).unwrap_or(0);
        let mut index_entries_bad = (raw_len / crate::index::INDEX_ENTRY_BYTES as u64)
            .saturating_sub(sidecar.as_ref().map_or(0, |s| s.entries().len() as u64));
        for entry in sidecar.iter().flat_map(|s| s.entries()) {
            if entry.position >= report.valid_bytes {
                continue;
            }
            let mut reader = FrameReader::new(
                log,
                entry.position,
                report.valid_bytes,
                frame::FRAME_BYTES_MIN,
            );
            let ok = matches!(reader.next_frame(), Ok(Next::Frame { view, .. }) if view.offset == entry.offset);
            if !ok {
                index_entries_bad += 1;
            }
        }
        Ok(VerifyReport {
            segment: id,
            records: report.records,
            valid_bytes: report.valid_bytes,
            scanned_bytes: report.scanned_bytes,
            first_bad: report.first_bad,
            valid_after: report.valid_after,
            later_flush: report.later_flush,
            index_entries_bad,
        })
    }
}

impl Drop for FileStore {
    fn drop(&mut self) {
        let segments: Vec<_> = self.shared.segments.lock().values().cloned().collect();
        for seg in &segments {
            self.drain(seg);
            if let Err(e) = trim_padding(seg) {
                warn!(segment = seg.id.0, error = %e, "could not trim the log's padding; recovery will");
            }
        }
        {
            let mut sched = self.shared.sched.lock();
            sched.shutdown = true;
            self.shared.sched_cv.notify_all();
        }
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                error!("a sync thread panicked");
            }
        }
    }
}

impl FileStore {
    /// The one path of a replica's frames into a copy: `append_frames`
    /// (`repair: None`) and `repair_frames` (`repair: Some(seal_length)`).
    fn queue_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        repair: Option<u64>,
    ) -> Result<AppendTicket, StorageError> {
        let cfg = &self.shared.config;
        let seg = self.segment(segment)?;
        if frames.len() > cfg.pending_bytes_max {
            return Err(StorageError::BatchTooLarge {
                records: 0,
                bytes: frames.len(),
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        // Every frame is checked before any byte is queued: a bad run is
        // refused whole, so the copy never holds half of it.
        let starts = check_frames(segment, first, frames, cfg)?;
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            match repair {
                None => check_writable(segment, &st)?,
                Some(seal) => {
                    check_repairable(segment, &st)?;
                    let end = first.saturating_add(starts.len() as u64);
                    if end > seal {
                        return Err(StorageError::PastSeal { segment, end, seal });
                    }
                }
            }
            if first != st.next_offset {
                return Err(StorageError::NotAtEnd {
                    segment,
                    first,
                    end: st.next_offset,
                });
            }
            if starts.is_empty() {
                return Ok(AppendTicket::ready(first..first));
            }
            if st.pending_bytes > 0 && st.pending_bytes + frames.len() > cfg.pending_bytes_max {
                return Err(StorageError::Busy {
                    segment,
                    pending_bytes: st.pending_bytes,
                    pending_bytes_max: cfg.pending_bytes_max,
                });
            }
            queue(
                cfg,
                &mut st,
                Batch {
                    bytes: frames.to_vec(),
                    starts,
                    body_crcs: Vec::new(),
                },
            )
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }
}

impl SegmentStore for FileStore {
    fn open(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        if let Ok(seg) = self.segment(segment) {
            return Ok(Recovery {
                info: FileStore::info_of(&seg),
                truncated_bytes: 0,
                index_rebuilt: false,
                short_of_seal: false,
                log_missing: false,
            });
        }
        let (seg, recovery) = self.open_segment(segment, false)?;
        let mut segments = self.shared.segments.lock();
        if let Some(existing) = segments.get(&segment) {
            // A concurrent open won; its scan saw the same bytes.
            return Ok(Recovery {
                info: FileStore::info_of(existing),
                ..recovery
            });
        }
        segments.insert(segment, Arc::new(seg));
        Ok(recovery)
    }

    fn open_quarantined(&self, segment: SegmentId) -> Result<Recovery, StorageError> {
        if let Ok(seg) = self.segment(segment) {
            return Ok(Recovery {
                info: FileStore::info_of(&seg),
                truncated_bytes: 0,
                index_rebuilt: false,
                short_of_seal: false,
                log_missing: false,
            });
        }
        let (seg, recovery) = self.open_segment(segment, true)?;
        let mut segments = self.shared.segments.lock();
        if let Some(existing) = segments.get(&segment) {
            return Ok(Recovery {
                info: FileStore::info_of(existing),
                ..recovery
            });
        }
        segments.insert(segment, Arc::new(seg));
        Ok(recovery)
    }

    fn check_seal(&self, segment: SegmentId, length: u64) -> Result<Option<Loss>, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        if st.durable_offset < length {
            let short = Loss {
                from: st.durable_offset,
                to: length,
            };
            let lost = match st.lost.take() {
                Some((loss, reason)) => (loss.union(short), reason),
                None => (
                    short,
                    format!(
                        "the copy holds {} of the {} records of its seal",
                        st.durable_offset, length
                    ),
                ),
            };
            st.lost = Some(lost);
        }
        Ok(st.lost.as_ref().map(|(loss, _)| *loss))
    }

    fn append(
        &self,
        segment: SegmentId,
        records: &dyn RecordBatch,
    ) -> Result<AppendTicket, StorageError> {
        let cfg = &self.shared.config;
        let seg = self.segment(segment)?;
        let mut frames = Vec::new();
        let mut starts = Vec::with_capacity(records.len());
        let mut body_crcs = Vec::with_capacity(records.len());
        let mut batch_bytes = 0usize;
        for record in records.iter() {
            let payload = frame::payload_len(record).unwrap_or(usize::MAX);
            if payload > cfg.record_bytes_max {
                return Err(StorageError::RecordTooLarge {
                    record_bytes: payload,
                    record_bytes_max: cfg.record_bytes_max,
                });
            }
            batch_bytes = batch_bytes.saturating_add(frame::FRAME_HEADER_BYTES + payload);
        }
        if records.len() > cfg.batch_records_max || batch_bytes > cfg.pending_bytes_max {
            return Err(StorageError::BatchTooLarge {
                records: records.len(),
                bytes: batch_bytes,
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        frames.reserve_exact(batch_bytes);
        for record in records.iter() {
            starts.push(frames.len());
            body_crcs.push(frame::encode_unsealed(&mut frames, record));
        }
        debug_assert_eq!(frames.len(), batch_bytes);
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            check_writable(segment, &st)?;
            if records.is_empty() {
                return Ok(AppendTicket::ready(st.next_offset..st.next_offset));
            }
            if st.pending_bytes > 0 && st.pending_bytes + frames.len() > cfg.pending_bytes_max {
                return Err(StorageError::Busy {
                    segment,
                    pending_bytes: st.pending_bytes,
                    pending_bytes_max: cfg.pending_bytes_max,
                });
            }
            queue(
                cfg,
                &mut st,
                Batch {
                    bytes: frames,
                    starts,
                    body_crcs,
                },
            )
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }

    fn sync(&self, segment: SegmentId) -> Result<AppendTicket, StorageError> {
        let seg = self.segment(segment)?;
        let (ticket, wake) = {
            let mut st = seg.state.lock();
            if let Some(reason) = &st.failed {
                return Err(StorageError::Failed {
                    segment,
                    reason: reason.clone(),
                });
            }
            let end = st.next_offset;
            let completion = Completion::new();
            let ticket = AppendTicket::new(end..end, Arc::clone(&completion));
            if st.pending_records > 0 {
                st.pending_waiters.push(completion);
                st.force_flush = true;
            } else if let Some(last) = st.inflight.back_mut() {
                // Published in order, so the last flush covers everything.
                last.waiters.push(completion);
            } else {
                return Ok(AppendTicket::ready(end..end));
            }
            (ticket, decide(&self.shared.config, &mut st, Instant::now()))
        };
        self.shared.wake(&seg, wake);
        Ok(self.with_help(ticket, &seg))
    }

    fn read_with(
        &self,
        segment: SegmentId,
        from: u64,
        records_max: usize,
        bytes_max: usize,
        visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
    ) -> Result<usize, StorageError> {
        let seg = self.segment(segment)?;
        let (end, lost) = {
            let st = seg.state.lock();
            (readable_end(&st), st.lost.clone())
        };
        if let Some((loss, reason)) = lost
            && from >= end.0
            && from < loss.to
        {
            return Err(StorageError::Lost {
                segment,
                from: loss.from,
                to: loss.to,
                reason,
            });
        }
        if from > end.0 {
            return Err(StorageError::OffsetOutOfRange {
                segment,
                offset: from,
                end: end.0,
            });
        }
        if from == end.0 || records_max == 0 {
            return Ok(0);
        }
        let mut expected = from;
        let budget = ReadBudget {
            records_max,
            bytes_max,
        };
        let (_, taken) = self.read_range(&seg, from, end, budget, &mut |view, _, _| {
            // Cheap enough to keep on: a reader must never see a gap.
            assert_eq!(view.offset, expected, "read handed out a gap");
            expected += 1;
            visit(view)
        })?;
        Ok(taken)
    }

    fn append_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
    ) -> Result<AppendTicket, StorageError> {
        self.queue_frames(segment, first, frames, None)
    }

    fn repair_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        seal_length: u64,
    ) -> Result<AppendTicket, StorageError> {
        self.queue_frames(segment, first, frames, Some(seal_length))
    }

    fn read_frames(
        &self,
        segment: SegmentId,
        from: u64,
        bytes_max: usize,
    ) -> Result<FrameRun, StorageError> {
        let seg = self.segment(segment)?;
        let (end, end_bytes) = stored_end(&seg.state.lock());
        if from > end {
            return Err(StorageError::OffsetOutOfRange {
                segment,
                offset: from,
                end,
            });
        }
        if from == end {
            return Ok(FrameRun {
                first: from,
                records: 0,
                bytes: Vec::new(),
            });
        }
        let locate = ReadBudget {
            records_max: 0,
            bytes_max: 0,
        };
        let (position, _) =
            self.read_range(&seg, from, (end, end_bytes), locate, &mut |_, _, _| {
                ControlFlow::Break(())
            })?;
        let available = end_bytes.saturating_sub(position);
        let corrupt = |at: u64, offset: u64, reason| StorageError::Corrupt {
            segment,
            position: at,
            offset,
            reason,
        };
        let io = |e| StorageError::io("read log", &seg.log_path, e);
        let want = (bytes_max.max(frame::FRAME_BYTES_MIN) as u64).min(available);
        let mut bytes = vec![0u8; want as usize];
        seg.log.read_exact_at(&mut bytes, position).map_err(io)?;
        // Cut at the last whole frame, checking each CRC: a shipped frame was
        // checked after it was read.
        let (mut at, mut offset) = (0usize, from);
        while offset < end {
            match frame::decode(&bytes[at..]) {
                Ok((view, len)) if view.offset == offset => {
                    at += len;
                    offset += 1;
                }
                Ok((view, _)) => {
                    let found = view.offset;
                    return Err(corrupt(
                        position + at as u64,
                        offset,
                        FrameError::OffsetMismatch {
                            found,
                            expected: offset,
                        },
                    ));
                }
                Err(FrameError::Incomplete { needed, .. }) if at == 0 => {
                    // One frame larger than `bytes_max`: a run holds at
                    // least one. `needed` passed the format's bound.
                    if needed > available {
                        return Err(corrupt(
                            position,
                            offset,
                            FrameError::Incomplete { needed, available },
                        ));
                    }
                    bytes.resize(needed as usize, 0);
                    seg.log.read_exact_at(&mut bytes, position).map_err(io)?;
                }
                Err(FrameError::Incomplete { .. }) => break,
                Err(reason) => return Err(corrupt(position + at as u64, offset, reason)),
            }
        }
        bytes.truncate(at);
        Ok(FrameRun {
            first: from,
            records: offset - from,
            bytes,
        })
    }

    fn set_committed(&self, segment: SegmentId, end: u64) -> Result<u64, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        if let Some(seal) = st.sealed {
            return Ok(seal.length);
        }
        let committed = st.committed.map_or(end, |c| c.max(end));
        st.committed = Some(committed);
        Ok(committed)
    }

    fn truncate_tail(&self, segment: SegmentId, length: u64) -> Result<SegmentInfo, StorageError> {
        let seg = self.segment(segment)?;
        let refuse = |reason| StorageError::NotTruncatable {
            segment,
            length,
            reason,
        };
        let mut st = seg.state.lock();
        if st.sealed.is_some() || st.fenced || st.failed.is_some() {
            return Err(refuse("the copy is sealed, fenced or failed"));
        }
        if st.committed.is_some() {
            return Err(refuse("the copy is replicated"));
        }
        if st.next_offset != st.opened_end
            || st.next_offset != st.durable_offset
            || st.pending_records != 0
            || st.writing
            || !st.inflight.is_empty()
        {
            return Err(refuse("records were appended since the copy was opened"));
        }
        if length > st.durable_offset {
            return Err(refuse("the copy holds fewer records"));
        }
        if length == st.durable_offset {
            drop(st);
            return Ok(FileStore::info_of(&seg));
        }
        let locate = ReadBudget {
            records_max: 0,
            bytes_max: 0,
        };
        let end = (st.durable_offset, st.durable_bytes);
        let (position, _) = self.read_range(&seg, length, end, locate, &mut |_, _, _| {
            ControlFlow::Break(())
        })?;
        let log_path = seg.log_path.clone();
        let io = |op: &'static str| {
            let path = log_path.clone();
            move |e| StorageError::io(op, path, e)
        };
        // Everything that can fail without changing the copy goes first.
        let tail_block = if seg.direct {
            let base = align_down(position);
            let mut tail = vec![0u8; (position - base) as usize];
            seg.log
                .read_exact_at(&mut tail, base)
                .map_err(io("read the last block"))?;
            tail
        } else {
            Vec::new()
        };
        seg.log.set_len(position).map_err(io("cut the log"))?;
        st.next_offset = length;
        st.opened_end = length;
        st.durable_offset = length;
        st.pending_first_offset = length;
        st.durable_bytes = position;
        st.written_bytes = position;
        st.tail_block = tail_block;
        if let Err(e) = seg.log.sync_data() {
            // As after any failed sync: the copy takes no more appends.
            st.failed = Some(e.to_string());
            return Err(io("sync log")(e));
        }
        {
            // The sidecar is derived data: a failed rewrite only costs a rebuild.
            let mut idx = seg.index.lock();
            idx.index.truncate(length);
            let kept = idx.index.entries().len();
            idx.persisted = idx.persisted.min(kept);
            let bytes = (kept * crate::index::INDEX_ENTRY_BYTES) as u64;
            if let Err(e) = seg.idx.set_len(bytes) {
                warn!(segment = seg.id.0, error = %e, "index sidecar cut failed");
            }
        }
        warn!(
            segment = seg.id.0,
            records = length,
            bytes = position,
            "cut a torn batch from the end of the log"
        );
        drop(st);
        Ok(FileStore::info_of(&seg))
    }

    fn seal(&self, segment: SegmentId, length: u64) -> Result<SealInfo, StorageError> {
        let seg = self.segment(segment)?;
        {
            let mut st = seg.state.lock();
            if let Some(existing) = st.sealed {
                return if existing.length == length {
                    Ok(existing)
                } else {
                    Err(StorageError::AlreadySealed {
                        segment,
                        existing: existing.length,
                        requested: length,
                    })
                };
            }
            // Fence first so that nothing new is appended while we wait.
            st.fenced = true;
        }
        self.drain(&seg);
        let (durable, durable_bytes) = {
            let st = seg.state.lock();
            (st.durable_offset, st.durable_bytes)
        };
        if length > durable {
            return Err(StorageError::SealBeyondEnd {
                segment,
                requested: length,
                stored: durable,
            });
        }
        let byte_size = if length == durable {
            durable_bytes
        } else {
            let locate = ReadBudget {
                records_max: 0,
                bytes_max: 0,
            };
            self.read_range(
                &seg,
                length,
                (durable, durable_bytes),
                locate,
                &mut |_, _, _| ControlFlow::Break(()),
            )?
            .0
        };
        let info = SealInfo { length, byte_size };
        trim_padding(&seg)?;
        marker::write_atomically(
            &self.shared.dir,
            &self.seal_path(segment),
            &marker::encode_seal(info),
        )?;
        {
            let mut st = seg.state.lock();
            st.sealed = Some(info);
            if st.committed.is_some() {
                st.committed = Some(length);
            }
        }
        debug!(segment = segment.0, length, byte_size, "sealed");
        Ok(info)
    }

    fn fence(&self, segment: SegmentId) -> Result<(), StorageError> {
        let seg = self.segment(segment)?;
        seg.state.lock().fenced = true;
        let path = self.fence_path(segment);
        marker::write_atomically(&self.shared.dir, &path, &[])?;
        debug!(segment = segment.0, "fenced");
        Ok(())
    }

    fn fence_order(
        &self,
        segment: SegmentId,
        order: OrderEpoch,
    ) -> Result<FenceInfo, StorageError> {
        let seg = self.segment(segment)?;
        // Orders of one copy are serialized by the marker lock, so two
        // racing orders cannot write their markers in the wrong order.
        let _ordering = seg.ordering.lock();
        let (seen, fenced) = {
            let st = seg.state.lock();
            (st.order, st.fenced)
        };
        if order.is_stale_against(seen) {
            return Err(StorageError::StaleOrder {
                segment,
                seen,
                order,
            });
        }
        if order != seen || !fenced {
            // Fence in memory first, so nothing new is queued while the
            // marker is written; the marker makes fence and epoch durable
            // before the answer.
            seg.state.lock().fenced = true;
            marker::write_atomically(
                &self.shared.dir,
                &self.fence_path(segment),
                &marker::encode_fence(order),
            )?;
            seg.state.lock().order = order;
            debug!(
                segment = segment.0,
                group = order.group,
                term = order.term,
                "fenced by order"
            );
        }
        // Whatever was queued before the fence becomes durable (or fails)
        // before the answer, never after it.
        self.drain(&seg);
        let st = seg.state.lock();
        Ok(FenceInfo {
            durable: st.durable_offset,
            durable_bytes: st.durable_bytes,
            sealed: st.sealed,
            order: st.order,
            failed: st.failed.is_some(),
        })
    }

    fn cut_to_seal(&self, segment: SegmentId) -> Result<u64, StorageError> {
        let seg = self.segment(segment)?;
        let mut st = seg.state.lock();
        let Some(seal) = st.sealed else {
            return Err(StorageError::NotTruncatable {
                segment,
                length: st.durable_offset,
                reason: "the copy is not sealed",
            });
        };
        // Sealing fenced and drained the copy: nothing is in flight.
        debug_assert!(st.inflight.is_empty() && st.pending_records == 0);
        let log_path = seg.log_path.clone();
        let io = |op: &'static str| {
            let path = log_path.clone();
            move |e| StorageError::io(op, path, e)
        };
        let file_len = seg.log.metadata().map_err(io("stat log"))?.len();
        if st.durable_offset <= seal.length && file_len <= seal.byte_size {
            return Ok(0);
        }
        if st.durable_offset < seal.length {
            // Short of its seal, and longer on disk only by padding: filling
            // it is repair's job, not a cut's.
            return Ok(0);
        }
        let position = seal.byte_size;
        let tail_block = if seg.direct {
            let base = align_down(position);
            let mut tail = vec![0u8; (position - base) as usize];
            seg.log
                .read_exact_at(&mut tail, base)
                .map_err(io("read the last block"))?;
            tail
        } else {
            Vec::new()
        };
        seg.log
            .set_len(position)
            .map_err(io("cut the log at its seal"))?;
        if let Err(e) = seg.log.sync_data() {
            st.failed = Some(e.to_string());
            return Err(io("sync log")(e));
        }
        st.next_offset = seal.length;
        st.opened_end = seal.length;
        st.durable_offset = seal.length;
        st.pending_first_offset = seal.length;
        st.durable_bytes = position;
        st.written_bytes = position;
        st.tail_block = tail_block;
        drop(st);
        {
            let mut idx = seg.index.lock();
            idx.index.truncate(seal.length);
            let kept = idx.index.entries().len();
            idx.persisted = idx.persisted.min(kept);
            let bytes = (kept * crate::index::INDEX_ENTRY_BYTES) as u64;
            if let Err(e) = seg.idx.set_len(bytes) {
                warn!(segment = seg.id.0, error = %e, "index sidecar cut failed");
            }
        }
        let cut = file_len.saturating_sub(position);
        debug!(
            segment = segment.0,
            length = seal.length,
            bytes = position,
            cut,
            "cut to its seal"
        );
        Ok(cut)
    }

    fn order_epoch(&self, segment: SegmentId) -> Result<OrderEpoch, StorageError> {
        Ok(self.segment(segment)?.state.lock().order)
    }

    fn verify(&self, segment: SegmentId) -> Result<VerifyReport, StorageError> {
        match self.segment(segment) {
            Ok(seg) => {
                let end = readable_end(&seg.state.lock()).1;
                self.verify_file(segment, &seg.log, end)
            }
            Err(_) => {
                let path = self.log_path(segment);
                let log = File::open(&path).map_err(|e| StorageError::io("open log", &path, e))?;
                let end = log
                    .metadata()
                    .map_err(|e| StorageError::io("stat log", &path, e))?
                    .len();
                self.verify_file(segment, &log, end)
            }
        }
    }

    fn info(&self, segment: SegmentId) -> Result<SegmentInfo, StorageError> {
        let seg = self.segment(segment)?;
        Ok(FileStore::info_of(&seg))
    }

    fn close(&self, segment: SegmentId) -> Result<(), StorageError> {
        let seg = self.segment(segment)?;
        self.drain(&seg);
        // Trimmed while still in the map: once removed, an `open` may build a
        // new copy on the same file, whose writes this trim must not cut.
        let trimmed = trim_padding(&seg);
        self.shared.segments.lock().remove(&segment);
        trimmed
    }

    fn copy_bytes(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        let path = self.log_path(segment);
        match std::fs::metadata(&path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("stat log", &path, e)),
        }
    }

    fn has_seal_marker(&self, segment: SegmentId) -> bool {
        self.seal_path(segment).exists()
    }

    fn read_sidecar(&self, segment: SegmentId) -> Result<Option<Vec<u8>>, StorageError> {
        let path = self.producers_path(segment);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io("read sidecar", &path, e)),
        }
    }

    fn write_sidecar(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), StorageError> {
        marker::write_atomically(&self.shared.dir, &self.producers_path(segment), bytes)
    }

    fn set_aside(&self, segment: SegmentId) -> Result<bool, StorageError> {
        FileStore::set_aside(self, segment)
    }

    fn is_aside(&self, segment: SegmentId) -> bool {
        FileStore::is_aside(self, segment)
    }

    fn discard_aside(&self, segment: SegmentId) -> Result<u64, StorageError> {
        FileStore::discard_aside(self, segment)
    }

    fn repair_index(&self, segment: SegmentId) -> Result<(), StorageError> {
        FileStore::repair_index(self, segment)
    }

    fn remove_copy(&self, segment: SegmentId) -> Result<Option<u64>, StorageError> {
        FileStore::remove_copy(self, segment)
    }

    fn local_copies(&self) -> Result<Vec<SegmentId>, StorageError> {
        FileStore::local_copies(self)
    }

    fn copy_modified(&self, segment: SegmentId) -> Option<std::time::SystemTime> {
        FileStore::copy_modified(self, segment)
    }
}

impl Shared {
    fn wake(&self, seg: &Arc<Segment>, wake: Wake) {
        match wake {
            Wake::Nothing => {}
            Wake::Ready => {
                let mut sched = self.sched.lock();
                sched.ready.push_back(Arc::clone(seg));
                self.sched_cv.notify_one();
            }
            Wake::Timer(deadline) => {
                let mut sched = self.sched.lock();
                sched.seq += 1;
                let seq = sched.seq;
                sched.timers.push(TimerEntry {
                    deadline,
                    seq,
                    segment: Arc::clone(seg),
                });
                self.sched_cv.notify_one();
            }
        }
    }
}

/// Queues `batch` at the segment's end under its lock (offsets are
/// assigned here, so offset order is enqueue order) and returns its ticket
/// and whether a flush should start.
fn queue(cfg: &StoreConfig, st: &mut SegState, batch: Batch) -> (AppendTicket, Wake) {
    let first = st.next_offset;
    let records = batch.starts.len();
    st.next_offset += records as u64;
    if st.pending_records == 0 {
        st.pending_first_offset = first;
        st.pending_since = Some(Instant::now());
    }
    st.pending_bytes += batch.bytes.len();
    st.pending_records += records;
    st.pending.push(batch);
    let completion = Completion::new();
    st.pending_waiters.push(Arc::clone(&completion));
    let wake = decide(cfg, st, Instant::now());
    (AppendTicket::new(first..st.next_offset, completion), wake)
}

/// The stored end: durable records, clamped to the seal, whether committed
/// or not (what a primary ships and a copy compares).
fn stored_end(st: &SegState) -> (u64, u64) {
    match st.sealed {
        Some(seal) => (
            st.durable_offset.min(seal.length),
            st.durable_bytes.min(seal.byte_size),
        ),
        None => (st.durable_offset, st.durable_bytes),
    }
}

/// Checks a replica's run of frames: each decodes (magic, bounds, CRC,
/// structure), fits `record_bytes_max`, and carries the next offset from
/// `first`. Returns where each frame starts.
pub(crate) fn check_frames(
    segment: SegmentId,
    first: u64,
    frames: &[u8],
    cfg: &StoreConfig,
) -> Result<Vec<usize>, StorageError> {
    let mut starts = Vec::new();
    let mut at = 0usize;
    while at < frames.len() {
        let offset = first + starts.len() as u64;
        let bad = |reason| StorageError::BadFrames {
            segment,
            at_byte: at as u64,
            offset,
            reason,
        };
        let (view, len) = frame::decode(&frames[at..]).map_err(bad)?;
        if view.offset != offset {
            return Err(bad(FrameError::OffsetMismatch {
                found: view.offset,
                expected: offset,
            }));
        }
        let payload = len - frame::FRAME_HEADER_BYTES;
        if payload > cfg.record_bytes_max {
            return Err(StorageError::RecordTooLarge {
                record_bytes: payload,
                record_bytes_max: cfg.record_bytes_max,
            });
        }
        if starts.len() == cfg.batch_records_max {
            return Err(StorageError::BatchTooLarge {
                records: starts.len() + 1,
                bytes: frames.len(),
                records_max: cfg.batch_records_max,
                bytes_max: cfg.pending_bytes_max,
            });
        }
        starts.push(at);
        at += len;
    }
    Ok(starts)
}

/// Where a quarantined copy's loss ends: past the last valid frame found
/// after the damage, past the `durable_below` it carries (records below it
/// were acknowledged), and at the seal if the copy has one.
fn quarantine_end(
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

/// The readable end: durable records, clamped to the seal and, on a
/// replicated copy, to the committed end.
fn readable_end(st: &SegState) -> (u64, u64) {
    match st.sealed {
        Some(seal) => (
            st.durable_offset.min(seal.length),
            st.durable_bytes.min(seal.byte_size),
        ),
        // Bytes stay the durable ones: a read stops at the offset anyway.
        None => (
            st.committed
                .map_or(st.durable_offset, |c| c.min(st.durable_offset)),
            st.durable_bytes,
        ),
    }
}

/// Like [`check_writable`], but a fence does not stop repair.
fn check_repairable(segment: SegmentId, st: &SegState) -> Result<(), StorageError> {
    if let Some(reason) = &st.failed {
        return Err(StorageError::Failed {
            segment,
            reason: reason.clone(),
        });
    }
    if let Some(seal) = st.sealed {
        return Err(StorageError::Sealed {
            segment,
            length: seal.length,
        });
    }
    Ok(())
}

fn check_writable(segment: SegmentId, st: &SegState) -> Result<(), StorageError> {
    if let Some(reason) = &st.failed {
        return Err(StorageError::Failed {
            segment,
            reason: reason.clone(),
        });
    }
    if let Some(seal) = st.sealed {
        return Err(StorageError::Sealed {
            segment,
            length: seal.length,
        });
    }
    if st.fenced {
        return Err(StorageError::Fenced { segment });
    }
    Ok(())
}

/// Decides, under the segment lock, whether its pending bytes should be
/// flushed now, on a timer, or left to the flush in flight.
fn decide(cfg: &StoreConfig, st: &mut SegState, now: Instant) -> Wake {
    if !can_take(cfg, st) || st.pending_records == 0 || st.failed.is_some() {
        return Wake::Nothing;
    }
    let interval = Duration::from_millis(cfg.flush_interval_ms);
    let deadline = st.pending_since.unwrap_or(now) + interval;
    let due = cfg.flush_interval_ms == 0
        || st.force_flush
        || st.pending_records >= cfg.flush_records_max
        || st.pending_bytes >= cfg.flush_bytes_max
        || deadline <= now;
    if due {
        if st.ready_queued {
            return Wake::Nothing;
        }
        st.ready_queued = true;
        Wake::Ready
    } else if st.timer_armed {
        Wake::Nothing
    } else {
        st.timer_armed = true;
        Wake::Timer(deadline)
    }
}

/// Whether a new flush may start: nothing is writing and a slot is free.
fn can_take(cfg: &StoreConfig, st: &SegState) -> bool {
    !st.writing && free_slot(cfg, st).is_some()
}

fn free_slot(cfg: &StoreConfig, st: &SegState) -> Option<usize> {
    (0..cfg.flush_pipeline_depth).find(|slot| st.slots_busy & (1 << slot) == 0)
}

fn sync_worker(shared: &Shared) {
    loop {
        let (seg, source) = {
            let mut sched = shared.sched.lock();
            loop {
                if let Some(seg) = sched.ready.pop_front() {
                    break (seg, FlushSource::Ready);
                }
                let now = Instant::now();
                match sched.timers.peek().map(|t| t.deadline) {
                    Some(deadline) if deadline <= now => {
                        if let Some(entry) = sched.timers.pop() {
                            break (entry.segment, FlushSource::Timer);
                        }
                    }
                    Some(deadline) => {
                        if sched.shutdown {
                            return;
                        }
                        shared.sched_cv.wait_for(&mut sched, deadline - now);
                    }
                    None => {
                        if sched.shutdown {
                            return;
                        }
                        shared.sched_cv.wait(&mut sched);
                    }
                }
            }
        };
        flush(shared, &seg, source);
    }
}

struct Taken {
    batches: Vec<Batch>,
    /// The partial last block's bytes (direct writes only).
    head: Vec<u8>,
    seq: u64,
    slot: usize,
    records: u64,
    bytes: u64,
    first: u64,
    position: u64,
    durable_below: u64,
    /// An earlier flush of this file was still syncing when this one was taken.
    overlapped: bool,
}

/// Who runs a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlushSource {
    /// A sync thread, for a segment it took from the ready queue.
    Ready,
    /// A sync thread, for a segment whose flush timer fired.
    Timer,
    /// A caller blocked in `AppendTicket::wait` on an idle segment, which
    /// flushes itself rather than wait for a sync thread to wake up.
    Helper,
}

/// One group commit of one file: one vectored write and one fdatasync,
/// pipelined behind up to `flush_pipeline_depth - 1` earlier ones.
fn flush(shared: &Shared, seg: &Arc<Segment>, source: FlushSource) {
    let cfg = &shared.config;
    let taken = {
        let mut st = seg.state.lock();
        match source {
            FlushSource::Timer => st.timer_armed = false,
            FlushSource::Ready => st.ready_queued = false,
            FlushSource::Helper => {}
        }
        if st.pending_records == 0 || st.failed.is_some() {
            return;
        }
        let (false, Some(slot)) = (st.writing, free_slot(cfg, &st)) else {
            return;
        };
        // Nothing is writing, so a busy slot is an earlier flush in its sync.
        let overlapped = st.slots_busy != 0;
        st.writing = true;
        st.slots_busy |= 1 << slot;
        st.force_flush = false;
        st.pending_since = None;
        let seq = st.flush_seq;
        st.flush_seq += 1;
        let taken = Taken {
            batches: std::mem::take(&mut st.pending),
            head: std::mem::take(&mut st.tail_block),
            seq,
            slot,
            records: st.pending_records as u64,
            bytes: st.pending_bytes as u64,
            first: st.pending_first_offset,
            position: st.written_bytes,
            // A replicated copy's frames carry the committed end, which is
            // the same on every copy that writes them (ADR 0094).
            durable_below: st
                .committed
                .map_or(st.durable_offset, |c| c.min(st.durable_offset)),
            overlapped,
        };
        let waiters = std::mem::take(&mut st.pending_waiters);
        st.inflight.push_back(InFlight {
            seq,
            first: taken.first,
            records: taken.records,
            position: taken.position,
            bytes: taken.bytes,
            waiters,
            outcome: None,
        });
        st.pending_records = 0;
        st.pending_bytes = 0;
        taken
    };
    if taken.overlapped {
        shared.stats.lock().flushes_overlapped += 1;
    }
    let Taken {
        mut batches,
        head,
        seq,
        slot,
        records,
        bytes,
        first,
        position,
        durable_below,
        overlapped: _,
    } = taken;
    // The trailers are filled in here, once the flush is known:
    // durable_below (the durable end when this flush was taken) is what lets
    // recovery tell this flush's torn pages, or a pipelined neighbour's,
    // from damage to a flush that was already durable. The appenders
    // already checksummed the bodies, so this costs 16 bytes of CRC a frame.
    let mut offset = first;
    for batch in &mut batches {
        if batch.is_verbatim() {
            // Checked frame by frame when it was queued.
            offset += batch.starts.len() as u64;
            continue;
        }
        for (i, &start) in batch.starts.iter().enumerate() {
            let end = batch
                .starts
                .get(i + 1)
                .copied()
                .unwrap_or(batch.bytes.len());
            let body_crc = batch.body_crcs[i].clone();
            frame::seal_frame(
                &mut batch.bytes[start..end],
                offset,
                durable_below,
                body_crc,
            );
            if cfg!(debug_assertions) {
                // Pair the checksum written with one read back before the bytes leave.
                let decoded = frame::decode(&batch.bytes[start..end]).map(|(v, _)| v.offset);
                debug_assert_eq!(decoded, Ok(offset));
            }
            offset += 1;
        }
    }
    assert_eq!(offset, first + records, "pending record count out of step");
    let file = &seg.writers[slot];
    let mut written = if !seg.direct {
        write_batches(file, &batches, position).map(|()| None)
    } else if head.len() + bytes as usize >= cfg.direct_io_bytes_min {
        write_direct(shared, file, head, &batches, position, bytes).map(Some)
    } else {
        // A small flush costs little to copy through the page cache, and a
        // direct write of it would rewrite a whole block for a few records.
        write_batches(&seg.log, &batches, position).map(|()| {
            Some(direct::tail_of(
                &head,
                &batches_bytes(&batches),
                position + bytes,
            ))
        })
    };
    if written.is_ok() {
        // Writes are serialized, so index entries arrive in offset order.
        // Entries past the durable end are harmless: reads stop at it.
        let mut idx = seg.index.lock();
        let (mut offset, mut base) = (first, position);
        for batch in &batches {
            for &start in &batch.starts {
                idx.index.observe(offset, base + start as u64);
                offset += 1;
            }
            base += batch.bytes.len() as u64;
        }
        let new = idx.index.encode_from(idx.persisted);
        let at = (idx.persisted * crate::index::INDEX_ENTRY_BYTES) as u64;
        // The sidecar is derived data: a failed write only costs a rebuild.
        if let Err(e) = seg.idx.write_all_at(&new, at) {
            warn!(segment = seg.id.0, error = %e, "index sidecar write failed");
        } else {
            idx.persisted = idx.index.entries().len();
        }
    }
    drop(batches);
    let wake = {
        let mut st = seg.state.lock();
        st.writing = false;
        match &mut written {
            Ok(tail) => {
                assert_eq!(st.written_bytes, position, "flush writes out of order");
                st.written_bytes = position + bytes;
                if let Some(tail) = tail.take() {
                    st.tail_block = tail;
                }
            }
            // Latch before anyone can take a flush that would write after a gap.
            Err(e) => latch_failed(&mut st, seq, e),
        }
        // The next flush may write while this one syncs.
        decide(cfg, &mut st, Instant::now())
    };
    shared.wake(seg, wake);
    #[cfg(test)]
    {
        let hook = shared.sync_hook.lock().clone();
        if let Some(hook) = hook {
            (hook.0)(seg.id, seq);
        }
    }
    let result = written.and_then(|_| file.sync_data());
    complete(shared, seg, seq, slot, result);
}

/// Marks the segment failed from flush `seq` on: fsync errors cannot be
/// retried safely, so the copy takes no more appends.
fn latch_failed(st: &mut SegState, seq: u64, e: &io::Error) {
    if st.failed.is_none() {
        st.failed = Some(e.to_string());
    }
    st.failed_from_seq = Some(st.failed_from_seq.map_or(seq, |from| from.min(seq)));
}

/// Records a flush's outcome, frees its slot and publishes every flush at
/// the head of the pipeline whose outcome is known, in order.
fn complete(shared: &Shared, seg: &Arc<Segment>, seq: u64, slot: usize, result: io::Result<()>) {
    let (done, wake, published) = {
        let mut st = seg.state.lock();
        st.slots_busy &= !(1 << slot);
        let mut done = Vec::new();
        let outcome = match &result {
            Ok(()) => Ok(()),
            Err(e) => {
                error!(segment = seg.id.0, error = %e, seq, "flush failed; segment latched as failed");
                latch_failed(&mut st, seq, e);
                // Nothing pending will be written any more.
                let failed = StorageError::Failed {
                    segment: seg.id,
                    reason: e.to_string(),
                };
                done.push((std::mem::take(&mut st.pending_waiters), Err(failed)));
                st.pending.clear();
                st.pending_records = 0;
                st.pending_bytes = 0;
                Err(StorageError::io("flush log", &seg.log_path, clone_io(e)))
            }
        };
        let Some(entry) = st.inflight.iter_mut().find(|f| f.seq == seq) else {
            unreachable!("a flush stays in the pipeline until it is published");
        };
        entry.outcome = Some(outcome);
        let mut published = (0u64, 0u64, 0u64);
        while st.inflight.front().is_some_and(|f| f.outcome.is_some()) {
            let Some(f) = st.inflight.pop_front() else {
                break;
            };
            let mut outcome = f.outcome.unwrap_or(Err(StorageError::ShuttingDown));
            if outcome.is_ok() && st.failed_from_seq.is_some_and(|from| f.seq > from) {
                // Its own sync succeeded, but an earlier flush's data is lost:
                // durability is a prefix, so this one is not durable either.
                outcome = Err(StorageError::Failed {
                    segment: seg.id,
                    reason: st.failed.clone().unwrap_or_default(),
                });
            }
            if outcome.is_ok() {
                assert_eq!(f.first, st.durable_offset, "flushes published out of order");
                st.durable_offset = f.first + f.records;
                st.durable_bytes = f.position + f.bytes;
                published.0 += 1;
                published.1 += f.bytes;
                published.2 += f.records;
            }
            done.push((f.waiters, outcome));
        }
        let wake = decide(&shared.config, &mut st, Instant::now());
        seg.idle.notify_all();
        (done, wake, published)
    };
    if published.0 > 0 {
        let mut stats = shared.stats.lock();
        stats.flushes += published.0;
        stats.flushed_bytes += published.1;
        stats.flushed_records += published.2;
    }
    shared.wake(seg, wake);
    for (waiters, outcome) in done {
        for waiter in waiters {
            waiter.complete(outcome.clone());
        }
    }
}

/// Whether the bytes from `valid_bytes` to `file_len` are a direct write's
/// zero padding (see [`direct`]) rather than a torn or damaged tail.
fn padding_after(log: &File, valid_bytes: u64, file_len: u64) -> io::Result<bool> {
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
fn trim_padding(seg: &Segment) -> Result<(), StorageError> {
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

fn batches_bytes(batches: &[Batch]) -> Vec<&[u8]> {
    batches.iter().map(|b| b.bytes.as_slice()).collect()
}

fn align_down(position: u64) -> u64 {
    position / BLOCK_BYTES as u64 * BLOCK_BYTES as u64
}

/// Opens one writer per pipeline slot, with `O_DIRECT` when configured and
/// supported. Returns the writers and whether they are direct.
fn open_writers(path: &Path, cfg: &StoreConfig) -> Result<(Vec<File>, bool), StorageError> {
    let open = |direct: bool| {
        (0..cfg.flush_pipeline_depth)
            .map(|_| {
                let mut options = OpenOptions::new();
                options.write(true);
                if direct {
                    options.custom_flags(libc::O_DIRECT);
                }
                options.open(path)
            })
            .collect::<io::Result<Vec<File>>>()
    };
    if cfg.direct_io {
        match open(true) {
            Ok(writers) => return Ok((writers, true)),
            Err(e) if direct::unsupported(&e) => {
                warn!(path = %path.display(), "the file system refuses O_DIRECT; writing through the page cache");
            }
            Err(e) => return Err(StorageError::io("open log for direct writes", path, e)),
        }
    }
    let writers = open(false).map_err(|e| StorageError::io("open log for writing", path, e))?;
    Ok((writers, false))
}

/// Copies the partial last block's bytes and the batches into an aligned
/// buffer and writes it (see [`direct`]). Returns the new partial block.
fn write_direct(
    shared: &Shared,
    file: &File,
    head: Vec<u8>,
    batches: &[Batch],
    position: u64,
    bytes: u64,
) -> io::Result<Vec<u8>> {
    let base = position - head.len() as u64;
    assert_eq!(base, align_down(position), "partial block out of step");
    let mut buf = shared.buffers.lock().pop().unwrap_or_default();
    buf.reset(head.len() + bytes as usize);
    buf.extend_from_slice(&head);
    for batch in batches {
        buf.extend_from_slice(&batch.bytes);
    }
    let tail = direct::write_padded(file, &mut buf, base);
    if tail.is_ok() {
        shared.stats.lock().direct_bytes += buf.as_slice().len() as u64;
    }
    if buf.capacity() <= direct::POOLED_BUFFER_BYTES_MAX {
        let mut pool = shared.buffers.lock();
        if pool.len() < direct::POOLED_BUFFERS_MAX {
            pool.push(buf);
        }
    }
    tail
}

/// Writes the batches back to back at `position` with vectored writes.
/// Only the one flusher of a segment moves the file cursor; reads use pread.
fn write_batches(log: &File, batches: &[Batch], position: u64) -> io::Result<()> {
    let mut file = log;
    file.seek(SeekFrom::Start(position))?;
    let mut slices: Vec<IoSlice<'_>> = batches.iter().map(|b| IoSlice::new(&b.bytes)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let written = match file.write_vectored(rest) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "vectored write wrote nothing",
            ));
        }
        IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

fn clone_io(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

enum ReadAnomaly {
    Io(io::Error),
    Bad {
        position: u64,
        offset: u64,
        error: FrameError,
    },
}

impl From<io::Error> for ReadAnomaly {
    fn from(e: io::Error) -> Self {
        ReadAnomaly::Io(e)
    }
}

/// How much one read may hand out. `records_max == 0` only locates `from`.
#[derive(Debug, Clone, Copy)]
struct ReadBudget {
    records_max: usize,
    /// Frame bytes, counted after the first frame so one always fits.
    bytes_max: usize,
}

/// Scans from `hint`, checking that every frame carries the next offset, and
/// hands the frames from `from` on to `visit` within the budget, until it
/// breaks. Returns the position of `from` and how many frames were taken.
fn read_from(
    seg: &Segment,
    hint: IndexEntry,
    from: u64,
    (end_offset, end_bytes): (u64, u64),
    budget: ReadBudget,
    chunk: usize,
    visit: &mut dyn FnMut(&FrameView<'_>, u64, usize) -> ControlFlow<()>,
) -> Result<(u64, usize), ReadAnomaly> {
    debug_assert!(hint.offset <= from && from < end_offset);
    let mut reader = FrameReader::new(&seg.log, hint.position, end_bytes, chunk);
    let mut expected = hint.offset;
    let mut taken = 0usize;
    let mut bytes = 0usize;
    let mut from_position = None;
    let locate = budget.records_max == 0;
    while expected < end_offset && (locate || taken < budget.records_max) {
        match reader.next_frame()? {
            Next::End => {
                return Err(ReadAnomaly::Bad {
                    position: reader.position(),
                    offset: expected,
                    error: FrameError::Incomplete {
                        needed: 1,
                        available: 0,
                    },
                });
            }
            Next::Bad { position, error } => {
                return Err(ReadAnomaly::Bad {
                    position,
                    offset: expected,
                    error,
                });
            }
            Next::Frame {
                position,
                len,
                view,
            } => {
                if view.offset != expected {
                    return Err(ReadAnomaly::Bad {
                        position,
                        offset: expected,
                        error: FrameError::OffsetMismatch {
                            found: view.offset,
                            expected,
                        },
                    });
                }
                if expected >= from {
                    from_position.get_or_insert(position);
                    if locate || (taken > 0 && bytes + len > budget.bytes_max) {
                        break;
                    }
                    if visit(&view, position, len).is_break() {
                        break;
                    }
                    bytes += len;
                    taken += 1;
                }
                expected += 1;
            }
        }
    }
    let position = from_position.unwrap_or(reader.position());
    Ok((position, taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use std::sync::mpsc;

    /// A store whose syncs of flush `held` wait until the returned sender
    /// is dropped or sent to; `started` hears of every sync as it begins.
    fn store_holding_sync(
        dir: &Path,
        depth: usize,
        held: u64,
    ) -> (FileStore, mpsc::Sender<()>, mpsc::Receiver<u64>) {
        let store = FileStore::open_dir(
            dir,
            StoreConfig {
                flush_interval_ms: 0,
                flush_pipeline_depth: depth,
                sync_threads: 4,
                ..StoreConfig::default()
            },
        )
        .unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let (started_tx, started_rx) = mpsc::channel();
        let started_tx = Mutex::new(started_tx);
        *store.shared.sync_hook.lock() = Some(SyncHook(Arc::new(move |_, seq| {
            let _ = started_tx.lock().send(seq);
            if seq == held {
                let _ = release_rx.lock().recv();
            }
        })));
        (store, release_tx, started_rx)
    }

    fn records(n: u64) -> Vec<Record> {
        (0..n)
            .map(|i| Record::new(i, i.to_le_bytes(), vec![7u8; 100]))
            .collect()
    }

    #[test]
    fn a_flush_is_written_and_synced_while_the_previous_one_is_still_syncing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, release, started) = store_holding_sync(dir.path(), 2, 0);
        let seg = SegmentId(1);
        store.open(seg).unwrap();
        let first = store.append(seg, &records(3)).unwrap();
        assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(0));
        // Flush 0 is held in its sync: flush 1 must still be written and
        // reach its own sync, in the other pipeline slot.
        let second = store.append(seg, &records(2)).unwrap();
        assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(1));
        assert_eq!(store.stats().flushes_overlapped, 1);
        // Published in order: the second is not acked before the first.
        std::thread::sleep(Duration::from_millis(20));
        assert!(!second.is_complete() && !first.is_complete());
        assert_eq!(store.info(seg).unwrap().length, 0);
        release.send(()).unwrap();
        assert_eq!(first.wait().unwrap(), 0..3);
        assert_eq!(second.wait().unwrap(), 3..5);
        let stats = store.stats();
        assert_eq!((stats.flushes, stats.flushed_records), (2, 5));
        assert_eq!(store.info(seg).unwrap().length, 5);
    }

    #[test]
    fn without_pipelining_no_flush_starts_while_one_is_syncing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, release, started) = store_holding_sync(dir.path(), 1, 0);
        let seg = SegmentId(1);
        store.open(seg).unwrap();
        let first = store.append(seg, &records(3)).unwrap();
        assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(0));
        let second = store.append(seg, &records(2)).unwrap();
        assert!(started.recv_timeout(Duration::from_millis(200)).is_err());
        release.send(()).unwrap();
        assert_eq!(first.wait().unwrap(), 0..3);
        assert_eq!(started.recv_timeout(Duration::from_secs(10)), Ok(1));
        assert_eq!(second.wait().unwrap(), 3..5);
        assert_eq!(store.stats().flushes_overlapped, 0);
    }
}
