//! Every fuzz body over random bytes and over mutated valid samples: the
//! same functions `fuzz/fuzz_targets` run under libFuzzer, a few hundred
//! cases each so the suite stays fast.

use malachi_fuzz_bodies as bodies;
use malachi_fuzz_bodies::samples;
use proptest::prelude::*;

/// A valid sample, one byte overwritten, then cut at some length.
fn mutated(sample: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = sample.len().max(1);
    (any::<usize>(), any::<u8>(), 0..=len, any::<bool>()).prop_map(move |(at, byte, cut, flip)| {
        let mut bytes = sample.clone();
        if flip && !bytes.is_empty() {
            let at = at % bytes.len();
            bytes[at] ^= byte | 1;
        }
        bytes.truncate(cut);
        bytes
    })
}

fn random() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..512)
}

fn one_of(samples: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    proptest::sample::select(samples).prop_flat_map(mutated)
}

macro_rules! body_tests {
    ($($name:ident: $body:path, $sample:expr;)*) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn the_valid_sample_decodes_and_round_trips() {
                    for sample in $sample {
                        $body(&sample);
                    }
                }

                proptest! {
                    #![proptest_config(ProptestConfig::with_cases(256))]

                    #[test]
                    fn random_bytes_never_panic(bytes in random()) {
                        $body(&bytes);
                    }

                    #[test]
                    fn a_mutated_sample_never_panics(bytes in one_of($sample)) {
                        $body(&bytes);
                    }
                }
            }
        )*
    };
}

body_tests! {
    storage_frame: bodies::storage_frame, vec![samples::storage_frame()];
    storage_index: bodies::storage_index, vec![samples::storage_index()];
    storage_seal: bodies::storage_seal, vec![samples::storage_seal()];
    cursor: bodies::cursor, vec![samples::cursor_body()];
    metadata_snapshot: bodies::metadata_snapshot, vec![samples::metadata_snapshot(), samples::snapshot_file()];
    raft_log: bodies::raft_log, vec![samples::raft_log(), samples::raft_vote()];
    raft_rpc: bodies::raft_rpc, samples::raft_rpc();
    forwarded_rpc: bodies::forwarded_rpc, samples::forwarded_rpc();
    ring: bodies::ring, vec![samples::ring()];
    membership_identity: bodies::membership_identity, vec![samples::membership_identity()];
    membership_routing: bodies::membership_routing, vec![samples::membership_routing()];
    wire_frame: bodies::wire_frame, vec![samples::wire_frame()];
    wire_messages: bodies::wire_messages, vec![samples::wire_messages()];
    fabric_message: bodies::fabric_message, vec![samples::fabric_message()];
    wire_auth: bodies::wire_auth, samples::wire_auth();
    wire_token: bodies::wire_token, samples::wire_token();
    replica_append: bodies::replica_append, [vec![samples::replica_append(), samples::replica_refusal(), samples::replica_status(), samples::replica_repair()], samples::replica_orders()].concat();
}

/// The fabric sample is the one remote message the node actor accepts, and
/// a cast or an argument makes it refused.
#[test]
fn the_fabric_sample_is_accepted_and_its_variants_are_not() {
    use malachi_actors::untrusted::accepts_remote_message;
    assert!(accepts_remote_message(
        true,
        "tree_snapshot".into(),
        Vec::new()
    ));
    assert!(!accepts_remote_message(
        false,
        "tree_snapshot".into(),
        Vec::new()
    ));
    assert!(!accepts_remote_message(
        true,
        "tree_snapshot".into(),
        vec![0]
    ));
    assert!(!accepts_remote_message(
        true,
        "format_disk".into(),
        Vec::new()
    ));
}

/// The samples must be what the decoders accept, or the mutation tests
/// above would only exercise the first check.
#[test]
fn every_sample_decodes() {
    use malachi_cluster::group::untrusted;
    assert!(malachi_storage::frame::decode(&samples::storage_frame()).is_ok());
    assert!(malachi_storage::marker::decode_seal(&samples::storage_seal()).is_ok());
    assert!(malachi_core::model::MetadataState::restore(&samples::metadata_snapshot()).is_ok());
    untrusted::snapshot_file(&samples::snapshot_file(), bodies::SNAPSHOT_BYTES_MAX).unwrap();
    untrusted::raft_log(
        &samples::raft_log(),
        bodies::RAFT_GROUP_ID,
        bodies::RAFT_ENTRY_BYTES_MAX,
    )
    .unwrap();
    untrusted::raft_vote(&samples::raft_vote()).unwrap();
    {
        use malachi_wire::replica_order::{
            CatchUpRequest, CatchUpResponse, FenceRequest, FenceResponse, SealRequest, SealResponse,
        };
        use malachi_wire::replication::ReplicaAppendRequest;
        let repair = ReplicaAppendRequest::decode(samples::replica_repair().into()).unwrap();
        assert!(repair.repair.is_some());
        let orders = samples::replica_orders();
        FenceRequest::decode(&orders[0]).unwrap();
        assert!(FenceResponse::decode(&orders[1]).unwrap().sealed.is_some());
        CatchUpRequest::decode(&orders[2]).unwrap();
        let frames = CatchUpResponse::decode(orders[3].clone().into())
            .unwrap()
            .frames;
        assert!(malachi_storage::frame::decode(&frames).is_ok());
        SealRequest::decode(&orders[4]).unwrap();
        assert!(SealResponse::decode(&orders[5]).unwrap().refused.is_some());
    }
    for sample in samples::raft_rpc() {
        let api_key = 200 + u16::from(sample[0]);
        let request = untrusted::raft_request(api_key, &sample[1..]);
        let response = untrusted::raft_response(api_key, &sample[1..]);
        assert!(
            request.is_ok() || response.is_ok(),
            "raft sample for {api_key}"
        );
    }
    assert!(malachi_core::ring::Ring::decode(&samples::ring()).is_ok());
    assert!(malachi_membership::NodeIdentity::decode(&samples::membership_identity()).is_ok());
    assert!(malachi_membership::RoutingHint::decode(&samples::membership_routing()).is_ok());
    let key = malachi_core::cursor::CursorKeys::single(
        0,
        malachi_core::cursor::CursorKey::new(bodies::CURSOR_SECRET).unwrap(),
    );
    malachi_core::cursor::Cursor::decode(&samples::sign_cursor_body(&samples::cursor_body()), &key)
        .unwrap();
}

/// The authentication samples decode as their messages, and the SCRAM texts
/// run the RFC 7677 exchange to its end on both sides.
#[test]
fn the_auth_samples_decode_and_the_scram_texts_authenticate() {
    use malachi_core::auth::scram::StoredCredential;
    use malachi_core::auth::scram_client::ScramClient;
    use malachi_core::auth::scram_server::{NonceLedger, ServerConfig, ServerExchange};
    use malachi_wire::Message;
    use malachi_wire::auth::{
        SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
        SaslHandshakeResponse, TokenAuthenticateRequest, TokenAuthenticateResponse,
    };
    let s = samples::wire_auth();
    let b = |i: usize| bytes::Bytes::from(s[i].clone());
    SaslHandshakeRequest::decode(b(0)).unwrap();
    SaslHandshakeResponse::decode(b(1)).unwrap();
    SaslAuthenticateRequest::decode(b(2)).unwrap();
    SaslAuthenticateResponse::decode(b(3)).unwrap();
    TokenAuthenticateRequest::decode(b(4)).unwrap();
    TokenAuthenticateResponse::decode(b(5)).unwrap();
    {
        use malachi_wire::auth_admin::*;
        PutUserRequest::decode(b(10)).unwrap();
        ListUsersResponse::decode(b(11)).unwrap();
        AddAclRequest::decode(b(12)).unwrap();
        ListAclsResponse::decode(b(13)).unwrap();
    }
    let text = |i: usize| String::from_utf8(s[i].clone()).unwrap();
    let credential = StoredCredential::from_password(
        b"pencil",
        &[
            0x5b, 0x6d, 0x99, 0x68, 0x9d, 0x12, 0x35, 0x8e, 0xec, 0xa0, 0x4b, 0x14, 0x12, 0x36,
            0xfa, 0x81,
        ],
        4096,
    )
    .unwrap();
    let config = ServerConfig::new(bodies::SCRAM_FAKE_SECRET).unwrap();
    let (server, first) = ServerExchange::start(
        &config,
        &text(6),
        |_| Some(credential),
        samples::SCRAM_SERVER_NONCE,
        &mut NonceLedger::default(),
    )
    .unwrap();
    assert_eq!(first, text(7));
    assert_eq!(server.finish(&text(8)).unwrap().server_final, text(9));
    let (client, _) = ScramClient::start("user", samples::SCRAM_CLIENT_NONCE).unwrap();
    let (client, last) = client.receive(&text(7), b"pencil").unwrap();
    assert_eq!(last, text(8));
    client.verify(&text(9)).unwrap();
}

/// The token sample verifies: the mutated samples start from a token
/// that reaches the end of `verify`.
#[test]
fn the_token_sample_verifies() {
    use malachi_core::auth::token::{TokenAlgorithm, TokenKey, TokenPolicy, verify};
    let token = String::from_utf8(samples::wire_token().pop().unwrap()).unwrap();
    let key = TokenKey {
        kid: "k1".into(),
        algorithm: TokenAlgorithm::EdDSA,
        public_key_pem: bodies::TOKEN_PUBLIC_KEY_PEM.into(),
        added_at_ms: 0,
    };
    let policy = TokenPolicy {
        algorithms: vec![TokenAlgorithm::EdDSA],
        clock_skew_ms: 0,
        audience: None,
    };
    let verified = verify(&token, |_| Some(&key), &policy, bodies::TOKEN_NOW_MS).unwrap();
    assert_eq!(verified.subject, "alice");
}
