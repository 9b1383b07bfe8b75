//! Conversions from the other crates' types to the wire's mirror types.
//! The wire crate depends on neither supervision nor cluster, so the broker,
//! which sees both sides, fills the mirrors in.

use malachi_cluster::model;
use malachi_supervision as sup;
use malachi_wire::messages as wire;

fn strategy(s: sup::Strategy) -> wire::SupervisionStrategy {
    match s {
        sup::Strategy::OneForOne => wire::SupervisionStrategy::OneForOne,
        sup::Strategy::OneForAll => wire::SupervisionStrategy::OneForAll,
        sup::Strategy::RestForOne => wire::SupervisionStrategy::RestForOne,
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// The wire form of a supervision tree snapshot. Names and reasons longer
/// than the wire's limits are cut, so a snapshot always encodes.
pub fn tree_to_wire(snapshot: &sup::SupervisorSnapshot) -> wire::SupervisorSnapshot {
    use malachi_wire::limits::{MESSAGE_BYTES_MAX, NAME_BYTES_MAX};
    wire::SupervisorSnapshot {
        name: truncate(snapshot.name.clone(), NAME_BYTES_MAX),
        actor_id: truncate(snapshot.actor_id.clone(), NAME_BYTES_MAX),
        strategy: strategy(snapshot.strategy),
        uptime_ms: snapshot.uptime_ms,
        children: snapshot
            .children
            .iter()
            .map(|child| wire::ChildSnapshot {
                name: truncate(child.name.clone(), NAME_BYTES_MAX),
                actor_id: child
                    .actor_id
                    .clone()
                    .map(|id| truncate(id, NAME_BYTES_MAX)),
                kind: match child.kind {
                    sup::ChildKind::Worker => wire::ChildKind::Worker,
                    sup::ChildKind::Supervisor => wire::ChildKind::Supervisor,
                },
                restart: match child.restart {
                    sup::Restart::Permanent => wire::Restart::Permanent,
                    sup::Restart::Transient => wire::Restart::Transient,
                    sup::Restart::Temporary => wire::Restart::Temporary,
                },
                status: match child.status {
                    sup::ChildStatus::Running => wire::ChildStatus::Running,
                    sup::ChildStatus::Restarting => wire::ChildStatus::Restarting,
                    sup::ChildStatus::Stopped => wire::ChildStatus::Stopped,
                    sup::ChildStatus::Unresponsive => wire::ChildStatus::Unresponsive,
                },
                restarts: child.restarts,
                last_exit_reason: child
                    .last_exit_reason
                    .clone()
                    .map(|r| truncate(r, MESSAGE_BYTES_MAX)),
                uptime_ms: child.uptime_ms,
                supervisor: child.supervisor.as_ref().map(tree_to_wire),
            })
            .collect(),
    }
}

/// The wire form of a topic description.
pub fn describe_to_wire(d: &model::TopicDescription) -> wire::TopicDescription {
    wire::TopicDescription {
        name: d.name.clone(),
        incarnation: d.incarnation,
        state: d.state.clone(),
        sealed_at_ms: d.sealed_at_ms,
        policy: d.policy.clone(),
        policy_resolved: d.policy_resolved,
        created_at_ms: d.created_at_ms,
        ranges: d
            .ranges
            .iter()
            .map(|r| wire::RangeDescription {
                id: r.id,
                band_start: r.band_start.clone(),
                band_end: r.band_end.clone(),
                state: r.state.clone(),
                sealed_at_ms: r.sealed_at_ms,
                parents: r.parents.clone(),
                children: r.children.clone(),
                created_at_ms: r.created_at_ms,
                segments: r
                    .segments
                    .iter()
                    .map(|s| wire::SegmentDescription {
                        id: s.id,
                        start_offset: s.start_offset,
                        replicas: s.replicas.clone(),
                        state: s.state.clone(),
                        length: s.length,
                        bytes: s.bytes,
                        created_at_ms: s.created_at_ms,
                        sealed_at_ms: s.sealed_at_ms,
                    })
                    .collect(),
            })
            .collect(),
    }
}
