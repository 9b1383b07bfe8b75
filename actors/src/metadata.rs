//! The metadata plane: where topics, ranges and segments live.
//!
//! The broker talks to metadata only through [`MetadataPlane`], so the
//! openraft-backed group ([`RaftPlane`] over
//! `malachi_cluster::group::MetadataGroup`, the default) and the
//! single-node file-backed plane ([`FilePlane`]) are interchangeable
//! (ADR 0060).
//! Both apply the same deterministic model (`MetadataState::apply`): a refused
//! command leaves the state unchanged, an accepted one is durable before
//! `propose` returns.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use malachi_cluster::group::{GroupConfig, GroupError, MetadataGroup};
use malachi_cluster::model::{Command, MetadataState, ModelError, Outcome};
use parking_lot::RwLock;
use tokio::sync::{Mutex, watch};

/// Why the metadata plane could not serve a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata i/o error on {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("metadata snapshot in {path} is unreadable: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("the metadata plane is shut down")]
    Shutdown,
    #[error("the metadata plane is not open yet")]
    NotOpen,
    #[error("metadata group error: {reason}")]
    Group { reason: String, fatal: bool },
}

impl From<GroupError> for MetadataError {
    fn from(e: GroupError) -> MetadataError {
        match e {
            GroupError::Stopped => MetadataError::Shutdown,
            other => MetadataError::Group {
                fatal: other.is_fatal(),
                reason: other.to_string(),
            },
        }
    }
}

/// A linearizable, durable metadata store applying the cluster model.
#[async_trait::async_trait]
pub trait MetadataPlane: Send + Sync + std::fmt::Debug {
    /// Applies a command; returns once it is durable. The inner result is the
    /// model's own answer (a refusal leaves the state unchanged).
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, MetadataError>;
    /// Runs `f` over the current applied state (a local, possibly stale read
    /// on a follower; on the single voter it is current).
    fn view(&self, f: &mut dyn FnMut(&MetadataState));
    /// Bumped after every applied command.
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// Stops the plane; later proposals fail with `Shutdown`.
    async fn shutdown(&self) -> Result<(), MetadataError>;
}

/// Reads the state through a plane, returning a value.
pub fn read<R>(plane: &dyn MetadataPlane, f: impl FnOnce(&MetadataState) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    plane.view(&mut |state| {
        if let Some(f) = f.take() {
            out = Some(f(state));
        }
    });
    // `view` calls the closure exactly once; both planes here guarantee it.
    match out {
        Some(out) => out,
        None => unreachable_view(),
    }
}

#[cold]
fn unreachable_view() -> ! {
    panic!("a metadata plane's view did not call its closure")
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
            reason: e.to_string(),
        };
        fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(STATE_FILE);
        let state = match fs::read(&path) {
            Ok(bytes) => MetadataState::restore(&bytes).map_err(|e| MetadataError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
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
            reason: e.to_string(),
        };
        let bytes = state.snapshot().map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
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
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, MetadataError> {
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

    fn view(&self, f: &mut dyn FnMut(&MetadataState)) {
        let state = Arc::clone(&self.state.read());
        f(&state);
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
    async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ModelError>, MetadataError> {
        Ok(self.group.propose(cmd).await?)
    }

    fn view(&self, f: &mut dyn FnMut(&MetadataState)) {
        self.group.read_local(|state| f(state));
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
            replicas: vec![vec![malachi_cluster::model::NodeId(1)]],
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
        assert!(read(&plane, |s| s.topic("orders").is_some()));
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
        assert!(read(&plane, |s| s.topic("orders").is_some()));
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
