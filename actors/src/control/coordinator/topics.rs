//! Creating and deleting topics: placing a new topic's first segment and
//! starting its actor, and after a delete releasing the actors and copies
//! and sending the holders their drop orders (ADR 0115).

use std::sync::Arc;

use malachi_core::model::{Command, Outcome, SegmentId};
use tracing::{debug, info, warn};

use super::lease_slot::LEASE_FIRST_WAIT_MS;
use super::lifecycle::start_segment;
use super::{CoordError, CoordinatorState};
use crate::control::metadata::read_owner;
use crate::control::segment_stop::{close_copy, stop_segment_actor};
use crate::control::shared::Shared;

impl CoordinatorState {
    /// Waits (at most `LEASE_FIRST_WAIT_MS`) until this broker's replica of
    /// the vnode has seen a lease granted: the vnode's coordinator takes one
    /// as it starts, and a topic created before any grant would open its
    /// segments at writer epoch 0, which no older epoch precedes (ADR 0097).
    /// A broker without a replica of the vnode does not wait.
    pub(super) async fn wait_for_first_lease(&self) {
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

    pub(super) async fn create_topic(
        &self,
        name: String,
        policy: Option<String>,
        replication_factor: Option<u8>,
    ) -> Result<u64, CoordError> {
        let plane = self.shared.plane()?;
        let factor = self.factor_for(&name, replication_factor)?;
        let seed = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        let primary = self.primary_for(seed, &[]);
        let replicas = self.replicas(policy.as_deref(), primary, factor, seed)?;
        let placed = replicas.first().copied().unwrap_or(primary);
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

    /// The copies a new topic gets: `replication_factor` if given, else the
    /// default, or fewer when fewer brokers are configured or live.
    pub(super) fn factor_for(
        &self,
        name: &str,
        replication_factor: Option<u8>,
    ) -> Result<usize, CoordError> {
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
        Ok(factor)
    }

    pub(super) async fn delete_topic(&self, name: String) -> Result<(), CoordError> {
        let plane = self.shared.plane()?;
        // Who holds what, read before the delete forgets it: the drop
        // orders go to them once it commits (ADR 0115).
        let holders = read_owner(plane.as_ref(), &name, |s| {
            crate::control::removal::holders_of(s, &name)
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
            let orders = crate::control::replica_order::OrderClient {
                shared: Arc::clone(&shared),
            };
            crate::control::drop_orders::send_drop_orders(&orders, &topic, holders).await;
        });
        self.shared.forget_topic(&name);
        info!(topic = %name, "topic deleted");
        Ok(())
    }
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
