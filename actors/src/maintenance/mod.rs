//! `maintenance` (one_for_one): the broker's background upkeep of its data.
//!
//! Its children are permanent workers:
//! - `failover` (issue 19, ADR 0106): seals a segment whose primary is gone
//!   and opens its successor on live brokers, for the coordinators of the
//!   vnodes this broker leads.
//!
//! Planned here, not built yet: `self_healing` (re-replicate copies lost
//! with a broker), `scrubber` (re-read sealed copies against their
//! checksums), `retention` (seal and delete by age and size) and
//! `orphan_sweeper` (delete the files of segments no metadata knows, once
//! the delete is committed everywhere). Adding one changes this function
//! and no tree above it.

use std::sync::Arc;

use malachi_supervision::{ChildSpec, Strategy, SupervisorArgs};

use crate::control::shared::Shared;

pub(crate) mod failover;

/// The `maintenance` supervisor and its workers (OTP's default restart
/// intensity).
pub(crate) fn supervisor(shared: &Arc<Shared>) -> SupervisorArgs {
    let failover_shared = Arc::clone(shared);
    SupervisorArgs::new("maintenance", Strategy::OneForOne).child(ChildSpec::worker(
        "failover",
        || failover::FailoverActor,
        move || Arc::clone(&failover_shared),
    ))
}
