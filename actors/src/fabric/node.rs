//! The node fabric: ractor_cluster sessions between brokers, for control
//! messages between actors on different brokers (decisions §1). The first
//! user is the cluster-wide supervision tree (`malachi tree --all`).
//!
//! Pieces, all under the broker's `membership` supervisor:
//! - `node_server`: ractor_cluster's `NodeServer`, authenticated by the
//!   cluster cookie. Its own listener binds an ephemeral port on the cluster
//!   ip and is not advertised; the port brokers dial is the one
//!   [`Fabric::cluster_listener`] holds, bound at broker start (so a taken
//!   port fails the start instead of a restart loop) and fed to the server
//!   by `node`.
//! - `node`: accepts on that port, dials the brokers membership reports
//!   (each pair once: the lower node id dials), and answers [`NodeMsg`]s from
//!   other brokers. It joins the process group `node/<node_id>` in scope
//!   `malachi`, which ractor_cluster mirrors to every connected broker;
//!   scoping the group by node id keeps several brokers in one process (tests,
//!   `malachi dev`) from colliding in ractor's process-global registry.
//!
//! Remote messages are decoded defensively: [`NodeMsg`]'s decoder refuses
//! unknown variants (ractor then drops the message), and replies are wire
//! messages decoded with their bounds checked, so a malformed peer never
//! crashes a broker.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_cluster::membership::{Member, MemberState, Membership, NodeIdentity};
use malachi_wire::messages::{self as wire, Message as _};
use parking_lot::{Mutex, RwLock};
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::{NodeServer, NodeServerMessage};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::common::SupervisorSlot;
use crate::common::convert::tree_to_wire;

/// The process-group scope of broker actors reachable over the fabric.
pub(crate) const PG_SCOPE: &str = "malachi";
/// The serialized name of [`NodeMsg::TreeSnapshot`].
const TREE_SNAPSHOT: &str = "tree_snapshot";
/// How often `node` compares sessions with membership and dials what is missing.
const RECONCILE_MS: u64 = 1_000;
/// A peer is not dialed again sooner than this after an attempt.
const DIAL_BACKOFF_MS: u64 = 3_000;
/// How long one dial may take.
const DIAL_TIMEOUT_MS: u64 = 2_000;
/// Largest ractor_cluster frame accepted from a peer (a tree snapshot is the
/// largest message today).
const INBOUND_FRAME_BYTES_MAX: u64 = 8 << 20;

/// The process group of one broker's `node` actor.
pub(crate) fn node_group(node_id: u64) -> String {
    format!("node/{node_id}")
}

/// The ractor_cluster node name of a broker: `malachi-<node_id>`.
fn node_name(node_id: u64) -> String {
    format!("malachi-{node_id}")
}

/// The node id in a peer's ractor_cluster name (`malachi-<id>@host`).
fn node_id_of(peer_name: &str) -> Option<u64> {
    peer_name
        .strip_prefix("malachi-")?
        .split('@')
        .next()?
        .parse()
        .ok()
}

/// Membership and the node fabric of one broker: created at broker start,
/// shared by the `membership` subtree, the connection handlers and the
/// coordinators, and unchanged by restarts of the actors.
#[derive(Debug)]
pub(crate) struct Fabric {
    pub membership: Membership,
    pub node_id: u64,
    /// This broker's identity with incarnation 0; each SWIM start fills in
    /// its own incarnation.
    pub identity: NodeIdentity,
    pub cookie: String,
    /// The SWIM socket (UDP on the client address's ip:port).
    pub swim_socket: Arc<std::net::UdpSocket>,
    /// The advertised node fabric port, bound at start.
    pub cluster_listener: Arc<std::net::TcpListener>,
    pub node_server: RwLock<Option<ActorRef<NodeServerMessage>>>,
    /// Whether the SWIM runtime task runs (shutdown waits for it to leave).
    pub swim_running: AtomicBool,
    /// The running SWIM task, aborted by the next start if it outlived its actor.
    pub swim_task: Mutex<Option<tokio::task::AbortHandle>>,
    pub remote_call_timeout_ms: u64,
}

/// Messages `node` takes, locally or from other brokers.
#[derive(Debug)]
pub(crate) enum NodeMsg {
    /// This broker's supervision tree, as an encoded
    /// `wire::TreeSnapshotResponse`.
    TreeSnapshot(RpcReplyPort<Vec<u8>>),
}

impl ractor::Message for NodeMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            NodeMsg::TreeSnapshot(reply) => Ok(SerializedMessage::Call {
                variant: TREE_SNAPSHOT.to_owned(),
                args: Vec::new(),
                reply,
                metadata: None,
            }),
        }
    }

    /// Anything but a known call with no arguments is refused, so ractor
    /// drops it instead of handing the actor a half-understood message.
    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call {
                variant,
                args,
                reply,
                ..
            } if variant == TREE_SNAPSHOT && args.is_empty() => Ok(NodeMsg::TreeSnapshot(reply)),
            other => {
                debug!(message = ?other, "undecodable node message dropped");
                Err(BoxedDowncastErr)
            }
        }
    }
}

/// The `node_server` child: ractor_cluster's node server.
pub(crate) fn node_server_spec(fabric: Arc<Fabric>) -> malachi_supervision::ChildSpec {
    malachi_supervision::ChildSpec::from_fn("node_server", move |parent: ActorCell| {
        let fabric = Arc::clone(&fabric);
        Box::pin(async move {
            let cluster_addr = fabric
                .identity
                .cluster_addr
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
            let server = NodeServer::new(
                0,
                fabric.cookie.clone(),
                node_name(fabric.node_id),
                cluster_addr.to_string(),
                None,
                Some(ractor_cluster::node::NodeConnectionMode::Isolated),
            )
            .with_listen_addr(cluster_addr.ip())
            .with_max_inbound_frame_size(INBOUND_FRAME_BYTES_MAX);
            let (actor, _join) = Actor::spawn_linked(None, server, (), parent).await?;
            *fabric.node_server.write() = Some(actor.clone());
            Ok(actor.get_cell())
        })
    })
}

pub(crate) struct NodeActor;

/// What `node` needs: the fabric, and the root supervisor whose tree it
/// answers with.
#[derive(Debug, Clone)]
pub(crate) struct NodeArgs {
    pub fabric: Arc<Fabric>,
    pub root: SupervisorSlot,
}

pub(crate) struct NodeState {
    fabric: Arc<Fabric>,
    root: SupervisorSlot,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for NodeState {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[ractor::async_trait]
impl Actor for NodeActor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<NodeMsg>,
        NodeArgs { fabric, root }: NodeArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        let listener = fabric.cluster_listener.try_clone()?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let accept = tokio::spawn(accept_loop(Arc::clone(&fabric), listener));
        let dial = tokio::spawn(dial_loop(Arc::clone(&fabric)));
        ractor::pg::join_scoped(
            PG_SCOPE.to_owned(),
            node_group(fabric.node_id),
            vec![myself.get_cell()],
        );
        Ok(NodeState {
            fabric,
            root,
            tasks: vec![accept, dial],
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<NodeMsg>,
        message: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            NodeMsg::TreeSnapshot(reply) => {
                // Answered off the actor: a snapshot asks every supervisor,
                // and the node actor must stay free to take the next call.
                let root = Arc::clone(&state.root);
                let node_id = state.fabric.node_id;
                tokio::spawn(async move {
                    let bytes = match local_tree(&root, node_id).await {
                        Some(tree) => match tree.encode() {
                            Ok(bytes) => bytes.to_vec(),
                            // Empty is this call's "no tree" answer (as for
                            // `None`): the asker lists this broker as
                            // unreachable. The failure is logged here.
                            Err(e) => {
                                warn!(node_id, error = %e, "cannot encode this broker's tree");
                                Vec::new()
                            }
                        },
                        None => Vec::new(),
                    };
                    let _ = reply.send(bytes);
                });
            }
        }
        Ok(())
    }
}

/// Hands every connection to the advertised port to the node server.
async fn accept_loop(fabric: Arc<Fabric>, listener: tokio::net::TcpListener) {
    loop {
        let (stream, peer_addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                debug!(%error, "node fabric accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(local_addr) = stream.local_addr() else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let server = fabric.node_server.read().clone();
        let Some(server) = server else {
            debug!(%peer_addr, "node server not running; connection dropped");
            continue;
        };
        let opened = NodeServerMessage::ConnectionOpened {
            stream: Box::new(ractor_cluster::NetworkStream::Raw {
                peer_addr,
                local_addr,
                stream,
            }),
            is_server: true,
        };
        if server.cast(opened).is_err() {
            debug!(%peer_addr, "node server gone; connection dropped");
        }
    }
}

/// Keeps a session to every live broker: on every membership change and
/// every [`RECONCILE_MS`], dials the brokers with a higher node id that have
/// no session yet (the higher one waits to be dialed, so a pair never races
/// two connections).
async fn dial_loop(fabric: Arc<Fabric>) {
    let mut events = fabric.membership.watch();
    let mut tick = tokio::time::interval(Duration::from_millis(RECONCILE_MS));
    let mut last_dial: HashMap<u64, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = events.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let server = fabric.node_server.read().clone();
        let Some(server) = server else { continue };
        let connected = match sessions(&server).await {
            Some(connected) => connected,
            None => continue,
        };
        let view = fabric.membership.view();
        for member in view.peers.values() {
            if member.node_id <= fabric.node_id
                || !member.state.is_live()
                || connected.contains(&member.node_id)
            {
                continue;
            }
            let Some(addr) = member.cluster_addr else {
                continue;
            };
            if last_dial
                .get(&member.node_id)
                .is_some_and(|at| at.elapsed() < Duration::from_millis(DIAL_BACKOFF_MS))
            {
                continue;
            }
            last_dial.insert(member.node_id, Instant::now());
            let dial = ractor_cluster::client_connect(&server, addr);
            match tokio::time::timeout(Duration::from_millis(DIAL_TIMEOUT_MS), dial).await {
                Ok(Ok(())) => info!(peer = member.node_id, %addr, "node fabric session opened"),
                Ok(Err(error)) => {
                    debug!(peer = member.node_id, %addr, %error, "node fabric dial failed")
                }
                Err(_) => debug!(peer = member.node_id, %addr, "node fabric dial timed out"),
            }
        }
    }
}

/// Node ids with a session (authenticated or not yet) on `server`.
async fn sessions(server: &ActorRef<NodeServerMessage>) -> Option<BTreeSet<u64>> {
    let reply = server
        .call(NodeServerMessage::GetSessions, Some(Duration::from_secs(1)))
        .await
        .ok()?;
    let CallResult::Success(sessions) = reply else {
        return None;
    };
    Some(
        sessions
            .values()
            .filter_map(|s| s.peer_name.as_ref().and_then(|n| node_id_of(&n.name)))
            .collect(),
    )
}

/// This broker's tree, as the wire carries it.
pub(crate) async fn local_tree(
    root: &SupervisorSlot,
    node_id: u64,
) -> Option<wire::TreeSnapshotResponse> {
    let root = root.read().clone()?;
    let snapshot = root.snapshot().await.ok()?;
    Some(wire::TreeSnapshotResponse {
        node_id,
        root: tree_to_wire(&snapshot),
        brokers: Vec::new(),
    })
}

fn wire_state(state: MemberState) -> wire::BrokerState {
    match state {
        MemberState::Alive => wire::BrokerState::Alive,
        MemberState::Suspect => wire::BrokerState::Suspect,
        MemberState::Dead => wire::BrokerState::Dead,
    }
}

/// A member as `cluster status` shows it.
pub(crate) fn broker_status(member: &Member) -> wire::BrokerStatus {
    let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
    wire::BrokerStatus {
        node_id: member.node_id,
        state: wire_state(member.state),
        client_addr: member.client_addr.to_string(),
        raft_addr: addr(member.raft_addr),
        admin_addr: addr(member.admin_addr),
        attributes: member.attributes.clone(),
        vnodes_led: member.vnodes_led.iter().map(|l| l.vnode).collect(),
        incarnation: member.incarnation,
        cluster_addr: addr(member.cluster_addr),
    }
}

/// Every broker's tree, this one first. A broker that cannot answer is
/// listed with the reason; the gathering as a whole never fails. Remote
/// brokers are asked at once, each within `remote_call_timeout_ms`.
pub(crate) async fn gather_trees(fabric: &Fabric, root: &SupervisorSlot) -> Vec<wire::BrokerTree> {
    let view = fabric.membership.view();
    let timeout = Duration::from_millis(fabric.remote_call_timeout_ms);
    let asks = view.all().map(|member| {
        let member = member.clone();
        let root = Arc::clone(root);
        let node_id = fabric.node_id;
        async move {
            let (root, unreachable) = if member.node_id == node_id {
                match local_tree(&root, node_id).await {
                    Some(tree) => (Some(tree.root), None),
                    None => (None, Some("the tree is not running".to_owned())),
                }
            } else if member.state == MemberState::Dead {
                (None, Some("declared dead by membership".to_owned()))
            } else {
                match remote_tree(member.node_id, timeout).await {
                    Ok(tree) => (Some(tree.root), None),
                    Err(reason) => (None, Some(reason)),
                }
            };
            wire::BrokerTree {
                node_id: member.node_id,
                state: wire_state(member.state),
                client_addr: member.client_addr.to_string(),
                root,
                unreachable,
            }
        }
    });
    futures::future::join_all(asks).await
}

/// Asks broker `node_id`'s `node` actor for its tree: a local one first (a
/// broker in this process), then each remote proxy of it.
async fn remote_tree(
    node_id: u64,
    timeout: Duration,
) -> Result<wire::TreeSnapshotResponse, String> {
    let mut members = ractor::pg::get_scoped_members(&PG_SCOPE.to_owned(), &node_group(node_id));
    if members.is_empty() {
        return Err("no node fabric session to this broker".to_owned());
    }
    members.sort_by_key(|cell| !cell.get_id().is_local());
    let mut last = String::new();
    for cell in members {
        let actor: ActorRef<NodeMsg> = cell.into();
        match actor.call(NodeMsg::TreeSnapshot, Some(timeout)).await {
            Ok(CallResult::Success(bytes)) => {
                match wire::TreeSnapshotResponse::decode(Bytes::from(bytes)) {
                    Ok(tree) if tree.node_id == node_id => return Ok(tree),
                    Ok(tree) => {
                        warn!(
                            asked = node_id,
                            answered = tree.node_id,
                            "a tree from the wrong broker"
                        );
                        last = format!("answered as node {}", tree.node_id);
                    }
                    Err(error) => last = format!("undecodable answer: {error}"),
                }
            }
            Ok(CallResult::Timeout) => {
                last = format!("no answer within {} ms", timeout.as_millis())
            }
            Ok(CallResult::SenderError) | Err(_) => last = "the session closed".to_owned(),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_name_gives_its_node_id_and_nothing_else_does() {
        assert_eq!(node_id_of("malachi-12@127.0.0.1:4000"), Some(12));
        assert_eq!(node_id_of("malachi-x@h"), None);
        assert_eq!(node_id_of("other-1@h"), None);
    }

    #[test]
    fn an_unknown_or_malformed_remote_message_is_refused_not_panicked_on() {
        let (tx, _rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        let unknown = SerializedMessage::Call {
            variant: "format_disk".into(),
            args: Vec::new(),
            reply: RpcReplyPort::from(tx),
            metadata: None,
        };
        assert!(<NodeMsg as ractor::Message>::deserialize(unknown).is_err());
        let (tx, _rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        let with_args = SerializedMessage::Call {
            variant: TREE_SNAPSHOT.into(),
            args: vec![0xff; 10],
            reply: RpcReplyPort::from(tx),
            metadata: None,
        };
        assert!(<NodeMsg as ractor::Message>::deserialize(with_args).is_err());
        let cast = SerializedMessage::Cast {
            variant: TREE_SNAPSHOT.into(),
            args: Vec::new(),
            metadata: None,
        };
        assert!(<NodeMsg as ractor::Message>::deserialize(cast).is_err());
    }
}
