//! Faults a test arms in a broker's background work (`testing` feature
//! only; production builds have neither this module nor its call sites).
//!
//! A worker names a trip point in its work (`trip(broker, "space")`); a
//! test arms it through `BrokerHandle::fail_work`, and the worker's next
//! pass panics there, as a bug in it would. What a restart test checks is
//! that such a panic reaches the supervisor: a loop whose panic nobody
//! sees leaves the tree saying "running" while the work has stopped.
//!
//! The armed faults are process-wide, keyed by the broker's client
//! address: several brokers (and several tests) share one process, and a
//! bound address names one running broker.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

static ARMED: Mutex<BTreeSet<(SocketAddr, String)>> = Mutex::new(BTreeSet::new());

/// Arms `worker`'s trip point in the broker serving clients on `broker`.
pub(crate) fn arm(broker: SocketAddr, worker: &str) {
    ARMED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert((broker, worker.to_owned()));
}

/// Panics, once, if a test armed `worker`'s trip point in `broker`.
pub(crate) fn trip(broker: SocketAddr, worker: &str) {
    let armed = ARMED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&(broker, worker.to_owned()));
    if armed {
        panic!("{worker}: a fault armed by a test");
    }
}
