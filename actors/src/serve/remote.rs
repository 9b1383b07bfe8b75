//! Reading a segment's records from a broker that holds a copy: a sealed
//! one (chaos finding F1, ADR 0118) or an active one (issue 36, ADR 0123).
//!
//! A fetch or subscription is served by one broker, but a topic's segments
//! live on their own replica sets: the serving broker may hold no copy of a
//! sealed segment (or one short of its seal, lost or broken), and, once a
//! topic's ranges have different primaries, no copy of another range's
//! active segment. A read pass then stops at each such segment
//! ([`Blocked`](super::read::Blocked), one per range), and
//! [`read_through_holders`] asks live holders, concurrently, for a bounded
//! run of each segment's frames with the cluster port's catch-up read (api
//! key 101, which is not order-gated: it only reads), checks every frame's
//! CRC and offset ([`RemoteChunk::parse`]), and runs the pass again with
//! those runs in the read's [`LocalCopies`], where `read_copy` visits them
//! exactly like a local copy. So one broker serves the whole read, each
//! range in its segments' order.
//!
//! A run is cut where the copy's readers stop: at the seal the metadata
//! records for a sealed segment; at the readable end the holder answered
//! with for an active one (its committed records, never one a failover
//! could take back), and an active segment's primary is asked first. A
//! run that reached that readable end means the range is read to its end
//! for now: the pass takes nothing more from it, and a fetch long-polls.
//!
//! Bounds: one run per segment at a time (a run that starts where the
//! last ended is joined to it, so a pass started again from the read's
//! start goes through both); at most [`REMOTE_SEGMENTS_PER_ROUND_MAX`]
//! segments asked per round and [`REMOTE_ROUNDS_PER_READ_MAX`] rounds per
//! read; each run asks for a share of the read's byte budget (at least
//! [`REMOTE_CHUNK_BYTES_MIN`], never more than `CATCH_UP_BYTES_MAX`), and
//! one read holds at most [`REMOTE_READ_BYTES_MAX`] of runs;
//! [`REMOTE_HOLDERS_TRIED_MAX`] holders tried per run, each within
//! [`REMOTE_READ_TIMEOUT_MS`], and a segment no holder served is not asked
//! again within the read.

use bytes::Bytes;
use malachi_core::model::{NodeId, SegmentId};
use malachi_storage::FrameView;
use malachi_storage::frame::{self, FrameError};
use malachi_wire::replica_order::{
    CATCH_UP_API_KEY, CATCH_UP_BYTES_MAX, CatchUpRequest, CatchUpResponse, OrderEpoch,
};
use std::ops::ControlFlow;
use tracing::debug;

use super::context::ReadCtx;
use super::error::ServeError;
use super::read::{Blocked, LocalCopies, ReadError, ReadOutcome, TailElsewhere};

/// The least frame bytes one chunk asks for, however small the read's
/// budget (a subscription with one byte of credit), so a band-filtered
/// ancestor is not crossed a frame per round trip.
pub(crate) const REMOTE_CHUNK_BYTES_MIN: u64 = 64 << 10;
/// Rounds of runs one read fetches at most before it answers with what it
/// has.
pub(crate) const REMOTE_ROUNDS_PER_READ_MAX: usize = 4;
/// Segments (so ranges) one round asks holders for at most, concurrently.
pub(crate) const REMOTE_SEGMENTS_PER_ROUND_MAX: usize = 16;
/// Frame bytes of runs one read holds at most.
pub(crate) const REMOTE_READ_BYTES_MAX: u64 = 4 << 20;
/// How often a long poll that reads an active segment from another broker
/// looks again: that broker's appends do not wake this one's readers.
pub(crate) const REMOTE_ACTIVE_POLL_MS: u64 = 100;
/// Holders one chunk is asked of at most.
pub(crate) const REMOTE_HOLDERS_TRIED_MAX: usize = 3;

/// The holders a read asks, in order: live ones other than this broker,
/// at most [`REMOTE_HOLDERS_TRIED_MAX`].
fn holders_to_try<'a>(broker: &'a ReadCtx, holders: &'a [u64]) -> impl Iterator<Item = u64> + 'a {
    let me = broker.place.me.0;
    holders
        .iter()
        .copied()
        .filter(move |&h| h != me && !broker.place.is_dead(NodeId(h)))
        .take(REMOTE_HOLDERS_TRIED_MAX)
}
/// How long one holder has to answer.
pub(crate) const REMOTE_READ_TIMEOUT_MS: u64 = 1_000;

/// Why frames from a holder cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RemoteChunkError {
    /// A frame failed its CRC, does not decode, or carries another offset
    /// than its position in the run requires.
    #[error("segment {segment}: the frame for offset {offset} read from a holder is bad: {source}")]
    Frame {
        segment: SegmentId,
        offset: u64,
        #[source]
        source: FrameError,
    },
    /// The run holds no frame below the end its readers stop at.
    #[error(
        "segment {segment}: a holder sent no record from offset {first} below the readable end {end_max}"
    )]
    Empty {
        segment: SegmentId,
        first: u64,
        end_max: u64,
    },
    /// A holder's answer about an active segment did not say its readable
    /// end (a broker that predates ADR 0123): its frames may hold records
    /// not yet committed, so none is served.
    #[error("segment {segment}: a holder's answer does not say its readable end")]
    NoReadableEnd { segment: SegmentId },
}

/// Where a run of frames is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunEnd {
    /// At the seal the metadata records (of a sealed segment).
    Seal(u64),
    /// At the readable end the holder answered with (of an active
    /// segment: its committed records).
    Readable(u64),
}

impl RunEnd {
    fn offset(self) -> u64 {
        match self {
            RunEnd::Seal(end) | RunEnd::Readable(end) => end,
        }
    }
}

/// A run of a segment's frames read from a holder: offsets `first..end`
/// (segment offsets, `end` at most the seal, or the holder's readable end
/// of an active segment), each frame checked when the run arrived and again
/// as it is visited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteChunk {
    segment: SegmentId,
    first: u64,
    end: u64,
    /// Of an active segment: the holder's readable end when it answered.
    readable_end: Option<u64>,
    frames: Bytes,
}

impl RemoteChunk {
    /// Checks `frames`, a holder's answer from segment offset `first`:
    /// every frame decodes with its CRC intact and carries the next
    /// offset; frames at or past `end_max` are cut off, never served. An
    /// active segment's holder may have nothing past `first` yet (an empty
    /// run that reached its readable end); a sealed one's must.
    pub(crate) fn parse(
        segment: SegmentId,
        first: u64,
        end_max: RunEnd,
        frames: Bytes,
    ) -> Result<RemoteChunk, RemoteChunkError> {
        let limit = end_max.offset();
        let (mut at, mut offset) = (0usize, first);
        while at < frames.len() && offset < limit {
            let rest = frames.get(at..).unwrap_or_default();
            let (view, len) = decode_at(segment, offset, rest)?;
            drop(view);
            at += len;
            offset += 1;
        }
        let caught_up = matches!(end_max, RunEnd::Readable(end) if first >= end);
        if offset == first && !caught_up {
            return Err(RemoteChunkError::Empty {
                segment,
                first,
                end_max: limit,
            });
        }
        assert!(
            offset <= limit.max(first),
            "a run never reaches past where its readers stop"
        );
        Ok(RemoteChunk {
            segment,
            first,
            end: offset,
            readable_end: match end_max {
                RunEnd::Readable(end) => Some(end),
                RunEnd::Seal(_) => None,
            },
            frames: frames.slice(..at),
        })
    }

    /// The run reached its holder's readable end at `from`: an active
    /// segment's reader has nothing more to read there for now.
    pub(crate) fn reached_readable_end(&self, from: u64) -> bool {
        from == self.end && self.readable_end.is_some_and(|end| from >= end)
    }

    /// The segment offset of the run's first record.
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// Records the run holds.
    pub(crate) fn records(&self) -> u64 {
        self.end - self.first
    }

    /// `next` after this run when it starts where this one ends (both of
    /// one segment, both checked), else `next` alone. The joined run
    /// holds both runs' bytes: at most `REMOTE_CHUNKS_PER_READ_MAX` answers.
    pub(crate) fn join(self, next: RemoteChunk) -> RemoteChunk {
        if self.segment != next.segment || self.end != next.first {
            return next;
        }
        let mut frames = bytes::BytesMut::with_capacity(self.frames.len() + next.frames.len());
        frames.extend_from_slice(&self.frames);
        frames.extend_from_slice(&next.frames);
        RemoteChunk {
            segment: self.segment,
            first: self.first,
            end: next.end,
            readable_end: next.readable_end,
            frames: frames.freeze(),
        }
    }

    /// The segment the run is of.
    pub(crate) fn segment(&self) -> SegmentId {
        self.segment
    }

    /// The run holds the record at segment offset `from`.
    pub(crate) fn covers(&self, from: u64) -> bool {
        (self.first..self.end).contains(&from)
    }

    /// Frame bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.frames.len()
    }

    /// Visits the records from segment offset `from` on, as a local read
    /// does: at most `records_max`, stopping once `bytes_max` frame bytes
    /// were visited (after the first) or `visit` breaks. Returns how many
    /// records `visit` took.
    pub(crate) fn visit(
        &self,
        from: u64,
        records_max: usize,
        bytes_max: usize,
        visit: &mut dyn FnMut(&FrameView<'_>) -> ControlFlow<()>,
    ) -> Result<usize, RemoteChunkError> {
        let (mut at, mut offset) = (0usize, self.first);
        let (mut taken, mut bytes) = (0usize, 0usize);
        while offset < self.end && taken < records_max {
            let rest = self.frames.get(at..).unwrap_or_default();
            if offset < from {
                // Skipped frames were checked when the run arrived.
                at += frame::peek_len(rest).map_err(|source| RemoteChunkError::Frame {
                    segment: self.segment,
                    offset,
                    source,
                })?;
                offset += 1;
                continue;
            }
            // The run sat in memory since it was checked: check it again
            // after this read, as every read of stored frames is.
            let (view, len) = decode_at(self.segment, offset, rest)?;
            at += len;
            offset += 1;
            if visit(&view).is_break() {
                break;
            }
            taken += 1;
            bytes += len;
            if bytes >= bytes_max {
                break;
            }
        }
        Ok(taken)
    }
}

/// The frame at the start of `bytes`, which must be the record at `offset`.
fn decode_at(
    segment: SegmentId,
    offset: u64,
    bytes: &[u8],
) -> Result<(FrameView<'_>, usize), RemoteChunkError> {
    let bad = |source| RemoteChunkError::Frame {
        segment,
        offset,
        source,
    };
    let (view, len) = frame::decode(bytes).map_err(bad)?;
    if view.offset != offset {
        return Err(bad(FrameError::OffsetMismatch {
            found: view.offset,
            expected: offset,
        }));
    }
    Ok((view, len))
}

/// What [`read_through_holders`] answers with: the last pass's outcome and
/// what it wrote, and whether a run from a holder moved the read (so an
/// answer with no record still carries a cursor further on).
pub(crate) struct ThroughHolders<T> {
    pub outcome: ReadOutcome,
    pub out: T,
    pub moved: bool,
}

/// Runs read passes (`pass`: one `read_topic` into a fresh output) until
/// one is blocked on no segment a holder can still serve, fetching, before
/// each further pass, a run of every segment the last pass was blocked on
/// from their live holders (concurrently), within the bounds of the module
/// doc. A pass blocked with nothing to answer, and no run to be had, is
/// [`ReadError::NotHere`] naming the first blocked range: retriable, never
/// an empty answer that looks like the end of the log.
pub(crate) async fn read_through_holders<T>(
    broker: &ReadCtx,
    topic: &str,
    copies: LocalCopies,
    budget_bytes: usize,
    mut pass: impl FnMut(&LocalCopies) -> Result<(ReadOutcome, T), ReadError>,
) -> Result<ThroughHolders<T>, ReadError> {
    let mut copies = copies;
    let mut moved = false;
    let mut rounds = 0usize;
    let mut held_bytes = 0u64;
    // Segments no holder served in this read: not asked again.
    let mut unserved: std::collections::BTreeSet<SegmentId> = Default::default();
    loop {
        let (outcome, out) = pass(&copies)?;
        for blocked in &outcome.blocked {
            if let Some(damage) = &blocked.damage {
                mark_damaged(
                    broker,
                    topic,
                    blocked,
                    damage,
                    copies.seal_of(blocked.segment),
                );
            }
        }
        let wanted: Vec<Blocked> = outcome
            .blocked
            .iter()
            .filter(|b| !unserved.contains(&b.segment))
            .take(REMOTE_SEGMENTS_PER_ROUND_MAX)
            .cloned()
            .collect();
        let room = REMOTE_READ_BYTES_MAX.saturating_sub(held_bytes);
        if wanted.is_empty() || rounds >= REMOTE_ROUNDS_PER_READ_MAX || room == 0 {
            return finish(outcome, out, moved);
        }
        rounds += 1;
        let share = round_share(budget_bytes, wanted.len(), room);
        let runs = futures::future::join_all(
            wanted
                .iter()
                .map(|blocked| fetch_chunk(broker, topic, blocked, share)),
        )
        .await;
        for (blocked, run) in wanted.iter().zip(runs) {
            match run {
                Some(run) => {
                    held_bytes += run.bytes() as u64;
                    moved |= run.records() > 0;
                    copies = copies.with_remote(run);
                }
                None => {
                    unserved.insert(blocked.segment);
                }
            }
        }
    }
}

/// Marks this broker's copy of `blocked`'s segment damaged, found so on
/// read (issue 36): logged once, counted, and, for a sealed copy, recorded
/// as the scrubber's verdict would be, so reads leave it at once
/// (`LocalCopies::without_broken`), `topic describe` shows it `damaged`,
/// and the coordinator's next scrub ask has it rebuilt from an intact
/// copy (ADR 0110), as a scrub would.
fn mark_damaged(
    broker: &ReadCtx,
    topic: &str,
    blocked: &Blocked,
    damage: &str,
    seal: Option<malachi_core::model::SealRecord>,
) {
    use crate::data::scrub::Verdict;
    let segment = blocked.segment;
    let Some(seal) = seal else {
        // An active follower copy: its primary's catch-up repairs it.
        tracing::warn!(topic, segment = segment.0, offset = blocked.offset, %damage, "a replicated copy of an active segment failed a frame check on read; the read went to another holder");
        broker.metrics.read_damage.increment(1);
        return;
    };
    let seal = malachi_wire::replica_status::ScrubSeal {
        segment: segment.0,
        length: seal.length,
        bytes: seal.bytes,
    };
    let mut book = broker.data.scrub.book.lock();
    if book.is_broken(segment.0) {
        return;
    }
    book.record(
        seal,
        Verdict::Damaged {
            detail: format!("found on read: {damage}"),
        },
        std::time::Instant::now(),
    );
    drop(book);
    broker.metrics.read_damage.increment(1);
    tracing::warn!(topic, segment = segment.0, offset = blocked.offset, %damage, "a sealed copy failed a frame check on read; the read went to another holder and the copy is marked damaged for its rebuild");
}

/// The answer of a read whose last pass is final: its records, or, if it
/// has none to give and moved nowhere while a range could not be read,
/// that range's retriable refusal.
fn finish<T>(outcome: ReadOutcome, out: T, moved: bool) -> Result<ThroughHolders<T>, ReadError> {
    match outcome.blocked.first() {
        Some(blocked) if outcome.records == 0 && !moved => Err(ReadError::NotHere(blocked.clone())),
        _ => Ok(ThroughHolders {
            outcome,
            out,
            moved,
        }),
    }
}

/// The frame bytes each of `segments` runs of one round asks for: a share
/// of the read's budget, within [`REMOTE_CHUNK_BYTES_MIN`] and
/// `CATCH_UP_BYTES_MAX`, and never more than the `room` the read has left
/// (whole frames: a run may run past it by one frame).
pub(crate) fn round_share(budget_bytes: usize, segments: usize, room: u64) -> u64 {
    let budget = u64::try_from(budget_bytes).unwrap_or(u64::MAX);
    let segments = u64::try_from(segments.max(1)).unwrap_or(u64::MAX);
    (budget / segments)
        .clamp(REMOTE_CHUNK_BYTES_MIN, CATCH_UP_BYTES_MAX)
        .min((room / segments).max(1))
}

/// A run of `blocked`'s segment from its first live holder that answers
/// with good frames (an active segment's primary first: the replicas are
/// in that order), or `None` (each failure logged at debug).
async fn fetch_chunk(
    broker: &ReadCtx,
    topic: &str,
    blocked: &Blocked,
    bytes_max: u64,
) -> Option<RemoteChunk> {
    let raft = broker.place.links.raft.get()?;
    let request = CatchUpRequest {
        topic: topic.to_string(),
        segment: blocked.segment.0,
        // Catch-up only reads: a reader is no coordinator and carries no
        // order (ADR 0118).
        order: OrderEpoch::default(),
        from: blocked.from,
        bytes_max,
    };
    let body = match request.encode() {
        Ok(body) => body,
        Err(e) => {
            debug!(segment = blocked.segment.0, error = %e, "a remote read request does not encode");
            return None;
        }
    };
    for holder in holders_to_try(broker, &blocked.holders) {
        let answer = raft
            .replication
            .call_raw(holder, CATCH_UP_API_KEY, 0, &body, REMOTE_READ_TIMEOUT_MS)
            .await
            .map_err(|e| e.to_string())
            .and_then(|bytes| CatchUpResponse::decode(bytes).map_err(|e| e.to_string()));
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                debug!(segment = blocked.segment.0, holder, %error, "a holder did not answer a remote read");
                continue;
            }
        };
        match checked_run(blocked, answer) {
            Ok(chunk) => {
                broker
                    .metrics
                    .remote_read_bytes
                    .increment(chunk.bytes() as u64);
                debug!(
                    segment = blocked.segment.0,
                    holder,
                    from = chunk.first,
                    records = chunk.records(),
                    bytes = chunk.bytes(),
                    active = blocked.seal_length.is_none(),
                    "read a segment's records from a holder"
                );
                return Some(chunk);
            }
            Err(why) => {
                debug!(segment = blocked.segment.0, holder, %why, "a holder's answer to a remote read cannot be served; trying another");
            }
        }
    }
    None
}

/// The readable end of `tail`'s active segment as its holders say it
/// (primary first: its committed end; a follower's is the last one its
/// primary told it, never more), for a tail reader's start on a broker
/// holding no copy (ADR 0123). No holder answering is the range's
/// retriable refusal: a tail taken as 0 would read the segment from its
/// start.
pub(crate) async fn readable_end(
    broker: &ReadCtx,
    tail: &TailElsewhere,
) -> Result<u64, ServeError> {
    use crate::control::replica_status::{Lane, ask_status};
    use malachi_wire::replica_status::ReplicaStatusRequest;
    let request = ReplicaStatusRequest {
        segments: vec![tail.segment.0],
        ..ReplicaStatusRequest::default()
    };
    for holder in holders_to_try(broker, &tail.holders) {
        let answer = ask_status(
            &broker.place.links,
            holder,
            &request,
            REMOTE_READ_TIMEOUT_MS,
            Lane::Replication,
        )
        .await;
        let end = match answer {
            Ok(answer) => answer
                .copies
                .into_iter()
                .find(|c| c.segment == tail.segment.0)
                .and_then(|c| c.committed_end),
            Err(error) => {
                debug!(segment = tail.segment.0, holder, %error, "a holder did not say its readable end");
                None
            }
        };
        if let Some(end) = end {
            return Ok(end);
        }
    }
    let blocked = Blocked {
        range: Some(tail.range),
        segment: tail.segment,
        offset: tail.start_offset,
        from: 0,
        seal_length: None,
        reason: "no holder of this active segment said where its records end",
        holders: tail.holders.clone(),
        damage: None,
    };
    Err(blocked.refusal())
}

/// Why one holder's answer to a remote read is not served.
#[derive(Debug, thiserror::Error)]
enum Unserved {
    #[error("refused ({refusal:?}): {message}")]
    Refused {
        refusal: malachi_wire::replica_order::OrderRefusal,
        message: String,
    },
    #[error("answered from offset {first_offset}, not {from}")]
    OtherOffset { first_offset: u64, from: u64 },
    #[error(transparent)]
    Bad(#[from] RemoteChunkError),
}

/// The run a holder's `answer` to `blocked`'s read gives, cut where the
/// segment's readers stop: its seal, or (active) the readable end the
/// holder answered with.
fn checked_run(blocked: &Blocked, answer: CatchUpResponse) -> Result<RemoteChunk, Unserved> {
    if let Some(refusal) = answer.refused {
        return Err(Unserved::Refused {
            refusal,
            message: answer.message,
        });
    }
    if answer.first_offset != blocked.from {
        return Err(Unserved::OtherOffset {
            first_offset: answer.first_offset,
            from: blocked.from,
        });
    }
    let end_max = match (blocked.seal_length, answer.readable_end) {
        (Some(seal_length), _) => RunEnd::Seal(seal_length),
        (None, Some(readable_end)) => RunEnd::Readable(readable_end),
        (None, None) => {
            return Err(Unserved::Bad(RemoteChunkError::NoReadableEnd {
                segment: blocked.segment,
            }));
        }
    };
    Ok(RemoteChunk::parse(
        blocked.segment,
        blocked.from,
        end_max,
        answer.frames,
    )?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use malachi_storage::Record;

    const SEGMENT: SegmentId = SegmentId(7);

    /// Frames of records `first..first + n`, keys `k<offset>`.
    fn frames(first: u64, n: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        for offset in first..first + n {
            let record = Record::new(1, format!("k{offset}"), vec![b'v'; 10]);
            frame::encode(&mut buf, offset, first, &record);
        }
        buf
    }

    fn keys(chunk: &RemoteChunk, from: u64, records_max: usize, bytes_max: usize) -> Vec<String> {
        let mut keys = Vec::new();
        let taken = chunk
            .visit(from, records_max, bytes_max, &mut |view| {
                keys.push(String::from_utf8(view.key.to_vec()).unwrap());
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(taken, keys.len());
        keys
    }

    #[test]
    fn good_frames_from_a_holder_are_visited_in_order_from_the_offset_asked() {
        let chunk =
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(100), Bytes::from(frames(10, 5))).unwrap();
        assert!(chunk.covers(10) && chunk.covers(14) && !chunk.covers(15) && !chunk.covers(9));
        assert_eq!(
            keys(&chunk, 10, 100, 1 << 20),
            ["k10", "k11", "k12", "k13", "k14"]
        );
        assert_eq!(keys(&chunk, 12, 2, 1 << 20), ["k12", "k13"]);
        // The byte budget stops the visit after the first record over it.
        assert_eq!(keys(&chunk, 11, 100, 1), ["k11"]);
    }

    #[test]
    fn a_chunk_is_cut_at_the_seal_and_never_read_past_it() {
        let bytes = frames(10, 5);
        let chunk =
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(13), Bytes::from(bytes.clone())).unwrap();
        assert!(chunk.covers(12) && !chunk.covers(13));
        assert!(chunk.bytes() < bytes.len());
        assert_eq!(keys(&chunk, 10, 100, 1 << 20), ["k10", "k11", "k12"]);
        // Nothing below the seal at all is refused.
        assert_eq!(
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(10), Bytes::from(bytes)),
            Err(RemoteChunkError::Empty {
                segment: SEGMENT,
                first: 10,
                end_max: 10
            })
        );
        assert!(matches!(
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(100), Bytes::new()),
            Err(RemoteChunkError::Empty { .. })
        ));
    }

    #[test]
    fn a_corrupted_frame_from_a_holder_is_refused_with_a_typed_error() {
        let mut bytes = frames(10, 3);
        // A flipped byte in the last frame's value.
        let last = bytes.len() - 21;
        bytes[last] ^= 0x40;
        let refused =
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(100), Bytes::from(bytes)).unwrap_err();
        assert!(
            matches!(
                refused,
                RemoteChunkError::Frame {
                    segment: SEGMENT,
                    offset: 12,
                    source: FrameError::BadCrc { .. }
                }
            ),
            "{refused:?}"
        );
        // A torn last frame is refused too, not served short.
        let bytes = frames(10, 3);
        let torn = Bytes::from(bytes[..bytes.len() - 1].to_vec());
        assert!(matches!(
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(100), torn),
            Err(RemoteChunkError::Frame {
                offset: 12,
                source: FrameError::Incomplete { .. },
                ..
            })
        ));
    }

    #[test]
    fn frames_of_other_offsets_than_asked_are_refused() {
        let refused =
            RemoteChunk::parse(SEGMENT, 11, RunEnd::Seal(100), Bytes::from(frames(10, 3)))
                .unwrap_err();
        assert!(matches!(
            refused,
            RemoteChunkError::Frame {
                offset: 11,
                source: FrameError::OffsetMismatch {
                    found: 10,
                    expected: 11
                },
                ..
            }
        ));
    }

    #[test]
    fn a_run_that_starts_where_the_last_ends_is_joined_to_it() {
        let bytes = frames(10, 4);
        let first =
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Seal(100), Bytes::from(frames(10, 4))).unwrap();
        let next =
            RemoteChunk::parse(SEGMENT, 14, RunEnd::Seal(100), Bytes::from(frames(14, 2))).unwrap();
        let joined = first.clone().join(next);
        assert!(joined.covers(10) && joined.covers(15) && !joined.covers(16));
        assert_eq!(joined.bytes(), bytes.len() + frames(14, 2).len());
        assert_eq!(keys(&joined, 13, 100, 1 << 20), ["k13", "k14", "k15"]);
        // A run elsewhere in the segment replaces it.
        let apart =
            RemoteChunk::parse(SEGMENT, 20, RunEnd::Seal(100), Bytes::from(frames(20, 1))).unwrap();
        assert_eq!(first.join(apart.clone()), apart);
    }

    #[test]
    fn a_round_shares_the_read_budget_within_its_bounds() {
        let room = REMOTE_READ_BYTES_MAX;
        assert_eq!(round_share(1, 1, room), REMOTE_CHUNK_BYTES_MIN);
        assert_eq!(round_share(300 << 10, 1, room), 300 << 10);
        assert_eq!(round_share(usize::MAX, 1, room), CATCH_UP_BYTES_MAX);
        // Several ranges share the budget, each at least the minimum.
        assert_eq!(round_share(1 << 20, 4, room), 256 << 10);
        assert_eq!(round_share(1 << 20, 16, room), REMOTE_CHUNK_BYTES_MIN);
        // The read's room left bounds every run of the round.
        assert_eq!(round_share(1 << 20, 2, 100 << 10), 50 << 10);
        assert_eq!(round_share(1 << 20, 2, 1), 1);
    }

    #[test]
    fn an_active_segments_run_is_cut_at_the_holders_readable_end() {
        // The holder's copy holds 5 records, 3 of them committed.
        let bytes = frames(10, 5);
        let run =
            RemoteChunk::parse(SEGMENT, 10, RunEnd::Readable(13), Bytes::from(bytes)).unwrap();
        assert_eq!(keys(&run, 10, 100, 1 << 20), ["k10", "k11", "k12"]);
        assert!(!run.covers(13));
        // Read to the readable end: nothing more there for now.
        assert!(run.reached_readable_end(13));
        assert!(!run.reached_readable_end(12));
    }

    #[test]
    fn an_active_segments_holder_with_nothing_new_is_a_run_at_its_end() {
        let caught_up =
            RemoteChunk::parse(SEGMENT, 13, RunEnd::Readable(13), Bytes::new()).unwrap();
        assert_eq!(caught_up.records(), 0);
        assert!(caught_up.reached_readable_end(13));
        // A sealed segment's holder that sends nothing below the seal is bad.
        assert!(matches!(
            RemoteChunk::parse(SEGMENT, 13, RunEnd::Seal(20), Bytes::new()),
            Err(RemoteChunkError::Empty { .. })
        ));
        // So is an active one's that sends nothing below its readable end.
        assert!(matches!(
            RemoteChunk::parse(SEGMENT, 13, RunEnd::Readable(20), Bytes::new()),
            Err(RemoteChunkError::Empty { .. })
        ));
        // A run cut by bytes, short of the readable end, is not at the end.
        let short = RemoteChunk::parse(
            SEGMENT,
            10,
            RunEnd::Readable(20),
            Bytes::from(frames(10, 2)),
        )
        .unwrap();
        assert!(!short.reached_readable_end(12));
    }

    fn blocked(seal_length: Option<u64>) -> Blocked {
        Blocked {
            range: Some(malachi_core::model::RangeId(3)),
            segment: SEGMENT,
            offset: 110,
            from: 10,
            seal_length,
            reason: "no copy on this broker",
            holders: vec![2, 3],
            damage: None,
        }
    }

    #[test]
    fn an_answer_without_a_readable_end_is_never_served_for_an_active_segment() {
        // A broker older than ADR 0123 sends its durable frames only.
        let old = CatchUpResponse::frames(10, 15, Bytes::from(frames(10, 5)));
        assert!(matches!(
            checked_run(&blocked(None), old.clone()),
            Err(Unserved::Bad(RemoteChunkError::NoReadableEnd { .. }))
        ));
        // The same answer serves a sealed segment, cut at its seal.
        let sealed = checked_run(&blocked(Some(12)), old).unwrap();
        assert_eq!(sealed.records(), 2);
        // With the readable end, an active segment's run stops there.
        let new = CatchUpResponse::frames(10, 15, Bytes::from(frames(10, 5))).with_readable_end(14);
        assert_eq!(checked_run(&blocked(None), new).unwrap().records(), 4);
        // An answer from another offset is not served.
        let other =
            CatchUpResponse::frames(11, 15, Bytes::from(frames(11, 2))).with_readable_end(14);
        assert!(matches!(
            checked_run(&blocked(None), other),
            Err(Unserved::OtherOffset { .. })
        ));
    }

    #[test]
    fn the_refusal_of_a_read_that_cannot_reach_a_range_names_the_range() {
        let outcome = ReadOutcome {
            positions: Default::default(),
            records: 0,
            bytes: 0,
            blocked: vec![blocked(None)],
        };
        let Err(ReadError::NotHere(refused)) = finish(outcome, (), false) else {
            panic!("a read with nothing to answer and a range it cannot reach is refused");
        };
        assert!(
            refused
                .to_string()
                .starts_with("range 3 of the topic: segment"),
            "{refused}"
        );
        // With records of other ranges to give, they are answered.
        let outcome = ReadOutcome {
            positions: Default::default(),
            records: 2,
            bytes: 20,
            blocked: vec![blocked(None)],
        };
        assert!(finish(outcome, (), false).is_ok());
    }
}
