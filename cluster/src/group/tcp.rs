//! The raft transport between brokers: one TCP connection per broker pair,
//! in the Malachi wire framing, multiplexed by group id (decisions §1).
//!
//! A request frame's api key names the message (200 to 299, the block the
//! wire protocol reserves for raft), its payload is the group id (`u64`,
//! big-endian) followed by the message body. The answer is a response
//! frame with the same correlation id: error code `none` and the answer's
//! bytes, or an error code and a UTF-8 reason. Many calls share one
//! connection at once (correlation ids), up to `inflight_max`; a call
//! beyond that waits for a slot within its own timeout.
//!
//! A broken connection fails every call in flight on it as a network
//! error (raft retries), and the next call reconnects, no sooner than a
//! backoff that doubles from `reconnect_backoff_min_ms` up to
//! `reconnect_backoff_max_ms` while connecting keeps failing. Calls during
//! the backoff fail at once as unreachable, so a dead peer costs nothing.
//!
//! The serving side is `TransportServer`: it accepts connections and hands
//! every request to an `RpcService` (the node's groups), answering on the
//! same connection in completion order.
//!
//! Every connection starts with the cookie handshake (`handshake`, ADR
//! 0090): nothing reaches the service from a peer that has not proved it
//! holds the cluster cookie, and the client checks the server the same way.
//! The server bounds what a stranger can cost: at most
//! `raft_connections_max` connections (one past it is closed at accept,
//! without a task, and logged at most once a `refusal_log_interval_ms`),
//! `handshake_timeout_ms` to finish the handshake, `frame_read_timeout_ms`
//! for a frame once its first byte arrived, and frame buffers that grow
//! with the bytes received (`frames`).

use super::backoff::{backoff_delay_ms, backoff_seed};
use super::frames::{FrameReadError, read_frame};
use super::handshake::{ClusterCookie, HandshakeError, client_handshake, serve_handshake_for};
use super::network::{GroupTransport, NetworkFault, RaftRpcKind, TransportError, UnreachableCause};
use super::peer_tls::{
    Accepted, PeerRead, PeerTls, PeerWrite, TlsRefusal, plain_halves, tls_halves,
};
use super::reach::{DialOutcome, PeerReach};
use bytes::{BufMut, Bytes, BytesMut};
use futures::SinkExt;
use malachi_wire::error::ErrorCode;
use malachi_wire::frame::{
    ClientCodec, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES, RequestFrame, ResponseFrame,
    ServerCodec,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::codec::{Decoder, FramedWrite};

/// `append_entries`, `vote`, `install_snapshot` and `pre_vote`, in the raft
/// block of the wire's api keys.
pub fn raft_api_key(kind: RaftRpcKind) -> u16 {
    match kind {
        RaftRpcKind::Vote => 200,
        RaftRpcKind::AppendEntries => 201,
        RaftRpcKind::FullSnapshot => 202,
        RaftRpcKind::PreVote => 203,
        RaftRpcKind::TransferLeader => 204,
    }
}

/// The raft message an api key names, if it names one.
pub fn raft_kind_of(api_key: u16) -> Option<RaftRpcKind> {
    match api_key {
        200 => Some(RaftRpcKind::Vote),
        201 => Some(RaftRpcKind::AppendEntries),
        202 => Some(RaftRpcKind::FullSnapshot),
        203 => Some(RaftRpcKind::PreVote),
        204 => Some(RaftRpcKind::TransferLeader),
        _ => None,
    }
}

/// A metadata command forwarded to the broker that leads its vnode.
pub const FORWARD_PROPOSE_API_KEY: u16 = 210;
/// A metadata read forwarded to the broker that leads its vnode.
pub const FORWARD_READ_API_KEY: u16 = 211;
/// A control read (the ring, a split's export) forwarded to a group's leader.
pub const FORWARD_QUERY_API_KEY: u16 = 214;
/// Asks a broker to open its replica of a vnode: a split creates the
/// child's group on its voters before the ring names it, and a membership
/// change opens a new voter's replica before adding it (ADR 0104).
pub const OPEN_VNODE_API_KEY: u16 = 215;
/// Tells a broker it left a group: its replica closes (ADR 0104).
pub const CLOSE_VNODE_API_KEY: u16 = 218;
/// Tells a broker a newer ring version exists; it fetches that ring.
pub const RING_ANNOUNCE_API_KEY: u16 = 216;
/// A liveness probe (ADR 0101): answered by the transport server itself,
/// whatever service it runs, with its boot id (8 bytes, big-endian): a
/// number drawn at every server start, so a prober tells a restarted peer
/// from one that never went away. Then one byte of flags
/// (`PING_UNFIT_TO_LEAD`); a prober reads an 8-byte answer (an older
/// broker's) as no flags.
pub const PING_API_KEY: u16 = 217;
/// Ping flag: this broker cannot lead its raft groups now (its volume
/// refused a raft log write), so followers elect elsewhere (ADR 0101).
pub const PING_UNFIT_TO_LEAD: u8 = 0b1;

/// Bytes of the group id in front of every request body.
const GROUP_ID_BYTES: usize = 8;

/// The bounds and timings of a `TcpTransport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTransportConfig {
    /// This node's id: logs, and what it proves itself as in the handshake.
    pub node_id: u64,
    /// The secret every broker of the cluster shares (the handshake).
    pub cookie: ClusterCookie,
    /// Calls in flight on one connection at once.
    pub inflight_max: usize,
    /// The largest frame sent or accepted (a snapshot travels in one frame).
    pub frame_bytes_max: usize,
    /// How long a connection attempt may take.
    pub connect_timeout_ms: u64,
    /// The first wait after a failed connection attempt.
    pub reconnect_backoff_min_ms: u64,
    /// The longest wait between connection attempts.
    pub reconnect_backoff_max_ms: u64,
    /// How long the handshake may take once connected. Connection attempts
    /// are serialized, so this bounds how long a peer that accepts but
    /// never answers holds the others up.
    pub handshake_timeout_ms: u64,
    /// How long an answer frame may take to arrive once its first byte did.
    pub frame_read_timeout_ms: u64,
    /// TLS to the peers (ADR 0151): every connection is a TLS session,
    /// the cookie handshake inside it. `None`: plaintext.
    pub tls: Option<PeerTls>,
}

/// The largest raft frame, by default: a snapshot travels in one frame.
pub const RAFT_FRAME_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Connections a `TransportServer` holds at once, by default.
pub const RAFT_CONNECTIONS_MAX_DEFAULT: usize = 256;
/// How long a server waits for a connection's handshake, by default.
pub const RAFT_HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// How long a frame may take once its first byte arrived, by default: a
/// 64 MiB snapshot over a slow link must fit.
pub const RAFT_FRAME_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// At most one log line per this many milliseconds per kind of refusal.
pub const RAFT_REFUSAL_LOG_INTERVAL_MS_DEFAULT: u64 = 1_000;

impl TcpTransportConfig {
    /// Defaults for node `node_id` of the cluster that shares `cookie`.
    pub fn new(node_id: u64, cookie: ClusterCookie) -> TcpTransportConfig {
        TcpTransportConfig {
            node_id,
            cookie,
            inflight_max: 256,
            frame_bytes_max: RAFT_FRAME_BYTES_MAX_DEFAULT,
            connect_timeout_ms: 1_000,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 2_000,
            handshake_timeout_ms: 1_000,
            frame_read_timeout_ms: RAFT_FRAME_READ_TIMEOUT_MS_DEFAULT,
            tls: None,
        }
    }
}

/// The bounds and timings of a `TransportServer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportServerConfig {
    /// This node's id: what it proves itself as in the handshake.
    pub node_id: u64,
    /// The secret every broker of the cluster shares.
    pub cookie: ClusterCookie,
    /// The largest frame accepted.
    pub frame_bytes_max: usize,
    /// Connections held at once, handshaking or authenticated; one more is
    /// closed as soon as it is accepted.
    pub raft_connections_max: usize,
    /// How long a connection may take to complete the handshake.
    pub handshake_timeout_ms: u64,
    /// How long a frame may take once its first byte arrived.
    pub frame_read_timeout_ms: u64,
    /// At most one log line per this interval per kind of refusal.
    pub refusal_log_interval_ms: u64,
    /// TLS (ADR 0151): a connection's TLS handshake, with a client
    /// certificate required, comes before the cookie handshake; a
    /// plaintext or unverified peer is refused. `None`: plaintext.
    pub tls: Option<PeerTls>,
}

impl TransportServerConfig {
    /// Defaults for node `node_id` of the cluster that shares `cookie`.
    pub fn new(node_id: u64, cookie: ClusterCookie) -> TransportServerConfig {
        TransportServerConfig {
            node_id,
            cookie,
            frame_bytes_max: RAFT_FRAME_BYTES_MAX_DEFAULT,
            raft_connections_max: RAFT_CONNECTIONS_MAX_DEFAULT,
            handshake_timeout_ms: RAFT_HANDSHAKE_TIMEOUT_MS_DEFAULT,
            frame_read_timeout_ms: RAFT_FRAME_READ_TIMEOUT_MS_DEFAULT,
            refusal_log_interval_ms: RAFT_REFUSAL_LOG_INTERVAL_MS_DEFAULT,
            tls: None,
        }
    }

    /// The server matching a transport's node, cookie, frame bound and
    /// frame timeout, with the default connection bound and handshake
    /// timeout.
    pub fn for_transport(transport: &TcpTransportConfig) -> TransportServerConfig {
        TransportServerConfig {
            frame_bytes_max: transport.frame_bytes_max,
            frame_read_timeout_ms: transport.frame_read_timeout_ms,
            tls: transport.tls.clone(),
            ..TransportServerConfig::new(transport.node_id, transport.cookie.clone())
        }
    }
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<ResponseFrame>>>>;

/// One live connection to a peer.
#[derive(Debug)]
struct Conn {
    outbox: mpsc::Sender<RequestFrame>,
    pending: Pending,
    slots: Arc<Semaphore>,
    next_correlation: AtomicU32,
    /// Set by either task when it ends: the connection takes no new calls.
    closed: Arc<AtomicBool>,
    tasks: Mutex<JoinSet<()>>,
}

impl Conn {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.outbox.is_closed()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.tasks.get_mut().abort_all();
    }
}

#[derive(Debug, Default)]
struct PeerSlot {
    addr: Option<SocketAddr>,
    conn: Option<Arc<Conn>>,
    /// No connection attempt before this instant.
    retry_at: Option<Instant>,
    /// Failed attempts since the last connection (the backoff's exponent).
    failures: u32,
}

/// The client side of the raft transport: implements `GroupTransport` for
/// every group of this node over one connection per peer.
#[derive(Debug)]
pub struct TcpTransport {
    config: TcpTransportConfig,
    peers: Mutex<BTreeMap<u64, PeerSlot>>,
    /// How raft RPCs to each peer have fared: what decides whether a
    /// failure is worth a warning (openraft's own are filtered out).
    health: Mutex<BTreeMap<u64, PeerHealth>>,
    /// Serializes connection attempts, so concurrent calls to one dead peer
    /// make one attempt, not one each.
    connecting: tokio::sync::Mutex<()>,
    /// Where each dial's outcome is told (ADR 0155), if anywhere.
    reach: Option<Arc<PeerReach>>,
}

impl TcpTransport {
    pub fn new(config: TcpTransportConfig) -> TcpTransport {
        TcpTransport {
            config,
            peers: Mutex::new(BTreeMap::new()),
            health: Mutex::new(BTreeMap::new()),
            connecting: tokio::sync::Mutex::new(()),
            reach: None,
        }
    }

    /// The same transport, telling `reach` how each dial ended (ADR 0155).
    pub fn with_reach(mut self, reach: Arc<PeerReach>) -> TcpTransport {
        self.reach = Some(reach);
        self
    }

    /// Where this transport tells its dials' outcomes, if anywhere.
    pub fn reach(&self) -> Option<&Arc<PeerReach>> {
        self.reach.as_ref()
    }

    fn tell_reach(&self, target: u64, outcome: DialOutcome) {
        if let Some(reach) = &self.reach {
            reach.dialled(target, outcome);
        }
    }

    /// Sets (or changes) a peer's raft address. A changed address drops the
    /// old connection.
    pub fn set_peer(&self, node: u64, addr: SocketAddr) {
        let mut peers = self.peers.lock();
        let slot = peers.entry(node).or_default();
        if slot.addr != Some(addr) {
            slot.addr = Some(addr);
            slot.conn = None;
            slot.retry_at = None;
            slot.failures = 0;
        }
    }

    /// The configuration this transport runs with.
    pub fn config(&self) -> &TcpTransportConfig {
        &self.config
    }

    /// Forgets a peer and closes its connection.
    pub fn remove_peer(&self, node: u64) {
        self.peers.lock().remove(&node);
        if let Some(reach) = &self.reach {
            reach.forget(node);
        }
    }

    /// The peers this transport knows, with their addresses.
    pub fn peers(&self) -> Vec<(u64, SocketAddr)> {
        self.peers
            .lock()
            .iter()
            .filter_map(|(id, slot)| slot.addr.map(|a| (*id, a)))
            .collect()
    }

    async fn connection(&self, target: u64) -> Result<Arc<Conn>, TransportError> {
        let unreachable = |cause: UnreachableCause| TransportError::Unreachable { target, cause };
        if let Some(conn) = self.live(target)? {
            return Ok(conn);
        }
        let _one_attempt = self.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(conn) = self.live(target)? {
            return Ok(conn);
        }
        let addr = {
            let peers = self.peers.lock();
            let slot = peers
                .get(&target)
                .ok_or_else(|| unreachable(UnreachableCause::NoAddress))?;
            if let Some(at) = slot.retry_at
                && Instant::now() < at
            {
                return Err(unreachable(UnreachableCause::BackingOff));
            }
            slot.addr
                .ok_or_else(|| unreachable(UnreachableCause::NoAddress))?
        };
        let connected = tokio::time::timeout(
            Duration::from_millis(self.config.connect_timeout_ms),
            TcpStream::connect(addr),
        )
        .await;
        let mut stream = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(self.failed_connect(target, UnreachableCause::Connect(Arc::new(e))));
            }
            Err(_) => return Err(self.failed_connect(target, UnreachableCause::ConnectTimedOut)),
        };
        let _ = stream.set_nodelay(true);
        let (read_half, write_half) = match &self.config.tls {
            // Plaintext, or TLS's `accept` step of a rolling move (ADR 0162).
            None => {
                self.cookie_handshake(&mut stream, target).await?;
                plain_halves(stream)
            }
            Some(tls) if !tls.dials_tls() => {
                self.cookie_handshake(&mut stream, target).await?;
                plain_halves(stream)
            }
            Some(tls) => {
                // Bounded as the cookie handshake is: dials are serialized,
                // so a silent peer must not hold the others up for long.
                let timeout = Duration::from_millis(self.config.handshake_timeout_ms);
                let mut stream = match tls.connect("cluster", stream, addr, timeout).await {
                    Ok(stream) => stream,
                    Err((reason, detail)) => {
                        let cause = UnreachableCause::Tls {
                            reason: reason.label(),
                            detail,
                        };
                        return Err(self.failed_connect(target, cause));
                    }
                };
                // The server's certificate must be for the node dialled,
                // when node identity is required (ADR 0155).
                let certified = tls.certified_nodes(stream.get_ref().1.peer_certificates());
                if let Err(detail) =
                    tls.admit_node("cluster", "outbound", addr, certified.as_deref(), target)
                {
                    let cause = UnreachableCause::Tls {
                        reason: TlsRefusal::NodeIdentity.label(),
                        detail,
                    };
                    return Err(self.failed_connect(target, cause));
                }
                self.cookie_handshake(&mut stream, target).await?;
                tls_halves(stream)
            }
        };
        let conn = Arc::new(self.spawn_conn(read_half, write_half));
        let mut peers = self.peers.lock();
        let slot = peers.entry(target).or_default();
        slot.conn = Some(Arc::clone(&conn));
        slot.retry_at = None;
        slot.failures = 0;
        drop(peers);
        self.tell_reach(target, DialOutcome::Connected);
        tracing::debug!(node = self.config.node_id, peer = target, %addr, "raft connection open");
        Ok(conn)
    }

    fn live(&self, target: u64) -> Result<Option<Arc<Conn>>, TransportError> {
        let mut peers = self.peers.lock();
        let Some(slot) = peers.get_mut(&target) else {
            return Err(TransportError::Unreachable {
                target,
                cause: UnreachableCause::NoAddress,
            });
        };
        match &slot.conn {
            Some(conn) if !conn.is_closed() => Ok(Some(Arc::clone(conn))),
            Some(_) => {
                slot.conn = None;
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// The client's side of the cookie handshake, within its timeout.
    async fn cookie_handshake<S>(&self, stream: &mut S, target: u64) -> Result<(), TransportError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let shaken = tokio::time::timeout(
            Duration::from_millis(self.config.handshake_timeout_ms),
            client_handshake(
                stream,
                &self.config.cookie,
                self.config.node_id,
                Some(target),
            ),
        )
        .await;
        match shaken {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                let cause = match e {
                    // A TLS alert after the client's side of a TLS 1.3
                    // handshake finished: the server refused our
                    // certificate (another CA, or another node's, ADR 0155).
                    HandshakeError::Io(io) if is_tls_alert(&io) => UnreachableCause::Tls {
                        reason: TlsRefusal::Refused.label(),
                        detail: io.to_string(),
                    },
                    HandshakeError::Io(_) => UnreachableCause::HandshakeClosed(Arc::new(e)),
                    e => UnreachableCause::Handshake(Arc::new(e)),
                };
                Err(self.failed_connect(target, cause))
            }
            Err(_) => Err(self.failed_connect(target, UnreachableCause::HandshakeTimedOut)),
        }
    }

    fn failed_connect(&self, target: u64, cause: UnreachableCause) -> TransportError {
        self.tell_reach(target, dial_outcome(&cause));
        let mut peers = self.peers.lock();
        if let Some(slot) = peers.get_mut(&target) {
            let backoff_ms = backoff_delay_ms(
                self.config.reconnect_backoff_min_ms,
                self.config.reconnect_backoff_max_ms,
                slot.failures,
                backoff_seed(self.config.node_id, target),
            );
            slot.failures = slot.failures.saturating_add(1);
            slot.retry_at = Some(Instant::now() + Duration::from_millis(backoff_ms));
            tracing::debug!(node = self.config.node_id, peer = target, backoff_ms, error = %cause, "raft connect failed");
        }
        TransportError::Unreachable { target, cause }
    }

    fn spawn_conn(&self, mut read_half: PeerRead, write_half: PeerWrite) -> Conn {
        let mut sink = FramedWrite::new(write_half, ClientCodec::new(self.config.frame_bytes_max));
        let frame_bytes_max = self.config.frame_bytes_max;
        let read_timeout = Duration::from_millis(self.config.frame_read_timeout_ms);
        let (outbox, mut inbox) = mpsc::channel::<RequestFrame>(self.config.inflight_max.max(1));
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let mut tasks = JoinSet::new();
        let node = self.config.node_id;
        let closed = Arc::new(AtomicBool::new(false));
        let writer_closed = Arc::clone(&closed);
        tasks.spawn(async move {
            while let Some(frame) = inbox.recv().await {
                if let Err(e) = sink.send(frame).await {
                    tracing::debug!(node, error = %e, "raft connection write failed");
                    break;
                }
            }
            writer_closed.store(true, Ordering::SeqCst);
        });
        let reader_pending = Arc::clone(&pending);
        let reader_closed = Arc::clone(&closed);
        tasks.spawn(async move {
            let mut codec = ClientCodec::new(frame_bytes_max);
            loop {
                match next_frame(
                    &mut read_half,
                    &mut codec,
                    RESPONSE_HEADER_BYTES,
                    frame_bytes_max,
                    read_timeout,
                )
                .await
                {
                    Ok(Some(frame)) => {
                        let waiter = reader_pending.lock().remove(&frame.correlation_id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(frame);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(node, error = %e, "raft connection read failed");
                        break;
                    }
                }
            }
            // Closed first, then cleared: a call that registers after the
            // clear sees the flag (see `call_raw`), so none waits for nothing.
            reader_closed.store(true, Ordering::SeqCst);
            reader_pending.lock().clear();
        });
        Conn {
            outbox,
            pending,
            slots: Arc::new(Semaphore::new(self.config.inflight_max.max(1))),
            next_correlation: AtomicU32::new(1),
            closed,
            tasks: Mutex::new(tasks),
        }
    }

    fn drop_conn(&self, target: u64, conn: &Arc<Conn>) {
        let mut peers = self.peers.lock();
        if let Some(slot) = peers.get_mut(&target)
            && slot.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn))
        {
            slot.conn = None;
        }
    }

    /// Sends one request for `group_id` to `target` and returns the answer's
    /// bytes. Any api key may be used; the raft messages use
    /// `raft_api_key`, forwarded metadata requests their own keys.
    pub async fn call_raw(
        &self,
        target: u64,
        api_key: u16,
        group_id: u64,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<Bytes, TransportError> {
        self.call_raw_parts(target, api_key, group_id, &[body], timeout_ms)
            .await
    }

    /// [`call_raw`](Self::call_raw) with a body given in parts, written
    /// one after another into the request (so a large part, such as
    /// replica-append frames, is copied once, not once per layer).
    pub async fn call_raw_parts(
        &self,
        target: u64,
        api_key: u16,
        group_id: u64,
        body: &[&[u8]],
        timeout_ms: u64,
    ) -> Result<Bytes, TransportError> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let network = |fault: NetworkFault| TransportError::Network { target, fault };
        let conn = tokio::time::timeout_at(deadline, self.connection(target))
            .await
            .map_err(|_| TransportError::Unreachable {
                target,
                cause: UnreachableCause::ConnectTimedOut,
            })??;
        let _slot = tokio::time::timeout_at(deadline, Arc::clone(&conn.slots).acquire_owned())
            .await
            .map_err(|_| network(NetworkFault::NoSlot))?
            .map_err(|_| network(NetworkFault::Closed))?;
        let correlation_id = conn.next_correlation.fetch_add(1, Ordering::Relaxed);
        let body_bytes: usize = body.iter().map(|part| part.len()).sum();
        let mut payload = BytesMut::with_capacity(GROUP_ID_BYTES + body_bytes);
        payload.put_u64(group_id);
        for part in body {
            payload.put_slice(part);
        }
        let (answer_tx, answer_rx) = oneshot::channel();
        conn.pending.lock().insert(correlation_id, answer_tx);
        if conn.is_closed() {
            conn.pending.lock().remove(&correlation_id);
            self.drop_conn(target, &conn);
            return Err(network(NetworkFault::Closed));
        }
        let frame = RequestFrame {
            api_key,
            correlation_id,
            payload: payload.freeze(),
        };
        let sent = tokio::time::timeout_at(deadline, conn.outbox.send(frame)).await;
        if !matches!(sent, Ok(Ok(()))) {
            conn.pending.lock().remove(&correlation_id);
            self.drop_conn(target, &conn);
            return Err(network(NetworkFault::ClosedBeforeSent));
        }
        match tokio::time::timeout_at(deadline, answer_rx).await {
            Ok(Ok(frame)) if frame.error_code == ErrorCode::None => Ok(frame.payload),
            Ok(Ok(frame)) => Err(TransportError::Remote {
                target,
                code: frame.error_code,
                peer_message: String::from_utf8_lossy(&frame.payload).into_owned(),
            }),
            Ok(Err(_)) => {
                self.drop_conn(target, &conn);
                Err(network(NetworkFault::ClosedAwaitingAnswer))
            }
            Err(_) => {
                conn.pending.lock().remove(&correlation_id);
                Err(network(NetworkFault::NoAnswer { timeout_ms }))
            }
        }
    }
}

#[async_trait::async_trait]
impl GroupTransport for TcpTransport {
    async fn call(
        &self,
        group_id: u64,
        target: u64,
        kind: RaftRpcKind,
        body: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Vec<u8>, TransportError> {
        let answer = self
            .call_raw(target, raft_api_key(kind), group_id, &body, timeout_ms)
            .await
            .map(|b| b.to_vec());
        let now = Instant::now();
        let verdict = {
            let mut health = self.health.lock();
            let peer = health.entry(target).or_default();
            match &answer {
                Ok(_) => peer.succeeded(),
                Err(_) => peer.failed(now),
            }
        };
        let node = self.config.node_id;
        match (verdict, &answer) {
            (
                Verdict::Warn {
                    failures,
                    failing_ms,
                },
                Err(error),
            ) => tracing::warn!(
                node,
                peer = target,
                failures,
                failing_ms,
                %error,
                "raft calls to a peer keep failing"
            ),
            (Verdict::Recovered { failures }, _) => tracing::info!(
                node,
                peer = target,
                failures,
                "raft calls to a peer succeed again"
            ),
            (_, Err(error)) => {
                tracing::debug!(node, peer = target, group_id, %error, "raft call failed")
            }
            _ => {}
        }
        answer
    }
}

/// Whether a read failed on a TLS alert the peer sent (rustls reports it
/// as an i/o error wrapping its own).
fn is_tls_alert(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::AlertReceived(_)))
}

/// What a failed dial says of its peer (ADR 0155): refused when the peer
/// proved it is not one of ours or refused us (TLS, the cookie's proof,
/// another node's id), failed otherwise.
fn dial_outcome(cause: &UnreachableCause) -> DialOutcome {
    match cause {
        UnreachableCause::Tls { reason, .. }
            if *reason == TlsRefusal::Refused.label()
                || *reason == TlsRefusal::NodeIdentity.label() =>
        {
            DialOutcome::Refused
        }
        UnreachableCause::Handshake(e) => match **e {
            HandshakeError::BadProof
            | HandshakeError::ProofRefused
            | HandshakeError::WrongNode { .. }
            | HandshakeError::NodeRefused { .. }
            | HandshakeError::NotAHandshake => DialOutcome::Refused,
            HandshakeError::Io(_) | HandshakeError::Randomness(_) => DialOutcome::Failed,
        },
        _ => DialOutcome::Failed,
    }
}

/// A peer's raft calls fail for this long, without one success, before
/// the failure is logged as a warning: shorter gaps are a broker starting
/// (no address gossiped yet), an election's race, or a loaded machine, all
/// of which raft rides out.
pub const PEER_FAILING_WARN_MS: u64 = 5_000;
/// At most one warning per peer in this long while it stays down.
pub const PEER_WARN_INTERVAL_MS: u64 = 30_000;

/// What one raft call's outcome says about its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing worth more than a debug line.
    Quiet,
    /// Failing without a success for at least [`PEER_FAILING_WARN_MS`].
    Warn { failures: u64, failing_ms: u64 },
    /// A success after a warning.
    Recovered { failures: u64 },
}

/// How raft calls to one peer have fared since its last success.
#[derive(Debug, Default, Clone)]
pub(crate) struct PeerHealth {
    failing_since: Option<Instant>,
    failures: u64,
    warned_at: Option<Instant>,
}

impl PeerHealth {
    pub(crate) fn failed(&mut self, now: Instant) -> Verdict {
        self.failures += 1;
        let since = *self.failing_since.get_or_insert(now);
        let failing_ms =
            u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX);
        let quiet_since_warning = self.warned_at.is_none_or(|at| {
            now.saturating_duration_since(at) >= Duration::from_millis(PEER_WARN_INTERVAL_MS)
        });
        if failing_ms >= PEER_FAILING_WARN_MS && quiet_since_warning {
            self.warned_at = Some(now);
            Verdict::Warn {
                failures: self.failures,
                failing_ms,
            }
        } else {
            Verdict::Quiet
        }
    }

    pub(crate) fn succeeded(&mut self) -> Verdict {
        let verdict = if self.warned_at.is_some() {
            Verdict::Recovered {
                failures: self.failures,
            }
        } else {
            Verdict::Quiet
        };
        *self = PeerHealth::default();
        verdict
    }
}

/// What serves the requests a `TransportServer` receives: this node's groups.
#[async_trait::async_trait]
pub trait RpcService: Send + Sync + std::fmt::Debug + 'static {
    /// Answers one request; an `Err` travels back as the error code
    /// ([`RpcError::code`]) and reason (its message) of the response.
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError>;

    /// Whether this broker cannot lead raft groups now (a full volume
    /// stopped a replica): the ping says so, and peers elect elsewhere.
    fn unfit_to_lead(&self) -> bool {
        false
    }
}

/// Why the raft port refused a request. On the wire it is a response frame
/// whose error code is [`RpcError::code`] and whose payload is the message
/// as UTF-8 (the encoding both ends of this build read); `code` is the one
/// place a refusal becomes a wire code. Messages are lowercase.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The payload does not start with the 8-byte group id.
    #[error("the payload is shorter than a group id")]
    ShortPayload { payload_bytes: usize },
    /// The api key is not one of the raft messages (200 to 203).
    #[error("api key {api_key} is not a raft message")]
    NotRaft { api_key: u16 },
    /// The api key is not one of the forwarded metadata requests.
    #[error("api key {api_key} is not a forwarded metadata request")]
    NotForwarded { api_key: u16 },
    /// This node hosts no replica of the group.
    #[error("group {group_id} is not hosted here")]
    NotHosted { group_id: u64 },
    /// The request body could not be decoded as what its api key names.
    #[error("cannot decode {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The answer could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The group refused or failed the request.
    #[error(transparent)]
    Group(#[from] super::GroupError),
}

impl RpcError {
    /// The wire code of this refusal.
    pub fn code(&self) -> ErrorCode {
        use super::GroupError;
        match self {
            RpcError::ShortPayload { .. } | RpcError::Decode { .. } => ErrorCode::InvalidRequest,
            RpcError::NotRaft { .. } | RpcError::NotForwarded { .. } => ErrorCode::UnsupportedApi,
            RpcError::NotHosted { .. } => ErrorCode::NotLeader,
            RpcError::Encode { .. } => ErrorCode::UnknownServerError,
            RpcError::Group(e) => match e {
                GroupError::Stopped => ErrorCode::ShuttingDown,
                GroupError::Codec { .. } => ErrorCode::InvalidRequest,
                GroupError::NotLeader { .. } => ErrorCode::NotLeader,
                // Appended, then dropped by a leader change: it may commit.
                GroupError::Discarded { .. } => ErrorCode::OutcomeUnknown,
                GroupError::Timeout => ErrorCode::Timeout,
                GroupError::Io { .. }
                | GroupError::Storage { .. }
                | GroupError::Fatal { .. }
                | GroupError::Config { .. }
                | GroupError::Raft { .. } => ErrorCode::UnknownServerError,
            },
        }
    }

    /// The response frame that carries this refusal to `correlation_id`.
    pub fn to_frame(&self, correlation_id: u32) -> ResponseFrame {
        ResponseFrame {
            correlation_id,
            error_code: self.code(),
            payload: Bytes::from(self.to_string().into_bytes()),
        }
    }
}

/// What a `TransportServer` refused and dropped, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportServerStats {
    /// Connections open now (handshaking or authenticated).
    pub connections_open: u64,
    /// Connections authenticated since start.
    pub authenticated: u64,
    /// Connections closed at accept: `raft_connections_max` were open.
    pub refused_over_limit: u64,
    /// Connections closed for a failed handshake (a wrong cookie, garbage,
    /// a handshake not finished in time).
    pub refused_handshake: u64,
    /// Connections closed for a failed TLS handshake (ADR 0151): plaintext,
    /// no client certificate or one the cluster CA did not sign, a timeout.
    pub refused_tls: u64,
    /// Authenticated connections dropped for a frame that did not arrive
    /// within `frame_read_timeout_ms`, or a frame over the bound.
    pub dropped_bad_frame: u64,
    /// Log lines written about refusals (at most one per kind per
    /// `refusal_log_interval_ms`).
    pub refusals_logged: u64,
    /// Requests answered (raft messages and forwarded requests), liveness
    /// probes not counted.
    pub requests_served: u64,
    /// Liveness probes answered (ADR 0101).
    pub pings_served: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections_open: AtomicU64,
    authenticated: AtomicU64,
    refused_over_limit: AtomicU64,
    refused_handshake: AtomicU64,
    refused_tls: AtomicU64,
    dropped_bad_frame: AtomicU64,
    refusals_logged: AtomicU64,
    requests_served: AtomicU64,
    pings_served: AtomicU64,
}

/// Logs one kind of refusal at most once per interval, counting the ones
/// it kept quiet about, so a flood costs one line a second, not one each.
#[derive(Debug)]
struct RefusalLog {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RefusalLog {
    fn new(interval_ms: u64) -> RefusalLog {
        RefusalLog {
            interval: Duration::from_millis(interval_ms),
            last: None,
            suppressed: 0,
        }
    }

    /// Whether to log now, and how many refusals went unlogged before.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.interval)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[derive(Debug)]
struct ServerShared {
    config: TransportServerConfig,
    service: Arc<dyn RpcService>,
    /// Drawn at start; the answer to every ping.
    boot_id: u64,
    counters: Counters,
    handshake_log: Mutex<RefusalLog>,
    frame_log: Mutex<RefusalLog>,
}

/// Accepts raft connections and serves them until shut down.
#[derive(Debug)]
pub struct TransportServer {
    addr: SocketAddr,
    shared: Arc<ServerShared>,
    tasks: Mutex<Option<JoinSet<()>>>,
}

/// Requests served at once on one connection, beyond which the server stops
/// reading from it (TCP flow control then holds the peer back).
const SERVER_INFLIGHT_PER_CONNECTION_MAX: usize = 256;

impl TransportServer {
    /// Starts serving on `listener`.
    pub fn start(
        listener: TcpListener,
        service: Arc<dyn RpcService>,
        config: TransportServerConfig,
    ) -> Result<TransportServer, std::io::Error> {
        let addr = listener.local_addr()?;
        let mut boot = [0u8; 8];
        getrandom::fill(&mut boot).map_err(|e| std::io::Error::other(e.to_string()))?;
        let shared = Arc::new(ServerShared {
            boot_id: u64::from_be_bytes(boot),
            handshake_log: Mutex::new(RefusalLog::new(config.refusal_log_interval_ms)),
            frame_log: Mutex::new(RefusalLog::new(config.refusal_log_interval_ms)),
            config,
            service,
            counters: Counters::default(),
        });
        let mut tasks = JoinSet::new();
        let accept_shared = Arc::clone(&shared);
        tasks.spawn(accept_loop(listener, accept_shared));
        Ok(TransportServer {
            addr,
            shared,
            tasks: Mutex::new(Some(tasks)),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server refused and dropped so far.
    pub fn stats(&self) -> TransportServerStats {
        let c = &self.shared.counters;
        TransportServerStats {
            connections_open: c.connections_open.load(Ordering::SeqCst),
            authenticated: c.authenticated.load(Ordering::SeqCst),
            refused_over_limit: c.refused_over_limit.load(Ordering::SeqCst),
            refused_handshake: c.refused_handshake.load(Ordering::SeqCst),
            refused_tls: c.refused_tls.load(Ordering::SeqCst),
            dropped_bad_frame: c.dropped_bad_frame.load(Ordering::SeqCst),
            refusals_logged: c.refusals_logged.load(Ordering::SeqCst),
            requests_served: c.requests_served.load(Ordering::SeqCst),
            pings_served: c.pings_served.load(Ordering::SeqCst),
        }
    }

    /// Stops accepting and closes every connection (the accept task owns the
    /// connection tasks, so aborting it aborts them all).
    pub async fn shutdown(&self) {
        let tasks = self.tasks.lock().take();
        if let Some(mut tasks) = tasks {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}

impl Drop for TransportServer {
    fn drop(&mut self) {
        if let Some(tasks) = self.tasks.get_mut().as_mut() {
            tasks.abort_all();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<ServerShared>) {
    let slots = Arc::new(Semaphore::new(shared.config.raft_connections_max));
    let mut over_limit_log = RefusalLog::new(shared.config.refusal_log_interval_ms);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                        // Closed here, on the accept task: a flood spawns nothing.
                        drop(stream);
                        shared.counters.refused_over_limit.fetch_add(1, Ordering::SeqCst);
                        if let Some(suppressed) = over_limit_log.admit(Instant::now()) {
                            shared.counters.refusals_logged.fetch_add(1, Ordering::SeqCst);
                            tracing::warn!(
                                node = shared.config.node_id,
                                %peer,
                                reason = "connection limit",
                                raft_connections_max = shared.config.raft_connections_max,
                                refused_unlogged = suppressed,
                                "raft connection refused"
                            );
                        }
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(stream, peer, Arc::clone(&shared), slot));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "raft accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Logs a refused or dropped connection through `log`'s rate limit.
fn log_refusal(shared: &ServerShared, log: &Mutex<RefusalLog>, peer: SocketAddr, reason: &str) {
    let admitted = log.lock().admit(Instant::now());
    if let Some(suppressed) = admitted {
        shared
            .counters
            .refusals_logged
            .fetch_add(1, Ordering::SeqCst);
        tracing::warn!(
            node = shared.config.node_id,
            %peer,
            reason,
            refused_unlogged = suppressed,
            "raft connection refused"
        );
    }
}

/// Reads one frame and decodes it with `codec`; `Ok(None)` at a clean end.
async fn next_frame<R, C>(
    reader: &mut R,
    codec: &mut C,
    header_bytes: usize,
    frame_bytes_max: usize,
    read_timeout: Duration,
) -> Result<Option<C::Item>, FrameReadError>
where
    R: AsyncRead + Unpin,
    C: Decoder<Error = malachi_wire::error::WireError>,
{
    let mut buf = Vec::new();
    if !read_frame(
        reader,
        &mut buf,
        header_bytes,
        frame_bytes_max,
        read_timeout,
    )
    .await?
    {
        return Ok(None);
    }
    // Unique, so neither conversion copies.
    let mut whole = BytesMut::from(Bytes::from(buf));
    match codec.decode(&mut whole) {
        Ok(Some(frame)) => Ok(Some(frame)),
        Ok(None) => Err(FrameReadError::Truncated),
        Err(e) => Err(FrameReadError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.to_string(),
        ))),
    }
}

/// Bounds `raft_connections_max` by holding `_slot` until it ends.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<ServerShared>,
    _slot: OwnedSemaphorePermit,
) {
    let _open = OpenConnection::count(&shared.counters.connections_open);
    let accepted = match &shared.config.tls {
        None => Accepted::Plain(stream),
        // A refusal, and a plaintext peer taken in a step of a rolling
        // move (ADR 0162), are counted by the TLS's observer.
        Some(tls) => match tls.accept_either("cluster", stream, peer).await {
            Ok(accepted) => accepted,
            Err(_) => {
                shared.counters.refused_tls.fetch_add(1, Ordering::SeqCst);
                return;
            }
        },
    };
    let (read_half, write_half, client) = match accepted {
        Accepted::Plain(mut stream) => {
            let Some(client) = authenticate(&mut stream, peer, &shared, None).await else {
                return;
            };
            let (read_half, write_half) = plain_halves(stream);
            (read_half, write_half, client)
        }
        Accepted::Tls(mut stream) => {
            // With node identity required, the client must prove the
            // cookie as a node its certificate is for (ADR 0155).
            let certified = shared
                .config
                .tls
                .as_ref()
                .and_then(|tls| tls.certified_nodes(stream.get_ref().1.peer_certificates()));
            let Some(client) = authenticate(&mut stream, peer, &shared, certified.as_deref()).await
            else {
                return;
            };
            let (read_half, write_half) = tls_halves(stream);
            (read_half, write_half, client)
        }
    };
    serve_requests(read_half, write_half, peer, client, &shared).await;
}

/// Counts a connection in `connections_open` for as long as it lives.
struct OpenConnection<'a>(&'a AtomicU64);

impl<'a> OpenConnection<'a> {
    fn count(open: &'a AtomicU64) -> OpenConnection<'a> {
        open.fetch_add(1, Ordering::SeqCst);
        OpenConnection(open)
    }
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs the server's side of the handshake within `handshake_timeout_ms`
/// and names the client node, or counts and logs the refusal (a bad
/// cookie, not a handshake, a timeout, a node its certificate is not for
/// when `certified` lists them): `None` closes the connection.
async fn authenticate<S>(
    stream: &mut S,
    peer: SocketAddr,
    shared: &ServerShared,
    certified: Option<&[u64]>,
) -> Option<u64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let counters = &shared.counters;
    let config = &shared.config;
    let admit = |client: u64| certified.is_none_or(|nodes| nodes.contains(&client));
    let shaken = tokio::time::timeout(
        Duration::from_millis(config.handshake_timeout_ms),
        serve_handshake_for(stream, &config.cookie, config.node_id, &admit),
    )
    .await;
    let client = match shaken {
        Ok(Ok(client)) => client,
        Ok(Err(HandshakeError::NodeRefused { client })) => {
            counters.refused_tls.fetch_add(1, Ordering::SeqCst);
            if let Some(tls) = &config.tls {
                // Counted and logged by the TLS's observer.
                let _ = tls.admit_node("cluster", "inbound", peer, certified, client);
            }
            return None;
        }
        Ok(Err(e)) => {
            counters.refused_handshake.fetch_add(1, Ordering::SeqCst);
            let reason = match e {
                HandshakeError::BadProof => "bad cookie proof".to_owned(),
                HandshakeError::NotAHandshake => "not a raft handshake".to_owned(),
                e => e.to_string(),
            };
            log_refusal(shared, &shared.handshake_log, peer, &reason);
            return None;
        }
        Err(_) => {
            counters.refused_handshake.fetch_add(1, Ordering::SeqCst);
            log_refusal(shared, &shared.handshake_log, peer, "handshake timed out");
            return None;
        }
    };
    counters.authenticated.fetch_add(1, Ordering::SeqCst);
    tracing::debug!(node = config.node_id, %peer, client, "raft connection authenticated");
    Some(client)
}

/// Serves an authenticated connection's requests until it ends: each is
/// answered in a task of its own, at most
/// `SERVER_INFLIGHT_PER_CONNECTION_MAX` at once (reading waits for a
/// slot), and one writer sends the answers in the order they finish.
/// Ending aborts the answers still running and the writer.
async fn serve_requests(
    mut source: PeerRead,
    sink: PeerWrite,
    peer: SocketAddr,
    client: u64,
    shared: &Arc<ServerShared>,
) {
    let frame_bytes_max = shared.config.frame_bytes_max;
    let sink = FramedWrite::new(sink, ServerCodec::new(frame_bytes_max));
    let (answers, outbox) = mpsc::channel::<ResponseFrame>(SERVER_INFLIGHT_PER_CONNECTION_MAX);
    let slots = Arc::new(Semaphore::new(SERVER_INFLIGHT_PER_CONNECTION_MAX));
    let mut work = JoinSet::new();
    let writer = tokio::spawn(write_answers(sink, outbox));
    let mut codec = ServerCodec::new(frame_bytes_max);
    while let Some(frame) = read_request(&mut source, &mut codec, peer, client, shared).await {
        if frame.api_key == PING_API_KEY {
            shared.counters.pings_served.fetch_add(1, Ordering::Relaxed);
        } else {
            shared
                .counters
                .requests_served
                .fetch_add(1, Ordering::Relaxed);
        }
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let service = Arc::clone(&shared.service);
        let boot_id = shared.boot_id;
        let answers = answers.clone();
        work.spawn(async move {
            let response = answer(service.as_ref(), frame, boot_id).await;
            let _ = answers.send(response).await;
            drop(slot);
        });
        while work.try_join_next().is_some() {}
    }
    work.abort_all();
    writer.abort();
}

/// Sends a connection's answers until every sender is gone or the
/// connection fails.
async fn write_answers(
    mut sink: FramedWrite<PeerWrite, ServerCodec>,
    mut outbox: mpsc::Receiver<ResponseFrame>,
) {
    while let Some(frame) = outbox.recv().await {
        if sink.send(frame).await.is_err() {
            break;
        }
    }
}

/// Reads a connection's next request within `frame_read_timeout_ms`.
/// `None` ends the connection: at a clean end, on an I/O failure (logged
/// at debug), or on a bad frame (counted, and logged as a refusal).
async fn read_request(
    source: &mut PeerRead,
    codec: &mut ServerCodec,
    peer: SocketAddr,
    client: u64,
    shared: &ServerShared,
) -> Option<RequestFrame> {
    let next = next_frame(
        source,
        codec,
        REQUEST_HEADER_BYTES,
        shared.config.frame_bytes_max,
        Duration::from_millis(shared.config.frame_read_timeout_ms),
    )
    .await;
    match next {
        Ok(Some(frame)) => Some(frame),
        Ok(None) => None,
        Err(FrameReadError::Io(e)) if e.kind() != std::io::ErrorKind::InvalidData => {
            tracing::debug!(%peer, client, error = %e, "raft connection closed");
            None
        }
        Err(e) => {
            shared
                .counters
                .dropped_bad_frame
                .fetch_add(1, Ordering::SeqCst);
            log_refusal(shared, &shared.frame_log, peer, &e.to_string());
            None
        }
    }
}

/// A ping's answer: the boot id (8 bytes, big-endian), then the flags byte.
fn ping_payload(boot_id: u64, unfit_to_lead: bool) -> Vec<u8> {
    let mut payload = boot_id.to_be_bytes().to_vec();
    payload.push(if unfit_to_lead { PING_UNFIT_TO_LEAD } else { 0 });
    payload
}

async fn answer(service: &dyn RpcService, frame: RequestFrame, boot_id: u64) -> ResponseFrame {
    let correlation_id = frame.correlation_id;
    if frame.api_key == PING_API_KEY {
        return ResponseFrame {
            correlation_id,
            error_code: ErrorCode::None,
            payload: Bytes::from(ping_payload(boot_id, service.unfit_to_lead())),
        };
    }
    if frame.payload.len() < GROUP_ID_BYTES {
        return RpcError::ShortPayload {
            payload_bytes: frame.payload.len(),
        }
        .to_frame(correlation_id);
    }
    let mut id = [0u8; GROUP_ID_BYTES];
    id.copy_from_slice(&frame.payload[..GROUP_ID_BYTES]);
    let group_id = u64::from_be_bytes(id);
    let body = frame.payload.slice(GROUP_ID_BYTES..);
    match service.serve(frame.api_key, group_id, body).await {
        Ok(bytes) => ResponseFrame {
            correlation_id,
            error_code: ErrorCode::None,
            payload: Bytes::from(bytes),
        },
        Err(e) => e.to_frame(correlation_id),
    }
}

/// The groups this node hosts, by group id: serves their raft messages.
/// Requests for a group the node does not host are refused, so a sender
/// with an outdated placement learns it at once.
#[derive(Debug, Default)]
pub struct GroupRegistry {
    groups: parking_lot::RwLock<BTreeMap<u64, super::MetadataGroup>>,
}

impl GroupRegistry {
    pub fn new() -> GroupRegistry {
        GroupRegistry::default()
    }

    /// Hosts `group` under its id, replacing any previous one.
    pub fn insert(&self, group: super::MetadataGroup) {
        let id = group.group_id();
        self.groups.write().insert(id, group);
    }

    /// Stops hosting a group and returns it.
    pub fn remove(&self, group_id: u64) -> Option<super::MetadataGroup> {
        self.groups.write().remove(&group_id)
    }

    pub fn get(&self, group_id: u64) -> Option<super::MetadataGroup> {
        self.groups.read().get(&group_id).cloned()
    }

    /// Every hosted group, by id.
    pub fn all(&self) -> Vec<super::MetadataGroup> {
        self.groups.read().values().cloned().collect()
    }

    /// Serves a raft message (api keys 200 to 203) for a hosted group.
    pub async fn serve_raft(
        &self,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Result<Vec<u8>, RpcError> {
        let Some(kind) = raft_kind_of(api_key) else {
            return Err(RpcError::NotRaft { api_key });
        };
        let Some(group) = self.get(group_id) else {
            return Err(RpcError::NotHosted { group_id });
        };
        Ok(group.handle_rpc(kind, body).await?)
    }
}

#[async_trait::async_trait]
impl RpcService for GroupRegistry {
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError> {
        self.serve_raft(api_key, group_id, &body).await
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    #[test]
    fn a_peer_failing_briefly_stays_quiet_and_one_failing_for_long_warns_once_then_recovers() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut peer = PeerHealth::default();
        // A start-up's or an election's failures: no warning.
        assert_eq!(peer.failed(at(0)), Verdict::Quiet);
        assert_eq!(peer.failed(at(4_000)), Verdict::Quiet);
        assert_eq!(peer.succeeded(), Verdict::Quiet);
        // A success restarts the clock.
        assert_eq!(peer.failed(at(6_000)), Verdict::Quiet);
        assert_eq!(
            peer.failed(at(11_000)),
            Verdict::Warn {
                failures: 2,
                failing_ms: 5_000
            }
        );
        // Once per interval while it stays down.
        assert_eq!(peer.failed(at(12_000)), Verdict::Quiet);
        assert_eq!(
            peer.failed(at(41_000)),
            Verdict::Warn {
                failures: 4,
                failing_ms: 35_000
            }
        );
        assert_eq!(peer.succeeded(), Verdict::Recovered { failures: 4 });
        assert_eq!(peer.succeeded(), Verdict::Quiet);
    }
}

#[cfg(test)]
mod ping_tests {
    use super::*;
    use crate::group::liveness::PingAnswer;

    #[test]
    fn a_pings_answer_is_its_boot_id_then_its_flags() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let fit = ping_payload(0x0102_0304_0506_0708, false);
        let unfit = ping_payload(0x0102_0304_0506_0708, true);
        insta::assert_snapshot!(format!("{}\n{}", hex(&fit), hex(&unfit)), @r"
        010203040506070800
        010203040506070801
        ");
        assert!(PingAnswer::decode(&unfit).unfit_to_lead);
        assert!(!PingAnswer::decode(&fit).unfit_to_lead);
    }
}
