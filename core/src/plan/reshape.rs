//! When a range splits or merges by itself (issue 38, L11; ADR 0143).
//!
//! A range's primary measures its write rate (`crate::rate`) and asks
//! these functions, at each check, what to do: split a range whose bytes
//! per second stayed above `split_write_bytes_per_second` for
//! `split_after_ms`, unless one key carries most of them (a split cannot
//! divide a key) or the topic already has `ranges_max` active ranges;
//! merge two buddies that both stayed below `merge_write_bytes_per_second`
//! for `merge_after_ms` while the topic has more than `ranges_min`. No
//! range is reshaped within `reshape_interval_ms` of the reshape that made
//! it or of a refusal, except that a split's child still hot splits again
//! on its own sustained heat (ADR 0160): splits in a row only grow the
//! topic, and the interval is there against flapping (a split undone by a
//! merge, or the reverse). The caller brings the time and the facts;
//! nothing here reads a clock.

use crate::model::{RangeId, ReshapePolicy};

/// A hottest key carrying at least this share (per mille) of a range's
/// bytes makes the range unsplittable: whichever child holds the key keeps
/// at least that share of the load, so a split would be followed by
/// another, and another, without spreading the key's writes.
pub const HOT_KEY_SHARE_PERMILLE_MIN: u64 = 500;

/// The settings a decision uses: the broker's defaults with the topic's
/// storage policy over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReshapeSettings {
    pub auto_reshape: bool,
    pub split_write_bytes_per_second: u64,
    pub split_after_ms: u64,
    pub merge_write_bytes_per_second: u64,
    pub merge_after_ms: u64,
    pub reshape_interval_ms: u64,
    pub ranges_min: u32,
    pub ranges_max: u32,
}

impl ReshapeSettings {
    /// These settings with a policy's overrides.
    pub fn with_policy(self, policy: Option<&ReshapePolicy>) -> ReshapeSettings {
        let Some(p) = policy else {
            return self;
        };
        ReshapeSettings {
            auto_reshape: p.auto_reshape.unwrap_or(self.auto_reshape),
            split_write_bytes_per_second: p
                .split_write_bytes_per_second
                .unwrap_or(self.split_write_bytes_per_second),
            split_after_ms: p.split_after_ms.unwrap_or(self.split_after_ms),
            merge_write_bytes_per_second: p
                .merge_write_bytes_per_second
                .unwrap_or(self.merge_write_bytes_per_second),
            merge_after_ms: p.merge_after_ms.unwrap_or(self.merge_after_ms),
            reshape_interval_ms: p.reshape_interval_ms.unwrap_or(self.reshape_interval_ms),
            ranges_min: p.ranges_min.unwrap_or(self.ranges_min),
            ranges_max: p.ranges_max.unwrap_or(self.ranges_max),
        }
    }
}

/// What the primary knows of one active range at a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLoad {
    pub range: RangeId,
    /// How long its rate has stayed above the split threshold (0: not above).
    pub above_split_ms: u64,
    /// How long its rate has stayed below the merge threshold (0: not below).
    pub below_merge_ms: u64,
    /// The hottest key's share of its bytes, per mille, if any were written.
    pub hot_key_share_permille: Option<u64>,
    /// When this broker last reshaped it or the range it came from.
    pub last_reshape_ms: Option<u64>,
    /// `last_reshape_ms` is the split that made it (no merge, no refusal
    /// since): a further split waits only for `split_after_ms` of its own.
    pub split_child: bool,
}

/// Why a range is split or merged: the words logs and metrics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Above `split_write_bytes_per_second` for `split_after_ms`.
    WriteRateHigh,
    /// Both buddies below `merge_write_bytes_per_second` for `merge_after_ms`.
    WriteRateLow,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::WriteRateHigh => "write_rate_high",
            Reason::WriteRateLow => "write_rate_low",
        }
    }
}

/// What to do with one range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitDecision {
    Nothing,
    Split {
        range: RangeId,
        reason: Reason,
    },
    /// Hot enough to split, but one key carries this share of its bytes.
    HotKey {
        range: RangeId,
        share_permille: u64,
    },
}

fn recently_reshaped(settings: &ReshapeSettings, now_ms: u64, load: &RangeLoad) -> bool {
    load.last_reshape_ms
        .is_some_and(|at| now_ms.saturating_sub(at) < settings.reshape_interval_ms)
}

/// A split waits out the interval unless the range is a split's child:
/// a split after a split is growth, not flapping.
fn split_held_back(settings: &ReshapeSettings, now_ms: u64, load: &RangeLoad) -> bool {
    !load.split_child && recently_reshaped(settings, now_ms, load)
}

/// Whether `load`'s range splits, given the topic's active ranges.
pub fn decide_split(
    settings: &ReshapeSettings,
    now_ms: u64,
    load: &RangeLoad,
    ranges_active: usize,
) -> SplitDecision {
    let sustained = load.above_split_ms > 0 && load.above_split_ms >= settings.split_after_ms;
    if !settings.auto_reshape || !sustained {
        return SplitDecision::Nothing;
    }
    if let Some(share) = load.hot_key_share_permille
        && share >= HOT_KEY_SHARE_PERMILLE_MIN
    {
        return SplitDecision::HotKey {
            range: load.range,
            share_permille: share,
        };
    }
    // A split turns one active range into two.
    if ranges_active + 1 > settings.ranges_max as usize || split_held_back(settings, now_ms, load) {
        return SplitDecision::Nothing;
    }
    SplitDecision::Split {
        range: load.range,
        reason: Reason::WriteRateHigh,
    }
}

/// Whether two active buddies merge, given the topic's active ranges.
pub fn decide_merge(
    settings: &ReshapeSettings,
    now_ms: u64,
    lower: &RangeLoad,
    upper: &RangeLoad,
    ranges_active: usize,
) -> bool {
    let idle = |l: &RangeLoad| l.below_merge_ms > 0 && l.below_merge_ms >= settings.merge_after_ms;
    settings.auto_reshape
        && idle(lower)
        && idle(upper)
        // A merge turns two active ranges into one.
        && ranges_active > settings.ranges_min.max(1) as usize
        && !recently_reshaped(settings, now_ms, lower)
        && !recently_reshaped(settings, now_ms, upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ReshapeSettings {
        ReshapeSettings {
            auto_reshape: true,
            split_write_bytes_per_second: 4 << 20,
            split_after_ms: 30_000,
            merge_write_bytes_per_second: 256 << 10,
            merge_after_ms: 300_000,
            reshape_interval_ms: 60_000,
            ranges_min: 1,
            ranges_max: 64,
        }
    }

    fn hot(range: u64, above_ms: u64) -> RangeLoad {
        RangeLoad {
            range: RangeId(range),
            above_split_ms: above_ms,
            below_merge_ms: 0,
            hot_key_share_permille: Some(100),
            last_reshape_ms: None,
            split_child: false,
        }
    }

    fn idle(range: u64, below_ms: u64) -> RangeLoad {
        RangeLoad {
            range: RangeId(range),
            above_split_ms: 0,
            below_merge_ms: below_ms,
            hot_key_share_permille: None,
            last_reshape_ms: None,
            split_child: false,
        }
    }

    #[test]
    fn given_a_sustained_high_rate_when_checked_then_it_splits() {
        let d = decide_split(&settings(), 100_000, &hot(3, 30_000), 1);
        assert_eq!(
            d,
            SplitDecision::Split {
                range: RangeId(3),
                reason: Reason::WriteRateHigh
            }
        );
    }

    #[test]
    fn given_a_high_rate_not_yet_sustained_then_nothing() {
        assert_eq!(
            decide_split(&settings(), 100_000, &hot(3, 29_999), 1),
            SplitDecision::Nothing
        );
        assert_eq!(
            decide_split(&settings(), 100_000, &hot(3, 0), 1),
            SplitDecision::Nothing
        );
    }

    #[test]
    fn given_ranges_max_reached_then_no_split() {
        let mut s = settings();
        s.ranges_max = 4;
        assert_eq!(
            decide_split(&s, 100_000, &hot(3, 40_000), 4),
            SplitDecision::Nothing
        );
        assert!(matches!(
            decide_split(&s, 100_000, &hot(3, 40_000), 3),
            SplitDecision::Split { .. }
        ));
    }

    #[test]
    fn given_a_recent_reshape_then_no_split_until_the_interval_passes() {
        let mut load = hot(3, 40_000);
        load.last_reshape_ms = Some(50_000);
        assert_eq!(
            decide_split(&settings(), 109_999, &load, 2),
            SplitDecision::Nothing
        );
        assert!(matches!(
            decide_split(&settings(), 110_000, &load, 2),
            SplitDecision::Split { .. }
        ));
    }

    #[test]
    fn given_a_split_child_still_hot_then_it_splits_without_waiting_the_interval() {
        let mut load = hot(3, 30_000);
        load.last_reshape_ms = Some(90_000);
        load.split_child = true;
        assert!(matches!(
            decide_split(&settings(), 100_000, &load, 2),
            SplitDecision::Split { .. }
        ));
        // Its own heat must still be sustained.
        load.above_split_ms = 29_999;
        assert_eq!(
            decide_split(&settings(), 100_000, &load, 2),
            SplitDecision::Nothing
        );
        // A merge's child (or one refused since) waits the interval.
        load.above_split_ms = 30_000;
        load.split_child = false;
        assert_eq!(
            decide_split(&settings(), 100_000, &load, 2),
            SplitDecision::Nothing
        );
    }

    #[test]
    fn given_a_split_child_gone_idle_then_no_merge_within_the_interval() {
        let mut lower = idle(4, 400_000);
        lower.last_reshape_ms = Some(990_000);
        lower.split_child = true;
        let mut upper = idle(5, 400_000);
        upper.last_reshape_ms = Some(990_000);
        upper.split_child = true;
        assert!(!decide_merge(&settings(), 1_000_000, &lower, &upper, 2));
        assert!(decide_merge(&settings(), 1_050_000, &lower, &upper, 2));
    }

    #[test]
    fn given_one_key_dominating_then_hot_key_not_split() {
        let mut load = hot(3, 40_000);
        load.hot_key_share_permille = Some(HOT_KEY_SHARE_PERMILLE_MIN);
        assert_eq!(
            decide_split(&settings(), 100_000, &load, 1),
            SplitDecision::HotKey {
                range: RangeId(3),
                share_permille: HOT_KEY_SHARE_PERMILLE_MIN
            }
        );
    }

    #[test]
    fn given_auto_reshape_off_then_nothing() {
        let mut s = settings();
        s.auto_reshape = false;
        assert_eq!(
            decide_split(&s, 100_000, &hot(3, 40_000), 1),
            SplitDecision::Nothing
        );
        assert!(!decide_merge(
            &s,
            1_000_000,
            &idle(4, 400_000),
            &idle(5, 400_000),
            2
        ));
    }

    #[test]
    fn given_idle_buddies_above_ranges_min_then_they_merge() {
        let s = settings();
        assert!(decide_merge(
            &s,
            1_000_000,
            &idle(4, 300_000),
            &idle(5, 300_000),
            2
        ));
        // One buddy not idle long enough.
        assert!(!decide_merge(
            &s,
            1_000_000,
            &idle(4, 299_999),
            &idle(5, 300_000),
            2
        ));
        // Not below at all.
        assert!(!decide_merge(
            &s,
            1_000_000,
            &idle(4, 0),
            &idle(5, 300_000),
            2
        ));
    }

    #[test]
    fn given_ranges_min_reached_then_no_merge() {
        let mut s = settings();
        s.ranges_min = 2;
        assert!(!decide_merge(
            &s,
            1_000_000,
            &idle(4, 400_000),
            &idle(5, 400_000),
            2
        ));
        assert!(decide_merge(
            &s,
            1_000_000,
            &idle(4, 400_000),
            &idle(5, 400_000),
            3
        ));
    }

    #[test]
    fn given_a_recent_reshape_of_either_buddy_then_no_merge() {
        let mut upper = idle(5, 400_000);
        upper.last_reshape_ms = Some(990_000);
        assert!(!decide_merge(
            &settings(),
            1_000_000,
            &idle(4, 400_000),
            &upper,
            2
        ));
    }

    #[test]
    fn a_policy_overrides_only_what_it_sets() {
        let policy = ReshapePolicy {
            auto_reshape: Some(false),
            ranges_max: Some(8),
            ..ReshapePolicy::default()
        };
        let s = settings().with_policy(Some(&policy));
        assert!(!s.auto_reshape);
        assert_eq!(s.ranges_max, 8);
        assert_eq!(s.split_after_ms, 30_000);
        assert_eq!(settings().with_policy(None), settings());
    }
}
