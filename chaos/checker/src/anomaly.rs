//! What the checker finds. Each anomaly names the line of the history that
//! shows it and enough context to start looking: the key and seq, the
//! consumer and its pass, the broker. The crate doc gives the exact rules.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// A violation of a guarantee, found in a history.
///
/// A consumer's passes are numbered from 0: pass 0 is its read from the
/// start, and each `resume` starts the next one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Anomaly {
    /// An acknowledged write that a final read from the start never saw.
    Lost {
        key: String,
        seq: u64,
        acked_ms: u64,
        acked_line: u64,
        /// Every final reader that missed it.
        missed_by: Vec<String>,
        /// The first `final_read` line that missed it.
        line: u64,
    },
    /// One record delivered twice within one pass of one consumer.
    Duplicate {
        consumer: String,
        pass: u32,
        key: String,
        seq: u64,
        line: u64,
        t_ms: u64,
    },
    /// A record that had to come before another of its key in the log
    /// (it was acknowledged before the other was sent) came after it in a
    /// pass, or never came although the pass went past it.
    OrderBroken {
        consumer: String,
        pass: u32,
        key: String,
        /// The record that had to come first.
        earlier_seq: u64,
        /// The record delivered ahead of it.
        later_seq: u64,
        /// True if it came late in the pass, false if it never came.
        earlier_delivered: bool,
        line: u64,
        t_ms: u64,
    },
    /// A delivered record whose value no `produce` sent under its key and
    /// seq.
    NeverWritten {
        consumer: String,
        key: String,
        seq: u64,
        value: String,
        /// True if the key and seq were sent, with another value.
        seq_was_written: bool,
        line: u64,
        t_ms: u64,
    },
    /// A record was delivered although its write definitely failed.
    ReadOfFailedWrite {
        consumer: String,
        key: String,
        seq: u64,
        read_line: u64,
        failed_line: u64,
        /// The later of the two lines: where the contradiction shows.
        line: u64,
    },
    /// After a resume, a record at or before the cursor was delivered again.
    CursorBackwards {
        consumer: String,
        pass: u32,
        cursor: String,
        key: String,
        /// The highest seq of this key read with that cursor.
        cursor_seq: u64,
        delivered_seq: u64,
        line: u64,
        t_ms: u64,
    },
    /// Full copies of a sealed segment differ over the sealed bytes.
    CopiesDiverge {
        topic: String,
        segment: u64,
        seal_len: u64,
        /// CRC-32 of the sealed bytes of each full copy, by broker.
        crc32_by_broker: BTreeMap<String, u32>,
        line: u64,
        t_ms: u64,
    },
    /// A copy of a sealed segment still short of the seal at the end of the
    /// run, when healing had every chance to refill it.
    ShortCopy {
        topic: String,
        segment: u64,
        broker: String,
        valid_len: u64,
        seal_len: u64,
        line: u64,
        t_ms: u64,
    },
    /// A final read reached the end of the log without records another
    /// final read delivered: the readers (one pinned to each broker, the
    /// fresh `final`, `live`) did not all see one log.
    ReadDiffersByBroker {
        /// The final reader that came up short.
        consumer: String,
        /// The broker it started at, for a reader pinned to one.
        broker: Option<String>,
        /// Records (key and seq) other final reads delivered and it did not.
        missing: u64,
        /// How many of them were acknowledged writes (each also `lost`).
        missing_acked: u64,
        /// A few of them, as `key:seq`, in key and seq order.
        examples: Vec<String>,
        /// The final readers that delivered at least one of them.
        seen_by: Vec<String>,
        /// Its `final_read` line.
        line: u64,
    },
    /// No acknowledged write within the bound after a heal.
    SlowRecovery {
        event: String,
        target: String,
        heal_line: u64,
        heal_ms: u64,
        /// Time to the first acknowledgement after the heal; `None` if none
        /// came before the history ended.
        recovery_ms: Option<u64>,
        bound_ms: u64,
    },
}

impl Anomaly {
    /// The line of the history that shows the anomaly.
    pub fn line(&self) -> u64 {
        match self {
            Anomaly::Lost { line, .. }
            | Anomaly::Duplicate { line, .. }
            | Anomaly::OrderBroken { line, .. }
            | Anomaly::NeverWritten { line, .. }
            | Anomaly::ReadOfFailedWrite { line, .. }
            | Anomaly::CursorBackwards { line, .. }
            | Anomaly::CopiesDiverge { line, .. }
            | Anomaly::ShortCopy { line, .. }
            | Anomaly::ReadDiffersByBroker { line, .. } => *line,
            Anomaly::SlowRecovery { heal_line, .. } => *heal_line,
        }
    }

    /// The anomaly's kind as it is spelled in the results file.
    pub fn kind(&self) -> &'static str {
        match self {
            Anomaly::Lost { .. } => "lost",
            Anomaly::Duplicate { .. } => "duplicate",
            Anomaly::OrderBroken { .. } => "order_broken",
            Anomaly::NeverWritten { .. } => "never_written",
            Anomaly::ReadOfFailedWrite { .. } => "read_of_failed_write",
            Anomaly::CursorBackwards { .. } => "cursor_backwards",
            Anomaly::CopiesDiverge { .. } => "copies_diverge",
            Anomaly::ShortCopy { .. } => "short_copy",
            Anomaly::ReadDiffersByBroker { .. } => "read_differs_by_broker",
            Anomaly::SlowRecovery { .. } => "slow_recovery",
        }
    }

    /// One sentence that says what went wrong, without the kind.
    pub fn detail(&self) -> String {
        match self {
            Anomaly::Lost {
                key,
                seq,
                acked_ms,
                acked_line,
                missed_by,
                ..
            } => format!(
                "key {key:?} seq {seq}, acknowledged at {acked_ms} ms (line {acked_line}), \
                 is missing from the final read of {}",
                missed_by.join(", ")
            ),
            Anomaly::Duplicate {
                consumer,
                pass,
                key,
                seq,
                ..
            } => format!("{consumer} pass {pass} was delivered key {key:?} seq {seq} twice"),
            Anomaly::OrderBroken {
                consumer,
                pass,
                key,
                earlier_seq,
                later_seq,
                earlier_delivered,
                ..
            } => {
                let when = if *earlier_delivered {
                    "only after it"
                } else {
                    "never"
                };
                format!(
                    "{consumer} pass {pass} was delivered key {key:?} seq {later_seq}, \
                     and seq {earlier_seq}, acknowledged before it was sent, {when}"
                )
            }
            Anomaly::NeverWritten {
                consumer,
                key,
                seq,
                value,
                seq_was_written,
                ..
            } => {
                let why = if *seq_was_written {
                    "that seq was sent with another value"
                } else {
                    "that seq was never sent"
                };
                format!("{consumer} was delivered key {key:?} seq {seq} value {value:?}: {why}")
            }
            Anomaly::ReadOfFailedWrite {
                consumer,
                key,
                seq,
                read_line,
                failed_line,
                ..
            } => format!(
                "{consumer} was delivered key {key:?} seq {seq} (line {read_line}), \
                 whose write failed (line {failed_line})"
            ),
            Anomaly::CursorBackwards {
                consumer,
                pass,
                cursor,
                key,
                cursor_seq,
                delivered_seq,
                ..
            } => format!(
                "{consumer} pass {pass} resumed from cursor {cursor:?}, read after key {key:?} \
                 seq {cursor_seq}, and was delivered seq {delivered_seq} again"
            ),
            Anomaly::CopiesDiverge {
                topic,
                segment,
                seal_len,
                crc32_by_broker,
                ..
            } => {
                let crcs: Vec<String> = crc32_by_broker
                    .iter()
                    .map(|(broker, crc)| format!("{broker} {crc:08x}"))
                    .collect();
                format!(
                    "topic {topic:?} segment {segment}: the first {seal_len} bytes differ ({})",
                    crcs.join(", ")
                )
            }
            Anomaly::ShortCopy {
                topic,
                segment,
                broker,
                valid_len,
                seal_len,
                ..
            } => format!(
                "topic {topic:?} segment {segment}: {broker}'s copy holds {valid_len} valid \
                 bytes of {seal_len} sealed"
            ),
            Anomaly::ReadDiffersByBroker {
                consumer,
                broker,
                missing,
                missing_acked,
                examples,
                seen_by,
                ..
            } => {
                let started = broker
                    .as_ref()
                    .map_or(String::new(), |b| format!(" (started at {b})"));
                format!(
                    "{consumer}{started} reached the end of the log without {missing} records \
                     ({missing_acked} acknowledged) that {} delivered, e.g. {}",
                    seen_by.join(", "),
                    examples.join(", ")
                )
            }
            Anomaly::SlowRecovery {
                event,
                target,
                heal_ms,
                recovery_ms,
                bound_ms,
                ..
            } => match recovery_ms {
                Some(ms) => format!(
                    "after the heal of {event} on {target} at {heal_ms} ms, the first \
                     acknowledgement took {ms} ms (bound {bound_ms} ms)"
                ),
                None => format!(
                    "after the heal of {event} on {target} at {heal_ms} ms, no write was \
                     acknowledged (bound {bound_ms} ms)"
                ),
            },
        }
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}: {}: {}",
            self.line(),
            self.kind(),
            self.detail()
        )
    }
}
