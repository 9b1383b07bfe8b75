//! The follower's side of a replica-append: checked against its copy,
//! queued in offset order, answered after the fsync; repairs and rebuilds
//! to a recorded seal seal the copy once it is whole.

use super::*;

/// The follower's side of one replica-append: checked and queued in
/// offset order, answered by a task after the fsync. One that starts past
/// the copy's end comes back to be held.
pub(super) fn follower_append(storage: &Arc<Storage>, append: Early) -> Outcome {
    let id = malachi_storage::SegmentId(append.request.segment);
    // A repair to a recorded seal is what rebuilds a broken copy of a
    // sealed segment (ADR 0110): one the scrubber found broken, one
    // quarantined, or one whose open finds damage.
    let rebuilding = append.repair_to.is_some() && append.seal_at_end;
    if rebuilding {
        note_healing(storage, append.request.segment);
    }
    let info = match copy_info(storage, id, rebuilding) {
        Ok(info) => info,
        Err(answer) => return answered(append.reply, answer),
    };
    if let Some(answer) = whole_here(&info, &append.request, append.repair_to) {
        return answered(append.reply, answer);
    }
    // A fenced copy is not held: its refusal is `fenced`, now.
    if let Ok(info) = &info
        && append.request.first_offset > info.assigned
        && (!info.fenced || append.repair_to.is_some())
    {
        let assigned = info.assigned;
        return Outcome::Early(append, assigned);
    }
    let Early {
        permit,
        request,
        repair_to,
        seal_at_end,
        reply,
    } = append;
    let ticket = match queue_frames(storage, id, &request, repair_to, seal_at_end) {
        Ok(ticket) => ticket,
        Err(answer) => return answered(reply, answer),
    };
    let end = ticket.offsets().end;
    let seal_to = repair_to.filter(|_| seal_at_end);
    let answer = answer_when_durable(Arc::clone(storage), id, ticket, seal_to, request.topic);
    tokio::spawn(async move {
        let _permit = permit;
        let _ = reply.send(answer.await);
    });
    Outcome::Appended { end }
}

/// Sends an answer given without writing anything.
fn answered(
    reply: oneshot::Sender<ReplicaAppendResponse>,
    answer: ReplicaAppendResponse,
) -> Outcome {
    let _ = reply.send(answer);
    Outcome::Done
}

/// Records that a copy is being rebuilt, for the scrubber and `topic
/// describe`. Bounded: one entry per copy being filled, and heals are few.
fn note_healing(storage: &Storage, segment: u64) {
    let mut healing = storage.replication.healing.lock();
    if healing.len() < HEALING_TRACKED_MAX || healing.contains_key(&segment) {
        healing.insert(segment, std::time::Instant::now());
    }
}

/// The copy's state, opened first if this broker has not opened it since
/// it started (opening recovers it: a torn tail truncated, damage
/// refused), and set aside first when a rebuild finds it broken. `Err` is
/// the refusal to answer at once.
fn copy_info(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    rebuilding: bool,
) -> Result<Result<malachi_storage::SegmentInfo, StorageError>, ReplicaAppendResponse> {
    let store = &storage.store;
    let mut info = store.info(id);
    let mut damaged_at_open = false;
    if let Err(StorageError::NotOpen { .. }) = info {
        match tokio::task::block_in_place(|| store.open(id)) {
            Ok(_) => {}
            Err(StorageError::Damaged { .. }) if rebuilding => damaged_at_open = true,
            Err(e) => return Err(refusal_of(&e, 0)),
        }
        info = store.info(id);
    }
    // Only a rebuild asks the scrub book: an append takes no lock it need not.
    let broken = || {
        damaged_at_open
            || storage.scrub.book.lock().is_broken(id.0)
            || info.as_ref().is_ok_and(|i| i.failed || i.lost.is_some())
    };
    if rebuilding && broken() {
        tokio::task::block_in_place(|| set_aside_for_rebuild(storage, id))
            .map_err(|e| refusal_of(&e, 0))?;
        info = store.info(id);
    }
    Ok(info)
}

/// A repair to a seal this copy is already sealed at: the copy is whole,
/// so say so, whatever was sent (or refuse what reaches past the seal).
fn whole_here(
    info: &Result<malachi_storage::SegmentInfo, StorageError>,
    request: &ReplicaAppendRequest,
    repair_to: Option<u64>,
) -> Option<ReplicaAppendResponse> {
    let seal = repair_to?;
    let info = info.as_ref().ok()?;
    if info.sealed.is_none_or(|s| s.length != seal) {
        return None;
    }
    let answer = if request.first_offset + frame_count(&request.frames) > seal {
        ReplicaAppendResponse::refused(
            ReplicaRefusal::Fenced,
            seal,
            format!("segment {} is sealed at {seal} records", request.segment),
        )
    } else {
        ReplicaAppendResponse::durable(seal)
    };
    Some(answer)
}

/// Queues the request's frames on the copy: a follower's append (the copy
/// is followed from now on) or a repair. Sets the copy's committed end
/// first: a recorded seal is committed; a failover's repair length is not
/// yet (a successor coordinator may record a shorter one), so readers of
/// this copy see nothing new until the seal order.
fn queue_frames(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    request: &ReplicaAppendRequest,
    repair_to: Option<u64>,
    seal_at_end: bool,
) -> Result<malachi_storage::AppendTicket, ReplicaAppendResponse> {
    let store = &storage.store;
    if repair_to.is_none() {
        storage
            .replication
            .followed
            .lock()
            .insert(SegmentId(request.segment));
    }
    let committed = match repair_to {
        Some(seal) if seal_at_end => seal,
        _ => request.committed_end,
    };
    store
        .set_committed(id, committed)
        .map_err(|e| refusal_of(&e, 0))?;
    let end_now = || store.info(id).map_or(0, |i| i.assigned);
    if let Err(refused) = room_for(storage, request) {
        return Err(ReplicaAppendResponse::refused(
            ReplicaRefusal::Busy,
            end_now(),
            refused.to_string(),
        ));
    }
    let appended = match repair_to {
        None => store.append_frames(id, request.first_offset, &request.frames),
        Some(seal) => store.repair_frames(id, request.first_offset, &request.frames, seal),
    };
    appended.map_err(|e| {
        debug!(segment = request.segment, first = request.first_offset, error = %e, "replica append refused");
        refusal_of(&e, end_now())
    })
}

/// The answer to a queued append, once its frames are durable (or failed).
/// A repaired copy that reached its seal (`seal_to`) is sealed there first:
/// whole, and fenced for good.
async fn answer_when_durable(
    storage: Arc<Storage>,
    id: malachi_storage::SegmentId,
    ticket: malachi_storage::AppendTicket,
    seal_to: Option<u64>,
    topic: String,
) -> ReplicaAppendResponse {
    let answer = match ticket.await {
        Ok(offsets) => ReplicaAppendResponse::durable(offsets.end),
        Err(e) => {
            if e.is_no_space() && storage.space.note_no_space(storage.clock.now_ms()) {
                error!(segment = id.0, error = %e, "the data volume is full; records are refused until space is freed");
            }
            refusal_of(&e, 0)
        }
    };
    if let Some(seal) = seal_to
        && answer.refused.is_none()
        && answer.durable_end == seal
    {
        seal_caught_up(&storage, id, seal).await;
    }
    // Readers of this copy may see more committed records now.
    storage.notify_topic(&topic);
    answer
}

/// Seals a repaired copy that reached its recorded seal.
async fn seal_caught_up(storage: &Arc<Storage>, id: malachi_storage::SegmentId, seal: u64) {
    let store = Arc::clone(&storage.store);
    match tokio::task::spawn_blocking(move || store.seal(id, seal)).await {
        Ok(Ok(_)) => {
            if storage.store.is_aside(id) {
                storage.metrics.rebuilds.increment(1);
                info!(
                    segment = id.0,
                    length = seal,
                    "a broken copy was rebuilt from an intact copy and sealed"
                );
            } else {
                info!(
                    segment = id.0,
                    length = seal,
                    "a copy short of its seal caught up and sealed"
                );
            }
            storage.replication.followed.lock().remove(&SegmentId(id.0));
        }
        Ok(Err(e)) if e.is_no_space() => {
            info!(segment = id.0, error = %e, "no room to seal a caught-up copy; it is sealed once there is")
        }
        Ok(Err(e)) => warn!(segment = id.0, error = %e, "cannot seal a caught-up copy"),
        Err(e) => {
            warn!(segment = id.0, error = %e, "the seal task of a caught-up copy failed")
        }
    }
}

/// Whether the volume has room for an append's frames above the free-space
/// line (`store.min_free_bytes`, ADR 0111), checked against the bytes about
/// to be written (ADR 0127). A follower's append, a heal's or rebuild's
/// repair and a failover's repair are refused past it with the message
/// given back: `busy`, which the primary's shipper, the healer and the
/// failover retry, and which never reaches the volume, so the copy is not
/// latched failed by an `ENOSPC`. A failover's repair is not exempt: a
/// copy far behind takes a whole segment's tail that way (found by
/// `tests/full_volume.rs`), and the failover seals on the other copies.
pub(super) fn room_for(storage: &Storage, request: &ReplicaAppendRequest) -> Result<(), NoRoom> {
    let bytes = request.frames.len() as u64;
    if bytes == 0 {
        return Ok(());
    }
    let refused = storage.space.try_take(bytes).err().map(|no_room| {
        let line = storage.space.min_free_bytes();
        if no_room.became_full {
            error!(
                segment = request.segment,
                free_bytes = no_room.free_bytes,
                min_free_bytes = line,
                bytes,
                "the data volume reached its free-space line; replica appends, heals and produces are refused until space is freed"
            );
        }
        NoRoom {
            free_bytes: no_room.free_bytes,
            bytes,
            min_free_bytes: line,
        }
    });
    refused.map_or(Ok(()), Err)
}

/// An append refused because its frames would cross the free-space line;
/// its text is the `busy` refusal's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the data volume has {free_bytes} bytes free, {bytes} more would cross the free-space line of {min_free_bytes}"
)]
pub(super) struct NoRoom {
    pub free_bytes: u64,
    pub bytes: u64,
    pub min_free_bytes: u64,
}

/// Sets a broken copy aside and opens an empty one in its place, which the
/// repair then fills from an intact copy (ADR 0110). The broken original
/// stays aside until the rebuilt copy scrubs intact.
pub(super) fn set_aside_for_rebuild(
    storage: &Storage,
    id: malachi_storage::SegmentId,
) -> Result<(), StorageError> {
    let moved = storage.store.set_aside(id)?;
    storage.scrub.book.lock().forget(id.0);
    storage.store.open(id)?;
    warn!(
        segment = id.0,
        original_kept = moved,
        "rebuilding a broken copy of a sealed segment from an intact copy"
    );
    Ok(())
}

/// The typed refusal a store error becomes (one place: ADR 0095).
pub(super) fn refusal_of(e: &StorageError, end: u64) -> ReplicaAppendResponse {
    let refusal = match e {
        StorageError::NotAtEnd { end, .. } => {
            return ReplicaAppendResponse::refused(ReplicaRefusal::NotAtEnd, *end, e.to_string());
        }
        StorageError::BadFrames { .. }
        | StorageError::RecordTooLarge { .. }
        | StorageError::BatchTooLarge { .. } => ReplicaRefusal::BadFrames,
        StorageError::Fenced { .. }
        | StorageError::Sealed { .. }
        | StorageError::PastSeal { .. } => ReplicaRefusal::Fenced,
        StorageError::Busy { .. } => ReplicaRefusal::Busy,
        StorageError::NotOpen { .. } => ReplicaRefusal::UnknownCopy,
        _ => ReplicaRefusal::Failed,
    };
    ReplicaAppendResponse::refused(refusal, end, e.to_string())
}

/// How many whole frames `frames` starts with (a count, for a refusal).
pub(super) fn frame_count(frames: &[u8]) -> u64 {
    let (mut at, mut count) = (0, 0);
    while at < frames.len() {
        match malachi_storage::frame::decode(&frames[at..]) {
            Ok((_, len)) => {
                at += len;
                count += 1;
            }
            Err(_) => break,
        }
    }
    count
}
