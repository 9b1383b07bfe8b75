//! The coordinator's data-plane orders (issue 19, failover): fence
//! (api key 103), catch-up (101) and seal (102), which a vnode's
//! coordinator sends to the brokers holding copies of a segment whose
//! primary is gone, and the copies' answers.
//!
//! A failover fences the copies (so that no primary can commit into them
//! any more) and learns their durable ends, reads the frames a short copy
//! lacks from a longer one with catch-up, writes them with a replica-append
//! carrying a [`RepairOrder`](crate::replication::RepairOrder), and seals
//! the complete copies at the length it recorded in the metadata.
//!
//! Like replica-append, these requests travel between brokers only, on the
//! authenticated cluster port (the raft port's framing and cookie
//! handshake, ADR 0095), never on the client port. Every order carries an
//! [`OrderEpoch`]: the vnode group of the coordinator that sends it and the
//! raft term it leads in. A copy refuses an order of the same group with an
//! older term than it has seen ([`OrderRefusal::StaleOrder`]), and keeps
//! the newest in its fence marker, across restarts. Requests and answers
//! are named rmp maps (ADR 0040), so a later version may add optional
//! fields; a catch-up answer is followed by the frames it carries, the
//! copy's log bytes exactly, as a zero-copy slice. Every refusal is a typed
//! [`OrderRefusal`] in the answer, not a transport error.

use std::io::Cursor;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{NAME_BYTES_MAX, NESTING_DEPTH_MAX};
use crate::replication::REFUSAL_MESSAGE_BYTES_MAX;

/// Drop copies (104, issue 21, ADR 0115): the segments named are no longer
/// in the metadata (a deleted topic, retention); remove their copies.
pub const DROP_COPIES_API_KEY: u16 = 104;
/// The most segment ids one drop order names.
pub const DROP_COPIES_SEGMENTS_MAX: usize = 4096;

/// `catch_up`: read a copy's durable frames from an offset.
pub const CATCH_UP_API_KEY: u16 = 101;
/// `seal`: seal a copy at a length.
pub const SEAL_API_KEY: u16 = 102;
/// `fence`: stop a copy taking appends from its primary.
pub const FENCE_API_KEY: u16 = 103;

/// Frame bytes one catch-up answer carries at most (1 MiB).
pub const CATCH_UP_BYTES_MAX: u64 = 1 << 20;

/// The frame bytes a catch-up answer may carry on the wire: the copy
/// answers whole frames, so the last may run past the `bytes_max` asked
/// for; a larger answer is refused as over the limit.
const CATCH_UP_FRAMES_BYTES_MAX: usize = 2 * CATCH_UP_BYTES_MAX as usize;

/// The epoch of a coordinator's order: its vnode group's id and the raft
/// term it leads in. A copy refuses an order of the same group with an
/// older term than it has seen.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub struct OrderEpoch {
    /// The vnode group whose coordinator sends the order.
    pub group: u64,
    /// The raft term in which that coordinator leads its group.
    pub term: u64,
}

impl OrderEpoch {
    /// The epoch of an order sent by `group`'s leader in `term`.
    pub fn new(group: u64, term: u64) -> OrderEpoch {
        OrderEpoch { group, term }
    }
}

/// A seal recorded on a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedAt {
    /// Records in the sealed copy.
    pub length: u64,
    /// Bytes of the log holding them.
    pub bytes: u64,
}

/// Why a copy refused an order; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderRefusal {
    /// The copy has seen a newer order epoch of the same group.
    StaleOrder,
    /// This broker holds no copy of the segment by the metadata it knows.
    UnknownCopy,
    /// The copy's disk failed.
    Failed,
    /// A seal at a length past the copy's durable end.
    Short,
    /// The copy is sealed at another length.
    SealMismatch,
    /// The broker cannot answer now; retry.
    Busy,
    /// The request is malformed.
    InvalidRequest,
}

impl OrderRefusal {
    /// Whether the coordinator should send the order again (after a pause)
    /// rather than count the copy out of this order.
    pub fn retriable(self) -> bool {
        matches!(
            self,
            OrderRefusal::Busy | OrderRefusal::UnknownCopy | OrderRefusal::Short
        )
    }
}

/// Fence (103): stop the copy taking appends from its primary,
/// persistently, drain what is queued, and report its durable end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRequest {
    /// The segment's topic (a name).
    pub topic: String,
    /// The segment id (cluster-wide, from the metadata).
    pub segment: u64,
    /// The order's epoch; the copy refuses one older than it has seen.
    pub order: OrderEpoch,
}

/// A copy's answer to a fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceResponse {
    /// Records durable on the copy once fenced and drained.
    pub durable_end: u64,
    /// Bytes of the copy's log holding those records.
    pub durable_bytes: u64,
    /// The copy's seal, when it is sealed (by an earlier order, or its
    /// primary's roll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<SealedAt>,
    /// The newest order epoch the copy has seen (on a refusal, the one
    /// that refused).
    #[serde(default)]
    pub order: OrderEpoch,
    /// `None` when the copy is fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<OrderRefusal>,
    /// The refusal's reason, for logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl FenceResponse {
    /// A fenced copy's answer: its durable end and bytes after the drain,
    /// and the newest order epoch it has seen.
    pub fn fenced(durable_end: u64, durable_bytes: u64, order: OrderEpoch) -> FenceResponse {
        FenceResponse {
            durable_end,
            durable_bytes,
            sealed: None,
            order,
            refused: None,
            message: String::new(),
        }
    }

    /// The same answer, from a copy sealed at `sealed`.
    pub fn with_seal(self, sealed: SealedAt) -> FenceResponse {
        FenceResponse {
            sealed: Some(sealed),
            ..self
        }
    }

    /// A refusal; `order` is the epoch that refused (the newest the copy
    /// has seen).
    pub fn refused(
        refusal: OrderRefusal,
        order: OrderEpoch,
        message: impl Into<String>,
    ) -> FenceResponse {
        FenceResponse {
            durable_end: 0,
            durable_bytes: 0,
            sealed: None,
            order,
            refused: Some(refusal),
            message: message.into(),
        }
    }
}

/// Catch-up (101): read a copy's durable frames verbatim from `from`
/// (works on fenced and sealed copies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUpRequest {
    /// The segment's topic (a name).
    pub topic: String,
    /// The segment id (cluster-wide, from the metadata).
    pub segment: u64,
    /// The order's epoch, for logs: catch-up only reads and is not
    /// order-gated, and a broker reading a sealed segment to serve a fetch
    /// sends the zero epoch (ADR 0118).
    pub order: OrderEpoch,
    /// The offset of the first record to read.
    pub from: u64,
    /// Frame bytes to answer at most (whole frames: the last may run past
    /// it); at most [`CATCH_UP_BYTES_MAX`].
    pub bytes_max: u64,
}

/// A copy's answer to a catch-up: the frames from the offset asked, as its
/// log holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUpResponse {
    /// Offset of the first frame (== request.from when frames are non-empty).
    pub first_offset: u64,
    /// The copy's durable end when it answered.
    pub durable_end: u64,
    /// `None` when the frames were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<OrderRefusal>,
    /// The refusal's reason, for logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The copy's readable end when it answered: the records its own
    /// readers may see (committed ones for a replicated copy, the seal for
    /// a sealed one). A broker reading an *active* segment it holds no copy
    /// of serves only the frames below it (ADR 0123). `None` from a broker
    /// that predates the field: such an answer is never used for an active
    /// segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readable_end: Option<u64>,
    /// Whole frames as the copy's log holds them, after the map (like
    /// ReplicaAppendRequest's frames): zero-copy slice on decode. Empty on
    /// a refusal, and when `from` is the copy's durable end.
    #[serde(skip)]
    pub frames: Bytes,
}

impl CatchUpResponse {
    /// The frames read from `first_offset`, with the copy's durable end.
    pub fn frames(first_offset: u64, durable_end: u64, frames: Bytes) -> CatchUpResponse {
        CatchUpResponse {
            first_offset,
            durable_end,
            refused: None,
            message: String::new(),
            readable_end: None,
            frames,
        }
    }

    /// The same answer, saying the copy's readable end.
    pub fn with_readable_end(mut self, readable_end: u64) -> CatchUpResponse {
        self.readable_end = Some(readable_end);
        self
    }

    /// A refusal, with the copy's durable end (0 when unknown).
    pub fn refused(
        refusal: OrderRefusal,
        durable_end: u64,
        message: impl Into<String>,
    ) -> CatchUpResponse {
        CatchUpResponse {
            first_offset: 0,
            durable_end,
            refused: Some(refusal),
            message: message.into(),
            readable_end: None,
            frames: Bytes::new(),
        }
    }
}

/// Seal (102): seal the copy at `length` records (idempotent at the same
/// length).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRequest {
    /// The segment's topic (a name).
    pub topic: String,
    /// The segment id (cluster-wide, from the metadata).
    pub segment: u64,
    /// The order's epoch; the copy refuses one older than it has seen.
    pub order: OrderEpoch,
    /// The records the sealed copy holds: the seal the metadata recorded.
    pub length: u64,
}

/// A copy's answer to a seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealResponse {
    /// Records durable on the copy.
    pub durable_end: u64,
    /// The copy's seal: the one asked for once sealed; on a
    /// `seal_mismatch` refusal, the other one it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<SealedAt>,
    /// `None` when the copy is sealed at the length asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<OrderRefusal>,
    /// The refusal's reason, for logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl SealResponse {
    /// A copy sealed at `sealed` (now or by an earlier order).
    pub fn sealed(durable_end: u64, sealed: SealedAt) -> SealResponse {
        SealResponse {
            durable_end,
            sealed: Some(sealed),
            refused: None,
            message: String::new(),
        }
    }

    /// A refusal, with the copy's durable end (0 when unknown).
    pub fn refused(
        refusal: OrderRefusal,
        durable_end: u64,
        message: impl Into<String>,
    ) -> SealResponse {
        SealResponse {
            durable_end,
            sealed: None,
            refused: Some(refusal),
            message: message.into(),
        }
    }
}

/// Drop copies (104): sent by a vnode's coordinator once a delete of the
/// segments committed. The holder checks with the topic's vnode that none
/// is listed before it removes anything, so a stale or misdirected order
/// removes nothing that is still wanted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropCopiesRequest {
    /// The segments' topic (a name): whose vnode the holder asks.
    pub topic: String,
    /// The segment ids, at most [`DROP_COPIES_SEGMENTS_MAX`].
    pub segments: Vec<u64>,
}

/// A holder's answer to a drop order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropCopiesResponse {
    /// The segments whose copies this broker removed (or never held).
    pub removed: Vec<u64>,
    /// The segments the metadata still lists: kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<u64>,
    /// Bytes the removals freed.
    pub freed_bytes: u64,
    /// Why nothing was removed (the vnode could not be asked, a disk
    /// error), for logs; empty on success.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

const DROP_COPIES_REQUEST_NAME: &str = "drop_copies_request";
const DROP_COPIES_RESPONSE_NAME: &str = "drop_copies_response";
const FENCE_REQUEST_NAME: &str = "fence_request";
const FENCE_RESPONSE_NAME: &str = "fence_response";
const CATCH_UP_REQUEST_NAME: &str = "catch_up_request";
const CATCH_UP_RESPONSE_NAME: &str = "catch_up_response";
const SEAL_REQUEST_NAME: &str = "seal_request";
const SEAL_RESPONSE_NAME: &str = "seal_response";

/// A topic name: not empty, at most [`NAME_BYTES_MAX`] bytes.
fn check_topic(topic: &str) -> Result<(), WireError> {
    if topic.is_empty() || topic.len() > NAME_BYTES_MAX {
        return Err(WireError::InvalidField {
            field: "topic",
            reason: "empty or longer than a name may be",
        });
    }
    Ok(())
}

/// A refusal's message, cut to [`REFUSAL_MESSAGE_BYTES_MAX`] at a
/// character boundary.
fn cut_message(message: &str) -> String {
    let mut cut = message.len().min(REFUSAL_MESSAGE_BYTES_MAX);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message[..cut].to_owned()
}

/// A decoded message is refused over [`REFUSAL_MESSAGE_BYTES_MAX`]: an
/// encoder cuts it.
fn check_message(message: &str) -> Result<(), WireError> {
    if message.len() > REFUSAL_MESSAGE_BYTES_MAX {
        return Err(WireError::OverLimit {
            field: "message",
            actual: message.len(),
            limit: REFUSAL_MESSAGE_BYTES_MAX,
        });
    }
    Ok(())
}

/// A named rmp map.
fn encode<T: Serialize>(value: &T, name: &'static str) -> Result<Bytes, WireError> {
    rmp_serde::to_vec_named(value)
        .map(Bytes::from)
        .map_err(|source| WireError::Encode {
            message: name,
            source,
        })
}

/// Decodes the map at the start of `payload`; returns it and the bytes it
/// took.
fn decode_map<T: DeserializeOwned>(
    payload: &[u8],
    name: &'static str,
) -> Result<(T, usize), WireError> {
    let mut de = rmp_serde::Deserializer::new(Cursor::new(payload));
    de.set_max_depth(NESTING_DEPTH_MAX);
    let value = T::deserialize(&mut de).map_err(|source| WireError::Decode {
        message: name,
        source,
    })?;
    let used = usize::try_from(de.position())
        .unwrap_or(payload.len())
        .min(payload.len());
    Ok((value, used))
}

/// Decodes one whole map, refusing trailing bytes.
fn decode<T: DeserializeOwned>(payload: &[u8], name: &'static str) -> Result<T, WireError> {
    let (value, used) = decode_map(payload, name)?;
    if used != payload.len() {
        return Err(WireError::TrailingBytes {
            message: name,
            bytes: payload.len() - used,
        });
    }
    Ok(value)
}

impl FenceRequest {
    /// The bounds: a topic name that is not empty and not too long.
    fn check(&self) -> Result<(), WireError> {
        check_topic(&self.topic)
    }

    /// Encodes the request as a named map, after checking its bounds.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        self.check()?;
        encode(self, FENCE_REQUEST_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused) and checks its bounds.
    pub fn decode(payload: &[u8]) -> Result<FenceRequest, WireError> {
        let request: FenceRequest = decode(payload, FENCE_REQUEST_NAME)?;
        request.check()?;
        Ok(request)
    }
}

impl FenceResponse {
    /// Encodes the answer, its message cut to [`REFUSAL_MESSAGE_BYTES_MAX`].
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let shown = FenceResponse {
            message: cut_message(&self.message),
            ..self.clone()
        };
        encode(&shown, FENCE_RESPONSE_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused); a message
    /// over [`REFUSAL_MESSAGE_BYTES_MAX`] is refused.
    pub fn decode(payload: &[u8]) -> Result<FenceResponse, WireError> {
        let response: FenceResponse = decode(payload, FENCE_RESPONSE_NAME)?;
        check_message(&response.message)?;
        Ok(response)
    }
}

impl CatchUpRequest {
    /// The bounds: a topic name that is not empty and not too long, and
    /// `bytes_max` at most [`CATCH_UP_BYTES_MAX`].
    fn check(&self) -> Result<(), WireError> {
        check_topic(&self.topic)?;
        if self.bytes_max > CATCH_UP_BYTES_MAX {
            return Err(WireError::InvalidField {
                field: "bytes_max",
                reason: "over CATCH_UP_BYTES_MAX",
            });
        }
        Ok(())
    }

    /// Encodes the request as a named map, after checking its bounds.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        self.check()?;
        encode(self, CATCH_UP_REQUEST_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused) and checks its bounds.
    pub fn decode(payload: &[u8]) -> Result<CatchUpRequest, WireError> {
        let request: CatchUpRequest = decode(payload, CATCH_UP_REQUEST_NAME)?;
        request.check()?;
        Ok(request)
    }
}

impl CatchUpResponse {
    /// A catch-up answer carries at most twice [`CATCH_UP_BYTES_MAX`] of
    /// frames (whole frames: the last may run past what was asked).
    fn check_frames(&self) -> Result<(), WireError> {
        if self.frames.len() > CATCH_UP_FRAMES_BYTES_MAX {
            return Err(WireError::OverLimit {
                field: "frames",
                actual: self.frames.len(),
                limit: CATCH_UP_FRAMES_BYTES_MAX,
            });
        }
        if self.refused.is_some() && !self.frames.is_empty() {
            return Err(WireError::InvalidField {
                field: "frames",
                reason: "a refused catch-up carries no frames",
            });
        }
        Ok(())
    }

    /// The control map and the frames, as the two pieces of a payload, so
    /// a sender can write the frames without copying them. The message is
    /// cut to [`REFUSAL_MESSAGE_BYTES_MAX`].
    pub fn encode_parts(&self) -> Result<(Bytes, Bytes), WireError> {
        self.check_frames()?;
        let shown = CatchUpResponse {
            message: cut_message(&self.message),
            frames: Bytes::new(),
            ..self.clone()
        };
        let control = encode(&shown, CATCH_UP_RESPONSE_NAME)?;
        Ok((control, self.frames.clone()))
    }

    /// The control map followed by the frames, in one buffer.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let (control, frames) = self.encode_parts()?;
        let mut out = BytesMut::with_capacity(control.len() + frames.len());
        out.put_slice(&control);
        out.put_slice(&frames);
        Ok(out.freeze())
    }

    /// Decodes a payload; the frames are a slice of it. Their contents are
    /// checked by the store that writes them, not here; their length is
    /// refused over twice [`CATCH_UP_BYTES_MAX`], a message over
    /// [`REFUSAL_MESSAGE_BYTES_MAX`].
    pub fn decode(payload: Bytes) -> Result<CatchUpResponse, WireError> {
        let (mut response, used): (CatchUpResponse, usize) =
            decode_map(payload.as_ref(), CATCH_UP_RESPONSE_NAME)?;
        response.frames = payload.slice(used..);
        check_message(&response.message)?;
        response.check_frames()?;
        Ok(response)
    }
}

impl SealRequest {
    /// The bounds: a topic name that is not empty and not too long.
    fn check(&self) -> Result<(), WireError> {
        check_topic(&self.topic)
    }

    /// Encodes the request as a named map, after checking its bounds.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        self.check()?;
        encode(self, SEAL_REQUEST_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused) and checks its bounds.
    pub fn decode(payload: &[u8]) -> Result<SealRequest, WireError> {
        let request: SealRequest = decode(payload, SEAL_REQUEST_NAME)?;
        request.check()?;
        Ok(request)
    }
}

impl SealResponse {
    /// Encodes the answer, its message cut to [`REFUSAL_MESSAGE_BYTES_MAX`].
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let shown = SealResponse {
            message: cut_message(&self.message),
            ..self.clone()
        };
        encode(&shown, SEAL_RESPONSE_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused); a message
    /// over [`REFUSAL_MESSAGE_BYTES_MAX`] is refused.
    pub fn decode(payload: &[u8]) -> Result<SealResponse, WireError> {
        let response: SealResponse = decode(payload, SEAL_RESPONSE_NAME)?;
        check_message(&response.message)?;
        Ok(response)
    }
}

/// A list of segment ids: at most [`DROP_COPIES_SEGMENTS_MAX`].
fn check_segments(segments: &[u64]) -> Result<(), WireError> {
    if segments.len() > DROP_COPIES_SEGMENTS_MAX {
        return Err(WireError::InvalidField {
            field: "segments",
            reason: "more segment ids than one drop order may name",
        });
    }
    Ok(())
}

impl DropCopiesRequest {
    /// The bounds: a topic name, and at most [`DROP_COPIES_SEGMENTS_MAX`] ids.
    fn check(&self) -> Result<(), WireError> {
        check_topic(&self.topic)?;
        check_segments(&self.segments)
    }

    /// Encodes the request as a named map, after checking its bounds.
    pub fn encode(&self) -> Result<Bytes, WireError> {
        self.check()?;
        encode(self, DROP_COPIES_REQUEST_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused) and checks its bounds.
    pub fn decode(payload: &[u8]) -> Result<DropCopiesRequest, WireError> {
        let request: DropCopiesRequest = decode(payload, DROP_COPIES_REQUEST_NAME)?;
        request.check()?;
        Ok(request)
    }
}

impl DropCopiesResponse {
    /// Encodes the answer, its message cut to [`REFUSAL_MESSAGE_BYTES_MAX`].
    pub fn encode(&self) -> Result<Bytes, WireError> {
        check_segments(&self.removed)?;
        check_segments(&self.kept)?;
        let shown = DropCopiesResponse {
            message: cut_message(&self.message),
            ..self.clone()
        };
        encode(&shown, DROP_COPIES_RESPONSE_NAME)
    }

    /// Decodes one whole map (trailing bytes are refused) and checks its bounds.
    pub fn decode(payload: &[u8]) -> Result<DropCopiesResponse, WireError> {
        let response: DropCopiesResponse = decode(payload, DROP_COPIES_RESPONSE_NAME)?;
        check_segments(&response.removed)?;
        check_segments(&response.kept)?;
        check_message(&response.message)?;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ORDER: OrderEpoch = OrderEpoch { group: 4, term: 9 };

    #[test]
    fn requests_round_trip_and_refuse_trailing_bytes() {
        let fence = FenceRequest {
            topic: "orders".into(),
            segment: 7,
            order: ORDER,
        };
        let bytes = fence.encode().unwrap();
        assert_eq!(FenceRequest::decode(&bytes).unwrap(), fence);
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(matches!(
            FenceRequest::decode(&longer),
            Err(WireError::TrailingBytes { .. })
        ));

        let catch_up = CatchUpRequest {
            topic: "orders".into(),
            segment: 7,
            order: ORDER,
            from: 10,
            bytes_max: CATCH_UP_BYTES_MAX,
        };
        let bytes = catch_up.encode().unwrap();
        assert_eq!(CatchUpRequest::decode(&bytes).unwrap(), catch_up);
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(CatchUpRequest::decode(&longer).is_err());

        let seal = SealRequest {
            topic: "orders".into(),
            segment: 7,
            order: ORDER,
            length: 12,
        };
        let bytes = seal.encode().unwrap();
        assert_eq!(SealRequest::decode(&bytes).unwrap(), seal);
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(SealRequest::decode(&longer).is_err());
    }

    #[test]
    fn answers_round_trip_and_refuse_trailing_bytes() {
        let sealed = SealedAt {
            length: 12,
            bytes: 768,
        };
        for response in [
            FenceResponse::fenced(12, 768, ORDER),
            FenceResponse::fenced(12, 768, ORDER).with_seal(sealed),
            FenceResponse::refused(OrderRefusal::StaleOrder, ORDER, "term 9 seen"),
        ] {
            let bytes = response.encode().unwrap();
            assert_eq!(FenceResponse::decode(&bytes).unwrap(), response);
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert!(FenceResponse::decode(&longer).is_err());
        }
        for response in [
            SealResponse::sealed(12, sealed),
            SealResponse::refused(OrderRefusal::Short, 10, "durable to 10"),
        ] {
            let bytes = response.encode().unwrap();
            assert_eq!(SealResponse::decode(&bytes).unwrap(), response);
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert!(SealResponse::decode(&longer).is_err());
        }
    }

    #[test]
    fn a_catch_up_answer_round_trips_with_its_frames_as_a_slice() {
        for response in [
            CatchUpResponse::frames(10, 12, Bytes::from_static(b"MLR1 frames")),
            CatchUpResponse::frames(12, 12, Bytes::new()),
            CatchUpResponse::refused(OrderRefusal::UnknownCopy, 0, "no copy"),
        ] {
            let bytes = response.encode().unwrap();
            assert!(bytes.ends_with(&response.frames));
            assert_eq!(CatchUpResponse::decode(bytes).unwrap(), response);
        }
    }

    #[test]
    fn a_topic_out_of_bounds_is_refused_both_ways() {
        for topic in [String::new(), "t".repeat(NAME_BYTES_MAX + 1)] {
            let fence = FenceRequest {
                topic: topic.clone(),
                segment: 1,
                order: ORDER,
            };
            assert!(fence.encode().is_err());
            let bytes = rmp_serde::to_vec_named(&fence).unwrap();
            assert!(FenceRequest::decode(&bytes).is_err());

            let catch_up = CatchUpRequest {
                topic: topic.clone(),
                segment: 1,
                order: ORDER,
                from: 0,
                bytes_max: 1,
            };
            assert!(catch_up.encode().is_err());
            let bytes = rmp_serde::to_vec_named(&catch_up).unwrap();
            assert!(CatchUpRequest::decode(&bytes).is_err());

            let seal = SealRequest {
                topic,
                segment: 1,
                order: ORDER,
                length: 0,
            };
            assert!(seal.encode().is_err());
            let bytes = rmp_serde::to_vec_named(&seal).unwrap();
            assert!(SealRequest::decode(&bytes).is_err());
        }
    }

    #[test]
    fn a_catch_up_of_more_than_the_bound_is_refused_both_ways() {
        let request = CatchUpRequest {
            topic: "orders".into(),
            segment: 1,
            order: ORDER,
            from: 0,
            bytes_max: CATCH_UP_BYTES_MAX + 1,
        };
        assert!(matches!(
            request.encode(),
            Err(WireError::InvalidField {
                field: "bytes_max",
                ..
            })
        ));
        let bytes = rmp_serde::to_vec_named(&request).unwrap();
        assert!(matches!(
            CatchUpRequest::decode(&bytes),
            Err(WireError::InvalidField {
                field: "bytes_max",
                ..
            })
        ));
    }

    #[test]
    fn a_catch_up_answer_with_too_many_frame_bytes_is_refused_both_ways() {
        let at_limit =
            CatchUpResponse::frames(0, 1, Bytes::from(vec![0; CATCH_UP_FRAMES_BYTES_MAX]));
        let bytes = at_limit.encode().unwrap();
        assert_eq!(CatchUpResponse::decode(bytes).unwrap(), at_limit);

        let over =
            CatchUpResponse::frames(0, 1, Bytes::from(vec![0; CATCH_UP_FRAMES_BYTES_MAX + 1]));
        assert!(matches!(
            over.encode(),
            Err(WireError::OverLimit {
                field: "frames",
                ..
            })
        ));
        let control = rmp_serde::to_vec_named(&over).unwrap();
        let mut payload = BytesMut::from(&control[..]);
        payload.put_slice(&over.frames);
        assert!(matches!(
            CatchUpResponse::decode(payload.freeze()),
            Err(WireError::OverLimit {
                field: "frames",
                ..
            })
        ));
    }

    #[test]
    fn a_refused_catch_up_with_frames_is_refused() {
        let response = CatchUpResponse {
            frames: Bytes::from_static(b"MLR1"),
            ..CatchUpResponse::refused(OrderRefusal::Busy, 0, "")
        };
        assert!(response.encode().is_err());
        let control = rmp_serde::to_vec_named(&response).unwrap();
        let mut payload = BytesMut::from(&control[..]);
        payload.put_slice(b"MLR1");
        assert!(CatchUpResponse::decode(payload.freeze()).is_err());
    }

    #[test]
    fn a_long_message_is_cut_on_encode_and_refused_on_decode() {
        let long = "é".repeat(REFUSAL_MESSAGE_BYTES_MAX);
        let fence = FenceResponse::refused(OrderRefusal::Failed, ORDER, long.clone());
        let decoded = FenceResponse::decode(&fence.encode().unwrap()).unwrap();
        assert_eq!(decoded.message.len(), REFUSAL_MESSAGE_BYTES_MAX);
        assert!(long.starts_with(&decoded.message));
        let raw = rmp_serde::to_vec_named(&fence).unwrap();
        assert!(matches!(
            FenceResponse::decode(&raw),
            Err(WireError::OverLimit {
                field: "message",
                ..
            })
        ));

        let seal = SealResponse::refused(OrderRefusal::Failed, 0, long.clone());
        let decoded = SealResponse::decode(&seal.encode().unwrap()).unwrap();
        assert_eq!(decoded.message.len(), REFUSAL_MESSAGE_BYTES_MAX);
        let raw = rmp_serde::to_vec_named(&seal).unwrap();
        assert!(SealResponse::decode(&raw).is_err());

        let catch_up = CatchUpResponse::refused(OrderRefusal::Failed, 0, long);
        let decoded = CatchUpResponse::decode(catch_up.encode().unwrap()).unwrap();
        assert_eq!(decoded.message.len(), REFUSAL_MESSAGE_BYTES_MAX);
        let raw = rmp_serde::to_vec_named(&catch_up).unwrap();
        assert!(CatchUpResponse::decode(Bytes::from(raw)).is_err());
    }

    /// A fence answer without `order` (a field every copy sends, but
    /// `default` on decode) reads as epoch zero.
    #[test]
    fn a_fence_answer_without_an_order_decodes_as_epoch_zero() {
        #[derive(Serialize)]
        struct Bare {
            durable_end: u64,
            durable_bytes: u64,
        }
        let bytes = rmp_serde::to_vec_named(&Bare {
            durable_end: 3,
            durable_bytes: 192,
        })
        .unwrap();
        let decoded = FenceResponse::decode(&bytes).unwrap();
        assert_eq!(
            decoded,
            FenceResponse::fenced(3, 192, OrderEpoch::default())
        );
    }

    #[test]
    fn order_epochs_order_by_group_then_term() {
        assert!(OrderEpoch::new(4, 9) < OrderEpoch::new(4, 10));
        assert!(OrderEpoch::new(4, 9) < OrderEpoch::new(5, 0));
    }

    #[test]
    fn busy_unknown_copy_and_short_are_retriable() {
        let retriable: Vec<OrderRefusal> = [
            OrderRefusal::StaleOrder,
            OrderRefusal::UnknownCopy,
            OrderRefusal::Failed,
            OrderRefusal::Short,
            OrderRefusal::SealMismatch,
            OrderRefusal::Busy,
            OrderRefusal::InvalidRequest,
        ]
        .into_iter()
        .filter(|r| r.retriable())
        .collect();
        assert_eq!(
            retriable,
            vec![
                OrderRefusal::UnknownCopy,
                OrderRefusal::Short,
                OrderRefusal::Busy
            ]
        );
    }

    #[test]
    fn a_drop_order_round_trips_and_refuses_too_many_ids_both_ways() {
        let order = DropCopiesRequest {
            topic: "orders".into(),
            segments: vec![3, 4],
        };
        let bytes = order.encode().unwrap();
        assert_eq!(DropCopiesRequest::decode(&bytes).unwrap(), order);
        let answer = DropCopiesResponse {
            removed: vec![3],
            kept: vec![4],
            freed_bytes: 10,
            message: String::new(),
        };
        assert_eq!(
            DropCopiesResponse::decode(&answer.encode().unwrap()).unwrap(),
            answer
        );
        let many = DropCopiesRequest {
            topic: "orders".into(),
            segments: vec![1; DROP_COPIES_SEGMENTS_MAX + 1],
        };
        assert!(matches!(
            many.encode(),
            Err(WireError::InvalidField {
                field: "segments",
                ..
            })
        ));
        let raw = encode(&many, DROP_COPIES_REQUEST_NAME).unwrap();
        assert!(matches!(
            DropCopiesRequest::decode(&raw),
            Err(WireError::InvalidField {
                field: "segments",
                ..
            })
        ));
        let trailing = [bytes.as_ref(), &[0xc0]].concat();
        assert!(matches!(
            DropCopiesRequest::decode(&trailing),
            Err(WireError::TrailingBytes { .. })
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(FenceRequest::decode(&[0xc1, 0xff, 0x00]).is_err());
        assert!(FenceResponse::decode(&[0x91, 0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(CatchUpRequest::decode(&[0x80]).is_err());
        assert!(CatchUpResponse::decode(Bytes::from_static(&[0xde, 0xff])).is_err());
        assert!(SealRequest::decode(&[]).is_err());
        assert!(SealResponse::decode(&[0x81, 0xa1]).is_err());
    }
}
