//! The vnodes a broker hosts and the router that lets any broker answer a
//! metadata request.
//!
//! Every vnode of the ring is a `MetadataGroup` replicated on
//! `replicas_per_vnode` brokers (all of them when there are fewer). Which
//! brokers is a pure function of the vnode id and the broker ids
//! (`voters_for`, rendezvous hashing), so every broker computes the same
//! voter sets from the same configuration and may initialize its replicas
//! without talking to anyone (openraft allows identical initial memberships
//! on every voter). Raft membership, not this function, is the authority
//! once a group exists: a later change moves replicas by membership changes.
//!
//! `VnodeHost::propose` and `VnodeHost::describe` route by topic: the ring
//! names the vnode; the request runs on this broker if it leads that vnode,
//! and is otherwise forwarded over the raft transport to the leader it
//! knows of (api keys 210 and 211). A `NotLeader` answer moves the request
//! to the hinted leader; a `WrongVnode` refusal (this broker routed by a
//! stale ring) re-reads the current ring and routes again. Each attempt is
//! bounded, and so is the number of attempts.
//!
//! Arc enforcement: before a vnode's first topic command, its leader
//! records the vnode's arc in the group (`Command::AssignArc`), so from then
//! on the group itself refuses topics outside it.

mod manager;

pub use manager::{CoordinatorPlan, plan_coordinators};

use crate::group::{
    FORWARD_PROPOSE_API_KEY, FORWARD_READ_API_KEY, GroupConfig, GroupError, GroupRegistry,
    MetadataGroup, RpcService, TcpTransport, TransportError,
};
use crate::model::{Command, ModelError, Outcome, TopicDescription};
use crate::ring::{Ring, VnodeEntry, VnodeId};
use bytes::Bytes;
use malachi_wire::error::ErrorCode;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How many brokers replicate each vnode unless configured otherwise.
pub const REPLICAS_PER_VNODE_DEFAULT: usize = 3;

/// The voters of `vnode` among `nodes`: the `replicas` nodes with the
/// highest `xxh3(vnode, node)` score (rendezvous hashing), in ascending id
/// order. Deterministic, and adding or removing one broker moves only the
/// vnodes that broker gains or loses.
pub fn voters_for(vnode: VnodeId, nodes: &[u64], replicas: usize) -> Vec<u64> {
    let mut scored: Vec<(u64, u64)> = nodes
        .iter()
        .map(|node| {
            let mut key = [0u8; 12];
            key[..4].copy_from_slice(&vnode.0.to_be_bytes());
            key[4..].copy_from_slice(&node.to_be_bytes());
            (xxhash_rust::xxh3::xxh3_64(&key), *node)
        })
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.dedup_by_key(|(_, node)| *node);
    let mut voters: Vec<u64> = scored
        .into_iter()
        .take(replicas.max(1))
        .map(|(_, n)| n)
        .collect();
    voters.sort_unstable();
    voters
}

/// How a broker hosts its vnodes.
#[derive(Debug, Clone)]
pub struct VnodeHostConfig {
    /// This broker's node id.
    pub node_id: u64,
    /// Every broker's node id, this one included.
    pub nodes: Vec<u64>,
    /// Each vnode's group lives in `<data_dir>/vnode-<id>`.
    pub data_dir: PathBuf,
    /// The vnode count of the ring.
    pub vnode_count: u32,
    /// Brokers per vnode group (all brokers when there are fewer).
    pub replicas_per_vnode: usize,
    /// The tunables every group is opened with (`group_id`, `node_id` and
    /// `dir` are replaced per vnode).
    pub group: GroupConfig,
    /// How long one forwarded request may take.
    pub forward_timeout_ms: u64,
    /// How many times a request is re-routed (leader changes, stale ring)
    /// before the router gives up with `RouteError::Unavailable`.
    pub route_attempts_max: u32,
    /// The pause before re-routing a request that found no leader.
    pub route_retry_backoff_ms: u64,
}

impl VnodeHostConfig {
    pub fn new(node_id: u64, nodes: Vec<u64>, data_dir: impl Into<PathBuf>) -> VnodeHostConfig {
        let data_dir = data_dir.into();
        VnodeHostConfig {
            node_id,
            nodes,
            group: GroupConfig::new(0, node_id, data_dir.clone()),
            data_dir,
            vnode_count: crate::ring::VNODES_DEFAULT,
            replicas_per_vnode: REPLICAS_PER_VNODE_DEFAULT,
            forward_timeout_ms: 5_000,
            route_attempts_max: 50,
            route_retry_backoff_ms: 50,
        }
    }
}

/// Why a routed metadata request failed. The model's own refusals are not
/// here: they are the inner `Err` of a successful route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The command names no topic, so no vnode owns it.
    #[error("the command names no topic and cannot be routed")]
    Unroutable,
    /// No leader answered within the attempts allowed.
    #[error("vnode {vnode} has no reachable leader after {attempts} attempts: {last}")]
    Unavailable {
        vnode: VnodeId,
        attempts: u32,
        last: String,
    },
    /// The group failed in a way a retry cannot fix.
    #[error("vnode {vnode}: {reason}")]
    Failed { vnode: VnodeId, reason: String },
    /// This host is shut down.
    #[error("the vnode host is shut down")]
    Stopped,
}

/// The answer to a forwarded request, as it travels back.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Forwarded<T> {
    Done(T),
    /// This broker does not lead the vnode; it names the leader it knows.
    NotLeader {
        leader: Option<u64>,
    },
    /// The request's outcome is unknown (a timeout or a discarded entry) or
    /// the group cannot serve; the router may retry.
    Retry {
        reason: String,
    },
    /// The group failed for good.
    Failed {
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct ReadRequest {
    topic: String,
}

type Verdict = Result<Outcome, ModelError>;

/// The vnode replicas one broker hosts, and its router.
#[derive(Debug)]
pub struct VnodeHost {
    config: VnodeHostConfig,
    /// The ring this broker believes current.
    ring: RwLock<Arc<Ring>>,
    /// The ring requests are routed by; replaced by `ring` on `WrongVnode`.
    /// Only tests set it apart from `ring`, to play a broker with a stale ring.
    routing_ring: RwLock<Arc<Ring>>,
    registry: Arc<GroupRegistry>,
    transport: Arc<TcpTransport>,
}

impl VnodeHost {
    /// Opens (or recovers) the replica of every vnode whose voters include
    /// this broker and initializes the membership of fresh ones. Returns
    /// without waiting for elections.
    pub async fn open(
        config: VnodeHostConfig,
        transport: Arc<TcpTransport>,
    ) -> Result<Arc<VnodeHost>, GroupError> {
        if !config.nodes.contains(&config.node_id) {
            return Err(GroupError::Config {
                reason: format!(
                    "node {} is not among the cluster's nodes {:?}",
                    config.node_id, config.nodes
                ),
            });
        }
        let ring = Ring::new(config.vnode_count).map_err(|e| GroupError::Config {
            reason: e.to_string(),
        })?;
        let ring = Arc::new(ring);
        let registry = Arc::new(GroupRegistry::new());
        let host = Arc::new(VnodeHost {
            ring: RwLock::new(Arc::clone(&ring)),
            routing_ring: RwLock::new(ring),
            registry,
            transport,
            config,
        });
        let vnodes: Vec<VnodeEntry> = host.ring.read().vnodes().copied().collect();
        for vnode in vnodes {
            let voters = host.voters(vnode.id);
            if !voters.contains(&host.config.node_id) {
                continue;
            }
            let mut group_config = host.config.group.clone();
            group_config.group_id = vnode.id.group_id();
            group_config.node_id = host.config.node_id;
            group_config.dir = host.config.data_dir.join(format!("vnode-{}", vnode.id.0));
            let opened = async {
                let group = MetadataGroup::open(group_config, host.transport.clone()).await?;
                host.registry.insert(group.clone());
                group.initialize(&voters).await
            };
            if let Err(e) = opened.await {
                host.shutdown().await;
                return Err(e);
            }
        }
        tracing::info!(
            node = host.config.node_id,
            vnodes = host.registry.all().len(),
            "vnode replicas open"
        );
        Ok(host)
    }

    /// The voters of a vnode under this host's configuration.
    pub fn voters(&self, vnode: VnodeId) -> Vec<u64> {
        voters_for(vnode, &self.config.nodes, self.config.replicas_per_vnode)
    }

    /// The ring this broker believes current.
    pub fn ring(&self) -> Arc<Ring> {
        Arc::clone(&self.ring.read())
    }

    /// Routes by `ring` until a `WrongVnode` refusal makes the router re-read
    /// the current ring. For tests of a broker whose ring lags.
    pub fn set_routing_ring(&self, ring: Ring) {
        *self.routing_ring.write() = Arc::new(ring);
    }

    /// The groups this broker hosts (for raft rpcs and status).
    pub fn registry(&self) -> &Arc<GroupRegistry> {
        &self.registry
    }

    /// This broker's replica of `vnode`, if it hosts one.
    pub fn group(&self, vnode: VnodeId) -> Option<MetadataGroup> {
        self.registry.get(vnode.group_id())
    }

    /// The vnodes this broker leads now.
    pub fn led(&self) -> Vec<VnodeId> {
        self.registry
            .all()
            .into_iter()
            .filter(|g| g.is_leader())
            .filter_map(|g| u32::try_from(g.status().group_id).ok().map(VnodeId))
            .collect()
    }

    /// The vnodes this broker leads, kept current: recomputed on every
    /// leadership change of a hosted group and at least every `poll_ms`
    /// (the slow timer that catches anything an event missed). The
    /// watching task ends when every receiver is dropped.
    pub fn watch_led(self: &Arc<Self>, poll_ms: u64) -> watch::Receiver<BTreeSet<VnodeId>> {
        let (tx, rx) = watch::channel(self.led().into_iter().collect());
        let changed = Arc::new(Notify::new());
        for group in self.registry.all() {
            let mut leader = group.watch_leader();
            let changed = Arc::clone(&changed);
            tokio::spawn(async move {
                while leader.changed().await.is_ok() {
                    changed.notify_one();
                }
            });
        }
        let host = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = changed.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(poll_ms)) => {}
                    _ = tx.closed() => break,
                }
                let Some(host) = host.upgrade() else { break };
                let led: BTreeSet<VnodeId> = host.led().into_iter().collect();
                tx.send_if_modified(|current| {
                    let differs = *current != led;
                    *current = led;
                    differs
                });
            }
        });
        rx
    }

    /// Applies `cmd` on the vnode owning its topic, wherever its leader is.
    pub async fn propose(&self, cmd: Command) -> Result<Verdict, RouteError> {
        let topic = cmd.topic().ok_or(RouteError::Unroutable)?.to_owned();
        let body = rmp_serde::to_vec(&cmd).map_err(|e| RouteError::Failed {
            vnode: VnodeId(0),
            reason: e.to_string(),
        })?;
        self.route(&topic, FORWARD_PROPOSE_API_KEY, body).await
    }

    /// A linearizable description of `topic` from its vnode's leader.
    pub async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, RouteError> {
        let body = rmp_serde::to_vec(&ReadRequest {
            topic: topic.to_owned(),
        })
        .map_err(|e| RouteError::Failed {
            vnode: VnodeId(0),
            reason: e.to_string(),
        })?;
        self.route(topic, FORWARD_READ_API_KEY, body).await
    }

    /// Sends `cmd` to `vnode` without consulting the ring: the path a
    /// broker with a wrong ring takes. The vnode's own arc check answers.
    pub async fn propose_to(&self, vnode: VnodeId, cmd: Command) -> Result<Verdict, RouteError> {
        let body = rmp_serde::to_vec(&cmd).map_err(|e| RouteError::Failed {
            vnode,
            reason: e.to_string(),
        })?;
        self.route_to(vnode, FORWARD_PROPOSE_API_KEY, &body).await
    }

    async fn route<T: serde::de::DeserializeOwned + RefusesRoute>(
        &self,
        topic: &str,
        api_key: u16,
        body: Vec<u8>,
    ) -> Result<T, RouteError> {
        let mut refreshed = false;
        loop {
            let vnode = self.routing_ring.read().owner(topic).id;
            let answer: T = self.route_to(vnode, api_key, &body).await?;
            if answer.is_wrong_vnode() && !refreshed {
                // Routed by a stale ring: the vnode refused without applying
                // anything, so re-read the ring and route again, once.
                tracing::info!(%vnode, topic, "wrong vnode: re-reading the ring");
                *self.routing_ring.write() = self.ring();
                refreshed = true;
                continue;
            }
            return Ok(answer);
        }
    }

    async fn route_to<T: serde::de::DeserializeOwned>(
        &self,
        vnode: VnodeId,
        api_key: u16,
        body: &[u8],
    ) -> Result<T, RouteError> {
        let voters = self.voters(vnode);
        let mut target = self
            .group(vnode)
            .and_then(|g| g.status().leader)
            .unwrap_or(voters[0]);
        let mut last = String::from("no attempt");
        let mut next_voter = 0usize;
        for attempt in 1..=self.config.route_attempts_max {
            let answer: Forwarded<T> = if target == self.config.node_id {
                self.serve_local(api_key, vnode.group_id(), body).await
            } else {
                match self
                    .transport
                    .call_raw(
                        target,
                        api_key,
                        vnode.group_id(),
                        body,
                        self.config.forward_timeout_ms,
                    )
                    .await
                {
                    Ok(bytes) => {
                        rmp_serde::from_slice(&bytes).unwrap_or_else(|e| Forwarded::Retry {
                            reason: format!("undecodable answer: {e}"),
                        })
                    }
                    Err(
                        e @ (TransportError::Unreachable { .. } | TransportError::Network { .. }),
                    ) => Forwarded::NotLeader { leader: None }.noting(&mut last, e.to_string()),
                    Err(e @ TransportError::Remote { .. }) => {
                        Forwarded::NotLeader { leader: None }.noting(&mut last, e.to_string())
                    }
                }
            };
            match answer {
                Forwarded::Done(value) => return Ok(value),
                Forwarded::Failed { reason } => return Err(RouteError::Failed { vnode, reason }),
                Forwarded::NotLeader {
                    leader: Some(leader),
                } if leader != target => {
                    last = format!("node {target} is not the leader; node {leader} is");
                    target = leader;
                    continue;
                }
                Forwarded::NotLeader { .. } => {
                    if last == "no attempt" {
                        last = format!("node {target} knows no leader");
                    }
                }
                Forwarded::Retry { reason } => last = reason,
            }
            tracing::debug!(%vnode, attempt, target, %last, "metadata request re-routed");
            // No leader known here: try the voters in turn, with a pause so
            // an election can finish.
            target = voters[next_voter % voters.len()];
            next_voter += 1;
            tokio::time::sleep(Duration::from_millis(self.config.route_retry_backoff_ms)).await;
        }
        Err(RouteError::Unavailable {
            vnode,
            attempts: self.config.route_attempts_max,
            last,
        })
    }

    /// Serves a forwarded request on this broker's replica.
    async fn serve_local<T: serde::de::DeserializeOwned>(
        &self,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Forwarded<T> {
        // Locally the answer is encoded and decoded like a remote one, so
        // both paths are the same code; metadata answers are small.
        let encoded = match self.serve_forwarded(api_key, group_id, body).await {
            Ok(bytes) => bytes,
            Err((_, reason)) => return Forwarded::Failed { reason },
        };
        rmp_serde::from_slice(&encoded).unwrap_or_else(|e| Forwarded::Failed {
            reason: format!("undecodable local answer: {e}"),
        })
    }

    async fn serve_forwarded(
        &self,
        api_key: u16,
        group_id: u64,
        body: &[u8],
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        let codec = |e: &dyn std::fmt::Display| (ErrorCode::InvalidRequest, e.to_string());
        let Some(group) = self.registry.get(group_id) else {
            // Not a replica: no leader to name.
            return encode(&Forwarded::<()>::NotLeader { leader: None });
        };
        match api_key {
            FORWARD_PROPOSE_API_KEY => {
                let cmd: Command = rmp_serde::from_slice(body).map_err(|e| codec(&e))?;
                let answer = match self.propose_here(&group, group_id, cmd).await {
                    Ok(verdict) => Forwarded::Done(verdict),
                    Err(e) => forwarded_error(e),
                };
                encode(&answer)
            }
            FORWARD_READ_API_KEY => {
                let request: ReadRequest = rmp_serde::from_slice(body).map_err(|e| codec(&e))?;
                let answer = match group.read(move |s| s.describe_topic(&request.topic)).await {
                    Ok(description) => Forwarded::Done(description),
                    Err(e) => forwarded_error(e),
                };
                encode(&answer)
            }
            other => Err((
                ErrorCode::UnsupportedApi,
                format!("api key {other} is not a forwarded metadata request"),
            )),
        }
    }

    /// Proposes on this broker's replica, first recording the vnode's arc
    /// if the group has none yet.
    async fn propose_here(
        &self,
        group: &MetadataGroup,
        group_id: u64,
        cmd: Command,
    ) -> Result<Verdict, GroupError> {
        if cmd.topic().is_some() && group.read_local(|s| s.arc()).is_none() {
            let vnode = u32::try_from(group_id)
                .ok()
                .and_then(|id| self.ring().vnode(VnodeId(id)).copied());
            if let Some(vnode) = vnode {
                let arc = vnode.arc;
                let id_base = vnode.id.id_base();
                match group.propose(Command::AssignArc { arc, id_base }).await? {
                    Ok(_) => tracing::info!(group = group_id, %arc, "vnode arc recorded"),
                    // The group already holds a topic outside this arc (a
                    // lone broker's group 0 from before vnodes): leave it
                    // unenforced rather than refuse its own topics.
                    Err(refused) => {
                        tracing::warn!(group = group_id, %refused, "vnode arc not recorded")
                    }
                }
            }
        }
        group.propose(cmd).await
    }

    /// Stops every hosted group.
    pub async fn shutdown(&self) {
        for group in self.registry.all() {
            let id = group.status().group_id;
            if let Err(e) = group.shutdown().await {
                tracing::warn!(group = id, error = %e, "vnode group did not shut down cleanly");
            }
            self.registry.remove(id);
        }
    }
}

/// Whether an answer is the vnode's refusal of a topic outside its arc.
trait RefusesRoute {
    fn is_wrong_vnode(&self) -> bool;
}

impl RefusesRoute for Verdict {
    fn is_wrong_vnode(&self) -> bool {
        matches!(self, Err(ModelError::WrongVnode { .. }))
    }
}

impl RefusesRoute for Option<TopicDescription> {
    fn is_wrong_vnode(&self) -> bool {
        false
    }
}

impl<T> Forwarded<T> {
    fn noting(self, last: &mut String, reason: String) -> Forwarded<T> {
        *last = reason;
        self
    }
}

fn forwarded_error<T>(e: GroupError) -> Forwarded<T> {
    match e {
        GroupError::NotLeader { leader } => Forwarded::NotLeader { leader },
        GroupError::Discarded { leader } => Forwarded::NotLeader { leader },
        GroupError::Timeout | GroupError::Raft { .. } | GroupError::Stopped => Forwarded::Retry {
            reason: e.to_string(),
        },
        other => Forwarded::Failed {
            reason: other.to_string(),
        },
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, (ErrorCode, String)> {
    rmp_serde::to_vec(value).map_err(|e| (ErrorCode::UnknownServerError, e.to_string()))
}

#[async_trait::async_trait]
impl RpcService for VnodeHost {
    async fn serve(
        &self,
        api_key: u16,
        group_id: u64,
        body: Bytes,
    ) -> Result<Vec<u8>, (ErrorCode, String)> {
        match api_key {
            FORWARD_PROPOSE_API_KEY | FORWARD_READ_API_KEY => {
                self.serve_forwarded(api_key, group_id, &body).await
            }
            _ => self.registry.serve_raft(api_key, group_id, &body).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voter_sets_are_deterministic_and_sized() {
        let nodes = [1, 2, 3, 4, 5];
        for v in 0..16 {
            let a = voters_for(VnodeId(v), &nodes, 3);
            assert_eq!(a, voters_for(VnodeId(v), &[5, 4, 3, 2, 1], 3));
            assert_eq!(a.len(), 3);
        }
        assert_eq!(voters_for(VnodeId(0), &[7, 8], 3), vec![7, 8]);
        // Different vnodes land on different sets: the load spreads.
        let sets: std::collections::BTreeSet<_> =
            (0..16).map(|v| voters_for(VnodeId(v), &nodes, 3)).collect();
        assert!(sets.len() > 1);
    }
}
