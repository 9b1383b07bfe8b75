//! `malachi dev --secure`: a throwaway certificate authority, a broker
//! certificate for `localhost` and 127.0.0.1 (for server and client
//! authentication: brokers show it to each other too, ADR 0151), one per
//! broker naming its node (`malachi:node:<id>`, what brokers show each
//! other with `tls.cluster_node_identity = "required"`, ADR 0155), a client
//! certificate and a superuser with a random password (issue 39), kept
//! under the data directory so a restart of `dev` finds the same ones (the
//! superuser is created once, in raft, with the first password, so a
//! password file, once written, is never replaced).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::error::CliError;

/// The superuser `--secure` creates.
pub const DEV_SUPERUSER: &str = "admin";

/// Where `--secure` keeps its files, under the data directory.
#[derive(Debug, Clone)]
pub struct SecureFiles {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub broker_cert: PathBuf,
    pub broker_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub password: PathBuf,
}

impl SecureFiles {
    pub fn under(data_dir: &Path) -> SecureFiles {
        let dir = data_dir.join("secure");
        SecureFiles {
            ca: dir.join("ca.pem"),
            // Not `broker.pem`: that name held a server-only certificate
            // before brokers spoke TLS to each other; a directory with only
            // it gets a new CA and certificates.
            broker_cert: dir.join("node.pem"),
            broker_key: dir.join("node.key"),
            client_cert: dir.join("admin.pem"),
            client_key: dir.join("admin.key"),
            password: dir.join("admin.pw"),
            dir,
        }
    }

    /// Broker `node`'s own pair, naming its node (ADR 0155).
    pub fn node_pair(&self, node: u64) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("node-{node}.pem")),
            self.dir.join(format!("node-{node}.key")),
        )
    }

    fn all(&self, nodes: u64) -> Vec<PathBuf> {
        let mut all = vec![
            self.ca.clone(),
            self.broker_cert.clone(),
            self.broker_key.clone(),
            self.client_cert.clone(),
            self.client_key.clone(),
            self.password.clone(),
        ];
        for node in 1..=nodes {
            let (cert, key) = self.node_pair(node);
            all.extend([cert, key]);
        }
        all
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Config(format!("dev --secure: {what}: {e}"))
}

/// The files, made now unless a previous `dev --secure` left all of them.
pub fn ensure(data_dir: &Path) -> Result<SecureFiles, CliError> {
    ensure_nodes(data_dir, 0)
}

/// [`ensure`], with a pair of its own for each of brokers 1 to `nodes`.
pub fn ensure_nodes(data_dir: &Path, nodes: u64) -> Result<SecureFiles, CliError> {
    let files = SecureFiles::under(data_dir);
    if files.all(nodes).iter().all(|p| p.is_file()) {
        return Ok(files);
    }
    std::fs::create_dir_all(&files.dir).map_err(|e| failed("the directory", e))?;
    let (ca_pem, issuer) = authority()?;
    let broker = leaf(&issuer, "malachi dev broker", Role::Broker(None))?;
    let client = leaf(&issuer, DEV_SUPERUSER, Role::Client)?;
    write(&files.ca, &ca_pem)?;
    write(&files.broker_cert, &broker.0)?;
    write(&files.broker_key, &broker.1)?;
    write(&files.client_cert, &client.0)?;
    write(&files.client_key, &client.1)?;
    for node in 1..=nodes {
        let name = format!("malachi dev broker {node}");
        let pair = leaf(&issuer, &name, Role::Broker(Some(node)))?;
        let (cert, key) = files.node_pair(node);
        write(&cert, &pair.0)?;
        write(&key, &pair.1)?;
    }
    if !files.password.is_file() {
        write(&files.password, &format!("{}\n", password()?))?;
    }
    Ok(files)
}

fn authority() -> Result<(String, Issuer<'static, KeyPair>), CliError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("CA", e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "malachi dev CA (throwaway)");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
    let cert = params.self_signed(&key).map_err(|e| failed("CA", e))?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Client,
    /// A broker's, naming its node when given (`malachi:node:<id>`).
    Broker(Option<u64>),
}

/// A certificate and key (PEM) signed by `issuer`: a client's named
/// `name` in its CN, or a broker's for `localhost` and 127.0.0.1, for
/// both server and client authentication (brokers dial each other).
fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    name: &str,
    role: Role,
) -> Result<(String, String), CliError> {
    let client = role == Role::Client;
    let dns = if client {
        Vec::new()
    } else {
        vec!["localhost".to_owned()]
    };
    let mut params = CertificateParams::new(dns).map_err(|e| failed(name, e))?;
    if !client {
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
    if let Role::Broker(Some(node)) = role {
        let uri = format!("malachi:node:{node}")
            .try_into()
            .map_err(|e| failed(name, e))?;
        params.subject_alt_names.push(SanType::URI(uri));
    }
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = if client {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    };
    let key = KeyPair::generate().map_err(|e| failed("a key", e))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| failed(name, e))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// 24 random bytes, hex: a password nobody chose.
fn password() -> Result<String, CliError> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| failed("randomness", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `text` readable by its owner only.
fn write(path: &Path, text: &str) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| failed(&path.display().to_string(), e))?;
    file.write_all(text.as_bytes())
        .map_err(|e| failed(&path.display().to_string(), e))
}

/// What the banner adds: how to connect.
pub fn banner(files: &SecureFiles) -> String {
    format!(
        "secure: TLS (throwaway CA {ca}) and SCRAM logins; superuser `{DEV_SUPERUSER}`\n\
         brokers speak mutual TLS to each other under the same CA, each certificate naming its node\n\
         connect with:\n\
         \x20 export MALACHI_TLS_CA={ca}\n\
         \x20 export MALACHI_USER={DEV_SUPERUSER} MALACHI_PASSWORD_FILE={pw}\n\
         (or a client certificate: MALACHI_TLS_CERT={cert} MALACHI_TLS_KEY={key})\n\
         the admin ports speak HTTPS: curl --cacert {ca} https://127.0.0.1:8080/ready\n",
        ca = files.ca.display(),
        pw = files.password.display(),
        cert = files.client_cert.display(),
        key = files.client_key.display(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::Engine as _;

    /// The DER of a PEM certificate.
    fn der(pem: &Path) -> Vec<u8> {
        let text = std::fs::read_to_string(pem).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn each_broker_gets_a_certificate_naming_its_node_and_a_rerun_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let files = ensure_nodes(dir.path(), 3).unwrap();
        for node in 1..=3u64 {
            let (cert, key) = files.node_pair(node);
            assert!(key.is_file());
            let der = der(&cert);
            let name = format!("malachi:node:{node}");
            assert!(contains(&der, name.as_bytes()), "node {node}");
            for other in (1..=3u64).filter(|o| *o != node) {
                let name = format!("malachi:node:{other}");
                assert!(
                    !contains(&der, name.as_bytes()),
                    "node {node} names {other}"
                );
            }
        }
        // The shared pair names no node.
        assert!(!contains(&der(&files.broker_cert), b"malachi:node:"));
        // A second run finds every file and keeps them.
        let before = std::fs::read(files.node_pair(2).0).unwrap();
        let again = ensure_nodes(dir.path(), 3).unwrap();
        assert_eq!(std::fs::read(again.node_pair(2).0).unwrap(), before);
    }
}
