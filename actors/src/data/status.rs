//! What this broker says about the segment copies it holds (replica-status,
//! api key 105, ADR 0098): each copy's durable end from the local store,
//! and, for a segment it leads, the committed end from its quorum tracker.
//!
//! A pure read of the store's and the replication registry's state: it
//! opens nothing (a copy not open since the broker started reports as not
//! open rather than being recovered for a describe) and writes nothing.

use malachi_core::model::SegmentId;
use malachi_wire::replica_status::CopyStatus;

use super::storage::Storage;

/// The status of this broker's copy of each of `segments`, in their order.
pub(crate) fn copy_status(storage: &Storage, segments: &[u64]) -> Vec<CopyStatus> {
    segments
        .iter()
        .map(|&segment| one(storage, segment))
        .collect()
}

fn one(storage: &Storage, segment: u64) -> CopyStatus {
    let Ok(info) = storage.store.info(malachi_storage::SegmentId(segment)) else {
        return CopyStatus {
            segment,
            ..CopyStatus::default()
        };
    };
    let led = storage
        .replication
        .led
        .lock()
        .get(&SegmentId(segment))
        .map(|replicated| replicated.committed());
    let committed_end = match (led, info.committed) {
        // The primary's tracker: what a quorum holds.
        (Some(committed), _) => Some(committed),
        // A follower copy: the last committed end its primary sent.
        (None, Some(committed)) => Some(committed),
        // A copy nobody replicates: its durable records are committed.
        (None, None) => Some(info.durable),
    };
    CopyStatus {
        segment,
        open: true,
        durable_end: Some(info.durable),
        durable_bytes: Some(info.byte_size),
        committed_end,
        leading: led.is_some(),
        sealed: info.sealed.is_some(),
        fenced: info.fenced,
        failed: info.failed,
    }
}

/// How this broker's copy of a sealed segment stands against the seal the
/// metadata recorded (`length` records, `bytes` bytes; ADR 0108): `None`
/// for a copy that looks whole, else its status and the records it holds
/// when known: `damaged` (quarantined, records lost past the damage),
/// `missing` (no log file, or opened with none), `short` (fewer records or
/// bytes than its seal). A copy not open is judged by its log's size and
/// its seal marker; only one without a marker is opened to be checked.
pub(crate) fn sealed_copy_health(
    storage: &Storage,
    segment: u64,
    length: u64,
    bytes: u64,
    alone: bool,
) -> Option<(&'static str, Option<u64>)> {
    let id = malachi_storage::SegmentId(segment);
    let mut info = storage.store.info(id);
    // A copy of several short of its seal is caught up from another (and
    // is no data loss): only a lone copy is opened to be checked.
    if alone && info.is_err() && storage.store.has_copy(id) && !storage.store.has_seal_marker(id) {
        // Sealed in the metadata, with no seal marker on the copy: a roll
        // away from a damaged copy leaves it so (or a crash before the
        // marker). Rare, so the copy is opened and checked.
        info = super::damage::open_copy(
            storage.store.as_ref(),
            Some(&storage.metrics),
            SegmentId(segment),
            Some(length),
            super::damage::CopyOf::default(),
        )
        .map(|recovery| recovery.info);
    }
    match info {
        Ok(info) => {
            let lost = info.lost?;
            let status = if info.failed {
                "damaged"
            } else if info.durable == 0 && lost.from == 0 {
                "missing"
            } else {
                "short"
            };
            Some((status, Some(info.durable.min(length))))
        }
        Err(_) => match storage.store.copy_bytes(id) {
            Ok(None) => Some(("missing", None)),
            Ok(Some(len)) if len < bytes => Some(("short", None)),
            _ => None,
        },
    }
}

/// This broker's copies by health word, for `malachi_copies`: sealed
/// copies by their scrub verdict, copies healing, and the open copies of
/// active segments (led or followed) that are fenced or failed.
pub(crate) fn copy_health_counts(
    storage: &Storage,
) -> std::collections::BTreeMap<&'static str, u64> {
    let now = std::time::Instant::now();
    let mut counts = storage.scrub.book.lock().counts();
    let healing: Vec<u64> = storage.replication.healing.lock().keys().copied().collect();
    let healing = healing
        .into_iter()
        .filter(|s| storage.replication.is_healing(*s, now))
        .count() as u64;
    if healing > 0 {
        counts.insert("healing", healing);
    }
    let mut active: std::collections::BTreeSet<u64> =
        storage.segments.lock().keys().map(|s| s.0).collect();
    active.extend(storage.replication.followed.lock().iter().map(|s| s.0));
    for segment in active {
        if let Ok(info) = storage.store.info(malachi_storage::SegmentId(segment))
            && info.sealed.is_none()
        {
            if info.failed {
                *counts.entry("failed").or_insert(0) += 1;
            } else if info.fenced {
                *counts.entry("fenced").or_insert(0) += 1;
            }
        }
    }
    counts
}

/// The health of this broker's copies of `seals` (sealed segments, each
/// with its recorded seal), in their order, from what it knows without
/// reading them: `healing` while a repair fills it toward its seal, the
/// scrubber's verdict when that found it broken, what
/// [`sealed_copy_health`] finds of its state and size, `over` when it
/// holds more records than its seal (a deposed writer's tail not yet cut),
/// else `intact`.
pub(crate) fn sealed_health(
    storage: &Storage,
    seals: &[malachi_wire::replica_status::ScrubSeal],
) -> Vec<malachi_wire::replica_status::SealedHealth> {
    let now = std::time::Instant::now();
    seals
        .iter()
        .map(|seal| {
            let info = storage
                .store
                .info(malachi_storage::SegmentId(seal.segment))
                .ok();
            let whole = info
                .as_ref()
                .is_some_and(|i| i.sealed.is_some_and(|s| s.length == seal.length));
            let durable_end = info.as_ref().map(|i| i.durable);
            let (health, durable_end) = if !whole
                && storage.replication.is_healing(seal.segment, now)
            {
                ("healing", durable_end)
            } else if storage.scrub.book.lock().is_broken(seal.segment) {
                match sealed_copy_health(storage, seal.segment, seal.length, seal.bytes, false) {
                    Some((status, end)) => (status, end),
                    None => ("damaged", durable_end),
                }
            } else if let Some((status, end)) =
                sealed_copy_health(storage, seal.segment, seal.length, seal.bytes, false)
            {
                (status, end)
            } else if durable_end.is_some_and(|end| end < seal.length) {
                ("short", durable_end)
            } else if durable_end.is_some_and(|end| end > seal.length) {
                ("over", durable_end)
            } else {
                ("intact", durable_end.map(|end| end.min(seal.length)))
            };
            malachi_wire::replica_status::SealedHealth {
                segment: seal.segment,
                health: health.into(),
                durable_end,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use malachi_storage::{FileStore, Record, StoreConfig};

    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use crate::common::metrics::BrokerMetrics;

    fn storage(dir: &std::path::Path) -> Storage {
        let store = Arc::new(FileStore::open_dir(dir, StoreConfig::default()).unwrap());
        Storage::new(
            BrokerConfig::default(),
            store,
            Arc::new(SystemClock),
            Arc::new(BrokerMetrics::new()),
        )
    }

    #[test]
    fn an_open_copy_reports_its_ends_and_an_absent_one_reports_none() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let id = malachi_storage::SegmentId(7);
        storage.store.open(id).unwrap();
        let records = [Record::new(1, "k", "v"), Record::new(1, "k", "w")];
        storage.store.append(id, &records).unwrap().wait().unwrap();
        let status = copy_status(&storage, &[7, 8]);
        assert_eq!(status.len(), 2);
        let open = &status[0];
        assert_eq!(open.segment, 7);
        assert!(open.open);
        assert_eq!(open.durable_end, Some(2));
        assert!(open.durable_bytes.unwrap() > 0);
        // Nobody replicates it: its durable records are committed.
        assert_eq!(open.committed_end, Some(2));
        assert!(!open.leading && !open.sealed && !open.fenced && !open.failed);
        let absent = &status[1];
        assert_eq!(absent.segment, 8);
        assert!(!absent.open);
        assert_eq!(absent.durable_end, None);
        assert_eq!(absent.committed_end, None);
    }

    #[test]
    fn a_sealed_copy_is_judged_against_its_seal_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let id = malachi_storage::SegmentId(5);
        storage.store.open(id).unwrap();
        let records = [Record::new(1, "a", "1"), Record::new(1, "b", "2")];
        storage.store.append(id, &records).unwrap().wait().unwrap();
        let bytes = storage.store.info(id).unwrap().byte_size;
        storage.store.seal(id, 2).unwrap();
        storage.store.close(id).unwrap();
        assert_eq!(sealed_copy_health(&storage, 5, 2, bytes, true), None);
        assert_eq!(
            sealed_copy_health(&storage, 5, 3, bytes + 1, true),
            Some(("short", None))
        );
        assert_eq!(
            sealed_copy_health(&storage, 6, 2, bytes, true),
            Some(("missing", None))
        );
        // Open, the store's own check counts.
        storage.store.open(id).unwrap();
        storage.store.check_seal(id, 4).unwrap();
        assert_eq!(
            sealed_copy_health(&storage, 5, 4, bytes, true),
            Some(("short", Some(2)))
        );
    }

    #[test]
    fn a_sealed_copys_health_is_intact_short_over_missing_or_healing() {
        use malachi_wire::replica_status::ScrubSeal;
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let id = malachi_storage::SegmentId(5);
        storage.store.open(id).unwrap();
        let records = [
            Record::new(1, "a", "1"),
            Record::new(1, "b", "2"),
            Record::new(1, "c", "3"),
        ];
        storage.store.append(id, &records).unwrap().wait().unwrap();
        let bytes = storage.store.info(id).unwrap().byte_size;
        let seal = |length: u64| ScrubSeal {
            segment: 5,
            length,
            bytes,
        };
        let words = |seals: &[ScrubSeal]| -> Vec<(String, Option<u64>)> {
            sealed_health(&storage, seals)
                .into_iter()
                .map(|h| (h.health, h.durable_end))
                .collect()
        };
        // Three records held: a seal of 3 is intact, of 4 short, of 2 over
        // (a deposed writer's tail, before it settles).
        assert_eq!(words(&[seal(3)]), vec![("intact".into(), Some(3))]);
        assert_eq!(words(&[seal(4)]), vec![("short".into(), Some(3))]);
        assert_eq!(words(&[seal(2)]), vec![("over".into(), Some(3))]);
        let absent = ScrubSeal {
            segment: 6,
            length: 2,
            bytes,
        };
        assert_eq!(words(&[absent]), vec![("missing".into(), None)]);
        // A copy taking repairs toward its seal is healing until sealed.
        storage
            .replication
            .healing
            .lock()
            .insert(5, std::time::Instant::now());
        assert_eq!(words(&[seal(4)]), vec![("healing".into(), Some(3))]);
        storage.store.seal(id, 3).unwrap();
        assert_eq!(words(&[seal(3)]), vec![("intact".into(), Some(3))]);
    }

    #[test]
    fn a_led_segment_reports_the_trackers_committed_end() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let id = malachi_storage::SegmentId(3);
        storage.store.open(id).unwrap();
        let records = [Record::new(1, "a", "1"), Record::new(1, "b", "2")];
        storage.store.append(id, &records).unwrap().wait().unwrap();
        let replicated = Arc::new(super::super::replication::Replicated::new(
            "t".into(),
            SegmentId(3),
            1,
            vec![
                malachi_core::model::NodeId(1),
                malachi_core::model::NodeId(2),
                malachi_core::model::NodeId(3),
            ],
            2,
            0,
        ));
        storage
            .replication
            .led
            .lock()
            .insert(SegmentId(3), replicated);
        let status = copy_status(&storage, &[3]);
        assert!(status[0].leading);
        assert_eq!(status[0].durable_end, Some(2));
        // Only the primary's copy holds the records: nothing is committed.
        assert_eq!(status[0].committed_end, Some(0));
    }
}
