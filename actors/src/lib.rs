//! malachi-actors: the broker itself, as a supervision tree of actors.
//!
//! [`Broker::start`] builds the tree of the design's `layout.md` on
//! `malachi-supervision` (`broker::build_tree`), and the modules follow it:
//! a root `broker` supervisor over `storage` (`data`: one segment actor per
//! active segment this broker is the primary of, over a shared `SegmentStore`
//! (a `FileStore` by default), and the ReplicationServer, `storage/replication`,
//! which ships a primary's frames and writes a follower's copies), `metadata` (`control`: the
//! `vnodes` actor owning this broker's vnode replicas, each an openraft
//! group, and the raft port; then the coordinator manager, which runs a
//! `coordinator/<vnode>` carrying topic, roll, split and merge logic for
//! each vnode this broker leads), `membership` (`fabric`: SWIM and the
//! ractor_cluster node fabric), `maintenance` (failover, the healer, the
//! scrubber, the free-space poller and the orphan sweeper; retention runs in
//! each coordinator), `listener` (`serve`: an acceptor, one temporary actor
//! per client connection, and a handler module per api family) and
//! `admin_http` (`admin`: health, readiness, Prometheus metrics and the live
//! tree as JSON). `common` holds the leaves (config, errors, clock, metrics,
//! conversions). A module names only those below it; no top-level module
//! imports one that imports it back (`tests/module_cycles.rs`).
//!
//! The produce path runs connection, then the key's range's active segment
//! actor, then the store's group commit, and acknowledges only after a
//! quorum of the segment's N copies (3 by default) has fsynced the records
//! (`docs/life-of-a-produce.md`, `docs/life-of-a-replicated-produce.md`).
//! When a primary dies its segments fail over: sealed on the surviving
//! copies, their successors opened on live brokers (ADR 0106). The consume
//! path reads the stored copies by cursor across segments and epochs, with
//! long poll (`fetch`) or pushes within credit (`subscribe`).
//!
//! Boundaries: this crate owns no on-disk format (storage does), no wire
//! format (wire does) and no metadata semantics (cluster's model does); it
//! wires them together, bounds every queue, and turns every failure into a
//! typed wire error. Time reaches the coordinator and segment actors through
//! [`Clock`]; OS randomness is drawn only for the cursor keys, the cluster
//! id a first start proposes and the seed of SWIM's random choices. The
//! binary (`malachi broker`) layers its configuration into [`BrokerConfig`]
//! and calls [`Broker::start`] (or [`run_until_signal`]).

mod admin;
mod broker;
mod common;
mod control;
mod data;
mod fabric;
mod maintenance;
pub mod scram_login;
mod serve;

pub use broker::{Broker, BrokerHandle, run_until_signal};
pub use common::clock::{Clock, ManualClock, SystemClock};
pub use common::config::{
    Authentication, BrokerConfig, ClientAuth, ClientPortsTls, ClusterSettings, ClusterTls,
    DEV_CLUSTER_COOKIE, MaintenanceSettings, MembershipSettings, MetadataBackend, NodeIdentity,
    ReshapeDefaults, SecuritySettings, StoreSettings, SwimSeal, TlsSettings,
};
pub use common::convert::{describe_to_wire, tree_from_wire, tree_to_wire};
pub use common::error::BrokerError;
#[cfg(feature = "testing")]
pub use common::error::HookError;
pub use common::store_factory::StoreFactory;

/// The decoders of what a peer broker sends over the node fabric, public
/// only for the fuzz targets in `fuzz/` (through `fuzz-bodies/`): the same
/// functions the node actor runs on untrusted input.
#[doc(hidden)]
pub mod untrusted {
    pub use crate::fabric::node::{accepts_remote_message, decode_tree_reply};
}
pub use control::metadata::{FilePlane, MetadataError, MetadataPlane, RaftPlane, VnodePlane};
pub use malachi_membership::{
    Member, MemberEvent, MemberEventKind, MemberState, Membership, MembershipView, VnodeLeader,
};
