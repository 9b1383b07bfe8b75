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

pub mod broker_api;
mod features;
pub use features::{FEATURE_REFRESH_MS, FINALIZED_FILE, FinalizedRecord};
pub mod lease;
pub mod quiet;
pub mod rebalance;
mod split;
mod step_error;

pub use malachi_core::placement::{CoordinatorPlan, plan_coordinators};
pub use split::SplitError;
use step_error::StepError;

use crate::group::fsio;
use crate::group::liveness::{LivenessSettings, spawn_prober};
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
use parking_lot::RwLock;
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

/// The vnode replicas one broker hosts, and its router.
#[derive(Debug)]
pub struct VnodeHost {
    config: VnodeHostConfig,
    /// The ring this broker believes current: the newest it has learned.
    ring: RwLock<Arc<Ring>>,
    /// The ring requests are routed by; replaced by `ring` on a misrouted
    /// answer. Only tests set it apart from `ring`, to play a broker with a
    /// stale ring.
    routing_ring: RwLock<Arc<Ring>>,
    registry: Arc<GroupRegistry>,
    transport: Arc<TcpTransport>,
    /// Serializes opening replicas and adopting rings, so one group
    /// directory is never opened twice.
    adopting: tokio::sync::Mutex<()>,
    /// Replicas closed because a full volume stopped them, not yet opened
    /// again (`reopen_stopped_by_full_volume`).
    closed_by_full_volume: parking_lot::Mutex<BTreeSet<u64>>,
    /// Bumped whenever a group is opened, so `watch_led` watches it too.
    groups_opened: watch::Sender<u64>,
    stopped: AtomicBool,
    /// The liveness prober and the quiescer, aborted at shutdown.
    background: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This host, for background work started from `&self`.
    this: std::sync::Weak<VnodeHost>,
    /// The peers the liveness prober probes: every member but this one,
    /// kept current as the ring's members change.
    probe_peers: Arc<RwLock<Vec<u64>>>,
    /// When each hosted group was opened: a replica left behind by a lost
    /// close is swept only once it is older than a membership step.
    opened_at: parking_lot::Mutex<BTreeMap<u64, Instant>>,
    /// Whether `MOVED_FILE` is written (and the lock its writers take).
    moved_marked: tokio::sync::Mutex<bool>,
    /// The liveness prober's up set (this broker included), once it runs.
    up: std::sync::OnceLock<watch::Receiver<BTreeSet<u64>>>,
    /// The feature table as this broker last read it from the ring's
    /// group (ADR 0134): what the writer gates consult.
    features: RwLock<Arc<malachi_core::model::FeatureTable>>,
    /// What this broker's data dir records the cluster finalized.
    finalized_kept: parking_lot::Mutex<features::FinalizedRecord>,
}

/// Where a broker keeps the newest ring it has learned.
const RING_FILE: &str = "ring.current";
/// Present once a group moved on or off this broker (ADR 0104).
const MOVED_FILE: &str = "groups-moved";
/// The magic tag of the ring file.
const RING_FILE_MAGIC: &[u8; 8] = b"MALRING1";
/// The largest ring file read back (256 vnodes encode to a few KiB).
const RING_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// The first and the longest pause of the background ring fetch.
const RING_SYNC_BACKOFF_MIN_MS: u64 = 100;
const RING_SYNC_BACKOFF_MAX_MS: u64 = 2_000;

/// The ring's group has its voters chosen like a vnode's, under a tag no
/// vnode id reaches (`VNODES_MAX` is far below it).
const RING_VOTERS_TAG: VnodeId = VnodeId(u32::from_be_bytes(*b"ring"));

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
        let fresh = Ring::new(config.vnode_count)
            .map_err(|e| GroupError::config(ConfigProblem::Ring(e)))?;
        let ring = Arc::new(load_ring(&config.data_dir.join(RING_FILE)).unwrap_or(fresh));
        let registry = Arc::new(GroupRegistry::new());
        let host = Arc::new_cyclic(|this| VnodeHost {
            this: this.clone(),
            ring: RwLock::new(Arc::clone(&ring)),
            routing_ring: RwLock::new(ring),
            registry,
            transport,
            adopting: tokio::sync::Mutex::new(()),
            closed_by_full_volume: parking_lot::Mutex::new(BTreeSet::new()),
            groups_opened: watch::channel(0).0,
            stopped: AtomicBool::new(false),
            background: parking_lot::Mutex::new(Vec::new()),
            probe_peers: Arc::new(RwLock::new(Vec::new())),
            opened_at: parking_lot::Mutex::new(BTreeMap::new()),
            moved_marked: tokio::sync::Mutex::new(false),
            up: std::sync::OnceLock::new(),
            features: RwLock::new(Arc::default()),
            finalized_kept: parking_lot::Mutex::new(features::load_finalized(
                &config.data_dir.join(features::FINALIZED_FILE),
            )),
            config,
        });
        host.update_probe_peers();
        let opened = async {
            let _adopting = host.adopting.lock().await;
            let ring = host.ring();
            // Only the ring every broker started from, with the members the
            // cluster was formed with, says who the voters of a fresh group
            // are. Past it, groups move by membership changes (ADR 0104): a
            // replica this broker lacks is opened empty and learns its
            // membership from its leader, never guessed.
            let pristine = ring.version() == 1
                && ring.formed_members()
                && !host.config.joined
                && !host.config.data_dir.join(MOVED_FILE).exists();
            let me = host.config.node_id;
            let ring_dir = host.config.data_dir.join("ring").exists();
            let ring_target = host.target_voters(RING_VNODE);
            if pristine && ring_target.contains(&me) {
                host.open_group(RING_GROUP_ID, Some(ring_target)).await?;
            } else if ring_dir || ring_target.contains(&me) {
                host.open_group(RING_GROUP_ID, None).await?;
            }
            // The ring's vnodes, and any vnode whose group exists here (a
            // split's child the ring this broker knows does not name yet,
            // a replica a membership change gave it).
            let dirs: BTreeSet<VnodeId> = vnode_dirs(&host.config.data_dir).into_iter().collect();
            let mut vnodes: BTreeSet<VnodeId> = ring.vnodes().map(|v| v.id).collect();
            vnodes.extend(dirs.iter().copied());
            // Opened side by side, a bounded number at a time: opening a
            // group is mostly waiting for its files' fsyncs, which the disk
            // absorbs together, and one at a time 4,096 vnodes took minutes
            // to start (ADR 0105).
            let opens = vnodes.into_iter().filter_map(|vnode| {
                let target = host.target_voters(vnode);
                if pristine && target.contains(&me) {
                    Some((vnode.group_id(), Some(target)))
                } else if dirs.contains(&vnode) || target.contains(&me) {
                    Some((vnode.group_id(), None))
                } else {
                    None
                }
            });
            use futures::{StreamExt, TryStreamExt};
            futures::stream::iter(opens)
                .map(|(group_id, voters)| host.open_group(group_id, voters))
                .buffer_unordered(GROUPS_OPENING_MAX)
                .try_collect::<()>()
                .await?;
            Ok::<(), GroupError>(())
        };
        if let Err(e) = opened.await.and_then(|()| host.check_local_features()) {
            host.shutdown().await;
            return Err(e);
        }
        tracing::info!(
            node = host.config.node_id,
            groups = host.registry.all().len(),
            ring_version = host.ring().version(),
            "vnode replicas open"
        );
        host.spawn_ring_sync();
        host.spawn_quiescence()?;
        if host.config.joined {
            host.spawn_admission();
        }
        host.spawn_attribute_publisher();
        host.spawn_feature_advertiser();
        host.spawn_feature_watch();
        Ok(host)
    }

    /// Starts probing peers and quieting idle groups (ADR 0101), unless the
    /// configuration keeps every group ticking.
    fn spawn_quiescence(self: &Arc<Self>) -> Result<(), GroupError> {
        let Some(settings) = self.config.liveness else {
            let rebalancer = rebalance::spawn_rebalancer(
                Arc::downgrade(self),
                None,
                self.config.rebalance_check_ms.max(1),
                self.config.replace_after_ms,
            );
            self.background.lock().push(rebalancer);
            return Ok(());
        };
        settings
            .validate()
            .map_err(|e| GroupError::config(ConfigProblem::Liveness(e)))?;
        let (up, prober) = spawn_prober(
            Arc::clone(&self.transport),
            self.config.node_id,
            Arc::clone(&self.probe_peers),
            settings,
            Arc::new(crate::clock::SystemClock::new()),
        );
        let _ = self.up.set(up.clone());
        let rebalancer = rebalance::spawn_rebalancer(
            Arc::downgrade(self),
            Some(up.clone()),
            self.config.rebalance_check_ms.max(1),
            self.config.replace_after_ms,
        );
        let quiescer = quiet::spawn_quiescer(
            Arc::downgrade(self),
            up,
            self.config.quiet_check_ms.max(1),
            self.config.balance_leaders,
        );
        self.background
            .lock()
            .extend([prober, quiescer, rebalancer]);
        Ok(())
    }

    /// Probes every member but this broker from now on.
    fn update_probe_peers(&self) {
        let me = self.config.node_id;
        let peers: Vec<u64> = self.nodes().into_iter().filter(|n| *n != me).collect();
        *self.probe_peers.write() = peers;
    }

    /// Asks the ring's group, until it answers, to make this broker a
    /// member (a broker that joined a running cluster, ADR 0104).
    fn spawn_admission(self: &Arc<Self>) {
        self.spawn_ring_change("admission", |host| async move {
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
        });
    }

    /// Commits this broker's configured attributes to the ring once they
    /// differ from what the ring holds (a first start, or a restart with
    /// new attributes; ADR 0121). A broker with no attributes the ring
    /// does not list either has nothing to commit.
    fn spawn_attribute_publisher(self: &Arc<Self>) {
        self.spawn_ring_change("attributes", |host| async move {
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
                host.change_members(cmd).await.map(|taken| {
                    taken.map(|version| (version, "attributes committed to the ring"))
                }),
            )
        });
    }

    /// Runs `change` until it is done: `None` (nothing to change), the ring
    /// group's verdict (taken, with the version and what to log; or
    /// refused, logged as an error), or, while the group cannot be reached,
    /// again after a backoff.
    fn spawn_ring_change<F, Fut>(self: &Arc<Self>, what: &'static str, change: F)
    where
        F: Fn(Arc<VnodeHost>) -> Fut + Send + 'static,
        Fut: std::future::Future<
                Output = Option<Result<Result<(u64, &'static str), ModelError>, RouteError>>,
            > + Send,
    {
        let host = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let mut backoff = None;
            loop {
                let Some(strong) = host.upgrade() else { break };
                if strong.is_stopped() {
                    break;
                }
                let me = strong.config.node_id;
                let backoff = backoff.get_or_insert_with(|| {
                    Backoff::new(
                        RING_SYNC_BACKOFF_MIN_MS,
                        RING_SYNC_BACKOFF_MAX_MS,
                        backoff_seed(me, RING_GROUP_ID),
                    )
                });
                match change(Arc::clone(&strong)).await {
                    None => break,
                    Some(Ok(Ok((version, done)))) => {
                        tracing::info!(node = me, ring_version = version, "{done}");
                        break;
                    }
                    Some(Ok(Err(refused))) => {
                        tracing::error!(node = me, what, %refused, "the ring's group refused this broker's change");
                        break;
                    }
                    Some(Err(e)) => {
                        tracing::info!(node = me, what, error = %e, "the ring's group not reached yet; asking again");
                    }
                }
                drop(strong);
                tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
            }
        });
        self.background.lock().push(task);
    }

    /// Makes `node` an active member (ADR 0104): its share of the vnode
    /// replicas moves to it. Returns the ring version that lists it, or
    /// the ring group's refusal.
    pub async fn admit(&self, node: u64) -> Result<Result<u64, ModelError>, RouteError> {
        let cmd = Command::AdmitNode {
            node,
            formed: self.config.nodes.clone(),
        };
        self.change_members(cmd).await
    }

    /// Decommissions `node` (ADR 0104): its vnode replicas move to the
    /// active members. Returns the ring version that says so.
    pub async fn decommission(&self, node: u64) -> Result<Result<u64, ModelError>, RouteError> {
        let cmd = Command::DecommissionNode {
            node,
            formed: self.config.nodes.clone(),
            replicas: u32::try_from(self.config.replicas_per_vnode).unwrap_or(u32::MAX),
        };
        self.change_members(cmd).await
    }

    async fn change_members(&self, cmd: Command) -> Result<Result<u64, ModelError>, RouteError> {
        // A fresh ring group holds no ring yet: create it first.
        self.ring_record().await?;
        let version = match self.propose_ring(cmd).await? {
            Ok(Outcome::RingChanged { version }) => version,
            Ok(other) => {
                return Err(RouteError::Failed {
                    vnode: RING_VNODE,
                    reason: format!("unexpected outcome {other:?}"),
                });
            }
            Err(refused) => return Ok(Err(refused)),
        };
        self.refresh_ring().await?;
        self.announce_ring(version).await;
        Ok(Ok(version))
    }

    /// The nodes the cluster was formed with.
    pub fn formation_nodes(&self) -> &[u64] {
        &self.config.nodes
    }

    /// Brokers per vnode group.
    pub fn replicas_per_vnode(&self) -> usize {
        self.config.replicas_per_vnode
    }

    /// The cluster's members and their states, by the ring this broker
    /// holds.
    /// The brokers the liveness prober finds up now (this one included):
    /// a faster signal than SWIM's, about one second after a broker stops
    /// answering. `None` where no prober runs.
    pub fn up_nodes(&self) -> Option<BTreeSet<u64>> {
        self.up.get().map(|up| up.borrow().clone())
    }

    /// A receiver of the liveness prober's up set, where a prober runs.
    pub fn up_watch(&self) -> Option<watch::Receiver<BTreeSet<u64>>> {
        self.up.get().cloned()
    }

    pub fn members(&self) -> BTreeMap<u64, MemberState> {
        self.ring().members_or(&self.config.nodes)
    }

    /// Where `vnode`'s replicas belong among the active members (the
    /// ring's group for `RING_VNODE`), by the ring this broker holds. The
    /// groups' memberships follow it (ADR 0104).
    pub fn target_voters(&self, vnode: VnodeId) -> Vec<u64> {
        let eligible = rebalance::eligible(
            &self.members(),
            &BTreeSet::new(),
            self.config.replicas_per_vnode,
        );
        let replicas = self.config.replicas_per_vnode;
        let ring = self.ring();
        // Constraints no eligible set meets leave the groups where they
        // are (the rebalancer moves nothing); this answer falls back to
        // rendezvous hashing.
        rebalance::placed_voters(vnode, &eligible, replicas, &ring)
            .unwrap_or_else(|_| rebalance::target_voters(vnode, &eligible, replicas))
            .into_iter()
            .collect()
    }

    /// Takes one step of moving a group this broker leads toward its
    /// target (`rebalance::next_step` chose it).
    pub(crate) async fn take_step(
        &self,
        vnode: VnodeId,
        group: MetadataGroup,
        step: rebalance::Step,
    ) {
        use rebalance::Step;
        let timeout_ms = self.config.membership_step_timeout_ms;
        let group_id = group.group_id();
        group.set_quiet(false);
        let result: Result<(), StepError> = match &step {
            Step::Settled => Ok(()),
            Step::AddLearner { node } => match self.ask_open(*node, vnode, None).await {
                Ok(()) => group
                    .add_learner(*node, timeout_ms)
                    .await
                    .map_err(StepError::from),
                Err(e) => Err(e),
            },
            Step::ChangeVoters { voters } => group
                .change_voters(voters, timeout_ms)
                .await
                .map_err(StepError::from),
            Step::HandOver { to } => group.transfer_leader(*to).await.map_err(StepError::from),
            Step::RemoveLearners { nodes } => {
                match group.remove_learners(nodes, timeout_ms).await {
                    Ok(()) => {
                        let body = CloseVnode {
                            vnode,
                            voters: group.membership().voters.into_iter().collect(),
                        };
                        for node in nodes {
                            if let Err(e) = self.tell_closed(*node, group_id, &body).await {
                                tracing::info!(group = group_id, node, error = %e, "a removed replica was not told to close; it closes when it next asks");
                            }
                        }
                        Ok(())
                    }
                    Err(e) => Err(StepError::from(e)),
                }
            }
        };
        match result {
            Ok(()) => tracing::info!(group = group_id, ?step, "vnode replicas moved a step"),
            Err(e) => {
                tracing::info!(group = group_id, ?step, error = %e, "vnode replica move did not complete; trying again")
            }
        }
    }

    /// Asks `node` to open its replica of `vnode`'s group.
    async fn ask_open(
        &self,
        node: u64,
        vnode: VnodeId,
        voters: Option<Vec<u64>>,
    ) -> Result<(), StepError> {
        let group_id = group_of(vnode);
        if node == self.config.node_id {
            return Ok(self.open_requested(vnode, voters).await?);
        }
        let body = rmp_serde::to_vec(&OpenVnode { vnode, voters })?;
        let bytes = self
            .transport
            .call_raw(
                node,
                OPEN_VNODE_API_KEY,
                group_id,
                &body,
                self.config.forward_timeout_ms,
            )
            .await?;
        match rmp_serde::from_slice::<Forwarded<()>>(&bytes)? {
            Forwarded::Done(()) => Ok(()),
            answer => Err(StepError::Refused { node, answer }),
        }
    }

    async fn tell_closed(
        &self,
        node: u64,
        group_id: u64,
        body: &CloseVnode,
    ) -> Result<(), StepError> {
        let body = rmp_serde::to_vec(body)?;
        let bytes = self
            .transport
            .call_raw(
                node,
                CLOSE_VNODE_API_KEY,
                group_id,
                &body,
                self.config.forward_timeout_ms,
            )
            .await?;
        match rmp_serde::from_slice::<Forwarded<()>>(&bytes)? {
            Forwarded::Done(()) => Ok(()),
            answer => Err(StepError::Refused { node, answer }),
        }
    }

    /// Opens this broker's replica of `vnode`'s group as a peer asked:
    /// initialized with `voters` (a split's child; this broker must be
    /// one), or empty, to learn everything from the leader.
    async fn open_requested(
        &self,
        vnode: VnodeId,
        voters: Option<Vec<u64>>,
    ) -> Result<(), GroupError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(GroupError::Stopped);
        }
        if let Some(voters) = &voters
            && !voters.contains(&self.config.node_id)
        {
            return Err(GroupError::config(ConfigProblem::NotAVnodeVoter {
                node: self.config.node_id,
                vnode,
                voters: voters.clone(),
            }));
        }
        if voters.is_none() {
            self.mark_moved().await?;
        }
        let _adopting = self.adopting.lock().await;
        let group_id = group_of(vnode);
        // Asked again: a sweep judging this replica by an older answer
        // must leave it open.
        self.opened_at.lock().insert(group_id, Instant::now());
        self.open_group(group_id, voters).await
    }

    /// Closes this broker's replica of a group it left and removes its
    /// directory. Refused for a group it leads or is still a voter of (by
    /// the voters the leader sent).
    async fn close_requested(&self, request: CloseVnode) -> Result<(), GroupError> {
        self.close_unless_reopened(request, None).await
    }

    /// `close_requested`, unless `opened` is given and the replica was
    /// opened (or asked to open) again since.
    async fn close_unless_reopened(
        &self,
        request: CloseVnode,
        opened: impl Into<Option<Instant>>,
    ) -> Result<(), GroupError> {
        let opened = opened.into();
        let me = self.config.node_id;
        if request.voters.contains(&me) {
            return Err(GroupError::config(ConfigProblem::StillAVoter {
                node: me,
                vnode: request.vnode,
            }));
        }
        // From now on this broker never initializes a group from the
        // formation's voters again (see `open`).
        self.mark_moved().await?;
        let _adopting = self.adopting.lock().await;
        let group_id = group_of(request.vnode);
        let Some(group) = self.registry.get(group_id) else {
            return Ok(());
        };
        if let Some(opened) = opened
            && self.opened_at.lock().get(&group_id) != Some(&opened)
        {
            return Ok(());
        }
        if group.is_leader() {
            return Err(GroupError::config(ConfigProblem::Leads {
                node: me,
                vnode: request.vnode,
            }));
        }
        group.shutdown().await?;
        self.registry.remove(group_id);
        self.opened_at.lock().remove(&group_id);
        let dir = self.group_dir(group_id);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::refused(Refusal::DirNotRemoved(Arc::new(e))))?;
        tracing::info!(node = me, vnode = %request.vnode, "left the group: replica closed and removed");
        Ok(())
    }

    /// Records, durably, that a group moved on or off this broker: from
    /// then on its start opens only the groups it has, or learns of, and
    /// never initializes one from the formation's voters, which would
    /// re-create a group this broker left (ADR 0104).
    async fn mark_moved(&self) -> Result<(), GroupError> {
        // One writer at a time: the record is written through one
        // temporary file.
        let mut marked = self.moved_marked.lock().await;
        let path = self.config.data_dir.join(MOVED_FILE);
        if *marked || path.exists() {
            *marked = true;
            return Ok(());
        }
        tokio::task::spawn_blocking(move || fsio::write_atomic(&path, b"groups moved\n"))
            .await
            .map_err(|e| GroupError::refused(Refusal::Task(Arc::new(e))))?
            .map_err(|e| GroupError::config(ConfigProblem::MovedNotRecorded(Arc::new(e))))?;
        *marked = true;
        Ok(())
    }

    fn group_dir(&self, group_id: u64) -> PathBuf {
        if group_id == RING_GROUP_ID {
            self.config.data_dir.join("ring")
        } else {
            self.config.data_dir.join(format!("vnode-{group_id}"))
        }
    }

    /// Closes the replicas this broker hosts but whose group's leader
    /// lists it no more (a close that was lost, or sent while this broker
    /// was down). Only replicas older than a membership step are judged,
    /// and only by a committed, settled membership, so a learner still
    /// being added, or a change that may roll back, is never mistaken for
    /// a removal.
    pub(crate) async fn sweep_left_groups(&self) {
        let me = self.config.node_id;
        let grace = Duration::from_millis(self.config.membership_step_timeout_ms);
        // Only replicas that are no voter by their own view: a voter is
        // removed by first becoming a learner (the change reaches it, as
        // learners are replicated to), so a voter has nothing to ask.
        let candidates: Vec<(u64, Instant)> = self
            .registry
            .all()
            .into_iter()
            .filter(|g| !g.is_leader() && !g.membership().voters.contains(&me))
            .map(|g| g.group_id())
            .filter_map(|id| {
                let at = *self.opened_at.lock().get(&id)?;
                (at.elapsed() >= grace).then_some((id, at))
            })
            .collect();
        for (group_id, opened) in candidates {
            let Some(vnode) = rebalance::vnode_of(group_id) else {
                continue;
            };
            let Ok(m) = self.membership_of(vnode).await else {
                continue;
            };
            let listed = m.voters.contains(&me) || m.learners.contains(&me);
            if listed || m.joint || !m.committed || m.leader == me {
                continue;
            }
            tracing::info!(node = me, %vnode, voters = ?m.voters, "this replica's group lists it no more; closing it");
            let request = CloseVnode {
                vnode,
                voters: m.voters,
            };
            if let Err(e) = self.close_unless_reopened(request, opened).await {
                tracing::info!(node = me, %vnode, error = %e, "a replica the group left was not closed");
            }
        }
    }

    /// Every group's membership from its leader (the vnodes of the ring
    /// this broker holds, and the ring's group, as `RING_VNODE`).
    pub async fn memberships(&self) -> Vec<(VnodeId, Result<VnodeMembership, RouteError>)> {
        let mut groups: Vec<VnodeId> = vec![RING_VNODE];
        groups.extend(self.ring().vnodes().map(|v| v.id));
        let mut out = Vec::with_capacity(groups.len());
        for chunk in groups.chunks(16) {
            let reads = chunk
                .iter()
                .map(|vnode| async move { (*vnode, self.membership_of(*vnode).await) });
            out.extend(futures::future::join_all(reads).await);
        }
        out
    }

    /// One group's membership from its leader.
    pub async fn membership_of(&self, vnode: VnodeId) -> Result<VnodeMembership, RouteError> {
        let query = encode_request(&Query::Membership, vnode)?;
        self.route_group(vnode, FORWARD_QUERY_API_KEY, &query).await
    }

    /// Whether `shutdown` has begun.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// How many hosted groups are quiet now (ADR 0101).
    pub fn quiet_groups(&self) -> usize {
        self.registry.all().iter().filter(|g| g.is_quiet()).count()
    }

    /// Fetches the current ring in the background until one answer arrives.
    fn spawn_ring_sync(self: &Arc<Self>) {
        let host = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut backoff = None;
            loop {
                let Some(strong) = host.upgrade() else { break };
                let backoff = backoff.get_or_insert_with(|| {
                    Backoff::new(
                        RING_SYNC_BACKOFF_MIN_MS,
                        RING_SYNC_BACKOFF_MAX_MS,
                        backoff_seed(strong.config.node_id, RING_GROUP_ID),
                    )
                });
                if strong.stopped.load(Ordering::Acquire) {
                    break;
                }
                match strong.refresh_ring().await {
                    Ok(ring) => {
                        tracing::debug!(
                            node = strong.config.node_id,
                            version = ring.version(),
                            "ring fetched"
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(node = strong.config.node_id, error = %e, "ring fetch failed; retrying")
                    }
                }
                drop(strong);
                tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
            }
        });
    }

    /// The groups whose replica here a write refused for want of space
    /// stopped, open or closed awaiting a reopen.
    pub fn stopped_by_full_volume(&self) -> BTreeSet<u64> {
        let mut stopped: BTreeSet<u64> = self
            .registry
            .all()
            .into_iter()
            .filter(MetadataGroup::stopped_by_full_volume)
            .map(|g| g.group_id())
            .collect();
        stopped.extend(self.closed_by_full_volume.lock().iter().copied());
        stopped
    }

    /// Reopens, from their files, this broker's replicas that a write
    /// refused for want of space stopped (`stopped_by_full_volume`), as a
    /// restart would: the caller knows the volume has room again. Returns
    /// how many were reopened; one that fails to open stays closed and is
    /// tried again at the next call.
    pub async fn reopen_stopped_by_full_volume(&self) -> usize {
        let stopped: Vec<MetadataGroup> = self
            .registry
            .all()
            .into_iter()
            .filter(MetadataGroup::stopped_by_full_volume)
            .collect();
        let closed: Vec<u64> = self.closed_by_full_volume.lock().iter().copied().collect();
        if stopped.is_empty() && closed.is_empty() {
            return 0;
        }
        let _adopting = self.adopting.lock().await;
        let mut reopened = 0;
        for group in stopped {
            let group_id = group.group_id();
            if let Err(e) = group.shutdown().await {
                tracing::debug!(group = group_id, error = %e, "a replica stopped by a full volume did not stop cleanly");
            }
            if self
                .registry
                .get(group_id)
                .is_some_and(|g| g.stopped_by_full_volume())
            {
                self.registry.remove(group_id);
            }
            self.closed_by_full_volume.lock().insert(group_id);
        }
        let pending: Vec<u64> = self.closed_by_full_volume.lock().iter().copied().collect();
        for group_id in pending {
            match self.open_group(group_id, None).await {
                Ok(()) => {
                    self.closed_by_full_volume.lock().remove(&group_id);
                    reopened += 1;
                    tracing::info!(
                        node = self.config.node_id,
                        group = group_id,
                        "reopened a raft replica a full volume had stopped"
                    );
                }
                Err(e) => {
                    tracing::warn!(group = group_id, error = %e, "cannot reopen a raft replica a full volume had stopped; trying again later");
                }
            }
        }
        reopened
    }

    /// Opens this broker's replica of a group if it is not hosted yet, and
    /// initializes a fresh one with `voters` if given (else it learns its
    /// membership from the leader). Callers hold `adopting`.
    async fn open_group(&self, group_id: u64, voters: Option<Vec<u64>>) -> Result<(), GroupError> {
        if self.registry.get(group_id).is_some() {
            return Ok(());
        }
        let mut group_config = self.config.group.clone();
        group_config.group_id = group_id;
        group_config.node_id = self.config.node_id;
        group_config.dir = self.group_dir(group_id);
        let group = MetadataGroup::open(group_config, self.transport.clone()).await?;
        // Opened parked where groups are paced by liveness: the quiescer
        // lets it campaign once a quorum of its voters is up and its turn
        // has come (ADR 0105). Opened ticking, thousands of groups
        // campaigned against peers that were still starting.
        if self.config.liveness.is_some() {
            group.set_parked(true);
        }
        self.registry.insert(group.clone());
        self.opened_at.lock().insert(group_id, Instant::now());
        self.groups_opened.send_modify(|n| *n += 1);
        match voters {
            Some(voters) => group.initialize(&voters).await,
            None => Ok(()),
        }
    }

    /// Opens this broker's replica of `vnode` (a split's child, known from
    /// a newer ring) if it belongs here: empty, to learn its membership
    /// from its leader. `Ok(false)` if it does not belong here.
    async fn open_vnode_locked(&self, vnode: VnodeId) -> Result<bool, GroupError> {
        if !self.target_voters(vnode).contains(&self.config.node_id) {
            return Ok(false);
        }
        self.open_group(vnode.group_id(), None).await?;
        Ok(true)
    }

    /// The voters of a vnode: its group's, as this broker's replica knows
    /// them, else where the members say they belong.
    pub fn voters(&self, vnode: VnodeId) -> Vec<u64> {
        if let Some(group) = self.registry.get(group_of(vnode)) {
            let voters: Vec<u64> = group.membership().voters.into_iter().collect();
            if !voters.is_empty() {
                return voters;
            }
        }
        self.target_voters(vnode)
    }

    /// The voters of the ring's own group.
    pub fn ring_voters(&self) -> Vec<u64> {
        self.voters(RING_VNODE)
    }

    /// The ring this broker believes current.
    pub fn ring(&self) -> Arc<Ring> {
        Arc::clone(&self.ring.read())
    }

    /// Routes by `ring` until a misrouted answer makes the router re-read
    /// the current ring. For tests of a broker whose ring lags.
    pub fn set_routing_ring(&self, ring: Ring) {
        *self.routing_ring.write() = Arc::new(ring);
    }

    /// Learns `ring` if it is newer than the one this broker holds: keeps it
    /// on disk, opens this broker's replicas of vnodes it adds, and routes by
    /// it from then on. Returns whether it was newer.
    pub async fn adopt_ring(&self, ring: Ring) -> Result<bool, GroupError> {
        let _adopting = self.adopting.lock().await;
        if ring.version() <= self.ring().version() {
            return Ok(false);
        }
        // Replicas first: once routing names a vnode, this broker should
        // already serve its raft messages. Computed by the new ring.
        let previous = std::mem::replace(&mut *self.ring.write(), Arc::new(ring.clone()));
        let opened = async {
            for vnode in ring.vnodes() {
                self.open_vnode_locked(vnode.id).await?;
            }
            Ok::<(), GroupError>(())
        }
        .await;
        if let Err(e) = opened {
            *self.ring.write() = previous;
            return Err(e);
        }
        let path = self.config.data_dir.join(RING_FILE);
        match ring.encode() {
            Ok(body) => {
                let written = tokio::task::spawn_blocking(move || {
                    let bytes = fsio::encode_tagged(RING_FILE_MAGIC, &body)?;
                    fsio::write_atomic(&path, &bytes)
                })
                .await;
                // The ring's group is the authority: a broker that cannot
                // keep its copy re-fetches it after a restart.
                if !matches!(written, Ok(Ok(()))) {
                    tracing::warn!(
                        node = self.config.node_id,
                        ?written,
                        "the learned ring was not kept on disk"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(node = self.config.node_id, error = %e, "the learned ring does not encode")
            }
        }
        tracing::info!(
            node = self.config.node_id,
            version = ring.version(),
            vnodes = ring.len(),
            "ring adopted"
        );
        let ring = Arc::new(ring);
        *self.ring.write() = Arc::clone(&ring);
        *self.routing_ring.write() = ring;
        self.update_probe_peers();
        Ok(true)
    }

    /// Fetches the current ring from the ring's group (creating it there,
    /// the same for every broker, if the group holds none yet) and adopts it.
    pub async fn refresh_ring(&self) -> Result<Arc<Ring>, RouteError> {
        let record = self.ring_record().await?;
        self.adopt_ring(record.ring)
            .await
            .map_err(|e| RouteError::Failed {
                vnode: RING_VNODE,
                reason: e.to_string(),
            })?;
        Ok(self.ring())
    }

    /// Called with the ring version another broker announces (membership
    /// gossip): fetches the current ring in the background if it is newer.
    pub fn observe_ring_version(self: &Arc<Self>, version: u64) {
        if version <= self.ring().version() || self.stopped.load(Ordering::Acquire) {
            return;
        }
        let host = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = host.refresh_ring().await {
                tracing::debug!(node = host.config.node_id, version, error = %e, "announced ring not fetched");
            }
        });
    }

    /// Tells every other broker that ring `version` exists, best effort:
    /// each fetches it in the background. Gossip and misrouted answers
    /// reach any broker this misses.
    pub async fn announce_ring(&self, version: u64) {
        let Ok(body) = rmp_serde::to_vec(&RingAnnounce { version }) else {
            return;
        };
        let peers: Vec<u64> = self
            .nodes()
            .into_iter()
            .filter(|n| *n != self.config.node_id)
            .collect();
        let calls = peers.iter().map(|node| {
            self.transport.call_raw(
                *node,
                RING_ANNOUNCE_API_KEY,
                RING_GROUP_ID,
                &body,
                self.config.forward_timeout_ms,
            )
        });
        for (node, result) in peers.iter().zip(futures::future::join_all(calls).await) {
            if let Err(e) = result {
                tracing::debug!(node, version, error = %e, "ring announcement not delivered");
            }
        }
    }

    /// The ring's group's record (the ring and any split in progress),
    /// read from its leader.
    pub async fn ring_record(&self) -> Result<RingRecord, RouteError> {
        let query = encode_request(&Query::Ring, RING_VNODE)?;
        for _ in 0..2 {
            let record: Option<RingRecord> = self
                .route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
                .await?;
            if let Some(record) = record {
                self.adopt_features(record.features.clone());
                return Ok(record);
            }
            // A fresh ring group: create the ring every broker starts from.
            let init = Command::InitRing {
                vnodes: self.config.vnode_count,
            };
            self.propose_ring(init)
                .await?
                .map_err(|e| RouteError::Failed {
                    vnode: RING_VNODE,
                    reason: e.to_string(),
                })?;
        }
        Err(RouteError::Failed {
            vnode: RING_VNODE,
            reason: "the ring group holds no ring after creating one".to_owned(),
        })
    }

    /// The cluster's cursor keys, read linearizably from the ring group's
    /// leader; `None` until a broker's bootstrap created them.
    pub async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, RouteError> {
        let query = encode_request(&Query::CursorKeys, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
            .await
    }

    /// Which of `segments` one vnode's metadata lists, read linearizably
    /// from its leader (ADR 0115).
    pub async fn segments_listed_by(
        &self,
        vnode: VnodeId,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        self.ask_listed(vnode, None, segments).await
    }

    /// Which of `segments`, all of `topic`, the topic's own vnode lists
    /// (ADR 0115): a vnode that does not hold the topic refuses, so "not
    /// listed" always comes from the one group that could list them.
    pub async fn topic_segments_listed(
        &self,
        topic: &str,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        let vnode = self.ring().owner(topic).id;
        self.ask_listed(vnode, Some(topic.to_owned()), segments)
            .await
    }

    async fn ask_listed(
        &self,
        vnode: VnodeId,
        topic: Option<String>,
        segments: &[u64],
    ) -> Result<Vec<u64>, RouteError> {
        let query = encode_request(
            &Query::ListsSegments {
                topic,
                segments: segments.to_vec(),
            },
            vnode,
        )?;
        self.route_group(vnode, FORWARD_QUERY_API_KEY, &query).await
    }

    /// Which of `segments` any vnode lists: every vnode of the ring, and
    /// the ring's own group, is asked (ADR 0115, the seed's orphan rule).
    /// Whole or nothing: a vnode that does not answer, or a ring that
    /// changes or has a split pending while they are asked, is an error,
    /// and then no id may be judged unlisted.
    pub async fn segments_listed(&self, segments: &[u64]) -> Result<SegmentListing, ListingError> {
        if segments.len() > LISTS_SEGMENTS_MAX {
            return Err(ListingError::TooMany {
                count: segments.len(),
            });
        }
        let silent = |vnode, source| ListingError::Silent { vnode, source };
        let before = self
            .ring_record()
            .await
            .map_err(|e| silent(RING_VNODE, e))?;
        if before.pending.is_some() {
            let v = before.ring.version();
            return Err(ListingError::RingMoved {
                before: v,
                after: v,
                pending: true,
            });
        }
        let mut vnodes: Vec<VnodeId> = before.ring.vnodes().map(|v| v.id).collect();
        vnodes.push(RING_VNODE);
        let mut listed = BTreeSet::new();
        for &vnode in &vnodes {
            let answer = self
                .segments_listed_by(vnode, segments)
                .await
                .map_err(|e| silent(vnode, e))?;
            listed.extend(answer);
        }
        let after = self
            .ring_record()
            .await
            .map_err(|e| silent(RING_VNODE, e))?;
        if after.ring.version() != before.ring.version() || after.pending.is_some() {
            return Err(ListingError::RingMoved {
                before: before.ring.version(),
                after: after.ring.version(),
                pending: after.pending.is_some(),
            });
        }
        Ok(SegmentListing {
            listed,
            vnodes_asked: vnodes.len(),
        })
    }

    /// The cluster's storage policies, read linearizably from the ring
    /// group's leader (ADR 0115). Defined and removed with `propose_ring`.
    pub async fn policies(
        &self,
    ) -> Result<std::collections::BTreeMap<String, malachi_core::model::StoragePolicy>, RouteError>
    {
        let query = encode_request(&Query::Policies, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
            .await
    }

    /// Applies a command in the ring's own group (`InitRing` and the split
    /// steps; `split_vnode` and `abort_split` are the usual way in).
    pub async fn propose_ring(&self, cmd: Command) -> Result<Verdict, RouteError> {
        let body = encode_request(&cmd, RING_VNODE)?;
        self.route_group(RING_VNODE, FORWARD_PROPOSE_API_KEY, &body)
            .await
    }

    /// The groups this broker hosts (for raft rpcs and status).
    pub fn registry(&self) -> &Arc<GroupRegistry> {
        &self.registry
    }

    /// This broker's replica of `vnode`, if it hosts one.
    pub fn group(&self, vnode: VnodeId) -> Option<MetadataGroup> {
        self.registry.get(vnode.group_id())
    }

    /// This broker's replica of the ring's group, if it hosts one.
    pub fn ring_group(&self) -> Option<MetadataGroup> {
        self.registry.get(RING_GROUP_ID)
    }

    /// The vnodes this broker leads now.
    pub fn led(&self) -> Vec<VnodeId> {
        self.registry
            .all()
            .into_iter()
            .filter(|g| g.is_leader())
            .filter_map(|g| u32::try_from(g.group_id()).ok().map(VnodeId))
            .collect()
    }

    /// The vnodes this broker leads, kept current: recomputed on every
    /// leadership change of a hosted group and at least every `poll_ms`
    /// (the slow timer that catches anything an event missed). The
    /// watching task ends when every receiver is dropped.
    pub fn watch_led(self: &Arc<Self>, poll_ms: u64) -> watch::Receiver<BTreeSet<VnodeId>> {
        let (tx, rx) = watch::channel(self.led().into_iter().collect());
        let changed = Arc::new(Notify::new());
        let mut opened = self.groups_opened.subscribe();
        let mut watched = BTreeSet::new();
        self.watch_new_groups(&mut watched, &changed);
        let host = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = changed.notified() => {}
                    // A group opened after the watch began (a split's child,
                    // a vnode a newer ring added): watch it too.
                    Ok(()) = opened.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(poll_ms)) => {}
                    _ = tx.closed() => break,
                }
                let Some(host) = host.upgrade() else { break };
                host.watch_new_groups(&mut watched, &changed);
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

    /// Forwards the leadership changes of hosted groups not in `watched`
    /// to `changed`, and adds them to `watched`.
    fn watch_new_groups(&self, watched: &mut BTreeSet<u64>, changed: &Arc<Notify>) {
        for group in self.registry.all() {
            if !watched.insert(group.group_id()) {
                continue;
            }
            let mut leader = group.watch_leader();
            let changed = Arc::clone(changed);
            tokio::spawn(async move {
                while leader.changed().await.is_ok() {
                    changed.notify_one();
                }
            });
        }
    }

    /// Applies `cmd` on the vnode owning its topic, wherever its leader is.
    pub async fn propose(&self, cmd: Command) -> Result<Verdict, RouteError> {
        let topic = cmd.topic().ok_or(RouteError::Unroutable)?.to_owned();
        let body = encode_request(&cmd, VnodeId(0))?;
        self.route(&topic, FORWARD_PROPOSE_API_KEY, body).await
    }

    /// A linearizable description of `topic` from its vnode's leader.
    pub async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, RouteError> {
        let body = encode_request(
            &ReadRequest {
                topic: topic.to_owned(),
            },
            VnodeId(0),
        )?;
        let answer: ReadAnswer = self.route(topic, FORWARD_READ_API_KEY, body).await?;
        // Still refused once `moved_wait_ms` ran out: no ring this broker
        // could fetch leads to a vnode serving the topic.
        answer.map_err(|refused| RouteError::Unavailable {
            vnode: self.routing_ring.read().owner(topic).id,
            attempts: self.config.route_attempts_max,
            last: refused.to_string(),
        })
    }

    /// Sends `cmd` to `vnode` without consulting the ring: the path a
    /// broker with a wrong ring takes (the vnode's own arc check answers),
    /// and the path of commands that name no topic (leases, split steps).
    pub async fn propose_to(&self, vnode: VnodeId, cmd: Command) -> Result<Verdict, RouteError> {
        let body = encode_request(&cmd, vnode)?;
        self.route_group(vnode, FORWARD_PROPOSE_API_KEY, &body)
            .await
    }

    /// Routes by the ring, following misrouted answers (`WrongVnode`: the
    /// vnode no longer owns the topic; `Moved`: a split is moving it) to
    /// the current ring, for at most `moved_wait_ms`.
    async fn route<T: serde::de::DeserializeOwned + RefusesRoute>(
        &self,
        topic: &str,
        api_key: u16,
        body: Vec<u8>,
    ) -> Result<T, RouteError> {
        let deadline = Instant::now() + Duration::from_millis(self.config.moved_wait_ms);
        let mut backoff = self.route_backoff(xxhash_rust::xxh3::xxh3_64(topic.as_bytes()));
        loop {
            let routing = Arc::clone(&self.routing_ring.read());
            let vnode = routing.owner(topic).id;
            let answer = self.route_group::<T>(vnode, api_key, &body).await?;
            if !answer.is_misrouted() {
                return Ok(answer);
            }
            if Instant::now() >= deadline {
                return Ok(answer);
            }
            let current = self.ring();
            if !Arc::ptr_eq(&current, &routing) {
                // This broker already knows a newer ring than it routed by.
                tracing::info!(%vnode, topic, version = current.version(), "misrouted: routing by the current ring");
                *self.routing_ring.write() = current;
                continue;
            }
            tracing::info!(%vnode, topic, version = routing.version(), "misrouted: fetching the ring");
            match self.refresh_ring().await {
                Ok(fetched) => *self.routing_ring.write() = Arc::clone(&fetched),
                Err(e) => tracing::debug!(%vnode, error = %e, "ring fetch failed"),
            }
            if self.ring().version() == routing.version() {
                // A split is between its fence and its ring commit (or the
                // ring group is out of reach): wait for it.
                tokio::time::sleep(Duration::from_millis(backoff.next_delay_ms())).await;
            }
        }
    }

    /// The backoff of one re-routing loop about `subject` (a group, a
    /// topic): exponential with jitter, seeded by this node and the subject.
    pub(crate) fn route_backoff(&self, subject: u64) -> Backoff {
        Backoff::new(
            self.config.route_retry_backoff_ms,
            self.config.route_retry_backoff_max_ms,
            backoff_seed(self.config.node_id, subject),
        )
    }

    /// Sends a request to the leader of `vnode`'s group (or of the ring's
    /// group for `RING_VNODE`), following `NotLeader` hints and trying the
    /// group's voters in turn, for at most `route_attempts_max` attempts.
    async fn route_group<T: serde::de::DeserializeOwned>(
        &self,
        vnode: VnodeId,
        api_key: u16,
        body: &[u8],
    ) -> Result<T, RouteError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(RouteError::Stopped);
        }
        let group_id = group_of(vnode);
        let mut voters = self.voters(vnode);
        if voters.is_empty() {
            voters = self.nodes();
        }
        let mut target = self
            .registry
            .get(group_id)
            .and_then(|g| g.leader_term().0)
            .unwrap_or(voters[0]);
        let mut last = String::from("no attempt");
        // Set once an attempt may have applied the request: from then on a
        // final failure is `OutcomeUnknown`, never a refusal.
        let mut uncertain: Option<String> = None;
        let mut next_voter = 0usize;
        let mut backoff = self.route_backoff(group_id);
        let mut redirects = Redirects::default();
        let deadline = Instant::now() + Duration::from_millis(self.config.route_timeout_ms);
        let mut attempts = 0;
        for attempt in 1..=self.config.route_attempts_max {
            attempts = attempt;
            let mut pause_at = None;
            let answer: Forwarded<T> = if target == self.config.node_id {
                self.serve_local(api_key, group_id, body).await
            } else {
                self.forward_to(target, api_key, group_id, body, &mut last)
                    .await
            };
            match answer {
                Forwarded::Done(value) => return Ok(value),
                Forwarded::Failed { reason } => {
                    return Err(settle(
                        vnode,
                        uncertain,
                        RouteError::Failed { vnode, reason },
                    ));
                }
                Forwarded::Unknown { leader, reason } => {
                    tracing::debug!(%vnode, attempt, target, %reason, "metadata request outcome unknown");
                    last = reason.clone();
                    uncertain = Some(reason);
                    if let Some(leader) = leader
                        && leader != target
                    {
                        if redirects.fresh(target, leader) {
                            target = leader;
                            continue;
                        }
                        pause_at = Some(leader);
                    }
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
                Forwarded::NotLeader { .. } => {
                    if last == "no attempt" {
                        last = format!("node {target} knows no leader");
                    }
                }
                Forwarded::Retry { reason } => last = reason,
            }
            tracing::debug!(%vnode, attempt, target, %last, "metadata request re-routed");
            // No leader known here, or replicas naming each other while an
            // election settles: pause so it can finish, then ask the named
            // leader again, or else the voters in turn.
            target = pause_at.unwrap_or_else(|| {
                next_voter += 1;
                voters[(next_voter - 1) % voters.len()]
            });
            redirects.paused();
            let pause = Duration::from_millis(backoff.next_delay_ms());
            if Instant::now() + pause >= deadline {
                last = format!("{last} (gave up after {} ms)", self.config.route_timeout_ms);
                break;
            }
            tokio::time::sleep(pause).await;
        }
        Err(settle(
            vnode,
            uncertain,
            RouteError::Unavailable {
                vnode,
                attempts,
                last,
            },
        ))
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
            Err(e) => {
                return Forwarded::Failed {
                    reason: e.to_string(),
                };
            }
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
    ) -> Result<Vec<u8>, RpcError> {
        let codec = |what: &'static str| {
            move |e: rmp_serde::decode::Error| RpcError::Decode {
                what,
                source: Arc::new(e),
            }
        };
        if api_key == RING_ANNOUNCE_API_KEY {
            let announced: RingAnnounce =
                rmp_serde::from_slice(body).map_err(codec("a ring announce"))?;
            if let Some(host) = self.this.upgrade() {
                host.observe_ring_version(announced.version);
            }
            return encode(&Forwarded::Done(()));
        }
        if api_key == OPEN_VNODE_API_KEY {
            let request: OpenVnode =
                rmp_serde::from_slice(body).map_err(codec("an open vnode request"))?;
            let answer = match self.open_requested(request.vnode, request.voters).await {
                Ok(()) => Forwarded::Done(()),
                Err(e) => forwarded_error(e),
            };
            return encode(&answer);
        }
        if api_key == CLOSE_VNODE_API_KEY {
            let request: CloseVnode =
                rmp_serde::from_slice(body).map_err(codec("a close vnode request"))?;
            let answer = match self.close_requested(request).await {
                Ok(()) => Forwarded::Done(()),
                Err(e) => forwarded_error(e),
            };
            return encode(&answer);
        }
        let Some(group) = self.registry.get(group_id) else {
            // Not a replica: no leader to name.
            return encode(&Forwarded::<()>::NotLeader { leader: None });
        };
        match api_key {
            FORWARD_PROPOSE_API_KEY => {
                let cmd: Command =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded command"))?;
                let answer = match self.propose_here(&group, group_id, cmd).await {
                    Ok(verdict) => Forwarded::Done(verdict),
                    Err(e) => proposal_error(e),
                };
                encode(&answer)
            }
            FORWARD_READ_API_KEY => {
                let request: ReadRequest =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded read"))?;
                let read = group
                    .read(move |s| {
                        s.check_topic_route(&request.topic)
                            .map(|()| s.describe_topic(&request.topic))
                    })
                    .await;
                // Outside the arc, or being moved by a split, the answer is
                // the refusal: a reader routing by an older ring must not
                // take "absent" here for an answer.
                let answer: Forwarded<ReadAnswer> = match read {
                    Ok(answer) => Forwarded::Done(answer),
                    Err(e) => forwarded_error(e),
                };
                encode(&answer)
            }
            FORWARD_QUERY_API_KEY => {
                let query: Query =
                    rmp_serde::from_slice(body).map_err(codec("a forwarded query"))?;
                match query {
                    Query::Ring => {
                        let answer = match group.read(|s| s.ring_record().cloned()).await {
                            Ok(record) => Forwarded::Done(record),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Membership => {
                        // The leader's own view, without a read-index
                        // round: cheap enough for every broker to ask every
                        // so often. A deposed leader's answer is at worst
                        // stale, and its `committed` flag then names a
                        // membership a quorum once held, which is all a
                        // reader acts on (`sweep_left_groups`).
                        let answer = if group.is_leader() {
                            let m: GroupMembership = group.membership();
                            Forwarded::Done(VnodeMembership {
                                leader: self.config.node_id,
                                voters: m.voters.into_iter().collect(),
                                learners: m.learners.into_iter().collect(),
                                joint: m.joint,
                                committed: m.committed,
                            })
                        } else {
                            Forwarded::NotLeader {
                                leader: group.leader_term().0,
                            }
                        };
                        encode(&answer)
                    }
                    Query::ListsSegments { topic, segments } => {
                        let read = group
                            .read(move |s| {
                                if let Some(topic) = &topic {
                                    s.check_topic_route(topic)?;
                                }
                                Ok::<_, ModelError>(
                                    segments
                                        .into_iter()
                                        .filter(|id| {
                                            s.segment(malachi_core::model::SegmentId(*id)).is_some()
                                        })
                                        .collect::<Vec<u64>>(),
                                )
                            })
                            .await;
                        let answer = match read {
                            Ok(Ok(listed)) => Forwarded::Done(listed),
                            Ok(Err(refused)) => Forwarded::Failed {
                                reason: refused.to_string(),
                            },
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Policies => {
                        let answer = match group.read(|s| s.policies().clone()).await {
                            Ok(policies) => Forwarded::Done(policies),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::CursorKeys => {
                        let answer = match group.read(|s| s.cursor_keys().cloned()).await {
                            Ok(keys) => Forwarded::Done(keys),
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                    Query::Export { arc, id_base } => {
                        let read = group
                            .read(move |s| {
                                (s.fence() == Some(arc)).then(|| s.export_arc(arc, id_base))
                            })
                            .await;
                        let answer = match read {
                            Ok(Some(seed)) => Forwarded::Done(seed),
                            Ok(None) => Forwarded::Failed {
                                reason: format!("the arc {arc} is not fenced; nothing exported"),
                            },
                            Err(e) => forwarded_error(e),
                        };
                        encode(&answer)
                    }
                }
            }
            other => Err(RpcError::NotForwarded { api_key: other }),
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
        self.stopped.store(true, Ordering::Release);
        for task in self.background.lock().drain(..) {
            task.abort();
        }
        let groups = self.registry.all();
        // Every group refuses calls and peers' answers first, so their
        // grace periods overlap: the host's stop waits out one, not one
        // per group.
        for group in &groups {
            group.begin_shutdown();
        }
        for group in groups {
            let id = group.group_id();
            if let Err(e) = group.shutdown().await {
                tracing::warn!(group = id, error = %e, "vnode group did not shut down cleanly");
            }
            self.registry.remove(id);
        }
    }
}

/// The ring a broker kept on disk, if it reads back whole.
fn load_ring(path: &Path) -> Option<Ring> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is unreadable; fetching it");
            return None;
        }
    };
    let body = match fsio::decode_tagged(RING_FILE_MAGIC, &bytes, RING_FILE_BYTES_MAX) {
        Ok(body) => body,
        Err(e) => {
            // Only a cache of the ring group's ring: start from the fresh
            // ring and fetch the current one.
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is damaged; fetching it");
            return None;
        }
    };
    match Ring::decode(body) {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the kept ring is damaged; fetching it");
            None
        }
    }
}

/// The vnodes whose group directories exist under `data_dir`.
fn vnode_dirs(data_dir: &Path) -> Vec<VnodeId> {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|name| name.strip_prefix("vnode-"))
                .and_then(|id| id.parse::<u32>().ok())
        })
        .filter(|id| *id < malachi_core::ring::VNODES_MAX)
        .map(VnodeId)
        .collect()
}

/// The raft group a vnode's metadata lives in (`RING_VNODE`: the ring's).
fn group_of(vnode: VnodeId) -> u64 {
    if vnode == RING_VNODE {
        RING_GROUP_ID
    } else {
        vnode.group_id()
    }
}

fn encode_request<T: Serialize>(value: &T, vnode: VnodeId) -> Result<Vec<u8>, RouteError> {
    rmp_serde::to_vec(value).map_err(|e| RouteError::Failed {
        vnode,
        reason: e.to_string(),
    })
}

/// Whether an answer is a vnode's refusal of a topic it does not (or no
/// longer) serve: outside its arc, or in a part a split is moving.
trait RefusesRoute {
    fn is_misrouted(&self) -> bool;
}

impl RefusesRoute for Verdict {
    fn is_misrouted(&self) -> bool {
        matches!(self, Err(e) if e.is_misrouted())
    }
}

impl RefusesRoute for ReadAnswer {
    fn is_misrouted(&self) -> bool {
        matches!(self, Err(e) if e.is_misrouted())
    }
}

impl<T> Forwarded<T> {
    fn noting(self, last: &mut String, reason: String) -> Forwarded<T> {
        *last = reason;
        self
    }
}

impl VnodeHost {
    /// Sends a request to `target`'s forwarding service and decodes its
    /// answer. A transport failure reads as "no leader known", with its
    /// reason kept in `last` for the final error.
    async fn forward_to<T: serde::de::DeserializeOwned>(
        &self,
        target: u64,
        api_key: u16,
        group_id: u64,
        body: &[u8],
        last: &mut String,
    ) -> Forwarded<T> {
        match self
            .transport
            .call_raw(
                target,
                api_key,
                group_id,
                body,
                self.config.forward_timeout_ms,
            )
            .await
        {
            Ok(bytes) => rmp_serde::from_slice(&bytes).unwrap_or_else(|e| Forwarded::Retry {
                reason: format!("undecodable answer: {e}"),
            }),
            // A proposal whose connection failed may have reached the
            // leader before it did: its outcome is unknown.
            Err(e @ TransportError::Network { .. }) if api_key == FORWARD_PROPOSE_API_KEY => {
                Forwarded::Unknown {
                    leader: None,
                    reason: e.to_string(),
                }
            }
            Err(
                e @ (TransportError::Unreachable { .. }
                | TransportError::Network { .. }
                | TransportError::Remote { .. }),
            ) => Forwarded::NotLeader { leader: None }.noting(last, e.to_string()),
        }
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

/// How a route that failed ends: as `OutcomeUnknown` if an earlier attempt
/// may have applied the request, else as `failed`.
fn settle(vnode: VnodeId, uncertain: Option<String>, failed: RouteError) -> RouteError {
    match uncertain {
        Some(reason) => RouteError::OutcomeUnknown { vnode, reason },
        None => failed,
    }
}

/// A proposal's failure as it travels back: one that may still commit
/// (timed out, or discarded by a leader change) is `Unknown`, so the router
/// can tell it from a refusal.
fn proposal_error<T>(e: GroupError) -> Forwarded<T> {
    match e {
        GroupError::Discarded { leader } => Forwarded::Unknown {
            leader,
            reason: e.to_string(),
        },
        GroupError::Timeout => Forwarded::Unknown {
            leader: None,
            reason: "the proposal timed out".to_owned(),
        },
        other => forwarded_error(other),
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, RpcError> {
    rmp_serde::to_vec(value).map_err(|e| RpcError::Encode {
        what: "a forwarded answer",
        source: Arc::new(e),
    })
}

#[async_trait::async_trait]
impl RpcService for VnodeHost {
    async fn serve(&self, api_key: u16, group_id: u64, body: Bytes) -> Result<Vec<u8>, RpcError> {
        // A stopping host's groups are shutting down: answer for them,
        // rather than hand a peer's heartbeat to a stopped raft (which
        // logs it as an error).
        if self.stopped.load(Ordering::Acquire) {
            return Err(RpcError::Group(crate::group::GroupError::Stopped));
        }
        match api_key {
            FORWARD_PROPOSE_API_KEY
            | FORWARD_READ_API_KEY
            | FORWARD_QUERY_API_KEY
            | OPEN_VNODE_API_KEY
            | CLOSE_VNODE_API_KEY
            | RING_ANNOUNCE_API_KEY => self.serve_forwarded(api_key, group_id, &body).await,
            _ => self.registry.serve_raft(api_key, group_id, &body).await,
        }
    }
}

/// The replicas a routed request was redirected between since its last
/// pause. A redirect back to one of them is a cycle (two replicas naming
/// each other as leader while an election settles, e.g. a restarted
/// ex-leader and followers that still name it): it pauses like a missing
/// leader instead of spending every attempt at once.
#[derive(Debug, Default)]
pub(crate) struct Redirects {
    since_pause: Vec<u64>,
}

impl Redirects {
    /// Whether following `from`'s redirect to `to` is new since the last
    /// pause (follow it at once) rather than a cycle (pause first).
    pub(crate) fn fresh(&mut self, from: u64, to: u64) -> bool {
        if self.since_pause.contains(&to) {
            return false;
        }
        self.since_pause.push(from);
        self.since_pause.push(to);
        true
    }

    /// A pause happened: redirects may be followed at once again.
    pub(crate) fn paused(&mut self) {
        self.since_pause.clear();
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
