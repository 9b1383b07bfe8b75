//! What the broker needs of `VnodeHost` besides proposing and describing:
//! listing the topics of one vnode from its leader (a linearizable read,
//! forwarded like `describe`), and access to the transport the host routes
//! over.
//!
//! Listing travels on its own api key (212, `forward_list`), served by
//! `VnodeHost::serve_list`. The broker's raft service answers it and passes
//! every other key to `VnodeHost`'s own `RpcService`, so the forwarding
//! protocol of keys 210 and 211 is unchanged.

use super::{Forwarded, VnodeHost};
use crate::group::{GroupError, TcpTransport};
use crate::model::{MetadataState, TopicState};
use crate::ring::VnodeId;
use malachi_wire::error::ErrorCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// A request for the topics of one vnode, served by its leader.
pub const FORWARD_LIST_API_KEY: u16 = 212;

/// One topic as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSummary {
    pub name: String,
    pub incarnation: u64,
    pub sealed: bool,
    pub ranges_active: u32,
}

/// The topics of one state, in name order.
pub fn summarize(state: &MetadataState) -> Vec<TopicSummary> {
    state
        .topics()
        .map(|t| TopicSummary {
            name: t.name.clone(),
            incarnation: t.incarnation.0,
            sealed: matches!(t.state, TopicState::Sealed { .. }),
            ranges_active: state.active_ranges(&t.name).count() as u32,
        })
        .collect()
}

impl VnodeHost {
    /// The transport this host routes over (peer addresses are set on it).
    pub fn transport(&self) -> &Arc<TcpTransport> {
        &self.transport
    }

    /// This broker's node id.
    pub fn node_id(&self) -> u64 {
        self.config.node_id
    }

    /// Every broker of the cluster, as configured.
    pub fn nodes(&self) -> &[u64] {
        &self.config.nodes
    }

    /// A counter bumped whenever this host opens a group (a split's child,
    /// a vnode a newer ring added): whoever watches every hosted group
    /// (`registry().all()`) re-reads the registry when it changes.
    pub fn watch_groups_opened(&self) -> tokio::sync::watch::Receiver<u64> {
        self.groups_opened.subscribe()
    }

    /// A linearizable list of the topics `vnode` holds, from its leader,
    /// wherever it is: local when this broker leads, else forwarded. Leader
    /// changes are followed like `propose` follows them.
    pub async fn list_vnode(&self, vnode: VnodeId) -> Result<Vec<TopicSummary>, super::RouteError> {
        let voters = self.voters(vnode);
        let mut target = self
            .group(vnode)
            .and_then(|g| g.status().leader)
            .unwrap_or(voters[0]);
        let mut next_voter = 0usize;
        let mut last = String::from("no attempt");
        let mut backoff = self.route_backoff(vnode.group_id());
        for attempt in 1..=self.config.route_attempts_max {
            let answer: Forwarded<Vec<TopicSummary>> = if target == self.config.node_id {
                match self.serve_list(vnode.group_id()).await {
                    Ok(bytes) => {
                        rmp_serde::from_slice(&bytes).unwrap_or_else(|e| Forwarded::Failed {
                            reason: format!("undecodable local answer: {e}"),
                        })
                    }
                    Err((_, reason)) => Forwarded::Failed { reason },
                }
            } else {
                self.forward_to(
                    target,
                    FORWARD_LIST_API_KEY,
                    vnode.group_id(),
                    &[],
                    &mut last,
                )
                .await
            };
            match answer {
                Forwarded::Done(list) => return Ok(list),
                Forwarded::Failed { reason } => {
                    return Err(super::RouteError::Failed { vnode, reason });
                }
                Forwarded::NotLeader {
                    leader: Some(leader),
                } if leader != target => {
                    target = leader;
                    continue;
                }
                Forwarded::NotLeader { .. } => {}
                Forwarded::Retry { reason } => last = reason,
            }
            tracing::debug!(%vnode, attempt, target, %last, "topic list re-routed");
            target = voters[next_voter % voters.len()];
            next_voter += 1;
            tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
        }
        Err(super::RouteError::Unavailable {
            vnode,
            attempts: self.config.route_attempts_max,
            last,
        })
    }

    /// Serves a forwarded list on this broker's replica of `group_id`: the
    /// answer is `Forwarded<Vec<TopicSummary>>`, encoded.
    pub async fn serve_list(&self, group_id: u64) -> Result<Vec<u8>, (ErrorCode, String)> {
        let answer = match self.registry.get(group_id) {
            None => Forwarded::NotLeader { leader: None },
            Some(group) => match group.read(summarize).await {
                Ok(list) => Forwarded::Done(list),
                Err(GroupError::NotLeader { leader } | GroupError::Discarded { leader }) => {
                    Forwarded::NotLeader { leader }
                }
                Err(e @ (GroupError::Timeout | GroupError::Raft { .. } | GroupError::Stopped)) => {
                    Forwarded::Retry {
                        reason: e.to_string(),
                    }
                }
                Err(other) => Forwarded::Failed {
                    reason: other.to_string(),
                },
            },
        };
        rmp_serde::to_vec(&answer).map_err(|e| (ErrorCode::UnknownServerError, e.to_string()))
    }
}
