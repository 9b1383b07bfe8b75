//! State shared by every actor of one broker: the store, the metadata plane
//! once open, the live actor handles the data path looks up, long-poll
//! notifiers and metrics. One `Shared` per broker, never process-global, so
//! several brokers share a test process.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use malachi_cluster::cursor::CursorKey;
use malachi_cluster::group::{TcpTransport, TransportServer};
use malachi_cluster::model::SegmentId;
use malachi_cluster::ring::VnodeId;
use malachi_storage::FileStore;
use malachi_supervision::{BoundedRef, SupervisorRef};
use parking_lot::{Mutex, RwLock};
use ractor::ActorRef;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::BrokerConfig;
use crate::coordinator::CoordinatorMsg;
use crate::metadata::{MetadataError, MetadataPlane};
use crate::metrics::BrokerMetrics;
use crate::segment::SegmentMsg;

/// This broker's end of the raft transport: the listener bound at start
/// (before membership, so the identity can carry its address), the address
/// peers reach it on, and the client side shared by every vnode group.
#[derive(Debug)]
pub(crate) struct RaftEndpoint {
    pub listener: Arc<std::net::TcpListener>,
    pub addr: SocketAddr,
    pub transport: Arc<TcpTransport>,
    /// The server of the current `vnodes` actor; a crashed predecessor's is
    /// still here (post_stop does not run after a failure) and is stopped
    /// before a new one serves the same listener.
    pub server: Mutex<Option<Arc<TransportServer>>>,
}

/// The live actor of one open segment.
#[derive(Debug, Clone)]
pub(crate) struct SegmentHandle {
    pub actor: BoundedRef<SegmentMsg>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub config: BrokerConfig,
    pub store: Arc<FileStore>,
    pub clock: Arc<dyn Clock>,
    pub cursor_key: CursorKey,
    pub metrics: BrokerMetrics,
    pub client_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub plane: RwLock<Option<Arc<dyn MetadataPlane>>>,
    /// The coordinator manager: the front door of every coordinator request
    /// on this broker (it hands each to the coordinator of the topic's vnode).
    pub coordinator: RwLock<Option<ActorRef<CoordinatorMsg>>>,
    /// The coordinator of each vnode this broker leads, registered by the
    /// coordinator itself while it runs.
    pub coordinators: RwLock<BTreeMap<VnodeId, ActorRef<CoordinatorMsg>>>,
    /// The `coordinator_manager` supervisor, which the manager adds
    /// coordinators to.
    pub coordinator_sup: RwLock<Option<SupervisorRef>>,
    pub root: RwLock<Option<SupervisorRef>>,
    pub storage: RwLock<Option<SupervisorRef>>,
    pub listener: RwLock<Option<SupervisorRef>>,
    pub segments: Mutex<HashMap<SegmentId, SegmentHandle>>,
    topics: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Set once the acceptor serves; cleared when shutdown begins.
    pub accepting: AtomicBool,
    /// Cancelled when an ordered shutdown begins: connections stop reading.
    pub draining: CancellationToken,
    pub connections: AtomicUsize,
    /// Requests read from clients and not yet answered, over all connections.
    pub requests_inflight: AtomicUsize,
    /// The highest `requests_inflight` one connection ever reached.
    pub connection_inflight_peak: AtomicUsize,
    /// Membership and the node fabric, set once at broker start.
    pub cluster: std::sync::OnceLock<Arc<crate::node::Fabric>>,
    /// The raft transport's endpoint, set once at broker start.
    pub raft: std::sync::OnceLock<Arc<RaftEndpoint>>,
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: BrokerConfig,
        store: Arc<FileStore>,
        clock: Arc<dyn Clock>,
        cursor_key: CursorKey,
        client_addr: SocketAddr,
        admin_addr: SocketAddr,
    ) -> Shared {
        Shared {
            config,
            store,
            clock,
            cursor_key,
            metrics: BrokerMetrics::new(),
            client_addr,
            admin_addr,
            plane: RwLock::new(None),
            coordinator: RwLock::new(None),
            coordinators: RwLock::new(BTreeMap::new()),
            coordinator_sup: RwLock::new(None),
            root: RwLock::new(None),
            storage: RwLock::new(None),
            listener: RwLock::new(None),
            segments: Mutex::new(HashMap::new()),
            topics: Mutex::new(HashMap::new()),
            accepting: AtomicBool::new(false),
            draining: CancellationToken::new(),
            connections: AtomicUsize::new(0),
            requests_inflight: AtomicUsize::new(0),
            connection_inflight_peak: AtomicUsize::new(0),
            cluster: std::sync::OnceLock::new(),
            raft: std::sync::OnceLock::new(),
        }
    }

    pub fn plane(&self) -> Result<Arc<dyn MetadataPlane>, MetadataError> {
        self.plane.read().clone().ok_or(MetadataError::NotOpen)
    }

    pub fn segment(&self, id: SegmentId) -> Option<SegmentHandle> {
        self.segments.lock().get(&id).cloned()
    }

    /// A receiver that changes whenever records of `topic` become durable.
    pub fn watch_topic(&self, topic: &str) -> watch::Receiver<u64> {
        let mut topics = self.topics.lock();
        topics
            .entry(topic.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Wakes the long polls of `topic`.
    pub fn notify_topic(&self, topic: &str) {
        let topics = self.topics.lock();
        if let Some(sender) = topics.get(topic) {
            sender.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    pub fn forget_topic(&self, topic: &str) {
        self.topics.lock().remove(topic);
    }

    pub fn is_ready(&self) -> bool {
        self.plane.read().is_some()
            && self.coordinator.read().is_some()
            && self.root.read().is_some()
            && self.accepting.load(Ordering::SeqCst)
    }
}
