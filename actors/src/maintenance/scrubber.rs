//! `maintenance/scrubber`: re-reads the sealed copies this broker holds
//! against the seals the metadata recorded (issue 19, ADR 0110).
//!
//! Coordinators ask about their sealed copies (replica-status with
//! `scrub`); what has no fresh verdict is queued in the broker's
//! [`ScrubBook`](crate::data::scrub::ScrubBook). This worker takes the
//! queue one copy at a time: a read-only scan checking every frame's CRC,
//! then the records and bytes against the seal, paced at
//! [`SCRUB_BYTES_PER_SECOND`] so producers and consumers keep the disk.
//! A broken copy is counted and logged once; the coordinator's healer
//! rebuilds it from an intact copy. A copy that reads intact again after a
//! rebuild has its broken original, kept aside until then, deleted.
//! An index sidecar whose entries do not point at the frames they name is
//! rebuilt from the copy's own log (the index is derived data; issue 21).
//! It also keeps `malachi_copies{health}`, this broker's copies by health,
//! up to date (once a second).
//!
//! The queue is worked by a loop rather than by messages: it waits on the
//! book's wake-up and paces itself between copies, and a handler that
//! waited there would hold up the actor's stop. The actor watches the
//! loop ([`spawn_watched`]): if it panics or ends, the actor fails and
//! its supervisor restarts both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use malachi_wire::replica_status::ScrubSeal;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::common::metrics::BrokerMetrics;
use crate::common::watched::{TaskEnded, Watched, spawn_watched};
use crate::data::scrub::{SCRUB_BYTES_PER_SECOND, scrub_one};
use crate::data::storage::Storage;
use crate::maintenance::healer::Pacer;

/// How long the worker sleeps when nothing is queued and nobody wakes it.
const IDLE_WAIT_MS: u64 = 1_000;

pub(crate) struct ScrubberActor;

/// What the scrubber reads: the data plane's copies and scrub book, the
/// metrics it counts into, and how often coordinators ask.
#[derive(Debug)]
pub(crate) struct ScrubberCtx {
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    pub scrub_interval_ms: u64,
    /// The broker's fault-injection key (its client address).
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

/// The scrubber's work arrives through the book; its one message is the
/// end of the loop that works it.
#[derive(Debug)]
pub(crate) enum ScrubberMsg {
    LoopEnded(TaskEnded),
}

impl ractor::Message for ScrubberMsg {}

/// The loop, aborted with the state (a stop, a failure or a kill).
pub(crate) struct ScrubberState {
    _scrub: Watched,
}

#[ractor::async_trait]
impl Actor for ScrubberActor {
    type Msg = ScrubberMsg;
    type State = ScrubberState;
    type Arguments = Arc<ScrubberCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<ScrubberMsg>,
        ctx: Arc<ScrubberCtx>,
    ) -> Result<ScrubberState, ActorProcessingErr> {
        Ok(ScrubberState {
            _scrub: spawn_watched(myself, "scrub", run(ctx), ScrubberMsg::LoopEnded),
        })
    }

    /// The loop never ends on its own: an end is a failure, and a restart
    /// starts it again.
    async fn handle(
        &self,
        _myself: ActorRef<ScrubberMsg>,
        message: ScrubberMsg,
        _state: &mut ScrubberState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ScrubberMsg::LoopEnded(ended) => Err(Box::new(ended)),
        }
    }
}

async fn run(ctx: Arc<ScrubberCtx>) {
    let storage = Arc::clone(&ctx.data);
    let pacer = Pacer::new(SCRUB_BYTES_PER_SECOND);
    // Coordinators ask about every sealed copy at least once per
    // `scrub_interval_ms` (they poll a quarter of it, round-robin): a
    // verdict unasked for twice that is of a copy no longer held.
    let interval = Duration::from_millis(ctx.scrub_interval_ms);
    let mut counted_at: Option<Instant> = None;
    loop {
        #[cfg(feature = "testing")]
        crate::common::faults::trip(ctx.fault_key, "scrubber");
        // `malachi_copies{health}`, refreshed at most once a second.
        if counted_at.is_none_or(|at| at.elapsed() >= Duration::from_millis(IDLE_WAIT_MS)) {
            counted_at = Some(Instant::now());
            ctx.metrics
                .copy_health(&crate::data::status::copy_health_counts(&storage));
        }
        storage
            .scrub
            .book
            .lock()
            .prune(Instant::now(), interval.saturating_mul(2));
        let next = storage.scrub.book.lock().next();
        let Some(seal) = next else {
            let _ = tokio::time::timeout(
                Duration::from_millis(IDLE_WAIT_MS),
                storage.scrub.wake.notified(),
            )
            .await;
            continue;
        };
        let Some(read) = scrub(&ctx, seal).await else {
            continue;
        };
        let until = pacer.reserve(read, Instant::now());
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
    }
}

/// Scrubs one sealed copy and records its verdict; the bytes read, or
/// `None` if the scan itself could not run.
async fn scrub(ctx: &ScrubberCtx, seal: ScrubSeal) -> Option<u64> {
    let storage = Arc::clone(&ctx.data);
    let scanned = Arc::clone(&storage);
    let started = Instant::now();
    let (verdict, read, index_bad) = tokio::task::spawn_blocking(move || scrub_one(&scanned, seal))
        .await
        .ok()?;
    ctx.metrics.scrub_bytes.increment(read);
    let id = malachi_storage::SegmentId(seal.segment);
    if index_bad > 0 {
        repair_index(ctx, seal, index_bad).await;
    }
    if verdict.is_broken() {
        let was = storage.scrub.book.lock().is_broken(seal.segment);
        if !was {
            ctx.metrics.scrub_broken.increment(1);
            warn!(
                segment = seal.segment,
                seal_length = seal.length,
                seal_bytes = seal.bytes,
                verdict = ?verdict,
                "scrub found a broken sealed copy; a replicated one is rebuilt from an intact copy"
            );
        }
    } else {
        debug!(
            segment = seal.segment,
            bytes = read,
            "scrubbed a sealed copy: intact"
        );
        if storage.store.is_aside(id) {
            match storage.store.discard_aside(id) {
                Ok(freed) => info!(
                    segment = seal.segment,
                    freed_bytes = freed,
                    "a rebuilt copy reads intact; its broken original is deleted"
                ),
                Err(e) => {
                    warn!(segment = seal.segment, error = %e, "cannot delete a broken copy set aside")
                }
            }
        }
    }
    storage
        .scrub
        .book
        .lock()
        .record_scanned(seal, verdict.clone(), started, Instant::now());
    Some(read)
}

/// The index is derived from the log: rebuilt from this copy's own log,
/// whatever the log's verdict (issue 21).
async fn repair_index(ctx: &ScrubberCtx, seal: ScrubSeal, index_bad: u64) {
    let store = Arc::clone(&ctx.data.store);
    let id = malachi_storage::SegmentId(seal.segment);
    match tokio::task::spawn_blocking(move || store.repair_index(id)).await {
        Ok(Ok(())) => {
            ctx.metrics.scrub_index_repairs.increment(1);
            info!(
                segment = seal.segment,
                bad_entries = index_bad,
                "scrub found a bad index sidecar and rebuilt it from the log"
            );
        }
        Ok(Err(e)) => {
            warn!(segment = seal.segment, error = %e, "cannot rebuild a bad index sidecar")
        }
        Err(e) => warn!(segment = seal.segment, error = %e, "the index repair task failed"),
    }
}
