//! The write side of one client connection: each queued response written
//! in turn, each within `response_write_timeout_ms` (ADR 0145), then the
//! close: the drain of what is still queued and a short linger.
//!
//! A response holds its share of the response budget until it is written.
//! A client that does not read its answers stalls the write in progress;
//! once that write has taken `response_write_timeout_ms`, the connection is
//! closed, so its share returns to the others instead of being held for as
//! long as the client likes.

use std::sync::Arc;
use std::time::Duration;

use malachi_wire::frame::encode_response_parts;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::reply::Outbound;
use crate::serve::context::ServeCtx;
use crate::serve::stream::{ReadSide, WriteSide};

/// How long a closing connection keeps discarding client input after its
/// last response, so the close is a FIN and not a reset.
const LINGER_MS: u64 = 1_000;

/// The writer: each response goes out as its header, control map and block
/// in one vectored write (no codec, no buffer), so the block is never
/// copied. The frame limit is checked before any byte of a frame is
/// written; a write that does not finish within `response_write_timeout_ms`
/// closes the connection.
pub(crate) async fn write_loop(
    serving: Arc<ServeCtx>,
    mut writer: WriteSide,
    mut rx: mpsc::Receiver<Outbound>,
    cancel: CancellationToken,
) {
    let frame_max = serving.limits.frame_bytes_max;
    let write_timeout = Duration::from_millis(serving.limits.response_write_timeout_ms);
    loop {
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            next = rx.recv() => next,
        };
        let Some(out) = next else { break };
        let reply = &out.frame;
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
                cancel.cancel();
                break;
            }
        };
        let mut buf = parts.into_buf();
        let sent = tokio::select! {
            _ = cancel.cancelled() => break,
            // Through TLS the last records may wait in rustls until a
            // flush (a no-op on a plaintext socket).
            sent = async {
                writer.write_all_buf(&mut buf).await?;
                writer.flush().await
            } => sent,
            _ = tokio::time::sleep(write_timeout) => {
                serving.metrics.connections_write_timed_out.increment(1);
                debug!(
                    response_write_timeout_ms = serving.limits.response_write_timeout_ms,
                    "a response was not read in time; connection closed"
                );
                cancel.cancel();
                break;
            }
        };
        if let Err(e) = sent {
            debug!(error = %e, "cannot write a response; closing");
            cancel.cancel();
            break;
        }
        // `out` (its permit and its response budget) is dropped only now,
        // after the write.
    }
    // Every response is out: send FIN, so the client reads them all before
    // it sees the end of the stream.
    if !cancel.is_cancelled() {
        let _ = writer.shutdown().await;
    }
}

/// Waits, within `shutdown_timeout_ms`, for the writer to send every
/// response still queued; true if it did.
pub(crate) async fn drain_writes(
    serving: &ServeCtx,
    cancel: &CancellationToken,
    mut write_task: tokio::task::JoinHandle<()>,
) -> bool {
    let bound = Duration::from_millis(serving.limits.shutdown_timeout_ms);
    tokio::select! {
        _ = cancel.cancelled() => {
            write_task.abort();
            false
        }
        done = tokio::time::timeout(bound, &mut write_task) => {
            if done.is_err() {
                write_task.abort();
            }
            done.is_ok()
        }
    }
}

/// Closing a socket with unread input makes the kernel send a reset, which
/// may destroy responses the client has not read yet. Discard what the
/// client still sends, for a short bounded time, until it closes.
pub(crate) async fn linger(mut rd: ReadSide, cancel: &CancellationToken) {
    let mut sink = [0u8; 4096];
    let linger = tokio::time::sleep(Duration::from_millis(LINGER_MS));
    tokio::pin!(linger);
    loop {
        tokio::select! {
            _ = &mut linger => break,
            _ = cancel.cancelled() => break,
            n = rd.read(&mut sink) => match n {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
        }
    }
}
