//! One connection to one broker: a writer task, a reader task, and the map of
//! correlation ids waiting for an answer.
//!
//! Requests are pipelined: the caller registers its correlation id, hands the
//! frame to the writer and awaits a oneshot that the reader completes when
//! the matching response arrives, in whatever order the broker answers. The
//! in-flight window is a semaphore: a caller waits for a permit before it
//! sends, so a slow broker pushes back on callers instead of growing a queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::codec::{FramedRead, FramedWrite};
use tracing::{debug, warn};

use super::{ClientConfig, ClientError};
use crate::api::ApiKey;
use crate::error::{ErrorBody, ErrorCode};
use crate::frame::{ClientCodec, RequestFrame, ResponseFrame};
use crate::messages::Message as _;
use crate::tls::ClientTls;

/// Who waits for frames with a given correlation id.
enum Waiter {
    /// A unary request: exactly one response.
    Unary(oneshot::Sender<ResponseFrame>),
    /// A subscription: many pushes, bounded by the channel's capacity.
    Stream(mpsc::Sender<ResponseFrame>),
}

type Pending = Arc<Mutex<HashMap<u32, Waiter>>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it;
    // what it guards is still consistent (every operation is one call).
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes a correlation id from the pending map when dropped, so a request
/// that timed out or was cancelled leaves nothing behind and its late
/// response is dropped by the reader.
pub(crate) struct PendingGuard {
    pending: Pending,
    id: u32,
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        lock(&self.pending).remove(&self.id);
    }
}

impl std::fmt::Debug for PendingGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingGuard")
            .field("id", &self.id)
            .finish()
    }
}

pub(crate) struct Connection {
    addr: String,
    writer: mpsc::Sender<RequestFrame>,
    pending: Pending,
    window: Arc<Semaphore>,
    next_id: AtomicU32,
    /// Set once the connection may take no new request: its stream ended,
    /// or the broker said its session ended (it closes after its answers).
    closed: Arc<AtomicBool>,
    /// When the login's session ends by itself (a token's `exp`, ADR
    /// 0154): past it, no new request goes on this connection.
    session_ends_at: OnceLock<tokio::time::Instant>,
    /// The error the broker said goodbye with (a frame on the reserved
    /// correlation id 0, e.g. `busy` past its connection limit), so calls
    /// cut off by the close report it instead of a bare "connection closed".
    goodbye: Goodbye,
    /// Api keys the broker shares no version with (set once, after `api_versions`).
    unsupported: OnceLock<Vec<u16>>,
    tasks: [JoinHandle<()>; 2],
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Connection {
    /// Opens a connection to `addr`, the TCP connect bounded by
    /// `connect_timeout_ms` (the config's, or less when a call's deadline
    /// is nearer).
    pub(crate) async fn open(
        addr: &str,
        config: &ClientConfig,
        connect_timeout_ms: u64,
    ) -> Result<Connection, ClientError> {
        let connect = TcpStream::connect(addr);
        let stream = tokio::time::timeout(Duration::from_millis(connect_timeout_ms), connect)
            .await
            .map_err(|_| ClientError::ConnectTimeout {
                addr: addr.to_owned(),
                timeout_ms: connect_timeout_ms,
            })?
            .map_err(|source| ClientError::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        // Small request frames must not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let (read_half, write_half) = match &config.tls {
            None => {
                let (rd, wr) = stream.into_split();
                (Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf)
            }
            Some(tls) => {
                let stream = handshake(addr, tls, stream, connect_timeout_ms).await?;
                let (rd, wr) = tokio::io::split(stream);
                (Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf)
            }
        };
        let codec = ClientCodec::new(config.frame_bytes_max);
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let (writer, mut queue) =
            mpsc::channel::<RequestFrame>(config.inflight_requests_max.max(1));

        let writer_closed = closed.clone();
        let writer_pending = pending.clone();
        let writer_addr = addr.to_owned();
        let write_task = tokio::spawn(async move {
            let mut sink = FramedWrite::new(write_half, codec);
            while let Some(frame) = queue.recv().await {
                // Feed everything already queued, then flush once: pipelined
                // requests share system calls.
                let mut result = sink.feed(frame).await;
                while result.is_ok() {
                    match queue.try_recv() {
                        Ok(frame) => result = sink.feed(frame).await,
                        Err(_) => break,
                    }
                }
                if let Err(error) = result.and(sink.flush().await) {
                    warn!(addr = %writer_addr, %error, "connection write failed");
                    break;
                }
            }
            writer_closed.store(true, Ordering::Release);
            // Requests already sent may never be answered on a broken
            // stream: wake their callers now rather than at their timeout.
            lock(&writer_pending).clear();
        });

        let goodbye: Goodbye = Arc::new(Mutex::new(None));
        let reader_goodbye = goodbye.clone();
        let reader_pending = pending.clone();
        let reader_closed = closed.clone();
        let reader_addr = addr.to_owned();
        let read_task = tokio::spawn(async move {
            let mut frames = FramedRead::new(read_half, codec);
            loop {
                match frames.next().await {
                    Some(Ok(frame)) if frame.correlation_id == GOODBYE_CORRELATION_ID => {
                        note_goodbye(&reader_goodbye, &reader_addr, frame);
                    }
                    Some(Ok(frame)) => {
                        if ends_session(&frame) {
                            // The broker closes after its answers: the
                            // answers still due are read, no new request
                            // is sent here (ADR 0154).
                            debug!(addr = %reader_addr, "the broker ended the session");
                            reader_closed.store(true, Ordering::Release);
                        }
                        dispatch(&reader_pending, frame)
                    }
                    Some(Err(error)) => {
                        warn!(addr = %reader_addr, %error, "connection read failed");
                        break;
                    }
                    None => {
                        debug!(addr = %reader_addr, "connection closed by the broker");
                        break;
                    }
                }
            }
            reader_closed.store(true, Ordering::Release);
            // Dropping every waiter wakes its caller with a closed connection.
            lock(&reader_pending).clear();
        });

        Ok(Connection {
            addr: addr.to_owned(),
            writer,
            pending,
            window: Arc::new(Semaphore::new(config.inflight_requests_max.max(1))),
            next_id: AtomicU32::new(1),
            closed,
            session_ends_at: OnceLock::new(),
            goodbye,
            unsupported: OnceLock::new(),
            tasks: [write_task, read_task],
        })
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Record the keys negotiation found no common version for.
    pub(crate) fn set_unsupported(&self, keys: Vec<u16>) {
        let _ = self.unsupported.set(keys);
    }

    fn supports(&self, api_key: ApiKey) -> bool {
        self.unsupported
            .get()
            .is_none_or(|keys| !keys.contains(&api_key.code()))
    }

    /// Send a request nobody waits for (a best-effort cancel from a `Drop`).
    pub(crate) fn send_detached(&self, api_key: ApiKey, payload: Bytes) {
        let correlation_id = {
            let pending = lock(&self.pending);
            loop {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                if id != GOODBYE_CORRELATION_ID && !pending.contains_key(&id) {
                    break id;
                }
            }
        };
        let frame = RequestFrame {
            api_key: api_key.code(),
            correlation_id,
            payload,
        };
        if self.writer.try_send(frame).is_err() {
            debug!(addr = %self.addr, "could not queue a detached request");
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Records the login's session lifetime (from the login's answer).
    pub(crate) fn set_session_lifetime(&self, lifetime_ms: u64) {
        let ends_at = tokio::time::Instant::now() + Duration::from_millis(lifetime_ms);
        let _ = self.session_ends_at.set(ends_at);
    }

    /// Whether a new request may go on this connection: it is open and
    /// its session has not ended.
    pub(crate) fn usable(&self) -> bool {
        !self.is_closed()
            && self
                .session_ends_at
                .get()
                .is_none_or(|ends_at| tokio::time::Instant::now() < *ends_at)
    }

    /// A correlation id not currently pending. Ids wrap; skipping live ones
    /// keeps a long subscription's id from being reused under it.
    fn register(&self, waiter: Waiter) -> PendingGuard {
        let mut pending = lock(&self.pending);
        let id = loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != GOODBYE_CORRELATION_ID && !pending.contains_key(&id) {
                break id;
            }
        };
        pending.insert(id, waiter);
        PendingGuard {
            pending: self.pending.clone(),
            id,
        }
    }

    /// Send one request and wait for its response, within the window and the timeout.
    pub(crate) async fn call(
        &self,
        api_key: ApiKey,
        payload: Bytes,
        timeout_ms: u64,
    ) -> Result<ResponseFrame, ClientError> {
        if !self.supports(api_key) {
            return Err(ClientError::Unsupported {
                addr: self.addr.clone(),
                api: api_key.name(),
            });
        }
        let exchange = async {
            let _permit = self
                .window
                .acquire()
                .await
                .map_err(|_| self.closed_error())?;
            let (tx, rx) = oneshot::channel();
            let guard = self.register(Waiter::Unary(tx));
            let frame = RequestFrame {
                api_key: api_key.code(),
                correlation_id: guard.id,
                payload,
            };
            self.writer
                .send(frame)
                .await
                .map_err(|_| self.closed_error())?;
            let response = rx.await.map_err(|_| self.closed_error())?;
            drop(guard);
            Ok(response)
        };
        tokio::time::timeout(Duration::from_millis(timeout_ms), exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                api: api_key.name(),
                timeout_ms,
            })?
    }

    /// Queue one request for the writer and return once it is queued, so
    /// requests submitted one after the other go out in that order (an
    /// ordered producer's pipeline). Await the answer with
    /// [`Submitted::response`].
    pub(crate) async fn submit(
        self: &Arc<Self>,
        api_key: ApiKey,
        payload: Bytes,
    ) -> Result<Submitted, ClientError> {
        if !self.supports(api_key) {
            return Err(ClientError::Unsupported {
                addr: self.addr.clone(),
                api: api_key.name(),
            });
        }
        let permit = Arc::clone(&self.window)
            .acquire_owned()
            .await
            .map_err(|_| self.closed_error())?;
        let (tx, rx) = oneshot::channel();
        let guard = self.register(Waiter::Unary(tx));
        let frame = RequestFrame {
            api_key: api_key.code(),
            correlation_id: guard.id,
            payload,
        };
        self.writer
            .send(frame)
            .await
            .map_err(|_| self.closed_error())?;
        Ok(Submitted {
            connection: Arc::clone(self),
            rx,
            _guard: guard,
            _permit: permit,
            api: api_key.name(),
        })
    }

    /// Send a request whose answers are a stream of frames (subscribe).
    /// The returned guard keeps the subscription registered.
    pub(crate) async fn open_stream(
        &self,
        api_key: ApiKey,
        payload: Bytes,
        frames_max: usize,
    ) -> Result<(PendingGuard, mpsc::Receiver<ResponseFrame>), ClientError> {
        let (tx, rx) = mpsc::channel(frames_max.max(1));
        let guard = self.register(Waiter::Stream(tx));
        let frame = RequestFrame {
            api_key: api_key.code(),
            correlation_id: guard.id,
            payload,
        };
        self.writer
            .send(frame)
            .await
            .map_err(|_| self.closed_error())?;
        Ok((guard, rx))
    }

    fn closed_error(&self) -> ClientError {
        // Only a retriable goodbye (`busy`, `shutting_down`) speaks for every
        // call the close cut off: a `frame_too_large` goodbye is about one
        // bad frame, and the valid calls pipelined with it stay retriable.
        // `unauthorized` refuses the whole connection (a plaintext client
        // on a TLS port): every call it cut off reports it.
        if let Some((code, body)) = lock(&self.goodbye).clone()
            && (code.retriable() || code == ErrorCode::Unauthorized)
        {
            return ClientError::Server {
                api: "connection",
                code,
                message: body.message,
                leader_hint: body.leader_hint,
                retry_after_ms: body.retry_after_ms,
            };
        }
        ClientError::ConnectionClosed {
            addr: self.addr.clone(),
        }
    }
}

impl PendingGuard {
    pub(crate) fn id(&self) -> u32 {
        self.id
    }
}

/// The read side of a connection, plaintext or TLS.
type ReadHalf = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// The write side of a connection, plaintext or TLS.
type WriteHalf = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// The TLS handshake with the broker at `addr`, bounded by the connect
/// timeout. A broker that closes during it most likely serves a plaintext
/// port (it closes a TLS client); a certificate it cannot prove is named.
async fn handshake(
    addr: &str,
    tls: &ClientTls,
    stream: TcpStream,
    timeout_ms: u64,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ClientError> {
    let name = tls.server_name_for(addr).map_err(|e| ClientError::Tls {
        addr: addr.to_owned(),
        reason: e.to_string(),
    })?;
    let connect = tls.connector().connect(name, stream);
    let shaken = tokio::time::timeout(Duration::from_millis(timeout_ms), connect)
        .await
        .map_err(|_| ClientError::ConnectTimeout {
            addr: addr.to_owned(),
            timeout_ms,
        })?;
    shaken.map_err(|e| {
        let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "the broker closed the connection during the TLS handshake: its client port is likely plaintext (connect without --tls-ca)".to_owned()
        } else {
            format!("TLS handshake failed: {e}")
        };
        ClientError::Tls {
            addr: addr.to_owned(),
            reason,
        }
    })
}

/// The correlation id no request uses: a broker sends a frame on it only to
/// say why it is closing the connection (docs/protocol.md).
pub(crate) const GOODBYE_CORRELATION_ID: u32 = 0;

type Goodbye = Arc<Mutex<Option<(ErrorCode, ErrorBody)>>>;

/// Keep the reason of a goodbye frame for the calls the close will cut off.
fn note_goodbye(goodbye: &Goodbye, addr: &str, frame: ResponseFrame) {
    if frame.error_code == ErrorCode::None {
        debug!(
            addr,
            "ignored a success frame on the reserved correlation id 0"
        );
        return;
    }
    let body = ErrorBody::decode(frame.payload).unwrap_or_else(|_| ErrorBody {
        message: "the broker closed the connection".to_owned(),
        ..ErrorBody::default()
    });
    debug!(addr, code = %frame.error_code, message = %body.message, "the broker said goodbye");
    *lock(goodbye) = Some((frame.error_code, body));
}

/// Whether `frame` says the connection's session ended: `unauthorized`
/// with a message starting with a session-ended code (ADR 0154).
fn ends_session(frame: &ResponseFrame) -> bool {
    frame.error_code == ErrorCode::Unauthorized
        && ErrorBody::decode(frame.payload.clone())
            .is_ok_and(|body| crate::auth::session_ended_code(&body.message).is_some())
}

/// Hand a frame to whoever waits for its correlation id.
fn dispatch(pending: &Pending, frame: ResponseFrame) {
    let mut map = lock(pending);
    let id = frame.correlation_id;
    match map.remove(&id) {
        Some(Waiter::Unary(tx)) => {
            // The caller may have given up in the meantime; that is fine.
            let _ = tx.send(frame);
        }
        Some(Waiter::Stream(tx)) => match tx.try_send(frame) {
            Ok(()) => {
                map.insert(id, Waiter::Stream(tx));
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                // The broker pushed more than the credit allows (or the
                // consumer stopped reading). Dropping the sender ends the
                // subscription rather than blocking every other response.
                warn!(
                    correlation_id = id,
                    "subscription overran its buffer; ending it"
                );
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        },
        None => {
            debug!(
                correlation_id = id,
                "dropped a response nobody waits for (late after a timeout, or unknown)"
            );
        }
    }
}

/// A request on its way (see [`Connection::submit`]).
pub(crate) struct Submitted {
    connection: Arc<Connection>,
    rx: oneshot::Receiver<ResponseFrame>,
    _guard: PendingGuard,
    _permit: tokio::sync::OwnedSemaphorePermit,
    api: &'static str,
}

impl Submitted {
    /// The answer, within `timeout_ms` of now.
    pub(crate) async fn response(self, timeout_ms: u64) -> Result<ResponseFrame, ClientError> {
        let Submitted {
            connection,
            rx,
            api,
            ..
        } = self;
        match tokio::time::timeout(Duration::from_millis(timeout_ms), rx).await {
            Err(_) => Err(ClientError::Timeout { api, timeout_ms }),
            Ok(Err(_)) => Err(connection.closed_error()),
            Ok(Ok(frame)) => Ok(frame),
        }
    }

    pub(crate) fn addr(&self) -> &str {
        self.connection.addr()
    }
}
