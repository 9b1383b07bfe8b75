//! What the `storage` subtree shares: the store, the live segment actors the
//! data path looks up, the long-poll notifiers of durable records, and the
//! `storage` supervisor they run under. One per broker, never
//! process-global.
//!
//! This is the whole of what a segment actor can reach: it names no
//! coordinator, metadata plane or connection. The control plane starts
//! segment actors under [`Storage::supervisor`] and gives each a
//! [`Roller`](super::segment::Roller) to ask for its roll through.

use std::collections::HashMap;
use std::sync::Arc;

use malachi_core::model::SegmentId;
use malachi_storage::SegmentStore;
use malachi_supervision::{BoundedRef, SupervisorRef};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use super::replication::ReplicationState;
use super::segment::SegmentMsg;
use crate::common::clock::Clock;
use crate::common::config::BrokerConfig;
use crate::common::metrics::BrokerMetrics;

/// The live actor of one open segment.
#[derive(Debug, Clone)]
pub(crate) struct SegmentHandle {
    pub actor: BoundedRef<SegmentMsg>,
}

#[derive(Debug)]
pub(crate) struct Storage {
    pub config: BrokerConfig,
    /// The segment store: a `FileStore` unless the broker was started on
    /// another (ADR 0131).
    pub store: Arc<dyn SegmentStore>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<BrokerMetrics>,
    /// The `storage` supervisor, published at each of its starts.
    pub supervisor: RwLock<Option<SupervisorRef>>,
    /// The running actor of each open segment, registered by the actor.
    pub segments: Mutex<HashMap<SegmentId, SegmentHandle>>,
    topics: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Quorum replication: the link to followers, the ReplicationServer,
    /// the segments this broker leads.
    pub replication: ReplicationState,
    /// What the scrubber found of the sealed copies here (ADR 0110).
    pub scrub: super::scrub::ScrubState,
    /// Whether the data volume may take more records (ADR 0111).
    pub space: super::space::SpaceGuard,
    /// Where the space worker learns the volume's free bytes (a test may
    /// swap in its own figures).
    pub free_space: RwLock<Arc<dyn super::space::FreeSpace>>,
    /// This broker is decommissioned (ADR 0112): its unreplicated active
    /// segments roll away (a replicated one fails over instead). Set by
    /// the control plane from the ring's members.
    pub leaving: std::sync::atomic::AtomicBool,
    /// Producer bytes the writers here stored, since start: the balancer
    /// gossips its rate as this broker's write load (ADR 0144).
    pub bytes_stored: std::sync::atomic::AtomicU64,
    /// Test hook: the segments a writer started for, in order (at most
    /// [`WRITER_STARTS_TRACKED_MAX`]).
    #[cfg(feature = "testing")]
    pub writer_starts: Mutex<Vec<u64>>,
}

/// Writer starts the test hook remembers.
#[cfg(feature = "testing")]
pub(crate) const WRITER_STARTS_TRACKED_MAX: usize = 4_096;

impl Storage {
    pub fn new(
        config: BrokerConfig,
        store: Arc<dyn SegmentStore>,
        clock: Arc<dyn Clock>,
        metrics: Arc<BrokerMetrics>,
    ) -> Storage {
        Storage {
            store,
            clock,
            metrics,
            supervisor: RwLock::new(None),
            segments: Mutex::new(HashMap::new()),
            topics: Mutex::new(HashMap::new()),
            replication: ReplicationState::default(),
            scrub: super::scrub::ScrubState::kept_in(&config.data_dir),
            space: super::space::SpaceGuard::new(config.store.min_free_bytes),
            free_space: RwLock::new(Arc::new(super::space::VolumeSpace)),
            leaving: std::sync::atomic::AtomicBool::new(false),
            bytes_stored: std::sync::atomic::AtomicU64::new(0),
            #[cfg(feature = "testing")]
            writer_starts: Mutex::new(Vec::new()),
            config,
        }
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
}
