//! Moving vnode replicas to where the cluster's members say they belong
//! (ADR 0104): a joined broker takes its share, a decommissioned one gives
//! its share away, and one dead for longer than `replace_after_ms` is
//! replaced.
//!
//! The ring's member list (`Ring::members_or`) is the one input every
//! broker shares. From it, [`eligible`] keeps the brokers that may hold
//! replicas (active, and not dead for too long while enough others
//! remain), and [`target_voters`] names each group's voters among them by
//! the same rendezvous hash that placed the formation's replicas, so a
//! cluster that never changed has nothing to move, and one broker more or
//! less moves only the replicas it gains or loses.
//!
//! [`next_step`] is the whole decision for one group, a pure function of
//! its leader's view: add a missing voter as a learner first (it catches
//! up before it counts), then change the voters through openraft's joint
//! consensus, one change at a time, each waited for; a leader that is
//! itself leaving hands its leadership to a voter that stays first, so the
//! group is never left to elect among quiet followers. A broker that holds
//! copies of the group's segments keeps (or gets) a learner replica, since
//! the data path reads a topic's metadata on its own disk; a voter that
//! leaves becomes a learner, and a learner nobody needs leaves (and closes
//! its replica) last. `run_rebalancer` runs it on every group this
//! broker leads, a few groups at a time.

use super::{HostLoop, VnodeHost, voters_for};
use crate::group::{GroupMembership, MetadataGroup};
use malachi_core::ring::{MemberState, RING_VNODE, Ring, VnodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a broker may be dead before its vnode replicas are replaced,
/// unless configured otherwise: long enough for a restart or a reboot.
pub const REPLACE_AFTER_MS_DEFAULT: u64 = 300_000;
/// How often every led group is compared with its target.
pub const REBALANCE_CHECK_MS_DEFAULT: u64 = 1_000;
/// How many groups one broker changes at once.
pub const REBALANCE_GROUPS_PARALLEL_MAX: usize = 4;
/// How long a leader waits for its hand-over (an election) before it asks
/// again.
pub const HANDOVER_RETRY_MS: u64 = 1_000;
/// How long a learner nobody needs stays before it is removed.
pub const LEARNER_LINGER_MS: u64 = 5_000;
/// How often a broker asks the leaders of the groups it hosts but does
/// not lead whether they still list it (a close that was lost).
pub const SWEEP_EVERY_MS: u64 = 10_000;
/// How long one step (a learner's catch-up, a membership change) may take.
pub const MEMBERSHIP_STEP_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// The next change one group's leader makes, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The group is where it belongs (or cannot move now).
    Settled,
    /// Ask `node` to open its replica, add it as a learner (unless it is
    /// one), and wait for it to catch up with the log.
    AddLearner { node: u64 },
    /// Change the voters to exactly `voters` (joint consensus); voters left
    /// out stay as learners until `RemoveLearners`.
    ChangeVoters { voters: BTreeSet<u64> },
    /// This leader leaves the voters: hand leadership to `to` first; the
    /// new leader makes the rest of the change.
    HandOver { to: u64 },
    /// Learners nobody needs leave the group and close their replicas.
    RemoveLearners { nodes: BTreeSet<u64> },
}

/// The brokers that may hold vnode replicas: the active members, less
/// those `dead` (down for at least `replace_after_ms`) as long as at least
/// `min(replicas, active)` remain, so replacing never shrinks a group.
pub fn eligible(
    members: &BTreeMap<u64, MemberState>,
    dead: &BTreeSet<u64>,
    replicas: usize,
) -> Vec<u64> {
    let active: Vec<u64> = members
        .iter()
        .filter(|(_, s)| **s == MemberState::Active)
        .map(|(n, _)| *n)
        .collect();
    let alive: Vec<u64> = active
        .iter()
        .copied()
        .filter(|n| !dead.contains(n))
        .collect();
    if !alive.is_empty() && alive.len() >= replicas.max(1).min(active.len()) {
        alive
    } else {
        active
    }
}

/// The voters `vnode`'s group (or the ring's group, for `RING_VNODE`)
/// should have among `eligible`.
pub fn target_voters(vnode: VnodeId, eligible: &[u64], replicas: usize) -> BTreeSet<u64> {
    if eligible.is_empty() {
        return BTreeSet::new();
    }
    let tag = if vnode == RING_VNODE {
        super::RING_VOTERS_TAG
    } else {
        vnode
    };
    voters_for(tag, eligible, replicas).into_iter().collect()
}

/// The voters `vnode`'s group should have among `eligible` under the
/// ring's vnode placement constraints (ADR 0121): [`target_voters`] when
/// the ring has none; else the set [`malachi_core::constraints::place`] chooses
/// over the attributes the members committed to the ring, with the
/// rendezvous voters preferred, so constraints those already meet move
/// nothing. A pure function of the ring and `eligible`: every leader the
/// group ever has computes the same set. An error names a hard constraint
/// no set of eligible brokers meets; the group then stays as it is.
pub fn placed_voters(
    vnode: VnodeId,
    eligible: &[u64],
    replicas: usize,
    ring: &malachi_core::ring::Ring,
) -> Result<BTreeSet<u64>, PlacementRefused> {
    let hashed = target_voters(vnode, eligible, replicas);
    if ring.vnode_placement().is_empty() || hashed.is_empty() {
        return Ok(hashed);
    }
    let constraints = malachi_core::constraints::parse_all(ring.vnode_placement())
        .map_err(|e| PlacementRefused(e.to_string()))?;
    let brokers: Vec<malachi_core::constraints::Broker> = eligible
        .iter()
        .map(|node| malachi_core::constraints::Broker {
            node: *node,
            attributes: ring.attributes_of(*node).cloned().unwrap_or_default(),
        })
        .collect();
    let preferred: Vec<u64> = hashed.iter().copied().collect();
    let tag = if vnode == RING_VNODE {
        super::RING_VOTERS_TAG
    } else {
        vnode
    };
    let factor = replicas.max(1).min(eligible.len());
    malachi_core::constraints::place(
        &[],
        &preferred,
        &brokers,
        factor,
        u64::from(tag.0),
        &constraints,
    )
    .map(|placed| placed.nodes.into_iter().collect())
    .map_err(|e| PlacementRefused(e.to_string()))
}

/// Why [`placed_voters`] chose no set: the ring's vnode placement
/// constraints cannot be met by the eligible brokers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vnode placement: {0}")]
pub struct PlacementRefused(pub String);

/// What the leader `me` of a group with `current` membership does next to
/// reach `target` voters, keeping every broker in `keep` (those holding
/// copies of the group's segments) at least a learner. `up` are the
/// brokers answering now (`me` counts as up).
pub fn next_step(
    me: u64,
    current: &GroupMembership,
    target: &BTreeSet<u64>,
    keep: &BTreeSet<u64>,
    up: &BTreeSet<u64>,
) -> Step {
    if target.is_empty() || current.voters.is_empty() {
        return Step::Settled;
    }
    let is_up = |n: &u64| *n == me || up.contains(n);
    if !target.contains(&me) {
        // Hand over to a voter that stays and is up; lacking one that
        // stays (the target shares no voter with the group), first grow
        // the group with this leader kept. In a joint membership, finish
        // it first (with this leader kept) and hand over on the next pass.
        let mut stays = current
            .voters
            .iter()
            .copied()
            .filter(|v| *v != me && target.contains(v))
            .peekable();
        if stays.peek().is_some() {
            match stays.find(|v| is_up(v)) {
                Some(to) if !current.joint => return Step::HandOver { to },
                Some(_) => {}
                // Every voter that stays is down: wait for one.
                None => return Step::Settled,
            }
        }
    }
    let mut wanted = target.clone();
    wanted.insert(me);
    // A missing voter joins as a learner; a learner that lags (its replica
    // may have closed, or be catching up still) is asked again to open and
    // waited for, so no voter is ever made of a replica without the log.
    let missing = wanted.iter().copied().find(|n| {
        !current.voters.contains(n)
            && (!current.learners.contains(n) || current.lagging.contains(n))
    });
    if let Some(node) = missing {
        if !is_up(&node) {
            return Step::Settled;
        }
        return Step::AddLearner { node };
    }
    if current.voters != wanted || current.joint {
        // A change needs a quorum of the new voters up, and of the old.
        let quorum = |set: &BTreeSet<u64>| set.iter().filter(|n| is_up(n)).count() * 2 > set.len();
        if !quorum(&wanted) || !quorum(&current.voters) {
            return Step::Settled;
        }
        return Step::ChangeVoters { voters: wanted };
    }
    // A holder of segment copies that has no replica yet gets a learner.
    if let Some(node) = keep
        .iter()
        .copied()
        .find(|n| !current.voters.contains(n) && !current.learners.contains(n) && is_up(n))
    {
        return Step::AddLearner { node };
    }
    let stray: BTreeSet<u64> = current
        .learners
        .iter()
        .copied()
        .filter(|l| !wanted.contains(l) && !keep.contains(l))
        .collect();
    if !stray.is_empty() {
        return Step::RemoveLearners { nodes: stray };
    }
    Step::Settled
}

/// Which brokers have been down for at least `after`: fed the up set on
/// every pass, it remembers since when each member was last seen down.
#[derive(Debug, Default)]
pub struct DownSince {
    since: BTreeMap<u64, Instant>,
}

impl DownSince {
    /// Notes which `members` are down at `now` and returns those down for
    /// at least `after`. `me` is never down.
    pub fn observe(
        &mut self,
        me: u64,
        members: impl Iterator<Item = u64>,
        up: &BTreeSet<u64>,
        now: Instant,
        after: Duration,
    ) -> BTreeSet<u64> {
        let mut dead = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for member in members {
            seen.insert(member);
            if member == me || up.contains(&member) {
                self.since.remove(&member);
                continue;
            }
            let since = *self.since.entry(member).or_insert(now);
            if now.duration_since(since) >= after {
                dead.insert(member);
            }
        }
        self.since.retain(|n, _| seen.contains(n));
        dead
    }
}

/// The vnode a group id names: the ring's group is `RING_VNODE`.
pub(super) fn vnode_of(group_id: u64) -> Option<VnodeId> {
    if group_id == malachi_core::ring::RING_GROUP_ID {
        return Some(RING_VNODE);
    }
    u32::try_from(group_id).ok().map(VnodeId)
}

/// Runs [`next_step`] over the groups `host` leads, every `check_ms`,
/// until the host stops. `up` is the liveness prober's up set (`None`
/// without probing: every member counts as up, and none is replaced). The
/// host's owner runs it (`HostLoop::Rebalancer`) and is told when it ends.
pub(super) async fn run_rebalancer(
    host: Weak<VnodeHost>,
    up: Option<watch::Receiver<BTreeSet<u64>>>,
    check_ms: u64,
    replace_after_ms: u64,
) {
    let mut state = Rebalancer::new(Duration::from_millis(replace_after_ms));
    loop {
        let worked = {
            // The host is held (strongly) for the whole pass, awaits
            // included, and let go before the pause.
            let Some(host) = host.upgrade() else { break };
            if host.is_stopped() {
                break;
            }
            host.trip(HostLoop::Rebalancer);
            state.pass(&host, up.as_ref()).await
        };
        // Straight on while there is work; else wait for the next check.
        let pause = if worked { 50 } else { check_ms };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// A group's target voters, by the ring version and eligible brokers it
/// was computed from.
type CachedTarget = ((u64, Vec<u64>), Result<BTreeSet<u64>, PlacementRefused>);

/// What the rebalancer keeps from one pass to the next.
struct Rebalancer {
    replace_after: Duration,
    down: DownSince,
    last_sweep: Instant,
    /// Since when each learner (by group) has been one nobody needs.
    unneeded: BTreeMap<(u64, u64), Instant>,
    /// When each group last handed its leadership over: a hand-over is
    /// an election, given time before it is asked for again.
    handed: BTreeMap<u64, Instant>,
    /// Each led group's segment-copy holders, by the applied index they
    /// were read at: recomputed only when the group applied something.
    holders: BTreeMap<u64, (u64, BTreeSet<u64>)>,
    /// Each led group's target. Placement under constraints may weigh
    /// many sets: computed again only when its inputs change.
    targets: BTreeMap<u64, CachedTarget>,
}

/// One pass's view of the cluster, the same for every group it judges.
struct View {
    ring: Arc<Ring>,
    me: u64,
    up_now: BTreeSet<u64>,
    eligible: Vec<u64>,
    replicas: usize,
}

impl Rebalancer {
    fn new(replace_after: Duration) -> Rebalancer {
        Rebalancer {
            replace_after,
            down: DownSince::default(),
            last_sweep: Instant::now(),
            unneeded: BTreeMap::new(),
            handed: BTreeMap::new(),
            holders: BTreeMap::new(),
            targets: BTreeMap::new(),
        }
    }

    /// One pass: takes a step in up to `REBALANCE_GROUPS_PARALLEL_MAX` led
    /// groups at once, and every `SWEEP_EVERY_MS` sweeps the groups this
    /// broker left. Whether any step was taken.
    async fn pass(
        &mut self,
        host: &VnodeHost,
        up: Option<&watch::Receiver<BTreeSet<u64>>>,
    ) -> bool {
        let view = self.view(host, up);
        let steps = self.plan_steps(host, &view);
        let worked = !steps.is_empty();
        let runs = steps
            .into_iter()
            .map(|(vnode, group, step)| host.take_step(vnode, group, step));
        futures::future::join_all(runs).await;
        if self.last_sweep.elapsed() >= Duration::from_millis(SWEEP_EVERY_MS) {
            self.last_sweep = Instant::now();
            host.sweep_left_groups().await;
        }
        worked
    }

    /// The pass's view: the ring's members, who is up (every member
    /// without a prober), and which brokers may hold replicas given who
    /// has been down past `replace_after`.
    fn view(&mut self, host: &VnodeHost, up: Option<&watch::Receiver<BTreeSet<u64>>>) -> View {
        let ring = host.ring();
        let members = ring.members_or(host.formation_nodes());
        let me = host.node_id();
        let up_now: BTreeSet<u64> = match up {
            Some(up) => up.borrow().clone(),
            None => members.keys().copied().collect(),
        };
        let dead = self.down.observe(
            me,
            members.keys().copied(),
            &up_now,
            Instant::now(),
            self.replace_after,
        );
        debug_assert!(!dead.contains(&me), "this broker is never dead to itself");
        let replicas = host.replicas_per_vnode();
        let eligible = eligible(&members, &dead, replicas);
        View {
            ring,
            me,
            up_now,
            eligible,
            replicas,
        }
    }

    /// The steps this pass takes: in the led groups, in order, up to
    /// `REBALANCE_GROUPS_PARALLEL_MAX` of them. What is kept about groups
    /// no longer led is forgotten first.
    fn plan_steps(&mut self, host: &VnodeHost, view: &View) -> Vec<(VnodeId, MetadataGroup, Step)> {
        let mut steps = Vec::new();
        let led: Vec<_> = host
            .registry()
            .all()
            .into_iter()
            .filter(|g| g.is_leader())
            .collect();
        let led_ids: BTreeSet<u64> = led.iter().map(|g| g.group_id()).collect();
        self.holders.retain(|id, _| led_ids.contains(id));
        self.targets.retain(|id, _| led_ids.contains(id));
        self.handed.retain(|id, _| led_ids.contains(id));
        self.unneeded.retain(|(id, _), _| led_ids.contains(id));
        for group in led {
            let Some(vnode) = vnode_of(group.group_id()) else {
                continue;
            };
            let Some(step) = self.group_step(view, vnode, &group) else {
                continue;
            };
            debug_assert_ne!(step, Step::Settled, "a settled group takes no step");
            steps.push((vnode, group, step));
            if steps.len() >= REBALANCE_GROUPS_PARALLEL_MAX {
                break;
            }
        }
        steps
    }

    /// The step one led group takes now ([`next_step`]), if any: none when
    /// its placement cannot be met, it is settled, or it handed its
    /// leadership over less than `HANDOVER_RETRY_MS` ago.
    fn group_step(&mut self, view: &View, vnode: VnodeId, group: &MetadataGroup) -> Option<Step> {
        let group_id = group.group_id();
        let target = self.target(view, vnode, group_id).ok()?;
        let membership = group.membership();
        let keep = self.keep(group, &membership, &target);
        let step = next_step(view.me, &membership, &target, &keep, &view.up_now);
        if let Step::HandOver { .. } = step {
            if self
                .handed
                .get(&group_id)
                .is_some_and(|at| at.elapsed() < Duration::from_millis(HANDOVER_RETRY_MS))
            {
                return None;
            }
            self.handed.insert(group_id, Instant::now());
        }
        (step != Step::Settled).then_some(step)
    }

    /// A group's target voters ([`placed_voters`]), computed again only
    /// when the ring version or the eligible brokers changed. A refusal is
    /// warned about once per change of inputs.
    fn target(
        &mut self,
        view: &View,
        vnode: VnodeId,
        group_id: u64,
    ) -> Result<BTreeSet<u64>, PlacementRefused> {
        let inputs = (view.ring.version(), view.eligible.clone());
        match self.targets.get(&group_id) {
            Some((at, target)) if *at == inputs => target.clone(),
            _ => {
                let target = placed_voters(vnode, &view.eligible, view.replicas, &view.ring);
                if let Err(refused) = &target {
                    tracing::warn!(%vnode, ring_version = view.ring.version(), %refused, "the vnode placement constraints cannot be met; the group stays where it is");
                }
                self.targets.insert(group_id, (inputs, target.clone()));
                target
            }
        }
    }

    /// The brokers a group keeps at least a learner on: its segment-copy
    /// holders (read again only when the group applied something), and a
    /// learner nobody needs for `LEARNER_LINGER_MS` first: a segment placed
    /// on it a moment ago may not be applied on this leader yet.
    fn keep(
        &mut self,
        group: &MetadataGroup,
        membership: &GroupMembership,
        target: &BTreeSet<u64>,
    ) -> BTreeSet<u64> {
        let group_id = group.group_id();
        let applied = group.applied_index();
        let mut keep = match self.holders.get(&group_id) {
            Some((at, set)) if *at == applied => set.clone(),
            _ => {
                let set = group.read_local(|s| s.copy_holders());
                self.holders.insert(group_id, (applied, set.clone()));
                set
            }
        };
        let now = Instant::now();
        for learner in &membership.learners {
            if target.contains(learner) || keep.contains(learner) {
                self.unneeded.remove(&(group_id, *learner));
                continue;
            }
            let since = *self.unneeded.entry((group_id, *learner)).or_insert(now);
            if now.duration_since(since) < Duration::from_millis(LEARNER_LINGER_MS) {
                keep.insert(*learner);
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(nodes: &[u64]) -> BTreeSet<u64> {
        nodes.iter().copied().collect()
    }

    fn group(voters: &[u64], learners: &[u64], joint: bool) -> GroupMembership {
        GroupMembership {
            voters: set(voters),
            learners: set(learners),
            lagging: BTreeSet::new(),
            joint,
            committed: true,
        }
    }

    fn none() -> BTreeSet<u64> {
        BTreeSet::new()
    }

    #[test]
    fn a_new_voter_is_a_learner_first_then_the_voters_change_in_one_joint_step() {
        let up = set(&[1, 2, 3, 4]);
        let target = set(&[1, 2, 4]);
        assert_eq!(
            next_step(1, &group(&[1, 2, 3], &[], false), &target, &none(), &up),
            Step::AddLearner { node: 4 }
        );
        assert_eq!(
            next_step(1, &group(&[1, 2, 3], &[4], false), &target, &none(), &up),
            Step::ChangeVoters {
                voters: set(&[1, 2, 4]),
            }
        );
        // The voter that left is a learner now; nobody needs it: it goes.
        assert_eq!(
            next_step(1, &group(&[1, 2, 4], &[3], false), &target, &none(), &up),
            Step::RemoveLearners { nodes: set(&[3]) }
        );
        assert_eq!(
            next_step(1, &group(&[1, 2, 4], &[], false), &target, &none(), &up),
            Step::Settled
        );
    }

    #[test]
    fn a_holder_of_segment_copies_keeps_or_gets_a_learner_replica() {
        let up = set(&[1, 2, 3, 4, 5]);
        let target = set(&[1, 2, 4]);
        assert_eq!(
            next_step(1, &group(&[1, 2, 4], &[3], false), &target, &set(&[3]), &up),
            Step::Settled,
            "3 holds copies: it stays a learner"
        );
        assert_eq!(
            next_step(1, &group(&[1, 2, 4], &[], false), &target, &set(&[5]), &up),
            Step::AddLearner { node: 5 }
        );
    }

    #[test]
    fn a_leaving_leader_hands_over_to_a_voter_that_stays_and_is_up() {
        let target = set(&[2, 3, 4]);
        let current = group(&[1, 2, 3], &[], false);
        assert_eq!(
            next_step(1, &current, &target, &none(), &set(&[2, 3, 4])),
            Step::HandOver { to: 2 }
        );
        assert_eq!(
            next_step(1, &current, &target, &none(), &set(&[3, 4])),
            Step::HandOver { to: 3 },
            "not to a voter that is down"
        );
        assert_eq!(
            next_step(1, &current, &target, &none(), &set(&[4])),
            Step::Settled,
            "the voters that stay are down: wait"
        );
    }

    #[test]
    fn a_joint_membership_left_behind_is_completed() {
        let up = set(&[1, 2, 3, 4]);
        assert_eq!(
            next_step(
                1,
                &group(&[1, 2, 3, 4], &[], true),
                &set(&[1, 2, 4]),
                &none(),
                &up
            ),
            Step::ChangeVoters {
                voters: set(&[1, 2, 4]),
            }
        );
    }

    #[test]
    fn nothing_changes_without_a_quorum_up_on_both_sides() {
        let target = set(&[1, 2, 4]);
        assert_eq!(
            next_step(
                1,
                &group(&[1, 2, 3], &[4], false),
                &target,
                &none(),
                &set(&[4])
            ),
            Step::Settled
        );
        assert_eq!(
            next_step(
                1,
                &group(&[1, 2, 3], &[], false),
                &target,
                &none(),
                &set(&[2, 3])
            ),
            Step::Settled,
            "a learner that is down is not added"
        );
    }

    #[test]
    fn a_lagging_learner_is_asked_again_and_not_promoted() {
        let up = set(&[1, 2, 3, 4]);
        let mut current = group(&[1, 2, 3], &[4], false);
        current.lagging = set(&[4]);
        assert_eq!(
            next_step(1, &current, &set(&[1, 2, 4]), &none(), &up),
            Step::AddLearner { node: 4 }
        );
    }

    #[test]
    fn the_dead_are_replaced_only_while_enough_others_remain() {
        let members: BTreeMap<u64, MemberState> = [1, 2, 3, 4]
            .into_iter()
            .map(|n| (n, MemberState::Active))
            .collect();
        assert_eq!(eligible(&members, &set(&[4]), 3), vec![1, 2, 3]);
        assert_eq!(
            eligible(&members, &set(&[3, 4]), 3),
            vec![1, 2, 3, 4],
            "two left cannot hold three replicas"
        );
        let mut decommissioned = members.clone();
        decommissioned.insert(2, MemberState::Decommissioned);
        assert_eq!(
            eligible(&decommissioned, &BTreeSet::new(), 3),
            vec![1, 3, 4]
        );
    }

    #[test]
    fn down_since_counts_from_the_first_pass_that_saw_a_member_down() {
        let mut down = DownSince::default();
        let start = Instant::now();
        let after = Duration::from_secs(10);
        let members = [1u64, 2, 3];
        assert!(
            down.observe(1, members.into_iter(), &set(&[2]), start, after)
                .is_empty()
        );
        let later = start + Duration::from_secs(10);
        assert_eq!(
            down.observe(1, members.into_iter(), &set(&[2]), later, after),
            set(&[3])
        );
        // Back up: forgotten, and counted afresh the next time.
        assert!(
            down.observe(1, members.into_iter(), &set(&[2, 3]), later, after)
                .is_empty()
        );
        assert!(
            down.observe(1, members.into_iter(), &set(&[2]), later, after)
                .is_empty()
        );
    }

    fn zoned_ring(zones: &[(u64, &str)], placement: &[&str]) -> malachi_core::ring::Ring {
        let mut ring = malachi_core::ring::Ring::new(16).unwrap();
        for (node, zone) in zones {
            ring.set_attributes(
                *node,
                BTreeMap::from([("zone".to_owned(), (*zone).to_owned())]),
            );
        }
        ring.set_vnode_placement(placement.iter().map(|c| (*c).to_owned()).collect());
        ring
    }

    const ZONES: [(u64, &str); 4] = [(1, "a"), (2, "a"), (3, "b"), (4, "c")];

    #[test]
    fn without_vnode_constraints_placement_is_rendezvous_hashing() {
        let ring = zoned_ring(&ZONES, &[]);
        let nodes = [1, 2, 3, 4];
        for v in (0..16).map(VnodeId).chain([RING_VNODE]) {
            assert_eq!(
                placed_voters(v, &nodes, 3, &ring).unwrap(),
                target_voters(v, &nodes, 3)
            );
        }
    }

    #[test]
    fn vnode_constraints_span_the_zones_and_keep_hashed_sets_that_meet_them() {
        let nodes = [1, 2, 3, 4];
        let ring = zoned_ring(&ZONES, &["distinct(zone) >= 3"]);
        let mut moved = 0;
        for v in (0..16).map(VnodeId).chain([RING_VNODE]) {
            let placed = placed_voters(v, &nodes, 3, &ring).unwrap();
            let zones: BTreeSet<&str> = placed
                .iter()
                .map(|n| ZONES.iter().find(|(m, _)| m == n).unwrap().1)
                .collect();
            assert_eq!(placed.len(), 3, "{v}: {placed:?}");
            assert_eq!(zones.len(), 3, "{v}: {placed:?}");
            let hashed = target_voters(v, &nodes, 3);
            if hashed.contains(&3) && hashed.contains(&4) {
                assert_eq!(
                    placed, hashed,
                    "{v}: a hashed set meeting the constraint stays"
                );
            } else {
                moved += 1;
            }
        }
        // The hash alone puts some group in two zones: the constraint moves it.
        assert!(moved > 0);
    }

    #[test]
    fn vnode_constraints_no_eligible_set_meets_are_refused_and_a_soft_one_is_relaxed() {
        let nodes = [1, 2, 3];
        let hard = zoned_ring(&ZONES, &["distinct(zone) >= 3"]);
        assert!(placed_voters(VnodeId(0), &nodes, 3, &hard).is_err());
        let soft = zoned_ring(&ZONES, &["soft: distinct(zone) >= 3"]);
        assert_eq!(
            placed_voters(VnodeId(0), &nodes, 3, &soft).unwrap(),
            set(&[1, 2, 3])
        );
        // Fewer eligible brokers than replicas: all of them, as hashing does.
        let two = zoned_ring(&ZONES, &["soft: distinct(zone) >= 2"]);
        assert_eq!(
            placed_voters(VnodeId(0), &[1, 3], 3, &two).unwrap(),
            set(&[1, 3])
        );
        // A broker that committed no attributes is a zone of its own.
        let unzoned = zoned_ring(&[(1, "a"), (2, "a")], &["distinct(zone) >= 3"]);
        let placed = placed_voters(VnodeId(0), &[1, 2, 3, 4], 3, &unzoned).unwrap();
        assert!(placed.contains(&3) && placed.contains(&4), "{placed:?}");
        assert!(placed_voters(VnodeId(0), &nodes, 3, &unzoned).is_err());
    }

    proptest! {
        /// ADR 0121: vnode placement under a hard `distinct(zone) >= k`
        /// is a pure function of the ring and the eligible brokers (their
        /// order does not matter), never breaks the constraint, and is
        /// refused only when no set of eligible brokers meets it.
        #[test]
        fn vnode_placement_is_deterministic_and_never_breaks_a_hard_constraint(
            zones in proptest::collection::vec(0u8..4, 1..8),
            k in 1usize..4,
            vnode in 0u32..64,
        ) {
            let names = ["a", "b", "c", "d"];
            let zoned: Vec<(u64, &str)> = zones
                .iter()
                .enumerate()
                .map(|(i, z)| (i as u64 + 1, names[*z as usize]))
                .collect();
            let constraint = format!("distinct(zone) >= {k}");
            let ring = zoned_ring(&zoned, &[constraint.as_str()]);
            let nodes: Vec<u64> = zoned.iter().map(|(n, _)| *n).collect();
            let mut reversed = nodes.clone();
            reversed.reverse();
            let placed = placed_voters(VnodeId(vnode), &nodes, 3, &ring);
            prop_assert_eq!(&placed, &placed_voters(VnodeId(vnode), &reversed, 3, &ring));
            let factor = nodes.len().min(3);
            let distinct_available: BTreeSet<&str> = zoned.iter().map(|(_, z)| *z).collect();
            match placed {
                Ok(set) => {
                    prop_assert_eq!(set.len(), factor);
                    let spanned: BTreeSet<&str> = set
                        .iter()
                        .map(|n| zoned.iter().find(|(m, _)| m == n).unwrap().1)
                        .collect();
                    prop_assert!(spanned.len() >= k, "{:?} spans {:?}", set, spanned);
                }
                Err(_) => prop_assert!(distinct_available.len().min(factor) < k),
            }
        }

        /// From any membership, following the steps (each applied as raft
        /// would) reaches the target voters, with exactly the holders of
        /// segment copies outside them as learners, in a bounded number of
        /// steps; a leader never removes itself, and the group never has
        /// fewer voters than it started with or the target has.
        #[test]
        fn the_steps_reach_the_target(
            start in proptest::collection::btree_set(1u64..8, 1..5),
            target in proptest::collection::btree_set(1u64..8, 1..5),
            keep in proptest::collection::btree_set(1u64..8, 0..3),
            leader_pick in 0usize..8,
        ) {
            let up: BTreeSet<u64> = (1..8).collect();
            let mut current = GroupMembership {
                voters: start.clone(),
                ..GroupMembership::default()
            };
            let mut leader = *start.iter().nth(leader_pick % start.len()).unwrap();
            let floor = start.len().min(target.len());
            for _ in 0..40 {
                match next_step(leader, &current, &target, &keep, &up) {
                    Step::Settled => break,
                    Step::AddLearner { node } => {
                        prop_assert!(!current.voters.contains(&node));
                        prop_assert!(current.learners.insert(node) || current.lagging.remove(&node));
                    }
                    Step::ChangeVoters { voters } => {
                        prop_assert!(voters.iter().all(|v| current.voters.contains(v) || current.learners.contains(v)));
                        prop_assert!(voters.contains(&leader), "a leader never removes itself");
                        let left: Vec<u64> = current.voters.difference(&voters).copied().collect();
                        current.learners.retain(|l| !voters.contains(l));
                        current.learners.extend(left);
                        current.voters = voters;
                    }
                    Step::HandOver { to } => {
                        prop_assert!(current.voters.contains(&to) && target.contains(&to));
                        leader = to;
                    }
                    Step::RemoveLearners { nodes } => {
                        for n in nodes {
                            prop_assert!(!keep.contains(&n));
                            prop_assert!(current.learners.remove(&n));
                        }
                    }
                }
                prop_assert!(current.voters.len() >= floor);
            }
            prop_assert_eq!(&current.voters, &target);
            let learners: BTreeSet<u64> = keep.difference(&target).copied().collect();
            prop_assert_eq!(&current.learners, &learners);
        }

        /// Replicas spread evenly: with 256 vnodes on 3 to 8 brokers, no
        /// broker holds more than 1.3 times its fair share (the skew bound
        /// docs/guides/clustering.md states).
        #[test]
        fn replicas_spread_within_the_skew_bound(brokers in 3u64..=8, offset in 0u64..1000) {
            let nodes: Vec<u64> = (1..=brokers).map(|n| n + offset).collect();
            let mut held: BTreeMap<u64, usize> = BTreeMap::new();
            for v in 0..256 {
                for n in target_voters(VnodeId(v), &nodes, 3) {
                    *held.entry(n).or_default() += 1;
                }
            }
            let fair = 256.0 * 3.0 / brokers as f64;
            let most = *held.values().max().unwrap() as f64;
            prop_assert!(most <= fair * 1.3, "{held:?} fair {fair}");
        }
    }
}
