//! Replica-status (api key 105): what a broker says about the copies of
//! segments it holds, so that `topic describe`, answered by any broker,
//! can show each copy's durable end and the primary's committed end.
//!
//! Like replica-append, these requests travel between brokers only, on the
//! authenticated cluster port (ADR 0095), never on the client port. The
//! request names segments; the answer is one entry per segment named, in
//! the request's order, each from the answering broker's own store (and,
//! for a segment it leads, its quorum tracker). Both are named rmp maps
//! (ADR 0040): a later version may add optional fields. ADR 0098 records
//! what `topic describe` does with the answers.

use std::io::Cursor;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::WireError;
use crate::limits::{NAME_BYTES_MAX, NESTING_DEPTH_MAX};
use crate::messages::{RESHAPE_HISTORY_MAX, TopicReshaping};

/// `replica_status`: the copies a broker holds, as it sees them (ADR 0098).
pub const REPLICA_STATUS_API_KEY: u16 = 105;

/// Segments one replica-status request may name; a describe of more asks
/// in several requests.
pub const REPLICA_STATUS_SEGMENTS_MAX: usize = 4096;

/// The segments to report on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReplicaStatusRequest {
    /// Segment ids (cluster-wide, from the metadata), at most
    /// [`REPLICA_STATUS_SEGMENTS_MAX`].
    pub segments: Vec<u64>,
    /// Sealed copies whose scrub verdict the asker wants (ADR 0110): each
    /// with the seal the metadata recorded, which the copy is judged
    /// against. Absent from a request that names none, so the encoding of
    /// a describe's request is unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scrub: Vec<ScrubSeal>,
    /// Sealed copies whose health the asker wants now, from what the
    /// broker knows without reading them (a describe; issue 19): each with
    /// its recorded seal. Absent from a request that names none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sealed: Vec<ScrubSeal>,
    /// The topic whose write rates and recent automatic reshapes the asker
    /// wants (a live describe, ADR 0143): the ranges the broker writes and
    /// the reshapes it asked for. Absent from a request that wants none; a
    /// broker that predates the field ignores it and answers without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates_topic: Option<String>,
    /// Sealed copies whose producer table at the seal the asker wants
    /// (ADR 0156): a segment opening on a broker with no whole copy of its
    /// predecessor reads the predecessor's final table rather than its
    /// whole log. Each with its recorded seal, at most
    /// [`PRODUCER_TABLES_MAX`]. Absent from a request that names none; a
    /// broker that predates the field answers without tables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producer_tables: Vec<ScrubSeal>,
}

/// Sealed copies one request may ask producer tables of.
pub const PRODUCER_TABLES_MAX: usize = 8;

/// Bytes of one producer table an answer may carry: room for about
/// 11,000 producer entries (44 bytes each), and within the node fabric's
/// 1 MiB answer with room to spare. A broker whose sidecar is larger
/// answers without it, and the asker reads the log instead.
pub const PRODUCER_TABLE_BYTES_MAX: usize = 512 << 10;

/// A broker's producer table of one sealed copy at its seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SealedProducers {
    pub segment: u64,
    /// The copy's producer sidecar (`docs/storage-format.md`), as on its
    /// disk, when the broker holds one for a copy that ends exactly at the
    /// seal asked; empty when it has none to give.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "bin")]
    pub sidecar: Vec<u8>,
}

/// A byte string as one msgpack `bin`, not an array of numbers.
mod bin {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bin;
        impl Visitor<'_> for Bin {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
        }
        d.deserialize_bytes(Bin)
    }
}

/// A sealed segment and the seal its metadata recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ScrubSeal {
    pub segment: u64,
    /// Records the seal covers.
    pub length: u64,
    /// Bytes of log those records span.
    pub bytes: u64,
}

/// What the broker's scrubber last found of one sealed copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ScrubVerdict {
    pub segment: u64,
    /// `pending` (queued, not read yet), `intact` (every frame's CRC good,
    /// exactly the seal's records and bytes), `damaged` (a bad frame),
    /// `missing` (no log) or `short` (fewer records or bytes than the seal).
    pub verdict: String,
    /// Why, for a verdict other than `pending` and `intact`.
    #[serde(default)]
    pub detail: String,
}

/// How one broker's copy of a sealed segment stands against its recorded
/// seal, from what the broker knows without reading the copy: its open
/// state, its log's size, its scrubber's last verdict, and a rebuild in
/// progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SealedHealth {
    pub segment: u64,
    /// `intact` (nothing wrong known: exactly the seal, as far as the
    /// broker knows; its scrubber checks every frame), `short` (fewer
    /// records or bytes than the seal), `over` (more records than the seal:
    /// a deposed writer's tail, cut when it settles), `damaged` (a bad
    /// frame), `missing` (no log) or `healing` (being rebuilt from an
    /// intact copy).
    pub health: String,
    /// Records the copy holds, when known.
    #[serde(default)]
    pub durable_end: Option<u64>,
}

/// One broker's copy of one segment, as that broker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CopyStatus {
    pub segment: u64,
    /// Whether the broker has the copy open. A copy not opened since the
    /// broker started (or one it does not hold) reports no ends.
    pub open: bool,
    /// Records durable (fsynced) on this copy.
    #[serde(default)]
    pub durable_end: Option<u64>,
    /// Bytes of the log holding those records.
    #[serde(default)]
    pub durable_bytes: Option<u64>,
    /// The committed end: for a segment this broker leads, its quorum
    /// tracker's; for an unreplicated copy, its durable end; for a
    /// follower copy, the last one the primary told it.
    #[serde(default)]
    pub committed_end: Option<u64>,
    /// Whether this broker runs the segment's primary side (its writer).
    #[serde(default)]
    pub leading: bool,
    #[serde(default)]
    pub sealed: bool,
    #[serde(default)]
    pub fenced: bool,
    /// The copy's disk failed; it takes no more appends.
    #[serde(default)]
    pub failed: bool,
}

/// The answer: one entry per segment of the request, in its order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReplicaStatusResponse {
    pub copies: Vec<CopyStatus>,
    /// One verdict per entry of the request's `scrub`, in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scrub: Vec<ScrubVerdict>,
    /// One health per entry of the request's `sealed`, in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health: Vec<SealedHealth>,
    /// The request's `rates_topic`'s ranges this broker writes, with their
    /// rates, and the reshapes of it this broker asked for. Absent when
    /// the request named no topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshaping: Option<TopicReshaping>,
    /// One entry per entry of the request's `producer_tables`, in its
    /// order. Absent when the request asked none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producer_tables: Vec<SealedProducers>,
}

/// Range rates one answer may carry: as many as a broker meters.
pub const REPLICA_STATUS_RATES_MAX: usize = 4096;

fn check_count(field: &'static str, actual: usize, limit: usize) -> Result<(), WireError> {
    if actual > limit {
        return Err(WireError::OverLimit {
            field,
            actual,
            limit,
        });
    }
    Ok(())
}

/// At most [`PRODUCER_TABLES_MAX`] tables, each at most
/// [`PRODUCER_TABLE_BYTES_MAX`] bytes.
fn check_tables(count: usize, bytes: impl Iterator<Item = usize>) -> Result<(), WireError> {
    check_count("producer_tables", count, PRODUCER_TABLES_MAX)?;
    for len in bytes {
        check_count("sidecar", len, PRODUCER_TABLE_BYTES_MAX)?;
    }
    Ok(())
}

fn check_rates_topic(topic: &Option<String>) -> Result<(), WireError> {
    check_count(
        "rates_topic",
        topic.as_ref().map_or(0, String::len),
        NAME_BYTES_MAX,
    )
}

/// The reshaping's lists within their bounds; its events' words are
/// checked where the describe carrying them is encoded.
fn check_reshaping(reshaping: &Option<TopicReshaping>) -> Result<(), WireError> {
    let Some(reshaping) = reshaping else {
        return Ok(());
    };
    check_count("rates", reshaping.rates.len(), REPLICA_STATUS_RATES_MAX)?;
    check_count("history", reshaping.history.len(), RESHAPE_HISTORY_MAX)
}

const REQUEST_NAME: &str = "replica_status_request";
const RESPONSE_NAME: &str = "replica_status_response";

fn check_segments(len: usize) -> Result<(), WireError> {
    if len > REPLICA_STATUS_SEGMENTS_MAX {
        return Err(WireError::OverLimit {
            field: "segments",
            actual: len,
            limit: REPLICA_STATUS_SEGMENTS_MAX,
        });
    }
    Ok(())
}

fn encode<T: Serialize>(value: &T, name: &'static str) -> Result<Bytes, WireError> {
    rmp_serde::to_vec_named(value)
        .map(Bytes::from)
        .map_err(|source| WireError::Encode {
            message: name,
            source,
        })
}

/// Decodes one whole map, refusing trailing bytes. The length of a list is
/// checked after decoding; serde caps what it reserves for a declared
/// length, so an absurd one fails as truncated rather than allocating.
fn decode<T: DeserializeOwned>(payload: &[u8], name: &'static str) -> Result<T, WireError> {
    let mut de = rmp_serde::Deserializer::new(Cursor::new(payload));
    de.set_max_depth(NESTING_DEPTH_MAX);
    let value = T::deserialize(&mut de).map_err(|source| WireError::Decode {
        message: name,
        source,
    })?;
    let used = usize::try_from(de.position())
        .unwrap_or(payload.len())
        .min(payload.len());
    if used != payload.len() {
        return Err(WireError::TrailingBytes {
            message: name,
            bytes: payload.len() - used,
        });
    }
    Ok(value)
}

impl ReplicaStatusRequest {
    pub fn encode(&self) -> Result<Bytes, WireError> {
        check_segments(self.segments.len())?;
        check_segments(self.scrub.len())?;
        check_segments(self.sealed.len())?;
        check_rates_topic(&self.rates_topic)?;
        check_tables(self.producer_tables.len(), std::iter::empty())?;
        encode(self, REQUEST_NAME)
    }

    pub fn decode(payload: &[u8]) -> Result<ReplicaStatusRequest, WireError> {
        let request: ReplicaStatusRequest = decode(payload, REQUEST_NAME)?;
        check_segments(request.segments.len())?;
        check_segments(request.scrub.len())?;
        check_segments(request.sealed.len())?;
        check_rates_topic(&request.rates_topic)?;
        check_tables(request.producer_tables.len(), std::iter::empty())?;
        Ok(request)
    }
}

impl ReplicaStatusResponse {
    pub fn encode(&self) -> Result<Bytes, WireError> {
        check_segments(self.copies.len())?;
        check_segments(self.scrub.len())?;
        check_segments(self.health.len())?;
        check_reshaping(&self.reshaping)?;
        check_tables(
            self.producer_tables.len(),
            self.producer_tables.iter().map(|t| t.sidecar.len()),
        )?;
        encode(self, RESPONSE_NAME)
    }

    pub fn decode(payload: &[u8]) -> Result<ReplicaStatusResponse, WireError> {
        let response: ReplicaStatusResponse = decode(payload, RESPONSE_NAME)?;
        check_segments(response.copies.len())?;
        check_segments(response.scrub.len())?;
        check_segments(response.health.len())?;
        check_reshaping(&response.reshaping)?;
        check_tables(
            response.producer_tables.len(),
            response.producer_tables.iter().map(|t| t.sidecar.len()),
        )?;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_request_and_a_response_round_trip() {
        let request = ReplicaStatusRequest {
            segments: vec![7, 9],
            ..ReplicaStatusRequest::default()
        };
        let bytes = request.encode().unwrap();
        assert_eq!(ReplicaStatusRequest::decode(&bytes).unwrap(), request);
        let response = ReplicaStatusResponse {
            copies: vec![
                CopyStatus {
                    segment: 7,
                    open: true,
                    durable_end: Some(10),
                    durable_bytes: Some(640),
                    committed_end: Some(9),
                    leading: true,
                    ..CopyStatus::default()
                },
                CopyStatus {
                    segment: 9,
                    ..CopyStatus::default()
                },
            ],
            ..ReplicaStatusResponse::default()
        };
        let bytes = response.encode().unwrap();
        assert_eq!(ReplicaStatusResponse::decode(&bytes).unwrap(), response);
        let mut longer = bytes.to_vec();
        longer.push(0);
        assert!(ReplicaStatusResponse::decode(&longer).is_err());
    }

    #[test]
    fn too_many_segments_are_refused_both_ways() {
        let request = ReplicaStatusRequest {
            segments: vec![1; REPLICA_STATUS_SEGMENTS_MAX + 1],
            ..ReplicaStatusRequest::default()
        };
        assert!(request.encode().is_err());
        let bytes = rmp_serde::to_vec_named(&request).unwrap();
        assert!(ReplicaStatusRequest::decode(&bytes).is_err());
    }

    #[test]
    fn an_older_copy_entry_without_the_optional_fields_decodes() {
        #[derive(Serialize)]
        struct Older {
            segment: u64,
            open: bool,
        }
        #[derive(Serialize)]
        struct OlderResponse {
            copies: Vec<Older>,
        }
        let bytes = rmp_serde::to_vec_named(&OlderResponse {
            copies: vec![Older {
                segment: 3,
                open: true,
            }],
        })
        .unwrap();
        let decoded = ReplicaStatusResponse::decode(&bytes).unwrap();
        assert_eq!(decoded.copies[0].segment, 3);
        assert_eq!(decoded.copies[0].durable_end, None);
    }

    #[test]
    fn scrub_seals_and_verdicts_round_trip_and_are_bounded() {
        let request = ReplicaStatusRequest {
            segments: vec![],
            scrub: vec![ScrubSeal {
                segment: 4,
                length: 10,
                bytes: 700,
            }],
            ..ReplicaStatusRequest::default()
        };
        let bytes = request.encode().unwrap();
        assert_eq!(ReplicaStatusRequest::decode(&bytes).unwrap(), request);
        let response = ReplicaStatusResponse {
            copies: vec![],
            scrub: vec![ScrubVerdict {
                segment: 4,
                verdict: "damaged".into(),
                detail: "a bad frame at byte 64".into(),
            }],
            ..ReplicaStatusResponse::default()
        };
        let bytes = response.encode().unwrap();
        assert_eq!(ReplicaStatusResponse::decode(&bytes).unwrap(), response);
        let over = ReplicaStatusRequest {
            segments: vec![],
            scrub: vec![ScrubSeal::default(); REPLICA_STATUS_SEGMENTS_MAX + 1],
            ..ReplicaStatusRequest::default()
        };
        assert!(over.encode().is_err());
        let raw = rmp_serde::to_vec_named(&over).unwrap();
        assert!(ReplicaStatusRequest::decode(&raw).is_err());
        let over = ReplicaStatusRequest {
            sealed: vec![ScrubSeal::default(); REPLICA_STATUS_SEGMENTS_MAX + 1],
            ..ReplicaStatusRequest::default()
        };
        assert!(over.encode().is_err());
        let raw = rmp_serde::to_vec_named(&over).unwrap();
        assert!(ReplicaStatusRequest::decode(&raw).is_err());
    }

    #[test]
    fn rates_asked_and_answered_round_trip_and_are_bounded() {
        use crate::messages::{RangeRate, ReshapeEvent};
        let request = ReplicaStatusRequest {
            rates_topic: Some("orders".into()),
            ..ReplicaStatusRequest::default()
        };
        let bytes = request.encode().unwrap();
        assert_eq!(ReplicaStatusRequest::decode(&bytes).unwrap(), request);
        let response = ReplicaStatusResponse {
            reshaping: Some(TopicReshaping {
                rates: vec![RangeRate {
                    range: 3,
                    primary: 2,
                    write_bytes_per_second: 1_000,
                    ..RangeRate::default()
                }],
                history: vec![ReshapeEvent::default()],
            }),
            ..ReplicaStatusResponse::default()
        };
        let bytes = response.encode().unwrap();
        assert_eq!(ReplicaStatusResponse::decode(&bytes).unwrap(), response);
        let long = ReplicaStatusRequest {
            rates_topic: Some("t".repeat(NAME_BYTES_MAX + 1)),
            ..ReplicaStatusRequest::default()
        };
        assert!(long.encode().is_err());
        let raw = rmp_serde::to_vec_named(&long).unwrap();
        assert!(ReplicaStatusRequest::decode(&raw).is_err());
        let over = ReplicaStatusResponse {
            reshaping: Some(TopicReshaping {
                rates: vec![],
                history: vec![ReshapeEvent::default(); RESHAPE_HISTORY_MAX + 1],
            }),
            ..ReplicaStatusResponse::default()
        };
        assert!(over.encode().is_err());
        let raw = rmp_serde::to_vec_named(&over).unwrap();
        assert!(ReplicaStatusResponse::decode(&raw).is_err());
    }

    #[test]
    fn a_request_for_rates_decodes_at_a_broker_that_ignores_them() {
        #[derive(Deserialize)]
        struct Older {
            segments: Vec<u64>,
        }
        let request = ReplicaStatusRequest {
            segments: vec![5],
            rates_topic: Some("orders".into()),
            ..ReplicaStatusRequest::default()
        };
        let bytes = request.encode().unwrap();
        let older: Older = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(older.segments, vec![5]);
    }

    #[test]
    fn producer_tables_round_trip_as_bytes_and_are_bounded() {
        let request = ReplicaStatusRequest {
            producer_tables: vec![ScrubSeal {
                segment: 4,
                length: 10,
                bytes: 0,
            }],
            ..ReplicaStatusRequest::default()
        };
        let bytes = request.encode().unwrap();
        assert_eq!(ReplicaStatusRequest::decode(&bytes).unwrap(), request);
        let response = ReplicaStatusResponse {
            producer_tables: vec![
                SealedProducers {
                    segment: 4,
                    sidecar: vec![7; 300],
                },
                SealedProducers {
                    segment: 5,
                    sidecar: vec![],
                },
            ],
            ..ReplicaStatusResponse::default()
        };
        let bytes = response.encode().unwrap();
        // A bin of 300 bytes, not 300 msgpack numbers.
        assert!(bytes.len() < 400, "{} bytes", bytes.len());
        assert_eq!(ReplicaStatusResponse::decode(&bytes).unwrap(), response);
        let over = ReplicaStatusRequest {
            producer_tables: vec![ScrubSeal::default(); PRODUCER_TABLES_MAX + 1],
            ..ReplicaStatusRequest::default()
        };
        assert!(over.encode().is_err());
        let raw = rmp_serde::to_vec_named(&over).unwrap();
        assert!(ReplicaStatusRequest::decode(&raw).is_err());
        let big = ReplicaStatusResponse {
            producer_tables: vec![SealedProducers {
                segment: 1,
                sidecar: vec![0; PRODUCER_TABLE_BYTES_MAX + 1],
            }],
            ..ReplicaStatusResponse::default()
        };
        assert!(big.encode().is_err());
        let raw = rmp_serde::to_vec_named(&big).unwrap();
        assert!(ReplicaStatusResponse::decode(&raw).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(ReplicaStatusRequest::decode(&[0xc1, 0xff, 0x00]).is_err());
        assert!(ReplicaStatusResponse::decode(&[0x91, 0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
