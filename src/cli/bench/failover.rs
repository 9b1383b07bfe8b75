//! `malachi bench failover`: how long a topic's writes stop when its
//! primary is SIGKILLed or SIGSTOPped (issue 19, ADR 0106; the pause, issue
//! 36, ADR 0125). Each trial starts three brokers with the default
//! membership timings, creates a topic (three copies), keeps one-record
//! produces going through a broker that stays up, kills or pauses the
//! segment's primary and times the fault to the first produce acknowledged
//! after it. A paused primary is resumed after `--pause-for`; a trial whose
//! writes came back only then took the whole pause. Each trial also counts
//! false suspicions: membership `Suspect` events, in the logs of the
//! brokers not faulted, of a broker that was not faulted. Nothing is asserted here: the target (p99
//! at most 2 s) lives in docs/benchmarks.md.

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
/// The load producers' batches.
const LOAD_BATCH_RECORDS: usize = 64;
const LOAD_RECORD_BYTES: usize = 512;

/// What the trial does to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL: the process is gone, its sockets refuse at once.
    Kill,
    /// SIGSTOP, then SIGCONT after `--pause-for`: the process holds its
    /// sockets open and answers nothing while paused.
    Pause,
}

impl Fault {
    fn verb(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILLed",
            Fault::Pause => "SIGSTOPped",
        }
    }
}

/// The figures of a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailoverBenchRow {
    pub fault: Fault,
    pub trials: u32,
    /// Trials whose writes came back within the wait.
    pub recovered: u32,
    /// From the SIGKILL to the first acknowledged produce, in ms.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub samples_ms: Vec<f64>,
    /// From the fault to the metadata's seal (the failover itself, with no
    /// client in it), in ms: p50, p99 and every sample.
    pub failover_p50_ms: Option<f64>,
    pub failover_p99_ms: Option<f64>,
    pub failover_samples_ms: Vec<f64>,
    /// Paused trials whose writes came back only once the primary resumed.
    pub after_resume: u32,
    /// Membership `Suspect` events of brokers that were not faulted, over
    /// every trial (each broker's log, each event once per logging broker).
    pub false_suspicions: u64,
}

/// What one trial measured.
struct Trial {
    /// From the fault to the first acknowledged produce; `None` when
    /// writes never came back within the wait.
    took: Option<Duration>,
    /// From the fault to the metadata showing the segment sealed (a
    /// survivor's describe), whatever the client saw.
    failed_over: Option<Duration>,
    after_resume: bool,
    false_suspicions: u64,
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
    let mut failovers = Vec::new();
    let (mut after_resume, mut false_suspicions) = (0u32, 0u64);
    for trial in 1..=args.trials {
        let result = one_trial(&exe, &args).await?;
        after_resume += u32::from(result.after_resume);
        false_suspicions += result.false_suspicions;
        let failover_ms = result.failed_over.map(|d| d.as_secs_f64() * 1_000.0);
        failovers.extend(failover_ms);
        match result.took {
            Some(took) => {
                let ms = took.as_secs_f64() * 1_000.0;
                if !args.json {
                    let resumed = if result.after_resume {
                        ", after the resume"
                    } else {
                        ""
                    };
                    let sealed = failover_ms.map_or("-".to_owned(), |ms| format!("{ms:.0} ms"));
                    eprintln!(
                        "trial {trial}: {ms:.0} ms{resumed} (sealed after {sealed}), {} false suspicions",
                        result.false_suspicions
                    );
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
    let mut sorted_failovers = failovers.clone();
    sorted_failovers.sort_by(f64::total_cmp);
    let row = FailoverBenchRow {
        fault: args.fault,
        trials: args.trials,
        recovered: u32::try_from(sorted.len()).unwrap_or(u32::MAX),
        p50_ms: percentile(&sorted, 0.50),
        p99_ms: percentile(&sorted, 0.99),
        max_ms: sorted.last().copied(),
        samples_ms: samples,
        failover_p50_ms: percentile(&sorted_failovers, 0.50),
        failover_p99_ms: percentile(&sorted_failovers, 0.99),
        failover_samples_ms: failovers,
        after_resume,
        false_suspicions,
    };
    if args.json {
        let line = serde_json::to_string(&row)
            .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
        println!("{line}");
    } else {
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
        println!(
            "primary {} to first acknowledged produce, {} of {} trials: p50 {}, p99 {}, max {}; to the recorded seal: p50 {}, p99 {}; {} after the resume; {} false suspicions",
            row.fault.verb(),
            row.recovered,
            row.trials,
            ms(row.p50_ms),
            ms(row.p99_ms),
            ms(row.max_ms),
            ms(row.failover_p50_ms),
            ms(row.failover_p99_ms),
            row.after_resume,
            row.false_suspicions
        );
    }
    Ok(())
}

/// One cluster, one fault.
async fn one_trial(exe: &std::path::Path, args: &BenchFailoverArgs) -> Result<Trial, CliError> {
    let (fault, pause_for) = (args.fault, args.pause_for);
    let mut config = malachi_cluster_config(BROKERS);
    if let Some(period) = args.probe_period_ms {
        // The default round trip (300 ms), kept below the period.
        let rtt = (period * 3 / 5).min(300);
        config = config.replacen(
            "[membership]\n",
            &format!("[membership]\nprobe_period_ms = {period}\nprobe_rtt_ms = {rtt}\n"),
            1,
        );
    }
    let bench = |what: &str, e: &dyn std::fmt::Display| CliError::Bench(format!("{what}: {e}"));
    // A port picked free may be taken by another process before the broker
    // binds it (a shared machine): such a start is tried again.
    let mut started = Err(CliError::Bench("never started".into()));
    for _ in 0..START_ATTEMPTS {
        started = start_cluster_within(
            exe,
            BROKERS,
            &config,
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
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![guards[i].addr.to_string()],
        json: true,
        timeout_ms,
        tls: Default::default(),
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
    let (primary, active) = described
        .ranges
        .first()
        .and_then(|r| r.segments.last())
        .and_then(|s| Some((*s.replicas.first()?, s.id)))
        .ok_or_else(|| CliError::Bench("the topic has no segment".into()))?;
    let load = start_load(&admin, &output(0, 10_000), args.load_producers).await?;
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
    let pid = guards[victim].pid();
    let watch = output(survivor, PROBE_TIMEOUT_MS);
    match fault {
        Fault::Kill => guards[victim].kill_now(),
        Fault::Pause => signal(pid, "STOP")?,
    }
    let faulted = Instant::now();
    let watcher = tokio::spawn(watch_failover(watch, active));
    let resume_at = faulted + pause_for;
    let mut resumed = fault == Fault::Kill;
    let deadline = faulted + Duration::from_millis(RECOVERY_WAIT_MS);
    let mut took = None;
    // A produce in flight at the fault may still be acknowledged by the
    // primary just before it stopped: only one sent after it counts.
    while Instant::now() < deadline {
        if !resumed && Instant::now() >= resume_at {
            signal(pid, "CONT")?;
            resumed = true;
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_millis(PROBE_TIMEOUT_MS),
            client.produce("failover", batch.clone()),
        )
        .await;
        if matches!(answer, Ok(Ok(_))) && sent > faulted {
            took = Some(faulted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
    for producer in load {
        producer.abort();
    }
    let after_resume = fault == Fault::Pause && resumed;
    if !resumed {
        signal(pid, "CONT")?;
    }
    let failed_over = if took.is_some() {
        // Writes came back: the metadata has the successor, or has it
        // within a poll (a resumed primary's writes need no failover).
        tokio::time::timeout(Duration::from_millis(PROBE_TIMEOUT_MS * 2), watcher)
            .await
            .ok()
            .and_then(Result::ok)
            .map(|at| at.saturating_duration_since(faulted))
    } else {
        watcher.abort();
        None
    };
    // The faulted broker's own log is left out: a broker resumed from a
    // pause finds every timer expired and suspects its peers for a moment.
    let false_suspicions = guards
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, g)| false_suspicions(&g.log_text(), primary))
        .sum();
    Ok(Trial {
        took,
        failed_over,
        after_resume,
        false_suspicions,
    })
}

/// Starts `producers` tasks producing to a topic of their own, errors
/// ignored, until aborted: load on every broker through the fault.
async fn start_load(
    admin: &malachi_wire::Client,
    output: &OutputArgs,
    producers: u32,
) -> Result<Vec<tokio::task::JoinHandle<()>>, CliError> {
    if producers == 0 {
        return Ok(Vec::new());
    }
    let deadline = Instant::now() + Duration::from_millis(CREATE_WAIT_MS);
    while let Err(e) = admin.create_topic("load", Some(3), None).await {
        if Instant::now() > deadline {
            return Err(CliError::Bench(format!("create the load topic: {e}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let value = "v".repeat(LOAD_RECORD_BYTES);
    let records: Vec<Record> = (0..LOAD_BATCH_RECORDS)
        .map(|i| Record::new(format!("k{i}"), value.clone()))
        .collect();
    let batch = RecordBatch::from_records(records.iter(), 1 << 20)
        .map_err(|e| CliError::Bench(format!("encode the load batch: {e}")))?;
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let client = connect(output).await?;
        let batch = batch.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                if client.produce("load", batch.clone()).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
                }
            }
        }));
    }
    Ok(tasks)
}

/// Polls a survivor's describe until segment `active` is no longer the
/// range's active one, and returns when it saw that. A fresh client each
/// poll: one that remembered where the topic lived would ask the faulted
/// broker again.
async fn watch_failover(output: OutputArgs, active: u64) -> Instant {
    loop {
        if let Ok(client) = connect(&output).await
            && let Ok(Ok(topic)) = tokio::time::timeout(
                Duration::from_millis(PROBE_TIMEOUT_MS),
                client.describe_topic("failover"),
            )
            .await
            && topic
                .ranges
                .iter()
                .filter_map(|r| r.segments.last())
                .all(|s| s.id != active)
        {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(PROBE_EVERY_MS)).await;
    }
}

/// Sends `SIG<name>` to `pid` with kill(1).
fn signal(pid: u32, name: &str) -> Result<(), CliError> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| CliError::Bench(format!("cannot run kill -{name}: {e}")))?;
    if !status.success() {
        return Err(CliError::Bench(format!(
            "kill -{name} {pid} failed: {status}"
        )));
    }
    Ok(())
}

/// Membership `Suspect` events in one broker's log of brokers other than
/// `faulted` (the membership line: `membership node_id=N ... event=Suspect`,
/// colour codes stripped).
fn false_suspicions(log: &str, faulted: u64) -> u64 {
    let faulted = format!("node_id={faulted} ");
    log.lines()
        .map(strip_ansi)
        .filter(|line| line.contains(" membership ") && line.contains("event=Suspect"))
        .filter(|line| line.contains("node_id=") && !line.contains(&faulted))
        .count() as u64
}

/// The line without ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
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
    fn a_suspicion_of_another_broker_than_the_faulted_one_is_false() {
        let log = "\
2026-12-05T15:00:00Z  INFO malachi_membership::core: membership node_id=2 incarnation=0 event=Suspect
2026-12-05T15:00:01Z  INFO malachi_membership::core: membership node_id=1 incarnation=0 event=Suspect
2026-12-05T15:00:02Z  INFO malachi_membership::core: membership node_id=3 incarnation=1 event=Alive
2026-12-05T15:00:03Z  INFO malachi_membership::core: \u{1b}[3mmembership\u{1b}[0m \u{1b}[3mnode_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m3 \u{1b}[3mevent\u{1b}[0m\u{1b}[2m=\u{1b}[0mSuspect";
        assert_eq!(false_suspicions(log, 2), 2);
        assert_eq!(false_suspicions(log, 1), 2);
        assert_eq!(false_suspicions(log, 3), 2);
        assert_eq!(false_suspicions("", 1), 0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), Some(10.0));
        assert_eq!(percentile(&sorted, 0.99), Some(20.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
