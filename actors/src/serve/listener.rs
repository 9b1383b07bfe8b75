//! `listener/acceptor`: accepts client connections and starts one temporary
//! `connection/<peer>` actor per socket under the `listener` supervisor.
//! The accept loop is a task the acceptor watches (`common::watched`): if
//! it panics or ends, the acceptor fails and its supervisor restarts it,
//! loop and all (it ends on its own only once the broker drains, and then
//! parks).
//!
//! The socket is bound once by `Broker::start` (so its address is known
//! before the tree starts and survives an acceptor restart); each acceptor
//! incarnation serves a clone of it. Beyond `connections_max`, or beyond
//! `address_connections_max` from the client's address (ADR 0145), a new
//! client gets one `busy` error frame and is closed, by the accept loop
//! itself: no task and no buffer per refused socket, one pre-encoded frame
//! written without waiting, and one log line per `REFUSED_LOG_INTERVAL_MS`
//! at most.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use malachi_supervision::{ChildSpec, Restart};
use malachi_wire::frame::encode_response;
use malachi_wire::{ErrorBody, ErrorCode, ResponseFrame};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::common::watched::{TaskEnded, Watched, spawn_watched};
use crate::serve::connection::{ConnectionActor, ConnectionArgs};
use crate::serve::context::ServeCtx;

#[derive(Debug, Clone)]
pub(crate) struct AcceptorArgs {
    pub serving: Arc<ServeCtx>,
    pub socket: Arc<std::net::TcpListener>,
}

#[derive(Debug)]
pub(crate) enum AcceptorMsg {
    /// The accept loop ended: the acceptor fails on it.
    TaskEnded(TaskEnded),
    #[cfg(feature = "testing")]
    Poison,
}
impl ractor::Message for AcceptorMsg {}

pub(crate) struct AcceptorActor;

pub(crate) struct AcceptorState {
    serving: Arc<ServeCtx>,
    /// The accept loop; aborted (its listener clone closed) when the
    /// state is dropped, after a stop or a failure alike.
    _accept: Watched,
}

#[ractor::async_trait]
impl Actor for AcceptorActor {
    type Msg = AcceptorMsg;
    type State = AcceptorState;
    type Arguments = AcceptorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AcceptorMsg>,
        args: AcceptorArgs,
    ) -> Result<AcceptorState, ActorProcessingErr> {
        let socket = args.socket.try_clone()?;
        socket.set_nonblocking(true)?;
        let listener = TcpListener::from_std(socket)?;
        let serving = Arc::clone(&args.serving);
        let accept = spawn_watched(
            myself,
            "accept_loop",
            async move {
                accept_loop(serving, listener).await;
                // It returns once the broker drains: no failure, and the
                // tree's stop follows.
                std::future::pending::<()>().await;
            },
            AcceptorMsg::TaskEnded,
        );
        args.serving.port.accepting.store(true, Ordering::SeqCst);
        Ok(AcceptorState {
            serving: args.serving,
            _accept: accept,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AcceptorMsg>,
        msg: AcceptorMsg,
        _state: &mut AcceptorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AcceptorMsg::TaskEnded(ended) => Err(ended.into()),
            #[cfg(feature = "testing")]
            AcceptorMsg::Poison => Err("acceptor poisoned by a test".into()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AcceptorMsg>,
        state: &mut AcceptorState,
    ) -> Result<(), ActorProcessingErr> {
        state.serving.port.accepting.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// Refusals past `connections_max` are logged at most this often (the first
/// at once, then one line with the count refused since).
const REFUSED_LOG_INTERVAL_MS: u64 = 10_000;

/// Rate-limits the log of refused connections.
struct Refusals {
    since_log: u64,
    last_log: Option<Instant>,
}

impl Refusals {
    /// One refusal at `limit` (its config key) of `value`.
    fn refused(&mut self, limit: &'static str, value: usize) {
        self.since_log += 1;
        let now = Instant::now();
        let due = self.last_log.is_none_or(|last| {
            now.duration_since(last) >= std::time::Duration::from_millis(REFUSED_LOG_INTERVAL_MS)
        });
        if due {
            warn!(
                limit,
                value,
                refused = self.since_log,
                interval_ms = REFUSED_LOG_INTERVAL_MS,
                "connections refused: a connection limit reached"
            );
            self.since_log = 0;
            self.last_log = Some(now);
        }
    }
}

/// Accepts clients until the broker drains.
async fn accept_loop(serving: Arc<ServeCtx>, listener: TcpListener) {
    let busy = busy_frame();
    let mut refusals = Refusals {
        since_log: 0,
        last_log: None,
    };
    loop {
        let accepted = tokio::select! {
            _ = serving.port.draining.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off briefly.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        #[cfg(feature = "testing")]
        crate::common::faults::trip(serving.fault_key, "acceptor");
        let limits = &serving.limits;
        if serving.port.connections.load(Ordering::SeqCst) >= limits.connections_max {
            refuse(&stream, &busy);
            serving.metrics.connections_refused.increment(1);
            refusals.refused("connections_max", limits.connections_max);
            continue;
        }
        let Some(address) = serving.port.addresses.admit(peer.ip()) else {
            refuse(&stream, &busy);
            serving.metrics.connections_refused.increment(1);
            refusals.refused("address_connections_max", limits.address_connections_max);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Some(listener_sup) = serving.actors.listener.read().clone() else {
            continue;
        };
        let args = ConnectionArgs {
            serving: Arc::clone(&serving),
            stream: Arc::new(Mutex::new(Some((stream, address)))),
            peer,
        };
        let spec = ChildSpec::worker(
            format!("connection/{peer}"),
            || ConnectionActor,
            move || args.clone(),
        )
        // Temporary: a client reconnects; a restarted actor would have no socket.
        .restart(Restart::Temporary)
        .shutdown_timeout_ms(serving.limits.shutdown_timeout_ms.max(1));
        if let Err(e) = listener_sup.start_child(spec).await {
            warn!(%peer, error = %e, "cannot start a connection actor");
        } else {
            debug!(%peer, "connection accepted");
        }
    }
}

/// The one frame a refused client gets: `busy`, correlation id 0.
fn busy_frame() -> Bytes {
    goodbye_frame(ErrorCode::Busy, "too many connections", Some(100))
}

/// A frame on the reserved correlation id 0: why the broker closes the
/// connection.
pub(crate) fn goodbye_frame(code: ErrorCode, message: &str, retry_after_ms: Option<u32>) -> Bytes {
    let body = ErrorBody {
        message: message.into(),
        leader_hint: None,
        retry_after_ms,
        ranges: None,
    };
    // Through the one error-frame builder, so a body that cannot be
    // encoded is logged and replaced by the fixed fallback, never sent empty.
    let reply = super::reply::body_frame(0, code, &body);
    let frame = ResponseFrame {
        correlation_id: reply.correlation_id,
        error_code: reply.error_code,
        payload: reply.control,
    };
    let mut out = BytesMut::new();
    // A small fixed frame, far below any frame limit.
    let _ = encode_response(&frame, &mut out, usize::MAX);
    out.freeze()
}

/// Answer `busy` without waiting and close: a fresh socket's send buffer
/// takes the few bytes at once, and if it does not, the client just sees
/// the close. What the client already sent is discarded first, so the close
/// is a FIN (which lets it read the frame), not a reset.
pub(crate) fn refuse(stream: &tokio::net::TcpStream, busy: &[u8]) {
    let _ = stream.try_write(busy);
    let mut sink = [0u8; 1024];
    for _ in 0..16 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    // The socket closes when the caller drops it.
}
