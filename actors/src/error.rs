//! The crate's error type, for starting and stopping a broker.

use std::path::PathBuf;

/// Why a broker could not start or stop cleanly. Messages are lowercase.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid configuration: {reason}")]
    Config { reason: String },
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
    Metadata(#[from] crate::metadata::MetadataError),
    #[error("supervision error: {0}")]
    Supervision(#[from] malachi_supervision::SupervisionError),
    #[error("cursor secret in {path} is unusable: {reason}")]
    Secret { path: PathBuf, reason: String },
    #[error("the broker's supervision tree failed")]
    TreeFailed,
    #[error("signal handling failed: {0}")]
    Signal(std::io::Error),
}
