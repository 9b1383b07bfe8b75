//! Counters of the run, for the runner's progress lines and the results:
//! what the history holds, and what it cannot hold (client errors, which
//! have no kind in the checker's format).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use malachi_wire::ClientError;
use serde_json::{Value, json};

/// Counters shared by every task of the run.
#[derive(Debug, Default)]
pub struct Stats {
    pub produced: AtomicU64,
    pub acked: AtomicU64,
    pub unknown: AtomicU64,
    pub failed: AtomicU64,
    /// Producer sessions opened (one per producer, plus one per failure).
    pub sessions: AtomicU64,
    pub resumes: AtomicU64,
    /// Fetches answered `data_loss`: the broker says records are gone.
    pub data_loss: AtomicU64,
    /// Records delivered, per consumer.
    reads: Mutex<BTreeMap<String, u64>>,
    /// Client errors, per `component:kind` (bounded: a few components times
    /// the error codes and kinds).
    errors: Mutex<BTreeMap<String, u64>>,
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, key: &str, n: u64) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    *map.entry(key.to_owned()).or_insert(0) += n;
}

fn snapshot(map: &Mutex<BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    map.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

impl Stats {
    pub fn read(&self, consumer: &str, n: u64) {
        bump(&self.reads, consumer, n);
    }

    pub fn error(&self, component: &str, error: &ClientError) {
        bump(
            &self.errors,
            &format!("{component}:{}", error_kind(error)),
            1,
        );
    }

    pub fn to_json(&self) -> Value {
        json!({
            "produced": self.produced.load(Ordering::Relaxed),
            "acked": self.acked.load(Ordering::Relaxed),
            "unknown": self.unknown.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "producer_sessions": self.sessions.load(Ordering::Relaxed),
            "resumes": self.resumes.load(Ordering::Relaxed),
            "data_loss_errors": self.data_loss.load(Ordering::Relaxed),
            "reads": snapshot(&self.reads),
            "errors": snapshot(&self.errors),
        })
    }
}

/// A short, bounded name for an error: the broker's code, or what the
/// client saw.
pub fn error_kind(error: &ClientError) -> &'static str {
    if let Some(code) = error.code() {
        return code.name();
    }
    match error {
        ClientError::Timeout { .. } => "client_timeout",
        ClientError::Connect { .. } | ClientError::ConnectTimeout { .. } => "connect",
        ClientError::ConnectionClosed { .. } => "connection_closed",
        ClientError::ProduceFailed { .. } => "produce_failed",
        ClientError::TooManyConnections { .. } => "too_many_connections",
        ClientError::Cancelled { .. } => "cancelled",
        ClientError::Wire(_) => "wire",
        _ => "other",
    }
}
