//! `malachi bench maintenance`: what retention and the scrubber cost
//! producers (issue 21). Each round starts two fresh three-broker clusters
//! one after the other, the same but for their upkeep:
//! - **off**: the defaults (a sealed copy's scrub verdict stands a day,
//!   coordinators ask every 30 s) and a topic without a storage policy;
//! - **on**: every sealed copy re-verified every second (the scrubber
//!   reading at its full 32 MiB/s while there is anything to read),
//!   retention every second under a policy that keeps 32 MiB of sealed
//!   segments (so segments are expired, dropped and removed throughout),
//!   and the orphan sweep every second.
//!
//! Segments roll at 8 MiB so there is a steady supply of sealed copies to
//! scrub and expire. Each cluster is warmed up for `--warmup`, then its
//! producer throughput measured for `--measure`; rounds alternate off and
//! on, so drift on a shared machine falls on both. It reports each round
//! and the ratio of the means (on over off). Nothing is asserted: the
//! figures go to docs/benchmarks.md.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::super::client::connect;
use super::super::error::CliError;
use super::super::{BenchMaintenanceArgs, OutputArgs};
use super::compare::{malachi_cluster_config, start_cluster_within, wait_for_brokers};
use super::{ProduceLoad, produce_load};

const BROKERS: u64 = 3;
/// Segments roll at this many bytes.
const SEGMENT_BYTES: u64 = 8 << 20;
/// The "on" policy keeps this many sealed bytes per topic.
const RETAINED_BYTES: u64 = 32 << 20;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MaintenanceRow {
    pub round: u32,
    /// `off` or `on`.
    pub upkeep: &'static str,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    /// Sealed segments retention expired and bytes the scrubber read during
    /// the measurement, summed over the brokers (0 when off).
    pub segments_expired: u64,
    pub scrub_bytes: u64,
}

fn load(topic: &str, duration: Duration) -> ProduceLoad {
    ProduceLoad {
        topic: topic.to_string(),
        producers: 4,
        record_size: 1024,
        batch_records: 256,
        window: 8,
        duration,
    }
}

fn config(on: bool) -> String {
    // Top-level keys go before the first table.
    let mut config = format!(
        "segment_bytes_max = {SEGMENT_BYTES}\n{}",
        malachi_cluster_config(BROKERS)
    );
    if on {
        config.push_str(
            "scrub_interval_ms = 1000\n\n[maintenance]\nretention_sweep_ms = 1000\norphan_sweep_ms = 1000\norphan_grace_ms = 0\n",
        );
    }
    config
}

/// The admin address a broker logged at start (`broker started ...
/// admin_addr=IP:PORT`).
fn admin_addr(log: &str) -> Option<std::net::SocketAddr> {
    let line = log.lines().find(|l| l.contains("broker started"))?;
    let at = line.find("admin_addr=")? + "admin_addr=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

/// `GET /metrics` on an admin port, the body only.
async fn metrics(admin: std::net::SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(admin),
    )
    .await
    .ok()?
    .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut body))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&body).into_owned();
    Some(
        text.split_once("\r\n\r\n")
            .map_or(text.clone(), |(_, b)| b.to_owned()),
    )
}

/// A counter summed over the brokers' `/metrics`.
async fn counter(admins: &[std::net::SocketAddr], name: &str) -> u64 {
    let mut total = 0.0;
    for admin in admins {
        let Some(text) = metrics(*admin).await else {
            continue;
        };
        total += text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    total as u64
}

async fn one(
    round: u32,
    on: bool,
    args: &BenchMaintenanceArgs,
) -> Result<MaintenanceRow, CliError> {
    let bench = |what: &str, e: &dyn std::fmt::Display| CliError::Bench(format!("{what}: {e}"));
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let upkeep = if on { "on" } else { "off" };
    let guards = start_cluster_within(
        &exe,
        BROKERS,
        &config(on),
        |id| {
            tempfile::Builder::new()
                .prefix(&format!("malachi-upkeep-{upkeep}-{id}-"))
                .tempdir()
                .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
        },
        Duration::from_secs(30),
    )
    .await?;
    let output = OutputArgs {
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![guards[0].addr.to_string()],
        json: true,
        timeout_ms: 10_000,
        tls: Default::default(),
    };
    wait_for_brokers(&output, BROKERS)
        .await
        .map_err(CliError::Bench)?;
    let admin = connect(&output).await?;
    let policy = if on {
        admin
            .put_policy(malachi_wire::messages::PolicyDescription {
                name: "bench-upkeep".into(),
                retention_bytes: Some(RETAINED_BYTES),
                ..Default::default()
            })
            .await
            .map_err(|e| bench("put policy", &e))?;
        Some("bench-upkeep")
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = admin
        .create_topic("upkeep", Some(3), policy.map(str::to_owned))
        .await
    {
        if Instant::now() > deadline {
            return Err(bench("create topic", &e));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Warm up: sealed segments to scrub and expire exist before measuring.
    produce_load(&output, &load("upkeep", args.warmup), true).await?;
    let admins: Vec<std::net::SocketAddr> = guards
        .iter()
        .filter_map(|g| admin_addr(&g.log_text()))
        .collect();
    let expired_before = counter(&admins, "malachi_segments_expired_total").await;
    let scrub_before = counter(&admins, "malachi_scrub_bytes_total").await;
    let measured = produce_load(&output, &load("upkeep", args.measure), true)
        .await?
        .0;
    let expired = counter(&admins, "malachi_segments_expired_total").await - expired_before;
    let scrubbed = counter(&admins, "malachi_scrub_bytes_total").await - scrub_before;
    drop(admin);
    drop(guards);
    Ok(MaintenanceRow {
        round,
        upkeep,
        mb_per_s: measured.mb_per_s(),
        records_per_s: measured.records_per_s(),
        segments_expired: expired,
        scrub_bytes: scrubbed,
    })
}

pub async fn maintenance(args: BenchMaintenanceArgs) -> Result<(), CliError> {
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        // Alternate which goes first, so a trend over the run falls on both.
        let order = if round % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            let row = one(round, on, &args).await?;
            if args.json {
                let line = serde_json::to_string(&row)
                    .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
                println!("{line}");
            } else {
                println!(
                    "round {} upkeep {:>3}: {:.1} MB/s, {:.0} records/s ({} segments expired, {:.0} MB scrubbed while measuring)",
                    row.round,
                    row.upkeep,
                    row.mb_per_s,
                    row.records_per_s,
                    row.segments_expired,
                    row.scrub_bytes as f64 / 1e6
                );
            }
            rows.push(row);
        }
    }
    let mean = |upkeep: &str| {
        let values: Vec<f64> = rows
            .iter()
            .filter(|r| r.upkeep == upkeep)
            .map(|r| r.mb_per_s)
            .collect();
        values.iter().sum::<f64>() / values.len().max(1) as f64
    };
    let (off, on) = (mean("off"), mean("on"));
    let ratio = if off > 0.0 { on / off } else { 0.0 };
    if args.json {
        println!(
            "{}",
            serde_json::json!({"summary": true, "off_mb_per_s": off, "on_mb_per_s": on, "ratio": ratio})
        );
    } else {
        println!("mean: off {off:.1} MB/s, on {on:.1} MB/s, ratio on/off {ratio:.2}");
    }
    Ok(())
}
