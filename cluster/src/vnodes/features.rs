//! A broker's side of versions and feature gates (ADR 0134): what it
//! advertises to the ring group's feature table, the table as it last read
//! it (what the writer gates consult), the refusal at start of a binary
//! lacking a finalized feature, and the operator's activate and finalize.

use std::collections::BTreeSet;
use std::sync::Arc;

use malachi_core::model::{
    Command, Feature, FeatureInactive, FeatureTable, ModelError, Outcome, decommissioned,
};

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

    /// The feature table, read linearizably from the ring group's leader
    /// (and cached for the gates).
    pub async fn feature_table(&self) -> Result<FeatureTable, RouteError> {
        Ok(self.ring_record().await?.features)
    }

    /// Proposes `cmd` (an activation or a finalize) in the ring's group and
    /// re-reads the table, so this broker's gates follow at once.
    async fn change_features(
        &self,
        cmd: Command,
    ) -> Result<Result<Outcome, ModelError>, RouteError> {
        // A fresh ring group holds no ring, and so no table, yet.
        self.ring_record().await?;
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
    /// feature or version this binary lacks.
    pub async fn advertise_features(&self) -> Result<Result<Outcome, ModelError>, RouteError> {
        let table = self.feature_table().await?;
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
            return Ok(verdict);
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
        Ok(verdict)
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
        let host = Arc::downgrade(self);
        let period = std::time::Duration::from_millis(FEATURE_REFRESH_MS);
        let task = tokio::spawn(async move {
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
        });
        self.background.lock().push(task);
    }

    /// Advertises this broker's features until the ring's group answers
    /// (ADR 0134); a refusal is logged as an error naming the feature.
    pub(super) fn spawn_feature_advertiser(self: &Arc<Self>) {
        self.spawn_ring_change("features", |host| async move {
            Some(host.advertise_features().await.map(|verdict| {
                verdict.map(|_| (host.ring().version(), "features advertised to the ring"))
            }))
        });
    }
}
