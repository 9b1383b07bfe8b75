//! Placement by load (issue 38, ADR 0144): what a broker tells the others
//! of its load, how a new active segment's primary is chosen from it, and
//! when a broker sheds one of its primaries to another.
//!
//! Pure: the caller measures and gossips; these functions only decide, so
//! the same decisions run under a test's made-up loads.
//!
//! - **Load** is the active segments a broker writes (its primaries), the
//!   bytes per second it takes from producers, smoothed, and the free space
//!   of its data volume in whole GiB. It travels as one membership
//!   attribute, [`LOAD_ATTRIBUTE`], `p=<primaries>;w=<bytes/s>;f=<GiB>`
//!   (`f` absent from an older broker, or before the volume was measured).
//! - **A primary** goes to the candidate with the fewest primaries, then the
//!   lowest write rate (in steps of [`WRITE_STEP_BYTES_PER_SECOND`], so noise
//!   does not decide), then the rendezvous hash of the segment's seed: equal
//!   brokers share new ranges evenly and the choice is deterministic. The
//!   free disk is gossiped but does not rank yet (ADR 0144's amendment says
//!   why).
//! - **Shedding** (the balancer): only the most loaded broker moves one
//!   primary, and only to the least loaded one, and only when they differ
//!   by at least [`SHED_SPREAD_MIN`]. Every move shrinks the spread, so the
//!   brokers converge to within one of the mean and then stay put.

use std::collections::BTreeMap;

/// The membership attribute that carries a broker's load.
pub const LOAD_ATTRIBUTE: &str = "malachi.load";
/// Write rates closer than this count as equal when ranking brokers.
pub const WRITE_STEP_BYTES_PER_SECOND: u64 = 1 << 20;
/// The least difference in primaries between the most and the least loaded
/// brokers that makes the most loaded one shed a primary: at 1 a move would
/// only swap which broker has the extra one (flapping).
pub const SHED_SPREAD_MIN: u64 = 2;

/// What a broker gossips of its load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrokerLoad {
    /// Active segments this broker writes.
    pub primaries: u64,
    /// Producer bytes per second it took, smoothed.
    pub write_bytes_per_second: u64,
    /// Free space on its data volume, in whole GiB (`bytes >> 30`); `None`
    /// before the volume is measured, or from a broker that does not say.
    pub free_gib: Option<u64>,
}

/// Why a load attribute does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error(
        "load attribute {text:?}: expected `p=<primaries>;w=<bytes per second>` and optionally `;f=<free GiB>`"
    )]
    Malformed { text: String },
}

impl BrokerLoad {
    /// The attribute value, `p=<primaries>;w=<bytes/s>`, then `;f=<GiB>`
    /// when the free space is known.
    pub fn to_attribute(self) -> String {
        let mut text = format!("p={};w={}", self.primaries, self.write_bytes_per_second);
        if let Some(free) = self.free_gib {
            text.push_str(&format!(";f={free}"));
        }
        text
    }

    /// Parses [`BrokerLoad::to_attribute`]'s form; unknown `k=v` parts are
    /// skipped, so a later broker may add some.
    pub fn from_attribute(text: &str) -> Result<BrokerLoad, LoadError> {
        let malformed = || LoadError::Malformed {
            text: text.chars().take(64).collect(),
        };
        let (mut primaries, mut write, mut free_gib) = (None, None, None);
        for part in text.split(';') {
            let (key, value) = part.split_once('=').ok_or_else(malformed)?;
            match key {
                "p" => primaries = Some(value.parse().map_err(|_| malformed())?),
                "w" => write = Some(value.parse().map_err(|_| malformed())?),
                "f" => free_gib = Some(value.parse().map_err(|_| malformed())?),
                _ => {}
            }
        }
        Ok(BrokerLoad {
            primaries: primaries.ok_or_else(malformed)?,
            write_bytes_per_second: write.ok_or_else(malformed)?,
            free_gib,
        })
    }

    /// Whether `self` differs from what was gossiped (`shown`) enough to
    /// gossip again: another primary count, another whole GiB free, or a
    /// write rate a step away. Each gossip is a new membership incarnation,
    /// so noise is not sent.
    pub fn differs_from(self, shown: BrokerLoad) -> bool {
        self.primaries != shown.primaries
            || self.free_gib != shown.free_gib
            || self.write_step() != shown.write_step()
                && self
                    .write_bytes_per_second
                    .abs_diff(shown.write_bytes_per_second)
                    >= WRITE_STEP_BYTES_PER_SECOND / 2
    }

    /// Whether there is anything to say beyond the free space: an idle
    /// broker that never wrote gossips nothing (no incarnation churn at
    /// start), and ranks as idle with plenty of room anyway.
    pub fn is_idle(self) -> bool {
        self.primaries == 0 && self.write_bytes_per_second == 0
    }

    fn write_step(self) -> u64 {
        self.write_bytes_per_second / WRITE_STEP_BYTES_PER_SECOND
    }
}

/// The rendezvous score of `node` for `seed`: equal brokers are ranked by
/// it, so each seed (a range) has its own order.
pub fn rendezvous(seed: u64, node: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..].copy_from_slice(&node.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// `candidates` ranked best first for a new primary: fewest primaries, then
/// lowest write step, then the most free space (unknown last), then
/// rendezvous order for `seed`. A candidate without
/// a known load counts as idle (a broker that just joined). Duplicates are
/// dropped.
pub fn rank_primaries(
    candidates: &[u64],
    loads: &BTreeMap<u64, BrokerLoad>,
    seed: u64,
) -> Vec<u64> {
    let mut ranked: Vec<u64> = candidates.to_vec();
    ranked.sort_unstable();
    ranked.dedup();
    ranked.sort_by_key(|&node| {
        let load = loads.get(&node).copied().unwrap_or_default();
        (
            load.primaries,
            load.write_step(),
            std::cmp::Reverse(load.free_gib),
            rendezvous(seed, node),
            node,
        )
    });
    ranked
}

/// One move the balancer decided: a primary of `from` goes to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    pub from: u64,
    pub to: u64,
}

/// Whether `me` should move one of its primaries now, and where: only when
/// `me` is the most loaded of `loads` (ties to the lowest node id, so among
/// equals one broker acts), the least loaded (ties likewise) has at least
/// [`SHED_SPREAD_MIN`] fewer, and `me` is not the only broker. `loads` is
/// the live brokers that may take primaries, `me` included.
pub fn plan_shed(me: u64, loads: &BTreeMap<u64, BrokerLoad>) -> Option<Shed> {
    let most = loads
        .iter()
        .max_by_key(|(node, load)| (load.primaries, std::cmp::Reverse(**node)))?;
    let least = loads
        .iter()
        .min_by_key(|(node, load)| (load.primaries, **node))?;
    if *most.0 != me || most.0 == least.0 {
        return None;
    }
    let spread = most.1.primaries - least.1.primaries;
    (spread >= SHED_SPREAD_MIN).then_some(Shed {
        from: me,
        to: *least.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn loads(primaries: &[(u64, u64)]) -> BTreeMap<u64, BrokerLoad> {
        primaries
            .iter()
            .map(|&(node, p)| {
                (
                    node,
                    BrokerLoad {
                        primaries: p,
                        ..BrokerLoad::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_attribute_round_trips_and_refuses_garbage() {
        let load = BrokerLoad {
            primaries: 7,
            write_bytes_per_second: 12_345,
            free_gib: None,
        };
        assert_eq!(load.to_attribute(), "p=7;w=12345");
        assert_eq!(BrokerLoad::from_attribute("p=7;w=12345"), Ok(load));
        assert_eq!(BrokerLoad::from_attribute("w=12345;x=1;p=7"), Ok(load));
        // The free space, when known; an older broker's attribute has none.
        let measured = BrokerLoad {
            free_gib: Some(41),
            ..load
        };
        assert_eq!(measured.to_attribute(), "p=7;w=12345;f=41");
        assert_eq!(BrokerLoad::from_attribute("p=7;w=12345;f=41"), Ok(measured));
        for bad in ["", "p=1", "p=x;w=2", "p=1;w", "junk", "p=1;w=2;f=-3"] {
            assert!(BrokerLoad::from_attribute(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn noise_in_the_write_rate_is_not_gossiped() {
        let shown = BrokerLoad {
            primaries: 3,
            write_bytes_per_second: 100,
            free_gib: Some(50),
        };
        let mut now = shown;
        now.write_bytes_per_second = 200_000;
        assert!(!now.differs_from(shown));
        now.write_bytes_per_second = 3 * WRITE_STEP_BYTES_PER_SECOND;
        assert!(now.differs_from(shown));
        now = shown;
        now.primaries = 4;
        assert!(now.differs_from(shown));
        now = shown;
        now.free_gib = Some(49);
        assert!(now.differs_from(shown), "a whole GiB less free is news");
    }

    #[test]
    fn an_idle_broker_has_nothing_to_gossip_but_its_free_space() {
        let idle = BrokerLoad {
            free_gib: Some(12),
            ..BrokerLoad::default()
        };
        assert!(idle.is_idle());
        assert!(
            !BrokerLoad {
                primaries: 1,
                ..idle
            }
            .is_idle()
        );
    }

    #[test]
    fn the_fewest_primaries_win_then_the_lowest_write_rate() {
        let mut l = loads(&[(1, 3), (2, 1), (3, 1)]);
        l.get_mut(&2).unwrap().write_bytes_per_second = 5 * WRITE_STEP_BYTES_PER_SECOND;
        assert_eq!(rank_primaries(&[1, 2, 3], &l, 9), vec![3, 2, 1]);
        // A broker without a known load (just joined) counts as idle.
        assert_eq!(rank_primaries(&[1, 2, 3, 4], &l, 9)[0], 4);
    }

    #[test]
    fn among_equals_the_most_free_space_wins_and_unknown_space_ranks_last() {
        let mut l = loads(&[(1, 1), (2, 1), (3, 1)]);
        l.get_mut(&1).unwrap().free_gib = Some(10);
        l.get_mut(&2).unwrap().free_gib = Some(40);
        for seed in 0..50u64 {
            assert_eq!(rank_primaries(&[1, 2, 3], &l, seed), vec![2, 1, 3]);
        }
        // Space never beats fewer primaries.
        l.get_mut(&3).unwrap().primaries = 0;
        assert_eq!(rank_primaries(&[1, 2, 3], &l, 7)[0], 3);
    }

    #[test]
    fn equal_brokers_share_new_primaries_by_seed() {
        let l = loads(&[(1, 0), (2, 0), (3, 0)]);
        let mut firsts = BTreeMap::new();
        for seed in 0..300u64 {
            *firsts
                .entry(rank_primaries(&[1, 2, 3], &l, seed)[0])
                .or_insert(0) += 1;
        }
        assert_eq!(firsts.len(), 3, "{firsts:?}");
        assert!(firsts.values().all(|&n| n > 60), "{firsts:?}");
    }

    #[test]
    fn only_the_most_loaded_sheds_and_only_across_a_spread_of_two() {
        let l = loads(&[(1, 4), (2, 2), (3, 3)]);
        assert_eq!(plan_shed(1, &l), Some(Shed { from: 1, to: 2 }));
        assert_eq!(plan_shed(2, &l), None);
        assert_eq!(plan_shed(3, &l), None);
        assert_eq!(plan_shed(1, &loads(&[(1, 3), (2, 2), (3, 2)])), None);
        // Ties: the lowest node among the most loaded acts, toward the
        // lowest node among the least loaded.
        let tied = loads(&[(1, 3), (2, 3), (3, 1), (4, 1)]);
        assert_eq!(plan_shed(1, &tied), Some(Shed { from: 1, to: 3 }));
        assert_eq!(plan_shed(2, &tied), None);
        assert_eq!(plan_shed(1, &loads(&[(1, 9)])), None);
    }

    proptest! {
        /// Applying the balancer's moves one at a time converges to a spread
        /// of at most one (everyone within one of the mean), with each move
        /// shrinking the sum of squares, and then no broker moves again.
        #[test]
        fn shedding_converges_within_one_of_the_mean_and_stops(
            counts in proptest::collection::vec(0u64..40, 1..9),
        ) {
            let mut l = loads(&counts.iter().enumerate().map(|(i, &p)| (i as u64 + 1, p)).collect::<Vec<_>>());
            let total: u64 = l.values().map(|b| b.primaries).sum();
            let squares = |l: &BTreeMap<u64, BrokerLoad>| l.values().map(|b| b.primaries * b.primaries).sum::<u64>();
            for _ in 0..10_000 {
                let moves: Vec<Shed> = l.keys().filter_map(|&me| plan_shed(me, &l)).collect();
                prop_assert!(moves.len() <= 1, "one broker acts at a time: {moves:?}");
                let Some(m) = moves.first() else { break };
                let before = squares(&l);
                l.get_mut(&m.from).unwrap().primaries -= 1;
                l.get_mut(&m.to).unwrap().primaries += 1;
                prop_assert!(squares(&l) < before);
            }
            prop_assert_eq!(l.values().map(|b| b.primaries).sum::<u64>(), total);
            let most = l.values().map(|b| b.primaries).max().unwrap();
            let least = l.values().map(|b| b.primaries).min().unwrap();
            prop_assert!(most - least <= 1, "{l:?}");
            prop_assert!(l.keys().all(|&me| plan_shed(me, &l).is_none()));
        }
    }
}
