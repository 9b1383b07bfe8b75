//! `segment/<topic>/<range>/<segment>`: the one writer of an open segment copy.
//!
//! Every append to a range goes through its active segment's actor, in
//! mailbox order, so offsets are assigned in the order requests arrive. The
//! actor never waits for an fsync in its handler: it hands the store's
//! ticket to a task that replies once the group commit covering the batch is
//! durable, and that task keeps the message's [`Permit`], so the actor's
//! bound covers appends awaiting their fsync too. After each durable append,
//! and on a timer, the actor checks the [`malachi_storage::SealPolicy`]; to
//! roll it fences its copy, waits for what was appended to be durable, and
//! asks the control plane, through the [`Roller`] it was started with, to
//! seal the segment at that durable length and open the next one. Appends refused by the fence are answered `Rolled` and the
//! connection retries them on the new active segment.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use malachi_core::model::{NodeId, RangeId, SealRecord, SegmentId};
use malachi_storage::StorageError;

use malachi_supervision::{BoundedRef, Permit};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

use super::ancestors::{self, Ancestor, Ancestry, Fetched, HolderReads};
use super::invariants::{Violation, check_append, check_durable};
use super::lineage::{self, Lineage, LocalScans};
use super::producers::{ProducerTable, ProducerTag, Verdict};
use super::replication::{NoQuorum, Replicated};
use super::storage::{SegmentHandle, Storage};
use crate::common::convert::IncomingRecord;

/// How a segment actor asks the control plane to seal its segment at a
/// durable length and open the range's next segment. It is handed to the
/// actor at start, so the data plane never names the coordinator: the
/// control plane implements it (`control::coordinator::CoordinatorRoller`),
/// and a test can give a segment actor any other.
#[async_trait::async_trait]
pub(crate) trait Roller: Send + Sync + std::fmt::Debug {
    /// Seals `segment` of `topic` at `seal` and returns the range's next
    /// segment once the metadata commits it. A refusal says whether asking
    /// again can succeed ([`RollError`]).
    async fn roll(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<SegmentId, RollError>;

    /// `segment`'s roll was refused for good: its copy here is the control
    /// plane's to settle, sealed at the metadata's seal and its writer
    /// stopped (or, the segment gone from the metadata, its writer
    /// stopped). The writer never seals it itself: only the metadata knows
    /// the seal. Called again on each refusal; repeats are no-ops.
    fn settle(&self, topic: &str, range: RangeId, segment: SegmentId);
}

/// Why a segment did not roll.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RollError {
    /// Asking again may succeed: a timeout, no quorum yet, a coordinator
    /// not running, this broker's metadata replica behind the leader's.
    /// The next attempt comes on the next tick.
    #[error("{0}")]
    Transient(String),
    /// The metadata will not roll this segment however often it is asked:
    /// it was sealed without this writer (a failover, a split or merge),
    /// its topic was sealed, or it or its topic is gone. The copy is
    /// handed to [`Roller::settle`], and asked about again only after a
    /// backoff (`ROLL_BACKOFF_FIRST_MS`, doubling to `ROLL_BACKOFF_MAX_MS`).
    #[error("{0}")]
    Permanent(String),
}

/// Why an append was not made durable.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AppendError {
    /// The segment is rolling or rolled: retry on the range's new active segment.
    #[error("segment is rolling")]
    Rolled,
    /// Too many bytes wait for a group commit on this segment.
    #[error("segment is busy: {0}")]
    Busy(String),
    /// The batch itself is unacceptable to the store.
    #[error("{0}")]
    Invalid(String),
    #[error("storage failure: {0}")]
    Failed(String),
    /// The idempotent batch was refused by the range's producer state.
    #[error("refused by the producer state: {0:?}")]
    Producer(Verdict),
    /// Durable here, but not on a quorum of copies within
    /// `replica_ack_timeout_ms` (retriable: an idempotent retry is answered
    /// once a quorum holds the records).
    #[error("{0}")]
    NoQuorum(String),
    /// The data volume ran out of space (ADR 0111).
    #[error("storage full: {0}")]
    StorageFull(String),
}

/// How an append was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ack {
    /// Written and durable at these offsets.
    Stored(Range<u64>),
    /// An idempotent retry of a batch the range already stored (and made
    /// durable): nothing was written.
    Duplicate { records: u32 },
}

pub(crate) type AppendReply = oneshot::Sender<Result<Ack, AppendError>>;

pub(crate) enum SegmentMsg {
    Append {
        permit: Permit,
        records: Arc<Vec<IncomingRecord>>,
        bytes: u64,
        /// An idempotent batch's tag (its last record carries it as a header).
        producer: Option<ProducerTag>,
        reply: AppendReply,
    },
    /// Check the seal policy (after a durable append, a refused append).
    CheckRoll,
    /// The timer's `CheckRoll`: also the only one to retry a roll that
    /// failed for a transient reason.
    Tick,
    /// The roll task ended without rolling; another attempt comes after a
    /// delay that depends on the refusal.
    RollFailed(RollError),
    /// A freeze whose split or merge failed is lifted: the fenced copy
    /// rolls on its own, at once.
    Thaw,
    /// A group commit failed: rebuild the producer table from the log
    /// before handing it on.
    ProducersStale,
    /// The producer table, complete with the ancestors read from their
    /// holders (ADR 0124): idempotent batches are taken from now on.
    ProducersReady(ProducerTable),
    /// Fence the copy and answer its durable seal, for a split or merge
    /// that seals this segment itself (no roll follows).
    Freeze {
        reply: oneshot::Sender<Result<SealRecord, AppendError>>,
    },
    /// Test-only: fail this actor so its supervisor restarts it.
    #[cfg(feature = "testing")]
    Poison,
}
impl ractor::Message for SegmentMsg {}

impl std::fmt::Debug for SegmentMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SegmentMsg::Append { records, .. } => write!(f, "Append({} records)", records.len()),
            SegmentMsg::CheckRoll => f.write_str("CheckRoll"),
            SegmentMsg::Tick => f.write_str("Tick"),
            SegmentMsg::RollFailed(e) => write!(f, "RollFailed({e:?})"),
            SegmentMsg::Thaw => f.write_str("Thaw"),
            SegmentMsg::ProducersStale => f.write_str("ProducersStale"),
            SegmentMsg::ProducersReady(_) => f.write_str("ProducersReady"),
            SegmentMsg::Freeze { .. } => f.write_str("Freeze"),
            #[cfg(feature = "testing")]
            SegmentMsg::Poison => f.write_str("Poison"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SegmentArgs {
    pub storage: Arc<Storage>,
    pub roller: Arc<dyn Roller>,
    pub topic: String,
    pub range: RangeId,
    pub segment: SegmentId,
    pub start_offset: u64,
    pub created_at_ms: u64,
    /// The segments this one succeeds (the previous segment of the range
    /// after a roll, the parents' last segments for the first segment of a
    /// split child or a merge) and their own ancestors, from the metadata.
    /// Their producer state is where this segment's starts (ADR 0119).
    pub ancestry: Ancestry,
    /// The segment's copies, this broker's (the primary's) first. With more
    /// than one, appends are acknowledged once a quorum has fsynced them.
    pub replicas: Vec<NodeId>,
    /// The segment's writer epoch (ADR 0097), sent with every replica-append.
    pub epoch: u64,
    /// How an ancestor this broker holds no whole copy of is read from a
    /// holder, for its producer state (ADR 0124).
    pub holders: Arc<dyn HolderReads>,
}

pub(crate) struct SegmentActor;

pub(crate) struct SegmentState {
    args: SegmentArgs,
    /// A roll task or a freeze is under way.
    rolling: bool,
    /// The copy is frozen for a split or merge (and `rolling`): only a
    /// thaw of that freeze lifts it.
    frozen: bool,
    /// The last roll failed and the copy stays fenced: the next attempt
    /// waits for `Retry`'s due time, and appends are answered `Rolled`
    /// meanwhile.
    retry: Option<Retry>,
    /// The offset the store must give this segment's next append: the end
    /// of the previous one (appends go through this actor only, in mailbox
    /// order), from the copy's `assigned` at open.
    next_offset: u64,
    /// When this incarnation first saw a durable record; an empty segment
    /// never rolls by age, so its age counts from its first record.
    first_record_at_ms: Option<u64>,
    /// The range's idempotent producers (ADR 0092).
    producers: ProducerTable,
    /// A group commit failed: the table may name batches that are not in
    /// the log, so it is rebuilt from the log before it is handed on.
    producers_stale: bool,
    /// Ancestors' producer state is still being read from their holders:
    /// the table lacks it, so idempotent batches are refused (`busy`,
    /// retriable) and the table is not handed on as a sidecar.
    producers_pending: bool,
    /// The quorum state of a replicated segment (`None` with one copy).
    replicated: Option<Arc<Replicated>>,
}

impl SegmentState {
    fn store_id(&self) -> malachi_storage::SegmentId {
        malachi_storage::SegmentId(self.args.segment.0)
    }

    /// Notes a batch enqueued up to `end`, by `producer` if idempotent.
    fn enqueued(&mut self, end: u64, producer: Option<&ProducerTag>) {
        self.next_offset = end;
        if let Some(tag) = producer {
            let now_ms = self.args.storage.clock.now_ms();
            self.producers.record(tag, now_ms);
        }
        if self.first_record_at_ms.is_none() {
            self.first_record_at_ms = Some(self.args.storage.clock.now_ms());
        }
    }
}

/// The least age of an unreplicated segment that rolls off a
/// decommissioned broker.
const LEAVING_ROLL_AGE_MS: u64 = 10_000;

/// After a roll refused for good, the wait before asking again: it doubles
/// with each refusal, up to `ROLL_BACKOFF_MAX_MS`. The control plane
/// settles such a copy meanwhile and stops its writer; the attempts only
/// cover a settle that could not happen yet (this broker's metadata
/// replica behind, a full volume).
const ROLL_BACKOFF_FIRST_MS: u64 = 1_000;
const ROLL_BACKOFF_MAX_MS: u64 = 60_000;

/// A failed roll's next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Retry {
    /// After a refusal for good, no attempt before this (the storage
    /// clock's monotonic time); a transient failure waits for the next
    /// tick instead (`due`).
    at_ms: u64,
    /// Failures in a row of the same kind.
    failures: u32,
    /// Whether they were refusals for good.
    permanent: bool,
}

impl Retry {
    /// The attempt after `error`, given the one before (`None`: the first
    /// failure). A refusal for good backs off; a transient failure is
    /// tried again on the next tick, as before, but no longer at once on
    /// each append the fence refuses (the chaos run's hot loop, F7).
    fn after(previous: Option<Retry>, error: &RollError, now_ms: u64) -> Retry {
        let permanent = matches!(error, RollError::Permanent(_));
        let failures = match previous {
            Some(p) if p.permanent == permanent => p.failures.saturating_add(1),
            _ => 1,
        };
        let delay_ms = if permanent {
            ROLL_BACKOFF_FIRST_MS
                .saturating_mul(1u64 << (failures - 1).min(16))
                .min(ROLL_BACKOFF_MAX_MS)
        } else {
            0
        };
        Retry {
            at_ms: now_ms.saturating_add(delay_ms),
            failures,
            permanent,
        }
    }

    /// Whether the next attempt may start now: on a tick after a transient
    /// failure, once `at_ms` has passed after a refusal for good.
    fn due(&self, now_ms: u64, tick: bool) -> bool {
        if self.permanent {
            now_ms >= self.at_ms
        } else {
            tick
        }
    }
}

/// How often an idle segment checks whether it has aged out.
fn tick_interval(age_ms: u64) -> Duration {
    Duration::from_millis((age_ms / 4).clamp(5, 1_000))
}

#[ractor::async_trait]
impl Actor for SegmentActor {
    type Msg = SegmentMsg;
    type State = SegmentState;
    type Arguments = SegmentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SegmentMsg>,
        args: SegmentArgs,
    ) -> Result<SegmentState, ActorProcessingErr> {
        let id = malachi_storage::SegmentId(args.segment.0);
        #[cfg(feature = "testing")]
        {
            let mut starts = args.storage.writer_starts.lock();
            if starts.len() < super::storage::WRITER_STARTS_TRACKED_MAX {
                starts.push(args.segment.0);
            }
        }
        // Opening recovers the copy after a crash: a torn tail is truncated,
        // and every acknowledged record was fsynced, so it is still there.
        // A damaged copy opens in quarantine, latched failed (ADR 0108): it
        // rolls away below, and the broker serves on.
        let mut recovery = tokio::task::block_in_place(|| {
            super::damage::open_copy(
                args.storage.store.as_ref(),
                Some(&args.storage.metrics),
                args.segment,
                None,
                super::damage::CopyOf {
                    topic: Some(&args.topic),
                    range: Some(args.range),
                    replicated: args.replicas.len() > 1,
                },
            )
        })?;
        if recovery.truncated_bytes > 0 {
            warn!(segment = %id, truncated_bytes = recovery.truncated_bytes, "truncated a torn tail");
        }
        let (producers, torn, wanted) = tokio::task::block_in_place(|| {
            build_producers(&args, &Fetched::new(), LocalScans::AfterHolders)
        });
        let producers_pending = !wanted.is_empty();
        if producers_pending {
            tokio::spawn(fetch_producers(args.clone(), wanted, myself.clone()));
        }
        // A quarantined copy is never cut: it rolls away as it is.
        if let Some(start) = torn.filter(|_| recovery.info.lost.is_none()) {
            tokio::task::block_in_place(|| cut_torn_batch(&args, id, start));
            recovery.info = args.storage.store.info(id)?;
        }
        let handle = SegmentHandle {
            actor: BoundedRef::new(myself, args.storage.config.segment_inflight_max),
        };
        let open = {
            let mut segments = args.storage.segments.lock();
            segments.insert(args.segment, handle);
            segments.len()
        };
        args.storage.metrics.open_segments.set(open as f64);
        debug!(
            topic = %args.topic,
            range = args.range.0,
            segment = args.segment.0,
            start_offset = args.start_offset,
            length = recovery.info.length,
            "segment open"
        );
        let first_record_at_ms = (recovery.info.durable > 0).then_some(args.created_at_ms);
        let replicated = (args.replicas.len() > 1).then(|| {
            let info = &recovery.info;
            let committed = info.committed.unwrap_or(0);
            // Readers of this copy now see only what a quorum holds.
            if let Err(e) = args.storage.store.set_committed(id, committed) {
                warn!(segment = %id, error = %e, "cannot mark the copy replicated");
            }
            let replicated = Arc::new(Replicated::new(
                args.topic.clone(),
                args.segment,
                args.epoch,
                args.replicas.clone(),
                info.durable,
                committed,
            ));
            args.storage.replication.lead(Arc::clone(&replicated));
            replicated
        });
        Ok(SegmentState {
            args,
            rolling: false,
            frozen: false,
            retry: None,
            next_offset: recovery.info.assigned,
            first_record_at_ms,
            producers,
            producers_stale: false,
            producers_pending,
            replicated,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<SegmentMsg>,
        state: &mut SegmentState,
    ) -> Result<(), ActorProcessingErr> {
        // The timer ends with the actor (ractor stops sending to a dead actor).
        myself.send_interval(
            tick_interval(state.args.storage.config.segment_age_ms),
            || SegmentMsg::Tick,
        );
        // A copy fenced or failed before a crash must roll before it can take appends.
        myself.send_message(SegmentMsg::CheckRoll)?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SegmentMsg>,
        msg: SegmentMsg,
        state: &mut SegmentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SegmentMsg::Append {
                permit,
                records,
                bytes,
                producer,
                reply,
            } => self.append(
                myself,
                state,
                Appending {
                    permit,
                    records,
                    bytes,
                    producer,
                    reply,
                },
            ),
            SegmentMsg::CheckRoll => self.check_roll(myself, state, false)?,
            SegmentMsg::Tick => self.check_roll(myself, state, true)?,
            SegmentMsg::RollFailed(error) => self.roll_failed(state, error),
            SegmentMsg::Thaw => {
                // Only a freeze's own thaw: a freeze refused because a
                // roll was under way must not free that roll's flag.
                if state.frozen {
                    state.frozen = false;
                    state.rolling = false;
                    state.retry = None;
                }
            }
            SegmentMsg::ProducersStale => state.producers_stale = true,
            SegmentMsg::ProducersReady(table) => {
                if state.producers_pending {
                    state.producers = table;
                    state.producers_pending = false;
                }
            }
            SegmentMsg::Freeze { reply } => {
                if state.rolling {
                    let _ = reply.send(Err(AppendError::Busy(
                        "the segment is rolling; retry".into(),
                    )));
                    return Ok(());
                }
                // From here on this actor only refuses appends; the
                // coordinator stops it once the split or merge commits.
                state.rolling = true;
                state.frozen = true;
                let store = Arc::clone(&state.args.storage.store);
                let id = state.store_id();
                if let Err(e) = store.fence(id) {
                    warn!(segment = %id, error = %e, "cannot fence segment");
                }
                let handoff = Handoff::of(state);
                let replicated = state.replicated.clone();
                let storage = Arc::clone(&state.args.storage);
                let timeout_ms = state.args.storage.config.replica_ack_timeout_ms;
                tokio::spawn(async move {
                    // A failed sync latches the copy as failed and leaves
                    // `length` at what was durable before: the seal below
                    // is still the durable length, so it only needs a log.
                    if let Ok(ticket) = store.sync(id)
                        && let Err(e) = ticket.await
                    {
                        warn!(segment = %id, error = %e, "sync before freezing failed");
                    }
                    if let Err(e) =
                        quorum_holds_all(&storage, id, replicated.as_deref(), timeout_ms).await
                    {
                        let _ = reply.send(Err(AppendError::NoQuorum(e.to_string())));
                        return;
                    }
                    handoff.write().await;
                    let answer = store
                        .info(id)
                        .map(|info| SealRecord {
                            length: info.length,
                            bytes: info.byte_size,
                        })
                        .map_err(|e| AppendError::Failed(e.to_string()));
                    let _ = reply.send(answer);
                });
            }
            #[cfg(feature = "testing")]
            SegmentMsg::Poison => return Err("segment actor poisoned by a test".into()),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SegmentMsg>,
        state: &mut SegmentState,
    ) -> Result<(), ActorProcessingErr> {
        let open = {
            let mut segments = state.args.storage.segments.lock();
            if segments
                .get(&state.args.segment)
                .is_some_and(|h| h.actor.actor().get_id() == myself.get_id())
            {
                segments.remove(&state.args.segment);
            }
            segments.len()
        };
        state.args.storage.metrics.open_segments.set(open as f64);
        if let Some(replicated) = &state.replicated {
            state
                .args
                .storage
                .replication
                .release(state.args.segment, replicated);
        }
        Ok(())
    }
}

/// The fields of one `SegmentMsg::Append`.
struct Appending {
    permit: Permit,
    records: Arc<Vec<IncomingRecord>>,
    bytes: u64,
    producer: Option<ProducerTag>,
    reply: AppendReply,
}

impl SegmentActor {
    fn append(&self, myself: ActorRef<SegmentMsg>, state: &mut SegmentState, append: Appending) {
        let Appending {
            permit,
            records,
            bytes,
            producer,
            reply,
        } = append;
        // A copy rolling, or fenced and waiting to try its roll again,
        // takes no appends: they go to the range's next active segment.
        if state.rolling || state.retry.is_some() {
            let _ = reply.send(Err(AppendError::Rolled));
            return;
        }
        if producer.is_some() && state.producers_pending {
            // The table lacks an ancestor's producers: a batch judged now
            // could be a retry stored there, or refused as unknown.
            let _ = reply.send(Err(AppendError::Busy(
                "the range's producer state is being read from its predecessors' holders; retry"
                    .into(),
            )));
            return;
        }
        let (permit, reply) =
            match judge_producer(state, producer.as_ref(), records.len(), permit, reply) {
                Some(go) => go,
                None => return,
            };
        let started = Instant::now();
        let ticket = match state
            .args
            .storage
            .store
            .append(state.store_id(), &records.as_slice())
        {
            Ok(ticket) => ticket,
            Err(e) => {
                let _ = reply.send(Err(append_refused(&myself, state, e)));
                return;
            }
        };
        // Offsets are assigned at enqueue: exactly this batch's records,
        // right after the previous append's. A gap would lose records from
        // a reader's view, an overlap would put two at one offset.
        let enqueued = ticket.offsets();
        if let Err(violation) = check_append(state.next_offset, records.len(), &enqueued) {
            broken(state.store_id(), violation, reply);
        }
        state.enqueued(enqueued.end, producer.as_ref());
        let done = Enqueued {
            storage: Arc::clone(&state.args.storage),
            topic: state.args.topic.clone(),
            count: records.len() as u64,
            bytes,
            store_id: state.store_id(),
            replicated: state.replicated.clone(),
            enqueued,
            started,
            permit,
            reply,
            myself,
        };
        tokio::spawn(done.complete(ticket));
    }

    fn check_roll(
        &self,
        myself: ActorRef<SegmentMsg>,
        state: &mut SegmentState,
        tick: bool,
    ) -> Result<(), ActorProcessingErr> {
        if state.rolling {
            return Ok(());
        }
        let clock = &state.args.storage.clock;
        if state
            .retry
            .is_some_and(|retry| !retry.due(clock.monotonic_ms(), tick))
        {
            return Ok(());
        }
        let store = &state.args.storage.store;
        let info = store.info(state.store_id())?;
        let now_ms = clock.now_ms();
        let age_from = state
            .first_record_at_ms
            .unwrap_or(now_ms)
            .max(state.args.created_at_ms);
        let reason = state
            .args
            .storage
            .config
            .seal_policy()
            .decide(&info, age_from, now_ms);
        // On a decommissioned broker an unreplicated segment rolls away
        // (its successor goes to a broker that stays; a replicated one
        // fails over instead), once it is `LEAVING_ROLL_AGE_MS` old, so a
        // successor placed back here (no other broker) rolls again only
        // that often.
        let leaving = state.args.replicas.len() <= 1
            && state
                .args
                .storage
                .leaving
                .load(std::sync::atomic::Ordering::Relaxed)
            && now_ms.saturating_sub(state.args.created_at_ms) >= LEAVING_ROLL_AGE_MS;
        let must = info.fenced || info.sealed.is_some() || reason.is_some() || leaving;
        if !must {
            return Ok(());
        }
        if leaving {
            info!(segment = %state.store_id(), "this broker is decommissioned: its unreplicated segment rolls onto a broker that stays");
        }
        debug!(segment = %state.store_id(), ?reason, bytes = info.byte_size, "rolling segment");
        state.rolling = true;
        if let Err(e) = store.fence(state.store_id()) {
            // A failed copy may refuse the fence marker; it takes no appends anyway.
            warn!(segment = %state.store_id(), error = %e, "cannot fence segment");
        }
        let storage = Arc::clone(&state.args.storage);
        let roller = Arc::clone(&state.args.roller);
        let topic = state.args.topic.clone();
        let segment = state.args.segment;
        let store_id = state.store_id();
        let handoff = Handoff::of(state);
        let replicated = state.replicated.clone();
        tokio::spawn(async move {
            if let Err(error) = roll(
                &storage,
                roller.as_ref(),
                &topic,
                segment,
                store_id,
                handoff,
                replicated.as_deref(),
            )
            .await
            {
                let _ = myself.send_message(SegmentMsg::RollFailed(error));
            }
        });
        Ok(())
    }

    /// A roll failed: the copy stays fenced until the next attempt, which
    /// `Retry::after` times. A refusal for good hands the copy to the
    /// control plane to settle, and is logged at warn once, then at debug.
    fn roll_failed(&self, state: &mut SegmentState, error: RollError) {
        state.rolling = false;
        let now_ms = state.args.storage.clock.monotonic_ms();
        let retry = Retry::after(state.retry, &error, now_ms);
        state.retry = Some(retry);
        let segment = state.store_id();
        let retry_in_ms = retry.at_ms - now_ms;
        match &error {
            RollError::Permanent(reason) => {
                if retry.failures == 1 {
                    warn!(%segment, %reason, retry_in_ms, "roll refused for good; the copy is left to the control plane to settle at the metadata's seal");
                } else {
                    debug!(%segment, %reason, failures = retry.failures, retry_in_ms, "roll refused again");
                }
                state
                    .args
                    .roller
                    .settle(&state.args.topic, state.args.range, state.args.segment);
            }
            RollError::Transient(reason) => {
                if retry.failures == 1 {
                    warn!(%segment, %reason, "roll failed");
                } else {
                    debug!(%segment, %reason, failures = retry.failures, "roll failed again");
                }
            }
        }
    }
}

/// A broken invariant of the acknowledgement path (`invariants.rs`): the
/// append is answered as failed, so its client is neither told the records
/// are durable nor led to retry them as if nothing was appended, and then
/// the assertion fails (the supervisor restarts the actor that saw it).
fn broken(segment: malachi_storage::SegmentId, violation: Violation, reply: AppendReply) -> ! {
    error!(%segment, %violation, "acknowledgement invariant violated");
    let _ = reply.send(Err(AppendError::Failed(format!(
        "invariant violated: {violation}"
    ))));
    panic!("segment {segment}: acknowledgement invariant violated: {violation}");
}

/// Checks an idempotent producer's batch against what this range accepted
/// so far (durable or still in its group commit), in mailbox order.
/// Returns the permit and reply back when the batch is to be appended; a
/// duplicate is answered once everything appended so far is durable, a
/// refusal at once.
fn judge_producer(
    state: &SegmentState,
    producer: Option<&ProducerTag>,
    records: usize,
    permit: Permit,
    reply: AppendReply,
) -> Option<(Permit, AppendReply)> {
    let Some(tag) = producer else {
        return Some((permit, reply));
    };
    match state.producers.check(tag, records as u32) {
        Verdict::Append => Some((permit, reply)),
        Verdict::Duplicate { records } => {
            // The original may still wait for its fsync: answer once
            // everything appended so far is durable.
            let store = Arc::clone(&state.args.storage.store);
            let id = state.store_id();
            let replicated = state.replicated.clone();
            let timeout_ms = state.args.storage.config.replica_ack_timeout_ms;
            let end = state.next_offset;
            tokio::spawn(async move {
                let _permit = permit;
                let durable = match store.sync(id) {
                    Ok(ticket) => ticket.await.is_ok(),
                    Err(_) => false,
                };
                let answer = match (durable, replicated) {
                    (false, _) => Err(AppendError::Rolled),
                    (true, None) => Ok(Ack::Duplicate { records }),
                    // The original is acknowledged once committed: so is
                    // its retry.
                    (true, Some(replicated)) => {
                        match replicated.wait_committed(end, timeout_ms).await {
                            Ok(()) => Ok(Ack::Duplicate { records }),
                            Err(e) => Err(AppendError::NoQuorum(e.to_string())),
                        }
                    }
                };
                let _ = reply.send(answer);
            });
            None
        }
        refused => {
            let _ = reply.send(Err(AppendError::Producer(refused)));
            None
        }
    }
}

/// What a producer is told when the store refused to enqueue its batch.
fn append_refused(
    myself: &ActorRef<SegmentMsg>,
    state: &SegmentState,
    e: StorageError,
) -> AppendError {
    match e {
        StorageError::Fenced { .. } | StorageError::Sealed { .. } | StorageError::Failed { .. } => {
            // Whatever fenced it, this segment is done: roll it (a send
            // fails only if this actor is stopping).
            let _ = myself.send_message(SegmentMsg::CheckRoll);
            if e.is_no_space() {
                state
                    .args
                    .storage
                    .space
                    .note_no_space(state.args.storage.clock.now_ms());
                AppendError::StorageFull(e.to_string())
            } else {
                AppendError::Rolled
            }
        }
        StorageError::Busy { .. } => AppendError::Busy(e.to_string()),
        StorageError::RecordTooLarge { .. } | StorageError::BatchTooLarge { .. } => {
            AppendError::Invalid(e.to_string())
        }
        other => AppendError::Failed(other.to_string()),
    }
}

/// A batch enqueued in the store, and what answering it needs once the
/// actor has moved on to the next append.
struct Enqueued {
    storage: Arc<Storage>,
    topic: String,
    count: u64,
    bytes: u64,
    store_id: malachi_storage::SegmentId,
    replicated: Option<Arc<Replicated>>,
    /// The offsets the store gave it at enqueue.
    enqueued: Range<u64>,
    started: Instant,
    /// Lives until the fsync (and, replicated, until a quorum holds the
    /// records): the actor's bound covers it.
    permit: Permit,
    reply: AppendReply,
    myself: ActorRef<SegmentMsg>,
}

impl Enqueued {
    /// Waits for the batch's group commit (and, replicated, its quorum)
    /// and answers the producer.
    async fn complete(self, ticket: malachi_storage::AppendTicket) {
        let Enqueued {
            storage: shared,
            topic,
            count,
            bytes,
            store_id,
            replicated,
            enqueued,
            started,
            permit,
            reply,
            myself,
        } = self;
        let _permit = permit;
        let result = ticket.await;
        if let (Ok(offsets), Some(replicated)) = (&result, &replicated) {
            replicated.local_durable(&shared, offsets.end);
            let timeout_ms = shared.config.replica_ack_timeout_ms;
            match replicated.wait_committed(offsets.end, timeout_ms).await {
                Ok(()) => shared.metrics.replica_quorum_acks.increment(1),
                Err(e) => {
                    shared.metrics.replica_no_quorum.increment(1);
                    let _ = reply.send(Err(AppendError::NoQuorum(e.to_string())));
                    let _ = myself.send_message(SegmentMsg::CheckRoll);
                    return;
                }
            }
        }
        shared
            .metrics
            .append_latency_seconds
            .record(started.elapsed().as_secs_f64());
        let answer = match result {
            Ok(offsets) => match check_stored(&shared, store_id, &enqueued, offsets) {
                Ok(offsets) => {
                    shared.metrics.records_produced.increment(count);
                    shared.metrics.bytes_produced.increment(bytes);
                    shared
                        .bytes_stored
                        .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
                    shared.notify_topic(&topic);
                    Ok(Ack::Stored(offsets))
                }
                Err(violation) => broken(store_id, violation, reply),
            },
            Err(e) if e.is_no_space() => {
                // A full volume: the copy is latched failed and rolls once,
                // but no more records come until space is freed (ADR 0111),
                // so no roll follows another.
                if shared.space.note_no_space(shared.clock.now_ms()) {
                    error!(error = %e, "the data volume is full; records are refused until space is freed");
                }
                let _ = myself.send_message(SegmentMsg::ProducersStale);
                Err(AppendError::StorageFull(e.to_string()))
            }
            Err(e) => {
                warn!(error = %e, "group commit failed; the segment will roll");
                let _ = myself.send_message(SegmentMsg::ProducersStale);
                Err(AppendError::Rolled)
            }
        };
        // A producer that gave up dropped its receiver; a stopped actor has
        // no roll to check.
        let _ = reply.send(answer);
        let _ = myself.send_message(SegmentMsg::CheckRoll);
    }
}

/// The acknowledged offsets of a durable batch must be the ones given at
/// enqueue, durable, and within any seal of the copy.
fn check_stored(
    shared: &Storage,
    store_id: malachi_storage::SegmentId,
    enqueued: &Range<u64>,
    offsets: Range<u64>,
) -> Result<Range<u64>, Violation> {
    if offsets != *enqueued {
        return Err(Violation::NotContiguous {
            offsets,
            expected_start: enqueued.start,
        });
    }
    if cfg!(debug_assertions)
        && let Ok(info) = shared.store.info(store_id)
    {
        check_durable(&offsets, &info)?;
    }
    Ok(offsets)
}

/// Seals `segment` at its durable length through the control plane.
async fn roll(
    storage: &Storage,
    roller: &dyn Roller,
    topic: &str,
    segment: SegmentId,
    store_id: malachi_storage::SegmentId,
    handoff: Handoff,
    replicated: Option<&Replicated>,
) -> Result<(), RollError> {
    // Everything appended before the fence becomes durable (or fails) first.
    // A failed sync leaves `length` at what was durable: the seal is still
    // right, so the failure is only logged.
    if let Ok(ticket) = storage.store.sync(store_id)
        && let Err(e) = ticket.await
    {
        warn!(segment = %store_id, error = %e, "sync before rolling failed");
    }
    let timeout_ms = storage.config.replica_ack_timeout_ms;
    if let Err(reason) = quorum_holds_all(storage, store_id, replicated, timeout_ms).await {
        return Err(RollError::Transient(format!("cannot roll yet: {reason}")));
    }
    // The successor starts from this table: it is on disk before the roll
    // can commit.
    handoff.write().await;
    let info = storage
        .store
        .info(store_id)
        .map_err(|e| RollError::Transient(format!("cannot read segment info to roll: {e}")))?;
    // A quarantined copy is sealed past the records it lost (ADR 0108):
    // their offsets stay theirs, and a read of them is `data_loss`.
    let seal = SealRecord {
        length: super::damage::seal_length(info.length, info.lost),
        bytes: info.byte_size,
    };
    if let Some(lost) = info.lost {
        warn!(segment = %store_id, lost_from = lost.from, lost_to = lost.to, seal = seal.length, "rolling away from a copy that lost records");
    }
    match roller.roll(topic, segment, seal).await {
        Ok(_next) if info.lost.is_some() => {
            // The copy lacks records below its seal: no marker claims it
            // holds them, and its files stay as they were found.
            Ok(())
        }
        Ok(_next) => {
            let store = Arc::clone(&storage.store);
            // The seal marker makes the copy's length match the metadata on disk.
            let sealed =
                tokio::task::spawn_blocking(move || store.seal(store_id, seal.length)).await;
            match sealed {
                Ok(Ok(_)) => {}
                // Expected on a full volume (the guard already says so).
                Ok(Err(e)) if e.is_no_space() => {
                    info!(segment = %store_id, error = %e, "no room for the seal marker; metadata still clamps reads");
                }
                _ => {
                    warn!(segment = %store_id, "cannot write the seal marker; metadata still clamps reads")
                }
            }
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// Waits until a quorum holds every record durable on this fenced copy, so
/// the seal (at that durable length) is held by a quorum before anyone
/// relies on it (`replication.md`, invariant 4), and no record the producer
/// table names is cut off by it. Immediate with one copy.
async fn quorum_holds_all(
    storage: &Storage,
    id: malachi_storage::SegmentId,
    replicated: Option<&Replicated>,
    timeout_ms: u64,
) -> Result<(), QuorumWaitError> {
    let Some(replicated) = replicated else {
        return Ok(());
    };
    let durable = storage.store.info(id)?.durable;
    replicated.local_durable(storage, durable);
    Ok(replicated.wait_committed(durable, timeout_ms).await?)
}

/// Why a fenced copy's records could not be shown held by a quorum.
#[derive(Debug, thiserror::Error)]
enum QuorumWaitError {
    #[error("cannot read the copy's durable end: {0}")]
    Info(#[from] StorageError),
    #[error(transparent)]
    NoQuorum(#[from] NoQuorum),
}

/// The producer table a sealing segment leaves for its successors, written
/// as its sidecar once everything appended before the fence is durable.
struct Handoff {
    args: SegmentArgs,
    table: ProducerTable,
    stale: bool,
    /// The table lacks ancestors still read from their holders: written
    /// down it would speak for producers it does not know.
    pending: bool,
}

impl Handoff {
    fn of(state: &SegmentState) -> Handoff {
        Handoff {
            args: state.args.clone(),
            table: state.producers.clone(),
            stale: state.producers_stale,
            pending: state.producers_pending,
        }
    }

    /// Writes the sidecar (rebuilt from the durable log first if a group
    /// commit failed). A failure is logged: successors then rebuild the
    /// table from this segment's log.
    async fn write(self) {
        let id = malachi_storage::SegmentId(self.args.segment.0);
        if self.pending {
            info!(segment = %id, "no producer sidecar: the predecessors' producer state was still being read; successors rebuild it");
            return;
        }
        let written = tokio::task::spawn_blocking(move || {
            let table = if self.stale {
                let (table, _, wanted) =
                    build_producers(&self.args, &Fetched::new(), LocalScans::Now);
                if !wanted.is_empty() {
                    return;
                }
                table
            } else {
                self.table
            };
            lineage::write_sidecar(&self.args.storage, id, &table);
        })
        .await;
        if let Err(e) = written {
            warn!(segment = %id, error = %e, "the producer sidecar task failed");
        }
    }
}

/// How long a segment asks its ancestors' holders for their producer state
/// before it says, as an error, that idempotent batches stay refused until
/// one answers: every holder of a sealed segment unreachable for this long
/// is more than the replication factor covers. It never gives up and starts
/// them afresh: that would let a retry of a batch an ancestor stored be
/// stored again (safety before availability; ADR 0124).
pub(crate) const PRODUCERS_FETCH_WAIT_MS_MAX: u64 = 60_000;
/// How long one ancestor's read from its holders may take in one round.
const PRODUCERS_FETCH_ROUND_MS_MAX: u64 = 30_000;
/// The pause after a round of asking that left an ancestor unread, doubled
/// after each such round up to `PRODUCERS_FETCH_RETRY_MS_MAX`.
const PRODUCERS_FETCH_RETRY_MS_FIRST: u64 = 100;
const PRODUCERS_FETCH_RETRY_MS_MAX: u64 = 5_000;

/// Rounds of asking for sealed tables alone before logs are read: the
/// sealing broker wrote its sidecar before the seal could commit, but a
/// holder's copy may take a moment to show it ends at the seal.
const SEALED_TABLE_ROUNDS_FIRST: u32 = 2;

/// Reads the `wanted` ancestors' state from their holders, in rounds until
/// every one still needed is read (an error is logged once
/// `PRODUCERS_FETCH_WAIT_MS_MAX` has passed): first each one's final table
/// (a holder's sidecar, ADR 0156), which also speaks for the ancestors
/// behind it; then, for those no holder has a table of, this broker's own
/// copies' logs where they are whole, and holders' logs where not (ADR
/// 0124). Hands the table to the segment's actor, which refuses idempotent
/// batches until then. A segment that rolls meanwhile stops this task.
async fn fetch_producers(
    args: SegmentArgs,
    wanted: Vec<(SegmentId, Ancestor)>,
    myself: ActorRef<SegmentMsg>,
) {
    let started = Instant::now();
    let warn_at = tokio::time::Instant::now() + Duration::from_millis(PRODUCERS_FETCH_WAIT_MS_MAX);
    let mut warned = false;
    let (mut fetched, mut wanted) = (Fetched::new(), wanted);
    let mut retry_ms = PRODUCERS_FETCH_RETRY_MS_FIRST;
    let mut round = 0u32;
    let table = loop {
        fetch_sealed_tables(&args, &wanted, &mut fetched).await;
        if ancestors::still_wanted(&args.ancestry, &wanted, &fetched).is_empty() {
            break None;
        }
        if round == SEALED_TABLE_ROUNDS_FIRST {
            // No table yet: scan the whole copies here, and keep wanting
            // only the ancestors this broker has no whole copy of.
            let Some((table, left)) = build_off_task(&args, &fetched, LocalScans::Now).await else {
                return;
            };
            if left.is_empty() {
                break Some(table);
            }
            wanted = left;
        }
        if round >= SEALED_TABLE_ROUNDS_FIRST {
            fetch_logs(&args, &wanted, &mut fetched).await;
            if ancestors::still_wanted(&args.ancestry, &wanted, &fetched).is_empty() {
                break None;
            }
        }
        if !warned && tokio::time::Instant::now() >= warn_at {
            warned = true;
            error!(segment = args.segment.0, topic = %args.topic, wait_ms = PRODUCERS_FETCH_WAIT_MS_MAX, "no holder of some ancestors answered; idempotent batches to this range stay refused (busy) until one does");
        }
        tokio::time::sleep(Duration::from_millis(retry_ms)).await;
        retry_ms = (retry_ms * 2).min(PRODUCERS_FETCH_RETRY_MS_MAX);
        round += 1;
    };
    let finals = fetched
        .values()
        .filter(|f| matches!(f, ancestors::FetchedTable::Final(_)))
        .count();
    let from = if table.is_none() && fetched.len() == finals {
        "sealed_table"
    } else {
        "log"
    };
    info!(
        segment = args.segment.0,
        ancestors = wanted.len(),
        sealed_tables = finals,
        from,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "the predecessors' producer state was read"
    );
    args.storage.metrics.producer_state_fetched(from);
    let table = match table {
        Some(table) => table,
        None => match build_off_task(&args, &fetched, LocalScans::Now).await {
            Some((table, _)) => table,
            None => return,
        },
    };
    // A stopped actor (rolled meanwhile) needs no table.
    let _ = myself.send_message(SegmentMsg::ProducersReady(table));
}

/// [`build_producers`] on a blocking thread: the table and the ancestors
/// still wanted. `None` when the task failed: the segment goes on refusing
/// idempotent batches until it rolls (its successor asks again), never
/// with a table short of them.
async fn build_off_task(
    args: &SegmentArgs,
    fetched: &Fetched,
    scans: LocalScans,
) -> Option<(ProducerTable, Vec<(SegmentId, Ancestor)>)> {
    let (args, fetched) = (args.clone(), fetched.clone());
    match tokio::task::spawn_blocking(move || {
        let (table, _, wanted) = build_producers(&args, &fetched, scans);
        (table, wanted)
    })
    .await
    {
        Ok(built) => Some(built),
        Err(e) => {
            error!(error = %e, "the producer table rebuild failed");
            None
        }
    }
}

/// One round of asking each ancestor still needed for its final table.
async fn fetch_sealed_tables(
    args: &SegmentArgs,
    wanted: &[(SegmentId, Ancestor)],
    fetched: &mut Fetched,
) {
    let (me, limits) = (
        args.storage.config.node_id,
        args.storage.config.producer_limits(),
    );
    // Nearest first, and again after each answer: a parent's table makes
    // its own ancestors' unnecessary.
    let mut asked = std::collections::BTreeSet::new();
    while let Some((ancestor, of)) = ancestors::still_wanted(&args.ancestry, wanted, fetched)
        .into_iter()
        .find(|(s, _)| !asked.contains(s))
    {
        asked.insert(ancestor);
        let table = ancestors::fetch_sealed_table(
            args.holders.as_ref(),
            &args.topic,
            me,
            ancestor,
            &of,
            limits,
        );
        if let Some(table) = table.await {
            fetched.insert(ancestor, ancestors::FetchedTable::Final(table));
        }
    }
}

/// One round of reading the logs' tags of the ancestors still needed.
async fn fetch_logs(args: &SegmentArgs, wanted: &[(SegmentId, Ancestor)], fetched: &mut Fetched) {
    let (me, limits) = (
        args.storage.config.node_id,
        args.storage.config.producer_limits(),
    );
    for (ancestor, of) in ancestors::still_wanted(&args.ancestry, wanted, fetched) {
        let now_ms = args.storage.clock.now_ms();
        let read = ancestors::fetch_own_tags(
            args.holders.as_ref(),
            &args.topic,
            me,
            ancestor,
            &of,
            limits,
            now_ms,
        );
        match tokio::time::timeout(Duration::from_millis(PRODUCERS_FETCH_ROUND_MS_MAX), read).await
        {
            Ok(Ok(table)) => {
                fetched.insert(ancestor, ancestors::FetchedTable::OwnTags(table));
            }
            Ok(Err(e)) => {
                info!(segment = args.segment.0, ancestor = ancestor.0, error = %e, "an ancestor's producer state could not be read from a holder yet")
            }
            Err(_) => {
                info!(
                    segment = args.segment.0,
                    ancestor = ancestor.0,
                    "reading an ancestor's producer state from its holders timed out; asking again"
                )
            }
        }
    }
}

/// The producer table of a segment at open: its predecessors' final
/// tables (from their sidecars, or rebuilt from their ancestors and logs
/// when a sidecar is missing or damaged, or from the tags in `fetched`,
/// read from holders; `lineage.rs`), then every tag in its own log, in
/// order. Also where its own log must be cut, if it ends inside an
/// idempotent batch ([`producers::BatchStarts`]), and the ancestors a
/// holder's copy must stand in for (empty: the table is complete).
fn build_producers(
    args: &SegmentArgs,
    fetched: &Fetched,
    scans: LocalScans,
) -> (ProducerTable, Option<u64>, Vec<(SegmentId, Ancestor)>) {
    let now_ms = args.storage.clock.now_ms();
    let mut lineage =
        Lineage::with_fetched(&args.storage, &args.topic, &args.ancestry, fetched, now_ms)
            .replicated(args.replicas.len() > 1)
            .local_scans(scans);
    let mut table = lineage.start_table(args.range);
    let wanted = lineage.wanted();
    let torn = lineage::scan_tags(
        &args.storage,
        malachi_storage::SegmentId(args.segment.0),
        &mut table,
        now_ms,
        None,
    )
    .unwrap_or(None);
    (table, torn, wanted)
}

/// Cuts the copy's log back to `start`, the first record of an idempotent
/// batch a crash tore (its write was never synced: none of it was
/// acknowledged). Its tag was lost with its last record, so the table
/// already has the batch as not stored and takes its retry whole; the cut
/// keeps that retry from storing the prefix a second time. Only a copy
/// nobody replicates is cut here.
fn cut_torn_batch(args: &SegmentArgs, id: malachi_storage::SegmentId, start: u64) {
    if args.replicas.len() > 1 {
        warn!(segment = %id, start, "the log ends inside a torn idempotent batch of a replicated copy; left as it is");
        return;
    }
    match args.storage.store.truncate_tail(id, start) {
        Ok(_) => warn!(segment = %id, start, "cut a torn idempotent batch from the end of the log"),
        Err(e) => {
            warn!(segment = %id, start, error = %e, "cannot cut a torn idempotent batch; its retry may store a prefix twice");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::lineage::fixture::*;
    use super::*;

    #[derive(Debug)]
    struct NoRoll;

    #[async_trait::async_trait]
    impl Roller for NoRoll {
        async fn roll(&self, _: &str, _: SegmentId, _: SealRecord) -> Result<SegmentId, RollError> {
            Err(RollError::Transient("no roll in this test".into()))
        }

        fn settle(&self, _: &str, _: RangeId, _: SegmentId) {}
    }

    /// A roller the metadata refuses for good, as it refused the writers
    /// of segments split or merged away in the chaos run (finding F7).
    #[derive(Debug, Default)]
    struct Refusing {
        calls: std::sync::atomic::AtomicUsize,
        settles: parking_lot::Mutex<Vec<(String, RangeId, SegmentId)>>,
    }

    impl Refusing {
        fn calls(&self) -> usize {
            self.calls.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl Roller for Refusing {
        async fn roll(&self, _: &str, _: SegmentId, _: SealRecord) -> Result<SegmentId, RollError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err(RollError::Permanent(
                "roll refused: range r10 is not active".into(),
            ))
        }

        fn settle(&self, topic: &str, range: RangeId, segment: SegmentId) {
            self.settles.lock().push((topic.into(), range, segment));
        }
    }

    fn handle_of(storage: &Storage) -> BoundedRef<SegmentMsg> {
        storage.segments.lock()[&SegmentId(3)].actor.clone()
    }

    fn record() -> IncomingRecord {
        IncomingRecord {
            timestamp_ms: 1,
            key: "k".into(),
            value: "v".into(),
            headers: Vec::new(),
        }
    }

    /// Chaos finding F7: a writer whose roll the metadata refuses for good
    /// (its range was split away) asked again on every tick, and at once
    /// after every append its fence refused, for minutes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_roll_refused_for_good_is_not_asked_again_every_tick() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(crate::common::clock::ManualClock::new(1_000_000));
        let config = crate::common::config::BrokerConfig {
            // A tick every 10 ms.
            segment_age_ms: 40,
            ..crate::common::config::BrokerConfig::for_tests(dir.path())
        };
        let store = Arc::new(
            malachi_storage::FileStore::open_dir(
                dir.path(),
                malachi_storage::StoreConfig::default(),
            )
            .unwrap(),
        );
        let storage = Arc::new(Storage::new(
            config,
            store,
            clock.clone(),
            Arc::new(crate::common::metrics::BrokerMetrics::new()),
        ));
        // A copy fenced by a freeze (or a roll before a crash): it must roll.
        let id = malachi_storage::SegmentId(3);
        storage.store.open(id).unwrap();
        storage
            .store
            .append(id, &[malachi_storage::Record::new(1, "k", "v")])
            .unwrap()
            .wait()
            .unwrap();
        storage.store.fence(id).unwrap();
        storage.store.close(id).unwrap();
        let roller = Arc::new(Refusing::default());
        let args = SegmentArgs {
            storage: Arc::clone(&storage),
            roller: roller.clone(),
            topic: "t".into(),
            range: RANGE,
            segment: SegmentId(3),
            start_offset: 0,
            created_at_ms: 1_000_000,
            ancestry: Ancestry::default(),
            replicas: vec![NodeId(1)],
            epoch: 1,
            holders: Arc::new(Holders::default()),
        };
        let (actor, handle) = Actor::spawn(None, SegmentActor, args).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // About 30 ticks, and producers retrying on the refused copy.
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let (reply, answer) = oneshot::channel();
            handle_of(&storage)
                .try_send(|permit| SegmentMsg::Append {
                    permit,
                    records: Arc::new(vec![record()]),
                    bytes: 1,
                    producer: None,
                    reply,
                })
                .unwrap();
            assert!(matches!(answer.await.unwrap(), Err(AppendError::Rolled)));
        }
        assert_eq!(roller.calls(), 1, "asked again before its backoff");
        // Handed to the control plane to settle, once per refusal.
        assert_eq!(
            *roller.settles.lock(),
            vec![("t".to_string(), RANGE, SegmentId(3))]
        );
        // Then asked again after 1 s, 2 s, 4 s: never more often.
        let mut expected = 1;
        for (waited_ms, asks) in [
            (999, false),
            (1, true),
            (1_999, false),
            (1, true),
            (4_000, true),
        ] {
            clock.advance_ms(waited_ms);
            // Many ticks.
            tokio::time::sleep(Duration::from_millis(150)).await;
            expected += usize::from(asks);
            assert_eq!(roller.calls(), expected, "after {waited_ms} ms more");
        }
        assert_eq!(roller.settles.lock().len(), expected);
        // The fenced copy took nothing meanwhile.
        assert_eq!(storage.store.info(id).unwrap().length, 1);
        actor.stop(None);
        handle.await.unwrap();
    }

    #[test]
    fn a_refusal_for_good_backs_off_to_a_minute_and_a_transient_failure_waits_for_a_tick() {
        let refused = RollError::Permanent("refused".into());
        let mut retry = None;
        let mut delays = Vec::new();
        for _ in 0..9 {
            let next = Retry::after(retry, &refused, 0);
            delays.push(next.at_ms);
            retry = Some(next);
        }
        assert_eq!(
            delays,
            [
                1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000
            ]
        );
        let stuck = Retry::after(None, &refused, 0);
        assert!(!stuck.due(999, true));
        assert!(stuck.due(1_000, false));
        // A transient failure after refusals counts afresh, and is tried
        // again on the next tick only, not on each refused append.
        let transient = Retry::after(Some(stuck), &RollError::Transient("timeout".into()), 5);
        assert_eq!(transient.failures, 1);
        assert!(!transient.due(u64::MAX, false));
        assert!(transient.due(5, true));
    }

    /// Chaos finding F2: after a failover the new primary followed every
    /// earlier segment and holds no sidecar of any. A producer whose last
    /// batch is two segments back must still be known, or its client starts
    /// a new epoch and stores a batch a second time.
    #[test]
    fn a_failover_successor_knows_a_producer_last_seen_before_its_predecessor() {
        let dir = tempfile::tempdir().unwrap();
        let storage = storage(dir.path());
        let now = storage.clock.now_ms();
        // A: producer 1's batches 0..=4; B: producer 2's only. No sidecars.
        copy(&storage, 1, &[(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]);
        copy(&storage, 2, &[(2, 0), (2, 1)]);
        storage.store.open(malachi_storage::SegmentId(3)).unwrap();
        let args = SegmentArgs {
            storage: Arc::clone(&storage),
            roller: Arc::new(NoRoll),
            topic: "t".into(),
            range: RANGE,
            segment: SegmentId(3),
            start_offset: 7,
            created_at_ms: now,
            ancestry: ancestry(
                &[2],
                vec![
                    (1, sealed(now - 2_000, 5, &[])),
                    (2, sealed(now - 1_000, 2, &[1])),
                ],
            ),
            replicas: vec![NodeId(1), NodeId(2), NodeId(3)],
            epoch: 1,
            holders: Arc::new(Holders::default()),
        };
        let (table, torn, wanted) = build_producers(&args, &Fetched::new(), LocalScans::Now);
        assert!(wanted.is_empty());
        assert_eq!(torn, None);
        // The next sequence is stored, the retry of the last is a duplicate.
        assert_eq!(table.check(&tag(1, 5), 1), Verdict::Append);
        assert_eq!(
            table.check(&tag(1, 4), 1),
            Verdict::Duplicate { records: 1 }
        );
        assert_eq!(table.check(&tag(2, 2), 1), Verdict::Append);
    }

    /// Segment 3 of `RANGE` opening on a broker (node 1) that holds no copy
    /// of its predecessor, segment 1 (producer 1's batches 0..=2), which
    /// broker 2 holds if `held`.
    async fn open_without_the_predecessor(
        here: &std::path::Path,
        there: &std::path::Path,
        held: bool,
    ) -> (
        Arc<Storage>,
        ActorRef<SegmentMsg>,
        tokio::task::JoinHandle<()>,
    ) {
        let storage = storage(here);
        let holder = storage_of_node(there, 2);
        copy(&holder, 1, &[(1, 0), (1, 1), (1, 2)]);
        let id = malachi_storage::SegmentId(3);
        storage.store.open(id).unwrap();
        storage.store.close(id).unwrap();
        let now = storage.clock.now_ms();
        let mut predecessor = sealed(now - 1_000, 3, &[]);
        predecessor.holders = vec![NodeId(2)];
        let copies = if held {
            std::collections::BTreeMap::from([(2, holder)])
        } else {
            std::collections::BTreeMap::new()
        };
        let args = SegmentArgs {
            storage: Arc::clone(&storage),
            roller: Arc::new(NoRoll),
            topic: "t".into(),
            range: RANGE,
            segment: SegmentId(3),
            start_offset: 3,
            created_at_ms: now,
            ancestry: ancestry(&[1], vec![(1, predecessor)]),
            replicas: vec![NodeId(1)],
            epoch: 1,
            holders: Arc::new(Holders {
                copies,
                ..Holders::default()
            }),
        };
        let (actor, handle) = Actor::spawn(None, SegmentActor, args).await.unwrap();
        (storage, actor, handle)
    }

    async fn append(storage: &Storage, producer: Option<ProducerTag>) -> Result<Ack, AppendError> {
        let (reply, answer) = oneshot::channel();
        handle_of(storage)
            .try_send(|permit| SegmentMsg::Append {
                permit,
                records: Arc::new(vec![record()]),
                bytes: 1,
                producer,
                reply,
            })
            .unwrap();
        answer.await.unwrap()
    }

    /// Issue 36: a successor placed on a broker without its predecessor's
    /// copy took idempotent batches at once with none of the predecessor's
    /// producers: a retry was stored twice, a next sequence refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_successor_without_its_predecessors_copy_takes_its_producers_from_a_holder() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (storage, actor, handle) =
            open_without_the_predecessor(here.path(), there.path(), true).await;
        let mut answer = Err(AppendError::Busy(String::new()));
        for _ in 0..500 {
            answer = append(&storage, Some(tag(1, 2))).await;
            if !matches!(answer, Err(AppendError::Busy(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            matches!(answer, Ok(Ack::Duplicate { records: 1 })),
            "{answer:?}"
        );
        assert!(matches!(
            append(&storage, Some(tag(1, 3))).await,
            Ok(Ack::Stored(_))
        ));
        actor.stop(None);
        handle.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_no_holder_answering_idempotent_batches_are_refused_retriably_not_taken_afresh() {
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (storage, actor, handle) =
            open_without_the_predecessor(here.path(), there.path(), false).await;
        for _ in 0..5 {
            // A retry of a batch the predecessor stored, and a first batch.
            for producer in [tag(1, 2), tag(2, 0)] {
                let answer = append(&storage, Some(producer)).await;
                assert!(matches!(answer, Err(AppendError::Busy(_))), "{answer:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Records of no producer are taken meanwhile.
        assert!(matches!(append(&storage, None).await, Ok(Ack::Stored(_))));
        actor.stop(None);
        handle.await.unwrap();
    }
}
