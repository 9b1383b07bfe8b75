//! `malachi bench compare`: the disk's and the loopback's limits, Redis
//! Streams, NATS JetStream and Malachi measured in one run, side by side
//! (issue 8).
//!
//! Life of a run:
//!
//! 1. **Limits.** The raw disk (pwrite + fdatasync on plain files, the storage
//!    benchmark's method) at each producer count, each file written at the
//!    size of one Malachi produce batch of payload; the fsync latency of 4 KiB
//!    writes on one file; one loopback TCP stream's bandwidth.
//! 2. **Systems.** Each system is a server process this run starts on a free
//!    loopback port with a fresh data directory (a [`ServerGuard`] kills it
//!    and removes the directory however the run ends): Malachi (this same
//!    executable, `malachi broker`, `flush_interval_ms = 0`), then each peer
//!    twice, durable per write and in its default mode. A peer that is
//!    missing and cannot be installed is skipped with one line saying why.
//! 3. **Load.** For each producer count, N producers with 1 KiB records keep
//!    [`WINDOW_RECORDS`] records each unacknowledged for the row's duration.
//!    Malachi sends them as produce requests of [`MALACHI_BATCH_RECORDS`]
//!    records (its produce path in `bench.rs`); Redis as pipelined `XADD`s;
//!    NATS as JetStream publishes with their acks awaited ([`load`]).
//!    Then one consumer reads back what the 16-producer row wrote.
//! 4. **Report.** Ratios to the raw disk and between Malachi and each peer,
//!    a table (or JSON lines, also written to `bench/results/<date>.json`
//!    with a chart in `<date>.svg`), and the targets.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::super::error::CliError;
use super::super::{BenchCompareArgs, OutputArgs};
use super::load::{self, Producer};
use super::{AtTail, LoadOutcome, ProduceLoad, consume_load, histogram, micros, produce_load};
use malachi_bench::peers::{self, InstallPolicy, Mode, Peer, PeerBinary, ServerGuard};
use malachi_bench::report::{self, LOOPBACK, MALACHI, RAW_DISK, Row};

/// Bytes of each record's value, for every system.
pub const RECORD_BYTES: usize = 1024;
/// Records per Malachi produce request (as in docs/benchmarks.md).
pub const MALACHI_BATCH_RECORDS: u32 = 100;
/// Produce requests each Malachi producer keeps in flight.
pub const MALACHI_WINDOW: usize = 4;
/// Unacknowledged records each producer keeps in flight, for every system:
/// Malachi's batch times its window.
pub const WINDOW_RECORDS: usize = MALACHI_BATCH_RECORDS as usize * MALACHI_WINDOW;
/// Malachi's fetch size when reading back: about the [`load::READ_RECORDS_MAX`]
/// records the peers are asked for per read.
const FETCH_BYTES: u32 = 1 << 20;
/// Each row's duration with `--quick` and without.
const ROW_QUICK: Duration = Duration::from_secs(5);
const ROW_FULL: Duration = Duration::from_secs(20);
/// The raw disk runs at most this long per point.
const RAW_MAX: Duration = Duration::from_secs(5);
/// How long a peer may take, after a row, to finish writes still queued in
/// it, and how often its stream length is polled meanwhile.
const SETTLE_MAX: Duration = Duration::from_secs(5);
const SETTLE_POLL: Duration = Duration::from_millis(300);
/// The fsync latency probe's write size.
const FSYNC_PROBE_BYTES: usize = 4096;
/// The loopback probe's write size.
const LOOPBACK_WRITE_BYTES: usize = 1 << 20;
/// Client request timeout against the bench's own Malachi broker.
const MALACHI_TIMEOUT_MS: u64 = 60_000;
/// Systems `--only` accepts.
pub const SYSTEMS: [&str; 3] = [MALACHI, "redis", "nats"];
/// The producer count whose data the consume scenario reads back.
const CONSUME_SOURCE_PRODUCERS: usize = 16;

/// What one run does, from the flags.
#[derive(Debug, Clone)]
pub struct Plan {
    pub row: Duration,
    pub raw: Duration,
    pub producers: Vec<usize>,
    pub systems: Vec<String>,
    pub install: InstallPolicy,
    pub dir: PathBuf,
    pub json: bool,
    pub results_dir: PathBuf,
}

impl Plan {
    pub fn from_args(args: &BenchCompareArgs) -> Result<Plan, CliError> {
        let row = args
            .duration
            .unwrap_or(if args.quick { ROW_QUICK } else { ROW_FULL });
        let systems: Vec<String> = if args.only.is_empty() {
            SYSTEMS.iter().map(|s| (*s).to_owned()).collect()
        } else {
            args.only.iter().map(|s| s.trim().to_lowercase()).collect()
        };
        if let Some(bad) = systems.iter().find(|s| !SYSTEMS.contains(&s.as_str())) {
            return Err(CliError::Bench(format!(
                "--only: unknown system {bad:?} (use {})",
                SYSTEMS.join(", ")
            )));
        }
        let mut producers = args.producers.clone();
        producers.sort_unstable();
        producers.dedup();
        if producers.is_empty() || producers.iter().any(|&n| n == 0 || n > super::CLIENTS_MAX) {
            return Err(CliError::Bench(format!(
                "--producers: each count must be 1 to {}",
                super::CLIENTS_MAX
            )));
        }
        Ok(Plan {
            row,
            raw: row.min(RAW_MAX),
            producers,
            systems,
            install: InstallPolicy::from_flags(args.no_install),
            dir: args.dir.clone().unwrap_or_else(std::env::temp_dir),
            json: args.json,
            results_dir: args.results_dir.clone(),
        })
    }

    fn wants(&self, system: &str) -> bool {
        self.systems.iter().any(|s| s == system)
    }

    /// The produce scenario the consume scenario reads back.
    fn consume_source(&self) -> usize {
        if self.producers.contains(&CONSUME_SOURCE_PRODUCERS) {
            CONSUME_SOURCE_PRODUCERS
        } else {
            self.producers.last().copied().unwrap_or(1)
        }
    }
}

fn scenario(producers: usize) -> String {
    format!("produce-p{producers}")
}

/// Lines about what was skipped and why, and progress: on stdout with the
/// table, on stderr when stdout carries JSON.
struct Notes {
    json: bool,
    progress: bool,
}

impl Notes {
    fn note(&self, line: &str) {
        if self.json {
            eprintln!("bench compare: {line}");
        } else {
            println!("bench compare: {line}");
        }
    }

    fn progress(&self, line: &str) {
        if self.progress {
            eprintln!("bench compare: {line}");
        }
    }
}

pub async fn compare(args: BenchCompareArgs) -> Result<(), CliError> {
    let plan = Plan::from_args(&args)?;
    let notes = Notes {
        json: plan.json,
        progress: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    std::fs::create_dir_all(&plan.dir)
        .map_err(|e| CliError::Bench(format!("cannot create {}: {e}", plan.dir.display())))?;
    if !plan.json {
        println!(
            "bench compare: {} per row, 1 KiB records, {} records in flight per producer, producers {:?}, files in {}",
            human_duration(plan.row),
            WINDOW_RECORDS,
            plan.producers,
            plan.dir.display()
        );
    }

    let mut rows = limits(&plan, &notes).await?;
    if plan.wants(MALACHI) {
        rows.extend(run_malachi(&plan, &notes).await?);
    }
    for peer in [Peer::Redis, Peer::Nats] {
        if !plan.wants(peer.name()) {
            continue;
        }
        let install = plan.install.clone();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let located = tokio::task::spawn_blocking(move || match peer {
            Peer::Redis => peers::locate_redis(&path, &install),
            Peer::Nats => peers::locate_nats(&path, &install),
        })
        .await
        .map_err(|e| CliError::Bench(format!("locating {}: {e}", peer.name())))?;
        let bin = match located {
            Ok(bin) => bin,
            Err(why) => {
                notes.note(&format!("skipped {}: {why}", peer.name()));
                continue;
            }
        };
        for mode in [Mode::Durable, Mode::Default] {
            match run_peer(peer, &bin, mode, &plan, &notes).await {
                Ok(peer_rows) => rows.extend(peer_rows),
                Err(e) => notes.note(&format!(
                    "skipped {} {} (the run failed): {e}",
                    peer.name(),
                    mode.name()
                )),
            }
        }
    }
    if plan.wants("redis") || plan.wants("nats") {
        notes.note(
            "consume: each peer is read back in its durable mode only (reading does not depend on when the writer fsyncs)",
        );
    }
    notes.note(
        "skipped rf=3 (three brokers against a three-node NATS cluster): Malachi replication has not landed yet",
    );

    sort_rows(&mut rows);
    report::fill_ratios(&mut rows);
    if plan.json {
        let mut text = String::new();
        for row in &rows {
            let line = serde_json::to_string(row)
                .map_err(|e| CliError::Bench(format!("cannot encode a row: {e}")))?;
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
        write_results(&plan, &rows, &text, &notes)?;
    } else {
        println!();
        print!("{}", report::table(&rows));
        println!();
        for target in report::targets(&rows) {
            println!("{}", target.line());
        }
    }
    notes.progress(&format!("done in {:.0}s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// Order: by scenario as the plan runs them, then the limit, Malachi, the
/// peers durable before default.
fn sort_rows(rows: &mut [Row]) {
    let scenario_rank = |s: &str| -> (u8, usize) {
        match s.strip_prefix("produce-p").and_then(|n| n.parse().ok()) {
            Some(n) => (0, n),
            None if s == "consume" => (1, 0),
            None if s == "fsync-latency" => (2, 0),
            None => (3, 0),
        }
    };
    let system_rank = |s: &str| match s {
        RAW_DISK => 0,
        MALACHI => 1,
        "redis" => 2,
        "nats" => 3,
        _ => 4,
    };
    let durability_rank = |d: &str| match d {
        "durable" => 0,
        "default" => 1,
        _ => 2,
    };
    rows.sort_by_key(|r| {
        (
            scenario_rank(&r.scenario),
            system_rank(&r.system),
            durability_rank(&r.durability),
        )
    });
}

fn write_results(plan: &Plan, rows: &[Row], json: &str, notes: &Notes) -> Result<(), CliError> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let date = report::utc_date(now);
    let dir = &plan.results_dir;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        CliError::Bench(format!("cannot write {what} in {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| fail("results", &e))?;
    let json_path = dir.join(format!("{date}.json"));
    std::fs::write(&json_path, json).map_err(|e| fail("the json", &e))?;
    let title = format!(
        "malachi bench compare, {date}, {} cores, {} per row",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        human_duration(plan.row)
    );
    let svg = malachi_bench::chart::svg(rows, &title).map_err(|e| fail("the chart", &e))?;
    let svg_path = dir.join(format!("{date}.svg"));
    std::fs::write(&svg_path, svg).map_err(|e| fail("the chart", &e))?;
    notes.note(&format!(
        "wrote {} and {}",
        json_path.display(),
        svg_path.display()
    ));
    Ok(())
}

fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A row from a load outcome; ratios are filled in at the end.
fn row(
    system: &str,
    scenario: String,
    durability: Mode,
    fsync: &str,
    clients: usize,
    outcome: &LoadOutcome,
    version: &str,
) -> Row {
    Row {
        system: system.to_owned(),
        scenario,
        durability: durability.name().to_owned(),
        fsync: fsync.to_owned(),
        clients,
        record_bytes: RECORD_BYTES,
        seconds: outcome.seconds,
        records: outcome.records,
        mb_per_s: outcome.mb_per_s(),
        records_per_s: outcome.records_per_s(),
        p50_us: quantile(outcome, 0.50),
        p99_us: quantile(outcome, 0.99),
        p999_us: quantile(outcome, 0.999),
        ratio_to_raw: None,
        malachi_over_this: None,
        ratio_to_peers: BTreeMap::new(),
        errors: outcome.errors,
        dropped: outcome.dropped,
        version: version.to_owned(),
    }
}

/// A latency quantile, or none when nothing was acknowledged.
fn quantile(outcome: &LoadOutcome, q: f64) -> Option<u64> {
    (outcome.records > 0 && !outcome.hist.is_empty()).then(|| outcome.hist.value_at_quantile(q))
}

/// The machine's limits: the raw disk at each producer count, fsync latency
/// and loopback bandwidth.
async fn limits(plan: &Plan, notes: &Notes) -> Result<Vec<Row>, CliError> {
    let mut rows = Vec::new();
    let write_bytes = MALACHI_BATCH_RECORDS as usize * RECORD_BYTES;
    for &files in &plan.producers {
        notes.progress(&format!(
            "raw disk: {files} files x {write_bytes} B writes, {}",
            human_duration(plan.raw)
        ));
        let raw = raw_disk(plan, files, write_bytes).await?;
        let per_write = u64::from(MALACHI_BATCH_RECORDS);
        rows.push(Row {
            system: RAW_DISK.into(),
            scenario: scenario(files),
            durability: Mode::Durable.name().into(),
            fsync: "per write".into(),
            clients: files,
            record_bytes: RECORD_BYTES,
            seconds: raw.seconds,
            // In 1 KiB records' worth, so the row reads like the others.
            records: raw.records * per_write,
            mb_per_s: raw.mb_per_s,
            records_per_s: raw.records_per_s * per_write as f64,
            p50_us: Some(raw.p50_us),
            p99_us: Some(raw.p99_us),
            p999_us: Some(raw.p999_us),
            ratio_to_raw: None,
            malachi_over_this: None,
            ratio_to_peers: BTreeMap::new(),
            errors: 0,
            dropped: 0,
            version: format!("pwrite+fdatasync, {files} files x {write_bytes} B"),
        });
    }
    notes.progress("fsync latency and loopback bandwidth");
    let probe = plan.raw.min(Duration::from_secs(2));
    let fsync = raw_disk(
        &Plan {
            raw: probe,
            ..plan.clone()
        },
        1,
        FSYNC_PROBE_BYTES,
    )
    .await?;
    rows.push(Row {
        system: RAW_DISK.into(),
        scenario: "fsync-latency".into(),
        durability: "-".into(),
        fsync: "-".into(),
        clients: 1,
        record_bytes: FSYNC_PROBE_BYTES,
        seconds: fsync.seconds,
        records: fsync.records,
        mb_per_s: fsync.mb_per_s,
        records_per_s: fsync.records_per_s,
        p50_us: Some(fsync.p50_us),
        p99_us: Some(fsync.p99_us),
        p999_us: Some(fsync.p999_us),
        ratio_to_raw: None,
        malachi_over_this: None,
        ratio_to_peers: BTreeMap::new(),
        errors: 0,
        dropped: 0,
        version: format!("pwrite+fdatasync, 1 file x {FSYNC_PROBE_BYTES} B"),
    });
    let tcp = loopback_bandwidth(probe).await?;
    rows.push(Row {
        system: LOOPBACK.into(),
        scenario: "tcp-bandwidth".into(),
        durability: "-".into(),
        fsync: "-".into(),
        clients: 1,
        record_bytes: LOOPBACK_WRITE_BYTES,
        seconds: tcp.seconds,
        records: tcp.records,
        mb_per_s: tcp.mb_per_s(),
        records_per_s: tcp.records_per_s(),
        p50_us: quantile(&tcp, 0.50),
        p99_us: quantile(&tcp, 0.99),
        p999_us: quantile(&tcp, 0.999),
        ratio_to_raw: None,
        malachi_over_this: None,
        ratio_to_peers: BTreeMap::new(),
        errors: 0,
        dropped: 0,
        version: format!("one TCP stream on 127.0.0.1, {LOOPBACK_WRITE_BYTES} B writes"),
    });
    Ok(rows)
}

async fn raw_disk(
    plan: &Plan,
    files: usize,
    write_bytes: usize,
) -> Result<super::BenchResult, CliError> {
    let (dir, duration) = (plan.dir.clone(), plan.raw);
    tokio::task::spawn_blocking(move || super::raw_disk(&dir, files, write_bytes, duration, true))
        .await
        .map_err(|e| CliError::Bench(format!("the raw disk run failed: {e}")))?
}

/// One TCP stream over loopback: a writer sends 1 MiB writes for
/// `duration`, a reader counts what arrives. Latency is per write.
async fn loopback_bandwidth(duration: Duration) -> Result<LoadOutcome, CliError> {
    let fail = |e: std::io::Error| CliError::Bench(format!("loopback probe: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?;
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buf = vec![0u8; LOOPBACK_WRITE_BYTES];
        loop {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await.map_err(fail)?;
    let buf = vec![0x5Au8; LOOPBACK_WRITE_BYTES];
    let mut hist = histogram()?;
    let (started, mut writes) = (Instant::now(), 0u64);
    while started.elapsed() < duration {
        let t = Instant::now();
        socket.write_all(&buf).await.map_err(fail)?;
        hist.saturating_record(micros(t.elapsed()));
        writes += 1;
    }
    socket.shutdown().await.map_err(fail)?;
    drop(socket);
    reader
        .await
        .map_err(|e| CliError::Bench(format!("loopback probe: {e}")))?
        .map_err(fail)?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(LoadOutcome {
        records: writes,
        payload_bytes: received.load(Ordering::Relaxed),
        seconds,
        hist,
        errors: 0,
        dropped: 0,
    })
}

/// A fresh data directory under the plan's directory.
fn fresh_dir(plan: &Plan, prefix: &str) -> Result<tempfile::TempDir, CliError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&plan.dir)
        .map_err(|e| {
            CliError::Bench(format!(
                "cannot create a directory in {}: {e}",
                plan.dir.display()
            ))
        })
}

async fn start_server(
    name: String,
    bin: PathBuf,
    args: Vec<OsString>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    ready: &'static str,
) -> Result<ServerGuard, CliError> {
    tokio::task::spawn_blocking(move || {
        ServerGuard::start(name, &bin, &args, dir, addr, Some(ready))
    })
    .await
    .map_err(|e| CliError::Bench(format!("starting a server: {e}")))?
    .map_err(CliError::from)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Malachi: this executable as `malachi broker`, with the group commit
/// tuned as docs/benchmarks.md runs it.
async fn run_malachi(plan: &Plan, notes: &Notes) -> Result<Vec<Row>, CliError> {
    let dir = fresh_dir(plan, "malachi-compare-")?;
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, malachi_config())
        .map_err(|e| CliError::Bench(format!("cannot write the broker config: {e}")))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let (port, admin) = (peers::free_port()?, peers::free_port()?);
    let args: Vec<OsString> = vec![
        "broker".into(),
        "--config".into(),
        config.into_os_string(),
        "--node-id".into(),
        "1".into(),
        "--listen".into(),
        loopback(port).to_string().into(),
        "--admin-listen".into(),
        loopback(admin).to_string().into(),
        "--data-dir".into(),
        dir.path().join("data").into_os_string(),
    ];
    let version = concat!("malachi ", env!("CARGO_PKG_VERSION"));
    let guard = start_server(
        "malachi broker".into(),
        exe,
        args,
        dir,
        loopback(port),
        "serving clients on",
    )
    .await?;
    let output = OutputArgs {
        broker: guard.addr.to_string(),
        json: true,
        timeout_ms: MALACHI_TIMEOUT_MS,
    };
    let mut rows = Vec::new();
    for &n in &plan.producers {
        notes.progress(&format!("malachi produce, {n} producers"));
        let load = ProduceLoad {
            topic: format!("bench-p{n}"),
            producers: n,
            record_size: RECORD_BYTES,
            batch_records: MALACHI_BATCH_RECORDS,
            window: MALACHI_WINDOW,
            duration: plan.row,
        };
        let (outcome, _) = produce_load(&output, &load, true)
            .await
            .map_err(|e| CliError::Bench(format!("malachi produce ({}): {e}", guard.log_tail())))?;
        rows.push(row(
            MALACHI,
            scenario(n),
            Mode::Durable,
            "per write",
            n,
            &outcome,
            version,
        ));
    }
    notes.progress("malachi consume");
    let topic = format!("bench-p{}", plan.consume_source());
    let mut outcome = consume_load(
        &output,
        &topic,
        1,
        plan.row,
        FETCH_BYTES,
        AtTail::Stop,
        true,
    )
    .await?;
    // consume_load counts encoded block bytes; every system is compared on
    // record payloads.
    outcome.payload_bytes = outcome.records * RECORD_BYTES as u64;
    rows.push(row(
        MALACHI,
        "consume".into(),
        Mode::Durable,
        "per write",
        1,
        &outcome,
        version,
    ));
    drop(guard);
    Ok(rows)
}

/// The broker config of the comparison: flush as soon as the previous sync
/// ends (ADR 0011), 16 sync threads, as docs/benchmarks.md runs it.
pub fn malachi_config() -> &'static str {
    "# written by malachi bench compare\n[store]\nflush_interval_ms = 0\nsync_threads = 16\n"
}

/// One peer in one mode: a fresh server, the produce scenarios, and in
/// durable mode the consume scenario.
async fn run_peer(
    peer: Peer,
    bin: &PeerBinary,
    mode: Mode,
    plan: &Plan,
    notes: &Notes,
) -> Result<Vec<Row>, CliError> {
    let dir = fresh_dir(plan, &format!("{}-compare-", peer.name()))?;
    let port = peers::free_port()?;
    let config_path = dir.path().join(format!("{}.conf", peer.name()));
    let (config, args, ready): (String, Vec<OsString>, &'static str) = match peer {
        Peer::Redis => (
            peers::redis_config(port, dir.path(), mode),
            vec![config_path.clone().into_os_string()],
            "Ready to accept connections",
        ),
        Peer::Nats => (
            peers::nats_config(port, dir.path(), mode),
            vec!["-c".into(), config_path.clone().into_os_string()],
            "Server is ready",
        ),
    };
    std::fs::write(&config_path, config)
        .map_err(|e| CliError::Bench(format!("cannot write {}: {e}", config_path.display())))?;
    let guard = start_server(
        format!("{} ({})", peer.name(), mode.name()),
        bin.path.clone(),
        args,
        dir,
        loopback(port),
        ready,
    )
    .await?;
    let addr = guard.addr.to_string();
    let fsync = mode.fsync(peer);
    let source = plan.consume_source();
    let mut rows = Vec::new();
    for &n in &plan.producers {
        notes.progress(&format!(
            "{} {} produce, {n} producers",
            peer.name(),
            mode.name()
        ));
        let name = format!("bench-p{n}");
        let outcome = match peer {
            Peer::Redis => produce_redis(&addr, &name, n, plan.row).await,
            Peer::Nats => produce_nats(&addr, &name, n, plan.row).await,
        }
        .map_err(|e| CliError::Bench(format!("{e} (server says: {})", guard.log_tail())))?;
        rows.push(row(
            peer.name(),
            scenario(n),
            mode,
            fsync,
            n,
            &outcome,
            &bin.version,
        ));
        // Writes dropped uncounted at the end of the drain may still be
        // queued in the server: let it finish them before the next row, so
        // that row measures its own load.
        notes.progress(&format!("{} {} settling", peer.name(), mode.name()));
        settle(peer, &addr, &name).await;
        if n != source || mode != Mode::Durable {
            // Free the memory (Redis) and disk a later row would otherwise
            // share with this one's data.
            drop_stream(peer, &addr, &name).await;
        }
    }
    if mode == Mode::Durable {
        notes.progress(&format!("{} consume", peer.name()));
        let name = format!("bench-p{source}");
        let outcome = match peer {
            Peer::Redis => consume_redis(&addr, &name, plan.row).await,
            Peer::Nats => consume_nats(&addr, &name, plan.row).await,
        }?;
        rows.push(row(
            peer.name(),
            "consume".into(),
            mode,
            fsync,
            1,
            &outcome,
            &bin.version,
        ));
    }
    drop(guard);
    Ok(rows)
}

fn value() -> Bytes {
    Bytes::from(vec![0x5Au8; RECORD_BYTES])
}

async fn produce_redis(
    addr: &str,
    key: &str,
    producers: usize,
    duration: Duration,
) -> Result<LoadOutcome, CliError> {
    let value: Arc<[u8]> = Arc::from(&value()[..]);
    let mut all: Vec<Producer> = Vec::with_capacity(producers);
    for _ in 0..producers {
        let conn = load::redis_streams::connect(addr)
            .await
            .map_err(|e| CliError::Bench(format!("redis connect: {e}")))?;
        all.push(load::redis_streams::producer(
            conn,
            key.to_owned(),
            value.clone(),
        ));
    }
    load::drive(all, WINDOW_RECORDS, RECORD_BYTES, duration).await
}

async fn produce_nats(
    addr: &str,
    stream: &str,
    producers: usize,
    duration: Duration,
) -> Result<LoadOutcome, CliError> {
    let fail = |e: String| CliError::Bench(format!("nats: {e}"));
    let setup = load::jetstream::connect(addr).await.map_err(fail)?;
    load::jetstream::create_stream(&setup, stream)
        .await
        .map_err(fail)?;
    let mut all: Vec<Producer> = Vec::with_capacity(producers);
    for _ in 0..producers {
        let context = load::jetstream::connect(addr).await.map_err(fail)?;
        all.push(load::jetstream::producer(
            context,
            load::jetstream::subject(stream),
            value(),
        ));
    }
    load::drive(all, WINDOW_RECORDS, RECORD_BYTES, duration).await
}

async fn consume_redis(addr: &str, key: &str, duration: Duration) -> Result<LoadOutcome, CliError> {
    let conn = load::redis_streams::connect(addr)
        .await
        .map_err(|e| CliError::Bench(format!("redis connect: {e}")))?;
    let mut reader = load::redis_streams::StreamReader {
        conn,
        key: key.to_owned(),
        after: "-".to_owned(),
    };
    load::play_back(duration, &mut reader).await
}

async fn consume_nats(
    addr: &str,
    stream: &str,
    duration: Duration,
) -> Result<LoadOutcome, CliError> {
    let fail = |e: String| CliError::Bench(format!("nats: {e}"));
    let context = load::jetstream::connect(addr).await.map_err(fail)?;
    let consumer = load::jetstream::reader(&context, stream)
        .await
        .map_err(fail)?;
    load::play_back(duration, &mut load::jetstream::StreamReader { consumer }).await
}

/// Wait until the peer's stream stops growing (two equal counts
/// [`SETTLE_POLL`] apart), for at most [`SETTLE_MAX`].
async fn settle(peer: Peer, addr: &str, name: &str) {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < SETTLE_MAX {
        let count = stream_len(peer, addr, name).await;
        if count.is_some() && count == last {
            return;
        }
        last = count;
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

async fn stream_len(peer: Peer, addr: &str, name: &str) -> Option<u64> {
    match peer {
        Peer::Redis => {
            let mut conn = load::redis_streams::connect(addr).await.ok()?;
            redis::cmd("XLEN")
                .arg(name)
                .query_async::<u64>(&mut conn)
                .await
                .ok()
        }
        Peer::Nats => {
            let context = load::jetstream::connect(addr).await.ok()?;
            let stream = context.get_stream(name).await.ok()?;
            Some(stream.cached_info().state.messages)
        }
    }
}

/// Best effort: a failure only leaves data in a directory removed at the end.
async fn drop_stream(peer: Peer, addr: &str, name: &str) {
    match peer {
        Peer::Redis => {
            if let Ok(mut conn) = load::redis_streams::connect(addr).await {
                let _ = redis::cmd("DEL")
                    .arg(name)
                    .query_async::<redis::Value>(&mut conn)
                    .await;
            }
        }
        Peer::Nats => {
            if let Ok(context) = load::jetstream::connect(addr).await {
                let _ = context.delete_stream(name).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row with fixed numbers, as `malachi_bench::report`'s own tests
    /// build them.
    fn row(system: &str, scenario: &str, durability: &str, fsync: &str, mb: f64) -> Row {
        Row {
            system: system.into(),
            scenario: scenario.into(),
            durability: durability.into(),
            fsync: fsync.into(),
            clients: 16,
            record_bytes: 1024,
            seconds: 5.0,
            records: (mb * 1e6 / 1024.0 * 5.0) as u64,
            mb_per_s: mb,
            records_per_s: mb * 1e6 / 1024.0,
            p50_us: Some(1_000),
            p99_us: Some(5_000),
            p999_us: Some(9_000),
            ratio_to_raw: None,
            malachi_over_this: None,
            ratio_to_peers: BTreeMap::new(),
            errors: 0,
            dropped: 0,
            version: "v".into(),
        }
    }

    fn args(extra: &[&str]) -> BenchCompareArgs {
        use clap::Parser;
        let mut argv = vec!["malachi", "bench", "compare"];
        argv.extend_from_slice(extra);
        match super::super::super::Cli::parse_from(argv).command {
            super::super::super::Command::Bench(super::super::super::BenchCommand::Compare(a)) => a,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn quick_runs_five_seconds_a_row_over_1_16_and_64_producers() {
        let plan = Plan::from_args(&args(&["--quick"])).unwrap();
        assert_eq!(plan.row, Duration::from_secs(5));
        assert_eq!(plan.producers, vec![1, 16, 64]);
        assert_eq!(plan.systems, vec!["malachi", "redis", "nats"]);
        assert_eq!(plan.consume_source(), 16);
        assert!(!plan.json);
    }

    #[test]
    fn only_restricts_the_systems_and_refuses_unknown_ones() {
        let plan = Plan::from_args(&args(&["--only", "malachi"])).unwrap();
        assert!(plan.wants("malachi") && !plan.wants("redis") && !plan.wants("nats"));
        let err = Plan::from_args(&args(&["--only", "kafka"])).unwrap_err();
        assert!(err.to_string().contains("kafka"), "{err}");
    }

    #[test]
    fn zero_producers_are_refused() {
        assert!(Plan::from_args(&args(&["--producers", "0,16"])).is_err());
    }

    #[test]
    fn no_install_skips_instead_of_installing() {
        let plan = Plan::from_args(&args(&["--no-install"])).unwrap();
        assert!(!plan.install.allowed);
        assert!(plan.install.why_not.unwrap().contains("--no-install"));
    }

    #[test]
    fn every_system_keeps_the_same_records_in_flight() {
        // Malachi's window is counted in requests of a batch each; the
        // peers' in records. The comparison is only fair if they agree.
        assert_eq!(
            WINDOW_RECORDS,
            MALACHI_BATCH_RECORDS as usize * MALACHI_WINDOW
        );
    }

    #[test]
    fn the_malachi_broker_flushes_without_waiting() {
        let config = malachi_config();
        assert!(
            config.contains("[store]\nflush_interval_ms = 0\n"),
            "{config}"
        );
    }

    #[test]
    fn rows_are_grouped_by_scenario_with_the_limit_first() {
        let mut rows = vec![
            row("nats", "produce-p16", "durable", "per write", 1.0),
            row(MALACHI, "consume", "durable", "per write", 1.0),
            row("redis", "produce-p16", "default", "every 1 s", 1.0),
            row("redis", "produce-p16", "durable", "per write", 1.0),
            row(MALACHI, "produce-p1", "durable", "per write", 1.0),
            row(RAW_DISK, "produce-p16", "durable", "per write", 1.0),
            row(MALACHI, "produce-p16", "durable", "per write", 1.0),
        ];
        sort_rows(&mut rows);
        let order: Vec<String> = rows
            .iter()
            .map(|r| format!("{} {} {}", r.scenario, r.system, r.durability))
            .collect();
        assert_eq!(
            order,
            [
                "produce-p1 malachi durable",
                "produce-p16 raw-disk durable",
                "produce-p16 malachi durable",
                "produce-p16 redis durable",
                "produce-p16 redis default",
                "produce-p16 nats durable",
                "consume malachi durable",
            ]
        );
    }

    #[tokio::test]
    async fn the_loopback_probe_moves_bytes() {
        let outcome = loopback_bandwidth(Duration::from_millis(100))
            .await
            .unwrap();
        assert!(outcome.records > 0);
        assert!(outcome.payload_bytes >= outcome.records);
    }
}
