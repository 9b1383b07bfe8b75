//! malachi-core: the pure core of Malachi's metadata plane (ADR 0090,
//! ADR 0132).
//!
//! - `auth`: SCRAM-SHA-256, ACL decisions and progressive lockout (ADR 0146).
//! - `model`: topics, ranges and segments, the commands raft groups carry
//!   and the deterministic state machine that applies them.
//! - `cursor`: the opaque cursor codec clients carry.
//! - `ring`: topic names to vnodes.
//! - `formation`: how brokers form one cluster (ADR 0102).
//! - `placement`: which coordinators a broker runs.
//! - `constraints`: storage policies' placement (ADR 0116).
//! - `plan`: the control plane's planners: what to fail over, heal and
//!   probe, and when a range splits or merges by its write rate.
//! - `rate`: write rates, streaks and the hottest key's share, over time
//!   the caller passes in (ADR 0143).
//!
//! Everything here is a deterministic function of its inputs: no clock, no
//! randomness, no filesystem or network, no async runtime. The manifest
//! enforces it (no such crate is a dependency), and `tests/purity.rs`
//! checks the sources and the manifest.

pub mod auth;
pub mod constraints;
pub mod cursor;
pub mod formation;
pub mod load;
pub mod model;
pub mod placement;
pub mod plan;
pub mod rate;
pub mod ring;
