//! malachi-cluster: the control plane of Malachi.
//!
//! Today this crate holds the pure log model: topics, ranges and segments,
//! the deterministic metadata state machine that raft groups will replicate
//! (`model`), and the opaque cursor codec clients carry (`cursor`). Neither
//! does I/O, reads a clock or draws randomness, so both are tested as plain
//! functions. The crate will later also hold the hash ring, the openraft
//! vnode groups and their transport, SWIM membership and placement; those
//! wrap the model and must keep it pure.

pub mod cursor;
pub mod model;
