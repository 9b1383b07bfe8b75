//! `produce`: one connection's produce requests, handed to each range's
//! writer in the order they arrived (ADR 0092, `docs/life-of-a-produce.md`).
//!
//! Every connection has one sequencer task. The connection's reader gives
//! it each produce request as it is read; the sequencer validates it, routes
//! its records to ranges and sends each range's part to the range's active
//! segment actor, one request after the other, so a range's writer receives
//! one connection's parts in arrival order. Only the waits for durability
//! overlap: a task per part awaits the segment's answer and reports back.
//!
//! A part refused because its segment rolled is sent again, and so is every
//! later part of the same range, in their original order, before anything
//! newer: a range's parts are all outstanding on one segment at a time, a
//! part for a range whose outstanding parts went to a segment no longer
//! active waits, and a new request waits while any range is in that state
//! (a roll, a split or a merge in flight: rare, and brief).
//!
//! An idempotent request (`producer` set) targets one range: the segment
//! actor checks its tag against the range's producer state (`data::
//! producers`), in mailbox order, and answers a retry of a stored batch with
//! the original acknowledgement. The answer says what each range did.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use malachi_core::model::{MetadataState, RangeId, SegmentId, TopicState, position};
use malachi_supervision::SupervisionError;
use malachi_wire::RequestFrame;
use malachi_wire::limits::{PRODUCER_HEADER, PRODUCER_START_HEADER, RESERVED_HEADER_PREFIX};
use malachi_wire::messages::{self as wire, Request};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::debug;

use super::context::ProduceCtx;
use super::error::ServeError;
use super::reply::{Inflight, Outbound, Reply, body_frame, redirect_reply, refusal_frame};
use super::subscribe::ConnCtx;
use crate::common::budget::{ConnectionBudget, Held};
use crate::common::convert::IncomingRecord;
use crate::control::metadata::read_owner;
use crate::control::placement::{Serve, moved_primary, range_redirect, serve_here};
use crate::data::invariants::{check_acknowledged, check_append, check_partial, check_routed};
use crate::data::producers::{self, ProducerTag, Verdict};
use crate::data::segment::{Ack, AppendError, SegmentMsg};

/// Records one append message carries at most (the store's batch bound is larger).
const APPEND_CHUNK_RECORDS: usize = 10_000;
/// How long a part waits before it tries again to reach a segment actor
/// that is starting (after a roll or a restart).
const ROLL_RETRY_MS: u64 = 1;

/// One produce request as the connection read it.
pub(crate) struct ProduceJob {
    pub frame: RequestFrame,
    /// The connection permit and the response budget of its answer.
    pub slot: Inflight,
    /// The request's bytes (the records borrow them) until it is answered.
    pub request_held: Held,
}

/// Starts the connection's sequencer; produce requests go to the returned
/// sender, in the order they were read. It ends once the sender is dropped
/// and every request it took is answered, or when the connection is cancelled.
pub(crate) fn spawn_sequencer(
    broker: Arc<ProduceCtx>,
    ctx: ConnCtx,
    budget: ConnectionBudget,
    capacity: usize,
) -> mpsc::Sender<ProduceJob> {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let sequencer = Sequencer {
        broker,
        ctx,
        budget,
        lanes: HashMap::new(),
        pending: HashMap::new(),
        stalled: None,
        events_tx,
        events_rx,
        next_ticket: 0,
        next_request: 0,
    };
    tokio::spawn(sequencer.run(rx));
    tx
}

/// A range's part of one request.
struct Part {
    request: u64,
    /// Arrival order across the connection: a part sent again keeps it.
    ticket: u64,
    /// The active range the part is sent to.
    range: RangeId,
    records: Arc<Vec<IncomingRecord>>,
    bytes: u64,
    producer: Option<ProducerTag>,
    deadline: Instant,
}

/// One range's parts on this connection.
#[derive(Default)]
struct Lane {
    /// The topic of the range (set when a part is first sent).
    topic: String,
    /// The segment every outstanding part was sent to.
    segment: Option<SegmentId>,
    /// Parts sent and not yet answered.
    outstanding: usize,
    /// Parts to send (again), by ticket.
    waiting: BTreeMap<u64, Part>,
}

impl Lane {
    fn is_idle(&self) -> bool {
        self.outstanding == 0 && self.waiting.is_empty()
    }
}

/// A request accepted and routed, awaiting its parts.
struct Pending {
    correlation_id: u32,
    slot: Inflight,
    _request_held: Held,
    topic: String,
    requested: usize,
    parts_left: usize,
    ranges: BTreeMap<RangeId, Tally>,
}

#[derive(Default)]
struct Tally {
    records: usize,
    acknowledged: usize,
    duplicate: bool,
    error: Option<ServeError>,
}

/// A validated request that waits for the ranges to settle before it is routed.
struct Admitted {
    correlation_id: u32,
    slot: Inflight,
    request_held: Held,
    topic: String,
    records: Vec<IncomingRecord>,
    producer: Option<wire::ProducerBatch>,
    deadline: Instant,
}

enum Outcome {
    Stored,
    Duplicate,
    /// The segment rolled (or its actor stopped) before taking the part.
    Rolled,
    Failed(ServeError),
}

struct Event {
    part: Part,
    outcome: Outcome,
}

struct Sequencer {
    broker: Arc<ProduceCtx>,
    ctx: ConnCtx,
    budget: ConnectionBudget,
    lanes: HashMap<RangeId, Lane>,
    pending: HashMap<u64, Pending>,
    stalled: Option<Admitted>,
    events_tx: mpsc::UnboundedSender<Event>,
    events_rx: mpsc::UnboundedReceiver<Event>,
    next_ticket: u64,
    next_request: u64,
}

impl Sequencer {
    async fn run(mut self, mut jobs: mpsc::Receiver<ProduceJob>) {
        let mut jobs_open = true;
        loop {
            self.pump().await;
            if !jobs_open && self.pending.is_empty() && self.stalled.is_none() {
                break;
            }
            let retry = self
                .lanes
                .values()
                .any(|l| l.outstanding == 0 && !l.waiting.is_empty());
            tokio::select! {
                biased;
                _ = self.ctx.cancel.cancelled() => break,
                Some(event) = self.events_rx.recv() => self.on_event(event),
                job = jobs.recv(), if jobs_open && self.stalled.is_none() => match job {
                    Some(job) => self.start(job).await,
                    None => jobs_open = false,
                },
                _ = tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)), if retry => {}
            }
        }
    }

    /// Sends what waits, lane by lane in ticket order, then the stalled
    /// request once no range is unsettled; repeats while anything moved.
    async fn pump(&mut self) {
        loop {
            let mut moved = false;
            let ranges: Vec<RangeId> = self.lanes.keys().copied().collect();
            for range in ranges {
                while let Some(lane) = self.lanes.get(&range) {
                    let Some((&ticket, _)) = lane.waiting.first_key_value() else {
                        break;
                    };
                    if lane.outstanding > 0 && !self.lane_may_send(range) {
                        break;
                    }
                    let Some(part) = self
                        .lanes
                        .get_mut(&range)
                        .and_then(|lane| lane.waiting.remove(&ticket))
                    else {
                        break;
                    };
                    match self.submit(part).await {
                        Sent::Deferred => break,
                        Sent::Done => moved = true,
                    }
                }
            }
            self.lanes.retain(|_, lane| !lane.is_idle());
            if let Some(admitted) = self.stalled.take() {
                match self.admit(admitted).await {
                    Ok(()) => moved = true,
                    Err(admitted) => self.stalled = Some(admitted),
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Whether a lane with parts outstanding may send more: only to the
    /// segment they went to, while it is still the range's active one.
    fn lane_may_send(&self, range: RangeId) -> bool {
        let Some(lane) = self.lanes.get(&range) else {
            return true;
        };
        let Ok(plane) = self.broker.place.plane() else {
            return false;
        };
        let active = read_owner(plane.as_ref(), &lane.topic, |state| {
            state
                .range(range)
                .filter(|r| r.is_active())
                .and_then(|r| r.last_segment())
        });
        active.is_some() && active == lane.segment
    }

    async fn start(&mut self, job: ProduceJob) {
        let correlation_id = job.frame.correlation_id;
        let request = match Request::decode(job.frame.api_key, job.frame.payload) {
            Ok(Request::Produce(request)) => request,
            Ok(_) => {
                let refusal = ServeError::Internal {
                    what: "route a produce",
                    reason: "the sequencer was given another operation".into(),
                };
                return self.answer(
                    correlation_id,
                    job.slot,
                    refusal_frame(correlation_id, &refusal),
                );
            }
            Err(e) => {
                let refusal = ServeError::Decode(e);
                return self.answer(
                    correlation_id,
                    job.slot,
                    refusal_frame(correlation_id, &refusal),
                );
            }
        };
        // Authorized first, in the one table (ADR 0150): a refusal writes
        // nothing and names no broker.
        if self.ctx.auth.enforced()
            && let Err(refusal) = self.ctx.auth.gate(&Request::Produce(request.clone())).await
        {
            return self.answer(
                correlation_id,
                job.slot,
                refusal_frame(correlation_id, &refusal),
            );
        }
        // Records are served by the broker hosting the topic's segments; any
        // other broker answers `not_leader` with that broker's address.
        if let Err(redirect) = serve_here(&self.broker.place, &request.topic, Serve::Write).await {
            return self.answer(
                correlation_id,
                job.slot,
                redirect_reply(redirect, correlation_id),
            );
        }
        // A full volume refuses at once: no append, no roll (ADR 0111). A
        // replicated segment moves to brokers with room: retriable there.
        // The batch's bytes count against the free-space line until the
        // next poll, as a follower's appends do (ADR 0127).
        let bytes = request.records.encoded_bytes() as u64;
        if let Err(no_room) = self.broker.data.space.try_take(bytes) {
            if no_room.became_full {
                tracing::error!(
                    free_bytes = no_room.free_bytes,
                    min_free_bytes = self.broker.data.space.min_free_bytes(),
                    bytes,
                    "the data volume reached its free-space line; produces, replica appends and heals are refused until space is freed"
                );
            }
            let refusal = full_refusal(&self.broker, replicated_here(&self.broker, &request.topic));
            return self.answer(
                correlation_id,
                job.slot,
                refusal_frame(correlation_id, &refusal),
            );
        }
        let deadline = Instant::now() + Duration::from_millis(self.broker.produce_timeout_ms);
        let records = match incoming(&self.broker, request.records) {
            Ok(records) => records,
            Err(refusal) => {
                return self.answer(
                    correlation_id,
                    job.slot,
                    refusal_frame(correlation_id, &refusal),
                );
            }
        };
        let admitted = Admitted {
            correlation_id,
            slot: job.slot,
            request_held: job.request_held,
            topic: request.topic,
            records,
            producer: request.producer,
            deadline,
        };
        if let Err(admitted) = self.admit(admitted).await {
            self.stalled = Some(admitted);
        }
    }

    /// Routes a request and sends its parts, unless a range of this
    /// connection is unsettled (its parts outstanding on a segment that is
    /// no longer active): then the request comes back, to wait.
    async fn admit(&mut self, admitted: Admitted) -> Result<(), Admitted> {
        if Instant::now() >= admitted.deadline {
            let refusal = ServeError::ProduceTimeout {
                timeout_ms: self.broker.produce_timeout_ms,
            };
            let id = admitted.correlation_id;
            self.answer(id, admitted.slot, refusal_frame(id, &refusal));
            return Ok(());
        }
        let plane = match self.broker.place.plane() {
            Ok(plane) => plane,
            Err(e) => {
                let id = admitted.correlation_id;
                self.answer(
                    id,
                    admitted.slot,
                    refusal_frame(id, &ServeError::Metadata(e)),
                );
                return Ok(());
            }
        };
        let lanes = &self.lanes;
        let routed = read_owner(plane.as_ref(), &admitted.topic, |state| {
            let unsettled = lanes.iter().any(|(range, lane)| {
                !lane.waiting.is_empty()
                    || (lane.outstanding > 0
                        && state
                            .range(*range)
                            .filter(|r| r.is_active())
                            .and_then(|r| r.last_segment())
                            != lane.segment)
            });
            if unsettled {
                return Ok(None);
            }
            match &admitted.producer {
                None => route(state, &admitted.topic, &admitted.records).map(Some),
                Some(batch) => route_tagged(state, &admitted.topic, &admitted.records, batch)
                    .map(|range| Some(vec![range; admitted.records.len()])),
            }
        });
        let ranges = match routed {
            Ok(Some(ranges)) => ranges,
            Ok(None) => return Err(admitted),
            Err(refusal) => {
                let id = admitted.correlation_id;
                self.answer(id, admitted.slot, refusal_frame(id, &refusal));
                return Ok(());
            }
        };
        let Admitted {
            correlation_id,
            slot,
            request_held,
            topic,
            mut records,
            producer,
            deadline,
        } = admitted;
        let requested = records.len();
        let tag = producer.map(|batch| ProducerTag {
            producer_id: batch.producer_id,
            epoch: batch.epoch,
            range: batch.range,
            sequence: batch.sequence,
            records: requested as u32,
        });
        if let (Some(tag), Some(last)) = (&tag, records.last_mut()) {
            // The tag rides into the log with the batch's last record.
            last.headers.push(malachi_wire::batch::Header {
                name: PRODUCER_HEADER.to_owned(),
                value: Bytes::copy_from_slice(&tag.encode()),
            });
        }
        if let (Some(tag), [first, _, ..]) = (&tag, records.as_mut_slice())
            && requested <= APPEND_CHUNK_RECORDS
        {
            // The first record says how many follow in its append, so
            // recovery can tell a log that ends inside the batch (a write
            // torn by a crash) and cut it rather than keep a prefix that the
            // batch's retry would store again.
            first.headers.push(malachi_wire::batch::Header {
                name: PRODUCER_START_HEADER.to_owned(),
                value: Bytes::copy_from_slice(&producers::encode_start(tag.records)),
            });
        }
        let mut groups: BTreeMap<RangeId, Vec<IncomingRecord>> = BTreeMap::new();
        for (record, range) in records.into_iter().zip(ranges) {
            groups.entry(range).or_default().push(record);
        }
        // Every record goes to exactly one range.
        if let Err(violation) = check_routed(requested, groups.values().map(Vec::len)) {
            panic!("produce to {topic}: {violation}");
        }
        let request = self.next_request;
        self.next_request += 1;
        let mut parts = Vec::new();
        for (range, records) in groups {
            let mut rest = records.into_iter().peekable();
            while rest.peek().is_some() {
                let chunk: Vec<IncomingRecord> = rest.by_ref().take(APPEND_CHUNK_RECORDS).collect();
                let bytes = chunk
                    .iter()
                    .map(|r| (r.key.len() + r.value.len()) as u64)
                    .sum();
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                parts.push(Part {
                    request,
                    ticket,
                    range,
                    records: Arc::new(chunk),
                    bytes,
                    producer: tag,
                    deadline,
                });
            }
        }
        self.pending.insert(
            request,
            Pending {
                correlation_id,
                slot,
                _request_held: request_held,
                topic,
                requested,
                parts_left: parts.len(),
                ranges: BTreeMap::new(),
            },
        );
        for part in parts {
            // Nothing of this connection is unsettled, so each part goes
            // straight to its range's segment (or waits its turn behind
            // an earlier part of its range that could not be sent yet).
            let lane = self.lanes.entry(part.range).or_default();
            if !lane.waiting.is_empty() {
                lane.waiting.insert(part.ticket, part);
                continue;
            }
            self.submit(part).await;
        }
        Ok(())
    }

    /// Sends one part to its range's active segment, or parks it in its
    /// lane (to be sent in ticket order), or resolves it (its deadline
    /// passed). A part whose range is no longer active is routed again.
    async fn submit(&mut self, part: Part) -> Sent {
        let timeout_ms = self.broker.produce_timeout_ms;
        if Instant::now() >= part.deadline {
            self.resolve(
                part,
                Outcome::Failed(ServeError::ProduceTimeout { timeout_ms }),
            );
            return Sent::Done;
        }
        let Some(topic) = self.pending.get(&part.request).map(|p| p.topic.clone()) else {
            return Sent::Done;
        };
        let plane = match self.broker.place.plane() {
            Ok(plane) => plane,
            Err(e) => {
                self.resolve(part, Outcome::Failed(ServeError::Metadata(e)));
                return Sent::Done;
            }
        };
        let active = read_owner(plane.as_ref(), &topic, |state| {
            Ok::<_, ServeError>(
                state
                    .range(part.range)
                    .filter(|r| r.is_active())
                    .and_then(|r| r.last_segment())
                    .map(|id| {
                        let primary = state.segment(id).and_then(|s| s.replicas.first().copied());
                        (id, primary)
                    }),
            )
        });
        let (segment, primary) = match active {
            Ok(Some(found)) => found,
            Ok(None) => return self.reroute(part, &topic),
            Err(refusal) => {
                self.resolve(part, Outcome::Failed(refusal));
                return Sent::Done;
            }
        };
        let lane = self.lanes.entry(part.range).or_default();
        if lane.outstanding > 0 && lane.segment != Some(segment) {
            lane.waiting.insert(part.ticket, part);
            return Sent::Deferred;
        }
        let Some(handle) = self.broker.data.segment(segment) else {
            // Another broker writes this range (a topic's ranges may have
            // different primaries): say which, at once. Held here, the part
            // waited out its deadline for a writer that never starts here,
            // and the client timed out (issue 36, five brokers).
            if let Some(primary) = primary
                && primary.0 != self.broker.place.me.0
            {
                let redirect = range_redirect(&self.broker.place, &topic, part.range, primary);
                self.resolve(part, Outcome::Failed(ServeError::Redirect(redirect)));
                return Sent::Done;
            }
            // The segment actor is starting (after a roll or a restart).
            lane.waiting.insert(part.ticket, part);
            return Sent::Deferred;
        };
        let (reply, answer) = oneshot::channel();
        let records = Arc::clone(&part.records);
        let bytes = part.bytes;
        let producer = part.producer;
        // The segment admits `segment_inflight_max` appends until their
        // fsync, across all connections. While this part waits for a
        // permit, the parts already sent keep being answered: otherwise
        // durable acknowledgements would wait for someone else's fsync, and
        // the client's window with them.
        let send = handle.actor.send(move |permit| SegmentMsg::Append {
            permit,
            records,
            bytes,
            producer,
            reply,
        });
        tokio::pin!(send);
        let deadline = tokio::time::sleep_until(part.deadline);
        tokio::pin!(deadline);
        let sent = loop {
            tokio::select! {
                biased;
                sent = &mut send => break Ok(sent),
                Some(event) = self.events_rx.recv() => self.on_event(event),
                _ = &mut deadline => break Err(()),
            }
        };
        match sent {
            Err(()) => {
                self.resolve(
                    part,
                    Outcome::Failed(ServeError::ProduceTimeout { timeout_ms }),
                );
                return Sent::Done;
            }
            Ok(Err(SupervisionError::NotRunning)) | Ok(Err(_)) => {
                let lane = self.lanes.entry(part.range).or_default();
                lane.waiting.insert(part.ticket, part);
                return Sent::Deferred;
            }
            Ok(Ok(())) => {}
        }
        let lane = self.lanes.entry(part.range).or_default();
        lane.outstanding += 1;
        lane.segment = Some(segment);
        lane.topic = topic;
        let events = self.events_tx.clone();
        let broker = Arc::clone(&self.broker);
        tokio::spawn(async move {
            let outcome = await_answer(&broker, &part, segment, answer, timeout_ms).await;
            let _ = events.send(Event { part, outcome });
        });
        Sent::Done
    }

    /// A part whose range was split or merged: a plain part's records go to
    /// the ranges that hold their keys now; an idempotent part goes, whole,
    /// to the active range holding its first key, whose producer state
    /// knows the old range's stream (and answers duplicate or moved).
    fn reroute(&mut self, part: Part, topic: &str) -> Sent {
        let Ok(plane) = self.broker.place.plane() else {
            self.resolve(part, Outcome::Failed(ServeError::CoordinatorDown));
            return Sent::Done;
        };
        let records = Arc::clone(&part.records);
        let routed = read_owner(plane.as_ref(), topic, |state| {
            if part.producer.is_some() {
                let first = records.first().map(|r| r.key.as_ref()).unwrap_or_default();
                return match state.route_key(topic, first) {
                    Some(range) => Ok(vec![range.id; records.len()]),
                    None => Err(ServeError::NoActiveRange {
                        topic: topic.to_owned(),
                    }),
                };
            }
            route(state, topic, &records)
        });
        let ranges = match routed {
            Ok(ranges) => ranges,
            Err(refusal) => {
                self.resolve(part, Outcome::Failed(refusal));
                return Sent::Done;
            }
        };
        let mut groups: BTreeMap<RangeId, Vec<IncomingRecord>> = BTreeMap::new();
        for (record, range) in records.iter().cloned().zip(ranges) {
            groups.entry(range).or_default().push(record);
        }
        if let Some(pending) = self.pending.get_mut(&part.request) {
            pending.parts_left += groups.len().saturating_sub(1);
        }
        for (range, records) in groups {
            let bytes = records
                .iter()
                .map(|r| (r.key.len() + r.value.len()) as u64)
                .sum();
            let moved = Part {
                request: part.request,
                ticket: part.ticket,
                range,
                records: Arc::new(records),
                bytes,
                producer: part.producer,
                deadline: part.deadline,
            };
            self.lanes
                .entry(range)
                .or_default()
                .waiting
                .insert(moved.ticket, moved);
        }
        Sent::Done
    }

    fn on_event(&mut self, event: Event) {
        let Event { part, outcome } = event;
        if let Some(lane) = self.lanes.get_mut(&part.range) {
            lane.outstanding = lane.outstanding.saturating_sub(1);
        }
        match outcome {
            Outcome::Rolled => {
                // Sent again, in its turn, to the range's next segment.
                self.lanes
                    .entry(part.range)
                    .or_default()
                    .waiting
                    .insert(part.ticket, part);
            }
            other => self.resolve(part, other),
        }
    }

    /// Records a part's final outcome; answers its request once it was the last.
    fn resolve(&mut self, part: Part, outcome: Outcome) {
        let Some(pending) = self.pending.get_mut(&part.request) else {
            return;
        };
        if matches!(outcome, Outcome::Stored) {
            // Stored at this primary: the range's write rate counts it
            // (a duplicate was counted when first stored).
            let sizes = part
                .records
                .iter()
                .map(|r| (r.key.as_ref(), (r.key.len() + r.value.len()) as u64));
            self.broker.rates.record(
                self.broker.clock.now_ms(),
                &pending.topic,
                part.range,
                sizes,
            );
        }
        let tally = pending.ranges.entry(part.range).or_default();
        let count = part.records.len();
        tally.records += count;
        match outcome {
            Outcome::Stored => tally.acknowledged += count,
            Outcome::Duplicate => {
                tally.acknowledged += count;
                tally.duplicate = true;
            }
            Outcome::Failed(refusal) => {
                if tally.error.is_none() {
                    tally.error = Some(refusal);
                }
            }
            Outcome::Rolled => unreachable!("a rolled part is sent again"),
        }
        pending.parts_left -= 1;
        if pending.parts_left > 0 {
            return;
        }
        let Some(pending) = self.pending.remove(&part.request) else {
            return;
        };
        self.finish(pending);
    }

    fn finish(&mut self, pending: Pending) {
        let Pending {
            correlation_id,
            slot,
            topic,
            requested,
            ranges,
            ..
        } = pending;
        // Every record was routed to one range, and a reply never reports
        // more records durable than the request held: all of them when no
        // range refused its part, and never part of a range's part.
        let routed: usize = ranges.values().map(|t| t.records).sum();
        if let Err(violation) = check_routed(requested, std::iter::once(routed)) {
            panic!("produce to {topic}: {violation}");
        }
        let refused = ranges.values().any(|t| t.error.is_some());
        let acknowledged = if refused {
            let parts = ranges.values().map(|t| (t.acknowledged, t.records));
            match check_partial(parts) {
                Ok(count) => count,
                Err(violation) => panic!("produce to {topic}: {violation}"),
            }
        } else {
            match check_acknowledged(requested, ranges.values().map(|t| t.acknowledged)) {
                Ok(count) => count,
                Err(violation) => panic!("produce to {topic}: {violation}"),
            }
        };
        let outcomes: Vec<wire::RangeOutcome> = ranges
            .iter()
            .map(|(range, tally)| wire::RangeOutcome {
                range: range.0,
                records_acknowledged: tally.acknowledged as u32,
                duplicate: tally.duplicate,
                error_code: tally.error.as_ref().map_or(0, |e| e.code().code()),
                message: tally.error.as_ref().map(|e| e.body().message),
            })
            .collect();
        let mut first_error = ranges.values().find_map(|t| t.error.as_ref());
        // A primary that found no quorum may have been deposed meanwhile
        // (a failover while it was cut off): if its replica of the metadata
        // already names the new primary, the client is sent there rather
        // than told to retry here (ADR 0126). Only when nothing was
        // acknowledged, so the answer stays a plain redirect.
        let moved = match first_error {
            Some(ServeError::ReplicaQuorum { .. }) if acknowledged == 0 => {
                moved_primary(&self.broker.place, &topic).map(ServeError::Redirect)
            }
            _ => None,
        };
        if moved.is_some() {
            first_error = moved.as_ref();
        }
        let frame = match first_error {
            None => {
                let response = wire::Response::Produce(wire::ProduceResponse {
                    records_acknowledged: acknowledged,
                    ranges: outcomes,
                });
                match Reply::encode(correlation_id, &response) {
                    Ok(reply) => reply,
                    Err(e) => refusal_frame(
                        correlation_id,
                        &ServeError::Internal {
                            what: "encode a response",
                            reason: e.to_string(),
                        },
                    ),
                }
            }
            Some(refusal) => {
                debug!(%topic, code = %refusal.code(), message = %refusal, acknowledged, requested, "produce refused");
                let mut body = refusal.body();
                if acknowledged > 0 {
                    body.message = format!(
                        "{}; {acknowledged} of {requested} records acknowledged (see ranges)",
                        body.message
                    );
                }
                body.ranges = Some(outcomes);
                body_frame(correlation_id, refusal.code(), &body)
            }
        };
        self.answer(correlation_id, slot, frame);
    }

    /// Queues an answer for the writer (growing its response budget first).
    fn answer(&self, _correlation_id: u32, mut slot: Inflight, frame: Reply) {
        let broker = Arc::clone(&self.broker);
        let budget = self.budget.clone();
        let tx = self.ctx.tx.clone();
        let cancel = self.ctx.cancel.clone();
        tokio::spawn(async move {
            if let Some(held) = slot.budget.as_mut() {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = budget.grow_response(&broker.port.budgets, held, super::connection::reply_bytes(&frame)) => {}
                }
            }
            let _ = tx
                .send(Outbound {
                    frame,
                    _slot: Some(slot),
                })
                .await;
        });
    }
}

enum Sent {
    /// Sent, resolved, or handed to other lanes.
    Done,
    /// Parked in its lane: nothing more can go out on that lane now.
    Deferred,
}

/// Waits for the segment's answer to one part.
async fn await_answer(
    broker: &ProduceCtx,
    part: &Part,
    segment: SegmentId,
    answer: oneshot::Receiver<Result<Ack, AppendError>>,
    timeout_ms: u64,
) -> Outcome {
    let count = part.records.len();
    match tokio::time::timeout_at(part.deadline, answer).await {
        Err(_) => Outcome::Failed(ServeError::ProduceTimeout { timeout_ms }),
        // The actor died before it took the batch: nothing was appended.
        Ok(Err(_)) => Outcome::Rolled,
        Ok(Ok(Ok(Ack::Stored(offsets)))) => {
            // The segment acknowledged exactly this part's records.
            if let Err(violation) = check_append(offsets.start, count, &offsets) {
                panic!("produce, segment {}: {violation}", segment.0);
            }
            Outcome::Stored
        }
        Ok(Ok(Ok(Ack::Duplicate { .. }))) => Outcome::Duplicate,
        Ok(Ok(Err(AppendError::Rolled))) => Outcome::Rolled,
        Ok(Ok(Err(AppendError::Busy(reason)))) => {
            Outcome::Failed(ServeError::SegmentBusy { segment, reason })
        }
        Ok(Ok(Err(AppendError::Invalid(reason)))) => {
            Outcome::Failed(ServeError::BatchRefused { segment, reason })
        }
        Ok(Ok(Err(AppendError::Failed(reason)))) => {
            Outcome::Failed(ServeError::StoreFailed { segment, reason })
        }
        Ok(Ok(Err(AppendError::Producer(verdict)))) => {
            Outcome::Failed(producer_refusal(part, verdict))
        }
        Ok(Ok(Err(AppendError::NoQuorum(reason)))) => {
            Outcome::Failed(ServeError::ReplicaQuorum { segment, reason })
        }
        // A write met the full volume: a replicated segment fails over to
        // brokers with room, so the producer retries there, as at
        // admission.
        Ok(Ok(Err(AppendError::StorageFull(_)))) => {
            let replicated = broker.data.replication.led.lock().contains_key(&segment);
            Outcome::Failed(full_refusal(broker, replicated))
        }
    }
}

/// The refusal of a produce while this broker's volume is full: for a
/// replicated topic, a retriable `not_leader` without a hint (a failover
/// moves its segments to brokers with room); else `storage_full`.
fn full_refusal(broker: &ProduceCtx, replicated: bool) -> ServeError {
    if replicated {
        ServeError::Redirect(crate::control::placement::Redirect {
            code: malachi_wire::ErrorCode::NotLeader,
            message: format!(
                "broker {}'s data volume is full; the topic's segments move to brokers with room",
                broker.place.me.0
            ),
            hint: None,
        })
    } else {
        storage_full(broker)
    }
}

/// Whether an active segment of `topic` has copies on other brokers, which
/// a failover moves it to when this broker's volume is full.
fn replicated_here(broker: &ProduceCtx, topic: &str) -> bool {
    let Ok(plane) = broker.place.plane() else {
        return false;
    };
    read_owner(plane.as_ref(), topic, |state| {
        state
            .active_ranges(topic)
            .filter_map(|r| r.last_segment())
            .filter_map(|id| state.segment(id))
            .any(|s| s.replicas.len() > 1)
    })
}

/// The refusal of a produce while the data volume is full (ADR 0111).
pub(crate) fn storage_full(broker: &ProduceCtx) -> ServeError {
    let space = &broker.data.space;
    // Full because a write met `ENOSPC`, or would have crossed the line,
    // while the last poll still saw room: say so, rather than quote a
    // figure above the line as if it were below.
    let min = space.min_free_bytes();
    let state = match space.reckoned_free_bytes() {
        Some(b) if b >= min => format!(
            "refused a write for want of space (about {b} bytes free, and the write would cross store.min_free_bytes of {min}, or the volume refused it)"
        ),
        Some(b) => format!("has {b} bytes free, below store.min_free_bytes ({min} bytes)"),
        None => format!("has no space, below store.min_free_bytes ({min} bytes)"),
    };
    ServeError::StorageFull {
        node: broker.place.me.0,
        state,
        resume_bytes: space.resume_bytes(),
    }
}

/// The refusal a producer verdict becomes.
fn producer_refusal(part: &Part, verdict: Verdict) -> ServeError {
    let Some(tag) = part.producer else {
        return ServeError::Internal {
            what: "check a producer",
            reason: "a plain batch got a producer verdict".into(),
        };
    };
    match verdict {
        Verdict::Fenced { current_epoch } => ServeError::ProducerFenced {
            producer_id: tag.producer_id,
            epoch: tag.epoch,
            current_epoch,
            range: tag.range,
        },
        Verdict::Gap { expected } => ServeError::SequenceGap {
            producer_id: tag.producer_id,
            range: tag.range,
            expected,
            sequence: tag.sequence,
        },
        Verdict::Unknown => ServeError::UnknownProducer {
            producer_id: tag.producer_id,
            range: tag.range,
            sequence: tag.sequence,
        },
        Verdict::Conflict { stored } => ServeError::SequenceConflict {
            producer_id: tag.producer_id,
            range: tag.range,
            sequence: tag.sequence,
            records: tag.records,
            stored,
        },
        Verdict::Moved => ServeError::RangeMoved { range: tag.range },
        Verdict::Append | Verdict::Duplicate { .. } => ServeError::Internal {
            what: "check a producer",
            reason: format!("{verdict:?} is not a refusal"),
        },
    }
}

/// The request's records, checked: every record has a key (ADR 0063), a
/// value within `record_value_bytes_max`, and no reserved header.
fn incoming(
    broker: &ProduceCtx,
    batch: malachi_wire::batch::RecordBatch,
) -> Result<Vec<IncomingRecord>, ServeError> {
    let value_max = broker.record_value_bytes_max;
    let now_ms = broker.clock.now_ms();
    let incoming = batch.records();
    let mut records = Vec::with_capacity(incoming.len());
    for (index, record) in incoming.into_iter().enumerate() {
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
        if let Some(header) = record
            .headers
            .iter()
            .find(|h| h.name.starts_with(RESERVED_HEADER_PREFIX))
        {
            return Err(ServeError::ReservedHeader {
                index,
                name: header.name.clone(),
            });
        }
        records.push(IncomingRecord::from_wire(record, now_ms));
    }
    Ok(records)
}

fn check_topic(state: &MetadataState, topic: &str) -> Result<(), ServeError> {
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
    Ok(())
}

/// The active range of each record's key.
fn route(
    state: &MetadataState,
    topic: &str,
    records: &[IncomingRecord],
) -> Result<Vec<RangeId>, ServeError> {
    check_topic(state, topic)?;
    records
        .iter()
        .map(|record| {
            state
                .route_key(topic, &record.key)
                .map(|range| range.id)
                .ok_or_else(|| ServeError::NoActiveRange {
                    topic: topic.to_owned(),
                })
        })
        .collect()
}

/// Where an idempotent batch goes: its range if active, else the active
/// range that holds its first key (and the old range's producer state).
/// Every record must fall in the range the batch names.
fn route_tagged(
    state: &MetadataState,
    topic: &str,
    records: &[IncomingRecord],
    batch: &wire::ProducerBatch,
) -> Result<RangeId, ServeError> {
    check_topic(state, topic)?;
    let Some(named) = state
        .range(RangeId(batch.range))
        .filter(|r| r.topic == topic)
    else {
        return Err(ServeError::NoSuchRange {
            topic: topic.to_owned(),
            range: batch.range,
        });
    };
    if let Some(index) = records
        .iter()
        .position(|r| !named.band.contains(position(&r.key)))
    {
        return Err(ServeError::OutsideRange {
            index,
            range: batch.range,
        });
    }
    if named.is_active() {
        return Ok(named.id);
    }
    let first = records.first().map(|r| r.key.as_ref()).unwrap_or_default();
    state
        .route_key(topic, first)
        .map(|range| range.id)
        .ok_or_else(|| ServeError::NoActiveRange {
            topic: topic.to_owned(),
        })
}
