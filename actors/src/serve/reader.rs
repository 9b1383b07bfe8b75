//! The read side of one client connection: whole request frames, with
//! request budget held only for bytes that have arrived (ADR 0145).
//!
//! The reader never takes a frame's declared length up front: it takes
//! budget a read's room at a time and reads at most that room. The room
//! grows with what has arrived ([`READ_BYTES_MIN`], then as much as is
//! buffered, at most [`READ_CHUNK_BYTES`] and at most the rest of the
//! frame), so what a connection holds is at most about twice what its
//! client actually sent, plus one small read: a 4-byte length declaring
//! 16 MiB costs 8 KiB. The budget comes
//! from the connection's own cap, its address's share and the broker's
//! budget (`common::budget`); when one is spent the reader waits, unread.
//!
//! Deadlines: a frame whose first byte has arrived must be complete within
//! `frame_read_timeout_ms`, and time spent waiting for budget counts (a
//! waiting connection holds what it has read, so it must not hold it for
//! ever); a connection with nothing buffered, nothing in flight and no
//! subscription is closed after `idle_timeout_ms`.
//!
//! Admission: a connection must read a whole first frame and, when
//! authentication is on, log in within `admission_timeout_ms` of being
//! accepted, or it is closed. Without it a host could park idle
//! connections, up to its address cap, for the whole `idle_timeout_ms`
//! without ever saying who it is (issue 39).

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use malachi_wire::frame::LEN_BYTES;
use malachi_wire::tls::CLIENT_HELLO_PREFIX;
use malachi_wire::{RequestFrame, ServerCodec, WireError};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tokio_util::codec::Decoder;

use crate::common::budget::{ConnectionBudget, Held};
use crate::serve::context::ServeCtx;
use crate::serve::stream::ReadSide;

/// Spare room the reader asks for when a frame's length is not in yet.
const READ_BYTES_MIN: usize = 8 << 10;
/// The most request budget the reader takes for one read.
const READ_CHUNK_BYTES: usize = 256 << 10;
/// Bytes of a request frame's header after its length.
const HEADER_AFTER_LEN_BYTES: usize = 6;

/// Why the reader stopped, or the frame it read with its request budget.
pub(crate) enum ReadOutcome {
    Frame(RequestFrame, Held),
    /// The client closed (or the socket failed).
    Closed,
    /// Nothing in flight, no subscription, no frame for `idle_timeout_ms`.
    Idle,
    /// A partial frame did not complete within `frame_read_timeout_ms`
    /// (waiting for budget included).
    SlowFrame,
    /// No whole first frame, or no login when authentication is on,
    /// within `admission_timeout_ms` of the accept.
    NotAdmitted,
    /// The stream cannot be framed any more.
    Invalid(WireError),
    /// A plaintext port's connection opened with a TLS ClientHello: a TLS
    /// client on the wrong port (ADR 0149), not a frame too large.
    TlsClient,
}

/// What the reader asks its connection while the client is quiet.
pub(crate) struct Quiet<I, L> {
    /// Nothing in flight and no subscription open.
    pub is_idle: I,
    /// Logged in, or authentication is off.
    pub logged_in: L,
}

/// What the reader needs to read one frame.
pub(crate) struct FrameReader {
    rd: ReadSide,
    buf: BytesMut,
    /// Whether a whole frame was read yet: only a connection's first
    /// bytes can be a TLS ClientHello.
    framed: bool,
    codec: ServerCodec,
    frame_timeout: Duration,
    idle_timeout: Duration,
    /// Until the connection is admitted, when it must be by.
    admit_by: Option<Instant>,
    /// Request budget covering the bytes in `buf` and the room the next
    /// read may fill; let go whenever `buf` is empty.
    share: Option<Held>,
}

impl FrameReader {
    pub(crate) fn new(rd: ReadSide, serving: &ServeCtx) -> FrameReader {
        FrameReader {
            rd,
            framed: false,
            buf: BytesMut::with_capacity(READ_BYTES_MIN),
            // The wire's `ServerCodec` never reserves a declared length.
            codec: ServerCodec::new(serving.limits.frame_bytes_max),
            frame_timeout: Duration::from_millis(serving.limits.frame_read_timeout_ms),
            idle_timeout: Duration::from_millis(serving.limits.idle_timeout_ms),
            admit_by: Some(
                Instant::now() + Duration::from_millis(serving.limits.admission_timeout_ms),
            ),
            share: None,
        }
    }

    /// The socket's read half, for the close's linger.
    pub(crate) fn into_read_half(self) -> ReadSide {
        self.rd
    }

    /// Whether the connection is still to be admitted, looked at once its
    /// deadline has passed: admitted once a whole frame was read and
    /// `logged_in` says so (always, with authentication off).
    fn admission_expired(&mut self, logged_in: &impl Fn() -> bool) -> bool {
        let Some(admit_by) = self.admit_by else {
            return false;
        };
        if self.framed && logged_in() {
            self.admit_by = None;
            return false;
        }
        Instant::now() >= admit_by
    }

    /// Reads one whole frame; see the module's doc for the budget and the
    /// deadlines.
    pub(crate) async fn next(
        &mut self,
        serving: &ServeCtx,
        budget: &ConnectionBudget,
        quiet: Quiet<impl Fn() -> bool, impl Fn() -> bool>,
    ) -> ReadOutcome {
        // Set while a frame is partly in: it must complete by then.
        let mut deadline: Option<Instant> = None;
        // Looked at between frames: a frame under way is bounded by its own
        // deadline, so a large first frame on a slow link is not cut.
        if self.admission_expired(&quiet.logged_in) {
            return ReadOutcome::NotAdmitted;
        }
        loop {
            if !self.framed && self.rd.is_plaintext() && self.buf.starts_with(&CLIENT_HELLO_PREFIX)
            {
                return ReadOutcome::TlsClient;
            }
            match self.codec.decode(&mut self.buf) {
                Err(e) => return ReadOutcome::Invalid(e),
                Ok(Some(frame)) => {
                    self.framed = true;
                    let held = self.frame_share(serving, budget, &frame).await;
                    return ReadOutcome::Frame(frame, held);
                }
                Ok(None) => {}
            }
            if self.buf.is_empty() {
                // Nothing buffered: hold no budget while the client is quiet.
                self.share = None;
                if let Some(outcome) = self.await_bytes(&quiet).await {
                    return outcome;
                }
                deadline = None;
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.frame_timeout);
            if let Some(outcome) = self.make_room(serving, budget, deadline).await {
                return outcome;
            }
            if let Some(outcome) = self.read(deadline).await {
                return outcome;
            }
        }
    }

    /// Waits until the client sends a byte (or closes), closing the
    /// connection if it stays idle for `idle_timeout_ms`, or is not
    /// admitted by its admission deadline.
    async fn await_bytes(
        &mut self,
        quiet: &Quiet<impl Fn() -> bool, impl Fn() -> bool>,
    ) -> Option<ReadOutcome> {
        let mut wake = Instant::now() + self.idle_timeout;
        loop {
            let until = self.admit_by.map_or(wake, |admit_by| admit_by.min(wake));
            tokio::select! {
                sent = self.rd.await_bytes(&mut self.buf) => return if sent {
                    None
                } else {
                    Some(ReadOutcome::Closed)
                },
                _ = tokio::time::sleep_until(until) => {
                    if self.admission_expired(&quiet.logged_in) {
                        return Some(ReadOutcome::NotAdmitted);
                    }
                    if Instant::now() >= wake {
                        if (quiet.is_idle)() {
                            return Some(ReadOutcome::Idle);
                        }
                        wake = Instant::now() + self.idle_timeout;
                    }
                }
            }
        }
    }

    /// Bytes the share covers beyond what is buffered.
    fn room(&self) -> usize {
        self.share
            .as_ref()
            .map_or(0, Held::bytes)
            .saturating_sub(self.buf.len())
    }

    /// The budget the next read asks for: as much as is buffered (at least
    /// [`READ_BYTES_MIN`], at most [`READ_CHUNK_BYTES`]), and no more than
    /// the rest of the frame once its length is in.
    fn chunk(&self) -> usize {
        let grown = self.buf.len().clamp(READ_BYTES_MIN, READ_CHUNK_BYTES);
        if self.buf.len() < LEN_BYTES {
            return grown;
        }
        let declared = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let rest = (LEN_BYTES + declared as usize).saturating_sub(self.buf.len());
        grown.min(rest).max(1)
    }

    /// Takes budget for the next read if the share has no room left,
    /// waiting (unread) within the frame's deadline.
    async fn make_room(
        &mut self,
        serving: &ServeCtx,
        budget: &ConnectionBudget,
        deadline: Instant,
    ) -> Option<ReadOutcome> {
        if self.room() > 0 {
            return None;
        }
        // Frames split off whole units, so the share can fall short of the
        // partial frame still buffered: the shortfall is taken too, and the
        // room after it is at least `chunk` (the buffer only ever holds part
        // of one frame here: whole ones are decoded first).
        let held = self.share.as_ref().map_or(0, Held::bytes);
        let want = self.chunk() + self.buf.len().saturating_sub(held);
        let budgets = &serving.port.budgets;
        let more = match budget.try_request(budgets, want) {
            Some(more) => more,
            // Waiting, it holds what it read so far and reads no more, so a
            // peer's close is looked for here: without it, a client gone
            // mid-frame kept its share until the frame's deadline
            // (`tests/client_port_memory.rs`).
            None => tokio::select! {
                more = budget.request(budgets, want) => more,
                _ = tokio::time::sleep_until(deadline) => return Some(ReadOutcome::SlowFrame),
                () = peer_closed(&self.rd) => return Some(ReadOutcome::Closed),
            },
        };
        match self.share.as_mut() {
            Some(share) => share.absorb(more),
            None => self.share = Some(more),
        }
        None
    }

    /// One read of at most the share's room, within the frame's deadline.
    async fn read(&mut self, deadline: Instant) -> Option<ReadOutcome> {
        let room = self.room();
        assert!(room > 0, "the reader reads only into budget it holds");
        if self.buf.capacity() - self.buf.len() < room {
            self.buf.reserve(room);
        }
        let mut limited = (&mut self.buf).limit(room);
        let read = tokio::select! {
            read = self.rd.read_buf(&mut limited) => read,
            _ = tokio::time::sleep_until(deadline) => return Some(ReadOutcome::SlowFrame),
        };
        match read {
            Ok(0) | Err(_) => Some(ReadOutcome::Closed),
            Ok(_) => None,
        }
    }

    /// The budget a decoded frame takes with it: its part of the reader's
    /// share (the rest stays with the bytes still buffered).
    async fn frame_share(
        &mut self,
        serving: &ServeCtx,
        budget: &ConnectionBudget,
        frame: &RequestFrame,
    ) -> Held {
        let bytes = LEN_BYTES + HEADER_AFTER_LEN_BYTES + frame.payload.len();
        match self.share.as_mut() {
            Some(share) => share.split(bytes),
            // Every read is covered, so this is not reached; counted anyway.
            None => budget.request(&serving.port.budgets, bytes).await,
        }
    }
}

/// How often a reader waiting for budget looks for its peer's close.
const PEER_CLOSED_CHECK_MS: u64 = 250;

/// Returns once the peer has closed its side (EPOLLRDHUP), even with bytes
/// still unread; never while it is open. Polled every
/// `PEER_CLOSED_CHECK_MS`: readiness stays set while unread bytes wait, so
/// waiting on it alone would spin.
/// Through TLS, the raw socket's readiness is looked at (`stream.rs`).
async fn peer_closed(rd: &ReadSide) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(PEER_CLOSED_CHECK_MS)).await;
        if rd.closed_now() {
            return;
        }
    }
}
