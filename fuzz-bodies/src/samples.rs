//! Valid encodings, as the product writes them, for every body: proptests
//! mutate them (and the fuzz corpus can be seeded from them) to reach past
//! the first checks that random bytes rarely pass.

use super::CURSOR_SECRET;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::{Bytes, BytesMut};
use hmac::{Hmac, Mac};
use malachi_cluster::group::untrusted;
use malachi_cluster::vnodes::broker_api;
use malachi_core::cursor::{CURSOR_VERSION, Cursor, CursorKey, CursorKeys, Position};
use malachi_core::model::{MetadataState, RangeId, SegmentId};
use malachi_core::ring::{Ring, VnodeId};
use malachi_membership::{NodeIdentity, RoutingHint, VnodeLeader};
use malachi_storage::frame;
use malachi_storage::index::SparseIndex;
use malachi_storage::{Record, SealInfo, marker};
use malachi_wire::messages::ApiVersionsRequest;
use malachi_wire::{ClientCodec, ErrorCode, Message, RequestFrame, ResponseFrame, ServerCodec};
use sha2::Sha256;
use tokio_util::codec::Encoder;

/// Must match `cursor.rs`'s domain separator: the cursor body signs bytes
/// under it so the fuzzer reaches the deserializer behind the tag.
const CURSOR_DOMAIN: &[u8] = b"malachi-cursor\0";

/// `body` as a cursor string: version, key id 0, body, then the tag the
/// product's key 0 computes, so `Cursor::decode` authenticates it and
/// deserializes `body`.
pub fn sign_cursor_body(body: &[u8]) -> String {
    let mut raw = vec![CURSOR_VERSION];
    raw.extend_from_slice(&0u32.to_be_bytes());
    let header = raw.clone();
    raw.extend_from_slice(body);
    if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(CURSOR_SECRET) {
        mac.update(CURSOR_DOMAIN);
        mac.update(&header);
        mac.update(body);
        raw.extend_from_slice(&mac.finalize().into_bytes());
    }
    URL_SAFE_NO_PAD.encode(&raw)
}

/// A frame holding one record with a header.
pub fn storage_frame() -> Vec<u8> {
    let record = Record {
        timestamp_ms: 9,
        key: b"k".to_vec(),
        value: b"value".to_vec(),
        headers: vec![("h".to_owned(), vec![1, 2])],
    };
    let mut out = Vec::new();
    frame::encode(&mut out, 5, 3, &record);
    out
}

/// An index of three entries, behind an eight-byte limit prefix the body
/// reads (the first entry's offset doubles as that limit).
pub fn storage_index() -> Vec<u8> {
    let mut index = SparseIndex::new(1);
    for (offset, position) in [(1 << 40, 0), ((1 << 40) + 1, 100), ((1 << 40) + 5, 200)] {
        let _ = index.observe(offset, position);
    }
    index.encode_from(0)
}

/// A seal marker.
pub fn storage_seal() -> Vec<u8> {
    marker::encode_seal(SealInfo {
        length: 42,
        byte_size: 4242,
    })
    .to_vec()
}

/// A cursor's body bytes (what `cursor` signs), taken from a real cursor.
pub fn cursor_body() -> Vec<u8> {
    let Ok(key) = CursorKey::new(CURSOR_SECRET) else {
        return Vec::new();
    };
    let key = CursorKeys::single(0, key);
    let cursor = Cursor {
        topic: "orders".to_owned(),
        incarnation: 2,
        positions: [
            (RangeId(1), Position::Start),
            (
                RangeId(4),
                Position::At {
                    segment: SegmentId(7),
                    offset: 99,
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    let Ok(encoded) = cursor.encode(&key) else {
        return Vec::new();
    };
    let raw = URL_SAFE_NO_PAD.decode(encoded).unwrap_or_default();
    // Version byte and key id first, 32-byte tag last.
    raw.get(5..raw.len().saturating_sub(32))
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// The empty metadata state's snapshot.
pub fn metadata_snapshot() -> Vec<u8> {
    MetadataState::default().snapshot().unwrap_or_default()
}

/// A snapshot file of the state machine.
pub fn snapshot_file() -> Vec<u8> {
    untrusted::samples::snapshot_file()
}

/// A raft log file of group [`super::RAFT_GROUP_ID`].
pub fn raft_log() -> Vec<u8> {
    untrusted::samples::raft_log(super::RAFT_GROUP_ID)
}

/// A raft vote file.
pub fn raft_vote() -> Vec<u8> {
    untrusted::samples::raft_vote()
}

/// The raft RPC bodies, each behind the byte that picks its api key.
pub fn raft_rpc() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for pick in 0u8..5 {
        let api_key = 200 + u16::from(pick);
        for body in [
            untrusted::samples::raft_request(api_key),
            untrusted::samples::raft_response(api_key),
        ] {
            let mut sample = vec![pick];
            sample.extend(body);
            out.push(sample);
        }
    }
    out
}

/// The forwarding RPC bodies, each behind the byte that picks its api key.
pub fn forwarded_rpc() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (pick, &api_key) in broker_api::FORWARDED_API_KEYS.iter().enumerate() {
        for body in [
            broker_api::sample_forwarded_request(api_key),
            broker_api::sample_forwarded_answer(api_key),
        ] {
            let mut sample = vec![pick as u8];
            sample.extend(body);
            out.push(sample);
        }
    }
    out
}

/// A ring of four vnodes, one of them split.
pub fn ring() -> Vec<u8> {
    let Ok(mut ring) = Ring::new(4) else {
        return Vec::new();
    };
    let _ = ring.split(VnodeId(1));
    ring.encode().unwrap_or_default()
}

/// An identity with every address and an attribute.
pub fn membership_identity() -> Vec<u8> {
    let addr = |port| std::net::SocketAddr::from(([10, 0, 0, 1], port));
    let identity = NodeIdentity {
        node_id: 3,
        incarnation: 2,
        client_addr: addr(9092),
        admin_addr: Some(addr(9093)),
        raft_addr: Some(std::net::SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], 9094))),
        cluster_addr: None,
        attributes: [("zone".to_owned(), "a".to_owned())].into_iter().collect(),
    };
    identity.encode().unwrap_or_default()
}

/// A routing hint naming two leaders.
pub fn membership_routing() -> Vec<u8> {
    RoutingHint {
        node_id: 3,
        incarnation: 2,
        seq: 9,
        ring_version: 4,
        leaders: vec![
            VnodeLeader { vnode: 1, term: 3 },
            VnodeLeader { vnode: 2, term: 1 },
        ],
    }
    .encode()
    .unwrap_or_default()
}

/// A request frame then a response frame, as clients and servers write them.
pub fn wire_frame() -> Vec<u8> {
    let payload = ApiVersionsRequest::default().encode().unwrap_or_default();
    let mut out = BytesMut::new();
    let _ = ClientCodec::new(super::WIRE_FRAME_BYTES_MAX).encode(
        RequestFrame {
            api_key: 0,
            correlation_id: 7,
            payload: payload.clone(),
        },
        &mut out,
    );
    let _ = ServerCodec::new(super::WIRE_FRAME_BYTES_MAX).encode(
        ResponseFrame {
            correlation_id: 7,
            error_code: ErrorCode::None,
            payload: Bytes::new(),
        },
        &mut out,
    );
    out.to_vec()
}

/// An api versions request behind its pick byte (api key 0 is `ALL[0]`).
pub fn wire_messages() -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&ApiVersionsRequest::default().encode().unwrap_or_default());
    out
}

/// A remote call the node actor accepts: a call (flag 1) of `tree_snapshot`
/// with no arguments.
pub fn fabric_message() -> Vec<u8> {
    let name = b"tree_snapshot";
    let mut out = vec![1, name.len() as u8];
    out.extend_from_slice(name);
    out
}

/// A replica-append carrying one stored frame.
pub fn replica_append() -> Vec<u8> {
    use malachi_wire::replication::ReplicaAppendRequest;
    let request = ReplicaAppendRequest {
        topic: "orders".into(),
        segment: 7,
        epoch: 1,
        first_offset: 0,
        committed_end: 0,
        repair: None,
        frames: Bytes::from(storage_frame()),
    };
    request.encode().map(|b| b.to_vec()).unwrap_or_default()
}

/// A broker's replica-status answer about one open copy (ADR 0098).
pub fn replica_status() -> Vec<u8> {
    use malachi_wire::replica_status::{CopyStatus, ReplicaStatusResponse};
    ReplicaStatusResponse {
        copies: vec![CopyStatus {
            segment: 7,
            open: true,
            durable_end: Some(12),
            durable_bytes: Some(1_024),
            committed_end: Some(10),
            leading: true,
            ..CopyStatus::default()
        }],
        scrub: Vec::new(),
        health: Vec::new(),
        reshaping: None,
        // A sealed table's sidecar travels as one msgpack bin (ADR 0156).
        producer_tables: vec![malachi_wire::replica_status::SealedProducers {
            segment: 7,
            sidecar: b"MLPS\x01".to_vec(),
        }],
    }
    .encode()
    .map(|b| b.to_vec())
    .unwrap_or_default()
}

/// A follower's refusal of a replica-append.
pub fn replica_refusal() -> Vec<u8> {
    use malachi_wire::replication::{ReplicaAppendResponse, ReplicaRefusal};
    ReplicaAppendResponse::refused(ReplicaRefusal::NotAtEnd, 4, "ends at 4")
        .encode()
        .map(|b| b.to_vec())
        .unwrap_or_default()
}

/// A replica-append repairing a fenced copy under a coordinator's order
/// (issue 19).
pub fn replica_repair() -> Vec<u8> {
    use malachi_wire::replica_order::OrderEpoch;
    use malachi_wire::replication::{RepairOrder, ReplicaAppendRequest};
    let request = ReplicaAppendRequest {
        topic: "orders".into(),
        segment: 7,
        epoch: 1,
        first_offset: 0,
        committed_end: 0,
        repair: Some(RepairOrder {
            to: 1,
            order: OrderEpoch { group: 4, term: 9 },
        }),
        frames: Bytes::from(storage_frame()),
    };
    request.encode().map(|b| b.to_vec()).unwrap_or_default()
}

/// The coordinator's orders (issue 19) and a copy's answers to them: a
/// fence and a sealed copy's fence answer, a catch-up and an answer
/// carrying one stored frame, a seal and a `short` refusal of one, a drop
/// order and its answer (ADR 0115).
pub fn replica_orders() -> Vec<Vec<u8>> {
    use malachi_wire::replica_order::{
        CATCH_UP_BYTES_MAX, CatchUpRequest, CatchUpResponse, DropCopiesRequest, DropCopiesResponse,
        FenceRequest, FenceResponse, OrderEpoch, OrderRefusal, SealRequest, SealResponse, SealedAt,
    };
    let order = OrderEpoch { group: 4, term: 9 };
    let sealed = SealedAt {
        length: 1,
        bytes: storage_frame().len() as u64,
    };
    let encoded = [
        FenceRequest {
            topic: "orders".into(),
            segment: 7,
            order,
        }
        .encode(),
        FenceResponse::fenced(1, sealed.bytes, order)
            .with_seal(sealed)
            .encode(),
        CatchUpRequest {
            topic: "orders".into(),
            segment: 7,
            order,
            from: 0,
            bytes_max: CATCH_UP_BYTES_MAX,
        }
        .encode(),
        CatchUpResponse::frames(0, 1, Bytes::from(storage_frame())).encode(),
        SealRequest {
            topic: "orders".into(),
            segment: 7,
            order,
            length: 1,
        }
        .encode(),
        SealResponse::refused(OrderRefusal::Short, 0, "durable to 0").encode(),
        DropCopiesRequest {
            topic: "orders".into(),
            segments: vec![7, 8],
        }
        .encode(),
        DropCopiesResponse {
            removed: vec![7],
            kept: vec![8],
            freed_bytes: 4096,
            message: String::new(),
        }
        .encode(),
    ];
    encoded
        .into_iter()
        .map(|b| b.map(|b| b.to_vec()).unwrap_or_default())
        .collect()
}

/// The RFC 7677 example's client nonce, which the SCRAM body's client uses.
pub const SCRAM_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
/// The RFC 7677 example's server nonce, which the SCRAM body's broker uses.
pub const SCRAM_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";

/// Each authentication message (api keys 400 to 402) as encoded, the
/// RFC 7677 example's four SCRAM messages as text, then the user and ACL
/// messages (403 to 409).
pub fn wire_auth() -> Vec<Vec<u8>> {
    use malachi_wire::auth::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse, TokenAuthenticateRequest, TokenAuthenticateResponse,
    };
    let encoded = [
        SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        }
        .encode(),
        SaslHandshakeResponse {
            accepted: true,
            mechanisms: vec!["SCRAM-SHA-256".into()],
        }
        .encode(),
        SaslAuthenticateRequest {
            auth_bytes: "n,,n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
        }
        .encode(),
        SaslAuthenticateResponse {
            auth_bytes: "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".into(),
            complete: true,
            principal: Some("User:user".into()),
            session_lifetime_ms: Some(3_600_000),
        }
        .encode(),
        TokenAuthenticateRequest {
            token: "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2ln".into(),
        }
        .encode(),
        TokenAuthenticateResponse {
            principal: "User:user".into(),
            session_lifetime_ms: None,
        }
        .encode(),
    ];
    let scram = [
        "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
    ];
    // The administration messages go last: the first ten keep their places.
    encoded
        .into_iter()
        .map(|b| b.map(|b| b.to_vec()).unwrap_or_default())
        .chain(scram.iter().map(|s| s.as_bytes().to_vec()))
        .chain(
            auth_admin()
                .into_iter()
                .map(|b| b.map(|b| b.to_vec()).unwrap_or_default()),
        )
        .collect()
}

/// The user and ACL administration messages (api keys 403 to 409) as encoded.
fn auth_admin() -> Vec<Result<bytes::Bytes, malachi_wire::WireError>> {
    use malachi_wire::auth_admin::*;
    let entry = AclEntryText {
        principal: "User:alice".into(),
        resource: "topic".into(),
        pattern: "prefixed".into(),
        name: "orders".into(),
        operation: "produce".into(),
        permission: "allow".into(),
    };
    vec![
        PutUserRequest {
            name: "alice".into(),
            credential: UserCredential {
                salt: "W22ZaJ0SNY7soEsUEjb6gQ==".into(),
                iterations: 4096,
                stored_key: "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=".into(),
                server_key: "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=".into(),
            },
            replace: false,
        }
        .encode(),
        ListUsersResponse {
            users: vec![UserSummary {
                name: "alice".into(),
                iterations: 4096,
                created_at_ms: 1,
                updated_at_ms: 2,
                locked_sources: 0,
            }],
        }
        .encode(),
        AddAclRequest {
            entry: entry.clone(),
        }
        .encode(),
        ListAclsResponse {
            entries: vec![entry],
        }
        .encode(),
    ]
}

/// 402 `token_authenticate` with a token the `wire_token` body's key
/// verifies, and the issuer key messages.
pub fn wire_token() -> Vec<Vec<u8>> {
    use malachi_core::auth::token::{MintRequest, TokenAlgorithm, mint};
    use malachi_wire::auth::TokenAuthenticateRequest;
    use malachi_wire::token_keys::*;
    let token = mint(
        crate::TOKEN_PRIVATE_KEY_PEM.as_bytes(),
        &MintRequest {
            algorithm: TokenAlgorithm::EdDSA,
            kid: "k1",
            subject: "alice",
            now_ms: crate::TOKEN_NOW_MS,
            lifetime_ms: 3_600_000,
            not_before_ms: None,
            audience: None,
        },
    )
    .expect("the sample key signs");
    let key = TokenKeyText {
        kid: "k1".into(),
        algorithm: "EdDSA".into(),
        public_key_pem: crate::TOKEN_PUBLIC_KEY_PEM.into(),
        added_at_ms: 1,
    };
    let encoded = [
        TokenAuthenticateRequest {
            token: token.clone(),
        }
        .encode(),
        PutTokenKeyRequest { key: key.clone() }.encode(),
        PutTokenKeyResponse {
            kid: "k1".into(),
            changed: true,
        }
        .encode(),
        DeleteTokenKeyRequest { kid: "k1".into() }.encode(),
        ListTokenKeysResponse { keys: vec![key] }.encode(),
    ];
    let mut samples: Vec<Vec<u8>> = encoded
        .into_iter()
        .map(|m| m.expect("a valid sample").to_vec())
        .collect();
    samples.push(token.into_bytes());
    samples
}
