//! Malachi's test kit, one crate for what the tests of every crate share
//! (a dev-dependency only; nothing a broker runs depends on it):
//!
//! - [`wait`]: wait on a condition, never a sleep (async and blocking);
//! - [`keyed`]: the keyed writer and the per-key order checker;
//! - `process` (feature `process`): brokers as processes, one or a cluster;
//! - `inproc` (feature `inproc`): brokers in process and a test client;
//! - `fake` (feature `fake`): fake brokers for the client library;
//! - `copies`: a broker's segment copies on disk, frame by frame;
//! - `tls` (feature `tls`): test certificates (a CA, brokers, clients).
//!
//! A test fails by panicking, so the kit unwraps freely.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(any(feature = "process", feature = "inproc"))]
pub mod copies;
#[cfg(feature = "fake")]
pub mod fake;
#[cfg(feature = "inproc")]
pub mod inproc;
pub mod keyed;
#[cfg(feature = "process")]
pub mod process;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wait;
