//! The bounds of the admin HTTP port and the node fabric port (issue 15,
//! item 5): a connection limit past which connections are closed at accept
//! while the clients already connected are served, and a deadline that drops
//! a client that never finishes its request head (admin) or its handshake
//! (fabric), however slowly it trickles bytes.
//!
//! Every wait is bounded and generous (the machine is shared and noisy); no
//! test asserts a speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::messages::TreeSnapshotRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connections of a flood.
const FLOOD_CONNECTIONS: usize = 2_000;
/// Flood connections in progress at once (keeps the test's own descriptors
/// and the listen backlog small).
const FLOOD_PARALLEL: usize = 50;
/// How long a refused connection may take to be seen closed.
const CLOSED_WITHIN: Duration = Duration::from_secs(15);

/// How a connection that sends nothing (or trickles) ended up.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// The server closed it (EOF or reset) without sending a byte.
    Closed,
    /// The server sent bytes.
    Answered,
    /// Still open when we stopped waiting.
    Open,
}

/// Waits up to `wait` for the server to close `stream` or send on it.
async fn watch(stream: &mut TcpStream, wait: Duration) -> Seen {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(wait, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => Seen::Closed,
        Ok(Ok(_)) => Seen::Answered,
        Err(_) => Seen::Open,
    }
}

/// Opens [`FLOOD_CONNECTIONS`] connections to `addr`, sending nothing, and
/// returns how many the server closed without a byte.
async fn flood(addr: SocketAddr) -> usize {
    let mut closed = 0;
    let mut started = 0;
    let mut running = tokio::task::JoinSet::new();
    while started < FLOOD_CONNECTIONS || !running.is_empty() {
        while started < FLOOD_CONNECTIONS && running.len() < FLOOD_PARALLEL {
            started += 1;
            running.spawn(async move {
                let connected = tokio::time::timeout(CLOSED_WITHIN, TcpStream::connect(addr)).await;
                match connected {
                    Ok(Ok(mut stream)) => watch(&mut stream, CLOSED_WITHIN).await,
                    // Refused before the handshake completed: closed too.
                    Ok(Err(_)) => Seen::Closed,
                    Err(_) => Seen::Open,
                }
            });
        }
        if let Some(seen) = running.join_next().await
            && seen.unwrap() == Seen::Closed
        {
            closed += 1;
        }
    }
    closed
}

/// Connections that send nothing and hold their slot.
async fn occupy(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..count {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    held
}

/// One HTTP/1.1 GET on a keep-alive connection: status and body.
async fn get_keep_alive(stream: &mut TcpStream, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content-length");
            if body.len() >= length {
                return (head[9..12].parse().unwrap(), body[..length].to_owned());
            }
        }
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .expect("no whole response within 20 s")
            .unwrap();
        assert!(
            n > 0,
            "the admin port closed a served keep-alive connection"
        );
        received.extend_from_slice(&buf[..n]);
    }
}

/// A GET on a new connection, `None` if the connection was closed unanswered.
async fn get_once(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response);
    text.get(9..12)?.parse().ok()
}

/// Sends `bytes` one a second until the server closes the connection;
/// returns what the connection saw and how many bytes went out.
async fn trickle(stream: &mut TcpStream, bytes: &[u8]) -> (Seen, usize) {
    for (sent, byte) in bytes.iter().enumerate() {
        if stream.write_all(&[*byte]).await.is_err() {
            return (Seen::Closed, sent);
        }
        match watch(stream, Duration::from_secs(1)).await {
            Seen::Open => {}
            seen => return (seen, sent + 1),
        }
    }
    (Seen::Open, bytes.len())
}

fn admin_config(
    dir: &std::path::Path,
    connections_max: usize,
    read_timeout_ms: u64,
) -> BrokerConfig {
    BrokerConfig {
        admin_connections_max: connections_max,
        admin_read_timeout_ms: read_timeout_ms,
        ..BrokerConfig::for_tests(dir)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_connections_past_the_limit_are_closed_while_a_connected_client_is_served() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let limit = 8;
    let broker = start(admin_config(dir.path(), limit, 120_000)).await;
    let admin = broker.admin_addr();

    // One keep-alive client and enough silent ones to fill every slot.
    let mut client = TcpStream::connect(admin).await.unwrap();
    assert_eq!(
        get_keep_alive(&mut client, "/health").await,
        (200, "ok\n".into())
    );
    let occupiers = occupy(admin, limit - 1).await;

    let closed = flood(admin).await;
    assert_eq!(
        closed, FLOOD_CONNECTIONS,
        "every connection past admin_connections_max is closed unanswered"
    );

    // The connected client kept its slot and is still served.
    assert_eq!(
        get_keep_alive(&mut client, "/health").await,
        (200, "ok\n".into())
    );
    let (status, metrics) = get_keep_alive(&mut client, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("malachi_"), "{metrics}");

    // Closing connections returns their slots to new clients.
    drop(occupiers);
    drop(client);
    assert!(
        eventually(30_000, async || get_once(admin, "/health").await
            == Some(200))
        .await,
        "slots came back once their connections closed"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_client_sending_a_byte_a_second_is_dropped_after_the_read_timeout() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(admin_config(dir.path(), 8, 1_000)).await;
    let admin = broker.admin_addr();

    // A request head that would be complete after 40 bytes, sent a byte a
    // second: the server must close the connection long before.
    let head = b"GET /health HTTP/1.1\r\nHost: slow-client\r\n\r\n";
    let mut slow = TcpStream::connect(admin).await.unwrap();
    let (seen, sent) = trickle(&mut slow, head).await;
    assert_eq!(
        seen,
        Seen::Closed,
        "the slowloris was not dropped ({sent} bytes sent)"
    );
    assert!(
        sent < head.len(),
        "dropped before its request head was complete"
    );

    // A client that sends nothing at all is dropped the same way.
    let mut silent = TcpStream::connect(admin).await.unwrap();
    assert_eq!(
        watch(&mut silent, Duration::from_secs(30)).await,
        Seen::Closed
    );

    // And the port still serves whoever asks in time.
    assert_eq!(get_once(admin, "/health").await, Some(200));
    broker.shutdown().await.unwrap();
}

/// Two brokers of one cluster (`[cluster] nodes = [1, 2]`), with `tune`
/// applied to broker 2, which broker 1 dials (the lower id dials).
async fn two_brokers(dir: &std::path::Path, tune: impl Fn(&mut BrokerConfig)) -> Vec<BrokerHandle> {
    let cluster = malachi_actors::ClusterSettings {
        nodes: vec![1, 2],
        ..Default::default()
    };
    let first = start(BrokerConfig {
        node_id: 1,
        cluster: cluster.clone(),
        ..BrokerConfig::for_tests(dir.join("node-1"))
    })
    .await;
    let mut config = BrokerConfig {
        node_id: 2,
        seeds: vec![first.client_addr().to_string()],
        cluster,
        ..BrokerConfig::for_tests(dir.join("node-2"))
    };
    tune(&mut config);
    let second = start(config).await;
    vec![first, second]
}

/// Whether `tree --all` asked of `broker` returns the tree of every one of
/// `node_ids`.
async fn every_tree(broker: &BrokerHandle, node_ids: &[u64]) -> bool {
    let mut client = TestClient::connect(broker.client_addr()).await;
    let Ok(tree) = client.call(&TreeSnapshotRequest { all: true }).await else {
        return false;
    };
    node_ids.iter().all(|id| {
        tree.brokers
            .iter()
            .any(|b| b.node_id == *id && b.root.is_some())
    })
}

fn fabric_addr(broker: &BrokerHandle) -> SocketAddr {
    broker
        .membership()
        .view()
        .local
        .cluster_addr
        .expect("a node fabric address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fabric_connections_past_the_limit_are_closed_while_the_session_between_brokers_holds() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let limit = 4;
    let brokers = two_brokers(dir.path(), |c| {
        c.membership.fabric_connections_max = limit;
        c.membership.fabric_handshake_timeout_ms = 120_000;
    })
    .await;
    assert!(
        eventually(60_000, async || every_tree(&brokers[0], &[1, 2]).await).await,
        "broker 1 never had a session to broker 2"
    );
    let fabric = fabric_addr(&brokers[1]);

    // The session from broker 1 holds one slot; silent peers take the rest.
    let occupiers = occupy(fabric, limit - 1).await;
    let closed = flood(fabric).await;
    assert_eq!(
        closed, FLOOD_CONNECTIONS,
        "every connection past fabric_connections_max is closed at once"
    );

    // The session survived the flood, both ways.
    assert!(
        every_tree(&brokers[0], &[1, 2]).await,
        "tree --all via broker 1"
    );
    assert!(
        every_tree(&brokers[1], &[1, 2]).await,
        "tree --all via broker 2"
    );

    // Closed connections return their slots: a new one is held open again.
    drop(occupiers);
    assert!(
        eventually(30_000, async || {
            let mut stream = TcpStream::connect(fabric).await.unwrap();
            watch(&mut stream, Duration::from_secs(2)).await == Seen::Open
        })
        .await,
        "slots came back once their connections closed"
    );
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fabric_peer_sending_a_byte_a_second_is_dropped_after_the_handshake_timeout() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        membership: malachi_actors::MembershipSettings {
            fabric_handshake_timeout_ms: 1_000,
            ..BrokerConfig::for_tests(dir.path()).membership
        },
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let fabric = fabric_addr(&broker);

    // A frame length prefix and then some, a byte a second: a peer that
    // never gets to authenticate.
    let trickled = [0u8; 60];
    let mut slow = TcpStream::connect(fabric).await.unwrap();
    let (seen, sent) = trickle(&mut slow, &trickled).await;
    assert_eq!(
        seen,
        Seen::Closed,
        "the slowloris was not dropped ({sent} bytes sent)"
    );

    let mut silent = TcpStream::connect(fabric).await.unwrap();
    assert_eq!(
        watch(&mut silent, Duration::from_secs(30)).await,
        Seen::Closed
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_authenticated_fabric_session_outlives_the_handshake_timeout() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let brokers = two_brokers(dir.path(), |c| {
        c.membership.fabric_handshake_timeout_ms = 1_000
    })
    .await;
    assert!(
        eventually(60_000, async || every_tree(&brokers[0], &[1, 2]).await).await,
        "broker 1 never had a session to broker 2"
    );
    // Broker 1 dials broker 2 (the lower id dials), so broker 2 holds the
    // inbound connection: it must be marked authenticated, and never cut.
    let dialed = &brokers[1];
    assert!(
        eventually(10_000, async || matches!(
            dialed.fabric_inbound_counts(),
            Some((authenticated, _)) if authenticated >= 1
        ))
        .await,
        "broker 2 never marked the inbound session authenticated: {:?}",
        dialed.fabric_inbound_counts()
    );
    let before = dialed.fabric_inbound_counts();
    // Well past the deadline of the connection the session runs on.
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Regression: the session was labelled 0.0.0.0:0, never matched, and cut
    // at the deadline, then redialed: the counts would move.
    assert_eq!(
        dialed.fabric_inbound_counts(),
        before,
        "the inbound session was dropped and redialed"
    );
    assert_eq!(before.map(|(_, expired)| expired), Some(0));
    assert!(
        every_tree(&brokers[0], &[1, 2]).await,
        "tree --all via broker 1"
    );
    assert!(
        every_tree(&brokers[1], &[1, 2]).await,
        "tree --all via broker 2"
    );
    for broker in brokers {
        broker.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unauthenticated_fabric_peer_cannot_make_the_broker_buffer_a_large_frame() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        membership: malachi_actors::MembershipSettings {
            fabric_handshake_timeout_ms: 120_000,
            ..BrokerConfig::for_tests(dir.path()).membership
        },
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let fabric = fabric_addr(&broker);

    // A frame declared at 4 MiB (under the 8 MiB frame limit) and its first
    // MiB: were the broker to keep reading, it would wait for the rest until
    // the (long) handshake timeout; it closes the connection instead.
    let mut stream = TcpStream::connect(fabric).await.unwrap();
    stream.write_all(&(4u64 << 20).to_be_bytes()).await.unwrap();
    let chunk = vec![0u8; 64 << 10];
    let streamed = tokio::time::timeout(Duration::from_secs(30), async {
        for _ in 0..16 {
            if stream.write_all(&chunk).await.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(
        streamed.is_ok(),
        "the broker neither read nor closed the connection"
    );
    assert_eq!(
        watch(&mut stream, Duration::from_secs(30)).await,
        Seen::Closed
    );
    broker.shutdown().await.unwrap();
}
