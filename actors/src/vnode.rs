//! `vnodes`: the actor that owns this broker's vnode replicas (ADR 0081).
//!
//! In `pre_start` it opens a `VnodeHost` (the replica of every vnode whose
//! voters include this broker, each an openraft group under
//! `data_dir/metadata/vnode-<id>`), serves the raft port with it, keeps the
//! transport's peer addresses current from membership, fetches a newer ring
//! when a peer gossips one (`observe_ring_version`), and publishes the
//! plane to the broker's shared state, so the coordinator manager, started
//! after it under the `rest_for_one` metadata supervisor, always finds it
//! open. It shuts all of it down on a graceful stop. If it fails,
//! `rest_for_one` restarts the coordinator manager after it too.
//!
//! With `metadata_backend = "file"` (a lone broker only) it opens a
//! `FilePlane` instead and serves no raft.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use malachi_cluster::group::{RpcService, TransportServer};
use malachi_cluster::vnodes::broker_api::FORWARD_LIST_API_KEY;
use malachi_cluster::vnodes::{VnodeHost, VnodeHostConfig};
use malachi_wire::error::ErrorCode;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::{debug, info};

use crate::config::MetadataBackend;
use crate::metadata::{FilePlane, MetadataPlane, VnodePlane};
use crate::shared::Shared;

pub(crate) struct VnodesActor;

#[derive(Debug)]
pub(crate) enum VnodesMsg {}
impl ractor::Message for VnodesMsg {}

pub(crate) struct VnodesState {
    shared: Arc<Shared>,
    plane: Arc<dyn MetadataPlane>,
    server: Option<Arc<TransportServer>>,
    peers: Option<JoinHandle<()>>,
}

/// What the raft port serves: the host's raft and forwarding keys, plus
/// the forwarded topic list (key 212), which `VnodeHost` serves through its
/// broker api.
#[derive(Debug)]
struct BrokerRpc {
    host: Arc<VnodeHost>,
}

#[async_trait::async_trait]
impl RpcService for BrokerRpc {
    async fn serve(
        &self,
        api_key: u16,
        group_id: u64,
        body: Bytes,
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        if api_key == FORWARD_LIST_API_KEY {
            return self.host.serve_list(group_id).await;
        }
        self.host.serve(api_key, group_id, body).await
    }
}

/// How often a broker that heard of a newer ring than it holds asks for it
/// again while the first fetch has not brought it (a ring group without a
/// leader, a lost answer).
const RING_OBSERVE_RETRY_MS: u64 = 1_000;

/// Follows the membership view: keeps the transport's peer addresses equal
/// to the raft addresses the cluster's brokers gossip (a restarted broker
/// gossips a new incarnation with its new raft port, and `set_peer`
/// reconnects to it), and learns of a newer ring from the ring versions
/// they gossip (`set_local_routing`, published by each coordinator
/// manager), so a broker learns a split without waiting to be refused as
/// misrouted. The view is level-triggered, so a burst of routing events is
/// read as one.
fn follow_peers(shared: &Arc<Shared>, host: &Arc<VnodeHost>) -> Option<JoinHandle<()>> {
    let fabric = crate::node::fabric(shared)?;
    let mut view = fabric.membership.watch();
    let host = Arc::clone(host);
    Some(tokio::spawn(async move {
        // The newest version asked for, and when: one fetch per version,
        // repeated every `RING_OBSERVE_RETRY_MS` while it has not arrived.
        let mut asked: Option<(u64, tokio::time::Instant)> = None;
        loop {
            let (learned, gossiped_version) = {
                let view = view.borrow_and_update();
                let learned: Vec<(u64, std::net::SocketAddr)> = view
                    .all()
                    .filter(|m| m.node_id != host.node_id() && host.nodes().contains(&m.node_id))
                    .filter_map(|m| m.raft_addr.map(|addr| (m.node_id, addr)))
                    .collect();
                let version = view
                    .live()
                    .filter(|m| m.node_id != host.node_id())
                    .map(|m| m.ring_version)
                    .max()
                    .unwrap_or(0);
                (learned, version)
            };
            for (node, addr) in learned {
                let known = host.transport().peers().contains(&(node, addr));
                if !known {
                    debug!(node, %addr, "raft peer address learned");
                    host.transport().set_peer(node, addr);
                }
            }
            let behind = gossiped_version > host.ring().version();
            if behind {
                let due = match asked {
                    Some((version, at)) => {
                        gossiped_version > version
                            || at.elapsed() >= Duration::from_millis(RING_OBSERVE_RETRY_MS)
                    }
                    None => true,
                };
                if due {
                    debug!(
                        version = gossiped_version,
                        held = host.ring().version(),
                        "a peer gossips a newer ring"
                    );
                    host.observe_ring_version(gossiped_version);
                    asked = Some((gossiped_version, tokio::time::Instant::now()));
                }
            }
            // While behind, wake to retry even if the view stays still.
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
    }))
}

#[ractor::async_trait]
impl Actor for VnodesActor {
    type Msg = VnodesMsg;
    type State = VnodesState;
    type Arguments = Arc<Shared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<VnodesMsg>,
        shared: Arc<Shared>,
    ) -> Result<VnodesState, ActorProcessingErr> {
        // A crashed predecessor left its plane and raft server published
        // (post_stop does not run after a failure): stop them before
        // reopening the same files, so two raft nodes never share one log.
        let stale = shared.plane.write().take();
        if let Some(stale) = stale {
            let _ = stale.shutdown().await;
        }
        let raft = shared.raft.get().cloned();
        if let Some(raft) = &raft {
            let stale = raft.server.lock().take();
            if let Some(stale) = stale {
                stale.shutdown().await;
            }
        }
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
                let mut host_config =
                    VnodeHostConfig::new(config.node_id, config.cluster_nodes(), dir.clone());
                host_config.vnode_count = config.vnode_count();
                host_config.replicas_per_vnode = config.cluster.replicas_per_vnode;
                host_config.forward_timeout_ms = config.cluster.forward_timeout_ms;
                let host = VnodeHost::open(host_config, Arc::clone(&raft.transport)).await?;
                let listener = raft.listener.try_clone()?;
                listener.set_nonblocking(true)?;
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let service: Arc<dyn RpcService> = Arc::new(BrokerRpc {
                    host: Arc::clone(&host),
                });
                let server = Arc::new(TransportServer::start(
                    listener,
                    service,
                    malachi_cluster::group::TcpTransportConfig::new(config.node_id).frame_bytes_max,
                )?);
                *raft.server.lock() = Some(Arc::clone(&server));
                let peers = follow_peers(&shared, &host);
                (Arc::new(VnodePlane::new(host)), Some(server), peers)
            }
        };
        *shared.plane.write() = Some(Arc::clone(&plane));
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
            peers,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<VnodesMsg>,
        state: &mut VnodesState,
    ) -> Result<(), ActorProcessingErr> {
        *state.shared.plane.write() = None;
        if let Some(peers) = state.peers.take() {
            peers.abort();
        }
        if let Some(server) = state.server.take() {
            server.shutdown().await;
            if let Some(raft) = state.shared.raft.get() {
                raft.server.lock().take();
            }
        }
        state.plane.shutdown().await?;
        Ok(())
    }
}
