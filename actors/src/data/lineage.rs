//! Where an opening segment's producer table comes from (ADR 0092, ADR
//! 0119): the final tables of the segments it succeeds.
//!
//! A segment's final table is what its primary held at the seal: the
//! tables it inherited, then every tag of its own log. The primary that
//! rolled it leaves that table as its `<segment>.producers` sidecar, but
//! only on its own disk. A broker that followed the segment, and becomes a
//! primary after a failover, has no sidecar for it nor for any segment
//! before it, and a producer whose last batch was stored a few rolls back
//! would be forgotten there if the table came from the direct
//! predecessor's log alone (chaos finding F2: the client then starts a new
//! epoch and stores a batch a second time).
//!
//! So a segment's final table is rebuilt the way its primary built it: the
//! final tables of its own predecessors, recursively, then its own tags.
//! The control plane hands the segment its [`Ancestry`] from the metadata
//! (each ancestor's range, seal and predecessors, up to
//! [`ANCESTRY_DEPTH_MAX`] generations and [`ANCESTRY_SEGMENTS_MAX`]
//! segments). The recursion stops at a sidecar, at an ancestor sealed more
//! than `producer_idle_expiry_ms` ago (every producer it could name has
//! expired) and at the ancestry's edge. A table rebuilt whole is written as
//! that ancestor's sidecar, so the next open here stops at it.

use std::collections::BTreeMap;

use malachi_cluster::model::{RangeId, SegmentId};
use malachi_storage::SegmentStore;
use tracing::{debug, info, warn};

use super::producers::{self, ProducerLimits, ProducerTable, ProducerTag};
use super::storage::Storage;

/// Generations of ancestors the control plane lists for an opening
/// segment. A producer silent for more rolls than this (and not in a
/// sidecar this broker holds) is forgotten at a failover, as one silent
/// past `producer_idle_expiry_ms` is anywhere.
pub(crate) const ANCESTRY_DEPTH_MAX: usize = 32;

/// Ancestor segments listed in all (a split or merge widens the ancestry).
pub(crate) const ANCESTRY_SEGMENTS_MAX: usize = 256;

/// How a sealed ancestor ended, as the metadata records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sealed {
    /// When the seal committed: no batch of the segment is later.
    pub at_ms: u64,
    /// Records in the segment: tags past it were never part of it.
    pub length: u64,
}

/// One segment an opening segment descends from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ancestor {
    pub range: RangeId,
    /// `None` if the metadata read does not have it sealed yet.
    pub sealed: Option<Sealed>,
    /// The segments whose tables this one started from.
    pub predecessors: Vec<SegmentId>,
}

/// The segments an opening segment's producer table descends from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ancestry {
    /// The segments it succeeds directly: the range's previous segment
    /// after a roll, the parents' last segments for the first segment of
    /// a split child or a merge.
    pub direct: Vec<SegmentId>,
    /// Every ancestor the metadata bound reaches, the direct ones included.
    pub segments: BTreeMap<SegmentId, Ancestor>,
}

/// A segment's final table as far as this broker can tell.
#[derive(Debug, Clone)]
struct Built {
    /// `None`: nothing is known of it here.
    table: Option<ProducerTable>,
    /// Whether every ancestor it needed was read whole: only then is it
    /// worth writing down as a sidecar.
    whole: bool,
}

/// Rebuilds the final tables of one opening segment's ancestors, each at
/// most once.
pub(crate) struct Lineage<'a> {
    storage: &'a Storage,
    topic: &'a str,
    ancestry: &'a Ancestry,
    limits: ProducerLimits,
    now_ms: u64,
    built: BTreeMap<SegmentId, Built>,
    /// Whether the topic keeps several copies: an ancestor's copy that is
    /// short or damaged here is then repaired, not lost (ADR 0127).
    replicated: bool,
}

impl<'a> Lineage<'a> {
    pub(crate) fn new(
        storage: &'a Storage,
        topic: &'a str,
        ancestry: &'a Ancestry,
        now_ms: u64,
    ) -> Lineage<'a> {
        Lineage {
            storage,
            topic,
            ancestry,
            limits: storage.config.producer_limits(),
            now_ms,
            built: BTreeMap::new(),
            replicated: false,
        }
    }

    /// Tells whether the topic keeps several copies of each segment.
    pub(crate) fn replicated(mut self, replicated: bool) -> Lineage<'a> {
        self.replicated = replicated;
        self
    }

    /// The table an opening segment of `range` starts from: its direct
    /// predecessors' final tables, inherited in order.
    pub(crate) fn start_table(&mut self, range: RangeId) -> ProducerTable {
        let mut table = ProducerTable::new(range.0, self.limits);
        for segment in &self.ancestry.direct {
            if let Some(predecessor) = self.final_table(*segment, 0).table {
                predecessor.inherit_into(&mut table, self.now_ms);
            }
        }
        table
    }

    /// `segment`'s final table, built once per open.
    fn final_table(&mut self, segment: SegmentId, depth: usize) -> Built {
        if let Some(built) = self.built.get(&segment) {
            return built.clone();
        }
        let built = self.build(segment, depth);
        self.built.insert(segment, built.clone());
        built
    }

    fn build(&mut self, segment: SegmentId, depth: usize) -> Built {
        let id = malachi_storage::SegmentId(segment.0);
        let store = &self.storage.store;
        let Some(ancestor) = self.ancestry.segments.get(&segment) else {
            // Past the ancestry's bound (or gone from the metadata): only
            // a sidecar held here speaks for it.
            return match read_sidecar(self.storage, id, self.limits) {
                Ok(table) => Built {
                    table: Some(table),
                    whole: true,
                },
                Err(_) => {
                    debug!(segment = %id, "an ancestor past the ancestry bound has no sidecar here; its producers are not carried on");
                    Built {
                        table: None,
                        whole: true,
                    }
                }
            };
        };
        if let Some(sealed) = ancestor.sealed
            && self.now_ms.saturating_sub(sealed.at_ms) >= self.limits.idle_expiry_ms
        {
            // Every batch it or its ancestors hold is older than its seal:
            // every producer they name has expired.
            return Built {
                table: Some(ProducerTable::new(ancestor.range.0, self.limits)),
                whole: true,
            };
        }
        // A segment this broker holds no copy of (placed off a full or
        // decommissioned broker): opening it would create an empty copy
        // that reads as lost records. Its producers' state is not carried
        // over (a retry of a batch it stored is taken as new; ADR 0112).
        if !store.log_path(id).exists() {
            info!(segment = %id, topic = self.topic, "no local copy of the predecessor; its idempotent producers start afresh here");
            return Built {
                table: None,
                whole: false,
            };
        }
        // After a failover this broker was a follower of the segment and
        // may not have opened its copy since it started.
        if let Err(malachi_storage::StorageError::NotOpen { .. }) = store.info(id)
            && let Err(e) = super::damage::open_copy(
                store,
                Some(&self.storage.metrics),
                segment,
                None,
                super::damage::CopyOf {
                    topic: Some(self.topic),
                    range: Some(ancestor.range),
                    replicated: self.replicated,
                },
            )
        {
            warn!(segment = %id, error = %e, "cannot open a predecessor copy for its producer state");
        }
        match read_sidecar(self.storage, id, self.limits) {
            Ok(table) => {
                return Built {
                    table: Some(table),
                    whole: true,
                };
            }
            Err(reason) if store.producers_path(id).exists() => {
                warn!(segment = %id, %reason, "the producer sidecar cannot be read; rebuilding it");
            }
            // Expected after a failover: only the primary that rolled
            // writes a sidecar, and this broker followed the segment.
            Err(_) => {
                debug!(segment = %id, depth, "no producer sidecar; rebuilding it from the ancestors and the log")
            }
        }
        let mut table = ProducerTable::new(ancestor.range.0, self.limits);
        let mut whole = true;
        if depth < ANCESTRY_DEPTH_MAX {
            for predecessor in &ancestor.predecessors {
                let built = self.final_table(*predecessor, depth + 1);
                whole &= built.whole;
                if let Some(inherited) = built.table {
                    inherited.inherit_into(&mut table, self.now_ms);
                }
            }
        }
        // No batch of a sealed segment is later than its seal: its tags
        // are seen then at the latest, so they expire no sooner than on
        // the primary that stored them.
        let seen_ms = ancestor
            .sealed
            .map_or(self.now_ms, |s| s.at_ms.min(self.now_ms));
        let end = ancestor.sealed.map(|s| s.length);
        match store.info(id) {
            Ok(info) if info.lost.is_none() && end.is_none_or(|end| info.durable >= end) => {}
            Ok(info) => {
                warn!(segment = %id, durable = info.durable, seal = ?end, lost = info.lost.is_some(), "the copy is short of its seal; its producer table is rebuilt from what it holds");
                whole = false;
            }
            Err(_) => whole = false,
        }
        if scan_tags(self.storage, id, &mut table, seen_ms, end).is_err() {
            whole = false;
        }
        if whole && ancestor.sealed.is_some() {
            write_sidecar(self.storage, id, &table);
        }
        Built {
            table: Some(table),
            whole,
        }
    }
}

/// Writes `table` as `id`'s sidecar, atomically. A failure is logged: the
/// table is rebuilt the next time it is needed.
pub(crate) fn write_sidecar(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    table: &ProducerTable,
) {
    let store = &storage.store;
    let path = store.producers_path(id);
    match malachi_storage::marker::write_atomically(
        store.dir(),
        &path,
        &producers::encode_sidecar(table),
    ) {
        Ok(()) => debug!(segment = %id, "producer sidecar written"),
        // Expected on a full volume: the table is rebuilt when needed.
        Err(e) if e.is_no_space() => {
            info!(segment = %id, error = %e, "no room for the producer sidecar; it is rebuilt from the log when needed")
        }
        Err(e) => warn!(segment = %id, error = %e, "cannot write the producer sidecar"),
    }
}

fn read_sidecar(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    limits: ProducerLimits,
) -> Result<ProducerTable, String> {
    let path = storage.store.producers_path(id);
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    producers::decode_sidecar(&bytes, limits).map_err(|e| e.to_string())
}

/// The copy could not be read to its end; the tags read so far are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScanCut;

/// Applies every producer tag below offset `end` (all, with `None`) in a
/// copy's log to `table`, as seen at `seen_ms`, and returns the offset of
/// the idempotent batch the log ends inside, if it does. A copy this store
/// cannot read leaves the table with what was read, with a warning:
/// retries of its other batches may then be stored twice.
pub(crate) fn scan_tags(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    table: &mut ProducerTable,
    seen_ms: u64,
    end: Option<u64>,
) -> Result<Option<u64>, ScanCut> {
    use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER};
    const SCAN_BYTES: usize = 8 << 20;
    // Every durable record, committed or not: a replicated copy's readers
    // see only committed ones, but a batch durable here and not yet
    // committed is still one a retry must be recognised as.
    let mut from = 0u64;
    let mut starts = producers::BatchStarts::default();
    loop {
        if end.is_some_and(|end| from >= end) {
            return Ok(None);
        }
        let run = match storage.store.read_frames(id, from, SCAN_BYTES) {
            Ok(run) => run,
            Err(e) => {
                warn!(segment = %id, error = %e, "cannot scan the log for producer state");
                return Err(ScanCut);
            }
        };
        if run.records == 0 {
            return Ok(starts.torn(from));
        }
        let mut at = 0;
        while at < run.bytes.len() {
            // `read_frames` checked every frame it returned.
            let Ok((view, len)) = malachi_storage::frame::decode(&run.bytes[at..]) else {
                warn!(segment = %id, "a frame read back does not decode");
                return Err(ScanCut);
            };
            if end.is_some_and(|end| view.offset >= end) {
                return Ok(None);
            }
            for (name, value) in &view.headers {
                if *name == PRODUCER_HEADER
                    && let Some(tag) = ProducerTag::decode(value)
                    && !table.observe(&tag, seen_ms)
                {
                    warn!(segment = %id, offset = view.offset, "a producer tag of another range; ignored");
                }
                if *name == PRODUCER_START_HEADER
                    && let Some(records) = producers::decode_start(value)
                {
                    starts.observe(view.offset, records);
                }
            }
            at += len;
        }
        from += run.records;
    }
}

/// Segment copies with producer tags in their logs, for the tests here and
/// in `segment.rs`.
#[cfg(test)]
pub(crate) mod fixture {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use malachi_storage::{FileStore, Record, StoreConfig};
    use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER};

    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use crate::common::metrics::BrokerMetrics;

    pub(crate) const RANGE: RangeId = RangeId(10);
    pub(crate) const DAY_MS: u64 = 24 * 60 * 60 * 1000;

    pub(crate) fn storage(dir: &std::path::Path) -> Arc<Storage> {
        let store = Arc::new(FileStore::open_dir(dir, StoreConfig::default()).unwrap());
        let config = BrokerConfig {
            producer_idle_expiry_ms: DAY_MS,
            ..BrokerConfig::for_tests(dir)
        };
        Arc::new(Storage::new(
            config,
            store,
            Arc::new(SystemClock),
            Arc::new(BrokerMetrics::new()),
        ))
    }

    /// A tag of `producer` (epoch 1) in `RANGE`, for a batch of one record.
    pub(crate) fn tag(producer: u64, sequence: u64) -> ProducerTag {
        ProducerTag {
            producer_id: producer,
            epoch: 1,
            range: RANGE.0,
            sequence,
            records: 1,
        }
    }

    /// Writes `segment` holding one one-record batch per `(producer,
    /// sequence)`, as a primary does, and seals it: no sidecar.
    pub(crate) fn copy(storage: &Storage, segment: u64, batches: &[(u64, u64)]) {
        let id = malachi_storage::SegmentId(segment);
        storage.store.open(id).unwrap();
        let records: Vec<Record> = batches
            .iter()
            .map(|(producer, sequence)| Record {
                headers: vec![
                    (
                        PRODUCER_START_HEADER.into(),
                        producers::encode_start(1).to_vec(),
                    ),
                    (
                        PRODUCER_HEADER.into(),
                        tag(*producer, *sequence).encode().to_vec(),
                    ),
                ],
                ..Record::new(1, format!("k{producer}"), format!("{producer}-{sequence}"))
            })
            .collect();
        if !records.is_empty() {
            storage.store.append(id, &records).unwrap().wait().unwrap();
        }
        storage.store.seal(id, records.len() as u64).unwrap();
        assert!(!storage.store.producers_path(id).exists());
    }

    /// A sealed ancestor of `RANGE`.
    pub(crate) fn sealed(at_ms: u64, length: u64, predecessors: &[u64]) -> Ancestor {
        Ancestor {
            range: RANGE,
            sealed: Some(Sealed { at_ms, length }),
            predecessors: predecessors.iter().map(|s| SegmentId(*s)).collect(),
        }
    }

    pub(crate) fn ancestry(direct: &[u64], segments: Vec<(u64, Ancestor)>) -> Ancestry {
        Ancestry {
            direct: direct.iter().map(|s| SegmentId(*s)).collect(),
            segments: segments
                .into_iter()
                .map(|(s, a)| (SegmentId(s), a))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::fixture::*;
    use super::*;
    use crate::data::producers::Verdict;

    const NOW: u64 = 1_000 * DAY_MS;
    const X: u64 = 1;
    const Y: u64 = 2;

    fn start(storage: &Storage, ancestry: &Ancestry) -> ProducerTable {
        Lineage::new(storage, "t", ancestry, NOW).start_table(RANGE)
    }

    fn has_sidecar(storage: &Storage, segment: u64) -> bool {
        storage
            .store
            .producers_path(malachi_storage::SegmentId(segment))
            .exists()
    }

    /// A (X's batches), B (Y's only), both sealed an hour ago, no sidecars.
    fn two_rolls(storage: &Storage) -> Ancestry {
        copy(storage, 1, &[(X, 0), (X, 1), (X, 2)]);
        copy(storage, 2, &[(Y, 0), (Y, 1)]);
        ancestry(
            &[2],
            vec![
                (1, sealed(NOW - 2 * 3_600_000, 3, &[])),
                (2, sealed(NOW - 3_600_000, 2, &[1])),
            ],
        )
    }

    #[test]
    fn a_producer_last_seen_two_segments_back_is_remembered_without_sidecars() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let table = start(&storage, &two_rolls(&storage));
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Append);
        assert_eq!(
            table.check(&tag(X, 2), 1),
            Verdict::Duplicate { records: 1 }
        );
        assert_eq!(table.check(&tag(Y, 2), 1), Verdict::Append);
    }

    #[test]
    fn a_rebuilt_table_is_left_as_the_ancestors_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let ancestry = two_rolls(&storage);
        start(&storage, &ancestry);
        assert!(has_sidecar(&storage, 1) && has_sidecar(&storage, 2));
        // The next open stops at B's sidecar: A's log is not needed.
        std::fs::remove_file(storage.store.log_path(malachi_storage::SegmentId(1))).unwrap();
        let table = start(&storage, &ancestry);
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Append);
        assert_eq!(
            table.check(&tag(X, 2), 1),
            Verdict::Duplicate { records: 1 }
        );
    }

    #[test]
    fn an_ancestor_sealed_past_the_idle_expiry_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        copy(&storage, 1, &[(X, 0), (X, 1)]);
        copy(&storage, 2, &[(Y, 0)]);
        let ancestry = ancestry(
            &[2],
            vec![
                (1, sealed(NOW - DAY_MS, 2, &[])),
                (2, sealed(NOW - 1_000, 1, &[1])),
            ],
        );
        let table = start(&storage, &ancestry);
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Unknown);
        assert_eq!(table.check(&tag(Y, 1), 1), Verdict::Append);
        assert!(!has_sidecar(&storage, 1));
    }

    #[test]
    fn tags_past_an_ancestors_seal_are_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        copy(&storage, 1, &[(X, 0), (X, 1), (X, 2)]);
        // The metadata sealed it at 2 records: batch 2 is not in it.
        let ancestry = ancestry(&[1], vec![(1, sealed(NOW - 1_000, 2, &[]))]);
        let table = start(&storage, &ancestry);
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Append);
    }

    #[test]
    fn a_table_missing_an_ancestors_copy_is_not_written_down() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        // No copy of 1 here; 2 holds Y's batches.
        copy(&storage, 2, &[(Y, 0)]);
        let ancestry = ancestry(
            &[2],
            vec![
                (1, sealed(NOW - 2_000, 5, &[])),
                (2, sealed(NOW - 1_000, 1, &[1])),
            ],
        );
        let table = start(&storage, &ancestry);
        assert_eq!(table.check(&tag(Y, 1), 1), Verdict::Append);
        assert!(!has_sidecar(&storage, 2));
        assert!(
            !storage
                .store
                .log_path(malachi_storage::SegmentId(1))
                .exists()
        );
    }

    /// X's verdict for its next batch at the end of a chain of `chain`
    /// sealed segments with X's batch only in the oldest.
    fn at_the_end_of_a_chain(chain: u64) -> Verdict {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        copy(&storage, 1, &[(X, 0)]);
        for segment in 2..=chain {
            copy(&storage, segment, &[]);
        }
        let segments = (1..=chain)
            .map(|s| {
                let before: Vec<u64> = (s > 1).then_some(s - 1).into_iter().collect();
                let at_ms = NOW - 1_000 * (chain + 1 - s);
                (s, sealed(at_ms, u64::from(s == 1), &before))
            })
            .collect();
        start(&storage, &ancestry(&[chain], segments)).check(&tag(X, 1), 1)
    }

    #[test]
    fn the_recursion_stops_at_the_depth_bound() {
        let bound = ANCESTRY_DEPTH_MAX as u64;
        // The direct predecessor is generation 0: the oldest of `bound + 1`
        // segments is the last one read.
        assert_eq!(at_the_end_of_a_chain(bound + 1), Verdict::Append);
        assert_eq!(at_the_end_of_a_chain(bound + 2), Verdict::Unknown);
    }
}
