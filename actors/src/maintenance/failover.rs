//! `maintenance/failover`: seals a segment whose primary is gone and opens
//! its successor on live brokers (issue 19, ADR 0106).
//!
//! A vnode's coordinator finds the candidates (the newest segment of an
//! active range, replicated, its primary failed by membership) and hands
//! them here with its order epoch: its vnode group's id and the raft term
//! it leads in. This actor runs one task per segment, at most
//! [`FAILOVERS_MAX`] at once. A task:
//!
//! 1. fences every copy, each drained before it answers, until N − Q + 1
//!    answered (`recovery::seal_decision`);
//! 2. seals at the largest durable end among them, which covers every
//!    acknowledged record, and fills the answering copies short of it from
//!    the copy that holds it (catch-up reads, repair writes), until
//!    N − Q + 1 copies are complete (ADR 0125);
//! 3. records the seal and the successor (`CoordinatorState::fail_over`),
//!    whose primary is a complete copy;
//! 4. seals the complete copies at the recorded length.
//!
//! Every step is idempotent, so a task that fails retries from the start,
//! and a coordinator that takes over re-runs it: its fences, under a newer
//! term, make its predecessor's orders refused by the copies it reached.
//! A task is never dropped because the primary came back: a fence is only
//! ever the first step of a seal that is finished (`replication.md`). It
//! stops when the segment is sealed, when its topic is gone, or when this
//! broker no longer leads the vnode at the order's term (the successor's
//! coordinator resumes it).
//!
//! A successor resumes it even when the primary came back, so that nothing
//! fails any more (the seed's OrphanedFence): every few seconds the
//! coordinator has this actor probe the copies of its active replicated
//! segments (replica-status: a probe never fences), and a segment with a
//! copy fenced or latched failed at two probes in a row is failed over at
//! the coordinator's own order (`recovery::stuck_copies`,
//! `recovery::confirmed_stuck`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_core::model::{SealRecord, SegmentId, SegmentState};
use malachi_core::ring::VnodeId;
use malachi_wire::replica_order::{
    CATCH_UP_BYTES_MAX, CatchUpRequest, FenceRequest, OrderEpoch, OrderRefusal, SealRequest,
};
use malachi_wire::replication::{RepairOrder, ReplicaAppendRequest};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::common::metrics::BrokerMetrics;
use crate::control::handle::ControlHandle;
use crate::control::metadata::read_owner;
use crate::control::order_error::OrderError;
use crate::control::registry::ActorRegistry;
use crate::control::replica_order::OrderClient;
use crate::control::requests::CoordError;
pub(crate) use crate::control::requests::{Candidate, FailoverMsg, ProbeTarget};
use crate::data::recovery::{
    FenceAnswer, ProbedCopy, SealDecision, complete_copies, confirmed_stuck, fence_quorum,
    seal_copies_needed, seal_decision, short_copies, stuck_copies,
};

/// Failovers this broker runs at once; more wait for the next `Ensure`.
pub(crate) const FAILOVERS_MAX: usize = 16;
/// The first pause after a failed attempt; it doubles up to the max.
const RETRY_FIRST_MS: u64 = 100;
const RETRY_MAX_MS: u64 = 2_000;
/// How long the fences of an attempt wait for the copies still silent
/// once enough answered to decide the seal: a live copy answers within
/// milliseconds, and its answer saves a repair; a paused one never does.
const FENCE_LINGER_MS: u64 = 100;
/// Repair rounds one attempt makes for one copy before it starts over
/// (a bound, not an expectation: a copy is short by at most the
/// primary's shipping window).
const REPAIR_ROUNDS_MAX: usize = 4_096;

pub(crate) struct FailoverActor;

/// What the failover worker reads: this broker's id, the metadata plane and
/// its own registry slot (`actors`), the metrics it counts into, and the
/// control plane's order client and coordinator record (`control`).
#[derive(Debug)]
pub(crate) struct FailoverCtx {
    pub node_id: u64,
    pub actors: Arc<ActorRegistry>,
    pub metrics: Arc<BrokerMetrics>,
    pub control: ControlHandle,
}

struct Task {
    order: OrderEpoch,
    handle: JoinHandle<()>,
}

pub(crate) struct FailoverState {
    ctx: Arc<FailoverCtx>,
    tasks: BTreeMap<SegmentId, Task>,
    /// The probe running, if any: one at a time, whichever vnode asked.
    probing: Option<JoinHandle<()>>,
    /// Per vnode, the segments its last probe found stuck.
    suspects: BTreeMap<VnodeId, BTreeSet<u64>>,
}

/// The failovers and the probe end with the state, after a stop, a
/// failure or a kill alike (ractor runs `post_stop` only after a stop): the
/// restarted actor's coordinators ask for them again.
impl Drop for FailoverState {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.handle.abort();
        }
        if let Some(probing) = &self.probing {
            probing.abort();
        }
    }
}

impl FailoverState {
    /// Starts a task for each candidate not running at `order` or newer.
    fn ensure(
        &mut self,
        myself: &ActorRef<FailoverMsg>,
        vnode: VnodeId,
        order: OrderEpoch,
        candidates: Vec<Candidate>,
    ) {
        // A task that panicked sent no `Ended`: it must not hold a slot.
        self.tasks.retain(|_, task| !task.handle.is_finished());
        for candidate in candidates {
            let segment = candidate.segment;
            if let Some(task) = self.tasks.get(&segment) {
                if task.order >= order && !task.handle.is_finished() {
                    continue;
                }
                task.handle.abort();
            }
            if self.tasks.len() >= FAILOVERS_MAX && !self.tasks.contains_key(&segment) {
                debug!(segment = segment.0, "failover deferred: too many running");
                continue;
            }
            info!(topic = %candidate.topic, segment = segment.0, failed = ?candidate.failed, term = order.term, "failover started");
            let ctx = Arc::clone(&self.ctx);
            let me = myself.clone();
            let handle = tokio::spawn(async move {
                run(&ctx, vnode, order, &candidate).await;
                let _ = me.send_message(FailoverMsg::Ended { segment, order });
            });
            self.tasks.insert(segment, Task { order, handle });
        }
    }
}

#[ractor::async_trait]
impl Actor for FailoverActor {
    type Msg = FailoverMsg;
    type State = FailoverState;
    type Arguments = Arc<FailoverCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<FailoverMsg>,
        ctx: Arc<FailoverCtx>,
    ) -> Result<FailoverState, ActorProcessingErr> {
        ctx.actors.failover().register(myself);
        Ok(FailoverState {
            ctx,
            tasks: BTreeMap::new(),
            probing: None,
            suspects: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<FailoverMsg>,
        msg: FailoverMsg,
        state: &mut FailoverState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            FailoverMsg::Ensure {
                vnode,
                order,
                candidates,
            } => state.ensure(&myself, vnode, order, candidates),
            FailoverMsg::Ended { segment, order } => {
                if state.tasks.get(&segment).is_some_and(|t| t.order == order) {
                    state.tasks.remove(&segment);
                }
            }
            FailoverMsg::Probe {
                vnode,
                order,
                targets,
            } => {
                if state.probing.as_ref().is_some_and(|p| !p.is_finished()) {
                    debug!(vnode = %vnode, "a probe is still running; this one is skipped");
                    return Ok(());
                }
                let ctx = Arc::clone(&state.ctx);
                let me = myself.clone();
                state.probing = Some(tokio::spawn(async move {
                    let stuck = probe(&ctx, &targets).await;
                    let _ = me.send_message(FailoverMsg::Probed {
                        vnode,
                        order,
                        stuck,
                    });
                }));
            }
            FailoverMsg::Probed {
                vnode,
                order,
                stuck,
            } => {
                let now: BTreeSet<u64> = stuck.iter().map(|c| c.segment.0).collect();
                let previous = state
                    .suspects
                    .insert(vnode, now.clone())
                    .unwrap_or_default();
                let confirmed = confirmed_stuck(&previous, &now);
                let resume: Vec<Candidate> = stuck
                    .into_iter()
                    .filter(|c| confirmed.contains(&c.segment.0))
                    .filter(|c| {
                        state
                            .tasks
                            .get(&c.segment)
                            .is_none_or(|t| t.handle.is_finished())
                    })
                    .collect();
                for candidate in &resume {
                    info!(topic = %candidate.topic, segment = candidate.segment.0, failed = ?candidate.failed, "an active segment's copy stays fenced or failed; finishing its failover");
                }
                state.ensure(&myself, vnode, order, resume);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<FailoverMsg>,
        state: &mut FailoverState,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.actors.failover().unregister(&myself);
        Ok(())
    }
}

/// Why a failover attempt did not finish; the failover tries again.
#[derive(Debug, thiserror::Error)]
enum FailoverError {
    #[error("{answered} of the {needed} fence answers a seal needs")]
    FencesShort { answered: usize, needed: usize },
    #[error("copies sealed at different lengths: {seals:?}")]
    SealsDiffer { seals: Vec<(u64, u64)> },
    #[error("{complete} complete copies of the {needed} a seal needs")]
    CopiesShort { complete: usize, needed: usize },
    #[error("cannot record the seal: {0}")]
    Record(#[source] CoordError),
}

/// Why a short copy's repair stopped; the failover tries again.
#[derive(Debug, thiserror::Error)]
enum RepairError {
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error("catch-up from {from_node} refused ({refusal:?}): {message}")]
    CatchUpRefused {
        from_node: u64,
        refusal: OrderRefusal,
        message: String,
    },
    #[error("catch-up from {from_node} brought nothing at {at} (its end is {end})")]
    CatchUpEmpty { from_node: u64, at: u64, end: u64 },
    #[error("repair of {node} refused ({refusal:?}): {message}")]
    Refused {
        node: u64,
        refusal: malachi_wire::replication::ReplicaRefusal,
        message: String,
    },
    #[error("repair of {node} made no progress at {at}")]
    Stalled { node: u64, at: u64 },
    #[error("repair of {node} not done after {rounds} rounds")]
    Unfinished { node: u64, rounds: usize },
}

/// What one attempt came to.
/// Probes the copies of `targets` (one replica-status request per holder
/// and chunk; a holder that does not answer counts as neither fenced nor
/// failed) and returns the segments with a copy fenced or failed.
async fn probe(ctx: &Arc<FailoverCtx>, targets: &[ProbeTarget]) -> Vec<Candidate> {
    use malachi_wire::replica_status::REPLICA_STATUS_SEGMENTS_MAX;
    let client = ctx.control.order_client();
    let mut by_holder: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for target in targets {
        for holder in &target.replicas {
            by_holder.entry(*holder).or_default().push(target.segment.0);
        }
    }
    let mut found: BTreeMap<u64, Vec<ProbedCopy>> = BTreeMap::new();
    for (holder, segments) in by_holder {
        for chunk in segments.chunks(REPLICA_STATUS_SEGMENTS_MAX) {
            let copies = match client.statuses(holder, chunk).await {
                Ok(copies) => copies,
                Err(e) => {
                    debug!(holder, error = %e, "no copy statuses from a holder this probe");
                    break;
                }
            };
            for copy in copies {
                found.entry(copy.segment).or_default().push(ProbedCopy {
                    node: holder,
                    fenced: copy.fenced,
                    failed: copy.failed,
                    sealed: copy.sealed,
                });
            }
        }
    }
    targets
        .iter()
        .filter_map(|target| {
            let copies = found.get(&target.segment.0)?;
            stuck_copies(copies).map(|failed| Candidate {
                topic: target.topic.clone(),
                segment: target.segment,
                failed,
            })
        })
        .collect()
}

enum Attempt {
    /// The seal is recorded (by this task or before it) and the complete
    /// copies are sealed.
    Done(SealRecord),
    /// Nothing for this broker to do: the topic is gone, or another
    /// coordinator leads the vnode now.
    NotOurs(&'static str),
}

/// Runs one failover until it is done or no longer this broker's.
async fn run(ctx: &Arc<FailoverCtx>, vnode: VnodeId, order: OrderEpoch, candidate: &Candidate) {
    let started = Instant::now();
    let mut pause = RETRY_FIRST_MS;
    let mut attempts: u64 = 0;
    loop {
        attempts += 1;
        match attempt(ctx, vnode, order, candidate).await {
            Ok(Attempt::Done(seal)) => {
                let elapsed = started.elapsed();
                ctx.metrics.failovers.increment(1);
                ctx.metrics.failover_seconds.record(elapsed.as_secs_f64());
                info!(
                    topic = %candidate.topic,
                    segment = candidate.segment.0,
                    length = seal.length,
                    attempts,
                    elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                    "failover finished"
                );
                return;
            }
            Ok(Attempt::NotOurs(why)) => {
                info!(topic = %candidate.topic, segment = candidate.segment.0, why, "failover left");
                return;
            }
            Err(reason) => {
                // Expected while copies are unreachable: at debug, then at
                // warn once it lasts.
                if attempts.is_multiple_of(10) {
                    warn!(topic = %candidate.topic, segment = candidate.segment.0, attempts, %reason, "failover not done yet");
                } else {
                    debug!(topic = %candidate.topic, segment = candidate.segment.0, attempts, %reason, "failover attempt failed");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
        pause = (pause * 2).min(RETRY_MAX_MS);
    }
}

/// The segment as this broker's metadata holds it.
struct Known {
    replicas: Vec<u64>,
    state: SegmentState,
    epoch: u64,
}

fn known(ctx: &FailoverCtx, topic: &str, segment: SegmentId) -> Option<Known> {
    let plane = ctx.actors.plane().ok()?;
    read_owner(plane.as_ref(), topic, |state| {
        state.segment(segment).map(|s| Known {
            replicas: s.replicas.iter().map(|n| n.0).collect(),
            state: s.state,
            epoch: s.epoch,
        })
    })
}

/// Whether this broker still leads `vnode` at the order's term.
fn still_leads(ctx: &FailoverCtx, vnode: VnodeId, order: OrderEpoch) -> bool {
    let Ok(plane) = ctx.actors.plane() else {
        return false;
    };
    let Some(group) = plane.host().and_then(|h| h.group(vnode)) else {
        return false;
    };
    group.leader_term() == (Some(ctx.node_id), order.term)
}

async fn attempt(
    ctx: &Arc<FailoverCtx>,
    vnode: VnodeId,
    order: OrderEpoch,
    candidate: &Candidate,
) -> Result<Attempt, FailoverError> {
    let (topic, segment) = (candidate.topic.as_str(), candidate.segment);
    let client = ctx.control.order_client();
    let Some(known) = known(ctx, topic, segment) else {
        return Ok(Attempt::NotOurs("the segment is gone"));
    };
    if let SegmentState::Sealed { seal, .. } = known.state {
        // Recorded (by this task's earlier attempt, or by anyone): make the
        // copies that hold it say so.
        seal_copies(&client, topic, segment, order, &known.replicas, seal).await;
        return Ok(Attempt::Done(seal));
    }
    if !still_leads(ctx, vnode, order) {
        return Ok(Attempt::NotOurs(
            "this broker no longer leads the vnode at the order's term",
        ));
    }
    // 1. Fence every copy at once; the answers of those that answer count.
    let request = FenceRequest {
        topic: topic.to_string(),
        segment: segment.0,
        order,
    };
    let Some(answers) = fence_copies(&client, &request, &known.replicas).await else {
        return Ok(Attempt::NotOurs("a copy took a newer coordinator's order"));
    };
    #[cfg(feature = "testing")]
    ctx.control.hold_failover().await;
    let n = known.replicas.len();
    let (length, bytes, source) = decide_seal(topic, segment, n, &answers)?;
    // 2. Fill the short copies from the source.
    let copy = (topic, segment, known.epoch);
    let complete = fill_short_copies(&client, copy, order, &answers, source, length).await;
    // N − Q + 1 complete copies, as many as the decision's answers (ADR
    // 0125): at two copies the survivor alone, which holds every
    // acknowledged record.
    let needed = seal_copies_needed(n);
    if complete.len() < needed {
        return Err(FailoverError::CopiesShort {
            complete: complete.len(),
            needed,
        });
    }
    debug_assert!(
        complete.iter().all(|node| known.replicas.contains(node)),
        "complete copies are copies of the segment"
    );
    if !still_leads(ctx, vnode, order) {
        return Ok(Attempt::NotOurs(
            "this broker no longer leads the vnode at the order's term",
        ));
    }
    // 3. Record the seal and the successor.
    let seal = SealRecord { length, bytes };
    ctx.control
        .fail_over(vnode, (topic, segment), seal, &complete, &candidate.failed)
        .await
        .map_err(FailoverError::Record)?;
    // 4. The complete copies carry the recorded seal.
    seal_copies(&client, topic, segment, order, &complete, seal).await;
    Ok(Attempt::Done(seal))
}

/// The seal the fence answers of a segment's `n` copies decide, as its
/// (length, bytes, source copy), or why there is none yet.
fn decide_seal(
    topic: &str,
    segment: SegmentId,
    n: usize,
    answers: &[FenceAnswer],
) -> Result<(u64, u64, u64), FailoverError> {
    let (length, bytes, source) = match seal_decision(n, answers) {
        SealDecision::Wait { answered, needed } => {
            return Err(FailoverError::FencesShort { answered, needed });
        }
        SealDecision::Conflict { seals } => {
            warn!(
                topic,
                segment = segment.0,
                ?seals,
                "copies carry different seals; the failover stops here"
            );
            return Err(FailoverError::SealsDiffer { seals });
        }
        SealDecision::Seal {
            length,
            bytes,
            source,
        } => (length, bytes, source),
    };
    debug_assert!(
        answers
            .iter()
            .all(|a| a.sealed.is_some() || a.durable_end <= length),
        "the seal is the largest durable end answered"
    );
    Ok((length, bytes, source))
}

/// Repairs the copies that answered short of `length` from `source`; the
/// copies complete to `length` afterwards, sorted, each once. `copy` is
/// the segment's topic, id and writer epoch.
async fn fill_short_copies(
    client: &OrderClient,
    (topic, segment, writer_epoch): (&str, SegmentId, u64),
    order: OrderEpoch,
    answers: &[FenceAnswer],
    source: u64,
    length: u64,
) -> Vec<u64> {
    let mut complete = complete_copies(answers, length);
    for node in short_copies(answers, length) {
        let from = answers
            .iter()
            .find(|a| a.node == node)
            .map_or(0, |a| a.durable_end);
        match repair(
            client,
            topic,
            segment,
            order,
            writer_epoch,
            source,
            node,
            from,
            length,
        )
        .await
        {
            Ok(()) => complete.push(node),
            // At info: a failover that cannot seal for want of this
            // repair must say why in the logs a run keeps (chaos F4).
            Err(e) => {
                info!(node, segment = segment.0, from, length, error = %e, "a short copy's repair failed; the failover tries again")
            }
        }
    }
    complete.sort_unstable();
    complete.dedup();
    complete
}

/// Fences every copy of `replicas` at once and returns the answers that
/// count, or `None` when a copy took a newer coordinator's order. Answers
/// are taken as they come: once N − Q + 1 copies answered (enough to
/// decide), the others get [`FENCE_LINGER_MS`] more, not the whole
/// `ORDER_TIMEOUT_MS`. A paused broker holds its connections open and
/// answers nothing, so waiting for every fence cost each attempt 2 s
/// where a killed one refuses at once (ADR 0125). A fence left unanswered
/// may still reach its copy later; a fence is idempotent, and the seal
/// order or the copy's reconcile after the record settles it.
async fn fence_copies(
    client: &OrderClient,
    request: &FenceRequest,
    replicas: &[u64],
) -> Option<Vec<FenceAnswer>> {
    use futures::StreamExt;
    let segment = request.segment;
    let mut pending: futures::stream::FuturesUnordered<_> = replicas
        .iter()
        .map(|&node| {
            let client = client.clone();
            let request = request.clone();
            async move { (node, client.fence(node, &request).await) }
        })
        .collect();
    let enough = fence_quorum(replicas.len());
    let mut answers: Vec<FenceAnswer> = Vec::with_capacity(replicas.len());
    let mut linger_until: Option<tokio::time::Instant> = None;
    loop {
        let next = match linger_until {
            None => pending.next().await,
            Some(until) => match tokio::time::timeout_at(until, pending.next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
        };
        let Some((node, answer)) = next else {
            break;
        };
        match answer {
            Ok(answer) => match answer.refused {
                None | Some(OrderRefusal::Failed)
                    if answer.durable_end > 0 || answer.refused.is_none() =>
                {
                    answers.push(FenceAnswer {
                        node,
                        durable_end: answer.durable_end,
                        durable_bytes: answer.durable_bytes,
                        sealed: answer.sealed.map(|s| (s.length, s.bytes)),
                        failed: answer.refused.is_some(),
                    });
                }
                Some(OrderRefusal::StaleOrder) => return None,
                Some(refusal) => {
                    debug!(node, segment, ?refusal, message = %answer.message, "fence refused");
                }
                None => {}
            },
            Err(e) => debug!(node, segment, error = %e, "fence unanswered"),
        }
        if linger_until.is_none() && answers.len() >= enough {
            linger_until =
                Some(tokio::time::Instant::now() + Duration::from_millis(FENCE_LINGER_MS));
        }
    }
    if !pending.is_empty() {
        debug!(
            segment,
            unanswered = pending.len(),
            "fences left unanswered past the linger"
        );
    }
    Some(answers)
}

/// Fills `node`'s copy from `from` up to `length` records with `source`'s
/// frames, verbatim. The copy stays fenced and unsealed: the seal order
/// after the record seals it.
#[allow(clippy::too_many_arguments)]
async fn repair(
    client: &OrderClient,
    topic: &str,
    segment: SegmentId,
    order: OrderEpoch,
    writer_epoch: u64,
    source: u64,
    node: u64,
    from: u64,
    length: u64,
) -> Result<(), RepairError> {
    let mut at = from;
    for _ in 0..REPAIR_ROUNDS_MAX {
        if at >= length {
            return Ok(());
        }
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
            return Err(RepairError::CatchUpRefused {
                from_node: source,
                refusal,
                message: run.message,
            });
        }
        if run.frames.is_empty() || run.first_offset != at {
            return Err(RepairError::CatchUpEmpty {
                from_node: source,
                at,
                end: run.durable_end,
            });
        }
        let answer = client
            .repair(
                node,
                &ReplicaAppendRequest {
                    topic: topic.to_string(),
                    segment: segment.0,
                    epoch: writer_epoch,
                    first_offset: at,
                    committed_end: 0,
                    repair: Some(RepairOrder { to: length, order }),
                    frames: Bytes::clone(&run.frames),
                },
            )
            .await?;
        if let Some(refusal) = answer.refused {
            return Err(RepairError::Refused {
                node,
                refusal,
                message: answer.message,
            });
        }
        if answer.durable_end <= at {
            return Err(RepairError::Stalled { node, at });
        }
        at = answer.durable_end;
    }
    Err(RepairError::Unfinished {
        node,
        rounds: REPAIR_ROUNDS_MAX,
    })
}

/// Tells each of `nodes` to seal its copy at the recorded seal. Best
/// effort: a copy that misses it is sealed by its broker's reconcile or
/// the next settling pass.
async fn seal_copies(
    client: &OrderClient,
    topic: &str,
    segment: SegmentId,
    order: OrderEpoch,
    nodes: &[u64],
    seal: SealRecord,
) {
    let request = SealRequest {
        topic: topic.to_string(),
        segment: segment.0,
        order,
        length: seal.length,
    };
    let seals = nodes.iter().map(|&node| {
        let client = client.clone();
        let request = request.clone();
        async move { (node, client.seal(node, &request).await) }
    });
    for (node, answer) in futures::future::join_all(seals).await {
        match answer {
            Ok(answer) if answer.refused.is_none() => {}
            Ok(answer) => {
                debug!(node, segment = segment.0, refusal = ?answer.refused, message = %answer.message, "seal order refused")
            }
            Err(e) => debug!(node, segment = segment.0, error = %e, "seal order unanswered"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_errors_say_what_the_strings_they_replaced_said() {
        assert_eq!(
            FailoverError::FencesShort {
                answered: 1,
                needed: 2
            }
            .to_string(),
            "1 of the 2 fence answers a seal needs"
        );
        assert_eq!(
            FailoverError::SealsDiffer {
                seals: vec![(3, 30), (4, 40)]
            }
            .to_string(),
            "copies sealed at different lengths: [(3, 30), (4, 40)]"
        );
        assert_eq!(
            RepairError::CatchUpEmpty {
                from_node: 2,
                at: 5,
                end: 5
            }
            .to_string(),
            "catch-up from 2 brought nothing at 5 (its end is 5)"
        );
        assert_eq!(
            RepairError::Unfinished {
                node: 3,
                rounds: REPAIR_ROUNDS_MAX
            }
            .to_string(),
            format!("repair of 3 not done after {REPAIR_ROUNDS_MAX} rounds")
        );
        let silent = OrderError::Silent {
            node: 1,
            segment: SegmentId(7),
        };
        let text = silent.to_string();
        assert_eq!(RepairError::from(silent).to_string(), text);
    }
}
