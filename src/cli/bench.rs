//! `malachi bench produce` and `malachi bench consume`: load against a
//! running broker, measured as MB/s, records/s and latency percentiles, with
//! an optional raw disk baseline (`--vs-raw`) at the same parallelism.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use malachi_wire::messages::FetchRequest;
use malachi_wire::{Client, ClientConfig, ErrorCode, Record, RecordBatch};
use serde::Serialize;

use super::client::print_json;
use super::error::CliError;
use super::{BenchConsumeArgs, BenchProduceArgs, OutputArgs};

pub mod compare;
pub mod failover;
pub mod heal;
pub mod idle;
mod load;
pub mod maintenance;
pub mod metadata;
pub mod scale;

/// The longest benchmark accepted: a typo like `30m` for `30s` should not
/// keep a machine busy for a day.
pub const DURATION_MAX: Duration = Duration::from_secs(6 * 3600);
/// Producers or consumers a benchmark may run.
pub const CLIENTS_MAX: usize = 1024;
/// The largest record value a benchmark sends, in bytes.
pub const RECORD_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The largest produce request a benchmark builds, in block bytes.
const BATCH_BYTES_MAX: usize = 15 * 1024 * 1024;

/// Splits `500ms` into its number and its unit (`""` when there is none);
/// `None` when it does not start with a number that fits a `u64`. Shared
/// by the duration and size flags.
pub fn number_and_unit(text: &str) -> Option<(u64, &str)> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    Some((number.parse().ok()?, unit))
}

/// Parse `30s`, `500ms`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (n, unit) = number_and_unit(text)
        .ok_or_else(|| format!("{text:?} is not a duration like 30s, 500ms or 2m"))?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    if duration.is_zero() || duration > DURATION_MAX {
        return Err(format!(
            "{text:?} is out of range: between 1ms and {}h",
            DURATION_MAX.as_secs() / 3600
        ));
    }
    Ok(duration)
}

/// One result line: the storage benchmark's field names, so results of
/// every benchmark can be compared by the same scripts.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub system: &'static str,
    pub scenario: String,
    pub clients: usize,
    pub record_bytes: usize,
    pub batch_records: u32,
    pub seconds: f64,
    pub records: u64,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_to_raw: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_mb_per_s: Option<f64>,
    pub errors: u64,
}

impl BenchResult {
    fn text(&self) -> String {
        let mut line = format!(
            "{:<9} {:<52} {:>9.1} MB/s {:>11.0} records/s  p50 {} us  p99 {} us  p999 {} us",
            self.system,
            self.scenario,
            self.mb_per_s,
            self.records_per_s,
            self.p50_us,
            self.p99_us,
            self.p999_us
        );
        if let Some(ratio) = self.ratio_to_raw {
            line.push_str(&format!("  ratio_to_raw {ratio:.2}"));
        }
        if self.errors > 0 {
            line.push_str(&format!("  errors {}", self.errors));
        }
        line
    }
}

fn histogram() -> Result<Histogram<u64>, CliError> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| CliError::Bench(e.to_string()))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// A progress bar on a terminal, nothing when piped or printing JSON.
fn progress(duration: Duration, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(duration.as_secs().max(1));
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len}s {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

async fn bench_client(output: &OutputArgs) -> Result<Client, CliError> {
    let (tls, credentials) = output.security()?;
    let config = ClientConfig {
        client_name: concat!("malachi-bench/", env!("CARGO_PKG_VERSION")).to_owned(),
        request_timeout_ms: output.timeout_ms,
        inflight_requests_max: 256,
        tls: tls.client_tls()?,
        login: super::client::login(&credentials)?,
        ..ClientConfig::default()
    };
    Client::connect_with(output.brokers()?, config)
        .await
        .map_err(|e| CliError::client("connect", &output.broker_label(), e))
}

fn emit(result: &BenchResult, json: bool) -> Result<(), CliError> {
    if json {
        print_json(result)
    } else {
        println!("{}", result.text());
        Ok(())
    }
}

/// One produce load against a Malachi broker: what `bench produce` runs and
/// what `bench compare` runs against its own broker.
#[derive(Debug, Clone)]
pub struct ProduceLoad {
    pub topic: String,
    pub producers: usize,
    pub record_size: usize,
    pub batch_records: u32,
    /// Produce requests each producer keeps in flight.
    pub window: usize,
    pub duration: Duration,
}

/// What a load run measured: acknowledged (or read) records, their payload
/// bytes, and the latency of each acknowledgement (or fetch).
#[derive(Debug)]
pub struct LoadOutcome {
    pub records: u64,
    /// Record value bytes only (no keys, headers or framing).
    pub payload_bytes: u64,
    pub seconds: f64,
    pub hist: Histogram<u64>,
    pub errors: u64,
    /// Writes still unacknowledged when the run stopped waiting for them:
    /// neither counted nor failed.
    pub dropped: u64,
}

impl LoadOutcome {
    pub fn mb_per_s(&self) -> f64 {
        self.payload_bytes as f64 / self.seconds.max(1e-9) / 1e6
    }

    pub fn records_per_s(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

pub async fn produce(args: BenchProduceArgs) -> Result<(), CliError> {
    let json = args.output.json;
    let load = ProduceLoad {
        topic: args.topic.clone(),
        producers: args.producers,
        record_size: args.record_size,
        batch_records: args.batch_records,
        window: args.window,
        duration: args.duration,
    };
    let (outcome, batch_bytes) = produce_load(&args.output, &load, json).await?;
    let batches = outcome.records / u64::from(args.batch_records);
    let seconds = outcome.seconds;
    let mut result = BenchResult {
        system: "malachi",
        scenario: format!(
            "produce producers={} record={}B batch={} window={}",
            args.producers, args.record_size, args.batch_records, args.window
        ),
        clients: args.producers,
        record_bytes: args.record_size,
        batch_records: args.batch_records,
        seconds,
        records: outcome.records,
        mb_per_s: outcome.mb_per_s(),
        records_per_s: outcome.records_per_s(),
        p50_us: outcome.hist.value_at_quantile(0.50),
        p99_us: outcome.hist.value_at_quantile(0.99),
        p999_us: outcome.hist.value_at_quantile(0.999),
        ratio_to_raw: None,
        raw_mb_per_s: None,
        errors: outcome.errors,
    };
    if args.vs_raw {
        let raw = raw_disk(
            &args.raw_dir,
            args.producers,
            batch_bytes,
            args.duration,
            json,
        )?;
        // Compare like with like: the raw run's bytes are whole batches, so
        // count the broker's in encoded batch bytes too.
        let broker_block_mb_per_s = (batches * batch_bytes as u64) as f64 / seconds / 1e6;
        result.ratio_to_raw = Some(broker_block_mb_per_s / raw.mb_per_s.max(1e-9));
        result.raw_mb_per_s = Some(raw.mb_per_s);
        emit(&raw, json)?;
    }
    emit(&result, json)
}

/// Run `load` against the broker of `output`: `producers` connections, each
/// keeping `window` requests of one prebuilt batch in flight until
/// `duration` ends, then waiting for the last acknowledgements. Returns what
/// was acknowledged and the encoded size of one batch. The topic is created
/// if missing. `quiet` hides the progress bar.
pub async fn produce_load(
    output: &OutputArgs,
    load: &ProduceLoad,
    quiet: bool,
) -> Result<(LoadOutcome, usize), CliError> {
    if load.producers == 0 || load.producers > CLIENTS_MAX {
        return Err(CliError::Bench(format!(
            "--producers must be 1 to {CLIENTS_MAX}"
        )));
    }
    if load.record_size > RECORD_BYTES_MAX || load.batch_records == 0 {
        return Err(CliError::Bench(format!(
            "--record-size must be at most {RECORD_BYTES_MAX} and --batch-records at least 1"
        )));
    }
    let setup = bench_client(output).await?;
    match setup.create_topic(&load.topic, None, None).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(ErrorCode::TopicExists) => {}
        Err(e) => return Err(CliError::client("create topic", &output.broker_label(), e)),
    }
    // One batch, built once and sent over and over: the benchmark measures
    // the broker, not the encoder.
    let value = Bytes::from(vec![0x5A_u8; load.record_size]);
    let records: Vec<Record> = (0..load.batch_records)
        .map(|i| Record::new(Bytes::from(format!("key-{i:08}")), value.clone()))
        .collect();
    let batch = RecordBatch::from_records(&records, BATCH_BYTES_MAX)
        .map_err(|e| CliError::Bench(format!("cannot build a batch: {e}")))?;
    let batch_bytes = batch.encoded_bytes();
    let payload_bytes_per_batch = u64::from(load.batch_records) * load.record_size as u64;

    let stop = Arc::new(AtomicBool::new(false));
    let acked_records = Arc::new(AtomicU64::new(0));
    // Every producer connects (and logs in) before the clock starts: the
    // row measures serving, not connection set-up.
    let mut clients = Vec::with_capacity(load.producers);
    for _ in 0..load.producers {
        clients.push(bench_client(output).await?);
    }
    let bar = progress(load.duration, quiet);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(load.producers);
    for client in clients {
        let (topic, batch, stop, acked) = (
            load.topic.clone(),
            batch.clone(),
            stop.clone(),
            acked_records.clone(),
        );
        let window = load.window.max(1);
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram()?;
            let mut producer = client.producer(&topic, window);
            let mut errors = 0u64;
            let record = |ack: malachi_wire::client::ProduceAck, hist: &mut Histogram<u64>| {
                hist.saturating_record(micros(ack.latency));
                acked.fetch_add(u64::from(ack.records_acknowledged), Ordering::Relaxed);
            };
            while !stop.load(Ordering::Relaxed) {
                match producer.send(batch.clone()).await {
                    Ok(Some(ack)) => record(ack, &mut hist),
                    Ok(None) => {}
                    Err(_) => {
                        errors += 1;
                        // A broker that refuses everything must not be
                        // hammered in a tight loop.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            loop {
                match producer.next_ack().await {
                    Ok(Some(ack)) => record(ack, &mut hist),
                    Ok(None) => break,
                    Err(e) => {
                        // A failed producer answers every later call with
                        // the same error: what it holds is not acknowledged.
                        errors += 1;
                        tracing::warn!(error = %e, "a bench producer failed while draining");
                        break;
                    }
                }
            }
            Ok::<_, CliError>((hist, errors))
        }));
    }
    tick_until(&bar, started, load.duration, |elapsed| {
        let records = acked_records.load(Ordering::Relaxed);
        format!(
            "{:.0} records/s",
            records as f64 / elapsed.as_secs_f64().max(1e-3)
        )
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut hist = histogram()?;
    let mut errors = 0;
    for task in tasks {
        let (h, e) = task
            .await
            .map_err(|e| CliError::Bench(format!("a producer failed: {e}")))??;
        let _ = hist.add(&h);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let records = acked_records.load(Ordering::Relaxed);
    let batches = records / u64::from(load.batch_records);
    Ok((
        LoadOutcome {
            records,
            payload_bytes: batches * payload_bytes_per_batch,
            seconds,
            hist,
            errors,
            dropped: 0,
        },
        batch_bytes,
    ))
}

async fn tick_until(
    bar: &ProgressBar,
    started: Instant,
    duration: Duration,
    message: impl Fn(Duration) -> String,
) {
    while started.elapsed() < duration {
        let left = duration.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
        let elapsed = started.elapsed();
        bar.set_position(elapsed.as_secs());
        bar.set_message(message(elapsed));
    }
}

/// The disk's own durable write bandwidth at the benchmark's parallelism and
/// request size, measured by the storage benchmark's raw method
/// ([`malachi_bench::storage::raw_disk`]), with a progress bar while it runs.
pub fn raw_disk(
    dir: &Path,
    files: usize,
    write_bytes: usize,
    duration: Duration,
    json: bool,
) -> Result<BenchResult, CliError> {
    let bar = progress(duration, json);
    bar.set_message("raw disk");
    let outcome = std::thread::scope(|s| {
        let run = s.spawn(|| malachi_bench::storage::raw_disk(dir, files, write_bytes, duration));
        let ticker_started = Instant::now();
        while !run.is_finished() {
            std::thread::sleep(Duration::from_millis(200));
            bar.set_position(ticker_started.elapsed().as_secs());
        }
        run.join()
    });
    bar.finish_and_clear();
    let raw = outcome
        .map_err(|_| CliError::Bench("the raw disk run panicked".into()))?
        .map_err(|e| CliError::Bench(e.to_string()))?;
    Ok(BenchResult {
        system: "raw-disk",
        scenario: format!("pwrite+fdatasync files={files} write={write_bytes}B"),
        clients: files,
        record_bytes: write_bytes,
        batch_records: 1,
        seconds: raw.seconds,
        records: raw.writes,
        mb_per_s: raw.mb_per_s(),
        records_per_s: raw.writes_per_s(),
        p50_us: raw.latency_us_at(0.50),
        p99_us: raw.latency_us_at(0.99),
        p999_us: raw.latency_us_at(0.999),
        ratio_to_raw: None,
        raw_mb_per_s: None,
        errors: 0,
    })
}

pub async fn consume(args: BenchConsumeArgs) -> Result<(), CliError> {
    let json = args.output.json;
    let fetch_bytes = args.fetch_bytes.clamp(
        1,
        u32::try_from(malachi_wire::frame::FRAME_BYTES_MAX_DEFAULT / 2).unwrap_or(u32::MAX),
    );
    let outcome = consume_load(
        &args.output,
        &args.topic,
        args.consumers,
        args.duration,
        fetch_bytes,
        AtTail::Restart,
        json,
    )
    .await?;
    if outcome.records == 0 {
        return Err(CliError::Bench(format!(
            "topic {} is empty: produce to it first (malachi bench produce --topic {})",
            args.topic, args.topic
        )));
    }
    let result = BenchResult {
        system: "malachi",
        scenario: format!(
            "consume consumers={} fetch={}B",
            args.consumers, fetch_bytes
        ),
        clients: args.consumers,
        record_bytes: (outcome.payload_bytes / outcome.records) as usize,
        batch_records: 1,
        seconds: outcome.seconds,
        records: outcome.records,
        mb_per_s: outcome.mb_per_s(),
        records_per_s: outcome.records_per_s(),
        p50_us: outcome.hist.value_at_quantile(0.50),
        p99_us: outcome.hist.value_at_quantile(0.99),
        p999_us: outcome.hist.value_at_quantile(0.999),
        ratio_to_raw: None,
        raw_mb_per_s: None,
        errors: 0,
    };
    emit(&result, json)
}

/// What a consumer does when it reaches the end of the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtTail {
    /// Read the topic again from the start (from the page cache this time),
    /// until the duration ends: `bench consume`.
    Restart,
    /// Stop: the topic was read once (`bench compare` reads back what it
    /// wrote).
    Stop,
}

/// Run `consumers` readers of `topic` from its start for at most
/// `duration`. `payload_bytes` counts the encoded record blocks fetched;
/// latencies are per fetch. `quiet` hides the progress bar.
pub async fn consume_load(
    output: &OutputArgs,
    topic: &str,
    consumers: usize,
    duration: Duration,
    fetch_bytes: u32,
    at_tail: AtTail,
    quiet: bool,
) -> Result<LoadOutcome, CliError> {
    if consumers == 0 || consumers > CLIENTS_MAX {
        return Err(CliError::Bench(format!(
            "--consumers must be 1 to {CLIENTS_MAX}"
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bytes_read = Arc::new(AtomicU64::new(0));
    let records_read = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::with_capacity(consumers);
    for _ in 0..consumers {
        clients.push(bench_client(output).await?);
    }
    let bar = progress(duration, quiet);
    let mut tasks = Vec::with_capacity(consumers);
    let started = Instant::now();
    for client in clients {
        let (topic, stop, bytes_read, records_read, done, broker) = (
            topic.to_owned(),
            stop.clone(),
            bytes_read.clone(),
            records_read.clone(),
            done.clone(),
            output.broker_label(),
        );
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram()?;
            let mut cursor: Option<String> = None;
            while !stop.load(Ordering::Relaxed) {
                let request = FetchRequest {
                    topic: topic.clone(),
                    from_start: cursor.is_none(),
                    cursor: cursor.clone(),
                    records_max: malachi_wire::limits::RECORDS_PER_FETCH_MAX,
                    bytes_max: fetch_bytes,
                    wait_ms: 0,
                };
                let t = Instant::now();
                let response = client
                    .fetch(&request)
                    .await
                    .map_err(|e| CliError::client("fetch", &broker, e))?;
                if response.records.is_empty() {
                    match at_tail {
                        // At the tail: read the topic again from the start,
                        // from the page cache this time.
                        AtTail::Restart => {
                            cursor = None;
                            continue;
                        }
                        AtTail::Stop => break,
                    }
                }
                hist.saturating_record(micros(t.elapsed()));
                bytes_read.fetch_add(response.records.encoded_bytes() as u64, Ordering::Relaxed);
                records_read.fetch_add(u64::from(response.records.count()), Ordering::Relaxed);
                cursor = Some(response.next_cursor);
            }
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<_, CliError>(hist)
        }));
    }
    let all_done = || done.load(Ordering::Relaxed) >= consumers as u64;
    while started.elapsed() < duration && !all_done() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let elapsed = started.elapsed();
        bar.set_position(elapsed.as_secs());
        bar.set_message(format!(
            "{:.1} MB/s",
            bytes_read.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64().max(1e-3) / 1e6
        ));
    }
    stop.store(true, Ordering::Relaxed);
    let mut hist = histogram()?;
    for task in tasks {
        let h = task
            .await
            .map_err(|e| CliError::Bench(format!("a consumer failed: {e}")))??;
        let _ = hist.add(&h);
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok(LoadOutcome {
        records: records_read.load(Ordering::Relaxed),
        payload_bytes: bytes_read.load(Ordering::Relaxed),
        seconds,
        hist,
        errors: 0,
        dropped: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_units_of_cli_md() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
    }

    #[test]
    fn zero_unknown_units_and_absurd_durations_are_refused() {
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("10d").is_err());
        assert!(parse_duration("7h").is_err());
    }

    #[test]
    fn the_raw_disk_run_writes_and_reports_bandwidth() {
        let dir = tempfile::tempdir().unwrap();
        let result = raw_disk(dir.path(), 2, 4096, Duration::from_millis(100), true).unwrap();
        assert_eq!(result.system, "raw-disk");
        assert!(result.records > 0);
        assert!(result.mb_per_s > 0.0);
        assert!(result.p50_us <= result.p99_us && result.p99_us <= result.p999_us);
        // The run removes its files.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_result_line_in_json_has_the_storage_benchmarks_field_names() {
        let result = BenchResult {
            system: "malachi",
            scenario: "s".into(),
            clients: 1,
            record_bytes: 1024,
            batch_records: 10,
            seconds: 1.0,
            records: 10,
            mb_per_s: 1.0,
            records_per_s: 10.0,
            p50_us: 1,
            p99_us: 2,
            p999_us: 3,
            ratio_to_raw: Some(0.5),
            raw_mb_per_s: Some(2.0),
            errors: 0,
        };
        let value = serde_json::to_value(&result).unwrap();
        for field in [
            "system",
            "scenario",
            "mb_per_s",
            "records_per_s",
            "p50_us",
            "p99_us",
            "p999_us",
            "ratio_to_raw",
        ] {
            assert!(value.get(field).is_some(), "missing {field}");
        }
    }
}
