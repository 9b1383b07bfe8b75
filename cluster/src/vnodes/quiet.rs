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
//! view of its group and the up set. `spawn_quiescer` applies it to every
//! hosted group whenever the up set changes and every `check_ms`, and sends
//! one heartbeat round from each led group to a voter whose broker just
//! came back, so it learns its leader before its own election timer fires.

use super::VnodeHost;
use crate::group::GroupPace;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Weak;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often every hosted group is re-judged even when liveness is still:
/// catches a group that fell behind, learned a leader, or was opened.
pub const QUIET_CHECK_MS_DEFAULT: u64 = 250;

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

/// Runs `quiet_wanted` over `host`'s groups until the host is dropped or
/// the up channel closes.
pub(super) fn spawn_quiescer(
    host: Weak<VnodeHost>,
    mut up: watch::Receiver<BTreeSet<u64>>,
    check_ms: u64,
    balance: bool,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut before: BTreeSet<u64> = BTreeSet::new();
        let mut transferred: BTreeMap<u64, Handover> = BTreeMap::new();
        loop {
            let mut transfers = 0usize;
            let now: BTreeSet<u64> = up.borrow_and_update().clone();
            let back: BTreeSet<u64> = now.difference(&before).copied().collect();
            {
                let Some(host) = host.upgrade() else { break };
                if host.is_stopped() {
                    break;
                }
                for group in host.registry().all() {
                    let pace = group.pace();
                    if !pace.running {
                        continue;
                    }
                    let quiet = quiet_wanted(&pace, &now);
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
                    let wakes_peer = pace.voters.iter().any(|v| back.contains(v));
                    if pace.is_leader
                        && wakes_peer
                        && let Err(e) = group.heartbeat().await
                    {
                        tracing::debug!(error = %e, "heartbeat to a returning peer failed");
                    }
                    if !balance {
                        continue;
                    }
                    // A stalled hand-over is handed over again whatever
                    // the pass's budget: the group serves nothing until.
                    let stalled = transferred.get(&pace.group_id).copied().filter(|h| {
                        handover_stalled(&pace, h, Duration::from_millis(TRANSFER_STALLED_MS))
                    });
                    if let Some(stalled) = stalled {
                        let to = handover_target(&pace, &now);
                        tracing::info!(
                            group = pace.group_id,
                            from = pace.node_id,
                            stalled_to = stalled.to,
                            ?to,
                            "leadership hand-over stalled; handing over again"
                        );
                        transferred.insert(
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
                        continue;
                    }
                    if transfers >= TRANSFERS_PER_PASS_MAX {
                        continue;
                    }
                    let recently = transferred
                        .get(&pace.group_id)
                        .is_some_and(|h| h.at.elapsed() < Duration::from_millis(TRANSFER_RETRY_MS));
                    if let Some(to) = transfer_wanted(&pace, &now)
                        && !recently
                    {
                        tracing::debug!(
                            group = pace.group_id,
                            from = pace.node_id,
                            to,
                            "handing leadership to the preferred voter"
                        );
                        transferred.insert(
                            pace.group_id,
                            Handover {
                                to,
                                term: pace.term,
                                at: Instant::now(),
                            },
                        );
                        transfers += 1;
                        group.set_quiet(false);
                        if let Err(e) = group.transfer_leader(to).await {
                            tracing::debug!(error = %e, "leadership transfer failed");
                        }
                    }
                }
            }
            before = now;
            transferred.retain(|_, h| h.at.elapsed() < Duration::from_millis(TRANSFER_RETRY_MS));
            tokio::select! {
                changed = up.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(check_ms)) => {}
            }
        }
    })
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
