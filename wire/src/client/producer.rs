//! The producer: ordered, pipelined, idempotent, retrying (ADR 0092).
//!
//! A producer has a random id and an epoch (the wall clock in milliseconds
//! when it started). It routes each record to the topic's range holding its
//! key (the topic's layout comes from `describe_topic`; positions are the
//! keys' xxh3 hashes, as the broker computes them) and sends one request per
//! range part, tagged with the next sequence number of that (producer,
//! range), to the range's primary as the layout names it (ADR 0142). Requests are written to the connection in the order they were
//! sent, so the broker stores each range's parts in that order; at most
//! `window_requests_max` are in flight.
//!
//! A retriable failure (a lost connection, a timeout, `busy`, `not_leader`,
//! `shutting_down`, a broker restart) sends the same request again, with
//! the same sequence number, until the delivery timeout: a part the broker
//! had already stored is answered as a duplicate and not written twice, and
//! a part sent ahead of a missing one is refused with `sequence_gap` and
//! sent again after it. A part whose range was split or merged (`moved`) is
//! routed again on the new layout, before anything newer is sent. Nothing
//! is reordered within a key, and nothing acknowledged is written twice.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tracing::debug;

use super::suspects::SUSPECT_POLL_MS;
use super::{Client, ClientError, DISCOVERY_INTERVAL_MS, backoff_ms, decode_response};
use crate::api::ApiKey;
use crate::batch::{BatchBuilder, RecordBatch};
use crate::error::ErrorCode;
use crate::messages::*;

/// The acknowledgement of produced records, with the latency of the
/// request that acknowledged them (first send to answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceAck {
    pub records_acknowledged: u32,
    pub latency: Duration,
}

/// A producer's identity: the broker fences a session by the epoch, so a
/// restarted producer that reuses its id must use a larger epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    pub producer_id: u64,
    pub epoch: u64,
}

impl ProducerIdentity {
    /// A fresh id (random) and an epoch from the wall clock.
    pub fn fresh() -> ProducerIdentity {
        ProducerIdentity {
            producer_id: random_u64(),
            epoch: wall_ms(),
        }
    }

    /// A named producer's next session: the id is derived from `name`, the
    /// epoch is the wall clock in milliseconds, so a later session fences
    /// an earlier one (on hosts whose clocks agree to better than the time
    /// between the two starts).
    pub fn named(name: &str) -> ProducerIdentity {
        ProducerIdentity {
            producer_id: xxhash_rust::xxh3::xxh3_64(name.as_bytes()),
            epoch: wall_ms(),
        }
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
        .max(1)
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// The active ranges of a topic, by band, and their primaries.
#[derive(Debug, Clone)]
struct Layout {
    /// (band start, band end exclusive, range id), sorted by start.
    bands: Vec<(u64, u128, u64)>,
    /// (range id, node id of its active segment's primary) for each
    /// active range whose description names one: where its parts go
    /// first (ADR 0142).
    primaries: Vec<(u64, u64)>,
}

impl Layout {
    fn from_description(description: &TopicDescription) -> Result<Layout, String> {
        let parse = |text: &str| -> Result<u128, String> {
            let digits = text.strip_prefix("0x").unwrap_or(text);
            u128::from_str_radix(digits, 16).map_err(|e| format!("band bound {text}: {e}"))
        };
        let mut bands = Vec::new();
        let mut primaries = Vec::new();
        for range in &description.ranges {
            if range.state != "active" {
                continue;
            }
            let start = parse(&range.band_start)?;
            let end = parse(&range.band_end)?;
            let start = u64::try_from(start).map_err(|_| "band start beyond 2^64".to_owned())?;
            bands.push((start, end, range.id));
            if let Some(primary) = primary_of(range) {
                primaries.push((range.id, primary));
            }
        }
        bands.sort_unstable();
        if bands.is_empty() {
            return Err(format!("topic {} has no active range", description.name));
        }
        Ok(Layout { bands, primaries })
    }

    fn route(&self, key: &[u8]) -> Option<u64> {
        let position = xxhash_rust::xxh3::xxh3_64(key);
        let at = self
            .bands
            .partition_point(|(start, _, _)| *start <= position);
        let (start, end, id) = self.bands.get(at.checked_sub(1)?)?;
        (*start <= position && u128::from(position) < *end).then_some(*id)
    }

    fn is_active(&self, range: u64) -> bool {
        self.bands.iter().any(|(_, _, id)| *id == range)
    }
}

/// The node that writes `range`: its active segment's first replica (the
/// description's `primary` when it names no replicas).
fn primary_of(range: &RangeDescription) -> Option<u64> {
    let active = range.segments.iter().rev().find(|s| s.state == "active")?;
    active.replicas.first().copied().or(active.primary)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Unsent { not_before: Instant },
    InFlight,
    Acked,
}

/// One request's worth of records, in send order.
struct Entry {
    id: u64,
    /// The records, as the caller's block (or, once split over ranges, a
    /// block of this range's share): kept until acknowledged, to route again.
    batch: RecordBatch,
    /// The producer's ordinals of the records (0-based, in send order), as
    /// runs of consecutive ordinals: one run unless the batch was split.
    ordinals: Vec<std::ops::Range<u64>>,
    /// Range, sequence and epoch, once routed; then the encoded block.
    assigned: Option<(u64, u64, u64)>,
    encoded: Option<RecordBatch>,
    state: State,
    created: Instant,
    attempts: u32,
    last_error: Option<String>,
    /// What the entry waited for when its last attempt failed (the
    /// topic's metadata, a connection, a quorum, an answer): the part a
    /// delivery timeout names.
    waiting_for: Option<String>,
    /// The epoch of an attempt whose outcome is unknown (no answer in
    /// time, or the connection closed after the send): the range may have
    /// stored it. Such a batch may be sent again only under that epoch,
    /// where the range answers a repeat as a duplicate; under a newer one
    /// it would be stored a second time (chaos finding F2, seed 2718).
    uncertain_epoch: Option<u64>,
}

/// An attempt's entry id, the broker it went to, its outcome and latency.
type Answer = (u64, String, Result<ProduceResponse, ClientError>, Duration);

/// Keeps up to `window_requests_max` produce requests in flight on one
/// topic, in order, retrying each until it is acknowledged or its delivery
/// timeout passes. [`Producer::send`] waits only when the window is full.
pub struct Producer {
    client: Client,
    topic: String,
    identity: ProducerIdentity,
    window_requests_max: usize,
    delivery_timeout: Duration,
    layout: Option<Layout>,
    next_sequence: HashMap<u64, u64>,
    queue: VecDeque<Entry>,
    inflight: FuturesUnordered<BoxFuture<'static, Answer>>,
    next_entry: u64,
    next_ordinal: u64,
    records_acknowledged: u64,
    /// Acknowledged ordinals as start to end-exclusive intervals.
    acknowledged: BTreeMap<u64, u64>,
    failed: Option<String>,
    /// When this producer last asked the cluster for its brokers, to route
    /// a range map whose primaries it did not know.
    members_asked_at: Option<Instant>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.topic)
            .field("identity", &self.identity)
            .field("window_requests_max", &self.window_requests_max)
            .field("inflight", &self.inflight.len())
            .field("records_acknowledged", &self.records_acknowledged)
            .finish()
    }
}

/// Entries a producer holds beyond its window (sent, unacknowledged, or
/// waiting to be sent) before `send` waits: the memory bound.
const QUEUED_PER_WINDOW: usize = 2;

impl Producer {
    pub(crate) fn new(
        client: Client,
        topic: String,
        window_requests_max: usize,
        identity: ProducerIdentity,
    ) -> Producer {
        let delivery_timeout = Duration::from_millis(client.config().request_timeout_ms);
        Producer {
            client,
            topic,
            identity,
            window_requests_max: window_requests_max.max(1),
            delivery_timeout,
            layout: None,
            next_sequence: HashMap::new(),
            queue: VecDeque::new(),
            inflight: FuturesUnordered::new(),
            next_entry: 0,
            next_ordinal: 0,
            records_acknowledged: 0,
            acknowledged: BTreeMap::new(),
            failed: None,
            members_asked_at: None,
        }
    }

    /// This producer's id and epoch.
    pub fn identity(&self) -> ProducerIdentity {
        self.identity
    }

    /// Retry each record until this long after it was sent (default: the
    /// client's `request_timeout_ms`).
    pub fn set_delivery_timeout(&mut self, timeout: Duration) {
        self.delivery_timeout = timeout;
    }

    /// Queue a batch and put what the window allows in flight: it is on its
    /// way to the broker when this returns. If the window is full, first
    /// wait for acknowledgements, which are returned (summed). A
    /// non-retriable error, or a record not acknowledged within the delivery
    /// timeout, fails this and every later call.
    pub async fn send(&mut self, batch: RecordBatch) -> Result<Option<ProduceAck>, ClientError> {
        self.check_failed()?;
        if batch.is_empty() {
            return Ok(None);
        }
        let first = self.next_ordinal;
        self.next_ordinal += u64::from(batch.count());
        let entry = Entry {
            id: self.next_entry,
            ordinals: std::iter::once(first..self.next_ordinal).collect(),
            batch,
            assigned: None,
            encoded: None,
            state: State::Unsent {
                not_before: Instant::now(),
            },
            created: Instant::now(),
            attempts: 0,
            last_error: None,
            waiting_for: None,
            uncertain_epoch: None,
        };
        self.next_entry += 1;
        self.queue.push_back(entry);
        self.pump().await?;
        let mut done: Option<ProduceAck> = None;
        while self.inflight.len() >= self.window_requests_max
            || self.queue.len() > self.window_requests_max * QUEUED_PER_WINDOW
        {
            if let Some(ack) = self.process_one().await? {
                done = Some(merge(done, ack));
            }
            self.pump().await?;
        }
        Ok(done)
    }

    /// Wait for the next acknowledgement, if anything is unacknowledged.
    pub async fn next_ack(&mut self) -> Result<Option<ProduceAck>, ClientError> {
        loop {
            self.check_failed()?;
            self.pump().await?;
            if self.queue.is_empty() {
                return Ok(None);
            }
            if let Some(ack) = self.process_one().await? {
                return Ok(Some(ack));
            }
        }
    }

    /// Wait until everything sent is acknowledged; returns the records
    /// acknowledged in total.
    pub async fn flush(&mut self) -> Result<u64, ClientError> {
        while self.next_ack().await?.is_some() {}
        Ok(self.records_acknowledged)
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Records acknowledged so far.
    pub fn records_acknowledged(&self) -> u64 {
        self.records_acknowledged
    }

    /// Records sent to this producer so far.
    pub fn records_sent(&self) -> u64 {
        self.next_ordinal
    }

    /// The acknowledged records, as intervals of their ordinals (0-based,
    /// in the order they were sent; end exclusive).
    pub fn acknowledged_ordinals(&self) -> Vec<(u64, u64)> {
        self.acknowledged.iter().map(|(s, e)| (*s, *e)).collect()
    }

    fn check_failed(&self) -> Result<(), ClientError> {
        match &self.failed {
            None => Ok(()),
            Some(message) => Err(ClientError::ProduceFailed {
                message: message.clone(),
            }),
        }
    }

    /// After the epoch moved on: a batch not yet acknowledged whose earlier
    /// attempt under an older epoch has an unknown outcome would be sent
    /// again under the new epoch, where the range cannot tell it from a new
    /// batch and would store it twice. The session ends instead, its
    /// unacknowledged records reported as not known to be stored.
    fn refuse_if_uncertain(&mut self, error: &ClientError) -> Result<(), ClientError> {
        let epoch = self.identity.epoch;
        let uncertain = self
            .queue
            .iter()
            .any(|e| e.state != State::Acked && e.uncertain_epoch.is_some_and(|u| u < epoch));
        if !uncertain {
            return Ok(());
        }
        let cause = ClientError::ProduceFailed {
            message: format!(
                "the producer's epoch moved on ({error}) while a batch sent under an older epoch has an unknown outcome; sending it again could store it twice"
            ),
        };
        Err(self.fail(&cause))
    }

    fn fail(&mut self, error: &ClientError) -> ClientError {
        let message = error.to_string();
        self.failed = Some(message.clone());
        self.inflight = FuturesUnordered::new();
        ClientError::ProduceFailed { message }
    }

    /// Routes and sends what waits, in queue order, while the window has
    /// room. An entry of a range that backs off holds back that range's
    /// later entries only: the other ranges' parts go on to their own
    /// primaries, in parallel (ADR 0142). It stops at an entry not yet
    /// routed that backs off (the entries after it are routed after it,
    /// so each range's sequence follows the send order), and at an entry
    /// in flight to a range that is no longer active (its answer decides
    /// whether its records must be routed again, ahead of anything newer).
    async fn pump(&mut self) -> Result<(), ClientError> {
        let now = Instant::now();
        // Ranges whose first unsent entry waits in this pass: at most one
        // per entry looked at.
        let mut held: Vec<u64> = Vec::new();
        let mut i = 0;
        while i < self.queue.len() && self.inflight.len() < self.window_requests_max {
            let range = self.queue[i].assigned.map(|(range, _, _)| range);
            match self.queue[i].state {
                State::Acked => {}
                State::InFlight => {
                    if self.holds_back(i) {
                        break;
                    }
                }
                State::Unsent { not_before } => {
                    if self.queue[i].created + self.delivery_timeout <= now {
                        return Err(self.expired(i));
                    }
                    let due = not_before <= now;
                    match range {
                        // A part of a range the layout no longer has, or of
                        // a range not known active (no layout): nothing
                        // after it goes before it is answered, as it may
                        // be routed again (`moved`) into newer ranges.
                        Some(range) if !self.known_active(range) => {
                            if due && !held.contains(&range) {
                                self.submit(i).await;
                            }
                            if !(due && self.layout.is_none()) {
                                break;
                            }
                        }
                        Some(range) if held.contains(&range) => {}
                        Some(range) if !due => held.push(range),
                        None if !due => break,
                        None => {
                            if !self.assign(i).await? {
                                break;
                            }
                            // Entry `i` is now its first range's part:
                            // looked at again, as routed.
                            continue;
                        }
                        Some(range) => {
                            self.submit(i).await;
                            if self.queue[i].state != State::InFlight {
                                held.push(range);
                            }
                        }
                    }
                }
            }
            i += 1;
        }
        debug_assert!(held.len() <= self.queue.len());
        while matches!(self.queue.front(), Some(e) if e.state == State::Acked) {
            self.queue.pop_front();
        }
        Ok(())
    }

    /// Whether entry `i`, in flight, holds back every later entry until it
    /// is answered, because its answer may send its records again ahead of
    /// them: its range is not known active (split or merged away, or the
    /// layout was dropped after a `moved` and not read again yet: a later
    /// entry routed now would take the new ranges' first sequences before
    /// it), or it carries an epoch the producer has left (refused, it is
    /// sent again under the new epoch, and must keep its place).
    fn holds_back(&self, i: usize) -> bool {
        let Some((range, _, epoch)) = self.queue[i].assigned else {
            return false;
        };
        !self.known_active(range) || epoch < self.identity.epoch
    }

    /// Whether the current layout has `range` active (false without one).
    fn known_active(&self, range: u64) -> bool {
        self.layout.as_ref().is_some_and(|l| l.is_active(range))
    }

    /// Fails the producer: entry `i` was not acknowledged within the
    /// delivery timeout. The error names what it waited for.
    fn expired(&mut self, i: usize) -> ClientError {
        let entry = &self.queue[i];
        let reason = entry
            .last_error
            .clone()
            .unwrap_or_else(|| "the window stayed full".to_owned());
        let part = entry
            .waiting_for
            .clone()
            .unwrap_or_else(|| "room in the window".to_owned());
        let message = format!(
            "records to topic {} were not acknowledged within {}ms ({} produce attempts): waiting for {part}; last error: {reason}",
            self.topic,
            self.delivery_timeout.as_millis(),
            entry.attempts
        );
        self.failed = Some(message.clone());
        ClientError::ProduceFailed { message }
    }

    /// Routes entry `i` on the current layout, splitting it into one entry
    /// per range (in place, in range order), and gives each the next
    /// sequence of its range. False if the layout cannot be read now (the
    /// entry backs off).
    async fn assign(&mut self, i: usize) -> Result<bool, ClientError> {
        if self.layout.is_none() {
            let deadline = self.queue[i].created + self.delivery_timeout;
            let request = DescribeTopicRequest {
                name: self.topic.clone(),
                live: false,
            };
            let described = self
                .client
                .call_until(Some(&self.topic), &request, deadline.into())
                .await
                .map(|response| response.topic);
            match described {
                Ok(description) => match Layout::from_description(&description) {
                    Ok(layout) => {
                        self.layout = Some(layout);
                        self.seed_routes(deadline).await;
                    }
                    Err(reason) => {
                        let error = ClientError::ProduceFailed { message: reason };
                        return Err(self.fail(&error));
                    }
                },
                Err(error) if error.retriable() || is_timeout(&error) => {
                    let part = self.lookup_part(&error);
                    self.back_off(i, &error, part);
                    return Ok(false);
                }
                Err(error @ ClientError::Deadline { .. }) => {
                    // The entry's delivery timeout is (about to be) over:
                    // the pass after it reports it, naming the lookup.
                    let part = self.lookup_part(&error);
                    let entry = &mut self.queue[i];
                    entry.waiting_for = Some(part);
                    entry.last_error = Some(error.to_string());
                    entry.state = State::Unsent {
                        not_before: deadline,
                    };
                    return Ok(false);
                }
                Err(error) => return Err(self.fail(&error)),
            }
        }
        let Some(layout) = &self.layout else {
            return Ok(false);
        };
        let batch = std::mem::take(&mut self.queue[i].batch);
        let ordinals = std::mem::take(&mut self.queue[i].ordinals);
        let records = batch.records();
        let routes: Option<Vec<u64>> = records.iter().map(|r| layout.route(&r.key)).collect();
        let Some(routes) = routes else {
            let error = ClientError::ProduceFailed {
                message: format!("the layout of topic {} has no range for a key", self.topic),
            };
            return Err(self.fail(&error));
        };
        let Some(template) = self.queue.remove(i) else {
            return Ok(false);
        };
        // The common case: every record in one range. The caller's block is
        // sent as it is, neither copied nor checksummed again.
        let single = routes
            .first()
            .copied()
            .filter(|first| routes.iter().all(|r| r == first));
        let shares: Vec<(u64, RecordBatch, Vec<std::ops::Range<u64>>)> = match single {
            Some(range) => vec![(range, batch, ordinals)],
            None => {
                let mut groups: BTreeMap<u64, (BatchBuilder, Vec<std::ops::Range<u64>>)> =
                    BTreeMap::new();
                let each = ordinals.iter().flat_map(|run| run.clone());
                for ((record, range), ordinal) in records.iter().zip(&routes).zip(each) {
                    let (builder, runs) = groups
                        .entry(*range)
                        .or_insert_with(|| (BatchBuilder::new(usize::MAX), Vec::new()));
                    builder
                        .push(record)
                        .map_err(|e| ClientError::ProduceFailed {
                            message: format!("cannot encode a batch: {e}"),
                        })?;
                    match runs.last_mut() {
                        Some(run) if run.end == ordinal => run.end += 1,
                        _ => runs.push(ordinal..ordinal + 1),
                    }
                }
                groups
                    .into_iter()
                    .map(|(range, (builder, runs))| (range, builder.finish(), runs))
                    .collect()
            }
        };
        for (at, (range, batch, ordinals)) in (i..).zip(shares) {
            let sequence = self.next_sequence.entry(range).or_insert(0);
            let assigned = (range, *sequence, self.identity.epoch);
            *sequence += 1;
            let entry = Entry {
                id: self.next_entry,
                encoded: Some(batch.clone()),
                batch,
                ordinals,
                assigned: Some(assigned),
                state: template.state,
                created: template.created,
                attempts: template.attempts,
                last_error: template.last_error.clone(),
                waiting_for: template.waiting_for.clone(),
                uncertain_epoch: template.uncertain_epoch,
            };
            self.next_entry += 1;
            self.queue.insert(at, entry);
        }
        Ok(true)
    }

    /// Routes each active range of the layout just loaded to its primary
    /// (ADR 0142) and forgets the routes of ranges no longer active. A
    /// primary whose address the client does not know makes it ask the
    /// cluster for its brokers first (at most every
    /// `DISCOVERY_INTERVAL_MS`, within `DISCOVERY_TIMEOUT_MS`); one still
    /// unknown keeps today's route.
    async fn seed_routes(&mut self, deadline: Instant) {
        let Some(layout) = &self.layout else {
            return;
        };
        let active: Vec<u64> = layout.bands.iter().map(|(_, _, id)| *id).collect();
        let primaries = layout.primaries.clone();
        self.client
            .forget_ranges(&self.topic, |range| active.contains(&range));
        let unknown = self.client.seed_ranges(&self.topic, &primaries);
        let now = Instant::now();
        let asked_lately = self.members_asked_at.is_some_and(|at| {
            now.saturating_duration_since(at) < Duration::from_millis(DISCOVERY_INTERVAL_MS)
        });
        if unknown.is_empty() || asked_lately || !self.client.config().discover_on_connect {
            return;
        }
        self.members_asked_at = Some(now);
        self.client.ask_members(None, deadline.into()).await;
        let unknown = self.client.seed_ranges(&self.topic, &primaries);
        debug!(topic = %self.topic, ?unknown, "ranges whose primary's address is not known");
    }

    /// Writes entry `i`'s request to the connection (in order) and puts its
    /// answer in flight; a connection that cannot be had makes it back off.
    async fn submit(&mut self, i: usize) {
        let entry = &self.queue[i];
        let (Some((range, sequence, epoch)), Some(records)) = (entry.assigned, &entry.encoded)
        else {
            return;
        };
        let request = ProduceRequest {
            topic: self.topic.clone(),
            producer: Some(ProducerBatch {
                producer_id: self.identity.producer_id,
                epoch,
                range,
                sequence,
            }),
            records: records.clone(),
        };
        let payload = match request.encode() {
            Ok(payload) => payload,
            Err(error) => {
                let error = ClientError::from(error);
                self.back_off(i, &error, "the request's encoding".to_owned());
                return;
            }
        };
        let addr = self.client.addr_for_range(&self.topic, range);
        let deadline = (entry.created + self.delivery_timeout).into();
        let submitted = match self.client.connection_until(&addr, deadline).await {
            Ok(connection) => connection.submit(ApiKey::Produce, payload).await,
            Err(error) => Err(error),
        };
        let submitted = match submitted {
            Ok(submitted) => submitted,
            Err(error) => {
                self.reroute_connection(range, &addr, &error).await;
                let part = error.part(&addr);
                self.back_off(i, &error, part);
                return;
            }
        };
        let entry = &self.queue[i];
        let id = entry.id;
        // The answer is awaited no longer than the entry may still wait.
        let left =
            (entry.created + self.delivery_timeout).saturating_duration_since(Instant::now());
        let timeout_ms = self
            .client
            .config()
            .request_timeout_ms
            .min(u64::try_from(left.as_millis()).unwrap_or(u64::MAX))
            .max(1);
        let started = Instant::now();
        self.queue[i].state = State::InFlight;
        self.queue[i].attempts += 1;
        self.inflight.push(Box::pin(async move {
            let addr = submitted.addr().to_owned();
            let result = match submitted.response(timeout_ms).await {
                Ok(frame) => {
                    decode_response::<ProduceRequest>(frame.error_code, frame.payload, &addr)
                }
                Err(error) => Err(error),
            };
            (id, addr, result, started.elapsed())
        }));
    }

    /// After a hint, the next attempt goes to the hinted broker. After a
    /// refusal that names nobody (`no_quorum`: an isolated primary), a
    /// connection failure or an answer that did not come in time (a
    /// primary cut off from this client), to the next broker the client
    /// knows, which says where the topic's writes go now (ADR 0126).
    ///
    /// It borrows only the client (`Sync`), not the producer, across its
    /// await: the producer's futures keep it `Send` but not `Sync`.
    async fn reroute_connection(&mut self, range: u64, addr: &str, error: &ClientError) {
        reroute(
            &self.client,
            (&self.topic, range),
            self.delivery_timeout,
            addr,
            error,
        )
        .await;
    }

    /// What a failed metadata lookup of the topic waited for.
    fn lookup_part(&self, error: &ClientError) -> String {
        let addr = self.client.addr_for(Some(&self.topic));
        format!(
            "the metadata lookup of topic {} (describe_topic: {})",
            self.topic,
            error.part(&addr)
        )
    }

    fn back_off(&mut self, i: usize, error: &ClientError, part: String) {
        let config = self.client.config().clone();
        let entry = &mut self.queue[i];
        let wait = if error
            .leader_hint()
            .is_some_and(|h| self.client.suspected(h))
        {
            SUSPECT_POLL_MS
        } else {
            backoff_ms(&config, entry.attempts.max(1), error.retry_after_ms())
        };
        entry.state = State::Unsent {
            not_before: Instant::now() + Duration::from_millis(wait),
        };
        entry.last_error = Some(error.to_string());
        entry.waiting_for = Some(part);
    }

    /// Takes one answer and acts on it; returns the acknowledgement it brought.
    async fn process_one(&mut self) -> Result<Option<ProduceAck>, ClientError> {
        if self.inflight.is_empty() {
            // Nothing in flight: wait for the first entry's backoff.
            let wait = self
                .queue
                .iter()
                .find_map(|e| match e.state {
                    State::Unsent { not_before } => Some(not_before),
                    _ => None,
                })
                .unwrap_or_else(Instant::now);
            tokio::time::sleep_until(wait.into()).await;
            return Ok(None);
        }
        let Some((id, from, result, latency)) = self.inflight.next().await else {
            return Ok(None);
        };
        let Some(i) = self.queue.iter().position(|e| e.id == id) else {
            return Ok(None);
        };
        if result.as_ref().map_or_else(ClientError::answered, |_| true) {
            self.client.acquit(&from);
        }
        match result {
            Ok(_response) => {
                let entry = &mut self.queue[i];
                entry.state = State::Acked;
                let count: u64 = entry.ordinals.iter().map(|run| run.end - run.start).sum();
                for run in &entry.ordinals {
                    insert_interval(&mut self.acknowledged, run.clone());
                }
                self.records_acknowledged += count;
                Ok(Some(ProduceAck {
                    records_acknowledged: count as u32,
                    latency,
                }))
            }
            Err(error) => {
                self.on_error(i, &from, error).await?;
                Ok(None)
            }
        }
    }

    /// Acts on the failure of entry `i`'s attempt at broker `addr`.
    async fn on_error(
        &mut self,
        i: usize,
        addr: &str,
        error: ClientError,
    ) -> Result<(), ClientError> {
        debug!(topic = %self.topic, %error, "produce attempt failed");
        if outcome_unknown(&error)
            && let Some((_, _, epoch)) = self.queue[i].assigned
        {
            self.queue[i].uncertain_epoch.get_or_insert(epoch);
        }
        match error.code() {
            // Sent ahead of a part the range has not stored: again, after it.
            Some(ErrorCode::SequenceGap) => {
                let part = error.part(addr);
                self.back_off(i, &error, part);
                Ok(())
            }
            // The range was split or merged and this part was not stored:
            // route it again on the new layout.
            Some(ErrorCode::Moved) if error.leader_hint().is_none() => {
                // The layout is read again unless it already no longer has
                // the range (another part's `moved` reloaded it).
                let range = self.queue[i].assigned.map(|(range, _, _)| range);
                if let (Some(layout), Some(range)) = (&self.layout, range)
                    && layout.is_active(range)
                {
                    self.client.note_redirect();
                    self.layout = None;
                }
                let entry = &mut self.queue[i];
                entry.assigned = None;
                entry.encoded = None;
                entry.state = State::Unsent {
                    not_before: Instant::now(),
                };
                entry.last_error = Some(error.to_string());
                Ok(())
            }
            // The range forgot this producer (its state expired): a new
            // epoch, with every range's sequence from 0 again.
            Some(ErrorCode::UnknownProducer) => {
                // A refusal of an attempt under an epoch already left
                // behind: the new epoch's sends carry these records.
                if self.queue[i]
                    .assigned
                    .is_some_and(|(_, _, epoch)| epoch < self.identity.epoch)
                {
                    unassign(&mut self.queue[i]);
                    return self.refuse_if_uncertain(&error);
                }
                self.identity.epoch = (self.identity.epoch + 1).max(wall_ms());
                self.next_sequence.clear();
                for entry in self.queue.iter_mut() {
                    if entry.state != State::Acked && entry.state != State::InFlight {
                        unassign(entry);
                    }
                }
                unassign(&mut self.queue[i]);
                self.queue[i].last_error = Some(error.to_string());
                self.refuse_if_uncertain(&error)
            }
            // Fenced by a session of our own (after a new epoch above) is a
            // part still tagged with the old epoch: send it again, unless
            // an earlier attempt of it may have been stored.
            Some(ErrorCode::ProducerFenced)
                if self.queue[i]
                    .assigned
                    .is_some_and(|(_, _, epoch)| epoch < self.identity.epoch) =>
            {
                unassign(&mut self.queue[i]);
                self.refuse_if_uncertain(&error)
            }
            _ if error.retriable() || is_timeout(&error) => {
                // An entry refused before its range was assigned has none:
                // it is routed as the topic's range 0 would be.
                let range = self.queue[i].assigned.map_or(0, |(range, _, _)| range);
                self.reroute_connection(range, addr, &error).await;
                let part = error.part(addr);
                self.back_off(i, &error, part);
                Ok(())
            }
            _ => Err(self.fail(&error)),
        }
    }
}

/// [`Producer::reroute_connection`] over the client alone. Routes are per
/// range: a topic's ranges may be written by different brokers, and a hint
/// about one range says nothing of the others.
async fn reroute(
    client: &Client,
    (topic, range): (&str, u64),
    delivery_timeout: Duration,
    addr: &str,
    error: &ClientError,
) {
    // Several attempts in flight fail together: the first one's reroute
    // stands, the others' answers are about a broker the range no longer
    // goes to.
    if is_timeout(error) {
        client.suspect(addr);
    }
    if client.addr_for_range(topic, range) != addr {
        return;
    }
    if let Some(hint) = error.leader_hint() {
        if client.suspected(hint) {
            // Asked again here after the backoff, not at the silent broker
            // it names (ADR 0128).
            debug!(%topic, at = %addr, %hint, "the hint names a suspected broker");
            return;
        }
        client.note_redirect();
        client.learn(hint);
        client.remember_range(topic, range, hint);
    } else if error.look_elsewhere() || is_timeout(error) {
        let deadline = Instant::now() + delivery_timeout;
        let next = client.elsewhere(addr, deadline.into()).await;
        debug!(%topic, range, from = %addr, to = %next, %error, "asking another broker");
        client.remember_range(topic, range, &next);
    }
}

/// Whether an attempt that failed this way may still have been stored.
fn outcome_unknown(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Timeout { .. } | ClientError::ConnectionClosed { .. }
    )
}

fn unassign(entry: &mut Entry) {
    entry.assigned = None;
    entry.encoded = None;
    entry.state = State::Unsent {
        not_before: Instant::now(),
    };
}

/// A client-side timeout: the broker may or may not have stored the part,
/// which the sequence number makes safe to send again.
fn is_timeout(error: &ClientError) -> bool {
    matches!(error, ClientError::Timeout { .. })
}

fn merge(done: Option<ProduceAck>, ack: ProduceAck) -> ProduceAck {
    match done {
        None => ack,
        Some(done) => ProduceAck {
            records_acknowledged: done.records_acknowledged + ack.records_acknowledged,
            latency: done.latency.max(ack.latency),
        },
    }
}

/// Adds the ordinals `run` to `set` (start to end-exclusive intervals,
/// disjoint and not touching), merging with its neighbours.
fn insert_interval(set: &mut BTreeMap<u64, u64>, run: std::ops::Range<u64>) {
    if run.is_empty() {
        return;
    }
    let (mut start, mut end) = (run.start, run.end);
    // Every interval that overlaps or touches [start, end) merges into it.
    let touching: Vec<(u64, u64)> = set
        .range(..=end)
        .rev()
        .take_while(|&(_, &e)| e >= start)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, e) in touching {
        set.remove(&s);
        start = start.min(s);
        end = end.max(e);
    }
    set.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_merge() {
        let mut set = BTreeMap::new();
        for at in [3, 1, 2, 0, 7, 5, 6, 2] {
            insert_interval(&mut set, at..at + 1);
        }
        assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![(0, 4), (5, 8)]);
    }

    #[test]
    fn runs_merge_with_every_interval_they_overlap_or_touch() {
        let mut set = BTreeMap::new();
        for run in [10..12, 0..2, 4..6, 20..30] {
            insert_interval(&mut set, run);
        }
        insert_interval(&mut set, 2..10);
        insert_interval(&mut set, 25..27);
        insert_interval(&mut set, 14..14);
        assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![(0, 12), (20, 30)]);
    }

    #[test]
    fn the_layout_routes_like_the_broker() {
        let description = TopicDescription {
            name: "t".into(),
            ranges: vec![
                RangeDescription {
                    id: 2,
                    band_start: "0x0000000000000000".into(),
                    band_end: "0x8000000000000000".into(),
                    state: "active".into(),
                    ..RangeDescription::default()
                },
                RangeDescription {
                    id: 3,
                    band_start: "0x8000000000000000".into(),
                    band_end: "0x10000000000000000".into(),
                    state: "active".into(),
                    ..RangeDescription::default()
                },
                RangeDescription {
                    id: 1,
                    band_start: "0x0000000000000000".into(),
                    band_end: "0x10000000000000000".into(),
                    state: "sealed".into(),
                    ..RangeDescription::default()
                },
            ],
            ..TopicDescription::default()
        };
        let layout = Layout::from_description(&description).unwrap();
        for key in ["a", "b", "k0", "k1", "zz"] {
            let position = xxhash_rust::xxh3::xxh3_64(key.as_bytes());
            let expected = if position < 1 << 63 { 2 } else { 3 };
            assert_eq!(layout.route(key.as_bytes()), Some(expected), "{key}");
        }
        assert!(!layout.is_active(1));
    }

    #[test]
    fn the_layout_names_each_active_ranges_primary_from_its_active_segment() {
        let segment = |id: u64, replicas: Vec<u64>, state: &str| SegmentDescription {
            id,
            replicas,
            state: state.into(),
            ..SegmentDescription::default()
        };
        let range = |id: u64, start: &str, end: &str, state: &str, segments| RangeDescription {
            id,
            band_start: start.into(),
            band_end: end.into(),
            state: state.into(),
            segments,
            ..RangeDescription::default()
        };
        let description = TopicDescription {
            name: "t".into(),
            ranges: vec![
                range(
                    1,
                    "0x0",
                    "0x10000000000000000",
                    "sealed",
                    vec![segment(1, vec![1, 2], "sealed")],
                ),
                range(
                    2,
                    "0x0000000000000000",
                    "0x8000000000000000",
                    "active",
                    vec![
                        segment(2, vec![1, 2], "sealed"),
                        segment(4, vec![3, 1], "active"),
                    ],
                ),
                range(
                    3,
                    "0x8000000000000000",
                    "0x10000000000000000",
                    "active",
                    vec![],
                ),
            ],
            ..TopicDescription::default()
        };
        let layout = Layout::from_description(&description).unwrap();
        // Range 3 names no segment: it keeps today's route.
        assert_eq!(layout.primaries, [(2, 3)]);
    }
}
