//! Trust roots reloaded when their file changes (ADR 0164): the CA bundle
//! that other brokers' certificates must chain to (`tls.cluster_ca_path`)
//! and the one clients' certificates must chain to (`tls.client_ca_path`).
//!
//! A bundle may hold several CAs, so a cluster's CA rotates without a
//! stop: append the new CA to every broker's bundle, move every
//! certificate to it, then drop the old CA. As with the broker's own
//! certificate (`tls.rs`), at most every `tls.reload_check_ms` a handshake
//! first compares the file's modification time and size with those last
//! loaded; a changed bundle that does not load is logged, counted in
//! `malachi_tls_reloads_total{outcome="failed"}`, and the previous roots
//! verify on. Open connections keep the roots they were verified under.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use malachi_wire::tls::{TlsError, load_roots};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::common::metrics::BrokerMetrics;
use crate::common::reloading::Reloading;

/// Whether a peer without a certificate is let through (the client port's
/// `tls.client_auth = "optional"`); between brokers one is always required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unauthenticated {
    Refused,
    Allowed,
}

/// The two verifiers one bundle makes: of clients (and of dialling
/// brokers), and of servers (the brokers this one dials).
#[derive(Debug, Clone)]
struct Verifiers {
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<WebPkiServerVerifier>,
}

/// The CA bundle at a path, as rustls verifiers, reloaded when the file
/// changes (see the module's doc).
#[derive(Debug)]
pub(crate) struct ReloadingRoots {
    verifiers: Reloading<Verifiers>,
    provider: Arc<CryptoProvider>,
    unauthenticated: Unauthenticated,
}

impl ReloadingRoots {
    /// The bundle at `path`, loaded now (a bundle that does not load stops
    /// the start).
    pub(crate) fn load(
        path: &Path,
        what: &'static str,
        provider: &Arc<CryptoProvider>,
        unauthenticated: Unauthenticated,
        check_every: Duration,
    ) -> Result<ReloadingRoots, TlsError> {
        let (bundle, by) = (path.to_owned(), Arc::clone(provider));
        let paths = vec![bundle.clone()];
        let verifiers = Reloading::load(what, paths, check_every, move || {
            verifiers(&bundle, what, &by, unauthenticated)
        })?;
        Ok(ReloadingRoots {
            verifiers,
            provider: Arc::clone(provider),
            unauthenticated,
        })
    }

    /// Where reloads are counted, once the broker's metrics exist.
    pub(crate) fn count_into(&self, metrics: &Arc<BrokerMetrics>) {
        self.verifiers.count_into(metrics);
    }

    /// The verifiers to use now, reloaded first if a check is due and the
    /// file changed.
    fn current(&self) -> Verifiers {
        self.verifiers.current()
    }
}

/// Handshake signatures are checked by the provider's algorithms alone:
/// they do not depend on the roots, so no reload check and no lock.
impl ReloadingRoots {
    fn algorithms(&self) -> &rustls::crypto::WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }

    fn tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }
}

/// Both verifiers of the bundle at `path`.
fn verifiers(
    path: &Path,
    what: &'static str,
    provider: &Arc<CryptoProvider>,
    unauthenticated: Unauthenticated,
) -> Result<Verifiers, TlsError> {
    let roots = Arc::new(load_roots(path, what)?);
    let invalid = |e: &dyn std::fmt::Display| TlsError::Invalid {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let clients =
        WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(provider));
    let clients = match unauthenticated {
        Unauthenticated::Allowed => clients.allow_unauthenticated(),
        Unauthenticated::Refused => clients,
    };
    let clients = clients.build().map_err(|e| invalid(&e))?;
    let servers = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(provider))
        .build()
        .map_err(|e| invalid(&e))?;
    Ok(Verifiers { clients, servers })
}

impl ClientCertVerifier for ReloadingRoots {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.unauthenticated == Unauthenticated::Refused
    }

    /// No CA names are hinted: they would have to outlive a reload. Every
    /// client of Malachi's presents the one certificate it was given.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .clients
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

impl ServerCertVerifier for ReloadingRoots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current().servers.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use malachi_testkit::tls::{LeafSpec, TestCa, write};
    use rustls::pki_types::pem::PemObject;

    use super::*;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn trusts(roots: &ReloadingRoots, leaf: &CertificateDer<'_>) -> (bool, bool) {
        let now = UnixTime::now();
        let as_client = roots.verify_client_cert(leaf, &[], now).is_ok();
        let name = ServerName::try_from("localhost").unwrap();
        let as_server = roots.verify_server_cert(leaf, &[], &name, &[], now).is_ok();
        (as_client, as_server)
    }

    /// Rewrites `path` so its stamp changes even within the file system's
    /// time granularity (the length differs, or a later mtime is set).
    fn rewrite(path: &Path, text: &str) {
        let stamp = |p: &Path| {
            let meta = std::fs::metadata(p).unwrap();
            (meta.modified().unwrap(), meta.len())
        };
        let before = stamp(path);
        std::fs::write(path, text).unwrap();
        if stamp(path) == before {
            let file = std::fs::File::options().write(true).open(path).unwrap();
            let later = std::time::SystemTime::now() + Duration::from_secs(1);
            file.set_modified(later).unwrap();
        }
    }

    #[test]
    fn a_bundle_of_two_cas_trusts_both_and_dropping_one_distrusts_it_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let old = TestCa::new("old CA");
        let new = TestCa::new("new CA");
        let under_old = der(&old.leaf(&LeafSpec::node(1)).cert_pem);
        let under_new = der(&new.leaf(&LeafSpec::node(2)).cert_pem);
        let path = write(dir.path(), "ca.pem", &old.pem);
        let provider = malachi_wire::tls::provider();
        let roots = ReloadingRoots::load(
            &path,
            "tls.cluster_ca_path",
            &provider,
            Unauthenticated::Refused,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(trusts(&roots, &under_old), (true, true));
        assert_eq!(trusts(&roots, &under_new), (false, false));

        rewrite(&path, &format!("{}{}", old.pem, new.pem));
        assert_eq!(trusts(&roots, &under_old), (true, true));
        assert_eq!(trusts(&roots, &under_new), (true, true));

        rewrite(&path, &new.pem);
        assert_eq!(trusts(&roots, &under_old), (false, false));
        assert_eq!(trusts(&roots, &under_new), (true, true));

        // A bundle that does not load leaves the last roots in place.
        rewrite(&path, "-----BEGIN CERTIFICATE-----\nnot base64\n");
        assert_eq!(trusts(&roots, &under_new), (true, true));
        assert_eq!(trusts(&roots, &under_old), (false, false));
    }

    #[test]
    fn roots_are_looked_at_no_more_often_than_the_check_interval() {
        let dir = tempfile::tempdir().unwrap();
        let old = TestCa::new("old CA");
        let new = TestCa::new("new CA");
        let under_new = der(&new.leaf(&LeafSpec::node(2)).cert_pem);
        let path = write(dir.path(), "ca.pem", &old.pem);
        let provider = malachi_wire::tls::provider();
        let roots = ReloadingRoots::load(
            &path,
            "tls.cluster_ca_path",
            &provider,
            Unauthenticated::Refused,
            Duration::from_secs(3_600),
        )
        .unwrap();
        rewrite(&path, &new.pem);
        assert_eq!(trusts(&roots, &under_new), (false, false));
    }

    #[test]
    fn optional_client_auth_lets_a_client_without_a_certificate_through() {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("CA");
        let path = write(dir.path(), "ca.pem", &ca.pem);
        let provider = malachi_wire::tls::provider();
        let load = |u| {
            ReloadingRoots::load(&path, "tls.client_ca_path", &provider, u, Duration::ZERO).unwrap()
        };
        assert!(load(Unauthenticated::Refused).client_auth_mandatory());
        assert!(!load(Unauthenticated::Allowed).client_auth_mandatory());
    }
}
