//! The asking half of drop orders (cluster api key 106, ADR 0115): once a
//! topic's delete or a retention expiry commits, the holders of its copies
//! are told which segments to drop. The serving half, and the removal
//! itself, is `removal.rs`; the order travels through the
//! [`OrderClient`](super::replica_order::OrderClient), which serves an
//! order to this broker locally. Apart from `removal.rs` so that the
//! client, which routes local orders to the removal, and the removal are
//! not one circle.

use std::collections::BTreeMap;

use malachi_wire::replica_order::{DROP_COPIES_SEGMENTS_MAX, DropCopiesRequest};
use tracing::{debug, info};

use super::replica_order::OrderClient;

/// Sends drop orders for a deleted topic's segments to the brokers that
/// held them (this one included, served locally). A holder that does not
/// answer is left to its orphan sweep.
pub(crate) async fn send_drop_orders(
    orders: &OrderClient,
    topic: &str,
    holders: BTreeMap<u64, Vec<u64>>,
) {
    for (node, segments) in holders {
        for chunk in segments.chunks(DROP_COPIES_SEGMENTS_MAX) {
            let request = DropCopiesRequest {
                topic: topic.to_owned(),
                segments: chunk.to_vec(),
            };
            match orders.drop_copies(node, &request).await {
                Ok(answer) if answer.message.is_empty() => debug!(
                    %topic,
                    node,
                    removed = answer.removed.len(),
                    freed_bytes = answer.freed_bytes,
                    "a holder removed a deleted topic's copies"
                ),
                Ok(answer) => {
                    info!(%topic, node, reason = %answer.message, "a holder kept a deleted topic's copies for now; its orphan sweep removes them")
                }
                Err(reason) => {
                    info!(%topic, node, %reason, "a holder did not take a drop order; its orphan sweep removes the copies")
                }
            }
        }
    }
}
