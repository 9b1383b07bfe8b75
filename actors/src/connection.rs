//! `connection/<peer>`: one temporary actor per client socket.
//!
//! The actor owns a reader task and a writer task through a cancellation
//! token whose guard lives in the actor's state, so when the actor stops or
//! fails, both tasks end and the socket closes. Requests are pipelined: each
//! read frame takes one of `connection_inflight_max` permits and is handled
//! in its own task; its response goes to a bounded outbound queue and the
//! permit is returned only once the writer has written that response. So a
//! client that never reads its responses fills the socket, then the queue,
//! then the permits, and the reader stops reading from it: the broker's
//! memory for that client stays bounded (ADR 0062). Responses may complete
//! out of order; clients match them by correlation id.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::convert::IncomingRecord;
use bytes::Bytes;
use futures::StreamExt;
use malachi_cluster::cursor::{Cursor, Position};
use malachi_cluster::model::{MetadataState, ModelError, RangeId, TopicState};
use malachi_supervision::SupervisionError;
use malachi_wire::batch::BatchBuilder;
use malachi_wire::frame::encode_response_parts;
use malachi_wire::limits::MESSAGE_BYTES_MAX;
use malachi_wire::messages::{self as wire, ApiVersion, Request, Response};
use malachi_wire::{ErrorBody, ErrorCode, Message, RequestFrame, ServerCodec, WireError};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, warn};

use crate::convert::{describe_to_wire, tree_to_wire};
use crate::coordinator::{CoordError, CoordinatorMsg};
use crate::fetch::{active_plans, active_segments, read_topic, tail_positions};
use crate::metadata::{MetadataError, read_owner};
use crate::segment::{AppendError, SegmentMsg};
use crate::shared::Shared;
use crate::subscribe::{Subscriptions, credit, subscribe};

/// Room kept in a fetch response frame for its header and control map.
const FETCH_CONTROL_BYTES: usize = 8 << 10;
/// Records one store read returns at most.
const READ_CHUNK_RECORDS: usize = 1024;
/// Records one append message carries at most (the store's batch bound is larger).
const APPEND_CHUNK_RECORDS: usize = 10_000;
/// How long a closing connection keeps discarding client input after its
/// last response, so the close is a FIN and not a reset.
const LINGER_MS: u64 = 1_000;
/// How long a producer waits before retrying a range whose segment is rolling.
const ROLL_RETRY_MS: u64 = 1;

pub(crate) type Failure = (ErrorCode, String);

#[derive(Clone)]
pub(crate) struct ConnectionArgs {
    pub shared: Arc<Shared>,
    pub stream: Arc<Mutex<Option<TcpStream>>>,
    pub peer: SocketAddr,
}

impl std::fmt::Debug for ConnectionArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionArgs")
            .field("peer", &self.peer)
            .finish()
    }
}

#[derive(Debug)]
pub(crate) enum ConnectionMsg {
    /// Test-only: fail this actor.
    #[cfg(feature = "testing")]
    Poison,
}
impl ractor::Message for ConnectionMsg {}

pub(crate) struct ConnectionActor;

pub(crate) struct ConnectionState {
    _cancel: DropGuard,
    _count: ConnectionCount,
}

/// Counts this connection while its actor's state lives (even on failure).
struct ConnectionCount(Arc<Shared>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        let now = self.0.connections.fetch_sub(1, Ordering::SeqCst) - 1;
        self.0.metrics.connections.set(now as f64);
    }
}

#[ractor::async_trait]
impl Actor for ConnectionActor {
    type Msg = ConnectionMsg;
    type State = ConnectionState;
    type Arguments = ConnectionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ConnectionMsg>,
        args: ConnectionArgs,
    ) -> Result<ConnectionState, ActorProcessingErr> {
        let stream = args
            .stream
            .lock()
            .take()
            .ok_or("a connection actor cannot be restarted: its socket is gone")?;
        let now = args.shared.connections.fetch_add(1, Ordering::SeqCst) + 1;
        args.shared.metrics.connections.set(now as f64);
        let count = ConnectionCount(Arc::clone(&args.shared));
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let shared = Arc::clone(&args.shared);
        let peer = args.peer;
        tokio::spawn(async move {
            serve(shared, stream, token).await;
            debug!(%peer, "connection closed");
            myself.stop(None);
        });
        Ok(ConnectionState {
            _cancel: cancel.drop_guard(),
            _count: count,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ConnectionMsg>,
        msg: ConnectionMsg,
        _state: &mut ConnectionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            #[cfg(feature = "testing")]
            ConnectionMsg::Poison => Err("connection actor poisoned by a test".into()),
        }
    }
}

/// One request's slot: a connection permit, counted broker-wide.
pub(crate) struct Inflight {
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
}

impl Inflight {
    fn new(shared: &Arc<Shared>, permit: OwnedSemaphorePermit, used: usize) -> Inflight {
        shared.requests_inflight.fetch_add(1, Ordering::SeqCst);
        shared
            .connection_inflight_peak
            .fetch_max(used, Ordering::SeqCst);
        Inflight {
            shared: Arc::clone(shared),
            _permit: permit,
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.shared.requests_inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) struct Outbound {
    pub frame: Reply,
    pub _slot: Option<Inflight>,
}

/// A response ready for the writer. Its payload stays in two pieces, the
/// control map and the record batch block, so a fetched block (up to 4 MiB)
/// reaches the socket without being copied into a frame buffer.
pub(crate) struct Reply {
    pub correlation_id: u32,
    pub error_code: ErrorCode,
    pub control: Bytes,
    pub block: Option<Bytes>,
}

impl Reply {
    /// A successful response to `correlation_id`.
    pub(crate) fn encode(correlation_id: u32, response: &Response) -> Result<Reply, WireError> {
        let (control, block) = response.encode_parts()?;
        Ok(Reply {
            correlation_id,
            error_code: ErrorCode::None,
            control,
            block,
        })
    }
}

async fn serve(shared: Arc<Shared>, stream: TcpStream, cancel: CancellationToken) {
    let frame_max = shared.config.frame_bytes_max;
    let inflight_max = shared.config.connection_inflight_max;
    let (rd, wr) = stream.into_split();
    let mut reader = FramedRead::new(rd, ServerCodec::new(frame_max));
    // No codec and no buffer on the write side: each response goes out as
    // its header, control map and block in one vectored write, so the block
    // is never copied.
    let mut writer = wr;
    let permits = Arc::new(Semaphore::new(inflight_max));
    let subscriptions = Arc::new(Subscriptions::default());
    // One slot more than the permits, for the final error of an unframeable stream.
    let (tx, mut rx) = mpsc::channel::<Outbound>(inflight_max + 1);

    let write_cancel = cancel.clone();
    let write_task = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                biased;
                _ = write_cancel.cancelled() => break,
                next = rx.recv() => next,
            };
            let Some(out) = next else { break };
            let reply = &out.frame;
            // The frame limit is checked before any byte of the frame is written.
            let parts = match encode_response_parts(
                reply.correlation_id,
                reply.error_code,
                reply.control.clone(),
                reply.block.clone(),
                frame_max,
            ) {
                Ok(parts) => parts,
                Err(e) => {
                    debug!(error = %e, "cannot encode a response; closing");
                    write_cancel.cancel();
                    break;
                }
            };
            let mut buf = parts.into_buf();
            let sent = tokio::select! {
                _ = write_cancel.cancelled() => break,
                sent = writer.write_all_buf(&mut buf) => sent,
            };
            if let Err(e) = sent {
                debug!(error = %e, "cannot write a response; closing");
                write_cancel.cancel();
                break;
            }
            // `out` (and its permit) is dropped only now, after the write.
        }
        // Every response is out: send FIN, so the client reads them all
        // before it sees the end of the stream.
        if !write_cancel.is_cancelled() {
            let _ = writer.shutdown().await;
        }
    });

    loop {
        let permit = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = shared.draining.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = shared.draining.cancelled() => break,
            next = reader.next() => next,
        };
        let used = inflight_max - permits.available_permits();
        match next {
            None => break,
            Some(Err(e)) => {
                // The stream cannot be framed any more: answer once, then close.
                let frame = error_frame(0, e.error_code(), e.to_string());
                let slot = Some(Inflight::new(&shared, permit, used));
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tx.send(Outbound { frame, _slot: slot }) => {}
                }
                break;
            }
            Some(Ok(request)) => {
                let slot = Inflight::new(&shared, permit, used);
                let shared = Arc::clone(&shared);
                let ctx = ConnCtx {
                    tx: tx.clone(),
                    subscriptions: Arc::clone(&subscriptions),
                    cancel: cancel.clone(),
                };
                tokio::spawn(async move {
                    // A subscribe answers through its pushes, not here.
                    if let Some(frame) = handle_frame(&shared, &ctx, request).await {
                        let _ = ctx
                            .tx
                            .send(Outbound {
                                frame,
                                _slot: Some(slot),
                            })
                            .await;
                    }
                });
            }
        }
    }
    // Finish in-flight requests: their responses go out before the socket closes.
    drop(tx);
    let bound = Duration::from_millis(shared.config.shutdown_timeout_ms);
    let mut write_task = write_task;
    tokio::select! {
        _ = cancel.cancelled() => {
            write_task.abort();
            return;
        }
        done = tokio::time::timeout(bound, &mut write_task) => {
            if done.is_err() {
                write_task.abort();
                return;
            }
        }
    }
    // Closing a socket with unread input makes the kernel send a reset,
    // which may destroy responses the client has not read yet. Discard what
    // the client still sends, for a short bounded time, until it closes.
    let mut rd = reader.into_inner();
    let mut sink = [0u8; 4096];
    let linger = tokio::time::sleep(Duration::from_millis(LINGER_MS));
    tokio::pin!(linger);
    loop {
        tokio::select! {
            _ = &mut linger => break,
            _ = cancel.cancelled() => break,
            n = tokio::io::AsyncReadExt::read(&mut rd, &mut sink) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
        }
    }
}

pub(crate) fn error_frame(correlation_id: u32, code: ErrorCode, message: String) -> Reply {
    let mut message = message;
    if message.len() > MESSAGE_BYTES_MAX {
        let mut cut = MESSAGE_BYTES_MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let body = ErrorBody {
        message,
        leader_hint: None,
        retry_after_ms: code.retriable().then_some(10),
    };
    Reply {
        correlation_id,
        error_code: code,
        control: body.encode().unwrap_or_else(|_| Bytes::new()),
        block: None,
    }
}

/// What a request handler may use of its connection (subscriptions push
/// through it).
pub(crate) struct ConnCtx {
    pub tx: mpsc::Sender<Outbound>,
    pub subscriptions: Arc<Subscriptions>,
    pub cancel: CancellationToken,
}

async fn handle_frame(shared: &Arc<Shared>, ctx: &ConnCtx, frame: RequestFrame) -> Option<Reply> {
    let correlation_id = frame.correlation_id;
    let request = match Request::decode(frame.api_key, frame.payload) {
        Ok(request) => request,
        Err(e) => return Some(error_frame(correlation_id, e.error_code(), e.to_string())),
    };
    let request = match request {
        Request::Subscribe(req) => {
            if let Err(redirect) = crate::placement::serve_here(shared, &req.topic).await {
                return Some(redirect.reply(correlation_id));
            }
            return subscribe(shared, ctx, correlation_id, req)
                .err()
                .map(|(code, message)| error_frame(correlation_id, code, message));
        }
        Request::SubscribeCredit(req) => {
            let answer = credit(shared, ctx, req).map(Response::SubscribeCredit);
            return Some(encode_answer(correlation_id, "subscribe_credit", answer));
        }
        other => other,
    };
    // Records are served by the broker hosting the topic's segments; any
    // other broker answers `not_leader` with that broker's address.
    let served = match &request {
        Request::Produce(req) => Some(req.topic.as_str()),
        Request::Fetch(req) => Some(req.topic.as_str()),
        _ => None,
    };
    if let Some(topic) = served
        && let Err(redirect) = crate::placement::serve_here(shared, topic).await
    {
        return Some(redirect.reply(correlation_id));
    }
    let name = request.api_key().name();
    Some(encode_answer(
        correlation_id,
        name,
        handle_request(shared, request).await,
    ))
}

fn encode_answer(
    correlation_id: u32,
    name: &'static str,
    answer: Result<Response, Failure>,
) -> Reply {
    match answer {
        Ok(response) => match Reply::encode(correlation_id, &response) {
            Ok(reply) => reply,
            Err(e) => {
                warn!(api = name, error = %e, "cannot encode a response");
                error_frame(correlation_id, ErrorCode::UnknownServerError, e.to_string())
            }
        },
        Err((code, message)) => {
            debug!(api = name, code = %code, %message, "request refused");
            error_frame(correlation_id, code, message)
        }
    }
}

fn model_code(e: &ModelError) -> ErrorCode {
    match e {
        ModelError::NoSuchTopic { .. } => ErrorCode::TopicNotFound,
        ModelError::TopicExists { .. } => ErrorCode::TopicExists,
        ModelError::TopicSealed { .. } => ErrorCode::TopicSealed,
        ModelError::NoSuchRange { .. } | ModelError::RangeNotActive { .. } => {
            ErrorCode::RangeNotFound
        }
        ModelError::NotBuddies { .. } => ErrorCode::NotBuddies,
        ModelError::AlreadySealed { .. } => ErrorCode::AlreadySealed,
        ModelError::NoSuchPolicy { .. } => ErrorCode::PolicyNotFound,
        _ => ErrorCode::InvalidRequest,
    }
}

fn coord_failure(e: CoordError) -> Failure {
    match &e {
        CoordError::Model(m) => (model_code(m), e.to_string()),
        CoordError::Metadata(m) => (m.error_code(), e.to_string()),
        CoordError::Freeze { .. } => (ErrorCode::Busy, e.to_string()),
        _ => (ErrorCode::UnknownServerError, e.to_string()),
    }
}

fn not_serving(e: MetadataError) -> Failure {
    (e.error_code(), e.to_string())
}

/// How often a request waiting for a restarting coordinator manager looks
/// for the new one.
const COORDINATOR_WAIT_STEP_MS: u64 = 20;

async fn call_coordinator<R: Send + 'static>(
    shared: &Arc<Shared>,
    build: impl FnOnce(ractor::RpcReplyPort<Result<R, CoordError>>) -> CoordinatorMsg,
) -> Result<R, Failure> {
    let timeout_ms = shared.config.produce_timeout_ms;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    // The manager is briefly absent while its supervisor restarts it: wait
    // for the new one (bounded) rather than fail the request. The request is
    // built only once a manager took it, so it never runs twice.
    let coordinator = loop {
        if let Some(coordinator) = shared.coordinator.read().clone()
            && coordinator.get_status() == ractor::ActorStatus::Running
        {
            break coordinator;
        }
        if Instant::now() >= deadline {
            return Err((
                ErrorCode::ShuttingDown,
                "the coordinator is not running".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(COORDINATOR_WAIT_STEP_MS)).await;
    };
    match ractor::call_t!(coordinator, build, timeout_ms) {
        Ok(answer) => answer.map_err(coord_failure),
        Err(e) => Err((
            ErrorCode::Timeout,
            format!("the coordinator did not answer: {e}"),
        )),
    }
}

async fn handle_request(shared: &Arc<Shared>, request: Request) -> Result<Response, Failure> {
    let node_id = shared.config.node_id;
    match request {
        Request::ApiVersions(_) => Ok(Response::ApiVersions(wire::ApiVersionsResponse {
            node_id,
            versions: ApiVersion::supported(),
        })),
        Request::CreateTopic(req) => {
            if req.replication_factor.is_some_and(|rf| rf > 1) {
                return Err((
                    ErrorCode::InvalidRequest,
                    "a single broker cannot place more than one replica".into(),
                ));
            }
            let name = req.name.clone();
            let incarnation = call_coordinator(shared, |reply| CoordinatorMsg::CreateTopic {
                name: req.name,
                policy: req.policy,
                reply,
            })
            .await?;
            Ok(Response::CreateTopic(wire::CreateTopicResponse {
                name,
                incarnation,
            }))
        }
        Request::DeleteTopic(req) => {
            let name = req.name.clone();
            call_coordinator(shared, |reply| CoordinatorMsg::DeleteTopic {
                name: req.name,
                reply,
            })
            .await?;
            Ok(Response::DeleteTopic(wire::DeleteTopicResponse { name }))
        }
        Request::ListTopics(_) => {
            // Every vnode's topics, each read from its leader.
            let plane = shared.plane().map_err(not_serving)?;
            let topics = plane
                .list()
                .await
                .map_err(not_serving)?
                .into_iter()
                .map(|t| wire::TopicListing {
                    name: t.name,
                    incarnation: t.incarnation,
                    state: if t.sealed { "sealed" } else { "active" }.into(),
                    ranges_active: t.ranges_active,
                })
                .collect();
            Ok(Response::ListTopics(wire::ListTopicsResponse { topics }))
        }
        Request::DescribeTopic(req) => {
            let plane = shared.plane().map_err(not_serving)?;
            // Linearizable, from the leader of the topic's vnode.
            let described = plane.describe(&req.name).await.map_err(not_serving)?;
            match described {
                Some(d) => Ok(Response::DescribeTopic(wire::DescribeTopicResponse {
                    topic: describe_to_wire(&d),
                })),
                None => Err((
                    ErrorCode::TopicNotFound,
                    format!("no such topic {}", req.name),
                )),
            }
        }
        Request::Produce(req) => produce(shared, req).await.map(Response::Produce),
        Request::Fetch(req) => fetch(shared, req).await.map(Response::Fetch),
        Request::TreeSnapshot(req) => {
            let Some(root) = shared.root.read().clone() else {
                return Err((ErrorCode::ShuttingDown, "the tree is not running".into()));
            };
            let snapshot = root
                .snapshot()
                .await
                .map_err(|e| (ErrorCode::Timeout, e.to_string()))?;
            // With `all`, every other broker's tree comes over the node
            // fabric; one that cannot answer is listed as unreachable.
            let brokers = if req.all {
                crate::node::gather_trees(shared).await
            } else {
                Vec::new()
            };
            Ok(Response::TreeSnapshot(wire::TreeSnapshotResponse {
                node_id,
                root: tree_to_wire(&snapshot),
                brokers,
            }))
        }
        Request::ClusterStatus(_) => {
            let brokers = match crate::node::fabric(shared) {
                Some(fabric) => fabric
                    .membership
                    .view()
                    .all()
                    .map(crate::node::broker_status)
                    .collect(),
                None => vec![wire::BrokerStatus {
                    node_id,
                    state: wire::BrokerState::Alive,
                    client_addr: shared.client_addr.to_string(),
                    admin_addr: shared.admin_addr.to_string(),
                    ..wire::BrokerStatus::default()
                }],
            };
            Ok(Response::ClusterStatus(wire::ClusterStatusResponse {
                node_id,
                brokers,
            }))
        }
        Request::VnodeList(_) => crate::vnode_admin::vnode_list(shared).map(Response::VnodeList),
        Request::VnodeSplit(req) => crate::vnode_admin::vnode_split(shared, req.vnode)
            .await
            .map(Response::VnodeSplit),
        Request::SplitRange(req) => {
            let range = RangeId(req.range_id);
            let (lower, upper) = call_coordinator(shared, |reply| CoordinatorMsg::Split {
                topic: req.topic,
                range,
                reply,
            })
            .await?;
            Ok(Response::SplitRange(wire::SplitRangeResponse {
                range_id: req.range_id,
                children: vec![lower.0, upper.0],
            }))
        }
        Request::MergeRange(req) => {
            let (lower, upper, merged) = call_coordinator(shared, |reply| CoordinatorMsg::Merge {
                topic: req.topic,
                range: RangeId(req.range_id),
                reply,
            })
            .await?;
            Ok(Response::MergeRange(wire::MergeRangeResponse {
                range_id: merged.0,
                parents: vec![lower.0, upper.0],
            }))
        }
        Request::Subscribe(_) | Request::SubscribeCredit(_) => Err((
            ErrorCode::UnknownServerError,
            "subscriptions are handled by the connection".into(),
        )),
    }
}

async fn produce(
    shared: &Arc<Shared>,
    req: wire::ProduceRequest,
) -> Result<wire::ProduceResponse, Failure> {
    let deadline = Instant::now() + Duration::from_millis(shared.config.produce_timeout_ms);
    let plane = shared.plane().map_err(not_serving)?;
    let value_max = shared.config.record_value_bytes_max;
    let now_ms = shared.clock.now_ms();
    let incoming = req.records.records();
    let mut records = Vec::with_capacity(incoming.len());
    for (index, record) in incoming.into_iter().enumerate() {
        // Keys route records to ranges, and per-key order is the ordering
        // guarantee: a record without a key has neither (ADR 0063).
        if record.key.is_empty() {
            return Err((
                ErrorCode::InvalidRequest,
                format!("record {index} has an empty key; every record needs a key"),
            ));
        }
        if record.value.len() > value_max {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "record {index} has a value of {} bytes, over the limit of {value_max} bytes",
                    record.value.len()
                ),
            ));
        }
        records.push(IncomingRecord::from_wire(record, now_ms));
    }
    let total = records.len() as u32;
    let topic = req.topic;
    let groups = read_owner(plane.as_ref(), &topic, |state| {
        route(state, &topic, records)
    })?;
    let parts = groups.into_iter().map(|(range, records)| {
        let shared = Arc::clone(shared);
        let plane = Arc::clone(&plane);
        let topic = topic.clone();
        async move {
            // Chunks of one range go one after the other; a chunk whose range
            // was split or merged meanwhile is routed again, ahead of the
            // chunks after it, so per-key order holds.
            let mut pending: std::collections::VecDeque<(RangeId, Vec<IncomingRecord>)> =
                std::collections::VecDeque::new();
            let mut rest = records.into_iter().peekable();
            while rest.peek().is_some() {
                pending.push_back((range, rest.by_ref().take(APPEND_CHUNK_RECORDS).collect()));
            }
            while let Some((range, chunk)) = pending.pop_front() {
                if let Some(chunk) =
                    append_chunk(&shared, plane.as_ref(), &topic, range, chunk, deadline).await?
                {
                    let regrouped =
                        read_owner(plane.as_ref(), &topic, |state| route(state, &topic, chunk))?;
                    for part in regrouped.into_iter().rev() {
                        pending.push_front(part);
                    }
                }
            }
            Ok::<(), Failure>(())
        }
    });
    for result in futures::future::join_all(parts).await {
        result?;
    }
    Ok(wire::ProduceResponse {
        records_acknowledged: total,
    })
}

/// Groups records by the active range of their key, keeping their order.
fn route(
    state: &MetadataState,
    topic: &str,
    records: Vec<IncomingRecord>,
) -> Result<BTreeMap<RangeId, Vec<IncomingRecord>>, Failure> {
    let Some(found) = state.topic(topic) else {
        return Err((ErrorCode::TopicNotFound, format!("no such topic {topic}")));
    };
    if matches!(found.state, TopicState::Sealed { .. }) {
        return Err((ErrorCode::TopicSealed, format!("topic {topic} is sealed")));
    }
    let mut groups: BTreeMap<RangeId, Vec<IncomingRecord>> = BTreeMap::new();
    for record in records {
        let Some(range) = state.route_key(topic, &record.key) else {
            return Err((
                ErrorCode::UnknownServerError,
                format!("topic {topic} has no active range for a key"),
            ));
        };
        groups.entry(range.id).or_default().push(record);
    }
    Ok(groups)
}

/// Appends one chunk to its range's active segment, retrying across rolls
/// until it is durable or the deadline passes. Returns the chunk back if its
/// range is no longer active (split or merged): the caller routes it again.
async fn append_chunk(
    shared: &Arc<Shared>,
    plane: &dyn crate::metadata::MetadataPlane,
    topic: &str,
    range: RangeId,
    records: Vec<IncomingRecord>,
    deadline: Instant,
) -> Result<Option<Vec<IncomingRecord>>, Failure> {
    let bytes: u64 = records
        .iter()
        .map(|r| (r.key.len() + r.value.len()) as u64)
        .sum();
    let records = Arc::new(records);
    let timeout = || {
        (
            ErrorCode::Timeout,
            "the produce was not acknowledged in time; it may or may not be durable".to_string(),
        )
    };
    loop {
        if Instant::now() >= deadline {
            return Err(timeout());
        }
        let active = read_owner(plane, topic, |state| {
            state
                .range(range)
                .filter(|r| r.is_active())
                .and_then(|r| r.last_segment())
        });
        let Some(segment) = active else {
            return Ok(Some(Arc::unwrap_or_clone(records)));
        };
        let Some(handle) = shared.segment(segment) else {
            // The segment actor is starting (after a roll or a restart).
            tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
            continue;
        };
        let (reply, answer) = oneshot::channel();
        let batch = Arc::clone(&records);
        let sent = tokio::time::timeout_at(
            deadline,
            handle.actor.send(move |permit| SegmentMsg::Append {
                permit,
                records: batch,
                bytes,
                reply,
            }),
        )
        .await;
        match sent {
            Err(_) => return Err(timeout()),
            Ok(Err(SupervisionError::NotRunning)) | Ok(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
                continue;
            }
            Ok(Ok(())) => {}
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Err(_) => return Err(timeout()),
            // The actor died before it took the batch: nothing was appended.
            Ok(Err(_)) => {}
            Ok(Ok(Ok(_offsets))) => return Ok(None),
            Ok(Ok(Err(AppendError::Rolled))) => {}
            Ok(Ok(Err(AppendError::Busy(m)))) => return Err((ErrorCode::Busy, m)),
            Ok(Ok(Err(AppendError::Invalid(m)))) => return Err((ErrorCode::InvalidRequest, m)),
            Ok(Ok(Err(AppendError::Failed(m)))) => {
                return Err((ErrorCode::UnknownServerError, m));
            }
        }
        tokio::time::sleep(Duration::from_millis(ROLL_RETRY_MS)).await;
    }
}

async fn fetch(
    shared: &Arc<Shared>,
    req: wire::FetchRequest,
) -> Result<wire::FetchResponse, Failure> {
    let plane = shared.plane().map_err(not_serving)?;
    let wait_ms = u64::from(req.wait_ms).min(shared.config.fetch_wait_ms_max);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let topic = req.topic.clone();
    let (incarnation, start) = start_positions(shared, plane.as_ref(), &req)?;
    // Subscribed only for a topic that exists (the map must not grow with
    // names clients make up), and before the first read, so a record made
    // durable between that read and the wait still wakes it.
    let mut durable = shared.watch_topic(&req.topic);
    let batch_max = (req.bytes_max as usize).min(
        shared
            .config
            .frame_bytes_max
            .saturating_sub(FETCH_CONTROL_BYTES),
    );
    loop {
        // Plans are cloned under the metadata lock; the disk is read without it.
        let plans = read_owner(plane.as_ref(), &topic, |state| active_plans(state, &topic));
        let mut builder = BatchBuilder::with_capacity(batch_max, batch_max);
        let outcome = tokio::task::block_in_place(|| {
            read_topic(
                &plans,
                &shared.store,
                &start,
                req.records_max,
                &mut builder,
                batch_max,
                READ_CHUNK_RECORDS,
            )
        })
        .map_err(|e| (ErrorCode::UnknownServerError, e.to_string()))?;
        let (batch, positions, records, bytes) = (
            builder.finish(),
            outcome.positions,
            outcome.records,
            outcome.bytes,
        );
        let expired = Instant::now() >= deadline;
        if records > 0 || expired {
            shared
                .metrics
                .records_consumed
                .increment(u64::from(records));
            shared.metrics.bytes_consumed.increment(bytes);
            let cursor = Cursor {
                topic: topic.clone(),
                incarnation,
                positions,
            };
            let next_cursor = cursor
                .encode(&shared.cursor_key)
                .map_err(|e| (ErrorCode::UnknownServerError, e.to_string()))?;
            return Ok(wire::FetchResponse {
                next_cursor,
                records: batch,
            });
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = durable.changed() => {}
            _ = shared.draining.cancelled() => {
                return Err((ErrorCode::ShuttingDown, "the broker is shutting down".into()));
            }
        }
    }
}

/// Where a fetch starts: the client's cursor (checked against the metadata),
/// the start of every range, or the tail.
pub(crate) fn start_positions(
    shared: &Shared,
    plane: &dyn crate::metadata::MetadataPlane,
    req: &wire::FetchRequest,
) -> Result<(u64, BTreeMap<RangeId, Position>), Failure> {
    let checked = read_owner(plane, &req.topic, |state| {
        let Some(topic) = state.topic(&req.topic) else {
            return Err((
                ErrorCode::TopicNotFound,
                format!("no such topic {}", req.topic),
            ));
        };
        let incarnation = topic.incarnation.0;
        let cursor = match &req.cursor {
            Some(encoded) => {
                let cursor = Cursor::decode_for(encoded, &shared.cursor_key, state)
                    .map_err(|e| (ErrorCode::InvalidCursor, e.to_string()))?;
                if cursor.topic != req.topic {
                    return Err((
                        ErrorCode::InvalidCursor,
                        format!("the cursor belongs to topic {}", cursor.topic),
                    ));
                }
                Some(cursor.positions)
            }
            None => None,
        };
        Ok((incarnation, cursor, active_segments(state, &req.topic)))
    })?;
    let (incarnation, cursor, active) = checked;
    let positions = match cursor {
        Some(positions) => positions,
        None if req.from_start => active
            .iter()
            .map(|&(range, _, _)| (range, Position::Start))
            .collect(),
        None => tokio::task::block_in_place(|| tail_positions(&shared.store, &active))
            .map_err(|e| (ErrorCode::UnknownServerError, e.to_string()))?,
    };
    Ok((incarnation, positions))
}
