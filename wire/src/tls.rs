//! TLS (ADR 0149): the one crypto provider, PEM loading, and the client's
//! side of a TLS connection to a broker.
//!
//! Both rustls providers are compiled into the build (ractor_cluster pulls
//! aws-lc-rs, async-nats ring), so rustls cannot pick a process default by
//! itself: every config here and in the broker is built with
//! [`provider`] through `builder_with_provider` (ADR 0146 §5), and
//! [`install_default_provider`] makes the same choice the process default
//! for any library that asks rustls for one.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The crypto provider every TLS config of Malachi is built with: aws-lc-rs.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Makes aws-lc-rs the process default provider too (a no-op if a default
/// is already installed), for libraries that build their own configs.
pub fn install_default_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Why TLS material could not be loaded or a TLS config built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the {what} {path} holds no PEM {kind}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("the {what} {path} is not usable: {reason}")]
    Invalid {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("a client certificate needs its key, and a key its certificate")]
    HalfPair,
    #[error("{0:?} is neither a DNS name nor an IP address, so it cannot name a TLS server")]
    ServerName(String),
    #[error("cannot build the TLS config: {0}")]
    Config(String),
}

/// Every certificate in the PEM file at `path`, in order (a chain: the
/// leaf first).
pub fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
            kind: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file at `path`.
pub fn load_key(path: &Path, what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what,
            path: path.to_owned(),
            kind: "PRIVATE KEY",
        },
        other => TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// The trust anchors in the PEM file at `path`.
pub fn load_roots(path: &Path, what: &'static str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path, what)? {
        roots.add(cert).map_err(|e| TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The files a client's TLS is configured from (the CLI's `--tls-ca`,
/// `--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA the broker's certificate must chain to.
    pub ca_path: PathBuf,
    /// The client's certificate and key, for a broker that asks for one (mTLS).
    pub cert_path: Option<PathBuf>,
    pub key_path: Option<PathBuf>,
    /// The name the broker's certificate must carry; unset, the host of
    /// the address dialled (an IP address is checked against the IP SANs).
    pub server_name: Option<String>,
}

/// A client's TLS, built once from [`ClientTlsFiles`] and shared by every
/// connection of a client.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .field(
                "client_auth",
                &self.config.client_auth_cert_resolver.has_certs(),
            )
            .finish()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &ClientTls) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

impl Eq for ClientTls {}

impl ClientTls {
    /// Loads the files and builds the config: TLS 1.2 and 1.3 by rustls'
    /// safe defaults, the broker verified against the CA only.
    pub fn from_files(files: &ClientTlsFiles) -> Result<ClientTls, TlsError> {
        let roots = load_roots(&files.ca_path, "TLS CA file")?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots);
        let config = match (&files.cert_path, &files.key_path) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = load_certs(cert, "TLS client certificate")?;
                let key = load_key(key, "TLS client key")?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| TlsError::Config(e.to_string()))?
            }
            _ => return Err(TlsError::HalfPair),
        };
        let server_name = match &files.server_name {
            Some(name) => Some(server_name(name)?),
            None => None,
        };
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The connector every connection of the client uses.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
    }

    /// The name the broker at `addr` (`host:port`) must prove: the
    /// configured one, or the address's host.
    pub fn server_name_for(&self, addr: &str) -> Result<ServerName<'static>, TlsError> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        server_name(host_of(addr))
    }
}

/// A DNS name or an IP address as rustls checks it.
fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_owned()).map_err(|_| TlsError::ServerName(name.to_owned()))
}

/// The host of `host:port`, `[v6]:port` or a bare host.
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => {
            host
        }
        _ => addr,
    }
}

/// The first bytes of every TLS connection: a handshake record (0x16) of
/// a TLS 1.x record version (0x03). A plaintext Malachi frame that began
/// so would declare more than 369 MB, beyond any frame limit.
pub const CLIENT_HELLO_PREFIX: [u8; 2] = [0x16, 0x03];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_address() {
        assert_eq!(host_of("broker-1.example:4040"), "broker-1.example");
        assert_eq!(host_of("127.0.0.1:4040"), "127.0.0.1");
        assert_eq!(host_of("[::1]:4040"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
        assert_eq!(host_of("::1"), "::1");
    }

    #[test]
    fn an_ip_is_checked_as_an_ip() {
        assert!(matches!(
            server_name("127.0.0.1").ok(),
            Some(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("localhost").ok(),
            Some(ServerName::DnsName(_))
        ));
        assert!(server_name("not a name!").is_err());
    }

    #[test]
    fn the_provider_is_aws_lc_rs() {
        // The hybrid post-quantum group only aws-lc-rs brings (ADR 0146 §5).
        let groups: Vec<_> = provider().kx_groups.iter().map(|g| g.name()).collect();
        assert!(
            groups.contains(&rustls::NamedGroup::X25519MLKEM768),
            "{groups:?}"
        );
    }
}
