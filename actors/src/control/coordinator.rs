//! `coordinator/<vnode>`: the business logic of one vnode's metadata.
//!
//! The coordinator manager (`manager.rs`) runs one coordinator for each
//! vnode this broker leads, and hands it every request for a topic of that
//! vnode, so the vnode's changes made here are serialized in one place:
//! creating and deleting topics, choosing where a topic's segments live,
//! rolling segments (seal at the durable length the segment actor reports,
//! open the next), split and merge. Its proposals go through the metadata
//! plane, which lands them on the vnode's raft group.
//!
//! Placement, until the data plane replicates (a later issue): a topic's
//! segments live on one broker, the broker that coordinated the request, if
//! it is a voter of the topic's vnode (so it holds the metadata the data path
//! reads locally), else the vnode's first voter. A roll keeps a range on the
//! broker that hosts it. Whichever broker a segment is placed on starts its
//! actor once its replica applies the change (`reconcile`, run by the
//! manager on every applied change). Time comes from the broker's [`Clock`].
//!
//! Continuous work (what a coordinator does on its own timer, not for a
//! request) runs only while the coordinator holds its vnode's lease
//! (`vnode_lease.rs`, ADR 0082): a deposed leader that still believes it
//! leads stops it before the lease can pass to its successor. Today that
//! work is an audit (`stranded_segments`: active segments on brokers that
//! are down). Requests need no lease: each is one replicated command,
//! ordered by raft. Failover is not gated on the lease either (ADR 0106):
//! each upkeep tick, while this broker leads the vnode's group, hands the
//! segments whose primary failed to `maintenance/failover` under the
//! group's raft term, which fences its orders on the copies.
//!
//! The lease is held only while the vnode holds topics (ADR 0101): a vnode
//! with none has no continuous work and opens no segment, and renewing a
//! lease is a raft write every `lease_renew_ms`, the largest idle cost of a
//! quiet cluster. A coordinator takes the lease when it starts (so the
//! group's epoch is at least 1 before any segment opens) and its upkeep
//! gives it up while the vnode holds no topic; a creation on a coordinator
//! that gave it up takes it again first (waiting at most
//! `LEASE_FIRST_WAIT_MS`), and a released lease keeps its epoch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use malachi_cluster::model::{
    Command, MetadataState, ModelError, NodeId, Outcome, Range, RangeId, SealRecord, SegmentId,
    SegmentState,
};
use malachi_cluster::placement::{Candidate, choose_replicas};
use malachi_cluster::ring::VnodeId;
use malachi_storage::SegmentStore;
use malachi_supervision::{ChildSpec, Restart, SupervisionError};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

pub(crate) use super::requests::{CoordError, CoordinatorMsg};
use crate::control::lease::CoordinatorLease;
use crate::control::metadata::read_owner;
use crate::control::shared::Shared;
use crate::data::lineage::{ANCESTRY_DEPTH_MAX, ANCESTRY_SEGMENTS_MAX, Ancestor, Ancestry, Sealed};
use crate::data::segment::{AppendError, RollError, Roller, SegmentActor, SegmentArgs, SegmentMsg};

pub(crate) struct CoordinatorActor;

pub(crate) struct CoordinatorState {
    shared: Arc<Shared>,
    vnode: VnodeId,
}

/// How long starting a segment waits for this broker's replica to apply the
/// command that created the segment (proposed through another broker).
const LOCAL_APPLY_WAIT_MS: u64 = 2_000;
/// How long a creation on a lease-less coordinator waits for the lease
/// before it goes ahead without it (a predecessor's unexpired lease holds
/// it back; requests never needed the lease, segments then carry the
/// group's current epoch).
const LEASE_FIRST_WAIT_MS: u64 = 2_000;
/// How often that wait looks at the lease.
const LEASE_FIRST_POLL_MS: u64 = 5;
/// How many times a split or merge freezes and proposes again when the
/// segment it froze was rolled (a failover) before its proposal applied.
const RESHAPE_ATTEMPTS_MAX: u32 = 3;

/// A coordinator's lease, held only while it has work that needs it.
enum LeaseSlot {
    /// A plane without vnode groups (the file plane: one broker, nobody to
    /// overlap with): continuous work always runs.
    Unneeded,
    /// The vnode holds no topic: no lease is held or renewed.
    Idle,
    Held(CoordinatorLease),
}

/// The segment actor's name in the storage supervisor: stable and readable.
pub(crate) fn segment_name(topic: &str, range: RangeId, segment: SegmentId) -> String {
    format!("segment/{topic}/{}/{}", range.0, segment.0)
}

/// Starts the actor of an active segment under `storage` (a no-op if it runs).
pub(crate) async fn start_segment(
    shared: &Arc<Shared>,
    topic: &str,
    segment: SegmentId,
) -> Result<(), CoordError> {
    start_segment_within(shared, topic, segment, LOCAL_APPLY_WAIT_MS).await
}

/// `start_segment`, waiting at most `apply_wait_ms` for the local replica to
/// know the segment.
async fn start_segment_within(
    shared: &Arc<Shared>,
    topic: &str,
    segment: SegmentId,
    apply_wait_ms: u64,
) -> Result<(), CoordError> {
    let plane = shared.plane()?;
    let lookup = || {
        read_owner(plane.as_ref(), topic, |state: &MetadataState| {
            state.segment(segment).map(|s| {
                (
                    s.range,
                    s.start_offset,
                    s.created_at_ms,
                    ancestry(state, s.range, segment),
                    s.replicas.clone(),
                    s.epoch,
                )
            })
        })
    };
    // A command proposed through another broker's leader is applied here a
    // moment later: wait (bounded) for this replica to catch up.
    let mut applied = plane.subscribe();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(apply_wait_ms);
    let mut found = lookup();
    while found.is_none()
        && tokio::time::timeout_at(deadline, applied.changed())
            .await
            .is_ok_and(|changed| changed.is_ok())
    {
        found = lookup();
    }
    let Some((range, start_offset, created_at_ms, ancestry, replicas, epoch)) = found else {
        return Err(CoordError::UnknownSegment { segment });
    };
    // The writer runs on the segment's primary only (its reconciliation
    // starts it there): a successor or a new topic placed on another
    // broker (this one full or leaving) gets none here.
    if replicas.first().map(|n| n.0) != Some(shared.config.node_id) {
        debug!(%topic, segment = segment.0, primary = ?replicas.first(), "the segment is led elsewhere; no writer here");
        return Ok(());
    }
    let Some(storage) = shared.data.supervisor.read().clone() else {
        return Err(CoordError::Supervision(SupervisionError::NotRunning));
    };
    let args = SegmentArgs {
        storage: Arc::clone(&shared.data),
        roller: Arc::new(CoordinatorRoller {
            shared: Arc::clone(shared),
        }),
        topic: topic.to_string(),
        range,
        segment,
        start_offset,
        created_at_ms,
        ancestry,
        replicas,
        epoch,
        holders: Arc::new(super::replica_order::OrderClient {
            shared: Arc::clone(shared),
        }),
    };
    let spec = ChildSpec::worker(
        segment_name(topic, range, segment),
        || SegmentActor,
        move || args.clone(),
    )
    // Transient: a segment actor stopped after its roll stays stopped; one
    // that crashed is restarted and reopens its copy.
    .restart(Restart::Transient);
    match storage.start_child(spec).await {
        Ok(_) | Err(SupervisionError::DuplicateChild { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The segments whose producer state `segment` of `range` starts from: the
/// range's previous segment, or for a range's first segment the last
/// segments of the ranges it succeeded (a split's parent, a merge's two).
fn predecessors(
    state: &MetadataState,
    range: RangeId,
    segment: SegmentId,
) -> Vec<(SegmentId, RangeId)> {
    let Some(found) = state.range(range) else {
        return Vec::new();
    };
    match found.segments.iter().position(|s| *s == segment) {
        Some(i) if i > 0 => vec![(found.segments[i - 1], range)],
        _ => found
            .parents
            .iter()
            .filter_map(|parent| {
                state
                    .range(*parent)
                    .and_then(|p| p.last_segment())
                    .map(|s| (s, *parent))
            })
            .collect(),
    }
}

/// The producer-state ancestry of `segment` of `range` (ADR 0119): its
/// predecessors, theirs, and so on, each with its range, seal and own
/// predecessors, up to `ANCESTRY_DEPTH_MAX` generations and
/// `ANCESTRY_SEGMENTS_MAX` segments, so a broker that never held a
/// sidecar of them (it followed them, and a failover made it the primary)
/// rebuilds the table their primaries held.
pub(crate) fn ancestry(state: &MetadataState, range: RangeId, segment: SegmentId) -> Ancestry {
    let direct = predecessors(state, range, segment);
    let mut ancestry = Ancestry {
        direct: direct.iter().map(|(s, _)| *s).collect(),
        segments: BTreeMap::new(),
    };
    let mut generation = direct;
    for _ in 0..ANCESTRY_DEPTH_MAX {
        let mut next = Vec::new();
        for (ancestor, ancestor_range) in generation {
            if ancestry.segments.len() >= ANCESTRY_SEGMENTS_MAX {
                return ancestry;
            }
            if ancestry.segments.contains_key(&ancestor) {
                continue;
            }
            let Some(found) = state.segment(ancestor) else {
                continue;
            };
            let sealed = match found.state {
                SegmentState::Sealed { seal, at_ms } => Some(Sealed {
                    at_ms,
                    length: seal.length,
                }),
                SegmentState::Active => None,
            };
            let before = predecessors(state, ancestor_range, ancestor);
            ancestry.segments.insert(
                ancestor,
                Ancestor {
                    range: ancestor_range,
                    sealed,
                    predecessors: before.iter().map(|(s, _)| *s).collect(),
                    holders: found.replicas.clone(),
                },
            );
            next.extend(before);
        }
        if next.is_empty() {
            break;
        }
        generation = next;
    }
    ancestry
}

/// The [`Roller`] the control plane gives each segment actor: a roll goes
/// to the coordinator manager, which hands it to the coordinator of the
/// topic's vnode, within `produce_timeout_ms`.
#[derive(Debug)]
pub(crate) struct CoordinatorRoller {
    shared: Arc<Shared>,
}

#[async_trait::async_trait]
impl Roller for CoordinatorRoller {
    async fn roll(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<SegmentId, RollError> {
        let Some(coordinator) = self.shared.coordinator.read().clone() else {
            return Err(RollError::Transient(
                "the coordinator manager is not running".into(),
            ));
        };
        let answer = ractor::call_t!(
            coordinator,
            |reply| CoordinatorMsg::Roll {
                topic: topic.to_string(),
                segment,
                seal,
                reply
            },
            self.shared.config.produce_timeout_ms
        );
        match answer {
            Ok(Ok(next)) => Ok(next),
            Ok(Err(e)) => Err(roll_refusal(&e)),
            Err(e) => Err(RollError::Transient(format!("roll request failed: {e}"))),
        }
    }

    fn settle(&self, topic: &str, _range: RangeId, segment: SegmentId) {
        let first = self
            .shared
            .refused
            .lock()
            .insert(segment, topic.to_string())
            .is_none();
        // Reconcile settles it; it runs on every applied change and on the
        // slow timer anyway, so only the first report asks for a pass now.
        if first && let Some(manager) = self.shared.coordinator.read().clone() {
            let _ = manager.send_message(CoordinatorMsg::Reconcile);
        }
    }
}

/// Whether a coordinator's refusal of a roll is for good: the one place a
/// `CoordError` becomes a [`RollError`] (chaos finding F7).
///
/// For good: the metadata has the segment sealed without this writer
/// (`RangeNotActive`: its range was split or merged away, which seals its
/// last segment; `AlreadySealed`: a failover sealed it at another length),
/// its topic sealed, or the segment or its topic gone. Anything else may
/// pass on a later attempt: a timeout, a missing quorum, a ring being
/// re-read (`is_misrouted`), a lease, and `UnknownSegment`, which the roll
/// answers when this broker's replica has not applied what the leader
/// committed yet (a failover's seal, the successor), so the writer of a
/// segment sealed elsewhere while this broker was cut off is settled by
/// `reconcile` once its replica catches up.
pub(crate) fn roll_refusal(e: &CoordError) -> RollError {
    let reason = format!("roll refused: {e}");
    match e {
        CoordError::Model(
            ModelError::RangeNotActive { .. }
            | ModelError::AlreadySealed { .. }
            | ModelError::AlreadyRolled { .. }
            | ModelError::TopicSealed { .. }
            | ModelError::NoSuchTopic { .. }
            | ModelError::NoSuchRange { .. }
            | ModelError::NoSuchSegment { .. },
        ) => RollError::Permanent(reason),
        _ => RollError::Transient(reason),
    }
}

impl CoordinatorState {
    /// The logic of `vnode`'s coordinator, for the actor or for a request the
    /// manager serves on a broker that does not lead the vnode.
    pub(crate) fn new(shared: Arc<Shared>, vnode: VnodeId) -> CoordinatorState {
        CoordinatorState { shared, vnode }
    }

    fn node(&self) -> NodeId {
        NodeId(self.shared.config.node_id)
    }

    /// Where new segments of this vnode's topics go: this broker if it holds
    /// a replica of the vnode (the data path reads it locally), else the
    /// vnode's first voter. Deterministic for a given coordinating broker.
    fn placement(&self) -> NodeId {
        let Ok(plane) = self.shared.plane() else {
            return self.node();
        };
        match plane.host() {
            Some(host) => {
                let voters = host.voters(self.vnode);
                if voters.contains(&self.shared.config.node_id) {
                    self.node()
                } else {
                    voters.first().copied().map_or(self.node(), NodeId)
                }
            }
            None => self.node(),
        }
    }

    /// Answers one request. Unexpected messages are dropped (the manager
    /// handles `Reconcile` and `Replan` itself).
    pub(crate) async fn serve(&self, msg: CoordinatorMsg) {
        match msg {
            CoordinatorMsg::CreateTopic {
                name,
                policy,
                replication_factor,
                reply,
            } => {
                let _ = reply.send(self.create_topic(name, policy, replication_factor).await);
            }
            CoordinatorMsg::DeleteTopic { name, reply } => {
                let _ = reply.send(self.delete_topic(name).await);
            }
            CoordinatorMsg::Roll {
                topic,
                segment,
                seal,
                reply,
            } => {
                let _ = reply.send(self.roll(topic, segment, seal).await);
            }
            CoordinatorMsg::Split {
                topic,
                range,
                reply,
            } => {
                let _ = reply.send(self.split(topic, range).await);
            }
            CoordinatorMsg::Merge {
                topic,
                range,
                reply,
            } => {
                let _ = reply.send(self.merge(topic, range).await);
            }
            CoordinatorMsg::Reconcile | CoordinatorMsg::Replan | CoordinatorMsg::Upkeep => {}
        }
    }

    /// The brokers of the cluster that take segment copies, live or not:
    /// the ring's active members (the configured nodes until the ring
    /// records members).
    fn active_members(&self) -> usize {
        let configured = self.shared.config.cluster_nodes().len();
        let Ok(plane) = self.shared.plane() else {
            return configured;
        };
        let Some(host) = plane.host() else {
            return configured;
        };
        host.members()
            .values()
            .filter(|state| **state == malachi_cluster::ring::MemberState::Active)
            .count()
            .max(1)
    }

    /// The live brokers segments may be placed on, with their zones.
    fn candidates(&self) -> Vec<Candidate> {
        let me = self.shared.config.node_id;
        let attribute = &self.shared.config.placement_attribute;
        // A broker whose volume is full takes no new copies (ADR 0111);
        // this one knows its own state first-hand.
        let mut full: BTreeSet<u64> = BTreeSet::new();
        let mut candidates: Vec<Candidate> = match self.shared.fabric() {
            Some(fabric) => fabric
                .membership
                .view()
                .live()
                .filter(|m| {
                    let room = crate::common::volume::has_room(&m.attributes);
                    if !room {
                        full.insert(m.node_id);
                    }
                    room || m.node_id == me
                })
                .map(|m| Candidate {
                    node: m.node_id,
                    zone: m.attributes.get(attribute).cloned(),
                })
                .collect(),
            None => Vec::new(),
        };
        if self.shared.data.space.is_full() {
            candidates.retain(|c| c.node != me);
            if candidates.is_empty() {
                // Alone and full: the copies stay here, refused at produce.
                candidates.push(Candidate {
                    node: me,
                    zone: self.shared.config.attributes.get(attribute).cloned(),
                });
            }
        } else if !candidates.iter().any(|c| c.node == me) {
            candidates.push(Candidate {
                node: me,
                zone: self.shared.config.attributes.get(attribute).cloned(),
            });
        }
        // A decommissioned broker takes no new copies (ADR 0104), this one
        // included when another can (it still leads vnodes while their
        // replicas move, and must place their segments elsewhere).
        if let Ok(plane) = self.shared.plane()
            && let Some(host) = plane.host()
        {
            let members = host.members();
            let leaving = |node: u64| {
                members.get(&node) == Some(&malachi_cluster::ring::MemberState::Decommissioned)
            };
            candidates.retain(|c| c.node == me || !leaving(c.node));
            if leaving(me) && candidates.iter().any(|c| c.node != me) {
                candidates.retain(|c| c.node != me);
            }
        }
        candidates
    }

    /// The replica set of a new segment with `factor` copies, its primary
    /// this vnode's placement; `seed` spreads the followers. A storage
    /// policy with placement constraints (`policy`) chooses the set over
    /// the brokers' attributes instead (ADR 0116), its primary then the
    /// preferred first copy.
    fn replicas(
        &self,
        policy: Option<&str>,
        primary: NodeId,
        factor: usize,
        seed: u64,
    ) -> Result<Vec<NodeId>, CoordError> {
        let candidates = self.candidates();
        let primary = primary_with_room(primary.0, &candidates, seed);
        let constraints = self.constraints(policy);
        if !constraints.is_empty() {
            return self.constrained(&candidates, &[], &[primary], factor, seed, &constraints);
        }
        let chosen = choose_replicas(primary, &candidates, factor, seed)?;
        Ok(chosen.into_iter().map(NodeId).collect())
    }

    /// A successor's replica set: as many copies as `previous` had, or as
    /// the live brokers allow (at least the primary's), primary `primary`.
    fn successor_replicas(
        &self,
        topic: &str,
        primary: NodeId,
        previous: usize,
        seed: u64,
    ) -> Result<Vec<NodeId>, CoordError> {
        let live = self.candidates().len();
        let policy = self.policy_of(topic);
        self.replicas(
            policy.as_deref(),
            primary,
            previous.clamp(1, live.max(1)),
            seed,
        )
    }

    /// The policy name `topic` points at, from this broker's replica.
    fn policy_of(&self, topic: &str) -> Option<String> {
        let plane = self.shared.plane().ok()?;
        read_owner(plane.as_ref(), topic, |s| {
            s.topic(topic).and_then(|t| t.policy.clone())
        })
    }

    fn constraints(&self, policy: Option<&str>) -> Vec<malachi_cluster::constraints::Constraint> {
        policy_constraints(&self.shared, policy)
    }

    /// A replica set chosen by placement constraints over the candidates'
    /// gossiped attributes (ADR 0116).
    fn constrained(
        &self,
        candidates: &[Candidate],
        fixed: &[u64],
        preferred: &[u64],
        factor: usize,
        seed: u64,
        constraints: &[malachi_cluster::constraints::Constraint],
    ) -> Result<Vec<NodeId>, CoordError> {
        let nodes: Vec<u64> = candidates.iter().map(|c| c.node).collect();
        let brokers = brokers_with_attributes(&self.shared, &nodes);
        let placed = malachi_cluster::constraints::place(
            fixed,
            preferred,
            &brokers,
            factor,
            seed,
            constraints,
        )?;
        if !placed.relaxed.is_empty() {
            info!(vnode = %self.vnode, relaxed = ?placed.relaxed, nodes = ?placed.nodes, "no replica set meets these soft placement constraints; placed without them");
        }
        Ok(placed.nodes.into_iter().map(NodeId).collect())
    }

    /// Waits (at most `LEASE_FIRST_WAIT_MS`) until this broker's replica of
    /// the vnode has seen a lease granted: the vnode's coordinator takes one
    /// as it starts, and a topic created before any grant would open its
    /// segments at writer epoch 0, which no older epoch precedes (ADR 0097).
    /// A broker without a replica of the vnode does not wait.
    async fn wait_for_first_lease(&self) {
        let Ok(plane) = self.shared.plane() else {
            return;
        };
        let Some(group) = plane.host().and_then(|h| h.group(self.vnode)) else {
            return;
        };
        let mut applied = group.subscribe();
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(LEASE_FIRST_WAIT_MS);
        while group.read_local(|state| state.lease().is_none()) {
            let changed = tokio::time::timeout_at(deadline, applied.changed()).await;
            if !matches!(changed, Ok(Ok(()))) {
                debug!(vnode = %self.vnode, "no lease granted yet; creating at epoch 0");
                return;
            }
        }
    }

    async fn create_topic(
        &self,
        name: String,
        policy: Option<String>,
        replication_factor: Option<u8>,
    ) -> Result<u64, CoordError> {
        let plane = self.shared.plane()?;
        let factor = match replication_factor {
            Some(factor) => usize::from(factor),
            // The default, or fewer copies when fewer brokers are
            // configured or live: a topic can still be created with a
            // broker down (each segment then commits on its own quorum).
            // An explicit factor is validated strictly below.
            None => {
                let wanted = usize::from(self.shared.config.default_replication_factor)
                    .min(self.shared.config.cluster_nodes().len().max(1));
                let live = self.candidates().len().max(1);
                if live < wanted {
                    warn!(topic = %name, wanted, live, "fewer brokers are live than the default replication factor; the topic gets fewer copies");
                }
                wanted.min(live)
            }
        };
        // More copies than the cluster has brokers is a mistake of the
        // request; more than are live now is not: a broker not seen live
        // yet (just started, or down a while) can make it possible, and
        // the placement refusal below is answered retriable (ADR 0126).
        let members = self.active_members();
        if factor > members {
            return Err(CoordError::FactorAboveCluster { factor, members });
        }
        let seed = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        let replicas = self.replicas(policy.as_deref(), self.placement(), factor, seed)?;
        self.wait_for_first_lease().await;
        let outcome = plane
            .propose(Command::CreateTopic {
                topic: name.clone(),
                initial_ranges: 1,
                policy,
                replicas: vec![replicas],
                at_ms: self.shared.clock.now_ms(),
            })
            .await??;
        let Outcome::TopicCreated {
            incarnation,
            segments,
            ..
        } = outcome
        else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        let placed = self.placement();
        for segment in segments {
            if placed == self.node() {
                match start_segment(&self.shared, &name, segment).await {
                    Ok(()) => {}
                    // Committed through the leader, not applied here yet
                    // (this broker's replica is catching up: it restarted,
                    // or reopened after a full volume). The topic exists;
                    // reconciliation starts its segment once the replica
                    // applies it, and a produce before then is redirected.
                    Err(CoordError::UnknownSegment { .. }) => {
                        info!(topic = %name, segment = segment.0, "topic created; its segment starts once this broker's replica applies the create");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        info!(topic = %name, vnode = %self.vnode, node = placed.0, incarnation = incarnation.0, "topic created");
        Ok(incarnation.0)
    }

    async fn delete_topic(&self, name: String) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        // Who holds what, read before the delete forgets it: the drop
        // orders go to them once it commits (ADR 0115).
        let holders = read_owner(plane.as_ref(), &name, |s| {
            super::removal::holders_of(s, &name)
        });
        let outcome = plane
            .propose(Command::DeleteTopic {
                topic: name.clone(),
            })
            .await??;
        let Outcome::TopicDeleted { segments, .. } = outcome else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        // The delete is committed: answer now, and release this broker's
        // actors and open copies on a task. Serving that cleanup here held
        // the vnode's coordinator (a storage tree snapshot, a terminate and
        // a drain per segment) long enough for concurrent deletes queued
        // behind it to time out. Reconcile stops orphaned actors too, so the
        // two may race; both steps tolerate the other having run first.
        let shared = Arc::clone(&self.shared);
        let topic = name.clone();
        tokio::spawn(async move {
            release_segments(&shared, &topic, segments).await;
            super::removal::send_drop_orders(&shared, &topic, holders).await;
        });
        self.shared.forget_topic(&name);
        info!(topic = %name, "topic deleted");
        Ok(())
    }

    async fn roll(
        &self,
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<SegmentId, CoordError> {
        let plane = self.shared.plane()?;
        let (range, copies) = read_owner(plane.as_ref(), &topic, |s| {
            s.segment(segment)
                .map(|found| (found.range, wanted_copies(s, &topic)))
        })
        .unzip();
        let next_replicas = self.successor_replicas(
            &topic,
            self.node(),
            copies.unwrap_or(1),
            segment.0.wrapping_add(1),
        )?;
        let next = match plane
            .propose(Command::RollSegment {
                topic: topic.clone(),
                segment,
                seal,
                next_replicas,
                at_ms: self.shared.clock.now_ms(),
            })
            .await?
        {
            Ok(Outcome::SegmentRolled { next, .. }) => next,
            // A repeated roll (the segment actor restarted mid-roll) is done
            // already, but only if it recorded this very seal: a failover
            // may have sealed the segment elsewhere, at another length, and
            // this copy must then not be sealed at its own.
            Err(ModelError::AlreadyRolled { successor, .. }) => {
                self.same_seal(&topic, segment, seal)?;
                successor
            }
            Ok(other) => return Err(CoordError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(e.into()),
        };
        start_segment(&self.shared, &topic, next).await?;
        if let (Some(range), Some(storage)) = (range, self.shared.data.supervisor.read().clone()) {
            let name = segment_name(&topic, range, segment);
            // Stopping waits for the old actor; do it off the coordinator's
            // mailbox so other metadata changes are not held up.
            tokio::spawn(async move {
                if let Err(e) = storage.terminate_child(&name).await {
                    warn!(segment = %name, error = %e, "cannot stop a rolled segment actor");
                }
            });
        }
        info!(topic = %topic, sealed = segment.0, next = next.0, length = seal.length, "segment rolled");
        Ok(next)
    }

    /// Waits (at most `LOCAL_APPLY_WAIT_MS`) until this broker's replica
    /// knows `segment`: after a split or merge lost a race with a roll
    /// another broker proposed, so its next attempt freezes the successor.
    async fn wait_known(&self, topic: &str, segment: SegmentId) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let known = || read_owner(plane.as_ref(), topic, |s| s.segment(segment).is_some());
        let mut applied = plane.subscribe();
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(LOCAL_APPLY_WAIT_MS);
        while !known() {
            match tokio::time::timeout_at(deadline, applied.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(CoordError::UnknownSegment { segment }),
            }
        }
        Ok(())
    }

    /// Fails if `segment` is recorded sealed at anything but `seal`.
    fn same_seal(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
    ) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let recorded = read_owner(plane.as_ref(), topic, |s| {
            s.segment(segment).and_then(|s| s.seal())
        });
        match recorded {
            Some(recorded) if recorded == seal => Ok(()),
            Some(recorded) => Err(CoordError::Model(ModelError::AlreadySealed {
                segment,
                recorded,
            })),
            None => Err(CoordError::UnknownSegment { segment }),
        }
    }

    /// Records a failover's seal (issue 19, ADR 0106): `segment`, whose
    /// primary is gone, sealed at `seal`, which `complete` copies hold, and
    /// its successor opened on live brokers outside `failed`, its primary
    /// one of the complete copies (this broker if it is one: the new
    /// primary rebuilds its producer table from its own copy of the sealed
    /// segment). A segment already rolled at this very seal is done; at
    /// another, it is an error. A sealed topic's segment is only sealed.
    pub(crate) async fn fail_over(
        &self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
        complete: &[u64],
        failed: &BTreeSet<u64>,
    ) -> Result<Option<SegmentId>, CoordError> {
        let plane = self.shared.plane()?;
        let copies = read_owner(plane.as_ref(), topic, |s| {
            s.segment(segment).map(|_| wanted_copies(s, topic))
        })
        .ok_or(CoordError::UnknownSegment { segment })?;
        let Some(primary) = crate::data::recovery::successor_primary(complete, self.node().0)
        else {
            return Err(CoordError::Unexpected(format!(
                "segment {segment} has no complete copy to lead its successor"
            )));
        };
        let candidates: Vec<Candidate> = self
            .candidates()
            .into_iter()
            .filter(|c| !failed.contains(&c.node))
            .collect();
        let factor = copies.clamp(1, candidates.len().max(1));
        let seed = segment.0.wrapping_add(1);
        let constraints = self.constraints(self.policy_of(topic).as_deref());
        let next_replicas: Vec<NodeId> = if constraints.is_empty() {
            choose_replicas(primary, &candidates, factor, seed)?
                .into_iter()
                .map(NodeId)
                .collect()
        } else {
            // The new primary holds a complete copy: it stays, first.
            self.constrained(&candidates, &[primary], &[], factor, seed, &constraints)?
        };
        let proposed = plane
            .propose(Command::RollSegment {
                topic: topic.to_string(),
                segment,
                seal,
                next_replicas: next_replicas.clone(),
                at_ms: self.shared.clock.now_ms(),
            })
            .await?;
        let next = match proposed {
            Ok(Outcome::SegmentRolled { next, .. }) => next,
            Err(ModelError::AlreadyRolled { successor, .. }) => {
                self.same_seal(topic, segment, seal)?;
                successor
            }
            // No successor where the topic is sealed or the range was split
            // or merged: the segment is sealed, and that is all.
            Err(ModelError::TopicSealed { .. } | ModelError::RangeNotActive { .. }) => {
                match plane
                    .propose(Command::SealSegment {
                        topic: topic.to_string(),
                        segment,
                        seal,
                        at_ms: self.shared.clock.now_ms(),
                    })
                    .await?
                {
                    Ok(_) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(other) => return Err(CoordError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(e.into()),
        };
        let (leads, range) = read_owner(plane.as_ref(), topic, |s| {
            (
                s.segment(next).and_then(|s| s.replicas.first().copied()),
                s.segment(segment).map(|s| s.range),
            )
        });
        // A writer of the sealed segment here (its primary was alive after
        // all, or a follower was gone) stops: its segment is sealed.
        if self.shared.segment(segment).is_some()
            && let (Some(range), Some(storage)) =
                (range, self.shared.data.supervisor.read().clone())
        {
            let name = segment_name(topic, range, segment);
            tokio::spawn(async move {
                if let Err(e) = storage.terminate_child(&name).await {
                    debug!(segment = %name, error = %e, "the sealed segment's writer already stopped");
                }
            });
        }
        if leads == Some(self.node()) {
            start_segment(&self.shared, topic, next).await?;
        }
        info!(%topic, sealed = segment.0, next = next.0, length = seal.length, replicas = ?next_replicas, "segment failed over");
        Ok(Some(next))
    }

    /// Fences the active segment of `range` and returns its durable seal.
    ///
    /// A freeze that fails leaves a fenced copy behind, which takes no more
    /// appends: the segment is thawed here, so its actor rolls it (a seal it
    /// finishes once a quorum holds its records) and the range goes on in a
    /// new segment, never frozen for good (`replication.md`: fence only as
    /// the first step of a seal you will finish).
    async fn freeze(&self, segment: SegmentId) -> Result<SealRecord, CoordError> {
        let freeze_err = |reason: String| CoordError::Freeze { segment, reason };
        let Some(handle) = self.shared.segment(segment) else {
            return Err(freeze_err("its actor is not running".into()));
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        handle
            .actor
            .actor()
            .send_message(SegmentMsg::Freeze { reply })
            .map_err(|e| freeze_err(e.to_string()))?;
        // Past the quorum wait inside the freeze, so a missing quorum comes
        // back as `no_quorum`, not as a timeout.
        let bound = std::time::Duration::from_millis(
            self.shared
                .config
                .produce_timeout_ms
                .max(self.shared.config.replica_ack_timeout_ms.saturating_mul(2)),
        );
        let failed = match tokio::time::timeout(bound, answer).await {
            Ok(Ok(Ok(seal))) => return Ok(seal),
            Ok(Ok(Err(AppendError::NoQuorum(reason)))) => {
                CoordError::FreezeNoQuorum { segment, reason }
            }
            Ok(Ok(Err(e))) => freeze_err(e.to_string()),
            Ok(Err(_)) => freeze_err("its actor stopped".into()),
            Err(_) => freeze_err("no answer in time".into()),
        };
        warn!(segment = segment.0, error = %failed, "a freeze failed; the segment rolls instead");
        self.thaw(segment);
        Err(failed)
    }

    /// Lets a frozen segment whose split or merge failed roll on its own.
    fn thaw(&self, segment: SegmentId) {
        if let Some(handle) = self.shared.segment(segment) {
            // An actor that stopped meanwhile has nothing left to thaw: its
            // successor starts unfrozen.
            let _ = handle.actor.actor().send_message(SegmentMsg::Thaw);
        }
    }

    /// How many copies `segment`'s successors get: as many as the topic's
    /// segments have at most (`wanted_copies`).
    fn copies(&self, topic: &str, segment: SegmentId) -> Result<usize, CoordError> {
        let plane = self.shared.plane()?;
        read_owner(plane.as_ref(), topic, |state| {
            state.segment(segment).map(|_| wanted_copies(state, topic))
        })
        .ok_or(CoordError::UnknownSegment { segment })
    }

    fn active_segment(&self, topic: &str, range: RangeId) -> Result<SegmentId, CoordError> {
        let plane = self.shared.plane()?;
        read_owner(plane.as_ref(), topic, |state| {
            active_range(state, topic, range)?
                .last_segment()
                .ok_or_else(|| CoordError::Unexpected(format!("range {range} has no segment")))
        })
    }

    /// After a split or merge: seal the old copies on disk, start the new
    /// segments' actors, stop the old ones.
    async fn replace_segments(
        &self,
        topic: &str,
        old: &[(RangeId, SegmentId, SealRecord)],
        new: &[SegmentId],
    ) -> Result<(), CoordError> {
        for &segment in new {
            start_segment(&self.shared, topic, segment).await?;
        }
        let storage = self.shared.data.supervisor.read().clone();
        for &(range, segment, seal) in old {
            let store = Arc::clone(&self.shared.store);
            let id = malachi_storage::SegmentId(segment.0);
            match tokio::task::spawn_blocking(move || store.seal(id, seal.length)).await {
                Ok(Ok(_)) => {}
                // The metadata's seal still clamps reads to `seal.length`;
                // only the copy on disk lacks its marker (recovery reads the
                // length from the metadata again).
                Ok(Err(e)) if e.is_no_space() => info!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "no room for the seal marker; metadata still clamps reads"
                ),
                Ok(Err(e)) => warn!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "cannot write the seal marker; metadata still clamps reads"
                ),
                Err(e) => warn!(
                    topic,
                    segment = segment.0,
                    length = seal.length,
                    error = %e,
                    "the seal marker task failed; metadata still clamps reads"
                ),
            }
            if let Some(storage) = storage.clone() {
                let name = segment_name(topic, range, segment);
                tokio::spawn(async move { stop_segment_actor(&storage, &name).await });
            }
        }
        Ok(())
    }

    /// Splits `range`: freezes its active segment and records the split
    /// with that segment's seal. The proposal names the frozen segment, so
    /// if a failover rolled it meanwhile the model refuses the split
    /// (`AlreadyRolled`) rather than seal the successor at the frozen
    /// segment's seal (chaos finding F6); the split is then tried again on
    /// the successor, at most `RESHAPE_ATTEMPTS_MAX` times in all.
    async fn split(&self, topic: String, range: RangeId) -> Result<(RangeId, RangeId), CoordError> {
        let mut attempt = 1;
        loop {
            match self.split_once(&topic, range).await {
                Err(CoordError::Model(ModelError::AlreadyRolled { segment, successor }))
                    if attempt < RESHAPE_ATTEMPTS_MAX =>
                {
                    info!(%topic, range = range.0, segment = segment.0, successor = successor.0, attempt, "the frozen segment was rolled under the split; splitting again");
                    self.wait_known(&topic, successor).await?;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn split_once(
        &self,
        topic: &str,
        range: RangeId,
    ) -> Result<(RangeId, RangeId), CoordError> {
        let topic = topic.to_string();
        let segment = self.active_segment(&topic, range)?;
        let copies = self.copies(&topic, segment)?;
        let lower_replicas = self.successor_replicas(&topic, self.node(), copies, segment.0 ^ 1)?;
        let upper_replicas = self.successor_replicas(&topic, self.node(), copies, segment.0 ^ 2)?;
        let seal = self.freeze(segment).await?;
        let plane = self.shared.plane()?;
        let proposed = plane
            .propose(Command::SplitRange {
                topic: topic.clone(),
                range,
                seal,
                lower_replicas,
                upper_replicas,
                at_ms: self.shared.clock.now_ms(),
                segment: Some(segment),
            })
            .await;
        let outcome = match proposed {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                self.thaw(segment);
                return Err(e.into());
            }
            Err(e) => {
                self.thaw(segment);
                return Err(e.into());
            }
        };
        let Outcome::RangeSplit {
            lower,
            upper,
            lower_segment,
            upper_segment,
            ..
        } = outcome
        else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        self.replace_segments(
            &topic,
            &[(range, segment, seal)],
            &[lower_segment, upper_segment],
        )
        .await?;
        info!(topic = %topic, range = range.0, lower = lower.0, upper = upper.0, "range split");
        Ok((lower, upper))
    }

    /// Merges `range` with its buddy, as `split` does: the proposal names
    /// both frozen segments, and a merge that lost a race with a roll is
    /// tried again, at most `RESHAPE_ATTEMPTS_MAX` times in all.
    async fn merge(
        &self,
        topic: String,
        range: RangeId,
    ) -> Result<(RangeId, RangeId, RangeId), CoordError> {
        let mut attempt = 1;
        loop {
            match self.merge_once(&topic, range).await {
                Err(CoordError::Model(ModelError::AlreadyRolled { segment, successor }))
                    if attempt < RESHAPE_ATTEMPTS_MAX =>
                {
                    info!(%topic, range = range.0, segment = segment.0, successor = successor.0, attempt, "a frozen segment was rolled under the merge; merging again");
                    self.wait_known(&topic, successor).await?;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn merge_once(
        &self,
        topic: &str,
        range: RangeId,
    ) -> Result<(RangeId, RangeId, RangeId), CoordError> {
        let topic = topic.to_string();
        let plane = self.shared.plane()?;
        let (lower, upper) = read_owner(plane.as_ref(), &topic, |state| {
            let found = active_range(state, &topic, range)?;
            let buddy = found
                .band
                .buddy()
                .and_then(|band| state.active_ranges(&topic).find(|r| r.band == band))
                .ok_or(ModelError::NoBuddy { range })?;
            Ok::<_, ModelError>(if found.band.start() < buddy.band.start() {
                (found.id, buddy.id)
            } else {
                (buddy.id, found.id)
            })
        })?;
        let lower_segment = self.active_segment(&topic, lower)?;
        let upper_segment = self.active_segment(&topic, upper)?;
        let copies = self
            .copies(&topic, lower_segment)?
            .max(self.copies(&topic, upper_segment)?);
        let replicas = self.successor_replicas(
            &topic,
            self.node(),
            copies,
            lower_segment.0 ^ upper_segment.0,
        )?;
        let lower_seal = self.freeze(lower_segment).await?;
        let upper_seal = match self.freeze(upper_segment).await {
            Ok(seal) => seal,
            Err(e) => {
                self.thaw(lower_segment);
                return Err(e);
            }
        };
        let proposed = plane
            .propose(Command::MergeRanges {
                topic: topic.clone(),
                lower,
                upper,
                lower_seal,
                upper_seal,
                replicas,
                at_ms: self.shared.clock.now_ms(),
                lower_segment: Some(lower_segment),
                upper_segment: Some(upper_segment),
            })
            .await;
        let outcome = match proposed {
            Ok(Ok(outcome)) => outcome,
            failed => {
                self.thaw(lower_segment);
                self.thaw(upper_segment);
                return Err(match failed {
                    Ok(Err(e)) => e.into(),
                    Err(e) => e.into(),
                    Ok(Ok(_)) => CoordError::Unexpected("merge".into()),
                });
            }
        };
        let Outcome::RangesMerged {
            merged, segment, ..
        } = outcome
        else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        self.replace_segments(
            &topic,
            &[
                (lower, lower_segment, lower_seal),
                (upper, upper_segment, upper_seal),
            ],
            &[segment],
        )
        .await?;
        info!(topic = %topic, lower = lower.0, upper = upper.0, merged = merged.0, "ranges merged");
        Ok((lower, upper, merged))
    }
}

/// `range` of `topic`, if it is active; else why not, in the order a client
/// fixes it: the topic, then the range, then its state.
fn active_range<'a>(
    state: &'a MetadataState,
    topic: &str,
    range: RangeId,
) -> Result<&'a Range, ModelError> {
    if state.topic(topic).is_none() {
        return Err(ModelError::NoSuchTopic {
            topic: topic.to_owned(),
        });
    }
    let found = state
        .range(range)
        .filter(|r| r.topic == topic)
        .ok_or_else(|| ModelError::NoSuchRange {
            topic: topic.to_owned(),
            range,
        })?;
    if !found.is_active() {
        return Err(ModelError::RangeNotActive { range });
    }
    Ok(found)
}

/// Stops the actors of a deleted topic's segments and closes their copies.
/// The copies stay on disk: deleting files is the orphan sweeper's job,
/// after the delete is known to be committed everywhere.
async fn release_segments(shared: &Arc<Shared>, topic: &str, segments: Vec<SegmentId>) {
    let storage = shared.data.supervisor.read().clone();
    for segment in segments {
        let actor = shared.data.segments.lock().remove(&segment);
        if actor.is_some()
            && let Some(storage) = &storage
        {
            // The name needs the range, which the deleted metadata no
            // longer has: find the child by its segment suffix instead.
            let suffix = format!("/{}", segment.0);
            if let Ok(snapshot) = storage.snapshot().await {
                for child in snapshot.children {
                    if child.name.starts_with(&format!("segment/{topic}/"))
                        && child.name.ends_with(&suffix)
                    {
                        stop_segment_actor(storage, &child.name).await;
                    }
                }
            }
        }
        close_copy(&shared.store, segment).await;
    }
}

/// Seals the follower copies whose segment the metadata records sealed, at
/// the recorded length, and stops following them. A copy shorter than its
/// seal is left open and followed: the primary's catch-up fills it up to
/// the seal and the ReplicationServer seals it then (ADR 0097); a failure
/// is logged and retried on the next reconcile.
async fn seal_followed(shared: &Arc<Shared>, to_seal: &[(SegmentId, u64)]) {
    for &(segment, length) in to_seal {
        let store = Arc::clone(&shared.store);
        let id = malachi_storage::SegmentId(segment.0);
        let sealed = tokio::task::spawn_blocking(move || {
            let info = store.info(id)?;
            if info.durable < length {
                return Ok(false);
            }
            store.seal(id, length).map(|_| true)
        })
        .await;
        match sealed {
            Ok(Ok(true)) => {
                shared.data.replication.followed.lock().remove(&segment);
                debug!(segment = segment.0, length, "follower copy sealed");
            }
            Ok(Ok(false)) => {
                debug!(
                    segment = segment.0,
                    length, "follower copy shorter than its seal"
                );
            }
            Ok(Err(e)) if e.is_no_space() => {
                // The volume filled since the pass began: the guard holds
                // it full, and a pass after it has room seals the copy.
                shared.data.space.note_no_space(shared.clock.now_ms());
                debug!(segment = segment.0, length, error = %e, "a follower copy waits for room to be sealed");
                return;
            }
            Ok(Err(e)) => {
                warn!(segment = segment.0, length, error = %e, "cannot seal a follower copy")
            }
            Err(e) => warn!(segment = segment.0, error = %e, "the follower seal task failed"),
        }
    }
}

/// Settles this broker's copy of a segment it wrote and that was sealed
/// without it (the seed's SealedOverrun): sealed at the recorded length,
/// so reads are clamped to it, then cut back to it, so the bytes past the
/// seal (never acknowledged: the seal covers every acknowledged record) are
/// gone. A copy shorter than the seal is left for healing. Returns whether
/// the copy is settled; a failure is logged and retried on a later pass.
async fn seal_deposed(shared: &Arc<Shared>, segment: SegmentId, length: u64) -> bool {
    let store = Arc::clone(&shared.store);
    let id = malachi_storage::SegmentId(segment.0);
    let settled = tokio::task::spawn_blocking(move || {
        if let Err(malachi_storage::StorageError::NotOpen { .. }) = store.info(id) {
            if !store.has_copy(id) {
                // No copy here (it was never written, or healing moved it).
                return Ok((true, 0));
            }
            store.open(id)?;
        }
        let info = store.info(id)?;
        if info.sealed.is_none() {
            if info.durable < length {
                return Ok((false, 0));
            }
            store.seal(id, length)?;
        }
        store.cut_to_seal(id).map(|cut| (true, cut))
    })
    .await;
    match settled {
        Ok(Ok((true, cut))) => {
            if cut > 0 {
                info!(
                    segment = segment.0,
                    length,
                    cut_bytes = cut,
                    "a deposed writer's copy cut to the recorded seal"
                );
            }
            true
        }
        Ok(Ok((false, _))) => false,
        Ok(Err(e)) if e.is_no_space() => {
            shared.data.space.note_no_space(shared.clock.now_ms());
            debug!(segment = segment.0, length, error = %e, "a deposed writer's copy waits for room to be settled");
            false
        }
        Ok(Err(e)) => {
            warn!(segment = segment.0, length, error = %e, "cannot settle a deposed writer's copy");
            false
        }
        Err(e) => {
            warn!(segment = segment.0, error = %e, "the settle task of a deposed writer's copy failed");
            false
        }
    }
}

/// Stops a segment actor. One already gone (it stopped, or its supervisor
/// restarted without it) is what was wanted, so a failure is only noted.
async fn stop_segment_actor(storage: &malachi_supervision::SupervisorRef, name: &str) {
    if let Err(e) = storage.terminate_child(name).await {
        debug!(segment = name, error = %e, "segment actor already stopped");
    }
}

/// Releases the store's open handle of a segment copy whose actor stopped.
/// A failure leaves a file open until shutdown, no data at risk: logged.
async fn close_copy(store: &Arc<dyn SegmentStore>, segment: SegmentId) {
    let store = Arc::clone(store);
    let id = malachi_storage::SegmentId(segment.0);
    match tokio::task::spawn_blocking(move || store.close(id)).await {
        // Closed already: a delete's release and reconcile (or a drop
        // order) race to it, and either may come first.
        Ok(Ok(_)) | Ok(Err(malachi_storage::StorageError::NotOpen { .. })) => {}
        Ok(Err(e)) => warn!(segment = segment.0, error = %e, "cannot close a segment copy"),
        Err(e) => warn!(segment = segment.0, error = %e, "the close task failed"),
    }
}

/// Starts every active segment actor the metadata assigns to this broker,
/// over every replica it holds, and stops the actors of segments no replica
/// knows any more (their topic was deleted, possibly by another broker's
/// coordinator). Level-triggered: the manager runs it on every applied
/// change, at start and after the storage supervisor restarts.
pub(crate) async fn reconcile(shared: &Arc<Shared>) -> Result<(), CoordError> {
    let plane = shared.plane()?;
    let node = NodeId(shared.config.node_id);
    let mut wanted: Vec<(String, SegmentId)> = Vec::new();
    let running: Vec<SegmentId> = shared.data.segments.lock().keys().copied().collect();
    let settled: BTreeSet<SegmentId> = shared.settled.lock().clone();
    let refused: BTreeMap<SegmentId, String> = shared.refused.lock().clone();
    let mut known: std::collections::BTreeSet<SegmentId> = std::collections::BTreeSet::new();
    let followed: Vec<SegmentId> = shared
        .data
        .replication
        .followed
        .lock()
        .iter()
        .copied()
        .collect();
    let mut to_seal: Vec<(SegmentId, u64)> = Vec::new();
    // Writers of segments sealed without them (a failover while this
    // broker was cut off): stopped, their copies sealed at the record.
    let mut deposed: Vec<(String, RangeId, SegmentId, u64)> = Vec::new();
    plane.view_each(&mut |state| {
        known.extend(running.iter().filter(|id| state.segment(**id).is_some()));
        for topic in state.topics() {
            for range in state.active_ranges(&topic.name) {
                // The last few segments: a deposed writer's segment is the
                // one before the newest, or a little older if the range
                // rolled again since.
                let recent = &range.segments[range.segments.len().saturating_sub(4)..];
                for pair in recent.windows(2) {
                    let (id, next) = (pair[0], pair[1]);
                    let Some(segment) = state.segment(id) else {
                        continue;
                    };
                    let wrote_it = segment.replicas.first() == Some(&node);
                    if !running.contains(&id) && (!wrote_it || settled.contains(&id)) {
                        continue;
                    }
                    let led_elsewhere = state
                        .segment(next)
                        .and_then(|s| s.replicas.first())
                        .is_some_and(|primary| *primary != node);
                    if let Some(seal) = segment.seal()
                        && led_elsewhere
                    {
                        deposed.push((topic.name.clone(), range.id, id, seal.length));
                    }
                }
            }
        }
        let found = refused_sealed(state, &refused, &running)
            .into_iter()
            .chain(sealed_writers(state, &running, node));
        for found in found {
            if !deposed.iter().any(|d| d.2 == found.2) {
                deposed.push(found);
            }
        }
        for topic in state.topics() {
            for range in state.active_ranges(&topic.name) {
                let Some(id) = range.last_segment() else {
                    continue;
                };
                // The writer runs on the primary only; followers' copies
                // are written by the ReplicationServer.
                if let Some(segment) = state.segment(id)
                    && segment.state == SegmentState::Active
                    && segment.replicas.first() == Some(&node)
                {
                    wanted.push((topic.name.clone(), id));
                }
            }
        }
        for &id in &followed {
            if let Some(seal) = state.segment(id).and_then(|s| s.seal()) {
                to_seal.push((id, seal.length));
            }
        }
    });
    // Sealing and settling write markers and cut logs: while the volume is
    // full they would only fail, once per copy on every pass (hundreds of
    // lines a second under metadata traffic), so they wait for room; a
    // later pass does them.
    let full = shared.data.space.is_full();
    if !full {
        seal_followed(shared, &to_seal).await;
    }
    let storage = shared.data.supervisor.read().clone();
    if !deposed.is_empty()
        && !full
        && let Some(storage) = storage
    {
        for (topic, range, segment, length) in deposed {
            if running.contains(&segment) {
                let name = segment_name(&topic, range, segment);
                info!(segment = %name, length, "stopping the writer of a segment sealed without it");
                stop_segment_actor(&storage, &name).await;
                shared.data.segments.lock().remove(&segment);
            }
            if seal_deposed(shared, segment, length).await {
                shared.settled.lock().insert(segment);
            }
        }
    }
    // A writer restarting on a copy it wrote before (this broker was down
    // or cut off) may be one a failover sealed meanwhile, which this
    // replica has not applied yet: its leader says first (ADR 0127).
    // One the leader records sealed is a deposed writer's copy: settled
    // now, from the recorded seal, without waiting for this replica to
    // apply it (the range may have rolled, split or merged since, and be
    // no longer among those scanned above).
    let (held, sealed) = sealed_at_leader(shared, &wanted).await;
    if !full {
        for (segment, length) in sealed {
            if seal_deposed(shared, segment, length).await {
                shared.settled.lock().insert(segment);
            }
        }
    }
    for (topic, segment) in wanted {
        if held.contains(&segment) {
            continue;
        }
        if shared.segment(segment).is_none() {
            // No wait for the replica: this view already held the segment,
            // so a miss now means it was deleted. Waiting would hold the
            // manager's mailbox, and every request behind it, for seconds.
            match start_segment_within(shared, &topic, segment, 0).await {
                Ok(()) => {}
                // `wanted` comes from a view taken before the awaits above:
                // a topic deleted since has nothing left to start, and the
                // next reconcile (the delete's apply triggers one) sees that.
                Err(CoordError::UnknownSegment { segment }) => {
                    debug!(%topic, %segment, "segment deleted before it could start");
                }
                Err(e) => return Err(e),
            }
        }
    }
    let orphans: Vec<SegmentId> = running
        .into_iter()
        .filter(|id| !known.contains(id))
        .collect();
    // The copy stays on disk (a drop order or the orphan sweep removes
    // it, ADR 0115); only the actor and its open handle are released.
    stop_segment_actors(shared, &orphans).await;
    // A refused writer that stopped (settled above, an orphan, or gone on
    // its own) is no longer waiting; a restarted one reports again.
    if !refused.is_empty() {
        let open: BTreeSet<SegmentId> = shared.data.segments.lock().keys().copied().collect();
        shared.refused.lock().retain(|id, _| open.contains(id));
    }
    Ok(())
}

/// The writers running here (`running`) whose roll the metadata refused for
/// good (`refused`, with their topics) and that `state` records sealed:
/// each with its range and recorded seal length, to stop and settle as a
/// deposed writer. Their range may be split or merged away, so not active
/// and not among the ranges `reconcile` scans for deposed writers (chaos
/// finding F7). A segment not sealed in this view is left for a later pass
/// (this replica is behind); one unknown to every view is an orphan.
fn refused_sealed(
    state: &MetadataState,
    refused: &BTreeMap<SegmentId, String>,
    running: &[SegmentId],
) -> Vec<(String, RangeId, SegmentId, u64)> {
    refused
        .iter()
        .filter(|(id, _)| running.contains(id))
        .filter_map(|(&id, topic)| {
            let segment = state.segment(id)?;
            let range = state.range(segment.range)?;
            let seal = segment.seal()?;
            (range.topic == *topic).then(|| (topic.clone(), range.id, id, seal.length))
        })
        .collect()
}

/// The writers running here (`running`) of segments `state` records sealed
/// and continued by a successor led by another broker (a failover sealed
/// them while this broker was down or cut off): each with its topic, range
/// and recorded seal length, to stop and settle as a deposed writer, however
/// many segments the range rolled since (issue 36: a deposed writer's copy
/// stayed past its seal for minutes when its segment was no longer among
/// the range's last few). A segment whose successor is led here is this
/// writer's own roll, which stops it itself.
fn sealed_writers(
    state: &MetadataState,
    running: &[SegmentId],
    node: NodeId,
) -> Vec<(String, RangeId, SegmentId, u64)> {
    running
        .iter()
        .filter_map(|&id| {
            let segment = state.segment(id)?;
            let seal = segment.seal()?;
            let range = state.range(segment.range)?;
            let at = range.segments.iter().position(|s| *s == id)?;
            let next = state.segment(*range.segments.get(at + 1)?)?;
            (next.replicas.first() != Some(&node))
                .then(|| (range.topic.clone(), range.id, id, seal.length))
        })
        .collect()
}

/// How long reconcile waits for a vnode's leader to say whether the
/// segments a restarting writer would take are still active.
const LEADER_CONFIRM_MS: u64 = 2_000;

/// Of the active segments reconcile would start a writer for (`wanted`),
/// those whose copy this broker wrote before (its log exists and the store
/// has not opened it since the broker started: a restart, or a return from
/// a partition) and that the topic's vnode leader does not record active,
/// or whose leader could not say within [`LEADER_CONFIRM_MS`] (a later pass
/// asks again): no writer starts for them. This broker's replica may not
/// have applied a failover's seal yet, and a writer started on it would
/// open the deposed copy and take produces past the seal (issue 36). A new
/// segment (no log yet) and a lone copy (nobody else can seal it) start
/// without asking. Also returns those the leader records sealed, with
/// their recorded seal length, to settle.
async fn sealed_at_leader(
    shared: &Arc<Shared>,
    wanted: &[(String, SegmentId)],
) -> (BTreeSet<SegmentId>, Vec<(SegmentId, u64)>) {
    let mut held = BTreeSet::new();
    let mut sealed = Vec::new();
    let Ok(plane) = shared.plane() else {
        return (held, sealed);
    };
    let mut asked: BTreeMap<&str, Vec<SegmentId>> = BTreeMap::new();
    for (topic, segment) in wanted {
        let id = malachi_storage::SegmentId(segment.0);
        let restarting = shared.segment(*segment).is_none()
            && shared.store.info(id).is_err()
            && shared.store.has_copy(id);
        let replicated = read_owner(plane.as_ref(), topic, |state| {
            state
                .segment(*segment)
                .is_some_and(|s| s.replicas.len() > 1)
        });
        if restarting && replicated {
            asked.entry(topic.as_str()).or_default().push(*segment);
        }
    }
    let timeout = std::time::Duration::from_millis(LEADER_CONFIRM_MS);
    let answers = futures::future::join_all(asked.into_iter().map(|(topic, segments)| {
        let plane = Arc::clone(&plane);
        async move {
            let described = tokio::time::timeout(timeout, plane.describe(topic)).await;
            (topic, segments, described)
        }
    }))
    .await;
    for (topic, segments, described) in answers {
        // Each segment the leader knows: whether it is active, and its
        // recorded seal length if sealed.
        let states: BTreeMap<u64, (bool, Option<u64>)> = match described {
            Ok(Ok(Some(description))) => description
                .ranges
                .iter()
                .flat_map(|r| r.segments.iter())
                .map(|s| (s.id, (s.state == "active", s.length)))
                .collect(),
            Ok(Ok(None)) => BTreeMap::new(),
            Ok(Err(e)) => {
                debug!(%topic, error = %e, "the topic's leader cannot say whether a restarting writer's segment is active; asked again at the next pass");
                BTreeMap::new()
            }
            Err(_) => {
                debug!(%topic, "the topic's leader did not say in time whether a restarting writer's segment is active; asked again at the next pass");
                BTreeMap::new()
            }
        };
        for segment in segments {
            match states.get(&segment.0) {
                Some((true, _)) => continue,
                Some((false, Some(length))) => {
                    info!(%topic, segment = segment.0, length, "the leader records this writer's segment sealed without it; no writer restarts, its copy is settled at the seal");
                    sealed.push((segment, *length));
                }
                _ => {
                    // Debug: a pass runs on every applied change, and this one
                    // repeats until the replica applies the seal.
                    debug!(%topic, segment = segment.0, "no writer restarts on this copy: the leader did not say its segment is active");
                }
            }
            held.insert(segment);
        }
    }
    (held, sealed)
}

/// Stops the writers of `segments` (of deleted segments: found by their
/// id suffix, since the name's range is no longer in the metadata) and
/// closes their copies.
pub(crate) async fn stop_segment_actors(shared: &Arc<Shared>, segments: &[SegmentId]) {
    if segments.is_empty() {
        return;
    }
    let storage = shared.data.supervisor.read().clone();
    if let Some(storage) = storage
        && let Ok(snapshot) = storage.snapshot().await
    {
        for segment in segments {
            let suffix = format!("/{}", segment.0);
            for child in &snapshot.children {
                if child.name.starts_with("segment/") && child.name.ends_with(&suffix) {
                    info!(segment = %child.name, "stopping the actor of a deleted segment");
                    stop_segment_actor(&storage, &child.name).await;
                }
            }
        }
    }
    for &segment in segments {
        shared.data.segments.lock().remove(&segment);
        close_copy(&shared.store, segment).await;
    }
}

/// The active segments of `state` placed on a broker outside `live` (dead
/// by membership, or never a member): their records are unavailable until
/// that broker returns. What the coordinator's upkeep reports today; healing
/// (moving them) needs data-plane replication.
pub(crate) fn stranded_segments(
    state: &MetadataState,
    live: &BTreeSet<u64>,
) -> Vec<(String, SegmentId, NodeId)> {
    let mut stranded = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active {
                continue;
            }
            for node in &segment.replicas {
                if !live.contains(&node.0) {
                    stranded.push((topic.name.clone(), segment.id, *node));
                }
            }
        }
    }
    stranded
}

/// Wakes `myself`'s upkeep as soon as the brokers SWIM does not call alive,
/// or the liveness prober's up set, change: a failover then starts within
/// moments of its primary looking failed, not at the next tick (up to
/// `coordinator_poll_ms` later).
fn spawn_failure_watch(
    shared: &Arc<Shared>,
    myself: ActorRef<CoordinatorMsg>,
) -> Option<tokio::task::JoinHandle<()>> {
    use malachi_cluster::membership::{MemberState, MembershipView};
    let fabric = shared.fabric()?;
    let mut view = fabric.membership.watch();
    let mut up = shared
        .plane()
        .ok()
        .and_then(|plane| plane.host().and_then(|h| h.up_watch()));
    let not_alive = |view: &MembershipView| -> BTreeSet<u64> {
        view.all()
            .filter(|m| m.state != MemberState::Alive)
            .map(|m| m.node_id)
            .collect()
    };
    Some(tokio::spawn(async move {
        let mut last = (
            not_alive(&view.borrow_and_update()),
            up.as_mut().map(|u| u.borrow_and_update().clone()),
        );
        loop {
            let up_changed = async {
                match up.as_mut() {
                    Some(up) => up.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = view.changed() => if changed.is_err() { return },
                alive = up_changed => if !alive { up = None; },
            }
            let now = (
                not_alive(&view.borrow_and_update()),
                up.as_mut().map(|u| u.borrow_and_update().clone()),
            );
            if now != last {
                last = now;
                if myself.send_message(CoordinatorMsg::Upkeep).is_err() {
                    return;
                }
            }
        }
    }))
}

/// The placement constraints of the policy `policy` names, as this broker
/// last read the cluster's policies (ADR 0116); none for no policy or an
/// unresolved name (such a topic places as one without a policy).
pub(crate) fn policy_constraints(
    shared: &Shared,
    policy: Option<&str>,
) -> Vec<malachi_cluster::constraints::Constraint> {
    let Some(name) = policy else {
        return Vec::new();
    };
    let texts = shared
        .policy_cache
        .read()
        .get(name)
        .map(|p| p.placement.clone())
        .unwrap_or_default();
    match malachi_cluster::constraints::parse_all(&texts) {
        Ok(constraints) => constraints,
        Err(e) => {
            // `put_policy` refuses what does not parse: a policy from an
            // older broker, say. Placed as without constraints.
            warn!(policy = name, error = %e, "a policy's placement constraint does not parse; ignored");
            Vec::new()
        }
    }
}

/// `nodes` with their gossiped attributes (this broker's own from its
/// configuration), for constrained placement.
pub(crate) fn brokers_with_attributes(
    shared: &Shared,
    nodes: &[u64],
) -> Vec<malachi_cluster::constraints::Broker> {
    let gossiped: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, String>> =
        match shared.fabric() {
            Some(fabric) => fabric
                .membership
                .view()
                .live()
                .map(|m| (m.node_id, m.attributes.clone()))
                .collect(),
            None => std::collections::BTreeMap::new(),
        };
    let me = shared.config.node_id;
    nodes
        .iter()
        .map(|&node| malachi_cluster::constraints::Broker {
            node,
            attributes: if node == me {
                shared.config.attributes.clone()
            } else {
                gossiped.get(&node).cloned().unwrap_or_default()
            },
        })
        .collect()
}

/// Whether a broker counts as failed for a failover: declared dead by
/// SWIM, or suspected by SWIM *and* down by the raft port's liveness
/// prober (two signals, about a second after it stops answering, where
/// SWIM's dead takes several). A broker SWIM does not know is not failed.
pub(crate) fn primary_failed(
    swim: Option<malachi_cluster::membership::MemberState>,
    up: Option<bool>,
) -> bool {
    use malachi_cluster::membership::MemberState;
    match swim {
        Some(MemberState::Dead) => true,
        Some(MemberState::Suspect) => up == Some(false),
        // Not known to SWIM yet (the coordinators start before membership,
        // and the prober counts every peer down until it answers): never
        // failed on the prober's word alone, or every start would fail
        // over the segments its peers lead.
        Some(MemberState::Alive) | None => false,
    }
}

/// The segments to fail over: the newest segment of each active range,
/// still active, with more than one copy, whose primary `failed` says is
/// gone (an unreplicated segment has no other copy to go on from).
pub(crate) fn failover_candidates(
    state: &MetadataState,
    failed: &dyn Fn(u64) -> bool,
    gone: &dyn Fn(u64) -> bool,
    restore: &Restore,
) -> Vec<crate::control::requests::Candidate> {
    let mut out = Vec::new();
    for topic in state.topics() {
        let wanted = wanted_copies(state, &topic.name);
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active {
                continue;
            }
            let Some(primary) = segment.replicas.first() else {
                continue;
            };
            // An active segment with fewer copies than the topic's others
            // (a failover left it short of brokers), whose primary is
            // sound, rolls onto a full set once the live brokers can hold
            // one: NorthGuard's way, segments are cheap. Not before it is
            // `restore.after_ms` old, so a broker that comes and goes
            // costs a roll at most that often.
            let short = segment.replicas.len() < wanted
                && restore.placeable >= wanted
                && !failed(primary.0)
                && restore.now_ms.saturating_sub(segment.created_at_ms) >= restore.after_ms;
            if segment.replicas.len() < 2 && !short {
                continue;
            }
            // The primary failed, or a follower has been gone past
            // `replace_after_ms`: sealing and rolling onto a full replica
            // set restores full replication of the active tail.
            let follower_gone = segment.replicas.iter().skip(1).any(|n| gone(n.0));
            if !failed(primary.0) && !follower_gone && !short {
                continue;
            }
            out.push(crate::control::requests::Candidate {
                topic: topic.name.clone(),
                segment: segment.id,
                failed: segment
                    .replicas
                    .iter()
                    .map(|n| n.0)
                    .filter(|n| failed(*n) || gone(*n))
                    .collect(),
            });
        }
    }
    out
}

/// When an active segment short of copies rolls onto a full set
/// (`failover_candidates`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restore {
    /// Live brokers that may take a new copy (not failed, full or leaving).
    pub placeable: usize,
    pub now_ms: u64,
    /// The least age of a short segment that rolls.
    pub after_ms: u64,
}

/// How long a short active segment lives before it rolls onto a full set:
/// a bound on how often a broker that comes and goes makes a range roll,
/// not a wait for anything. At 10 s, a successor left on two copies by a
/// failover kept them for 10 s after the third broker was back, and
/// losing one more copy then stopped writes (chaos F4); now the factor
/// comes back within about a second of the broker's return (ADR 0125).
pub(crate) const RESTORE_AFTER_MS: u64 = 1_000;

/// The copies a segment of `topic` should have: the most any of its
/// segments has (the metadata keeps no factor of its own; a failover onto
/// fewer live brokers leaves the earlier segments, healed, at the factor).
pub(crate) fn wanted_copies(state: &MetadataState, topic: &str) -> usize {
    state
        .topic(topic)
        .map(|t| {
            t.ranges
                .iter()
                .filter_map(|id| state.range(*id))
                .flat_map(|r| r.segments.iter().filter_map(|id| state.segment(*id)))
                .map(|s| s.replicas.len())
                .max()
                .unwrap_or(1)
        })
        .unwrap_or(1)
        .max(1)
}

/// Heals asked for per upkeep tick at most; the rest wait for later ticks.
const HEAL_CANDIDATES_MAX: usize = 64;

/// The sealed segments the healer should give a new copy, at most
/// [`HEAL_CANDIDATES_MAX`]:
///
/// - first, those with a copy on a broker `gone` (down for longer than
///   `replace_after_ms`, or leaving): the copy is re-created elsewhere
///   (`HealKind::Replace`);
/// - then those with fewer copies than their topic's factor
///   (`wanted_copies`), which a failover placed on the brokers it could
///   reach: a copy is added (`HealKind::Add`, ADR 0117), but only while a
///   `placeable` broker (live, with room, not leaving) holds none, so a
///   cluster still short of brokers asks for nothing the healer cannot do.
///
/// Replacements come first: a copy on a gone broker is a copy lost, a
/// short segment's copies are all there.
pub(crate) fn heal_candidates(
    state: &MetadataState,
    gone: &BTreeSet<u64>,
    placeable: &BTreeSet<u64>,
) -> Vec<crate::control::requests::HealCandidate> {
    use crate::control::requests::{HealCandidate, HealKind};
    let mut out = Vec::new();
    let sealed = || {
        state.topics().flat_map(move |topic| {
            topic
                .ranges
                .iter()
                .filter_map(|id| state.range(*id))
                .flat_map(|range| range.segments.iter().filter_map(|id| state.segment(*id)))
                .filter(|segment| segment.seal().is_some())
                .map(move |segment| (topic, segment))
        })
    };
    if !gone.is_empty() {
        for (topic, segment) in sealed() {
            if let Some(lost) = segment.replicas.iter().find(|n| gone.contains(&n.0)) {
                out.push(HealCandidate {
                    topic: topic.name.clone(),
                    segment: segment.id,
                    kind: HealKind::Replace { lost: lost.0 },
                    gone: gone.clone(),
                });
                if out.len() >= HEAL_CANDIDATES_MAX {
                    return out;
                }
            }
        }
    }
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for (topic, segment) in sealed() {
        let factor = *wanted
            .entry(topic.name.as_str())
            .or_insert_with(|| wanted_copies(state, &topic.name));
        let short = segment.replicas.len() < factor;
        // A copy on a gone broker is replaced first (above); the set is
        // judged short again once that is done.
        let losing = segment.replicas.iter().any(|n| gone.contains(&n.0));
        let room = placeable
            .iter()
            .any(|n| !segment.replicas.iter().any(|r| r.0 == *n));
        if short && !losing && room {
            out.push(HealCandidate {
                topic: topic.name.clone(),
                segment: segment.id,
                kind: HealKind::Add,
                gone: gone.clone(),
            });
            if out.len() >= HEAL_CANDIDATES_MAX {
                return out;
            }
        }
    }
    out
}

/// The primary of a new segment: `wanted` if it may take copies, else the
/// candidate `seed` picks (a full broker's vnodes place their segments on
/// brokers with room, ADR 0111).
pub(crate) fn primary_with_room(
    wanted: u64,
    candidates: &[malachi_cluster::placement::Candidate],
    seed: u64,
) -> u64 {
    if candidates.is_empty() || candidates.iter().any(|c| c.node == wanted) {
        return wanted;
    }
    let mut nodes: Vec<u64> = candidates.iter().map(|c| c.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let at = usize::try_from(seed % nodes.len() as u64).unwrap_or(0);
    nodes[at]
}

/// Sealed segments one scrub poll asks about at most; the next poll goes
/// on after the last one asked.
pub(crate) const SCRUB_TARGETS_MAX: usize = 1_024;

/// How often a coordinator asks for the scrub verdicts of its sealed
/// copies: a quarter of `scrub_interval_ms`, between 1 and 30 s.
pub(crate) fn scrub_poll_ms(scrub_interval_ms: u64) -> u64 {
    (scrub_interval_ms / 4).clamp(1_000, 30_000)
}

/// Up to `max` sealed segments of `state`, in id order from just after
/// `after` (wrapping to the start), each with its recorded seal and its
/// holders, and the id to go on after next time.
pub(crate) fn scrub_targets(
    state: &MetadataState,
    after: u64,
    max: usize,
) -> (Vec<crate::control::requests::ScrubTarget>, u64) {
    let mut sealed: Vec<crate::control::requests::ScrubTarget> = Vec::new();
    for topic in state.topics() {
        for range in topic.ranges.iter().filter_map(|id| state.range(*id)) {
            for segment in range.segments.iter().filter_map(|id| state.segment(*id)) {
                if let Some(seal) = segment.seal() {
                    sealed.push(crate::control::requests::ScrubTarget {
                        topic: topic.name.clone(),
                        segment: segment.id,
                        seal,
                        replicas: segment.replicas.iter().map(|n| n.0).collect(),
                    });
                }
            }
        }
    }
    sealed.sort_by_key(|t| t.segment.0);
    let start = sealed.partition_point(|t| t.segment.0 <= after);
    let mut out: Vec<_> = sealed[start..].iter().take(max).cloned().collect();
    if out.len() < max {
        let more = max - out.len();
        out.extend(sealed[..start].iter().take(more).cloned());
    }
    let next = out.last().map_or(0, |t| t.segment.0);
    (out, next)
}

/// Active segments probed per probe at most; the next probe goes on after
/// the last one asked.
pub(crate) const PROBE_TARGETS_MAX: usize = 1_024;

/// How often a coordinator has the copies of its active replicated
/// segments probed for an orphaned fence or a copy latched failed: five
/// upkeep ticks, between 1 and 30 s. A segment is failed over only when
/// stuck at two probes in a row, so a roll in progress (a second or less)
/// is never taken for one.
pub(crate) fn fence_probe_ms(coordinator_poll_ms: u64) -> u64 {
    coordinator_poll_ms.saturating_mul(5).clamp(1_000, 30_000)
}

/// Up to `max` active replicated segments of `state` (the newest of each
/// active range), in id order from just after `after`, wrapping; those in
/// `skip` (failing over already) are left out. Also the id to go on after.
pub(crate) fn probe_targets(
    state: &MetadataState,
    skip: &BTreeSet<SegmentId>,
    after: u64,
    max: usize,
) -> (Vec<crate::control::requests::ProbeTarget>, u64) {
    let mut active: Vec<crate::control::requests::ProbeTarget> = Vec::new();
    for topic in state.topics() {
        for range in state.active_ranges(&topic.name) {
            let Some(segment) = range.last_segment().and_then(|id| state.segment(id)) else {
                continue;
            };
            if segment.state != SegmentState::Active
                || segment.replicas.len() < 2
                || skip.contains(&segment.id)
            {
                continue;
            }
            active.push(crate::control::requests::ProbeTarget {
                topic: topic.name.clone(),
                segment: segment.id,
                replicas: segment.replicas.iter().map(|n| n.0).collect(),
            });
        }
    }
    active.sort_by_key(|t| t.segment.0);
    let start = active.partition_point(|t| t.segment.0 <= after);
    let mut out: Vec<_> = active[start..].iter().take(max).cloned().collect();
    if out.len() < max {
        let more = max - out.len();
        out.extend(active[..start].iter().take(more).cloned());
    }
    let next = out.last().map_or(0, |t| t.segment.0);
    (out, next)
}

/// A running coordinator: the request logic, and the lease its continuous
/// work runs under.
pub(crate) struct CoordinatorRun {
    logic: CoordinatorState,
    lease: LeaseSlot,
    /// Whether the last upkeep tick ran, to log only the transitions.
    upkeep_running: bool,
    /// The stranded segments last reported, to warn only on a change.
    stranded: Vec<(String, SegmentId, NodeId)>,
    /// The release of a lease given up, while it may still be in flight. A
    /// new lease waits for it: this holder's renewal keeps the epoch, so a
    /// release landing after the new grant would release the new lease and
    /// leave the vnode without one until the next renewal (seen as creates
    /// of up to 2 s on a vnode whose last topic had just gone).
    releasing: Option<tokio::task::JoinHandle<()>>,
    /// Wakes the upkeep when a broker starts to look failed
    /// (`spawn_failure_watch`); aborted when the coordinator stops.
    failures: Option<tokio::task::JoinHandle<()>>,
    /// Since when each broker has looked failed: gone past
    /// `replace_after_ms`, its copies are healed elsewhere.
    down: malachi_cluster::vnodes::rebalance::DownSince,
    /// When the healer was last asked to poll the scrub verdicts, and the
    /// last segment asked about (ADR 0110).
    scrubbed_at: Option<std::time::Instant>,
    scrub_after: u64,
    /// When the failover actor was last asked to probe this vnode's active
    /// segments for an orphaned fence, and the last segment asked about.
    probed_at: Option<std::time::Instant>,
    probe_after: u64,
    /// When the last retention pass started, the pass while it runs, and
    /// the topics it found naming an unresolved policy (ADR 0115).
    retained_at: Option<std::time::Instant>,
    retention: Option<tokio::task::JoinHandle<super::retention::Unresolved>>,
    unresolved: super::retention::Unresolved,
}

impl CoordinatorRun {
    /// Starts the lease if it is not held, and waits (bounded) until it is.
    async fn take_lease(&mut self) {
        if matches!(self.lease, LeaseSlot::Idle)
            && let Some(release) = self.releasing.take()
        {
            let wait = std::time::Duration::from_millis(LEASE_FIRST_WAIT_MS);
            if tokio::time::timeout(wait, release).await.is_err() {
                debug!(vnode = %self.logic.vnode, "the last release is still in flight; taking the lease anyway");
            }
        }
        if matches!(self.lease, LeaseSlot::Idle) {
            let Ok(plane) = self.logic.shared.plane() else {
                return;
            };
            let Some(host) = plane.host() else {
                return;
            };
            let config = self
                .logic
                .shared
                .config
                .cluster
                .lease_config(self.logic.shared.config.node_id);
            match CoordinatorLease::start(Arc::clone(host), self.logic.vnode, config) {
                Ok(lease) => {
                    self.logic
                        .shared
                        .lease_probes
                        .lock()
                        .insert(self.logic.vnode, lease.probe());
                    debug!(vnode = %self.logic.vnode, "coordinator lease taken: the vnode holds topics");
                    self.lease = LeaseSlot::Held(lease);
                }
                Err(e) => {
                    warn!(vnode = %self.logic.vnode, error = %e, "cannot start the coordinator lease");
                    return;
                }
            }
        }
        let LeaseSlot::Held(lease) = &self.lease else {
            return;
        };
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(LEASE_FIRST_WAIT_MS);
        while !lease.holds() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(LEASE_FIRST_POLL_MS)).await;
        }
    }

    /// Gives the lease up (the vnode holds no topic any more).
    fn drop_lease(&mut self) {
        if let LeaseSlot::Held(lease) = std::mem::replace(&mut self.lease, LeaseSlot::Idle) {
            debug!(vnode = %self.logic.vnode, "coordinator lease given up: the vnode holds no topic");
            self.releasing = Some(tokio::spawn(lease.stop()));
        }
    }

    /// Hands the failover actor the segments whose primary failed, under
    /// this coordinator's order epoch (its group's id and the raft term it
    /// leads in). Not gated on the lease (ADR 0106): a failover's orders
    /// are fenced by that epoch on the copies, and its seal is a raft
    /// command, so a deposed leader's overlap cannot do harm, and waiting
    /// out a dead coordinator's lease would add seconds to every failover.
    fn request_failovers(&mut self, group: &malachi_cluster::group::MetadataGroup) {
        let shared = &self.logic.shared;
        let me = shared.config.node_id;
        let (leader, term) = group.leader_term();
        if leader != Some(me) {
            return;
        }
        let Some(fabric) = shared.fabric() else {
            return;
        };
        let view = fabric.membership.view();
        let up = shared
            .plane()
            .ok()
            .and_then(|plane| plane.host().and_then(|h| h.up_nodes()));
        let failed = |node: u64| {
            node != me
                && primary_failed(
                    view.get(node).map(|m| m.state),
                    up.as_ref().map(|u| u.contains(&node)),
                )
        };
        let members: Vec<u64> = view.all().map(|m| m.node_id).collect();
        let up_now: BTreeSet<u64> = members.iter().copied().filter(|n| !failed(*n)).collect();
        let gone = self.down.observe(
            me,
            members.into_iter(),
            &up_now,
            std::time::Instant::now(),
            std::time::Duration::from_millis(shared.config.cluster.replace_after_ms),
        );
        let is_gone = |node: u64| gone.contains(&node);
        // A broker whose volume is full is failed over like a failed one,
        // and its followed segments roll (ADR 0111); its sealed copies stay
        // (they are read, not written), so it is not `gone`.
        let full: BTreeSet<u64> = view
            .all()
            .filter(|m| !crate::common::volume::has_room(&m.attributes))
            .map(|m| m.node_id)
            .chain(shared.data.space.is_full().then_some(me))
            .collect();
        // A decommissioned broker's copies move too (issue 18, ADR 0112):
        // its active segments roll off it as a failed broker's do, and its
        // sealed copies are re-created elsewhere as a gone broker's are,
        // read from it while it still runs.
        let leaving: BTreeSet<u64> = shared
            .plane()
            .ok()
            .and_then(|plane| plane.host().map(|host| host.members()))
            .map(|members| {
                members
                    .into_iter()
                    .filter(|(_, s)| *s == malachi_cluster::ring::MemberState::Decommissioned)
                    .map(|(node, _)| node)
                    .collect()
            })
            .unwrap_or_default();
        let failed_or_full =
            |node: u64| failed(node) || full.contains(&node) || leaving.contains(&node);
        let gone_or_full =
            |node: u64| is_gone(node) || full.contains(&node) || leaving.contains(&node);
        let moving: BTreeSet<u64> = gone.union(&leaving).copied().collect();
        // The brokers that may take a new copy: live, with room, not
        // leaving. A short sealed segment is healed only onto one of them.
        let placeable: BTreeSet<u64> = self
            .logic
            .candidates()
            .iter()
            .map(|c| c.node)
            .filter(|n| !failed_or_full(*n) && !is_gone(*n))
            .collect();
        let restore = Restore {
            placeable: placeable.len(),
            now_ms: shared.clock.now_ms(),
            after_ms: RESTORE_AFTER_MS,
        };
        let (candidates, heals) = group.read_local(|state| {
            (
                failover_candidates(state, &failed_or_full, &gone_or_full, &restore),
                heal_candidates(state, &moving, &placeable),
            )
        });
        let order = malachi_wire::replica_order::OrderEpoch {
            group: group.group_id(),
            term,
        };
        if !candidates.is_empty()
            && let Some(failover) = shared.failover.read().clone()
        {
            let _ = failover.send_message(crate::control::requests::FailoverMsg::Ensure {
                vnode: self.logic.vnode,
                order,
                candidates: candidates.clone(),
            });
        }
        if !heals.is_empty()
            && let Some(healer) = shared.healer.read().clone()
        {
            let _ = healer.send_message(crate::control::requests::HealMsg::Ensure {
                vnode: self.logic.vnode,
                order,
                candidates: heals,
            });
        }
        let probe_every = std::time::Duration::from_millis(fence_probe_ms(
            shared.config.cluster.coordinator_poll_ms,
        ));
        if self.probed_at.is_none_or(|at| at.elapsed() >= probe_every)
            && let Some(failover) = shared.failover.read().clone()
        {
            self.probed_at = Some(std::time::Instant::now());
            let skip: BTreeSet<SegmentId> = candidates.iter().map(|c| c.segment).collect();
            let (targets, next) = group.read_local(|state| {
                probe_targets(state, &skip, self.probe_after, PROBE_TARGETS_MAX)
            });
            self.probe_after = next;
            if !targets.is_empty() {
                let _ = failover.send_message(crate::control::requests::FailoverMsg::Probe {
                    vnode: self.logic.vnode,
                    order,
                    targets,
                });
            }
        }
        let poll = std::time::Duration::from_millis(scrub_poll_ms(
            shared.config.cluster.scrub_interval_ms,
        ));
        if self.scrubbed_at.is_none_or(|at| at.elapsed() >= poll)
            && let Some(healer) = shared.healer.read().clone()
        {
            self.scrubbed_at = Some(std::time::Instant::now());
            let (targets, next) =
                group.read_local(|state| scrub_targets(state, self.scrub_after, SCRUB_TARGETS_MAX));
            self.scrub_after = next;
            if !targets.is_empty() {
                let _ = healer.send_message(crate::control::requests::HealMsg::Scrub {
                    vnode: self.logic.vnode,
                    order,
                    targets,
                });
            }
        }
    }

    /// The continuous work, run only while the lease holds; a coordinator
    /// that lost its lease (or never got it: a deposed leader, a successor
    /// waiting out its predecessor's lease) skips it. A vnode without
    /// topics has none, and holds no lease.
    async fn upkeep(&mut self) {
        let Ok(plane) = self.logic.shared.plane() else {
            return;
        };
        let group = plane.host().and_then(|h| h.group(self.logic.vnode));
        if let Some(group) = &group {
            let has_topics = group.read_local(|state| state.topics().next().is_some());
            match (&self.lease, has_topics) {
                (LeaseSlot::Idle, true) => self.take_lease().await,
                (LeaseSlot::Held(_), false) => self.drop_lease(),
                _ => {}
            }
            if !has_topics {
                return;
            }
            self.request_failovers(group);
        }
        let allowed = match &self.lease {
            LeaseSlot::Unneeded => true,
            LeaseSlot::Idle => false,
            LeaseSlot::Held(lease) => lease.holds(),
        };
        if allowed != self.upkeep_running {
            let state = match &self.lease {
                LeaseSlot::Held(lease) => Some(lease.state()),
                _ => None,
            };
            info!(vnode = %self.logic.vnode, running = allowed, lease = ?state, "coordinator upkeep");
            self.upkeep_running = allowed;
        }
        if !allowed {
            return;
        }
        self.retention().await;
        let (Some(fabric), Some(group)) = (self.logic.shared.fabric(), group) else {
            return;
        };
        let live: BTreeSet<u64> = fabric.membership.view().live().map(|m| m.node_id).collect();
        let stranded = group.read_local(|state| {
            stranded_segments(state, &live)
                .into_iter()
                .map(|(topic, segment, node)| {
                    let copies = state.segment(segment).map_or(1, |s| s.replicas.len());
                    (topic, segment, node, copies)
                })
                .collect::<Vec<_>>()
        });
        let now: Vec<(String, SegmentId, NodeId)> = stranded
            .iter()
            .map(|(t, s, n, _)| (t.clone(), *s, *n))
            .collect();
        if now != self.stranded {
            for (topic, segment, node, copies) in &stranded {
                if *copies > 1 {
                    // Expected: the failover (or, for a follower gone past
                    // replace_after_ms, the roll) moves it; a broker's stop
                    // in an ordered shutdown looks the same.
                    info!(vnode = %self.logic.vnode, topic = %topic, segment = segment.0, node = node.0, copies, "active segment has a copy on a broker that is down");
                } else {
                    // Its only copy: no failover can serve it.
                    warn!(vnode = %self.logic.vnode, topic = %topic, segment = segment.0, node = node.0, "active segment's only copy is on a broker that is down");
                }
            }
            self.stranded = now;
        }
    }
}

impl CoordinatorRun {
    /// Starts a retention pass every `maintenance.retention_sweep_ms`, on
    /// a task (its proposals and drop orders would hold the mailbox), one
    /// at a time; a finished pass's unresolved topics set the gauge.
    async fn retention(&mut self) {
        if let Some(task) = &self.retention {
            if !task.is_finished() {
                return;
            }
            if let Some(task) = self.retention.take()
                && let Ok(unresolved) = task.await
            {
                let metrics = &self.logic.shared.metrics;
                for (topic, policy) in self.unresolved.difference(&unresolved) {
                    metrics.policy_unresolved(topic, policy, false);
                }
                for (topic, policy) in &unresolved {
                    metrics.policy_unresolved(topic, policy, true);
                }
                self.unresolved = unresolved;
            }
        }
        let every = std::time::Duration::from_millis(
            self.logic.shared.config.maintenance.retention_sweep_ms,
        );
        if self.retained_at.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.retained_at = Some(std::time::Instant::now());
        let shared = Arc::clone(&self.logic.shared);
        let vnode = self.logic.vnode;
        self.retention = Some(tokio::spawn(super::retention::retention_pass(
            shared, vnode,
        )));
    }
}

#[ractor::async_trait]
impl Actor for CoordinatorActor {
    type Msg = CoordinatorMsg;
    type State = CoordinatorRun;
    type Arguments = (Arc<Shared>, VnodeId);

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        (shared, vnode): (Arc<Shared>, VnodeId),
    ) -> Result<CoordinatorRun, ActorProcessingErr> {
        // The vnodes actor started before the manager (rest_for_one order).
        let plane = shared.plane()?;
        // Taken at once, as a new coordinator's first act: a group that
        // never granted a lease would open segments at writer epoch 0, which
        // no older epoch precedes (ADR 0097). The upkeep gives it up while
        // the vnode holds no topic, and a released lease keeps its epoch.
        let lease = match plane.host() {
            Some(host) => {
                let lease = CoordinatorLease::start(
                    Arc::clone(host),
                    vnode,
                    shared.config.cluster.lease_config(shared.config.node_id),
                )?;
                shared.lease_probes.lock().insert(vnode, lease.probe());
                LeaseSlot::Held(lease)
            }
            None => LeaseSlot::Unneeded,
        };
        shared.coordinators.write().insert(vnode, myself.clone());
        // The timer ends with the actor (ractor stops sending to a dead actor).
        let every = std::time::Duration::from_millis(shared.config.cluster.coordinator_poll_ms);
        myself.send_interval(every, || CoordinatorMsg::Upkeep);
        let failures = spawn_failure_watch(&shared, myself.clone());
        info!(%vnode, "coordinator started");
        Ok(CoordinatorRun {
            logic: CoordinatorState::new(shared, vnode),
            lease,
            upkeep_running: false,
            stranded: Vec::new(),
            releasing: None,
            failures,
            down: malachi_cluster::vnodes::rebalance::DownSince::default(),
            scrubbed_at: None,
            scrub_after: 0,
            probed_at: None,
            probe_after: 0,
            retained_at: None,
            retention: None,
            unresolved: Default::default(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorRun,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::Upkeep => state.upkeep().await,
            request @ CoordinatorMsg::CreateTopic { .. } => {
                state.take_lease().await;
                state.logic.serve(request).await
            }
            request => state.logic.serve(request).await,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        state: &mut CoordinatorRun,
    ) -> Result<(), ActorProcessingErr> {
        {
            let mut coordinators = state.logic.shared.coordinators.write();
            // A restarted successor may have registered already: remove only
            // this actor's own entry.
            if coordinators
                .get(&state.logic.vnode)
                .is_some_and(|c| c.get_id() == myself.get_id())
            {
                coordinators.remove(&state.logic.vnode);
            }
        }
        if let Some(failures) = state.failures.take() {
            failures.abort();
        }
        // A retention pass runs under this coordinator's lease: it stops
        // with it (a proposal it made still commits or not, as any).
        if let Some(retention) = state.retention.take() {
            retention.abort();
        }
        // The upkeep has stopped with the actor: give the lease up so the
        // next leader's coordinator need not wait it out. Off the stop path:
        // the release is a raft round trip that must not hold up a restart.
        if let LeaseSlot::Held(lease) = std::mem::replace(&mut state.lease, LeaseSlot::Idle) {
            tokio::spawn(lease.stop());
        }
        info!(vnode = %state.logic.vnode, "coordinator stopped");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use malachi_cluster::model::{Command, NodeId};

    use super::*;
    use crate::control::requests::HealKind;

    fn create(state: &mut MetadataState, topic: &str, node: u64) {
        state
            .apply(Command::CreateTopic {
                topic: topic.into(),
                initial_ranges: 1,
                policy: None,
                replicas: vec![vec![NodeId(node)]],
                at_ms: 1,
            })
            .unwrap();
    }

    #[test]
    fn a_primary_is_failed_when_swim_says_dead_or_both_signals_say_down() {
        use malachi_cluster::membership::MemberState::{Alive, Dead, Suspect};
        assert!(primary_failed(Some(Dead), None));
        assert!(primary_failed(Some(Dead), Some(true)));
        assert!(primary_failed(Some(Suspect), Some(false)));
        // One signal alone is not a failure: timeouts are not failures.
        assert!(!primary_failed(Some(Suspect), Some(true)));
        assert!(!primary_failed(Some(Suspect), None));
        assert!(!primary_failed(Some(Alive), Some(false)));
        // Unknown to SWIM (a broker that just started): not failed.
        assert!(!primary_failed(None, Some(false)));
        assert!(!primary_failed(None, None));
    }

    fn create_replicated(state: &mut MetadataState, topic: &str, replicas: &[u64]) {
        state
            .apply(Command::CreateTopic {
                topic: topic.into(),
                initial_ranges: 1,
                policy: None,
                replicas: vec![replicas.iter().copied().map(NodeId).collect()],
                at_ms: 1,
            })
            .unwrap();
    }

    const NO_RESTORE: Restore = Restore {
        placeable: 0,
        now_ms: 0,
        after_ms: u64::MAX,
    };

    #[test]
    fn a_segment_left_short_of_copies_rolls_onto_a_full_set_once_brokers_can_hold_one() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let first = state
            .active_ranges("t")
            .next()
            .unwrap()
            .last_segment()
            .unwrap();
        // A failover left the successor on two brokers.
        state
            .apply(Command::RollSegment {
                topic: "t".into(),
                segment: first,
                seal: SealRecord {
                    length: 5,
                    bytes: 50,
                },
                next_replicas: vec![NodeId(2), NodeId(3)],
                at_ms: 1_000,
            })
            .unwrap();
        assert_eq!(wanted_copies(&state, "t"), 3);
        let nobody = |_: u64| false;
        let restore = |placeable: usize, now_ms: u64| Restore {
            placeable,
            now_ms,
            after_ms: RESTORE_AFTER_MS,
        };
        // Two brokers can hold copies: nothing to gain.
        assert!(failover_candidates(&state, &nobody, &nobody, &restore(2, 60_000)).is_empty());
        // Three can, but the segment is younger than the bound: not yet.
        assert!(failover_candidates(&state, &nobody, &nobody, &restore(3, 1_500)).is_empty());
        // A second after its start it rolls (ADR 0125; it was 10 s).
        assert_eq!(
            failover_candidates(&state, &nobody, &nobody, &restore(3, 2_000)).len(),
            1
        );
        // Three can and it is old enough: it rolls, nobody failed.
        let found = failover_candidates(&state, &nobody, &nobody, &restore(3, 60_000));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].failed.is_empty());
        // Its primary failed: the failover's own rule applies instead.
        let two = |node: u64| node == 2;
        let found = failover_candidates(&state, &two, &nobody, &restore(3, 60_000));
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // An unreplicated topic never wants more.
        create_replicated(&mut state, "one", &[1]);
        assert_eq!(wanted_copies(&state, "one"), 1);
    }

    #[test]
    fn the_ancestry_lists_each_roll_with_its_seal_back_to_the_depth_bound() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let range = state.active_ranges("t").next().unwrap().id;
        let rolls = ANCESTRY_DEPTH_MAX as u64 + 5;
        for i in 0..rolls {
            let segment = state.range(range).unwrap().last_segment().unwrap();
            state
                .apply(Command::RollSegment {
                    topic: "t".into(),
                    segment,
                    seal: SealRecord {
                        length: i,
                        bytes: 0,
                    },
                    next_replicas: vec![NodeId(1), NodeId(2), NodeId(3)],
                    at_ms: 10 + i,
                })
                .unwrap();
        }
        let segments = state.range(range).unwrap().segments.clone();
        let n = segments.len();
        let found = ancestry(&state, range, segments[n - 1]);
        assert_eq!(found.direct, vec![segments[n - 2]]);
        assert_eq!(found.segments.len(), ANCESTRY_DEPTH_MAX);
        let newest = &found.segments[&segments[n - 2]];
        assert_eq!(newest.range, range);
        assert_eq!(
            newest.sealed,
            Some(Sealed {
                at_ms: 10 + rolls - 1,
                length: rolls - 1,
            })
        );
        assert_eq!(newest.predecessors, vec![segments[n - 3]]);
        // The oldest listed names its predecessor, which is past the bound.
        let oldest = n - 1 - ANCESTRY_DEPTH_MAX;
        assert_eq!(
            found.segments[&segments[oldest]].predecessors,
            vec![segments[oldest - 1]]
        );
        assert!(!found.segments.contains_key(&segments[oldest - 1]));
        // A topic's first segment descends from nothing.
        assert_eq!(ancestry(&state, range, segments[0]), Ancestry::default());
    }

    #[test]
    fn only_the_newest_active_replicated_segment_of_a_failed_primary_fails_over() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "led-by-two", &[2, 1, 3]);
        create_replicated(&mut state, "led-by-one", &[1, 2, 3]);
        create_replicated(&mut state, "alone-on-two", &[2]);
        let failed = |node: u64| node == 2;
        let none = |_: u64| false;
        let found = failover_candidates(&state, &failed, &none, &NO_RESTORE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].topic, "led-by-two");
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // Once rolled, the sealed segment is not a candidate; its successor
        // (led by 1) is not either.
        let segment = found[0].segment;
        state
            .apply(Command::RollSegment {
                topic: "led-by-two".into(),
                segment,
                seal: SealRecord {
                    length: 0,
                    bytes: 0,
                },
                next_replicas: vec![NodeId(1), NodeId(3)],
                at_ms: 2,
            })
            .unwrap();
        assert!(failover_candidates(&state, &failed, &none, &NO_RESTORE).is_empty());
        let nobody = |_: u64| false;
        assert!(failover_candidates(&state, &nobody, &none, &NO_RESTORE).is_empty());
        // A follower gone past the bound: "led-by-one" (1, 2, 3) rolls onto
        // a full set, with 2 among the failed.
        let gone_two = |node: u64| node == 2;
        let found = failover_candidates(&state, &nobody, &gone_two, &NO_RESTORE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].topic, "led-by-one");
        assert_eq!(found[0].failed, BTreeSet::from([2]));
        // The sealed segment of "led-by-two" held a copy on 2: healed.
        let heals = heal_candidates(&state, &BTreeSet::from([2]), &BTreeSet::new());
        assert_eq!(heals.len(), 1, "{heals:?}");
        assert_eq!(
            (heals[0].segment, heals[0].kind),
            (segment, HealKind::Replace { lost: 2 })
        );
        assert!(heal_candidates(&state, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }

    /// Rolls the newest segment of `topic`'s one range onto `next` and
    /// returns the segment it sealed.
    fn roll_onto(state: &mut MetadataState, topic: &str, next: &[u64]) -> SegmentId {
        let segment = state
            .active_ranges(topic)
            .next()
            .unwrap()
            .last_segment()
            .unwrap();
        state
            .apply(Command::RollSegment {
                topic: topic.into(),
                segment,
                seal: SealRecord {
                    length: 5,
                    bytes: 50,
                },
                next_replicas: next.iter().copied().map(NodeId).collect(),
                at_ms: 1_000,
            })
            .unwrap();
        segment
    }

    /// Chaos finding F7: the writer of a segment whose range was split
    /// away had its roll refused (`RangeNotActive`) for good, and nothing
    /// settled it: reconcile looked for deposed writers in active ranges
    /// only. A refused writer is found in any range, at the recorded seal.
    #[test]
    fn a_refused_writer_of_a_split_range_is_settled_at_the_recorded_seal() {
        let mut state = MetadataState::new();
        create(&mut state, "t", 1);
        let range = state.active_ranges("t").next().unwrap().id;
        let frozen = state.range(range).unwrap().last_segment().unwrap();
        let seal = SealRecord {
            length: 7,
            bytes: 70,
        };
        state
            .apply(Command::SplitRange {
                topic: "t".into(),
                range,
                seal,
                lower_replicas: vec![NodeId(1)],
                upper_replicas: vec![NodeId(1)],
                at_ms: 2,
                segment: Some(frozen),
            })
            .unwrap();
        assert!(!state.range(range).unwrap().is_active());
        // The refusal is for good, so the writer is handed over.
        assert!(matches!(
            roll_refusal(&CoordError::Model(ModelError::RangeNotActive { range })),
            RollError::Permanent(_)
        ));
        let refused: BTreeMap<SegmentId, String> = [(frozen, "t".to_string())].into();
        assert_eq!(
            refused_sealed(&state, &refused, &[frozen]),
            vec![("t".to_string(), range, frozen, 7)]
        );
        // Not a writer running here, or another topic's segment: nothing.
        assert!(refused_sealed(&state, &refused, &[]).is_empty());
        let other: BTreeMap<SegmentId, String> = [(frozen, "u".to_string())].into();
        assert!(refused_sealed(&state, &other, &[frozen]).is_empty());
        // A segment still active in this view (the replica is behind) waits.
        let child = state.active_ranges("t").next().unwrap();
        let active = child.last_segment().unwrap();
        let waiting: BTreeMap<SegmentId, String> = [(active, "t".to_string())].into();
        assert!(refused_sealed(&state, &waiting, &[active]).is_empty());
    }

    #[test]
    fn only_refusals_the_metadata_will_repeat_are_for_good() {
        let segment = SegmentId(4);
        let permanent = [
            ModelError::AlreadySealed {
                segment,
                recorded: SealRecord {
                    length: 1,
                    bytes: 1,
                },
            },
            ModelError::NoSuchTopic { topic: "t".into() },
        ];
        for e in permanent {
            assert!(matches!(
                roll_refusal(&CoordError::Model(e)),
                RollError::Permanent(_)
            ));
        }
        // A lagging replica, a timeout, a stale ring: asked again.
        let transient = [
            CoordError::UnknownSegment { segment },
            CoordError::Unexpected("timeout".into()),
            CoordError::Model(ModelError::WrongVnode {
                topic: "t".into(),
                arc: malachi_cluster::model::RingArc::FULL,
            }),
        ];
        for e in transient {
            assert!(matches!(roll_refusal(&e), RollError::Transient(_)), "{e}");
        }
    }

    fn kinds(heals: &[crate::control::requests::HealCandidate]) -> Vec<(SegmentId, HealKind)> {
        heals.iter().map(|h| (h.segment, h.kind)).collect()
    }

    #[test]
    fn a_sealed_segment_a_failover_left_short_gets_a_copy_added_regression_f1() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        // A failover placed the successor on the two brokers it reached;
        // later the short segment rolled onto a full set (`Restore`).
        let full = roll_onto(&mut state, "t", &[2, 1]);
        let short = roll_onto(&mut state, "t", &[1, 2, 3]);
        let everyone = BTreeSet::from([1, 2, 3]);
        let heals = heal_candidates(&state, &BTreeSet::new(), &everyone);
        // The short sealed segment, not the sealed one at the factor nor
        // the active one.
        assert_eq!(kinds(&heals), vec![(short, HealKind::Add)]);
        assert_ne!(short, full);
        assert_eq!(heals[0].topic, "t");
    }

    #[test]
    fn a_short_sealed_segment_waits_for_a_broker_that_can_take_a_copy() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        roll_onto(&mut state, "t", &[2, 1]);
        roll_onto(&mut state, "t", &[1, 2, 3]);
        // Broker 3 is down, full or leaving: the holders are all there is.
        let holders = BTreeSet::from([1, 2]);
        assert!(heal_candidates(&state, &BTreeSet::new(), &holders).is_empty());
        assert!(heal_candidates(&state, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn an_active_segment_short_of_the_factor_is_not_a_heal_candidate() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let full = roll_onto(&mut state, "t", &[2, 1]);
        // The active [2, 1] is the failover's (`Restore` rolls it); the
        // sealed one holds its three copies.
        let everyone = BTreeSet::from([1, 2, 3, 4]);
        assert!(heal_candidates(&state, &BTreeSet::new(), &everyone).is_empty());
        assert_eq!(state.segment(full).unwrap().replicas.len(), 3);
    }

    #[test]
    fn a_copy_on_a_gone_broker_is_replaced_before_any_copy_is_added() {
        let mut state = MetadataState::new();
        create_replicated(&mut state, "t", &[1, 2, 3]);
        let full = roll_onto(&mut state, "t", &[2, 1]);
        let short = roll_onto(&mut state, "t", &[1, 2, 3]);
        let gone = BTreeSet::from([1]);
        // Both sealed segments hold a copy on gone broker 1: each replaced,
        // the short one not added to until that is done.
        let heals = heal_candidates(&state, &gone, &BTreeSet::from([2, 3, 4]));
        assert_eq!(
            kinds(&heals),
            vec![
                (full, HealKind::Replace { lost: 1 }),
                (short, HealKind::Replace { lost: 1 })
            ]
        );
        // A gone broker holding no copy of the short one: it is added to.
        let gone = BTreeSet::from([3]);
        let heals = heal_candidates(&state, &gone, &BTreeSet::from([1, 2, 4]));
        assert_eq!(
            kinds(&heals),
            vec![
                (full, HealKind::Replace { lost: 3 }),
                (short, HealKind::Add)
            ]
        );
    }

    #[test]
    fn heal_candidates_stop_at_their_bound() {
        let mut state = MetadataState::new();
        for t in 0..HEAL_CANDIDATES_MAX + 5 {
            let topic = format!("t{t}");
            create_replicated(&mut state, &topic, &[1, 2, 3]);
            roll_onto(&mut state, &topic, &[2, 1]);
            roll_onto(&mut state, &topic, &[1, 2, 3]);
        }
        let heals = heal_candidates(&state, &BTreeSet::new(), &BTreeSet::from([1, 2, 3]));
        assert_eq!(heals.len(), HEAL_CANDIDATES_MAX);
        assert!(heals.iter().all(|h| h.kind == HealKind::Add));
    }

    #[test]
    fn segments_on_brokers_outside_the_live_set_are_stranded() {
        let mut state = MetadataState::new();
        create(&mut state, "on-one", 1);
        create(&mut state, "on-two", 2);
        let live: BTreeSet<u64> = [1, 3].into();
        let stranded = stranded_segments(&state, &live);
        assert_eq!(stranded.len(), 1);
        assert_eq!(stranded[0].0, "on-two");
        assert_eq!(stranded[0].2, NodeId(2));
        let everyone: BTreeSet<u64> = [1, 2].into();
        assert!(stranded_segments(&state, &everyone).is_empty());
    }
}
