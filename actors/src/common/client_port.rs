//! The client port's state, read by `serve` and by the broker's lifecycle:
//! whether it accepts, the drain signal, connection and request counts, the
//! broker-wide memory budgets of requests and responses, and the connections
//! and byte shares of each client address (ADR 0145).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use tokio_util::sync::CancellationToken;

use super::addresses::AddressTable;
use super::budget::{AddressBudget, Budgets};

#[derive(Debug)]
pub(crate) struct ClientPortState {
    /// Set once the acceptor serves; cleared when shutdown begins.
    pub accepting: AtomicBool,
    /// Cancelled when an ordered shutdown begins: connections stop reading.
    pub draining: CancellationToken,
    pub connections: AtomicUsize,
    /// Requests read from clients and not yet answered, over all connections.
    pub requests_inflight: AtomicUsize,
    /// The highest `requests_inflight` one connection ever reached.
    pub connection_inflight_peak: AtomicUsize,
    /// The broker-wide memory budgets.
    pub budgets: Budgets,
    /// Connections per client address, and what each address's connections
    /// share of the budgets.
    pub addresses: Arc<AddressTable<AddressBudget>>,
}

impl ClientPortState {
    pub fn new(budgets: Budgets, addresses: Arc<AddressTable<AddressBudget>>) -> ClientPortState {
        ClientPortState {
            accepting: AtomicBool::new(false),
            draining: CancellationToken::new(),
            connections: AtomicUsize::new(0),
            requests_inflight: AtomicUsize::new(0),
            connection_inflight_peak: AtomicUsize::new(0),
            budgets,
            addresses,
        }
    }
}
