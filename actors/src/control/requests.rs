//! The coordinator's requests and their errors: what connections, the
//! coordinator manager and segment actors (through their `Roller`) send.
//! Kept apart from the actors so the broker context can hold a
//! coordinator's handle without naming its logic.

use malachi_core::model::{ModelError, NodeId, RangeId, SealRecord, SegmentId};
use malachi_core::ring::VnodeId;
use malachi_supervision::SupervisionError;
use malachi_wire::replica_order::OrderEpoch;
use ractor::RpcReplyPort;

use crate::common::error::MetadataError;

/// Why a coordinator request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CoordError {
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Metadata(#[from] MetadataError),
    #[error("cannot start or stop a segment actor: {0}")]
    Supervision(#[from] SupervisionError),
    #[error("unexpected outcome from the metadata model: {0}")]
    Unexpected(String),
    /// The segment is not in this broker's metadata (its topic was deleted,
    /// or the replica has not applied its creation within the wait).
    #[error("segment {segment} is unknown")]
    UnknownSegment { segment: SegmentId },
    #[error("segment {segment} cannot be sealed now: {reason}")]
    Freeze { segment: SegmentId, reason: String },
    /// A quorum of the segment's copies did not hold every durable record
    /// within `replica_ack_timeout_ms`, so it could not be sealed for a split
    /// or merge (retriable once enough copies are back).
    #[error("segment {segment} cannot be sealed without a quorum: {reason}")]
    FreezeNoQuorum { segment: SegmentId, reason: String },
    /// No replica set fits the request and the live brokers.
    #[error("{0}")]
    Placement(#[from] malachi_core::placement::PlacementError),
    /// An explicit replication factor above the cluster's brokers (live or
    /// not): no wait makes it possible.
    #[error("a replication factor of {factor} needs {factor} brokers; the cluster has {members}")]
    FactorAboveCluster { factor: usize, members: usize },
    /// The topic's storage policy's placement constraints (ADR 0116).
    #[error("{0}")]
    Constraints(#[from] malachi_core::constraints::PlaceError),
    /// A split or merge must freeze an active segment whose writer runs on
    /// `primary`, another broker: the client port sends the client there
    /// (`not_leader` with its address; ADR 0141).
    #[error("range {} of topic {topic} is written by broker {}", .range.0, .primary.0)]
    WrittenElsewhere {
        topic: String,
        range: RangeId,
        primary: NodeId,
    },
    /// A merge's other half is written by `primary`, which takes no new
    /// copies now (down, unreachable, full or leaving): neither half can
    /// move to the other's writer until it returns or fails over.
    #[error("range {} of topic {topic} is written by broker {}, which is down or unreachable from here; the merge waits for its return or a failover", .range.0, .primary.0)]
    BuddyWriterDown {
        topic: String,
        range: RangeId,
        primary: NodeId,
    },
    /// A range cannot be moved to `target`: it is not live, has no room,
    /// is leaving, or the topic's placement constraints rank it out.
    #[error("a range cannot move to broker {}: it takes no new copies now", .target.0)]
    MoveTarget { target: NodeId },
}

pub(crate) enum CoordinatorMsg {
    CreateTopic {
        name: String,
        policy: Option<String>,
        /// Copies of each segment; `None` takes the broker's default.
        replication_factor: Option<u8>,
        reply: RpcReplyPort<Result<u64, CoordError>>,
    },
    DeleteTopic {
        name: String,
        reply: RpcReplyPort<Result<(), CoordError>>,
    },
    /// Seal `segment` at `seal` and open the next segment of its range.
    Roll {
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
        reply: RpcReplyPort<Result<SegmentId, CoordError>>,
    },
    /// Split an active range into its two halves.
    Split {
        topic: String,
        range: RangeId,
        reply: RpcReplyPort<Result<(RangeId, RangeId), CoordError>>,
    },
    /// Merge an active range with its active buddy.
    Merge {
        topic: String,
        range: RangeId,
        reply: RpcReplyPort<Result<(RangeId, RangeId, RangeId), CoordError>>,
    },
    /// Move where an active range is written to broker `to` (the
    /// balancer's; ADR 0144): its active segment is rolled to a successor
    /// `to` leads.
    Move {
        topic: String,
        range: RangeId,
        to: NodeId,
        reply: RpcReplyPort<Result<SegmentId, CoordError>>,
    },
    /// Start every active segment actor the metadata assigns to this node
    /// and stop those of deleted topics (the manager's).
    Reconcile,
    /// Start and stop coordinators as leadership changed (the manager's).
    Replan,
    /// Run the coordinator's continuous work, if it holds its lease (the
    /// coordinator's own timer).
    Upkeep,
    /// A task the actor watches ended (`common::watched`): the actor fails
    /// on it and its supervisor restarts it, task and all.
    TaskEnded(crate::common::watched::TaskEnded),
}
impl ractor::Message for CoordinatorMsg {}

pub(crate) use malachi_core::plan::{Candidate, HealCandidate, HealKind, ProbeTarget, ScrubTarget};

/// What coordinators send the failover actor (`maintenance/failover.rs`),
/// kept here so the control plane names no module above it.
pub(crate) enum FailoverMsg {
    /// `vnode`'s coordinator, leading at `order`, wants these failed over.
    /// Starts a task for each not running; a task of an older order for
    /// the same segment is replaced. Segments left out keep running.
    Ensure {
        vnode: VnodeId,
        order: OrderEpoch,
        candidates: Vec<Candidate>,
    },
    /// A task ended (done, or no longer this broker's to run).
    Ended {
        segment: SegmentId,
        order: OrderEpoch,
    },
    /// `vnode`'s coordinator, leading at `order`, wants the copies of these
    /// active segments probed (replica-status, never a fence) for a fence
    /// left by a failover that did not finish, or a copy latched failed.
    Probe {
        vnode: VnodeId,
        order: OrderEpoch,
        targets: Vec<ProbeTarget>,
    },
    /// A probe's findings: the segments with a copy fenced or failed.
    Probed {
        vnode: VnodeId,
        order: OrderEpoch,
        stuck: Vec<Candidate>,
    },
}

impl ractor::Message for FailoverMsg {}

/// What coordinators send the healer (`maintenance/healer.rs`).
pub(crate) enum HealMsg {
    /// `vnode`'s coordinator, leading at `order`, wants these copies
    /// re-created. Starts a task for each segment not healing already.
    Ensure {
        vnode: VnodeId,
        order: OrderEpoch,
        candidates: Vec<HealCandidate>,
    },
    /// A task ended.
    Ended { segment: SegmentId },
    /// `vnode`'s coordinator, leading at `order`, wants the scrub verdicts
    /// of these sealed segments' copies; the broken ones are rebuilt.
    Scrub {
        vnode: VnodeId,
        order: OrderEpoch,
        targets: Vec<ScrubTarget>,
    },
    /// A scrub poll of `vnode` ended.
    ScrubEnded { vnode: VnodeId },
}

impl ractor::Message for HealMsg {}
