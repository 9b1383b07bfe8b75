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

use crate::control::handle::ControlHandle;
use crate::control::shared::Shared;

pub(crate) mod balancer;
pub(crate) mod failover;
pub(crate) mod healer;
pub(crate) mod reshaper;
pub(crate) mod scrubber;
pub(crate) mod space;
pub(crate) mod sweeper;

/// The `maintenance` supervisor and its workers (OTP's default restart
/// intensity). This is the layer's one boundary with the broker context:
/// each worker gets a context of the parts it reads, built here once.
pub(crate) fn supervisor(shared: &Arc<Shared>) -> SupervisorArgs {
    let control = ControlHandle::of(shared);
    let failover_ctx = Arc::new(failover::FailoverCtx {
        node_id: shared.config.node_id,
        actors: Arc::clone(&shared.actors),
        metrics: Arc::clone(&shared.metrics),
        control: control.clone(),
    });
    let healer_ctx = Arc::new(healer::HealerCtx {
        node_id: shared.config.node_id,
        actors: Arc::clone(&shared.actors),
        links: Arc::clone(&shared.links),
        data: Arc::clone(&shared.data),
        metrics: Arc::clone(&shared.metrics),
        control: control.clone(),
    });
    let scrubber_ctx = Arc::new(scrubber::ScrubberCtx {
        data: Arc::clone(&shared.data),
        metrics: Arc::clone(&shared.metrics),
        scrub_interval_ms: shared.config.cluster.scrub_interval_ms,
        #[cfg(feature = "testing")]
        fault_key: shared.client_addr,
    });
    let space_ctx = Arc::new(space::SpaceCtx {
        data_dir: shared.config.data_dir.clone(),
        data: Arc::clone(&shared.data),
        metrics: Arc::clone(&shared.metrics),
        links: Arc::clone(&shared.links),
        actors: Arc::clone(&shared.actors),
        #[cfg(feature = "testing")]
        fault_key: shared.client_addr,
    });
    let balancer_ctx = Arc::new(balancer::BalancerCtx {
        node_id: shared.config.node_id,
        data: Arc::clone(&shared.data),
        links: Arc::clone(&shared.links),
        control: control.clone(),
        balance_interval_ms: shared.config.maintenance.balance_interval_ms,
    });
    let reshaper_ctx = Arc::new(reshaper::ReshaperCtx {
        node_id: shared.config.node_id,
        actors: Arc::clone(&shared.actors),
        rates: Arc::clone(&shared.rates),
        clock: Arc::clone(&shared.clock),
        metrics: Arc::clone(&shared.metrics),
        control: control.clone(),
        defaults: shared.config.reshape.clone(),
        request_timeout_ms: shared.config.produce_timeout_ms,
    });
    let sweeper_ctx = Arc::new(sweeper::SweeperCtx {
        control,
        orphan_sweep_ms: shared.config.maintenance.orphan_sweep_ms,
        #[cfg(feature = "testing")]
        fault_key: shared.client_addr,
    });
    SupervisorArgs::new("maintenance", Strategy::OneForOne)
        .child(ChildSpec::worker(
            "failover",
            || failover::FailoverActor,
            move || Arc::clone(&failover_ctx),
        ))
        .child(ChildSpec::worker(
            "healer",
            || healer::HealerActor,
            move || Arc::clone(&healer_ctx),
        ))
        .child(ChildSpec::worker(
            "scrubber",
            || scrubber::ScrubberActor,
            move || Arc::clone(&scrubber_ctx),
        ))
        .child(ChildSpec::worker(
            "space",
            || space::SpaceActor,
            move || Arc::clone(&space_ctx),
        ))
        .child(ChildSpec::worker(
            "balancer",
            || balancer::BalancerActor,
            move || Arc::clone(&balancer_ctx),
        ))
        .child(ChildSpec::worker(
            "sweeper",
            || sweeper::SweeperActor,
            move || Arc::clone(&sweeper_ctx),
        ))
        .child(ChildSpec::worker(
            "reshaper",
            || reshaper::ReshaperActor,
            move || Arc::clone(&reshaper_ctx),
        ))
}
