//! Measures a single-voter metadata group on this machine's disk: the time
//! `open_single` takes on a fresh and on an existing directory, and the
//! latency of sequential `propose` calls (each one fsyncs its entry).
//!
//! Run: `cargo run --release -p malachi-cluster --example group_latency -- [dir] [count]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use malachi_cluster::group::{GroupConfig, MetadataGroup};
use malachi_core::model::{Command, NodeId};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let base = args.next().map(std::path::PathBuf::from);
    let count: usize = args.next().map_or(500, |c| c.parse().unwrap());
    let tmp = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    let config = GroupConfig::new(1, 1, tmp.path());

    let started = Instant::now();
    let group = MetadataGroup::open_single(config.clone()).await.unwrap();
    let fresh_open = started.elapsed();

    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let cmd = Command::CreateTopic {
            topic: format!("topic-{i:06}"),
            initial_ranges: 4,
            policy: None,
            replicas: vec![vec![NodeId(1)]; 4],
            at_ms: i as u64,
        };
        let started = Instant::now();
        group.propose(cmd).await.unwrap().unwrap();
        latencies.push(started.elapsed());
    }
    group.shutdown().await.unwrap();

    let started = Instant::now();
    let group = MetadataGroup::open_single(config).await.unwrap();
    let reopen = started.elapsed();
    let topics = group.read_local(|s| s.topics().count());
    group.shutdown().await.unwrap();
    assert_eq!(topics, count);

    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let total: std::time::Duration = latencies.iter().sum();
    println!("fresh open_single: {fresh_open:?}");
    println!("reopen with {count} topics: {reopen:?}");
    println!(
        "propose x{count}: mean {:?} p50 {:?} p99 {:?} max {:?}",
        total / count as u32,
        pct(0.50),
        pct(0.99),
        latencies[latencies.len() - 1]
    );
}
