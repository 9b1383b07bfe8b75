//! The cluster's cursor keys on this broker (ADR 0096): learned from the
//! metadata plane before the broker mints or verifies a cursor.
//!
//! At start (`cursor_learner.rs`, run by the `vnodes` actor once the plane
//! is open) the broker reads the keys from the group that holds them (the
//! ring's group) and, if the cluster has none yet, proposes its bootstrap
//! secret as key 0: the first proposal to commit wins, the others are
//! no-ops. It retries with a bounded backoff until the keys are known.
//! Until then fetch and subscribe answer `no_quorum` (retriable): a broker
//! never mints a cursor under a private key. A cursor naming a key id this
//! broker does not know (a rotation it has not heard of) makes it read the
//! keys again, at most once per `CURSOR_KEYS_REFRESH_MIN_MS`, before it is
//! refused as `invalid_cursor`.
//!
//! Boundaries: this module holds keys and talks to the plane; the codec is
//! `malachi_core::cursor`, the command is the model's, and the client
//! port's use of the keys (the refusals) is `serve::cursors`.

use std::sync::Arc;

use malachi_core::cursor::CursorKeys;
use malachi_core::model::{Command, CursorKeyRing, CursorSecret};
use parking_lot::RwLock;
use tracing::{debug, info, warn};

use crate::common::clock::Clock;
use crate::control::metadata::MetadataPlane;

/// The shortest pause between two reads of the keys on behalf of cursors
/// naming an unknown key id, so forged ids cannot turn into a read storm.
pub(crate) const CURSOR_KEYS_REFRESH_MIN_MS: u64 = 1_000;

/// The keys this broker knows, and what it proposes if the cluster has none.
pub(crate) struct CursorKeyState {
    keys: RwLock<Option<Arc<CursorKeys>>>,
    /// The secret this broker proposes as key 0 at bootstrap: its old
    /// per-broker secret file if it has one, else fresh OS randomness.
    bootstrap: CursorSecret,
    /// When the keys were last read for an unknown id (monotonic ms).
    last_refresh_ms: tokio::sync::Mutex<Option<u64>>,
}

impl std::fmt::Debug for CursorKeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CursorKeyState")
            .field("current", &self.known().map(|k| k.current_id()))
            .finish_non_exhaustive()
    }
}

/// Why the keys could not be learned this time (the learner retries).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LearnError {
    #[error("{0}")]
    Plane(#[from] crate::common::error::MetadataError),
    #[error("the cluster refused the cursor key: {0}")]
    Refused(malachi_core::model::ModelError),
    #[error("the cluster's cursor keys are unusable: {0}")]
    Unusable(malachi_core::cursor::CursorKeyError),
    #[error("the cluster holds no cursor key after creating one")]
    Missing,
}

impl CursorKeyState {
    pub(crate) fn new(bootstrap: CursorSecret) -> CursorKeyState {
        CursorKeyState {
            keys: RwLock::new(None),
            bootstrap,
            last_refresh_ms: tokio::sync::Mutex::new(None),
        }
    }

    /// The keys, once learned.
    pub(crate) fn known(&self) -> Option<Arc<CursorKeys>> {
        self.keys.read().clone()
    }

    /// Takes the cluster's ring as this broker's keys unless the ones held
    /// are newer (a read from a lagging answer never moves back).
    fn install(&self, ring: &CursorKeyRing) -> Result<Arc<CursorKeys>, LearnError> {
        let keys = CursorKeys::from_ring(ring)
            .map_err(LearnError::Unusable)?
            .ok_or(LearnError::Missing)?;
        let mut held = self.keys.write();
        if let Some(current) = held.as_ref()
            && current.current_id() > keys.current_id()
        {
            return Ok(Arc::clone(current));
        }
        let changed = held
            .as_ref()
            .is_none_or(|h| h.ids().ne(keys.ids()) || h.current_id() != keys.current_id());
        if changed {
            info!(
                current = keys.current_id(),
                ids = ?keys.ids().collect::<Vec<_>>(),
                "cursor keys learned"
            );
        }
        let keys = Arc::new(keys);
        *held = Some(Arc::clone(&keys));
        Ok(keys)
    }

    /// Takes the keys from this broker's own replica of the ring group if
    /// it holds them (a restart serves cursors at once, quorum or not);
    /// else reads them from the group's leader and, if the cluster has
    /// none, proposes the bootstrap secret as key 0 and reads them again.
    pub(crate) async fn learn(
        &self,
        plane: &dyn MetadataPlane,
        clock: &dyn Clock,
    ) -> Result<Arc<CursorKeys>, LearnError> {
        if let Some(ring) = plane.cursor_keys_local() {
            return self.install(&ring);
        }
        if let Some(ring) = plane.cursor_keys().await? {
            return self.install(&ring);
        }
        let create = Command::CreateCursorKey {
            secret: self.bootstrap.clone(),
            at_ms: clock.wall_ms(),
        };
        plane
            .propose_cursor_key(create)
            .await?
            .map_err(LearnError::Refused)?;
        match plane.cursor_keys().await? {
            Some(ring) => self.install(&ring),
            None => Err(LearnError::Missing),
        }
    }

    /// Rotates the cluster's key: proposes key `current + 1` with `secret`
    /// (drawn by the caller, at the edge) after the current key this broker
    /// knows, then takes the keys the group holds. Returns the current id.
    pub(crate) async fn rotate(
        &self,
        plane: &dyn MetadataPlane,
        clock: &dyn Clock,
        secret: CursorSecret,
    ) -> Result<u32, LearnError> {
        let after = match self.known() {
            Some(keys) => keys.current_id(),
            None => self.learn(plane, clock).await?.current_id(),
        };
        let rotate = Command::RotateCursorKey {
            after,
            secret,
            at_ms: clock.wall_ms(),
        };
        plane
            .propose_cursor_key(rotate)
            .await?
            .map_err(LearnError::Refused)?;
        match plane.cursor_keys().await? {
            Some(ring) => Ok(self.install(&ring)?.current_id()),
            None => Err(LearnError::Missing),
        }
    }

    /// Reads the keys again for a cursor naming an unknown id, unless that
    /// was done less than `CURSOR_KEYS_REFRESH_MIN_MS` ago.
    pub(crate) async fn refresh(&self, plane: &dyn MetadataPlane, clock: &dyn Clock) {
        let now = clock.monotonic_ms();
        {
            let mut last = self.last_refresh_ms.lock().await;
            if last.is_some_and(|at| now.saturating_sub(at) < CURSOR_KEYS_REFRESH_MIN_MS) {
                return;
            }
            *last = Some(now);
        }
        match plane.cursor_keys().await {
            Ok(Some(ring)) => {
                if let Err(e) = self.install(&ring) {
                    warn!(error = %e, "cursor keys not refreshed");
                }
            }
            Ok(None) => {}
            Err(e) => debug!(error = %e, "cursor keys not refreshed"),
        }
    }
}
