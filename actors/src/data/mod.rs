//! The data plane: the `storage` subtree. One `segment/<topic>/<range>/<segment>`
//! actor per open segment copy (`segment.rs`), and the state they share
//! (`storage.rs`), and the `replication` ReplicationServer (`replication/`:
//! the follower's replica-append and the primary's shippers, over the
//! quorum arithmetic of `quorum.rs`), the pure seal decisions of a failover
//! (`recovery.rs`, model-checked by `seal_model.rs`), what this broker tells
//! of the copies it holds (`status.rs`, replica-status, ADR 0098), and
//! damaged or missing copies opened in quarantine and reported
//! (`damage.rs`, ADR 0108), and where an opening segment's producer table
//! comes from (`lineage.rs`, ADR 0119).
//!
//! Architecture invariant: this module names only `common`. A segment actor
//! reaches the control plane through the [`segment::Roller`] it was started
//! with, never by naming the coordinator.

pub(crate) mod ancestors;
pub(crate) mod damage;
pub(crate) mod invariants;
pub(crate) mod lineage;
pub(crate) mod producers;
pub(crate) mod quorum;
pub(crate) mod recovery;
pub(crate) mod replication;
pub(crate) mod scrub;
#[cfg(test)]
mod seal_model;
pub(crate) mod segment;
pub(crate) mod space;
pub(crate) mod status;
pub(crate) mod storage;
