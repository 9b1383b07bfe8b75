//! Test certificates (feature `tls`, rcgen over aws-lc-rs): a CA, a broker
//! certificate for `localhost` and 127.0.0.1, a client certificate, and the
//! bad ones a client must refuse (expired, from another CA), written as
//! PEM files into a directory the test owns.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber, date_time_ymd,
};

/// A certificate authority that signs test certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub pem: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A leaf certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What a leaf is for and when it is valid.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    pub common_name: String,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub serial: u64,
    pub expired: bool,
    pub client: bool,
    /// The broker's node id, as a URI SAN `malachi:node:<id>` (ADR 0155).
    pub node: Option<u64>,
}

impl LeafSpec {
    /// A broker's: `localhost` and 127.0.0.1, valid now, for server and
    /// client authentication.
    pub fn broker(serial: u64) -> LeafSpec {
        LeafSpec {
            common_name: format!("broker-{serial}"),
            dns_names: vec!["localhost".into()],
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            serial,
            expired: false,
            client: false,
            node: None,
        }
    }

    /// Broker `node`'s: a broker's certificate (serial `node`) that also
    /// names the node, `malachi:node:<node>`.
    pub fn node(node: u64) -> LeafSpec {
        LeafSpec {
            node: Some(node),
            ..LeafSpec::broker(node)
        }
    }

    /// A client's, named `name` in its CN.
    pub fn client(name: &str, serial: u64) -> LeafSpec {
        LeafSpec {
            common_name: name.to_owned(),
            dns_names: Vec::new(),
            ips: Vec::new(),
            serial,
            expired: false,
            client: true,
            node: None,
        }
    }
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    pub fn leaf(&self, spec: &LeafSpec) -> Leaf {
        let mut params = CertificateParams::new(spec.dns_names.clone()).unwrap();
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        if let Some(node) = spec.node {
            let uri = format!("malachi:node:{node}").try_into().unwrap();
            params.subject_alt_names.push(SanType::URI(uri));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.clone());
        params.serial_number = Some(SerialNumber::from_slice(&spec.serial.to_be_bytes()));
        // A broker's certificate serves both ways between brokers (ADR
        // 0151): it is a server to its dialers and a client to its peers.
        params.extended_key_usages = if spec.client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        if spec.expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// The PEM files of one test's PKI, in `dir`.
#[derive(Debug, Clone)]
pub struct PkiFiles {
    pub ca: PathBuf,
    pub broker_cert: PathBuf,
    pub broker_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A CA, a broker pair (serial 1) and a client pair (CN `alice`), in `dir`.
pub fn pki(dir: &Path) -> (TestCa, PkiFiles) {
    let ca = TestCa::new("malachi test CA");
    let broker = ca.leaf(&LeafSpec::broker(1));
    let client = ca.leaf(&LeafSpec::client("alice", 2));
    let files = PkiFiles {
        ca: write(dir, "ca.pem", &ca.pem),
        broker_cert: write(dir, "broker.pem", &broker.cert_pem),
        broker_key: write(dir, "broker.key", &broker.key_pem),
        client_cert: write(dir, "client.pem", &client.cert_pem),
        client_key: write(dir, "client.key", &client.key_pem),
    };
    (ca, files)
}
