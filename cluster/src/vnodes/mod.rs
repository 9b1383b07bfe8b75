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
//! to the hinted leader; a `WrongVnode` or `Moved` refusal (this broker
//! routed by a stale ring, or a split is moving the topic) makes it fetch
//! the current ring and route again. Each attempt is bounded, and so is the
//! number of attempts.
//!
//! Arc enforcement: before a vnode's first topic command, its leader
//! records the vnode's arc in the group (`Command::AssignArc`), so from then
//! on the group itself refuses topics outside it.
//!
//! The ring lives in a raft group of its own (`RING_GROUP_ID`, voters chosen
//! like a vnode's). Each broker keeps the newest ring it learned on disk,
//! fetches the current one after opening, when refused as misrouted, and
//! when told of a newer version (`observe_ring_version`). `split.rs` splits
//! a vnode in resumable steps; `lease.rs` keeps a coordinator's lease
//! (ADR 0082).
//!
//! `VnodeHost` is three parts and what coordinates them. Each part has its
//! own state and file: `RingStore` (`ring_store.rs`: the ring, the ring
//! requests are routed by, the ring file and the moved marker), `GroupSet`
//! (`group_set.rs`: the replicas hosted here, opened at most once, closed,
//! reopened, and which are led) and `Router` (`router.rs`: reaching a
//! group's leader over the transport, and serving a request forwarded to
//! a replica here). The host's own methods, which need more than one
//! part, live by job: `ring_group.rs` (the ring's raft group, adopting a
//! newer ring), `admin_store.rs` (users, ACLs and lockout in it),
//! `replicas.rs` (which replicas belong here and the steps that move
//! them), `routing.rs` (routing by topic, serving the
//! forwarding protocol), `loops.rs` (the long-lived loops and one-shots
//! its owner runs and restarts, the liveness prober among them); this file
//! opens the host and stops it.

mod admin_store;
pub use admin_store::{AdminStoreError, AuthViewCache, is_admin_command};
pub mod broker_api;
mod features;
mod group_set;
pub use features::{FEATURE_GATE_RECHECK_MS, FEATURE_REFRESH_MS, FINALIZED_FILE, FinalizedRecord};
pub mod lease;
mod loops;
pub use loops::HostLoop;
pub mod quiet;
pub mod rebalance;
mod replicas;
mod ring_group;
mod ring_store;
mod router;
mod routing;
mod split;
mod step_error;

pub use group_set::GroupSet;
#[allow(unused_imports)]
use group_set::*;
pub use malachi_core::placement::{CoordinatorPlan, plan_coordinators};
#[allow(unused_imports)]
use ring_group::*;
pub use ring_store::RingStore;
#[allow(unused_imports)]
use ring_store::*;
pub use router::Router;
#[allow(unused_imports)]
use router::*;
pub use split::SplitError;
use step_error::StepError;

use crate::group::fsio;
use crate::group::liveness::{LivenessSettings, Prober};
use crate::group::{Backoff, backoff_seed};
use crate::group::{
    CLOSE_VNODE_API_KEY, ConfigProblem, FORWARD_PROPOSE_API_KEY, FORWARD_QUERY_API_KEY,
    FORWARD_READ_API_KEY, GroupConfig, GroupError, GroupMembership, GroupRegistry, MetadataGroup,
    OPEN_VNODE_API_KEY, RING_ANNOUNCE_API_KEY, Refusal, RpcError, RpcService, TcpTransport,
    TransportError,
};
use bytes::Bytes;
use malachi_core::model::{
    Command, CursorKeyRing, ModelError, Outcome, RingArc, RingRecord, TopicDescription,
};
use malachi_core::ring::{MemberState, RING_GROUP_ID, RING_VNODE, Ring, VnodeId};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
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

/// How many groups a starting broker opens at once.
const GROUPS_OPENING_MAX: usize = 64;

/// How a broker hosts its vnodes.
#[derive(Debug, Clone)]
pub struct VnodeHostConfig {
    /// This broker's node id.
    pub node_id: u64,
    /// The nodes the cluster was formed with: its members until the ring
    /// lists others (ADR 0104). This one included, unless `joined`.
    pub nodes: Vec<u64>,
    /// This broker joined a running cluster (ADR 0104): it is not among
    /// `nodes`, initializes no group of its own, and asks to be admitted.
    pub joined: bool,
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
    /// How long one request may keep being re-routed, whatever attempts
    /// are left: a vnode with no leader (a majority of its voters down) is
    /// answered `Unavailable` within this, so a client waiting on the
    /// lookup gets an answer that names the vnode before its own deadline
    /// (ADR 0126). Attempts to unreachable voters each took up to
    /// `forward_timeout_ms`, so the attempt bound alone allowed minutes.
    pub route_timeout_ms: u64,
    /// The first pause before re-routing a request that found no leader;
    /// later pauses double (with jitter) up to `route_retry_backoff_max_ms`.
    pub route_retry_backoff_ms: u64,
    /// The longest pause between re-routes.
    pub route_retry_backoff_max_ms: u64,
    /// How long a request refused as misrouted (`WrongVnode`, `Moved`) is
    /// retried against the freshly fetched ring: covers a split between
    /// its fence and its ring commit.
    pub moved_wait_ms: u64,
    /// How peers are probed for quiet groups (ADR 0101); `None` keeps
    /// every group ticking (raft heartbeats and election timers), as before
    /// quiescence.
    pub liveness: Option<LivenessSettings>,
    /// How often every hosted group is re-judged quiet or not.
    pub quiet_check_ms: u64,
    /// Whether an idle leader hands its leadership to the group's preferred
    /// voter (`quiet::preferred_leader`), so leaders and coordinators
    /// spread evenly over the brokers. Needs `liveness`. Off by default:
    /// with it on, a leader killed and restarted at once can leave a quiet
    /// vnode whose replicas name each other as leader (ADR 0101, item 9).
    pub balance_leaders: bool,
    /// How long a member may be dead before its vnode replicas are
    /// replaced on the other brokers (ADR 0104).
    pub replace_after_ms: u64,
    /// How often the groups this broker leads are compared with where the
    /// members say their replicas belong.
    pub rebalance_check_ms: u64,
    /// How long one membership step (a learner's catch-up, a joint change)
    /// may take before it is tried again.
    pub membership_step_timeout_ms: u64,
    /// This broker's attributes (zone, rack, ...), committed to the ring
    /// where vnode placement constraints read them (ADR 0121).
    pub attributes: BTreeMap<String, String>,
    /// What this broker advertises to the ring's feature table (ADR 0134):
    /// its binary's version string, logical version and feature names.
    /// Tests set them apart from the binary's to play another version.
    pub binary_version: String,
    pub logical_version: u32,
    pub supported_features: Vec<String>,
    /// Whether the host's owner follows SWIM and tells it who gossips that
    /// it reads the feature table (`VnodeHost::observe_feature_readers`):
    /// then nothing is written to a pristine table until every member
    /// does (ADR 0134 §7). Off, nobody holds the table back.
    pub feature_readers_gossiped: bool,
    /// Tests only: play a broker from before feature gates (ADR 0134 §7),
    /// which advertises nothing (its owner gossips no `malachi.features`).
    pub plays_pre_feature_gates: bool,
    /// Whether the host's owner runs its long-lived loops (`HostLoop`,
    /// `VnodeHost::run_loop`) and restarts them when they end; off, `open`
    /// spawns them itself, unwatched.
    pub owner_runs_loops: bool,
}

impl VnodeHostConfig {
    pub fn new(node_id: u64, nodes: Vec<u64>, data_dir: impl Into<PathBuf>) -> VnodeHostConfig {
        let data_dir = data_dir.into();
        VnodeHostConfig {
            node_id,
            nodes,
            group: GroupConfig::new(0, node_id, data_dir.clone()),
            data_dir,
            vnode_count: malachi_core::ring::VNODES_DEFAULT,
            replicas_per_vnode: REPLICAS_PER_VNODE_DEFAULT,
            forward_timeout_ms: 5_000,
            route_attempts_max: 50,
            route_timeout_ms: 10_000,
            route_retry_backoff_ms: 50,
            route_retry_backoff_max_ms: 200,
            moved_wait_ms: 30_000,
            liveness: Some(LivenessSettings::default()),
            quiet_check_ms: quiet::QUIET_CHECK_MS_DEFAULT,
            balance_leaders: false,
            joined: false,
            replace_after_ms: rebalance::REPLACE_AFTER_MS_DEFAULT,
            rebalance_check_ms: rebalance::REBALANCE_CHECK_MS_DEFAULT,
            membership_step_timeout_ms: rebalance::MEMBERSHIP_STEP_TIMEOUT_MS_DEFAULT,
            attributes: BTreeMap::new(),
            binary_version: env!("CARGO_PKG_VERSION").to_owned(),
            logical_version: malachi_core::model::LOGICAL_VERSION,
            supported_features: malachi_core::model::Feature::supported_names(),
            feature_readers_gossiped: false,
            plays_pre_feature_gates: false,
            owner_runs_loops: false,
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
    /// A proposal may or may not have been applied: an attempt was
    /// discarded by a leader change, timed out, or lost its answer, and no
    /// later attempt settled it. Unlike the other errors, the change may
    /// exist; a client must read back before assuming it does not.
    #[error("vnode {vnode}: {reason}; the request may or may not have been applied")]
    OutcomeUnknown { vnode: VnodeId, reason: String },
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
    /// The group cannot serve now (a read timed out, raft refused, the
    /// group stopped); the router may retry.
    Retry {
        reason: String,
    },
    /// The group failed for good.
    Failed {
        reason: String,
    },
    /// A proposal's outcome is unknown (it timed out, or a leader change
    /// discarded its entry): it may still commit. The router may retry
    /// (following `leader`), but if no attempt settles it the caller gets
    /// `RouteError::OutcomeUnknown`, not a refusal. Last, so answers of
    /// the variants above encode as before.
    Unknown {
        leader: Option<u64>,
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct ReadRequest {
    topic: String,
}

/// A control read served by a group's leader (api key 214).
#[derive(Debug, Serialize, Deserialize)]
enum Query {
    /// The ring group's `RingRecord`.
    Ring,
    /// The metadata of a fenced part of a vnode's arc, as a split's seed.
    Export { arc: RingArc, id_base: u64 },
    /// The ring group's cursor keys (ADR 0096). Last, so the variants
    /// above encode as before.
    CursorKeys,
    /// The group's membership as its leader knows it (ADR 0104).
    Membership,
    /// Which of these segment ids the group's metadata lists (ADR 0115):
    /// the orphan sweeper's and a drop order's check. Last, so the
    /// variants above encode as before. With a topic, a group whose arc
    /// does not hold it (or holds it fenced) refuses rather than answer
    /// "none": only the topic's own vnode can say its segments are gone.
    ListsSegments {
        topic: Option<String>,
        segments: Vec<u64>,
    },
    /// The cluster's storage policies: the ring group's (ADR 0115).
    Policies,
    /// The admin stores' `AuthView` (ADR 0148). Last, so the variants
    /// above encode as before; asked only while `admin_store` is active.
    AuthView,
}

/// The most segment ids one `ListsSegments` query carries.
pub const LISTS_SEGMENTS_MAX: usize = 4096;

/// What every vnode said of a set of segment ids (ADR 0115).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentListing {
    /// The ids some vnode lists.
    pub listed: BTreeSet<u64>,
    /// The vnodes asked; all of them answered.
    pub vnodes_asked: usize,
}

/// Why the cluster's answer about a set of segments is not whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    /// A vnode did not answer: nothing may be judged unlisted.
    #[error("vnode {vnode} did not answer: {source}")]
    Silent {
        vnode: VnodeId,
        #[source]
        source: RouteError,
    },
    /// The ring changed (or a vnode split was under way) while the vnodes
    /// were asked: a topic may have moved between two answers.
    #[error(
        "the ring changed while the vnodes were asked (version {before} to {after}, split pending: {pending})"
    )]
    RingMoved {
        before: u64,
        after: u64,
        pending: bool,
    },
    /// More ids than one query carries.
    #[error("{count} segment ids asked at once; at most {LISTS_SEGMENTS_MAX}")]
    TooMany { count: usize },
}

/// Tells a broker a ring version exists (api key 216).
#[derive(Debug, Serialize, Deserialize)]
struct RingAnnounce {
    version: u64,
}

/// Asks a broker to open its replica of a vnode (api key 215): a split's
/// child on its voters (initialized with `voters`), or a vnode (or the
/// ring's group, `RING_VNODE`) it is about to join as a learner (`voters`
/// absent: opened empty, it learns everything from the leader).
#[derive(Debug, Serialize, Deserialize)]
struct OpenVnode {
    vnode: VnodeId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    voters: Option<Vec<u64>>,
}

/// Tells a broker it left a group (api key 218): its replica closes and
/// its directory goes. Sent by the leader once the change that removed it
/// committed; `voters` are the group's voters then.
#[derive(Debug, Serialize, Deserialize)]
struct CloseVnode {
    vnode: VnodeId,
    voters: Vec<u64>,
}

/// A group's membership, as its leader answers `Query::Membership`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VnodeMembership {
    pub leader: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub joint: bool,
    /// Whether the leader knows this membership committed.
    pub committed: bool,
}

type Verdict = Result<Outcome, ModelError>;
/// A forwarded describe's answer: the description, or the vnode's refusal
/// of a topic it does not serve.
type ReadAnswer = Result<Option<TopicDescription>, ModelError>;

/// The vnode replicas one broker hosts, and its router: a `RingStore`, a
/// `GroupSet` and a `Router`, and what coordinates them.
#[derive(Debug)]
pub struct VnodeHost {
    config: VnodeHostConfig,
    /// The ring this broker holds.
    rings: RingStore,
    /// The replicas this broker hosts.
    groups: Arc<GroupSet>,
    /// How requests reach a group's leader.
    router: Router,
    stopped: AtomicBool,
    /// The feature advertiser and watch (and, unless the owner runs them,
    /// the `HostLoop`s), aborted at shutdown.
    background: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Tells the `HostLoop`s the host stopped, or a test armed one to
    /// panic (`fail_loop`).
    signals: Arc<loops::LoopSignals>,
    /// This host, for background work started from `&self`.
    this: std::sync::Weak<VnodeHost>,
    /// The liveness prober's state (its up set among it), where peers are
    /// probed; the task running its rounds is a `HostLoop`.
    prober: Option<Arc<Prober>>,
    /// The feature table as this broker last read it from the ring's
    /// group (ADR 0134): what the writer gates consult.
    features: RwLock<Arc<malachi_core::model::FeatureTable>>,
    /// What this broker's data dir records the cluster finalized.
    finalized_kept: parking_lot::Mutex<features::FinalizedRecord>,
    /// Who gossips that they read the feature table (ADR 0134 §7).
    feature_gossip: features::FeatureGossip,
}

impl VnodeHost {
    /// Opens (or recovers) this broker's replica of the ring's group and of
    /// every vnode whose voters include this broker, and initializes the
    /// membership of fresh ones. Routes by the newest ring this broker kept
    /// on disk (a fresh ring of `vnode_count` the first time) and fetches
    /// the current ring from the ring's group in the background. Returns
    /// without waiting for elections.
    pub async fn open(
        config: VnodeHostConfig,
        transport: Arc<TcpTransport>,
    ) -> Result<Arc<VnodeHost>, GroupError> {
        if !config.joined && !config.nodes.contains(&config.node_id) {
            return Err(GroupError::config(ConfigProblem::NotAClusterNode {
                node: config.node_id,
                nodes: config.nodes.clone(),
            }));
        }
        let prober = loops::new_prober(&config, &transport)?;
        let rings = RingStore::load(config.node_id, &config.data_dir, config.vnode_count)?;
        let host = Arc::new_cyclic(|this| VnodeHost {
            this: this.clone(),
            rings,
            groups: Arc::new(GroupSet::new(&config, Arc::clone(&transport))),
            router: Router::new(&config, transport),
            stopped: AtomicBool::new(false),
            background: parking_lot::Mutex::new(Vec::new()),
            signals: Arc::default(),
            prober,
            features: RwLock::new(Arc::default()),
            finalized_kept: parking_lot::Mutex::new(features::load_finalized(
                &config.data_dir.join(features::FINALIZED_FILE),
            )),
            feature_gossip: features::FeatureGossip::default(),
            config,
        });
        host.update_probe_peers();
        let opened = host.open_replicas().await;
        if let Err(e) = opened.and_then(|()| host.check_local_features()) {
            host.shutdown().await;
            return Err(e);
        }
        tracing::info!(
            node = host.config.node_id,
            groups = host.groups.len(),
            ring_version = host.ring().version(),
            "vnode replicas open"
        );
        if !host.config.owner_runs_loops {
            host.spawn_loops();
        }
        host.spawn_feature_advertiser();
        host.spawn_feature_watch();
        Ok(host)
    }

    /// Probes every member but this broker from now on.
    pub(super) fn update_probe_peers(&self) {
        if let Some(prober) = &self.prober {
            prober.set_peers(self.nodes());
        }
    }

    /// The admission (`HostLoop::Admission`): asks the ring's group, until
    /// it answers, to make this broker a member (a broker that joined a
    /// running cluster, ADR 0104).
    pub(super) async fn admission(host: Arc<VnodeHost>) -> Option<RingChange> {
        let me = host.config.node_id;
        if host.ring().members().get(&me) == Some(&MemberState::Active) {
            return None;
        }
        // A binary lacking what the cluster finalized is not admitted
        // (ADR 0134): its advertisement is refused first.
        match host.advertise_features().await {
            Ok(Ok(_)) => {}
            Ok(Err(refused)) => return Some(Ok(Err(refused))),
            Err(e) => return Some(Err(e)),
        }
        Some(
            host.admit(me)
                .await
                .map(|taken| taken.map(|version| (version, "admitted to the cluster"))),
        )
    }

    /// The attribute publisher (`HostLoop::Attributes`): commits this
    /// broker's configured attributes to the ring once they differ from
    /// what the ring holds (a first start, or a restart with new
    /// attributes; ADR 0121). A broker with no attributes the ring does not
    /// list either has nothing to commit.
    pub(super) async fn attributes_change(host: Arc<VnodeHost>) -> Option<RingChange> {
        let me = host.config.node_id;
        let wanted = host.config.attributes.clone();
        let committed = host.ring().attributes_of(me).cloned();
        if committed.as_ref() == Some(&wanted) || (committed.is_none() && wanted.is_empty()) {
            return None;
        }
        let cmd = Command::SetMemberAttributes {
            node: me,
            attributes: wanted,
        };
        Some(
            host.change_members(cmd)
                .await
                .map(|taken| taken.map(|version| (version, "attributes committed to the ring"))),
        )
    }

    /// The nodes the cluster was formed with.
    pub fn formation_nodes(&self) -> &[u64] {
        &self.config.nodes
    }

    /// Brokers per vnode group.
    pub fn replicas_per_vnode(&self) -> usize {
        self.config.replicas_per_vnode
    }

    /// The brokers the liveness prober finds up now (this one included):
    /// a faster signal than SWIM's, about one second after a broker stops
    /// answering. `None` where no prober runs.
    pub fn up_nodes(&self) -> Option<BTreeSet<u64>> {
        self.prober.as_ref().map(|p| p.up())
    }

    /// A receiver of the liveness prober's up set, where a prober runs.
    /// It outlives a restart of the prober's task.
    pub fn up_watch(&self) -> Option<watch::Receiver<BTreeSet<u64>>> {
        self.prober.as_ref().map(|p| p.subscribe())
    }

    /// The cluster's members and their states, by the ring this broker
    /// holds.
    pub fn members(&self) -> BTreeMap<u64, MemberState> {
        self.ring().members_or(&self.config.nodes)
    }

    /// Whether `shutdown` has begun.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// How many hosted groups are quiet now (ADR 0101).
    pub fn quiet_groups(&self) -> usize {
        self.groups.quiet_count()
    }

    /// Stops every hosted group.
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        self.signals.stop();
        for task in self.background.lock().drain(..) {
            task.abort();
        }
        self.groups.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_redirect_cycle_pauses_and_a_chain_does_not() {
        let mut redirects = super::Redirects::default();
        // 1 names 2, 2 names 3: a chain, followed at once.
        assert!(redirects.fresh(1, 2));
        assert!(redirects.fresh(2, 3));
        // 3 names 1 again: a cycle, so pause.
        assert!(!redirects.fresh(3, 1));
        redirects.paused();
        assert!(redirects.fresh(3, 1));
        assert!(!redirects.fresh(1, 3));
    }
    use super::*;
    use malachi_wire::error::ErrorCode;

    #[test]
    fn a_discarded_proposal_travels_as_an_unknown_outcome_not_a_refusal() {
        let discarded = GroupError::Discarded { leader: Some(2) };
        match proposal_error::<()>(discarded.clone()) {
            Forwarded::Unknown { leader, reason } => {
                assert_eq!(leader, Some(2));
                assert_eq!(
                    reason,
                    "the proposal was discarded by a leader change; its outcome is unknown"
                );
            }
            other => panic!("expected Unknown, got {other:?}"),
        }
        assert!(matches!(
            proposal_error::<()>(GroupError::Timeout),
            Forwarded::Unknown { leader: None, .. }
        ));
        // A refusal that cannot have applied anything stays a refusal.
        assert!(matches!(
            proposal_error::<()>(GroupError::NotLeader { leader: Some(3) }),
            Forwarded::NotLeader { leader: Some(3) }
        ));
        // On the raft port the same error is `outcome_unknown`.
        assert_eq!(RpcError::Group(discarded).code(), ErrorCode::OutcomeUnknown);
    }

    /// Regression (CI, `full_volume`): a create routed to a leader whose
    /// raft log hit ENOSPC failed at once with "the group is fatally
    /// stopped", though the other voters were about to elect a leader.
    #[test]
    fn a_fatal_replica_is_retried_elsewhere_and_its_proposal_is_unknown() {
        let fatal = || GroupError::Storage {
            path: "raft.log".into(),
            offset: 4096,
            problem: crate::group::Corruption::OtherGroup {
                found: 1,
                expected: 2,
            },
        };
        assert!(fatal().is_fatal());
        assert!(matches!(
            forwarded_error::<()>(fatal()),
            Forwarded::Retry { .. }
        ));
        // The leader's append failed, but its followers may hold the entry.
        assert!(matches!(
            proposal_error::<()>(fatal()),
            Forwarded::Unknown { leader: None, .. }
        ));
        // A refusal of the request itself still ends the route.
        assert!(matches!(
            forwarded_error::<()>(GroupError::Config {
                problem: crate::group::ConfigProblem::NoVoters,
            }),
            Forwarded::Failed { .. }
        ));
    }

    #[test]
    fn a_route_that_fails_after_an_unknown_attempt_is_outcome_unknown() {
        let unavailable = RouteError::Unavailable {
            vnode: VnodeId(4),
            attempts: 3,
            last: "node 2 knows no leader".into(),
        };
        assert_eq!(settle(VnodeId(4), None, unavailable.clone()), unavailable);
        let settled = settle(
            VnodeId(4),
            Some("the proposal timed out".into()),
            unavailable,
        );
        assert_eq!(
            settled,
            RouteError::OutcomeUnknown {
                vnode: VnodeId(4),
                reason: "the proposal timed out".into(),
            }
        );
        assert!(
            settled
                .to_string()
                .ends_with("the request may or may not have been applied")
        );
    }

    #[test]
    fn forwarded_answers_keep_their_encoding_and_the_unknown_one_decodes() {
        // The variants before `Unknown` encode as they did before it was added.
        let hex = |f: &Forwarded<u8>| {
            rmp_serde::to_vec(f)
                .unwrap()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let encoded: Vec<String> = [
            Forwarded::Done(7),
            Forwarded::NotLeader { leader: Some(2) },
            Forwarded::Retry { reason: "r".into() },
            Forwarded::Failed { reason: "f".into() },
            Forwarded::Unknown {
                leader: None,
                reason: "u".into(),
            },
        ]
        .iter()
        .map(hex)
        .collect();
        insta::assert_snapshot!(encoded.join("\n"));
        let unknown = rmp_serde::to_vec(&Forwarded::<u8>::Unknown {
            leader: Some(1),
            reason: "the proposal timed out".into(),
        })
        .unwrap();
        assert!(matches!(
            rmp_serde::from_slice::<Forwarded<u8>>(&unknown).unwrap(),
            Forwarded::Unknown {
                leader: Some(1),
                ..
            }
        ));
    }

    #[test]
    fn rpc_errors_travel_as_their_code_and_message() {
        let frame = RpcError::NotHosted { group_id: 9 }.to_frame(5);
        assert_eq!(frame.correlation_id, 5);
        assert_eq!(frame.error_code, ErrorCode::NotLeader);
        assert_eq!(&frame.payload[..], b"group 9 is not hosted here");
        assert_eq!(
            RpcError::NotRaft { api_key: 1 }.code(),
            ErrorCode::UnsupportedApi
        );
        assert_eq!(
            RpcError::Group(GroupError::Stopped).code(),
            ErrorCode::ShuttingDown
        );
    }

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
