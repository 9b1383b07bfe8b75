//! Whether this broker serves a topic's records, and where to send a client
//! when it does not.
//!
//! A topic's active segments are written by their primary (the first of
//! each replica set), the broker its coordinator placed them on; followers
//! hold copies the primary ships. A produce, fetch or subscribe that
//! reaches another broker is answered
//! `not_leader` with `leader_hint` set to the hosting broker's client
//! address, which the client follows at once (the same mechanism a raft
//! leader change uses; ADR 0081). The metadata read first is the local
//! replica of the topic's vnode; a topic this broker's replica does not know
//! yet (created a moment ago through another broker, or a vnode this broker
//! holds no replica of) is looked up at the vnode's leader.

use std::sync::Arc;
use std::time::Duration;

use malachi_cluster::model::{NodeId, SegmentState, TopicDescription};
use malachi_wire::ErrorCode;

use crate::control::metadata::read_owner;
use crate::control::shared::Shared;

/// How long a broker that hosts a topic waits for its own replica to apply
/// the topic's creation before serving anyway (the normal path then answers).
const LOCAL_APPLY_WAIT_MS: u64 = 2_000;
/// The pause between two looks at the local replica while waiting for it.
const LOCAL_APPLY_POLL_MS: u64 = 5;

/// A refusal that names where the client should go (`serve` turns it into
/// the error response, `leader_hint` set to `hint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Redirect {
    pub code: ErrorCode,
    pub message: String,
    pub hint: Option<String>,
}

/// The primaries of the active segments of `topic` in `state`.
fn hosts_in_state(
    state: &malachi_cluster::model::MetadataState,
    topic: &str,
) -> Option<Vec<NodeId>> {
    state.topic(topic)?;
    let mut hosts: Vec<NodeId> = state
        .active_ranges(topic)
        .filter_map(|r| r.last_segment())
        .filter_map(|id| state.segment(id))
        .filter(|s| s.state == SegmentState::Active)
        .filter_map(|s| s.replicas.first().copied())
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    Some(hosts)
}

fn hosts_in_description(description: &TopicDescription) -> Vec<NodeId> {
    let mut hosts: Vec<NodeId> = description
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| r.segments.last())
        .filter_map(|s| s.replicas.first().copied().map(NodeId))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// The client address of broker `node`, as membership knows it.
fn client_addr_of(shared: &Shared, node: NodeId) -> Option<String> {
    let fabric = shared.fabric()?;
    let view = fabric.membership.view();
    view.all()
        .find(|m| m.node_id == node.0)
        .map(|m| m.client_addr.to_string())
}

fn redirect(shared: &Shared, topic: &str, hosts: &[NodeId]) -> Redirect {
    let host = hosts.first().copied();
    let hint = host.and_then(|h| client_addr_of(shared, h));
    Redirect {
        code: ErrorCode::NotLeader,
        message: match host {
            Some(host) => format!(
                "topic {topic} is served by broker {}, not broker {}",
                host.0, shared.config.node_id
            ),
            None => format!("topic {topic} has no active segment"),
        },
        hint,
    }
}

/// `Ok` if this broker serves `topic`'s records (or the topic does not
/// exist: the normal path answers `topic_not_found`), else where to go.
pub(crate) async fn serve_here(shared: &Arc<Shared>, topic: &str) -> Result<(), Redirect> {
    let me = NodeId(shared.config.node_id);
    let Ok(plane) = shared.plane() else {
        return Ok(());
    };
    let local = read_owner(plane.as_ref(), topic, |s| hosts_in_state(s, topic));
    let hosts = match local {
        Some(hosts) => hosts,
        None => {
            // A single-state plane's local read is the truth.
            if plane.host().is_none() {
                return Ok(());
            }
            let described = match plane.describe(topic).await {
                Ok(Some(described)) => described,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(Redirect {
                        code: e.error_code(),
                        message: e.to_string(),
                        hint: None,
                    });
                }
            };
            let hosts = hosts_in_description(&described);
            if hosts.contains(&me) {
                // Hosted here, and the local replica is behind the leader:
                // let it apply the creation before the data path reads it.
                let deadline =
                    tokio::time::Instant::now() + Duration::from_millis(LOCAL_APPLY_WAIT_MS);
                while tokio::time::Instant::now() < deadline
                    && read_owner(plane.as_ref(), topic, |s| s.topic(topic).is_none())
                {
                    tokio::time::sleep(Duration::from_millis(LOCAL_APPLY_POLL_MS)).await;
                }
                return Ok(());
            }
            hosts
        }
    };
    if hosts.is_empty() || hosts.contains(&me) {
        return Ok(());
    }
    Err(redirect(shared, topic, &hosts))
}
