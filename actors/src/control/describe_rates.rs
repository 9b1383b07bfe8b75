//! The write rates and recent automatic reshapes a live `topic describe`
//! shows (ADR 0143), whichever broker answers it.
//!
//! Only a range's primary measures its rate, and only the broker that
//! asked for a reshape remembers why, and it may no longer write any of
//! the topic's ranges (a balancer move, a merge placed elsewhere). So the
//! answering broker asks each active range's primary (named in the topic's
//! metadata) and every other live broker for the topic's figures, all at
//! once, over replica-status (the node fabric, the cluster
//! port when the fabric has no session: ADR 0133), each ask bounded by
//! [`DESCRIBE_RATES_TIMEOUT_MS`]. It keeps from each answer the rates of
//! the ranges that broker writes, and the union of the histories, latest
//! [`RESHAPE_HISTORY_MAX`]. A primary that does not answer in time leaves
//! its ranges without a rate (absent, never 0); the describe answers
//! regardless.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use malachi_wire::messages::{
    RESHAPE_HISTORY_MAX, RangeRate, ReshapeEvent, TopicDescription, TopicReshaping,
};
use malachi_wire::replica_status::ReplicaStatusRequest;
use tracing::debug;

use super::replica_status::{Lane, ask_status};
use super::shared::ClusterLinks;
use crate::common::clock::Clock;
use crate::common::rates::RangeRates;

/// How long a live describe waits for one primary's rates. The primaries
/// are asked at once (and beside the live figures' asks, which wait
/// longer), so this bounds the describe's extra time.
pub(crate) const DESCRIBE_RATES_TIMEOUT_MS: u64 = 1_000;

/// The active ranges each broker writes, per the topic's metadata: an
/// active range's primary is its open last segment's first replica.
pub(crate) fn range_primaries(topic: &TopicDescription) -> BTreeMap<u64, BTreeSet<u64>> {
    let mut primaries: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for range in topic.ranges.iter().filter(|r| r.state == "active") {
        let Some(segment) = range.segments.last().filter(|s| s.state != "sealed") else {
            continue;
        };
        if let Some(&primary) = segment.replicas.first() {
            primaries.entry(primary).or_default().insert(range.id);
        }
    }
    primaries
}

/// What gathering a topic's rates reads of this broker: its id, its links
/// to the primaries, its own rates and clock.
#[derive(Clone, Copy)]
pub(crate) struct RatesHere<'a> {
    pub node_id: u64,
    pub links: &'a ClusterLinks,
    pub rates: &'a RangeRates,
    pub clock: &'a dyn Clock,
}

/// The topic's rates from its ranges' primaries and the reshapes they and
/// this broker asked for, each primary asked at most `timeout_ms`.
pub(crate) async fn gather_reshaping(
    here: RatesHere<'_>,
    topic: String,
    primaries: BTreeMap<u64, BTreeSet<u64>>,
    timeout_ms: u64,
) -> Option<TopicReshaping> {
    let me = here.node_id;
    let live: Vec<u64> = here
        .links
        .fabric()
        .map(|fabric| {
            let view = fabric.membership.view();
            view.live().map(|member| member.node_id).collect()
        })
        .unwrap_or_default();
    let asks = brokers_to_ask(&primaries, &live, me)
        .into_iter()
        .map(|node| {
            let topic = topic.clone();
            async move { (node, ask_rates(here.links, node, topic, timeout_ms).await) }
        });
    let mut answers = futures::future::join_all(asks).await;
    let own = here.rates.reshaping(here.clock.now_ms(), &topic, me);
    answers.push((me, own));
    merge(&primaries, answers)
}

/// Whom a describe asks for a topic's figures: every range's primary (for
/// its rate, whether or not membership sees it live yet) and every live
/// broker (for the reshapes it asked for), each once, never `me`.
pub(crate) fn brokers_to_ask(
    primaries: &BTreeMap<u64, BTreeSet<u64>>,
    live: &[u64],
    me: u64,
) -> BTreeSet<u64> {
    let mut asked: BTreeSet<u64> = primaries.keys().copied().collect();
    asked.extend(live.iter().copied());
    asked.remove(&me);
    asked
}

/// One broker's figures for `topic`, or `None` when it did not answer
/// within `timeout_ms` (or answered without them: an older broker).
async fn ask_rates(
    links: &ClusterLinks,
    node: u64,
    topic: String,
    timeout_ms: u64,
) -> Option<TopicReshaping> {
    let request = ReplicaStatusRequest {
        rates_topic: Some(topic),
        ..ReplicaStatusRequest::default()
    };
    let asked = ask_status(links, node, &request, timeout_ms, Lane::Raft);
    // The ask bounds itself; this bound keeps the describe's promise
    // whatever a lower layer does.
    match tokio::time::timeout(Duration::from_millis(timeout_ms), asked).await {
        Ok(Ok(response)) => response.reshaping,
        Ok(Err(error)) => {
            debug!(node, %error, "a primary's rates unanswered");
            None
        }
        Err(_) => {
            debug!(node, timeout_ms, "a primary's rates not answered in time");
            None
        }
    }
}

/// The answers merged: from each broker, the rates of the ranges the
/// metadata says it writes (one per range); every history's events once,
/// the latest [`RESHAPE_HISTORY_MAX`], oldest first. `None` when nothing
/// was learned.
pub(crate) fn merge(
    primaries: &BTreeMap<u64, BTreeSet<u64>>,
    answers: Vec<(u64, Option<TopicReshaping>)>,
) -> Option<TopicReshaping> {
    let mut rates: BTreeMap<u64, RangeRate> = BTreeMap::new();
    let mut events: Vec<ReshapeEvent> = Vec::new();
    for (node, answer) in answers {
        let Some(answer) = answer else { continue };
        let written = primaries.get(&node);
        for rate in answer.rates {
            if written.is_some_and(|ranges| ranges.contains(&rate.range)) {
                rates.insert(
                    rate.range,
                    RangeRate {
                        primary: node,
                        ..rate
                    },
                );
            }
        }
        events.extend(answer.history);
    }
    events.sort_by(|a, b| {
        (a.at_ms, &a.kind, &a.ranges, &a.children).cmp(&(b.at_ms, &b.kind, &b.ranges, &b.children))
    });
    events.dedup();
    let history = events.split_off(events.len().saturating_sub(RESHAPE_HISTORY_MAX));
    assert!(
        history.len() <= RESHAPE_HISTORY_MAX,
        "the history is bounded"
    );
    if rates.is_empty() && history.is_empty() {
        return None;
    }
    Some(TopicReshaping {
        rates: rates.into_values().collect(),
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(range: u64, bytes: u64) -> RangeRate {
        RangeRate {
            range,
            write_bytes_per_second: bytes,
            ..RangeRate::default()
        }
    }

    fn event(at_ms: u64) -> ReshapeEvent {
        ReshapeEvent {
            at_ms,
            kind: "split".into(),
            ..ReshapeEvent::default()
        }
    }

    fn primaries() -> BTreeMap<u64, BTreeSet<u64>> {
        BTreeMap::from([(1, BTreeSet::from([10])), (2, BTreeSet::from([20, 21]))])
    }

    #[test]
    fn each_range_takes_its_primarys_rate() {
        let merged = merge(
            &primaries(),
            vec![
                (
                    1,
                    Some(TopicReshaping {
                        // Range 20 was written here before it moved: stale.
                        rates: vec![rate(10, 5), rate(20, 1)],
                        history: vec![],
                    }),
                ),
                (
                    2,
                    Some(TopicReshaping {
                        rates: vec![rate(20, 7), rate(21, 9)],
                        history: vec![],
                    }),
                ),
            ],
        )
        .unwrap();
        let seen: Vec<(u64, u64, u64)> = merged
            .rates
            .iter()
            .map(|r| (r.range, r.primary, r.write_bytes_per_second))
            .collect();
        assert_eq!(seen, vec![(10, 1, 5), (20, 2, 7), (21, 2, 9)]);
    }

    #[test]
    fn every_live_broker_is_asked_once_for_the_reshapes_it_asked_for() {
        // Broker 3 writes none of the topic's ranges (it may have split
        // one and seen both children placed elsewhere): it is still asked.
        let asked = brokers_to_ask(&primaries(), &[1, 2, 3], 1);
        assert_eq!(asked, BTreeSet::from([2, 3]));
        // A primary membership does not see live yet is asked too.
        assert_eq!(brokers_to_ask(&primaries(), &[1], 1), BTreeSet::from([2]));
        assert_eq!(brokers_to_ask(&BTreeMap::new(), &[], 1), BTreeSet::new());
    }

    #[test]
    fn a_history_from_a_broker_that_writes_none_of_the_ranges_is_kept() {
        let merged = merge(
            &primaries(),
            vec![(
                3,
                Some(TopicReshaping {
                    rates: vec![rate(10, 99)],
                    history: vec![event(5)],
                }),
            )],
        )
        .unwrap();
        assert!(merged.rates.is_empty(), "its stale rates are not shown");
        assert_eq!(merged.history, vec![event(5)]);
    }

    #[test]
    fn a_silent_primary_leaves_its_ranges_without_a_rate() {
        let merged = merge(
            &primaries(),
            vec![
                (
                    1,
                    Some(TopicReshaping {
                        rates: vec![rate(10, 5)],
                        history: vec![],
                    }),
                ),
                (2, None),
            ],
        )
        .unwrap();
        assert_eq!(merged.rates.len(), 1);
        assert_eq!(merged.rates[0].range, 10);
        assert_eq!(merge(&primaries(), vec![(2, None)]), None);
    }

    #[test]
    fn the_histories_merge_once_each_latest_kept() {
        let many: Vec<ReshapeEvent> = (0..RESHAPE_HISTORY_MAX as u64).map(event).collect();
        let merged = merge(
            &primaries(),
            vec![
                (
                    1,
                    Some(TopicReshaping {
                        rates: vec![],
                        history: many.clone(),
                    }),
                ),
                (
                    2,
                    Some(TopicReshaping {
                        rates: vec![],
                        history: vec![event(3), event(100), event(101)],
                    }),
                ),
            ],
        )
        .unwrap();
        assert_eq!(merged.history.len(), RESHAPE_HISTORY_MAX);
        let at: Vec<u64> = merged.history.iter().map(|e| e.at_ms).collect();
        let mut expected: Vec<u64> = (2..RESHAPE_HISTORY_MAX as u64).collect();
        expected.extend([100, 101]);
        assert_eq!(at, expected);
    }
}
