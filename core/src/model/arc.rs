//! A vnode's arc of the hash ring, and where a topic name falls on it.
//!
//! The ring maps a topic name to the vnode whose arc holds the name's ring
//! position. The arc a vnode owns is part of its replicated state (set by
//! `Command::AssignArc`), so the vnode itself refuses a command for a topic
//! outside it: a broker routing by a stale ring gets a typed refusal
//! (`ModelError::WrongVnode`) instead of creating a topic where no reader
//! routing by the current ring would look.

use super::keyspace::position;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a topic name falls on the ring: `xxh3_64(name)`, the same hash that
/// places a record key in the keyspace.
pub fn ring_position(topic: &str) -> u64 {
    position(topic.as_bytes())
}

/// A half-open arc `[start, end)` of the u64 ring. `end` is a u128 so the
/// arc reaching the top of the ring (`end = 2^64`) needs no wrap-around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RingArc {
    pub start: u64,
    pub end: u128,
}

/// The exclusive end of the whole ring.
pub const RING_END: u128 = 1 << 64;

impl RingArc {
    /// The whole ring.
    pub const FULL: RingArc = RingArc {
        start: 0,
        end: RING_END,
    };

    /// An arc, if it is non-empty and inside the ring.
    pub fn new(start: u64, end: u128) -> Option<RingArc> {
        (u128::from(start) < end && end <= RING_END).then_some(RingArc { start, end })
    }

    /// Whether a ring position lies in the arc.
    pub fn contains(&self, position: u64) -> bool {
        self.start <= position && u128::from(position) < self.end
    }

    /// Whether a topic name's ring position lies in the arc.
    pub fn holds_topic(&self, topic: &str) -> bool {
        self.contains(ring_position(topic))
    }

    /// Whether `other` lies entirely within this arc.
    pub fn covers(&self, other: &RingArc) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// The number of positions in the arc.
    pub fn len(&self) -> u128 {
        self.end - u128::from(self.start)
    }

    /// Never true for an arc built by `new`; present for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The two halves of the arc, if it holds at least two positions.
    pub fn halves(&self) -> Option<(RingArc, RingArc)> {
        let len = self.len();
        if len < 2 {
            return None;
        }
        let mid = u128::from(self.start) + len / 2;
        let mid_u64 = u64::try_from(mid).ok()?;
        Some((
            RingArc {
                start: self.start,
                end: mid,
            },
            RingArc {
                start: mid_u64,
                end: self.end,
            },
        ))
    }
}

impl fmt::Display for RingArc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#018x}, {:#x})", self.start, self.end)
    }
}
