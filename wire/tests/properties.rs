//! Properties: every message and every record batch survives encode then
//! decode unchanged, and no decoder panics on arbitrary or damaged bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use malachi_wire::api::ApiKey;
use malachi_wire::batch::{BATCH_MAGIC, BatchError};
use malachi_wire::messages::*;
use malachi_wire::{
    ClientCodec, ErrorBody, Message, Record, RecordBatch, Request, Response, ServerCodec,
};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use tokio_util::codec::Decoder;

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,24}"
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

fn cursor() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{0,64}"
}

fn bytes_up_to(len: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..len).prop_map(Bytes::from)
}

fn record() -> impl Strategy<Value = Record> {
    (
        option::of(any::<u64>()),
        bytes_up_to(32),
        bytes_up_to(64),
        vec((text(), bytes_up_to(16)), 0..3),
    )
        .prop_map(|(timestamp_ms, key, value, headers)| {
            let mut record = Record {
                timestamp_ms,
                key,
                value,
                headers: Vec::new(),
            };
            for (name, value) in headers {
                record = record.with_header(name, value);
            }
            record
        })
}

fn batch(records_min: usize) -> impl Strategy<Value = RecordBatch> {
    vec(record(), records_min..8)
        .prop_map(|records| RecordBatch::from_records(&records, 1 << 20).unwrap())
}

fn start() -> impl Strategy<Value = (Option<String>, bool)> {
    prop_oneof![
        cursor().prop_map(|c| (Some(c), false)),
        Just((None, true)),
        Just((None, false)),
    ]
}

fn versions() -> impl Strategy<Value = Vec<ApiVersion>> {
    vec(
        (any::<u16>(), 0u16..4, 0u16..4).prop_map(|(api_key, a, b)| ApiVersion {
            api_key,
            min_version: a.min(b),
            max_version: a.max(b),
        }),
        0..6,
    )
}

fn state() -> impl Strategy<Value = String> {
    prop_oneof![Just("active".to_owned()), Just("sealed".to_owned())]
}

fn description() -> impl Strategy<Value = TopicDescription> {
    let copy = (any::<u64>(), state(), option::of(any::<u64>())).prop_map(
        |(node, status, durable_end)| CopyDescription {
            node,
            status,
            durable_end,
        },
    );
    let segment = (
        (
            any::<u64>(),
            any::<u64>(),
            vec(any::<u64>(), 0..4),
            state(),
            option::of(any::<u64>()),
            option::of(any::<u64>()),
            any::<u64>(),
            option::of(any::<u64>()),
        ),
        (
            option::of(any::<u64>()),
            option::of(any::<u64>()),
            vec(copy, 0..4),
        ),
    )
        .prop_map(
            |(
                (id, start_offset, replicas, state, length, bytes, created_at_ms, sealed_at_ms),
                (primary, committed_end, copies),
            )| {
                SegmentDescription {
                    id,
                    start_offset,
                    replicas,
                    state,
                    length,
                    bytes,
                    created_at_ms,
                    sealed_at_ms,
                    epoch: id.rotate_left(7),
                    primary,
                    committed_end,
                    copies,
                }
            },
        );
    let range = (
        any::<u64>(),
        any::<u64>(),
        state(),
        option::of(any::<u64>()),
        vec(any::<u64>(), 0..3),
        vec(any::<u64>(), 0..3),
        any::<u64>(),
        vec(segment, 0..3),
    )
        .prop_map(
            |(id, band, state, sealed_at_ms, parents, children, created_at_ms, segments)| {
                RangeDescription {
                    id,
                    band_start: format!("{band:#018x}"),
                    band_end: format!("{:#018x}", band / 2),
                    state,
                    sealed_at_ms,
                    parents,
                    children,
                    created_at_ms,
                    segments,
                }
            },
        );
    (
        name(),
        any::<u64>(),
        state(),
        option::of(any::<u64>()),
        option::of(name()),
        any::<bool>(),
        any::<u64>(),
        vec(range, 0..3),
    )
        .prop_map(
            |(name, incarnation, state, sealed_at_ms, policy, policy_resolved, created, ranges)| {
                TopicDescription {
                    name,
                    incarnation,
                    state,
                    sealed_at_ms,
                    policy,
                    policy_resolved,
                    created_at_ms: created,
                    ranges,
                    reshaping: None,
                }
            },
        )
}

fn child(
    supervisor: impl Strategy<Value = Option<SupervisorSnapshot>>,
) -> impl Strategy<Value = ChildSnapshot> {
    (
        name(),
        option::of(name()),
        prop_oneof![Just(ChildKind::Worker), Just(ChildKind::Supervisor)],
        prop_oneof![
            Just(Restart::Permanent),
            Just(Restart::Transient),
            Just(Restart::Temporary)
        ],
        prop_oneof![
            Just(ChildStatus::Running),
            Just(ChildStatus::Restarting),
            Just(ChildStatus::Stopped),
            Just(ChildStatus::Unresponsive)
        ],
        any::<u32>(),
        option::of(text()),
        any::<u64>(),
        supervisor,
    )
        .prop_map(
            |(name, actor_id, kind, restart, status, restarts, reason, uptime_ms, supervisor)| {
                ChildSnapshot {
                    name,
                    actor_id,
                    kind,
                    restart,
                    status,
                    restarts,
                    last_exit_reason: reason,
                    uptime_ms,
                    supervisor,
                }
            },
        )
}

fn strategy() -> impl Strategy<Value = SupervisionStrategy> {
    prop_oneof![
        Just(SupervisionStrategy::OneForOne),
        Just(SupervisionStrategy::OneForAll),
        Just(SupervisionStrategy::RestForOne)
    ]
}

fn tree() -> impl Strategy<Value = SupervisorSnapshot> {
    let leaf = (name(), name(), strategy(), any::<u64>()).prop_map(
        |(name, actor_id, strategy, uptime_ms)| SupervisorSnapshot {
            name,
            actor_id,
            strategy,
            uptime_ms,
            children: Vec::new(),
        },
    );
    leaf.prop_recursive(3, 12, 3, |inner| {
        (
            name(),
            name(),
            strategy(),
            any::<u64>(),
            vec(child(option::of(inner)), 0..3),
        )
            .prop_map(|(name, actor_id, strategy, uptime_ms, children)| {
                SupervisorSnapshot {
                    name,
                    actor_id,
                    strategy,
                    uptime_ms,
                    children,
                }
            })
    })
}

fn broker() -> impl Strategy<Value = BrokerStatus> {
    (
        any::<u64>(),
        prop_oneof![
            Just(BrokerState::Alive),
            Just(BrokerState::Suspect),
            Just(BrokerState::Dead)
        ],
        name(),
        name(),
        name(),
        btree_map(name(), name(), 0..3),
        vec(any::<u32>(), 0..5),
    )
        .prop_map(
            |(node_id, state, client_addr, raft_addr, admin_addr, attributes, vnodes_led)| {
                BrokerStatus {
                    node_id,
                    state,
                    client_addr,
                    raft_addr,
                    admin_addr,
                    attributes: attributes.into_iter().collect::<BTreeMap<_, _>>(),
                    vnodes_led,
                    incarnation: node_id % 7,
                    cluster_addr: String::new(),
                    cluster_port: String::new(),
                }
            },
        )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (name(), versions()).prop_map(|(client_name, versions)| Request::ApiVersions(
            ApiVersionsRequest {
                client_name,
                versions
            }
        )),
        (name(), option::of(1u8..=7), option::of(name())).prop_map(|(name, rf, policy)| {
            Request::CreateTopic(CreateTopicRequest {
                name,
                replication_factor: rf,
                policy,
            })
        }),
        name().prop_map(|name| Request::DeleteTopic(DeleteTopicRequest { name })),
        Just(Request::ListTopics(ListTopicsRequest {})),
        (name(), any::<bool>())
            .prop_map(|(name, live)| Request::DescribeTopic(DescribeTopicRequest { name, live })),
        (name(), any::<u64>()).prop_map(|(topic, range_id)| Request::SplitRange(
            SplitRangeRequest { topic, range_id }
        )),
        (name(), any::<u64>()).prop_map(|(topic, range_id)| Request::MergeRange(
            MergeRangeRequest { topic, range_id }
        )),
        (
            name(),
            option::of((any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>())),
            batch(1)
        )
            .prop_map(
                |(topic, producer, records)| Request::Produce(ProduceRequest {
                    topic,
                    producer: producer.map(|(producer_id, epoch, range, sequence)| ProducerBatch {
                        producer_id,
                        epoch,
                        range,
                        sequence,
                    }),
                    records,
                })
            ),
        (
            name(),
            start(),
            1u32..=100_000,
            1u32..=1 << 24,
            0u32..=30_000
        )
            .prop_map(
                |(topic, (cursor, from_start), records_max, bytes_max, wait_ms)| {
                    Request::Fetch(FetchRequest {
                        topic,
                        cursor,
                        from_start,
                        records_max,
                        bytes_max,
                        wait_ms,
                    })
                }
            ),
        (name(), start(), 0u32..=1_000_000, 0u32..=1 << 26).prop_map(
            |(topic, (cursor, from_start), credit_records, credit_bytes)| {
                Request::Subscribe(SubscribeRequest {
                    topic,
                    cursor,
                    from_start,
                    credit_records,
                    credit_bytes,
                })
            }
        ),
        (
            any::<u32>(),
            0u32..=1_000_000,
            0u32..=1 << 26,
            option::of(any::<u64>()),
            any::<bool>()
        )
            .prop_map(
                |(subscription_id, credit_records, credit_bytes, acked, cancel)| {
                    Request::SubscribeCredit(SubscribeCreditRequest {
                        subscription_id,
                        credit_records,
                        credit_bytes,
                        acked_sequence: acked,
                        cancel,
                    })
                }
            ),
        any::<bool>().prop_map(|all| Request::TreeSnapshot(TreeSnapshotRequest { all })),
        Just(Request::ClusterStatus(ClusterStatusRequest {})),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (any::<u64>(), versions()).prop_map(|(node_id, versions)| Response::ApiVersions(
            ApiVersionsResponse { node_id, versions }
        )),
        (name(), any::<u64>()).prop_map(|(name, incarnation)| Response::CreateTopic(
            CreateTopicResponse { name, incarnation }
        )),
        name().prop_map(|name| Response::DeleteTopic(DeleteTopicResponse { name })),
        vec(
            (name(), any::<u64>(), state(), any::<u32>()).prop_map(
                |(name, incarnation, state, ranges_active)| TopicListing {
                    name,
                    incarnation,
                    state,
                    ranges_active
                }
            ),
            0..4
        )
        .prop_map(|topics| Response::ListTopics(ListTopicsResponse { topics })),
        description().prop_map(|topic| Response::DescribeTopic(DescribeTopicResponse { topic })),
        (any::<u64>(), vec(any::<u64>(), 0..3)).prop_map(|(range_id, children)| {
            Response::SplitRange(SplitRangeResponse { range_id, children })
        }),
        (any::<u64>(), vec(any::<u64>(), 0..3)).prop_map(|(range_id, parents)| {
            Response::MergeRange(MergeRangeResponse { range_id, parents })
        }),
        (
            any::<u32>(),
            vec(
                (
                    any::<u64>(),
                    any::<u32>(),
                    any::<bool>(),
                    any::<u16>(),
                    option::of("[a-z ]{0,40}")
                ),
                0..4
            )
        )
            .prop_map(|(records_acknowledged, ranges)| Response::Produce(
                ProduceResponse {
                    records_acknowledged,
                    ranges: ranges
                        .into_iter()
                        .map(
                            |(range, records_acknowledged, duplicate, error_code, message)| {
                                RangeOutcome {
                                    range,
                                    records_acknowledged,
                                    duplicate,
                                    error_code,
                                    message,
                                }
                            }
                        )
                        .collect(),
                }
            )),
        (cursor(), batch(0)).prop_map(|(next_cursor, records)| Response::Fetch(FetchResponse {
            next_cursor,
            records
        })),
        (any::<u64>(), cursor(), any::<bool>(), batch(0)).prop_map(
            |(sequence, next_cursor, last, records)| Response::Subscribe(SubscribePush {
                sequence,
                next_cursor,
                last,
                records,
            })
        ),
        (any::<u32>(), any::<u32>()).prop_map(|(credit_records, credit_bytes)| {
            Response::SubscribeCredit(SubscribeCreditResponse {
                credit_records,
                credit_bytes,
            })
        }),
        (any::<u64>(), tree(), proptest::option::of(tree())).prop_map(|(node_id, root, other)| {
            Response::TreeSnapshot(TreeSnapshotResponse {
                node_id,
                root,
                brokers: vec![BrokerTree {
                    node_id: node_id.wrapping_add(1),
                    state: BrokerState::Suspect,
                    client_addr: "127.0.0.1:4041".into(),
                    unreachable: other.is_none().then(|| "timed out".to_owned()),
                    root: other,
                }],
            })
        }),
        (any::<u64>(), vec(broker(), 0..4)).prop_map(|(node_id, brokers)| {
            Response::ClusterStatus(ClusterStatusResponse { node_id, brokers })
        }),
    ]
}

/// Every api key number a decoder may be handed: implemented, reserved, unknown.
fn any_api_key() -> impl Strategy<Value = u16> {
    prop_oneof![0u16..=25, 100u16..=105, 200u16..=202, any::<u16>()]
}

/// A block with a correct CRC over arbitrary body bytes, so the structure
/// checks behind the CRC are exercised too.
fn sealed_block(body: &[u8]) -> Bytes {
    let mut block = BytesMut::new();
    block.put_u8(BATCH_MAGIC);
    block.put_u32(crc32fast::hash(body));
    block.put_slice(body);
    block.freeze()
}

fn decode_everything(bytes: &Bytes, api_key: u16) {
    let _ = Request::decode(api_key, bytes.clone());
    if let Ok(key) = ApiKey::from_code(api_key) {
        let _ = Response::decode(key, bytes.clone());
    }
    let _ = ErrorBody::decode(bytes.clone());
    let _ = RecordBatch::from_block(bytes.clone());
    let _ = RecordBatch::from_block(sealed_block(bytes)).map(|b| b.records());
    let mut buffer = BytesMut::from(bytes.as_ref());
    while let Ok(Some(_)) = ServerCodec::new(4096).decode(&mut buffer) {}
    let mut buffer = BytesMut::from(bytes.as_ref());
    while let Ok(Some(_)) = ClientCodec::new(4096).decode(&mut buffer) {}
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_request_survives_encode_then_decode(request in request()) {
        let payload = request.encode().unwrap();
        let decoded = Request::decode(request.api_key().code(), payload).unwrap();
        prop_assert_eq!(decoded, request);
    }

    #[test]
    fn every_response_survives_encode_then_decode(response in response()) {
        let payload = response.encode().unwrap();
        let decoded = Response::decode(response.api_key(), payload).unwrap();
        prop_assert_eq!(decoded, response);
    }

    #[test]
    fn every_error_body_survives_encode_then_decode(
        message in text(),
        leader_hint in option::of(name()),
        retry_after_ms in option::of(any::<u32>()),
    ) {
        let body = ErrorBody { message, leader_hint, retry_after_ms, ranges: None };
        prop_assert_eq!(ErrorBody::decode(body.encode().unwrap()).unwrap(), body);
    }

    #[test]
    fn every_record_batch_survives_encode_then_decode(records in vec(record(), 0..16)) {
        let batch = RecordBatch::from_records(&records, 1 << 20).unwrap();
        let decoded = RecordBatch::from_block(batch.block().clone()).unwrap();
        prop_assert_eq!(decoded.count() as usize, records.len());
        prop_assert_eq!(decoded.records(), records);
    }

    #[test]
    fn a_block_built_from_borrowed_parts_is_byte_identical_to_one_built_from_records(
        records in vec(record(), 0..16),
    ) {
        let owned = RecordBatch::from_records(&records, 1 << 20).unwrap();
        let mut builder = malachi_wire::BatchBuilder::new(1 << 20);
        for r in &records {
            let headers: Vec<(&str, &[u8])> =
                r.headers.iter().map(|h| (h.name.as_str(), h.value.as_ref())).collect();
            builder
                .push_ref(malachi_wire::RecordRef {
                    timestamp_ms: r.timestamp_ms,
                    key: &r.key,
                    value: &r.value,
                    headers: &headers,
                })
                .unwrap();
        }
        let borrowed = builder.finish();
        prop_assert_eq!(borrowed.block(), owned.block());
        // The CRC taken while pushing must be the one a reader checks.
        prop_assert_eq!(RecordBatch::from_block(borrowed.block().clone()).unwrap().records(), records);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(
        bytes in vec(any::<u8>(), 0..512),
        api_key in any_api_key(),
    ) {
        decode_everything(&Bytes::from(bytes), api_key);
    }

    #[test]
    fn decoders_never_panic_on_damaged_valid_messages(
        request in request(),
        response in response(),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        for payload in [request.encode().unwrap(), response.encode().unwrap()] {
            let mut damaged = payload.to_vec();
            if !damaged.is_empty() {
                let at = position.index(damaged.len());
                damaged[at] ^= flip;
            }
            decode_everything(&Bytes::from(damaged), request.api_key().code());
            let truncated = payload.slice(..cut.index(payload.len() + 1));
            decode_everything(&truncated, response.api_key().code());
        }
    }

    #[test]
    fn any_damage_to_a_block_is_refused_never_accepted_silently(
        batch in batch(1),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let mut damaged = batch.block().to_vec();
        let at = position.index(damaged.len());
        damaged[at] ^= flip;
        let result = RecordBatch::from_block(Bytes::from(damaged));
        prop_assert!(result.is_err(), "a damaged block was accepted");
        if at >= 5 {
            // A flip in the covered bytes is always a CRC mismatch: CRC32
            // detects every single-byte error.
            let is_crc_mismatch = matches!(result, Err(BatchError::CrcMismatch { .. }));
            prop_assert!(is_crc_mismatch);
        }
    }
}
