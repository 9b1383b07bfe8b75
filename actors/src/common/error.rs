//! The crate's error types: [`BrokerError`] for starting and stopping a
//! broker, and [`MetadataError`] for the metadata plane. Both live in this
//! leaf module so every layer can name them without naming the others.

use std::path::PathBuf;

use malachi_cluster::group::GroupError;
use malachi_cluster::vnodes::RouteError;

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

/// Why the metadata plane could not serve a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata i/o error on {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("metadata snapshot in {path} is unreadable: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("the metadata plane is shut down")]
    Shutdown,
    #[error("the metadata plane is not open yet")]
    NotOpen,
    #[error("metadata group error: {reason}")]
    Group { reason: String, fatal: bool },
    /// No leader of the topic's vnode answered in time (an election, a
    /// partition): the request may be retried.
    #[error("metadata unavailable: {reason}")]
    Unavailable { reason: String },
    /// A change was proposed but its outcome is unknown (a leader change
    /// discarded it, or its commit was not seen in time): it may exist.
    #[error("metadata change outcome unknown: {reason}")]
    OutcomeUnknown { reason: String },
}

impl From<GroupError> for MetadataError {
    fn from(e: GroupError) -> MetadataError {
        match e {
            GroupError::Stopped => MetadataError::Shutdown,
            GroupError::Discarded { .. } => MetadataError::OutcomeUnknown {
                reason: e.to_string(),
            },
            other => MetadataError::Group {
                fatal: other.is_fatal(),
                reason: other.to_string(),
            },
        }
    }
}

impl From<RouteError> for MetadataError {
    fn from(e: RouteError) -> MetadataError {
        match e {
            RouteError::Stopped => MetadataError::Shutdown,
            RouteError::Unavailable { .. } => MetadataError::Unavailable {
                reason: e.to_string(),
            },
            RouteError::OutcomeUnknown { .. } => MetadataError::OutcomeUnknown {
                reason: e.to_string(),
            },
            RouteError::Unroutable | RouteError::Failed { .. } => MetadataError::Group {
                reason: e.to_string(),
                fatal: false,
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
}
