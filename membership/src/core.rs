//! The SWIM core: foca plus what the broker needs on top of it, with no I/O.
//!
//! foca runs the protocol (probes, indirect probes, suspicion, refutation,
//! dissemination) and reports only "member up" and "member down". The core
//! turns foca's full member table into a [`MembershipView`] keyed by node id
//! after every input, and diffs consecutive views into [`MemberEvent`]s, so
//! subscribers also see suspicion and refutation. Inputs (packets, timers,
//! announces) go in through methods; what foca wants done (packets to send,
//! timers to arm) and the events come out through [`Effects`]. The UDP
//! runtime (`runtime.rs`) and the in-memory simulation of the tests drive the
//! same core.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

use bytes::Bytes;
use foca::{Foca, OwnedNotification, PostcardCodec, Timer};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tracing::{debug, info, warn};

use super::MembershipError;
use super::identity::NodeIdentity;
use super::routing::{
    ROUTING_LEADERS_MAX, RoutingError, RoutingHandler, RoutingHint, RoutingTable, VnodeLeader,
};
use super::view::{Member, MemberEvent, MemberEventKind, MemberState, MembershipView};

/// Peers one view keeps (dead ones included).
pub const PEERS_MAX: usize = 4096;
/// Smallest SWIM packet the settings accept: two identities and an update
/// must fit in one.
pub const PACKET_BYTES_MIN: usize = 1400;
/// Largest SWIM packet (a UDP datagram).
pub const PACKET_BYTES_MAX: usize = 65_000;

/// Once a broker knows another member, a seed it does not see as a live
/// member is announced to every this many seed ticks (10 s at the default
/// `seed_retry_ms`). Without this, a broker that a later broker reached
/// first stopped announcing and never joined its seeds' cluster: two
/// clusters, each whole in its own eyes (the sealed_swim flake).
pub const SEED_RETRY_CONNECTED_TICKS: u64 = 10;

/// The SWIM timers and limits. Tests shorten them; production keeps the
/// defaults unless the network is slow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwimSettings {
    /// How often a member probes another.
    pub probe_period_ms: u64,
    /// How long a direct probe waits before asking others to probe.
    pub probe_rtt_ms: u64,
    /// How long a suspect member has to refute before it is declared dead.
    pub suspect_timeout_ms: u64,
    /// Largest datagram sent or accepted.
    pub packet_bytes_max: usize,
    /// While no other member is known, announce to the seeds this often;
    /// once one is, a seed that is not a live member is announced to every
    /// [`SEED_RETRY_CONNECTED_TICKS`]th time.
    pub seed_retry_ms: u64,
}

impl Default for SwimSettings {
    /// Probes every 500 ms (it was 1 s): a failover waits for SWIM to
    /// suspect the primary *and* the raft port's prober (down after 1 s)
    /// to find it down, and with a 1 s period the suspicion, not the
    /// prober, set the tail (p99 2.1 to 2.9 s from a SIGKILL to the seal,
    /// ADR 0125). A suspicion alone fails nothing over; `malachi bench
    /// failover` counts the false ones.
    fn default() -> Self {
        SwimSettings {
            probe_period_ms: 500,
            probe_rtt_ms: 300,
            suspect_timeout_ms: 4000,
            packet_bytes_max: PACKET_BYTES_MIN,
            seed_retry_ms: 1000,
        }
    }
}

/// Settings that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("membership settings: {0}")]
pub struct SettingsError(pub String);

impl SwimSettings {
    pub fn validate(&self) -> Result<(), SettingsError> {
        let bad = |s: &str| Err(SettingsError(s.to_owned()));
        if self.probe_period_ms < 10 {
            return bad("probe_period_ms must be at least 10");
        }
        if self.probe_rtt_ms == 0 || self.probe_rtt_ms >= self.probe_period_ms {
            return bad("probe_rtt_ms must be positive and less than probe_period_ms");
        }
        if self.suspect_timeout_ms < self.probe_period_ms {
            return bad("suspect_timeout_ms must be at least probe_period_ms");
        }
        if !(PACKET_BYTES_MIN..=PACKET_BYTES_MAX).contains(&self.packet_bytes_max) {
            return bad("packet_bytes_max must be between 1400 and 65000");
        }
        if self.seed_retry_ms == 0 {
            return bad("seed_retry_ms must be positive");
        }
        Ok(())
    }

    fn foca_config(&self) -> foca::Config {
        let period = Duration::from_millis(self.probe_period_ms);
        let mut config = foca::Config::simple();
        config.probe_period = period;
        config.probe_rtt = Duration::from_millis(self.probe_rtt_ms);
        config.suspect_to_down_after = Duration::from_millis(self.suspect_timeout_ms);
        config.max_packet_size =
            NonZeroUsize::new(self.packet_bytes_max).unwrap_or(NonZeroUsize::MIN);
        config.max_transmissions = NonZeroU8::new(10).unwrap_or(NonZeroU8::MIN);
        // A member the cluster declared dead hears so when it talks again,
        // and renews its identity to rejoin (a paused process, a partition).
        config.notify_down_members = true;
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: period * 10,
            num_members: NonZeroUsize::MIN,
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: period * 5,
            num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        });
        config.periodic_gossip = Some(foca::PeriodicParams {
            frequency: (period / 4).max(Duration::from_millis(5)),
            num_members: NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN),
        });
        config
    }
}

/// What the core asks of its driver after an input.
#[derive(Debug, Default)]
pub struct Effects {
    /// Datagrams to send.
    pub sends: Vec<(SocketAddr, Bytes)>,
    /// Timers to hand back to [`MembershipCore::handle_timer`] after the delay.
    pub timers: Vec<(Duration, Timer<NodeIdentity>)>,
    /// Changes of the view, in order.
    pub events: Vec<MemberEvent>,
}

type Swim = Foca<NodeIdentity, PostcardCodec, SmallRng, RoutingHandler>;

/// One broker's SWIM state machine.
pub struct MembershipCore {
    foca: Swim,
    runtime: foca::AccumulatingRuntime<NodeIdentity>,
    view: MembershipView,
    events: Vec<MemberEvent>,
    routing: RoutingTable,
    routing_seq: u64,
    /// Set once the broker published routing: rejoins and newcomers get it again.
    routing_published: bool,
    /// Set by `leave`: being declared down is then expected.
    left: bool,
}

impl std::fmt::Debug for MembershipCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembershipCore")
            .field("local", &self.view.local)
            .field("peers", &self.view.peers.len())
            .finish()
    }
}

impl MembershipCore {
    /// A core for `identity`; `rng_seed` drives foca's choice of probe
    /// targets (the runtime seeds it from the OS, the simulation from its seed).
    pub fn new(
        identity: NodeIdentity,
        settings: &SwimSettings,
        rng_seed: u64,
    ) -> Result<MembershipCore, SettingsError> {
        settings.validate()?;
        identity
            .validate()
            .map_err(|e| SettingsError(format!("local identity: {e}")))?;
        let local = Member::from_identity(&identity, MemberState::Alive);
        let routing = RoutingTable::default();
        let foca = Foca::with_custom_broadcast(
            identity,
            settings.foca_config(),
            SmallRng::seed_from_u64(rng_seed),
            PostcardCodec,
            RoutingHandler::new(routing.clone()),
        );
        Ok(MembershipCore {
            foca,
            runtime: foca::AccumulatingRuntime::new(),
            view: MembershipView {
                local,
                peers: BTreeMap::new(),
            },
            events: Vec::new(),
            routing,
            routing_seq: 0,
            routing_published: false,
            left: false,
        })
    }

    pub fn view(&self) -> &MembershipView {
        &self.view
    }

    pub fn identity(&self) -> &NodeIdentity {
        self.foca.identity()
    }

    /// Whether any other member is known to be alive.
    pub fn is_connected(&self) -> bool {
        self.foca.num_members() > 0
    }

    /// The seeds to announce to at seed tick number `tick`: those that are
    /// not this broker and not a live member, at every tick while no other
    /// member is known, then at every [`SEED_RETRY_CONNECTED_TICKS`]th.
    /// Knowing *a* member is not knowing the seeds' cluster: the member may
    /// have reached this broker first from a cluster of its own.
    pub fn seeds_to_announce(&self, seeds: &[SocketAddr], tick: u64) -> Vec<SocketAddr> {
        if self.is_connected() && !tick.is_multiple_of(SEED_RETRY_CONNECTED_TICKS) {
            return Vec::new();
        }
        let own = self.identity().client_addr;
        seeds
            .iter()
            .copied()
            .filter(|seed| *seed != own)
            .filter(|seed| {
                !self
                    .view
                    .peers
                    .values()
                    .any(|m| m.state.is_live() && m.client_addr == *seed)
            })
            .collect()
    }

    /// Asks the member at `addr` (a seed's client address) to let us in.
    pub fn announce(&mut self, addr: SocketAddr) -> Result<(), foca::Error> {
        if addr == self.foca.identity().client_addr {
            return Ok(());
        }
        let result = self
            .foca
            .announce(NodeIdentity::seed(addr), &mut self.runtime);
        self.settle();
        result
    }

    /// A datagram from the network. Errors mean the packet was dropped
    /// (garbage, or from ourselves); they never hurt the state.
    pub fn handle_data(&mut self, data: &[u8]) -> Result<(), foca::Error> {
        let result = self.foca.handle_data(data, &mut self.runtime);
        self.settle();
        result
    }

    /// A timer foca armed, now due.
    pub fn handle_timer(&mut self, timer: Timer<NodeIdentity>) -> Result<(), foca::Error> {
        let result = self.foca.handle_timer(timer, &mut self.runtime);
        self.settle();
        result
    }

    /// Publishes this broker's ring version and vnode leaderships to every
    /// member (and to members that join later).
    pub fn set_routing(
        &mut self,
        ring_version: u64,
        leaders: Vec<VnodeLeader>,
    ) -> Result<(), RoutingError> {
        if leaders.len() > ROUTING_LEADERS_MAX {
            return Err(RoutingError::TooManyLeaders(leaders.len()));
        }
        self.view.local.ring_version = ring_version;
        self.view.local.vnodes_led = leaders;
        self.routing_published = true;
        self.publish_routing();
        self.settle();
        Ok(())
    }

    /// Replaces this broker's attributes. foca spreads identities, not
    /// attribute changes, so a new incarnation of the identity carries them
    /// (foca's `change_identity`, meant for identities whose metadata
    /// changes); the routing hint follows the new incarnation.
    pub fn set_attributes(
        &mut self,
        attributes: BTreeMap<String, String>,
    ) -> Result<(), MembershipError> {
        let current = self.foca.identity();
        if current.attributes == attributes {
            return Ok(());
        }
        let mut next = current.clone();
        next.attributes = attributes;
        next.incarnation = next.incarnation.saturating_add(1);
        next.validate()?;
        let result = self.foca.change_identity(next.clone(), &mut self.runtime);
        if result.is_ok() {
            let mut local = Member::from_identity(&next, MemberState::Alive);
            local.ring_version = self.view.local.ring_version;
            local.vnodes_led = std::mem::take(&mut self.view.local.vnodes_led);
            self.view.local = local;
            if self.routing_published {
                self.publish_routing();
            }
        }
        self.settle();
        result.map_err(MembershipError::IdentityChange)
    }

    /// Declares this broker down to the others (ordered shutdown).
    pub fn leave(&mut self) -> Result<(), foca::Error> {
        self.left = true;
        let result = self.foca.leave_cluster(&mut self.runtime);
        self.settle();
        result
    }

    /// Moves what foca asked for, and the events since the last call, into `out`.
    pub fn take_effects(&mut self, out: &mut Effects) {
        while let Some((to, data)) = self.runtime.to_send() {
            out.sends.push((to.client_addr, data));
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            out.timers.push((after, timer));
        }
        out.events.append(&mut self.events);
    }

    fn publish_routing(&mut self) {
        self.routing_seq += 1;
        let hint = RoutingHint {
            node_id: self.view.local.node_id,
            incarnation: self.foca.identity().incarnation,
            seq: self.routing_seq,
            ring_version: self.view.local.ring_version,
            leaders: self.view.local.vnodes_led.clone(),
        };
        match hint.encode() {
            Ok(bytes) => {
                if let Err(error) = self.foca.add_broadcast(&bytes) {
                    warn!(%error, "routing hint not queued");
                }
                if let Err(error) = self.foca.broadcast(&mut self.runtime) {
                    debug!(%error, "routing hint not sent yet");
                }
            }
            Err(error) => warn!(%error, "routing hint not encoded"),
        }
    }

    /// Reads foca's notifications, then rebuilds the view and diffs it.
    /// Routing is published again after a rejoin of this broker or the
    /// arrival (or restart) of a peer, once it was published at all.
    fn settle(&mut self) {
        let mut republish = self.read_notifications();
        let best = best_identities(&self.foca, self.view.local.node_id);
        let mut seen = Vec::with_capacity(best.len());
        for (node_id, (id, state)) in best {
            seen.push(node_id);
            let next = routed_member(&self.routing, id, member_state(state));
            let Some(kinds) =
                member_changes(self.view.peers.get(&node_id), &next, self.view.peers.len())
            else {
                continue;
            };
            if kinds
                .iter()
                .any(|k| matches!(k, MemberEventKind::Joined | MemberEventKind::Restarted))
            {
                republish = true;
            }
            for kind in kinds {
                info!(
                    node_id,
                    incarnation = next.incarnation,
                    event = ?kind,
                    "membership"
                );
                self.events.push(MemberEvent {
                    kind,
                    member: next.clone(),
                });
            }
            self.view.peers.insert(node_id, next);
        }
        self.mark_forgotten_dead(&seen);
        if republish && self.routing_published {
            self.publish_routing();
        }
    }

    /// Reads foca's notifications about this broker; true if it rejoined
    /// as a new incarnation (its routing must then be published again).
    fn read_notifications(&mut self) -> bool {
        let mut rejoined = false;
        while let Some(notification) = self.runtime.to_notify() {
            match notification {
                OwnedNotification::Rejoin(id) => {
                    info!(
                        incarnation = id.incarnation,
                        "declared dead by the cluster; rejoined as a new incarnation"
                    );
                    self.view.local.incarnation = id.incarnation;
                    rejoined = true;
                }
                OwnedNotification::Defunct if self.left => debug!("left the cluster"),
                OwnedNotification::Defunct => {
                    warn!("declared dead by the cluster and cannot rejoin");
                }
                OwnedNotification::Active => debug!("joined the cluster"),
                OwnedNotification::Idle => info!("no other member is alive"),
                _ => {}
            }
        }
        rejoined
    }

    /// Members foca forgot (long dead, not in `seen`) stay in the view as
    /// dead: each turns dead once, with an event.
    fn mark_forgotten_dead(&mut self, seen: &[u64]) {
        for (node_id, member) in self.view.peers.iter_mut() {
            if !seen.contains(node_id) && member.state != MemberState::Dead {
                member.state = MemberState::Dead;
                self.events.push(MemberEvent {
                    kind: MemberEventKind::Dead,
                    member: member.clone(),
                });
            }
        }
    }
}

/// Each peer's newest identity foca knows, by node id: the greatest
/// incarnation, and of equals one not down. Seed placeholders never become
/// members, and an identity with our node id (`local_id`) is a ghost of an
/// earlier run of this broker.
fn best_identities(foca: &Swim, local_id: u64) -> BTreeMap<u64, (&NodeIdentity, foca::State)> {
    let mut best: BTreeMap<u64, (&NodeIdentity, foca::State)> = BTreeMap::new();
    for member in foca.iter_membership_state() {
        let id = member.id();
        if id.is_seed_placeholder() || id.node_id == local_id {
            continue;
        }
        let rank =
            |id: &NodeIdentity, state: foca::State| (id.incarnation, state != foca::State::Down);
        match best.get(&id.node_id) {
            Some(&(cur, cur_state)) if rank(cur, cur_state) >= rank(id, member.state()) => {}
            _ => {
                best.insert(id.node_id, (id, member.state()));
            }
        }
    }
    debug_assert!(
        !best.contains_key(&local_id),
        "this broker is no peer of its own"
    );
    best
}

/// A member's state in the view, from foca's.
fn member_state(state: foca::State) -> MemberState {
    match state {
        foca::State::Alive => MemberState::Alive,
        foca::State::Suspect => MemberState::Suspect,
        foca::State::Down => MemberState::Dead,
    }
}

/// The member `id` is in `state`, with the routing hint of `routing` it
/// sent, if that hint is of the same incarnation (an older one's leaders
/// are stale).
fn routed_member(routing: &RoutingTable, id: &NodeIdentity, state: MemberState) -> Member {
    let mut next = Member::from_identity(id, state);
    if let Some(hint) = routing.get(id.node_id)
        && hint.incarnation == next.incarnation
    {
        next.ring_version = hint.ring_version;
        next.vnodes_led = hint.leaders;
    }
    next
}

/// The events a peer's change from `prev` (as the view has it, `None` if
/// new) to `next` makes, in order; `None` if the view keeps `prev`: the
/// same member, an older incarnation, or a new peer past `PEERS_MAX`
/// (`peers` are tracked now). An empty list still records `next`.
fn member_changes(
    prev: Option<&Member>,
    next: &Member,
    peers: usize,
) -> Option<Vec<MemberEventKind>> {
    let state = next.state;
    let mut kinds = Vec::new();
    match prev {
        None => {
            if peers >= PEERS_MAX {
                warn!(
                    node_id = next.node_id,
                    "too many peers; not tracking this one"
                );
                return None;
            }
            if state.is_live() {
                kinds.push(MemberEventKind::Joined);
            }
        }
        Some(prev) if prev.incarnation > next.incarnation => return None,
        Some(prev) if prev.incarnation < next.incarnation => {
            kinds.push(MemberEventKind::Restarted);
            if state != MemberState::Alive {
                kinds.push(state_kind(state));
            }
        }
        Some(prev) => {
            if prev.state != state {
                kinds.push(state_kind(state));
            } else if prev.ring_version != next.ring_version || prev.vnodes_led != next.vnodes_led {
                kinds.push(MemberEventKind::Routing);
            } else if prev == next {
                return None;
            }
        }
    }
    Some(kinds)
}

fn state_kind(state: MemberState) -> MemberEventKind {
    match state {
        MemberState::Alive => MemberEventKind::Alive,
        MemberState::Suspect => MemberEventKind::Suspect,
        MemberState::Dead => MemberEventKind::Dead,
    }
}
