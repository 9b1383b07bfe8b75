//! Removing the copies of segments the metadata no longer lists (issue 21,
//! ADR 0115): a deleted topic's, and orphans.
//!
//! Two ways in, one rule: a copy is removed only after the metadata has
//! been asked and does not list its segment.
//! - **Drop orders** (cluster api key 106). Once a topic's delete commits,
//!   its coordinator sends every holder the segments it held
//!   (`drop_orders.rs`). The holder
//!   asks the topic's own vnode, linearizably, which of them it still
//!   lists (a vnode that does not hold the topic refuses rather than
//!   answer "none"), and removes the others.
//! - **The orphan sweep**, for the holders a drop order missed (down, cut
//!   off, killed mid-removal before its marker). Every
//!   `maintenance.orphan_sweep_ms`, the copies on disk that no local
//!   replica lists, that no writer or follower uses, and whose files are
//!   older than `maintenance.orphan_grace_ms`, are put to every vnode of
//!   the ring. Only if all of them answered, under one ring version with
//!   no vnode split pending, are the copies none lists removed; otherwise
//!   the pass is skipped (the seed's rule).
//!
//! The removal itself is the store's `remove_copy`, crash-safe by a marker
//! the store finishes at open.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use malachi_core::model::SegmentId;
use malachi_wire::replica_order::{DropCopiesRequest, DropCopiesResponse};
use tracing::{debug, info, warn};

use super::shared::Shared;
use crate::common::error::MetadataError;

/// What one orphan sweep did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SweepOutcome {
    /// No copy on disk was a candidate: nothing was asked.
    Nothing,
    /// Some vnode did not answer, or the ring moved: nothing removed.
    Skipped { candidates: usize, reason: String },
    /// Every vnode answered; these copies no vnode lists were removed.
    Removed {
        candidates: usize,
        removed: Vec<u64>,
        freed_bytes: u64,
    },
}

/// The copies an orphan sweep puts to the vnodes: on disk, not in use
/// here (a local replica lists it, a writer or follower has it), and not
/// changed within the grace. In id order.
pub(crate) fn orphan_candidates(
    on_disk: &[u64],
    in_use: &BTreeSet<u64>,
    changed_recently: &BTreeSet<u64>,
) -> Vec<u64> {
    on_disk
        .iter()
        .copied()
        .filter(|id| !in_use.contains(id) && !changed_recently.contains(id))
        .collect()
}

/// The candidates to remove once the vnodes answered: those none listed.
pub(crate) fn unlisted(candidates: &[u64], listed: &BTreeSet<u64>) -> Vec<u64> {
    candidates
        .iter()
        .copied()
        .filter(|id| !listed.contains(id))
        .collect()
}

/// Serves a drop order (api key 106).
pub(crate) async fn serve_drop_copies(shared: &Arc<Shared>, body: &[u8]) -> DropCopiesResponse {
    let request = match DropCopiesRequest::decode(body) {
        Ok(request) => request,
        Err(e) => return refused(format!("undecodable drop order: {e}")),
    };
    let listed = match listed_for_topic(shared, &request.topic, &request.segments).await {
        Ok(listed) => listed,
        Err(reason) => {
            debug!(topic = %request.topic, %reason, "a drop order could not be checked; the orphan sweep will");
            return refused(reason.to_string());
        }
    };
    let to_remove = unlisted(&request.segments, &listed);
    let kept: Vec<u64> = request
        .segments
        .iter()
        .copied()
        .filter(|id| listed.contains(id))
        .collect();
    if !kept.is_empty() {
        warn!(topic = %request.topic, ?kept, "a drop order named segments the metadata still lists; they are kept");
    }
    let (removed, freed_bytes, error) = remove_copies(shared, &to_remove).await;
    DropCopiesResponse {
        removed,
        kept,
        freed_bytes,
        message: error.unwrap_or_default(),
    }
}

fn refused(message: String) -> DropCopiesResponse {
    DropCopiesResponse {
        message,
        ..DropCopiesResponse::default()
    }
}

/// Which of `segments` the topic's vnode lists: asked of its leader when
/// the broker runs vnodes; a single-group plane's own state is the whole
/// metadata.
async fn listed_for_topic(
    shared: &Arc<Shared>,
    topic: &str,
    segments: &[u64],
) -> Result<BTreeSet<u64>, MetadataError> {
    let plane = shared.plane()?;
    if let Some(host) = plane.host() {
        return Ok(host
            .topic_segments_listed(topic, segments)
            .await?
            .into_iter()
            .collect());
    }
    let mut listed = BTreeSet::new();
    plane.view_each(&mut |state| {
        listed.extend(
            segments
                .iter()
                .filter(|id| state.segment(SegmentId(**id)).is_some()),
        );
    });
    Ok(listed)
}

/// Removes the copies of `segments` on this broker: stops a writer still
/// running one, forgets a followed one, then has the store remove its
/// files. Returns the segments removed, the bytes freed, and the first
/// error (the segments after it are left for a later pass).
pub(crate) async fn remove_copies(
    shared: &Arc<Shared>,
    segments: &[u64],
) -> (Vec<u64>, u64, Option<String>) {
    let mut removed = Vec::with_capacity(segments.len());
    let mut freed = 0;
    for &id in segments {
        let segment = SegmentId(id);
        if shared.data.segments.lock().contains_key(&segment) {
            super::segment_stop::stop_segment_actors(&shared.data, &[segment]).await;
        }
        shared.data.replication.followed.lock().remove(&segment);
        shared.memory.settled.lock().remove(&segment);
        let store = Arc::clone(&shared.store);
        let removal =
            tokio::task::spawn_blocking(move || store.remove_copy(malachi_storage::SegmentId(id)))
                .await;
        match removal {
            // Removed before, or by a removal that ran at the same time
            // (a drop order and the orphan sweep): gone, and counted there.
            Ok(Ok(None)) => removed.push(id),
            Ok(Ok(Some(bytes))) => {
                freed += bytes;
                removed.push(id);
                shared.metrics.copies_removed.increment(1);
                shared.metrics.copies_removed_bytes.increment(bytes);
                info!(
                    segment = id,
                    freed_bytes = bytes,
                    "removed a copy the metadata no longer lists"
                );
            }
            Ok(Err(e)) => {
                warn!(segment = id, error = %e, "cannot remove a copy; a later sweep retries");
                return (removed, freed, Some(e.to_string()));
            }
            Err(e) => {
                return (
                    removed,
                    freed,
                    Some(format!("the removal task failed: {e}")),
                );
            }
        }
    }
    (removed, freed, None)
}

/// The holders of every copy of `topic`'s segments, by broker, from a
/// state that still lists the topic.
pub(crate) fn holders_of(
    state: &malachi_core::model::MetadataState,
    topic: &str,
) -> BTreeMap<u64, Vec<u64>> {
    let mut holders: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let Some(t) = state.topic(topic) else {
        return holders;
    };
    for range in t.ranges.iter().filter_map(|id| state.range(*id)) {
        for segment in range.segments.iter().filter_map(|id| state.segment(*id)) {
            for node in &segment.replicas {
                holders.entry(node.0).or_default().push(segment.id.0);
            }
        }
    }
    holders
}

/// One orphan sweep (see the module doc).
pub(crate) async fn sweep_orphans(shared: &Arc<Shared>) -> SweepOutcome {
    let store = Arc::clone(&shared.store);
    let grace = Duration::from_millis(shared.config.maintenance.orphan_grace_ms);
    let listing = tokio::task::spawn_blocking(move || {
        let on_disk = store.local_copies()?;
        let now = SystemTime::now();
        let recent: BTreeSet<u64> = on_disk
            .iter()
            .filter(|id| {
                store
                    .copy_modified(**id)
                    .is_none_or(|at| now.duration_since(at).unwrap_or_default() < grace)
            })
            .map(|id| id.0)
            .collect();
        Ok::<_, malachi_storage::StorageError>((on_disk, recent))
    })
    .await;
    let (on_disk, recent) = match listing {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            warn!(error = %e, "the orphan sweep cannot list the store");
            return SweepOutcome::Skipped {
                candidates: 0,
                reason: e.to_string(),
            };
        }
        Err(e) => {
            return SweepOutcome::Skipped {
                candidates: 0,
                reason: e.to_string(),
            };
        }
    };
    let on_disk: Vec<u64> = on_disk.into_iter().map(|id| id.0).collect();
    let plane = match shared.plane() {
        Ok(plane) => plane,
        Err(e) => {
            return SweepOutcome::Skipped {
                candidates: 0,
                reason: e.to_string(),
            };
        }
    };
    let mut in_use: BTreeSet<u64> = shared.data.segments.lock().keys().map(|s| s.0).collect();
    in_use.extend(shared.data.replication.followed.lock().iter().map(|s| s.0));
    plane.view_each(&mut |state| {
        in_use.extend(
            on_disk
                .iter()
                .filter(|id| state.segment(SegmentId(**id)).is_some()),
        );
    });
    let candidates = orphan_candidates(&on_disk, &in_use, &recent);
    if candidates.is_empty() {
        return SweepOutcome::Nothing;
    }
    let mut listed = BTreeSet::new();
    if let Some(host) = plane.host() {
        for chunk in candidates.chunks(malachi_cluster::vnodes::LISTS_SEGMENTS_MAX) {
            match host.segments_listed(chunk).await {
                Ok(answer) => listed.extend(answer.listed),
                Err(e) => {
                    shared.metrics.orphan_sweeps_skipped.increment(1);
                    info!(candidates = candidates.len(), reason = %e, "orphan sweep skipped: not every vnode answered");
                    return SweepOutcome::Skipped {
                        candidates: candidates.len(),
                        reason: e.to_string(),
                    };
                }
            }
        }
    }
    let orphans = unlisted(&candidates, &listed);
    let (removed, freed_bytes, _) = remove_copies(shared, &orphans).await;
    if !removed.is_empty() {
        info!(
            removed = removed.len(),
            freed_bytes, "orphan sweep removed copies no vnode lists"
        );
    }
    SweepOutcome::Removed {
        candidates: candidates.len(),
        removed,
        freed_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_is_on_disk_unused_and_not_changed_recently() {
        let in_use: BTreeSet<u64> = [2, 5].into();
        let recent: BTreeSet<u64> = [3].into();
        assert_eq!(
            orphan_candidates(&[1, 2, 3, 4, 5], &in_use, &recent),
            vec![1, 4]
        );
        assert!(orphan_candidates(&[], &in_use, &recent).is_empty());
    }

    #[test]
    fn only_the_candidates_no_vnode_lists_are_removed() {
        let listed: BTreeSet<u64> = [4].into();
        assert_eq!(unlisted(&[1, 4, 9], &listed), vec![1, 9]);
        assert!(unlisted(&[4], &listed).is_empty());
    }

    #[test]
    fn holders_are_gathered_per_broker_over_every_range() {
        use malachi_core::model::{Command, MetadataState, NodeId};
        let mut state = MetadataState::new();
        state
            .apply(Command::CreateTopic {
                topic: "t".into(),
                initial_ranges: 2,
                policy: None,
                replicas: vec![vec![NodeId(1), NodeId(2)], vec![NodeId(1), NodeId(2)]],
                at_ms: 0,
            })
            .unwrap();
        let holders = holders_of(&state, "t");
        assert_eq!(holders.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(holders[&1].len(), 2);
        assert_eq!(holders[&1], holders[&2]);
        assert!(holders_of(&state, "nope").is_empty());
    }
}
