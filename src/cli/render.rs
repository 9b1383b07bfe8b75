//! Text renderings of what the broker answers: the supervision tree, a
//! topic's description, the topic list and the cluster status. JSON output is
//! the wire types' own serde form, so these are the only hand-made formats.

use std::fmt::Write as _;

use malachi_wire::messages::{
    BrokerState, BrokerTree, ChildKind, ChildSnapshot, ChildStatus, ClusterStatusResponse, Restart,
    SupervisionStrategy, SupervisorSnapshot, TopicDescription, TopicListing, TopicReshaping,
    TreeSnapshotResponse,
};

fn strategy(s: SupervisionStrategy) -> &'static str {
    match s {
        SupervisionStrategy::OneForOne => "one_for_one",
        SupervisionStrategy::OneForAll => "one_for_all",
        SupervisionStrategy::RestForOne => "rest_for_one",
    }
}

fn kind(k: ChildKind) -> &'static str {
    match k {
        ChildKind::Worker => "worker",
        ChildKind::Supervisor => "supervisor",
    }
}

fn restart(r: Restart) -> &'static str {
    match r {
        Restart::Permanent => "permanent",
        Restart::Transient => "transient",
        Restart::Temporary => "temporary",
    }
}

fn status(s: ChildStatus) -> &'static str {
    match s {
        ChildStatus::Running => "running",
        ChildStatus::Restarting => "restarting",
        ChildStatus::Stopped => "stopped",
        ChildStatus::Unresponsive => "unresponsive",
    }
}

fn broker_state(s: BrokerState) -> &'static str {
    match s {
        BrokerState::Alive => "alive",
        BrokerState::Suspect => "suspect",
        BrokerState::Dead => "dead",
    }
}

/// Whether to print the fields that change from run to run (ids, uptimes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volatile(pub bool);

/// The supervision tree, one line per actor, in the shape of layout.md:
///
/// ```text
/// broker one_for_one (node 1)
/// ├── storage supervisor one_for_one running restarts=0
/// │   └── segment/a/0/0 worker running restarts=1 last_exit="boom"
/// └── listener worker running restarts=0
/// ```
pub fn tree(snapshot: &TreeSnapshotResponse, volatile: Volatile) -> String {
    let root = &snapshot.root;
    let mut out = String::new();
    let _ = write!(
        out,
        "{} {} (node {})",
        root.name,
        strategy(root.strategy),
        snapshot.node_id
    );
    if volatile.0 {
        let _ = write!(out, " id={} up={}", root.actor_id, human_ms(root.uptime_ms));
    }
    out.push('\n');
    children(&mut out, &root.children, "", volatile);
    out
}

fn children(out: &mut String, list: &[ChildSnapshot], prefix: &str, volatile: Volatile) {
    for (i, child) in list.iter().enumerate() {
        let last = i + 1 == list.len();
        out.push_str(prefix);
        out.push_str(if last { "└── " } else { "├── " });
        let _ = write!(out, "{} {}", child.name, kind(child.kind));
        if let Some(nested) = &child.supervisor {
            let _ = write!(out, " {}", strategy(nested.strategy));
        }
        let _ = write!(out, " {}", status(child.status));
        if child.restart != Restart::Permanent {
            let _ = write!(out, " {}", restart(child.restart));
        }
        let _ = write!(out, " restarts={}", child.restarts);
        if volatile.0 {
            if let Some(id) = &child.actor_id {
                let _ = write!(out, " id={id}");
            }
            if child.status == ChildStatus::Running {
                let _ = write!(out, " up={}", human_ms(child.uptime_ms));
            }
        }
        if let Some(reason) = &child.last_exit_reason {
            let _ = write!(out, " last_exit={reason:?}");
        }
        out.push('\n');
        if let Some(SupervisorSnapshot {
            children: nested, ..
        }) = &child.supervisor
        {
            let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
            children(out, nested, &deeper, volatile);
        }
    }
}

/// Every broker's tree (`malachi tree --all`): a heading per broker, its
/// tree, or why it could not be had; then the totals.
///
/// ```text
/// == node 1 127.0.0.1:4040 alive
/// broker one_for_one (node 1)
/// ...
/// == node 3 127.0.0.1:4042 dead: unreachable (declared dead by membership)
/// 2 of 3 brokers answered; restarts in total: 0
/// ```
pub fn tree_all(brokers: &[BrokerTree]) -> String {
    let mut out = String::new();
    let mut answered = 0;
    let mut restarts = 0;
    for broker in brokers {
        let _ = write!(
            out,
            "== node {} {} {}",
            broker.node_id,
            dash(&broker.client_addr),
            broker_state(broker.state)
        );
        match &broker.root {
            Some(root) => {
                out.push('\n');
                answered += 1;
                restarts += restarts_total(root);
                let snapshot = TreeSnapshotResponse {
                    node_id: broker.node_id,
                    root: root.clone(),
                    brokers: Vec::new(),
                };
                out.push_str(&tree(&snapshot, Volatile(true)));
            }
            None => {
                let reason = broker.unreachable.as_deref().unwrap_or("no answer");
                let _ = writeln!(out, ": unreachable ({reason})");
            }
        }
    }
    let _ = writeln!(
        out,
        "{answered} of {} brokers answered; restarts in total: {restarts}",
        brokers.len()
    );
    out
}

/// Total restarts in the tree: what an operator checks first.
pub fn restarts_total(root: &SupervisorSnapshot) -> u64 {
    root.children
        .iter()
        .map(|c| u64::from(c.restarts) + c.supervisor.as_ref().map_or(0, restarts_total))
        .sum()
}

fn human_ms(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}s", ms / 1_000),
        60_000..3_600_000 => format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1_000),
        _ => format!("{}h{}m", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

fn opt<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "-".to_owned(), ToString::to_string)
}

fn dash(text: &str) -> &str {
    if text.is_empty() { "-" } else { text }
}

fn ids(list: &[u64]) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A topic's ranges and their segments.
pub fn describe(topic: &TopicDescription, volatile: Volatile) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "topic {} incarnation {} {}",
        topic.name, topic.incarnation, topic.state
    );
    if let Some(policy) = &topic.policy {
        let resolved = if topic.policy_resolved {
            ""
        } else {
            " (unresolved)"
        };
        let _ = write!(out, " policy {policy}{resolved}");
    }
    if volatile.0 {
        let _ = write!(out, " created_at_ms {}", topic.created_at_ms);
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<6} {:<20} {:<20} {:<7} {:<8} children",
        "range", "band_start", "band_end", "state", "parents"
    );
    for range in &topic.ranges {
        let _ = writeln!(
            out,
            "{:<6} {:<20} {:<20} {:<7} {:<8} {}",
            range.id,
            range.band_start,
            range.band_end,
            range.state,
            ids(&range.parents),
            ids(&range.children)
        );
        for segment in &range.segments {
            let _ = writeln!(
                out,
                "  segment {} start_offset {} replicas {} {} length {} bytes {} primary {} committed_end {}",
                segment.id,
                segment.start_offset,
                ids(&segment.replicas),
                segment.state,
                opt(&segment.length),
                opt(&segment.bytes),
                opt(&segment.primary),
                segment
                    .committed_end
                    .map_or_else(|| "unknown".to_owned(), |end| end.to_string()),
            );
            // A sealed segment's committed end is its seal's length (ADR
            // 0098); its copies are listed only when one of them is not
            // intact (short, over, damaged, missing, healing,
            // unreachable), so a long chain of healthy segments stays one
            // line each.
            let healthy = |status: &str| status == "sealed" || status == "intact";
            let listed =
                segment.state != "sealed" || segment.copies.iter().any(|c| !healthy(&c.status));
            for copy in segment
                .copies
                .iter()
                .filter(|c| listed && c.status != "sealed")
            {
                let _ = writeln!(
                    out,
                    "    copy {} {} durable_end {}",
                    copy.node,
                    copy.status,
                    copy.durable_end
                        .map_or_else(|| "unknown".to_owned(), |end| end.to_string()),
                );
            }
        }
    }
    if let Some(reshaping) = &topic.reshaping {
        reshaping_lines(&mut out, reshaping, volatile);
    }
    out
}

/// The write rates of the ranges the answering broker writes, and the
/// automatic reshapes it asked for (ADR 0143). Rates are volatile: shown
/// only with the volatile figures.
fn reshaping_lines(out: &mut String, reshaping: &TopicReshaping, volatile: Volatile) {
    for rate in &reshaping.rates {
        let hot = if rate.hot_key_unsplittable {
            "  hot_key_unsplittable"
        } else {
            ""
        };
        if volatile.0 {
            let share = rate
                .hot_key_share_permille
                .map_or_else(|| "-".to_owned(), |p| format!("{}.{}%", p / 10, p % 10));
            let _ = writeln!(
                out,
                "rate range {} primary {} bytes_per_second {} records_per_second {} hot_key_share {share}{hot}",
                rate.range,
                rate.primary,
                rate.write_bytes_per_second,
                rate.write_records_per_second,
            );
        } else if rate.hot_key_unsplittable {
            let _ = writeln!(
                out,
                "range {} not split: one key carries most of its writes",
                rate.range
            );
        }
    }
    for event in &reshaping.history {
        let at = if volatile.0 {
            format!("at_ms {} ", event.at_ms)
        } else {
            String::new()
        };
        let outcome = match &event.refused {
            Some(why) => format!("refused: {why}"),
            None => format!("-> {}", ids(&event.children)),
        };
        let _ = writeln!(
            out,
            "reshape {at}{} {} ({}) {outcome}",
            event.kind,
            ids(&event.ranges),
            event.reason
        );
    }
}

/// The topic list, one line per topic after a header.
pub fn topic_list(topics: &[TopicListing]) -> String {
    let mut out = format!(
        "{:<32} {:<11} {:<7} {}\n",
        "name", "incarnation", "state", "ranges_active"
    );
    for t in topics {
        let _ = writeln!(
            out,
            "{:<32} {:<11} {:<7} {}",
            t.name, t.incarnation, t.state, t.ranges_active
        );
    }
    out
}

/// The brokers of the cluster, as the answering broker sees them.
/// The cluster's members: each broker's state and how many vnode groups
/// list it, then whether replicas are still moving (ADR 0104).
pub fn cluster_members(members: &malachi_wire::messages::ClusterMembersResponse) -> String {
    use malachi_wire::messages::MemberState;
    let mut out = format!(
        "answered by node {} at ring version {}\n",
        members.node_id, members.ring_version
    );
    let _ = writeln!(
        out,
        "{:<6} {:<15} {:<15} vnode_learners",
        "node", "state", "vnode_replicas"
    );
    for m in &members.members {
        let state = match m.state {
            MemberState::Active => "active",
            MemberState::Decommissioned => "decommissioned",
        };
        let _ = writeln!(
            out,
            "{:<6} {:<15} {:<15} {}",
            m.node_id, state, m.vnode_replicas, m.vnode_learners
        );
    }
    let _ = writeln!(
        out,
        "{} groups, {} moving, {} unreachable",
        members.groups, members.groups_moving, members.groups_unreachable
    );
    out
}

pub fn cluster_status(status: &ClusterStatusResponse) -> String {
    let mut out = format!("answered by node {}\n", status.node_id);
    let _ = writeln!(
        out,
        "{:<6} {:<8} {:<12} {:<22} {:<22} {:<22} {:<16} {:>9} {:>12} attributes",
        "node",
        "state",
        "cluster_port",
        "client_addr",
        "admin_addr",
        "raft_addr",
        "vnodes_led",
        "primaries",
        "write_B/s"
    );
    for b in &status.brokers {
        // The gossiped load (ADR 0144) gets its own columns.
        let load = b
            .attributes
            .get(malachi_core::load::LOAD_ATTRIBUTE)
            .and_then(|text| malachi_core::load::BrokerLoad::from_attribute(text).ok());
        let (primaries, write) = match load {
            Some(load) => (
                load.primaries.to_string(),
                load.write_bytes_per_second.to_string(),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let shown: Vec<String> = b
            .attributes
            .iter()
            .filter(|(k, _)| k.as_str() != malachi_core::load::LOAD_ATTRIBUTE)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let attrs = if shown.is_empty() {
            "-".to_owned()
        } else {
            shown.join(",")
        };
        let vnodes = if b.vnodes_led.is_empty() {
            "-".to_owned()
        } else if b.vnodes_led.len() > 8 {
            format!("{} vnodes", b.vnodes_led.len())
        } else {
            b.vnodes_led
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            out,
            "{:<6} {:<8} {:<12} {:<22} {:<22} {:<22} {:<16} {:>9} {:>12} {}",
            b.node_id,
            broker_state(b.state),
            dash(&b.cluster_port),
            dash(&b.client_addr),
            dash(&b.admin_addr),
            dash(&b.raft_addr),
            vnodes,
            primaries,
            write,
            attrs
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_wire::messages::{
        BrokerStatus, BrokerTree, CopyDescription, RangeDescription, RangeRate, ReshapeEvent,
        SegmentDescription,
    };

    fn sample_tree() -> TreeSnapshotResponse {
        let segment = ChildSnapshot {
            name: "segment/orders/0/0".into(),
            actor_id: Some("0.12".into()),
            kind: ChildKind::Worker,
            restart: Restart::Transient,
            status: ChildStatus::Running,
            restarts: 1,
            last_exit_reason: Some("panicked: injected".into()),
            uptime_ms: 1_500,
            supervisor: None,
        };
        TreeSnapshotResponse {
            node_id: 1,
            root: SupervisorSnapshot {
                name: "broker".into(),
                actor_id: "0.1".into(),
                strategy: SupervisionStrategy::OneForOne,
                uptime_ms: 65_000,
                children: vec![
                    ChildSnapshot {
                        name: "storage".into(),
                        actor_id: Some("0.2".into()),
                        kind: ChildKind::Supervisor,
                        status: ChildStatus::Running,
                        uptime_ms: 65_000,
                        supervisor: Some(SupervisorSnapshot {
                            name: "storage".into(),
                            actor_id: "0.2".into(),
                            strategy: SupervisionStrategy::OneForOne,
                            uptime_ms: 65_000,
                            children: vec![segment],
                        }),
                        ..ChildSnapshot::default()
                    },
                    ChildSnapshot {
                        name: "listener".into(),
                        actor_id: Some("0.3".into()),
                        status: ChildStatus::Running,
                        uptime_ms: 65_000,
                        ..ChildSnapshot::default()
                    },
                ],
            },
            brokers: Vec::new(),
        }
    }

    #[test]
    fn the_tree_renders_nesting_restarts_and_exit_reasons() {
        insta::assert_snapshot!(tree(&sample_tree(), Volatile(false)));
    }

    #[test]
    fn the_full_tree_adds_ids_and_uptimes() {
        insta::assert_snapshot!(tree(&sample_tree(), Volatile(true)));
    }

    #[test]
    fn restarts_are_summed_through_nested_supervisors() {
        assert_eq!(restarts_total(&sample_tree().root), 1);
    }

    #[test]
    fn a_description_lists_ranges_and_their_segments() {
        let topic = TopicDescription {
            name: "orders".into(),
            incarnation: 1,
            state: "active".into(),
            policy: Some("default".into()),
            policy_resolved: true,
            created_at_ms: 1_700_000_000_000,
            ranges: vec![
                RangeDescription {
                    id: 0,
                    band_start: "0x0000000000000000".into(),
                    band_end: "0x10000000000000000".into(),
                    state: "sealed".into(),
                    children: vec![1, 2],
                    segments: vec![SegmentDescription {
                        id: 0,
                        replicas: vec![1, 2, 3],
                        state: "sealed".into(),
                        length: Some(10),
                        bytes: Some(4096),
                        primary: Some(1),
                        committed_end: Some(10),
                        copies: [1, 2, 3]
                            .map(|node| CopyDescription {
                                node,
                                status: "sealed".into(),
                                durable_end: None,
                            })
                            .to_vec(),
                        ..SegmentDescription::default()
                    }],
                    ..RangeDescription::default()
                },
                RangeDescription {
                    id: 1,
                    band_start: "0x0000000000000000".into(),
                    band_end: "0x8000000000000000".into(),
                    state: "active".into(),
                    parents: vec![0],
                    segments: vec![SegmentDescription {
                        id: 1,
                        start_offset: 10,
                        replicas: vec![2, 3, 1],
                        state: "active".into(),
                        primary: Some(2),
                        committed_end: Some(14),
                        copies: vec![
                            CopyDescription {
                                node: 2,
                                status: "live".into(),
                                durable_end: Some(15),
                            },
                            CopyDescription {
                                node: 3,
                                status: "live".into(),
                                durable_end: Some(14),
                            },
                            CopyDescription {
                                node: 1,
                                status: "unreachable".into(),
                                durable_end: None,
                            },
                        ],
                        ..SegmentDescription::default()
                    }],
                    ..RangeDescription::default()
                },
            ],
            ..TopicDescription::default()
        };
        insta::assert_snapshot!(describe(&topic, Volatile(false)));
    }

    #[test]
    fn a_sealed_segments_damaged_or_missing_copy_shows_on_a_line_of_its_own() {
        let topic = TopicDescription {
            name: "orders".into(),
            state: "active".into(),
            created_at_ms: 1_700_000_000_000,
            ranges: vec![RangeDescription {
                id: 0,
                band_start: "0x0000000000000000".into(),
                band_end: "0x10000000000000000".into(),
                state: "active".into(),
                segments: vec![
                    SegmentDescription {
                        id: 0,
                        replicas: vec![1],
                        state: "sealed".into(),
                        length: Some(200),
                        bytes: Some(5993),
                        primary: Some(1),
                        committed_end: Some(200),
                        copies: vec![CopyDescription {
                            node: 1,
                            status: "damaged".into(),
                            durable_end: Some(93),
                        }],
                        ..SegmentDescription::default()
                    },
                    SegmentDescription {
                        id: 2,
                        start_offset: 200,
                        replicas: vec![1],
                        state: "sealed".into(),
                        length: Some(30),
                        bytes: Some(900),
                        primary: Some(1),
                        committed_end: Some(30),
                        copies: vec![CopyDescription {
                            node: 1,
                            status: "missing".into(),
                            durable_end: None,
                        }],
                        ..SegmentDescription::default()
                    },
                    SegmentDescription {
                        id: 3,
                        start_offset: 230,
                        replicas: vec![1],
                        state: "active".into(),
                        primary: Some(1),
                        committed_end: Some(3),
                        copies: vec![CopyDescription {
                            node: 1,
                            status: "live".into(),
                            durable_end: Some(3),
                        }],
                        ..SegmentDescription::default()
                    },
                ],
                ..RangeDescription::default()
            }],
            ..TopicDescription::default()
        };
        insta::assert_snapshot!(describe(&topic, Volatile(false)));
    }

    #[test]
    fn a_sealed_segment_lists_its_copies_only_when_one_is_not_intact() {
        let copy = |node: u64, status: &str, end: u64| CopyDescription {
            node,
            status: status.into(),
            durable_end: Some(end),
        };
        let sealed = |id: u64, start: u64, copies: Vec<CopyDescription>| SegmentDescription {
            id,
            start_offset: start,
            replicas: vec![1, 2, 3],
            state: "sealed".into(),
            length: Some(900),
            bytes: Some(57_600),
            primary: Some(1),
            committed_end: Some(900),
            copies,
            ..SegmentDescription::default()
        };
        let topic = TopicDescription {
            name: "orders".into(),
            state: "active".into(),
            created_at_ms: 1_700_000_000_000,
            ranges: vec![RangeDescription {
                id: 0,
                band_start: "0x0000000000000000".into(),
                band_end: "0x10000000000000000".into(),
                state: "active".into(),
                segments: vec![
                    sealed(
                        0,
                        0,
                        vec![
                            copy(1, "intact", 900),
                            copy(2, "intact", 900),
                            copy(3, "intact", 900),
                        ],
                    ),
                    sealed(
                        4,
                        900,
                        vec![
                            copy(1, "intact", 900),
                            copy(2, "healing", 512),
                            copy(3, "over", 950),
                        ],
                    ),
                ],
                ..RangeDescription::default()
            }],
            ..TopicDescription::default()
        };
        insta::assert_snapshot!(describe(&topic, Volatile(false)));
    }

    #[test]
    fn a_description_shows_write_rates_hot_keys_and_automatic_reshapes() {
        let topic = TopicDescription {
            name: "orders".into(),
            state: "active".into(),
            ranges: vec![RangeDescription {
                id: 2,
                band_start: "0x0000000000000000".into(),
                band_end: "0x8000000000000000".into(),
                state: "active".into(),
                parents: vec![0],
                ..RangeDescription::default()
            }],
            reshaping: Some(TopicReshaping {
                rates: vec![RangeRate {
                    range: 2,
                    primary: 1,
                    write_bytes_per_second: 5_242_880,
                    write_records_per_second: 5_120,
                    hot_key_share_permille: Some(934),
                    hot_key_unsplittable: true,
                }],
                history: vec![
                    ReshapeEvent {
                        at_ms: 1_700_000_000_000,
                        kind: "split".into(),
                        reason: "write_rate_high".into(),
                        ranges: vec![0],
                        children: vec![1, 2],
                        refused: None,
                    },
                    ReshapeEvent {
                        at_ms: 1_700_000_060_000,
                        kind: "hot_key".into(),
                        reason: "write_rate_high".into(),
                        ranges: vec![2],
                        children: Vec::new(),
                        refused: Some("one key carries 934\u{2030} of its bytes".into()),
                    },
                ],
            }),
            ..TopicDescription::default()
        };
        insta::assert_snapshot!("reshaping_stable", describe(&topic, Volatile(false)));
        insta::assert_snapshot!("reshaping_volatile", describe(&topic, Volatile(true)));
    }

    #[test]
    fn the_cluster_status_shows_each_broker_on_a_line() {
        let status = ClusterStatusResponse {
            node_id: 1,
            brokers: vec![BrokerStatus {
                node_id: 1,
                state: BrokerState::Alive,
                client_addr: "127.0.0.1:4040".into(),
                raft_addr: "127.0.0.1:4050".into(),
                admin_addr: "127.0.0.1:8080".into(),
                attributes: [
                    ("zone".to_owned(), "a".to_owned()),
                    ("malachi.load".to_owned(), "p=4;w=1048576".to_owned()),
                ]
                .into(),
                vnodes_led: vec![0, 1, 2],
                cluster_port: "reachable".into(),
                ..BrokerStatus::default()
            }],
        };
        insta::assert_snapshot!(cluster_status(&status));
    }

    #[test]
    fn the_cluster_members_show_each_state_and_what_is_still_moving() {
        use malachi_wire::messages::{ClusterMembersResponse, MemberInfo, MemberState};
        let members = ClusterMembersResponse {
            node_id: 2,
            ring_version: 4,
            members: vec![
                MemberInfo {
                    node_id: 1,
                    state: MemberState::Decommissioned,
                    vnode_replicas: 3,
                    vnode_learners: 5,
                },
                MemberInfo {
                    node_id: 2,
                    state: MemberState::Active,
                    vnode_replicas: 17,
                    vnode_learners: 0,
                },
            ],
            groups: 17,
            groups_moving: 3,
            groups_unreachable: 0,
        };
        insta::assert_snapshot!(cluster_members(&members));
    }

    #[test]
    fn the_cluster_tree_shows_each_broker_and_why_one_is_missing() {
        let brokers = vec![
            BrokerTree {
                node_id: 1,
                state: BrokerState::Alive,
                client_addr: "127.0.0.1:4040".into(),
                root: Some(sample_tree().root),
                unreachable: None,
            },
            BrokerTree {
                node_id: 3,
                state: BrokerState::Dead,
                client_addr: "127.0.0.1:4042".into(),
                root: None,
                unreachable: Some("declared dead by membership".into()),
            },
        ];
        let text = tree_all(&brokers);
        assert!(
            text.contains("== node 1 127.0.0.1:4040 alive\nbroker one_for_one (node 1)"),
            "{text}"
        );
        assert!(
            text.contains(
                "== node 3 127.0.0.1:4042 dead: unreachable (declared dead by membership)"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("1 of 2 brokers answered; restarts in total: 1\n"),
            "{text}"
        );
    }

    #[test]
    fn uptimes_read_as_human_durations() {
        assert_eq!(human_ms(999), "999ms");
        assert_eq!(human_ms(65_000), "1m5s");
        assert_eq!(human_ms(3_660_000), "1h1m");
    }
}
