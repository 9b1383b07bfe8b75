//! `malachi-chaos-driver`: the workload of a chaos run (issue 20). It runs
//! against a list of brokers' client addresses and writes the run's history
//! in the format `malachi-chaos-check` judges (`chaos/README.md`):
//!
//! - it creates the topic (replication factor 3 by default);
//! - `--producers` producers (`p0`, `p1`, ...) each write their own keys'
//!   sequences, value `"key:seq"`, at a bounded rate and window;
//! - consumer `live` reads from the start for the whole run, and consumer
//!   `resumer` does too, going back to an old saved cursor every
//!   `--resume-every-ms`;
//! - at the end (`--duration-s`, or the runner's `final` command) the
//!   producers stop and drain; then `live` reads on to the end of the log
//!   and logs `final_read` for its pass, the resumer stops, and consumer
//!   `final` reads the log afresh from the start to its end and logs
//!   `final_read`; then one fresh reader per broker, `final-b1` for the
//!   first of `--brokers` and so on, each starting at that broker alone
//!   (following only the hints its answers give), does the same, all at
//!   once.
//!
//! With `--control-stdin` the runner sends its nemesis, heal, reconverged
//! and copies events on stdin and the driver stamps and logs them
//! (`control.rs`). The driver prints JSON lines on stdout for the runner:
//! `{"event":"ready"}` once the topic exists, `{"event":"stats",...}` every
//! `--stats-every-ms`, `{"event":"final_done",...}` after the final read,
//! and `{"event":"summary",...}` last. Diagnostics go to stderr, with the
//! wire client's logs as `RUST_LOG` selects them.
//!
//! Exit codes: 0 the run ended with every final read complete; 4 a final
//! read did not reach the end of the log (the history then has no
//! `final_read` of that reader; the runner reports it as an anomaly of its
//! own); 1 the driver could not run (no broker, no topic, a
//! history it could not write).

mod brokers;
mod consumer;
mod control;
mod error;
mod history;
mod producer;
mod stats;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use malachi_wire::ErrorCode;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use brokers::Brokers;
use consumer::{ConsumerSettings, FinalOutcome, Role};
use control::Control;
use error::DriverError;
use history::History;
use producer::ProducerSettings;
use stats::Stats;

/// Exit code when the final read did not reach the end of the log.
const EXIT_FINAL_INCOMPLETE: u8 = 4;
/// Control lines buffered between the stdin thread and the run.
const CONTROL_QUEUE_MAX: usize = 1_024;
/// How often buffered history lines are pushed to the file.
const FLUSH_EVERY_MS: u64 = 1_000;

/// Drive a chaos run's workload and write its history.
#[derive(Debug, Parser)]
#[command(name = "malachi-chaos-driver", version)]
struct Cli {
    /// The brokers' client addresses (repeat, or separate with commas).
    #[arg(long, value_delimiter = ',', required = true)]
    brokers: Vec<String>,
    /// The history file to write (JSON Lines).
    #[arg(long)]
    history: PathBuf,
    /// The topic the run writes (created at the start).
    #[arg(long, default_value = "chaos")]
    topic: String,
    #[arg(long, default_value_t = 3)]
    replication_factor: u8,
    /// How long the workload runs before the final read, unless the runner
    /// sends `final` first (then this is only an upper bound).
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    #[arg(long, default_value_t = 3)]
    producers: usize,
    #[arg(long, default_value_t = 4)]
    keys_per_producer: usize,
    /// Records per second each producer offers.
    #[arg(long, default_value_t = 50)]
    rate_per_producer: u64,
    /// Produce requests (one record each) in flight per producer.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// One request's timeout in the client (a paused or partitioned broker
    /// costs this much before the client moves on).
    #[arg(long, default_value_t = 3_000)]
    request_timeout_ms: u64,
    /// How long a producer session retries one record before giving up
    /// (its unacknowledged records are then logged unknown).
    #[arg(long, default_value_t = 10_000)]
    delivery_timeout_ms: u64,
    /// After the stop, how long outstanding records may still be acknowledged.
    #[arg(long, default_value_t = 15_000)]
    drain_timeout_ms: u64,
    /// How often the resuming consumer goes back to an old cursor.
    #[arg(long, default_value_t = 10_000)]
    resume_every_ms: u64,
    /// The longest the final read may take.
    #[arg(long, default_value_t = 180_000)]
    final_timeout_ms: u64,
    /// How long the topic creation may keep being retried at the start.
    #[arg(long, default_value_t = 60_000)]
    create_timeout_ms: u64,
    /// Seeds the workload's choices (the resumer's cursors).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Take nemesis, heal, copies and the final and end commands from stdin.
    #[arg(long)]
    control_stdin: bool,
    #[arg(long, default_value_t = 5_000)]
    stats_every_ms: u64,
    /// Also write the summary JSON here.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Connect with TLS, verifying the brokers against this CA (PEM).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Log in as this user (SCRAM-SHA-256) on every connection.
    #[arg(long, value_name = "NAME", requires = "password_file")]
    user: Option<String>,
    /// The user's password: the file's first line.
    #[arg(long, value_name = "FILE", requires = "user")]
    password_file: Option<PathBuf>,
}

fn say(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The wire client's own logs (a produce attempt's error, a hint
    // followed) explain what a producer session saw: `RUST_LOG` picks them,
    // e.g. `warn,malachi_wire::client::producer=debug`.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("chaos-driver: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(outcome) if outcome.complete => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(EXIT_FINAL_INCOMPLETE),
        Err(error) => {
            eprintln!("chaos-driver: {error}");
            ExitCode::from(1)
        }
    }
}

/// Creates the topic, retrying what may be retried, until the deadline.
async fn create_topic(cli: &Cli, brokers: &Brokers) -> Result<(), DriverError> {
    let deadline = Instant::now() + Duration::from_millis(cli.create_timeout_ms);
    let mut rotation = 0usize;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let client = match brokers.connect(rotation).await {
            Ok(client) => client,
            Err(error) => {
                last = error.to_string();
                rotation += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match client
            .create_topic(&cli.topic, Some(cli.replication_factor), None)
            .await
        {
            Ok(_) => return Ok(()),
            // A retried create whose first attempt landed.
            Err(error) if error.code() == Some(ErrorCode::TopicExists) => {
                eprintln!("chaos-driver: topic {} exists already: using it", cli.topic);
                return Ok(());
            }
            Err(error) if error.retriable() || error.code().is_none() => {
                last = error.to_string();
                rotation += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => {
                return Err(DriverError::CreateTopic {
                    topic: cli.topic.clone(),
                    reason: error.to_string(),
                });
            }
        }
    }
    Err(DriverError::NoBroker {
        waited_ms: cli.create_timeout_ms,
        last,
    })
}

/// Reads control lines from stdin on a thread of its own (blocking reads
/// stay off the runtime); the end of stdin is `End`.
fn spawn_stdin(tx: mpsc::Sender<Control>) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            match control::parse(&line) {
                Ok(Some(control)) => {
                    if tx.blocking_send(control).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(error) => eprintln!("chaos-driver: ignored a control line: {error}"),
            }
        }
        let _ = tx.blocking_send(Control::End);
    });
}

fn log_control(history: &History, value: &Value) {
    history.log(|t_ms| match control::stamped(value, t_ms) {
        Ok(event) => event,
        // `parse` checked the line; a line that checked once cannot fail
        // with another stamp.
        Err(error) => unreachable!("a checked control line failed: {error}"),
    });
}

async fn run(cli: Cli) -> Result<FinalOutcome, DriverError> {
    let brokers = Brokers::new(
        cli.brokers.clone(),
        cli.request_timeout_ms,
        brokers::Security::from_files(
            cli.tls_ca.as_deref(),
            cli.user.as_deref(),
            cli.password_file.as_deref(),
        )?,
    );
    let history = Arc::new(History::create(&cli.history)?);
    let stats = Arc::new(Stats::default());
    create_topic(&cli, &brokers).await?;
    say(&json!({"event": "ready", "topic": cli.topic, "t_ms": history.elapsed_ms()}));

    let (control_tx, mut control_rx) = mpsc::channel(CONTROL_QUEUE_MAX);
    if cli.control_stdin {
        spawn_stdin(control_tx);
    } else {
        drop(control_tx);
    }
    let work = Workers {
        brokers: &brokers,
        history: &history,
        stats: &stats,
    };
    let (stop_producers, producers_stop) = watch::channel(false);
    let (stop_consumers, consumers_stop) = watch::channel(false);
    let producers = work.spawn_producers(&cli, &producers_stop);
    let consumers = work.spawn_consumers(&cli, &consumers_stop);
    let mut flush_every = tokio::time::interval(Duration::from_millis(FLUSH_EVERY_MS));
    let ended_early =
        run_workload(&cli, &mut control_rx, &mut flush_every, &history, &stats).await?;

    // Stop: the producers drain (their outstanding records get outcomes);
    // only then the consumers stop (`live` reading on to the end of the
    // log first), so every acknowledgement precedes their final reads; then
    // the fresh final read.
    let _ = stop_producers.send(true);
    for task in producers {
        let _ = task.await;
    }
    history.flush()?;
    let _ = stop_consumers.send(true);
    let mut live_final = None;
    for task in consumers {
        if let Ok(Some(outcome)) = task.await {
            live_final = Some(outcome);
        }
    }
    history.flush()?;
    let (outcome, by_broker) = if ended_early {
        let outcome = FinalOutcome {
            consumer: "final".to_owned(),
            broker: None,
            complete: false,
            records: 0,
            millis: 0,
            error: Some("the runner ended the run before the final read".to_owned()),
        };
        (outcome, Vec::new())
    } else {
        final_reads(&cli, &brokers, &history, &stats).await
    };
    history.flush()?;
    say(&json!({
        "event": "final_done",
        "t_ms": history.elapsed_ms(),
        "final": outcome,
        "live_final": live_final,
        "by_broker": by_broker,
        "stats": stats.to_json(),
    }));
    // The runner may still log its copies look; then `end`.
    if cli.control_stdin && !ended_early {
        wait_for_end(&mut control_rx, &mut flush_every, &history).await?;
    }
    let lines = history.finish()?;
    write_summary(&cli, lines, &outcome, &live_final, &by_broker, &stats);
    let complete = outcome.complete && by_broker.iter().all(|o| o.complete);
    Ok(FinalOutcome {
        complete,
        ..outcome
    })
}

/// What every producer and consumer task shares.
struct Workers<'a> {
    brokers: &'a Brokers,
    history: &'a Arc<History>,
    stats: &'a Arc<Stats>,
}

impl Workers<'_> {
    /// One producer task per `--producers`, each with its own keys.
    fn spawn_producers(
        &self,
        cli: &Cli,
        stop: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..cli.producers)
            .map(|p| {
                let name = format!("p{p}");
                let settings = ProducerSettings {
                    keys: (0..cli.keys_per_producer)
                        .map(|k| format!("{name}-k{k}"))
                        .collect(),
                    name,
                    topic: cli.topic.clone(),
                    rate_per_s: cli.rate_per_producer,
                    window_requests_max: cli.window,
                    delivery_timeout_ms: cli.delivery_timeout_ms,
                    drain_timeout_ms: cli.drain_timeout_ms,
                    rotation: p,
                };
                tokio::spawn(producer::run(
                    settings,
                    self.brokers.clone(),
                    self.history.clone(),
                    self.stats.clone(),
                    stop.clone(),
                ))
            })
            .collect()
    }

    /// The `live` consumer (it tails the log) and the `resumer` (it
    /// restarts from saved cursors).
    fn spawn_consumers(
        &self,
        cli: &Cli,
        stop: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<Option<FinalOutcome>>> {
        let roles = [
            ("live", Role::Live),
            (
                "resumer",
                Role::Resumer {
                    resume_every_ms: cli.resume_every_ms,
                    seed: cli.seed,
                },
            ),
        ];
        roles
            .into_iter()
            .enumerate()
            .map(|(i, (name, role))| {
                let settings = ConsumerSettings {
                    name: name.to_owned(),
                    role,
                    topic: cli.topic.clone(),
                    rotation: i + 1,
                    tail_timeout_ms: cli.final_timeout_ms,
                };
                tokio::spawn(consumer::run(
                    settings,
                    self.brokers.clone(),
                    self.history.clone(),
                    self.stats.clone(),
                    stop.clone(),
                ))
            })
            .collect()
    }
}

/// Runs the workload until the runner says `final`, or the duration ends,
/// flushing the history and printing stats meanwhile. Returns whether the
/// runner ended the run before the final read.
async fn run_workload(
    cli: &Cli,
    control_rx: &mut mpsc::Receiver<Control>,
    flush_every: &mut tokio::time::Interval,
    history: &History,
    stats: &Stats,
) -> Result<bool, DriverError> {
    let deadline = Instant::now() + Duration::from_secs(cli.duration_s);
    let mut stats_every = tokio::time::interval(Duration::from_millis(cli.stats_every_ms.max(100)));
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return Ok(false),
            _ = flush_every.tick() => history.flush()?,
            _ = stats_every.tick() => {
                say(&json!({"event": "stats", "t_ms": history.elapsed_ms(), "stats": stats.to_json()}));
            }
            control = control_rx.recv(), if cli.control_stdin => match control {
                Some(Control::Log(value)) => log_control(history, &value),
                Some(Control::Final) => return Ok(false),
                Some(Control::End) | None => {
                    eprintln!("chaos-driver: the runner ended the run before the final read");
                    return Ok(true);
                }
            },
        }
    }
}

/// After the final reads: logs what the runner sends until it says `end`.
async fn wait_for_end(
    control_rx: &mut mpsc::Receiver<Control>,
    flush_every: &mut tokio::time::Interval,
    history: &History,
) -> Result<(), DriverError> {
    loop {
        tokio::select! {
            _ = flush_every.tick() => history.flush()?,
            control = control_rx.recv() => match control {
                Some(Control::Log(value)) => log_control(history, &value),
                Some(Control::Final) => {}
                Some(Control::End) | None => return Ok(()),
            },
        }
    }
}

/// Prints the run's summary and writes it to `--summary` if given.
fn write_summary(
    cli: &Cli,
    history_lines: u64,
    outcome: &FinalOutcome,
    live_final: &Option<FinalOutcome>,
    by_broker: &[FinalOutcome],
    stats: &Stats,
) {
    let summary = json!({
        "event": "summary",
        "history": cli.history,
        "history_lines": history_lines,
        "topic": cli.topic,
        "brokers": cli.brokers,
        "seed": cli.seed,
        "final": outcome,
        "live_final": live_final,
        "by_broker": by_broker,
        "stats": stats.to_json(),
    });
    if let Some(path) = &cli.summary {
        let text = serde_json::to_string_pretty(&summary).unwrap_or_default();
        if let Err(error) = std::fs::write(path, text) {
            eprintln!("chaos-driver: cannot write {}: {error}", path.display());
        }
    }
    say(&summary);
}

/// The fresh reads from the start once the run has stopped: `final`,
/// which rotates over the brokers like every other task, then one reader
/// pinned to each broker (`final-b1` for the first of `--brokers`, ...),
/// all at once. Each logs its own `final_read`, so the checker judges
/// every one for lost writes and compares what they delivered: a broker
/// that serves a read short of the log shows as its reader's difference.
async fn final_reads(
    cli: &Cli,
    brokers: &Brokers,
    history: &Arc<History>,
    stats: &Arc<Stats>,
) -> (FinalOutcome, Vec<FinalOutcome>) {
    let outcome = consumer::final_read(
        "final".to_owned(),
        None,
        cli.topic.clone(),
        brokers.clone(),
        history.clone(),
        stats.clone(),
        cli.final_timeout_ms,
    )
    .await;
    let pinned: Vec<_> = brokers
        .addrs()
        .iter()
        .enumerate()
        .map(|(i, addr)| {
            tokio::spawn(consumer::final_read(
                format!("final-b{}", i + 1),
                Some(addr.clone()),
                cli.topic.clone(),
                brokers.clone(),
                history.clone(),
                stats.clone(),
                cli.final_timeout_ms,
            ))
        })
        .collect();
    let mut by_broker = Vec::with_capacity(pinned.len());
    for (i, task) in pinned.into_iter().enumerate() {
        by_broker.push(task.await.unwrap_or_else(|error| FinalOutcome {
            consumer: format!("final-b{}", i + 1),
            broker: brokers.addrs().get(i).cloned(),
            complete: false,
            records: 0,
            millis: 0,
            error: Some(format!("the reader's task failed: {error}")),
        }));
    }
    (outcome, by_broker)
}
