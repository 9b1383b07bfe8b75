//! Damaged and missing copies (ADR 0108): one bad copy is never fatal and
//! never silent. A copy the store refuses as damaged is opened in
//! quarantine (latched failed, its intact prefix readable), a copy is
//! checked against the seal the metadata recorded, and whatever a copy
//! lacks is reported once.
//!
//! What it is reported as depends on whether other copies exist (ADR
//! 0127). A lone copy's loss is data loss: an `error!` line with the copy's
//! fields, the `malachi_copies_lost` gauge and the
//! `malachi_data_loss_records_total` counter, and a read that reaches the
//! lost records gets the store's `Lost`, which the client sees as
//! `data_loss`. One copy of several that is short or damaged lost nothing
//! the topic holds: every acknowledged record is on a quorum, the read path
//! sends its readers to another copy, and the scrubber and healer rebuild
//! it (ADR 0110). It is a `warn!` line and
//! `malachi_copy_repair_records_total`, never an alarm.

use malachi_core::model::{RangeId, SegmentId};
use malachi_storage::{Loss, Recovery, SegmentStore, StorageError};
use tracing::{error, warn};

use crate::common::metrics::BrokerMetrics;

/// Where a copy belongs, for the log line (what the caller knows).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CopyOf<'a> {
    pub topic: Option<&'a str>,
    pub range: Option<RangeId>,
    /// Whether the metadata records other copies of the segment: then what
    /// this one lacks is repaired from them, not lost (ADR 0127).
    pub replicated: bool,
}

/// Why a copy lost records, as the log line says it.
fn cause(recovery: &Recovery, damage: Option<&StorageError>) -> String {
    match damage {
        Some(damage) => damage.to_string(),
        None if recovery.log_missing => "the copy's log file is missing".to_string(),
        None => "the copy is shorter than its seal".to_string(),
    }
}

/// Opens this broker's copy of `segment` for the data path: a damaged one
/// in quarantine rather than failing, and, when the metadata records the
/// segment sealed at `seal_length` records, checked against that seal.
/// A loss found is reported (once per copy).
pub(crate) fn open_copy(
    store: &dyn SegmentStore,
    metrics: Option<&BrokerMetrics>,
    segment: SegmentId,
    seal_length: Option<u64>,
    of: CopyOf<'_>,
) -> Result<Recovery, StorageError> {
    let id = malachi_storage::SegmentId(segment.0);
    let (mut recovery, damage) = match store.open(id) {
        Err(damage @ StorageError::Damaged { .. }) => (store.open_quarantined(id)?, Some(damage)),
        other => (other?, None),
    };
    if let Some(length) = seal_length
        && let Some(loss) = store.check_seal(id, length)?
    {
        recovery.info.lost = Some(loss);
    }
    if let Some(loss) = recovery.info.lost {
        report(
            metrics,
            segment,
            loss,
            &cause(&recovery, damage.as_ref()),
            of,
        );
    }
    Ok(recovery)
}

/// Logs and counts what a copy lacks, once per copy (the first report
/// wins; a report without metrics, from a unit test, always logs): as data
/// loss for a lone copy, as a repair for one of several.
pub(crate) fn report(
    metrics: Option<&BrokerMetrics>,
    segment: SegmentId,
    loss: Loss,
    cause: &str,
    of: CopyOf<'_>,
) {
    if of.replicated {
        let first = metrics.is_none_or(|m| m.copy_repaired(segment.0, loss.records()));
        if first {
            warn!(
                segment = segment.0,
                topic = of.topic.unwrap_or("?"),
                range = of.range.map(|r| r.0),
                short_from = loss.from,
                short_to = loss.to,
                short_records = loss.records(),
                %cause,
                "a segment copy is short of its seal or damaged; other copies hold those records, readers are sent to them and the copy is repaired from them"
            );
        }
        return;
    }
    let first = metrics.is_none_or(|m| m.copy_lost(segment.0, loss.records()));
    if first {
        error!(
            segment = segment.0,
            topic = of.topic.unwrap_or("?"),
            range = of.range.map(|r| r.0),
            lost_from = loss.from,
            lost_to = loss.to,
            lost_records = loss.records(),
            %cause,
            "a segment copy lost records; they are reported as data loss, the copy is quarantined and the broker serves on"
        );
    }
}

/// The seal a quarantined or short copy must be sealed at: every offset it
/// was given, lost ones included, so no later record takes a lost record's
/// offset and a read of them is `data_loss`, never another record.
pub(crate) fn seal_length(length: u64, lost: Option<Loss>) -> u64 {
    lost.map_or(length, |loss| length.max(loss.to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_with_lost_records_is_sealed_past_them() {
        assert_eq!(seal_length(5, None), 5);
        assert_eq!(seal_length(5, Some(Loss { from: 5, to: 12 })), 12);
        assert_eq!(seal_length(12, Some(Loss { from: 3, to: 7 })), 12);
    }

    #[test]
    fn a_loss_is_counted_once_per_copy() {
        let metrics = BrokerMetrics::new();
        let loss = Loss { from: 2, to: 5 };
        report(
            Some(&metrics),
            SegmentId(4),
            loss,
            "test",
            CopyOf::default(),
        );
        report(
            Some(&metrics),
            SegmentId(4),
            loss,
            "test",
            CopyOf::default(),
        );
        report(
            Some(&metrics),
            SegmentId(9),
            loss,
            "test",
            CopyOf::default(),
        );
        let text = metrics.render();
        assert!(text.contains("malachi_copies_lost 2"), "{text}");
        assert!(text.contains("malachi_data_loss_records_total 6"), "{text}");
    }

    #[test]
    fn a_short_copy_of_several_is_a_repair_not_data_loss() {
        let metrics = BrokerMetrics::new();
        let of = CopyOf {
            replicated: true,
            ..CopyOf::default()
        };
        let loss = Loss { from: 2, to: 5 };
        report(Some(&metrics), SegmentId(4), loss, "test", of);
        report(Some(&metrics), SegmentId(4), loss, "test", of);
        let text = metrics.render();
        assert!(
            text.contains("malachi_copy_repair_records_total 3"),
            "{text}"
        );
        assert!(text.contains("malachi_data_loss_records_total 0"), "{text}");
        assert!(text.contains("malachi_copies_lost 0"), "{text}");
    }
}
