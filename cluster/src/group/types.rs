//! The openraft type configuration. Everything openraft-shaped stays in this
//! module tree (`group`), so that an alpha bump touches nothing else.

use malachi_core::model::{Command, ModelError, Outcome};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The log entry payload: one model command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request(pub(crate) Command);

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Display only needs to identify the command in logs; its name is
        // enough and keeps large replica lists out of every log line.
        let name = match &self.0 {
            Command::CreateTopic { topic, .. } => ("create_topic", topic),
            Command::SealTopic { topic, .. } => ("seal_topic", topic),
            Command::DeleteTopic { topic } => ("delete_topic", topic),
            Command::RollSegment { topic, .. } => ("roll_segment", topic),
            Command::SealSegment { topic, .. } => ("seal_segment", topic),
            Command::SplitRange { topic, .. } => ("split_range", topic),
            Command::MergeRanges { topic, .. } => ("merge_ranges", topic),
            Command::SeedVnode { seed } => {
                return write!(f, "seed_vnode({}, {} topics)", seed.arc, seed.topics.len());
            }
            other => return write!(f, "{other:?}"),
        };
        write!(f, "{}({})", name.0, name.1)
    }
}

/// What applying one entry produced: the model's verdict for a command,
/// nothing for a blank or membership entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Response(pub(crate) Option<Result<Outcome, ModelError>>);

openraft::declare_raft_types!(
    /// The raft types of a metadata group.
    pub(crate) TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        // tokio, with boxed channel messages: 28 KB less per group (ADR 0114).
        AsyncRuntime = super::runtime::BoxedTokioRuntime,
);

pub(crate) type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub(crate) type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub(crate) type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub(crate) type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub(crate) type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// The state machine's snapshot data: the model's `snapshot()` bytes.
pub(crate) type SnapshotBytes = Vec<u8>;
pub(crate) type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotBytes>;
