//! The coordinator's lease (ADR 0082, ADR 0101), held only while its
//! vnode holds topics: taken at start and at a creation, given up by the
//! upkeep while the vnode is empty.

use std::sync::Arc;

use tracing::{debug, warn};

use super::CoordinatorRun;
use crate::control::lease::CoordinatorLease;

/// How long a creation on a lease-less coordinator waits for the lease
/// before it goes ahead without it (a predecessor's unexpired lease holds
/// it back; requests never needed the lease, segments then carry the
/// group's current epoch).
pub(super) const LEASE_FIRST_WAIT_MS: u64 = 2_000;
/// How often that wait looks at the lease.
pub(super) const LEASE_FIRST_POLL_MS: u64 = 5;

/// A coordinator's lease, held only while it has work that needs it.
pub(super) enum LeaseSlot {
    /// A plane without vnode groups (the file plane: one broker, nobody to
    /// overlap with): continuous work always runs.
    Unneeded,
    /// The vnode holds no topic: no lease is held or renewed.
    Idle,
    Held(CoordinatorLease),
}

impl CoordinatorRun {
    /// Starts the lease if it is not held, and waits (bounded) until it is.
    pub(super) async fn take_lease(&mut self) {
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
            let owner = super::keeper_owner(&self.logic.shared, self.myself.clone());
            match CoordinatorLease::start(Arc::clone(host), self.logic.vnode, config, owner) {
                Ok(lease) => {
                    self.logic
                        .shared
                        .memory
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
    pub(super) fn drop_lease(&mut self) {
        if let LeaseSlot::Held(lease) = std::mem::replace(&mut self.lease, LeaseSlot::Idle) {
            debug!(vnode = %self.logic.vnode, "coordinator lease given up: the vnode holds no topic");
            self.releasing = Some(tokio::spawn(lease.stop()));
        }
    }
}
