//! Scrub verdicts (ADR 0110): what this broker last found when it re-read a
//! sealed copy it holds against the seal the metadata recorded.
//!
//! Coordinators ask (replica-status with `scrub`, api key 105) about the
//! sealed copies of their topics; [`verdicts`] answers from the
//! [`ScrubBook`] and queues every copy it has no fresh verdict of for the
//! broker's `maintenance/scrubber`, which reads it (every frame's CRC, the
//! records and bytes against the seal) at a bounded rate and records the
//! verdict with [`judge`]. A broken verdict stays until the copy is
//! rebuilt; an intact one is trusted for `cluster.scrub_interval_ms`.
//!
//! The store knows segments by id only, not by topic: the metadata's
//! owner asks, so this module needs no metadata.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use malachi_storage::{SegmentStore, StorageError, VerifyReport};
use malachi_wire::replica_status::{ScrubSeal, ScrubVerdict};

use super::storage::Storage;

/// Copies waiting for the scrubber at most; a copy asked about while the
/// queue is full stays `pending` and is queued on a later ask.
pub(crate) const SCRUB_QUEUE_MAX: usize = 4_096;
/// The rate at which the scrubber re-reads copies, so producers and
/// consumers keep most of the disk.
pub(crate) const SCRUB_BYTES_PER_SECOND: u64 = 32 << 20;

/// The scrubber's finding about one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Intact,
    /// A bad frame inside the sealed bytes, or a copy quarantined at open.
    Damaged(String),
    /// No log file.
    Missing,
    /// Fewer records or bytes than the seal.
    Short {
        records: u64,
        bytes: u64,
    },
}

impl Verdict {
    pub(crate) fn is_broken(&self) -> bool {
        !matches!(self, Verdict::Intact)
    }

    fn wire(&self, segment: u64) -> ScrubVerdict {
        let (verdict, detail) = match self {
            Verdict::Intact => ("intact", String::new()),
            Verdict::Damaged(why) => ("damaged", why.clone()),
            Verdict::Missing => ("missing", "no log file".to_string()),
            Verdict::Short { records, bytes } => {
                ("short", format!("{records} records in {bytes} bytes"))
            }
        };
        ScrubVerdict {
            segment,
            verdict: verdict.to_string(),
            detail,
        }
    }
}

/// The verdict on a copy from a read-only scan of it (`report`, or the
/// error the scan met) against its recorded seal. Damage past the seal's
/// bytes (an overrun's torn tail, padding) is the settling's, not a
/// scrub's: the sealed records are what must be intact.
pub(crate) fn judge(report: Result<&VerifyReport, &StorageError>, seal: ScrubSeal) -> Verdict {
    let report = match report {
        Ok(report) => report,
        Err(StorageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Verdict::Missing;
        }
        Err(e) => return Verdict::Damaged(format!("cannot read the copy: {e}")),
    };
    if let Some(bad) = report.first_bad
        && bad.position < seal.bytes
    {
        return Verdict::Damaged(format!(
            "a bad frame at byte {} (offset {}): {}",
            bad.position, bad.offset, bad.error
        ));
    }
    if report.records < seal.length || report.valid_bytes < seal.bytes {
        return Verdict::Short {
            records: report.records,
            bytes: report.valid_bytes,
        };
    }
    Verdict::Intact
}

#[derive(Debug)]
struct Found {
    seal: ScrubSeal,
    verdict: Verdict,
    at: Instant,
    /// When a coordinator last asked: a verdict nobody asks about any more
    /// (its segment deleted, its copy moved) is forgotten.
    asked: Instant,
}

/// The verdicts found and the copies waiting for the scrubber.
#[derive(Debug, Default)]
pub(crate) struct ScrubBook {
    found: HashMap<u64, Found>,
    queue: VecDeque<ScrubSeal>,
}

impl ScrubBook {
    /// The verdict on `seal`'s copy as of `now`, queuing it when there is
    /// none fresh: `None` means pending.
    fn ask(&mut self, seal: ScrubSeal, now: Instant, fresh_for: Duration) -> Option<Verdict> {
        if let Some(found) = self.found.get_mut(&seal.segment)
            && found.seal == seal
            && (found.verdict.is_broken() || now.duration_since(found.at) < fresh_for)
        {
            found.asked = now;
            return Some(found.verdict.clone());
        }
        if self.queue.len() < SCRUB_QUEUE_MAX
            && !self.queue.iter().any(|q| q.segment == seal.segment)
        {
            self.queue.push_back(seal);
        }
        None
    }

    /// The next copy to read.
    pub(crate) fn next(&mut self) -> Option<ScrubSeal> {
        self.queue.pop_front()
    }

    pub(crate) fn record(&mut self, seal: ScrubSeal, verdict: Verdict, now: Instant) {
        self.found.insert(
            seal.segment,
            Found {
                seal,
                verdict,
                at: now,
                asked: now,
            },
        );
    }

    /// Forgets the verdicts nobody asked about for `unasked_for`, so the
    /// book holds what coordinators still ask about, not every copy ever
    /// scrubbed.
    pub(crate) fn prune(&mut self, now: Instant, unasked_for: Duration) {
        self.found
            .retain(|_, f| now.duration_since(f.asked) < unasked_for);
    }

    #[cfg(test)]
    pub(crate) fn known(&self) -> usize {
        self.found.len()
    }

    /// The copies with a verdict, by its word (`intact`, `damaged`,
    /// `missing`, `short`).
    pub(crate) fn counts(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let mut counts = std::collections::BTreeMap::new();
        for found in self.found.values() {
            let word = match found.verdict {
                Verdict::Intact => "intact",
                Verdict::Damaged(_) => "damaged",
                Verdict::Missing => "missing",
                Verdict::Short { .. } => "short",
            };
            *counts.entry(word).or_insert(0) += 1;
        }
        counts
    }

    /// Whether the last verdict on `segment`'s copy found it broken.
    pub(crate) fn is_broken(&self, segment: u64) -> bool {
        self.found
            .get(&segment)
            .is_some_and(|f| f.verdict.is_broken())
    }

    /// Forgets the verdict on `segment`'s copy: it is being rebuilt.
    pub(crate) fn forget(&mut self, segment: u64) {
        self.found.remove(&segment);
    }

    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// Answers a coordinator's scrub ask: one verdict per seal, in order;
/// copies without a fresh verdict are queued and answered `pending`.
pub(crate) fn verdicts(storage: &Storage, seals: &[ScrubSeal]) -> Vec<ScrubVerdict> {
    if seals.is_empty() {
        return Vec::new();
    }
    let fresh_for = Duration::from_millis(storage.config.cluster.scrub_interval_ms);
    let now = Instant::now();
    let out: Vec<ScrubVerdict> = {
        let mut book = storage.scrub.book.lock();
        seals
            .iter()
            .map(|seal| match book.ask(*seal, now, fresh_for) {
                Some(verdict) => verdict.wire(seal.segment),
                None => ScrubVerdict {
                    segment: seal.segment,
                    verdict: "pending".to_string(),
                    detail: String::new(),
                },
            })
            .collect()
    };
    storage.scrub.wake.notify_one();
    out
}

/// Reads one copy and judges it. A copy open and latched failed, or with
/// records lost, is damaged whatever its bytes say now.
///
/// The third figure counts the copy's index entries that do not point at
/// the frame they name (the index is derived: a bad one is rebuilt
/// locally, never a reason to rebuild the copy).
pub(crate) fn scrub_one(storage: &Storage, seal: ScrubSeal) -> (Verdict, u64, u64) {
    let id = malachi_storage::SegmentId(seal.segment);
    // An open copy reads through its descriptor: a log deleted under it
    // is found by its path (and a copy opened without its log, in
    // quarantine, is missing, not damaged).
    if !storage.store.log_path(id).exists() {
        return (Verdict::Missing, 0, 0);
    }
    if let Ok(info) = storage.store.info(id)
        && (info.failed || info.lost.is_some())
    {
        // Opened in quarantine with nothing of its log: missing, as
        // `status::sealed_copy_health` says it.
        if !info.failed && info.durable == 0 && info.lost.is_some_and(|l| l.from == 0) {
            return (Verdict::Missing, 0, 0);
        }
        let why = match info.lost {
            Some(loss) => format!("quarantined: records {} to {} lost", loss.from, loss.to),
            None => "latched failed".to_string(),
        };
        return (Verdict::Damaged(why), 0, 0);
    }
    let report = storage.store.verify(id);
    let read = report.as_ref().map_or(0, |r| r.scanned_bytes);
    let index_bad = report.as_ref().map_or(0, |r| r.index_entries_bad);
    (judge(report.as_ref(), seal), read, index_bad)
}

/// The scrub state a broker shares between the replica-status answer, the
/// scrubber and the ReplicationServer (which rebuilds a broken copy).
#[derive(Debug, Default)]
pub(crate) struct ScrubState {
    pub book: parking_lot::Mutex<ScrubBook>,
    /// Wakes the scrubber when copies are queued.
    pub wake: tokio::sync::Notify,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use malachi_storage::{BadFrame, FrameError, SegmentId};

    fn report(records: u64, valid_bytes: u64, bad_at: Option<u64>) -> VerifyReport {
        VerifyReport {
            segment: SegmentId(1),
            records,
            valid_bytes,
            scanned_bytes: valid_bytes,
            first_bad: bad_at.map(|position| BadFrame {
                position,
                offset: records,
                error: FrameError::BadCrc {
                    stored: 1,
                    computed: 2,
                },
            }),
            valid_after: None,
            later_flush: None,
            index_entries_bad: 0,
        }
    }

    const SEAL: ScrubSeal = ScrubSeal {
        segment: 1,
        length: 10,
        bytes: 1_000,
    };

    #[test]
    fn a_copy_is_judged_against_its_recorded_seal() {
        assert_eq!(judge(Ok(&report(10, 1_000, None)), SEAL), Verdict::Intact);
        assert!(matches!(
            judge(Ok(&report(5, 500, Some(500))), SEAL),
            Verdict::Damaged(_)
        ));
        // A bad frame past the seal's bytes is an overrun's tail, not damage.
        assert_eq!(
            judge(Ok(&report(10, 1_000, Some(1_000))), SEAL),
            Verdict::Intact
        );
        assert_eq!(
            judge(Ok(&report(7, 700, None)), SEAL),
            Verdict::Short {
                records: 7,
                bytes: 700
            }
        );
        let gone = StorageError::Io {
            op: "open log",
            path: "x.log".into(),
            source: std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::NotFound)),
        };
        assert_eq!(judge(Err(&gone), SEAL), Verdict::Missing);
    }

    #[test]
    fn the_book_queues_once_keeps_broken_verdicts_and_expires_intact_ones() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        let fresh = Duration::from_secs(60);
        assert_eq!(book.ask(SEAL, now, fresh), None);
        assert_eq!(book.ask(SEAL, now, fresh), None);
        assert_eq!(book.queued(), 1);
        assert_eq!(book.next(), Some(SEAL));
        book.record(SEAL, Verdict::Intact, now);
        assert_eq!(book.ask(SEAL, now, fresh), Some(Verdict::Intact));
        // Stale: asked again, queued again.
        let later = now + Duration::from_secs(61);
        assert_eq!(book.ask(SEAL, later, fresh), None);
        assert_eq!(book.next(), Some(SEAL));
        // Broken stays broken until forgotten (rebuilt).
        book.record(SEAL, Verdict::Missing, later);
        let much_later = later + Duration::from_secs(3_600);
        assert_eq!(book.ask(SEAL, much_later, fresh), Some(Verdict::Missing));
        assert!(book.is_broken(1));
        book.forget(1);
        assert!(!book.is_broken(1));
        // A different seal for the segment is a different question.
        book.record(SEAL, Verdict::Intact, now);
        let other = ScrubSeal { length: 11, ..SEAL };
        assert_eq!(book.ask(other, now, fresh), None);
    }

    #[test]
    fn verdicts_nobody_asks_about_are_forgotten() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        let fresh = Duration::from_secs(60);
        book.record(SEAL, Verdict::Intact, now);
        let other = ScrubSeal { segment: 2, ..SEAL };
        book.record(other, Verdict::Intact, now);
        // Segment 1 is asked about again later; segment 2 never is.
        let later = now + Duration::from_secs(50);
        assert_eq!(book.ask(SEAL, later, fresh), Some(Verdict::Intact));
        book.prune(now + Duration::from_secs(100), Duration::from_secs(90));
        assert_eq!(book.known(), 1);
        assert_eq!(book.ask(SEAL, later, fresh), Some(Verdict::Intact));
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        for segment in 0..(SCRUB_QUEUE_MAX as u64 + 10) {
            let seal = ScrubSeal { segment, ..SEAL };
            assert_eq!(book.ask(seal, now, Duration::from_secs(1)), None);
        }
        assert_eq!(book.queued(), SCRUB_QUEUE_MAX);
    }
}
