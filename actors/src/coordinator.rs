//! `coordinator/0`: the business logic of the metadata plane.
//!
//! Every metadata change goes through this one actor, so changes are
//! serialized in one place: creating and deleting topics (replica set: this
//! node), rolling segments (seal at the durable length the segment actor
//! reports, open the next), and starting the segment actors that the
//! metadata says this node must run (`Reconcile`, at start and after the
//! storage supervisor restarts). Time comes from the broker's [`Clock`].

use std::sync::Arc;

use malachi_cluster::model::{
    Command, MetadataState, ModelError, NodeId, Outcome, RangeId, SealRecord, SegmentId,
    SegmentState,
};
use malachi_storage::SegmentStore;
use malachi_supervision::{ChildSpec, Restart, SupervisionError};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::{info, warn};

use crate::metadata::{MetadataError, read};
use crate::segment::{SegmentActor, SegmentArgs};
use crate::shared::Shared;

/// Why a coordinator request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CoordError {
    #[error("{0}")]
    Model(#[from] ModelError),
    #[error("{0}")]
    Metadata(#[from] MetadataError),
    #[error("cannot start or stop a segment actor: {0}")]
    Supervision(#[from] SupervisionError),
    #[error("unexpected outcome from the metadata model: {0}")]
    Unexpected(String),
}

pub(crate) enum CoordinatorMsg {
    CreateTopic {
        name: String,
        policy: Option<String>,
        reply: RpcReplyPort<Result<u64, CoordError>>,
    },
    DeleteTopic {
        name: String,
        reply: RpcReplyPort<Result<(), CoordError>>,
    },
    /// Seal `segment` at `seal` and open the next segment of its range.
    Roll {
        topic: String,
        segment: SegmentId,
        seal: SealRecord,
        reply: RpcReplyPort<Result<SegmentId, CoordError>>,
    },
    /// Start every active segment actor the metadata assigns to this node.
    Reconcile,
}
impl ractor::Message for CoordinatorMsg {}

pub(crate) struct CoordinatorActor;

pub(crate) struct CoordinatorState {
    shared: Arc<Shared>,
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
    let plane = shared.plane()?;
    let found = read(plane.as_ref(), |state: &MetadataState| {
        state
            .segment(segment)
            .map(|s| (s.range, s.start_offset, s.created_at_ms))
    });
    let Some((range, start_offset, created_at_ms)) = found else {
        return Err(CoordError::Unexpected(format!(
            "segment {segment} is unknown"
        )));
    };
    let Some(storage) = shared.storage.read().clone() else {
        return Err(CoordError::Supervision(SupervisionError::NotRunning));
    };
    let args = SegmentArgs {
        shared: Arc::clone(shared),
        topic: topic.to_string(),
        range,
        segment,
        start_offset,
        created_at_ms,
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

impl CoordinatorState {
    fn node(&self) -> NodeId {
        NodeId(self.shared.config.node_id)
    }

    async fn create_topic(&self, name: String, policy: Option<String>) -> Result<u64, CoordError> {
        let plane = self.shared.plane()?;
        let outcome = plane
            .propose(Command::CreateTopic {
                topic: name.clone(),
                initial_ranges: 1,
                policy,
                replicas: vec![vec![self.node()]],
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
        for segment in segments {
            start_segment(&self.shared, &name, segment).await?;
        }
        info!(topic = %name, incarnation = incarnation.0, "topic created");
        Ok(incarnation.0)
    }

    async fn delete_topic(&self, name: String) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let outcome = plane
            .propose(Command::DeleteTopic {
                topic: name.clone(),
            })
            .await??;
        let Outcome::TopicDeleted { segments, .. } = outcome else {
            return Err(CoordError::Unexpected(format!("{outcome:?}")));
        };
        let storage = self.shared.storage.read().clone();
        for segment in segments {
            let actor = self.shared.segments.lock().remove(&segment);
            if actor.is_some()
                && let Some(storage) = &storage
            {
                // The name needs the range, which the deleted metadata no
                // longer has: find the child by its segment suffix instead.
                let suffix = format!("/{}", segment.0);
                if let Ok(snapshot) = storage.snapshot().await {
                    for child in snapshot.children {
                        if child.name.starts_with(&format!("segment/{name}/"))
                            && child.name.ends_with(&suffix)
                        {
                            let _ = storage.terminate_child(&child.name).await;
                        }
                    }
                }
            }
            // Copies are kept on disk: deleting files is the orphan sweeper's
            // job, after the delete is known to be committed everywhere.
            let _ = tokio::task::block_in_place(|| {
                self.shared
                    .store
                    .close(malachi_storage::SegmentId(segment.0))
            });
        }
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
        let range = read(plane.as_ref(), |s| s.segment(segment).map(|s| s.range));
        let next = match plane
            .propose(Command::RollSegment {
                topic: topic.clone(),
                segment,
                seal,
                next_replicas: vec![self.node()],
                at_ms: self.shared.clock.now_ms(),
            })
            .await?
        {
            Ok(Outcome::SegmentRolled { next, .. }) => next,
            // A repeated roll (the segment actor restarted mid-roll) is done already.
            Err(ModelError::AlreadyRolled { successor, .. }) => successor,
            Ok(other) => return Err(CoordError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(e.into()),
        };
        start_segment(&self.shared, &topic, next).await?;
        if let (Some(range), Some(storage)) = (range, self.shared.storage.read().clone()) {
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

    async fn reconcile(&self) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        let node = self.node();
        let wanted: Vec<(String, SegmentId)> = read(plane.as_ref(), |state| {
            let mut wanted = Vec::new();
            for topic in state.topics() {
                for range in state.active_ranges(&topic.name) {
                    let Some(id) = range.last_segment() else {
                        continue;
                    };
                    if let Some(segment) = state.segment(id)
                        && segment.state == SegmentState::Active
                        && segment.replicas.contains(&node)
                    {
                        wanted.push((topic.name.clone(), id));
                    }
                }
            }
            wanted
        });
        for (topic, segment) in wanted {
            if self.shared.segment(segment).is_none() {
                start_segment(&self.shared, &topic, segment).await?;
            }
        }
        Ok(())
    }
}

#[ractor::async_trait]
impl Actor for CoordinatorActor {
    type Msg = CoordinatorMsg;
    type State = CoordinatorState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        shared: Arc<Shared>,
    ) -> Result<CoordinatorState, ActorProcessingErr> {
        // The vnode actor started before this one (rest_for_one order).
        shared.plane()?;
        *shared.coordinator.write() = Some(myself);
        Ok(CoordinatorState { shared })
    }

    async fn post_start(
        &self,
        myself: ActorRef<CoordinatorMsg>,
        _state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        // Through the mailbox, so the supervisors above finish starting first.
        myself.send_message(CoordinatorMsg::Reconcile)?;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        msg: CoordinatorMsg,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CoordinatorMsg::CreateTopic {
                name,
                policy,
                reply,
            } => {
                let _ = reply.send(state.create_topic(name, policy).await);
            }
            CoordinatorMsg::DeleteTopic { name, reply } => {
                let _ = reply.send(state.delete_topic(name).await);
            }
            CoordinatorMsg::Roll {
                topic,
                segment,
                seal,
                reply,
            } => {
                let _ = reply.send(state.roll(topic, segment, seal).await);
            }
            CoordinatorMsg::Reconcile => {
                // A failed reconcile is a failure of this actor: the
                // supervisor restarts it, which reconciles again.
                state.reconcile().await?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<CoordinatorMsg>,
        state: &mut CoordinatorState,
    ) -> Result<(), ActorProcessingErr> {
        *state.shared.coordinator.write() = None;
        Ok(())
    }
}
