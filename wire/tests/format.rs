//! The format freeze: the exact bytes of one request frame and one response
//! frame of every operation, and of an error response. A change here is a wire
//! format change: it needs a new api version (see ADR 0040) and an update of
//! docs/protocol.md in the same commit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod samples;

use bytes::BytesMut;
use malachi_wire::frame::{FRAME_BYTES_MAX_DEFAULT, encode_request, encode_response};
use malachi_wire::{ErrorBody, ErrorCode, Message, RequestFrame, ResponseFrame};

/// Hex, 16 bytes per line, so a diff points at the offset that moved.
fn hex(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(line, chunk)| {
            let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:04x}: {}", line * 16, hex.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_operation_encodes_to_its_frozen_bytes() {
    for (name, request, response) in samples::pairs() {
        let mut frame = BytesMut::new();
        let request_frame = RequestFrame {
            api_key: request.api_key().code(),
            correlation_id: 42,
            payload: request.encode().unwrap(),
        };
        encode_request(&request_frame, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
        insta::assert_snapshot!(format!("{name}_request"), hex(&frame));

        let mut frame = BytesMut::new();
        let response_frame = ResponseFrame {
            correlation_id: 42,
            error_code: ErrorCode::None,
            payload: response.encode().unwrap(),
        };
        encode_response(&response_frame, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
        insta::assert_snapshot!(format!("{name}_response"), hex(&frame));
    }
}

#[test]
fn an_error_response_encodes_to_its_frozen_bytes() {
    let body = ErrorBody {
        message: "not the leader".into(),
        leader_hint: Some("10.0.0.2:4040".into()),
        retry_after_ms: Some(50),
        ranges: None,
    };
    let mut frame = BytesMut::new();
    let response = ResponseFrame {
        correlation_id: 42,
        error_code: ErrorCode::NotLeader,
        payload: body.encode().unwrap(),
    };
    encode_response(&response, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
    insta::assert_snapshot!("error_not_leader_response", hex(&frame));
}

#[test]
fn the_sample_record_batch_encodes_to_its_frozen_bytes() {
    insta::assert_snapshot!("record_batch_block", hex(samples::batch().block()));
}

#[test]
fn every_sample_decodes_back_to_itself() {
    for (name, request, response) in samples::pairs() {
        let decoded =
            malachi_wire::Request::decode(request.api_key().code(), request.encode().unwrap())
                .unwrap();
        assert_eq!(decoded, request, "{name}");
        let decoded =
            malachi_wire::Response::decode(response.api_key(), response.encode().unwrap()).unwrap();
        assert_eq!(decoded, response, "{name}");
    }
}

#[test]
fn replica_append_encodes_to_its_frozen_bytes() {
    use malachi_wire::replication::{ReplicaAppendRequest, ReplicaAppendResponse, ReplicaRefusal};
    let request = ReplicaAppendRequest {
        topic: "orders".into(),
        segment: 7,
        epoch: 3,
        first_offset: 10,
        committed_end: 8,
        repair: None,
        frames: bytes::Bytes::from_static(b"MLR1"),
    };
    insta::assert_snapshot!("replica_append_request", hex(&request.encode().unwrap()));
    let durable = ReplicaAppendResponse::durable(12);
    insta::assert_snapshot!("replica_append_response", hex(&durable.encode().unwrap()));
    let refused = ReplicaAppendResponse::refused(ReplicaRefusal::NotAtEnd, 4, "ends at 4");
    insta::assert_snapshot!("replica_append_refused", hex(&refused.encode().unwrap()));
}

#[test]
fn replica_status_encodes_to_its_frozen_bytes() {
    use malachi_wire::replica_status::{CopyStatus, ReplicaStatusRequest, ReplicaStatusResponse};
    let request = ReplicaStatusRequest {
        segments: vec![7, 8],
        ..ReplicaStatusRequest::default()
    };
    insta::assert_snapshot!("replica_status_request", hex(&request.encode().unwrap()));
    let response = ReplicaStatusResponse {
        copies: vec![
            CopyStatus {
                segment: 7,
                open: true,
                durable_end: Some(12),
                durable_bytes: Some(1_024),
                committed_end: Some(10),
                leading: true,
                sealed: false,
                fenced: false,
                failed: false,
            },
            CopyStatus {
                segment: 8,
                ..CopyStatus::default()
            },
        ],
        ..ReplicaStatusResponse::default()
    };
    insta::assert_snapshot!("replica_status_response", hex(&response.encode().unwrap()));
}

#[test]
fn a_producer_table_request_and_its_answer_encode_to_their_frozen_bytes() {
    use malachi_wire::replica_status::{
        ReplicaStatusRequest, ReplicaStatusResponse, ScrubSeal, SealedProducers,
    };
    let request = ReplicaStatusRequest {
        producer_tables: vec![ScrubSeal {
            segment: 7,
            length: 12,
            bytes: 0,
        }],
        ..ReplicaStatusRequest::default()
    };
    insta::assert_snapshot!(
        "replica_status_producer_tables_request",
        hex(&request.encode().unwrap())
    );
    let response = ReplicaStatusResponse {
        producer_tables: vec![SealedProducers {
            segment: 7,
            sidecar: b"MLPS".to_vec(),
        }],
        ..ReplicaStatusResponse::default()
    };
    insta::assert_snapshot!(
        "replica_status_producer_tables_response",
        hex(&response.encode().unwrap())
    );
}

#[test]
fn a_rates_request_and_its_answer_encode_to_their_frozen_bytes() {
    use malachi_wire::messages::{RangeRate, ReshapeEvent, TopicReshaping};
    use malachi_wire::replica_status::{ReplicaStatusRequest, ReplicaStatusResponse};
    let request = ReplicaStatusRequest {
        rates_topic: Some("orders".into()),
        ..ReplicaStatusRequest::default()
    };
    insta::assert_snapshot!(
        "replica_status_rates_request",
        hex(&request.encode().unwrap())
    );
    let response = ReplicaStatusResponse {
        reshaping: Some(TopicReshaping {
            rates: vec![RangeRate {
                range: 3,
                primary: 2,
                write_bytes_per_second: 4_096,
                write_records_per_second: 32,
                hot_key_share_permille: Some(125),
                hot_key_unsplittable: false,
            }],
            history: vec![ReshapeEvent {
                at_ms: 1_000,
                kind: "split".into(),
                reason: "write_rate_high".into(),
                ranges: vec![1],
                children: vec![2, 3],
                refused: None,
            }],
        }),
        ..ReplicaStatusResponse::default()
    };
    insta::assert_snapshot!(
        "replica_status_rates_response",
        hex(&response.encode().unwrap())
    );
}

#[test]
fn a_scrub_request_and_its_verdicts_encode_to_their_frozen_bytes() {
    use malachi_wire::replica_status::{
        ReplicaStatusRequest, ReplicaStatusResponse, ScrubSeal, ScrubVerdict,
    };
    let request = ReplicaStatusRequest {
        segments: vec![],
        scrub: vec![ScrubSeal {
            segment: 7,
            length: 12,
            bytes: 1_024,
        }],
        ..ReplicaStatusRequest::default()
    };
    insta::assert_snapshot!(
        "replica_status_scrub_request",
        hex(&request.encode().unwrap())
    );
    let response = ReplicaStatusResponse {
        copies: vec![],
        scrub: vec![ScrubVerdict {
            segment: 7,
            verdict: "short".into(),
            detail: "10 of 12 records".into(),
        }],
        ..ReplicaStatusResponse::default()
    };
    insta::assert_snapshot!(
        "replica_status_scrub_response",
        hex(&response.encode().unwrap())
    );
}

#[test]
fn a_sealed_health_request_and_its_answers_encode_to_their_frozen_bytes() {
    use malachi_wire::replica_status::{
        ReplicaStatusRequest, ReplicaStatusResponse, ScrubSeal, SealedHealth,
    };
    let request = ReplicaStatusRequest {
        sealed: vec![ScrubSeal {
            segment: 7,
            length: 12,
            bytes: 1_024,
        }],
        ..ReplicaStatusRequest::default()
    };
    insta::assert_snapshot!(
        "replica_status_sealed_request",
        hex(&request.encode().unwrap())
    );
    let response = ReplicaStatusResponse {
        health: vec![SealedHealth {
            segment: 7,
            health: "healing".into(),
            durable_end: Some(10),
        }],
        ..ReplicaStatusResponse::default()
    };
    insta::assert_snapshot!(
        "replica_status_sealed_response",
        hex(&response.encode().unwrap())
    );
}

#[test]
fn a_replica_append_answer_with_durable_bytes_encodes_to_its_frozen_bytes() {
    use malachi_wire::replication::ReplicaAppendResponse;
    let durable = ReplicaAppendResponse {
        durable_bytes: Some(4_096),
        ..ReplicaAppendResponse::durable(12)
    };
    let bytes = durable.encode().unwrap();
    insta::assert_snapshot!("replica_append_response_with_bytes", hex(&bytes));
    assert_eq!(ReplicaAppendResponse::decode(&bytes).unwrap(), durable);
}

/// A recovery's repair (issue 19) adds `repair` after `committed_end`; a
/// primary's shipping keeps the `replica_append_request` bytes.
#[test]
fn a_replica_append_with_a_repair_order_encodes_to_its_frozen_bytes() {
    use malachi_wire::replica_order::OrderEpoch;
    use malachi_wire::replication::{RepairOrder, ReplicaAppendRequest};
    let request = ReplicaAppendRequest {
        topic: "orders".into(),
        segment: 7,
        epoch: 3,
        first_offset: 10,
        committed_end: 8,
        repair: Some(RepairOrder {
            to: 12,
            order: OrderEpoch { group: 4, term: 9 },
        }),
        frames: bytes::Bytes::from_static(b"MLR1"),
    };
    let bytes = request.encode().unwrap();
    insta::assert_snapshot!("replica_append_request_repair", hex(&bytes));
    assert_eq!(ReplicaAppendRequest::decode(bytes).unwrap(), request);
}

/// Fence (103), catch-up (101) and seal (102), the coordinator's orders to
/// a segment's copies (issue 19), and their answers.
#[test]
fn replica_orders_encode_to_their_frozen_bytes() {
    use malachi_wire::replica_order::{
        CatchUpRequest, CatchUpResponse, DropCopiesRequest, DropCopiesResponse, FenceRequest,
        FenceResponse, OrderEpoch, OrderRefusal, SealRequest, SealResponse, SealedAt,
    };
    let order = OrderEpoch { group: 4, term: 9 };
    let sealed = SealedAt {
        length: 12,
        bytes: 768,
    };

    let fence = FenceRequest {
        topic: "orders".into(),
        segment: 7,
        order,
    };
    let bytes = fence.encode().unwrap();
    insta::assert_snapshot!("fence_request", hex(&bytes));
    assert_eq!(FenceRequest::decode(&bytes).unwrap(), fence);
    let fenced = FenceResponse::fenced(12, 768, order);
    let bytes = fenced.encode().unwrap();
    insta::assert_snapshot!("fence_response", hex(&bytes));
    assert_eq!(FenceResponse::decode(&bytes).unwrap(), fenced);
    let fenced_sealed = FenceResponse::fenced(12, 768, order).with_seal(sealed);
    let bytes = fenced_sealed.encode().unwrap();
    insta::assert_snapshot!("fence_response_sealed", hex(&bytes));
    assert_eq!(FenceResponse::decode(&bytes).unwrap(), fenced_sealed);
    let stale = FenceResponse::refused(
        OrderRefusal::StaleOrder,
        OrderEpoch { group: 4, term: 10 },
        "term 10 seen",
    );
    let bytes = stale.encode().unwrap();
    insta::assert_snapshot!("fence_refused", hex(&bytes));
    assert_eq!(FenceResponse::decode(&bytes).unwrap(), stale);

    let catch_up = CatchUpRequest {
        topic: "orders".into(),
        segment: 7,
        order,
        from: 10,
        bytes_max: 1 << 20,
    };
    let bytes = catch_up.encode().unwrap();
    insta::assert_snapshot!("catch_up_request", hex(&bytes));
    assert_eq!(CatchUpRequest::decode(&bytes).unwrap(), catch_up);
    let frames = CatchUpResponse::frames(10, 12, bytes::Bytes::from_static(b"MLR1"));
    let bytes = frames.encode().unwrap();
    insta::assert_snapshot!("catch_up_response", hex(&bytes));
    assert_eq!(CatchUpResponse::decode(bytes).unwrap(), frames);
    // With the readable end (ADR 0123): one more key; the answer above,
    // without it, keeps its bytes, and an old answer decodes to `None`.
    let readable =
        CatchUpResponse::frames(10, 12, bytes::Bytes::from_static(b"MLR1")).with_readable_end(11);
    let bytes = readable.encode().unwrap();
    insta::assert_snapshot!("catch_up_response_readable_end", hex(&bytes));
    assert_eq!(CatchUpResponse::decode(bytes).unwrap(), readable);
    let refused = CatchUpResponse::refused(OrderRefusal::UnknownCopy, 0, "no copy");
    let bytes = refused.encode().unwrap();
    insta::assert_snapshot!("catch_up_refused", hex(&bytes));
    assert_eq!(CatchUpResponse::decode(bytes).unwrap(), refused);

    let seal = SealRequest {
        topic: "orders".into(),
        segment: 7,
        order,
        length: 12,
    };
    let bytes = seal.encode().unwrap();
    insta::assert_snapshot!("seal_request", hex(&bytes));
    assert_eq!(SealRequest::decode(&bytes).unwrap(), seal);
    let done = SealResponse::sealed(12, sealed);
    let bytes = done.encode().unwrap();
    insta::assert_snapshot!("seal_response", hex(&bytes));
    assert_eq!(SealResponse::decode(&bytes).unwrap(), done);
    let short = SealResponse::refused(OrderRefusal::Short, 10, "durable to 10");
    let bytes = short.encode().unwrap();
    insta::assert_snapshot!("seal_refused", hex(&bytes));
    assert_eq!(SealResponse::decode(&bytes).unwrap(), short);

    let drop = DropCopiesRequest {
        topic: "orders".into(),
        segments: vec![7, 8],
    };
    let bytes = drop.encode().unwrap();
    insta::assert_snapshot!("drop_copies_request", hex(&bytes));
    assert_eq!(DropCopiesRequest::decode(&bytes).unwrap(), drop);
    let dropped = DropCopiesResponse {
        removed: vec![7],
        kept: vec![8],
        freed_bytes: 4096,
        message: String::new(),
    };
    let bytes = dropped.encode().unwrap();
    insta::assert_snapshot!("drop_copies_response", hex(&bytes));
    assert_eq!(DropCopiesResponse::decode(&bytes).unwrap(), dropped);
}

/// A describe answered by a broker that predates `primary`,
/// `committed_end` and `copies` still decodes: they read as absent.
#[test]
fn a_segment_description_without_the_live_figures_decodes() {
    use malachi_wire::messages::DescribeTopicResponse;
    #[derive(serde::Serialize)]
    struct OldSegment {
        id: u64,
        start_offset: u64,
        replicas: Vec<u64>,
        state: &'static str,
        length: Option<u64>,
        bytes: Option<u64>,
        created_at_ms: u64,
        sealed_at_ms: Option<u64>,
    }
    #[derive(serde::Serialize)]
    struct OldRange {
        id: u64,
        band_start: &'static str,
        band_end: &'static str,
        state: &'static str,
        sealed_at_ms: Option<u64>,
        parents: Vec<u64>,
        children: Vec<u64>,
        created_at_ms: u64,
        segments: Vec<OldSegment>,
    }
    #[derive(serde::Serialize)]
    struct OldTopic {
        name: &'static str,
        incarnation: u64,
        state: &'static str,
        sealed_at_ms: Option<u64>,
        policy: Option<String>,
        policy_resolved: bool,
        created_at_ms: u64,
        ranges: Vec<OldRange>,
    }
    #[derive(serde::Serialize)]
    struct OldResponse {
        topic: OldTopic,
    }
    let old = OldResponse {
        topic: OldTopic {
            name: "orders",
            incarnation: 0,
            state: "active",
            sealed_at_ms: None,
            policy: None,
            policy_resolved: false,
            created_at_ms: 1,
            ranges: vec![OldRange {
                id: 0,
                band_start: "0x0000000000000000",
                band_end: "0x10000000000000000",
                state: "active",
                sealed_at_ms: None,
                parents: vec![],
                children: vec![],
                created_at_ms: 1,
                segments: vec![OldSegment {
                    id: 7,
                    start_offset: 0,
                    replicas: vec![1, 2, 3],
                    state: "active",
                    length: None,
                    bytes: None,
                    created_at_ms: 1,
                    sealed_at_ms: None,
                }],
            }],
        },
    };
    let bytes = bytes::Bytes::from(rmp_serde::to_vec_named(&old).unwrap());
    let decoded = DescribeTopicResponse::decode(bytes).unwrap();
    let segment = &decoded.topic.ranges[0].segments[0];
    assert_eq!(segment.replicas, vec![1, 2, 3]);
    assert_eq!(segment.primary, None);
    assert_eq!(segment.committed_end, None);
    assert!(segment.copies.is_empty());
}

/// `live` is sent only when set: a plain describe keeps its old bytes (the
/// `describe_topic_request` snapshot), a live one adds the key.
#[test]
fn a_live_describe_request_encodes_to_its_frozen_bytes() {
    use malachi_wire::messages::DescribeTopicRequest;
    let request = DescribeTopicRequest {
        name: "orders".into(),
        live: true,
    };
    let bytes = request.encode().unwrap();
    insta::assert_snapshot!("describe_topic_request_live", hex(&bytes));
    assert_eq!(DescribeTopicRequest::decode(bytes).unwrap(), request);
}

/// The authentication messages (api keys 400 to 402, ADR 0146), in their
/// frames: not yet served by brokers, but their bytes are frozen already.
#[test]
fn the_auth_messages_encode_to_their_frozen_bytes() {
    use malachi_wire::auth::{
        SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslAuthenticateRequest, SaslAuthenticateResponse,
        SaslHandshakeRequest, SaslHandshakeResponse, TOKEN_AUTHENTICATE, TokenAuthenticateRequest,
        TokenAuthenticateResponse,
    };
    fn frames(name: &str, api_key: u16, request: &impl Message, response: &impl Message) {
        let mut frame = BytesMut::new();
        let request_frame = RequestFrame {
            api_key,
            correlation_id: 42,
            payload: request.encode().unwrap(),
        };
        encode_request(&request_frame, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
        insta::assert_snapshot!(format!("{name}_request"), hex(&frame));
        let mut frame = BytesMut::new();
        let response_frame = ResponseFrame {
            correlation_id: 42,
            error_code: ErrorCode::None,
            payload: response.encode().unwrap(),
        };
        encode_response(&response_frame, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
        insta::assert_snapshot!(format!("{name}_response"), hex(&frame));
    }
    frames(
        "sasl_handshake",
        SASL_HANDSHAKE,
        &SaslHandshakeRequest {
            mechanism: "SCRAM-SHA-256".into(),
        },
        &SaslHandshakeResponse {
            accepted: true,
            mechanisms: vec!["SCRAM-SHA-256".into()],
        },
    );
    // The RFC 7677 example's first round, then its last.
    frames(
        "sasl_authenticate_first",
        SASL_AUTHENTICATE,
        &SaslAuthenticateRequest {
            auth_bytes: "n,,n=user,r=rOprNGfwEbeRWgbNEkqO".into(),
        },
        &SaslAuthenticateResponse {
            auth_bytes:
                "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
                    .into(),
            complete: false,
            principal: None,
            session_lifetime_ms: None,
        },
    );
    frames(
        "sasl_authenticate_final",
        SASL_AUTHENTICATE,
        &SaslAuthenticateRequest {
            auth_bytes: "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=".into(),
        },
        &SaslAuthenticateResponse {
            auth_bytes: "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".into(),
            complete: true,
            principal: Some("User:user".into()),
            session_lifetime_ms: None,
        },
    );
    frames(
        "token_authenticate",
        TOKEN_AUTHENTICATE,
        &TokenAuthenticateRequest {
            token: "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2ln".into(),
        },
        &TokenAuthenticateResponse {
            principal: "User:user".into(),
            session_lifetime_ms: Some(3_600_000),
        },
    );
    // docs/protocol.md §10.2's example: an EdDSA token for alice.
    frames(
        "token_authenticate_example",
        TOKEN_AUTHENTICATE,
        &TokenAuthenticateRequest {
            token: "eyJ0eXAiOiJKV1QiLCJhbGciOiJFZERTQSIsImtpZCI6ImsxIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6MTgwMDAwMzYwMCwibmJmIjoxODAwMDAwMDAwLCJpYXQiOjE4MDAwMDAwMDB9.7N2D2cWKqbDxNo-xUbjcDCCe8UfKAkO5znqCMqY49vOQV1t5dzuYdi1BTJNKgYNhzTvFksDUP_HjG8OZmacYAQ".into(),
        },
        &TokenAuthenticateResponse {
            principal: "User:alice".into(),
            session_lifetime_ms: Some(3_600_000),
        },
    );
    // A refusal: `unauthorized` with the SCRAM error in the message.
    let body = ErrorBody {
        message: "authentication failed: e=invalid-proof".into(),
        leader_hint: None,
        retry_after_ms: Some(1_000),
        ranges: None,
    };
    let mut frame = BytesMut::new();
    let response = ResponseFrame {
        correlation_id: 42,
        error_code: ErrorCode::Unauthorized,
        payload: body.encode().unwrap(),
    };
    encode_response(&response, &mut frame, FRAME_BYTES_MAX_DEFAULT).unwrap();
    insta::assert_snapshot!("error_unauthorized_response", hex(&frame));
}

/// The user and ACL administration messages (api keys 403 to 409, ADR
/// 0150), each request and response frozen.
#[test]
fn the_user_and_acl_messages_encode_to_their_frozen_bytes() {
    use malachi_wire::auth_admin::*;
    fn frozen(name: &str, message: &impl Message) {
        insta::assert_snapshot!(name.to_owned(), hex(&message.encode().unwrap()));
    }
    let entry = AclEntryText {
        principal: "User:alice".into(),
        resource: "topic".into(),
        pattern: "literal".into(),
        name: "orders".into(),
        operation: "produce".into(),
        permission: "allow".into(),
    };
    frozen(
        "put_user_request",
        &PutUserRequest {
            name: "user".into(),
            // RFC 7677's example credential (password `pencil`).
            credential: UserCredential {
                salt: "W22ZaJ0SNY7soEsUEjb6gQ==".into(),
                iterations: 4096,
                stored_key: "WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=".into(),
                server_key: "wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=".into(),
            },
            replace: false,
        },
    );
    frozen(
        "put_user_response",
        &PutUserResponse {
            name: "user".into(),
            changed: true,
        },
    );
    frozen(
        "delete_user_request",
        &DeleteUserRequest {
            name: "user".into(),
        },
    );
    frozen(
        "delete_user_response",
        &DeleteUserResponse {
            name: "user".into(),
        },
    );
    frozen("list_users_request", &ListUsersRequest {});
    frozen(
        "list_users_response",
        &ListUsersResponse {
            users: vec![UserSummary {
                name: "user".into(),
                iterations: 4096,
                created_at_ms: 1_000,
                updated_at_ms: 2_000,
                locked_sources: 1,
            }],
        },
    );
    frozen(
        "add_acl_request",
        &AddAclRequest {
            entry: entry.clone(),
        },
    );
    frozen(
        "remove_acl_request",
        &RemoveAclRequest {
            entry: entry.clone(),
        },
    );
    frozen("acl_change_response", &AclChangeResponse { changed: true });
    frozen(
        "list_acls_request",
        &ListAclsRequest {
            principal: Some("User:alice".into()),
        },
    );
    frozen(
        "list_acls_response",
        &ListAclsResponse {
            entries: vec![entry],
        },
    );
    frozen(
        "unlock_user_request",
        &UnlockUserRequest {
            name: "user".into(),
        },
    );
    frozen(
        "unlock_user_response",
        &UnlockUserResponse {
            name: "user".into(),
        },
    );
}

/// The token issuer key messages, api keys 410 to 412 (ADR 0152), with
/// docs/protocol.md §10.4's example key.
#[test]
fn token_key_messages_keep_their_bytes() {
    use malachi_wire::token_keys::*;
    fn frozen(name: &str, message: &impl Message) {
        insta::assert_snapshot!(name.to_owned(), hex(&message.encode().unwrap()));
    }
    let key = TokenKeyText {
        kid: "k1".into(),
        algorithm: "EdDSA".into(),
        public_key_pem: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAhfKbHyBGFxlhsTvSzKBzfmLhNyYf7N7HRBxRqKlD3q8=\n-----END PUBLIC KEY-----\n".into(),
        added_at_ms: 0,
    };
    frozen(
        "put_token_key_request",
        &PutTokenKeyRequest { key: key.clone() },
    );
    frozen(
        "put_token_key_response",
        &PutTokenKeyResponse {
            kid: "k1".into(),
            changed: true,
        },
    );
    frozen(
        "delete_token_key_request",
        &DeleteTokenKeyRequest { kid: "k1".into() },
    );
    frozen(
        "delete_token_key_response",
        &DeleteTokenKeyResponse { kid: "k1".into() },
    );
    frozen("list_token_keys_request", &ListTokenKeysRequest {});
    frozen(
        "list_token_keys_response",
        &ListTokenKeysResponse {
            keys: vec![TokenKeyText {
                added_at_ms: 1_800_000_000_000,
                ..key
            }],
        },
    );
}
