//! The client port's use of the cluster's cursor keys (ADR 0096): the keys
//! to mint under, and the verification of a client's cursor, with the
//! refusals a client sees (`no_quorum` before the keys are learned,
//! `invalid_cursor` for a cursor that does not verify).

use std::sync::Arc;

use malachi_core::cursor::{Cursor, CursorKeys, InvalidCursor};
use tracing::debug;

use super::context::ReadCtx;
use super::error::ServeError;

/// The keys to mint and verify cursors with, or the retriable refusal of a
/// broker that has not learned them yet.
pub(crate) fn keys(broker: &ReadCtx) -> Result<Arc<CursorKeys>, ServeError> {
    broker
        .memory
        .cursor_keys
        .known()
        .ok_or(ServeError::CursorKeyPending)
}

/// Authenticates `encoded` under the cluster's keys (not yet against the
/// metadata: `Cursor::validate` does that under the metadata lock). A key
/// id this broker does not know makes it re-read the keys once first.
pub(crate) async fn verify(broker: &ReadCtx, encoded: &str) -> Result<Cursor, ServeError> {
    let refused = |e: InvalidCursor| ServeError::InvalidCursor {
        reason: e.to_string(),
    };
    let held = keys(broker)?;
    match Cursor::decode(encoded, &held) {
        Err(InvalidCursor::UnknownKey { key_id }) => {
            if let Ok(plane) = broker.place.plane() {
                debug!(key_id, "a cursor names an unknown key: reading the keys");
                broker
                    .memory
                    .cursor_keys
                    .refresh(plane.as_ref(), broker.clock.as_ref())
                    .await;
            }
            let fresh = keys(broker)?;
            Cursor::decode(encoded, &fresh).map_err(refused)
        }
        other => other.map_err(refused),
    }
}
