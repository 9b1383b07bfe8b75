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

use malachi_core::model::{NodeId, RangeId, SegmentState, TopicDescription};
use malachi_wire::ErrorCode;

use crate::common::error::MetadataError;
use crate::control::metadata::{MetadataPlane, read_owner};
use crate::control::registry::ActorRegistry;
use crate::control::shared::{ClusterLinks, Shared};

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

/// What placement decisions read: who this broker is, the metadata plane
/// (through the registry: it may reopen) and membership. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct PlacementView {
    pub me: NodeId,
    pub actors: Arc<ActorRegistry>,
    pub links: Arc<ClusterLinks>,
}

impl PlacementView {
    pub fn of(shared: &Shared) -> PlacementView {
        PlacementView {
            me: NodeId(shared.config.node_id),
            actors: Arc::clone(&shared.actors),
            links: Arc::clone(&shared.links),
        }
    }

    pub fn plane(&self) -> Result<Arc<dyn MetadataPlane>, MetadataError> {
        self.actors.plane()
    }

    /// Whether membership calls broker `node` dead.
    pub fn is_dead(&self, node: NodeId) -> bool {
        self.links.is_dead(self.me, node)
    }
}

/// Who can serve a topic's records: the primary of each active segment
/// (`hosts`, where writes go) and the copies of every active segment
/// (`readers`: brokers holding a copy of each one, which can serve reads
/// of committed records while no primary is alive).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Servers {
    pub hosts: Vec<NodeId>,
    pub readers: Vec<NodeId>,
}

/// What a request does with a topic's records, which decides who serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serve {
    /// Produce, and the splits and merges that freeze active segments: the
    /// primary only.
    Write,
    /// Fetch and subscribe: the primary, or, while no primary is alive, a
    /// broker holding a copy of every active segment (readers of a
    /// replicated copy see only committed records, so nothing they read can
    /// be un-written by a failover).
    Read,
}

fn servers_of<'a>(active: impl Iterator<Item = &'a [NodeId]>) -> Servers {
    let mut hosts: Vec<NodeId> = Vec::new();
    let mut readers: Option<Vec<NodeId>> = None;
    for replicas in active {
        hosts.extend(replicas.first().copied());
        readers = Some(match readers {
            None => replicas.to_vec(),
            Some(held) => held.into_iter().filter(|n| replicas.contains(n)).collect(),
        });
    }
    hosts.sort_unstable();
    hosts.dedup();
    let mut readers = readers.unwrap_or_default();
    readers.sort_unstable();
    readers.dedup();
    Servers { hosts, readers }
}

/// The servers of `topic`'s active segments in `state`.
fn servers_in_state(state: &malachi_core::model::MetadataState, topic: &str) -> Option<Servers> {
    state.topic(topic)?;
    let segments: Vec<&[NodeId]> = state
        .active_ranges(topic)
        .filter_map(|r| r.last_segment())
        .filter_map(|id| state.segment(id))
        .filter(|s| s.state == SegmentState::Active)
        .map(|s| s.replicas.as_slice())
        .collect();
    Some(servers_of(segments.into_iter()))
}

fn servers_in_description(description: &TopicDescription) -> Servers {
    let segments: Vec<Vec<NodeId>> = description
        .ranges
        .iter()
        .filter(|r| r.state == "active")
        .filter_map(|r| r.segments.last())
        .map(|s| s.replicas.iter().copied().map(NodeId).collect())
        .collect();
    servers_of(segments.iter().map(Vec::as_slice))
}

/// The client address of broker `node`, as membership knows it.
fn client_addr_of(view: &PlacementView, node: NodeId) -> Option<String> {
    let fabric = view.links.fabric.get()?;
    let view = fabric.membership.view();
    view.all()
        .find(|m| m.node_id == node.0)
        .map(|m| m.client_addr.to_string())
}

/// Whether membership calls broker `node` dead. A broker membership does
/// not know (a lone broker, or one not heard of yet) is not dead.
pub(crate) fn is_dead(shared: &Shared, node: NodeId) -> bool {
    shared.links.is_dead(NodeId(shared.config.node_id), node)
}

/// Where a client of `topic` should go, or what to wait for: the first
/// live host, else (for a read) the first live reader, never a broker
/// membership calls dead. With none live, `not_leader` without a hint and
/// with a pause: the client retries until a failover or a return.
fn decide(
    view: &PlacementView,
    topic: &str,
    servers: &Servers,
    serve: Serve,
) -> Result<(), Redirect> {
    let me = view.me;
    if servers.hosts.is_empty() || servers.hosts.contains(&me) {
        return Ok(());
    }
    let live_host = servers.hosts.iter().copied().find(|h| !view.is_dead(*h));
    let target = match (live_host, serve) {
        (Some(host), _) => Some(host),
        (None, Serve::Write) => None,
        (None, Serve::Read) => {
            if servers.readers.contains(&me) {
                return Ok(());
            }
            servers.readers.iter().copied().find(|r| !view.is_dead(*r))
        }
    };
    let hint = target.and_then(|t| client_addr_of(view, t));
    let message = match target {
        Some(target) => format!(
            "topic {topic} is served by broker {}, not broker {}",
            target.0, me.0
        ),
        None => format!(
            "topic {topic} is served by broker {:?}, which membership calls dead; retry once it returns or fails over",
            servers.hosts.iter().map(|h| h.0).collect::<Vec<_>>()
        ),
    };
    // Without a hint the error body asks the client to wait before it
    // retries (`retry_after_ms`), so it does not spin on a dead primary.
    Err(Redirect {
        code: ErrorCode::NotLeader,
        message,
        hint,
    })
}

/// The refusal of a part of `range` of `topic` that `primary`, another
/// broker, writes: `not_leader` naming it, or, while membership calls it
/// dead or does not know its address, naming nobody (the client waits for
/// its return or a failover).
pub(crate) fn range_redirect(
    view: &PlacementView,
    topic: &str,
    range: RangeId,
    primary: NodeId,
) -> Redirect {
    assert_ne!(primary, view.me, "a redirect names another broker");
    let hint = (!view.is_dead(primary))
        .then(|| client_addr_of(view, primary))
        .flatten();
    Redirect {
        code: ErrorCode::NotLeader,
        message: format!(
            "range {} of topic {topic} is written by broker {}, not broker {}",
            range.0, primary.0, view.me.0
        ),
        hint,
    }
}

/// Where writes of `topic` go now, if this broker's replica of the
/// metadata says another broker is their primary and membership knows its
/// address: for a primary whose append found no quorum because its segment
/// was failed over meanwhile, so the client goes to the new primary at
/// once instead of retrying a deposed one (ADR 0126). Local metadata only:
/// no wait.
pub(crate) fn moved_primary(view: &PlacementView, topic: &str) -> Option<Redirect> {
    let plane = view.plane().ok()?;
    let servers = read_owner(plane.as_ref(), topic, |s| servers_in_state(s, topic))?;
    decide(view, topic, &servers, Serve::Write)
        .err()
        .filter(|redirect| redirect.hint.is_some())
}

/// `Ok` if this broker serves `topic`'s records for `serve` (or the topic
/// does not exist: the normal path answers `topic_not_found`), else where
/// to go.
pub(crate) async fn serve_here(
    view: &PlacementView,
    topic: &str,
    serve: Serve,
) -> Result<(), Redirect> {
    let me = view.me;
    let Ok(plane) = view.plane() else {
        return Ok(());
    };
    let local = read_owner(plane.as_ref(), topic, |s| servers_in_state(s, topic));
    let servers = match local {
        Some(servers) => servers,
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
            let servers = servers_in_description(&described);
            if servers.hosts.contains(&me) || servers.readers.contains(&me) {
                // Hosted here, and the local replica is behind the leader:
                // let it apply the creation before the data path reads it.
                let deadline =
                    tokio::time::Instant::now() + Duration::from_millis(LOCAL_APPLY_WAIT_MS);
                while tokio::time::Instant::now() < deadline
                    && read_owner(plane.as_ref(), topic, |s| s.topic(topic).is_none())
                {
                    tokio::time::sleep(Duration::from_millis(LOCAL_APPLY_POLL_MS)).await;
                }
            }
            servers
        }
    };
    decide(view, topic, &servers, serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(ids: &[u64]) -> Vec<NodeId> {
        ids.iter().copied().map(NodeId).collect()
    }

    #[test]
    fn hosts_are_the_primaries_and_readers_hold_a_copy_of_every_active_segment() {
        let a = n(&[1, 2, 3]);
        let b = n(&[2, 3, 4]);
        let servers = servers_of([a.as_slice(), b.as_slice()].into_iter());
        assert_eq!(servers.hosts, n(&[1, 2]));
        assert_eq!(servers.readers, n(&[2, 3]));
        let none = servers_of(std::iter::empty());
        assert!(none.hosts.is_empty() && none.readers.is_empty());
    }
}
