//! The invariants of the acknowledgement path, as pure checks.
//!
//! A broken one means a record could be lost, duplicated or misreported to
//! a client, so the callers treat a [`Violation`] as a failed assertion:
//! they answer the request with an error (a client must not be told its
//! records are durable, nor retry them as if nothing was appended) and then
//! panic, so the supervisor restarts the actor that saw it. The checks are
//! integer comparisons, cheap enough to stay on in release, except the
//! one that needs a fresh `SegmentInfo` (a store lock), which callers run
//! only with debug assertions.
//!
//! Offsets here are a segment copy's own: the store numbers a segment's
//! records from 0, in enqueue order, and `SegmentInfo::assigned` is the
//! next offset it will give.

use std::ops::Range;

use malachi_storage::SegmentInfo;

/// A broken invariant of the acknowledgement path, with the values that
/// broke it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Violation {
    /// The store gave one append a number of offsets other than its records.
    #[error(
        "append offsets {start}..{end} hold {held} records, but the batch had {records}",
        start = offsets.start, end = offsets.end, held = offsets.end.saturating_sub(offsets.start)
    )]
    CountMismatch { offsets: Range<u64>, records: u64 },
    /// An append's offsets do not start where the previous append on the
    /// same segment ended: a gap (records lost) or an overlap (two records
    /// at one offset).
    #[error(
        "append offsets {start}..{end} do not follow the previous append's end {expected_start}",
        start = offsets.start, end = offsets.end
    )]
    NotContiguous {
        offsets: Range<u64>,
        expected_start: u64,
    },
    /// A completed append reports records past what the store holds durable.
    #[error("acknowledged offsets end at {end}, past the segment's durable end {durable_end}")]
    PastDurableEnd { end: u64, durable_end: u64 },
    /// A completed append reports records past its segment's seal: a write
    /// to a sealed segment was acknowledged.
    #[error("acknowledged offsets end at {end}, past the segment's seal at {sealed_length}")]
    PastSeal { end: u64, sealed_length: u64 },
    /// The ranges a produce routed to do not hold exactly its records.
    #[error("the ranges were given {routed} records, but the request held {requested}")]
    RoutedCount { routed: u64, requested: u64 },
    /// The per-range acknowledged counts do not sum to the request's records.
    #[error("the ranges acknowledged {acknowledged} records, but the request held {requested}")]
    AcknowledgedCount { acknowledged: u64, requested: u64 },
}

/// An append's offsets, given at enqueue: exactly `records` of them,
/// starting at `expected_start` (the end of the previous append on the
/// same segment).
pub(crate) fn check_append(
    expected_start: u64,
    records: usize,
    offsets: &Range<u64>,
) -> Result<(), Violation> {
    let records = records as u64;
    if offsets.start > offsets.end || offsets.end - offsets.start != records {
        return Err(Violation::CountMismatch {
            offsets: offsets.clone(),
            records,
        });
    }
    if offsets.start != expected_start {
        return Err(Violation::NotContiguous {
            offsets: offsets.clone(),
            expected_start,
        });
    }
    Ok(())
}

/// A completed append's offsets, against the segment copy once the
/// append's group commit returned: the store keeps them durable (`length`
/// counts durable records, clamped to a seal) and within any seal.
pub(crate) fn check_durable(offsets: &Range<u64>, info: &SegmentInfo) -> Result<(), Violation> {
    if let Some(seal) = info.sealed
        && offsets.end > seal.length
    {
        return Err(Violation::PastSeal {
            end: offsets.end,
            sealed_length: seal.length,
        });
    }
    if offsets.end > info.length {
        return Err(Violation::PastDurableEnd {
            end: offsets.end,
            durable_end: info.length,
        });
    }
    Ok(())
}

/// What a produce routed: every record of the request to exactly one range.
pub(crate) fn check_routed(
    requested: usize,
    per_range: impl IntoIterator<Item = usize>,
) -> Result<(), Violation> {
    let routed: u64 = per_range.into_iter().map(|n| n as u64).sum();
    if routed != requested as u64 {
        return Err(Violation::RoutedCount {
            routed,
            requested: requested as u64,
        });
    }
    Ok(())
}

/// What a produce acknowledges: the per-range acknowledged counts sum to
/// the request's records, never more and never fewer. Returns the count.
pub(crate) fn check_acknowledged(
    requested: usize,
    per_range: impl IntoIterator<Item = usize>,
) -> Result<u32, Violation> {
    let acknowledged: u64 = per_range.into_iter().map(|n| n as u64).sum();
    let violation = Violation::AcknowledgedCount {
        acknowledged,
        requested: requested as u64,
    };
    if acknowledged != requested as u64 {
        return Err(violation);
    }
    u32::try_from(acknowledged).map_err(|_| violation)
}

/// What a produce some range refused acknowledges: each range's part
/// whole or not at all (a range never reports part of its part durable).
/// `per_range` is (acknowledged, records) per range. Returns the count.
pub(crate) fn check_partial(
    per_range: impl IntoIterator<Item = (usize, usize)>,
) -> Result<u32, Violation> {
    let mut acknowledged: u64 = 0;
    let mut requested: u64 = 0;
    for (acked, records) in per_range {
        requested += records as u64;
        if acked != 0 && acked != records {
            return Err(Violation::AcknowledgedCount {
                acknowledged: acked as u64,
                requested: records as u64,
            });
        }
        acknowledged += acked as u64;
    }
    u32::try_from(acknowledged).map_err(|_| Violation::AcknowledgedCount {
        acknowledged,
        requested,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_storage::{SealInfo, SegmentId};

    #[test]
    fn a_refused_produce_acknowledges_whole_parts_only() {
        assert_eq!(check_partial([(3, 3), (0, 2)]), Ok(3));
        assert_eq!(check_partial([(0, 2)]), Ok(0));
        assert!(check_partial([(1, 2)]).is_err());
    }

    fn info(length: u64, sealed: Option<u64>) -> SegmentInfo {
        SegmentInfo {
            segment: SegmentId(1),
            length,
            byte_size: length * 10,
            durable: length,
            committed: None,
            assigned: length,
            stored_bytes: length * 10,
            sealed: sealed.map(|length| SealInfo {
                length,
                byte_size: length * 10,
            }),
            fenced: sealed.is_some(),
            failed: false,
            lost: None,
        }
    }

    #[test]
    fn an_append_that_follows_the_previous_one_passes() {
        assert_eq!(check_append(0, 3, &(0..3)), Ok(()));
        assert_eq!(check_append(3, 2, &(3..5)), Ok(()));
        assert_eq!(check_append(5, 0, &(5..5)), Ok(()));
    }

    #[test]
    fn offsets_that_hold_fewer_records_than_the_batch_are_caught() {
        assert_eq!(
            check_append(0, 3, &(0..2)),
            Err(Violation::CountMismatch {
                offsets: 0..2,
                records: 3
            })
        );
        // An inverted range holds no records at all.
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = 5..2;
        assert!(matches!(
            check_append(5, 3, &inverted),
            Err(Violation::CountMismatch { .. })
        ));
    }

    #[test]
    fn a_gap_or_an_overlap_after_the_previous_append_is_caught() {
        let gap = check_append(3, 2, &(4..6)).unwrap_err();
        assert_eq!(
            gap.to_string(),
            "append offsets 4..6 do not follow the previous append's end 3"
        );
        assert!(matches!(
            check_append(3, 2, &(2..4)),
            Err(Violation::NotContiguous {
                expected_start: 3,
                ..
            })
        ));
    }

    #[test]
    fn an_acknowledgement_past_the_durable_end_or_the_seal_is_caught() {
        assert_eq!(check_durable(&(0..5), &info(5, None)), Ok(()));
        assert_eq!(
            check_durable(&(3..6), &info(5, None)),
            Err(Violation::PastDurableEnd {
                end: 6,
                durable_end: 5
            })
        );
        assert_eq!(
            check_durable(&(3..6), &info(4, Some(4))),
            Err(Violation::PastSeal {
                end: 6,
                sealed_length: 4
            })
        );
    }

    #[test]
    fn per_range_counts_must_sum_to_the_request() {
        assert_eq!(check_routed(5, [2, 3]), Ok(()));
        assert!(check_routed(5, [2, 2]).is_err());
        assert_eq!(check_acknowledged(5, [2, 3]), Ok(5));
        assert_eq!(
            check_acknowledged(5, [2, 3, 1]),
            Err(Violation::AcknowledgedCount {
                acknowledged: 6,
                requested: 5
            })
        );
        assert!(check_acknowledged(5, [2]).is_err());
    }
}
