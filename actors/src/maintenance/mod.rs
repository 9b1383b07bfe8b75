//! `maintenance` (one_for_one): the broker's background upkeep of its data.
//!
//! Its children are permanent workers:
//! - `failover` (issue 19, ADR 0106): seals a segment whose primary is gone
//!   and opens its successor on live brokers, for the coordinators of the
//!   vnodes this broker leads.
//! - `healer` (issue 19, ADR 0106): re-creates a sealed segment's copy whose
//!   holder has been gone longer than `replace_after_ms` on another broker,
//!   and rebuilds in place a copy the scrubber found broken (ADR 0110).
//! - `scrubber` (ADR 0110): re-reads the sealed copies coordinators ask
//!   about against their recorded seals, at a bounded rate.
//! - `space` (ADR 0111): polls the data volume's free bytes; below
//!   `store.min_free_bytes` the broker refuses records until space returns.
//! - `sweeper` (ADR 0115): removes the copies of segments no vnode lists,
//!   once every vnode answered (a deleted topic's copies a drop order
//!   missed).
//! - `reshaper` (ADR 0143): splits the ranges this broker writes that stay
//!   hot and merges idle buddies, by their measured write rates.
//!
//! Planned here, not built yet: `retention` (seal and delete by age and
//! size). Adding one changes this function and no tree above it.

use std::sync::Arc;

use malachi_supervision::{ChildSpec, Strategy, SupervisorArgs};
use ractor::Actor;

use crate::common::clock::Clock;
use crate::common::config::BrokerConfig;
use crate::common::metrics::BrokerMetrics;
use crate::common::rates::RangeRates;
use crate::control::handle::ControlHandle;
use crate::control::registry::ActorRegistry;
use crate::control::shared::ClusterLinks;
use crate::data::storage::Storage;

pub(crate) mod balancer;
pub(crate) mod failover;
pub(crate) mod healer;
pub(crate) mod reshaper;
pub(crate) mod scrubber;
pub(crate) mod space;
pub(crate) mod sweeper;

/// What the maintenance workers read of the broker, and nothing else: the
/// broker hands it down (`broker.rs`), and each worker's context is built
/// from it here once.
pub(crate) struct Upkeep<'a> {
    pub config: &'a BrokerConfig,
    pub actors: Arc<ActorRegistry>,
    pub links: Arc<ClusterLinks>,
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    pub rates: Arc<RangeRates>,
    pub clock: Arc<dyn Clock>,
    pub control: ControlHandle,
    /// Where the `testing` hooks' faults for this broker are armed.
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

/// The `maintenance` supervisor and its workers (OTP's default restart
/// intensity).
pub(crate) fn supervisor(upkeep: &Upkeep<'_>) -> SupervisorArgs {
    SupervisorArgs::new("maintenance", Strategy::OneForOne)
        .child(worker(
            "failover",
            || failover::FailoverActor,
            failover_ctx(upkeep),
        ))
        .child(worker("healer", || healer::HealerActor, healer_ctx(upkeep)))
        .child(worker(
            "scrubber",
            || scrubber::ScrubberActor,
            scrubber_ctx(upkeep),
        ))
        .child(worker("space", || space::SpaceActor, space_ctx(upkeep)))
        .child(worker(
            "balancer",
            || balancer::BalancerActor,
            balancer_ctx(upkeep),
        ))
        .child(worker(
            "sweeper",
            || sweeper::SweeperActor,
            sweeper_ctx(upkeep),
        ))
        .child(worker(
            "reshaper",
            || reshaper::ReshaperActor,
            reshaper_ctx(upkeep),
        ))
}

/// A permanent worker started with (a clone of) its context.
fn worker<A, C>(name: &str, make: fn() -> A, ctx: Arc<C>) -> ChildSpec
where
    A: Actor<Arguments = Arc<C>>,
    C: Send + Sync + 'static,
{
    ChildSpec::worker(name, make, move || Arc::clone(&ctx))
}

fn failover_ctx(u: &Upkeep<'_>) -> Arc<failover::FailoverCtx> {
    Arc::new(failover::FailoverCtx {
        node_id: u.config.node_id,
        actors: Arc::clone(&u.actors),
        metrics: Arc::clone(&u.metrics),
        control: u.control.clone(),
    })
}

fn healer_ctx(u: &Upkeep<'_>) -> Arc<healer::HealerCtx> {
    Arc::new(healer::HealerCtx {
        node_id: u.config.node_id,
        actors: Arc::clone(&u.actors),
        links: Arc::clone(&u.links),
        data: Arc::clone(&u.data),
        metrics: Arc::clone(&u.metrics),
        control: u.control.clone(),
    })
}

fn scrubber_ctx(u: &Upkeep<'_>) -> Arc<scrubber::ScrubberCtx> {
    Arc::new(scrubber::ScrubberCtx {
        data: Arc::clone(&u.data),
        metrics: Arc::clone(&u.metrics),
        scrub_interval_ms: u.config.cluster.scrub_interval_ms,
        #[cfg(feature = "testing")]
        fault_key: u.fault_key,
    })
}

fn space_ctx(u: &Upkeep<'_>) -> Arc<space::SpaceCtx> {
    Arc::new(space::SpaceCtx {
        data_dir: u.config.data_dir.clone(),
        data: Arc::clone(&u.data),
        metrics: Arc::clone(&u.metrics),
        links: Arc::clone(&u.links),
        actors: Arc::clone(&u.actors),
        #[cfg(feature = "testing")]
        fault_key: u.fault_key,
    })
}

fn balancer_ctx(u: &Upkeep<'_>) -> Arc<balancer::BalancerCtx> {
    Arc::new(balancer::BalancerCtx {
        node_id: u.config.node_id,
        data: Arc::clone(&u.data),
        links: Arc::clone(&u.links),
        control: u.control.clone(),
        balance_interval_ms: u.config.maintenance.balance_interval_ms,
    })
}

fn reshaper_ctx(u: &Upkeep<'_>) -> Arc<reshaper::ReshaperCtx> {
    Arc::new(reshaper::ReshaperCtx {
        node_id: u.config.node_id,
        actors: Arc::clone(&u.actors),
        rates: Arc::clone(&u.rates),
        clock: Arc::clone(&u.clock),
        metrics: Arc::clone(&u.metrics),
        control: u.control.clone(),
        defaults: u.config.reshape.clone(),
        request_timeout_ms: u.config.produce_timeout_ms,
    })
}

fn sweeper_ctx(u: &Upkeep<'_>) -> Arc<sweeper::SweeperCtx> {
    Arc::new(sweeper::SweeperCtx {
        control: u.control.clone(),
        orphan_sweep_ms: u.config.maintenance.orphan_sweep_ms,
        #[cfg(feature = "testing")]
        fault_key: u.fault_key,
    })
}
