//! A broker's SWIM identity and its byte codec.
//!
//! The identity is what every member gossips about every other: the node id,
//! an incarnation that grows with every start (so a restarted broker always
//! wins over the ghost of its previous run), the addresses other brokers and
//! clients use, and the operator's attributes. foca compares identities by
//! their *address*, which here is the client address: the SWIM socket is
//! bound on the same ip:port as the client TCP listener (UDP and TCP ports
//! are separate namespaces), so a seed's client address is its SWIM address.
//!
//! Format (version 1, big-endian, every identity at most
//! [`IDENTITY_BYTES_MAX`] bytes, documented in docs/guides/clustering.md):
//!
//! ```text
//! u8 version=1 | u64 node_id | u64 incarnation | addr client
//! | opt_addr admin | opt_addr raft | opt_addr cluster
//! | u8 attribute_count | (u8 key_len, key, u8 value_len, value)*
//! addr     = u8 family (4 | 6) | 4 or 16 bytes of ip | u16 port
//! opt_addr = u8 0 (absent) | addr
//! ```
//!
//! Attributes are sorted by key with no duplicates, so equal identities have
//! equal bytes. Decoding takes arbitrary bytes from the network: it checks
//! every length against what is left before reading and never panics.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The identity format this build writes and reads.
pub const IDENTITY_VERSION: u8 = 1;
/// The largest encoded identity. foca puts two identities (source and
/// destination) in every packet header plus member updates, and a packet is
/// at most about 1400 bytes, so identities must stay small.
pub const IDENTITY_BYTES_MAX: usize = 512;
/// Attributes one broker may carry.
pub const ATTRIBUTES_MAX: usize = 32;
/// Longest attribute key, in bytes.
pub const ATTRIBUTE_KEY_BYTES_MAX: usize = 64;
/// Longest attribute value, in bytes.
pub const ATTRIBUTE_VALUE_BYTES_MAX: usize = 128;

/// Why an identity cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("identity truncated: needed {needed} more bytes")]
    Truncated { needed: usize },
    #[error("identity version {0} is not supported (this build reads version {IDENTITY_VERSION})")]
    Version(u8),
    #[error("identity address family {0} is not 4 or 6")]
    AddressFamily(u8),
    #[error("identity has {0} trailing bytes")]
    Trailing(usize),
    #[error("identity is {bytes} bytes, more than the {IDENTITY_BYTES_MAX} allowed")]
    TooLarge { bytes: usize },
    #[error("{count} attributes, at most {ATTRIBUTES_MAX} allowed")]
    TooManyAttributes { count: usize },
    #[error("attribute {key:?}: {reason}")]
    Attribute { key: String, reason: &'static str },
    #[error("attributes are not sorted by key without duplicates")]
    AttributeOrder,
    #[error("node id 0 is reserved for seed addresses")]
    ZeroNodeId,
}

/// Who a broker is, as the cluster sees it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// The operator-given node id (positive; 0 marks a seed placeholder).
    pub node_id: u64,
    /// Grows with every start and every rejoin after being declared dead.
    pub incarnation: u64,
    /// The client (wire protocol) address, which is also the SWIM address.
    pub client_addr: SocketAddr,
    /// The admin HTTP address.
    pub admin_addr: Option<SocketAddr>,
    /// The raft transport address of the vnode groups, once there is one.
    pub raft_addr: Option<SocketAddr>,
    /// The ractor_cluster node server address.
    pub cluster_addr: Option<SocketAddr>,
    /// Operator-given attributes (zone, rack, ...).
    pub attributes: BTreeMap<String, String>,
}

impl fmt::Debug for NodeIdentity {
    // Identities show up in every foca trace line: keep them to one short token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node{}#{}@{}",
            self.node_id, self.incarnation, self.client_addr
        )
    }
}

impl NodeIdentity {
    /// The placeholder foca announces to when only a seed's address is known.
    /// foca accepts an announce addressed to any identity with the receiver's
    /// address, so the seed answers with its real identity.
    pub fn seed(addr: SocketAddr) -> NodeIdentity {
        NodeIdentity {
            node_id: 0,
            incarnation: 0,
            client_addr: addr,
            admin_addr: None,
            raft_addr: None,
            cluster_addr: None,
            attributes: BTreeMap::new(),
        }
    }

    /// Whether this is a seed placeholder rather than a real broker.
    pub fn is_seed_placeholder(&self) -> bool {
        self.node_id == 0
    }

    /// Checks the bounds a real broker's identity must meet.
    pub fn validate(&self) -> Result<(), IdentityError> {
        if self.node_id == 0 {
            return Err(IdentityError::ZeroNodeId);
        }
        self.encode().map(|_| ())
    }

    /// Encodes the identity (version 1).
    pub fn encode(&self) -> Result<Vec<u8>, IdentityError> {
        if self.attributes.len() > ATTRIBUTES_MAX {
            return Err(IdentityError::TooManyAttributes {
                count: self.attributes.len(),
            });
        }
        let mut out = Vec::with_capacity(64);
        out.push(IDENTITY_VERSION);
        out.extend_from_slice(&self.node_id.to_be_bytes());
        out.extend_from_slice(&self.incarnation.to_be_bytes());
        put_addr(&mut out, self.client_addr);
        put_opt_addr(&mut out, self.admin_addr);
        put_opt_addr(&mut out, self.raft_addr);
        put_opt_addr(&mut out, self.cluster_addr);
        // Bounded by ATTRIBUTES_MAX above.
        out.push(self.attributes.len() as u8);
        for (key, value) in &self.attributes {
            check_attribute(key, value)?;
            out.push(key.len() as u8);
            out.extend_from_slice(key.as_bytes());
            out.push(value.len() as u8);
            out.extend_from_slice(value.as_bytes());
        }
        if out.len() > IDENTITY_BYTES_MAX {
            return Err(IdentityError::TooLarge { bytes: out.len() });
        }
        Ok(out)
    }

    /// Decodes exactly one identity from `bytes`; trailing bytes are an error.
    pub fn decode(bytes: &[u8]) -> Result<NodeIdentity, IdentityError> {
        if bytes.len() > IDENTITY_BYTES_MAX {
            return Err(IdentityError::TooLarge { bytes: bytes.len() });
        }
        let mut r = Reader { bytes };
        let version = r.u8()?;
        if version != IDENTITY_VERSION {
            return Err(IdentityError::Version(version));
        }
        let node_id = r.u64()?;
        let incarnation = r.u64()?;
        let client_addr = r.addr()?;
        let admin_addr = r.opt_addr()?;
        let raft_addr = r.opt_addr()?;
        let cluster_addr = r.opt_addr()?;
        let count = usize::from(r.u8()?);
        if count > ATTRIBUTES_MAX {
            return Err(IdentityError::TooManyAttributes { count });
        }
        let mut attributes = BTreeMap::new();
        let mut last: Option<String> = None;
        for _ in 0..count {
            let key = r.string()?;
            let value = r.string()?;
            check_attribute(&key, &value)?;
            if last.as_ref().is_some_and(|last| *last >= key) {
                return Err(IdentityError::AttributeOrder);
            }
            last = Some(key.clone());
            attributes.insert(key, value);
        }
        if !r.bytes.is_empty() {
            return Err(IdentityError::Trailing(r.bytes.len()));
        }
        Ok(NodeIdentity {
            node_id,
            incarnation,
            client_addr,
            admin_addr,
            raft_addr,
            cluster_addr,
            attributes,
        })
    }
}

fn check_attribute(key: &str, value: &str) -> Result<(), IdentityError> {
    let bad = |reason| {
        Err(IdentityError::Attribute {
            key: key.chars().take(ATTRIBUTE_KEY_BYTES_MAX).collect(),
            reason,
        })
    };
    if key.is_empty() {
        return bad("the key is empty");
    }
    if key.len() > ATTRIBUTE_KEY_BYTES_MAX {
        return bad("the key is longer than 64 bytes");
    }
    if value.len() > ATTRIBUTE_VALUE_BYTES_MAX {
        return bad("the value is longer than 128 bytes");
    }
    Ok(())
}

fn put_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

fn put_opt_addr(out: &mut Vec<u8>, addr: Option<SocketAddr>) {
    match addr {
        None => out.push(0),
        Some(addr) => put_addr(out, addr),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], IdentityError> {
        if self.bytes.len() < n {
            return Err(IdentityError::Truncated {
                needed: n - self.bytes.len(),
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, IdentityError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, IdentityError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u64(&mut self) -> Result<u64, IdentityError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }

    fn addr_of_family(&mut self, family: u8) -> Result<SocketAddr, IdentityError> {
        let ip = match family {
            4 => {
                let mut a = [0u8; 4];
                a.copy_from_slice(self.take(4)?);
                IpAddr::V4(Ipv4Addr::from(a))
            }
            6 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(self.take(16)?);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            other => return Err(IdentityError::AddressFamily(other)),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }

    fn addr(&mut self) -> Result<SocketAddr, IdentityError> {
        let family = self.u8()?;
        self.addr_of_family(family)
    }

    fn opt_addr(&mut self) -> Result<Option<SocketAddr>, IdentityError> {
        match self.u8()? {
            0 => Ok(None),
            family => self.addr_of_family(family).map(Some),
        }
    }

    fn string(&mut self) -> Result<String, IdentityError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| IdentityError::Attribute {
            key: String::new(),
            reason: "not UTF-8",
        })
    }
}

/// foca carries identities inside its own (postcard) messages: an identity
/// serializes as one byte string in the format above, so the codec the tests
/// check is the one on the wire.
impl Serialize for NodeIdentity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes = self.encode().map_err(serde::ser::Error::custom)?;
        serializer.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for NodeIdentity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;
        impl Visitor<'_> for BytesVisitor {
            type Value = NodeIdentity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an encoded node identity")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<NodeIdentity, E> {
                NodeIdentity::decode(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_bytes(BytesVisitor)
    }
}

impl foca::Identity for NodeIdentity {
    type Addr = SocketAddr;

    /// After the cluster declared this broker dead (it was paused, or
    /// partitioned), it rejoins as a new incarnation of itself instead of
    /// staying out for good.
    fn renew(&self) -> Option<Self> {
        Some(NodeIdentity {
            incarnation: self.incarnation.saturating_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// Two identities on one address: the later start wins. The node id
    /// breaks a tie so the choice is the same on every member.
    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.incarnation, self.node_id) > (adversary.incarnation, adversary.node_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::Identity;
    use proptest::prelude::*;

    fn sample() -> NodeIdentity {
        NodeIdentity {
            node_id: 3,
            incarnation: 1_700_000_000_000,
            client_addr: "127.0.0.1:4042".parse().unwrap(),
            admin_addr: Some("127.0.0.1:8082".parse().unwrap()),
            raft_addr: None,
            cluster_addr: Some("[::1]:9000".parse().unwrap()),
            attributes: [("zone".to_owned(), "a".to_owned())].into(),
        }
    }

    #[test]
    fn an_identity_round_trips_through_its_bytes() {
        let id = sample();
        let bytes = id.encode().unwrap();
        assert_eq!(bytes[0], IDENTITY_VERSION);
        assert_eq!(NodeIdentity::decode(&bytes).unwrap(), id);
    }

    #[test]
    fn an_identity_round_trips_through_postcard_as_foca_sends_it() {
        let id = sample();
        let bytes = postcard_bytes(&id);
        let back: NodeIdentity = decode_postcard(&bytes).unwrap();
        assert_eq!(back, id);
    }

    fn postcard_bytes(id: &NodeIdentity) -> Vec<u8> {
        use foca::Codec;
        let mut codec = foca::PostcardCodec;
        let member = foca::Member::alive(id.clone());
        let mut out = Vec::new();
        codec.encode_member(&member, &mut out).unwrap();
        out
    }

    fn decode_postcard(bytes: &[u8]) -> Option<NodeIdentity> {
        use foca::Codec;
        let mut codec = foca::PostcardCodec;
        let member: foca::Member<NodeIdentity> = codec.decode_member(bytes).ok()?;
        Some(member.id().clone())
    }

    #[test]
    fn unsorted_or_duplicate_attributes_are_refused() {
        let mut bytes = sample().encode().unwrap();
        // Append a second attribute "a" after "zone": out of order.
        let count_at = bytes.len() - (1 + 4 + 1 + 1) - 1;
        bytes[count_at] = 2;
        bytes.extend_from_slice(&[1, b'a', 1, b'b']);
        assert_eq!(
            NodeIdentity::decode(&bytes),
            Err(IdentityError::AttributeOrder)
        );
    }

    #[test]
    fn the_formation_cards_node_list_bound_is_the_attribute_value_bound() {
        assert_eq!(
            malachi_core::formation::NODES_ATTR_BYTES_MAX,
            ATTRIBUTE_VALUE_BYTES_MAX
        );
    }

    #[test]
    fn oversized_attributes_are_refused_at_encode() {
        let mut id = sample();
        id.attributes = (0..=ATTRIBUTES_MAX)
            .map(|i| (format!("k{i}"), "v".to_owned()))
            .collect();
        assert!(matches!(
            id.encode(),
            Err(IdentityError::TooManyAttributes { .. })
        ));
        let mut id = sample();
        id.attributes = [("k".to_owned(), "v".repeat(ATTRIBUTE_VALUE_BYTES_MAX + 1))].into();
        assert!(matches!(id.encode(), Err(IdentityError::Attribute { .. })));
    }

    #[test]
    fn a_later_incarnation_wins_the_address_and_renew_bumps_it() {
        let old = sample();
        let new = old.renew().unwrap();
        assert_eq!(new.incarnation, old.incarnation + 1);
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
        assert_eq!(new.addr(), old.addr());
    }

    #[test]
    fn a_seed_placeholder_is_not_a_valid_broker_identity() {
        let seed = NodeIdentity::seed("127.0.0.1:1".parse().unwrap());
        assert!(seed.is_seed_placeholder());
        assert_eq!(seed.validate(), Err(IdentityError::ZeroNodeId));
    }

    fn arb_addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(ip.into()), port)),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(ip.into()), port)),
        ]
    }

    fn arb_identity() -> impl Strategy<Value = NodeIdentity> {
        (
            1u64..,
            any::<u64>(),
            arb_addr(),
            proptest::option::of(arb_addr()),
            proptest::option::of(arb_addr()),
            proptest::option::of(arb_addr()),
            proptest::collection::btree_map("[a-z.]{1,16}", "[ -~]{0,24}", 0..6),
        )
            .prop_map(
                |(node_id, incarnation, client, admin, raft, cluster, attributes)| NodeIdentity {
                    node_id,
                    incarnation,
                    client_addr: client,
                    admin_addr: admin,
                    raft_addr: raft,
                    cluster_addr: cluster,
                    attributes,
                },
            )
    }

    proptest! {
        #[test]
        fn any_valid_identity_round_trips(id in arb_identity()) {
            let bytes = id.encode().unwrap();
            prop_assert!(bytes.len() <= IDENTITY_BYTES_MAX);
            prop_assert_eq!(NodeIdentity::decode(&bytes).unwrap(), id.clone());
            prop_assert_eq!(decode_postcard(&postcard_bytes(&id)), Some(id));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = NodeIdentity::decode(&bytes);
            let _ = decode_postcard(&bytes);
        }

        #[test]
        fn a_corrupted_identity_never_panics(id in arb_identity(), at in any::<usize>(), byte in any::<u8>()) {
            let mut bytes = id.encode().unwrap();
            let at = at % bytes.len();
            bytes[at] = byte;
            if let Ok(back) = NodeIdentity::decode(&bytes) {
                // Whatever decodes re-encodes to the same bytes: the format
                // has one encoding per identity.
                prop_assert_eq!(back.encode().unwrap(), bytes);
            }
        }

        #[test]
        fn a_truncated_identity_is_an_error(id in arb_identity(), cut in any::<usize>()) {
            let bytes = id.encode().unwrap();
            let cut = cut % bytes.len();
            prop_assert!(NodeIdentity::decode(&bytes[..cut]).is_err());
        }
    }
}
