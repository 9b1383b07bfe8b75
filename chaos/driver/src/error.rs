//! The driver's one error type.

use std::path::PathBuf;

/// What ends a run early.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot create the history file {path}: {source}")]
    History {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the history: {0}")]
    HistoryWrite(String),
    #[error("no broker answered within {waited_ms}ms: {last}")]
    NoBroker { waited_ms: u64, last: String },
    #[error("cannot create topic {topic}: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("a control line cannot be used: {0}")]
    Control(String),
    #[error("cannot use {path} ({what}): {reason}")]
    Credentials {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
}
