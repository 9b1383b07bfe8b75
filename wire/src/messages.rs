//! Request and response types, one pair per operation.
//!
//! Control payloads are MessagePack maps written by `rmp_serde::to_vec_named`:
//! every struct is a map keyed by its field names, every unit enum variant is
//! its snake_case name as a string, `Option::None` is `nil`. Named maps let a
//! later version add optional fields without breaking older peers (unknown
//! keys are ignored, missing optional keys read as `None`); see ADR 0040.
//!
//! Three messages carry records: `produce` requests, `fetch` responses and
//! `subscribe` pushes. Their payload is the control map immediately followed
//! by a record batch block (see [`crate::batch`]) that runs to the end of the
//! frame, so the block is carried as a zero-copy slice and never re-encoded.
//!
//! Every message is checked against its bounds ([`crate::limits`]) when it is
//! encoded and when it is decoded.

use std::collections::BTreeMap;
use std::io::Cursor;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::ApiKey;
use crate::batch::RecordBatch;
use crate::error::{ErrorBody, WireError};
use crate::limits::*;

/// A control payload: its name for errors, its bounds, and whether a record
/// batch block follows it.
pub trait Message: Serialize + DeserializeOwned + Sized {
    /// The message's name in errors and logs.
    const NAME: &'static str;
    /// Whether a record batch block follows the control map.
    const CARRIES_BATCH: bool = false;
    /// The longest payload the decoder reads, checked before anything is
    /// decoded or allocated; `None` leaves only the frame's own bound.
    /// Messages a client sends before it is authenticated set one.
    const PAYLOAD_BYTES_MAX: Option<usize> = None;

    /// Check every bound of the message.
    fn check(&self) -> Result<(), WireError>;

    /// The block that follows the control map, for messages that carry one.
    fn batch(&self) -> Option<&RecordBatch> {
        None
    }

    /// Put the decoded block back into the message.
    fn attach_batch(&mut self, _batch: RecordBatch) {}

    /// Encode as a frame payload, checking bounds first.
    fn encode(&self) -> Result<Bytes, WireError> {
        let (control, block) = self.encode_parts()?;
        let Some(block) = block else {
            return Ok(control);
        };
        let mut out = BytesMut::with_capacity(control.len() + block.len());
        out.put_slice(&control);
        out.put_slice(&block);
        Ok(out.freeze())
    }

    /// Encode as the two pieces of a frame payload, checking bounds first:
    /// the control map, then the block (a zero-copy clone of the batch's),
    /// so a writer can send a large block without copying it.
    fn encode_parts(&self) -> Result<(Bytes, Option<Bytes>), WireError> {
        self.check()?;
        let control = rmp_serde::to_vec_named(self).map_err(|source| WireError::Encode {
            message: Self::NAME,
            source,
        })?;
        Ok((
            Bytes::from(control),
            self.batch().map(|b| b.block().clone()),
        ))
    }

    /// Decode a frame payload, checking bounds last.
    fn decode(payload: Bytes) -> Result<Self, WireError> {
        if let Some(limit) = Self::PAYLOAD_BYTES_MAX {
            check_len("payload", payload.len(), limit)?;
        }
        let mut de = rmp_serde::Deserializer::new(Cursor::new(payload.as_ref()));
        de.set_max_depth(NESTING_DEPTH_MAX);
        let mut message = Self::deserialize(&mut de).map_err(|source| WireError::Decode {
            message: Self::NAME,
            source,
        })?;
        // The cursor's position is at most the payload length: it only
        // advanced over bytes it read from that slice.
        let used = usize::try_from(de.position())
            .unwrap_or(payload.len())
            .min(payload.len());
        let rest = payload.slice(used..);
        if Self::CARRIES_BATCH {
            message.attach_batch(RecordBatch::from_block(rest)?);
        } else if !rest.is_empty() {
            return Err(WireError::TrailingBytes {
                message: Self::NAME,
                bytes: rest.len(),
            });
        }
        message.check()?;
        Ok(message)
    }
}

/// A request, its api key and the response type it is answered with.
pub trait Operation: Message {
    const API_KEY: ApiKey;
    type Response: Message;
}

pub(crate) fn check_len(field: &'static str, actual: usize, limit: usize) -> Result<(), WireError> {
    if actual > limit {
        return Err(WireError::OverLimit {
            field,
            actual,
            limit,
        });
    }
    Ok(())
}

fn check_name(field: &'static str, name: &str) -> Result<(), WireError> {
    if name.is_empty() {
        return Err(WireError::InvalidField {
            field,
            reason: "empty",
        });
    }
    check_len(field, name.len(), NAME_BYTES_MAX)
}

fn check_cursor(field: &'static str, cursor: &str) -> Result<(), WireError> {
    check_len(field, cursor.len(), CURSOR_BYTES_MAX)
}

fn check_opt(field: &'static str, value: &Option<String>, limit: usize) -> Result<(), WireError> {
    check_len(field, value.as_ref().map_or(0, String::len), limit)
}

fn check_start(cursor: &Option<String>, from_start: bool) -> Result<(), WireError> {
    if let Some(cursor) = cursor {
        check_cursor("cursor", cursor)?;
        if from_start {
            return Err(WireError::InvalidField {
                field: "from_start",
                reason: "set together with a cursor",
            });
        }
    }
    Ok(())
}

impl Message for ErrorBody {
    const NAME: &'static str = "error_body";
    fn check(&self) -> Result<(), WireError> {
        check_len("message", self.message.len(), MESSAGE_BYTES_MAX)?;
        check_opt("leader_hint", &self.leader_hint, ADDRESS_BYTES_MAX)?;
        match &self.ranges {
            Some(ranges) => check_ranges(ranges),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------- api_versions

/// One api key's supported version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersion {
    pub api_key: u16,
    pub min_version: u16,
    pub max_version: u16,
}

impl ApiVersion {
    /// The ranges this build supports, one per implemented key.
    pub fn supported() -> Vec<ApiVersion> {
        ApiKey::ALL
            .iter()
            .map(|key| {
                let range = key.versions();
                ApiVersion {
                    api_key: key.code(),
                    min_version: range.min_version,
                    max_version: range.max_version,
                }
            })
            .collect()
    }

    /// The version both sides speak for one key: the highest version in the
    /// intersection of the two ranges, or `None` when they do not overlap.
    pub fn negotiate(ours: ApiVersion, theirs: ApiVersion) -> Option<u16> {
        if ours.api_key != theirs.api_key {
            return None;
        }
        let low = ours.min_version.max(theirs.min_version);
        let high = ours.max_version.min(theirs.max_version);
        (low <= high).then_some(high)
    }
}

fn check_versions(versions: &[ApiVersion]) -> Result<(), WireError> {
    check_len("versions", versions.len(), API_VERSIONS_MAX)?;
    if versions.iter().any(|v| v.min_version > v.max_version) {
        return Err(WireError::InvalidField {
            field: "versions",
            reason: "min_version above max_version",
        });
    }
    Ok(())
}

/// Sent first on a connection: the client's own ranges, so the broker can pick
/// the version of each key for the rest of the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ApiVersionsRequest {
    /// A free-form client name for logs (e.g. `malachi-cli/0.1.0`).
    pub client_name: String,
    pub versions: Vec<ApiVersion>,
}

impl Message for ApiVersionsRequest {
    const NAME: &'static str = "api_versions_request";
    fn check(&self) -> Result<(), WireError> {
        check_len("client_name", self.client_name.len(), NAME_BYTES_MAX)?;
        check_versions(&self.versions)
    }
}

/// The broker's ranges for every key it implements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ApiVersionsResponse {
    /// The answering broker's node id.
    pub node_id: u64,
    pub versions: Vec<ApiVersion>,
}

impl Message for ApiVersionsResponse {
    const NAME: &'static str = "api_versions_response";
    fn check(&self) -> Result<(), WireError> {
        check_versions(&self.versions)
    }
}

// ---------------------------------------------------------------- topics

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CreateTopicRequest {
    pub name: String,
    /// Copies of each segment; `None` takes the cluster default.
    pub replication_factor: Option<u8>,
    /// A storage policy name; `None` takes the cluster defaults.
    pub policy: Option<String>,
}

impl Message for CreateTopicRequest {
    const NAME: &'static str = "create_topic_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)?;
        if self.replication_factor == Some(0) {
            return Err(WireError::InvalidField {
                field: "replication_factor",
                reason: "zero",
            });
        }
        check_opt("policy", &self.policy, NAME_BYTES_MAX)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CreateTopicResponse {
    pub name: String,
    /// Distinguishes this topic from an earlier one of the same name.
    pub incarnation: u64,
}

impl Message for CreateTopicResponse {
    const NAME: &'static str = "create_topic_response";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteTopicRequest {
    pub name: String,
}

impl Message for DeleteTopicRequest {
    const NAME: &'static str = "delete_topic_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeleteTopicResponse {
    pub name: String,
}

impl Message for DeleteTopicResponse {
    const NAME: &'static str = "delete_topic_response";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

/// The most placement constraints one storage policy carries.
pub const POLICY_CONSTRAINTS_MAX: usize = 16;
/// The longest placement constraint, in bytes.
pub const POLICY_CONSTRAINT_BYTES_MAX: usize = 256;
/// The most policies one `list_policies` answer carries.
pub const POLICIES_MAX: usize = 4096;

/// A storage policy (ADR 0115): a name, a retention rule and placement
/// constraints. Unset retention bounds keep data for ever.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PolicyDescription {
    pub name: String,
    /// Sealed segments go once sealed this long.
    #[serde(default)]
    pub retention_age_ms: Option<u64>,
    /// The oldest sealed segments go while a topic's sealed bytes exceed this.
    #[serde(default)]
    pub retention_bytes: Option<u64>,
    /// Placement constraint expressions over broker attributes.
    #[serde(default)]
    pub placement: Vec<String>,
    /// Automatic reshaping's settings for the policy's topics (ADR 0143);
    /// absent keeps the brokers' defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshape: Option<PolicyReshape>,
}

/// A policy's overrides of the brokers' reshaping defaults (ADR 0143):
/// each unset field keeps the broker's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PolicyReshape {
    /// `false` keeps the topics' ranges as they are.
    #[serde(default)]
    pub auto_reshape: Option<bool>,
    #[serde(default)]
    pub split_write_bytes_per_second: Option<u64>,
    #[serde(default)]
    pub split_after_ms: Option<u64>,
    #[serde(default)]
    pub merge_write_bytes_per_second: Option<u64>,
    #[serde(default)]
    pub merge_after_ms: Option<u64>,
    #[serde(default)]
    pub reshape_interval_ms: Option<u64>,
    #[serde(default)]
    pub ranges_min: Option<u32>,
    #[serde(default)]
    pub ranges_max: Option<u32>,
}

impl PolicyDescription {
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)?;
        check_len("placement", self.placement.len(), POLICY_CONSTRAINTS_MAX)?;
        for constraint in &self.placement {
            check_len("placement", constraint.len(), POLICY_CONSTRAINT_BYTES_MAX)?;
        }
        Ok(())
    }
}

/// `put_policy` (25): defines or redefines a storage policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutPolicyRequest {
    pub policy: PolicyDescription,
}

impl Message for PutPolicyRequest {
    const NAME: &'static str = "put_policy_request";
    fn check(&self) -> Result<(), WireError> {
        self.policy.check()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PutPolicyResponse {
    pub name: String,
}

impl Message for PutPolicyResponse {
    const NAME: &'static str = "put_policy_response";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

/// `list_policies` (26): every policy, or the one named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListPoliciesRequest {
    #[serde(default)]
    pub name: Option<String>,
}

impl Message for ListPoliciesRequest {
    const NAME: &'static str = "list_policies_request";
    fn check(&self) -> Result<(), WireError> {
        if let Some(name) = &self.name {
            check_name("name", name)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListPoliciesResponse {
    pub policies: Vec<PolicyDescription>,
}

impl Message for ListPoliciesResponse {
    const NAME: &'static str = "list_policies_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("policies", self.policies.len(), POLICIES_MAX)?;
        self.policies.iter().try_for_each(PolicyDescription::check)
    }
}

/// `delete_policy` (27): removes a policy definition. Topics naming it
/// keep the name, which then holds their data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeletePolicyRequest {
    pub name: String,
}

impl Message for DeletePolicyRequest {
    const NAME: &'static str = "delete_policy_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeletePolicyResponse {
    pub name: String,
}

impl Message for DeletePolicyResponse {
    const NAME: &'static str = "delete_policy_response";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListTopicsRequest {}

impl Message for ListTopicsRequest {
    const NAME: &'static str = "list_topics_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// One line of `topic list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopicListing {
    pub name: String,
    pub incarnation: u64,
    /// `active` or `sealed`.
    pub state: String,
    pub ranges_active: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListTopicsResponse {
    pub topics: Vec<TopicListing>,
}

impl Message for ListTopicsResponse {
    const NAME: &'static str = "list_topics_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("topics", self.topics.len(), TOPICS_MAX)?;
        for topic in &self.topics {
            check_name("name", &topic.name)?;
            check_len("state", topic.state.len(), STATE_BYTES_MAX)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DescribeTopicRequest {
    pub name: String,
    /// Also ask the brokers holding the active segments' copies for the
    /// live figures (committed end, each copy's durable end; ADR 0098).
    /// Off, the answer is the metadata alone, as a producer fetching the
    /// layout wants it. Sent only when set, so an older broker never sees
    /// it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub live: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Message for DescribeTopicRequest {
    const NAME: &'static str = "describe_topic_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)
    }
}

/// What `topic describe` shows: the wire's own mirror of the metadata
/// model's description (the wire does not depend on the cluster crate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopicDescription {
    pub name: String,
    pub incarnation: u64,
    /// `active` or `sealed`.
    pub state: String,
    pub sealed_at_ms: Option<u64>,
    pub policy: Option<String>,
    /// Whether a definition backs the policy name; an unresolved name holds data.
    pub policy_resolved: bool,
    pub created_at_ms: u64,
    pub ranges: Vec<RangeDescription>,
    /// Write rates and automatic reshapes as the answering broker knows
    /// them (ADR 0143): absent from brokers that predate it, and while
    /// the broker knows nothing of the topic's load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshaping: Option<TopicReshaping>,
}

/// The most reshapes `topic describe` lists for one topic.
pub const RESHAPE_HISTORY_MAX: usize = 16;

/// A topic's write rates and recent automatic reshapes (ADR 0143).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopicReshaping {
    /// The active ranges the answering broker writes, with their rates.
    #[serde(default)]
    pub rates: Vec<RangeRate>,
    /// The recent automatic reshapes this broker asked for, oldest first.
    #[serde(default)]
    pub history: Vec<ReshapeEvent>,
}

/// One range's write rate at its primary (ADR 0143).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RangeRate {
    pub range: u64,
    /// The primary that measured it.
    pub primary: u64,
    pub write_bytes_per_second: u64,
    pub write_records_per_second: u64,
    /// The hottest key's share of the range's bytes, per mille (a lower bound).
    #[serde(default)]
    pub hot_key_share_permille: Option<u64>,
    /// Whether the range would split but for its one hot key.
    #[serde(default)]
    pub hot_key_unsplittable: bool,
}

/// One automatic reshape, or a refused attempt (ADR 0143).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReshapeEvent {
    pub at_ms: u64,
    /// `split` or `merge`.
    pub kind: String,
    /// Why: `write_rate_high`, `write_rate_low`.
    pub reason: String,
    /// The ranges reshaped (a split's parent; a merge's two buddies).
    pub ranges: Vec<u64>,
    /// The ranges that replaced them; empty when the attempt was refused.
    #[serde(default)]
    pub children: Vec<u64>,
    /// Why the attempt was refused, if it was.
    #[serde(default)]
    pub refused: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RangeDescription {
    pub id: u64,
    /// The keyspace band's inclusive start, as a `0x`-prefixed 16-digit hex string.
    pub band_start: String,
    /// The band's exclusive end, same form (`0x10000000000000000` for the top).
    pub band_end: String,
    /// `active` or `sealed`.
    pub state: String,
    pub sealed_at_ms: Option<u64>,
    pub parents: Vec<u64>,
    pub children: Vec<u64>,
    pub created_at_ms: u64,
    pub segments: Vec<SegmentDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SegmentDescription {
    pub id: u64,
    pub start_offset: u64,
    /// Node ids holding a copy.
    pub replicas: Vec<u64>,
    /// `active` or `sealed`.
    pub state: String,
    /// Records, once sealed.
    pub length: Option<u64>,
    /// Bytes, once sealed.
    pub bytes: Option<u64>,
    pub created_at_ms: u64,
    pub sealed_at_ms: Option<u64>,
    /// The writer epoch replica-appends to this segment carry (ADR 0097);
    /// absent from older brokers (then 0).
    #[serde(default)]
    pub epoch: u64,
    /// The node that writes the segment: its first replica. `None` from a
    /// broker that predates the field.
    #[serde(default)]
    pub primary: Option<u64>,
    /// Records committed (durable on a quorum of copies): the seal's
    /// length once sealed; for an active segment, as its primary reports
    /// it. `None` when the primary could not be asked (ADR 0098).
    #[serde(default)]
    pub committed_end: Option<u64>,
    /// Each copy, in replica order (the primary's first); empty from a
    /// broker that predates the field.
    #[serde(default)]
    pub copies: Vec<CopyDescription>,
}

/// One copy of a segment as `topic describe` found it (ADR 0098).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CopyDescription {
    /// The node holding the copy.
    pub node: u64,
    /// `live` (its broker answered with its ends), `not_open` (its broker
    /// holds no open copy: not opened since it restarted, or not created
    /// yet), `fenced`, `failed` (its disk failed), `unreachable` (its
    /// broker did not answer in time), `unknown` (its broker answered
    /// without the figures: an older version, or an error), or `sealed`
    /// (the segment is sealed: its copies are not asked, the seal's length
    /// is the committed end).
    pub status: String,
    /// Records durable on the copy, when its broker told.
    #[serde(default)]
    pub durable_end: Option<u64>,
}

impl TopicDescription {
    fn check(&self) -> Result<(), WireError> {
        check_name("name", &self.name)?;
        check_len("state", self.state.len(), STATE_BYTES_MAX)?;
        check_opt("policy", &self.policy, NAME_BYTES_MAX)?;
        check_len("ranges", self.ranges.len(), RANGES_MAX)?;
        if let Some(reshaping) = &self.reshaping {
            check_len("rates", reshaping.rates.len(), RANGES_MAX)?;
            check_len("history", reshaping.history.len(), RESHAPE_HISTORY_MAX)?;
            for event in &reshaping.history {
                check_len("kind", event.kind.len(), STATE_BYTES_MAX)?;
                check_len("reason", event.reason.len(), STATE_BYTES_MAX)?;
                check_len("ranges", event.ranges.len(), RANGE_LINKS_MAX)?;
                check_len("children", event.children.len(), RANGE_LINKS_MAX)?;
                check_opt("refused", &event.refused, POLICY_CONSTRAINT_BYTES_MAX)?;
            }
        }
        for range in &self.ranges {
            check_len("band_start", range.band_start.len(), STATE_BYTES_MAX)?;
            check_len("band_end", range.band_end.len(), STATE_BYTES_MAX)?;
            check_len("state", range.state.len(), STATE_BYTES_MAX)?;
            check_len("parents", range.parents.len(), RANGE_LINKS_MAX)?;
            check_len("children", range.children.len(), RANGE_LINKS_MAX)?;
            check_len("segments", range.segments.len(), SEGMENTS_MAX)?;
            for segment in &range.segments {
                check_len("replicas", segment.replicas.len(), REPLICAS_MAX)?;
                check_len("state", segment.state.len(), STATE_BYTES_MAX)?;
                check_len("copies", segment.copies.len(), REPLICAS_MAX)?;
                for copy in &segment.copies {
                    check_len("status", copy.status.len(), STATE_BYTES_MAX)?;
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DescribeTopicResponse {
    pub topic: TopicDescription,
}

impl Message for DescribeTopicResponse {
    const NAME: &'static str = "describe_topic_response";
    fn check(&self) -> Result<(), WireError> {
        self.topic.check()
    }
}

// ---------------------------------------------------------------- ranges

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SplitRangeRequest {
    pub topic: String,
    pub range_id: u64,
}

impl Message for SplitRangeRequest {
    const NAME: &'static str = "split_range_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("topic", &self.topic)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SplitRangeResponse {
    /// The range that was split (now sealed).
    pub range_id: u64,
    /// Its two halves, lower band first.
    pub children: Vec<u64>,
}

impl Message for SplitRangeResponse {
    const NAME: &'static str = "split_range_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("children", self.children.len(), RANGE_LINKS_MAX)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MergeRangeRequest {
    pub topic: String,
    /// Either half; the broker finds its buddy.
    pub range_id: u64,
}

impl Message for MergeRangeRequest {
    const NAME: &'static str = "merge_range_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("topic", &self.topic)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MergeRangeResponse {
    /// The new range covering both halves.
    pub range_id: u64,
    /// The two halves it replaced (now sealed).
    pub parents: Vec<u64>,
}

impl Message for MergeRangeResponse {
    const NAME: &'static str = "merge_range_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("parents", self.parents.len(), RANGE_LINKS_MAX)
    }
}

// ---------------------------------------------------------------- data

/// An idempotent producer's tag on one produce request (ADR 0092). The
/// request's records must all fall in `range` (the client routes by the
/// topic's ranges); `sequence` counts this producer's batches to that range
/// from 0, one per request, within `epoch`. A retry resends the same tag: a
/// batch already stored is answered with its original acknowledgement
/// (`duplicate: true`) and not written again; a sequence beyond the next
/// expected one is refused with `sequence_gap`; an epoch older than the
/// newest the range has seen for the id is refused with `producer_fenced`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProducerBatch {
    pub producer_id: u64,
    pub epoch: u64,
    pub range: u64,
    pub sequence: u64,
}

/// Append records. Acknowledged once durable on a quorum; positions stay
/// hidden (no offset is returned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProduceRequest {
    pub topic: String,
    /// Set by an idempotent producer; `None` for a plain produce.
    #[serde(default)]
    pub producer: Option<ProducerBatch>,
    /// The records: the block after the control map, not a map field.
    #[serde(skip)]
    pub records: RecordBatch,
}

impl Message for ProduceRequest {
    const NAME: &'static str = "produce_request";
    const CARRIES_BATCH: bool = true;
    fn check(&self) -> Result<(), WireError> {
        check_name("topic", &self.topic)?;
        if self.records.is_empty() {
            return Err(WireError::InvalidField {
                field: "records",
                reason: "empty batch",
            });
        }
        Ok(())
    }
    fn batch(&self) -> Option<&RecordBatch> {
        Some(&self.records)
    }
    fn attach_batch(&mut self, batch: RecordBatch) {
        self.records = batch;
    }
}

/// What one range did with its part of a produce request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RangeOutcome {
    pub range: u64,
    /// Records of this range now durable (all of its part, or none).
    pub records_acknowledged: u32,
    /// The part was an idempotent retry of a batch already stored: it was
    /// not written again, and this is the original acknowledgement.
    #[serde(default)]
    pub duplicate: bool,
    /// 0 when the part is durable, else the error code that refused it.
    #[serde(default)]
    pub error_code: u16,
    /// Why the part was refused, when it was.
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProduceResponse {
    /// Records of the request now durable: all of them, since a response
    /// without an error code means every range stored its part.
    pub records_acknowledged: u32,
    /// One entry per range the records went to, in range id order.
    #[serde(default)]
    pub ranges: Vec<RangeOutcome>,
}

impl Message for ProduceResponse {
    const NAME: &'static str = "produce_response";
    fn check(&self) -> Result<(), WireError> {
        check_ranges(&self.ranges)
    }
}

/// Bounds of a produce answer's per-range list (in a response or an error body).
pub fn check_ranges(ranges: &[RangeOutcome]) -> Result<(), WireError> {
    check_len("ranges", ranges.len(), RANGE_OUTCOMES_MAX)?;
    for outcome in ranges {
        if let Some(message) = &outcome.message {
            check_len("message", message.len(), crate::limits::MESSAGE_BYTES_MAX)?;
        }
    }
    Ok(())
}

/// Read records from a cursor (or the start, or the tail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FetchRequest {
    pub topic: String,
    /// Where to resume; `None` with `from_start: false` means the tail (new records only).
    pub cursor: Option<String>,
    /// Start at the oldest retained record; must be false when `cursor` is set.
    pub from_start: bool,
    /// At most this many records (1..=RECORDS_PER_FETCH_MAX).
    pub records_max: u32,
    /// At most this many block bytes, except that one record is always
    /// returned if it alone is larger (so a big record never stalls a reader).
    pub bytes_max: u32,
    /// Long poll: wait up to this long for a first record (0..=FETCH_WAIT_MS_MAX).
    pub wait_ms: u32,
}

impl Message for FetchRequest {
    const NAME: &'static str = "fetch_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("topic", &self.topic)?;
        check_start(&self.cursor, self.from_start)?;
        check_budget(self.records_max, self.bytes_max)?;
        check_len("wait_ms", self.wait_ms as usize, FETCH_WAIT_MS_MAX as usize)
    }
}

fn check_budget(records: u32, bytes: u32) -> Result<(), WireError> {
    if records == 0 || bytes == 0 {
        return Err(WireError::InvalidField {
            field: "records_max",
            reason: "a zero budget",
        });
    }
    check_len(
        "records_max",
        records as usize,
        RECORDS_PER_FETCH_MAX as usize,
    )?;
    check_len(
        "bytes_max",
        bytes as usize,
        crate::frame::FRAME_BYTES_MAX_DEFAULT,
    )
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FetchResponse {
    /// The position after the last record of `records` (or the same position
    /// when none came): pass it back to continue.
    pub next_cursor: String,
    #[serde(skip)]
    pub records: RecordBatch,
}

impl Message for FetchResponse {
    const NAME: &'static str = "fetch_response";
    const CARRIES_BATCH: bool = true;
    fn check(&self) -> Result<(), WireError> {
        check_cursor("next_cursor", &self.next_cursor)
    }
    fn batch(&self) -> Option<&RecordBatch> {
        Some(&self.records)
    }
    fn attach_batch(&mut self, batch: RecordBatch) {
        self.records = batch;
    }
}

/// Open a push subscription. The broker answers with any number of
/// [`SubscribePush`] frames carrying the subscribe's correlation id, within
/// the credit granted; an error response ends the subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubscribeRequest {
    pub topic: String,
    pub cursor: Option<String>,
    pub from_start: bool,
    /// Initial record credit.
    pub credit_records: u32,
    /// Initial byte credit (block bytes).
    pub credit_bytes: u32,
}

impl Message for SubscribeRequest {
    const NAME: &'static str = "subscribe_request";
    fn check(&self) -> Result<(), WireError> {
        check_name("topic", &self.topic)?;
        check_start(&self.cursor, self.from_start)?;
        check_credit(self.credit_records, self.credit_bytes)
    }
}

fn check_credit(records: u32, bytes: u32) -> Result<(), WireError> {
    check_len(
        "credit_records",
        records as usize,
        CREDIT_RECORDS_MAX as usize,
    )?;
    check_len("credit_bytes", bytes as usize, CREDIT_BYTES_MAX as usize)
}

/// One push of a subscription: a batch and the cursor after it.
///
/// The broker sends push 0 as soon as it accepts the subscription, even with
/// an empty batch, so the client learns of acceptance (or of an error such as
/// `not_leader`) at once. Later pushes carry at least one record, except the
/// final `last: true` push after a cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubscribePush {
    /// 0 for the first push of a subscription, then +1 per push.
    pub sequence: u64,
    pub next_cursor: String,
    /// True on the final push of a subscription the client cancelled; only
    /// that push may carry an empty batch. Nothing follows it.
    pub last: bool,
    #[serde(skip)]
    pub records: RecordBatch,
}

impl Message for SubscribePush {
    const NAME: &'static str = "subscribe_push";
    const CARRIES_BATCH: bool = true;
    fn check(&self) -> Result<(), WireError> {
        check_cursor("next_cursor", &self.next_cursor)
    }
    fn batch(&self) -> Option<&RecordBatch> {
        Some(&self.records)
    }
    fn attach_batch(&mut self, batch: RecordBatch) {
        self.records = batch;
    }
}

/// The subscription "ack": grants more credit, acknowledges pushes, or cancels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubscribeCreditRequest {
    /// The correlation id of the subscribe request on this connection.
    pub subscription_id: u32,
    /// Records of credit to add.
    pub credit_records: u32,
    /// Bytes of credit to add.
    pub credit_bytes: u32,
    /// The highest push sequence the client has processed.
    pub acked_sequence: Option<u64>,
    /// End the subscription: the broker stops pushing and sends one last
    /// push with `last: true` on the subscribe's correlation id.
    pub cancel: bool,
}

impl Message for SubscribeCreditRequest {
    const NAME: &'static str = "subscribe_credit_request";
    fn check(&self) -> Result<(), WireError> {
        check_credit(self.credit_records, self.credit_bytes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubscribeCreditResponse {
    /// Record credit outstanding after the grant.
    pub credit_records: u32,
    /// Byte credit outstanding after the grant.
    pub credit_bytes: u32,
}

impl Message for SubscribeCreditResponse {
    const NAME: &'static str = "subscribe_credit_response";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

// ---------------------------------------------------------------- tree

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TreeSnapshotRequest {
    /// Also gather the tree of every other broker of the cluster (over the
    /// node fabric); absent in older clients, meaning false.
    #[serde(default)]
    pub all: bool,
}

impl Message for TreeSnapshotRequest {
    const NAME: &'static str = "tree_snapshot_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// A supervisor's restart strategy (mirrors the supervision crate's, same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SupervisionStrategy {
    #[default]
    OneForOne,
    OneForAll,
    RestForOne,
}

/// Worker or nested supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ChildKind {
    #[default]
    Worker,
    Supervisor,
}

/// A child's restart type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    #[default]
    Permanent,
    Transient,
    Temporary,
}

/// What a child is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ChildStatus {
    #[default]
    Running,
    Restarting,
    Stopped,
    Unresponsive,
}

/// One supervisor and its subtree (mirrors `SupervisorSnapshot`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SupervisorSnapshot {
    pub name: String,
    pub actor_id: String,
    pub strategy: SupervisionStrategy,
    pub uptime_ms: u64,
    pub children: Vec<ChildSnapshot>,
}

/// One child of a supervisor (mirrors `ChildSnapshot`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ChildSnapshot {
    pub name: String,
    pub actor_id: Option<String>,
    pub kind: ChildKind,
    pub restart: Restart,
    pub status: ChildStatus,
    pub restarts: u32,
    pub last_exit_reason: Option<String>,
    pub uptime_ms: u64,
    pub supervisor: Option<SupervisorSnapshot>,
}

impl SupervisorSnapshot {
    fn check(&self, depth: usize) -> Result<(), WireError> {
        check_len("tree depth", depth, TREE_DEPTH_MAX)?;
        check_len("supervisor name", self.name.len(), NAME_BYTES_MAX)?;
        check_len("actor_id", self.actor_id.len(), NAME_BYTES_MAX)?;
        check_len("children", self.children.len(), TREE_CHILDREN_MAX)?;
        for child in &self.children {
            check_len("child name", child.name.len(), NAME_BYTES_MAX)?;
            check_opt("actor_id", &child.actor_id, NAME_BYTES_MAX)?;
            check_opt(
                "last_exit_reason",
                &child.last_exit_reason,
                MESSAGE_BYTES_MAX,
            )?;
            if let Some(nested) = &child.supervisor {
                nested.check(depth + 1)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TreeSnapshotResponse {
    /// The broker whose tree this is.
    pub node_id: u64,
    pub root: SupervisorSnapshot,
    /// With `all`: every broker of the cluster (the answering one first),
    /// each with its tree or why it could not be had. Empty otherwise.
    #[serde(default)]
    pub brokers: Vec<BrokerTree>,
}

/// One broker's tree in a cluster-wide snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BrokerTree {
    pub node_id: u64,
    /// Its state as the answering broker's membership sees it.
    pub state: BrokerState,
    pub client_addr: String,
    /// The tree, when the broker answered.
    pub root: Option<SupervisorSnapshot>,
    /// Why there is no tree (down, no session, timed out).
    pub unreachable: Option<String>,
}

impl Message for TreeSnapshotResponse {
    const NAME: &'static str = "tree_snapshot_response";
    fn check(&self) -> Result<(), WireError> {
        self.root.check(1)?;
        check_len("brokers", self.brokers.len(), BROKERS_MAX)?;
        for broker in &self.brokers {
            check_len("client_addr", broker.client_addr.len(), ADDRESS_BYTES_MAX)?;
            check_opt("unreachable", &broker.unreachable, MESSAGE_BYTES_MAX)?;
            if let Some(root) = &broker.root {
                root.check(1)?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- cluster

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterStatusRequest {}

impl Message for ClusterStatusRequest {
    const NAME: &'static str = "cluster_status_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// A broker's liveness as membership (SWIM) sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BrokerState {
    #[default]
    Alive,
    Suspect,
    Dead,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BrokerStatus {
    pub node_id: u64,
    pub state: BrokerState,
    /// `host:port` of the client (wire protocol) listener.
    pub client_addr: String,
    pub raft_addr: String,
    pub admin_addr: String,
    /// Operator-given attributes (rack, zone, ...).
    pub attributes: BTreeMap<String, String>,
    /// The vnodes whose raft group this broker leads.
    pub vnodes_led: Vec<u32>,
    /// Grows with every start of the broker (0 from older brokers).
    #[serde(default)]
    pub incarnation: u64,
    /// `host:port` of its node fabric (ractor_cluster) server, if any.
    #[serde(default)]
    pub cluster_addr: String,
    /// Whether the answering broker can open a session with this broker's
    /// cluster port (ADR 0155): `reachable`, `unreachable` (left out of
    /// placement), or `unknown` (never dialled yet). Empty from an older
    /// broker.
    #[serde(default)]
    pub cluster_port: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterStatusResponse {
    /// The broker that answered.
    pub node_id: u64,
    pub brokers: Vec<BrokerStatus>,
}

impl Message for ClusterStatusResponse {
    const NAME: &'static str = "cluster_status_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("brokers", self.brokers.len(), BROKERS_MAX)?;
        for broker in &self.brokers {
            check_len("client_addr", broker.client_addr.len(), ADDRESS_BYTES_MAX)?;
            check_len("raft_addr", broker.raft_addr.len(), ADDRESS_BYTES_MAX)?;
            check_len("admin_addr", broker.admin_addr.len(), ADDRESS_BYTES_MAX)?;
            check_len("cluster_addr", broker.cluster_addr.len(), ADDRESS_BYTES_MAX)?;
            check_len("cluster_port", broker.cluster_port.len(), NAME_BYTES_MAX)?;
            check_len("attributes", broker.attributes.len(), ATTRIBUTES_MAX)?;
            for (key, value) in &broker.attributes {
                check_len("attribute key", key.len(), NAME_BYTES_MAX)?;
                check_len("attribute value", value.len(), NAME_BYTES_MAX)?;
            }
            check_len("vnodes_led", broker.vnodes_led.len(), VNODES_MAX)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- vnodes

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VnodeListRequest {}

impl Message for VnodeListRequest {
    const NAME: &'static str = "vnode_list_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

/// One vnode of the ring. Its arc is `arc_start..=arc_last` of the 64-bit
/// hash space (inclusive, so the top arc fits in a u64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VnodeInfo {
    pub id: u32,
    pub arc_start: u64,
    pub arc_last: u64,
    /// The leader of its raft group as the answering broker knows it.
    pub leader: Option<u64>,
    /// The raft term of that knowledge (0 when unknown).
    pub term: u64,
    /// The brokers holding a replica of its group.
    pub replicas: Vec<u64>,
    /// The node holding the coordinator lease in the answering broker's
    /// replica of the group, when it holds one.
    #[serde(default)]
    pub lease_holder: Option<u64>,
}

impl VnodeInfo {
    fn check(&self) -> Result<(), WireError> {
        check_len("replicas", self.replicas.len(), BROKERS_MAX)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VnodeListResponse {
    /// The broker that answered.
    pub node_id: u64,
    /// The version of the ring it routes by (every split raises it).
    pub ring_version: u64,
    /// The ring's vnodes, by arc.
    pub vnodes: Vec<VnodeInfo>,
}

impl Message for VnodeListResponse {
    const NAME: &'static str = "vnode_list_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("vnodes", self.vnodes.len(), VNODES_MAX)?;
        self.vnodes.iter().try_for_each(VnodeInfo::check)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VnodeSplitRequest {
    /// The vnode to split: it keeps the lower half of its arc.
    pub vnode: u32,
}

impl Message for VnodeSplitRequest {
    const NAME: &'static str = "vnode_split_request";
    fn check(&self) -> Result<(), WireError> {
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct VnodeSplitResponse {
    /// The ring version that names the child.
    pub ring_version: u64,
    /// The split vnode, with the lower half of its former arc.
    pub parent: VnodeInfo,
    /// The new vnode, with the upper half.
    pub child: VnodeInfo,
}

impl Message for VnodeSplitResponse {
    const NAME: &'static str = "vnode_split_response";
    fn check(&self) -> Result<(), WireError> {
        self.parent.check()?;
        self.child.check()
    }
}

/// The cluster's members and where their vnode replicas are; with
/// `decommission` (or `admit`), first changes that broker's state (ADR
/// 0104). At most one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterMembersRequest {
    /// Decommission this broker: its vnode replicas move to the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decommission: Option<u64>,
    /// Make this broker an active member again (or admit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit: Option<u64>,
}

impl Message for ClusterMembersRequest {
    const NAME: &'static str = "cluster_members_request";
    fn check(&self) -> Result<(), WireError> {
        if self.decommission.is_some() && self.admit.is_some() {
            return Err(WireError::InvalidField {
                field: "decommission",
                reason: "at most one of decommission and admit",
            });
        }
        if self.decommission == Some(0) {
            return Err(WireError::InvalidField {
                field: "decommission",
                reason: "node id 0 is not a broker",
            });
        }
        if self.admit == Some(0) {
            return Err(WireError::InvalidField {
                field: "admit",
                reason: "node id 0 is not a broker",
            });
        }
        Ok(())
    }
}

/// A member's state in the cluster (ADR 0104).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Holds vnode replicas and takes new ones.
    #[default]
    Active,
    /// Its vnode replicas move away; it takes no new ones.
    Decommissioned,
}

/// One member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MemberInfo {
    pub node_id: u64,
    pub state: MemberState,
    /// Vnode groups (the ring's own included) whose leader lists it as a
    /// voter.
    pub vnode_replicas: u32,
    /// Vnode groups whose leader lists it as a learner: it keeps their
    /// metadata for the segment copies it holds, or is catching up to
    /// become a voter.
    #[serde(default)]
    pub vnode_learners: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClusterMembersResponse {
    /// The broker that answered.
    pub node_id: u64,
    /// The ring version the members were read at.
    pub ring_version: u64,
    pub members: Vec<MemberInfo>,
    /// Vnode groups, the ring's own included.
    pub groups: u32,
    /// Groups whose voters are not yet where the members say they belong
    /// (a change under way).
    pub groups_moving: u32,
    /// Groups whose leader did not answer.
    pub groups_unreachable: u32,
}

impl Message for ClusterMembersResponse {
    const NAME: &'static str = "cluster_members_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("members", self.members.len(), BROKERS_MAX)
    }
}

/// `features` (28): the cluster's versions and feature states (ADR 0134);
/// with `activate` or `finalize`, first changes them. At most one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FeaturesRequest {
    /// Activate this available feature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activate: Option<String>,
    /// Finalize every active feature: a broker lacking one is refused from
    /// then on, so a downgrade past it is impossible.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finalize: bool,
}

impl Message for FeaturesRequest {
    const NAME: &'static str = "features_request";
    fn check(&self) -> Result<(), WireError> {
        if self.activate.is_some() && self.finalize {
            return Err(WireError::InvalidField {
                field: "activate",
                reason: "at most one of activate and finalize",
            });
        }
        if let Some(name) = &self.activate {
            check_len("activate", name.len(), FEATURE_NAME_BYTES_MAX)?;
        }
        Ok(())
    }
}

/// A feature's name and where it stands: `unavailable` (some broker does
/// not support it), `available`, `active` (writers emit it) or `finalized`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FeatureInfo {
    pub name: String,
    pub state: String,
    /// The brokers that do not support it.
    #[serde(default)]
    pub missing: Vec<u64>,
}

/// What one broker advertised: its binary's version string, its logical
/// version and the features it supports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BrokerVersion {
    pub node_id: u64,
    pub binary: String,
    pub logical: u32,
    pub supported: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct FeaturesResponse {
    /// The broker that answered.
    pub node_id: u64,
    /// The finalized cluster version: 0 until an operator finalizes.
    pub cluster_version: u32,
    pub brokers: Vec<BrokerVersion>,
    pub features: Vec<FeatureInfo>,
    /// The brokers that do not gossip that they read the feature table
    /// (from before ADR 0134): while any does, nothing is written to a
    /// pristine table, so no broker advertises. Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<u64>,
}

impl Message for FeaturesResponse {
    const NAME: &'static str = "features_response";
    fn check(&self) -> Result<(), WireError> {
        check_len("brokers", self.brokers.len(), BROKERS_MAX)?;
        check_len("features", self.features.len(), FEATURES_MAX)?;
        check_len("waiting_for", self.waiting_for.len(), BROKERS_MAX)?;
        for broker in &self.brokers {
            check_len("supported", broker.supported.len(), FEATURES_MAX)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- dispatch

macro_rules! operations {
    ($( $variant:ident => $request:ty, $response:ty; )*) => {
        $(
            impl Operation for $request {
                const API_KEY: ApiKey = ApiKey::$variant;
                type Response = $response;
            }
        )*

        /// Any request, for servers that dispatch on the api key.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Request {
            $( $variant($request), )*
        }

        /// Any successful response (for `subscribe`: one push).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Response {
            $( $variant($response), )*
        }

        impl Request {
            /// The request's api key.
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $( Request::$variant(_) => ApiKey::$variant, )*
                }
            }

            /// Encode the payload of the request frame.
            pub fn encode(&self) -> Result<Bytes, WireError> {
                match self {
                    $( Request::$variant(message) => message.encode(), )*
                }
            }

            /// Decode a request frame's payload. Unknown and reserved keys are
            /// [`WireError::UnsupportedApi`].
            pub fn decode(api_key: u16, payload: Bytes) -> Result<Request, WireError> {
                match ApiKey::from_code(api_key)? {
                    $( ApiKey::$variant => Ok(Request::$variant(<$request>::decode(payload)?)), )*
                }
            }
        }

        impl Response {
            /// The api key of the request this answers.
            pub fn api_key(&self) -> ApiKey {
                match self {
                    $( Response::$variant(_) => ApiKey::$variant, )*
                }
            }

            /// Encode the payload of a successful response frame.
            pub fn encode(&self) -> Result<Bytes, WireError> {
                match self {
                    $( Response::$variant(message) => message.encode(), )*
                }
            }

            /// Encode the payload of a successful response frame as its
            /// control map and its block, without copying the block.
            pub fn encode_parts(&self) -> Result<(Bytes, Option<Bytes>), WireError> {
                match self {
                    $( Response::$variant(message) => message.encode_parts(), )*
                }
            }

            /// Decode a successful response frame's payload; the caller knows
            /// the api key from the request it sent.
            pub fn decode(api_key: ApiKey, payload: Bytes) -> Result<Response, WireError> {
                match api_key {
                    $( ApiKey::$variant => Ok(Response::$variant(<$response>::decode(payload)?)), )*
                }
            }
        }
    };
}

operations! {
    ApiVersions => ApiVersionsRequest, ApiVersionsResponse;
    CreateTopic => CreateTopicRequest, CreateTopicResponse;
    DeleteTopic => DeleteTopicRequest, DeleteTopicResponse;
    ListTopics => ListTopicsRequest, ListTopicsResponse;
    DescribeTopic => DescribeTopicRequest, DescribeTopicResponse;
    SplitRange => SplitRangeRequest, SplitRangeResponse;
    MergeRange => MergeRangeRequest, MergeRangeResponse;
    Produce => ProduceRequest, ProduceResponse;
    Fetch => FetchRequest, FetchResponse;
    Subscribe => SubscribeRequest, SubscribePush;
    SubscribeCredit => SubscribeCreditRequest, SubscribeCreditResponse;
    TreeSnapshot => TreeSnapshotRequest, TreeSnapshotResponse;
    ClusterStatus => ClusterStatusRequest, ClusterStatusResponse;
    VnodeList => VnodeListRequest, VnodeListResponse;
    VnodeSplit => VnodeSplitRequest, VnodeSplitResponse;
    ClusterMembers => ClusterMembersRequest, ClusterMembersResponse;
    PutPolicy => PutPolicyRequest, PutPolicyResponse;
    ListPolicies => ListPoliciesRequest, ListPoliciesResponse;
    DeletePolicy => DeletePolicyRequest, DeletePolicyResponse;
    Features => FeaturesRequest, FeaturesResponse;
    SaslHandshake => crate::auth::SaslHandshakeRequest, crate::auth::SaslHandshakeResponse;
    SaslAuthenticate => crate::auth::SaslAuthenticateRequest, crate::auth::SaslAuthenticateResponse;
    TokenAuthenticate => crate::auth::TokenAuthenticateRequest, crate::auth::TokenAuthenticateResponse;
    PutUser => crate::auth_admin::PutUserRequest, crate::auth_admin::PutUserResponse;
    DeleteUser => crate::auth_admin::DeleteUserRequest, crate::auth_admin::DeleteUserResponse;
    ListUsers => crate::auth_admin::ListUsersRequest, crate::auth_admin::ListUsersResponse;
    AddAcl => crate::auth_admin::AddAclRequest, crate::auth_admin::AclChangeResponse;
    RemoveAcl => crate::auth_admin::RemoveAclRequest, crate::auth_admin::AclChangeResponse;
    ListAcls => crate::auth_admin::ListAclsRequest, crate::auth_admin::ListAclsResponse;
    UnlockUser => crate::auth_admin::UnlockUserRequest, crate::auth_admin::UnlockUserResponse;
    PutTokenKey => crate::token_keys::PutTokenKeyRequest, crate::token_keys::PutTokenKeyResponse;
    DeleteTokenKey => crate::token_keys::DeleteTokenKeyRequest, crate::token_keys::DeleteTokenKeyResponse;
    ListTokenKeys => crate::token_keys::ListTokenKeysRequest, crate::token_keys::ListTokenKeysResponse;
}
