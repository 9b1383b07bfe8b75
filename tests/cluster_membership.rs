//! Several brokers as real processes on loopback: they form one cluster from
//! seeds alone (`--bootstrap-expect 3`) that shares its metadata, refuse a
//! broker that would be alone among them, take a fourth that joins and
//! let a decommissioned one go, detect a paused broker (suspect, then
//! dead) and take it back,
//! take back a killed and restarted broker as itself, and gather every
//! broker's supervision tree.
//!
//! SWIM runs with short timers here (a config file sets them), so each test
//! takes seconds. The tests run one at a time: two clusters at once on a
//! 2-core machine starve each other's probes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{bin, free_port, malachi, ok, out, spawn_until_serving};
use malachi_testkit::wait::Wait;
use serde_json::Value;

/// SWIM timers of these tests (milliseconds).
const PROBE_PERIOD_MS: u64 = 200;
const SUSPECT_TIMEOUT_MS: u64 = 2_000;
/// Liveness bounds: generous, because the machine is shared and noisy.
const CONVERGE: Duration = Duration::from_secs(30);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// One broker of a test cluster, as a child process.
struct Node {
    node_id: u64,
    client: String,
    admin: String,
    data_dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn new(root: &Path, node_id: u64) -> Node {
        let config = root.join(format!("node-{node_id}.toml"));
        std::fs::write(
            &config,
            format!(
                "[membership]\nprobe_period_ms = {PROBE_PERIOD_MS}\nprobe_rtt_ms = 100\n\
                 suspect_timeout_ms = {SUSPECT_TIMEOUT_MS}\nseed_retry_ms = 200\n\
                 remote_call_timeout_ms = 3000\ncluster_cookie = \"test-cookie\"\n"
            ),
        )
        .unwrap();
        Node {
            node_id,
            client: format!("127.0.0.1:{}", free_port()),
            admin: format!("127.0.0.1:{}", free_port()),
            data_dir: root.join(format!("node-{node_id}")),
            config,
            log: root.join(format!("node-{node_id}.log")),
            child: None,
        }
    }

    /// Starts the broker with `seeds` and `attrs` and waits until it serves.
    fn start(&mut self, seeds: &[&Node], attrs: &[&str]) {
        let seeds: Vec<String> = seeds.iter().map(|n| n.client.clone()).collect();
        self.start_with(&seeds, attrs, &[]);
    }

    /// The command that starts this broker with `seeds`, `attrs` and
    /// `extra` flags.
    fn command(&self, seeds: &[String], attrs: &[&str], extra: &[&str]) -> Command {
        let mut command = Command::new(bin());
        command
            .args(["broker", "--node-id", &self.node_id.to_string()])
            .args(["--listen", &self.client, "--admin-listen", &self.admin])
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(extra);
        for seed in seeds {
            command.args(["--seed", seed]);
        }
        for attr in attrs {
            command.args(["--attr", attr]);
        }
        command
            .env("RUST_LOG", "info")
            .env_remove("MALACHI_SEEDS")
            .env_remove("MALACHI_ATTRS")
            .env_remove("MALACHI_BOOTSTRAP_EXPECT");
        command
    }

    /// [`start`](Self::start) with seeds given as addresses and `extra` flags.
    fn start_with(&mut self, seeds: &[String], attrs: &[&str], extra: &[&str]) {
        let command = self.command(seeds, attrs, extra);
        let what = format!("node {}", self.node_id);
        let child = spawn_until_serving(command, &self.log, &what);
        self.child = Some(child);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.as_ref().unwrap().id()).unwrap();
        // SAFETY: kill(2) takes plain integers and touches no memory of ours;
        // the pid is our own child, not yet reaped.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process must be continued to die promptly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `cluster status --json` of `node`: node id to (state, the whole object).
fn status(node: &Node) -> Vec<Value> {
    let output = malachi(&node.client, &["cluster", "status", "--json"], "");
    if !output.status.success() {
        return Vec::new();
    }
    json_lines(&out(&output))
}

fn state_of(statuses: &[Value], node_id: u64) -> Option<String> {
    statuses
        .iter()
        .find(|b| b["node_id"] == node_id)
        .map(|b| b["state"].as_str().unwrap().to_owned())
}

fn entry(statuses: &[Value], node_id: u64) -> Value {
    statuses
        .iter()
        .find(|b| b["node_id"] == node_id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits (bounded) until `check` holds for `observer`'s cluster status.
fn wait_for(observer: &Node, what: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let what = format!("node {} sees {what}", observer.node_id);
    Wait::new(what, CONVERGE, Duration::from_millis(100))
        .context(|| format!("its log:\n{}", observer.log()))
        .until_blocking(|| {
            let statuses = status(observer);
            if check(&statuses) {
                Ok(statuses)
            } else {
                Err(statuses)
            }
        })
}

fn all_alive(ids: &[u64]) -> impl Fn(&[Value]) -> bool + '_ {
    move |statuses| {
        ids.iter()
            .all(|id| state_of(statuses, *id).as_deref() == Some("alive"))
    }
}

/// Three brokers, each given the other two as seeds, forming one cluster
/// with `--bootstrap-expect 3`: started together, since each start waits
/// for the other two.
fn three(root: &Path) -> Vec<Node> {
    let mut nodes: Vec<Node> = (1..=3).map(|id| Node::new(root, id)).collect();
    let clients: Vec<String> = nodes.iter().map(|n| n.client.clone()).collect();
    std::thread::scope(|scope| {
        for node in nodes.iter_mut() {
            let seeds: Vec<String> = clients
                .iter()
                .filter(|c| **c != node.client)
                .cloned()
                .collect();
            scope.spawn(move || {
                let zone = format!("zone=z{}", node.node_id);
                node.start_with(&seeds, &[&zone], &["--bootstrap-expect", "3"]);
            });
        }
    });
    for node in &nodes {
        wait_for(node, "brokers 1, 2 and 3 alive", all_alive(&[1, 2, 3]));
    }
    nodes
}

#[test]
fn three_brokers_form_one_cluster_from_seeds_alone_that_shares_metadata_and_refuse_a_loner() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path());
    for node in &nodes {
        let statuses = wait_for(node, "all three alive", all_alive(&[1, 2, 3]));
        assert_eq!(statuses.len(), 3, "{statuses:?}");
        let one = entry(&statuses, 1);
        assert_eq!(one["attributes"]["zone"], "z1");
        assert_eq!(one["client_addr"], nodes[0].client.as_str());
        // Each broker lists itself first.
        assert_eq!(statuses[0]["node_id"], node.node_id);
    }
    let text = out(&ok(malachi(&nodes[2].client, &["cluster", "status"], "")));
    assert!(text.contains("zone=z1"), "{text}");
    assert_eq!(text.matches("alive").count(), 3, "{text}");

    // One metadata: topics created through broker 1 are listed by broker 3
    // (issue 18 measured 0 of 20 before), and records produced through
    // broker 2 are read through broker 3.
    for i in 0..20 {
        ok(malachi(
            &nodes[0].client,
            &["topic", "create", &format!("shared-{i}")],
            "",
        ));
    }
    let listed = out(&ok(malachi(&nodes[2].client, &["topic", "list"], "")));
    for i in 0..20 {
        assert!(listed.contains(&format!("shared-{i}")), "{listed}");
    }
    ok(malachi(
        &nodes[1].client,
        &["produce", "shared-0"],
        "k\ta\nk\tb\n",
    ));
    let consumed = out(&ok(malachi(
        &nodes[2].client,
        &["consume", "shared-0", "--from-start"],
        "",
    )));
    assert_eq!(consumed, "k\ta\nk\tb\n");

    // Every data dir records the same cluster id.
    let records: Vec<String> = nodes
        .iter()
        .map(|n| std::fs::read_to_string(n.data_dir.join("metadata/cluster-settings")).unwrap())
        .collect();
    assert!(
        records[0].starts_with("nodes=1,2,3 vnodes=16 replicas_per_vnode=3\ncluster_id="),
        "{}",
        records[0]
    );
    assert!(records.iter().all(|r| *r == records[0]), "{records:?}");

    // A broker given seeds that lead to no running cluster is refused once
    // it has looked for one (never alone among others)...
    let lonely = Node::new(dir.path(), 5);
    let mut config = std::fs::read_to_string(&lonely.config).unwrap();
    config.push_str("[cluster]\njoin_timeout_ms = 1500\n");
    std::fs::write(&lonely.config, config).unwrap();
    let nowhere = vec![format!("127.0.0.1:{}", free_port())];
    let refused = lonely.command(&nowhere, &[], &[]).output().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--bootstrap-expect"), "{stderr}");
    assert!(stderr.contains("no running cluster answered"), "{stderr}");
    // ...and so is a fourth bootstrap beside a running cluster that does
    // not include it, naming that cluster and how to join it instead.
    let fourth = Node::new(dir.path(), 4);
    let seeds = vec![nodes[1].client.clone()];
    let refused = fourth
        .command(&seeds, &[], &["--bootstrap-expect", "3"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let cluster_id = records[0].trim().rsplit('=').next().unwrap();
    assert!(stderr.contains(cluster_id), "{stderr}");
    assert!(stderr.contains("nodes [1, 2, 3]"), "{stderr}");
    assert!(stderr.contains("without --bootstrap-expect"), "{stderr}");
}

/// `malachi cluster members --json` through `node`.
fn members(node: &Node) -> Value {
    let output = malachi(&node.client, &["cluster", "members", "--json"], "");
    if !output.status.success() {
        return Value::Null;
    }
    serde_json::from_str(out(&output).trim()).unwrap_or(Value::Null)
}

fn member(members: &Value, node_id: u64) -> Value {
    members["members"]
        .as_array()
        .and_then(|all| all.iter().find(|m| m["node_id"] == node_id).cloned())
        .unwrap_or(Value::Null)
}

/// Waits (bounded) until `check` holds for the members `observer` reports.
fn wait_members(observer: &Node, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let what = format!("node {} sees {what} among the members", observer.node_id);
    Wait::new(what, Duration::from_secs(120), Duration::from_millis(250))
        .context(|| format!("its log:\n{}", observer.log()))
        .until_blocking(|| {
            let members = members(observer);
            if check(&members) {
                Ok(members)
            } else {
                Err(members)
            }
        })
}

#[test]
fn a_fourth_broker_joins_under_metadata_traffic_and_a_decommissioned_one_leaves() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path());
    for i in 0..10 {
        ok(malachi(
            &nodes[0].client,
            &["topic", "create", &format!("before-{i}")],
            "",
        ));
    }

    // Metadata traffic all along, through broker 3: creates, and reads of
    // what exists. Every request must succeed (the CLI's and the router's
    // bounded retries are all it gets).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = nodes[2].client.clone();
    let traffic = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut created = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let topic = format!("during-{created}");
                let made = malachi(&client, &["topic", "create", &topic], "");
                if made.status.success() {
                    created += 1;
                } else {
                    failures.push(format!(
                        "create {topic}: {}",
                        String::from_utf8_lossy(&made.stderr)
                    ));
                }
                let read = malachi(&client, &["topic", "describe", "before-0"], "");
                if !read.status.success() {
                    failures.push(format!(
                        "describe: {}",
                        String::from_utf8_lossy(&read.stderr)
                    ));
                }
            }
            (created, failures)
        })
    };

    // Broker 4 joins with one live seed and no other setting.
    let mut fourth = Node::new(dir.path(), 4);
    fourth.start_with(&[nodes[1].client.clone()], &["zone=z4"], &[]);
    let settled = |m: &Value| {
        m["groups_moving"] == 0
            && m["groups_unreachable"] == 0
            && member(m, 4)["state"] == "active"
            && member(m, 4)["vnode_replicas"].as_u64().unwrap_or(0) > 0
    };
    let joined = wait_members(&nodes[0], "broker 4 holding its share", settled);
    // The groups are 16 vnodes and the ring's own, 3 replicas each, so
    // 51 replicas over 4 brokers: each holds some, none all.
    let held: Vec<u64> = (1..=4)
        .map(|n| member(&joined, n)["vnode_replicas"].as_u64().unwrap())
        .collect();
    assert_eq!(held.iter().sum::<u64>(), 51, "{joined}");
    assert!(held.iter().all(|h| (6..=17).contains(h)), "{joined}");
    let record =
        std::fs::read_to_string(fourth.data_dir.join("metadata/cluster-settings")).unwrap();
    assert!(
        record.starts_with("nodes=1,2,3 vnodes=16 replicas_per_vnode=3\ncluster_id="),
        "{record}"
    );
    assert!(record.ends_with("joined=true\n"), "{record}");

    // Broker 4 serves every topic, and records produced through it are read
    // through broker 1.
    let listed = out(&ok(malachi(&fourth.client, &["topic", "list"], "")));
    for i in 0..10 {
        assert!(listed.contains(&format!("before-{i}")), "{listed}");
    }
    ok(malachi(
        &fourth.client,
        &["produce", "before-1"],
        "k\ta\nk\tb\n",
    ));
    let consumed = out(&ok(malachi(
        &nodes[0].client,
        &["consume", "before-1", "--from-start"],
        "",
    )));
    assert_eq!(consumed, "k\ta\nk\tb\n");

    stop.store(true, std::sync::atomic::Ordering::Release);
    let (created, failures) = traffic.join().unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(created > 0);

    // Decommission broker 1 through broker 2: the CLI waits until nothing
    // is left on it, and says it may stop.
    let text = out(&ok(malachi(
        &nodes[1].client,
        &["broker", "decommission", "1"],
        "",
    )));
    // It held segment copies: the CLI waited until they had moved (ADR
    // 0112) and then says it may stop.
    assert!(
        text.contains(
            "node 1 holds no vnode replicas and takes no new segment copies: it may stop"
        ),
        "{text}"
    );
    let after = members(&nodes[1]);
    assert_eq!(member(&after, 1)["state"], "decommissioned", "{after}");
    assert_eq!(member(&after, 1)["vnode_replicas"], 0, "{after}");
    // Decommissioning another would leave two brokers for three replicas.
    let refused = malachi(&nodes[1].client, &["broker", "decommission", "2"], "");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("fewer than"), "{stderr}");

    // Its segment copies moved (ADR 0112): the topic produced to through
    // broker 4 names broker 1 in no segment, and reads back whole.
    Wait::new(
        "before-1 to name broker 1 in no segment",
        Duration::from_secs(120),
        Duration::from_millis(250),
    )
    .until_blocking(|| {
        let described: Value = serde_json::from_str(&out(&ok(malachi(
            &nodes[1].client,
            &["topic", "describe", "before-1", "--json"],
            "",
        ))))
        .unwrap();
        let names_one = described["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["segments"].as_array().unwrap().iter())
            .any(|s| {
                s["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n.as_u64() == Some(1))
            });
        if names_one {
            Err(described.to_string())
        } else {
            Ok(())
        }
    });
    let consumed = out(&ok(malachi(
        &nodes[2].client,
        &["consume", "before-1", "--from-start"],
        "",
    )));
    assert_eq!(consumed, "k\ta\nk\tb\n");

    // Broker 1 stops; the cluster carries on without it.
    nodes[0].signal(libc::SIGTERM);
    let _ = nodes[0].child.take().unwrap().wait();
    for i in 0..5 {
        ok(malachi(
            &fourth.client,
            &["topic", "create", &format!("after-{i}")],
            "",
        ));
    }
    let listed = out(&ok(malachi(&nodes[2].client, &["topic", "list"], "")));
    assert!(
        listed.contains("after-4") && listed.contains("during-0"),
        "{listed}"
    );

    // Broker 4, killed and restarted with no flag but its seed, is itself
    // again: its data dir records that it joined.
    fourth.kill9();
    fourth.start_with(&[nodes[1].client.clone()], &["zone=z4"], &[]);
    let listed = out(&ok(malachi(&fourth.client, &["topic", "list"], "")));
    assert!(listed.contains("after-4"), "{listed}");
}

#[test]
fn a_stopped_broker_is_suspected_then_declared_dead_and_is_alive_again_after_sigcont() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path());
    let stopped_at = Instant::now();
    nodes[2].signal(libc::SIGSTOP);
    let mut seen_suspect = None;
    let dead_at = Wait::new(
        "node 3 declared dead",
        CONVERGE.saturating_sub(stopped_at.elapsed()),
        Duration::from_millis(50),
    )
    .until_blocking(|| {
        let statuses = status(&nodes[0]);
        match state_of(&statuses, 3).as_deref() {
            Some("suspect") => {
                seen_suspect.get_or_insert_with(Instant::now);
                Err(format!("{statuses:?}"))
            }
            Some("dead") => Ok(Instant::now()),
            _ => Err(format!("{statuses:?}")),
        }
    });
    let suspect_at = seen_suspect.expect("node 3 was suspected before it was declared dead");
    // Dead comes no sooner than the configured suspect timeout after
    // suspicion began (it began at or before we first saw it).
    assert!(
        dead_at.duration_since(stopped_at) >= Duration::from_millis(SUSPECT_TIMEOUT_MS),
        "declared dead {:?} after SIGSTOP, before the suspect timeout",
        dead_at.duration_since(stopped_at)
    );
    assert!(suspect_at < dead_at);
    wait_for(&nodes[1], "node 3 dead", |s| {
        state_of(s, 3).as_deref() == Some("dead")
    });
    let incarnation_before = entry(&status(&nodes[0]), 3)["incarnation"]
        .as_u64()
        .unwrap();

    nodes[2].signal(libc::SIGCONT);
    for node in &nodes {
        wait_for(node, "all three alive again", all_alive(&[1, 2, 3]));
    }
    let three_now = entry(&status(&nodes[0]), 3);
    assert!(three_now["incarnation"].as_u64().unwrap() > incarnation_before);
    assert_eq!(three_now["attributes"]["zone"], "z3");
}

#[test]
fn a_killed_broker_restarted_with_its_node_id_rejoins_with_its_data_and_new_attributes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path());
    ok(malachi(&nodes[1].client, &["topic", "create", "kept"], ""));
    ok(malachi(
        &nodes[1].client,
        &["produce", "kept"],
        "k\tv1\nk\tv2\n",
    ));
    let before = entry(&status(&nodes[0]), 2)["incarnation"]
        .as_u64()
        .unwrap();

    nodes[1].kill9();
    let seeds: Vec<&Node> = vec![&nodes[0]];
    let mut restarted = Node {
        node_id: 2,
        client: nodes[1].client.clone(),
        admin: nodes[1].admin.clone(),
        data_dir: nodes[1].data_dir.clone(),
        config: nodes[1].config.clone(),
        log: nodes[1].log.clone(),
        child: None,
    };
    restarted.start(&seeds, &["zone=z2", "rack=moved"]);
    for node in [&nodes[0], &restarted, &nodes[2]] {
        let statuses = wait_for(node, "node 2 back with its new attributes", |s| {
            let two = entry(s, 2);
            // The restarted broker sees itself at once and its peers a
            // moment later: wait for all three, not only for itself.
            two["state"] == "alive"
                && two["attributes"]["rack"] == "moved"
                && two["incarnation"].as_u64().is_some_and(|i| i > before)
                && all_alive(&[1, 2, 3])(s)
        });
        assert!(all_alive(&[1, 2, 3])(&statuses), "{statuses:?}");
    }
    let topics = out(&ok(malachi(&restarted.client, &["topic", "list"], "")));
    assert!(topics.contains("kept"), "{topics}");
    let consumed = out(&ok(malachi(
        &restarted.client,
        &["consume", "kept", "--from-start"],
        "",
    )));
    assert_eq!(consumed, "k\tv1\nk\tv2\n");
}

#[test]
fn tree_all_shows_every_broker_and_reports_a_killed_one_unreachable_without_failing() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path());
    // The node fabric connects once membership has spread the addresses.
    let trees = Wait::new("three trees", CONVERGE, Duration::from_millis(200))
        .context(|| nodes[0].log())
        .until_blocking(|| {
            let output = ok(malachi(&nodes[0].client, &["tree", "--all", "--json"], ""));
            let trees = json_lines(&out(&output));
            if trees.len() == 3 && trees.iter().all(|t| t["root"].is_object()) {
                Ok(trees)
            } else {
                Err(trees)
            }
        });
    for (tree, id) in trees.iter().zip([1u64, 2, 3]) {
        assert_eq!(tree["node_id"], id);
        assert_eq!(tree["root"]["name"], "broker");
        let children: Vec<&str> = tree["root"]["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert!(children.contains(&"membership"), "{children:?}");
    }
    let text = out(&ok(malachi(&nodes[0].client, &["tree", "--all"], "")));
    for id in 1..=3 {
        assert!(text.contains(&format!("== node {id} ")), "{text}");
    }
    assert!(text.contains("3 of 3 brokers answered"), "{text}");

    nodes[2].kill9();
    let output = malachi(&nodes[0].client, &["tree", "--all", "--json"], "");
    assert!(output.status.success(), "exit {:?}", output.status.code());
    let trees = json_lines(&out(&output));
    assert_eq!(trees.len(), 3, "{trees:?}");
    assert!(trees[0]["root"].is_object() && trees[1]["root"].is_object());
    assert!(trees[2]["root"].is_null(), "{:?}", trees[2]);
    assert!(trees[2]["unreachable"].is_string(), "{:?}", trees[2]);
    let text = out(&ok(malachi(&nodes[1].client, &["tree", "--all"], "")));
    assert!(text.contains("== node 3 "), "{text}");
    assert!(text.contains("unreachable"), "{text}");
    assert!(text.contains("2 of 3 brokers answered"), "{text}");
}
