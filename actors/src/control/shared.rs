//! The broker context of the control plane and the layers above it
//! (`serve`, `admin`, `broker`): the metadata plane once open, the
//! coordinator manager and coordinators, the raft endpoint, the node fabric,
//! the data plane's [`Storage`], lifecycle flags and counters. One `Shared`
//! per broker, never process-global, so several brokers share a test
//! process.
//!
//! Lower layers never see it: a segment actor gets the data plane's
//! [`Storage`] and a [`Roller`](crate::data::segment::Roller), the
//! membership actors get the [`Fabric`] and the root's [`SupervisorSlot`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use malachi_cluster::group::{TcpTransport, TransportServer};
use malachi_core::model::SegmentId;
use malachi_core::ring::VnodeId;
use malachi_storage::SegmentStore;
use malachi_supervision::SupervisorRef;
use parking_lot::{Mutex, RwLock};
use ractor::ActorRef;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cursor_keys::CursorKeyState;
use super::metadata::MetadataPlane;
use super::requests::CoordinatorMsg;
use crate::common::SupervisorSlot;
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
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub config: BrokerConfig,
    /// The same store as `data.store`.
    pub store: Arc<dyn SegmentStore>,
    pub clock: Arc<dyn Clock>,
    /// The cluster's cursor keys once learned (ADR 0096).
    pub cursor_keys: CursorKeyState,
    pub metrics: Arc<BrokerMetrics>,
    /// The data plane: segment actors, their supervisor, long-poll notifiers.
    pub data: Arc<Storage>,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub plane: RwLock<Option<Arc<dyn MetadataPlane>>>,
    /// The coordinator manager: the front door of every coordinator request
    /// on this broker (it hands each to the coordinator of the topic's vnode).
    pub coordinator: RwLock<Option<ActorRef<CoordinatorMsg>>>,
    /// The coordinator of each vnode this broker leads, registered by the
    /// coordinator itself while it runs.
    pub coordinators: RwLock<BTreeMap<VnodeId, ActorRef<CoordinatorMsg>>>,
    /// Each vnode's coordinator lease on this broker, registered by the
    /// coordinator when it takes one; `/metrics` reads them
    /// (`malachi_coordinator_lease_held`).
    pub lease_probes: parking_lot::Mutex<BTreeMap<VnodeId, crate::control::lease::LeaseProbe>>,
    /// The failover actor (`maintenance/failover`), registered by itself
    /// while it runs; coordinators hand it the segments to fail over.
    pub failover: RwLock<Option<ActorRef<crate::control::requests::FailoverMsg>>>,
    /// The healer (`maintenance/healer`), registered by itself while it runs.
    pub healer: RwLock<Option<ActorRef<crate::control::requests::HealMsg>>>,
    /// Copies of segments this broker wrote and that were sealed without it,
    /// already settled at their seal (`coordinator::reconcile`), so a pass
    /// does not open them again.
    pub settled: parking_lot::Mutex<std::collections::BTreeSet<malachi_core::model::SegmentId>>,
    /// Writers here whose roll the metadata refused for good (a segment
    /// sealed without them: its range split or merged away, a failover
    /// elsewhere), each with its topic, reported through their `Roller`:
    /// `coordinator::reconcile` stops them and settles their copies at the
    /// recorded seal (chaos finding F7).
    pub refused:
        parking_lot::Mutex<std::collections::BTreeMap<malachi_core::model::SegmentId, String>>,
    /// The cluster's storage policies as this broker last read them from
    /// the ring's group (every retention pass, and each policy change made
    /// through this broker): what placement reads without a round trip
    /// (ADR 0115, 0116).
    pub policy_cache:
        RwLock<std::collections::BTreeMap<String, malachi_core::model::StoragePolicy>>,
    /// The `coordinator_manager` supervisor, which the manager adds
    /// coordinators to.
    pub coordinator_sup: RwLock<Option<SupervisorRef>>,
    /// The root supervisor, shared with the node fabric (`tree --all`).
    pub root: SupervisorSlot,
    pub listener: RwLock<Option<SupervisorRef>>,
    /// Set once the acceptor serves; cleared when shutdown begins.
    pub accepting: AtomicBool,
    /// Cancelled when an ordered shutdown begins: connections stop reading.
    pub draining: CancellationToken,
    pub connections: AtomicUsize,
    /// Requests read from clients and not yet answered, over all connections.
    pub requests_inflight: AtomicUsize,
    /// The highest `requests_inflight` one connection ever reached.
    pub connection_inflight_peak: AtomicUsize,
    /// The client port's broker-wide memory budgets.
    pub budgets: crate::common::budget::Budgets,
    /// Membership and the node fabric, set once at broker start.
    pub cluster: std::sync::OnceLock<Arc<Fabric>>,
    /// The raft transport's endpoint, set once at broker start.
    pub raft: std::sync::OnceLock<Arc<RaftEndpoint>>,
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
    pub hold: AtomicBool,
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
        Shared {
            config,
            store,
            clock,
            cursor_keys: CursorKeyState::new(cursor_bootstrap),
            metrics,
            data,
            client_addr,
            admin_addr,
            plane: RwLock::new(None),
            coordinator: RwLock::new(None),
            coordinators: RwLock::new(BTreeMap::new()),
            lease_probes: parking_lot::Mutex::new(BTreeMap::new()),
            failover: RwLock::new(None),
            healer: RwLock::new(None),
            settled: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
            refused: parking_lot::Mutex::new(std::collections::BTreeMap::new()),
            policy_cache: RwLock::new(std::collections::BTreeMap::new()),
            coordinator_sup: RwLock::new(None),
            root: SupervisorSlot::default(),
            listener: RwLock::new(None),
            accepting: AtomicBool::new(false),
            draining: CancellationToken::new(),
            connections: AtomicUsize::new(0),
            requests_inflight: AtomicUsize::new(0),
            connection_inflight_peak: AtomicUsize::new(0),
            budgets,
            cluster: std::sync::OnceLock::new(),
            raft: std::sync::OnceLock::new(),
            #[cfg(feature = "testing")]
            failover_hold: FailoverHold::default(),
        }
    }

    pub fn plane(&self) -> Result<Arc<dyn MetadataPlane>, MetadataError> {
        self.plane.read().clone().ok_or(MetadataError::NotOpen)
    }

    /// Membership and the node fabric, once the broker started.
    pub fn fabric(&self) -> Option<Arc<Fabric>> {
        self.cluster.get().cloned()
    }

    pub fn segment(&self, id: SegmentId) -> Option<SegmentHandle> {
        self.data.segment(id)
    }

    /// A receiver that changes whenever records of `topic` become durable.
    pub fn watch_topic(&self, topic: &str) -> watch::Receiver<u64> {
        self.data.watch_topic(topic)
    }

    pub fn forget_topic(&self, topic: &str) {
        self.data.forget_topic(topic);
    }

    pub fn is_ready(&self) -> bool {
        self.plane.read().is_some()
            && self.coordinator.read().is_some()
            && self.root.read().is_some()
            && self.accepting.load(Ordering::SeqCst)
            && !self.data.space.is_full()
            // A raft replica a full volume stopped is not serving until
            // the space worker reopens it.
            && self
                .plane
                .read()
                .as_ref()
                .and_then(|plane| plane.host().map(|h| h.stopped_by_full_volume().is_empty()))
                .unwrap_or(true)
    }
}
