//! The data plane: the `storage` subtree. One `segment/<topic>/<range>/<segment>`
//! actor per open segment copy (`segment.rs`), and the state they share
//! (`storage.rs`). The ReplicationServer (replica append, catch-up, fencing)
//! will live here too; it is planned, not built: each segment has one copy
//! today.
//!
//! Architecture invariant: this module names only `common`. A segment actor
//! reaches the control plane through the [`segment::Roller`] it was started
//! with, never by naming the coordinator.

pub(crate) mod invariants;
pub(crate) mod producers;
pub(crate) mod segment;
pub(crate) mod storage;
