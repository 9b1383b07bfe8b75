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
//! - right after each store scenario, paired with it: `min(appenders,
//!   segments)` files (the files the scenario keeps syncing at once), each
//!   written at the mean bytes per fdatasync the store actually issued in
//!   that scenario, for the same duration. `ratio_to_raw` divides by this
//!   run, so it is the store's overhead over a disk doing the same syncs at
//!   nearly the same moment (this disk's bandwidth drifts by tens of percent
//!   from one minute to the next).

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::StorageError;
use crate::file_store::FileStore;
use crate::record::Record;
use crate::store::{SegmentId, SegmentStore, StoreConfig};

/// Bytes in each benchmark record's value (the key is 8 bytes).
pub const VALUE_BYTES: usize = 1024;
const APPENDERS: [usize; 3] = [1, 8, 64];
const SEGMENTS: [usize; 2] = [1, 16];
const BATCHES: [usize; 4] = [1, 10, 100, 1000];
/// Raw write sizes, in records' worth of frames.
const RAW_WRITE_RECORDS: [usize; 5] = [1, 10, 100, 1000, 10_000];
const BUSY_BACKOFF: Duration = Duration::from_micros(50);

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
}

struct Measured {
    bytes: u64,
    records: u64,
    seconds: f64,
    hist: Histogram<u64>,
    syncs: u64,
    busy: u64,
    lag: Option<Histogram<u64>>,
}

/// The size of one benchmark record's frame on disk.
pub fn frame_bytes() -> usize {
    crate::frame::FRAME_HEADER_BYTES + crate::frame::payload_len(&bench_record(0)).unwrap_or(0)
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
    move |e| StorageError::io(op, path, e)
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
/// then compares it with the raw grid and with a raw run paired right after it.
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
    let m = store_run(
        &opts.dir,
        cfg,
        segments,
        appenders,
        batch,
        Duration::from_secs_f64(store_secs),
        pace,
    )?;
    let mut r = to_result("malachi", name, segments, appenders, batch, &m, frame);
    let files = segments.min(appenders);
    compare(&mut r, raw, files, batch * frame);
    pair(&opts.dir, &mut r, files, store_secs, frame)?;
    Ok(r)
}

/// Measures the raw disk right after a store scenario, at the scenario's
/// parallelism and mean write size, and sets `ratio_to_raw` from it.
fn pair(
    dir: &Path,
    r: &mut ScenarioResult,
    files: usize,
    secs: f64,
    frame: usize,
) -> Result<(), StorageError> {
    let write_bytes = (r.write_bytes_mean.round() as usize).max(frame);
    let m = raw_run(dir, files, write_bytes, Duration::from_secs_f64(secs))?;
    let base = to_result("raw-disk", String::new(), files, 1, 0, &m, frame);
    r.ratio_to_raw = Some(r.mb_per_s / base.mb_per_s.max(1e-9));
    r.raw_baseline = Some(format!("paired raw files={files} write={write_bytes}B"));
    r.raw_mb_per_s = Some(base.mb_per_s);
    r.raw_p99_us = Some(base.p99_us);
    Ok(())
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
    let write_bytes = write_bytes.next_multiple_of(crate::direct::BLOCK_BYTES);
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
                    let mut aligned = crate::direct::AlignedBuf::default();
                    aligned.reset(write_bytes);
                    aligned.extend_from_slice(&vec![0x5Au8; write_bytes]);
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
    fn of_raw(raw: RawResult) -> Measured {
        Measured {
            bytes: raw.bytes,
            records: 0,
            seconds: raw.seconds,
            hist: raw.latency_us,
            syncs: raw.writes,
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
    let barrier = Barrier::new(appenders);
    let busy = AtomicU64::new(0);
    type Outcome = Result<(u64, f64, Histogram<u64>, Histogram<u64>), StorageError>;
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..appenders)
            .map(|a| {
                let (store, barrier, busy) = (&store, &barrier, &busy);
                s.spawn(move || {
                    let segment = SegmentId((a % segments) as u64);
                    let records: Vec<Record> = (0..batch as u64).map(bench_record).collect();
                    let (mut hist, mut lag) = (histogram(), histogram());
                    let mut sent = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    // Stagger paced appenders so they do not all fire at once.
                    let mut next = start
                        + pace.map_or(Duration::ZERO, |p| p.mul_f64(a as f64 / appenders as f64));
                    while start.elapsed() < duration {
                        if let Some(p) = pace {
                            let now = Instant::now();
                            if next > now {
                                std::thread::sleep(next - now);
                            }
                            lag.saturating_record(elapsed_us(next));
                            next += p;
                        }
                        let sent_at = Instant::now();
                        let ticket = loop {
                            match store.append(segment, &records) {
                                Ok(ticket) => break ticket,
                                Err(StorageError::Busy { .. }) => {
                                    busy.fetch_add(1, Ordering::Relaxed);
                                    std::thread::sleep(BUSY_BACKOFF);
                                }
                                Err(e) => return Err(e),
                            }
                        };
                        ticket.wait()?;
                        hist.saturating_record(elapsed_us(sent_at));
                        sent += batch as u64;
                    }
                    Ok((sent, start.elapsed().as_secs_f64(), hist, lag))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(StorageError::ShuttingDown)))
            .collect()
    });
    let mut m = Measured {
        bytes: 0,
        records: 0,
        seconds: 0.0,
        hist: histogram(),
        syncs: 0,
        busy: busy.load(Ordering::Relaxed),
        lag: pace.map(|_| histogram()),
    };
    for outcome in outcomes {
        let (records, seconds, hist, lag) = outcome?;
        m.records += records;
        m.seconds = m.seconds.max(seconds);
        let _ = m.hist.add(&hist);
        if let Some(total) = m.lag.as_mut() {
            let _ = total.add(&lag);
        }
    }
    let stats = store.stats();
    m.bytes = stats.flushed_bytes;
    m.syncs = stats.flushes;
    drop(store);
    fs::remove_dir_all(&sub).map_err(io("remove store directory", &sub))?;
    Ok(m)
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
    })
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
