//! `malachi bench scale`: does one topic's throughput grow with the
//! brokers (issue 38, "Benchmark")? For each broker count of `--brokers`,
//! one after the other, it starts that many brokers (this executable, on
//! loopback, fresh directories under the temporary directory), each in
//! cgroups of its own capping its CPU and its disk writes so that each is
//! a small machine and the brokers, not the bench, are the bottleneck. It
//! creates one topic (three copies), splits it into `--ranges` ranges,
//! prints where the primaries went (ADR 0144 spreads them), and runs keyed
//! producers against it. It reports records/s and MB/s per count and the
//! ratio of the largest count's records/s to the smallest's; with
//! `--rounds N` the counts run in turn N times and the ratio is the median
//! of the rounds' (a busy minute moves one round, not the figure). Nothing
//! is asserted: the figures go to docs/benchmarks.md.

use std::time::{Duration, Instant};

use malachi_bench::peers::ServerGuard;
use malachi_wire::messages::{RangeDescription, TopicDescription};

use super::super::client::print_json;
use super::super::error::CliError;
use super::super::{BenchScaleArgs, OutputArgs};
use super::compare::{
    create_replicated_topic, malachi_cluster_config, start_cluster_within, wait_for_brokers,
};
use super::idle::cpu_ticks;
use super::{CLIENTS_MAX, RECORD_BYTES_MAX, bench_client};

mod auto;
pub mod auto_report;
pub mod cgroup;
mod load;
pub mod report;
mod settle;

use cgroup::{BrokerCgroup, Device, DiskCap};
use report::{ScaleRow, ScaleSummary};

/// RF=3 needs three brokers.
const SCALE_BROKERS_MIN: u64 = 3;
/// The most brokers one count starts.
const SCALE_BROKERS_MAX: u64 = 16;
/// The most ranges the topic is split into.
const SCALE_RANGES_MAX: usize = 256;
/// The most records one batch holds.
const SCALE_BATCH_RECORDS_MAX: usize = 4_096;
/// How long the splits may take.
const SPLIT_WAIT_MS: u64 = 120_000;
/// How often the topic is described while splitting.
const SPLIT_POLL_MS: u64 = 200;
/// How long a broker may take to start.
const START_WAIT_MS: u64 = 60_000;
/// `/proc` counts CPU time in USER_HZ ticks, 100 a second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;
const TOPIC: &str = "scale";
const COPIES: usize = 3;

/// The brokers of one count, and their cgroups. The brokers are declared
/// first so that they are killed before the groups are removed.
struct Cluster {
    brokers: Vec<ServerGuard>,
    groups: Vec<BrokerCgroup>,
}

pub async fn scale(args: BenchScaleArgs) -> Result<(), CliError> {
    let counts = broker_counts(&args.brokers)?;
    let (brokers_min, brokers_max) = (counts[0], counts[counts.len() - 1]);
    let ranges = validate(&args, brokers_max)?;
    let disk = disk_cap(&args);
    let mut summary = ScaleSummary {
        cpu_millis_per_broker: (!args.no_cgroups).then_some(args.cpu_millis_per_broker),
        write_bytes_per_second_per_broker: disk.as_ref().and_then(|d| {
            matches!(d, DiskCap::Device(_)).then_some(args.write_bytes_per_second_per_broker)
        }),
        disk_note: match &disk {
            Some(DiskCap::Unavailable(note)) => Some(note.clone()),
            _ => None,
        },
        brokers_min,
        brokers_max,
        ratio: None,
        round_ratios: Vec::new(),
    };
    eprintln!("{}", report::caps_text(&summary));
    let device = match disk {
        Some(DiskCap::Device(device)) => Some(device),
        _ => None,
    };
    if args.reshape.auto_reshape == Some(true) {
        return auto_reshape(&args, brokers_max, ranges, device).await;
    }
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        for &brokers in &counts {
            let mut row = run_count(&args, brokers, ranges, device).await?;
            row.round = round;
            if args.json {
                print_json(&row)?;
            } else {
                eprintln!("{}", report::row_text(&row));
            }
            rows.push(row);
        }
    }
    summary.round_ratios = report::round_ratios(&rows);
    summary.ratio = report::median(&summary.round_ratios);
    if args.json {
        print_json(&summary)
    } else {
        print!("{}", report::render_text(&summary, &rows));
        Ok(())
    }
}

/// The pre-split topic against a one-range topic reshaping itself, on
/// `brokers` (ADR 0143; issue 38's 90%-within-60-s target).
async fn auto_reshape(
    args: &BenchScaleArgs,
    brokers: u64,
    ranges: usize,
    device: Option<Device>,
) -> Result<(), CliError> {
    let (row, summary) = auto::compare(args, brokers, ranges, device).await?;
    if args.json {
        print_json(&row)?;
        print_json(&summary)
    } else {
        print!("{}", auto_report::render_text(&summary));
        Ok(())
    }
}

/// The counts, smallest first, without repeats, each within bounds.
fn broker_counts(asked: &[u64]) -> Result<Vec<u64>, CliError> {
    let mut counts = asked.to_vec();
    counts.sort_unstable();
    counts.dedup();
    if counts.is_empty()
        || counts
            .iter()
            .any(|n| !(SCALE_BROKERS_MIN..=SCALE_BROKERS_MAX).contains(n))
    {
        return Err(CliError::Bench(format!(
            "--brokers takes counts between {SCALE_BROKERS_MIN} and {SCALE_BROKERS_MAX}, e.g. 3,6"
        )));
    }
    Ok(counts)
}

/// Checks the load flags; returns the range count.
fn validate(args: &BenchScaleArgs, brokers_max: u64) -> Result<usize, CliError> {
    let ranges = args
        .ranges
        .unwrap_or(usize::try_from(brokers_max * 2).unwrap_or(SCALE_RANGES_MAX));
    let checks = [
        (
            ranges == 0 || ranges > SCALE_RANGES_MAX,
            format!("--ranges must be 1 to {SCALE_RANGES_MAX}"),
        ),
        (
            args.producers == 0 || args.producers > CLIENTS_MAX,
            format!("--producers must be 1 to {CLIENTS_MAX}"),
        ),
        (
            args.value_bytes == 0 || args.value_bytes > RECORD_BYTES_MAX,
            format!("--value-bytes must be 1 to {RECORD_BYTES_MAX}"),
        ),
        (
            args.batch_records == 0 || args.batch_records > SCALE_BATCH_RECORDS_MAX,
            format!("--batch-records must be 1 to {SCALE_BATCH_RECORDS_MAX}"),
        ),
        (
            args.window == 0 || args.window > 256,
            "--window must be 1 to 256".to_owned(),
        ),
    ];
    match checks.into_iter().find(|(bad, _)| *bad) {
        Some((_, message)) => Err(CliError::Bench(message)),
        None => Ok(ranges),
    }
}

/// Where the disk cap goes; `None` when none was asked for.
fn disk_cap(args: &BenchScaleArgs) -> Option<DiskCap> {
    if args.no_cgroups || args.write_bytes_per_second_per_broker == 0 {
        return None;
    }
    Some(cgroup::disk_of(&std::env::temp_dir()))
}

/// One broker count: the cluster, the topic, the load, the figures.
async fn run_count(
    args: &BenchScaleArgs,
    brokers: u64,
    ranges: usize,
    device: Option<Device>,
) -> Result<ScaleRow, CliError> {
    let cluster = start(args, brokers, device).await?;
    let output = cluster_output(&cluster, brokers).await?;
    let row = load_presplit(args, &cluster, &output, brokers, ranges).await?;
    drop(cluster);
    Ok(row)
}

/// The client settings for `cluster`, once its brokers all serve.
async fn cluster_output(cluster: &Cluster, brokers: u64) -> Result<OutputArgs, CliError> {
    let addrs: Vec<String> = cluster.brokers.iter().map(|g| g.addr.to_string()).collect();
    let output = OutputArgs {
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: addrs,
        json: true,
        timeout_ms: 30_000,
        tls: Default::default(),
    };
    wait_for_brokers(&output, brokers)
        .await
        .map_err(CliError::Bench)?;
    Ok(output)
}

/// The topic split by hand into `ranges` ranges, loaded for the warmup,
/// then measured.
async fn load_presplit(
    args: &BenchScaleArgs,
    cluster: &Cluster,
    output: &OutputArgs,
    brokers: u64,
    ranges: usize,
) -> Result<ScaleRow, CliError> {
    let split = prepare_topic(output, TOPIC, ranges).await?;
    let after_splits = primaries_per_broker(&split, brokers);
    let settled = settle::balanced(output, TOPIC, brokers, split).await?;
    let described = settled.described;
    let primaries = primaries_per_broker(&described, brokers);
    let balanced = match settled.balanced_after {
        Some(after) => format!("balanced after {:.1} s", after.as_secs_f64()),
        None => format!("not balanced within {} s", settle::BALANCE_WAIT_MS / 1_000),
    };
    eprintln!(
        "{brokers} brokers: topic {TOPIC} has {} active ranges; primaries per broker {after_splits:?} after the splits, {primaries:?} measured ({balanced})",
        described
            .ranges
            .iter()
            .filter(|r| r.state == "active")
            .count(),
    );
    measure_presplit(args, cluster, output, brokers, &described, primaries).await
}

/// The pre-split topic loaded again, as it stands now (after the one-range
/// topic's minute: the baseline's second measurement, so that a cluster
/// that slows as it ages is not counted against reshaping).
async fn load_presplit_again(
    args: &BenchScaleArgs,
    cluster: &Cluster,
    output: &OutputArgs,
    brokers: u64,
) -> Result<ScaleRow, CliError> {
    let client = bench_client(output).await?;
    let described = client
        .describe_topic(TOPIC)
        .await
        .map_err(|e| CliError::Bench(format!("cannot describe {TOPIC}: {e}")))?;
    let primaries = primaries_per_broker(&described, brokers);
    measure_presplit(args, cluster, output, brokers, &described, primaries).await
}

/// Loads the pre-split topic for `--warmup`, then measures it for
/// `--seconds`.
async fn measure_presplit(
    args: &BenchScaleArgs,
    cluster: &Cluster,
    output: &OutputArgs,
    brokers: u64,
    described: &TopicDescription,
    primaries: Vec<usize>,
) -> Result<ScaleRow, CliError> {
    let bands = load::active_bands(described)?;
    let keys = load::keys_by_band(&bands, args.batch_records)?;
    let batches = load::batches(&keys, args.value_bytes)?;
    let shape = load::ScaleLoad {
        topic: TOPIC.to_owned(),
        producers: args.producers,
        window: args.window,
    };
    let mut running = load::start(output, &shape, batches).await?;
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    let before = Usage::sample(cluster);
    running.measure_from_now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let after = Usage::sample(cluster);
    let measured = running.finish().await?;
    Ok(row(
        args,
        brokers,
        bands.len(),
        primaries,
        &measured,
        &before,
        &after,
    ))
}

/// Creates the cgroups (first: a machine that cannot cap fails before
/// any broker starts), then the brokers, each moved into its groups.
async fn start(
    args: &BenchScaleArgs,
    brokers: u64,
    device: Option<Device>,
) -> Result<Cluster, CliError> {
    let mut groups = Vec::new();
    if !args.no_cgroups {
        let disk = device.map(|d| (d, args.write_bytes_per_second_per_broker));
        for node in 1..=brokers {
            let name = cgroup::group_name(std::process::id(), brokers, node);
            groups.push(BrokerCgroup::create(
                &name,
                args.cpu_millis_per_broker,
                disk,
            )?);
        }
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let started = Instant::now();
    let guards = start_cluster_within(
        &exe,
        brokers,
        &malachi_cluster_config(brokers),
        |id| {
            tempfile::Builder::new()
                .prefix(&format!("malachi-scale-{brokers}b-{id}-"))
                .tempdir()
                .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
        },
        Duration::from_millis(START_WAIT_MS),
    )
    .await?;
    let cluster = Cluster {
        brokers: guards,
        groups,
    };
    for (group, broker) in cluster.groups.iter().zip(&cluster.brokers) {
        group.add(broker.pid())?;
    }
    tracing::info!(
        brokers,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "scale bench brokers started"
    );
    Ok(cluster)
}

/// Creates `topic` with three copies and splits its widest range until
/// it has `ranges` active ones, each with its three copies.
async fn prepare_topic(
    output: &OutputArgs,
    topic: &str,
    ranges: usize,
) -> Result<TopicDescription, CliError> {
    create_replicated_topic(output, topic, None)
        .await
        .map_err(CliError::Bench)?;
    let client = bench_client(output).await?;
    let deadline = Instant::now() + Duration::from_millis(SPLIT_WAIT_MS);
    let mut last = String::new();
    loop {
        match client.describe_topic(topic).await {
            Ok(described) => {
                let active: Vec<&RangeDescription> = described
                    .ranges
                    .iter()
                    .filter(|r| r.state == "active")
                    .collect();
                let settled = active.iter().all(|r| {
                    r.segments
                        .last()
                        .is_some_and(|s| s.state == "active" && s.replicas.len() >= COPIES)
                });
                if settled && active.len() >= ranges {
                    return Ok(described);
                }
                if settled
                    && let Some(range) = widest(&active)
                    && let Err(e) = client.split_range(topic, range).await
                {
                    last = format!("split range {range}: {e}");
                }
            }
            Err(e) => last = format!("describe: {e}"),
        }
        if Instant::now() > deadline {
            return Err(CliError::Bench(format!(
                "the topic did not reach {ranges} ranges within {} s: {last}",
                SPLIT_WAIT_MS / 1_000
            )));
        }
        tokio::time::sleep(Duration::from_millis(SPLIT_POLL_MS)).await;
    }
}

/// The id of the active range with the widest band (the lowest id of
/// equals), so the splits keep the bands as even as they can be.
fn widest(active: &[&RangeDescription]) -> Option<u64> {
    let width = |r: &RangeDescription| {
        let bound = |t: &str| u128::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok();
        Some(bound(&r.band_end)?.saturating_sub(bound(&r.band_start)?))
    };
    active
        .iter()
        .filter_map(|r| Some((width(r)?, std::cmp::Reverse(r.id))))
        .max()
        .map(|(_, id)| id.0)
}

/// How many active ranges each broker writes, node 1 first.
fn primaries_per_broker(described: &TopicDescription, brokers: u64) -> Vec<usize> {
    let mut counts = vec![0; usize::try_from(brokers).unwrap_or(0)];
    for range in described.ranges.iter().filter(|r| r.state == "active") {
        let primary = range
            .segments
            .last()
            .and_then(|s| s.primary.or_else(|| s.replicas.first().copied()));
        if let Some(slot) = primary
            .and_then(|p| usize::try_from(p.checked_sub(1)?).ok())
            .and_then(|i| counts.get_mut(i))
        {
            *slot += 1;
        }
    }
    counts
}

/// CPU counters at one instant: each broker's, the groups', the bench's.
struct Usage {
    at: Instant,
    broker_ticks: Vec<u64>,
    /// (periods, throttled periods), summed over the groups.
    throttling: Option<(u64, u64)>,
    bench_ticks: u64,
}

impl Usage {
    fn sample(cluster: &Cluster) -> Usage {
        let throttling = (!cluster.groups.is_empty()).then(|| {
            cluster
                .groups
                .iter()
                .filter_map(BrokerCgroup::throttling)
                .fold((0, 0), |(p, t), (dp, dt)| (p + dp, t + dt))
        });
        Usage {
            at: Instant::now(),
            broker_ticks: cluster
                .brokers
                .iter()
                .map(|b| cpu_ticks(b.pid()).unwrap_or(0))
                .collect(),
            throttling,
            bench_ticks: cpu_ticks(std::process::id()).unwrap_or(0),
        }
    }
}

fn row(
    args: &BenchScaleArgs,
    brokers: u64,
    ranges: usize,
    primaries: Vec<usize>,
    measured: &load::Measured,
    before: &Usage,
    after: &Usage,
) -> ScaleRow {
    let wall = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let percent = |ticks: u64| 100.0 * ticks as f64 / TICKS_PER_SECOND / wall;
    let seconds = measured.seconds.max(1e-9);
    ScaleRow {
        round: 1,
        brokers,
        ranges,
        primaries_per_broker: primaries,
        producers: args.producers,
        value_bytes: args.value_bytes,
        seconds: measured.seconds,
        records: measured.records,
        records_per_s: measured.records as f64 / seconds,
        mb_per_s: (measured.records * args.value_bytes as u64) as f64 / seconds / 1e6,
        p50_us: measured.hist.value_at_quantile(0.50),
        p99_us: measured.hist.value_at_quantile(0.99),
        errors: measured.errors,
        broker_cpu_percent: after
            .broker_ticks
            .iter()
            .zip(&before.broker_ticks)
            .map(|(a, b)| percent(a.saturating_sub(*b)))
            .collect(),
        throttled_share: match (before.throttling, after.throttling) {
            (Some((p0, t0)), Some((p1, t1))) if p1 > p0 => {
                Some(t1.saturating_sub(t0) as f64 / (p1 - p0) as f64)
            }
            _ => None,
        },
        bench_cpu_percent: percent(after.bench_ticks.saturating_sub(before.bench_ticks)),
    }
}
