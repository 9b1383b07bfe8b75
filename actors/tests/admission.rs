//! Fair and bounded admission (issue 39, ADR 0145): each attack measured
//! against a broker with its defaults, replayed here with smaller limits.
//! In each, a well-behaved client (from `127.0.0.1`) is served within a
//! bound while the attack (from `127.0.0.2` and up: loopback plays several
//! hosts) runs, and the attacker is closed.
//!
//! Every wait is on a condition, bounded and generous (the machine is
//! shared and noisy).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use malachi_actors::{BrokerConfig, BrokerHandle};
use malachi_wire::messages::{FetchRequest, Message as _};
use malachi_wire::{ApiKey, batch::Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a well-behaved client may wait for one answer during an attack.
const SERVED_WITHIN: Duration = Duration::from_secs(10);

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// The well-behaved client's address.
fn good() -> IpAddr {
    ip("127.0.0.1")
}

/// Whether the broker has closed `stream` (EOF or reset) within `wait`,
/// discarding whatever it sent before.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut sink = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// A produce and a fetch from `good()`, each answered within
/// [`SERVED_WITHIN`].
async fn served(addr: SocketAddr, topic: &str, tag: &str) {
    let mut client = tokio::time::timeout(SERVED_WITHIN, TestClient::connect_from(addr, good()))
        .await
        .expect("the well-behaved client could not connect in time");
    let produced = tokio::time::timeout(SERVED_WITHIN, client.produce(topic, &[record("k", tag)]))
        .await
        .expect("the well-behaved client's produce waited too long");
    assert_eq!(produced.unwrap(), 1);
    let fetched = tokio::time::timeout(SERVED_WITHIN, client.fetch(topic, None, true, 1, 0))
        .await
        .expect("the well-behaved client's fetch waited too long");
    assert!(!fetched.unwrap().0.is_empty());
}

/// A request frame's 4-byte length declaring `declared` bytes, and
/// nothing else.
fn length_only(declared: u32) -> [u8; 4] {
    declared.to_be_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lengths_declaring_16_mib_reserve_nothing_and_a_connection_waiting_for_budget_meets_its_deadline()
 {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let frame_read_timeout_ms = 3_000;
    let broker = start(BrokerConfig {
        frame_read_timeout_ms,
        request_bytes_budget: 48 << 20,
        connection_request_bytes_max: 16 << 20,
        address_request_bytes_max: 16 << 20,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let addr = broker.client_addr();
    TestClient::connect(addr).await.create_topic("t").await;

    // 40 connections, from 40 addresses, that send only a length declaring
    // 16 MiB: with the declared length reserved, 3 of them took the whole
    // budget. Now each holds one small read's room.
    let mut liars = Vec::new();
    for host in 10..50 {
        let mut stream = tcp_from(addr, ip(&format!("127.0.0.{host}")))
            .await
            .unwrap();
        stream.write_all(&length_only(16 << 20)).await.unwrap();
        liars.push(stream);
    }
    assert!(
        eventually(10_000, async || counter(
            &broker,
            "malachi_request_bytes_in_use"
        ) >= 40 * (8 << 10))
        .await,
        "the broker never read the lengths"
    );
    let in_use = counter(&broker, "malachi_request_bytes_in_use");
    assert!(
        in_use <= 1 << 20,
        "40 lengths alone reserved {in_use} bytes of request budget"
    );

    // One that really sends all but the last byte of a 16 MiB frame, and so
    // holds its address's whole share...
    let filler = tcp_from(addr, ip("127.0.0.3")).await.unwrap();
    let (read, mut write) = filler.into_split();
    let filler = tokio::spawn(async move {
        let _ = write.write_all(&length_only(16 << 20)).await;
        let body = vec![0u8; (16 << 20) - 1];
        let _ = write.write_all(&body).await;
        // Keep the write half open until the broker closes.
        (read, write)
    });
    assert!(
        eventually(10_000, async || counter(
            &broker,
            "malachi_request_bytes_in_use"
        ) >= 15 << 20)
        .await,
        "the filler never held its address's share"
    );
    served(addr, "t", "during").await;

    // ... so the next connection from that address waits for budget as soon
    // as its first bytes arrive: its deadline runs all the same (it used to
    // start only once the budget came, after the filler's own deadline).
    let waiting_since = tokio::time::Instant::now();
    let mut waiter = tcp_from(addr, ip("127.0.0.3")).await.unwrap();
    waiter.write_all(&length_only(1 << 10)).await.unwrap();
    assert!(closed_within(&mut waiter, Duration::from_secs(30)).await);
    let waited = waiting_since.elapsed();
    assert!(
        waited < Duration::from_millis(frame_read_timeout_ms + 1_500),
        "the connection waiting for budget was closed after {waited:?}"
    );

    // Every attacker is closed by the frame deadline, the one waiting for
    // budget included.
    for liar in &mut liars {
        assert!(
            closed_within(liar, Duration::from_secs(30)).await,
            "a length-only connection was not closed"
        );
    }
    assert!(
        eventually(30_000, async || counter(
            &broker,
            "malachi_connections_frame_timed_out_total"
        ) >= 42)
        .await,
        "frame deadlines: {}",
        counter(&broker, "malachi_connections_frame_timed_out_total")
    );
    let (mut read, _write) = filler.await.unwrap();
    let mut sink = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(30), read.read(&mut sink)).await;
    assert!(matches!(end, Ok(Ok(0)) | Ok(Err(_))), "{end:?}");
    assert!(
        eventually(10_000, async || counter(
            &broker,
            "malachi_request_bytes_in_use"
        ) == 0)
        .await
    );
    served(addr, "t", "after").await;
    broker.shutdown().await.unwrap();
}

/// A fetch request frame of `topic` from its start, asking for `bytes_max`.
fn fetch_frame(correlation_id: u32, topic: &str, bytes_max: u32) -> Bytes {
    let payload = FetchRequest {
        topic: topic.into(),
        cursor: None,
        from_start: true,
        records_max: 1_000,
        bytes_max,
        wait_ms: 0,
    }
    .encode()
    .unwrap();
    let mut frame = BytesMut::new();
    frame.put_u32(6 + payload.len() as u32);
    frame.put_u16(ApiKey::Fetch as u16);
    frame.put_u32(correlation_id);
    frame.put_slice(&payload);
    frame.freeze()
}

/// Produces `mib` records of 1 MiB each to `topic`.
async fn fill(client: &mut TestClient, topic: &str, mib: usize) {
    let value = "x".repeat((1 << 20) - 64);
    for batch in 0..mib / 4 {
        let records: Vec<Record> = (0..4)
            .map(|i| record(&format!("k{batch}-{i}"), &value))
            .collect();
        assert_eq!(client.produce(topic, &records).await.unwrap(), 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_never_read_their_fetches_hold_only_their_share_and_are_closed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        response_bytes_budget: 64 << 20,
        connection_response_bytes_max: 16 << 20,
        address_response_bytes_max: 32 << 20,
        response_write_timeout_ms: 3_000,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let addr = broker.client_addr();
    let mut setup = TestClient::connect(addr).await;
    setup.create_topic("big").await;
    fill(&mut setup, "big", 24).await;
    setup.create_topic("t").await;
    drop(setup);

    // 8 connections pipeline fetches of 15 MiB and never read: together
    // they asked for twice the response budget.
    let mut hoarders = Vec::new();
    for _ in 0..8 {
        let mut stream = tcp_from(addr, ip("127.0.0.2")).await.unwrap();
        for id in 1..=4 {
            stream
                .write_all(&fetch_frame(id, "big", 15 << 20))
                .await
                .unwrap();
        }
        hoarders.push(stream);
    }
    assert!(
        eventually(30_000, async || counter(
            &broker,
            "malachi_response_bytes_in_use"
        ) >= 16 << 20)
        .await,
        "the hoarders never held response budget"
    );
    served(addr, "t", "during").await;
    assert!(
        counter(&broker, "malachi_response_bytes_in_use") <= 48 << 20,
        "one address held more than its share"
    );

    // Each stalled answer passes its deadline and closes its connection.
    assert!(
        eventually(120_000, async || counter(
            &broker,
            "malachi_connections_write_timed_out_total"
        ) >= 8)
        .await,
        "write deadlines: {}",
        counter(&broker, "malachi_connections_write_timed_out_total")
    );
    for hoarder in &mut hoarders {
        assert!(closed_within(hoarder, Duration::from_secs(30)).await);
    }
    assert!(
        eventually(10_000, async || counter(
            &broker,
            "malachi_response_bytes_in_use"
        ) == 0)
        .await
    );
    served(addr, "t", "after").await;
    broker.shutdown().await.unwrap();
}

/// Descriptors this process (the test and its brokers) holds open.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count())
}

fn fabric_loopback(broker: &BrokerHandle) -> SocketAddr {
    broker
        .fabric_unadvertised()
        .and_then(|(_, addr)| addr)
        .expect("ractor_cluster's own listener")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_to_the_unadvertised_fabric_listener_are_closed_at_once() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let addr = broker.client_addr();
    TestClient::connect(addr).await.create_topic("t").await;
    let loopback = fabric_loopback(&broker);
    let descriptors_before = open_descriptors();

    // 2,000 connections, 50 at a time, each sending nothing: every one is
    // closed by the broker, none is held; the client port serves meanwhile.
    let total = 2_000;
    let flood = tokio::spawn(async move {
        let mut closed = 0;
        let mut started = 0;
        let mut running = tokio::task::JoinSet::new();
        while started < total || !running.is_empty() {
            while started < total && running.len() < 50 {
                started += 1;
                running.spawn(async move {
                    match TcpStream::connect(loopback).await {
                        Ok(mut stream) => closed_within(&mut stream, Duration::from_secs(15)).await,
                        Err(_) => true,
                    }
                });
            }
            if let Some(seen) = running.join_next().await
                && seen.unwrap()
            {
                closed += 1;
            }
        }
        closed
    });
    let mut rounds = 0;
    while !flood.is_finished() {
        served(addr, "t", &format!("during {rounds}")).await;
        rounds += 1;
    }
    let closed = flood.await.unwrap();
    assert_eq!(
        closed, total,
        "connections to the unadvertised listener held open"
    );
    let (stopped, _) = broker.fabric_unadvertised().unwrap();
    assert!(stopped >= total as u64, "{stopped} sessions stopped");
    // The broker's side of each is closed too: no descriptor is held.
    assert!(
        eventually(30_000, async || open_descriptors()
            <= descriptors_before + 32)
        .await,
        "descriptors: {descriptors_before} before, {} after",
        open_descriptors()
    );
    served(addr, "t", "after").await;
    broker.shutdown().await.unwrap();
}

/// A GET on a new connection from `from`, `None` if it was closed unanswered.
async fn get_from(addr: SocketAddr, from: IpAddr, path: &str) -> Option<u16> {
    let mut stream = tcp_from(addr, from).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(SERVED_WITHIN, stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&response).get(9..12)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_admin_connections_from_one_host_leave_health_and_readiness_answered() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        admin_connections_max: 64,
        admin_address_connections_max: 8,
        admin_read_timeout_ms: 5_000,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let admin = broker.admin_addr();
    assert!(
        eventually(30_000, async || get_from(admin, good(), "/ready").await
            == Some(200))
        .await
    );

    // 64 connections from one host, each with half a request head.
    let mut slow = Vec::new();
    for _ in 0..64 {
        let mut stream = tcp_from(admin, ip("127.0.0.2")).await.unwrap();
        let _ = stream.write_all(b"GET /rea").await;
        slow.push(stream);
    }
    assert_eq!(get_from(admin, good(), "/health").await, Some(200));
    assert_eq!(get_from(admin, good(), "/ready").await, Some(200));

    // The slow ones: past the per-address cap closed at once, the others
    // at the read deadline.
    for stream in &mut slow {
        assert!(closed_within(stream, Duration::from_secs(30)).await);
    }
    assert_eq!(get_from(admin, good(), "/ready").await, Some(200));
    broker.shutdown().await.unwrap();
}

/// Every slot of the admin port taken, by slow connections from several
/// hosts: `/health` and `/ready` are still answered, by the probe lane;
/// anything else is `503 busy` there, and nothing the lane answered holds
/// a slot (issue 39).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saturated_admin_port_still_answers_health_and_readiness() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        admin_connections_max: 8,
        admin_address_connections_max: 2,
        admin_read_timeout_ms: 120_000,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let admin = broker.admin_addr();
    assert!(
        eventually(30_000, async || get_from(admin, good(), "/ready").await
            == Some(200))
        .await
    );
    // Four hosts, two slow connections each: every slot is held.
    let mut slow = Vec::new();
    for host in 2..6 {
        for _ in 0..2 {
            let mut stream = tcp_from(admin, ip(&format!("127.0.0.{host}")))
                .await
                .unwrap();
            stream.write_all(b"GET /rea").await.unwrap();
            slow.push(stream);
        }
    }
    // The main lane is full: a scrape is turned away, the probes answered.
    assert!(
        eventually(30_000, async || get_from(admin, good(), "/metrics").await
            == Some(503))
        .await,
        "a scrape past the limits is busy"
    );
    // Back to back from one address: each probe has read its answer to the
    // end, so its place is free for the next (CI once found the lane still
    // holding the previous connection's place: the slot now goes back
    // before the close).
    for _ in 0..100 {
        assert_eq!(get_from(admin, good(), "/health").await, Some(200));
        assert_eq!(get_from(admin, good(), "/ready").await, Some(200));
    }
    assert!(counter(&broker, "malachi_admin_probe_answered_total") >= 200);
    drop(slow);
    assert!(
        eventually(30_000, async || get_from(admin, good(), "/metrics").await
            == Some(200))
        .await,
        "the slots come back when the slow connections go"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_from_one_host_leave_room_for_the_others() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig {
        connections_max: 64,
        address_connections_max: 16,
        idle_timeout_ms: 3_000,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let addr = broker.client_addr();
    TestClient::connect(addr).await.create_topic("t").await;

    // 64 idle connections from one host: 16 are held, the rest refused.
    let mut idle = Vec::new();
    for _ in 0..64 {
        idle.push(tcp_from(addr, ip("127.0.0.2")).await.unwrap());
    }
    assert!(
        eventually(10_000, async || counter(
            &broker,
            "malachi_connections_refused_total"
        ) >= 48)
        .await,
        "refused: {}",
        counter(&broker, "malachi_connections_refused_total")
    );
    served(addr, "t", "during").await;
    // All of them are closed: the refused at once, the held when idle.
    for stream in &mut idle {
        assert!(closed_within(stream, Duration::from_secs(30)).await);
    }
    assert!(
        counter(&broker, "malachi_connections_idle_closed_total") >= 16,
        "idle closes: {}",
        counter(&broker, "malachi_connections_idle_closed_total")
    );
    served(addr, "t", "after").await;
    broker.shutdown().await.unwrap();
}

/// Regression: frames split whole units off the reader's share, so pipelined
/// frames of odd sizes left it short of the partial frame behind them, and a
/// frame of exactly `frame_bytes_max` did not fit a cap of that size once
/// rounded: the reader found no room to read into.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_largest_frame_and_odd_sized_pipelined_frames_are_read_whole_at_the_smallest_caps() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let frame_bytes_max = 256 << 10;
    let broker = start(BrokerConfig {
        frame_bytes_max,
        record_value_bytes_max: 64 << 10,
        connection_request_bytes_max: frame_bytes_max,
        connection_response_bytes_max: frame_bytes_max,
        address_request_bytes_max: frame_bytes_max,
        address_response_bytes_max: frame_bytes_max,
        request_bytes_budget: 2 * frame_bytes_max,
        response_bytes_budget: 2 * frame_bytes_max,
        ..BrokerConfig::for_tests(dir.path())
    })
    .await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    // An api key the broker does not know: each frame is answered with an
    // error on its own correlation id, whatever its size.
    let unknown = 9_999;
    let mut sent = Vec::new();
    for size in [1_019, 1_025, 1_025, 1_025, 2_049, 3_000, 1_025] {
        sent.push(client.send_raw(unknown, Bytes::from(vec![0u8; size])).await);
    }
    sent.push(
        client
            .send_raw(unknown, Bytes::from(vec![0u8; frame_bytes_max - 6]))
            .await,
    );
    for _ in 0..sent.len() {
        let frame = client.recv().await.expect("a frame was not answered");
        assert!(sent.contains(&frame.correlation_id), "{frame:?}");
    }
    assert_eq!(
        counter(&broker, "malachi_connections_frame_timed_out_total"),
        0
    );
    broker.shutdown().await.unwrap();
}
