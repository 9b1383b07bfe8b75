//! SWIM over real UDP sockets with sealed datagrams (ADR 0147): brokers
//! with one cookie find each other; a broker with another cookie, or one
//! that sends plain datagrams, is never seen by a broker that requires
//! sealing; the rolling steps (`accept`, `send`) talk to both sides.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use malachi_membership::seal::{SealMode, SealSettings, SwimKey};
use malachi_membership::{Membership, NodeIdentity, RuntimeArgs, SwimSettings, runtime};

struct Node {
    membership: Membership,
    task: tokio::task::JoinHandle<()>,
    addr: SocketAddr,
}

fn settings() -> SwimSettings {
    SwimSettings {
        probe_period_ms: 100,
        probe_rtt_ms: 50,
        suspect_timeout_ms: 600,
        seed_retry_ms: 100,
        ..SwimSettings::default()
    }
}

async fn start(node_id: u64, cookie: &str, mode: SealMode, seeds: Vec<SocketAddr>) -> Node {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let mut identity = NodeIdentity::seed(addr);
    identity.node_id = node_id;
    identity.incarnation = 1;
    let membership = Membership::new(&identity);
    let args = RuntimeArgs {
        identity,
        settings: settings(),
        seeds,
        rng_seed: node_id,
        seal: SealSettings {
            key: SwimKey::from_cookie(cookie),
            mode,
        },
    };
    let handle = membership.clone();
    let task = tokio::spawn(async move {
        runtime::run(handle, socket, args).await.unwrap();
    });
    Node {
        membership,
        task,
        addr,
    }
}

fn sees(node: &Node, other: u64) -> bool {
    node.membership
        .live_members()
        .iter()
        .any(|m| m.node_id == other)
}

/// Each node's whole view (members, states, incarnations), for a failed
/// assertion's message: the rolling test failed twice under a loaded full
/// suite and passed alone, and its message said nothing of why.
fn views(nodes: &[&Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let view = n.membership.view();
            let members: Vec<String> = view
                .all()
                .map(|m| format!("{}#{}:{}", m.node_id, m.incarnation, m.state.as_str()))
                .collect();
            format!(
                "node {} at {} sees [{}]",
                n.membership.local().node_id,
                n.addr,
                members.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits up to `ms` for `done`.
async fn within(ms: u64, done: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// For `ms`, `never` stays false throughout.
async fn holds_for(ms: u64, never: impl Fn() -> bool) -> bool {
    !within(ms, never).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cookie_forms_a_cluster_and_another_is_never_seen() {
    let one = start(1, "secret", SealMode::Required, vec![]).await;
    let two = start(2, "secret", SealMode::Required, vec![one.addr]).await;
    assert!(within(20_000, || sees(&one, 2) && sees(&two, 1)).await);
    let stranger = start(3, "another secret", SealMode::Required, vec![one.addr]).await;
    let plain = start(4, "secret", SealMode::Off, vec![one.addr]).await;
    assert!(
        holds_for(2_000, || sees(&one, 3)
            || sees(&two, 3)
            || sees(&one, 4)
            || sees(&two, 4)
            || sees(&stranger, 1)
            || sees(&plain, 1))
        .await,
        "a broker without the cookie, or one that sends plain datagrams, is not admitted"
    );
    for node in [one, two, stranger, plain] {
        node.membership.leave();
        let _ = tokio::time::timeout(Duration::from_secs(5), node.task).await;
    }
}

/// Node ids and a cookie of its own: the other test of this binary runs
/// beside it on the same loopback, and a datagram from there (a port freed
/// and bound again) must not name one of these brokers.
const ROLLING_COOKIE: &str = "rolling secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rolling_steps_talk_to_the_side_before_and_after() {
    // Step 1 (`accept`) talks to a broker from before sealing (`off`).
    let old = start(11, ROLLING_COOKIE, SealMode::Off, vec![]).await;
    let step1 = start(12, ROLLING_COOKIE, SealMode::Accept, vec![old.addr]).await;
    assert!(within(20_000, || sees(&old, 12) && sees(&step1, 11)).await);
    // Step 2 begins once no broker from before sealing is left (it could
    // not read a sealed datagram).
    old.membership.leave();
    let _ = tokio::time::timeout(Duration::from_secs(5), old.task).await;
    // Step 2 (`send`) talks to step 1, and to a broker that requires
    // sealing (step 3).
    let step2 = start(13, ROLLING_COOKIE, SealMode::Send, vec![step1.addr]).await;
    let step3 = start(14, ROLLING_COOKIE, SealMode::Required, vec![step2.addr]).await;
    assert!(
        within(20_000, || sees(&step2, 12) && sees(&step1, 13)).await,
        "{}",
        views(&[&step1, &step2, &step3])
    );
    assert!(
        within(20_000, || sees(&step3, 13) && sees(&step2, 14)).await,
        "{}",
        views(&[&step1, &step2, &step3])
    );
    for node in [step1, step2, step3] {
        node.membership.leave();
        let _ = tokio::time::timeout(Duration::from_secs(5), node.task).await;
    }
}
