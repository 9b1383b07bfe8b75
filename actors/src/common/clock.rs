//! Time as a seam: the coordinator stamps commands (`at_ms`) and segment
//! actors judge segment age through a [`Clock`], so tests can drive time.
//!
//! The project has one `Clock`, in `malachi_cluster::clock` (ADR 0090): the
//! broker reads its wall clock (`now_ms`), the lease keeper its monotonic
//! one, and tests drive both with [`ManualClock`].

pub use malachi_cluster::clock::{Clock, ManualClock, SystemClock};
