//! The `membership` subtree (rest_for_one): SWIM membership
//! (`membership.rs`, `membership/swim`) and the ractor_cluster node fabric
//! between brokers (`node.rs`: `membership/node_server`, `membership/node`),
//! bounded calls between actors on different brokers over it (`remote.rs`,
//! ADR 0133; `greeter.rs` is the actor guide's example of one, built for
//! tests),
//! and how a broker finds its cluster before the tree starts
//! (`formation.rs`, ADR 0102).
//!
//! Architecture invariant: `fabric` names only `common`. Its actors get the
//! `Fabric` and the root's `SupervisorSlot` as arguments, never the broker
//! context.

pub(crate) mod formation;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod greeter;
pub(crate) mod membership;
pub(crate) mod node;
pub(crate) mod remote;
