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
//! A copy the book has never judged is first *sized* ([`whole_by_size`]:
//! its log's bytes and its recorded records against the seal, no read):
//! one that looks whole is read in full one `scrub_interval_ms` later,
//! not at once (ADR 0159). Re-reading a copy just sealed mostly reads the
//! page cache the writer left, so it checks memory rather than the disk,
//! and under write load it cost a capped broker a fifth of its CPU. A
//! copy that does not look whole is queued for its read at once, as
//! before: the read gives the verdict.
//!
//! The store knows segments by id only, not by topic: the metadata's
//! owner asks, so this module needs no metadata.
//!
//! Broken verdicts survive a restart (issue 36): the book keeps them in
//! [`SCRUB_BROKEN_FILE`] in the data dir, rewritten atomically whenever the
//! set of broken copies changes (rare: a copy found broken, or its rebuild
//! started), and read back at boot. Intact verdicts are not kept: they
//! expire anyway, and a copy read again after a restart loses nothing.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use malachi_storage::{StorageError, VerifyReport};
use malachi_wire::replica_status::{ScrubSeal, ScrubVerdict};

use super::storage::Storage;

/// Copies waiting for the scrubber at most; a copy asked about while the
/// queue is full stays `pending` and is queued on a later ask.
pub(crate) const SCRUB_QUEUE_MAX: usize = 4_096;
/// The rate at which the scrubber re-reads copies, so producers and
/// consumers keep most of the disk.
pub(crate) const SCRUB_BYTES_PER_SECOND: u64 = 32 << 20;

/// Copies sized whole and waiting for their first read at most; past it a
/// new copy is queued for its read at once, as if it had not been sized.
pub(crate) const SCRUB_DEFERRED_MAX: usize = 65_536;

/// The file in the data dir holding the broken verdicts across restarts.
pub(crate) const SCRUB_BROKEN_FILE: &str = "scrub-broken.json";
/// Broken verdicts the file holds at most: beyond it the oldest are left
/// out (they are found again by the next scrub).
pub(crate) const SCRUB_BROKEN_KEPT_MAX: usize = 4_096;

/// The scrubber's finding about one copy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Verdict {
    Intact,
    /// A bad frame inside the sealed bytes, or a copy quarantined at open
    /// (or found damaged on read).
    Damaged {
        detail: String,
    },
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
            Verdict::Damaged { detail: why } => ("damaged", why.clone()),
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
        Err(e) => {
            return Verdict::Damaged {
                detail: format!("cannot read the copy: {e}"),
            };
        }
    };
    if let Some(bad) = report.first_bad
        && bad.position < seal.bytes
    {
        return Verdict::Damaged {
            detail: format!(
                "a bad frame at byte {} (offset {}): {}",
                bad.position, bad.offset, bad.error
            ),
        };
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

/// A copy sized whole, not read yet (ADR 0159).
#[derive(Debug)]
struct Deferred {
    seal: ScrubSeal,
    /// When its first read is due.
    until: Instant,
    asked: Instant,
}

/// The verdicts found and the copies waiting for the scrubber.
#[derive(Debug, Default)]
pub(crate) struct ScrubBook {
    found: HashMap<u64, Found>,
    deferred: HashMap<u64, Deferred>,
    queue: VecDeque<ScrubSeal>,
    /// Where the broken verdicts are kept across restarts; `None` in tests
    /// that need no file.
    kept_at: Option<std::path::PathBuf>,
}

/// One broken verdict as [`SCRUB_BROKEN_FILE`] holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptVerdict {
    pub segment: u64,
    pub length: u64,
    pub bytes: u64,
    pub verdict: Verdict,
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
        if let Some(deferred) = self.deferred.get_mut(&seal.segment)
            && deferred.seal == seal
            && now < deferred.until
        {
            deferred.asked = now;
            return None;
        }
        if self.queue.len() < SCRUB_QUEUE_MAX
            && !self.queue.iter().any(|q| q.segment == seal.segment)
        {
            self.queue.push_back(seal);
        }
        None
    }

    /// Whether the book has neither a verdict on `seal`'s copy nor its
    /// first read deferred: the copy is new here and may be sized.
    pub(crate) fn is_new(&self, seal: ScrubSeal) -> bool {
        !self.found.contains_key(&seal.segment)
            && !self
                .deferred
                .get(&seal.segment)
                .is_some_and(|d| d.seal == seal)
    }

    /// `seal`'s copy was sized whole at `now`: asked about before
    /// `now + fresh_for` it is `pending` and not queued; after, it is
    /// queued for its first read. Unbounded never: past
    /// [`SCRUB_DEFERRED_MAX`] the copy is simply queued when asked.
    pub(crate) fn defer(&mut self, seal: ScrubSeal, now: Instant, fresh_for: Duration) {
        if self.found.contains_key(&seal.segment)
            || (self.deferred.len() >= SCRUB_DEFERRED_MAX
                && !self.deferred.contains_key(&seal.segment))
        {
            return;
        }
        self.deferred.insert(
            seal.segment,
            Deferred {
                seal,
                until: now + fresh_for,
                asked: now,
            },
        );
    }

    /// The next copy to read.
    pub(crate) fn next(&mut self) -> Option<ScrubSeal> {
        self.queue.pop_front()
    }

    pub(crate) fn record(&mut self, seal: ScrubSeal, verdict: Verdict, now: Instant) {
        self.deferred.remove(&seal.segment);
        let broken = verdict.is_broken();
        let was = self.found.insert(
            seal.segment,
            Found {
                seal,
                verdict,
                at: now,
                asked: now,
            },
        );
        if broken || was.is_some_and(|f| f.verdict.is_broken()) {
            self.keep();
        }
    }

    /// Records the verdict of a scan that began at `started`, unless it
    /// would clear a broken verdict found since (damage found on read while
    /// the scan ran): the scan may have read the copy before the damage,
    /// and its "intact" would undo the mark and the rebuild. The next scan
    /// judges the copy again.
    pub(crate) fn record_scanned(
        &mut self,
        seal: ScrubSeal,
        verdict: Verdict,
        started: Instant,
        now: Instant,
    ) {
        let newer_broken = self
            .found
            .get(&seal.segment)
            .is_some_and(|f| f.verdict.is_broken() && f.at >= started);
        if newer_broken && !verdict.is_broken() {
            return;
        }
        self.record(seal, verdict, now);
    }

    /// A book that keeps its broken verdicts in `dir`'s
    /// [`SCRUB_BROKEN_FILE`], with those the file held (a restart's):
    /// each trusted as found now, until its copy is rebuilt.
    pub(crate) fn kept_in(dir: &std::path::Path, now: Instant) -> ScrubBook {
        let path = dir.join(SCRUB_BROKEN_FILE);
        let mut book = ScrubBook {
            kept_at: Some(path.clone()),
            ..ScrubBook::default()
        };
        let kept: Vec<KeptVerdict> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                // A verdict lost is found again by the next scrub: never a
                // reason not to start.
                tracing::warn!(path = %path.display(), error = %e, "the kept scrub verdicts do not decode; the scrubber finds them again");
                Vec::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the kept scrub verdicts; the scrubber finds them again");
                Vec::new()
            }
        };
        for k in kept.into_iter().filter(|k| k.verdict.is_broken()) {
            let seal = ScrubSeal {
                segment: k.segment,
                length: k.length,
                bytes: k.bytes,
            };
            book.found.insert(
                k.segment,
                Found {
                    seal,
                    verdict: k.verdict,
                    at: now,
                    asked: now,
                },
            );
        }
        book
    }

    /// The broken verdicts, as the file keeps them, in segment order.
    pub(crate) fn broken(&self) -> Vec<KeptVerdict> {
        let mut kept: Vec<KeptVerdict> = self
            .found
            .values()
            .filter(|f| f.verdict.is_broken())
            .map(|f| KeptVerdict {
                segment: f.seal.segment,
                length: f.seal.length,
                bytes: f.seal.bytes,
                verdict: f.verdict.clone(),
            })
            .collect();
        kept.sort_by_key(|k| k.segment);
        kept.truncate(SCRUB_BROKEN_KEPT_MAX);
        kept
    }

    /// Rewrites the file of broken verdicts (atomically: a crash leaves the
    /// old file or the new one). A failure is logged: the verdicts are then
    /// kept in memory only, as before issue 36, and found again by a scrub
    /// after a restart.
    fn keep(&self) {
        let Some(path) = &self.kept_at else {
            return;
        };
        let Some(dir) = path.parent() else {
            return;
        };
        let written = serde_json::to_vec_pretty(&self.broken())
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                malachi_storage::marker::write_atomically(dir, path, &bytes)
                    .map_err(|e| e.to_string())
            });
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "cannot keep the broken scrub verdicts across a restart");
        }
    }

    /// Forgets the verdicts nobody asked about for `unasked_for`, so the
    /// book holds what coordinators still ask about, not every copy ever
    /// scrubbed.
    pub(crate) fn prune(&mut self, now: Instant, unasked_for: Duration) {
        let broken =
            |found: &HashMap<u64, Found>| found.values().filter(|f| f.verdict.is_broken()).count();
        let before = broken(&self.found);
        self.found
            .retain(|_, f| now.duration_since(f.asked) < unasked_for);
        self.deferred
            .retain(|_, d| now.duration_since(d.asked) < unasked_for);
        // The file is rewritten only when a broken verdict was forgotten.
        if broken(&self.found) != before {
            self.keep();
        }
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
                Verdict::Damaged { .. } => "damaged",
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
        self.deferred.remove(&segment);
        if self
            .found
            .remove(&segment)
            .is_some_and(|f| f.verdict.is_broken())
        {
            self.keep();
        }
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
    // Sized outside the book's lock: a metadata look at each new copy.
    let new: Vec<ScrubSeal> = {
        let book = storage.scrub.book.lock();
        seals.iter().copied().filter(|s| book.is_new(*s)).collect()
    };
    // A rebuilt copy is read at once all the same: its broken original,
    // set aside, is deleted only once the rebuild reads intact.
    let whole: Vec<ScrubSeal> = new
        .into_iter()
        .filter(|s| {
            !storage
                .store
                .is_aside(malachi_storage::SegmentId(s.segment))
        })
        .filter(|s| whole_by_size(storage.store.as_ref(), *s))
        .collect();
    let out: Vec<ScrubVerdict> = {
        let mut book = storage.scrub.book.lock();
        for seal in whole {
            book.defer(seal, now, fresh_for);
        }
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

/// Whether `seal`'s copy here looks whole without reading it: its log is
/// there with at least the seal's bytes, and the store records the seal's
/// records (an open copy's durable end, nothing lost or failed; a closed
/// copy's seal marker). Only a full read says it is intact (ADR 0159).
pub(crate) fn whole_by_size(store: &dyn malachi_storage::SegmentStore, seal: ScrubSeal) -> bool {
    let id = malachi_storage::SegmentId(seal.segment);
    if !matches!(store.copy_bytes(id), Ok(Some(bytes)) if bytes >= seal.bytes) {
        return false;
    }
    match store.info(id) {
        Ok(info) => !info.failed && info.lost.is_none() && info.durable == seal.length,
        Err(_) => store
            .seal_at_rest(id)
            .ok()
            .flatten()
            .is_some_and(|at_rest| {
                at_rest.length == seal.length && at_rest.byte_size == seal.bytes
            }),
    }
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
    if !storage.store.has_copy(id) {
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
        return (Verdict::Damaged { detail: why }, 0, 0);
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

impl ScrubState {
    /// The scrub state of a broker whose data dir is `dir`: the broken
    /// verdicts it kept before a restart are back (issue 36).
    pub(crate) fn kept_in(dir: &std::path::Path) -> ScrubState {
        ScrubState {
            book: parking_lot::Mutex::new(ScrubBook::kept_in(dir, Instant::now())),
            wake: tokio::sync::Notify::new(),
        }
    }
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

    /// Regression: a scan that began before damage was found on read
    /// recorded "intact" over the damage mark, and the copy was not rebuilt
    /// (`damage_on_read` failed once in nine runs).
    #[test]
    fn a_scan_begun_before_damage_was_found_does_not_clear_the_mark() {
        let started = Instant::now();
        let found = started + std::time::Duration::from_millis(5);
        let done = found + std::time::Duration::from_millis(5);
        let mut book = ScrubBook::default();
        book.record(
            SEAL,
            Verdict::Damaged {
                detail: "found on read".into(),
            },
            found,
        );
        book.record_scanned(SEAL, Verdict::Intact, started, done);
        assert!(book.is_broken(SEAL.segment), "the newer damage mark stands");
        // A scan begun after the mark judges the copy again.
        let later = done + std::time::Duration::from_millis(5);
        book.record_scanned(SEAL, Verdict::Intact, later, later);
        assert!(!book.is_broken(SEAL.segment));
    }

    #[test]
    fn a_copy_is_judged_against_its_recorded_seal() {
        assert_eq!(judge(Ok(&report(10, 1_000, None)), SEAL), Verdict::Intact);
        assert!(matches!(
            judge(Ok(&report(5, 500, Some(500))), SEAL),
            Verdict::Damaged { .. }
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

    /// Issue 36: scrub verdicts were kept in memory only, so a restart
    /// made a broken copy look intact until the next (daily) scrub.
    #[test]
    fn broken_verdicts_survive_a_restart_and_a_rebuild_forgets_them() {
        let dir = tempfile::tempdir().unwrap();
        let now = Instant::now();
        let seal = |segment| ScrubSeal {
            segment,
            length: 10,
            bytes: 400,
        };
        let mut book = ScrubBook::kept_in(dir.path(), now);
        book.record(seal(7), Verdict::Intact, now);
        book.record(
            seal(9),
            Verdict::Damaged {
                detail: "found on read: bad crc".into(),
            },
            now,
        );
        book.record(
            seal(11),
            Verdict::Short {
                records: 4,
                bytes: 160,
            },
            now,
        );
        drop(book);
        // The restart.
        let mut book = ScrubBook::kept_in(dir.path(), now);
        assert!(book.is_broken(9) && book.is_broken(11));
        assert!(!book.is_broken(7), "intact verdicts are not kept");
        let fresh = Duration::from_secs(60);
        assert_eq!(
            book.ask(seal(9), now, fresh),
            Some(Verdict::Damaged {
                detail: "found on read: bad crc".into()
            }),
            "a coordinator's ask gets the kept verdict, so the copy is rebuilt"
        );
        // Its rebuild starts: forgotten, also after the next restart.
        book.forget(9);
        drop(book);
        let book = ScrubBook::kept_in(dir.path(), now);
        assert!(!book.is_broken(9) && book.is_broken(11));
    }

    #[test]
    fn a_kept_verdicts_file_that_does_not_decode_is_no_reason_not_to_start() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SCRUB_BROKEN_FILE), b"{not json").unwrap();
        let book = ScrubBook::kept_in(dir.path(), Instant::now());
        assert_eq!(book.known(), 0);
    }

    #[test]
    fn the_kept_verdicts_format_is_frozen() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        book.record(
            ScrubSeal {
                segment: 3,
                length: 12,
                bytes: 480,
            },
            Verdict::Damaged {
                detail: "a bad frame at byte 100 (offset 2): bad crc".into(),
            },
            now,
        );
        book.record(
            ScrubSeal {
                segment: 5,
                length: 8,
                bytes: 320,
            },
            Verdict::Short {
                records: 6,
                bytes: 240,
            },
            now,
        );
        book.record(
            ScrubSeal {
                segment: 6,
                length: 8,
                bytes: 320,
            },
            Verdict::Missing,
            now,
        );
        insta::assert_snapshot!(
            "scrub_broken_file",
            serde_json::to_string_pretty(&book.broken()).unwrap()
        );
    }

    /// ADR 0159: a copy sized whole waits one interval for its first
    /// read; asked again before, it is pending and not queued.
    #[test]
    fn a_copy_sized_whole_is_read_one_interval_later_not_at_once() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        let fresh = Duration::from_secs(60);
        assert!(book.is_new(SEAL));
        book.defer(SEAL, now, fresh);
        assert!(!book.is_new(SEAL));
        assert_eq!(book.ask(SEAL, now + Duration::from_secs(59), fresh), None);
        assert_eq!(book.queued(), 0, "not read at once");
        // Due: queued for its first read, which then gives the verdict.
        assert_eq!(book.ask(SEAL, now + Duration::from_secs(60), fresh), None);
        assert_eq!(book.next(), Some(SEAL));
        let read = now + Duration::from_secs(61);
        book.record(
            SEAL,
            Verdict::Short {
                records: 9,
                bytes: 900,
            },
            read,
        );
        assert_eq!(
            book.ask(SEAL, read, fresh),
            Some(Verdict::Short {
                records: 9,
                bytes: 900
            })
        );
        // Another seal of the segment is a new question; one already judged
        // is never deferred.
        let other = ScrubSeal { length: 11, ..SEAL };
        book.defer(other, read, fresh);
        assert_eq!(
            book.ask(SEAL, read, fresh).map(|v| v.is_broken()),
            Some(true)
        );
    }

    #[test]
    fn deferred_copies_are_bounded_and_forgotten_when_nobody_asks() {
        let mut book = ScrubBook::default();
        let now = Instant::now();
        let fresh = Duration::from_secs(3_600);
        for segment in 0..(SCRUB_DEFERRED_MAX as u64 + 10) {
            book.defer(ScrubSeal { segment, ..SEAL }, now, fresh);
        }
        assert_eq!(book.deferred.len(), SCRUB_DEFERRED_MAX);
        // Past the bound a new copy is read at once, as before ADR 0159.
        let late = ScrubSeal {
            segment: SCRUB_DEFERRED_MAX as u64 + 5,
            ..SEAL
        };
        assert!(book.is_new(late));
        assert_eq!(book.ask(late, now, fresh), None);
        assert_eq!(book.queued(), 1);
        book.prune(now + Duration::from_secs(100), Duration::from_secs(90));
        assert!(book.deferred.is_empty());
    }

    /// What sizing takes for whole: an open copy at its seal, a closed one
    /// whose seal marker matches; a short copy or none is read at once.
    #[test]
    fn a_copy_is_whole_by_size_only_at_its_seal() {
        use malachi_storage::{FileStore, Record, SegmentStore, StoreConfig};
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open_dir(dir.path(), StoreConfig::default()).unwrap();
        let id = SegmentId(1);
        store.open(id).unwrap();
        let records: Vec<Record> = (0..3).map(|i| Record::new(i, "k", "v")).collect();
        store.append(id, &records).unwrap().wait().unwrap();
        store.seal(id, 3).unwrap();
        let bytes = store.copy_bytes(id).unwrap().unwrap();
        let seal = |length, bytes| ScrubSeal {
            segment: 1,
            length,
            bytes,
        };
        assert!(whole_by_size(&store, seal(3, bytes)));
        assert!(!whole_by_size(&store, seal(4, bytes)), "fewer records");
        assert!(!whole_by_size(&store, seal(3, bytes + 1)), "fewer bytes");
        store.close(id).unwrap();
        assert!(whole_by_size(&store, seal(3, bytes)), "closed, marker at 3");
        assert!(!whole_by_size(&store, seal(2, bytes)));
        assert!(!whole_by_size(
            &store,
            ScrubSeal {
                segment: 9,
                ..seal(3, bytes)
            }
        ));
    }

    /// The holder's answer end to end: a copy at its seal is pending and
    /// not queued; a short one, and a rebuilt one (its original aside),
    /// are queued for their read at once.
    #[test]
    fn verdicts_queue_at_once_only_what_does_not_look_whole_or_was_rebuilt() {
        use std::sync::Arc;

        use malachi_storage::{FileStore, Record, SegmentStore, StoreConfig};
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FileStore::open_dir(dir.path(), StoreConfig::default()).unwrap());
        let storage = Storage::new(
            crate::common::config::BrokerConfig::for_tests(dir.path()),
            store.clone(),
            Arc::new(crate::common::clock::SystemClock),
            Arc::new(crate::common::metrics::BrokerMetrics::new()),
        );
        let write = |id: SegmentId| {
            store.open(id).unwrap();
            let records: Vec<Record> = (0..3).map(|i| Record::new(i, "k", "v")).collect();
            store.append(id, &records).unwrap().wait().unwrap();
            store.seal(id, 3).unwrap();
        };
        let mut seals = Vec::new();
        for segment in [1, 2, 3] {
            write(SegmentId(segment));
            let bytes = store.copy_bytes(SegmentId(segment)).unwrap().unwrap();
            seals.push(ScrubSeal {
                segment,
                length: 3,
                bytes,
            });
        }
        // Segment 2's seal says 4 records: short here.
        seals[1].length = 4;
        // Segment 3 rebuilt whole, its original aside (as the follower's
        // `set_aside_for_rebuild` leaves it).
        assert!(store.set_aside(SegmentId(3)).unwrap());
        write(SegmentId(3));
        assert!(whole_by_size(store.as_ref(), seals[2]));
        let answers = verdicts(&storage, &seals);
        assert!(
            answers.iter().all(|a| a.verdict == "pending"),
            "{answers:?}"
        );
        let mut queued = Vec::new();
        while let Some(seal) = storage.scrub.book.lock().next() {
            queued.push(seal.segment);
        }
        assert_eq!(queued, [2, 3]);
        // Asked again, the whole copy is still not queued.
        verdicts(&storage, &seals[..1]);
        assert_eq!(storage.scrub.book.lock().queued(), 0);
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
