//! The broker's TLS (ADR 0149): one rustls server config for the client
//! port and the admin port, built with aws-lc-rs (ADR 0146 §5), its
//! certificate reloaded when its files change, and the plaintext check
//! that runs before a handshake.
//!
//! Reload: [`ReloadingCert`] answers every handshake with the current
//! pair; at most every `tls.reload_check_ms` a handshake first looks at
//! the two files' modification times and sizes, and when either changed
//! it loads both again. A pair that does not load (a half-written file, a
//! key that does not match its certificate) is logged and counted, and the
//! old pair keeps serving until the files change again. Connections
//! already open keep the session they negotiated.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use malachi_wire::tls::{TlsError, load_certs, load_key, provider};
use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::common::config::{ClientAuth, ClientPortsTls, TlsSettings};
use crate::common::error::BrokerError;
use crate::common::metrics::BrokerMetrics;
use crate::common::refusal::{REFUSAL_LOG_INTERVAL_MS, RefusalLog};
use crate::common::reloading::Reloading;
use crate::common::tls_roots::{ReloadingRoots, Unauthenticated};

/// The broker's TLS: the acceptor both ports use and its bounds.
pub(crate) struct ServerTls {
    acceptor: TlsAcceptor,
    cert: Arc<ReloadingCert>,
    /// The client CA bundle, when clients show certificates (ADR 0164).
    roots: Option<Arc<ReloadingRoots>>,
    pub handshake_timeout: Duration,
    /// `tls.client_ports = "accept"` (ADR 0162): a plaintext client is
    /// served as on a plaintext port, not refused.
    pub takes_plaintext: bool,
    metrics: OnceLock<Arc<BrokerMetrics>>,
}

/// An accepted client socket after its first byte: a TLS session, or the
/// plaintext socket where the ports take plaintext (ADR 0162).
pub(crate) enum Opened {
    Tls(Box<TlsStream<TcpStream>>),
    Plain(TcpStream),
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("takes_plaintext", &self.takes_plaintext)
            .finish()
    }
}

/// Why a TLS connection was not set up, the `reason` label of
/// `malachi_tls_handshake_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandshakeFailure {
    /// The client spoke plaintext (its first byte is no TLS handshake record).
    Plaintext,
    /// The handshake did not finish within `tls.handshake_timeout_ms`.
    Timeout,
    /// The client closed before the handshake finished.
    Closed,
    /// rustls refused it: no common version or cipher, a bad or missing
    /// client certificate, a fatal alert from the client.
    Refused,
}

impl HandshakeFailure {
    pub(crate) fn label(self) -> &'static str {
        match self {
            HandshakeFailure::Plaintext => "plaintext",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Closed => "closed",
            HandshakeFailure::Refused => "refused",
        }
    }
}

pub(crate) fn config_error(e: TlsError) -> BrokerError {
    BrokerError::Config {
        reason: format!("tls: {e}"),
    }
}

impl ServerTls {
    /// The TLS the settings ask for, its files loaded now (a file that does
    /// not load stops the start); `None` when TLS is off.
    pub(crate) fn from_settings(settings: &TlsSettings) -> Result<Option<ServerTls>, BrokerError> {
        let (Some(cert_path), Some(key_path)) = (&settings.cert_path, &settings.key_path) else {
            return Ok(None);
        };
        let provider = provider();
        let cert = Arc::new(ReloadingCert::load(
            cert_path,
            key_path,
            &provider,
            Duration::from_millis(settings.reload_check_ms),
        )?);
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(TlsError::Config(e.to_string())))?;
        let mut roots = None;
        let builder = match (&settings.client_ca_path, settings.client_auth) {
            (Some(ca), ClientAuth::Optional | ClientAuth::Required) => {
                let unauthenticated = if settings.client_auth == ClientAuth::Optional {
                    Unauthenticated::Allowed
                } else {
                    Unauthenticated::Refused
                };
                let verifier = Arc::new(
                    ReloadingRoots::load(
                        ca,
                        "tls.client_ca_path",
                        &provider,
                        unauthenticated,
                        Duration::from_millis(settings.reload_check_ms),
                    )
                    .map_err(config_error)?,
                );
                roots = Some(Arc::clone(&verifier));
                builder.with_client_cert_verifier(verifier as Arc<dyn ClientCertVerifier>)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesServerCert>);
        if roots.is_some() {
            // A resumed session skips the client certificate's check: a
            // client under a CA dropped from the bundle could come back
            // on it (ADR 0164).
            no_resumption(&mut config);
        }
        Ok(Some(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert,
            roots,
            handshake_timeout: Duration::from_millis(settings.handshake_timeout_ms),
            takes_plaintext: settings.client_ports == ClientPortsTls::Accept,
            metrics: OnceLock::new(),
        }))
    }

    /// The acceptor (the admin port drives its handshakes itself).
    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Where reload failures are counted, once the broker's metrics exist.
    pub(crate) fn count_into(&self, metrics: &Arc<BrokerMetrics>) {
        self.cert.count_into(metrics);
        if let Some(roots) = &self.roots {
            roots.count_into(metrics);
        }
        let _ = self.metrics.set(Arc::clone(metrics));
    }

    /// Counts a plaintext client taken on `port` (`client` or `admin`)
    /// where the ports take plaintext (ADR 0162).
    pub(crate) fn count_plaintext(&self, port: &'static str) {
        if let Some(metrics) = self.metrics.get() {
            metrics.plaintext_accepted(port);
        }
    }

    /// The plaintext check, then the handshake, within
    /// `tls.handshake_timeout_ms` together. Where the ports take plaintext,
    /// a plaintext first byte, or none by the deadline (a plaintext client
    /// may open a connection and wait, as on a plaintext port), opens the
    /// socket as it is.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<Opened, (HandshakeFailure, Option<TcpStream>)> {
        let deadline = Instant::now() + self.handshake_timeout;
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout_at(deadline, stream.peek(&mut first)).await;
        match peeked {
            Err(_) if self.takes_plaintext => return Ok(Opened::Plain(stream)),
            Err(_) => return Err((HandshakeFailure::Timeout, None)),
            Ok(Ok(0) | Err(_)) => return Err((HandshakeFailure::Closed, None)),
            Ok(Ok(_)) if first[0] != malachi_wire::tls::CLIENT_HELLO_PREFIX[0] => {
                if self.takes_plaintext {
                    return Ok(Opened::Plain(stream));
                }
                return Err((HandshakeFailure::Plaintext, Some(stream)));
            }
            Ok(Ok(_)) => {}
        }
        match tokio::time::timeout_at(deadline, self.acceptor.accept(stream)).await {
            Err(_) => Err((HandshakeFailure::Timeout, None)),
            Ok(Ok(tls)) => Ok(Opened::Tls(Box::new(tls))),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err((HandshakeFailure::Closed, None))
            }
            Ok(Err(_)) => Err((HandshakeFailure::Refused, None)),
        }
    }
}

/// Rate-limited logs of clients speaking the wrong protocol for the port
/// (a flood of them costs a line per `REFUSAL_LOG_INTERVAL_MS`, each with
/// the count it kept quiet about); the counters count every one.
#[derive(Debug)]
pub(crate) struct WrongProtocolLog {
    pub plaintext_on_tls: Mutex<RefusalLog>,
    pub tls_on_plaintext: Mutex<RefusalLog>,
}

impl Default for WrongProtocolLog {
    fn default() -> WrongProtocolLog {
        WrongProtocolLog {
            plaintext_on_tls: Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL_MS)),
            tls_on_plaintext: Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL_MS)),
        }
    }
}

/// The certificate and key the broker presents, reloaded when the files
/// change (see the module's doc).
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    pair: Reloading<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    pub(crate) fn load(
        cert_path: &Path,
        key_path: &Path,
        provider: &Arc<CryptoProvider>,
        check_every: Duration,
    ) -> Result<ReloadingCert, BrokerError> {
        let (cert, key, provider) = (
            cert_path.to_owned(),
            key_path.to_owned(),
            Arc::clone(provider),
        );
        let paths = vec![cert.clone(), key.clone()];
        let pair = Reloading::load("certificate", paths, check_every, move || {
            load_pair(&cert, &key, &provider).map(Arc::new)
        })
        .map_err(config_error)?;
        Ok(ReloadingCert { pair })
    }

    /// Where reloads are counted, once the broker's metrics exist.
    pub(crate) fn count_into(&self, metrics: &Arc<BrokerMetrics>) {
        self.pair.count_into(metrics);
    }

    /// The pair to present now, reloaded first if a check is due and the
    /// files changed.
    fn current(&self) -> Arc<CertifiedKey> {
        self.pair.current()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A broker dialling another shows the same reloaded pair (ADR 0151).
impl rustls::client::ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Turns a server's session resumption off (no session cache, no TLS 1.3
/// tickets): every handshake verifies the peer's certificate against the
/// roots of the moment.
pub(crate) fn no_resumption(config: &mut rustls::ServerConfig) {
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
}

/// The chain and key at the two paths, the key checked against the leaf.
fn load_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert_path, "tls.cert_path")?;
    let key = load_key(key_path, "tls.key_path")?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Invalid {
        what: "tls.key_path",
        path: key_path.to_owned(),
        reason: e.to_string(),
    })
}
