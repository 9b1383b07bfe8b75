//! Runtime statistics collection.
//!
//! Everything here is reachable only through `Raft::runtime_stats`, which exists only under the
//! `runtime-stats` feature. With the feature off the whole module is legitimately unreachable, so
//! the allow below is conditioned on that rather than applied outright: with the feature on, dead
//! code here is real dead code and still warns.
#![cfg_attr(not(feature = "runtime-stats"), allow(dead_code))]

mod display_mode;
#[allow(clippy::module_inception)]
mod runtime_stats;
mod runtime_stats_display;

pub mod log_stage;

/// Malachi patch: a histogram of the coarsest bucket width (1) and one slot.
/// Upstream's default width keeps 252 buckets (2 KB) per histogram and 16
/// histograms per `Raft`; these are diagnostics, and thousands of idle
/// groups should not pay 32 KB each for them.
pub(crate) fn small_histogram<T>() -> base2histogram::Histogram<T> {
    base2histogram::Histogram::with_log_scale(1, 1)
}

pub use self::display_mode::DisplayMode;
pub use self::runtime_stats::RuntimeStats;
pub use self::runtime_stats_display::RuntimeStatsDisplay;
