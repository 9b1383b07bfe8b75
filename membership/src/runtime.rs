//! The UDP runtime: drives a [`MembershipCore`] from a socket and a timer
//! heap, and publishes its view and events through a [`Membership`] handle.
//!
//! One task owns the core; nothing else touches it. Inputs it waits on: a
//! datagram, the earliest due timer, the seed retry tick, a routing change
//! from the handle, and a request to leave. After each input it sends what
//! foca asked to send, arms the new timers, and publishes the view if it
//! changed. The task ends only when asked to leave (`Ok`) or when the socket
//! fails for good (`Err`); its supervisor restarts it as a new incarnation.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;
use std::time::Duration;

use foca::Timer;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::core::{Effects, MembershipCore, SwimSettings};
use super::identity::NodeIdentity;
use super::seal::{OpenError, Opener, SEAL_OVERHEAD_BYTES, SealError, SealSettings, Sealer};
use super::{LocalRouting, Membership, MembershipError};

/// Timers armed at once; foca arms a handful per member, so this bounds a
/// runaway rather than normal use.
const TIMERS_MAX: usize = 65_536;
/// Consecutive socket receive errors tolerated before the runtime gives up
/// (and its supervisor restarts it).
const RECV_ERRORS_MAX: u32 = 100;

/// How the runtime is started.
#[derive(Debug, Clone)]
pub struct RuntimeArgs {
    /// This broker's identity, with the incarnation of this run.
    pub identity: NodeIdentity,
    pub settings: SwimSettings,
    /// Client addresses of other brokers to announce to until one answers.
    pub seeds: Vec<SocketAddr>,
    /// Seeds foca's choice of probe targets.
    pub rng_seed: u64,
    /// How datagrams are sealed and which are accepted (ADR 0147).
    pub seal: SealSettings,
}

/// Runs SWIM on `socket` until [`Membership::leave`] is called.
pub async fn run(
    membership: Membership,
    socket: UdpSocket,
    args: RuntimeArgs,
) -> Result<(), MembershipError> {
    let mut identity = args.identity;
    let mut attributes_rx = membership.inner.attributes_tx.subscribe();
    // Attributes set before this run (a restarted runtime) are this run's.
    if let Some(attributes) = attributes_rx.borrow_and_update().clone() {
        identity.attributes = attributes;
    }
    let sender = identity.node_id;
    let core = MembershipCore::new(identity, &args.settings, args.rng_seed)?;
    let mut routing_rx = membership.inner.routing_tx.subscribe();
    let mut leave_rx = membership.inner.leave_tx.subscribe();
    let seal = Seal::new(&args.seal, sender)?;
    let mut swim = Swim::new(
        core,
        socket,
        args.settings.packet_bytes_max,
        args.seeds,
        seal,
    );
    let mut seed_tick = tokio::time::interval(Duration::from_millis(args.settings.seed_retry_ms));
    seed_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(
        identity = ?swim.core.identity(),
        seeds = swim.seeds.len(),
        seal = ?args.seal.mode,
        "membership started"
    );
    // Routing published before this run (the previous incarnation's, or
    // set before the runtime came up) is published again.
    routing_rx.mark_changed();
    membership.publish(swim.core.view().clone(), Vec::new());
    loop {
        swim.apply_effects(&membership).await;
        let next_due = swim.timers.peek().map(|Reverse((at, _))| *at);
        tokio::select! {
            received = swim.socket.recv_from(&mut swim.buf) => swim.on_received(received).await?,
            _ = sleep_until_opt(next_due) => swim.fire_due_timers(),
            _ = seed_tick.tick() => swim.announce_to_seeds(),
            changed = routing_rx.changed() => {
                if changed.is_ok() {
                    swim.set_routing(routing_rx.borrow_and_update().clone());
                }
            }
            changed = attributes_rx.changed() => {
                if changed.is_ok() {
                    swim.set_attributes(attributes_rx.borrow_and_update().clone());
                }
            }
            changed = leave_rx.changed() => {
                if changed.is_ok() && *leave_rx.borrow_and_update() {
                    swim.leave().await;
                    return Ok(());
                }
            }
        }
    }
}

/// What the runtime's task owns besides its input channels: the core, its
/// socket and its timers.
struct Swim {
    core: MembershipCore,
    socket: UdpSocket,
    timers: BinaryHeap<Reverse<(Instant, Timer<NodeIdentity>)>>,
    effects: Effects,
    /// One byte longer than a datagram may be, so an oversized one shows.
    buf: Vec<u8>,
    packet_bytes_max: usize,
    /// Announced to while they are not live members (`seeds_to_announce`).
    seeds: Vec<SocketAddr>,
    /// Seed ticks so far.
    seed_ticks: u64,
    /// Consecutive receive errors (`RECV_ERRORS_MAX`).
    recv_errors: u32,
    seal: Seal,
}

/// The runtime's side of sealing (ADR 0147): what it seals with, what it
/// opens with, and what it refused.
struct Seal {
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    accepts_plain: bool,
    refused: u64,
}

impl Seal {
    fn new(settings: &SealSettings, sender: u64) -> Result<Seal, MembershipError> {
        let sealer = if settings.mode.sends_sealed() {
            Some(Sealer::new(&settings.key, sender, session_bits()?))
        } else {
            None
        };
        Ok(Seal {
            sealer,
            opener: settings
                .mode
                .accepts_sealed()
                .then(|| Opener::new(&settings.key)),
            accepts_plain: settings.mode.accepts_plain(),
            refused: 0,
        })
    }

    /// `data` as it goes on the wire: sealed, or as it is.
    fn outgoing(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        let Some(sealer) = self.sealer.as_mut() else {
            return Some(data.to_vec());
        };
        let now = unix_now_s();
        match sealer.seal(now, data) {
            Ok(sealed) => Some(sealed),
            Err(SealError::SessionSpent) => {
                sealer.renew(session_bits().ok()?);
                sealer.seal(now, data).ok()
            }
        }
    }

    /// The datagram foca reads, or `None` when it is refused.
    fn incoming(&mut self, from: SocketAddr, datagram: &[u8]) -> Option<Vec<u8>> {
        let opened = match self.opener.as_mut() {
            Some(opener) => opener.open(unix_now_s(), datagram),
            None => Err(OpenError::NotSealed {
                len: datagram.len(),
            }),
        };
        match opened {
            Ok(plain) => Some(plain),
            Err(_) if self.accepts_plain => Some(datagram.to_vec()),
            Err(error) => {
                self.refused += 1;
                // The first and then every thousandth: a flood is visible
                // without a log line per datagram.
                if self.refused % 1000 == 1 {
                    warn!(%from, %error, refused = self.refused, "swim datagram refused (not sealed with this cluster's key)");
                } else {
                    debug!(%from, %error, "swim datagram refused");
                }
                None
            }
        }
    }
}

/// 64 bits from the operating system, for a sealing session.
fn session_bits() -> Result<u64, MembershipError> {
    let bits: [u8; 8] = aws_lc_rs::rand::generate(&aws_lc_rs::rand::SystemRandom::new())
        .map_err(|_| {
            MembershipError::Socket(std::io::Error::other("no os randomness for the swim seal"))
        })?
        .expose();
    Ok(u64::from_le_bytes(bits))
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Swim {
    fn new(
        core: MembershipCore,
        socket: UdpSocket,
        packet_bytes_max: usize,
        seeds: Vec<SocketAddr>,
        seal: Seal,
    ) -> Swim {
        Swim {
            core,
            socket,
            timers: BinaryHeap::new(),
            effects: Effects::default(),
            // A sealed datagram is up to `SEAL_OVERHEAD_BYTES` longer.
            buf: vec![0u8; packet_bytes_max + SEAL_OVERHEAD_BYTES + 1],
            packet_bytes_max,
            seeds,
            seed_ticks: 0,
            recv_errors: 0,
            seal,
        }
    }

    /// Does what the last input asked: sends foca's datagrams (a failed
    /// send is only logged: SWIM tolerates loss), arms its timers (at most
    /// `TIMERS_MAX`), and publishes the view with the events since.
    async fn apply_effects(&mut self, membership: &Membership) {
        self.core.take_effects(&mut self.effects);
        for (to, data) in self.effects.sends.drain(..) {
            let Some(wire) = self.seal.outgoing(&data) else {
                warn!(%to, "swim datagram not sealed (no os randomness); not sent");
                continue;
            };
            if let Err(error) = self.socket.send_to(&wire, to).await {
                debug!(%to, %error, "swim send failed");
            }
        }
        let now = Instant::now();
        for (after, timer) in self.effects.timers.drain(..) {
            if self.timers.len() >= TIMERS_MAX {
                warn!("swim timer heap full; dropping a timer");
                continue;
            }
            self.timers.push(Reverse((now + after, timer)));
        }
        debug_assert!(self.timers.len() <= TIMERS_MAX, "the timer heap is bounded");
        let events = std::mem::take(&mut self.effects.events);
        membership.publish(self.core.view().clone(), events);
    }

    /// Hands a received datagram to the core, dropping an oversized or
    /// undecodable one. A receive error pauses briefly; `RECV_ERRORS_MAX`
    /// in a row end the runtime (its supervisor restarts it).
    async fn on_received(
        &mut self,
        received: std::io::Result<(usize, SocketAddr)>,
    ) -> Result<(), MembershipError> {
        match received {
            Ok((len, from)) => {
                self.recv_errors = 0;
                if len > self.packet_bytes_max + SEAL_OVERHEAD_BYTES {
                    debug!(%from, len, "oversized swim datagram dropped");
                    return Ok(());
                }
                let Some(data) = self.seal.incoming(from, &self.buf[..len]) else {
                    return Ok(());
                };
                if let Err(error) = self.core.handle_data(&data) {
                    debug!(%from, %error, "swim datagram dropped");
                }
            }
            Err(error) => {
                self.recv_errors += 1;
                debug!(%error, recv_errors = self.recv_errors, "swim receive failed");
                if self.recv_errors >= RECV_ERRORS_MAX {
                    return Err(MembershipError::Socket(error));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }

    /// Hands every timer due by now back to the core, earliest first.
    fn fire_due_timers(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((_, timer))) = self.timers.pop() else {
                break;
            };
            if let Err(error) = self.core.handle_timer(timer) {
                debug!(%error, "swim timer failed");
            }
        }
    }

    /// Announces this broker to the seeds the core names for this tick
    /// (`MembershipCore::seeds_to_announce`).
    fn announce_to_seeds(&mut self) {
        let tick = self.seed_ticks;
        self.seed_ticks = self.seed_ticks.wrapping_add(1);
        for seed in self.core.seeds_to_announce(&self.seeds, tick) {
            if let Err(error) = self.core.announce(seed) {
                debug!(%seed, %error, "announce failed");
            }
        }
    }

    /// Takes the routing the handle published (`None`: none yet); a hint
    /// the core refuses is logged and the old one stays.
    fn set_routing(&mut self, routing: Option<LocalRouting>) {
        if let Some(routing) = routing
            && let Err(error) = self.core.set_routing(routing.ring_version, routing.leaders)
        {
            warn!(%error, "routing hint refused");
        }
    }

    /// Takes the attributes the handle set (`None`: none yet); a change
    /// the core refuses is logged and the old attributes stay.
    fn set_attributes(&mut self, attributes: Option<BTreeMap<String, String>>) {
        if let Some(attributes) = attributes
            && let Err(error) = self.core.set_attributes(attributes)
        {
            warn!(%error, "attributes not changed");
        }
    }

    /// Declares this broker down to the others and sends that, best effort:
    /// the runtime ends right after.
    async fn leave(&mut self) {
        info!("leaving the cluster");
        if let Err(error) = self.core.leave() {
            debug!(%error, "leave failed");
        }
        self.core.take_effects(&mut self.effects);
        for (to, data) in self.effects.sends.drain(..) {
            if let Some(wire) = self.seal.outgoing(&data) {
                let _ = self.socket.send_to(&wire, to).await;
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
