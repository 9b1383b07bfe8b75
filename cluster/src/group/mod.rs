//! A metadata raft group: the model's `MetadataState` replicated by openraft
//! with its log, vote and snapshots on disk.
//!
//! `MetadataGroup` is the only door. openraft (pinned at an alpha) is used
//! inside this module tree and none of its types cross the public API, so an
//! openraft bump touches only `group/`. Today a broker runs one group with a
//! single voter (`open_single`); later each vnode is a group, addressed by
//! `GroupConfig::group_id` over a `GroupTransport`.
//!
//! Failure policy (docs/design/decisions §2): a storage error stops the raft
//! node for good. The group logs it as fatal and answers every later call
//! with `GroupError::Fatal`; this handle never restarts it. Its owner
//! does (ADR 0135): the vnode host replaces a replica found `fatal` by
//! reopening it from its files, as a restart would, and the `vnodes`
//! actor escalates a reopen that fails, so a dead group never stays
//! behind a running tree. A write refused for want of space
//! (`stopped_by_full_volume`) wrote nothing acknowledged; the vnode host
//! reopens such a replica only once space returns (ADR 0111).
//!
//! Architecture invariant: the state machine applies commands through
//! `MetadataState::apply` only, in log order, so replicas that apply the same
//! log hold byte-identical snapshots.

mod backoff;
mod error;
mod frames;
pub(crate) mod fsio;
pub mod handshake;
pub mod liveness;
mod log_store;
mod network;
pub mod peer_tls;
pub mod reach;
mod runtime;
mod state_machine;
mod tcp;
mod types;
pub mod untrusted;

pub use backoff::{Backoff, backoff_delay_ms, backoff_seed};
pub use error::{
    CodecError, ConfigProblem, Corruption, FatalCause, GroupError, RaftFault, Refusal,
};
pub use frames::{FRAME_READ_CHUNK_BYTES, FrameReadError, read_frame};
pub use fsio::TaggedError;
pub use handshake::{ClusterCookie, HandshakeError};
pub use network::{
    GroupTransport, NetworkFault, RaftRpcKind, TransportError, UnreachableCause,
    UnreachableTransport,
};
pub use peer_tls::{
    Accepted, CertifiedNodes, PLAINTEXT_SNIFF_MS, PeerTls, PeerTlsMode, PeerTlsObserver, TlsRefusal,
};
pub use reach::{
    DialOutcome, PeerReach, Reach, ReachChange, ReachObserver, ReachSettings, ReachTracker,
};
pub use tcp::{
    CLOSE_VNODE_API_KEY, FORWARD_PROPOSE_API_KEY, FORWARD_QUERY_API_KEY, FORWARD_READ_API_KEY,
    GroupRegistry, OPEN_VNODE_API_KEY, PING_API_KEY, RAFT_CONNECTIONS_MAX_DEFAULT,
    RAFT_FRAME_BYTES_MAX_DEFAULT, RAFT_FRAME_READ_TIMEOUT_MS_DEFAULT,
    RAFT_HANDSHAKE_TIMEOUT_MS_DEFAULT, RAFT_REFUSAL_LOG_INTERVAL_MS_DEFAULT, RING_ANNOUNCE_API_KEY,
    RpcError, RpcService, TcpTransport, TcpTransportConfig, TransportServer, TransportServerConfig,
    TransportServerStats, raft_api_key, raft_kind_of,
};

use error::{fatal_error, initialize_error};
use log_store::{LogStore, OpenError};
use malachi_core::model::{Command, MetadataState, ModelError, Outcome};
use network::{FullSnapshotRequest, NetworkFactory};
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, Fatal, ForwardReason, LinearizableReadError, RaftError};
use openraft::{BasicNode, Raft, ReadPolicy, ServerState, SnapshotPolicy};
use state_machine::{Shared, StateMachine};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use types::{Request, TypeConfig};

/// How often `snapshot_now` repeats its trigger while it waits.
const SNAPSHOT_RETRIGGER_MS: u64 = 250;

/// How long a stopping group's raft core keeps running after the stop
/// began (`MetadataGroup::begin_shutdown`): an answer a heartbeat worker or
/// replication stream took just before it reaches the core, rather than a
/// core that is gone (which openraft logs as an error). The worker may have
/// been descheduled in between (tokio's cooperative budget, a full
/// notification channel), so this narrows a race it cannot close.
const SHUTDOWN_GRACE_MS: u64 = 20;

/// How one group is opened. `GroupConfig::new` fills every tunable with its
/// default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// The group's id; stored in its log header and carried by the transport.
    pub group_id: u64,
    /// This replica's raft node id.
    pub node_id: u64,
    /// The directory holding the group's `log`, `vote` and `snapshot`.
    pub dir: PathBuf,
    /// The shortest election timeout.
    pub election_timeout_min_ms: u64,
    /// The longest election timeout; must exceed the minimum.
    pub election_timeout_max_ms: u64,
    /// The leader's heartbeat period; must be below the minimum election timeout.
    pub heartbeat_interval_ms: u64,
    /// A snapshot is built after this many entries applied since the last.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot (for lagging followers).
    pub log_entries_kept_after_snapshot: u64,
    /// How long `open_single` waits for leadership and a caught-up state.
    pub open_timeout_ms: u64,
    /// How long `propose` and `read` wait before `GroupError::Timeout`.
    pub request_timeout_ms: u64,
    /// The largest encoded log entry.
    pub entry_bytes_max: u64,
    /// The largest snapshot file body.
    pub snapshot_bytes_max: u64,
}

impl GroupConfig {
    /// A config with default tunables.
    pub fn new(group_id: u64, node_id: u64, dir: impl Into<PathBuf>) -> GroupConfig {
        GroupConfig {
            group_id,
            node_id,
            dir: dir.into(),
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            heartbeat_interval_ms: 100,
            snapshot_every_entries: 1024,
            log_entries_kept_after_snapshot: 0,
            open_timeout_ms: 10_000,
            request_timeout_ms: 5_000,
            entry_bytes_max: 4 * 1024 * 1024,
            snapshot_bytes_max: 1024 * 1024 * 1024,
        }
    }

    fn raft_config(&self) -> Result<openraft::Config, GroupError> {
        let config = openraft::Config {
            cluster_name: format!("malachi-metadata-{}", self.group_id),
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            heartbeat_interval: self.heartbeat_interval_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries.max(1)),
            max_in_snapshot_log_to_keep: self.log_entries_kept_after_snapshot,
            // A candidate first asks whether it would win (ADR 0101): a
            // quiet replica refuses while it believes its leader alive, so
            // an election needs the leader to be gone, not merely silent.
            enable_pre_vote: Some(true),
            // A restarted leader must win a new election, never resume its
            // old term. The state machine is rebuilt by replaying the log
            // and the commit index is not persisted, so a resumed leader
            // would not know which of its entries were committed: its read
            // index (its term's first entry, or the commit it has learned
            // since the restart) can lie below writes it acknowledged before
            // the restart, and a linearizable read would miss them. A new
            // term's blank entry, once committed, covers every one of them.
            // openraft documents this hazard of `enable_leader_restore`.
            enable_leader_restore: Some(false),
            // Per-entry stage timestamps are openraft diagnostics we never
            // read; each of their six ring buffers is preallocated at this
            // capacity (1,024 by default: ~150 KB per group, 600 MB at
            // 4,096 vnodes). ADR 0105.
            log_stage_capacity: Some(LOG_STAGE_CAPACITY),
            ..Default::default()
        };
        config
            .validate()
            .map_err(|e| GroupError::config(ConfigProblem::Raft(e.into())))
    }
}

/// Who leads a group, as one replica sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaderView {
    pub term: u64,
    pub leader: Option<u64>,
    /// Whether this replica is the leader.
    pub is_leader: bool,
}

/// A point-in-time view of the group's raft state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    pub group_id: u64,
    pub node_id: u64,
    pub term: u64,
    pub leader: Option<u64>,
    pub is_leader: bool,
    /// The index of the last entry the state machine applied.
    pub last_applied: Option<u64>,
    /// The index of the last committed entry this node knows of.
    pub committed: Option<u64>,
    /// The index the latest snapshot covers.
    pub snapshot: Option<u64>,
    /// The voters of the current membership.
    pub voters: Vec<u64>,
}

/// The capacity of each of openraft's per-entry stage-timestamp ring buffers
/// (diagnostics only; see `raft_config`).
const LOG_STAGE_CAPACITY: u64 = 8;

/// How far behind the leader's log a learner may be and still be made a
/// voter: under writes a learner is always a few entries behind.
pub const LEARNER_LAG_ENTRIES_MAX: u64 = 64;

/// A group's membership as one replica knows it (ADR 0104).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMembership {
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// Learners more than `LEARNER_LAG_ENTRIES_MAX` entries behind the
    /// leader's log (as the leader sees it; empty elsewhere): not promoted
    /// until they catch up.
    pub lagging: BTreeSet<u64>,
    /// A joint change is under way (or was left half done).
    pub joint: bool,
    /// The membership's entry is committed as far as this replica knows.
    pub committed: bool,
}

/// The inputs of the quiet decision (`vnodes::quiet`), as one replica sees
/// its group now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPace {
    /// The group's id.
    pub group_id: u64,
    /// This replica's node id.
    pub node_id: u64,
    /// The term this replica is in.
    pub term: u64,
    /// Whether this replica leads.
    pub is_leader: bool,
    /// The leader this replica knows of.
    pub leader: Option<u64>,
    /// The voters of the membership in effect.
    pub voters: Vec<u64>,
    /// On a leader, the other voters whose matched log is behind its last
    /// entry; empty elsewhere.
    pub behind: Vec<u64>,
    /// Whether the raft node runs (not stopped, not fatally failed).
    pub running: bool,
}

/// Numbers every group opened in this process (`MetadataGroup::serial`).
static GROUPS_OPENED: AtomicU64 = AtomicU64::new(0);

struct Inner {
    raft: Raft<TypeConfig, StateMachine>,
    /// Tells this opening of the group from a later reopening of the same
    /// group id (after a fatal stop, a full volume, a move away and back).
    serial: u64,
    shared: Arc<Shared>,
    config: GroupConfig,
    stopped: AtomicBool,
    /// Cancelled as the stop begins, before raft's core stops: every call
    /// in flight into raft returns `GroupError::Stopped` at once, and the
    /// group's network hands no more answers to raft (`network::Peer`).
    stopping: CancellationToken,
    /// When the stop began: the core stops `SHUTDOWN_GRACE_MS` later.
    stopping_since: std::sync::OnceLock<tokio::time::Instant>,
    /// Whether `shutdown` stopped (or is stopping) the raft core.
    core_stopped: AtomicBool,
    /// Whether the group is quiet (ADR 0101): its raft ticker is parked (no
    /// heartbeats, no election timer) and it refuses pre-votes from anyone
    /// but the leader it believes alive.
    quiet: AtomicBool,
    /// Whether the group's election timer is parked because this replica
    /// should not campaign now (`vnodes::quiet::campaign_wanted`). Unlike
    /// `quiet`, it refuses no pre-vote.
    parked: AtomicBool,
    /// Set when the log store's write failed for want of space.
    log_no_space: Arc<AtomicBool>,
    /// The log store raft owns, kept so tests can fail its disk.
    #[cfg(any(test, feature = "testing"))]
    log: LogStore,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataGroup")
            .field("group_id", &self.config.group_id)
            .field("node_id", &self.config.node_id)
            .field("dir", &self.config.dir)
            .finish_non_exhaustive()
    }
}

/// A handle to one metadata raft group. Clones share the group.
#[derive(Debug, Clone)]
pub struct MetadataGroup {
    inner: Arc<Inner>,
}

impl MetadataGroup {
    /// Whether a write of this replica's log or snapshot failed for want of
    /// space, which stopped it. Nothing it failed to write was
    /// acknowledged, so once space returns the replica can be reopened from
    /// its files (a torn tail is cut as after a crash), unlike a replica
    /// whose disk failed otherwise (see the failure policy above).
    pub fn stopped_by_full_volume(&self) -> bool {
        self.inner.log_no_space.load(Ordering::SeqCst)
            || self.inner.shared.no_space.load(Ordering::SeqCst)
    }

    /// The directory holding this replica's files.
    pub fn dir(&self) -> &std::path::Path {
        &self.inner.config.dir
    }

    /// Opens (or creates) the on-disk log, vote and snapshot in `dir`. On a
    /// fresh dir it initializes a single-voter membership `{node_id}`; on an
    /// existing dir it recovers. Returns once this node is leader and the
    /// state machine has applied everything committed, or
    /// `GroupError::Timeout` after `open_timeout_ms`.
    pub async fn open_single(config: GroupConfig) -> Result<MetadataGroup, GroupError> {
        let group = MetadataGroup::open(config, Arc::new(UnreachableTransport)).await?;
        if let Err(err) = group.bootstrap_single().await {
            // Do not leave a raft task running behind a failed open. The
            // bootstrap's error is the one to report; a failed shutdown of
            // a group that never served adds nothing to it.
            let _ = group.shutdown().await;
            return Err(err);
        }
        Ok(group)
    }

    /// Opens the group's storage and starts its raft node over `transport`
    /// without initializing a membership or waiting for a leader. A
    /// multi-voter group is formed on top of this with `initialize`.
    pub async fn open(
        config: GroupConfig,
        transport: Arc<dyn GroupTransport>,
    ) -> Result<MetadataGroup, GroupError> {
        let raft_config = Arc::new(config.raft_config()?);
        // Reading and creating the files blocks (reads, fsyncs): off the
        // async workers, so a broker opening many groups at once opens
        // them side by side (ADR 0105).
        let (dir, group_id) = (config.dir.clone(), config.group_id);
        let (entry_bytes_max, snapshot_bytes_max) =
            (config.entry_bytes_max, config.snapshot_bytes_max);
        let (log, sm) = tokio::task::spawn_blocking(move || {
            let log = LogStore::open(&dir, group_id, entry_bytes_max)?;
            let sm = StateMachine::open(&dir, group_id, snapshot_bytes_max)?;
            Ok::<_, OpenError>((log, sm))
        })
        .await
        .map_err(|e| GroupError::Fatal {
            cause: FatalCause::OpenPanicked(Arc::new(e)),
        })??;
        let shared = sm.shared();
        let log_no_space = log.no_space();
        #[cfg(any(test, feature = "testing"))]
        let log_handle = log.clone();
        let stopping = CancellationToken::new();
        let network = NetworkFactory {
            group_id: config.group_id,
            transport,
            stopping: stopping.clone(),
        };
        let raft = Raft::new(config.node_id, raft_config, network, log, sm)
            .await
            .map_err(|e| fatal_error(&e))?;
        tracing::info!(group = config.group_id, node = config.node_id, dir = %config.dir.display(), "metadata group opened");
        Ok(MetadataGroup {
            inner: Arc::new(Inner {
                raft,
                serial: GROUPS_OPENED.fetch_add(1, Ordering::Relaxed),
                shared,
                config,
                stopped: AtomicBool::new(false),
                stopping,
                stopping_since: std::sync::OnceLock::new(),
                core_stopped: AtomicBool::new(false),
                quiet: AtomicBool::new(false),
                parked: AtomicBool::new(false),
                log_no_space,
                #[cfg(any(test, feature = "testing"))]
                log: log_handle,
            }),
        })
    }

    async fn bootstrap_single(&self) -> Result<(), GroupError> {
        let raft = &self.inner.raft;
        let node_id = self.inner.config.node_id;
        let timeout_ms = self.inner.config.open_timeout_ms;
        let initialized = raft.is_initialized().await.map_err(|e| fatal_error(&e))?;
        if !initialized {
            let members = BTreeMap::from([(node_id, BasicNode::default())]);
            raft.initialize(members).await.map_err(initialize_error)?;
            tracing::info!(
                group = self.inner.config.group_id,
                node = node_id,
                "initialized a single-voter membership"
            );
        }
        // Leadership alone is not enough: wait until the membership is
        // committed and the state machine has applied everything the leader
        // has committed (the blank entry of its term included), so the first
        // read after open sees every topic that existed before a restart.
        let wait = raft
            .wait(Some(Duration::from_millis(timeout_ms)))
            .metrics(
                |m| {
                    m.state == ServerState::Leader
                        && m.current_leader == Some(node_id)
                        && m.local_committed.is_some()
                        && m.last_applied >= m.local_committed
                        && m.membership_config.log_id() <= &m.last_applied
                },
                "leader with everything committed applied",
            )
            .await;
        match wait {
            Ok(_) => Ok(()),
            Err(openraft::metrics::WaitError::Timeout(..)) => {
                tracing::warn!(
                    group = self.inner.config.group_id,
                    timeout_ms,
                    "metadata group did not become a caught-up leader in time"
                );
                Err(GroupError::Timeout)
            }
            Err(other) => Err(self.stopped_reason(other.into())),
        }
    }

    /// Forms the group's membership from `voters` if this replica has none
    /// yet; a no-op on an initialized replica (after a restart, or once a
    /// peer's membership reached it). Every replica of a fresh group may
    /// call this with the same voter set (openraft's voting keeps that
    /// safe); different sets on different replicas must never happen, so
    /// the set must be a pure function of shared configuration.
    pub async fn initialize(&self, voters: &[u64]) -> Result<(), GroupError> {
        self.check_running()?;
        self.until_stopped(self.initialize_running(voters)).await
    }

    async fn initialize_running(&self, voters: &[u64]) -> Result<(), GroupError> {
        let raft = &self.inner.raft;
        if raft.is_initialized().await.map_err(|e| fatal_error(&e))? {
            return Ok(());
        }
        let members: BTreeMap<u64, BasicNode> = voters
            .iter()
            .map(|id| (*id, BasicNode::default()))
            .collect();
        if !members.contains_key(&self.inner.config.node_id) {
            return Err(GroupError::config(ConfigProblem::NotAmongVoters {
                node: self.inner.config.node_id,
                voters: voters.to_vec(),
            }));
        }
        match raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(
                    group = self.inner.config.group_id,
                    node = self.inner.config.node_id,
                    ?voters,
                    "initialized the group's membership"
                );
                Ok(())
            }
            // A peer's entries arrived between the check and the call: the
            // membership exists, which is all this wanted.
            Err(RaftError::APIError(openraft::errors::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(initialize_error(e)),
        }
    }

    /// Waits until this replica knows a leader and returns its id, or
    /// `GroupError::Timeout` after `timeout_ms`.
    pub async fn wait_for_leader(&self, timeout_ms: u64) -> Result<u64, GroupError> {
        self.check_running()?;
        let wait = self
            .until_stopped(async {
                Ok(self
                    .inner
                    .raft
                    .wait(Some(Duration::from_millis(timeout_ms)))
                    .metrics(|m| m.current_leader.is_some(), "a known leader")
                    .await)
            })
            .await?;
        match wait {
            Ok(m) => m.current_leader.ok_or(GroupError::Timeout),
            Err(openraft::metrics::WaitError::Timeout(..)) => Err(GroupError::Timeout),
            Err(other) => Err(self.stopped_reason(other.into())),
        }
    }

    /// The error to report when raft stopped underneath a call.
    fn stopped_reason(&self, fallback: RaftFault) -> GroupError {
        if self.inner.stopped.load(Ordering::Acquire) {
            return GroupError::Stopped;
        }
        match &self.inner.raft.metrics().borrow_watched().running_state {
            Err(fatal) => fatal_error(fatal),
            Ok(()) => GroupError::Fatal {
                cause: FatalCause::Raft(fallback),
            },
        }
    }

    /// Which opening of its group this handle is: unique in the process, so
    /// a watcher keyed by it watches a reopened replica too.
    pub fn serial(&self) -> u64 {
        self.inner.serial
    }

    /// Why raft stopped underneath this replica on its own (a storage
    /// error, a panic in its core), if it did; `None` while it runs and
    /// after a stop this handle asked for. Its owner replaces such a
    /// replica (`VnodeHost::reopen_fatal`): nothing restarts it in place.
    pub fn fatal(&self) -> Option<GroupError> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return None;
        }
        match &self.inner.raft.metrics().borrow_watched().running_state {
            Err(fatal) => Some(fatal_error(fatal)),
            Ok(()) => None,
        }
    }

    /// Test hook: every later operation of this replica's log store fails
    /// as a failed disk's would, so its next write stops raft fatally.
    #[cfg(any(test, feature = "testing"))]
    pub fn break_disk_for_tests(&self) {
        self.inner.log.break_disk();
    }

    fn check_running(&self) -> Result<(), GroupError> {
        if self.inner.stopped.load(Ordering::Acquire) {
            return Err(GroupError::Stopped);
        }
        match &self.inner.raft.metrics().borrow_watched().running_state {
            Err(fatal) => Err(fatal_error(fatal)),
            Ok(()) => Ok(()),
        }
    }

    /// Runs a call into raft unless the group stops first; then the call is
    /// dropped, never polled again, and answers `GroupError::Stopped`.
    ///
    /// openraft logs a call whose answer never came because its core
    /// stopped as an ERROR ("recv_msg: error: raft stopped", "failed to
    /// receive from RaftCore"): at an ordered shutdown, a linearizable read
    /// still waiting for its heartbeat round did exactly that. Such a call
    /// is expected then, so it must end before the core does.
    /// `biased`: the stop is checked first on every poll, so a call whose
    /// answer channel closed is not polled (and does not log) once the stop
    /// has begun.
    async fn until_stopped<T>(
        &self,
        call: impl Future<Output = Result<T, GroupError>>,
    ) -> Result<T, GroupError> {
        tokio::select! {
            biased;
            () = self.inner.stopping.cancelled() => Err(GroupError::Stopped),
            result = call => result,
        }
    }

    async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, GroupError>>,
    ) -> Result<T, GroupError> {
        let after_ms = self.inner.config.request_timeout_ms;
        match tokio::time::timeout(Duration::from_millis(after_ms), fut).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    group = self.inner.config.group_id,
                    after_ms,
                    "metadata group request timed out"
                );
                Err(GroupError::Timeout)
            }
        }
    }

    /// Linearizable write: replicates the command, applies it, and returns
    /// the model's verdict. A model refusal is `Ok(Err(ModelError))`. After
    /// `GroupError::Timeout`, `GroupError::Discarded`, or a
    /// `GroupError::Stopped` that came while it was in flight, the command
    /// may still commit, so a retry must be safe to apply twice.
    pub async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, GroupError> {
        self.check_running()?;
        let response = self
            .until_stopped(self.bounded(async {
                let mut refreshed = false;
                loop {
                    match self.inner.raft.client_write(Request(cmd.clone())).await {
                        Ok(response) => return Ok(response),
                        // A quiet leader's quorum lease has lapsed (no
                        // heartbeats: ADR 0101), and raft refuses writes
                        // until a quorum acknowledges it again. The entry
                        // was never appended, so one heartbeat round (the
                        // read index's) and one retry are safe.
                        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
                            if f.reason == ForwardReason::LeaseExpired && !refreshed =>
                        {
                            refreshed = true;
                            self.inner
                                .raft
                                .ensure_linearizable(ReadPolicy::ReadIndex)
                                .await
                                .map_err(|e| self.read_error(e))?;
                        }
                        Err(e) => return Err(self.write_error(e)),
                    }
                }
            }))
            .await?;
        match response.data.0 {
            Some(verdict) => Ok(verdict),
            None => Err(GroupError::refused(Refusal::NoVerdict)),
        }
    }

    fn write_error(&self, e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> GroupError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => GroupError::NotLeader {
                leader: f.leader_id,
            },
            RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => GroupError::Discarded {
                leader: f.leader_id,
            },
            RaftError::APIError(other) => GroupError::refused(Refusal::Raft(other.into())),
            RaftError::Fatal(f) => self.stopped_reason(f.into()),
        }
    }

    fn read_error(
        &self,
        e: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>,
    ) -> GroupError {
        match e {
            RaftError::APIError(LinearizableReadError::ForwardToLeader(f)) => {
                GroupError::NotLeader {
                    leader: f.leader_id,
                }
            }
            RaftError::APIError(other) => GroupError::refused(Refusal::Raft(other.into())),
            RaftError::Fatal(f) => self.stopped_reason(f.into()),
        }
    }

    /// Linearizable read of the applied state: confirms leadership (read
    /// index) and waits for the state machine to reach it, then runs `f`.
    pub async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&MetadataState) -> R + Send + 'static,
    ) -> Result<R, GroupError> {
        self.check_running()?;
        self.until_stopped(self.bounded(async {
            self.inner
                .raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map_err(|e| self.read_error(e))
        }))
        .await?;
        Ok(self.read_local(f))
    }

    /// A local read of the applied state without a leadership check: current
    /// on a single voter, possibly stale on a follower. Keep `f` short: it
    /// runs under the state's read lock, which apply waits on.
    pub fn read_local<R>(&self, f: impl FnOnce(&MetadataState) -> R) -> R {
        let applied = self.inner.shared.applied.read();
        f(&applied.state)
    }

    /// The group's id.
    pub fn group_id(&self) -> u64 {
        self.inner.config.group_id
    }

    /// The index of the last applied entry, read now (0 before any).
    pub fn applied_index(&self) -> u64 {
        *self.inner.shared.applied_index.borrow()
    }

    /// The last applied log index, updated after every applied batch.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.shared.applied_index.subscribe()
    }

    /// Changes after every applied batch that changed more than the
    /// coordinator lease (a snapshot installed counts): what follows the
    /// metadata without waking on every lease renewal.
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.inner.shared.changes.subscribe()
    }

    /// A receiver that changes whenever this replica's view of the leader
    /// does (a new term, a new leader, this replica gaining or losing
    /// leadership). It stops changing once the group stops. Watching is
    /// edge-triggered; callers that must not miss a state should also poll
    /// `status` on a slow timer.
    pub fn watch_leader(&self) -> watch::Receiver<LeaderView> {
        fn view(m: &openraft::RaftMetrics<TypeConfig>) -> LeaderView {
            LeaderView {
                term: m.current_term,
                leader: m.current_leader,
                is_leader: m.state == ServerState::Leader,
            }
        }
        let mut metrics = self.inner.raft.metrics();
        let (tx, rx) = watch::channel(view(&metrics.borrow_watched()));
        tokio::spawn(async move {
            while metrics.changed().await.is_ok() {
                let next = view(&metrics.borrow_watched());
                tx.send_if_modified(|current| {
                    let changed = *current != next;
                    *current = next;
                    changed
                });
                if tx.is_closed() {
                    break;
                }
            }
        });
        rx
    }

    /// Whether this replica is the leader now.
    pub fn is_leader(&self) -> bool {
        !self.inner.stopped.load(Ordering::Acquire) && self.inner.raft.is_leader()
    }

    /// The leader this replica knows of and its term, read without
    /// cloning the metrics (loops over thousands of groups call this).
    pub fn leader_term(&self) -> (Option<u64>, u64) {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        (m.current_leader, m.current_term)
    }

    /// The group's raft state now.
    pub fn status(&self) -> GroupStatus {
        let m = self.inner.raft.metrics().borrow_watched().clone();
        GroupStatus {
            group_id: self.inner.config.group_id,
            node_id: self.inner.config.node_id,
            term: m.current_term,
            leader: m.current_leader,
            is_leader: m.state == ServerState::Leader,
            last_applied: m.last_applied.as_ref().map(|id| id.index),
            committed: m.local_committed.as_ref().map(|id| id.index),
            snapshot: m.snapshot.as_ref().map(|id| id.index),
            voters: m.membership_config.membership().voter_ids().collect(),
        }
    }

    /// What deciding whether the group may be quiet needs, read without
    /// cloning the metrics (ADR 0101).
    pub fn pace(&self) -> GroupPace {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let is_leader = m.state == ServerState::Leader;
        let behind = match (&m.replication, is_leader) {
            (Some(matched), true) => m
                .membership_config
                .membership()
                .voter_ids()
                .filter(|v| *v != self.inner.config.node_id)
                .filter(|v| {
                    let index = matched.get(v).and_then(|id| id.as_ref()).map(|id| id.index);
                    index < m.last_log_index
                })
                .collect(),
            _ => Vec::new(),
        };
        GroupPace {
            group_id: self.inner.config.group_id,
            node_id: self.inner.config.node_id,
            term: m.current_term,
            is_leader,
            leader: m.current_leader,
            voters: m.membership_config.membership().voter_ids().collect(),
            behind,
            running: m.running_state.is_ok() && !self.inner.stopped.load(Ordering::Acquire),
        }
    }

    /// Parks (`true`) or resumes (`false`) the group's raft ticker. A quiet
    /// leader sends no heartbeats and a quiet follower runs no election
    /// timer; writes and reads still replicate at once. A quiet replica
    /// also refuses pre-votes from anyone but its leader. Idempotent.
    pub fn set_quiet(&self, quiet: bool) {
        if self.inner.stopped.load(Ordering::Acquire) {
            return;
        }
        self.inner.quiet.store(quiet, Ordering::Release);
        self.retick();
    }

    /// Parks (`true`) or resumes (`false`) the group's raft ticker because
    /// this replica should not campaign now (ADR 0105); it answers every
    /// message as usual. Idempotent.
    pub fn set_parked(&self, parked: bool) {
        if self.inner.stopped.load(Ordering::Acquire) {
            return;
        }
        self.inner.parked.store(parked, Ordering::Release);
        self.retick();
    }

    /// Whether the group's election timer is parked now.
    pub fn is_parked(&self) -> bool {
        self.inner.parked.load(Ordering::Acquire)
    }

    /// The ticker runs unless the group is quiet or parked.
    fn retick(&self) {
        let tick =
            !self.inner.quiet.load(Ordering::Acquire) && !self.inner.parked.load(Ordering::Acquire);
        self.inner.raft.runtime_config().tick(tick);
    }

    /// Whether the group is quiet now.
    pub fn is_quiet(&self) -> bool {
        self.inner.quiet.load(Ordering::Acquire)
    }

    /// Sends one heartbeat round now (a leader only; a no-op elsewhere),
    /// so a replica that just came back learns its leader without
    /// waiting for an election.
    pub async fn heartbeat(&self) -> Result<(), GroupError> {
        self.check_running()?;
        self.until_stopped(async {
            self.inner
                .raft
                .trigger()
                .heartbeat()
                .await
                .map_err(|e| self.stopped_reason(e.into()))
        })
        .await
    }

    /// Asks raft to hand leadership to `to` (a leader only; ignored
    /// elsewhere). Returns at once; the transfer is an election `to` runs.
    ///
    /// From then on, until it loses leadership, this leader refuses reads
    /// and writes (it names `to`) and sends no heartbeats: openraft expects
    /// followers to elect if the hand-over fails. Quiet followers do not,
    /// so a caller must call again (to `to` or to another voter with the
    /// whole log) while this replica still leads the same term; a later
    /// call replaces the target.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), GroupError> {
        self.check_running()?;
        self.until_stopped(async {
            self.inner
                .raft
                .trigger()
                .transfer_leader(to)
                .await
                .map_err(|e| self.stopped_reason(e.into()))
        })
        .await
    }

    /// The group's membership as this replica knows it now: voters,
    /// learners, and whether a joint change is under way (ADR 0104).
    pub fn membership(&self) -> GroupMembership {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        let learners: BTreeSet<u64> = membership.learner_ids().collect();
        // A leader's view of how far each learner has its log.
        let lagging = match &m.replication {
            Some(matched) if m.state == ServerState::Leader => learners
                .iter()
                .copied()
                .filter(|l| {
                    let index = matched.get(l).and_then(|id| id.as_ref()).map(|id| id.index);
                    match (index, m.last_log_index) {
                        (Some(index), Some(last)) => index + LEARNER_LAG_ENTRIES_MAX < last,
                        (None, Some(_)) => true,
                        (_, None) => false,
                    }
                })
                .collect(),
            _ => BTreeSet::new(),
        };
        GroupMembership {
            voters: membership.voter_ids().collect(),
            learners,
            lagging,
            joint: membership.get_joint_config().len() > 1,
            committed: m.membership_config.log_id() <= &m.local_committed,
        }
    }

    /// Adds `node` as a learner (a leader only) and waits, for at most
    /// `timeout_ms`, until it has caught up with the log. The learner's
    /// broker must have opened its replica (`VnodeHost` asks it first).
    /// Idempotent: a node already in the group is left as it is.
    pub async fn add_learner(&self, node: u64, timeout_ms: u64) -> Result<(), GroupError> {
        self.check_running()?;
        let call = async {
            self.inner
                .raft
                .add_learner(node, BasicNode::default(), true)
                .await
                .map(|_| ())
                .map_err(|e| self.write_error(e))
        };
        self.until_stopped(async {
            match tokio::time::timeout(Duration::from_millis(timeout_ms), call).await {
                Ok(result) => result,
                Err(_) => Err(GroupError::Timeout),
            }
        })
        .await
    }

    /// Changes the voters to exactly `voters` (a leader only) through
    /// openraft's joint consensus, and waits until the final membership
    /// commits. Voters left out stay as learners; every new voter must be
    /// a learner already. A change interrupted half way (a joint
    /// membership left behind) is completed by calling again.
    pub async fn change_voters(
        &self,
        voters: &BTreeSet<u64>,
        timeout_ms: u64,
    ) -> Result<(), GroupError> {
        self.check_running()?;
        if voters.is_empty() {
            return Err(GroupError::config(ConfigProblem::NoVoters));
        }
        let call = async {
            self.inner
                .raft
                .change_membership(voters.clone(), true)
                .await
                .map(|_| ())
                .map_err(|e| self.write_error(e))
        };
        self.until_stopped(async {
            match tokio::time::timeout(Duration::from_millis(timeout_ms), call).await {
                Ok(result) => result,
                Err(_) => Err(GroupError::Timeout),
            }
        })
        .await
    }

    /// Removes learners (a leader only), waiting for the change to commit.
    pub async fn remove_learners(
        &self,
        learners: &BTreeSet<u64>,
        timeout_ms: u64,
    ) -> Result<(), GroupError> {
        self.check_running()?;
        let call = async {
            self.inner
                .raft
                .change_membership(
                    openraft::ChangeMembers::RemoveNodes(learners.clone()),
                    false,
                )
                .await
                .map(|_| ())
                .map_err(|e| self.write_error(e))
        };
        self.until_stopped(async {
            match tokio::time::timeout(Duration::from_millis(timeout_ms), call).await {
                Ok(result) => result,
                Err(_) => Err(GroupError::Timeout),
            }
        })
        .await
    }

    /// A quiet replica's answer to a pre-vote, or `None` to let raft judge
    /// it. While quiet, this replica believes its leader alive (the broker
    /// answers its liveness probes), so it would not grant a vote to
    /// anyone else: that is raft's leader lease (dissertation §4.2.3)
    /// with liveness in place of heartbeats. The believed leader itself is
    /// judged by raft, so a leader that restarted can win its group back.
    fn refuse_pre_vote(
        &self,
        request: &openraft::raft::VoteRequest<TypeConfig>,
    ) -> Option<Vec<u8>> {
        use openraft::vote::RaftLeaderId;
        if !self.inner.quiet.load(Ordering::Acquire) {
            return None;
        }
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let candidate = *request.vote.leader_id().node_id();
        if m.current_leader == Some(candidate) {
            return None;
        }
        let refusal: openraft::raft::VoteResponse<TypeConfig> =
            openraft::raft::VoteResponse::new(m.vote, None, false);
        tracing::debug!(
            group = self.inner.config.group_id,
            candidate,
            leader = ?m.current_leader,
            "pre-vote refused: quiet with a live leader"
        );
        rmp_serde::to_vec(&refusal).ok()
    }

    /// Builds a snapshot now and waits until it covers everything applied
    /// at the time of the call (bounded by `request_timeout_ms`).
    ///
    /// The trigger is repeated every `SNAPSHOT_RETRIGGER_MS`: openraft drops
    /// a trigger that arrives while it is already building a snapshot, and
    /// that snapshot may cover less than `target` (a snapshot the log policy
    /// started a moment earlier), after which nothing would build another.
    pub async fn snapshot_now(&self) -> Result<u64, GroupError> {
        self.check_running()?;
        self.until_stopped(self.snapshot_now_running()).await
    }

    async fn snapshot_now_running(&self) -> Result<u64, GroupError> {
        let target = self.inner.shared.applied.read().last_applied;
        let deadline =
            std::time::Instant::now() + Duration::from_millis(self.inner.config.request_timeout_ms);
        loop {
            self.inner
                .raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| self.stopped_reason(e.into()))?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let slice = left.min(Duration::from_millis(SNAPSHOT_RETRIGGER_MS));
            let waited = self
                .inner
                .raft
                .wait(Some(slice))
                .metrics(
                    |m| m.snapshot >= target,
                    "snapshot covers the applied state",
                )
                .await;
            match waited {
                Ok(m) => return Ok(m.snapshot.as_ref().map_or(0, |id| id.index)),
                Err(openraft::metrics::WaitError::Timeout(..)) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(GroupError::Timeout);
                    }
                }
                Err(other) => return Err(self.stopped_reason(other.into())),
            }
        }
    }

    /// Handles one raft message a peer sent through the transport and returns
    /// the encoded answer.
    pub async fn handle_rpc(&self, kind: RaftRpcKind, body: &[u8]) -> Result<Vec<u8>, GroupError> {
        self.check_running()?;
        self.until_stopped(self.handle_rpc_running(kind, body))
            .await
    }

    async fn handle_rpc_running(
        &self,
        kind: RaftRpcKind,
        body: &[u8],
    ) -> Result<Vec<u8>, GroupError> {
        let codec = |e: CodecError| GroupError::Codec { source: e };
        let raft = &self.inner.raft;
        let fatal = |e: Fatal<TypeConfig>| self.stopped_reason(e.into());
        let answer = match kind {
            RaftRpcKind::AppendEntries => {
                let rpc = rmp_serde::from_slice(body).map_err(|e| codec(e.into()))?;
                let resp = raft
                    .append_entries(rpc)
                    .await
                    .map_err(|e| fatal(e.unwrap_fatal()))?;
                rmp_serde::to_vec(&resp)
            }
            RaftRpcKind::Vote => {
                let rpc = rmp_serde::from_slice(body).map_err(|e| codec(e.into()))?;
                let resp = raft.vote(rpc).await.map_err(|e| fatal(e.unwrap_fatal()))?;
                rmp_serde::to_vec(&resp)
            }
            RaftRpcKind::PreVote => {
                let rpc = rmp_serde::from_slice(body).map_err(|e| codec(e.into()))?;
                if let Some(refusal) = self.refuse_pre_vote(&rpc) {
                    return Ok(refusal);
                }
                let resp = raft
                    .pre_vote(rpc)
                    .await
                    .map_err(|e| fatal(e.unwrap_fatal()))?;
                rmp_serde::to_vec(&resp)
            }
            RaftRpcKind::TransferLeader => {
                let rpc = rmp_serde::from_slice(body).map_err(|e| codec(e.into()))?;
                let resp = raft.handle_transfer_leader(rpc).await.map_err(fatal)?;
                rmp_serde::to_vec(&resp)
            }
            RaftRpcKind::FullSnapshot => {
                let req: FullSnapshotRequest =
                    rmp_serde::from_slice(body).map_err(|e| codec(e.into()))?;
                let snapshot = types::Snapshot {
                    meta: req.meta,
                    snapshot: req.data,
                };
                let resp = raft
                    .install_full_snapshot(req.vote, snapshot)
                    .await
                    .map_err(fatal)?;
                rmp_serde::to_vec(&resp)
            }
        };
        answer.map_err(|e| codec(e.into()))
    }

    /// Begins the stop without waiting: later calls, and calls in flight,
    /// answer `GroupError::Stopped`, and no peer's answer reaches raft any
    /// more. `shutdown` then stops the raft core. A host stopping many
    /// groups begins every stop first, so their grace periods overlap.
    /// Idempotent.
    pub fn begin_shutdown(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        self.inner
            .stopping_since
            .get_or_init(tokio::time::Instant::now);
        self.inner.stopping.cancel();
    }

    /// Stops the raft node: begins the stop if that has not happened yet,
    /// lets the grace period pass (`SHUTDOWN_GRACE_MS`), and stops the core.
    /// Later calls answer `GroupError::Stopped`. Dropping every handle
    /// without calling this leaves the raft task running (and its files
    /// open) until the runtime ends, so owners must shut a group down
    /// before reopening its directory.
    pub async fn shutdown(&self) -> Result<(), GroupError> {
        if self.inner.core_stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.begin_shutdown();
        if let Some(since) = self.inner.stopping_since.get() {
            tokio::time::sleep_until(*since + Duration::from_millis(SHUTDOWN_GRACE_MS)).await;
        }
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| GroupError::Fatal {
                cause: FatalCause::NotJoined(Arc::new(e)),
            })?;
        tracing::info!(
            group = self.inner.config.group_id,
            node = self.inner.config.node_id,
            "metadata group shut down"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_core::model::NodeId;
    use openraft::StorageError;
    use openraft::testing::log::{StoreBuilder, Suite};

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().unwrap();
            let log = LogStore::open(dir.path(), 1, 1 << 20).unwrap();
            let sm = StateMachine::open(dir.path(), 1, 1 << 30).unwrap();
            Ok((dir, log, sm))
        }
    }

    #[tokio::test]
    async fn the_disk_stores_pass_openrafts_storage_suite() {
        Suite::test_all(Builder).await.unwrap();
    }

    fn create(topic: &str) -> Command {
        Command::CreateTopic {
            topic: topic.to_owned(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![NodeId(1)]],
            at_ms: 1,
        }
    }

    /// An in-process network for multi-voter groups: each raft message goes
    /// straight to the addressed replica's `handle_rpc`, unless a test cut
    /// the sender or the receiver, or caps the log it may receive.
    #[derive(Debug, Default)]
    struct MemNet {
        groups: parking_lot::RwLock<BTreeMap<u64, MetadataGroup>>,
        /// Nodes that neither send nor receive.
        cut: parking_lot::RwLock<std::collections::BTreeSet<u64>>,
        /// Nodes that receive no entry beyond an index: an append is sent
        /// only in part, which openraft allows a network to do (it is told
        /// with `PartialSuccess`).
        capped: parking_lot::RwLock<BTreeMap<u64, u64>>,
    }

    #[derive(Debug)]
    struct MemTransport {
        from: u64,
        net: Arc<MemNet>,
    }

    impl MemTransport {
        async fn deliver(
            &self,
            target: u64,
            kind: RaftRpcKind,
            body: &[u8],
        ) -> Result<Vec<u8>, TransportError> {
            let group = self.net.groups.read().get(&target).cloned();
            let group = group.ok_or(TransportError::Unreachable {
                target,
                cause: UnreachableCause::Down,
            })?;
            group.handle_rpc(kind, body).await.map_err(|e| {
                let refusal = RpcError::Group(e);
                TransportError::Remote {
                    target,
                    code: refusal.code(),
                    peer_message: refusal.to_string(),
                }
            })
        }

        /// Sends the part of an append at or below `cap`.
        async fn deliver_capped(
            &self,
            target: u64,
            body: &[u8],
            cap: u64,
        ) -> Result<Vec<u8>, TransportError> {
            use openraft::entry::RaftEntry;
            use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
            let mut rpc: AppendEntriesRequest<TypeConfig> =
                rmp_serde::from_slice(body).expect("an append request");
            if rpc.prev_log_id.is_some_and(|prev| prev.index > cap) {
                return Err(TransportError::Unreachable {
                    target,
                    cause: UnreachableCause::Down,
                });
            }
            let before = rpc.entries.len();
            rpc.entries.retain(|e| e.index() <= cap);
            if rpc.entries.len() == before {
                return self.deliver(target, RaftRpcKind::AppendEntries, body).await;
            }
            let sent_up_to = rpc.entries.last().map(|e| e.log_id()).or(rpc.prev_log_id);
            let answer = self
                .deliver(
                    target,
                    RaftRpcKind::AppendEntries,
                    &rmp_serde::to_vec(&rpc).unwrap(),
                )
                .await?;
            let response: AppendEntriesResponse<TypeConfig> =
                rmp_serde::from_slice(&answer).unwrap();
            if !matches!(response, AppendEntriesResponse::Success) {
                return Ok(answer);
            }
            // Do not spin: the rest stays withheld.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let partial: AppendEntriesResponse<TypeConfig> =
                AppendEntriesResponse::PartialSuccess(sent_up_to);
            Ok(rmp_serde::to_vec(&partial).unwrap())
        }
    }

    #[async_trait::async_trait]
    impl GroupTransport for MemTransport {
        async fn call(
            &self,
            _group_id: u64,
            target: u64,
            kind: RaftRpcKind,
            body: Vec<u8>,
            _timeout_ms: u64,
        ) -> Result<Vec<u8>, TransportError> {
            {
                let cut = self.net.cut.read();
                if cut.contains(&self.from) || cut.contains(&target) {
                    return Err(TransportError::Unreachable {
                        target,
                        cause: UnreachableCause::Down,
                    });
                }
            }
            let cap = self.net.capped.read().get(&target).copied();
            match cap {
                Some(cap) if kind == RaftRpcKind::AppendEntries => {
                    self.deliver_capped(target, &body, cap).await
                }
                _ => self.deliver(target, kind, &body).await,
            }
        }
    }

    async fn open_on(net: &Arc<MemNet>, dir: &std::path::Path, node: u64) -> MetadataGroup {
        let mut config = GroupConfig::new(9, node, dir);
        config.election_timeout_min_ms = 150;
        config.election_timeout_max_ms = 300;
        config.heartbeat_interval_ms = 50;
        config.request_timeout_ms = 1_500;
        let transport = Arc::new(MemTransport {
            from: node,
            net: Arc::clone(net),
        });
        let group = MetadataGroup::open(config, transport).await.unwrap();
        net.groups.write().insert(node, group.clone());
        group
    }

    async fn until(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Proposes through whichever replica leads, retrying across elections;
    /// returns the leader that acknowledged it.
    async fn propose_through_leader(groups: &BTreeMap<u64, MetadataGroup>, cmd: Command) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let leader = groups.iter().find(|(_, g)| g.is_leader());
            if let Some((id, group)) = leader
                && let Ok(verdict) = group.propose(cmd.clone()).await
            {
                verdict.unwrap();
                return *id;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no leader took {cmd:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Voters 1, 2 and 3 of one group on `net`, each in its own dir of
    /// `dirs`, initialized.
    async fn three_voters(
        net: &Arc<MemNet>,
        dirs: &[tempfile::TempDir],
    ) -> BTreeMap<u64, MetadataGroup> {
        let mut groups = BTreeMap::new();
        for node in 1..=3u64 {
            let group = open_on(net, dirs[node as usize - 1].path(), node).await;
            groups.insert(node, group);
        }
        for group in groups.values() {
            group.initialize(&[1, 2, 3]).await.unwrap();
        }
        groups
    }

    /// The loss the vnode split test saw with leader balancing (ADR 0101):
    /// every broker restarted, the old leader came back first and, resuming
    /// its old term (openraft's leader restore), answered a read at a read
    /// index below writes it had acknowledged before the restart: neither
    /// the commit index nor the applied state is durable here, so what it
    /// learns committed after the restart can stop short of them. A
    /// restarted leader must win a new term, whose blank entry (above every
    /// acknowledged write) a read then waits for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_leader_never_serves_a_read_that_misses_an_acknowledged_write() {
        let net = Arc::new(MemNet::default());
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut groups = three_voters(&net, &dirs).await;
        let leader = propose_through_leader(&groups, create("before")).await;
        let lagging = if leader == 1 { 2 } else { 1 };
        until("the lagging follower applied the first write", || {
            groups[&lagging].read_local(|s| s.topic("before").is_some())
        })
        .await;
        let cap = groups[&lagging].status().last_applied.unwrap();
        // The lagging follower misses these; the leader and the third
        // voter commit them, and the leader acknowledges them.
        net.cut.write().insert(lagging);
        let acknowledged = ["a1", "a2", "a3", "a4", "a5"];
        for topic in acknowledged {
            let verdict = groups[&leader].propose(create(topic)).await.unwrap();
            assert!(verdict.is_ok(), "{verdict:?}");
        }
        for (node, group) in std::mem::take(&mut groups) {
            net.groups.write().remove(&node);
            group.shutdown().await.unwrap();
        }

        // The leader and the lagging follower come back, the third voter
        // does not, and the lagging follower receives nothing beyond what
        // it holds: the leader cannot learn those writes committed.
        net.cut.write().clear();
        net.capped.write().insert(lagging, cap);
        let restarted = open_on(&net, dirs[leader as usize - 1].path(), leader).await;
        open_on(&net, dirs[lagging as usize - 1].path(), lagging).await;
        until("the restarted node leads", || restarted.is_leader()).await;
        let all = move |s: &MetadataState| acknowledged.iter().all(|t| s.topic(t).is_some());
        // It may time out, but must not answer without them.
        if let Ok(seen) = restarted.read(all).await {
            assert!(
                seen,
                "a linearizable read missed writes acknowledged before the restart"
            );
        }

        net.capped.write().clear();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            match restarted.read(all).await {
                Ok(seen) => {
                    assert!(seen, "a read missed acknowledged writes");
                    break;
                }
                Err(e) => assert!(std::time::Instant::now() < deadline, "no read: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let running = std::mem::take(&mut *net.groups.write());
        for group in running.into_values() {
            group.shutdown().await.unwrap();
        }
    }

    /// openraft's hand-over as `vnodes::quiet` relies on it: a leader whose
    /// hand-over went to a voter that is gone keeps leading but serves
    /// nothing (it names the target), and handing over again, to a voter
    /// that can take it, ends that.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hand_over_to_a_voter_that_is_gone_stalls_until_handed_over_again() {
        let net = Arc::new(MemNet::default());
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let groups = three_voters(&net, &dirs).await;
        let leader = propose_through_leader(&groups, create("before")).await;
        let others: Vec<u64> = (1..=3).filter(|n| *n != leader).collect();
        let (gone, taker) = (others[0], others[1]);
        until("every voter has the log", || {
            groups[&taker].read_local(|s| s.topic("before").is_some())
                && groups[&gone].read_local(|s| s.topic("before").is_some())
        })
        .await;
        net.cut.write().insert(gone);
        let term = groups[&leader].pace().term;
        groups[&leader].transfer_leader(gone).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let stalled = groups[&leader].propose(create("during")).await;
        assert!(
            matches!(stalled, Err(GroupError::NotLeader { leader: Some(to) }) if to == gone),
            "{stalled:?}"
        );
        let pace = groups[&leader].pace();
        assert!(pace.is_leader && pace.term == term, "{pace:?}");

        groups[&leader].transfer_leader(taker).await.unwrap();
        until("the other voter leads", || groups[&taker].is_leader()).await;
        let verdict = groups[&taker].propose(create("after")).await.unwrap();
        assert!(verdict.is_ok(), "{verdict:?}");
        let running = std::mem::take(&mut *net.groups.write());
        for group in running.into_values() {
            group.shutdown().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_storage_error_stops_the_group_for_good_as_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = GroupConfig::new(1, 1, dir.path());
        config.election_timeout_min_ms = 100;
        config.election_timeout_max_ms = 200;
        config.heartbeat_interval_ms = 30;
        let group = MetadataGroup::open_single(config).await.unwrap();
        group.propose(create("before")).await.unwrap().unwrap();
        group.inner.log.break_disk();

        let err = group.propose(create("during")).await.unwrap_err();
        assert!(matches!(err, GroupError::Fatal { .. }), "{err:?}");
        assert!(err.is_fatal());
        // Every later call reports the same fatal state; nothing restarts it.
        let err = group.propose(create("after")).await.unwrap_err();
        assert!(matches!(err, GroupError::Fatal { .. }), "{err:?}");
        let err = group.read(|s| s.topics().count()).await.unwrap_err();
        assert!(matches!(err, GroupError::Fatal { .. }), "{err:?}");
        assert!(!group.is_leader());
    }

    #[tokio::test]
    async fn a_write_refused_for_want_of_space_stops_the_group_and_its_files_reopen_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = GroupConfig::new(1, 1, dir.path());
        config.election_timeout_min_ms = 100;
        config.election_timeout_max_ms = 200;
        config.heartbeat_interval_ms = 30;
        let group = MetadataGroup::open_single(config.clone()).await.unwrap();
        group.propose(create("before")).await.unwrap().unwrap();
        assert!(!group.stopped_by_full_volume());
        group.inner.log.fill_disk();
        let err = group.propose(create("during")).await.unwrap_err();
        assert!(matches!(err, GroupError::Fatal { .. }), "{err:?}");
        // Told apart from a disk that failed otherwise: it may reopen.
        assert!(group.stopped_by_full_volume());
        let _ = group.shutdown().await;
        // Reopened from its files, as at a restart: what was committed is
        // there, and it takes writes again.
        let group = MetadataGroup::open_single(config).await.unwrap();
        assert!(!group.stopped_by_full_volume());
        assert_eq!(
            group
                .read(|s| s.topics().map(|t| t.name.clone()).collect::<Vec<_>>())
                .await
                .unwrap(),
            vec!["before".to_string()]
        );
        group.propose(create("after")).await.unwrap().unwrap();
        group.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_disk_failure_is_not_taken_for_a_full_volume() {
        let dir = tempfile::tempdir().unwrap();
        let group = MetadataGroup::open_single(GroupConfig::new(1, 1, dir.path()))
            .await
            .unwrap();
        group.inner.log.break_disk();
        let _ = group.propose(create("during")).await;
        assert!(!group.stopped_by_full_volume());
        let _ = group.shutdown().await;
    }

    #[tokio::test]
    async fn a_vote_request_through_handle_rpc_from_a_stale_candidate_is_refused() {
        use openraft::raft::{VoteRequest, VoteResponse};
        let dir = tempfile::tempdir().unwrap();
        let group = MetadataGroup::open_single(GroupConfig::new(1, 1, dir.path()))
            .await
            .unwrap();
        let term = group.status().term;
        // A candidate at the leader's own term with an empty log must lose.
        let request: VoteRequest<TypeConfig> = VoteRequest::new(types::Vote::new(term, 2), None);
        let body = rmp_serde::to_vec(&request).unwrap();
        let answer = group.handle_rpc(RaftRpcKind::Vote, &body).await.unwrap();
        let response: VoteResponse<TypeConfig> = rmp_serde::from_slice(&answer).unwrap();
        assert!(!response.vote_granted);
        assert!(group.is_leader());
        let err = group
            .handle_rpc(RaftRpcKind::Vote, b"not msgpack")
            .await
            .unwrap_err();
        assert!(matches!(err, GroupError::Codec { .. }), "{err:?}");
        group.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn lease_renewals_advance_the_applied_index_but_not_the_changes() {
        let dir = tempfile::tempdir().unwrap();
        let group = MetadataGroup::open_single(GroupConfig::new(1, 1, dir.path()))
            .await
            .unwrap();
        let applied = group.subscribe();
        let changes = group.subscribe_changes();
        // Let the opening's own membership entry bump the watch first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (index_before, changes_before) = (*applied.borrow(), *changes.borrow());
        for at_ms in [1_000, 2_000, 3_000] {
            let renewal = Command::AcquireLeaseWaited {
                holder: 1,
                duration_ms: 10_000,
                at_ms,
                waited_for: None,
            };
            group.propose(renewal).await.unwrap().unwrap();
        }
        assert!(*applied.borrow() >= index_before + 3);
        assert_eq!(
            *changes.borrow(),
            changes_before,
            "renewals woke the watchers"
        );
        group.propose(create("t")).await.unwrap().unwrap();
        // The watch is bumped after the batch, just after the answer.
        let mut changes = changes;
        let noticed = changes.wait_for(|n| *n > changes_before);
        tokio::time::timeout(Duration::from_secs(5), noticed)
            .await
            .expect("a creation went unnoticed")
            .unwrap();
        group.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn a_quiet_replica_refuses_pre_votes_from_all_but_its_leader() {
        use openraft::raft::{VoteRequest, VoteResponse};
        let dir = tempfile::tempdir().unwrap();
        let group = MetadataGroup::open_single(GroupConfig::new(1, 1, dir.path()))
            .await
            .unwrap();
        let term = group.status().term;
        let from = |candidate: u64| -> VoteRequest<TypeConfig> {
            VoteRequest::new(types::Vote::new(term + 6, candidate), None)
        };
        // Ticking: raft judges every pre-vote.
        assert!(group.refuse_pre_vote(&from(2)).is_none());
        group.set_quiet(true);
        assert!(group.is_quiet());
        let refusal = group
            .refuse_pre_vote(&from(2))
            .expect("refused while quiet");
        let refusal: VoteResponse<TypeConfig> = rmp_serde::from_slice(&refusal).unwrap();
        assert!(!refusal.vote_granted);
        // Through the transport's door too.
        let body = rmp_serde::to_vec(&from(3)).unwrap();
        let answer = group.handle_rpc(RaftRpcKind::PreVote, &body).await.unwrap();
        let answer: VoteResponse<TypeConfig> = rmp_serde::from_slice(&answer).unwrap();
        assert!(!answer.vote_granted);
        // The leader it believes alive is judged by raft: a leader that
        // restarted must be able to win its group back.
        assert!(group.refuse_pre_vote(&from(1)).is_none());
        group.set_quiet(false);
        assert!(group.refuse_pre_vote(&from(2)).is_none());
        group.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn the_default_transport_reports_peers_unreachable() {
        use openraft::RaftNetworkV2;
        use openraft::errors::RPCError;
        use openraft::network::RPCOption;
        use openraft::raft::VoteRequest;
        let mut factory = NetworkFactory {
            group_id: 3,
            transport: Arc::new(UnreachableTransport),
            stopping: CancellationToken::new(),
        };
        let mut peer =
            openraft::RaftNetworkFactory::new_client(&mut factory, 2, &BasicNode::default()).await;
        let request: VoteRequest<TypeConfig> = VoteRequest::new(types::Vote::new(1, 1), None);
        let err = peer
            .vote(request, RPCOption::new(Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    }

    /// A transport whose calls never return.
    #[derive(Debug)]
    struct SilentTransport;

    #[async_trait::async_trait]
    impl GroupTransport for SilentTransport {
        async fn call(
            &self,
            _group_id: u64,
            _target: u64,
            _kind: RaftRpcKind,
            _body: Vec<u8>,
            _timeout_ms: u64,
        ) -> Result<Vec<u8>, TransportError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_stopping_groups_network_fails_its_calls_at_once() {
        use openraft::RaftNetworkV2;
        use openraft::errors::RPCError;
        use openraft::network::RPCOption;
        use openraft::raft::VoteRequest;
        let stopping = CancellationToken::new();
        let mut factory = NetworkFactory {
            group_id: 3,
            transport: Arc::new(SilentTransport),
            stopping: stopping.clone(),
        };
        let mut peer =
            openraft::RaftNetworkFactory::new_client(&mut factory, 2, &BasicNode::default()).await;
        let call = tokio::spawn(async move {
            let request: VoteRequest<TypeConfig> = VoteRequest::new(types::Vote::new(1, 1), None);
            peer.vote(request, RPCOption::new(Duration::from_secs(60)))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!call.is_finished(), "the call waits for its answer");
        stopping.cancel();
        let err = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("the call ended with the stop")
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_call_in_flight_when_the_stop_begins_answers_stopped() {
        let dir = tempfile::tempdir().unwrap();
        // A voter of three whose peers never answer: no leader, ever.
        let group = MetadataGroup::open(
            GroupConfig::new(4, 1, dir.path()),
            Arc::new(SilentTransport),
        )
        .await
        .unwrap();
        group.initialize(&[1, 2, 3]).await.unwrap();
        let waiting = {
            let group = group.clone();
            tokio::spawn(async move { group.wait_for_leader(60_000).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "no leader yet");
        group.begin_shutdown();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ended as the stop began")
            .unwrap();
        assert!(matches!(answer, Err(GroupError::Stopped)), "{answer:?}");
        let late = group.propose(create("late")).await;
        assert!(matches!(late, Err(GroupError::Stopped)), "{late:?}");
        group.shutdown().await.unwrap();
        // Twice is fine.
        group.shutdown().await.unwrap();
    }

    #[test]
    fn rpc_kind_tags_round_trip() {
        for kind in [
            RaftRpcKind::AppendEntries,
            RaftRpcKind::Vote,
            RaftRpcKind::PreVote,
            RaftRpcKind::FullSnapshot,
            RaftRpcKind::TransferLeader,
        ] {
            assert_eq!(RaftRpcKind::from_tag(kind.tag()), Some(kind));
        }
        assert_eq!(RaftRpcKind::from_tag(0), None);
    }
}
