//! The checker's verdict on a run: what the run did, what went wrong, and
//! whether it did enough for a clean result to mean anything. It is written
//! as `chaos/results/<run>.json` and printed as a summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::anomaly::Anomaly;
use crate::error::CheckError;

/// Default for [`Config::min_acked`].
pub const MIN_ACKED_DEFAULT: u64 = 1000;
/// Default for [`Config::min_events`].
pub const MIN_EVENTS_DEFAULT: u64 = 1;
/// Default for [`Config::recovery_bound_ms`].
pub const RECOVERY_BOUND_MS_DEFAULT: u64 = 30_000;

/// The gates and bounds a history is judged against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    /// Fewer acknowledged writes than this makes the run vacuous.
    pub min_acked: u64,
    /// Fewer nemesis events than this makes the run vacuous.
    pub min_events: u64,
    /// The longest a heal may be followed by no acknowledged write.
    pub recovery_bound_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            min_acked: MIN_ACKED_DEFAULT,
            min_events: MIN_EVENTS_DEFAULT,
            recovery_bound_ms: RECOVERY_BOUND_MS_DEFAULT,
        }
    }
}

/// The outcome of a check. Anomalies outrank vacuity: a run that found a bug
/// is anomalous however little it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No anomaly, and the run did enough to mean it.
    Clean,
    /// At least one anomaly.
    Anomalous,
    /// No anomaly, but the run did too little to certify anything.
    Vacuous,
}

impl Verdict {
    /// The binary's exit code: 0 clean, 1 anomalous, 2 vacuous (3 is a
    /// history that could not be judged).
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Clean => 0,
            Verdict::Anomalous => 1,
            Verdict::Vacuous => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Anomalous => "anomalous",
            Verdict::Vacuous => "vacuous",
        }
    }
}

/// Why a run without anomalies still certifies nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Vacuity {
    /// Too few writes were acknowledged for their survival to mean much.
    TooFewAcknowledged { acknowledged: u64, min_acked: u64 },
    /// Too few faults were injected.
    TooFewEvents { events: u64, min_events: u64 },
    /// No consumer finished a read from the start, so lost writes could not
    /// be judged at all.
    NoFinalRead,
}

impl Vacuity {
    fn detail(&self) -> String {
        match self {
            Vacuity::TooFewAcknowledged {
                acknowledged,
                min_acked,
            } => format!("{acknowledged} writes acknowledged, fewer than the {min_acked} required"),
            Vacuity::TooFewEvents { events, min_events } => {
                format!("{events} nemesis events, fewer than the {min_events} required")
            }
            Vacuity::NoFinalRead => {
                "no final_read: no read from the start judged lost writes".to_owned()
            }
        }
    }
}

/// Writes by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WriteCounts {
    pub sent: u64,
    pub acknowledged: u64,
    pub failed: u64,
    pub unknown: u64,
    /// Sent with no outcome by the end of the history (as good as unknown).
    pub in_flight: u64,
}

/// A consumer's finished read from the start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinalRead {
    pub consumer: String,
    /// The broker the reader started at, for a reader pinned to one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<String>,
    /// The `final_read` line.
    pub line: u64,
    /// Records delivered in that pass.
    pub records: u64,
}

/// One heal and how long the cluster took to come back after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovery {
    pub event: String,
    pub target: String,
    pub nemesis_ms: u64,
    pub heal_ms: u64,
    pub heal_line: u64,
    /// Heal to the first acknowledged write after it; `None` if none came.
    pub recovery_ms: Option<u64>,
    /// Heal to the matching `reconverged`, when the harness logged one.
    pub reconverged_ms: Option<u64>,
}

/// Everything the checker concluded about one history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub verdict: Verdict,
    /// Lines read, blank ones included.
    pub lines: u64,
    pub config: Config,
    pub writes: WriteCounts,
    /// Deliveries to consumers, every pass counted.
    pub records_read: u64,
    /// Consumer passes: each consumer's read from the start, and each resume.
    pub passes: u64,
    /// Resumes from a cursor no read carried: such a pass has no floor, so
    /// its cursor could not be judged.
    pub resumes_from_unknown_cursor: u64,
    pub final_reads: Vec<FinalRead>,
    /// `copies` events judged.
    pub copies_checked: u64,
    /// Nemesis events by kind.
    pub nemesis_events: BTreeMap<String, u64>,
    pub recoveries: Vec<Recovery>,
    /// Why the run is vacuous; empty if it is not.
    pub vacuity: Vec<Vacuity>,
    /// Anomalies by kind.
    pub anomaly_counts: BTreeMap<String, u64>,
    /// Every anomaly, in the order of the lines that show them.
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // Every field is a plain string, number, map with string keys or
        // list, so serializing cannot fail; should it ever, say so in the
        // output rather than panic.
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
    }

    /// Writes the report as JSON to `path`, creating its directory.
    pub fn write_json(&self, path: &Path) -> Result<(), CheckError> {
        let failed = |source| CheckError::WriteResults {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        let mut text = self.to_json();
        text.push('\n');
        std::fs::write(path, text).map_err(failed)
    }

    /// The summary a person reads: plain text in aligned columns.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let verdict = match self.verdict {
            Verdict::Anomalous => {
                let n = self.anomalies.len();
                format!("anomalous ({n} {})", plural(n, "anomaly", "anomalies"))
            }
            other => other.name().to_owned(),
        };
        let _ = writeln!(out, "verdict: {verdict}");
        for reason in &self.vacuity {
            let _ = writeln!(out, "vacuous: {}", reason.detail());
        }

        out.push('\n');
        let nemesis_total: u64 = self.nemesis_events.values().sum();
        let measures: Vec<(&str, u64)> = vec![
            ("history lines", self.lines),
            ("writes sent", self.writes.sent),
            ("records acknowledged", self.writes.acknowledged),
            ("writes failed", self.writes.failed),
            ("writes unknown", self.writes.unknown),
            ("writes in flight at end", self.writes.in_flight),
            ("records read", self.records_read),
            ("consumer passes", self.passes),
            ("final reads", self.final_reads.len() as u64),
            ("copies checked", self.copies_checked),
            ("nemesis events", nemesis_total),
        ];
        out.push_str(&table(
            &["measure", "value"],
            measures
                .into_iter()
                .map(|(name, value)| vec![name.to_owned(), value.to_string()])
                .collect(),
        ));

        out.push('\n');
        if self.nemesis_events.is_empty() {
            out.push_str("no nemesis events\n");
        } else {
            out.push_str(&table(
                &["nemesis event", "count"],
                self.nemesis_events
                    .iter()
                    .map(|(event, count)| vec![event.clone(), count.to_string()])
                    .collect(),
            ));
        }

        out.push('\n');
        if self.recoveries.is_empty() {
            out.push_str("no heals\n");
        } else {
            let optional =
                |ms: Option<u64>, none: &str| ms.map_or(none.to_owned(), |ms| ms.to_string());
            out.push_str(&table(
                &[
                    "heal",
                    "event",
                    "target",
                    "heal at ms",
                    "recovery ms",
                    "reconverged ms",
                ],
                self.recoveries
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        vec![
                            (i + 1).to_string(),
                            r.event.clone(),
                            r.target.clone(),
                            r.heal_ms.to_string(),
                            optional(r.recovery_ms, "never"),
                            optional(r.reconverged_ms, "-"),
                        ]
                    })
                    .collect(),
            ));
        }

        out.push('\n');
        if self.anomalies.is_empty() {
            out.push_str("no anomalies\n");
        } else {
            out.push_str(&table(
                &["anomaly", "count"],
                self.anomaly_counts
                    .iter()
                    .map(|(kind, count)| vec![kind.clone(), count.to_string()])
                    .collect(),
            ));
            out.push('\n');
            out.push_str(&table(
                &["line", "anomaly", "detail"],
                self.anomalies
                    .iter()
                    .map(|a| vec![a.line().to_string(), a.kind().to_owned(), a.detail()])
                    .collect(),
            ));
        }
        out
    }
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

/// Left-aligned columns two spaces apart; the last column is not padded, so
/// no line ends in spaces.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
