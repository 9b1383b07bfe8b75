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
//!    executable, `malachi broker`, `flush_interval_ms = 0`), then three such
//!    brokers in one cluster with a topic at RF=3 (`malachi-rf3`), then each
//!    peer twice, durable per write and in its default mode, the last of them
//!    a three-node NATS cluster with streams at R3 (`nats-r3`). A peer that
//!    is missing and cannot be installed is skipped with one line saying why.
//! 3. **Load.** For each producer count, N producers with 1 KiB records keep
//!    [`WINDOW_RECORDS`] records each unacknowledged for the row's duration.
//!    Malachi sends them as produce requests of [`MALACHI_BATCH_RECORDS`]
//!    records (its produce path in `bench.rs`); Redis as pipelined `XADD`s;
//!    NATS as JetStream publishes with their acks awaited ([`load`]).
//!    Then one consumer reads back what the 16-producer row wrote. The RF=3
//!    Malachi row runs in [`RF3_ROUNDS`] slices, each followed by a slice of
//!    the raw disk at the same parallelism and batch size: a third of that
//!    raw bandwidth is what three copies on the one disk leave for payload,
//!    and `ratio_to_raw_third` divides by it.
//! 4. **Report.** Ratios to the raw disk and between Malachi and each peer of
//!    its replication factor, a table (or JSON lines, also written to
//!    `bench/results/<date>.json` with a chart in `<date>.svg`), and the
//!    issues' targets.

mod tls;

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
use malachi_bench::peers::{
    self, InstallPolicy, Mode, NATS_CLUSTER_NODES, NatsNode, Peer, PeerBinary, ServerGuard,
};
use malachi_bench::report::{
    self, LOOPBACK, MALACHI, MALACHI_RF3, MALACHI_TLS, RAW_DISK, RF3_COPIES, Row,
};
use malachi_wire::messages::BrokerState;

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
pub const SYSTEMS: [&str; 6] = [
    MALACHI,
    MALACHI_RF3,
    MALACHI_TLS,
    "redis",
    "nats",
    "nats-r3",
];
/// Brokers of the RF=3 rows: one cluster, every topic on all of them.
const RF3_BROKERS: u64 = 3;
/// Slices an RF=3 row is cut into, each followed by a raw disk slice of the
/// same length (the interleaved baseline of `ratio_to_raw_third`).
pub const RF3_ROUNDS: u32 = 4;
/// How long three fresh brokers may take to see each other and elect their
/// vnode leaders, and a fresh NATS cluster its JetStream meta leader.
const CLUSTER_READY_MAX: Duration = Duration::from_secs(60);
/// Pause between two readiness probes of a fresh cluster.
const CLUSTER_READY_POLL: Duration = Duration::from_millis(250);
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
    if plan.wants(MALACHI_RF3) {
        rows.extend(run_malachi_rf3(&plan, &notes).await?);
    }
    if plan.wants(MALACHI_TLS) {
        rows.extend(tls::run(&plan, &notes).await?);
    }
    for peer in [Peer::Redis, Peer::Nats, Peer::NatsR3] {
        if !plan.wants(peer.name()) {
            continue;
        }
        let install = plan.install.clone();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let located = tokio::task::spawn_blocking(move || match peer {
            Peer::Redis => peers::locate_redis(&path, &install),
            Peer::Nats | Peer::NatsR3 => peers::locate_nats(&path, &install),
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
            "consume: each single-server peer is read back in its durable mode only (reading does not depend on when the writer fsyncs); the RF=3 systems are not read back",
        );
    }

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

/// Order: by scenario as the plan runs them, then by replication factor
/// (the single servers first), then the limit, Malachi, the peers durable
/// before default.
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
        MALACHI | MALACHI_RF3 => 1,
        MALACHI_TLS => 2,
        "redis" => 3,
        "nats" | "nats-r3" => 4,
        _ => 5,
    };
    let durability_rank = |d: &str| match d {
        "durable" => 0,
        "default" => 1,
        _ => 2,
    };
    rows.sort_by_key(|r| {
        (
            scenario_rank(&r.scenario),
            r.replication_factor,
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
        replication_factor: 1,
        record_bytes: RECORD_BYTES,
        seconds: outcome.seconds,
        records: outcome.records,
        mb_per_s: outcome.mb_per_s(),
        records_per_s: outcome.records_per_s(),
        p50_us: quantile(outcome, 0.50),
        p99_us: quantile(outcome, 0.99),
        p999_us: quantile(outcome, 0.999),
        ratio_to_raw: None,
        raw_third_mb_per_s: None,
        ratio_to_raw_third: None,
        plaintext_mb_per_s: None,
        ratio_to_plaintext: None,
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
            replication_factor: 1,
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
            raw_third_mb_per_s: None,
            ratio_to_raw_third: None,
            plaintext_mb_per_s: None,
            ratio_to_plaintext: None,
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
        replication_factor: 1,
        record_bytes: FSYNC_PROBE_BYTES,
        seconds: fsync.seconds,
        records: fsync.records,
        mb_per_s: fsync.mb_per_s,
        records_per_s: fsync.records_per_s,
        p50_us: Some(fsync.p50_us),
        p99_us: Some(fsync.p99_us),
        p999_us: Some(fsync.p999_us),
        ratio_to_raw: None,
        raw_third_mb_per_s: None,
        ratio_to_raw_third: None,
        plaintext_mb_per_s: None,
        ratio_to_plaintext: None,
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
        replication_factor: 1,
        record_bytes: LOOPBACK_WRITE_BYTES,
        seconds: tcp.seconds,
        records: tcp.records,
        mb_per_s: tcp.mb_per_s(),
        records_per_s: tcp.records_per_s(),
        p50_us: quantile(&tcp, 0.50),
        p99_us: quantile(&tcp, 0.99),
        p999_us: quantile(&tcp, 0.999),
        ratio_to_raw: None,
        raw_third_mb_per_s: None,
        ratio_to_raw_third: None,
        plaintext_mb_per_s: None,
        ratio_to_plaintext: None,
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
    raw_disk_for(plan, files, write_bytes, plan.raw).await
}

async fn raw_disk_for(
    plan: &Plan,
    files: usize,
    write_bytes: usize,
    duration: Duration,
) -> Result<super::BenchResult, CliError> {
    let dir = plan.dir.clone();
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
    start_server_within(name, bin, args, dir, addr, ready, peers::START_TIMEOUT).await
}

async fn start_server_within(
    name: String,
    bin: PathBuf,
    args: Vec<OsString>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    ready: &'static str,
    timeout: std::time::Duration,
) -> Result<ServerGuard, CliError> {
    tokio::task::spawn_blocking(move || {
        ServerGuard::start_within(name, &bin, &args, dir, addr, Some(ready), timeout)
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
        credentials: super::super::CredentialArgs::default(),
        client_config: super::super::ClientConfigArgs::internal(),
        broker: vec![guard.addr.to_string()],
        json: true,
        timeout_ms: MALACHI_TIMEOUT_MS,
        tls: Default::default(),
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

/// Three Malachi brokers on this machine (this executable as `malachi
/// broker`, each its own process, port and data directory on the one disk),
/// one metadata cluster, a topic at RF=3. A fresh cluster for each producer
/// count: the store keeps every byte written (there is no retention to free
/// it), and three copies of a row fill a disk three times as fast. Each row
/// runs in [`RF3_ROUNDS`] slices, each followed by a raw disk slice of the
/// same length at the same parallelism and batch size: the row's baseline.
async fn run_malachi_rf3(plan: &Plan, notes: &Notes) -> Result<Vec<Row>, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let version = concat!("malachi ", env!("CARGO_PKG_VERSION"));
    let write_bytes = MALACHI_BATCH_RECORDS as usize * RECORD_BYTES;
    let slice = plan.row / RF3_ROUNDS;
    let mut rows = Vec::new();
    for &n in &plan.producers {
        let guards = start_rf3_cluster(plan, notes, &exe).await?;
        let logs = || {
            guards
                .iter()
                .map(|g| format!("{}: {}", g.name, g.log_tail()))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let output = OutputArgs {
            credentials: super::super::CredentialArgs::default(),
            client_config: super::super::ClientConfigArgs::internal(),
            broker: vec![
                guards
                    .first()
                    .map(|g| g.addr.to_string())
                    .unwrap_or_default(),
            ],
            json: true,
            timeout_ms: MALACHI_TIMEOUT_MS,
            tls: Default::default(),
        };
        notes.progress("malachi rf=3: waiting for the three brokers to see each other");
        wait_for_brokers(&output, RF3_BROKERS)
            .await
            .map_err(|e| CliError::Bench(format!("malachi rf=3: {e} ({})", logs())))?;
        let topic = format!("bench-rf3-p{n}");
        create_replicated_topic(&output, &topic, None)
            .await
            .map_err(|e| CliError::Bench(format!("malachi rf=3: {e} ({})", logs())))?;
        let mut total = LoadOutcome {
            records: 0,
            payload_bytes: 0,
            seconds: 0.0,
            hist: histogram()?,
            errors: 0,
            dropped: 0,
        };
        let mut raw = RawTotal::default();
        for round in 1..=RF3_ROUNDS {
            notes.progress(&format!(
                "malachi rf=3 produce, {n} producers, slice {round} of {RF3_ROUNDS}, then the raw disk"
            ));
            let load = ProduceLoad {
                topic: topic.clone(),
                producers: n,
                record_size: RECORD_BYTES,
                batch_records: MALACHI_BATCH_RECORDS,
                window: MALACHI_WINDOW,
                duration: slice,
            };
            let (outcome, _) = produce_load(&output, &load, true)
                .await
                .map_err(|e| CliError::Bench(format!("malachi rf=3 produce ({}): {e}", logs())))?;
            absorb(&mut total, outcome);
            let baseline = raw_disk_for(plan, n, write_bytes, slice).await?;
            raw.add(baseline.mb_per_s, baseline.seconds);
        }
        let mut rf3 = row(
            MALACHI_RF3,
            scenario(n),
            Mode::Durable,
            "per write",
            n,
            &total,
            version,
        );
        rf3.replication_factor = RF3_COPIES;
        rf3.raw_third_mb_per_s = Some(report::raw_third(rf3.mb_per_s, raw.mb_per_s()).0);
        rf3.version = format!(
            "{version}, {RF3_BROKERS} brokers; baseline pwrite+fdatasync, {n} files x {write_bytes} B, {RF3_ROUNDS} slices interleaved"
        );
        rows.push(rf3);
        drop(guards);
    }
    Ok(rows)
}

/// Starts the [`RF3_BROKERS`] brokers of one cluster, each with a fresh
/// directory, and returns once each serves clients.
async fn start_rf3_cluster(
    plan: &Plan,
    notes: &Notes,
    exe: &std::path::Path,
) -> Result<Vec<ServerGuard>, CliError> {
    start_cluster(
        exe,
        RF3_BROKERS,
        &malachi_cluster_config(RF3_BROKERS),
        |id| {
            notes.progress(&format!(
                "malachi rf=3: starting broker {id} of {RF3_BROKERS}"
            ));
            fresh_dir(plan, &format!("malachi-rf3-{id}-"))
        },
    )
    .await
}

/// Starts `brokers` brokers of one cluster (node ids 1..=N, each the
/// others' seed, on free loopback ports), each with `config` and the
/// directory `dir(id)` gives, and returns once each serves clients.
pub(super) async fn start_cluster(
    exe: &std::path::Path,
    brokers: u64,
    config: &str,
    dir: impl FnMut(u64) -> Result<tempfile::TempDir, CliError>,
) -> Result<Vec<ServerGuard>, CliError> {
    start_cluster_within(exe, brokers, config, dir, peers::START_TIMEOUT).await
}

/// [`start_cluster`], waiting at most `timeout` for each broker to serve.
pub(super) async fn start_cluster_within(
    exe: &std::path::Path,
    brokers: u64,
    config: &str,
    mut dir: impl FnMut(u64) -> Result<tempfile::TempDir, CliError>,
    timeout: std::time::Duration,
) -> Result<Vec<ServerGuard>, CliError> {
    let mut nodes = Vec::new();
    for id in 1..=brokers {
        nodes.push((id, peers::free_port()?, peers::free_port()?));
    }
    let mut guards: Vec<ServerGuard> = Vec::new();
    for &(id, port, admin) in &nodes {
        let dir = dir(id)?;
        let config_path = dir.path().join("broker.toml");
        std::fs::write(&config_path, config)
            .map_err(|e| CliError::Bench(format!("cannot write a broker config: {e}")))?;
        let mut args: Vec<OsString> = vec![
            "broker".into(),
            "--config".into(),
            config_path.into_os_string(),
            "--node-id".into(),
            id.to_string().into(),
            "--listen".into(),
            loopback(port).to_string().into(),
            "--admin-listen".into(),
            loopback(admin).to_string().into(),
            "--data-dir".into(),
            dir.path().join("data").into_os_string(),
        ];
        for &(other, other_port, _) in &nodes {
            if other != id {
                args.push("--seed".into());
                args.push(loopback(other_port).to_string().into());
            }
        }
        guards.push(
            start_server_within(
                format!("malachi broker {id} of {brokers}"),
                exe.to_owned(),
                args,
                dir,
                loopback(port),
                "serving clients on",
                timeout,
            )
            .await?,
        );
    }
    Ok(guards)
}

/// The raw disk slices of one RF=3 row, added up.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct RawTotal {
    /// Megabytes (10^6 bytes) written.
    mb: f64,
    seconds: f64,
}

impl RawTotal {
    fn add(&mut self, mb_per_s: f64, seconds: f64) {
        self.mb += mb_per_s * seconds;
        self.seconds += seconds;
    }

    /// The slices' bandwidth together: their bytes over their time.
    fn mb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.mb / self.seconds
        } else {
            0.0
        }
    }
}

/// Add one slice's outcome to a row's.
fn absorb(total: &mut LoadOutcome, slice: LoadOutcome) {
    total.records += slice.records;
    total.payload_bytes += slice.payload_bytes;
    total.seconds += slice.seconds;
    // Both histograms have the same bounds; a value beyond them was already
    // saturated when it was recorded.
    let _ = total.hist.add(&slice.hist);
    total.errors += slice.errors;
    total.dropped += slice.dropped;
}

/// Waits until the broker behind `output` sees `brokers` brokers alive.
pub(super) async fn wait_for_brokers(output: &OutputArgs, brokers: u64) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let last = match super::bench_client(output).await {
            Ok(client) => match client.cluster_status().await {
                Ok(status) => {
                    let alive = status
                        .brokers
                        .iter()
                        .filter(|b| b.state == BrokerState::Alive)
                        .count() as u64;
                    if alive >= brokers {
                        return Ok(());
                    }
                    format!("{alive} of {brokers} brokers alive")
                }
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if started.elapsed() > CLUSTER_READY_MAX {
            return Err(format!(
                "the brokers did not form a cluster within {}: {last}",
                human_duration(CLUSTER_READY_MAX)
            ));
        }
        tokio::time::sleep(CLUSTER_READY_POLL).await;
    }
}

/// Creates `topic` with [`RF3_COPIES`] copies (under storage policy
/// `policy`, if any) and waits until its active segment has them all,
/// retrying while the fresh cluster elects its vnode leaders.
pub(super) async fn create_replicated_topic(
    output: &OutputArgs,
    topic: &str,
    policy: Option<&str>,
) -> Result<(), String> {
    let started = Instant::now();
    let copies = RF3_COPIES as usize;
    loop {
        let attempt = async {
            let client = super::bench_client(output)
                .await
                .map_err(|e| e.to_string())?;
            match client
                .create_topic(topic, Some(RF3_COPIES as u8), policy.map(str::to_owned))
                .await
            {
                Ok(_) => {}
                Err(e) if e.code() == Some(malachi_wire::ErrorCode::TopicExists) => {}
                Err(e) => return Err(format!("create {topic}: {e}")),
            }
            let described = client
                .describe_topic(topic)
                .await
                .map_err(|e| format!("describe {topic}: {e}"))?;
            let fewest = described
                .ranges
                .iter()
                .flat_map(|r| &r.segments)
                .filter(|s| s.state == "active")
                .map(|s| s.replicas.len())
                .min();
            match fewest {
                Some(n) if n >= copies => Ok(()),
                other => Err(format!(
                    "{topic}'s active segments have {} copies, not {copies}",
                    other.map_or_else(|| "no".to_owned(), |n| n.to_string())
                )),
            }
        };
        let last = match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if started.elapsed() > CLUSTER_READY_MAX {
            return Err(format!(
                "no topic at RF={copies} within {}: {last}",
                human_duration(CLUSTER_READY_MAX)
            ));
        }
        tokio::time::sleep(CLUSTER_READY_POLL).await;
    }
}

/// The config of each broker of the RF=3 rows: [`malachi_config`]'s store
/// settings, and a `[cluster]` table naming every broker, so that they share
/// one metadata cluster (as `malachi dev` and the process tests run them).
pub fn malachi_cluster_config(brokers: u64) -> String {
    let nodes: Vec<String> = (1..=brokers).map(|n| n.to_string()).collect();
    format!(
        "{}\n[membership]\ncluster_cookie = \"malachi-bench\"\n\n[cluster]\nnodes = [{}]\n",
        malachi_config(),
        nodes.join(", ")
    )
}

/// The broker config of the comparison: flush as soon as the previous sync
/// ends (ADR 0011), 16 sync threads, as docs/benchmarks.md runs it.
pub fn malachi_config() -> &'static str {
    "# written by malachi bench compare\n[store]\nflush_interval_ms = 0\nsync_threads = 16\n"
}

/// One peer in one mode: fresh servers (one, or the NATS cluster's three),
/// the produce scenarios, and in durable mode for a single server the
/// consume scenario.
async fn run_peer(
    peer: Peer,
    bin: &PeerBinary,
    mode: Mode,
    plan: &Plan,
    notes: &Notes,
) -> Result<Vec<Row>, CliError> {
    let guards = start_peer(peer, bin, mode, plan).await?;
    let addrs: Vec<String> = guards.iter().map(|g| g.addr.to_string()).collect();
    let logs = || {
        guards
            .iter()
            .map(ServerGuard::log_tail)
            .collect::<Vec<_>>()
            .join("; ")
    };
    let addr = addrs.first().cloned().unwrap_or_default();
    let fsync = mode.fsync(peer);
    let source = plan.consume_source();
    let consumes = mode == Mode::Durable && peer.replication_factor() == 1;
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
            Peer::Nats | Peer::NatsR3 => {
                produce_nats(&addrs, &name, peer.replication_factor(), n, plan.row).await
            }
        }
        .map_err(|e| CliError::Bench(format!("{e} (server says: {})", logs())))?;
        let mut peer_row = row(
            peer.name(),
            scenario(n),
            mode,
            fsync,
            n,
            &outcome,
            &bin.version,
        );
        peer_row.replication_factor = peer.replication_factor() as u32;
        rows.push(peer_row);
        // Writes dropped uncounted at the end of the drain may still be
        // queued in the server: let it finish them before the next row, so
        // that row measures its own load.
        notes.progress(&format!("{} {} settling", peer.name(), mode.name()));
        settle(peer, &addr, &name).await;
        if n != source || !consumes {
            // Free the memory (Redis) and disk a later row would otherwise
            // share with this one's data.
            drop_stream(peer, &addr, &name).await;
        }
    }
    if consumes {
        notes.progress(&format!("{} consume", peer.name()));
        let name = format!("bench-p{source}");
        let outcome = match peer {
            Peer::Redis => consume_redis(&addr, &name, plan.row).await,
            Peer::Nats | Peer::NatsR3 => consume_nats(&addr, &name, plan.row).await,
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
    drop(guards);
    Ok(rows)
}

/// Starts the peer's servers in `mode`, each with a fresh directory and
/// config file: one server, or for [`Peer::NatsR3`] the
/// [`NATS_CLUSTER_NODES`] nodes of one cluster, routed to each other.
async fn start_peer(
    peer: Peer,
    bin: &PeerBinary,
    mode: Mode,
    plan: &Plan,
) -> Result<Vec<ServerGuard>, CliError> {
    let ready = match peer {
        Peer::Redis => "Ready to accept connections",
        Peer::Nats | Peer::NatsR3 => "Server is ready",
    };
    let nodes: Vec<NatsNode> = match peer {
        Peer::NatsR3 => (0..NATS_CLUSTER_NODES)
            .map(|_| {
                Ok(NatsNode {
                    client_port: peers::free_port()?,
                    route_port: peers::free_port()?,
                })
            })
            .collect::<Result<_, CliError>>()?,
        Peer::Redis | Peer::Nats => vec![NatsNode {
            client_port: peers::free_port()?,
            route_port: 0,
        }],
    };
    let mut guards = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let dir = fresh_dir(plan, &format!("{}-compare-", peer.name()))?;
        let port = node.client_port;
        let config_path = dir.path().join(format!("{}.conf", peer.name()));
        let (config, args): (String, Vec<OsString>) = match peer {
            Peer::Redis => (
                peers::redis_config(port, dir.path(), mode),
                vec![config_path.clone().into_os_string()],
            ),
            Peer::Nats => (
                peers::nats_config(port, dir.path(), mode),
                vec!["-c".into(), config_path.clone().into_os_string()],
            ),
            Peer::NatsR3 => (
                peers::nats_cluster_config(&nodes, i, dir.path(), mode),
                vec!["-c".into(), config_path.clone().into_os_string()],
            ),
        };
        std::fs::write(&config_path, config)
            .map_err(|e| CliError::Bench(format!("cannot write {}: {e}", config_path.display())))?;
        let name = if nodes.len() > 1 {
            format!(
                "{} ({}, node {} of {})",
                peer.name(),
                mode.name(),
                i + 1,
                nodes.len()
            )
        } else {
            format!("{} ({})", peer.name(), mode.name())
        };
        guards.push(start_server(name, bin.path.clone(), args, dir, loopback(port), ready).await?);
    }
    Ok(guards)
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

/// JetStream publishes to a stream of `replicas` copies, the producers
/// spread round robin over `addrs` (the servers of one cluster). The stream
/// is created as soon as the cluster accepts it: a fresh cluster elects its
/// JetStream meta leader first.
async fn produce_nats(
    addrs: &[String],
    stream: &str,
    replicas: usize,
    producers: usize,
    duration: Duration,
) -> Result<LoadOutcome, CliError> {
    let fail = |e: String| CliError::Bench(format!("nats: {e}"));
    let first = addrs
        .first()
        .ok_or_else(|| fail("no server to connect to".into()))?;
    let setup = load::jetstream::connect(first).await.map_err(fail)?;
    let started = Instant::now();
    loop {
        match load::jetstream::create_stream(&setup, stream, replicas).await {
            Ok(()) => break,
            Err(e) if started.elapsed() > CLUSTER_READY_MAX => {
                return Err(fail(format!(
                    "no stream of {replicas} replicas within {}: {e}",
                    human_duration(CLUSTER_READY_MAX)
                )));
            }
            Err(_) => tokio::time::sleep(CLUSTER_READY_POLL).await,
        }
    }
    let mut all: Vec<Producer> = Vec::with_capacity(producers);
    for (_, addr) in (0..producers).zip(addrs.iter().cycle()) {
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
        Peer::Nats | Peer::NatsR3 => {
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
        Peer::Nats | Peer::NatsR3 => {
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
            replication_factor: if system == MALACHI_RF3 || system == "nats-r3" {
                RF3_COPIES
            } else {
                1
            },
            record_bytes: 1024,
            seconds: 5.0,
            records: (mb * 1e6 / 1024.0 * 5.0) as u64,
            mb_per_s: mb,
            records_per_s: mb * 1e6 / 1024.0,
            p50_us: Some(1_000),
            p99_us: Some(5_000),
            p999_us: Some(9_000),
            ratio_to_raw: None,
            raw_third_mb_per_s: None,
            ratio_to_raw_third: None,
            plaintext_mb_per_s: None,
            ratio_to_plaintext: None,
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
        assert_eq!(
            plan.systems,
            vec![
                "malachi",
                "malachi-rf3",
                "malachi-tls",
                "redis",
                "nats",
                "nats-r3"
            ]
        );
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
    fn the_rf3_systems_can_be_run_alone() {
        let plan = Plan::from_args(&args(&["--only", "malachi-rf3,nats-r3"])).unwrap();
        assert!(plan.wants(MALACHI_RF3) && plan.wants("nats-r3"));
        assert!(!plan.wants(MALACHI) && !plan.wants("nats"));
    }

    #[test]
    fn the_rf3_brokers_share_one_cluster_and_the_comparisons_store_settings() {
        let config = malachi_cluster_config(3);
        assert!(config.starts_with(malachi_config()), "{config}");
        assert!(
            config.contains("\n[cluster]\nnodes = [1, 2, 3]\n"),
            "{config}"
        );
        // Every broker must accept it: it parses as a broker config.
        let parsed: malachi_actors::BrokerConfig = toml::from_str(&config).unwrap();
        assert_eq!(parsed.cluster.nodes, vec![1, 2, 3]);
        assert_eq!(parsed.store.flush_interval_ms, 0);
    }

    #[test]
    fn the_raw_slices_of_an_rf3_row_add_up_to_bytes_over_time() {
        let mut raw = RawTotal::default();
        assert_eq!(raw.mb_per_s(), 0.0);
        raw.add(600.0, 1.0);
        raw.add(300.0, 2.0);
        // 1,200 MB in 3 s, not the mean of 600 and 300.
        assert_eq!(raw.mb_per_s(), 400.0);
        let (third, ratio) = report::raw_third(80.0, raw.mb_per_s());
        assert!((third - 133.333).abs() < 0.001, "{third}");
        assert_eq!(ratio, Some(0.6));
    }

    #[test]
    fn slices_add_up_to_one_outcome() {
        let slice = |records: u64, latency: u64| {
            let mut hist = histogram().unwrap();
            hist.record(latency).unwrap();
            LoadOutcome {
                records,
                payload_bytes: records * 1024,
                seconds: 1.0,
                hist,
                errors: 1,
                dropped: 0,
            }
        };
        let mut total = slice(0, 1);
        total.hist.reset();
        total.errors = 0;
        total.seconds = 0.0;
        absorb(&mut total, slice(100, 1_000));
        absorb(&mut total, slice(300, 3_000));
        assert_eq!(total.records, 400);
        assert_eq!(total.seconds, 2.0);
        assert_eq!(total.errors, 2);
        assert_eq!(total.hist.len(), 2);
        assert_eq!(total.mb_per_s(), 400.0 * 1024.0 / 2.0 / 1e6);
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
            row("nats-r3", "produce-p16", "durable", "per write", 1.0),
            row(MALACHI_RF3, "produce-p16", "durable", "per write", 1.0),
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
                "produce-p16 malachi-rf3 durable",
                "produce-p16 nats-r3 durable",
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
