//! The admin port: health, readiness, Prometheus metrics and the tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use common::*;
use malachi_actors::BrokerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    call(addr, "GET", path).await
}

async fn call(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_ready_metrics_and_tree_are_served() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let admin = broker.admin_addr();
    assert_eq!(get(admin, "/health").await.0, 200);
    assert_eq!(get(admin, "/ready").await.0, 200);

    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("m").await;
    client
        .produce("m", &[record("k", "vvvv"), record("k", "ww")])
        .await
        .unwrap();
    client.fetch("m", None, true, 10, 0).await.unwrap();

    let (status, metrics) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "malachi_records_produced_total 2",
        "malachi_bytes_produced_total 8",
        "malachi_records_consumed_total 2",
        "malachi_bytes_consumed_total 8",
        "malachi_open_segments 1",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in:\n{metrics}");
    }
    assert!(
        metrics.contains("malachi_append_latency_seconds_bucket"),
        "{metrics}"
    );
    assert!(
        metrics.contains("malachi_actor_restarts{actor=\"broker/storage\"} 0"),
        "{metrics}"
    );

    let (status, tree) = get(admin, "/api/tree").await;
    assert_eq!(status, 200);
    let tree: serde_json::Value = serde_json::from_str(&tree).unwrap();
    assert_eq!(tree["name"], "broker");
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_are_listed_and_a_refused_decommission_says_why() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let admin = broker.admin_addr();
    let (status, body) = get(admin, "/api/members").await;
    assert_eq!(status, 200, "{body}");
    let members: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(members["members"][0]["node_id"], 1, "{body}");
    assert_eq!(members["members"][0]["state"], "active", "{body}");
    assert_eq!(members["groups_moving"], 0, "{body}");
    // Not a member; the last active broker; node id 0: refused, 400.
    for path in [
        "/api/members/77/decommission",
        "/api/members/1/decommission",
        "/api/members/0/admit",
    ] {
        let (status, body) = call(admin, "POST", path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.starts_with("invalid_request: "), "{path}: {body}");
    }
    // A GET is not a change.
    assert_eq!(get(admin, "/api/members/77/decommission").await.0, 405);
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_shutdown_both_ports_are_closed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    assert!(broker.is_ready());
    let admin = broker.admin_addr();
    let client = broker.client_addr();
    broker.shutdown().await.unwrap();
    let closed = eventually(5_000, async || {
        tokio::net::TcpStream::connect(admin).await.is_err()
            && tokio::net::TcpStream::connect(client).await.is_err()
    })
    .await;
    assert!(closed, "a port still accepts connections after shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_acknowledges_in_flight_produces_before_closing() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    client.create_topic("s").await;
    use malachi_wire::Message;
    let payload = produce_request("s", &[record("k", "v")]).encode().unwrap();
    for _ in 0..50 {
        client.send_raw(10, payload.clone()).await;
    }
    let shutdown = tokio::spawn(broker.shutdown());
    let mut acked = 0;
    while let Some(frame) = client.recv().await {
        if frame.error_code == malachi_wire::ErrorCode::None {
            acked += 1;
        }
    }
    shutdown.await.unwrap().unwrap();
    // Whatever was acknowledged is durable: a restarted broker has it all.
    let broker = start(BrokerConfig::for_tests(dir.path())).await;
    let mut client = TestClient::connect(broker.client_addr()).await;
    let (got, _) = client.fetch("s", None, true, 1000, 0).await.unwrap();
    assert!(
        got.len() >= acked,
        "{} read, {acked} acknowledged",
        got.len()
    );
    broker.shutdown().await.unwrap();
}
