//! Learning the cluster's cursor keys at a broker's start (ADR 0096): the
//! glue between the broker context and the key state of `cursor_keys.rs`.
//! Apart from it so that the context (`shared.rs`), which holds the key
//! state, and the learner, which reads the context, are not one circle.

use std::sync::Arc;
use std::time::Duration;

use malachi_cluster::group::{Backoff, backoff_seed};
use tracing::{debug, warn};

use crate::control::metadata::MetadataPlane;
use crate::control::shared::Shared;

/// The first and the longest pause of the start-up learner's retries.
const LEARN_BACKOFF_MIN_MS: u64 = 100;
const LEARN_BACKOFF_MAX_MS: u64 = 2_000;

/// Learns the keys now, waiting at most `wait_ms` (a lone broker's start:
/// it is its own quorum). A failure is left to the background learner.
pub(crate) async fn learn_within(shared: &Shared, plane: &dyn MetadataPlane, wait_ms: u64) {
    let learned = tokio::time::timeout(
        Duration::from_millis(wait_ms),
        shared
            .memory
            .cursor_keys
            .learn(plane, shared.clock.as_ref()),
    )
    .await;
    match learned {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            warn!(error = %e, "cursor keys not learned at start; retrying in the background")
        }
        Err(_) => warn!(
            wait_ms,
            "cursor keys not learned at start; retrying in the background"
        ),
    }
}

/// Learns the keys, retrying with backoff until they are known; ends then,
/// or when the broker context is dropped. The `vnodes` actor runs it as a
/// watched task.
pub(crate) fn learner(
    shared: &Arc<Shared>,
    plane: Arc<dyn MetadataPlane>,
) -> impl Future<Output = ()> + Send + 'static {
    let weak = Arc::downgrade(shared);
    let node = shared.config.node_id;
    async move {
        let mut backoff = Backoff::new(
            LEARN_BACKOFF_MIN_MS,
            LEARN_BACKOFF_MAX_MS,
            backoff_seed(node, u64::from(u32::from_be_bytes(*b"ckey"))),
        );
        loop {
            let Some(shared) = weak.upgrade() else { return };
            if shared.memory.cursor_keys.known().is_some() {
                return;
            }
            match shared
                .memory
                .cursor_keys
                .learn(plane.as_ref(), shared.clock.as_ref())
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    debug!(node, error = %e, "cursor keys not learned yet; retrying")
                }
            }
            drop(shared);
            tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
        }
    }
}
