//! The body of every fuzz target: one plain function per decoder of untrusted
//! bytes, each calling the decoder the product itself uses.
//!
//! Each body decodes `data`; when it decodes, it re-encodes and asserts the
//! round trip (decode(encode(x)) == x, or, where the type has no equality,
//! that the canonical re-encoding is stable). A body panics only when that
//! invariant breaks or the product decoder itself panics: both are bugs.
//! `fuzz/fuzz_targets/*.rs` call these one line each; `tests/bodies.rs`
//! drives them with proptest over random bytes and mutated valid samples
//! from [`samples`].
#![allow(clippy::expect_used, clippy::unwrap_used)] // a failed assertion is the finding

use bytes::{Bytes, BytesMut};
use malachi_cluster::group::untrusted;
use malachi_cluster::vnodes::broker_api;
use malachi_core::cursor::{Cursor, CursorKey, CursorKeys};
use malachi_core::model::MetadataState;
use malachi_core::ring::Ring;
use malachi_membership::{NodeIdentity, RoutingHint};
use malachi_storage::frame;
use malachi_storage::index::{INDEX_ENTRY_BYTES, SparseIndex};
use malachi_storage::marker;
use malachi_wire::{
    ApiKey, ClientCodec, ErrorBody, Message, RecordBatch, Request, Response, ServerCodec,
};
use tokio_util::codec::Decoder;

pub mod samples;

/// The frame limit the wire bodies decode under (the product's default order).
pub const WIRE_FRAME_BYTES_MAX: usize = 1 << 20;
/// The raft log entry limit the raft log body decodes under.
pub const RAFT_ENTRY_BYTES_MAX: u64 = 1 << 20;
/// The group id the raft log body expects in the header.
pub const RAFT_GROUP_ID: u64 = 1;
/// The snapshot limit the snapshot file body decodes under.
pub const SNAPSHOT_BYTES_MAX: u64 = 1 << 20;
/// The secret cursors are authenticated under in the cursor body.
pub const CURSOR_SECRET: &[u8; 32] = b"malachi-fuzz-cursor-secret-32byt";

/// The store's record frame (`malachi_storage::frame::decode`): whatever
/// decodes re-encodes to exactly the bytes it was decoded from.
pub fn storage_frame(data: &[u8]) {
    if let Ok((view, len)) = frame::decode(data) {
        let mut again = Vec::new();
        frame::encode(
            &mut again,
            view.offset,
            view.durable_below,
            &view.to_record(),
        );
        assert_eq!(&again[..], &data[..len]);
    }
    let _ = frame::peek_len(data);
}

/// The index sidecar `.idx` (`SparseIndex::decode`, what `SparseIndex::load`
/// runs on the file): the kept entries re-encode to a prefix of the input
/// and decode again to the same entries.
pub fn storage_index(data: &[u8]) {
    let limit = data.get(..8).map_or(u64::MAX, |b| {
        u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8]))
    });
    let index = SparseIndex::decode(data, 4096, limit);
    let encoded = index.encode_from(0);
    assert_eq!(encoded.len(), index.entries().len() * INDEX_ENTRY_BYTES);
    assert_eq!(&encoded[..], &data[..encoded.len()]);
    let again = SparseIndex::decode(&encoded, 4096, limit);
    assert_eq!(again.entries(), index.entries());
}

/// The seal marker (`malachi_storage::marker::decode_seal`): a marker that
/// decodes re-encodes to exactly its bytes. (The fence marker is an empty
/// file whose existence is the fence: it has no bytes to decode.)
pub fn storage_seal(data: &[u8]) {
    if let Ok(info) = marker::decode_seal(data) {
        let again = marker::encode_seal(info);
        assert_eq!(&again[..], data);
        assert_eq!(marker::decode_seal(&again), Ok(info));
    }
}

/// The read cursor (`Cursor::decode`): the opaque string as given, then the
/// same bytes as a body signed under the key, so the fuzzer reaches the
/// deserializer behind the tag.
pub fn cursor(data: &[u8]) {
    let key = CursorKeys::single(
        0,
        CursorKey::new(CURSOR_SECRET).expect("a 32-byte secret is valid"),
    );
    let check = |encoded: &str| {
        if let Ok(cursor) = Cursor::decode(encoded, &key) {
            let again = cursor.encode(&key).expect("a decoded cursor re-encodes");
            assert_eq!(Cursor::decode(&again, &key).expect("and decodes"), cursor);
        }
    };
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    check(&samples::sign_cursor_body(data));
    let _ = Cursor::decode_for(
        &samples::sign_cursor_body(data),
        &key,
        &MetadataState::default(),
    );
}

/// The metadata snapshot (`MetadataState::restore`), and the state machine's
/// snapshot file around it (`group::untrusted::snapshot_file`).
pub fn metadata_snapshot(data: &[u8]) {
    if let Ok(state) = MetadataState::restore(data) {
        let again = state.snapshot().expect("a restored state snapshots");
        assert_eq!(MetadataState::restore(&again).expect("and restores"), state);
    }
    stable(|b| untrusted::snapshot_file(b, SNAPSHOT_BYTES_MAX), data);
}

/// The raft log and vote files (`LogStore::open`'s decoding, through
/// `group::untrusted::raft_log` and `raft_vote`).
pub fn raft_log(data: &[u8]) {
    stable(
        |b| untrusted::raft_log(b, RAFT_GROUP_ID, RAFT_ENTRY_BYTES_MAX),
        data,
    );
    stable(untrusted::raft_vote, data);
}

/// The raft transport's RPC bodies: the first byte picks the api key (200 to
/// 203), the rest is the request or answer body.
pub fn raft_rpc(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let api_key = 200 + u16::from(pick % 5);
    stable(|b| untrusted::raft_request(api_key, b), body);
    stable(|b| untrusted::raft_response(api_key, b), body);
}

/// The forwarding transport's bodies (`vnodes::broker_api`): the first byte
/// picks the api key, the rest is the request or answer body.
pub fn forwarded_rpc(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let keys = broker_api::FORWARDED_API_KEYS;
    let api_key = keys[usize::from(pick) % keys.len()];
    stable(|b| broker_api::decode_forwarded_request(api_key, b), body);
    stable(|b| broker_api::decode_forwarded_answer(api_key, b), body);
}

/// The ring (`Ring::decode`, as ring announcements and the ring record carry it).
pub fn ring(data: &[u8]) {
    if let Ok(ring) = Ring::decode(data) {
        let again = ring.encode().expect("a decoded ring re-encodes");
        assert_eq!(Ring::decode(&again).expect("and decodes"), ring);
    }
}

/// The membership identity (`NodeIdentity::decode`, and the same identity in
/// foca's postcard codec as SWIM packets carry it).
pub fn membership_identity(data: &[u8]) {
    if let Ok(identity) = NodeIdentity::decode(data) {
        let again = identity.encode().expect("a decoded identity re-encodes");
        assert_eq!(NodeIdentity::decode(&again).expect("and decodes"), identity);
    }
    use foca::Codec;
    let mut codec = foca::PostcardCodec;
    if let Ok(member) = foca::Codec::<NodeIdentity>::decode_member(&mut codec, data) {
        let mut out = Vec::new();
        codec
            .encode_member(&member, &mut out)
            .expect("a member re-encodes");
        let back: foca::Member<NodeIdentity> = codec.decode_member(&out[..]).expect("and decodes");
        assert_eq!(back.id(), member.id());
    }
}

/// The routing hint (`RoutingHint::decode`).
pub fn membership_routing(data: &[u8]) {
    if let Ok(hint) = RoutingHint::decode(data) {
        let again = hint.encode().expect("a decoded hint re-encodes");
        assert_eq!(RoutingHint::decode(&again).expect("and decodes"), hint);
    }
}

/// The wire frame codecs (server and client side) and each frame's payload
/// as the request or response its api key names, and as an error body.
pub fn wire_frame(data: &[u8]) {
    let mut buffer = BytesMut::from(data);
    let mut server = ServerCodec::new(WIRE_FRAME_BYTES_MAX);
    while let Ok(Some(frame)) = server.decode(&mut buffer) {
        wire_request(frame.api_key, frame.payload);
    }
    let mut buffer = BytesMut::from(data);
    let mut client = ClientCodec::new(WIRE_FRAME_BYTES_MAX);
    while let Ok(Some(frame)) = client.decode(&mut buffer) {
        for key in ApiKey::ALL {
            wire_response(key, frame.payload.clone());
        }
        let _ = ErrorBody::decode(frame.payload.clone());
    }
}

/// The request and response bodies: the first byte picks the api key, the
/// rest is the payload; then the bytes as a record batch block.
pub fn wire_messages(data: &[u8]) {
    if let Some((&pick, payload)) = data.split_first() {
        let key = ApiKey::ALL[usize::from(pick) % ApiKey::ALL.len()];
        let payload = Bytes::copy_from_slice(payload);
        wire_request(key.code(), payload.clone());
        wire_response(key, payload.clone());
        let _ = ErrorBody::decode(payload);
    }
    if let Ok(batch) = RecordBatch::from_block(Bytes::copy_from_slice(data)) {
        let records = batch.records();
        assert_eq!(records.len(), batch.count() as usize);
        let again = RecordBatch::from_records(&records, usize::MAX).expect("records re-encode");
        assert_eq!(again.block(), batch.block());
    }
}

fn wire_request(api_key: u16, payload: Bytes) {
    if let Ok(request) = Request::decode(api_key, payload) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(
            Request::decode(api_key, again).expect("and decodes"),
            request
        );
    }
}

fn wire_response(key: ApiKey, payload: Bytes) {
    if let Ok(response) = Response::decode(key, payload) {
        let again = response.encode().expect("a decoded response re-encodes");
        assert_eq!(Response::decode(key, again).expect("and decodes"), response);
    }
}

/// A replica-append (api key 100) as a follower decodes it on the cluster
/// port, and its answer as the primary decodes it: what decodes re-encodes
/// to itself; then the other replication messages of the cluster port
/// (replica-status, and the coordinator's fence, catch-up and seal). The frames are checked by the store that writes them
/// (`storage_frame` reaches that decoder).
pub fn replica_append(data: &[u8]) {
    use malachi_wire::replication::{ReplicaAppendRequest, ReplicaAppendResponse};
    if let Ok(request) = ReplicaAppendRequest::decode(Bytes::copy_from_slice(data)) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(
            ReplicaAppendRequest::decode(again).expect("and decodes"),
            request
        );
    }
    if let Ok(response) = ReplicaAppendResponse::decode(data) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(
            ReplicaAppendResponse::decode(&again).expect("and decodes"),
            response
        );
    }
    replica_status(data);
    replica_order(data);
}

/// A replica-status (api key 105, ADR 0098) as a broker decodes it on the
/// cluster port, and its answer as the describing broker decodes it: what
/// decodes re-encodes to itself. Run by the `replica_append` target, which
/// covers every replication message of the cluster port.
fn replica_status(data: &[u8]) {
    use malachi_wire::replica_status::{ReplicaStatusRequest, ReplicaStatusResponse};
    if let Ok(request) = ReplicaStatusRequest::decode(data) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(
            ReplicaStatusRequest::decode(&again).expect("and decodes"),
            request
        );
    }
    if let Ok(response) = ReplicaStatusResponse::decode(data) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(
            ReplicaStatusResponse::decode(&again).expect("and decodes"),
            response
        );
    }
}

/// The coordinator's orders (issue 19) as a copy's broker decodes them on
/// the cluster port, fence (api key 103), catch-up (101), seal (102) and
/// drop-copies (104, ADR 0115),
/// and their answers as the coordinator decodes them: what decodes
/// re-encodes to itself. Run by the `replica_append` target, which covers
/// every replication message of the cluster port; a catch-up answer's
/// frames are the store's to check (`storage_frame`).
fn replica_order(data: &[u8]) {
    use malachi_wire::replica_order::{
        CatchUpRequest, CatchUpResponse, DropCopiesRequest, DropCopiesResponse, FenceRequest,
        FenceResponse, SealRequest, SealResponse,
    };
    if let Ok(request) = FenceRequest::decode(data) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(FenceRequest::decode(&again).expect("and decodes"), request);
    }
    if let Ok(response) = FenceResponse::decode(data) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(
            FenceResponse::decode(&again).expect("and decodes"),
            response
        );
    }
    if let Ok(request) = CatchUpRequest::decode(data) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(
            CatchUpRequest::decode(&again).expect("and decodes"),
            request
        );
    }
    if let Ok(response) = CatchUpResponse::decode(Bytes::copy_from_slice(data)) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(
            CatchUpResponse::decode(again).expect("and decodes"),
            response
        );
    }
    if let Ok(request) = SealRequest::decode(data) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(SealRequest::decode(&again).expect("and decodes"), request);
    }
    if let Ok(response) = SealResponse::decode(data) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(SealResponse::decode(&again).expect("and decodes"), response);
    }
    if let Ok(request) = DropCopiesRequest::decode(data) {
        let again = request.encode().expect("a decoded request re-encodes");
        assert_eq!(
            DropCopiesRequest::decode(&again).expect("and decodes"),
            request
        );
    }
    if let Ok(response) = DropCopiesResponse::decode(data) {
        let again = response.encode().expect("a decoded answer re-encodes");
        assert_eq!(
            DropCopiesResponse::decode(&again).expect("and decodes"),
            response
        );
    }
}

/// For decoders returning their canonical re-encoding: that re-encoding
/// decodes again to the same re-encoding.
fn stable<E: std::fmt::Display>(decode: impl Fn(&[u8]) -> Result<Vec<u8>, E>, data: &[u8]) {
    if let Ok(canonical) = decode(data) {
        match decode(&canonical) {
            Ok(again) => assert_eq!(again, canonical, "re-encoding is not stable"),
            Err(e) => panic!("a re-encoding does not decode: {e}"),
        }
    }
}

/// What a peer broker sends over the node fabric, past ractor_cluster's own
/// envelope: the remote message as the node actor decodes it
/// (`malachi_actors::untrusted::accepts_remote_message`; the first byte's low
/// bit picks call or cast, the next byte is the variant name's length, then
/// the name, then the argument bytes), and the same bytes as a tree snapshot
/// reply (`decode_tree_reply`). Only the one known call with no arguments may
/// be accepted; a decoded reply re-encodes and decodes to itself.
pub fn fabric_message(data: &[u8]) {
    use malachi_actors::untrusted::{accepts_remote_message, decode_tree_reply};
    if let Some((&flags, rest)) = data.split_first() {
        let call = flags & 1 == 1;
        let (name_len, rest) = match rest.split_first() {
            Some((&n, rest)) => (usize::from(n).min(rest.len()), rest),
            None => (0, rest),
        };
        let (name, args) = rest.split_at(name_len);
        let variant = String::from_utf8_lossy(name).into_owned();
        let accepted = accepts_remote_message(call, variant.clone(), args.to_vec());
        if accepted {
            assert!(
                call && variant == "tree_snapshot" && args.is_empty(),
                "accepted {variant:?}"
            );
        }
    }
    if let Ok(tree) = decode_tree_reply(data.to_vec()) {
        let again = tree.encode().expect("a decoded tree re-encodes");
        assert_eq!(
            decode_tree_reply(again.to_vec()).expect("and decodes"),
            tree
        );
    }
}

/// The authentication messages (api keys 400 to 402, ADR 0146) as a broker
/// and a client decode them, each from the same bytes: what decodes
/// re-encodes to itself. Then the bytes as SCRAM messages: a broker's
/// exchange fed them as the client's first and final messages, and a
/// client fed them as the server's answers (its PBKDF2 bounded to the
/// minimum count, so a long count in the input cannot stall the run).
pub fn wire_auth(data: &[u8]) {
    use malachi_wire::auth::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse, TokenAuthenticateRequest, TokenAuthenticateResponse,
    };
    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(data: &[u8]) {
        if let Ok(message) = M::decode(Bytes::copy_from_slice(data)) {
            let again = message.encode().expect("a decoded message re-encodes");
            assert_eq!(M::decode(again).expect("and decodes"), message);
        }
    }
    round_trip::<SaslHandshakeRequest>(data);
    round_trip::<SaslHandshakeResponse>(data);
    round_trip::<SaslAuthenticateRequest>(data);
    round_trip::<SaslAuthenticateResponse>(data);
    round_trip::<TokenAuthenticateRequest>(data);
    round_trip::<TokenAuthenticateResponse>(data);
    {
        use malachi_wire::auth_admin::*;
        round_trip::<PutUserRequest>(data);
        round_trip::<PutUserResponse>(data);
        round_trip::<DeleteUserRequest>(data);
        round_trip::<ListUsersResponse>(data);
        round_trip::<AddAclRequest>(data);
        round_trip::<RemoveAclRequest>(data);
        round_trip::<AclChangeResponse>(data);
        round_trip::<ListAclsRequest>(data);
        round_trip::<ListAclsResponse>(data);
        round_trip::<UnlockUserRequest>(data);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        scram(text);
    }
}

/// One SCRAM exchange per side with `text` in every untrusted position.
fn scram(text: &str) {
    use malachi_core::auth::scram::{ITERATIONS_MIN, StoredCredential};
    use malachi_core::auth::scram_client::ScramClient;
    use malachi_core::auth::scram_server::{NonceLedger, ServerConfig, ServerExchange};
    let config = ServerConfig::new(SCRAM_FAKE_SECRET)
        .and_then(|c| c.with_iterations(ITERATIONS_MIN))
        .expect("a valid config");
    let credential = StoredCredential::from_salted(&[7; 32], &[9; 16], ITERATIONS_MIN);
    let mut ledger = NonceLedger::default();
    let started = ServerExchange::start(
        &config,
        text,
        |_| Some(credential.clone()),
        samples::SCRAM_SERVER_NONCE,
        &mut ledger,
    );
    if let Ok((exchange, server_first)) = started {
        assert!(server_first.starts_with("r="));
        let _ = exchange.finish(text);
    }
    let count_is_cheap = !text.split(',').any(|part| {
        part.strip_prefix("i=")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > u64::from(ITERATIONS_MIN))
    });
    let (client, _) = ScramClient::start("user", samples::SCRAM_CLIENT_NONCE).expect("starts");
    if count_is_cheap && let Ok((client, last)) = client.receive(text, b"pencil") {
        assert!(last.starts_with("c=biws,r="));
        let _ = client.verify(text);
    }
}

/// The secret the SCRAM body's broker derives unknown users' salts from.
pub const SCRAM_FAKE_SECRET: &[u8] = b"malachi-fuzz-scram-fake-secret";

/// The issuer key the `wire_token` body verifies under (Ed25519, made for
/// the fuzz samples only).
pub const TOKEN_PUBLIC_KEY_PEM: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAhfKbHyBGFxlhsTvSzKBzfmLhNyYf7N7HRBxRqKlD3q8=
-----END PUBLIC KEY-----
";
/// Its private key, for minting the sample.
pub const TOKEN_PRIVATE_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIB3i8a/0zHz5j0J/vzyE0wfpugyLequZ5U8ngjqFqjQb
-----END PRIVATE KEY-----
";
/// The sample token's `iat`, in milliseconds; the body verifies at it.
pub const TOKEN_NOW_MS: u64 = 1_800_000_000_000;

/// 402 `token_authenticate` and the issuer key messages (410 to 412,
/// ADR 0152): each decoded and round-tripped, and the token (from the
/// request, or the bytes as text) verified under one stored key with
/// every algorithm allowed, so each refusal path is reached; the
/// unverified subject the lockout keys by is read too.
pub fn wire_token(data: &[u8]) {
    use malachi_core::auth::token::{
        TOKEN_ALGORITHMS, TokenAlgorithm, TokenKey, TokenPolicy, claimed_subject, verify,
    };
    use malachi_wire::auth::TokenAuthenticateRequest;
    use malachi_wire::token_keys::*;
    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(data: &[u8]) -> Option<M> {
        let message = M::decode(Bytes::copy_from_slice(data)).ok()?;
        let again = message.encode().expect("a decoded message re-encodes");
        assert_eq!(M::decode(again).expect("and decodes"), message);
        Some(message)
    }
    let request = round_trip::<TokenAuthenticateRequest>(data);
    round_trip::<PutTokenKeyRequest>(data);
    round_trip::<PutTokenKeyResponse>(data);
    round_trip::<DeleteTokenKeyRequest>(data);
    round_trip::<ListTokenKeysResponse>(data);
    let key = TokenKey {
        kid: "k1".into(),
        algorithm: TokenAlgorithm::EdDSA,
        public_key_pem: TOKEN_PUBLIC_KEY_PEM.into(),
        added_at_ms: 0,
    };
    let policy = TokenPolicy {
        algorithms: TOKEN_ALGORITHMS.to_vec(),
        clock_skew_ms: 60_000,
        audience: None,
    };
    let text = request
        .map(|r| r.token)
        .or_else(|| std::str::from_utf8(data).ok().map(str::to_owned));
    if let Some(token) = text {
        let _ = claimed_subject(&token);
        let lookup = |kid: &str| (kid == key.kid).then_some(&key);
        if let Ok(verified) = verify(&token, lookup, &policy, TOKEN_NOW_MS) {
            assert_eq!(verified.kid, key.kid);
        }
    }
}
