//! The documented error codes only a cluster can provoke (see
//! `actors/tests/documented_errors.rs` for the one-broker table): three
//! broker processes, raw frames. A broker that does not host a topic answers
//! its record and reshaping requests with `not_leader`, the host's client
//! address as `leader_hint` and no `retry_after_ms` (resend at once); a
//! broker whose metadata groups lost their quorum answers metadata changes
//! with `no_quorum`, and a produce whose segment's followers are both down
//! answers `no_quorum` once `replica_ack_timeout_ms` passed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;
#[path = "../actors/tests/common/protocol_doc.rs"]
mod protocol_doc;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use malachi_testkit::wait::{Wait, wait_until_blocking};

use bytes::{Bytes, BytesMut};
use common::cluster::Cluster;
use malachi_wire::batch::{BatchBuilder, Record};
use malachi_wire::frame::{FRAME_BYTES_MAX_DEFAULT, encode_request};
use malachi_wire::messages::*;
use malachi_wire::{ErrorBody, ErrorCode, Message, Operation, RequestFrame};
use protocol_doc::{DocumentedErrors, PROVOKED_BY_THREE_BROKERS};

/// One connection speaking raw frames, one request at a time (a
/// subscription's pushes are skipped until its answer or error).
struct Raw {
    stream: TcpStream,
    next_id: u32,
}

/// An answer: the code, and the error body when it is not `none`.
struct Answer {
    code: ErrorCode,
    body: ErrorBody,
    payload: Bytes,
}

impl Raw {
    fn connect(addr: &str) -> Raw {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Raw { stream, next_id: 1 }
    }

    fn send(&mut self, api_key: u16, payload: Bytes) -> u32 {
        let correlation_id = self.next_id;
        self.next_id += 1;
        let mut out = BytesMut::new();
        let frame = RequestFrame {
            api_key,
            correlation_id,
            payload,
        };
        encode_request(&frame, &mut out, FRAME_BYTES_MAX_DEFAULT).unwrap();
        self.stream.write_all(&out).unwrap();
        correlation_id
    }

    fn read(&mut self) -> (u32, Answer) {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).unwrap();
        let len = u32::from_be_bytes(len) as usize;
        assert!(
            (6..=FRAME_BYTES_MAX_DEFAULT).contains(&len),
            "frame of {len}"
        );
        let mut rest = vec![0u8; len];
        self.stream.read_exact(&mut rest).unwrap();
        let id = u32::from_be_bytes(rest[0..4].try_into().unwrap());
        let code = ErrorCode::from_code(u16::from_be_bytes(rest[4..6].try_into().unwrap()));
        let payload = Bytes::copy_from_slice(&rest[6..]);
        let body = if code == ErrorCode::None {
            ErrorBody::default()
        } else {
            ErrorBody::decode(payload.clone()).unwrap_or_default()
        };
        (
            id,
            Answer {
                code,
                body,
                payload,
            },
        )
    }

    /// Send `request` and return its answer; for a subscription, its first
    /// error (or its push 0, as `none`).
    fn call<O: Operation>(&mut self, request: &O) -> Answer {
        let id = self.send(O::API_KEY.code(), request.encode().unwrap());
        loop {
            let (got, answer) = self.read();
            if got == id {
                return answer;
            }
        }
    }
}

fn produce(topic: &str) -> ProduceRequest {
    let mut builder = BatchBuilder::new(1 << 20);
    builder
        .push(&Record::new(
            Bytes::from_static(b"k"),
            Bytes::from_static(b"v"),
        ))
        .unwrap();
    ProduceRequest {
        topic: topic.into(),
        producer: None,
        records: builder.finish(),
    }
}

/// Retries `call` until it succeeds: a fresh cluster's groups may still be
/// settling their leaders.
fn until_done<O: Operation>(addr: &str, request: &O) -> O::Response {
    let payload = wait_until_blocking(
        &format!("{} to succeed", O::API_KEY.name()),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let answer = Raw::connect(addr).call(request);
            match answer.code {
                ErrorCode::None => Ok(answer.payload),
                code => Err(format!("{} {}", code.name(), answer.body.message)),
            }
        },
    );
    O::Response::decode(payload).unwrap()
}

/// Repeats `call` until its code is `want`, or the deadline: a broker that
/// just lost its peers may first time out. The last answer is the caller's
/// to judge.
fn settled<O: Operation>(addr: &str, request: &O, want: ErrorCode) -> Answer {
    let mut last = None;
    let _ = Wait::new(
        format!("{} to answer {}", O::API_KEY.name(), want.name()),
        Duration::from_secs(60),
        Duration::from_millis(300),
    )
    .try_until_blocking(|| {
        let answer = Raw::connect(addr).call(request);
        let done = answer.code == want;
        last = Some(answer);
        done
    });
    last.expect("the check ran at least once")
}

#[test]
fn not_leader_and_no_quorum_come_back_as_documented() {
    let doc = DocumentedErrors::read();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(dir.path());
    let clients = cluster.clients();
    let host = &clients[0];
    let other = &clients[1];
    let topic = "errors";
    until_done(
        host,
        &CreateTopicRequest {
            name: topic.into(),
            replication_factor: None,
            policy: None,
        },
    );
    let described = until_done(
        host,
        &DescribeTopicRequest {
            name: topic.into(),
            live: false,
        },
    );
    let range = described.topic.ranges[0].id;
    let mut rows: Vec<(&str, ErrorCode, Answer)> = Vec::new();

    // Through a broker that does not host the topic.
    let mut raw = Raw::connect(other);
    rows.push(("produce", ErrorCode::NotLeader, raw.call(&produce(topic))));
    rows.push((
        "fetch",
        ErrorCode::NotLeader,
        raw.call(&FetchRequest {
            topic: topic.into(),
            cursor: None,
            from_start: true,
            records_max: 10,
            bytes_max: 1 << 20,
            wait_ms: 0,
        }),
    ));
    rows.push((
        "subscribe",
        ErrorCode::NotLeader,
        raw.call(&SubscribeRequest {
            topic: topic.into(),
            cursor: None,
            from_start: true,
            credit_records: 10,
            credit_bytes: 1 << 20,
        }),
    ));
    rows.push((
        "split_range",
        ErrorCode::NotLeader,
        raw.call(&SplitRangeRequest {
            topic: topic.into(),
            range_id: range,
        }),
    ));
    rows.push((
        "merge_range",
        ErrorCode::NotLeader,
        raw.call(&MergeRangeRequest {
            topic: topic.into(),
            range_id: range,
        }),
    ));
    for (op, _, answer) in &rows {
        assert_eq!(
            answer.body.leader_hint.as_deref(),
            Some(host.as_str()),
            "{op}: {}",
            answer.body.message
        );
        assert_eq!(
            answer.body.retry_after_ms, None,
            "{op}: a redirect with a hint is resent at once"
        );
    }
    // The redirect is real: the host splits the range.
    let split = until_done(
        host,
        &SplitRangeRequest {
            topic: topic.into(),
            range_id: range,
        },
    );

    // The host alone: its metadata groups have no quorum, and the topic's
    // segments (three copies, the host's the primary's) none either.
    cluster.nodes[1].kill9();
    cluster.nodes[2].kill9();

    rows.push((
        "create_topic",
        ErrorCode::NoQuorum,
        settled(
            host,
            &CreateTopicRequest {
                name: "after".into(),
                replication_factor: None,
                policy: None,
            },
            ErrorCode::NoQuorum,
        ),
    ));
    rows.push((
        "delete_topic",
        ErrorCode::NoQuorum,
        settled(
            host,
            &DeleteTopicRequest { name: topic.into() },
            ErrorCode::NoQuorum,
        ),
    ));
    rows.push((
        "split_range",
        ErrorCode::NoQuorum,
        settled(
            host,
            &SplitRangeRequest {
                topic: topic.into(),
                range_id: split.children[0],
            },
            ErrorCode::NoQuorum,
        ),
    ));
    rows.push((
        "merge_range",
        ErrorCode::NoQuorum,
        settled(
            host,
            &MergeRangeRequest {
                topic: topic.into(),
                range_id: split.children[0],
            },
            ErrorCode::NoQuorum,
        ),
    ));

    let mut failures = Vec::new();
    for (op, expected, answer) in &rows {
        if answer.code != *expected {
            failures.push(format!(
                "{op}: expected {}, got {} ({})",
                expected.name(),
                answer.code.name(),
                answer.body.message
            ));
        }
        if answer.code != ErrorCode::None && !doc.allowed(op).contains(answer.code.name()) {
            failures.push(format!(
                "{op}: answered {}, which protocol.md does not list",
                answer.code.name()
            ));
        }
    }
    let provoked: BTreeSet<(&str, &str)> = rows
        .iter()
        .map(|(op, code, _)| (*op, code.name()))
        .collect();
    let promised: BTreeSet<(&str, &str)> = PROVOKED_BY_THREE_BROKERS.iter().copied().collect();
    assert_eq!(
        provoked, promised,
        "the one-broker table counts on exactly these"
    );
    assert!(
        failures.is_empty(),
        "\n{}\n{}",
        failures.join("\n"),
        cluster.logs()
    );
}
