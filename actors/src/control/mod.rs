//! The control plane: the `metadata` subtree (rest_for_one).
//!
//! `vnodes.rs` (`metadata/vnodes`) opens this broker's vnode replicas and
//! the metadata plane (`metadata.rs`) and serves the raft port; after it,
//! `manager.rs` (`coordinator_manager/manager`) runs one `coordinator.rs`
//! actor (`coordinator/<vnode>`) per vnode led here, each holding its
//! vnode's lease (`lease.rs`) for its timed work. `requests.rs` is what
//! they are asked; `placement.rs` says which broker serves a topic's
//! records. `cursor_keys.rs` learns the cluster's cursor keys (ADR 0096).
//! `shared.rs` is the broker context the layers above use.
//!
//! Architecture invariant: `control` names `common`, `data` and `fabric`,
//! never `serve`, `admin` or `broker`. It starts segment actors and gives
//! each a `Roller` back to the coordinator, so `data` never names it.

pub(crate) mod coordinator;
pub(crate) mod cursor_keys;
pub(crate) mod lease;
pub(crate) mod manager;
pub(crate) mod metadata;
pub(crate) mod placement;
pub(crate) mod policies;
pub(crate) mod removal;
pub(crate) mod replica;
pub(crate) mod replica_order;
pub(crate) mod replica_status;
pub(crate) mod requests;
pub(crate) mod retention;
pub(crate) mod shared;
pub(crate) mod vnodes;
