//! `listener/acceptor`: accepts client connections and starts one temporary
//! `connection/<peer>` actor per socket under the `listener` supervisor.
//!
//! The socket is bound once by `Broker::start` (so its address is known
//! before the tree starts and survives an acceptor restart); each acceptor
//! incarnation serves a clone of it. Beyond `connections_max` a new client
//! gets one `busy` error frame and is closed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::SinkExt;
use malachi_supervision::{ChildSpec, Restart};
use malachi_wire::{ErrorBody, ErrorCode, Message, ResponseFrame, ServerCodec};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::net::TcpListener;
use tokio_util::codec::FramedWrite;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, warn};

use crate::control::shared::Shared;
use crate::serve::connection::{ConnectionActor, ConnectionArgs};

#[derive(Debug, Clone)]
pub(crate) struct AcceptorArgs {
    pub shared: Arc<Shared>,
    pub socket: Arc<std::net::TcpListener>,
}

#[derive(Debug)]
pub(crate) enum AcceptorMsg {
    #[cfg(feature = "testing")]
    Poison,
}
impl ractor::Message for AcceptorMsg {}

pub(crate) struct AcceptorActor;

pub(crate) struct AcceptorState {
    shared: Arc<Shared>,
    _cancel: DropGuard,
}

#[ractor::async_trait]
impl Actor for AcceptorActor {
    type Msg = AcceptorMsg;
    type State = AcceptorState;
    type Arguments = AcceptorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<AcceptorMsg>,
        args: AcceptorArgs,
    ) -> Result<AcceptorState, ActorProcessingErr> {
        let socket = args.socket.try_clone()?;
        socket.set_nonblocking(true)?;
        let listener = TcpListener::from_std(socket)?;
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let shared = Arc::clone(&args.shared);
        tokio::spawn(accept_loop(shared, listener, token));
        args.shared.accepting.store(true, Ordering::SeqCst);
        Ok(AcceptorState {
            shared: args.shared,
            _cancel: cancel.drop_guard(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AcceptorMsg>,
        msg: AcceptorMsg,
        _state: &mut AcceptorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            #[cfg(feature = "testing")]
            AcceptorMsg::Poison => Err("acceptor poisoned by a test".into()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AcceptorMsg>,
        state: &mut AcceptorState,
    ) -> Result<(), ActorProcessingErr> {
        state.shared.accepting.store(false, Ordering::SeqCst);
        Ok(())
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = shared.draining.cancelled() => return,
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
        let _ = stream.set_nodelay(true);
        if shared.connections.load(Ordering::SeqCst) >= shared.config.connections_max {
            tokio::spawn(refuse(stream, shared.config.frame_bytes_max));
            continue;
        }
        let Some(listener_sup) = shared.listener.read().clone() else {
            continue;
        };
        let args = ConnectionArgs {
            shared: Arc::clone(&shared),
            stream: Arc::new(Mutex::new(Some(stream))),
            peer,
        };
        let spec = ChildSpec::worker(
            format!("connection/{peer}"),
            || ConnectionActor,
            move || args.clone(),
        )
        // Temporary: a client reconnects; a restarted actor would have no socket.
        .restart(Restart::Temporary)
        .shutdown_timeout_ms(shared.config.shutdown_timeout_ms.max(1));
        if let Err(e) = listener_sup.start_child(spec).await {
            warn!(%peer, error = %e, "cannot start a connection actor");
        } else {
            debug!(%peer, "connection accepted");
        }
    }
}

async fn refuse(stream: tokio::net::TcpStream, frame_bytes_max: usize) {
    let body = ErrorBody {
        message: "too many connections".into(),
        leader_hint: None,
        retry_after_ms: Some(100),
    };
    let mut out = FramedWrite::new(stream, ServerCodec::new(frame_bytes_max));
    let frame = ResponseFrame {
        correlation_id: 0,
        error_code: ErrorCode::Busy,
        payload: body.encode().unwrap_or_default(),
    };
    let _ = out.send(frame).await;
}
