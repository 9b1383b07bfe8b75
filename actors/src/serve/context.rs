//! What each serve path uses of the broker, named field by field and built
//! once per connection from the broker context: [`ReadCtx`] for fetch,
//! subscribe and the reads through holders (`remote.rs`) and cursor keys
//! (`cursors.rs`); [`ProduceCtx`] for the produce sequencer. A handler
//! given one of them cannot reach the rest of the broker (coordinators,
//! the admin server, configuration it does not read).

use std::sync::Arc;

use malachi_storage::SegmentStore;
use tokio_util::sync::CancellationToken;

use crate::common::client_port::ClientPortState;
use crate::common::clock::Clock;
use crate::common::metrics::BrokerMetrics;
use crate::control::memory::ControlMemory;
use crate::control::placement::PlacementView;
use crate::control::shared::Shared;
use crate::data::storage::Storage;

/// What the read path uses: who serves what (`place`: this broker, the
/// metadata plane, membership and the cluster port to holders), the data
/// plane's copies and their damage book, durable watches and settled
/// ends (`data`, `store`), the cluster's cursor keys (`memory`, refreshed
/// against `clock`), the read limits, and the port's drain.
#[derive(Debug, Clone)]
pub(crate) struct ReadCtx {
    pub place: PlacementView,
    pub store: Arc<dyn SegmentStore>,
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    /// The cursor keys (`memory.cursor_keys`).
    pub memory: Arc<ControlMemory>,
    pub clock: Arc<dyn Clock>,
    /// Cancelled when the client port drains: long polls and pushes end.
    pub draining: CancellationToken,
    pub frame_bytes_max: usize,
    pub fetch_wait_ms_max: u64,
}

impl ReadCtx {
    pub fn of(shared: &Shared) -> ReadCtx {
        ReadCtx {
            place: PlacementView::of(shared),
            store: Arc::clone(&shared.store),
            data: Arc::clone(&shared.data),
            metrics: Arc::clone(&shared.metrics),
            memory: Arc::clone(&shared.memory),
            clock: Arc::clone(&shared.clock),
            draining: shared.port.draining.clone(),
            frame_bytes_max: shared.config.frame_bytes_max,
            fetch_wait_ms_max: shared.config.fetch_wait_ms_max,
        }
    }
}

/// What the produce path uses: who serves what (`place`), the data
/// plane's segments, free space and replicated copies (`data`), the
/// clock records are stamped with, the port's response budgets (`port`),
/// and the produce limits.
#[derive(Debug, Clone)]
pub(crate) struct ProduceCtx {
    pub place: PlacementView,
    pub data: Arc<Storage>,
    pub clock: Arc<dyn Clock>,
    /// The broker-wide response budget (`port.budgets`).
    pub port: Arc<ClientPortState>,
    pub produce_timeout_ms: u64,
    pub record_value_bytes_max: usize,
}

impl ProduceCtx {
    pub fn of(shared: &Shared) -> ProduceCtx {
        ProduceCtx {
            place: PlacementView::of(shared),
            data: Arc::clone(&shared.data),
            clock: Arc::clone(&shared.clock),
            port: Arc::clone(&shared.port),
            produce_timeout_ms: shared.config.produce_timeout_ms,
            record_value_bytes_max: shared.config.record_value_bytes_max,
        }
    }
}
