//! malachi-cluster: the control plane of Malachi.
//!
//! This crate holds the pure log model: topics, ranges and segments, the
//! deterministic metadata state machine that raft groups replicate
//! (`model`), and the opaque cursor codec clients carry (`cursor`). Neither
//! does I/O, reads a clock or draws randomness, so both are tested as plain
//! functions. `group` replicates the model through openraft with its log,
//! vote and snapshots on disk, behind the crate's own `MetadataGroup` API so
//! no openraft type leaks out; `group::TcpTransport` carries every group's
//! raft messages between brokers, one connection per pair. `ring` maps topic
//! names to vnodes, and `vnodes` hosts a broker's vnode replicas, routes
//! any metadata request to its vnode's leader (ADR 0080), keeps the ring in
//! a raft group of its own, splits vnodes and grants coordinator leases
//! (ADR 0082, ADR 0083). `membership` is SWIM. `clock` is the project's one
//! `Clock`.
//!
//! The pure core and the I/O around it (ADR 0090). The pure modules are
//! `model`, `ring`, `cursor`, `formation` (how brokers form one cluster,
//! ADR 0102), `placement` (which coordinators a broker runs) and
//! `constraints` (storage policies' placement, ADR 0116): deterministic functions of their inputs, with no clock, no
//! randomness, no filesystem or network, no async runtime, and no path into
//! the I/O modules `group`, `membership`, `vnodes` or `clock`, which wrap
//! them. `tests/purity.rs` checks both halves of that rule on every pure
//! source file, and that every module of this file is classified.

// Pure core.
pub mod constraints;
pub mod cursor;
pub mod formation;
pub mod model;
pub mod placement;
pub mod ring;

// I/O around it.
pub mod clock;
pub mod group;
pub mod membership;
pub mod vnodes;
