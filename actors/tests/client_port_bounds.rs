//! The client port's bounds (issue 15, item 5): connections past
//! `connections_max` are refused without costing a task each, a slowloris
//! is dropped after `frame_read_timeout_ms`, an idle connection after
//! `idle_timeout_ms`, and none of it stops the broker serving the others.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use common::*;
use malachi_actors::BrokerConfig;
use malachi_wire::{ClientCodec, ErrorCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

/// What a refused socket saw.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// It read the `busy` frame (then the close).
    Busy,
    /// It saw the close (or a reset) without a frame.
    Closed,
    /// Something else: a frame that is not `busy`, or nothing in time.
    Other(String),
}

/// Connect with std sockets (no task of the test's own runtime) and read
/// what the broker answers, within `timeout`.
fn knock(addr: std::net::SocketAddr, timeout: Duration) -> Refusal {
    let mut stream = match std::net::TcpStream::connect_timeout(&addr, timeout) {
        Ok(stream) => stream,
        Err(e) => return Refusal::Other(format!("connect: {e}")),
    };
    stream.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 512];
    loop {
        if let Ok(Some(frame)) = ClientCodec::default().decode(&mut buf) {
            return if frame.error_code == ErrorCode::Busy && frame.correlation_id == 0 {
                Refusal::Busy
            } else {
                Refusal::Other(format!("{frame:?}"))
            };
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Refusal::Closed,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                return Refusal::Closed;
            }
            Err(e) => return Refusal::Other(format!("read: {e}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_connections_past_the_limit_are_refused_while_connected_clients_are_served() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let connections_max = 32;
    let config = BrokerConfig {
        connections_max,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let addr = broker.client_addr();
    let mut client = TestClient::connect(addr).await;
    client.create_topic("t").await;
    // Fill the limit: the client above and 31 idle sockets.
    let mut idle = Vec::new();
    for _ in 1..connections_max {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    assert!(
        eventually(10_000, async || broker.connections() == connections_max).await,
        "{} connections",
        broker.connections()
    );
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    // 2,000 clients knock, from plain threads, 8 at a time.
    let knocks = 2_000;
    let flood = std::thread::spawn(move || {
        let per_thread = knocks / 8;
        let threads: Vec<_> = (0..8)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|_| knock(addr, Duration::from_secs(10)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });

    // Meanwhile the connected client keeps producing and fetching.
    let mut served = 0usize;
    let mut tasks_peak = tasks_before;
    let mut connections_peak = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !flood.is_finished() {
        assert!(Instant::now() < deadline, "the flood never ended");
        let value = format!("v{served}");
        assert_eq!(
            client
                .produce("t", &[record("k", &value)])
                .await
                .unwrap_or_else(|r| panic!("produce {served} refused: {r:?}")),
            1
        );
        served += 1;
        let (records, _) = client.fetch("t", None, true, 10_000, 0).await.unwrap();
        assert_eq!(records.len(), served);
        tasks_peak = tasks_peak.max(
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks(),
        );
        connections_peak = connections_peak.max(broker.connections());
    }
    let outcomes = flood.join().unwrap();
    let busy = outcomes.iter().filter(|o| **o == Refusal::Busy).count();
    let closed = outcomes.iter().filter(|o| **o == Refusal::Closed).count();
    let other: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o, Refusal::Other(_)))
        .take(5)
        .collect();
    eprintln!(
        "{knocks} knocks: {busy} busy, {closed} closed; {served} produce+fetch served; \
         tasks {tasks_before} -> peak {tasks_peak}"
    );
    assert!(other.is_empty(), "refused sockets saw: {other:?}");
    assert_eq!(busy + closed, knocks);
    assert!(busy > 0, "no refused socket read the busy frame");
    assert!(connections_peak <= connections_max);
    // No task per refused socket: the count stays where it was, give or
    // take the broker's own background work.
    assert!(
        tasks_peak <= tasks_before + 16,
        "alive tasks grew from {tasks_before} to {tasks_peak} during the flood"
    );
    assert!(
        broker
            .metrics_text()
            .contains(&format!("malachi_connections_refused_total {knocks}")),
        "{}",
        broker.metrics_text()
    );
    // And after: still served, and a freed slot takes a new client.
    client.produce("t", &[record("k", "after")]).await.unwrap();
    drop(idle.pop());
    assert!(eventually(10_000, async || broker.connections() < connections_max).await);
    let mut late = TestClient::connect(addr).await;
    let (records, _) = late.fetch("t", None, true, 10_000, 0).await.unwrap();
    assert_eq!(records.len(), served + 1);
    drop(idle);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slowloris_sending_one_byte_a_second_is_dropped_after_the_frame_read_timeout() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        frame_read_timeout_ms: 2_000,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut frame = BytesMut::new();
    frame.put_u32(1_000);
    frame.put_u16(3);
    frame.put_u32(1);
    frame.put_slice(&[0u8; 994]);
    let mut slow = TcpStream::connect(broker.client_addr()).await.unwrap();
    let started = Instant::now();
    let mut closed = false;
    // One byte a second, for at most 20 s (the frame needs 1,004).
    for byte in frame.iter().take(20) {
        if slow.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        let mut sink = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(1), slow.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => panic!("the broker answered a partial frame with {n} bytes"),
            Err(_) => {}
        }
    }
    let after = started.elapsed();
    assert!(closed, "the slowloris was still connected after {after:?}");
    assert!(
        after >= Duration::from_millis(1_500),
        "closed before the timeout: {after:?}"
    );
    assert!(eventually(5_000, async || broker.connections() == 0).await);
    assert!(
        broker
            .metrics_text()
            .contains("malachi_connections_frame_timed_out_total 1")
    );
    // Others are served as before.
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_connection_is_closed_after_the_idle_timeout_but_not_while_a_fetch_waits() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        idle_timeout_ms: 500,
        fetch_wait_ms_max: 3_000,
        ..BrokerConfig::for_tests(dir.path())
    };
    let broker = start(config).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("t").await;
    // A long poll (2 s, four idle timeouts) is a request in flight: the
    // connection stays and gets its (empty) answer.
    let started = Instant::now();
    let (records, _) = client.fetch("t", None, false, 10, 2_000).await.unwrap();
    assert!(records.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    // Then nothing: the broker closes it.
    let closed = tokio::time::timeout(Duration::from_secs(10), client.next_frame()).await;
    assert!(
        matches!(closed, Ok(None)),
        "the idle connection was not closed"
    );
    assert!(eventually(5_000, async || broker.connections() == 0).await);
    assert!(
        broker
            .metrics_text()
            .contains("malachi_connections_idle_closed_total 1")
    );
    broker.shutdown().await.unwrap();
}
