//! Broker membership: SWIM (foca) over UDP, and the handle the rest of the
//! broker reads it through.
//!
//! Who uses what:
//! - [`Membership`] is the API. It is created once per broker and outlives
//!   restarts of the runtime, so a subscriber never has to resubscribe.
//!   - [`Membership::watch`]: a `watch` of the whole [`MembershipView`]
//!     (level-triggered: always the latest, never lags). Read `view.live()`
//!     for every live broker's node id, client and raft addresses.
//!   - [`Membership::subscribe`]: a bounded broadcast of [`MemberEvent`]s
//!     (joined, restarted, suspect, alive, dead, routing), edge-triggered. A
//!     receiver that falls [`EVENTS_CAPACITY`] behind gets `Lagged` and
//!     should re-read the view.
//!   - [`Membership::set_local_routing`]: publish this broker's ring version
//!     and the vnodes it leads with their terms; every member sees them in
//!     [`Member::ring_version`] and [`Member::vnodes_led`].
//! - [`runtime::run`] drives a [`MembershipCore`] over a UDP socket bound on
//!   the client address's ip:port, so a seed's client address is also its
//!   SWIM address.
//! - [`MembershipCore`] is the I/O-free state machine (foca plus the view
//!   and its events), which the tests drive over a simulated network.
//!
//! Raft, not SWIM, decides who votes in a vnode group (decisions §8): SWIM
//! detects failure and spreads routing hints.

mod core;
mod identity;
mod routing;
pub mod runtime;
pub mod seal;
mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};

pub use self::core::{
    Effects, MembershipCore, PACKET_BYTES_MAX, PACKET_BYTES_MIN, PEERS_MAX,
    SEED_RETRY_CONNECTED_TICKS, SettingsError, SwimSettings,
};
pub use identity::{
    ATTRIBUTE_KEY_BYTES_MAX, ATTRIBUTE_VALUE_BYTES_MAX, ATTRIBUTES_MAX, IDENTITY_BYTES_MAX,
    IDENTITY_VERSION, IdentityError, NodeIdentity,
};
pub use routing::{
    ROUTING_BYTES_MAX, ROUTING_LEADERS_MAX, ROUTING_VERSION, RoutingError, RoutingHint, VnodeLeader,
};
pub use runtime::RuntimeArgs;
pub use view::{Member, MemberEvent, MemberEventKind, MemberState, MembershipView};

/// Events a subscriber may fall behind by before it sees `Lagged`.
pub const EVENTS_CAPACITY: usize = 1024;

/// Why membership cannot run.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// SWIM could not take this broker's changed identity.
    #[error("the identity could not be changed: {0}")]
    IdentityChange(#[source] foca::Error),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error("swim socket: {0}")]
    Socket(std::io::Error),
}

/// This broker's routing as last set through [`Membership::set_local_routing`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRouting {
    pub ring_version: u64,
    pub leaders: Vec<VnodeLeader>,
}

#[derive(Debug)]
struct Inner {
    view_tx: watch::Sender<MembershipView>,
    events_tx: broadcast::Sender<MemberEvent>,
    routing_tx: watch::Sender<Option<LocalRouting>>,
    /// Attributes that replace the identity's (latest wins).
    attributes_tx: watch::Sender<Option<BTreeMap<String, String>>>,
    leave_tx: watch::Sender<bool>,
}

/// The membership handle of one broker (cheap to clone).
#[derive(Debug, Clone)]
pub struct Membership {
    inner: Arc<Inner>,
}

impl Membership {
    /// A handle whose view holds only `local` until a runtime runs.
    pub fn new(local: &NodeIdentity) -> Membership {
        let view = MembershipView {
            local: Member::from_identity(local, MemberState::Alive),
            peers: Default::default(),
        };
        Membership {
            inner: Arc::new(Inner {
                view_tx: watch::Sender::new(view),
                events_tx: broadcast::Sender::new(EVENTS_CAPACITY),
                routing_tx: watch::Sender::new(None),
                attributes_tx: watch::Sender::new(None),
                leave_tx: watch::Sender::new(false),
            }),
        }
    }

    /// The latest view.
    pub fn view(&self) -> MembershipView {
        self.inner.view_tx.borrow().clone()
    }

    /// This broker as the cluster sees it.
    pub fn local(&self) -> Member {
        self.inner.view_tx.borrow().local.clone()
    }

    /// Every broker alive or suspect, this one first.
    pub fn live_members(&self) -> Vec<Member> {
        self.inner.view_tx.borrow().live().cloned().collect()
    }

    /// A receiver of the whole view, marked changed whenever it changes.
    pub fn watch(&self) -> watch::Receiver<MembershipView> {
        self.inner.view_tx.subscribe()
    }

    /// A receiver of every change from now on (bounded: see [`EVENTS_CAPACITY`]).
    pub fn subscribe(&self) -> broadcast::Receiver<MemberEvent> {
        self.inner.events_tx.subscribe()
    }

    /// Publishes this broker's ring version and the vnodes it leads (with
    /// their raft terms) to every member. Level-triggered: the latest call
    /// wins, and a restarted runtime publishes it again.
    pub fn set_local_routing(
        &self,
        ring_version: u64,
        leaders: Vec<VnodeLeader>,
    ) -> Result<(), MembershipError> {
        if leaders.len() > ROUTING_LEADERS_MAX {
            return Err(RoutingError::TooManyLeaders(leaders.len()).into());
        }
        self.inner.routing_tx.send_replace(Some(LocalRouting {
            ring_version,
            leaders,
        }));
        Ok(())
    }

    /// Replaces this broker's attributes: a new incarnation of its identity
    /// carries them to every member. Level-triggered like the routing: the
    /// latest call wins, and a restarted runtime starts with it.
    pub fn set_local_attributes(
        &self,
        attributes: BTreeMap<String, String>,
    ) -> Result<(), MembershipError> {
        let mut probe = NodeIdentity::seed(self.local().client_addr);
        probe.node_id = self.local().node_id.max(1);
        probe.attributes = attributes.clone();
        probe.validate()?;
        self.inner.attributes_tx.send_replace(Some(attributes));
        Ok(())
    }

    /// Asks the runtime to declare this broker down to the others and stop.
    pub fn leave(&self) {
        self.inner.leave_tx.send_replace(true);
    }

    /// Whether [`Membership::leave`] was called.
    pub fn is_leaving(&self) -> bool {
        *self.inner.leave_tx.borrow()
    }

    fn publish(&self, view: MembershipView, events: Vec<MemberEvent>) {
        self.inner.view_tx.send_if_modified(|current| {
            if *current == view {
                false
            } else {
                *current = view;
                true
            }
        });
        for event in events {
            // No receiver is fine: events are for whoever listens now.
            let _ = self.inner.events_tx.send(event);
        }
    }
}

#[cfg(test)]
mod sim;
