//! State-transition tests of the core over a simulated network with a
//! virtual clock: no sockets, no sleeps, and the same result on every run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use foca::Timer;

use super::*;

const PROBE_MS: u64 = 100;
const SUSPECT_MS: u64 = 600;

fn settings() -> SwimSettings {
    SwimSettings {
        probe_period_ms: PROBE_MS,
        probe_rtt_ms: 40,
        suspect_timeout_ms: SUSPECT_MS,
        packet_bytes_max: 1400,
        seed_retry_ms: 200,
    }
}

fn addr(node_id: u64) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4040 + node_id as u16))
}

fn identity(node_id: u64, incarnation: u64, zone: &str) -> NodeIdentity {
    NodeIdentity {
        node_id,
        incarnation,
        client_addr: addr(node_id),
        admin_addr: Some(SocketAddr::from(([127, 0, 0, 1], 8080 + node_id as u16))),
        raft_addr: None,
        cluster_addr: None,
        attributes: [("zone".to_owned(), zone.to_owned())].into(),
    }
}

enum Due {
    Packet {
        to: SocketAddr,
        data: bytes::Bytes,
    },
    Timer {
        node: u64,
        timer: Timer<NodeIdentity>,
    },
}

struct Node {
    core: MembershipCore,
    seeds: Vec<SocketAddr>,
    paused: bool,
    /// Timers that came due while paused: they fire on resume, late, as
    /// they do in a process that got SIGCONT.
    deferred: Vec<Timer<NodeIdentity>>,
    events: Vec<(u64, MemberEvent)>,
}

/// A cluster of cores on a lossless network with 1 ms of latency.
struct Sim {
    now_ms: u64,
    seq: u64,
    nodes: BTreeMap<u64, Node>,
    queue: BTreeMap<(u64, u64), Due>,
}

impl Sim {
    fn new() -> Sim {
        Sim {
            now_ms: 0,
            seq: 0,
            nodes: BTreeMap::new(),
            queue: BTreeMap::new(),
        }
    }

    fn push(&mut self, at_ms: u64, due: Due) {
        self.seq += 1;
        self.queue.insert((at_ms, self.seq), due);
    }

    fn start(&mut self, id: NodeIdentity, seeds: &[u64]) {
        let node_id = id.node_id;
        self.start_quietly(id, seeds);
        self.announce(node_id, 0);
    }

    /// Starts a node whose first seed tick has not come yet: another
    /// broker's announce can reach it first.
    fn start_quietly(&mut self, id: NodeIdentity, seeds: &[u64]) {
        let node_id = id.node_id;
        let core = MembershipCore::new(id, &settings(), node_id * 7919).unwrap();
        let seeds: Vec<SocketAddr> = seeds.iter().map(|s| addr(*s)).collect();
        self.nodes.insert(
            node_id,
            Node {
                core,
                seeds,
                paused: false,
                deferred: Vec::new(),
                events: Vec::new(),
            },
        );
    }

    /// Seed tick number `tick` of a node: the runtime's rule
    /// (`MembershipCore::seeds_to_announce`).
    fn announce(&mut self, node_id: u64, tick: u64) {
        let node = self.nodes.get_mut(&node_id).unwrap();
        for seed in node.core.seeds_to_announce(&node.seeds, tick) {
            let _ = node.core.announce(seed);
        }
        self.flush(node_id);
    }

    fn flush(&mut self, node_id: u64) {
        let mut effects = Effects::default();
        let node = self.nodes.get_mut(&node_id).unwrap();
        node.core.take_effects(&mut effects);
        let now = self.now_ms;
        node.events
            .extend(effects.events.into_iter().map(|e| (now, e)));
        for (to, data) in effects.sends {
            self.push(now + 1, Due::Packet { to, data });
        }
        for (after, timer) in effects.timers {
            let at = now + after.as_millis() as u64;
            self.push(
                at,
                Due::Timer {
                    node: node_id,
                    timer,
                },
            );
        }
    }

    fn node_at(&self, to: SocketAddr) -> Option<u64> {
        self.nodes
            .iter()
            .find(|(_, n)| n.core.identity().client_addr == to)
            .map(|(id, _)| *id)
    }

    /// Runs until `until_ms`; every `seed_retry_ms` (200), nodes that are
    /// not paused take a seed tick.
    fn run_until(&mut self, until_ms: u64) {
        while let Some((&(at, seq), _)) = self.queue.iter().next() {
            if at > until_ms {
                break;
            }
            let due = self.queue.remove(&(at, seq)).unwrap();
            if at / 200 != self.now_ms / 200 {
                let ticking: Vec<u64> = self
                    .nodes
                    .iter()
                    .filter(|(_, n)| !n.paused)
                    .map(|(id, _)| *id)
                    .collect();
                self.now_ms = at;
                for id in ticking {
                    self.announce(id, at / 200);
                }
            }
            self.now_ms = at;
            match due {
                Due::Packet { to, data } => {
                    // A paused process does not read its socket; a short
                    // pause keeps datagrams in the buffer, but the buffer
                    // is small, so the simulation drops them.
                    let Some(node_id) = self.node_at(to) else {
                        continue;
                    };
                    let node = self.nodes.get_mut(&node_id).unwrap();
                    if node.paused {
                        continue;
                    }
                    let _ = node.core.handle_data(&data);
                    self.flush(node_id);
                }
                Due::Timer {
                    node: node_id,
                    timer,
                } => {
                    let Some(node) = self.nodes.get_mut(&node_id) else {
                        continue;
                    };
                    if node.paused {
                        node.deferred.push(timer);
                        continue;
                    }
                    let _ = node.core.handle_timer(timer);
                    self.flush(node_id);
                }
            }
        }
        self.now_ms = until_ms;
    }

    fn pause(&mut self, node_id: u64) {
        self.nodes.get_mut(&node_id).unwrap().paused = true;
    }

    fn resume(&mut self, node_id: u64) {
        let node = self.nodes.get_mut(&node_id).unwrap();
        node.paused = false;
        for timer in std::mem::take(&mut node.deferred) {
            let _ = node.core.handle_timer(timer);
        }
        self.flush(node_id);
    }

    /// Replaces a node's core, as a restarted process with the same data dir.
    fn restart(&mut self, id: NodeIdentity, seeds: &[u64]) {
        // The old incarnation's pending timers die with it.
        let node_id = id.node_id;
        self.queue
            .retain(|_, due| !matches!(due, Due::Timer { node, .. } if *node == node_id));
        self.nodes.remove(&node_id);
        self.start(id, seeds);
    }

    fn view(&self, node_id: u64) -> &MembershipView {
        self.nodes[&node_id].core.view()
    }

    fn state_of(&self, observer: u64, node_id: u64) -> Option<MemberState> {
        self.view(observer).peers.get(&node_id).map(|m| m.state)
    }

    fn live_set(&self, observer: u64) -> BTreeSet<u64> {
        self.view(observer).live().map(|m| m.node_id).collect()
    }

    fn events_about(&self, observer: u64, node_id: u64) -> Vec<(u64, MemberEventKind)> {
        self.nodes[&observer]
            .events
            .iter()
            .filter(|(_, e)| e.member.node_id == node_id)
            .map(|(t, e)| (*t, e.kind))
            .collect()
    }
}

fn three_node_cluster() -> Sim {
    let mut sim = Sim::new();
    // Every broker is given the others as seeds, as `--seed` does.
    sim.start(identity(1, 100, "a"), &[2, 3]);
    sim.start(identity(2, 100, "b"), &[1, 3]);
    sim.start(identity(3, 100, "c"), &[1, 2]);
    sim.run_until(3_000);
    sim
}

#[test]
fn three_brokers_form_one_cluster_from_seeds_and_a_fourth_joins_through_one() {
    let mut sim = three_node_cluster();
    for observer in 1..=3 {
        assert_eq!(sim.live_set(observer), BTreeSet::from([1, 2, 3]));
    }
    sim.start(identity(4, 100, "d"), &[2]);
    sim.run_until(6_000);
    for observer in 1..=4 {
        assert_eq!(
            sim.live_set(observer),
            BTreeSet::from([1, 2, 3, 4]),
            "observer {observer}"
        );
        let four = sim.view(observer).get(4).unwrap();
        assert_eq!(four.attributes["zone"], "d");
    }
}

/// The sealed_swim flake: broker 2 (seed: 1) was reached by broker 3
/// (seed: 2) before its first seed tick, knew a member, and never
/// announced to 1; 2 and 3 formed a cluster of their own beside 1.
#[test]
fn a_broker_reached_first_by_a_newer_one_still_joins_its_seeds_cluster() {
    let mut sim = Sim::new();
    sim.start(identity(1, 100, "a"), &[]);
    sim.start_quietly(identity(2, 100, "b"), &[1]);
    sim.start(identity(3, 100, "c"), &[2]);
    sim.run_until(150);
    assert_eq!(sim.live_set(2), BTreeSet::from([2, 3]), "3 reached 2 first");
    sim.run_until(200 * SEED_RETRY_CONNECTED_TICKS + 2_000);
    for observer in 1..=3 {
        assert_eq!(
            sim.live_set(observer),
            BTreeSet::from([1, 2, 3]),
            "observer {observer}"
        );
    }
}

#[test]
fn a_connected_broker_announces_only_to_seeds_it_does_not_see_and_only_now_and_then() {
    let sim = three_node_cluster();
    let core = &sim.nodes[&1].core;
    let stranger = addr(9);
    let seeds = [addr(1), addr(2), stranger];
    assert_eq!(core.seeds_to_announce(&seeds, 0), vec![stranger]);
    for tick in 1..SEED_RETRY_CONNECTED_TICKS {
        assert!(
            core.seeds_to_announce(&seeds, tick).is_empty(),
            "tick {tick}"
        );
    }
    assert_eq!(
        core.seeds_to_announce(&seeds, SEED_RETRY_CONNECTED_TICKS),
        vec![stranger]
    );
    let mut alone = Sim::new();
    alone.start(identity(5, 1, "e"), &[]);
    let lonely = &alone.nodes[&5].core;
    for tick in 0..3 {
        assert_eq!(
            lonely.seeds_to_announce(&[addr(5), stranger], tick),
            vec![stranger],
            "alone: every tick, never to itself"
        );
    }
}

#[test]
fn a_paused_broker_is_suspected_then_declared_dead_then_rejoins_when_resumed() {
    let mut sim = three_node_cluster();
    let paused_at = sim.now_ms;
    sim.pause(3);
    sim.run_until(paused_at + 20 * PROBE_MS + SUSPECT_MS);
    for observer in [1, 2] {
        assert_eq!(sim.state_of(observer, 3), Some(MemberState::Dead));
        let events = sim.events_about(observer, 3);
        let suspect = events
            .iter()
            .find(|(t, k)| *t >= paused_at && *k == MemberEventKind::Suspect)
            .map(|(t, _)| *t)
            .expect("suspected before dead");
        let dead = events
            .iter()
            .find(|(t, k)| *t >= paused_at && *k == MemberEventKind::Dead)
            .map(|(t, _)| *t)
            .expect("declared dead");
        assert!(suspect < dead, "{events:?}");
        // Death follows suspicion after the configured suspect timeout
        // (give or take the probe that carried the news).
        assert!(dead - suspect >= SUSPECT_MS - PROBE_MS, "{events:?}");
    }
    let before = sim.view(1).peers[&3].incarnation;
    let resumed_at = sim.now_ms;
    sim.resume(3);
    sim.run_until(resumed_at + 30 * PROBE_MS);
    for observer in [1, 2] {
        let three = &sim.view(observer).peers[&3];
        assert_eq!(three.state, MemberState::Alive, "observer {observer}");
        assert!(three.incarnation > before, "rejoined as a new incarnation");
    }
    assert_eq!(sim.live_set(3), BTreeSet::from([1, 2, 3]));
}

#[test]
fn a_briefly_paused_broker_refutes_the_suspicion_and_ends_alive() {
    let mut sim = three_node_cluster();
    let paused_at = sim.now_ms;
    sim.pause(3);
    // Run until someone suspects it, then resume well before the timeout.
    let mut t = paused_at;
    while sim.state_of(1, 3) != Some(MemberState::Suspect)
        && sim.state_of(2, 3) != Some(MemberState::Suspect)
    {
        t += 10;
        assert!(t < paused_at + 20 * PROBE_MS, "never suspected");
        sim.run_until(t);
    }
    sim.resume(3);
    sim.run_until(t + SUSPECT_MS * 3);
    for observer in [1, 2] {
        let three = &sim.view(observer).peers[&3];
        assert_eq!(three.state, MemberState::Alive);
        // It answered while suspected, so it was seen alive again before any
        // suspect timeout ran out. (foca may still declare the old identity
        // down when that timer fires, as it only compares incarnations; the
        // broker then rejoins as a new incarnation, which is also alive.)
        let events = sim.events_about(observer, 3);
        let suspect = events
            .iter()
            .position(|(_, k)| *k == MemberEventKind::Suspect)
            .expect("suspected");
        let (alive_at, _) = events[suspect + 1..]
            .iter()
            .find(|(_, k)| matches!(k, MemberEventKind::Alive | MemberEventKind::Restarted))
            .expect("alive again");
        assert!(*alive_at < events[suspect].0 + SUSPECT_MS, "{events:?}");
    }
}

#[test]
fn a_restarted_broker_rejoins_as_itself_with_its_new_attributes() {
    let mut sim = three_node_cluster();
    sim.restart(identity(2, 101, "b2"), &[1]);
    let t = sim.now_ms;
    sim.run_until(t + 3_000);
    for observer in [1, 3] {
        let two = &sim.view(observer).peers[&2];
        assert_eq!(two.state, MemberState::Alive);
        assert_eq!(two.incarnation, 101);
        assert_eq!(two.attributes["zone"], "b2");
        assert!(
            sim.events_about(observer, 2)
                .iter()
                .any(|(_, k)| *k == MemberEventKind::Restarted)
        );
    }
    assert_eq!(sim.live_set(2), BTreeSet::from([1, 2, 3]));
}

#[test]
fn routing_hints_reach_every_member_including_one_that_joins_later() {
    let mut sim = three_node_cluster();
    let leaders = vec![VnodeLeader { vnode: 5, term: 2 }];
    sim.nodes
        .get_mut(&1)
        .unwrap()
        .core
        .set_routing(9, leaders.clone())
        .unwrap();
    sim.flush(1);
    let t = sim.now_ms;
    sim.run_until(t + 2_000);
    for observer in [2, 3] {
        let one = &sim.view(observer).peers[&1];
        assert_eq!((one.ring_version, &one.vnodes_led), (9, &leaders));
    }
    sim.start(identity(4, 100, "d"), &[3]);
    sim.run_until(t + 6_000);
    let one = &sim.view(4).peers[&1];
    assert_eq!((one.ring_version, &one.vnodes_led), (9, &leaders));
}

#[test]
fn changed_attributes_reach_every_member_with_the_routing_intact() {
    let mut sim = three_node_cluster();
    let leaders = vec![VnodeLeader { vnode: 3, term: 4 }];
    let node = sim.nodes.get_mut(&1).unwrap();
    node.core.set_routing(7, leaders.clone()).unwrap();
    let before = node.core.identity().incarnation;
    let attributes: BTreeMap<String, String> = [
        ("zone".to_owned(), "a".to_owned()),
        ("malachi.cluster".to_owned(), "c:1".to_owned()),
    ]
    .into();
    node.core.set_attributes(attributes.clone()).unwrap();
    assert_eq!(node.core.identity().incarnation, before + 1);
    assert_eq!(node.core.view().local.attributes, attributes);
    // The same attributes again change nothing.
    node.core.set_attributes(attributes.clone()).unwrap();
    assert_eq!(node.core.identity().incarnation, before + 1);
    sim.flush(1);
    let t = sim.now_ms;
    sim.run_until(t + 3_000);
    for observer in [2, 3] {
        let one = &sim.view(observer).peers[&1];
        assert_eq!(one.state, MemberState::Alive);
        assert_eq!(one.attributes, attributes);
        assert_eq!((one.ring_version, &one.vnodes_led), (7, &leaders));
    }
    assert_eq!(sim.live_set(1), BTreeSet::from([1, 2, 3]));
}

#[test]
fn garbage_datagrams_are_dropped_without_changing_the_view() {
    let mut sim = three_node_cluster();
    let before = sim.view(1).clone();
    let node = sim.nodes.get_mut(&1).unwrap();
    for garbage in [&b""[..], &[0u8; 3][..], &[0xff; 200][..], &[1u8; 1400][..]] {
        let _ = node.core.handle_data(garbage);
    }
    assert_eq!(sim.view(1), &before);
}
