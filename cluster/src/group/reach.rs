//! Whether each peer's cluster port can be reached from this broker (ADR
//! 0155): what the last connection attempts to it said, judged with a bound
//! and a hold so the answer does not flap.
//!
//! SWIM says a broker is alive; it does not say that this broker can open a
//! cluster-port session to it (TLS under the cluster CA, then the cookie
//! handshake). A broker with the cookie but another CA's certificate is
//! alive in SWIM and refused on every connection, so placement must not
//! count on it. The transports report every dial's outcome here
//! ([`TcpTransport::with_reach`](super::TcpTransport::with_reach)):
//!
//! - **Connected**: the TLS and cookie handshakes both passed.
//! - **Refused**: the peer proved it is not one of ours, or said we are not
//!   one of its: a TLS refusal (a certificate from another CA, self-signed,
//!   expired, a wrong name), a bad proof or another node's id in the cookie
//!   handshake, or a server that closed right after our proof (how a server
//!   answers another cookie). Unreachable at once.
//! - **Failed**: anything else (no TCP connection, a timeout, a close
//!   before the server's hello): a broker starting, restarting or loaded.
//!   Unreachable only once such failures, with no success between them,
//!   have lasted `unreachable_after_ms`.
//!
//! A peer never dialled, or never connected and failing for less than the
//! bound, is [`Reach::Unknown`], and never excluded: a cluster that has not
//! dialled yet (a start) places as before. A peer
//! judged unreachable that connects again stays unreachable for
//! `reachable_hold_ms` after that success, and a failure of any kind within
//! the hold keeps it so: a peer that flaps counts reachable only once it
//! stays up for the hold.
//!
//! Only dials are judged. An accepted connection that fails names no node
//! anyone proved (the cookie handshake's node id is a claim until the proof
//! checks out), so counting it would let anyone exclude a broker by
//! claiming its id; and every broker dials every member anyway (the
//! liveness prober's pings, every 200 ms).
//!
//! [`ReachTracker`] is the pure decision (time enters as milliseconds);
//! [`PeerReach`] holds one for the broker, reads its clock and tells a
//! [`ReachObserver`] each change.

use crate::clock::Clock;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The default `cluster.peer_unreachable_after_ms`: as long as raft calls to
/// a peer may fail before it is worth a warning
/// ([`PEER_FAILING_WARN_MS`](super::tcp::PEER_FAILING_WARN_MS)): shorter
/// gaps are a broker starting or restarting, or a loaded machine.
pub const PEER_UNREACHABLE_AFTER_MS_DEFAULT: u64 = 5_000;
/// The default `cluster.peer_reachable_hold_ms`.
pub const PEER_REACHABLE_HOLD_MS_DEFAULT: u64 = 5_000;

/// How a peer's reachability is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReachSettings {
    /// Failed dials (not refusals), with no success between them, for this
    /// long make a peer unreachable.
    pub unreachable_after_ms: u64,
    /// A peer judged unreachable stays so for this long after it connects
    /// again, and longer if a dial fails meanwhile.
    pub reachable_hold_ms: u64,
}

impl Default for ReachSettings {
    fn default() -> Self {
        ReachSettings {
            unreachable_after_ms: PEER_UNREACHABLE_AFTER_MS_DEFAULT,
            reachable_hold_ms: PEER_REACHABLE_HOLD_MS_DEFAULT,
        }
    }
}

/// What one dial of a peer's cluster port came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialOutcome {
    /// The TLS and cookie handshakes passed.
    Connected,
    /// The peer's certificate or proof was refused, or it refused ours.
    Refused,
    /// No session for another reason (connect, timeout, a close).
    Failed,
}

/// A peer's cluster port as this broker judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Never dialled (or forgotten): not excluded.
    Unknown,
    Reachable,
    Unreachable,
}

impl Reach {
    /// The word `cluster status` shows.
    pub fn label(self) -> &'static str {
        match self {
            Reach::Unknown => "unknown",
            Reach::Reachable => "reachable",
            Reach::Unreachable => "unreachable",
        }
    }
}

/// What the dials of one peer said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PeerDials {
    /// When a dial last connected.
    connected_ms: Option<u64>,
    /// When the failures since the last connection began.
    failing_since_ms: Option<u64>,
    /// The failures since the last connection make the peer unreachable
    /// whatever their age: one was a refusal, or one came while the peer
    /// was judged unreachable.
    failing_counts: bool,
    /// One of the failures since the last connection was a refusal.
    refused: bool,
    /// After a connection that ended an unreachable spell: unreachable
    /// until then.
    hold_until_ms: Option<u64>,
}

/// The dials of every peer, and the judgement over them.
#[derive(Debug, Clone, Default)]
pub struct ReachTracker {
    settings: ReachSettings,
    peers: BTreeMap<u64, PeerDials>,
}

impl ReachTracker {
    pub fn new(settings: ReachSettings) -> ReachTracker {
        ReachTracker {
            settings,
            peers: BTreeMap::new(),
        }
    }

    /// A dial of `peer` at `now_ms` came to `outcome`.
    pub fn dialled(&mut self, peer: u64, outcome: DialOutcome, now_ms: u64) {
        let was = self.judge(peer, now_ms);
        let hold_ms = self.settings.reachable_hold_ms;
        let dials = self.peers.entry(peer).or_default();
        match outcome {
            DialOutcome::Connected => {
                dials.connected_ms = Some(now_ms);
                dials.failing_since_ms = None;
                dials.failing_counts = false;
                dials.refused = false;
                // Ending an unreachable spell starts (or keeps) a hold.
                dials.hold_until_ms = (was == Reach::Unreachable)
                    .then(|| {
                        let hold = now_ms.saturating_add(hold_ms);
                        dials.hold_until_ms.map_or(hold, |h| h.max(hold))
                    })
                    .or(dials.hold_until_ms.filter(|h| *h > now_ms));
            }
            DialOutcome::Refused | DialOutcome::Failed => {
                dials.failing_since_ms.get_or_insert(now_ms);
                if outcome == DialOutcome::Refused || was == Reach::Unreachable {
                    dials.failing_counts = true;
                }
                dials.refused |= outcome == DialOutcome::Refused;
                dials.hold_until_ms = None;
            }
        }
    }

    /// Forgets `peer` (it left the cluster): unknown again.
    pub fn forget(&mut self, peer: u64) {
        self.peers.remove(&peer);
    }

    /// `peer`'s cluster port at `now_ms`.
    pub fn judge(&self, peer: u64, now_ms: u64) -> Reach {
        let Some(dials) = self.peers.get(&peer) else {
            return Reach::Unknown;
        };
        if let Some(since) = dials.failing_since_ms {
            let long = now_ms.saturating_sub(since) >= self.settings.unreachable_after_ms;
            return if dials.failing_counts || long {
                Reach::Unreachable
            } else if dials.connected_ms.is_some() {
                Reach::Reachable
            } else {
                // Young failures of a peer never reached: not proven
                // either way (a start), so not excluded.
                Reach::Unknown
            };
        }
        match dials.hold_until_ms {
            Some(until) if now_ms < until => Reach::Unreachable,
            _ if dials.connected_ms.is_some() => Reach::Reachable,
            _ => Reach::Unknown,
        }
    }

    /// Whether a dial of `peer` was refused since it last connected.
    pub fn refused(&self, peer: u64) -> bool {
        self.peers.get(&peer).is_some_and(|dials| dials.refused)
    }

    /// Every peer dialled, judged at `now_ms`.
    pub fn all(&self, now_ms: u64) -> BTreeMap<u64, Reach> {
        self.peers
            .keys()
            .map(|peer| (*peer, self.judge(*peer, now_ms)))
            .collect()
    }
}

/// One change of a peer's judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReachChange {
    pub peer: u64,
    pub before: Reach,
    pub now: Reach,
    /// A dial was refused since the peer last connected (not merely
    /// failed): the peer is up and not one of ours, or refuses us.
    pub refused: bool,
}

/// Told each time a peer's judgement changes (the broker's gauge and log).
pub trait ReachObserver: Send + Sync + std::fmt::Debug + 'static {
    fn changed(&self, change: ReachChange);
}

/// This broker's judgement of its peers' cluster ports, shared by both
/// transports (raft's and replication's): a dial of either counts.
#[derive(Debug)]
pub struct PeerReach {
    clock: Arc<dyn Clock>,
    inner: parking_lot::Mutex<Judged>,
    observer: Option<Arc<dyn ReachObserver>>,
}

#[derive(Debug)]
struct Judged {
    tracker: ReachTracker,
    /// The judgement last told to the observer, per peer.
    told: BTreeMap<u64, Reach>,
}

impl PeerReach {
    pub fn new(settings: ReachSettings, clock: Arc<dyn Clock>) -> PeerReach {
        PeerReach {
            clock,
            inner: parking_lot::Mutex::new(Judged {
                tracker: ReachTracker::new(settings),
                told: BTreeMap::new(),
            }),
            observer: None,
        }
    }

    /// The same judgement, telling `observer` each change.
    pub fn observed_by(mut self, observer: Arc<dyn ReachObserver>) -> PeerReach {
        self.observer = Some(observer);
        self
    }

    /// A dial of `peer` came to `outcome` now.
    pub fn dialled(&self, peer: u64, outcome: DialOutcome) {
        let now_ms = self.clock.monotonic_ms();
        let changes = {
            let mut inner = self.inner.lock();
            inner.tracker.dialled(peer, outcome, now_ms);
            inner.changes(now_ms)
        };
        self.tell(changes);
    }

    /// Forgets `peer` (it left): unknown again.
    pub fn forget(&self, peer: u64) {
        let mut inner = self.inner.lock();
        inner.tracker.forget(peer);
        inner.told.remove(&peer);
    }

    /// Judges every peer again now, telling the observer what changed with
    /// time alone (failures that grew old enough, a hold that ended).
    pub fn refresh(&self) {
        let now_ms = self.clock.monotonic_ms();
        let changes = self.inner.lock().changes(now_ms);
        self.tell(changes);
    }

    /// `peer`'s cluster port now.
    pub fn judge(&self, peer: u64) -> Reach {
        let now_ms = self.clock.monotonic_ms();
        self.inner.lock().tracker.judge(peer, now_ms)
    }

    /// Every peer dialled, judged now.
    pub fn all(&self) -> BTreeMap<u64, Reach> {
        let now_ms = self.clock.monotonic_ms();
        self.inner.lock().tracker.all(now_ms)
    }

    fn tell(&self, changes: Vec<ReachChange>) {
        if let Some(observer) = &self.observer {
            for change in changes {
                observer.changed(change);
            }
        }
    }
}

impl Judged {
    /// The judgements that differ from those last told, now told.
    fn changes(&mut self, now_ms: u64) -> Vec<ReachChange> {
        let mut changes = Vec::new();
        for (peer, now) in self.tracker.all(now_ms) {
            let before = self.told.insert(peer, now).unwrap_or(Reach::Unknown);
            if before != now {
                let refused = self.tracker.refused(peer);
                changes.push(ReachChange {
                    peer,
                    before,
                    now,
                    refused,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DialOutcome::{Connected, Failed, Refused};

    fn tracker() -> ReachTracker {
        ReachTracker::new(ReachSettings {
            unreachable_after_ms: 1_000,
            reachable_hold_ms: 500,
        })
    }

    #[test]
    fn a_peer_never_dialled_is_unknown_and_one_that_connected_is_reachable() {
        let mut t = tracker();
        assert_eq!(t.judge(2, 0), Reach::Unknown);
        t.dialled(2, Connected, 10);
        assert_eq!(t.judge(2, 10), Reach::Reachable);
        assert_eq!(t.judge(2, 1_000_000), Reach::Reachable, "a session lasts");
        assert_eq!(t.all(20), BTreeMap::from([(2, Reach::Reachable)]));
    }

    #[test]
    fn a_refusal_makes_a_peer_unreachable_at_once() {
        let mut t = tracker();
        t.dialled(3, Refused, 100);
        assert_eq!(t.judge(3, 100), Reach::Unreachable);
        // Also after a session: a peer whose certificate changed.
        t.dialled(4, Connected, 100);
        t.dialled(4, Refused, 200);
        assert_eq!(t.judge(4, 200), Reach::Unreachable);
    }

    #[test]
    fn failed_dials_count_only_once_they_last_the_bound() {
        let mut t = tracker();
        t.dialled(2, Failed, 100);
        assert_eq!(t.judge(2, 100), Reach::Unknown, "a start, not a fault");
        t.dialled(2, Failed, 600);
        assert_eq!(t.judge(2, 1_099), Reach::Unknown);
        assert_eq!(t.judge(2, 1_100), Reach::Unreachable, "1 s since the first");
        // A success ends the streak: the next failure starts a new one.
        let mut t = tracker();
        t.dialled(2, Failed, 0);
        t.dialled(2, Connected, 900);
        t.dialled(2, Failed, 950);
        assert_eq!(t.judge(2, 1_500), Reach::Reachable);
        assert_eq!(t.judge(2, 1_950), Reach::Unreachable);
    }

    #[test]
    fn a_peer_back_from_unreachable_is_held_out_and_a_flap_restarts_the_hold() {
        let mut t = tracker();
        t.dialled(3, Refused, 0);
        t.dialled(3, Connected, 1_000);
        assert_eq!(t.judge(3, 1_000), Reach::Unreachable, "held");
        assert_eq!(t.judge(3, 1_499), Reach::Unreachable);
        assert_eq!(t.judge(3, 1_500), Reach::Reachable, "the hold ended");
        // A plain failure within the hold counts as a refusal would.
        t.dialled(3, Refused, 2_000);
        t.dialled(3, Connected, 2_100);
        t.dialled(3, Failed, 2_200);
        assert_eq!(t.judge(3, 2_700), Reach::Unreachable, "failed while held");
        t.dialled(3, Connected, 3_000);
        assert_eq!(t.judge(3, 3_400), Reach::Unreachable);
        assert_eq!(t.judge(3, 3_500), Reach::Reachable);
        // A failure after the hold is an ordinary one again.
        t.dialled(3, Failed, 3_600);
        assert_eq!(t.judge(3, 3_700), Reach::Reachable);
    }

    #[test]
    fn a_forgotten_peer_is_unknown() {
        let mut t = tracker();
        t.dialled(3, Refused, 0);
        t.forget(3);
        assert_eq!(t.judge(3, 1), Reach::Unknown);
    }

    #[derive(Debug, Default)]
    struct Told(parking_lot::Mutex<Vec<(u64, Reach, Reach, bool)>>);

    impl ReachObserver for Told {
        fn changed(&self, c: ReachChange) {
            self.0.lock().push((c.peer, c.before, c.now, c.refused));
        }
    }

    #[test]
    fn the_observer_hears_each_change_once_including_those_of_time_alone() {
        let clock = Arc::new(crate::clock::ManualClock::new(0));
        let told = Arc::new(Told::default());
        let reach = PeerReach::new(
            ReachSettings {
                unreachable_after_ms: 1_000,
                reachable_hold_ms: 500,
            },
            Arc::clone(&clock) as Arc<dyn Clock>,
        )
        .observed_by(Arc::clone(&told) as Arc<dyn ReachObserver>);
        reach.dialled(2, Failed);
        reach.dialled(2, Failed);
        clock.advance_ms(1_000);
        reach.refresh();
        reach.refresh();
        reach.dialled(2, Connected);
        clock.advance_ms(500);
        reach.refresh();
        reach.dialled(3, Refused);
        assert_eq!(
            *told.0.lock(),
            vec![
                (2, Reach::Unknown, Reach::Unreachable, false),
                (2, Reach::Unreachable, Reach::Reachable, false),
                (3, Reach::Unknown, Reach::Unreachable, true),
            ]
        );
        assert_eq!(reach.judge(2), Reach::Reachable);
    }
}
