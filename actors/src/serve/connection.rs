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

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use malachi_wire::ServerCodec;
use malachi_wire::frame::encode_response_parts;
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::codec::FramedRead;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::debug;

use super::dispatch::handle_frame;
use super::reply::{Inflight, Outbound, error_frame};
use super::subscribe::{ConnCtx, Subscriptions};
use crate::control::shared::Shared;

/// How long a closing connection keeps discarding client input after its
/// last response, so the close is a FIN and not a reset.
const LINGER_MS: u64 = 1_000;

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
