//! malachi-cluster: the metadata plane of Malachi.
//!
//! `group` replicates the pure model (`malachi_core::model`) through
//! openraft with its log, vote and snapshots on disk, behind the crate's
//! own `MetadataGroup` API so no openraft type leaks out;
//! `group::TcpTransport` carries every group's raft messages between
//! brokers, one connection per pair. `vnodes` hosts a broker's vnode
//! replicas, routes any metadata request to its vnode's leader (ADR 0080),
//! keeps the ring in a raft group of its own, splits vnodes and grants
//! coordinator leases (ADR 0082, ADR 0083). `clock` is the project's one
//! `Clock`.
//!
//! The pure core lives in `malachi-core` and SWIM in `malachi-membership`
//! (ADR 0132): this crate is the I/O around the core.

pub mod clock;
pub mod group;
pub mod vnodes;
