//! The crate's error types: [`BrokerError`] for starting and stopping a
//! broker, and [`MetadataError`] for the metadata plane (and, with the
//! `testing` feature, `HookError` for the test hooks' calls to peers). Both live in this
//! leaf module so every layer can name them without naming the others.

use std::path::PathBuf;
use std::sync::Arc;

use malachi_cluster::group::GroupError;
use malachi_cluster::vnodes::RouteError;
use malachi_core::model::SnapshotError;

/// Why a broker could not start or stop cleanly. Messages are lowercase.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid configuration: {reason}")]
    Config { reason: String },
    /// The cluster's cursor key could not be rotated (ADR 0096).
    #[error("the cursor key was not rotated: {reason}")]
    CursorKeyRotation { reason: String },
    #[error("cannot bind {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage error: {0}")]
    Storage(#[from] malachi_storage::StorageError),
    #[error("metadata error: {0}")]
    Metadata(#[from] MetadataError),
    #[error("supervision error: {0}")]
    Supervision(#[from] malachi_supervision::SupervisionError),
    #[error("cursor secret in {path} is unusable: {reason}")]
    Secret { path: PathBuf, reason: String },
    #[error("the broker's supervision tree failed")]
    TreeFailed,
    #[error("signal handling failed: {0}")]
    Signal(std::io::Error),
}

/// Why a test hook's call to a peer broker brought no answer.
#[cfg(feature = "testing")]
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no node fabric")]
    NoFabric,
    #[error("no cluster port")]
    NoClusterPort,
    /// The node fabric did not carry the call (its error, kept whole).
    #[error(transparent)]
    Fabric(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error(transparent)]
    Port(#[from] malachi_cluster::group::TransportError),
}

/// Why the metadata plane could not serve a request. The cluster's error
/// is kept whole as the `#[source]`; [`MetadataError::error_code`] is the
/// one place it becomes a wire code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("metadata snapshot in {path} is unreadable: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: Arc<SnapshotError>,
    },
    #[error("the metadata plane is shut down")]
    Shutdown,
    #[error("the metadata plane is not open yet")]
    NotOpen,
    #[error("metadata group error: {source}")]
    Group {
        #[source]
        source: PlaneFault,
    },
    /// No leader of the topic's vnode answered in time (an election, a
    /// partition): the request may be retried.
    #[error("metadata unavailable: {source}")]
    Unavailable {
        #[source]
        source: RouteError,
    },
    /// A change was proposed but its outcome is unknown (a leader change
    /// discarded it, or its commit was not seen in time): it may exist.
    #[error("metadata change outcome unknown: {source}")]
    OutcomeUnknown {
        #[source]
        source: PlaneFault,
    },
}

/// The cluster error under a [`MetadataError`]: a group's (the file
/// backend and a local replica) or a routed request's.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlaneFault {
    #[error(transparent)]
    Group(GroupError),
    #[error(transparent)]
    Route(RouteError),
}

impl From<GroupError> for MetadataError {
    fn from(e: GroupError) -> MetadataError {
        match e {
            GroupError::Stopped => MetadataError::Shutdown,
            GroupError::Discarded { .. } => MetadataError::OutcomeUnknown {
                source: PlaneFault::Group(e),
            },
            other => MetadataError::Group {
                source: PlaneFault::Group(other),
            },
        }
    }
}

impl From<RouteError> for MetadataError {
    fn from(e: RouteError) -> MetadataError {
        match e {
            RouteError::Stopped => MetadataError::Shutdown,
            RouteError::Unavailable { .. } => MetadataError::Unavailable { source: e },
            RouteError::OutcomeUnknown { .. } => MetadataError::OutcomeUnknown {
                source: PlaneFault::Route(e),
            },
            RouteError::Unroutable | RouteError::Failed { .. } => MetadataError::Group {
                source: PlaneFault::Route(e),
            },
        }
    }
}

impl MetadataError {
    /// The wire error a client gets for this failure.
    pub fn error_code(&self) -> malachi_wire::error::ErrorCode {
        use malachi_wire::error::ErrorCode;
        match self {
            MetadataError::Shutdown | MetadataError::NotOpen => ErrorCode::ShuttingDown,
            MetadataError::Unavailable { .. } => ErrorCode::NoQuorum,
            MetadataError::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
            MetadataError::Io { .. }
            | MetadataError::Corrupt { .. }
            | MetadataError::Group { .. } => ErrorCode::UnknownServerError,
        }
    }

    /// Whether the replica behind this error can no longer serve (its
    /// storage is damaged, or raft stopped for good).
    pub fn is_fatal(&self) -> bool {
        matches!(self, MetadataError::Group { source: PlaneFault::Group(g) } if g.is_fatal())
    }
}
