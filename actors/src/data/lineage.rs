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
//!
//! An ancestor this broker holds no copy of (or a copy short of its seal,
//! or one it cannot read to the end) is read from a live holder's copy
//! instead (ADR 0124): the first pass ([`Lineage::start_table`]) names it
//! in [`Lineage::wanted`], [`fetch_own_tags`] reads its frames up to the
//! seal from a holder with the cluster port's catch-up read and takes
//! their tags exactly as the local scan does, and a second pass, given
//! those tags, inherits through it as through a local copy. The segment
//! takes no idempotent batch until then (`segment.rs`).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use malachi_core::model::{NodeId, RangeId, SegmentId};
use malachi_storage::frame::FrameError;
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
    /// The brokers the metadata records as holding a copy: where its
    /// frames are read from when this broker has no whole copy.
    pub holders: Vec<NodeId>,
}

impl Ancestor {
    /// Whether a holder's copy can stand in for this broker's: the segment
    /// is sealed (its frames are cut at the seal) and another broker holds
    /// it.
    fn fetchable(&self, me: u64) -> bool {
        self.sealed.is_some() && self.holders.iter().any(|h| h.0 != me)
    }
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

/// The tags of ancestors' logs read from their holders ([`fetch_own_tags`]),
/// each as a table of its own range's stream.
pub(crate) type Fetched = BTreeMap<SegmentId, ProducerTable>;

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
        if let Some(own) = self.fetched.get(&segment) {
            // Its log's tags, read from a holder's copy up to the seal.
            let (mut table, whole) = self.inherited(ancestor, depth);
            own.replay_into(&mut table);
            return Built {
                table: Some(table),
                whole,
            };
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

/// Applies one frame's producer tag to `table` and its batch-start marker
/// to `starts`: the one reading of a log's tags, local or a holder's.
fn observe_frame(
    id: malachi_storage::SegmentId,
    view: &malachi_storage::FrameView<'_>,
    table: &mut ProducerTable,
    starts: &mut producers::BatchStarts,
    seen_ms: u64,
) {
    use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER};
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
}

// ------------------------------------------------- ancestors read from holders

/// Frame bytes asked of a holder per call (the catch-up read's own bound).
pub(crate) const HOLDER_READ_BYTES_MAX: u64 = malachi_wire::replica_order::CATCH_UP_BYTES_MAX;
/// Holders of one ancestor asked at most, per run of its frames.
pub(crate) const HOLDERS_TRIED_MAX: usize = 3;

/// How a segment reads a sealed ancestor's frames from a broker holding a
/// copy: the control plane implements it with the cluster port's catch-up
/// read (`control::replica_order::OrderClient`), each call within its own
/// timeout; a test gives any other.
#[async_trait::async_trait]
pub(crate) trait HolderReads: Send + Sync + std::fmt::Debug {
    /// A run of whole frames of `segment` of `topic` from `holder`'s copy,
    /// starting at offset `from` and about `bytes_max` long: the offset
    /// its first frame carries, and the frames.
    async fn read(
        &self,
        topic: &str,
        segment: SegmentId,
        holder: NodeId,
        from: u64,
        bytes_max: u64,
    ) -> Result<(u64, Bytes), HolderReadError>;

    /// Whether `holder` is worth asking (membership does not call it dead).
    fn live(&self, _holder: NodeId) -> bool {
        true
    }
}

/// Why a holder did not answer a read of its copy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HolderReadError {
    /// The read or its answer was not carried (the order client's error,
    /// kept whole: it names the peer).
    #[error(transparent)]
    Call(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The holder's copy refused the read; `message` is its reason.
    #[error("broker {node} refused the read ({refusal:?}): {message}")]
    Refused {
        node: u64,
        refusal: malachi_wire::replica_order::OrderRefusal,
        message: String,
    },
    /// The holder has no copy to read from (a test's holder).
    #[cfg(test)]
    #[error("broker {node} does not answer")]
    Silent { node: u64 },
}

/// Why an ancestor's tags could not be read from its holders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("segment {segment} is not sealed in the ancestry: no seal to read up to")]
    NotSealed { segment: SegmentId },
    #[error(
        "segment {segment}: no holder of {holders:?} answered with good frames from offset {from} (last: {last})"
    )]
    NoHolder {
        segment: SegmentId,
        holders: Vec<NodeId>,
        from: u64,
        last: String,
    },
}

/// The tags of sealed `segment`'s log, read from its live holders' copies
/// up to its seal, as a table of its range's stream seen at its seal
/// ([`ProducerTable::replay_into`] applies it). Each run of frames is
/// checked (CRC, consecutive offsets) as it is scanned; a holder that
/// refuses, answers from another offset or sends a bad frame is passed
/// over for the next, at most [`HOLDERS_TRIED_MAX`] of them per run. Every
/// answer moves the read on by at least one record, so at most the seal's
/// length of calls are made, each bounded by the reader's timeout.
pub(crate) async fn fetch_own_tags(
    reads: &dyn HolderReads,
    topic: &str,
    me: u64,
    segment: SegmentId,
    ancestor: &Ancestor,
    limits: ProducerLimits,
    now_ms: u64,
) -> Result<ProducerTable, FetchError> {
    let sealed = ancestor.sealed.ok_or(FetchError::NotSealed { segment })?;
    let seen_ms = sealed.at_ms.min(now_ms);
    let mut table = ProducerTable::new(ancestor.range.0, limits);
    let holders: Vec<NodeId> = ancestor
        .holders
        .iter()
        .copied()
        .filter(|h| h.0 != me && reads.live(*h))
        .take(HOLDERS_TRIED_MAX)
        .collect();
    let (mut from, mut first_holder) = (0u64, 0usize);
    let mut last = String::from("no live holder");
    while from < sealed.length {
        let mut moved = false;
        for i in 0..holders.len() {
            let holder = holders[(first_holder + i) % holders.len()];
            let (first, frames) = match reads
                .read(topic, segment, holder, from, HOLDER_READ_BYTES_MAX)
                .await
            {
                Ok(answer) => answer,
                Err(e) => {
                    debug!(segment = segment.0, holder = holder.0, from, error = %e, "a holder did not answer for the producer state");
                    last = e.to_string();
                    continue;
                }
            };
            if first != from {
                last = format!("broker {holder} answered from offset {first}");
                continue;
            }
            let (next, bad) =
                scan_frames(segment, from, sealed.length, &frames, &mut table, seen_ms);
            if let Some(bad) = &bad {
                warn!(segment = segment.0, holder = holder.0, offset = next, error = %bad, "a holder's frame for the producer state is bad; reading on from another");
                last = bad.to_string();
            }
            if next > from {
                from = next;
                moved = true;
                // A holder that sent a bad frame is asked last next time.
                first_holder = (first_holder + i + usize::from(bad.is_some())) % holders.len();
                break;
            }
        }
        if !moved {
            return Err(FetchError::NoHolder {
                segment,
                holders,
                from,
                last,
            });
        }
    }
    Ok(table)
}

/// Applies the tags of the frames in `frames` (a holder's answer from
/// segment offset `first`) to `table`, up to offset `seal_length`. Returns
/// the offset after the last good frame, and why the next one is bad if a
/// frame before the seal does not decode, fails its CRC or carries another
/// offset than its place requires (its tags and every later frame's are
/// not taken).
pub(crate) fn scan_frames(
    segment: SegmentId,
    first: u64,
    seal_length: u64,
    frames: &[u8],
    table: &mut ProducerTable,
    seen_ms: u64,
) -> (u64, Option<FrameError>) {
    let id = malachi_storage::SegmentId(segment.0);
    let mut starts = producers::BatchStarts::default();
    let (mut at, mut offset) = (0usize, first);
    while at < frames.len() && offset < seal_length {
        let rest = frames.get(at..).unwrap_or_default();
        let (view, len) = match malachi_storage::frame::decode(rest) {
            Ok(decoded) => decoded,
            Err(e) => return (offset, Some(e)),
        };
        if view.offset != offset {
            let mismatch = FrameError::OffsetMismatch {
                found: view.offset,
                expected: offset,
            };
            return (offset, Some(mismatch));
        }
        observe_frame(id, &view, table, &mut starts, seen_ms);
        at += len;
        offset += 1;
    }
    (offset, None)
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
    use std::sync::Arc;

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

    /// A second broker's store holding segment 1 (X's batches 0..=2); this
    /// broker holds only segment 2 (Y's), the ancestry names broker 2 (and
    /// any of `others`) as 1's holders.
    fn a_predecessor_held_elsewhere(
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

    fn storage_of_node(dir: &std::path::Path, node_id: u64) -> Arc<Storage> {
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
                    fetched.insert(*segment, tags);
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

    #[test]
    fn a_holder_read_error_names_the_broker_and_its_refusal() {
        let refused = HolderReadError::Refused {
            node: 1,
            refusal: malachi_wire::replica_order::OrderRefusal::Short,
            message: "ends at 4".into(),
        };
        assert_eq!(
            refused.to_string(),
            "broker 1 refused the read (Short): ends at 4"
        );
        let silent = HolderReadError::Silent { node: 2 };
        assert_eq!(silent.to_string(), "broker 2 does not answer");
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
}
