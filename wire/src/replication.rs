//! Replica-append (api key 100): how a segment's primary ships its frames
//! to a follower copy, and the follower's answer.
//!
//! These requests travel between brokers only, on the authenticated cluster
//! port (the raft port's framing and cookie handshake, on connections of
//! their own; ADR 0095), never on the client port. The request is a named
//! rmp map followed by the frame bytes, which run to the end of the payload
//! and are the primary's log bytes exactly (ADR 0094): they are carried as
//! a zero-copy slice and never re-encoded. The answer is a named rmp map
//! that says either how far the copy is durable or why it refused, so every
//! refusal is a typed [`ReplicaRefusal`] rather than a transport error.

use std::io::Cursor;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{NAME_BYTES_MAX, NESTING_DEPTH_MAX};

/// `replica_append`: frames for a follower copy (ADR 0094, 0095).
pub const REPLICA_APPEND_API_KEY: u16 = 100;

/// The frames of one segment, from `first_offset`, for a follower copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAppendRequest {
    pub topic: String,
    /// The segment id (cluster-wide, from the metadata).
    pub segment: u64,
    /// The writer's epoch; a copy refuses one older than it has seen.
    pub epoch: u64,
    /// The offset of the first frame: the follower's end, or it refuses.
    pub first_offset: u64,
    /// The highest offset durable on a quorum, as the primary knows it:
    /// the follower's readers see no record at or above it.
    pub committed_end: u64,
    /// Set by a coordinator's recovery (failover): the frames repair a
    /// fenced copy up to `to` records, under that order's epoch. Absent on
    /// a primary's shipping; older brokers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairOrder>,
    /// Whole frames, as the primary's log holds them; may be empty (a
    /// heartbeat carrying `committed_end`, or a probe of the follower's end).
    #[serde(skip)]
    pub frames: Bytes,
}

/// A recovery's repair of a fenced copy (issue 19): the frames of a
/// replica-append that carries it fill the copy up to `to` records, and no
/// further, under the coordinator's order epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairOrder {
    /// The records the repaired copy holds at most: the seal the recovery
    /// decided.
    pub to: u64,
    /// The epoch of the coordinator's order; the copy refuses one older
    /// than it has seen.
    pub order: crate::replica_order::OrderEpoch,
}

/// Why a follower copy refused a replica-append; nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaRefusal {
    /// A frame does not check (magic, length, CRC, structure, offset).
    BadFrames,
    /// `first_offset` is not the copy's end (a gap or an overlap);
    /// `durable_end` in the answer is where the copy ends.
    NotAtEnd,
    /// The epoch is older than one the copy has seen.
    StaleEpoch,
    /// The copy is fenced (or sealed) and takes no appends.
    Fenced,
    /// This broker holds no copy of the segment by the metadata it knows.
    UnknownCopy,
    /// Too many bytes wait for the copy's group commit; retry.
    Busy,
    /// The copy's disk failed; it takes no more appends.
    Failed,
    /// The request itself is malformed (a field out of bounds).
    InvalidRequest,
}

impl ReplicaRefusal {
    /// Whether the primary should send again (after a pause) rather than
    /// give the copy up until the coordinator decides.
    pub fn retriable(self) -> bool {
        matches!(
            self,
            ReplicaRefusal::NotAtEnd | ReplicaRefusal::Busy | ReplicaRefusal::UnknownCopy
        )
    }
}

/// A follower's answer to a replica-append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAppendResponse {
    /// Records durable on the follower's copy after this append (on a
    /// refusal, where the copy ends: assigned, durable or not).
    pub durable_end: u64,
    /// `None` when the frames were written and are durable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<ReplicaRefusal>,
    /// The refusal's reason, for logs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Bytes of the follower's log holding its durable records, when it
    /// tells (the primary's lag-in-bytes metric); absent from an older
    /// follower and on a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable_bytes: Option<u64>,
}

impl ReplicaAppendResponse {
    pub fn durable(durable_end: u64) -> ReplicaAppendResponse {
        ReplicaAppendResponse {
            durable_end,
            refused: None,
            message: String::new(),
            durable_bytes: None,
        }
    }

    pub fn refused(
        refusal: ReplicaRefusal,
        durable_end: u64,
        message: impl Into<String>,
    ) -> ReplicaAppendResponse {
        ReplicaAppendResponse {
            durable_end,
            refused: Some(refusal),
            message: message.into(),
            durable_bytes: None,
        }
    }
}

const REQUEST_NAME: &str = "replica_append_request";
const RESPONSE_NAME: &str = "replica_append_response";
/// A refusal's message is for logs: longer ones are cut.
pub const REFUSAL_MESSAGE_BYTES_MAX: usize = 1024;

impl ReplicaAppendRequest {
    fn check(&self) -> Result<(), WireError> {
        if self.topic.is_empty() || self.topic.len() > NAME_BYTES_MAX {
            return Err(WireError::InvalidField {
                field: "topic",
                reason: "empty or longer than a name may be",
            });
        }
        Ok(())
    }

    /// The control map and the frames, as the two pieces of a payload, so a
    /// sender can write the frames without copying them.
    pub fn encode_parts(&self) -> Result<(Bytes, Bytes), WireError> {
        self.check()?;
        let control = rmp_serde::to_vec_named(self).map_err(|source| WireError::Encode {
            message: REQUEST_NAME,
            source,
        })?;
        Ok((Bytes::from(control), self.frames.clone()))
    }

    pub fn encode(&self) -> Result<Bytes, WireError> {
        let (control, frames) = self.encode_parts()?;
        let mut out = BytesMut::with_capacity(control.len() + frames.len());
        out.put_slice(&control);
        out.put_slice(&frames);
        Ok(out.freeze())
    }

    /// Decodes a payload; the frames are a slice of it. Their contents are
    /// checked by the store that writes them, not here.
    pub fn decode(payload: Bytes) -> Result<ReplicaAppendRequest, WireError> {
        let mut de = rmp_serde::Deserializer::new(Cursor::new(payload.as_ref()));
        de.set_max_depth(NESTING_DEPTH_MAX);
        let mut request =
            ReplicaAppendRequest::deserialize(&mut de).map_err(|source| WireError::Decode {
                message: REQUEST_NAME,
                source,
            })?;
        let used = usize::try_from(de.position())
            .unwrap_or(payload.len())
            .min(payload.len());
        request.frames = payload.slice(used..);
        request.check()?;
        Ok(request)
    }
}

impl ReplicaAppendResponse {
    pub fn encode(&self) -> Result<Bytes, WireError> {
        let mut message = self.message.clone();
        if message.len() > REFUSAL_MESSAGE_BYTES_MAX {
            let mut cut = REFUSAL_MESSAGE_BYTES_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let shown = ReplicaAppendResponse {
            message,
            ..self.clone()
        };
        rmp_serde::to_vec_named(&shown)
            .map(Bytes::from)
            .map_err(|source| WireError::Encode {
                message: RESPONSE_NAME,
                source,
            })
    }

    pub fn decode(payload: &[u8]) -> Result<ReplicaAppendResponse, WireError> {
        let mut de = rmp_serde::Deserializer::new(Cursor::new(payload));
        de.set_max_depth(NESTING_DEPTH_MAX);
        let response =
            ReplicaAppendResponse::deserialize(&mut de).map_err(|source| WireError::Decode {
                message: RESPONSE_NAME,
                source,
            })?;
        let used = usize::try_from(de.position())
            .unwrap_or(payload.len())
            .min(payload.len());
        if used != payload.len() {
            return Err(WireError::TrailingBytes {
                message: RESPONSE_NAME,
                bytes: payload.len() - used,
            });
        }
        if response.message.len() > REFUSAL_MESSAGE_BYTES_MAX {
            return Err(WireError::OverLimit {
                field: "message",
                actual: response.message.len(),
                limit: REFUSAL_MESSAGE_BYTES_MAX,
            });
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_request_round_trips_with_its_frames_as_a_slice() {
        let request = ReplicaAppendRequest {
            topic: "orders".into(),
            segment: 7,
            epoch: 3,
            first_offset: 10,
            committed_end: 8,
            repair: None,
            frames: Bytes::from_static(b"MLR1 frames"),
        };
        let bytes = request.encode().unwrap();
        assert!(bytes.ends_with(b"MLR1 frames"));
        assert_eq!(ReplicaAppendRequest::decode(bytes).unwrap(), request);
    }

    #[test]
    fn a_repair_order_round_trips_and_is_absent_from_a_shipping() {
        use crate::replica_order::OrderEpoch;
        let shipping = ReplicaAppendRequest {
            topic: "orders".into(),
            segment: 7,
            epoch: 3,
            first_offset: 10,
            committed_end: 8,
            repair: None,
            frames: Bytes::from_static(b"MLR1 frames"),
        };
        let plain = shipping.encode().unwrap();
        assert!(!plain.windows(6).any(|w| w == b"repair"));
        let repair = ReplicaAppendRequest {
            repair: Some(RepairOrder {
                to: 12,
                order: OrderEpoch { group: 4, term: 9 },
            }),
            ..shipping
        };
        let bytes = repair.encode().unwrap();
        assert!(bytes.ends_with(b"MLR1 frames"));
        assert_eq!(ReplicaAppendRequest::decode(bytes).unwrap(), repair);
    }

    #[test]
    fn a_response_round_trips_and_refuses_trailing_bytes() {
        for response in [
            ReplicaAppendResponse::durable(12),
            ReplicaAppendResponse::refused(ReplicaRefusal::NotAtEnd, 4, "ends at 4"),
        ] {
            let bytes = response.encode().unwrap();
            assert_eq!(ReplicaAppendResponse::decode(&bytes).unwrap(), response);
            let mut longer = bytes.to_vec();
            longer.push(0);
            assert!(ReplicaAppendResponse::decode(&longer).is_err());
        }
    }

    #[test]
    fn an_empty_topic_is_refused_both_ways() {
        let request = ReplicaAppendRequest {
            topic: String::new(),
            segment: 1,
            epoch: 0,
            first_offset: 0,
            committed_end: 0,
            repair: None,
            frames: Bytes::new(),
        };
        assert!(request.encode().is_err());
        let control = rmp_serde::to_vec_named(&request).unwrap();
        assert!(ReplicaAppendRequest::decode(Bytes::from(control)).is_err());
    }
}
