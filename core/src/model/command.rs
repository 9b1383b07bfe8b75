//! Commands, their outcomes and the typed refusals.
//!
//! Every command names its topic, so a vnode can refuse one outside its arc
//! before applying it, and carries the time it records (`at_ms`), so the
//! machine never reads a clock.

use super::arc::RingArc;
use super::control::{Lease, PendingSplit, VnodeSeed};
use super::cursor_keys::CursorSecret;
use super::state::{Incarnation, NodeId, RangeId, SealRecord, SegmentId, StoragePolicy};
use crate::auth::acl::AclEntry;
use crate::auth::lockout::{LockoutKey, LockoutPolicy};
use crate::auth::scram::StoredCredential;
use crate::auth::token::TokenKey;
use crate::ring::VnodeId;
use serde::{Deserialize, Serialize};

/// The most initial ranges a topic may be created with.
pub const INITIAL_RANGES_MAX: u64 = 1024;
/// The most active ranges one topic may hold; a split beyond it is refused.
pub const ACTIVE_RANGES_PER_TOPIC_MAX: usize = 65_536;
/// The most replicas one segment may have.
pub const REPLICA_SET_SIZE_MAX: usize = 16;
/// The longest topic or policy name, in bytes.
pub const NAME_BYTES_MAX: usize = 249;
/// The longest user name, in bytes (ADR 0148): a SCRAM user name and an
/// ACL principal's name both fit it.
pub const USER_NAME_BYTES_MAX: usize = 255;
/// The most placement constraints one storage policy may carry.
pub const POLICY_CONSTRAINTS_MAX: usize = 64;
/// The longest placement constraint expression, in bytes.
pub const POLICY_CONSTRAINT_BYTES_MAX: usize = 1024;

/// A change to the metadata state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Creates a topic whose `initial_ranges` (a power of two) equal ranges
    /// tile the keyspace. `replicas` holds one replica set per range, in
    /// keyspace order, for each range's first segment.
    CreateTopic {
        topic: String,
        initial_ranges: u64,
        policy: Option<String>,
        replicas: Vec<Vec<NodeId>>,
        at_ms: u64,
    },
    /// Stops the topic taking rolls, splits and merges. Its active segments
    /// are sealed afterwards, one `SealSegment` each, at the lengths the data
    /// plane reports once their write heads are fenced.
    SealTopic { topic: String, at_ms: u64 },
    /// Forgets the topic, its ranges and its segments; the outcome lists the
    /// segments whose copies the data plane may now delete.
    DeleteTopic { topic: String },
    /// Seals `segment` (the newest of its range) at `seal` and opens the next
    /// segment of the range on `next_replicas`, in one step. If the segment
    /// was already sealed at exactly `seal` (seal on failure first, roll
    /// second) only the opening happens.
    RollSegment {
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
        next_replicas: Vec<NodeId>,
        at_ms: u64,
    },
    /// Seals a segment. The first recorded seal wins: the same seal again is
    /// a no-op, a different one is refused with `AlreadySealed`.
    SealSegment {
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
        at_ms: u64,
    },
    /// Seals `range` and its newest segment at `seal`, and opens its two
    /// halves, each with a first segment on the given replicas.
    ///
    /// `segment` is the segment `seal` was computed from (the one the
    /// coordinator froze): unless it is still the range's newest, the
    /// command is refused with `AlreadyRolled` and changes nothing, so a
    /// seal is never recorded for a segment it was not taken from (a
    /// failover may roll the range between the freeze and the proposal;
    /// chaos finding F6). `None`, in commands logged before the field
    /// existed, seals the newest segment whatever it is, as they did.
    SplitRange {
        topic: String,
        range: RangeId,
        seal: SealRecord,
        lower_replicas: Vec<NodeId>,
        upper_replicas: Vec<NodeId>,
        at_ms: u64,
        /// Last and defaulted, so log entries without it still decode.
        #[serde(default)]
        segment: Option<SegmentId>,
    },
    /// Seals two active buddy ranges (the two halves of one aligned band) and
    /// their newest segments, and opens the range covering that band.
    /// `lower_segment` and `upper_segment` name the segments the seals were
    /// computed from, as `segment` does for `SplitRange`.
    MergeRanges {
        topic: String,
        lower: RangeId,
        upper: RangeId,
        lower_seal: SealRecord,
        upper_seal: SealRecord,
        replicas: Vec<NodeId>,
        at_ms: u64,
        /// Last and defaulted, so log entries without them still decode.
        #[serde(default)]
        lower_segment: Option<SegmentId>,
        #[serde(default)]
        upper_segment: Option<SegmentId>,
    },
    /// Replaces node `old` by node `new` in a segment's replica set, in place.
    ReplaceReplica {
        topic: String,
        segment: SegmentId,
        old: NodeId,
        new: NodeId,
    },
    /// Defines or redefines a storage policy.
    PutPolicy { policy: StoragePolicy },
    /// Removes a storage policy definition. Topics pointing at it keep the
    /// name, which then holds their data until an operator rebinds it.
    RemovePolicy { name: String },
    /// Sets the ring arc this vnode owns. From then on a command for a topic
    /// outside it is refused with `WrongVnode`. Refused with
    /// `ArcExcludesTopic` while the state holds a topic outside the new arc,
    /// so an arc can never orphan metadata. Raises the range and segment id
    /// counters to at least `id_base`: each vnode issues ids from its own
    /// block, so ids stay unique across vnodes (segment files are named by
    /// id on brokers that hold copies from many vnodes).
    AssignArc { arc: RingArc, id_base: u64 },
    /// First step of a vnode split, in the old vnode: from now on a command
    /// or read for a topic in `moving` (a part of the arc sharing one of its
    /// ends) is refused with `Moved`, so that part stops changing while it
    /// is copied. The same fence again is a no-op.
    FenceArc { moving: RingArc },
    /// Rolls back an uncommitted split: lifts the fence. A no-op without one.
    LiftFence { moving: RingArc },
    /// Second step, in the new vnode: takes the moved topics, their ranges
    /// and segments, and sets the arc. Only into an empty vnode; the same
    /// arc again is a no-op.
    SeedVnode { seed: Box<VnodeSeed> },
    /// Last step, in the old vnode: drops the fenced part of the arc and
    /// every topic in it, keeping `keep`. A no-op once narrowed.
    NarrowArc { keep: RingArc },
    /// The lease request of brokers from before ADR 0122, judged by the
    /// wall-clock stamps the commands carry: another holder is refused
    /// until `granted_at_ms + duration_ms`. No broker proposes it any more;
    /// it keeps the rule it was applied under, so a log replays to the
    /// state its replicas' snapshots hold (`AcquireLeaseWaited` replaces it).
    AcquireLease {
        holder: u64,
        duration_ms: u64,
        at_ms: u64,
    },
    /// Gives the lease up early; a no-op unless `holder` holds `epoch`.
    ReleaseLease { holder: u64, epoch: u64 },
    /// In the ring's group: creates the ring of `vnodes` equal arcs unless
    /// one exists (then a no-op that reports its version).
    InitRing { vnodes: u32 },
    /// In the ring's group: records the intent to split `parent`, fixing the
    /// child's id and arcs. One split at a time; the same parent again
    /// returns the pending split (a resumed split).
    BeginSplit { parent: VnodeId },
    /// In the ring's group: the ring now names the child. Idempotent.
    CommitSplit { parent: VnodeId, child: VnodeId },
    /// In the ring's group: forgets a committed split once the parent is
    /// narrowed. A no-op when nothing is pending.
    FinishSplit { parent: VnodeId, child: VnodeId },
    /// In the ring's group: forgets an uncommitted split (rollback).
    AbortSplit { parent: VnodeId, child: VnodeId },
    /// In the ring's group: creates the cluster's cursor key 0 with
    /// `secret` unless a key exists (then a no-op that reports the current
    /// id). Every broker proposes it at bootstrap; the first wins (ADR 0096).
    CreateCursorKey { secret: CursorSecret, at_ms: u64 },
    /// In the ring's group: adds key `after + 1` with `secret` and makes it
    /// current, keeping the older keys (at most `CURSOR_KEYS_MAX`). Refused
    /// with `CursorKeyRotated` unless `after` is the current id; the same
    /// rotation again is a no-op.
    RotateCursorKey {
        after: u32,
        secret: CursorSecret,
        at_ms: u64,
    },
    /// In the ring's group: makes `node` an active member of the cluster
    /// (a joining broker, or a decommissioned one coming back). `formed`
    /// is the cluster's formation nodes, listed first if the ring lists no
    /// members yet. Idempotent (ADR 0104).
    AdmitNode { node: u64, formed: Vec<u64> },
    /// In the ring's group: decommissions `node`: its vnode replicas move
    /// to the active members. Refused if fewer than
    /// `min(replicas, active members)` active members would remain, so a
    /// decommission never lowers the vnodes' replica count. Idempotent.
    DecommissionNode {
        node: u64,
        formed: Vec<u64>,
        replicas: u32,
    },
    /// Retention (ADR 0115): forgets these sealed segments of the topic, in
    /// order. Each must be the first segment its range still lists, and
    /// every range its range succeeded must list none, so a key's history
    /// only ever loses its oldest records. Refused whole otherwise. The
    /// data plane then removes their copies. Last, so the variants above
    /// encode as before.
    ExpireSegments {
        topic: String,
        segments: Vec<SegmentId>,
    },
    /// In the ring's group: records `node`'s attributes (ADR 0121), the
    /// input of vnode placement constraints. Each broker proposes its own
    /// when the ring's differ from its configuration. At most
    /// [`crate::ring::MEMBER_ATTRIBUTES_MAX`] of them, each key and value
    /// at most [`crate::ring::MEMBER_ATTRIBUTE_BYTES_MAX`] bytes.
    /// Idempotent.
    SetMemberAttributes {
        node: u64,
        attributes: std::collections::BTreeMap<String, String>,
    },
    /// Appends node `new` to a sealed segment's replica set, after the
    /// copies already there (so the primary and their order are kept): a
    /// healer made a copy there to bring a segment a failover left short
    /// back to its topic's `factor` (ADR 0117). Refused unless the segment
    /// is sealed, if `new` holds a copy already, if the set already has
    /// `factor` copies (so two healers racing, or a deposed one's late
    /// commit, never take a segment past the factor) and if `factor`
    /// exceeds `REPLICA_SET_SIZE_MAX`. Last, so the variants above encode
    /// as before.
    AddReplica {
        topic: String,
        segment: SegmentId,
        new: NodeId,
        factor: u32,
    },
    /// Grants or renews the group's coordinator lease to `holder` (ADR
    /// 0122). While another holds it, refused with `LeaseHeld` (naming its
    /// generation) unless `waited_for` is that generation: the proposer saw
    /// it unchanged for a whole `duration_ms` on its own monotonic clock.
    /// `at_ms` (the proposer's wall clock) is recorded for display and
    /// decides nothing. Last, so the variants above encode as before.
    AcquireLeaseWaited {
        holder: u64,
        duration_ms: u64,
        at_ms: u64,
        waited_for: Option<u64>,
    },
    /// In the ring's group: records `node`'s binary version, logical
    /// version and supported features (ADR 0134). Each broker proposes it
    /// on start. Refused with `FeatureFinalized` if it lacks a finalized
    /// feature and `VersionFinalized` if its logical version is below the
    /// finalized cluster version; otherwise any active, unfinalized feature
    /// it lacks is deactivated (a downgrade before finalize). Last, so the
    /// variants above encode as before.
    AdvertiseFeatures {
        node: u64,
        binary: String,
        logical: u32,
        supported: Vec<String>,
    },
    /// In the ring's group: makes an available feature active. Refused
    /// with `FeatureUnavailable` unless every member advertised it; a
    /// no-op if already active.
    ActivateFeature { feature: String },
    /// In the ring's group: finalizes every active feature and ratchets
    /// the cluster version to the members' lowest logical version. From
    /// then on a broker lacking one of them is refused.
    FinalizeFeatures,
    /// Gives the lease up early, a no-op unless `holder` holds `epoch` at
    /// `generation`: a release that lands after a renewal or a later grant
    /// (by a later keeper of the same holder, say) changes nothing (chaos
    /// finding F11). Emitted only while `Feature::LeaseReleaseGeneration`
    /// is active; `ReleaseLease` otherwise. Last, so the variants above
    /// encode as before.
    ReleaseLeaseGeneration {
        holder: u64,
        epoch: u64,
        generation: u64,
    },
    /// In the ring's group (ADR 0148): creates user `name` with a
    /// credential the proposer derived, or, with `replace`, changes an
    /// existing user's. Refused with `UserExists` for an existing user
    /// without `replace`, unless the credential is the same (a repeat).
    /// Emitted only while `Feature::AdminStore` is active, as are the
    /// admin commands after it. Last, so the variants above encode as
    /// before.
    PutUser {
        name: String,
        credential: StoredCredential,
        replace: bool,
        at_ms: u64,
    },
    /// Forgets a user and its lockout keys; refused with `NoSuchUser`.
    DeleteUser { name: String },
    /// Adds an ACL entry; an entry already there is a no-op.
    AddAcl { entry: AclEntry },
    /// Removes an ACL entry; refused with `NoSuchAcl` if it is not there.
    RemoveAcl { entry: AclEntry },
    /// Counts a failed login of `key` at `at_ms`, judged under `policy`.
    RecordLoginFailure {
        key: LockoutKey,
        policy: LockoutPolicy,
        at_ms: u64,
    },
    /// A successful login clears `key`'s failures.
    RecordLoginSuccess { key: LockoutKey },
    /// An admin's unlock: clears every source's failures of the user.
    UnlockUser { name: String },
    /// Adds a token issuer's public key (ADR 0152); the same key again is
    /// a no-op, another under the same key id is `TokenKeyExists`.
    /// Emitted only while `Feature::TokenKeys` is active, as is
    /// `RemoveTokenKey`. Last, so the variants above encode as before.
    AddTokenKey { key: TokenKey },
    /// Removes a token issuer's key; refused with `NoSuchTokenKey`.
    RemoveTokenKey { kid: String },
}

impl Command {
    /// The topic the command acts on, for routing it to its vnode; `None`
    /// for cluster-wide administrative commands.
    /// Whether the command only renews or gives up the coordinator lease:
    /// it changes no topic, segment, arc or ring.
    pub fn is_lease_only(&self) -> bool {
        matches!(
            self,
            Command::AcquireLease { .. }
                | Command::AcquireLeaseWaited { .. }
                | Command::ReleaseLease { .. }
                | Command::ReleaseLeaseGeneration { .. }
        )
    }

    pub fn topic(&self) -> Option<&str> {
        match self {
            Command::CreateTopic { topic, .. }
            | Command::SealTopic { topic, .. }
            | Command::DeleteTopic { topic }
            | Command::RollSegment { topic, .. }
            | Command::SealSegment { topic, .. }
            | Command::SplitRange { topic, .. }
            | Command::MergeRanges { topic, .. }
            | Command::ReplaceReplica { topic, .. }
            | Command::ExpireSegments { topic, .. }
            | Command::AddReplica { topic, .. } => Some(topic),
            Command::PutPolicy { .. }
            | Command::RemovePolicy { .. }
            | Command::AssignArc { .. }
            | Command::FenceArc { .. }
            | Command::LiftFence { .. }
            | Command::SeedVnode { .. }
            | Command::NarrowArc { .. }
            | Command::AcquireLease { .. }
            | Command::AcquireLeaseWaited { .. }
            | Command::ReleaseLease { .. }
            | Command::ReleaseLeaseGeneration { .. }
            | Command::InitRing { .. }
            | Command::BeginSplit { .. }
            | Command::CommitSplit { .. }
            | Command::FinishSplit { .. }
            | Command::AbortSplit { .. }
            | Command::CreateCursorKey { .. }
            | Command::RotateCursorKey { .. }
            | Command::AdmitNode { .. }
            | Command::DecommissionNode { .. }
            | Command::SetMemberAttributes { .. }
            | Command::AdvertiseFeatures { .. }
            | Command::ActivateFeature { .. }
            | Command::FinalizeFeatures
            | Command::PutUser { .. }
            | Command::DeleteUser { .. }
            | Command::AddAcl { .. }
            | Command::RemoveAcl { .. }
            | Command::RecordLoginFailure { .. }
            | Command::RecordLoginSuccess { .. }
            | Command::UnlockUser { .. }
            | Command::AddTokenKey { .. }
            | Command::RemoveTokenKey { .. } => None,
        }
    }
}

/// What an applied command changed, with the ids it issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    TopicCreated {
        incarnation: Incarnation,
        ranges: Vec<RangeId>,
        segments: Vec<SegmentId>,
    },
    /// The topic is sealed; `active_segments` are the segments the
    /// coordinator must still fence and seal, one `SealSegment` each.
    TopicSealed {
        active_segments: Vec<SegmentId>,
    },
    TopicDeleted {
        incarnation: Incarnation,
        segments: Vec<SegmentId>,
    },
    SegmentRolled {
        sealed: SegmentId,
        next: SegmentId,
    },
    SegmentSealed {
        segment: SegmentId,
    },
    RangeSplit {
        parent: RangeId,
        lower: RangeId,
        upper: RangeId,
        lower_segment: SegmentId,
        upper_segment: SegmentId,
    },
    RangesMerged {
        lower: RangeId,
        upper: RangeId,
        merged: RangeId,
        segment: SegmentId,
    },
    ReplicaReplaced {
        segment: SegmentId,
    },
    PolicyPut,
    PolicyRemoved,
    ArcAssigned,
    ArcFenced,
    FenceLifted,
    VnodeSeeded,
    /// The topics the narrowed vnode no longer holds (the new vnode does).
    /// Their segments' copies stay: only the metadata moved.
    ArcNarrowed {
        dropped: Vec<String>,
    },
    LeaseGranted {
        lease: Lease,
    },
    LeaseReleased,
    /// The ring group's ring is at `version`.
    RingChanged {
        version: u64,
    },
    /// The split in progress (new, or the one already begun for this parent).
    SplitBegun {
        split: PendingSplit,
    },
    SplitFinished,
    SplitAborted,
    /// The cluster's current cursor key id (created, rotated, or already so).
    CursorKeyCurrent {
        id: u32,
    },
    /// The command was a repeat of one already applied (a re-seal at the
    /// recorded seal, sealing a sealed topic): nothing changed.
    Unchanged,
    /// Retention forgot these segments (ADR 0115); the data plane removes
    /// their copies. Last, so the variants above encode as before.
    SegmentsExpired {
        segments: Vec<SegmentId>,
    },
    /// A copy was added to the sealed segment's replica set (ADR 0117).
    /// Last, so the variants above encode as before.
    ReplicaAdded {
        segment: SegmentId,
    },
    /// A broker's advertisement was recorded; `deactivated` names the
    /// active features it lacked, now inactive (ADR 0134).
    FeaturesAdvertised {
        deactivated: Vec<String>,
    },
    /// The feature is active from now on.
    FeatureActivated {
        feature: String,
    },
    /// These features are finalized; the cluster version is `version`.
    FeaturesFinalized {
        features: Vec<String>,
        version: u32,
    },
    /// A user was created (`created`) or its credential changed (ADR
    /// 0148). Last, so the variants above encode as before.
    UserPut {
        created: bool,
    },
    UserDeleted,
    AclAdded,
    AclRemoved,
    /// A failed login was counted: the next attempt of its key may run at
    /// `retry_at_ms` (the lock's end if `locked`).
    LoginFailureRecorded {
        retry_at_ms: u64,
        locked: bool,
    },
    /// How many lockout keys a success or an unlock cleared.
    LockoutCleared {
        keys: u64,
    },
    /// An issuer key was added (ADR 0152).
    TokenKeyAdded,
    /// An issuer key was removed.
    TokenKeyRemoved,
}

/// A refused command. The state is left exactly as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ModelError {
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: NameRule },
    #[error("topic {topic} already exists")]
    TopicExists { topic: String },
    #[error("no such topic {topic}")]
    NoSuchTopic { topic: String },
    #[error("topic {topic} is sealed")]
    TopicSealed { topic: String },
    #[error("initial range count {count} is not a power of two")]
    NotPowerOfTwo { count: u64 },
    #[error("initial range count {count} exceeds the limit of {max}")]
    TooManyInitialRanges { count: u64, max: u64 },
    #[error("topic {topic} would exceed {max} active ranges")]
    TooManyActiveRanges { topic: String, max: usize },
    #[error("{expected} replica sets are needed, one per initial range, but {found} were given")]
    ReplicaSetCount { expected: u64, found: usize },
    #[error("a replica set is empty")]
    EmptyReplicaSet,
    #[error("replica set names node {node} twice")]
    DuplicateReplica { node: NodeId },
    #[error("replica set of {count} exceeds the limit of {max}")]
    TooManyReplicas { count: usize, max: usize },
    #[error("no such range {range} in topic {topic}")]
    NoSuchRange { topic: String, range: RangeId },
    #[error("no such segment {segment} in topic {topic}")]
    NoSuchSegment { topic: String, segment: SegmentId },
    #[error("range {range} is not active")]
    RangeNotActive { range: RangeId },
    #[error("range {range} is a single position and cannot split")]
    RangeTooSmall { range: RangeId },
    #[error("segment {segment} was already sealed at length {} ({} bytes)", recorded.length, recorded.bytes)]
    AlreadySealed {
        segment: SegmentId,
        recorded: SealRecord,
    },
    #[error("segment {segment} was already rolled; its successor is {successor}")]
    AlreadyRolled {
        segment: SegmentId,
        successor: SegmentId,
    },
    #[error("ranges {lower} and {upper} are not the two halves of one band")]
    NotBuddies { lower: RangeId, upper: RangeId },
    /// A merge named a range whose buddy is not one active range: the
    /// range covers the whole keyspace, or its buddy's band is split further.
    #[error(
        "range {range} has no active buddy to merge with: it covers the whole keyspace, or its buddy's band is split further"
    )]
    NoBuddy { range: RangeId },
    #[error("node {node} is not a replica of segment {segment}")]
    WrongReplica { segment: SegmentId, node: NodeId },
    #[error("node {node} is already a replica of segment {segment}")]
    ReplicaPresent { segment: SegmentId, node: NodeId },
    #[error("sealing at length {length} overflows the offset space of range {range}")]
    OffsetOverflow { range: RangeId, length: u64 },
    #[error("no such storage policy {name}")]
    NoSuchPolicy { name: String },
    #[error(
        "storage policy {name} has {count} placement constraints, more than {max} or one longer than {bytes_max} bytes"
    )]
    InvalidPolicy {
        name: String,
        count: usize,
        max: usize,
        bytes_max: usize,
    },
    #[error("the {what} id space is exhausted")]
    IdSpaceExhausted { what: IdKind },
    /// The topic's ring position is outside this vnode's arc: the sender
    /// routed by a stale ring and must re-read it and retry elsewhere.
    #[error("topic {topic} is outside this vnode's arc {arc}")]
    WrongVnode { topic: String, arc: RingArc },
    /// The new arc would leave an existing topic outside it.
    #[error("arc {arc} does not hold existing topic {topic}")]
    ArcExcludesTopic { topic: String, arc: RingArc },
    /// The topic lies in the part of this vnode's arc a split is moving to
    /// a new vnode: retriable once the ring names the new vnode.
    #[error("topic {topic} is moving out of this vnode (fenced arc {arc})")]
    Moved { topic: String, arc: RingArc },
    #[error("fence {moving} is not a part of the vnode's arc {arc:?} sharing one of its ends")]
    FenceOutsideArc {
        moving: RingArc,
        arc: Option<RingArc>,
    },
    #[error("another fence {fence} is in place")]
    FenceInPlace { fence: RingArc },
    #[error("the vnode cannot narrow to {keep}: the rest of its arc is not fenced")]
    NotFenced { keep: RingArc },
    #[error("invalid vnode seed: {reason}")]
    InvalidSeed { reason: String },
    #[error("lease duration {duration_ms} ms is not within 1..={max_ms} ms")]
    InvalidLease { duration_ms: u64, max_ms: u64 },
    /// Another holds the lease. `generation` is what a would-be holder
    /// must see unchanged for `duration_ms` of its own monotonic clock
    /// before it names it in `waited_for`; `expires_at_ms` is by the
    /// commands' wall-clock stamps, informational only.
    #[error(
        "the lease is held by node {holder} (generation {generation}, {duration_ms} ms a grant; by wall-clock stamps until {expires_at_ms} ms)"
    )]
    LeaseHeld {
        holder: u64,
        expires_at_ms: u64,
        /// Last, with defaults, so refusals from before them decode.
        #[serde(default)]
        generation: u64,
        #[serde(default)]
        duration_ms: u64,
    },
    #[error("this group holds no ring")]
    NoRing,
    #[error("the ring refused: {reason}")]
    RingRefused { reason: String },
    #[error("the split of {parent} into {child} is in progress")]
    SplitInProgress { parent: VnodeId, child: VnodeId },
    #[error("no split of {parent} into {child} is pending")]
    NoSuchSplit { parent: VnodeId, child: VnodeId },
    #[error("the split of {parent} into {child} has not committed its ring")]
    SplitNotCommitted { parent: VnodeId, child: VnodeId },
    #[error("the split of {parent} into {child} has committed its ring and cannot abort")]
    SplitCommitted { parent: VnodeId, child: VnodeId },
    #[error("a cursor secret of {bytes} bytes is not within {min}..={max} bytes")]
    InvalidCursorSecret {
        bytes: usize,
        min: usize,
        max: usize,
    },
    #[error("this group holds no cursor key to rotate")]
    NoCursorKey,
    /// A rotation named a key that is no longer the current one: another
    /// rotation came first.
    #[error("cursor key {after} is not current (key {current} is): read the keys and rotate again")]
    CursorKeyRotated { after: u32, current: u32 },
    #[error("the cursor key id space is exhausted")]
    CursorKeyIdsExhausted,
    #[error("node {node} is not a member of the cluster")]
    NotAMember { node: u64 },
    #[error(
        "decommissioning node {node} would leave {remaining} active brokers, fewer than the {needed} the vnodes' replicas need"
    )]
    TooFewMembers {
        node: u64,
        remaining: usize,
        needed: usize,
    },
    #[error("node id 0 is not a broker")]
    InvalidNode,
    /// Retention may not forget this segment now (ADR 0115).
    #[error("segment {segment} cannot expire: {reason}")]
    NotExpirable { segment: SegmentId, reason: String },
    /// A member's attributes break the ring's bounds (ADR 0121).
    #[error("attributes of node {node}: {reason}")]
    InvalidAttributes { node: u64, reason: String },
    /// Only a sealed segment's replica set grows (ADR 0117): an active
    /// one's followers are the writer's, fixed for its life. Last, so the
    /// variants above encode as before.
    #[error("segment {segment} is not sealed")]
    SegmentNotSealed { segment: SegmentId },
    /// An `AddReplica` found the set at its factor already: another copy
    /// was added first.
    #[error("segment {segment} already has the {factor} copies of its factor")]
    AtFactor { segment: SegmentId, factor: u32 },
    /// A broker lacks a feature the cluster finalized (ADR 0134): its
    /// binary is older than the cluster, and a downgrade past finalize is
    /// refused.
    #[error(
        "node {node} does not support feature {feature}, which this cluster finalized: a downgrade past finalize is refused; run a binary that supports {feature}"
    )]
    FeatureFinalized { node: u64, feature: String },
    /// A broker's logical version is below the finalized cluster version.
    #[error(
        "node {node} runs logical version {logical}, below the finalized cluster version {version}: a downgrade past finalize is refused"
    )]
    VersionFinalized {
        node: u64,
        logical: u32,
        version: u32,
    },
    /// Not every member supports the feature, so it cannot be activated.
    #[error("feature {feature} is not available: brokers {missing:?} do not support it")]
    FeatureUnavailable { feature: String, missing: Vec<u64> },
    /// A broker's advertisement breaks the table's bounds.
    #[error("features of node {node}: {reason}")]
    InvalidFeatures { node: u64, reason: String },
    /// A user name breaks its rule (ADR 0148). Last, so the variants
    /// above encode as before.
    #[error("invalid user name {name:?}: {reason}")]
    InvalidUserName { name: String, reason: UserNameRule },
    #[error("a credential of {iterations} iterations is not within {min}..={max}")]
    CredentialIterations { iterations: u32, min: u32, max: u32 },
    #[error("a credential salt of {bytes} bytes is not within {min}..={max}")]
    CredentialSalt {
        bytes: usize,
        min: usize,
        max: usize,
    },
    #[error("user {name} already exists")]
    UserExists { name: String },
    #[error("no such user {name}")]
    NoSuchUser { name: String },
    #[error("the store holds {max} users already")]
    TooManyUsers { max: usize },
    #[error("invalid ACL entry: {reason}")]
    InvalidAcl { reason: String },
    #[error("the store holds {max} ACL entries already")]
    TooManyAcls { max: usize },
    #[error("no such ACL entry {entry:?}")]
    NoSuchAcl { entry: Box<AclEntry> },
    #[error("invalid lockout record: {reason}")]
    InvalidLockout { reason: String },
    #[error("invalid token key: {reason}")]
    InvalidTokenKey { reason: String },
    #[error("token key {kid} already exists with another key: add the new key under a new key id")]
    TokenKeyExists { kid: String },
    #[error("the store holds {max} token keys already")]
    TooManyTokenKeys { max: usize },
    #[error("no such token key {kid}")]
    NoSuchTokenKey { kid: String },
}

impl ModelError {
    /// Whether the sender routed by a ring that is not (or no longer) the
    /// current one: re-read the ring and retry. Nothing was applied.
    pub fn is_misrouted(&self) -> bool {
        matches!(
            self,
            ModelError::WrongVnode { .. } | ModelError::Moved { .. }
        )
    }
}

/// The rule a topic or policy name broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameRule {
    Empty,
    TooLong,
    /// Names are limited to ASCII letters, digits, `.`, `_` and `-`, so they
    /// are safe in file paths, actor names and metric labels.
    BadCharacter,
}

impl std::fmt::Display for NameRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameRule::Empty => f.write_str("it is empty"),
            NameRule::TooLong => write!(f, "it is longer than {NAME_BYTES_MAX} bytes"),
            NameRule::BadCharacter => {
                f.write_str("only ascii letters, digits, '.', '_' and '-' are allowed")
            }
        }
    }
}

/// The rule a user name broke (ADR 0148).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserNameRule {
    Empty,
    TooLong,
    /// User names are limited to ASCII letters, digits, `.`, `_`, `-` and
    /// `@`: nothing SCRAM escapes or a principal pattern uses.
    BadCharacter,
}

impl std::fmt::Display for UserNameRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserNameRule::Empty => f.write_str("it is empty"),
            UserNameRule::TooLong => {
                write!(f, "it is longer than {USER_NAME_BYTES_MAX} bytes")
            }
            UserNameRule::BadCharacter => {
                f.write_str("only ascii letters, digits, '.', '_', '-' and '@' are allowed")
            }
        }
    }
}

/// Which counter ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdKind {
    Incarnation,
    Range,
    Segment,
}

impl std::fmt::Display for IdKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IdKind::Incarnation => "incarnation",
            IdKind::Range => "range",
            IdKind::Segment => "segment",
        })
    }
}
