//! malachi-actors: the broker itself, as a supervision tree of actors.
//!
//! [`Broker::start`] builds the tree of the design's `layout.md` on
//! `malachi-supervision`: a root `broker` supervisor over `storage` (one
//! segment actor per open segment copy of a shared `FileStore`), `metadata`
//! (the `vnodes` actor owning this broker's vnode replicas, each an openraft
//! group, and the raft port; then the coordinator manager, which runs a
//! `coordinator/<vnode>` carrying topic, roll, split and merge logic for
//! each vnode this broker leads), `listener` (an acceptor and one temporary actor per
//! client connection) and `admin_http` (health, readiness, Prometheus
//! metrics and the live tree as JSON). The produce path runs connection,
//! then the key's range's active segment actor, then the store's group
//! commit, and acknowledges only after the fsync
//! (`docs/life-of-a-produce.md`); the consume path reads the stored copies
//! by cursor across segments and epochs, with long poll (`fetch`) or pushes
//! within credit (`subscribe`).
//!
//! Boundaries: this crate owns no on-disk format (storage does), no wire
//! format (wire does) and no metadata semantics (cluster's model does); it
//! wires them together, bounds every queue, and turns every failure into a
//! typed wire error. Time reaches the coordinator and segment actors through
//! [`Clock`]; randomness is used once, to create the cursor secret. The
//! binary (`malachi broker`) layers its configuration into [`BrokerConfig`]
//! and calls [`Broker::start`] (or [`run_until_signal`]).

mod admin;
mod broker;
mod clock;
mod config;
mod connection;
mod convert;
mod coordinator;
mod error;
mod fetch;
mod listener;
mod manager;
mod membership;
mod metadata;
mod metrics;
mod node;
mod placement;
mod segment;
mod shared;
mod subscribe;
mod vnode;
mod vnode_admin;
mod vnode_lease;

pub use broker::{Broker, BrokerHandle, run_until_signal};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{
    BrokerConfig, ClusterSettings, DEV_CLUSTER_COOKIE, MembershipSettings, MetadataBackend,
    StoreSettings,
};
pub use convert::{describe_to_wire, tree_from_wire, tree_to_wire};
pub use error::BrokerError;
pub use malachi_cluster::membership::{
    Member, MemberEvent, MemberEventKind, MemberState, Membership, MembershipView, VnodeLeader,
};
pub use metadata::{FilePlane, MetadataError, MetadataPlane, RaftPlane, VnodePlane};
