//! TLS between brokers (ADR 0151): the rustls configs the cluster port and
//! the node fabric use, built from `[tls]` with aws-lc-rs (ADR 0146 §5),
//! and where their refusals are counted and logged.
//!
//! Both sides show the broker's certificate (`tls.cluster_cert_path`, else
//! `tls.cert_path`), reloaded when its files change as the client port's
//! is (ADR 0149 §5), and both require the peer's to chain to the cluster
//! CA (`tls.cluster_ca_path`, else `tls.client_ca_path`; a bundle, reloaded
//! the same way, so the CA rotates without a stop, ADR 0164): a dialling broker
//! verifies the server and its name, an accepting one requires a client
//! certificate. The cookie handshake runs inside the session.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use malachi_cluster::group::{PeerTls, PeerTlsMode, PeerTlsObserver, TlsRefusal};
use malachi_wire::tls::{TlsError, provider};
use parking_lot::Mutex;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::ServerName;
use rustls::server::ResolvesServerCert;
use rustls::server::danger::ClientCertVerifier;
use tracing::{debug, warn};

use crate::common::config::{ClusterTls, NodeIdentity, TlsSettings};
use crate::common::error::BrokerError;
use crate::common::metrics::BrokerMetrics;
use crate::common::refusal::{REFUSAL_LOG_INTERVAL_MS, RefusalLog};
use crate::common::tls::{ReloadingCert, config_error, no_resumption};
use crate::common::tls_roots::{ReloadingRoots, Unauthenticated};

/// The broker's TLS to other brokers and what it reports to.
#[derive(Debug, Clone)]
pub(crate) struct BrokerPeerTls {
    pub peer: PeerTls,
    cert: Arc<ReloadingCert>,
    roots: Arc<ReloadingRoots>,
    log: Arc<ClusterTlsLog>,
}

impl BrokerPeerTls {
    /// The TLS `settings` ask for between brokers, its files loaded now (a
    /// file that does not load stops the start); `None` when it is off.
    pub(crate) fn from_settings(settings: &TlsSettings) -> Result<Option<Self>, BrokerError> {
        if settings.cluster_mode() == ClusterTls::Off {
            return Ok(None);
        }
        let missing = |what: &str| BrokerError::Config {
            reason: format!("tls.cluster (\"accept\", \"send\" or \"required\") needs {what}"),
        };
        let (cert_path, key_path) = settings
            .cluster_pair()
            .ok_or_else(|| missing("a certificate"))?;
        let ca_path = settings
            .cluster_ca()
            .ok_or_else(|| missing("tls.cluster_ca_path"))?;
        let provider = provider();
        let cert = Arc::new(ReloadingCert::load(
            cert_path,
            key_path,
            &provider,
            Duration::from_millis(settings.reload_check_ms),
        )?);
        let roots = Arc::new(
            ReloadingRoots::load(
                ca_path,
                "tls.cluster_ca_path",
                &provider,
                Unauthenticated::Refused,
                Duration::from_millis(settings.reload_check_ms),
            )
            .map_err(config_error)?,
        );
        let build = |e: rustls::Error| config_error(TlsError::Config(e.to_string()));
        let mut server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(build)?
            .with_client_cert_verifier(Arc::clone(&roots) as Arc<dyn ClientCertVerifier>)
            .with_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesServerCert>);
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(build)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::clone(&roots) as Arc<dyn ServerCertVerifier>)
            .with_client_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesClientCert>);
        // No resumption: a resumed session skips the certificate check, so
        // a peer under a CA just dropped from the bundle could come back
        // on it (ADR 0164). Connections between brokers are long-lived.
        no_resumption(&mut server);
        client.resumption = rustls::client::Resumption::disabled();
        let server_name = match &settings.cluster_server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| config_error(TlsError::ServerName(name.clone())))?,
            ),
            None => None,
        };
        let log = Arc::new(ClusterTlsLog::default());
        let peer = PeerTls::new(
            Arc::new(client),
            Arc::new(server),
            server_name,
            Duration::from_millis(settings.handshake_timeout_ms),
        )
        .observed_by(Arc::clone(&log) as Arc<dyn PeerTlsObserver>)
        .in_mode(match settings.cluster_mode() {
            ClusterTls::Accept => PeerTlsMode::Accept,
            ClusterTls::Send => PeerTlsMode::Send,
            ClusterTls::Off | ClusterTls::Required => PeerTlsMode::Required,
        });
        let peer = match settings.cluster_node_identity {
            NodeIdentity::Off => peer,
            NodeIdentity::Required => {
                peer.requiring_node_identity(Arc::new(crate::common::peer_identity::CertNodeIds))
            }
        };
        Ok(Some(BrokerPeerTls {
            peer,
            cert,
            roots,
            log,
        }))
    }

    /// Where refusals and reload failures are counted, once the broker's
    /// metrics exist.
    pub(crate) fn count_into(&self, metrics: &Arc<BrokerMetrics>) {
        self.cert.count_into(metrics);
        self.roots.count_into(metrics);
        let _ = self.log.metrics.set(Arc::clone(metrics));
    }
}

/// Counts every refused connection between brokers
/// (`malachi_cluster_tls_refusals_total{port, direction, reason}`) and logs
/// them at most once per [`REFUSAL_LOG_INTERVAL_MS`] per port and
/// direction, each line with the count it kept quiet about.
#[derive(Debug, Default)]
pub(crate) struct ClusterTlsLog {
    metrics: OnceLock<Arc<BrokerMetrics>>,
    logs: Mutex<HashMap<(&'static str, &'static str), RefusalLog>>,
}

impl PeerTlsObserver for ClusterTlsLog {
    fn plaintext_accepted(&self, port: &'static str, peer: SocketAddr) {
        if let Some(metrics) = self.metrics.get() {
            metrics.plaintext_accepted(port);
        }
        debug!(port, %peer, "cluster tls: a plaintext peer taken (tls.cluster takes both)");
    }

    fn refused(
        &self,
        port: &'static str,
        direction: &'static str,
        peer: SocketAddr,
        reason: TlsRefusal,
        detail: &str,
    ) {
        if let Some(metrics) = self.metrics.get() {
            metrics.cluster_tls_refusal(port, direction, reason.label());
        }
        let admitted = self
            .logs
            .lock()
            .entry((port, direction))
            .or_insert_with(|| RefusalLog::new(REFUSAL_LOG_INTERVAL_MS))
            .admit(Instant::now());
        if let Some(refused_unlogged) = admitted {
            warn!(
                port,
                direction,
                %peer,
                reason = reason.label(),
                detail,
                refused_unlogged,
                "cluster tls: connection between brokers refused"
            );
        }
    }
}
