//! The metadata plane: where topics, ranges and segments live.
//!
//! The broker talks to metadata only through [`MetadataPlane`] (ADR 0060,
//! ADR 0081). Metadata is sharded by topic into vnodes (ADR 0080): the
//! default plane, [`VnodePlane`], routes every topic-level operation through
//! `malachi_cluster::vnodes::VnodeHost` to the vnode that owns the topic,
//! wherever its leader is, and reads the local replica of that vnode for the
//! data path. A lone broker runs the same plane with one vnode and one voter.
//! [`FilePlane`] (one state, a snapshot file per command) and [`RaftPlane`]
//! (one group, one voter) remain as single-state planes.
//! All apply the same deterministic model (`MetadataState::apply`): a refused
//! command leaves the state unchanged, an accepted one is durable before
//! `propose` returns.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use malachi_cluster::group::{GroupConfig, MetadataGroup};
use malachi_cluster::vnodes::VnodeHost;
use malachi_cluster::vnodes::broker_api::{TopicSummary, summarize};
use malachi_core::model::{
    Command, CursorKeyRing, MetadataState, ModelError, Outcome, TopicDescription,
};
use malachi_core::ring::VnodeId;
use parking_lot::RwLock;
use tokio::sync::{Mutex, watch};

pub use crate::common::error::MetadataError;

/// A model verdict: the accepted outcome or the model's refusal.
pub type Verdict = Result<Outcome, ModelError>;

/// A linearizable, durable metadata store applying the cluster model,
/// sharded by topic.
#[async_trait::async_trait]
pub trait MetadataPlane: Send + Sync + std::fmt::Debug {
    /// Applies a command on the vnode that owns its topic; returns once it
    /// is durable. The inner result is the model's own answer (a refusal
    /// leaves the state unchanged).
    async fn propose(&self, cmd: Command) -> Result<Verdict, MetadataError>;
    /// Runs `f` over this broker's replica of the vnode owning `topic` (a
    /// local, possibly stale read on a follower; an empty state when this
    /// broker holds no replica of that vnode). `f` is called exactly once.
    fn view_topic(&self, topic: &str, f: &mut dyn FnMut(&MetadataState));
    /// Runs `f` over every replica this broker holds.
    fn view_each(&self, f: &mut dyn FnMut(&MetadataState));
    /// A linearizable description of `topic` from its vnode's leader.
    async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, MetadataError>;
    /// Every topic of every vnode, each vnode read from its leader, in
    /// name order.
    async fn list(&self) -> Result<Vec<TopicSummary>, MetadataError>;
    /// The vnode that owns `topic`.
    fn vnode_of(&self, topic: &str) -> VnodeId;
    /// The vnode host, for planes that shard over vnodes.
    fn host(&self) -> Option<&Arc<VnodeHost>> {
        None
    }
    /// The writer gate (ADR 0134): `Ok` while `feature` is active. A plane
    /// without vnodes holds no feature table and keeps the baseline.
    fn require(
        &self,
        feature: malachi_core::model::Feature,
    ) -> Result<(), malachi_core::model::FeatureInactive> {
        match self.host() {
            Some(host) => host.require(feature),
            None => malachi_core::model::FeatureTable::default().require(feature),
        }
    }
    /// The cluster's cursor keys, from the group that holds them (the
    /// ring's group on a vnode plane, read at its leader); `None` until
    /// created (ADR 0096).
    async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, MetadataError>;
    /// The cursor keys in this broker's own replica of the group that holds
    /// them, without a quorum: committed keys, possibly not the newest
    /// (keys are only ever added, so these still verify what they did).
    /// `None` when this broker holds no replica or it has no keys yet.
    fn cursor_keys_local(&self) -> Option<CursorKeyRing>;
    /// Applies a cursor key command (`CreateCursorKey`, `RotateCursorKey`)
    /// in the group that holds the keys.
    async fn propose_cursor_key(&self, cmd: Command) -> Result<Verdict, MetadataError>;
    /// Bumped after every command applied on any local replica, lease
    /// renewals aside (ADR 0101).
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// Stops the plane; later proposals fail with `Shutdown`.
    async fn shutdown(&self) -> Result<(), MetadataError>;
}

/// Reads the local replica owning `topic` through a plane, returning a value.
pub fn read_owner<R>(
    plane: &dyn MetadataPlane,
    topic: &str,
    f: impl FnOnce(&MetadataState) -> R,
) -> R {
    let mut f = Some(f);
    let mut out = None;
    plane.view_topic(topic, &mut |state| {
        if let Some(f) = f.take() {
            out = Some(f(state));
        }
    });
    // `view_topic` calls the closure exactly once; every plane here does.
    match out {
        Some(out) => out,
        None => unreachable_view(),
    }
}

#[cold]
fn unreachable_view() -> ! {
    panic!("a metadata plane's view did not call its closure")
}

/// The state a broker without a replica of a vnode reads: no topics.
static EMPTY_STATE: LazyLock<MetadataState> = LazyLock::new(MetadataState::new);

/// The plane of a broker in a vnode cluster (a lone broker is a cluster of
/// one): proposals, describes and lists are routed by `VnodeHost` to each
/// vnode's leader; the data path reads local replicas.
#[derive(Debug)]
pub struct VnodePlane {
    host: Arc<VnodeHost>,
    version: watch::Sender<u64>,
    /// Turns the applied index of every hosted group into `version`,
    /// including groups opened after the plane (a split's child).
    watcher: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl VnodePlane {
    /// Wraps an open host. Needs a tokio runtime (it spawns the watcher).
    pub fn new(host: Arc<VnodeHost>) -> VnodePlane {
        let (version, _) = watch::channel(0u64);
        let watcher = tokio::spawn(watch_applied(Arc::downgrade(&host), version.clone()));
        VnodePlane {
            host,
            version,
            watcher: parking_lot::Mutex::new(Some(watcher)),
        }
    }
}

/// Bumps `version` on every command applied by any group `host` holds. The
/// registry is re-read whenever the host opens a group, so a group opened
/// after the plane (a split's child, a vnode a newer ring added) is watched
/// from its opening: reconciliation follows its changes at once rather
/// than on the manager's slow timer. Per-group tasks end with this one
/// (the `JoinSet` aborts them when dropped).
async fn watch_applied(host: std::sync::Weak<VnodeHost>, version: watch::Sender<u64>) {
    let Some(mut opened) = host.upgrade().map(|h| h.watch_groups_opened()) else {
        return;
    };
    let mut watched = std::collections::BTreeSet::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        // Weak: the plane, not this task, keeps the host alive.
        let Some(groups) = host.upgrade().map(|h| h.registry().all()) else {
            break;
        };
        let mut added = false;
        for group in groups {
            // By opening, not by group id: a replica reopened after it
            // went fatal (ADR 0135) is a new handle to watch.
            if !watched.insert(group.serial()) {
                continue;
            }
            added = true;
            // Lease renewals change nothing reconciliation reads.
            let mut applied = group.subscribe_changes();
            let version = version.clone();
            tasks.spawn(async move {
                while applied.changed().await.is_ok() {
                    version.send_modify(|v| *v = v.wrapping_add(1));
                }
            });
        }
        if added {
            // A new group may already hold applied entries (a seeded child):
            // count its opening as a change.
            version.send_modify(|v| *v = v.wrapping_add(1));
        }
        // Finished per-group tasks (a group shut down) are reaped here so
        // the set does not grow.
        while tasks.try_join_next().is_some() {}
        if opened.changed().await.is_err() {
            break;
        }
    }
}

impl Drop for VnodePlane {
    fn drop(&mut self) {
        if let Some(watcher) = self.watcher.lock().take() {
            watcher.abort();
        }
    }
}

#[async_trait::async_trait]
impl MetadataPlane for VnodePlane {
    async fn propose(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        Ok(self.host.propose(cmd).await?)
    }

    fn view_topic(&self, topic: &str, f: &mut dyn FnMut(&MetadataState)) {
        let vnode = self.host.ring().owner(topic).id;
        match self.host.group(vnode) {
            Some(group) => group.read_local(|state| f(state)),
            None => f(&EMPTY_STATE),
        }
    }

    fn view_each(&self, f: &mut dyn FnMut(&MetadataState)) {
        for group in self.host.registry().all() {
            group.read_local(|state| f(state));
        }
    }

    async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, MetadataError> {
        Ok(self.host.describe(topic).await?)
    }

    async fn list(&self) -> Result<Vec<TopicSummary>, MetadataError> {
        let vnodes: Vec<VnodeId> = self.host.ring().vnodes().map(|v| v.id).collect();
        // Every vnode at once: a list costs one round trip, not one per vnode.
        let lists =
            futures::future::join_all(vnodes.into_iter().map(|v| self.host.list_vnode(v))).await;
        let mut topics = Vec::new();
        for list in lists {
            topics.extend(list?);
        }
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    fn vnode_of(&self, topic: &str) -> VnodeId {
        self.host.ring().owner(topic).id
    }

    fn host(&self) -> Option<&Arc<VnodeHost>> {
        Some(&self.host)
    }

    async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, MetadataError> {
        Ok(self.host.cursor_keys().await?)
    }

    fn cursor_keys_local(&self) -> Option<CursorKeyRing> {
        self.host
            .ring_group()
            .and_then(|group| group.read_local(|s| s.cursor_keys().cloned()))
    }

    async fn propose_cursor_key(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        Ok(self.host.propose_ring(cmd).await?)
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    async fn shutdown(&self) -> Result<(), MetadataError> {
        if let Some(watcher) = self.watcher.lock().take() {
            watcher.abort();
        }
        self.host.shutdown().await;
        Ok(())
    }
}

/// A single-voter plane that keeps the applied state in memory and persists a
/// full snapshot (rmp-serde, from the model) with write, fsync, rename and
/// directory fsync after every accepted command. It stands in for the raft
/// group until `malachi_cluster::group` lands; the state is small, so a whole
/// snapshot per command is cheap at metadata rates.
#[derive(Debug)]
pub struct FilePlane {
    dir: PathBuf,
    state: RwLock<Arc<MetadataState>>,
    propose_lock: Mutex<bool>,
    version: watch::Sender<u64>,
}

const STATE_FILE: &str = "state.bin";

impl FilePlane {
    /// Opens (or creates) the plane in `dir`.
    pub fn open(dir: &Path) -> Result<FilePlane, MetadataError> {
        let io = |path: &Path, e: std::io::Error| MetadataError::Io {
            path: path.to_path_buf(),
            source: Arc::new(e),
        };
        fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(STATE_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => MetadataState::restore(&bytes).map_err(|e| MetadataError::Corrupt {
                path: path.clone(),
                source: Arc::new(e),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => MetadataState::new(),
            Err(e) => return Err(io(&path, e)),
        };
        let (version, _) = watch::channel(0);
        Ok(FilePlane {
            dir: dir.to_path_buf(),
            state: RwLock::new(Arc::new(state)),
            propose_lock: Mutex::new(false),
            version,
        })
    }

    fn persist(&self, state: &MetadataState) -> Result<(), MetadataError> {
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join("state.bin.tmp");
        let io = |path: &Path, e: std::io::Error| MetadataError::Io {
            path: path.to_path_buf(),
            source: Arc::new(e),
        };
        let bytes = state.snapshot().map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            source: Arc::new(e),
        })?;
        let mut file = fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        file.write_all(&bytes).map_err(|e| io(&tmp, e))?;
        file.sync_all().map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        // The rename is durable only once the directory entry is.
        fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(&self.dir, e))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl MetadataPlane for FilePlane {
    async fn propose(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        // One proposal at a time: the lock is the single voter's log order.
        let shut = self.propose_lock.lock().await;
        if *shut {
            return Err(MetadataError::Shutdown);
        }
        let mut next = MetadataState::clone(&self.state.read());
        let outcome = match next.apply(cmd) {
            Ok(outcome) => outcome,
            Err(refused) => return Ok(Err(refused)),
        };
        // Small and rare: a blocking fsync here costs less than a thread hop.
        tokio::task::block_in_place(|| self.persist(&next))?;
        *self.state.write() = Arc::new(next);
        self.version.send_modify(|v| *v += 1);
        Ok(Ok(outcome))
    }

    fn view_topic(&self, _topic: &str, f: &mut dyn FnMut(&MetadataState)) {
        let state = Arc::clone(&self.state.read());
        f(&state);
    }

    fn view_each(&self, f: &mut dyn FnMut(&MetadataState)) {
        let state = Arc::clone(&self.state.read());
        f(&state);
    }

    async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, MetadataError> {
        Ok(self.state.read().describe_topic(topic))
    }

    async fn list(&self) -> Result<Vec<TopicSummary>, MetadataError> {
        Ok(summarize(&self.state.read()))
    }

    async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, MetadataError> {
        Ok(self.state.read().cursor_keys().cloned())
    }

    fn cursor_keys_local(&self) -> Option<CursorKeyRing> {
        self.state.read().cursor_keys().cloned()
    }

    async fn propose_cursor_key(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        self.propose(cmd).await
    }

    fn vnode_of(&self, _topic: &str) -> VnodeId {
        VnodeId(0)
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    async fn shutdown(&self) -> Result<(), MetadataError> {
        *self.propose_lock.lock().await = true;
        Ok(())
    }
}

/// The metadata raft group with this broker as its single voter: the same
/// code path a cluster runs, with N = 1. Its log, vote and snapshots live
/// on disk, so topics survive restarts.
#[derive(Debug, Clone)]
pub struct RaftPlane {
    group: MetadataGroup,
}

impl RaftPlane {
    /// Opens (or recovers) group `group_id` in `dir`, waiting until this node
    /// leads and has applied everything committed.
    pub async fn open_single(
        group_id: u64,
        node_id: u64,
        dir: &Path,
    ) -> Result<RaftPlane, MetadataError> {
        let group = MetadataGroup::open_single(GroupConfig::new(group_id, node_id, dir)).await?;
        Ok(RaftPlane { group })
    }

    /// The group itself (status, leadership).
    pub fn group(&self) -> &MetadataGroup {
        &self.group
    }
}

#[async_trait::async_trait]
impl MetadataPlane for RaftPlane {
    async fn propose(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        Ok(self.group.propose(cmd).await?)
    }

    fn view_topic(&self, _topic: &str, f: &mut dyn FnMut(&MetadataState)) {
        self.group.read_local(|state| f(state));
    }

    fn view_each(&self, f: &mut dyn FnMut(&MetadataState)) {
        self.group.read_local(|state| f(state));
    }

    async fn describe(&self, topic: &str) -> Result<Option<TopicDescription>, MetadataError> {
        let topic = topic.to_owned();
        Ok(self.group.read(move |s| s.describe_topic(&topic)).await?)
    }

    async fn list(&self) -> Result<Vec<TopicSummary>, MetadataError> {
        Ok(self.group.read(summarize).await?)
    }

    async fn cursor_keys(&self) -> Result<Option<CursorKeyRing>, MetadataError> {
        Ok(self.group.read(|s| s.cursor_keys().cloned()).await?)
    }

    fn cursor_keys_local(&self) -> Option<CursorKeyRing> {
        self.group.read_local(|s| s.cursor_keys().cloned())
    }

    async fn propose_cursor_key(&self, cmd: Command) -> Result<Verdict, MetadataError> {
        self.propose(cmd).await
    }

    fn vnode_of(&self, _topic: &str) -> VnodeId {
        VnodeId(0)
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.group.subscribe()
    }

    async fn shutdown(&self) -> Result<(), MetadataError> {
        Ok(self.group.shutdown().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(topic: &str) -> Command {
        Command::CreateTopic {
            topic: topic.into(),
            initial_ranges: 1,
            policy: None,
            replicas: vec![vec![malachi_core::model::NodeId(1)]],
            at_ms: 7,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_accepted_command_survives_reopening_the_plane() {
        let dir = tempfile::tempdir().unwrap();
        let plane = FilePlane::open(dir.path()).unwrap();
        plane.propose(create("orders")).await.unwrap().unwrap();
        drop(plane);
        let plane = FilePlane::open(dir.path()).unwrap();
        assert!(read_owner(&plane, "orders", |s| s
            .topic("orders")
            .is_some()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_command_is_returned_as_the_models_error() {
        let dir = tempfile::tempdir().unwrap();
        let plane = FilePlane::open(dir.path()).unwrap();
        plane.propose(create("orders")).await.unwrap().unwrap();
        let again = plane.propose(create("orders")).await.unwrap();
        assert!(matches!(again, Err(ModelError::TopicExists { .. })));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_raft_plane_keeps_an_accepted_command_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let plane = RaftPlane::open_single(0, 1, dir.path()).await.unwrap();
        plane.propose(create("orders")).await.unwrap().unwrap();
        plane.shutdown().await.unwrap();
        let plane = RaftPlane::open_single(0, 1, dir.path()).await.unwrap();
        assert!(read_owner(&plane, "orders", |s| s
            .topic("orders")
            .is_some()));
        plane.shutdown().await.unwrap();
    }

    /// A lone broker's vnode plane over two vnodes.
    async fn lone_vnode_plane(dir: &Path) -> VnodePlane {
        use malachi_cluster::group::{TcpTransport, TcpTransportConfig};
        use malachi_cluster::vnodes::VnodeHostConfig;
        let transport = Arc::new(TcpTransport::new(TcpTransportConfig::new(
            1,
            malachi_cluster::group::ClusterCookie::new("a-test-cookie").unwrap(),
        )));
        let mut config = VnodeHostConfig::new(1, vec![1], dir);
        config.vnode_count = 2;
        let host = VnodeHost::open(config, transport).await.unwrap();
        VnodePlane::new(host)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_split_childs_applied_changes_reach_the_planes_subscribers() {
        let dir = tempfile::tempdir().unwrap();
        let plane = lone_vnode_plane(dir.path()).await;
        let host = Arc::clone(plane.host().unwrap());
        // The ring's group holds a ring once some broker fetched it.
        host.refresh_ring().await.unwrap();
        let (_, child) = host.split_vnode(VnodeId(0)).await.unwrap();
        let topic = (0..10_000)
            .map(|i| format!("t{i}"))
            .find(|t| host.ring().owner(t).id == child)
            .unwrap();
        let mut applied = plane.subscribe();
        // Let the split's own entries settle, then mark everything seen: the
        // next change is the creation below, applied only in the child.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        applied.borrow_and_update();
        plane.propose(create(&topic)).await.unwrap().unwrap();
        assert_eq!(plane.vnode_of(&topic), child);
        let noticed =
            tokio::time::timeout(std::time::Duration::from_secs(10), applied.changed()).await;
        assert!(
            matches!(noticed, Ok(Ok(()))),
            "a change in the split's child was not noticed"
        );
        plane.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proposals_after_shutdown_fail() {
        let dir = tempfile::tempdir().unwrap();
        let plane = FilePlane::open(dir.path()).unwrap();
        plane.shutdown().await.unwrap();
        assert!(matches!(
            plane.propose(create("orders")).await,
            Err(MetadataError::Shutdown)
        ));
    }
}
