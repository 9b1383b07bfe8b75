//! The identity a verified client certificate carries (mTLS, ADR 0149):
//! its subject's common name and its SAN DNS names and URIs, for the
//! principal mapping (`PeerIdentity::principal`).
//!
//! The certificate was verified by rustls against `tls.client_ca_path`
//! before it gets here; its SAN names are read through webpki, and the
//! subject's CN by the small DER walk below (each length checked against
//! what is left, so a malformed subject yields no CN, never a panic).

use rustls::pki_types::CertificateDer;

/// Who a verified client certificate names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The subject's first common name (CN), if any.
    pub common_name: Option<String>,
    /// The SAN's DNS names, in order.
    pub dns_names: Vec<String>,
    /// The SAN's URIs (e.g. SPIFFE ids), in order.
    pub uris: Vec<String>,
}

impl PeerIdentity {
    /// The identity of the leaf certificate `cert`; `None` if webpki cannot
    /// parse it (rustls already did, so that is not expected).
    pub fn of(cert: &CertificateDer<'_>) -> Option<PeerIdentity> {
        let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
        Some(PeerIdentity {
            common_name: common_name(parsed.subject()),
            dns_names: parsed.valid_dns_names().map(str::to_owned).collect(),
            uris: parsed.valid_uri_names().map(str::to_owned).collect(),
        })
    }

    /// The principal this certificate authenticates, by the rule of ADR
    /// 0149: the subject's CN; without one, the first SAN URI; without
    /// one, the first SAN DNS name; without any, none (the client is not
    /// authenticated by its certificate).
    pub fn principal(&self) -> Option<&str> {
        let named = |name: &&str| !name.is_empty();
        self.common_name
            .as_deref()
            .filter(named)
            .or(self.uris.first().map(String::as_str).filter(named))
            .or(self.dns_names.first().map(String::as_str).filter(named))
    }
}

/// The URI SAN prefix of a broker certificate's node id (ADR 0155):
/// `malachi:node:<id>`.
pub const NODE_URI_PREFIX: &str = "malachi:node:";
/// The DNS SAN form of a node id: `node-<id>.malachi`.
pub const NODE_DNS_PREFIX: &str = "node-";
pub const NODE_DNS_SUFFIX: &str = ".malachi";

impl PeerIdentity {
    /// The node ids this certificate is for: each URI SAN
    /// `malachi:node:<id>` and DNS SAN `node-<id>.malachi` (ids in
    /// decimal, nothing else around them), in order, each once.
    pub fn node_ids(&self) -> Vec<u64> {
        let uris = self
            .uris
            .iter()
            .filter_map(|uri| uri.strip_prefix(NODE_URI_PREFIX));
        let dns = self.dns_names.iter().filter_map(|name| {
            name.strip_prefix(NODE_DNS_PREFIX)?
                .strip_suffix(NODE_DNS_SUFFIX)
        });
        let mut ids: Vec<u64> = Vec::new();
        for id in uris.chain(dns) {
            let decimal = !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
            if let Some(id) = decimal.then(|| id.parse::<u64>().ok()).flatten()
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        ids
    }
}

/// The node ids of a verified broker certificate, for the cluster port's
/// and the fabric's node identity check (ADR 0155).
#[derive(Debug, Default)]
pub(crate) struct CertNodeIds;

impl malachi_cluster::group::CertifiedNodes for CertNodeIds {
    fn nodes(&self, leaf: &CertificateDer<'_>) -> Vec<u64> {
        PeerIdentity::of(leaf).map_or_else(Vec::new, |identity| identity.node_ids())
    }
}

/// DER tags the walk reads.
const SET: u8 = 0x31;
const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
/// 2.5.4.3, id-at-commonName.
const COMMON_NAME_OID: &[u8] = &[0x55, 0x04, 0x03];
/// The string types a CN is read from: UTF8String, PrintableString, IA5String.
const STRING_TAGS: &[u8] = &[0x0c, 0x13, 0x16];

/// One DER element at the start of `input`: its tag, its contents and the
/// rest; `None` if the length runs past the input or is not DER's.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The first CN of a subject `Name`'s contents (its RDNs, the outer
/// SEQUENCE already removed, as webpki gives it).
fn common_name(mut rdns: &[u8]) -> Option<String> {
    while !rdns.is_empty() {
        let (tag, set, rest) = element(rdns)?;
        rdns = rest;
        if tag != SET {
            return None;
        }
        let mut attributes = set;
        while !attributes.is_empty() {
            let (tag, attribute, rest) = element(attributes)?;
            attributes = rest;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = element(attribute)?;
            if tag != OID || oid != COMMON_NAME_OID {
                continue;
            }
            let (tag, text, _) = element(value)?;
            if STRING_TAGS.contains(&tag) {
                return std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_names_its_nodes_by_uri_or_dns_san_and_nothing_else_counts() {
        let identity = PeerIdentity {
            common_name: Some("node-9.malachi".into()),
            dns_names: vec![
                "localhost".into(),
                "node-3.malachi".into(),
                "node-4.malachi.example".into(),
                "node-+5.malachi".into(),
                "node-.malachi".into(),
            ],
            uris: vec![
                "malachi:node:3".into(),
                "malachi:node:7".into(),
                "malachi:node:7x".into(),
                "malachi:node:99999999999999999999999".into(),
                "spiffe://malachi/node/8".into(),
            ],
        };
        // The CN never names a node: only SANs, which the CA vouched for
        // as names.
        assert_eq!(identity.node_ids(), vec![3, 7]);
        assert!(PeerIdentity::default().node_ids().is_empty());
    }

    /// `SET { SEQUENCE { OID oid, tag value } }`, short lengths only.
    fn rdn(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        let mut attribute = vec![OID, oid.len() as u8];
        attribute.extend_from_slice(oid);
        attribute.extend_from_slice(&[tag, value.len() as u8]);
        attribute.extend_from_slice(value);
        let mut seq = vec![SEQUENCE, attribute.len() as u8];
        seq.extend(attribute);
        let mut set = vec![SET, seq.len() as u8];
        set.extend(seq);
        set
    }

    #[test]
    fn the_cn_is_found_among_other_attributes() {
        let organisation = [0x55, 0x04, 0x0a];
        let mut subject = rdn(&organisation, 0x0c, b"Acme");
        subject.extend(rdn(COMMON_NAME_OID, 0x13, b"alice"));
        assert_eq!(common_name(&subject).as_deref(), Some("alice"));
        assert_eq!(common_name(&rdn(&organisation, 0x0c, b"Acme")), None);
    }

    #[test]
    fn a_malformed_subject_has_no_cn() {
        let subject = rdn(COMMON_NAME_OID, 0x0c, b"alice");
        for cut in 0..subject.len() {
            assert_eq!(common_name(&subject[..cut]), None, "cut at {cut}");
        }
        // A length of more than four bytes, and one past the input.
        assert_eq!(element(&[SET, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(element(&[SET, 0x82, 0xff, 0xff, 0]), None);
    }

    #[test]
    fn a_client_certificate_names_its_cn_and_its_sans() {
        use malachi_testkit::tls::{LeafSpec, TestCa};
        use rustls::pki_types::pem::PemObject;
        let ca = TestCa::new("ca");
        let leaf = ca.leaf(&LeafSpec {
            dns_names: vec!["alice.example".into()],
            ..LeafSpec::client("alice", 5)
        });
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap();
        let id = PeerIdentity::of(&der).unwrap();
        assert_eq!(id.common_name.as_deref(), Some("alice"));
        assert_eq!(id.dns_names, ["alice.example"]);
        assert!(id.uris.is_empty());
        assert_eq!(id.principal(), Some("alice"));
    }

    #[test]
    fn the_principal_is_the_cn_then_a_uri_then_a_dns_name() {
        let mut id = PeerIdentity {
            common_name: Some("alice".into()),
            dns_names: vec!["alice.example".into()],
            uris: vec!["spiffe://example/alice".into()],
        };
        assert_eq!(id.principal(), Some("alice"));
        id.common_name = None;
        assert_eq!(id.principal(), Some("spiffe://example/alice"));
        id.uris.clear();
        assert_eq!(id.principal(), Some("alice.example"));
        id.dns_names.clear();
        assert_eq!(id.principal(), None);
    }
}
