//! The `membership` subtree (rest_for_one): SWIM membership
//! (`membership.rs`, `membership/swim`) and the ractor_cluster node fabric
//! between brokers (`node.rs`: `membership/node_server`, `membership/node`),
//! bounded calls between actors on different brokers over it (`remote.rs`,
//! ADR 0133),
//! and how a broker finds its cluster before the tree starts
//! (`formation.rs`, ADR 0102).
//!
//! Architecture invariant: `fabric` names only `common`. Its actors get the
//! `Fabric` and the root's `SupervisorSlot` as arguments, never the broker
//! context.

pub(crate) mod formation;
pub(crate) mod membership;
pub(crate) mod node;
pub(crate) mod remote;
