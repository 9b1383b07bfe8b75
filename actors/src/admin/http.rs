//! `admin_http`: the admin port (axum), served by a task the actor watches
//! (`common::watched`): if the server panics or ends on its own, the actor
//! fails and its supervisor restarts it. `/health` answers 200 while the
//! process serves HTTP at all; `/ready` answers 503 until the metadata plane
//! is open, the coordinator runs and the client port accepts; `/metrics` is
//! Prometheus text (with restart counts refreshed from a live tree snapshot);
//! `/api/tree` is the supervision tree as JSON; `/api/members` is the
//! cluster's members and where their vnode replicas are, and `POST
//! /api/members/<id>/decommission` and `.../admit` change a member's state
//! (ADR 0104; the same as the client port's `cluster_members`).
//!
//! Bounds (config `admin_connections_max`, `admin_address_connections_max`,
//! `admin_read_timeout_ms`):
//! - [`BoundedListener`] serves at most `admin_connections_max` connections
//!   at once, and at most `admin_address_connections_max` from one client
//!   address (ADR 0145), so slow connections from one host cannot take every
//!   slot and keep a health checker elsewhere from `/health` and `/ready`.
//!   Each accepted connection holds a slot (a semaphore permit) and its
//!   address's place inside its IO object, so both return exactly when the
//!   connection's socket is dropped. Past either limit a connection is
//!   handed to the probe lane (`probe_lane.rs`), which answers only
//!   `/health` and `/ready`, one connection per address; past its own
//!   bounds it is closed on the accept path itself, no task spawned, and logged through a
//!   [`RefusalLog`]: the first refusal, then at most one line per
//!   [`REFUSAL_LOG_INTERVAL_MS`](crate::common::refusal::REFUSAL_LOG_INTERVAL_MS)
//!   with the count it kept quiet about.
//! - [`DeadlineIo`] fails a connection that has written nothing for
//!   `admin_read_timeout_ms` while it waits to read or write: a connection
//!   must finish a request head and get its response under way within that
//!   time of being accepted (or of its previous response), so a client that
//!   sends nothing, or a byte a second, is dropped, and so is an idle
//!   keep-alive connection. The clock restarts only on written bytes, never
//!   on read ones, which is what catches the byte-a-second client. No admin
//!   handler takes that long to answer.
//! - hyper reads a request head into a buffer that grows with the bytes
//!   received (to its ~400 KiB default cap); no route takes a body, so a
//!   declared `Content-Length` reserves nothing.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use malachi_cluster::group::Backoff;
use malachi_wire::messages::Request;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, warn};

use super::AdminCtx;
use super::access::{AdminPeer, guard};
use super::probe_lane::ProbeLane;
use super::stream::{AdminStream, CertPrincipal};
use crate::common::addresses::{AddressSlot, AddressTable};
use crate::common::refusal::{REFUSAL_LOG_INTERVAL_MS, RefusalLog};
use crate::common::tls::ServerTls;
use crate::common::watched::{TaskEnded, Watched, spawn_watched};

/// The first retry of a failed accept (out of file descriptors, say) waits
/// this long; each further failure doubles it up to
/// [`ACCEPT_BACKOFF_MAX_MS`].
const ACCEPT_BACKOFF_MIN_MS: u64 = 10;
/// The longest wait between failed accepts.
const ACCEPT_BACKOFF_MAX_MS: u64 = 1_000;

#[derive(Debug, Clone)]
pub(crate) struct AdminArgs {
    pub ctx: Arc<AdminCtx>,
    pub socket: Arc<std::net::TcpListener>,
}

#[derive(Debug)]
pub(crate) enum AdminMsg {
    /// The server's task ended: the actor fails on it.
    TaskEnded(TaskEnded),
}
impl ractor::Message for AdminMsg {}

pub(crate) struct AdminActor;

pub(crate) struct AdminState {
    /// Cancelled first when the state is dropped: the server stops taking
    /// connections and lets those under way finish.
    _cancel: DropGuard,
    /// The server; aborted when the state is dropped.
    _serve: Watched,
}

pub(crate) fn router(admin: Arc<AdminCtx>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/tree", get(tree))
        .route("/api/members", get(members))
        .route("/api/members/{node}/decommission", post(decommission))
        .route("/api/members/{node}/admit", post(admit))
        .with_state(admin)
}

async fn ready(State(admin): State<Arc<AdminCtx>>) -> Response {
    if admin.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// The request a read-only view stands for in the authorization table:
/// describe on the cluster.
fn describe_request() -> Request {
    Request::TreeSnapshot(Default::default())
}

async fn metrics(
    State(admin): State<Arc<AdminCtx>>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = guard(&admin, &peer, &headers, &describe_request()).await {
        return refused;
    }
    let root = admin.actors.root.read().clone();
    if let Some(root) = root
        && let Ok(snapshot) = root.snapshot().await
    {
        admin.metrics.record_restarts(&snapshot);
    }
    admin
        .metrics
        .open_segments
        .set(admin.data.segments.lock().len() as f64);
    // Read at the scrape, not when the lease last changed: a broker resumed
    // after a pause must not show a lease its clock has run out.
    admin.memory.lease_probes.lock().retain(|vnode, probe| {
        let held = probe.holds();
        admin
            .metrics
            .coordinator_lease_held(vnode.0, held.unwrap_or(false));
        held.is_some()
    });
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        admin.metrics.render(),
    )
        .into_response()
}

async fn tree(
    State(admin): State<Arc<AdminCtx>>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = guard(&admin, &peer, &headers, &describe_request()).await {
        return refused;
    }
    let root = admin.actors.root.read().clone();
    let Some(root) = root else {
        return (StatusCode::SERVICE_UNAVAILABLE, "tree not running\n").into_response();
    };
    match root.snapshot().await {
        Ok(snapshot) => axum::Json(snapshot).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
    }
}

async fn members(
    State(admin): State<Arc<AdminCtx>>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    headers: HeaderMap,
) -> Response {
    guarded_members(&admin, &peer, &headers, Default::default()).await
}

async fn decommission(
    State(admin): State<Arc<AdminCtx>>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    headers: HeaderMap,
    Path(node): Path<u64>,
) -> Response {
    let request = malachi_wire::messages::ClusterMembersRequest {
        decommission: Some(node),
        admit: None,
    };
    guarded_members(&admin, &peer, &headers, request).await
}

async fn admit(
    State(admin): State<Arc<AdminCtx>>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    headers: HeaderMap,
    Path(node): Path<u64>,
) -> Response {
    let request = malachi_wire::messages::ClusterMembersRequest {
        decommission: None,
        admit: Some(node),
    };
    guarded_members(&admin, &peer, &headers, request).await
}

/// `cluster_members` once the caller may send it: describe to read,
/// admin on the cluster to admit or decommission (`serve::auth::need`).
async fn guarded_members(
    admin: &Arc<AdminCtx>,
    peer: &AdminPeer,
    headers: &HeaderMap,
    request: malachi_wire::messages::ClusterMembersRequest,
) -> Response {
    let what = Request::ClusterMembers(request.clone());
    if let Err(refused) = guard(admin, peer, headers, &what).await {
        return refused;
    }
    members_answer(admin, request).await
}

/// The members as JSON; a refusal as its wire error code and message, with
/// 400 for a bad request and 503 for anything a retry may cure.
async fn members_answer(
    admin: &Arc<AdminCtx>,
    request: malachi_wire::messages::ClusterMembersRequest,
) -> Response {
    use malachi_wire::Message as _;
    if let Err(e) = request.check() {
        return (StatusCode::BAD_REQUEST, format!("invalid_request: {e}\n")).into_response();
    }
    // Boxed: the routed reads nest deep enough to exhaust the compiler's
    // layout depth inside axum's handler types.
    let answer: Pin<Box<dyn Future<Output = _> + Send + '_>> =
        Box::pin(crate::serve::vnodes::cluster_members(&admin.meta, request));
    match answer.await {
        Ok(members) => axum::Json(members).into_response(),
        Err(e) => {
            let code = e.code();
            let status = if code == malachi_wire::ErrorCode::InvalidRequest {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, format!("{}: {e}\n", code.name())).into_response()
        }
    }
}

/// The admin port's listener for `axum::serve`: at most `connections_max`
/// connections at once, each a [`DeadlineIo`]; one past the limit is closed
/// here, on the accept path, so a flood spawns nothing.
#[derive(Debug)]
pub(crate) struct BoundedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    connections_max: usize,
    addresses: Arc<AddressTable<()>>,
    read_timeout: Duration,
    refusals: RefusalLog,
    accept_failures: Backoff,
    /// The port's TLS, if it has TLS (ADR 0149).
    tls: Option<Arc<ServerTls>>,
    /// Where connections past the limits go for `/health` and `/ready`.
    probe: Option<ProbeLane>,
    /// Test hook: the broker whose armed `admin_http` fault an accept
    /// trips (`common::faults`).
    #[cfg(feature = "testing")]
    fault_key: Option<SocketAddr>,
}

impl BoundedListener {
    pub(crate) fn new(
        inner: TcpListener,
        connections_max: usize,
        address_connections_max: usize,
        read_timeout: Duration,
    ) -> BoundedListener {
        assert!(
            connections_max > 0,
            "admin_connections_max is validated positive"
        );
        assert!(
            !read_timeout.is_zero(),
            "admin_read_timeout_ms is validated positive"
        );
        let seed = inner.local_addr().map(|a| u64::from(a.port())).unwrap_or(0);
        BoundedListener {
            inner,
            slots: Arc::new(Semaphore::new(connections_max)),
            connections_max,
            addresses: AddressTable::new(address_connections_max, || ()),
            read_timeout,
            refusals: RefusalLog::new(REFUSAL_LOG_INTERVAL_MS),
            accept_failures: Backoff::new(ACCEPT_BACKOFF_MIN_MS, ACCEPT_BACKOFF_MAX_MS, seed),
            tls: None,
            probe: None,
            #[cfg(feature = "testing")]
            fault_key: None,
        }
    }

    /// Serves TLS: each connection's handshake runs on its first read or
    /// write, within its deadline (`admin/stream.rs`).
    pub(crate) fn with_tls(self, tls: Option<Arc<ServerTls>>) -> BoundedListener {
        BoundedListener { tls, ..self }
    }

    /// Answers `/health` and `/ready` on connections past the limits.
    pub(crate) fn with_probe_lane(self, probe: ProbeLane) -> BoundedListener {
        BoundedListener {
            probe: Some(probe),
            ..self
        }
    }

    /// Test hook: each accept trips the `admin_http` fault armed for the
    /// broker serving clients on `broker`.
    #[cfg(feature = "testing")]
    fn with_fault_key(self, broker: SocketAddr) -> BoundedListener {
        BoundedListener {
            fault_key: Some(broker),
            ..self
        }
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = DeadlineIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (DeadlineIo, SocketAddr) {
        loop {
            let (stream, peer) = match self.inner.accept().await {
                Ok(accepted) => {
                    self.accept_failures.reset();
                    accepted
                }
                Err(error) => {
                    let delay_ms = self.accept_failures.next_delay_ms();
                    debug!(%error, delay_ms, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    continue;
                }
            };
            let admitted = Arc::clone(&self.slots)
                .try_acquire_owned()
                .ok()
                .zip(self.addresses.admit(peer.ip()));
            let Some((slot, address)) = admitted else {
                // Health and readiness are still answered (`probe_lane.rs`).
                if let Some(lane) = &self.probe
                    && lane.take(stream, peer)
                {
                    continue;
                }
                if let Some(refused_unlogged) = self.refusals.admit(Instant::now()) {
                    warn!(
                        %peer,
                        admin_connections_max = self.connections_max,
                        admin_address_connections_max = self.addresses.connections_max(),
                        refused_unlogged,
                        "admin connection refused: at a connection limit"
                    );
                }
                continue;
            };
            #[cfg(feature = "testing")]
            if let Some(broker) = self.fault_key {
                crate::common::faults::trip(broker, "admin_http");
            }
            let _ = stream.set_nodelay(true);
            let principal = CertPrincipal::default();
            return (
                DeadlineIo::new(
                    AdminStream::new(stream, self.tls.as_ref(), Arc::clone(&principal)),
                    (slot, address),
                    self.read_timeout,
                    principal,
                ),
                peer,
            );
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// One admin connection: its socket, its slot (given back when the
/// server shuts the connection down, or when this is dropped, whichever
/// comes first: a client that saw the close may connect again at once,
/// and must find its place free), and a deadline `timeout` after the last written byte (or the
/// accept), restarted once by the first bytes of each request. A read or a stalled write polled past the deadline fails with
/// `TimedOut`, which ends the connection.
#[derive(Debug)]
pub(crate) struct DeadlineIo {
    stream: AdminStream,
    slot: Option<(OwnedSemaphorePermit, AddressSlot<()>)>,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Whether bytes were read since the last write: the first bytes of a
    /// new request restart the deadline once, so a keep-alive connection
    /// that sends its next request late still gets a whole `timeout` for
    /// it, while a trickle of bytes does not keep one alive.
    read_since_write: bool,
    /// The verified client certificate's principal, once known.
    principal: CertPrincipal,
}

impl DeadlineIo {
    fn new(
        stream: AdminStream,
        slot: (OwnedSemaphorePermit, AddressSlot<()>),
        timeout: Duration,
        principal: CertPrincipal,
    ) -> DeadlineIo {
        DeadlineIo {
            stream,
            slot: Some(slot),
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            read_since_write: false,
            principal,
        }
    }

    /// Where the client certificate's principal lands (ADR 0149 §8).
    pub(crate) fn cert_principal(&self) -> CertPrincipal {
        Arc::clone(&self.principal)
    }

    /// Whether the deadline has passed; if not, the task is woken when it does.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline.as_mut().poll(cx).is_ready()
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "admin connection wrote nothing for {} ms",
                self.timeout.as_millis()
            ),
        )
    }

    /// Written bytes are progress: the connection gets another `timeout`.
    fn progressed(&mut self, polled: &Poll<io::Result<usize>>) {
        if matches!(polled, Poll::Ready(Ok(n)) if *n > 0) {
            let next = tokio::time::Instant::now() + self.timeout;
            self.deadline.as_mut().reset(next);
            self.read_since_write = false;
        }
    }

    /// The first bytes read after a write start a request: it gets a whole
    /// `timeout` from there (reads after them do not extend it).
    fn request_started(&mut self) {
        if !self.read_since_write {
            self.read_since_write = true;
            let next = tokio::time::Instant::now() + self.timeout;
            self.deadline.as_mut().reset(next);
        }
    }
}

impl AsyncRead for DeadlineIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired(cx) {
            return Poll::Ready(Err(this.timed_out()));
        }
        let filled = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > filled {
            this.request_started();
        }
        polled
    }
}

impl AsyncWrite for DeadlineIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.progressed(&polled);
        if polled.is_pending() && this.expired(cx) {
            return Poll::Ready(Err(this.timed_out()));
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.progressed(&polled);
        if polled.is_pending() && this.expired(cx) {
            return Poll::Ready(Err(this.timed_out()));
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // The answer is written: the place goes back before the client can
        // see the close (the probe lane's CI race, here too).
        this.slot = None;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

#[ractor::async_trait]
impl Actor for AdminActor {
    type Msg = AdminMsg;
    type State = AdminState;
    type Arguments = AdminArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AdminMsg>,
        args: AdminArgs,
    ) -> Result<AdminState, ActorProcessingErr> {
        let socket = args.socket.try_clone()?;
        socket.set_nonblocking(true)?;
        let listener = BoundedListener::new(
            TcpListener::from_std(socket)?,
            args.ctx.connections_max,
            args.ctx.address_connections_max,
            Duration::from_millis(args.ctx.read_timeout_ms),
        )
        .with_tls(args.ctx.tls.clone())
        .with_probe_lane(ProbeLane::new(Arc::clone(&args.ctx)));
        #[cfg(feature = "testing")]
        let listener = listener.with_fault_key(args.ctx.fault_key);
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let app = router(args.ctx).into_make_service_with_connect_info::<AdminPeer>();
        let serve = spawn_watched(
            myself,
            "admin_http_server",
            async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(token.clone().cancelled_owned())
                    .await;
                if let Err(e) = served {
                    warn!(error = %e, "admin http server stopped");
                }
                if token.is_cancelled() {
                    // Stopped by this actor's stop: no failure.
                    std::future::pending::<()>().await;
                }
            },
            AdminMsg::TaskEnded,
        );
        Ok(AdminState {
            _cancel: cancel.drop_guard(),
            _serve: serve,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AdminMsg>,
        msg: AdminMsg,
        _state: &mut AdminState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AdminMsg::TaskEnded(ended) => Err(ended.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::clock::SystemClock;
    use crate::common::config::BrokerConfig;
    use crate::control::shared::Shared;
    use malachi_core::model::CursorSecret;
    use malachi_storage::FileStore;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status(addr: std::net::SocketAddr, path: &str) -> u16 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response[9..12].parse().unwrap()
    }

    /// The probe lane's CI race on the main lane: the place must be free
    /// by the time the client can see the close.
    #[tokio::test]
    async fn an_admin_connections_place_is_given_back_when_it_shuts_down() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        let slots = Arc::new(Semaphore::new(1));
        let addresses = AddressTable::new(1, || ());
        let slot = (
            Arc::clone(&slots).try_acquire_owned().unwrap(),
            addresses.admit(peer.ip()).unwrap(),
        );
        let principal = CertPrincipal::default();
        let mut io = DeadlineIo::new(
            AdminStream::new(server, None, Arc::clone(&principal)),
            slot,
            Duration::from_secs(10),
            principal,
        );
        assert_eq!(slots.available_permits(), 0);
        io.shutdown().await.unwrap();
        assert_eq!(slots.available_permits(), 1, "the slot is back");
        assert!(
            addresses.admit(peer.ip()).is_some(),
            "the address's place is back"
        );
        drop((io, client));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ready_is_503_until_metadata_coordinator_tree_and_acceptor_are_up() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig::for_tests(dir.path());
        let store =
            FileStore::open_dir(dir.path().join("segments"), config.store_config()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::new(
            config,
            Arc::new(store),
            Arc::new(SystemClock),
            CursorSecret::new(vec![7u8; 32]),
            addr,
            addr,
        ));
        let listener = BoundedListener::new(listener, 16, 16, Duration::from_secs(10));
        let app = router(Arc::new(AdminCtx::of(&shared)))
            .into_make_service_with_connect_info::<AdminPeer>();
        tokio::spawn(axum::serve(listener, app).into_future());
        assert_eq!(status(addr, "/health").await, 200);
        assert_eq!(status(addr, "/ready").await, 503);
        // Serving clients alone is not enough: the metadata plane is not open.
        shared
            .port
            .accepting
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(status(addr, "/ready").await, 503);
        assert_eq!(status(addr, "/api/tree").await, 503);
    }
}
