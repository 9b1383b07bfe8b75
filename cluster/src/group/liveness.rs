//! Broker liveness for quiet groups (ADR 0101): which peers answer now.
//!
//! A quiet raft group sends no heartbeats, so its followers cannot learn
//! from silence that their leader is gone. They learn it here instead: one
//! probe per peer every `probe_every_ms`, whatever the number of groups, on
//! the raft transport's own connections. A peer is *up* while one of its
//! answers is younger than `down_after_ms`; a peer never heard from is down,
//! so a starting broker's groups elect as they always did.
//!
//! A peer whose boot id (the ping's answer, drawn at each start of its
//! transport server) changes restarted between two probes: it counts as
//! down for `down_after_ms` from then, exactly as if it had been silent
//! that long, so the quiet followers of the groups it led wake and elect
//! rather than keep believing in a leadership the restart ended.
//!
//! `LivenessTracker` is the pure decision (time enters as milliseconds);
//! `Prober` runs it against a `TcpTransport`, one round at a time, and
//! publishes the up set on a watch channel it keeps across restarts of
//! the task running the rounds (`spawn_prober` runs one, unwatched). The
//! probe is answered by the transport server itself
//! (`PING_API_KEY`), so a broker whose process is gone, or whose raft port
//! is cut off, stops answering within one probe's timeout.

use super::tcp::{PING_API_KEY, PING_UNFIT_TO_LEAD, TcpTransport};
use crate::clock::Clock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a ping's answer says: the peer's boot id (`None` from a broker
/// that sends none) and whether it can lead raft groups now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingAnswer {
    pub boot: Option<u64>,
    pub unfit_to_lead: bool,
}

impl PingAnswer {
    /// Reads an answer: 8 bytes of boot id, then a flags byte that an
    /// older broker does not send (read as no flags).
    pub fn decode(body: &[u8]) -> PingAnswer {
        let boot = body
            .get(..8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_be_bytes);
        let flags = body.get(8).copied().unwrap_or(0);
        PingAnswer {
            boot,
            unfit_to_lead: flags & PING_UNFIT_TO_LEAD != 0,
        }
    }
}

/// How peers are probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessSettings {
    /// How often every peer is probed.
    pub probe_every_ms: u64,
    /// How long one probe waits for its answer.
    pub probe_timeout_ms: u64,
    /// A peer with no answer younger than this is down.
    pub down_after_ms: u64,
}

impl Default for LivenessSettings {
    /// Probes every 200 ms; a peer is down after 1 s without an answer, so
    /// a quiet group starts its election about as soon as a group with
    /// raft's own 300 to 600 ms election timer would, and well within the
    /// 2 s a leader's loss may take to repair.
    fn default() -> Self {
        LivenessSettings {
            probe_every_ms: 200,
            probe_timeout_ms: 500,
            down_after_ms: 1_000,
        }
    }
}

impl LivenessSettings {
    /// Whether these settings can decide anything: a probe must be able to
    /// answer before its peer counts as down.
    pub fn validate(&self) -> Result<(), LivenessError> {
        if self.probe_every_ms == 0 {
            return Err(LivenessError::ZeroProbeInterval);
        }
        if self.probe_timeout_ms == 0 || self.probe_timeout_ms >= self.down_after_ms {
            return Err(LivenessError::ProbeTimeout {
                probe_timeout_ms: self.probe_timeout_ms,
                down_after_ms: self.down_after_ms,
            });
        }
        if self.probe_every_ms >= self.down_after_ms {
            return Err(LivenessError::ProbeInterval {
                probe_every_ms: self.probe_every_ms,
                down_after_ms: self.down_after_ms,
            });
        }
        Ok(())
    }
}

/// Liveness settings that cannot decide anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LivenessError {
    #[error("probe_every_ms must be positive")]
    ZeroProbeInterval,
    #[error("probe_timeout_ms must be positive and below down_after_ms")]
    ProbeTimeout {
        probe_timeout_ms: u64,
        down_after_ms: u64,
    },
    #[error("probe_every_ms must be below down_after_ms")]
    ProbeInterval {
        probe_every_ms: u64,
        down_after_ms: u64,
    },
}

/// When each peer last answered, and so which are up.
#[derive(Debug, Clone)]
pub struct LivenessTracker {
    node_id: u64,
    down_after_ms: u64,
    answered_ms: BTreeMap<u64, u64>,
    /// Each peer's last boot id.
    boots: BTreeMap<u64, u64>,
    /// When each peer was last seen with a new boot id.
    rebooted_ms: BTreeMap<u64, u64>,
    /// Peers whose last answer said they cannot lead now.
    unfit: BTreeSet<u64>,
}

impl LivenessTracker {
    pub fn new(node_id: u64, down_after_ms: u64) -> LivenessTracker {
        LivenessTracker {
            node_id,
            down_after_ms,
            answered_ms: BTreeMap::new(),
            boots: BTreeMap::new(),
            rebooted_ms: BTreeMap::new(),
            unfit: BTreeSet::new(),
        }
    }

    /// `peer` answered a probe sent at `sent_ms` with `answer`. A boot id
    /// other than the last one seen means the peer restarted: down for
    /// `down_after_ms` from `sent_ms`.
    pub fn answered_by(&mut self, peer: u64, sent_ms: u64, answer: PingAnswer) {
        if answer.unfit_to_lead {
            self.unfit.insert(peer);
        } else {
            self.unfit.remove(&peer);
        }
        if let Some(boot) = answer.boot
            && let Some(before) = self.boots.insert(peer, boot)
            && before != boot
        {
            self.rebooted_ms.insert(peer, sent_ms);
        }
        self.answered(peer, sent_ms);
    }

    /// `peer` answered a probe sent at `sent_ms` (the send time, not the
    /// arrival: an answer proves the peer was up when it was asked).
    pub fn answered(&mut self, peer: u64, sent_ms: u64) {
        let at = self.answered_ms.entry(peer).or_insert(sent_ms);
        *at = (*at).max(sent_ms);
    }

    /// The nodes up at `now_ms`: this node, and every peer whose last
    /// answer is younger than `down_after_ms`.
    pub fn up(&self, now_ms: u64) -> BTreeSet<u64> {
        let mut up: BTreeSet<u64> = self
            .answered_ms
            .iter()
            .filter(|(_, at)| now_ms.saturating_sub(**at) < self.down_after_ms)
            .map(|(peer, _)| *peer)
            .filter(|peer| {
                self.rebooted_ms
                    .get(peer)
                    .is_none_or(|at| now_ms.saturating_sub(*at) >= self.down_after_ms)
            })
            .collect();
        up.insert(self.node_id);
        up
    }

    /// The nodes that may lead at `now_ms`: those up whose last answer did
    /// not say they cannot (this node included; it judges itself).
    pub fn leadable(&self, now_ms: u64) -> BTreeSet<u64> {
        let mut up = self.up(now_ms);
        up.retain(|n| *n == self.node_id || !self.unfit.contains(n));
        up
    }
}

/// The prober's state: its peers, what it learned of them, and the watch
/// it publishes the up set on. Kept by its owner across restarts of the
/// task that runs it, so a restarted prober feeds the same watch from what
/// the last one learned, and whoever follows the up set never notices.
pub struct Prober {
    node_id: u64,
    transport: Arc<TcpTransport>,
    settings: LivenessSettings,
    clock: Arc<dyn Clock>,
    /// The peers probed: every member but this node, kept current.
    peers: parking_lot::RwLock<Vec<u64>>,
    tracker: parking_lot::Mutex<LivenessTracker>,
    up: watch::Sender<BTreeSet<u64>>,
    /// The up set less the peers that cannot lead now: what quiet
    /// followers judge their leader by.
    leadable: watch::Sender<BTreeSet<u64>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("node_id", &self.node_id)
            .field("settings", &self.settings)
            .field("up", &*self.up.borrow())
            .finish_non_exhaustive()
    }
}

impl Prober {
    pub fn new(
        transport: Arc<TcpTransport>,
        node_id: u64,
        settings: LivenessSettings,
        clock: Arc<dyn Clock>,
    ) -> Prober {
        let tracker = LivenessTracker::new(node_id, settings.down_after_ms);
        let (up, _) = watch::channel(tracker.up(clock.monotonic_ms()));
        let (leadable, _) = watch::channel(tracker.leadable(clock.monotonic_ms()));
        Prober {
            node_id,
            transport,
            settings,
            clock,
            peers: parking_lot::RwLock::new(Vec::new()),
            tracker: parking_lot::Mutex::new(tracker),
            up,
            leadable,
        }
    }

    /// Probes `peers` (this node left out) from the next round on.
    pub fn set_peers(&self, peers: Vec<u64>) {
        *self.peers.write() = peers.into_iter().filter(|p| *p != self.node_id).collect();
    }

    /// The nodes up now, by the last round (this node included).
    pub fn up(&self) -> BTreeSet<u64> {
        self.up.borrow().clone()
    }

    /// A receiver of the up set, whichever task runs the rounds.
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u64>> {
        self.up.subscribe()
    }

    /// A receiver of the nodes that may lead (`LivenessTracker::leadable`).
    pub fn subscribe_leadable(&self) -> watch::Receiver<BTreeSet<u64>> {
        self.leadable.subscribe()
    }

    /// The timer of the rounds: one every `probe_every_ms`, a late one
    /// not made up for.
    pub fn rounds(&self) -> tokio::time::Interval {
        let mut round = tokio::time::interval(Duration::from_millis(self.settings.probe_every_ms));
        round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        round
    }

    /// Probes every peer once and publishes the up set if it changed.
    pub async fn probe_round(&self) {
        // Read each round: the members change as brokers join and leave.
        let peers: Vec<u64> = self.peers.read().clone();
        let sent_ms = self.clock.monotonic_ms();
        let probes = peers.iter().map(|peer| async move {
            let answer = self
                .transport
                .call_raw(*peer, PING_API_KEY, 0, &[], self.settings.probe_timeout_ms)
                .await;
            (*peer, answer)
        });
        let answers = futures::future::join_all(probes).await;
        // The round's dials were told to the reach judgement as they ended;
        // what changes with time alone (old failures, an ended hold) is
        // judged here, every round (ADR 0155).
        if let Some(reach) = self.transport.reach() {
            reach.refresh();
        }
        let (up, leadable) = {
            let mut tracker = self.tracker.lock();
            for (peer, answer) in answers {
                if let Ok(body) = answer {
                    tracker.answered_by(peer, sent_ms, PingAnswer::decode(&body));
                }
            }
            let now_ms = self.clock.monotonic_ms();
            (tracker.up(now_ms), tracker.leadable(now_ms))
        };
        self.leadable.send_if_modified(|current| {
            let changed = *current != leadable;
            if changed {
                tracing::debug!(
                    node = self.node_id,
                    ?leadable,
                    "peers that may lead changed"
                );
                *current = leadable;
            }
            changed
        });
        let node = self.node_id;
        self.up.send_if_modified(|current| {
            if *current == up {
                return false;
            }
            let gone: Vec<u64> = current.difference(&up).copied().collect();
            let back: Vec<u64> = up.difference(current).copied().collect();
            tracing::debug!(node, ?gone, ?back, "peer liveness changed");
            *current = up;
            true
        });
    }
}

/// Probes `peers` until the returned handle is aborted (or every receiver
/// of the up set is gone), and publishes the up set (this node included)
/// whenever it changes. Unwatched: the vnode host runs a `Prober` under
/// its owner instead (`HostLoop::Prober`).
pub fn spawn_prober(
    transport: Arc<TcpTransport>,
    node_id: u64,
    peers: Arc<parking_lot::RwLock<Vec<u64>>>,
    settings: LivenessSettings,
    clock: Arc<dyn Clock>,
) -> (watch::Receiver<BTreeSet<u64>>, JoinHandle<()>) {
    let prober = Prober::new(transport, node_id, settings, clock);
    let rx = prober.subscribe();
    let task = tokio::spawn(async move {
        let mut round = prober.rounds();
        loop {
            round.tick().await;
            prober.set_peers(peers.read().clone());
            prober.probe_round().await;
            if prober.up.is_closed() {
                break;
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_up_only_while_its_last_answer_is_younger_than_the_bound() {
        let mut t = LivenessTracker::new(1, 1_000);
        assert_eq!(t.up(0), BTreeSet::from([1]), "never heard from: down");
        t.answered(2, 100);
        assert_eq!(t.up(100), BTreeSet::from([1, 2]));
        assert_eq!(t.up(1_099), BTreeSet::from([1, 2]));
        assert_eq!(t.up(1_100), BTreeSet::from([1]), "1 s without an answer");
        // A late answer to an old probe does not make it younger.
        t.answered(2, 50);
        assert_eq!(t.up(1_100), BTreeSet::from([1]));
        t.answered(2, 1_200);
        assert_eq!(t.up(1_300), BTreeSet::from([1, 2]));
    }

    fn boot(id: u64) -> PingAnswer {
        PingAnswer {
            boot: Some(id),
            unfit_to_lead: false,
        }
    }

    /// Regression (CI, `full_volume`): a broker whose full volume stopped
    /// its raft replicas stayed up, so the quiet followers of the groups it
    /// led never elected, and creates through the other brokers failed.
    #[test]
    fn a_peer_that_says_it_cannot_lead_is_up_but_not_leadable_until_it_can() {
        let mut t = LivenessTracker::new(1, 1_000);
        let unfit = PingAnswer {
            boot: Some(7),
            unfit_to_lead: true,
        };
        t.answered_by(2, 100, boot(7));
        t.answered_by(3, 100, unfit);
        assert_eq!(t.up(200), BTreeSet::from([1, 2, 3]));
        assert_eq!(t.leadable(200), BTreeSet::from([1, 2]));
        t.answered_by(3, 300, boot(7));
        assert_eq!(t.leadable(400), BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn a_ping_answer_reads_its_flags_and_an_older_brokers_answer() {
        let mut body = 9u64.to_be_bytes().to_vec();
        assert_eq!(PingAnswer::decode(&body), boot(9), "8 bytes: no flags");
        body.push(PING_UNFIT_TO_LEAD);
        assert_eq!(
            PingAnswer::decode(&body),
            PingAnswer {
                boot: Some(9),
                unfit_to_lead: true
            }
        );
        assert_eq!(PingAnswer::decode(&[1, 2]), PingAnswer::default());
    }

    #[test]
    fn a_peer_that_restarted_between_probes_is_down_for_the_bound() {
        let mut t = LivenessTracker::new(1, 1_000);
        t.answered_by(2, 100, boot(7));
        t.answered_by(2, 300, boot(7));
        assert!(t.up(400).contains(&2));
        // A new boot id: down from its probe for 1 s, though it answers.
        t.answered_by(2, 500, boot(8));
        assert!(!t.up(600).contains(&2));
        t.answered_by(2, 1_400, boot(8));
        assert!(!t.up(1_450).contains(&2));
        assert!(t.up(1_500).contains(&2));
        // A broker that sends no boot id is judged by its answers alone.
        t.answered_by(3, 1_500, PingAnswer::default());
        assert!(t.up(1_600).contains(&3));
    }

    #[test]
    fn settings_that_cannot_decide_are_refused() {
        assert!(LivenessSettings::default().validate().is_ok());
        let bad = |f: fn(&mut LivenessSettings)| {
            let mut s = LivenessSettings::default();
            f(&mut s);
            s.validate().is_err()
        };
        assert!(bad(|s| s.probe_every_ms = 0));
        assert!(bad(|s| s.probe_timeout_ms = 0));
        assert!(bad(|s| s.probe_timeout_ms = s.down_after_ms));
        assert!(bad(|s| s.probe_every_ms = s.down_after_ms));
    }
}
