//! The log model and its deterministic metadata state machine.
//!
//! A topic is a set of ranges that tile the u64 keyspace; a range is a chain
//! of segments in its own offset space; a segment is the unit of replication.
//! `MetadataState::apply` is the state machine a raft group replicates.
//!
//! Architecture invariant: this module is pure. It imports nothing that
//! reads a clock, a random source, the filesystem or the network (no
//! `std::time`, `rand`, `std::fs`, `std::net`; a test greps for them), and
//! keeps no `HashMap` in its state. Time arrives inside commands (`at_ms`),
//! ids come from counters inside the state, so replicas that apply the same
//! commands serialize to the same bytes.

mod admin_store;
mod apply;
mod arc;
mod command;
mod control;
mod cursor_keys;
mod describe;
mod feature_readers;
mod features;
mod keyspace;
mod read_plan;
mod retention;
mod state;

pub use admin_store::{
    AdminStore, AuthView, LOCKOUT_ENTRIES_MAX, LOCKOUT_SOURCE_BYTES_MAX, USERS_MAX, UserRecord,
    validate_credential, validate_token_key, validate_user_name,
};
pub use apply::validate_name as validate_topic_name;
pub use arc::{RING_END, RingArc, ring_position};
pub use command::{
    ACTIVE_RANGES_PER_TOPIC_MAX, Command, INITIAL_RANGES_MAX, IdKind, ModelError, NAME_BYTES_MAX,
    NameRule, Outcome, POLICY_CONSTRAINT_BYTES_MAX, POLICY_CONSTRAINTS_MAX, REPLICA_SET_SIZE_MAX,
    USER_NAME_BYTES_MAX, UserNameRule,
};
pub use control::{LEASE_DURATION_MAX_MS, Lease, PendingSplit, RingRecord, VnodeSeed};
pub use cursor_keys::{CURSOR_KEYS_MAX, CursorKeyEntry, CursorKeyRing, CursorSecret};
pub use describe::{RangeDescription, SegmentDescription, TopicDescription};
pub use feature_readers::{
    FEATURE_TABLE, FEATURE_TABLE_PROTOCOL, FEATURES_ATTRIBUTE, features_attribute,
    reads_feature_table, table_held_back_by,
};
pub use features::{
    Activation, Advertised, BASELINE_FEATURES, BINARY_VERSION_BYTES_MAX, FEATURE_NAME_BYTES_MAX,
    FEATURES_ADVERTISED_MAX, Feature, FeatureInactive, FeatureState, FeatureTable, LOGICAL_VERSION,
    SUPPORTED_FEATURES, decommissioned,
};
pub use keyspace::{Band, BandError, POSITION_BITS, position};
pub use read_plan::{ReadPlan, ReadSlice, SegmentSpan};
pub use retention::{EXPIRE_SEGMENTS_MAX, RetentionRule};
pub use state::{
    Expired, Incarnation, InvariantViolation, MetadataState, NodeId, Range, RangeId, RangeState,
    ReshapePolicy, SNAPSHOT_VERSION, SealRecord, Segment, SegmentId, SegmentState, SnapshotError,
    StoragePolicy, Topic, TopicState,
};
