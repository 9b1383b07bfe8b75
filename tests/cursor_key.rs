//! One cursor key per cluster (issue 17, ADR 0096): a cursor minted by one
//! broker is verified by the others, and resumes right after the last
//! record it covered. Three broker processes; the CLI as users run it, and
//! raw frames where the test must see which broker answered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::{Bytes, BytesMut};
use common::cluster::Cluster;
use common::keyed::json_lines;
use common::{err, malachi, ok, out};
use malachi_wire::frame::{FRAME_BYTES_MAX_DEFAULT, encode_request};
use malachi_wire::messages::FetchRequest;
use malachi_wire::{ErrorBody, ErrorCode, Message, Operation, RequestFrame};
use serde_json::Value;

/// One raw request and its answer's code and error body.
fn raw_call<O: Operation>(addr: &str, request: &O) -> (ErrorCode, ErrorBody) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut frame = BytesMut::new();
    encode_request(
        &RequestFrame {
            api_key: O::API_KEY.code(),
            correlation_id: 1,
            payload: request.encode().unwrap(),
        },
        &mut frame,
        FRAME_BYTES_MAX_DEFAULT,
    )
    .unwrap();
    stream.write_all(&frame).unwrap();
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut rest).unwrap();
    let code = ErrorCode::from_code(u16::from_be_bytes(rest[4..6].try_into().unwrap()));
    let body = if code == ErrorCode::None {
        ErrorBody::default()
    } else {
        ErrorBody::decode(Bytes::copy_from_slice(&rest[6..])).unwrap_or_default()
    };
    (code, body)
}

fn fetch(topic: &str, cursor: &str) -> FetchRequest {
    FetchRequest {
        topic: topic.into(),
        cursor: Some(cursor.into()),
        from_start: false,
        records_max: 100,
        bytes_max: 1 << 20,
        wait_ms: 0,
    }
}

/// The primary of each segment of `topic` (its replica set's first).
fn primaries(broker: &str, topic: &str) -> Vec<u64> {
    let output = ok(malachi(broker, &["topic", "describe", topic, "--json"], ""));
    let described: Value = serde_json::from_str(&out(&output)).unwrap();
    described["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["segments"].as_array().unwrap().clone())
        .map(|s| s["replicas"][0].as_u64().unwrap())
        .collect()
}

/// `consume ARGS --json` through `broker`: the (key, value) records and the
/// cursor of the last line.
fn consume(broker: &str, args: &[&str]) -> (Vec<(String, String)>, String) {
    let mut all = vec!["consume"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = malachi(broker, &all, "");
    assert!(output.status.success(), "consume: {}", err(&output));
    let lines = json_lines(&out(&output));
    let (last, records) = lines.split_last().expect("at least the cursor line");
    let records = records
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (records, last["cursor"].as_str().unwrap().to_owned())
}

fn produce(broker: &str, topic: &str, from: u32, to: u32) {
    let lines: String = (from..to).map(|i| format!("k{i}\tv{i}\n")).collect();
    let output = ok(malachi(broker, &["produce", topic], &lines));
    assert!(
        out(&output).starts_with(&format!("{} of {}", to - from, to - from)),
        "{}",
        out(&output)
    );
}

fn expected(from: u32, to: u32) -> Vec<(String, String)> {
    (from..to)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect()
}

#[test]
fn a_cursor_minted_by_the_primary_is_verified_by_the_other_brokers_and_resumes_after_its_last_record()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let (one, two, three) = (&clients[0], &clients[1], &clients[2]);
    let topic = "resumable";
    ok(malachi(one, &["topic", "create", topic], ""));
    // Placed by load (ADR 0144): whichever broker writes it mints.
    let written_by = primaries(one, topic);
    assert_eq!(written_by.len(), 1, "one segment: {written_by:?}");
    let primary = &clients[(written_by[0] - 1) as usize];
    let others: Vec<&String> = clients.iter().filter(|c| *c != primary).collect();

    produce(primary, topic, 0, 10);
    // The primary serves the topic itself: it mints this cursor.
    let (first, cursor) = consume(primary, &[topic, "--from-start"]);
    assert_eq!(first, expected(0, 10));
    let raw = URL_SAFE_NO_PAD.decode(&cursor).unwrap();
    assert_eq!(raw[0], 2, "a version 2 cursor, carrying its key id");
    assert_eq!(raw[1..5], 0u32.to_be_bytes(), "the cluster's bootstrap key");
    produce(primary, topic, 10, 15);

    for other in others {
        // Each other broker verifies the cursor itself before it sends the
        // client on: a genuine cursor is redirected to the primary...
        let (code, body) = raw_call(other, &fetch(topic, &cursor));
        assert_eq!(code, ErrorCode::NotLeader, "{}", body.message);
        assert_eq!(body.leader_hint.as_deref(), Some(primary.as_str()));
        // ...and the same cursor with one tag byte changed is refused there,
        // with no redirect: the broker checked the tag under the cluster's key.
        let mut forged = raw.clone();
        let at = forged.len() - 3;
        forged[at] ^= 0x40;
        let (code, body) = raw_call(other, &fetch(topic, &URL_SAFE_NO_PAD.encode(&forged)));
        assert_eq!(code, ErrorCode::InvalidCursor, "{}", body.message);
        assert_eq!(body.leader_hint, None);
        // A key id the cluster never issued is a typed refusal too.
        let mut unknown = raw.clone();
        unknown[1..5].copy_from_slice(&9u32.to_be_bytes());
        let (code, body) = raw_call(other, &fetch(topic, &URL_SAFE_NO_PAD.encode(&unknown)));
        assert_eq!(code, ErrorCode::InvalidCursor, "{}", body.message);
        assert!(
            body.message.contains("cursor key 9 is not known"),
            "{}",
            body.message
        );

        // Through the CLI, the cursor resumes right after record 9.
        let (rest, _) = consume(other, &[topic, "--cursor", &cursor]);
        assert_eq!(rest, expected(10, 15), "through {other}");
    }

    // The key is the cluster's, in raft: after a full restart, a broker
    // started alone (no quorum) refuses with the retriable `no_quorum`
    // rather than serve under a key of its own; once the others are back,
    // the same cursor resumes at the same place.
    for node in &mut cluster.nodes {
        node.terminate();
    }
    let seeds = cluster.nodes[0].seeds_among(&clients);
    cluster.nodes[0].start(&seeds);
    let (code, body) = raw_call(one, &fetch(topic, &cursor));
    assert_eq!(code, ErrorCode::NoQuorum, "{}", body.message);
    assert!(code.retriable());
    for node in &mut cluster.nodes[1..] {
        let seeds = node.seeds_among(&clients);
        node.start(&seeds);
    }
    cluster.wait_for_coordinators(common::cluster::VNODES_DEFAULT);
    for broker in [one, two, three] {
        let (rest, _) = consume(broker, &[topic, "--cursor", &cursor]);
        assert_eq!(rest, expected(10, 15), "through {broker} after a restart");
    }
}
