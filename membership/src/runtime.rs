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
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::Duration;

use foca::Timer;
use tokio::net::UdpSocket;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::core::{Effects, MembershipCore, SwimSettings};
use super::identity::NodeIdentity;
use super::{Membership, MembershipError};

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
    let mut core = MembershipCore::new(identity, &args.settings, args.rng_seed)?;
    let mut routing_rx = membership.inner.routing_tx.subscribe();
    let mut leave_rx = membership.inner.leave_tx.subscribe();
    let mut timers: BinaryHeap<Reverse<(Instant, Timer<NodeIdentity>)>> = BinaryHeap::new();
    let mut effects = Effects::default();
    let mut buf = vec![0u8; args.settings.packet_bytes_max + 1];
    let mut seed_tick = tokio::time::interval(Duration::from_millis(args.settings.seed_retry_ms));
    seed_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut recv_errors = 0u32;
    info!(
        identity = ?core.identity(),
        seeds = args.seeds.len(),
        "membership started"
    );
    // Routing published before this run (the previous incarnation's, or
    // set before the runtime came up) is published again.
    routing_rx.mark_changed();
    membership.publish(core.view().clone(), Vec::new());
    loop {
        core.take_effects(&mut effects);
        for (to, data) in effects.sends.drain(..) {
            if let Err(error) = socket.send_to(&data, to).await {
                debug!(%to, %error, "swim send failed");
            }
        }
        let now = Instant::now();
        for (after, timer) in effects.timers.drain(..) {
            if timers.len() >= TIMERS_MAX {
                warn!("swim timer heap full; dropping a timer");
                continue;
            }
            timers.push(Reverse((now + after, timer)));
        }
        let events = std::mem::take(&mut effects.events);
        membership.publish(core.view().clone(), events);

        let next_due = timers.peek().map(|Reverse((at, _))| *at);
        tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok((len, from)) => {
                    recv_errors = 0;
                    if len > args.settings.packet_bytes_max {
                        debug!(%from, len, "oversized swim datagram dropped");
                        continue;
                    }
                    if let Err(error) = core.handle_data(&buf[..len]) {
                        debug!(%from, %error, "swim datagram dropped");
                    }
                }
                Err(error) => {
                    recv_errors += 1;
                    debug!(%error, recv_errors, "swim receive failed");
                    if recv_errors >= RECV_ERRORS_MAX {
                        return Err(MembershipError::Socket(error));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = sleep_until_opt(next_due) => {
                let now = Instant::now();
                while let Some(Reverse((at, _))) = timers.peek() {
                    if *at > now {
                        break;
                    }
                    let Some(Reverse((_, timer))) = timers.pop() else { break };
                    if let Err(error) = core.handle_timer(timer) {
                        debug!(%error, "swim timer failed");
                    }
                }
            }
            _ = seed_tick.tick() => {
                if !core.is_connected() {
                    for seed in &args.seeds {
                        if let Err(error) = core.announce(*seed) {
                            debug!(%seed, %error, "announce failed");
                        }
                    }
                }
            }
            changed = routing_rx.changed() => {
                if changed.is_err() {
                    continue;
                }
                let routing = routing_rx.borrow_and_update().clone();
                if let Some(routing) = routing
                    && let Err(error) = core.set_routing(routing.ring_version, routing.leaders)
                {
                    warn!(%error, "routing hint refused");
                }
            }
            changed = attributes_rx.changed() => {
                if changed.is_err() {
                    continue;
                }
                let attributes = attributes_rx.borrow_and_update().clone();
                if let Some(attributes) = attributes
                    && let Err(error) = core.set_attributes(attributes)
                {
                    warn!(%error, "attributes not changed");
                }
            }
            changed = leave_rx.changed() => {
                if changed.is_ok() && *leave_rx.borrow_and_update() {
                    info!("leaving the cluster");
                    if let Err(error) = core.leave() {
                        debug!(%error, "leave failed");
                    }
                    core.take_effects(&mut effects);
                    for (to, data) in effects.sends.drain(..) {
                        let _ = socket.send_to(&data, to).await;
                    }
                    return Ok(());
                }
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
