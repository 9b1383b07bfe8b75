//! Reconcile: make this broker's segment actors and copies match the
//! metadata its replicas hold. Level-triggered (the manager runs it on
//! every applied change, at start and after the storage supervisor
//! restarts): start the writers of the active segments led here, seal the
//! followed copies the metadata records sealed, stop and settle deposed
//! writers (`settle.rs` says which), stop the actors of deleted segments.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use malachi_core::model::{NodeId, SegmentId, TopicDescription};
use tokio::time::error::Elapsed;
use tracing::{debug, info, warn};

use super::CoordError;
use super::lifecycle::start_segment_within;
use super::settle::{Deposed, Here, Scan};
use crate::common::error::MetadataError;
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::segment_stop::{segment_name, stop_segment_actor, stop_segment_actors};

use crate::control::shared::Shared;

/// Starts every active segment actor the metadata assigns to this broker,
/// over every replica it holds, and stops the actors of segments no replica
/// knows any more (their topic was deleted, possibly by another broker's
/// coordinator). Level-triggered: the manager runs it on every applied
/// change, at start and after the storage supervisor restarts.
pub(crate) async fn reconcile(shared: &Arc<Shared>) -> Result<(), CoordError> {
    let plane = shared.plane()?;
    let here = Here {
        node: NodeId(shared.config.node_id),
        running: shared.data.segments.lock().keys().copied().collect(),
        settled: shared.memory.settled.lock().clone(),
        refused: shared.memory.refused.lock().clone(),
        followed: shared
            .data
            .replication
            .followed
            .lock()
            .iter()
            .copied()
            .collect(),
    };
    let mut scan = Scan::default();
    plane.view_each(&mut |state| scan.view(state, &here));
    // Sealing and settling write markers and cut logs: while the volume is
    // full they would only fail, once per copy on every pass (hundreds of
    // lines a second under metadata traffic), so they wait for room; a
    // later pass does them.
    let full = shared.data.space.is_full();
    if !full {
        seal_followed(shared, &scan.to_seal).await;
        settle_deposed(shared, &here.running, scan.deposed).await;
    }
    // This replica may lag its leader (most after a restart or a
    // partition): a segment it shows active may be sealed by a failover,
    // or deleted, already. Its leader says first (ADR 0127, 0163).
    // One the leader records sealed is a deposed writer's copy: settled
    // now, from the recorded seal, without waiting for this replica to
    // apply it (the range may have rolled, split or merged since, and be
    // no longer among those scanned above).
    let (held, sealed) = sealed_at_leader(shared, &scan.wanted).await;
    if !full {
        for (segment, length) in sealed {
            if seal_deposed(shared, segment, length).await {
                shared.memory.settled.lock().insert(segment);
            }
        }
    }
    start_wanted(shared, scan.wanted, &held).await?;
    let orphans: Vec<SegmentId> = here
        .running
        .into_iter()
        .filter(|id| !scan.known.contains(id))
        .collect();
    // The copy stays on disk (a drop order or the orphan sweep removes
    // it, ADR 0115); only the actor and its open handle are released.
    stop_segment_actors(&shared.data, &orphans).await;
    // A refused writer that stopped (settled above, an orphan, or gone on
    // its own) is no longer waiting; a restarted one reports again.
    if !here.refused.is_empty() {
        let open: BTreeSet<SegmentId> = shared.data.segments.lock().keys().copied().collect();
        shared
            .memory
            .refused
            .lock()
            .retain(|id, _| open.contains(id));
    }
    Ok(())
}

/// Stops the deposed writers running here and settles their copies at the
/// recorded seal (`seal_deposed`), each settled copy remembered so later
/// passes skip it. Nothing without a storage supervisor.
async fn settle_deposed(shared: &Arc<Shared>, running: &[SegmentId], deposed: Vec<Deposed>) {
    let storage = shared.data.supervisor.read().clone();
    let Some(storage) = storage.filter(|_| !deposed.is_empty()) else {
        return;
    };
    for (topic, range, segment, length) in deposed {
        if running.contains(&segment) {
            let name = segment_name(&topic, range, segment);
            info!(segment = %name, length, "stopping the writer of a segment sealed without it");
            stop_segment_actor(&storage, &name).await;
            shared.data.segments.lock().remove(&segment);
        }
        if seal_deposed(shared, segment, length).await {
            shared.memory.settled.lock().insert(segment);
        }
    }
}

/// The writers of `wanted` to start: not running here (`running`), not
/// held back by the leader (`held`, see `sealed_at_leader`), and not
/// settled here as a deposed writer's copy (`settled`): the leader
/// recorded that segment sealed, and a seal is final, so a replica that
/// still shows it active has only not applied the seal yet. Regression:
/// the pass after the one that settled the copy found it open, so no
/// longer "restarting", and started a writer on it from the stale view
/// (`actors/tests/deposed_settling.rs`).
fn writers_to_start(
    wanted: Vec<(String, SegmentId)>,
    held: &BTreeSet<SegmentId>,
    settled: &BTreeSet<SegmentId>,
    running: impl Fn(SegmentId) -> bool,
) -> Vec<(String, SegmentId)> {
    wanted
        .into_iter()
        .filter(|(topic, segment)| {
            if settled.contains(segment) && !held.contains(segment) {
                debug!(%topic, %segment, "no writer for a copy settled at its recorded seal; this replica has not applied the seal yet");
            }
            !held.contains(segment) && !settled.contains(segment) && !running(*segment)
        })
        .collect()
}

/// Starts the writers [`writers_to_start`] names.
async fn start_wanted(
    shared: &Arc<Shared>,
    wanted: Vec<(String, SegmentId)>,
    held: &BTreeSet<SegmentId>,
) -> Result<(), CoordError> {
    let settled = shared.memory.settled.lock().clone();
    let start = writers_to_start(wanted, held, &settled, |id| shared.segment(id).is_some());
    for (topic, segment) in start {
        // One of the starts before it may have taken a while.
        if shared.segment(segment).is_some() {
            continue;
        }
        // No wait for the replica: this view already held the segment,
        // so a miss now means it was deleted. Waiting would hold the
        // manager's mailbox, and every request behind it, for seconds.
        match start_segment_within(shared, &topic, segment, 0).await {
            Ok(()) => {}
            // `wanted` comes from a view taken before the awaits above:
            // a topic deleted since has nothing left to start, and the
            // next reconcile (the delete's apply triggers one) sees that.
            Err(CoordError::UnknownSegment { segment }) => {
                debug!(%topic, %segment, "segment deleted before it could start");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Seals the follower copies whose segment the metadata records sealed, at
/// the recorded length, and stops following them. A copy shorter than its
/// seal is left open and followed: the primary's catch-up fills it up to
/// the seal and the ReplicationServer seals it then (ADR 0097); a failure
/// is logged and retried on the next reconcile.
pub(super) async fn seal_followed(shared: &Arc<Shared>, to_seal: &[(SegmentId, u64)]) {
    for &(segment, length) in to_seal {
        let store = Arc::clone(&shared.store);
        let id = malachi_storage::SegmentId(segment.0);
        let sealed = tokio::task::spawn_blocking(move || {
            let info = store.info(id)?;
            if info.durable < length {
                return Ok(false);
            }
            store.seal(id, length).map(|_| true)
        })
        .await;
        match sealed {
            Ok(Ok(true)) => {
                shared.data.replication.followed.lock().remove(&segment);
                debug!(segment = segment.0, length, "follower copy sealed");
            }
            Ok(Ok(false)) => {
                debug!(
                    segment = segment.0,
                    length, "follower copy shorter than its seal"
                );
            }
            Ok(Err(e)) if e.is_no_space() => {
                // The volume filled since the pass began: the guard holds
                // it full, and a pass after it has room seals the copy.
                shared.data.space.note_no_space(shared.clock.now_ms());
                debug!(segment = segment.0, length, error = %e, "a follower copy waits for room to be sealed");
                return;
            }
            Ok(Err(e)) => {
                warn!(segment = segment.0, length, error = %e, "cannot seal a follower copy")
            }
            Err(e) => warn!(segment = segment.0, error = %e, "the follower seal task failed"),
        }
    }
}

/// Settles this broker's copy of a segment it wrote and that was sealed
/// without it (the seed's SealedOverrun): sealed at the recorded length,
/// so reads are clamped to it, then cut back to it, so the bytes past the
/// seal (never acknowledged: the seal covers every acknowledged record) are
/// gone. A copy shorter than the seal is left for healing. Returns whether
/// the copy is settled; a failure is logged and retried on a later pass.
pub(super) async fn seal_deposed(shared: &Arc<Shared>, segment: SegmentId, length: u64) -> bool {
    let store = Arc::clone(&shared.store);
    let id = malachi_storage::SegmentId(segment.0);
    let settled = tokio::task::spawn_blocking(move || {
        if let Err(malachi_storage::StorageError::NotOpen { .. }) = store.info(id) {
            if !store.has_copy(id) {
                // No copy here (it was never written, or healing moved it).
                return Ok((true, 0));
            }
            store.open(id)?;
        }
        let info = store.info(id)?;
        if info.sealed.is_none() {
            if info.durable < length {
                return Ok((false, 0));
            }
            store.seal(id, length)?;
        }
        store.cut_to_seal(id).map(|cut| (true, cut))
    })
    .await;
    match settled {
        Ok(Ok((true, cut))) => {
            if cut > 0 {
                info!(
                    segment = segment.0,
                    length,
                    cut_bytes = cut,
                    "a deposed writer's copy cut to the recorded seal"
                );
            }
            true
        }
        Ok(Ok((false, _))) => false,
        Ok(Err(e)) if e.is_no_space() => {
            shared.data.space.note_no_space(shared.clock.now_ms());
            debug!(segment = segment.0, length, error = %e, "a deposed writer's copy waits for room to be settled");
            false
        }
        Ok(Err(e)) => {
            warn!(segment = segment.0, length, error = %e, "cannot settle a deposed writer's copy");
            false
        }
        Err(e) => {
            warn!(segment = segment.0, error = %e, "the settle task of a deposed writer's copy failed");
            false
        }
    }
}

/// How long reconcile waits for a vnode's leader to say whether the
/// segments a writer would take are still active.
pub(super) const LEADER_CONFIRM_MS: u64 = 2_000;

/// Of the active segments reconcile would start a writer for (`wanted`),
/// those of more than one copy that the topic's vnode leader does not
/// record active, or whose leader could not say within
/// [`LEADER_CONFIRM_MS`] (a later pass asks again): no writer starts for
/// them. This broker's replica may lag its leader, most after a restart or
/// a partition: it may not have applied a failover's seal yet (a writer
/// started on it would open the deposed copy and take produces past the
/// seal, issue 36), or a delete (a writer would re-create a copy a drop
/// order or a finished removal took away). Whether the copy exists, or
/// was opened by a read, says nothing about that, so every such start is
/// asked (ADR 0163). A lone copy (nobody else can seal it) starts without
/// asking. Also returns those the leader records sealed, with their
/// recorded seal length, to settle.
pub(super) async fn sealed_at_leader(
    shared: &Arc<Shared>,
    wanted: &[(String, SegmentId)],
) -> (BTreeSet<SegmentId>, Vec<(SegmentId, u64)>) {
    let mut held = BTreeSet::new();
    let mut sealed = Vec::new();
    let Ok(plane) = shared.plane() else {
        return (held, sealed);
    };
    let asked = replicated_to_confirm(shared, plane.as_ref(), wanted);
    let timeout = std::time::Duration::from_millis(LEADER_CONFIRM_MS);
    let answers = futures::future::join_all(asked.into_iter().map(|(topic, segments)| {
        let plane = Arc::clone(&plane);
        async move {
            let described = tokio::time::timeout(timeout, plane.describe(topic)).await;
            (topic, segments, described)
        }
    }))
    .await;
    for (topic, segments, described) in answers {
        // Each segment the leader knows: whether it is active, and its
        // recorded seal length if sealed.
        let states = leader_states(topic, described);
        for segment in segments {
            match states.get(&segment.0) {
                Some((true, _)) => continue,
                Some((false, Some(length))) => {
                    info!(%topic, segment = segment.0, length, "the leader records this writer's segment sealed without it; no writer restarts, its copy is settled at the seal");
                    sealed.push((segment, *length));
                }
                _ => {
                    // Debug: a pass runs on every applied change, and this one
                    // repeats until the replica applies the seal.
                    debug!(%topic, segment = segment.0, "no writer restarts on this copy: the leader did not say its segment is active");
                }
            }
            held.insert(segment);
        }
    }
    (held, sealed)
}

/// Of the active segments reconcile would start a writer for, by topic,
/// those with no writer running here and more than one copy: their
/// leader is asked first.
fn replicated_to_confirm<'a>(
    shared: &Shared,
    plane: &dyn MetadataPlane,
    wanted: &'a [(String, SegmentId)],
) -> BTreeMap<&'a str, Vec<SegmentId>> {
    let mut asked: BTreeMap<&str, Vec<SegmentId>> = BTreeMap::new();
    for (topic, segment) in wanted {
        let replicated = read_owner(plane, topic, |state| {
            state
                .segment(*segment)
                .is_some_and(|s| s.replicas.len() > 1)
        });
        if shared.segment(*segment).is_none() && replicated {
            asked.entry(topic.as_str()).or_default().push(*segment);
        }
    }
    asked
}

/// Each segment of `topic` its leader described: whether it is active, and
/// its recorded seal length if sealed. Nothing when the leader could not
/// say (a later pass asks again).
fn leader_states(
    topic: &str,
    described: Result<Result<Option<TopicDescription>, MetadataError>, Elapsed>,
) -> BTreeMap<u64, (bool, Option<u64>)> {
    match described {
        Ok(Ok(Some(description))) => description
            .ranges
            .iter()
            .flat_map(|r| r.segments.iter())
            .map(|s| (s.id, (s.state == "active", s.length)))
            .collect(),
        Ok(Ok(None)) => BTreeMap::new(),
        Ok(Err(e)) => {
            debug!(%topic, error = %e, "the topic's leader cannot say whether a writer's segment is active; asked again at the next pass");
            BTreeMap::new()
        }
        Err(_) => {
            debug!(%topic, "the topic's leader did not say in time whether a writer's segment is active; asked again at the next pass");
            BTreeMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_settled_at_its_seal_gets_no_writer_from_a_stale_view() {
        let wanted: Vec<(String, SegmentId)> =
            (1..=4).map(|i| ("t".into(), SegmentId(i))).collect();
        let held = BTreeSet::from([SegmentId(1)]);
        let settled = BTreeSet::from([SegmentId(2)]);
        let running = |id: SegmentId| id == SegmentId(3);
        let start = writers_to_start(wanted, &held, &settled, running);
        assert_eq!(start, vec![("t".to_owned(), SegmentId(4))]);
    }
}
