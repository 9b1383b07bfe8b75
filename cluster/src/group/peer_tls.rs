//! TLS between brokers (ADR 0151): mutual authentication under the
//! cluster's CA on the cluster port, and the same handshake for the node
//! fabric's connections.
//!
//! [`PeerTls`] holds one client config (the broker's certificate offered
//! to the server, the server verified against the cluster CA and the name
//! dialled) and one server config (a client certificate required and
//! verified against the same CA). Both are built by the broker
//! (`actors/src/common/cluster_tls.rs`) with aws-lc-rs, so this crate only
//! drives handshakes: [`PeerTls::connect`] for a dial and
//! [`PeerTls::accept`] for an accepted socket, each within
//! `handshake_timeout`. The cookie handshake (`handshake`) still runs
//! inside the TLS session.
//!
//! A refused connection is reported to the [`PeerTlsObserver`] (the
//! broker counts and logs it) with a [`TlsRefusal`] naming why.
//!
//! A rolling move from plaintext (ADR 0162): in [`PeerTlsMode::Accept`]
//! a broker dials plaintext and takes both, in [`PeerTlsMode::Send`] it
//! dials TLS and takes both, in [`PeerTlsMode::Required`] TLS only. An
//! accepted socket is told apart by its first byte, a TLS handshake record
//! (0x16) or not; a peer that says nothing for [`PLAINTEXT_SNIFF_MS`] is
//! taken as plaintext, since the cookie handshake's server speaks first
//! while a TLS client sends its ClientHello at once.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The read half of a connection between brokers, plaintext or TLS.
pub type PeerRead = Box<dyn AsyncRead + Send + Unpin>;
/// The write half of a connection between brokers, plaintext or TLS.
pub type PeerWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// A TLS record's first byte when it carries a handshake (a ClientHello).
const HANDSHAKE_RECORD: u8 = 0x16;

/// In a mode that takes both, how long an accepted peer may stay silent
/// before it is taken as plaintext (the cookie handshake's server speaks
/// first). A TLS dialer writes its ClientHello in the poll that connects,
/// so it arrives well within this; one that does not is refused by the
/// mismatch and dials again.
pub const PLAINTEXT_SNIFF_MS: u64 = 50;

/// What a broker speaks to other brokers (ADR 0151, and ADR 0162 for the
/// rolling move from plaintext).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerTlsMode {
    /// Dials plaintext; takes TLS and plaintext.
    Accept,
    /// Dials TLS; takes TLS and plaintext.
    Send,
    /// Dials TLS; takes TLS only.
    Required,
}

/// An accepted connection between brokers after its first bytes: a TLS
/// session, or a plaintext socket where the mode takes plaintext.
pub enum Accepted {
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Plain(TcpStream),
}

impl fmt::Debug for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accepted::Tls(_) => "Accepted::Tls",
            Accepted::Plain(_) => "Accepted::Plain",
        })
    }
}

/// Why a connection between brokers was refused before or during TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRefusal {
    /// The peer spoke plaintext to a TLS port.
    Plaintext,
    /// The handshake did not finish within its deadline.
    Timeout,
    /// The peer closed before the handshake finished.
    Closed,
    /// rustls refused it: no certificate, one from another CA, self-signed,
    /// expired, a wrong name, or a fatal alert from the peer.
    Refused,
    /// The certificate is the cluster CA's, but for another node than the
    /// one dialled, or than the one the peer proved it is in the cookie
    /// handshake (`tls.cluster_node_identity`, ADR 0155).
    NodeIdentity,
}

impl TlsRefusal {
    /// The `reason` label of the refusal's counter.
    pub fn label(self) -> &'static str {
        match self {
            TlsRefusal::Plaintext => "plaintext",
            TlsRefusal::Timeout => "timeout",
            TlsRefusal::Closed => "closed",
            TlsRefusal::Refused => "refused",
            TlsRefusal::NodeIdentity => "node_identity",
        }
    }
}

/// Where refused handshakes are reported: the broker counts and logs them.
pub trait PeerTlsObserver: Send + Sync + 'static {
    /// A connection on `port` (`"cluster"` or `"fabric"`) was refused for
    /// `reason`: accepted from `peer` (`direction` `"inbound"`) or dialled
    /// to it (`"outbound"`); `detail` is rustls' word, if any.
    fn refused(
        &self,
        port: &'static str,
        direction: &'static str,
        peer: SocketAddr,
        reason: TlsRefusal,
        detail: &str,
    );

    /// A plaintext connection on `port` from `peer` was taken, in a step
    /// of a rolling move that takes both (ADR 0162).
    fn plaintext_accepted(&self, port: &'static str, peer: SocketAddr);
}

/// The node ids a peer's verified certificate is for (ADR 0155): read by
/// the broker, which parses certificates; empty when it names none.
pub trait CertifiedNodes: Send + Sync + 'static {
    fn nodes(&self, leaf: &CertificateDer<'_>) -> Vec<u64>;
}

/// TLS between brokers: the configs both sides use, and the deadline.
#[derive(Clone)]
pub struct PeerTls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    /// The name every broker's certificate must carry; unset, the ip
    /// address dialled (checked against the certificate's IP SANs).
    server_name: Option<ServerName<'static>>,
    handshake_timeout: Duration,
    mode: PeerTlsMode,
    observer: Option<Arc<dyn PeerTlsObserver>>,
    /// Set when a peer's certificate must be for the node it is (ADR 0155).
    node_identity: Option<Arc<dyn CertifiedNodes>>,
}

impl fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerTls")
            .field("server_name", &self.server_name)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("mode", &self.mode)
            .field("node_identity", &self.node_identity.is_some())
            .finish_non_exhaustive()
    }
}

impl PartialEq for PeerTls {
    fn eq(&self, other: &PeerTls) -> bool {
        Arc::ptr_eq(&self.client, &other.client)
            && Arc::ptr_eq(&self.server, &other.server)
            && self.server_name == other.server_name
            && self.handshake_timeout == other.handshake_timeout
            && self.mode == other.mode
            && self.node_identity.is_some() == other.node_identity.is_some()
    }
}

impl Eq for PeerTls {}

impl PeerTls {
    /// TLS with these configs: `client` must offer a certificate and verify
    /// the server, `server` must require and verify a client certificate.
    pub fn new(
        client: Arc<rustls::ClientConfig>,
        server: Arc<rustls::ServerConfig>,
        server_name: Option<ServerName<'static>>,
        handshake_timeout: Duration,
    ) -> PeerTls {
        PeerTls {
            client,
            server,
            server_name,
            handshake_timeout,
            mode: PeerTlsMode::Required,
            observer: None,
            node_identity: None,
        }
    }

    /// The same TLS in `mode` (`Required` unless set).
    pub fn in_mode(mut self, mode: PeerTlsMode) -> PeerTls {
        self.mode = mode;
        self
    }

    /// Whether this broker dials other brokers with TLS.
    pub fn dials_tls(&self) -> bool {
        self.mode != PeerTlsMode::Accept
    }

    /// The same TLS, requiring each peer's certificate to be for the node
    /// it is: the node dialled, or the node an accepted peer proves it is
    /// in the cookie handshake (`tls.cluster_node_identity`, ADR 0155).
    pub fn requiring_node_identity(mut self, nodes: Arc<dyn CertifiedNodes>) -> PeerTls {
        self.node_identity = Some(nodes);
        self
    }

    /// The node ids the peer's certificate `certs` (its chain, the leaf
    /// first) is for, when node identity is required; `None` when it is
    /// not (any node may show it).
    pub fn certified_nodes(&self, certs: Option<&[CertificateDer<'_>]>) -> Option<Vec<u64>> {
        let nodes = self.node_identity.as_ref()?;
        Some(
            certs
                .and_then(|chain| chain.first())
                .map(|leaf| nodes.nodes(leaf))
                .unwrap_or_default(),
        )
    }

    /// Whether `node` may be the peer whose certificate is for
    /// `certified` (`None`: identity not required); a mismatch is counted
    /// and logged as a `node_identity` refusal on `port`, `direction`.
    pub fn admit_node(
        &self,
        port: &'static str,
        direction: &'static str,
        peer: SocketAddr,
        certified: Option<&[u64]>,
        node: u64,
    ) -> Result<(), String> {
        match certified {
            Some(nodes) if !nodes.contains(&node) => {
                let detail =
                    format!("the certificate is for nodes {nodes:?}, the peer is node {node}");
                self.report(port, direction, peer, TlsRefusal::NodeIdentity, &detail);
                Err(detail)
            }
            _ => Ok(()),
        }
    }

    /// The same TLS, reporting refusals to `observer`.
    pub fn observed_by(mut self, observer: Arc<dyn PeerTlsObserver>) -> PeerTls {
        self.observer = Some(observer);
        self
    }

    /// How long a handshake may take.
    pub fn handshake_timeout(&self) -> Duration {
        self.handshake_timeout
    }

    fn report(
        &self,
        port: &'static str,
        direction: &'static str,
        peer: SocketAddr,
        reason: TlsRefusal,
        detail: &str,
    ) {
        if let Some(observer) = &self.observer {
            observer.refused(port, direction, peer, reason, detail);
        }
    }

    /// The client's handshake with the broker at `addr`, within `timeout`
    /// (at most the handshake deadline): the server must prove the
    /// configured name, or else `addr`'s ip address.
    pub async fn connect(
        &self,
        port: &'static str,
        stream: TcpStream,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, (TlsRefusal, String)> {
        let name = self
            .server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()));
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.client));
        let outcome = tokio::time::timeout(
            timeout.min(self.handshake_timeout),
            connector.connect(name, stream),
        )
        .await;
        let refused = match outcome {
            Ok(Ok(tls)) => return Ok(tls),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                (TlsRefusal::Closed, e.to_string())
            }
            Ok(Err(e)) => (TlsRefusal::Refused, e.to_string()),
            Err(_) => (TlsRefusal::Timeout, String::new()),
        };
        self.report(port, "outbound", addr, refused.0, &refused.1);
        Err(refused)
    }

    /// The server's handshake on an accepted socket from `peer`, within the
    /// deadline: a first byte that is no TLS handshake record is a
    /// plaintext peer, refused before rustls sees it.
    pub async fn accept(
        &self,
        port: &'static str,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<tokio_rustls::server::TlsStream<TcpStream>, TlsRefusal> {
        let deadline = Instant::now() + self.handshake_timeout;
        let outcome = self.accept_by(stream, deadline).await;
        match outcome {
            Ok(tls) => Ok(tls),
            Err((reason, detail)) => {
                self.report(port, "inbound", peer, reason, &detail);
                Err(reason)
            }
        }
    }

    /// The server's side on an accepted socket from `peer`, by this
    /// broker's mode: a TLS session when the peer opens one, the plaintext
    /// socket when the mode takes plaintext (ADR 0162), else the refusal
    /// [`PeerTls::accept`] gives.
    pub async fn accept_either(
        &self,
        port: &'static str,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<Accepted, TlsRefusal> {
        if self.mode == PeerTlsMode::Required {
            return self
                .accept(port, stream, peer)
                .await
                .map(|tls| Accepted::Tls(Box::new(tls)));
        }
        let sniff = Duration::from_millis(PLAINTEXT_SNIFF_MS);
        let mut first = [0u8; 1];
        let plaintext = match tokio::time::timeout(sniff, stream.peek(&mut first)).await {
            // Silent: a plaintext client waiting for the server's hello.
            Err(_) => true,
            Ok(Ok(n)) => n > 0 && first[0] != HANDSHAKE_RECORD,
            Ok(Err(_)) => false,
        };
        if plaintext {
            if let Some(observer) = &self.observer {
                observer.plaintext_accepted(port, peer);
            }
            return Ok(Accepted::Plain(stream));
        }
        // A ClientHello, or a close the handshake reports as such.
        self.accept(port, stream, peer)
            .await
            .map(|tls| Accepted::Tls(Box::new(tls)))
    }

    async fn accept_by(
        &self,
        stream: TcpStream,
        deadline: Instant,
    ) -> Result<tokio_rustls::server::TlsStream<TcpStream>, (TlsRefusal, String)> {
        let mut first = [0u8; 1];
        match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
            Err(_) => return Err((TlsRefusal::Timeout, String::new())),
            Ok(Ok(0)) => return Err((TlsRefusal::Closed, String::new())),
            Ok(Err(e)) => return Err((TlsRefusal::Closed, e.to_string())),
            Ok(Ok(_)) if first[0] != HANDSHAKE_RECORD => {
                return Err((
                    TlsRefusal::Plaintext,
                    format!("first byte {:#04x}", first[0]),
                ));
            }
            Ok(Ok(_)) => {}
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(&self.server));
        match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
            Err(_) => Err((TlsRefusal::Timeout, String::new())),
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err((TlsRefusal::Closed, e.to_string()))
            }
            Ok(Err(e)) => Err((TlsRefusal::Refused, e.to_string())),
        }
    }
}

/// A plaintext socket's halves, boxed as a TLS connection's are.
pub fn plain_halves(stream: TcpStream) -> (PeerRead, PeerWrite) {
    let (read, write) = stream.into_split();
    (Box::new(read), Box::new(write))
}

/// A TLS connection's halves (`tokio::io::split`: one lock shared by both).
pub fn tls_halves<S>(stream: S) -> (PeerRead, PeerWrite)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(stream);
    (Box::new(read), Box::new(write))
}
