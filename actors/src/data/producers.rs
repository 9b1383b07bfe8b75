//! The idempotent producers' state of one range (ADR 0092): for each
//! producer id, its newest epoch and the last batch sequence the range
//! stored, so a retry is answered with its original acknowledgement instead
//! of being written twice, a batch that skips one is refused, and a zombie
//! session (an older epoch) is fenced.
//!
//! The state is a pure function of the log: every idempotent batch carries
//! its [`ProducerTag`] in a reserved header of its last record, so a copy's
//! state is rebuilt by scanning it ([`ProducerTable::observe`]), and a
//! replicated copy carries it with the records (`shared/design/
//! replication.md`, invariant 8). A sealed segment leaves its final table in
//! a checksummed sidecar (`<segment>.producers`, [`encode_sidecar`]) for its
//! successors: the next segment of its range after a roll, or the children
//! of a split and the range of a merge, which keep it as the state of an
//! *ancestor stream* and use it only to recognise retries addressed to the
//! ancestor. Decisions here take the time as an argument: no clock, no I/O.

use std::collections::{BTreeMap, BTreeSet};

/// Bytes of an encoded [`ProducerTag`].
pub(crate) const TAG_BYTES: usize = 36;

/// What an idempotent batch carries into the log with its last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerTag {
    pub producer_id: u64,
    pub epoch: u64,
    /// The range whose sequence this is (the stream): the segment's own
    /// range for every batch its log holds.
    pub range: u64,
    pub sequence: u64,
    /// Records in the batch (the tag rides on the last one).
    pub records: u32,
}

impl ProducerTag {
    /// `producer_id | epoch | range | sequence | records`, little-endian.
    pub(crate) fn encode(&self) -> [u8; TAG_BYTES] {
        let mut out = [0u8; TAG_BYTES];
        out[0..8].copy_from_slice(&self.producer_id.to_le_bytes());
        out[8..16].copy_from_slice(&self.epoch.to_le_bytes());
        out[16..24].copy_from_slice(&self.range.to_le_bytes());
        out[24..32].copy_from_slice(&self.sequence.to_le_bytes());
        out[32..36].copy_from_slice(&self.records.to_le_bytes());
        out
    }

    /// The tag in `bytes` (read from a log: untrusted), if it is one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<ProducerTag> {
        if bytes.len() != TAG_BYTES {
            return None;
        }
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let mut records = [0u8; 4];
        records.copy_from_slice(&bytes[32..36]);
        Some(ProducerTag {
            producer_id: u64_at(0),
            epoch: u64_at(8),
            range: u64_at(16),
            sequence: u64_at(24),
            records: u32::from_le_bytes(records),
        })
    }
}

/// The value of the marker on an idempotent batch's first record
/// (`PRODUCER_START_HEADER`): the batch's record count, little-endian.
pub(crate) fn encode_start(records: u32) -> [u8; 4] {
    records.to_le_bytes()
}

/// The record count in a start marker (read from a log: untrusted).
pub(crate) fn decode_start(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Follows the start markers of the idempotent batches in a log, in offset
/// order, to tell whether the log ends inside one. A batch is one append,
/// its offsets contiguous, and a flush writes whole batches with one write:
/// only a crash during that write (a `kill -9` can stop a `write` part way,
/// a power loss can persist any of its pages) leaves a prefix of a batch
/// without the last record that carries its tag. Kept, that prefix would be
/// stored a second time by the batch's retry, which the table, seeing no
/// tag, must accept; none of its records was acknowledged (the write was
/// never synced), so recovery cuts it instead.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchStarts {
    /// The last start marker seen: its offset and the batch's record count.
    last: Option<(u64, u32)>,
}

impl BatchStarts {
    /// A start marker on the record at `offset` of a batch of `records`.
    pub(crate) fn observe(&mut self, offset: u64, records: u32) {
        self.last = Some((offset, records));
    }

    /// For a log of `end` records: the offset of the batch the end falls
    /// inside (where the log must be cut), if it does.
    pub(crate) fn torn(&self, end: u64) -> Option<u64> {
        let (start, records) = self.last?;
        (start < end && start.saturating_add(u64::from(records)) > end).then_some(start)
    }
}

pub(crate) use crate::common::config::ProducerLimits;

/// Ancestor-stream entries a table keeps, across all its ancestors.
fn inherited_max(limits: &ProducerLimits) -> usize {
    limits.producers_max.saturating_mul(4)
}

/// One producer's state in one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub epoch: u64,
    pub last_sequence: u64,
    /// Records of the batch at `last_sequence` (a retry of it must match).
    pub last_records: u32,
    pub last_seen_ms: u64,
}

/// What the range does with a tagged batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The next batch of its stream: append it, then [`ProducerTable::record`].
    Append,
    /// Already stored: answer with the original acknowledgement.
    Duplicate { records: u32 },
    /// A newer epoch of the producer has written here.
    Fenced { current_epoch: u64 },
    /// The sequence skips `expected`.
    Gap { expected: u64 },
    /// No state for the producer in the stream and the sequence is not 0
    /// (or a new epoch that does not start at 0).
    Unknown,
    /// The sequence was stored with another number of records.
    Conflict { stored: u32 },
    /// Addressed to an ancestor stream and not stored there: the ancestor is
    /// sealed, so it never will be; the records belong to its successors.
    Moved,
}

/// The state of one range's producers: its own stream and, read-only, the
/// streams of the ancestors it inherited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducerTable {
    own_range: u64,
    limits: ProducerLimits,
    /// (stream range, producer id) to state.
    streams: BTreeMap<(u64, u64), Entry>,
    /// Ancestor ranges whose final state this table holds (even with no entry).
    ancestors: BTreeSet<u64>,
}

/// Ancestor ranges a table remembers; older ones are forgotten first.
const ANCESTORS_MAX: usize = 64;

impl ProducerTable {
    pub(crate) fn new(own_range: u64, limits: ProducerLimits) -> ProducerTable {
        ProducerTable {
            own_range,
            limits,
            streams: BTreeMap::new(),
            ancestors: BTreeSet::new(),
        }
    }

    /// The range whose stream this table is the table of.
    pub(crate) fn own_range(&self) -> u64 {
        self.own_range
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    /// The newest epoch any stream has seen for `producer_id`.
    fn newest_epoch(&self, producer_id: u64) -> Option<u64> {
        std::iter::once(self.own_range)
            .chain(self.ancestors.iter().copied())
            .filter_map(|range| self.streams.get(&(range, producer_id)))
            .map(|e| e.epoch)
            .max()
    }

    /// What to do with a batch of `records` tagged `tag` (whose `records`
    /// field is ignored here: `records` is what arrived).
    pub(crate) fn check(&self, tag: &ProducerTag, records: u32) -> Verdict {
        if let Some(current_epoch) = self.newest_epoch(tag.producer_id)
            && tag.epoch < current_epoch
        {
            return Verdict::Fenced { current_epoch };
        }
        let entry = self.streams.get(&(tag.range, tag.producer_id));
        if tag.range != self.own_range {
            return match entry {
                Some(e) if e.epoch == tag.epoch && tag.sequence <= e.last_sequence => {
                    duplicate(e, tag.sequence, records)
                }
                // Sequence 0 never stored leaves no entry; anything later
                // with no entry may have been forgotten: say so.
                None if tag.sequence > 0 => Verdict::Unknown,
                _ if self.ancestors.contains(&tag.range) => Verdict::Moved,
                _ => Verdict::Unknown,
            };
        }
        match entry {
            None => {
                if tag.sequence == 0 {
                    Verdict::Append
                } else {
                    Verdict::Unknown
                }
            }
            Some(e) if tag.epoch > e.epoch => {
                if tag.sequence == 0 {
                    Verdict::Append
                } else {
                    Verdict::Unknown
                }
            }
            Some(e) => {
                let expected = e.last_sequence.saturating_add(1);
                if tag.sequence == expected {
                    Verdict::Append
                } else if tag.sequence < expected {
                    duplicate(e, tag.sequence, records)
                } else {
                    Verdict::Gap { expected }
                }
            }
        }
    }

    /// Records a batch the range accepted (after [`Self::check`] said
    /// `Append`) or found in its log ([`Self::observe`]).
    pub(crate) fn record(&mut self, tag: &ProducerTag, now_ms: u64) {
        self.streams.insert(
            (tag.range, tag.producer_id),
            Entry {
                epoch: tag.epoch,
                last_sequence: tag.sequence,
                last_records: tag.records,
                last_seen_ms: now_ms,
            },
        );
        self.bound(now_ms);
    }

    /// Applies a tag read back from the range's own log (recovery). A tag of
    /// another stream in this log is damage and is ignored.
    pub(crate) fn observe(&mut self, tag: &ProducerTag, now_ms: u64) -> bool {
        if tag.range != self.own_range {
            return false;
        }
        self.record(tag, now_ms);
        true
    }

    /// Records every entry of this table's own stream in `table`, as if
    /// the tags they came from were observed there: `self` holds the tags
    /// of one segment's log (the last of each producer, which is what
    /// observing them all in order leaves), read from a holder's copy.
    pub(crate) fn replay_into(&self, table: &mut ProducerTable) {
        for ((range, producer_id), e) in &self.streams {
            if *range != self.own_range {
                continue;
            }
            let tag = ProducerTag {
                producer_id: *producer_id,
                epoch: e.epoch,
                range: *range,
                sequence: e.last_sequence,
                records: e.last_records,
            };
            table.observe(&tag, e.last_seen_ms);
        }
    }

    /// Forgets producers idle past the expiry, then the least recently seen
    /// beyond the count bounds.
    fn bound(&mut self, now_ms: u64) {
        let expiry = self.limits.idle_expiry_ms;
        self.streams
            .retain(|_, e| now_ms.saturating_sub(e.last_seen_ms) < expiry);
        let own = self.own_range;
        let own_count = self.streams.keys().filter(|(r, _)| *r == own).count();
        let inherited_count = self.streams.len() - own_count;
        self.evict(
            |range| range == own,
            own_count.saturating_sub(self.limits.producers_max),
        );
        self.evict(
            |range| range != own,
            inherited_count.saturating_sub(inherited_max(&self.limits)),
        );
    }

    fn evict(&mut self, in_scope: impl Fn(u64) -> bool, count: usize) {
        if count == 0 {
            return;
        }
        let mut victims: Vec<((u64, u64), u64)> = self
            .streams
            .iter()
            .filter(|((range, _), _)| in_scope(*range))
            .map(|(key, e)| (*key, e.last_seen_ms))
            .collect();
        victims.sort_by_key(|(key, seen)| (*seen, *key));
        for (key, _) in victims.into_iter().take(count) {
            self.streams.remove(&key);
        }
    }

    /// The table a successor starts from. For the next segment of the same
    /// range (a roll) the table carries on as it is; for a child of a split
    /// or the range of a merge, every stream of `self` becomes an ancestor
    /// stream of `child`.
    pub(crate) fn inherit_into(&self, successor: &mut ProducerTable, now_ms: u64) {
        if successor.own_range != self.own_range {
            successor.ancestors.insert(self.own_range);
        }
        successor.ancestors.extend(self.ancestors.iter().copied());
        while successor.ancestors.len() > ANCESTORS_MAX {
            successor.ancestors.pop_first();
        }
        for (key, entry) in &self.streams {
            successor
                .streams
                .entry(*key)
                .and_modify(|mine| {
                    if (entry.epoch, entry.last_sequence) > (mine.epoch, mine.last_sequence) {
                        *mine = *entry;
                    }
                })
                .or_insert(*entry);
        }
        successor.streams.retain(|(range, _), _| {
            *range == successor.own_range || successor.ancestors.contains(range)
        });
        successor.bound(now_ms);
    }
}

fn duplicate(entry: &Entry, sequence: u64, records: u32) -> Verdict {
    if sequence == entry.last_sequence && records != entry.last_records {
        return Verdict::Conflict {
            stored: entry.last_records,
        };
    }
    Verdict::Duplicate { records }
}

// ---------------------------------------------------------------- sidecar

/// The sidecar's first bytes.
pub(crate) const SIDECAR_MAGIC: [u8; 4] = *b"MLPS";
const SIDECAR_VERSION: u8 = 1;
/// magic, version, 3 reserved bytes, crc32, body length.
const SIDECAR_HEADER_BYTES: usize = 4 + 1 + 3 + 4 + 4;
/// One stream entry: range, producer id, epoch, sequence, records, seen.
const SIDECAR_ENTRY_BYTES: usize = 8 + 8 + 8 + 8 + 4 + 8;

/// Why a sidecar's bytes are not a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SidecarError {
    #[error("producer sidecar too short: {bytes} bytes")]
    Short { bytes: usize },
    #[error("producer sidecar has bad magic or version")]
    BadHeader,
    #[error("producer sidecar checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("producer sidecar body is malformed: {reason}")]
    Malformed { reason: &'static str },
}

/// `magic "MLPS" | version u8 = 1 | 3 zero bytes | crc32 u32 | body_len u32 | body`,
/// `body = own_range u64 | ancestor_count u32 | ancestor u64* | entry_count u32 |
/// { range u64 | producer_id u64 | epoch u64 | last_sequence u64 | last_records u32 | last_seen_ms u64 }*`,
/// little-endian, the CRC-32 (IEEE) over the body. `docs/storage-format.md`
/// describes it.
pub(crate) fn encode_sidecar(table: &ProducerTable) -> Vec<u8> {
    let mut body = Vec::with_capacity(
        8 + 4 + 8 * table.ancestors.len() + 4 + SIDECAR_ENTRY_BYTES * table.streams.len(),
    );
    body.extend_from_slice(&table.own_range.to_le_bytes());
    body.extend_from_slice(&(table.ancestors.len() as u32).to_le_bytes());
    for ancestor in &table.ancestors {
        body.extend_from_slice(&ancestor.to_le_bytes());
    }
    body.extend_from_slice(&(table.streams.len() as u32).to_le_bytes());
    for ((range, producer_id), e) in &table.streams {
        body.extend_from_slice(&range.to_le_bytes());
        body.extend_from_slice(&producer_id.to_le_bytes());
        body.extend_from_slice(&e.epoch.to_le_bytes());
        body.extend_from_slice(&e.last_sequence.to_le_bytes());
        body.extend_from_slice(&e.last_records.to_le_bytes());
        body.extend_from_slice(&e.last_seen_ms.to_le_bytes());
    }
    let mut out = Vec::with_capacity(SIDECAR_HEADER_BYTES + body.len());
    out.extend_from_slice(&SIDECAR_MAGIC);
    out.push(SIDECAR_VERSION);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The table in a sidecar's bytes (untrusted: read from disk). The CRC is
/// checked before any field is read, and no length is trusted beyond the
/// bytes present.
pub(crate) fn decode_sidecar(
    bytes: &[u8],
    limits: ProducerLimits,
) -> Result<ProducerTable, SidecarError> {
    if bytes.len() < SIDECAR_HEADER_BYTES {
        return Err(SidecarError::Short { bytes: bytes.len() });
    }
    if bytes[0..4] != SIDECAR_MAGIC || bytes[4] != SIDECAR_VERSION {
        return Err(SidecarError::BadHeader);
    }
    let u32_at = |b: &[u8], i: usize| -> u32 {
        let mut x = [0u8; 4];
        x.copy_from_slice(&b[i..i + 4]);
        u32::from_le_bytes(x)
    };
    let u64_at = |b: &[u8], i: usize| -> u64 {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(x)
    };
    let stored = u32_at(bytes, 8);
    let body_len = u32_at(bytes, 12) as usize;
    let body = &bytes[SIDECAR_HEADER_BYTES..];
    if body.len() != body_len {
        return Err(SidecarError::Malformed {
            reason: "body length disagrees with the file",
        });
    }
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(SidecarError::BadCrc { stored, computed });
    }
    let short = SidecarError::Malformed {
        reason: "a count runs past the body",
    };
    if body.len() < 12 {
        return Err(short);
    }
    let own_range = u64_at(body, 0);
    let ancestor_count = u32_at(body, 8) as usize;
    let mut at = 12usize;
    if ancestor_count > ANCESTORS_MAX || body.len() < at + 8 * ancestor_count + 4 {
        return Err(short);
    }
    let mut table = ProducerTable::new(own_range, limits);
    for _ in 0..ancestor_count {
        table.ancestors.insert(u64_at(body, at));
        at += 8;
    }
    let entry_count = u32_at(body, at) as usize;
    at += 4;
    if body.len() != at + SIDECAR_ENTRY_BYTES * entry_count {
        return Err(short);
    }
    for _ in 0..entry_count {
        let key = (u64_at(body, at), u64_at(body, at + 8));
        let entry = Entry {
            epoch: u64_at(body, at + 16),
            last_sequence: u64_at(body, at + 24),
            last_records: u32_at(body, at + 32),
            last_seen_ms: u64_at(body, at + 36),
        };
        table.streams.insert(key, entry);
        at += SIDECAR_ENTRY_BYTES;
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: ProducerLimits = ProducerLimits {
        producers_max: 4,
        idle_expiry_ms: 1_000_000,
    };

    fn tag(producer_id: u64, epoch: u64, range: u64, sequence: u64) -> ProducerTag {
        ProducerTag {
            producer_id,
            epoch,
            range,
            sequence,
            records: 10,
        }
    }

    fn accept(table: &mut ProducerTable, t: ProducerTag) {
        assert_eq!(table.check(&t, t.records), Verdict::Append, "{t:?}");
        table.record(&t, 0);
    }

    #[test]
    fn sequences_run_from_zero_and_a_retry_is_a_duplicate() {
        let mut table = ProducerTable::new(7, LIMITS);
        assert_eq!(table.check(&tag(1, 1, 7, 3), 10), Verdict::Unknown);
        accept(&mut table, tag(1, 1, 7, 0));
        accept(&mut table, tag(1, 1, 7, 1));
        assert_eq!(
            table.check(&tag(1, 1, 7, 1), 10),
            Verdict::Duplicate { records: 10 }
        );
        assert_eq!(
            table.check(&tag(1, 1, 7, 0), 10),
            Verdict::Duplicate { records: 10 }
        );
        assert_eq!(
            table.check(&tag(1, 1, 7, 1), 9),
            Verdict::Conflict { stored: 10 }
        );
        assert_eq!(
            table.check(&tag(1, 1, 7, 3), 10),
            Verdict::Gap { expected: 2 }
        );
        accept(&mut table, tag(1, 1, 7, 2));
    }

    #[test]
    fn a_new_epoch_fences_the_old_one_and_starts_at_zero() {
        let mut table = ProducerTable::new(7, LIMITS);
        accept(&mut table, tag(1, 1, 7, 0));
        assert_eq!(table.check(&tag(1, 2, 7, 5), 10), Verdict::Unknown);
        accept(&mut table, tag(1, 2, 7, 0));
        assert_eq!(
            table.check(&tag(1, 1, 7, 1), 10),
            Verdict::Fenced { current_epoch: 2 }
        );
    }

    #[test]
    fn children_recognise_retries_to_their_parent_and_fence_across_it() {
        let mut parent = ProducerTable::new(1, LIMITS);
        accept(&mut parent, tag(9, 3, 1, 0));
        accept(&mut parent, tag(9, 3, 1, 1));
        let mut child = ProducerTable::new(2, LIMITS);
        parent.inherit_into(&mut child, 0);
        // A retry of a batch the parent stored is a duplicate.
        assert_eq!(
            child.check(&tag(9, 3, 1, 1), 10),
            Verdict::Duplicate { records: 10 }
        );
        // The parent's next batch was never stored: it moved.
        assert_eq!(child.check(&tag(9, 3, 1, 2), 10), Verdict::Moved);
        // The child's own stream starts at 0.
        accept(&mut child, tag(9, 3, 2, 0));
        // A zombie is fenced on the child even before it wrote there.
        assert_eq!(
            child.check(&tag(9, 2, 2, 0), 10),
            Verdict::Fenced { current_epoch: 3 }
        );
        // A merge inherits both buddies.
        let mut buddy = ProducerTable::new(3, LIMITS);
        accept(&mut buddy, tag(9, 3, 3, 0));
        let mut merged = ProducerTable::new(4, LIMITS);
        child.inherit_into(&mut merged, 0);
        buddy.inherit_into(&mut merged, 0);
        assert_eq!(
            merged.check(&tag(9, 3, 2, 0), 10),
            Verdict::Duplicate { records: 10 }
        );
        assert_eq!(
            merged.check(&tag(9, 3, 3, 0), 10),
            Verdict::Duplicate { records: 10 }
        );
        assert_eq!(
            merged.check(&tag(9, 3, 1, 1), 10),
            Verdict::Duplicate { records: 10 }
        );
        assert_eq!(merged.check(&tag(9, 3, 3, 1), 10), Verdict::Moved);
    }

    #[test]
    fn a_roll_carries_the_table_on() {
        let mut old = ProducerTable::new(5, LIMITS);
        accept(&mut old, tag(1, 1, 5, 0));
        let mut next = ProducerTable::new(5, LIMITS);
        old.inherit_into(&mut next, 0);
        assert_eq!(next, old);
        accept(&mut next, tag(1, 1, 5, 1));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_idle_first() {
        let mut table = ProducerTable::new(7, LIMITS);
        for producer in 0..10u64 {
            let t = tag(producer, 1, 7, 0);
            assert_eq!(table.check(&t, 10), Verdict::Append);
            table.record(&t, producer);
        }
        assert_eq!(table.len(), LIMITS.producers_max);
        // The oldest were forgotten: producer 0 is unknown again.
        assert_eq!(table.check(&tag(0, 1, 7, 1), 10), Verdict::Unknown);
        assert_eq!(
            table.check(&tag(9, 1, 7, 0), 10),
            Verdict::Duplicate { records: 10 }
        );
        // Idle expiry.
        table.record(&tag(9, 1, 7, 1), 2_000_000);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_log_that_ends_inside_a_batch_is_cut_at_the_batch_start() {
        let mut starts = BatchStarts::default();
        assert_eq!(starts.torn(0), None);
        assert_eq!(
            starts.torn(7),
            None,
            "no marker: plain records or 1-record batches"
        );
        // A batch of 4 at offsets 10..14.
        starts.observe(10, 4);
        assert_eq!(starts.torn(14), None, "whole");
        assert_eq!(starts.torn(20), None, "whole, plain records after it");
        // A crash tore the write after 2 of its records (the tag rides on
        // the 4th, so the table never learns the batch was stored): cut
        // back to its first record, or its retry stores those 2 twice.
        assert_eq!(starts.torn(12), Some(10));
        assert_eq!(starts.torn(13), Some(10));
        assert_eq!(starts.torn(11), Some(10));
        // The next batch is the one that counts.
        starts.observe(14, 1000);
        assert_eq!(starts.torn(14), None, "its marker is not in a log of 14");
        assert_eq!(starts.torn(500), Some(14));
        assert_eq!(starts.torn(1014), None);
        // Offsets near the top cannot overflow the sum.
        starts.observe(u64::MAX - 1, u32::MAX);
        assert_eq!(starts.torn(u64::MAX), None);
        assert_eq!(decode_start(&encode_start(1000)), Some(1000));
        assert_eq!(decode_start(&[1, 2, 3]), None);
    }

    #[test]
    fn a_tag_round_trips_and_only_its_own_length_decodes() {
        let t = ProducerTag {
            producer_id: u64::MAX,
            epoch: 2,
            range: 3,
            sequence: 4,
            records: 5,
        };
        assert_eq!(ProducerTag::decode(&t.encode()), Some(t));
        assert_eq!(ProducerTag::decode(&t.encode()[1..]), None);
    }

    #[test]
    fn the_tag_and_sidecar_formats_are_stable() {
        let t = ProducerTag {
            producer_id: 0x0102_0304_0506_0708,
            epoch: 9,
            range: 10,
            sequence: 11,
            records: 12,
        };
        insta::assert_snapshot!("producer_tag", hex(&t.encode()));
        let mut parent = ProducerTable::new(1, LIMITS);
        parent.record(&tag(9, 3, 1, 4), 1_700);
        let mut child = ProducerTable::new(2, LIMITS);
        parent.inherit_into(&mut child, 1_700);
        child.record(&tag(9, 3, 2, 0), 1_800);
        insta::assert_snapshot!("producer_sidecar", hex(&encode_sidecar(&child)));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes
            .chunks(16)
            .map(|line| {
                line.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_damaged_sidecar_is_refused() {
        let mut table = ProducerTable::new(1, LIMITS);
        table.record(&tag(9, 3, 1, 4), 0);
        let bytes = encode_sidecar(&table);
        assert_eq!(decode_sidecar(&bytes, LIMITS), Ok(table));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            decode_sidecar(&flipped, LIMITS),
            Err(SidecarError::BadCrc { .. })
        ));
        assert!(decode_sidecar(&bytes[..10], LIMITS).is_err());
    }

    proptest! {
        /// Any bytes decode to a table or an error, never a panic.
        #[test]
        fn sidecar_decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_sidecar(&bytes, LIMITS);
        }

        /// Replaying the accepted batches of a log rebuilds the same answers:
        /// whatever arrives, a batch is appended at most once per sequence,
        /// and the stored sequences of a stream run 0, 1, 2, ... with no gap.
        #[test]
        fn a_stream_stores_each_sequence_once_and_in_order(
            arrivals in proptest::collection::vec((0u64..3, 0u64..6), 0..64)
        ) {
            let limits = ProducerLimits { producers_max: 16, idle_expiry_ms: u64::MAX };
            let mut table = ProducerTable::new(1, limits);
            let mut stored: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for (producer, sequence) in arrivals {
                let t = tag(producer, 1, 1, sequence);
                if table.check(&t, t.records) == Verdict::Append {
                    table.record(&t, 0);
                    stored.entry(producer).or_default().push(sequence);
                }
            }
            let mut rebuilt = ProducerTable::new(1, limits);
            for (producer, sequences) in &stored {
                let expected: Vec<u64> = (0..sequences.len() as u64).collect();
                prop_assert_eq!(sequences, &expected);
                for s in sequences {
                    rebuilt.observe(&tag(*producer, 1, 1, *s), 0);
                }
            }
            prop_assert_eq!(rebuilt, table);
        }
    }
}
