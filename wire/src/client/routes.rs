//! Where each range's parts go before any broker redirected them (ADR
//! 0142): the topic's range map names each active range's primary (its
//! active segment's first replica), and `cluster_status` names each
//! broker's client address. A producer that loads a topic's layout seeds a
//! route per active range with its primary's address, so its first batch
//! goes straight to every range's writer; a `not_leader` or `moved` hint
//! refreshes a route as before (ADR 0129), and a primary whose address the
//! client does not know leaves the range on today's route (the topic's, or
//! the default broker's).
//!
//! Bounds: the members kept are the brokers one `cluster_status` lists (at
//! most `KNOWN_ADDRS_MAX`), replaced whole by the next answer; routes stay
//! within `RANGE_ROUTES_MAX` (`remember_range`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::debug;

use super::{Client, DISCOVERY_TIMEOUT_MS, KNOWN_ADDRS_MAX, left_ms};
use crate::messages::{BrokerState, BrokerStatus, ClusterStatusRequest, Message as _};

impl Client {
    /// Redirects this client followed: `not_leader` or `moved` refusals
    /// whose hint it resent to, and `moved` refusals that made a producer
    /// reload its topic's layout. A producer that routes from the range
    /// map follows a few per reshape or failover, not one per batch.
    pub fn redirects_followed(&self) -> u64 {
        self.inner.redirects_followed.load(Ordering::Relaxed)
    }

    /// Counts one redirect followed (see [`Client::redirects_followed`]).
    pub(super) fn note_redirect(&self) {
        self.inner
            .redirects_followed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Replaces the node id to client address map with the live brokers of
    /// a `cluster_status` answer (a dead one is not routed to).
    pub(super) fn learn_members(&self, brokers: &[BrokerStatus]) {
        let members: HashMap<u64, String> = brokers
            .iter()
            .filter(|b| b.state != BrokerState::Dead && !b.client_addr.is_empty())
            .take(KNOWN_ADDRS_MAX)
            .map(|b| (b.node_id, b.client_addr.clone()))
            .collect();
        let mut state = self.state();
        state.members = members;
        debug_assert!(state.members.len() <= KNOWN_ADDRS_MAX);
    }

    /// Seeds the route of each `(range, primary node)` of `topic` that has
    /// none yet with the primary's client address; a route learned from a
    /// hint stands (it is as fresh as the description, and a wrong one is
    /// corrected by the next hint). Returns the ranges whose primary's
    /// address is not known: they keep today's route.
    pub(super) fn seed_ranges(&self, topic: &str, primaries: &[(u64, u64)]) -> Vec<u64> {
        let now = Instant::now();
        let mut unknown = Vec::new();
        let mut seeded = Vec::new();
        {
            let state = self.state();
            for &(range, node) in primaries {
                if state.ranges.contains_key(&(topic.to_owned(), range)) {
                    continue;
                }
                match state.members.get(&node) {
                    // A broker that just let a request time out is not
                    // routed to from the map either (ADR 0128).
                    Some(addr) if !state.suspects.suspected(addr, now) => {
                        seeded.push((range, addr.clone()));
                    }
                    Some(_) => {}
                    None => unknown.push(range),
                }
            }
        }
        for (range, addr) in &seeded {
            self.remember_range(topic, *range, addr);
        }
        debug!(%topic, seeded = seeded.len(), unknown = unknown.len(), "range routes seeded from the range map");
        unknown
    }

    /// Forgets the routes of `topic`'s ranges that `active` says are no
    /// longer active (split or merged away): their parts are routed again
    /// on the new layout, and the bound is not spent on dead ranges.
    pub(super) fn forget_ranges(&self, topic: &str, active: impl Fn(u64) -> bool) {
        self.state()
            .ranges
            .retain(|(t, range), _| t != topic || active(*range));
    }

    /// Asks a broker this client is connected to (`addr` first, else the
    /// default one, else any) for the cluster's brokers, their addresses
    /// and node ids, within `DISCOVERY_TIMEOUT_MS` and `deadline`; a
    /// failure only leaves them unknown.
    pub(super) async fn ask_members(&self, addr: Option<&str>, deadline: Instant) {
        let addr = addr.map_or_else(|| self.addr_for(None), str::to_owned);
        let connection = {
            let state = self.state();
            let open = |a: &str| state.connections.get(a).filter(|c| c.usable()).cloned();
            open(&addr).or_else(|| state.connections.values().find(|c| c.usable()).cloned())
        };
        let Some(connection) = connection else {
            return;
        };
        let timeout_ms = DISCOVERY_TIMEOUT_MS.min(left_ms(deadline)).max(1);
        let Ok(payload) = ClusterStatusRequest {}.encode() else {
            return;
        };
        match self
            .exchange_payload::<ClusterStatusRequest>(&connection, payload, timeout_ms)
            .await
        {
            Ok(status) => {
                for broker in &status.brokers {
                    if !broker.client_addr.is_empty() {
                        self.learn(&broker.client_addr);
                    }
                }
                self.learn_members(&status.brokers);
                debug!(
                    from = connection.addr(),
                    brokers = status.brokers.len(),
                    "learned the cluster's brokers"
                );
            }
            Err(error) => {
                debug!(from = connection.addr(), %error, "could not learn the cluster's brokers")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ClientConfig, Inner, RouteState};
    use super::*;
    use std::sync::{Arc, Mutex};

    fn offline() -> Client {
        Client {
            inner: Arc::new(Inner {
                config: ClientConfig::default(),
                state: Mutex::new(RouteState {
                    default_addr: "boot:1".into(),
                    ..RouteState::default()
                }),
                redirects_followed: Default::default(),
            }),
        }
    }

    fn broker(node_id: u64, addr: &str, state: BrokerState) -> BrokerStatus {
        BrokerStatus {
            node_id,
            state,
            client_addr: addr.into(),
            ..BrokerStatus::default()
        }
    }

    #[test]
    fn each_range_is_seeded_with_its_primarys_address() {
        let client = offline();
        client.learn_members(&[
            broker(1, "one:1", BrokerState::Alive),
            broker(2, "two:1", BrokerState::Suspect),
        ]);
        let unknown = client.seed_ranges("t", &[(10, 1), (11, 2), (12, 3)]);
        assert_eq!(unknown, [12]);
        assert_eq!(client.addr_for_range("t", 10), "one:1");
        assert_eq!(client.addr_for_range("t", 11), "two:1");
        // Unknown primary: today's route (the default broker here).
        assert_eq!(client.addr_for_range("t", 12), "boot:1");
        assert_eq!(client.addr_for_range("other", 10), "boot:1");
    }

    #[test]
    fn a_hinted_route_stands_and_dead_or_suspected_primaries_are_not_seeded() {
        let client = offline();
        client.learn_members(&[
            broker(1, "one:1", BrokerState::Alive),
            broker(2, "two:1", BrokerState::Dead),
            broker(3, "three:1", BrokerState::Alive),
        ]);
        client.remember_range("t", 10, "hinted:1");
        client.suspect("three:1");
        let unknown = client.seed_ranges("t", &[(10, 1), (11, 2), (12, 3)]);
        assert_eq!(unknown, [11], "a dead broker is not a member to route to");
        assert_eq!(client.addr_for_range("t", 10), "hinted:1");
        assert_eq!(client.addr_for_range("t", 11), "boot:1");
        assert_eq!(client.addr_for_range("t", 12), "boot:1");
    }

    #[test]
    fn routes_of_ranges_no_longer_active_are_forgotten_and_members_replaced() {
        let client = offline();
        client.learn_members(&[broker(1, "one:1", BrokerState::Alive)]);
        client.seed_ranges("t", &[(1, 1), (2, 1)]);
        client.remember_range("u", 1, "one:1");
        client.forget_ranges("t", |range| range != 1);
        assert_eq!(client.addr_for_range("t", 1), "boot:1");
        assert_eq!(client.addr_for_range("t", 2), "one:1");
        assert_eq!(client.addr_for_range("u", 1), "one:1", "another topic's");
        client.learn_members(&[broker(2, "two:1", BrokerState::Alive)]);
        assert_eq!(client.seed_ranges("t", &[(3, 1)]), [3]);
        assert_eq!(client.redirects_followed(), 0);
        client.note_redirect();
        assert_eq!(client.redirects_followed(), 1);
    }
}
