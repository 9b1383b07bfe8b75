//! Error codes carried in response frames, the body of an error response, and
//! the crate's own error type.
//!
//! Error code numbers are part of the wire format: once released a number is
//! never reused for a different meaning. New codes take new numbers; a client
//! that does not know a number decodes it as [`ErrorCode::Unknown`] and treats
//! it as not retriable.

use serde::{Deserialize, Serialize};

use crate::batch::BatchError;

/// A response's status, as the `error_code:u16` of the response frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 0: success; the payload is the operation's response.
    None,
    /// 1: the broker failed in a way it did not classify. Not retriable.
    UnknownServerError,
    /// 2: the request payload could not be decoded or broke a bound.
    InvalidRequest,
    /// 3: the api key is unknown, reserved or not implemented by this broker.
    UnsupportedApi,
    /// 4: the api key is known but not at the version negotiated.
    UnsupportedVersion,
    /// 5: a frame's declared length exceeded the broker's frame limit.
    FrameTooLarge,
    /// 6: a record batch block failed its CRC or its structure checks.
    InvalidRecordBatch,
    /// 10: no topic has that name.
    TopicNotFound,
    /// 11: a topic with that name already exists.
    TopicExists,
    /// 12: the topic is sealed and accepts no more records.
    TopicSealed,
    /// 13: the topic has no range with that id.
    RangeNotFound,
    /// 14: the range has no buddy it can merge with right now.
    NotBuddies,
    /// 15: the cursor is malformed, forged, or from another incarnation.
    InvalidCursor,
    /// 19: the cursor points into records retention deleted; the message
    /// names the earliest retained position (ADR 0115).
    CursorExpired,
    /// 16: the named storage policy does not exist.
    PolicyNotFound,
    /// 17: a subscribe_credit named a subscription this connection does not have.
    SubscriptionNotFound,
    /// 18: the ring has no vnode with that id.
    VnodeNotFound,
    /// 20: this broker does not lead what the request needs; `leader_hint` says who does.
    NotLeader,
    /// 21: the data moved (a split, merge or rebalance); `leader_hint` names the new owner.
    Moved,
    /// 22: the broker is overloaded; back off (`retry_after_ms` when given) and retry.
    Busy,
    /// 23: the broker could not complete the request in time.
    Timeout,
    /// 24: not enough replicas answered to commit.
    NoQuorum,
    /// 25: the broker is shutting down; retry on another broker.
    ShuttingDown,
    /// 26: the request may or may not have been applied (a metadata proposal
    /// was discarded by a leader change, or its commit was not seen in time).
    /// Unlike a refusal, the change may exist: read back before assuming it
    /// does not, or retry and accept `topic_exists`-style answers as success.
    OutcomeUnknown,
    /// 30: the range or segment was already sealed.
    AlreadySealed,
    /// 31: the connection is not authenticated, or not allowed to do this.
    Unauthorized,
    /// 32: another vnode's split is in progress; resume or abort it first.
    SplitInProgress,
    /// 40: a newer session (higher epoch) of this producer id has written to
    /// the range: this one is a zombie and must stop. Not retriable.
    ProducerFenced,
    /// 41: the batch's sequence is beyond the next one the range expects for
    /// this producer: an earlier batch is missing. Resend from the earliest
    /// unacknowledged batch, in order.
    SequenceGap,
    /// 42: the range holds no state for this producer (it never wrote here,
    /// or its state expired) and the sequence is not 0. Start a new epoch.
    UnknownProducer,
    /// 50: records the request needs are gone: the only copy that held them
    /// is damaged or missing. The message names the topic, range and
    /// offsets. Not retriable: retrying reads the same loss.
    DataLoss,
    /// 51: the broker's data volume is below `store.min_free_bytes` (or ran
    /// out): it takes no records until space is freed, and then takes them
    /// again by itself. Not retriable: an operator must free space.
    StorageFull,
    /// 33: a feature gate refused (ADR 0134): `features` asked to activate
    /// a feature some broker does not support. Not retriable until every
    /// broker runs a binary that supports it.
    FeatureUnavailable,
    /// A number this build does not know. Treated as not retriable.
    Unknown(u16),
}

impl ErrorCode {
    /// Every known code, in number order (used by tests and the docs table).
    pub const KNOWN: [ErrorCode; 33] = [
        ErrorCode::None,
        ErrorCode::UnknownServerError,
        ErrorCode::InvalidRequest,
        ErrorCode::UnsupportedApi,
        ErrorCode::UnsupportedVersion,
        ErrorCode::FrameTooLarge,
        ErrorCode::InvalidRecordBatch,
        ErrorCode::TopicNotFound,
        ErrorCode::TopicExists,
        ErrorCode::TopicSealed,
        ErrorCode::RangeNotFound,
        ErrorCode::NotBuddies,
        ErrorCode::InvalidCursor,
        ErrorCode::CursorExpired,
        ErrorCode::PolicyNotFound,
        ErrorCode::SubscriptionNotFound,
        ErrorCode::VnodeNotFound,
        ErrorCode::NotLeader,
        ErrorCode::Moved,
        ErrorCode::Busy,
        ErrorCode::Timeout,
        ErrorCode::NoQuorum,
        ErrorCode::ShuttingDown,
        ErrorCode::OutcomeUnknown,
        ErrorCode::AlreadySealed,
        ErrorCode::Unauthorized,
        ErrorCode::SplitInProgress,
        ErrorCode::FeatureUnavailable,
        ErrorCode::ProducerFenced,
        ErrorCode::SequenceGap,
        ErrorCode::UnknownProducer,
        ErrorCode::DataLoss,
        ErrorCode::StorageFull,
    ];

    /// The stable number carried on the wire.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::None => 0,
            ErrorCode::UnknownServerError => 1,
            ErrorCode::InvalidRequest => 2,
            ErrorCode::UnsupportedApi => 3,
            ErrorCode::UnsupportedVersion => 4,
            ErrorCode::FrameTooLarge => 5,
            ErrorCode::InvalidRecordBatch => 6,
            ErrorCode::TopicNotFound => 10,
            ErrorCode::TopicExists => 11,
            ErrorCode::TopicSealed => 12,
            ErrorCode::RangeNotFound => 13,
            ErrorCode::NotBuddies => 14,
            ErrorCode::InvalidCursor => 15,
            ErrorCode::CursorExpired => 19,
            ErrorCode::PolicyNotFound => 16,
            ErrorCode::SubscriptionNotFound => 17,
            ErrorCode::VnodeNotFound => 18,
            ErrorCode::NotLeader => 20,
            ErrorCode::Moved => 21,
            ErrorCode::Busy => 22,
            ErrorCode::Timeout => 23,
            ErrorCode::NoQuorum => 24,
            ErrorCode::ShuttingDown => 25,
            ErrorCode::OutcomeUnknown => 26,
            ErrorCode::AlreadySealed => 30,
            ErrorCode::Unauthorized => 31,
            ErrorCode::SplitInProgress => 32,
            ErrorCode::FeatureUnavailable => 33,
            ErrorCode::ProducerFenced => 40,
            ErrorCode::SequenceGap => 41,
            ErrorCode::UnknownProducer => 42,
            ErrorCode::DataLoss => 50,
            ErrorCode::StorageFull => 51,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// The code for a wire number; numbers this build does not know become
    /// [`ErrorCode::Unknown`] rather than an error, so a newer broker never
    /// breaks an older client's decoder.
    pub fn from_code(code: u16) -> ErrorCode {
        ErrorCode::KNOWN
            .iter()
            .copied()
            .find(|known| known.code() == code)
            .unwrap_or(ErrorCode::Unknown(code))
    }

    /// Whether the same request may succeed if sent again (after a backoff,
    /// or to the hinted broker for `not_leader` and `moved`).
    pub fn retriable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotLeader
                | ErrorCode::Moved
                | ErrorCode::Busy
                | ErrorCode::Timeout
                | ErrorCode::NoQuorum
                | ErrorCode::ShuttingDown
                | ErrorCode::OutcomeUnknown
        )
    }

    /// Whether the error body's `leader_hint` names where to send the request instead.
    pub fn carries_hint(self) -> bool {
        matches!(self, ErrorCode::NotLeader | ErrorCode::Moved)
    }

    /// The snake_case name used in docs, logs and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::None => "none",
            ErrorCode::UnknownServerError => "unknown_server_error",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::UnsupportedApi => "unsupported_api",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::InvalidRecordBatch => "invalid_record_batch",
            ErrorCode::TopicNotFound => "topic_not_found",
            ErrorCode::TopicExists => "topic_exists",
            ErrorCode::TopicSealed => "topic_sealed",
            ErrorCode::RangeNotFound => "range_not_found",
            ErrorCode::NotBuddies => "not_buddies",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::CursorExpired => "cursor_expired",
            ErrorCode::PolicyNotFound => "policy_not_found",
            ErrorCode::SubscriptionNotFound => "subscription_not_found",
            ErrorCode::VnodeNotFound => "vnode_not_found",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::Moved => "moved",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::NoQuorum => "no_quorum",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::AlreadySealed => "already_sealed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::SplitInProgress => "split_in_progress",
            ErrorCode::FeatureUnavailable => "feature_unavailable",
            ErrorCode::ProducerFenced => "producer_fenced",
            ErrorCode::SequenceGap => "sequence_gap",
            ErrorCode::UnknownProducer => "unknown_producer",
            ErrorCode::DataLoss => "data_loss",
            ErrorCode::StorageFull => "storage_full",
            ErrorCode::Unknown(_) => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Unknown(code) => write!(f, "unknown error code {code}"),
            known => f.write_str(known.name()),
        }
    }
}

/// The payload of every response whose error code is not `none`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ErrorBody {
    /// A human-readable, lowercase explanation (at most [`crate::limits::MESSAGE_BYTES_MAX`] bytes).
    pub message: String,
    /// For `not_leader` and `moved`: the client address (`host:port`) of the broker to ask instead.
    #[serde(default)]
    pub leader_hint: Option<String>,
    /// For `busy` and other retriable codes: how long the broker asks the client to wait.
    #[serde(default)]
    pub retry_after_ms: Option<u32>,
    /// For a refused `produce`: what each range did with its part, so a
    /// client knows which parts are durable (absent for other operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<crate::messages::RangeOutcome>>,
}

/// Everything that can go wrong encoding or decoding the protocol.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A frame declared more bytes than the frame limit; nothing was allocated for it.
    #[error("frame of {declared_bytes} bytes exceeds the limit of {frame_bytes_max} bytes")]
    FrameTooLarge {
        declared_bytes: usize,
        frame_bytes_max: usize,
    },
    /// A frame declared fewer bytes than its fixed header needs.
    #[error("frame of {declared_bytes} bytes is shorter than its {header_bytes} byte header")]
    FrameTooShort {
        declared_bytes: usize,
        header_bytes: usize,
    },
    /// The api key is unknown, reserved for a later feature, or not implemented.
    #[error("unsupported api key {api_key}")]
    UnsupportedApi { api_key: u16 },
    /// A control payload could not be encoded.
    #[error("cannot encode {message}: {source}")]
    Encode {
        message: &'static str,
        source: rmp_serde::encode::Error,
    },
    /// A control payload could not be decoded.
    #[error("cannot decode {message}: {source}")]
    Decode {
        message: &'static str,
        source: rmp_serde::decode::Error,
    },
    /// A control payload was followed by bytes it does not expect.
    #[error("{message} has {bytes} unexpected trailing bytes")]
    TrailingBytes { message: &'static str, bytes: usize },
    /// A field broke one of the protocol's bounds.
    #[error("{field} is {actual} long, over the limit of {limit}")]
    OverLimit {
        field: &'static str,
        actual: usize,
        limit: usize,
    },
    /// A field has a value the protocol does not allow.
    #[error("{field} is invalid: {reason}")]
    InvalidField {
        field: &'static str,
        reason: &'static str,
    },
    /// A record batch block is malformed.
    #[error("invalid record batch: {0}")]
    Batch(#[from] BatchError),
    /// The transport failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl WireError {
    /// The error code a server answers with when it fails to decode a request.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            WireError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            WireError::UnsupportedApi { .. } => ErrorCode::UnsupportedApi,
            WireError::Batch(_) => ErrorCode::InvalidRecordBatch,
            WireError::Io(_) | WireError::Encode { .. } => ErrorCode::UnknownServerError,
            WireError::FrameTooShort { .. }
            | WireError::Decode { .. }
            | WireError::TrailingBytes { .. }
            | WireError::OverLimit { .. }
            | WireError::InvalidField { .. } => ErrorCode::InvalidRequest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips_through_its_number() {
        for code in ErrorCode::KNOWN {
            assert_eq!(ErrorCode::from_code(code.code()), code);
        }
    }

    #[test]
    fn known_numbers_are_unique() {
        let mut numbers: Vec<u16> = ErrorCode::KNOWN.iter().map(|c| c.code()).collect();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), ErrorCode::KNOWN.len());
    }

    #[test]
    fn an_unknown_number_decodes_to_unknown_and_is_not_retriable() {
        let code = ErrorCode::from_code(999);
        assert_eq!(code, ErrorCode::Unknown(999));
        assert_eq!(code.code(), 999);
        assert!(!code.retriable());
    }

    #[test]
    fn leadership_and_backpressure_codes_are_retriable_and_cursor_errors_are_not() {
        assert!(ErrorCode::NotLeader.retriable());
        assert!(ErrorCode::Moved.retriable());
        assert!(ErrorCode::Busy.retriable());
        assert!(ErrorCode::Timeout.retriable());
        assert!(ErrorCode::NoQuorum.retriable());
        assert!(!ErrorCode::InvalidCursor.retriable());
        assert!(!ErrorCode::CursorExpired.retriable());
        assert!(!ErrorCode::TopicNotFound.retriable());
        assert!(!ErrorCode::UnknownServerError.retriable());
    }
}
