//! Routing hints: the custom SWIM broadcast that spreads each broker's ring
//! version and the vnodes it leads (with their raft terms).
//!
//! Hints are hints: raft is the authority on who leads a vnode (decisions
//! §8). A client-facing broker uses them to guess where to send a request and
//! the leader corrects it with `not_leader` when the guess is stale.
//!
//! Format (version 1, big-endian, at most [`ROUTING_BYTES_MAX`] bytes):
//!
//! ```text
//! u8 version=1 | u64 node_id | u64 incarnation | u64 seq | u64 ring_version
//! | u16 count | (u32 vnode, u64 term)*
//! ```
//!
//! `seq` grows with every hint one incarnation of a broker publishes, so a
//! member keeps only the newest hint of each broker and foca stops
//! disseminating the older one.

use std::collections::BTreeMap;
use std::sync::Arc;

use foca::{BroadcastHandler, Invalidates};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::identity::NodeIdentity;

/// The routing hint format this build writes and reads.
pub const ROUTING_VERSION: u8 = 1;
/// Vnode leaderships one hint carries: it must fit in one SWIM packet beside
/// the header's two identities.
pub const ROUTING_LEADERS_MAX: usize = 64;
/// The largest encoded hint.
pub const ROUTING_BYTES_MAX: usize = 1 + 8 * 4 + 2 + ROUTING_LEADERS_MAX * 12;
/// Hints one member keeps (one per broker).
pub const ROUTING_HINTS_MAX: usize = 4096;

/// One vnode this broker leads and the raft term it leads it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VnodeLeader {
    pub vnode: u32,
    pub term: u64,
}

/// What one broker last said about routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingHint {
    pub node_id: u64,
    /// The publisher's identity incarnation when it said this.
    pub incarnation: u64,
    pub seq: u64,
    pub ring_version: u64,
    pub leaders: Vec<VnodeLeader>,
}

/// Why a hint is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    #[error("routing hint truncated")]
    Truncated,
    #[error("routing hint version {0} is not supported")]
    Version(u8),
    #[error("{0} vnode leaders, at most {ROUTING_LEADERS_MAX} fit in one hint")]
    TooManyLeaders(usize),
    #[error("routing hint has {0} trailing bytes")]
    Trailing(usize),
}

impl RoutingHint {
    pub fn encode(&self) -> Result<Vec<u8>, RoutingError> {
        if self.leaders.len() > ROUTING_LEADERS_MAX {
            return Err(RoutingError::TooManyLeaders(self.leaders.len()));
        }
        let mut out = Vec::with_capacity(ROUTING_BYTES_MAX);
        out.push(ROUTING_VERSION);
        for v in [self.node_id, self.incarnation, self.seq, self.ring_version] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&(self.leaders.len() as u16).to_be_bytes());
        for leader in &self.leaders {
            out.extend_from_slice(&leader.vnode.to_be_bytes());
            out.extend_from_slice(&leader.term.to_be_bytes());
        }
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<RoutingHint, RoutingError> {
        let mut rest = bytes;
        let mut take = |n: usize| -> Result<&[u8], RoutingError> {
            if rest.len() < n {
                return Err(RoutingError::Truncated);
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let version = take(1)?[0];
        if version != ROUTING_VERSION {
            return Err(RoutingError::Version(version));
        }
        let mut u64s = [0u64; 4];
        for slot in &mut u64s {
            let mut a = [0u8; 8];
            a.copy_from_slice(take(8)?);
            *slot = u64::from_be_bytes(a);
        }
        let c = take(2)?;
        let count = usize::from(u16::from_be_bytes([c[0], c[1]]));
        if count > ROUTING_LEADERS_MAX {
            return Err(RoutingError::TooManyLeaders(count));
        }
        let mut leaders = Vec::with_capacity(count);
        for _ in 0..count {
            let mut v = [0u8; 4];
            v.copy_from_slice(take(4)?);
            let mut t = [0u8; 8];
            t.copy_from_slice(take(8)?);
            leaders.push(VnodeLeader {
                vnode: u32::from_be_bytes(v),
                term: u64::from_be_bytes(t),
            });
        }
        if !rest.is_empty() {
            return Err(RoutingError::Trailing(rest.len()));
        }
        let [node_id, incarnation, seq, ring_version] = u64s;
        Ok(RoutingHint {
            node_id,
            incarnation,
            seq,
            ring_version,
            leaders,
        })
    }

    fn version_key(&self) -> (u64, u64) {
        (self.incarnation, self.seq)
    }
}

/// Which hint a foca backlog entry is: a newer hint of the same broker
/// replaces an older one still being disseminated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKey {
    node_id: u64,
    incarnation: u64,
    seq: u64,
}

impl Invalidates for RoutingKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.node_id == other.node_id
            && (self.incarnation, self.seq) >= (other.incarnation, other.seq)
    }
}

/// The newest hint of every broker, shared between foca's broadcast handler
/// (which writes it) and the core (which reads it into the view): foca owns
/// its handler and does not lend it back.
#[derive(Debug, Clone, Default)]
pub struct RoutingTable(Arc<Mutex<BTreeMap<u64, RoutingHint>>>);

impl RoutingTable {
    pub fn get(&self, node_id: u64) -> Option<RoutingHint> {
        self.0.lock().get(&node_id).cloned()
    }
}

/// Tells foca which received hints are news worth passing on.
#[derive(Debug, Default)]
pub struct RoutingHandler {
    table: RoutingTable,
}

impl RoutingHandler {
    pub fn new(table: RoutingTable) -> RoutingHandler {
        RoutingHandler { table }
    }
}

impl BroadcastHandler<NodeIdentity> for RoutingHandler {
    type Key = RoutingKey;
    type Error = RoutingError;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&NodeIdentity>,
    ) -> Result<Option<RoutingKey>, RoutingError> {
        let hint = RoutingHint::decode(data)?;
        let mut latest = self.table.0.lock();
        if let Some(known) = latest.get(&hint.node_id)
            && known.version_key() >= hint.version_key()
        {
            return Ok(None);
        }
        if !latest.contains_key(&hint.node_id) && latest.len() >= ROUTING_HINTS_MAX {
            // A full table keeps what it has: dropping a hint only delays
            // routing, it never misroutes (leaders correct stale guesses).
            return Ok(None);
        }
        let key = RoutingKey {
            node_id: hint.node_id,
            incarnation: hint.incarnation,
            seq: hint.seq,
        };
        latest.insert(hint.node_id, hint);
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hint(seq: u64) -> RoutingHint {
        RoutingHint {
            node_id: 2,
            incarnation: 10,
            seq,
            ring_version: 7,
            leaders: vec![VnodeLeader { vnode: 3, term: 4 }],
        }
    }

    #[test]
    fn a_hint_round_trips() {
        let h = hint(1);
        assert_eq!(RoutingHint::decode(&h.encode().unwrap()).unwrap(), h);
    }

    #[test]
    fn a_full_hint_fits_its_bound() {
        let mut h = hint(1);
        h.leaders = (0..ROUTING_LEADERS_MAX as u32)
            .map(|vnode| VnodeLeader { vnode, term: 1 })
            .collect();
        assert_eq!(h.encode().unwrap().len(), ROUTING_BYTES_MAX);
        h.leaders.push(VnodeLeader { vnode: 0, term: 0 });
        assert_eq!(
            h.encode(),
            Err(RoutingError::TooManyLeaders(ROUTING_LEADERS_MAX + 1))
        );
    }

    #[test]
    fn only_a_newer_hint_of_a_broker_is_news() {
        let table = RoutingTable::default();
        let mut handler = RoutingHandler::new(table.clone());
        let second = hint(2).encode().unwrap();
        let first = hint(1).encode().unwrap();
        assert!(handler.receive_item(&second, None).unwrap().is_some());
        assert!(handler.receive_item(&first, None).unwrap().is_none());
        assert!(handler.receive_item(&second, None).unwrap().is_none());
        assert_eq!(table.get(2).map(|h| h.seq), Some(2));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..900)) {
            let _ = RoutingHint::decode(&bytes);
        }
    }
}
