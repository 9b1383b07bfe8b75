//! Conversions from the other crates' types to the wire's mirror types.
//! The wire crate depends on neither supervision nor cluster, so the broker,
//! which sees both sides, fills the mirrors in.

use malachi_core::model;
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
                        epoch: s.epoch,
                        // The live figures are the describing broker's to
                        // add (`control::replica_status`).
                        primary: s.replicas.first().copied(),
                        committed_end: None,
                        copies: Vec::new(),
                    })
                    .collect(),
            })
            .collect(),
        reshaping: None,
    }
}

/// The supervision crate's form of a wire tree snapshot, so a client can
/// print it with `malachi_supervision::render_tree`.
pub fn tree_from_wire(snapshot: &wire::SupervisorSnapshot) -> sup::SupervisorSnapshot {
    sup::SupervisorSnapshot {
        name: snapshot.name.clone(),
        actor_id: snapshot.actor_id.clone(),
        strategy: match snapshot.strategy {
            wire::SupervisionStrategy::OneForOne => sup::Strategy::OneForOne,
            wire::SupervisionStrategy::OneForAll => sup::Strategy::OneForAll,
            wire::SupervisionStrategy::RestForOne => sup::Strategy::RestForOne,
        },
        uptime_ms: snapshot.uptime_ms,
        children: snapshot
            .children
            .iter()
            .map(|child| sup::ChildSnapshot {
                name: child.name.clone(),
                actor_id: child.actor_id.clone(),
                kind: match child.kind {
                    wire::ChildKind::Worker => sup::ChildKind::Worker,
                    wire::ChildKind::Supervisor => sup::ChildKind::Supervisor,
                },
                restart: match child.restart {
                    wire::Restart::Permanent => sup::Restart::Permanent,
                    wire::Restart::Transient => sup::Restart::Transient,
                    wire::Restart::Temporary => sup::Restart::Temporary,
                },
                status: match child.status {
                    wire::ChildStatus::Running => sup::ChildStatus::Running,
                    wire::ChildStatus::Restarting => sup::ChildStatus::Restarting,
                    wire::ChildStatus::Stopped => sup::ChildStatus::Stopped,
                    wire::ChildStatus::Unresponsive => sup::ChildStatus::Unresponsive,
                },
                restarts: child.restarts,
                last_exit_reason: child.last_exit_reason.clone(),
                uptime_ms: child.uptime_ms,
                supervisor: child.supervisor.as_ref().map(tree_from_wire),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> sup::SupervisorSnapshot {
        let leaf = sup::ChildSnapshot {
            name: "segment/orders/0/3".into(),
            actor_id: Some("0.7".into()),
            kind: sup::ChildKind::Worker,
            restart: sup::Restart::Transient,
            status: sup::ChildStatus::Restarting,
            restarts: 2,
            last_exit_reason: Some("poisoned".into()),
            uptime_ms: 5,
            supervisor: None,
        };
        sup::SupervisorSnapshot {
            name: "broker".into(),
            actor_id: "0.1".into(),
            strategy: sup::Strategy::OneForOne,
            uptime_ms: 10,
            children: vec![sup::ChildSnapshot {
                name: "storage".into(),
                actor_id: Some("0.2".into()),
                kind: sup::ChildKind::Supervisor,
                restart: sup::Restart::Permanent,
                status: sup::ChildStatus::Running,
                restarts: 0,
                last_exit_reason: None,
                uptime_ms: 9,
                supervisor: Some(sup::SupervisorSnapshot {
                    name: "storage".into(),
                    actor_id: "0.2".into(),
                    strategy: sup::Strategy::RestForOne,
                    uptime_ms: 9,
                    children: vec![leaf],
                }),
            }],
        }
    }

    #[test]
    fn a_tree_survives_the_trip_to_the_wire_and_back() {
        let tree = sample();
        assert_eq!(tree_from_wire(&tree_to_wire(&tree)), tree);
    }

    #[test]
    fn an_overlong_exit_reason_is_cut_to_the_wire_limit_on_a_char_boundary() {
        let mut tree = sample();
        let storage = tree.children[0].supervisor.as_mut().unwrap();
        storage.children[0].last_exit_reason = Some("é".repeat(5_000));
        let wire = tree_to_wire(&tree);
        let reason = wire.children[0].supervisor.as_ref().unwrap().children[0]
            .last_exit_reason
            .clone()
            .unwrap();
        assert!(reason.len() <= malachi_wire::limits::MESSAGE_BYTES_MAX);
        assert!(reason.len() >= malachi_wire::limits::MESSAGE_BYTES_MAX - 1);
    }
}

/// A produced record as it arrived: its key, value and header values are
/// slices of the request's buffer (`Bytes`), so routing it and handing it to
/// the store copies nothing; the store frames it straight from that buffer.
#[derive(Debug, Clone)]
pub(crate) struct IncomingRecord {
    pub timestamp_ms: u64,
    pub key: bytes::Bytes,
    pub value: bytes::Bytes,
    pub headers: Vec<malachi_wire::batch::Header>,
}

impl IncomingRecord {
    /// Takes a decoded wire record, stamping `now_ms` where the producer set
    /// no timestamp.
    pub fn from_wire(record: malachi_wire::batch::Record, now_ms: u64) -> IncomingRecord {
        IncomingRecord {
            timestamp_ms: record.timestamp_ms.unwrap_or(now_ms),
            key: record.key,
            value: record.value,
            headers: record.headers,
        }
    }
}

impl malachi_storage::RecordParts for IncomingRecord {
    fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    fn key(&self) -> &[u8] {
        &self.key
    }
    fn value(&self) -> &[u8] {
        &self.value
    }
    fn header_count(&self) -> usize {
        self.headers.len()
    }
    fn header(&self, i: usize) -> (&str, &[u8]) {
        let header = &self.headers[i];
        (&header.name, &header.value)
    }
}
