//! `maintenance/reshaper`: topics split and merge themselves by write rate
//! (issue 38 L11, ADR 0143), every `reshape.reshape_check_interval_ms`.
//!
//! Each broker looks at the active ranges it writes (their active
//! segment's first replica is this broker), reads their rates from the
//! produce path's meters (`common::rates`) and asks
//! `malachi_core::plan::reshape` what to do. A split or merge goes to the
//! coordinator manager as `CoordinatorMsg::Split` or `Merge`, the request a
//! client's `range split` makes; the coordinator checks it again against
//! the metadata. A merge is asked only for two buddies this broker both
//! writes (it knows both rates); one the coordinator refuses is asked
//! again after `reshape_interval_ms`, or after `RESHAPE_BUSY_RETRY_MS` when
//! the reason passes (a segment rolling or not yet frozen). Each check is a message the actor sends itself
//! after the previous one (ADR 0130), and does a bounded amount of work:
//! at most `RESHAPES_PER_CHECK_MAX` requests.
//!
//! The ranges it reads are this broker's replicas of the metadata (a
//! possibly stale, local read): a range whose vnode this broker holds no
//! replica of is not checked here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use malachi_core::model::{Band, MetadataState, NodeId, RangeId, ReshapePolicy, StoragePolicy};
use malachi_core::plan::reshape::{
    RangeLoad, Reason, ReshapeSettings, SplitDecision, decide_merge, decide_split,
};
use malachi_core::rate::Streak;
use malachi_wire::messages::ReshapeEvent;
use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::common::clock::Clock;
use crate::common::config::ReshapeDefaults;
use crate::common::metrics::BrokerMetrics;
use crate::common::rates::{RangeRates, RangeSample};
use crate::control::handle::ControlHandle;
use crate::control::registry::ActorRegistry;
use crate::control::requests::{CoordError, CoordinatorMsg};

/// The most splits and merges one check asks for.
pub(crate) const RESHAPES_PER_CHECK_MAX: usize = 4;
/// The most ranges the reshaper follows (streaks, refusals) at once.
pub(crate) const RESHAPER_RANGES_MAX: usize = 4_096;

/// How long a range whose split or merge was refused for a passing reason
/// (its segment rolling or frozen, a quorum of copies not yet back) waits
/// before it is asked again, instead of `reshape_interval_ms`: a bench run
/// lost a whole minute of spreading to one refusal while a segment rolled
/// (ADR 0143, measurements behind the defaults).
pub(crate) const RESHAPE_BUSY_RETRY_MS: u64 = 5_000;

/// How long a check waits for the cluster's policies before it skips.
const POLICIES_READ_TIMEOUT_MS: u64 = 1_000;

pub(crate) struct ReshaperActor;

/// What the reshaper uses.
#[derive(Debug)]
pub(crate) struct ReshaperCtx {
    pub node_id: u64,
    pub actors: Arc<ActorRegistry>,
    pub rates: Arc<RangeRates>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<BrokerMetrics>,
    pub control: ControlHandle,
    pub defaults: ReshapeDefaults,
    /// How long one split or merge request may take.
    pub request_timeout_ms: u64,
}

#[derive(Debug)]
pub(crate) enum ReshaperMsg {
    Check,
}

impl ractor::Message for ReshaperMsg {}

/// What the reshaper remembers of one range between checks.
#[derive(Debug, Default, Clone, Copy)]
struct Tracked {
    above: Streak,
    below: Streak,
    /// When a request about it was last refused: asked again only after
    /// `reshape_interval_ms`.
    refused_ms: Option<u64>,
    /// Until when a refusal for a passing reason holds it back.
    busy_until_ms: Option<u64>,
    hot_key: bool,
}

/// One active range this broker writes, as a check sees it.
#[derive(Debug, Clone)]
pub(crate) struct RangeHere {
    pub range: RangeId,
    pub band: Band,
    /// When a split or merge created it (`None` for a topic's first ranges).
    pub reshaped_ms: Option<u64>,
    /// A split (one parent) created it, not a merge (two).
    pub split_child: bool,
}

/// One topic with ranges this broker writes.
#[derive(Debug, Clone)]
pub(crate) struct TopicHere {
    pub topic: String,
    pub policy: Option<String>,
    pub ranges_active: usize,
    pub here: Vec<RangeHere>,
    /// The topic's other active ranges, written by other brokers, by band:
    /// the buddy of a range here may be one (ADR 0144).
    pub elsewhere: BTreeMap<Band, RangeId>,
}

/// A request the check makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Split {
        topic: String,
        range: RangeId,
    },
    Merge {
        topic: String,
        lower: RangeId,
        upper: RangeId,
    },
}

/// The decisions between checks: streaks and refusals, no I/O.
#[derive(Debug, Default)]
pub(crate) struct Planner {
    tracked: BTreeMap<RangeId, Tracked>,
}

/// What one check found for one topic.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub actions: Vec<Action>,
    /// Ranges newly found unsplittable for one hot key, with its share.
    pub hot_keys: Vec<(RangeId, u64)>,
    /// Ranges no longer held back by a hot key.
    pub hot_keys_cleared: Vec<RangeId>,
}

impl Planner {
    /// Observes a topic's ranges here at `now_ms` and says what to ask.
    pub fn plan(
        &mut self,
        now_ms: u64,
        settings: &ReshapeSettings,
        topic: &TopicHere,
        rates: &BTreeMap<RangeId, RangeSample>,
    ) -> Plan {
        let mut plan = Plan::default();
        let mut loads = BTreeMap::new();
        for r in &topic.here {
            let rate = rates.get(&r.range);
            let bytes = rate.map_or(0, |s| s.rate.bytes_per_second);
            let tracked = self.tracked.entry(r.range).or_default();
            tracked
                .above
                .observe(now_ms, bytes > settings.split_write_bytes_per_second);
            tracked
                .below
                .observe(now_ms, bytes < settings.merge_write_bytes_per_second);
            if tracked.busy_until_ms.is_some_and(|until| now_ms < until) {
                continue;
            }
            let last = match (r.reshaped_ms, tracked.refused_ms) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            loads.insert(
                r.range,
                RangeLoad {
                    range: r.range,
                    above_split_ms: if tracked.above.held_for(now_ms, 0) {
                        tracked.above.held_ms(now_ms).max(1)
                    } else {
                        0
                    },
                    below_merge_ms: if tracked.below.held_for(now_ms, 0) {
                        tracked.below.held_ms(now_ms).max(1)
                    } else {
                        0
                    },
                    hot_key_share_permille: rate.and_then(|s| s.hot_key_share_permille),
                    last_reshape_ms: last,
                    // A refusal after the split puts it back under the interval.
                    split_child: r.split_child
                        && tracked
                            .refused_ms
                            .is_none_or(|b| r.reshaped_ms.is_some_and(|a| a >= b)),
                },
            );
        }
        let mut active = topic.ranges_active;
        for load in loads.values() {
            let tracked = self.tracked.entry(load.range).or_default();
            match decide_split(settings, now_ms, load, active) {
                SplitDecision::Split { range, .. } => {
                    plan.actions.push(Action::Split {
                        topic: topic.topic.clone(),
                        range,
                    });
                    active += 1;
                    if std::mem::take(&mut tracked.hot_key) {
                        plan.hot_keys_cleared.push(range);
                    }
                }
                SplitDecision::HotKey {
                    range,
                    share_permille,
                } => {
                    if !std::mem::replace(&mut tracked.hot_key, true) {
                        plan.hot_keys.push((range, share_permille));
                    }
                }
                SplitDecision::Nothing => {
                    if load.above_split_ms == 0 && std::mem::take(&mut tracked.hot_key) {
                        plan.hot_keys_cleared.push(load.range);
                    }
                }
            }
        }
        self.plan_merges(now_ms, settings, topic, &loads, active, &mut plan);
        plan
    }

    fn plan_merges(
        &self,
        now_ms: u64,
        settings: &ReshapeSettings,
        topic: &TopicHere,
        loads: &BTreeMap<RangeId, RangeLoad>,
        mut active: usize,
        plan: &mut Plan,
    ) {
        let split: BTreeSet<RangeId> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Split { range, .. } => Some(*range),
                Action::Merge { .. } => None,
            })
            .collect();
        let by_band: BTreeMap<Band, RangeId> =
            topic.here.iter().map(|r| (r.band, r.range)).collect();
        for r in &topic.here {
            let Some(buddy_band) = r.band.buddy() else {
                continue;
            };
            if buddy_band.start() < r.band.start() {
                // An upper half whose lower half another broker writes:
                // once this half is idle, its merge is asked, which moves
                // it to the lower half's writer (ADR 0144); that broker then
                // sees both rates and merges them. Only the upper half's
                // writer asks, so two brokers never swap their halves.
                self.gather(
                    now_ms,
                    settings,
                    topic,
                    loads,
                    (r, buddy_band),
                    active,
                    plan,
                );
                continue;
            }
            // Each pair written here once: from its lower half.
            let Some(&buddy) = by_band.get(&buddy_band) else {
                continue;
            };
            if split.contains(&r.range) || split.contains(&buddy) {
                continue;
            }
            let (Some(lower), Some(upper)) = (loads.get(&r.range), loads.get(&buddy)) else {
                continue;
            };
            if decide_merge(settings, now_ms, lower, upper, active) {
                plan.actions.push(Action::Merge {
                    topic: topic.topic.clone(),
                    lower: r.range,
                    upper: buddy,
                });
                active -= 1;
            }
        }
    }

    /// Asks the merge of `upper` (written here, idle) with its lower buddy
    /// written elsewhere: the coordinator moves `upper` to the buddy's
    /// writer first.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        now_ms: u64,
        settings: &ReshapeSettings,
        topic: &TopicHere,
        loads: &BTreeMap<RangeId, RangeLoad>,
        (upper, lower_band): (&RangeHere, Band),
        active: usize,
        plan: &mut Plan,
    ) {
        let Some(&lower) = topic.elsewhere.get(&lower_band) else {
            return;
        };
        let Some(load) = loads.get(&upper.range) else {
            return;
        };
        let already = plan.actions.iter().any(|a| match a {
            Action::Split { range, .. } => *range == upper.range,
            Action::Merge { upper: u, .. } => *u == upper.range,
        });
        if !already && decide_merge(settings, now_ms, load, load, active) {
            plan.actions.push(Action::Merge {
                topic: topic.topic.clone(),
                lower,
                upper: upper.range,
            });
        }
    }

    /// Remembers that a request about these ranges was refused at `now_ms`.
    pub fn refused(&mut self, now_ms: u64, ranges: &[RangeId]) {
        for range in ranges {
            self.tracked.entry(*range).or_default().refused_ms = Some(now_ms);
        }
    }

    /// Remembers a refusal for a passing reason: these ranges are asked
    /// about again `RESHAPE_BUSY_RETRY_MS` after `now_ms`.
    pub fn refused_busy(&mut self, now_ms: u64, ranges: &[RangeId]) {
        for range in ranges {
            self.tracked.entry(*range).or_default().busy_until_ms =
                Some(now_ms.saturating_add(RESHAPE_BUSY_RETRY_MS));
        }
    }

    /// Forgets every range not in `live`, and keeps the bound.
    pub fn retain(&mut self, live: &BTreeSet<RangeId>) {
        self.tracked.retain(|id, _| live.contains(id));
        while self.tracked.len() > RESHAPER_RANGES_MAX {
            self.tracked.pop_first();
        }
    }
}

/// The active ranges this broker writes, by topic, from its replicas.
pub(crate) fn ranges_here(state: &MetadataState, me: NodeId, out: &mut Vec<TopicHere>) {
    for topic in state.topics() {
        let mut here = Vec::new();
        let mut elsewhere = BTreeMap::new();
        let mut ranges_active = 0;
        for range in state.active_ranges(&topic.name) {
            ranges_active += 1;
            let primary = range
                .last_segment()
                .and_then(|s| state.segment(s))
                .and_then(|s| s.replicas.first().copied());
            if primary == Some(me) {
                here.push(RangeHere {
                    range: range.id,
                    band: range.band,
                    reshaped_ms: (!range.parents.is_empty()).then_some(range.created_at_ms),
                    split_child: range.parents.len() == 1,
                });
            } else {
                elsewhere.insert(range.band, range.id);
            }
        }
        if !here.is_empty() {
            out.push(TopicHere {
                topic: topic.name.clone(),
                policy: topic.policy.clone(),
                ranges_active,
                here,
                elsewhere,
            });
        }
    }
}

pub(crate) struct ReshaperState {
    ctx: Arc<ReshaperCtx>,
    every: Duration,
    planner: Planner,
    next: Timer,
}

type Timer = JoinHandle<Result<(), MessagingErr<ReshaperMsg>>>;

impl Drop for ReshaperState {
    fn drop(&mut self) {
        self.next.abort();
    }
}

#[ractor::async_trait]
impl Actor for ReshaperActor {
    type Msg = ReshaperMsg;
    type State = ReshaperState;
    type Arguments = Arc<ReshaperCtx>;

    async fn pre_start(
        &self,
        myself: ActorRef<ReshaperMsg>,
        ctx: Arc<ReshaperCtx>,
    ) -> Result<ReshaperState, ActorProcessingErr> {
        let every = Duration::from_millis(ctx.defaults.reshape_check_interval_ms);
        let next = myself.send_after(every, || ReshaperMsg::Check);
        Ok(ReshaperState {
            ctx,
            every,
            planner: Planner::default(),
            next,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ReshaperMsg>,
        message: ReshaperMsg,
        state: &mut ReshaperState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReshaperMsg::Check => {
                check(state).await;
                state.next = myself.send_after(state.every, || ReshaperMsg::Check);
            }
        }
        Ok(())
    }
}

/// One check: gather, decide, ask.
async fn check(state: &mut ReshaperState) {
    let ctx = Arc::clone(&state.ctx);
    let Ok(plane) = ctx.actors.plane() else {
        return;
    };
    let mut topics = Vec::new();
    plane.view_each(&mut |s| ranges_here(s, NodeId(ctx.node_id), &mut topics));
    // A topic is in one vnode; a vnode split in flight may show it twice.
    let mut seen = BTreeSet::new();
    topics.retain(|t| seen.insert(t.topic.clone()));
    let now_ms = ctx.clock.now_ms();
    let live: BTreeSet<RangeId> = topics
        .iter()
        .flat_map(|t| t.here.iter().map(|r| r.range))
        .collect();
    ctx.rates.retain(|id| live.contains(&id));
    state.planner.retain(&live);
    let samples: BTreeMap<RangeId, RangeSample> = ctx
        .rates
        .samples(now_ms)
        .into_iter()
        .map(|s| (s.range, s))
        .collect();
    for s in samples.values() {
        ctx.metrics.range_write_rate(
            &s.topic,
            s.range.0,
            s.rate.bytes_per_second,
            s.rate.records_per_second,
        );
    }
    if topics.is_empty() {
        return;
    }
    let policies = if topics.iter().any(|t| t.policy.is_some()) {
        // Bounded: a read with no quorum (a shutdown, a partition) must not
        // hold the actor, and so its supervisor's stop, for long.
        let read = tokio::time::timeout(
            Duration::from_millis(POLICIES_READ_TIMEOUT_MS),
            ctx.control.policies(),
        );
        match read.await {
            Ok(Ok(all)) => all,
            Ok(Err(e)) => {
                debug!(error = %e, "reshape check skipped: the policies are unreadable");
                return;
            }
            Err(_) => {
                debug!(
                    timeout_ms = POLICIES_READ_TIMEOUT_MS,
                    "reshape check skipped: the policies did not answer in time"
                );
                return;
            }
        }
    } else {
        BTreeMap::new()
    };
    let mut budget = RESHAPES_PER_CHECK_MAX;
    for topic in &topics {
        let settings = settings_of(&ctx.defaults, topic, &policies);
        let plan = state.planner.plan(now_ms, &settings, topic, &samples);
        report_hot_keys(&ctx, topic, &plan, &samples, now_ms);
        for action in plan.actions {
            if budget == 0 {
                return;
            }
            budget -= 1;
            ask(&ctx, &mut state.planner, action, &settings, now_ms).await;
        }
    }
}

fn settings_of(
    defaults: &ReshapeDefaults,
    topic: &TopicHere,
    policies: &BTreeMap<String, StoragePolicy>,
) -> ReshapeSettings {
    let policy: Option<&ReshapePolicy> = topic
        .policy
        .as_ref()
        .and_then(|name| policies.get(name))
        .and_then(|p| p.reshape.as_ref());
    defaults.settings().with_policy(policy)
}

fn report_hot_keys(
    ctx: &ReshaperCtx,
    topic: &TopicHere,
    plan: &Plan,
    samples: &BTreeMap<RangeId, RangeSample>,
    now_ms: u64,
) {
    for &(range, share_permille) in &plan.hot_keys {
        let bytes = samples.get(&range).map_or(0, |s| s.rate.bytes_per_second);
        info!(topic = %topic.topic, range = range.0, share_permille, bytes_per_second = bytes,
            "range not split: one key carries most of its writes");
        ctx.metrics.count_hot_key_unsplittable(&topic.topic);
        ctx.rates.set_hot_key_unsplittable(range, true);
        ctx.rates.remember(
            &topic.topic,
            ReshapeEvent {
                at_ms: now_ms,
                kind: "hot_key".into(),
                reason: Reason::WriteRateHigh.name().into(),
                ranges: vec![range.0],
                children: Vec::new(),
                refused: Some(format!(
                    "one key carries {share_permille}\u{2030} of its bytes"
                )),
            },
        );
    }
    for &range in &plan.hot_keys_cleared {
        ctx.rates.set_hot_key_unsplittable(range, false);
    }
}

/// Asks the coordinator manager for one split or merge, and records what
/// came of it.
async fn ask(
    ctx: &ReshaperCtx,
    planner: &mut Planner,
    action: Action,
    settings: &ReshapeSettings,
    now_ms: u64,
) {
    let Some(manager) = ctx.actors.manager().get() else {
        return;
    };
    let timeout = ctx.request_timeout_ms;
    let (topic, kind, reason, ranges, answer) = match &action {
        Action::Split { topic, range } => {
            let answer = ractor::call_t!(
                manager,
                |reply| CoordinatorMsg::Split {
                    topic: topic.clone(),
                    range: *range,
                    reply,
                },
                timeout
            );
            let answer = flatten(answer).map(|(a, b)| vec![a.0, b.0]);
            (topic, "split", Reason::WriteRateHigh, vec![*range], answer)
        }
        Action::Merge {
            topic,
            lower,
            upper,
        } => {
            let answer = ractor::call_t!(
                manager,
                |reply| CoordinatorMsg::Merge {
                    topic: topic.clone(),
                    range: *lower,
                    reply,
                },
                timeout
            );
            let answer = flatten(answer).map(|(_, _, merged)| vec![merged.0]);
            (
                topic,
                "merge",
                Reason::WriteRateLow,
                vec![*lower, *upper],
                answer,
            )
        }
    };
    let ids: Vec<u64> = ranges.iter().map(|r| r.0).collect();
    match answer {
        Ok(children) => {
            info!(%topic, kind, reason = reason.name(), ranges = ?ids, children = ?children,
                split_write_bytes_per_second = settings.split_write_bytes_per_second,
                merge_write_bytes_per_second = settings.merge_write_bytes_per_second,
                "range reshaped automatically");
            ctx.metrics.count_auto_reshape(kind, reason.name());
            ctx.rates.remember(
                topic,
                ReshapeEvent {
                    at_ms: now_ms,
                    kind: kind.into(),
                    reason: reason.name().into(),
                    ranges: ids,
                    children,
                    refused: None,
                },
            );
        }
        Err(refusal) => {
            if refusal.is_passing() {
                planner.refused_busy(now_ms, &ranges);
            } else {
                planner.refused(now_ms, &ranges);
            }
            if matches!(refusal, Refusal::Coord(CoordError::WrittenElsewhere { .. })) {
                // A gathered half (moved to its buddy's writer, which
                // merges them), or a range that moved meanwhile.
                debug!(%topic, kind, ranges = ?ids, %refusal, "automatic merge goes on at the other half's writer");
            } else {
                warn!(%topic, kind, ranges = ?ids, %refusal, "automatic reshape refused; asked again later");
            }
            ctx.rates.remember(
                topic,
                ReshapeEvent {
                    at_ms: now_ms,
                    kind: kind.into(),
                    reason: reason.name().into(),
                    ranges: ids,
                    children: Vec::new(),
                    refused: Some(refusal.to_string()),
                },
            );
        }
    }
}

/// Why a request to the coordinator manager got no reshape.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Coord(CoordError),
    #[error("the coordinator manager did not answer: {0}")]
    Silent(String),
}

impl Refusal {
    /// A refusal that a short wait may cure: the segment was rolling or
    /// could not be frozen yet, or its copies' quorum was not back.
    fn is_passing(&self) -> bool {
        matches!(
            self,
            Refusal::Coord(CoordError::Freeze { .. } | CoordError::FreezeNoQuorum { .. })
        )
    }
}

fn flatten<T, E: std::fmt::Display>(
    answer: Result<Result<T, CoordError>, E>,
) -> Result<T, Refusal> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(Refusal::Coord(e)),
        Err(e) => Err(Refusal::Silent(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_core::rate::Rate;

    fn settings() -> ReshapeSettings {
        ReshapeSettings {
            auto_reshape: true,
            split_write_bytes_per_second: 1_000,
            split_after_ms: 3_000,
            merge_write_bytes_per_second: 100,
            merge_after_ms: 5_000,
            reshape_interval_ms: 10_000,
            ranges_min: 1,
            ranges_max: 8,
        }
    }

    fn topic(bands: &[(u64, Band)]) -> TopicHere {
        TopicHere {
            topic: "t".into(),
            policy: None,
            ranges_active: bands.len(),
            here: bands
                .iter()
                .map(|&(id, band)| RangeHere {
                    range: RangeId(id),
                    band,
                    reshaped_ms: None,
                    split_child: false,
                })
                .collect(),
            elsewhere: BTreeMap::new(),
        }
    }

    fn sample(range: u64, bytes: u64, share: u64) -> (RangeId, RangeSample) {
        (
            RangeId(range),
            RangeSample {
                topic: "t".into(),
                range: RangeId(range),
                rate: Rate {
                    bytes_per_second: bytes,
                    records_per_second: 1,
                },
                hot_key_share_permille: Some(share),
                hot_key_unsplittable: false,
            },
        )
    }

    #[test]
    fn a_range_hot_for_long_enough_is_split_once_per_check() {
        let whole = Band::new(0, 64).unwrap();
        let t = topic(&[(1, whole)]);
        let rates: BTreeMap<_, _> = [sample(1, 5_000, 10)].into();
        let mut planner = Planner::default();
        for now in [0, 1_000, 2_000] {
            assert!(
                planner
                    .plan(now, &settings(), &t, &rates)
                    .actions
                    .is_empty()
            );
        }
        let plan = planner.plan(3_000, &settings(), &t, &rates);
        assert_eq!(
            plan.actions,
            vec![Action::Split {
                topic: "t".into(),
                range: RangeId(1)
            }]
        );
    }

    /// Asserts the planner asks for nothing at each of `times`.
    fn asks_nothing(
        planner: &mut Planner,
        times: &[u64],
        t: &TopicHere,
        rates: &BTreeMap<RangeId, RangeSample>,
    ) {
        for &now in times {
            let plan = planner.plan(now, &settings(), t, rates);
            assert!(plan.actions.is_empty(), "at {now} ms: {:?}", plan.actions);
        }
    }

    /// ADR 0160: a split's child still hot splits on its own heat; once a
    /// request about it is refused, it waits the interval again.
    #[test]
    fn a_split_child_still_hot_splits_without_the_interval_until_refused() {
        let lower = Band::new(0, 63).unwrap();
        let mut t = topic(&[(2, lower)]);
        t.here[0].reshaped_ms = Some(0);
        t.here[0].split_child = true;
        let rates: BTreeMap<_, _> = [sample(2, 5_000, 10)].into();
        let mut planner = Planner::default();
        asks_nothing(&mut planner, &[0, 1_000, 2_000], &t, &rates);
        // 3 s of its own heat, 7 s before the interval would end.
        let split = vec![Action::Split {
            topic: "t".into(),
            range: RangeId(2),
        }];
        assert_eq!(planner.plan(3_000, &settings(), &t, &rates).actions, split);
        planner.refused(3_500, &[RangeId(2)]);
        asks_nothing(&mut planner, &[4_000, 13_499], &t, &rates);
        assert_eq!(planner.plan(13_500, &settings(), &t, &rates).actions, split);
        // A merge's child (two parents) waits the interval.
        t.here[0].split_child = false;
        let mut planner = Planner::default();
        asks_nothing(&mut planner, &[0, 1_000, 2_000, 3_000, 9_999], &t, &rates);
        assert_eq!(planner.plan(10_000, &settings(), &t, &rates).actions, split);
    }

    #[test]
    fn a_hot_key_is_reported_once_and_never_split() {
        let whole = Band::new(0, 64).unwrap();
        let t = topic(&[(1, whole)]);
        let rates: BTreeMap<_, _> = [sample(1, 5_000, 900)].into();
        let mut planner = Planner::default();
        let mut reported = 0;
        for now in (0..20_000).step_by(1_000) {
            let plan = planner.plan(now, &settings(), &t, &rates);
            assert!(plan.actions.is_empty());
            reported += plan.hot_keys.len();
        }
        assert_eq!(reported, 1);
    }

    #[test]
    fn only_the_idle_upper_half_of_buddies_written_apart_asks_to_gather() {
        let (lower, upper) = Band::new(0, 64).unwrap().halves().unwrap();
        // Here: the upper half; the lower one is written elsewhere.
        let mut t = topic(&[(3, upper)]);
        t.ranges_active = 2;
        t.elsewhere.insert(lower, RangeId(2));
        let rates: BTreeMap<_, _> = [sample(3, 0, 0)].into();
        let mut planner = Planner::default();
        assert!(planner.plan(0, &settings(), &t, &rates).actions.is_empty());
        assert_eq!(
            planner.plan(5_000, &settings(), &t, &rates).actions,
            vec![Action::Merge {
                topic: "t".into(),
                lower: RangeId(2),
                upper: RangeId(3),
            }]
        );
        // The lower half's writer does not ask: the two never swap halves.
        let mut l = topic(&[(2, lower)]);
        l.ranges_active = 2;
        l.elsewhere.insert(upper, RangeId(3));
        let rates: BTreeMap<_, _> = [sample(2, 0, 0)].into();
        let mut planner = Planner::default();
        for now in [0, 5_000, 10_000] {
            assert!(
                planner
                    .plan(now, &settings(), &l, &rates)
                    .actions
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_refusal_for_a_passing_reason_is_asked_again_soon_not_after_the_interval() {
        let (lower, upper) = Band::new(0, 64).unwrap().halves().unwrap();
        let t = topic(&[(2, lower), (3, upper)]);
        let rates: BTreeMap<_, _> = [sample(2, 0, 0), sample(3, 0, 0)].into();
        let mut planner = Planner::default();
        assert!(planner.plan(0, &settings(), &t, &rates).actions.is_empty());
        let merge = Action::Merge {
            topic: "t".into(),
            lower: RangeId(2),
            upper: RangeId(3),
        };
        assert_eq!(
            planner.plan(5_000, &settings(), &t, &rates).actions,
            vec![merge.clone()]
        );
        planner.refused_busy(5_000, &[RangeId(2), RangeId(3)]);
        let soon = 5_000 + RESHAPE_BUSY_RETRY_MS;
        assert!(
            planner
                .plan(soon - 1, &settings(), &t, &rates)
                .actions
                .is_empty()
        );
        assert!(soon < 5_000 + settings().reshape_interval_ms);
        assert_eq!(
            planner.plan(soon, &settings(), &t, &rates).actions,
            vec![merge]
        );
        let frozen = Refusal::Coord(CoordError::Freeze {
            segment: malachi_core::model::SegmentId(1),
            reason: "segment is busy: the segment is rolling".into(),
        });
        assert!(frozen.is_passing());
        assert!(!Refusal::Silent("gone".into()).is_passing());
    }

    #[test]
    fn idle_buddies_merge_and_a_refusal_waits_the_interval() {
        let (lower, upper) = Band::new(0, 64).unwrap().halves().unwrap();
        let t = topic(&[(2, lower), (3, upper)]);
        let rates: BTreeMap<_, _> = [sample(2, 0, 0), sample(3, 0, 0)].into();
        let mut planner = Planner::default();
        assert!(planner.plan(0, &settings(), &t, &rates).actions.is_empty());
        let plan = planner.plan(5_000, &settings(), &t, &rates);
        let merge = Action::Merge {
            topic: "t".into(),
            lower: RangeId(2),
            upper: RangeId(3),
        };
        assert_eq!(plan.actions, vec![merge.clone()]);
        planner.refused(5_000, &[RangeId(2), RangeId(3)]);
        assert!(
            planner
                .plan(14_999, &settings(), &t, &rates)
                .actions
                .is_empty()
        );
        assert_eq!(
            planner.plan(15_000, &settings(), &t, &rates).actions,
            vec![merge]
        );
    }
}
