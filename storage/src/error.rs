//! The crate's one error type. Errors are `Clone` because a single failed
//! flush has to be reported to every appender whose bytes it carried.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::frame::FrameError;
use crate::store::SegmentId;
/// Everything that can go wrong in the storage layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// An operating-system call failed.
    #[error("i/o error during {op} on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    /// The segment was never opened in this store, or was closed.
    #[error("segment {segment} is not open")]
    NotOpen { segment: SegmentId },
    /// Appends are refused because the copy was fenced.
    #[error("segment {segment} is fenced and takes no appends")]
    Fenced { segment: SegmentId },
    /// Appends are refused because the copy was sealed.
    #[error("segment {segment} is sealed at {length} records and takes no appends")]
    Sealed { segment: SegmentId, length: u64 },
    /// A write or fdatasync failed earlier; the copy must be sealed elsewhere.
    #[error("segment {segment} failed and takes no appends: {reason}")]
    Failed { segment: SegmentId, reason: String },
    /// Backpressure: too many bytes wait for a flush on this segment.
    #[error(
        "segment {segment} has {pending_bytes} bytes pending, the limit is {pending_bytes_max}"
    )]
    Busy {
        segment: SegmentId,
        pending_bytes: usize,
        pending_bytes_max: usize,
    },
    /// A record is larger than `record_bytes_max` (checked before allocating).
    #[error("record of {record_bytes} payload bytes exceeds record_bytes_max {record_bytes_max}")]
    RecordTooLarge {
        record_bytes: usize,
        record_bytes_max: usize,
    },
    /// A batch has more records or bytes than one append may carry.
    #[error(
        "batch of {records} records and {bytes} bytes exceeds the limits ({records_max} records, {bytes_max} bytes)"
    )]
    BatchTooLarge {
        records: usize,
        bytes: usize,
        records_max: usize,
        bytes_max: usize,
    },
    /// Recovery found a bad frame followed by frames of a later flush: the
    /// bytes after it may hold acknowledged records, so nothing was truncated.
    #[error(
        "segment {segment} is damaged at byte {position} (expected offset {offset}): {reason}; later valid frames start at byte {later_position}"
    )]
    Damaged {
        segment: SegmentId,
        position: u64,
        offset: u64,
        reason: FrameError,
        later_position: u64,
    },
    /// A read met a frame that does not decode where a record must be.
    #[error(
        "segment {segment} has a corrupt frame at byte {position} (expected offset {offset}): {reason}"
    )]
    Corrupt {
        segment: SegmentId,
        position: u64,
        offset: u64,
        reason: FrameError,
    },
    /// A read reached records the copy should hold and cannot give: it is
    /// damaged past `from` or shorter than its seal (ADR 0108).
    #[error("segment {segment} lost records {from}..{to}: {reason}")]
    Lost {
        segment: SegmentId,
        from: u64,
        to: u64,
        reason: String,
    },
    /// A replica append did not start at the copy's end: `first > end` is a
    /// gap, `first < end` an overlap. Nothing was written.
    #[error("segment {segment} ends at {end}: an append at {first} would leave a gap or overlap")]
    NotAtEnd {
        segment: SegmentId,
        first: u64,
        end: u64,
    },
    /// A replica append carried a frame that does not check (bad magic,
    /// length, CRC or structure, or the wrong offset). Nothing was written.
    #[error(
        "segment {segment}: replicated frame at byte {at_byte} of the run (offset {offset}) is invalid: {reason}"
    )]
    BadFrames {
        segment: SegmentId,
        at_byte: u64,
        offset: u64,
        reason: FrameError,
    },
    /// A read started past the readable end of the copy.
    #[error("offset {offset} is past the end {end} of segment {segment}")]
    OffsetOutOfRange {
        segment: SegmentId,
        offset: u64,
        end: u64,
    },
    /// A repair run would reach past the seal the copy is filled up to.
    #[error("segment {segment} is sealed at {seal} records; a run to {end} goes past it")]
    PastSeal {
        segment: SegmentId,
        end: u64,
        seal: u64,
    },
    /// The copy holds fewer durable records than the requested seal length.
    #[error("cannot seal segment {segment} at {requested} records: it holds {stored}")]
    SealBeyondEnd {
        segment: SegmentId,
        requested: u64,
        stored: u64,
    },
    /// A coordinator's order older than one the copy has taken.
    #[error("segment {segment} took order epoch {seen:?}; this order carries {order:?}")]
    StaleOrder {
        segment: SegmentId,
        seen: crate::store::OrderEpoch,
        order: crate::store::OrderEpoch,
    },
    /// The copy is already sealed at another length.
    #[error("segment {segment} is already sealed at {existing} records, not {requested}")]
    AlreadySealed {
        segment: SegmentId,
        existing: u64,
        requested: u64,
    },
    /// `truncate_tail` was asked for a copy it may not cut.
    #[error("cannot cut segment {segment} back to {length} records: {reason}")]
    NotTruncatable {
        segment: SegmentId,
        length: u64,
        reason: &'static str,
    },
    /// A seal marker exists but does not decode.
    #[error("invalid seal marker {path}: {reason}")]
    BadMarker { path: PathBuf, reason: &'static str },
    /// A configuration value is out of its allowed range.
    #[error("invalid storage configuration: {reason}")]
    Config { reason: &'static str },
    /// The store is closing and takes no more work.
    #[error("the store is shutting down")]
    ShuttingDown,
}

impl StorageError {
    /// Whether the volume ran out of space (`ENOSPC`), directly or as the
    /// cause a failed copy was latched with: the broker stops taking records
    /// rather than rolling onto the same full volume (ADR 0111).
    pub fn is_no_space(&self) -> bool {
        const ENOSPC: i32 = 28;
        match self {
            StorageError::Io { source, .. } => {
                source.raw_os_error() == Some(ENOSPC) || source.kind() == io::ErrorKind::StorageFull
            }
            // A latched failure keeps its cause as text only.
            StorageError::Failed { reason, .. } => reason.contains("(os error 28)"),
            _ => false,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}
