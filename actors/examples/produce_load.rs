//! Measures produce throughput and acknowledgement latency of one in-process
//! broker on a temporary directory, with the wire's frame codec.
//!
//! `cargo run -p malachi-actors --example produce_load -- [connections] [requests] [records] [value_bytes]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use malachi_actors::{Broker, BrokerConfig};
use malachi_wire::batch::{BatchBuilder, Record};
use malachi_wire::messages::{CreateTopicRequest, ProduceRequest};
use malachi_wire::{ClientCodec, ErrorCode, Message, RequestFrame};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// Requests each connection keeps in flight.
const PIPELINE: usize = 16;

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let connections = arg(1, 8);
    let requests = arg(2, 500);
    let records = arg(3, 100);
    let value_bytes = arg(4, 100);
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(BrokerConfig::for_tests(dir.path()))
        .await
        .unwrap();
    assert!(broker.wait_ready(10_000).await);
    let addr = broker.client_addr();

    let mut admin = Framed::new(
        TcpStream::connect(addr).await.unwrap(),
        ClientCodec::default(),
    );
    let create = CreateTopicRequest {
        name: "load".into(),
        replication_factor: None,
        policy: None,
    };
    admin
        .send(RequestFrame {
            api_key: 1,
            correlation_id: 1,
            payload: create.encode().unwrap(),
        })
        .await
        .unwrap();
    assert_eq!(
        admin.next().await.unwrap().unwrap().error_code,
        ErrorCode::None
    );

    let value = Bytes::from(vec![b'v'; value_bytes]);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut builder = BatchBuilder::new(64 << 20);
            for i in 0..records {
                builder
                    .push(&Record::new(
                        Bytes::from(format!("key-{c}-{}", i % 64)),
                        value.clone(),
                    ))
                    .unwrap();
            }
            let payload = ProduceRequest {
                topic: "load".into(),
                producer: None,
                records: builder.finish(),
            }
            .encode()
            .unwrap();
            let mut framed = Framed::new(
                TcpStream::connect(addr).await.unwrap(),
                ClientCodec::default(),
            );
            let mut sent_at = std::collections::HashMap::new();
            let mut latencies = Vec::with_capacity(requests);
            let mut next = 0u32;
            while latencies.len() < requests {
                while (next as usize) < requests && sent_at.len() < PIPELINE {
                    framed
                        .send(RequestFrame {
                            api_key: 10,
                            correlation_id: next,
                            payload: payload.clone(),
                        })
                        .await
                        .unwrap();
                    sent_at.insert(next, Instant::now());
                    next += 1;
                }
                let frame = framed.next().await.unwrap().unwrap();
                assert_eq!(frame.error_code, ErrorCode::None);
                let at = sent_at.remove(&frame.correlation_id).unwrap();
                latencies.push(at.elapsed());
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let total_records = connections * requests * records;
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "{connections} connections x {requests} requests x {records} records of {value_bytes} B, pipeline {PIPELINE}: \
         {:.0} records/s, {:.1} MB/s of values, ack latency p50 {:?} p99 {:?} max {:?}",
        total_records as f64 / elapsed.as_secs_f64(),
        (total_records * value_bytes) as f64 / elapsed.as_secs_f64() / 1e6,
        pct(0.50),
        pct(0.99),
        latencies[latencies.len() - 1],
    );
    broker.shutdown().await.unwrap();
}
