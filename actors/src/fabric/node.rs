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
//!
//! Bounds of the advertised port ([`InboundConnections`], config
//! `membership.fabric_connections_max`, `fabric_handshake_timeout_ms`):
//! - At most `fabric_connections_max` accepted connections live at once,
//!   handshaking or authenticated. Each holds a slot (a semaphore permit)
//!   shared by the two halves `node` hands ractor_cluster as an external
//!   stream, so the slot returns exactly when ractor_cluster drops the
//!   connection. One past the limit is closed on the accept loop itself, no
//!   task spawned, logged at most once per
//!   [`REFUSAL_LOG_INTERVAL_MS`](crate::common::refusal::REFUSAL_LOG_INTERVAL_MS).
//! - A connection has `fabric_handshake_timeout_ms` from its accept to
//!   become an authenticated session. The read half carries the deadline:
//!   until a subscription to the node server's events marks the connection
//!   authenticated (matched by its peer address), a read polled past the
//!   deadline fails with `TimedOut`, so ractor_cluster's reader stops, the
//!   session ends and the socket closes. A client that sends nothing, or a
//!   byte a second, is dropped.
//! - ractor_cluster reads a frame (a u64 length, then the payload) into a
//!   buffer that grows with the bytes received, 8 KiB at a time, and refuses
//!   a declared length over [`INBOUND_FRAME_BYTES_MAX`] before reading it.
//!   That limit is for tree snapshots between authenticated brokers; before
//!   authentication the read half lets through at most
//!   [`HANDSHAKE_BYTES_MAX`] (the handshake is a few hundred bytes), so an
//!   unauthenticated peer makes the broker hold no more than that.
//! - The dial loop backs off per peer, exponentially with jitter
//!   ([`DIAL_BACKOFF_MIN_MS`] up to [`DIAL_BACKOFF_MAX_MS`]).
//!
//! ractor_cluster's own listener, which `NodeServer` always starts, serves
//! nothing (ADR 0145): it binds a free loopback port, is never advertised,
//! and every session it accepts is stopped as soon as the node server
//! reports it opened ([`HandshakeWatch`]: an inbound session whose label
//! does not carry [`INBOUND_LABEL_PREFIX`] did not come through the
//! advertised port), so its socket closes at once and a flood of
//! connections to it holds no descriptors.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use malachi_cluster::group::peer_tls::{PeerRead, PeerWrite, plain_halves, tls_halves};
use malachi_cluster::group::{Accepted, Backoff, PeerTls, backoff_seed};
use malachi_membership::{Member, MemberState, Membership, NodeIdentity};
use malachi_wire::WireError;
use malachi_wire::messages::{self as wire, Message as _};
use parking_lot::{Mutex, RwLock};
use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::node::{NodeEventSubscription, NodeServerSessionInformation};
use ractor_cluster::{NodeServer, NodeServerMessage};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use super::remote::{PG_SCOPE, Peer};
use crate::common::SupervisorSlot;
use crate::common::convert::tree_to_wire;
use crate::common::refusal::{REFUSAL_LOG_INTERVAL_MS, RefusalLog};
use crate::common::watched::{TaskEnded, Watched, spawn_watched};

/// The serialized name of [`NodeMsg::TreeSnapshot`].
const TREE_SNAPSHOT: &str = "tree_snapshot";
/// How often `node` compares sessions with membership and dials what is missing.
const RECONCILE_MS: u64 = 1_000;
/// After a failed dial a peer is dialed again no sooner than about this
/// (jittered within [half, whole]); each further failure doubles it.
const DIAL_BACKOFF_MIN_MS: u64 = 1_000;
/// The longest wait between dials of a peer that keeps failing.
const DIAL_BACKOFF_MAX_MS: u64 = 30_000;
/// How long one dial may take.
const DIAL_TIMEOUT_MS: u64 = 2_000;
/// Largest ractor_cluster frame accepted from a peer (a tree snapshot is the
/// largest message today).
const INBOUND_FRAME_BYTES_MAX: u64 = 8 << 20;
/// Bytes an inbound connection may send before it is authenticated. The
/// handshake (name, challenge, digest) is a few hundred bytes; the margin
/// covers the session's first control messages, which may race the
/// authenticated event by one actor hop.
pub(crate) const HANDSHAKE_BYTES_MAX: u64 = 256 << 10;
/// The first retry of a failed accept waits this long, doubling per failure.
const ACCEPT_BACKOFF_MIN_MS: u64 = 10;
/// The longest wait between failed accepts.
const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;
/// The id of `node`'s subscription to the node server's session events.
const INBOUND_SUBSCRIPTION: &str = "malachi-inbound-handshakes";
/// What the label of a connection accepted on the advertised port starts
/// with; an inbound session labelled otherwise came through ractor_cluster's
/// own listener and is stopped at once.
const INBOUND_LABEL_PREFIX: &str = "fabric/";

/// The label `node` gives the connection from `peer_addr` it hands the
/// node server (the key it is marked authenticated by).
fn inbound_label(peer_addr: SocketAddr) -> String {
    format!("{INBOUND_LABEL_PREFIX}{peer_addr}")
}

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
    /// The advertised port's connection slots and handshake deadlines.
    pub inbound: Arc<InboundConnections>,
    /// The cluster this broker belongs to (ADR 0102).
    pub formed: Arc<super::formation::Formed>,
    /// Calls to behaviours on other brokers, bounded (ADR 0133).
    pub calls: super::remote::RemoteCalls,
    /// TLS to and from the other brokers (ADR 0151); `None`: plaintext.
    pub tls: Option<PeerTls>,
}

impl Fabric {
    /// This broker as the fabric finds it.
    pub(crate) fn me(&self) -> Peer {
        Peer {
            node_id: self.node_id,
            addr: self.identity.cluster_addr,
        }
    }

    /// Broker `node_id` as membership knows it, and whether it is live.
    pub(crate) fn peer(&self, node_id: u64) -> (Peer, bool) {
        let view = self.membership.view();
        let member = view.peers.get(&node_id);
        let peer = Peer {
            node_id,
            addr: member.and_then(|m| m.cluster_addr),
        };
        (peer, member.is_some_and(|m| m.state.is_live()))
    }
}

/// The accepting side of the advertised port: its slots and the
/// connections still handshaking. Shared by every start of `node_server`
/// and `node`, so a restart forgets no connection that is still open.
#[derive(Debug)]
pub(crate) struct InboundConnections {
    connections_max: usize,
    handshake_timeout: Duration,
    slots: Arc<Semaphore>,
    /// Connections not yet authenticated, by peer address (the label the
    /// node server reports them under). At most `connections_max` entries:
    /// each is removed when its connection authenticates or is dropped.
    handshaking: parking_lot::Mutex<HashMap<String, (u64, Weak<InboundConn>)>>,
    next_id: AtomicU64,
    /// Refusals at the connection limit.
    refusals: parking_lot::Mutex<RefusalLog>,
    /// Connections dropped for an unfinished handshake.
    expiries: parking_lot::Mutex<RefusalLog>,
    /// Inbound connections the node server authenticated, ever.
    authenticated_total: AtomicU64,
    /// Inbound connections dropped before authenticating, ever.
    expired_total: AtomicU64,
    /// Sessions ractor_cluster's own listener accepted, each stopped at once.
    unadvertised_total: AtomicU64,
    unadvertised_log: parking_lot::Mutex<RefusalLog>,
    /// Where ractor_cluster's own listener is bound (for tests).
    unadvertised_addr: parking_lot::Mutex<Option<SocketAddr>>,
}

impl InboundConnections {
    pub(crate) fn new(connections_max: usize, handshake_timeout_ms: u64) -> Arc<Self> {
        assert!(
            connections_max > 0,
            "fabric_connections_max is validated positive"
        );
        assert!(
            handshake_timeout_ms > 0,
            "fabric_handshake_timeout_ms is validated positive"
        );
        Arc::new(InboundConnections {
            connections_max,
            handshake_timeout: Duration::from_millis(handshake_timeout_ms),
            slots: Arc::new(Semaphore::new(connections_max)),
            handshaking: parking_lot::Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            refusals: parking_lot::Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL_MS)),
            expiries: parking_lot::Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL_MS)),
            authenticated_total: AtomicU64::new(0),
            expired_total: AtomicU64::new(0),
            unadvertised_total: AtomicU64::new(0),
            unadvertised_log: parking_lot::Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL_MS)),
            unadvertised_addr: parking_lot::Mutex::new(None),
        })
    }

    /// Inbound connections authenticated and dropped before authenticating,
    /// since start (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.authenticated_total.load(Ordering::Relaxed),
            self.expired_total.load(Ordering::Relaxed),
        )
    }

    /// Sessions ractor_cluster's own listener accepted (each stopped at
    /// once), and where that listener is bound (for tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn unadvertised(&self) -> (u64, Option<SocketAddr>) {
        (
            self.unadvertised_total.load(Ordering::Relaxed),
            *self.unadvertised_addr.lock(),
        )
    }

    /// A session came through ractor_cluster's own listener: stop it, so
    /// its socket closes at once. Its TCP session and that session's reader
    /// are killed first: a stop waits for the message in hand, and the
    /// reader's is a read that a silent peer never completes (it holds the
    /// socket's read half).
    fn stop_unadvertised(&self, ses: &NodeServerSessionInformation) {
        for child in ses.actor.get_children() {
            kill_tree(&child);
        }
        ses.actor.stop(Some(
            "connected through the unadvertised listener".to_owned(),
        ));
        self.unadvertised_total.fetch_add(1, Ordering::Relaxed);
        let admitted = self.unadvertised_log.lock().admit(Instant::now());
        if let Some(refused_unlogged) = admitted {
            warn!(
                peer = %ses.peer_addr,
                refused_unlogged,
                "node fabric session on ractor_cluster's own listener closed: brokers dial the advertised port"
            );
        }
    }

    /// A slot for an accepted connection; `None` at the limit (the caller
    /// closes it).
    fn slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// Wraps a connection from `peer_addr` that holds `slot` into the
    /// halves ractor_cluster gets, its handshake deadline starting now.
    fn admit(
        self: &Arc<Self>,
        slot: OwnedSemaphorePermit,
        (read, write): (PeerRead, PeerWrite),
        local_label: Option<String>,
        peer_addr: SocketAddr,
        certified: Option<Vec<u64>>,
    ) -> InboundStream {
        let label = inbound_label(peer_addr);
        let conn = Arc::new(InboundConn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            label: label.clone(),
            peer_addr,
            certified,
            authenticated: AtomicBool::new(false),
            inbound: Arc::clone(self),
            _slot: slot,
        });
        self.handshaking
            .lock()
            .insert(label.clone(), (conn.id, Arc::downgrade(&conn)));
        let deadline = tokio::time::Instant::now() + self.handshake_timeout;
        InboundStream {
            peer_label: label,
            local_label,
            reader: Box::new(InboundRead {
                inner: read,
                conn: Arc::clone(&conn),
                handshake: Some(Box::pin(tokio::time::sleep_until(deadline))),
                handshake_bytes: 0,
            }),
            writer: Box::new(InboundWrite {
                inner: write,
                _conn: conn,
            }),
        }
    }

    /// The node server authenticated the session reported under `label`,
    /// the peer naming itself node `claimed`. With node identity required,
    /// a node its certificate is not for is refused (ADR 0155): the peer's
    /// address and the nodes its certificate is for come back, and the
    /// caller stops the session.
    fn authenticated(
        &self,
        label: &str,
        claimed: Option<u64>,
    ) -> Result<(), (SocketAddr, Vec<u64>)> {
        let entry = self.handshaking.lock().remove(label);
        // Upgraded outside the lock: dropping the last strong reference runs
        // `InboundConn::drop`, which takes the lock.
        if let Some((_, conn)) = entry
            && let Some(conn) = conn.upgrade()
        {
            if let Some(nodes) = &conn.certified
                && !claimed.is_some_and(|node| nodes.contains(&node))
            {
                return Err((conn.peer_addr, nodes.clone()));
            }
            conn.authenticated.store(true, Ordering::Release);
            self.authenticated_total.fetch_add(1, Ordering::Relaxed);
            debug!(peer = %conn.peer_addr, "node fabric connection authenticated");
        }
        Ok(())
    }

    fn log_refusal(&self, peer_addr: SocketAddr) {
        let admitted = self.refusals.lock().admit(Instant::now());
        if let Some(refused_unlogged) = admitted {
            warn!(
                peer = %peer_addr,
                fabric_connections_max = self.connections_max,
                refused_unlogged,
                "node fabric connection refused: at the connection limit"
            );
        }
    }

    fn log_expiry(&self, peer_addr: SocketAddr, reason: &'static str) {
        self.expired_total.fetch_add(1, Ordering::Relaxed);
        let admitted = self.expiries.lock().admit(Instant::now());
        if let Some(dropped_unlogged) = admitted {
            warn!(
                peer = %peer_addr,
                reason,
                dropped_unlogged,
                "node fabric connection dropped before authenticating"
            );
        }
    }
}

/// Kills `cell` and everything under it, children first.
fn kill_tree(cell: &ActorCell) {
    for child in cell.get_children() {
        kill_tree(&child);
    }
    cell.kill();
}

/// One accepted connection, shared by its two halves: dropping both
/// returns its slot.
#[derive(Debug)]
struct InboundConn {
    id: u64,
    label: String,
    peer_addr: SocketAddr,
    /// The node ids its TLS certificate is for, when node identity is
    /// required (ADR 0155); `None` otherwise.
    certified: Option<Vec<u64>>,
    authenticated: AtomicBool,
    inbound: Arc<InboundConnections>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for InboundConn {
    fn drop(&mut self) {
        let mut handshaking = self.inbound.handshaking.lock();
        // A later connection from the same address may have the entry now.
        if handshaking
            .get(&self.label)
            .is_some_and(|(id, _)| *id == self.id)
        {
            handshaking.remove(&self.label);
        }
    }
}

/// The read half ractor_cluster gets: until the connection authenticates,
/// reads fail past the handshake deadline or past [`HANDSHAKE_BYTES_MAX`].
struct InboundRead {
    inner: PeerRead,
    conn: Arc<InboundConn>,
    /// The handshake deadline, dropped once authenticated.
    handshake: Option<Pin<Box<tokio::time::Sleep>>>,
    handshake_bytes: u64,
}

impl AsyncRead for InboundRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(deadline) = this.handshake.as_mut() else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if this.conn.authenticated.load(Ordering::Acquire) {
            this.handshake = None;
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        if deadline.as_mut().poll(cx).is_ready() {
            let inbound = &this.conn.inbound;
            inbound.log_expiry(this.conn.peer_addr, "fabric_handshake_timeout_ms passed");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no authenticated session within {} ms",
                    inbound.handshake_timeout.as_millis()
                ),
            )));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        this.handshake_bytes = this.handshake_bytes.saturating_add(read);
        if this.handshake_bytes > HANDSHAKE_BYTES_MAX
            && !this.conn.authenticated.load(Ordering::Acquire)
        {
            this.conn.inbound.log_expiry(
                this.conn.peer_addr,
                "more than HANDSHAKE_BYTES_MAX before authenticating",
            );
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {HANDSHAKE_BYTES_MAX} bytes before authenticating"),
            )));
        }
        polled
    }
}

/// The write half ractor_cluster gets: only holds the connection's slot.
struct InboundWrite {
    inner: PeerWrite,
    _conn: Arc<InboundConn>,
}

impl AsyncWrite for InboundWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// An accepted fabric socket as ractor_cluster takes it: the bounded read
/// half, the write half, and the peer's address as its label (the key
/// [`InboundConnections`] marks authenticated by).
struct InboundStream {
    peer_label: String,
    local_label: Option<String>,
    reader: ractor_cluster::BoxRead,
    writer: ractor_cluster::BoxWrite,
}

impl ractor_cluster::ClusterBidiStream for InboundStream {
    fn split(self: Box<Self>) -> (ractor_cluster::BoxRead, ractor_cluster::BoxWrite) {
        (self.reader, self.writer)
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer_label.clone())
    }

    fn local_label(&self) -> Option<String> {
        self.local_label.clone()
    }
}

/// `node_server`'s session events, as [`InboundConnections`] needs them,
/// and the TLS whose observer counts a session refused for its node
/// identity (ADR 0155).
struct HandshakeWatch(Arc<InboundConnections>, Option<PeerTls>);

impl NodeEventSubscription for HandshakeWatch {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        if ses.is_server && !ses.peer_addr.starts_with(INBOUND_LABEL_PREFIX) {
            self.0.stop_unadvertised(&ses);
        }
    }

    fn node_session_disconnected(&self, _ses: NodeServerSessionInformation) {}

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        if !ses.is_server {
            return;
        }
        let claimed = ses.peer_name.as_ref().and_then(|n| node_id_of(&n.name));
        if let Err((peer_addr, nodes)) = self.0.authenticated(&ses.peer_addr, claimed) {
            // Counted and logged by the TLS's observer, then stopped as an
            // unadvertised session is.
            if let Some(tls) = &self.1 {
                let _ = tls.admit_node(
                    "fabric",
                    "inbound",
                    peer_addr,
                    Some(&nodes),
                    claimed.unwrap_or(0),
                );
            }
            for child in ses.actor.get_children() {
                kill_tree(&child);
            }
            ses.actor
                .stop(Some("certificate for another node".to_owned()));
        }
    }
}

/// Messages `node` takes, locally or from other brokers.
#[derive(Debug)]
pub(crate) enum NodeMsg {
    /// This broker's supervision tree, as an encoded
    /// `wire::TreeSnapshotResponse`.
    TreeSnapshot(RpcReplyPort<Vec<u8>>),
    /// One of the actor's loops (accept, dial) ended: the actor fails, and
    /// its restart starts both again. Local only: never serialized.
    LoopEnded(TaskEnded),
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
            NodeMsg::LoopEnded(_) => Err(BoxedDowncastErr),
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
            // A free loopback port, picked here so tests can find it (were
            // it taken meanwhile, the start fails and is retried).
            let listen_ip = loopback_like(cluster_addr.ip());
            let unadvertised = std::net::TcpListener::bind((listen_ip, 0))
                .and_then(|probe| probe.local_addr())
                .map_err(|e| ractor::SpawnErr::StartupFailed(e.to_string().into()))?;
            *fabric.inbound.unadvertised_addr.lock() = Some(unadvertised);
            let server = NodeServer::new(
                unadvertised.port(),
                fabric.cookie.clone(),
                node_name(fabric.node_id),
                cluster_addr.to_string(),
                None,
                Some(ractor_cluster::node::NodeConnectionMode::Isolated),
            )
            // The server's own listener serves nothing (every session it
            // accepts is stopped): keep it off the network too.
            .with_listen_addr(listen_ip)
            .with_max_inbound_frame_size(INBOUND_FRAME_BYTES_MAX);
            let (actor, _join) = Actor::spawn_linked(None, server, (), parent).await?;
            // Subscribed before the server is published, so it is in place
            // before `node` hands the server any connection.
            actor
                .cast(NodeServerMessage::SubscribeToEvents {
                    id: INBOUND_SUBSCRIPTION.to_owned(),
                    subscription: Box::new(HandshakeWatch(
                        Arc::clone(&fabric.inbound),
                        fabric.tls.clone(),
                    )),
                })
                .map_err(|e| ractor::SpawnErr::StartupFailed(e.to_string().into()))?;
            *fabric.node_server.write() = Some(actor.clone());
            Ok(actor.get_cell())
        })
    })
}

/// The loopback address of `ip`'s family.
fn loopback_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
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
    /// The accept and dial loops, watched; aborted with the state (a
    /// stop, a failure or a kill alike).
    _loops: [Watched; 2],
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
        let accept = spawn_watched(
            myself.clone(),
            "node accept",
            accept_loop(Arc::clone(&fabric), listener),
            NodeMsg::LoopEnded,
        );
        let dial = spawn_watched(
            myself.clone(),
            "node dial",
            dial_loop(Arc::clone(&fabric)),
            NodeMsg::LoopEnded,
        );
        ractor::pg::join_scoped(
            PG_SCOPE.to_owned(),
            node_group(fabric.node_id),
            vec![myself.get_cell()],
        );
        Ok(NodeState {
            fabric,
            root,
            _loops: [accept, dial],
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
            NodeMsg::LoopEnded(ended) => return Err(Box::new(ended)),
        }
        Ok(())
    }
}

/// Hands every connection to the advertised port to the node server, within
/// [`InboundConnections`]' slots (one past them is closed here, no task
/// spawned) and with its handshake deadline.
async fn accept_loop(fabric: Arc<Fabric>, listener: tokio::net::TcpListener) {
    let mut failures = Backoff::new(
        ACCEPT_BACKOFF_MIN_MS,
        ACCEPT_BACKOFF_MAX_MS,
        backoff_seed(fabric.node_id, 0),
    );
    loop {
        let (stream, peer_addr) = match listener.accept().await {
            Ok(accepted) => {
                failures.reset();
                accepted
            }
            Err(error) => {
                let delay_ms = failures.next_delay_ms();
                debug!(%error, delay_ms, "node fabric accept failed");
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                continue;
            }
        };
        let server = fabric.node_server.read().clone();
        let Some(server) = server else {
            debug!(%peer_addr, "node server not running; connection dropped");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Some(slot) = fabric.inbound.slot() else {
            fabric.inbound.log_refusal(peer_addr);
            continue;
        };
        let local_label = stream.local_addr().ok().map(|a| a.to_string());
        let Some(tls) = fabric.tls.clone() else {
            let stream =
                fabric
                    .inbound
                    .admit(slot, plain_halves(stream), local_label, peer_addr, None);
            hand_over(&server, stream, peer_addr);
            continue;
        };
        // The TLS handshake runs off the accept loop, holding its slot and
        // bounded by `tls.handshake_timeout_ms` (ADR 0151); a refusal is
        // counted and logged by the TLS's observer.
        let inbound = Arc::clone(&fabric.inbound);
        tokio::spawn(async move {
            let (halves, certified) = match tls.accept_either("fabric", stream, peer_addr).await {
                // Checked against the name the peer gives once its session
                // authenticates (`HandshakeWatch`).
                Ok(Accepted::Tls(stream)) => {
                    let certified = tls.certified_nodes(stream.get_ref().1.peer_certificates());
                    (tls_halves(stream), certified)
                }
                // A plaintext peer, in a step that takes one (ADR 0162).
                Ok(Accepted::Plain(stream)) => (plain_halves(stream), None),
                Err(_) => return,
            };
            let stream = inbound.admit(slot, halves, local_label, peer_addr, certified);
            hand_over(&server, stream, peer_addr);
        });
    }
}

/// Gives an accepted connection to the node server.
fn hand_over(server: &ActorRef<NodeServerMessage>, stream: InboundStream, peer_addr: SocketAddr) {
    // `ConnectionOpenedExternal`, not `ConnectionOpened`: only the
    // external variant keeps the stream's peer label as the session's
    // `peer_addr` (the other reports 0.0.0.0:0 for an external stream),
    // and that label is how `HandshakeWatch` finds the connection to mark
    // authenticated. Regression: every inbound session was cut at the
    // handshake deadline.
    let opened = NodeServerMessage::ConnectionOpenedExternal {
        stream: Box::new(stream),
        is_server: true,
    };
    if server.cast(opened).is_err() {
        debug!(%peer_addr, "node server gone; connection dropped");
    }
}

/// Dials broker `node`'s node fabric port at `addr`: plaintext, or a TLS
/// session handed to the node server as an external stream (ADR 0151),
/// its certificate for `node` when node identity is required (ADR 0155).
async fn dial(
    server: &ActorRef<NodeServerMessage>,
    tls: Option<&PeerTls>,
    addr: SocketAddr,
    node: u64,
) -> Result<(), String> {
    // Plaintext, or TLS's `accept` step of a rolling move (ADR 0162).
    let Some(tls) = tls.filter(|tls| tls.dials_tls()) else {
        return ractor_cluster::client_connect(server, addr)
            .await
            .map_err(|e| e.to_string());
    };
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let local_label = stream.local_addr().ok().map(|a| a.to_string());
    let timeout = Duration::from_millis(DIAL_TIMEOUT_MS);
    let stream = tls
        .connect("fabric", stream, addr, timeout)
        .await
        .map_err(|(reason, detail)| format!("tls handshake {}: {detail}", reason.label()))?;
    let certified = tls.certified_nodes(stream.get_ref().1.peer_certificates());
    tls.admit_node("fabric", "outbound", addr, certified.as_deref(), node)
        .map_err(|detail| format!("tls node identity: {detail}"))?;
    let (reader, writer) = tls_halves(stream);
    let stream = OutboundStream {
        peer_label: addr.to_string(),
        local_label,
        reader,
        writer,
    };
    ractor_cluster::client_connect_external(server, Box::new(stream))
        .await
        .map_err(|e| e.to_string())
}

/// A dialled TLS session as ractor_cluster takes it.
struct OutboundStream {
    peer_label: String,
    local_label: Option<String>,
    reader: PeerRead,
    writer: PeerWrite,
}

impl ractor_cluster::ClusterBidiStream for OutboundStream {
    fn split(self: Box<Self>) -> (ractor_cluster::BoxRead, ractor_cluster::BoxWrite) {
        (self.reader, self.writer)
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer_label.clone())
    }

    fn local_label(&self) -> Option<String> {
        self.local_label.clone()
    }
}

/// Keeps a session to every live broker: on every membership change and
/// every [`RECONCILE_MS`], dials the brokers with a higher node id that have
/// no session yet (the higher one waits to be dialed, so a pair never races
/// two connections). A peer whose dials fail is retried after a per-peer
/// [`Backoff`] (from [`DIAL_BACKOFF_MIN_MS`], doubling up to
/// [`DIAL_BACKOFF_MAX_MS`], jittered); a session, or a new incarnation of the
/// peer, resets it.
async fn dial_loop(fabric: Arc<Fabric>) {
    let mut events = fabric.membership.watch();
    let mut tick = tokio::time::interval(Duration::from_millis(RECONCILE_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // At most one entry per member of the view: entries of peers that have a
    // session or left the view are dropped each round.
    let mut retries: HashMap<u64, DialRetry> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = events.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        #[cfg(feature = "testing")]
        crate::common::faults::trip(fabric.identity.client_addr, "node");
        let server = fabric.node_server.read().clone();
        let Some(server) = server else { continue };
        let connected = match sessions(&server).await {
            Some(connected) => connected,
            None => continue,
        };
        let view = fabric.membership.view();
        retries
            .retain(|node_id, _| view.peers.contains_key(node_id) && !connected.contains(node_id));
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
            let retry = retries
                .entry(member.node_id)
                .or_insert_with(|| DialRetry::new(fabric.node_id, member));
            if retry.incarnation != member.incarnation {
                // The peer restarted: whatever made it fail may be gone.
                *retry = DialRetry::new(fabric.node_id, member);
            }
            if Instant::now() < retry.not_before {
                continue;
            }
            let dial = dial(&server, fabric.tls.as_ref(), addr, member.node_id);
            let failure =
                match tokio::time::timeout(Duration::from_millis(DIAL_TIMEOUT_MS), dial).await {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(error),
                    Err(_) => Some("timed out".to_owned()),
                };
            match failure {
                // `client_connect` returns once the socket is handed to the
                // server; the session authenticates after. Until the next
                // rounds see it, later attempts wait as after a failure.
                None => {
                    info!(peer = member.node_id, %addr, "node fabric connection opened");
                    retry.wait();
                }
                Some(error) => {
                    let delay_ms = retry.wait();
                    debug!(peer = member.node_id, %addr, %error, delay_ms, "node fabric dial failed");
                }
            }
        }
    }
}

/// When a peer without a session may be dialed next.
#[derive(Debug)]
struct DialRetry {
    incarnation: u64,
    backoff: Backoff,
    not_before: Instant,
}

impl DialRetry {
    fn new(node_id: u64, member: &Member) -> DialRetry {
        DialRetry {
            incarnation: member.incarnation,
            backoff: Backoff::new(
                DIAL_BACKOFF_MIN_MS,
                DIAL_BACKOFF_MAX_MS,
                backoff_seed(node_id, member.node_id),
            ),
            not_before: Instant::now(),
        }
    }

    /// Counts one more attempt without a session; returns the wait before
    /// the next.
    fn wait(&mut self) -> u64 {
        let delay_ms = self.backoff.next_delay_ms();
        self.not_before = Instant::now() + Duration::from_millis(delay_ms);
        delay_ms
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
        // The answering broker's judgement, filled in by `cluster status`.
        cluster_port: String::new(),
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
                    Err(reason) => (None, Some(reason.to_string())),
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
/// Decode the answer a peer broker sent to a tree snapshot call: untrusted
/// bytes from the fabric, decoded with the wire message's bounds checked.
pub fn decode_tree_reply(bytes: Vec<u8>) -> Result<wire::TreeSnapshotResponse, WireError> {
    wire::TreeSnapshotResponse::decode(Bytes::from(bytes))
}

/// Whether a remote message, as ractor_cluster hands it to the node actor
/// after decoding its own envelope (a call or a cast, a variant name and
/// argument bytes), is one [`NodeMsg`] accepts. The same decoder the actor
/// runs, exposed for the fuzz target `fabric_message`.
pub fn accepts_remote_message(call: bool, variant: String, args: Vec<u8>) -> bool {
    let message = if call {
        let (tx, _rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
        SerializedMessage::Call {
            variant,
            args,
            reply: RpcReplyPort::from(tx),
            metadata: None,
        }
    } else {
        SerializedMessage::Cast {
            variant,
            args,
            metadata: None,
        }
    };
    <NodeMsg as ractor::Message>::deserialize(message).is_ok()
}

async fn remote_tree(
    node_id: u64,
    timeout: Duration,
) -> Result<wire::TreeSnapshotResponse, TreeAskError> {
    let mut members = ractor::pg::get_scoped_members(&PG_SCOPE.to_owned(), &node_group(node_id));
    if members.is_empty() {
        return Err(TreeAskError::NoSession);
    }
    members.sort_by_key(|cell| !cell.get_id().is_local());
    let mut last = TreeAskError::NoSession;
    for cell in members {
        let actor: ActorRef<NodeMsg> = cell.into();
        last = match actor.call(NodeMsg::TreeSnapshot, Some(timeout)).await {
            Ok(CallResult::Success(bytes)) => match decode_tree_reply(bytes) {
                Ok(tree) if tree.node_id == node_id => return Ok(tree),
                Ok(tree) => {
                    warn!(
                        asked = node_id,
                        answered = tree.node_id,
                        "a tree from the wrong broker"
                    );
                    TreeAskError::WrongBroker {
                        answered: tree.node_id,
                    }
                }
                Err(error) => TreeAskError::Undecodable(error),
            },
            Ok(CallResult::Timeout) => TreeAskError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            },
            Ok(CallResult::SenderError) | Err(_) => TreeAskError::Closed,
        };
    }
    Err(last)
}

/// Why a peer's tree could not be read over the node fabric; its text is
/// the tree's `unreachable` reason.
#[derive(Debug, thiserror::Error)]
enum TreeAskError {
    #[error("no node fabric session to this broker")]
    NoSession,
    #[error("answered as node {answered}")]
    WrongBroker { answered: u64 },
    #[error("undecodable answer: {0}")]
    Undecodable(WireError),
    #[error("no answer within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("the session closed")]
    Closed,
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
