//! Deadlines and readiness (issue 36, ADR 0126), with broker processes:
//!
//! - `malachi produce --timeout-ms 20000` with two of three brokers
//!   SIGKILLed returns within 21 s, and its error names the part that ran
//!   out (it gave up after 33 s in one run, and had not returned after
//!   60 s in another: the topic's metadata lookup was retried 50 times
//!   against a vnode with no leader, five times over).
//! - Right after every broker answers `/ready`, `topic create
//!   --replication-factor 3` succeeds: a refusal for want of live brokers
//!   is retriable, and the command retries it within its deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_testkit::process as common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, ClusterNode};
use common::keyed::{spawn_malachi, wait_output};
use common::{err, malachi, ok};
use malachi_testkit::wait::{Wait, wait_until_blocking};

/// The status code of GET `path` on an admin port, or 0 if it did not answer.
fn admin_status(admin: &str, path: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(admin) else {
        return 0;
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    if write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return 0;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

#[test]
fn produce_with_two_of_three_brokers_down_keeps_its_deadline_and_names_the_part() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::three_ready(root.path());
    let survivor = cluster.nodes[0].client.clone();
    ok(malachi(&survivor, &["topic", "create", "orders"], ""));
    ok(malachi(&survivor, &["produce", "orders"], "k\tbefore\n"));

    cluster.nodes[1].kill9();
    cluster.nodes[2].kill9();

    let started = Instant::now();
    let output = malachi(
        &survivor,
        &["produce", "orders", "--timeout-ms", "20000"],
        "k\tafter\n",
    );
    let took = started.elapsed();
    let stderr = err(&output);
    eprintln!("produce with two of three brokers down returned after {took:?}: {stderr}");
    assert!(
        took < Duration::from_secs(21),
        "produce --timeout-ms 20000 took {took:?}: {stderr}"
    );
    assert!(
        !output.status.success(),
        "acknowledged without a quorum: {stderr}"
    );
    // The error says what it was waiting for when the deadline passed.
    assert!(
        [
            "metadata lookup",
            "a quorum",
            "the connection to",
            "the answer of",
            "leader"
        ]
        .iter()
        .any(|part| stderr.contains(part)),
        "the error does not name the part that timed out: {stderr}"
    );
    assert!(stderr.contains("20000ms"), "{stderr}");
}

/// Waits until every broker of `cluster` answers `/ready`.
fn wait_all_ready(cluster: &Cluster) {
    for node in &cluster.nodes {
        let what = format!("node {} answers /ready", node.node_id);
        Wait::new(what, Duration::from_secs(60), Duration::from_millis(20))
            .context(|| cluster.logs())
            .until_blocking(|| admin_status(&node.admin, "/ready") == 200);
    }
}

/// `topic create NAME --replication-factor 3` through `broker`.
fn create_three(broker: &str, name: &str) -> std::process::Output {
    malachi(
        broker,
        &[
            "topic",
            "create",
            name,
            "--replication-factor",
            "3",
            "--timeout-ms",
            "20000",
        ],
        "",
    )
}

#[test]
fn a_topic_with_three_copies_is_created_right_after_every_broker_is_ready() {
    let root = tempfile::tempdir().unwrap();
    let cluster = Cluster::three(root.path());
    wait_all_ready(&cluster);
    let output = create_three(&cluster.nodes[0].client, "first");
    assert!(
        output.status.success(),
        "refused right after /ready: {}",
        err(&output)
    );
}

/// The refusal the issue met ("needs 3 live brokers; 2 are live") made
/// deterministic: two of three configured brokers run, `topic create
/// --replication-factor 3` is under way, and the third broker starts. The
/// command retries the retriable refusal and succeeds once the third is
/// live, within its `--timeout-ms`. (It was `invalid_request`, at once.)
#[test]
fn topic_create_waits_within_its_deadline_for_a_broker_not_live_yet() {
    let root = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3];
    let mut nodes: Vec<ClusterNode> = ids
        .iter()
        .map(|id| ClusterNode::new(root.path(), *id, &ids))
        .collect();
    let clients: Vec<String> = nodes.iter().map(|n| n.client.clone()).collect();
    for node in nodes.iter_mut().take(2) {
        let seeds = node.seeds_among(&clients);
        node.start(&seeds);
    }
    let cluster = Cluster { nodes };
    for node in cluster.nodes.iter().take(2) {
        let what = format!("node {} answers /ready", node.node_id);
        wait_until_blocking(
            &what,
            Duration::from_secs(60),
            Duration::from_millis(20),
            || admin_status(&node.admin, "/ready") == 200,
        );
    }
    let create = spawn_malachi(
        &clients[0],
        &[
            "topic",
            "create",
            "orders",
            "--replication-factor",
            "3",
            "--timeout-ms",
            "30000",
        ],
    );
    // The refusal is retried: the command is still running a second later
    // (it used to exit at once with `invalid_request`). An absence, watched
    // for a second: there is no condition to wait on.
    let mut create = create;
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_millis(1_000) {
        if create.try_wait().unwrap().is_some() {
            let output = create.wait_with_output().unwrap();
            panic!(
                "topic create ended while a broker was missing: {}",
                err(&output)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut cluster = cluster;
    let seeds = cluster.nodes[2].seeds_among(&clients);
    cluster.nodes[2].start(&seeds);
    let output = wait_output(create, Duration::from_secs(40));
    assert!(
        output.status.success(),
        "refused while the third broker started: {}\n{}",
        err(&output),
        cluster.logs()
    );
}
