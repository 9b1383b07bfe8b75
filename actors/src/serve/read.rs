//! Reading a topic by cursor: each active range's read plan (sealed
//! ancestors oldest first, then the range itself), drained from the stored
//! segment copies within a record and byte budget.
//!
//! Positions are range offsets (`segment.start_offset` plus the record's
//! offset within its segment), as the cursor codec validates them. A reader
//! of an active segment sees what the store holds durably: acknowledged
//! records only.

use std::collections::BTreeMap;

use malachi_cluster::cursor::Position;
use malachi_cluster::model::{MetadataState, RangeId, ReadPlan, SegmentId, position};
use std::ops::ControlFlow;

use malachi_storage::{FileStore, FrameView, SegmentStore, StorageError};
use malachi_wire::batch::{BatchBuilder, BatchError, RecordRef};

/// What one read pass produced.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub positions: BTreeMap<RangeId, Position>,
    pub records: u32,
    pub bytes: u64,
    /// The batch refused a record for lack of room.
    pub full: bool,
}

fn store_id(segment: SegmentId) -> malachi_storage::SegmentId {
    malachi_storage::SegmentId(segment.0)
}

/// Reads a segment copy, opening it first if this broker has not yet (a
/// sealed segment after a restart). Returns how many records `visit` took.
fn read_copy(
    store: &FileStore,
    segment: SegmentId,
    from: u64,
    records_max: usize,
    bytes_max: usize,
    visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
) -> Result<usize, StorageError> {
    match store.read_with(store_id(segment), from, records_max, bytes_max, visit) {
        Err(StorageError::NotOpen { .. }) => {
            store.open(store_id(segment))?;
            store.read_with(store_id(segment), from, records_max, bytes_max, visit)
        }
        other => other,
    }
}

/// The durable length of a segment copy.
pub(crate) fn durable_length(store: &FileStore, segment: SegmentId) -> Result<u64, StorageError> {
    match store.info(store_id(segment)) {
        Err(StorageError::NotOpen { .. }) => Ok(store.open(store_id(segment))?.info.length),
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

/// Where a reader of `topic` that has no cursor starts: each active range's
/// durable end (the tail).
pub(crate) fn tail_positions(
    store: &FileStore,
    active: &[(RangeId, SegmentId, u64)],
) -> Result<BTreeMap<RangeId, Position>, StorageError> {
    let mut positions = BTreeMap::new();
    for &(range, segment, start_offset) in active {
        let length = durable_length(store, segment)?;
        positions.insert(
            range,
            Position::At {
                segment,
                offset: start_offset + length,
            },
        );
    }
    Ok(positions)
}

/// The position a cursor gives an active range: its own entry, else the
/// furthest entry of an ancestor in its read plan (the cursor predates a
/// split or merge), else the start.
pub(crate) fn position_for(plan: &ReadPlan, cursor: &BTreeMap<RangeId, Position>) -> Position {
    if let Some(found) = cursor.get(&plan.range) {
        return *found;
    }
    plan.slices
        .iter()
        .rev()
        .find_map(|slice| cursor.get(&slice.range).copied())
        .unwrap_or(Position::Start)
}

/// Reads every plan (one per active range) from `start` into `out`, at most
/// `records_max` records; the builder bounds the bytes. Returns the
/// positions reached (only past records that made it into `out`).
pub(crate) fn read_topic(
    plans: &[ReadPlan],
    store: &FileStore,
    start: &BTreeMap<RangeId, Position>,
    records_max: u32,
    out: &mut BatchBuilder,
    batch_bytes_max: usize,
    read_chunk_records: usize,
) -> Result<ReadOutcome, StorageError> {
    let mut positions = BTreeMap::new();
    let mut records = 0u32;
    let mut bytes = 0u64;
    let mut full = false;
    for plan in plans {
        let mut pos = position_for(plan, start);
        if full || records >= records_max {
            positions.insert(plan.range, pos);
            continue;
        }
        // The plan as one ordered list of (band, segment span).
        let spans: Vec<_> = plan
            .slices
            .iter()
            .flat_map(|slice| slice.segments.iter().map(move |span| (slice.band, span)))
            .collect();
        let mut index = match pos {
            Position::Start => 0,
            Position::At { segment, .. } => spans
                .iter()
                .position(|(_, span)| span.segment == segment)
                .unwrap_or(spans.len()),
        };
        let mut offset = match pos {
            Position::Start => spans.first().map_or(0, |(_, span)| span.start_offset),
            Position::At { offset, .. } => offset,
        };
        while let Some((band, span)) = spans.get(index) {
            pos = Position::At {
                segment: span.segment,
                offset,
            };
            if let Some(end) = span.end_offset
                && offset >= end
            {
                index += 1;
                if let Some((_, next)) = spans.get(index) {
                    offset = next.start_offset;
                }
                continue;
            }
            if records >= records_max || full {
                break;
            }
            let want = ((records_max - records) as usize).min(read_chunk_records);
            // Stored frames are a little larger than wire records, so this
            // reads at most about what still fits; the builder decides exactly.
            let room = batch_bytes_max.saturating_sub(out.encoded_bytes()).max(1);
            // Each stored record is encoded straight from the store's read
            // buffer into the block: one copy, no allocation per record.
            let mut refused: Option<BatchError> = None;
            let mut past_end = false;
            let taken = read_copy(
                store,
                span.segment,
                offset - span.start_offset,
                want,
                room,
                &mut |view| {
                    let at = span.start_offset + view.offset;
                    if span.end_offset.is_some_and(|end| at >= end) {
                        past_end = true;
                        return ControlFlow::Break(());
                    }
                    if band.contains(position(view.key)) {
                        let record = RecordRef {
                            timestamp_ms: Some(view.timestamp_ms),
                            key: view.key,
                            value: view.value,
                            headers: client_headers(&view.headers),
                        };
                        if let Err(e) = out.push_ref(record) {
                            refused = Some(e);
                            return ControlFlow::Break(());
                        }
                        records += 1;
                        bytes += (view.key.len() + view.value.len()) as u64;
                    }
                    // `want` already keeps the store within the record budget.
                    offset = at + 1;
                    ControlFlow::Continue(())
                },
            )?;
            match refused {
                None => {}
                Some(BatchError::Full { .. }) => full = true,
                Some(e) => {
                    return Err(StorageError::Config {
                        reason: leak_reason(e),
                    });
                }
            }
            if past_end {
                offset = span.end_offset.unwrap_or(offset);
            } else if taken == 0 && refused.is_none() {
                if span.end_offset.is_some() {
                    // A sealed copy shorter than its seal: skip what it lacks
                    // rather than spin (the scrubber repairs such copies).
                    offset = span.end_offset.unwrap_or(offset);
                    continue;
                }
                break;
            }
            pos = Position::At {
                segment: span.segment,
                offset,
            };
        }
        positions.insert(plan.range, pos);
    }
    Ok(ReadOutcome {
        positions,
        records,
        bytes,
        full,
    })
}

fn leak_reason(_e: BatchError) -> &'static str {
    "a stored record cannot be carried in a wire batch"
}

/// A stored record's headers as clients see them: without the producer tag
/// the broker stores with an idempotent batch's last record (ADR 0092). The
/// broker appends it last, and producers may not set `malachi.` headers.
fn client_headers<'a, 'b>(headers: &'b [(&'a str, &'a [u8])]) -> &'b [(&'a str, &'a [u8])] {
    match headers.split_last() {
        Some(((name, _), rest)) if *name == malachi_wire::limits::PRODUCER_HEADER => rest,
        _ => headers,
    }
}
