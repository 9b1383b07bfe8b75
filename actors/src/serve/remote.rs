//! Reading a sealed segment's records from a broker that holds a copy
//! (chaos finding F1, ADR 0118).
//!
//! A fetch or subscription is served by the primary of the topic's active
//! segments, but the sealed segments behind them were placed on their own:
//! the serving broker may hold no copy of one (or a copy short of its seal,
//! lost or broken). A read pass then stops at that segment
//! ([`Blocked`](super::read::Blocked)), and [`read_through_holders`] asks a
//! live holder for a bounded run of the segment's frames with the cluster
//! port's catch-up read (api key 101, which is not order-gated: it only
//! reads), checks every frame's CRC and offset ([`RemoteChunk::parse`]),
//! and runs the pass again with that run of frames in the read's
//! [`LocalCopies`], where `read_copy` visits it exactly like a local copy.
//! So one broker serves the whole read, in the segment's order.
//!
//! Bounds: one run per segment at a time (a run that starts where the
//! last ended is joined to it, so a pass started again from the read's
//! start goes through both), each asked of at most the read's byte budget
//! (at least [`REMOTE_CHUNK_BYTES_MIN`]) and never more than
//! `CATCH_UP_BYTES_MAX`; [`REMOTE_CHUNKS_PER_READ_MAX`] chunks per read;
//! [`REMOTE_HOLDERS_TRIED_MAX`] holders tried per chunk, each within
//! [`REMOTE_READ_TIMEOUT_MS`]. Only sealed segments are read from
//! elsewhere (immutable, with a recorded length the chunk is cut at); an
//! active segment's records are only ever read from this broker's copy.

use std::sync::Arc;

use bytes::Bytes;
use malachi_cluster::model::{NodeId, SegmentId};
use malachi_storage::FrameView;
use malachi_storage::frame::{self, FrameError};
use malachi_wire::replica_order::{
    CATCH_UP_API_KEY, CATCH_UP_BYTES_MAX, CatchUpRequest, CatchUpResponse, OrderEpoch,
};
use std::ops::ControlFlow;
use tracing::debug;

use super::read::{Blocked, LocalCopies, ReadError, ReadOutcome};
use crate::control::placement::is_dead;
use crate::control::shared::Shared;

/// The least frame bytes one chunk asks for, however small the read's
/// budget (a subscription with one byte of credit), so a band-filtered
/// ancestor is not crossed a frame per round trip.
pub(crate) const REMOTE_CHUNK_BYTES_MIN: u64 = 64 << 10;
/// Chunks one read fetches at most before it answers with what it has.
pub(crate) const REMOTE_CHUNKS_PER_READ_MAX: usize = 4;
/// Holders one chunk is asked of at most.
pub(crate) const REMOTE_HOLDERS_TRIED_MAX: usize = 3;
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
    /// The run holds no frame below the segment's seal.
    #[error(
        "segment {segment}: a holder sent no record from offset {first} below the seal at {seal_length}"
    )]
    Empty {
        segment: SegmentId,
        first: u64,
        seal_length: u64,
    },
}

/// A run of a sealed segment's frames read from a holder: offsets
/// `first..end` (segment offsets, `end` at most the seal), each frame
/// checked when the run arrived and again as it is visited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteChunk {
    segment: SegmentId,
    first: u64,
    end: u64,
    frames: Bytes,
}

impl RemoteChunk {
    /// Checks `frames`, a holder's answer from segment offset `first`:
    /// every frame decodes with its CRC intact and carries the next
    /// offset; frames at or past `seal_length` are cut off, never served.
    pub(crate) fn parse(
        segment: SegmentId,
        first: u64,
        seal_length: u64,
        frames: Bytes,
    ) -> Result<RemoteChunk, RemoteChunkError> {
        let (mut at, mut offset) = (0usize, first);
        while at < frames.len() && offset < seal_length {
            let rest = frames.get(at..).unwrap_or_default();
            let (view, len) = decode_at(segment, offset, rest)?;
            drop(view);
            at += len;
            offset += 1;
        }
        if offset == first {
            return Err(RemoteChunkError::Empty {
                segment,
                first,
                seal_length,
            });
        }
        debug_assert!(offset <= seal_length);
        Ok(RemoteChunk {
            segment,
            first,
            end: offset,
            frames: frames.slice(..at),
        })
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
/// what it wrote, and whether a chunk from a holder moved the read (so an
/// answer with no record still carries a cursor further on).
pub(crate) struct ThroughHolders<T> {
    pub outcome: ReadOutcome,
    pub out: T,
    pub moved: bool,
}

/// Runs read passes (`pass`: one `read_topic` into a fresh output) until
/// one is not blocked on a sealed segment this broker cannot read, fetching
/// a chunk of that segment from a live holder before each further pass, at
/// most [`REMOTE_CHUNKS_PER_READ_MAX`] times. A pass blocked with nothing to
/// answer, and no chunk to be had, is [`ReadError::NotHere`]: retriable.
pub(crate) async fn read_through_holders<T>(
    shared: &Arc<Shared>,
    topic: &str,
    copies: LocalCopies,
    chunk_bytes: u64,
    mut pass: impl FnMut(&LocalCopies) -> Result<(ReadOutcome, T), ReadError>,
) -> Result<ThroughHolders<T>, ReadError> {
    let mut copies = copies;
    let mut moved = false;
    let mut chunks = 0usize;
    loop {
        let (outcome, out) = pass(&copies)?;
        let Some(blocked) = outcome.blocked.clone() else {
            return Ok(ThroughHolders {
                outcome,
                out,
                moved,
            });
        };
        let chunk = match blocked.seal_length {
            Some(seal_length) if chunks < REMOTE_CHUNKS_PER_READ_MAX => {
                fetch_chunk(shared, topic, &blocked, seal_length, chunk_bytes).await
            }
            _ => None,
        };
        match chunk {
            Some(chunk) => {
                chunks += 1;
                moved = true;
                copies = copies.with_remote(chunk);
            }
            None if outcome.records > 0 || moved => {
                return Ok(ThroughHolders {
                    outcome,
                    out,
                    moved,
                });
            }
            None => return Err(ReadError::NotHere(blocked)),
        }
    }
}

/// The frame bytes one chunk asks for: the read's budget, within
/// [`REMOTE_CHUNK_BYTES_MIN`] and `CATCH_UP_BYTES_MAX`.
pub(crate) fn chunk_bytes(budget_bytes: usize) -> u64 {
    u64::try_from(budget_bytes)
        .unwrap_or(u64::MAX)
        .clamp(REMOTE_CHUNK_BYTES_MIN, CATCH_UP_BYTES_MAX)
}

/// A run of `blocked`'s segment from its first live holder that answers
/// with good frames, or `None` (each failure logged at debug).
async fn fetch_chunk(
    shared: &Arc<Shared>,
    topic: &str,
    blocked: &Blocked,
    seal_length: u64,
    bytes_max: u64,
) -> Option<RemoteChunk> {
    let raft = shared.raft.get()?;
    let me = shared.config.node_id;
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
    let holders = blocked
        .holders
        .iter()
        .copied()
        .filter(|&h| h != me && !is_dead(shared, NodeId(h)))
        .take(REMOTE_HOLDERS_TRIED_MAX);
    for holder in holders {
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
        if let Some(refusal) = answer.refused {
            debug!(segment = blocked.segment.0, holder, ?refusal, message = %answer.message, "a holder refused a remote read");
            continue;
        }
        if answer.first_offset != blocked.from {
            debug!(
                segment = blocked.segment.0,
                holder,
                from = blocked.from,
                first_offset = answer.first_offset,
                "a holder answered a remote read from another offset"
            );
            continue;
        }
        match RemoteChunk::parse(blocked.segment, blocked.from, seal_length, answer.frames) {
            Ok(chunk) => {
                shared
                    .metrics
                    .remote_read_bytes
                    .increment(chunk.bytes() as u64);
                debug!(
                    segment = blocked.segment.0,
                    holder,
                    from = chunk.first,
                    records = chunk.end - chunk.first,
                    bytes = chunk.bytes(),
                    "read a sealed segment's records from a holder"
                );
                return Some(chunk);
            }
            Err(error) => {
                tracing::warn!(segment = blocked.segment.0, holder, %error, "a holder's frames for a remote read are bad; trying another");
            }
        }
    }
    None
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
        let chunk = RemoteChunk::parse(SEGMENT, 10, 100, Bytes::from(frames(10, 5))).unwrap();
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
        let chunk = RemoteChunk::parse(SEGMENT, 10, 13, Bytes::from(bytes.clone())).unwrap();
        assert!(chunk.covers(12) && !chunk.covers(13));
        assert!(chunk.bytes() < bytes.len());
        assert_eq!(keys(&chunk, 10, 100, 1 << 20), ["k10", "k11", "k12"]);
        // Nothing below the seal at all is refused.
        assert_eq!(
            RemoteChunk::parse(SEGMENT, 10, 10, Bytes::from(bytes)),
            Err(RemoteChunkError::Empty {
                segment: SEGMENT,
                first: 10,
                seal_length: 10
            })
        );
        assert!(matches!(
            RemoteChunk::parse(SEGMENT, 10, 100, Bytes::new()),
            Err(RemoteChunkError::Empty { .. })
        ));
    }

    #[test]
    fn a_corrupted_frame_from_a_holder_is_refused_with_a_typed_error() {
        let mut bytes = frames(10, 3);
        // A flipped byte in the last frame's value.
        let last = bytes.len() - 21;
        bytes[last] ^= 0x40;
        let refused = RemoteChunk::parse(SEGMENT, 10, 100, Bytes::from(bytes)).unwrap_err();
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
            RemoteChunk::parse(SEGMENT, 10, 100, torn),
            Err(RemoteChunkError::Frame {
                offset: 12,
                source: FrameError::Incomplete { .. },
                ..
            })
        ));
    }

    #[test]
    fn frames_of_other_offsets_than_asked_are_refused() {
        let refused = RemoteChunk::parse(SEGMENT, 11, 100, Bytes::from(frames(10, 3))).unwrap_err();
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
        let first = RemoteChunk::parse(SEGMENT, 10, 100, Bytes::from(frames(10, 4))).unwrap();
        let next = RemoteChunk::parse(SEGMENT, 14, 100, Bytes::from(frames(14, 2))).unwrap();
        let joined = first.clone().join(next);
        assert!(joined.covers(10) && joined.covers(15) && !joined.covers(16));
        assert_eq!(joined.bytes(), bytes.len() + frames(14, 2).len());
        assert_eq!(keys(&joined, 13, 100, 1 << 20), ["k13", "k14", "k15"]);
        // A run elsewhere in the segment replaces it.
        let apart = RemoteChunk::parse(SEGMENT, 20, 100, Bytes::from(frames(20, 1))).unwrap();
        assert_eq!(first.join(apart.clone()), apart);
    }

    #[test]
    fn a_chunk_asks_for_the_read_budget_within_its_bounds() {
        assert_eq!(chunk_bytes(1), REMOTE_CHUNK_BYTES_MIN);
        assert_eq!(chunk_bytes(300 << 10), 300 << 10);
        assert_eq!(chunk_bytes(usize::MAX), CATCH_UP_BYTES_MAX);
    }
}
