//! `produce`: route each record to its key's active range, append each
//! range's records to its active segment actor in chunks, retry across
//! rolls, splits and merges, and answer only once every record is durable
//! (`docs/life-of-a-produce.md`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use malachi_cluster::model::{MetadataState, RangeId, TopicState};
use malachi_supervision::SupervisionError;
use malachi_wire::ErrorCode;
use malachi_wire::messages as wire;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::reply::{Failure, not_serving};
use crate::common::convert::IncomingRecord;
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::shared::Shared;
use crate::data::segment::{AppendError, SegmentMsg};

/// Records one append message carries at most (the store's batch bound is larger).
const APPEND_CHUNK_RECORDS: usize = 10_000;
/// How long a producer waits before retrying a range whose segment is rolling.
const ROLL_RETRY_MS: u64 = 1;

pub(crate) async fn produce(
    shared: &Arc<Shared>,
    req: wire::ProduceRequest,
) -> Result<wire::ProduceResponse, Failure> {
    let deadline = Instant::now() + Duration::from_millis(shared.config.produce_timeout_ms);
    let plane = shared.plane().map_err(not_serving)?;
    let value_max = shared.config.record_value_bytes_max;
    let now_ms = shared.clock.now_ms();
    let incoming = req.records.records();
    let mut records = Vec::with_capacity(incoming.len());
    for (index, record) in incoming.into_iter().enumerate() {
        // Keys route records to ranges, and per-key order is the ordering
        // guarantee: a record without a key has neither (ADR 0063).
        if record.key.is_empty() {
            return Err((
                ErrorCode::InvalidRequest,
                format!("record {index} has an empty key; every record needs a key"),
            ));
        }
        if record.value.len() > value_max {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "record {index} has a value of {} bytes, over the limit of {value_max} bytes",
                    record.value.len()
                ),
            ));
        }
        records.push(IncomingRecord::from_wire(record, now_ms));
    }
    let total = records.len() as u32;
    let topic = req.topic;
    let groups = read_owner(plane.as_ref(), &topic, |state| {
        route(state, &topic, records)
    })?;
    let parts = groups.into_iter().map(|(range, records)| {
        let shared = Arc::clone(shared);
        let plane = Arc::clone(&plane);
        let topic = topic.clone();
        async move {
            // Chunks of one range go one after the other; a chunk whose range
            // was split or merged meanwhile is routed again, ahead of the
            // chunks after it, so per-key order holds.
            let mut pending: std::collections::VecDeque<(RangeId, Vec<IncomingRecord>)> =
                std::collections::VecDeque::new();
            let mut rest = records.into_iter().peekable();
            while rest.peek().is_some() {
                pending.push_back((range, rest.by_ref().take(APPEND_CHUNK_RECORDS).collect()));
            }
            while let Some((range, chunk)) = pending.pop_front() {
                if let Some(chunk) =
                    append_chunk(&shared, plane.as_ref(), &topic, range, chunk, deadline).await?
                {
                    let regrouped =
                        read_owner(plane.as_ref(), &topic, |state| route(state, &topic, chunk))?;
                    for part in regrouped.into_iter().rev() {
                        pending.push_front(part);
                    }
                }
            }
            Ok::<(), Failure>(())
        }
    });
    for result in futures::future::join_all(parts).await {
        result?;
    }
    Ok(wire::ProduceResponse {
        records_acknowledged: total,
    })
}

/// Groups records by the active range of their key, keeping their order.
fn route(
    state: &MetadataState,
    topic: &str,
    records: Vec<IncomingRecord>,
) -> Result<BTreeMap<RangeId, Vec<IncomingRecord>>, Failure> {
    let Some(found) = state.topic(topic) else {
        return Err((ErrorCode::TopicNotFound, format!("no such topic {topic}")));
    };
    if matches!(found.state, TopicState::Sealed { .. }) {
        return Err((ErrorCode::TopicSealed, format!("topic {topic} is sealed")));
    }
    let mut groups: BTreeMap<RangeId, Vec<IncomingRecord>> = BTreeMap::new();
    for record in records {
        let Some(range) = state.route_key(topic, &record.key) else {
            return Err((
                ErrorCode::UnknownServerError,
                format!("topic {topic} has no active range for a key"),
            ));
        };
        groups.entry(range.id).or_default().push(record);
    }
    Ok(groups)
}

/// Appends one chunk to its range's active segment, retrying across rolls
/// until it is durable or the deadline passes. Returns the chunk back if its
/// range is no longer active (split or merged): the caller routes it again.
async fn append_chunk(
    shared: &Arc<Shared>,
    plane: &dyn MetadataPlane,
    topic: &str,
    range: RangeId,
    records: Vec<IncomingRecord>,
    deadline: Instant,
) -> Result<Option<Vec<IncomingRecord>>, Failure> {
    let bytes: u64 = records
        .iter()
        .map(|r| (r.key.len() + r.value.len()) as u64)
        .sum();
    let records = Arc::new(records);
    let timeout = || {
        (
            ErrorCode::Timeout,
            "the produce was not acknowledged in time; it may or may not be durable".to_string(),
        )
    };
    loop {
        if Instant::now() >= deadline {
            return Err(timeout());
        }
        let active = read_owner(plane, topic, |state| {
            state
                .range(range)
                .filter(|r| r.is_active())
                .and_then(|r| r.last_segment())
        });
        let Some(segment) = active else {
            return Ok(Some(Arc::unwrap_or_clone(records)));
        };
        let Some(handle) = shared.segment(segment) else {
            // The segment actor is starting (after a roll or a restart).
            tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
            continue;
        };
        let (reply, answer) = oneshot::channel();
        let batch = Arc::clone(&records);
        let sent = tokio::time::timeout_at(
            deadline,
            handle.actor.send(move |permit| SegmentMsg::Append {
                permit,
                records: batch,
                bytes,
                reply,
            }),
        )
        .await;
        match sent {
            Err(_) => return Err(timeout()),
            Ok(Err(SupervisionError::NotRunning)) | Ok(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
                continue;
            }
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => return Err(timeout()),
            // The actor died before it took the batch: nothing was appended.
            Ok(Err(_)) => {}
            Ok(Ok(Ok(_offsets))) => return Ok(None),
            Ok(Ok(Err(AppendError::Rolled))) => {}
            Ok(Ok(Err(AppendError::Busy(m)))) => return Err((ErrorCode::Busy, m)),
            Ok(Ok(Err(AppendError::Invalid(m)))) => return Err((ErrorCode::InvalidRequest, m)),
            Ok(Ok(Err(AppendError::Failed(m)))) => {
                return Err((ErrorCode::UnknownServerError, m));
            }
        }
        tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
    }
}
