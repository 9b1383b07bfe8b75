//! Reading a topic by cursor: each active range's read plan (sealed
//! ancestors oldest first, then the range itself), drained from the stored
//! segment copies within a record and byte budget.
//!
//! No budget may leave a reader with nothing while records wait for it: the
//! first record of a read is taken even if it alone is over the byte budget
//! (a fetch's `bytes_max`, a subscription's byte credit), within the room
//! of a response frame; one that does not fit even there is a typed error
//! ([`ReadError::RecordTooLarge`]), never an empty answer.
//!
//! Positions are range offsets (`segment.start_offset` plus the record's
//! offset within its segment), as the cursor codec validates them. A reader
//! of an active segment sees what the store holds durably: acknowledged
//! records only.

use std::collections::BTreeMap;

use malachi_core::cursor::{
    CURSOR_BODY_BYTES_MAX, CURSOR_KEY_ID_BYTES, CURSOR_TAG_BYTES, Position,
};
use malachi_core::model::{
    Band, MetadataState, NodeId, RangeId, ReadPlan, ReadSlice, SealRecord, SegmentId, SegmentSpan,
    position,
};
use std::ops::ControlFlow;
use std::sync::Arc;

use malachi_storage::{FrameView, SegmentStore, StorageError};
use malachi_wire::WireError;
use malachi_wire::batch::{BatchBuilder, BatchError, RecordRef, varint_bytes};
use malachi_wire::frame::RESPONSE_HEADER_BYTES;

use super::error::ServeError;
use super::remote::{RemoteChunk, RemoteChunkError};
use crate::common::metrics::BrokerMetrics;
use crate::data::damage::{CopyOf, open_copy};

/// What one read pass may take: at most `records_max` records and
/// `batch_bytes_max` block bytes (the first record excepted), read from the
/// store `read_chunk_records` at a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadBudget {
    pub records_max: u32,
    pub batch_bytes_max: usize,
    pub read_chunk_records: usize,
}

/// What one read pass produced.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub positions: BTreeMap<RangeId, Position>,
    pub records: u32,
    pub bytes: u64,
    /// The ranges whose read stopped at a segment this broker cannot read
    /// itself, at most one entry per range, in the plans' order: each
    /// range's position is where it stopped, and the records before it and
    /// the other ranges' are answered.
    pub blocked: Vec<Blocked>,
}

/// Where a read pass stopped because this broker cannot read a segment
/// itself: it holds no copy of it, or a copy short of its seal, lost or
/// broken. Another broker's copy serves it, through this one (`remote.rs`:
/// a sealed segment's frames up to its seal, ADR 0118; an active one's up
/// to its holder's readable end, ADR 0123).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}segment {segment} is not readable here from offset {offset}: {reason}; its copies are on brokers {holders:?}",
    range.map(|r| format!("range {} of the topic: ", r.0)).unwrap_or_default()
)]
pub(crate) struct Blocked {
    /// The range whose read stopped (`read_topic` names it).
    pub range: Option<RangeId>,
    pub segment: SegmentId,
    /// The range offset the read stopped at.
    pub offset: u64,
    /// The same position as a segment offset.
    pub from: u64,
    /// The segment's recorded length once sealed; `None` while active
    /// (then a holder's copy is read only up to its readable end).
    pub seal_length: Option<u64>,
    pub reason: &'static str,
    pub holders: Vec<u64>,
    /// This broker's copy failed a frame check on read (a bad CRC, say):
    /// what the check found. The read goes on from another holder, and
    /// the copy is marked damaged for its rebuild (issue 36).
    pub damage: Option<String>,
}

impl Blocked {
    /// What a client is told when nothing else can be answered: the
    /// retriable `not_leader` without a hint, with `retry_after_ms`, naming
    /// the range and segment (a hint to a holder would be wrong: a holder
    /// not serving the topic sends the client back here).
    pub(crate) fn refusal(self) -> ServeError {
        ServeError::Redirect(crate::control::placement::Redirect {
            code: malachi_wire::ErrorCode::NotLeader,
            message: self.to_string(),
            hint: None,
        })
    }
}

/// Why a read pass produced nothing to answer with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error(transparent)]
    Store(#[from] StorageError),
    /// A segment the read needs has no copy on this broker (or, sealed, this
    /// broker's copy is short of its seal or broken), and no holder served
    /// it: retriable, naming the range (ADR 0123).
    #[error(transparent)]
    NotHere(Blocked),
    /// The primary of an active segment has nothing past its committed end,
    /// which it has not yet settled with its copies since it reopened the
    /// segment: records acknowledged before may lie past it (ADR 0139).
    #[error(
        "segment {segment}'s committed end is not yet settled with a quorum of its copies since this broker reopened it; retry"
    )]
    Unsettled { segment: SegmentId },
    /// Frames a holder sent for a sealed segment failed their check when
    /// read again (ADR 0118).
    #[error(transparent)]
    Remote(#[from] RemoteChunkError),
    /// The records `from..to` of `range` (range offsets) are gone: the
    /// only copy that held them is damaged or missing (ADR 0108).
    #[error("range {range} lost records {from}..{to} (segment {segment}): {reason}")]
    Lost {
        range: RangeId,
        segment: SegmentId,
        from: u64,
        to: u64,
        reason: String,
    },
    /// The next record alone needs a larger block than a response frame has
    /// room for (it was stored under a larger `frame_bytes_max`, say).
    #[error(
        "record at offset {offset} of segment {segment} needs a block of {block_bytes} bytes; a response frame has room for {room_bytes}"
    )]
    RecordTooLarge {
        segment: SegmentId,
        offset: u64,
        block_bytes: usize,
        room_bytes: usize,
    },
}

impl ReadError {
    /// The refusal a client sees: a record too large for any response is
    /// `frame_too_large`, naming the frame it would need (its block plus
    /// `control_bytes`) and the limit.
    pub(crate) fn refusal(
        self,
        topic: &str,
        frame_bytes_max: usize,
        control_bytes: usize,
    ) -> ServeError {
        match self {
            ReadError::Store(e) => ServeError::Read(e),
            ReadError::Lost {
                range,
                segment,
                from,
                to,
                reason,
            } => ServeError::DataLoss {
                topic: topic.to_string(),
                range: range.0,
                segment,
                from,
                to,
                reason,
            },
            ReadError::NotHere(blocked) => blocked.refusal(),
            ReadError::Unsettled { segment } => ServeError::ReplicaQuorum {
                segment,
                reason: self.to_string(),
            },
            ReadError::Remote(_) => ServeError::Redirect(crate::control::placement::Redirect {
                code: malachi_wire::ErrorCode::NotLeader,
                message: self.to_string(),
                hint: None,
            }),
            ReadError::RecordTooLarge {
                segment,
                offset,
                block_bytes,
                room_bytes,
            } => {
                tracing::warn!(
                    %segment, offset, block_bytes, room_bytes, frame_bytes_max,
                    "a stored record is too large for a response frame; raise frame_bytes_max to read past it"
                );
                ServeError::Decode(WireError::FrameTooLarge {
                    declared_bytes: block_bytes.saturating_add(control_bytes),
                    frame_bytes_max,
                })
            }
        }
    }
}

/// Bytes a response's control map takes besides its cursor (field names,
/// string and map headers, a sequence number and flags), with slack.
const CONTROL_FIELDS_BYTES: usize = 1 << 10;
/// The most bytes one range's entry takes in a cursor body (a
/// `(range, Position::At { segment, offset })` entry of three u64 and the
/// variant's tag, with slack; a unit test checks it).
const CURSOR_POSITION_BYTES_MAX: usize = 48;
/// The most bytes a cursor body takes besides its positions and topic name.
const CURSOR_BODY_FIXED_BYTES: usize = 32;

/// The most bytes a response frame about `ranges` ranges of `topic` needs
/// besides its block: the frame header and a control map whose cursor has
/// one entry per range. A fetch or push keeps this much of
/// `frame_bytes_max` for them, so the frame it answers with always fits,
/// however many ranges the topic has.
pub(crate) fn response_control_bytes(topic: &str, ranges: usize) -> usize {
    let body = ranges
        .saturating_mul(CURSOR_POSITION_BYTES_MAX)
        .saturating_add(CURSOR_BODY_FIXED_BYTES + topic.len())
        .min(CURSOR_BODY_BYTES_MAX);
    // Version byte, key id, body and tag, in unpadded base64.
    let cursor = (1 + CURSOR_KEY_ID_BYTES + body + CURSOR_TAG_BYTES).div_ceil(3) * 4;
    RESPONSE_HEADER_BYTES + CONTROL_FIELDS_BYTES + cursor
}

fn store_id(segment: SegmentId) -> malachi_storage::SegmentId {
    malachi_storage::SegmentId(segment.0)
}

/// Which copies of the segments a read may touch this broker holds, from
/// the metadata (read under its lock with the plans), so the read path
/// never creates a copy this broker was never given, and opens a
/// replicated copy with its readers clamped to committed records.
#[derive(Debug, Clone, Default)]
pub(crate) struct LocalCopies {
    me: Option<NodeId>,
    replicas: BTreeMap<SegmentId, Vec<NodeId>>,
    /// Where a copy found damaged or short is counted (ADR 0108).
    metrics: Option<Arc<BrokerMetrics>>,
    /// This broker's copies of replicated segments the scrubber found
    /// broken: out of the read path until rebuilt (issue 21).
    broken: std::collections::BTreeSet<SegmentId>,
    /// Runs of sealed segments' frames read from their holders, at most one
    /// per segment (`remote.rs`, ADR 0118): consulted before this broker's
    /// own copy.
    remote: BTreeMap<SegmentId, RemoteChunk>,
    /// The recorded seals of the sealed segments, for the verdict on a
    /// copy found damaged on read.
    seals: BTreeMap<SegmentId, SealRecord>,
    /// Active segments this broker is the primary of whose committed end
    /// is not yet settled (reopened, a quorum of copies not yet heard): a
    /// read that finds nothing there cannot say the range ends there.
    unsettled: std::collections::BTreeSet<SegmentId>,
}

/// What this broker holds of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A copy nobody replicates: its readers see every durable record.
    Alone,
    /// One copy of several: its readers see committed records only.
    Replicated,
    /// No copy here.
    Elsewhere,
}

impl LocalCopies {
    /// Every segment of `plans` (and `active`), as broker `me` holds them.
    pub(crate) fn of(state: &MetadataState, plans: &[ReadPlan], me: NodeId) -> LocalCopies {
        let segments: Vec<_> = plans
            .iter()
            .flat_map(|plan| plan.slices.iter())
            .flat_map(|slice| slice.segments.iter())
            .filter_map(|span| state.segment(span.segment))
            .collect();
        LocalCopies {
            me: Some(me),
            replicas: segments
                .iter()
                .map(|segment| (segment.id, segment.replicas.clone()))
                .collect(),
            metrics: None,
            broken: Default::default(),
            remote: BTreeMap::new(),
            seals: segments
                .iter()
                .filter_map(|segment| Some((segment.id, segment.seal()?)))
                .collect(),
            unsettled: Default::default(),
        }
    }

    /// Marks the active replicated segments this broker is the primary of
    /// and whose committed end `settled` does not vouch for (ADR 0139).
    pub(crate) fn with_unsettled(mut self, settled: impl Fn(SegmentId) -> bool) -> LocalCopies {
        let me = self.me;
        self.unsettled = self
            .replicas
            .iter()
            .filter(|(id, replicas)| {
                replicas.len() > 1
                    && replicas.first() == me.as_ref()
                    && !self.seals.contains_key(id)
            })
            .map(|(id, _)| *id)
            .filter(|id| !settled(*id))
            .collect();
        self
    }

    /// Serves `chunk`'s records of its (sealed) segment from it: joined to
    /// the run of that segment held before if it starts where that one
    /// ends (a pass that read through one run reads on into the next), in
    /// its place otherwise.
    pub(crate) fn with_remote(mut self, chunk: RemoteChunk) -> LocalCopies {
        let segment = chunk.segment();
        let joined = match self.remote.remove(&segment) {
            Some(before) => before.join(chunk),
            None => chunk,
        };
        self.remote.insert(segment, joined);
        self
    }

    /// Counts the losses the reads find in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: &Arc<BrokerMetrics>) -> LocalCopies {
        self.metrics = Some(Arc::clone(metrics));
        self
    }

    /// Takes this broker's copies the scrubber found broken out of the read
    /// path, where another copy can serve (issue 21): a read that needs one
    /// is sent on, as for a copy short of its seal. A lone copy stays: its
    /// reader gets the loss, never a silent skip.
    pub(crate) fn without_broken(mut self, book: &crate::data::scrub::ScrubBook) -> LocalCopies {
        self.broken = self
            .replicas
            .keys()
            .copied()
            .filter(|id| self.held(*id) == Held::Replicated && book.is_broken(id.0))
            .collect();
        self
    }

    /// Whether a read of these plans may need an active segment's records
    /// from another broker (ADR 0123): its long poll is then woken by a
    /// timer too, as this broker's own appends do not signal them.
    pub(crate) fn reads_active_elsewhere(&self, plans: &[ReadPlan]) -> bool {
        plans
            .iter()
            .flat_map(|plan| plan.slices.iter())
            .flat_map(|slice| slice.segments.iter())
            .any(|span| span.end_offset.is_none() && self.held(span.segment) == Held::Elsewhere)
    }

    /// The copies of `topic`'s active segments, as broker `me` holds them.
    pub(crate) fn of_active(state: &MetadataState, topic: &str, me: NodeId) -> LocalCopies {
        LocalCopies::of(state, &active_plans(state, topic), me)
    }

    /// Every copy is held here and nobody replicates it (unit tests).
    #[cfg(test)]
    pub(crate) fn all_local() -> LocalCopies {
        LocalCopies::default()
    }

    /// The seal the metadata recorded for `segment`, if sealed.
    pub(crate) fn seal_of(&self, segment: SegmentId) -> Option<SealRecord> {
        self.seals.get(&segment).copied()
    }

    /// `taken` records read from `span`'s copy, unless none were and it is
    /// an active segment this broker leads with its committed end not yet
    /// settled since a reopen: then the read cannot say the range ends
    /// there, and is refused (ADR 0139).
    fn settled_read(&self, span: &SegmentSpan, taken: usize) -> Result<usize, ReadError> {
        if taken == 0 && span.end_offset.is_none() && self.unsettled.contains(&span.segment) {
            return Err(ReadError::Unsettled {
                segment: span.segment,
            });
        }
        Ok(taken)
    }

    fn held(&self, segment: SegmentId) -> Held {
        let Some(me) = self.me else {
            return Held::Alone;
        };
        match self.replicas.get(&segment) {
            Some(replicas) if !replicas.contains(&me) => Held::Elsewhere,
            Some(replicas) if replicas.len() > 1 => Held::Replicated,
            // Unknown to the plans' metadata: a lone broker's own copy.
            _ => Held::Alone,
        }
    }

    fn holders(&self, segment: SegmentId) -> Vec<u64> {
        self.replicas
            .get(&segment)
            .map(|r| r.iter().map(|n| n.0).collect())
            .unwrap_or_default()
    }
}

/// Opens a copy for reading, if this broker holds one: `Ok(false)` when it
/// does not. A replicated copy of an active segment nobody has opened yet
/// (a follower's copy before its first replica-append since a restart)
/// shows no record until the primary tells it the committed end; one of a
/// sealed segment shows every record below the seal, which the metadata
/// records only once a quorum holds them.
fn open_for_read(
    store: &dyn SegmentStore,
    copies: &LocalCopies,
    segment: SegmentId,
    seal_length: Option<u64>,
) -> Result<bool, StorageError> {
    let metrics = copies.metrics.as_deref();
    let of = CopyOf::default();
    match copies.held(segment) {
        Held::Elsewhere => Ok(false),
        Held::Alone => {
            // The only copy: checked against the seal the metadata recorded,
            // so a short or missing one reports its loss (ADR 0108).
            open_copy(store, metrics, segment, seal_length, of)?;
            Ok(true)
        }
        Held::Replicated => {
            // One copy of several: one short of its seal is caught up from
            // another, so only damage is reported here, and what it lacks
            // (damage, or less than its own seal marker says) as a repair.
            let of = CopyOf {
                replicated: true,
                ..of
            };
            let recovery = open_copy(store, metrics, segment, None, of)?;
            match seal_length {
                Some(length) => {
                    store.set_committed(store_id(segment), length)?;
                }
                None if recovery.info.committed.is_none() => {
                    store.set_committed(store_id(segment), 0)?;
                }
                None => {}
            }
            Ok(true)
        }
    }
}

/// Reads a segment copy, opening it first if this broker has not yet (a
/// sealed segment after a restart). Returns how many records `visit` took:
/// none from an active segment this broker holds no copy of; a sealed one
/// it holds no usable copy of is read from a run of its frames a holder
/// sent (`LocalCopies::with_remote`), or else is [`ReadError::NotHere`].
fn read_copy(
    store: &dyn SegmentStore,
    copies: &LocalCopies,
    span: &SegmentSpan,
    from: u64,
    records_max: usize,
    bytes_max: usize,
    visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
) -> Result<usize, ReadError> {
    let segment = span.segment;
    let seal_length = span.end_offset.map(|end| end - span.start_offset);
    let blocked = |reason| {
        ReadError::NotHere(Blocked {
            range: None,
            segment,
            offset: span.start_offset + from,
            from,
            seal_length,
            reason,
            holders: copies.holders(segment),
            damage: None,
        })
    };
    // A segment's records a holder sent: only reads of a segment this
    // broker could not read itself fetch them.
    if let Some(chunk) = copies.remote.get(&segment) {
        if chunk.covers(from) {
            return Ok(chunk.visit(from, records_max, bytes_max, visit)?);
        }
        // An active segment's holder had nothing readable past `from` when
        // it answered: the read is at the range's end for now (ADR 0123).
        if seal_length.is_none() && chunk.reached_readable_end(from) {
            return Ok(0);
        }
    }
    if copies.broken.contains(&segment) {
        return Err(blocked("this copy failed its scrub and is being rebuilt"));
    }
    // A run from a holder further on (this copy failed a frame check
    // there): this copy is read only up to where the run starts.
    let records_max = match copies.remote.get(&segment) {
        Some(chunk) if chunk.first() > from => {
            records_max.min(usize::try_from(chunk.first() - from).unwrap_or(usize::MAX))
        }
        _ => records_max,
    };
    // The metadata names other holders: a file this broker still has of the
    // segment (a copy since moved away) is never what a reader gets.
    if copies.held(segment) == Held::Elsewhere {
        return Err(blocked(match seal_length {
            Some(_) => "no copy on this broker",
            None => "no copy of this active segment on this broker",
        }));
    }
    match store.read_with(store_id(segment), from, records_max, bytes_max, visit) {
        Err(StorageError::NotOpen { .. }) => {
            if !open_for_read(store, copies, segment, seal_length)? {
                // Never `Ok(0)` for an active segment held elsewhere: that
                // was a silent end of the range short of its committed
                // records (issue 36). Its holder is read through this
                // broker (`remote.rs`), or the read says it cannot.
                return Err(blocked("no copy on this broker"));
            }
            lost_elsewhere(
                copies,
                span,
                from,
                store.read_with(store_id(segment), from, records_max, bytes_max, visit),
            )
        }
        other => lost_elsewhere(copies, span, from, other),
    }
}

/// A read from past this copy's readable end (chaos finding F5). Cursors
/// are minted from what some copy served, so this is never a bad request:
/// a replicated copy is behind the copy that served it (a primary just
/// restarted, whose committed end is 0 until its followers answer again,
/// or a follower whose primary has not yet told it the committed end).
/// Of an active segment, nothing is readable here yet: the read takes no
/// record and a fetch long-polls from the same position. Of a sealed one,
/// the copy is short of its seal: another copy serves the read. A lone
/// copy past whose end a cursor points lost the records between (ADR 0108).
fn past_end(
    copies: &LocalCopies,
    span: &SegmentSpan,
    from: u64,
    end: u64,
) -> Result<usize, ReadError> {
    match (copies.held(span.segment), span.end_offset) {
        // Offsets within the segment: `read_topic` names the range.
        (Held::Alone, _) => Err(ReadError::Store(StorageError::Lost {
            segment: store_id(span.segment),
            from: end,
            to: span
                .end_offset
                .map_or(from, |seal_end| seal_end - span.start_offset),
            reason: "the copy ends before a position a reader was given".to_string(),
        })),
        (_, None) => {
            tracing::debug!(
                segment = %span.segment, from, end,
                "a cursor is past this copy's committed end; nothing to read here yet"
            );
            Ok(0)
        }
        (_, Some(seal_end)) => Err(ReadError::NotHere(Blocked {
            range: None,
            segment: span.segment,
            offset: span.start_offset + from,
            from,
            seal_length: Some(seal_end - span.start_offset),
            reason: "this copy is short of its seal",
            holders: copies.holders(span.segment),
            damage: None,
        })),
    }
}

/// A replicated copy's lost records are served by another copy; a lone
/// copy's are the caller's to report.
fn lost_elsewhere(
    copies: &LocalCopies,
    span: &SegmentSpan,
    from: u64,
    read: Result<usize, StorageError>,
) -> Result<usize, ReadError> {
    match read {
        Err(StorageError::OffsetOutOfRange { offset, end, .. }) => {
            past_end(copies, span, offset, end)
        }
        // A frame of this copy failed its check as it was read: another
        // copy serves the read at once, and the caller marks this one
        // damaged for its rebuild (issue 36). A lone copy's damage is the
        // reader's loss to hear of, never a silent skip.
        Err(e @ StorageError::Corrupt { .. }) if copies.held(span.segment) == Held::Replicated => {
            Err(ReadError::NotHere(Blocked {
                range: None,
                segment: span.segment,
                offset: span.start_offset + from,
                from,
                seal_length: span.end_offset.map(|end| end - span.start_offset),
                reason: "this copy failed a frame check on read",
                holders: copies.holders(span.segment),
                damage: Some(e.to_string()),
            }))
        }
        Err(StorageError::Lost { .. }) if copies.held(span.segment) == Held::Replicated => {
            Err(ReadError::NotHere(Blocked {
                range: None,
                segment: span.segment,
                offset: span.start_offset + from,
                from,
                seal_length: span.end_offset.map(|end| end - span.start_offset),
                reason: "this copy lost records",
                holders: copies.holders(span.segment),
                damage: None,
            }))
        }
        other => Ok(other?),
    }
}

/// The readable length of a segment copy (0 for one this broker does not hold).
pub(crate) fn durable_length(
    store: &dyn SegmentStore,
    copies: &LocalCopies,
    segment: SegmentId,
) -> Result<u64, StorageError> {
    match store.info(store_id(segment)) {
        Err(StorageError::NotOpen { .. }) => {
            if !open_for_read(store, copies, segment, None)? {
                return Ok(0);
            }
            Ok(store.info(store_id(segment))?.length)
        }
        other => other.map(|info| info.length),
    }
}

/// The active segment of each active range of `topic`: (range, segment,
/// the segment's first range offset). Read under the metadata lock; no I/O.
pub(crate) fn active_segments(
    state: &MetadataState,
    topic: &str,
) -> Vec<(RangeId, SegmentId, u64)> {
    state
        .active_ranges(topic)
        .filter_map(|range| {
            let segment = range.last_segment().and_then(|id| state.segment(id))?;
            Some((range.id, segment.id, segment.start_offset))
        })
        .collect()
}

/// The read plans of every active range of `topic`, in keyspace order.
/// Read under the metadata lock; the I/O happens afterwards, without it.
pub(crate) fn active_plans(state: &MetadataState, topic: &str) -> Vec<ReadPlan> {
    state
        .active_ranges(topic)
        .filter_map(|range| state.read_plan(range.id))
        .collect()
}

/// An active segment a tail reader's start needs from another broker: this
/// one holds no copy of it, so its readable end is asked of its holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TailElsewhere {
    pub range: RangeId,
    pub segment: SegmentId,
    pub start_offset: u64,
    /// Primary first.
    pub holders: Vec<u64>,
}

/// Where a reader of `topic` that has no cursor starts: each active range's
/// readable end (the tail). The ranges whose active segment this broker
/// holds no copy of are left out and listed: their end is another broker's
/// to say (ADR 0123), never taken as 0.
pub(crate) fn tail_positions(
    store: &dyn SegmentStore,
    copies: &LocalCopies,
    active: &[(RangeId, SegmentId, u64)],
) -> Result<(BTreeMap<RangeId, Position>, Vec<TailElsewhere>), StorageError> {
    let mut positions = BTreeMap::new();
    let mut elsewhere = Vec::new();
    for &(range, segment, start_offset) in active {
        if copies.held(segment) == Held::Elsewhere {
            elsewhere.push(TailElsewhere {
                range,
                segment,
                start_offset,
                holders: copies.holders(segment),
            });
            continue;
        }
        let length = durable_length(store, copies, segment)?;
        positions.insert(
            range,
            Position::At {
                segment,
                offset: start_offset + length,
            },
        );
    }
    Ok((positions, elsewhere))
}

/// What one cursor entry says a reader of a plan was delivered: per slice
/// of the plan it speaks for (the slices of ranges no younger than the
/// entry's whose band meets the entry's), the range offset below which
/// every record of the entry's band was delivered (`u64::MAX`: the whole
/// slice).
#[derive(Debug, Clone)]
struct Delivered {
    band: Band,
    done: BTreeMap<RangeId, u64>,
}

impl Delivered {
    /// The entry `position` of range `entry`, whose band within the plan
    /// is `band`. A position in a segment the plan does not hold (never
    /// after `Cursor::validate`) counts as past every slice it speaks for.
    fn of(plan: &ReadPlan, entry: RangeId, band: Band, position: Position) -> Delivered {
        let at = match position {
            Position::Start => None,
            Position::At { segment, offset } => Some(
                plan.slices
                    .iter()
                    .find(|s| s.segments.iter().any(|x| x.segment == segment))
                    .map_or((RangeId(u64::MAX), u64::MAX), |s| (s.range, offset)),
            ),
        };
        let done = plan
            .slices
            .iter()
            .filter(|s| s.range <= entry && s.band.intersect(&band).is_some())
            .map(|s| {
                let done = match at {
                    None => 0,
                    Some((range, _)) if s.range < range => u64::MAX,
                    Some((range, offset)) if s.range == range => offset,
                    Some(_) => 0,
                };
                (s.range, done)
            })
            .collect();
        Delivered { band, done }
    }

    fn below(&self, range: RangeId) -> u64 {
        self.done.get(&range).copied().unwrap_or(0)
    }
}

/// Where a reader of one plan resumes, from every cursor entry that speaks
/// for it: the plan's own (a linear position in the plan), and those of
/// ranges in the plan (a cursor minted before a split or merge: for a
/// merge, one per parent, each with its own progress; issue 20, F3).
/// Each entry is evidence of what was delivered; a record is skipped only
/// if some entry covering its key says it was delivered, and each slice
/// is read from an offset no entry needs anything below.
#[derive(Debug, Clone)]
struct Resume {
    own: Option<Delivered>,
    ancestors: Vec<(RangeId, Position, Delivered)>,
}

impl Resume {
    fn new(plan: &ReadPlan, cursor: &BTreeMap<RangeId, Position>) -> Resume {
        let band_of = |range: RangeId| {
            plan.slices
                .iter()
                .find(|s| s.range == range)
                .map(|s| s.band)
        };
        let own = cursor.get(&plan.range).and_then(|position| {
            let band = band_of(plan.range)?;
            Some(Delivered::of(plan, plan.range, band, *position))
        });
        let ancestors = plan
            .slices
            .iter()
            .filter(|s| s.range != plan.range)
            .filter_map(|s| {
                let position = *cursor.get(&s.range)?;
                Some((
                    s.range,
                    position,
                    Delivered::of(plan, s.range, s.band, position),
                ))
            })
            .collect();
        Resume { own, ancestors }
    }

    /// The offset of `slice` below which every record of its band was
    /// delivered, by every entry's account put together.
    fn start(&self, slice: &ReadSlice) -> u64 {
        let own = self.own.as_ref().map_or(0, |d| d.below(slice.range));
        // The ancestors' entries speak only for their bands: the least of
        // them counts only if together they cover the slice's band.
        let covering: Vec<&Delivered> = self
            .ancestors
            .iter()
            .map(|(_, _, d)| d)
            .filter(|d| d.done.contains_key(&slice.range))
            .collect();
        let mut bands: Vec<Band> = covering
            .iter()
            .filter_map(|d| d.band.intersect(&slice.band))
            .collect();
        bands.sort_by_key(Band::start);
        let mut reach = u128::from(slice.band.start());
        for band in &bands {
            if u128::from(band.start()) <= reach {
                reach = reach.max(band.end_exclusive());
            }
        }
        let ancestors = if reach >= slice.band.end_exclusive() {
            covering
                .iter()
                .map(|d| d.below(slice.range))
                .min()
                .unwrap_or(0)
        } else {
            0
        };
        own.max(ancestors)
    }

    /// Whether the record at range offset `offset` of `range`, key
    /// position `key`, was delivered already.
    fn delivered(&self, range: RangeId, offset: u64, key: u64) -> bool {
        self.own.as_ref().is_some_and(|d| offset < d.below(range))
            || self
                .ancestors
                .iter()
                .any(|(_, _, d)| d.band.contains(key) && offset < d.below(range))
    }
}

/// Reads every plan (one per active range) from `start` into `out`, at most
/// `records_max` records and at most `batch_bytes_max` block bytes, except
/// that the first record is taken alone if it is larger: `out`'s own limit
/// (the room of a response frame) is the only bound it must meet, and if it
/// does not, the read fails with [`ReadError::RecordTooLarge`]. So a read
/// with a record available returns at least one. Returns the positions
/// reached (only past records that made it into `out`).
pub(crate) fn read_topic(
    plans: &[ReadPlan],
    copies: &LocalCopies,
    store: &dyn SegmentStore,
    start: &BTreeMap<RangeId, Position>,
    out: &mut BatchBuilder,
    budget: ReadBudget,
) -> Result<ReadOutcome, ReadError> {
    let mut pass = Pass::default();
    for plan in plans {
        let resume = Resume::new(plan, start);
        let spans = Spans::new(plan, &resume);
        let mut at = spans.first();
        if !pass.spent(budget) {
            let reader = PlanReader {
                copies,
                store,
                resume: &resume,
                budget,
            };
            reader.read(&spans, out, &mut pass, &mut at)?;
        }
        insert_positions(
            &mut pass.positions,
            plan,
            &resume,
            &spans.list,
            at.index,
            at.pos,
        );
    }
    Ok(ReadOutcome {
        positions: pass.positions,
        records: pass.records,
        bytes: pass.bytes,
        blocked: pass.blocked,
    })
}

/// A read pass's running totals, across its plans.
#[derive(Debug, Default)]
struct Pass {
    positions: BTreeMap<RangeId, Position>,
    records: u32,
    bytes: u64,
    blocked: Vec<Blocked>,
    /// The budget refused a record: nothing more goes in.
    full: bool,
}

impl Pass {
    /// Whether nothing more may go in.
    fn spent(&self, budget: ReadBudget) -> bool {
        self.full || self.records >= budget.records_max
    }
}

/// One plan as an ordered list of (band, slice range, segment span), and
/// where each slice's read starts by the cursor's account.
struct Spans<'p> {
    list: Vec<(Band, RangeId, &'p SegmentSpan)>,
    slice_start: BTreeMap<RangeId, u64>,
}

impl<'p> Spans<'p> {
    fn new(plan: &'p ReadPlan, resume: &Resume) -> Spans<'p> {
        let list = plan
            .slices
            .iter()
            .flat_map(|slice| {
                slice
                    .segments
                    .iter()
                    .map(move |span| (slice.band, slice.range, span))
            })
            .collect();
        let slice_start = plan
            .slices
            .iter()
            .map(|slice| (slice.range, resume.start(slice)))
            .collect();
        Spans { list, slice_start }
    }

    /// The range offset a span of `range` is read from.
    fn from(&self, range: RangeId, span: &SegmentSpan) -> u64 {
        span.start_offset
            .max(self.slice_start.get(&range).copied().unwrap_or(0))
    }

    /// The first span with anything left to deliver, and where in it; past
    /// the last span if none has.
    fn first(&self) -> At {
        let first = self.list.iter().position(|(_, range, span)| {
            span.end_offset
                .is_none_or(|end| self.from(*range, span) < end)
        });
        match first {
            Some(index) => {
                let (_, range, span) = self.list[index];
                let offset = self.from(range, span);
                At {
                    index,
                    offset,
                    pos: Position::At {
                        segment: span.segment,
                        offset,
                    },
                }
            }
            None => At {
                index: self.list.len(),
                offset: 0,
                pos: self
                    .list
                    .last()
                    .map_or(Position::Start, |(_, _, span)| Position::At {
                        segment: span.segment,
                        offset: span.end_offset.unwrap_or(span.start_offset),
                    }),
            },
        }
    }
}

/// Where a plan's read stands: the span, the range offset in it, and the
/// position a cursor records (past records that made it into the answer).
#[derive(Debug)]
struct At {
    index: usize,
    offset: u64,
    pos: Position,
}

/// What one chunk read from a span left to decide.
#[derive(Debug, Default)]
struct Chunk {
    /// The records the store visited.
    taken: usize,
    /// The batch refused a record.
    refused: Option<BatchError>,
    /// The first record alone did not fit a response frame.
    too_large: Option<ReadError>,
    /// A record past the span's sealed end was reached.
    past_end: bool,
}

/// Whether a plan's read goes on with its next chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    Stop,
}

/// What reading one plan needs besides the pass and the answer.
struct PlanReader<'a> {
    copies: &'a LocalCopies,
    store: &'a dyn SegmentStore,
    resume: &'a Resume,
    budget: ReadBudget,
}

impl PlanReader<'_> {
    /// Reads the plan's spans from `at` until the budget is spent, the plan
    /// ends, or a span stops it (blocked, or nothing more stored).
    fn read(
        &self,
        spans: &Spans<'_>,
        out: &mut BatchBuilder,
        pass: &mut Pass,
        at: &mut At,
    ) -> Result<(), ReadError> {
        while let Some(&(band, slice_range, span)) = spans.list.get(at.index) {
            at.pos = Position::At {
                segment: span.segment,
                offset: at.offset,
            };
            if let Some(end) = span.end_offset
                && at.offset >= end
            {
                at.index += 1;
                if let Some((_, next_range, next)) = spans.list.get(at.index) {
                    at.offset = spans.from(*next_range, next);
                }
                continue;
            }
            if pass.spent(self.budget) {
                break;
            }
            let chunk = match self.read_chunk(out, pass, at, band, slice_range, span) {
                Ok(chunk) => chunk,
                Err(e) => return self.stop_at_failure(e, pass, at, slice_range, span),
            };
            if self.after_chunk(chunk, pass, at, slice_range, span)? == Flow::Stop {
                break;
            }
            at.pos = Position::At {
                segment: span.segment,
                offset: at.offset,
            };
        }
        Ok(())
    }

    /// Reads one chunk of `span` from `at` into `out`: the records of
    /// `band` not delivered yet, within what is left of the budget.
    fn read_chunk(
        &self,
        out: &mut BatchBuilder,
        pass: &mut Pass,
        at: &mut At,
        band: Band,
        slice_range: RangeId,
        span: &SegmentSpan,
    ) -> Result<Chunk, ReadError> {
        let ReadBudget {
            records_max,
            batch_bytes_max,
            read_chunk_records,
        } = self.budget;
        let want = ((records_max - pass.records) as usize).min(read_chunk_records);
        // Stored frames are a little larger than wire records, so this
        // reads at most about what still fits; the builder decides exactly.
        let room = batch_bytes_max.saturating_sub(out.encoded_bytes()).max(1);
        // Each stored record is encoded straight from the store's read
        // buffer into the block: one copy, no allocation per record.
        let mut chunk = Chunk::default();
        let from = at.offset - span.start_offset;
        let taken = read_copy(
            self.store,
            self.copies,
            span,
            from,
            want,
            room,
            &mut |view| {
                let offset = span.start_offset + view.offset;
                if span.end_offset.is_some_and(|end| offset >= end) {
                    chunk.past_end = true;
                    return ControlFlow::Break(());
                }
                let key = position(view.key);
                if band.contains(key) && !self.resume.delivered(slice_range, offset, key) {
                    let record = RecordRef {
                        timestamp_ms: Some(view.timestamp_ms),
                        key: view.key,
                        value: view.value,
                        headers: client_headers(&view.headers),
                    };
                    let pushed = push_record(out, record, batch_bytes_max, span.segment, offset);
                    if let Err(stop) = pushed {
                        match stop {
                            Unpushed::Full => pass.full = true,
                            Unpushed::TooLarge(e) => chunk.too_large = Some(e),
                            Unpushed::Refused(e) => chunk.refused = Some(e),
                        }
                        return ControlFlow::Break(());
                    }
                    pass.records += 1;
                    pass.bytes += (view.key.len() + view.value.len()) as u64;
                }
                // `want` already keeps the store within the record budget.
                at.offset = offset + 1;
                ControlFlow::Continue(())
            },
        )?;
        chunk.taken = self.copies.settled_read(span, taken)?;
        Ok(chunk)
    }

    /// A chunk read that failed: a loss is answered after what was read
    /// before it (ADR 0108); a span this broker cannot read stops the range
    /// here, and what was read before, and the other ranges, are answered
    /// (the caller may fetch the segment from a holder and read again).
    fn stop_at_failure(
        &self,
        failure: ReadError,
        pass: &mut Pass,
        at: &mut At,
        slice_range: RangeId,
        span: &SegmentSpan,
    ) -> Result<(), ReadError> {
        match failure {
            ReadError::Store(StorageError::Lost {
                from, to, reason, ..
            }) => {
                // The next read, from here, gets the loss.
                if pass.records > 0 {
                    return Ok(());
                }
                Err(ReadError::Lost {
                    range: slice_range,
                    segment: span.segment,
                    from: span.start_offset + from,
                    to: span.start_offset + to,
                    reason,
                })
            }
            ReadError::NotHere(mut here) => {
                // Records visited before a frame failed its check are in
                // `out`: the range stops after them, and a holder is asked
                // from there.
                here.range = Some(slice_range);
                here.offset = at.offset;
                here.from = at.offset - span.start_offset;
                at.pos = Position::At {
                    segment: span.segment,
                    offset: at.offset,
                };
                pass.blocked.push(here);
                Ok(())
            }
            e => Err(e),
        }
    }

    /// What a chunk that was read means for the plan's read.
    fn after_chunk(
        &self,
        chunk: Chunk,
        pass: &mut Pass,
        at: &mut At,
        slice_range: RangeId,
        span: &SegmentSpan,
    ) -> Result<Flow, ReadError> {
        if let Some(e) = chunk.too_large {
            return Err(e);
        }
        let refused = chunk.refused.is_some();
        match chunk.refused {
            None => {}
            // Only if the budget is above the frame's room.
            Some(BatchError::Full { .. }) => pass.full = true,
            Some(e) => {
                return Err(ReadError::Store(StorageError::Config {
                    reason: leak_reason(e),
                }));
            }
        }
        if chunk.past_end {
            at.offset = span.end_offset.unwrap_or(at.offset);
        } else if chunk.taken == 0 && !refused && !pass.full {
            return self.nothing_read(pass, at, slice_range, span);
        }
        Ok(Flow::Go)
    }

    /// A chunk that found nothing: the end of an active span's records for
    /// now; for a sealed span, a copy short of its seal.
    fn nothing_read(
        &self,
        pass: &mut Pass,
        at: &At,
        slice_range: RangeId,
        span: &SegmentSpan,
    ) -> Result<Flow, ReadError> {
        let Some(end) = span.end_offset else {
            return Ok(Flow::Stop);
        };
        // A replicated copy shorter than its seal: another copy serves
        // the read (the primary's catch-up fills this one).
        if self.copies.held(span.segment) == Held::Replicated {
            pass.blocked.push(Blocked {
                range: Some(slice_range),
                segment: span.segment,
                offset: at.offset,
                from: at.offset - span.start_offset,
                seal_length: Some(end - span.start_offset),
                reason: "this copy is short of its seal",
                holders: self.copies.holders(span.segment),
                damage: None,
            });
            return Ok(Flow::Stop);
        }
        // A lone copy shorter than its seal: its records are gone, which
        // is data loss, never a silent skip.
        if pass.records > 0 {
            return Ok(Flow::Stop);
        }
        Err(ReadError::Lost {
            range: slice_range,
            segment: span.segment,
            from: at.offset,
            to: end,
            reason: "the copy is shorter than its seal".to_string(),
        })
    }
}

/// Why a record did not go into the answer.
enum Unpushed {
    /// The byte budget is spent (from the second record on).
    Full,
    /// The first record alone does not fit a response frame.
    TooLarge(ReadError),
    /// The batch refused it otherwise.
    Refused(BatchError),
}

/// Puts one record into `out`: the byte budget binds from the second
/// record on (the first goes alone if it is larger), the frame's room
/// always.
fn push_record<H: malachi_wire::batch::HeaderParts>(
    out: &mut BatchBuilder,
    record: RecordRef<'_, H>,
    batch_bytes_max: usize,
    segment: SegmentId,
    offset: u64,
) -> Result<(), Unpushed> {
    if out.count() > 0 && grown_block_bytes(out, &record) > batch_bytes_max {
        return Err(Unpushed::Full);
    }
    match out.push_ref(record) {
        Ok(()) => Ok(()),
        Err(BatchError::Full {
            block_bytes,
            batch_bytes_max: room_bytes,
            ..
        }) if out.count() == 0 => Err(Unpushed::TooLarge(ReadError::RecordTooLarge {
            segment,
            offset,
            block_bytes,
            room_bytes,
        })),
        Err(e) => Err(Unpushed::Refused(e)),
    }
}

/// Records where a reader of `plan` stands: its own linear position, and
/// the entries of ranges in the plan that still say more than it does for
/// part of its band (a merge's other parent, ahead of the reader), so a
/// cursor minted before a merge loses neither parent's progress. Those are
/// dropped once the reader has passed them, and left out, at the cost of
/// records delivered again, never lost, if the cursor would grow past
/// `CURSOR_POSITIONS_MAX`.
fn insert_positions(
    positions: &mut BTreeMap<RangeId, Position>,
    plan: &ReadPlan,
    resume: &Resume,
    spans: &[(Band, RangeId, &SegmentSpan)],
    index: usize,
    pos: Position,
) {
    positions.insert(plan.range, pos);
    for (range, position, _) in &resume.ancestors {
        let Position::At { segment, .. } = position else {
            continue;
        };
        let ahead = spans
            .iter()
            .position(|(_, _, span)| span.segment == *segment)
            .is_some_and(|at| at >= index);
        if ahead && positions.len() < malachi_core::cursor::CURSOR_POSITIONS_MAX {
            positions.insert(*range, *position);
        }
    }
}

/// The block `out` would be with `record` added.
fn grown_block_bytes<H: malachi_wire::batch::HeaderParts>(
    out: &BatchBuilder,
    record: &RecordRef<'_, H>,
) -> usize {
    let count = u64::from(out.count());
    out.encoded_bytes() - varint_bytes(count) + varint_bytes(count + 1) + record.encoded_bytes()
}

fn leak_reason(_e: BatchError) -> &'static str {
    "a stored record cannot be carried in a wire batch"
}

/// A stored record's headers as clients see them: without the producer tag
/// the broker stores with an idempotent batch's last record, nor the start
/// marker it stores with its first (ADR 0092). The broker appends either
/// last, a record carries at most one, and producers may not set `malachi.`
/// headers.
fn client_headers<'a, 'b>(headers: &'b [(&'a str, &'a [u8])]) -> &'b [(&'a str, &'a [u8])] {
    use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER};
    match headers.split_last() {
        Some(((name, _), rest)) if *name == PRODUCER_HEADER || *name == PRODUCER_START_HEADER => {
            rest
        }
        _ => headers,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use malachi_core::cursor::{Cursor, CursorKey, CursorKeys};
    use malachi_core::model::{Band, ReadSlice, SegmentSpan};
    use malachi_storage::FileStore;
    use malachi_storage::{Record, StoreConfig};
    use malachi_wire::Message;
    use malachi_wire::messages::{FetchResponse, SubscribePush};

    const ROOM: usize = 1 << 20;
    const BUDGET: usize = 64;

    fn store(dir: &tempfile::TempDir) -> FileStore {
        FileStore::open_dir(dir.path().join("segments"), StoreConfig::default()).unwrap()
    }

    fn append(store: &FileStore, segment: u64, records: &[(&str, usize)]) {
        let id = malachi_storage::SegmentId(segment);
        if store.info(id).is_err() {
            store.open(id).unwrap();
        }
        let records: Vec<_> = records
            .iter()
            .map(|&(key, value_bytes)| Record::new(1, key, vec![b'v'; value_bytes]))
            .collect();
        store.append(id, &records).unwrap().wait().unwrap();
    }

    fn span(segment: u64, start_offset: u64, end_offset: Option<u64>) -> SegmentSpan {
        SegmentSpan {
            segment: SegmentId(segment),
            start_offset,
            end_offset,
            replicas: Vec::new(),
        }
    }

    fn slice(range: u64, band: Band, segments: Vec<SegmentSpan>) -> ReadSlice {
        ReadSlice {
            range: RangeId(range),
            band,
            sealed: segments.iter().all(|s| s.end_offset.is_some()),
            segments,
        }
    }

    /// What a read returned: each record's key and value length.
    type Page = Vec<(Vec<u8>, usize)>;
    type Positions = BTreeMap<RangeId, Position>;

    /// One read as a fetch does it: `room` for the block, `budget` asked.
    fn read(
        store: &FileStore,
        plans: &[ReadPlan],
        start: &BTreeMap<RangeId, Position>,
        records_max: u32,
        room: usize,
        budget: usize,
    ) -> Result<(Page, Positions), ReadError> {
        let mut out = BatchBuilder::with_capacity(room, budget);
        let outcome = read_topic(
            plans,
            &LocalCopies::all_local(),
            store,
            start,
            &mut out,
            ReadBudget {
                records_max,
                batch_bytes_max: budget,
                read_chunk_records: 1024,
            },
        )?;
        let batch = out.finish();
        assert_eq!(batch.count(), outcome.records);
        let records = batch
            .records()
            .into_iter()
            .map(|r| (r.key.to_vec(), r.value.len()))
            .collect();
        Ok((records, outcome.positions))
    }

    /// Reads from the start until a read returns nothing, as a reader
    /// following its cursor does; every read that returns records must
    /// move the cursor.
    fn drain(store: &FileStore, plans: &[ReadPlan], records_max: u32, budget: usize) -> Vec<Page> {
        let mut cursor = BTreeMap::new();
        let mut reads = Vec::new();
        for _ in 0..100 {
            let (records, next) = read(store, plans, &cursor, records_max, ROOM, budget).unwrap();
            if records.is_empty() {
                return reads;
            }
            assert_ne!(next, cursor, "records came but the cursor did not move");
            cursor = next;
            reads.push(records);
        }
        panic!("the reader never reached the end");
    }

    /// One read pass of `plans` from `start` with room for every record:
    /// the keys it answered and its outcome.
    fn pass(
        store: &FileStore,
        plans: &[ReadPlan],
        copies: &LocalCopies,
        start: &Positions,
    ) -> (Vec<Vec<u8>>, ReadOutcome) {
        let mut out = BatchBuilder::with_capacity(ROOM, ROOM);
        let outcome = read_topic(
            plans,
            copies,
            store,
            start,
            &mut out,
            ReadBudget {
                records_max: 100,
                batch_bytes_max: ROOM,
                read_chunk_records: 1024,
            },
        )
        .unwrap();
        let keys = out
            .finish()
            .records()
            .into_iter()
            .map(|r| r.key.to_vec())
            .collect();
        (keys, outcome)
    }

    fn key_in(band: Band, inside: bool) -> String {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|k| band.contains(position(k.as_bytes())) == inside)
            .unwrap()
    }

    /// Keys whose position falls in `band`, distinct.
    fn keys_in(band: Band, n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| band.contains(position(k.as_bytes())))
            .take(n)
            .collect()
    }

    /// A cursor minted after a split, resumed after its two children
    /// merged (issue 20, F3): each parent's remaining records are read
    /// from its own position, none skipped and none again, and a reader
    /// stopped part way through loses neither parent's progress.
    #[test]
    fn a_cursor_from_before_a_merge_resumes_each_parent_from_its_own_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let lower = Band::new(0, 63).unwrap();
        let upper = Band::new(1 << 63, 63).unwrap();
        let (low, high) = (keys_in(lower, 6), keys_in(upper, 6));
        // Values sized by a running number name every record.
        let mut next = 1;
        let mut records = |keys: &[String]| -> Vec<(String, usize)> {
            keys.iter()
                .map(|k| {
                    next += 1;
                    (k.clone(), next)
                })
                .collect()
        };
        let parent = records(&[low[0].clone(), high[0].clone()]);
        let left = records(&low[1..6]);
        let right = records(&high[1..5]);
        let merged = records(&[low[0].clone(), high[0].clone(), low[1].clone()]);
        let stored = |store: &FileStore, segment, rs: &[(String, usize)]| {
            let refs: Vec<(&str, usize)> = rs.iter().map(|(k, n)| (k.as_str(), *n)).collect();
            append(store, segment, &refs);
        };
        stored(&store, 1, &parent);
        stored(&store, 2, &left);
        stored(&store, 3, &right);
        stored(&store, 4, &merged);
        let plan = ReadPlan {
            range: RangeId(4),
            slices: vec![
                slice(1, Band::FULL, vec![span(1, 0, Some(2))]),
                slice(2, lower, vec![span(2, 0, Some(5))]),
                slice(3, upper, vec![span(3, 0, Some(4))]),
                slice(4, Band::FULL, vec![span(4, 0, None)]),
            ],
        };
        // Minted while ranges 2 and 3 were active: 2 read to offset 3,
        // 3 to offset 1 (the parent read whole by both).
        let cursor: Positions = [
            (
                RangeId(2),
                Position::At {
                    segment: SegmentId(2),
                    offset: 3,
                },
            ),
            (
                RangeId(3),
                Position::At {
                    segment: SegmentId(3),
                    offset: 1,
                },
            ),
        ]
        .into();
        let expected: Page = left[3..]
            .iter()
            .chain(&right[1..])
            .chain(&merged)
            .map(|(k, n)| (k.as_bytes().to_vec(), *n))
            .collect();
        // In one read.
        let (all, _) = read(
            &store,
            std::slice::from_ref(&plan),
            &cursor,
            100,
            ROOM,
            ROOM,
        )
        .unwrap();
        assert_eq!(all, expected);
        // One record a read, following the cursors it returns.
        let mut at = cursor.clone();
        let mut got: Page = Vec::new();
        for _ in 0..100 {
            let (page, next) =
                read(&store, std::slice::from_ref(&plan), &at, 1, ROOM, ROOM).unwrap();
            if page.is_empty() {
                break;
            }
            got.extend(page);
            at = next;
        }
        assert_eq!(got, expected);
        // Once past the parents, the cursor carries only the merged range.
        assert_eq!(at.keys().copied().collect::<Vec<_>>(), vec![RangeId(4)]);
    }

    /// Chaos finding F5: right after a primary restarted, its copy of the
    /// active segment shows no record (committed end 0) until its
    /// followers answer again, while readers hold cursors past that. Such a
    /// read takes nothing and keeps its position (a fetch long-polls), and
    /// of a sealed segment it is sent on to another copy: never an
    /// `offset ... is past the end` store error (`unknown_server_error`).
    #[test]
    fn a_cursor_past_a_restarted_copys_committed_end_reads_nothing_and_keeps_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 7, &[("a", 8), ("b", 8), ("c", 8), ("d", 8)]);
        // The restart: the copy is closed and opened again by the read.
        store.close(malachi_storage::SegmentId(7)).unwrap();
        let me = NodeId(2);
        let replicated = LocalCopies {
            me: Some(me),
            replicas: [(SegmentId(7), vec![NodeId(2), NodeId(1)])].into(),
            ..LocalCopies::default()
        };
        let plan = |end: Option<u64>| ReadPlan {
            range: RangeId(3),
            slices: vec![slice(3, Band::FULL, vec![span(7, 100, end)])],
        };
        let cursor: Positions = [(
            RangeId(3),
            Position::At {
                segment: SegmentId(7),
                offset: 102,
            },
        )]
        .into();
        let read = |plan: &ReadPlan, copies: &LocalCopies| {
            let mut out = BatchBuilder::with_capacity(ROOM, ROOM);
            read_topic(
                std::slice::from_ref(plan),
                copies,
                &store,
                &cursor,
                &mut out,
                ReadBudget {
                    records_max: 10,
                    batch_bytes_max: ROOM,
                    read_chunk_records: 1024,
                },
            )
        };
        let outcome = read(&plan(None), &replicated).unwrap();
        assert_eq!(outcome.records, 0);
        assert_eq!(outcome.positions, cursor, "the reader keeps its position");
        // Regression (CI, cursor_key): this broker is the primary, and until
        // a quorum of copies has answered since the reopen its committed end
        // may be below acknowledged records: the read is the retriable
        // `no_quorum`, never "nothing more" (ADR 0139).
        let unsettled = replicated.clone().with_unsettled(|_| false);
        match read(&plan(None), &unsettled) {
            Err(ReadError::Unsettled { segment }) => assert_eq!(segment, SegmentId(7)),
            other => panic!("expected an unsettled refusal, got {other:?}"),
        }
        let refusal = read(&plan(None), &unsettled)
            .unwrap_err()
            .refusal("t", 1 << 20, 0);
        assert_eq!(refusal.code(), malachi_wire::ErrorCode::NoQuorum);
        let settled = replicated.clone().with_unsettled(|_| true);
        assert_eq!(read(&plan(None), &settled).unwrap().records, 0);
        // Sealed meanwhile, at the length the other copies hold: this copy
        // is short of it (its committed end clamps it), another serves it.
        match read(&plan(Some(100 + 6)), &replicated) {
            Ok(ReadOutcome {
                records: 0,
                blocked,
                ..
            }) if blocked.len() == 1 => {
                let blocked = &blocked[0];
                assert_eq!(blocked.segment, SegmentId(7));
                assert_eq!(blocked.holders, vec![2, 1]);
                assert_eq!(blocked.reason, "this copy is short of its seal");
            }
            other => panic!("expected the read to be sent on, got {other:?}"),
        }
        // A lone copy that ends before a position it served lost records.
        store.close(malachi_storage::SegmentId(7)).unwrap();
        let lone = LocalCopies {
            me: Some(me),
            replicas: [(SegmentId(7), vec![me])].into(),
            ..LocalCopies::default()
        };
        let far: Positions = [(
            RangeId(3),
            Position::At {
                segment: SegmentId(7),
                offset: 109,
            },
        )]
        .into();
        let mut out = BatchBuilder::with_capacity(ROOM, ROOM);
        let lost = read_topic(
            std::slice::from_ref(&plan(None)),
            &lone,
            &store,
            &far,
            &mut out,
            ReadBudget {
                records_max: 10,
                batch_bytes_max: ROOM,
                read_chunk_records: 1024,
            },
        );
        match lost {
            Err(ReadError::Lost {
                range, from, to, ..
            }) => assert_eq!((range, from, to), (RangeId(3), 104, 109)),
            other => panic!("expected a loss, got {other:?}"),
        }
    }

    /// Issue 36 ("false data-loss alarms"): a follower's copy of a sealed
    /// segment whose log ends short of its own seal marker lacks records
    /// the other copies hold. Opening it for a read reports a repair, not
    /// data loss; a lone copy in the same state is still data loss.
    #[test]
    fn a_short_copy_of_a_replicated_segment_is_counted_as_a_repair_not_data_loss() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let id = malachi_storage::SegmentId(7);
        append(&store, 7, &[("a", 8), ("b", 8)]);
        let kept = store.info(id).unwrap().byte_size;
        append(&store, 7, &[("c", 8), ("d", 8), ("e", 8)]);
        store.seal(id, 5).unwrap();
        store.close(id).unwrap();
        // The log loses its last three records under the seal marker.
        std::fs::OpenOptions::new()
            .write(true)
            .open(store.log_path(id))
            .unwrap()
            .set_len(kept)
            .unwrap();
        let plan = ReadPlan {
            range: RangeId(3),
            slices: vec![slice(3, Band::FULL, vec![span(7, 0, Some(5))])],
        };
        let read_with = |copies: &LocalCopies| {
            let mut out = BatchBuilder::with_capacity(ROOM, ROOM);
            let _ = read_topic(
                std::slice::from_ref(&plan),
                copies,
                &store,
                &BTreeMap::new(),
                &mut out,
                ReadBudget {
                    records_max: 10,
                    batch_bytes_max: ROOM,
                    read_chunk_records: 1024,
                },
            );
        };
        let metrics = Arc::new(BrokerMetrics::new());
        let follower = LocalCopies {
            me: Some(NodeId(2)),
            replicas: [(SegmentId(7), vec![NodeId(1), NodeId(2), NodeId(3)])].into(),
            ..LocalCopies::default()
        }
        .with_metrics(&metrics);
        read_with(&follower);
        let text = metrics.render();
        assert!(
            !text.contains("malachi_data_loss_records_total 3"),
            "a copy of several is no data loss: {text}"
        );
        assert!(
            text.contains("malachi_copy_repair_records_total 3"),
            "{text}"
        );
        // The same copy, alone: its records are gone.
        store.close(id).unwrap();
        let metrics = Arc::new(BrokerMetrics::new());
        let lone = LocalCopies {
            me: Some(NodeId(2)),
            replicas: [(SegmentId(7), vec![NodeId(2)])].into(),
            ..LocalCopies::default()
        }
        .with_metrics(&metrics);
        read_with(&lone);
        let text = metrics.render();
        assert!(text.contains("malachi_data_loss_records_total 3"), "{text}");
    }

    #[test]
    fn a_replicated_copy_the_scrubber_found_broken_is_out_of_the_read_path() {
        use crate::data::scrub::{ScrubBook, Verdict};
        use malachi_wire::replica_status::ScrubSeal;
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 1, &[("a", 8), ("b", 8)]);
        append(&store, 2, &[("c", 8)]);
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(
                1,
                Band::FULL,
                vec![span(1, 0, Some(2)), span(2, 2, None)],
            )],
        }];
        let me = NodeId(1);
        let replicated = LocalCopies {
            me: Some(me),
            replicas: [
                (SegmentId(1), vec![NodeId(1), NodeId(2), NodeId(3)]),
                (SegmentId(2), vec![NodeId(1), NodeId(2), NodeId(3)]),
            ]
            .into(),
            ..LocalCopies::default()
        };
        let mut book = ScrubBook::default();
        let seal = ScrubSeal {
            segment: 1,
            length: 2,
            bytes: 0,
        };
        book.record(
            seal,
            Verdict::Damaged {
                detail: "a flipped byte".into(),
            },
            std::time::Instant::now(),
        );
        let read = |copies: &LocalCopies| {
            let mut out = BatchBuilder::with_capacity(ROOM, BUDGET);
            read_topic(
                &plans,
                copies,
                &store,
                &BTreeMap::new(),
                &mut out,
                ReadBudget {
                    records_max: 10,
                    batch_bytes_max: BUDGET,
                    read_chunk_records: 1024,
                },
            )
            .unwrap()
        };
        let out = replicated.clone().without_broken(&book);
        let outcome = read(&out);
        assert_eq!(outcome.records, 0);
        match outcome.blocked.first() {
            Some(Blocked {
                segment,
                reason,
                holders,
                ..
            }) => {
                assert_eq!(*segment, SegmentId(1));
                assert!(reason.contains("scrub"), "{reason}");
                assert_eq!(*holders, vec![1, 2, 3]);
            }
            other => panic!("a broken copy was read: {other:?}"),
        }
        // A lone copy is never taken out: its reader gets what it holds.
        let lone = LocalCopies {
            me: Some(me),
            replicas: [(SegmentId(1), vec![me]), (SegmentId(2), vec![me])].into(),
            ..LocalCopies::default()
        }
        .without_broken(&book);
        assert!(lone.broken.is_empty());
        // Once the verdict is gone (rebuilt), the copy reads again.
        book.forget(1);
        let healed = replicated.without_broken(&book);
        assert!(healed.broken.is_empty());
        assert_eq!(read(&healed).records, read(&lone).records);
        assert!(read(&healed).blocked.is_empty());
    }

    /// Chaos finding F1: a sealed segment with no copy on the serving
    /// broker stops the read there (not an error: the records before it
    /// are answered), and a run of its frames from a holder is read like a
    /// local copy, up to its seal and no further, before the local active
    /// segment.
    #[test]
    fn a_sealed_segment_held_elsewhere_is_read_from_a_holders_frames() {
        use malachi_storage::SegmentStore;
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let holder_dir = tempfile::tempdir().unwrap();
        let holder = self::store(&holder_dir);
        // The holder's copy of segment 1 runs past the seal at 3 records.
        append(&holder, 1, &[("a", 8), ("b", 8), ("c", 8), ("x", 8)]);
        append(&store, 2, &[("d", 8)]);
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(
                1,
                Band::FULL,
                vec![span(1, 0, Some(3)), span(2, 3, None)],
            )],
        }];
        let copies = LocalCopies {
            me: Some(NodeId(1)),
            replicas: [
                (SegmentId(1), vec![NodeId(2), NodeId(3)]),
                (SegmentId(2), vec![NodeId(1)]),
            ]
            .into(),
            ..LocalCopies::default()
        };
        let read = |copies: &LocalCopies, start: &Positions| pass(&store, &plans, copies, start);
        let (keys, outcome) = read(&copies, &BTreeMap::new());
        assert!(keys.is_empty());
        let blocked = outcome.blocked.first().cloned().unwrap();
        assert_eq!(
            (blocked.segment, blocked.from, blocked.seal_length),
            (SegmentId(1), 0, Some(3))
        );
        assert_eq!(blocked.holders, vec![2, 3]);
        // A run of two records: read, then the read stops after them.
        let run = holder
            .read_frames(malachi_storage::SegmentId(1), 0, 1 << 20)
            .unwrap();
        let all = bytes::Bytes::from(run.bytes);
        let chunk = RemoteChunk::parse(
            SegmentId(1),
            0,
            super::super::remote::RunEnd::Seal(3),
            all.clone(),
        )
        .unwrap();
        let (keys, outcome) = read(&copies.clone().with_remote(chunk), &BTreeMap::new());
        assert_eq!(
            keys,
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        assert!(outcome.blocked.is_empty());
        // A run that ends before the seal: the read answers what it has and
        // stops where the run ends.
        let one = malachi_storage::frame::decode(&all).unwrap().1;
        let chunk = RemoteChunk::parse(
            SegmentId(1),
            0,
            super::super::remote::RunEnd::Seal(3),
            all.slice(..one),
        )
        .unwrap();
        let copies = copies.with_remote(chunk);
        let (keys, outcome) = read(&copies, &BTreeMap::new());
        assert_eq!(keys, vec![b"a".to_vec()]);
        let blocked = outcome.blocked.first().cloned().unwrap();
        assert_eq!((blocked.segment, blocked.from), (SegmentId(1), 1));
        assert_eq!(
            outcome.positions[&RangeId(1)],
            Position::At {
                segment: SegmentId(1),
                offset: 1
            }
        );
        // The next run, from where that one ends, is joined to it: a read
        // from the start goes through both.
        let rest = RemoteChunk::parse(
            SegmentId(1),
            1,
            super::super::remote::RunEnd::Seal(3),
            all.slice(one..),
        )
        .unwrap();
        let (keys, outcome) = read(&copies.with_remote(rest), &BTreeMap::new());
        assert_eq!(
            keys,
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        assert!(outcome.blocked.is_empty());
    }

    /// Issue 36: a topic whose ranges' active segments have different
    /// primaries. The serving broker holds no copy of range 2's active
    /// segment: the read must stop there and say so (blocked, so it is
    /// read from a holder or refused), never end the range silently; with
    /// a holder's run it reads that range up to the holder's readable end
    /// (committed records only), and at that end it has nothing more for
    /// now without being blocked.
    #[test]
    fn an_active_segment_held_elsewhere_is_never_a_silent_end_of_its_range() {
        use super::super::remote::RunEnd;
        use malachi_storage::SegmentStore;
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let holder_dir = tempfile::tempdir().unwrap();
        let holder = self::store(&holder_dir);
        let (low, high) = (Band::new(0, 63).unwrap(), Band::new(1 << 63, 63).unwrap());
        append(&store, 1, &[(&key_in(low, true), 8)]);
        // The primary of range 2's segment holds three records, two of
        // them committed.
        let highs = keys_in(high, 3);
        append(
            &holder,
            2,
            &[(&highs[0], 8), (&highs[1], 8), (&highs[2], 8)],
        );
        let plans = [
            ReadPlan {
                range: RangeId(1),
                slices: vec![slice(1, low, vec![span(1, 0, None)])],
            },
            ReadPlan {
                range: RangeId(2),
                slices: vec![slice(2, high, vec![span(2, 0, None)])],
            },
        ];
        let copies = LocalCopies {
            me: Some(NodeId(1)),
            replicas: [
                (SegmentId(1), vec![NodeId(1)]),
                (SegmentId(2), vec![NodeId(2), NodeId(3)]),
            ]
            .into(),
            ..LocalCopies::default()
        };
        assert!(copies.reads_active_elsewhere(&plans));
        let read = |copies: &LocalCopies| {
            let (keys, outcome) = pass(&store, &plans, copies, &BTreeMap::new());
            (keys.len(), outcome)
        };
        let (records, outcome) = read(&copies);
        assert_eq!(records, 1, "range 1's record is answered");
        assert_eq!(outcome.blocked.len(), 1, "range 2 is blocked, not empty");
        let blocked = &outcome.blocked[0];
        assert_eq!(
            (blocked.range, blocked.segment, blocked.seal_length),
            (Some(RangeId(2)), SegmentId(2), None)
        );
        assert_eq!(blocked.holders, vec![2, 3], "the primary is asked first");
        assert!(blocked.to_string().starts_with("range 2 of the topic"));
        // The holder's run, cut at its readable end of 2.
        let run = holder
            .read_frames(malachi_storage::SegmentId(2), 0, 1 << 20)
            .unwrap();
        let chunk = RemoteChunk::parse(
            SegmentId(2),
            0,
            RunEnd::Readable(2),
            bytes::Bytes::from(run.bytes),
        )
        .unwrap();
        let (records, outcome) = read(&copies.clone().with_remote(chunk));
        assert_eq!(
            records, 3,
            "range 1's record and range 2's two committed ones"
        );
        assert!(
            outcome.blocked.is_empty(),
            "at the readable end, nothing more for now"
        );
        assert_eq!(
            outcome.positions[&RangeId(2)],
            Position::At {
                segment: SegmentId(2),
                offset: 2
            }
        );
        // A file of the segment this broker still has (a copy since moved
        // away) is never read: the metadata says who holds it.
        append(&store, 2, &[(&highs[0], 8)]);
        let (records, outcome) = read(&copies);
        assert_eq!((records, outcome.blocked.len()), (1, 1));
    }

    /// Issue 36: a byte flipped in this broker's open copy of a sealed
    /// segment of several copies. The read answers the records before the
    /// bad frame and stops there, marking the damage (the caller records
    /// the verdict and asks a holder): never `unknown_server_error`, which
    /// stopped every reader with two intact copies elsewhere. With a
    /// holder's run from the bad record on, the read is whole.
    #[test]
    fn a_frame_that_fails_its_check_on_read_sends_the_read_to_another_holder() {
        use super::super::remote::RunEnd;
        use malachi_storage::SegmentStore;
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let holder_dir = tempfile::tempdir().unwrap();
        let holder = self::store(&holder_dir);
        let records = [("a", 8), ("b", 8), ("c", 8), ("d", 8)];
        append(&store, 1, &records);
        append(&holder, 1, &records);
        let id = malachi_storage::SegmentId(1);
        // Open for reading as a replicated copy, then rot a byte inside the
        // third frame's value.
        let copies = LocalCopies {
            me: Some(NodeId(1)),
            replicas: [(SegmentId(1), vec![NodeId(2), NodeId(1), NodeId(3)])].into(),
            ..LocalCopies::default()
        };
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(1, Band::FULL, vec![span(1, 0, Some(4))])],
        }];
        let read = |copies: &LocalCopies| pass(&store, &plans, copies, &BTreeMap::new());
        assert_eq!(read(&copies).0.len(), 4);
        let frames = store.read_frames(id, 0, 1 << 20).unwrap().bytes;
        let two = malachi_storage::frame::decode(&frames).unwrap().1
            + malachi_storage::frame::decode(
                &frames[malachi_storage::frame::decode(&frames).unwrap().1..],
            )
            .unwrap()
            .1;
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(store.log_path(id))
            .unwrap();
        log.write_all_at(&[0xFF], (two + 20) as u64).unwrap();
        drop(log);
        let (keys, outcome) = read(&copies);
        assert_eq!(
            keys,
            vec![b"a".to_vec(), b"b".to_vec()],
            "the records before the damage"
        );
        assert_eq!(outcome.blocked.len(), 1);
        let blocked = &outcome.blocked[0];
        assert_eq!(
            (blocked.segment, blocked.from, blocked.offset),
            (SegmentId(1), 2, 2)
        );
        assert!(
            blocked.damage.is_some(),
            "the damage is reported: {blocked:?}"
        );
        assert_eq!(
            outcome.positions[&RangeId(1)],
            Position::At {
                segment: SegmentId(1),
                offset: 2
            }
        );
        // A holder's run from the bad record on makes the read whole.
        let run = holder.read_frames(id, 2, 1 << 20).unwrap();
        let chunk = RemoteChunk::parse(
            SegmentId(1),
            2,
            RunEnd::Seal(4),
            bytes::Bytes::from(run.bytes),
        )
        .unwrap();
        let (keys, outcome) = read(&copies.clone().with_remote(chunk));
        assert_eq!(keys.len(), 4);
        assert!(outcome.blocked.is_empty());
        // A lone copy's damage is its reader's to hear of, never skipped.
        let (_, lone) = {
            let mut out = BatchBuilder::with_capacity(ROOM, ROOM);
            let lone = LocalCopies::all_local();
            let outcome = read_topic(
                &plans,
                &lone,
                &store,
                &BTreeMap::new(),
                &mut out,
                ReadBudget {
                    records_max: 100,
                    batch_bytes_max: ROOM,
                    read_chunk_records: 1024,
                },
            );
            ((), outcome)
        };
        assert!(
            matches!(lone, Err(ReadError::Store(StorageError::Corrupt { .. }))),
            "{lone:?}"
        );
    }

    #[test]
    fn a_first_record_over_the_byte_budget_comes_alone_and_the_cursor_moves_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 1, &[("a", 8), ("b", 4 * BUDGET), ("c", 8)]);
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(1, Band::FULL, vec![span(1, 0, None)])],
        }];
        let reads = drain(&store, &plans, 100, BUDGET);
        assert_eq!(
            reads,
            vec![
                vec![(b"a".to_vec(), 8)],
                vec![(b"b".to_vec(), 4 * BUDGET)],
                vec![(b"c".to_vec(), 8)],
            ]
        );
    }

    #[test]
    fn the_record_budget_and_a_budget_of_one_byte_still_return_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 1, &[("a", 8), ("b", 300), ("c", 8), ("d", 8)]);
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(1, Band::FULL, vec![span(1, 0, None)])],
        }];
        let one_record = drain(&store, &plans, 1, ROOM);
        assert_eq!(one_record.len(), 4);
        assert!(one_record.iter().all(|read| read.len() == 1));
        let one_byte = drain(&store, &plans, 100, 1);
        assert_eq!(one_byte, one_record);
    }

    #[test]
    fn big_records_cross_sealed_ancestors_and_band_filters_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        let half = Band::new(0, 63).unwrap();
        let (inside, outside) = (key_in(half, true), key_in(half, false));
        // The ancestor's sealed segment holds keys of both halves; the child
        // reads only its half of it, then its own segment.
        append(
            &store,
            1,
            &[
                (&outside, 4 * BUDGET),
                (&inside, 4 * BUDGET),
                (&outside, 8),
                (&inside, 8),
                (&outside, 4 * BUDGET),
            ],
        );
        append(&store, 2, &[(&inside, 4 * BUDGET), (&inside, 8)]);
        let plans = [ReadPlan {
            range: RangeId(2),
            slices: vec![
                slice(1, half, vec![span(1, 0, Some(5))]),
                slice(2, half, vec![span(2, 0, None)]),
            ],
        }];
        let key = inside.as_bytes().to_vec();
        let reads = drain(&store, &plans, 100, BUDGET);
        assert_eq!(
            reads,
            vec![
                vec![(key.clone(), 4 * BUDGET)],
                vec![(key.clone(), 8)],
                vec![(key.clone(), 4 * BUDGET)],
                vec![(key.clone(), 8)],
            ]
        );
    }

    #[test]
    fn a_big_first_record_of_one_range_does_not_hide_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 1, &[("a", 4 * BUDGET)]);
        append(&store, 2, &[("b", 8)]);
        let plan = |range: u64| ReadPlan {
            range: RangeId(range),
            slices: vec![slice(range, Band::FULL, vec![span(range, 0, None)])],
        };
        let reads = drain(&store, &[plan(1), plan(2)], 100, BUDGET);
        assert_eq!(
            reads,
            vec![vec![(b"a".to_vec(), 4 * BUDGET)], vec![(b"b".to_vec(), 8)]]
        );
    }

    #[test]
    fn a_record_too_large_for_the_frame_is_a_typed_error_not_an_empty_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir);
        append(&store, 1, &[("a", 8), ("b", 4096)]);
        let plans = [ReadPlan {
            range: RangeId(1),
            slices: vec![slice(1, Band::FULL, vec![span(1, 0, None)])],
        }];
        let room = 1024;
        let (first, cursor) = read(&store, &plans, &BTreeMap::new(), 100, room, room).unwrap();
        assert_eq!(first, vec![(b"a".to_vec(), 8)]);
        let err = read(&store, &plans, &cursor, 100, room, room).unwrap_err();
        let ReadError::RecordTooLarge {
            segment,
            offset,
            block_bytes,
            room_bytes,
        } = err
        else {
            panic!("expected RecordTooLarge, got {err:?}");
        };
        assert_eq!((segment, offset, room_bytes), (SegmentId(1), 1, room));
        assert!(block_bytes > 4096);
        let refusal = ReadError::RecordTooLarge {
            segment,
            offset,
            block_bytes,
            room_bytes,
        }
        .refusal("t", room + 100, 100);
        assert_eq!(refusal.code(), malachi_wire::ErrorCode::FrameTooLarge);
    }

    #[test]
    fn the_control_room_holds_the_largest_cursor_over_every_range() {
        let key = CursorKeys::single(u32::MAX, CursorKey::new(&[7; 32]).unwrap());
        let topic = "t".repeat(malachi_core::model::NAME_BYTES_MAX);
        for ranges in [1usize, 2, 10, 100, 500, 800] {
            let positions = (0..ranges as u64)
                .map(|i| {
                    let at = Position::At {
                        segment: SegmentId(u64::MAX - i),
                        offset: u64::MAX - i,
                    };
                    (RangeId(u64::MAX - i), at)
                })
                .collect();
            let cursor = Cursor {
                topic: topic.clone(),
                incarnation: u64::MAX,
                positions,
            };
            let next_cursor = cursor.encode(&key).unwrap();
            let fetch = FetchResponse {
                next_cursor: next_cursor.clone(),
                records: Default::default(),
            };
            let push = SubscribePush {
                sequence: u64::MAX,
                next_cursor,
                last: true,
                records: Default::default(),
            };
            let room = response_control_bytes(&topic, ranges);
            for (name, control) in [
                ("fetch", fetch.encode_parts().unwrap().0),
                ("push", push.encode_parts().unwrap().0),
            ] {
                assert!(
                    RESPONSE_HEADER_BYTES + control.len() <= room,
                    "{name} over {ranges} ranges: {} control bytes, room {room}",
                    control.len()
                );
            }
        }
    }
}
