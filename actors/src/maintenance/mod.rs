//! `maintenance` (one_for_one): the broker's background upkeep of its data.
//!
//! Empty today. It is where the planned upkeep actors go, each a permanent
//! worker child started here: `failover` (seal a segment whose writer is
//! gone and open its successor elsewhere), `self_healing` (re-replicate
//! copies lost with a broker), `scrubber` (re-read sealed copies against
//! their checksums), `retention` (seal and delete by age and size) and
//! `orphan_sweeper` (delete the files of segments no metadata knows, once
//! the delete is committed everywhere). None of them exists yet: records
//! have one copy each until the data plane replicates.
//!
//! The supervisor is in the live tree already so operators and tests see
//! the shape the next issues fill in, and so adding an actor here changes
//! one function and no tree above it.

use malachi_supervision::{Strategy, SupervisorArgs};

/// The `maintenance` supervisor, with no children yet (OTP's default
/// restart intensity).
pub(crate) fn supervisor() -> SupervisorArgs {
    SupervisorArgs::new("maintenance", Strategy::OneForOne)
}
