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

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::control::shared::Shared;
use crate::data::scrub::{SCRUB_BYTES_PER_SECOND, scrub_one};
use crate::maintenance::healer::Pacer;

/// How long the worker sleeps when nothing is queued and nobody wakes it.
const IDLE_WAIT_MS: u64 = 1_000;

pub(crate) struct ScrubberActor;

/// The scrubber takes no messages: its work arrives through the book.
#[derive(Debug)]
pub(crate) enum ScrubberMsg {}

impl ractor::Message for ScrubberMsg {}

pub(crate) struct ScrubberState {
    task: JoinHandle<()>,
}

#[ractor::async_trait]
impl Actor for ScrubberActor {
    type Msg = ScrubberMsg;
    type State = ScrubberState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<ScrubberMsg>,
        shared: Arc<Shared>,
    ) -> Result<ScrubberState, ActorProcessingErr> {
        Ok(ScrubberState {
            task: tokio::spawn(run(shared)),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<ScrubberMsg>,
        state: &mut ScrubberState,
    ) -> Result<(), ActorProcessingErr> {
        state.task.abort();
        Ok(())
    }
}

async fn run(shared: Arc<Shared>) {
    let storage = Arc::clone(&shared.data);
    let pacer = Pacer::new(SCRUB_BYTES_PER_SECOND);
    // Coordinators ask about every sealed copy at least once per
    // `scrub_interval_ms` (they poll a quarter of it, round-robin): a
    // verdict unasked for twice that is of a copy no longer held.
    let interval = Duration::from_millis(shared.config.cluster.scrub_interval_ms);
    let mut counted_at: Option<Instant> = None;
    loop {
        #[cfg(feature = "testing")]
        crate::common::faults::trip(shared.client_addr, "scrubber");
        // `malachi_copies{health}`, refreshed at most once a second.
        if counted_at.is_none_or(|at| at.elapsed() >= Duration::from_millis(IDLE_WAIT_MS)) {
            counted_at = Some(Instant::now());
            shared
                .metrics
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
        let scanned = Arc::clone(&storage);
        let Ok((verdict, read, index_bad)) =
            tokio::task::spawn_blocking(move || scrub_one(&scanned, seal)).await
        else {
            continue;
        };
        shared.metrics.scrub_bytes.increment(read);
        let id = malachi_storage::SegmentId(seal.segment);
        if index_bad > 0 {
            // The index is derived from the log: rebuilt here, from this
            // copy's own log, whatever the log's verdict (issue 21).
            let store = Arc::clone(&storage.store);
            match tokio::task::spawn_blocking(move || store.repair_index(id)).await {
                Ok(Ok(())) => {
                    shared.metrics.scrub_index_repairs.increment(1);
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
        if verdict.is_broken() {
            let was = storage.scrub.book.lock().is_broken(seal.segment);
            if !was {
                shared.metrics.scrub_broken.increment(1);
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
            .record(seal, verdict.clone(), Instant::now());
        let until = pacer.reserve(read, Instant::now());
        tokio::time::sleep_until(tokio::time::Instant::from_std(until)).await;
    }
}
