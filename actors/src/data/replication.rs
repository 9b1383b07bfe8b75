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
//! the local copy and sends them, one request in flight per segment and
//! follower (so a follower writes them in order), up to
//! `replica_append_bytes_max` bytes each, with every follower's in-flight
//! bytes across segments bounded by `replica_inflight_bytes_max`. Each
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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_cluster::group::TcpTransport;
use malachi_cluster::model::{NodeId, SegmentId};
use malachi_storage::{SegmentStore, StorageError};
use malachi_supervision::{BoundedRef, Permit};
use malachi_wire::replication::{
    REPLICA_APPEND_API_KEY, ReplicaAppendRequest, ReplicaAppendResponse, ReplicaRefusal,
};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::quorum::CommitTracker;
use super::storage::Storage;

/// Replica-appends this broker's ReplicationServer may have queued at once;
/// the cluster port's connection waits for a permit beyond it.
pub(crate) const REPLICA_MAILBOX_MAX: usize = 1024;
/// The first pause after a follower could not be reached or refused.
const RETRY_MS_MIN: u64 = 20;
/// The longest pause between two attempts at one follower.
const RETRY_MS_MAX: u64 = 1_000;
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
    ) -> Result<ReplicaAppendResponse, String>;
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
    ) -> Result<ReplicaAppendResponse, String> {
        let body = request.encode().map_err(|e| e.to_string())?;
        let answer = self
            .transport
            .call_raw(
                node.0,
                REPLICA_APPEND_API_KEY,
                request.segment,
                &body,
                timeout_ms,
            )
            .await
            .map_err(|e| e.to_string())?;
        ReplicaAppendResponse::decode(&answer).map_err(|e| e.to_string())
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
        tracker.observe(0, durable);
        Replicated {
            topic,
            segment,
            epoch,
            replicas,
            committed: watch::channel(tracker.committed()).0,
            tracker: Mutex::new(tracker),
            local_durable: watch::channel(durable).0,
            closed: AtomicBool::new(false),
        }
    }

    pub fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// The local copy is durable to `end`: followers may be sent up to it.
    pub fn local_durable(&self, storage: &Storage, end: u64) {
        self.local_durable.send_if_modified(|d| {
            let grew = end > *d;
            *d = (*d).max(end);
            grew
        });
        self.observe(storage, 0, end);
    }

    /// Copy `copy` is durable to `end`; publishes a new committed end.
    fn observe(&self, storage: &Storage, copy: usize, end: u64) {
        let committed = self.tracker.lock().observe(copy, end);
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
}

impl ReplicationState {
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
        /// short of it, taken up to it and no further.
        repair_to: Option<u64>,
        reply: oneshot::Sender<ReplicaAppendResponse>,
    },
    /// Start shipping a segment this broker leads.
    Lead(Arc<Replicated>),
}
impl ractor::Message for ReplicationMsg {}

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
        }
    }
}

pub(crate) struct ReplicationServer;

pub(crate) struct ReplicationServerState {
    storage: Arc<Storage>,
    shippers: HashMap<SegmentId, Vec<JoinHandle<()>>>,
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
        _myself: ActorRef<ReplicationMsg>,
        msg: ReplicationMsg,
        state: &mut ReplicationServerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplicationMsg::Append {
                permit,
                request,
                repair_to,
                reply,
            } => follower_append(&state.storage, permit, request, repair_to, reply),
            ReplicationMsg::Lead(replicated) => state.lead(replicated),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<ReplicationMsg>,
        state: &mut ReplicationServerState,
    ) -> Result<(), ActorProcessingErr> {
        for (_, shippers) in state.shippers.drain() {
            for shipper in shippers {
                shipper.abort();
            }
        }
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

/// The follower's side of one replica-append: checked and queued in the
/// actor's mailbox order, answered by a task after the fsync.
fn follower_append(
    storage: &Arc<Storage>,
    permit: Permit,
    request: ReplicaAppendRequest,
    repair_to: Option<u64>,
    reply: oneshot::Sender<ReplicaAppendResponse>,
) {
    let store = &storage.store;
    let id = malachi_storage::SegmentId(request.segment);
    if let Err(StorageError::NotOpen { .. }) = store.info(id) {
        // A copy this broker has not opened since it started: opening
        // recovers it (a torn tail truncated, damage refused).
        if let Err(e) = tokio::task::block_in_place(|| store.open(id)) {
            let _ = reply.send(refusal_of(&e, 0));
            return;
        }
    }
    if let Some(seal) = repair_to {
        // A copy sealed here is whole: say so, whatever was sent.
        if let Ok(info) = store.info(id)
            && info.sealed.is_some_and(|s| s.length == seal)
        {
            let answer = if request.first_offset + frame_count(&request.frames) > seal {
                ReplicaAppendResponse::refused(
                    ReplicaRefusal::Fenced,
                    seal,
                    format!("segment {} is sealed at {seal} records", request.segment),
                )
            } else {
                ReplicaAppendResponse::durable(seal)
            };
            let _ = reply.send(answer);
            return;
        }
    } else {
        storage
            .replication
            .followed
            .lock()
            .insert(SegmentId(request.segment));
    }
    let committed = repair_to.unwrap_or(request.committed_end);
    if let Err(e) = store.set_committed(id, committed) {
        let _ = reply.send(refusal_of(&e, 0));
        return;
    }
    let appended = match repair_to {
        None => store.append_frames(id, request.first_offset, &request.frames),
        Some(seal) => store.repair_frames(id, request.first_offset, &request.frames, seal),
    };
    let ticket = match appended {
        Ok(ticket) => ticket,
        Err(e) => {
            let end = store.info(id).map_or(0, |i| i.assigned);
            debug!(segment = request.segment, first = request.first_offset, error = %e, "replica append refused");
            let _ = reply.send(refusal_of(&e, end));
            return;
        }
    };
    let storage = Arc::clone(storage);
    let topic = request.topic;
    tokio::spawn(async move {
        let _permit = permit;
        let answer = match ticket.await {
            Ok(offsets) => ReplicaAppendResponse::durable(offsets.end),
            Err(e) => refusal_of(&e, 0),
        };
        // A repaired copy that reached its seal is sealed there: whole,
        // and fenced for good.
        if let Some(seal) = repair_to
            && answer.refused.is_none()
            && answer.durable_end == seal
        {
            let store = Arc::clone(&storage.store);
            match tokio::task::spawn_blocking(move || store.seal(id, seal)).await {
                Ok(Ok(_)) => {
                    info!(
                        segment = id.0,
                        length = seal,
                        "a copy short of its seal caught up and sealed"
                    );
                    storage.replication.followed.lock().remove(&SegmentId(id.0));
                }
                Ok(Err(e)) => warn!(segment = id.0, error = %e, "cannot seal a caught-up copy"),
                Err(e) => {
                    warn!(segment = id.0, error = %e, "the seal task of a caught-up copy failed")
                }
            }
        }
        // Readers of this copy may see more committed records now.
        storage.notify_topic(&topic);
        let _ = reply.send(answer);
    });
}

/// The typed refusal a store error becomes (one place: ADR 0095).
fn refusal_of(e: &StorageError, end: u64) -> ReplicaAppendResponse {
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
fn frame_count(frames: &[u8]) -> u64 {
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

/// Ships one segment's durable frames to one follower.
struct Shipper {
    storage: Arc<Storage>,
    link: Arc<dyn ReplicaLink>,
    replicated: Arc<Replicated>,
    /// The follower's index in the replica set (1..N).
    copy: usize,
}

impl Shipper {
    async fn run(self) {
        let node = self.replicated.replicas[self.copy];
        let config = &self.storage.config;
        let bytes_max = config.replica_append_bytes_max;
        let window = self
            .storage
            .replication
            .window(node, config.replica_inflight_bytes_max);
        let id = malachi_storage::SegmentId(self.replicated.segment.0);
        let mut local = self.replicated.local_durable.subscribe();
        let mut committed = self.replicated.committed.subscribe();
        // Where the follower ends, as far as the primary knows; the first
        // request (possibly empty) learns it.
        let mut next: u64 = 0;
        let mut probed = false;
        // The committed end the follower was last sent.
        let mut told_committed: Option<u64> = None;
        let mut retry_ms = RETRY_MS_MIN;
        // When the segment actor stopped (its segment sealed), if it did.
        let mut closed_at: Option<Instant> = None;
        // Replication-level group commit held the next append already.
        let mut held = false;
        loop {
            // A sealed (or fenced, about to be sealed) segment's follower
            // still gets every record up to the seal: a copy that lagged
            // when the quorum moved on catches up, so every copy ends whole
            // and byte-identical (ADR 0097). Bounded in time: past it, a
            // copy still short is the healer's.
            let catch_up = if self.replicated.is_closed() {
                let since = *closed_at.get_or_insert_with(Instant::now);
                let Some(target) = self.sealed_length(id) else {
                    return;
                };
                if probed && next >= target {
                    debug!(segment = %self.replicated.segment, follower = node.0, length = target, "follower copy whole up to the seal");
                    return;
                }
                if since.elapsed() > Duration::from_millis(CATCH_UP_AFTER_SEAL_MS_MAX) {
                    warn!(segment = %self.replicated.segment, follower = node.0, follower_end = next, length = target, "a follower copy is still short of its seal; catch-up gives up");
                    return;
                }
                Some(target)
            } else {
                None
            };
            let durable = catch_up.unwrap_or_else(|| *local.borrow_and_update());
            let commit = *committed.borrow_and_update();
            if catch_up.is_none() && probed && next >= durable && told_committed == Some(commit) {
                tokio::select! {
                    changed = local.changed() => if changed.is_err() { return },
                    changed = committed.changed() => if changed.is_err() { return },
                }
                continue;
            }
            // Replication-level group commit (off by default): hold the
            // next run until enough records wait or the linger passes.
            let linger_ms = config.replica_group_commit_ms;
            if linger_ms > 0
                && !held
                && catch_up.is_none()
                && probed
                && next < durable
                && durable - next < config.replica_group_commit_records
            {
                held = true;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(linger_ms);
                while local.borrow_and_update().saturating_sub(next)
                    < config.replica_group_commit_records
                {
                    match tokio::time::timeout_at(deadline, local.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return,
                        Err(_) => break,
                    }
                }
                continue;
            }
            held = false;
            let frames = if probed && next < durable {
                let store = Arc::clone(&self.storage.store);
                let read =
                    tokio::task::spawn_blocking(move || store.read_frames(id, next, bytes_max))
                        .await;
                match read {
                    Ok(Ok(run)) => Bytes::from(run.bytes),
                    Ok(Err(e)) => {
                        warn!(segment = %self.replicated.segment, follower = node.0, error = %e, "cannot read frames to ship");
                        self.pause(&mut retry_ms).await;
                        continue;
                    }
                    Err(_) => return,
                }
            } else {
                Bytes::new()
            };
            let request = ReplicaAppendRequest {
                topic: self.replicated.topic.clone(),
                segment: self.replicated.segment.0,
                epoch: self.replicated.epoch,
                first_offset: next,
                committed_end: commit,
                frames,
            };
            let weight = request
                .frames
                .len()
                .clamp(1, config.replica_inflight_bytes_max);
            let Ok(credit) = Arc::clone(&window)
                .acquire_many_owned(u32::try_from(weight).unwrap_or(u32::MAX))
                .await
            else {
                return;
            };
            let sent_at = Instant::now();
            let answer = self
                .link
                .append(node, &request, config.replica_ack_timeout_ms)
                .await;
            drop(credit);
            match answer {
                Ok(response) => match response.refused {
                    None => {
                        retry_ms = RETRY_MS_MIN;
                        probed = true;
                        told_committed = Some(commit);
                        next = response.durable_end;
                        self.replicated
                            .observe(&self.storage, self.copy, response.durable_end);
                        self.storage.metrics.replica_lag(
                            node,
                            durable.saturating_sub(response.durable_end),
                            sent_at.elapsed(),
                        );
                        report_lag_bytes(&self.storage, node, id, &response);
                    }
                    Some(ReplicaRefusal::NotAtEnd) => {
                        // The follower ends elsewhere (it restarted, or an
                        // earlier request landed after its answer was lost):
                        // resume from its end. A copy ahead of the primary's
                        // durable end cannot happen; it is only waited out.
                        probed = true;
                        next = response.durable_end;
                        if next > durable {
                            warn!(segment = %self.replicated.segment, follower = node.0, follower_end = next, durable, "a follower copy ends past the primary's");
                            self.pause(&mut retry_ms).await;
                        }
                    }
                    Some(refusal) => {
                        debug!(segment = %self.replicated.segment, follower = node.0, ?refusal, message = %response.message, "follower refused a replica append");
                        self.pause(&mut retry_ms).await;
                    }
                },
                Err(reason) => {
                    debug!(segment = %self.replicated.segment, follower = node.0, %reason, "follower unreachable");
                    self.pause(&mut retry_ms).await;
                }
            }
        }
    }

    /// The length a closed segment's copy here is (or is about to be)
    /// sealed at: its seal, or its durable end once fenced. `None` for a
    /// copy neither sealed nor fenced (its actor stopped for another
    /// reason; a restarted actor leads it again).
    fn sealed_length(&self, id: malachi_storage::SegmentId) -> Option<u64> {
        let info = self.storage.store.info(id).ok()?;
        match info.sealed {
            Some(seal) => Some(seal.length),
            None if info.fenced => Some(info.durable),
            None => None,
        }
    }

    async fn pause(&self, retry_ms: &mut u64) {
        tokio::time::sleep(Duration::from_millis(*retry_ms)).await;
        *retry_ms = (*retry_ms * 2).min(RETRY_MS_MAX);
    }
}

/// The follower's lag in bytes behind this copy's durable bytes, when its
/// answer told its own (ADR 0098).
fn report_lag_bytes(
    storage: &Storage,
    node: NodeId,
    id: malachi_storage::SegmentId,
    response: &ReplicaAppendResponse,
) {
    let (Some(follower), Ok(local)) = (response.durable_bytes, storage.store.info(id)) else {
        return;
    };
    storage
        .metrics
        .replica_lag_bytes(node, local.byte_size.saturating_sub(follower));
}
