//! The control plane: the `metadata` subtree (rest_for_one).
//!
//! `vnodes.rs` (`metadata/vnodes`) opens this broker's vnode replicas and
//! the metadata plane (`metadata.rs`) and serves the raft port, whose
//! requests `cluster_port.rs` routes to their handlers, keeping the
//! host's loops and replicas running (`host_loops.rs`); after it,
//! `manager.rs` (`coordinator_manager/manager`) runs one coordinator actor
//! (`coordinator/`, a folder with a file per job) per vnode led here, each
//! holding its vnode's lease (`lease.rs`) for its timed work. `requests.rs`
//! is what they are asked; `placement.rs` says which broker serves a
//! topic's records. `cursor_keys.rs` holds the cluster's cursor keys and
//! `cursor_learner.rs` learns them (ADR 0096). `shared.rs` is the broker
//! context; the layers above get parts of it, built at their boundary, and
//! `handle.rs` (`ControlHandle`) for the control operations they call.
//!
//! The coordinator's orders to copies: `replica_order.rs` (fence, catch-up,
//! seal and the [`OrderClient`](replica_order::OrderClient) that sends
//! them, over the node fabric where it can, ADR 0133), `order_server.rs`
//! (`metadata/orders`, which serves them from the fabric), `replica.rs` (repair appends), `order_epoch.rs` (the epoch they
//! carry), `removal.rs` (dropping copies the metadata no longer lists) and
//! `drop_orders.rs` (asking holders to); `segment_stop.rs` stops segment
//! actors for all of them. `retention.rs` expires old segments.
//!
//! Inside this folder files name each other without a circle
//! (`actors/tests/module_cycles.rs`): a piece two files share lives in a
//! lower file both name.
//!
//! Architecture invariant: `control` names `common`, `data` and `fabric`,
//! never `serve`, `admin` or `broker`. It starts segment actors and gives
//! each a `Roller` back to the coordinator, so `data` never names it.

pub(crate) mod cluster_port;
pub(crate) mod coordinator;
pub(crate) mod cursor_keys;
pub(crate) mod cursor_learner;
pub(crate) mod describe_rates;
pub(crate) mod drop_orders;
pub(crate) mod handle;
pub(crate) mod host_loops;
pub(crate) mod lease;
pub(crate) mod manager;
pub(crate) mod memory;
pub(crate) mod metadata;
pub(crate) mod order_epoch;
pub(crate) mod order_error;
pub(crate) mod order_server;
pub(crate) mod placement;
pub(crate) mod policies;
pub(crate) mod registry;
pub(crate) mod removal;
pub(crate) mod replica;
pub(crate) mod replica_order;
pub(crate) mod replica_status;
pub(crate) mod requests;
pub(crate) mod retention;
pub(crate) mod segment_stop;
pub(crate) mod shared;
pub(crate) mod vnodes;
