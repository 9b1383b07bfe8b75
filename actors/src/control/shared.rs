//! The broker context of the control plane and the layers above it
//! (`serve`, `admin`, `maintenance`, `broker`), split by reader:
//! - `port` ([`ClientPortState`]): the client port's flags, counters and
//!   memory budgets, read by `serve` and the broker's lifecycle;
//! - `memory` ([`ControlMemory`]): what the control plane remembers between
//!   passes (cursor keys, leases held, settled and refused copies, the
//!   policy cache);
//! - `actors` ([`ActorRegistry`]): the metadata plane and the long-lived
//!   actors others send to, each registered by itself while it runs;
//! - `links` ([`ClusterLinks`]): membership, the node fabric and the raft
//!   endpoint.
//!
//! Beside them, what every layer reads: configuration, clock, metrics and
//! the data plane's [`Storage`]. One `Shared` per broker, never
//! process-global, so several brokers share a test process.
//!
//! Lower layers never see it: a segment actor gets the data plane's
//! [`Storage`] and a [`Roller`](crate::data::segment::Roller), the
//! membership actors get the [`Fabric`] and the root's supervisor slot.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use malachi_cluster::group::{TcpTransport, TransportServer};
use malachi_core::model::{NodeId, SegmentId};
use malachi_storage::SegmentStore;
use parking_lot::Mutex;

use super::cursor_keys::CursorKeyState;
use super::memory::ControlMemory;
use super::metadata::MetadataPlane;
use super::registry::ActorRegistry;
use crate::common::client_port::ClientPortState;
use crate::common::clock::Clock;
use crate::common::config::BrokerConfig;
use crate::common::error::MetadataError;
use crate::common::metrics::BrokerMetrics;
use crate::data::storage::{SegmentHandle, Storage};
use crate::fabric::node::Fabric;

/// This broker's end of the raft transport: the listener bound at start
/// (before membership, so the identity can carry its address), the address
/// peers reach it on, and the client side shared by every vnode group.
#[derive(Debug)]
pub(crate) struct RaftEndpoint {
    pub listener: Arc<std::net::TcpListener>,
    pub addr: SocketAddr,
    pub transport: Arc<TcpTransport>,
    /// Connections of their own to the same ports, for replica-appends
    /// (ADR 0095): bulk data never queues with raft's heartbeats.
    pub replication: Arc<TcpTransport>,
    /// The server of the current `vnodes` actor; a crashed predecessor's is
    /// still here (post_stop does not run after a failure) and is stopped
    /// before a new one serves the same listener.
    pub server: Mutex<Option<Arc<TransportServer>>>,
    /// Requests the port served, by api key (`cluster_port.rs`).
    pub port_counts: PortCounts,
    /// Whether each peer's cluster port can be reached from here, judged
    /// from both transports' dials (ADR 0155).
    pub reach: Arc<malachi_cluster::group::PeerReach>,
}

/// Requests this broker's cluster port served, by api key: one entry per
/// key ever served, so bounded by the keys the port knows.
#[derive(Debug, Default)]
pub(crate) struct PortCounts {
    served: Mutex<BTreeMap<u16, u64>>,
}

impl PortCounts {
    pub(crate) fn count(&self, api_key: u16) {
        *self.served.lock().entry(api_key).or_default() += 1;
    }

    /// Requests with `api_key` served since the broker started.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn served(&self, api_key: u16) -> u64 {
        self.served.lock().get(&api_key).copied().unwrap_or(0)
    }
}

/// Membership, the node fabric and the raft transport's endpoint: how this
/// broker reaches the others. Each is set once at broker start.
#[derive(Debug, Default)]
pub(crate) struct ClusterLinks {
    pub fabric: std::sync::OnceLock<Arc<Fabric>>,
    pub raft: std::sync::OnceLock<Arc<RaftEndpoint>>,
}

impl ClusterLinks {
    /// Membership and the node fabric, once the broker started.
    pub fn fabric(&self) -> Option<Arc<Fabric>> {
        self.fabric.get().cloned()
    }

    /// The peers whose cluster port this broker judges unreachable now
    /// (ADR 0155): placement leaves them out. Empty before the raft port
    /// is set up.
    pub fn unreachable(&self) -> std::collections::BTreeSet<u64> {
        self.raft
            .get()
            .map(|raft| {
                raft.reach
                    .all()
                    .into_iter()
                    .filter(|(_, reach)| *reach == malachi_cluster::group::Reach::Unreachable)
                    .map(|(peer, _)| peer)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How this broker judges peer `node`'s cluster port now (ADR 0155).
    pub fn reach_of(&self, node: u64) -> malachi_cluster::group::Reach {
        self.raft
            .get()
            .map_or(malachi_cluster::group::Reach::Unknown, |raft| {
                raft.reach.judge(node)
            })
    }

    /// Whether membership calls broker `node` dead, as broker `me` sees
    /// it. A broker membership does not know (a lone broker, or one not
    /// heard of yet) is not dead, nor is `me`.
    pub fn is_dead(&self, me: NodeId, node: NodeId) -> bool {
        if node == me {
            return false;
        }
        let Some(fabric) = self.fabric.get() else {
            return false;
        };
        fabric
            .membership
            .view()
            .get(node.0)
            .is_some_and(|m| !m.state.is_live())
    }
}

/// The broker's context, split by reader: the client port's state
/// (`port`), the control plane's memory (`memory`), the registry of its
/// long-lived actors (`actors`) and its links to the other brokers
/// (`links`), beside what every layer reads (configuration, clock,
/// metrics, the data plane). A layer that needs one part is given that
/// part's `Arc`, not the whole.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: BrokerConfig,
    /// The same store as `data.store`.
    pub store: Arc<dyn SegmentStore>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<BrokerMetrics>,
    /// The data plane: segment actors, their supervisor, long-poll notifiers.
    pub data: Arc<Storage>,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub port: Arc<ClientPortState>,
    /// Each range's write rate here, and the recent automatic reshapes
    /// (ADR 0143).
    pub rates: Arc<crate::common::rates::RangeRates>,
    pub memory: Arc<ControlMemory>,
    pub actors: Arc<ActorRegistry>,
    pub links: Arc<ClusterLinks>,
    /// TLS on the client and admin ports (ADR 0149), set once at start
    /// when `[tls]` is configured.
    pub tls: std::sync::OnceLock<Arc<crate::common::tls::ServerTls>>,
    /// Test hook: failovers hold after their fences while set.
    #[cfg(feature = "testing")]
    pub failover_hold: FailoverHold,
}

/// Test hook (`BrokerHandle::hold_failovers`): while `hold` is set, a
/// failover stops after its fences, before it decides the seal, so a test
/// can change the coordinator in the middle of one. `held` counts the
/// failovers that stopped there.
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
pub(crate) struct FailoverHold {
    pub hold: std::sync::atomic::AtomicBool,
    pub held: std::sync::atomic::AtomicU64,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: BrokerConfig,
        store: Arc<dyn SegmentStore>,
        clock: Arc<dyn Clock>,
        cursor_bootstrap: malachi_core::model::CursorSecret,
        client_addr: SocketAddr,
        admin_addr: SocketAddr,
    ) -> Shared {
        let metrics = Arc::new(BrokerMetrics::new());
        let data = Arc::new(Storage::new(
            config.clone(),
            Arc::clone(&store),
            Arc::clone(&clock),
            Arc::clone(&metrics),
        ));
        let budgets = crate::common::budget::Budgets {
            request: crate::common::budget::Budget::new(
                config.request_bytes_budget,
                metrics.request_bytes_in_use.clone(),
            ),
            response: crate::common::budget::Budget::new(
                config.response_bytes_budget,
                metrics.response_bytes_in_use.clone(),
            ),
        };
        let (request_share, response_share) = (
            config.address_request_bytes_max,
            config.address_response_bytes_max,
        );
        let addresses = crate::common::addresses::AddressTable::new(
            config.address_connections_max,
            move || crate::common::budget::AddressBudget::new(request_share, response_share),
        );
        let rates = Arc::new(crate::common::rates::RangeRates::new(
            config.reshape.rate_window_ms,
        ));
        Shared {
            rates,
            config,
            store,
            clock,
            metrics,
            data,
            client_addr,
            admin_addr,
            port: Arc::new(ClientPortState::new(budgets, addresses)),
            memory: Arc::new(ControlMemory::new(CursorKeyState::new(cursor_bootstrap))),
            actors: Arc::new(ActorRegistry::default()),
            links: Arc::new(ClusterLinks::default()),
            tls: std::sync::OnceLock::new(),
            #[cfg(feature = "testing")]
            failover_hold: FailoverHold::default(),
        }
    }

    pub fn plane(&self) -> Result<Arc<dyn MetadataPlane>, MetadataError> {
        self.actors.plane()
    }

    /// Membership and the node fabric, once the broker started.
    pub fn fabric(&self) -> Option<Arc<Fabric>> {
        self.links.fabric()
    }

    pub fn segment(&self, id: SegmentId) -> Option<SegmentHandle> {
        self.data.segment(id)
    }

    pub fn forget_topic(&self, topic: &str) {
        self.data.forget_topic(topic);
    }

    pub fn is_ready(&self) -> bool {
        is_ready(&self.actors, &self.port, &self.data)
    }
}

/// Whether the broker is ready for traffic: the metadata plane open, the
/// coordinator manager and the tree up, the client port accepting, the
/// data volume with room, and no raft replica stopped by a full volume.
/// Of the parts alone, so the admin server asks it without the context.
pub(crate) fn is_ready(actors: &ActorRegistry, port: &ClientPortState, data: &Storage) -> bool {
    actors.plane_is_open()
        && actors.manager().get().is_some()
        && actors.root().is_some()
        && port.accepting.load(Ordering::SeqCst)
        && !data.space.is_full()
        // A raft replica a full volume stopped is not serving until
        // the space worker reopens it.
        && actors
            .plane()
            .ok()
            .and_then(|plane| plane.host().map(|h| h.stopped_by_full_volume().is_empty()))
            .unwrap_or(true)
}
