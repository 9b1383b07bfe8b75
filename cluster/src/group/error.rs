//! [`GroupError`] and the typed causes it carries.
//!
//! Each variant holds the facts (a path, an offset, a node id) and the
//! error underneath as a `#[source]`, never a preformatted string, so a
//! caller matches on what happened and a log shows the whole chain.
//! openraft's errors stay behind opaque wrappers ([`RaftFault`]): none of
//! its types crosses the group's public API (see the module doc of
//! `group`). Foreign errors that are not `Clone` are shared through an
//! `Arc`, because a group error is cloned into every waiter of a request.
//! Messages are lowercase and stable: clients and operators read them.

use super::fsio::TaggedError;
use super::types::TypeConfig;
use malachi_core::model::SnapshotError;
use malachi_core::ring::{RingError, VnodeId};
use openraft::errors::{
    ClientWriteError, Fatal, InitializeError, LinearizableReadError, RaftError,
};
use std::path::PathBuf;
use std::sync::Arc;

/// Why a group operation failed. The model's own refusals are not here:
/// `propose` returns them as its inner `Err`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GroupError {
    /// The group's files could not be read or written while opening.
    #[error("storage i/o on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A group file is damaged in a way recovery must not paper over.
    #[error("storage corrupt: {path} at byte {offset}: {problem}")]
    Storage {
        path: PathBuf,
        offset: u64,
        #[source]
        problem: Corruption,
    },
    /// This replica is not the leader; `leader` is the one it knows of.
    #[error("not the leader; the leader is {leader:?}")]
    NotLeader { leader: Option<u64> },
    /// The entry was discarded by a leader change after it was appended: it
    /// may or may not commit, so a retry must be deduplicated.
    #[error("the proposal was discarded by a leader change; its outcome is unknown")]
    Discarded { leader: Option<u64> },
    /// The operation did not finish within its bound (`open_timeout_ms` or
    /// `request_timeout_ms`). A timed-out proposal may still commit.
    #[error("timed out")]
    Timeout,
    /// The raft node stopped on an unrecoverable error (a storage error or a
    /// panic). The replica must be replaced, not restarted.
    #[error("the group is fatally stopped: {cause}")]
    Fatal {
        #[source]
        cause: FatalCause,
    },
    /// The group was shut down.
    #[error("the group is shut down")]
    Stopped,
    /// A message could not be encoded or decoded.
    #[error("codec: {source}")]
    Codec {
        #[source]
        source: CodecError,
    },
    /// The config is invalid, or the request does not fit this replica.
    #[error("invalid config: {problem}")]
    Config {
        #[source]
        problem: ConfigProblem,
    },
    /// Raft refused the request for a reason other than leadership.
    #[error("raft refused: {refusal}")]
    Raft {
        #[source]
        refusal: Refusal,
    },
}

impl GroupError {
    /// Whether this replica can no longer serve: its storage is damaged or
    /// raft stopped on an unrecoverable error. A supervisor must replace
    /// such a replica (decisions §2), not restart it in place.
    pub fn is_fatal(&self) -> bool {
        matches!(self, GroupError::Storage { .. } | GroupError::Fatal { .. })
    }

    pub(crate) fn config(problem: ConfigProblem) -> GroupError {
        GroupError::Config { problem }
    }

    pub(crate) fn refused(refusal: Refusal) -> GroupError {
        GroupError::Raft { refusal }
    }
}

/// What is wrong with a group file (the log, the vote or the snapshot).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Corruption {
    #[error("log header: {0}")]
    LogHeaderFrame(#[source] TaggedError),
    #[error("log header: {0}")]
    LogHeader(#[source] Arc<rmp_serde::decode::Error>),
    #[error("log belongs to group {found} not {expected}")]
    OtherGroup { found: u64, expected: u64 },
    #[error("undecodable entry: {0}")]
    Entry(#[source] Arc<rmp_serde::decode::Error>),
    #[error("entry index {found} where {expected} was expected")]
    IndexGap { found: u64, expected: u64 },
    #[error("entry checksum mismatch before the end of the log")]
    EntryChecksum,
    #[error("entry length {len} exceeds {entry_bytes_max}")]
    EntryTooLong { len: u64, entry_bytes_max: u64 },
    #[error("vote: {0}")]
    VoteFrame(#[source] TaggedError),
    #[error("vote: {0}")]
    Vote(#[source] Arc<rmp_serde::decode::Error>),
    #[error("snapshot: {0}")]
    SnapshotFrame(#[source] TaggedError),
    #[error("snapshot: {0}")]
    Snapshot(#[source] Arc<rmp_serde::decode::Error>),
    #[error("snapshot state: {0}")]
    SnapshotState(#[source] Arc<SnapshotError>),
}

/// Why a message did not encode or decode.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CodecError {
    #[error("{0}")]
    Decode(#[source] Arc<rmp_serde::decode::Error>),
    #[error("{0}")]
    Encode(#[source] Arc<rmp_serde::encode::Error>),
}

impl From<rmp_serde::decode::Error> for CodecError {
    fn from(e: rmp_serde::decode::Error) -> CodecError {
        CodecError::Decode(Arc::new(e))
    }
}

impl From<rmp_serde::encode::Error> for CodecError {
    fn from(e: rmp_serde::encode::Error) -> CodecError {
        CodecError::Encode(Arc::new(e))
    }
}

/// A config, or a request to open or close a replica, that cannot be met.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigProblem {
    /// openraft refused the settings the group derived from its config.
    #[error("{0}")]
    Raft(RaftFault),
    #[error("node {node} is not among the voters {voters:?} it initializes")]
    NotAmongVoters { node: u64, voters: Vec<u64> },
    #[error("a group keeps at least one voter")]
    NoVoters,
    #[error("node {node} is not among the cluster's nodes {nodes:?}")]
    NotAClusterNode { node: u64, nodes: Vec<u64> },
    #[error("{0}")]
    Ring(#[source] RingError),
    #[error("{0}")]
    Liveness(#[source] super::liveness::LivenessError),
    #[error("node {node} is not a voter of {vnode} ({voters:?})")]
    NotAVnodeVoter {
        node: u64,
        vnode: VnodeId,
        voters: Vec<u64>,
    },
    #[error("node {node} is a voter of {vnode} still")]
    StillAVoter { node: u64, vnode: VnodeId },
    #[error("node {node} leads {vnode}")]
    Leads { node: u64, vnode: VnodeId },
    #[error("cannot record that groups moved: {0}")]
    MovedNotRecorded(#[source] Arc<std::io::Error>),
    /// This broker's binary lacks what the cluster finalized (ADR 0134):
    /// a downgrade past finalize, refused at start.
    #[error("this broker cannot start in this cluster: {0}")]
    FeatureRefused(#[source] malachi_core::model::ModelError),
}

/// Why raft refused or could not run a request (not a leadership matter).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Raft(RaftFault),
    #[error("a normal entry was applied without a verdict")]
    NoVerdict,
    /// A blocking task the request ran on panicked or was cancelled.
    #[error("{0}")]
    Task(#[source] Arc<tokio::task::JoinError>),
    #[error("the replica's directory was not removed: {0}")]
    DirNotRemoved(#[source] Arc<std::io::Error>),
}

/// Why the group stopped for good.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FatalCause {
    #[error("{0}")]
    Raft(RaftFault),
    #[error("opening the group's files panicked: {0}")]
    OpenPanicked(#[source] Arc<tokio::task::JoinError>),
    #[error("raft task did not join: {0}")]
    NotJoined(#[source] Arc<tokio::task::JoinError>),
}

/// An error openraft returned, kept whole but opaque: openraft's types do
/// not cross the group's API, so callers see its message and source chain
/// only.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct RaftFault(Fault);

#[derive(Debug, Clone, thiserror::Error)]
enum Fault {
    #[error(transparent)]
    Fatal(Fatal<TypeConfig>),
    #[error(transparent)]
    Config(Arc<openraft::ConfigError>),
    #[error(transparent)]
    Initialize(InitializeError<TypeConfig>),
    #[error(transparent)]
    Write(ClientWriteError<TypeConfig>),
    #[error(transparent)]
    Read(LinearizableReadError<TypeConfig>),
    #[error(transparent)]
    Wait(Arc<openraft::metrics::WaitError>),
}

impl From<Fatal<TypeConfig>> for RaftFault {
    fn from(e: Fatal<TypeConfig>) -> RaftFault {
        RaftFault(Fault::Fatal(e))
    }
}

impl From<openraft::ConfigError> for RaftFault {
    fn from(e: openraft::ConfigError) -> RaftFault {
        RaftFault(Fault::Config(Arc::new(e)))
    }
}

impl From<InitializeError<TypeConfig>> for RaftFault {
    fn from(e: InitializeError<TypeConfig>) -> RaftFault {
        RaftFault(Fault::Initialize(e))
    }
}

impl From<ClientWriteError<TypeConfig>> for RaftFault {
    fn from(e: ClientWriteError<TypeConfig>) -> RaftFault {
        RaftFault(Fault::Write(e))
    }
}

impl From<LinearizableReadError<TypeConfig>> for RaftFault {
    fn from(e: LinearizableReadError<TypeConfig>) -> RaftFault {
        RaftFault(Fault::Read(e))
    }
}

impl From<openraft::metrics::WaitError> for RaftFault {
    fn from(e: openraft::metrics::WaitError) -> RaftFault {
        RaftFault(Fault::Wait(Arc::new(e)))
    }
}

/// The group error for raft's fatal stop: `Stopped` if it was shut down.
pub(crate) fn fatal_error(fatal: &Fatal<TypeConfig>) -> GroupError {
    match fatal {
        Fatal::Stopped => GroupError::Stopped,
        other => GroupError::Fatal {
            cause: FatalCause::Raft(other.clone().into()),
        },
    }
}

/// The group error of a refused `initialize`.
pub(crate) fn initialize_error(
    e: RaftError<TypeConfig, InitializeError<TypeConfig>>,
) -> GroupError {
    match e {
        RaftError::Fatal(f) => fatal_error(&f),
        RaftError::APIError(api) => GroupError::refused(Refusal::Raft(api.into())),
    }
}
