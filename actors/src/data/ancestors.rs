//! What an opening segment's producer table descends from (ADR 0092, ADR
//! 0119), and reading those ancestors from the brokers that hold them
//! (ADR 0124, ADR 0156).
//!
//! The control plane hands an opening segment its [`Ancestry`]: each
//! ancestor's range, seal, predecessors and holders. `lineage.rs` rebuilds
//! the final tables from this broker's copies; what it cannot read here is
//! read from a live holder through [`HolderReads`]: first the holder's
//! sidecar at the seal ([`fetch_sealed_table`]), a few KiB that speak for
//! the ancestor and everything before it, then, when no holder has one,
//! the ancestor's frames up to the seal ([`fetch_own_tags`]). The holder's
//! half of the sidecar ask is [`sealed_tables`].
//!
//! Nothing here touches this broker's segment actors or its `Storage`
//! context: the file sits below `lineage.rs` and `segment.rs`, which both
//! name it.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use malachi_core::model::{NodeId, RangeId, SegmentId};
use malachi_storage::SegmentStore;
use malachi_storage::frame::FrameError;
use malachi_wire::replica_status::{PRODUCER_TABLE_BYTES_MAX, ScrubSeal, SealedProducers};
use tracing::{debug, warn};

use super::producers::{self, ProducerLimits, ProducerTable, ProducerTag};

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
    pub(crate) fn fetchable(&self, me: u64) -> bool {
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

/// What was read of ancestors from their holders.
pub(crate) type Fetched = BTreeMap<SegmentId, FetchedTable>;

/// One ancestor as read from a holder.
#[derive(Debug, Clone)]
pub(crate) enum FetchedTable {
    /// The tags of its log ([`fetch_own_tags`]), as a table of its own
    /// range's stream: its predecessors' tables are still inherited first.
    OwnTags(ProducerTable),
    /// Its final table, the sidecar a holder wrote at its seal
    /// (`fetch_sealed_table`, ADR 0156): it speaks for its predecessors too.
    Final(ProducerTable),
}

/// Applies one frame's producer tag to `table` and its batch-start marker
/// to `starts`: the one reading of a log's tags, local or a holder's.
pub(crate) fn observe_frame(
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

    /// `holder`'s producer sidecar of sealed `segment` of `topic`, as its
    /// disk holds it, when its copy ends exactly at the seal of `length`
    /// records (ADR 0156); `Ok(None)` when it has none to give. The
    /// control plane asks with replica-status; a holder that predates the
    /// ask answers none.
    async fn sealed_table(
        &self,
        _topic: &str,
        _segment: SegmentId,
        _holder: NodeId,
        _length: u64,
    ) -> Result<Option<Vec<u8>>, HolderReadError> {
        Ok(None)
    }

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

/// The holders of `ancestor` worth asking: other brokers membership does
/// not call dead, at most [`HOLDERS_TRIED_MAX`] of them.
pub(crate) fn live_holders(reads: &dyn HolderReads, ancestor: &Ancestor, me: u64) -> Vec<NodeId> {
    ancestor
        .holders
        .iter()
        .copied()
        .filter(|h| h.0 != me && reads.live(*h))
        .take(HOLDERS_TRIED_MAX)
        .collect()
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
    let holders = live_holders(reads, ancestor, me);
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

// ------------------------------------- sealed tables read from holders

// A sealed ancestor's final producer table read from a holder's sidecar
// (ADR 0156), before its whole log is.
//
// A segment that opens on a broker with no whole copy of a predecessor
// (a split child placed on another broker, a follower short of the seal)
// used to read the predecessor's whole log from a holder to take its tags
// (ADR 0124): a 256 MiB segment is 256 catch-up reads, during which the
// range refuses idempotent batches. The broker that sealed the
// predecessor wrote its final table as a sidecar before the seal could
// commit, so asking for that (a few KiB, with replica-status) comes first;
// the log is read only when no holder has one.
//
// A holder gives its sidecar only for a copy that ends exactly at the seal
// asked: an open copy whose durable end is the seal, or a closed one whose
// seal marker records it. Both ends were written after everything before
// the fence was durable and held by a quorum, so the table speaks for
// exactly the sealed records.

/// The holder's half: for each seal asked, this broker's sidecar of that
/// copy when the copy ends exactly there (empty otherwise).
pub(crate) fn sealed_tables(store: &dyn SegmentStore, seals: &[ScrubSeal]) -> Vec<SealedProducers> {
    seals
        .iter()
        .map(|seal| SealedProducers {
            segment: seal.segment,
            sidecar: sidecar_at_seal(store, seal.segment, seal.length).unwrap_or_default(),
        })
        .collect()
}

fn sidecar_at_seal(store: &dyn SegmentStore, segment: u64, length: u64) -> Option<Vec<u8>> {
    let id = malachi_storage::SegmentId(segment);
    let at_seal = match store.info(id) {
        Ok(info) => info.lost.is_none() && !info.failed && info.durable == length,
        Err(_) => store
            .seal_at_rest(id)
            .ok()
            .flatten()
            .is_some_and(|seal| seal.length == length),
    };
    if !at_seal {
        debug!(
            segment,
            length, "no copy here ends at the seal asked; no producer table given"
        );
        return None;
    }
    let sidecar = store.read_sidecar(id).ok().flatten()?;
    (sidecar.len() <= PRODUCER_TABLE_BYTES_MAX).then_some(sidecar)
}

/// The asker's half: `segment`'s final table from the first of its live
/// holders (other than `me`) that gives one whose sidecar decodes and is
/// of the ancestor's range. `None`: no holder gave one.
pub(crate) async fn fetch_sealed_table(
    reads: &dyn HolderReads,
    topic: &str,
    me: u64,
    segment: SegmentId,
    ancestor: &Ancestor,
    limits: ProducerLimits,
) -> Option<ProducerTable> {
    let sealed = ancestor.sealed?;
    for holder in live_holders(reads, ancestor, me) {
        match reads
            .sealed_table(topic, segment, holder, sealed.length)
            .await
        {
            Ok(Some(bytes)) => match decode(&bytes, ancestor, limits) {
                Ok(table) => return Some(table),
                Err(reason) => {
                    warn!(segment = segment.0, holder = holder.0, %reason, "a holder's producer table does not decode; asking another")
                }
            },
            Ok(None) => {
                debug!(
                    segment = segment.0,
                    holder = holder.0,
                    "the holder has no producer table at the seal"
                )
            }
            Err(e) => {
                debug!(segment = segment.0, holder = holder.0, error = %e, "a holder did not answer for its producer table")
            }
        }
    }
    None
}

fn decode(
    bytes: &[u8],
    ancestor: &Ancestor,
    limits: ProducerLimits,
) -> Result<ProducerTable, String> {
    let table = producers::decode_sidecar(bytes, limits).map_err(|e| e.to_string())?;
    if table.own_range() != ancestor.range.0 {
        return Err(format!(
            "the table is of range {}, not {}",
            table.own_range(),
            ancestor.range.0
        ));
    }
    Ok(table)
}

/// Of `wanted`, those still needed given `fetched`, nearest first (in
/// breadth-first order from the opening segment's direct predecessors):
/// reachable from those without passing through an ancestor whose final
/// table was fetched (it speaks for everything before it), and not fetched
/// themselves.
pub(crate) fn still_wanted(
    ancestry: &Ancestry,
    wanted: &[(SegmentId, Ancestor)],
    fetched: &Fetched,
) -> Vec<(SegmentId, Ancestor)> {
    let mut reached = BTreeSet::new();
    let mut order = Vec::new();
    let mut next: std::collections::VecDeque<SegmentId> = ancestry.direct.iter().copied().collect();
    while let Some(segment) = next.pop_front() {
        if !reached.insert(segment) {
            continue;
        }
        order.push(segment);
        if let Some(FetchedTable::Final(_)) = fetched.get(&segment) {
            continue;
        }
        if let Some(ancestor) = ancestry.segments.get(&segment) {
            next.extend(ancestor.predecessors.iter().copied());
        }
    }
    debug_assert!(
        reached.len() <= ancestry.segments.len() + ancestry.direct.len(),
        "the walk visits each ancestor at most once"
    );
    order
        .into_iter()
        .filter(|segment| !fetched.contains_key(segment))
        .filter_map(|segment| wanted.iter().find(|(s, _)| *s == segment).cloned())
        .collect()
}

#[cfg(test)]
impl Ancestry {
    /// An ancestry of `direct` predecessors over `segments`, by id.
    pub(crate) fn of(direct: &[u64], segments: Vec<(u64, Ancestor)>) -> Ancestry {
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
    use super::*;

    /// The wanted ancestors by id.
    fn ids(wanted: &[(SegmentId, Ancestor)]) -> Vec<u64> {
        wanted.iter().map(|(s, _)| s.0).collect()
    }

    fn ancestor(predecessors: &[u64]) -> Ancestor {
        Ancestor {
            range: RangeId(7),
            sealed: Some(Sealed {
                at_ms: 1,
                length: 4,
            }),
            predecessors: predecessors.iter().map(|s| SegmentId(*s)).collect(),
            holders: vec![NodeId(1), NodeId(2), NodeId(3), NodeId(4)],
        }
    }

    #[derive(Debug)]
    struct NoneDead(Vec<u64>);

    #[async_trait::async_trait]
    impl HolderReads for NoneDead {
        async fn read(
            &self,
            _: &str,
            _: SegmentId,
            holder: NodeId,
            _: u64,
            _: u64,
        ) -> Result<(u64, Bytes), HolderReadError> {
            Err(HolderReadError::Silent { node: holder.0 })
        }

        fn live(&self, holder: NodeId) -> bool {
            !self.0.contains(&holder.0)
        }
    }

    #[test]
    fn the_live_holders_are_others_than_me_at_most_three() {
        let reads = NoneDead(vec![3]);
        assert_eq!(
            live_holders(&reads, &ancestor(&[]), 1),
            [NodeId(2), NodeId(4)]
        );
        let all = NoneDead(Vec::new());
        assert_eq!(
            live_holders(&all, &ancestor(&[]), 9),
            [NodeId(1), NodeId(2), NodeId(3)]
        );
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

    #[test]
    fn a_fetched_final_table_prunes_the_ancestors_behind_it() {
        // 3 <- 2 <- 1, and 4 <- 1 as well (a merge's two parents).
        let ancestry = Ancestry::of(
            &[3, 4],
            vec![
                (1, ancestor(&[])),
                (2, ancestor(&[1])),
                (3, ancestor(&[2])),
                (4, ancestor(&[1])),
            ],
        );
        let wanted: Vec<_> = [1u64, 2, 3]
            .iter()
            .map(|s| (SegmentId(*s), ancestry.segments[&SegmentId(*s)].clone()))
            .collect();
        let mut fetched = Fetched::new();
        // Nearest first.
        assert_eq!(ids(&still_wanted(&ancestry, &wanted, &fetched)), [3, 2, 1]);
        let empty = ProducerTable::new(
            7,
            crate::common::config::BrokerConfig::default().producer_limits(),
        );
        fetched.insert(SegmentId(3), FetchedTable::Final(empty.clone()));
        // 2 is behind 3 only; 1 is still reached through 4.
        assert_eq!(ids(&still_wanted(&ancestry, &wanted, &fetched)), [1]);
        fetched.insert(SegmentId(4), FetchedTable::Final(empty.clone()));
        assert!(still_wanted(&ancestry, &wanted, &fetched).is_empty());
        // Own tags speak only for the segment itself.
        let mut tags = Fetched::new();
        tags.insert(SegmentId(3), FetchedTable::OwnTags(empty));
        assert_eq!(ids(&still_wanted(&ancestry, &wanted, &tags)), [2, 1]);
    }
}
