//! Quiet groups (ADR 0101): a vnode group with nothing to replicate and a
//! live leader parks its raft ticker, so an idle broker's cost does not
//! grow with the number of vnodes it hosts.
//!
//! A quiet leader sends no heartbeats; a quiet follower runs no election
//! timer and refuses pre-votes from anyone but its leader (`MetadataGroup`
//! does that part). What replaces the heartbeat is broker liveness
//! (`group::liveness`): one probe per peer, not per group. When a leader's
//! broker stops answering, its followers' groups wake, their election
//! timers (long expired) fire on the next tick, and they elect.
//!
//! `quiet_wanted` is the whole decision, a pure function of one replica's
//! view of its group and the up set. `run_quiescer` applies it to every
//! hosted group whenever the up set changes and every `check_ms`, and sends
//! one heartbeat round from each led group to a voter whose broker just
//! came back, so it learns its leader before its own election timer fires.

use super::{HostLoop, VnodeHost};
use crate::group::{GroupPace, MetadataGroup};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Weak;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often every hosted group is re-judged even when liveness is still:
/// catches a group that fell behind, learned a leader, or was opened.
pub const QUIET_CHECK_MS_DEFAULT: u64 = 250;

/// A quiet group is re-judged only on every this many passes (about every
/// 2 s at the default check) unless the up set changed: a quiet group
/// changes pace because a peer came or went (the up set), or because it
/// took a write, whose replication does not wait for the ticker.
pub const QUIET_SETTLED_PASSES: u64 = 8;

/// At most this many leaderships are handed over per pass, so a start
/// (where the first broker up wins most elections) does not become an
/// election storm.
pub const TRANSFERS_PER_PASS_MAX: usize = 8;
/// A group whose leadership was handed over is left alone this long.
pub const TRANSFER_RETRY_MS: u64 = 10_000;
/// A leader still leading the term it handed over this long after the
/// hand-over hands it over again (`handover_target`): the transfer was lost
/// or its target went away, and until it loses leadership openraft's leader
/// refuses every request and sends no heartbeats, while quiet followers
/// never campaign. A hand-over normally completes in one vote round.
pub const TRANSFER_STALLED_MS: u64 = 1_000;

/// The voter that should lead a group: spread over the voters by group id,
/// so that with leaders where they belong each broker leads its share of
/// the vnodes (and runs its share of the coordinators). `None` without
/// voters.
pub fn preferred_leader(group_id: u64, voters: &[u64]) -> Option<u64> {
    if voters.is_empty() {
        return None;
    }
    let mut sorted = voters.to_vec();
    sorted.sort_unstable();
    let at = usize::try_from(group_id % sorted.len() as u64).unwrap_or(0);
    sorted.get(at).copied()
}

/// To whom a leader in `pace` should hand its leadership now, if anyone:
/// its preferred voter, once that voter's broker is up and has the whole
/// log, and only while the group is idle (quiet), so no write is cut off.
pub fn transfer_wanted(pace: &GroupPace, up: &BTreeSet<u64>) -> Option<u64> {
    if !pace.running || !pace.is_leader || !quiet_wanted(pace, up) {
        return None;
    }
    let preferred = preferred_leader(pace.group_id, &pace.voters)?;
    let ready =
        preferred != pace.node_id && up.contains(&preferred) && !pace.behind.contains(&preferred);
    ready.then_some(preferred)
}

/// To whom a leader in `pace` whose hand-over stalled should hand its
/// leadership again: the preferred voter if it is up and has the whole log,
/// else the first other voter that is. `None` if no other voter can take it
/// (then no quorum is up either, or one that lags must catch up first).
pub fn handover_target(pace: &GroupPace, up: &BTreeSet<u64>) -> Option<u64> {
    if !pace.running || !pace.is_leader {
        return None;
    }
    let ready = |v: &u64| *v != pace.node_id && up.contains(v) && !pace.behind.contains(v);
    let preferred = preferred_leader(pace.group_id, &pace.voters).filter(ready);
    let mut others: Vec<u64> = pace.voters.iter().copied().filter(ready).collect();
    others.sort_unstable();
    preferred.or_else(|| others.first().copied())
}

/// One hand-over this broker started: to whom, in which term, and when.
#[derive(Debug, Clone, Copy)]
struct Handover {
    to: u64,
    term: u64,
    at: Instant,
}

/// Whether a hand-over of `pace`'s group stalled: this replica still leads
/// the term it handed over, `stalled_after` since it did.
fn handover_stalled(pace: &GroupPace, handover: &Handover, stalled_after: Duration) -> bool {
    pace.running
        && pace.is_leader
        && pace.term == handover.term
        && handover.at.elapsed() >= stalled_after
}

/// Whether a replica in `pace` may be quiet, given the nodes `up`.
///
/// - A leader may be quiet once every voter whose broker is up has its whole
///   log: a lagging voter needs the heartbeats that drive its catch-up. A
///   voter that is down gains nothing from heartbeats.
/// - A follower (or candidate) may be quiet only while it knows a leader
///   other than itself and that leader's broker is up. With no leader, or a
///   leader that is down, it must tick, and so campaign.
/// - A stopped group is left alone.
pub fn quiet_wanted(pace: &GroupPace, up: &BTreeSet<u64>) -> bool {
    if !pace.running {
        return false;
    }
    if pace.is_leader {
        return pace.behind.iter().all(|voter| !up.contains(voter));
    }
    match pace.leader {
        Some(leader) if leader != pace.node_id => up.contains(&leader),
        _ => false,
    }
}

/// At most this many of a broker's groups campaign at once. Thousands
/// campaigning together (a start, a broker's loss at 4,096 vnodes) queued
/// their vote requests behind each other past the vote timeout, failed,
/// and campaigned again: a congestion collapse (ADR 0105).
pub const CAMPAIGNS_MAX: usize = 64;
/// How long one group may campaign before it yields its place to the next
/// and waits as long again.
pub const CAMPAIGN_SLOT_MS: u64 = 3_000;

/// Whether a replica in `pace` that is not quiet (no live leader) should
/// run its election timer now, given the nodes `up` (ADR 0105): not
/// without a quorum of its voters up, itself counted. Such an election
/// cannot win, and thousands of groups campaigning in vain while peers
/// start (or stay away) were an election storm that starved the transport
/// and the membership protocol. A replica that is no voter (a learner) is
/// left ticking: openraft never campaigns with it.
///
/// Every live voter campaigns, not one chosen in turn: openraft's initial
/// membership entry carries the id of the replica that wrote it, so on a
/// fresh group only the voter with the greatest id can win the first
/// election, and a chosen campaigner that cannot win holds the group up.
pub fn campaign_wanted(pace: &GroupPace, up: &BTreeSet<u64>) -> bool {
    if !pace.voters.contains(&pace.node_id) {
        return true;
    }
    let live = pace
        .voters
        .iter()
        .filter(|v| **v == pace.node_id || up.contains(v))
        .count();
    live > pace.voters.len() / 2
}

/// Whether a replica in `pace` should have its election timer parked now:
/// it has no live leader and may not campaign (`campaign_wanted`), or may
/// but `campaigns` has no place for it yet. Every judged group goes through
/// `campaigns`, so one that found its leader gives its place back (one that
/// kept its place from an election long past was made to rest a slot when
/// its leader later died, and failover took 4 s instead of 1).
pub fn parked_wanted(
    campaigns: &mut Campaigns,
    pace: &GroupPace,
    up: &BTreeSet<u64>,
    now: Instant,
) -> bool {
    let campaigning = !pace.is_leader && !quiet_wanted(pace, up);
    let wanted = campaigning && campaign_wanted(pace, up);
    let admitted = campaigns.admit(pace.group_id, wanted, now);
    campaigning && !admitted
}

/// The groups of one broker allowed to campaign now: at most `max` at once,
/// each for at most `slot`, after which it waits as long before it may
/// campaign again, so groups that cannot win do not keep the others out.
#[derive(Debug)]
pub struct Campaigns {
    max: usize,
    slot: Duration,
    /// Campaigning groups, since when.
    running: BTreeMap<u64, Instant>,
    /// Groups whose slot ran out, since when.
    resting: BTreeMap<u64, Instant>,
}

impl Campaigns {
    pub fn new(max: usize, slot: Duration) -> Campaigns {
        Campaigns {
            max: max.max(1),
            slot,
            running: BTreeMap::new(),
            resting: BTreeMap::new(),
        }
    }

    /// Whether `group`, which wants to campaign (`wanted`) or not, may run
    /// its election timer at `now`. A group that stops wanting gives its
    /// place back at once.
    pub fn admit(&mut self, group: u64, wanted: bool, now: Instant) -> bool {
        if !wanted {
            self.running.remove(&group);
            self.resting.remove(&group);
            return false;
        }
        if let Some(since) = self.running.get(&group).copied() {
            if now.saturating_duration_since(since) < self.slot {
                return true;
            }
            self.running.remove(&group);
            self.resting.insert(group, now);
            return false;
        }
        if let Some(since) = self.resting.get(&group).copied() {
            if now.saturating_duration_since(since) < self.slot {
                return false;
            }
            self.resting.remove(&group);
        }
        if self.running.len() >= self.max {
            return false;
        }
        self.running.insert(group, now);
        true
    }

    /// How many groups campaign now.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Forgets the groups `keep` says no.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        self.running.retain(|g, _| keep(*g));
        self.resting.retain(|g, _| keep(*g));
    }
}

/// Runs `quiet_wanted` over `host`'s groups until the host is dropped or
/// stopped, or the up channel closes (the prober ended): the host's owner
/// runs it (`HostLoop::Quiescer`) and is told when it ends.
pub(super) async fn run_quiescer(
    host: Weak<VnodeHost>,
    mut up: watch::Receiver<BTreeSet<u64>>,
    check_ms: u64,
    balance: bool,
) {
    let mut state = Quiescer::new(balance);
    loop {
        let pass = state.begin_pass(up.borrow_and_update().clone());
        {
            // The host is held (strongly) for the whole pass, awaits
            // included, and let go before the wait for the next.
            let Some(host) = host.upgrade() else { break };
            if host.is_stopped() {
                break;
            }
            host.trip(HostLoop::Quiescer);
            state.judge_groups(&host, &pass).await;
        }
        state.end_pass(&host, pass);
        if !next_pass_due(&mut up, check_ms).await {
            break;
        }
    }
}

/// Waits until the up set changes or `check_ms` passes. False once the up
/// channel closed: the prober ended, and with it the quiescer's input.
async fn next_pass_due(up: &mut watch::Receiver<BTreeSet<u64>>, check_ms: u64) -> bool {
    tokio::select! {
        changed = up.changed() => changed.is_ok(),
        () = tokio::time::sleep(Duration::from_millis(check_ms)) => true,
    }
}

/// What the quiescer keeps from one pass to the next.
struct Quiescer {
    /// Whether leaderships are handed to their preferred voters.
    balance: bool,
    /// The up set the last pass judged by.
    before: BTreeSet<u64>,
    /// Hand-overs started and not yet forgotten (`TRANSFER_RETRY_MS`).
    transferred: BTreeMap<u64, Handover>,
    passes: u64,
    campaigns: Campaigns,
}

/// One pass's view of liveness.
struct Pass {
    /// The up set now.
    now: BTreeSet<u64>,
    /// Nodes up now that were not at the last pass.
    back: BTreeSet<u64>,
    /// Whether quiet groups are judged too this pass.
    full: bool,
}

impl Quiescer {
    fn new(balance: bool) -> Quiescer {
        Quiescer {
            balance,
            before: BTreeSet::new(),
            transferred: BTreeMap::new(),
            passes: 0,
            campaigns: Campaigns::new(CAMPAIGNS_MAX, Duration::from_millis(CAMPAIGN_SLOT_MS)),
        }
    }

    /// Decides which groups this pass judges. A quiet group is re-judged
    /// on every change of the up set and on every `QUIET_SETTLED_PASSES`th
    /// pass; the others on every pass. Judging all of 4,096 groups four
    /// times a second was most of an idle broker's cost (ADR 0105).
    fn begin_pass(&mut self, now: BTreeSet<u64>) -> Pass {
        let back: BTreeSet<u64> = now.difference(&self.before).copied().collect();
        self.passes = self.passes.wrapping_add(1);
        let full = now != self.before || self.passes.is_multiple_of(QUIET_SETTLED_PASSES);
        debug_assert!(
            back.is_empty() || full,
            "a node came back yet the pass is not full"
        );
        Pass { now, back, full }
    }

    /// Remembers the pass's up set and forgets hand-overs past their retry
    /// time and, on a full pass, the campaign places of groups gone.
    fn end_pass(&mut self, host: &Weak<VnodeHost>, pass: Pass) {
        self.before = pass.now;
        self.transferred
            .retain(|_, h| h.at.elapsed() < Duration::from_millis(TRANSFER_RETRY_MS));
        if let Some(host) = host.upgrade().filter(|_| pass.full) {
            self.campaigns
                .retain(|group_id| host.registry().get(group_id).is_some());
        }
    }

    /// Judges every hosted group this pass covers, one after another.
    async fn judge_groups(&mut self, host: &VnodeHost, pass: &Pass) {
        let mut transfers = 0usize;
        for group in host.registry().all() {
            if !pass.full && group.is_quiet() && !group.is_parked() {
                continue;
            }
            let pace = group.pace();
            if !pace.running {
                // A stopped group campaigns no more: its place goes.
                self.campaigns.admit(pace.group_id, false, Instant::now());
                continue;
            }
            self.set_pace(&group, &pace, &pass.now);
            let wakes_peer = pace.voters.iter().any(|v| pass.back.contains(v));
            if pace.is_leader
                && wakes_peer
                && let Err(e) = group.heartbeat().await
            {
                tracing::debug!(error = %e, "heartbeat to a returning peer failed");
            }
            if self.balance {
                self.balance_leader(&group, &pace, &pass.now, &mut transfers)
                    .await;
            }
        }
    }

    /// Parks or unparks one running group's election timer and quiets or
    /// wakes its ticker, as `parked_wanted` and `quiet_wanted` decide.
    fn set_pace(&mut self, group: &MetadataGroup, pace: &GroupPace, now: &BTreeSet<u64>) {
        debug_assert!(pace.running, "a stopped group is not paced");
        let quiet = quiet_wanted(pace, now);
        let parked = parked_wanted(&mut self.campaigns, pace, now, Instant::now());
        if parked != group.is_parked() {
            group.set_parked(parked);
        }
        if quiet != group.is_quiet() {
            tracing::debug!(
                group = pace.group_id,
                node = pace.node_id,
                leader = ?pace.leader,
                is_leader = pace.is_leader,
                quiet,
                "group pace changed"
            );
            group.set_quiet(quiet);
        }
    }

    /// Hands one group's leadership on if it should move: again if its
    /// last hand-over stalled, whatever the pass's budget (the group
    /// serves nothing until), else to its preferred voter while the pass
    /// has budget (`TRANSFERS_PER_PASS_MAX`) and it was not handed over
    /// within `TRANSFER_RETRY_MS`.
    async fn balance_leader(
        &mut self,
        group: &MetadataGroup,
        pace: &GroupPace,
        now: &BTreeSet<u64>,
        transfers: &mut usize,
    ) {
        let stalled = self
            .transferred
            .get(&pace.group_id)
            .copied()
            .filter(|h| handover_stalled(pace, h, Duration::from_millis(TRANSFER_STALLED_MS)));
        if let Some(stalled) = stalled {
            self.hand_over_again(group, pace, now, stalled).await;
            return;
        }
        if *transfers >= TRANSFERS_PER_PASS_MAX {
            return;
        }
        let recently = self
            .transferred
            .get(&pace.group_id)
            .is_some_and(|h| h.at.elapsed() < Duration::from_millis(TRANSFER_RETRY_MS));
        if let Some(to) = transfer_wanted(pace, now)
            && !recently
        {
            debug_assert_ne!(to, pace.node_id, "a leader hands over to another voter");
            tracing::debug!(
                group = pace.group_id,
                from = pace.node_id,
                to,
                "handing leadership to the preferred voter"
            );
            self.transferred.insert(
                pace.group_id,
                Handover {
                    to,
                    term: pace.term,
                    at: Instant::now(),
                },
            );
            *transfers += 1;
            group.set_quiet(false);
            if let Err(e) = group.transfer_leader(to).await {
                tracing::debug!(error = %e, "leadership transfer failed");
            }
        }
    }

    /// Hands a stalled hand-over's leadership again (`handover_target`),
    /// or, with no voter able to take it, only restarts its stall clock.
    async fn hand_over_again(
        &mut self,
        group: &MetadataGroup,
        pace: &GroupPace,
        now: &BTreeSet<u64>,
        stalled: Handover,
    ) {
        let to = handover_target(pace, now);
        debug_assert_ne!(
            to,
            Some(pace.node_id),
            "a leader hands over to another voter"
        );
        tracing::info!(
            group = pace.group_id,
            from = pace.node_id,
            stalled_to = stalled.to,
            ?to,
            "leadership hand-over stalled; handing over again"
        );
        self.transferred.insert(
            pace.group_id,
            Handover {
                to: to.unwrap_or(stalled.to),
                term: pace.term,
                at: Instant::now(),
            },
        );
        if let Some(to) = to
            && let Err(e) = group.transfer_leader(to).await
        {
            tracing::debug!(error = %e, "leadership transfer failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(is_leader: bool, leader: Option<u64>, behind: &[u64]) -> GroupPace {
        GroupPace {
            group_id: 7,
            node_id: 1,
            term: 3,
            is_leader,
            leader,
            voters: vec![1, 2, 3],
            behind: behind.to_vec(),
            running: true,
        }
    }

    fn up(nodes: &[u64]) -> BTreeSet<u64> {
        nodes.iter().copied().collect()
    }

    #[test]
    fn a_leader_is_quiet_once_every_live_voter_has_its_log() {
        assert!(quiet_wanted(&pace(true, Some(1), &[]), &up(&[1, 2, 3])));
        assert!(!quiet_wanted(&pace(true, Some(1), &[2]), &up(&[1, 2, 3])));
        // A voter that is down gains nothing from heartbeats.
        assert!(quiet_wanted(&pace(true, Some(1), &[2]), &up(&[1, 3])));
    }

    #[test]
    fn a_follower_is_quiet_only_with_a_live_leader_other_than_itself() {
        assert!(quiet_wanted(&pace(false, Some(2), &[]), &up(&[1, 2, 3])));
        assert!(!quiet_wanted(&pace(false, Some(2), &[]), &up(&[1, 3])));
        assert!(!quiet_wanted(&pace(false, None, &[]), &up(&[1, 2, 3])));
        // Named leader of itself without leading: a restarted replica.
        assert!(!quiet_wanted(&pace(false, Some(1), &[]), &up(&[1, 2, 3])));
    }

    #[test]
    fn only_a_replica_that_sees_a_quorum_of_its_voters_campaigns() {
        let leaderless = pace(false, None, &[]);
        assert!(campaign_wanted(&leaderless, &up(&[1, 2, 3])));
        assert!(campaign_wanted(&leaderless, &up(&[1, 3])));
        // Itself counts as up, whatever the up set says.
        assert!(campaign_wanted(&leaderless, &up(&[3])));
        assert!(!campaign_wanted(&leaderless, &up(&[])));
        assert!(!campaign_wanted(&leaderless, &up(&[4, 5])));
        // A single voter always may; a learner is left alone.
        let mut single = leaderless.clone();
        single.voters = vec![1];
        assert!(campaign_wanted(&single, &up(&[])));
        let mut learner = leaderless;
        learner.voters = vec![2, 3, 4];
        assert!(campaign_wanted(&learner, &up(&[])));
    }

    #[test]
    fn at_most_max_groups_campaign_each_for_a_slot_then_rest() {
        let slot = Duration::from_secs(3);
        let mut campaigns = Campaigns::new(2, slot);
        let t0 = Instant::now();
        assert!(campaigns.admit(1, true, t0));
        assert!(campaigns.admit(2, true, t0));
        assert!(!campaigns.admit(3, true, t0), "a third waits");
        assert_eq!(campaigns.running(), 2);
        // 1 got its leader: its place goes to 3.
        assert!(!campaigns.admit(1, false, t0));
        assert!(campaigns.admit(3, true, t0));
        // 2's slot runs out: it rests a slot, and 4 takes its place.
        let t1 = t0 + slot;
        assert!(!campaigns.admit(2, true, t1));
        assert!(campaigns.admit(4, true, t1));
        assert!(!campaigns.admit(2, true, t1 + slot / 2), "still resting");
        assert!(!campaigns.admit(1, false, t1));
        // 3 outlived its slot too by now: 2 may come back.
        let t2 = t1 + slot;
        assert!(!campaigns.admit(3, true, t2));
        assert!(campaigns.admit(2, true, t2));
    }

    #[test]
    fn a_group_that_found_its_leader_campaigns_at_once_when_it_loses_it() {
        let slot = Duration::from_secs(3);
        let mut campaigns = Campaigns::new(1, slot);
        let all = up(&[1, 2, 3]);
        let t0 = Instant::now();
        let leaderless = pace(false, None, &[]);
        assert!(!parked_wanted(&mut campaigns, &leaderless, &all, t0));
        // Another group waits for the only place.
        let mut other = leaderless.clone();
        other.group_id = 8;
        assert!(parked_wanted(&mut campaigns, &other, &all, t0));
        // Group 7 elects 2: quiet, and its place goes to group 8.
        let led = pace(false, Some(2), &[]);
        assert!(!parked_wanted(&mut campaigns, &led, &all, t0));
        assert!(!parked_wanted(&mut campaigns, &other, &all, t0));
        assert!(
            !parked_wanted(&mut campaigns, &other, &all, t0),
            "found its leader too"
        );
        assert!(!parked_wanted(
            &mut campaigns,
            &pace(false, Some(3), &[]),
            &up(&[1, 2, 3]),
            t0
        ));
        let mut led8 = led.clone();
        led8.group_id = 8;
        assert!(!parked_wanted(&mut campaigns, &led8, &all, t0));
        // Long after, 2 dies: group 7 campaigns at once, no slot to rest.
        let later = t0 + slot * 10;
        assert!(!parked_wanted(&mut campaigns, &led, &up(&[1, 3]), later));
        // Without a quorum up it stays parked.
        assert!(parked_wanted(&mut campaigns, &led, &up(&[1]), later));
        // A leader never parks.
        assert!(!parked_wanted(
            &mut campaigns,
            &pace(true, Some(1), &[]),
            &up(&[1]),
            later
        ));
    }

    #[test]
    fn preferred_leaders_spread_over_the_voters_by_group_id() {
        let voters = [3, 1, 2];
        let picks: Vec<u64> = (0..6)
            .map(|g| preferred_leader(g, &voters).unwrap())
            .collect();
        assert_eq!(picks, [1, 2, 3, 1, 2, 3]);
        assert_eq!(preferred_leader(5, &[]), None);
    }

    #[test]
    fn a_quiet_leader_hands_over_only_to_a_live_caught_up_preferred_voter() {
        // Group 7 of voters 1, 2, 3 prefers 2 (7 % 3 = 1).
        let all = up(&[1, 2, 3]);
        assert_eq!(transfer_wanted(&pace(true, Some(1), &[]), &all), Some(2));
        assert_eq!(
            transfer_wanted(&pace(true, Some(1), &[]), &up(&[1, 3])),
            None
        );
        assert_eq!(transfer_wanted(&pace(true, Some(1), &[2]), &all), None);
        // A busy leader (a live voter lags) keeps its leadership for now.
        assert_eq!(transfer_wanted(&pace(true, Some(1), &[3]), &all), None);
        assert_eq!(transfer_wanted(&pace(false, Some(2), &[]), &all), None);
        let mut preferred_already = pace(true, Some(1), &[]);
        preferred_already.group_id = 6;
        assert_eq!(transfer_wanted(&preferred_already, &all), None);
    }

    #[test]
    fn a_stalled_hand_over_goes_to_a_live_caught_up_voter() {
        // Group 7 of voters 1, 2, 3 prefers 2; this leader is 1.
        let all = up(&[1, 2, 3]);
        assert_eq!(handover_target(&pace(true, Some(1), &[]), &all), Some(2));
        // The preferred voter went away (the case that stalled it): the
        // other live voter with the whole log takes it.
        assert_eq!(
            handover_target(&pace(true, Some(1), &[]), &up(&[1, 3])),
            Some(3)
        );
        assert_eq!(
            handover_target(&pace(true, Some(1), &[2]), &all),
            Some(3),
            "a lagging voter cannot take it"
        );
        assert_eq!(
            handover_target(&pace(true, Some(1), &[3]), &up(&[1, 3])),
            None
        );
        assert_eq!(handover_target(&pace(false, Some(2), &[]), &all), None);
    }

    #[test]
    fn a_hand_over_stalls_only_while_this_replica_leads_the_same_term() {
        let handover = Handover {
            to: 2,
            term: 3,
            at: Instant::now(),
        };
        let leading = pace(true, Some(1), &[]);
        assert!(handover_stalled(&leading, &handover, Duration::ZERO));
        assert!(
            !handover_stalled(&leading, &handover, Duration::from_secs(60)),
            "not yet"
        );
        // Handed over: a follower now, or leading a later term again.
        assert!(!handover_stalled(
            &pace(false, Some(2), &[]),
            &handover,
            Duration::ZERO
        ));
        let mut reelected = leading.clone();
        reelected.term = 4;
        assert!(!handover_stalled(&reelected, &handover, Duration::ZERO));
    }

    #[test]
    fn a_stopped_group_is_never_quiet() {
        let mut p = pace(true, Some(1), &[]);
        p.running = false;
        assert!(!quiet_wanted(&p, &up(&[1, 2, 3])));
    }
}
