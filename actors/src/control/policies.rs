//! Storage policies as cluster-wide admin objects (issue 21, ADR 0115):
//! defined, listed and removed in the ring's own raft group, beside the
//! ring and the cursor keys, never in a topic's vnode. A broker without
//! vnodes (the file or single-group backends) keeps them in its one group.

use std::collections::BTreeMap;

use malachi_cluster::vnodes::RouteError;
use malachi_core::model::{Command, ModelError, Outcome, StoragePolicy};
use malachi_core::ring::VNODES_POLICY;

use super::memory::ControlMemory;
use super::registry::ActorRegistry;
use crate::common::error::MetadataError;

/// Why a policy could not be read or changed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The cluster's policies, read linearizably where they are kept.
pub(crate) async fn policies(
    actors: &ActorRegistry,
    memory: &ControlMemory,
) -> Result<BTreeMap<String, StoragePolicy>, PolicyError> {
    let plane = actors.plane()?;
    let all = match plane.host() {
        Some(host) => host.policies().await?,
        None => {
            let mut all = BTreeMap::new();
            plane.view_each(&mut |state| {
                all.extend(state.policies().iter().map(|(k, v)| (k.clone(), v.clone())));
            });
            all
        }
    };
    // What placement reads without a round trip.
    *memory.policy_cache.write() = all.clone();
    Ok(all)
}

/// Defines, redefines or removes a policy (`PutPolicy`, `RemovePolicy`).
pub(crate) async fn propose(
    actors: &ActorRegistry,
    memory: &ControlMemory,
    cmd: Command,
) -> Result<Outcome, PolicyError> {
    debug_assert!(matches!(
        cmd,
        Command::PutPolicy { .. } | Command::RemovePolicy { .. }
    ));
    let vnodes = match &cmd {
        Command::PutPolicy { policy } => policy.name == VNODES_POLICY,
        Command::RemovePolicy { name } => name == VNODES_POLICY,
        _ => false,
    };
    let plane = actors.plane()?;
    let verdict = match plane.host() {
        Some(host) => host.propose_ring(cmd).await?,
        None => plane.propose(cmd).await?,
    };
    let outcome = verdict?;
    // The `vnodes` policy's constraints live in the ring too (ADR 0121):
    // every broker's rebalancer learns them with the ring, at once.
    if vnodes && let Some(host) = plane.host() {
        match host.refresh_ring().await {
            Ok(ring) => host.announce_ring(ring.version()).await,
            Err(e) => {
                tracing::debug!(error = %e, "the ring not re-read after a vnodes policy change; ring sync spreads it")
            }
        }
    }
    // Refresh the cache at once, so a topic created next through this
    // broker is placed by the new definition.
    if let Err(e) = policies(actors, memory).await {
        tracing::debug!(error = %e, "policies not re-read after a change; the next retention pass does");
    }
    Ok(outcome)
}
