//! Deterministic sample messages, one request and one response per operation,
//! shared by the format snapshots (the format freeze).

#![allow(dead_code)]

use std::collections::BTreeMap;

use malachi_wire::messages::*;
use malachi_wire::{Record, RecordBatch, Request, Response};

pub fn batch() -> RecordBatch {
    RecordBatch::from_records(
        &[
            Record::new("user-1", "hello"),
            Record::new("user-2", "world")
                .with_timestamp_ms(1_700_000_000_000)
                .with_header("trace", "ab"),
        ],
        1 << 20,
    )
    .unwrap_or_default()
}

fn description() -> TopicDescription {
    TopicDescription {
        name: "orders".into(),
        incarnation: 3,
        state: "active".into(),
        sealed_at_ms: None,
        policy: Some("keep-7d".into()),
        policy_resolved: true,
        created_at_ms: 1_000,
        ranges: vec![RangeDescription {
            id: 1,
            band_start: "0x0000000000000000".into(),
            band_end: "0x8000000000000000".into(),
            state: "active".into(),
            sealed_at_ms: None,
            parents: vec![0],
            children: vec![],
            created_at_ms: 2_000,
            segments: vec![
                SegmentDescription {
                    id: 7,
                    start_offset: 0,
                    replicas: vec![1, 2, 3],
                    state: "sealed".into(),
                    length: Some(10),
                    bytes: Some(4096),
                    created_at_ms: 2_000,
                    sealed_at_ms: Some(3_000),
                    epoch: 4,
                    primary: Some(1),
                    committed_end: Some(10),
                    copies: [1, 2, 3]
                        .map(|node| CopyDescription {
                            node,
                            status: "sealed".into(),
                            durable_end: None,
                        })
                        .to_vec(),
                },
                SegmentDescription {
                    id: 8,
                    start_offset: 10,
                    replicas: vec![2, 3, 1],
                    state: "active".into(),
                    length: None,
                    bytes: None,
                    created_at_ms: 3_000,
                    sealed_at_ms: None,
                    epoch: 5,
                    primary: Some(2),
                    committed_end: Some(4),
                    copies: vec![
                        CopyDescription {
                            node: 2,
                            status: "live".into(),
                            durable_end: Some(5),
                        },
                        CopyDescription {
                            node: 3,
                            status: "live".into(),
                            durable_end: Some(4),
                        },
                        CopyDescription {
                            node: 1,
                            status: "unreachable".into(),
                            durable_end: None,
                        },
                    ],
                },
            ],
        }],
        reshaping: None,
    }
}

fn tree() -> SupervisorSnapshot {
    SupervisorSnapshot {
        name: "broker".into(),
        actor_id: "0.1".into(),
        strategy: SupervisionStrategy::OneForOne,
        uptime_ms: 5_000,
        children: vec![
            ChildSnapshot {
                name: "storage".into(),
                actor_id: Some("0.2".into()),
                kind: ChildKind::Supervisor,
                restart: Restart::Permanent,
                status: ChildStatus::Running,
                restarts: 0,
                last_exit_reason: None,
                uptime_ms: 4_900,
                supervisor: Some(SupervisorSnapshot {
                    name: "storage".into(),
                    actor_id: "0.2".into(),
                    strategy: SupervisionStrategy::OneForAll,
                    uptime_ms: 4_900,
                    children: vec![],
                }),
            },
            ChildSnapshot {
                name: "listener".into(),
                actor_id: None,
                kind: ChildKind::Worker,
                restart: Restart::Transient,
                status: ChildStatus::Restarting,
                restarts: 2,
                last_exit_reason: Some("boom".into()),
                uptime_ms: 0,
                supervisor: None,
            },
        ],
    }
}

/// One request and one response for every operation, in api key order.
pub fn pairs() -> Vec<(&'static str, Request, Response)> {
    vec![
        (
            "api_versions",
            Request::ApiVersions(ApiVersionsRequest {
                client_name: "cli".into(),
                versions: vec![ApiVersion {
                    api_key: 10,
                    min_version: 0,
                    max_version: 0,
                }],
            }),
            Response::ApiVersions(ApiVersionsResponse {
                node_id: 1,
                versions: vec![ApiVersion {
                    api_key: 0,
                    min_version: 0,
                    max_version: 0,
                }],
            }),
        ),
        (
            "create_topic",
            Request::CreateTopic(CreateTopicRequest {
                name: "orders".into(),
                replication_factor: Some(3),
                policy: None,
            }),
            Response::CreateTopic(CreateTopicResponse {
                name: "orders".into(),
                incarnation: 1,
            }),
        ),
        (
            "delete_topic",
            Request::DeleteTopic(DeleteTopicRequest {
                name: "orders".into(),
            }),
            Response::DeleteTopic(DeleteTopicResponse {
                name: "orders".into(),
            }),
        ),
        (
            "list_topics",
            Request::ListTopics(ListTopicsRequest {}),
            Response::ListTopics(ListTopicsResponse {
                topics: vec![TopicListing {
                    name: "orders".into(),
                    incarnation: 1,
                    state: "active".into(),
                    ranges_active: 2,
                }],
            }),
        ),
        (
            "describe_topic",
            Request::DescribeTopic(DescribeTopicRequest {
                name: "orders".into(),
                live: false,
            }),
            Response::DescribeTopic(DescribeTopicResponse {
                topic: description(),
            }),
        ),
        (
            "split_range",
            Request::SplitRange(SplitRangeRequest {
                topic: "orders".into(),
                range_id: 1,
            }),
            Response::SplitRange(SplitRangeResponse {
                range_id: 1,
                children: vec![2, 3],
            }),
        ),
        (
            "merge_range",
            Request::MergeRange(MergeRangeRequest {
                topic: "orders".into(),
                range_id: 2,
            }),
            Response::MergeRange(MergeRangeResponse {
                range_id: 4,
                parents: vec![2, 3],
            }),
        ),
        (
            "produce",
            Request::Produce(ProduceRequest {
                topic: "orders".into(),
                producer: Some(ProducerBatch {
                    producer_id: 0x00c0_ffee,
                    epoch: 3,
                    range: 1,
                    sequence: 41,
                }),
                records: batch(),
            }),
            Response::Produce(ProduceResponse {
                records_acknowledged: 2,
                ranges: vec![RangeOutcome {
                    range: 1,
                    records_acknowledged: 2,
                    duplicate: true,
                    error_code: 0,
                    message: None,
                }],
            }),
        ),
        (
            "fetch",
            Request::Fetch(FetchRequest {
                topic: "orders".into(),
                cursor: Some("AQID".into()),
                from_start: false,
                records_max: 100,
                bytes_max: 65_536,
                wait_ms: 500,
            }),
            Response::Fetch(FetchResponse {
                next_cursor: "AQIE".into(),
                records: batch(),
            }),
        ),
        (
            "subscribe",
            Request::Subscribe(SubscribeRequest {
                topic: "orders".into(),
                cursor: None,
                from_start: true,
                credit_records: 1_000,
                credit_bytes: 1_048_576,
            }),
            Response::Subscribe(SubscribePush {
                sequence: 1,
                next_cursor: "AQIF".into(),
                last: false,
                records: batch(),
            }),
        ),
        (
            "subscribe_credit",
            Request::SubscribeCredit(SubscribeCreditRequest {
                subscription_id: 7,
                credit_records: 500,
                credit_bytes: 524_288,
                acked_sequence: Some(1),
                cancel: false,
            }),
            Response::SubscribeCredit(SubscribeCreditResponse {
                credit_records: 1_498,
                credit_bytes: 1_572_864,
            }),
        ),
        (
            "tree_snapshot",
            Request::TreeSnapshot(TreeSnapshotRequest { all: true }),
            Response::TreeSnapshot(TreeSnapshotResponse {
                node_id: 1,
                root: tree(),
                brokers: vec![
                    BrokerTree {
                        node_id: 1,
                        state: BrokerState::Alive,
                        client_addr: "10.0.0.1:4040".into(),
                        root: Some(tree()),
                        unreachable: None,
                    },
                    BrokerTree {
                        node_id: 2,
                        state: BrokerState::Dead,
                        client_addr: "10.0.0.2:4040".into(),
                        root: None,
                        unreachable: Some("declared dead by membership".into()),
                    },
                ],
            }),
        ),
        (
            "cluster_status",
            Request::ClusterStatus(ClusterStatusRequest {}),
            Response::ClusterStatus(ClusterStatusResponse {
                node_id: 1,
                brokers: vec![BrokerStatus {
                    node_id: 1,
                    state: BrokerState::Suspect,
                    client_addr: "10.0.0.1:4040".into(),
                    raft_addr: "10.0.0.1:4041".into(),
                    admin_addr: "10.0.0.1:8080".into(),
                    attributes: BTreeMap::from([("rack".into(), "r1".into())]),
                    vnodes_led: vec![0, 5],
                    incarnation: 1_764_000_000_000,
                    cluster_addr: "10.0.0.1:9040".into(),
                    cluster_port: "unreachable".into(),
                }],
            }),
        ),
        (
            "vnode_list",
            Request::VnodeList(VnodeListRequest {}),
            Response::VnodeList(VnodeListResponse {
                node_id: 1,
                ring_version: 2,
                vnodes: vec![
                    VnodeInfo {
                        id: 0,
                        arc_start: 0,
                        arc_last: 0x3fff_ffff_ffff_ffff,
                        leader: Some(2),
                        term: 3,
                        replicas: vec![1, 2, 3],
                        lease_holder: Some(2),
                    },
                    VnodeInfo {
                        id: 2,
                        arc_start: 0x4000_0000_0000_0000,
                        arc_last: 0x7fff_ffff_ffff_ffff,
                        leader: None,
                        term: 0,
                        replicas: vec![1, 2, 3],
                        lease_holder: None,
                    },
                ],
            }),
        ),
        (
            "cluster_members",
            Request::ClusterMembers(ClusterMembersRequest {
                decommission: Some(4),
                admit: None,
            }),
            Response::ClusterMembers(ClusterMembersResponse {
                node_id: 1,
                ring_version: 3,
                members: vec![
                    MemberInfo {
                        node_id: 1,
                        state: MemberState::Active,
                        vnode_replicas: 17,
                        vnode_learners: 0,
                    },
                    MemberInfo {
                        node_id: 4,
                        state: MemberState::Decommissioned,
                        vnode_replicas: 2,
                        vnode_learners: 4,
                    },
                ],
                groups: 17,
                groups_moving: 2,
                groups_unreachable: 0,
            }),
        ),
        (
            "put_policy",
            Request::PutPolicy(PutPolicyRequest {
                policy: PolicyDescription {
                    name: "week".into(),
                    retention_age_ms: Some(604_800_000),
                    retention_bytes: Some(1 << 30),
                    placement: vec!["distinct(zone) >= 2".into()],
                    reshape: None,
                },
            }),
            Response::PutPolicy(PutPolicyResponse {
                name: "week".into(),
            }),
        ),
        (
            "list_policies",
            Request::ListPolicies(ListPoliciesRequest {
                name: Some("week".into()),
            }),
            Response::ListPolicies(ListPoliciesResponse {
                policies: vec![PolicyDescription {
                    name: "week".into(),
                    retention_age_ms: Some(604_800_000),
                    retention_bytes: None,
                    placement: Vec::new(),
                    reshape: None,
                }],
            }),
        ),
        (
            "delete_policy",
            Request::DeletePolicy(DeletePolicyRequest {
                name: "week".into(),
            }),
            Response::DeletePolicy(DeletePolicyResponse {
                name: "week".into(),
            }),
        ),
        (
            "features",
            Request::Features(FeaturesRequest {
                activate: Some("split_merge_segments".into()),
                finalize: false,
            }),
            Response::Features(FeaturesResponse {
                node_id: 1,
                cluster_version: 1,
                brokers: vec![BrokerVersion {
                    node_id: 1,
                    binary: "0.1.0".into(),
                    logical: 1,
                    supported: vec!["waited_lease".into(), "split_merge_segments".into()],
                }],
                features: vec![
                    FeatureInfo {
                        name: "split_merge_segments".into(),
                        state: "active".into(),
                        missing: Vec::new(),
                    },
                    FeatureInfo {
                        name: "users".into(),
                        state: "unavailable".into(),
                        missing: vec![2],
                    },
                ],
                waiting_for: Vec::new(),
            }),
        ),
        (
            "vnode_split",
            Request::VnodeSplit(VnodeSplitRequest { vnode: 0 }),
            Response::VnodeSplit(VnodeSplitResponse {
                ring_version: 2,
                parent: VnodeInfo {
                    id: 0,
                    arc_start: 0,
                    arc_last: 0x3fff_ffff_ffff_ffff,
                    leader: Some(2),
                    term: 3,
                    replicas: vec![1, 2, 3],
                    lease_holder: Some(2),
                },
                child: VnodeInfo {
                    id: 2,
                    arc_start: 0x4000_0000_0000_0000,
                    arc_last: 0x7fff_ffff_ffff_ffff,
                    leader: Some(1),
                    term: 1,
                    replicas: vec![1, 2, 3],
                    lease_holder: None,
                },
            }),
        ),
    ]
}
