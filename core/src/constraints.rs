//! Placement constraints of storage policies (issue 21, ADR 0116): parsed
//! from the policy's strings, evaluated over broker attributes, and the
//! deterministic choice of a replica set that meets them.
//!
//! The language, one constraint per string, `soft:` in front making it a
//! preference rather than a rule:
//! - `distinct(ATTR) >= N`: the set spans at least N values of ATTR;
//! - `skew(ATTR) <= N`: over the values of ATTR among the eligible brokers,
//!   the most copies one value holds minus the fewest is at most N;
//! - `ATTR == VALUE`, `ATTR != VALUE`, `ATTR in (V1, V2, ...)`: which
//!   brokers may hold a copy.
//!
//! A broker without ATTR counts as a value of its own for `distinct` and
//! `skew`, and fails `==` and `in` (and passes `!=`).
//!
//! [`place`] never breaks a hard constraint: it returns an error naming
//! the first one no set can meet. It gives up a soft constraint only when
//! no set meeting every hard one meets it too, and then says which. The
//! choice is a pure function of its inputs, with no random tie-break:
//! every replica of a vnode computes the same set. Candidates are ranked
//! (the `preferred` brokers first, then rendezvous hashing of `(seed,
//! node)`, which spreads segments over brokers), and among the sets that
//! meet the most constraints the first in rank order wins. Up to
//! [`COMBINATIONS_MAX`] sets are weighed exactly; a larger choice is made
//! greedily, spreading over the constrained attributes, and still refused
//! rather than allowed to break a hard constraint.

use std::collections::{BTreeMap, BTreeSet};

/// The most candidate sets [`place`] weighs exactly (a factor of 3 among
/// 64 brokers is 41,664 sets).
pub const COMBINATIONS_MAX: u64 = 100_000;

/// A broker placement may choose, with its gossiped attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node: u64,
    pub attributes: BTreeMap<String, String>,
}

/// What a constraint asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The set spans at least `min` values of `attr`.
    Distinct { attr: String, min: usize },
    /// Over the eligible brokers' values of `attr`, the most copies on one
    /// value minus the fewest is at most `max`.
    Skew { attr: String, max: usize },
    /// A broker may hold a copy only if its `attr` is one of `values`
    /// (`negate`: is none of them).
    Filter {
        attr: String,
        values: Vec<String>,
        negate: bool,
    },
}

/// A parsed constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    pub rule: Rule,
    /// A preference: given up when no set meets it with every hard one.
    pub soft: bool,
    /// The text it was parsed from, for errors and reports.
    pub text: String,
}

/// Why a constraint string does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("placement constraint {text:?}: {reason}")]
pub struct ConstraintError {
    pub text: String,
    pub reason: &'static str,
}

/// Why no replica set could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("a replication factor of {factor} needs {factor} eligible brokers; {eligible} are")]
    TooFewBrokers { factor: usize, eligible: usize },
    #[error("the replication factor must be at least 1")]
    ZeroFactor,
    #[error("no replica set meets the hard placement constraint {constraint:?}")]
    Unsatisfiable { constraint: String },
}

/// The set chosen, and the soft constraints it could not meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub nodes: Vec<u64>,
    pub relaxed: Vec<String>,
}

fn is_attr(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

/// Parses one constraint (see the module doc).
pub fn parse(text: &str) -> Result<Constraint, ConstraintError> {
    let err = |reason| ConstraintError {
        text: text.to_owned(),
        reason,
    };
    let mut body = text.trim();
    let mut soft = false;
    if let Some(rest) = body.strip_prefix("soft:") {
        soft = true;
        body = rest.trim();
    }
    let function = |name: &str, body: &str| -> Option<(String, String, String)> {
        let rest = body.strip_prefix(name)?.trim_start().strip_prefix('(')?;
        let (attr, rest) = rest.split_once(')')?;
        let rest = rest.trim();
        let (op, number) = if let Some(n) = rest.strip_prefix(">=") {
            (">=", n)
        } else if let Some(n) = rest.strip_prefix("<=") {
            ("<=", n)
        } else {
            return None;
        };
        Some((
            attr.trim().to_owned(),
            op.to_owned(),
            number.trim().to_owned(),
        ))
    };
    let rule = if let Some((attr, op, number)) = function("distinct", body) {
        if op != ">=" {
            return Err(err("distinct takes >= N"));
        }
        let min: usize = number.parse().map_err(|_| err("N is not a number"))?;
        if !is_attr(&attr) || min == 0 || min > 64 {
            return Err(err(
                "distinct(ATTR) >= N needs an attribute name and 1 <= N <= 64",
            ));
        }
        Rule::Distinct { attr, min }
    } else if let Some((attr, op, number)) = function("skew", body) {
        if op != "<=" {
            return Err(err("skew takes <= N"));
        }
        let max: usize = number.parse().map_err(|_| err("N is not a number"))?;
        if !is_attr(&attr) {
            return Err(err("skew(ATTR) <= N needs an attribute name"));
        }
        Rule::Skew { attr, max }
    } else if let Some((attr, values)) = body.split_once(" in ") {
        let attr = attr.trim().to_owned();
        let values = values
            .trim()
            .strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .ok_or_else(|| err("in takes a list: ATTR in (A, B)"))?;
        let values: Vec<String> = values
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        if !is_attr(&attr) || values.is_empty() || values.len() > 64 {
            return Err(err(
                "ATTR in (A, B) needs an attribute name and 1 to 64 values",
            ));
        }
        Rule::Filter {
            attr,
            values,
            negate: false,
        }
    } else if let Some((attr, value)) = body
        .split_once("!=")
        .map(|(a, v)| (a, v, true))
        .or_else(|| body.split_once("==").map(|(a, v)| (a, v, false)))
        .map(|(a, v, negate)| ((a.trim().to_owned(), negate), v.trim().to_owned()))
    {
        let ((attr, negate), value) = (attr, value);
        if !is_attr(&attr) || value.is_empty() {
            return Err(err("ATTR == VALUE needs an attribute name and a value"));
        }
        Rule::Filter {
            attr,
            values: vec![value],
            negate,
        }
    } else {
        return Err(err(
            "expected distinct(ATTR) >= N, skew(ATTR) <= N, ATTR == V, ATTR != V or ATTR in (A, B), with soft: in front for a preference",
        ));
    };
    Ok(Constraint {
        rule,
        soft,
        text: text.trim().to_owned(),
    })
}

/// Parses every constraint of a policy.
pub fn parse_all(texts: &[String]) -> Result<Vec<Constraint>, ConstraintError> {
    texts.iter().map(|t| parse(t)).collect()
}

/// A broker's value of `attr`: brokers without it are each a value of their own.
fn domain(broker: &Broker, attr: &str) -> String {
    broker
        .attributes
        .get(attr)
        .map_or_else(|| format!("\0node-{}", broker.node), |v| format!("={v}"))
}

fn passes(broker: &Broker, attr: &str, values: &[String], negate: bool) -> bool {
    let hit = broker
        .attributes
        .get(attr)
        .is_some_and(|v| values.iter().any(|x| x == v));
    hit != negate
}

/// Whether the set `chosen` (indexes into `brokers`) meets `c`; `eligible`
/// are the brokers that pass every hard filter (whose values `skew` counts).
fn meets(c: &Constraint, chosen: &[usize], brokers: &[Broker], eligible: &[usize]) -> bool {
    match &c.rule {
        Rule::Filter {
            attr,
            values,
            negate,
        } => chosen
            .iter()
            .all(|&i| passes(&brokers[i], attr, values, *negate)),
        Rule::Distinct { attr, min } => {
            let values: BTreeSet<String> =
                chosen.iter().map(|&i| domain(&brokers[i], attr)).collect();
            values.len() >= *min
        }
        Rule::Skew { attr, max } => skew(attr, chosen, brokers, eligible) <= *max,
    }
}

/// How far `set` is from meeting `c`: values of `attr` missing for a
/// `distinct`, copies over the bound for a `skew`, brokers outside a
/// filter; 0 when it meets it.
fn shortfall(c: &Constraint, set: &[usize], brokers: &[Broker], eligible: &[usize]) -> usize {
    match &c.rule {
        Rule::Filter {
            attr,
            values,
            negate,
        } => set
            .iter()
            .filter(|&&i| !passes(&brokers[i], attr, values, *negate))
            .count(),
        Rule::Distinct { attr, min } => {
            let values: BTreeSet<String> = set.iter().map(|&i| domain(&brokers[i], attr)).collect();
            min.saturating_sub(values.len())
        }
        Rule::Skew { attr, max } => skew(attr, set, brokers, eligible).saturating_sub(*max),
    }
}

/// Most copies on one value of `attr` minus the fewest, over the values
/// the eligible brokers have.
fn skew(attr: &str, chosen: &[usize], brokers: &[Broker], eligible: &[usize]) -> usize {
    let mut counts: BTreeMap<String, usize> = eligible
        .iter()
        .map(|&i| (domain(&brokers[i], attr), 0))
        .collect();
    for &i in chosen {
        *counts.entry(domain(&brokers[i], attr)).or_default() += 1;
    }
    let most = counts.values().copied().max().unwrap_or(0);
    let fewest = counts.values().copied().min().unwrap_or(0);
    most - fewest
}

fn score(seed: u64, node: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..].copy_from_slice(&node.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

fn combinations(n: u64, k: u64) -> u64 {
    let mut out: u64 = 1;
    for i in 0..k.min(n) {
        out = out.saturating_mul(n - i) / (i + 1);
    }
    if k > n { 0 } else { out }
}

/// Chooses `factor` brokers meeting `constraints` (see the module doc).
/// `fixed` are always in the set (copies that exist: a failover's new
/// primary, healing's survivors), first and in their order; `preferred`
/// rank first among the rest (a new segment's primary, so it leads the
/// set when it may hold a copy). Brokers are deduplicated by node.
pub fn place(
    fixed: &[u64],
    preferred: &[u64],
    brokers: &[Broker],
    factor: usize,
    seed: u64,
    constraints: &[Constraint],
) -> Result<Placement, PlaceError> {
    if factor == 0 {
        return Err(PlaceError::ZeroFactor);
    }
    let mut brokers: Vec<Broker> = brokers.to_vec();
    brokers.sort_by_key(|b| b.node);
    brokers.dedup_by_key(|b| b.node);
    let pool = Candidates::of(&brokers, fixed, preferred, seed, constraints);
    if pool.fixed.len() + pool.rest.len() < factor {
        return Err(PlaceError::TooFewBrokers {
            factor,
            eligible: pool.fixed.len() + pool.rest.len(),
        });
    }
    let needed = factor.saturating_sub(pool.fixed.len());
    let hard: Vec<&Constraint> = constraints.iter().filter(|c| !c.soft).collect();
    let soft: Vec<&Constraint> = constraints.iter().filter(|c| c.soft).collect();
    let best: Vec<usize> =
        if combinations(pool.rest.len() as u64, needed as u64) <= COMBINATIONS_MAX {
            // A set's standing: hard constraints broken, soft ones broken (fewer
            // is better), then rank order (the enumeration's).
            // A relaxed soft constraint is still met as nearly as the set can
            // (a soft `distinct(zone) >= 4` over three zones spreads over three).
            let judge = |set: &[usize]| {
                let broken = |cs: &[&Constraint]| {
                    cs.iter()
                        .filter(|c| !meets(c, set, &brokers, &pool.eligible))
                        .count()
                };
                let shortfall: usize = soft
                    .iter()
                    .map(|c| shortfall(c, set, &brokers, &pool.eligible))
                    .sum();
                (broken(&hard), broken(&soft), shortfall)
            };
            exhaustive(&pool, needed, judge)
        } else {
            greedy(&pool.fixed, &pool.rest, needed, &brokers, constraints)
        };
    if let Some(broken) = hard
        .iter()
        .find(|c| !meets(c, &best, &brokers, &pool.eligible))
    {
        return Err(PlaceError::Unsatisfiable {
            constraint: broken.text.clone(),
        });
    }
    let relaxed = soft
        .iter()
        .filter(|c| !meets(c, &best, &brokers, &pool.eligible))
        .map(|c| c.text.clone())
        .collect();
    let nodes = pool.ordered_nodes(&best, &brokers);
    debug_assert_eq!(
        nodes.len(),
        factor.max(pool.fixed.len()),
        "a placement of the wanted size"
    );
    debug_assert!(
        nodes
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == nodes.len(),
        "a placement of distinct brokers"
    );
    Ok(Placement { nodes, relaxed })
}

/// The brokers a placement chooses from, as indices into the deduplicated
/// broker list.
struct Candidates {
    /// The fixed brokers that exist, deduplicated, in the caller's order.
    fixed: Vec<usize>,
    /// Every broker passing the hard filters, and the fixed ones.
    eligible: Vec<usize>,
    /// The eligible brokers not fixed, ranked: preferred first, then by
    /// rendezvous score, then node.
    rest: Vec<usize>,
}

impl Candidates {
    fn of(
        brokers: &[Broker],
        fixed: &[u64],
        preferred: &[u64],
        seed: u64,
        constraints: &[Constraint],
    ) -> Candidates {
        let hard_filters_pass = |b: &Broker| {
            constraints
                .iter()
                .filter(|c| !c.soft)
                .all(|c| match &c.rule {
                    Rule::Filter {
                        attr,
                        values,
                        negate,
                    } => passes(b, attr, values, *negate),
                    _ => true,
                })
        };
        let mut fixed_idx: Vec<usize> = Vec::new();
        for i in fixed
            .iter()
            .filter_map(|n| brokers.iter().position(|b| b.node == *n))
        {
            if !fixed_idx.contains(&i) {
                fixed_idx.push(i);
            }
        }
        let eligible: Vec<usize> = (0..brokers.len())
            .filter(|&i| hard_filters_pass(&brokers[i]) || fixed_idx.contains(&i))
            .collect();
        let mut rest: Vec<usize> = eligible
            .iter()
            .copied()
            .filter(|i| !fixed_idx.contains(i))
            .collect();
        rest.sort_by_key(|i| {
            let node = brokers[*i].node;
            let preferred_at = preferred
                .iter()
                .position(|p| *p == node)
                .unwrap_or(usize::MAX);
            (preferred_at, score(seed, node), node)
        });
        Candidates {
            fixed: fixed_idx,
            eligible,
            rest,
        }
    }

    /// The chosen set's nodes: the fixed first, then the rest in rank order
    /// (a preferred primary leads the set).
    fn ordered_nodes(&self, best: &[usize], brokers: &[Broker]) -> Vec<u64> {
        let mut nodes: Vec<u64> = self.fixed.iter().map(|&i| brokers[i].node).collect();
        let mut others: Vec<usize> = best
            .iter()
            .copied()
            .filter(|i| !self.fixed.contains(i))
            .collect();
        others.sort_by_key(|i| self.rest.iter().position(|r| r == i).unwrap_or(usize::MAX));
        nodes.extend(others.iter().map(|&i| brokers[i].node));
        nodes
    }
}

/// Every set of the fixed brokers and `needed` of the rest, in
/// lexicographic order of the ranking: the first with the best standing
/// (`judge`, lower is better) wins; a perfect one ends the search.
fn exhaustive<J>(pool: &Candidates, needed: usize, judge: J) -> Vec<usize>
where
    J: Fn(&[usize]) -> (usize, usize, usize),
{
    let rest = &pool.rest;
    let mut best: Option<((usize, usize, usize), Vec<usize>)> = None;
    let mut pick: Vec<usize> = (0..needed).collect();
    loop {
        let mut set = pool.fixed.clone();
        set.extend(pick.iter().map(|&p| rest[p]));
        let standing = judge(&set);
        if best.as_ref().is_none_or(|(b, _)| standing < *b) {
            let perfect = standing == (0, 0, 0);
            best = Some((standing, set));
            if perfect {
                break;
            }
        }
        if !next_combination(&mut pick, rest.len()) {
            break;
        }
    }
    best.map(|(_, set)| set).unwrap_or_default()
}

/// Advances `pick` (ascending positions out of `n`) to the next
/// combination in lexicographic order; false after the last.
fn next_combination(pick: &mut [usize], n: usize) -> bool {
    let k = pick.len();
    for i in (0..k).rev() {
        if pick[i] < n - k + i {
            pick[i] += 1;
            for j in i + 1..k {
                pick[j] = pick[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// The large-cluster choice: one at a time, the candidate whose values of
/// the constrained attributes hold the fewest copies so far (hard
/// attributes first), then the one failing the fewest soft filters, then
/// rank order.
fn greedy(
    fixed: &[usize],
    rest: &[usize],
    needed: usize,
    brokers: &[Broker],
    constraints: &[Constraint],
) -> Vec<usize> {
    let spread: Vec<(&str, bool)> = constraints
        .iter()
        .filter_map(|c| match &c.rule {
            Rule::Distinct { attr, .. } | Rule::Skew { attr, .. } => Some((attr.as_str(), c.soft)),
            Rule::Filter { .. } => None,
        })
        .collect();
    let mut set: Vec<usize> = fixed.to_vec();
    let mut left: Vec<usize> = rest.to_vec();
    for _ in 0..needed {
        let key = |i: &usize| {
            let count = |attr: &str| {
                let d = domain(&brokers[*i], attr);
                set.iter()
                    .filter(|&&s| domain(&brokers[s], attr) == d)
                    .count()
            };
            let hard: Vec<usize> = spread
                .iter()
                .filter(|(_, s)| !s)
                .map(|(a, _)| count(a))
                .collect();
            let soft_fails = constraints
                .iter()
                .filter(|c| c.soft)
                .filter(|c| match &c.rule {
                    Rule::Filter {
                        attr,
                        values,
                        negate,
                    } => !passes(&brokers[*i], attr, values, *negate),
                    _ => false,
                })
                .count();
            let soft: Vec<usize> = spread
                .iter()
                .filter(|(_, s)| *s)
                .map(|(a, _)| count(a))
                .collect();
            (hard, soft_fails, soft)
        };
        let Some(at) = (0..left.len()).min_by_key(|&p| (key(&left[p]), p)) else {
            break;
        };
        set.push(left.remove(at));
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn broker(node: u64, attrs: &[(&str, &str)]) -> Broker {
        Broker {
            node,
            attributes: attrs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn zones(spec: &[(u64, &str)]) -> Vec<Broker> {
        spec.iter()
            .map(|(n, z)| broker(*n, &[("zone", z)]))
            .collect()
    }

    fn c(text: &str) -> Constraint {
        parse(text).unwrap()
    }

    #[test]
    fn constraints_parse_and_bad_ones_are_refused_with_a_reason() {
        assert_eq!(
            c("distinct(zone) >= 2").rule,
            Rule::Distinct {
                attr: "zone".into(),
                min: 2
            }
        );
        assert!(c("soft: skew(rack) <= 1").soft);
        assert_eq!(
            c("zone in (a, b)").rule,
            Rule::Filter {
                attr: "zone".into(),
                values: vec!["a".into(), "b".into()],
                negate: false
            }
        );
        assert_eq!(
            c("disk != hdd").rule,
            Rule::Filter {
                attr: "disk".into(),
                values: vec!["hdd".into()],
                negate: true
            }
        );
        for bad in [
            "",
            "distinct(zone) <= 2",
            "distinct(zone) >= 0",
            "skew(zone) >= 1",
            "zone in a, b",
            "== x",
            "spread(zone)",
            "distinct() >= 2",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_hard_distinct_spreads_the_set_and_the_preferred_primary_leads() {
        let brokers = zones(&[(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "c")]);
        for seed in 0..20 {
            let p = place(&[], &[1], &brokers, 3, seed, &[c("distinct(zone) >= 3")]).unwrap();
            assert_eq!(p.nodes[0], 1);
            let mut set = p.nodes.clone();
            set.sort_unstable();
            assert_eq!(set, [1, 4, 5]);
            assert!(p.relaxed.is_empty());
        }
    }

    #[test]
    fn a_hard_constraint_no_set_meets_is_refused_and_a_soft_one_relaxed() {
        let brokers = zones(&[(1, "a"), (2, "a"), (3, "b")]);
        assert_eq!(
            place(&[], &[], &brokers, 3, 0, &[c("distinct(zone) >= 3")]),
            Err(PlaceError::Unsatisfiable {
                constraint: "distinct(zone) >= 3".into()
            })
        );
        let p = place(&[], &[], &brokers, 3, 0, &[c("soft: distinct(zone) >= 3")]).unwrap();
        assert_eq!(p.relaxed, vec!["soft: distinct(zone) >= 3".to_owned()]);
        assert_eq!(p.nodes.len(), 3);
        // Relaxed, it is still met as nearly as can be: both zones.
        let four = zones(&[(1, "a"), (2, "a"), (3, "a"), (4, "b")]);
        for seed in 0..20 {
            let p = place(&[], &[], &four, 2, seed, &[c("soft: distinct(zone) >= 3")]).unwrap();
            let mut set = p.nodes.clone();
            set.sort_unstable();
            assert!(set.contains(&4), "{set:?} does not spread over both zones");
        }
        // A filter leaving too few brokers is too few brokers.
        assert_eq!(
            place(&[], &[], &brokers, 2, 0, &[c("zone == b")]),
            Err(PlaceError::TooFewBrokers {
                factor: 2,
                eligible: 1
            })
        );
    }

    #[test]
    fn fixed_copies_stay_and_healing_adds_around_them() {
        let brokers = zones(&[(1, "a"), (2, "a"), (3, "b"), (4, "c")]);
        // Survivors 2 (a) and 3 (b): the third copy goes to zone c.
        let p = place(&[2, 3], &[], &brokers, 3, 7, &[c("distinct(zone) >= 3")]).unwrap();
        assert_eq!(p.nodes, vec![2, 3, 4]);
    }

    fn brokers_strategy() -> impl Strategy<Value = Vec<Broker>> {
        proptest::collection::vec((0u8..4, 0u8..3), 1..9).prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (zone, disk))| {
                    broker(
                        i as u64 + 1,
                        &[
                            ("zone", ["a", "b", "c", "d"][zone as usize]),
                            ("disk", ["ssd", "hdd", "nvme"][disk as usize]),
                        ],
                    )
                })
                .collect()
        })
    }

    fn constraint_strategy() -> impl Strategy<Value = Constraint> {
        prop_oneof![
            (1usize..4).prop_map(|n| format!("distinct(zone) >= {n}")),
            (0usize..3).prop_map(|n| format!("skew(zone) <= {n}")),
            Just("disk != hdd".to_owned()),
            Just("disk in (ssd, nvme)".to_owned()),
        ]
        .prop_flat_map(|text| {
            any::<bool>().prop_map(move |soft| {
                c(&if soft {
                    format!("soft: {text}")
                } else {
                    text.clone()
                })
            })
        })
    }

    /// Every set of `factor` brokers, for the brute-force check.
    fn all_sets(n: usize, factor: usize) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize == factor {
                out.push((0..n).filter(|i| mask & (1 << i) != 0).collect());
            }
        }
        out
    }

    proptest! {
        #[test]
        fn placement_is_deterministic_never_breaks_a_hard_constraint_and_relaxes_only_what_it_must(
            brokers in brokers_strategy(),
            constraints in proptest::collection::vec(constraint_strategy(), 0..4),
            factor in 1usize..4,
            seed in any::<u64>(),
        ) {
            let first = place(&[], &[], &brokers, factor, seed, &constraints);
            // Determinism: the same inputs, in any order, the same answer.
            let mut shuffled = brokers.clone();
            shuffled.reverse();
            prop_assert_eq!(&first, &place(&[], &[], &shuffled, factor, seed, &constraints));
            let hard_filters = |b: &Broker| constraints.iter().filter(|c| !c.soft).all(|c| match &c.rule {
                Rule::Filter { attr, values, negate } => passes(b, attr, values, *negate),
                _ => true,
            });
            let eligible: Vec<usize> = (0..brokers.len()).filter(|&i| hard_filters(&brokers[i])).collect();
            let sets: Vec<Vec<usize>> = all_sets(brokers.len(), factor)
                .into_iter()
                .filter(|s| s.iter().all(|i| eligible.contains(i)))
                .collect();
            let meets_all = |set: &[usize], soft_too: bool| constraints
                .iter()
                .filter(|c| soft_too || !c.soft)
                .all(|c| meets(c, set, &brokers, &eligible));
            match &first {
                Ok(p) => {
                    prop_assert_eq!(p.nodes.len(), factor);
                    let set: Vec<usize> = p.nodes.iter().map(|n| brokers.iter().position(|b| b.node == *n).unwrap()).collect();
                    let distinct: BTreeSet<_> = set.iter().collect();
                    prop_assert_eq!(distinct.len(), factor);
                    // Hard constraints hold, skew bounds included.
                    prop_assert!(meets_all(&set, false), "{:?} breaks a hard constraint of {:?}", p, constraints);
                    // A soft constraint is relaxed only if no set meets
                    // every hard one and every soft one.
                    if !p.relaxed.is_empty() {
                        prop_assert!(!sets.iter().any(|s| meets_all(s, true)), "{:?} relaxed {:?} though a set meets all", p.nodes, p.relaxed);
                    }
                }
                Err(PlaceError::Unsatisfiable { .. }) => {
                    prop_assert!(!sets.iter().any(|s| meets_all(s, false)), "refused though a set meets the hard constraints");
                }
                Err(PlaceError::TooFewBrokers { .. }) => prop_assert!(sets.is_empty()),
                Err(PlaceError::ZeroFactor) => prop_assert!(false),
            }
        }
    }
}
