//! Who reads the feature table (ADR 0134 §7): the rule that makes the
//! first upgrade onto feature gates rolling.
//!
//! A broker from before the table cannot decode its commands, nor a ring
//! record whose table is not pristine, and it advertises nothing, so the
//! table cannot refuse it. Every broker that reads the table says so in
//! its SWIM identity ([`FEATURES_ATTRIBUTE`]); while the table is pristine
//! nobody writes to it (advertise, activate, finalize) until every member
//! of the ring that is not decommissioned says so. Once the table has been
//! written, every member read it, and the gate stays open: later upgrades
//! are the table's own business.

use super::features::FeatureTable;
use crate::ring::MemberState;
use std::collections::{BTreeMap, BTreeSet};

/// The SWIM attribute of a broker that reads the feature table: its
/// value is the highest table protocol it decodes.
pub const FEATURES_ATTRIBUTE: &str = "malachi.features";

/// The table protocol this binary decodes: `AdvertiseFeatures`,
/// `ActivateFeature`, `FinalizeFeatures` and a ring record's table.
pub const FEATURE_TABLE_PROTOCOL: u32 = 1;

/// The pseudo-feature a finalize refused by this gate names: the table
/// itself, which the brokers holding it back do not support.
pub const FEATURE_TABLE: &str = "feature_table";

/// The attribute this binary gossips.
pub fn features_attribute() -> (String, String) {
    (
        FEATURES_ATTRIBUTE.to_owned(),
        FEATURE_TABLE_PROTOCOL.to_string(),
    )
}

/// Whether a broker gossiping `attributes` decodes this binary's table
/// protocol. A missing or unreadable value reads as "no".
pub fn reads_feature_table(attributes: &BTreeMap<String, String>) -> bool {
    attributes
        .get(FEATURES_ATTRIBUTE)
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|protocol| protocol >= FEATURE_TABLE_PROTOCOL)
}

/// The members that hold a write to `table` back: none once the table was
/// written, otherwise every member not decommissioned that is not among
/// `readers` (the brokers gossiping [`FEATURES_ATTRIBUTE`]), in id order.
pub fn table_held_back_by(
    table: &FeatureTable,
    members: &BTreeMap<u64, MemberState>,
    readers: &BTreeSet<u64>,
) -> Vec<u64> {
    if !table.is_pristine() {
        return Vec::new();
    }
    let held: Vec<u64> = members
        .iter()
        .filter(|(_, state)| **state != MemberState::Decommissioned)
        .map(|(node, _)| *node)
        .filter(|node| !readers.contains(node))
        .collect();
    debug_assert!(held.windows(2).all(|w| w[0] < w[1]));
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Advertised;

    fn members(active: &[u64], gone: &[u64]) -> BTreeMap<u64, MemberState> {
        active
            .iter()
            .map(|n| (*n, MemberState::Active))
            .chain(gone.iter().map(|n| (*n, MemberState::Decommissioned)))
            .collect()
    }

    #[test]
    fn a_pristine_table_waits_for_every_member_not_decommissioned() {
        let table = FeatureTable::default();
        let readers: BTreeSet<u64> = [1, 2].into();
        assert_eq!(
            table_held_back_by(&table, &members(&[1, 2, 3, 4], &[5]), &readers),
            vec![3, 4]
        );
        let readers: BTreeSet<u64> = [1, 2, 3, 4].into();
        assert!(table_held_back_by(&table, &members(&[1, 2, 3, 4], &[5]), &readers).is_empty());
    }

    #[test]
    fn a_written_table_is_never_held_back() {
        let mut table = FeatureTable::default();
        table
            .advertise(
                1,
                Advertised {
                    binary: "0.1.0".to_owned(),
                    logical: 1,
                    supported: crate::model::Feature::supported_names()
                        .into_iter()
                        .collect(),
                },
            )
            .unwrap();
        assert!(table_held_back_by(&table, &members(&[1, 2, 3], &[]), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn the_attribute_reads_as_a_protocol_at_least_this_binarys() {
        let (key, value) = features_attribute();
        assert!(reads_feature_table(&[(key.clone(), value)].into()));
        assert!(reads_feature_table(&[(key.clone(), "7".to_owned())].into()));
        assert!(!reads_feature_table(
            &[(key.clone(), "0".to_owned())].into()
        ));
        assert!(!reads_feature_table(&[(key, "x".to_owned())].into()));
        assert!(!reads_feature_table(&BTreeMap::new()));
    }
}
