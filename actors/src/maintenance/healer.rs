//! `maintenance/healer`: makes new copies of sealed segments (issue 19,
//! ADR 0106, 0110, 0117). A heal is one of three kinds (`HealKind`):
//!
//! - **replace**: a holder has been gone for longer than
//!   `replace_after_ms`; its copy is re-created on a live broker holding
//!   none, which takes its place in the replica set (`ReplaceReplica`);
//! - **rebuild**: the scrubber found a live holder's copy broken; it is
//!   rebuilt where it is, the replica set unchanged (ADR 0110);
//! - **add**: the segment has fewer copies than its topic's factor (a
//!   failover placed it on the brokers it could reach, chaos finding F1);
//!   a live broker holding none gets a copy, appended to the set
//!   (`AddReplica`, ADR 0117).
//!
//! The coordinators of the vnodes this broker leads hand it the copies to
//! make, with their order epoch. A task per segment (at most [`HEALS_MAX`]
//! at once):
//!
//! 1. picks the new holder (for a replace or an add: among the live brokers
//!    holding no copy, under the topic's placement constraints with the
//!    other copies as the set's fixed part, ADR 0116), and a source among
//!    the live holders (preferring this broker: no network for the reads);
//! 2. copies the sealed segment from the source to the new holder, frames
//!    verbatim (catch-up reads, repair writes, every frame's CRC checked by
//!    the writing store), all heals of the broker together at most
//!    [`HEAL_BYTES_PER_SECOND`] so producers do not starve; the new copy
//!    seals itself at the seal;
//! 3. verifies the new copy (sealed, at the recorded length and bytes);
//! 4. records it: `ReplaceReplica` in the lost holder's place, or
//!    `AddReplica` at the end of the set, bounded by the factor so two
//!    heals never take a segment past it.
//!
//! Every step is idempotent: a task that fails starts over, a new holder's
//! partial copy is extended, not rewritten, and a task that finds its copy
//! recorded already (the lost holder replaced, the factor reached) ends as
//! not needed. A replace waits for a broker to heal onto; an add with none
//! ends at once, and the coordinator asks again while one could take it.
//! The lost holder's copy, if its broker ever returns, is no longer in the
//! metadata, and the orphan sweep removes it (ADR 0115).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use malachi_core::model::{
    Command, ModelError, NodeId, Outcome, SealRecord, SegmentId, SegmentState,
};
use malachi_core::ring::VnodeId;
use malachi_wire::replica_order::{CATCH_UP_BYTES_MAX, CatchUpRequest, OrderEpoch};
use malachi_wire::replication::{RepairOrder, ReplicaAppendRequest};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::common::error::MetadataError;
use crate::common::metrics::BrokerMetrics;
use crate::control::handle::ControlHandle;
use crate::control::metadata::read_owner;
use crate::control::order_error::OrderError;
use crate::control::registry::ActorRegistry;
use crate::control::replica_order::OrderClient;
pub(crate) use crate::control::requests::{HealCandidate, HealKind, HealMsg};
use crate::control::shared::ClusterLinks;
use crate::data::storage::Storage;

/// Heals this broker runs at once; more wait for the next `Ensure`.
pub(crate) const HEALS_MAX: usize = 4;
/// The copy rate of all the heals this broker runs together, so producers
/// keep most of the disk.
pub(crate) const HEAL_BYTES_PER_SECOND: u64 = 64 << 20;

/// The broker-wide pace of heals: each run of frames reserves its share of
/// [`HEAL_BYTES_PER_SECOND`] and waits until the reservation ends.
#[derive(Debug)]
pub(crate) struct Pacer {
    next: parking_lot::Mutex<Instant>,
    bytes_per_second: u64,
}

impl Pacer {
    pub(crate) fn new(bytes_per_second: u64) -> Pacer {
        Pacer {
            next: parking_lot::Mutex::new(Instant::now()),
            bytes_per_second: bytes_per_second.max(1),
        }
    }

    /// Reserves `bytes` at `now` and returns when the reservation ends:
    /// back to back with the previous one, or from `now` if the pacer was
    /// idle.
    pub(crate) fn reserve(&self, bytes: u64, now: Instant) -> Instant {
        let mut next = self.next.lock();
        let start = (*next).max(now);
        let end = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        *next = end;
        end
    }
}
const RETRY_FIRST_MS: u64 = 200;
const RETRY_MAX_MS: u64 = 5_000;
/// Attempts an add makes before it gives its slot up (ADR 0117): no copy
/// is lost while it waits, and the coordinator asks again next tick.
const ADD_ATTEMPTS_MAX: u64 = 5;

pub(crate) struct HealerActor;

/// What the healer reads: this broker's id, the metadata plane and its
/// own registry slot (`actors`), membership (`links`), the data plane's
/// free-space guard (`data`), the metrics it counts into, and the control
/// plane's order client and placement (`control`).
#[derive(Debug)]
pub(crate) struct HealerCtx {
    pub node_id: u64,
    pub actors: Arc<ActorRegistry>,
    pub links: Arc<ClusterLinks>,
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    pub control: ControlHandle,
}

pub(crate) struct HealerState {
    ctx: Arc<HealerCtx>,
    pacer: Arc<Pacer>,
    tasks: BTreeMap<SegmentId, JoinHandle<()>>,
    /// The scrub poll running for each vnode (ADR 0110).
    scrubs: BTreeMap<VnodeId, JoinHandle<()>>,
}

/// The heals and scrub polls end with the state, after a stop, a failure
/// or a kill alike (ractor runs `post_stop` only after a stop): the
/// restarted actor's coordinators ask for them again.
impl Drop for HealerState {
    fn drop(&mut self) {
        for task in self.tasks.values().chain(self.scrubs.values()) {
            task.abort();
        }
    }
}

#[ractor::async_trait]
impl Actor for HealerActor {
    type Msg = HealMsg;
    type State = HealerState;
    type Arguments = Arc<HealerCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<HealMsg>,
        ctx: Arc<HealerCtx>,
    ) -> Result<HealerState, ActorProcessingErr> {
        ctx.actors.healer().register(myself);
        Ok(HealerState {
            ctx,
            pacer: Arc::new(Pacer::new(HEAL_BYTES_PER_SECOND)),
            tasks: BTreeMap::new(),
            scrubs: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<HealMsg>,
        msg: HealMsg,
        state: &mut HealerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HealMsg::Ensure {
                vnode,
                order,
                candidates,
            } => {
                // A heal that panicked sent no `Ended`: it must not hold
                // one of the `HEALS_MAX` slots.
                state.tasks.retain(|_, task| !task.is_finished());
                for candidate in candidates {
                    let segment = candidate.segment;
                    if state.tasks.get(&segment).is_some_and(|t| !t.is_finished()) {
                        continue;
                    }
                    if state.tasks.len() >= HEALS_MAX && !state.tasks.contains_key(&segment) {
                        continue;
                    }
                    info!(
                        topic = %candidate.topic,
                        segment = segment.0,
                        kind = candidate.kind.name(),
                        holder = candidate.kind.holder(),
                        "heal started"
                    );
                    let ctx = Arc::clone(&state.ctx);
                    let pacer = Arc::clone(&state.pacer);
                    let me = myself.clone();
                    let handle = tokio::spawn(async move {
                        run(&ctx, &pacer, vnode, order, &candidate).await;
                        let _ = me.send_message(HealMsg::Ended { segment });
                    });
                    state.tasks.insert(segment, handle);
                }
            }
            HealMsg::Scrub {
                vnode,
                order,
                targets,
            } => {
                if state.scrubs.get(&vnode).is_some_and(|t| !t.is_finished()) {
                    return Ok(());
                }
                let ctx = Arc::clone(&state.ctx);
                let me = myself.clone();
                let handle = tokio::spawn(async move {
                    let candidates = scrub_poll(&ctx, &targets).await;
                    if !candidates.is_empty() {
                        let _ = me.send_message(HealMsg::Ensure {
                            vnode,
                            order,
                            candidates,
                        });
                    }
                    let _ = me.send_message(HealMsg::ScrubEnded { vnode });
                });
                state.scrubs.insert(vnode, handle);
            }
            HealMsg::ScrubEnded { vnode } => {
                if state
                    .scrubs
                    .get(&vnode)
                    .is_some_and(JoinHandle::is_finished)
                {
                    state.scrubs.remove(&vnode);
                }
            }
            HealMsg::Ended { segment } => {
                if state
                    .tasks
                    .get(&segment)
                    .is_some_and(JoinHandle::is_finished)
                {
                    state.tasks.remove(&segment);
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<HealMsg>,
        state: &mut HealerState,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.actors.healer().unregister(&myself);
        Ok(())
    }
}

enum Attempt {
    Healed { node: u64, bytes: u64 },
    NotNeeded(&'static str),
}

async fn run(
    ctx: &Arc<HealerCtx>,
    pacer: &Pacer,
    vnode: VnodeId,
    order: OrderEpoch,
    candidate: &HealCandidate,
) {
    let started = Instant::now();
    let mut pause = RETRY_FIRST_MS;
    let mut attempts: u64 = 0;
    loop {
        attempts += 1;
        match attempt(ctx, pacer, vnode, order, candidate, attempts).await {
            Ok(Attempt::Healed { node, bytes }) => {
                let elapsed = started.elapsed();
                ctx.metrics.heals.increment(1);
                ctx.metrics.heal_bytes.increment(bytes);
                let what = match candidate.kind {
                    HealKind::Replace { .. } => "segment copy healed",
                    HealKind::Rebuild { .. } => "segment copy rebuilt in place",
                    HealKind::Add => "segment copy added",
                };
                info!(
                    topic = %candidate.topic,
                    segment = candidate.segment.0,
                    kind = candidate.kind.name(),
                    holder = candidate.kind.holder(),
                    new = node,
                    bytes,
                    elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                    "{what}"
                );
                return;
            }
            Ok(Attempt::NotNeeded(why)) => {
                debug!(segment = candidate.segment.0, why, "heal not needed");
                return;
            }
            Err(reason) if candidate.kind == HealKind::Add && attempts >= ADD_ATTEMPTS_MAX => {
                warn!(topic = %candidate.topic, segment = candidate.segment.0, attempts, %reason, "copy not added; the coordinator will ask again");
                return;
            }
            Err(reason) => {
                if attempts.is_multiple_of(10) {
                    warn!(topic = %candidate.topic, segment = candidate.segment.0, attempts, %reason, "heal not done yet");
                } else {
                    debug!(segment = candidate.segment.0, attempts, %reason, "heal attempt failed");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
        pause = (pause * 2).min(RETRY_MAX_MS);
    }
}

/// The new holder for a copy of a segment held by `replicas`: a live
/// candidate holding none, chosen by the segment id so concurrent heals
/// spread. `None` when every live broker holds one.
pub(crate) fn new_holder(
    candidates: &[u64],
    replicas: &[u64],
    gone: &std::collections::BTreeSet<u64>,
    segment: u64,
) -> Option<u64> {
    let mut free: Vec<u64> = candidates
        .iter()
        .copied()
        .filter(|n| !replicas.contains(n) && !gone.contains(n))
        .collect();
    free.sort_unstable();
    free.dedup();
    if free.is_empty() {
        return None;
    }
    let at = usize::try_from(segment % free.len() as u64).unwrap_or(0);
    free.get(at).copied()
}

/// The new holder under the topic's placement constraints (ADR 0116):
/// the surviving copies stay (they are the set's fixed part: for an added
/// copy, every copy), the range's
/// serving broker is preferred, the new holder is one of `roomy` (the live
/// brokers with room), and a hard constraint no such broker can meet
/// leaves the copy unhealed (retried) rather than broken.
/// Why a heal attempt did not finish; the heal tries again.
#[derive(Debug, thiserror::Error)]
enum HealError {
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("unexpected outcome {0:?}")]
    Unexpected(Box<Outcome>),
    #[error("no broker to heal onto: {0}")]
    NoPlacement(#[source] malachi_core::constraints::PlaceError),
    #[error("no live broker without a copy to heal onto")]
    NoNewHolder,
    #[error("broker {holder} holding the broken copy is not alive")]
    HolderDead { holder: u64 },
    #[error("no surviving copy to heal from")]
    NoSource,
    #[error("the new holder {node} refused ({refusal:?}): {message}")]
    HolderRefused {
        node: u64,
        refusal: malachi_wire::replication::ReplicaRefusal,
        message: String,
    },
    #[error("the new holder {node} made no progress at {at}")]
    HolderStalled { node: u64, at: u64 },
    #[error("catch-up from {from_node} refused ({refusal:?}): {message}")]
    CatchUpRefused {
        from_node: u64,
        refusal: malachi_wire::replica_order::OrderRefusal,
        message: String,
    },
    #[error("catch-up from {from_node} brought nothing at {at}")]
    CatchUpEmpty { from_node: u64, at: u64 },
    #[error(
        "the new copy on {node} is not whole yet: sealed {sealed}, {durable_end:?} records, {durable_bytes:?} bytes; the seal is {length} records, {bytes} bytes"
    )]
    NotWhole {
        node: u64,
        sealed: bool,
        durable_end: Option<u64>,
        durable_bytes: Option<u64>,
        length: u64,
        bytes: u64,
    },
}

fn constrained_holder(
    ctx: &HealerCtx,
    (live, roomy): (&[u64], &[u64]),
    replicas: &[u64],
    candidate: &HealCandidate,
    serving: Option<u64>,
    segment: u64,
    constraints: &[malachi_core::constraints::Constraint],
) -> Result<u64, HealError> {
    // Every copy but the one replaced (none for an added copy).
    let survivors: Vec<u64> = replicas
        .iter()
        .copied()
        .filter(|n| Some(*n) != candidate.kind.holder() && !candidate.gone.contains(n))
        .collect();
    let pool: Vec<u64> = live
        .iter()
        .copied()
        .filter(|n| {
            survivors.contains(n)
                || (roomy.contains(n) && !replicas.contains(n) && !candidate.gone.contains(n))
        })
        .collect();
    let brokers = ctx.control.brokers_with_attributes(&pool);
    let preferred: Vec<u64> = serving.into_iter().collect();
    let placed = malachi_core::constraints::place(
        &survivors,
        &preferred,
        &brokers,
        survivors.len() + 1,
        segment,
        constraints,
    )
    .map_err(HealError::NoPlacement)?;
    placed
        .nodes
        .into_iter()
        .find(|n| !survivors.contains(n))
        .ok_or(HealError::NoNewHolder)
}

async fn attempt(
    ctx: &Arc<HealerCtx>,
    pacer: &Pacer,
    vnode: VnodeId,
    order: OrderEpoch,
    candidate: &HealCandidate,
    attempts: u64,
) -> Result<Attempt, HealError> {
    let (topic, segment) = (candidate.topic.as_str(), candidate.segment);
    let plane = ctx.actors.plane()?;
    let Some(known) = known_segment(plane.as_ref(), topic, segment) else {
        return Ok(Attempt::NotNeeded("the segment is gone"));
    };
    let SegmentState::Sealed { seal, .. } = known.state else {
        return Ok(Attempt::NotNeeded("the segment is not sealed"));
    };
    if let Some(why) = healed_already(candidate, &known) {
        return Ok(Attempt::NotNeeded(why));
    }
    let group = plane.host().and_then(|h| h.group(vnode));
    if group.is_none_or(|g| g.leader_term() != (Some(ctx.node_id), order.term)) {
        return Ok(Attempt::NotNeeded(
            "this broker no longer leads the vnode at the order's term",
        ));
    }
    let live = alive(ctx);
    let node = match new_copy_holder(ctx, candidate, &known, &live) {
        Ok(node) => node,
        // A lost copy is worth waiting for; an added one is not: the
        // coordinator asks again while a broker could take one, so
        // this task gives its slot up instead of holding it.
        Err(_) if candidate.kind == HealKind::Add => {
            return Ok(Attempt::NotNeeded(
                "no live broker without a copy to add one onto",
            ));
        }
        Err(e) => return Err(e),
    };
    let source = copy_source(ctx.node_id, candidate, &known.replicas, &live, attempts)?;
    let client = ctx.control.order_client();
    let bytes = copy_sealed(
        &client,
        pacer,
        topic,
        segment,
        order,
        known.writer_epoch,
        source,
        node,
        seal,
    )
    .await?;
    verify(&client, node, segment, seal).await?;
    record_copy(plane.as_ref(), candidate, node, bytes, known.factor).await
}

/// What the metadata says of a segment to heal.
struct KnownSegment {
    replicas: Vec<u64>,
    state: SegmentState,
    writer_epoch: u64,
    /// The primary of the range's newest segment: the broker that serves
    /// the range's reads, and best placed to hold its sealed copies too.
    serving: Option<u64>,
    /// The copies the topic's policy wants.
    factor: usize,
    policy: Option<String>,
}

fn known_segment(
    plane: &dyn crate::control::metadata::MetadataPlane,
    topic: &str,
    segment: SegmentId,
) -> Option<KnownSegment> {
    let policy = read_owner(plane, topic, |state| {
        state.topic(topic).and_then(|t| t.policy.clone())
    });
    read_owner(plane, topic, |state| {
        state.segment(segment).map(|s| {
            let serving = state
                .range(s.range)
                .and_then(|r| r.last_segment())
                .and_then(|id| state.segment(id))
                .and_then(|last| last.replicas.first())
                .map(|n| n.0);
            KnownSegment {
                replicas: s.replicas.iter().map(|n| n.0).collect(),
                state: s.state,
                writer_epoch: s.epoch,
                serving,
                factor: crate::control::coordinator::wanted_copies(state, topic),
                policy: policy.clone(),
            }
        })
    })
}

/// Why the heal is no longer needed, if it is not: the copy it replaces
/// or rebuilds is no longer listed, or (a retried task whose copy was
/// recorded already, or another heal's) the segment is at its factor.
fn healed_already(candidate: &HealCandidate, known: &KnownSegment) -> Option<&'static str> {
    match candidate.kind {
        HealKind::Replace { lost } if !known.replicas.contains(&lost) => {
            Some("the lost copy was replaced already")
        }
        HealKind::Rebuild { holder } if !known.replicas.contains(&holder) => {
            Some("the broken copy is no longer listed")
        }
        HealKind::Add if known.replicas.len() >= known.factor => {
            Some("the segment has its factor's copies")
        }
        _ => None,
    }
}

/// The broker that gets the new copy: a broken copy on a live broker is
/// rebuilt where it is (ADR 0110); otherwise a live broker with room (ADR
/// 0127: one at its free-space line would refuse it at the line anyway)
/// and no copy, the range's serving broker first, within the policy's
/// constraints.
fn new_copy_holder(
    ctx: &HealerCtx,
    candidate: &HealCandidate,
    known: &KnownSegment,
    live: &[u64],
) -> Result<u64, HealError> {
    if let HealKind::Rebuild { holder } = candidate.kind {
        if !live.contains(&holder) {
            return Err(HealError::HolderDead { holder });
        }
        return Ok(holder);
    }
    let roomy = with_room(ctx, live);
    let constraints = ctx.control.policy_constraints(known.policy.as_deref());
    let segment = candidate.segment.0;
    let node = if constraints.is_empty() {
        known
            .serving
            .filter(|n| {
                roomy.contains(n) && !known.replicas.contains(n) && !candidate.gone.contains(n)
            })
            .or_else(|| new_holder(&roomy, &known.replicas, &candidate.gone, segment))
            .ok_or(HealError::NoNewHolder)?
    } else {
        constrained_holder(
            ctx,
            (live, &roomy),
            &known.replicas,
            candidate,
            known.serving,
            segment,
            &constraints,
        )?
    };
    assert!(
        !known.replicas.contains(&node),
        "a new copy of segment {segment} goes to broker {node}, which holds one"
    );
    Ok(node)
}

/// Where the copy is read from: any live holder but a broken copy's (a
/// decommissioned broker's copy is a good source while it runs; a gone one
/// is not alive). This broker's own copy first (no network for the
/// reads), then, after a failed attempt, each source in turn: a source may
/// be broken too.
fn copy_source(
    me: u64,
    candidate: &HealCandidate,
    replicas: &[u64],
    live: &[u64],
    attempts: u64,
) -> Result<u64, HealError> {
    let rebuilt = match candidate.kind {
        HealKind::Rebuild { holder } => Some(holder),
        HealKind::Replace { .. } | HealKind::Add => None,
    };
    let sources: Vec<u64> = replicas
        .iter()
        .copied()
        .filter(|n| live.contains(n) && Some(*n) != rebuilt)
        .collect();
    if attempts <= 1 && sources.contains(&me) {
        return Ok(me);
    }
    let at = usize::try_from(attempts % (sources.len().max(1) as u64)).unwrap_or(0);
    sources.get(at).copied().ok_or(HealError::NoSource)
}

/// Records a verified new copy in the metadata: nothing for a rebuild in
/// place, `ReplaceReplica` for a lost copy, `AddReplica` for an added one.
async fn record_copy(
    plane: &dyn crate::control::metadata::MetadataPlane,
    candidate: &HealCandidate,
    node: u64,
    bytes: u64,
    factor: usize,
) -> Result<Attempt, HealError> {
    let (topic, segment) = (candidate.topic.clone(), candidate.segment);
    let command = match candidate.kind {
        HealKind::Rebuild { .. } => return Ok(Attempt::Healed { node, bytes }),
        HealKind::Replace { lost } => Command::ReplaceReplica {
            topic,
            segment,
            old: NodeId(lost),
            new: NodeId(node),
        },
        HealKind::Add => Command::AddReplica {
            topic,
            segment,
            new: NodeId(node),
            factor: u32::try_from(factor).unwrap_or(u32::MAX),
        },
    };
    match plane.propose(command).await? {
        Ok(Outcome::ReplicaReplaced { .. } | Outcome::ReplicaAdded { .. }) => {
            Ok(Attempt::Healed { node, bytes })
        }
        Ok(other) => Err(HealError::Unexpected(Box::new(other))),
        Err(ModelError::WrongReplica { .. }) => {
            Ok(Attempt::NotNeeded("the lost copy was replaced already"))
        }
        // Recorded already (an earlier commit whose answer was lost), or
        // another heal brought the segment to its factor first.
        Err(ModelError::ReplicaPresent { .. } | ModelError::AtFactor { .. })
            if candidate.kind == HealKind::Add =>
        {
            Ok(Attempt::NotNeeded("the copy was added already"))
        }
        Err(e) => Err(HealError::Model(e)),
    }
}

/// The brokers SWIM calls alive (this one alone without membership), by id.
fn alive(ctx: &HealerCtx) -> Vec<u64> {
    match ctx.links.fabric() {
        Some(fabric) => fabric
            .membership
            .view()
            .live()
            .filter(|m| m.state == malachi_membership::MemberState::Alive)
            .map(|m| m.node_id)
            .collect(),
        None => vec![ctx.node_id],
    }
}

/// Those of `live` whose volume has room for a new copy: not marked full
/// in membership (ADR 0111), and this broker not full by its own guard.
fn with_room(ctx: &HealerCtx, live: &[u64]) -> Vec<u64> {
    let me = ctx.node_id;
    let full: std::collections::BTreeSet<u64> = match ctx.links.fabric() {
        Some(fabric) => fabric
            .membership
            .view()
            .all()
            .filter(|m| !crate::common::volume::has_room(&m.attributes))
            .map(|m| m.node_id)
            .collect(),
        None => std::collections::BTreeSet::new(),
    };
    live.iter()
        .copied()
        .filter(|n| {
            let full_here = *n == me && ctx.data.space.is_full();
            !full.contains(n) && !full_here
        })
        .collect()
}

/// Asks every live holder of `targets` for its scrub verdicts (ADR 0110)
/// and returns the broken copies to rebuild in place. A holder that does
/// not answer is asked again at the next poll.
async fn scrub_poll(
    ctx: &Arc<HealerCtx>,
    targets: &[crate::control::requests::ScrubTarget],
) -> Vec<HealCandidate> {
    use malachi_wire::replica_status::{REPLICA_STATUS_SEGMENTS_MAX, ScrubSeal};
    let live = alive(ctx);
    let mut by_holder: BTreeMap<u64, Vec<&crate::control::requests::ScrubTarget>> = BTreeMap::new();
    for target in targets {
        for holder in &target.replicas {
            if live.contains(holder) {
                by_holder.entry(*holder).or_default().push(target);
            }
        }
    }
    let client = ctx.control.order_client();
    let mut broken = Vec::new();
    for (holder, held) in by_holder {
        for chunk in held.chunks(REPLICA_STATUS_SEGMENTS_MAX) {
            let seals: Vec<ScrubSeal> = chunk
                .iter()
                .map(|t| ScrubSeal {
                    segment: t.segment.0,
                    length: t.seal.length,
                    bytes: t.seal.bytes,
                })
                .collect();
            let verdicts = match client.scrub(holder, &seals).await {
                Ok(verdicts) => verdicts,
                Err(e) => {
                    debug!(holder, error = %e, "no scrub verdicts from a holder this poll");
                    break;
                }
            };
            for (target, verdict) in chunk.iter().zip(verdicts) {
                // A segment's only copy has nothing to be rebuilt from: its
                // loss is reported as data loss (ADR 0108), not healed.
                if target.replicas.len() > 1
                    && matches!(verdict.verdict.as_str(), "damaged" | "missing" | "short")
                {
                    info!(
                        topic = %target.topic,
                        segment = target.segment.0,
                        holder,
                        verdict = %verdict.verdict,
                        detail = %verdict.detail,
                        "a sealed copy scrubbed broken; rebuilding it"
                    );
                    broken.push(HealCandidate {
                        topic: target.topic.clone(),
                        segment: target.segment,
                        kind: HealKind::Rebuild { holder },
                        gone: std::collections::BTreeSet::new(),
                    });
                }
            }
        }
    }
    broken
}

/// Copies `source`'s sealed copy to `node`, from wherever `node`'s copy
/// ends, paced by `pacer`. Returns the bytes sent.
#[allow(clippy::too_many_arguments)]
async fn copy_sealed(
    client: &OrderClient,
    pacer: &Pacer,
    topic: &str,
    segment: SegmentId,
    order: OrderEpoch,
    writer_epoch: u64,
    source: u64,
    node: u64,
    seal: SealRecord,
) -> Result<u64, HealError> {
    // Where the new copy ends: an empty request is answered with its end.
    let probe = ReplicaAppendRequest {
        topic: topic.to_string(),
        segment: segment.0,
        epoch: writer_epoch,
        first_offset: 0,
        committed_end: 0,
        repair: Some(RepairOrder {
            to: seal.length,
            order,
        }),
        frames: bytes::Bytes::new(),
    };
    let answer = client.repair(node, &probe).await?;
    let mut at = match answer.refused {
        None => answer.durable_end,
        Some(malachi_wire::replication::ReplicaRefusal::NotAtEnd) => answer.durable_end,
        Some(refusal) => {
            return Err(HealError::HolderRefused {
                node,
                refusal,
                message: answer.message,
            });
        }
    };
    let mut sent = 0u64;
    while at < seal.length {
        let run = client
            .catch_up(
                source,
                &CatchUpRequest {
                    topic: topic.to_string(),
                    segment: segment.0,
                    order,
                    from: at,
                    bytes_max: CATCH_UP_BYTES_MAX,
                },
            )
            .await?;
        if let Some(refusal) = run.refused {
            return Err(HealError::CatchUpRefused {
                from_node: source,
                refusal,
                message: run.message,
            });
        }
        if run.frames.is_empty() || run.first_offset != at {
            return Err(HealError::CatchUpEmpty {
                from_node: source,
                at,
            });
        }
        let len = run.frames.len() as u64;
        let answer = client
            .repair(
                node,
                &ReplicaAppendRequest {
                    first_offset: at,
                    frames: run.frames,
                    ..probe.clone()
                },
            )
            .await?;
        if let Some(refusal) = answer.refused {
            return Err(HealError::HolderRefused {
                node,
                refusal,
                message: answer.message,
            });
        }
        if answer.durable_end <= at {
            return Err(HealError::HolderStalled { node, at });
        }
        at = answer.durable_end;
        sent += len;
        // Pace: this run's bytes at the broker's heal rate, shared by
        // every heal it runs.
        let until = pacer.reserve(len, Instant::now());
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
    }
    Ok(sent)
}

/// The new copy is whole: sealed at the recorded length, with the
/// recorded bytes.
async fn verify(
    client: &OrderClient,
    node: u64,
    segment: SegmentId,
    seal: SealRecord,
) -> Result<(), HealError> {
    let status = client.status(node, segment).await?;
    if status.sealed
        && status.durable_end == Some(seal.length)
        && status.durable_bytes == Some(seal.bytes)
    {
        Ok(())
    } else {
        Err(HealError::NotWhole {
            node,
            sealed: status.sealed,
            durable_end: status.durable_end,
            durable_bytes: status.durable_bytes,
            length: seal.length,
            bytes: seal.bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn heal_errors_say_what_the_strings_they_replaced_said() {
        let not_whole = HealError::NotWhole {
            node: 4,
            sealed: false,
            durable_end: Some(3),
            durable_bytes: None,
            length: 5,
            bytes: 50,
        };
        assert_eq!(
            not_whole.to_string(),
            "the new copy on 4 is not whole yet: sealed false, Some(3) records, None bytes; the seal is 5 records, 50 bytes"
        );
        assert_eq!(
            HealError::CatchUpEmpty {
                from_node: 2,
                at: 9
            }
            .to_string(),
            "catch-up from 2 brought nothing at 9"
        );
        assert_eq!(
            HealError::HolderDead { holder: 3 }.to_string(),
            "broker 3 holding the broken copy is not alive"
        );
    }

    #[test]
    fn the_pacer_spreads_every_heals_bytes_over_the_shared_rate() {
        let pacer = Pacer::new(1_000);
        let now = Instant::now();
        // Two heals reserve at once: the second waits for the first.
        assert_eq!(pacer.reserve(500, now), now + Duration::from_millis(500));
        assert_eq!(pacer.reserve(500, now), now + Duration::from_millis(1_000));
        // Idle since: a reservation starts now, not in the past.
        let later = now + Duration::from_secs(5);
        assert_eq!(pacer.reserve(1_000, later), later + Duration::from_secs(1));
    }

    #[test]
    fn a_new_holder_is_live_holds_no_copy_and_is_not_gone() {
        let gone = BTreeSet::from([2]);
        assert_eq!(new_holder(&[1, 2, 3, 4], &[1, 2, 3], &gone, 7), Some(4));
        assert_eq!(new_holder(&[1, 3], &[1, 2, 3], &gone, 7), None);
        // Spread by segment over the free brokers.
        let free = [1, 2, 3, 4, 5, 6];
        let picks: BTreeSet<u64> = (0..10)
            .filter_map(|s| new_holder(&free, &[1, 2, 3], &BTreeSet::new(), s))
            .collect();
        assert_eq!(picks, BTreeSet::from([4, 5, 6]));
    }
}
