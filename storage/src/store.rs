//! The `SegmentStore` contract and the plain data it speaks in.

use std::fmt;
use std::ops::ControlFlow;

use crate::error::StorageError;
use crate::frame::FrameView;
#[cfg(doc)]
use crate::record::RecordParts;
use crate::record::{RecordBatch, StoredRecord};
use crate::scan::{BadFrame, LaterFrame};
use crate::ticket::AppendTicket;

/// A segment copy's identity within one store (one directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(pub u64);

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl SegmentId {
    /// The file stem: the id zero-padded to 20 digits, so names sort by id.
    pub fn file_stem(self) -> String {
        format!("{:020}", self.0)
    }
}

/// What a seal marker records: the sealed length and the bytes it spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealInfo {
    pub length: u64,
    pub byte_size: u64,
}

/// A snapshot of a segment copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub segment: SegmentId,
    /// Readable records: durable ones, clamped to the seal if sealed.
    pub length: u64,
    /// Bytes holding those records.
    pub byte_size: u64,
    /// Records durable on this copy, clamped to the seal: `length` unless
    /// the copy is replicated and holds records not yet committed.
    pub durable: u64,
    /// A replicated copy's committed end as last learned (`set_committed`);
    /// `None` for a copy nobody replicates, whose readers see `durable`.
    pub committed: Option<u64>,
    /// Offsets assigned so far, including appends not yet durable.
    pub assigned: u64,
    /// Physical length of the log file as the store last wrote it.
    pub stored_bytes: u64,
    pub sealed: Option<SealInfo>,
    pub fenced: bool,
    /// Set after a failed write or fdatasync: the copy takes no more appends.
    pub failed: bool,
    /// Records this copy should hold and cannot give: damage in the middle
    /// of the log (a quarantined copy) or a copy shorter than its seal.
    pub lost: Option<Loss>,
}

/// Records a copy should hold and cannot give back, offsets `from..to` of
/// the segment (ADR 0108): the first is the copy's readable end, so every
/// record below it is intact and readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub from: u64,
    pub to: u64,
}

impl Loss {
    /// Whether a read from `offset` reaches lost records.
    pub fn covers(&self, offset: u64) -> bool {
        (self.from..self.to).contains(&offset)
    }

    /// How many records are lost.
    pub fn records(&self) -> u64 {
        self.to.saturating_sub(self.from)
    }

    /// The loss grown to cover `other` too.
    pub fn union(self, other: Loss) -> Loss {
        Loss {
            from: self.from.min(other.from),
            to: self.to.max(other.to),
        }
    }
}

/// The epoch of a coordinator's data-plane order (fence, seal, repair;
/// ADR 0106): the vnode group that sent it and the raft term its leader
/// held. A copy remembers the newest it has seen, in its fence marker, and
/// refuses an order of the same group with an older term, so a deposed
/// coordinator cannot act on a copy its successor has reached. Orders of
/// another group (a vnode split moved the topic) are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Hash)]
pub struct OrderEpoch {
    pub group: u64,
    pub term: u64,
}

impl OrderEpoch {
    /// Whether this order is older than `seen`, the newest the copy took.
    pub fn is_stale_against(self, seen: OrderEpoch) -> bool {
        self.group == seen.group && self.term < seen.term
    }
}

/// What a fence order found, after the fence and a drain: nothing queued
/// before the fence becomes durable after this answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceInfo {
    /// Records durable on the copy, not clamped to any seal.
    pub durable: u64,
    pub durable_bytes: u64,
    pub sealed: Option<SealInfo>,
    /// The newest order epoch the copy has taken (this one, or a newer
    /// one of another group).
    pub order: OrderEpoch,
    /// The copy's disk failed: its durable records still count (and can be
    /// read), but it takes no repair.
    pub failed: bool,
}

/// Whole frames as they lie in a log: `records` frames from offset `first`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRun {
    pub first: u64,
    pub records: u64,
    pub bytes: Vec<u8>,
}

/// What `open` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub info: SegmentInfo,
    /// Bytes of a torn last flush removed from the end of the log.
    pub truncated_bytes: u64,
    /// The sidecar index was missing or disagreed with the log and was rewritten.
    pub index_rebuilt: bool,
    /// A sealed copy was shorter than its seal: it holds `info.length` records.
    pub short_of_seal: bool,
    /// The log file did not exist: it was created empty. For a copy the
    /// metadata records as holding records, that is a missing copy.
    pub log_missing: bool,
}

/// The result of `verify`: a read-only scan that repairs nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub segment: SegmentId,
    /// Records in the valid prefix.
    pub records: u64,
    pub valid_bytes: u64,
    pub scanned_bytes: u64,
    pub first_bad: Option<BadFrame>,
    /// The first valid frame after `first_bad`.
    pub valid_after: Option<LaterFrame>,
    /// A valid frame after `first_bad` written by a later flush (damage).
    pub later_flush: Option<LaterFrame>,
    /// Sidecar entries that do not land on a frame with the offset they claim.
    pub index_entries_bad: u64,
}

impl VerifyReport {
    /// No bad frame and no bad index entry.
    pub fn is_clean(&self) -> bool {
        self.first_bad.is_none() && self.index_entries_bad == 0
    }
}

/// The storage layer's contract. Implementations must be safe to share
/// between threads; `append` must not block on I/O (it returns a ticket).
pub trait SegmentStore: Send + Sync + fmt::Debug {
    /// Opens a segment copy, creating it if absent, or recovers it after a
    /// crash: a torn tail is truncated, damage in the middle is an error.
    fn open(&self, segment: SegmentId) -> Result<Recovery, StorageError>;

    /// Opens a copy [`open`](Self::open) refuses as `Damaged`, in
    /// quarantine (ADR 0108): nothing on disk is changed, the copy is
    /// latched failed (it takes no appends and no repair), its readable end
    /// is the intact prefix before the first bad frame, and the records from
    /// there to the last valid frame after the damage (at least the
    /// `durable_below` that frame carries) are reported lost in
    /// [`SegmentInfo::lost`]. A read that reaches them is `Lost`. A copy that
    /// opens cleanly opens as `open` would.
    fn open_quarantined(&self, segment: SegmentId) -> Result<Recovery, StorageError>;

    /// Checks an open copy against the seal the metadata recorded: a copy
    /// holding fewer than `length` records (short, or its log deleted) has
    /// the records it lacks recorded lost, so a read of them is `Lost` and
    /// never a silent short read. Returns the copy's loss, if any.
    fn check_seal(&self, segment: SegmentId, length: u64) -> Result<Option<Loss>, StorageError>;

    /// Appends a batch. Offsets are assigned at once and are contiguous; the
    /// ticket completes after the fdatasync that covers the batch.
    /// Records are anything that can lend its parts ([`RecordParts`]) in a
    /// [`RecordBatch`] (a `Vec`, an array, a `&[R]`), and are framed
    /// (copied) before this returns.
    fn append(
        &self,
        segment: SegmentId,
        records: &dyn RecordBatch,
    ) -> Result<AppendTicket, StorageError>;

    /// A ticket that completes when everything appended so far is durable.
    fn sync(&self, segment: SegmentId) -> Result<AppendTicket, StorageError>;

    /// Reads durable records from `from`, at most `records_max` of them and,
    /// after the first, at most `bytes_max` frame bytes in total.
    fn read(
        &self,
        segment: SegmentId,
        from: u64,
        records_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<StoredRecord>, StorageError> {
        let mut out = Vec::new();
        self.read_with(segment, from, records_max, bytes_max, &mut |view| {
            out.push(StoredRecord {
                offset: view.offset,
                record: view.to_record(),
            });
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Reads like `read`, but lends each record to `visit` as a view of the
    /// store's read buffer (its CRC already checked), so a caller that
    /// re-encodes records, such as a fetch building a wire block, copies each
    /// byte once and allocates nothing per record. Views arrive in offset
    /// order with no gap. `visit` returns `Break` to refuse a record and stop;
    /// the result is how many records it took.
    fn read_with(
        &self,
        segment: SegmentId,
        from: u64,
        records_max: usize,
        bytes_max: usize,
        visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
    ) -> Result<usize, StorageError>;

    /// Appends a replica's run of finished frames (a primary's bytes, from
    /// its [`read_frames`](Self::read_frames)) verbatim at `first`, which
    /// must be the copy's end: anything else is `NotAtEnd` (a gap or an
    /// overlap). Every frame is checked (magic, bounds, CRC, structure,
    /// consecutive offsets from `first`) before any byte is queued; a bad run
    /// is refused whole with `BadFrames`. The ticket completes after the
    /// fdatasync that covers the run.
    fn append_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
    ) -> Result<AppendTicket, StorageError>;

    /// Catch-up of a copy short of its seal: appends a replica's frames as
    /// [`append_frames`](Self::append_frames) does, and on a fenced copy too
    /// (a fence stops new appends, not repair), but never past `seal_length`
    /// (`PastSeal`) and never to a copy already sealed (`Sealed`: it is
    /// whole).
    fn repair_frames(
        &self,
        segment: SegmentId,
        first: u64,
        frames: &[u8],
        seal_length: u64,
    ) -> Result<AppendTicket, StorageError>;

    /// Reads durable frames from `from` as the bytes on disk (whether
    /// committed or not), at most `bytes_max` of them unless one frame alone
    /// is larger; each frame's CRC is checked after the read.
    fn read_frames(
        &self,
        segment: SegmentId,
        from: u64,
        bytes_max: usize,
    ) -> Result<FrameRun, StorageError>;

    /// Marks the copy replicated and raises its committed end to `end`
    /// (never lowers it). Readers then see only records below the committed
    /// end, and a primary's later flushes carry it as `durable_below` (ADR
    /// 0094). A sealed copy keeps its seal. Returns the committed end.
    fn set_committed(&self, segment: SegmentId, end: u64) -> Result<u64, StorageError>;

    /// Fences, waits for in-flight appends, and records a seal at `length`
    /// records. Reads are clamped to it even if the copy holds more.
    fn seal(&self, segment: SegmentId, length: u64) -> Result<SealInfo, StorageError>;

    /// Refuses all further appends, persistently.
    fn fence(&self, segment: SegmentId) -> Result<(), StorageError>;
    /// A coordinator's fence order: refuses `StaleOrder` if the copy took
    /// a newer order of the same group; otherwise records `order` in the
    /// fence marker (fsynced), fences, waits until nothing is in flight, and
    /// reports the durable end. Idempotent; works on a sealed copy too.
    fn fence_order(&self, segment: SegmentId, order: OrderEpoch)
    -> Result<FenceInfo, StorageError>;

    /// The newest order epoch the copy has taken (the default before any).
    fn order_epoch(&self, segment: SegmentId) -> Result<OrderEpoch, StorageError>;

    /// Cuts a copy just opened back to its first `length` records: the
    /// layer above found the end of the log inside one append's batch,
    /// which only a write torn by a crash leaves (the batch was one write,
    /// none of it was synced, so none of it was acknowledged), and drops
    /// that prefix as recovery drops a torn frame. Refused
    /// (`NotTruncatable`) once anything was appended after the open, on a
    /// sealed, fenced, failed or replicated copy, and past the durable end.
    fn truncate_tail(&self, segment: SegmentId, length: u64) -> Result<SegmentInfo, StorageError>;

    /// Settles a sealed copy that holds more than its seal (the seed's
    /// SealedOverrun: a writer's tail past the seal another copy's failover
    /// decided): cuts the log back to the seal's bytes, durably, so the copy
    /// is its seal and nothing more. Returns the bytes cut (0 when there was
    /// no overrun). Refused (`NotTruncatable`) on a copy that is not sealed.
    fn cut_to_seal(&self, segment: SegmentId) -> Result<u64, StorageError>;

    /// Scans the copy read-only and reports the first bad frame.
    fn verify(&self, segment: SegmentId) -> Result<VerifyReport, StorageError>;

    /// The copy's stored length and byte size.
    fn info(&self, segment: SegmentId) -> Result<SegmentInfo, StorageError>;

    /// Flushes what is pending and forgets the segment.
    fn close(&self, segment: SegmentId) -> Result<(), StorageError>;

    // Copies as wholes, open or not: what the broker's maintenance (status,
    // scrub, healing, removal, producer state) asks of a store without
    // naming its files (ADR 0131).

    /// The bytes of `segment`'s log at rest, `None` when there is no copy
    /// (never written, removed, or set aside).
    fn copy_bytes(&self, segment: SegmentId) -> Result<Option<u64>, StorageError>;

    /// Whether the store holds a copy of `segment` (its log exists).
    fn has_copy(&self, segment: SegmentId) -> bool {
        matches!(self.copy_bytes(segment), Ok(Some(_)))
    }

    /// Whether the copy's seal is recorded at rest (its seal marker), open
    /// or not.
    fn has_seal_marker(&self, segment: SegmentId) -> bool;

    /// The seal recorded at rest (its seal marker), open or not; `None`
    /// when the copy has none. A marker that does not decode is an error.
    fn seal_at_rest(&self, segment: SegmentId) -> Result<Option<SealInfo>, StorageError>;

    /// The bytes the layer above keeps beside a copy (the broker's producer
    /// state, ADR 0092), `None` when none were written. The store never
    /// interprets them; [`remove_copy`](Self::remove_copy) removes them.
    fn read_sidecar(&self, segment: SegmentId) -> Result<Option<Vec<u8>>, StorageError>;

    /// Replaces the sidecar of `segment` atomically and durably.
    fn write_sidecar(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), StorageError>;

    /// Sets a broken copy aside to be rebuilt from another (ADR 0110):
    /// closes it and moves its log and seal away, so the next `open` starts
    /// an empty copy; the newest order epoch it took is kept. The first copy
    /// set aside is kept until [`discard_aside`](Self::discard_aside); a
    /// later one is deleted. Returns whether anything was moved.
    fn set_aside(&self, segment: SegmentId) -> Result<bool, StorageError>;

    /// Whether a copy of `segment` is set aside.
    fn is_aside(&self, segment: SegmentId) -> bool;

    /// Deletes the copy set aside, once its rebuild is whole; returns the
    /// bytes freed.
    fn discard_aside(&self, segment: SegmentId) -> Result<u64, StorageError>;

    /// Rewrites the copy's derived index from its log (a store without one
    /// has nothing to do).
    fn repair_index(&self, segment: SegmentId) -> Result<(), StorageError>;

    /// Removes everything of `segment`'s copy for good, crash-safely,
    /// closing it first; returns the bytes freed, or `None` when there was
    /// no copy to remove (removed before, or by a removal that ran at the
    /// same time: only one of two removals at once removes it).
    fn remove_copy(&self, segment: SegmentId) -> Result<Option<u64>, StorageError>;

    /// The segments the store holds anything of (open or not, set aside or
    /// not), in id order.
    fn local_copies(&self) -> Result<Vec<SegmentId>, StorageError>;

    /// When anything of `segment`'s copy last changed.
    fn copy_modified(&self, segment: SegmentId) -> Option<std::time::SystemTime>;
}

/// Why a segment should roll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealReason {
    Size,
    Age,
    Failure,
}

/// When to seal the active segment and roll to a new one. A pure function of
/// its inputs: the caller passes the time, the store reads no clock for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealPolicy {
    pub segment_bytes_max: u64,
    pub segment_age_ms: u64,
}

impl Default for SealPolicy {
    fn default() -> Self {
        SealPolicy {
            segment_bytes_max: 1 << 30,
            segment_age_ms: 60 * 60 * 1000,
        }
    }
}

impl SealPolicy {
    /// `None` keeps the segment; otherwise the reason to roll. Failure wins
    /// because a failed copy takes no appends at all.
    pub fn decide(
        &self,
        info: &SegmentInfo,
        created_at_ms: u64,
        now_ms: u64,
    ) -> Option<SealReason> {
        if info.failed {
            Some(SealReason::Failure)
        } else if info.byte_size >= self.segment_bytes_max {
            Some(SealReason::Size)
        } else if now_ms.saturating_sub(created_at_ms) >= self.segment_age_ms {
            Some(SealReason::Age)
        } else {
            None
        }
    }
}

/// The deepest flush pipeline a segment may run: each slot holds one more
/// open descriptor of the log.
pub const FLUSH_PIPELINE_DEPTH_MAX: usize = 8;

/// Tunables of the file store. Every queue and batch is bounded by one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// How long the first pending record may wait before a flush starts;
    /// 0 flushes as soon as the previous sync of that file ends.
    pub flush_interval_ms: u64,
    /// A flush starts once this many records are pending.
    pub flush_records_max: usize,
    /// A flush starts once this many bytes are pending.
    pub flush_bytes_max: usize,
    /// Appends beyond this many pending bytes per segment get `Busy`.
    pub pending_bytes_max: usize,
    /// Largest frame payload a record may have.
    pub record_bytes_max: usize,
    /// Most records one append may carry.
    pub batch_records_max: usize,
    /// Threads that write and fdatasync; distinct files sync in parallel.
    pub sync_threads: usize,
    /// Flushes of one file that may be in flight at once: the next flush is
    /// written while earlier ones wait for their `fdatasync`, which overlaps
    /// the page-cache copy with the disk. 1 serializes write and sync.
    pub flush_pipeline_depth: usize,
    /// Write whole blocks with `O_DIRECT` (ADR 0012, 0013), skipping the
    /// kernel's page-cache copy; the partial last block is padded with zeros
    /// that the next flush overwrites. Falls back to buffered writes where
    /// the file system refuses `O_DIRECT`.
    pub direct_io: bool,
    /// Smaller flushes go through the page cache even with `direct_io`.
    pub direct_io_bytes_min: usize,
    /// About one index entry per this many log bytes.
    pub index_interval_bytes: u64,
    /// Read buffer size for scans and reads.
    pub read_chunk_bytes: usize,
    /// Frames the store keeps in memory, over all copies, from what their
    /// flushes wrote, so a primary's shippers need not read them back
    /// (ADR 0161); each copy keeps at most 16 MiB. 0 keeps none.
    pub recent_bytes_max: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            flush_interval_ms: 10,
            flush_records_max: 20_000,
            flush_bytes_max: 10 << 20,
            pending_bytes_max: 64 << 20,
            record_bytes_max: 1 << 20,
            batch_records_max: 100_000,
            sync_threads: 16,
            flush_pipeline_depth: 2,
            direct_io: true,
            direct_io_bytes_min: 64 << 10,
            index_interval_bytes: 4096,
            read_chunk_bytes: 256 << 10,
            recent_bytes_max: 64 << 20,
        }
    }
}

impl StoreConfig {
    pub fn validate(&self) -> Result<(), StorageError> {
        let bad = |reason| Err(StorageError::Config { reason });
        if self.flush_records_max == 0 || self.flush_bytes_max == 0 {
            return bad("flush_records_max and flush_bytes_max must be positive");
        }
        if self.record_bytes_max == 0
            || self.record_bytes_max > crate::frame::FRAME_PAYLOAD_BYTES_MAX
        {
            return bad("record_bytes_max must be between 1 and the format's 64 MiB");
        }
        if self.pending_bytes_max < self.record_bytes_max + crate::frame::FRAME_HEADER_BYTES {
            return bad("pending_bytes_max must hold at least one record");
        }
        if self.batch_records_max == 0 || self.sync_threads == 0 || self.index_interval_bytes == 0 {
            return bad(
                "batch_records_max, sync_threads and index_interval_bytes must be positive",
            );
        }
        if !(1..=FLUSH_PIPELINE_DEPTH_MAX).contains(&self.flush_pipeline_depth) {
            return bad("flush_pipeline_depth must be between 1 and 8");
        }
        if self.read_chunk_bytes < crate::frame::FRAME_BYTES_MIN {
            return bad("read_chunk_bytes must hold the smallest frame");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(byte_size: u64, failed: bool) -> SegmentInfo {
        SegmentInfo {
            segment: SegmentId(1),
            length: 0,
            byte_size,
            durable: 0,
            committed: None,
            assigned: 0,
            stored_bytes: byte_size,
            sealed: None,
            fenced: false,
            failed,
            lost: None,
        }
    }

    #[test]
    fn a_loss_covers_its_offsets_and_grows_by_union() {
        let loss = Loss { from: 3, to: 7 };
        assert!(!loss.covers(2));
        assert!(loss.covers(3) && loss.covers(6));
        assert!(!loss.covers(7));
        assert_eq!(loss.records(), 4);
        assert_eq!(loss.union(Loss { from: 5, to: 9 }), Loss { from: 3, to: 9 });
    }

    #[test]
    fn seal_policy_rolls_by_size_age_and_failure() {
        let p = SealPolicy::default();
        assert_eq!(p.decide(&info(10, false), 0, 1), None);
        assert_eq!(
            p.decide(&info(1 << 30, false), 0, 1),
            Some(SealReason::Size)
        );
        assert_eq!(
            p.decide(&info(10, false), 0, 3_600_000),
            Some(SealReason::Age)
        );
        assert_eq!(
            p.decide(&info(1 << 30, true), 0, 3_600_000),
            Some(SealReason::Failure)
        );
    }

    #[test]
    fn default_config_is_valid_and_matches_the_documented_triggers() {
        let c = StoreConfig::default();
        c.validate().unwrap();
        assert_eq!(
            (c.flush_interval_ms, c.flush_records_max, c.flush_bytes_max),
            (10, 20_000, 10 << 20)
        );
    }

    #[test]
    fn config_with_zero_sync_threads_is_refused() {
        let c = StoreConfig {
            sync_threads: 0,
            ..StoreConfig::default()
        };
        assert!(matches!(c.validate(), Err(StorageError::Config { .. })));
    }
}
