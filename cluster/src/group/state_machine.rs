//! The replicated state machine: the pure `MetadataState` behind a lock,
//! with its last applied log id and membership, and its snapshot file.
//!
//! Only snapshots are persisted. On restart the state is restored from the
//! snapshot file and openraft replays the log entries after it, which is
//! the simplest recovery that is still exact: apply is deterministic.
//!
//! `snapshot` file: the magic `MALRSNP1` and one frame holding the snapshot
//! meta (last applied log id, membership) and the model's snapshot bytes,
//! replaced atomically. The applied index is therefore durable exactly when
//! a snapshot is.

use super::error::Corruption;
use super::fsio::{self, MAGIC_BYTES, decode_tagged, encode_tagged};
use super::log_store::OpenError;
use super::types::{
    LogId, Response, Snapshot, SnapshotBytes, SnapshotMeta, StoredMembership, TypeConfig,
};
use futures::{Stream, StreamExt};
use malachi_core::model::MetadataState;
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

pub(crate) const SNAPSHOT_MAGIC: &[u8; MAGIC_BYTES] = b"MALRSNP1";
pub(crate) const SNAPSHOT_FILE: &str = "snapshot";

/// The applied state, shared between the raft state machine task and the
/// group's readers.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub(crate) state: MetadataState,
    pub(crate) last_applied: Option<LogId>,
    pub(crate) membership: StoredMembership,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) applied: RwLock<Applied>,
    pub(crate) applied_index: watch::Sender<u64>,
    /// Bumped after an applied batch that changed anything but the
    /// coordinator lease: what reconciliation follows, so a renewal every
    /// few seconds per vnode does not wake it (ADR 0101).
    pub(crate) changes: watch::Sender<u64>,
    /// Set when a snapshot write failed for want of space.
    pub(crate) no_space: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SnapshotFile {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: SnapshotBytes,
}

#[derive(Debug, Clone)]
pub(crate) struct StateMachine {
    shared: Arc<Shared>,
    snapshot_path: PathBuf,
    snapshot_bytes_max: u64,
    group_id: u64,
}

fn codec_error(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

fn read_snapshot_file(path: &Path, bytes_max: u64) -> Result<Option<SnapshotFile>, OpenError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(OpenError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let corrupt = |problem: Corruption| OpenError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        problem,
    };
    decode_snapshot_file(&bytes, bytes_max)
        .map(Some)
        .map_err(corrupt)
}

/// Decodes a snapshot file's bytes (untrusted: read from disk) into its
/// metadata and the model's snapshot bytes, which `MetadataState::restore`
/// then checks.
pub(crate) fn decode_snapshot_file(
    bytes: &[u8],
    bytes_max: u64,
) -> Result<SnapshotFile, Corruption> {
    let body =
        decode_tagged(SNAPSHOT_MAGIC, bytes, bytes_max).map_err(Corruption::SnapshotFrame)?;
    rmp_serde::from_slice(body).map_err(|e| Corruption::Snapshot(Arc::new(e)))
}

impl StateMachine {
    /// Restores the state from the snapshot in `dir`, if there is one.
    pub(crate) fn open(
        dir: &Path,
        group_id: u64,
        snapshot_bytes_max: u64,
    ) -> Result<StateMachine, OpenError> {
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let staged = fsio::tmp_path(&snapshot_path);
        if staged.exists() {
            fs::remove_file(&staged).map_err(|source| OpenError::Io {
                path: staged.clone(),
                source,
            })?;
        }
        let applied = match read_snapshot_file(&snapshot_path, snapshot_bytes_max)? {
            None => Applied::default(),
            Some(file) => {
                let state = MetadataState::restore(&file.data).map_err(|e| OpenError::Corrupt {
                    path: snapshot_path.clone(),
                    offset: 0,
                    problem: Corruption::SnapshotState(Arc::new(e)),
                })?;
                Applied {
                    state,
                    last_applied: file.meta.last_log_id,
                    membership: file.meta.last_membership,
                }
            }
        };
        let index = applied.last_applied.as_ref().map_or(0, |id| id.index);
        let (applied_index, _) = watch::channel(index);
        let (changes, _) = watch::channel(0);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                applied_index,
                changes,
                no_space: std::sync::atomic::AtomicBool::new(false),
            }),
            snapshot_path,
            snapshot_bytes_max,
            group_id,
        })
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Encodes `file` and replaces the snapshot file with it on tokio's
    /// blocking pool, so the fsyncs never stall the runtime's workers.
    async fn write_snapshot(&self, file: &SnapshotFile) -> io::Result<()> {
        let body = rmp_serde::to_vec(file).map_err(codec_error)?;
        if body.len() as u64 > self.snapshot_bytes_max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "snapshot of {} bytes exceeds {}",
                    body.len(),
                    self.snapshot_bytes_max
                ),
            ));
        }
        let bytes = encode_tagged(SNAPSHOT_MAGIC, &body)?;
        let path = self.snapshot_path.clone();
        tokio::task::spawn_blocking(move || fsio::write_atomic(&path, &bytes))
            .await
            .map_err(|e| io::Error::other(format!("snapshot write did not finish: {e}")))?
    }

    fn logged(&self, op: &str, err: io::Error) -> io::Error {
        if fsio::is_no_space(&err) {
            self.shared
                .no_space
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        tracing::error!(group = self.group_id, op, error = %err, "state machine storage failed; this replica is now fatal");
        err
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotBytes;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let file = {
            let applied = self.shared.applied.read();
            let data = applied.state.snapshot().map_err(codec_error)?;
            SnapshotFile {
                meta: SnapshotMeta {
                    last_log_id: applied.last_applied,
                    last_membership: applied.membership.clone(),
                },
                data,
            }
        };
        self.write_snapshot(&file)
            .await
            .map_err(|e| self.logged("build_snapshot", e))?;
        tracing::info!(group = self.group_id, last_applied = ?file.meta.last_log_id, bytes = file.data.len(), "metadata snapshot written");
        Ok(Snapshot {
            meta: file.meta,
            snapshot: file.data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotBytes;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let applied = self.shared.applied.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut last_index = None;
        let mut changed = false;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let log_id = entry.log_id();
            let response = {
                let mut applied = self.shared.applied.write();
                let verdict = match entry.payload {
                    EntryPayload::Blank => None,
                    EntryPayload::Normal(request) => {
                        changed |= !request.0.is_lease_only();
                        Some(applied.state.apply(request.0))
                    }
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(log_id), membership);
                        changed = true;
                        None
                    }
                };
                last_index = Some(log_id.index);
                applied.last_applied = Some(log_id);
                Response(verdict)
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
        }
        if let Some(index) = last_index {
            self.shared.applied_index.send_replace(index);
        }
        if changed {
            self.shared.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotBytes,
    ) -> Result<(), io::Error> {
        let state = MetadataState::restore(&snapshot).map_err(codec_error)?;
        let file = SnapshotFile {
            meta: meta.clone(),
            data: snapshot,
        };
        self.write_snapshot(&file)
            .await
            .map_err(|e| self.logged("install_snapshot", e))?;
        let index = {
            let mut applied = self.shared.applied.write();
            applied.state = state;
            applied.last_applied = meta.last_log_id;
            applied.membership = meta.last_membership.clone();
            meta.last_log_id.as_ref().map_or(0, |id| id.index)
        };
        self.shared.applied_index.send_replace(index);
        self.shared.changes.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let file = read_snapshot_file(&self.snapshot_path, self.snapshot_bytes_max)
            .map_err(|e| self.logged("get_current_snapshot", io::Error::other(e.to_string())))?;
        Ok(file.map(|f| Snapshot {
            meta: f.meta,
            snapshot: f.data,
        }))
    }
}
