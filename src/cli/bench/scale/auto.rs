//! `malachi bench scale --auto-reshape true`: on one cluster, the topic
//! split by hand (as the plain bench runs it) and then a one-range topic
//! whose storage policy turns automatic reshaping on (ADR 0143), under the
//! same producers. The one-range topic's keys spread evenly over the
//! keyspace (a batch per 1/[`AUTO_BANDS`] of it, so a split's halves never
//! cut a batch); its throughput is taken every [`WINDOW_SECONDS`] from its
//! first record, with its active ranges and their primaries, and its
//! reshapes are read from `topic describe` at the end. Then the pre-split
//! topic is measured again: the target is 90% of the mean of its two
//! measurements, one before and one after the one-range topic's minute,
//! so that a cluster slowing as it ages (its disk filling, its segments
//! rolling) is not counted against reshaping (ABA).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use malachi_actors::ReshapeDefaults;
use malachi_wire::messages::{PolicyDescription, PolicyReshape};

use super::super::super::error::CliError;
use super::super::super::{BenchScaleArgs, OutputArgs};
use super::super::bench_client;
use super::super::compare::create_replicated_topic;
use super::auto_report::{self, AutoReshape, AutoSettings, AutoSummary, AutoWindow};
use super::report::{ScaleRow, row_text};
use super::{
    Device, cluster_output, load, load_presplit, load_presplit_again, primaries_per_broker, start,
};

const AUTO_TOPIC: &str = "scale-auto";
const AUTO_POLICY: &str = "scale-auto";
/// Equal keyspace bands the one-range topic's batches are built over: as
/// many as the default `ranges_max`, a power of two.
const AUTO_BANDS: u32 = 64;
/// How often the one-range topic's throughput is taken.
pub const WINDOW_SECONDS: u64 = 5;
/// How long the policy may take to be accepted (the `reshape_policy`
/// feature activates itself once every broker advertises it).
const POLICY_WAIT_MS: u64 = 60_000;
const POLICY_POLL_MS: u64 = 500;

/// The pre-split topic's row and the one-range topic's comparison, on one
/// cluster of `brokers`.
pub async fn compare(
    args: &BenchScaleArgs,
    brokers: u64,
    ranges: usize,
    device: Option<Device>,
) -> Result<(ScaleRow, AutoSummary), CliError> {
    let cluster = start(args, brokers, device).await?;
    let output = cluster_output(&cluster, brokers).await?;
    let row = load_presplit(args, &cluster, &output, brokers, ranges).await?;
    eprintln!("{}", row_text(&row));
    let settings = put_policy(&output, args).await?;
    eprintln!("{}", auto_report::settings_text(&settings));
    create_replicated_topic(&output, AUTO_TOPIC, Some(AUTO_POLICY))
        .await
        .map_err(CliError::Bench)?;
    let keys = load::keys_by_band(&load::equal_bands(AUTO_BANDS), args.batch_records)?;
    let batches = load::batches(&keys, args.value_bytes)?;
    let shape = load::ScaleLoad {
        topic: AUTO_TOPIC.to_owned(),
        producers: args.producers,
        window: args.window,
    };
    let started_ms = wall_ms();
    let mut running = load::start(&output, &shape, batches).await?;
    running.measure_from_now();
    let windows = windows(args, &output, &running, brokers).await?;
    running.finish().await?;
    let reshapes = reshapes(&output, started_ms).await;
    let again = load_presplit_again(args, &cluster, &output, brokers).await?;
    eprintln!("again, after the one-range topic: {}", row_text(&again));
    drop(cluster);
    let reference = auto_report::reference(row.records_per_s, again.records_per_s);
    let target = auto_report::target(reference);
    let summary = AutoSummary {
        brokers,
        presplit_ranges: row.ranges,
        presplit_records_per_s: row.records_per_s,
        presplit_again_records_per_s: again.records_per_s,
        reference_records_per_s: reference,
        target_records_per_s: target,
        settings,
        reached_at_s: auto_report::reached_at(&windows, target),
        windows,
        reshapes,
    };
    Ok((row, summary))
}

/// Defines the one-range topic's policy: reshaping on, with the flags'
/// settings; returns the settings in force (unset ones are the brokers').
async fn put_policy(output: &OutputArgs, args: &BenchScaleArgs) -> Result<AutoSettings, CliError> {
    let reshape = PolicyReshape {
        auto_reshape: Some(true),
        ..args.reshape.to_wire().unwrap_or_default()
    };
    let defaults = ReshapeDefaults::default();
    let settings = AutoSettings {
        split_write_bytes_per_second: reshape
            .split_write_bytes_per_second
            .unwrap_or(defaults.split_write_bytes_per_second),
        split_after_ms: reshape.split_after_ms.unwrap_or(defaults.split_after_ms),
        reshape_interval_ms: reshape
            .reshape_interval_ms
            .unwrap_or(defaults.reshape_interval_ms),
        ranges_max: reshape.ranges_max.unwrap_or(defaults.ranges_max),
        rate_window_ms: defaults.rate_window_ms,
    };
    let client = bench_client(output).await?;
    let deadline = Instant::now() + Duration::from_millis(POLICY_WAIT_MS);
    loop {
        let policy = PolicyDescription {
            name: AUTO_POLICY.into(),
            reshape: Some(reshape),
            ..PolicyDescription::default()
        };
        match client.put_policy(policy).await {
            Ok(_) => return Ok(settings),
            Err(e) if Instant::now() > deadline => {
                return Err(CliError::Bench(format!(
                    "the reshaping policy was not accepted within {} s: {e}",
                    POLICY_WAIT_MS / 1_000
                )));
            }
            Err(e) => tracing::debug!(error = %e, "policy not accepted yet"),
        }
        tokio::time::sleep(Duration::from_millis(POLICY_POLL_MS)).await;
    }
}

/// The one-range topic's windows over `args.auto_seconds`, each printed
/// as it ends.
async fn windows(
    args: &BenchScaleArgs,
    output: &OutputArgs,
    running: &load::Running,
    brokers: u64,
) -> Result<Vec<AutoWindow>, CliError> {
    let client = bench_client(output).await?;
    let started = tokio::time::Instant::now();
    let count = args.auto_seconds.div_ceil(WINDOW_SECONDS);
    let mut windows = Vec::new();
    let (mut acked, mut errors, mut at) = (0, 0, 0.0);
    for n in 1..=count {
        tokio::time::sleep_until(started + Duration::from_secs(n * WINDOW_SECONDS)).await;
        let (now_acked, now_errors) = (running.acked(), running.errors());
        let end_s = started.elapsed().as_secs_f64();
        let seconds = (end_s - at).max(1e-9);
        let records = now_acked.saturating_sub(acked);
        let (active_ranges, primaries_per_broker) = match client.describe_topic(AUTO_TOPIC).await {
            Ok(d) => (
                d.ranges.iter().filter(|r| r.state == "active").count(),
                primaries_per_broker(&d, brokers),
            ),
            Err(e) => {
                tracing::debug!(error = %e, "describe failed during the load");
                (0, Vec::new())
            }
        };
        let window = AutoWindow {
            end_s,
            records_per_s: records as f64 / seconds,
            mb_per_s: (records * args.value_bytes as u64) as f64 / seconds / 1e6,
            active_ranges,
            primaries_per_broker,
            errors: now_errors.saturating_sub(errors),
        };
        eprintln!("{}", auto_report::window_text(&window));
        windows.push(window);
        (acked, errors, at) = (now_acked, now_errors, end_s);
    }
    Ok(windows)
}

/// The one-range topic's automatic reshapes, from a live describe (every
/// primary's history, ADR 0143), timed from `started_ms`.
async fn reshapes(output: &OutputArgs, started_ms: u64) -> Vec<AutoReshape> {
    let described = match bench_client(output).await {
        Ok(client) => client.describe_topic_live(AUTO_TOPIC).await.ok(),
        Err(_) => None,
    };
    let history = described
        .and_then(|d| d.reshaping)
        .map(|r| r.history)
        .unwrap_or_default();
    history
        .into_iter()
        .map(|e| AutoReshape {
            at_s: e.at_ms.saturating_sub(started_ms) as f64 / 1_000.0,
            kind: e.kind,
            ranges: e.ranges,
            children: e.children,
            refused: e.refused,
        })
        .collect()
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
