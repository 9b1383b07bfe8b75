//! `malachi bench storage`: the store's durable append and read throughput
//! measured against the disk's own durable write bandwidth, in one run.
//!
//! The raw disk is N plain files, each written with `pwrite` and `fdatasync`
//! by its own thread. It is measured twice over:
//!
//! - on a grid of file counts (1, 8, 16) and write sizes (1, 10, 100, 1,000
//!   and 10,000 records' frames), which gives the disk's bandwidth at the
//!   appenders' own batch sizes and parallelism (`ratio_to_raw_batch`, above
//!   1 when group commit coalesces small batches into larger writes);
//! - interleaved with each store scenario: the scenario runs in slices, and
//!   each slice is followed by a raw slice of the same length on
//!   `min(appenders, segments)` files (the files the scenario keeps syncing
//!   at once), each written at the mean bytes per fdatasync the store issued
//!   in that slice. `ratio_to_raw` divides by these slices, so it is the
//!   store's overhead over a disk doing the same syncs within a second or so
//!   (this disk's bandwidth drifts by tens of percent over seconds; ADR
//!   0013).

use std::fs::{self, OpenOptions};
use std::future::Future;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

use malachi_storage::{
    AppendTicket, FileStore, Record, SegmentId, SegmentStore, StorageError, StoreConfig,
};

/// Bytes in each benchmark record's value (the key is 8 bytes).
pub const VALUE_BYTES: usize = 1024;
const APPENDERS: [usize; 3] = [1, 8, 64];
const SEGMENTS: [usize; 2] = [1, 16];
const BATCHES: [usize; 4] = [1, 10, 100, 1000];
/// Raw write sizes, in records' worth of frames.
const RAW_WRITE_RECORDS: [usize; 5] = [1, 10, 100, 1000, 10_000];
const BUSY_BACKOFF: Duration = Duration::from_micros(50);
/// Store and raw slices a full run interleaves per scenario.
const PAIRED_ROUNDS: usize = 4;

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Directory for the benchmark's files (removed scenario by scenario).
    pub dir: PathBuf,
    /// About a minute instead of several.
    pub quick: bool,
    /// The store's `flush_interval_ms` during the run.
    pub flush_interval_ms: u64,
    pub sync_threads: usize,
    /// The store's `flush_pipeline_depth` during the run.
    pub flush_pipeline_depth: usize,
    /// The store's `direct_io` during the run.
    pub direct_io: bool,
    /// Run only the scenarios whose name contains this (for profiling).
    pub filter: Option<String>,
}

/// One line of the benchmark's output.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub system: &'static str,
    pub scenario: String,
    pub files: usize,
    pub appenders: usize,
    pub batch_records: usize,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// Mean bytes per fdatasync (per write for raw, per flush for the store).
    pub write_bytes_mean: f64,
    pub ratio_to_raw: Option<f64>,
    pub ratio_to_raw_batch: Option<f64>,
    /// The raw run `ratio_to_raw` divides by.
    pub raw_baseline: Option<String>,
    /// That raw run's bandwidth and p99 sync latency.
    pub raw_mb_per_s: Option<f64>,
    pub raw_p99_us: Option<u64>,
    /// For the latency scenarios: 2 x raw p99 + 1 ms, the p99 target.
    pub p99_target_us: Option<u64>,
    /// For the latency scenarios: the records per second offered.
    pub offered_records_per_s: Option<f64>,
    /// For the latency scenarios: p99 of how late a send left its schedule.
    pub send_lag_p99_us: Option<u64>,
    pub busy_retries: u64,
    /// Flushes written while an earlier flush of the same file was still in
    /// its fdatasync (pipelining at work; 0 for raw runs).
    pub flushes_overlapped: u64,
}

struct Measured {
    bytes: u64,
    records: u64,
    seconds: f64,
    hist: Histogram<u64>,
    syncs: u64,
    overlapped: u64,
    busy: u64,
    lag: Option<Histogram<u64>>,
}

/// The size of one benchmark record's frame on disk.
pub fn frame_bytes() -> usize {
    malachi_storage::frame::FRAME_HEADER_BYTES
        + malachi_storage::frame::payload_len(&bench_record(0)).unwrap_or(0)
}

fn bench_record(i: u64) -> Record {
    Record {
        timestamp_ms: i,
        key: i.to_le_bytes().to_vec(),
        value: vec![0xAB; VALUE_BYTES],
        headers: Vec::new(),
    }
}

fn histogram() -> Histogram<u64> {
    // 1 us to 100 s with 3 significant digits. The bounds are constants that
    // hdrhistogram accepts, so a failure here is a programming error.
    match Histogram::new_with_bounds(1, 100_000_000, 3) {
        Ok(hist) => hist,
        Err(e) => panic!("constant histogram bounds rejected: {e}"),
    }
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl Fn(std::io::Error) -> StorageError + 'a {
    move |e| StorageError::Io {
        op,
        path: path.to_owned(),
        source: std::sync::Arc::new(e),
    }
}

/// Runs every scenario, calling `progress` after each, and returns them all.
pub fn run(
    opts: &BenchOptions,
    mut progress: impl FnMut(&ScenarioResult),
) -> Result<Vec<ScenarioResult>, StorageError> {
    let (raw_secs, store_secs, read_bytes) = if opts.quick {
        (0.6, 1.0, 64u64 << 20)
    } else {
        (3.0, 4.0, 512 << 20)
    };
    fs::create_dir_all(&opts.dir).map_err(io("create bench directory", &opts.dir))?;
    let frame = frame_bytes();
    let mut results = Vec::new();

    let mut raw = Vec::new();
    for files in [1usize, 8, 16] {
        for records in RAW_WRITE_RECORDS {
            if !wanted(
                opts,
                &format!("raw files={files} write={}", human(records * frame)),
            ) {
                continue;
            }
            let m = raw_run(
                &opts.dir,
                files,
                records * frame,
                Duration::from_secs_f64(raw_secs),
            )?;
            let r = to_result(
                "raw-disk",
                format!("raw files={files} write={}", human(records * frame)),
                files,
                1,
                records,
                &m,
                frame,
            );
            progress(&r);
            raw.push(r);
        }
    }
    results.extend(raw.iter().cloned());

    // For reference only (no ratio uses it): the same disk with O_DIRECT,
    // which is how the store writes large flushes (ADR 0012).
    for files in [1usize, 16] {
        for write_bytes in [128usize << 10, 1 << 20] {
            let name = format!("raw-direct files={files} write={}", human(write_bytes));
            if !wanted(opts, &name) {
                continue;
            }
            let raw = raw_disk_direct(
                &opts.dir,
                files,
                write_bytes,
                Duration::from_secs_f64(raw_secs),
            )?;
            let m = Measured::of_raw(raw);
            let r = to_result("raw-disk-direct", name, files, 1, 0, &m, frame);
            progress(&r);
            results.push(r);
        }
    }

    let cfg = StoreConfig {
        flush_interval_ms: opts.flush_interval_ms,
        sync_threads: opts.sync_threads,
        flush_pipeline_depth: opts.flush_pipeline_depth,
        direct_io: opts.direct_io,
        ..StoreConfig::default()
    };
    let mut best = None::<(f64, usize, usize, usize)>;
    for segments in SEGMENTS {
        for appenders in APPENDERS {
            for batch in BATCHES {
                if !wanted(
                    opts,
                    &format!("append segments={segments} appenders={appenders} batch={batch}"),
                ) {
                    continue;
                }
                let name =
                    format!("append segments={segments} appenders={appenders} batch={batch}");
                let shape = StoreShape {
                    segments,
                    appenders,
                    batch,
                };
                let r = store_scenario(opts, &cfg, &raw, name, shape, store_secs, frame, None)?;
                if segments == 16 && appenders == 64 && batch == 10 {
                    best = Some((r.records_per_s, segments, appenders, batch));
                }
                progress(&r);
                results.push(r);
            }
        }
    }

    // Latency at half the maximum load: appenders paced at half the rate the
    // same configuration reached closed-loop. Latency is append to ack; how
    // late sends left their schedule is reported beside it (send_lag_p99_us),
    // so a stall that delays sends is visible rather than hidden.
    let mut half_load = vec![best];
    let single = results
        .iter()
        .find(|r| r.files == 1 && r.appenders == 8 && r.batch_records == 1)
        .map(|r| (r.records_per_s, 1, 8, 1));
    half_load.push(single);
    for (max_rps, segments, appenders, batch) in half_load.into_iter().flatten() {
        let rate = (max_rps / 2.0).max(1.0);
        let per_appender = Duration::from_secs_f64(appenders as f64 * batch as f64 / rate);
        let name =
            format!("latency half-load segments={segments} appenders={appenders} batch={batch}");
        let shape = StoreShape {
            segments,
            appenders,
            batch,
        };
        let mut r = store_scenario(
            opts,
            &cfg,
            &raw,
            name,
            shape,
            store_secs,
            frame,
            Some(per_appender),
        )?;
        r.offered_records_per_s = Some(rate);
        r.p99_target_us = r.raw_p99_us.map(|p99| 2 * p99 + 1000);
        progress(&r);
        results.push(r);
    }

    if wanted(opts, "read sequential") {
        let r = read_run(&opts.dir, &cfg, read_bytes, frame)?;
        progress(&r);
        results.push(r);
    }
    Ok(results)
}

fn wanted(opts: &BenchOptions, scenario: &str) -> bool {
    opts.filter.as_deref().is_none_or(|f| scenario.contains(f))
}

/// How many segments, appenders and records per append a store scenario uses.
#[derive(Debug, Clone, Copy)]
struct StoreShape {
    segments: usize,
    appenders: usize,
    batch: usize,
}

/// Runs one store scenario (closed-loop, or paced at `pace` per appender),
/// then compares it with the raw grid and with raw runs paired with it.
///
/// The pairing is interleaved: `rounds` slices of the store, each followed
/// by a raw slice of the same length at that slice's file count and mean
/// bytes per sync. This disk's bandwidth drifts by tens of percent within a
/// minute, so a baseline taken seconds away measures the drift as much as
/// the store; slices a second apart cancel most of it.
#[allow(clippy::too_many_arguments)]
fn store_scenario(
    opts: &BenchOptions,
    cfg: &StoreConfig,
    raw: &[ScenarioResult],
    name: String,
    shape: StoreShape,
    store_secs: f64,
    frame: usize,
    pace: Option<Duration>,
) -> Result<ScenarioResult, StorageError> {
    let StoreShape {
        segments,
        appenders,
        batch,
    } = shape;
    let rounds = if opts.quick { 1 } else { PAIRED_ROUNDS };
    let slice = Duration::from_secs_f64(store_secs / rounds as f64);
    let files = segments.min(appenders);
    let mut store_total = Measured::empty(pace.is_some());
    let mut raw_total = Measured::empty(false);
    let mut raw_write_bytes = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let m = store_run(&opts.dir, cfg, segments, appenders, batch, slice, pace)?;
        let write_bytes = (m.bytes as f64 / m.syncs.max(1) as f64).round() as usize;
        let write_bytes = write_bytes.max(frame);
        raw_total.merge(&raw_run(&opts.dir, files, write_bytes, slice)?);
        raw_write_bytes.push(write_bytes);
        store_total.merge(&m);
    }
    let mut r = to_result(
        "malachi",
        name,
        segments,
        appenders,
        batch,
        &store_total,
        frame,
    );
    compare(&mut r, raw, files, batch * frame);
    let base = to_result("raw-disk", String::new(), files, 1, 0, &raw_total, frame);
    r.ratio_to_raw = Some(r.mb_per_s / base.mb_per_s.max(1e-9));
    let sizes: Vec<String> = raw_write_bytes.iter().map(|b| format!("{b}B")).collect();
    r.raw_baseline = Some(format!(
        "paired raw files={files} write={} in {rounds} interleaved slices",
        sizes.join("/")
    ));
    r.raw_mb_per_s = Some(base.mb_per_s);
    r.raw_p99_us = Some(base.p99_us);
    Ok(r)
}

/// Sets `ratio_to_raw_batch` from the grid, at the appenders' batch size.
fn compare(r: &mut ScenarioResult, raw: &[ScenarioResult], files: usize, batch_bytes: usize) {
    if let Some(base) = raw_at(raw, files, batch_bytes as f64) {
        r.ratio_to_raw_batch = Some(r.mb_per_s / base.mb_per_s);
    }
}

/// The raw disk at a file count and write size.
#[derive(Debug, Clone, PartialEq)]
struct RawPoint {
    mb_per_s: f64,
    p99_us: u64,
    label: String,
}

/// The raw disk at `files` files (the largest measured count not above it)
/// and `write_bytes` per sync, interpolated between the neighbouring
/// measured sizes linearly in seconds per sync, and clamped to the grid.
fn raw_at(raw: &[ScenarioResult], files: usize, write_bytes: f64) -> Option<RawPoint> {
    let files = raw
        .iter()
        .map(|r| r.files)
        .filter(|&f| f <= files.max(1))
        .max()?;
    let mut points: Vec<&ScenarioResult> = raw
        .iter()
        .filter(|r| r.files == files && r.mb_per_s > 0.0)
        .collect();
    points.sort_by(|a, b| a.write_bytes_mean.total_cmp(&b.write_bytes_mean));
    let (first, last) = (points.first()?, points.last()?);
    if write_bytes <= first.write_bytes_mean || points.len() == 1 {
        return Some(point_of(first));
    }
    if write_bytes >= last.write_bytes_mean {
        return Some(point_of(last));
    }
    let i = points
        .iter()
        .rposition(|p| p.write_bytes_mean <= write_bytes)?;
    let (lo, hi) = (points[i], points.get(i + 1)?);
    // Seconds one file spends per sync at each measured size.
    let secs = |p: &ScenarioResult| files as f64 * p.write_bytes_mean / (p.mb_per_s * 1e6);
    let w = (write_bytes - lo.write_bytes_mean) / (hi.write_bytes_mean - lo.write_bytes_mean);
    let t = secs(lo) + w * (secs(hi) - secs(lo));
    let p99 = lo.p99_us as f64 + w * (hi.p99_us as f64 - lo.p99_us as f64);
    Some(RawPoint {
        mb_per_s: files as f64 * write_bytes / t / 1e6,
        p99_us: p99.round() as u64,
        label: format!(
            "raw files={files} at {write_bytes:.0} bytes/sync, between '{}' and '{}'",
            lo.scenario, hi.scenario
        ),
    })
}

fn point_of(r: &ScenarioResult) -> RawPoint {
    RawPoint {
        mb_per_s: r.mb_per_s,
        p99_us: r.p99_us,
        label: r.scenario.clone(),
    }
}

fn to_result(
    system: &'static str,
    scenario: String,
    files: usize,
    appenders: usize,
    batch: usize,
    m: &Measured,
    frame: usize,
) -> ScenarioResult {
    let seconds = m.seconds.max(1e-9);
    ScenarioResult {
        system,
        scenario,
        files,
        appenders,
        batch_records: batch,
        mb_per_s: m.bytes as f64 / seconds / 1e6,
        records_per_s: if system.starts_with("raw-disk") {
            m.bytes as f64 / frame as f64 / seconds
        } else {
            m.records as f64 / seconds
        },
        p50_us: m.hist.value_at_quantile(0.5),
        p99_us: m.hist.value_at_quantile(0.99),
        p999_us: m.hist.value_at_quantile(0.999),
        write_bytes_mean: if m.syncs == 0 {
            0.0
        } else {
            m.bytes as f64 / m.syncs as f64
        },
        ratio_to_raw: None,
        ratio_to_raw_batch: None,
        raw_baseline: None,
        raw_mb_per_s: None,
        raw_p99_us: None,
        p99_target_us: None,
        offered_records_per_s: None,
        send_lag_p99_us: m.lag.as_ref().map(|h| h.value_at_quantile(0.99)),
        busy_retries: m.busy,
        flushes_overlapped: m.overlapped,
    }
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1}MiB", bytes as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1}KiB", bytes as f64 / 1024.0)
    }
}

fn elapsed_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// What [`raw_disk`] measured: the disk's durable write bandwidth and the
/// latency of each pwrite plus fdatasync.
#[derive(Debug, Clone)]
pub struct RawResult {
    /// Bytes written and synced, over all files.
    pub bytes: u64,
    /// Writes (each followed by its own fdatasync), over all files.
    pub writes: u64,
    /// Wall time of the slowest writer, at least the requested duration.
    pub seconds: f64,
    /// Latency of each pwrite plus fdatasync, in microseconds.
    pub latency_us: Histogram<u64>,
}

impl RawResult {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e6
    }

    pub fn writes_per_s(&self) -> f64 {
        self.writes as f64 / self.seconds.max(1e-9)
    }

    /// The write latency at `quantile` (0.5 for p50, 0.99 for p99).
    pub fn latency_us_at(&self, quantile: f64) -> u64 {
        self.latency_us.value_at_quantile(quantile)
    }
}

/// The disk's own durable write bandwidth: `files` plain files, each written
/// with `pwrite` of `write_bytes` followed by `fdatasync` by its own thread,
/// in a closed loop for `duration`.
///
/// The files live in a fresh subdirectory of `dir` (named after the process,
/// the file count and the write size, so concurrent runs do not collide),
/// which is removed afterwards. Both `malachi bench storage` and
/// `malachi bench produce --vs-raw` use this, so their baselines agree.
///
/// # Panics
///
/// When `files` or `write_bytes` is zero: such a run measures nothing.
pub fn raw_disk(
    dir: &Path,
    files: usize,
    write_bytes: usize,
    duration: Duration,
) -> Result<RawResult, StorageError> {
    raw_disk_with(dir, files, write_bytes, duration, false)
}

/// [`raw_disk`] with `O_DIRECT` writes of `write_bytes` rounded up to a
/// whole block: what the disk does without the page cache.
pub fn raw_disk_direct(
    dir: &Path,
    files: usize,
    write_bytes: usize,
    duration: Duration,
) -> Result<RawResult, StorageError> {
    let write_bytes = write_bytes.next_multiple_of(BLOCK_BYTES);
    raw_disk_with(dir, files, write_bytes, duration, true)
}

fn raw_disk_with(
    dir: &Path,
    files: usize,
    write_bytes: usize,
    duration: Duration,
    direct: bool,
) -> Result<RawResult, StorageError> {
    assert!(
        files > 0 && write_bytes > 0,
        "a raw disk run needs files and bytes"
    );
    let sub = dir.join(format!(
        "raw-{}-{files}-{write_bytes}-{}",
        std::process::id(),
        if direct { "direct" } else { "buffered" }
    ));
    fs::create_dir_all(&sub).map_err(io("create raw directory", &sub))?;
    let barrier = Barrier::new(files);
    type Outcome = Result<(u64, u64, f64, Histogram<u64>), StorageError>;
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..files)
            .map(|i| {
                let path = sub.join(format!("{i}.raw"));
                let barrier = &barrier;
                s.spawn(move || {
                    let mut options = OpenOptions::new();
                    options.create(true).write(true).truncate(true);
                    if direct {
                        options.custom_flags(libc::O_DIRECT);
                    }
                    let file = options.open(&path).map_err(io("create raw file", &path))?;
                    let aligned = AlignedBytes::filled(0x5A, write_bytes);
                    let buf = aligned.as_slice();
                    let mut hist = histogram();
                    let (mut pos, mut writes) = (0u64, 0u64);
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < duration {
                        let t = Instant::now();
                        file.write_all_at(buf, pos)
                            .map_err(io("write raw file", &path))?;
                        file.sync_data().map_err(io("sync raw file", &path))?;
                        hist.saturating_record(elapsed_us(t));
                        pos += write_bytes as u64;
                        writes += 1;
                    }
                    Ok((pos, writes, start.elapsed().as_secs_f64(), hist))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(StorageError::ShuttingDown)))
            .collect()
    });
    let mut raw = RawResult {
        bytes: 0,
        writes: 0,
        seconds: 0.0,
        latency_us: histogram(),
    };
    // Remove the files even when a writer failed, then report the failure.
    let removed = fs::remove_dir_all(&sub).map_err(io("remove raw directory", &sub));
    for outcome in outcomes {
        let (bytes, writes, seconds, hist) = outcome?;
        raw.bytes += bytes;
        raw.writes += writes;
        raw.seconds = raw.seconds.max(seconds);
        let _ = raw.latency_us.add(&hist);
    }
    removed?;
    Ok(raw)
}

/// [`raw_disk`] in the shape the store scenarios are measured in.
fn raw_run(
    dir: &Path,
    files: usize,
    write_bytes: usize,
    duration: Duration,
) -> Result<Measured, StorageError> {
    Ok(Measured::of_raw(raw_disk(
        dir,
        files,
        write_bytes,
        duration,
    )?))
}

impl Measured {
    fn empty(lag: bool) -> Measured {
        Measured {
            bytes: 0,
            records: 0,
            seconds: 0.0,
            hist: histogram(),
            syncs: 0,
            overlapped: 0,
            busy: 0,
            lag: lag.then(histogram),
        }
    }

    /// Adds another slice of the same scenario: its time runs after ours.
    fn merge(&mut self, other: &Measured) {
        self.bytes += other.bytes;
        self.records += other.records;
        self.seconds += other.seconds;
        self.syncs += other.syncs;
        self.overlapped += other.overlapped;
        self.busy += other.busy;
        let _ = self.hist.add(&other.hist);
        if let (Some(lag), Some(more)) = (self.lag.as_mut(), other.lag.as_ref()) {
            let _ = lag.add(more);
        }
    }

    fn of_raw(raw: RawResult) -> Measured {
        Measured {
            bytes: raw.bytes,
            records: 0,
            seconds: raw.seconds,
            hist: raw.latency_us,
            syncs: raw.writes,
            overlapped: 0,
            busy: 0,
            lag: None,
        }
    }
}

/// Closed-loop appenders (or paced ones when `pace` is set), each sending
/// batches to segment `appender % segments` and waiting for each ack.
fn store_run(
    dir: &Path,
    cfg: &StoreConfig,
    segments: usize,
    appenders: usize,
    batch: usize,
    duration: Duration,
    pace: Option<Duration>,
) -> Result<Measured, StorageError> {
    let sub = dir.join(format!("store-{segments}-{appenders}-{batch}"));
    let store = FileStore::open_dir(&sub, cfg.clone())?;
    for s in 0..segments {
        store.open(SegmentId(s as u64))?;
    }
    let shape = StoreShape {
        segments,
        appenders,
        batch,
    };
    let mut m = match pace {
        Some(pace) => paced_run(&store, shape, duration, pace)?,
        None => closed_loop_run(&store, shape, duration)?,
    };
    let stats = store.stats();
    m.bytes = stats.flushed_bytes;
    m.syncs = stats.flushes;
    m.overlapped = stats.flushes_overlapped;
    drop(store);
    fs::remove_dir_all(&sub).map_err(io("remove store directory", &sub))?;
    Ok(m)
}

/// Appends with a retry while the segment is `Busy` (backpressure).
fn append_retrying(
    store: &FileStore,
    segment: SegmentId,
    records: &[Record],
    busy: &AtomicU64,
) -> Result<AppendTicket, StorageError> {
    loop {
        match store.append(segment, &records) {
            Err(StorageError::Busy { .. }) => {
                busy.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(BUSY_BACKOFF);
            }
            other => return other,
        }
    }
}

/// One thread per appender, each with one batch in flight: the next batch
/// leaves when the previous one's ack comes back.
fn closed_loop_run(
    store: &FileStore,
    shape: StoreShape,
    duration: Duration,
) -> Result<Measured, StorageError> {
    let StoreShape {
        segments,
        appenders,
        batch,
    } = shape;
    let barrier = Barrier::new(appenders);
    let busy = AtomicU64::new(0);
    type Outcome = Result<(u64, f64, Histogram<u64>), StorageError>;
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..appenders)
            .map(|a| {
                let (barrier, busy) = (&barrier, &busy);
                s.spawn(move || {
                    let segment = SegmentId((a % segments) as u64);
                    let records: Vec<Record> = (0..batch as u64).map(bench_record).collect();
                    let mut hist = histogram();
                    let mut sent = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    while start.elapsed() < duration {
                        let sent_at = Instant::now();
                        append_retrying(store, segment, &records, busy)?.wait()?;
                        hist.saturating_record(elapsed_us(sent_at));
                        sent += batch as u64;
                    }
                    Ok((sent, start.elapsed().as_secs_f64(), hist))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(StorageError::ShuttingDown)))
            .collect()
    });
    let mut m = Measured {
        busy: busy.load(Ordering::Relaxed),
        ..Measured::empty(false)
    };
    for outcome in outcomes {
        let (records, seconds, hist) = outcome?;
        m.records += records;
        m.seconds = m.seconds.max(seconds);
        let _ = m.hist.add(&hist);
    }
    Ok(m)
}

/// What the acks of a paced run share with the thread that sends.
struct PacedAcks {
    /// Append-to-ack latency, recorded by the waker at the moment the store
    /// completes a ticket (on the sync thread that completed it).
    hist: Mutex<Histogram<u64>>,
    /// Appenders whose batch was acked since the sender last looked.
    acked: Mutex<Vec<usize>>,
    sender: std::thread::Thread,
}

/// Wakes the sender when appender `appender`'s batch, sent at `sent_at`, is
/// acked, and records its latency then.
struct AckWaker {
    appender: usize,
    sent_at: Instant,
    acks: Arc<PacedAcks>,
}

impl Wake for AckWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.acks
            .hist
            .lock()
            .saturating_record(elapsed_us(self.sent_at));
        self.acks.acked.lock().push(self.appender);
        self.acks.sender.unpark();
    }
}

/// Paced appenders driven by one sending thread: appender *a* sends a batch
/// every `pace` (staggered so they do not all fire at once), with at most
/// one batch in flight; a send due while its previous batch is unacked
/// leaves when the ack arrives, and `lag` records how late it left.
///
/// One thread keeps the schedule better than one sleeping thread per
/// appender: with 64 appenders on two cores, those threads' own wake-ups
/// were tens of milliseconds late at p99, and each ack cost a thread
/// wake-up before its latency was even read. Here an ack's latency is taken
/// by the ticket's waker, at completion.
fn paced_run(
    store: &FileStore,
    shape: StoreShape,
    duration: Duration,
    pace: Duration,
) -> Result<Measured, StorageError> {
    let StoreShape {
        segments,
        appenders,
        batch,
    } = shape;
    let records: Vec<Record> = (0..batch as u64).map(bench_record).collect();
    let acks = Arc::new(PacedAcks {
        hist: Mutex::new(histogram()),
        acked: Mutex::new(Vec::with_capacity(appenders)),
        sender: std::thread::current(),
    });
    let busy = AtomicU64::new(0);
    let mut lag = histogram();
    let start = Instant::now();
    let mut due: Vec<Instant> = (0..appenders)
        .map(|a| start + pace.mul_f64(a as f64 / appenders as f64))
        .collect();
    let mut in_flight: Vec<Option<AppendTicket>> = (0..appenders).map(|_| None).collect();
    let (mut sent, mut acked) = (0u64, 0u64);
    loop {
        let acked_now = std::mem::take(&mut *acks.acked.lock());
        for a in acked_now {
            if let Some(ticket) = in_flight[a].take() {
                // Woken, so complete: this only reads the outcome.
                ticket.wait()?;
                acked += batch as u64;
            }
        }
        let now = Instant::now();
        if now.duration_since(start) >= duration {
            if in_flight.iter().all(Option::is_none) {
                break;
            }
            std::thread::park_timeout(Duration::from_millis(1));
            continue;
        }
        let next = (0..appenders)
            .filter(|&a| in_flight[a].is_none())
            .min_by_key(|&a| due[a]);
        let Some(a) = next else {
            // Every appender has a batch in flight: wait for an ack (its
            // waker unparks us), never spin on the CPU the syncs need.
            std::thread::park_timeout(pace);
            continue;
        };
        if due[a] > now {
            std::thread::park_timeout(due[a] - now);
            continue;
        }
        lag.saturating_record(elapsed_us(due[a]));
        due[a] += pace;
        let segment = SegmentId((a % segments) as u64);
        let sent_at = Instant::now();
        let mut ticket = append_retrying(store, segment, &records, &busy)?;
        sent += batch as u64;
        let waker = Waker::from(Arc::new(AckWaker {
            appender: a,
            sent_at,
            acks: Arc::clone(&acks),
        }));
        match Pin::new(&mut ticket).poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(outcome) => {
                acks.hist.lock().saturating_record(elapsed_us(sent_at));
                outcome?;
                acked += batch as u64;
            }
            Poll::Pending => in_flight[a] = Some(ticket),
        }
    }
    debug_assert_eq!(acked, sent, "the loop ends with nothing in flight");
    let hist = acks.hist.lock().clone();
    Ok(Measured {
        records: acked,
        // Until the last ack: the records counted include those acked
        // after sending stopped.
        seconds: start.elapsed().as_secs_f64(),
        hist,
        busy: busy.load(Ordering::Relaxed),
        lag: Some(lag),
        ..Measured::empty(false)
    })
}

/// Writes `bytes` of records to one segment, reopens the store, and reads
/// them back in order, 1 MiB per read.
fn read_run(
    dir: &Path,
    cfg: &StoreConfig,
    bytes: u64,
    frame: usize,
) -> Result<ScenarioResult, StorageError> {
    let sub = dir.join("read");
    let segment = SegmentId(0);
    let total = bytes / frame as u64;
    {
        let store = FileStore::open_dir(&sub, cfg.clone())?;
        store.open(segment)?;
        let batch: Vec<Record> = (0..1000).map(bench_record).collect();
        let mut written = 0;
        while written < total {
            store.append(segment, &batch)?.wait()?;
            written += batch.len() as u64;
        }
    }
    let store = FileStore::open_dir(&sub, cfg.clone())?;
    let length = store.open(segment)?.info.length;
    let mut hist = histogram();
    let start = Instant::now();
    let (mut offset, mut read_bytes) = (0u64, 0u64);
    while offset < length {
        let t = Instant::now();
        let page = store.read(segment, offset, 100_000, 1 << 20)?;
        hist.saturating_record(elapsed_us(t));
        offset += page.len() as u64;
        read_bytes += (page.len() * frame) as u64;
    }
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    drop(store);
    fs::remove_dir_all(&sub).map_err(io("remove read directory", &sub))?;
    Ok(ScenarioResult {
        system: "malachi",
        scenario: format!("read sequential segments=1 bytes={}", human(bytes as usize)),
        files: 1,
        appenders: 1,
        batch_records: 0,
        mb_per_s: read_bytes as f64 / seconds / 1e6,
        records_per_s: offset as f64 / seconds,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        write_bytes_mean: 0.0,
        ratio_to_raw: None,
        ratio_to_raw_batch: None,
        raw_baseline: None,
        raw_mb_per_s: None,
        raw_p99_us: None,
        p99_target_us: None,
        offered_records_per_s: None,
        send_lag_p99_us: None,
        busy_retries: 0,
        flushes_overlapped: 0,
    })
}

/// The alignment of `O_DIRECT` offsets, lengths and buffers, as the store
/// uses it (4 KiB covers the logical block sizes in use).
const BLOCK_BYTES: usize = 4096;

/// `len` bytes of `byte` starting at a `BLOCK_BYTES`-aligned address, for
/// the raw disk's `O_DIRECT` writes: a `Vec` over-allocated by one block,
/// so no unsafe code is needed.
struct AlignedBytes {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBytes {
    fn filled(byte: u8, len: usize) -> AlignedBytes {
        let raw = vec![byte; len + BLOCK_BYTES];
        let start = raw.as_ptr().align_offset(BLOCK_BYTES);
        assert!(start < BLOCK_BYTES, "cannot align a heap buffer");
        AlignedBytes { raw, start, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_raw_run_writes_whole_blocks_and_removes_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let raw = raw_disk_direct(dir.path(), 2, 5000, Duration::from_millis(100)).unwrap();
        assert!(raw.writes >= 2, "each writer syncs at least once");
        // 5,000 bytes round up to two 4 KiB blocks per write.
        assert_eq!(raw.bytes, raw.writes * 8192);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_raw_disk_run_writes_every_file_and_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let raw = raw_disk(dir.path(), 2, 4096, Duration::from_millis(100)).unwrap();
        assert!(raw.writes >= 2, "each writer syncs at least once");
        assert_eq!(raw.bytes, raw.writes * 4096);
        assert!(raw.seconds >= 0.1);
        assert_eq!(raw.latency_us.len(), raw.writes);
        assert!(raw.mb_per_s() > 0.0 && raw.writes_per_s() > 0.0);
        assert!(raw.latency_us_at(0.5) <= raw.latency_us_at(0.99));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_paced_run_acks_every_batch_it_sends_and_records_each_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open_dir(dir.path(), StoreConfig::default()).unwrap();
        for s in 0..3 {
            store.open(SegmentId(s)).unwrap();
        }
        let shape = StoreShape {
            segments: 3,
            appenders: 6,
            batch: 4,
        };
        let m = paced_run(
            &store,
            shape,
            Duration::from_millis(150),
            Duration::from_millis(10),
        )
        .unwrap();
        let batches = m.records / 4;
        assert!(batches >= 6, "every appender sends at least once");
        assert_eq!(m.records % 4, 0);
        // One latency and one lag sample per batch, and every acked record is
        // durable in the store.
        assert_eq!(m.hist.len(), batches);
        assert_eq!(m.lag.as_ref().map(Histogram::len), Some(batches));
        let durable: u64 = (0..3)
            .map(|s| store.info(SegmentId(s)).unwrap().length)
            .sum();
        assert_eq!(durable, m.records);
        assert!(m.seconds >= 0.15);
    }

    #[test]
    fn a_benchmark_record_frame_is_just_over_one_kib() {
        assert_eq!(frame_bytes(), 12 + 36 + 8 + VALUE_BYTES);
    }

    #[test]
    fn the_raw_baseline_interpolates_time_per_sync_at_the_same_file_count() {
        let mk = |files, write: f64, mb, p99| ScenarioResult {
            system: "raw-disk",
            scenario: format!("{files}-{write}"),
            files,
            appenders: 1,
            batch_records: 1,
            mb_per_s: mb,
            records_per_s: 0.0,
            p50_us: 0,
            p99_us: p99,
            p999_us: 0,
            write_bytes_mean: write,
            ratio_to_raw: None,
            ratio_to_raw_batch: None,
            raw_baseline: None,
            raw_mb_per_s: None,
            raw_p99_us: None,
            p99_target_us: None,
            offered_records_per_s: None,
            send_lag_p99_us: None,
            busy_retries: 0,
            flushes_overlapped: 0,
        };
        // 1 file: 1 MB in 1 ms (1000 MB/s) and 3 MB in 2 ms (1500 MB/s).
        let raw = vec![
            mk(1, 1e6, 1000.0, 100),
            mk(1, 3e6, 1500.0, 300),
            mk(8, 1e6, 4000.0, 50),
        ];
        let mid = raw_at(&raw, 1, 2e6).unwrap();
        // 2 MB halfway: 1.5 ms per sync, so 2 MB / 1.5 ms.
        assert!((mid.mb_per_s - 2e6 / 1.5e-3 / 1e6).abs() < 1e-6);
        assert_eq!(mid.p99_us, 200);
        assert_eq!(raw_at(&raw, 1, 10.0).unwrap().mb_per_s, 1000.0);
        assert_eq!(raw_at(&raw, 1, 1e9).unwrap().mb_per_s, 1500.0);
        // 12 files use the 8-file measurements, never the single file's.
        assert_eq!(raw_at(&raw, 12, 1e6).unwrap().mb_per_s, 4000.0);
    }
}
