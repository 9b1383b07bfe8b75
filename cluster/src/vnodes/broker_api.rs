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
use crate::group::untrusted::UntrustedError;
use crate::group::{GroupError, RpcError, TcpTransport};
use malachi_core::model::{MetadataState, TopicState};
use malachi_core::ring::VnodeId;
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
        self.router.transport()
    }

    /// This broker's node id.
    pub fn node_id(&self) -> u64 {
        self.config.node_id
    }

    /// Every broker of the cluster (its members, decommissioned ones
    /// included, by the ring this broker holds), and this one.
    pub fn nodes(&self) -> Vec<u64> {
        let mut nodes: Vec<u64> = self.members().into_keys().collect();
        if !nodes.contains(&self.config.node_id) {
            nodes.push(self.config.node_id);
            nodes.sort_unstable();
        }
        nodes
    }

    /// A counter bumped whenever this host opens a group (a split's child,
    /// a vnode a newer ring added): whoever watches every hosted group
    /// (`registry().all()`) re-reads the registry when it changes.
    pub fn watch_groups_opened(&self) -> tokio::sync::watch::Receiver<u64> {
        self.groups.watch_opened()
    }

    /// A linearizable list of the topics `vnode` holds, from its leader,
    /// wherever it is: local when this broker leads, else forwarded. Leader
    /// changes are followed like `propose` follows them.
    pub async fn list_vnode(&self, vnode: VnodeId) -> Result<Vec<TopicSummary>, super::RouteError> {
        let voters = self.voters(vnode);
        let mut target = self
            .group(vnode)
            .and_then(|g| g.leader_term().0)
            .unwrap_or(voters[0]);
        let mut next_voter = 0usize;
        let mut last = String::from("no attempt");
        let mut backoff = self.route_backoff(vnode.group_id());
        let mut redirects = super::Redirects::default();
        for attempt in 1..=self.config.route_attempts_max {
            let mut pause_at = None;
            let answer: Forwarded<Vec<TopicSummary>> = if target == self.config.node_id {
                match self.serve_list(vnode.group_id()).await {
                    Ok(bytes) => {
                        rmp_serde::from_slice(&bytes).unwrap_or_else(|e| Forwarded::Failed {
                            reason: format!("undecodable local answer: {e}"),
                        })
                    }
                    Err(e) => Forwarded::Failed {
                        reason: e.to_string(),
                    },
                }
            } else {
                self.router
                    .forward_to(
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
                    last = format!("node {target} is not the leader; node {leader} is");
                    if redirects.fresh(target, leader) {
                        target = leader;
                        continue;
                    }
                    pause_at = Some(leader);
                }
                Forwarded::NotLeader { .. } => {}
                // A list is a read: an unknown outcome is just a retry.
                Forwarded::Retry { reason } | Forwarded::Unknown { reason, .. } => last = reason,
            }
            tracing::debug!(%vnode, attempt, target, %last, "topic list re-routed");
            target = pause_at.unwrap_or_else(|| {
                next_voter += 1;
                voters[(next_voter - 1) % voters.len()]
            });
            redirects.paused();
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
    pub async fn serve_list(&self, group_id: u64) -> Result<Vec<u8>, RpcError> {
        let answer = match self.groups.get(group_id) {
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
        rmp_serde::to_vec(&answer).map_err(|e| RpcError::Encode {
            what: "a topic list",
            source: Arc::new(e),
        })
    }
}

/// Decodes the body of a forwarded request (api keys 210 to 218) as
/// `VnodeHost` does when it serves one, and returns its canonical
/// re-encoding. For the fuzz bodies in `fuzz/bodies`; never panics.
pub fn decode_forwarded_request(api_key: u16, body: &[u8]) -> Result<Vec<u8>, UntrustedError> {
    use crate::group::{
        CLOSE_VNODE_API_KEY, FORWARD_PROPOSE_API_KEY, FORWARD_QUERY_API_KEY, FORWARD_READ_API_KEY,
        OPEN_VNODE_API_KEY, RING_ANNOUNCE_API_KEY,
    };
    match api_key {
        RING_ANNOUNCE_API_KEY => reencode::<super::RingAnnounce>(body),
        OPEN_VNODE_API_KEY => reencode::<super::OpenVnode>(body),
        CLOSE_VNODE_API_KEY => reencode::<super::CloseVnode>(body),
        FORWARD_PROPOSE_API_KEY => reencode::<malachi_core::model::Command>(body),
        FORWARD_READ_API_KEY => reencode::<super::ReadRequest>(body),
        FORWARD_QUERY_API_KEY => reencode::<super::Query>(body),
        // A list request has no body: the group id says everything.
        FORWARD_LIST_API_KEY => Ok(Vec::new()),
        api_key => Err(UntrustedError::NotForwarded { api_key }),
    }
}

/// Decodes a forwarded answer (api keys 210 to 218) as the router does, and
/// returns its canonical re-encoding. For the fuzz bodies; never panics.
pub fn decode_forwarded_answer(api_key: u16, body: &[u8]) -> Result<Vec<u8>, UntrustedError> {
    use crate::group::{
        CLOSE_VNODE_API_KEY, FORWARD_PROPOSE_API_KEY, FORWARD_QUERY_API_KEY, FORWARD_READ_API_KEY,
        OPEN_VNODE_API_KEY, RING_ANNOUNCE_API_KEY,
    };
    match api_key {
        RING_ANNOUNCE_API_KEY | OPEN_VNODE_API_KEY | CLOSE_VNODE_API_KEY => {
            reencode::<Forwarded<()>>(body)
        }
        FORWARD_PROPOSE_API_KEY => reencode::<Forwarded<super::Verdict>>(body),
        FORWARD_READ_API_KEY => reencode::<Forwarded<super::ReadAnswer>>(body),
        FORWARD_QUERY_API_KEY => {
            // The answer's type follows the query: both decoders run.
            let ring = reencode::<Forwarded<Option<malachi_core::model::RingRecord>>>(body);
            let seed = reencode::<Forwarded<malachi_core::model::VnodeSeed>>(body);
            let membership = reencode::<Forwarded<super::VnodeMembership>>(body);
            ring.or(seed).or(membership)
        }
        FORWARD_LIST_API_KEY => reencode::<Forwarded<Vec<TopicSummary>>>(body),
        api_key => Err(UntrustedError::NotForwarded { api_key }),
    }
}

fn reencode<T: Serialize + serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<Vec<u8>, UntrustedError> {
    let value: T = rmp_serde::from_slice(body)?;
    Ok(rmp_serde::to_vec(&value)?)
}

/// Valid forwarded request bodies, for fuzzers and property tests to mutate.
pub fn sample_forwarded_request(api_key: u16) -> Vec<u8> {
    use crate::group::{
        CLOSE_VNODE_API_KEY, FORWARD_PROPOSE_API_KEY, FORWARD_QUERY_API_KEY, FORWARD_READ_API_KEY,
        OPEN_VNODE_API_KEY, RING_ANNOUNCE_API_KEY,
    };
    let encoded = match api_key {
        RING_ANNOUNCE_API_KEY => rmp_serde::to_vec(&super::RingAnnounce { version: 7 }),
        OPEN_VNODE_API_KEY => rmp_serde::to_vec(&super::OpenVnode {
            vnode: VnodeId(3),
            voters: Some(vec![1, 2, 3]),
        }),
        CLOSE_VNODE_API_KEY => rmp_serde::to_vec(&super::CloseVnode {
            vnode: VnodeId(3),
            voters: vec![1, 2, 4],
        }),
        FORWARD_PROPOSE_API_KEY => rmp_serde::to_vec(&malachi_core::model::Command::DeleteTopic {
            topic: "orders".to_owned(),
        }),
        FORWARD_READ_API_KEY => rmp_serde::to_vec(&super::ReadRequest {
            topic: "orders".to_owned(),
        }),
        FORWARD_QUERY_API_KEY => rmp_serde::to_vec(&super::Query::Ring),
        _ => return Vec::new(),
    };
    encoded.unwrap_or_default()
}

/// Valid forwarded answers, for fuzzers and property tests to mutate.
pub fn sample_forwarded_answer(api_key: u16) -> Vec<u8> {
    let encoded = match api_key {
        FORWARD_LIST_API_KEY => rmp_serde::to_vec(&Forwarded::Done(vec![TopicSummary {
            name: "orders".to_owned(),
            incarnation: 1,
            sealed: false,
            ranges_active: 2,
        }])),
        _ => rmp_serde::to_vec(&Forwarded::<()>::NotLeader { leader: Some(2) }),
    };
    encoded.unwrap_or_default()
}

/// The api keys of the forwarding protocol, in order.
pub const FORWARDED_API_KEYS: [u16; 7] = [210, 211, 212, 214, 215, 216, 218];
