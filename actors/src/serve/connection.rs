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
//! memory for that client stays bounded (ADR 0062), and a response not read
//! within `response_write_timeout_ms` closes the connection (ADR 0145).
//! Responses may complete out of order; clients match them by correlation
//! id. Frames are read by `reader.rs` (budget for the bytes that arrived
//! only) and answers written by `writer.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use malachi_wire::frame::{LEN_BYTES, RESPONSE_HEADER_BYTES};
use malachi_wire::messages::{ApiVersion, Request};
use malachi_wire::{ApiKey, ErrorCode, RequestFrame};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::debug;

use super::auth::ConnAuth;
use super::dispatch::handle_frame;
use super::produce::{ProduceJob, spawn_sequencer};
use super::reader::{FrameReader, Quiet, ReadOutcome};
use super::reply::{Inflight, Outbound, Reply, error_frame};
use super::subscribe::{ConnCtx, Subscriptions};
use super::writer::{drain_writes, linger, write_loop};
use crate::common::addresses::AddressSlot;
use crate::common::budget::{self, AddressBudget, ConnectionBudget, Held};
use crate::serve::context::ServeCtx;

/// An accepted socket and its place in its address's count (ADR 0145).
pub(crate) type Admitted = (TcpStream, AddressSlot<AddressBudget>);

#[derive(Clone)]
pub(crate) struct ConnectionArgs {
    pub serving: Arc<ServeCtx>,
    /// Taken once, by the actor's first start.
    pub stream: Arc<Mutex<Option<Admitted>>>,
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
struct ConnectionCount(Arc<ServeCtx>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        let now = self.0.port.connections.fetch_sub(1, Ordering::SeqCst) - 1;
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
        let (stream, address) = args
            .stream
            .lock()
            .take()
            .ok_or("a connection actor cannot be restarted: its socket is gone")?;
        let now = args.serving.port.connections.fetch_add(1, Ordering::SeqCst) + 1;
        args.serving.metrics.connections.set(now as f64);
        let count = ConnectionCount(Arc::clone(&args.serving));
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let serving = Arc::clone(&args.serving);
        let peer = args.peer;
        tokio::spawn(async move {
            serve(serving, stream, address, token).await;
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

/// Response budget a request other than a fetch takes before it is handled;
/// a larger answer grows its share before it is queued.
const RESPONSE_ESTIMATE_BYTES: usize = 16 << 10;
/// Room a fetch answer needs besides its block (header, control map).
const FETCH_CONTROL_BYTES: usize = 8 << 10;
/// A connection that held at least this much at once asks the allocator to
/// return freed memory when it closes.
const TRIM_AFTER_BYTES: usize = 8 << 20;

/// The response budget a request takes before it is handled: a fetch its
/// byte budget (plus one oversized record and the control map), within the
/// frame; anything else a small estimate, grown if its answer is larger.
fn response_estimate(serving: &ServeCtx, frame: &RequestFrame) -> usize {
    let frame_max = serving.limits.frame_bytes_max;
    if frame.api_key == ApiKey::Fetch as u16
        && let Ok(Request::Fetch(req)) = Request::decode(frame.api_key, frame.payload.clone())
    {
        let bytes = (req.bytes_max as usize)
            .saturating_add(serving.limits.record_value_bytes_max)
            .saturating_add(FETCH_CONTROL_BYTES);
        return bytes.min(frame_max);
    }
    RESPONSE_ESTIMATE_BYTES
}

pub(crate) fn reply_bytes(reply: &Reply) -> usize {
    LEN_BYTES
        + RESPONSE_HEADER_BYTES
        + reply.control.len()
        + reply.block.as_ref().map_or(0, |b| b.len())
}

/// Return freed memory to the OS once no trim is running; a close that asks
/// while one runs makes it run once more, so no large close is missed.
fn trim_soon() {
    use std::sync::atomic::AtomicBool;
    static REQUESTED: AtomicBool = AtomicBool::new(false);
    static RUNNING: AtomicBool = AtomicBool::new(false);
    REQUESTED.store(true, Ordering::SeqCst);
    if RUNNING.swap(true, Ordering::SeqCst) {
        return;
    }
    tokio::task::spawn_blocking(|| {
        loop {
            while REQUESTED.swap(false, Ordering::SeqCst) {
                budget::give_back_memory();
            }
            RUNNING.store(false, Ordering::SeqCst);
            if !REQUESTED.load(Ordering::SeqCst) || RUNNING.swap(true, Ordering::SeqCst) {
                break;
            }
        }
    });
}

async fn serve(
    serving: Arc<ServeCtx>,
    stream: TcpStream,
    address: AddressSlot<AddressBudget>,
    cancel: CancellationToken,
) {
    let inflight_max = serving.limits.connection_inflight_max;
    // The TLS handshake, on a TLS port, while the connection holds its
    // place in the port's limits (ADR 0149).
    let peer = stream.peer_addr().ok();
    let Some(stream) = super::stream::open(&serving, stream, peer).await else {
        return;
    };
    let identity = stream.peer_identity();
    let Ok((rd, wr)) = stream.into_split() else {
        return;
    };
    let mut reader = FrameReader::new(rd, &serving);
    let budget = ConnectionBudget::new(
        serving.limits.connection_request_bytes_max,
        serving.limits.connection_response_bytes_max,
        Some(Arc::clone(address.shared())),
    );
    let subscriptions = Arc::new(Subscriptions::default());
    // One slot more than the permits, for the final error of an unframeable stream.
    let (tx, rx) = mpsc::channel::<Outbound>(inflight_max + 1);
    // What the read and produce paths use of the broker, built once here.
    let ctx = ConnCtx {
        read: Arc::clone(&serving.read),
        // A verified client certificate logs the connection in as the
        // principal it names (ADR 0149 §8, 0150): no SCRAM exchange needed.
        auth: Arc::new(ConnAuth::new(
            Arc::clone(&serving.auth),
            peer,
            identity
                .as_ref()
                .and_then(|identity| identity.principal())
                .map(malachi_core::auth::acl::Principal::user),
        )),
        tx,
        subscriptions,
        cancel: cancel.clone(),
    };
    // Produce requests go, in the order they are read, to the connection's
    // sequencer, which hands them to each range's writer in that order.
    let produce = spawn_sequencer(
        Arc::clone(&serving.produce),
        ctx.clone(),
        budget.clone(),
        inflight_max,
    );
    let write_task = tokio::spawn(write_loop(Arc::clone(&serving), wr, rx, cancel.clone()));
    let mut conn = Conn {
        serving: Arc::clone(&serving),
        budget: budget.clone(),
        permits: Arc::new(Semaphore::new(inflight_max)),
        inflight_max,
        ctx,
        produce,
        refused_versions: Vec::new(),
        peer,
        identity,
    };
    conn.read_loop(&mut reader).await;
    // Finish in-flight requests: their responses go out before the socket
    // closes, once every sender of the write queue is gone.
    drop(conn);
    let finished = drain_writes(&serving, &cancel, write_task).await;
    if budget.held_peak_bytes() >= TRIM_AFTER_BYTES {
        trim_soon();
    }
    if finished {
        linger(reader.into_read_half(), &cancel).await;
    }
    // The address's place is given back only once the socket is done with.
    drop(address);
}

/// Whether the read loop goes on after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Next,
    Stop,
}

/// The read side of one connection: what each frame read needs.
struct Conn {
    serving: Arc<ServeCtx>,
    budget: ConnectionBudget,
    /// `connection_inflight_max` permits; a request holds one until its
    /// answer is written.
    permits: Arc<Semaphore>,
    inflight_max: usize,
    ctx: ConnCtx,
    produce: mpsc::Sender<ProduceJob>,
    /// The keys the client's `api_versions` shares no version with:
    /// answered with `unsupported_version` until another `api_versions`
    /// says otherwise.
    refused_versions: Vec<VersionMismatch>,
    peer: Option<SocketAddr>,
    /// The client's verified certificate (mTLS), for the principal
    /// mapping (ADR 0149).
    identity: Option<crate::common::peer_identity::PeerIdentity>,
}

impl Conn {
    /// Reads frames until the client closes, a deadline passes, the stream
    /// cannot be framed, or the connection is cancelled or drained.
    async fn read_loop(&mut self, reader: &mut FrameReader) {
        let serving = Arc::clone(&self.serving);
        let cancel = self.ctx.cancel.clone();
        if let Some(identity) = &self.identity {
            debug!(peer = ?self.peer, principal = ?identity.principal(), "client certificate verified");
        }
        // The session ended (ADR 0154): its refusals are written, nothing
        // more is read, then the socket closes.
        let closing = self.ctx.auth.closing().clone();
        loop {
            let permit = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = serving.port.draining.cancelled() => return,
                _ = closing.cancelled() => return,
                permit = Arc::clone(&self.permits).acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            // Idle: the reader's own permit is the only one out, and no
            // subscription is open (pushes hold no permit).
            let permits = Arc::clone(&self.permits);
            let subscriptions = Arc::clone(&self.ctx.subscriptions);
            let inflight_max = self.inflight_max;
            let auth = Arc::clone(&self.ctx.auth);
            let quiet = Quiet {
                is_idle: || {
                    permits.available_permits() + 1 == inflight_max && subscriptions.is_empty()
                },
                logged_in: || !auth.enforced() || auth.principal().is_some(),
            };
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                _ = serving.port.draining.cancelled() => return,
                _ = closing.cancelled() => return,
                next = reader.next(&serving, &self.budget, quiet) => next,
            };
            let used = self.inflight_max - self.permits.available_permits();
            let flow = match next {
                ReadOutcome::Closed => Flow::Stop,
                ReadOutcome::Idle => {
                    serving.metrics.connections_idle_closed.increment(1);
                    debug!(
                        peer = ?self.peer,
                        idle_timeout_ms = serving.limits.idle_timeout_ms,
                        "idle connection closed"
                    );
                    Flow::Stop
                }
                ReadOutcome::NotAdmitted => {
                    serving.metrics.connections_admission_timed_out.increment(1);
                    debug!(
                        peer = ?self.peer,
                        admission_timeout_ms = serving.limits.admission_timeout_ms,
                        "connection not admitted in time (no whole frame, or no login); closed"
                    );
                    Flow::Stop
                }
                ReadOutcome::SlowFrame => {
                    serving.metrics.connections_frame_timed_out.increment(1);
                    debug!(
                        peer = ?self.peer,
                        frame_read_timeout_ms = serving.limits.frame_read_timeout_ms,
                        "partial frame timed out; connection closed"
                    );
                    Flow::Stop
                }
                ReadOutcome::Invalid(e) => {
                    // The stream cannot be framed any more: answer once, then close.
                    let frame = error_frame(0, e.error_code(), e.to_string());
                    let slot = Some(Inflight::new(&serving.port, permit, used));
                    self.send(Outbound { frame, _slot: slot }).await;
                    Flow::Stop
                }
                ReadOutcome::TlsClient => {
                    super::stream::tls_client_on_plaintext(&serving, self.peer);
                    Flow::Stop
                }
                ReadOutcome::Frame(request, held) => self.take(request, held, permit, used).await,
            };
            if flow == Flow::Stop {
                return;
            }
        }
    }

    /// Queues `out` for the writer, unless the connection is cancelled.
    async fn send(&self, out: Outbound) -> Flow {
        tokio::select! {
            biased;
            _ = self.ctx.cancel.cancelled() => Flow::Stop,
            _ = self.ctx.tx.send(out) => Flow::Next,
        }
    }

    /// One request read: its answer's budget, then version negotiation, then
    /// the produce sequencer or a task of its own.
    async fn take(
        &mut self,
        request: RequestFrame,
        request_held: Held,
        permit: tokio::sync::OwnedSemaphorePermit,
        used: usize,
    ) -> Flow {
        let serving = Arc::clone(&self.serving);
        // Take the answer's budget before handling the request: a client
        // that does not read its answers runs out of it, and then this
        // loop waits here and stops reading its socket.
        let estimate = response_estimate(&serving, &request);
        let response_held = tokio::select! {
            biased;
            _ = self.ctx.cancel.cancelled() => return Flow::Stop,
            _ = serving.port.draining.cancelled() => return Flow::Stop,
            held = self.budget.response(&serving.port.budgets, estimate) => held,
        };
        let mut slot = Inflight::new(&serving.port, permit, used);
        slot.budget = Some(response_held);
        if let Some(frame) = self.negotiate(&request) {
            drop(request_held);
            return self
                .send(Outbound {
                    frame,
                    _slot: Some(slot),
                })
                .await;
        }
        if request.api_key == ApiKey::Produce as u16 {
            let job = ProduceJob {
                frame: request,
                slot,
                request_held,
            };
            return tokio::select! {
                biased;
                _ = self.ctx.cancel.cancelled() => Flow::Stop,
                sent = self.produce.send(job) => if sent.is_err() { Flow::Stop } else { Flow::Next },
            };
        }
        tokio::spawn(answer(
            serving,
            self.ctx.clone(),
            self.budget.clone(),
            request,
            request_held,
            slot,
        ));
        Flow::Next
    }

    /// Negotiation is a property of the connection, so it is settled here,
    /// in read order: a request pipelined right behind an `api_versions`
    /// already obeys it. The refusal to send, if the request's key shares
    /// no version with the client.
    fn negotiate(&mut self, request: &RequestFrame) -> Option<Reply> {
        if request.api_key == ApiKey::ApiVersions as u16 {
            if let Ok(Request::ApiVersions(req)) =
                Request::decode(request.api_key, request.payload.clone())
            {
                self.refused_versions = versions_without_overlap(&req.versions);
            }
            return None;
        }
        let mismatch = self
            .refused_versions
            .iter()
            .find(|m| m.ours.api_key == request.api_key)?;
        Some(error_frame(
            request.correlation_id,
            ErrorCode::UnsupportedVersion,
            mismatch.to_string(),
        ))
    }
}

/// Handles one request in its own task and queues its answer (a subscribe
/// answers through its pushes, not here).
async fn answer(
    serving: Arc<ServeCtx>,
    ctx: ConnCtx,
    budget: ConnectionBudget,
    request: RequestFrame,
    request_held: Held,
    mut slot: Inflight,
) {
    let answer = handle_frame(&serving.meta, &ctx, request).await;
    // The request's bytes are no longer held.
    drop(request_held);
    let Some(frame) = answer else { return };
    if let Some(held) = slot.budget.as_mut() {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = budget.grow_response(&serving.port.budgets, held, reply_bytes(&frame)) => {}
        }
    }
    let _ = ctx
        .tx
        .send(Outbound {
            frame,
            _slot: Some(slot),
        })
        .await;
}

/// A key the broker implements whose versions do not overlap the ones the
/// client's `api_versions` listed for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VersionMismatch {
    ours: ApiVersion,
    theirs: ApiVersion,
}

impl std::fmt::Display for VersionMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = ApiKey::from_code(self.ours.api_key).map_or("unknown", ApiKey::name);
        write!(
            f,
            "api key {} ({name}): this broker speaks versions {}..={}, the connection's api_versions asked for {}..={}",
            self.ours.api_key,
            self.ours.min_version,
            self.ours.max_version,
            self.theirs.min_version,
            self.theirs.max_version
        )
    }
}

/// The keys of `theirs` (a client's `api_versions` list) this broker
/// implements but shares no version with. `api_versions` itself is always
/// answered, so a client can renegotiate; keys the client did not list
/// keep their default (the broker's `min_version`).
fn versions_without_overlap(theirs: &[ApiVersion]) -> Vec<VersionMismatch> {
    let ours = ApiVersion::supported();
    theirs
        .iter()
        .filter(|t| t.api_key != ApiKey::ApiVersions as u16)
        .filter_map(|t| {
            let o = ours.iter().find(|o| o.api_key == t.api_key)?;
            ApiVersion::negotiate(*o, *t)
                .is_none()
                .then_some(VersionMismatch {
                    ours: *o,
                    theirs: *t,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(api_key: u16, min_version: u16, max_version: u16) -> ApiVersion {
        ApiVersion {
            api_key,
            min_version,
            max_version,
        }
    }

    #[test]
    fn only_implemented_keys_without_a_common_version_are_refused() {
        let produce = ApiKey::Produce as u16;
        let fetch = ApiKey::Fetch as u16;
        let theirs = [
            v(produce, 1, 3), // no overlap with 0..=0
            v(fetch, 0, 2),   // overlaps
            v(0, 5, 6),       // api_versions is always answered
            v(9_999, 7, 7),   // unknown here: unsupported_api, not this
        ];
        let refused = versions_without_overlap(&theirs);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].ours.api_key, produce);
        assert_eq!(
            refused[0].to_string(),
            "api key 10 (produce): this broker speaks versions 0..=0, the connection's api_versions asked for 1..=3"
        );
        assert!(versions_without_overlap(&ApiVersion::supported()).is_empty());
    }
}
