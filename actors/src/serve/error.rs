//! [`ServeError`]: why a handler of the client port refused a request.
//!
//! Handlers return a `ServeError` with the facts as fields; this module is
//! the one place those facts become what a client sees: the wire code
//! ([`ServeError::code`]) and the error body ([`ServeError::body`]: the
//! lowercase message, the `leader_hint` of a redirect, the `retry_after_ms`
//! of a retriable code). Messages are part of what operators and tests
//! read: keep them lowercase and stable.

use malachi_cluster::vnodes::{RouteError, SplitError};
use malachi_core::model::{ModelError, SegmentId};
use malachi_core::placement::PlacementError;
use malachi_core::ring::VnodeId;
use malachi_storage::StorageError;
use malachi_wire::limits::MESSAGE_BYTES_MAX;
use malachi_wire::{ErrorBody, ErrorCode, WireError};

use crate::common::error::MetadataError;
use crate::control::placement::Redirect;
use crate::control::requests::CoordError;

/// How long a client is asked to wait before retrying a retriable refusal.
pub(crate) const RETRY_AFTER_MS_DEFAULT: u32 = 10;

/// A handler's refusal of one request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    /// The request payload could not be decoded or broke a bound.
    #[error("{0}")]
    Decode(WireError),
    /// A produced record has no key (ADR 0063: keys route and order records).
    #[error("record {index} has an empty key; every record needs a key")]
    EmptyKey { index: usize },
    /// A produced record's value is over `record_value_bytes_max`.
    #[error(
        "record {index} has a value of {value_bytes} bytes, over the limit of {value_bytes_max} bytes"
    )]
    ValueTooLarge {
        index: usize,
        value_bytes: usize,
        value_bytes_max: usize,
    },
    /// A produced record set a header the broker reserves (`malachi.`).
    #[error("record {index} sets header {name}; names starting with malachi. are reserved")]
    ReservedHeader { index: usize, name: String },
    /// An idempotent batch's record falls outside the range it names.
    #[error("record {index} does not belong to range {range}; route by the topic's ranges")]
    OutsideRange { index: usize, range: u64 },
    /// An idempotent batch names a range the topic never had.
    #[error("topic {topic} has no range {range}")]
    NoSuchRange { topic: String, range: u64 },
    /// An idempotent batch names a range that was split or merged: the
    /// batch was not stored there, and its records belong to the range's
    /// successors now.
    #[error("range {range} was split or merged; this batch was not stored: route it again")]
    RangeMoved { range: u64 },
    /// A newer session of the producer wrote to the range.
    #[error(
        "producer {producer_id} epoch {epoch} is fenced by epoch {current_epoch} on range {range}"
    )]
    ProducerFenced {
        producer_id: u64,
        epoch: u64,
        current_epoch: u64,
        range: u64,
    },
    /// The batch's sequence skips one the range has not stored.
    #[error(
        "producer {producer_id} sent sequence {sequence} to range {range}, which expects {expected}: resend from the earliest unacknowledged batch"
    )]
    SequenceGap {
        producer_id: u64,
        range: u64,
        expected: u64,
        sequence: u64,
    },
    /// The range holds no state for the producer and the sequence is not 0.
    #[error(
        "range {range} holds no state for producer {producer_id} (never seen, or expired) and sequence {sequence} is not 0: start a new epoch"
    )]
    UnknownProducer {
        producer_id: u64,
        range: u64,
        sequence: u64,
    },
    /// A retry reused a stored sequence for a batch of another size.
    #[error(
        "producer {producer_id} reused sequence {sequence} on range {range} for {records} records; it stored {stored} records"
    )]
    SequenceConflict {
        producer_id: u64,
        range: u64,
        sequence: u64,
        records: u32,
        stored: u32,
    },
    /// Records have one copy today: a replication factor above 1 is refused.
    #[error("a single broker cannot place more than one replica")]
    ReplicationFactor { replication_factor: u8 },
    /// The file metadata backend has one vnode, which cannot be split.
    #[error(
        "this broker keeps its metadata in one file (metadata_backend = \"file\"): it has one vnode and cannot split it"
    )]
    SingleVnode,
    #[error("no such topic {topic}")]
    TopicNotFound { topic: String },
    /// A subscribed topic was deleted (or re-created) under the subscription.
    #[error("topic {topic} was deleted")]
    TopicDeleted { topic: String },
    #[error("topic {topic} is sealed")]
    TopicSealed { topic: String },
    /// The metadata has no active range for a key: the ranges no longer
    /// tile the keyspace, which the model forbids.
    #[error("topic {topic} has no active range for a key")]
    NoActiveRange { topic: String },
    #[error("{reason}")]
    InvalidCursor { reason: String },
    /// The cursor points into records retention deleted (ADR 0115); the
    /// reason names the earliest retained position.
    #[error("{reason}")]
    CursorExpired { reason: String },
    /// This broker's replica of the topic's metadata is behind the cursor
    /// (it names a range or segment the replica has not applied yet) and
    /// did not catch up within `waited_ms` (F5, ADR 0120): retriable, never
    /// `invalid_cursor`.
    #[error("{reason}; it did not catch up within {waited_ms} ms: retry")]
    MetadataBehind { reason: String, waited_ms: u64 },
    #[error("no storage policy {name}")]
    PolicyNotFound { name: String },
    #[error("invalid storage policy {name}: {reason}")]
    InvalidPolicy { name: String, reason: String },
    #[error("{0}")]
    Policy(#[from] crate::control::policies::PolicyError),
    #[error("the cursor belongs to topic {cursor_topic}")]
    CursorOfOtherTopic { cursor_topic: String },
    /// This broker has not learned the cluster's cursor keys yet (the ring
    /// group has not committed one, or did not answer): it neither mints
    /// nor verifies a cursor until it has (ADR 0096).
    #[error("this broker has not learned the cluster's cursor key yet; retry")]
    CursorKeyPending,
    #[error("a subscription with correlation id {id} is already open")]
    SubscriptionOpen { id: u32 },
    #[error("at most {subscriptions_max} subscriptions per connection")]
    TooManySubscriptions { subscriptions_max: usize },
    #[error("no subscription {subscription_id} on this connection")]
    SubscriptionNotFound { subscription_id: u32 },
    /// `subscribe` and `subscribe_credit` reached the request handler; the
    /// connection handles them itself.
    #[error("subscriptions are handled by the connection")]
    SubscriptionMisrouted,
    #[error("the ring (version {ring_version}) has no vnode {vnode}")]
    VnodeNotFound { vnode: u32, ring_version: u64 },
    #[error(
        "the split of {parent} into {child} is in progress; run `malachi vnode split {}` to resume it",
        parent.0
    )]
    OtherSplitInProgress { parent: VnodeId, child: VnodeId },
    /// The records were not acknowledged by `produce_timeout_ms`: some or
    /// all of them may be durable.
    #[error("the produce was not acknowledged in time; it may or may not be durable")]
    ProduceTimeout { timeout_ms: u64 },
    /// Too many bytes wait for a group commit on a segment.
    #[error("{reason}")]
    SegmentBusy { segment: SegmentId, reason: String },
    /// A replicated segment's copies did not fsync the batch on a quorum in
    /// time (`replica_ack_timeout_ms`); retriable.
    #[error("{reason}")]
    ReplicaQuorum { segment: SegmentId, reason: String },
    /// The store refused the batch itself (a record or batch over a bound).
    #[error("{reason}")]
    BatchRefused { segment: SegmentId, reason: String },
    /// The store failed the append.
    #[error("{reason}")]
    StoreFailed { segment: SegmentId, reason: String },
    /// Records a read needs are gone: the only copy that held them is
    /// damaged or missing (ADR 0108). Offsets are the range's.
    #[error("topic {topic} range {range} lost records {from}..{to} (segment {segment}): {reason}")]
    DataLoss {
        topic: String,
        range: u64,
        segment: SegmentId,
        from: u64,
        to: u64,
        reason: String,
    },
    /// The data volume is below `store.min_free_bytes`, or ran out (ADR
    /// 0111): no records are taken until space is freed.
    #[error(
        "storage full: the data volume of broker {node} {state}; records are taken again once {resume_bytes} bytes are free"
    )]
    StorageFull {
        node: u64,
        /// What the broker knows of its volume: the free bytes below the
        /// line, or a write refused for want of space.
        state: String,
        resume_bytes: u64,
    },
    /// A store read failed.
    #[error("{0}")]
    Read(#[from] StorageError),
    #[error("the coordinator is not running")]
    CoordinatorDown,
    #[error("the coordinator did not answer: {reason}")]
    CoordinatorSilent { reason: String },
    #[error("the broker is shutting down")]
    Draining,
    #[error("the tree is not running")]
    TreeDown,
    #[error("{reason}")]
    TreeSilent { reason: String },
    #[error("the split task failed: {reason}")]
    SplitTask { reason: String },
    #[error("the ring after the split (version {ring_version}) lacks {vnode}")]
    SplitRingLacks { vnode: VnodeId, ring_version: u64 },
    /// The split's last step failed: had it applied with its answer lost, a
    /// retry would begin a second split, so this is not retriable.
    #[error("{0}; the ring names the new vnode: check `malachi vnode list` before splitting again")]
    SplitUnsettled(SplitError),
    #[error("{0}")]
    Split(SplitError),
    /// The ring's group refused a membership change (ADR 0104).
    #[error("{0}")]
    MemberRefused(ModelError),
    /// The ring's group refused a feature activation or finalize (ADR 0134).
    #[error("{0}")]
    FeatureRefused(ModelError),
    #[error("{0}")]
    Route(RouteError),
    #[error("{0}")]
    Coord(#[from] CoordError),
    #[error("{0}")]
    Metadata(#[from] MetadataError),
    /// The broker could not build or encode its answer.
    #[error("{reason}")]
    Internal { what: &'static str, reason: String },
    /// This broker does not serve the topic's records; the hint says who does.
    #[error("{}", .0.message)]
    Redirect(Redirect),
    /// The connection has not logged in and the request needs it (ADR 0150).
    #[error(
        "{api} needs an authenticated connection: log in first (sasl_handshake, sasl_authenticate, or token_authenticate)"
    )]
    NotAuthenticated { api: &'static str },
    /// The ACLs refuse the request: `message` names the principal, the
    /// operation and the resource (`malachi_core::auth::acl::refusal_message`).
    #[error("{message}")]
    Unauthorized { message: String },
    /// The connection's session ended (ADR 0154): its token expired, its
    /// user was deleted or its password changed. The message starts with
    /// the stable code; the connection closes after its answers.
    #[error("{0}")]
    SessionEnded(malachi_core::auth::session::Ended),
    /// A login failed, or the lockout refused to try it.
    #[error("authentication failed: {reason}")]
    AuthFailed {
        reason: String,
        retry_after_ms: Option<u32>,
    },
    /// The users and ACLs could not be read or changed.
    #[error("{0}")]
    AdminStore(malachi_cluster::vnodes::AdminStoreError),
    /// The users and ACLs refused a change.
    #[error("{0}")]
    AdminRefused(ModelError),
    /// A user or ACL request names something that cannot be used.
    #[error("{0}")]
    InvalidAdmin(String),
}

impl From<SplitError> for ServeError {
    fn from(e: SplitError) -> ServeError {
        match e {
            SplitError::Route { step: "finish", .. } => ServeError::SplitUnsettled(e),
            other => ServeError::Split(other),
        }
    }
}

impl From<RouteError> for ServeError {
    fn from(e: RouteError) -> ServeError {
        ServeError::Route(e)
    }
}

impl ServeError {
    /// The wire code a client gets for this refusal: the one mapping of the
    /// serve layer's errors to codes.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            ServeError::Decode(e) => e.error_code(),
            ServeError::EmptyKey { .. }
            | ServeError::ValueTooLarge { .. }
            | ServeError::ReservedHeader { .. }
            | ServeError::OutsideRange { .. }
            | ServeError::SequenceConflict { .. }
            | ServeError::ReplicationFactor { .. }
            | ServeError::SingleVnode
            | ServeError::MemberRefused(_)
            | ServeError::SubscriptionOpen { .. }
            | ServeError::BatchRefused { .. } => ErrorCode::InvalidRequest,
            ServeError::TopicNotFound { .. } | ServeError::TopicDeleted { .. } => {
                ErrorCode::TopicNotFound
            }
            ServeError::TopicSealed { .. } => ErrorCode::TopicSealed,
            ServeError::NoSuchRange { .. } => ErrorCode::RangeNotFound,
            ServeError::RangeMoved { .. } => ErrorCode::Moved,
            ServeError::ProducerFenced { .. } => ErrorCode::ProducerFenced,
            ServeError::SequenceGap { .. } => ErrorCode::SequenceGap,
            ServeError::UnknownProducer { .. } => ErrorCode::UnknownProducer,
            ServeError::InvalidCursor { .. } | ServeError::CursorOfOtherTopic { .. } => {
                ErrorCode::InvalidCursor
            }
            ServeError::CursorExpired { .. } => ErrorCode::CursorExpired,
            ServeError::PolicyNotFound { .. } => ErrorCode::PolicyNotFound,
            ServeError::InvalidPolicy { .. } => ErrorCode::InvalidRequest,
            ServeError::Policy(e) => policy_code(e),
            ServeError::TooManySubscriptions { .. }
            | ServeError::SegmentBusy { .. }
            | ServeError::MetadataBehind { .. } => ErrorCode::Busy,
            ServeError::SubscriptionNotFound { .. } => ErrorCode::SubscriptionNotFound,
            ServeError::ReplicaQuorum { .. } | ServeError::CursorKeyPending => ErrorCode::NoQuorum,
            ServeError::VnodeNotFound { .. } => ErrorCode::VnodeNotFound,
            ServeError::OtherSplitInProgress { .. } => ErrorCode::SplitInProgress,
            ServeError::ProduceTimeout { .. } | ServeError::CoordinatorSilent { .. } => {
                ErrorCode::Timeout
            }
            ServeError::TreeSilent { .. } => ErrorCode::Timeout,
            ServeError::CoordinatorDown | ServeError::Draining | ServeError::TreeDown => {
                ErrorCode::ShuttingDown
            }
            ServeError::Metadata(e) => e.error_code(),
            ServeError::Coord(e) => coord_code(e),
            ServeError::Route(e) => route_code(e),
            ServeError::Split(e) => split_code(e),
            ServeError::Redirect(r) => r.code,
            ServeError::FeatureRefused(ModelError::FeatureUnavailable { .. }) => {
                ErrorCode::FeatureUnavailable
            }
            ServeError::FeatureRefused(_) => ErrorCode::InvalidRequest,
            ServeError::DataLoss { .. } => ErrorCode::DataLoss,
            ServeError::NotAuthenticated { .. }
            | ServeError::Unauthorized { .. }
            | ServeError::SessionEnded(_)
            | ServeError::AuthFailed { .. } => ErrorCode::Unauthorized,
            ServeError::AdminStore(e) => admin_store_code(e),
            ServeError::AdminRefused(e) => model_code(e),
            ServeError::InvalidAdmin(_) => ErrorCode::InvalidRequest,
            ServeError::StorageFull { .. } => ErrorCode::StorageFull,
            ServeError::NoActiveRange { .. }
            | ServeError::SubscriptionMisrouted
            | ServeError::StoreFailed { .. }
            | ServeError::Read(_)
            | ServeError::SplitTask { .. }
            | ServeError::SplitRingLacks { .. }
            | ServeError::SplitUnsettled(_)
            | ServeError::Internal { .. } => ErrorCode::UnknownServerError,
        }
    }

    /// The error body: the message (cut to `MESSAGE_BYTES_MAX` on a char
    /// boundary), a redirect's `leader_hint`, and `retry_after_ms` for a
    /// retriable code.
    pub(crate) fn body(&self) -> ErrorBody {
        let code = self.code();
        let leader_hint = match self {
            ServeError::Redirect(r) => r.hint.clone(),
            _ => None,
        };
        let mut body = error_body(code, self.to_string(), leader_hint);
        // The lockout's delay rides on a final code: the client may try a
        // login again after it, never the same credentials (protocol.md §10).
        if let ServeError::AuthFailed { retry_after_ms, .. } = self {
            body.retry_after_ms = *retry_after_ms;
        }
        body
    }
}

fn admin_store_code(e: &malachi_cluster::vnodes::AdminStoreError) -> ErrorCode {
    use malachi_cluster::vnodes::AdminStoreError;
    match e {
        AdminStoreError::Inactive(_) => ErrorCode::FeatureUnavailable,
        AdminStoreError::Route(r) => route_code(r),
        AdminStoreError::NotAdmin(_) => ErrorCode::UnknownServerError,
    }
}

/// The body of an error response with `code`: the one place messages are
/// bounded and `retry_after_ms` is chosen. A retriable refusal asks for a
/// short wait, except a redirect with a `leader_hint`: that is fresh routing
/// information, and the client resends there at once (protocol.md §4).
pub(crate) fn error_body(
    code: ErrorCode,
    message: String,
    leader_hint: Option<String>,
) -> ErrorBody {
    let mut message = message;
    if message.len() > MESSAGE_BYTES_MAX {
        let mut cut = MESSAGE_BYTES_MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    ErrorBody {
        message,
        retry_after_ms: (code.retriable() && leader_hint.is_none())
            .then_some(RETRY_AFTER_MS_DEFAULT),
        leader_hint,
        ranges: None,
    }
}

fn model_code(e: &ModelError) -> ErrorCode {
    match e {
        ModelError::NoSuchTopic { .. } => ErrorCode::TopicNotFound,
        ModelError::TopicExists { .. } => ErrorCode::TopicExists,
        ModelError::TopicSealed { .. } => ErrorCode::TopicSealed,
        ModelError::NoSuchRange { .. } | ModelError::RangeNotActive { .. } => {
            ErrorCode::RangeNotFound
        }
        ModelError::NotBuddies { .. } | ModelError::NoBuddy { .. } => ErrorCode::NotBuddies,
        ModelError::AlreadySealed { .. } => ErrorCode::AlreadySealed,
        // A split or merge whose frozen segment a failover rolled meanwhile
        // (F6), after its own retries: the range moved on, a retry freezes
        // the successor.
        ModelError::AlreadyRolled { .. } => ErrorCode::Busy,
        ModelError::NoSuchPolicy { .. } => ErrorCode::PolicyNotFound,
        _ => ErrorCode::InvalidRequest,
    }
}

fn policy_code(e: &crate::control::policies::PolicyError) -> ErrorCode {
    use crate::control::policies::PolicyError;
    match e {
        PolicyError::Metadata(m) => m.error_code(),
        PolicyError::Route(r) => route_code(r),
        PolicyError::Model(m) => model_code(m),
    }
}

fn coord_code(e: &CoordError) -> ErrorCode {
    match e {
        CoordError::Model(m) => model_code(m),
        CoordError::Metadata(m) => m.error_code(),
        CoordError::Freeze { .. } => ErrorCode::Busy,
        CoordError::FreezeNoQuorum { .. } | CoordError::BuddyWriterDown { .. } => {
            ErrorCode::NoQuorum
        }
        // The client port answers it as a redirect with the writer's
        // address (`serve::topics`); without one, still `not_leader`.
        CoordError::WrittenElsewhere { .. } => ErrorCode::NotLeader,
        // Not retried: the broker takes no copies now (ADR 0144).
        CoordError::MoveTarget { .. } => ErrorCode::InvalidRequest,
        // Fewer brokers live than the copies asked for, though the
        // cluster has enough: one not seen live yet (just started) or down
        // for now. Retriable: the client waits for it within its deadline
        // (ADR 0126).
        CoordError::Placement(PlacementError::TooFewBrokers { .. }) => ErrorCode::NoQuorum,
        CoordError::Placement(_)
        | CoordError::Constraints(_)
        | CoordError::FactorAboveCluster { .. } => ErrorCode::InvalidRequest,
        CoordError::Supervision(_)
        | CoordError::Unexpected(_)
        | CoordError::UnknownSegment { .. } => ErrorCode::UnknownServerError,
    }
}

fn route_code(e: &RouteError) -> ErrorCode {
    match e {
        RouteError::Unavailable { .. } => ErrorCode::NoQuorum,
        RouteError::Stopped => ErrorCode::ShuttingDown,
        RouteError::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
        RouteError::Unroutable | RouteError::Failed { .. } => ErrorCode::UnknownServerError,
    }
}

/// A split stopped by an unreachable group is retriable: repeating the
/// request resumes it (the pending split in the ring's group says where it
/// stood).
fn split_code(e: &SplitError) -> ErrorCode {
    match e {
        SplitError::Route { step: "finish", .. } => ErrorCode::UnknownServerError,
        SplitError::Route { source, .. } => route_code(source),
        SplitError::NoQuorum { .. } => ErrorCode::NoQuorum,
        SplitError::Refused {
            error: ModelError::SplitInProgress { .. },
            ..
        } => ErrorCode::SplitInProgress,
        SplitError::Refused {
            error: ModelError::RingRefused { .. },
            ..
        } => ErrorCode::InvalidRequest,
        SplitError::Refused { .. }
        | SplitError::Unexpected { .. }
        | SplitError::Committed { .. } => ErrorCode::UnknownServerError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_whose_outcome_is_unknown_is_outcome_unknown_not_a_refusal() {
        let unknown = RouteError::OutcomeUnknown {
            vnode: VnodeId(2),
            reason: "the proposal was discarded by a leader change; its outcome is unknown".into(),
        };
        let served = ServeError::from(unknown.clone());
        assert_eq!(served.code(), ErrorCode::OutcomeUnknown);
        assert!(served.body().retry_after_ms.is_some());
        // Through the metadata plane and the coordinator, as create_topic sees it.
        let through = ServeError::Coord(CoordError::Metadata(MetadataError::from(unknown)));
        assert_eq!(through.code(), ErrorCode::OutcomeUnknown);
        assert!(
            through
                .body()
                .message
                .contains("may or may not have been applied")
        );
        // A refusal stays a refusal.
        let exists = ServeError::Coord(CoordError::Model(ModelError::TopicExists {
            topic: "orders".into(),
        }));
        assert_eq!(exists.code(), ErrorCode::TopicExists);
    }

    #[test]
    fn a_discarded_group_proposal_is_outcome_unknown() {
        let discarded = malachi_cluster::group::GroupError::Discarded { leader: None };
        let served = ServeError::Metadata(MetadataError::from(discarded));
        assert_eq!(served.code(), ErrorCode::OutcomeUnknown);
    }

    #[test]
    fn a_freeze_without_a_quorum_is_no_quorum_and_a_busy_freeze_is_busy() {
        let segment = malachi_core::model::SegmentId(7);
        let no_quorum = ServeError::from(CoordError::FreezeNoQuorum {
            segment,
            reason: "records up to 3 are on 1 copy".into(),
        });
        assert_eq!(no_quorum.code(), ErrorCode::NoQuorum);
        assert!(no_quorum.code().retriable());
        let busy = ServeError::from(CoordError::Freeze {
            segment,
            reason: "the segment is rolling".into(),
        });
        assert_eq!(busy.code(), ErrorCode::Busy);
    }

    #[test]
    fn a_merge_whose_other_writer_is_down_is_no_quorum_naming_it() {
        let down = ServeError::from(CoordError::BuddyWriterDown {
            topic: "t".into(),
            range: malachi_core::model::RangeId(9),
            primary: malachi_core::model::NodeId(2),
        });
        assert_eq!(down.code(), ErrorCode::NoQuorum);
        assert!(down.code().retriable());
        assert!(
            down.body().message.contains("broker 2"),
            "{}",
            down.body().message
        );
    }

    #[test]
    fn too_few_live_brokers_is_retriable_and_too_few_brokers_is_not() {
        let live = ServeError::from(CoordError::Placement(PlacementError::TooFewBrokers {
            factor: 3,
            live: 2,
        }));
        assert_eq!(live.code(), ErrorCode::NoQuorum);
        assert_eq!(live.body().retry_after_ms, Some(RETRY_AFTER_MS_DEFAULT));
        assert_eq!(
            live.body().message,
            "a replication factor of 3 needs 3 live brokers; 2 are live"
        );
        let cluster = ServeError::from(CoordError::FactorAboveCluster {
            factor: 4,
            members: 3,
        });
        assert_eq!(cluster.code(), ErrorCode::InvalidRequest);
        assert_eq!(cluster.body().retry_after_ms, None);
    }

    #[test]
    fn a_redirect_carries_its_hint_and_no_retry_delay() {
        let body = ServeError::Redirect(Redirect {
            code: ErrorCode::NotLeader,
            message: "topic t is served by broker 2, not broker 1".into(),
            hint: Some("127.0.0.1:4040".into()),
        })
        .body();
        assert_eq!(body.leader_hint.as_deref(), Some("127.0.0.1:4040"));
        // The hint is resent to at once: no delay is asked for.
        assert_eq!(body.retry_after_ms, None);
        // Without a hint, the client backs off as asked.
        let body = ServeError::Redirect(Redirect {
            code: ErrorCode::NotLeader,
            message: "the topic's host is not known yet".into(),
            hint: None,
        })
        .body();
        assert_eq!(body.retry_after_ms, Some(RETRY_AFTER_MS_DEFAULT));
    }

    #[test]
    fn lost_records_are_data_loss_naming_the_topic_range_and_offsets() {
        let served = ServeError::DataLoss {
            topic: "orders".into(),
            range: 0,
            segment: SegmentId(3),
            from: 93,
            to: 200,
            reason: "the copy is damaged".into(),
        };
        assert_eq!(served.code(), ErrorCode::DataLoss);
        let body = served.body();
        assert_eq!(body.retry_after_ms, None);
        assert_eq!(
            body.message,
            "topic orders range 0 lost records 93..200 (segment s3): the copy is damaged"
        );
    }

    #[test]
    fn a_long_message_is_cut_on_a_char_boundary() {
        let body = error_body(
            ErrorCode::InvalidRequest,
            "é".repeat(MESSAGE_BYTES_MAX),
            None,
        );
        assert!(body.message.len() <= MESSAGE_BYTES_MAX);
        assert_eq!(body.retry_after_ms, None);
    }
}
