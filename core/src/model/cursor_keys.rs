//! The cluster's cursor keys: the HMAC secrets cursors are tagged under,
//! kept in the ring's group so every broker verifies what any broker
//! minted (ADR 0096).
//!
//! The keys are created once, at the cluster's bootstrap: every broker
//! proposes `CreateCursorKey` with a secret of its own, the first to commit
//! becomes key 0 and the others are no-ops. `RotateCursorKey` adds the next
//! id and makes it current; the older keys stay (up to `CURSOR_KEYS_MAX`),
//! so cursors minted under them still verify. The secrets arrive inside the
//! commands (the proposer drew them at the edge): the machine draws nothing.

use super::command::{ModelError, Outcome};
use super::state::MetadataState;
use crate::cursor::{CURSOR_SECRET_BYTES_MAX, CURSOR_SECRET_BYTES_MIN};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most keys the ring group keeps: a rotation past it forgets the
/// oldest, whose cursors are then refused as naming an unknown key.
pub const CURSOR_KEYS_MAX: usize = 8;

/// A cursor secret as the metadata carries it. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CursorSecret(Vec<u8>);

impl CursorSecret {
    pub fn new(bytes: Vec<u8>) -> CursorSecret {
        CursorSecret(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `Err` unless the secret is `CURSOR_SECRET_BYTES_MIN..=CURSOR_SECRET_BYTES_MAX` bytes.
    pub fn check(&self) -> Result<(), ModelError> {
        let bytes = self.0.len();
        if (CURSOR_SECRET_BYTES_MIN..=CURSOR_SECRET_BYTES_MAX).contains(&bytes) {
            Ok(())
        } else {
            Err(ModelError::InvalidCursorSecret {
                bytes,
                min: CURSOR_SECRET_BYTES_MIN,
                max: CURSOR_SECRET_BYTES_MAX,
            })
        }
    }
}

impl fmt::Debug for CursorSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CursorSecret(<{} bytes redacted>)", self.0.len())
    }
}

/// One cursor key: its id (carried by every cursor tagged under it) and secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorKeyEntry {
    pub id: u32,
    pub secret: CursorSecret,
    /// The `at_ms` of the command that created it.
    pub created_at_ms: u64,
}

/// The cluster's cursor keys, oldest first, ids strictly increasing; the
/// last is the current one, which brokers mint cursors under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorKeyRing {
    pub keys: Vec<CursorKeyEntry>,
}

impl CursorKeyRing {
    /// The key new cursors are tagged under.
    pub fn current(&self) -> Option<&CursorKeyEntry> {
        self.keys.last()
    }

    /// The key of id `id`, if the ring still holds it.
    pub fn get(&self, id: u32) -> Option<&CursorKeyEntry> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Whether the ring is one `apply` could have built.
    pub fn is_well_formed(&self) -> bool {
        !self.keys.is_empty()
            && self.keys.len() <= CURSOR_KEYS_MAX
            && self.keys.windows(2).all(|pair| pair[0].id < pair[1].id)
            && self.keys.iter().all(|k| k.secret.check().is_ok())
    }
}

impl MetadataState {
    /// The cluster's cursor keys, in the ring's group once created.
    pub fn cursor_keys(&self) -> Option<&CursorKeyRing> {
        self.cursor_keys.as_ref()
    }

    pub(super) fn create_cursor_key(
        &mut self,
        secret: CursorSecret,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        if let Some(current) = self.cursor_keys.as_ref().and_then(CursorKeyRing::current) {
            // Created already: every other broker's bootstrap lands here.
            return Ok(Outcome::CursorKeyCurrent { id: current.id });
        }
        secret.check()?;
        self.cursor_keys = Some(CursorKeyRing {
            keys: vec![CursorKeyEntry {
                id: 0,
                secret,
                created_at_ms: at_ms,
            }],
        });
        Ok(Outcome::CursorKeyCurrent { id: 0 })
    }

    pub(super) fn rotate_cursor_key(
        &mut self,
        after: u32,
        secret: CursorSecret,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        secret.check()?;
        let Some(ring) = self.cursor_keys.as_mut() else {
            return Err(ModelError::NoCursorKey);
        };
        let current = ring.current().map_or(0, |k| k.id);
        if current != after {
            // A repeat of the rotation that made the current key (its
            // answer was lost) is a no-op; any other is stale.
            let repeated = after.checked_add(1).and_then(|next| ring.get(next));
            if repeated.is_some_and(|k| k.secret == secret) {
                return Ok(Outcome::CursorKeyCurrent { id: current });
            }
            return Err(ModelError::CursorKeyRotated { after, current });
        }
        let id = after
            .checked_add(1)
            .ok_or(ModelError::CursorKeyIdsExhausted)?;
        if ring.keys.len() >= CURSOR_KEYS_MAX {
            ring.keys.remove(0);
        }
        ring.keys.push(CursorKeyEntry {
            id,
            secret,
            created_at_ms: at_ms,
        });
        Ok(Outcome::CursorKeyCurrent { id })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::Command;

    fn secret(fill: u8) -> CursorSecret {
        CursorSecret::new(vec![fill; 32])
    }

    fn create(state: &mut MetadataState, fill: u8) -> Result<Outcome, ModelError> {
        state.apply(Command::CreateCursorKey {
            secret: secret(fill),
            at_ms: u64::from(fill),
        })
    }

    fn rotate(state: &mut MetadataState, after: u32, fill: u8) -> Result<Outcome, ModelError> {
        state.apply(Command::RotateCursorKey {
            after,
            secret: secret(fill),
            at_ms: u64::from(fill),
        })
    }

    #[test]
    fn the_first_create_makes_key_zero_and_every_later_create_is_a_no_op() {
        let mut state = MetadataState::new();
        assert_eq!(
            create(&mut state, 1),
            Ok(Outcome::CursorKeyCurrent { id: 0 })
        );
        let after_first = state.clone();
        // The other brokers' bootstraps, each with its own secret.
        assert_eq!(
            create(&mut state, 2),
            Ok(Outcome::CursorKeyCurrent { id: 0 })
        );
        assert_eq!(
            create(&mut state, 3),
            Ok(Outcome::CursorKeyCurrent { id: 0 })
        );
        assert_eq!(state, after_first, "a repeated create changed the state");
        let ring = state.cursor_keys().unwrap();
        assert_eq!(ring.keys.len(), 1);
        assert_eq!(ring.current().unwrap().secret, secret(1), "the first wins");
    }

    #[test]
    fn a_rotation_adds_the_next_key_and_keeps_the_old_ones() {
        let mut state = MetadataState::new();
        create(&mut state, 1).unwrap();
        assert_eq!(
            rotate(&mut state, 0, 2),
            Ok(Outcome::CursorKeyCurrent { id: 1 })
        );
        assert_eq!(
            rotate(&mut state, 1, 3),
            Ok(Outcome::CursorKeyCurrent { id: 2 })
        );
        let ring = state.cursor_keys().unwrap();
        assert_eq!(ring.current().unwrap().id, 2);
        // Old ids still resolve to their own secrets, so their cursors verify.
        assert_eq!(ring.get(0).unwrap().secret, secret(1));
        assert_eq!(ring.get(1).unwrap().secret, secret(2));
        assert_eq!(ring.get(2).unwrap().secret, secret(3));
        assert!(ring.is_well_formed());
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_repeated_rotation_is_a_no_op_and_a_stale_one_is_refused() {
        let mut state = MetadataState::new();
        create(&mut state, 1).unwrap();
        rotate(&mut state, 0, 2).unwrap();
        let rotated = state.clone();
        // The same rotation again (its answer was lost): nothing changes.
        assert_eq!(
            rotate(&mut state, 0, 2),
            Ok(Outcome::CursorKeyCurrent { id: 1 })
        );
        // Another rotator that also saw key 0 current is refused.
        assert_eq!(
            rotate(&mut state, 0, 9),
            Err(ModelError::CursorKeyRotated {
                after: 0,
                current: 1
            })
        );
        assert_eq!(state, rotated);
    }

    #[test]
    fn rotating_before_any_key_exists_or_with_a_short_secret_is_refused() {
        let mut state = MetadataState::new();
        assert_eq!(rotate(&mut state, 0, 1), Err(ModelError::NoCursorKey));
        let short = state.apply(Command::CreateCursorKey {
            secret: CursorSecret::new(vec![7; 4]),
            at_ms: 0,
        });
        assert!(matches!(
            short,
            Err(ModelError::InvalidCursorSecret { bytes: 4, .. })
        ));
        assert_eq!(state, MetadataState::new(), "a refusal changed the state");
    }

    #[test]
    fn the_ring_keeps_at_most_its_bound_forgetting_the_oldest() {
        let mut state = MetadataState::new();
        create(&mut state, 1).unwrap();
        for after in 0..CURSOR_KEYS_MAX as u32 {
            rotate(&mut state, after, 2 + after as u8).unwrap();
        }
        let ring = state.cursor_keys().unwrap();
        assert_eq!(ring.keys.len(), CURSOR_KEYS_MAX);
        assert!(ring.get(0).is_none(), "the oldest key is forgotten");
        assert_eq!(ring.current().unwrap().id, CURSOR_KEYS_MAX as u32);
        assert!(ring.is_well_formed());
    }

    #[test]
    fn the_keys_survive_a_snapshot_and_older_snapshots_have_none() {
        let mut state = MetadataState::new();
        let without = state.snapshot().unwrap();
        create(&mut state, 1).unwrap();
        rotate(&mut state, 0, 2).unwrap();
        let restored = MetadataState::restore(&state.snapshot().unwrap()).unwrap();
        assert_eq!(restored, state);
        assert_eq!(
            MetadataState::restore(&without).unwrap().cursor_keys(),
            None
        );
    }

    #[test]
    fn a_secret_never_prints() {
        let command = Command::CreateCursorKey {
            secret: CursorSecret::new(b"a very secret secret of 32 bytes".to_vec()),
            at_ms: 0,
        };
        let printed = format!("{command:?}");
        assert!(!printed.contains("very secret"), "{printed}");
        assert!(!printed.contains("97"), "{printed}");
    }
}
