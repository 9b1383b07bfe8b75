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

use super::network::{GroupTransport, RaftRpcKind, TransportError};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use malachi_wire::error::ErrorCode;
use malachi_wire::frame::{ClientCodec, RequestFrame, ResponseFrame, ServerCodec};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::codec::Framed;

/// `append_entries`, `vote`, `install_snapshot` and `pre_vote`, in the raft
/// block of the wire's api keys.
pub fn raft_api_key(kind: RaftRpcKind) -> u16 {
    match kind {
        RaftRpcKind::Vote => 200,
        RaftRpcKind::AppendEntries => 201,
        RaftRpcKind::FullSnapshot => 202,
        RaftRpcKind::PreVote => 203,
    }
}

/// The raft message an api key names, if it names one.
pub fn raft_kind_of(api_key: u16) -> Option<RaftRpcKind> {
    match api_key {
        200 => Some(RaftRpcKind::Vote),
        201 => Some(RaftRpcKind::AppendEntries),
        202 => Some(RaftRpcKind::FullSnapshot),
        203 => Some(RaftRpcKind::PreVote),
        _ => None,
    }
}

/// A metadata command forwarded to the broker that leads its vnode.
pub const FORWARD_PROPOSE_API_KEY: u16 = 210;
/// A metadata read forwarded to the broker that leads its vnode.
pub const FORWARD_READ_API_KEY: u16 = 211;
/// A control read (the ring, a split's export) forwarded to a group's leader.
pub const FORWARD_QUERY_API_KEY: u16 = 214;
/// Asks a broker to open (and initialize) its replica of a new vnode: a
/// split creates the child's group on its voters before the ring names it.
pub const OPEN_VNODE_API_KEY: u16 = 215;
/// Tells a broker a newer ring version exists; it fetches that ring.
pub const RING_ANNOUNCE_API_KEY: u16 = 216;

/// Bytes of the group id in front of every request body.
const GROUP_ID_BYTES: usize = 8;

/// The bounds and timings of a `TcpTransport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTransportConfig {
    /// This node's id, for logs.
    pub node_id: u64,
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
}

impl TcpTransportConfig {
    /// Defaults for node `node_id`.
    pub fn new(node_id: u64) -> TcpTransportConfig {
        TcpTransportConfig {
            node_id,
            inflight_max: 256,
            frame_bytes_max: 64 * 1024 * 1024,
            connect_timeout_ms: 1_000,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 2_000,
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
    backoff_ms: u64,
}

/// The client side of the raft transport: implements `GroupTransport` for
/// every group of this node over one connection per peer.
#[derive(Debug)]
pub struct TcpTransport {
    config: TcpTransportConfig,
    peers: Mutex<BTreeMap<u64, PeerSlot>>,
    /// Serializes connection attempts, so concurrent calls to one dead peer
    /// make one attempt, not one each.
    connecting: tokio::sync::Mutex<()>,
}

impl TcpTransport {
    pub fn new(config: TcpTransportConfig) -> TcpTransport {
        TcpTransport {
            config,
            peers: Mutex::new(BTreeMap::new()),
            connecting: tokio::sync::Mutex::new(()),
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
            slot.backoff_ms = 0;
        }
    }

    /// Forgets a peer and closes its connection.
    pub fn remove_peer(&self, node: u64) {
        self.peers.lock().remove(&node);
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
        let unreachable = |reason: String| TransportError::Unreachable { target, reason };
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
                .ok_or_else(|| unreachable("no address known".to_owned()))?;
            if let Some(at) = slot.retry_at
                && Instant::now() < at
            {
                return Err(unreachable("backing off after a failed connect".to_owned()));
            }
            slot.addr
                .ok_or_else(|| unreachable("no address known".to_owned()))?
        };
        let connected = tokio::time::timeout(
            Duration::from_millis(self.config.connect_timeout_ms),
            TcpStream::connect(addr),
        )
        .await;
        let stream = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(self.failed_connect(target, e.to_string())),
            Err(_) => return Err(self.failed_connect(target, "connect timed out".to_owned())),
        };
        let _ = stream.set_nodelay(true);
        let conn = Arc::new(self.spawn_conn(stream));
        let mut peers = self.peers.lock();
        let slot = peers.entry(target).or_default();
        slot.conn = Some(Arc::clone(&conn));
        slot.retry_at = None;
        slot.backoff_ms = 0;
        tracing::debug!(node = self.config.node_id, peer = target, %addr, "raft connection open");
        Ok(conn)
    }

    fn live(&self, target: u64) -> Result<Option<Arc<Conn>>, TransportError> {
        let mut peers = self.peers.lock();
        let Some(slot) = peers.get_mut(&target) else {
            return Err(TransportError::Unreachable {
                target,
                reason: "no address known".to_owned(),
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

    fn failed_connect(&self, target: u64, reason: String) -> TransportError {
        let mut peers = self.peers.lock();
        if let Some(slot) = peers.get_mut(&target) {
            slot.backoff_ms = if slot.backoff_ms == 0 {
                self.config.reconnect_backoff_min_ms
            } else {
                (slot.backoff_ms * 2).min(self.config.reconnect_backoff_max_ms)
            };
            slot.retry_at = Some(Instant::now() + Duration::from_millis(slot.backoff_ms));
            tracing::debug!(node = self.config.node_id, peer = target, backoff_ms = slot.backoff_ms, %reason, "raft connect failed");
        }
        TransportError::Unreachable { target, reason }
    }

    fn spawn_conn(&self, stream: TcpStream) -> Conn {
        let framed = Framed::new(stream, ClientCodec::new(self.config.frame_bytes_max));
        let (mut sink, mut source) = framed.split();
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
            while let Some(next) = source.next().await {
                match next {
                    Ok(frame) => {
                        let waiter = reader_pending.lock().remove(&frame.correlation_id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(frame);
                        }
                    }
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
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let network = |reason: String| TransportError::Network { target, reason };
        let conn = tokio::time::timeout_at(deadline, self.connection(target))
            .await
            .map_err(|_| TransportError::Unreachable {
                target,
                reason: "connect timed out".to_owned(),
            })??;
        let _slot = tokio::time::timeout_at(deadline, Arc::clone(&conn.slots).acquire_owned())
            .await
            .map_err(|_| network("no free slot on the connection in time".to_owned()))?
            .map_err(|_| network("connection closed".to_owned()))?;
        let correlation_id = conn.next_correlation.fetch_add(1, Ordering::Relaxed);
        let mut payload = BytesMut::with_capacity(GROUP_ID_BYTES + body.len());
        payload.put_u64(group_id);
        payload.put_slice(body);
        let (answer_tx, answer_rx) = oneshot::channel();
        conn.pending.lock().insert(correlation_id, answer_tx);
        if conn.is_closed() {
            conn.pending.lock().remove(&correlation_id);
            self.drop_conn(target, &conn);
            return Err(network("connection closed".to_owned()));
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
            return Err(network(
                "connection closed before the request was sent".to_owned(),
            ));
        }
        match tokio::time::timeout_at(deadline, answer_rx).await {
            Ok(Ok(frame)) if frame.error_code == ErrorCode::None => Ok(frame.payload),
            Ok(Ok(frame)) => Err(TransportError::Remote {
                target,
                reason: format!(
                    "{}: {}",
                    frame.error_code,
                    String::from_utf8_lossy(&frame.payload)
                ),
            }),
            Ok(Err(_)) => {
                self.drop_conn(target, &conn);
                Err(network(
                    "connection closed while waiting for the answer".to_owned(),
                ))
            }
            Err(_) => {
                conn.pending.lock().remove(&correlation_id);
                Err(network(format!("no answer within {timeout_ms} ms")))
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
        self.call_raw(target, raft_api_key(kind), group_id, &body, timeout_ms)
            .await
            .map(|b| b.to_vec())
    }
}

/// What serves the requests a `TransportServer` receives: this node's groups.
#[async_trait::async_trait]
pub trait RpcService: Send + Sync + std::fmt::Debug + 'static {
    /// Answers one request; an `Err` travels back as the error code and
    /// reason of the response.
    async fn serve(
        &self,
        api_key: u16,
        group_id: u64,
        body: Bytes,
    ) -> Result<Vec<u8>, (ErrorCode, String)>;
}

/// Accepts raft connections and serves them until shut down.
#[derive(Debug)]
pub struct TransportServer {
    addr: SocketAddr,
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
        frame_bytes_max: usize,
    ) -> Result<TransportServer, std::io::Error> {
        let addr = listener.local_addr()?;
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => {
                            let _ = stream.set_nodelay(true);
                            connections.spawn(serve_connection(
                                stream,
                                peer,
                                Arc::clone(&service),
                                frame_bytes_max,
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "raft accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(TransportServer {
            addr,
            tasks: Mutex::new(Some(tasks)),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    service: Arc<dyn RpcService>,
    frame_bytes_max: usize,
) {
    let framed = Framed::new(stream, ServerCodec::new(frame_bytes_max));
    let (mut sink, mut source) = framed.split();
    let (answers, mut outbox) = mpsc::channel::<ResponseFrame>(SERVER_INFLIGHT_PER_CONNECTION_MAX);
    let slots = Arc::new(Semaphore::new(SERVER_INFLIGHT_PER_CONNECTION_MAX));
    let mut work = JoinSet::new();
    let writer = tokio::spawn(async move {
        while let Some(frame) = outbox.recv().await {
            if sink.send(frame).await.is_err() {
                break;
            }
        }
    });
    while let Some(next) = source.next().await {
        let frame = match next {
            Ok(frame) => frame,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "raft connection closed on a bad frame");
                break;
            }
        };
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let service = Arc::clone(&service);
        let answers = answers.clone();
        work.spawn(async move {
            let response = answer(service.as_ref(), frame).await;
            let _ = answers.send(response).await;
            drop(slot);
        });
        while work.try_join_next().is_some() {}
    }
    work.abort_all();
    writer.abort();
}

async fn answer(service: &dyn RpcService, frame: RequestFrame) -> ResponseFrame {
    let correlation_id = frame.correlation_id;
    let refuse = |code: ErrorCode, reason: String| ResponseFrame {
        correlation_id,
        error_code: code,
        payload: Bytes::from(reason.into_bytes()),
    };
    if frame.payload.len() < GROUP_ID_BYTES {
        return refuse(
            ErrorCode::InvalidRequest,
            "the payload is shorter than a group id".to_owned(),
        );
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
        Err((code, reason)) => refuse(code, reason),
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
        let id = group.status().group_id;
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
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        let Some(kind) = raft_kind_of(api_key) else {
            return Err((
                ErrorCode::UnsupportedApi,
                format!("api key {api_key} is not a raft message"),
            ));
        };
        let Some(group) = self.get(group_id) else {
            return Err((
                ErrorCode::NotLeader,
                format!("group {group_id} is not hosted here"),
            ));
        };
        group.handle_rpc(kind, body).await.map_err(|e| {
            let code = match e {
                super::GroupError::Stopped => ErrorCode::ShuttingDown,
                super::GroupError::Codec { .. } => ErrorCode::InvalidRequest,
                _ => ErrorCode::UnknownServerError,
            };
            (code, e.to_string())
        })
    }
}

#[async_trait::async_trait]
impl RpcService for GroupRegistry {
    async fn serve(
        &self,
        api_key: u16,
        group_id: u64,
        body: Bytes,
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        self.serve_raft(api_key, group_id, &body).await
    }
}
