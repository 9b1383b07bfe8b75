//! An admin connection's socket, plaintext or TLS (ADR 0149). The TLS
//! handshake runs on the connection's first read or write, never on the
//! accept path (one slow handshake must not hold the accept loop), and is
//! bounded by the connection's `admin_read_timeout_ms` deadline like a
//! request head (`http.rs`'s `DeadlineIo`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use crate::common::peer_identity::PeerIdentity;
use crate::common::tls::ServerTls;

/// The principal name a connection's verified client certificate maps
/// to (ADR 0149 §8), set once its TLS handshake finished; the handlers
/// read it through `access::AdminPeer`.
pub(crate) type CertPrincipal = Arc<OnceLock<Option<String>>>;

/// The socket of one admin connection.
pub(crate) enum AdminStream {
    Plain(TcpStream),
    /// `tls.client_ports = "accept"` (ADR 0162): the first byte, peeked
    /// on the first read or write, chooses TLS or plaintext.
    Sniffing(Option<TcpStream>, Arc<ServerTls>, CertPrincipal),
    /// The TLS handshake, driven by the first read or write.
    Handshaking(Box<tokio_rustls::Accept<TcpStream>>, CertPrincipal),
    Tls(Box<TlsStream<TcpStream>>),
    /// The handshake failed: every later call fails.
    Failed,
}

impl std::fmt::Debug for AdminStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AdminStream::Plain(_) => "Plain",
            AdminStream::Sniffing(..) => "Sniffing",
            AdminStream::Handshaking(..) => "Handshaking",
            AdminStream::Tls(_) => "Tls",
            AdminStream::Failed => "Failed",
        })
    }
}

impl AdminStream {
    /// The connection's socket; a verified client certificate's
    /// principal lands in `principal` once the handshake is done.
    pub(crate) fn new(
        stream: TcpStream,
        tls: Option<&Arc<ServerTls>>,
        principal: CertPrincipal,
    ) -> AdminStream {
        match tls {
            None => AdminStream::Plain(stream),
            Some(tls) if tls.takes_plaintext => {
                AdminStream::Sniffing(Some(stream), Arc::clone(tls), principal)
            }
            Some(tls) => {
                AdminStream::Handshaking(Box::new(tls.acceptor().accept(stream)), principal)
            }
        }
    }

    /// Peeks the first byte, if the port takes both: a TLS handshake
    /// record starts the handshake, anything else is plaintext HTTP.
    fn poll_sniffed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let AdminStream::Sniffing(stream, tls, principal) = self else {
            return Poll::Ready(Ok(()));
        };
        let Some(socket) = stream.as_ref() else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        let mut first = [0u8; 1];
        let mut buf = ReadBuf::new(&mut first);
        ready!(socket.poll_peek(cx, &mut buf))?;
        let tls_hello = buf.filled().first() == Some(&malachi_wire::tls::CLIENT_HELLO_PREFIX[0]);
        let (Some(socket), tls, principal) = (stream.take(), Arc::clone(tls), principal.clone())
        else {
            return Poll::Ready(Err(io::ErrorKind::NotConnected.into()));
        };
        *self = if tls_hello {
            AdminStream::Handshaking(Box::new(tls.acceptor().accept(socket)), principal)
        } else {
            tls.count_plaintext("admin");
            AdminStream::Plain(socket)
        };
        Poll::Ready(Ok(()))
    }

    /// Drives the handshake, if one is under way; ready once the stream
    /// can carry bytes.
    fn poll_established(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_sniffed(cx))?;
        if let AdminStream::Handshaking(accept, principal) = self {
            match ready!(Pin::new(accept.as_mut()).poll(cx)) {
                Ok(tls) => {
                    let name = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| PeerIdentity::of(certs.first()?))
                        .and_then(|identity| identity.principal().map(str::to_owned));
                    let _ = principal.set(name);
                    *self = AdminStream::Tls(Box::new(tls));
                }
                Err(e) => {
                    debug!(error = %e, "admin tls handshake failed");
                    *self = AdminStream::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        match self {
            AdminStream::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the admin connection's TLS handshake failed",
            ))),
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncRead for AdminStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_established(cx))?;
        match this {
            AdminStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            AdminStream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
            _ => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for AdminStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_established(cx))?;
        match this {
            AdminStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            AdminStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
            _ => Poll::Ready(Ok(0)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_established(cx))?;
        match this {
            AdminStream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            AdminStream::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
            _ => Poll::Ready(Ok(0)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            AdminStream::Plain(tcp) => tcp.is_write_vectored(),
            AdminStream::Tls(tls) => tls.is_write_vectored(),
            _ => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AdminStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            AdminStream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AdminStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            AdminStream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}
