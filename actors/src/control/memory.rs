//! The control plane's memory on this broker: what coordinators and the
//! removal and policy paths remember between passes, none of it durable
//! (the metadata is; this is what saves a round trip or a repeated step).

use std::collections::{BTreeMap, BTreeSet};

use malachi_core::model::{SegmentId, StoragePolicy};
use malachi_core::ring::VnodeId;
use parking_lot::{Mutex, RwLock};

use super::cursor_keys::CursorKeyState;
use super::lease::LeaseProbe;

#[derive(Debug)]
pub(crate) struct ControlMemory {
    /// The cluster's cursor keys once learned (ADR 0096).
    pub cursor_keys: CursorKeyState,
    /// Each vnode's coordinator lease on this broker, registered by the
    /// coordinator when it takes one; `/metrics` reads them
    /// (`malachi_coordinator_lease_held`).
    pub lease_probes: Mutex<BTreeMap<VnodeId, LeaseProbe>>,
    /// Copies of segments this broker wrote and that were sealed without it,
    /// already settled at their seal (`coordinator::reconcile`), so a pass
    /// does not open them again.
    pub settled: Mutex<BTreeSet<SegmentId>>,
    /// Writers here whose roll the metadata refused for good (a segment
    /// sealed without them: its range split or merged away, a failover
    /// elsewhere), each with its topic, reported through their `Roller`:
    /// `coordinator::reconcile` stops them and settles their copies at the
    /// recorded seal (chaos finding F7).
    pub refused: Mutex<BTreeMap<SegmentId, String>>,
    /// The cluster's storage policies as this broker last read them from
    /// the ring's group (every retention pass, and each policy change made
    /// through this broker): what placement reads without a round trip
    /// (ADR 0115, 0116).
    pub policy_cache: RwLock<BTreeMap<String, StoragePolicy>>,
}

impl ControlMemory {
    pub fn new(cursor_keys: CursorKeyState) -> ControlMemory {
        ControlMemory {
            cursor_keys,
            lease_probes: Mutex::new(BTreeMap::new()),
            settled: Mutex::new(BTreeSet::new()),
            refused: Mutex::new(BTreeMap::new()),
            policy_cache: RwLock::new(BTreeMap::new()),
        }
    }
}
