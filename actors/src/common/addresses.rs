//! Per source address admission (ADR 0145): how many connections one client
//! address holds on a port, and what else its connections share (the client
//! port's per-address byte budgets).
//!
//! An [`AddressTable`] counts the connections of each address; `admit`
//! hands out an [`AddressSlot`] while the address is under
//! `connections_max`, and the slot gives its place back when dropped (the
//! connection closed), forgetting an address whose last connection went.
//! So one host cannot take every slot of a port, and the table holds at
//! most one entry per open connection.
//!
//! An address is the IP alone (the port is the client's choice); an
//! IPv4-mapped IPv6 address counts as its IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

/// The connections each address holds on one port, and what they share.
pub(crate) struct AddressTable<T> {
    connections_max: usize,
    entries: Mutex<HashMap<IpAddr, (usize, Arc<T>)>>,
    make: Box<dyn Fn() -> T + Send + Sync>,
}

impl<T> std::fmt::Debug for AddressTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressTable")
            .field("connections_max", &self.connections_max)
            .field("addresses", &self.entries.lock().len())
            .finish()
    }
}

impl<T> AddressTable<T> {
    /// A table admitting `connections_max` connections per address; `make`
    /// builds what a new address's connections share.
    pub(crate) fn new(
        connections_max: usize,
        make: impl Fn() -> T + Send + Sync + 'static,
    ) -> Arc<AddressTable<T>> {
        assert!(
            connections_max > 0,
            "connections per address are validated positive"
        );
        Arc::new(AddressTable {
            connections_max,
            entries: Mutex::new(HashMap::new()),
            make: Box::new(make),
        })
    }

    pub(crate) fn connections_max(&self) -> usize {
        self.connections_max
    }

    /// A slot for one more connection from `ip`, or `None` when that
    /// address already holds `connections_max`.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot<T>> {
        let ip = ip.to_canonical();
        let mut entries = self.entries.lock();
        let (count, shared) = entries
            .entry(ip)
            .or_insert_with(|| (0, Arc::new((self.make)())));
        if *count >= self.connections_max {
            return None;
        }
        *count += 1;
        let shared = Arc::clone(shared);
        Some(AddressSlot {
            table: Arc::clone(self),
            ip,
            shared,
        })
    }

    /// Connections `ip` holds now.
    #[allow(dead_code)]
    pub(crate) fn connections(&self, ip: IpAddr) -> usize {
        self.entries
            .lock()
            .get(&ip.to_canonical())
            .map_or(0, |(count, _)| *count)
    }

    fn release(&self, ip: IpAddr) {
        let mut entries = self.entries.lock();
        if let Some((count, _)) = entries.get_mut(&ip) {
            assert!(*count > 0, "an address slot is released once");
            *count -= 1;
            if *count == 0 {
                entries.remove(&ip);
            }
        }
    }
}

/// One connection's place in its address's count; given back on drop.
pub(crate) struct AddressSlot<T> {
    table: Arc<AddressTable<T>>,
    ip: IpAddr,
    shared: Arc<T>,
}

impl<T> AddressSlot<T> {
    /// What the address's connections share.
    pub(crate) fn shared(&self) -> &Arc<T> {
        &self.shared
    }
}

impl<T> std::fmt::Debug for AddressSlot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressSlot").field("ip", &self.ip).finish()
    }
}

impl<T> Drop for AddressSlot<T> {
    fn drop(&mut self) {
        self.table.release(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_and_gets_it_back_on_close() {
        let table = AddressTable::new(2, || ());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = table.admit(a).unwrap();
        let second = table.admit(a).unwrap();
        assert!(table.admit(a).is_none(), "a third from one address");
        // Another address is not held up by it.
        let other = table.admit(b).unwrap();
        drop(first);
        let again = table.admit(a).unwrap();
        assert_eq!(table.connections(a), 2);
        drop((second, again, other));
        assert_eq!(table.connections(a), 0);
        assert!(
            table.entries.lock().is_empty(),
            "closed addresses are forgotten"
        );
    }

    #[test]
    fn a_mapped_ipv4_address_counts_as_itself() {
        let table = AddressTable::new(1, || ());
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let _held = table.admit(v4).unwrap();
        assert!(table.admit(mapped).is_none());
    }
}
