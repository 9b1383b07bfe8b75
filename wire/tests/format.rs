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
        frames: bytes::Bytes::from_static(b"MLR1"),
    };
    insta::assert_snapshot!("replica_append_request", hex(&request.encode().unwrap()));
    let durable = ReplicaAppendResponse::durable(12);
    insta::assert_snapshot!("replica_append_response", hex(&durable.encode().unwrap()));
    let refused = ReplicaAppendResponse::refused(ReplicaRefusal::NotAtEnd, 4, "ends at 4");
    insta::assert_snapshot!("replica_append_refused", hex(&refused.encode().unwrap()));
}
