//! `produce`: route each record to its key's active range, append each
//! range's records to its active segment actor in chunks, retry across
//! rolls, splits and merges, and answer only once every record is durable
//! (`docs/life-of-a-produce.md`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use malachi_cluster::model::{MetadataState, RangeId, TopicState};
use malachi_supervision::SupervisionError;
use malachi_wire::messages as wire;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::error::ServeError;
use super::reply::{Failure, not_serving};
use crate::common::convert::IncomingRecord;
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::shared::Shared;
use crate::data::invariants::{check_acknowledged, check_append, check_routed};
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
            return Err(ServeError::EmptyKey { index });
        }
        if record.value.len() > value_max {
            return Err(ServeError::ValueTooLarge {
                index,
                value_bytes: record.value.len(),
                value_bytes_max: value_max,
            });
        }
        records.push(IncomingRecord::from_wire(record, now_ms));
    }
    let requested = records.len();
    let topic = req.topic;
    let groups = read_owner(plane.as_ref(), &topic, |state| {
        route(state, &topic, records)
    })?;
    // Every record goes to exactly one range: what the ranges acknowledge
    // below must add up to the request.
    if let Err(violation) = check_routed(requested, groups.values().map(Vec::len)) {
        panic!("produce to {topic}: {violation}");
    }
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
            let mut acknowledged = 0usize;
            while let Some((range, chunk)) = pending.pop_front() {
                match append_chunk(&shared, plane.as_ref(), &topic, range, chunk, deadline).await? {
                    Appended::Durable { records } => acknowledged += records,
                    Appended::Moved(chunk) => {
                        let regrouped = read_owner(plane.as_ref(), &topic, |state| {
                            route(state, &topic, chunk)
                        })?;
                        for part in regrouped.into_iter().rev() {
                            pending.push_front(part);
                        }
                    }
                }
            }
            Ok::<usize, Failure>(acknowledged)
        }
    });
    let mut per_range = Vec::new();
    for result in futures::future::join_all(parts).await {
        per_range.push(result?);
    }
    // A reply never reports more records durable than the request held,
    // nor fewer than it made durable.
    let records_acknowledged = match check_acknowledged(requested, per_range) {
        Ok(count) => count,
        Err(violation) => panic!("produce to {topic}: {violation}"),
    };
    Ok(wire::ProduceResponse {
        records_acknowledged,
    })
}

/// How one chunk's append ended.
enum Appended {
    /// Every record of the chunk is durable.
    Durable { records: usize },
    /// The chunk's range is no longer active (split or merged): the records
    /// come back to be routed again.
    Moved(Vec<IncomingRecord>),
}

/// Groups records by the active range of their key, keeping their order.
fn route(
    state: &MetadataState,
    topic: &str,
    records: Vec<IncomingRecord>,
) -> Result<BTreeMap<RangeId, Vec<IncomingRecord>>, Failure> {
    let Some(found) = state.topic(topic) else {
        return Err(ServeError::TopicNotFound {
            topic: topic.to_owned(),
        });
    };
    if matches!(found.state, TopicState::Sealed { .. }) {
        return Err(ServeError::TopicSealed {
            topic: topic.to_owned(),
        });
    }
    let mut groups: BTreeMap<RangeId, Vec<IncomingRecord>> = BTreeMap::new();
    for record in records {
        let Some(range) = state.route_key(topic, &record.key) else {
            return Err(ServeError::NoActiveRange {
                topic: topic.to_owned(),
            });
        };
        groups.entry(range.id).or_default().push(record);
    }
    Ok(groups)
}

/// Appends one chunk to its range's active segment, retrying across rolls
/// until it is durable or the deadline passes. Gives the chunk back if its
/// range is no longer active (split or merged): the caller routes it again.
async fn append_chunk(
    shared: &Arc<Shared>,
    plane: &dyn MetadataPlane,
    topic: &str,
    range: RangeId,
    records: Vec<IncomingRecord>,
    deadline: Instant,
) -> Result<Appended, Failure> {
    let bytes: u64 = records
        .iter()
        .map(|r| (r.key.len() + r.value.len()) as u64)
        .sum();
    let count = records.len();
    let records = Arc::new(records);
    let timeout_ms = shared.config.produce_timeout_ms;
    let timeout = || ServeError::ProduceTimeout { timeout_ms };
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
            return Ok(Appended::Moved(Arc::unwrap_or_clone(records)));
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
            Ok(Ok(Ok(offsets))) => {
                // The segment acknowledged exactly this chunk's records.
                if let Err(violation) = check_append(offsets.start, count, &offsets) {
                    panic!("produce to {topic}, segment {}: {violation}", segment.0);
                }
                return Ok(Appended::Durable { records: count });
            }
            Ok(Ok(Err(AppendError::Rolled))) => {}
            Ok(Ok(Err(AppendError::Busy(reason)))) => {
                return Err(ServeError::SegmentBusy { segment, reason });
            }
            Ok(Ok(Err(AppendError::Invalid(reason)))) => {
                return Err(ServeError::BatchRefused { segment, reason });
            }
            Ok(Ok(Err(AppendError::Failed(reason)))) => {
                return Err(ServeError::StoreFailed { segment, reason });
            }
        }
        tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
    }
}
