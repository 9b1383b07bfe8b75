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

mod aside;
mod commit;
mod cut;
mod reads;
mod recent;
mod recovery;
mod segment_store;

use commit::{FlushSource, align_down, decide, flush, open_writers, queue, sync_worker};
use recovery::trim_padding;

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
    /// Bytes `read_frames` served from the frames flushes kept in memory
    /// instead of reading the log (ADR 0161).
    pub frames_from_memory_bytes: u64,
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
    /// Bytes every copy's `recent` keeps, against `recent_bytes_max`.
    recent_bytes: Arc<std::sync::atomic::AtomicUsize>,
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
    /// The frames this copy's flushes wrote lately, for its shippers
    /// (`recent.rs`, ADR 0161).
    recent: recent::RecentFrames,
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
            recent_bytes: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
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

#[cfg(test)]
mod tests;
