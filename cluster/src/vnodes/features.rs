//! A broker's side of versions and feature gates (ADR 0134): what it
//! advertises to the ring group's feature table, the table as it last read
//! it (what the writer gates consult), the refusal at start of a binary
//! lacking a finalized feature, and the operator's activate and finalize.
//!
//! Nothing is written to a pristine table until every member gossips that
//! it reads it (ADR 0134 §7, `FEATURES_ATTRIBUTE`): brokers from before the
//! table cannot decode its commands, so the first upgrade onto feature
//! gates stays rolling. The advertiser waits for that, and both it and the
//! table watch are started again if they panic (`spawn_restarting`).

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use malachi_core::model::{
    Command, FEATURE_TABLE, Feature, FeatureInactive, FeatureTable, ModelError, Outcome,
    decommissioned, table_held_back_by,
};
use malachi_core::ring::Ring;
use tokio::sync::watch;

use serde::{Deserialize, Serialize};

use super::{RouteError, VnodeHost};
use crate::group::fsio;

/// Where a broker keeps what its cluster finalized (ADR 0134), so that a
/// binary lacking it is refused at start before any group replays a log.
pub const FINALIZED_FILE: &str = "features.finalized";
const FINALIZED_FILE_MAGIC: &[u8; 8] = b"MALFEAT1";
/// The largest finalized file read back (256 names of 64 bytes fit).
const FINALIZED_FILE_BYTES_MAX: u64 = 64 * 1024;

/// What a broker's data dir records its cluster finalized. Only grows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalizedRecord {
    /// The finalized cluster version.
    pub version: u32,
    /// The finalized features.
    pub features: BTreeSet<String>,
}

impl FinalizedRecord {
    fn of(table: &FeatureTable) -> FinalizedRecord {
        FinalizedRecord {
            version: table.version(),
            features: table.finalized(),
        }
    }

    /// Both records together: the higher version, every feature.
    fn union(&self, other: &FinalizedRecord) -> FinalizedRecord {
        FinalizedRecord {
            version: self.version.max(other.version),
            features: self.features.union(&other.features).cloned().collect(),
        }
    }

    /// The file's bytes: a magic tag, then the rmp-serde body.
    pub fn encode(&self) -> std::io::Result<Vec<u8>> {
        let body = rmp_serde::to_vec(self).map_err(std::io::Error::other)?;
        fsio::encode_tagged(FINALIZED_FILE_MAGIC, &body)
    }

    /// The record a file holds; `None` for a damaged one.
    pub fn decode(bytes: &[u8]) -> Option<FinalizedRecord> {
        let body =
            fsio::decode_tagged(FINALIZED_FILE_MAGIC, bytes, FINALIZED_FILE_BYTES_MAX).ok()?;
        rmp_serde::from_slice(body).ok()
    }
}

/// The longest a broker's writer gates go without re-reading the feature
/// table: a broker hosting a replica of the ring's group re-reads it from
/// that replica on every change as well.
pub const FEATURE_REFRESH_MS: u64 = 5_000;
use crate::group::{ConfigProblem, GroupError};

/// How often an advertiser waiting for every member to gossip that it
/// reads the feature table looks again without a membership change (a
/// member decommissioned, a ring fetched).
pub const FEATURE_GATE_RECHECK_MS: u64 = 5_000;

/// The pause before a panicked advertiser or table watch starts again.
const FEATURE_TASK_RESTART_PAUSE_MS: u64 = 1_000;

/// The pause before an advertiser that could not reach the ring's group
/// tries again.
const ADVERTISE_RETRY_MS: u64 = 500;

/// What SWIM says of who reads the feature table (ADR 0134 §7).
#[derive(Debug)]
pub(super) struct FeatureGossip {
    /// The brokers gossiping `FEATURES_ATTRIBUTE`, as the broker's
    /// membership follower last said; `None` until it first says.
    readers: watch::Sender<Option<BTreeSet<u64>>>,
    /// The members last logged as holding the table back: the wait is
    /// logged once per change, not on every check.
    logged: parking_lot::Mutex<Vec<u64>>,
}

impl Default for FeatureGossip {
    fn default() -> FeatureGossip {
        FeatureGossip {
            readers: watch::Sender::new(None),
            logged: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

/// Where one try to advertise got.
#[derive(Debug)]
enum AdvertiseStep {
    /// The ring's group answered (the inner `Err` is its refusal).
    Done(Result<Outcome, ModelError>),
    /// The table is pristine and these members do not gossip that they
    /// read it: nothing was written.
    Waiting,
}

/// What the file at `path` records; empty if there is none. A damaged
/// file is logged and read as empty: the ring group's refusal of the
/// advertisement still stands behind it.
pub(super) fn load_finalized(path: &std::path::Path) -> FinalizedRecord {
    match std::fs::read(path) {
        Ok(bytes) => FinalizedRecord::decode(&bytes).unwrap_or_else(|| {
            tracing::warn!(path = %path.display(), "the finalized features file is damaged");
            FinalizedRecord::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FinalizedRecord::default(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the finalized features file is unreadable");
            FinalizedRecord::default()
        }
    }
}

impl VnodeHost {
    /// The feature table as this broker last read it from the ring's
    /// group. Every binary that advertises supports the baseline, so before
    /// the first read the baseline counts as active (a pristine table).
    pub fn features(&self) -> Arc<FeatureTable> {
        Arc::clone(&self.features.read())
    }

    /// Takes `table` as the one the gates read, first keeping what it
    /// finalized in this broker's data dir (only ever growing).
    pub(super) fn adopt_features(&self, table: FeatureTable) {
        let seen = FinalizedRecord::of(&table);
        let mut kept = self.finalized_kept.lock();
        let merged = kept.union(&seen);
        if merged != *kept {
            let path = self.config.data_dir.join(FINALIZED_FILE);
            match merged
                .encode()
                .and_then(|bytes| fsio::write_atomic(&path, &bytes))
            {
                Ok(()) => *kept = merged,
                Err(e) => {
                    tracing::warn!(node = self.config.node_id, error = %e, "what the cluster finalized was not kept on disk")
                }
            }
        }
        drop(kept);
        *self.features.write() = Arc::new(table);
    }

    /// The writer gate: `Ok` only while `feature` is active in the table
    /// this broker last read. Consulted before proposing a gated command.
    pub fn require(&self, feature: Feature) -> Result<(), FeatureInactive> {
        self.features().require(feature)
    }

    /// The brokers whose advertisements hold no feature back.
    pub fn decommissioned(&self) -> BTreeSet<u64> {
        decommissioned(&self.ring())
    }

    /// Tells the host which brokers gossip that they read the feature
    /// table (`FEATURES_ATTRIBUTE`): the broker's membership follower
    /// calls it on every view. Wakes a waiting advertiser when it changes.
    pub fn observe_feature_readers(&self, readers: BTreeSet<u64>) {
        self.feature_gossip.readers.send_if_modified(|known| {
            let changed = known.as_ref() != Some(&readers);
            *known = Some(readers);
            changed
        });
    }

    /// The members that hold writes to `table` back (ADR 0134 §7): none
    /// once it was written, nor where no SWIM is followed (a host without
    /// a membership follower: tests, a lone broker); otherwise every member
    /// of this broker's ring not decommissioned that does not gossip
    /// `FEATURES_ATTRIBUTE`. `malachi cluster version` shows them.
    pub fn feature_table_held_back_by(&self, table: &FeatureTable) -> Vec<u64> {
        self.held_back_by(table, &self.ring())
    }

    fn held_back_by(&self, table: &FeatureTable, ring: &Ring) -> Vec<u64> {
        if !self.config.feature_readers_gossiped {
            return Vec::new();
        }
        let readers = self
            .feature_gossip
            .readers
            .borrow()
            .clone()
            .unwrap_or_default();
        table_held_back_by(table, &ring.members_or(&self.config.nodes), &readers)
    }

    /// Reads the ring record from the ring group's leader and says who
    /// holds writes to its table back, logging a new wait (or its end)
    /// once at info.
    async fn table_gate(&self) -> Result<(FeatureTable, Vec<u64>), RouteError> {
        let record = self.ring_record().await?;
        let held = self.held_back_by(&record.features, &record.ring);
        let mut logged = self.feature_gossip.logged.lock();
        if *logged != held {
            if held.is_empty() {
                tracing::info!(
                    node = self.config.node_id,
                    "every broker reads the feature table: writing to it"
                );
            } else {
                tracing::info!(
                    node = self.config.node_id,
                    waiting_for = ?held,
                    "the feature table is not written until every broker gossips that it reads it (brokers from before ADR 0134 do not): upgrade or decommission them"
                );
            }
            logged.clone_from(&held);
        }
        drop(logged);
        Ok((record.features, held))
    }

    /// The feature table, read linearizably from the ring group's leader
    /// (and cached for the gates).
    pub async fn feature_table(&self) -> Result<FeatureTable, RouteError> {
        Ok(self.ring_record().await?.features)
    }

    /// Proposes `cmd` (an activation or a finalize) in the ring's group and
    /// re-reads the table, so this broker's gates follow at once. Refused
    /// `FeatureUnavailable`, naming them, while members that do not read
    /// the table hold it back.
    async fn change_features(
        &self,
        cmd: Command,
    ) -> Result<Result<Outcome, ModelError>, RouteError> {
        // A fresh ring group holds no ring, and so no table, yet: the
        // gate's read creates it.
        let (_, held) = self.table_gate().await?;
        if !held.is_empty() {
            let feature = match &cmd {
                Command::ActivateFeature { feature } => feature.clone(),
                _ => FEATURE_TABLE.to_owned(),
            };
            return Ok(Err(ModelError::FeatureUnavailable {
                feature,
                missing: held,
            }));
        }
        let verdict = self.propose_ring(cmd).await?;
        self.ring_record().await?;
        Ok(verdict)
    }

    /// Activates an available feature (`malachi feature activate`).
    pub async fn activate_feature(
        &self,
        feature: &str,
    ) -> Result<Result<Outcome, ModelError>, RouteError> {
        tracing::info!(
            node = self.config.node_id,
            feature,
            "feature activation requested"
        );
        self.change_features(Command::ActivateFeature {
            feature: feature.to_owned(),
        })
        .await
    }

    /// Finalizes every active feature (`malachi feature finalize`): from
    /// then on a broker lacking one is refused.
    pub async fn finalize_features(&self) -> Result<Result<Outcome, ModelError>, RouteError> {
        tracing::info!(node = self.config.node_id, "feature finalize requested");
        self.change_features(Command::FinalizeFeatures).await
    }

    /// This broker's advertisement.
    fn advertisement(&self) -> Command {
        Command::AdvertiseFeatures {
            node: self.config.node_id,
            binary: self.config.binary_version.clone(),
            logical: self.config.logical_version,
            supported: self.config.supported_features.clone(),
        }
    }

    /// Whether the table already holds exactly this broker's advertisement.
    fn advertised(&self, table: &FeatureTable) -> bool {
        let me = self.config.node_id;
        table.members().get(&me).is_some_and(|a| {
            a.binary == self.config.binary_version
                && a.logical == self.config.logical_version
                && a.supported.iter().eq(self
                    .config
                    .supported_features
                    .iter()
                    .collect::<BTreeSet<_>>())
        })
    }

    /// Advertises this broker's versions and features unless the table
    /// holds them already, then activates the auto features it finds
    /// available. The inner `Err` is the ring group's refusal: a finalized
    /// feature or version this binary lacks. Writes nothing (`Unchanged`)
    /// while members that do not read the table hold it back, or when
    /// this broker plays a binary from before the table.
    pub async fn advertise_features(&self) -> Result<Result<Outcome, ModelError>, RouteError> {
        match self.try_advertise().await? {
            AdvertiseStep::Done(verdict) => Ok(verdict),
            AdvertiseStep::Waiting => Ok(Ok(Outcome::Unchanged)),
        }
    }

    async fn try_advertise(&self) -> Result<AdvertiseStep, RouteError> {
        if self.config.plays_pre_feature_gates {
            return Ok(AdvertiseStep::Done(Ok(Outcome::Unchanged)));
        }
        let (table, held) = self.table_gate().await?;
        if !held.is_empty() {
            return Ok(AdvertiseStep::Waiting);
        }
        let verdict = if self.advertised(&table) {
            Ok(Outcome::Unchanged)
        } else {
            let verdict = self.propose_ring(self.advertisement()).await?;
            if let Ok(Outcome::FeaturesAdvertised { deactivated }) = &verdict
                && !deactivated.is_empty()
            {
                tracing::warn!(
                    node = self.config.node_id,
                    ?deactivated,
                    "this broker lacks active features: they are inactive until every broker supports them again"
                );
            }
            verdict
        };
        if verdict.is_err() {
            return Ok(AdvertiseStep::Done(verdict));
        }
        let table = self.feature_table().await?;
        let known: Vec<Feature> = self
            .config
            .supported_features
            .iter()
            .filter_map(|name| Feature::from_name(name))
            .collect();
        for feature in table.auto_activations(&known, &self.decommissioned()) {
            match self.activate_feature(feature.name()).await? {
                Ok(_) => {
                    tracing::info!(node = self.config.node_id, %feature, "feature activated: every broker supports it")
                }
                Err(e) => {
                    tracing::info!(node = self.config.node_id, %feature, refused = %e, "feature not activated")
                }
            }
        }
        Ok(AdvertiseStep::Done(verdict))
    }

    /// Refuses to start a broker whose binary lacks what its data dir
    /// records, or its replica of the ring's group says, the cluster
    /// finalized (a downgrade past finalize), naming the feature. A broker
    /// with neither learns it from the ring group's refusal of its
    /// advertisement instead.
    pub(super) fn check_local_features(&self) -> Result<(), GroupError> {
        let kept = self.finalized_kept.lock().clone();
        let me = self.config.node_id;
        let refused = if let Some(feature) = kept
            .features
            .iter()
            .find(|f| !self.config.supported_features.contains(f))
        {
            Some(ModelError::FeatureFinalized {
                node: me,
                feature: feature.clone(),
            })
        } else if self.config.logical_version < kept.version {
            Some(ModelError::VersionFinalized {
                node: me,
                logical: self.config.logical_version,
                version: kept.version,
            })
        } else {
            None
        };
        if let Some(refused) = refused {
            tracing::error!(node = me, %refused, "refusing to start: this binary lacks what the cluster finalized");
            return Err(GroupError::config(ConfigProblem::FeatureRefused(refused)));
        }
        let Some(group) = self.ring_group() else {
            return Ok(());
        };
        let Some(mut table) = group.read_local(|state| state.features().cloned()) else {
            return Ok(());
        };
        let advertised = match self.advertisement() {
            Command::AdvertiseFeatures {
                binary,
                logical,
                supported,
                ..
            } => malachi_core::model::Advertised {
                binary,
                logical,
                supported: supported.into_iter().collect(),
            },
            _ => return Ok(()),
        };
        match table.advertise(self.config.node_id, advertised) {
            Err(
                refused @ (ModelError::FeatureFinalized { .. }
                | ModelError::VersionFinalized { .. }),
            ) => {
                tracing::error!(node = self.config.node_id, %refused, "refusing to start: this binary lacks what the cluster finalized");
                Err(GroupError::config(ConfigProblem::FeatureRefused(refused)))
            }
            _ => Ok(()),
        }
    }

    /// Keeps the table the writer gates read current: from this broker's
    /// replica of the ring's group on each of its changes (and at least
    /// every `FEATURE_REFRESH_MS`), or, without one, from the group's
    /// leader every `FEATURE_REFRESH_MS`. A deactivation (a downgrade
    /// before finalize) so closes every broker's gates within that.
    pub(super) fn spawn_feature_watch(self: &Arc<Self>) {
        let task = spawn_restarting("feature watch", self, watch_features);
        self.background.lock().push(task);
    }

    /// Advertises this broker's features (ADR 0134) once every member
    /// gossips that it reads the table, until the ring's group answers; a
    /// refusal is logged as an error naming the feature. A broker playing
    /// a binary from before the table advertises nothing.
    pub(super) fn spawn_feature_advertiser(self: &Arc<Self>) {
        if self.config.plays_pre_feature_gates {
            tracing::info!(
                node = self.config.node_id,
                "playing a broker from before feature gates: advertising nothing"
            );
            return;
        }
        let task = spawn_restarting("feature advertiser", self, advertise_until_answered);
        self.background.lock().push(task);
    }
}

/// The advertiser's loop: waits (woken by a change of who reads the table,
/// or every `FEATURE_GATE_RECHECK_MS`) while the table is held back, and
/// retries while the ring's group cannot be reached.
async fn advertise_until_answered(host: Weak<VnodeHost>) {
    loop {
        let Some(strong) = host.upgrade() else { return };
        if strong.is_stopped() {
            return;
        }
        let me = strong.config.node_id;
        // Subscribed before the check, so a change during it still wakes.
        let mut readers = strong.feature_gossip.readers.subscribe();
        let pause_ms = match strong.try_advertise().await {
            Ok(AdvertiseStep::Done(Ok(_))) => {
                let ring_version = strong.ring().version();
                tracing::info!(node = me, ring_version, "features advertised to the ring");
                return;
            }
            Ok(AdvertiseStep::Done(Err(refused))) => {
                tracing::error!(node = me, %refused, "the ring's group refused this broker's features");
                return;
            }
            Ok(AdvertiseStep::Waiting) => FEATURE_GATE_RECHECK_MS,
            Err(e) => {
                tracing::info!(node = me, error = %e, "the ring's group not reached yet; advertising again");
                ADVERTISE_RETRY_MS
            }
        };
        drop(strong);
        // Either wakes: a new set of readers, or the pause.
        let _ = tokio::time::timeout(Duration::from_millis(pause_ms), readers.changed()).await;
    }
}

/// The table watch's loop (`VnodeHost::spawn_feature_watch`).
async fn watch_features(host: Weak<VnodeHost>) {
    let period = Duration::from_millis(FEATURE_REFRESH_MS);
    loop {
        let Some(strong) = host.upgrade() else { break };
        if strong.is_stopped() {
            break;
        }
        let changes = match strong.ring_group() {
            Some(group) => {
                if let Some(table) = group.read_local(|s| s.features().cloned()) {
                    strong.adopt_features(table);
                }
                Some(group.subscribe_changes())
            }
            None => {
                if let Err(e) = strong.feature_table().await {
                    tracing::debug!(node = strong.config.node_id, error = %e, "feature table not re-read");
                }
                None
            }
        };
        drop(strong);
        match changes {
            Some(mut changes) => {
                // A stopped group answers at once: wait the period.
                if let Ok(Err(_)) = tokio::time::timeout(period, changes.changed()).await {
                    tokio::time::sleep(period).await;
                }
            }
            None => tokio::time::sleep(period).await,
        }
    }
}

/// Aborts its task when dropped: a supervisor aborted at shutdown takes
/// the task it runs with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `work` on `host` as a task, and starts it again (after
/// `FEATURE_TASK_RESTART_PAUSE_MS`) if it panics while the host lives: a
/// bug in one pass must not leave the broker without its advertiser or
/// its gates' refresh until a restart. Ends when `work` returns.
fn spawn_restarting<F, Fut>(
    what: &'static str,
    host: &Arc<VnodeHost>,
    work: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Weak<VnodeHost>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let node = host.config.node_id;
    let weak = Arc::downgrade(host);
    let alive = move || weak.upgrade().is_some_and(|h| !h.is_stopped());
    let host = Arc::downgrade(host);
    restarting(
        what,
        node,
        move || work(host.clone()),
        alive,
        FEATURE_TASK_RESTART_PAUSE_MS,
    )
}

/// `spawn_restarting` without the host: `alive` says whether a panicked
/// run is to start again, after `pause_ms`.
fn restarting<F, Fut>(
    what: &'static str,
    node: u64,
    work: F,
    alive: impl Fn() -> bool + Send + 'static,
    pause_ms: u64,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut restarts: u64 = 0;
        loop {
            let mut run = AbortOnDrop(tokio::spawn(work()));
            match (&mut run.0).await {
                Err(e) if e.is_panic() => {
                    restarts += 1;
                    tracing::error!(node, what, restarts, error = %e, "panicked; starting it again");
                }
                // Returned, or aborted: either way it is over.
                _ => return,
            }
            if !alive() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_panicking_task_is_started_again_and_a_finished_one_is_not() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&runs);
        let task = restarting(
            "test",
            1,
            move || {
                let counted = Arc::clone(&counted);
                async move {
                    // Panics twice, then finishes.
                    if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                        panic!("injected");
                    }
                }
            },
            || true,
            1,
        );
        task.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_panicking_task_of_a_stopped_host_is_not_started_again() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&runs);
        let task = restarting(
            "test",
            1,
            move || {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    panic!("injected");
                }
            },
            || false,
            1,
        );
        task.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
