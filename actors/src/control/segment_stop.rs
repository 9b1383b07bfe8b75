//! Stopping segment actors and closing their copies: what a roll, a
//! topic's delete, reconcile and a drop order (`removal.rs`) share. Apart
//! from the coordinator, which starts the actors, so that the removal of a
//! copy does not name the coordinator that sends its drop orders.

use std::sync::Arc;

use malachi_core::model::{RangeId, SegmentId};
use malachi_storage::SegmentStore;
use tracing::{debug, info, warn};

use crate::data::storage::Storage;

/// The segment actor's name in the storage supervisor: stable and readable.
pub(crate) fn segment_name(topic: &str, range: RangeId, segment: SegmentId) -> String {
    format!("segment/{topic}/{}/{}", range.0, segment.0)
}

/// Stops a segment actor. One already gone (it stopped, or its supervisor
/// restarted without it) is what was wanted, so a failure is only noted.
pub(crate) async fn stop_segment_actor(storage: &malachi_supervision::SupervisorRef, name: &str) {
    if let Err(e) = storage.terminate_child(name).await {
        debug!(segment = name, error = %e, "segment actor already stopped");
    }
}

/// Releases the store's open handle of a segment copy whose actor stopped.
/// A failure leaves a file open until shutdown, no data at risk: logged.
pub(crate) async fn close_copy(store: &Arc<dyn SegmentStore>, segment: SegmentId) {
    let store = Arc::clone(store);
    let id = malachi_storage::SegmentId(segment.0);
    match tokio::task::spawn_blocking(move || store.close(id)).await {
        // Closed already: a delete's release and reconcile (or a drop
        // order) race to it, and either may come first.
        Ok(Ok(_)) | Ok(Err(malachi_storage::StorageError::NotOpen { .. })) => {}
        Ok(Err(e)) => warn!(segment = segment.0, error = %e, "cannot close a segment copy"),
        Err(e) => warn!(segment = segment.0, error = %e, "the close task failed"),
    }
}

/// Stops the writers of `segments` (of deleted segments: found by their
/// id suffix, since the name's range is no longer in the metadata) and
/// closes their copies.
pub(crate) async fn stop_segment_actors(data: &Storage, segments: &[SegmentId]) {
    if segments.is_empty() {
        return;
    }
    let storage = data.supervisor.read().clone();
    if let Some(storage) = storage
        && let Ok(snapshot) = storage.snapshot().await
    {
        for segment in segments {
            let suffix = format!("/{}", segment.0);
            for child in &snapshot.children {
                if child.name.starts_with("segment/") && child.name.ends_with(&suffix) {
                    info!(segment = %child.name, "stopping the actor of a deleted segment");
                    stop_segment_actor(&storage, &child.name).await;
                }
            }
        }
    }
    for &segment in segments {
        data.segments.lock().remove(&segment);
        close_copy(&data.store, segment).await;
    }
}
