//! `maintenance/space`: polls the free bytes of the data dir's volume and
//! feeds the broker's [`SpaceGuard`](crate::data::space::SpaceGuard)
//! (issue 19, ADR 0111): below `store.min_free_bytes` the broker takes no
//! records and is not ready; a quarter more free and it takes them again,
//! without a restart. One log line per change, never one per poll. With
//! room again it also reopens the raft replicas a refused write stopped
//! (`VnodeHost::reopen_stopped_by_full_volume`). Each poll is a message
//! the actor sends itself after the previous one, so a poll that panics
//! fails the actor and its supervisor restarts the polling (ADR 0130).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{error, info, warn};

use crate::common::metrics::BrokerMetrics;
use crate::control::registry::ActorRegistry;
use crate::control::shared::ClusterLinks;
use crate::data::space::Change;
use crate::data::storage::Storage;

/// How often the volume is asked. A burst between two polls is what the
/// `min_free_bytes` margin is for; a write's `ENOSPC` trips the guard at
/// once regardless.
pub(crate) const SPACE_POLL_MS: u64 = 1_000;

pub(crate) struct SpaceActor;

/// What the space worker reads: the data dir it polls, the data plane's
/// free-space source and guard, the metrics it sets, membership (to
/// advertise a full volume) and the metadata plane (to reopen the raft
/// replicas a full volume stopped).
#[derive(Debug)]
pub(crate) struct SpaceCtx {
    pub data_dir: std::path::PathBuf,
    pub data: Arc<Storage>,
    pub metrics: Arc<BrokerMetrics>,
    pub links: Arc<ClusterLinks>,
    pub actors: Arc<ActorRegistry>,
    /// The broker's fault-injection key (its client address).
    #[cfg(feature = "testing")]
    pub fault_key: std::net::SocketAddr,
}

/// The worker's timer: each poll schedules the next one, so a slow poll
/// never queues a second behind it.
#[derive(Debug)]
pub(crate) enum SpaceMsg {
    Poll,
}

impl ractor::Message for SpaceMsg {}

pub(crate) struct SpaceState {
    ctx: Arc<SpaceCtx>,
    /// The last poll could not read the volume (logged once per run of
    /// failures).
    unreadable: bool,
    /// The raft replicas seen stopped by a full volume at the last poll.
    raft_stopped: BTreeSet<u64>,
}

#[ractor::async_trait]
impl Actor for SpaceActor {
    type Msg = SpaceMsg;
    type State = SpaceState;
    type Arguments = Arc<SpaceCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<SpaceMsg>,
        ctx: Arc<SpaceCtx>,
    ) -> Result<SpaceState, ActorProcessingErr> {
        myself.send_message(SpaceMsg::Poll)?;
        Ok(SpaceState {
            ctx,
            unreadable: false,
            raft_stopped: BTreeSet::new(),
        })
    }

    /// One poll, in the actor: a panic in it fails the actor, and its
    /// supervisor restarts it (and so the polling).
    async fn handle(
        &self,
        myself: ActorRef<SpaceMsg>,
        message: SpaceMsg,
        state: &mut SpaceState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SpaceMsg::Poll => {
                #[cfg(feature = "testing")]
                crate::common::faults::trip(state.ctx.fault_key, "space");
                state.poll().await;
                myself.send_after(Duration::from_millis(SPACE_POLL_MS), || SpaceMsg::Poll);
            }
        }
        Ok(())
    }
}

/// Tells the cluster whether this broker's volume is full: its membership
/// attribute, set or cleared only when it differs from what it shows.
fn advertise(links: &ClusterLinks, full: bool) {
    use crate::common::volume::{STORAGE_ATTRIBUTE, STORAGE_FULL};
    let Some(fabric) = links.fabric() else {
        return;
    };
    let mut attributes = fabric.membership.local().attributes;
    let shown = !crate::common::volume::has_room(&attributes);
    if shown == full {
        return;
    }
    if full {
        attributes.insert(STORAGE_ATTRIBUTE.to_owned(), STORAGE_FULL.to_owned());
    } else {
        attributes.remove(STORAGE_ATTRIBUTE);
    }
    if let Err(e) = fabric.membership.set_local_attributes(attributes) {
        warn!(error = %e, "cannot tell the cluster whether the data volume is full");
    }
}

impl SpaceState {
    /// Asks the volume for its free bytes and feeds the guard.
    async fn poll(&mut self) {
        let ctx = Arc::clone(&self.ctx);
        let dir = ctx.data_dir.clone();
        let source = Arc::clone(&*ctx.data.free_space.read());
        // What was written before the volume is asked is in its answer;
        // what is written while it answers is counted against it.
        let mark = ctx.data.space.mark();
        let polled = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || source.free_bytes(&dir)
        })
        .await;
        match polled {
            Ok(Ok(free)) => {
                self.unreadable = false;
                let guard = &ctx.data.space;
                ctx.metrics.storage_free_bytes.set(free as f64);
                match guard.observe_since(free, mark, ctx.data.clock.now_ms()) {
                    Change::BecameFull => error!(
                        dir = %dir.display(),
                        free_bytes = free,
                        min_free_bytes = guard.min_free_bytes(),
                        "the data volume is nearly full; produces are refused (storage_full) until space is freed"
                    ),
                    Change::Recovered => info!(
                        dir = %dir.display(),
                        free_bytes = free,
                        "the data volume has space again; produces are taken"
                    ),
                    Change::None => {}
                }
                ctx.metrics
                    .storage_full
                    .set(if guard.is_full() { 1.0 } else { 0.0 });
                advertise(&ctx.links, guard.is_full());
                self.follow_raft(&ctx).await;
            }
            Ok(Err(e)) if !self.unreadable => {
                self.unreadable = true;
                warn!(dir = %dir.display(), error = %e, "cannot read the data volume's free space");
            }
            _ => {}
        }
    }

    /// A raft replica whose write the volume refused is stopped. A newly
    /// stopped one counts as a write's ENOSPC (the guard holds the volume
    /// full, 10 s doubling); with room again it reopens from its files, as
    /// at a restart (nothing it failed to write was acknowledged).
    async fn follow_raft(&mut self, ctx: &SpaceCtx) {
        let Ok(plane) = ctx.actors.plane() else {
            return;
        };
        let Some(host) = plane.host() else {
            return;
        };
        let guard = &ctx.data.space;
        let stopped = host.stopped_by_full_volume();
        if stopped.difference(&self.raft_stopped).next().is_some()
            && guard.note_no_space(ctx.data.clock.now_ms())
        {
            error!(
                dir = %ctx.data_dir.display(),
                groups = stopped.len(),
                "the data volume refused a raft log write; produces are refused (storage_full) and those replicas stopped until space is freed"
            );
        }
        self.raft_stopped = stopped;
        if !guard.is_full() && !self.raft_stopped.is_empty() {
            let reopened = host.reopen_stopped_by_full_volume().await;
            if reopened > 0 {
                info!(
                    reopened,
                    "raft replicas a full volume had stopped run again"
                );
            }
            self.raft_stopped = host.stopped_by_full_volume();
        }
    }
}
