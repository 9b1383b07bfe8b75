//! A client connection's socket, plaintext or TLS (ADR 0149), and its two
//! halves for the reader and the writer.
//!
//! On a TLS port [`open`] runs the handshake before the connection reads
//! a frame, bounded by `tls.handshake_timeout_ms`, while the connection
//! holds its place in the port's limits (ADR 0145) like any other. A
//! client whose first byte is not a TLS handshake record is a plaintext
//! client: it gets one `unauthorized` goodbye frame saying the port
//! speaks TLS, and the close. Every failure is logged and counted in
//! `malachi_tls_handshake_failures_total{reason}`.
//!
//! The read side keeps what the reader needs of the raw socket through
//! TLS: a duplicate of its descriptor, registered on its own, on which
//! the peer's close (EPOLLRDHUP) is seen while the TLS stream is not
//! polled (`reader.rs`'s wait for budget).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

use std::time::Instant;

use crate::common::peer_identity::PeerIdentity;
use crate::common::tls::{HandshakeFailure, Opened};
use crate::serve::context::ServeCtx;
use malachi_wire::ErrorCode;

type Tls = TlsStream<TcpStream>;

/// An accepted client socket, after its TLS handshake if the port has TLS.
pub(crate) enum ClientStream {
    Plain(TcpStream),
    Tls(Box<Tls>),
}

/// What a plaintext client on a TLS port is told before the close.
pub(crate) const PLAINTEXT_ON_TLS_MESSAGE: &str =
    "this broker's client port speaks TLS only: connect with TLS (the CLI's --tls-ca)";

/// The socket `stream` becomes: itself on a plaintext port, its TLS stream
/// after the handshake on a TLS port; `None` if the handshake failed
/// (logged and counted).
pub(crate) async fn open(
    serving: &ServeCtx,
    stream: TcpStream,
    peer: Option<SocketAddr>,
) -> Option<ClientStream> {
    let Some(tls) = serving.tls.as_ref() else {
        return Some(ClientStream::Plain(stream));
    };
    match tls.accept(stream).await {
        Ok(Opened::Tls(tls)) => Some(ClientStream::Tls(tls)),
        Ok(Opened::Plain(stream)) => {
            // `tls.client_ports = "accept"`: a step of a rolling move.
            tls.count_plaintext("client");
            Some(ClientStream::Plain(stream))
        }
        Err((failure, stream)) => {
            serving.metrics.tls_handshake_failure(failure.label());
            if failure == HandshakeFailure::Plaintext {
                if let Some(unlogged) = serving
                    .wrong_protocol
                    .plaintext_on_tls
                    .lock()
                    .admit(Instant::now())
                {
                    warn!(?peer, unlogged, "a plaintext client on a TLS port; closed");
                }
                if let Some(stream) = stream {
                    let frame = super::listener::goodbye_frame(
                        ErrorCode::Unauthorized,
                        PLAINTEXT_ON_TLS_MESSAGE,
                        None,
                    );
                    super::listener::refuse(&stream, &frame);
                }
            } else {
                debug!(?peer, reason = failure.label(), "tls handshake failed");
            }
            None
        }
    }
}

/// A plaintext port's connection opened with a TLS ClientHello: counted,
/// logged (rate-limited), and the caller closes it.
pub(crate) fn tls_client_on_plaintext(serving: &ServeCtx, peer: Option<SocketAddr>) {
    serving.metrics.tls_client_on_plaintext();
    if let Some(unlogged) = serving
        .wrong_protocol
        .tls_on_plaintext
        .lock()
        .admit(Instant::now())
    {
        warn!(?peer, unlogged, "a TLS client on a plaintext port; closed");
    }
}

impl ClientStream {
    /// The identity of the client's verified certificate (mTLS), if it
    /// sent one.
    pub(crate) fn peer_identity(&self) -> Option<PeerIdentity> {
        match self {
            ClientStream::Plain(_) => None,
            ClientStream::Tls(tls) => {
                let certs = tls.get_ref().1.peer_certificates()?;
                PeerIdentity::of(certs.first()?)
            }
        }
    }

    /// The reader's and the writer's halves.
    pub(crate) fn into_split(self) -> io::Result<(ReadSide, WriteSide)> {
        match self {
            ClientStream::Plain(tcp) => {
                let (rd, wr) = tcp.into_split();
                Ok((ReadSide::Plain(rd), WriteSide::Plain(wr)))
            }
            ClientStream::Tls(tls) => {
                let raw = tls.get_ref().0.as_fd().try_clone_to_owned()?;
                let raw = TcpStream::from_std(std::net::TcpStream::from(raw))?;
                let (rd, wr) = tokio::io::split(*tls);
                Ok((ReadSide::Tls { rd, raw }, WriteSide::Tls(wr)))
            }
        }
    }
}

/// The read half of a client connection.
pub(crate) enum ReadSide {
    Plain(OwnedReadHalf),
    Tls {
        rd: tokio::io::ReadHalf<Tls>,
        /// The socket's descriptor, duplicated and registered on its
        /// own, for its close; never read or written.
        raw: TcpStream,
    },
}

impl ReadSide {
    /// Whether this is a plaintext socket (where a TLS ClientHello is a
    /// client on the wrong port).
    pub(crate) fn is_plaintext(&self) -> bool {
        matches!(self, ReadSide::Plain(_))
    }

    /// Waits until the client sends a byte; false once it has closed. A
    /// plaintext socket only peeks; through TLS, plaintext may be waiting
    /// in rustls' buffer where no peek sees it, so one byte is read into
    /// `buf` (the reader then takes budget for it with the next read).
    pub(crate) async fn await_bytes(&mut self, buf: &mut BytesMut) -> bool {
        match self {
            ReadSide::Plain(rd) => {
                let mut one = [0u8; 1];
                matches!(rd.peek(&mut one).await, Ok(n) if n > 0)
            }
            ReadSide::Tls { rd, .. } => {
                let mut limited = buf.limit(1);
                matches!(rd.read_buf(&mut limited).await, Ok(n) if n > 0)
            }
        }
    }

    /// Whether the peer has closed its side (EPOLLRDHUP) or the socket
    /// failed, as readiness shows it now, without waiting.
    pub(crate) fn closed_now(&self) -> bool {
        use futures::FutureExt;
        let interest = tokio::io::Interest::READABLE;
        match self {
            ReadSide::Plain(rd) => match rd.ready(interest).now_or_never() {
                Some(Ok(ready)) => ready.is_read_closed(),
                Some(Err(_)) => true,
                None => false,
            },
            ReadSide::Tls { raw, .. } => match raw.ready(interest).now_or_never() {
                Some(Ok(ready)) => ready.is_read_closed(),
                Some(Err(_)) => true,
                None => false,
            },
        }
    }
}

impl AsyncRead for ReadSide {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadSide::Plain(rd) => Pin::new(rd).poll_read(cx, buf),
            ReadSide::Tls { rd, .. } => Pin::new(rd).poll_read(cx, buf),
        }
    }
}

/// The write half of a client connection.
pub(crate) enum WriteSide {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<Tls>),
}

impl AsyncWrite for WriteSide {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteSide::Plain(wr) => Pin::new(wr).poll_write(cx, buf),
            WriteSide::Tls(wr) => Pin::new(wr).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteSide::Plain(wr) => Pin::new(wr).poll_write_vectored(cx, bufs),
            WriteSide::Tls(wr) => Pin::new(wr).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteSide::Plain(wr) => wr.is_write_vectored(),
            WriteSide::Tls(wr) => wr.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteSide::Plain(wr) => Pin::new(wr).poll_flush(cx),
            WriteSide::Tls(wr) => Pin::new(wr).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteSide::Plain(wr) => Pin::new(wr).poll_shutdown(cx),
            WriteSide::Tls(wr) => Pin::new(wr).poll_shutdown(cx),
        }
    }
}
