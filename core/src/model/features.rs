//! Versions and feature gates (ADR 0134), kept in the ring's group beside
//! the ring.
//!
//! Each broker advertises its binary's version and the features it
//! supports (`AdvertiseFeatures`). A feature is *unavailable* while some
//! member has not advertised it, *available* once every member has,
//! *active* once activated (writers may emit its commands and formats from
//! then on), and *finalized* once an operator finalizes: it never goes back
//! and a broker lacking it is refused. Before finalize a broker lacking an
//! active feature is admitted and the feature drops back (a downgrade);
//! after it, the broker is refused naming the feature.
//!
//! The rules read only names and the commands' contents, never this
//! binary's own list of features, so replicas of different versions apply
//! the same log to the same state. The one fixed list is
//! [`BASELINE_FEATURES`]: formats every broker emitted before the table
//! existed, active in a table nobody changed.

use super::command::{ModelError, Outcome};
use super::state::MetadataState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The longest feature name, in bytes.
pub const FEATURE_NAME_BYTES_MAX: usize = 64;
/// The most features one broker may advertise.
pub const FEATURES_ADVERTISED_MAX: usize = 256;
/// The longest binary version string a broker may advertise, in bytes.
pub const BINARY_VERSION_BYTES_MAX: usize = 64;

/// This binary's logical version: what the cluster version ratchets to
/// when an operator finalizes. Raised by a release that adds features.
pub const LOGICAL_VERSION: u32 = 1;

/// A feature this binary knows: a command or format a writer emits only
/// while the feature is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// `Command::AcquireLeaseWaited` (ADR 0122): the lease judged by
    /// generations on monotonic clocks. Without it, `AcquireLease`.
    WaitedLease,
    /// A lease's `generation` (ADR 0122). Rides with `WaitedLease`: the
    /// generation is what the waited request names.
    LeaseGeneration,
    /// The `segment`, `lower_segment` and `upper_segment` fields of
    /// `SplitRange` and `MergeRanges` (chaos finding F6). Without it, they
    /// are left out (`None`), as older brokers wrote them.
    SplitMergeSegments,
    /// `Command::ReleaseLeaseGeneration` (chaos finding F11): a release
    /// naming the generation it gives up, ignored once the lease was
    /// renewed or granted after it. Without it, `ReleaseLease`.
    LeaseReleaseGeneration,
    /// A storage policy's `reshape` field (ADR 0143): automatic
    /// reshaping's per-topic settings. Without it, a policy that sets any
    /// of them is refused, and policies encode as older brokers read them.
    ReshapePolicy,
    /// The admin stores' commands (ADR 0148): `PutUser`, `DeleteUser`,
    /// `AddAcl`, `RemoveAcl` and the lockout's. Without it, none is
    /// proposed: an older broker could not decode them.
    AdminStore,
    /// The token issuer keys' commands (ADR 0152): `AddTokenKey` and
    /// `RemoveTokenKey`. Without it, neither is proposed.
    TokenKeys,
}

/// How a feature goes from available to active.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// A broker activates it as soon as it sees it available.
    Auto,
    /// Only `malachi feature activate` does.
    Explicit,
}

/// Every feature this binary supports, in name order of declaration.
pub const SUPPORTED_FEATURES: [Feature; 7] = [
    Feature::WaitedLease,
    Feature::LeaseGeneration,
    Feature::SplitMergeSegments,
    Feature::LeaseReleaseGeneration,
    Feature::ReshapePolicy,
    Feature::AdminStore,
    Feature::TokenKeys,
];

/// Features every broker emitted before the table existed: active in a
/// table no command changed, so a cluster from before ADR 0134 keeps
/// emitting them. A fixed list, never extended: a new feature starts
/// unavailable.
pub const BASELINE_FEATURES: [&str; 3] =
    ["waited_lease", "lease_generation", "split_merge_segments"];

impl Feature {
    /// The feature's stable name, as the table, the wire and the CLI say it.
    pub fn name(self) -> &'static str {
        match self {
            Feature::WaitedLease => "waited_lease",
            Feature::LeaseGeneration => "lease_generation",
            Feature::SplitMergeSegments => "split_merge_segments",
            Feature::LeaseReleaseGeneration => "lease_release_generation",
            Feature::ReshapePolicy => "reshape_policy",
            Feature::AdminStore => "admin_store",
            Feature::TokenKeys => "token_keys",
        }
    }

    /// The feature of a name, if this binary knows it.
    pub fn from_name(name: &str) -> Option<Feature> {
        SUPPORTED_FEATURES.into_iter().find(|f| f.name() == name)
    }

    /// How it becomes active.
    pub fn activation(self) -> Activation {
        match self {
            Feature::WaitedLease
            | Feature::LeaseGeneration
            | Feature::SplitMergeSegments
            | Feature::LeaseReleaseGeneration
            | Feature::ReshapePolicy
            | Feature::AdminStore
            | Feature::TokenKeys => Activation::Auto,
        }
    }

    /// The names of every feature this binary supports.
    pub fn supported_names() -> Vec<String> {
        SUPPORTED_FEATURES
            .iter()
            .map(|f| f.name().to_owned())
            .collect()
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a feature stands. Ordered: a feature only moves up, except that
/// a downgrade before finalize takes an active one back down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FeatureState {
    /// Some member has not advertised it.
    Unavailable,
    /// Every member supports it; not active yet.
    Available,
    /// Writers may emit it.
    Active,
    /// Active for good: a broker lacking it is refused.
    Finalized,
}

impl FeatureState {
    pub fn name(self) -> &'static str {
        match self {
            FeatureState::Unavailable => "unavailable",
            FeatureState::Available => "available",
            FeatureState::Active => "active",
            FeatureState::Finalized => "finalized",
        }
    }

    /// Whether writers may emit the feature.
    pub fn is_active(self) -> bool {
        self >= FeatureState::Active
    }
}

/// What one broker advertised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advertised {
    /// The binary's version string (`CARGO_PKG_VERSION`), for display.
    pub binary: String,
    /// The binary's [`LOGICAL_VERSION`].
    pub logical: u32,
    pub supported: BTreeSet<String>,
}

/// A writer asked for a feature that is not active.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("feature {feature} is {} in this cluster, not active: not every broker supports it yet, or nobody activated it (`malachi feature list`)", state.name())]
pub struct FeatureInactive {
    pub feature: Feature,
    pub state: FeatureState,
}

/// The cluster's versions and feature states (ADR 0134).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureTable {
    /// Each broker's last advertisement, by node id.
    members: BTreeMap<u64, Advertised>,
    /// The features activated, by name: `true` once finalized.
    activated: BTreeMap<String, bool>,
    /// The finalized cluster version: 0 until an operator finalizes.
    version: u32,
}

impl Default for FeatureTable {
    /// The table of a cluster nobody advertised in: the baseline active.
    fn default() -> FeatureTable {
        FeatureTable {
            members: BTreeMap::new(),
            activated: BASELINE_FEATURES
                .iter()
                .map(|name| ((*name).to_owned(), false))
                .collect(),
            version: 0,
        }
    }
}

impl FeatureTable {
    /// Whether nothing changed it: left out of the ring record's encoding.
    pub fn is_pristine(&self) -> bool {
        *self == FeatureTable::default()
    }

    /// The finalized cluster version (0: never finalized).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The names of the finalized features.
    pub fn finalized(&self) -> BTreeSet<String> {
        self.activated
            .iter()
            .filter(|(_, finalized)| **finalized)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Each broker's advertisement.
    pub fn members(&self) -> &BTreeMap<u64, Advertised> {
        &self.members
    }

    /// Where the named feature stands, counting the advertisements of every
    /// broker not in `gone` (decommissioned brokers do not hold one back).
    pub fn state_of(&self, name: &str, gone: &BTreeSet<u64>) -> FeatureState {
        match self.activated.get(name) {
            Some(true) => FeatureState::Finalized,
            Some(false) => FeatureState::Active,
            None if self.missing(name, gone).is_empty() && self.counted(gone).next().is_some() => {
                FeatureState::Available
            }
            None => FeatureState::Unavailable,
        }
    }

    /// Where a known feature stands (see [`FeatureTable::state_of`]).
    pub fn state(&self, feature: Feature, gone: &BTreeSet<u64>) -> FeatureState {
        self.state_of(feature.name(), gone)
    }

    /// The writer gate: `Ok` only while `feature` is active or finalized.
    pub fn require(&self, feature: Feature) -> Result<(), FeatureInactive> {
        let state = self.state(feature, &BTreeSet::new());
        if state.is_active() {
            Ok(())
        } else {
            Err(FeatureInactive { feature, state })
        }
    }

    /// Every feature name any broker advertised or the table activated,
    /// with its state.
    pub fn states(&self, gone: &BTreeSet<u64>) -> BTreeMap<String, FeatureState> {
        let mut names: BTreeSet<&String> = self.activated.keys().collect();
        names.extend(self.members.values().flat_map(|m| m.supported.iter()));
        names
            .into_iter()
            .map(|name| (name.clone(), self.state_of(name, gone)))
            .collect()
    }

    /// The known auto-activated features that are available now: what a
    /// broker proposes `ActivateFeature` for.
    pub fn auto_activations(&self, known: &[Feature], gone: &BTreeSet<u64>) -> Vec<Feature> {
        known
            .iter()
            .copied()
            .filter(|f| f.activation() == Activation::Auto)
            .filter(|f| self.state(*f, gone) == FeatureState::Available)
            .collect()
    }

    fn counted<'a>(
        &'a self,
        gone: &'a BTreeSet<u64>,
    ) -> impl Iterator<Item = (&'a u64, &'a Advertised)> {
        self.members
            .iter()
            .filter(move |(node, _)| !gone.contains(node))
    }

    /// The counted brokers that do not support `name`.
    pub fn missing(&self, name: &str, gone: &BTreeSet<u64>) -> Vec<u64> {
        self.counted(gone)
            .filter(|(_, a)| !a.supported.contains(name))
            .map(|(node, _)| *node)
            .collect()
    }

    /// Records `node`'s advertisement. Refused if it lacks a finalized
    /// feature or is older than the finalized version; otherwise every
    /// active, unfinalized feature it lacks is deactivated (a downgrade
    /// before finalize), and their names returned.
    pub fn advertise(
        &mut self,
        node: u64,
        advertised: Advertised,
    ) -> Result<Vec<String>, ModelError> {
        check_advertised(node, &advertised)?;
        if let Some((feature, _)) = self
            .activated
            .iter()
            .find(|(name, finalized)| **finalized && !advertised.supported.contains(*name))
        {
            return Err(ModelError::FeatureFinalized {
                node,
                feature: feature.clone(),
            });
        }
        if advertised.logical < self.version {
            return Err(ModelError::VersionFinalized {
                node,
                logical: advertised.logical,
                version: self.version,
            });
        }
        let dropped: Vec<String> = self
            .activated
            .iter()
            .filter(|(name, finalized)| !**finalized && !advertised.supported.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &dropped {
            self.activated.remove(name);
        }
        self.members.insert(node, advertised);
        Ok(dropped)
    }

    /// Activates `name`: refused unless every counted broker supports it.
    /// Returns whether it changed anything.
    pub fn activate(&mut self, name: &str, gone: &BTreeSet<u64>) -> Result<bool, ModelError> {
        match self.state_of(name, gone) {
            FeatureState::Active | FeatureState::Finalized => Ok(false),
            FeatureState::Available => {
                self.activated.insert(name.to_owned(), false);
                Ok(true)
            }
            FeatureState::Unavailable => Err(ModelError::FeatureUnavailable {
                feature: name.to_owned(),
                missing: self.missing(name, gone),
            }),
        }
    }

    /// Finalizes every active feature and ratchets the cluster version to
    /// the lowest logical version among the counted brokers. Returns the
    /// features newly finalized.
    pub fn finalize(&mut self, gone: &BTreeSet<u64>) -> Vec<String> {
        let mut newly = Vec::new();
        for (name, finalized) in self.activated.iter_mut() {
            if !*finalized {
                *finalized = true;
                newly.push(name.clone());
            }
        }
        if let Some(lowest) = self.counted(gone).map(|(_, a)| a.logical).min() {
            self.version = self.version.max(lowest);
        }
        newly
    }
}

fn check_advertised(node: u64, advertised: &Advertised) -> Result<(), ModelError> {
    let invalid = |reason: String| Err(ModelError::InvalidFeatures { node, reason });
    if node == 0 {
        return Err(ModelError::InvalidNode);
    }
    if advertised.binary.len() > BINARY_VERSION_BYTES_MAX {
        return invalid(format!(
            "a binary version longer than {BINARY_VERSION_BYTES_MAX} bytes"
        ));
    }
    if advertised.supported.len() > FEATURES_ADVERTISED_MAX {
        return invalid(format!("more than {FEATURES_ADVERTISED_MAX} features"));
    }
    if let Some(name) = advertised
        .supported
        .iter()
        .find(|n| n.is_empty() || n.len() > FEATURE_NAME_BYTES_MAX)
    {
        return invalid(format!(
            "feature name {name:?} is empty or longer than {FEATURE_NAME_BYTES_MAX} bytes"
        ));
    }
    Ok(())
}

impl MetadataState {
    /// The cluster's feature table, in the ring's own group.
    pub fn features(&self) -> Option<&FeatureTable> {
        self.ring.as_ref().map(|r| &r.features)
    }

    /// The brokers the ring lists as decommissioned: their advertisements
    /// hold no feature back.
    fn gone(&self) -> BTreeSet<u64> {
        self.ring
            .as_ref()
            .map(|r| decommissioned(&r.ring))
            .unwrap_or_default()
    }

    pub(super) fn advertise_features(
        &mut self,
        node: u64,
        advertised: Advertised,
    ) -> Result<Outcome, ModelError> {
        let record = self.ring.as_mut().ok_or(ModelError::NoRing)?;
        // Refusals leave the state as it was: try on a copy.
        let mut table = record.features.clone();
        let deactivated = table.advertise(node, advertised)?;
        record.features = table;
        Ok(Outcome::FeaturesAdvertised { deactivated })
    }

    pub(super) fn activate_feature(&mut self, feature: &str) -> Result<Outcome, ModelError> {
        let gone = self.gone();
        let record = self.ring.as_mut().ok_or(ModelError::NoRing)?;
        if record.features.activate(feature, &gone)? {
            Ok(Outcome::FeatureActivated {
                feature: feature.to_owned(),
            })
        } else {
            Ok(Outcome::Unchanged)
        }
    }

    pub(super) fn finalize_features(&mut self) -> Result<Outcome, ModelError> {
        let gone = self.gone();
        let record = self.ring.as_mut().ok_or(ModelError::NoRing)?;
        let features = record.features.finalize(&gone);
        Ok(Outcome::FeaturesFinalized {
            features,
            version: record.features.version,
        })
    }
}

/// The ring's decommissioned brokers.
pub fn decommissioned(ring: &crate::ring::Ring) -> BTreeSet<u64> {
    ring.members()
        .iter()
        .filter(|(_, s)| **s == crate::ring::MemberState::Decommissioned)
        .map(|(n, _)| *n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ad(logical: u32, supported: &[&str]) -> Advertised {
        Advertised {
            binary: "0.1.0".to_owned(),
            logical,
            supported: supported.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    const NONE: BTreeSet<u64> = BTreeSet::new();

    #[test]
    fn a_feature_is_available_only_once_every_member_advertises_it() {
        let mut t = FeatureTable::default();
        assert_eq!(t.state_of("zeta", &NONE), FeatureState::Unavailable);
        t.advertise(1, ad(1, &["zeta"])).unwrap();
        assert_eq!(t.state_of("zeta", &NONE), FeatureState::Available);
        t.advertise(2, ad(1, &[])).unwrap();
        assert_eq!(t.state_of("zeta", &NONE), FeatureState::Unavailable);
        let refused = t.activate("zeta", &NONE).unwrap_err();
        assert_eq!(
            refused,
            ModelError::FeatureUnavailable {
                feature: "zeta".to_owned(),
                missing: vec![2]
            }
        );
        // A decommissioned broker holds nothing back.
        let gone = BTreeSet::from([2]);
        assert_eq!(t.state_of("zeta", &gone), FeatureState::Available);
        t.advertise(2, ad(1, &["zeta"])).unwrap();
        assert_eq!(t.activate("zeta", &NONE), Ok(true));
        assert_eq!(t.activate("zeta", &NONE), Ok(false));
        assert_eq!(t.state_of("zeta", &NONE), FeatureState::Active);
    }

    #[test]
    fn a_downgrade_before_finalize_deactivates_and_after_it_is_refused_naming_the_feature() {
        let mut t = FeatureTable::default();
        t.advertise(1, ad(2, &["zeta"])).unwrap();
        t.advertise(2, ad(2, &["zeta"])).unwrap();
        t.activate("zeta", &NONE).unwrap();
        // Broker 2 comes back on an older binary: zeta drops back.
        assert_eq!(t.advertise(2, ad(1, &[])), Ok(vec!["zeta".to_owned()]));
        assert_eq!(t.state_of("zeta", &NONE), FeatureState::Unavailable);
        // Upgraded again, activated, finalized.
        t.advertise(2, ad(2, &["zeta"])).unwrap();
        t.activate("zeta", &NONE).unwrap();
        assert_eq!(t.finalize(&NONE), vec!["zeta".to_owned()]);
        assert_eq!(t.version(), 2);
        let before = t.clone();
        let refused = t.advertise(2, ad(2, &[])).unwrap_err();
        assert_eq!(
            refused,
            ModelError::FeatureFinalized {
                node: 2,
                feature: "zeta".to_owned()
            }
        );
        assert!(refused.to_string().contains("zeta"), "{refused}");
        assert_eq!(
            t.advertise(3, ad(1, &["zeta"])),
            Err(ModelError::VersionFinalized {
                node: 3,
                logical: 1,
                version: 2
            })
        );
        assert_eq!(t, before, "a refusal changes nothing");
    }

    #[test]
    fn the_baseline_is_active_in_a_fresh_table_and_the_gate_follows_the_state() {
        let mut t = FeatureTable::default();
        assert!(t.is_pristine());
        for feature in SUPPORTED_FEATURES {
            if BASELINE_FEATURES.contains(&feature.name()) {
                assert_eq!(t.require(feature), Ok(()));
            } else {
                // A feature newer than the table starts unavailable.
                let closed = t.require(feature).unwrap_err();
                assert_eq!(closed.state, FeatureState::Unavailable);
            }
        }
        assert_eq!(
            t.require(Feature::LeaseReleaseGeneration)
                .map_err(|e| e.state),
            Err(FeatureState::Unavailable)
        );
        // A broker lacking one (only a test builds such a broker) closes it.
        t.advertise(1, ad(1, &["waited_lease", "lease_generation"]))
            .unwrap();
        let closed = t.require(Feature::SplitMergeSegments).unwrap_err();
        assert_eq!(closed.state, FeatureState::Unavailable);
        assert!(closed.to_string().contains("split_merge_segments"));
        for f in SUPPORTED_FEATURES {
            assert_eq!(Feature::from_name(f.name()), Some(f));
        }
    }

    #[test]
    fn auto_activation_proposes_only_available_auto_features() {
        let mut t = FeatureTable::default();
        t.advertise(1, ad(1, &["waited_lease"])).unwrap();
        // Two baseline features were deactivated; one broker supports none.
        assert!(t.auto_activations(&SUPPORTED_FEATURES, &NONE).is_empty());
        t.advertise(1, ad(1, &["waited_lease", "split_merge_segments"]))
            .unwrap();
        assert_eq!(
            t.auto_activations(&SUPPORTED_FEATURES, &NONE),
            vec![Feature::SplitMergeSegments]
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Advertise { node: u64, logical: u32, mask: u8 },
        Activate { feature: usize },
        Finalize,
    }

    const NAMES: [&str; 4] = ["a", "b", "c", "d"];

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u64..4, 0u32..3, any::<u8>()).prop_map(|(node, logical, mask)| Step::Advertise {
                node,
                logical,
                mask
            }),
            (0usize..4).prop_map(|feature| Step::Activate { feature }),
            Just(Step::Finalize),
        ]
    }

    fn names(mask: u8) -> Vec<&'static str> {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect()
    }

    proptest! {
        /// Activation only once every member supports it; a finalized
        /// feature never deactivates; the version never goes back; an
        /// active feature is supported by every member (deactivated
        /// otherwise); a refused step changes nothing.
        #[test]
        fn the_table_rules_hold_for_any_sequence(steps in proptest::collection::vec(step(), 0..40)) {
            let mut t = FeatureTable { activated: BTreeMap::new(), ..FeatureTable::default() };
            for step in steps {
                let before = t.clone();
                let result = match step {
                    Step::Advertise { node, logical, mask } => {
                        t.advertise(node, ad(logical, &names(mask))).map(|_| ())
                    }
                    Step::Activate { feature } => {
                        let name = NAMES[feature];
                        let all = !t.members.is_empty() && t.missing(name, &NONE).is_empty();
                        let r = t.activate(name, &NONE).map(|_| ());
                        prop_assert_eq!(r.is_ok(), all || before.activated.contains_key(name));
                        r
                    }
                    Step::Finalize => {
                        t.finalize(&NONE);
                        Ok(())
                    }
                };
                if result.is_err() {
                    prop_assert_eq!(&t, &before);
                }
                prop_assert!(t.version >= before.version);
                for name in NAMES {
                    let was = before.state_of(name, &NONE);
                    let now = t.state_of(name, &NONE);
                    if was == FeatureState::Finalized {
                        prop_assert_eq!(now, FeatureState::Finalized);
                    }
                    if now.is_active() {
                        prop_assert!(t.missing(name, &NONE).is_empty(), "{} active but unsupported", name);
                    }
                    if now.is_active() && !was.is_active() {
                        prop_assert!(!t.members.is_empty());
                    }
                }
            }
        }
    }
}
