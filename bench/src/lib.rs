//! malachi-bench: the measurement tooling behind `malachi bench`, kept out
//! of the production crates so that no broker build carries it.
//!
//! [`storage`] measures `malachi-storage`'s durable append and read
//! throughput against the disk's own durable write bandwidth (`malachi bench
//! storage`, and the raw disk baseline of `bench produce --vs-raw` and `bench
//! compare`). [`peers`] finds, installs (apt-get, pip) and starts the systems
//! `malachi bench compare` runs Malachi against, with one config per
//! durability mode; [`report`] turns a comparison's rows into its table,
//! targets and JSON, and [`chart`] draws them as an SVG. The crate depends on
//! the production crates, never the other way round, and nothing in them
//! depends on it; the `malachi` binary parses the bench's flags, drives the
//! broker load and prints. Results land in `bench/results/`.

pub mod chart;
pub mod peers;
pub mod report;
pub mod storage;

/// A benchmark that could not run: one line saying what failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);
