//! `storage/replication`: the ReplicationServer, both sides of quorum
//! replication of records (ADR 0094, 0095).
//!
//! **Follower side.** A replica-append (api key 100) arrives on the cluster
//! port; the control plane checks that the metadata names this broker as a
//! follower of the segment and hands it to this actor, which opens the copy
//! if needed, raises its committed end, and appends the primary's frames
//! verbatim at exactly the offset given (the store refuses a gap, an
//! overlap, a bad frame, a fenced copy). A task answers with the durable end
//! once the fsync covering the frames returns. Appends are queued in this
//! actor's mailbox, bounded by [`REPLICA_MAILBOX_MAX`] permits.
//!
//! **Primary side.** A replicated segment's actor registers a
//! [`Replicated`] (the segment's commit tracker and watches) and asks this
//! actor to lead it: one shipper task per follower reads durable frames from
//! the local copy and sends them, up to `replica_pipeline_depth_max`
//! requests in flight per segment and follower, up to
//! `replica_append_bytes_max` bytes each, with every follower's in-flight
//! bytes across segments bounded by `replica_inflight_bytes_max`. It takes
//! the answers in the order it sent the requests; a refusal or a lost
//! answer drops the rest and resends from the follower's end. The cluster
//! port serves a connection's requests concurrently, so a follower holds an
//! append that arrives before those it follows (at most
//! [`REPLICA_PIPELINE_DEPTH_LIMIT`] per segment, [`EARLY_BYTES_MAX`] bytes,
//! [`EARLY_WAIT_MS`] each) and writes it once they land (ADR 0099). Each
//! answer's durable end feeds the tracker; the committed end (the Q-th
//! largest durable end, `quorum.rs`) is published to the copy, so readers see
//! only committed records, and to the segment actor, which acknowledges a
//! produce once its records are committed, or answers `no_quorum` after
//! `replica_ack_timeout_ms`. A slow or unreachable follower only stops its
//! own shipper, which retries with backoff; the quorum goes on without it.
//!
//! Every replica-append carries the segment's writer epoch from the
//! metadata; a follower refuses one older than the metadata records
//! (`stale_epoch`, ADR 0097). What is not here yet: fencing copies on the
//! coordinator's order (failover, issue 19).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_cluster::group::TcpTransport;
use malachi_core::model::{NodeId, SegmentId};
use malachi_storage::StorageError;
use malachi_supervision::{BoundedRef, Permit};
use malachi_wire::replication::{
    REPLICA_APPEND_API_KEY, ReplicaAppendRequest, ReplicaAppendResponse, ReplicaRefusal,
};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

mod follower;
mod shipper;

use crate::common::config::REPLICA_PIPELINE_DEPTH_LIMIT;
use crate::data::quorum::CommitTracker;
use crate::data::storage::Storage;
use follower::follower_append;
use shipper::Shipper;

/// Replica-appends this broker's ReplicationServer may have queued at once;
/// the cluster port's connection waits for a permit beyond it.
pub(crate) const REPLICA_MAILBOX_MAX: usize = 1024;
/// The first pause after a follower could not be reached or refused.
const RETRY_MS_MIN: u64 = 20;
/// The longest pause between two attempts at one follower.
const RETRY_MS_MAX: u64 = 1_000;
/// How long a follower holds an append that arrived before those it
/// follows; past it, the append is refused `not_at_end`.
const EARLY_WAIT_MS: u64 = 1_000;
/// Frame bytes a follower holds in early appends, across segments.
const EARLY_BYTES_MAX: usize = 64 << 20;
/// How long a sealed segment's primary keeps shipping to a follower copy
/// still short of the seal (it was down or slow when the segment sealed).
const CATCH_UP_AFTER_SEAL_MS_MAX: u64 = 10 * 60 * 1_000;

/// How a primary reaches its followers' ReplicationServers: the cluster
/// port in production (`TcpReplicaLink`), anything in a test.
#[async_trait::async_trait]
pub(crate) trait ReplicaLink: Send + Sync + std::fmt::Debug {
    async fn append(
        &self,
        node: NodeId,
        request: &ReplicaAppendRequest,
        timeout_ms: u64,
    ) -> Result<ReplicaAppendResponse, LinkError>;
}

/// Why a replica-append got no answer from its follower (the shipper
/// resets and retries; a refusal is an answer, not this).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("cannot encode the replica append: {0}")]
    Encode(malachi_wire::WireError),
    #[error(transparent)]
    Transport(#[from] malachi_cluster::group::TransportError),
    #[error("the follower's answer does not decode: {0}")]
    Decode(malachi_wire::WireError),
    /// A test's follower is gone.
    #[cfg(test)]
    #[error("broker {node} does not answer")]
    Gone { node: NodeId },
}

/// Replica-appends over the cluster port, on connections of their own
/// (a `TcpTransport` separate from raft's, so bulk data never queues
/// behind or ahead of heartbeats).
#[derive(Debug)]
pub(crate) struct TcpReplicaLink {
    pub transport: Arc<TcpTransport>,
}

#[async_trait::async_trait]
impl ReplicaLink for TcpReplicaLink {
    async fn append(
        &self,
        node: NodeId,
        request: &ReplicaAppendRequest,
        timeout_ms: u64,
    ) -> Result<ReplicaAppendResponse, LinkError> {
        let (control, frames) = request.encode_parts().map_err(LinkError::Encode)?;
        let answer = self
            .transport
            .call_raw_parts(
                node.0,
                REPLICA_APPEND_API_KEY,
                request.segment,
                &[&control, &frames],
                timeout_ms,
            )
            .await?;
        ReplicaAppendResponse::decode(&answer).map_err(LinkError::Decode)
    }
}

/// A replicated segment as its primary sees it: shared by the segment
/// actor (which reports its local durable end and waits for commits) and
/// the shippers (which report the followers').
#[derive(Debug)]
pub(crate) struct Replicated {
    pub topic: String,
    pub segment: SegmentId,
    /// The writer epoch every replica-append carries (ADR 0097).
    pub epoch: u64,
    /// The copies, the primary's first.
    pub replicas: Vec<NodeId>,
    tracker: Mutex<CommitTracker>,
    committed: watch::Sender<u64>,
    local_durable: watch::Sender<u64>,
    closed: AtomicBool,
    /// The last runs of durable frames the shippers read
    /// ([`SHIPPED_RUNS_CACHED`], newest last), for the other followers'
    /// shippers: one read of the log per run rather than one per follower.
    /// A follower asking from inside a run is given the run's rest, which
    /// also brings followers that drifted apart back to the same run
    /// boundaries (with an exact-start match, two followers out of step
    /// read the log each, every time). Durable frames never change, so a
    /// cached run is as good as a fresh read.
    runs: Mutex<VecDeque<CachedRun>>,
}

/// Runs of shipped frames a primary keeps for its other followers.
const SHIPPED_RUNS_CACHED: usize = 2;

/// A run of durable frames read from the primary's copy.
#[derive(Debug, Clone)]
struct CachedRun {
    first: u64,
    records: u64,
    frames: Bytes,
}

impl CachedRun {
    /// This run's frames from offset `from` (inside it) on: the frames
    /// before it are skipped by their headers' lengths. `None` if a header
    /// does not read (never for frames read back from the store).
    fn rest_from(&self, from: u64) -> Option<CachedRun> {
        debug_assert!(self.first <= from && from < self.first + self.records);
        let mut at = 0usize;
        for _ in self.first..from {
            let header = self.frames.get(at..)?;
            at = at.checked_add(malachi_storage::frame::peek_len(header).ok()?)?;
        }
        if at >= self.frames.len() {
            return None;
        }
        Some(CachedRun {
            first: from,
            records: self.first + self.records - from,
            frames: self.frames.slice(at..),
        })
    }
}

/// Why a produce was not acknowledged by a quorum in time.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "records up to {end} of segment {segment} are not on a quorum of {quorum} copies after {timeout_ms} ms (committed end {committed})"
)]
pub(crate) struct NoQuorum {
    pub segment: SegmentId,
    pub end: u64,
    pub committed: u64,
    pub quorum: usize,
    pub timeout_ms: u64,
}

impl Replicated {
    /// A segment's primary state; `durable` is the local copy's durable end
    /// at open, `committed` what is known committed.
    pub fn new(
        topic: String,
        segment: SegmentId,
        epoch: u64,
        replicas: Vec<NodeId>,
        durable: u64,
        committed: u64,
    ) -> Replicated {
        let mut tracker = CommitTracker::new(replicas.len(), committed);
        tracker.raise(0, durable);
        Replicated {
            topic,
            segment,
            epoch,
            replicas,
            committed: watch::channel(tracker.committed()).0,
            tracker: Mutex::new(tracker),
            local_durable: watch::channel(durable).0,
            closed: AtomicBool::new(false),
            runs: Mutex::new(VecDeque::with_capacity(SHIPPED_RUNS_CACHED)),
        }
    }

    pub fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Whether a quorum of copies has reported since this primary opened
    /// the segment: before that, its committed end may be below records
    /// acknowledged before a restart.
    pub fn settled(&self) -> bool {
        self.tracker.lock().settled()
    }

    /// The local copy is durable to `end`: followers may be sent up to it.
    /// Concurrent fsync completions report in any order; the local end
    /// only grows.
    pub fn local_durable(&self, storage: &Storage, end: u64) {
        self.local_durable.send_if_modified(|d| {
            let grew = end > *d;
            *d = (*d).max(end);
            grew
        });
        let committed = self.tracker.lock().raise(0, end);
        self.publish(storage, committed);
    }

    /// Copy `copy` is durable to `end`; publishes a new committed end.
    fn observe(&self, storage: &Storage, copy: usize, end: u64) {
        let committed = self.tracker.lock().observe(copy, end);
        self.publish(storage, committed);
    }

    /// Publishes `committed` if it is news: to the copy's readers, then
    /// to the waiters.
    fn publish(&self, storage: &Storage, committed: u64) {
        if committed <= self.committed() {
            return;
        }
        // The copy's readers first, then the waiters: an acknowledgement
        // never runs ahead of what a reader of this copy can see.
        let id = malachi_storage::SegmentId(self.segment.0);
        if let Err(e) = storage.store.set_committed(id, committed) {
            debug!(segment = %self.segment, error = %e, "cannot publish the committed end");
        }
        let raised = self.committed.send_if_modified(|c| {
            let grew = committed > *c;
            *c = (*c).max(committed);
            grew
        });
        if raised {
            storage.notify_topic(&self.topic);
        }
    }

    /// Waits until `end` is committed, at most `timeout_ms`.
    pub async fn wait_committed(&self, end: u64, timeout_ms: u64) -> Result<(), NoQuorum> {
        let mut committed = self.committed.subscribe();
        let waited = tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            committed.wait_for(|c| *c >= end),
        )
        .await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(NoQuorum {
                segment: self.segment,
                end,
                committed: self.committed(),
                quorum: super::quorum::quorum(self.replicas.len()),
                timeout_ms,
            }),
        }
    }

    /// The segment actor stopped: the shippers end.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wake every shipper so it sees the flag.
        self.local_durable.send_modify(|_| {});
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The frames from `from` to the end of a cached run holding it.
    fn cached_run(&self, from: u64) -> Option<CachedRun> {
        let runs = self.runs.lock();
        let run = runs
            .iter()
            .rev()
            .find(|run| run.first <= from && from < run.first + run.records)?;
        run.rest_from(from)
    }

    fn cache_run(&self, run: CachedRun) {
        let mut runs = self.runs.lock();
        if runs.len() == SHIPPED_RUNS_CACHED {
            runs.pop_front();
        }
        runs.push_back(run);
    }
}

/// What the data plane keeps for replication, in [`Storage`].
#[derive(Debug, Default)]
pub(crate) struct ReplicationState {
    /// How primaries reach followers (unset on a lone broker).
    pub link: std::sync::OnceLock<Arc<dyn ReplicaLink>>,
    /// The running ReplicationServer, published at each of its starts.
    pub server: parking_lot::RwLock<Option<BoundedRef<ReplicationMsg>>>,
    /// Every replicated segment this broker leads, registered by its actor,
    /// so a restarted ReplicationServer leads them all again.
    pub led: Mutex<HashMap<SegmentId, Arc<Replicated>>>,
    /// Bytes in flight to each follower, across its segments.
    windows: Mutex<HashMap<NodeId, Arc<Semaphore>>>,
    /// The follower copies this broker has open and not yet sealed: the
    /// control plane seals each once the metadata records its seal.
    pub followed: Mutex<std::collections::BTreeSet<SegmentId>>,
    /// Copies of sealed segments being filled from another copy (a heal or
    /// a rebuild, ADR 0110): when their last repair append came. A describe
    /// shows such a copy `healing` until it is sealed whole.
    pub healing: Mutex<HashMap<u64, std::time::Instant>>,
}

/// How long after its last repair append an unsealed copy of a sealed
/// segment still counts as healing (the healer's rounds come far faster).
pub(crate) const HEALING_QUIET_MS: u64 = 10_000;

/// Copies tracked as healing at most (a heal runs per segment, four at
/// once per broker, so this is never reached in practice).
const HEALING_TRACKED_MAX: usize = 4_096;

impl ReplicationState {
    /// Whether this broker's copy of `segment` took a repair toward its
    /// recorded seal lately (and so is being healed or rebuilt).
    pub fn is_healing(&self, segment: u64, now: std::time::Instant) -> bool {
        let mut healing = self.healing.lock();
        let quiet = std::time::Duration::from_millis(HEALING_QUIET_MS);
        healing.retain(|_, at| now.duration_since(*at) < quiet);
        healing.contains_key(&segment)
    }

    fn window(&self, node: NodeId, bytes_max: usize) -> Arc<Semaphore> {
        Arc::clone(
            self.windows
                .lock()
                .entry(node)
                .or_insert_with(|| Arc::new(Semaphore::new(bytes_max))),
        )
    }

    /// Registers a segment this broker leads and starts its shippers.
    pub fn lead(&self, replicated: Arc<Replicated>) {
        self.led
            .lock()
            .insert(replicated.segment, Arc::clone(&replicated));
        if let Some(server) = self.server.read().clone() {
            // A full mailbox only delays the shippers: the server's restart
            // (or the next lead) picks the registry up.
            let _ = server.try_send(|_permit| ReplicationMsg::Lead(replicated));
        }
    }

    /// Whether this broker leads `segment` and has heard a quorum of its
    /// copies since it opened it: a primary's read at its committed end
    /// means "nothing more" only then.
    pub fn settled(&self, segment: SegmentId) -> bool {
        self.led.lock().get(&segment).is_some_and(|r| r.settled())
    }

    /// The segment's actor stopped: its shippers end.
    pub fn release(&self, segment: SegmentId, replicated: &Arc<Replicated>) {
        replicated.close();
        let mut led = self.led.lock();
        if led
            .get(&segment)
            .is_some_and(|r| Arc::ptr_eq(r, replicated))
        {
            led.remove(&segment);
        }
    }
}

pub(crate) enum ReplicationMsg {
    /// A replica-append for a follower copy this broker holds (the control
    /// plane checked the metadata names this broker).
    Append {
        permit: Permit,
        request: ReplicaAppendRequest,
        /// The seal of a sealed segment: the frames are catch-up of a copy
        /// short of it, taken up to it and no further. Or, for an active
        /// segment, the length a coordinator's failover decided.
        repair_to: Option<u64>,
        /// Whether the copy seals itself once it holds `repair_to` records:
        /// only where the metadata records that seal. A failover's repair
        /// comes before the record, and a copy sealed then at a length a
        /// successor coordinator does not record could never be filled (the
        /// seal model's counterexample, ADR 0107).
        seal_at_end: bool,
        reply: oneshot::Sender<ReplicaAppendResponse>,
    },
    /// Start shipping a segment this broker leads.
    Lead(Arc<Replicated>),
    /// An early append of `segment` at `first` waited its predecessors out
    /// long enough: refused, if it is still held.
    Expire { segment: SegmentId, first: u64 },
}
impl ractor::Message for ReplicationMsg {}

/// A replica-append that arrived before the appends it follows (they are
/// pipelined, and the cluster port serves a connection's requests
/// concurrently): held, with its mailbox permit, until they land.
struct Early {
    permit: Permit,
    request: ReplicaAppendRequest,
    repair_to: Option<u64>,
    seal_at_end: bool,
    reply: oneshot::Sender<ReplicaAppendResponse>,
}

/// What the follower did with one append.
enum Outcome {
    /// Answered already (refused or sealed) or written: nothing held.
    Done,
    /// Written: the copy's appended end is now `end`.
    Appended { end: u64 },
    /// It starts past the copy's end: hold it until the gap fills.
    Early(Early, u64),
}

impl std::fmt::Debug for ReplicationMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicationMsg::Append { request, .. } => write!(
                f,
                "Append(segment {} at {}, {} bytes)",
                request.segment,
                request.first_offset,
                request.frames.len()
            ),
            ReplicationMsg::Lead(r) => write!(f, "Lead(segment {})", r.segment),
            ReplicationMsg::Expire { segment, first } => {
                write!(f, "Expire(segment {segment} at {first})")
            }
        }
    }
}

pub(crate) struct ReplicationServer;

pub(crate) struct ReplicationServerState {
    storage: Arc<Storage>,
    shippers: HashMap<SegmentId, Vec<JoinHandle<()>>>,
    /// Appends that arrived ahead of their predecessors, per segment by
    /// first offset; at most [`REPLICA_PIPELINE_DEPTH_LIMIT`] per segment.
    early: HashMap<SegmentId, std::collections::BTreeMap<u64, Early>>,
    /// Frame bytes held in `early`, at most [`EARLY_BYTES_MAX`].
    early_bytes: usize,
}

/// The shippers end with the state, after a stop, a failure or a kill
/// alike (ractor runs `post_stop` only after a stop): a restart leads the
/// same segments again, and two shippers to one copy would race.
impl Drop for ReplicationServerState {
    fn drop(&mut self) {
        for shipper in self.shippers.values().flatten() {
            shipper.abort();
        }
    }
}

#[ractor::async_trait]
impl Actor for ReplicationServer {
    type Msg = ReplicationMsg;
    type State = ReplicationServerState;
    type Arguments = Arc<Storage>;

    async fn pre_start(
        &self,
        myself: ActorRef<ReplicationMsg>,
        storage: Arc<Storage>,
    ) -> Result<ReplicationServerState, ActorProcessingErr> {
        *storage.replication.server.write() = Some(BoundedRef::new(myself, REPLICA_MAILBOX_MAX));
        let mut state = ReplicationServerState {
            storage,
            shippers: HashMap::new(),
            early: HashMap::new(),
            early_bytes: 0,
        };
        // A restart leads again every segment its predecessor led.
        let led: Vec<Arc<Replicated>> = state
            .storage
            .replication
            .led
            .lock()
            .values()
            .cloned()
            .collect();
        for replicated in led {
            state.lead(replicated);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<ReplicationMsg>,
        msg: ReplicationMsg,
        state: &mut ReplicationServerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplicationMsg::Append {
                permit,
                request,
                repair_to,
                seal_at_end,
                reply,
            } => state.append(
                &myself,
                Early {
                    permit,
                    request,
                    repair_to,
                    seal_at_end,
                    reply,
                },
            ),
            ReplicationMsg::Lead(replicated) => state.lead(replicated),
            ReplicationMsg::Expire { segment, first } => state.expire(segment, first),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<ReplicationMsg>,
        state: &mut ReplicationServerState,
    ) -> Result<(), ActorProcessingErr> {
        let mut server = state.storage.replication.server.write();
        if server
            .as_ref()
            .is_some_and(|s| s.actor().get_id() == myself.get_id())
        {
            *server = None;
        }
        Ok(())
    }
}

impl ReplicationServerState {
    /// Writes one append, or holds it if it arrived early, then writes
    /// every held append of its segment the copy's new end reaches.
    fn append(&mut self, myself: &ActorRef<ReplicationMsg>, append: Early) {
        let segment = SegmentId(append.request.segment);
        let epoch = append.request.epoch;
        let mut end = match follower_append(&self.storage, append) {
            Outcome::Done => return,
            Outcome::Appended { end } => end,
            Outcome::Early(early, end) => {
                self.hold(myself, early, end);
                return;
            }
        };
        // The gap this append filled may release held ones, in order.
        loop {
            let Some(held) = self.early.get_mut(&segment) else {
                return;
            };
            let Some(entry) = held.first_entry() else {
                self.early.remove(&segment);
                return;
            };
            if *entry.key() > end {
                return;
            }
            let early = entry.remove();
            self.early_bytes -= early.request.frames.len();
            if early.request.epoch < epoch {
                // Held across a newer writer's appends: never written.
                let answer = ReplicaAppendResponse::refused(
                    ReplicaRefusal::StaleEpoch,
                    end,
                    format!(
                        "segment {segment} was written at epoch {epoch} while this append of epoch {} waited",
                        early.request.epoch
                    ),
                );
                let _ = early.reply.send(answer);
                continue;
            }
            // One that starts below the end overlaps: the store refuses it
            // (`not_at_end`), which tells the primary where the copy ends.
            match follower_append(&self.storage, early) {
                Outcome::Appended { end: grown } => end = grown,
                Outcome::Done => {}
                Outcome::Early(early, at) => {
                    // Cannot happen (its start is at most the end), but a
                    // held append is never dropped unanswered.
                    self.hold(myself, early, at);
                    return;
                }
            }
        }
    }

    /// Holds an early append for at most [`EARLY_WAIT_MS`], with at most
    /// [`REPLICA_PIPELINE_DEPTH_LIMIT`] held per segment.
    fn hold(&mut self, myself: &ActorRef<ReplicationMsg>, early: Early, end: u64) {
        let segment = SegmentId(early.request.segment);
        let first = early.request.first_offset;
        let bytes = early.request.frames.len();
        let held = self.early.entry(segment).or_default();
        if held.len() >= REPLICA_PIPELINE_DEPTH_LIMIT
            || held.contains_key(&first)
            || self.early_bytes + bytes > EARLY_BYTES_MAX
        {
            let answer = ReplicaAppendResponse::refused(
                ReplicaRefusal::NotAtEnd,
                end,
                format!(
                    "segment {segment} ends at {end} here; an append at {first} is too far ahead to hold"
                ),
            );
            let _ = early.reply.send(answer);
            return;
        }
        held.insert(first, early);
        self.early_bytes += bytes;
        myself.send_after(Duration::from_millis(EARLY_WAIT_MS), move || {
            ReplicationMsg::Expire { segment, first }
        });
    }

    /// An early append whose predecessors never came: `not_at_end`, with
    /// where the copy ends, so its primary resends from there.
    fn expire(&mut self, segment: SegmentId, first: u64) {
        let Some(held) = self.early.get_mut(&segment) else {
            return;
        };
        let Some(early) = held.remove(&first) else {
            return;
        };
        self.early_bytes -= early.request.frames.len();
        if held.is_empty() {
            self.early.remove(&segment);
        }
        let id = malachi_storage::SegmentId(segment.0);
        let end = self.storage.store.info(id).map_or(0, |i| i.assigned);
        debug!(segment = %segment, first, end, "an early replica append expired");
        let answer = ReplicaAppendResponse::refused(
            ReplicaRefusal::NotAtEnd,
            end,
            format!(
                "segment {segment} ends at {end} here; the appends before {first} did not arrive in {EARLY_WAIT_MS} ms"
            ),
        );
        let _ = early.reply.send(answer);
    }

    fn lead(&mut self, replicated: Arc<Replicated>) {
        self.shippers
            .retain(|_, shippers| shippers.iter().any(|s| !s.is_finished()));
        if let Some(old) = self.shippers.remove(&replicated.segment) {
            for shipper in old {
                shipper.abort();
            }
        }
        let Some(link) = self.storage.replication.link.get().cloned() else {
            warn!(segment = %replicated.segment, "a replicated segment on a broker with no cluster port; its records cannot commit");
            return;
        };
        let shippers = (1..replicated.replicas.len())
            .map(|copy| {
                let shipper = Shipper {
                    storage: Arc::clone(&self.storage),
                    link: Arc::clone(&link),
                    replicated: Arc::clone(&replicated),
                    copy,
                };
                tokio::spawn(shipper.run())
            })
            .collect();
        info!(segment = %replicated.segment, replicas = ?replicated.replicas, "leading a replicated segment");
        self.shippers.insert(replicated.segment, shippers);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::atomic::AtomicUsize;

    use malachi_storage::{FileStore, Record, StoreConfig};

    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use crate::common::metrics::BrokerMetrics;

    const SEGMENT: u64 = 9;

    /// Frames of records `first..first + count`, as the store lays them.
    fn frames(first: u64, count: u64) -> Bytes {
        let mut buf = Vec::new();
        for offset in first..first + count {
            malachi_storage::frame::encode(
                &mut buf,
                offset,
                0,
                &Record::new(1, format!("k{offset}"), format!("v{offset}")),
            );
        }
        Bytes::from(buf)
    }

    /// A follower asking from inside a cached run gets its rest, byte for
    /// byte what a read of the log from there gives; outside every cached
    /// run, nothing.
    #[test]
    fn a_follower_asking_from_inside_a_cached_run_gets_its_rest() {
        let replicated = Replicated::new("t".into(), SegmentId(1), 1, vec![NodeId(1)], 0, 0);
        replicated.cache_run(CachedRun {
            first: 10,
            records: 5,
            frames: frames(10, 5),
        });
        for from in 10..15 {
            let rest = replicated.cached_run(from).unwrap();
            assert_eq!((rest.first, rest.records), (from, 15 - from));
            assert_eq!(rest.frames, frames(from, 15 - from));
        }
        assert!(replicated.cached_run(9).is_none());
        assert!(replicated.cached_run(15).is_none());
        // Two runs kept, the oldest dropped first.
        replicated.cache_run(CachedRun {
            first: 15,
            records: 2,
            frames: frames(15, 2),
        });
        assert_eq!(replicated.cached_run(12).unwrap().records, 3);
        replicated.cache_run(CachedRun {
            first: 17,
            records: 1,
            frames: frames(17, 1),
        });
        assert!(replicated.cached_run(12).is_none());
        assert_eq!(replicated.cached_run(16).unwrap().frames, frames(16, 1));
    }

    fn storage(dir: &std::path::Path, config: BrokerConfig) -> Arc<Storage> {
        let store = Arc::new(FileStore::open_dir(dir, StoreConfig::default()).unwrap());
        Arc::new(Storage::new(
            config,
            store,
            Arc::new(SystemClock),
            Arc::new(BrokerMetrics::new()),
        ))
    }

    /// A ReplicationServer on `storage`; its bounded ref.
    async fn server(storage: &Arc<Storage>) -> BoundedRef<ReplicationMsg> {
        let (_actor, _) = Actor::spawn(None, ReplicationServer, Arc::clone(storage))
            .await
            .unwrap();
        storage.replication.server.read().clone().unwrap()
    }

    /// The primary's frames of `records` records, one run per record.
    fn runs(primary: &Storage, records: u64) -> Vec<(u64, Bytes)> {
        let id = malachi_storage::SegmentId(SEGMENT);
        (0..records)
            .map(|at| {
                let run = primary.store.read_frames(id, at, 1).unwrap();
                assert_eq!((run.first, run.records), (at, 1));
                (at, Bytes::from(run.bytes))
            })
            .collect()
    }

    fn primary_with(dir: &std::path::Path, records: u64) -> Arc<Storage> {
        let primary = storage(dir, BrokerConfig::default());
        let id = malachi_storage::SegmentId(SEGMENT);
        primary.store.open(id).unwrap();
        let batch: Vec<Record> = (0..records)
            .map(|i| Record::new(1, format!("k{}", i % 3), format!("v{i}")))
            .collect();
        primary.store.append(id, &batch).unwrap().wait().unwrap();
        primary
    }

    fn request(first: u64, epoch: u64, frames: Bytes) -> ReplicaAppendRequest {
        ReplicaAppendRequest {
            topic: "t".into(),
            segment: SEGMENT,
            epoch,
            first_offset: first,
            committed_end: 0,
            repair: None,
            frames,
        }
    }

    async fn send(
        server: &BoundedRef<ReplicationMsg>,
        request: ReplicaAppendRequest,
    ) -> oneshot::Receiver<ReplicaAppendResponse> {
        let (reply, answer) = oneshot::channel();
        server
            .send(|permit| ReplicationMsg::Append {
                permit,
                request,
                repair_to: None,
                seal_at_end: false,
                reply,
            })
            .await
            .unwrap();
        answer
    }

    fn follower_bytes(follower: &Storage, end: u64) -> Vec<u8> {
        let id = malachi_storage::SegmentId(SEGMENT);
        follower.store.read_frames(id, 0, 1 << 20).map_or_else(
            |_| Vec::new(),
            |run| {
                assert_eq!(run.first + run.records, end);
                run.bytes
            },
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_writes_appends_that_arrive_out_of_order_in_offset_order() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let primary = primary_with(a.path(), 4);
        let follower = storage(b.path(), BrokerConfig::default());
        let server = server(&follower).await;
        let runs = runs(&primary, 4);
        // 2 and 3 arrive before 0 and 1: held, then written once 0 and 1 land.
        let third = send(&server, request(2, 1, runs[2].1.clone())).await;
        let fourth = send(&server, request(3, 1, runs[3].1.clone())).await;
        let first = send(&server, request(0, 1, runs[0].1.clone())).await;
        let second = send(&server, request(1, 1, runs[1].1.clone())).await;
        for (answer, end) in [(first, 1), (second, 2), (third, 3), (fourth, 4)] {
            let answer = answer.await.unwrap();
            assert_eq!(answer.refused, None, "{}", answer.message);
            assert_eq!(answer.durable_end, end);
        }
        let whole: Vec<u8> = runs.iter().flat_map(|(_, b)| b.to_vec()).collect();
        assert_eq!(
            follower_bytes(&follower, 4),
            whole,
            "byte-identical, in order"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_early_append_whose_gap_never_fills_is_refused_not_at_end_with_the_end() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let primary = primary_with(a.path(), 3);
        let follower = storage(b.path(), BrokerConfig::default());
        let server = server(&follower).await;
        let runs = runs(&primary, 3);
        let first = send(&server, request(0, 1, runs[0].1.clone())).await;
        assert_eq!(first.await.unwrap().durable_end, 1);
        let started = Instant::now();
        let early = send(&server, request(2, 1, runs[2].1.clone())).await;
        let answer = early.await.unwrap();
        assert_eq!(answer.refused, Some(ReplicaRefusal::NotAtEnd));
        assert_eq!(answer.durable_end, 1, "it names where the copy ends");
        assert!(started.elapsed() >= Duration::from_millis(EARLY_WAIT_MS));
        assert_eq!(
            follower_bytes(&follower, 1),
            runs[0].1.to_vec(),
            "nothing past the gap"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_early_append_of_an_older_epoch_is_never_written_after_a_newer_one() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let primary = primary_with(a.path(), 2);
        let follower = storage(b.path(), BrokerConfig::default());
        let server = server(&follower).await;
        let runs = runs(&primary, 2);
        let stale = send(&server, request(1, 1, runs[1].1.clone())).await;
        let newer = send(&server, request(0, 2, runs[0].1.clone())).await;
        assert_eq!(newer.await.unwrap().durable_end, 1);
        let answer = stale.await.unwrap();
        assert_eq!(answer.refused, Some(ReplicaRefusal::StaleEpoch));
        assert_eq!(follower_bytes(&follower, 1), runs[0].1.to_vec());
    }

    /// Issue 36 ("Space"): a follower's appends between two polls of the
    /// volume stop at the free-space line, checked against the bytes each
    /// is about to write: the one that would cross it is refused `busy`
    /// (the primary retries it and counts the copy as not answering), and
    /// the copy is never written past the line nor latched failed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_refuses_appends_that_would_cross_the_free_space_line_retriably() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let primary = primary_with(a.path(), 4);
        let runs = runs(&primary, 4);
        let frame = runs[0].1.len() as u64;
        let line = 1 << 20;
        let mut config = BrokerConfig::default();
        config.store.min_free_bytes = line;
        let follower = storage(b.path(), config);
        // The last poll saw room for two and a half frames above the line.
        let mark = follower.space.mark();
        follower
            .space
            .observe_since(line + 2 * frame + frame / 2, mark, 0);
        let server = server(&follower).await;
        for (at, frames) in runs.iter().take(2) {
            let answer = send(&server, request(*at, 1, frames.clone())).await;
            let answer = answer.await.unwrap();
            assert_eq!(answer.refused, None, "{}", answer.message);
            assert_eq!(answer.durable_end, at + 1);
        }
        let third = send(&server, request(2, 1, runs[2].1.clone())).await;
        let answer = third.await.unwrap();
        assert_eq!(
            answer.refused,
            Some(ReplicaRefusal::Busy),
            "{}",
            answer.message
        );
        assert!(ReplicaRefusal::Busy.retriable());
        assert_eq!(answer.durable_end, 2, "it names where the copy ends");
        let id = malachi_storage::SegmentId(SEGMENT);
        let info = follower.store.info(id).unwrap();
        assert!(!info.failed, "the copy is not latched failed");
        assert_eq!(info.assigned, 2, "nothing written past the line");
        assert!(follower.space.is_full(), "the broker is at its line");
    }

    /// Issue 36 ("Space"): a heal's or rebuild's repair toward a recorded
    /// seal, and a failover's repair toward a length not yet recorded,
    /// stop at the free-space line as a follower's append does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heals_and_failover_repairs_stop_at_the_free_space_line() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let primary = primary_with(a.path(), 2);
        let runs = runs(&primary, 2);
        let frame = runs[0].1.len() as u64;
        let line = 1 << 20;
        let mut config = BrokerConfig::default();
        config.store.min_free_bytes = line;
        let follower = storage(b.path(), config);
        let mark = follower.space.mark();
        follower.space.observe_since(line + frame / 2, mark, 0);
        let server = server(&follower).await;
        let repair = |first: u64, frames: Bytes, seal_at_end: bool| {
            let (reply, answer) = oneshot::channel();
            let server = server.clone();
            async move {
                server
                    .send(|permit| ReplicationMsg::Append {
                        permit,
                        request: request(first, 1, frames),
                        repair_to: Some(2),
                        seal_at_end,
                        reply,
                    })
                    .await
                    .unwrap();
                answer.await.unwrap()
            }
        };
        let heal = repair(0, runs[0].1.clone(), true).await;
        assert_eq!(heal.refused, Some(ReplicaRefusal::Busy), "{}", heal.message);
        let id = malachi_storage::SegmentId(SEGMENT);
        assert_eq!(follower.store.info(id).unwrap().assigned, 0);
        assert!(follower.space.is_full());
        // A failover's repair of a fenced copy stops there too.
        follower.store.fence(id).unwrap();
        let failover = repair(0, runs[0].1.clone(), false).await;
        assert_eq!(
            failover.refused,
            Some(ReplicaRefusal::Busy),
            "{}",
            failover.message
        );
        let info = follower.store.info(id).unwrap();
        assert_eq!(info.assigned, 0);
        assert!(!info.failed);
    }

    #[test]
    fn fsync_completions_reported_out_of_order_still_commit_the_last_record() {
        // Regression (found by `bench/scripts/replica-pipeline-depth.sh`
        // at RF=2): the primary's end was set, not raised, so a smaller end
        // reported after a larger one held the committed end below the
        // last acknowledged record, and its produce timed out `no_quorum`.
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path(), BrokerConfig::default());
        storage
            .store
            .open(malachi_storage::SegmentId(SEGMENT))
            .unwrap();
        let replicated = Replicated::new(
            "t".into(),
            SegmentId(SEGMENT),
            1,
            vec![NodeId(1), NodeId(2)],
            0,
            0,
        );
        replicated.local_durable(&storage, 600);
        replicated.local_durable(&storage, 500);
        replicated.observe(&storage, 1, 600);
        assert_eq!(replicated.committed(), 600);
    }

    /// A link to a follower's ReplicationServer that delays each request
    /// by a different amount, so pipelined requests arrive out of order,
    /// and counts how many are in flight at once.
    #[derive(Debug)]
    struct ShuffledLink {
        followers: HashMap<NodeId, BoundedRef<ReplicationMsg>>,
        inflight: AtomicUsize,
        inflight_peak: AtomicUsize,
        requests: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl ReplicaLink for ShuffledLink {
        async fn append(
            &self,
            node: NodeId,
            request: &ReplicaAppendRequest,
            _timeout_ms: u64,
        ) -> Result<ReplicaAppendResponse, LinkError> {
            let follower = self.followers.get(&node).ok_or(LinkError::Gone { node })?;
            let now = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
            self.inflight_peak.fetch_max(now, Ordering::SeqCst);
            let n = self.requests.fetch_add(1, Ordering::SeqCst);
            // 0, 7, 14, 1, 8, ... ms: later requests often overtake.
            tokio::time::sleep(Duration::from_millis((n as u64 * 7) % 20)).await;
            let answer = send(follower, request.clone()).await.await;
            self.inflight.fetch_sub(1, Ordering::SeqCst);
            answer.map_err(|_| LinkError::Gone { node })
        }
    }

    /// A primary with `followers` follower copies behind a shuffling link
    /// ships `RECORDS` records written in small batches; returns the link,
    /// the primary's bytes, and each follower's bytes.
    /// Ships 200 records to `followers` through a link that reorders
    /// answers: the link, the primary's frames, each follower's, and the
    /// primary's metrics as scraped.
    async fn ship_through_shuffled_link(
        followers: u64,
    ) -> (Arc<ShuffledLink>, Vec<u8>, Vec<Vec<u8>>, String) {
        const RECORDS: u64 = 200;
        let a = tempfile::tempdir().unwrap();
        let config = BrokerConfig {
            // One record per request, so the pipeline has many to overlap.
            replica_append_bytes_max: 1,
            replica_pipeline_depth_max: 8,
            ..BrokerConfig::default()
        };
        let primary = storage(a.path(), config);
        let id = malachi_storage::SegmentId(SEGMENT);
        primary.store.open(id).unwrap();
        let mut dirs = Vec::new();
        let mut copies = Vec::new();
        let mut servers = HashMap::new();
        for n in 0..followers {
            let dir = tempfile::tempdir().unwrap();
            let follower = storage(dir.path(), BrokerConfig::default());
            servers.insert(NodeId(n + 2), server(&follower).await);
            copies.push(follower);
            dirs.push(dir);
        }
        let link = Arc::new(ShuffledLink {
            followers: servers,
            inflight: AtomicUsize::new(0),
            inflight_peak: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
        });
        primary
            .replication
            .link
            .set(Arc::clone(&link) as Arc<dyn ReplicaLink>)
            .unwrap();
        server(&primary).await;
        let replicas = (1..=followers + 1).map(NodeId).collect();
        let replicated = Arc::new(Replicated::new(
            "t".into(),
            SegmentId(SEGMENT),
            1,
            replicas,
            0,
            0,
        ));
        primary.replication.lead(Arc::clone(&replicated));
        // Records become durable on the primary in small batches while the
        // shippers run.
        for batch in 0..RECORDS / 10 {
            let records: Vec<Record> = (0..10)
                .map(|i| Record::new(1, format!("k{}", i % 3), format!("v{batch}-{i}")))
                .collect();
            let end = primary
                .store
                .append(id, &records)
                .unwrap()
                .wait()
                .unwrap()
                .end;
            replicated.local_durable(&primary, end);
        }
        replicated.wait_committed(RECORDS, 30_000).await.unwrap();
        // Every follower gets everything, not only the quorum's.
        let deadline = Instant::now() + Duration::from_secs(30);
        for copy in &copies {
            while copy.store.info(id).map_or(0, |i| i.durable) < RECORDS {
                assert!(Instant::now() < deadline, "a follower never caught up");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let whole = primary.store.read_frames(id, 0, 1 << 30).unwrap();
        assert_eq!(whole.records, RECORDS);
        let bytes = copies.iter().map(|c| follower_bytes(c, RECORDS)).collect();
        replicated.close();
        (link, whole.bytes, bytes, primary.metrics.render())
    }

    /// A counter's value in a scrape, 0 when absent.
    fn counter(scrape: &str, series: &str) -> u64 {
        scrape
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_primary_pipelines_appends_and_the_follower_ends_byte_identical_and_committed() {
        let (link, primary, followers, _) = ship_through_shuffled_link(1).await;
        let peak = link.inflight_peak.load(Ordering::SeqCst);
        assert!(peak > 1, "requests were pipelined (peak {peak} in flight)");
        assert!(
            peak <= 8,
            "never more than the depth in flight (peak {peak})"
        );
        assert_eq!(followers, vec![primary]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_followers_sharing_the_primarys_reads_both_end_byte_identical() {
        let (link, primary, followers, scrape) = ship_through_shuffled_link(2).await;
        let peak = link.inflight_peak.load(Ordering::SeqCst);
        assert!(
            peak <= 16,
            "never more than the depth per follower (peak {peak})"
        );
        // Every byte shipped was read from the log once at least; each
        // follower got all of them (more after a resume).
        let from_log = counter(&scrape, "malachi_shipped_bytes_total{from=\"log\"}");
        let from_cache = counter(&scrape, "malachi_shipped_bytes_total{from=\"cache\"}");
        let bytes = primary.len() as u64;
        assert!(from_log >= bytes, "{from_log} read for {bytes}: {scrape}");
        assert!(from_log + from_cache >= 2 * bytes, "{scrape}");
        assert_eq!(followers, vec![primary.clone(), primary]);
    }
}
