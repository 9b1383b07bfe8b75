//! `malachi bench heal`: what healing a gone broker's copies costs (issue
//! 19, ADR 0106). Four brokers (`replace_after_ms` at its 5 s minimum),
//! three copies per segment: it fills a topic for `--fill`, seals its
//! segment (a range split), measures producer throughput on a second topic
//! without a heal, SIGKILLs a holder of the sealed segment, and measures the
//! same producer load again while the healer re-creates that copy on the
//! fourth broker. It reports the heal's own rate (bytes over elapsed, from
//! the healing broker's `segment copy healed` line), the disk's raw
//! durable write rate for comparison, and both producer throughputs.
//! Nothing is asserted: the figures go to docs/benchmarks.md.

use std::time::{Duration, Instant};

use malachi_bench::peers::ServerGuard;
use malachi_wire::messages::SegmentDescription;
use serde::Serialize;

use super::super::client::connect;
use super::super::error::CliError;
use super::super::{BenchHealArgs, OutputArgs};
use super::compare::{malachi_cluster_config, start_cluster_within, wait_for_brokers};
use super::{ProduceLoad, produce_load, raw_disk};

const BROKERS: u64 = 4;
/// How long the bench waits for the heal to be recorded after the kill.
const HEAL_WAIT_MS: u64 = 300_000;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HealBenchRow {
    /// Bytes of the last sealed segment of the fill.
    pub segment_bytes: u64,
    /// Copies healed, and their bytes in all.
    pub copies_healed: usize,
    pub healed_bytes: u64,
    /// One heal's rate (the median over the copies): bytes copied over its
    /// elapsed time, paced at most to `HEAL_BYTES_PER_SECOND`.
    pub heal_mb_per_s: Option<f64>,
    /// The disk's raw durable write rate, one file, 1 MiB writes.
    pub raw_disk_mb_per_s: f64,
    /// From the kill to every copy on the victim replaced.
    pub kill_to_healed_ms: f64,
    pub produce_without_heal_mb_per_s: f64,
    pub produce_during_heal_mb_per_s: f64,
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

pub async fn heal(args: BenchHealArgs) -> Result<(), CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let config = format!(
        "{}replace_after_ms = 5000\n",
        malachi_cluster_config(BROKERS)
    );
    let mut guards = start_cluster_within(
        &exe,
        BROKERS,
        &config,
        |id| {
            tempfile::Builder::new()
                .prefix(&format!("malachi-heal-{id}-"))
                .tempdir()
                .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
        },
        Duration::from_secs(30),
    )
    .await?;
    let addrs: Vec<String> = guards.iter().map(|g| g.addr.to_string()).collect();
    let output = |i: usize| OutputArgs {
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![addrs[i].clone()],
        json: true,
        timeout_ms: 10_000,
        tls: Default::default(),
    };
    wait_for_brokers(&output(0), BROKERS)
        .await
        .map_err(CliError::Bench)?;
    let admin = connect(&output(0)).await?;
    let sealed = fill_and_seal(&admin, &output(0), args.fill).await?;
    // The load topic, and its primary, which must stay up.
    let measure = Duration::from_secs(args.measure.as_secs().max(1));
    let without = produce_load(&output(0), &load("heal-load", measure), true)
        .await?
        .0;
    let load_primary = admin
        .describe_topic("heal-load")
        .await
        .map_err(|e| bench("describe", &e))?
        .ranges
        .first()
        .and_then(|r| r.segments.last())
        .and_then(|s| s.replicas.first().copied())
        .unwrap_or(0);
    let victim = sealed
        .replicas
        .iter()
        .copied()
        .find(|n| *n != load_primary && *n != 1)
        .ok_or_else(|| CliError::Bench("no holder to kill".into()))?;
    drop(admin);
    let victim_index = usize::try_from(victim - 1).unwrap_or(0);
    let survivor = (0..guards.len()).find(|i| *i != victim_index).unwrap_or(0);
    guards[victim_index].kill_now();
    let killed = Instant::now();
    // The heal starts once the victim has been gone `replace_after_ms`.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let during_load = load("heal-load", measure);
    let during = produce_load(&output(survivor), &during_load, true).await?.0;
    let watcher = connect(&output(survivor)).await?;
    let kill_to_healed_ms = wait_for_heals(&watcher, victim, killed).await?;
    let heals = heal_figures(&guards, victim_index);
    let mut rates: Vec<f64> = heals
        .iter()
        .filter(|(bytes, _)| *bytes > 0.0)
        .map(|(bytes, ms)| bytes / 1e6 / (ms / 1_000.0).max(1e-3))
        .collect();
    rates.sort_by(f64::total_cmp);
    let raw_dir = tempfile::Builder::new()
        .prefix("malachi-heal-raw-")
        .tempdir()
        .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))?;
    let raw = raw_disk(raw_dir.path(), 1, 1 << 20, Duration::from_secs(3), true)?;
    let row = HealBenchRow {
        segment_bytes: sealed.bytes.unwrap_or(0),
        copies_healed: heals.len(),
        healed_bytes: heals.iter().map(|(b, _)| *b as u64).sum::<u64>(),
        heal_mb_per_s: rates.get(rates.len() / 2).copied(),
        raw_disk_mb_per_s: raw.mb_per_s,
        kill_to_healed_ms,
        produce_without_heal_mb_per_s: without.mb_per_s(),
        produce_during_heal_mb_per_s: during.mb_per_s(),
    };
    print_row(&row, args.json)
}

fn bench(what: &str, e: &dyn std::fmt::Display) -> CliError {
    CliError::Bench(format!("{what}: {e}"))
}

/// The fill: one segment of `fill` worth of records on `heal-fill`, then
/// sealed by a split of its range. Returns the sealed segment.
async fn fill_and_seal(
    admin: &malachi_wire::Client,
    output: &OutputArgs,
    fill: Duration,
) -> Result<SegmentDescription, CliError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = admin.create_topic("heal-fill", Some(3), None).await {
        if Instant::now() > deadline {
            return Err(bench("create topic", &e));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    produce_load(output, &load("heal-fill", fill), true).await?;
    let described = admin
        .describe_topic("heal-fill")
        .await
        .map_err(|e| bench("describe", &e))?;
    let range = described
        .ranges
        .first()
        .ok_or_else(|| CliError::Bench("the topic has no range".into()))?;
    let sealed_id = range
        .segments
        .last()
        .map(|s| s.id)
        .ok_or_else(|| CliError::Bench("the range has no segment".into()))?;
    admin
        .split_range("heal-fill", range.id)
        .await
        .map_err(|e| bench("split", &e))?;
    admin
        .describe_topic("heal-fill")
        .await
        .map_err(|e| bench("describe", &e))?
        .ranges
        .iter()
        .flat_map(|r| r.segments.clone())
        .find(|s| s.id == sealed_id)
        .ok_or_else(|| CliError::Bench("the sealed segment is gone".into()))
}

/// Waits until no sealed segment of `heal-fill` names the victim (a fill
/// rolls several segments, and each had a copy there). Returns the time
/// from the kill, in milliseconds.
async fn wait_for_heals(
    watcher: &malachi_wire::Client,
    victim: u64,
    killed: Instant,
) -> Result<f64, CliError> {
    let deadline = killed + Duration::from_millis(HEAL_WAIT_MS);
    loop {
        let segments: Vec<Vec<u64>> = watcher
            .describe_topic("heal-fill")
            .await
            .map(|t| {
                t.ranges
                    .iter()
                    .flat_map(|r| r.segments.iter())
                    .filter(|s| s.state == "sealed")
                    .map(|s| s.replicas.clone())
                    .collect()
            })
            .unwrap_or_default();
        if !segments.is_empty() && segments.iter().all(|r| !r.contains(&victim)) {
            return Ok(killed.elapsed().as_secs_f64() * 1_000.0);
        }
        if Instant::now() > deadline {
            return Err(CliError::Bench("the heals were never all recorded".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each heal's own figures (bytes, elapsed milliseconds), from the
/// healing brokers' `segment copy healed` log lines.
fn heal_figures(guards: &[ServerGuard], victim_index: usize) -> Vec<(f64, f64)> {
    guards
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim_index)
        .flat_map(|(_, g)| {
            g.log_text()
                .lines()
                .filter(|l| l.contains("segment copy healed"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|line| {
            let field = |name: &str| -> Option<f64> {
                let at = line.find(&format!(" {name}="))? + name.len() + 2;
                line[at..]
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            };
            Some((field("bytes")?, field("elapsed_ms")?))
        })
        .collect()
}

fn print_row(row: &HealBenchRow, json: bool) -> Result<(), CliError> {
    if json {
        let line = serde_json::to_string(row)
            .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
        println!("{line}");
    } else {
        println!(
            "healed {} copies, {:.0} MB: {} a copy (raw disk {:.0} MB/s), all recorded {:.1} s after the kill; produce {:.0} MB/s without a heal, {:.0} MB/s during it",
            row.copies_healed,
            row.healed_bytes as f64 / 1e6,
            row.heal_mb_per_s
                .map_or("rate unknown".to_owned(), |r| format!("{r:.0} MB/s")),
            row.raw_disk_mb_per_s,
            row.kill_to_healed_ms / 1_000.0,
            row.produce_without_heal_mb_per_s,
            row.produce_during_heal_mb_per_s
        );
    }
    Ok(())
}
