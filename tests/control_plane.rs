//! The control plane across broker processes (issue 6): three brokers on
//! loopback share 16 metadata vnodes, each an openraft group on all three.
//! Any broker answers any metadata request; the records of a topic live on
//! one broker, and the others point clients to it; killing the leader of a
//! vnode loses nothing acknowledged, and metadata operations resume through
//! the survivors once a new leader is elected; a killed broker restarts on a
//! new raft port and carries quorum again.
//!
//! Timers are short (a config file sets them), and every wait polls with a
//! deadline. The tests run one at a time: two clusters at once on a 2-core
//! machine starve each other's heartbeats.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Output;
use std::sync::Mutex;
use std::time::Duration;

use common::cluster::{Cluster, ClusterNode, logs, wait_for_coordinators};
use common::{err, malachi, ok, out};
use malachi_testkit::wait::Wait;
use serde_json::Value;

/// Generous liveness bounds: the machine is shared and noisy.
const CONVERGE: Duration = Duration::from_secs(60);
/// The vnode count the brokers run (the default for a cluster).
const VNODES: u64 = 16;
/// Bits of a range or segment id below its vnode's id block (ADR 0080).
const ID_BLOCK_BITS: u32 = 40;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One broker of the test cluster, as a child process.
type Node = ClusterNode;

/// Three brokers of one metadata cluster, each given the others as seeds.
fn three(root: &Path) -> Vec<Node> {
    Cluster::three(root).nodes
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A wait until `what` within the liveness bound, checking every 100 ms,
/// failing with the brokers' logs.
fn converge<'a>(what: &str, nodes: &'a [Node]) -> Wait<'a> {
    Wait::new(what, CONVERGE, Duration::from_millis(100)).context(move || logs(nodes))
}

/// Runs `malachi ARGS` against `broker` until it succeeds or the deadline
/// passes.
fn until_ok(nodes: &[Node], broker: &str, args: &[&str], stdin: &str) -> Output {
    let what = format!("`malachi {}` via {broker} succeeds", args.join(" "));
    converge(&what, nodes).until_blocking(|| {
        let output = malachi(broker, args, stdin);
        if output.status.success() {
            Ok(output)
        } else {
            Err(err(&output))
        }
    })
}

/// Creates `topic` through `broker`, retrying while the cluster is not
/// ready. A retry that finds the topic already there means an earlier
/// attempt was applied (its answer was lost), which is success.
fn create(nodes: &[Node], broker: &str, topic: &str) {
    let mut attempt = 0;
    converge(&format!("{topic} is created via {broker}"), nodes).until_blocking(|| {
        attempt += 1;
        let output = malachi(broker, &["topic", "create", topic], "");
        let stderr = err(&output);
        if output.status.success() || (attempt > 1 && stderr.contains("exists")) {
            Ok(())
        } else {
            Err(stderr)
        }
    });
}

/// `topic describe --json` of `topic` through `broker`.
/// The metadata a broker describes for `topic`: the live figures of each
/// segment (its committed end and each copy's end and status, which change
/// as brokers come and go) are left out, so descriptions compare as
/// metadata.
fn describe(nodes: &[Node], broker: &str, topic: &str) -> Value {
    let output = until_ok(nodes, broker, &["topic", "describe", topic, "--json"], "");
    let mut described: Value = serde_json::from_str(out(&output).trim()).unwrap();
    for range in described["ranges"].as_array_mut().into_iter().flatten() {
        for segment in range["segments"].as_array_mut().into_iter().flatten() {
            if let Some(segment) = segment.as_object_mut() {
                segment.remove("committed_end");
                segment.remove("copies");
            }
        }
    }
    described
}

/// `now` describes the topic `before` did, except that a segment led by
/// `dead` may be sealed now, followed in its range by segments on brokers
/// other than `dead`.
fn assert_same_but_failed_over(before: &Value, now: &Value, dead: u64, what: &str) {
    let ranges = |v: &Value| v["ranges"].as_array().cloned().unwrap_or_default();
    let (was, is) = (ranges(before), ranges(now));
    assert_eq!(was.len(), is.len(), "{what}: ranges changed");
    for (old, new) in was.iter().zip(&is) {
        assert_eq!(old["id"], new["id"], "{what}");
        let old_segments = old["segments"].as_array().cloned().unwrap_or_default();
        let new_segments = new["segments"].as_array().cloned().unwrap_or_default();
        assert!(
            new_segments.len() >= old_segments.len(),
            "{what}: segments lost"
        );
        for (a, b) in old_segments.iter().zip(&new_segments) {
            let led_by_dead = a["replicas"][0].as_u64() == Some(dead);
            if a == b {
                continue;
            }
            assert!(
                led_by_dead,
                "{what}: segment {} changed: {a} -> {b}",
                a["id"]
            );
            assert_eq!(a["id"], b["id"], "{what}");
            assert_eq!(b["state"], "sealed", "{what}: {b}");
        }
        for extra in &new_segments[old_segments.len()..] {
            let replicas = extra["replicas"].as_array().cloned().unwrap_or_default();
            assert!(
                !replicas.iter().any(|n| n.as_u64() == Some(dead)),
                "{what}: a successor on the dead broker: {extra}"
            );
        }
    }
}

/// The names `topic list --json` shows through `broker`.
fn list(nodes: &[Node], broker: &str) -> BTreeSet<String> {
    let output = until_ok(nodes, broker, &["topic", "list", "--json"], "");
    json_lines(&out(&output))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The vnode a described topic lives in: its range ids come from its
/// vnode's id block.
fn vnode_of(description: &Value) -> u64 {
    description["ranges"][0]["id"].as_u64().unwrap() >> ID_BLOCK_BITS
}

/// `cluster status --json` through `broker`: node id to its `vnodes_led`.
fn leaders(broker: &str) -> BTreeMap<u64, BTreeSet<u64>> {
    let output = malachi(broker, &["cluster", "status", "--json"], "");
    if !output.status.success() {
        return BTreeMap::new();
    }
    json_lines(&out(&output))
        .iter()
        .filter(|b| b["state"] == "alive")
        .map(|b| {
            let led = b["vnodes_led"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            (b["node_id"].as_u64().unwrap(), led)
        })
        .collect()
}

/// Waits until, as `observer` sees it, exactly one broker among `alive`
/// leads `vnode`, and returns it.
fn leader_of(nodes: &[Node], observer: &str, vnode: u64, alive: &[u64]) -> u64 {
    let what = format!("exactly one broker among {alive:?} leads vnode {vnode}");
    converge(&what, nodes).until_blocking(|| {
        let led = leaders(observer);
        let holders: Vec<u64> = led
            .iter()
            .filter(|(id, vnodes)| alive.contains(id) && vnodes.contains(&vnode))
            .map(|(id, _)| *id)
            .collect();
        if holders.len() == 1 {
            Ok(holders[0])
        } else {
            Err(led)
        }
    })
}

/// Every actor of `broker`'s tree (`tree --json`): name to restarts.
fn tree_restarts(broker: &str) -> BTreeMap<String, u64> {
    fn walk(value: &Value, out: &mut BTreeMap<String, u64>) {
        match value {
            Value::Object(map) => {
                if let (Some(Value::String(name)), Some(restarts)) =
                    (map.get("name"), map.get("restarts").and_then(Value::as_u64))
                {
                    out.insert(name.clone(), restarts);
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let json = out(&ok(malachi(broker, &["tree", "--json"], "")));
    let mut actors = BTreeMap::new();
    walk(&serde_json::from_str(json.trim()).unwrap(), &mut actors);
    actors
}

#[test]
fn topics_created_through_any_broker_are_described_identically_through_every_other() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path());
    let topics: Vec<String> = (0..30).map(|i| format!("cp-{i:02}")).collect();
    for (i, topic) in topics.iter().enumerate() {
        create(&nodes, &nodes[i % 3].client, topic);
    }

    let mut vnodes = BTreeSet::new();
    for topic in &topics {
        let seen: Vec<Value> = nodes
            .iter()
            .map(|n| describe(&nodes, &n.client, topic))
            .collect();
        assert_eq!(seen[0]["name"], topic.as_str());
        assert_eq!(seen[0], seen[1], "{topic}: brokers 1 and 2 disagree");
        assert_eq!(seen[0], seen[2], "{topic}: brokers 1 and 3 disagree");
        vnodes.insert(vnode_of(&seen[0]));
    }
    // The topics are sharded: 30 names over 16 vnodes touch many of them.
    assert!(
        vnodes.len() >= 8 && vnodes.iter().all(|v| *v < VNODES),
        "{vnodes:?}"
    );

    // A list merges every vnode, identically through every broker.
    let expected: BTreeSet<String> = topics.iter().cloned().collect();
    for node in &nodes {
        assert_eq!(list(&nodes, &node.client), expected, "via {}", node.client);
    }

    // Every vnode has exactly one leader, and they are published.
    for vnode in 0..VNODES {
        leader_of(&nodes, &nodes[0].client, vnode, &[1, 2, 3]);
    }

    // `malachi tree` shows each broker's vnodes actor, its coordinator
    // manager, and one coordinator per vnode it leads: 16 over the three.
    wait_for_coordinators(&nodes, VNODES);
    for node in &nodes {
        let tree = out(&ok(malachi(&node.client, &["tree"], "")));
        for name in ["vnodes", "coordinator_manager", "manager"] {
            assert!(tree.contains(name), "{name} missing:\n{tree}");
        }
    }
}

#[test]
fn records_produced_through_any_broker_reach_the_broker_hosting_the_topic() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path());
    create(&nodes, &nodes[1].client, "cp-records");
    // Produce through the other two brokers: a broker that does not host
    // the topic answers not_leader with the host's address, which the
    // client follows.
    until_ok(
        &nodes,
        &nodes[0].client,
        &["produce", "cp-records"],
        "a\t1\nb\t2\n",
    );
    until_ok(
        &nodes,
        &nodes[2].client,
        &["produce", "cp-records"],
        "a\t3\n",
    );
    for node in &nodes {
        let consumed = ok(malachi(
            &node.client,
            &["consume", "cp-records", "--from-start"],
            "",
        ));
        let mut lines: Vec<String> = out(&consumed).lines().map(str::to_owned).collect();
        lines.sort();
        assert_eq!(lines, ["a\t1", "a\t3", "b\t2"], "via {}", node.client);
    }
}

#[test]
fn killing_a_vnode_leader_loses_nothing_acknowledged_and_the_survivors_carry_on() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path());
    let topics: Vec<String> = (0..12).map(|i| format!("kill-{i:02}")).collect();
    for (i, topic) in topics.iter().enumerate() {
        create(&nodes, &nodes[i % 3].client, topic);
    }
    let before: BTreeMap<String, Value> = topics
        .iter()
        .map(|t| (t.clone(), describe(&nodes, &nodes[0].client, t)))
        .collect();

    // The leader of the first topic's vnode is killed without warning.
    let chosen = &topics[0];
    let vnode = vnode_of(&before[chosen]);
    let leader = leader_of(&nodes, &nodes[0].client, vnode, &[1, 2, 3]);
    let victim = nodes.iter().position(|n| n.node_id == leader).unwrap();
    nodes[victim].kill9();
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    let observer = nodes
        .iter()
        .find(|n| n.node_id != leader)
        .unwrap()
        .client
        .clone();

    // A survivor takes the vnode over.
    let successor = leader_of(&nodes, &observer, vnode, &survivors);
    assert_ne!(successor, leader);
    // Its coordinator manager started the vnode's coordinator without
    // restarting anything: the takeover is a start, not a recovery.
    let successor_client = &nodes
        .iter()
        .find(|n| n.node_id == successor)
        .unwrap()
        .client;
    let actors = tree_restarts(successor_client);
    assert!(
        actors.contains_key(&format!("coordinator/{vnode}")),
        "{actors:?}"
    );
    for (name, restarts) in &actors {
        if name == "metadata" || name == "vnodes" || name.starts_with("coordinator") {
            assert_eq!(*restarts, 0, "{name} restarted: {actors:?}");
        }
    }

    // Every acknowledged topic is still there, described as before through
    // each survivor, but for failover (ADR 0106): a segment the dead broker
    // led may have been sealed and followed by a successor on the live
    // brokers.
    for node in nodes.iter().filter(|n| n.node_id != leader) {
        for (topic, described) in &before {
            let now = describe(&nodes, &node.client, topic);
            assert_same_but_failed_over(
                described,
                &now,
                leader,
                &format!("{topic} via node {}", node.node_id),
            );
        }
    }

    // Metadata operations resume: topics are created through the survivors
    // until one lands in the taken-over vnode (1 in 16 names does).
    let mut created = Vec::new();
    let mut in_vnode = 0;
    let survivors_clients: Vec<String> = nodes
        .iter()
        .filter(|n| n.node_id != leader)
        .map(|n| n.client.clone())
        .collect();
    for i in 0..200 {
        let via = &survivors_clients[i % 2];
        let topic = format!("after-{i:03}");
        create(&nodes, via, &topic);
        let described = describe(&nodes, &survivors_clients[(i + 1) % 2], &topic);
        created.push(topic);
        if vnode_of(&described) == vnode {
            in_vnode += 1;
            if in_vnode == 2 {
                break;
            }
        }
    }
    assert_eq!(in_vnode, 2, "no creation landed in vnode {vnode}");
    for node in nodes.iter().filter(|n| n.node_id != leader) {
        let listed = list(&nodes, &node.client);
        for topic in topics.iter().chain(&created) {
            assert!(
                listed.contains(topic),
                "{topic} missing via {}",
                node.client
            );
        }
    }
}

#[test]
fn a_killed_broker_restarts_on_a_new_raft_port_catches_up_and_carries_quorum() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path());
    let before: Vec<String> = (0..6).map(|i| format!("early-{i}")).collect();
    for (i, topic) in before.iter().enumerate() {
        create(&nodes, &nodes[i % 3].client, topic);
    }
    // Broker 1 is killed; topics are created while it is away.
    nodes[0].kill9();
    let during: Vec<String> = (0..6).map(|i| format!("during-{i}")).collect();
    for (i, topic) in during.iter().enumerate() {
        create(&nodes, &nodes[1 + i % 2].client, topic);
    }

    // It comes back with a new raft port (port 0), which the others learn
    // from membership. A topic it created before the kill, whose records it
    // hosts, takes records again through another broker, which points the
    // client to it.
    let seeds = vec![nodes[1].client.clone(), nodes[2].client.clone()];
    nodes[0].start(&seeds);
    let hosted = &before[0];
    until_ok(&nodes, &nodes[1].client, &["produce", hosted], "k\tback\n");
    let consumed = until_ok(
        &nodes,
        &nodes[2].client,
        &["consume", hosted, "--from-start"],
        "",
    );
    assert_eq!(out(&consumed), "k\tback\n");

    // With broker 2 killed, every vnode's quorum needs broker 1: its
    // replicas must be reachable on the new port and caught up.
    nodes[1].kill9();
    create(&nodes, &nodes[0].client, "after-second-kill");
    for via in [&nodes[0].client, &nodes[2].client] {
        let listed = list(&nodes, via);
        for topic in before.iter().chain(&during) {
            assert!(
                listed.contains(topic),
                "{topic} missing via {via}: {listed:?}"
            );
        }
        assert!(listed.contains("after-second-kill"), "via {via}");
    }
}
