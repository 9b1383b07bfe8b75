//! Every error code `docs/protocol.md` lists for an operation is provoked
//! here (or by the three-broker table in `tests/documented_errors.rs`, or
//! is named in `NOT_PROVOKED` with the fault it needs), and every code a
//! provocation gets back is one the document lists for that operation.
//! The lists are read from the document, so the two cannot drift apart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use common::protocol_doc::{DocumentedErrors, NOT_PROVOKED, PROVOKED_BY_THREE_BROKERS};
use common::*;
use malachi_actors::{BrokerConfig, MetadataBackend};
use malachi_wire::messages::*;
use malachi_wire::{ErrorBody, ErrorCode, Message};
use tokio::io::AsyncWriteExt;

/// One provocation: what was sent, the code the table expects, the code
/// that came back (`None` for a success).
struct Row {
    op: &'static str,
    how: &'static str,
    expected: ErrorCode,
    got: Option<ErrorCode>,
    message: String,
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

impl Table {
    fn row<T>(
        &mut self,
        op: &'static str,
        expected: ErrorCode,
        how: &'static str,
        got: Result<T, Refused>,
    ) {
        let (got, message) = match got {
            Ok(_) => (None, String::new()),
            Err(refused) => (Some(refused.code), refused.message),
        };
        self.rows.push(Row {
            op,
            how,
            expected,
            got,
            message,
        });
    }
}

const FRAME_BYTES_MAX: usize = 64 << 10;
/// Room enough for a produce frame around the value, not for a fetch
/// frame's cursor beside it.
const NEAR_FRAME_VALUE_BYTES: usize = FRAME_BYTES_MAX - 256;
const VALUE_BYTES_MAX: usize = FRAME_BYTES_MAX - 200;
/// The smallest record batch block: no records.
const EMPTY_BLOCK: [u8; 6] = [0x01, 0xd2, 0x02, 0xef, 0x8d, 0x00];

fn tagged(topic: &str, range: u64, epoch: u64, sequence: u64, value: &str) -> ProduceRequest {
    let mut request = produce_request(topic, &[record("k", value)]);
    request.producer = Some(ProducerBatch {
        producer_id: 11,
        epoch,
        range,
        sequence,
    });
    request
}

/// The first error frame on `id` (a subscription's pushes come first).
async fn subscribe_error(client: &mut TestClient, request: &SubscribeRequest) -> Refused {
    let id = client
        .send_raw(ApiKeyCode::SUBSCRIBE, request.encode().unwrap())
        .await;
    loop {
        let frame = client.recv().await.expect("connection closed");
        if frame.correlation_id == id && frame.error_code != ErrorCode::None {
            let body = ErrorBody::decode(frame.payload).unwrap_or_default();
            return Refused {
                code: frame.error_code,
                message: body.message,
            };
        }
    }
}

/// Raw key numbers this test sends without a typed request.
struct ApiKeyCode;
impl ApiKeyCode {
    const LIST_TOPICS: u16 = 3;
    const PRODUCE: u16 = 10;
    const SUBSCRIBE: u16 = 12;
    /// Unknown: between the vnode keys and the replication block.
    const UNKNOWN: u16 = 50;
}

fn refused_frame(frame: malachi_wire::ResponseFrame) -> Result<(), Refused> {
    if frame.error_code == ErrorCode::None {
        return Ok(());
    }
    let body = ErrorBody::decode(frame.payload).unwrap_or_default();
    Err(Refused {
        code: frame.error_code,
        message: body.message,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_documented_error_is_provoked_and_no_other_comes_back() {
    init_tracing();
    let doc = DocumentedErrors::read();
    let mut table = Table::default();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        frame_bytes_max: FRAME_BYTES_MAX,
        record_value_bytes_max: VALUE_BYTES_MAX,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let mut c = TestClient::connect(broker.client_addr()).await;

    // --- the codes every request may get ---
    let id = c
        .send_raw(ApiKeyCode::UNKNOWN, Bytes::from_static(&[0x80]))
        .await;
    let frame = c.recv().await.unwrap();
    assert_eq!(frame.correlation_id, id);
    table.row(
        "list_topics",
        ErrorCode::UnsupportedApi,
        "an unknown api key",
        refused_frame(frame),
    );
    // The connection stays open after it.
    c.call(&ListTopicsRequest {}).await.unwrap();
    c.send_raw(ApiKeyCode::LIST_TOPICS, Bytes::from_static(&[0x80, 0x00]))
        .await;
    table.row(
        "list_topics",
        ErrorCode::InvalidRequest,
        "trailing bytes after the map",
        refused_frame(c.recv().await.unwrap()),
    );
    // Negotiation: a key with no common version is refused from the
    // api_versions on, even pipelined right behind it, until renegotiated.
    let no_overlap = ApiVersionsRequest {
        client_name: "from the future".into(),
        versions: vec![ApiVersion {
            api_key: ApiKeyCode::LIST_TOPICS,
            min_version: 1,
            max_version: 3,
        }],
    };
    let negotiate = c.send_raw(0, no_overlap.encode().unwrap()).await;
    let listed = c
        .send_raw(
            ApiKeyCode::LIST_TOPICS,
            ListTopicsRequest {}.encode().unwrap(),
        )
        .await;
    let mut answers = Vec::new();
    for _ in 0..2 {
        answers.push(c.recv().await.unwrap());
    }
    answers.sort_by_key(|f| f.correlation_id);
    assert_eq!(answers[0].correlation_id, negotiate);
    assert_eq!(answers[0].error_code, ErrorCode::None);
    assert_eq!(answers[1].correlation_id, listed);
    table.row(
        "list_topics",
        ErrorCode::UnsupportedVersion,
        "a key whose versions the client's api_versions does not share",
        refused_frame(answers.pop().unwrap()),
    );
    let refused = c.call(&ListTopicsRequest {}).await.unwrap_err();
    assert!(refused.message.contains("1..=3"), "{}", refused.message);
    c.call(&ApiVersionsRequest {
        client_name: "renegotiated".into(),
        versions: ApiVersion::supported(),
    })
    .await
    .unwrap();
    c.call(&ListTopicsRequest {}).await.unwrap();

    // --- create_topic, delete_topic, describe_topic ---
    c.create_topic("t").await;
    let create = |name: &str, replication_factor| CreateTopicRequest {
        name: name.into(),
        replication_factor,
        policy: None,
    };
    table.row(
        "create_topic",
        ErrorCode::TopicExists,
        "a name taken",
        c.call(&create("t", None)).await,
    );
    table.row(
        "create_topic",
        ErrorCode::InvalidRequest,
        "a name with a space",
        c.call(&create("a b", None)).await,
    );
    table.row(
        "create_topic",
        ErrorCode::InvalidRequest,
        "a replication factor of 3 on one broker",
        c.call(&create("rf", Some(3))).await,
    );
    // A policy nobody defined is bound late, not refused.
    c.call(&CreateTopicRequest {
        name: "late".into(),
        replication_factor: None,
        policy: Some("gold".into()),
    })
    .await
    .unwrap();
    let late = c
        .call(&DescribeTopicRequest {
            name: "late".into(),
            live: false,
        })
        .await
        .unwrap();
    assert!(!late.topic.policy_resolved);
    assert_eq!(late.topic.policy.as_deref(), Some("gold"));
    table.row(
        "delete_topic",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.call(&DeleteTopicRequest {
            name: "nope".into(),
        })
        .await,
    );
    table.row(
        "describe_topic",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.call(&DescribeTopicRequest {
            name: "nope".into(),
            live: false,
        })
        .await,
    );
    table.row(
        "describe_topic",
        ErrorCode::TopicNotFound,
        "a name no topic could have",
        c.call(&DescribeTopicRequest {
            name: "a b".into(),
            live: false,
        })
        .await,
    );

    // --- split_range, merge_range ---
    let split = |topic: &str, range_id| SplitRangeRequest {
        topic: topic.into(),
        range_id,
    };
    let merge = |topic: &str, range_id| MergeRangeRequest {
        topic: topic.into(),
        range_id,
    };
    table.row(
        "split_range",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.call(&split("nope", 0)).await,
    );
    table.row(
        "split_range",
        ErrorCode::RangeNotFound,
        "no such range",
        c.call(&split("t", 999)).await,
    );
    table.row(
        "merge_range",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.call(&merge("nope", 0)).await,
    );
    table.row(
        "merge_range",
        ErrorCode::RangeNotFound,
        "no such range",
        c.call(&merge("t", 999)).await,
    );
    let whole = active_ranges(&mut c, "t").await[0];
    table.row(
        "merge_range",
        ErrorCode::NotBuddies,
        "the range covering the whole keyspace",
        c.call(&merge("t", whole)).await,
    );
    c.call(&split("t", whole)).await.unwrap();
    table.row(
        "split_range",
        ErrorCode::RangeNotFound,
        "a range split already",
        c.call(&split("t", whole)).await,
    );
    table.row(
        "merge_range",
        ErrorCode::RangeNotFound,
        "a range split already",
        c.call(&merge("t", whole)).await,
    );

    // --- produce ---
    table.row(
        "produce",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.produce("nope", &[record("k", "v")]).await,
    );
    table.row(
        "produce",
        ErrorCode::InvalidRequest,
        "an empty key",
        c.produce("t", &[record("k", "v"), record("", "v")]).await,
    );
    table.row(
        "produce",
        ErrorCode::InvalidRequest,
        "a value over record_value_bytes_max",
        c.produce("t", &[record("k", &"x".repeat(VALUE_BYTES_MAX + 1))])
            .await,
    );
    table.row(
        "produce",
        ErrorCode::InvalidRequest,
        "a header the broker reserves",
        c.produce("t", &[record("k", "v").with_header("malachi.mine", "1")])
            .await,
    );
    let (control, _) = produce_request("t", &[record("k", "v")])
        .encode_parts()
        .unwrap();
    let mut empty = BytesMut::from(&control[..]);
    empty.put_slice(&EMPTY_BLOCK);
    c.send_raw(ApiKeyCode::PRODUCE, empty.freeze()).await;
    table.row(
        "produce",
        ErrorCode::InvalidRequest,
        "an empty batch",
        refused_frame(c.recv().await.unwrap()),
    );
    let mut corrupt =
        BytesMut::from(&produce_request("t", &[record("k", "v")]).encode().unwrap()[..]);
    let last = corrupt.len() - 2;
    corrupt[last] ^= 0xff;
    c.send_raw(ApiKeyCode::PRODUCE, corrupt.freeze()).await;
    table.row(
        "produce",
        ErrorCode::InvalidRecordBatch,
        "a block whose CRC fails",
        refused_frame(c.recv().await.unwrap()),
    );
    // Nothing of the refused requests was stored.
    let (stored, _) = c.fetch("t", None, true, 1_000, 0).await.unwrap();
    assert!(stored.is_empty(), "a refused produce stored {stored:?}");

    c.create_topic("p").await;
    let p = active_ranges(&mut c, "p").await[0];
    table.row(
        "produce",
        ErrorCode::RangeNotFound,
        "a tag naming a range the topic never had",
        c.call(&tagged("p", 999, 1, 0, "v")).await,
    );
    c.call(&tagged("p", p, 5, 0, "a")).await.unwrap();
    table.row(
        "produce",
        ErrorCode::SequenceGap,
        "a sequence past the next",
        c.call(&tagged("p", p, 5, 2, "c")).await,
    );
    table.row(
        "produce",
        ErrorCode::UnknownProducer,
        "a new epoch not starting at 0",
        c.call(&tagged("p", p, 6, 4, "c")).await,
    );
    c.call(&tagged("p", p, 9, 0, "b")).await.unwrap();
    table.row(
        "produce",
        ErrorCode::ProducerFenced,
        "an epoch older than the range's newest",
        c.call(&tagged("p", p, 5, 1, "zombie")).await,
    );
    c.call(&split("p", p)).await.unwrap();
    table.row(
        "produce",
        ErrorCode::Moved,
        "a new batch addressed to a range split since",
        c.call(&tagged("p", p, 9, 1, "c")).await,
    );

    // A frame over frame_bytes_max: the broker answers on id 0 and closes.
    let mut raw = TestClient::connect(broker.client_addr()).await;
    let mut header = BytesMut::new();
    header.put_u32((FRAME_BYTES_MAX + 1) as u32);
    header.put_u16(ApiKeyCode::PRODUCE);
    header.put_u32(1);
    raw.framed.get_mut().write_all(&header).await.unwrap();
    let goodbye = raw.recv().await.expect("an answer before the close");
    assert_eq!(goodbye.correlation_id, 0);
    table.row(
        "produce",
        ErrorCode::FrameTooLarge,
        "a frame over frame_bytes_max",
        refused_frame(goodbye),
    );
    assert!(
        raw.recv().await.is_none(),
        "the broker closes the connection"
    );

    // --- fetch, subscribe, subscribe_credit ---
    let fetch = |topic: &str, cursor: Option<&str>| FetchRequest {
        topic: topic.into(),
        cursor: cursor.map(str::to_owned),
        from_start: cursor.is_none(),
        records_max: 10,
        bytes_max: 1 << 20,
        wait_ms: 0,
    };
    let subscribe = |topic: &str, cursor: Option<&str>| SubscribeRequest {
        topic: topic.into(),
        cursor: cursor.map(str::to_owned),
        from_start: cursor.is_none(),
        credit_records: 10,
        credit_bytes: 1 << 20,
    };
    table.row(
        "fetch",
        ErrorCode::TopicNotFound,
        "no such topic",
        c.call(&fetch("nope", None)).await,
    );
    table.row(
        "fetch",
        ErrorCode::InvalidCursor,
        "a forged cursor",
        c.call(&fetch("t", Some("not-a-cursor"))).await,
    );
    c.create_topic("big").await;
    c.produce("big", &[record("k", &"x".repeat(NEAR_FRAME_VALUE_BYTES))])
        .await
        .unwrap();
    table.row(
        "fetch",
        ErrorCode::FrameTooLarge,
        "a record no response frame can carry beside a cursor",
        c.call(&fetch("big", None)).await,
    );
    let mut s = TestClient::connect(broker.client_addr()).await;
    let refused = subscribe_error(&mut s, &subscribe("nope", None)).await;
    table.row(
        "subscribe",
        ErrorCode::TopicNotFound,
        "no such topic",
        Err::<(), _>(refused),
    );
    let refused = subscribe_error(&mut s, &subscribe("t", Some("not-a-cursor"))).await;
    table.row(
        "subscribe",
        ErrorCode::InvalidCursor,
        "a forged cursor",
        Err::<(), _>(refused),
    );
    let refused = subscribe_error(&mut s, &subscribe("big", None)).await;
    table.row(
        "subscribe",
        ErrorCode::FrameTooLarge,
        "a record no push frame can carry beside a cursor",
        Err::<(), _>(refused),
    );
    table.row(
        "subscribe_credit",
        ErrorCode::SubscriptionNotFound,
        "an id no subscription has",
        s.call(&SubscribeCreditRequest {
            subscription_id: 777,
            credit_records: 1,
            credit_bytes: 1,
            acked_sequence: None,
            cancel: false,
        })
        .await,
    );

    // --- vnode_split ---
    table.row(
        "vnode_split",
        ErrorCode::VnodeNotFound,
        "no such vnode",
        c.call(&VnodeSplitRequest { vnode: 9_999 }).await,
    );

    // --- cluster_members ---
    table.row(
        "cluster_members",
        ErrorCode::InvalidRequest,
        "a decommission of a broker that is no member",
        c.call(&ClusterMembersRequest {
            decommission: Some(77),
            admit: None,
        })
        .await,
    );
    table.row(
        "cluster_members",
        ErrorCode::InvalidRequest,
        "a decommission of the last active broker",
        c.call(&ClusterMembersRequest {
            decommission: Some(1),
            admit: None,
        })
        .await,
    );
    // --- features ---
    table.row(
        "features",
        ErrorCode::FeatureUnavailable,
        "activating a feature no broker supports",
        c.call(&FeaturesRequest {
            activate: Some("no_such_feature".into()),
            finalize: false,
        })
        .await,
    );
    // --- put_policy, list_policies, delete_policy ---
    table.row(
        "put_policy",
        ErrorCode::InvalidRequest,
        "a retention age of 0",
        c.call(&PutPolicyRequest {
            policy: PolicyDescription {
                name: "zero".into(),
                retention_age_ms: Some(0),
                ..PolicyDescription::default()
            },
        })
        .await,
    );
    table.row(
        "list_policies",
        ErrorCode::PolicyNotFound,
        "a policy nobody defined",
        c.call(&ListPoliciesRequest {
            name: Some("nobody".into()),
        })
        .await,
    );
    table.row(
        "delete_policy",
        ErrorCode::PolicyNotFound,
        "a policy nobody defined",
        c.call(&DeletePolicyRequest {
            name: "nobody".into(),
        })
        .await,
    );
    broker.shutdown().await.unwrap();

    let file_dir = tempfile::tempdir().unwrap();
    let file_broker = start(BrokerConfig {
        metadata_backend: MetadataBackend::File,
        ..BrokerConfig::for_tests(file_dir.path())
    })
    .await;
    let mut f = TestClient::connect(file_broker.client_addr()).await;
    table.row(
        "vnode_split",
        ErrorCode::InvalidRequest,
        "a broker keeping its metadata in one file",
        f.call(&VnodeSplitRequest { vnode: 0 }).await,
    );
    table.row(
        "cluster_members",
        ErrorCode::InvalidRequest,
        "a broker keeping its metadata in one file",
        f.call(&ClusterMembersRequest::default()).await,
    );
    table.row(
        "features",
        ErrorCode::InvalidRequest,
        "a broker keeping its metadata in one file",
        f.call(&FeaturesRequest::default()).await,
    );
    file_broker.shutdown().await.unwrap();

    // --- storage_full: a broker whose volume is below min_free_bytes ---
    let full_dir = tempfile::tempdir().unwrap();
    let mut full_config = BrokerConfig::for_tests(full_dir.path());
    full_config.store.min_free_bytes = u64::MAX / 2;
    // Never ready (its volume is full): started without waiting for it.
    let full_broker = malachi_actors::Broker::start(full_config).await.unwrap();
    let mut full = TestClient::connect(full_broker.client_addr()).await;
    assert!(
        eventually(10_000, async || {
            let created = full
                .call(&CreateTopicRequest {
                    name: "full".into(),
                    replication_factor: None,
                    policy: None,
                })
                .await;
            matches!(
                created,
                Ok(_)
                    | Err(Refused {
                        code: ErrorCode::TopicExists,
                        ..
                    })
            )
        })
        .await
    );
    let mut got = full.produce("full", &[record("k", "v")]).await;
    // The table row below shows what the last produce got if it never is.
    let _ = malachi_testkit::wait::Wait::new(
        "a produce is refused as storage_full",
        std::time::Duration::from_secs(5),
        std::time::Duration::from_millis(50),
    )
    .try_until(async || {
        got = full.produce("full", &[record("k", "v")]).await;
        got.as_ref()
            .is_err_and(|r| r.code == ErrorCode::StorageFull)
    })
    .await;
    table.row(
        "produce",
        ErrorCode::StorageFull,
        "a broker whose data volume is below store.min_free_bytes",
        got,
    );
    full_broker.shutdown().await.unwrap();

    // --- busy: a broker at connections_max says so, on id 0 ---
    let busy_dir = tempfile::tempdir().unwrap();
    let busy_broker = start(BrokerConfig {
        connections_max: 1,
        ..BrokerConfig::for_tests(busy_dir.path())
    })
    .await;
    let mut first = TestClient::connect(busy_broker.client_addr()).await;
    first.call(&ListTopicsRequest {}).await.unwrap();
    let mut second = TestClient::connect(busy_broker.client_addr()).await;
    let goodbye = second.recv().await.expect("a goodbye before the close");
    assert_eq!(goodbye.correlation_id, 0);
    table.row(
        "list_topics",
        ErrorCode::Busy,
        "a connection past connections_max",
        refused_frame(goodbye),
    );
    busy_broker.shutdown().await.unwrap();

    check(&doc, &table);
}

/// The table's verdict: each row got its expected code, each code is
/// listed for its operation, and each listed code is provoked somewhere or
/// excused by name.
fn check(doc: &DocumentedErrors, table: &Table) {
    let mut failures = Vec::new();
    for row in &table.rows {
        let got = row.got.map_or("none (success)", |c| c.name());
        if row.got != Some(row.expected) {
            failures.push(format!(
                "{} with {}: expected {}, got {got} ({})",
                row.op,
                row.how,
                row.expected.name(),
                row.message
            ));
        }
        if let Some(code) = row.got
            && !doc.allowed(row.op).contains(code.name())
        {
            failures.push(format!(
                "{} with {}: answered {}, which protocol.md does not list for {}",
                row.op,
                row.how,
                code.name(),
                row.op
            ));
        }
    }
    let provoked: BTreeSet<(String, String)> = table
        .rows
        .iter()
        .filter_map(|r| r.got.map(|c| (r.op.to_owned(), c.name().to_owned())))
        .chain(
            PROVOKED_BY_THREE_BROKERS
                .iter()
                .map(|(op, code)| ((*op).to_owned(), (*code).to_owned())),
        )
        .collect();
    let excused = |op: &str, code: &str| {
        NOT_PROVOKED
            .iter()
            .any(|(o, c, _)| *c == code && (*o == op || *o == "*"))
    };
    for op in doc.per_op.keys() {
        for code in doc.particular(op) {
            if !provoked.contains(&(op.clone(), code.clone())) && !excused(op, &code) {
                failures.push(format!(
                    "protocol.md lists {code} for {op}, and nothing provokes it"
                ));
            }
        }
    }
    for code in &doc.common {
        if !provoked.iter().any(|(_, c)| c == code) && !excused("*", code) {
            failures.push(format!(
                "protocol.md says any request may get {code}, and nothing provokes it"
            ));
        }
    }
    // An excuse must be for a listed code nothing here provokes.
    for (op, code, why) in NOT_PROVOKED {
        let listed = if *op == "*" {
            doc.common.contains(*code)
        } else {
            doc.per_op
                .get(*op)
                .is_some_and(|codes| codes.contains(*code))
        };
        if !listed {
            failures.push(format!(
                "NOT_PROVOKED excuses {code} for {op} ({why}), which protocol.md does not list"
            ));
        }
        if *op != "*" && provoked.contains(&((*op).to_owned(), (*code).to_owned())) {
            failures.push(format!(
                "NOT_PROVOKED excuses {code} for {op}, which a row provokes: drop the excuse"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_document_parses_into_every_operation_with_its_errors() {
    let doc = DocumentedErrors::read();
    for op in [
        "api_versions",
        "create_topic",
        "delete_topic",
        "list_topics",
        "describe_topic",
        "split_range",
        "merge_range",
        "produce",
        "fetch",
        "subscribe",
        "subscribe_credit",
        "tree_snapshot",
        "cluster_status",
        "vnode_list",
        "vnode_split",
        "cluster_members",
        "put_policy",
        "list_policies",
        "delete_policy",
        "features",
    ] {
        assert!(doc.per_op.contains_key(op), "{op} missing: {doc:?}");
    }
    assert!(doc.particular("produce").contains("sequence_gap"));
    assert_eq!(doc.per_op["subscribe"], doc.per_op["fetch"]);
    assert!(doc.common.contains("unsupported_version"));
}
