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
//! The control plane hands the segment its [`Ancestry`](super::ancestors::Ancestry) from the metadata
//! (each ancestor's range, seal and predecessors, up to
//! `ANCESTRY_DEPTH_MAX` generations and `ANCESTRY_SEGMENTS_MAX`
//! segments). The recursion stops at a sidecar, at an ancestor sealed more
//! than `producer_idle_expiry_ms` ago (every producer it could name has
//! expired) and at the ancestry's edge. A table rebuilt whole is written as
//! that ancestor's sidecar, so the next open here stops at it.
//!
//! An ancestor this broker holds no copy of (or a copy short of its seal,
//! or one it cannot read to the end) is read from a live holder's copy
//! instead (ADR 0124): the first pass ([`Lineage::start_table`]) names it
//! in [`Lineage::wanted`]; a holder's sidecar at the seal then stands in
//! for it whole (`fetch_sealed_table`, ADR 0156), or, when no holder has one,
//! `ancestors::fetch_own_tags` reads its frames up to the seal from a holder with
//! the cluster port's catch-up read and takes their tags exactly as the
//! local scan does. A second pass, given those, inherits through it as
//! through a local copy. The segment takes no idempotent batch until then
//! (`segment.rs`).

use std::collections::{BTreeMap, BTreeSet};

use malachi_core::model::{RangeId, SegmentId};
use tracing::{debug, info, warn};

use super::ancestors::{
    ANCESTRY_DEPTH_MAX, Ancestor, Ancestry, Fetched, FetchedTable, observe_frame,
};
use super::producers::{self, ProducerLimits, ProducerTable};
use super::storage::Storage;

/// A segment's final table as far as this broker can tell.
#[derive(Debug, Clone)]
struct Built {
    /// `None`: nothing is known of it here.
    table: Option<ProducerTable>,
    /// Whether every ancestor it needed was read whole: only then is it
    /// worth writing down as a sidecar.
    whole: bool,
}

/// When the first pass scans this broker's copy of an ancestor that has no
/// sidecar here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalScans {
    /// At once: the table is built here and now.
    Now,
    /// Only after its holders were asked for its sealed table (ADR 0156):
    /// a follower's copy of a split parent is up to `segment_bytes_max` to
    /// scan, under the opening segment's supervisor, where the sealing
    /// primary's sidecar is one small answer. An ancestor no other broker
    /// holds, or not sealed, is scanned at once all the same.
    AfterHolders,
}

/// Rebuilds the final tables of one opening segment's ancestors, each at
/// most once.
pub(crate) struct Lineage<'a> {
    storage: &'a Storage,
    topic: &'a str,
    ancestry: &'a Ancestry,
    fetched: &'a Fetched,
    limits: ProducerLimits,
    now_ms: u64,
    built: BTreeMap<SegmentId, Built>,
    /// Ancestors whose copy here is missing or not whole, and which a
    /// holder could stand in for.
    wanted: BTreeSet<SegmentId>,
    /// Whether the topic keeps several copies: an ancestor's copy that is
    /// short or damaged here is then repaired, not lost (ADR 0127).
    replicated: bool,
    scans: LocalScans,
}

impl<'a> Lineage<'a> {
    /// A lineage that reads every ancestor from this broker's copies.
    #[cfg(test)]
    pub(crate) fn new(
        storage: &'a Storage,
        topic: &'a str,
        ancestry: &'a Ancestry,
        now_ms: u64,
    ) -> Lineage<'a> {
        static NONE: Fetched = BTreeMap::new();
        Lineage::with_fetched(storage, topic, ancestry, &NONE, now_ms)
    }

    /// A lineage that reads the ancestors in `fetched` from those tags
    /// rather than from this broker's copies.
    pub(crate) fn with_fetched(
        storage: &'a Storage,
        topic: &'a str,
        ancestry: &'a Ancestry,
        fetched: &'a Fetched,
        now_ms: u64,
    ) -> Lineage<'a> {
        Lineage {
            storage,
            topic,
            ancestry,
            fetched,
            limits: storage.config.producer_limits(),
            now_ms,
            built: BTreeMap::new(),
            wanted: BTreeSet::new(),
            replicated: false,
            scans: LocalScans::Now,
        }
    }

    /// After [`Self::start_table`]: the ancestors it could not read whole
    /// here and a holder could stand in for, with what the metadata says of
    /// them. Empty: the table is complete as far as this broker can tell.
    pub(crate) fn wanted(&self) -> Vec<(SegmentId, Ancestor)> {
        self.wanted
            .iter()
            .filter_map(|s| self.ancestry.segments.get(s).map(|a| (*s, a.clone())))
            .collect()
    }

    /// Says when copies without a sidecar here are scanned.
    pub(crate) fn local_scans(mut self, scans: LocalScans) -> Lineage<'a> {
        self.scans = scans;
        self
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
        let ancestry: &'a Ancestry = self.ancestry;
        let Some(ancestor) = ancestry.segments.get(&segment) else {
            // Past the ancestry's bound (or gone from the metadata): only
            // a sidecar held here speaks for it.
            return match read_sidecar(self.storage, id, self.limits) {
                Ok(Some(table)) => Built {
                    table: Some(table),
                    whole: true,
                },
                Ok(None) | Err(_) => {
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
        match self.fetched.get(&segment) {
            // Its final table, from a holder's sidecar: as a sidecar here.
            Some(FetchedTable::Final(table)) => {
                return Built {
                    table: Some(table.clone()),
                    whole: true,
                };
            }
            // Its log's tags, read from a holder's copy up to the seal.
            Some(FetchedTable::OwnTags(own)) => {
                let (mut table, whole) = self.inherited(ancestor, depth);
                own.replay_into(&mut table);
                return Built {
                    table: Some(table),
                    whole,
                };
            }
            None => {}
        }
        // A segment this broker holds no copy of (its successor placed on
        // a broker that never held it): opening it would create an empty
        // copy that reads as lost records. A holder's copy stands in.
        if !self.storage.store.has_copy(id) {
            if ancestor.fetchable(self.storage.config.node_id) {
                debug!(segment = %id, topic = self.topic, "no local copy of the predecessor; its producer state is read from a holder");
                self.wanted.insert(segment);
                // Its own ancestors may be wanted too: find them now, so
                // one round of fetches covers them all.
                self.inherited(ancestor, depth);
            } else {
                warn!(segment = %id, topic = self.topic, holders = ?ancestor.holders, sealed = ancestor.sealed.is_some(), "no copy of the predecessor here and no holder to read it from; its idempotent producers start afresh here");
            }
            return Built {
                table: None,
                whole: false,
            };
        }
        self.build_from_copy(segment, ancestor, depth)
    }

    /// The predecessors' final tables of `ancestor`, inherited in order
    /// into a table of its range, and whether each was read whole.
    fn inherited(&mut self, ancestor: &Ancestor, depth: usize) -> (ProducerTable, bool) {
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
        (table, whole)
    }

    /// `ancestor`'s final table from this broker's copy of it (its sidecar,
    /// or its predecessors' tables and its log).
    fn build_from_copy(&mut self, segment: SegmentId, ancestor: &Ancestor, depth: usize) -> Built {
        let id = malachi_storage::SegmentId(segment.0);
        let store = &self.storage.store;
        // After a failover this broker was a follower of the segment and
        // may not have opened its copy since it started.
        if let Err(malachi_storage::StorageError::NotOpen { .. }) = store.info(id)
            && let Err(e) = super::damage::open_copy(
                store.as_ref(),
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
            Ok(Some(table)) => {
                return Built {
                    table: Some(table),
                    whole: true,
                };
            }
            Err(reason) => {
                warn!(segment = %id, %reason, "the producer sidecar cannot be read; rebuilding it");
            }
            // Expected after a failover: only the primary that rolled
            // writes a sidecar, and this broker followed the segment.
            Ok(None) => {
                debug!(segment = %id, depth, "no producer sidecar; rebuilding it from the ancestors and the log")
            }
        }
        if self.scans == LocalScans::AfterHolders && ancestor.fetchable(self.storage.config.node_id)
        {
            // The holders are asked for its sealed table first; the copy
            // here is scanned only if none has one.
            self.wanted.insert(segment);
            self.inherited(ancestor, depth);
            return Built {
                table: None,
                whole: false,
            };
        }
        let (mut table, mut whole) = self.inherited(ancestor, depth);
        // No batch of a sealed segment is later than its seal: its tags
        // are seen then at the latest, so they expire no sooner than on
        // the primary that stored them.
        let seen_ms = ancestor
            .sealed
            .map_or(self.now_ms, |s| s.at_ms.min(self.now_ms));
        let end = ancestor.sealed.map(|s| s.length);
        let mut copy_whole = match store.info(id) {
            Ok(info) if info.lost.is_none() && end.is_none_or(|end| info.durable >= end) => true,
            Ok(info) => {
                warn!(segment = %id, durable = info.durable, seal = ?end, lost = info.lost.is_some(), "the copy is short of its seal; its producer table is read from a holder if one answers");
                false
            }
            Err(_) => false,
        };
        if scan_tags(self.storage, id, &mut table, seen_ms, end).is_err() {
            copy_whole = false;
        }
        if !copy_whole && ancestor.fetchable(self.storage.config.node_id) {
            self.wanted.insert(segment);
        }
        whole &= copy_whole;
        if whole && ancestor.sealed.is_some() {
            write_sidecar(self.storage, id, &table);
        }
        Built {
            table: Some(table),
            whole,
        }
    }
}

/// Writes `table` as `id`'s sidecar (kept by the store beside the copy),
/// atomically. A failure is logged: the
/// table is rebuilt the next time it is needed.
pub(crate) fn write_sidecar(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    table: &ProducerTable,
) {
    match storage
        .store
        .write_sidecar(id, &producers::encode_sidecar(table))
    {
        Ok(()) => debug!(segment = %id, "producer sidecar written"),
        // Expected on a full volume: the table is rebuilt when needed.
        Err(e) if e.is_no_space() => {
            info!(segment = %id, error = %e, "no room for the producer sidecar; it is rebuilt from the log when needed")
        }
        Err(e) => warn!(segment = %id, error = %e, "cannot write the producer sidecar"),
    }
}

/// `id`'s producer sidecar, `None` when it has none.
fn read_sidecar(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    limits: ProducerLimits,
) -> Result<Option<ProducerTable>, SidecarReadError> {
    let Some(bytes) = storage.store.read_sidecar(id)? else {
        return Ok(None);
    };
    Ok(Some(producers::decode_sidecar(&bytes, limits)?))
}

/// Why a producer sidecar held here could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SidecarReadError {
    #[error("cannot read the producer sidecar: {0}")]
    Read(#[from] malachi_storage::StorageError),
    #[error(transparent)]
    Decode(#[from] producers::SidecarError),
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
            observe_frame(id, &view, table, &mut starts, seen_ms);
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
    pub(crate) use crate::data::ancestors::*;
    use bytes::Bytes;
    use malachi_core::model::NodeId;

    use crate::data::producers::ProducerTag;
    use std::sync::Arc;

    use malachi_storage::{FileStore, Record, StoreConfig};
    use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER};

    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use crate::common::metrics::BrokerMetrics;

    pub(crate) const RANGE: RangeId = RangeId(10);
    pub(crate) const NOW: u64 = 1_000 * DAY_MS;
    pub(crate) const X: u64 = 1;
    pub(crate) const Y: u64 = 2;
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
        assert!(storage.store.read_sidecar(id).unwrap().is_none());
    }

    /// A sealed ancestor of `RANGE`.
    pub(crate) fn sealed(at_ms: u64, length: u64, predecessors: &[u64]) -> Ancestor {
        Ancestor {
            range: RANGE,
            sealed: Some(Sealed { at_ms, length }),
            predecessors: predecessors.iter().map(|s| SegmentId(*s)).collect(),
            holders: Vec::new(),
        }
    }

    /// Holders of segment copies, each a store of its own, as the cluster
    /// port's catch-up read serves them.
    #[derive(Debug, Default)]
    pub(crate) struct Holders {
        pub copies: BTreeMap<u64, Arc<Storage>>,
        /// Holders whose answers have a byte of their last frame flipped.
        pub corrupt: std::collections::BTreeSet<u64>,
        /// Every call, as (holder, from).
        pub calls: parking_lot::Mutex<Vec<(u64, u64)>>,
        /// Every ask for a sealed table, by holder.
        pub table_calls: parking_lot::Mutex<Vec<u64>>,
    }

    #[async_trait::async_trait]
    impl HolderReads for Holders {
        async fn read(
            &self,
            _topic: &str,
            segment: SegmentId,
            holder: NodeId,
            from: u64,
            bytes_max: u64,
        ) -> Result<(u64, Bytes), HolderReadError> {
            self.calls.lock().push((holder.0, from));
            let Some(copy) = self.copies.get(&holder.0) else {
                return Err(HolderReadError::Silent { node: holder.0 });
            };
            let run = copy
                .store
                .read_frames(
                    malachi_storage::SegmentId(segment.0),
                    from,
                    bytes_max as usize,
                )
                .map_err(|e| HolderReadError::Call(Box::new(e)))?;
            let mut bytes = run.bytes;
            if self.corrupt.contains(&holder.0) && !bytes.is_empty() {
                let last = bytes.len() - 3;
                bytes[last] ^= 0x40;
            }
            Ok((run.first, Bytes::from(bytes)))
        }

        async fn sealed_table(
            &self,
            _topic: &str,
            segment: SegmentId,
            holder: NodeId,
            length: u64,
        ) -> Result<Option<Vec<u8>>, HolderReadError> {
            self.table_calls.lock().push(holder.0);
            let Some(copy) = self.copies.get(&holder.0) else {
                return Err(HolderReadError::Silent { node: holder.0 });
            };
            // As `sealed_tables` answers for an open copy
            // (its own tests cover the rest).
            let id = malachi_storage::SegmentId(segment.0);
            let at_seal = copy.store.info(id).is_ok_and(|i| i.durable == length);
            Ok(at_seal
                .then(|| copy.store.read_sidecar(id).ok().flatten())
                .flatten())
        }
    }

    pub(crate) fn ancestry(direct: &[u64], segments: Vec<(u64, Ancestor)>) -> Ancestry {
        Ancestry::of(direct, segments)
    }

    /// A second broker's store holding segment 1 (X's batches 0..=2); this
    /// broker holds only segment 2 (Y's), the ancestry names broker 2 (and
    /// any of `others`) as 1's holders.
    pub(crate) fn a_predecessor_held_elsewhere(
        here: &std::path::Path,
        there: &std::path::Path,
        others: &[u64],
    ) -> (Arc<Storage>, Arc<Storage>, Ancestry) {
        let storage = storage(here);
        let holder = storage_of_node(there, 2);
        copy(&holder, 1, &[(X, 0), (X, 1), (X, 2)]);
        copy(&storage, 2, &[(Y, 0), (Y, 1)]);
        let mut first = sealed(NOW - 2 * 3_600_000, 3, &[]);
        first.holders = std::iter::once(2)
            .chain(others.iter().copied())
            .map(NodeId)
            .collect();
        let mut second = sealed(NOW - 3_600_000, 2, &[1]);
        second.holders = vec![NodeId(1)];
        (
            storage,
            holder,
            ancestry(&[2], vec![(1, first), (2, second)]),
        )
    }

    pub(crate) fn storage_of_node(dir: &std::path::Path, node_id: u64) -> Arc<Storage> {
        let store = Arc::new(
            malachi_storage::FileStore::open_dir(dir, malachi_storage::StoreConfig::default())
                .unwrap(),
        );
        let config = crate::common::config::BrokerConfig {
            node_id,
            producer_idle_expiry_ms: DAY_MS,
            ..crate::common::config::BrokerConfig::for_tests(dir)
        };
        Arc::new(Storage::new(
            config,
            store,
            Arc::new(crate::common::clock::SystemClock),
            Arc::new(crate::common::metrics::BrokerMetrics::new()),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use malachi_core::model::NodeId;
    use malachi_storage::frame::FrameError;
    use malachi_wire::replica_status::ScrubSeal;

    use super::fixture::*;
    use super::*;
    use crate::data::producers::Verdict;

    fn start(storage: &Storage, ancestry: &Ancestry) -> ProducerTable {
        Lineage::new(storage, "t", ancestry, NOW).start_table(RANGE)
    }

    fn has_sidecar(storage: &Storage, segment: u64) -> bool {
        storage
            .store
            .read_sidecar(malachi_storage::SegmentId(segment))
            .unwrap()
            .is_some()
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
        let log = format!("{}.log", malachi_storage::SegmentId(1).file_stem());
        std::fs::remove_file(dir.path().join(log)).unwrap();
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
        assert!(!storage.store.has_copy(malachi_storage::SegmentId(1)));
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

    /// The first pass, a fetch of what it wants from `holders`, and the
    /// second pass with what the fetch read.
    async fn start_through_holders(
        storage: &Storage,
        ancestry: &Ancestry,
        holders: &Holders,
    ) -> (Vec<SegmentId>, Result<ProducerTable, FetchError>) {
        let mut lineage = Lineage::new(storage, "t", ancestry, NOW);
        lineage.start_table(RANGE);
        let wanted = lineage.wanted();
        let mut fetched = Fetched::new();
        for (segment, ancestor) in &wanted {
            let limits = storage.config.producer_limits();
            match fetch_own_tags(holders, "t", 1, *segment, ancestor, limits, NOW).await {
                Ok(tags) => {
                    fetched.insert(*segment, FetchedTable::OwnTags(tags));
                }
                Err(e) => return (wanted.iter().map(|w| w.0).collect(), Err(e)),
            }
        }
        let table = Lineage::with_fetched(storage, "t", ancestry, &fetched, NOW).start_table(RANGE);
        (wanted.iter().map(|w| w.0).collect(), Ok(table))
    }

    #[tokio::test]
    async fn an_ancestor_with_no_copy_here_is_read_from_a_holder() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (storage, holder, ancestry) =
            a_predecessor_held_elsewhere(here.path(), there.path(), &[]);
        // Without the holder's copy X is unknown here: it must not start
        // afresh silently, so the first pass wants segment 1.
        let mut alone = Lineage::new(&storage, "t", &ancestry, NOW);
        let table = alone.start_table(RANGE);
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Unknown);
        assert_eq!(
            alone.wanted().iter().map(|w| w.0).collect::<Vec<_>>(),
            [SegmentId(1)]
        );
        let holders = Holders {
            copies: BTreeMap::from([(2, holder)]),
            ..Holders::default()
        };
        let (wanted, table) = start_through_holders(&storage, &ancestry, &holders).await;
        assert_eq!(wanted, [SegmentId(1)]);
        let table = table.unwrap();
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Append);
        assert_eq!(
            table.check(&tag(X, 2), 1),
            Verdict::Duplicate { records: 1 }
        );
        assert_eq!(table.check(&tag(Y, 2), 1), Verdict::Append);
        // Segment 2's table is whole now and written down; no copy of
        // segment 1 (nor a sidecar for it) was made here.
        assert!(has_sidecar(&storage, 2) && !has_sidecar(&storage, 1));
        assert!(!storage.store.has_copy(malachi_storage::SegmentId(1)));
    }

    /// ADR 0156: a whole copy here without a sidecar waits for the holders
    /// before it is scanned, unless nobody else holds it.
    #[test]
    fn a_copy_without_a_sidecar_is_scanned_after_the_holders_are_asked() {
        let here = tempfile::tempdir().unwrap();
        let storage = storage(here.path());
        copy(&storage, 1, &[(X, 0), (X, 1)]);
        let mut held = sealed(NOW - 3_600_000, 2, &[]);
        held.holders = vec![NodeId(1), NodeId(2)];
        let ancestry = ancestry(&[1], vec![(1, held.clone())]);
        let mut deferred =
            Lineage::new(&storage, "t", &ancestry, NOW).local_scans(LocalScans::AfterHolders);
        let table = deferred.start_table(RANGE);
        assert_eq!(
            deferred.wanted().iter().map(|w| w.0).collect::<Vec<_>>(),
            [SegmentId(1)]
        );
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Unknown);
        let mut now = Lineage::new(&storage, "t", &ancestry, NOW).local_scans(LocalScans::Now);
        let table = now.start_table(RANGE);
        assert!(now.wanted().is_empty());
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Append);
        // Held here alone: scanned at once whatever the mode.
        let mut alone_held = held;
        alone_held.holders = vec![NodeId(1)];
        let ancestry = super::fixture::ancestry(&[1], vec![(1, alone_held)]);
        let mut alone =
            Lineage::new(&storage, "t", &ancestry, NOW).local_scans(LocalScans::AfterHolders);
        let table = alone.start_table(RANGE);
        assert!(alone.wanted().is_empty());
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Append);
    }

    #[tokio::test]
    async fn no_holder_answering_is_an_error_and_never_a_fresh_start() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (storage, _holder, ancestry) =
            a_predecessor_held_elsewhere(here.path(), there.path(), &[3]);
        let holders = Holders::default();
        let (wanted, table) = start_through_holders(&storage, &ancestry, &holders).await;
        assert_eq!(wanted, [SegmentId(1)]);
        assert!(
            matches!(&table, Err(FetchError::NoHolder { segment: SegmentId(1), from: 0, holders, .. }) if holders == &[NodeId(2), NodeId(3)]),
            "{table:?}"
        );
        assert_eq!(*holders.calls.lock(), [(2, 0), (3, 0)]);
        // Nothing half-built was written down for the segment after it.
        assert!(!has_sidecar(&storage, 2));
    }

    #[tokio::test]
    async fn a_holder_with_bad_frames_is_passed_over_for_the_next() {
        let (here, there, third) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let (storage, holder, ancestry) =
            a_predecessor_held_elsewhere(here.path(), there.path(), &[3]);
        let good = storage_of_node(third.path(), 3);
        copy(&good, 1, &[(X, 0), (X, 1), (X, 2)]);
        let holders = Holders {
            copies: BTreeMap::from([(2, holder), (3, good)]),
            corrupt: [2].into(),
            ..Holders::default()
        };
        let (_, table) = start_through_holders(&storage, &ancestry, &holders).await;
        let table = table.unwrap();
        assert_eq!(
            table.check(&tag(X, 2), 1),
            Verdict::Duplicate { records: 1 }
        );
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Append);
        // Broker 2's first two frames were good: the read went on from the
        // bad one at broker 3.
        assert_eq!(*holders.calls.lock(), [(2, 0), (3, 2)]);
    }

    #[test]
    fn frames_past_the_seal_or_out_of_place_give_no_tags() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        copy(&storage, 1, &[(X, 0), (X, 1), (X, 2)]);
        let run = storage
            .store
            .read_frames(malachi_storage::SegmentId(1), 0, 1 << 20)
            .unwrap();
        let limits = storage.config.producer_limits();
        // Cut at a seal of 2: batch 2 is not the segment's.
        let mut table = ProducerTable::new(RANGE.0, limits);
        let (next, bad) = scan_frames(SegmentId(1), 0, 2, &run.bytes, &mut table, NOW);
        assert_eq!((next, bad), (2, None));
        assert_eq!(table.check(&tag(X, 2), 1), Verdict::Append);
        // Frames from 0 answered for offset 1: none is taken.
        let mut table = ProducerTable::new(RANGE.0, limits);
        let (next, bad) = scan_frames(SegmentId(1), 1, 3, &run.bytes, &mut table, NOW);
        assert_eq!(next, 1);
        assert!(matches!(
            bad,
            Some(FrameError::OffsetMismatch {
                found: 0,
                expected: 1
            })
        ));
        assert_eq!(table.check(&tag(X, 1), 1), Verdict::Unknown);
    }

    /// The holder's half: a copy that ends at the seal gives its sidecar,
    /// open or closed (its seal marker says the length); one that does not
    /// gives none.
    #[test]
    fn a_holder_gives_its_sidecar_only_for_a_copy_that_ends_at_the_seal() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        copy(&storage, 1, &[(X, 0), (X, 1), (X, 2)]);
        let id = malachi_storage::SegmentId(1);
        let table = ProducerTable::new(RANGE.0, storage.config.producer_limits());
        crate::data::lineage::write_sidecar(&storage, id, &table);
        let asked = |length| ScrubSeal {
            segment: 1,
            length,
            bytes: 0,
        };
        let answers = sealed_tables(storage.store.as_ref(), &[asked(3), asked(2), asked(4)]);
        let given: Vec<bool> = answers.iter().map(|a| !a.sidecar.is_empty()).collect();
        assert_eq!(given, [true, false, false]);
        // Closed, with a seal marker at 3.
        storage.store.seal(id, 3).unwrap();
        storage.store.close(id).unwrap();
        let answers = sealed_tables(storage.store.as_ref(), &[asked(3), asked(2)]);
        let given: Vec<bool> = answers.iter().map(|a| !a.sidecar.is_empty()).collect();
        assert_eq!(given, [true, false]);
        // No copy at all: nothing.
        assert!(
            sealed_tables(
                storage.store.as_ref(),
                &[ScrubSeal {
                    segment: 9,
                    ..asked(3)
                }]
            )[0]
            .sidecar
            .is_empty()
        );
    }

    /// ADR 0156: a holder's sidecar at the seal stands in for the log.
    #[tokio::test]
    async fn an_ancestor_a_holder_has_a_sealed_table_of_is_not_read_from_its_log() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (storage, holder, ancestry) =
            a_predecessor_held_elsewhere(here.path(), there.path(), &[]);
        let id = malachi_storage::SegmentId(1);
        let limits = storage.config.producer_limits();
        let mut final_table = ProducerTable::new(RANGE.0, limits);
        scan_tags(&holder, id, &mut final_table, NOW, Some(3)).unwrap();
        write_sidecar(&holder, id, &final_table);
        let holders = Holders {
            copies: BTreeMap::from([(2, holder)]),
            ..Holders::default()
        };
        let first = &ancestry.segments[&SegmentId(1)];
        let table = fetch_sealed_table(&holders, "t", 1, SegmentId(1), first, limits)
            .await
            .expect("the holder's copy ends at the seal and has a sidecar");
        let mut fetched = Fetched::new();
        fetched.insert(SegmentId(1), FetchedTable::Final(table));
        let mut lineage = Lineage::with_fetched(&storage, "t", &ancestry, &fetched, NOW);
        let table = lineage.start_table(RANGE);
        assert!(lineage.wanted().is_empty());
        assert_eq!(table.check(&tag(X, 3), 1), Verdict::Append);
        assert_eq!(
            table.check(&tag(X, 2), 1),
            Verdict::Duplicate { records: 1 }
        );
        assert_eq!(table.check(&tag(Y, 2), 1), Verdict::Append);
        assert!(holders.calls.lock().is_empty(), "no frame was read");
        // A copy that does not end at the seal asked gives no table: its
        // sidecar could speak for records past the seal.
        let mut shorter = first.clone();
        shorter.sealed = Some(Sealed {
            at_ms: NOW - 1,
            length: 2,
        });
        assert!(
            fetch_sealed_table(&holders, "t", 1, SegmentId(1), &shorter, limits)
                .await
                .is_none()
        );
        assert_eq!(*holders.table_calls.lock(), [2, 2]);
    }
}
