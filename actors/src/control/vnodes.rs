//! `vnodes`: the actor that owns this broker's vnode replicas (ADR 0081).
//!
//! In `pre_start` it opens a `VnodeHost` (the replica of every vnode whose
//! voters include this broker, each an openraft group under
//! `data_dir/metadata/vnode-<id>`), serves the raft port with it (what
//! each request goes to is `cluster_port.rs`'s job), keeps the
//! transport's peer addresses current from membership, fetches a newer ring
//! when a peer gossips one (`observe_ring_version`), and publishes the
//! plane to the broker's shared state, so the coordinator manager, started
//! after it under the `rest_for_one` metadata supervisor, always finds it
//! open. It shuts all of it down on a graceful stop. If it fails,
//! `rest_for_one` restarts the coordinator manager after it too.
//!
//! With `metadata_backend = "file"` (a lone broker only) it opens a
//! `FilePlane` instead and serves no raft. With either plane it then
//! starts learning the cluster's cursor keys (`cursor_keys.rs`, ADR 0096).
//!
//! It runs the host's loops and reopens its fatally stopped replicas
//! (`host_loops.rs`, ADR 0135): a loop that ends is restarted, and past a
//! budget, or when a replica cannot be reopened, the actor fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use malachi_cluster::group::{RpcService, TransportServer};
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_membership::MembershipView;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::common::config::{BrokerConfig, MetadataBackend};
use crate::common::watched::{TaskEnded, Watched, spawn_watched};
use crate::control::cluster_port::ClusterPort;
use crate::control::host_loops::{FATAL_CHECK_MS, HostWork};
use crate::control::metadata::{FilePlane, MetadataPlane, VnodePlane};
use crate::control::shared::{RaftEndpoint, Shared};

pub(crate) struct VnodesActor;

#[derive(Debug)]
pub(crate) enum VnodesMsg {
    /// A task the actor watches ended (`common::watched`): the actor fails
    /// on it and its supervisor restarts it, tasks and all.
    TaskEnded(TaskEnded),
    /// One of the host's loops ended (`host_loops.rs`): restarted within
    /// its budget.
    LoopEnded(TaskEnded),
    /// Time to look for fatally stopped replicas (every `FATAL_CHECK_MS`).
    CheckGroups,
}
impl ractor::Message for VnodesMsg {}

pub(crate) struct VnodesState {
    shared: Arc<Shared>,
    plane: Arc<dyn MetadataPlane>,
    server: Option<Arc<TransportServer>>,
    /// Follows membership into the transport and the ring. Watched tasks
    /// are aborted when the state is dropped, after a stop or a failure.
    _peers: Option<Watched>,
    /// Learns the cluster's cursor keys (ADR 0096); parks once they are
    /// known, so only a panic reports an end.
    _keys: Watched,
    /// The vnode host's loops and replicas (`None` with the file plane).
    host_work: Option<HostWork<VnodesMsg>>,
}

/// How long a lone broker's start waits for its cursor keys before it
/// leaves them to the background learner.
const LONE_KEYS_WAIT_MS: u64 = 10_000;

/// How often a broker that heard of a newer ring than it holds asks for it
/// again while the first fetch has not brought it (a ring group without a
/// leader, a lost answer).
const RING_OBSERVE_RETRY_MS: u64 = 1_000;

/// The highest ring version a live peer gossips (0 when none does).
fn newest_gossiped_ring(view: &MembershipView, me: u64) -> u64 {
    view.live()
        .filter(|m| m.node_id != me)
        .map(|m| m.ring_version)
        .max()
        .unwrap_or(0)
}

/// When to ask the host to fetch a gossiped ring: once per newer version,
/// and again every `RING_OBSERVE_RETRY_MS` while it has not arrived, so a
/// burst of routing events does not start a burst of fetches.
#[derive(Debug, Default)]
struct RingObserver {
    /// The newest version asked for, and when.
    asked: Option<(u64, Instant)>,
}

impl RingObserver {
    /// The version to observe now, if any, given the newest one gossiped
    /// and the one this broker holds.
    fn due(&mut self, gossiped: u64, held: u64, now: Instant) -> Option<u64> {
        if gossiped <= held {
            return None;
        }
        let due = match self.asked {
            Some((version, at)) => {
                gossiped > version
                    || now.saturating_duration_since(at)
                        >= Duration::from_millis(RING_OBSERVE_RETRY_MS)
            }
            None => true,
        };
        due.then(|| {
            self.asked = Some((gossiped, now));
            gossiped
        })
    }
}

/// Follows the membership view: keeps the transport's peer addresses equal
/// to the raft addresses the cluster's brokers gossip (a restarted broker
/// gossips a new incarnation with its new raft port, and `set_peer`
/// reconnects to it), and learns of a newer ring from the ring versions
/// they gossip (`set_local_routing`, published by each coordinator
/// manager), so a broker learns a split without waiting to be refused as
/// misrouted. The view is level-triggered, so a burst of routing events is
/// read as one.
fn follow_peers(
    myself: ActorRef<VnodesMsg>,
    shared: &Arc<Shared>,
    host: &Arc<VnodeHost>,
) -> Option<Watched> {
    let fabric = shared.fabric()?;
    let mut view = fabric.membership.watch();
    let formed = Arc::clone(&fabric.formed);
    let host = Arc::clone(host);
    let replication = shared.links.raft.get().map(|r| Arc::clone(&r.replication));
    let work = async move {
        let mut observer = RingObserver::default();
        loop {
            let (learned, gossiped) = {
                // A copy, not the borrow: `observe` may publish this
                // broker's attributes, which takes the view's lock again.
                let view = view.borrow_and_update().clone();
                // A broker of another cluster (a data dir from elsewhere,
                // seeds pointing across clusters) is never a raft or
                // replication peer, whatever node id it claims (ADR 0102).
                let foreign = formed.observe(&view, host.node_id());
                let learned: Vec<(u64, std::net::SocketAddr)> = view
                    .all()
                    // Every member of this cluster, whether or not the
                    // ring lists it yet: a joining broker must be reachable
                    // before it is admitted (ADR 0104).
                    .filter(|m| m.node_id != host.node_id())
                    .filter(|m| !foreign.contains(&m.node_id))
                    .filter_map(|m| m.raft_addr.map(|addr| (m.node_id, addr)))
                    .collect();
                // Who reads the feature table (ADR 0134 §7): what a dead
                // member last gossiped counts, as it may come back so.
                let readers = view
                    .all()
                    .filter(|m| !foreign.contains(&m.node_id))
                    .filter(|m| malachi_core::model::reads_feature_table(&m.attributes))
                    .map(|m| m.node_id)
                    .collect();
                host.observe_feature_readers(readers);
                (learned, newest_gossiped_ring(&view, host.node_id()))
            };
            for (node, addr) in learned {
                let known = host.transport().peers().contains(&(node, addr));
                if !known {
                    debug!(node, %addr, "raft peer address learned");
                    host.transport().set_peer(node, addr);
                }
                // Replica-appends ride the same port on their own connections.
                if let Some(replication) = &replication
                    && !replication.peers().contains(&(node, addr))
                {
                    replication.set_peer(node, addr);
                }
            }
            let held = host.ring().version();
            if let Some(version) = observer.due(gossiped, held, Instant::now()) {
                debug!(version, held, "a peer gossips a newer ring");
                host.observe_ring_version(version);
            }
            // While behind, wake to retry even if the view stays still.
            let behind = gossiped > held;
            let retry = async {
                if behind {
                    tokio::time::sleep(Duration::from_millis(RING_OBSERVE_RETRY_MS)).await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                changed = view.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = retry => {}
            }
        }
        // Membership outlives every restart: its end means the broker is
        // stopping, which is no failure of this actor.
        std::future::pending::<()>().await;
    };
    Some(spawn_watched(
        myself,
        "follow_peers",
        work,
        VnodesMsg::TaskEnded,
    ))
}

/// A crashed predecessor left its plane and raft server published
/// (post_stop does not run after a failure): stops them before the same
/// files are reopened, so two raft nodes never share one log.
async fn close_stale(shared: &Shared, raft: Option<&RaftEndpoint>) {
    let stale = shared.actors.close_plane();
    if let Some(stale) = stale
        && let Err(e) = stale.shutdown().await
    {
        warn!(error = %e, "cannot shut down the crashed predecessor's metadata plane");
    }
    if let Some(raft) = raft {
        let stale = raft.server.lock().take();
        if let Some(stale) = stale {
            stale.shutdown().await;
        }
    }
}

/// The vnode host's settings, from the broker's; `gossiped` when a node
/// fabric tells it who reads the feature table (`follow_peers`).
fn host_config(config: &BrokerConfig, dir: PathBuf, gossiped: bool) -> VnodeHostConfig {
    let mut host_config = VnodeHostConfig::new(config.node_id, config.cluster_nodes(), dir);
    host_config.vnode_count = config.vnode_count();
    host_config.replicas_per_vnode = config.cluster.replicas_per_vnode;
    host_config.forward_timeout_ms = config.cluster.forward_timeout_ms;
    if !config.cluster.quiet_groups {
        host_config.liveness = None;
    }
    host_config.balance_leaders = config.cluster.balance_leaders;
    host_config.joined = config.cluster.joined;
    host_config.replace_after_ms = config.cluster.replace_after_ms;
    host_config.attributes = config.attributes.clone();
    host_config.feature_readers_gossiped = gossiped;
    host_config.plays_pre_feature_gates = config.cluster.plays_pre_feature_gates;
    // Its loops are the vnodes actor's to run (`HostWork`).
    host_config.owner_runs_loops = true;
    host_config
}

/// Opens the vnode host over `raft`'s transport and starts the cluster
/// port's server on its listener, published for a successor to stop.
async fn open_host(
    shared: &Arc<Shared>,
    raft: &RaftEndpoint,
    dir: PathBuf,
) -> Result<(Arc<VnodeHost>, Arc<TransportServer>), ActorProcessingErr> {
    let config = host_config(&shared.config, dir, shared.fabric().is_some());
    let host = VnodeHost::open(config, Arc::clone(&raft.transport)).await?;
    let listener = raft.listener.try_clone()?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let service: Arc<dyn RpcService> =
        Arc::new(ClusterPort::new(Arc::clone(&host), Arc::clone(shared)));
    let server = Arc::new(TransportServer::start(
        listener,
        service,
        malachi_cluster::group::TransportServerConfig::for_transport(raft.transport.config()),
    )?);
    *raft.server.lock() = Some(Arc::clone(&server));
    Ok((host, server))
}

#[ractor::async_trait]
impl Actor for VnodesActor {
    type Msg = VnodesMsg;
    type State = VnodesState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        myself: ActorRef<VnodesMsg>,
        shared: Arc<Shared>,
    ) -> Result<VnodesState, ActorProcessingErr> {
        let raft = shared.links.raft.get().cloned();
        close_stale(&shared, raft.as_deref()).await;
        let dir = shared.config.data_dir.join("metadata");
        let config = &shared.config;
        let (plane, server, peers): (Arc<dyn MetadataPlane>, _, _) = match config.metadata_backend {
            MetadataBackend::File => (
                Arc::new(tokio::task::block_in_place(|| FilePlane::open(&dir))?),
                None,
                None,
            ),
            MetadataBackend::Raft => {
                let raft = raft.ok_or("the raft endpoint is not set up")?;
                let (host, server) = open_host(&shared, &raft, dir.clone()).await?;
                let peers = follow_peers(myself.clone(), &shared, &host);
                (Arc::new(VnodePlane::new(host)), Some(server), peers)
            }
        };
        let host_work = plane.host().map(|host| {
            // The timer ends with the actor.
            myself.send_interval(Duration::from_millis(FATAL_CHECK_MS), || {
                VnodesMsg::CheckGroups
            });
            HostWork::start(
                Arc::clone(host),
                myself.clone(),
                VnodesMsg::LoopEnded,
                Arc::clone(&shared.metrics),
            )
        });
        shared.actors.open_plane(Arc::clone(&plane));
        if config.cluster_nodes().len() == 1 {
            // A lone broker is its own quorum: it learns (or creates) the
            // keys here, so it is ready only once it can serve cursors.
            crate::control::cursor_learner::learn_within(
                &shared,
                plane.as_ref(),
                LONE_KEYS_WAIT_MS,
            )
            .await;
        }
        let learn = crate::control::cursor_learner::learner(&shared, Arc::clone(&plane));
        let keys = spawn_watched(
            myself.clone(),
            "cursor_key_learner",
            async move {
                learn.await;
                // Learned: nothing more to do, and no failure to report.
                std::future::pending::<()>().await;
            },
            VnodesMsg::TaskEnded,
        );
        info!(
            dir = %dir.display(),
            nodes = ?config.cluster_nodes(),
            vnodes = config.vnode_count(),
            "metadata plane open"
        );
        Ok(VnodesState {
            shared,
            plane,
            server,
            _peers: peers,
            _keys: keys,
            host_work,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<VnodesMsg>,
        msg: VnodesMsg,
        state: &mut VnodesState,
    ) -> Result<(), ActorProcessingErr> {
        match (msg, state.host_work.as_mut()) {
            (VnodesMsg::TaskEnded(ended), _) => Err(ended.into()),
            (VnodesMsg::LoopEnded(ended), Some(work)) => Ok(work.loop_ended(ended)?),
            (VnodesMsg::LoopEnded(ended), None) => Err(ended.into()),
            (VnodesMsg::CheckGroups, Some(work)) => Ok(work.check_groups().await?),
            (VnodesMsg::CheckGroups, None) => Ok(()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<VnodesMsg>,
        state: &mut VnodesState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.actors.close_plane();
        if let Some(server) = state.server.take() {
            server.shutdown().await;
            if let Some(raft) = state.shared.links.raft.get() {
                raft.server.lock().take();
            }
        }
        state.plane.shutdown().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use malachi_membership::{Member, MemberState};

    use super::*;

    fn member(node_id: u64, state: MemberState, ring_version: u64) -> Member {
        Member {
            node_id,
            incarnation: 1,
            client_addr: ([127, 0, 0, 1], 4040).into(),
            raft_addr: None,
            admin_addr: None,
            cluster_addr: None,
            attributes: BTreeMap::new(),
            state,
            ring_version,
            vnodes_led: Vec::new(),
        }
    }

    #[test]
    fn the_newest_ring_gossiped_is_a_live_peers() {
        let view = MembershipView {
            local: member(1, MemberState::Alive, 9),
            peers: BTreeMap::from([
                (2, member(2, MemberState::Suspect, 3)),
                (3, member(3, MemberState::Dead, 7)),
            ]),
        };
        // Its own version and a dead peer's do not count.
        assert_eq!(newest_gossiped_ring(&view, 1), 3);
    }

    #[test]
    fn a_gossiped_ring_is_fetched_once_per_version_then_again_only_after_a_pause() {
        let mut observer = RingObserver::default();
        let t0 = Instant::now();
        assert_eq!(observer.due(2, 2, t0), None, "not newer than the held ring");
        assert_eq!(observer.due(3, 2, t0), Some(3));
        let soon = t0 + Duration::from_millis(10);
        assert_eq!(observer.due(3, 2, soon), None, "a burst asks once");
        assert_eq!(observer.due(4, 2, soon), Some(4), "a newer version at once");
        let later = soon + Duration::from_millis(RING_OBSERVE_RETRY_MS);
        assert_eq!(observer.due(4, 2, later), Some(4), "not arrived: ask again");
        assert_eq!(observer.due(4, 4, later), None, "arrived");
    }
}
