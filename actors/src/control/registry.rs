//! The typed registry of this broker's long-lived actors: who serves the
//! metadata plane, the coordinator manager and each vnode's coordinator,
//! the failover actor, the healer, and the supervisors others add children
//! to. Each actor registers itself when it starts and unregisters (only
//! itself: a restarted successor may have registered already) when it
//! stops, so a caller finds the live one or none, never a stale one.

use std::collections::BTreeMap;
use std::sync::Arc;

use malachi_core::ring::VnodeId;
use malachi_supervision::SupervisorRef;
use parking_lot::RwLock;
use ractor::ActorRef;

use super::metadata::MetadataPlane;
use super::requests::{CoordinatorMsg, FailoverMsg, HealMsg};
use crate::common::SupervisorSlot;
use crate::common::error::MetadataError;

/// One actor's slot: empty until it starts, and emptied by that same actor
/// when it stops.
pub(crate) struct Registered<M: ractor::Message> {
    slot: RwLock<Option<ActorRef<M>>>,
}

impl<M: ractor::Message> std::fmt::Debug for Registered<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("actor", &self.get().map(|a| a.get_id()))
            .finish()
    }
}

impl<M: ractor::Message> Default for Registered<M> {
    fn default() -> Self {
        Registered {
            slot: RwLock::new(None),
        }
    }
}

impl<M: ractor::Message> Registered<M> {
    /// The running actor, if one registered.
    pub fn get(&self) -> Option<ActorRef<M>> {
        self.slot.read().clone()
    }

    /// `actor` is now the one serving (a restarted actor replaces its
    /// crashed predecessor, whose post_stop never ran).
    pub fn register(&self, actor: ActorRef<M>) {
        *self.slot.write() = Some(actor);
    }

    /// `actor` stops: empty the slot, unless a successor holds it already.
    pub fn unregister(&self, actor: &ActorRef<M>) {
        let mut slot = self.slot.write();
        if slot.as_ref().is_some_and(|r| r.get_id() == actor.get_id()) {
            *slot = None;
        }
    }

    /// Sends `msg` to the running actor; false when none runs (or it just
    /// stopped), which callers treat as "try again on the next pass".
    pub fn tell(&self, msg: M) -> bool {
        self.get()
            .is_some_and(|actor| actor.send_message(msg).is_ok())
    }
}

/// The coordinator of each vnode this broker leads.
#[derive(Debug, Default)]
pub(crate) struct Coordinators {
    by_vnode: RwLock<BTreeMap<VnodeId, ActorRef<CoordinatorMsg>>>,
}

impl Coordinators {
    pub fn get(&self, vnode: VnodeId) -> Option<ActorRef<CoordinatorMsg>> {
        self.by_vnode.read().get(&vnode).cloned()
    }

    pub fn register(&self, vnode: VnodeId, actor: ActorRef<CoordinatorMsg>) {
        self.by_vnode.write().insert(vnode, actor);
    }

    /// Forgets `vnode`'s coordinator, whichever it is (the manager stops it).
    pub fn forget(&self, vnode: VnodeId) {
        self.by_vnode.write().remove(&vnode);
    }

    /// `actor`, `vnode`'s coordinator, stops: forget it unless a restarted
    /// successor registered already.
    pub fn unregister(&self, vnode: VnodeId, actor: &ActorRef<CoordinatorMsg>) {
        let mut by_vnode = self.by_vnode.write();
        if by_vnode
            .get(&vnode)
            .is_some_and(|c| c.get_id() == actor.get_id())
        {
            by_vnode.remove(&vnode);
        }
    }
}

/// The broker's registry of long-lived actors (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ActorRegistry {
    /// The metadata plane, set by the `vnodes` actor while it runs.
    plane: RwLock<Option<Arc<dyn MetadataPlane>>>,
    /// The coordinator manager: the front door of every coordinator request
    /// on this broker (it hands each to the coordinator of the topic's vnode).
    manager: Registered<CoordinatorMsg>,
    coordinators: Coordinators,
    /// `maintenance/failover`: coordinators hand it the segments to fail over.
    failover: Registered<FailoverMsg>,
    /// `maintenance/healer`: coordinators hand it the copies to heal.
    healer: Registered<HealMsg>,
    /// The `coordinator_manager` supervisor, which the manager adds
    /// coordinators to.
    pub coordinator_sup: RwLock<Option<SupervisorRef>>,
    /// The root supervisor, shared with the node fabric (`tree --all`).
    pub root: SupervisorSlot,
    /// The client port's listener supervisor.
    pub listener: RwLock<Option<SupervisorRef>>,
}

impl ActorRegistry {
    /// The metadata plane, or `NotOpen` until the `vnodes` actor opened it.
    pub fn plane(&self) -> Result<Arc<dyn MetadataPlane>, MetadataError> {
        self.plane.read().clone().ok_or(MetadataError::NotOpen)
    }

    pub fn plane_is_open(&self) -> bool {
        self.plane.read().is_some()
    }

    /// Publishes the plane `vnodes` opened; returns the one it replaces.
    pub fn open_plane(&self, plane: Arc<dyn MetadataPlane>) -> Option<Arc<dyn MetadataPlane>> {
        self.plane.write().replace(plane)
    }

    /// Withdraws the plane (the `vnodes` actor stops or restarts).
    pub fn close_plane(&self) -> Option<Arc<dyn MetadataPlane>> {
        self.plane.write().take()
    }

    pub fn manager(&self) -> &Registered<CoordinatorMsg> {
        &self.manager
    }

    pub fn coordinators(&self) -> &Coordinators {
        &self.coordinators
    }

    pub fn failover(&self) -> &Registered<FailoverMsg> {
        &self.failover
    }

    pub fn healer(&self) -> &Registered<HealMsg> {
        &self.healer
    }

    /// The root supervisor, once the tree started.
    pub fn root(&self) -> Option<SupervisorRef> {
        self.root.read().clone()
    }
}
