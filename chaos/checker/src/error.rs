//! The crate's one error type: a history the checker cannot judge. Every
//! variant about the history names the line (1-based) it found the fault on.

use std::io;
use std::path::PathBuf;

/// Why a history could not be judged (exit code 3 from the binary).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The history file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading a line failed (including a line that is not UTF-8).
    #[error("line {line}: cannot read: {source}")]
    Read {
        line: u64,
        #[source]
        source: io::Error,
    },
    /// A line is not one event: bad JSON, an unknown kind, a missing field.
    #[error("line {line}: malformed event: {source}")]
    Malformed {
        line: u64,
        #[source]
        source: serde_json::Error,
    },
    /// Lines must be in the order things happened.
    #[error("line {line}: t_ms {t_ms} is earlier than the previous event's {previous_ms}")]
    TimeBackwards {
        line: u64,
        t_ms: u64,
        previous_ms: u64,
    },
    /// A key's writes are sent once each with increasing seqs.
    #[error("line {line}: key {key:?} sends seq {seq} after seq {previous_seq}")]
    SeqNotIncreasing {
        line: u64,
        key: String,
        seq: u64,
        previous_seq: u64,
    },
    /// An outcome names a write no `produce` line sent.
    #[error("line {line}: {kind} of key {key:?} seq {seq}, which was never sent")]
    OutcomeWithoutSend {
        line: u64,
        kind: &'static str,
        key: String,
        seq: u64,
    },
    /// A write has at most one outcome.
    #[error("line {line}: a second outcome ({kind}) of key {key:?} seq {seq}")]
    SecondOutcome {
        line: u64,
        kind: &'static str,
        key: String,
        seq: u64,
    },
    /// `produce_ok` must name the value its `produce` sent.
    #[error(
        "line {line}: produce_ok of key {key:?} seq {seq} names value {value:?}, not the one sent"
    )]
    AckedValueDiffers {
        line: u64,
        key: String,
        seq: u64,
        value: String,
    },
    /// After `final_read` a consumer reads again only after a `resume`.
    #[error("line {line}: consumer {consumer:?} reads after its final_read without a resume")]
    ReadAfterFinal { line: u64, consumer: String },
    /// A consumer's read from the start finishes once.
    #[error(
        "line {line}: final_read of consumer {consumer:?}, whose read from the start already finished"
    )]
    FinalReadAgain { line: u64, consumer: String },
    /// Lost writes are judged only on a pass that began at the start.
    #[error("line {line}: final_read of consumer {consumer:?}, whose pass began at a resume")]
    FinalReadAfterResume { line: u64, consumer: String },
    /// A heal with no open fault of its kind.
    #[error("line {line}: heal of {event:?} with no {event:?} nemesis open")]
    HealWithoutNemesis { line: u64, event: String },
    /// A reconvergence with no heal of its kind waiting for one.
    #[error("line {line}: reconverged after {event:?} with no heal of it waiting")]
    ReconvergedWithoutHeal { line: u64, event: String },
    /// A `copies` event must list every copy, a missing one with
    /// `valid_len` 0.
    #[error("line {line}: copies of segment {segment} of topic {topic:?} list no copy")]
    NoCopies {
        line: u64,
        topic: String,
        segment: u64,
    },
    /// The results file could not be written.
    #[error("cannot write {path}: {source}")]
    WriteResults {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}
