//! `fetch`: read a topic from a cursor (or its start, or its tail) across
//! segments and epochs, within the request's and the frame's budgets, with
//! long poll: an empty read waits (bounded) for records to become durable.
//! The sealed segments this broker holds no usable copy of are read from
//! their holders through it (`remote.rs`, ADR 0118).

use std::collections::BTreeMap;
use std::time::Duration;

use malachi_core::cursor::{Cursor, Position};
use malachi_core::model::RangeId;
use malachi_wire::batch::BatchBuilder;
use malachi_wire::messages as wire;
use tokio::time::Instant;

use super::context::ReadCtx;
use super::error::ServeError;
use super::read::{
    LocalCopies, ReadBudget, ReadError, TailElsewhere, active_plans, active_segments, read_topic,
    response_control_bytes, tail_positions,
};
use super::remote::{REMOTE_ACTIVE_POLL_MS, read_through_holders};
use super::reply::{Failure, not_serving};
use crate::control::metadata::{MetadataPlane, read_owner};

/// Records one store read returns at most.
const READ_CHUNK_RECORDS: usize = 1024;

pub(crate) async fn fetch(
    broker: &ReadCtx,
    req: wire::FetchRequest,
) -> Result<wire::FetchResponse, Failure> {
    let plane = broker.place.plane().map_err(not_serving)?;
    let wait_ms = u64::from(req.wait_ms).min(broker.fetch_wait_ms_max);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let topic = req.topic.clone();
    let keys = super::cursors::keys(broker)?;
    let verified = match &req.cursor {
        Some(encoded) => Some(super::cursors::verify(broker, encoded).await?),
        None => None,
    };
    let (incarnation, start) = caught_up_start(broker, plane.as_ref(), &req, verified).await?;
    // Subscribed only for a topic that exists (the map must not grow with
    // names clients make up), and before the first read, so a record made
    // durable between that read and the wait still wakes it.
    let mut durable = broker.data.watch_topic(&req.topic);
    let frame_max = broker.frame_bytes_max;
    loop {
        // Plans are cloned under the metadata lock; the disk is read without it.
        let me = broker.place.me;
        let (plans, copies) = read_owner(plane.as_ref(), &topic, |state| {
            let plans = active_plans(state, &topic);
            let copies = LocalCopies::of(state, &plans, me)
                .with_metrics(&broker.metrics)
                .without_broken(&broker.data.scrub.book.lock())
                .with_unsettled(|segment| broker.data.replication.settled(segment));
            (plans, copies)
        });
        let remote_active = copies.reads_active_elsewhere(&plans);
        // The frame keeps room for a cursor over every range; the block gets
        // the rest. `bytes_max` bounds the block too, except that a first
        // record larger than it comes alone (within the frame), so a big
        // record never stalls a reader.
        let control = response_control_bytes(&topic, plans.len());
        let frame_room = frame_max.saturating_sub(control);
        let batch_max = (req.bytes_max as usize).min(frame_room);
        // A segment this broker cannot read is read from a holder (ADR
        // 0118, 0123), so this broker serves the whole read.
        let read = read_through_holders(broker, &topic, copies, batch_max, |copies| {
            let mut builder = BatchBuilder::with_capacity(frame_room, batch_max);
            let outcome = tokio::task::block_in_place(|| {
                read_topic(
                    &plans,
                    copies,
                    broker.store.as_ref(),
                    &start,
                    &mut builder,
                    ReadBudget {
                        records_max: req.records_max,
                        batch_bytes_max: batch_max,
                        read_chunk_records: READ_CHUNK_RECORDS,
                    },
                )
            })?;
            Ok((outcome, builder))
        })
        .await;
        let read = match read {
            Ok(read) => read,
            // A restarted primary's committed end is settling: a long poll
            // waits for it (its rise wakes `durable`); at the deadline the
            // reader gets the retriable refusal, never a false "nothing
            // more" (ADR 0139).
            Err(ReadError::Unsettled { .. }) if Instant::now() < deadline => {
                wait_for_records(broker, &mut durable, deadline, remote_active).await?;
                continue;
            }
            Err(e) => return Err(e.refusal(&topic, frame_max, control)),
        };
        let (batch, positions, records, bytes) = (
            read.out.finish(),
            read.outcome.positions,
            read.outcome.records,
            read.outcome.bytes,
        );
        let expired = Instant::now() >= deadline;
        // Records read from a holder that were none of this range's still
        // moved the cursor: answered at once, so the next fetch goes on
        // from there rather than reading them again.
        if records > 0 || expired || read.moved {
            broker
                .metrics
                .records_consumed
                .increment(u64::from(records));
            broker.metrics.bytes_consumed.increment(bytes);
            let cursor = Cursor {
                topic: topic.clone(),
                incarnation,
                positions,
            };
            let next_cursor = cursor.encode(&keys).map_err(|e| ServeError::Internal {
                what: "encode a cursor",
                reason: e.to_string(),
            })?;
            return Ok(wire::FetchResponse {
                next_cursor,
                records: batch,
            });
        }
        wait_for_records(broker, &mut durable, deadline, remote_active).await?;
    }
}

/// Waits for more records of the topic (`durable`), at most to `deadline`.
async fn wait_for_records(
    broker: &ReadCtx,
    durable: &mut tokio::sync::watch::Receiver<u64>,
    deadline: Instant,
    remote_active: bool,
) -> Result<(), ServeError> {
    // Another broker's appends to an active segment read through this
    // one do not wake `durable`: a timer does (ADR 0123).
    let look_again = if remote_active {
        deadline.min(Instant::now() + Duration::from_millis(REMOTE_ACTIVE_POLL_MS))
    } else {
        deadline
    };
    tokio::select! {
        _ = tokio::time::sleep_until(look_again) => Ok(()),
        _ = durable.changed() => Ok(()),
        _ = broker.draining.cancelled() => Err(ServeError::Draining),
    }
}

/// How long a read waits for this broker's metadata replica to apply what
/// a cursor names before it answers the retriable `busy` (F5, ADR 0120).
const CURSOR_CATCH_UP_WAIT_MS: u64 = 1_000;

/// `start_positions`, waiting (at most `CURSOR_CATCH_UP_WAIT_MS`) while
/// this broker's replica of the metadata is behind the cursor: a cursor
/// another broker minted from a newer state (a failover's successor
/// segment, a split's ranges) is judged only once this replica has
/// applied that state, and never refused as stale before (chaos finding
/// F5).
pub(crate) async fn caught_up_start(
    broker: &ReadCtx,
    plane: &dyn MetadataPlane,
    req: &wire::FetchRequest,
    verified: Option<Cursor>,
) -> Result<(u64, BTreeMap<RangeId, Position>), Failure> {
    let mut applied = plane.subscribe();
    let deadline = Instant::now() + Duration::from_millis(CURSOR_CATCH_UP_WAIT_MS);
    loop {
        match start_positions(broker, plane, req, verified.clone()) {
            Ok((incarnation, mut positions, elsewhere)) => {
                for tail in elsewhere {
                    let end = super::remote::readable_end(broker, &tail).await?;
                    positions.insert(
                        tail.range,
                        Position::At {
                            segment: tail.segment,
                            offset: tail.start_offset + end,
                        },
                    );
                }
                return Ok((incarnation, positions));
            }
            Err(ServeError::MetadataBehind { reason, .. }) => {
                // Woken by every command a local replica applies; the
                // deadline bounds the wait whatever happens.
                let woke = tokio::time::timeout_at(deadline, applied.changed()).await;
                if !matches!(woke, Ok(Ok(()))) {
                    tracing::debug!(topic = %req.topic, %reason, "the metadata replica stayed behind a cursor");
                    return Err(ServeError::MetadataBehind {
                        reason,
                        waited_ms: CURSOR_CATCH_UP_WAIT_MS,
                    });
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// A fetch's start as this broker's metadata and copies give it: the
/// topic's incarnation, the positions, and the tail ranges another broker
/// must say the end of.
type StartPositions = (u64, BTreeMap<RangeId, Position>, Vec<TailElsewhere>);

/// Where a fetch starts: the client's cursor (`verified`: authenticated
/// by `cursors::verify`, checked against the metadata here), the start of
/// every range, or the tail.
fn start_positions(
    broker: &ReadCtx,
    plane: &dyn MetadataPlane,
    req: &wire::FetchRequest,
    verified: Option<Cursor>,
) -> Result<StartPositions, Failure> {
    let checked = read_owner(plane, &req.topic, |state| {
        let Some(topic) = state.topic(&req.topic) else {
            return Err(ServeError::TopicNotFound {
                topic: req.topic.clone(),
            });
        };
        let incarnation = topic.incarnation.0;
        let cursor = match verified {
            Some(cursor) => {
                cursor.validate(state).map_err(|e| match e {
                    malachi_core::cursor::InvalidCursor::Expired { .. } => {
                        ServeError::CursorExpired {
                            reason: e.to_string(),
                        }
                    }
                    malachi_core::cursor::InvalidCursor::ReplicaBehind(_) => {
                        ServeError::MetadataBehind {
                            reason: e.to_string(),
                            waited_ms: 0,
                        }
                    }
                    e => ServeError::InvalidCursor {
                        reason: e.to_string(),
                    },
                })?;
                if cursor.topic != req.topic {
                    return Err(ServeError::CursorOfOtherTopic {
                        cursor_topic: cursor.topic,
                    });
                }
                Some(cursor.positions)
            }
            None => None,
        };
        let copies = LocalCopies::of_active(state, &req.topic, broker.place.me)
            .with_metrics(&broker.metrics)
            .without_broken(&broker.data.scrub.book.lock());
        Ok((
            incarnation,
            cursor,
            active_segments(state, &req.topic),
            copies,
        ))
    })?;
    let (incarnation, cursor, active, copies) = checked;
    let (positions, elsewhere) = match cursor {
        Some(positions) => (positions, Vec::new()),
        None if req.from_start => (
            active
                .iter()
                .map(|&(range, _, _)| (range, Position::Start))
                .collect(),
            Vec::new(),
        ),
        None => {
            tokio::task::block_in_place(|| tail_positions(broker.store.as_ref(), &copies, &active))?
        }
    };
    Ok((incarnation, positions, elsewhere))
}
