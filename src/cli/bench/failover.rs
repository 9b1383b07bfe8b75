//! `malachi bench failover`: how long a topic's writes stop when its
//! primary is SIGKILLed (issue 19, ADR 0106). Each trial starts three
//! brokers with the default membership timings, creates a topic (three
//! copies), keeps one-record produces going through a broker that stays
//! up, SIGKILLs the segment's primary and times the kill to the first
//! produce acknowledged after it. Nothing is asserted here: the target
//! (p99 at most 5 s) lives in docs/benchmarks.md.

use std::time::{Duration, Instant};

use malachi_wire::batch::{Record, RecordBatch};
use serde::Serialize;

use super::super::client::connect;
use super::super::error::CliError;
use super::super::{BenchFailoverArgs, OutputArgs};
use super::compare::{malachi_cluster_config, start_cluster_within, wait_for_brokers};

/// The most trials one run makes.
const TRIALS_MAX: u32 = 200;
/// How long one trial waits for a produce to be acknowledged after the kill.
const RECOVERY_WAIT_MS: u64 = 60_000;
/// How long the topic creation may take on a fresh cluster.
const CREATE_WAIT_MS: u64 = 60_000;
/// The pause between two probe produces.
const PROBE_EVERY_MS: u64 = 50;
/// How long one probe produce may take.
const PROBE_TIMEOUT_MS: u64 = 1_000;
const BROKERS: u64 = 3;
/// Starts of one trial's cluster before it gives up.
const START_ATTEMPTS: u32 = 3;

/// The figures of a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailoverBenchRow {
    pub trials: u32,
    /// Trials whose writes came back within the wait.
    pub recovered: u32,
    /// From the SIGKILL to the first acknowledged produce, in ms.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub samples_ms: Vec<f64>,
}

pub async fn failover(args: BenchFailoverArgs) -> Result<(), CliError> {
    if args.trials == 0 || args.trials > TRIALS_MAX {
        return Err(CliError::Bench(format!(
            "--trials must be between 1 and {TRIALS_MAX}"
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let mut samples = Vec::new();
    for trial in 1..=args.trials {
        match one_trial(&exe).await? {
            Some(took) => {
                let ms = took.as_secs_f64() * 1_000.0;
                if !args.json {
                    eprintln!("trial {trial}: {ms:.0} ms");
                }
                samples.push(ms);
            }
            None => {
                eprintln!("trial {trial}: no produce acknowledged within {RECOVERY_WAIT_MS} ms")
            }
        }
    }
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let row = FailoverBenchRow {
        trials: args.trials,
        recovered: u32::try_from(sorted.len()).unwrap_or(u32::MAX),
        p50_ms: percentile(&sorted, 0.50),
        p99_ms: percentile(&sorted, 0.99),
        max_ms: sorted.last().copied(),
        samples_ms: samples,
    };
    if args.json {
        let line = serde_json::to_string(&row)
            .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
        println!("{line}");
    } else {
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
        println!(
            "primary SIGKILLed to first acknowledged produce, {} of {} trials: p50 {}, p99 {}, max {}",
            row.recovered,
            row.trials,
            ms(row.p50_ms),
            ms(row.p99_ms),
            ms(row.max_ms)
        );
    }
    Ok(())
}

/// One cluster, one kill; `None` when writes never came back.
async fn one_trial(exe: &std::path::Path) -> Result<Option<Duration>, CliError> {
    let bench = |what: &str, e: &dyn std::fmt::Display| CliError::Bench(format!("{what}: {e}"));
    // A port picked free may be taken by another process before the broker
    // binds it (a shared machine): such a start is tried again.
    let mut started = Err(CliError::Bench("never started".into()));
    for _ in 0..START_ATTEMPTS {
        started = start_cluster_within(
            exe,
            BROKERS,
            &malachi_cluster_config(BROKERS),
            |id| {
                tempfile::Builder::new()
                    .prefix(&format!("malachi-failover-{id}-"))
                    .tempdir()
                    .map_err(|e| CliError::Bench(format!("cannot create a directory: {e}")))
            },
            Duration::from_secs(30),
        )
        .await;
        match &started {
            Err(CliError::Bench(reason)) if reason.contains("Address already in use") => {
                eprintln!("a start lost its port to another process; starting again");
            }
            _ => break,
        }
    }
    let mut guards = started?;
    let output = |i: usize, timeout_ms: u64| OutputArgs {
        broker: guards[i].addr.to_string(),
        json: true,
        timeout_ms,
    };
    wait_for_brokers(&output(0, 10_000), BROKERS)
        .await
        .map_err(CliError::Bench)?;
    let admin = connect(&output(0, 10_000)).await?;
    let deadline = Instant::now() + Duration::from_millis(CREATE_WAIT_MS);
    loop {
        match admin.create_topic("failover", Some(3), None).await {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => return Err(bench("create topic", &e)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let described = admin
        .describe_topic("failover")
        .await
        .map_err(|e| bench("describe", &e))?;
    let primary = described
        .ranges
        .first()
        .and_then(|r| r.segments.last())
        .and_then(|s| s.replicas.first().copied())
        .ok_or_else(|| CliError::Bench("the topic has no segment".into()))?;
    drop(admin);
    let victim = usize::try_from(primary.saturating_sub(1)).unwrap_or(0);
    let survivor = (0..guards.len()).find(|i| *i != victim).unwrap_or(0);
    let client = connect(&output(survivor, PROBE_TIMEOUT_MS)).await?;
    let record = Record::new("bench", "failover");
    let batch =
        RecordBatch::from_records([&record], 1 << 20).map_err(|e| bench("encode a record", &e))?;
    // Writes flow before the kill.
    let warm = Instant::now() + Duration::from_secs(10);
    while client.produce("failover", batch.clone()).await.is_err() {
        if Instant::now() > warm {
            return Err(CliError::Bench("produces fail before the kill".into()));
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
    guards[victim].kill_now();
    let killed = Instant::now();
    let deadline = killed + Duration::from_millis(RECOVERY_WAIT_MS);
    // A produce in flight at the kill may still be acknowledged by the
    // primary just before it died: only one sent after the kill counts.
    while Instant::now() < deadline {
        let sent = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_millis(PROBE_TIMEOUT_MS),
            client.produce("failover", batch.clone()),
        )
        .await;
        if matches!(answer, Ok(Ok(_))) && sent > killed {
            return Ok(Some(killed.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
    Ok(None)
}

/// The `q` quantile of sorted samples (nearest rank), `None` when empty.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), Some(10.0));
        assert_eq!(percentile(&sorted, 0.99), Some(20.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
