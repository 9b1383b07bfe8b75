//! The `malachi` command line. For now it carries only the storage benchmark;
//! the broker, admin and client commands join it as their crates land.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use malachi_storage::bench::{self, BenchOptions, ScenarioResult};

#[derive(Debug, Parser)]
#[command(
    name = "malachi",
    version,
    about = "A CP, horizontally scalable log broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load generators and side-by-side comparisons.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The segment store against the disk's own durable write bandwidth.
    Storage(StorageArgs),
}

#[derive(Debug, Args)]
struct StorageArgs {
    /// Short scenarios: about a minute in total.
    #[arg(long)]
    quick: bool,
    /// One JSON object per scenario and line.
    #[arg(long)]
    json: bool,
    /// Directory for the benchmark files (default: a new directory under the
    /// current one, removed at the end). Put it on the disk you want measured.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The store's flush_interval_ms (0 flushes as soon as the previous sync ends).
    #[arg(long, default_value_t = 0)]
    flush_interval_ms: u64,
    /// Sync threads of the store.
    #[arg(long, default_value_t = 16)]
    sync_threads: usize,
    /// Run only the scenarios whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(Bench::Storage(args)) => bench_storage(args),
    }
}

fn bench_storage(args: StorageArgs) -> ExitCode {
    let (dir, remove) = match args.dir {
        Some(dir) => (dir, false),
        None => (
            PathBuf::from(format!("malachi-bench-{}", std::process::id())),
            true,
        ),
    };
    let opts = BenchOptions {
        dir: dir.clone(),
        quick: args.quick,
        flush_interval_ms: args.flush_interval_ms,
        sync_threads: args.sync_threads,
        filter: args.filter,
    };
    if !args.json {
        println!(
            "storage benchmark in {} (record frame {} bytes, flush_interval_ms {}, sync_threads {}{})",
            dir.display(),
            bench::frame_bytes(),
            args.flush_interval_ms,
            args.sync_threads,
            if args.quick { ", quick" } else { "" }
        );
        println!(
            "{:<58} {:>9} {:>11} {:>8} {:>8} {:>8} {:>10} {:>8} {:>6} {:>7}",
            "scenario",
            "MB/s",
            "records/s",
            "p50 us",
            "p99 us",
            "p999 us",
            "bytes/sync",
            "raw MB/s",
            "ratio",
            "r_batch"
        );
    }
    let json = args.json;
    let outcome = bench::run(&opts, |r| print_result(r, json));
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("malachi: bench storage failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_result(r: &ScenarioResult, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("malachi: cannot encode a result: {e}"),
        }
        return;
    }
    let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    let mut line = format!(
        "{:<58} {:>9.1} {:>11.0} {:>8} {:>8} {:>8} {:>10.0} {:>8} {:>6} {:>7}",
        r.scenario,
        r.mb_per_s,
        r.records_per_s,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.write_bytes_mean,
        r.raw_mb_per_s
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
        ratio(r.ratio_to_raw),
        ratio(r.ratio_to_raw_batch)
    );
    if let Some(target) = r.p99_target_us {
        let verdict = if r.p99_us <= target { "met" } else { "missed" };
        line.push_str(&format!("  p99 target {target} us: {verdict}"));
    }
    if let (Some(offered), Some(lag)) = (r.offered_records_per_s, r.send_lag_p99_us) {
        line.push_str(&format!(
            "  offered {offered:.0} records/s, send lag p99 {lag} us"
        ));
    }
    if r.busy_retries > 0 {
        line.push_str(&format!("  busy retries {}", r.busy_retries));
    }
    println!("{line}");
}
