//! The events of a history, one JSON object per line. The crate doc gives the
//! meaning of every field; this module only says how they are spelled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One line of a history. Every variant carries `t_ms`, the harness's
/// monotonic clock in milliseconds since the run started.
///
/// Fields the checker does not know are ignored, so a harness may log more
/// (a topic, a broker address) without breaking older checkers; a missing
/// field or an unknown `kind` makes the line malformed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A producer sent a write (the invocation; its outcome follows).
    Produce {
        t_ms: u64,
        client: String,
        key: String,
        seq: u64,
        value: String,
    },
    /// The write was acknowledged: it is durable and must never be lost.
    ProduceOk {
        t_ms: u64,
        client: String,
        key: String,
        seq: u64,
        value: String,
    },
    /// The write definitely did not happen (an error that guarantees it was
    /// not applied).
    ProduceFail {
        t_ms: u64,
        client: String,
        key: String,
        seq: u64,
        error: String,
    },
    /// The outcome is unknown (a timeout, a dropped connection): the write
    /// may or may not have landed.
    ProduceUnknown {
        t_ms: u64,
        client: String,
        key: String,
        seq: u64,
        error: String,
    },
    /// A consumer was delivered a record.
    Read {
        t_ms: u64,
        consumer: String,
        key: String,
        seq: u64,
        value: String,
        /// The opaque cursor the broker returned after this record.
        cursor: String,
    },
    /// A consumer restarts from a cursor it saved earlier: a new pass.
    Resume {
        t_ms: u64,
        consumer: String,
        cursor: String,
    },
    /// The consumer's read from the start reached the end of the log.
    FinalRead {
        t_ms: u64,
        consumer: String,
        /// The broker the reader started at (its only bootstrap address),
        /// for a reader pinned to one broker; absent for the others.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        broker: Option<String>,
    },
    /// The end-of-run look at every copy of one sealed segment.
    Copies {
        t_ms: u64,
        topic: String,
        segment: u64,
        /// The sealed length in bytes.
        seal_len: u64,
        /// Each broker's copy, by broker name.
        digests: BTreeMap<String, CopyDigest>,
    },
    /// A fault starts.
    Nemesis {
        t_ms: u64,
        /// The fault's kind, e.g. `kill`, `pause`, `partition`.
        event: String,
        /// What it hits, e.g. a broker name.
        target: String,
        #[serde(default)]
        detail: String,
    },
    /// The oldest open fault of this kind is healed.
    Heal { t_ms: u64, event: String },
    /// The cluster reconverged after the oldest waiting heal of this kind.
    Reconverged { t_ms: u64, event: String },
}

/// One copy of a sealed segment as the harness measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyDigest {
    /// How many bytes from the start of the copy hold valid frames.
    pub valid_len: u64,
    /// CRC-32 (IEEE) over the first `min(valid_len, seal_len)` bytes.
    pub crc32: u32,
}

impl Event {
    /// The harness's clock when the event happened.
    pub fn t_ms(&self) -> u64 {
        match self {
            Event::Produce { t_ms, .. }
            | Event::ProduceOk { t_ms, .. }
            | Event::ProduceFail { t_ms, .. }
            | Event::ProduceUnknown { t_ms, .. }
            | Event::Read { t_ms, .. }
            | Event::Resume { t_ms, .. }
            | Event::FinalRead { t_ms, .. }
            | Event::Copies { t_ms, .. }
            | Event::Nemesis { t_ms, .. }
            | Event::Heal { t_ms, .. }
            | Event::Reconverged { t_ms, .. } => *t_ms,
        }
    }
}
